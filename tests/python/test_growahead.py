"""grow_ahead= through Python (issue 37; docs/allocation-policy.md, "Growth
ahead of demand"): the grower's counts are in Pool.stats(), and a bad value
is a configuration error. Counted, never timed: the waits are bounded and
only let the background grower catch up."""
import time

import pytest

import pinpool

MiB = 1 << 20


def wait_headroom(pool, nbytes):
    for _ in range(10000):
        st = pool.stats()
        if st["chunk_free_bytes"] >= nbytes and st["grow_ahead_chunks"] >= 1:
            return st
        time.sleep(0.001)
    pytest.fail(f"no headroom of {nbytes} bytes: {pool.stats()}")


def test_stats_count_the_grower():
    pool = pinpool.Pool("backend=host,mlock=0,grow_ahead=16MiB")
    first = pool.alloc(3 * MiB)
    wait_headroom(pool, 16 * MiB)
    blocks = [first]
    for _ in range(4):
        blocks.append(pool.alloc(3 * MiB))
        st = wait_headroom(pool, 16 * MiB)
    # Only the first allocation grew the arena on this thread.
    assert st["cache_misses"] == 1
    assert st["grow_ahead_bytes"] >= 16 * MiB
    assert st["grow_ahead_hits"] >= 4
    assert st["grow_ahead_waits_avoided"] >= 1
    assert "grow_ahead=16777216" in pool.config


def test_off_by_default():
    pool = pinpool.Pool("backend=host,mlock=0")
    pool.alloc(3 * MiB)
    st = pool.stats()
    assert st["grow_ahead_chunks"] == 0 and st["grow_ahead_bytes"] == 0
    assert "grow_ahead" not in pool.config


@pytest.mark.parametrize("value", ["lots", "-1", "autoo", ""])
def test_bad_value(value):
    with pytest.raises(ValueError, match="grow_ahead"):
        pinpool.Pool(f"backend=host,grow_ahead={value}")
