#!/usr/bin/env bash
# Run the benchmark suite (issue 7) and write the results.
#
#   bench/run.sh [--quick] [--reps N] [--workloads "W1 W4"] [--out DIR]
#
#   --quick       small sizes and counts (about 1.5 minutes); writes to
#                 bench/results/quick/ (not committed) unless --out is given
#   --reps N      repetitions of every workload (default: full 5 for W1, W1h,
#                 W3, W4 and W5 (the two-thread cases are noisy), 1 for W2
#                 (12 long cases), 3 for the others (W6, W7, W8, W9); quick
#                 2 for W1, 1 for the others)
#   --workloads   a subset of W1..W7, W1h, W8, W9 (the report then covers
#                 only those; e.g. --workloads "W1h W8" --out /tmp/w8, or
#                 --workloads W9 --out /tmp/w9)
#   --out DIR     where latest.json, latest.md and the charts go
#                 (default bench/results, or bench/results/quick)
#
# Steps: install the peers and gnuplot (Debian packages, as root; without
# root, whatever is missing is skipped with a note), build the release
# preset's bench targets, run every case of every workload as its own
# process, the implementations interleaved (the order rotates every
# repetition), merge the runs with pp_report (medians, ratios to pinpool,
# goals), draw the charts with gnuplot, check the JSON's shape, and only
# then replace latest.json / latest.md / *.png.
#
# Like for like (docs/benchmarks.md, "The fair method"): every
# implementation runs in touch mode (one byte written per 4 KiB page of
# every block) and alloc mode (nothing written); the floor (the touches on
# a pre-faulted region no allocator manages) in touch mode; peers: glibc,
# jemalloc, mimalloc, tcmalloc at its defaults and as tcmalloc-rr0
# (TCMALLOC_RELEASE_RATE=0 in its environment), refpool (PyTorch's policy),
# rmmpool (RMM's), naive (not in W2); pinpool-prearena (the pool before the
# arenas, built from this repository's history: W1, W3-W7, alloc mode).
#
# W1h (history cost on W1's pair) and W8 (snapshots) measure pinpool alone:
# no peer has those features.
#
# W9 (issue 22; bench/w9.c, its own program pp_bench_w9) measures batches
# lent to worker processes (a shared pool) against today's path (the
# workers' shared memory copied into a locked buffer): 2 and 4 workers, 16
# and 64 MiB batches, a fill at memory speed and one with CPU work, the two
# paths interleaved; quick: 2 workers, 4 MiB, both fills (a few seconds:
# both paths run, lend copies nothing, the report has its table and goals).
#
# On a machine with a CUDA driver and a device (pp_bench --cuda-probe), the
# GPU implementations join W1..W7 in touch mode: pinpool-cuda and
# pinpool-cuda-register (pinpool's CUDA backends), refpool-cuda (the
# PyTorch policy on cuMemHostAlloc) and cuhostalloc (cuMemHostAlloc /
# cuMemFreeHost per block; not in W2). PINPOOL_LIBCUDA names the driver as for the library (the tests
# point it at their fake driver to run these paths without a GPU).
#
# Exits non-zero if a benchmark run failed or latest.json is missing or
# malformed.
#
# Environment: BENCH_BUILD_DIR=DIR builds and runs from an already
# configured build directory instead of the release preset's build/release;
# BENCH_RAW=FILE keeps a copy of the raw records (pp_report's input);
# BENCH_SKIP_INSTALL=1 installs no package (a machine without a mirror).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BENCH_BUILD_DIR:-$ROOT/build/release}"
QUICK=0
REPS_OVERRIDE=""
WORKLOADS="W1 W2 W3 W4 W5 W6 W7 W1h W8 W9"
OUT=""

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

while (($#)); do
  case "$1" in
    --quick) QUICK=1 ;;
    --reps)
      REPS_OVERRIDE="${2:?--reps needs a number}"
      shift
      ;;
    --workloads)
      WORKLOADS="${2:?--workloads needs a list}"
      shift
      ;;
    --out)
      OUT="${2:?--out needs a directory}"
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      echo "bench/run.sh: unknown option '$1' (try --help)" >&2
      exit 2
      ;;
  esac
  shift
done
if [[ -n "$REPS_OVERRIDE" && ! "$REPS_OVERRIDE" =~ ^[1-9][0-9]*$ ]]; then
  echo "bench/run.sh: --reps must be a positive number" >&2
  exit 2
fi
if [[ -z "$OUT" ]]; then
  OUT="$ROOT/bench/results"
  ((QUICK)) && OUT="$ROOT/bench/results/quick"
