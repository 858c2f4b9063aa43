#!/usr/bin/env bash
# The GPU check (docs/cuda.md): for a machine with an NVIDIA GPU and driver.
#
#   scripts/gpu-check.sh [--skip-build] [--bench]
#
# 1. builds the release preset (cmake --preset release; needs cmake, ninja,
#    gcc, pkg-config and libcmocka-dev, as scripts/test.sh installs them),
# 2. runs the CUDA tests against the real driver (PINPOOL_LIBCUDA unset:
#    libcuda.so.1; the tests that need the fake driver skip),
# 3. runs pp_gpu_bench: cuMemHostAlloc vs pinpool cached alloc latency,
#    ms/GiB of backend=cuda and backend=cuda-register, H2D/D2H bandwidth
#    from pool vs pageable memory, the stream-ordered reuse check with
#    copies in flight, and the graph capture check (copies of a pool block
#    captured into a graph, record_stream and free during the capture, the
#    graph launched: the capture is not broken, the block is not handed out
#    until pinpool_graph_release, the device copy is intact).
# 4. with --bench: the benchmark suite's quick mode on W1, W3 and W5, one
#    repetition (bench/run.sh: the GPU implementations pinpool-cuda,
#    pinpool-cuda-register, refpool-cuda and cuhostalloc join the others
#    where the driver has a device), written to build/gpu-bench/.
# Every step is timeout-guarded; the whole run stays under five minutes
# (about seven with --bench).
# Exits non-zero if any step failed. No CUDA toolkit is needed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2

SKIP_BUILD=0
BENCH=0
for arg in "$@"; do
  case "$arg" in
    --skip-build) SKIP_BUILD=1 ;;
    --bench) BENCH=1 ;;
    *)
      echo "usage: $0 [--skip-build] [--bench]" >&2
      exit 2
      ;;
  esac
done

BUILD="$ROOT/build/release"
TESTS=(test_cuda_open test_cuda_backend test_cuda_events test_cuda_capture)
# The real driver, and no configuration from the environment.
unset PINPOOL_LIBCUDA PINPOOL_CONF

declare -a RESULTS=()
FAILED=0
START=$SECONDS

# step NAME SECONDS COMMAND...: run under `timeout`, record the outcome.
step() {
  local name="$1" limit="$2" t0=$SECONDS rc
  shift 2
  echo
  echo "==================== $name ===================="
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  local dt=$((SECONDS - t0))
  if ((rc == 0)); then
    RESULTS+=("PASS  $name (${dt}s)")
  else
    ((rc == 124)) && echo "$name: timed out after ${limit}s"
    RESULTS+=("FAIL  $name (exit $rc, ${dt}s)")
    FAILED=1
  fi
  return "$rc"
}

echo "pinpool GPU check in $ROOT"
if command -v nvidia-smi >/dev/null; then
  timeout 20 nvidia-smi --query-gpu=index,name,driver_version,memory.total \
    --format=csv || echo "(nvidia-smi failed)"
else
  echo "nvidia-smi not found; continuing (the tests say if the driver loads)"
fi

build() {
  cmake --preset release && cmake --build --preset release -j "$(nproc)"
}
if ((SKIP_BUILD == 0)); then
  step "build (release preset)" 180 bash -c "$(declare -f build); build"
fi

for t in "${TESTS[@]}"; do
  exe="$BUILD/tests/cuda/$t"
  if [[ ! -x "$exe" ]]; then
    RESULTS+=("FAIL  $t (not built: is tests/cuda added to tests/CMakeLists.txt?)")
    FAILED=1
    continue
  fi
  step "$t (real driver)" 60 "$exe"
done

if [[ -x "$BUILD/tests/cuda/pp_gpu_bench" ]]; then
  step "pp_gpu_bench" 120 "$BUILD/tests/cuda/pp_gpu_bench"
else
  RESULTS+=("FAIL  pp_gpu_bench (not built)")
  FAILED=1
fi

if ((BENCH)); then
  # No package installs: such a machine may reach no mirror.
  step "bench/run.sh --quick (GPU implementations)" 240 env \
    BENCH_SKIP_INSTALL=1 bash bench/run.sh --quick --reps 1 \
    --workloads "W1 W3 W5" --out "$ROOT/build/gpu-bench"
fi

echo
echo "==================== summary ===================="
printf '%s\n' "${RESULTS[@]}"
echo "total: $((SECONDS - START))s"
if ((FAILED)); then
  echo "RESULT: FAILED"
  exit 1
fi
echo "RESULT: OK"
