"""Shared pools against buggy or hostile workers, from Python (issue 36,
docs/sharing.md "Threat model"; tests/test_share_hostile.c does the C
side): returns bound to the worker a block was lent to; the owner's table
of lends kept equal to the C library's at every step of the loader's send
and receive paths, with faults injected at each; a task that cannot be
sent touches no other lend and its own stays lent until its worker has
exited; limits checked before anything starts; the memory given back
when the loader and the pool close.

Worker functions are module-level: 'spawn' pickles them by name.
"""

import gc
import json
import math
import multiprocessing as mp
import os
import pickle
import socket

import pytest

import pinpool
from conftest import (run_in_fork, run_in_new_pid_namespace,
                      skip_fork_under_tsan)
from pinpool import _loader, _share

pytestmark = skip_fork_under_tsan

TIMEOUT = 20


@pytest.fixture
def spool(hostile_spool):
    return hostile_spool


def c_lends(pool):
    """The C library's lends (their generations), from a snapshot."""
    snap = json.loads(pool.snapshot(history=False, symbols=False))
    return sorted(lend["generation"] for lend in snap["lends"])


def tables_agree(pool):
    py, c = _share.lent_generations(pool), c_lends(pool)
    assert py == c, f"Python's lends {py} are not the C library's {c}"


# -- a worker returning what it was not lent ------------------------------

def _take_both_and_return_the_other(inq, outq):
    mine = pickle.loads(inq.get(timeout=TIMEOUT))
    other = pickle.loads(inq.get(timeout=TIMEOUT))  # not lent to us
    with memoryview(mine) as m:
        m[:] = b"\x11" * len(m)
    outq.put(pickle.dumps(other))  # handed back by the wrong worker
    outq.put(pickle.dumps(mine))


def _hold(inq, outq):
    buf = pickle.loads(inq.get(timeout=TIMEOUT))
    with memoryview(buf) as m:
        m[:] = b"\x22" * len(m)
    outq.put("filled")
    inq.get(timeout=TIMEOUT)
    outq.put(pickle.dumps(buf))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_return_from_another_worker_is_refused(spool, method):
    ctx = mp.get_context(method)
    q1, q2, out1, out2 = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    w1 = ctx.Process(target=_take_both_and_return_the_other, args=(q1, out1))
    w2 = ctx.Process(target=_hold, args=(q2, out2))
    w1.start()
    w2.start()
    a, b = spool.alloc(4096), spool.alloc(4096)
    a.lend(w1.pid)
    b.lend(w2.pid)
    pb = pickle.dumps(b)
    q2.put(pb)
    assert out2.get(timeout=TIMEOUT) == "filled"
    q1.put(pickle.dumps(a))
    q1.put(pickle.dumps(b))  # w1 gets b's handle, token and descriptors too
    before = spool.stats()
    with pytest.raises(PermissionError, match="another process"):
        pickle.loads(out1.get(timeout=TIMEOUT))
    after = spool.stats()
    assert after["lend_refusals"] == before["lend_refusals"] + 1
    # a's lend ends as soon as its proof is read (by this drain, if w1 has
    # sent it by now): b's stays w2's.
    assert before["lent_blocks"] == 2
    assert after["lent_blocks"] == 2 - (a.lent_to is None)
    assert b.lent_to == w2.pid
    tables_agree(spool)
    assert pickle.loads(out1.get(timeout=TIMEOUT)) is a  # its own: fine
    q2.put("go")
    assert pickle.loads(out2.get(timeout=TIMEOUT)) is b
    with memoryview(b) as m:
        assert bytes(m) == b"\x22" * 4096  # w1 never had it back
    w1.join(TIMEOUT)
    w2.join(TIMEOUT)
    a.close()
    b.close()


# -- reconciliation: from what the C call says, nothing else ------------------

def _exit_holding(inq, outq):
    bufs = [pickle.loads(inq.get(timeout=TIMEOUT)) for _ in range(3)]
    outq.put(len(bufs))


def test_reclaim_exited_updates_the_table_from_the_c_call(spool, monkeypatch):
    ctx = mp.get_context("spawn")
    inq, outq = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_exit_holding, args=(inq, outq))
    p.start()
    bufs = [spool.alloc(4096) for _ in range(4)]
    for b in bufs[:3]:
        b.lend(p.pid)
        inq.put(pickle.dumps(b))
    bufs[3].lend(os.getpid())  # a live lend: it stays
    assert outq.get(timeout=TIMEOUT) == 3
    p.join(TIMEOUT)
    tables_agree(spool)

    # The owner never maps or reads a control area to find out.
    def no_attach(*a, **k):
        raise AssertionError("the owner attached to learn what ended")
    monkeypatch.setattr(_share, "_attach", no_attach)
    assert spool.lend_reclaim_exited(free=True) == 3
    tables_agree(spool)
    assert [b.closed for b in bufs] == [True, True, True, False]
    assert bufs[3].lent_to == os.getpid()
    assert spool.lend_reclaim(os.getpid()) == 0  # alive: not without live
    assert spool.lend_reclaim(os.getpid(), live=True, free=True) == 1
    tables_agree(spool)


# -- the loader: faults at every step --------------------------------------

def fill_index(task, buf):
    with memoryview(buf) as m:
        m[:8] = task.to_bytes(8, "little")


