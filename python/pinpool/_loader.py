"""pinpool.SharedLoader: batches filled by worker processes straight into
the consumer's pinned memory (docs/python.md, "The loader").

The main process allocates each batch's block from a shared=1 pool, lends
it to one worker (Buffer.lend(worker.pid)) and sends it with the task; the
worker attaches it, calls fill_fn(task, buf), detaches and sends the handle
back; the main process ends the lend and yields its own Buffer. No byte is
copied on the host between the fill and the pinned block.

Each worker has a channel of its own: a Unix socket pair. A message is an
8-byte header (payload bytes, descriptors) and a pickle; a task carries the
chunk's and the control area's descriptors as SCM_RIGHTS on its first
byte, straight from the pool's own (no os.dup, no multiprocessing
resource sharer holding them: closing the loader and the pool gives the
memory back). The main process reads each channel without blocking and
keeps a message's pieces per worker until it is whole (a worker that
stalls mid-message cannot hang it), and knows which worker every message
came from: a return is checked against the lend's token and that worker's
pid (pinpool_lend_return).

Failures stay as narrow as they are: a task that cannot be sent (its
pickle fails, the send fails) ends no other lend; its own block stays lent
to that worker (quarantined) until the worker is gone, since nothing tells
the owner the worker never saw it. No lend of a live worker is ever ended
by the loader: close() stops and joins (or kills) the workers first, then
ends what was lent to them.
"""

import ctypes
import errno
import io
import itertools
import multiprocessing
import os
import pickle
import select
import signal
import socket
import struct
import threading
import time
import traceback
from typing import (Any, Callable, Dict, Generic, Iterable, Iterator, List,
                    Optional, Tuple, TypeVar, Union)

from pinpool._core import Buffer, Pool
from pinpool import _fds, _share

T = TypeVar("T")

# A chunk lends at most this many blocks at once (the control area's slots
# for the smallest chunk, docs/sharing.md "Limits"): a loader may not need
# more lends at once than that.
MAX_LENDS = 128

_HEADER = struct.Struct("=II")  # payload bytes, descriptors
# The owner's tasks to a worker (the owner is trusted by its workers).
_MAX_PAYLOAD = 1 << 30
# A worker's answer to the owner: kind, seq, a 128-byte handle or None, a
# traceback (cut to _MAX_TB by the worker) and a pid. Anything longer is a
# broken or hostile worker: refused as soon as its header is read, so the
# owner never buffers more than this per worker.
_MAX_TB = 32 << 10
_MAX_ANSWER = 64 << 10
# Reads of one worker's channel per pump: a worker that streams without
# pause cannot keep the owner in pump past its deadline.
_PUMP_READS = 4


class _AnswerUnpickler(pickle.Unpickler):
    """The owner unpickles a worker's answer with this: it resolves no
    global at all, so the answer can only be built of the pickle's own
    types (tuple, str, bytes, int, None); a worker cannot make the owner
    call anything (docs/sharing.md, "Threat model": what the owner accepts
    from a worker)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"a worker's answer names {module}.{name}: refused (an answer "
            "holds only tuples, str, bytes, int and None)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a worker's answer with a persistent "
                                     "id: refused")


def _load_answer(payload: bytes) -> Tuple[Any, ...]:
    """A worker's answer (kind, seq, handle, traceback, pid), checked for
    its shape: WorkerError for anything else."""
    try:
        msg = _AnswerUnpickler(io.BytesIO(payload)).load()
    except Exception as e:
        raise WorkerError(f"a worker sent a malformed message: {e}") from None
    if not (isinstance(msg, tuple) and len(msg) == 5
            and msg[0] in ("ok", "err") and type(msg[1]) is int
            and (msg[2] is None or (type(msg[2]) is bytes
                                    and len(msg[2]) == _share._HANDLE.size))
            and type(msg[3]) is str and type(msg[4]) is int):
        raise WorkerError("a worker sent a malformed message")
    return msg

# Tests: called with the name of each step of the send and receive paths
# (docs/verification.md, "Issue 36: sharing"); may raise to inject a fault.
_fault: Optional[Callable[[str], None]] = None


# The longest timeout poll() can wait, in seconds (its int milliseconds).
MAX_TIMEOUT = (2**31 - 1) / 1000


def _step(name: str) -> None:
    if _fault is not None:
        _fault(name)


class WorkerError(RuntimeError):
    """A SharedLoader worker raised (the message has its traceback), died
    (its lent blocks were reclaimed), or broke its channel's protocol."""


