#!/usr/bin/env bash
# Run the libFuzzer targets for a bounded time.
#
#   tests/fuzz/run.sh [SECONDS]        (default 60, for both targets)
#
# Two targets share the time: pp_fuzz_pinpool (the API, two thirds of it)
# and pp_fuzz_snapshot (the snapshot reader, the rest); each gets at least
# one second.
#
# Environment:
#   FUZZER=path           the API fuzzer (default build/asan/tests/fuzz/
#                         pp_fuzz_pinpool, built by the asan preset)
#   FUZZER_SNAPSHOT=path  the snapshot reader fuzzer (default build/asan/
#                         tests/fuzz/pp_fuzz_snapshot)
#   FUZZ_TARGETS=...      which to run: "pinpool snapshot" (default),
#                         "pinpool" or "snapshot" (then it gets all the time)
#   FUZZ_OUT=dir          where crash/leak/timeout inputs go (default
#                         build/fuzz-artifacts); created if needed; the
#                         snapshot fuzzer's are named snapshot-crash-...
#   FUZZ_ARGS=...         extra libFuzzer flags (e.g. "-jobs=2 -workers=2")
#
# The API fuzzer starts from tests/fuzz/corpus and tests/fuzz/regressions,
# the snapshot fuzzer from tests/fuzz/corpus_snapshot (read only: the
# committed corpora never grow by themselves) with a dictionary of the
# format's keys and values; the inputs they find go to a temporary
# directory, deleted at the end. Exits non-zero if a fuzzer found a crash, a
# leak, a timeout (10 s) or an out-of-memory (2048 MiB RSS), and prints the
# path of the input that triggered it; reproduce it with pp_fuzz_replay or
# pp_fuzz_snapshot_replay (tests/fuzz/README.md). Exit 2: usage error or a
# fuzzer not built.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2

SECONDS_TO_RUN="${1:-60}"
if ! [[ "$SECONDS_TO_RUN" =~ ^[0-9]+$ ]] || ((SECONDS_TO_RUN < 1)); then
  echo "usage: $0 [SECONDS]" >&2
  exit 2
fi
FUZZER="${FUZZER:-build/asan/tests/fuzz/pp_fuzz_pinpool}"
FUZZER_SNAPSHOT="${FUZZER_SNAPSHOT:-build/asan/tests/fuzz/pp_fuzz_snapshot}"
read -r -a TARGETS <<<"${FUZZ_TARGETS:-pinpool snapshot}"
OUT="${FUZZ_OUT:-build/fuzz-artifacts}"

run_pinpool=0
run_snapshot=0
for t in "${TARGETS[@]}"; do
  case "$t" in
  pinpool) run_pinpool=1 ;;
  snapshot) run_snapshot=1 ;;
  *)
    echo "fuzz: unknown target '$t' in FUZZ_TARGETS (pinpool, snapshot)" >&2
    exit 2
    ;;
  esac
done
if ((run_pinpool + run_snapshot == 0)); then
  echo "fuzz: FUZZ_TARGETS names no target (pinpool, snapshot)" >&2
  exit 2
fi
for pair in "$run_pinpool:$FUZZER" "$run_snapshot:$FUZZER_SNAPSHOT"; do
  if [[ "${pair%%:*}" == 1 && ! -x "${pair#*:}" ]]; then
    echo "fuzz: no fuzzer at ${pair#*:}" >&2
    echo "build it with: cmake --preset asan && cmake --build --preset asan" >&2
    exit 2
  fi
done

# The API fuzzer has the larger state space: two thirds of the time.
pinpool_seconds=$SECONDS_TO_RUN
snapshot_seconds=$SECONDS_TO_RUN
if ((run_pinpool && run_snapshot)); then
  snapshot_seconds=$((SECONDS_TO_RUN / 3))
  ((snapshot_seconds < 1)) && snapshot_seconds=1
  pinpool_seconds=$((SECONDS_TO_RUN - snapshot_seconds))
  ((pinpool_seconds < 1)) && pinpool_seconds=1
fi

mkdir -p "$OUT" || exit 2
WORK="$(mktemp -d "${TMPDIR:-/tmp}/pinpool-fuzz.XXXXXX")" || exit 2
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/pinpool" "$WORK/snapshot" || exit 2