fi
MODE=full
QUICK_ARG=()
if ((QUICK)); then
  MODE=quick
  QUICK_ARG=(--quick)
fi
START=$SECONDS

# ---- Packages -------------------------------------------------------------------
PEER_PKGS=(libjemalloc-dev libmimalloc-dev libgoogle-perftools-dev)
TOOL_PKGS=(gnuplot-nox)

missing_pkgs() {
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
      grep -q "install ok installed"; then
      echo "$p"
    fi
  done
}

install_packages() {
  if [[ -n "${BENCH_SKIP_INSTALL:-}" ]]; then
    return 0
  fi
  if ! command -v dpkg-query >/dev/null; then
    echo "bench/run.sh: no dpkg: using whatever peers are installed" >&2
    return 0
  fi
  local missing
  mapfile -t missing < <(missing_pkgs "${PEER_PKGS[@]}" "${TOOL_PKGS[@]}")
  ((${#missing[@]})) || return 0
  if [[ "$(id -u)" != 0 ]]; then
    echo "bench/run.sh: NOTE: not root; missing packages are skipped:" \
      "${missing[*]} (their peers or the charts will be left out)" >&2
    return 0
  fi
  echo "bench/run.sh: installing ${missing[*]}" >&2
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends "${missing[@]}" >&2; }; then
    echo "bench/run.sh: NOTE: apt-get failed; continuing without" \
      "${missing[*]}" >&2
  fi
}

install_packages

# The malloc peers' backend calls are their memory system calls, counted on
# the kernel's syscall tracepoints (bench/syscount.h), whose ids are in
# tracefs: mount it if it is not (as root; otherwise those counts are left
# out, with the reason in the report's notes).
mount_tracefs() {
  local t
  for t in /sys/kernel/tracing /sys/kernel/debug/tracing; do
    [[ -d "$t/events/syscalls" ]] && return 0
  done
  if [[ "$(id -u)" == 0 ]] && [[ -d /sys/kernel/tracing ]] &&
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; then
    return 0
  fi
  echo "bench/run.sh: NOTE: no tracefs; the malloc peers' backend calls" \
    "are not counted" >&2
}
mount_tracefs

# ---- Build ------------------------------------------------------------------------
cd "$ROOT"
cache_lacks_peer() { # a peer library exists but the cache did not find it
  local var="$1" lib="$2"
  grep -q "^$var:FILEPATH=.*NOTFOUND" "$BUILD/CMakeCache.txt" &&
    compgen -G "/usr/lib/*/lib$lib.so" >/dev/null
}
if [[ -n "${BENCH_BUILD_DIR:-}" ]]; then
  [[ -f "$BUILD/CMakeCache.txt" ]] || {
    echo "bench/run.sh: $BUILD is not a configured build directory" >&2
    exit 2
  }
elif [[ ! -f "$BUILD/CMakeCache.txt" ]] ||
  cache_lacks_peer PP_JEMALLOC_LIB jemalloc ||
  cache_lacks_peer PP_MIMALLOC_LIB mimalloc ||
  cache_lacks_peer PP_TCMALLOC_LIB tcmalloc_minimal; then
  cmake --preset release >&2
fi

declare -A PEER_VAR=([jemalloc]=PP_JEMALLOC_LIB [mimalloc]=PP_MIMALLOC_LIB
  [tcmalloc]=PP_TCMALLOC_LIB)
declare -A PEER_DEB=([jemalloc]=libjemalloc2 [mimalloc]=libmimalloc2.0
  [tcmalloc]=libtcmalloc-minimal4)
declare -A PEER_DEV=([jemalloc]=libjemalloc-dev [mimalloc]=libmimalloc-dev
  [tcmalloc]=libgoogle-perftools-dev)
TARGETS=(pp_bench pp_bench_w9 pp_report)
PEERS=()
for p in jemalloc mimalloc tcmalloc; do
  if grep -q "^${PEER_VAR[$p]}:FILEPATH=/" "$BUILD/CMakeCache.txt"; then
    TARGETS+=("pp_bench_$p")
    PEERS+=("$p")
  fi
done
if [[ -n "${BENCH_BUILD_DIR:-}" ]]; then
  cmake --build "$BUILD" --target "${TARGETS[@]}" >&2
else
  cmake --build --preset release --target "${TARGETS[@]}" >&2
fi

pkg_version() {
  dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo unknown
}
REPORT_PEERS=(--peer "glibc=$(pkg_version libc6)")
for p in "${PEERS[@]}"; do
  REPORT_PEERS+=(--peer "$p=$(pkg_version "${PEER_DEB[$p]}")")
  [[ "$p" == tcmalloc ]] && REPORT_PEERS+=(--peer \
    "tcmalloc-rr0=$(pkg_version "${PEER_DEB[$p]}") with TCMALLOC_RELEASE_RATE=0")
done
for p in jemalloc mimalloc tcmalloc; do
  if [[ ! " ${PEERS[*]} " =~ \ $p\  ]]; then
    REPORT_PEERS+=(--missing "$p=${PEER_DEV[$p]} not installed")
    echo "bench/run.sh: NOTE: peer $p left out (${PEER_DEV[$p]} not" \
      "installed)" >&2
  fi
done

# The GPU implementations, where the driver loads and has a device.
CUDA_IMPLS=()
# A driver that hangs in cuInit must not hang the suite: 60 s at most.
if CUDA_WHAT="$(timeout 60 "$BUILD/bench/pp_bench" --cuda-probe 2>&1)"; then
  CUDA_IMPLS=(pinpool-cuda pinpool-cuda-register refpool-cuda cuhostalloc)
  REPORT_PEERS+=(--peer "cuda=$CUDA_WHAT")
  echo "bench/run.sh: CUDA: $CUDA_WHAT; measuring ${CUDA_IMPLS[*]}" >&2
else
  REPORT_PEERS+=(--missing "cuda=${CUDA_WHAT:-no CUDA driver}")
  echo "bench/run.sh: NOTE: GPU implementations left out: $CUDA_WHAT" >&2
fi

REV="$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [[ "$REV" != unknown ]] &&
  [[ -n "$(git --no-optional-locks -C "$ROOT" status --porcelain \
    --untracked-files=no 2>/dev/null)" ]]; then
  REV="$REV-dirty"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/pinpool-bench.XXXXXX")"
HOLDER=""
# The exit status is the script's, not the killed holder's.
trap 'rc=$?; rm -rf "$WORK"
  [[ -z "$HOLDER" ]] || { kill "$HOLDER" || true; wait "$HOLDER" || true; } 2>/dev/null
  exit "$rc"' EXIT

# A holder keeps the syscall tracepoints registered for the whole run
# (bench/syscount.h): otherwise every malloc-peer process would wait for
# their registration and unregistration (~0.5 s a process here). glibc is
# always a peer.
{
  "$BUILD/bench/pp_bench" --hold-syscount >"$WORK/holder" 2>&1 &
  HOLDER=$!
  for _ in $(seq 50); do
    [[ -s "$WORK/holder" ]] && break
    sleep 0.1
  done
  if [[ "$(head -n 1 "$WORK/holder")" != ready ]]; then
    echo "bench/run.sh: NOTE: malloc peers' backend calls not counted:" \
      "$(head -n 1 "$WORK/holder")" >&2
    # It has usually exited already (it prints why and stops).
    kill "$HOLDER" 2>/dev/null || true
    wait "$HOLDER" 2>/dev/null || true
    HOLDER=""
  fi
}
# The pool before the arenas (issue 21's "W3-W7 no more than 10 % slower
# than before"): the last revision before them, its pp_bench built from the
# repository's history beside this one and run in the same interleaving, as
# the implementation pinpool-prearena (alloc mode, W1 and W3-W7), so that
# the comparison is on this machine, at this load, by the same method.
# BENCH_PREARENA_REV= (empty) leaves it out; a checkout without that
# revision (a shallow clone, an archive) leaves it out with a note.
PREARENA_REV="${BENCH_PREARENA_REV-72890e5}"
PREARENA_BIN=""
build_prearena() {
  local src="$WORK/prearena" log="$WORK/prearena.log"
  [[ -n "$PREARENA_REV" ]] || return 0
  if ! git -C "$ROOT" cat-file -e "$PREARENA_REV^{commit}" 2>/dev/null; then
    PREARENA_WHY="revision $PREARENA_REV is not in this checkout's history"
    return 0
  fi
  mkdir -p "$src"
  if git -C "$ROOT" archive "$PREARENA_REV" | tar -x -C "$src" &&
    (cd "$src" && cmake --preset release -B "$src/build" &&
      cmake --build "$src/build" --target pp_bench) >"$log" 2>&1; then
    PREARENA_BIN="$src/build/bench/pp_bench"
    echo "bench/run.sh: pinpool-prearena: $PREARENA_REV built" >&2
  else
    PREARENA_WHY="its build failed: $(tail -n 1 "$log" 2>/dev/null)"
  fi
}
PREARENA_WHY=""
build_prearena
if [[ -z "$PREARENA_BIN" ]]; then
  REPORT_PEERS+=(--missing "pinpool-prearena=${PREARENA_WHY:-left out (BENCH_PREARENA_REV is empty)}")
  echo "bench/run.sh: NOTE: pinpool-prearena left out:" \
    "${PREARENA_WHY:-BENCH_PREARENA_REV is empty}" >&2
else
  REPORT_PEERS+=(--peer "pinpool-prearena=$PREARENA_REV (the pool before the arenas, built from this repository)")
fi

RAW="$WORK/raw.tsv"
: >"$RAW"
LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"

# tcmalloc reports every allocation of 1 GiB or more on stderr by default.
export TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=1099511627776

# ---- Run ------------------------------------------------------------------------------
# An implementation: binary:impl:mode[:name[:VAR=VALUE]] (name: the malloc
# peer's reported name; VAR=VALUE: the environment of its process).
# Every implementation runs in both modes, touch (one byte written per
# 4 KiB page of every block) and alloc (nothing written), except the floor
# (touch only: the touches on a pre-faulted region no allocator manages)
# and the GPU implementations (touch only: they are pools like pinpool,
# whose alloc mode the CPU run already measures).
impls_for() { # workload
  local w="$1" p m
  if [[ "$w" == W1h ]]; then
    printf '%s\n' "pp_bench:pinpool:alloc" "pp_bench:pinpool-h-alloc:alloc" \
      "pp_bench:pinpool-h-all:alloc" "pp_bench:pinpool-h-all16:alloc"
    return
  fi
  if [[ "$w" == W8 ]]; then
    printf '%s\n' "pp_bench:pinpool:alloc"
    return
  fi
  local list=() pools=(pinpool refpool rmmpool)
  [[ "$w" == W1 ]] && pools+=(pinpool-tc)
  # The per-request baseline: not in W2, whose steady state it never has
  # (every operation maps, populates and locks; ~2 ms for a 6 MiB block).
  [[ "$w" != W2 ]] && pools+=(naive)
  for m in touch alloc; do
    for p in "${pools[@]}"; do
      list+=("pp_bench:$p:$m")
    done
    list+=("pp_bench:malloc:$m")
    for p in "${PEERS[@]}"; do
      list+=("pp_bench_$p:malloc:$m")
    done
    if [[ " ${PEERS[*]} " == *" tcmalloc "* ]]; then
      list+=("pp_bench_tcmalloc:malloc:$m:tcmalloc-rr0:TCMALLOC_RELEASE_RATE=0")
    fi
  done
  list+=("pp_bench:floor:touch")
  # The pool before the arenas, on the workloads its goal names and W1
  # (whose 20 ns goal it puts in this machine's terms): alloc mode, as that
  # goal. Not in W2, whose fair method postdates it.
  if [[ -n "$PREARENA_BIN" && "$w" =~ ^W[134567]$ ]]; then
    list+=("prearena:pinpool:alloc:pinpool-prearena")
  fi
  for p in "${CUDA_IMPLS[@]}"; do
    # cuhostalloc is naive's GPU twin: not in W2 either.
    [[ "$w" == W2 && "$p" == cuhostalloc ]] && continue
    list+=("pp_bench:$p:touch")
  done
  printf '%s\n' "${list[@]}"
}

reps_for() { # workload
  if [[ -n "$REPS_OVERRIDE" ]]; then
    echo "$REPS_OVERRIDE"
  elif ((QUICK)); then
    # --quick checks the suite's shape, not its speed. W1 runs twice (the
    # merge of repetitions, medians and the rotation of the order, is
    # exercised), the rest once: with every implementation in both modes
    # that keeps it near a minute and a half with the fake driver's
    # implementations (1,014 runs took 137 s with two repetitions, on 2
    # busy cores).
    [[ "$1" == W1 ]] && echo 2 || echo 1
  else
    # W2: 12 cases of 10,000 steady operations per thread; a malloc peer
    # that faults its pages in takes 70-180 s per run of the 1-64 MiB
    # cases in touch mode (jemalloc and mimalloc at 1 GiB live: 3,600
    # faults per operation, ~60 ops/s, on a busy machine): one repetition
    # (1-2 h on 2 cores; --reps 2 doubles it).
    case "$1" in
      W1 | W1h | W3 | W4 | W5) echo 5 ;;
      W2) echo 1 ;;
      *) echo 3 ;;
    esac
  fi
}

