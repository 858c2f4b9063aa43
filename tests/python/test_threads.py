"""Many threads exporting and releasing the same buffer, through every
consumer, while others query attributes and one closes it. With the GIL
(Python 3.11) the threads interleave at bytecode boundaries and around the
calls that release it; on a free-threaded Python they run truly at once
(the module declares Py_MOD_GIL_NOT_USED there: tests/freethreaded runs
these tests on such a Python, with ThreadSanitizer, where NumPy and torch
do not exist and the consumers are memoryviews and DLPack capsules)."""

import gc
import threading

import pinpool
from conftest import live_blocks, np, torch

THREADS = 8
ROUNDS = 200


def run_threads(target, n=THREADS):
    errors = []
    barrier = threading.Barrier(n)

    def wrap(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # reported below, with the thread index
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _write_memoryview(b, i):
    m = memoryview(b)
    m[i] = i  # each thread writes its own byte
    m.release()


def _write_frombuffer(b, i):
    a = np.frombuffer(b, dtype=np.uint8)
    a[i] = i


def _numpy_from_dlpack(b, i):
    a = np.from_dlpack(b)
    assert a.shape == (1 << 16,)


def _write_torch(b, i):
    t = torch.from_dlpack(b)
    t[i] = i


def _unconsumed_capsule(b, i):
    c = b.__dlpack__(max_version=(1, 0))
    del c


def export_kinds():
    """The ways to export a buffer that this Python has."""
    kinds = [_write_memoryview, _unconsumed_capsule]
    if np is not None:
        kinds += [_write_frombuffer, _numpy_from_dlpack]
    if torch is not None:
        kinds.append(_write_torch)
    return kinds


def test_many_threads_export_release_same_buffer(pool):
    b = pool.alloc(1 << 16)
    kinds = export_kinds()

    def work(i):
        for r in range(ROUNDS):
            kinds[(i + r) % len(kinds)](b, i)
            assert b.attributes["host_accessible"] is True

    run_threads(work)
    gc.collect()
    assert b.exports == 0
    assert bytes(memoryview(b)[:THREADS]) == bytes(range(THREADS))
    b.close()


def test_close_races_exports(pool):
    """Each round one thread closes while the others export: every export
    either fails with BufferError or works on valid memory; the block goes
    back exactly once, after the last export."""
    for r in range(50):
        b = pool.alloc(4096)
        held = []
        lock = threading.Lock()

        def work(i, b=b, held=held, lock=lock):
            if i == 0:
                b.close()
                return
            try:
                m = memoryview(b)
            except BufferError:
                return
            m[i] = i
            with lock:
                held.append(m)

        run_threads(work)
        assert b.closed
        assert b.exports == len(held)
        assert live_blocks(pool) == (1 if held else 0)
        for m in held:
            assert m.obj is b
            m[0] = 1  # still valid memory after the close
            m.release()
        assert live_blocks(pool) == 0
        del held


def test_exports_released_on_other_threads(pool):
    """Consumers created on one thread, dropped on others."""
    b = pool.alloc(1 << 12)
    makers = [memoryview, lambda b: b.__dlpack__()]
    if np is not None:
        makers += [lambda b: np.frombuffer(b, dtype=np.uint8), np.from_dlpack]
    if torch is not None:
        makers.append(torch.from_dlpack)
    consumers = [makers[k % len(makers)](b) for k in range(64)]
    b.close()
    assert live_blocks(pool) == 1

    def drop(i):
        mine = consumers[i::THREADS]
        for c in mine:
            if isinstance(c, memoryview):
                c.release()
        mine.clear()

    run_threads(drop)
    consumers.clear()
    gc.collect()
    assert live_blocks(pool) == 0


def test_alloc_close_churn(pool):
    def work(i):
        for r in range(ROUNDS):
            b = pool.alloc(64 + 97 * i + r)
            v = memoryview(b)
            v[0] = 1
            b.close()  # deferred by the view
            v.release()  # now given back

    run_threads(work)
    assert live_blocks(pool) == 0
