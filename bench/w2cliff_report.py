#!/usr/bin/env python3
"""The table of bench/w2cliff.sh's records (issue 37, the cliff).

    bench/w2cliff_report.py FILE [FILE...] > table.md

Per case, thread count and label (the floor, pinpool as built, each
--variant): the runs, and medians over the runs of the page faults per
operation after the fill (whole window and its late half), the time per
operation over the floor's (the floor's median ops/s over the label's:
load-dependent), memory held (peak reserved / peak requested), backend
calls after the fill and chunks at the end. Issue 37's goals are
< 0.01 faults/op, <= 1.10x the floor, <= 1.15x memory: a row that meets
all three is marked.
"""
import statistics
import sys


def records(paths):
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                cols = line.rstrip("\n").split("\t")
                label, rec = cols[0], cols[1:]
                if rec[0] != "R":
                    continue
                _, _w, case, _impl, _mode, threads = rec[:6]
                kv = dict(x.split("=", 1) for x in rec[8:] if "=" in x)
                yield label, case, int(threads), kv


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    runs = {}
    order = []
    for label, case, t, kv in records(argv[1:]):
        key = (case, t)
        if key not in order:
            order.append(key)
        runs.setdefault((case, t, label), []).append(kv)
    labels = []
    for (_c, _t, label) in runs:
        if label not in labels:
            labels.append(label)
    print("| case | threads | variant | runs | faults/op after the fill "
          "| faults/op, late half | time/op over the floor | memory held "
          "| backend calls after the fill | chunks | goals |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case, t in order:
        fl = runs.get((case, t, "floor"), [])
        floor_ops = med([float(r["ops_per_s"]) for r in fl])
        for label in labels:
            rs = runs.get((case, t, label))
            if not rs or label == "floor":
                continue
            g = lambda k: med([float(r[k]) for r in rs if k in r])
            ratio = floor_ops / g("ops_per_s") if fl else float("nan")
            faults, held = g("minflt_per_op"), g("overhead")
            ok = faults < 0.01 and ratio <= 1.10 and held <= 1.15
            print(f"| {case} | {t} | {label} | {len(rs)} | {faults:.3f} "
                  f"| {g('late_minflt_per_op'):.4f} | {ratio:.2f} "
                  f"| {held:.3f} | {g('backend_calls'):.0f} "
                  f"| {g('chunks'):.0f} | {'met' if ok else ''} |")


if __name__ == "__main__":
    main(sys.argv)
