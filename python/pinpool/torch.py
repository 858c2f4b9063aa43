"""PyTorch on pool memory (docs/python.md, "PyTorch").

    import pinpool.torch as ppt
    x = ppt.pin(batch)                  # as batch.pin_memory(), into pool memory
    y = x.to("cuda", non_blocking=True)
    ppt.record_stream(x, torch.cuda.current_stream())
    loader = DataLoader(ds, batch_size=64, collate_fn=ppt.collate)

Importing this module imports torch; `import pinpool` does not.

How a tensor holds its block: the tensor is made by torch.frombuffer over a
memoryview of one Buffer. torch keeps a reference to that memoryview for as
long as the tensor's storage lives (every view of the tensor shares the
storage); the memoryview holds an export of the block and the Buffer. When
the last tensor viewing the storage is collected, the memoryview goes, and
the block goes back to the pool (after the streams recorded on it, if any).
The Buffer is never handed out, so nothing can close it under the tensor.

A registry maps the address of each such storage to its memoryview (held
weakly: it does not extend any lifetime) so that record_stream and
buffer_of find the Buffer of a tensor. A live memoryview holds its block,
so a live entry always names the block at that address; a dead one is
never returned, and the removal of a dead entry leaves a newer live one
for the same address (the block reused) in place.
"""

from __future__ import annotations

import collections.abc
import threading
import weakref
from typing import Any, List, Optional, Sequence, Union

import torch

from pinpool._array import nbytes_of as _nbytes_of
from pinpool._array import parse_shape as _parse_shape
from pinpool._core import Buffer, Pool, default_pool

__all__ = ["buffer_of", "collate", "empty", "from_buffer", "is_pooled",
           "patch_dataloader", "pin", "pin_memory_fn", "record_stream",
           "zeros"]

# storage address -> the memoryview the storage holds (weakly).
# WeakValueDictionary tolerates entries that die on other threads.
_storages: "weakref.WeakValueDictionary[int, memoryview]" = (
    weakref.WeakValueDictionary())


def _storage_ptr(t: torch.Tensor) -> int:
    # untyped_storage() from torch 2.0; TypedStorage (1.13, Debian 12)
    # before, whose data_ptr is the same address.
    if hasattr(t, "untyped_storage"):
        return int(t.untyped_storage().data_ptr())
    return int(t.storage().data_ptr())


def _pool(pool: Optional[Pool]) -> Pool:
    if pool is None:
        return default_pool()
    if not isinstance(pool, Pool):
        raise TypeError(f"pool must be a pinpool.Pool or None, not "
                        f"{type(pool).__name__}")
    return pool


