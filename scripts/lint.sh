#!/usr/bin/env bash
# Static checks: clang-format, clang-tidy (src/ only) and cppcheck (src/).
#
#   scripts/lint.sh [BUILD_DIR]
#
# BUILD_DIR holds compile_commands.json for clang-tidy (default build/release;
# a relative path is taken from the repository root). Runs every check, then
# exits non-zero if any failed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2

BUILD_DIR="${1:-build/release}"
case "$BUILD_DIR" in
  /*) ;;
  *) BUILD_DIR="$ROOT/$BUILD_DIR" ;;
esac

CLANG_FORMAT="${CLANG_FORMAT:-clang-format}"
CLANG_TIDY="${CLANG_TIDY:-clang-tidy}"
CPPCHECK="${CPPCHECK:-cppcheck}"
JOBS="${LINT_JOBS:-$(nproc 2>/dev/null || echo 2)}"

failed=()

# Existing files matching the given globs (shell patterns, nullglob-expanded).
collect() {
  local f
  shopt -s nullglob
  for f in "$@"; do
    [[ -f "$f" ]] && printf '%s\n' "$f"
  done
  shopt -u nullglob
}

# ---- clang-format -----------------------------------------------------------
mapfile -t FORMAT_FILES < <(
  shopt -s nullglob
  collect include/*.h src/*.c src/*.h tools/*.c tools/*.h \
    tests/*.c tests/*.h tests/consumer/*.c tests/cuda/*.c tests/cuda/*.h \
    tests/fake_cuda/*.c tests/fake_cuda/*.h tests/fuzz/*.c tests/fuzz/*.h \
    bench/*.c bench/*.h \
    python/*.c python/*.h
)
echo "== clang-format (${#FORMAT_FILES[@]} files)"
if ((${#FORMAT_FILES[@]})); then
  if ! "$CLANG_FORMAT" --dry-run --Werror "${FORMAT_FILES[@]}"; then
    echo "clang-format: FAILED (fix with: clang-format -i <files>)"
    failed+=(clang-format)
  fi
fi

# ---- clang-tidy ---------------------------------------------------------------
mapfile -t SRC_FILES < <(collect src/*.c)
echo "== clang-tidy (${#SRC_FILES[@]} files, database $BUILD_DIR)"
if ((${#SRC_FILES[@]})); then
  if [[ ! -f "$BUILD_DIR/compile_commands.json" ]]; then
    echo "clang-tidy: no $BUILD_DIR/compile_commands.json" \
      "(configure first: cmake --preset release)"
    failed+=(clang-tidy)
  else
    # The library is built with gcc's -mtls-dialect=gnu2 (CMakeLists.txt,
    # the TLS model), which clang 14 does not know: clang-tidy reads a
    # copy of the database without it.
    TIDY_DB="$(mktemp -d)"
    sed 's/ -mtls-dialect=gnu2//g' "$BUILD_DIR/compile_commands.json" \
      >"$TIDY_DB/compile_commands.json"
    # One process per file, JOBS at a time; each prints its own findings.
    if ! printf '%s\0' "${SRC_FILES[@]}" |
      xargs -0 -n 1 -P "$JOBS" "$CLANG_TIDY" --quiet -p "$TIDY_DB"; then
      echo "clang-tidy: FAILED"
      failed+=(clang-tidy)
    fi
    rm -rf "$TIDY_DB"
  fi
fi

# ---- cppcheck -----------------------------------------------------------------
# Two configurations: the default build and PINPOOL_DEBUG (validator) code.
echo "== cppcheck"
if ((${#SRC_FILES[@]})); then
  for defs in "" "-DPINPOOL_DEBUG=2"; do
    # shellcheck disable=SC2086 # $defs is empty or one word
    if ! "$CPPCHECK" --quiet --std=c11 -j "$JOBS" \
      --enable=warning,performance,portability \
      --error-exitcode=1 --inline-suppr \
      --suppress=missingIncludeSystem \
      -D__GNUC__=12 -D__linux__ -D_GNU_SOURCE -DPINPOOL_BUILDING $defs \
      -I include -I src src/; then
      echo "cppcheck${defs:+ ($defs)}: FAILED"
      failed+=("cppcheck${defs:+ $defs}")
    fi
  done
fi

if ((${#failed[@]})); then
  echo "lint: FAILED: ${failed[*]}"
  exit 1
fi
echo "lint: OK"
