"""pinpool.Buffer with real consumers: memoryview, numpy.frombuffer,
numpy.from_dlpack, torch.from_dlpack; DLPack arguments; close(); consumers
outliving close() and the Buffer; attributes; bad arguments."""

import ctypes
import gc
import subprocess
import sys
import textwrap

import pytest

import pinpool
from conftest import live_blocks, needs_numpy, needs_torch, np, torch


# ---- buffer protocol --------------------------------------------------------

def test_memoryview(pool):
    b = pool.alloc(1000)
    assert len(b) == b.nbytes == 1000 and b.block_size == 1024
    m = memoryview(b)
    assert (m.readonly, m.format, m.itemsize, m.ndim, m.shape, m.strides,
            m.nbytes, m.contiguous) == (False, "B", 1, 1, (1000,), (1,),
                                        1000, True)
    assert b.exports == 1
    m[:4] = b"\x01\x02\x03\x04"
    assert bytes(memoryview(b)[:4]) == b"\x01\x02\x03\x04"
    assert b.exports == 1  # the temporary view was released
    m.release()
    assert b.exports == 0
    b.close()


def test_memoryview_slices_and_casts(pool):
    b = pool.alloc(4096)
    m = memoryview(b)
    s = m[100:200]
    s[:] = bytes(range(100))
    w = m.cast("I")
    assert w.shape == (1024,)
    assert bytes(m[100:110]) == bytes(range(10))
    del m, s, w
    gc.collect()
    assert b.exports == 0
    b.close()


@needs_numpy
def test_numpy_frombuffer_writes_visible(pool):
    b = pool.alloc(4000)
    a = np.frombuffer(b, dtype=np.uint8)
    assert a.flags.writeable and a.shape == (4000,)
    a[:] = 7
    f = np.frombuffer(b, dtype=np.float32)
    f[0] = 1.5
    m = memoryview(b)
    assert m[10] == 7
    assert np.frombuffer(m[:4], dtype=np.float32)[0] == 1.5
    assert b.exports == 3
    del a, f, m
    assert b.exports == 0
    b.close()


@needs_numpy
def test_numpy_from_dlpack(pool):
    b = pool.alloc(256)
    memoryview(b)[:] = bytes(range(256))
    a = np.from_dlpack(b)
    assert a.dtype == np.uint8 and a.shape == (256,)
    assert a.ctypes.data == b.ptr  # zero copy
    assert (a == np.arange(256, dtype=np.uint8)).all()
    np.frombuffer(b, dtype=np.uint8)[5] = 200  # a write by another consumer
    assert a[5] == 200
    assert b.exports == 1
    del a
    assert b.exports == 0
    b.close()


@needs_numpy
@needs_torch
def test_torch_from_dlpack_writes_visible(pool):
    b = pool.alloc(1 << 16)
    t = torch.from_dlpack(b)
    assert t.dtype == torch.uint8 and t.shape == (1 << 16,)
    assert t.data_ptr() == b.ptr and t.device.type == "cpu"
    t.fill_(3)
    t[10] = 99
    assert memoryview(b)[10] == 99 and memoryview(b)[11] == 3
    f = t.view(torch.float32)
    f[0] = 2.0
    assert np.frombuffer(b, dtype=np.float32)[0] == 2.0
    assert b.exports == 1
    del t, f
    assert b.exports == 0
    b.close()


# ---- __dlpack__ arguments ------------------------------------------------------

def capsule_name(capsule):
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype = ctypes.c_char_p
    get.argtypes = [ctypes.py_object]
    return get(capsule).decode()


def test_dlpack_versions(pool):
    b = pool.alloc(100)
    assert capsule_name(b.__dlpack__()) == "dltensor"
    assert capsule_name(b.__dlpack__(max_version=(0, 8))) == "dltensor"
    c = b.__dlpack__(max_version=(1, 0))
    assert capsule_name(c) == "dltensor_versioned"
    c2 = b.__dlpack__(max_version=(2, 3))
    assert capsule_name(c2) == "dltensor_versioned"
    assert b.exports == 2
    del c, c2  # never consumed: the capsule destructor releases the export
    gc.collect()
    assert b.exports == 0
    assert b.__dlpack_device__() == (pinpool.kDLCPU, 0)
    b.close()


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER_V), ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor)]


def consume_versioned(capsule):
    """What a consumer does: take the pointer, rename the capsule."""
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ptr = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    assert api.PyCapsule_SetName(capsule, b"used_dltensor_versioned") == 0
    return ctypes.cast(ptr, ctypes.POINTER(DLManagedTensorVersioned))


