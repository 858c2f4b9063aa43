#!/usr/bin/env bash
# W2 after the fill, per variant (issue 37, "the cliff"): the touch floor
# and pinpool (and pinpool under extra configurations) interleaved, one
# process a run, the raw pp_bench records kept.
#
#   bench/w2cliff.sh [--rounds N] [--threads "1 2"] [--cases "0 1 .. 11"]
#                    [--variant LABEL=CONFIG]... [--no-floor] --out FILE
#
#   --rounds N    interleaved rounds (default 3): in each round every case
#                 runs the floor, then pinpool as built, then each variant
#   --variant     LABEL=CONFIG: pinpool with PINPOOL_CONFIG-style CONFIG
#                 (pp_bench --config), recorded as LABEL; repeatable
#   --out FILE    raw records, one line each: "<label>\t<R record>"
#                 (appended; bench/w2cliff_report.py makes the table)
#
# Environment: BENCH_BUILD_DIR (default build/release) holds bench/pp_bench.
# Faults an operation, memory held and backend calls do not depend on the
# machine's load; time ratios do: say the load (uptime is recorded in FILE
# as "# load ..." lines before each round).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BENCH_BUILD_DIR:-$ROOT/build/release}"
BIN="$BUILD/bench/pp_bench"
ROUNDS=3
THREADS="1 2"
CASES=""
FLOOR=1
OUTF=""
declare -a VARIANTS=()
while (($#)); do
  case "$1" in
    --rounds) ROUNDS="${2:?}"; shift ;;
    --threads) THREADS="${2:?}"; shift ;;
    --cases) CASES="${2:?}"; shift ;;
    --variant) VARIANTS+=("${2:?}"); shift ;;
    --no-floor) FLOOR=0 ;;
    --out) OUTF="${2:?}"; shift ;;
    *) echo "w2cliff.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$OUTF" ]] || { echo "w2cliff.sh: --out FILE is required" >&2; exit 2; }
[[ -x "$BIN" ]] || { echo "w2cliff.sh: no $BIN (build pp_bench)" >&2; exit 2; }

run() { # label threads case impl [config]
  local label="$1" t="$2" c="$3" impl="$4" cfg="${5:-}"
  local args=(--workload W2 --impl "$impl" --mode touch --threads "$t"
    --case "$c" --rep "$r")
  [[ -n "$cfg" ]] && args+=(--config "$cfg")
  local line
  if ! line="$("$BIN" "${args[@]}" 2>/dev/null | grep '^R')"; then
    echo "w2cliff.sh: run failed: ${args[*]}" >&2
    return 1
  fi
  printf '%s\t%s\n' "$label" "$line" >>"$OUTF"
}

for ((r = 1; r <= ROUNDS; r++)); do
  echo "# load round $r: $(uptime)" >>"$OUTF"
  for t in $THREADS; do
    n="$("$BIN" --list W2 --threads "$t")"
    cs="$CASES"
    [[ -n "$cs" ]] || cs="$(seq 0 $((n - 1)))"
    for c in $cs; do
      ((FLOOR)) && run floor "$t" "$c" floor
      run pinpool "$t" "$c" pinpool
      for v in "${VARIANTS[@]}"; do
        run "${v%%=*}" "$t" "$c" pinpool "${v#*=}"
      done
    done
  done
done
