#!/usr/bin/env python3
"""Tests of `pinpool snapshot summary` and `pinpool snapshot diff`.

    test_cli.py --cli PINPOOL --example EXAMPLE.json --work DIR CASE
                [--snapgen PP_SNAPGEN] [--large-entries N]

CASE is one of: summary, json, diff, identity, errors, usage, large,
snapgen. Each is registered as its own ctest test (tests/snapshot/cli.cmake).
The expected numbers of the example are worked out by hand from
tests/snapshot/example.json (two segments, blocks: allocated 4096 B and
2 MiB, one pending 4096 B block, two cached ones, 508 uncarved), so the
tests check the tool against the format, not against itself.
"""
import argparse
import copy
import json
import os
import re
import subprocess
import sys

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what)


def run(args, stdin=None, expect_rc=None):
    p = subprocess.run([ARGS.cli] + args, input=stdin, capture_output=True,
                       text=True, timeout=300)
    if expect_rc is not None:
        check(p.returncode == expect_rc,
              "pinpool %s: exit %d, expected %d\nstdout:\n%s\nstderr:\n%s" %
              (" ".join(args), p.returncode, expect_rc, p.stdout[-3000:],
               p.stderr[-3000:]))
    check(p.returncode in (0, 1, 2),
          "pinpool %s: exit %d (crash?)\n%s" % (" ".join(args), p.returncode,
                                                p.stderr[-3000:]))
    return p


def load_example():
    with open(ARGS.example) as f:
        return json.load(f)