STEPS = ["alloc", "lend", "pickle", "sendmsg", "recv", "return"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("nth", [1, 4])
def test_loader_faults_keep_tables_equal(spool, step, nth):
    loader = pinpool.SharedLoader(spool, fill_index, 12, 4096, num_workers=2,
                                  max_lent_per_worker=2, start_method="fork")
    seen = {"calls": 0, "checks": 0, "fired": False}

    def fault(name):
        # At every step: the two tables agree, and every lend's block is
        # allocated (no block a worker may write was given back).
        tables_agree(spool)
        seen["checks"] += 1
        st = spool.stats()
        assert st["blocks"]["current"] >= st["lent_blocks"]
        if name == "reclaim":
            # Ending lends only once no worker can write them.
            assert all(not p.is_alive() for p in loader._procs)
            for b in loader._quarantine:
                assert b.lent_to is not None  # kept lent until now
            return
        if name == step:
            seen["calls"] += 1
            if seen["calls"] == nth:
                seen["fired"] = True
                raise RuntimeError(f"injected at {name} #{nth}")

    _loader._fault = fault
    got = []
    with pytest.raises(RuntimeError, match="injected"):
        for b in loader:
            with memoryview(b) as m:
                got.append(int.from_bytes(m[:8], "little"))
            b.close()
    _loader._fault = None
    assert seen["fired"] and seen["checks"] > 0
    assert got == list(range(len(got)))
    assert all(not p.is_alive() for p in loader._procs)
    tables_agree(spool)
    assert spool.stats()["lent_blocks"] == 0


def fill_slow_first(task, buf):
    if task == 0:
        import time
        time.sleep(0.3)
    fill_index(task, buf)


class Unpicklable:
    def __reduce__(self):
        raise TypeError("this task cannot be pickled")


def test_unsendable_task_ends_no_other_lend(spool):
    tasks = [0, 1, Unpicklable(), 3]
    loader = pinpool.SharedLoader(spool, fill_slow_first, tasks, 4096,
                                  num_workers=1, max_lent_per_worker=4,
                                  start_method="fork")
    at_reclaim = {}

    def watch(name):
        if name == "reclaim":
            at_reclaim["lent"] = spool.stats()["lent_blocks"]
            at_reclaim["quarantined"] = [b.lent_to for b in loader._quarantine]
    _loader._fault = watch
    it = iter(loader)
    with pytest.raises(TypeError, match="cannot be pickled"):
        next(it)
    _loader._fault = None
    # The failed task's block stayed lent (to the worker) until the worker
    # was stopped; the two tasks in flight were untouched by the error.
    assert at_reclaim["quarantined"] == [loader.worker_pids[0]]
    assert at_reclaim["lent"] >= 1
    tables_agree(spool)


# -- limits and the memory given back ---------------------------------------

def test_loader_settings_beyond_a_chunks_slots_are_refused(spool):
    with pytest.raises(ValueError, match="140 lends at once"):
        pinpool.SharedLoader(spool, fill_index, 200, 64, num_workers=2,
                             max_lent_per_worker=70)
    loader = pinpool.SharedLoader(spool, fill_index, 200, 64, num_workers=2,
                                  max_lent_per_worker=64)  # 128: fits
    assert sum(1 for b in loader if not b.close()) == 200
    assert spool.stats()["blocks"]["current"] == 0


def _memfds():
    n = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            if "memfd:pinpool" in os.readlink(f"/proc/self/fd/{f}"):
                n += 1
        except OSError:
            pass
    return n


def fill_slowly(task, buf):
    import time
    if task > 0:  # past close()'s wait: the worker is killed mid-fill
        time.sleep(5)
    fill_index(task, buf)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_closing_the_loader_and_pool_gives_the_memory_back(method):
    assert _memfds() == 0
    pool = pinpool.Pool("shared=1,mlock=0")
    loader = pinpool.SharedLoader(pool, fill_slowly, 100, 1 << 20,
                                  num_workers=2, max_lent_per_worker=4,
                                  start_method=method)
    first = next(iter(loader))
    assert _memfds() > 0
    loader.close()  # tasks sent and not read, workers killed mid-fill
    first.close()
    del first, loader
    gc.collect()
    pool.close() if hasattr(pool, "close") else None
    del pool
    gc.collect()
    assert _memfds() == 0, "a chunk's descriptor outlived the pool"


_NO_ADDRESS_SPACE = r'''
import json, os, resource, sys, time
import pinpool
from pinpool import _share

pool = pinpool.Pool("shared=1,mlock=0")
bufs = [pool.alloc(32 << 20) for _ in range(3)]
pid = os.fork()
if pid == 0:
    time.sleep(0.2)
    os._exit(0)
for b in bufs:
    b.lend(pid)
os.waitpid(pid, 0)
with open("/proc/self/status") as f:
    vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) << 10
# No room for another mapping: an owner that attached (mapped a control
# area) to learn which lends ended fails here, after the C library has
# ended them (issue 36, 4: its table then kept them for good).
resource.setrlimit(resource.RLIMIT_AS, (vm, resource.RLIM_INFINITY))
n = pool.lend_reclaim_exited()
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,
                                        resource.RLIM_INFINITY))
snap = json.loads(pool.snapshot(history=False, symbols=False))
c = sorted(l["generation"] for l in snap["lends"])
print(n, _share.lent_generations(pool) == c, [b.lent_to for b in bufs])
'''


def test_reclaim_exited_needs_no_new_mapping(spool):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NO_ADDRESS_SPACE],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PINPOOL_CONF=""))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "3 True [None, None, None]", r.stdout


# -- what the owner accepts from a worker (reviewer's defects, issue 36) ----

def _channel():
    """In a loader worker (fork): its own channel to the owner, found among
    its descriptors as a hostile fill_fn would."""
    import socket
    import stat
    for f in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            if stat.S_ISSOCK(os.fstat(int(f)).st_mode):
                return socket.socket(fileno=os.dup(int(f)))
        except OSError:
            pass
    raise AssertionError("no channel")


def _answer(sock, payload, size=None):
    import struct
    sock.sendall(struct.pack("=II", len(payload) if size is None else size,
                             0) + payload)


