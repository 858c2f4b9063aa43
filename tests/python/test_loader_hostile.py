"""SharedLoader against hostile or unlucky workers, and owners that fork
(issue 36, the third review: docs/verification.md, "Issue 36, the third
review"). Each test failed before its fix; none times anything: a hang is
caught by a watchdog that ends what the owner would wait for, and the test
asserts that the watchdog was not needed."""

import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import pickle
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

import pytest

import pinpool
from conftest import skip_fork_under_tsan
from pinpool import _fds, _loader, _share

pytestmark = skip_fork_under_tsan

# A watchdog's limit: far beyond what any of these takes when it works.
WATCHDOG = 30

libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE = 0x4206
PR_SET_PTRACER = 0x59616D61


@pytest.fixture
def spool(hostile_spool):
    return hostile_spool


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


# -- 2. descriptors a peer sends, closed without waiting on it --------------

LINGER = 600


def lingering_socket():
    """A TCP socket whose last close waits LINGER s (unsent data to a peer
    that never reads), and what must stay open meanwhile."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    c.connect(srv.getsockname())
    a, _ = srv.accept()
    c.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            c.send(b"x" * 65536)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                 struct.pack("ii", 1, LINGER))
    return c, (srv, a)


@contextlib.contextmanager
def signal_watchdog():
    """SIGALRM after WATCHDOG s (a linger wait ends at a signal; the handler
    raises nothing); yields a list that is non-empty if it fired."""
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    signal.setitimer(signal.ITIMER_REAL, WATCHDOG, 1.0)
    try:
        yield fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_kept = []


def fill_sends_a_lingering_socket(task, buf):
    """Task 1 sends, on this worker's own channel, a lingering TCP socket
    (its last reference then the owner's); refused (EPERM) where the
    owner's end has SO_PASSRIGHTS 0."""
    if task == 1:
        chan = sys._getframe(1).f_locals["sock"]  # _worker_main's channel
        c, keep = lingering_socket()
        _kept.append(keep)
        try:
            socket.send_fds(chan, [b"\0"], [c.fileno()])
        except PermissionError:  # ours is the last reference: no linger
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                         struct.pack("ii", 1, 0))
        c.close()
    with memoryview(buf) as m:
        m[:1] = b"a"


@pytest.mark.parametrize("passrights", [True, False])
def test_loader_closes_a_workers_descriptor_without_waiting(
        spool, monkeypatch, passrights):
    if not passrights:  # the fallback of kernels before 6.16
        monkeypatch.setattr(_fds, "SO_PASSRIGHTS", None)
    got = 0
    with signal_watchdog() as fired:
        try:
            for b in pinpool.SharedLoader(spool, fill_sends_a_lingering_socket,
                                          4, 4096, num_workers=1,
                                          start_method="fork",
                                          timeout=WATCHDOG):
                got += 1
                b.close()
        except pinpool.WorkerError as e:
            assert "descriptor" in str(e)
    assert not fired, "the owner's close of the worker's socket lingered"
    if passrights and not _fds.refuse_rights(socket.socket(socket.AF_UNIX)):
        pytest.skip("no SO_PASSRIGHTS here (Linux 6.16): the fallback ran")
    if passrights:
        assert got == 4  # the worker's send was refused: nothing reached us


def _send_lingering_to(addr, report, hold):
    """In a child: connect to addr, send a lingering socket with junk,
    report 'sent' or 'refused', stay until hold closes."""
    code = 0
    try:
        c, keep = lingering_socket()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(addr)
        try:
            socket.send_fds(s, [b"junk"], [c.fileno()])
            os.write(report, b"sent")
        except PermissionError:
            os.write(report, b"refused")
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                         struct.pack("ii", 1, 0))  # ours is the last
        c.close()
        s.close()
        os.read(hold, 1)  # until the parent is done
    except BaseException:
        code = 1
    os._exit(code)


def _from_child(addr):
    r, w = os.pipe()
    hr, hw = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(hw)  # else the child's read of hr never ends
        _send_lingering_to(addr, w, hr)
    os.close(w)
    os.close(hr)
    what = os.read(r, 16).decode()
    os.close(r)
    return pid, hw, what


def _done_with(pid, hw):
    os.close(hw)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0


