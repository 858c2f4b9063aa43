#!/usr/bin/python3
"""Tests of `pinpool snapshot torch` (tools/snapshot_torch*.c).

The pickle is loaded with Python's pickle module (not torch) and compared
with what docs/snapshot-format.md ("PyTorch memory_viz") says it must hold,
computed here from the JSON snapshot independently of the C code. Three
more checks stand in for the memory_viz page itself (it loads d3 from a
CDN, and the tests run offline):

* js_unpickle decodes the file with the rules of MemoryViz.js's own
  unpickler (its opcodes, its integer rules; batches of at most 1000 items)
  and must give the same data;
* viewer_replay walks the trace backwards from the segments with the rules
  of MemoryViz.js's "Allocator State History" and fails where the viewer
  would stop with a script error;
* if torch imports, the functions of torch.cuda._memory_viz that read a
  snapshot are called on it.

With the arena's `chunks` in the snapshot (issue 21) the pickle's segments
are the chunks, each tiled by the blocks of the segments carved from it and
its free gaps; viz_layout computes that layout from the JSON on its own, and
check_chunk_segments checks that every chunk became a segment and that the
free gaps are the JSON's free ranges.

usage: test_torch.py --pinpool PINPOOL --example example.json --workdir DIR
                     [--example-chunks example_chunks.json]
                     [--snapgen PP_SNAPGEN] [--written DIR]
                     example|snapgen|written
"""
import argparse
import bisect
import copy
import json
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
import time

ALLOWED_OPS = {
    "PROTO", "EMPTY_DICT", "EMPTY_LIST", "MARK", "SETITEMS", "APPENDS",
    "TUPLE2", "BININT1", "BININT2", "BININT", "LONG1", "SHORT_BINUNICODE",
    "BINUNICODE", "NEWFALSE", "NEWTRUE", "NONE", "BINPUT", "LONG_BINPUT",
    "BINGET", "LONG_BINGET", "STOP",
}
SEGMENT_KEYS = {
    "device", "address", "total_size", "allocated_size", "active_size",
    "requested_size", "stream", "segment_type", "segment_pool_id",
    "is_expandable", "frames", "blocks",
}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "size", "stream", "time_us", "frames",
              "compile_context", "user_metadata"}
STATES = {"allocated": "active_allocated", "pending_free": "active_pending_free",
          "cached": "inactive"}

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {what}", flush=True)
    return cond


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, **kw)


# ---- What the pickle must hold, from the JSON -----------------------------

def expected_frames(snap, stack):
    if stack is None:
        return []
    out = []
    for fi in snap["stacks"][stack]:
        f = snap["frames"][fi]
        out.append({
            "filename": f["file"] or f["module"] or "??",
            "line": f["line"] if f["line"] is not None else 0,
            "name": f["function"] or "0x%x" % f["address"],
        })
    return out


# ---- The memory layout: which segments, which blocks -----------------------

SMALL_BLOCK_MAX = 1 << 20


def viz_layout(snap):
    """The pickle's segments, in address order, as docs/snapshot-format.md
    says, computed from the JSON; and the note the tool prints about them
    (None for none). Each is {"address", "size", "segs": indices into
    segments, "chunks": indices into chunks ([] for a segment shown on its
    own)}."""
    segs = snap["segments"]

    def own(i):
        return {"address": segs[i]["address"], "size": segs[i]["size"],
                "segs": [i], "chunks": []}
    per_segment = [own(i) for i in range(len(segs))]
    if "chunks" not in snap:
        return per_segment, None
    ch = snap["chunks"]
    base = [c["address"] for c in ch]
    end = [c["address"] + c["size"] for c in ch]
    join = [False] * len(ch)
    outside = []
    for i, sg in enumerate(segs):
        a, e = sg["address"], sg["address"] + sg["size"]
        k = bisect.bisect_right(base, a) - 1
        if k < 0 or a >= end[k]:  # in no chunk: on its own, unless it
            if k + 1 < len(ch) and base[k + 1] < e:  # overlaps one
                return per_segment, "lies partly outside the chunks listed"
            outside.append(i)
            continue
        k2 = k  # the chunks it crosses must follow each other
        while e > end[k2] and k2 + 1 < len(ch) and base[k2 + 1] == end[k2]:
            k2 += 1
        if e > end[k2]:
            return per_segment, "lies partly outside the chunks listed"
        for j in range(k, k2):
            join[j] = True
    groups, k = [], 0
    while k < len(ch):
        k2 = k
        while join[k2]:
            k2 += 1
        groups.append({"address": base[k], "size": end[k2] - base[k],
                       "segs": [], "chunks": list(range(k, k2 + 1))})
        k = k2 + 1
    starts = [g["address"] for g in groups]
    for i, sg in enumerate(segs):
        if i not in outside:
            groups[bisect.bisect_right(starts, sg["address"]) - 1][
                "segs"].append(i)
    out = sorted(groups + [own(i) for i in outside],
                 key=lambda v: v["address"])
    return out, ("in no chunk listed" if outside else None)


def viz_blocks(snap, v):
    """The blocks of layout segment v, end to end: the blocks listed,
    inactive blocks for the rest of each pinpool segment, and for a chunk
    its free space between the segments, cut at chunk boundaries."""
    segs, blocks = snap["segments"], []

    def inactive(addr, size):
        return {"address": addr, "size": size, "requested_size": 0,
                "state": "inactive", "frames": []}

    def of_segment(sg):
        bs, cursor = sg["block_size"], sg["address"]
        for b in sg["blocks"]:
            if b["address"] > cursor:
                blocks.append(inactive(cursor, b["address"] - cursor))
            cached = b["state"] == "cached"
            blocks.append({
                "address": b["address"], "size": bs,
                "requested_size": 0 if cached else b["requested_size"],
                "state": STATES[b["state"]],
                "frames": [] if cached else expected_frames(snap,
                                                            b["stack"]),
            })
            cursor = b["address"] + bs
        if cursor < sg["address"] + sg["size"]:
            blocks.append(inactive(cursor,
                                   sg["address"] + sg["size"] - cursor))

    if not v["chunks"]:
        of_segment(segs[v["segs"][0]])
        return blocks
    ends = [snap["chunks"][k]["address"] + snap["chunks"][k]["size"]
            for k in v["chunks"]]

    def gaps(a, b):
        while a < b:
            cut = min(b, next(e for e in ends if e > a))
            blocks.append(inactive(a, cut - a))
            a = cut
    cursor = v["address"]
    for i in v["segs"]:
        gaps(cursor, segs[i]["address"])
        of_segment(segs[i])
        cursor = segs[i]["address"] + segs[i]["size"]
    gaps(cursor, v["address"] + v["size"])
    return blocks


def joined_overlap(layout, addr, size):
    """Does [addr, addr + size) overlap a layout segment of 2+ chunks?"""
    return any(len(v["chunks"]) >= 2 and v["address"] < addr + size
               and addr < v["address"] + v["size"] for v in layout)


