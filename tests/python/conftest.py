"""Fixtures for the pinpool module's tests (docs/python.md).

Run with Debian's interpreter and the build's module on the path:

    PYTHONPATH=build/release/python /usr/bin/python3 -m pytest tests/python

ctest (label "python") does exactly that, with PINPOOL_LIBCUDA pointing at
the fake CUDA driver of tests/fake_cuda for the CUDA-pinned cases.
"""

import gc
import os

import pytest

import pinpool


@pytest.fixture
def pool():
    p = pinpool.Pool("")
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
