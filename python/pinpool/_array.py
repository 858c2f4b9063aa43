"""NumPy arrays on pool memory: Pool.empty/zeros for NumPy dtypes and
pinpool.asarray (docs/python.md, "NumPy").

An array made here is a view of one Buffer, through the buffer protocol:
numpy.frombuffer keeps a memoryview, which holds an export of the block
(and the Buffer) until the last array viewing it is collected; then the
block goes back to the pool. Nothing is copied.

NumPy is imported at the first call, so that `import pinpool` works
without it.
"""

from __future__ import annotations

import operator
import sys
from typing import Any, Sequence, Tuple, Union

from pinpool._core import Buffer, Pool

ShapeLike = Union[int, Sequence[int]]


def parse_shape(shape: Any) -> Tuple[int, ...]:
    """shape (an int or a sequence of ints >= 0) as a tuple.

    TypeError for anything else, ValueError for a negative dimension, as
    numpy.empty says it.
    """
    if isinstance(shape, (str, bytes)):
        raise TypeError(f"shape must be an int or a sequence of ints, "
                        f"not {type(shape).__name__}")
    dims: Tuple[int, ...]
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"shape must be an int or a sequence of ints, "
                            f"not {shape!r}") from None
    for d in dims:
        if d < 0:
            raise ValueError(f"negative dimensions are not allowed: "
                             f"{dims}")
    return dims


def nbytes_of(dims: Tuple[int, ...], itemsize: int) -> int:
    n = itemsize
    for d in dims:
        n *= d
    # The pool's bound on a size is 2^60 (Pool.alloc's ValueError); say so
    # here rather than let a huge product reach NumPy first.
    if n > 1 << 60:
        raise ValueError(f"an array of shape {dims} and itemsize "
                         f"{itemsize} is too large ({n} bytes)")
    return n


def is_torch_dtype(dtype: Any) -> bool:
    """True for a torch.dtype, checked without importing torch: if torch
    is not imported yet, nothing can be one of its dtypes."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(dtype, torch.dtype)


def numpy_dtype(dtype: Any) -> Any:
    import numpy as np

    try:
        dt = np.dtype("float64" if dtype is None else dtype)
    except TypeError as e:
        raise TypeError(f"dtype: {e}") from None
    if dt.hasobject:
        # Object arrays hold pointers to Python objects: pinned memory is
        # for bytes a device reads, and the references would escape the GC.
        raise TypeError(f"dtype {dt} holds Python objects: not on pool "
                        f"memory")
    if dt.itemsize == 0:
        raise TypeError(f"dtype {dt} has no size")
    return dt


def empty(pool: Pool, shape: ShapeLike, dtype: Any = None) -> Any:
    """Pool.empty for a NumPy dtype (see its docstring)."""
    dims = parse_shape(shape)
    dt = numpy_dtype(dtype)
    n = nbytes_of(dims, dt.itemsize)
    # A block of at least one byte: the pool has no empty blocks, and an
    # array of no elements still gets its own (tiny) block, as numpy.empty
    # gets memory for one.
    buf = pool.alloc(max(n, 1))
    return _view(buf, dims, dt, n)


def _view(buf: Buffer, dims: Tuple[int, ...], dt: Any, n: int) -> Any:
    import numpy as np

    count = n // dt.itemsize
    # A Buffer has the buffer protocol, which the typeshed of mypy 1.0
    # (Debian 12) cannot express yet (PEP 688): hence the ignore.
    return np.frombuffer(buf, dtype=dt,  # type: ignore[call-overload]
                         count=count).reshape(dims)


def asarray(buf: Buffer, dtype: Any = None,
            shape: ShapeLike | None = None) -> Any:
    """A NumPy array viewing a Buffer's bytes, without a copy.

    dtype: a NumPy dtype (None: uint8). shape: an int or a sequence of
    ints; None: one dimension, as many items as the buffer holds (its
    nbytes must then be a multiple of the item size). The array is
    writable and keeps the memory alive (one export) until it and its
    views are collected, even if the buffer is closed meanwhile.

    Raises TypeError (buf is not a pinpool.Buffer; a bad dtype or shape),
    ValueError (a negative dimension, the shape needs more bytes than
    the buffer has, nbytes not a multiple of the item size), BufferError
    (the buffer is closed).

    Thread-safe: as the buffer protocol, concurrent with close() on
    another thread (the array either gets the memory or BufferError).
    """
    if not isinstance(buf, Buffer):
        raise TypeError(f"pinpool.asarray: buf must be a pinpool.Buffer, "
                        f"not {type(buf).__name__}")
    dt = numpy_dtype("uint8" if dtype is None else dtype)
    if shape is None:
        if buf.nbytes % dt.itemsize:
            raise ValueError(f"pinpool.asarray: {buf.nbytes} bytes are not "
                             f"a whole number of {dt} items")
        dims: Tuple[int, ...] = (buf.nbytes // dt.itemsize,)
    else:
        dims = parse_shape(shape)
    n = nbytes_of(dims, dt.itemsize)
    if n > buf.nbytes:
        raise ValueError(f"pinpool.asarray: shape {dims} of {dt} needs {n} "
                         f"bytes, the buffer has {buf.nbytes}")
    if buf.closed:
        raise BufferError("pinpool.Buffer is closed")
    return _view(buf, dims, dt, n)