# The format's keys and enum values: random bytes seldom spell them, and a
# snapshot with a misspelt key is rejected before anything deep runs.
DICT="$WORK/snapshot.dict"
{
  for w in format pinpool-snapshot version pinpool_version pid time_ns \
    unix_time gather_ns max_hold_ns backend config stats totals segments \
    frames stacks history address size block_size class blocks_total \
    uncarved_blocks tail_bytes flags blocks state requested_size streams \
    thread stack function offset module file line record stack_depth \
    max_entries recorded dropped fields entries allocated pending_free \
    cached page_locked mlock_failed huge_advised reserve segment_alloc \
    alloc free_requested free_completed segment_free empty_cache oom none \
    all current peak freed count total_ns max_ns seq stream \
    reserved_bytes cached_bytes pending_bytes; do
    printf '"\\"%s\\""\n' "$w"
  done
  for v in null true false 0 -1 1.5 1e308 9223372036854775807 \
    9223372036854775808 '[]' '{}' '[[' '\\u0000' '\\ud800' \
    '\"0x' '\"0xffffffffffffffff\"'; do
    printf '"%s"\n' "$v"
  done
} >"$DICT" || exit 2

# clang 14's sanitizer runtimes cannot map their shadow memory when the
# kernel randomizes mmap with more than 28 bits (as scripts/test.sh).
NO_ASLR=()
rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)"
if ((rnd_bits > 28)) && command -v setarch >/dev/null; then
  NO_ASLR=(setarch "$(uname -m)" -R)
fi

# Artifacts of earlier runs are kept; note which ones are new.
stamp="$WORK/.start"
touch "$stamp"

# run_fuzzer BINARY SECONDS PREFIX FLAG NEWDIR CORPUS... (FLAG: one more
# libFuzzer flag or ""). libFuzzer writes what it finds to the first
# directory: NEWDIR, never the committed corpus.
run_fuzzer() {
  local bin="$1" secs="$2" prefix="$3" flag="$4"
  shift 4
  echo "fuzz: $bin for ${secs}s, artifacts in $OUT/"
  # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:malloc_context_size=10}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    "${NO_ASLR[@]}" "$bin" \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$OUT/$prefix" ${FUZZ_ARGS:-} \
    ${flag:+"$flag"} "$@"
}

rc_pinpool=0
rc_snapshot=0
if ((run_pinpool)); then
  run_fuzzer "$FUZZER" "$pinpool_seconds" "" "" "$WORK/pinpool" \
    tests/fuzz/corpus tests/fuzz/regressions
  rc_pinpool=$?
fi
if ((run_snapshot)); then
  run_fuzzer "$FUZZER_SNAPSHOT" "$snapshot_seconds" "snapshot-" \
    -dict="$DICT" "$WORK/snapshot" tests/fuzz/corpus_snapshot
  rc_snapshot=$?
fi

mapfile -t found < <(find "$OUT" -maxdepth 1 -type f -newer "$stamp" \
  \( -name '*crash-*' -o -name '*leak-*' -o -name '*timeout-*' \
  -o -name '*oom-*' -o -name '*slow-unit-*' \) | sort)
if ((rc_pinpool != 0 || rc_snapshot != 0)); then
  ((rc_pinpool != 0)) && echo "fuzz: FAILED ($FUZZER: libFuzzer exit $rc_pinpool)"
  ((rc_snapshot != 0)) &&
    echo "fuzz: FAILED ($FUZZER_SNAPSHOT: libFuzzer exit $rc_snapshot)"
  for f in "${found[@]}"; do
    echo "fuzz: crash input: $f"
    case "$(basename "$f")" in
    snapshot-*)
      echo "  reproduce: $(dirname "$FUZZER_SNAPSHOT")/pp_fuzz_snapshot_replay $f"
      ;;
    *) echo "  reproduce: $(dirname "$FUZZER")/pp_fuzz_replay $f" ;;
    esac
  done
  exit 1
fi
echo "fuzz: OK (${SECONDS_TO_RUN}s, no crash)"
exit 0
