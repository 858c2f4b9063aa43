"""Shared pools from Python (docs/python.md, "Shared pools"): a Buffer of a
shared=1 pool pickles for multiprocessing (fork and spawn), the worker
writes it through memoryview, NumPy and torch (buffer protocol and
DLPack), sends it back; stale handles, refusals, reclaim; SharedLoader end
to end, a worker raising, a worker killed, shutdown with blocks in flight.

Worker functions are module-level: 'spawn' pickles them by name.
"""

import gc
import multiprocessing as mp
import os
import pickle
import signal
import sysconfig
import time

import pytest

import pinpool
from conftest import needs_numpy, needs_torch, np, torch

# Under the free-threaded ThreadSanitizer interpreter (tests/freethreaded)
# every test here forks (multiprocessing's fork, and spawn's fork + exec),
# and fork from a threaded program breaks clang 14's TSAN runtime: the
# fork handlers hold every pool lock, past the 64 its deadlock detector
# tracks ("CHECK failed: sanitizer_deadlock_detector.h:67"), after which
# the pytest process hung; see also test_fork.py (llvm-project#96600).
# tests/test_share.c covers lending under TSAN, with the runtime options
# fork needs (tests/CMakeLists.txt).
pytestmark = pytest.mark.skipif(
    "--with-thread-sanitizer" in (sysconfig.get_config_var("CONFIG_ARGS") or ""),
    reason="fork under clang 14's ThreadSanitizer breaks its runtime "
    "(deadlock detector limit, llvm-project#96600); tests/test_share.c "
    "covers sharing under TSAN")

METHODS = ["fork", "spawn"]
TIMEOUT = 20  # seconds: a hang fails the test instead of the whole run


@pytest.fixture
def spool():
    p = pinpool.Pool("shared=1,backend=host")  # not auto's cuda-register
    yield p
    gc.collect()
    assert p.stats()["lent_blocks"] == 0, "lends left after the test"
    blocks = p.stats()["blocks"]["current"]
    assert blocks == 0, f"{blocks} blocks still allocated after the test"


# -- worker functions -----------------------------------------------------

def _fill_memoryview(inq, outq):
    buf = inq.get(timeout=TIMEOUT)
    info = (buf.attached, buf.pool, len(buf), buf.page_locked)
    with memoryview(buf) as m:
        m[:] = bytes([0x5A]) * len(m)
    outq.put(info)
    outq.put(buf)


def _fill_numpy(inq, outq):
    import numpy

    buf = inq.get(timeout=TIMEOUT)
    a = numpy.frombuffer(buf, dtype=numpy.uint32)
    a[:] = numpy.arange(a.size, dtype=numpy.uint32)
    d = numpy.from_dlpack(buf)  # read-only in NumPy: a read through it
    assert d[4] == 1
    a[0] = 99
    del a, d
    outq.put(buf)


def _fill_torch(inq, outq):
    import torch as t

    buf = inq.get(timeout=TIMEOUT)
    x = t.frombuffer(buf, dtype=t.float32)
    x.fill_(1.5)
    del x
    y = t.from_dlpack(buf)
    y[:4] = 0
    del y
    outq.put(buf)


def _keep_view(inq, outq):
    buf = inq.get(timeout=TIMEOUT)
    m = memoryview(buf)
    try:
        pickle.dumps(buf)
    except BufferError as e:
        outq.put(("refused", str(e), buf.closed))
    m.release()
    outq.put(buf)


def _sleep_forever(inq, outq):
    inq.get(timeout=TIMEOUT)
    outq.put("got it")
    time.sleep(60)


def _roundtrip(pool, target, method, nbytes=4096):
    ctx = mp.get_context(method)
    inq, outq = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=target, args=(inq, outq))
    p.start()
    try:
        buf = pool.alloc(nbytes)
        buf.lend(p.pid)
        assert buf.lent_to == p.pid
        inq.put(buf)
        out = [outq.get(timeout=TIMEOUT)]
        if not isinstance(out[0], pinpool.Buffer):
            out.append(outq.get(timeout=TIMEOUT))
    finally:
        p.join(TIMEOUT)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0
    back = out[-1]
    assert back is buf, "the owner gets its own Buffer back"
    assert buf.lent_to is None
    return buf, out[:-1]


# -- pickling ---------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_memoryview_in_worker(spool, method):
    buf, (info,) = _roundtrip(spool, _fill_memoryview, method)
    attached, pool, n, locked = info
    assert attached is True and pool is None and n == 4096
    assert locked is False  # pinned in the owner only
    assert bytes(memoryview(buf)) == b"\x5a" * 4096
    assert spool.stats()["lent_blocks"] == 0
    buf.close()


