"""Shared pools from Python at run time: the windows an outside review
(issue 36, rvpy39) found between a check and its action, or between a C
call and the Python bookkeeping after it, each held open here on purpose
(a hook in the window, an exception injected right after a C call, an
injected failure), never by a race loop; and the bad inputs it found
(docs/verification.md, "Issue 36, rvpy39").

An exception "right after a C call" is what a signal handler's does
(KeyboardInterrupt: CPython runs pending handlers as soon as a C call
returns); sys.setprofile's "c_return" event raises it at exactly that
point, deterministically.
"""

import gc
import json
import math
import os
import pickle
import sys
import threading
from multiprocessing import resource_sharer

import pytest

import pinpool
from conftest import run_in_fork, skip_fork_under_tsan
from pinpool import _loader, _share

TIMEOUT = 20


@pytest.fixture
def spool(hostile_spool):
    return hostile_spool


def c_lends(pool):
    snap = json.loads(pool.snapshot(history=False, symbols=False))
    return sorted(lend["generation"] for lend in snap["lends"])


def tables_agree(pool):
    py, c = _share.lent_generations(pool), c_lends(pool)
    assert py == c, f"Python's lends {py} are not the C library's {c}"


class _InterruptAfter:
    """A profile function that raises KeyboardInterrupt when the C
    function `name` returns (its result discarded), `times` times."""

    def __init__(self, name, times=1):
        self.name, self.left, self.fired = name, times, 0

    def __call__(self, frame, event, arg):
        if (event == "c_return" and self.left > 0 and
                getattr(arg, "__name__", "") == self.name):
            self.left -= 1
            self.fired += 1
            raise KeyboardInterrupt(f"injected after {self.name}")

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


def _reclaim_all(pool):
    """Clean-up after a failed assertion: no lend left for the fixture."""
    try:
        pool.lend_reclaim(live=True)
    except Exception:  # noqa: BLE001 best effort
        pass


# -- D1: a view taken between the export check and the close ----------------

@skip_fork_under_tsan
def test_worker_send_back_refused_for_a_view_taken_in_the_window(spool):
    buf = spool.alloc(4096)
    pb = pickle.dumps(buf)  # a self-lend: a forked child may take it back

    def worker():
        b = pickle.loads(pb)
        real = _share._lock
        views = []

        class Hook:  # the first lock reduce_buffer takes: after its check
            def __enter__(self):
                if not views:
                    views.append(memoryview(b))  # "another thread"'s view
                return real.__enter__()

            def __exit__(self, *exc):
                return real.__exit__(*exc)

        _share._lock = Hook()
        try:
            try:
                pickle.dumps(b)
                outcome = "sent"
            except BufferError as e:
                outcome = "refused: " + str(e)
        finally:
            _share._lock = real
        exports, closed = b.exports, b.closed
        for v in views:
            v.release()
        back = None if b.closed else pickle.dumps(b)
        return outcome, exports, closed, back

    try:
        code, res = run_in_fork(worker)
        assert code == 0
        outcome, exports, closed, back = res
        assert outcome.startswith("refused") and "1 live export" in outcome, (
            f"the send back went ahead with a live view ({outcome}; the "
            f"view's exports {exports}, closed {closed}): the view writes "
            "into the owner's reused block")
        assert not closed and back is not None
        assert pickle.loads(back) is buf
        assert buf.lent_to is None
    finally:
        _reclaim_all(spool)
        gc.collect()
    buf.close()
    assert spool.stats()["lend_refusals"] == 0


def _take_view_in_the_loader_window(task, buf):
    """fill_fn: a profile hook takes a view of buf at the loader's next C
    call on it after fill_fn returns (as another thread of fill_fn's
    could), i.e. between its check for live views and its close."""
    views = []

    def prof(frame, event, arg):
        if (event == "c_call" and not views and
                getattr(arg, "__name__", "") in ("_attached_handle",
                                                  "_close_unexported")):
            sys.setprofile(None)
            views.append(memoryview(buf))
    sys.setprofile(prof)
    _take_view_in_the_loader_window.views = views  # kept alive