def expected_trace(snap, layout):
    """The trace before anything is left out for the viewer."""
    cols = snap["history"]["fields"]
    waiting = set()
    trace = []
    seg_stack = {}

    def entry(action, e, addr, size):
        # Stream handles are "0x..." strings in the JSON, null for none.
        stream = int(e["stream"], 16) if e["stream"] is not None else 0
        d = {"action": action, "size": size, "stream": stream,
             "time_us": e["time_ns"] // 1000,
             "frames": expected_frames(snap, e["stack"]),
             "compile_context": "N/A", "user_metadata": ""}
        if action == "oom":
            d["device_free"] = 0
        else:
            d["addr"] = addr
        return d

    for row in snap["history"]["entries"]:
        e = dict(zip(cols, row))
        a, addr = e["action"], e["address"]
        if a == "alloc":
            waiting.discard(addr)
            trace.append(entry("alloc", e, addr, e["requested_size"]))
        elif a == "free_requested":
            waiting.add(addr)
            trace.append(entry("free_requested", e, addr, e["requested_size"]))
        elif a == "free_completed":
            if addr in waiting:
                waiting.discard(addr)
            else:  # an immediate free: the pair memory_viz folds into "free"
                trace.append(entry("free_requested", e, addr,
                                   e["requested_size"]))
            trace.append(entry("free_completed", e, addr, e["requested_size"]))
        elif a in ("segment_alloc", "segment_free"):
            if a == "segment_alloc" and e["stack"] is not None:
                seg_stack[addr] = e["stack"]
            else:
                seg_stack.pop(addr, None)
            # memory_viz cannot grow a segment: none for chunks shown as
            # one segment with others (it is there from the start).
            if not joined_overlap(layout, addr, e["size"]):
                trace.append(entry(a, e, addr, e["size"]))
        elif a == "oom":
            trace.append(entry("oom", e, 0, e["size"]))
        # empty_cache: no PyTorch action
    active = sum(s["block_size"] for s in snap["segments"]
                 for b in s["blocks"] if b["state"] != "cached")
    trace.append({"action": "snapshot", "addr": 0, "size": active,
                  "stream": 0, "time_us": snap["time_ns"] // 1000,
                  "frames": [], "compile_context": "N/A",
                  "user_metadata": ""})
    return trace, seg_stack


def expected_pickle(snap):
    layout, _ = viz_layout(snap)
    trace, seg_stack = expected_trace(snap, layout)
    segments = []
    for v in layout:
        blocks = viz_blocks(snap, v)
        bss = [snap["segments"][i]["block_size"] for i in v["segs"]]
        small = bss and max(bss) <= SMALL_BLOCK_MAX
        active = [b for b in blocks if b["state"] != "inactive"]
        segments.append({
            "device": 0, "address": v["address"], "total_size": v["size"],
            "allocated_size": sum(b["size"] for b in active
                                  if b["state"] == "active_allocated"),
            "active_size": sum(b["size"] for b in active),
            "requested_size": sum(b["requested_size"] for b in active),
            "stream": 0,
            "segment_type": "small" if small else "large",
            "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": expected_frames(snap, seg_stack.get(v["address"])),
            "blocks": blocks,
        })
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {
            "allocator": "pinpool",
            "pinpool_version": snap["pinpool_version"],
            "backend": snap["backend"], "config": snap["config"]},
    }


def tiles(snap):
    """Do the segments and the free ranges tile the chunks exactly (as in a
    snapshot of a quiescent pool: tests/snapshot/snapcheck.c)?"""
    pieces = sorted([(s["address"], s["address"] + s["size"])
                     for s in snap["segments"]]
                    + [(a, a + n) for c in snap["chunks"]
                       for a, n in c["free"]])
    spans, cursor = [], None  # the chunks, adjacent ones merged
    for c in snap["chunks"]:
        if spans and spans[-1][1] == c["address"]:
            spans[-1][1] += c["size"]
        else:
            spans.append([c["address"], c["address"] + c["size"]])
    covered = []
    for a, e in pieces:
        if covered and covered[-1][1] == a:
            covered[-1][1] = e
        elif covered and a < covered[-1][1]:
            return False  # overlap
        else:
            covered.append([a, e])
    return covered == spans


def check_chunk_segments(d, snap, name):
    """Chunks became segments; their sizes tile them; and where the
    snapshot's own layout tiles (a quiescent pool), the inactive blocks
    outside every pinpool segment are exactly its free ranges."""
    layout, note = viz_layout(snap)
    if note is not None and "partly" in note:
        print(f"{name}: segments shown on their own ({note})")
        return
    segs = d["segments"]
    starts = [s["address"] for s in segs]
    for k, c in enumerate(snap["chunks"]):
        i = bisect.bisect_right(starts, c["address"]) - 1
        check(i >= 0 and c["address"] + c["size"]
              <= segs[i]["address"] + segs[i]["total_size"],
              f"{name}: chunks[{k}] is inside a segment of the pickle")
        if i >= 0 and segs[i]["address"] == c["address"]:
            check(segs[i]["total_size"] >= c["size"],
                  f"{name}: chunks[{k}] at a segment's start")
    nchunk_segs = sum(1 for v in layout if v["chunks"])
    check(nchunk_segs + sum(1 for v in layout if not v["chunks"])
          == len(segs), f"{name}: one segment per chunk (or run of chunks "
          "a segment crosses) and per segment in no chunk")
    if not tiles(snap):
        print(f"{name}: the segments do not tile the chunks (a busy pool)")
        return
    carved = sorted((s["address"], s["address"] + s["size"])
                    for s in snap["segments"])
    gaps = []
    for s in segs:
        for b in s["blocks"]:
            i = bisect.bisect_right(carved, (b["address"], float("inf"))) - 1
            if i < 0 or b["address"] >= carved[i][1]:
                check(b["state"] == "inactive",
                      f"{name}: a block outside every segment is inactive")
                gaps.append([b["address"], b["size"]])
    free = [r for c in snap["chunks"] for r in c["free"]]
    check(gaps == free, f"{name}: the free gaps drawn ({len(gaps)}) are "
          f"the chunks' free ranges ({len(free)})")
    return len(gaps)


# ---- Structure -------------------------------------------------------------

def is_int(v):
    return type(v) is int


def check_frames(frames, where):
    if not check(type(frames) is list, f"{where}: frames is a list"):
        return
    for f in frames:
        check(type(f) is dict and set(f) == {"filename", "line", "name"}
              and type(f["filename"]) is str and type(f["name"]) is str
              and is_int(f["line"]) and f["line"] >= 0,
              f"{where}: frame {f!r}")


