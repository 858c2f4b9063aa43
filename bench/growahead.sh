#!/usr/bin/env bash
# Growth ahead of demand (issue 37; docs/benchmarks.md, "Grow-ahead"):
# pp_bench_growahead with and without grow_ahead=auto, interleaved, on the
# fake CUDA driver (backend=cuda-register) at several pinning costs, then
# medians per case.
#
#   bench/growahead.sh BUILD_DIR OUT_DIR [ROUNDS] [COSTS_US_PER_GIB...]
#
# BUILD_DIR holds bench/pp_bench_growahead and tests/fake_cuda/libfakecuda.so
# (a RelWithDebInfo build with BUILD_TESTING=ON). Writes OUT_DIR/runs.jsonl
# (one line per run, with "cost" and "round" added) and OUT_DIR/summary.md.
set -euo pipefail
BUILD=${1:?build dir}
OUT=${2:?out dir}
ROUNDS=${3:-5}
shift $(($# < 3 ? $# : 3))
COSTS=("$@")
[ ${#COSTS[@]} -gt 0 ] || COSTS=(100000 300000 450000)
RAMP_MS=${RAMP_MS:-3000}
HOLD_MS=${HOLD_MS:-1000}
PEAK_MIB=${PEAK_MIB:-512}
BENCH="$BUILD/bench/pp_bench_growahead"
export PINPOOL_LIBCUDA="$BUILD/tests/fake_cuda/libfakecuda.so"
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
for r in $(seq 1 "$ROUNDS"); do
  for cost in "${COSTS[@]}"; do
    for conf in "backend=cuda-register,device=0" \
      "backend=cuda-register,device=0,grow_ahead=auto"; do
      line=$(FAKE_CUDA_PIN_US_PER_GIB=$cost "$BENCH" "$conf" "$RAMP_MS" \
        "$HOLD_MS" "$PEAK_MIB" "$r")
      echo "${line%\}},\"cost\":$cost,\"round\":$r}" >>"$OUT/runs.jsonl"
    done
  done
done
python3 - "$OUT" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
keys = ["ramp_p99_ns", "ramp_max_ns", "ramp_warm_max_ns", "hold_p99_ns",
        "hold_max_ns", "pair_p50_ns", "pair_2mib_p50_ns", "misses", "ramp_misses",
        "grown_ahead_chunks", "waits_avoided", "reserved_peak", "live_peak",
        "held_beyond_peak"]
cases = {}
for r in runs:
    ga = "grow_ahead" in r["config"]
    cases.setdefault((r["cost"], ga), []).append(r)
med = {k: {x: statistics.median(v[x] for v in vs) for x in keys}
       for k, vs in cases.items()}
lines = ["| pin cost | grow_ahead | runs | ramp p99 | ramp max | ramp max "
         "after 10 ms | hold p99 | hold max | pair 64 KiB / 2 MiB | "
         "grew on the thread: ramp / all | grown ahead | reserved peak | held beyond "
         "peak | memory vs off |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
us = lambda ns: f"{ns / 1000:.1f} µs" if ns < 1e6 else f"{ns / 1e6:.2f} ms"
mib = lambda b: f"{b / 2**20:.0f} MiB"
for (cost, ga) in sorted(cases):
    m = med[(cost, ga)]
    off = med.get((cost, False))
    ratio = (f"{m['reserved_peak'] / off['reserved_peak']:.2f}x"
             if off else "-")
    lines.append(
        f"| {cost / 1e6:.2f} s/GiB | {'auto' if ga else 'off'} | "
        f"{len(cases[(cost, ga)])} | {us(m['ramp_p99_ns'])} | "
        f"{us(m['ramp_max_ns'])} | {us(m['ramp_warm_max_ns'])} | "
        f"{us(m['hold_p99_ns'])} | {us(m['hold_max_ns'])} | "
        f"{us(m['pair_p50_ns'])} / {us(m['pair_2mib_p50_ns'])} | "
        f"{m['ramp_misses']:.0f} / {m['misses']:.0f} | "
        f"{m['grown_ahead_chunks']:.0f} | "
        f"{mib(m['reserved_peak'])} | {mib(m['held_beyond_peak'])} | "
        f"{ratio} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
