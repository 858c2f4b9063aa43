"""pinpool.Pool: creation, allocation, stats, maintenance calls, errors."""

import threading

import pytest

import pinpool
from conftest import live_blocks


def test_module():
    assert pinpool.__version__.count(".") == 2
    assert pinpool.kDLCPU == 1 and pinpool.kDLCUDAHost == 3
    with pytest.raises(TypeError):
        pinpool.Buffer()


def test_create_and_config():
    p = pinpool.Pool("backend=host,max_cached=64MiB,tcache_bytes=1MiB")
    assert "max_cached=67108864" in p.config
    assert p.config.startswith("backend=host,")
    assert "pinpool.Pool" in repr(p)
    assert pinpool.Pool().config  # None: PINPOOL_CONF or defaults


@pytest.mark.parametrize(
    "config", ["max_cahced=1", "max_cached=lots", "backend=nope", "a"])
def test_bad_config(config):
    with pytest.raises(ValueError) as e:
        pinpool.Pool(config)
    assert "config" in str(e.value)


def test_bad_config_types():
    with pytest.raises(TypeError):
        pinpool.Pool(42)
    with pytest.raises(TypeError):
        pinpool.Pool(b"max_cached=1")


def test_alloc_and_stats(pool):
    b = pool.alloc(1000)
    st = pool.stats()
    assert st["requests"]["current"] == 1
    assert st["requested_bytes"]["current"] == 1000
    assert st["block_bytes"]["current"] == 1024
    assert st["reserved_bytes"]["current"] == (
        st["block_bytes"]["current"] + st["cached_bytes"]["current"]
        + st["pending_bytes"])
    assert set(st["reclaim"]) == {"count", "total_ns", "max_ns"}
    b.close()
    assert live_blocks(pool) == 0
    pool.reset_peak_stats()
    assert pool.stats()["blocks"]["peak"] == 0


@pytest.mark.parametrize("n,exc", [(0, ValueError), (-1, ValueError),
                                   (2**61, ValueError), (2**70, ValueError),
                                   (1.5, TypeError), ("10", TypeError),
                                   (None, TypeError)])
def test_alloc_bad_sizes(pool, n, exc):
    with pytest.raises(exc) as e:
        pool.alloc(n)
    assert live_blocks(pool) == 0
    if exc is ValueError:  # every message names the call (issue 41)
        assert str(e.value).startswith("Pool.alloc: "), str(e.value)


def test_out_of_memory_is_memoryerror():
    p = pinpool.Pool("max_reserved=4MiB")
    keep = p.alloc(2 << 20)
    with pytest.raises(MemoryError) as e:
        p.alloc(8 << 20)
    assert "max_reserved" in str(e.value) or "memory" in str(e.value)
    keep.close()


def test_maintenance_calls(pool):
    b = pool.alloc(4096)
    b.close()
    pool.empty_cache()
    assert pool.stats()["reserved_bytes"]["current"] == 0
    pool.process_events()
    pool.synchronize()


def test_history_and_snapshot(pool, tmp_path):
    import json
    pool.record_history("all", max_entries=1000, stack_depth=8)
    kept = [pool.alloc(n) for n in (1000, 70000, 3 << 20)]
    pool.alloc(5000).close()
    path = tmp_path / "snap.json"
    assert pool.snapshot(str(path)) is None
    snap = json.loads(path.read_text())
    assert snap["format"] == "pinpool-snapshot" and snap["version"] == 1
    assert snap["history"]["record"] == "all"
    actions = [e[2] for e in snap["history"]["entries"]]
    assert actions.count("alloc") == 4 and actions.count("free_completed") == 1
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    for b in kept:
        assert blocks[b.ptr]["state"] == "allocated"
        assert blocks[b.ptr]["requested_size"] == len(b)
        assert blocks[b.ptr]["stack"] is not None
    t = snap["totals"]
    assert t["reserved_bytes"] == (t["allocated_bytes"] + t["pending_bytes"]
                                   + t["cached_bytes"])
    # The str form, without history, and history off.
    text = pool.snapshot(history=False, symbols=False)
    assert json.loads(text)["history"]["entries"] == []
    pool.record_history(None)
    assert json.loads(pool.snapshot())["history"]["record"] == "none"
    pool.record_history("state", clear=True)
    assert json.loads(pool.snapshot())["history"]["entries"] == []
    for b in kept:
        b.close()