@needs_numpy
@pytest.mark.parametrize("method", METHODS)
def test_numpy_in_worker(spool, method):
    buf, _ = _roundtrip(spool, _fill_numpy, method)
    a = np.frombuffer(buf, dtype=np.uint32)
    expect = np.arange(1024, dtype=np.uint32)
    expect[0] = 99
    assert (a == expect).all()
    del a
    buf.close()


@needs_torch
@pytest.mark.parametrize("method", METHODS)
def test_torch_in_worker(spool, method):
    buf, _ = _roundtrip(spool, _fill_torch, method)
    x = torch.frombuffer(buf, dtype=torch.float32)
    assert (x[1:] == 1.5).all() and x[0] == 0
    del x
    buf.close()


@pytest.mark.parametrize("method", METHODS)
def test_worker_cannot_send_back_with_a_live_view(spool, method):
    buf, (refused,) = _roundtrip(spool, _keep_view, method)
    kind, msg, closed = refused
    assert kind == "refused" and "live export" in msg and closed is False
    buf.close()


def test_pickle_in_one_process_is_the_same_buffer(spool):
    buf = spool.alloc(100)
    again = pickle.loads(pickle.dumps(buf))
    assert again is buf and buf.lent_to is None
    buf.close()


def test_lent_buffer_refuses_exports_and_close(spool):
    buf = spool.alloc(100)
    buf.lend(os.getpid())
    with pytest.raises(BufferError, match="lent to process"):
        memoryview(buf)
    with pytest.raises(BufferError, match="lent to process"):
        buf.__dlpack__()
    with pytest.raises(BufferError, match="lent to process"):
        buf.close()
    with pytest.raises(BufferError, match="lent already"):
        buf.lend(os.getpid())
    assert spool.lend_reclaim() == 0  # alive: its lends stay
    assert spool.lend_reclaim(live=True) == 1
    assert buf.lent_to is None and not buf.closed
    memoryview(buf).release()
    buf.close()


def test_non_shared_pool_refuses_to_pickle(pool):
    buf = pool.alloc(64)
    with pytest.raises(TypeError, match="shared=1"):
        pickle.dumps(buf)
    with pytest.raises(ValueError, match="shared"):
        buf.lend(os.getpid())
    assert buf.lent_to is None
    memoryview(buf).release()  # unchanged
    buf.close()
    with pytest.raises(ValueError, match="shared"):
        pool.lend_reclaim()


def test_closed_buffer_refuses_to_pickle(spool):
    buf = spool.alloc(64)
    buf.close()
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(buf)
    with pytest.raises(ValueError, match="closed"):
        buf.lend(os.getpid())


def test_bad_arguments_change_nothing(spool):
    buf = spool.alloc(64)
    for bad in (0, -5):
        with pytest.raises(ValueError, match="pid"):
            buf.lend(bad)
    for bad in ("1", 1.0, None, True):
        with pytest.raises(TypeError):
            buf.lend(bad)
    with pytest.raises(ProcessLookupError, match="exited"):
        buf.lend(2**22 + 12345)  # no such process
    assert buf.lent_to is None and spool.stats()["lent_blocks"] == 0
    for bad in (0, -1):
        with pytest.raises(ValueError, match="pid"):
            spool.lend_reclaim(bad)
    with pytest.raises(TypeError):
        spool.lend_reclaim("1")
    with pytest.raises(TypeError):
        spool.lend_reclaim_exited(True, False)
    assert spool.lend_reclaim_exited() == 0
    buf.close()


def test_stale_handle_raises(spool):
    buf = spool.alloc(64)
    data = pickle.dumps(buf)  # lent to this process
    assert spool.lend_reclaim(live=True) == 1  # the pickle is stale now
    with pytest.raises(pinpool.StaleHandleError, match="stale"):
        pickle.loads(data)
    assert buf.lent_to is None
    buf.close()


def _loads_and_report(inq, outq):
    data = inq.get(timeout=TIMEOUT)
    try:
        pickle.loads(data)
        outq.put("attached")
    except Exception as e:  # noqa: BLE001
        outq.put((type(e).__name__, str(e)))


