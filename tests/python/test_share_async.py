"""An asynchronous exception between a C call that starts or ends a lend
and the Python table's update (issue 36, the third review, item 4;
docs/verification.md, "Issue 36, the third review").

A KeyboardInterrupt, a raising SIGALRM handler or a MemoryError can come
between any two bytecodes. The test makes one come, deterministically,
right after every C call on a Buffer that starts or ends a lend (a
profile hook raising at that call's "c_return": the exception replaces
its result, as a signal handler run at the next bytecode would), one at a
time, and checks after each that Python's table of lends is the C
library's and that every Buffer's lent_to says the same."""

import gc
import json
import os
import pickle
import sys

import pytest

import pinpool
from pinpool import _share


class Boom(Exception):
    pass


def c_lends(pool):
    snap = json.loads(pool.snapshot(history=False, symbols=False))
    return sorted(lend["generation"] for lend in snap["lends"])


def interrupted(n, fn):
    """Run fn, raising Boom right after the n-th C call (counting from 1)
    of a Buffer method whose name starts with _lend; True if it was
    raised."""
    seen = [0]

    def prof(frame, event, arg):
        if (event == "c_return" and isinstance(getattr(arg, "__self__", None),
                                               pinpool.Buffer)
                and arg.__name__.startswith("_lend")):
            seen[0] += 1
            if seen[0] == n:
                raise Boom()

    sys.setprofile(prof)
    try:
        fn()
    except Boom:
        return True
    finally:
        sys.setprofile(None)
    return False


def agree(pool, bufs):
    py, c = _share.lent_generations(pool), c_lends(pool)
    assert py == c, f"Python's lends {py} are not the C library's {c}"
    tabled = {id(v.buf) for v in _share._lends.values()}
    for b in bufs:
        assert (b.lent_to is not None) == (id(b) in tabled), \
            f"lent_to {b.lent_to}, in the table: {id(b) in tabled}"


@pytest.mark.parametrize("step", ["lend", "pickle", "return"])
def test_an_exception_after_each_c_call_leaves_the_tables_equal(step):
    pool = pinpool.Pool("shared=1")
    b = pool.alloc(4096)
    me = os.getpid()
    hits = 0
    for n in range(1, 50):
        if step == "lend":
            op = lambda: b.lend(me)  # noqa: E731
        elif step == "pickle":  # a self-lend by pickling, then its end
            op = lambda: pickle.loads(pickle.dumps(b))  # noqa: E731
        else:
            if b.lent_to is None:
                b.lend(me)
            data = pickle.dumps(b)
            op = lambda: pickle.loads(data)  # noqa: E731
        if not interrupted(n, op):
            break
        hits += 1
        agree(pool, [b])
        # Whatever the exception left, the Buffer is not stuck: the lend
        # ends (reclaim counts it) and the block can be freed.
        if b.lent_to is not None:
            assert pool.lend_reclaim(live=True) == 1
        agree(pool, [b])
        assert b.lent_to is None
    assert hits >= 1, "no C call of a lend was interrupted"
    agree(pool, [b])
    if b.lent_to is not None:
        assert pool.lend_reclaim(live=True) == 1
    b.close()
    gc.collect()
    assert pool.stats()["lent_blocks"] == 0