# -- waiting without a limit nowhere ----------------------------------------
# The owner never waits for a worker with Process.join(): join() ends in
# waitpid(pid, 0), and a worker that let its own child ptrace it
# (PR_SET_PTRACER) and exited is a zombie that only its tracer can reap:
# waitpid blocks as long as the tracer lives, with or without join's
# timeout (which only bounds the wait for the sentinel; issue 36, third
# review, item 1). Whether a worker has exited is read from its pidfd
# instead (readable once every thread has exited: a zombie, traced or not,
# whose memory is gone, so nothing it was lent can still be written), and
# it is reaped with WNOHANG only; one that cannot be reaped yet is left to
# _reap_later.
_unreaped: List[Any] = []


def _reap_later(p: Any) -> None:
    """p has exited but is not reaped (a traced zombie): forget it in
    multiprocessing's table of children (whose exit handler joins each one
    without a limit) and reap it with WNOHANG at a later loader's start
    or close."""
    _unreaped.append(p)
    try:
        multiprocessing.process._children.discard(p)  # type: ignore
    except AttributeError:
        pass


def _reap_unreaped() -> None:
    """Best effort: an entry that cannot be polled (another process's
    child, after a fork) is dropped."""
    for p in list(_unreaped):
        try:
            p.join(0)
            if p.exitcode is None:
                continue
        except Exception:
            pass
        _unreaped.remove(p)


def _wait_readable(fds: List[int], timeout: Optional[float]) -> List[int]:
    """The descriptors of fds that are readable (or hung up) within timeout
    seconds (None: no limit; 0: now). poll, not select: any descriptor
    number (select fails from 1024 on: issue 36, third review, item 7)."""
    pl = select.poll()
    for f in fds:
        pl.register(f, select.POLLIN)
    ms = -1 if timeout is None else max(0, int(timeout * 1000 + 0.999))
    try:
        ev = pl.poll(ms)
    except InterruptedError:
        return []
    return [f for f, e in ev if e & (select.POLLIN | select.POLLHUP
                                     | select.POLLERR)]


# -- a non-dumpable owner (dumpable=False) -----------------------------------
# A worker of the owner's uid can open /proc/<owner>/fd/N, and so every
# chunk of the owner, lent to it or not: /proc/<pid>/fd needs only
# PTRACE_MODE_READ, which Yama's ptrace_scope does not restrict. Only a
# non-dumpable owner (PR_SET_DUMPABLE 0), another uid, or a worker
# without the descriptors (spawn, forkserver) protects the chunks it was
# not sent (issue 36, third review, item 3). Once a loader asks for it,
# the owner stays non-dumpable for the rest of its life: a worker's
# descendants (a daemon it double-forked, reparented away from the owner)
# can outlive close() unseen, and the moment the owner became dumpable
# again one opened /proc/<owner>/fd/N, a chunk memfd, and wrote a block
# allocated after close(), never lent (issue 36, fourth review, item 4).
# No process the owner can wait for bounds that; only the owner's exit
# does. Under a lock: two loaders starting at once set it once.
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_dumpable_lock = threading.Lock()