@pytest.mark.parametrize("method", METHODS)
def test_stale_handle_in_worker_is_refused(spool, method):
    ctx = mp.get_context(method)
    inq, outq = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_loads_and_report, args=(inq, outq))
    p.start()
    buf = spool.alloc(64)
    buf.lend(p.pid)
    data = pickle.dumps(buf)
    assert spool.lend_reclaim(p.pid, live=True) == 1
    inq.put(data)
    got = outq.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    assert got[0] == "StaleHandleError", got
    buf.close()


def test_forged_handle_is_refused(spool):
    from pinpool import _share

    buf = spool.alloc(64)
    with pytest.raises(pinpool.BadHandleError):
        _share._returned(b"x" * 128)
    with pytest.raises(pinpool.BadHandleError):
        _share._returned(b"short")
    buf.close()


@pytest.mark.parametrize("method", METHODS)
def test_killed_worker_lends_are_reclaimed(spool, method):
    ctx = mp.get_context(method)
    inq, outq = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_sleep_forever, args=(inq, outq))
    p.start()
    buf = spool.alloc(64)
    buf.lend(p.pid)
    inq.put(buf)
    assert outq.get(timeout=TIMEOUT) == "got it"
    os.kill(p.pid, signal.SIGKILL)
    p.join(TIMEOUT)
    assert spool.lend_reclaim_exited(free=True) == 1
    assert buf.closed and buf.lent_to is None


# -- SharedLoader ---------------------------------------------------------

def fill_index(task, buf):
    with memoryview(buf) as m:
        m[:8] = int(task).to_bytes(8, "little")
        m[8:] = bytes([task % 251]) * (len(m) - 8)


def fill_numpy(task, buf):
    import numpy

    a = numpy.frombuffer(buf, dtype=numpy.int64)
    a[:] = task
    if task % 2:  # unordered delivery: odd tasks finish late
        time.sleep(0.05)


def fill_torch(task, buf):
    import torch as t

    t.frombuffer(buf, dtype=t.float32).fill_(float(task))


def fill_raise(task, buf):
    if task == 3:
        raise KeyError(f"bad task {task}")
    fill_index(task, buf)


def fill_die(task, buf):
    if task == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    fill_index(task, buf)


def fill_first_slow(task, buf):
    if task == 0:  # holds up the order
        time.sleep(0.5)
    fill_index(task, buf)


def fill_slow(task, buf):
    time.sleep(0.2)
    fill_index(task, buf)


def _first_u64(buf):
    with memoryview(buf) as m:
        return int.from_bytes(m[:8], "little")


@pytest.mark.parametrize("method", METHODS)
def test_loader_ordered(spool, method):
    got = []
    peak = 0
    with pinpool.SharedLoader(spool, fill_index, 12, 64 * 1024,
                              num_workers=2, max_lent_per_worker=2,
                              start_method=method) as loader:
        for buf in loader:
            peak = max(peak, spool.stats()["lent_blocks"])
            assert isinstance(buf, pinpool.Buffer) and not buf.attached
            assert buf.pool is spool and buf.lent_to is None
            got.append(_first_u64(buf))
            with memoryview(buf) as m:
                assert m[-1] == got[-1] % 251
            buf.close()
    assert got == list(range(12))
    assert peak <= 4  # 2 workers x 2


def test_loader_ordered_bound(spool):
    # Task 0 is slow: the other worker finishes its tasks early, and they
    # wait for their turn. Held back, they still count against its bound,
    # so no more than workers x k blocks are out at once (the loader sent
    # it a new task for each one it finished: 11 blocks here).
    peak = 0
    got = []
    with pinpool.SharedLoader(spool, fill_first_slow, 12, 64 * 1024,
                              num_workers=2, max_lent_per_worker=2,
                              start_method="fork") as loader:
        for buf in loader:
            peak = max(peak, spool.stats()["requests"]["current"])
            got.append(_first_u64(buf))
            buf.close()
    assert got == list(range(12))
    assert peak <= 4, f"{peak} blocks out at once (2 workers x 2)"


@needs_numpy
def test_loader_unordered_numpy(spool):
    got = []
    loader = pinpool.SharedLoader(
        spool, fill_numpy, range(10), 8 * 100, num_workers=2,
        max_lent_per_worker=1, ordered=False,
        transform=lambda b: pinpool.asarray(b, dtype=np.int64))
    for a in loader:
        assert a.shape == (100,) and (a == a[0]).all()
        got.append(int(a[0]))
        del a  # the array held the block; dropping it frees it
    assert sorted(got) == list(range(10))


