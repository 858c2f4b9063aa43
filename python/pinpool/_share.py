"""Shared pools in Python: pickling a Buffer for multiprocessing, and the
owner's table of lent Buffers (docs/python.md, "Shared pools").

The C core lends, returns, attaches and detaches (pinpool_lend and the rest
of include/pinpool.h, "Sharing with other processes"); this module decides
what a pickle of a Buffer carries and keeps the one piece of mutable state
the protocol needs in the owner: which Buffer each live lend belongs to, so
that a handle coming back is turned into the owner's own Buffer object, and
so that the Buffer (whose block must not be freed while lent) stays alive
until then.

Pickling, in the owner: the block is lent (to the pid given to Buffer.lend,
else to this process: see `reduce_buffer`) and the pickle carries the
96-byte handle, nbytes and the chunk's descriptor as a
multiprocessing.reduction.DupFd, the mechanism torch.multiprocessing uses
for storages: the descriptor is passed over a Unix socket (SCM_RIGHTS), by
multiprocessing's resource sharer or, while a process is being spawned, by
the spawning Popen. In a worker: unpickling attaches the block; pickling
the attached Buffer detaches it and carries the handle alone; the owner
unpickles that into its Buffer and ends the lend (pinpool_lend_return).
"""

import os
import struct
import threading
from multiprocessing import reduction
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from pinpool._core import (BadHandleError, Buffer, Pool, StaleHandleError,
                           _attach, _lend_live)

# pinpool_share_handle_t (include/pinpool.h): every field naturally
# aligned, so the native layout has no padding: 96 bytes.
_HANDLE = struct.Struct("=IIQiiQQQQQQQI12x")
_MAGIC = 0x68737070


class _Handle(NamedTuple):
    magic: int
    version: int
    nonce: int
    owner_pid: int
    owner_fd: int
    chunk_id: int
    chunk_size: int
    dev: int
    ino: int
    offset: int
    length: int
    generation: int
    slot: int


def _parse(handle: bytes) -> _Handle:
    if not isinstance(handle, bytes) or len(handle) != _HANDLE.size:
        raise BadHandleError("not a pinpool share handle")
    h = _Handle(*_HANDLE.unpack(handle))
    if h.magic != _MAGIC:
        raise BadHandleError("not a pinpool share handle (bad magic)")
    return h


class _Lend(NamedTuple):
    buf: Buffer
    peer: int
    handle: bytes
    fd: int


# (pool nonce, generation) -> the lend. A generation is never reused by a
# pool, and the nonce tells pools apart. The lock is held across each C
# call that starts or ends a lend together with the table's update, so
# that the table and the pool's lends never disagree in between (a
# reclaim racing with a return, two threads pickling one buffer). The C
# calls under it are short and take only the pool's share lock (a leaf).
_lock = threading.RLock()
_lends: Dict[Tuple[int, int], _Lend] = {}