def _prctl(op: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    r = int(libc.prctl(op, ctypes.c_ulong(arg), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl({op}): {os.strerror(e)}")
    return r


def _hold_nondumpable() -> None:
    """Make this process non-dumpable for good (see above)."""
    with _dumpable_lock:
        if _prctl(_PR_GET_DUMPABLE) != 0:
            _prctl(_PR_SET_DUMPABLE, 0)


def _open_pidfd(p: Any, forkserver: bool) -> int:
    """A pidfd of the worker p just started, or -1 if it has already gone
    (its pid may then name another process). A fork or spawn worker is the
    owner's child, reaped by nobody before this; a forkserver's worker is
    reaped by the forkserver, which writes its status to the sentinel only
    after: a sentinel still unreadable after the open says the pid was
    p's when it was opened."""
    try:
        fd = os.pidfd_open(p.pid)
    except ProcessLookupError:
        return -1
    if forkserver and _wait_readable([p.sentinel], 0):
        os.close(fd)
        return -1
    return fd


# -- the channel ------------------------------------------------------------

def _recv_fds(sock: socket.socket, n: int, maxfds: int,
              flags: int = 0) -> Tuple[bytes, List[int]]:
    """recvmsg of up to n bytes and maxfds descriptors (socket.recv_fds
    drops its flags before Python 3.12)."""
    data, anc, mflags, _ = sock.recvmsg(n, socket.CMSG_SPACE(maxfds * 4),
                                        flags | socket.MSG_CMSG_CLOEXEC)
    fds = _fds.fds_of(anc)
    if mflags & socket.MSG_CTRUNC:
        for f in fds:
            _fds.close_received(f)
        raise OSError(errno.EMFILE, "a descriptor was dropped (MSG_CTRUNC: "
                      "RLIMIT_NOFILE, or too many sent)")
    return data, fds


def _send_msg(sock: socket.socket, obj: Any, fds: List[int]) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = _HEADER.pack(len(payload), len(fds)) + payload
    _step("sendmsg")
    n = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    if n < len(data):  # the descriptors went with the first byte
        sock.sendall(memoryview(data)[n:])


def _send_nowait(sock: socket.socket, obj: Any, fds: List[int],
                 deadline: Optional[float],
                 idle: Callable[[socket.socket, Optional[float]], None],
                 what: str) -> None:
    """The owner's send of one message on a non-blocking socket: never
    blocks past deadline (time.monotonic(); None: forever), so a worker that
    stops reading cannot hang the owner (TimeoutError). idle(sock, wait) is
    called whenever the socket is full: it waits up to `wait` seconds for
    sock to be writable (and reads the workers meanwhile)."""
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(_HEADER.pack(len(payload), len(fds)) + payload)
    _step("sendmsg")
    first = True
    while data:
        try:
            if first and fds:  # the descriptors go with the first byte
                n = socket.send_fds(sock, [data], fds)
            else:
                n = sock.send(data)
            first = False
            data = data[n:]
            continue
        except (BlockingIOError, InterruptedError):
            pass
        wait = None
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError(f"SharedLoader: {what} not taken in time "
                                   "(the worker does not read its channel)")
        idle(sock, wait)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        b = sock.recv(n - len(out))
        if not b:
            raise EOFError("the channel closed within a message")
        out += b
    return bytes(out)


def _recv_msg(sock: socket.socket) -> Tuple[Any, List[int]]:
    """A worker's blocking read of one message and its descriptors. Room
    for as many as a message can carry, so that the kernel drops none in a
    close of its own (which can wait out a sender's SO_LINGER, issue 36's
    fourth review, item 1): those past the header's count are closed by
    close_received, without waiting."""
    head, fds = _recv_fds(sock, _HEADER.size, _fds._MAX_FDS)
    if not head:
        raise EOFError("the channel closed")
    try:
        head += _recv_exact(sock, _HEADER.size - len(head))
        size, nfds = _HEADER.unpack(head)
        if nfds != len(fds) or size > _MAX_PAYLOAD:
            raise ValueError(f"a message with {len(fds)} descriptors, "
                             f"expected {nfds}")
        return pickle.loads(_recv_exact(sock, size)), fds
    except BaseException:
        for f in fds:
            _fds.close_received(f)
        raise


class _Inbox:
    """The owner's side of one worker's channel: non-blocking reads, a
    message's pieces kept until it is whole (so that no read can split the
    stream, and no worker can hang the owner by stalling mid-message)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock  # blocking (for the owner's sends)
        self.buf = bytearray()
        self.eof = False

    def pump(self) -> None:
        """Read what is there, at most _PUMP_READS reads and never past one
        whole message (so that the caller's deadline holds against a worker
        that never stops sending). WorkerError for a header that announces
        more than an answer can hold, or for descriptors: a worker sends
        none. The owner's end refuses them (SO_PASSRIGHTS 0, _start) where
        the kernel can; else they are received (room for as many as a
        message carries, so that the kernel drops none in a close of its
        own) and closed without waiting on the worker
        (_fds.close_received: a socket it sent with SO_LINGER and unsent
        data held the owner in close() past any timeout)."""
        for _ in range(_PUMP_READS):
            if self.eof or self._whole():
                return
            try:
                _step("recv")
                data, fds = _recv_fds(self.sock, 1 << 16, _fds._MAX_FDS,
                                      socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionResetError:  # it died with our bytes unread
                self.eof = True
                return
            for f in fds:
                _fds.close_received(f)
            if fds:
                raise WorkerError(
                    f"a worker sent {len(fds)} descriptor(s): the owner "
                    "expects none (the channel is broken)")
            if not data:
                self.eof = True
                return
            self.buf += data

    def _whole(self) -> bool:
        if len(self.buf) < _HEADER.size:
            return False
        size, nfds = _HEADER.unpack_from(self.buf)
        if nfds != 0 or size > _MAX_ANSWER:
            raise WorkerError(
                f"a worker sent a malformed message ({nfds} descriptors, "
                f"{size} bytes: an answer is at most {_MAX_ANSWER}): the "
                "channel is broken")
        return len(self.buf) >= _HEADER.size + int(size)

    def take(self) -> Optional[Tuple[Any, ...]]:
        """One whole message, or None."""
        if not self._whole():
            return None
        size, _ = _HEADER.unpack_from(self.buf)
        payload = bytes(self.buf[_HEADER.size:_HEADER.size + size])
        del self.buf[:_HEADER.size + size]
        return _load_answer(payload)


# -- the worker ---------------------------------------------------------------

def _worker_main(wid: int, fill_fn: Callable[[Any, Buffer], Any],
                 sock: socket.socket, close_fds: List[int]) -> None:
    # The parent handles Ctrl-C and shuts the workers down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for f in close_fds:  # (fork) the other workers' channels
        try:
            os.close(f)
        except OSError:
            pass
    while True:
        try:
            msg, fds = _recv_msg(sock)
        except EOFError:
            return
        if msg is None:
            return
        seq, task, handle, nbytes = msg
        try:
            buf = _share.attach(handle, nbytes, fds[0], fds[1])
        except BaseException:
            _send_msg(sock, ("err", seq, None, traceback.format_exc()[-_MAX_TB:],
                             os.getpid()), [])
            return
        finally:
            for f in fds:
                os.close(f)
        try:
            fill_fn(task, buf)
            kind, tb = "ok", ""
        except BaseException:
            kind, tb = "err", traceback.format_exc()
        back: Optional[bytes] = None
        # Detached, so it may be handed back, only if no view is alive: the
        # check and the close are one step (_close_unexported), so a view
        # another thread of fill_fn's takes meanwhile keeps the block here
        # (before, the check came first: rvpy39 D1).
        try:
            buf._close_unexported()  # type: ignore[attr-defined]
            back = buf._attached_handle()  # type: ignore[attr-defined]
        except ValueError:  # fill_fn closed it, and no view is left
            back = buf._attached_handle()  # type: ignore[attr-defined]
        except BufferError:  # a live view: the block stays with us
            if kind == "ok":
                kind = "err"
                tb = (f"fill_fn left {buf.exports} live export(s) of the "
                      "batch (memoryview, ndarray, tensor): release them "
                      "before returning")
        if len(tb) > _MAX_TB:  # an answer is at most _MAX_ANSWER bytes
            tb = "...\n" + tb[-_MAX_TB:]
        _send_msg(sock, (kind, seq, back, tb, os.getpid()), [])


def _tasks(tasks: Union[int, Iterable[Any]]) -> Iterator[Any]:
    if isinstance(tasks, bool):
        raise TypeError("tasks must be an int >= 0 or an iterable, not bool")
    if isinstance(tasks, int):
        if tasks < 0:
            raise ValueError(f"tasks (a count) must be >= 0, not {tasks}")
        return iter(range(tasks))
    try:
        return iter(tasks)
    except TypeError:
        raise TypeError("tasks must be an int >= 0 or an iterable, not "
                        f"{type(tasks).__name__}") from None


def _positive(name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{name} must be >= 1, not {v}")
    return v


def _check_footprint(pool: Pool, batch_bytes: int, lends: int) -> None:
    """ValueError, before anything starts, for settings whose blocks lent
    at once (lends blocks of batch_bytes) cannot fit: more than the pool's
    max_reserved, or more than the machine's physical memory (a loader
    that would reach the OOM killer, or fail midway with workers started)."""
    need = batch_bytes * lends
    cap = 0
    for kv in pool.config.split(","):
        k, _, v = kv.partition("=")
        if k == "max_reserved" and v.isdigit():
            cap = int(v)
    if cap and need > cap:
        raise ValueError(
            f"batch_bytes * num_workers * max_lent_per_worker = {need} bytes "
            f"lent at once: more than the pool's max_reserved ({cap})")
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        phys = 0
    if phys > 0 and need > phys:
        raise ValueError(
            f"batch_bytes * num_workers * max_lent_per_worker = {need} bytes "
            f"lent at once: more than this machine's memory ({phys})")


class SharedLoader(Generic[T]):
    """SharedLoader(pool, fill_fn, tasks, batch_bytes, *, num_workers=2,
    max_lent_per_worker=2, ordered=True, transform=None,
    start_method=None, timeout=None, dumpable=True)

    An iterable over batches that num_workers processes fill in place: for
    each task (tasks: an int n for range(n), or an iterable of picklable
    tasks) a block of batch_bytes of pool (shared=1) is lent to a worker,
    which calls fill_fn(task, buf) with a writable Buffer on it (memoryview,
    NumPy, torch: no copy). The main process yields the owner's Buffer
    (or transform(buf)): the filled pinned block itself, never a copy.

    Ownership: a yielded Buffer is the caller's, to close (or drop: garbage
    collection closes it) when done; the loader keeps no reference.
    Back-pressure: at most max_lent_per_worker blocks are lent to each
    worker at once. ordered=True yields in task order, else as filled.

    Errors: fill_fn raising in a worker raises WorkerError here, with the
    worker's traceback in the message; a worker that dies (SIGKILL, a
    crash) raises WorkerError naming it, after its lent blocks are
    reclaimed and freed; a worker that hands back what it was not lent
    (pinpool_lend_return refuses it) raises WorkerError. Either way the
    loader is closed. A task that cannot be sent (it does not pickle)
    raises here; its block stays lent to its worker until close() has
    stopped that worker. Settings that need more than 128 lends at once
    (num_workers * max_lent_per_worker: a chunk lends at most 128 blocks
    at a time) raise ValueError at construction. timeout
    (seconds, None: forever): the longest wait for one batch, and for
    one task's send to be taken by its worker (TimeoutError).
    batch_bytes * num_workers * max_lent_per_worker beyond the pool's
    max_reserved or physical memory raises ValueError at construction. close() (or leaving a `with` block, or the end of the
    iteration) stops the workers, joins them and reclaims every block still
    lent. fill_fn must be picklable with the 'spawn' start method (a
    module-level function). One iteration per loader. dumpable=False
    makes this process non-dumpable (PR_SET_DUMPABLE 0) from the start of
    the iteration for the rest of its life, so that a worker of the same
    uid, or a process it started that outlives close(), cannot open the
    chunks it was not sent through /proc/<owner>/fd (no core dumps from
    then on, and /proc/<owner>/ files are root's; docs/python.md).
    """

    def __init__(self, pool: Pool, fill_fn: Callable[[Any, Buffer], Any],
                 tasks: Union[int, Iterable[Any]], batch_bytes: int, *,
                 num_workers: int = 2, max_lent_per_worker: int = 2,
                 ordered: bool = True,
                 transform: Optional[Callable[[Buffer], T]] = None,
                 start_method: Optional[str] = None,
                 timeout: Optional[float] = None,
                 dumpable: bool = True) -> None:
        if not isinstance(pool, Pool):
            raise TypeError(f"pool must be a pinpool.Pool, not "
                            f"{type(pool).__name__}")
        if "shared=1" not in pool.config.split(","):
            raise ValueError("SharedLoader needs a pool created with "
                             "'shared=1'")
        if not callable(fill_fn):
            raise TypeError("fill_fn must be callable")
        if transform is not None and not callable(transform):
            raise TypeError("transform must be callable or None")
        self._batch_bytes = _positive("batch_bytes", batch_bytes)
        self._nw = _positive("num_workers", num_workers)
        self._k = _positive("max_lent_per_worker", max_lent_per_worker)
        if self._nw * self._k > MAX_LENDS:
            raise ValueError(
                f"num_workers * max_lent_per_worker = {self._nw * self._k} "
                f"lends at once: more than the {MAX_LENDS} a chunk can lend "
                "at a time (docs/sharing.md, \"Limits\")")
        _check_footprint(pool, self._batch_bytes, self._nw * self._k)
        if timeout is not None:
            # Checked here, not where it is used: a timeout poll() cannot
            # take (inf, > 24.8 days) made close() raise OverflowError
            # once it had to wait for a worker (rvpy39 D3).
            if (isinstance(timeout, bool)
                    or not isinstance(timeout, (int, float))):
                raise TypeError(f"timeout must be a number of seconds or "
                                f"None, not {type(timeout).__name__}")
            if not 0 < timeout <= MAX_TIMEOUT:  # NaN and inf too
                raise ValueError(f"timeout must be > 0 and at most "
                                 f"{MAX_TIMEOUT} s (poll's limit), or None, "
                                 f"not {timeout!r}")
        try:
            self._ctx: Any = multiprocessing.get_context(start_method)
        except ValueError as e:
            raise ValueError(f"start_method: {e}") from None
        self._tasks = _tasks(tasks)  # last check: it may consume nothing
        self._pool = pool
        self._fill = fill_fn
        self._ordered = bool(ordered)
        self._transform = transform
        self._timeout = timeout
        if not isinstance(dumpable, bool):
            raise TypeError(f"dumpable must be a bool, not "
                            f"{type(dumpable).__name__}")
        self._dumpable = dumpable
        self._procs: List[Any] = []
        # Each worker's pidfd (-1: it was gone before its pidfd opened):
        # whether it has exited, its kill and its lends, by process and
        # never by pid number (a forkserver reaps a worker at once, and its
        # pid can name a stranger before the loader notices).
        self._pidfds: List[int] = []
        self._owner = 0  # the pid that started the workers
        self._socks: List[socket.socket] = []
        self._inbox: List[_Inbox] = []
        self._started = False
        self._closed = False
        self._stopping = False  # close() sent the stop messages
        self._grace_end = 0.0  # and gives the workers until then
        self._held: Dict[int, Buffer] = {}  # filled, not yet yielded (order)
        # Lent and sent, not back yet: seq -> (worker, Buffer).
        self._inflight: Dict[int, Tuple[int, Buffer]] = {}
        # Lent to a worker that may or may not have it (its send failed):
        # kept lent until close() has stopped the worker.
        self._quarantine: List[Buffer] = []

    # -- life cycle ------------------------------------------------------
    def _start(self) -> None:
        self._started = True
        self._owner = os.getpid()
        _reap_unreaped()
        if not self._dumpable:  # before any worker starts
            _hold_nondumpable()
        fork = self._ctx.get_start_method() == "fork"
        forkserver = self._ctx.get_start_method() == "forkserver"
        for w in range(self._nw):
            ours, theirs = socket.socketpair(socket.AF_UNIX,
                                             socket.SOCK_STREAM)
            # A forked child inherits the owner's ends (its own and the
            # earlier workers'): it closes them, so that EOF means EOF.
            others = ([s.fileno() for s in self._socks] + [ours.fileno()]
                      if fork else [])
            p = self._ctx.Process(
                target=_worker_main, name=f"pinpool-loader-{w}",
                args=(w, self._fill, theirs, others), daemon=True)
            try:
                p.start()
            finally:
                theirs.close()
            ours.setblocking(False)  # the owner never blocks on a worker
            _fds.refuse_rights(ours)  # a worker sends the owner none
            self._socks.append(ours)
            self._inbox.append(_Inbox(ours))
            self._procs.append(p)
            self._pidfds.append(-1)
            # Before the next start (whose multiprocessing clean-up reaps
            # the children that exited): the pid is still this worker's.
            self._pidfds[-1] = _open_pidfd(p, forkserver)

    @property
    def worker_pids(self) -> List[int]:
        """The workers' pids (empty before the iteration starts)."""
        return [p.pid for p in self._procs]

    def close(self) -> None:
        """Stop and join the workers, then reclaim (and free) every block
        still lent to them, and free those filled but not yielded.
        Idempotent; raises nothing for workers that died. Resumable: if it
        is interrupted (KeyboardInterrupt in the grace, a fault), calling
        it again finishes it; it counts as closed only once it has
        finished (before, it did from its first line, and an interrupted
        close() left workers alive and their lends live for good: rvpy39
        D3)."""
        if self._closed:
            return
        if not self._started:
            self._closed = True
            return
        if os.getpid() != self._owner:
            self._close_copies()
            self._closed = True
            return
        if not self._stopping:  # once: a second stop message is junk
            self._stopping = True
            for s in self._socks:
                try:
                    s.setblocking(True)
                    s.settimeout(1.0)
                    _send_msg(s, None, [])
                except (OSError, ValueError):
                    pass  # dead, or its socket full: it is killed below
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
            self._grace_end = time.monotonic() + 2.0
        for w in range(len(self._procs)):
            # A worker already finished (an earlier, interrupted close)
            # answers at once: its pidfd is readable.
            self._finish(w, max(0.0, self._grace_end - time.monotonic()))
        # Every worker has exited (or outlived SIGKILL and the timeout: its
        # lends stay): no live process can write what was lent to it
        # (reclaim ends only lends to exited processes).
        _step("reclaim")
        for p in self._procs:
            _share.lend_reclaim(self._pool, p.pid, free=True)
        self._inflight.clear()
        self._quarantine.clear()
        while self._held:
            self._held.popitem()[1].close()
        self._close_descriptors()
        self._closed = True
        # Not made dumpable again (_hold_nondumpable): a worker's
        # descendant may outlive this close.

    def _close_copies(self) -> None:
        """close() in another process than the loader's (a child the owner
        forked, ending normally, unwinds the loop): only this process's
        copies are closed. No stop message, no shutdown(): the sockets are
        shared with the owner, whose workers would stop (issue 36, third
        review, item 6); nothing reclaimed or freed: the lends and blocks
        are the owner's."""
        self._inflight.clear()
        self._quarantine.clear()
        self._held.clear()
        self._close_descriptors()
        self._procs = []

    def _close_descriptors(self) -> None:
        """This process's channel sockets and worker pidfds closed (the
        teardown close() and _close_copies() share)."""
        for s in self._socks:
            s.close()
        for i, f in enumerate(self._pidfds):
            if f >= 0:  # forgotten first: an interrupted close() resumed
                self._pidfds[i] = -1  # never closes a number twice
                os.close(f)

    def _exited(self, w: int, timeout: Optional[float] = 0) -> bool:
        """Worker w has exited (its pidfd readable within timeout seconds;
        None: no limit)."""
        fd = self._pidfds[w]
        return fd < 0 or bool(_wait_readable([fd], timeout))

    def _finish(self, w: int, grace: float) -> bool:
        """Give worker w grace seconds to exit, then SIGKILL it (by pidfd)
        and wait for its exit at most the loader's timeout; reap it without
        blocking. True once it has exited."""
        if not self._exited(w, grace):
            try:
                signal.pidfd_send_signal(self._pidfds[w], signal.SIGKILL)
            except ProcessLookupError:
                pass
            if not self._exited(w, self._timeout):
                return False  # in the kernel past SIGKILL: left running
        p = self._procs[w]
        p.join(0)
        if p.exitcode is None:
            _reap_later(p)  # exited, but reaped only by its tracer
        return True

    def __enter__(self) -> "SharedLoader[T]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: best effort
            pass

    # -- iteration ---------------------------------------------------------
    def _send(self, w: int, seq: int, task: Any) -> None:
        _step("alloc")
        buf = self._pool.alloc(self._batch_bytes)
        try:
            _step("lend")
            # Lent to the process the worker's pidfd names, never to a pid
            # number: a forkserver reaps a dead worker at once, and its pid
            # can name a stranger before the loader notices (issue 36,
            # third review, item 5). A worker that has exited (its pidfd
            # says so, or pinpool_lend_pidfd does) is a WorkerError, as
            # any dead worker (item 9), after its lends are reclaimed.
            if self._exited(w):
                raise ProcessLookupError("the worker has exited")
            _share.lend(buf, self._procs[w].pid, self._pidfds[w])
        except ProcessLookupError:
            buf.close()  # not lent: nobody else has it
            self._worker_gone(w)  # raises WorkerError
            raise
        except BaseException:
            buf.close()  # not lent: nobody else has it
            raise
        try:
            handle, nbytes, fd, ctl = _share.lend_message(buf)
            _step("pickle")
            deadline = (None if self._timeout is None
                        else time.monotonic() + self._timeout)
            _send_nowait(self._socks[w], (seq, task, handle, nbytes),
                         [fd, ctl], deadline, self._idle, f"task #{seq}")
        except BaseException:
            # The worker may have some of it (a part-sent message, or its
            # descriptors): the block stays lent to it, to be reclaimed
            # once it has exited; no other lend is touched.
            self._quarantine.append(buf)
            raise
        self._inflight[seq] = (w, buf)

    def _idle(self, sock: socket.socket, wait: Optional[float]) -> None:
        """A send waits for sock to drain: the answers that come meanwhile
        are read (kept whole in their inboxes), so that a worker blocked on
        writing its answer is not waiting on the owner blocked on writing
        its next task. At most 0.05 s a call: a dead worker shows up."""
        wait = 0.05 if wait is None else min(wait, 0.05)
        pl = select.poll()  # not select(): any descriptor number
        for s in self._socks:
            pl.register(s, select.POLLIN | (select.POLLOUT if s is sock
                                             else 0))
        try:
            ev = pl.poll(max(0, int(wait * 1000)))
        except InterruptedError:
            return
        for fd, e in ev:
            if e & (select.POLLIN | select.POLLHUP | select.POLLERR):
                for i, s in enumerate(self._socks):
                    if s.fileno() == fd:
                        self._inbox[i].pump()
        w = self._socks.index(sock)
        if self._exited(w) or self._inbox[w].eof:
            raise WorkerError(f"SharedLoader worker {w} (pid "
                              f"{self._procs[w].pid}) is gone: its task "
                              "could not be sent")

    def _dead_worker(self) -> Optional[Tuple[int, Any]]:
        for w, p in enumerate(self._procs):
            if self._exited(w):
                return w, p
        return None

    def __iter__(self) -> Iterator[Union[Buffer, T]]:
        if self._started or self._closed:
            raise RuntimeError("a SharedLoader can be iterated once")
        try:
            self._start()  # may fail (a fill_fn spawn cannot pickle)
            yield from self._run()
        finally:
            self.close()

    def _deliver(self, buf: Buffer) -> Union[Buffer, T]:
        return self._transform(buf) if self._transform else buf

    def _run(self) -> Iterator[Union[Buffer, T]]:
        lent = [0] * self._nw  # lent, or filled and held back (ordered)
        held_by: Dict[int, int] = {}  # held back: seq -> its worker
        seqs = itertools.count()
        next_yield = 0
        sent = 0
        done = 0
        exhausted = False
        while True:
            # Back-pressure: top every worker up to k lent blocks.
            progress = True
            while not exhausted and progress:
                progress = False
                for w in range(self._nw):
                    if lent[w] >= self._k:
                        continue
                    try:
                        task = next(self._tasks)
                    except StopIteration:
                        exhausted = True
                        break
                    self._send(w, next(seqs), task)
                    lent[w] += 1
                    sent += 1
                    progress = True
            if exhausted and done == sent:
                return
            w, msg = self._receive()
            buf = self._take(w, msg)
            seq = msg[1]
            done += 1
            if not self._ordered:
                lent[w] -= 1
                yield self._deliver(buf)
                continue
            # A block held back for the order still counts against the
            # worker that filled it until it is yielded (torch's DataLoader
            # likewise sends a task only when it hands a batch out): else a
            # fast worker is sent more while a slow one holds up the order,
            # and the pool grows (W9, 64 MiB, 4 workers: 648-822 MiB held
            # against 512 unordered).
            self._held[seq] = buf
            held_by[seq] = w
            while next_yield in self._held:
                b = self._held.pop(next_yield)
                lent[held_by.pop(next_yield)] -= 1
                next_yield += 1
                yield self._deliver(b)

    def _take(self, w: int, msg: Tuple[Any, ...]) -> Buffer:
        """The block of a worker's answer, its lend ended; raises
        WorkerError for an error or a return the pool refuses."""
        kind, seq, handle = msg[0], msg[1], msg[2]
        pid = self._procs[w].pid
        entry = self._inflight.get(seq) if isinstance(seq, int) else None
        if entry is None or entry[0] != w:
            if handle is not None:  # a return refused: counted as the C ones
                self._pool._lend_refused()  # type: ignore[attr-defined]
            raise WorkerError(f"SharedLoader worker {w} (pid {pid}) answered "
                              f"task #{seq}, which it was not sent")
        buf: Optional[Buffer] = None
        if handle is not None:
            try:
                _step("return")
                # The answer must name task #seq's lend, and come from the
                # worker it was lent to: checked before any lend ends.
                buf = _share._end_lend(handle, pid, entry[1],
                                       known_peer=True)
            except Exception as e:
                raise WorkerError(
                    f"SharedLoader worker {w} (pid {pid}) handed back a "
                    f"block the pool refused: {e}") from e
            if buf is not entry[1]:
                raise WorkerError(
                    f"SharedLoader worker {w} (pid {pid}) handed back another "
                    f"block than task #{seq}'s")
        del self._inflight[seq]
        if kind == "ok" and buf is not None:
            return buf
        if buf is not None:
            buf.close()
        else:  # still attached in the worker: lent until it has exited
            self._quarantine.append(entry[1])
        tb = msg[3] if len(msg) > 3 else ""
        raise WorkerError(
            f"SharedLoader worker {w} (pid {pid}) raised on task #{seq}:\n"
            f"{tb}")

    def _receive(self) -> Tuple[int, Tuple[Any, ...]]:
        deadline = (None if self._timeout is None
                    else time.monotonic() + self._timeout)
        while True:
            for w, box in enumerate(self._inbox):
                msg = box.take()
                if msg is not None:
                    return w, msg
            for w, box in enumerate(self._inbox):
                if box.eof:
                    self._worker_gone(w)
            dead = self._dead_worker()
            if dead is not None:
                # Its last messages may still be in its channel.
                box = self._inbox[dead[0]]
                box.pump()
                msg = box.take()
                if msg is not None:
                    return dead[0], msg
                self._worker_gone(dead[0])
            wait = 0.05
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError(
                        f"SharedLoader: no batch in {self._timeout} s")
            ready = _wait_readable([s.fileno() for s in self._socks], wait)
            for i, s in enumerate(self._socks):
                if s.fileno() in ready:
                    self._inbox[i].pump()

    def _worker_gone(self, w: int) -> None:
        p = self._procs[w]
        # EOF comes while it exits; one that closed its channel and lives
        # on is killed.
        if not self._finish(w, 2.0):
            raise WorkerError(
                f"SharedLoader worker {w} (pid {p.pid}) closed its channel "
                "and outlived SIGKILL past the timeout: its lent blocks stay "
                "lent")
        _step("reclaim")
        n = _share.lend_reclaim(self._pool, p.pid, free=True)
        for seq in [q for q, (v, _) in self._inflight.items() if v == w]:
            del self._inflight[seq]
        code = p.exitcode
        how = ("exited (not reaped: another process traces it)"
               if code is None else f"was killed by signal {-code}"
               if code < 0 else f"exited with status {code}")
        raise WorkerError(
            f"SharedLoader worker {w} (pid {p.pid}) {how}; its "
            f"{n} lent block(s) were reclaimed")
