#!/usr/bin/env bash
# The Python package as a user installs it (docs/python.md, "Tests"):
#
#   tests/python/package.sh [BUILD_DIR]    (default build/release)
#
# 1. `pip install --no-build-isolation --no-index .` into a fresh virtual
#    environment made with --system-site-packages (Debian's NumPy, torch,
#    pytest and mypy stay visible; setuptools and wheel are Debian's: no
#    network is used);
# 2. `python3 -m build --wheel --no-isolation`, and the wheel's contents;
# 3. the command-line tool: `python3 -m pinpool` and the `pinpool` script;
# 4. tests/python against the installed copy, run from outside the source
#    tree (test_cli.py checks that pinpool.__file__ is in the environment),
#    with the fake CUDA driver of BUILD_DIR when it has one;
# 5. mypy (Debian's) on the package (stub and Python files) and on every
#    example of docs/python.md.
# Exit status 0 only if every part passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-build/release}"
[[ "$BUILD" == /* ]] || BUILD="$ROOT/$BUILD"
PY=/usr/bin/python3
WORK="$(mktemp -d "${TMPDIR:-/tmp}/pinpool-package.XXXXXX")"
# Readable by all: test_autopin runs children that gave up root (uid
# 65534, so that RLIMIT_MEMLOCK applies) with the venv's interpreter.
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT
VENV="$WORK/venv"

t_start=$SECONDS
phase() { echo "-- $* ($((SECONDS - t_start))s)"; }

# setuptools rebuilds an extension when one of its .c files is newer than
# it, not when a header changed: start from nothing.
rm -rf "$ROOT/build/setuptools"
export PINPOOL_REQUIRE_CLI=1 PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH PINPOOL_CONF

phase "venv and pip install"
"$PY" -m venv --system-site-packages "$VENV"
(cd "$ROOT" && "$VENV/bin/python" -m pip install -q --no-build-isolation \
  --no-index --no-cache-dir --disable-pip-version-check .)

phase "wheel"
(cd "$ROOT" && "$PY" -m build --wheel --no-isolation --outdir "$WORK/dist" \
  . >"$WORK/wheel.log" 2>&1) || {
  tail -n 30 "$WORK/wheel.log"
  exit 1
}
version="$(sed -n 's/^#define PINPOOL_VERSION_STRING "\(.*\)"$/\1/p' \
  "$ROOT/include/pinpool.h")"
# The package takes its version from the header; CMake's project() states
# it too (for the CMake package files): they must agree.
cmake_version="$(sed -n 's/^  VERSION \([0-9.]*\)$/\1/p' "$ROOT/CMakeLists.txt" | head -n 1)"
if [[ "$version" != "$cmake_version" ]]; then
  echo "FAIL: include/pinpool.h says $version, CMakeLists.txt $cmake_version" >&2
  exit 1
fi
"$PY" - "$WORK/dist" "$version" <<'PYEOF'
import glob, sys, zipfile
dist, version = sys.argv[1], sys.argv[2]
wheels = glob.glob(f"{dist}/pinpool-{version}-*.whl")
assert len(wheels) == 1, f"no wheel of version {version}: {glob.glob(dist + '/*')}"
names = zipfile.ZipFile(wheels[0]).namelist()
for want in ("pinpool/__init__.py", "pinpool/__init__.pyi", "pinpool/py.typed",
             "pinpool/torch.py", "pinpool/__main__.py", "pinpool/_core.",
             "pinpool/_cli."):
    assert any(n.startswith(want) for n in names), f"{want} not in the wheel"
print(f"wheel: {wheels[0].rsplit('/', 1)[1]}, {len(names)} files")
PYEOF

phase "command-line tool"
expect="pinpool $version (library $version)"
for cmd in "$VENV/bin/python -m pinpool" "$VENV/bin/pinpool"; do
  got="$(cd "$WORK" && $cmd version)"
  if [[ "$got" != "$expect" ]]; then
    echo "FAIL: '$cmd version' printed '$got', not '$expect'" >&2
    exit 1
  fi
done
echo "python3 -m pinpool version, pinpool version: $expect"

phase "tests/python against the installed package"
fake=()
if [[ -f "$BUILD/tests/fake_cuda/libfakecuda.so" ]]; then
  fake=(PINPOOL_LIBCUDA="$BUILD/tests/fake_cuda/libfakecuda.so")
fi
(cd "$WORK" && env "${fake[@]}" PINPOOL_EXPECT_PACKAGE_UNDER="$VENV" \
  "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider "$ROOT/tests/python")

phase "mypy: the package and the examples of docs/python.md"
"$PY" "$ROOT/tests/python/docs_examples.py" "$WORK/examples" >/dev/null
# The package's sources (the files the wheel holds), which the examples'
# `import pinpool` resolves to.
(cd "$WORK" && "$PY" -m mypy --no-incremental --cache-dir "$WORK/mypy-cache" \
  --python-executable "$PY" "$ROOT/python/pinpool" "$WORK"/examples/*.py)

phase "done"
