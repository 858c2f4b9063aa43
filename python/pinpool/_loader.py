"""pinpool.SharedLoader: batches filled by worker processes straight into
the consumer's pinned memory (docs/python.md, "The loader").

The main process allocates each batch's block from a shared=1 pool, lends
it to one worker (Buffer.lend(worker.pid)) and sends it with the task; the
worker attaches it, calls fill_fn(task, buf), detaches and sends it back;
the main process ends the lend and yields its own Buffer. No byte is
copied on the host between the fill and the pinned block.

Messages are pickled by the sending thread itself (ForkingPickler.dumps),
not by the queues' feeder threads: an error while pickling (a Buffer sent
back with a live view) must reach the code that caused it, and a feeder
thread would only print it.
"""

import itertools
import multiprocessing
import queue
import signal
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import (Any, Callable, Dict, Generic, Iterable, Iterator, List,
                    Optional, Tuple, TypeVar, Union)

from pinpool._core import Buffer, Pool
from pinpool import _share

T = TypeVar("T")


def _dumps(obj: Any) -> bytes:
    # ForkingPickler.dumps gives a memoryview, which a Queue cannot pickle.
    return bytes(ForkingPickler.dumps(obj))


class WorkerError(RuntimeError):
    """A SharedLoader worker raised (the message has its traceback) or
    died (its lent blocks were reclaimed)."""


def _worker_main(wid: int, fill_fn: Callable[[Any, Buffer], Any],
                 inq: Any, outq: Any, stop: Any) -> None:
    # The parent handles Ctrl-C and shuts the workers down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        payload = inq.get()
        if payload is None:
            return
        try:
            seq, task, buf = ForkingPickler.loads(payload)
        except BaseException:  # a stale block after a shutdown, say
            if stop.is_set():
                continue
            outq.put(_dumps(
                ("err", wid, -1, traceback.format_exc(), None)))
            return
        if stop.is_set():  # draining: the block is reclaimed anyway
            buf.close()
            continue
        try:
            fill_fn(task, buf)
            msg = _dumps(("ok", wid, seq, buf))
        except BaseException:
            tb = traceback.format_exc()
            try:
                msg = _dumps(("err", wid, seq, tb, buf))
            except BaseException:  # a live view: the block stays lent
                buf.close()
                msg = _dumps(("err", wid, seq, tb, None))
        outq.put(msg)


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


class SharedLoader(Generic[T]):
    """SharedLoader(pool, fill_fn, tasks, batch_bytes, *, num_workers=2,
    max_lent_per_worker=2, ordered=True, transform=None,
    start_method=None, timeout=None)

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
    reclaimed and freed. Either way the loader is closed. timeout
    (seconds, None: forever): the longest wait for one batch
    (TimeoutError). close() (or leaving a `with` block, or the end of the
    iteration) stops the workers, joins them and reclaims every block still
    lent. fill_fn must be picklable with the 'spawn' start method (a
    module-level function). One iteration per loader.
    """

    def __init__(self, pool: Pool, fill_fn: Callable[[Any, Buffer], Any],
                 tasks: Union[int, Iterable[Any]], batch_bytes: int, *,
                 num_workers: int = 2, max_lent_per_worker: int = 2,
                 ordered: bool = True,
                 transform: Optional[Callable[[Buffer], T]] = None,
                 start_method: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
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
        if timeout is not None and not (isinstance(timeout, (int, float))
                                        and timeout > 0):
            raise ValueError(f"timeout must be > 0 or None, not {timeout!r}")
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
        self._procs: List[Any] = []
        self._inqs: List[Any] = []
        self._outq: Any = None
        self._stop: Any = None
        self._started = False
        self._closed = False
        self._held: Dict[int, Buffer] = {}  # filled, not yet yielded (order)

    # -- life cycle ------------------------------------------------------
    def _start(self) -> None:
        self._started = True
        self._outq = self._ctx.Queue()
        self._stop = self._ctx.Event()
        for w in range(self._nw):
            q = self._ctx.Queue()
            p = self._ctx.Process(
                target=_worker_main, name=f"pinpool-loader-{w}",
                args=(w, self._fill, q, self._outq, self._stop), daemon=True)
            p.start()
            self._inqs.append(q)
            self._procs.append(p)

    @property
    def worker_pids(self) -> List[int]:
        """The workers' pids (empty before the iteration starts)."""
        return [p.pid for p in self._procs]

    def close(self) -> None:
        """Stop and join the workers and reclaim (and free) every block
        still lent or filled but not yielded. Idempotent; raises nothing
        for workers that died."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        self._stop.set()
        for q in self._inqs:
            q.put(None)
        for p in self._procs:
            p.join(timeout=2.0)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join()
        for p in self._procs:
            _share.lend_reclaim(self._pool, p.pid, free=True)
        for b in self._held.values():
            b.close()
        self._held.clear()
        for q, p in zip(self._inqs, self._procs):
            if p.exitcode != 0:  # killed: its pipe may never be read
                q.cancel_join_thread()
            q.close()
            q.join_thread()
        self._outq.close()

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
        buf = self._pool.alloc(self._batch_bytes)
        try:
            buf.lend(self._procs[w].pid)
            payload = _dumps((seq, task, buf))
        except BaseException:
            if buf.lent_to is not None:
                _share.lend_reclaim(self._pool, self._procs[w].pid)
            buf.close()
            raise
        self._inqs[w].put(payload)

    def _dead_worker(self) -> Optional[Tuple[int, Any]]:
        for w, p in enumerate(self._procs):
            if p.exitcode is not None:
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
            msg = self._receive()
            kind, w, seq = msg[0], msg[1], msg[2]
            if kind == "err":
                tb, buf = msg[3], msg[4]
                if buf is not None:
                    buf.close()
                raise WorkerError(
                    f"SharedLoader worker {w} (pid {self._procs[w].pid}) "
                    f"raised on task #{seq}:\n{tb}")
            buf = msg[3]
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

    def _receive(self) -> Tuple[Any, ...]:
        waited = 0.0
        while True:
            try:
                payload = self._outq.get(timeout=0.05)
            except queue.Empty:
                dead = self._dead_worker()
                if dead is not None:
                    w, p = dead
                    n = _share.lend_reclaim(self._pool, p.pid, free=True)
                    code = p.exitcode
                    how = (f"was killed by signal {-code}" if code < 0
                           else f"exited with status {code}")
                    raise WorkerError(
                        f"SharedLoader worker {w} (pid {p.pid}) {how}; its "
                        f"{n} lent block(s) were reclaimed")
                waited += 0.05
                if self._timeout is not None and waited >= self._timeout:
                    raise TimeoutError(
                        f"SharedLoader: no batch in {self._timeout} s")
                continue
            msg: Tuple[Any, ...] = ForkingPickler.loads(payload)
            return msg