@needs_torch
@pytest.mark.parametrize("method", METHODS)
def test_loader_torch(spool, method):
    def to_tensor(b):
        t = torch.from_dlpack(b)
        b.close()  # the tensor keeps the block
        return t.view(torch.float32)

    seen = []
    for t in pinpool.SharedLoader(spool, fill_torch, 6, 4 * 256,
                                  start_method=method, transform=to_tensor):
        assert t.shape == (256,) and (t == t[0]).all()
        seen.append(float(t[0]))
    assert seen == [float(i) for i in range(6)]


@needs_torch
def test_loader_torch_helper(spool):
    import pinpool.torch as ppt

    def to_tensor(b):
        return ppt.from_buffer(b, torch.float32, (4, 64))

    seen = []
    for t in pinpool.SharedLoader(spool, fill_torch, 4, 4 * 256,
                                  transform=to_tensor, ordered=False):
        assert t.shape == (4, 64) and (t == t[0, 0]).all()
        assert ppt.buffer_of(t) is not None and ppt.is_pooled(t, spool)
        seen.append(int(t[0, 0]))
        del t
    assert sorted(seen) == [0, 1, 2, 3]


@needs_torch
def test_torch_from_buffer_bad_arguments(spool):
    import pinpool.torch as ppt

    buf = spool.alloc(64)
    with pytest.raises(TypeError, match="Buffer"):
        ppt.from_buffer(b"x" * 64)
    with pytest.raises(TypeError, match="dtype"):
        ppt.from_buffer(buf, "float32")
    with pytest.raises(ValueError, match="needs 68 bytes"):
        ppt.from_buffer(buf, torch.int32, (17,))
    with pytest.raises(ValueError):
        ppt.from_buffer(buf, torch.int32, (-1,))
    assert buf.exports == 0
    t = ppt.from_buffer(buf, torch.int32)
    assert t.shape == (16,) and buf.exports == 1
    buf.lend(os.getpid())
    with pytest.raises(BufferError, match="lent"):
        ppt.from_buffer(buf)
    spool.lend_reclaim(live=True)
    del t
    buf.close()


@pytest.mark.parametrize("method", METHODS)
def test_loader_worker_raises(spool, method):
    loader = pinpool.SharedLoader(spool, fill_raise, 8, 4096,
                                  start_method=method)
    got = []
    with pytest.raises(pinpool.WorkerError) as e:
        for buf in loader:
            got.append(_first_u64(buf))
            buf.close()
    msg = str(e.value)
    assert "KeyError" in msg and "bad task 3" in msg and "fill_raise" in msg
    # Raised when the error arrives: batches before it may still be held
    # for order (and are freed), so what was yielded is a prefix.
    assert got == list(range(len(got))) and len(got) <= 3
    assert all(not p.is_alive() for p in loader._procs)


@pytest.mark.parametrize("method", METHODS)
def test_loader_worker_killed(spool, method):
    loader = pinpool.SharedLoader(spool, fill_die, 8, 4096, num_workers=2,
                                  start_method=method)
    with pytest.raises(pinpool.WorkerError, match="signal 9.*reclaimed"):
        for buf in loader:
            buf.close()
    assert spool.stats()["lent_blocks"] == 0


def test_loader_shutdown_with_blocks_in_flight(spool):
    loader = pinpool.SharedLoader(spool, fill_slow, 100, 4096, num_workers=2,
                                  max_lent_per_worker=3)
    it = iter(loader)
    first = next(it)
    assert _first_u64(first) == 0
    assert spool.stats()["lent_blocks"] > 0
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 8
    assert spool.stats()["lent_blocks"] == 0
    assert all(not p.is_alive() for p in loader._procs)
    first.close()  # the caller's block stays the caller's
    it.close()


def test_loader_empty_and_bad_arguments(spool, pool):
    assert list(pinpool.SharedLoader(spool, fill_index, 0, 64)) == []
    ok = dict(pool=spool, fill_fn=fill_index, tasks=4, batch_bytes=64)
    bad = [
        (dict(pool=pool), ValueError, "shared=1"),
        (dict(pool="x"), TypeError, "Pool"),
        (dict(fill_fn=3), TypeError, "callable"),
        (dict(tasks=-1), ValueError, "tasks"),
        (dict(tasks=2.5), TypeError, "tasks"),
        (dict(batch_bytes=0), ValueError, "batch_bytes"),
        (dict(batch_bytes="8"), TypeError, "batch_bytes"),
        (dict(num_workers=0), ValueError, "num_workers"),
        (dict(max_lent_per_worker=0), ValueError, "max_lent_per_worker"),
        (dict(start_method="nope"), ValueError, "start_method"),
        (dict(timeout=-1), ValueError, "timeout"),
        (dict(transform=5), TypeError, "transform"),
    ]
    for change, exc, match in bad:
        kw = dict(ok, **change)
        with pytest.raises(exc, match=match):
            pinpool.SharedLoader(kw.pop("pool"), kw.pop("fill_fn"),
                                 kw.pop("tasks"), kw.pop("batch_bytes"), **kw)
    assert spool.stats()["blocks"]["current"] == 0
    loader = pinpool.SharedLoader(spool, fill_index, 2, 64)
    assert [_first_u64(b) for b in loader] == [0, 1]
    with pytest.raises(RuntimeError, match="once"):
        iter(loader).__next__()


