"""The methods of pinpool.Pool written in Python: empty, zeros,
memory_stats, memory_summary. The C type (python/pinpoolmodule.c) calls
them with the pool as the first argument; their docstrings are there.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple, cast

from pinpool import _array
from pinpool._core import Pool


def empty(pool: Pool, shape: Any, dtype: Any = None) -> Any:
    if _array.is_torch_dtype(dtype):
        from pinpool import torch as pptorch

        return pptorch.empty(shape, dtype, pool=pool)
    return _array.empty(pool, shape, dtype)


def zeros(pool: Pool, shape: Any, dtype: Any = None) -> Any:
    a = empty(pool, shape, dtype)
    # ndarray.fill and Tensor.zero_: both write in place, no copy.
    if hasattr(a, "zero_"):
        a.zero_()
    else:
        a.fill(0)
    return a


# ---- memory_stats ----------------------------------------------------------
# torch.cuda.memory_stats() keys whose meaning pinpool's statistics share
# (docs/python.md, "Statistics as PyTorch names them", says why each
# corresponds and which torch keys have no counterpart). A stat of
# pinpool_stat_t gives the four ".current/.peak/.allocated/.freed" keys.
_STAT_KEYS: List[Tuple[str, str]] = [
    ("allocated_bytes.all", "block_bytes"),     # rounded sizes of live blocks
    ("requested_bytes.all", "requested_bytes"),  # exact sizes asked for
    ("reserved_bytes.all", "reserved_bytes"),    # held from the backend
    ("allocation.all", "blocks"),                # live blocks, counted
]
_COUNT_KEYS: List[Tuple[str, str]] = [
    ("num_alloc_retries", "retries"),  # memory released and allocation retried
    ("num_ooms", "oom_count"),         # allocations that failed for memory
]


def memory_stats(pool: Pool) -> Dict[str, int]:
    # Read by key names from the tables above: as a plain dict.
    st = cast(Dict[str, Any], pool.stats())
    out: Dict[str, int] = {}
    for key, field in _STAT_KEYS:
        for part in ("current", "peak", "allocated", "freed"):
            out[f"{key}.{part}"] = st[field][part]
    # torch's "segment" is one cudaMalloc; ours is one backend allocation,
    # an arena chunk: current from the arena, the flows from the backend
    # calls (the peak is not kept, so it is not made up).
    out["segment.all.current"] = st["arena_chunks"]
    out["segment.all.allocated"] = st["backend_alloc"]["count"]
    out["segment.all.freed"] = st["backend_free"]["count"]
    # torch's "active" = allocated plus freed blocks still used by streams
    # (record_stream): ours are the pending blocks.
    out["active_bytes.all.current"] = (st["block_bytes"]["current"]
                                       + st["pending_bytes"])
    out["active.all.current"] = (st["blocks"]["current"]
                                 + st["pending_blocks"])
    for key, field in _COUNT_KEYS:
        out[key] = st[field]
    out["num_device_alloc"] = st["backend_alloc"]["count"]
    out["num_device_free"] = st["backend_free"]["count"]
    return dict(sorted(out.items()))


def _fmt_bytes(n: int) -> str:
    """'512 B', '4.00 KiB', '36.75 MiB' (as tools/cli.c's format)."""
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def _pinning(config: str, st: Dict[str, Any]) -> str:
    """Which backend the pool uses and whether its memory is pinned, in
    words: "host, page-locked (backend=auto)" and the like."""
    keys = dict(kv.split("=", 1) for kv in config.split(",") if "=" in kv)
    name = keys.get("backend", "a user backend")
    auto = st["backend_auto"]
    if name in ("cuda", "cuda-register"):
        state = "pinned by the CUDA driver"
        if st["fallback_bytes"]:
            state += (f", {_fmt_bytes(st['fallback_bytes'])} pageable "
                      f"(pin_failure=pageable)")
    elif name == "host" and keys.get("mlock", "0") != "0":
        locked, reserved = st["locked_bytes"], st["reserved_bytes"]["current"]
        if locked >= reserved:
            state = "page-locked"
        else:
            state = (f"partly page-locked: {_fmt_bytes(locked)} of "
                     f"{_fmt_bytes(reserved)} ({st['mlock_failures']} "
                     f"chunks failed mlock)")
    elif name in ("host", "malloc"):
        state = "NOT page-locked"
    else:
        state = "page-locked as the user backend says"
    if auto == "host-unlocked":
        how = "backend=auto: no CUDA, RLIMIT_MEMLOCK too low; NotPinnedWarning"
    elif auto:
        how = "backend=auto"
    else:
        how = f"backend={name}" if name != "a user backend" else "hooks"
        if name == "host":
            how += f", mlock={keys.get('mlock', '0')}"
    return f"{name}, {state} ({how})"


def memory_summary(pool: Pool) -> str:
    s = memory_stats(pool)
    st = pool.stats()
    width = 77  # as row(): 21 + 4 columns of 10, with separators
    rule = "|" + "-" * (width - 2) + "|"
    dbl = "|" + "=" * (width - 2) + "|"

    def row(cells: List[str]) -> str:
        return "| " + cells[0].ljust(21) + " | " + " | ".join(
            c.rjust(10) for c in cells[1:]) + " |"

    lines = [dbl, "|" + "pinpool memory summary".center(width - 2) + "|",
             rule,
             row(["Metric", "Cur Usage", "Peak Usage", "Tot Alloc",
                  "Tot Freed"]),
             rule]
    for title, key, as_bytes in (
            ("Allocated memory", "allocated_bytes.all", True),
            ("Requested memory", "requested_bytes.all", True),
            ("Reserved memory", "reserved_bytes.all", True),
            ("Allocations", "allocation.all", False)):
        vals = [s[f"{key}.{p}"] for p in ("current", "peak", "allocated",
                                            "freed")]
        lines.append(row([title] + [_fmt_bytes(v) if as_bytes else str(v)
                                    for v in vals]))
    lines += [
        row(["Cached (idle) memory",
             _fmt_bytes(st["cached_bytes"]["current"]),
             _fmt_bytes(st["cached_bytes"]["peak"]), "", ""]),
        row(["Pending on streams", _fmt_bytes(st["pending_bytes"]), "", "",
             ""]),
        row(["Segments (chunks)", str(s["segment.all.current"]), "",
             str(s["segment.all.allocated"]), str(s["segment.all.freed"])]),
        rule,
        row(["OOMs", str(s["num_ooms"]), "", "", ""]),
        row(["Alloc retries", str(s["num_alloc_retries"]), "", "", ""]),
        row(["Cache hits", str(st["cache_hits"]), "", "", ""]),
        row(["Cache misses", str(st["cache_misses"]), "", "", ""]),
        dbl,
    ]
    cfg = pool.config
    lines.append("backend: " + _pinning(cfg, cast(Dict[str, Any], st)))
    lines.append("config: " + cfg)
    return "\n".join(lines) + "\n"