def check_structure(d, name):
    check(type(d) is dict and set(d) == {"segments", "device_traces",
                                         "allocator_settings"},
          f"{name}: top-level keys {sorted(d) if type(d) is dict else d!r}")
    check(type(d["allocator_settings"]) is dict,
          f"{name}: allocator_settings is a dict")
    prev_end = 0
    for i, s in enumerate(d["segments"]):
        w = f"{name}: segments[{i}]"
        if not check(set(s) == SEGMENT_KEYS, f"{w}: keys {sorted(s)}"):
            continue
        for k in ("device", "address", "total_size", "allocated_size",
                  "active_size", "requested_size", "stream"):
            check(is_int(s[k]) and s[k] >= 0, f"{w}.{k} = {s[k]!r}")
        check(s["device"] == 0 and s["stream"] == 0, f"{w}: device/stream 0")
        check(s["segment_type"] in ("small", "large"), f"{w}.segment_type")
        check(s["segment_pool_id"] == (0, 0)
              and type(s["segment_pool_id"]) is tuple, f"{w}.segment_pool_id")
        check(s["is_expandable"] is False, f"{w}.is_expandable")
        check(s["address"] >= prev_end, f"{w}: address order")
        prev_end = s["address"] + s["total_size"]
        check_frames(s["frames"], w)
        addr, alloc, active, req = s["address"], 0, 0, 0
        for j, b in enumerate(s["blocks"]):
            wb = f"{w}.blocks[{j}]"
            if not check(set(b) == BLOCK_KEYS, f"{wb}: keys {sorted(b)}"):
                continue
            check(b["address"] == addr, f"{wb}: contiguous ({b['address']} "
                  f"!= {addr})")
            check(is_int(b["size"]) and b["size"] > 0, f"{wb}.size")
            check(is_int(b["requested_size"])
                  and 0 <= b["requested_size"] <= b["size"],
                  f"{wb}.requested_size")
            check(b["state"] in STATES.values(), f"{wb}.state {b['state']}")
            check_frames(b["frames"], wb)
            addr += b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                req += b["requested_size"]
        check(addr == s["address"] + s["total_size"],
              f"{w}: block sizes sum to total_size")
        check((s["allocated_size"], s["active_size"], s["requested_size"])
              == (alloc, active, req), f"{w}: sizes match the blocks")
    check(type(d["device_traces"]) is list and len(d["device_traces"]) == 1,
          f"{name}: one device trace")
    for k, t in enumerate(d["device_traces"][0]):
        w = f"{name}: device_traces[0][{k}]"
        want = TRACE_KEYS | {"device_free" if t.get("action") == "oom"
                             else "addr"}
        if not check(set(t) == want, f"{w}: keys {sorted(t)}"):
            continue
        check(t["action"] in ("alloc", "free_requested", "free_completed",
                              "segment_alloc", "segment_free", "oom",
                              "snapshot"), f"{w}.action {t['action']}")
        for key in ("size", "stream", "time_us", "addr", "device_free"):
            if key in t:
                check(is_int(t[key]) and t[key] >= 0, f"{w}.{key}")
        check_frames(t["frames"], w)
    check(d["device_traces"][0][-1]["action"] == "snapshot",
          f"{name}: the trace ends with a snapshot entry")


# ---- MemoryViz.js's unpickler ----------------------------------------------

class BigIntValue(int):
    """An integer the viewer would read as a BigInt (breaks its arithmetic)."""