def test_history_bad_arguments(pool, tmp_path):
    import json
    with pytest.raises(ValueError, match="enabled"):
        pool.record_history("sometimes")
    with pytest.raises(TypeError):
        pool.record_history(3)
    # Each message names the argument that is wrong, and only that one.
    for depth in (65, 999, -1):
        with pytest.raises(ValueError, match="stack_depth") as e:
            pool.record_history("all", stack_depth=depth)
        assert "max_entries" not in str(e.value), str(e.value)
        assert str(depth) in str(e.value)
    with pytest.raises(ValueError, match="max_entries") as e:
        pool.record_history("all", max_entries=-1)
    assert "stack_depth" not in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="max_entries"):
        pool.record_history("all", max_entries=1 << 27)
    # Nothing changed by the refused calls.
    assert json.loads(pool.snapshot())["history"]["record"] == "none"
    with pytest.raises(OSError, match="no-such-dir"):
        pool.snapshot(str(tmp_path / "no-such-dir" / "x.json"))
    with pytest.raises(TypeError):
        pool.snapshot(42)


def test_context_manager_empties_cache():
    with pinpool.Pool() as p:
        for n in (1000, 1 << 20, 5 << 20):
            p.alloc(n).close()
        assert p.stats()["reserved_bytes"]["current"] > 0
    assert p.stats()["reserved_bytes"]["current"] == 0


def test_default_pool_is_shared_and_race_free():
    pools = []
    barrier = threading.Barrier(8)

    def get():
        barrier.wait()
        pools.append(pinpool.default_pool())

    threads = [threading.Thread(target=get) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(p) for p in pools}) == 1
    b = pinpool.alloc(100)
    assert b.pool is pinpool.default_pool()
    b.close()


def test_record_stream_and_synchronize():
    p = pinpool.Pool("events=simulated,sim_delay_us=2000")
    b = p.alloc(8192)
    b.record_stream(1)
    b.record_stream(2)
    b.close()
    assert p.stats()["pending_blocks"] == 1
    p.synchronize()
    st = p.stats()
    assert st["pending_blocks"] == 0 and st["blocks"]["current"] == 0
    assert st["events_completed"] == 2


class StreamLike:
    """What record_stream reads of a torch.cuda.Stream (or a cupy or
    cuda-python stream): an int cuda_stream handle."""

    def __init__(self, handle):
        self.cuda_stream = handle


def test_record_stream_takes_stream_objects():
    p = pinpool.Pool("events=simulated,sim_delay_us=2000")
    b = p.alloc(8192)
    b.record_stream(StreamLike(3))
    b.record_stream(StreamLike(3))  # the same stream twice counts once
    b.record_stream(4)
    b.close()
    assert p.stats()["pending_blocks"] == 1
    p.synchronize()
    assert p.stats()["events_completed"] == 2


def test_record_stream_bad_stream_objects():
    p = pinpool.Pool("events=simulated")
    b = p.alloc(100)
    with pytest.raises(TypeError, match="cuda_stream"):
        b.record_stream(object())
    with pytest.raises(TypeError, match="cuda_stream"):
        b.record_stream(StreamLike(None))
    with pytest.raises(ValueError):
        b.record_stream(StreamLike(-1))
    b.close()
    st = p.stats()
    assert st["events_recorded"] == 0 and st["pending_blocks"] == 0


def test_record_stream_errors(pool):
    b = pool.alloc(100)
    with pytest.raises(RuntimeError, match="event provider|EBUSY|events"):
        b.record_stream(1)  # events=none
    with pytest.raises(TypeError):
        b.record_stream("1")
    with pytest.raises(ValueError):
        b.record_stream(-5)
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.record_stream(1)


def test_allocations_from_many_threads(pool):
    """alloc releases the GIL around the library; every buffer distinct."""
    out = []
    lock = threading.Lock()

    def work(i):
        mine = [pool.alloc(100 + i * 7 + k) for k in range(200)]
        with lock:
            out.extend(b.ptr for b in mine)
        for b in mine:
            b.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 1600


def test_public_names_are_the_package_s():
    """Exceptions and warnings print as pinpool.X, where users import them
    from (issue 41: WorkerError printed as pinpool._loader.WorkerError)."""
    for name in ("WorkerError", "NotPinnedWarning", "StaleHandleError",
                 "BadHandleError"):
        cls = getattr(pinpool, name)
        assert name in pinpool.__all__
        assert f"{cls.__module__}.{cls.__qualname__}" == f"pinpool.{name}"