class _Runs:
    """Unpickling this runs code: it writes the marker file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('ran')",))


def fill_answers_with_code(task, buf):
    _answer(_channel(), pickle.dumps(("ok", 0, None, "", _Runs(task))))
    import time
    time.sleep(5)


def test_owner_runs_no_code_from_a_worker_answer(spool, tmp_path):
    # A worker's answer is unpickled by the owner: with pickle.loads, any
    # global (exec, os.system) runs in the owner. Only plain data passes.
    mark = str(tmp_path / "ran")
    with pytest.raises(pinpool.WorkerError, match="refused"):
        for b in pinpool.SharedLoader(spool, fill_answers_with_code, [mark],
                                      4096, num_workers=1,
                                      start_method="fork", timeout=TIMEOUT):
            b.close()
    assert not os.path.exists(mark), "the owner ran a worker's code"


def fill_returns_the_victim(task, buf):
    # task: the handle of a lend this worker was never given (its token
    # known, as a child forked after the lend knows it).
    _answer(_channel(), pickle.dumps(("ok", 0, task, "", os.getpid())))
    import time
    time.sleep(5)


def test_loader_answer_with_another_lend_ends_nothing(spool):
    # The answer to task #0 names a lend that is not task #0's (here the
    # owner's self-lend of another Buffer): refused before any lend ends.
    victim = spool.alloc(8192)
    pickle.dumps(victim)  # lent to the owner's pid: a receiver unknown
    handle = _share._current(victim).handle
    with pytest.raises(pinpool.WorkerError, match="not given"):
        for b in pinpool.SharedLoader(spool, fill_returns_the_victim,
                                      [handle], 4096, num_workers=1,
                                      start_method="fork", timeout=TIMEOUT):
            b.close()
    assert victim.lent_to == os.getpid(), "the victim's lend was ended"
    tables_agree(spool)
    assert _share.lent_generations(spool) == [_share._parse(handle).generation]
    spool.lend_reclaim(os.getpid(), live=True)
    victim.close()


def fill_stops_reading(task, buf):
    import time
    time.sleep(TIMEOUT)


class _Alarm(Exception):
    pass


def test_loader_send_to_a_worker_that_stops_reading_times_out(spool):
    # Tasks bigger than the socket's buffer, a worker that never reads: the
    # owner's send gives up at the loader's timeout. (SIGALRM turns a hang
    # of the send into a failure of this test.)
    import signal

    def ring(*_):
        raise _Alarm()
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(TIMEOUT)
    try:
        with pytest.raises(TimeoutError, match="not taken"):
            for b in pinpool.SharedLoader(
                    spool, fill_stops_reading, [b"t" * (4 << 20)] * 3, 4096,
                    num_workers=1, max_lent_per_worker=2,
                    start_method="fork", timeout=1):
                b.close()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def fill_floods(task, buf):
    s = _channel()
    s.sendall(__import__("struct").pack("=II", task, 0))
    chunk = b"\0" * (1 << 20)
    for _ in range(8):
        s.sendall(chunk)
    import time
    time.sleep(TIMEOUT)


@pytest.mark.parametrize("size", [1 << 30, _loader._MAX_ANSWER + 1])
def test_worker_announcing_a_huge_answer_is_refused(spool, size):
    # The owner refuses an answer bigger than the protocol's at its header
    # (it never buffers more than _MAX_ANSWER of one worker's bytes).
    with pytest.raises(pinpool.WorkerError, match="malformed"):
        for b in pinpool.SharedLoader(spool, fill_floods, [size], 4096,
                                      num_workers=1, start_method="fork",
                                      timeout=TIMEOUT):
            b.close()


def test_pump_never_reads_past_one_answer():
    # A worker that streams without pause cannot keep the owner reading:
    # one pump does a bounded number of reads.
    import socket
    a, b = socket.socketpair()
    a.setblocking(False)
    SO_SNDBUFFORCE = 32  # root: past wmem_max, so that 1 MiB is queued
    b.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 8 << 20)
    try:
        _answer(b, b"\0" * (1 << 20), size=_loader._MAX_ANSWER)
        box = _loader._Inbox(a)
        box.pump()
        assert 0 < len(box.buf) <= (_loader._HEADER.size +
                                    _loader._MAX_ANSWER + (1 << 16))
        with pytest.raises(pinpool.WorkerError, match="malformed"):
            box.take()  # zeros are no answer
    finally:
        a.close()
        b.close()


def test_loader_footprint_beyond_memory_is_refused(spool):
    # Checked before anything starts: no worker, no block.
    with pytest.raises(ValueError, match="machine's memory"):
        pinpool.SharedLoader(spool, fill_index, 1, 1 << 40)
    small = pinpool.Pool("shared=1,max_reserved=64M")
    with pytest.raises(ValueError, match="max_reserved"):
        pinpool.SharedLoader(small, fill_index, 1, 24 << 20, num_workers=2,
                             max_lent_per_worker=2)
    loader = pinpool.SharedLoader(small, fill_index, 1, 8 << 20,
                                  num_workers=2, max_lent_per_worker=2)
    assert loader.worker_pids == []
    loader.close()
    assert spool.stats()["blocks"]["current"] == 0


# -- a pickled return proves its sender (issue 36, second round) ---------------

class _Forged:
    """A return pickle made by hand: it unpickles as _share._returned(*args)
    in the owner, whatever the pid it claims."""

    def __init__(self, args):
        self.args = args

    def __reduce__(self):
        return (_share._returned, self.args)


def _forge_returns(buf, claimed_pid):
    """Every return a process holding buf's handle (and token) but not
    the borrower can make, claiming to be claimed_pid: the pickle alone,
    and (where this pinpool has a return socket) with a proof sent from
    this process."""
    handle = buf._attached_handle()
    out = [pickle.dumps(_Forged((handle, claimed_pid)))]
    prove = getattr(_share, "_prove_return", None)
    if prove is not None:
        h = _share._parse(handle)
        addr = _share._homes[(h.nonce, h.generation)]
        out.append(pickle.dumps(_Forged((handle, claimed_pid,
                                         prove(addr, handle)))))
        out.append(pickle.dumps(buf))  # its own honest-looking return
    return out


def _borrower_with_a_grandchild(inq, outq):
    buf = pickle.loads(inq.get(timeout=TIMEOUT))
    with memoryview(buf) as m:
        m[:] = b"\x33" * len(m)
    me = os.getpid()
    # A child forked after the lend: it has the Buffer and its token.
    outq.put(run_in_fork(lambda: _forge_returns(buf, me)))
    assert inq.get(timeout=TIMEOUT) == "go"
    with memoryview(buf) as m:
        m[:] = b"\x44" * len(m)
    outq.put(pickle.dumps(buf))


def _given_the_pickle(inq, outq):
    buf = pickle.loads(inq.get(timeout=TIMEOUT))  # attached: descriptors too
    claimed = inq.get(timeout=TIMEOUT)
    forged = _forge_returns(buf, claimed)
    outq.put(forged)


def _forged_by_a_child_of_the_owner(b, claimed_pid):
    """Returns of b's lend made by a child the owner forks after the lend:
    it has the owner's table (handle and token) and the return socket's
    address in its memory (the child's copy of the socket is closed at
    fork, the address is not forgotten by a hostile child), and claims
    the borrower's pid."""
    addr = getattr(_share, "_address", b"")

    def forge():
        h = _share._current(b).handle
        out = [pickle.dumps(_Forged((h, claimed_pid)))]
        prove = getattr(_share, "_prove_return", None)
        if prove is not None:
            out.append(pickle.dumps(_Forged((h, claimed_pid,
                                             prove(addr, h)))))
        return out

    code, out = run_in_fork(forge)
    assert code == 0, "the owner's child failed"
    return out


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pickled_return_from_a_process_forked_or_given_the_pickle_is_refused(
        spool, method):
    ctx = mp.get_context(method)
    inq, outq, xin, xout = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    w = ctx.Process(target=_borrower_with_a_grandchild, args=(inq, outq))
    x = ctx.Process(target=_given_the_pickle, args=(xin, xout))
    w.start()
    x.start()
    try:
        b = spool.alloc(4096)
        b.lend(w.pid)
        inq.put(pickle.dumps(b))
        xin.put(pickle.dumps(b))  # the same lend's pickle, to another process
        xin.put(w.pid)
        code, forged = outq.get(timeout=TIMEOUT)
        assert code == 0, "the grandchild failed to forge"
        forged += xout.get(timeout=TIMEOUT)
        forged += _forged_by_a_child_of_the_owner(b, w.pid)
        refusals = spool.stats()["lend_refusals"]
        for i, data in enumerate(forged):
            with pytest.raises(PermissionError):
                pickle.loads(data)
            st = spool.stats()
            # A proof is refused (and counted) when a drain reads it, a
            # pickle without one when it is loaded: every forgery counted
            # by the time its pickle is refused, none twice (below).
            assert st["lend_refusals"] >= refusals + i + 1, \
                f"return #{i} refused but not counted"
            assert st["lent_blocks"] == 1 and b.lent_to == w.pid, \
                f"return #{i} ended the borrower's lend"
            tables_agree(spool)
        assert spool.stats()["lend_refusals"] == refusals + len(forged)
        inq.put("go")
        assert pickle.loads(outq.get(timeout=TIMEOUT)) is b  # the borrower
        with memoryview(b) as m:
            assert bytes(m) == b"\x44" * 4096
        assert b.lent_to is None
    finally:
        for p in (w, x):
            p.join(TIMEOUT)
            if p.is_alive():
                p.kill()
    assert w.exitcode == 0 and x.exitcode == 0
    b.close()


