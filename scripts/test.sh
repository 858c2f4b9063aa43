#!/usr/bin/env bash
# shellcheck disable=SC2317 # functions are called indirectly through step()
# The project's test command (CI runs it through .ci/run).
#
#   scripts/test.sh
#
# 1. installs the Debian packages it needs (as root; otherwise checks them),
# 2. for each preset release, debug, asan, tsan: configure, build, ctest
#    (in release and debug this includes the Python module's pytest suite,
#    tests/python, whose result line is printed after ctest),
# 3. the Python package as users install it (tests/python/package.sh, after
#    the release preset: pip install into a fresh virtual environment,
#    the wheel, tests/python against the installed copy, mypy on the stub,
#    the package and the examples of docs/python.md; about a minute),
# 4. the Python module on a free-threaded CPython 3.13 with ThreadSanitizer
#    (tests/freethreaded/run.sh: builds that interpreter from Debian trixie's
#    source package the first time, 3-11 minutes, then reuses it from
#    /var/cache/pinpool; the stress suite, tests/python without NumPy and
#    torch, and three race mutants that must be reported),
# 5. lint (scripts/lint.sh build/release),
# 6. install-consumer test (tests/consumer/run.sh build/release),
# 7. bench/run.sh --quick if present (with the fake CUDA driver when the
#    release build has it: the GPU implementations run through it too).
# Every step runs even when an earlier one failed; a summary follows and the
# exit status is non-zero if any step failed.
#
# Environment: PRESETS="release debug" to run a subset of the presets,
# SKIP_APT=1 to skip the package step, SKIP_PYTHON_PACKAGE=1 to skip step 3
# and SKIP_FREETHREADED=1 step 4 (for quick local runs; CI runs them).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2

export DEBIAN_FRONTEND=noninteractive
JOBS="$(nproc 2>/dev/null || echo 2)"
PRESETS="${PRESETS:-release debug asan tsan}"

PACKAGES=(build-essential cmake ninja-build clang clang-tidy clang-format
  cppcheck pkg-config libcmocka-dev
  libclang-rt-14-dev llvm
  python3-dev python3-numpy python3-pytest python3-torch
  python3-setuptools python3-wheel python3-venv python3-build mypy
  libjansson-dev libdw-dev libunwind8 python3-jsonschema chromium
  dpkg-dev xz-utils libffi-dev)
OPTIONAL_PACKAGES=(valgrind)

declare -a RESULTS=()
FAILED=0
START_ALL=$SECONDS

# Every step's output is also kept in build/test-logs/STEP.log: where only
# the end of the output is shown (a CI log's tail), the lines that say why a
# step failed are printed again after the summary.
LOGDIR="$ROOT/build/test-logs"
mkdir -p "$LOGDIR"
declare -a FAILED_LOGS=()

# step NAME COMMAND...: run, time and record one step.
step() {
  local name="$1" t0=$SECONDS rc
  local log="$LOGDIR/${name//[^A-Za-z0-9_.-]/_}.log"
  shift
  echo
  echo "==================== $name ===================="
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0))
  if ((rc == 0)); then
    RESULTS+=("PASS  $name (${dt}s)")
  else
    RESULTS+=("FAIL  $name (exit $rc, ${dt}s)")
    FAILED_LOGS+=("$name|$log")
    FAILED=1
  fi
  return "$rc"
}

# why_failed: for each failed step, the lines of its log that name the
# failure (sanitizer reports, failed tests and checks, the fuzzers' crash
# inputs), at most 12, else its last 12 lines.
why_failed() {
  local entry name log lines
  for entry in "${FAILED_LOGS[@]}"; do
    name="${entry%%|*}"
    log="${entry#*|}"
    echo
    echo "---- why '$name' failed (whole output: ${log#"$ROOT"/}) ----"
    lines="$(grep -E -a '(^|[^a-z])(ERROR|FAILED|FAIL|SUMMARY|Assertion|CHECK|panic|Traceback|timed out|Timeout|crash input|deadly signal|pinpool fuzz:|ALARM|[Ee]rror:)' \
      "$log" | grep -v -a "^PASS" | tail -n 12)"
    if [[ -n "$lines" ]]; then
      printf '%s\n' "$lines"
    else
      tail -n 12 "$log"
    fi
  done
}

missing_packages() {
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
      grep -q "install ok installed"; then
      echo "$p"
    fi
  done
}