def test_dlpack_versioned_struct(pool):
    b = pool.alloc(300)
    c = b.__dlpack__(max_version=(1, 1))
    m = consume_versioned(c)
    t = m.contents.dl_tensor
    assert (m.contents.version.major, m.contents.flags) == (1, 0)
    assert t.data == b.ptr and (t.device_type, t.device_id) == (1, 0)
    assert (t.ndim, t.code, t.bits, t.lanes) == (1, 1, 8, 1)
    assert t.shape[0] == 300 and t.strides[0] == 1 and t.byte_offset == 0
    del c  # used: the destructor leaves it to the consumer
    assert b.exports == 1
    m.contents.deleter(m)
    assert b.exports == 0
    b.close()


def test_dlpack_deleter_on_another_thread_without_gil(pool):
    """ctypes calls the deleter with the GIL released, from a thread that
    is neither the producer's nor holds any Python state of ours; the
    buffer and its Python object are long gone by then."""
    import threading
    b = pool.alloc(5000)
    caps = [b.__dlpack__(max_version=(1, 0)) for _ in range(16)]
    tensors = [consume_versioned(c) for c in caps]
    b.close()
    del b, caps
    gc.collect()
    assert live_blocks(pool) == 1  # exports hold the block

    def drop(ts):
        for m in ts:
            m.contents.deleter(m)

    threads = [threading.Thread(target=drop, args=(tensors[i::4],))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert live_blocks(pool) == 0


def test_dlpack_copy(pool):
    b = pool.alloc(64)
    memoryview(b)[:] = bytes(range(64))
    c = b.__dlpack__(max_version=(1, 0), copy=True)
    m = consume_versioned(c)
    assert m.contents.flags & 2  # IS_COPIED
    assert m.contents.dl_tensor.data != b.ptr
    assert ctypes.string_at(m.contents.dl_tensor.data, 64) == bytes(range(64))
    assert b.exports == 0 and live_blocks(pool) == 2
    m.contents.deleter(m)
    assert live_blocks(pool) == 1
    if np is not None:
        a = np.from_dlpack(b)  # copy=None: no copy needed, none made
        assert a.ctypes.data == b.ptr
        del a
    c = b.__dlpack__(copy=False)
    del c
    b.close()


def test_dlpack_device_and_stream_arguments(pool):
    b = pool.alloc(10)
    b.__dlpack__(stream=None)
    b.__dlpack__(stream=-1)
    for s in (0, 1, 2, 12345):
        with pytest.raises(BufferError, match="stream"):
            b.__dlpack__(stream=s)
    with pytest.raises(TypeError):
        b.__dlpack__(stream="default")
    b.__dlpack__(dl_device=(pinpool.kDLCPU, 0))
    for dev in ((2, 0), (pinpool.kDLCUDAHost, 0), (1, 1)):
        with pytest.raises(BufferError, match="dl_device"):
            b.__dlpack__(dl_device=dev)
        with pytest.raises(BufferError):
            b.__dlpack__(dl_device=dev, copy=True)
    for bad in ((1,), [1, 0], "cpu", (1, "0")):
        with pytest.raises(TypeError):
            b.__dlpack__(dl_device=bad)
    for bad in ((1,), [1, 0], 1, (1.0, 0)):
        with pytest.raises(TypeError):
            b.__dlpack__(max_version=bad)
    with pytest.raises(TypeError):
        b.__dlpack__(None)  # keyword-only
    with pytest.raises(TypeError):
        b.__dlpack__(colour=1)
    gc.collect()
    assert b.exports == 0
    b.close()


@needs_numpy
@needs_torch
def test_cuda_pinned_is_kdlcudahost(cuda_pool):
    b = cuda_pool.alloc(1000)
    assert b.__dlpack_device__() == (pinpool.kDLCUDAHost, 0)
    assert b.page_locked and b.device_accessible and b.device_id == 0
    assert b.backend == "cuda"
    a = np.from_dlpack(b)  # NumPy accepts pinned host memory
    assert a.ctypes.data == b.ptr
    c = b.__dlpack__(max_version=(1, 0))
    assert consume_versioned(c).contents.dl_tensor.device_type == 3
    # Pinned memory is also CPU memory: exported as kDLCPU on request.
    m = consume_versioned(b.__dlpack__(max_version=(1, 0),
                                       dl_device=(pinpool.kDLCPU, 0)))
    assert m.contents.dl_tensor.device_type == 1
    m.contents.deleter(m)
    t = torch.from_dlpack(_CPUView(b))
    t[0] = 42
    assert memoryview(b)[0] == 42
    del a, t
    b.close()


class _CPUView:
    """A consumer that asks for kDLCPU (older torch knows no kDLCUDAHost)."""

    def __init__(self, b):
        self.b = b

    def __dlpack_device__(self):
        return (pinpool.kDLCPU, 0)

    def __dlpack__(self, **kw):
        return self.b.__dlpack__(dl_device=(pinpool.kDLCPU, 0))


# ---- close and lifetimes ----------------------------------------------------------

@needs_numpy
@needs_torch
def test_close_is_idempotent_and_deferred(pool):
    b = pool.alloc(1 << 20)
    m = memoryview(b)
    a = np.from_dlpack(b)
    t = torch.from_dlpack(b)
    b.close()
    b.close()
    assert b.closed and b.exports == 3
    assert live_blocks(pool) == 1  # deferred: the consumers hold it
    with pytest.raises(BufferError, match="closed"):
        memoryview(b)
    with pytest.raises(BufferError, match="closed"):
        b.__dlpack__()
    with pytest.raises(BufferError, match="closed"):
        np.frombuffer(b, dtype=np.uint8)
    with pytest.raises(ValueError, match="closed"):
        b.ptr
    assert len(b) == 1 << 20 and "closed" in repr(b)
    m[0] = 1  # consumers still write valid memory
    t[1] = 2
    assert a[0] == 1 and a[1] == 2
    del m, a
    assert live_blocks(pool) == 1
    del t
    assert live_blocks(pool) == 0


@needs_numpy
@needs_torch
def test_consumers_outlive_buffer_object(pool):
    b = pool.alloc(10000)
    ptr = b.ptr
    m = memoryview(b)
    a = np.frombuffer(b, dtype=np.uint8)
    d = np.from_dlpack(b)
    t = torch.from_dlpack(b)
    del b
    gc.collect()
    assert live_blocks(pool) == 1
    a[:] = 5
    t[3] = 9
    assert m[0] == 5 and d[3] == 9 and t.data_ptr() == ptr
    # memoryview keeps the Buffer object itself alive (view.obj)
    assert m.obj.closed is False
    del m, a, d
    gc.collect()
    assert live_blocks(pool) == 1  # torch still holds its export
    del t
    assert live_blocks(pool) == 0


@needs_numpy
@needs_torch
def test_exports_outlive_pool_object():
    p = pinpool.Pool("backend=host")  # kDLCPU, which torch 1.13 takes
    b = p.alloc(3000)
    t = torch.from_dlpack(b)
    d = np.from_dlpack(b)
    del b, p
    gc.collect()  # the Pool object is gone: pinpool_destroy ran
    t.fill_(1)
    assert int(d.sum()) == 3000
    del t, d  # the last exports: the pool is torn down here


def test_with_statement_closes(pool):
    with pool.alloc(100) as b:
        memoryview(b)[0] = 1
    assert b.closed


def test_capsules_alive_at_interpreter_exit():
    """Exports still alive when the interpreter finalizes: their deleters
    run (or are leaked) without touching Python state; no crash."""
    code = textwrap.dedent("""
        import pinpool
        try:
            import numpy as np
        except ImportError:  # the free-threaded run: no NumPy
            np = None
        keep = []
        b = pinpool.Pool("").alloc(4096)
        keep.append(b.__dlpack__())
        keep.append(b.__dlpack__(max_version=(1, 0)))
        if np is not None:
            keep.append(np.from_dlpack(b))
        keep.append(memoryview(b))
        b.close()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


# ---- attributes ----------------------------------------------------------------

def test_attributes(pool):
    b = pool.alloc(4096)
    memoryview(b)[0] = 1
    a = b.attributes
    assert a["host_accessible"] is True and b.host_accessible is True
    assert a["device_accessible"] is False and b.device_id == -1
    assert a["backend"] == b.backend == "host"
    assert b.page_locked in (True, False)
    assert isinstance(b.numa_node, int) and b.numa_node >= -1
    assert b.huge_pages in (True, False, None)
    assert a == b.attributes  # computed once, then stable
    b.close()
    assert b.attributes == a  # already computed: still readable
    c = pool.alloc(10)
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.numa_node


def test_locked_and_huge():
    p = pinpool.Pool("mlock=1,hugepages=1,numa_node=0")
    b = p.alloc(4 << 20)
    assert b.attributes["huge_advised"] is True
    assert b.numa_node == 0
    assert b.page_locked == (p.stats()["locked_bytes"] > 0)
    b.close()
