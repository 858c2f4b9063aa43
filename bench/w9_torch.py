"""W9 through Python (issue 22): torch's DataLoader against pinpool.SharedLoader.

Worker processes fill batches of B bytes; the main process consumes each
(a checksum standing in for the device copy). Two paths, the same fill, the
same consumer, the same number of batches in flight per worker (2):

  torch     torch.utils.data.DataLoader(batch_size=None, num_workers=W,
            pin_memory=False, prefetch_factor=2, persistent_workers=True).
            The dataset's __getitem__ allocates the batch in shared memory
            (as default_collate does in a worker, so the worker writes it
            once) and fills it; the main process copies each batch into a
            page-locked (mlock) tensor with dst.copy_(batch), as the
            pin-memory thread's batch.pin_memory() does without CUDA, and
            checksums the locked copy.
  pinpool   pinpool.SharedLoader over a shared=1,mlock=1 pool, W workers,
            max_lent_per_worker=2; fill_fn fills the lent block in place;
            the main process checksums the block itself
            (pinpool.torch.from_buffer) and closes it. In order, as the
            DataLoader delivers.
  pinpool-unordered   the same with ordered=False (a diagnostic: torch
            1.13's DataLoader has no unordered mode).

One JSON line per run. Each run is a fresh child process of this script,
so RUSAGE_SELF covers that run's main process alone (its threads included,
its workers not).

  /usr/bin/python3 bench/w9_torch.py [--quick] [--reps N] [--out FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import resource
import subprocess
import sys
import time
from typing import Any, Iterator

import numpy as np
import torch

MIB = 1 << 20
DEPTH = 2  # batches in flight per worker: prefetch_factor, max_lent_per_worker
MASK = (1 << 64) - 1


def pattern(seq: int) -> int:
    """The 64-bit word batch `seq` is filled with, as a signed int64."""
    v = (seq * 0x9E3779B97F4A7C15) & MASK
    return v - (1 << 64) if v >> 63 else v


def fill(t: torch.Tensor, seq: int) -> None:
    """The fill of both paths: one write pass at memory speed."""
    t.fill_(pattern(seq))


def checksum(t: torch.Tensor) -> int:
    """The consumer of both paths: reads every word."""
    return int(t.sum())


def expected(word: int, words: int) -> int:
    # torch's int64 sum wraps: so does this.
    v = (word * words) & MASK
    return v - (1 << 64) if v >> 63 else v


class _Batches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, nbytes: int) -> None:
        self.n, self.words = n, nbytes // 8

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, seq: int) -> torch.Tensor:
        # Shared memory from the start, as default_collate's output in a
        # worker: pickling it then sends its descriptor, copies nothing.
        st = torch.empty(0, dtype=torch.int64).storage()._new_shared(self.words)
        t = torch.empty(0, dtype=torch.int64).set_(st)
        fill(t, seq)
        return t


def _fill_block(seq: int, buf: Any) -> None:
    # DataLoader's worker loop sets one intra-op thread; so do we.
    torch.set_num_threads(1)
    t = torch.frombuffer(buf, dtype=torch.int64)
    fill(t, seq)
    del t  # the Buffer is sent back only once no view is left


def _locked_tensor(nbytes: int) -> tuple[torch.Tensor, mmap.mmap]:
    """A tensor on anonymous memory locked with mlock: the pinned tensor the
    pin-memory thread copies into, without CUDA."""
    m = mmap.mmap(-1, nbytes)
    a = np.frombuffer(m, dtype=np.int64)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlock(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(nbytes)):
        err = ctypes.get_errno()
        raise OSError(err, f"mlock({nbytes}): {os.strerror(err)}")
    return torch.from_numpy(a), m


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _minflt() -> int:
    # Page faults of the main process: torch's maps each batch's new
    # segment and faults it in as the copy reads it.
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run_one(path: str, workers: int, mib: int, seconds: float) -> dict[str, Any]:
    # One intra-op thread in the main process too (the pin-memory thread
    # sets one; the C W9 consumer is one thread): thread_time then is the
    # consumer's whole CPU time, and the workers inherit it.
    torch.set_num_threads(1)
    nbytes, words = mib * MIB, mib * MIB // 8
    warm = DEPTH * workers
    big = 1 << 30  # tasks: the run stops on time, not on a count
    copied = 0
    consume_s = 0.0
    extra: dict[str, Any] = {}
    if path == "torch":
        dst, keep = _locked_tensor(nbytes)
        loader = torch.utils.data.DataLoader(
            _Batches(big, nbytes), batch_size=None, num_workers=workers,
            pin_memory=False, prefetch_factor=DEPTH, persistent_workers=True)
        it: Iterator[Any] = iter(loader)
    else:
        import pinpool
        import pinpool.torch as ppt
        pool = pinpool.Pool("shared=1,mlock=1")
        sl: Any = pinpool.SharedLoader(pool, _fill_block, big, nbytes,
                                       num_workers=workers,
                                       max_lent_per_worker=DEPTH,
                                       ordered=path == "pinpool")
        it = iter(sl)
    held_peak = 0
    n = 0
    t0 = c0 = 0.0
    f0 = 0
    while True:
        if n == warm:
            t0, c0, copied, consume_s = time.perf_counter(), _cpu_s(), 0, 0.0
            f0 = _minflt()
        item = next(it)
        if path == "torch":
            dst.copy_(item)  # the pin-memory thread's copy
            copied += item.numel() * item.element_size()
            del item  # the shared segment goes (munmap), as torch's does
            src = dst
        else:
            # Diagnostic (a private attribute): batches filled but held
            # back for order, which the lent-block bound does not count.
            held_peak = max(held_peak, len(sl._held))
            src = ppt.from_buffer(item, torch.int64)
            # Zero copies: the consumer reads the very block the worker
            # wrote, which the pool locked.
            assert src.data_ptr() == item.ptr and item.page_locked
        c = time.thread_time()
        s = checksum(src)
        consume_s += time.thread_time() - c
        first = int(src[0])
        if s != expected(first, words) or (
                path != "pinpool-unordered" and first != pattern(n)):
            raise SystemExit(f"{path}: batch {n}: bad checksum")
        if path != "torch":
            del src
            item.close()  # the caller's: back to the pool for reuse
        n += 1
        if n > warm and time.perf_counter() - t0 >= seconds and n - warm >= 8:
            break
    wall = time.perf_counter() - t0
    cpu = _cpu_s() - c0
    faults = _minflt() - f0
    timed = n - warm
    held: float
    locked: float
    if path == "torch":
        del it, loader  # shuts the workers down
        # By construction: W*prefetch_factor segments in flight, plus the
        # one being consumed; the locked buffer.
        held, locked = (DEPTH * workers + 1) * mib + mib, mib
    else:
        st = pool.stats()
        sl.close()
        held = st["reserved_bytes"]["peak"] / MIB
        locked = st["locked_bytes"] / MIB
        extra["lent_blocks_bound"] = DEPTH * workers
        extra["held_for_order_peak"] = held_peak
    return {"workload": "W9-torch", "path": path, "workers": workers,
            "batch_mib": mib, "batches": timed,
            "seconds": round(wall, 3),
            "batches_per_s": round(timed / wall, 2),
            "copied_bytes_per_batch": copied // timed,
            "main_cpu_ms_per_batch": round(cpu * 1e3 / timed, 3),
            "consume_cpu_ms_per_batch": round(consume_s * 1e3 / timed, 3),
            "main_minflt_per_batch": round(faults / timed),
            "memory_held_mib": held, "locked_mib": locked,
            "torch": torch.__version__, **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--out", help="append the JSON lines to this file too")
    ap.add_argument("--run", nargs=3, metavar=("PATH", "W", "MIB"),
                    help=argparse.SUPPRESS)  # one run, in a child
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--paths", default="torch,pinpool",
                    help="of torch,pinpool,pinpool-unordered")
    a = ap.parse_args()
    seconds = a.seconds or (0.3 if a.quick else 1.5)
    if a.run:
        rec = run_one(a.run[0], int(a.run[1]), int(a.run[2]), seconds)
        print(json.dumps(rec), flush=True)
        return
    configs = [(w, mib) for mib in ((16,) if a.quick else (16, 64))
               for w in ((2,) if a.quick else (2, 4))]
    for rep in range(a.reps):
        for w, mib in configs:
            for path in a.paths.split(","):
                out = subprocess.run(
                    [sys.executable, __file__, "--run", path, str(w),
                     str(mib), "--seconds", str(seconds)],
                    check=True, capture_output=True, text=True).stdout
                rec = json.loads(out.strip().splitlines()[-1])
                rec["rep"] = rep + 1
                line = json.dumps(rec)
                print(line, flush=True)
                if a.out:
                    with open(a.out, "a") as f:
                        f.write(line + "\n")


if __name__ == "__main__":
    main()