@skip_fork_under_tsan
def test_loader_worker_keeps_a_block_with_a_view_taken_in_the_window(spool):
    loader = pinpool.SharedLoader(spool, _take_view_in_the_loader_window, 1,
                                  4096, num_workers=1, start_method="fork",
                                  timeout=TIMEOUT)
    got = []
    with pytest.raises(pinpool.WorkerError, match="live export"):
        for b in loader:
            got.append(b)
    for b in got:
        b.close()
    assert not got, "a batch came back while the worker's view was alive"
    loader.close()


# -- D2: an exception right after the C call that ends lends --------------

def test_reclaim_interrupted_after_the_c_call_keeps_the_tables(spool):
    bufs = [spool.alloc(4096) for _ in range(3)]
    for b in bufs:
        b.lend(os.getpid())
    try:
        with _InterruptAfter("_lend_reclaim") as hook:
            with pytest.raises(KeyboardInterrupt):
                spool.lend_reclaim(live=True)
        assert hook.fired == 1
        assert c_lends(spool) == [], "the C call ended the lends"
        tables_agree(spool)
        assert [b.lent_to for b in bufs] == [None] * 3
    finally:
        _reclaim_all(spool)
    for b in bufs:
        b.close()  # before: BufferError, lent to this process
    assert spool.stats()["blocks"]["current"] == 0


def _return_pickle(buf):
    """The bytes a worker (a forked child) sends back for buf's
    self-lend pickle; its proof is queued on the owner's return socket."""
    pb = pickle.dumps(buf)
    code, back = run_in_fork(lambda: pickle.dumps(pickle.loads(pb)))
    assert code == 0
    return back


@skip_fork_under_tsan
def test_return_interrupted_after_the_c_call_keeps_the_outcome(spool):
    buf = spool.alloc(4096)
    try:
        back = _return_pickle(buf)
        with _InterruptAfter("_lend_return") as hook:
            with pytest.raises(KeyboardInterrupt):
                pickle.loads(back)  # the drain reads the proof, ends the lend
        assert hook.fired == 1
        tables_agree(spool)
        assert buf.lent_to is None
        # The honest pickle, loaded again, is the owner's Buffer: before,
        # the lend had ended with its Buffer in no table (StaleHandleError,
        # counted in lend_refusals).
        assert pickle.loads(back) is buf
        assert spool.stats()["lend_refusals"] == 0
    finally:
        _reclaim_all(spool)
    buf.close()


# -- D3: SharedLoader.close() interrupted, and timeouts poll cannot take --

def fill_index(task, buf):
    with memoryview(buf) as m:
        m[:8] = int(task).to_bytes(8, "little")


@pytest.mark.parametrize("timeout, exc", [
    (math.inf, ValueError), (math.nan, ValueError), (-1, ValueError),
    (0, ValueError), (_loader.MAX_TIMEOUT * 1.001, ValueError),
    (True, TypeError), ("1", TypeError)])
def test_loader_refuses_a_timeout_poll_cannot_take(spool, timeout, exc):
    with pytest.raises(exc, match="timeout"):
        pinpool.SharedLoader(spool, fill_index, 4, 4096, timeout=timeout)


def test_loader_takes_the_longest_timeout(spool):
    pinpool.SharedLoader(spool, fill_index, 4, 4096,
                         timeout=_loader.MAX_TIMEOUT).close()


@skip_fork_under_tsan
@pytest.mark.parametrize("where", ["grace", "reclaim"])
def test_loader_close_interrupted_is_resumed(spool, where, monkeypatch):
    loader = pinpool.SharedLoader(spool, fill_index, 8, 4096, num_workers=2,
                                  max_lent_per_worker=2, start_method="fork",
                                  timeout=TIMEOUT)
    it = iter(loader)
    first = next(it)  # the others are lent, in flight or filled
    first.close()
    assert spool.stats()["lent_blocks"] > 0
    if where == "grace":
        real = _loader._wait_readable
        calls = []

        def interrupted(fds, timeout):
            calls.append(timeout)
            if len(calls) == 1:
                raise KeyboardInterrupt("injected in close()'s grace")
            return real(fds, timeout)
        monkeypatch.setattr(_loader, "_wait_readable", interrupted)
    else:
        def fault(name):
            if name == "reclaim":
                _loader._fault = None
                raise KeyboardInterrupt("injected before the reclaim")
        _loader._fault = fault
    with pytest.raises(KeyboardInterrupt):
        loader.close()
    pids = loader.worker_pids
    loader.close()  # resumed: before, a no-op
    assert spool.stats()["lent_blocks"] == 0
    tables_agree(spool)
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # exited and reaped
    loader.close()  # and idempotent
    del it


