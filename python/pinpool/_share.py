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
128-byte handle (with the lend's secret token), nbytes and the descriptors
of the chunk and of its read-only control area as
multiprocessing.reduction.DupFd, the mechanism torch.multiprocessing uses
for storages: the descriptors are passed over a Unix socket (SCM_RIGHTS),
by multiprocessing's resource sharer or, while a process is being spawned,
by the spawning Popen (pinpool.SharedLoader passes them over its own
sockets instead: `lend_message`), and the address of the owner's return
socket. In a worker: unpickling attaches the block; pickling the attached
Buffer detaches it, then proves who is returning it: it connects to the
owner's return socket and sends the handle with a fresh random proof,
and the pickle carries the handle and that proof. The owner unpickles
that into its Buffer and ends the lend (pinpool_lend_return) from the
process the kernel says connected with that proof (SO_PEERCRED), never
from a pid the pickle claims: the token and the peer must be the lend's.
A pickle is bytes anyone may copy, and a process forked after the lend
(a worker's child, or the owner's) has the token in its memory; neither
can connect as the borrower (issue 36, second round).

The owner's table below changes only together with the C library's:
every call that ends lends says which (pinpool_lend_reclaim_list), and the
table drops exactly those; nothing here reads memory a worker can write.
"""

import collections
import errno
import os
import socket
import struct
import threading
import time
import weakref
from multiprocessing import reduction
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from pinpool import _fds
from pinpool._core import (BadHandleError, Buffer, Pool, StaleHandleError,
                           _attach, _share_owns)

# pinpool_share_handle_t (include/pinpool.h): every field naturally
# aligned, so the native layout has no padding: 128 bytes.
_HANDLE = struct.Struct("=IIQiiQQQQQQQIiQ16s16x")
_MAGIC = 0x68737070
_VERSION = 2
# pinpool_lend_reclaim_list's peers and flags (include/pinpool.h).
_PEER_ALL = -1
_PEER_EXITED = -2
_RECLAIM_LIVE = 2


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
    owner_ctl_fd: int
    ctl_ino: int
    token: bytes


def _parse(handle: bytes) -> _Handle:
    if not isinstance(handle, bytes) or len(handle) != _HANDLE.size:
        raise BadHandleError("not a pinpool share handle")
    h = _Handle(*_HANDLE.unpack(handle))
    if h.magic != _MAGIC:
        raise BadHandleError("not a pinpool share handle (bad magic)")
    if h.version != _VERSION:
        raise BadHandleError(f"a pinpool share handle of version {h.version}"
                             f", not {_VERSION}")
    return h


class _Lend(NamedTuple):
    buf: Buffer
    peer: int
    handle: bytes
    fd: int  # the chunk's descriptor (the pool's own: never closed here)
    ctl_fd: int  # its control area's (read-only; the pool's own)


# (pool nonce, generation) -> the lend. A generation is never reused by a
# pool, and the nonce tells pools apart. The lock is held across each C
# call that starts or ends a lend together with the table's update, so
# that the table and the pool's lends never disagree in between (a
# reclaim racing with a return, two threads pickling one buffer). The C
# calls under it are short and take only the pool's share lock (a leaf).
_lock = threading.RLock()
_lends: Dict[Tuple[int, int], _Lend] = {}
# pool nonce -> the Pool, so that a return refused here (its lend gone
# from the table) is counted in that pool's lend_refusals all the same.
_pools: "weakref.WeakValueDictionary[int, Pool]" = weakref.WeakValueDictionary()
# The nonces of every pool this process has lent from (one per pool): a
# return of one whose Pool is gone is stale (StaleHandleError), not
# another process's (rvpy39 D5).
_lent_nonces: Set[int] = set()

# -- the return channel (owner side) -----------------------------------------
# An AF_UNIX SOCK_SEQPACKET socket in the abstract namespace, made at the
# first pickle of a lend and named in it. A returning worker connects and
# sends (handle, proof); the kernel records the connecting process, which
# no sender can choose: SO_PEERPIDFD (Linux 6.5), a pidfd of that process
# even once it has exited and been reaped (6.16; its pidfs inode, 6.9,
# names that process alone), else SO_PEERCRED's pid. Connections are read
# without blocking when a returned Buffer is unpickled (the worker sends
# its proof before its pickle leaves it, so the proof is queued by then) or
# at Pool.lend_collect(); a connection without its message yet is kept for
# the next time (_wait: a borrower's as many as it has lends, never
# closed for a stranger's; the others at most _MAX_WAITING, closed from
# the pid with the most first, and while a self-lend is live each pid's
# only one kept, up to _MAX_WAITING_PIDS pids).
# A proof ends its lend when it is read, if the connecting process is the
# borrower (pinpool_lend_return_pidfd: by process, not pid number; a
# process that took a dead borrower's pid is refused even after it has
# exited too, which a pid cannot tell: D4 of issue 36's second review),
# and the outcome waits for the pickle that names the proof: an accepted
# return in _ended (one per lend that ended, so bounded by the owner's own
# lends: no peer can add to it but with its own lend's one return), a
# refusal in _refused (at most _MAX_PROOFS, the oldest dropped first: a
# peer can send as many as it likes). The two are apart: before, one LRU
# held both, and a flood of refusals pushed an honest ended lend's Buffer
# out before its pickle or lend_collect() took it (issue 36, fourth
# review, item 2). The worker detached before it sent the proof, so the
# block may be reused at once; and a return whose pickle is lost
# (Queue.get unpickles inside and drops the bytes when loading raised:
# _lost remembers the proofs of those) still ends at a later drain, its
# Buffer given back by Pool.lend_collect().
# Any process may connect, so a drain reads only what can matter: a
# connection from a process that holds no lend of this process's (by
# SO_PEERCRED's pid, while no lend to this process itself is live: those
# are taken back from anyone with the token) is closed unread, and each
# process gets at most _PEER_REFUSALS refused proofs read per drain (its
# further connections closed unread: an honest borrower sends none that is
# refused, but after a reclaim). One drain accepts at most _DRAIN_ACCEPTS
# connections, more than a full listen backlog (SOMAXCONN): a proof queued
# when a drain starts is reached by it, whatever flood is ahead of it
# (before: 64, and a flood that kept connecting kept every honest proof
# unread, the documented lend_collect() loop raising all through it), and
# the owner's hold stays bounded (an unbounded loop held it 11.7 s of a
# 12 s flood, issue 36 third round). A proof still queued behind more is
# read by a later drain: the return fails with BlockingIOError meanwhile
# (its lend live, nothing counted) and the same pickle can be loaded again.
_PROOF_BYTES = 16
_MAX_PROOFS = 4096
_MAX_WAITING = 64
# While a self-lend is live, pids whose only waiting connection is kept
# (its receiver may be any of them): this many at most, a bound on the
# owner's descriptors (a stranger needs this many processes to close an
# honest receiver's connection).
_MAX_WAITING_PIDS = 256
_DRAIN_ACCEPTS = 2 * 4096 + 64
_PEER_REFUSALS = 4
_MAX_LOST = 8  # proofs of lost pickles remembered per lend
_CRED = struct.Struct("=iII")  # struct ucred: pid, uid, gid
_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5
_have_peerpidfd = True  # False once the kernel said it has none
_listener: Optional[socket.socket] = None
_listener_pid = 0
_address = b""
# Accepted connections whose message has not come yet, with their
# SO_PEERCRED pid (0: unknown), oldest first.
_waiting: List[Tuple[socket.socket, int]] = []
# (pool nonce, generation, proof) -> what the drain made of that proof:
# _ended: the owner's Buffer, its lend ended, and when (time.monotonic());
# _refused: the refusal (counted then), at most _MAX_PROOFS.
_ended: Dict[Tuple[int, int, bytes], Tuple[Buffer, float]] = {}
_refused: "collections.OrderedDict[Tuple[int, int, bytes], Any]" = \
    collections.OrderedDict()
# (pool nonce, generation) -> proofs of pickles whose loading raised before
# their proof was read (BlockingIOError, OSError): those pickles are gone
# (Queue.get drops them), so lend_collect() may hand their Buffers back.
_lost: Dict[Tuple[int, int], List[bytes]] = {}
# Returns lend_collect() handed back, for a pickle of them that comes all
# the same (at most _MAX_PROOFS, the oldest dropped first): (weak
# reference to the Buffer, its id()), None once answered or lent again.
# Such a pickle is answered at most once, with the same Buffer, and only
# while that Buffer is open and has not been lent again since; any other
# load of it raises StaleHandleError, never counted as a refusal (the
# return was honest, the owner took it early). Before, the Buffer was
# held strongly: a dropped collected Buffer was never freed (32 MiB of 32
# in rv36e's collected_retain), and every copy of the pickle loaded as
# that Buffer, also once it was closed or lent to another worker
# (issue 36, the fifth review, items 1 and 2).
_collected: "collections.OrderedDict[Tuple[int, int, bytes], Optional[Tuple[weakref.ref[Buffer], int]]]" = \
    collections.OrderedDict()
# id() of a collected Buffer -> its key in _collected, so that lending it
# again spends that key (lend()). An entry whose weak reference is dead or
# names another object is stale (ids are reused) and ignored.
_collected_of: Dict[int, Tuple[int, int, bytes]] = {}
# A worker's side: (pool nonce, generation) of an attached lend -> its
# owner's return address (from the lend's pickle).
_homes: Dict[Tuple[int, int], bytes] = {}
# A worker's proof must be queued before this many seconds (a full backlog
# of an owner that never unpickles).
_CONNECT_TIMEOUT = 20.0
_MAX_HOMES = 16384


def _return_address() -> bytes:
    """The owner's return socket's address, made if needed (lock held)."""
    global _listener, _listener_pid, _address
    if _listener is None or _listener_pid != os.getpid():
        s = socket.socket(socket.AF_UNIX,
                          socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        addr = (b"\0pinpool-return-%d-" % os.getpid()
                + os.urandom(8).hex().encode())
        try:
            s.bind(addr)
            # Any local process can connect: it can send no descriptor
            # (accepted sockets inherit this), whose close could wait out
            # a linger of the sender's choosing (pinpool._fds).
            _fds.refuse_rights(s)
            s.listen(socket.SOMAXCONN)
            s.setblocking(False)
        except BaseException:
            s.close()
            raise
        _listener, _listener_pid, _address = s, os.getpid(), addr
    return _address


def _forget_listener_in_child() -> None:
    """After fork, in the child: the owner's return socket is not the
    child's (a child that accepted on it would take the owner's proofs).
    No lock: the forking thread is the only one left."""
    global _listener, _listener_pid, _address
    if _listener is not None:
        try:
            _listener.close()
        except OSError:
            pass
    for c, _ in _waiting:
        try:
            c.close()
        except OSError:
            pass
    _waiting.clear()
    # The parent's returns: not the child's to hand out.
    _ended.clear()
    _refused.clear()
    _lost.clear()
    _collected.clear()
    _collected_of.clear()
    _lent_nonces.clear()
    _listener, _listener_pid, _address = None, 0, b""


os.register_at_fork(after_in_child=_forget_listener_in_child)


def _peer_pidfd(conn: socket.socket) -> Optional[int]:
    """A pidfd of the process that connected conn (SO_PEERPIDFD), None
    where the kernel gives none (before Linux 6.5; its process reaped,
    before 6.16): its pid decides then. Raises OSError for a resource of
    the owner's (EMFILE), which the sender did not cause."""
    global _have_peerpidfd
    if not _have_peerpidfd:
        return None
    try:
        fd: int = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD)
        return fd
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
            raise
        if e.errno == errno.ENOPROTOOPT:
            _have_peerpidfd = False
        return None


