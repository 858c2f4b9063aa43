"""Fixtures for the pinpool module's tests (docs/python.md).

Run with Debian's interpreter and the build's module on the path:

    PYTHONPATH=build/release/python /usr/bin/python3 -m pytest tests/python

ctest (label "python") does exactly that, with PINPOOL_LIBCUDA pointing at
the fake CUDA driver of tests/fake_cuda for the CUDA-pinned cases.

NumPy and torch are optional: tests/freethreaded runs these tests on a
free-threaded CPython 3.13 that has neither, and there only the tests that
need them are skipped (needs_numpy, needs_torch), not whole files.
"""

import gc
import importlib
import os

import pytest

import pinpool


def optional_import(name):
    """The module, or None where it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


np = optional_import("numpy")
torch = optional_import("torch")
needs_numpy = pytest.mark.skipif(np is None, reason="needs NumPy")
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


@pytest.fixture
def pool():
    # backend=host, named: the tests run with the fake CUDA driver on
    # PINPOOL_LIBCUDA, and backend=auto (the default) would take it for a
    # GPU and make cuda-register pools (kDLCUDAHost). test_autopin.py
    # tests the default itself.
    p = pinpool.Pool("backend=host")
    yield p
    gc.collect()
    blocks = p.stats()["blocks"]["current"]
    assert blocks == 0, f"{blocks} blocks still allocated after the test"


@pytest.fixture
def cuda_pool():
    """A backend=cuda pool on the fake driver (kDLCUDAHost memory)."""
    if not os.environ.get("PINPOOL_LIBCUDA"):
        pytest.skip("PINPOOL_LIBCUDA not set (no fake CUDA driver)")
    try:
        return pinpool.Pool("backend=cuda,device=0")
    except RuntimeError as e:
        pytest.skip(f"no CUDA pool: {e}")


def live_blocks(pool):
    return pool.stats()["blocks"]["current"]
