#!/usr/bin/env python3
"""Issue 38, the meter's findings: the A/B table from ab.sh's records.

ab.py OUTDIR: for each case, the runs of OUTDIR/<case>.before.txt and
<case>.after.txt paired in order (run i of before with run i of after,
both made back to back), the figure taken from each record, and the
median of the pairs' ratios after/before with its min and max. Figures:
time per operation (1 / ops_per_s, ns) for pp_bench; for W8 also the
pairs' p99 while snapshots run (busy_p99), the snapshot (snap_ms_med) and
its longest hold (hold_us_max); for W9 time per batch (1 / batches_per_s,
ms). A ratio above 1 is slower after."""
import os
import re
import statistics
import sys


def records(path):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path):
        if line.startswith("R\t") or line.startswith("W9\t"):
            kv = dict(re.findall(r"([a-z_0-9]+)=([0-9.e+-]+)", line))
            out.append(kv)
    return out


def figures(kv):
    f = {}
    if "ops_per_s" in kv and float(kv["ops_per_s"]) > 0:
        f["time per op, ns"] = 1e9 / float(kv["ops_per_s"])
    if "batches_per_s" in kv and float(kv["batches_per_s"]) > 0:
        f["time per batch, ms"] = 1e3 / float(kv["batches_per_s"])
    for k, name in (("busy_p99", "pair p99 during snapshots, ns"),
                    ("snap_ms_med", "snapshot, ms"),
                    ("hold_us_max", "snapshot longest hold, us")):
        if k in kv:
            f[name] = float(kv[k])
    return f


def main():
    d = sys.argv[1]
    cases = sorted({f.rsplit(".", 2)[0] for f in os.listdir(d)
                    if f.endswith(".before.txt")},
                   key=lambda c: (c[:3], c))
    print("| case | figure | before (median) | after (median) | "
          "after/before, median of pairs (min–max) | pairs |")
    print("|---|---|---|---|---|---|")
    for c in cases:
        a = [figures(r) for r in records(os.path.join(d, c + ".before.txt"))]
        b = [figures(r) for r in records(os.path.join(d, c + ".after.txt"))]
        # The warm-up run of each side is the first record: not paired.
        a, b = a[1:], b[1:]
        n = min(len(a), len(b))
        if n == 0:
            continue
        for name in a[0]:
            av = [x[name] for x in a[:n] if name in x]
            bv = [x[name] for x in b[:n] if name in x]
            r = [y / x for x, y in zip(av, bv) if x > 0]
            if not r:
                continue
            print("| %s | %s | %.4g | %.4g | %.2f (%.2f–%.2f) | %d |" % (
                c, name, statistics.median(av), statistics.median(bv),
                statistics.median(r), min(r), max(r), len(r)))


main()
