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
import sysconfig

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


def pinpool_env(**extra):
    """os.environ for a child interpreter that imports this pinpool from
    any working directory; extra: variables to set (None: unset)."""
    import pinpool as _pp
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(_pp.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [here] + [os.path.abspath(p) for p in
                  env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_in_new_pid_namespace(code, env=None, timeout=60):
    """Run `code` in a child interpreter that is pid 1 of a new pid
    namespace with its own /proc (unshare -pf --mount-proc; root): the
    CompletedProcess (text). Skips where unshare(1) or pid namespaces are
    not to be had."""
    import subprocess
    import sys
    try:
        r = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable,
                            "-c", code], env=env or pinpool_env(),
                           capture_output=True, text=True, timeout=timeout,
                           cwd="/")
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if r.returncode != 0 and "unshare:" in r.stderr:
        pytest.skip("PID namespaces unavailable: " + r.stderr.strip()[:200])
    return r


def run_in_fork(fn):
    """fn() in a child of os.fork(), its result pickled back over a pipe:
    (the child's exit code, the result; None if fn raised, exit code 1).
    The child never returns into the test (os._exit)."""
    import pickle
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        code = 0
        try:
            os.close(r)
            data = pickle.dumps(fn())
            while data:
                data = data[os.write(w, data):]
        except BaseException:  # noqa: BLE001 the code says it
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while True:
        piece = os.read(r, 1 << 16)
        if not piece:
            break
        data += piece
    os.close(r)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return code, (pickle.loads(data) if code == 0 and data else None)


# -- the hostile-worker suites (test_share_hostile.py, test_loader_hostile.py)

# Their workers are forked: fork under clang 14's ThreadSanitizer breaks its
# runtime (see test_share.py); tests/test_share_hostile.c covers it.
skip_fork_under_tsan = pytest.mark.skipif(
    "--with-thread-sanitizer" in (sysconfig.get_config_var("CONFIG_ARGS") or ""),
    reason="fork under clang 14's ThreadSanitizer breaks its runtime "
    "(see test_share.py); tests/test_share_hostile.c covers it")


@pytest.fixture
def hostile_spool():
    """A shared pool that must have no lend and no block left after the
    test; the loader's fault injection is reset."""
    from pinpool import _loader

    p = pinpool.Pool("shared=1")
    yield p
    _loader._fault = None
    gc.collect()
    assert p.stats()["lent_blocks"] == 0, "lends left after the test"
    assert p.stats()["blocks"]["current"] == 0, "blocks left after the test"