def js_unpickle(data, batch_limit=1000):
    """Decode with the rules of MemoryViz.js's unpickle() for the opcodes
    this tool writes (others raise, as there); also return the largest
    batch."""
    stack, marks, memo, pos = [], [], {}, 0
    largest_batch = 0

    def u(n):
        nonlocal pos
        v = int.from_bytes(data[pos:pos + n], "little")
        pos += n
        return v

    while True:
        op = data[pos]
        pos += 1
        c = chr(op)
        if op == 0x80:
            v = u(1)
            if not 2 <= v <= 4:
                raise ValueError(f"Unhandled version {v}")
        elif c == "(":
            marks.append(len(stack))
        elif c == "}":
            stack.append({})
        elif c == "]":
            stack.append([])
        elif c in "eu":
            m = marks.pop()
            items = stack[m:]
            del stack[m:]
            largest_batch = max(largest_batch,
                                len(items) // (1 if c == "e" else 2))
            if c == "e":
                stack[-1].extend(items)
            else:
                for k in range(0, len(items), 2):
                    if type(items[k]) is not str:  # JS keys become strings
                        raise ValueError(f"non-string key {items[k]!r}")
                    stack[-1][items[k]] = items[k + 1]
        elif c == "q":
            memo[u(1)] = stack[-1]
        elif c == "r":
            memo[u(4)] = stack[-1]
        elif c == "h":
            stack.append(memo[u(1)])
        elif c == "j":
            stack.append(memo[u(4)])
        elif c == "K":
            stack.append(u(1))
        elif c == "M":
            stack.append(u(2))
        elif c == "J":
            v = u(4)
            stack.append(v - (1 << 32) if v > 0x7FFFFFFF else v)
        elif op == 0x8A:  # LONG1
            n = u(1)
            v = int.from_bytes(data[pos:pos + n], "little", signed=True)
            pos += n
            stack.append(v if n <= 8 else BigIntValue(v))
        elif op == 0x8C:
            n = u(1)
            stack.append(data[pos:pos + n].decode())
            pos += n
        elif c == "X":
            n = u(4)
            stack.append(data[pos:pos + n].decode())
            pos += n
        elif op == 0x86:
            stack[-2:] = [[stack[-2], stack[-1]]]
        elif op == 0x88:
            stack.append(True)
        elif op == 0x89:
            stack.append(False)
        elif c == "N":
            stack.append(None)
        elif c == ".":
            return stack.pop(), largest_batch
        else:
            raise ValueError(f"UNKNOWN OPCODE: {op}")


def js_view(v):
    """The Python object as the viewer's unpickler builds it."""
    if type(v) is tuple or type(v) is list:
        return [js_view(x) for x in v]
    if type(v) is dict:
        return {k: js_view(x) for k, x in v.items()}
    return v


def check_js(data, loaded, name, exact_ints=True):
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    check(ops <= ALLOWED_OPS, f"{name}: opcodes outside the subset: "
          f"{sorted(ops - ALLOWED_OPS)}")
    try:
        js, batch = js_unpickle(data)
    except Exception as e:  # noqa: BLE001 - report any decoder failure
        check(False, f"{name}: MemoryViz.js's unpickler fails: {e!r}")
        return
    check(js == js_view(loaded), f"{name}: the viewer decodes other data")
    check(batch <= 1000, f"{name}: a batch of {batch} items (the viewer "
          "spreads each batch into one call)")

    def walk(v):
        if isinstance(v, BigIntValue):
            return False
        if type(v) is int:
            return abs(v) < 1 << 53
        if type(v) is list:
            return all(walk(x) for x in v)
        if type(v) is dict:
            return all(walk(x) for x in v.values())
        return True
    # Stream handles are only told apart by the viewer; anything else must
    # be an exact number there.
    check(walk(js) or not exact_ints,
          f"{name}: an integer the viewer cannot hold exactly")


# ---- MemoryViz.js's "Allocator State History" replay -------------------------

def viewer_replay(d, name):
    """Replay the trace backwards as the viewer's simulate_memory does,
    failing where it would throw or draw a block outside every segment."""
    # annotate_snapshot: fold free_requested + free_completed into "free".
    trace = []
    for t in d["device_traces"][0]:
        if (t["action"] == "free_completed" and trace
                and trace[-1]["action"] == "free_requested"
                and trace[-1]["addr"] == t["addr"]):
            trace[-1] = dict(trace[-1], action="free")
            continue
        trace.append(t)
    segs = []  # sorted [addr, size]
    for s in d["segments"]:
        if s["device"] == 0:
            bisect.insort(segs, [s["address"], s["total_size"]])

    def containing(addr):
        i = bisect.bisect_right(segs, [addr, float("inf")]) - 1
        if i >= 0 and addr < segs[i][0] + segs[i][1]:
            return segs[i][0]
        return None

    live = {}  # block address shown -> start of its segment
    inside = {}  # segment start -> blocks shown inside it
    ok = True

    def show(addr):
        seg = containing(addr)
        if seg is None:
            return False
        live[addr] = seg
        inside[seg] = inside.get(seg, 0) + 1
        return True

    for s in d["segments"]:
        addr = s["address"]
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                ok &= check(show(addr), f"{name}: block {addr} outside every "
                            "segment at the snapshot")
            addr += b["size"]
    for k in range(len(trace) - 1, 0, -1):
        t = trace[k]
        a = t["action"]
        where = f"{name}: replaying trace event {k} ({a} {t.get('addr')})"
        if a in ("free", "free_completed"):
            if t["addr"] not in live:
                ok &= check(show(t["addr"]), f"{where}: block outside "
                            "every segment")
        elif a == "free_requested":
            ok &= check(t["addr"] in live,
                        f"{where}: unknown block (viewer TypeError)")
        elif a == "alloc":
            if t["addr"] in live:
                inside[live.pop(t["addr"])] -= 1
        elif a == "segment_free":
            i = bisect.bisect_left(segs, [t["addr"], 0])
            ok &= check((i == 0 or segs[i - 1][0] + segs[i - 1][1]
                         <= t["addr"]) and (i == len(segs) or t["addr"]
                                            + t["size"] <= segs[i][0]),
                        f"{where}: overlapping segments")
            segs.insert(i, [t["addr"], t["size"]])
        elif a == "segment_alloc":
            i = bisect.bisect_left(segs, [t["addr"], 0])
            if not check(i < len(segs) and segs[i][0] == t["addr"],
                         f"{where}: no such segment (the viewer would "
                         "remove the last one)"):
                ok = False
                break
            ok &= check(inside.get(t["addr"], 0) == 0,
                        f"{where}: blocks left outside every segment")
            del segs[i]
        if not ok:
            break
    return ok


# ---- PyTorch's own tooling ----------------------------------------------------

def torch_tools(d, name):
    try:
        import torch
        from torch.cuda import _memory_viz as mv
    except Exception as e:  # noqa: BLE001 - torch is optional here
        print(f"{name}: torch not importable ({e}); skipping its tools")
        return []
    used = []

    def call(fn, *args, **kw):
        # torch >= 2 passes the snapshot dict; 1.x the list of segments.
        try:
            return fn(*args, **kw)
        except (TypeError, KeyError, AttributeError):
            args = [a["segments"] if type(a) is dict else a for a in args]
            return fn(*args, **kw)

    old = bool(d.get("old"))
    if old:  # --layout old: the bare list, as torch 1.x wrote it
        total = sum(s["total_size"] for s in d["segments"])
        d = d["segments"]
        segs = d
    else:
        total = sum(s["total_size"] for s in d["segments"])
        segs = d["segments"]
    identity = {"format_flamegraph": lambda lines: lines}
    for fname in ("stats", "segments", "memory", "compare", "segsum",
                  "trace", "trace_plot", "segment_plot", "_frame_fmt"):
        fn = getattr(mv, fname, None)
        if fn is None:
            continue
        try:
            if fname == "stats":
                r = call(fn, d)
                check(repr(r["total_size"]) == repr(mv.Bytes(total)),
                      f"{name}: _memory_viz.stats total_size")
            elif fname in ("segments", "memory"):
                r = call(fn, d, **identity)
                sizes = sum(int(line.rsplit(" ", 1)[1])
                            for line in r.splitlines() if line)
                check(sizes == total, f"{name}: _memory_viz.{fname} covers "
                      f"{sizes} of {total} bytes")
            elif fname == "compare":
                if old:
                    empty = []
                else:
                    empty = copy.deepcopy(d)
                    empty["segments"] = []
                import contextlib
                import io
                with contextlib.redirect_stdout(io.StringIO()):
                    r = call(fn, empty, d, **identity)
                # A block's line, and with a history (old layout) a
                # "<gaps>" line for the bytes beyond the requested size.
                want = sum(1 + ("history" in b and b["size"] > sum(
                    h["real_size"] for h in b["history"]))
                    for s in segs for b in s["blocks"])
                check(len(r.splitlines()) == want,
                      f"{name}: _memory_viz.compare lists every block")
            elif fname == "_frame_fmt":
                for s in segs:
                    for b in s["blocks"]:
                        for f in b["frames"]:
                            fn(f)
            else:
                fn(d)
            used.append(fname)
        except Exception as e:  # noqa: BLE001 - any failure is a finding
            check(False, f"{name}: torch.cuda._memory_viz.{fname} fails: "
                  f"{e!r}")
    print(f"{name}: torch {torch.__version__}: _memory_viz "
          f"{', '.join(used)} accepted it")
    return used


# ---- The tests -------------------------------------------------------------------

def convert(args, src, out, expect_note=False):
    t0 = time.monotonic()
    r = run([args.pinpool, "snapshot", "torch", src, "-o", out])
    dt = time.monotonic() - t0
    err = r.stderr.decode()
    if not check(r.returncode == 0, f"convert {src}: exit {r.returncode}: "
                 f"{err}"):
        return None, err, dt
    if not expect_note:
        check(err == "", f"convert {src}: unexpected message: {err}")
    with open(out, "rb") as f:
        data = f.read()
    return data, err, dt


def full_checks(args, src, out, allow_notes=True):
    """Convert src, load the pickle with pickle (not torch), check it."""
    name = os.path.basename(src)
    data, err, dt = convert(args, src, out, expect_note=allow_notes)
    if data is None:
        return None
    with open(src) as f:
        snap = json.load(f)
    d = pickle.loads(data)
    check_structure(d, name)
    check_js(data, d, name)
    check(viewer_replay(d, name), f"{name}: the viewer cannot replay it")
    _, note = viz_layout(snap)
    check((note is None and "chunks listed" not in err)
          or (note is not None and note in err),
          f"{name}: the note about the layout (want {note!r}): {err}")
    if "chunks" in snap:
        check_chunk_segments(d, snap, name)
    want = expected_pickle(snap)
    for k in ("segments", "allocator_settings"):
        check(d[k] == want[k], f"{name}: {k} differ from the JSON")
    got_t, want_t = d["device_traces"][0], want["device_traces"][0]
    if "left out" not in err:
        check(got_t == want_t, f"{name}: device trace differs from the "
              f"history ({len(got_t)} vs {len(want_t)} entries)")
    else:
        # A snapshot of a busy pool: only left-out entries may be missing.
        print(f"{name}: {err.strip()}")
        it = iter(want_t)
        check(all(any(g == w for w in it) for g in got_t),
              f"{name}: the trace is not a subsequence of the history")
    counts = {}
    for t in got_t:
        counts[t["action"]] = counts.get(t["action"], 0) + 1
    print(f"{name}: {len(data)} bytes in {dt:.2f} s, "
          f"{len(d['segments'])} segments, "
          f"{sum(len(s['blocks']) for s in d['segments'])} blocks, "
          f"trace {counts}", flush=True)
    return d


def bad_input_tests(args, work):
    pp = args.pinpool
    out = os.path.join(work, "bad.pickle")

    def no_leftovers(what):
        stray = [f for f in os.listdir(work) if f.startswith("bad.pickle")]
        check(stray == [], f"{what}: files left behind: {stray}")

    r = run([pp, "snapshot", "torch", args.example])
    check(r.returncode == 2, f"missing -o: exit {r.returncode} (want 2)")
    r = run([pp, "snapshot", "torch", "-o", out])
    check(r.returncode == 2, f"missing FILE: exit {r.returncode} (want 2)")
    r = run([pp, "snapshot", "torch", args.example, "-o", out, "--bogus"])
    check(r.returncode == 2, f"unknown option: exit {r.returncode} (want 2)")
    r = run([pp, "snapshot", "torch", args.example, "-o", out, "-o", out])
    check(r.returncode == 2, f"-o twice: exit {r.returncode} (want 2)")
    r = run([pp, "snapshot", "torch", "--help"])
    check(r.returncode == 0 and b"usage" in r.stdout, "--help")
    no_leftovers("usage errors")

    with open(args.example) as f:
        text = f.read()
    snap = json.loads(text)
    cases = {
        "truncated.json": text[: len(text) // 2],
        "notjson.json": "this is not JSON",
    }
    bad_state = copy.deepcopy(snap)
    bad_state["segments"][0]["blocks"][0]["state"] = "bogus"
    cases["state.json"] = json.dumps(bad_state)
    outside = copy.deepcopy(snap)  # a block beyond its segment's end
    outside["segments"][0]["blocks"][3]["address"] = (
        outside["segments"][0]["address"] + outside["segments"][0]["size"])
    cases["outside.json"] = json.dumps(outside)
    order = copy.deepcopy(snap)  # blocks out of address order
    b = order["segments"][0]["blocks"]
    b[0], b[1] = b[1], b[0]
    cases["order.json"] = json.dumps(order)
    overlap = copy.deepcopy(snap)  # segments overlapping
    overlap["segments"][1]["address"] -= 4096
    for blk in overlap["segments"][1]["blocks"]:
        blk["address"] -= 4096
    cases["overlap.json"] = json.dumps(overlap)
    for fname, content in cases.items():
        src = os.path.join(work, fname)
        with open(src, "w") as f:
            f.write(content)
        if os.path.exists(out):
            os.remove(out)
        r = run([pp, "snapshot", "torch", src, "-o", out])
        err = r.stderr.decode()
        check(r.returncode == 1, f"{fname}: exit {r.returncode} (want 1)")
        check(not os.path.exists(out), f"{fname}: OUT was created")
        check(fname in err, f"{fname}: the message names the file: {err}")
        if fname in ("outside.json", "order.json"):
            check("segments[0].blocks[" in err,
                  f"{fname}: the message names the block: {err}")
        no_leftovers(fname)
        # An existing OUT is left as it was.
        with open(out, "w") as f:
            f.write("keep")
        r = run([pp, "snapshot", "torch", src, "-o", out])
        with open(out) as f:
            check(r.returncode == 1 and f.read() == "keep",
                  f"{fname}: an existing OUT was changed")
        os.remove(out)

    r = run([pp, "snapshot", "torch", args.example, "-o",
             os.path.join(work, "no-such-dir", "x.pickle")])
    check(r.returncode == 1, f"missing directory: exit {r.returncode}")
    if os.path.exists("/dev/full"):
        r = run([pp, "snapshot", "torch", args.example, "-o", "/dev/full"])
        check(r.returncode == 1 and b"writing /dev/full failed" in r.stderr,
              f"/dev/full: exit {r.returncode}: {r.stderr!r}")


def stream_tests(args, work, reference):
    # "-" reads standard input and writes standard output, same bytes.
    with open(args.example, "rb") as f:
        r = run([args.pinpool, "snapshot", "torch", "-", "-o", "-"], stdin=f)
    check(r.returncode == 0 and r.stdout == reference,
          "stdin to stdout gives other bytes")
    out = os.path.join(work, "perm.pickle")
    r = run([args.pinpool, "snapshot", "torch", args.example, "--output",
             out])
    mask = os.umask(0)
    os.umask(mask)
    check(r.returncode == 0 and os.stat(out).st_mode & 0o777
          == 0o666 & ~mask, "OUT permissions follow the umask")
    # Through a symbolic link the file it names is replaced, not the link.
    target, link = os.path.join(work, "target.pickle"), \
        os.path.join(work, "link.pickle")
    with open(target, "w") as f:
        f.write("old")
    os.symlink(target, link)
    r = run([args.pinpool, "snapshot", "torch", args.example, "-o", link])
    with open(target, "rb") as f:
        check(r.returncode == 0 and os.path.islink(link)
              and f.read() == reference, "OUT a symbolic link")
    # A directory cannot be written.
    r = run([args.pinpool, "snapshot", "torch", args.example, "-o", work])
    check(r.returncode == 1, f"OUT a directory: exit {r.returncode}")


def inconsistent_tests(args, work):
    """Entries the block states contradict are left out, with a note, and
    what remains replays in the viewer."""
    with open(args.example) as f:
        snap = json.load(f)
    seg0 = snap["segments"][0]
    cached = seg0["blocks"][2]["address"]
    fields = snap["history"]["fields"]

    def row(seq, action, addr, size, req):
        e = {"seq": seq, "time_ns": 4000005000 + seq, "action": action,
             "address": addr, "size": size, "requested_size": req,
             "stream": "0x7" if action == "free_requested" else None,
             "thread": 4243, "stack": 0}
        return [e[k] for k in fields]
    entries = snap["history"]["entries"]
    # A free_requested of a block the snapshot shows cached (its
    # free_completed was lost), and a free of a block in no segment.
    entries.append(row(5, "free_requested", cached, 4096, 100))
    entries.append(row(6, "free_completed", 12345 * 4096, 4096, 100))
    # A segment_alloc of a segment that is not in the snapshot.
    entries.append(row(7, "segment_alloc", 1 << 40, 1 << 21, 0))
    snap["history"]["recorded"] = len(entries)
    src = os.path.join(work, "inconsistent.json")
    with open(src, "w") as f:
        json.dump(snap, f)
    out = os.path.join(work, "inconsistent.pickle")
    data, err, _ = convert(args, src, out, expect_note=True)
    if data is None:
        return
    check("note: 3 of 8 " in err, f"inconsistent: note: {err}")
    d = pickle.loads(data)
    check_structure(d, "inconsistent")
    check(viewer_replay(d, "inconsistent"), "inconsistent: replay")
    got = [(t["action"], t["addr"]) for t in d["device_traces"][0]]
    check((("free_requested", cached) not in got)
          and all(a != 12345 * 4096 for _, a in got)
          and all(a != 1 << 40 for _, a in got),
          f"inconsistent: entries kept: {got}")


def mutant_tests(args, work, src_path, count=150):
    """Random histories and states over the segments of src_path (and its
    chunks: moved, so that they may overlap or leave a segment outside):
    each file is either refused (exit 1) or gives a pickle that is well
    formed, that the viewer's unpickler reads and that replays without an
    error."""
    import random
    rng = random.Random(20240611)
    tag = os.path.basename(src_path)
    with open(src_path) as f:
        base = json.load(f)
    fields = base["history"]["fields"]
    actions = ["segment_alloc", "alloc", "free_requested", "free_completed",
               "segment_free", "empty_cache", "oom"]
    blocks = [b["address"] for s in base["segments"] for b in s["blocks"]]
    segs = [(s["address"], s["size"]) for s in base["segments"]]
    addrs = blocks + [a for a, _ in segs] + [
        a + s for a, s in segs] + [12345 * 4096, 1 << 40]
    out = os.path.join(work, "mutant.pickle")
    outcomes = {0: 0, 1: 0}
    notes = 0
    layout_notes = {}
    for k in range(count):
        snap = copy.deepcopy(base)
        entries = snap["history"]["entries"]
        for _ in range(rng.randrange(1, 40)):
            a = rng.choice(actions)
            seg = rng.choice(segs)
            addr = seg[0] if a.startswith("segment") else rng.choice(addrs)
            size = seg[1] if a.startswith("segment") else 4096
            e = {"seq": len(entries), "time_ns": 4000005000 + len(entries),
                 "action": a, "address": addr, "size": size,
                 "requested_size": rng.randrange(0, 4096),
                 "stream": "0x%x" % rng.choice([7, 1 << 40, (1 << 64) - 1])
                 if a == "free_requested" else None,
                 "thread": 4243, "stack": rng.choice([None, 0, 1])}
            entries.insert(rng.randrange(0, len(entries) + 1),
                           [e[f] for f in fields])
        for _ in range(rng.randrange(0, 3)):
            if entries:
                del entries[rng.randrange(len(entries))]
        for s in snap["segments"]:
            for b in s["blocks"]:
                if rng.random() < 0.3:
                    b["state"] = rng.choice(["allocated", "pending_free",
                                             "cached"])
        if rng.random() < 0.1:  # may overlap or leave the segment
            s = rng.choice(snap["segments"])
            s["blocks"][0]["address"] += rng.choice([-4096, 4096, 1])
        if "chunks" in snap and rng.random() < 0.3:
            # may overlap a chunk, or leave a segment (partly) outside
            c = rng.choice(snap["chunks"])
            c[rng.choice(["address", "size"])] += rng.choice(
                [-4096, 4096, 1 << 20, -(1 << 20)])
            c["size"] = max(c["size"], 4096)
        if "chunks" in snap and rng.random() < 0.2:  # a chunk left out
            del snap["chunks"][rng.randrange(len(snap["chunks"]))]
        src = os.path.join(work, "mutant.json")
        with open(src, "w") as f:
            json.dump(snap, f)
        r = run([args.pinpool, "snapshot", "torch", src, "-o", out])
        if not check(r.returncode in (0, 1), f"mutant {k}: exit "
                     f"{r.returncode}: {r.stderr.decode()}"):
            continue
        outcomes[r.returncode] += 1
        if r.returncode == 1:
            check(not os.path.exists(out), f"mutant {k}: OUT left")
            continue
        notes += b"left out" in r.stderr
        layout_notes[viz_layout(snap)[1]] = layout_notes.get(
            viz_layout(snap)[1], 0) + 1
        with open(out, "rb") as f:
            data = f.read()
        d = pickle.loads(data)
        check_structure(d, f"mutant {k}")
        check_js(data, d, f"mutant {k}", exact_ints=False)
        check(viewer_replay(d, f"mutant {k}"), f"mutant {k}: replay")
        check(d["segments"] == expected_pickle(snap)["segments"],
              f"mutant {k}: segments differ from the layout computed here")
        os.remove(out)
    print(f"mutants of {tag}: {outcomes[0]} converted ({notes} with entries "
          f"left out), {outcomes[1]} refused; layouts {layout_notes}")
    check(notes > 0 and outcomes[1] > 0, f"mutants of {tag}: no entries left "
          "out, or none refused: the mutations no longer reach those paths")
    if "chunks" in base:
        check(len(layout_notes) == 3, f"mutants of {tag}: not every layout "
              f"(by chunk, segments in no chunk, by segment): {layout_notes}")


def chunk_tests(args, work):
    """example_chunks.json: four chunks (two of them one run that a large
    block crosses, one all free), four segments, five free gaps."""
    src = args.example_chunks
    with open(src) as f:
        snap = json.load(f)
    d = full_checks(args, src, os.path.join(work, "chunks.pickle"),
                    allow_notes=False)
    if d is None:
        return
    A, M = snap["chunks"][0]["address"], 1 << 20
    segs = d["segments"]
    check([(s["address"] - A, s["total_size"]) for s in segs]
          == [(0, 12 * M), (64 * M, 2 * M), (96 * M, 4 * M)],
          "chunks: the chunks are the segments (the run crossed by a block "
          f"as one): {[(hex(s['address']), s['total_size']) for s in segs]}")
    run_blocks = [(b["address"] - A, b["size"], b["state"])
                  for b in segs[0]["blocks"]]
    check((3 * M, 2 * M, "active_allocated") in run_blocks
          and (6 * M, 4 * M, "inactive") in run_blocks
          and (2 * M, M, "inactive") in run_blocks
          and (10 * M, 2 * M, "inactive") in run_blocks,
          f"chunks: the run's blocks and gaps: {run_blocks}")
    check([(b["size"], b["state"]) for b in segs[1]["blocks"]]
          == [(2 * M, "inactive")], "chunks: the free chunk is one gap")
    check(sum(b["size"] for s in segs for b in s["blocks"])
          == sum(c["size"] for c in snap["chunks"]),
          "chunks: the blocks add up to the chunks' bytes")
    check([s["segment_type"] for s in segs] == ["large", "large", "small"],
          "chunks: segment types")
    seg_events = [(t["action"], t["addr"] - A) for t in d["device_traces"][0]
                  if t["action"].startswith("segment")]
    check(seg_events == [("segment_alloc", 64 * M),
                         ("segment_alloc", 96 * M)],
          f"chunks: the run's segment events are folded: {seg_events}")
    torch_tools(d, "example_chunks.json")

    # Snapshots of a busy pool: a segment in no chunk listed is shown on
    # its own; one partly in a chunk makes every segment shown on its own.
    outside = copy.deepcopy(snap)
    del outside["chunks"][3]
    partly = copy.deepcopy(snap)
    partly["chunks"][3]["size"] = M
    for tag, variant, want in (("outside", outside, "in no chunk listed"),
                               ("partly", partly, "partly outside")):
        vsrc = os.path.join(work, f"chunks-{tag}.json")
        with open(vsrc, "w") as f:
            json.dump(variant, f)
        dv = full_checks(args, vsrc, os.path.join(work, f"chunks-{tag}"
                                                  ".pickle"))
        r = run([args.pinpool, "snapshot", "torch", vsrc, "-o",
                 os.path.join(work, "note.pickle")])
        check(want in r.stderr.decode(), f"chunks-{tag}: note {want!r}: "
              f"{r.stderr.decode()}")
        if dv is not None and tag == "outside":
            check([s["address"] - A for s in dv["segments"]]
                  == [0, 64 * M, 96 * M] and dv["segments"][2]["total_size"]
                  == 2 * M, "chunks-outside: the segment on its own")
        if dv is not None and tag == "partly":
            check(len(dv["segments"]) == len(snap["segments"]),
                  "chunks-partly: one segment per pinpool segment")

    # Chunks the tool cannot lay out, or the reader refuses.
    cases = {}
    c = copy.deepcopy(snap)
    c["chunks"][1], c["chunks"][2] = c["chunks"][2], c["chunks"][1]
    cases["chunk-order.json"] = (c, "chunks[2].address: overlaps chunks[1]")
    c = copy.deepcopy(snap)
    c["chunks"][1]["address"] -= 4096
    cases["chunk-overlap.json"] = (c, "chunks[1].address: overlaps")
    c = copy.deepcopy(snap)
    c["chunks"][0]["free"][0] = [A]
    cases["chunk-range.json"] = (c, "chunks[0].free[0]: expected [address, "
                                 "size]")
    c = copy.deepcopy(snap)
    c["chunks"][2]["size"] = 0
    cases["chunk-size.json"] = (c, "chunks[2].size")
    c = copy.deepcopy(snap)
    c["chunks"] = {}
    cases["chunk-type.json"] = (c, "chunks: expected an array")
    c = copy.deepcopy(snap)
    c["chunks"][3]["flags"] = ["bogus"]
    cases["chunk-flag.json"] = (c, "chunks[3].flags[0]: expected one of")
    out = os.path.join(work, "bad.pickle")
    for fname, (content, want) in cases.items():
        bsrc = os.path.join(work, fname)
        with open(bsrc, "w") as f:
            json.dump(content, f)
        r = run([args.pinpool, "snapshot", "torch", bsrc, "-o", out])
        err = r.stderr.decode()
        check(r.returncode == 1 and not os.path.exists(out),
              f"{fname}: exit {r.returncode} (want 1), no OUT")
        check(fname in err and want in err, f"{fname}: the message says "
              f"{want!r}: {err}")
    mutant_tests(args, work, src, count=100)


def interpreter_tests(args, work):
    """Without PINPOOL_TORCH_VERSION the tool asks interpreters for torch's
    version, in turn: $PINPOOL_PYTHON, python3 on PATH, /usr/bin/python3,
    python; the first that imports torch decides (issue 41, second round:
    python3 on PATH was a pyenv Python without torch, the tool wrote the
    new layout, and /usr/bin/python3's torch 1.13 refused it)."""
    fake = os.path.join(work, "fakebin")
    shutil.rmtree(fake, ignore_errors=True)
    os.makedirs(fake)

    def interpreter(name, version):
        # Answers `-c 'import torch; print(torch.__version__)'` as an
        # interpreter with that torch would, or fails as one without.
        path = os.path.join(fake, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + (f"echo {version}\n" if version else
                                     "echo 'No module named torch' >&2\n"
                                     "exit 1\n"))
        os.chmod(path, 0o755)
        return path

    def convert(path_first, pinpool_python=None):
        out = os.path.join(work, "interp.pickle")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PINPOOL_TORCH_VERSION", "PINPOOL_PYTHON")}
        env["PATH"] = path_first + os.pathsep + env.get("PATH", "")
        if pinpool_python:
            env["PINPOOL_PYTHON"] = pinpool_python
        r = run([args.pinpool, "snapshot", "torch", args.example, "-o", out],
                env=env, timeout=120)
        if not check(r.returncode == 0, f"interpreters: exit {r.returncode}:"
                     f" {r.stderr.decode()}"):
            return None, r.stderr.decode()
        with open(out, "rb") as f:
            return pickle.loads(f.read()), r.stderr.decode()

    # An interpreter that never answers (the review of issue 41, second
    # round: the command waited for it forever) is given
    # $PINPOOL_PYTHON_TIMEOUT, killed with what it started, and passed over.
    interpreter("python3", "1.8.1")
    hang = os.path.join(fake, "hang")
    pids = os.path.join(work, "hang.pids")
    with open(hang, "w") as f:
        f.write(f"#!/bin/sh\necho $$ > {pids}\nsleep 100000 &\n"
                f"echo $! >> {pids}\nwait\n")
    os.chmod(hang, 0o755)
    os.environ["PINPOOL_PYTHON_TIMEOUT"] = "0.5"
    try:
        d, err = convert(fake, hang)
    except subprocess.TimeoutExpired:
        d, err = None, "timed out"
    finally:
        del os.environ["PINPOOL_PYTHON_TIMEOUT"]
    check(type(d) is list and "as python3 -c" in err,
          f"a hung PINPOOL_PYTHON is passed over: {err}")
    with open(pids) as f:
        for pid in map(int, f.read().split()):
            try:
                with open(f"/proc/{pid}/stat") as st:
                    state = st.read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                state = "gone"
            check(state in ("gone", "Z"), f"the hung interpreter's process "
                  f"{pid} was killed (state {state})")
    # The order: $PINPOOL_PYTHON before python3 on PATH; one without torch
    # is passed over.
    d, err = convert(fake, interpreter("with2", "2.1.0"))
    check(type(d) is dict, "PINPOOL_PYTHON's torch 2 beats python3's 1.x")
    d, err = convert(fake, interpreter("without", None))
    check(type(d) is list and "as python3 -c" in err,
          f"PINPOOL_PYTHON without torch: python3 on PATH decides: {err}")
    # python3 on PATH without torch (the pyenv shim of issue 41): the
    # system's interpreter decides, and its own _memory_viz reads the
    # result.
    interpreter("python3", None)
    d, err = convert(fake)
    r = run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"])
    if r.returncode != 0:
        print("interpreters: /usr/bin/python3 has no torch; its check skipped")
        return
    if int(r.stdout.decode().split(".")[0]) < 2:
        check(type(d) is list and "/usr/bin/python3" in err, f"python3 on "
              f"PATH without torch: /usr/bin/python3's 1.x decides: {err}")
    else:
        check(type(d) is dict, "/usr/bin/python3's torch 2 decides")
    r = run(["/usr/bin/python3", "-m", "torch.cuda._memory_viz", "stats",
             os.path.join(work, "interp.pickle")], cwd=work, timeout=300)
    check(r.returncode == 0, f"/usr/bin/python3 -m torch.cuda._memory_viz "
          f"stats refused the default layout: {r.stderr.decode()[-500:]}")


def layout_tests(args, work, new):
    """--layout and the default (issue 41, 2): "old" is torch 1.x's bare
    list of the same segments, each active block with a one-entry history
    (addr, real_size = the requested size, frames); without --layout the
    installed torch's version decides (PINPOOL_TORCH_VERSION here)."""
    src = args.example

    def convert_with(extra, version):
        out = os.path.join(work, "layout.pickle")
        env = dict(os.environ, PINPOOL_TORCH_VERSION=version)
        r = run([args.pinpool, "snapshot", "torch", src, "-o", out] + extra,
                env=env)
        if not check(r.returncode == 0, f"layout {extra} {version}: exit "
                     f"{r.returncode}: {r.stderr.decode()}"):
            return None, r.stderr.decode()
        with open(out, "rb") as f:
            return pickle.loads(f.read()), r.stderr.decode()

    old, err = convert_with(["--layout", "old"], "2.1.0")
    if old is not None and check(type(old) is list, "--layout old: a list"):
        check(err == "", f"--layout old: unexpected message: {err}")
        check(len(old) == len(new["segments"]), "--layout old: segments")
        for so, sn in zip(old, new["segments"]):
            for k in sn:
                check(so[k] == sn[k] if k != "blocks" else
                      len(so[k]) == len(sn[k]), f"--layout old: segment {k}")
            for bo, bn in zip(so["blocks"], sn["blocks"]):
                h = bo.pop("history", None)
                check(bo == bn, "--layout old: block differs")
                if bn["state"] == "inactive":
                    check(h is None, "--layout old: history of a free block")
                else:
                    check(h == [{"addr": bn["address"],
                                 "real_size": bn["requested_size"],
                                 "frames": bn["frames"]}],
                          f"--layout old: history {h}")
        torch_tools({"segments": old, "old": True}, "example.json (old)")
    for version, want in (("1.13.0a0", list), ("1.8.1", list),
                          ("2.1.0+cu121", dict), ("10.0", dict)):
        d, err = convert_with([], version)
        check(type(d) is want, f"PINPOOL_TORCH_VERSION={version}: "
              f"{type(d).__name__}, want {want.__name__}")
        check("the old layout" in err if want is list else err == "",
              f"PINPOOL_TORCH_VERSION={version}: the note (only for the "
              f"old layout): {err}")
    d, err = convert_with(["--layout=new"], "1.13.0")
    check(type(d) is dict, "--layout=new beats the installed version")
    interpreter_tests(args, work)
    for bad in (["--layout", "newer"], ["--layout"],
                ["--layout", "old", "--layout", "new"]):
        r = run([args.pinpool, "snapshot", "torch", src, "-o",
                 os.path.join(work, "bad.pickle")] + bad)
        check(r.returncode == 2 and b"--layout" in r.stderr,
              f"{bad}: exit {r.returncode}: {r.stderr!r}")


def case_example(args, work):
    d = full_checks(args, args.example, os.path.join(work, "example.pickle"),
                    allow_notes=False)
    if d is not None:
        layout_tests(args, work, d)
    if d is not None:
        with open(os.path.join(work, "example.pickle"), "rb") as f:
            stream_tests(args, work, f.read())
        torch_tools(d, "example.json")
    bad_input_tests(args, work)
    inconsistent_tests(args, work)
    mutant_tests(args, work, args.example)
    chunk_tests(args, work)


def case_snapgen(args, work):
    if not args.snapgen:
        check(False, "snapgen: --snapgen not given")
        return
    # With streams (pending blocks, free_requested and free_completed
    # apart), three threads and an empty_cache; then without symbols.
    for tag, extra in (("streams", ["--streams", "--threads", "3"]),
                       ("nosym", ["--no-symbols", "--live", "300"])):
        src = os.path.join(work, f"snapgen-{tag}.json")
        try:
            r = run([args.snapgen, src, "--history", "50000"] + extra,
                    timeout=120)
        except subprocess.TimeoutExpired:
            check(False, f"pp_snapgen {tag}: did not finish in 120 s")
            continue
        if not check(r.returncode == 0, f"pp_snapgen {tag}: exit "
                     f"{r.returncode}: {r.stderr.decode()}"):
            continue
        d = full_checks(args, src, os.path.join(work, f"{tag}.pickle"))
        if d is None:
            continue
        with open(src) as f:
            snap = json.load(f)
        # Written once the threads joined: the chunks tile, and they are
        # the pickle's segments (check_chunk_segments compared the gaps).
        check("chunks" in snap and tiles(snap) and viz_layout(snap)[1] is None,
              f"{tag}: the snapshot's segments and free ranges tile its "
              "chunks")
        acts = {t["action"] for t in d["device_traces"][0]}
        check({"alloc", "free_requested", "free_completed",
               "segment_alloc"} <= acts, f"{tag}: actions {sorted(acts)}")
        if tag == "streams":
            states = {b["state"] for s in d["segments"] for b in s["blocks"]}
            check(states == set(STATES.values()),
                  f"{tag}: block states {sorted(states)}")
            names = {f["name"] for s in d["segments"] for b in s["blocks"]
                     for f in b["frames"]}
            check({"stage_batch", "stage_weights"} <= names,
                  "streams: the call sites are not in the frames")
        torch_tools(d, f"snapgen-{tag}")


def case_written(args, work):
    """Snapshots of busy pools written by test_snapshot (writer.cmake):
    taken while threads allocate, so entries may be left out."""
    files = sorted(f for f in os.listdir(args.written)
                   if f.endswith(".json")) if args.written and \
        os.path.isdir(args.written) else []
    if not files:
        print(f"written: no snapshots in {args.written} (test_snapshot "
              "writes them); nothing to check")
        return
    for i, f in enumerate(files):
        d = full_checks(args, os.path.join(args.written, f),
                        os.path.join(work, f"written-{i}.pickle"))
        if d is not None and i == 0:
            torch_tools(d, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pinpool", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--example-chunks", help="a snapshot with chunks "
                    "(default: example_chunks.json beside --example)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--snapgen")
    ap.add_argument("--written", help="directory of snapshots to convert")
    ap.add_argument("case", choices=("example", "snapgen", "written"))
    args = ap.parse_args()
    # The dict layout (torch >= 2), which these checks describe, unless a
    # test asks for another (layout_tests): not the installed torch's.
    os.environ["PINPOOL_TORCH_VERSION"] = "2.0.0"
    if args.example_chunks is None:
        args.example_chunks = os.path.join(os.path.dirname(args.example),
                                           "example_chunks.json")
    work = os.path.join(args.workdir, args.case)
    os.makedirs(work, exist_ok=True)
    for f in os.listdir(work):
        if os.path.isdir(os.path.join(work, f)):
            shutil.rmtree(os.path.join(work, f))
        else:
            os.remove(os.path.join(work, f))
    {"example": case_example, "snapgen": case_snapgen,
     "written": case_written}[args.case](args, work)
    if failures:
        print(f"{failures} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
