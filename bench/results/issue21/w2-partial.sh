#!/bin/bash
# Partial fair W2 run: pinpool, tcmalloc-rr0, rmmpool, refpool, floor; touch mode.
B="${B:-build/release/bench}"
out="${1:-w2-partial.tsv}"
: > $out
for th in 1 2; do
for c in 0 1 2 3 4 5 6 7 8 9 10 11; do
  if [ $th = 2 ] && [ $c -lt 6 ]; then continue; fi
  timeout 300 $B/pp_bench --workload W2 --impl floor --mode touch --threads $th --case $c 2>/dev/null | grep "^R" >> $out
  timeout 300 $B/pp_bench --workload W2 --impl pinpool --mode touch --threads $th --case $c 2>/dev/null | grep "^R" >> $out
  TCMALLOC_RELEASE_RATE=0 TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=1099511627776 timeout 300 $B/pp_bench_tcmalloc --workload W2 --impl malloc --mode touch --threads $th --case $c --name tcmalloc-rr0 2>/dev/null | grep "^R" >> $out
  timeout 300 $B/pp_bench --workload W2 --impl rmmpool --mode touch --threads $th --case $c 2>/dev/null | grep "^R" >> $out
  timeout 300 $B/pp_bench --workload W2 --impl refpool --mode touch --threads $th --case $c 2>/dev/null | grep "^R" >> $out
done; done