def test_return_socket_refuses_descriptors():
    with _share._lock:
        addr = _share._return_address()
    pid, hw, what = _from_child(addr)
    try:
        if what == "sent" and not _fds.refuse_rights(
                socket.socket(socket.AF_UNIX)):
            pytest.skip("no SO_PASSRIGHTS here (Linux 6.16)")
        assert what == "refused"
        with signal_watchdog() as fired:
            with _share._lock:
                _share._drain()
        assert not fired
    finally:
        _done_with(pid, hw)


def test_return_socket_fallback_closes_descriptors_without_waiting():
    # A listener without SO_PASSRIGHTS (kernels before 6.16): the proof's
    # reader receives the descriptors itself and closes them at once.
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    addr = b"\0pinpool-test-fx36-" + os.urandom(8).hex().encode()
    lst.bind(addr)
    lst.listen(4)
    pid, hw, what = _from_child(addr)
    try:
        assert what == "sent"
        conn, _ = lst.accept()
        with signal_watchdog() as fired:
            with _share._lock:
                assert _share._read_proof(conn)  # not a proof: dropped
        assert not fired, "the drain's recv waited out the sender's linger"
        conn.close()
    finally:
        _done_with(pid, hw)
        lst.close()


@pytest.mark.parametrize("count", [5, _fds._MAX_FDS])
def test_worker_channel_read_closes_extra_descriptors_without_waiting(count):
    # Issue 36, fourth review, item 1: _recv_msg had room for 4
    # descriptors; the kernel dropped the rest and closed them in the
    # reading thread, a lingering socket past the 4th holding it LINGER s.
    a, b = socket.socketpair()
    c, keep = lingering_socket()
    m = os.memfd_create("extra")
    fds = [m] * (count - 1) + [c.fileno()]
    socket.send_fds(b, [_loader._HEADER.pack(0, 1)], fds)
    c.close()  # the message's reference is the last
    os.close(m)
    before = len(os.listdir("/proc/self/fd"))
    with signal_watchdog() as fired:
        with pytest.raises(ValueError, match="descriptors"):
            _loader._recv_msg(a)
    assert not fired, "the worker's read waited out the sender's linger"
    pinpool._core._closer_flush()  # the socket: on the closer thread
    assert len(os.listdir("/proc/self/fd")) == before  # all closed
    a.close()
    b.close()
    for s in keep:
        s.close()


@pytest.mark.parametrize("how", ["close_received", "recv_msg", "read_proof"])
def test_a_received_unix_socket_carrying_a_lingering_socket_closes_at_once(
        how):
    """Issue 36, the fifth review, item 4: close_received set SO_LINGER
    {1, 0} on the socket it closes, but a unix socket whose own receive
    queue holds a lingering TCP socket (SCM_RIGHTS) releases it when
    closed, in the closing thread, which waited out the linger (rv36e
    close_nested: 8.2 s for a linger of 8). Now anything but a memory file
    is closed on the process's closer thread. The watchdog fires only on
    the hang; the unix socket's peer sees it closed."""
    c, keep = lingering_socket()
    x, y = socket.socketpair()
    socket.send_fds(x, [b"n"], [c.fileno()])
    c.close()  # the unix socket's queue holds the last reference
    a = b = None
    try:
        with signal_watchdog() as fired:
            if how == "close_received":
                _fds.close_received(y.detach())
            elif how == "recv_msg":  # the worker's channel read, extras
                a, b = socket.socketpair()
                m = os.memfd_create("extra")
                socket.send_fds(b, [_loader._HEADER.pack(0, 1)],
                                [m] * 4 + [y.fileno()])
                os.close(m)
                y.close()
                with pytest.raises(ValueError, match="descriptors"):
                    _loader._recv_msg(a)
            else:  # the owner's return socket, where it accepts rights
                a, b = socket.socketpair(socket.AF_UNIX,
                                         socket.SOCK_SEQPACKET)
                socket.send_fds(b, [b"junk"], [y.fileno()])
                y.close()
                with _share._lock:
                    assert _share._read_proof(a)  # not a proof: dropped
        assert not fired, "closing the unix socket waited out the linger"
        # Closed with its queue unread: the peer reads a reset (or EOF).
        r, _, _ = select.select([x], [], [], WATCHDOG)
        assert r, "the received unix socket is open"
        with contextlib.suppress(ConnectionResetError):
            assert x.recv(1) == b"", "the received unix socket is open"
    finally:
        for s in (x, a, b) + keep:
            if s is not None:
                s.close()  # keep's reset ends the closer's wait
        pinpool._core._closer_flush()


# -- 5. lends by pidfd: a forkserver worker's pid taken by a stranger --------

