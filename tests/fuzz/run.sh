#!/usr/bin/env bash
# Run the libFuzzer target for a bounded time.
#
#   tests/fuzz/run.sh [SECONDS]        (default 60)
#
# Environment:
#   FUZZER=path    the libFuzzer binary (default build/asan/tests/fuzz/
#                  pp_fuzz_pinpool, built by the asan preset)
#   FUZZ_OUT=dir   where crash/leak/timeout inputs go (default
#                  build/fuzz-artifacts); created if needed
#   FUZZ_ARGS=...  extra libFuzzer flags (e.g. "-jobs=2 -workers=2")
#
# The fuzzer starts from tests/fuzz/corpus and tests/fuzz/regressions (read
# only: the committed corpus never grows by itself) and writes the inputs
# it finds to a temporary directory, deleted at the end. Exits non-zero if
# the fuzzer found a crash, a leak, a timeout (10 s) or an out-of-memory
# (2048 MiB RSS), and prints the path of the input that triggered it;
# reproduce it with pp_fuzz_replay (tests/fuzz/README.md).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2

SECONDS_TO_RUN="${1:-60}"
if ! [[ "$SECONDS_TO_RUN" =~ ^[0-9]+$ ]] || ((SECONDS_TO_RUN < 1)); then
  echo "usage: $0 [SECONDS]" >&2
  exit 2
fi
FUZZER="${FUZZER:-build/asan/tests/fuzz/pp_fuzz_pinpool}"
OUT="${FUZZ_OUT:-build/fuzz-artifacts}"
if [[ ! -x "$FUZZER" ]]; then
  echo "fuzz: no fuzzer at $FUZZER" >&2
  echo "build it with: cmake --preset asan && cmake --build --preset asan" >&2
  exit 2
fi
mkdir -p "$OUT" || exit 2
NEW="$(mktemp -d "${TMPDIR:-/tmp}/pinpool-fuzz.XXXXXX")" || exit 2
trap 'rm -rf "$NEW"' EXIT

# clang 14's sanitizer runtimes cannot map their shadow memory when the
# kernel randomizes mmap with more than 28 bits (as scripts/test.sh).
NO_ASLR=()
rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)"
if ((rnd_bits > 28)) && command -v setarch >/dev/null; then
  NO_ASLR=(setarch "$(uname -m)" -R)
fi

# Artifacts of earlier runs are kept; note which ones are new.
stamp="$NEW/.start"
touch "$stamp"

echo "fuzz: $FUZZER for ${SECONDS_TO_RUN}s, artifacts in $OUT/"
# shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:malloc_context_size=10}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
  "${NO_ASLR[@]}" "$FUZZER" \
  -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$OUT/" ${FUZZ_ARGS:-} \
  "$NEW" tests/fuzz/corpus tests/fuzz/regressions
rc=$?

mapfile -t found < <(find "$OUT" -maxdepth 1 -type f -newer "$stamp" \
  \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
  -o -name 'oom-*' -o -name 'slow-unit-*' \) | sort)
if ((rc != 0)); then
  echo "fuzz: FAILED (libFuzzer exit $rc)"
  for f in "${found[@]}"; do
    echo "fuzz: crash input: $f"
    echo "  reproduce: $(dirname "$FUZZER")/pp_fuzz_replay $f"
  done
  exit 1
fi
echo "fuzz: OK (${SECONDS_TO_RUN}s, no crash)"
exit 0