def _memfd_maps():
    with open("/proc/self/maps", encoding="utf-8") as f:
        return sum(1 for line in f if "memfd:" in line)


def _count_maps(inq, outq):
    before = _memfd_maps()
    buf = inq.get(timeout=TIMEOUT)
    during = _memfd_maps()
    view = memoryview(buf)
    buf.close()  # deferred: the view still holds the block
    still = _memfd_maps()
    view.release()
    outq.put((before, during, still, _memfd_maps(), buf.closed))


def test_worker_detaches_when_closed_and_views_are_gone(spool):
    # spawn: the worker inherits no mapping of the owner's.
    ctx = mp.get_context("spawn")
    inq, outq = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_count_maps, args=(inq, outq))
    p.start()
    buf = spool.alloc(4096)
    buf.lend(p.pid)
    inq.put(buf)
    before, during, still, after, closed = outq.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    assert before == 0 and during > 0 and still == during and after == 0
    assert closed
    # The worker never sent it back: the lend is ended by the owner.
    assert spool.lend_reclaim(p.pid, free=True) == 1
    assert buf.closed


def test_a_lent_buffer_outlives_its_last_reference(spool):
    buf = spool.alloc(64)
    buf.lend(os.getpid())
    del buf
    gc.collect()
    assert spool.stats()["blocks"]["current"] == 1  # kept while lent
    assert spool.lend_reclaim(os.getpid(), free=True, live=True) == 1
    gc.collect()
    assert spool.stats()["blocks"]["current"] == 0


def test_loader_leaves_no_descriptor_behind(spool):
    def fds():
        return len(os.listdir("/proc/self/fd"))

    list(pinpool.SharedLoader(spool, fill_index, 2, 64, num_workers=1))
    gc.collect()
    n = fds()
    for b in pinpool.SharedLoader(spool, fill_index, 20, 64, num_workers=2):
        b.close()
    gc.collect()
    assert fds() <= n


def test_loader_fill_fn_spawn_cannot_pickle(spool):
    loader = pinpool.SharedLoader(spool, lambda task, buf: None, 2, 64,
                                  start_method="spawn")
    with pytest.raises(Exception, match="pickle|lambda"):
        list(loader)
    assert all(not p.is_alive() for p in loader._procs)


def test_threads_pickling_one_buffer_make_one_lend(spool):
    from concurrent.futures import ThreadPoolExecutor

    buf = spool.alloc(64)
    with ThreadPoolExecutor(8) as ex:
        pickles = list(ex.map(lambda _: pickle.dumps(buf), range(32)))
    assert spool.stats()["lent_blocks"] == 1 and buf.lent_to == os.getpid()
    # The first to come back ends the lend; the others are stale (and
    # each consumes its descriptor: nothing left in the resource sharer).
    assert pickle.loads(pickles[0]) is buf and buf.lent_to is None
    for p in pickles[1:]:
        with pytest.raises(pinpool.StaleHandleError):
            pickle.loads(p)
    buf.close()


_SMALL_STACK = r"""
import pickle, sys, threading
import pinpool
pool = pinpool.Pool("backend=host,shared=1")
threading.stack_size(32 * 1024)
done = []
def run():
    b = pool.alloc(1 << 20)          # the shared chunk is made here
    assert pickle.loads(pickle.dumps(b)) is b   # lent and returned
    b.close()
    done.append(1)
t = threading.Thread(target=run)
t.start()
t.join()
sys.exit(0 if done else 3)
"""


def test_shared_chunk_on_a_thread_with_a_small_stack():
    # Issue 36, fourth review, item 5: the chunk's creation read the memory
    # cgroup with ~44 KiB of arrays on the thread's stack; a thread of
    # threading.stack_size(32 KiB) died of SIGSEGV. In a child: a crash is
    # a failed check, not the end of the suite.
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _SMALL_STACK],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