def empty(shape: Union[int, Sequence[int]], dtype: torch.dtype = torch.float32,
          *, pool: Optional[Pool] = None) -> torch.Tensor:
    """A new uninitialized CPU tensor on pool memory (default_pool() if pool
    is None), as torch.empty(shape, dtype=dtype, pin_memory=True).

    The block goes back to the pool when the tensor and every view of it
    are collected. Raises TypeError (dtype not a torch.dtype, shape not
    ints, pool not a Pool), ValueError (a negative dimension, too large),
    MemoryError (as Pool.alloc). Thread-safe, as Pool.alloc.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, not "
                        f"{type(dtype).__name__}")
    dims = _parse_shape(shape)
    p = _pool(pool)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = _nbytes_of(dims, itemsize)
    buf = p.alloc(max(n, 1))
    mv = memoryview(buf)  # type: ignore[arg-type]  # (as in _array.py)
    if n == 0:
        # torch.frombuffer refuses a count of 0: view one item, keep none.
        flat = torch.frombuffer(mv, dtype=torch.uint8, count=1)[:0]
        t = flat.view(dtype).reshape(dims)
    else:
        t = torch.frombuffer(mv, dtype=dtype, count=n // itemsize)
        t = t.view(dims)
    _storages[_storage_ptr(t)] = mv
    return t


def from_buffer(buf: Buffer, dtype: torch.dtype = torch.uint8,
                shape: Optional[Union[int, Sequence[int]]] = None
                ) -> torch.Tensor:
    """A CPU tensor on the memory of buf, without a copy: shape (None: a
    1-D tensor of every whole item of buf.nbytes) of dtype. Meant as
    pinpool.SharedLoader's transform (the batch a worker filled, as a
    tensor) and for any Buffer.

    The tensor holds the block (and buf) until it and every view of it are
    collected; buffer_of and record_stream work on it as on empty()'s
    tensors. Raises TypeError (buf not a Buffer, dtype not a torch.dtype,
    shape not ints), ValueError (a negative dimension, a shape larger than
    buf), BufferError (buf closed, or lent to another process).
    Thread-safe, as Pool.alloc.
    """
    if not isinstance(buf, Buffer):
        raise TypeError(f"buf must be a pinpool.Buffer, not "
                        f"{type(buf).__name__}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, not "
                        f"{type(dtype).__name__}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if shape is None:
        dims: Sequence[int] = (buf.nbytes // itemsize,)
    else:
        dims = _parse_shape(shape)
    n = _nbytes_of(tuple(dims), itemsize)
    if n > buf.nbytes:
        raise ValueError(f"shape {tuple(dims)} of {dtype} needs {n} bytes; "
                         f"the buffer has {buf.nbytes}")
    mv = memoryview(buf)  # type: ignore[arg-type]  # (as in _array.py)
    if n == 0:
        flat = torch.frombuffer(mv, dtype=torch.uint8, count=1)[:0]
        t = flat.view(dtype).reshape(tuple(dims))
    else:
        t = torch.frombuffer(mv, dtype=dtype, count=n // itemsize)
        t = t.view(tuple(dims))
    _storages[_storage_ptr(t)] = mv
    return t


def zeros(shape: Union[int, Sequence[int]], dtype: torch.dtype = torch.float32,
          *, pool: Optional[Pool] = None) -> torch.Tensor:
    """As empty(), filled with zeros. Raises as empty()."""
    t = empty(shape, dtype, pool=pool)
    t.zero_()
    return t


def buffer_of(tensor: torch.Tensor) -> Optional[Buffer]:
    """The Buffer whose block holds tensor's storage, or None if the tensor
    is not on pool memory (not made by this module). Thread-safe."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, not "
                        f"{type(tensor).__name__}")
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        return None
    mv = _storages.get(_storage_ptr(tensor))
    if mv is None:
        return None
    obj = mv.obj
    return obj if isinstance(obj, Buffer) else None


def is_pooled(tensor: torch.Tensor, pool: Optional[Pool] = None) -> bool:
    """True if tensor is on the memory of pool (of any pool if None)."""
    buf = buffer_of(tensor)
    return buf is not None and (pool is None or buf.pool is pool)


def _frombuffer_dtype(tensor: torch.Tensor) -> bool:
    """tensor's dtype is one torch.frombuffer builds (not quantized)."""
    return not tensor.is_quantized


