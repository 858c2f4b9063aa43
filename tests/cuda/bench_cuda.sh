#!/usr/bin/env bash
# The benchmark's GPU implementations (bench/run.sh adds them where
# `pp_bench --cuda-probe` finds a driver and a device), run against the
# fake driver: every workload that takes peers, each GPU implementation,
# 1 thread, and 2 threads for W1 and where blocks cross threads (each must
# enter the context). The numbers mean nothing here; the records, the
# configuration and the driver calls must be there. Without a driver the
# probe and the implementations must refuse with the reason.
#
#   bench_cuda.sh PP_BENCH LIBFAKECUDA
set -uo pipefail
BENCH="$1"
FAKE="$2"
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

# No driver: the probe says why (exit 1); an implementation refuses.
out="$(PINPOOL_LIBCUDA=/nonexistent/libcuda.so.1 "$BENCH" --cuda-probe)"
rc=$?
((rc == 1)) || fail "probe without a driver: exit $rc (want 1)"
[[ "$out" == *"no CUDA driver"* ]] || fail "probe without a driver: '$out'"
for impl in pinpool-cuda pinpool-cuda-register refpool-cuda cuhostalloc; do
  err="$(PINPOOL_LIBCUDA=/nonexistent/libcuda.so.1 "$BENCH" --workload W1 \
    --impl "$impl" --case 0 --quick 2>&1 >/dev/null)"
  rc=$?
  ((rc != 0)) || fail "$impl without a driver: exit 0"
  [[ "$err" == *"needs a CUDA driver and device"* ]] ||
    fail "$impl without a driver: '$err'"
done
# The toolkit's stub library (where installed): refused, and named.
stub=/usr/local/cuda/lib64/stubs/libcuda.so
if [[ -f "$stub" ]]; then
  out="$(PINPOOL_LIBCUDA="$stub" "$BENCH" --cuda-probe)"
  rc=$?
  ((rc == 1)) || fail "probe with the stub: exit $rc (want 1)"
  [[ "$out" == *"STUB_LIBRARY"* ]] || fail "probe with the stub: '$out'"
fi
# Pinpool-only workloads take no GPU implementation.
PINPOOL_LIBCUDA="$FAKE" "$BENCH" --workload W8 --impl pinpool-cuda \
  --case 0 --quick >/dev/null 2>&1 && fail "W8 accepted pinpool-cuda"

export PINPOOL_LIBCUDA="$FAKE"
out="$("$BENCH" --cuda-probe)" || fail "probe with the fake driver: '$out'"
[[ "$out" == *fake* ]] || fail "probe with the fake driver: '$out'"

# One record per run, of this implementation, with its configuration;
# the per-request baseline calls the driver at least once per pair.
check() { # workload threads impl
  local w="$1" t="$2" impl="$3" out rec
  out="$("$BENCH" --workload "$w" --impl "$impl" --threads "$t" --case 0 \
    --quick 2>&1)" || {
    fail "$w $impl $t thread(s): exit $?: $(tail -n 1 <<<"$out")"
    return
  }
  rec="$(grep -c "^R	$w	[^	]*	$impl	" <<<"$out")"
  ((rec == 1)) || {
    fail "$w $impl $t thread(s): $rec records"
    return
  }
  case "$impl" in
  pinpool-cuda) [[ "$out" == *"backend=cuda,"* ]] ||
    fail "$w $impl: not backend=cuda" ;;
  pinpool-cuda-register) [[ "$out" == *"backend=cuda-register"* ]] ||
    fail "$w $impl: not backend=cuda-register" ;;
  refpool-cuda | cuhostalloc) [[ "$out" == *"cuMemHostAlloc"* ]] ||
    fail "$w $impl: config does not say cuMemHostAlloc" ;;
  esac
  if [[ "$w" == W1 && "$impl" == cuhostalloc ]]; then
    # Exactly one cuMemHostAlloc and one cuMemFreeHost per timed pair: the
    # counters are read between two barriers around the timed phase.
    local calls ops
    calls="$(grep -o '	backend_calls=[0-9]*' <<<"$out" | cut -d= -f2)"
    ops="$(grep -o '	ops=[0-9]*' <<<"$out" | cut -d= -f2)"
    ((ops > 0 && calls == 2 * ops)) ||
      fail "W1 cuhostalloc: $calls driver calls for $ops pairs"
  fi
}
for impl in pinpool-cuda pinpool-cuda-register refpool-cuda cuhostalloc; do
  for w in W1 W2 W3 W4 W5 W6 W7; do
    check "$w" 1 "$impl"
  done
  for w in W1 W3 W5; do
    check "$w" 2 "$impl"
  done
done
if ((fails)); then
  echo "$fails failure(s)"
  exit 1
fi
echo "bench_cuda: OK"