def _settle(conn: socket.socket, msg: bytes, pidfd: Optional[int]) -> None:
    """End the lend the proof msg read from conn names if its sender
    (pidfd: conn's SO_PEERPIDFD, else conn's SO_PEERCRED pid) is the
    borrower, and keep the outcome for the pickle (lock held). It takes
    the connection itself, never a pid: a pickle that names this function
    passes values, and cannot pass a connected socket (issue 36, D2)."""
    if not isinstance(conn, socket.socket):
        raise TypeError("_settle: not a connection")
    try:
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                               _CRED.size)
        pid = _CRED.unpack(cred)[0]
    except (OSError, struct.error):
        return
    handle, proof = msg[:_HANDLE.size], msg[_HANDLE.size:]
    try:
        h = _parse(handle)
    except BadHandleError:
        return
    lend_ = _lends.get((h.nonce, h.generation))
    if lend_ is None:
        return  # junk, or a lend ended: its pickle, if any, is refused then
    buf = lend_.buf
    # The C return drops the table's entry and records the outcome,
    # _ended[key] = (buf, now), with the lend, in one step (no Python code
    # between: an exception of a signal handler right after it cannot
    # leave an ended lend whose Buffer no table holds: rvpy39 D2).
    key = (h.nonce, h.generation, proof)
    out = (_lends, _ended, key, (buf, time.monotonic()))
    try:
        if lend_.peer == os.getpid():
            # A self-lend (pickled without Buffer.lend: the receiver was
            # unknown) is bound to its token alone.
            buf._lend_return(  # type: ignore[attr-defined]
                handle, lend_.peer, *out)
        elif pidfd is not None:
            try:
                buf._lend_return_pidfd(  # type: ignore[attr-defined]
                    handle, pidfd, *out)
            except (StaleHandleError, BadHandleError):
                raise
            except ValueError:  # no pidfs and reaped: the pid's rule
                if pid <= 0:
                    return
                buf._lend_return(  # type: ignore[attr-defined]
                    handle, pid, *out)
        elif pid > 0:
            buf._lend_return(handle, pid, *out)  # type: ignore[attr-defined]
        else:
            return  # a process outside this pid namespace, no pidfd
    except (PermissionError, StaleHandleError, BadHandleError) as e:
        _refused[key] = e  # refused, and counted, by the C library
        _refused.move_to_end(key)
        while len(_refused) > _MAX_PROOFS:
            _refused.popitem(last=False)


