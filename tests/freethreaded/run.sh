#!/usr/bin/env bash
# The Python module under a free-threaded CPython with ThreadSanitizer
# (docs/verification.md, "The Python module, free-threaded").
#
#   tests/freethreaded/run.sh [BUILD_DIR]     (default build/freethreaded)
#
# 1. a CPython 3.13 built with --disable-gil --with-thread-sanitizer
#    (build-python.sh: Debian trixie's source package, cached outside the
#    repository after the first run);
# 2. the library and the module compiled with -fsanitize=thread against it,
#    once clean and once per race mutant (a direct compile: the variants
#    differ in one file each, not worth a CMake tree apiece), and the fake
#    CUDA driver;
# 3. every test of tests/python that does not need NumPy or torch (they skip
#    themselves: those packages do not exist for this interpreter), then the
#    free-threaded stress suite (test_ft_stress.py), both with Debian's
#    pytest, and zero ThreadSanitizer reports allowed;
# 4. each mutant must be reported by TSAN in a pinpool frame: a mutant that
#    goes unreported fails the step (a silent TSAN proves nothing).
#
# Exit status: 0 only if every part passed; a failed interpreter build is a
# failure, never a skip.
#
# Environment: JOBS (parallel compiles), FT_SECONDS (length of the
# time-bound stress tests, default 1), PINPOOL_FT_CACHE and
# PINPOOL_FT_DOWNLOADS (build-python.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${1:-$ROOT/build/freethreaded}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# Sanitizer runtimes of clang 14 cannot map their shadow memory when the
# kernel randomizes mmap with more than 28 bits (as scripts/test.sh).
NO_ASLR=()
rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)"
if ((rnd_bits > 28)) && command -v setarch >/dev/null; then
  NO_ASLR=(setarch "$(uname -m)" -R)
fi

t_start=$SECONDS
# "-- NAME (T s)": T is the time since the start of the step.
phase() { echo "-- $* ($((SECONDS - t_start))s)"; }

# ---- 1. the interpreter --------------------------------------------------------
phase "interpreter"
if ! PREFIX="$("$HERE/build-python.sh")"; then
  echo "FAIL: could not build the free-threaded TSAN CPython (see above)" >&2
  exit 1
fi
PY="$PREFIX/bin/python3.13t"
echo "interpreter: $PY"

# ---- 2. library and module, with -fsanitize=thread ---------------------------------
phase "compile"
read -r PYINC EXT <<<"$("${NO_ASLR[@]}" "$PY" -c \
  'import sysconfig as s; print(s.get_path("include"), s.get_config_var("EXT_SUFFIX"))')"
# The flags of the tsan preset (CMakeLists.txt) plus what a Python module
# needs; -Werror as the presets.
CFLAGS=(-std=c11 -g -O1 -fsanitize=thread -fno-omit-frame-pointer -fPIC
  -fvisibility=hidden -Wall -Wextra -Wshadow -Wstrict-prototypes
  -Wmissing-prototypes -Werror -I"$ROOT/include" -I"$ROOT/src")
