#!/usr/bin/python3
"""Test of `pinpool snapshot html` and of the viewer page, in headless Chromium.

  test_html.py --pinpool PINPOOL --example example.json --artifacts DIR
               [--example-chunks example_chunks.json]
               [--snapgen PP_SNAPGEN] [--chromium PATH]

1. Command line: usage errors exit 2, malformed or missing input exits 1 and
   leaves no page, '-' reads standard input / writes standard output.
2. The JSON inside the page is exactly the input (a snapshot whose strings
   contain "</script>", "<!--<script>" and U+2028 must survive intact and
   must not inject markup).
3. Each page is loaded in headless Chromium with --dump-dom: the viewer's
   #pp-status must say ready, no script errors, as many blocks as the JSON
   lists and as many history entries; #hover=ADDRESS must show that block's
   tooltip (with its stack) through the real hit test.
4. A 100,000-block, 100,000-entry snapshot renders (the page must not
   build one DOM node per block, and must not time out).
   With the arena's `chunks` (example_chunks.json, pp_snapgen's), the
   chunk map draws every chunk, free range and segment carved from them,
   #chunk=ADDRESS hovers a free gap or a segment crossing into the next
   chunk of its run, and the free space in chunks is labelled "free in
   chunks" (never "reserve free", the words from before the arena).
5. A screenshot of a real snapshot (pp_snapgen, else example.json) lands in
   DIR/snapshot-viewer.png.

Chromium is required: without it the test fails and says how to install it.
Only the standard library is used (the system python, no packages).
"""
import argparse
import html.parser
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FAILURES = []
CHROMIUM_TIMEOUT = 60


def check(cond, what):
    if cond:
        print("ok:", what)
    else:
        print("FAIL:", what)
        FAILURES.append(what)
    return cond


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, timeout=120, **kw)


