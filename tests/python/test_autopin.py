"""backend=auto, the default (docs/configuration.md, "backend=auto"):
pinned when it can be, and a NotPinnedWarning when it cannot.

Each case runs in a child interpreter: RLIMIT_MEMLOCK, the capabilities
and the one warning per process are the process's. The children choose
their CUDA driver through PINPOOL_LIBCUDA: a path that does not exist (no
CUDA), or the fake driver of tests/fake_cuda that ctest passes in.
"""

import json
import os
import resource
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import pinpool
from conftest import pinpool_env, torch

NO_CUDA = "/nonexistent/libcuda.so.1"

# The free-threaded step's interpreter (tests/freethreaded) runs under
# ThreadSanitizer, whose runtime intercepts mlock as a no-op (it always
# succeeds: no chunk fails to lock) and deadlocks in a fork of a threaded
# process (llvm-project#96600, as test_fork.py says).
TSAN_PYTHON = "--with-thread-sanitizer" in (
    sysconfig.get_config_var("CONFIG_ARGS") or "")
needs_real_mlock = pytest.mark.skipif(
    TSAN_PYTHON, reason="mlock is a no-op under the ThreadSanitizer runtime")
needs_fork = pytest.mark.skipif(
    TSAN_PYTHON, reason="fork under clang 14's ThreadSanitizer deadlocks in "
    "its runtime (llvm-project#96600)")

# Prints one JSON line: what the child saw.
CHILD = textwrap.dedent("""
    import json, sys, warnings
    import pinpool
    out = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        p = pinpool.Pool(%(config)r)
        b = p.alloc(1 << 20)
        out["page_locked"] = b.attributes["page_locked"]
        if %(torch)r:
            import torch, pinpool.torch as ppt
            t = ppt.pin(torch.arange(1000))
            out["pin_page_locked"] = ppt.buffer_of(t).attributes["page_locked"]
        st = p.stats()
        out["backend_auto"] = st["backend_auto"]
        out["pin_warnings"] = st["pin_warnings"]
        out["locked_bytes"] = st["locked_bytes"]
        out["config"] = p.config
        out["summary"] = p.memory_summary()
        # A second pool: counted, not warned again (once per process).
        out["second_warnings"] = pinpool.Pool(%(config)r).stats()["pin_warnings"]
    out["warnings"] = [(w.category.__name__, str(w.message)) for w in seen]
    print(json.dumps(out))
""")


def child_env(lib):
    # This pinpool, from any working directory (the children run in /).
    return pinpool_env(PINPOOL_LIBCUDA=lib, PINPOOL_CONF=None)