def test_python_refusals_are_counted_with_the_c_ones(spool):
    a, b = spool.alloc(64), spool.alloc(64)
    stale = pickle.dumps(a)  # lent to this process
    assert spool.lend_reclaim(live=True) == 1
    before = spool.stats()["lend_refusals"]
    with pytest.raises(pinpool.StaleHandleError):
        pickle.loads(stale)  # refused in Python: the table has no such lend
    assert spool.stats()["lend_refusals"] == before + 1
    pickle.dumps(b)
    handle = _share._current(b).handle
    with pytest.raises(PermissionError):
        _share._end_lend(handle, os.getpid(), a)  # another lend's answer
    assert spool.stats()["lend_refusals"] == before + 2
    with pytest.raises(PermissionError):
        pickle.loads(pickle.dumps(_Forged((handle, os.getpid()))))
    assert spool.stats()["lend_refusals"] == before + 3
    assert b.lent_to == os.getpid()
    assert spool.lend_reclaim(live=True) == 1
    a.close()
    b.close()


def test_close_racing_a_lend_leaves_neither_half_done(spool):
    """Buffer.close and Buffer.lend on one Buffer from two threads (free-
    threaded Python runs them at once): the lend is replayed inside close's
    window between its lend check and the close (pinpool._core's close
    hook). One of the two must refuse; before, both went ahead: the block
    was closed while lent (its free refused, the block allocated for good),
    or, had the free come first, a freed block was lent."""
    from pinpool import _core

    buf = spool.alloc(4096)
    seen = []

    def lend_in_the_window(b):
        try:
            b.lend(os.getpid())
            seen.append("lent")
        except (BufferError, ValueError) as e:
            seen.append(type(e).__name__)

    _core._set_close_hook(lend_in_the_window)
    try:
        try:
            buf.close()
            closed = True
        except BufferError:
            closed = False
    finally:
        _core._set_close_hook(None)
    assert len(seen) == 1
    assert closed != (seen[0] == "lent"), \
        f"close {'went ahead' if closed else 'refused'} and the lend {seen[0]}"
    if seen[0] == "lent":  # the lend won: it ends, then the close works
        assert spool.lend_reclaim(live=True) == 1
        buf.close()
    assert buf.closed and buf.lent_to is None
    assert _share.lent_generations(spool) == []


# -- the return socket and the pickled return path (issue 36, third round) ----

def _return_it(inq, outq):
    """A borrower: attaches, fills, sends its return pickle (the proof is
    queued on the owner's return socket before the pickle leaves), waits
    for "go" before exiting."""
    buf = pickle.loads(inq.get(timeout=TIMEOUT))
    with memoryview(buf) as m:
        m[:] = b"\x55" * len(m)
    outq.put(pickle.dumps(buf))
    assert inq.get(timeout=TIMEOUT) == "go"


class _CountingListener:
    """_share._listener with its accepts counted."""

    def __init__(self, real):
        self.real, self.accepts = real, 0

    def accept(self):
        self.accepts += 1
        return self.real.accept()


def _end_worker(w, socks=()):
    """A test's worker process ended: socks closed, w joined (killed if it
    outlives TIMEOUT)."""
    for s in socks:
        s.close()
    w.join(TIMEOUT)
    if w.is_alive():
        w.kill()


def _lent_to_a_borrower(spool, ctx):
    inq, outq = ctx.Queue(), ctx.Queue()
    w = ctx.Process(target=_return_it, args=(inq, outq))
    w.start()
    b = spool.alloc(4096)
    b.lend(w.pid)
    inq.put(pickle.dumps(b))
    return w, inq, outq, b


@pytest.mark.parametrize("bound", [None, 16])
def test_a_flood_on_the_return_socket_holds_the_owner_for_bounded_work(
        spool, monkeypatch, bound):
    """Connections queued on the owner's return socket ahead of an honest
    proof (any process may connect): one unpickle accepts at most
    _DRAIN_ACCEPTS of them, nothing counted as refused while the proof may
    be unread (BlockingIOError), and the same pickle loaded again gets
    through. Before, one drain accepted until the queue was empty: a
    flood that kept connecting held the owner and _share._lock as long as
    it went on. With the real bound (more than a full backlog, and a
    stranger's connections closed unread) the first unpickle gets
    through; with a bound of 16 it takes several (issue 36, fourth
    review: before, 64, and a flood kept the honest proof unread)."""
    if bound is not None:
        monkeypatch.setattr(_share, "_DRAIN_ACCEPTS", bound)
    ctx = mp.get_context("fork")
    w, inq, outq, b = _lent_to_a_borrower(spool, ctx)
    junk = []
    try:
        addr = _share._address
        bound = _share._DRAIN_ACCEPTS
        n = 5 * 64
        for _ in range(n):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(addr)
            s.send(b"x" * 144)
            junk.append(s)
        back = outq.get(timeout=TIMEOUT)  # its proof queued after the junk
        refusals = spool.stats()["lend_refusals"]
        real = _share._listener
        counting = _CountingListener(real)
        _share._listener = counting
        try:
            tries = 0
            while True:
                counting.accepts = 0
                tries += 1
                try:
                    got = pickle.loads(back)
                    break
                except BlockingIOError:
                    assert b.lent_to == w.pid and \
                        spool.stats()["lend_refusals"] == refusals
                    tables_agree(spool)
                finally:
                    assert counting.accepts <= bound, \
                        f"one unpickle accepted {counting.accepts}"
                assert tries <= n, "the honest return never got through"
        finally:
            _share._listener = real
        assert (tries > 1) == (n >= bound) and got is b and b.lent_to is None
        assert spool.stats()["lend_refusals"] == refusals
        with memoryview(b) as m:
            assert bytes(m) == b"\x55" * 4096
        inq.put("go")
    finally:
        _end_worker(w, junk)
    assert w.exitcode == 0
    b.close()


def _global_call(module, name, args):
    """A pickle that calls module.name(*args) when loaded, made by hand (the
    function need not exist here: pickle resolves it at load)."""
    body = pickle.dumps(args, protocol=2)
    assert body[:2] == b"\x80\x02" and body[-1:] == b"."
    return (b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n"
            + body[2:-1] + b"R.")