def pin(tensor: torch.Tensor, pool: Optional[Pool] = None) -> torch.Tensor:
    """A drop-in for tensor.pin_memory(): a copy of tensor on pool memory
    (default_pool() if pool is None), or tensor itself if it already is on
    that pool's memory.

    Any strided CPU tensor, contiguous or not (a transposed or sliced view
    is copied element by element); the copy is contiguous, with tensor's
    shape, dtype and values, and requires_grad as tensor's (a new leaf: the
    copy is not recorded by autograd). Needs no CUDA.

    Raises TypeError (not a tensor, or a quantized one: qint8 etc.),
    ValueError (not a dense CPU tensor: sparse, or on a device),
    MemoryError (as Pool.alloc). Thread-safe.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"pin: expected a torch.Tensor, not "
                        f"{type(tensor).__name__}")
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        raise ValueError(f"pin: only dense CPU tensors can be pinned, not "
                         f"a {tensor.layout} tensor on {tensor.device}")
    if not _frombuffer_dtype(tensor):
        # torch.frombuffer cannot build these (a quantized tensor's
        # storage has a scale and zero point): copying into one crashed.
        raise TypeError(f"pin: tensors of dtype {tensor.dtype} cannot be "
                        f"pinned into a pool (quantized)")
    p = _pool(pool)
    if is_pooled(tensor, p):
        return tensor
    out = empty(tuple(tensor.shape), tensor.dtype, pool=p)
    with torch.no_grad():
        out.copy_(tensor)
    if tensor.requires_grad:
        out.requires_grad_(True)
    return out


def record_stream(tensor: torch.Tensor, stream: Any) -> None:
    """Make the reuse of tensor's block wait for the work queued on stream
    so far, as tensor.record_stream(stream) does for CUDA memory: call it
    after queueing a non_blocking copy from the tensor.

    stream: a torch.cuda.Stream, anything with a 'cuda_stream' int
    attribute, or an int handle (Buffer.record_stream). Raises ValueError
    (the tensor is not on pool memory), and as Buffer.record_stream
    (RuntimeError if the pool has no event provider: configure
    events=cuda). Thread-safe.
    """
    buf = buffer_of(tensor)
    if buf is None:
        raise ValueError("record_stream: the tensor is not on pool memory "
                         "(make it with pinpool.torch.empty, pin or collate)")
    buf.record_stream(stream)


def _in_worker() -> bool:
    return torch.utils.data.get_worker_info() is not None


def collate(batch: Sequence[Any], pool: Optional[Pool] = None) -> Any:
    """A collate_fn for torch.utils.data.DataLoader that stacks each batch
    straight into pool memory: torch's default_collate followed by
    pin_memory copies every batch twice (stack, then pin), this once.

    Same structure as default_collate: tensors, NumPy arrays and Python
    numbers are stacked into one tensor (on pool memory); mappings, named
    tuples, tuples and lists are collated field by field; str and bytes are
    kept as lists.

    In a DataLoader worker process (num_workers > 0) it is
    default_collate itself: the batch must cross to the main process
    through shared memory anyway (torch stacks it straight there), and a
    pool's memory is the worker's own. Pin those batches in the main
    process with pin_memory_fn.

    Raises TypeError (an element of a type it cannot collate), and
    RuntimeError from torch.stack (tensors of different shapes).
    """
    if _in_worker():
        from torch.utils.data import default_collate

        return default_collate(list(batch))
    return _collate(list(batch), _pool(pool))


def _collate(batch: List[Any], pool: Pool) -> Any:
    if not batch:
        raise TypeError("collate: an empty batch")
    elem = batch[0]
    if isinstance(elem, torch.Tensor):
        if elem.device.type != "cpu" or elem.layout != torch.strided:
            raise TypeError(f"collate: only dense CPU tensors, not a "
                            f"{elem.layout} tensor on {elem.device}")
        out = empty((len(batch),) + tuple(elem.shape), elem.dtype, pool=pool)
        torch.stack(batch, 0, out=out)
        return out
    if type(elem).__module__ == "numpy" and hasattr(elem, "dtype"):
        return _collate([torch.as_tensor(b) for b in batch], pool)
    if isinstance(elem, bool):
        return _collate([torch.tensor(b, dtype=torch.bool) for b in batch],
                        pool)
    if isinstance(elem, int):
        return _collate([torch.tensor(b, dtype=torch.int64) for b in batch],
                        pool)
    if isinstance(elem, float):
        return _collate([torch.tensor(b, dtype=torch.float64) for b in batch],
                        pool)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return {k: _collate([d[k] for d in batch], pool) for k in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(_collate(list(s), pool) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        if any(len(b) != len(elem) for b in batch):
            raise RuntimeError("collate: each element in the batch should "
                               "be of equal size")
        fields = [_collate(list(s), pool) for s in zip(*batch)]
        return tuple(fields) if isinstance(elem, tuple) else fields
    raise TypeError(f"collate: batch elements of type {type(elem).__name__} "
                    f"cannot be collated")


def pin_memory_fn(data: Any, pool: Optional[Pool] = None) -> Any:
    """pin() applied to every tensor of a batch (tensors, mappings, named
    tuples, tuples, lists and other sequences, of their own type as
    torch's pin_memory keeps it; anything else is returned as is; a
    quantized tensor, which pin() refuses, is returned as torch's loader
    returns it: its pin_memory() where CUDA is there, else as is), as
    DataLoader(pin_memory=True) does with tensor.pin_memory(), but into
    pool memory and without CUDA. Use it on the batches of a DataLoader
    with workers:

        for batch in map(pinpool.torch.pin_memory_fn, loader): ...

    Raises as pin(). Thread-safe.
    """
    p = _pool(pool)
    if isinstance(data, torch.Tensor):
        if not _frombuffer_dtype(data):
            # A dtype pin() refuses (quantized): as torch's loader does,
            # its own pin_memory() where CUDA is there, the tensor as is
            # otherwise.
            return data.pin_memory() if torch.cuda.is_available() else data
        return pin(data, p)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {k: pin_memory_fn(v, p) for k, v in data.items()}
        # The batch's own mapping type (OrderedDict, a dict subclass), as
        # torch's pin_memory keeps it; a type that cannot be built from a
        # dict gives a dict, as torch's does.
        try:
            return type(data)(pinned)  # type: ignore[call-arg]
        except TypeError:
            return pinned
    if hasattr(data, "pin_memory") and not isinstance(data, (tuple, list)):
        # A custom batch with its own pin_memory() hook: torch's loader
        # calls it when CUDA is there (it pins with CUDA, not into the
        # pool) and returns the batch as is otherwise; so does this.
        if torch.cuda.is_available():
            return data.pin_memory()
        return data
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(pin_memory_fn(v, p) for v in data))
    if isinstance(data, tuple):
        return tuple(pin_memory_fn(v, p) for v in data)
    if isinstance(data, collections.abc.Sequence):
        # Any other sequence (a list, its subclasses, UserList) as torch's
        # pin_memory: its own type, a list if the type cannot be built
        # from one.
        items = [pin_memory_fn(v, p) for v in data]
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data


# ---- patch_dataloader --------------------------------------------------------
# DataLoader.__iter__ as torch defines it, replaced while patches are on;
# _patches: the patches on, innermost last (each one's pool). Under
# _patch_lock: switching it on or off from several threads at once.
_patch_lock = threading.Lock()
_patches: List["_DataLoaderPatch"] = []
_torch_iter: Any = None


class _Pinned:
    """A DataLoader's iterator whose batches are pin_memory_fn'ed."""

    def __init__(self, it: Any, pool: Pool) -> None:
        self._it = it
        self._pool = pool

    def __iter__(self) -> "_Pinned":
        return self

    def __next__(self) -> Any:
        return pin_memory_fn(next(self._it), self._pool)

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


# _iter_lock: the window in which a loader's pin_memory reads False while
# torch builds its iterator. Another thread starting to iterate then (the
# same loader, or reading its pin_memory) waits instead of seeing False and
# getting torch's unpinned iterator.
_iter_lock = threading.RLock()


def _patched_iter(loader: Any) -> Any:
    with _patch_lock:
        patch = _patches[-1] if _patches else None
    if patch is None:
        return _torch_iter(loader)
    with _iter_lock:
        if not loader.pin_memory:
            return _torch_iter(loader)
        # torch's own pinning (a CUDA pin thread; nothing at all on a
        # machine without CUDA) is left out: the batches are pinned into
        # the pool here.
        loader.pin_memory = False
        try:
            it = _torch_iter(loader)
        finally:
            loader.pin_memory = True
    return _Pinned(it, patch.pool)


class _DataLoaderPatch:
    """The switch patch_dataloader() turned on: undo() (or leaving the
    with block) turns it off."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.active = True

    def undo(self) -> None:
        """Turn this patch off; the DataLoader is torch's again when no
        patch is left on. Idempotent."""
        with _patch_lock:
            if not self.active:
                return
            self.active = False
            _patches.remove(self)
            if not _patches:
                # _torch_iter is kept, not cleared: a thread that entered
                # _patched_iter just before this still calls it (torch's).
                setattr(torch.utils.data.DataLoader, "__iter__", _torch_iter)

    def __enter__(self) -> "_DataLoaderPatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def patch_dataloader(pool: Optional[Pool] = None) -> _DataLoaderPatch:
    """From now on, every torch.utils.data.DataLoader(..., pin_memory=True)
    pins its batches into pool memory (default_pool() if pool is None)
    instead of calling tensor.pin_memory(): each batch goes through
    pin_memory_fn as it leaves the loader's iterator, on the thread that
    iterates, with any num_workers (the workers collate as usual; the
    batches cross to this process in shared memory and are copied into
    the pool once). Loaders with pin_memory=False are untouched.

    Returns the switch: a context manager, or call .undo(). Patches nest
    (the innermost pool is used); the last one undone restores torch's
    DataLoader.__iter__. Works without CUDA (torch's own pin_memory=True
    pins nothing there). Thread-safe.

        with pinpool.torch.patch_dataloader():
            for batch in DataLoader(ds, batch_size=64, num_workers=4,
                                    pin_memory=True):
                ...  # batch tensors are on pool memory

    Raises TypeError (pool not a Pool).
    """
    global _torch_iter
    p = _pool(pool)
    patch = _DataLoaderPatch(p)
    with _patch_lock:
        if not _patches:
            # torch's own (DataLoader.__iter__ is only ever _patched_iter
            # while a patch is on, and torch's again once none is).
            _torch_iter = torch.utils.data.DataLoader.__iter__
            setattr(torch.utils.data.DataLoader, "__iter__", _patched_iter)
        _patches.append(patch)
    return patch