def run_child(config="", lib=NO_CUDA, memlock=None, drop_root=False,
              with_torch=False):
    env = child_env(lib)

    def pre():
        if memlock is not None:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, memlock)
        if drop_root and os.geteuid() == 0:
            # No CAP_IPC_LOCK: RLIMIT_MEMLOCK applies.
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

    code = CHILD % {"config": config, "torch": with_torch}
    r = subprocess.run([sys.executable, "-c", code], env=env,
                       preexec_fn=pre, capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_low_memlock_warns_and_is_not_locked():
    out = run_child(memlock=(64 << 10, 64 << 10), drop_root=True,
                    with_torch=torch is not None)
    assert out["page_locked"] is False
    if torch is not None:
        assert out["pin_page_locked"] is False
    assert out["backend_auto"] == "host-unlocked"
    assert out["config"].startswith("backend=host,")
    assert out["pin_warnings"] == 1 and out["second_warnings"] == 1
    assert len(out["warnings"]) == 1, out["warnings"]
    cls, msg = out["warnings"][0]
    assert cls == "NotPinnedWarning"
    for fix in ("ulimit -l", "LimitMEMLOCK=", "--ulimit memlock=-1",
                "RLIMIT_MEMLOCK is 65536 bytes"):
        assert fix in msg, (fix, msg)
    assert "host, NOT page-locked (backend=auto" in out["summary"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CAP_IPC_LOCK)")
def test_raised_memlock_is_locked():
    # Root keeps CAP_IPC_LOCK: mlock has no limit. Raising the hard limit
    # needs CAP_SYS_RESOURCE, which a container may lack: take what is
    # allowed.
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    out = run_child(memlock=(hard, hard), with_torch=torch is not None)
    assert out["page_locked"] is True
    if torch is not None:
        assert out["pin_page_locked"] is True
    assert out["backend_auto"] == "host-locked"
    assert out["locked_bytes"] > 0
    assert out["pin_warnings"] == 0 and out["warnings"] == []
    assert "host, page-locked (backend=auto" in out["summary"]


def test_fake_cuda_device_chooses_cuda_register():
    lib = os.environ.get("PINPOOL_LIBCUDA")
    if not lib or not os.path.exists(lib):
        pytest.skip("PINPOOL_LIBCUDA not set (no fake CUDA driver)")
    out = run_child(lib=lib)
    assert out["backend_auto"] == "cuda-register"
    assert out["config"].startswith("backend=cuda-register,")
    assert out["page_locked"] is True
    assert out["warnings"] == [] and out["pin_warnings"] == 0
    assert "cuda-register, pinned by the CUDA driver (backend=auto" in \
        out["summary"]


def test_explicit_host_keeps_todays_behaviour():
    out = run_child(config="backend=host", memlock=(64 << 10, 64 << 10),
                    drop_root=True)
    assert out["page_locked"] is False
    assert out["backend_auto"] == ""
    assert out["warnings"] == [] and out["pin_warnings"] == 0
    assert "host, NOT page-locked (backend=host" in out["summary"]


def test_warning_can_be_filtered_into_an_error():
    code = textwrap.dedent("""
        import json, warnings, pinpool
        warnings.simplefilter("error", pinpool.NotPinnedWarning)
        try:
            pinpool.Pool()
        except pinpool.NotPinnedWarning as e:
            print(json.dumps(["raised",
                              issubclass(pinpool.NotPinnedWarning,
                                         RuntimeWarning)]))
    """)
    assert _nonroot_child(code, 0) == ["raised", True]


def test_warning_raised_as_an_error_is_given_again():
    # Issue 41, second round: a NotPinnedWarning that a filter turned into
    # an exception failed its Pool() but used up the process's one
    # warning; a later pageable pool was then created silently. The slot
    # is used only by a warning delivered: each later pool that warns
    # raises again, a pool that does not warn is not affected, and once
    # the warning is delivered (the filter lifted) it is not repeated.
    code = textwrap.dedent("""
        import json, warnings, pinpool
        out = []
        warnings.simplefilter("error", pinpool.NotPinnedWarning)
        for _ in range(2):
            try:
                pinpool.Pool()
                out.append("created")
            except pinpool.NotPinnedWarning:
                out.append("raised")
        quiet = pinpool.Pool("backend=host")  # named: no warning
        quiet.alloc(4096).close()
        out.append("quiet")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            p = pinpool.Pool()
            p.alloc(1 << 20).close()
            q = pinpool.Pool()
            q.alloc(1 << 20).close()
        out.append([w.category.__name__ for w in seen])
        out.append([p.stats()["pin_warnings"], q.stats()["pin_warnings"]])
        print(json.dumps(out))
    """)
    out = _nonroot_child(code, 0)
    assert out == ["raised", "raised", "quiet", ["NotPinnedWarning"],
                   [1, 1]], out


@needs_real_mlock
def test_warning_raised_by_an_allocation_is_raised_by_each_allocation():
    # The same from an allocation: two backend=auto pools capped within a
    # 1 MiB RLIMIT_MEMLOCK are both locked at create; once the first has
    # locked its 1 MiB, the second's chunk fails mlock at its allocation,
    # which warns. Under the error filter that alloc() raises, and so does
    # the pool's next one (issue 41, second round: it handed out the
    # pageable chunk silently, under a filter that made the warning an
    # error); a later pool that warns at create raises.
    code = textwrap.dedent("""
        import json, warnings, pinpool
        out = []
        warnings.simplefilter("error", pinpool.NotPinnedWarning)
        a = pinpool.Pool("max_reserved=1MiB")
        b = pinpool.Pool("max_reserved=1MiB")
        out.append([a.stats()["backend_auto"], b.stats()["backend_auto"]])
        keep = a.alloc(1 << 20)
        for _ in range(2):
            try:
                b.alloc(1 << 20).close()
                out.append("allocated")
            except pinpool.NotPinnedWarning:
                out.append("raised")
        try:
            pinpool.Pool("max_reserved=1MiB")
            out.append("created")
        except pinpool.NotPinnedWarning:
            out.append("raised")
        out.append(b.stats()["pin_warnings"])
        print(json.dumps(out))
    """)
    out = _nonroot_child(code, 1 << 20)
    assert out == [["host-locked", "host-locked"], "raised", "raised",
                   "raised", 1], out


def _nonroot_child(code, memlock, lib=NO_CUDA):
    """The JSON the code's last line prints, run as nobody (root's
    CAP_IPC_LOCK would pin all the same) with RLIMIT_MEMLOCK memlock."""
    env = child_env(lib)

    def pre():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock, memlock))
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                       env=env, preexec_fn=pre, capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_real_mlock
def test_warning_is_given_only_by_the_pool_that_found_it():
    # Issue 41, second round: the message waited process-wide, and the
    # next Pool() or alloc() of ANY pool delivered it: here a backend=host
    # pool's alloc() raised the grow_ahead thread's warning of another
    # pool. The message is that pool's: only its own calls give it. b is
    # locked at create (capped within the 8 MiB limit); once a has locked
    # 6 MiB, b's grower's background chunk fails mlock, which warns.
    out = _nonroot_child("""
        import json, time, warnings, pinpool
        out = []
        warnings.simplefilter("error", pinpool.NotPinnedWarning)
        a = pinpool.Pool("max_reserved=8MiB")
        b = pinpool.Pool("max_reserved=8MiB,grow_ahead=4MiB")
        out.append([a.stats()["backend_auto"], b.stats()["backend_auto"]])
        x = a.alloc(6 << 20)
        try:  # b's own call: raises if b's grower was already done
            y = b.alloc(4096)
        except pinpool.NotPinnedWarning:
            pass
        for _ in range(2000):  # the grower's chunk: counted, not timed
            if b.stats()["pin_warnings"] != 0:
                break
            time.sleep(0.005)
        out.append(b.stats()["pin_warnings"])
        for name, p in [("host", pinpool.Pool("backend=host")), ("a", a)]:
            try:
                p.alloc(4096).close()
                out.append(name + " allocated")
            except pinpool.NotPinnedWarning:
                out.append(name + " raised")
        try:
            b.alloc(4096).close()
            out.append("b allocated")
        except pinpool.NotPinnedWarning:
            out.append("b raised")
        print(json.dumps(out))
    """, 8 << 20)
    assert out == [["host-locked", "host-locked"], 1, "host allocated",
                   "a allocated", "b raised"], out