# ---- Reading the dumped DOM ------------------------------------------------
class Dom(html.parser.HTMLParser):
    """Attributes of elements by id, and the text inside some of them."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link",
            "meta", "source", "track", "wbr"}

    def __init__(self, text_of):
        super().__init__(convert_charrefs=True)
        self.attrs = {}
        self.root_attrs = {}
        self.text = {i: "" for i in text_of}
        self.open = []  # ids being collected, with their depth
        self.depth = 0
        self.text_of = set(text_of)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.root_attrs = a
        if "id" in a:
            self.attrs[a["id"]] = a
        if tag in self.VOID:
            return
        self.depth += 1
        if a.get("id") in self.text_of:
            self.open.append((a["id"], self.depth))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        while self.open and self.open[-1][1] >= self.depth:
            self.open.pop()
        self.depth -= 1

    def handle_data(self, data):
        for i, _ in self.open:
            self.text[i] += data


def parse_dom(text):
    d = Dom(["pp-tooltip", "pp-errors", "totals-section"])
    d.feed(text)
    return d


# ---- Chromium --------------------------------------------------------------
def find_chromium(explicit):
    for c in [explicit, os.environ.get("PP_CHROMIUM"), "chromium",
              "chromium-browser", "google-chrome"]:
        if c and shutil.which(c):
            return shutil.which(c)
    return None


class Browser:
    def __init__(self, exe, tmp):
        self.exe = exe
        self.tmp = tmp
        self.n = 0

    def _run(self, url, extra):
        self.n += 1
        home = os.path.join(self.tmp, "chromium-%d" % self.n)
        os.makedirs(home)
        # Root in a container: no sandbox. A fresh profile per run, and HOME
        # and XDG dirs in it, so that nothing outside the temp dir changes.
        cmd = [self.exe, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-dev-shm-usage", "--no-first-run",
               "--no-default-browser-check", "--disable-extensions",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--mute-audio", "--hide-scrollbars",
               "--user-data-dir=" + os.path.join(home, "profile")] + extra + [url]
        env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=home,
                   XDG_CACHE_HOME=home, XDG_RUNTIME_DIR=home)
        # Own process group: on a timeout the renderer and helper processes
        # must go too, not only the browser process.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env, start_new_session=True)
        t = time.monotonic()
        try:
            out, err = p.communicate(timeout=CHROMIUM_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            print("chromium timed out after %d s; stderr:\n%s" %
                  (CHROMIUM_TIMEOUT, err.decode(errors="replace")[-3000:]))
            return None, time.monotonic() - t
        dt = time.monotonic() - t
        if p.returncode != 0:
            print("chromium exited with %d; stderr:\n%s" %
                  (p.returncode, err.decode(errors="replace")[-3000:]))
            return None, dt
        return out.decode("utf-8", errors="replace"), dt

    def dump(self, page, fragment=""):
        url = "file://" + os.path.abspath(page) + fragment
        out, dt = self._run(url, ["--dump-dom", "--window-size=1400,1000"])
        print("  chromium --dump-dom %s%s: %.1f s" % (os.path.basename(page), fragment, dt))
        return out

    def screenshot(self, page, png, fragment=""):
        url = "file://" + os.path.abspath(page) + fragment
        out, dt = self._run(url, ["--screenshot=" + png, "--window-size=1400,1000"])
        print("  chromium --screenshot %s: %.1f s" % (os.path.basename(page), dt))
        return out is not None


# ---- Snapshots ---------------------------------------------------------------
def listed_blocks(snap):
    return sum(len(s["blocks"]) for s in snap["segments"])


def page_snapshot(page):
    """The snapshot inside <script id="snapshot"> of a written page, as an
    HTML parser delimits it, or None (with the reason printed)."""
    try:
        with open(page, "rb") as f:
            text = f.read().decode("ascii")  # the writer keeps pages ASCII
        start_tag = '<script type="application/json" id="snapshot">'
        i = text.index(start_tag) + len(start_tag)
        # The element ends at the first "</script", whatever follows.
        j = text.lower().index("</script", i)
        return json.loads(text[i:j])
    except (OSError, ValueError) as e:
        print("  cannot read the snapshot back from %s: %s" % (page, e))
        return None


def size_class(size):
    """Index of the size class of `size` (docs/allocation-policy.md)."""
    if size <= 512:
        return 0
    e = size.bit_length() - 1
    for k in range(9):
        c = (1 << e) + k * (1 << (e - 3))
        if c >= size:
            return (e - 9) * 8 + k if k < 8 else (e - 8) * 8
    raise AssertionError


def synthetic(nblocks, nentries, seed=7):
    """A consistent snapshot with about `nblocks` listed blocks and
    `nentries` history entries (docs/snapshot-format.md), for load tests."""
    rng = random.Random(seed)
    funcs = ["load_batch", "stage_weights", "pin_tokens", "kv_page_alloc",
             "collate", "prefetch_shard", "decode_jpeg", "h2d_copy"]
    frames = []
    for i, fn in enumerate(funcs):
        frames.append({"address": 0x5500_0000_0000 + 0x100 * i, "function": fn,
                       "offset": 16 * i, "module": "/usr/bin/trainer",
                       "file": "trainer.c", "line": 100 + 10 * i})
    frames.append({"address": 0x5500_0001_0000, "function": "main", "offset": 64,
                   "module": "/usr/bin/trainer", "file": "trainer.c", "line": 900})
    stacks = [[i, len(funcs)] for i in range(len(funcs))]
    segments = []
    addr = 0x7f00_0000_0000
    kinds = [(512, 1 << 21), (4096, 1 << 21), (65536, 1 << 21), (1 << 21, 1 << 21)]
    listed = 0
    tot = dict(allocated_bytes=0, allocated_blocks=0, requested_bytes=0,
               pending_bytes=0, pending_blocks=0, cached_blocks=0,
               cached_block_bytes=0, uncarved_bytes=0, tail_bytes=0)
    k = 0
    while listed < nblocks:
        bs, size = kinds[k % len(kinds)]
        k += 1
        total = size // bs
        carve = min(total, nblocks - listed, max(1, total - rng.randrange(0, max(1, total // 8))))
        blocks = []
        for i in range(carve):
            st = rng.choices(["allocated", "pending_free", "cached"], [6, 1, 3])[0]
            req = 0 if st == "cached" else rng.randint(max(1, bs * 7 // 8), bs)
            stack = None if st == "cached" else rng.randrange(len(stacks))
            blocks.append({"address": addr + i * bs, "state": st, "requested_size": req,
                           "streams": [hex(0x5a00 + rng.randrange(4))] if st == "pending_free" else [],
                           "thread": None if st == "cached" else 1000 + rng.randrange(8),
                           "stack": stack})
            if st == "allocated":
                tot["allocated_bytes"] += bs
                tot["allocated_blocks"] += 1
                tot["requested_bytes"] += req
            elif st == "pending_free":
                tot["pending_bytes"] += bs
                tot["pending_blocks"] += 1
            else:
                tot["cached_blocks"] += 1
                tot["cached_block_bytes"] += bs
        tail = size - total * bs
        tot["uncarved_bytes"] += (total - carve) * bs
        tot["tail_bytes"] += tail
        segments.append({"address": addr, "size": size, "block_size": bs,
                         "class": size_class(bs), "blocks_total": total,
                         "uncarved_blocks": total - carve, "tail_bytes": tail,
                         "flags": ["page_locked"], "blocks": blocks})
        listed += carve
        addr += size
    seg_bytes = sum(s["size"] for s in segments)
    totals = {"segments": len(segments), "segment_bytes": seg_bytes,
              "chunk_free_bytes": 0, "reserved_bytes": seg_bytes,
              "allocated_bytes": tot["allocated_bytes"],
              "allocated_blocks": tot["allocated_blocks"],
              "requested_bytes": tot["requested_bytes"],
              "pending_bytes": tot["pending_bytes"], "pending_blocks": tot["pending_blocks"],
              "cached_bytes": tot["cached_block_bytes"] + tot["uncarved_bytes"] + tot["tail_bytes"],
              "cached_blocks": tot["cached_blocks"],
              "uncarved_bytes": tot["uncarved_bytes"], "tail_bytes": tot["tail_bytes"]}
    # History: allocations and frees of listed blocks, over 10 seconds.
    all_blocks = [(s["block_size"], b) for s in segments for b in s["blocks"]]
    entries, live, t = [], {}, 1_000_000_000
    for seq in range(nentries):
        t += rng.randint(1, 200_000)
        bs, b = all_blocks[rng.randrange(len(all_blocks))]
        a = b["address"]
        if a in live:
            entries.append([seq, t, "free_completed", a, bs, live.pop(a), None, 1001, None])
        else:
            req = rng.randint(bs * 7 // 8, bs)
            live[a] = req
            entries.append([seq, t, "alloc", a, bs, req, None, 1001, rng.randrange(len(stacks))])
    stat = lambda v: {"current": v, "peak": v, "allocated": v, "freed": 0}
    dur = {"count": 0, "total_ns": 0, "max_ns": 0}
    stats = {"requests": stat(0), "requested_bytes": stat(0), "blocks": stat(0),
             "block_bytes": stat(0), "reserved_bytes": stat(seg_bytes),
             "cached_bytes": stat(0), "segments": stat(len(segments)),
             "pending_bytes": 0, "pending_blocks": 0, "events_recorded": 0,
             "events_completed": 0, "event_errors": 0, "reclaim": dur,
             "cache_hits": 0, "cache_misses": 0, "tcache_hits": 0, "oom_count": 0,
             "retries": 0, "trimmed_segments": 0, "mlock_failures": 0,
             "locked_bytes": 0, "backend_alloc": dur, "backend_free": dur,
             "peak_slack_bytes": 0, "reserve_bytes": 0, "max_cached": 0,
             "max_reserved": 0}
    return {"format": "pinpool-snapshot", "version": 1, "pinpool_version": "test",
            "pid": 4242, "time_ns": t + 1000, "unix_time": 1764518400.0,
            "gather_ns": 1000, "max_hold_ns": 100, "backend": "host",
            "config": "backend=host", "stats": stats, "totals": totals,
            "segments": segments, "frames": frames, "stacks": stacks,
            "history": {"record": "all", "stack_depth": 16, "max_entries": nentries,
                        "recorded": nentries, "dropped": 0,
                        "fields": ["seq", "time_ns", "action", "address", "size",
                                   "requested_size", "stream", "thread", "stack"],
                        "entries": entries}}


def write_json(path, obj, ascii_only=True):
    # json.dumps encodes in one go, several times faster than json.dump.
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, ensure_ascii=ascii_only, separators=(",", ":")))


# ---- The checks ------------------------------------------------------------
def check_page_dom(name, dom_text, snap, hover=None, hover_text=None):
    """The rendered page: ready, no errors, counts; optional hover."""
    if not check(dom_text is not None, "%s: chromium rendered the page" % name):
        return
    d = parse_dom(dom_text)
    st = d.attrs.get("pp-status")
    if not check(st is not None, "%s: #pp-status is in the page" % name):
        return
    if d.text["pp-errors"].strip():
        print("  page errors:", d.text["pp-errors"].strip())
    check(st.get("data-ready") == "1", "%s: the viewer finished rendering" % name)
    check(st.get("data-errors") == "0",
          "%s: no script errors (data-errors=%s)" % (name, st.get("data-errors")))
    n = listed_blocks(snap)
    check(st.get("data-blocks") == str(n),
          "%s: %s blocks drawn, %d listed" % (name, st.get("data-blocks"), n))
    check(st.get("data-segments") == str(len(snap["segments"])),
          "%s: %s segments drawn" % (name, st.get("data-segments")))
    check(st.get("data-entries") == str(len(snap["history"]["entries"])),
          "%s: %s history entries replayed" % (name, st.get("data-entries")))
    check("data-pwned" not in d.root_attrs,
          "%s: no script injected by the snapshot's strings" % name)
    check_chunk_dom(name, d, st, snap)
    print("  rendered in %s ms" % st.get("data-render-ms"))
    if hover is not None:
        check(st.get("data-hover") == str(hover),
              "%s: hovering #hover=%d hits that block (data-hover=%s)"
              % (name, hover, st.get("data-hover")))
        tip = d.text["pp-tooltip"]
        check(hover_text in tip, "%s: the tooltip shows %r" % (name, hover_text))
        check("pp-tooltip" in d.attrs and "hidden" not in d.attrs["pp-tooltip"],
              "%s: the tooltip is visible" % name)
    return st


def check_chunk_dom(name, d, st, snap):
    """The chunk map and the totals' words for the free space in chunks."""
    totals = d.text["totals-section"]
    check("reserve" not in totals.lower().replace("reserved", ""),
          "%s: the totals do not call free space in chunks the reserve's"
          % name)
    if snap["totals"]["chunk_free_bytes"] > 0:
        check("free in chunks" in totals,
              "%s: the totals say \"free in chunks\"" % name)
    sec = d.attrs.get("chunks-section", {})
    if "chunks" not in snap:
        check("hidden" in sec and st.get("data-chunks") == "0",
              "%s: no chunks, no chunk map" % name)
        return
    ch = snap["chunks"]
    gaps = sum(len(c["free"]) for c in ch)
    inside = sum(1 for s in snap["segments"] if any(
        c["address"] <= s["address"] < c["address"] + c["size"] for c in ch))
    check("hidden" not in sec, "%s: the chunk map is shown" % name)
    check(st.get("data-chunks") == str(len(ch)),
          "%s: %s chunks drawn, %d listed" % (name, st.get("data-chunks"),
                                              len(ch)))
    check(st.get("data-chunk-gaps") == str(gaps),
          "%s: %s free gaps drawn, %d listed" % (
              name, st.get("data-chunk-gaps"), gaps))
    check(st.get("data-chunk-segments") == str(inside),
          "%s: %s segments drawn in chunks, %d start in one" % (
              name, st.get("data-chunk-segments"), inside))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pinpool", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--example-chunks", help="a snapshot with chunks "
                    "(default: example_chunks.json beside --example)")
    ap.add_argument("--artifacts", required=True)
    ap.add_argument("--snapgen")
    ap.add_argument("--chromium")
    ap.add_argument("--big", type=int, default=100_000,
                    help="blocks and entries of the load-test snapshot")
    args = ap.parse_args()
    if args.example_chunks is None:
        args.example_chunks = os.path.join(os.path.dirname(args.example),
                                           "example_chunks.json")
    t_start = time.monotonic()

    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("FAIL: headless Chromium is required for this test and was not found "
              "(looked for chromium, chromium-browser, google-chrome, $PP_CHROMIUM). "
              "Install it: apt-get install chromium")
        return 1

    os.makedirs(args.artifacts, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="pp-html-")
    try:
        rc = body(args, chromium, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("total %.1f s" % (time.monotonic() - t_start))
    return rc


def body(args, chromium, tmp):
    pp = args.pinpool
    html = lambda *a: run([pp, "snapshot", "html"] + list(a))
    with open(args.example) as f:
        example = json.load(f)
    out = os.path.join(tmp, "out.html")

    # -- 1. Command line -----------------------------------------------------
    r = html(args.example)
    check(r.returncode == 2, "no -o: exit 2 (got %d)" % r.returncode)
    check(b"-o" in r.stderr, "no -o: the message names -o")
    check(not os.path.exists(out), "no -o: nothing written")
    for argv, what in [([], "no FILE"), ([args.example, "-o"], "-o without a value"),
                       ([args.example, "-o", out, "--frobnicate"], "unknown option"),
                       ([args.example, args.example, "-o", out], "two FILEs"),
                       ([args.example, "-o", out, "-o", out], "-o twice")]:
        r = html(*argv)
        check(r.returncode == 2, "%s: exit 2 (got %d)" % (what, r.returncode))
    check(not os.path.exists(out), "usage errors: nothing written")

    bad = os.path.join(tmp, "bad.json")
    with open(args.example, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])  # truncated
    r = html(bad, "-o", out)
    check(r.returncode == 1, "truncated JSON: exit 1 (got %d)" % r.returncode)
    check(b"bad.json" in r.stderr, "truncated JSON: the reader's message names the file: %s"
          % r.stderr.decode(errors="replace").strip())
    check(not os.path.exists(out), "truncated JSON: OUT not created")
    wrong = dict(example, version=2)
    write_json(bad, wrong)
    r = html(bad, "-o", out)
    check(r.returncode == 1 and not os.path.exists(out), "version 2: exit 1, OUT not created")
    r = html(os.path.join(tmp, "missing.json"), "-o", out)
    check(r.returncode == 1 and not os.path.exists(out), "missing FILE: exit 1, OUT not created")
    r = html(args.example, "-o", os.path.join(tmp, "no", "such", "dir.html"))
    check(r.returncode == 1, "unwritable OUT: exit 1 (got %d)" % r.returncode)

    r = html(args.example, "-o", out)
    check(r.returncode == 0, "example.json: exit 0 (stderr: %s)" % r.stderr.decode(errors="replace").strip())
    if not check(os.path.exists(out), "example.json: page written"):
        return 1
    check(page_snapshot(out) == example, "example.json: the page holds the snapshot")
    with open(out, "rb") as f:
        page_bytes = f.read()
    check(b"http://" not in page_bytes and b"https://" not in page_bytes.replace(
        b"https://pinpool.dev", b""), "the page refers to nothing online")
    with open(args.example, "rb") as f:
        r = run([pp, "snapshot", "html", "-", "-o", "-"], stdin=f)
    check(r.returncode == 0 and r.stdout == page_bytes, "'-' in and out: the same page")

    # -- 2. Strings that would end the data element early --------------------
    inject = "<script>document.documentElement.setAttribute('data-pwned','1')</script>"
    evil_name = "stage_</script>" + inject + "<!--<script>x\u2028y\u00e9"

    evil = json.loads(json.dumps(example))
    evil["frames"][2]["function"] = evil_name
    evil["config"] = "</SCRIPT >" + inject
    evil_json = os.path.join(tmp, "evil.json")
    write_json(evil_json, evil, ascii_only=False)
    evil_page = os.path.join(tmp, "evil.html")
    r = html(evil_json, "-o", evil_page)
    check(r.returncode == 0, "hostile strings: exit 0")
    if os.path.exists(evil_page):
        check(page_snapshot(evil_page) == evil,
              "hostile strings: the data element holds exactly the snapshot")

    br = Browser(chromium, tmp)
    # -- 3. Rendering ---------------------------------------------------------
    check_page_dom("example.json", br.dump(out, "#hover=140000000000000"), example,
                   hover=140000000000000, hover_text="load_batch")
    if os.path.exists(evil_page):
        dom = br.dump(evil_page, "#hover=0x%x" % 140000002097152)
        check_page_dom("hostile strings", dom, evil, hover=140000002097152,
                       hover_text=evil_name)

    # History off: no entries, and blocks without thread or stack.
    nohist = json.loads(json.dumps(example))
    nohist["history"].update(record="none", entries=[], recorded=0)
    for seg in nohist["segments"]:
        for b in seg["blocks"]:
            b.update(thread=None, stack=None)
    nh_json, nh_page = os.path.join(tmp, "nohist.json"), os.path.join(tmp, "nohist.html")
    write_json(nh_json, nohist)
    if html(nh_json, "-o", nh_page).returncode == 0:
        dom = br.dump(nh_page)
        check_page_dom("history off", dom, nohist)
        check(dom is not None and "History was off" in dom, "history off: the page says so")
    else:
        check(False, "history off: page written")

    # An empty pool: nothing to draw, nothing to fail on.
    empty = json.loads(json.dumps(nohist))
    empty["segments"] = []
    empty["totals"] = {k: 0 for k in empty["totals"]}
    em_json, em_page = os.path.join(tmp, "empty.json"), os.path.join(tmp, "empty.html")
    write_json(em_json, empty)
    r = html(em_json, "-o", em_page)
    if check(r.returncode == 0, "empty pool: exit 0 (%s)" % r.stderr.decode(errors="replace").strip()):
        check_page_dom("empty pool", br.dump(em_page, "#hover=4096"), empty)

    # The arena's chunks: a free gap and a segment crossing two chunks of a
    # run, hovered on the chunk map.
    with open(args.example_chunks) as f:
        chunky = json.load(f)
    ch_page = os.path.join(tmp, "chunks.html")
    r = html(args.example_chunks, "-o", ch_page)
    if check(r.returncode == 0, "example_chunks.json: exit 0 (%s)"
             % r.stderr.decode(errors="replace").strip()):
        base = chunky["chunks"][0]["address"]
        gap = chunky["chunks"][0]["free"][0]
        dom = br.dump(ch_page, "#chunk=%d" % (gap[0] + gap[1] // 2))
        st = check_page_dom("example_chunks.json, a free gap", dom, chunky)
        tip = parse_dom(dom).text["pp-tooltip"] if dom else ""
        check(st is not None and st.get("data-chunk-hover") == "free:%d" % gap[0]
              and "free in chunk" in tip,
              "example_chunks.json: #chunk= on a gap shows it (%s)"
              % (st.get("data-chunk-hover") if st else None))
        cross = next(s for s in chunky["segments"]
                     if s["address"] + s["size"] > chunky["chunks"][0]["address"]
                     + chunky["chunks"][0]["size"] > s["address"])
        dom = br.dump(ch_page, "#chunk=%d" % (base + 9 * (1 << 20)))
        d2 = parse_dom(dom) if dom else None
        st2 = d2.attrs.get("pp-status", {}) if d2 else {}
        check(st2.get("data-chunk-hover") == "segment:%d" % cross["address"]
              and "crosses into the next chunk" in d2.text["pp-tooltip"],
              "example_chunks.json: #chunk= in the second chunk of a run shows "
              "the segment crossing into it (%s)" % st2.get("data-chunk-hover"))

    # -- 4. Load: 100,000 blocks and entries ----------------------------------
    big = synthetic(args.big, args.big)
    big_json, big_page = os.path.join(tmp, "big.json"), os.path.join(tmp, "big.html")
    write_json(big_json, big)
    t = time.monotonic()
    r = html(big_json, "-o", big_page)
    check(r.returncode == 0, "%d blocks: exit 0 in %.1f s (%s)" % (
        listed_blocks(big), time.monotonic() - t, r.stderr.decode(errors="replace").strip()))
    want = next(b for s in big["segments"] for b in s["blocks"] if b["stack"] is not None)
    fn = big["frames"][big["stacks"][want["stack"]][0]]["function"]
    check_page_dom("%d blocks" % listed_blocks(big), br.dump(big_page, "#hover=%d" % want["address"]),
                   big, hover=want["address"], hover_text=fn)

    # -- 5. A real snapshot, and the screenshot -------------------------------
    shot_page, shot_frag = out, "#hover=140000000004096"
    if args.snapgen:
        real_json, real_page = os.path.join(tmp, "real.json"), os.path.join(tmp, "real.html")
        r = run([args.snapgen, real_json, "--live", "3000", "--history", "20000",
                 "--threads", "2"])
        if check(r.returncode == 0, "pp_snapgen: exit 0 (%s)" % r.stderr.decode(errors="replace").strip()[-500:]):
            with open(real_json) as f:
                real = json.load(f)
            r = html(real_json, "-o", real_page)
            check(r.returncode == 0, "pp_snapgen snapshot: exit 0 (%s)" % r.stderr.decode(errors="replace").strip())
            live = [b for s in real["segments"] for b in s["blocks"]
                    if b["state"] == "allocated" and b["stack"] is not None]
            if live:
                b = live[len(live) // 2]
                f = real["frames"][real["stacks"][b["stack"]][0]] if real["stacks"][b["stack"]] else None
                text = (f["function"] or "#0") if f else "block"
                check_page_dom("pp_snapgen snapshot", br.dump(real_page, "#hover=%d" % b["address"]),
                               real, hover=b["address"], hover_text=text)
                shot_page, shot_frag = real_page, "#hover=%d" % b["address"]
            else:
                check_page_dom("pp_snapgen snapshot", br.dump(real_page), real)
                shot_page, shot_frag = real_page, ""
    else:
        print("note: pp_snapgen not built; the screenshot shows example.json")

    png = os.path.join(args.artifacts, "snapshot-viewer.png")
    if os.path.exists(png):
        os.remove(png)
    br.screenshot(shot_page, png, shot_frag)
    ok = check(os.path.exists(png), "screenshot written to %s" % png)
    if ok:
        with open(png, "rb") as f:
            head = f.read(24)
        size = os.path.getsize(png)
        check(head[:8] == b"\x89PNG\r\n\x1a\n", "screenshot is a PNG")
        w, h = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        check((w, h) == (1400, 1000), "screenshot is 1400x1000 (got %dx%d)" % (w, h))
        # A blank page compresses to a few KB; the rendered one is far larger.
        check(size > 30_000, "screenshot is not blank (%d bytes)" % size)

    if FAILURES:
        print("\n%d checks failed:" % len(FAILURES))
        for f in FAILURES:
            print("  -", f)
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