PIDREUSE = r'''
import json, os, subprocess, sys, threading, time
import pinpool

def fill(task, buf):
    with memoryview(buf) as m:
        m[:1] = b"x"
    if task == 0:  # die once the answer is on its way
        threading.Timer(0.05, lambda: os._exit(3)).start()

if __name__ == "__main__":
    pool = pinpool.Pool("shared=1,mlock=0")
    ld = pinpool.SharedLoader(pool, fill, 10, 4096, num_workers=1,
                              max_lent_per_worker=1,
                              start_method="forkserver", timeout=20)
    stranger = None
    err = ""
    try:
        for b in ld:
            wpid = ld.worker_pids[0]
            if stranger is None:
                while os.path.exists(f"/proc/{wpid}"):  # reaped by the forkserver
                    time.sleep(0.01)
                with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                    f.write(str(wpid - 1))
                stranger = subprocess.Popen(["sleep", "600"])
            b.close()
    except Exception as e:
        err = type(e).__name__
    ld.close()
    snap = json.loads(pool.snapshot(history=False, symbols=False))
    out = {"reused": stranger is not None and stranger.pid == wpid,
           "lends": len(snap["lends"]), "table": pinpool._share.lent_count(pool),
           "err": err}
    stranger.kill()
    stranger.wait()
    print(json.dumps(out))
'''


def test_forkserver_worker_pid_reused_gets_no_lend(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (a pid namespace, ns_last_pid)")
    script = tmp_path / "pidreuse.py"
    script.write_text(PIDREUSE)
    r = subprocess.run(["unshare", "-p", "-f", "--mount-proc", sys.executable,
                        str(script)], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0 and "unshare" in r.stderr:
        pytest.skip(f"no pid namespace here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if not out["reused"]:
        pytest.skip("the stranger did not get the worker's pid")
    # Nothing lent to the stranger: close() left no lend behind.
    assert out["lends"] == 0 and out["table"] == 0, out
    assert out["err"] == "WorkerError", out


# -- 9. a worker dead before the top-up's lend: WorkerError ------------------

def fill_dies_after_answering(task, buf):
    with memoryview(buf) as m:
        m[:1] = b"x"
    if task == 0:
        threading.Timer(0.05, lambda: os._exit(3)).start()


def test_worker_dead_before_its_next_lend_is_a_worker_error(spool):
    got = 0
    with pytest.raises(pinpool.WorkerError, match="exited with status 3"):
        with pinpool.SharedLoader(spool, fill_dies_after_answering, 10, 4096,
                                  num_workers=1, max_lent_per_worker=1,
                                  start_method="fork", timeout=WATCHDOG) as ld:
            for b in ld:
                got += 1
                b.close()
                # The worker exits (a zombie, not reaped) before the next
                # task is lent to it.
                fd = os.pidfd_open(ld.worker_pids[0])
                try:
                    pl = select.poll()
                    pl.register(fd, select.POLLIN)
                    assert pl.poll(WATCHDOG * 1000)
                finally:
                    os.close(fd)
    assert got == 1


# -- 8. the pickled return path: a proof re-sent by a copier -----------------

def _borrower(q, back):
    buf = q.get()
    with memoryview(buf) as m:
        m[:5] = b"hello"
    back.put(pickle.dumps(buf))  # the honest return, as bytes


def test_a_proof_resent_by_a_copier_does_not_refuse_the_honest_return(spool):
    buf = spool.alloc(4096)
    ctx = mp.get_context("fork")
    q, back = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_borrower, args=(q, back))
    p.start()
    try:
        buf.lend(p.pid)
        q.put(buf)
        raw = back.get(timeout=WATCHDOG)
        # A process that saw the bytes (here a fork) sends the borrower's
        # (handle, proof) again, on a connection of its own.
        hs = raw.index((0x68737070).to_bytes(4, "little"))
        handle = raw[hs:hs + 128]
        ps = raw.rindex(b"\x10", 0, len(raw) - 16)  # SHORT_BINBYTES, 16
        proof = raw[ps + 1:ps + 17]
        refusals = spool.stats()["lend_refusals"]
        addr = _share._address  # (a fork child forgets the owner's)
        cp = os.fork()
        if cp == 0:
            code = 0
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(addr)
                s.sendall(handle + proof)
                s.close()
            except BaseException:
                code = 1
            os._exit(code)
        _, st = os.waitpid(cp, 0)
        assert os.waitstatus_to_exitcode(st) == 0
        got = pickle.loads(raw)  # the honest return: the borrower's proof
        assert got is buf and buf.lent_to is None
        with memoryview(got) as m:
            assert bytes(m[:5]) == b"hello"
        # The copy ends nothing and is no refusal of the honest return.
        assert spool.stats()["lend_refusals"] in (refusals, refusals + 1)
    finally:
        p.join(WATCHDOG)
    buf.close()


def fill_sends_five_descriptors(task, buf):
    chan = sys._getframe(1).f_locals["sock"]  # _worker_main's channel
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(5)]
    try:
        socket.send_fds(chan, [b"\0" * 8], fds)
    finally:
        for f in fds:
            os.close(f)


@pytest.mark.parametrize("passrights", [True, False])
def test_worker_sending_descriptors_is_a_worker_error(spool, monkeypatch,
                                                      passrights):
    if not passrights:
        monkeypatch.setattr(_fds, "SO_PASSRIGHTS", None)
    with pytest.raises(pinpool.WorkerError):
        for b in pinpool.SharedLoader(spool, fill_sends_five_descriptors, 2,
                                      4096, num_workers=1,
                                      start_method="fork", timeout=WATCHDOG):
            b.close()


# -- 3. a non-dumpable owner: no chunk through /proc/<owner>/fd ---------------

PROCFD = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
import pinpool


def fill(task, buf):
    """Open, read-write, every chunk of the owner (our parent) through
    /proc/<owner>/fd: the count opened goes back in the batch."""
    owner = os.getppid()
    opened = denied = 0
    try:
        names = os.listdir(f"/proc/{owner}/fd")
    except PermissionError:
        names = []
        denied += 1
    for n in names:
        try:
            if "pinpool" not in os.readlink(f"/proc/{owner}/fd/{n}"):
                continue
            os.close(os.open(f"/proc/{owner}/fd/{n}", os.O_RDWR))
            opened += 1
        except PermissionError:
            denied += 1
        except OSError:
            pass
    with memoryview(buf) as m:
        m[:16] = opened.to_bytes(8, "little") + denied.to_bytes(8, "little")


if __name__ == "__main__":
    pool = pinpool.Pool("shared=1,mlock=0")
    never_lent = pool.alloc(48 << 20)
    out = {}
    for dumpable in (True, False):
        for b in pinpool.SharedLoader(pool, fill, 1, 4096, num_workers=1,
                                      start_method="spawn", timeout=60,
                                      dumpable=dumpable):
            with memoryview(b) as m:
                out[str(dumpable)] = (int.from_bytes(m[:8], "little"),
                                      int.from_bytes(m[8:16], "little"))
            b.close()
    import ctypes
    out["dumpable_after"] = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)
    never_lent.close()
    print(json.dumps(out))