@needs_fork
def test_fork_child_gets_its_own_warning():
    # Issue 41, second round: "one warning per process", but a fork()
    # child inherited the used slot (the library's and the module's) and
    # its pageable pool never warned.
    out = _nonroot_child("""
        import json, os, warnings, pinpool
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as seen:
            p = pinpool.Pool()
            p.alloc(4096).close()
            pinpool.Pool()  # the parent's second: not warned again
        parent = [w.category.__name__ for w in seen]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as seen:
                q = pinpool.Pool()
                q.alloc(4096).close()
                pinpool.Pool()
            os.write(w, json.dumps([x.category.__name__
                                    for x in seen]).encode())
            os._exit(0)
        os.close(w)
        child = json.loads(os.read(r, 4096))
        os.waitpid(pid, 0)
        print(json.dumps([parent, child]))
    """, 0)
    assert out == [["NotPinnedWarning"], ["NotPinnedWarning"]], out


@needs_fork
def test_cuda_fork_child_in_a_new_pid_namespace_makes_no_driver_call():
    # Issue 41, second round: a fork child was told from its parent by
    # the pid, and a child in a new PID namespace of a parent that is pid
    # 1 (a container's entry point) is pid 1 too: it called the driver,
    # which CUDA does not support after fork. The fork is what counts.
    lib = os.environ.get("PINPOOL_LIBCUDA")
    if not lib or not os.path.exists(lib):
        pytest.skip("PINPOOL_LIBCUDA not set (no fake CUDA driver)")
    code = textwrap.dedent("""
        import ctypes, json, os, pinpool
        libc = ctypes.CDLL(None, use_errno=True)
        out = [os.getpid(), pinpool.Pool().stats()["backend_auto"]]
        def child(w):
            out = [os.getpid(), pinpool.Pool().stats()["backend_auto"]]
            os.write(w, json.dumps(out).encode())
            os._exit(0)
        for new_ns in (False, True):
            if new_ns and libc.unshare(0x20000000) != 0:  # CLONE_NEWPID
                raise SystemExit("unshare: %d" % ctypes.get_errno())
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                child(w)
            os.close(w)
            out.append(json.loads(os.read(r, 4096)))
            os.waitpid(pid, 0)
        print(json.dumps(out))
    """)
    env = child_env(lib)
    try:
        r = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable,
                            "-c", code], env=env, capture_output=True,
                           text=True, timeout=60, cwd="/")
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if r.returncode != 0 and ("unshare" in r.stderr and
                              "Operation not permitted" in r.stderr
                              or "unshare:" in r.stderr):
        pytest.skip("PID namespaces unavailable: " + r.stderr.strip()[:200])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out[:2] == [1, "cuda-register"], out
    assert out[2][1] == "host-locked" or out[2][1].startswith("host"), out
    assert out[3][0] == 1, out  # the child is pid 1 like its parent
    assert out[3][1] != "cuda-register", out