install_packages() {
  if [[ "${SKIP_APT:-0}" == 1 ]]; then
    echo "SKIP_APT=1: not installing packages"
    return 0
  fi
  if ! command -v dpkg-query >/dev/null; then
    echo "no dpkg: cannot check packages; assuming the tools are present"
    return 0
  fi
  local missing optional
  mapfile -t missing < <(missing_packages "${PACKAGES[@]}")
  mapfile -t optional < <(missing_packages "${OPTIONAL_PACKAGES[@]}")
  if ((${#missing[@]} == 0 && ${#optional[@]} == 0)); then
    echo "all packages present"
    return 0
  fi
  if [[ "$(id -u)" != 0 ]]; then
    if ((${#missing[@]})); then
      echo "not root and packages are missing: ${missing[*]}" >&2
      echo "install them with: apt-get install -y ${missing[*]}" >&2
      return 1
    fi
    echo "not root: skipping optional packages (${optional[*]})"
    return 0
  fi
  echo "installing: ${missing[*]} ${optional[*]}"
  apt-get update -q || return 1
  if ((${#missing[@]})); then
    apt-get install -y -q --no-install-recommends "${missing[@]}" || return 1
  fi
  if ((${#optional[@]})); then
    apt-get install -y -q --no-install-recommends "${optional[@]}" ||
      echo "optional packages not installed: ${optional[*]} (continuing)"
  fi
  return 0
}

# Sanitizer runtimes of clang 14 cannot map their shadow memory when the
# kernel randomizes mmap with more than 28 bits; run those tests without ASLR.
NO_ASLR=()
rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)"
if ((rnd_bits > 28)) && command -v setarch >/dev/null; then
  NO_ASLR=(setarch "$(uname -m)" -R)
fi

# run_preset NAME: configure, build and test one preset.
run_preset() {
  local p="$1"
  cmake --preset "$p" || return 1
  cmake --build --preset "$p" -j "$JOBS" || return 1
  case "$p" in
    tsan)
      TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
        "${NO_ASLR[@]}" ctest --preset "$p" -j "$JOBS"
      ;;
    asan)
      # intercept_tls_get_addr=0 is compiled into every executable of this
      # build (cmake/asan_defaults.c says why).
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" \
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        "${NO_ASLR[@]}" ctest --preset "$p" -j "$JOBS"
      ;;
    *)
      local rc=0
      ctest --preset "$p" -j "$JOBS" || rc=$?
      show_pytest_line "$p"
      return "$rc"
      ;;
  esac
}

# The Python tests run inside ctest (test python_tests), which shows their
# output only on failure: print pytest's result line in any case.
show_pytest_line() {
  local log="build/$1/Testing/Temporary/LastTest.log" line
  if [[ ! -f "$log" ]] || ! grep -q "python_tests" "$log"; then
    echo "pytest ($1): not run (no Python module or pytest; see python/)"
    return 0
  fi
  line="$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped)' "$log" |
    tail -n 1)"
  echo "pytest ($1): ${line:-no result line (see $log)}"
}

echo "pinpool tests in $ROOT ($JOBS jobs, presets: $PRESETS)"

if ! step "packages" install_packages; then
  echo "package installation failed; continuing with what is installed"
fi

for p in $PRESETS; do
  step "preset $p" run_preset "$p"
done

# The package from the sources, installed as a user would (after the
# release preset: its fake CUDA driver serves the CUDA-pinned tests).
if [[ "${SKIP_PYTHON_PACKAGE:-0}" == 1 ]]; then
  RESULTS+=("SKIP  python package (SKIP_PYTHON_PACKAGE=1)")
elif [[ " $PRESETS " == *" release "* ]]; then
  step "python package" tests/python/package.sh build/release
fi

# A build failure of the interpreter fails this step: never a silent skip.
if [[ "${SKIP_FREETHREADED:-0}" == 1 ]]; then
  echo
  echo "SKIP_FREETHREADED=1: not running tests/freethreaded"
  RESULTS+=("SKIP  python free-threaded tsan (SKIP_FREETHREADED=1)")
else
  step "python free-threaded tsan" env JOBS="$JOBS" tests/freethreaded/run.sh
fi

step "lint" scripts/lint.sh build/release

if [[ -f build/release/CMakeCache.txt ]]; then
  step "install consumer" tests/consumer/run.sh build/release
else
  RESULTS+=("FAIL  install consumer (build/release not configured)")
  FAILED=1
fi

# Fuzzing: libFuzzer on the asan build for FUZZ_SECONDS (default 60) from
# the seed corpus; crash inputs land in build/fuzz-artifacts/ (tests/fuzz).
if [[ " $PRESETS " == *" asan "* && -x tests/fuzz/run.sh ]]; then
  step "fuzz" tests/fuzz/run.sh "${FUZZ_SECONDS:-60}"
fi

if [[ -f bench/run.sh ]]; then
  # With the fake CUDA driver, so that the GPU implementations (which join
  # where a driver has a device) go through the whole pipeline too: runs,
  # report, charts, JSON check. Their numbers mean nothing there.
  FAKE_CUDA="$ROOT/build/release/tests/fake_cuda/libfakecuda.so"
  if [[ -f "$FAKE_CUDA" ]]; then
    step "bench --quick" env PINPOOL_LIBCUDA="$FAKE_CUDA" bash bench/run.sh --quick
  else
    step "bench --quick" bash bench/run.sh --quick
  fi
fi

echo
echo "==================== summary ===================="
printf '%s\n' "${RESULTS[@]}"
echo "total: $((SECONDS - START_ALL))s"
if ((FAILED)); then
  why_failed
  echo "RESULT: FAILED"
  exit 1
fi
echo "RESULT: OK"
exit 0
