#!/usr/bin/env bash
# Issue 38, the meter's findings: W1-W9 before (A) and after (B),
# interleaved run by run (A B A B ...), each case its own process.
#   ab.sh BEFORE_BUILD AFTER_BUILD OUTDIR
# Each run's output line (the R / W9 record) is appended to
# OUTDIR/<case>.{before,after}.txt; ab.py takes the pairs' ratios.
set -u
A=$1 B=$2 OUT=$3
mkdir -p "$OUT"
run() { # name pairs args...
  local name=$1 n=$2
  shift 2
  # One warm-up run of each (its record first in the file, not paired),
  # then pairs: before then after, after then before (the order alternates).
  "$A/bench/$@" >>"$OUT/$name.before.txt" 2>&1
  "$B/bench/$@" >>"$OUT/$name.after.txt" 2>&1
  for ((i = 0; i < n; i++)); do
    if ((i % 2 == 0)); then order="before after"; else order="after before"; fi
    for which in $order; do
      if [[ $which == before ]]; then dir=$A; else dir=$B; fi
      "$dir/bench/$@" >>"$OUT/$name.$which.txt" 2>&1
    done
  done
}
for c in 0 1 2 3 4; do
  run "W1-t1-c$c" 7 pp_bench --workload W1 --impl pinpool --case $c
  run "W1-t2-c$c" 5 pp_bench --workload W1 --impl pinpool --threads 2 --case $c
done
for c in 0 1 2; do
  run "W1h-c$c" 5 pp_bench --workload W1h --impl pinpool-h-all --case $c
done
run "W2q-c0" 7 pp_bench --workload W2 --impl pinpool --quick --case 0
for c in 0 1 2; do
  run "W3-t1-c$c" 5 pp_bench --workload W3 --impl pinpool --case $c
done
run "W3-t2-c0" 5 pp_bench --workload W3 --impl pinpool --threads 2 --case 0
for t in 1 2; do
  run "W4-t$t" 5 pp_bench --workload W4 --impl pinpool --threads $t --case 0
  run "W5-t$t" 5 pp_bench --workload W5 --impl pinpool --threads $t --case 0
done
run "W6" 3 pp_bench --workload W6 --impl pinpool --case 0
run "W7" 5 pp_bench --workload W7 --impl pinpool --case 0
run "W8q-c0" 3 pp_bench --workload W8 --impl pinpool --quick --case 0
run "W8q-c1" 3 pp_bench --workload W8 --impl pinpool --quick --case 1
run "W9-lend-2-16" 5 pp_bench_w9 --raw lend 2 16 mem 20
run "W9-copy-2-16" 5 pp_bench_w9 --raw copy 2 16 mem 20
run "W9-lend-4-64" 5 pp_bench_w9 --raw lend 4 64 mem 10
