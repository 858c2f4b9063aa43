"""NumPy on pool memory: Pool.empty / Pool.zeros with NumPy dtypes and
pinpool.asarray (docs/python.md, "NumPy")."""

import gc

import pytest

import pinpool
from conftest import live_blocks, needs_numpy, np

pytestmark = needs_numpy


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16",
                                   "int64", "complex64", "bool", "float16"])
@pytest.mark.parametrize("shape", [7, (3, 5), (2, 3, 4), (0,), (4, 0, 2), ()])
def test_empty_dtypes_and_shapes(pool, dtype, shape):
    a = pool.empty(shape, dtype=dtype)
    assert isinstance(a, np.ndarray)
    assert a.dtype == np.dtype(dtype)
    assert a.shape == (shape if isinstance(shape, tuple) else (shape,))
    assert a.flags.writeable and a.flags.c_contiguous
    a[...] = 1
    assert (a == 1).all()
    assert live_blocks(pool) == 1


def test_empty_default_dtype_is_float64(pool):
    assert pool.empty(3).dtype == np.float64
    assert pool.zeros((2, 2)).dtype == np.float64


def test_zeros_are_zero_on_reused_memory(pool):
    a = pool.empty(1024, dtype=np.uint8)
    a[:] = 0xAB
    del a
    gc.collect()
    z = pool.zeros(1024, dtype=np.uint8)  # the same block, cached
    assert not z.any()


def test_empty_is_pool_memory_without_copy(pool):
    a = pool.empty((16, 16), dtype=np.float32)
    base = a.base
    while not isinstance(base, memoryview):
        base = base.base
    buf = base.obj
    assert isinstance(buf, pinpool.Buffer) and buf.pool is pool
    assert a.ctypes.data == buf.ptr
    assert buf.nbytes == a.nbytes


def test_block_returns_when_last_view_dies(pool):
    a = pool.empty((8, 8), dtype=np.int32)
    row = a[3]
    col = a[:, 2]
    del a
    gc.collect()
    assert live_blocks(pool) == 1  # the views keep it
    del row
    gc.collect()
    assert live_blocks(pool) == 1
    col[:] = 5
    del col
    gc.collect()
    assert live_blocks(pool) == 0


@pytest.mark.parametrize("shape,exc", [((-1,), ValueError), (-3, ValueError),
                                       ((2, -2), ValueError),
                                       ("3", TypeError), ((1.5,), TypeError),
                                       (None, TypeError), ([[2]], TypeError),
                                       ((1 << 40, 1 << 30), ValueError)])
def test_empty_bad_shape(pool, shape, exc):
    with pytest.raises(exc):
        pool.empty(shape, dtype=np.float32)
    with pytest.raises(exc):
        pool.zeros(shape)
    assert live_blocks(pool) == 0


@pytest.mark.parametrize("dtype,exc", [("nope", TypeError), (object, TypeError),
                                       ("V0", TypeError), (3.5, TypeError)])
def test_empty_bad_dtype(pool, dtype, exc):
    with pytest.raises(exc):
        pool.empty(4, dtype=dtype)
    assert live_blocks(pool) == 0
    assert pool.stats()["requests"]["allocated"] == 0


def test_empty_out_of_memory(pool):
    p = pinpool.Pool("max_reserved=4MiB")
    with pytest.raises(MemoryError):
        p.empty((1024, 1024, 8), dtype=np.uint8)
    assert live_blocks(p) == 0


def test_asarray(pool):
    buf = pool.alloc(64)
    a = pinpool.asarray(buf)
    assert a.dtype == np.uint8 and a.shape == (64,)
    f = pinpool.asarray(buf, np.float32, (4, 4))
    f[:] = 2.5
    assert pinpool.asarray(buf, "float32")[5] == 2.5
    assert buf.exports == 2  # a and f; the third array is gone
    small = pinpool.asarray(buf, np.int16, 3)  # fewer bytes than the buffer
    assert small.shape == (3,)
    del a, f, small
    gc.collect()
    assert buf.exports == 0


def test_asarray_outlives_close(pool):
    buf = pool.alloc(32)
    a = pinpool.asarray(buf, np.int32)
    a[:] = 7
    buf.close()
    assert live_blocks(pool) == 1  # the array's export keeps the block
    assert (a == 7).all()
    del a
    gc.collect()
    assert live_blocks(pool) == 0


def test_asarray_bad_input(pool):
    buf = pool.alloc(30)
    for bad in (b"abc", bytearray(8), np.zeros(4), None, 12):
        with pytest.raises(TypeError):
            pinpool.asarray(bad)
    with pytest.raises(ValueError):
        pinpool.asarray(buf, np.float32)  # 30 bytes: not whole items
    with pytest.raises(ValueError):
        pinpool.asarray(buf, np.float64, (4, 4))  # 128 bytes
    with pytest.raises(ValueError):
        pinpool.asarray(buf, np.uint8, (-1,))
    with pytest.raises(TypeError):
        pinpool.asarray(buf, "nope")
    assert buf.exports == 0
    buf.close()
    with pytest.raises(BufferError):
        pinpool.asarray(buf)
    assert live_blocks(pool) == 0