def test_no_library_function_named_by_a_pickle_ends_another_s_lend(spool):
    """A pickle names a function and passes values; the owner's
    pickle.loads calls it. Before, a pickle naming pinpool._share._take with
    a borrower's handle and pid ended that lend with no proof at all (a
    process forked after the lend has the handle and token). Now every
    function of pinpool._share and pinpool._loader, called so with the
    handle, the borrower's pid and a made-up proof, leaves the lend live."""
    ctx = mp.get_context("fork")
    # A borrower that holds the block until told: its own proof, read by
    # any drain, would end the lend (rightly) under the calls below.
    inq, outq = ctx.Queue(), ctx.Queue()
    w = ctx.Process(target=_hold, args=(inq, outq))
    w.start()
    b = spool.alloc(4096)
    b.lend(w.pid)
    inq.put(pickle.dumps(b))
    try:
        assert outq.get(timeout=TIMEOUT) == "filled"
        handle = _share._current(b).handle
        arg_sets = [(handle,), (handle, w.pid), (handle, w.pid, b"\0" * 16),
                    (handle, w.pid, True)]
        names = {("pinpool._share", "_take")}
        for mod in (_share, _loader):
            for name in dir(mod):
                obj = getattr(mod, name)
                if callable(obj) and not isinstance(obj, type) and \
                        getattr(obj, "__module__", "") == mod.__name__:
                    names.add((mod.__name__, name))
        # The calls may leave junk in the modules' tables (the loader's
        # children to reap: a handle is no process), which would break
        # the loaders of later tests: restored after.
        unreaped = list(getattr(_loader, "_unreaped", []))
        try:
            for module, name in sorted(names):
                for args in arg_sets:
                    try:
                        pickle.loads(_global_call(module, name, args))
                    except Exception:  # noqa: BLE001 refused, or not there
                        pass
                    assert b.lent_to == w.pid and \
                        spool.stats()["lent_blocks"] == 1, \
                        f"a pickle calling {module}.{name}{len(args)} " \
                        "ended the lend"
        finally:
            if hasattr(_loader, "_unreaped"):
                _loader._unreaped[:] = unreaped
        tables_agree(spool)
        inq.put("go")
        assert pickle.loads(outq.get(timeout=TIMEOUT)) is b  # its own return
    finally:
        _end_worker(w)
    assert w.exitcode == 0
    b.close()


def test_an_honest_return_at_emfile_is_an_oserror_not_a_refusal(spool):
    """The owner at RLIMIT_NOFILE cannot accept the proof's connection.
    Before, the honest return was refused as forged and counted; now the
    owner's EMFILE comes back as OSError, nothing is counted, the lend is
    live, and the same pickle is accepted once descriptors are free."""
    import errno
    import resource

    ctx = mp.get_context("fork")
    w, inq, outq, b = _lent_to_a_borrower(spool, ctx)
    fill = []
    try:
        back = outq.get(timeout=TIMEOUT)
        refusals = spool.stats()["lend_refusals"]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
        try:
            try:
                while True:
                    fill.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as e:
                assert e.errno == errno.EMFILE
            with pytest.raises(OSError) as ei:
                pickle.loads(back)
            assert ei.value.errno == errno.EMFILE
            assert not isinstance(ei.value, PermissionError)
        finally:
            for f in fill:
                os.close(f)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert spool.stats()["lend_refusals"] == refusals
        assert b.lent_to == w.pid
        tables_agree(spool)
        assert pickle.loads(back) is b and b.lent_to is None
        inq.put("go")
    finally:
        _end_worker(w)
    assert w.exitcode == 0
    b.close()


# -- a return known by its sender's pidfd, not its pid (issue 36, D4) --------
_PIDNS_COMMON = r"""
import json, os, pickle, socket, sys
import pinpool
from pinpool import _share

def reaped_pidfd_ok():
    # SO_PEERPIDFD of a peer reaped before it is read (Linux 6.16), and
    # pidfs (6.9): else the pid decides, as before (docs/sharing.md).
    a = b"\0pinpool-test-%d" % os.getpid()
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ls.bind(a)
    ls.listen(1)
    c = os.fork()
    if c == 0:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(a)
        os._exit(0)
    os.waitpid(c, 0)
    conn, _ = ls.accept()
    try:
        fd = conn.getsockopt(socket.SOL_SOCKET, 77)
    except OSError:
        return False
    ok = os.fstatvfs(fd).f_type == 0x50494446 if hasattr(
        os.fstatvfs(fd), "f_type") else True
    os.close(fd)
    return ok

def set_last_pid(pid):
    fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY)
    os.write(fd, str(pid - 1).encode())
    os.close(fd)

def read_all(fd):
    data = b""
    while True:
        d = os.read(fd, 1 << 16)
        if not d:
            return data
        data += d

if not reaped_pidfd_ok():
    print(json.dumps("skip"))
    sys.exit(0)
pool = pinpool.Pool("shared=1,mlock=0")
"""


def _run_pidns(body):
    r = run_in_new_pid_namespace(_PIDNS_COMMON + body)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if out == "skip":
        pytest.skip("no SO_PEERPIDFD of a reaped peer, or no pidfs (Linux "
                    "< 6.16): the pid decides")
    return out


def test_a_pid_reusers_return_is_refused_after_it_has_exited_too():
    """D4 (the second review's reproducer): borrower A forks C while
    attached, and exits without returning, reaped; C forks G with A's pid
    (ns_last_pid); G pickles the Buffer back (its proof sent from pid A)
    and exits, reaped, before the owner reads. Before, the owner took
    SO_PEERCRED's pid, A's number, and pinpool_lend_return accepted it
    (no process had the pid any more). Now the proof's sender is known by
    its pidfd: not A's process, refused, counted, the lend A's until
    reclaim_exited."""
    out = _run_pidns(r"""
buf = pool.alloc(1 << 16)
r, w = os.pipe(); br, bw = os.pipe(); go_r, go_w = os.pipe()
a = os.fork()
if a == 0:
    os.close(w)
    b = pickle.loads(read_all(r))
    a = os.getpid()
    if os.fork() == 0:  # C: A's child, with the attached Buffer
        os.read(go_r, 1)
        set_last_pid(a)
        g = os.fork()
        if g == 0:
            if os.getpid() != a:
                os._exit(3)
            os.write(bw, pickle.dumps(b))
            os._exit(0)
        os.waitpid(g, 0)
        os._exit(0)
    os._exit(0)  # A exits without returning
os.close(r)
buf.lend(a)
os.write(w, pickle.dumps(buf))
os.close(w)
os.waitpid(a, 0)  # A reaped
os.write(go_w, b"x")
os.close(bw)
back = read_all(br)
before = pool.stats()["lend_refusals"]
try:
    pickle.loads(back)
    got = "accepted"
except PermissionError as e:
    got = "refused"
print(json.dumps([got, pool.stats()["lend_refusals"] - before,
                  buf.lent_to == a, pool.lend_reclaim_exited(),
                  buf.lent_to]))
buf.close()
""")
    assert out == ["refused", 1, True, 1, None], out