FAILED=0
RUNS=0

# W9's cases, workers:batch MiB:fill:timed batches (the warm-up, 2 batches
# per worker, comes on top). Full: 48 batches of 16 MiB or 16 of 64 MiB, as
# in docs/benchmarks.md's W9 runs (a 64 MiB case with the CPU fill takes
# ~10 s on 2 cores). Quick: small batches, a few seconds in all.
W9_CASES=()
if ((QUICK)); then
  W9_CASES=(2:4:mem:20 2:4:cpu:10)
else
  for mib in 16 64; do
    for fill in mem cpu; do
      for nw in 2 4; do
        W9_CASES+=("$nw:$mib:$fill:$((mib == 64 ? 16 : 48))")
      done
    done
  done
fi

# W9 runs pp_bench_w9 (no implementations, modes or threads): each case
# with each path as its own process, the two paths interleaved and their
# order rotating with the repetition and the case, as the workloads'
# implementations. T lines carry the workers where others carry threads.
run_w9() {
  local reps nc=${#W9_CASES[@]} rep c k path nw mib fill nb rc us0 why t0
  local paths=(lend copy)
  reps="$(reps_for W9)"
  t0=$SECONDS
  for ((rep = 1; rep <= reps; rep++)); do
    for ((c = 0; c < nc; c++)); do
      IFS=: read -r nw mib fill nb <<<"${W9_CASES[$c]}"
      for ((k = 0; k < 2; k++)); do
        path="${paths[$(((k + rep + c) % 2))]}"
        RUNS=$((RUNS + 1))
        rc=0
        us0="${EPOCHREALTIME/./}"
        timeout 600 "$BUILD/bench/pp_bench_w9" --raw "$path" "$nw" "$mib" \
          "$fill" "$nb" >>"$RAW" 2>"$WORK/stderr" || rc=$?
        printf 'T\tW9\t%d\tpp_bench_w9\t%s\t%s\t%d\t%d\t%d\n' "$c" "$path" \
          "$fill" "$nw" "$rep" "$((${EPOCHREALTIME/./} - us0))" >>"$RAW"
        if ((rc != 0)); then
          FAILED=1
          why="$(tail -n 1 "$WORK/stderr" | tr '\t' ' ')"
          printf 'F\tW9 case %d (%d workers, %d MiB, %s fill), %s, rep %d: exit %d: %s\n' \
            "$c" "$nw" "$mib" "$fill" "$path" "$rep" "$rc" "$why" >>"$RAW"
          echo "bench/run.sh: FAILED: W9 case $c $path workers=$nw" \
            "batch=${mib}MiB fill=$fill rep=$rep: exit $rc: $why" >&2
        fi
      done
    done
  done
  echo "bench/run.sh: W9: $nc case(s) × 2 paths × $reps reps in" \
    "$((SECONDS - t0)) s" >&2
}

for w in $WORKLOADS; do
  case "$w" in
    W[1-7] | W1h | W8) ;;
    W9)
      run_w9
      continue
      ;;
    *)
      echo "bench/run.sh: unknown workload '$w' (W1..W7, W1h, W8, W9)" >&2
      exit 2
      ;;
  esac
  mapfile -t IMPLS < <(impls_for "$w")
  nimpl=${#IMPLS[@]}
  reps="$(reps_for "$w")"
  for threads in 1 2; do
    ncases="$("$BUILD/bench/pp_bench" --list "$w" --threads "$threads" \
      "${QUICK_ARG[@]}")"
    [[ -n "$ncases" ]] || continue
    t0=$SECONDS
    for ((rep = 1; rep <= reps; rep++)); do
      for ((c = 0; c < ncases; c++)); do
        for ((k = 0; k < nimpl; k++)); do
          spec="${IMPLS[$(((k + rep + c) % nimpl))]}"
          IFS=: read -r bin impl mode name envset <<<"$spec"
          NAME_ARG=()
          [[ -n "$name" ]] && NAME_ARG=(--name "$name")
          ENV_SET=()
          [[ -n "$envset" ]] && ENV_SET=("$envset")
          exe="$BUILD/bench/$bin"
          # The old pp_bench renames malloc peers only: its records are
          # renamed here (the implementation is the fourth field of R and
          # N lines).
          [[ "$bin" == prearena ]] && exe="$PREARENA_BIN" NAME_ARG=()
          RUNS=$((RUNS + 1))
          rc=0
          us0="${EPOCHREALTIME/./}"
          env "${ENV_SET[@]}" timeout 600 "$exe" --workload "$w" \
            --impl "$impl" --mode "$mode" --threads "$threads" --case "$c" \
            --rep "$rep" "${QUICK_ARG[@]}" "${NAME_ARG[@]}" \
            >"$WORK/stdout" 2>"$WORK/stderr" || rc=$?
          if [[ "$bin" == prearena ]]; then
            awk -F'\t' -v OFS='\t' -v n="$name" \
              '$1 == "R" || $1 == "N" { $4 = n } { print }' \
              "$WORK/stdout" >>"$RAW"
          else
            cat "$WORK/stdout" >>"$RAW"
          fi
          printf 'T\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\n' "$w" "$c" "$bin" \
            "${name:-$impl}" "$mode" "$threads" "$rep" \
            "$((${EPOCHREALTIME/./} - us0))" >>"$RAW"
          if ((rc != 0)); then
            FAILED=1
            why="$(tail -n 1 "$WORK/stderr" | tr '\t' ' ')"
            printf 'F\t%s case %d, %s %s/%s, %d thread(s), rep %d: exit %d: %s\n' \
              "$w" "$c" "$bin" "${name:-$impl}" "$mode" "$threads" "$rep" "$rc" \
              "$why" >>"$RAW"
            echo "bench/run.sh: FAILED: $w case $c $bin ${name:-$impl}/$mode" \
              "threads=$threads rep=$rep: exit $rc: $why" >&2
          fi
        done
      done
    done
    echo "bench/run.sh: $w, $threads thread(s): $ncases case(s) ×" \
      "$nimpl implementations × $reps reps in $((SECONDS - t0)) s" >&2
  done
done
LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
[[ -n "${BENCH_RAW:-}" ]] && cp "$RAW" "$BENCH_RAW"

# ---- Report, charts, check ------------------------------------------------------------
mkdir -p "$OUT" "$WORK/plots" "$WORK/png"
CHARTS=0
command -v gnuplot >/dev/null && CHARTS=1
report() {
  "$BUILD/bench/pp_report" --raw "$RAW" --json "$WORK/latest.json" \
    --markdown "$WORK/latest.md" --plots "$WORK/plots" --rev "$REV" \
    --mode "$MODE" --elapsed "$((SECONDS - START))" \
    --load-start "$LOAD_START" --load-end "$LOAD_END" --charts "$CHARTS" \
    "${REPORT_PEERS[@]}"
}
report
if ((CHARTS)); then
  if ! (cd "$WORK/plots" && gnuplot -e "outdir='$WORK/png'" plots.gp \
    2>"$WORK/gnuplot.err"); then
    # A subset without W1 (e.g. --workloads "W1h W8") leaves charts empty,
    # which gnuplot refuses; the markdown must then not link them.
    echo "bench/run.sh: NOTE: gnuplot failed; charts not updated:" >&2
    cat "$WORK/gnuplot.err" >&2
    CHARTS=0
    report
  fi
else
  echo "bench/run.sh: NOTE: gnuplot not installed; charts not drawn" >&2
fi

check_json() {
  local file="$1" py
  [[ -s "$file" ]] || {
    echo "bench/run.sh: $file is missing or empty" >&2
    return 1
  }
  py="$(command -v python3 || true)"
  [[ -x /usr/bin/python3 ]] && py=/usr/bin/python3
  if [[ -n "$py" ]]; then
    "$py" - "$file" "$WORKLOADS" "${W9_CASES[*]}" <<'EOF'
import json, sys
path, workloads = sys.argv[1], sys.argv[2].split()
# W9's cases as run.sh ran them: "workers:MiB:fill:batches ..."
w9_cases = {(int(a), int(b), f) for a, b, f, _ in
            (c.split(":") for c in sys.argv[3].split())}
try:
    with open(path) as f:
        doc = json.load(f)
    assert isinstance(doc, dict), "top level is not an object"
    for key in ("schema", "git_revision", "date", "mode", "machine", "peers",
                "results", "unavailable", "goals"):
        assert key in doc, "no '%s'" % key
    for key in ("uname", "nproc", "cpu_model"):
        assert key in doc["machine"], "machine has no '%s'" % key
    res = doc["results"]
    MALLOCS = ("glibc", "jemalloc", "mimalloc", "tcmalloc", "tcmalloc-rr0")
    # W9 has its own array: a --workloads W9 run has no other results.
    others = [w for w in workloads if w != "W9"]
    assert isinstance(res, list) and (res or not others), "no results"
    num = (int, float)
    def isnum(v):
        return isinstance(v, num) and not isinstance(v, bool)
    seen = set()
    threads = {}
    cases = {}
    for r in res:
        for key, kind in (("workload", str), ("case", str), ("impl", str),
                          ("mode", str), ("threads", int), ("reps", int),
                          ("ns_per_op_median", num), ("ops_per_s", num),
                          ("metrics", dict)):
            assert isinstance(r.get(key), kind), \
                "record %s/%s/%s: bad '%s'" % (r.get("workload"),
                                               r.get("impl"), r.get("case"),
                                               key)
        assert r["ns_per_op_median"] > 0 and r["ops_per_s"] > 0, \
            "record %s/%s: empty measurement" % (r["workload"], r["impl"])
        assert r["reps"] >= 1 and r["threads"] in (1, 2)
        # The issue's metrics: present in every record; null only where
        # they do not apply (W8 measures snapshots; a malloc peer's
        # backend calls where the kernel would not count them, with the
        # reason in the record's notes).
        for key in ("ns_per_op_p99", "overhead", "backend_calls",
                    "minflt_per_op", "ratio_ns_to_pinpool",
                    "ratio_ops_to_pinpool"):
            assert key in r, "record %s/%s/%s: no '%s'" % (
                r["workload"], r["impl"], r["case"], key)
            v = r[key]
            if v is None:
                why = " ".join(r.get("notes") or [])
                assert r["workload"] == "W8" or (
                    key == "backend_calls" and r["impl"] in MALLOCS and
                    "not counted" in why), \
                    "record %s/%s/%s/%d threads: '%s' is null" % (
                        r["workload"], r["impl"], r["case"], r["threads"],
                        key)
            else:
                assert isnum(v), "record %s/%s: bad '%s'" % (
                    r["workload"], r["impl"], key)
        assert r["mode"] in ("alloc", "touch"), \
            "record %s/%s: mode %r" % (r["workload"], r["impl"], r["mode"])
        # Distance to the floor: in touch mode where a floor was measured.
        for key in ("ns_over_floor", "ratio_to_floor"):
            assert key in r, "record %s/%s/%s: no '%s'" % (
                r["workload"], r["impl"], r["case"], key)
            assert r[key] is None or isnum(r[key]), \
                "record %s/%s: bad '%s'" % (r["workload"], r["impl"], key)
        if r["mode"] == "touch" and r["workload"] not in ("W1h", "W8") \
                and r["impl"] != "floor" and not doc["failures"]:
            assert r["ns_over_floor"] is not None, \
                "record %s/%s/%s/%d threads: no distance to the floor" % (
                    r["workload"], r["impl"], r["case"], r["threads"])
        # W2: the fill apart from the steady state, and the late half.
        if r["workload"] == "W2":
            for key in ("fill_ops", "fill_ops_per_s", "fill_minflt_per_op",
                        "steady_ops_per_thread", "late_ops_per_s",
                        "late_minflt_per_op", "live_cap_mib"):
                assert isnum(r["metrics"].get(key)), \
                    "W2 %s/%s/%s: no metric '%s'" % (r["impl"], r["mode"],
                                                     r["case"], key)
        # W6's blocks (16 MiB and up) are far above every malloc's mmap
        # threshold: a malloc peer whose calls were counted made some.
        if r["workload"] == "W6" and r["impl"] in MALLOCS and \
                r["backend_calls"] is not None:
            assert r["backend_calls"] > 0, \
                "W6 %s/%s: no memory system calls counted" % (r["impl"],
                                                              r["mode"])
        seen.add(r["workload"])
        threads.setdefault((r["workload"], r["impl"], r["mode"]),
                           set()).add(r["threads"])
        cases.setdefault((r["workload"], r["impl"], r["mode"]),
                         set()).add((r["case"], r["threads"]))
    # Coverage, unless runs failed (they are listed, and the run fails):
    # 1 and 2 threads for every implementation of every workload but W1h
    # (the history's cost on one thread's pair), and every implementation
    # of a workload measured in every case and thread count pinpool was.
    if not doc["failures"]:
        for (w, impl, mode), ts in sorted(threads.items()):
            want = {1} if w == "W1h" else {1, 2}
            assert ts == want, "%s %s (%s): threads %s, expected %s" % (
                w, impl, mode, sorted(ts), sorted(want))
        for (w, impl, mode), cs in sorted(cases.items()):
            ref = cases.get((w, "pinpool", mode), set())
            assert cs == ref, "%s %s (%s): cases %s, pinpool's %s" % (
                w, impl, mode, sorted(cs ^ ref), sorted(ref))
    for w in others:
        assert w in seen, "no results for %s" % w
    assert not others or "pinpool" in {r["impl"] for r in res}, \
        "no pinpool results"
    # W9: one entry per case, each path's medians (null only where its runs
    # failed), the ratios where both paths ran; lend copies nothing and
    # today's path the whole batch (the benchmark's own sanity).
    w9 = doc.get("w9")
    assert isinstance(w9, list), "no 'w9' array"
    if "W9" not in workloads:
        assert not w9, "W9 results, but W9 was not run"
    elif not w9:
        assert any(u.get("workload") == "W9" for u in doc["unavailable"]), \
            "W9 is neither in 'w9' nor reported as unavailable"
    got = set()
    for c in w9:
        for key, kind in (("workers", int), ("batch_mib", int),
                          ("fill", str)):
            assert isinstance(c.get(key), kind), "w9 entry: bad '%s'" % key
        name = "W9 %d workers %d MiB %s" % (c["workers"], c["batch_mib"],
                                            c["fill"])
        got.add((c["workers"], c["batch_mib"], c["fill"]))
        for p in ("lend", "copy"):
            s = c.get(p)
            if s is None:
                assert doc["failures"], "%s: no %s runs" % (name, p)
                continue
            for key in ("reps", "batches_per_s", "copied_bytes_per_batch",
                        "memory_held_mib", "locked_mib",
                        "main_cpu_ms_per_batch", "consume_cpu_ms_per_batch",
                        "main_cpu_ms_per_batch_excl_consume",
                        "mlock_failures"):
                assert isnum(s.get(key)), "%s %s: bad '%s'" % (name, p, key)
            assert s["batches_per_s"] > 0 and s["memory_held_mib"] > 0, \
                "%s %s: empty measurement" % (name, p)
        if c.get("lend") is not None:
            assert c["lend"]["copied_bytes_per_batch"] == 0, \
                "%s: lend copied bytes" % name
        if c.get("copy") is not None:
            assert c["copy"]["copied_bytes_per_batch"] == \
                c["batch_mib"] << 20, "%s: copy did not copy a batch" % name
        for key in ("speed_ratio", "cpu_ratio", "cpu_ratio_excl_consume"):
            assert key in c, "%s: no '%s'" % (name, key)
            both = c.get("lend") is not None and c.get("copy") is not None
            assert isnum(c[key]) if both else c[key] is None, \
                "%s: bad '%s'" % (name, key)
    if "W9" in workloads and not doc["failures"]:
        assert got == w9_cases, "W9 cases %s, run.sh ran %s" % (
            sorted(got), sorted(w9_cases))
    assert "W8" in seen or \
        any(u.get("workload") == "W8" for u in doc["unavailable"]), \
        "W8 is neither in the results nor reported as unavailable"
    assert isinstance(doc["goals"], list) and doc["goals"], "no goals"
    for g in doc["goals"]:
        assert g.get("status") in ("met", "missed", "partly", "n/a"), \
            "goal %r: bad status" % g.get("goal")
except Exception as e:  # any failure means malformed
    sys.exit("bench/run.sh: %s is malformed: %s" % (path, e))
EOF
  else
    # No Python: a coarse check of the shape.
    if ! { grep -q '"git_revision"' "$file" && grep -q '"machine"' "$file" &&
      grep -q '"results"' "$file" && grep -q '"W8"' "$file" &&
      grep -q '"w9"' "$file" &&
      tail -n 1 "$file" | grep -q '^}$'; }; then
      echo "bench/run.sh: $file is malformed" >&2
      return 1
    fi
  fi
}

check_json "$WORK/latest.json"
# The charts latest.md links (and the README, for the full run's) were
# drawn by this run: checked before anything is replaced, in $WORK, so that
# a stale PNG of an earlier run cannot stand in for one.
for png in $(grep -o '([a-z0-9_]*\.png)' "$WORK/latest.md" | tr -d '()' |
  sort -u); do
  if [[ ! -s "$WORK/png/$png" ]]; then
    echo "bench/run.sh: latest.md links $png, which this run did not draw" >&2
    exit 1
  fi
done
cp "$WORK/latest.json" "$OUT/latest.json.tmp"
cp "$WORK/latest.md" "$OUT/latest.md.tmp"
mv "$OUT/latest.json.tmp" "$OUT/latest.json"
mv "$OUT/latest.md.tmp" "$OUT/latest.md"
if ((CHARTS)); then
  for png in "$WORK"/png/*.png; do
    [[ -f "$png" ]] && cp "$png" "$OUT/"
  done
fi
check_json "$OUT/latest.json"
echo "bench/run.sh: $MODE run: $RUNS runs in $((SECONDS - START)) s;" \
  "wrote ${OUT#"$ROOT"/}/latest.json, latest.md$( ((CHARTS)) &&
    echo ' and charts') (rev $REV)" >&2
if ((FAILED)); then
  echo "bench/run.sh: some runs failed (listed in latest.md)" >&2
  exit 1
fi