# Python's headers as system headers: our warnings, not theirs.
MODFLAGS=(-isystem "$PYINC" -I"$ROOT/python")
MODULE_SRC="$ROOT/python/pinpoolmodule.c"
LIB_SRCS=("$ROOT"/src/*.c)

# The mutants: NAME and the test that must make TSAN report it, and a
# pattern for the pinpool frame the report must show. ATTR_FLAG_PLAIN and
# EXPORT_COUNT_PLAIN are the library's (src/buffer.c); DEFAULT_POOL_PLAIN
# is the module's one piece of lazy state (python/pinpoolmodule.c).
MUTANTS=(ATTR_FLAG_PLAIN EXPORT_COUNT_PLAIN DEFAULT_POOL_PLAIN)
declare -A MUTANT_TEST=(
  [ATTR_FLAG_PLAIN]=test_lazy_attributes_first_queried_by_many_threads
  [EXPORT_COUNT_PLAIN]=test_many_threads_export_one_buffer
  [DEFAULT_POOL_PLAIN]=test_default_pool_creation_race)
declare -A MUTANT_FRAME=(
  [ATTR_FLAG_PLAIN]='pinpool_buffer_attrs|attr_begin'
  [EXPORT_COUNT_PLAIN]='hold_acquire|hold_release'
  [DEFAULT_POOL_PLAIN]='get_default_pool')

# compile SRC OBJ [DEFINE]: one object.
compile() {
  local src="$1" obj="$2"
  shift 2
  local extra=()
  [[ "$src" == "$MODULE_SRC" ]] && extra=("${MODFLAGS[@]}")
  mkdir -p "$(dirname "$obj")"
  clang "${CFLAGS[@]}" "${extra[@]}" -DPINPOOL_BUILDING "$@" -c "$src" -o "$obj"
}

# Every object of every variant, as "SRC OBJ [DEFINE]" lines, compiled
# JOBS at a time. A variant recompiles only the files that name its macro;
# a mutant that no file names any more is an error (it would "pass" by
# testing the clean code). Objects are made afresh every run: they take
# seconds, and stale ones would hide an edit (no dependency tracking here).
compile_jobs=()
declare -A VARIANT_OBJS
base_objs=()
for src in "${LIB_SRCS[@]}" "$MODULE_SRC"; do
  obj="$OUT/obj/clean/$(basename "$src" .c).o"
  base_objs+=("$obj")
  compile_jobs+=("$src $obj")
done
VARIANT_OBJS[clean]="${base_objs[*]}"
for m in "${MUTANTS[@]}"; do
  objs=()
  touched=0
  for src in "${LIB_SRCS[@]}" "$MODULE_SRC"; do
    obj="$OUT/obj/clean/$(basename "$src" .c).o"
    if grep -q "PINPOOL_MUTANT_$m\b" "$src"; then
      obj="$OUT/obj/$m/$(basename "$src" .c).o"
      compile_jobs+=("$src $obj -DPINPOOL_MUTANT_$m")
      touched=1
    fi
    objs+=("$obj")
  done
  if ((!touched)); then
    echo "FAIL: no source file uses PINPOOL_MUTANT_$m" >&2
    exit 1
  fi
  VARIANT_OBJS[$m]="${objs[*]}"
done
rm -rf "$OUT/obj" "$OUT/compile.failed"
for job in "${compile_jobs[@]}"; do
  while (($(jobs -rp | wc -l) >= JOBS)); do
    wait -n || true
  done
  # shellcheck disable=SC2086 # "SRC OBJ [DEFINE]": our paths, no spaces
  { compile $job || touch "$OUT/compile.failed"; } &
done
wait
if [[ -e "$OUT/compile.failed" ]]; then
  echo "FAIL: compiling the library or the module with -fsanitize=thread" >&2
  exit 1
fi
# The fake CUDA driver (tests/fake_cuda), for CUDA-pinned pools: its
# pointer queries are part of the lazy attributes.
FAKE_CUDA="$OUT/libfakecuda.so"
if ! clang -std=c11 -g -O1 -fsanitize=thread -fPIC -shared \
  -I"$ROOT/tests/fake_cuda" "$ROOT/tests/fake_cuda/fake_cuda.c" \
  -o "$FAKE_CUDA" -pthread -Wl,-z,nodelete; then
  echo "FAIL: compiling the fake CUDA driver with -fsanitize=thread" >&2
  exit 1
fi
# Each variant is the package: python/pinpool/'s Python files and the C
# core as pinpool/_core (the command-line tool, pinpool._cli, is not
# built: it is no part of the module's thread-safety).
for v in clean "${MUTANTS[@]}"; do
  rm -rf "${OUT:?}/$v"
  mkdir -p "$OUT/$v/pinpool"
  cp "$ROOT"/python/pinpool/*.py "$ROOT"/python/pinpool/*.pyi \
    "$ROOT"/python/pinpool/py.typed "$OUT/$v/pinpool/"
  # shellcheck disable=SC2086 # a list of object paths (no spaces: ours)
  clang -shared -fsanitize=thread -o "$OUT/$v/pinpool/_core$EXT" \
    ${VARIANT_OBJS[$v]} -lpthread -ldl -lm
done

# ---- 3. pytest for this interpreter ----------------------------------------------
# Debian's python3-pytest is pure Python, as are its dependencies: a
# directory of links to just those packages (not the whole dist-packages,
# whose compiled modules are built for Debian's 3.11, and whose NumPy and
# torch would be found and fail to load instead of being missing).
SITE="$OUT/site"
rm -rf "$SITE"
mkdir -p "$SITE"
DIST=/usr/lib/python3/dist-packages
for p in pytest _pytest py.py pluggy iniconfig attr attrs packaging; do
  if [[ ! -e "$DIST/$p" ]]; then
    echo "FAIL: $DIST/$p missing (apt-get install python3-pytest)" >&2
    exit 1
  fi
  ln -s "$DIST/$p" "$SITE/$p"
done

# The suppressions: CPython's own file for this build (Tools/tsan, copied
# next to the interpreter by build-python.sh) and ours (tsan-suppressions.txt:
# ctypes' own races in 3.13), interpreter-internal races only
# (docs/verification.md says why each one is).
SUPP="$OUT/tsan-suppressions.txt"
cat "$PREFIX/tsan-suppressions.txt" "$HERE/tsan-suppressions.txt" >"$SUPP"

# run_py LOG TSAN_EXTRA VARIANT ARGS...: the interpreter with the variant's
# module first on the path; output to LOG. Byte code is cached beside the
# interpreter (PYTHONPYCACHEPREFIX): this interpreter compiles slowly, and
# pytest alone takes 15 s to compile; the repository gets no __pycache__.
run_py() {
  local log="$1" tsan_extra="$2" variant="$3"
  shift 3
  env -u PINPOOL_CONF -u PYTHONHOME -u PYTHONDONTWRITEBYTECODE \
    PYTHONPATH="$OUT/$variant:$SITE" PINPOOL_LIBCUDA="$FAKE_CUDA" \
    PYTHONPYCACHEPREFIX="$PREFIX/pycache" \
    TSAN_OPTIONS="suppressions=$SUPP second_deadlock_stack=1 $tsan_extra" \
    "${NO_ASLR[@]}" timeout 900 "$PY" "$@" >"$log" 2>&1
}

# -s: no capture, so that TSAN's reports (written to fd 2, from this
# process and its children) reach the log for passing tests too.
# pytest 7.2's assertion rewriting uses ast.Str, deprecated in 3.12: its
# warnings (a thousand lines) are pytest's, not ours.
PYTEST=(-m pytest -s -rs -p no:cacheprovider --durations=5
  -W "ignore::DeprecationWarning:_pytest.assertion.rewrite")
failed=0

# tsan_reports LOG: how many reports LOG holds.
tsan_reports() { grep -c "WARNING: ThreadSanitizer" "$1" || true; }

check_run() {
  local name="$1" log="$2" rc="$3" n
  n="$(tsan_reports "$log")"
  local summary
  summary="$(grep -E '^=+ .*(passed|failed|error|skipped).* =+$' "$log" | tail -n 1)"
  if ((rc == 0 && n == 0)); then
    echo "PASS  $name: ${summary:-?}, 0 TSAN reports"
  else
    echo "FAIL  $name: exit $rc, $n TSAN report(s): ${summary:-?} (log: $log)"
    # The first reports and pytest's failures, for the CI log.
    grep -m 3 -A 30 "WARNING: ThreadSanitizer" "$log" || true
    grep -E "^(FAILED|ERROR)|Error" "$log" | head -n 20 || true
    tail -n 30 "$log"
    failed=1
  fi
}

phase "tests/python (no NumPy, no torch)"
rc=0
run_py "$OUT/tests-python.log" "halt_on_error=0 exitcode=66" clean \
  "${PYTEST[@]}" "$ROOT/tests/python" || rc=$?
check_run "tests/python" "$OUT/tests-python.log" "$rc"
grep -E "^SKIPPED" "$OUT/tests-python.log" | sed 's/^/      /' || true

phase "stress suite"
rc=0
run_py "$OUT/stress.log" "halt_on_error=0 exitcode=66" clean \
  "${PYTEST[@]}" -v "$HERE/test_ft_stress.py" || rc=$?
check_run "stress suite" "$OUT/stress.log" "$rc"
grep -E "PASSED|FAILED|ERROR" "$OUT/stress.log" | grep "::" | sed 's/^/      /' || true

# ---- 4. the mutants must be reported ------------------------------------------------
for m in "${MUTANTS[@]}"; do
  phase "mutant $m"
  log="$OUT/mutant-$m.log"
  rc=0
  # Longer than the clean run (a race that happens to be ordered by the
  # interpreter's own synchronization in one round is not in the next):
  # these end at the first report.
  FT_SECONDS=3 FT_DEFAULT_POOL_RUNS=16 \
    run_py "$log" "halt_on_error=1 exitcode=66" "$m" \
      "${PYTEST[@]}" "$HERE/test_ft_stress.py" -k "${MUTANT_TEST[$m]}" || rc=$?
  # The report must name the mutated code: a report from anywhere else
  # (the interpreter, another part of pinpool) would not show that this
  # race is caught.
  # (Not `grep | grep -q`: under pipefail the first grep's SIGPIPE would
  # fail the test.)
  races="$(grep -A 40 "WARNING: ThreadSanitizer: data race" "$log" || true)"
  if grep -Eq "#[0-9]+ (${MUTANT_FRAME[$m]}) " <<<"$races"; then
    echo "PASS  mutant $m: reported (exit $rc)"
    grep -m 1 -A 8 "WARNING: ThreadSanitizer: data race" "$log" | sed 's/^/      /'
  else
    echo "FAIL  mutant $m: NOT reported by TSAN in ${MUTANT_FRAME[$m]} (exit $rc; log: $log)"
    tail -n 30 "$log"
    failed=1
  fi
done

phase "done"
if ((failed)); then
  echo "RESULT: FAILED"
  exit 1
fi
echo "RESULT: OK"
