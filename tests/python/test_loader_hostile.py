"""SharedLoader against hostile or unlucky workers, and owners that fork
(issue 36, the third review: docs/verification.md, "Issue 36, the third
review"). Each test failed before its fix; none times anything: a hang is
caught by a watchdog that ends what the owner would wait for, and the test
asserts that the watchdog was not needed."""

import contextlib
import ctypes
import gc
import os
import resource
import signal
import sysconfig
import threading

import pytest

import pinpool
from pinpool import _loader, _share

pytestmark = pytest.mark.skipif(
    "--with-thread-sanitizer" in (sysconfig.get_config_var("CONFIG_ARGS") or ""),
    reason="fork under clang 14's ThreadSanitizer breaks its runtime "
    "(see test_share.py); tests/test_share_hostile.c covers it")

# A watchdog's limit: far beyond what any of these takes when it works.
WATCHDOG = 30

libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE = 0x4206
PR_SET_PTRACER = 0x59616D61


@pytest.fixture
def spool():
    p = pinpool.Pool("shared=1")
    yield p
    _loader._fault = None
    gc.collect()
    assert p.stats()["lent_blocks"] == 0, "lends left after the test"
    assert p.stats()["blocks"]["current"] == 0, "blocks left after the test"


@contextlib.contextmanager
def watchdog(what):
    """Runs what() (which ends the owner's wait) if the block is still
    running after WATCHDOG seconds; yields a list that is non-empty if it
    had to."""
    fired = []

    def fire():
        fired.append(True)
        what()

    t = threading.Timer(WATCHDOG, fire)
    t.start()
    try:
        yield fired
    finally:
        t.cancel()


# -- 1. a worker traced by its own child, exiting -----------------------------

def fill_traced_then_exit(task, buf):
    """Task 1: let a child of ours ptrace us (it keeps every descriptor,
    the channel included, so no EOF reaches the owner either), write its
    pid and PTRACE_SEIZE's result to path, exit: a zombie only the tracer
    can reap."""
    i, path = task
    if i != 1:
        return
    me = os.getpid()
    libc.prctl(PR_SET_PTRACER, -1, 0, 0, 0)  # Yama; EINVAL without it
    rd, wr = os.pipe()
    c = os.fork()
    if c == 0:
        r = libc.ptrace(PTRACE_SEIZE, me, 0, 0)
        os.write(wr, b"%d" % r)
        while True:  # until the test kills us
            signal.pause()
    r = os.read(rd, 16).decode()
    with open(path + ".tmp", "w") as f:
        f.write(f"{c} {r}")
    os.rename(path + ".tmp", path)
    os._exit(0)


@pytest.mark.parametrize("timeout", [3, None])
def test_worker_traced_by_its_child_does_not_hang_the_owner(spool, tmp_path,
                                                           timeout):
    path = str(tmp_path / "tracer")

    def kill_tracer():
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(open(path).read().split()[0]), signal.SIGKILL)

    with watchdog(kill_tracer) as fired:
        with pytest.raises(pinpool.WorkerError, match="pid") as e:
            with pinpool.SharedLoader(spool, fill_traced_then_exit,
                                      [(i, path) for i in range(4)], 4096,
                                      num_workers=1, start_method="fork",
                                      timeout=timeout) as ld:
                for b in ld:
                    b.close()
        # The owner got out while the tracer still lived.
        assert not fired, "the owner waited for the tracer to exit"
    tracer, r = open(path).read().split()
    try:
        if r != "0":
            pytest.skip(f"PTRACE_SEIZE of the worker by its child failed ({r})")
        assert "exited" in str(e.value)
    finally:
        with contextlib.suppress(OSError):
            os.kill(int(tracer), signal.SIGKILL)
    assert _share.lent_count(spool) == 0


# -- 6. a child the owner forks, ending normally --------------------------------

def fill_mark(task, buf):
    with memoryview(buf) as m:
        m[:8] = int(task).to_bytes(8, "little")


def test_a_forked_child_closing_the_loader_leaves_the_parents_alone(spool):
    got = []
    with pinpool.SharedLoader(spool, fill_mark, 40, 4096, num_workers=2,
                              start_method="fork", timeout=WATCHDOG) as ld:
        it = iter(ld)
        for i, b in enumerate(it):
            with memoryview(b) as m:
                got.append(int.from_bytes(m[:8], "little"))
            b.close()
            if i == 3:
                pid = os.fork()
                if pid == 0:  # a child that unwinds the loop, then exits
                    code = 0
                    try:
                        it.close()  # the generator's finally: close()
                        ld.close()
                    except BaseException:
                        code = 1
                    os._exit(code)
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0
    assert got == list(range(40))


# -- 7. descriptors numbered 1024 and up ----------------------------------------

def test_loader_works_with_descriptors_beyond_1024(spool):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2048
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open("/dev/null", os.O_RDONLY))
        n = 0
        for b in pinpool.SharedLoader(spool, fill_mark, 8, 4096,
                                      num_workers=2, start_method="fork",
                                      timeout=WATCHDOG):
            n += 1
            b.close()
        assert n == 8
    finally:
        for f in held:
            os.close(f)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