def test_an_honest_return_read_after_its_sender_was_reaped_and_its_pid_reused():
    """The honest p.join(); q.get() pattern: a borrower returns, exits
    and is reaped before the owner reads, and another process has its pid
    by then. Before, pinpool_lend_return saw a live process with the
    borrower's pid and refused the honest return (counted); now the proof's
    sender is the borrower by its pidfd: accepted. Without the reuse
    too."""
    out = _run_pidns(r"""
res = []
for reuse in (False, True):
    buf = pool.alloc(1 << 16)
    r, w = os.pipe(); br, bw = os.pipe()
    a = os.fork()
    if a == 0:
        os.close(w)
        b = pickle.loads(read_all(r))
        with memoryview(b) as m:
            m[:] = b"\x66" * len(m)
        os.write(bw, pickle.dumps(b))
        os._exit(0)
    os.close(r)
    buf.lend(a)
    os.write(w, pickle.dumps(buf))
    os.close(w)
    os.close(bw)
    back = read_all(br)
    os.waitpid(a, 0)  # returned, exited, reaped
    k = None
    if reuse:
        set_last_pid(a)
        k_r, k_w = os.pipe()
        k = os.fork()
        if k == 0:
            os.read(k_r, 1)
            os._exit(0)
    before = pool.stats()["lend_refusals"]
    try:
        got = pickle.loads(back) is buf
    except Exception as e:
        got = repr(e)
    filled = None  # still lent: not the owner's to read
    if buf.lent_to is None:
        with memoryview(buf) as m:
            filled = bytes(m) == b"\x66" * len(m)
    res.append([reuse, k == a if reuse else True, got,
                pool.stats()["lend_refusals"] - before, buf.lent_to, filled])
    if k:
        os.write(k_w, b"x")
        os.waitpid(k, 0)
    pool.lend_reclaim_exited()
    buf.close()
print(json.dumps(res))
""")
    assert out == [[False, True, True, 0, None, True],
                   [True, True, True, 0, None, True]], out