def lend(buf: Buffer, pid: int) -> None:
    """Buffer.lend (its docstring is the reference)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise TypeError(f"pid must be an int, not {type(pid).__name__}")
    with _lock:
        handle, fd = buf._lend(pid)  # type: ignore[attr-defined]
        h = _parse(handle)
        _lends[(h.nonce, h.generation)] = _Lend(buf, pid, handle, fd)


def _current(buf: Buffer) -> Optional[_Lend]:
    with _lock:
        for lend_ in _lends.values():
            if lend_.buf is buf:
                return lend_
    return None


def reduce_buffer(buf: Buffer) -> Tuple[Any, Tuple[Any, ...]]:
    """Buffer.__reduce__."""
    handle = buf._attached_handle()  # type: ignore[attr-defined]
    if handle is not None:
        # A worker sends its block back: detach first (docs/sharing.md:
        # return only after detaching). A live view would keep writing
        # into memory that is the owner's again, so it is refused.
        if buf.exports:
            raise BufferError(
                f"cannot send back a shared Buffer with {buf.exports} live "
                "export(s) (memoryview, ndarray, tensor): release them first")
        if buf.closed:
            raise ValueError("cannot send back a closed shared Buffer")
        buf.close()
        return (_returned, (handle,))
    if buf.closed:
        raise ValueError("cannot pickle a closed Buffer")
    pool = buf.pool  # not None: an attached buffer was handled above
    if pool is None or "shared=1" not in pool.config.split(","):
        raise TypeError(
            "cannot pickle a pinpool.Buffer of a pool without shared=1: its "
            "memory cannot be given to another process (create the pool "
            "with 'shared=1', or send bytes(buf))")
    with _lock:
        current = _current(buf)
        if current is None:
            # No lend yet: lend to this process. reclaim_exited cannot tell
            # when the receiver dies (its pid is unknown here); use
            # Buffer.lend (the loader does) or Pool.lend_reclaim() at
            # shutdown.
            lend(buf, os.getpid())
            current = _current(buf)
    assert current is not None
    return (_rebuild, (current.handle, buf.nbytes,
                       reduction.DupFd(current.fd)))


def _take(handle: bytes) -> Buffer:
    """In the owner: end the lend of `handle` and give back its Buffer."""
    h = _parse(handle)
    with _lock:
        lend_ = _lends.get((h.nonce, h.generation))
        if lend_ is None:
            raise StaleHandleError(
                f"a shared Buffer came back whose lend (generation "
                f"{h.generation}) is not live in this process: returned or "
                "reclaimed already")
        lend_.buf._lend_return(handle)  # type: ignore[attr-defined]
        del _lends[(h.nonce, h.generation)]
    return lend_.buf


def _rebuild(handle: bytes, nbytes: int, dupfd: Any) -> Buffer:
    """Unpickle a lent Buffer: attach it (a worker), or take it back (the
    owner, e.g. pickle.loads(pickle.dumps(buf)) in one process)."""
    h = _parse(handle)
    fd = dupfd.detach()  # always: an unconsumed descriptor would leak
    try:
        if h.owner_pid == os.getpid() and _owns(h):
            return _take(handle)
        buf: Buffer = _attach(handle, fd, nbytes)
        return buf
    finally:
        os.close(fd)


def _owns(h: _Handle) -> bool:
    with _lock:
        return (h.nonce, h.generation) in _lends or any(
            k[0] == h.nonce for k in _lends)


def _returned(handle: bytes) -> Buffer:
    """Unpickle a Buffer a worker sent back: the owner's, lend ended."""
    h = _parse(handle)
    if h.owner_pid != os.getpid():
        raise ValueError(
            f"a returned shared Buffer can only be unpickled by its owner "
            f"(pid {h.owner_pid}), not in pid {os.getpid()}")
    return _take(handle)


def _clear(which: List[Tuple[int, int]]) -> List[Buffer]:
    """Forget the lends `which` (ended by a reclaim); their Buffers."""
    with _lock:
        bufs = [_lends.pop(k).buf for k in which]
        for b in bufs:
            b._lend_clear()  # type: ignore[attr-defined]
    return bufs


def lend_reclaim(pool: Pool, pid: Optional[int] = None, *,
                 free: bool = False) -> int:
    """Pool.lend_reclaim (its docstring is the reference)."""
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        raise TypeError(f"pid must be an int or None, not {type(pid).__name__}")
    if pid is not None and pid <= 0:
        raise ValueError(f"Pool.lend_reclaim: pid must be > 0, not {pid}")
    with _lock:
        n: int = pool._lend_reclaim(-1 if pid is None else pid)  # type: ignore[attr-defined]
        bufs = _clear([k for k, v in _lends.items()
                       if v.buf.pool is pool and (pid is None or v.peer == pid)])
    if free:
        for b in bufs:
            b.close()
    return n


def lend_reclaim_exited(pool: Pool, *, free: bool = False) -> int:
    """Pool.lend_reclaim_exited (its docstring is the reference)."""
    with _lock:
        n: int = pool._lend_reclaim_exited()  # type: ignore[attr-defined]
        if n == 0:
            return 0
        # The C call says how many lends it ended, not which: ask each.
        bufs = _clear([k for k, v in _lends.items() if v.buf.pool is pool
                       and not _lend_live(v.handle, v.fd)])
    if free:
        for b in bufs:
            b.close()
    return n


def lent_count(pool: Pool, pid: Optional[int] = None) -> int:
    """The lends of pool this process has made (to pid) that are live."""
    with _lock:
        return sum(1 for v in _lends.values()
                   if v.buf.pool is pool and (pid is None or v.peer == pid))