def _peer_pid(conn: socket.socket) -> int:
    """conn's SO_PEERCRED pid; 0 where none (outside this pid namespace)."""
    try:
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                               _CRED.size)
        return max(0, int(_CRED.unpack(cred)[0]))
    except (OSError, struct.error):
        return 0


def _read_proof(conn: socket.socket) -> bool:
    """Read conn's (handle, proof) and settle it; False if its message has
    not come yet (keep conn). Raises OSError (EMFILE: no descriptor for
    the sender's pidfd) before reading, so the message waits for later."""
    pidfd = _peer_pidfd(conn)
    try:
        try:
            msg = _fds.recv_dropping_rights(
                conn, _HANDLE.size + _PROOF_BYTES + 1, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        if len(msg) != _HANDLE.size + _PROOF_BYTES:
            return True  # not a proof: nothing kept
        _settle(conn, msg, pidfd)
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


class _Budget:
    """What one drain reads of each process (lock held): the live lends
    per borrower pid when the drain starts, and the refusals read so far."""

    def __init__(self) -> None:
        self.lends: "collections.Counter[int]" = collections.Counter(
            v.peer for v in _lends.values())
        # A lend to this process itself is taken back from anyone.
        self.anyone = self.lends[os.getpid()] > 0
        self.refusals: "collections.Counter[int]" = collections.Counter()

    def may_read(self, pid: int) -> bool:
        """Whether a connection from pid can matter: from a borrower (or
        an unknown pid, or anyone while a self-lend is live) that has not
        spent its refusals in this drain."""
        if pid > 0 and not self.anyone and self.lends[pid] == 0:
            return False
        return self.refusals[pid] < _PEER_REFUSALS


def _owners_objects(conn: Any, budget: Any) -> None:
    """A pickle can name these functions and pass values, never a
    connection or a budget: refused before anything changes."""
    if not isinstance(conn, socket.socket) or not isinstance(budget, _Budget):
        raise TypeError("not the owner's connection and budget")


def _read_counted(conn: socket.socket, pid: int, budget: _Budget) -> bool:
    """_read_proof; a message read that ended no lend (a refusal, junk)
    is charged to pid's budget."""
    _owners_objects(conn, budget)
    before = len(_ended)
    done = _read_proof(conn)
    if done and len(_ended) == before:
        budget.refusals[pid] += 1
    return done


def _wait(conn: socket.socket, pid: int, budget: _Budget) -> None:
    """Keep conn (its message not come yet) for a later drain. A
    borrower's waiting connections, as many as it has lends, are never
    closed to make room; the others (spare: strangers', a borrower's
    beyond its lends) at most _MAX_WAITING, closed from the pid with the
    most spare connections first (its oldest), and while a self-lend is
    live never a pid's only one, but beyond _MAX_WAITING_PIDS such pids
    (then the oldest). Before, the oldest of any 64 was closed: 64 idle
    connections of any process closed an honest worker's accepted
    connection before its message came (issue 36, fourth review, item 6);
    then a borrower was known only by a lend to its pid, and the receiver
    of a self-lend (a Buffer pickled without Buffer.lend, the plain Queue
    pattern) has none: its only connection counted as spare and was the
    oldest one closed (issue 36, the fifth review, item 3). A self-lend's
    receiver is unknown, so any pid may be it: one connection per pid is
    kept, and a stranger's flood closes its own connections first."""
    _owners_objects(conn, budget)
    _waiting.append((conn, int(pid)))
    kept: "collections.Counter[int]" = collections.Counter()
    spare: Dict[int, List[int]] = {}  # pid -> its spare indices, oldest first
    nspare = 0
    for i, (_, p) in enumerate(_waiting):
        kept[p] += 1
        if p <= 0 or kept[p] > budget.lends[p]:
            spare.setdefault(p, []).append(i)
            nspare += 1
    excess = nspare - _MAX_WAITING
    if excess <= 0:
        return

    def floor(p: int) -> int:  # spare connections p keeps, whatever comes
        return 1 if budget.anyone and p > 0 and budget.lends[p] == 0 else 0

    drop: List[int] = []
    while excess > 0:
        p = max(spare, key=lambda q: len(spare[q]) - floor(q))
        if len(spare[p]) > floor(p):
            drop.append(spare[p].pop(0))
        elif nspare - len(drop) > _MAX_WAITING_PIDS:
            # Only pids' only connections left, more than a bound on the
            # owner's descriptors allows: the oldest of them.
            p = min((q for q in spare if spare[q]), key=lambda q: spare[q][0])
            drop.append(spare[p].pop(0))
        else:
            break
        if not spare[p]:
            del spare[p]
        excess -= 1
    for i in sorted(drop, reverse=True):
        _waiting.pop(i)[0].close()


def _drain() -> Optional[BaseException]:
    """Read the proofs queued on the return socket, at most _DRAIN_ACCEPTS
    connections' worth (lock held). None when the queue was emptied; else
    why not: BlockingIOError (connections left for a later drain) or the
    OSError accept or a sender's pidfd raised (EMFILE and the like: a
    resource of the owner's, not the sender's doing, so never a refusal;
    that connection waits, its message unread)."""
    if _listener is None or _listener_pid != os.getpid():
        return None
    budget = _Budget()
    still: List[Tuple[socket.socket, int]] = []
    failed: Optional[OSError] = None
    for c, pid in _waiting:
        try:
            done = failed is None and _read_counted(c, pid, budget)
        except OSError as e:  # EMFILE for its pidfd: it waits
            failed, done = e, False
        if done:
            c.close()
        else:
            still.append((c, pid))
    _waiting[:] = still
    if failed is not None:
        return failed
    for _ in range(_DRAIN_ACCEPTS):
        try:
            conn, _ = _listener.accept()
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:  # EMFILE, ENFILE, ENOBUFS: the rest waits
            return e
        pid = _peer_pid(conn)
        if not budget.may_read(pid):
            conn.close()  # unread: nothing it sent can end a lend now
            continue
        try:
            done = _read_counted(conn, pid, budget)
        except OSError as e:
            failed, done = e, False
        if done:
            conn.close()
            continue
        _wait(conn, pid, budget)
        if failed is not None:
            return failed
    return BlockingIOError(
        errno.EAGAIN, f"more than {_DRAIN_ACCEPTS} connections are queued on "
        "the owner's return socket: load the return again later")


def _prove_return(addr: bytes, handle: bytes) -> bytes:
    """In a worker: tell the owner at addr that this process returns
    handle's lend; the proof the pickle carries."""
    proof = os.urandom(_PROOF_BYTES)
    s = socket.socket(socket.AF_UNIX,
                      socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(_CONNECT_TIMEOUT)
        s.connect(addr)
        s.sendall(handle + proof)
    finally:
        s.close()
    return proof


def _count_refusal(nonce: int) -> None:
    """A return refused here counted in its pool's lend_refusals, as the
    C library counts its own (one stat)."""
    pool = _pools.get(nonce)
    if pool is not None:
        pool._lend_refused()  # type: ignore[attr-defined]


def lend(buf: Buffer, pid: int, pidfd: int = -1) -> None:
    """Buffer.lend (its docstring is the reference). pidfd >= 0: lend to
    the process that pidfd names (pinpool_lend_pidfd; pid is its pid, for
    the table), never to whoever has the pid number now."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise TypeError(f"pid must be an int, not {type(pid).__name__}")
    if not -(1 << 31) <= pid < (1 << 31):
        raise ValueError(f"pid {pid} is out of range")
    with _lock:
        # The C lend and the table's entry in one C call, with no Python
        # code between them: an asynchronous exception (KeyboardInterrupt,
        # a raising SIGALRM handler) cannot come between and leave a lend
        # the table lacks (issue 36, third review, item 4). The returns
        # (_lend_return and _lend_return_pidfd, given the table) likewise.
        key = buf._lend_into(  # type: ignore[attr-defined]
            pid, pidfd, _lends, _Lend)
        _pools[key[0]] = buf.pool  # type: ignore[assignment]
        _lent_nonces.add(key[0])
        _spend_collected(buf)  # lent again: no late pickle answers with it


def _spend_collected(buf: Buffer) -> None:
    """A Buffer lend_collect() handed back is lent again (lock held): a
    late pickle of its earlier return no longer answers with it."""
    k = _collected_of.pop(id(buf), None)
    if k is None:
        return
    v = _collected.get(k)
    if v is not None and v[0]() is buf:
        _collected[k] = None


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
        # into memory that is the owner's again, so it is refused: here
        # for the message, and by _close_unexported, which checks and
        # closes in one step (a view another thread takes after this
        # check makes it refuse; before, it survived the close: rvpy39 D1).
        if buf.exports:
            raise BufferError(
                f"cannot send back a shared Buffer with {buf.exports} live "
                "export(s) (memoryview, ndarray, tensor): release them first")
        if buf.closed:
            raise ValueError("cannot send back a closed shared Buffer")
        h = _parse(handle)
        with _lock:
            addr = _homes.get((h.nonce, h.generation))
        if addr is None:
            raise ValueError(
                "cannot pickle this shared Buffer back: it was not "
                "unpickled from its owner's pickle (a SharedLoader batch goes "
                "back with the loader's answer)")
        buf._close_unexported()  # type: ignore[attr-defined]
        with _lock:
            _homes.pop((h.nonce, h.generation), None)
        # Detached first: the owner may hand the block out again as soon
        # as the proof is read.
        return (_returned, (handle, os.getpid(), _prove_return(addr, handle)))
    if buf.closed:
        raise ValueError("cannot pickle a closed Buffer")
    pool = buf.pool  # not None: an attached buffer was handled above
    if pool is None or "shared=1" not in pool.config.split(","):
        raise TypeError(
            "cannot pickle a pinpool.Buffer of a pool without shared=1: its "
            "memory cannot be given to another process (create the pool "
            "with 'shared=1', or send bytes(buf))")
    with _lock:
        addr = _return_address()  # may fail (EMFILE): before any lend
        current = _current(buf)
        if current is not None:
            return (_rebuild, (current.handle, buf.nbytes,
                               reduction.DupFd(current.fd),
                               reduction.DupFd(current.ctl_fd), addr))
        # No lend yet: lend to this process. reclaim_exited cannot tell
        # when the receiver dies (its pid is unknown here); use
        # Buffer.lend (the loader does) or Pool.lend_reclaim() at
        # shutdown. What fails after the lend (DupFd: EMFILE, the resource
        # sharer's thread) ends it again: before, the Buffer stayed lent
        # to this process, and could be neither closed nor lent, and no
        # reclaim of the exited ended it (rvpy39 D4).
        lend(buf, os.getpid())
        current = _current(buf)
        assert current is not None
        try:
            return (_rebuild, (current.handle, buf.nbytes,
                               reduction.DupFd(current.fd),
                               reduction.DupFd(current.ctl_fd), addr))
        except BaseException:
            buf._lend_return(  # type: ignore[attr-defined]
                current.handle, os.getpid(), _lends)
            raise


def lend_message(buf: Buffer) -> Tuple[bytes, int, int, int]:
    """For a channel that passes descriptors itself (SharedLoader): the
    lent buf's (handle, nbytes, chunk fd, control fd); the descriptors are
    the pool's own (send them, never close them)."""
    current = _current(buf)
    if current is None:
        raise ValueError("the Buffer is not lent")
    return current.handle, buf.nbytes, current.fd, current.ctl_fd


def attach(handle: bytes, nbytes: int, fd: int, ctl_fd: int) -> Buffer:
    """In a worker: the Buffer of a lend received with its descriptors
    (not consumed)."""
    _parse(handle)
    buf: Buffer = _attach(handle, fd, ctl_fd, nbytes)
    return buf


def _end_lend(handle: bytes, peer: int, expect: Buffer, *,
              known_peer: bool = False) -> Buffer:
    """In the owner: end the lend of `handle`, handed back by process
    `peer`, and give back its Buffer. expect: the Buffer the caller found
    lent for this return (the loader: the one it lent for this answer;
    the pickled paths: the table's, looked up after the proof); any other
    lend is refused before anything ends (PermissionError). known_peer:
    `peer` is known from a channel (the loader's socket, SO_PEERCRED), not
    claimed by a sender: the peer check is never waived then.

    expect is required and is an object of the owner's, which no pickle
    can name by value: a pickle names functions and passes values, and
    before, one naming this function (then _take) with a handle and
    another borrower's pid ended that lend without any proof (issue 36,
    third round). The pickled returns end lends only through _returned
    (a proof the kernel vouches for) and _take_self (a self-lend)."""
    h = _parse(handle)
    with _lock:
        lend_ = _lends.get((h.nonce, h.generation))
        if lend_ is None:
            _count_refusal(h.nonce)
            raise StaleHandleError(
                f"stale handle: a shared Buffer came back whose lend (generation "
                f"{h.generation}) is not live in this process: returned or "
                "reclaimed already")
        if not isinstance(expect, Buffer) or lend_.buf is not expect:
            _count_refusal(h.nonce)
            raise PermissionError(
                f"process {peer} handed back a lend (generation "
                f"{h.generation}) it was not given for this answer")
        # A lend to this process itself (pickled with no Buffer.lend: the
        # receiver was unknown) is bound to no other process: its token
        # alone says the handle came back from whoever received it. A
        # channel that knows its peer never takes a self-lend back from
        # another process.
        if lend_.peer == os.getpid() and not known_peer:
            peer = lend_.peer
        lend_.buf._lend_return(  # type: ignore[attr-defined]
            handle, peer, _lends)  # and its table entry, in one step
    return lend_.buf


def _take_self(handle: bytes) -> Buffer:
    """In the owner: take back a lend made to this process itself (a
    Buffer pickled and unpickled in its owner); any other lend is refused
    by pinpool_lend_return (its peer is not this process)."""
    h = _parse(handle)
    with _lock:
        lend_ = _lends.get((h.nonce, h.generation))
        return _end_lend(handle, os.getpid(),
                         lend_.buf if lend_ is not None else None,  # type: ignore[arg-type]
                         known_peer=True)


def _rebuild(handle: bytes, nbytes: int, dupfd: Any,
             dupctl: Any, addr: bytes = b"") -> Buffer:
    """Unpickle a lent Buffer: attach it (a worker), or take it back (the
    owner, e.g. pickle.loads(pickle.dumps(buf)) in one process). addr: the
    owner's return socket, remembered for the Buffer's way back."""
    h = _parse(handle)
    fd = dupfd.detach()  # always: an unconsumed descriptor would leak
    try:
        ctl = dupctl.detach()
    except BaseException:
        os.close(fd)
        raise
    try:
        if _share_owns(handle):
            return _take_self(handle)
        buf: Buffer = _attach(handle, fd, ctl, nbytes)
        if isinstance(addr, bytes) and addr:
            with _lock:
                _homes[(h.nonce, h.generation)] = addr
                if len(_homes) > _MAX_HOMES:  # the oldest: closed, never sent
                    del _homes[next(iter(_homes))]
        return buf
    finally:
        os.close(fd)
        os.close(ctl)


def _returned(handle: bytes, peer: int = 0, proof: bytes = b"") -> Buffer:
    """Unpickle a Buffer a worker sent back: the owner's, lend ended. peer:
    the pid the sender says it has, a claim, used in messages only (a
    pickle does not say who wrote it, and a process forked after the lend
    has the token). proof: what the sender sent over the owner's return
    socket; the drain that reads it ends the lend if the process the
    kernel says connected with it is the borrower, and this gives back
    what it made of it. Without a proof the return is refused
    (PermissionError), and counted in lend_refusals. Where the proof may
    still be queued unread (more connections than one drain reads:
    BlockingIOError; accept or the sender's pidfd failing for a resource
    of the owner's, EMFILE: that OSError) nothing is counted, the lend
    stays live, and the same pickle can be loaded again later; if it is
    lost, the lend ends at a later drain all the same and
    Pool.lend_collect() gives its Buffer back. A pickle of a return that
    lend_collect() handed back already gives the same Buffer once, while
    that Buffer is open and not lent again; else StaleHandleError (never
    counted: _collected)."""
    h = _parse(handle)
    # Whose pool, by its nonce in the C library's table of the pools this
    # process created: a forked worker in another pid namespace can have
    # the owner's pid number (issue 36, third round).
    if not _share_owns(handle):
        if h.nonce in _lent_nonces:  # lent from here; its pool is gone
            raise StaleHandleError(
                f"stale handle: a shared Buffer (generation {h.generation}) "
                "came back whose pool this process has destroyed")
        raise ValueError(
            f"a returned shared Buffer can only be unpickled by its owner "
            f"(pid {h.owner_pid} in its pid namespace), not in this process "
            f"(pid {os.getpid()})")
    if not isinstance(peer, int) or isinstance(peer, bool):
        raise BadHandleError("a returned shared Buffer with a bad sender")
    with _lock:
        why = _drain()
        proved = isinstance(proof, bytes) and len(proof) == _PROOF_BYTES
        key = (h.nonce, h.generation, proof if proved else b"")
        if proved and key in _ended:
            lost = _lost.get(key[:2])
            if lost is not None and proof in lost:
                lost.remove(proof)
                if not lost:
                    del _lost[key[:2]]
            # A copy of this pickle loaded later is answered as one of a
            # return lend_collect() handed back (StaleHandleError, not
            # counted): both are copies of an honest return. Before, it
            # was counted in lend_refusals, and after lend_collect() not
            # (rvpy39 D5).
            _collected[key] = None
            _collected.move_to_end(key)
            while len(_collected) > _MAX_PROOFS:
                k, v = _collected.popitem(last=False)
                if v is not None and _collected_of.get(v[1]) == k:
                    del _collected_of[v[1]]
            return _ended.pop(key)[0]
        if proved and key in _collected:  # answered, or lend_collect()'s
            v = _collected[key]
            _collected[key] = None  # answered at most once
            late = v[0]() if v is not None else None
            if v is not None and _collected_of.get(v[1]) == key:
                del _collected_of[v[1]]
            if (late is not None and not late.closed and
                    _current(late) is None):
                return late
            raise StaleHandleError(
                f"stale handle: a shared Buffer (generation {h.generation}) "
                "came back whose return was taken already: its Buffer was "
                "answered to a load of this pickle before, or handed back "
                "by Pool.lend_collect() and closed, freed or lent again "
                "since (not counted as a refusal)")
        outcome = _refused.pop(key, None) if proved else None
        if outcome is not None:  # refused when its proof was read: counted
            raise type(outcome)(*outcome.args)
        if (h.nonce, h.generation) not in _lends:
            return _take_self(handle)  # refused as stale, counted
        if why is not None:
            # The proof may be among what this drain could not read: not
            # the sender's fault, so nothing counted, the lend left live,
            # and the same pickle can be loaded again. Its bytes may be
            # gone (Queue.get): lend_collect() may hand the Buffer back
            # once the proof is read (_lost; a few per lend, the first
            # kept: a pickle can say any proof).
            if proved:
                lost = _lost.setdefault(key[:2], [])
                if proof not in lost and len(lost) < _MAX_LOST:
                    lost.append(proof)
            raise why
        _count_refusal(h.nonce)
        raise PermissionError(
            f"a shared Buffer (generation {h.generation}) came back "
            f"(claiming pid {peer}) without a proof of its sender on the "
            "owner's return socket: refused (a copied or forged pickle, "
            "or one from an older pinpool)")


def lend_collect(pool: Pool, grace: Optional[float] = None) -> List[Buffer]:
    """Pool.lend_collect (its docstring is the reference). Hands back an
    ended lend's Buffer only where its pickle cannot come any more: its
    loading raised here before the proof was read (_lost), or, with
    grace, the proof was read at least grace seconds ago and no pickle has
    come since. Before, every ended lend whose pickle had not been loaded
    yet was taken, also those whose pickles were merely on their way: the
    honest pickle then raised StaleHandleError, counted as a refusal
    (issue 36, fourth review, item 3)."""
    if not isinstance(pool, Pool):
        raise TypeError(f"pool must be a pinpool.Pool, not "
                        f"{type(pool).__name__}")
    if grace is not None:
        if isinstance(grace, bool) or not isinstance(grace, (int, float)):
            raise TypeError(f"grace must be a number or None, not "
                            f"{type(grace).__name__}")
        if not grace >= 0:  # NaN too
            raise ValueError(f"Pool.lend_collect: grace must be >= 0, not "
                             f"{grace}")
    if "shared=1" not in pool.config.split(","):
        raise ValueError("Pool.lend_collect: the pool is not shared (create "
                         "it with shared=1)")
    with _lock:
        why = _drain()
        now = time.monotonic()
        keys = [k for k, (b, t) in _ended.items() if b.pool is pool and (
            k[2] in _lost.get(k[:2], ()) or
            (grace is not None and now - t >= grace))]
        if not keys and why is not None:
            raise why  # what was read stays for the next call
        out = []
        for k in keys:
            b = _ended.pop(k)[0]
            out.append(b)
            _lost.pop(k[:2], None)  # the lend ended: its proofs are moot
            _collected[k] = (weakref.ref(b), id(b))
            _collected.move_to_end(k)
            _collected_of[id(b)] = k
        # Proofs of lost pickles whose lend ended otherwise (reclaimed, or
        # by another proof): none of them can end it any more.
        pending = {k[:2] for k in _ended}
        for k2 in [k2 for k2 in _lost if k2 not in _lends and
                   k2 not in pending]:
            del _lost[k2]
        while len(_collected) > _MAX_PROOFS:
            k, v = _collected.popitem(last=False)
            if v is not None and _collected_of.get(v[1]) == k:
                del _collected_of[v[1]]
        return out


# Tests: a list to which each reclaim appends the number of the table's
# generations it compared (issue 38: it compared all of them for each lend
# ended); None otherwise.
_reclaim_meter: Optional[List[int]] = None


def _reclaim(pool: Pool, peer: int, live: bool) -> List[Buffer]:
    """End the lends pinpool_lend_reclaim_list selects (peer: a pid,
    _PEER_ALL or _PEER_EXITED) and drop exactly those from the table (lock
    held by the caller). The C call is told this table's generations and
    says which of them it ended; its result is made before any lend ends,
    so the two tables change together."""
    keys = [k for k, v in _lends.items() if v.buf.pool is pool]
    # The C call drops the ended lends from _lends and marks their Buffers
    # not lent itself, in the step that ends them: before, this loop did,
    # and an exception of a signal handler just after the C call (Ctrl-C
    # in SharedLoader.close()) left the table and the Buffers saying lent
    # for lends ended in C, for good (rvpy39 D2).
    ended: List[Optional[Buffer]] = pool._lend_reclaim(  # type: ignore[attr-defined]
        peer, _RECLAIM_LIVE if live else 0, keys, _lends, _reclaim_meter)
    return [b for b in ended if b is not None]


def _close_all(bufs: List[Buffer]) -> None:
    first: Optional[BaseException] = None
    for b in bufs:
        try:
            b.close()
        except BaseException as e:  # the others are closed all the same
            first = first or e
    if first is not None:
        raise first


def lend_reclaim(pool: Pool, pid: Optional[int] = None, *,
                 free: bool = False, live: bool = False) -> int:
    """Pool.lend_reclaim (its docstring is the reference)."""
    if not isinstance(pool, Pool):
        raise TypeError(f"pool must be a pinpool.Pool, not "
                        f"{type(pool).__name__}")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        raise TypeError(f"pid must be an int or None, not {type(pid).__name__}")
    if pid is not None and not 0 < pid < (1 << 31):  # before: OverflowError
        raise ValueError(f"Pool.lend_reclaim: pid must be > 0 and < 2**31, "
                         f"not {pid}")
    with _lock:
        bufs = _reclaim(pool, _PEER_ALL if pid is None else pid, bool(live))
    n = len(bufs)
    if free:
        _close_all(bufs)
    return n


def lend_reclaim_exited(pool: Pool, *, free: bool = False) -> int:
    """Pool.lend_reclaim_exited (its docstring is the reference)."""
    if not isinstance(pool, Pool):
        raise TypeError(f"pool must be a pinpool.Pool, not "
                        f"{type(pool).__name__}")
    with _lock:
        bufs = _reclaim(pool, _PEER_EXITED, False)
    n = len(bufs)
    if free:
        _close_all(bufs)
    return n


def lent_generations(pool: Pool) -> List[int]:
    """The generations of pool's lends in this table (tests compare them
    with the C table's, Pool.snapshot()["lends"])."""
    with _lock:
        return sorted(k[1] for k, v in _lends.items() if v.buf.pool is pool)


def lent_count(pool: Pool, pid: Optional[int] = None) -> int:
    """The lends of pool this process has made (to pid) that are live."""
    with _lock:
        return sum(1 for v in _lends.values()
                   if v.buf.pool is pool and (pid is None or v.peer == pid))