def test_a_forked_worker_with_the_owner_s_pid_number_attaches():
    """The pickle path told the owner by owner_pid == os.getpid(): an
    owner that is pid 1 of its namespace and a worker it forks into a new
    one (pid 1 there too) were the same process to it, and the worker's
    unpickle tried to take the lend back (in a child of fork) instead of
    attaching. Now by the C table of the pools this process created
    (pinpool_share_owns), which a fork child does not inherit."""
    out = _run_pidns(r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
assert os.getpid() == 1
buf = pool.alloc(1 << 16)
# The resource sharer's thread first: no thread can start once this
# process's children go to another pid namespace.
warm = pool.alloc(64)
pickle.dumps(warm)
if libc.unshare(0x20000000) != 0:  # CLONE_NEWPID: for the next child
    print(json.dumps("skip")); sys.exit(0)
r, w = os.pipe(); br, bw = os.pipe()
c = os.fork()
if c == 0:
    os.close(w)
    try:
        b = pickle.loads(read_all(r))
        with memoryview(b) as m:
            m[:] = b"\x77" * len(m)
        out = pickle.dumps([os.getpid(), pickle.dumps(b)])
    except Exception as e:
        out = pickle.dumps([os.getpid(), repr(e)])
    os.write(bw, out)
    os._exit(0)
os.close(r)
buf.lend(c)
os.write(w, pickle.dumps(buf))
os.close(w)
os.close(bw)
wpid, back = pickle.loads(read_all(br))
os.waitpid(c, 0)
got = pickle.loads(back) is buf if isinstance(back, bytes) else back
filled = None  # still lent: not the owner's to read
if buf.lent_to is None:
    with memoryview(buf) as m:
        filled = bytes(m) == b"\x77" * len(m)
print(json.dumps([wpid, got, filled, buf.lent_to]))
pool.lend_reclaim(live=True)
buf.close()
warm.close()
""")
    assert out == [1, True, True, None], out


# -- a return whose pickle is lost in Queue.get (issue 36, third round) ------
def _return_by_queue(inq, outq, sent):
    """A borrower whose Buffer comes and goes by Queue (which pickles and
    unpickles inside put and get)."""
    buf = inq.get(timeout=TIMEOUT)
    with memoryview(buf) as m:
        m[:] = b"\x5a" * len(m)
    outq.put(buf)
    outq.close()
    outq.join_thread()  # pickled (proof sent) and written
    sent.put("sent")
    assert inq.get(timeout=TIMEOUT) == "go"


@pytest.mark.parametrize("why", ["flood", "emfile"])
def test_a_return_lost_in_queue_get_is_collected_later(spool, why,
                                                       monkeypatch):
    """multiprocessing's Queue.get unpickles inside: when the owner cannot
    read the proof yet (BlockingIOError behind a flood of connections;
    OSError at EMFILE), get raises and the pickle's bytes are gone. Before,
    the lend then stayed live until a reclaim (no way to load it again);
    now the proof, still queued, ends the lend at a later drain, and
    Pool.lend_collect() gives the Buffer back. Nothing counted."""
    import errno
    import resource

    ctx = mp.get_context("fork")
    inq, outq, sent = ctx.Queue(), ctx.Queue(), ctx.Queue()
    w = ctx.Process(target=_return_by_queue, args=(inq, outq, sent))
    w.start()
    b = spool.alloc(4096)
    b.lend(w.pid)
    junk, fill = [], []
    try:
        with _share._lock:
            addr = _share._return_address()
        if why == "flood":
            # A full backlog is drained at once now: a small bound makes
            # the proof wait behind the junk.
            monkeypatch.setattr(_share, "_DRAIN_ACCEPTS", 16)
            for _ in range(3 * _share._DRAIN_ACCEPTS):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(addr)
                junk.append(s)
        inq.put(b)
        assert sent.get(timeout=TIMEOUT) == "sent"
        refusals = spool.stats()["lend_refusals"]
        if why == "flood":
            with pytest.raises(BlockingIOError):
                outq.get(timeout=TIMEOUT)
        else:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
            try:
                try:
                    while True:
                        fill.append(os.open(os.devnull, os.O_RDONLY))
                except OSError as e:
                    assert e.errno == errno.EMFILE
                with pytest.raises(OSError) as ei:
                    outq.get(timeout=TIMEOUT)
                assert ei.value.errno == errno.EMFILE
            finally:
                for f in fill:
                    os.close(f)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        # The bytes are gone; the lend is live, nothing counted.
        assert b.lent_to == w.pid
        assert spool.stats()["lend_refusals"] == refusals
        tables_agree(spool)
        got = None
        for _ in range(len(junk) // _share._DRAIN_ACCEPTS + 2):
            try:
                got = spool.lend_collect()
                break
            except BlockingIOError:
                assert b.lent_to == w.pid
        assert got == [b] and got[0] is b
        assert b.lent_to is None
        assert spool.stats()["lend_refusals"] == refusals
        assert spool.lend_collect() == []
        tables_agree(spool)
        with memoryview(b) as m:
            assert bytes(m) == b"\x5a" * 4096
        inq.put("go")
    finally:
        _end_worker(w, junk)
    assert w.exitcode == 0
    b.close()


def test_lend_collect_bad_input(spool):
    with pytest.raises(TypeError):
        _share.lend_collect("not a pool")
    with pytest.raises(ValueError, match="not shared"):
        pinpool.Pool("backend=malloc").lend_collect()
    assert spool.lend_collect() == []


# -- issue 36, the fourth review: the return socket's bookkeeping ------------

def _borrower_of_many(inq, outq, go):
    """Attaches each lend pickled to it ("end" stops), fills it; then, per
    command: ("pickle", i) sends the pickle of lend i back (its proof
    queued first), ("proof", i) only its proof (a worker that dies between
    the two), ("slow", i) a pickle whose proof's connection waits for `go`
    between its connect and its send."""
    bufs = []
    while True:
        m = inq.get(timeout=TIMEOUT)
        if m == "end":
            break
        bufs.append(pickle.loads(m))
        with memoryview(bufs[-1]) as v:
            v[:] = bytes([0x40 + len(bufs)]) * len(v)
    while True:
        cmd = inq.get(timeout=TIMEOUT)
        if cmd == "exit":
            return
        what, i = cmd
        b = bufs[i]
        if what == "proof":
            h = b._attached_handle()
            addr = _share._homes[(_share._parse(h).nonce,
                                  _share._parse(h).generation)]
            b.close()
            _share._prove_return(addr, h)
            outq.put(None)
            continue
        if what == "slow":
            real = _share._prove_return

            def slow(addr, handle):
                proof = os.urandom(_share._PROOF_BYTES)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(addr)
                outq.put("connected")
                go.wait(TIMEOUT)
                try:
                    s.sendall(handle + proof)
                finally:
                    s.close()
                return proof
            _share._prove_return = slow
            try:
                outq.put(pickle.dumps(b))
            except OSError as e:
                outq.put(f"send failed: {e}")
            finally:
                _share._prove_return = real
            continue
        outq.put(pickle.dumps(b))


def _lend_many(spool, n):
    ctx = mp.get_context("fork")
    inq, outq, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    w = ctx.Process(target=_borrower_of_many, args=(inq, outq, go))
    w.start()
    bufs = [spool.alloc(4096) for _ in range(n)]
    for b in bufs:
        b.lend(w.pid)
        inq.put(pickle.dumps(b))
    inq.put("end")
    return w, inq, outq, go, bufs


def _drain_all(tries=64):
    for _ in range(tries):
        with _share._lock:
            if _share._drain() is None:
                return
    raise AssertionError("the return socket never emptied")


def _refuse_many(inq, n, done):
    """A borrower that sends n refused returns: its own handle with the
    token changed, each with a fresh proof on its own connection."""
    buf = pickle.loads(inq.get(timeout=TIMEOUT))
    h = bytearray(buf._attached_handle())
    h[96] ^= 0xFF  # the token
    addr = next(iter(_share._homes.values()))
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(TIMEOUT)
        try:
            s.connect(addr)
            s.send(bytes(h) + os.urandom(_share._PROOF_BYTES))
        except OSError:  # closed unread by the owner
            pass
        s.close()
    done.set()
    inq.get(timeout=TIMEOUT)


def test_a_flood_of_refusals_never_loses_an_honest_return(spool):
    """Issue 36, fourth review, item 2: the outcomes of proofs were one LRU
    of 4096, refusals and accepted returns together. An honest return
    read first, then more than 4096 refused returns from another borrower:
    the honest Buffer was pushed out, and its pickle, loaded after,
    raised StaleHandleError (counted). Now accepted returns are kept
    apart (one per lend), and a borrower's refusals read per drain are
    few (its further connections closed unread)."""
    w, inq, outq, go, (b,) = _lend_many(spool, 1)
    ctx = mp.get_context("fork")
    hq, done = ctx.Queue(), ctx.Event()
    h = ctx.Process(target=_refuse_many,
                    args=(hq, _share._MAX_PROOFS + 512, done))
    h.start()
    c = spool.alloc(4096)
    try:
        c.lend(h.pid)
        hq.put(pickle.dumps(c))
        inq.put(("pickle", 0))
        back = outq.get(timeout=TIMEOUT)
        _drain_all()  # the honest proof read: its lend ends
        assert b.lent_to is None
        refusals = spool.stats()["lend_refusals"]
        while not done.is_set():  # the owner reads all through the flood
            with _share._lock:
                _share._drain()
        _drain_all()
        got = pickle.loads(back)
        assert got is b
        with memoryview(b) as m:
            assert bytes(m) == b"\x41" * 4096
        assert spool.stats()["lend_refusals"] >= refusals  # H's, counted
        assert c.lent_to == h.pid  # refused: H's lend untouched
        tables_agree(spool)
    finally:
        hq.put("exit")
        inq.put("exit")
        _end_worker(h)
        _end_worker(w)
    assert spool.lend_reclaim_exited() == 1
    c.close()
    b.close()


def test_lend_collect_takes_only_returns_whose_pickle_cannot_come(
        spool, monkeypatch):
    """Issue 36, fourth review, item 3: lend_collect() took every ended
    lend whose pickle had not been loaded yet, also one whose pickle was
    on its way (its proof read by an earlier drain): the honest pickle
    then raised StaleHandleError, counted as a refusal. Now it takes only
    returns whose pickle's loading raised here (the bytes gone), or, with
    grace, whose proof was read that long ago; a pickle of a return it
    handed back loads as the same Buffer, counted nowhere."""
    w, inq, outq, go, (a, b, c, d) = _lend_many(spool, 4)
    try:
        refusals = spool.stats()["lend_refusals"]
        inq.put(("pickle", 0))
        inq.put(("pickle", 1))
        pa, pb = outq.get(timeout=TIMEOUT), outq.get(timeout=TIMEOUT)
        assert pickle.loads(pa) is a  # reads both proofs
        assert b.lent_to is None  # b's lend ended with its proof...
        assert spool.lend_collect() == []  # ...but its pickle can come
        assert pickle.loads(pb) is b
        # A pickle lost: its loading raised before its proof was read (no
        # connection accepted: as behind a flood).
        inq.put(("pickle", 2))
        pc = outq.get(timeout=TIMEOUT)
        monkeypatch.setattr(_share, "_DRAIN_ACCEPTS", 0)
        with pytest.raises(BlockingIOError):
            pickle.loads(pc)
        assert c.lent_to == w.pid
        monkeypatch.undo()
        assert spool.lend_collect() == [c]
        assert pickle.loads(pc) is c  # the same pickle after all: no refusal
        # A worker that sent its proof and never its pickle: with grace.
        inq.put(("proof", 3))
        assert outq.get(timeout=TIMEOUT) is None
        assert spool.lend_collect() == []
        assert d.lent_to is None
        with pytest.raises(ValueError):
            spool.lend_collect(grace=-1)
        with pytest.raises(TypeError):
            spool.lend_collect(grace="0")
        assert spool.lend_collect(grace=0) == [d]
        assert spool.lend_collect(grace=0) == []
        assert spool.stats()["lend_refusals"] == refusals
        tables_agree(spool)
    finally:
        inq.put("exit")
        _end_worker(w)
    for x in (a, b, c, d):
        x.close()


@pytest.mark.parametrize("self_lend", [False, True])
def test_idle_strangers_never_close_a_borrowers_waiting_connection(
        spool, self_lend):
    """Issue 36, fourth review, item 6: connections accepted before their
    message came were kept, at most 64, the oldest closed first: any
    process's 64 idle connections closed an honest worker's (its send then
    failed, its lend stayed). Now a stranger's connection is closed
    unread at once (while no lend to the owner itself is live), and a
    borrower's waiting connections, as many as its lends, are never closed
    for anyone else's."""
    w, inq, outq, go, (b,) = _lend_many(spool, 1)
    mine = spool.alloc(64)
    if self_lend:
        pickle.dumps(mine)  # lent to this process: anyone may return it
    strangers = []
    try:
        inq.put(("slow", 0))
        assert outq.get(timeout=TIMEOUT) == "connected"
        _drain_all()  # the worker's connection accepted, waiting
        with _share._lock:
            addr = _share._return_address()
        for _ in range(3 * _share._MAX_WAITING):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(addr)
            strangers.append(s)
            if len(strangers) % 16 == 0:
                _drain_all()
        _drain_all()
        assert len(_share._waiting) <= _share._MAX_WAITING + 2
        go.set()
        back = outq.get(timeout=TIMEOUT)
        assert isinstance(back, bytes), back
        assert pickle.loads(back) is b
        tables_agree(spool)
    finally:
        for s in strangers:
            s.close()
        inq.put("exit")
        _end_worker(w)
    if self_lend:
        assert spool.lend_reclaim(live=True) == 1
    mine.close()
    b.close()


# -- issue 36, the fifth review -------------------------------------------

def test_a_collected_return_answers_a_late_pickle_once_and_holds_nothing(
        spool):
    """Issue 36, the fifth review, items 1 and 2: lend_collect() kept every
    Buffer it handed back (strong references: a dropped one was never
    freed), and every copy of a pickle of such a return loaded as that
    Buffer, also after it was closed or lent to another worker (the owner
    was handed "back" a Buffer another worker holds). Now a late pickle
    is answered at most once, only while its Buffer is open and not lent
    again; every other load raises StaleHandleError, never counted; and a
    dropped collected Buffer is freed."""
    w, inq, outq, go, bufs = _lend_many(spool, 4)
    try:
        refusals = spool.stats()["lend_refusals"]
        pickles = []
        for i in range(4):
            inq.put(("pickle", i))
            pickles.append(outq.get(timeout=TIMEOUT))
        _drain_all()  # every proof read: the lends end, the pickles wait
        got = spool.lend_collect(grace=0)
        assert sorted(map(id, got)) == sorted(map(id, bufs))
        del got
        a, b, c, d = bufs
        del bufs
        pa, pb, pc, pd = pickles
        # Answered once, with the same Buffer; a copy after: stale.
        assert pickle.loads(pa) is a
        with pytest.raises(pinpool.StaleHandleError):
            pickle.loads(pa)
        # Lent again (to the same worker here: any lend): never answered.
        b.lend(w.pid)
        for _ in range(2):
            with pytest.raises(pinpool.StaleHandleError):
                pickle.loads(pb)
        assert b.lent_to == w.pid
        assert spool.lend_reclaim(w.pid, live=True) == 1
        with pytest.raises(pinpool.StaleHandleError):  # nor after its end
            pickle.loads(pb)
        # Closed: never answered.
        c.close()
        with pytest.raises(pinpool.StaleHandleError):
            pickle.loads(pc)
        # Dropped: freed (before, _collected kept it allocated).
        blocks = spool.stats()["blocks"]["current"]
        del d
        gc.collect()
        assert spool.stats()["blocks"]["current"] == blocks - 1
        with pytest.raises(pinpool.StaleHandleError):
            pickle.loads(pd)
        assert spool.stats()["lend_refusals"] == refusals
        tables_agree(spool)
    finally:
        inq.put("exit")
        _end_worker(w)
    a.close()
    b.close()


def _hold_connections(addr, n, q):
    """A stranger: n idle connections to the owner's return socket."""
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(addr)
        except OSError:
            break
        held.append(s)
    q.put(len(held))
    q.get(timeout=TIMEOUT)


def test_idle_strangers_never_close_a_self_lends_waiting_connection(spool):
    """Issue 36, the fifth review, item 3: the fourth review's fix kept a
    borrower's waiting connections by its lends, and the receiver of a
    Buffer pickled without Buffer.lend (a self-lend: the plain Queue
    pattern) holds none: its connection, accepted before its message
    came, counted as a stranger's, and 64 idle connections of another
    process closed it (the worker's pickling raised BrokenPipeError, the
    self-lend stayed live). Now spare connections close from the pid with
    the most first, and while a self-lend is live never a pid's only one."""
    ctx = mp.get_context("fork")
    inq, outq, go, sq = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Queue()
    w = ctx.Process(target=_borrower_of_many, args=(inq, outq, go))
    w.start()
    b = spool.alloc(4096)
    inq.put(pickle.dumps(b))  # no Buffer.lend: lent to this process
    inq.put("end")
    assert b.lent_to == os.getpid()
    stranger = None
    try:
        inq.put(("slow", 0))
        assert outq.get(timeout=TIMEOUT) == "connected"
        _drain_all()  # the worker's connection accepted, waiting
        assert [p for _, p in _share._waiting] == [w.pid]
        with _share._lock:
            addr = _share._return_address()
        stranger = ctx.Process(target=_hold_connections,
                               args=(addr, 3 * _share._MAX_WAITING, sq))
        stranger.start()
        n = sq.get(timeout=TIMEOUT)
        assert n == 3 * _share._MAX_WAITING
        _drain_all()
        assert len(_share._waiting) <= _share._MAX_WAITING + 1
        assert w.pid in [p for _, p in _share._waiting]
        go.set()
        back = outq.get(timeout=TIMEOUT)
        assert isinstance(back, bytes), back
        assert pickle.loads(back) is b
        assert b.lent_to is None
        tables_agree(spool)
    finally:
        sq.put("exit")
        inq.put("exit")
        if stranger is not None:
            _end_worker(stranger)
        _end_worker(w)
    b.close()


# -- a reclaim's cost (issue 38, the meter's findings, item 4) ----------------

def _lend_to_self(pool, n):
    """n blocks lent to this process (a chunk has room for 128 lends: a
    block of a full chunk is kept aside, then freed)."""
    lent, aside = [], []
    while len(lent) < n:
        b = pool.alloc(4096)
        try:
            b.lend(os.getpid())
        except RuntimeError as e:
            assert "its most" in str(e), e
            aside.append(b)
            continue
        lent.append(b)
    for b in aside:
        b.close()
    return lent


def test_reclaim_compares_few_generations_per_lend(spool, monkeypatch):
    """Each lend a reclaim ends is found among the table's generations by
    a binary search (pinpoolmodule.c, _lend_reclaim): it compared every
    one of them, O(lends^2) with the GIL and the table's lock held. Counted,
    at N and 10 N lends, per lend ended."""
    per = {}
    for n in (300, 3000):
        bufs = _lend_to_self(spool, n)
        meter = []
        monkeypatch.setattr(_share, "_reclaim_meter", meter)
        assert spool.lend_reclaim(os.getpid(), live=True) == n
        monkeypatch.setattr(_share, "_reclaim_meter", None)
        assert len(meter) == 1
        per[n] = meter[0] / n
        tables_agree(spool)
        for b in bufs:
            b.close()
    bound = {n: 2 * math.log2(n) + 4 for n in per}
    assert all(per[n] <= bound[n] for n in per) and \
        per[3000] <= per[300] + 8, \
        f"candidates compared per lend ended: {per}, more than " \
        f"logarithmic ({bound})"
