#!/usr/bin/env bash
# Run the benchmark suite and write bench/results/latest.{json,md}.
#
#   bench/run.sh [--quick] [--full]
#
#   --quick   short time budgets (the whole run takes well under 2 minutes)
#   --full    also the 1 GiB size of W1
#
# Builds the release preset first (configure only if build/release does not
# exist yet). Each benchmark writes its own JSON and markdown into a temporary
# directory; the script merges them, checks the JSON's shape and only then
# replaces latest.json and latest.md. Exits non-zero if a benchmark fails or
# its JSON is missing or malformed.
#
# Workloads (the suite of issue 7; W1..W8):
#   W1 hot reuse    build/release/bench/pp_hotloop
# To add one: build it in bench/CMakeLists.txt and add a run_bench line below.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build/release"
RESULTS="$ROOT/bench/results"

MODE_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --quick | --full) MODE_ARGS+=("$arg") ;;
    -h | --help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
      exit 0
      ;;
    *)
      echo "bench/run.sh: unknown option '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

# ---- Build ----------------------------------------------------------------------
cd "$ROOT"
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  if [[ -f "$ROOT/CMakePresets.json" ]]; then
    cmake --preset release >&2
  else
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
  fi
fi
if [[ -f "$ROOT/CMakePresets.json" ]]; then
  cmake --build --preset release --target pp_hotloop >&2
else
  cmake --build "$BUILD" --target pp_hotloop >&2
fi

REV="$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [[ "$REV" != unknown ]] &&
  [[ -n "$(git --no-optional-locks -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  REV="$REV-dirty"
fi

mkdir -p "$RESULTS"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/pinpool-bench.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# ---- Run ------------------------------------------------------------------------
BENCHES=()

# run_bench NAME BINARY [ARGS...]: writes $WORK/NAME.json and $WORK/NAME.md
run_bench() {
  local name="$1" bin="$2"
  shift 2
  echo "== $name: $bin $*" >&2
  "$bin" "$@" --json "$WORK/$name.json" --markdown "$WORK/$name.md" \
    --rev "$REV"
  BENCHES+=("$name")
}

run_bench hotloop "$BUILD/bench/pp_hotloop" "${MODE_ARGS[@]}"

# ---- Check and publish ------------------------------------------------------------
PY=/usr/bin/python3
[[ -x "$PY" ]] || PY="$(command -v python3 || true)"

check_json() {
  local file="$1"
  [[ -s "$file" ]] || {
    echo "bench/run.sh: $file is missing or empty" >&2
    return 1
  }
  if [[ -n "$PY" ]]; then
    "$PY" - "$file" <<'EOF'
import json, sys
path = sys.argv[1]
try:
    with open(path) as f:
        doc = json.load(f)
    assert isinstance(doc, dict), "top level is not an object"
    for key in ("git_revision", "machine", "results"):
        assert key in doc, "no '%s'" % key
    m = doc["machine"]
    for key in ("uname", "nproc", "cpu_model"):
        assert key in m, "machine has no '%s'" % key
    res = doc["results"]
    assert isinstance(res, list) and res, "no results"
    for r in res:
        for key, kind in (("workload", str), ("size", int), ("impl", str),
                          ("threads", int), ("ns_per_pair_median", float),
                          ("ns_per_pair_p99", float), ("iterations", int)):
            v = r.get(key)
            ok = isinstance(v, (int, float)) if kind is float \
                else isinstance(v, kind)
            assert ok, "record %r: bad '%s'" % (r, key)
        assert r["ns_per_pair_median"] > 0 and r["iterations"] > 0, \
            "record %r: empty measurement" % (r,)
except Exception as e:  # report any failure as malformed
    sys.exit("bench/run.sh: %s is malformed: %s" % (path, e))
EOF
  else
    # No Python: a coarse check of the shape.
    if ! { grep -q '"git_revision"' "$file" && grep -q '"machine"' "$file" &&
      grep -q '"ns_per_pair_median"' "$file" &&
      tail -n 1 "$file" | grep -q '^}$'; }; then
      echo "bench/run.sh: $file is malformed" >&2
      return 1
    fi
  fi
}

for name in "${BENCHES[@]}"; do
  check_json "$WORK/$name.json"
done

# One workload so far: its files are the suite's. With several, merge the
# "results" arrays here (and concatenate the markdown sections).
cp "$WORK/hotloop.json" "$RESULTS/latest.json.tmp"
{
  for name in "${BENCHES[@]}"; do
    cat "$WORK/$name.md"
    echo
  done
} >"$RESULTS/latest.md.tmp"
check_json "$RESULTS/latest.json.tmp"
mv "$RESULTS/latest.json.tmp" "$RESULTS/latest.json"
mv "$RESULTS/latest.md.tmp" "$RESULTS/latest.md"
echo "bench/run.sh: wrote bench/results/latest.json and latest.md (rev $REV)" >&2