'''


def test_non_dumpable_owner_keeps_its_chunks_from_a_same_uid_worker():
    if os.geteuid() != 0:
        pytest.skip("needs root (to run owner and worker as nobody)")
    d = tempfile.mkdtemp(dir="/tmp")
    try:
        os.chmod(d, 0o755)
        script = os.path.join(d, "procfd.py")
        with open(script, "w") as f:
            f.write(PROCFD)
        os.chmod(script, 0o644)
        path = os.path.dirname(os.path.dirname(pinpool.__file__))
        probe = subprocess.run(
            ["runuser", "-u", "nobody", "--", sys.executable, "-c",
             "import sys; sys.path.insert(0, sys.argv[1]); import pinpool",
             path], capture_output=True, text=True, timeout=60, cwd=d)
        if probe.returncode != 0:
            pytest.skip("nobody cannot run this interpreter with this "
                        f"pinpool: {probe.stderr.strip()[-200:]}")
        r = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable,
                            script, path], capture_output=True, text=True,
                           timeout=120, cwd=d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if r.returncode != 0 and "runuser" in r.stderr:
        pytest.skip(f"runuser: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # Dumpable (the default): the worker opens the owner's chunks, the
    # never-lent one included; that is what the switch is for.
    assert out["True"][0] >= 1, out
    # Non-dumpable: not one.
    assert out["False"][0] == 0 and out["False"][1] >= 1, out
    # Not restored by close(): a worker's daemon (double-forked) can
    # outlive it, and opened /proc/<owner>/fd/N the moment the owner was
    # dumpable again (issue 36, fourth review, item 4: 1 before).
    assert out["dumpable_after"] == 0, out


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
