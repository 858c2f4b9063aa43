"""CUDA graph capture through the Python module, on the fake driver
(docs/cuda.md, "Graph capture"): a buffer recorded on a capturing stream
and closed is not reused until Pool.graph_release, and the bad-input
errors. The driver's capture calls are made with ctypes on the library
PINPOOL_LIBCUDA names (the same one pinpool loads)."""
import ctypes
import gc
import os

import pytest

import pinpool

GLOBAL = 0


@pytest.fixture
def cu():
    path = os.environ.get("PINPOOL_LIBCUDA")
    if not path:
        pytest.skip("PINPOOL_LIBCUDA not set (no fake CUDA driver)")
    lib = ctypes.CDLL(path)
    if not hasattr(lib, "fake_cuda_get"):
        pytest.skip("not the fake driver")
    assert lib.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert lib.cuCtxPushCurrent_v2(ctx) == 0
    yield lib
    popped = ctypes.c_void_p()
    assert lib.cuCtxPopCurrent_v2(ctypes.byref(popped)) == 0
    assert lib.cuDevicePrimaryCtxRelease_v2(0) == 0


def new_stream(lib):
    s = ctypes.c_void_p()
    assert lib.cuStreamCreate(ctypes.byref(s), 1) == 0
    return s


def test_held_until_release(cu):
    try:
        pool = pinpool.Pool("events=cuda,device=0")
    except (RuntimeError, ValueError) as e:
        pytest.skip(f"no events=cuda pool: {e}")
    cu.fake_cuda_get.restype = ctypes.c_longlong
    s = new_stream(cu)
    assert pool.stream_capture(s.value) is None
    assert cu.cuStreamBeginCapture_v2(s, GLOBAL) == 0
    cid = pool.stream_capture(s.value)
    assert isinstance(cid, int) and cid > 0
    buf = pool.alloc(1 << 20)
    ptr = buf.ptr
    buf.record_stream(s.value)
    buf.close()
    del buf
    gc.collect()
    graph = ctypes.c_void_p()
    assert cu.cuStreamEndCapture(s, ctypes.byref(graph)) == 0
    assert cu.cuGraphDestroy(graph) == 0
    pool.synchronize()  # does not wait for the graph
    st = pool.stats()
    assert st["graph_held_blocks"] == 1
    assert st["graph_held_bytes"] == st["pending_bytes"]
    held = [pool.alloc(1 << 20) for _ in range(16)]
    assert all(b.ptr != ptr for b in held)
    for b in held:
        b.close()
    pool.graph_release(cid)
    pool.synchronize()
    assert pool.stats()["graph_held_blocks"] == 0
    with pytest.raises(ValueError, match="unknown"):
        pool.graph_release(cid)
    assert cu.fake_cuda_get(b"captured_records") == 0
    assert cu.cuStreamDestroy_v2(s) == 0


def test_bad_input(cu):
    try:
        pool = pinpool.Pool("events=cuda,device=0")
    except (RuntimeError, ValueError) as e:
        pytest.skip(f"no events=cuda pool: {e}")
    with pytest.raises(ValueError):
        pool.graph_release(12345)
    with pytest.raises(ValueError):
        pool.stream_graphs_release(99)
    with pytest.raises(TypeError):
        pool.graph_release("1")
    with pytest.raises(ValueError):
        pool.graph_release(-1)
    with pytest.raises(TypeError):
        pool.stream_capture(object())
    with pytest.raises(RuntimeError):
        pinpool.Pool("events=simulated").stream_capture(1)