def write_json(name, doc):
    path = os.path.join(ARGS.work, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def write_text(name, text):
    path = os.path.join(ARGS.work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def line_with(out, prefix):
    """The first line starting (after indentation) with prefix."""
    for line in out.splitlines():
        if line.strip().startswith(prefix):
            return line
    check(False, "no line starting with %r in:\n%s" % (prefix, out))
    return ""


def numbers(line):
    return [int(x) for x in re.findall(r"(?<![\w.])[+-]?\d+(?![\w.])", line)]


def row(out, label):
    """(count, bytes) of a 'label  COUNT  BYTES  (HUMAN)' row."""
    line = line_with(out, label)
    rest = line.strip()[len(label):]
    nums = numbers(rest.split("(")[0])
    return tuple(nums)


def site_rows(out):
    """The rows of the top-sites table: (bytes, blocks, requested, site)."""
    rows, on = [], False
    for line in out.splitlines():
        if line.startswith("top ") and "allocation sites" in line:
            on = True
            continue
        if on:
            m = re.match(r"\s+(\d+)\s+\([^)]*\)\s+(\d+)\s+(\d+)\s+(.*)$", line)
            if m:
                rows.append((int(m.group(1)), int(m.group(2)),
                             int(m.group(3)), m.group(4)))
            elif line.strip() == "" or not line.startswith(" "):
                on = False
    return rows


def diff_rows(out):
    """(delta bytes, delta blocks, A bytes, B bytes, A blocks, B blocks,
    site) of the diff's site table."""
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s+([+-]\d+|0)\s+([+-]\d+|0)\s+(\d+)\s+(\d+)\s+(\d+)"
                     r"\s+(\d+)\s+(\S.*)$", line)
        if m:
            rows.append(tuple(int(m.group(k)) for k in range(1, 7)) +
                        (m.group(7),))
    return rows


def diff_total(out, name):
    """(A, B, delta) of a totals row of diff."""
    line = line_with(out, name + " ")
    return tuple(numbers(line.split("(")[0]))


# ---- cases ------------------------------------------------------------------

def case_summary():
    p = run(["snapshot", "summary", ARGS.example], expect_rc=0)
    out = p.stdout
    check(p.stderr == "", "summary wrote to stderr: " + p.stderr)
    check("pid 4242" in out and "backend host" in out, "header: pid/backend")
    check("backend=host,mlock=try" in out, "header: config")
    check("2025-11-30 16:00:00 UTC" in out, "header: wall-clock time")
    check(re.search(r"segments\s+2, 4194304 bytes", out) is not None,
          "segments count and bytes")
    check(row(out, "page_locked") == (2, 4194304), "page_locked row")
    check(row(out, "huge_advised") == (1, 2097152), "huge_advised row")
    check(row(out, "mlock_failed") == (0, 0), "mlock_failed row")
    check(row(out, "allocated") == (2, 2101248), "allocated row")
    check(row(out, "pending_free") == (1, 4096), "pending_free row")
    check(row(out, "cached") == (2, 8192), "cached row")
    check(row(out, "uncarved") == (508, 2080768), "uncarved row")
    # 2101248 block bytes - 2005000 requested = 96248 B = 4.58 %.
    waste = line_with(out, "rounding waste")
    check("96248 bytes" in waste and "4.58 %" in waste and
          "requested 2005000" in waste, "rounding waste: " + waste)
    # Segment 0: blocks 2 and 3 cached, then 508 uncarved: one run of 510
    # blocks, all the free memory; it holds live blocks.
    check(numbers(line_with(out, "free in segments"))[0] == 2088960,
          "free in segments")
    run_line = line_with(out, "largest free run")
    check("2088960" in run_line and "510 adjacent blocks of 4096" in run_line,
          "largest free run: " + run_line)
    check(re.search(r"fragmentation\s+0\.00 %", out) is not None,
          "fragmentation 0 %")
    check("free blocks in 1 segments" in line_with(out, "in used segments"),
          "in used segments")
    check("reserved  4194304 = allocated 2101248 + pending 4096 + cached "
          "2088960" in out, "identity line")
    check("identity OK" in out, "identity OK")
    # The example's stats were read with the pending block still cached.
    check("cached_bytes 2093056 (totals 2088960)" in out,
          "stats vs totals difference")
    check("5 kept, 5 recorded, 0 dropped" in out, "history entries")
    check("4.00 us" in line_with(out, "span"), "history span")
    check(row(out, "alloc ") == (3,), "alloc action count")
    check(row(out, "segment_alloc") == (1,), "segment_alloc count")
    check(row(out, "free_requested") == (1,), "free_requested count")
    check(row(out, "oom") == (0,), "oom count")
    sites = site_rows(out)
    check(sites == [(2097152, 1, 2001000, "stage_weights+0x10"),
                    (8192, 2, 7000, "load_batch (loader.c:88)")],
          "top sites: %r" % (sites,))
    check("top 2 of 2 allocation sites" in out, "top sites header")

    # --top 1, and --top=1.
    for opt in (["--top", "1"], ["--top=1"]):
        p = run(["snapshot", "summary", ARGS.example] + opt, expect_rc=0)
        check(site_rows(p.stdout) == [(2097152, 1, 2001000,
                                       "stage_weights+0x10")],
              "--top 1: %r" % (site_rows(p.stdout),))
        check("top 1 of 2 allocation sites" in p.stdout, "--top 1 header")
    # Standard input gives the same report.
    with open(ARGS.example) as f:
        p = run(["snapshot", "summary", "-"], stdin=f.read(), expect_rc=0)
    check(site_rows(p.stdout) == sites, "summary of stdin")
    check("snapshot (stdin)" in p.stdout, "stdin named (stdin)")
    # Options before the file; --help.
    run(["snapshot", "summary", "--top", "5", ARGS.example], expect_rc=0)
    p = run(["snapshot", "summary", "--help"], expect_rc=0)
    check("usage: pinpool snapshot summary" in p.stdout, "summary --help")

    # A site whose innermost frame has no symbol, one with a file but no
    # line, and a block without a stack.
    doc = load_example()
    doc["frames"].append({"address": 3735928559, "function": None,
                          "offset": 0, "module": None, "file": None,
                          "line": None})
    doc["frames"].append({"address": 1, "function": "f", "offset": 0,
                          "module": None, "file": "g.c", "line": None})
    doc["stacks"] += [[3], [4, 1]]
    blocks = doc["segments"][0]["blocks"]
    blocks[2].update(state="allocated", requested_size=10, stack=2,
                     thread=1)
    blocks[3].update(state="allocated", requested_size=20, stack=None,
                     thread=None)
    doc["segments"][0]["blocks"].append(
        {"address": 140000000016384, "state": "allocated",
         "requested_size": 30, "streams": [], "thread": 1, "stack": 3})
    doc["segments"][0]["uncarved_blocks"] = 507
    t = doc["totals"]
    t.update(allocated_bytes=t["allocated_bytes"] + 3 * 4096,
             allocated_blocks=5, requested_bytes=t["requested_bytes"] + 60,
             cached_bytes=t["cached_bytes"] - 3 * 4096, cached_blocks=0,
             uncarved_bytes=507 * 4096)
    path = write_json("sites.json", doc)
    p = run(["snapshot", "summary", path, "--top", "0"], expect_rc=0)
    names = [r[3] for r in site_rows(p.stdout)]
    # Equal bytes and blocks: by name.
    check(names == ["stage_weights+0x10", "load_batch (loader.c:88)",
                    "(no stack)", "0xdeadbeef", "f (g.c)"],
          "site names: %r" % (names,))
    check("identity OK" in p.stdout, "identity of sites.json")


def case_json():
    p = run(["snapshot", "summary", ARGS.example, "--json"], expect_rc=0)
    j = json.loads(p.stdout)
    check(j["pid"] == 4242 and j["backend"] == "host", "json header")
    check(j["segments"]["count"] == 2 and j["segments"]["bytes"] == 4194304,
          "json segments")
    check(j["segments"]["page_locked"] == {"blocks": 2, "bytes": 4194304},
          "json page_locked")
    b = j["blocks"]
    check(b["allocated"] == {"blocks": 2, "bytes": 2101248}, "json allocated")
    check(b["pending_free"] == {"blocks": 1, "bytes": 4096}, "json pending")
    check(b["cached"] == {"blocks": 2, "bytes": 8192}, "json cached")
    check(b["uncarved"] == {"blocks": 508, "bytes": 2080768},
          "json uncarved")
    check(j["rounding"]["waste_bytes"] == 96248, "json waste")
    check(abs(j["rounding"]["waste_percent"] - 4.5804) < 0.001,
          "json waste percent")
    check(j["fragmentation"]["largest_run_bytes"] == 2088960 and
          j["fragmentation"]["fragmentation_percent"] == 0,
          "json fragmentation")
    check(j["identity"] == {"ok": True, "problem_count": 0, "problems": []},
          "json identity")
    h = j["history"]
    check(h["entries"] == 5 and h["span_ns"] == 4000 and
          h["actions"]["alloc"] == 3 and h["actions"]["oom"] == 0,
          "json history")
    check(j["site_count"] == 2 and j["sites"] == [
        {"site": "stage_weights+0x10", "bytes": 2097152, "blocks": 1,
         "requested": 2001000},
        {"site": "load_batch (loader.c:88)", "bytes": 8192, "blocks": 2,
         "requested": 7000}], "json sites: %r" % (j["sites"],))
    # A site name longer than the tool keeps (1023 bytes) is cut at a
    # character, so that the JSON output stays UTF-8.
    doc = load_example()
    doc["frames"][0]["function"] = "\u00e9" * 600
    path = write_json("long_site.json", doc)
    p = run(["snapshot", "summary", path, "--json"], expect_rc=0)
    j = json.loads(p.stdout)
    name = j["sites"][1]["site"]
    check(name == "\u00e9" * 511, "cut site: %d characters" % len(name))
    # A file name that is not UTF-8.
    raw = os.path.join(ARGS.work, os.fsdecode(b"ex\xff.json"))
    with open(ARGS.example) as src, open(raw, "w") as dst:
        dst.write(src.read())
    p = run(["snapshot", "summary", raw, "--json"], expect_rc=0)
    check(json.loads(p.stdout)["file"].endswith("ex?.json"),
          "non-UTF-8 file name")

    p = run(["snapshot", "diff", ARGS.example, ARGS.example, "--json"],
            expect_rc=0)
    j = json.loads(p.stdout)
    check(j["sites"] == [], "json self-diff has no sites")
    check(all(v["delta"] == 0 for v in j["totals"].values()),
          "json self-diff totals")


def grown_example():
    """The example with one more live block of load_batch: block 2 of
    segment 0 goes from cached to allocated (4096 B, requested 4000)."""
    doc = load_example()
    doc["segments"][0]["blocks"][2].update(
        state="allocated", requested_size=4000, thread=4243, stack=0)
    t = doc["totals"]
    t.update(allocated_bytes=2105344, allocated_blocks=3,
             requested_bytes=2009000, cached_bytes=2084864, cached_blocks=1)
    return doc


def case_diff():
    p = run(["snapshot", "diff", ARGS.example, ARGS.example], expect_rc=0)
    out = p.stdout
    check("sites: 2 in A, 2 in B; 0 grew, 0 shrank, 2 unchanged" in out,
          "self-diff site counts:\n" + out)
    check("no growth" in out, "self-diff says no growth")
    check(diff_rows(out) == [], "self-diff lists no site")
    for name in ("reserved", "allocated", "pending_free", "cached",
                 "live_blocks"):
        check(diff_total(out, name)[2] == 0, "self-diff total " + name)
    check(diff_total(out, "reserved") == (4194304, 4194304, 0),
          "self-diff reserved row")

    grown = write_json("grown.json", grown_example())
    run(["snapshot", "summary", grown], expect_rc=0)  # a valid snapshot
    p = run(["snapshot", "diff", ARGS.example, grown], expect_rc=0)
    out = p.stdout
    rows = diff_rows(out)
    check(rows == [(4096, 1, 8192, 12288, 2, 3, "load_batch (loader.c:88)")],
          "diff rows: %r\n%s" % (rows, out))
    check("1 grew, 0 shrank, 1 unchanged" in out, "diff counts")
    check(diff_total(out, "allocated") == (2101248, 2105344, 4096),
          "diff allocated")
    check(diff_total(out, "cached") == (2088960, 2084864, -4096),
          "diff cached")
    check(diff_total(out, "reserved")[2] == 0, "diff reserved")
    check(diff_total(out, "pending_free")[2] == 0, "diff pending")
    check(diff_total(out, "live_blocks") == (3, 4, 1), "diff live blocks")
    # The other way round it shrank.
    p = run(["snapshot", "diff", grown, ARGS.example], expect_rc=0)
    check(diff_rows(p.stdout) ==
          [(-4096, -1, 12288, 8192, 3, 2, "load_batch (loader.c:88)")],
          "reverse diff: %r" % (diff_rows(p.stdout),))
    check("0 grew, 1 shrank" in p.stdout, "reverse diff counts")

    # Growth first, then shrinking, then sites only in A or only in B.
    doc = grown_example()
    doc["segments"][1]["blocks"][0].update(state="cached", requested_size=0,
                                           thread=None, stack=None)
    t = doc["totals"]
    t.update(allocated_bytes=t["allocated_bytes"] - 2097152,
             allocated_blocks=2,
             requested_bytes=t["requested_bytes"] - 2001000,
             cached_bytes=t["cached_bytes"] + 2097152, cached_blocks=2)
    mixed = write_json("mixed.json", doc)
    run(["snapshot", "summary", mixed], expect_rc=0)
    p = run(["snapshot", "diff", ARGS.example, mixed], expect_rc=0)
    rows = diff_rows(p.stdout)
    check([r[6] for r in rows] == ["load_batch (loader.c:88)",
                                   "stage_weights+0x10"],
          "mixed diff order: %r" % (rows,))
    check(rows[-1][:6] == (-2097152, -1, 2097152, 0, 1, 0),
          "mixed diff: stage_weights gone: %r" % (rows,))
    check("sites: 2 in A, 1 in B; 1 grew, 1 shrank, 0 unchanged" in p.stdout,
          "mixed diff counts")
    # --top 1 keeps the largest growth.
    p = run(["snapshot", "diff", ARGS.example, mixed, "--top", "1"],
            expect_rc=0)
    check([r[6] for r in diff_rows(p.stdout)] == ["load_batch (loader.c:88)"],
          "diff --top 1")
    # One side from stdin.
    with open(grown) as f:
        p = run(["snapshot", "diff", ARGS.example, "-"], stdin=f.read(),
                expect_rc=0)
    check(len(diff_rows(p.stdout)) == 1, "diff with B on stdin")


def case_identity():
    # A totals field that does not match the blocks: exit 1, named.
    doc = load_example()
    doc["totals"]["cached_bytes"] += 512
    doc["totals"]["reserved_bytes"] += 512
    path = write_json("bad_totals.json", doc)
    p = run(["snapshot", "summary", path], expect_rc=1)
    check("identity FAILED" in p.stdout, "identity FAILED reported")
    check("totals.cached_bytes 2089472 != 2088960 summed from the segments"
          in p.stdout, "cached_bytes mismatch named:\n" + p.stdout)
    check("totals: reserved_bytes 4194816 != segment_bytes 4194304" in
          p.stdout, "reserved vs segments mismatch named")
    p = run(["snapshot", "summary", path, "--json"], expect_rc=1)
    j = json.loads(p.stdout)
    check(j["identity"]["ok"] is False and j["identity"]["problem_count"] == 2,
          "json identity failure: %r" % (j["identity"],))
    # reserved != allocated + pending + cached.
    doc = load_example()
    doc["totals"]["allocated_bytes"] += 4096
    p = run(["snapshot", "summary", write_json("bad_sum.json", doc)],
            expect_rc=1)
    check("totals: reserved_bytes 4194304 != allocated 2105344 + pending "
          "4096 + cached 2088960" in p.stdout, "sum mismatch named")
    # A segment whose size does not split into its blocks.
    doc = load_example()
    doc["segments"][0]["uncarved_blocks"] = 100
    p = run(["snapshot", "summary", write_json("bad_seg.json", doc)],
            expect_rc=1)
    check("segments[0]: size 2097152 != block_size 4096 * (4 listed + 100 "
          "uncarved blocks) + tail 0" in p.stdout, "segment mismatch named")
    # A block outside its segment.
    doc = load_example()
    doc["segments"][0]["blocks"][3]["address"] = 140000000012289
    p = run(["snapshot", "summary", write_json("bad_addr.json", doc)],
            expect_rc=1)
    check("segments[0].blocks[3]: address 0x7f544a44f001 is not a block" in
          p.stdout, "misplaced block named:\n" + p.stdout)
    # diff does not judge the identity.
    run(["snapshot", "diff", path, ARGS.example], expect_rc=0)


def error_case(label, args, rc, pattern, stdin=None):
    p = run(args, stdin=stdin, expect_rc=rc)
    check(re.search(pattern, p.stderr) is not None,
          "%s: stderr %r does not match %r" % (label, p.stderr, pattern))
    check(p.stdout == "", "%s: wrote to stdout: %r" % (label, p.stdout))


def case_errors():
    with open(ARGS.example) as f:
        text = f.read()
    S = ["snapshot", "summary"]
    missing = os.path.join(ARGS.work, "does-not-exist.json")
    error_case("nonexistent", S + [missing], 1,
               re.escape(missing) + r": cannot open: No such file")
    error_case("directory", S + [ARGS.work], 1, r": cannot read: ")
    error_case("empty", S + [write_text("empty.json", "")], 1,
               r"empty\.json: empty file")
    error_case("blank", S + [write_text("blank.json", "  \n")], 1,
               r"blank\.json: line \d+, column \d+ \(byte \d+\): ")
    # Cut in the middle: line 40 of the example is a block.
    cut = len(text) // 2
    line = text[:cut].count("\n") + 1
    error_case("truncated", S + [write_text("truncated.json", text[:cut])], 1,
               r"truncated\.json: line %d, column \d+ \(byte %d\): \S" %
               (line, cut))
    error_case("garbage", S + [write_text("garbage.json", text + "x")], 1,
               r"garbage\.json: line \d+, column \d+ \(byte \d+\): "
               r"end of file expected")
    error_case("duplicate key",
               S + [write_text("dup.json",
                               text.replace('"pid": 4242,',
                                            '"pid": 4242, "pid": 1,'))], 1,
               r"dup\.json: line 5, column \d+ \(byte \d+\): duplicate "
               r"object key")
    error_case("not json object", S + ["-"], 1,
               r"\(stdin\): expected a JSON object, got an array", stdin="[]")

    def variant(name, mutate, pattern):
        doc = load_example()
        mutate(doc)
        error_case(name, S + [write_json(name + ".json", doc)], 1,
                   re.escape(name + ".json: ") + pattern)

    variant("format", lambda d: d.update(format="other-snapshot"),
            r'format: expected "pinpool-snapshot" \(not a pinpool snapshot\)')
    variant("noformat", lambda d: d.pop("format"),
            r'format: expected "pinpool-snapshot"')
    variant("version", lambda d: d.update(version=2),
            r"version: unsupported version 2 \(this reader reads version 1\)")
    variant("version_type", lambda d: d.update(version="1"),
            r"version: expected an integer, got a string")
    variant("state", lambda d: d["segments"][0]["blocks"][3].update(
        state="weird"), re.escape("segments[0].blocks[3].state: expected one "
                                  "of allocated, pending_free, cached"))
    variant("stack_range", lambda d: d["segments"][1]["blocks"][0].update(
        stack=2), re.escape("segments[1].blocks[0].stack: index 2 out of "
                            "range (2 stacks)"))
    variant("frame_range", lambda d: d["stacks"][1].append(3),
            re.escape("stacks[1][2]: index 3 out of range (3 frames)"))
    variant("entry_stack", lambda d: d["history"]["entries"][4].__setitem__(
        8, 7), re.escape("history.entries[4][8]: index 7 out of range "
                         "(2 stacks)"))
    variant("entry_action", lambda d: d["history"]["entries"][1].__setitem__(
        2, "malloc"), re.escape("history.entries[1][2]: expected one of "
                                "segment_alloc, alloc,"))
    variant("entry_len", lambda d: d["history"]["entries"][0].pop(),
            re.escape("history.entries[0]: expected 9 fields, got 8"))
    variant("negative", lambda d: d["segments"][0]["blocks"][0].update(
        requested_size=-1), re.escape("segments[0].blocks[0].requested_size:"
                                      " expected an integer >= 0, got -1"))
    variant("string_size", lambda d: d["segments"][1].update(size="2M"),
            re.escape("segments[1].size: expected a positive integer, got a "
                      "string"))
    variant("real_addr", lambda d: d["segments"][1].update(address=1.5),
            re.escape("segments[1].address: expected a non-negative "
                      "integer, got a real number"))
    variant("block_size", lambda d: d["segments"][0].update(block_size=0),
            re.escape("segments[0].block_size: expected an integer >= 512, "
                      "got 0"))
    variant("class", lambda d: d["segments"][0].update(**{"class": 409}),
            re.escape("segments[0].class: expected an integer in [0, 408], "
                      "got 409"))
    variant("flag", lambda d: d["segments"][0]["flags"].append("pinned"),
            re.escape("segments[0].flags[1]: expected one of page_locked, "
                      "mlock_failed, huge_advised, reserve"))
    variant("dup_flag", lambda d: d["segments"][0]["flags"].append(
        "page_locked"), re.escape("segments[0].flags[1]: duplicate flag "
                                  "page_locked"))
    variant("stream", lambda d: d["segments"][0]["blocks"][1].update(
        streams=["0x7", "0X8"]), re.escape(
            'segments[0].blocks[1].streams[1]: expected a stream handle ("0x"'
            ' and 1 to 16 lowercase hex digits)'))
    variant("stream_long", lambda d: d["segments"][0]["blocks"][1].update(
        streams=["0x" + "f" * 17]), re.escape(
            "segments[0].blocks[1].streams[0]: expected a stream handle"))
    variant("stream_int", lambda d: d["segments"][0]["blocks"][1].update(
        streams=[7]), re.escape("segments[0].blocks[1].streams[0]: expected "
                                "a stream handle string, got an integer"))
    variant("entry_stream", lambda d: d["history"]["entries"][3].__setitem__(
        6, 7), re.escape("history.entries[3][6]: expected a stream handle "
                         "string or null, got an integer"))
    variant("thread", lambda d: d["segments"][0]["blocks"][1].update(
        thread=True), re.escape("segments[0].blocks[1].thread: expected a "
                                "non-negative integer or null, got true"))
    variant("missing_totals", lambda d: d["totals"].pop("tail_bytes"),
            re.escape("totals.tail_bytes: missing"))
    variant("stats_field", lambda d: d["stats"]["reclaim"].update(
        max_ns=None), re.escape("stats.reclaim.max_ns: expected a "
                                "non-negative integer, got null"))
    variant("frame_name", lambda d: d["frames"][0].update(function=5),
            re.escape("frames[0].function: expected a string or null, got "
                      "an integer"))
    variant("segments_type", lambda d: d.update(segments={}),
            re.escape("segments: expected an array, got an object"))
    variant("record", lambda d: d["history"].update(record="some"),
            re.escape("history.record: expected one of none, state, alloc, "
                      "all"))
    variant("fields", lambda d: d["history"]["fields"].reverse(),
            re.escape('history.fields[0]: expected "seq"'))
    variant("pid", lambda d: d.update(pid=0),
            re.escape("pid: expected an integer >= 1, got 0"))
    # diff names the file that failed, A or B.
    bad = os.path.join(ARGS.work, "state.json")
    error_case("diff bad B", ["snapshot", "diff", ARGS.example, bad], 1,
               r"^pinpool snapshot diff: .*state\.json: segments\[0\]")
    error_case("diff bad A", ["snapshot", "diff", missing, ARGS.example], 1,
               r"^pinpool snapshot diff: .*does-not-exist\.json: cannot open")
    # Binary garbage never crashes.
    p = run(S + [write_text("binary.json", "{\"format\x00\xff")])
    check(p.returncode == 1, "binary garbage: exit %d" % p.returncode)


def case_usage():
    U = r"Run 'pinpool help snapshot' for usage"
    error_case("no subcommand", ["snapshot"], 2,
               r"a subcommand is required")
    error_case("unknown subcommand", ["snapshot", "sumary"], 2,
               r"unknown subcommand 'sumary'")
    error_case("summary no file", ["snapshot", "summary"], 2,
               r"summary: expected a snapshot FILE\n" + U)
    error_case("summary two files", ["snapshot", "summary", "a", "b"], 2,
               r"summary: unexpected argument 'b'")
    error_case("diff one file", ["snapshot", "diff", ARGS.example], 2,
               r"diff: expected two snapshot files A and B")
    error_case("diff three files", ["snapshot", "diff", "a", "b", "c"], 2,
               r"diff: unexpected argument 'c'")
    error_case("diff stdin twice", ["snapshot", "diff", "-", "-"], 2,
               r"standard input can be read once only")
    error_case("top value", ["snapshot", "summary", ARGS.example, "--top",
                             "x"], 2, r"--top needs a whole number")
    error_case("top missing", ["snapshot", "summary", ARGS.example,
                               "--top"], 2, r"option --top needs a value")
    error_case("top range", ["snapshot", "diff", ARGS.example, ARGS.example,
                             "--top", "-3"], 2, r"--top needs a whole number")
    error_case("unknown option", ["snapshot", "summary", ARGS.example,
                                  "--bogus"], 2,
               r"summary: unknown option '--bogus'")
    # "--" ends the options: a file named like an option.
    p = run(["snapshot", "summary", "--", "--json"], expect_rc=1)
    check("--json: cannot open" in p.stderr, "-- ends options")
    p = run(["snapshot", "diff", "--help"], expect_rc=0)
    check("usage: pinpool snapshot diff" in p.stdout, "diff --help")
    p = run(["help", "snapshot"], expect_rc=0)
    check("summary" in p.stdout and "diff" in p.stdout, "help snapshot")


def big_snapshot(path, nblocks, nentries):
    """A synthetic snapshot: nblocks 4 KiB blocks in segments of 512, two
    of three allocated (from two stacks), nentries history entries."""
    doc = load_example()
    per, bs, base = 512, 4096, 1 << 40
    segs = []
    alloc = allocb = req = cachedb = unc = 0
    nseg = (nblocks + per - 1) // per
    for s in range(nseg):
        addr = base + s * 2 * per * bs
        n = min(per, nblocks - s * per)
        blocks = []
        for i in range(n):
            live = i % 3 != 0
            blocks.append({"address": addr + i * bs,
                           "state": "allocated" if live else "cached",
                           "requested_size": 4000 if live else 0,
                           "streams": [], "thread": 7 if live else None,
                           "stack": (i % 2) if live else None})
            if live:
                alloc += bs
                allocb += 1
                req += 4000
            else:
                cachedb += 1
        unc += (per - n) * bs
        segs.append({"address": addr, "size": per * bs, "block_size": bs,
                     "class": 25, "blocks_total": per,
                     "uncarved_blocks": per - n, "tail_bytes": 0,
                     "flags": [], "blocks": blocks})
    doc["segments"] = segs
    doc["totals"] = {
        "segments": nseg, "segment_bytes": nseg * per * bs,
        "chunk_free_bytes": 0, "reserved_bytes": nseg * per * bs,
        "allocated_bytes": alloc, "allocated_blocks": allocb,
        "requested_bytes": req, "pending_bytes": 0, "pending_blocks": 0,
        "cached_bytes": cachedb * bs + unc, "cached_blocks": cachedb,
        "uncarved_bytes": unc, "tail_bytes": 0}
    doc["history"]["entries"] = [
        [i, 1000 + i, "alloc" if i % 2 else "free_completed", base, bs, 4000,
         None, 7, i % 2] for i in range(nentries)]
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    return allocb, alloc


def case_large():
    # 100k blocks and (without sanitizers) 1M entries: anything quadratic
    # would not finish within the test's timeout.
    path = os.path.join(ARGS.work, "large.json")
    allocb, alloc = big_snapshot(path, 100000, ARGS.large_entries)
    p = run(["snapshot", "summary", path, "--json"], expect_rc=0)
    j = json.loads(p.stdout)
    check(j["blocks"]["allocated"] == {"blocks": allocb, "bytes": alloc},
          "large: allocated")
    check(j["identity"]["ok"], "large: identity")
    check(j["history"]["entries"] == ARGS.large_entries and
          j["history"]["actions"]["alloc"] == ARGS.large_entries // 2,
          "large: history")
    check(sum(s["blocks"] for s in j["sites"]) == allocb, "large: sites")
    p = run(["snapshot", "diff", ARGS.example, path], expect_rc=0)
    check("load_batch (loader.c:88)" in p.stdout, "large: diff")
    if not FAILURES:  # kept for a look when something failed
        os.remove(path)


def case_snapgen():
    if not ARGS.snapgen:
        print("no --snapgen: skipped")
        return
    a = os.path.join(ARGS.work, "gen_a.json")
    b = os.path.join(ARGS.work, "gen_b.json")
    for path, extra in ((a, ["--live", "40"]),
                        (b, ["--live", "400", "--streams", "--threads",
                             "3"])):
        g = subprocess.run([ARGS.snapgen, path] + extra + ["--history",
                                                           "20000"],
                           capture_output=True, text=True, timeout=300)
        check(g.returncode == 0, "pp_snapgen %s: exit %d\n%s" %
              (" ".join(extra), g.returncode, g.stderr))
        if g.returncode != 0:
            return
    for path in (a, b):
        p = run(["snapshot", "summary", path], expect_rc=0)
        check("identity OK" in p.stdout, "snapgen: identity OK")
        # Written after the threads joined: a quiescent pool.
        check("stats     agree with the totals" in p.stdout,
              "snapgen: stats agree with the totals:\n" + p.stdout)
        p = run(["snapshot", "summary", path, "--json", "--top", "0"],
                expect_rc=0)
        j = json.loads(p.stdout)
        live = (j["blocks"]["allocated"]["blocks"] +
                j["blocks"]["pending_free"]["blocks"])
        live_bytes = (j["blocks"]["allocated"]["bytes"] +
                      j["blocks"]["pending_free"]["bytes"])
        check(live > 0, "snapgen: live blocks")
        check(sum(s["blocks"] for s in j["sites"]) == live and
              sum(s["bytes"] for s in j["sites"]) == live_bytes,
              "snapgen: sites add up to the live blocks")
        # Static functions have names only where libdw symbolized them
        # (docs/snapshot-format.md); then both call sites must show.
        with open(path) as f:
            named = {fr["function"] for fr in json.load(f)["frames"]}
        if {"stage_batch", "stage_weights"} <= named:
            sites = " ".join(s["site"] for s in j["sites"])
            check("stage_batch" in sites and "stage_weights" in sites,
                  "snapgen: stage_* sites: %r" % ([s["site"]
                                                   for s in j["sites"]],))
        else:
            print("stage_* not symbolized (no libdw?): names not checked")
        check(j["history"]["entries"] > 0 and
              j["history"]["actions"]["alloc"] > 0, "snapgen: history")
    p = run(["snapshot", "diff", a, b], expect_rc=0)
    rows = diff_rows(p.stdout)
    check(len(rows) > 0 and rows[0][0] > 0,
          "snapgen diff: a site grew: %r" % (rows,))
    check(sum(r[0] for r in rows) == diff_total(p.stdout, "allocated")[2] +
          diff_total(p.stdout, "pending_free")[2],
          "snapgen diff: site deltas add up to the live bytes' delta")
    check(diff_total(p.stdout, "allocated")[2] > 0, "snapgen diff: allocated")
    p = run(["snapshot", "diff", b, b], expect_rc=0)
    check("no growth" in p.stdout, "snapgen self-diff")


CASES = {"summary": case_summary, "json": case_json, "diff": case_diff,
         "identity": case_identity, "errors": case_errors,
         "usage": case_usage, "large": case_large, "snapgen": case_snapgen}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--snapgen")
    ap.add_argument("--large-entries", type=int, default=1000000)
    ap.add_argument("case", choices=sorted(CASES))
    ARGS = ap.parse_args()
    ARGS.work = os.path.join(ARGS.work, ARGS.case)
    os.makedirs(ARGS.work, exist_ok=True)
    CASES[ARGS.case]()
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("%s: OK" % ARGS.case)
    return 0


ARGS = None
if __name__ == "__main__":
    sys.exit(main())