# -- D4: a pickle failing after the self-lend -------------------------------

@pytest.mark.parametrize("which", [1, 2])
def test_failing_pickle_leaves_no_self_lend(spool, monkeypatch, which):
    buf = spool.alloc(4096)
    real = _share.reduction.DupFd
    calls = []

    def dupfd(fd):
        calls.append(fd)
        if len(calls) == which:
            raise OSError(24, "Too many open files (injected)")
        return real(fd)
    monkeypatch.setattr(_share.reduction, "DupFd", dupfd)
    try:
        with pytest.raises(OSError, match="injected"):
            pickle.dumps(buf)
        assert buf.lent_to is None, "the failed pickle left the self-lend"
        assert spool.stats()["lent_blocks"] == 0
        tables_agree(spool)
    finally:
        _reclaim_all(spool)
        # [2]: the first DupFd registered a duplicate of the chunk's
        # descriptor with multiprocessing's resource sharer, which keeps it
        # until a receiver connects (as for any pickle never loaded): gone
        # with the sharer's registrations, so that no later test sees the
        # chunk's memfd open.
        resource_sharer.stop()
    buf.close()


# -- D5: bad inputs and messages ---------------------------------------------

def test_lend_reclaim_pid_out_of_range(spool):
    b = spool.alloc(64)
    b.lend(os.getpid())
    for pid in (2**31, 2**63, 2**64):
        with pytest.raises(ValueError, match="pid"):
            spool.lend_reclaim(pid)
    assert b.lent_to == os.getpid()  # nothing changed
    assert spool.lend_reclaim(live=True) == 1
    b.close()


def test_lend_to_a_thread_id_says_so(spool):
    tid, ready, done = [], threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()),
                                         ready.set(), done.wait(TIMEOUT)))
    t.start()
    try:
        assert ready.wait(TIMEOUT)
        b = spool.alloc(64)
        with pytest.raises(ValueError, match="is a thread, not a process"):
            b.lend(tid[0])
        assert b.lent_to is None and spool.stats()["lent_blocks"] == 0
        b.close()
    finally:
        done.set()
        t.join()


def test_attach_nbytes_out_of_range(spool):
    b = spool.alloc(64)
    b.lend(os.getpid())
    handle, _, fd, ctl = _share.lend_message(b)
    for n in (2**63, 2**64, -2**63 - 1):
        with pytest.raises(ValueError, match="nbytes"):
            _share.attach(handle, n, fd, ctl)
    with pytest.raises(TypeError, match="nbytes"):
        _share.attach(handle, True, fd, ctl)
    assert spool.lend_reclaim(live=True) == 1
    b.close()


@skip_fork_under_tsan
def test_copies_of_a_return_are_stale_and_never_counted(spool):
    # The normal path: the first copy is the Buffer, the second stale.
    a = spool.alloc(64)
    back = _return_pickle(a)
    assert pickle.loads(back) is a
    with pytest.raises(pinpool.StaleHandleError, match="not counted"):
        pickle.loads(back)
    assert spool.stats()["lend_refusals"] == 0  # before: 1
    # After lend_collect(): the same rule.
    b = spool.alloc(64)
    back2 = _return_pickle(b)
    assert spool.lend_collect(grace=0) == [b]
    assert pickle.loads(back2) is b
    with pytest.raises(pinpool.StaleHandleError, match="not counted"):
        pickle.loads(back2)
    assert spool.stats()["lend_refusals"] == 0
    a.close()
    b.close()


@skip_fork_under_tsan
def test_return_after_its_pool_is_destroyed_is_stale():
    other = pinpool.Pool("shared=1")
    b = other.alloc(64)
    back = _return_pickle(b)
    got = other.lend_collect(grace=0)
    assert got == [b]
    for x in got:
        x.close()
    del b, got, x, other
    gc.collect()
    with pytest.raises(pinpool.StaleHandleError, match="destroyed"):
        pickle.loads(back)  # before: ValueError, "owner (pid N) ... (pid N)"
