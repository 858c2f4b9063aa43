#!/usr/bin/env bash
# Build (once) a free-threaded CPython 3.13 with ThreadSanitizer and print
# its installation prefix on stdout (the only line written there; progress
# goes to stderr, the build's own output to a log file).
#
#   tests/freethreaded/build-python.sh        -> /var/cache/pinpool/cpython-3.13.5-ft-tsan-<key>
#
# The source is Debian's python3.13 source package of trixie (Debian 12 has
# no 3.13): fetched with `apt-get source` through a deb-src entry given to
# that one command (its own sources.list, lists directory and no source
# parts), so the system's apt sources are never changed. apt checks the
# files against the signed Sources index. We build the upstream tree (the
# orig tarball, `dpkg-source --skip-patches`): Debian's patches adapt paths,
# multiarch and packaging, none of which matters to an interpreter that only
# runs tests, and the upstream tree is what Tools/tsan's suppressions are
# written for.
#
# The result is cached outside the repository, keyed by the upstream version
# and a hash of the compiler and configure flags, so that later runs reuse
# it (a stamp file marks a finished installation; an interrupted build is
# redone). A cached interpreter is used without contacting the network.
#
# Environment:
#   PINPOOL_FT_CACHE      cache directory (default /var/cache/pinpool)
#   PINPOOL_FT_DOWNLOADS  a directory already holding the source package's
#                         .dsc and tarballs (skips the download)
#   JOBS                  make -j (default: nproc)
set -euo pipefail

CACHE="${PINPOOL_FT_CACHE:-/var/cache/pinpool}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

# Sanitizer runtimes of clang 14 cannot map their shadow memory when the
# kernel randomizes mmap with more than 28 bits (scripts/test.sh does the
# same). configure compiles and runs test programs with -fsanitize=thread
# and the build runs the interpreter it built, so both need it.
NO_ASLR=()
rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)"
if ((rnd_bits > 28)) && command -v setarch >/dev/null; then
  NO_ASLR=(setarch "$(uname -m)" -R)
fi

# What makes one build differ from another; its hash is part of the cache
# key. No PGO or LTO (each would build the interpreter twice or link for
# minutes, for speed we do not need); -O1 compiles faster than the default
# -O3 and runs well enough under TSAN's own slowdown; -g for file:line in
# reports. No doc strings, no ensurepip (no PyPI here anyway).
CC_NAME=clang
OPT_FLAGS="-DNDEBUG -g -O1"
CONFIGURE_FLAGS=(--disable-gil --with-thread-sanitizer --without-doc-strings
  --without-ensurepip --disable-test-modules)
CLANG_VERSION="$("$CC_NAME" --version | head -n 1)"
KEY="$(printf '%s\n' "$CLANG_VERSION" "$OPT_FLAGS" "${CONFIGURE_FLAGS[@]}" |
  sha256sum | cut -c1-12)"

log() { echo "build-python: $*" >&2; }

# A finished build of any 3.13.x with these flags will do.
find_cached() {
  local d dirs
  shopt -s nullglob
  dirs=("$CACHE"/cpython-3.13.*-ft-tsan-"$KEY")
  shopt -u nullglob
  ((${#dirs[@]})) || return 1
  mapfile -t dirs < <(printf '%s\n' "${dirs[@]}" | sort -V -r)
  for d in "${dirs[@]}"; do
    if [[ -f "$d/.complete" && -x "$d/bin/python3.13t" ]]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

mkdir -p "$CACHE"
# Two test runs on one machine must not build into the same directory.
exec 9>"$CACHE/.build-python.lock"
flock 9

if prefix="$(find_cached)"; then
  log "cached: $prefix"
  echo "$prefix"
  exit 0
fi

# ---- download ---------------------------------------------------------------
DL="${PINPOOL_FT_DOWNLOADS:-$CACHE/downloads}"
shopt -s nullglob
dscs=("$DL"/python3.13_*.dsc)
shopt -u nullglob
if ((${#dscs[@]} == 0)); then
  command -v dpkg-source >/dev/null || {
    log "dpkg-source missing: apt-get install dpkg-dev"
    exit 1
  }
  log "downloading Debian trixie's python3.13 source package into $DL"
  APT_DIR="$CACHE/apt-trixie-src"
  rm -rf "$APT_DIR"
  mkdir -p "$APT_DIR/lists/partial" "$DL"
  # signed-by: the Debian archive keyring ships trixie's keys on Debian 12.
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian trixie main" >"$APT_DIR/sources.list"
  APT_OPTS=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list"
    -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$APT_DIR/lists")
  apt-get "${APT_OPTS[@]}" update -q >&2
  (cd "$DL" && apt-get "${APT_OPTS[@]}" source --download-only python3.13 >&2)
fi
shopt -s nullglob
dscs=("$DL"/python3.13_*.dsc)
shopt -u nullglob
if ((${#dscs[@]} == 0)); then
  log "apt-get source left no python3.13 .dsc in $DL"
  exit 1
fi
DSC="$(printf '%s\n' "${dscs[@]}" | sort -V | tail -n 1)"
# 3.13.5-2+deb13u5 -> 3.13.5
UPSTREAM="$(basename "$DSC" .dsc | sed -e 's/^python3.13_//' -e 's/-[^-]*$//')"
PREFIX="$CACHE/cpython-$UPSTREAM-ft-tsan-$KEY"
WORK="$CACHE/build-cpython-$UPSTREAM-ft-tsan-$KEY"
LOG="$CACHE/build-cpython-$UPSTREAM-ft-tsan-$KEY.log"

rm -rf "$WORK" "$PREFIX"
mkdir -p "$WORK"
log "unpacking $(basename "$DSC") (upstream tree, Debian patches not applied)"
# dpkg-source verifies the tarballs against the .dsc's checksums. It warns
# that it cannot check the uploader's signature of the .dsc (that needs
# debian-keyring); apt-get has already checked every file against trixie's
# Sources index, whose Release file is signed by the archive key.
dpkg-source --skip-patches -x "$DSC" "$WORK/src" >&2

# ---- build -------------------------------------------------------------------
log "configure + make -j$JOBS + install into $PREFIX (log: $LOG)"
t0=$SECONDS
# The interpreter runs during the build (freezing modules, sysconfig data,
# compileall); a race report there must not fail the build (exitcode=0),
# and the known interpreter-internal ones are suppressed.
export TSAN_OPTIONS="exitcode=0 suppressions=$WORK/src/Tools/tsan/suppressions_free_threading.txt"
# (Each command checked: set -e does not apply inside `if ! build`.)
build() {
  mkdir -p "$WORK/obj" && cd "$WORK/obj" || return 1
  "${NO_ASLR[@]}" ../src/configure CC="$CC_NAME" OPT="$OPT_FLAGS" \
    --prefix="$PREFIX" "${CONFIGURE_FLAGS[@]}" || return 1
  "${NO_ASLR[@]}" make -j"$JOBS" || return 1
  # compileall -l: only the top level of Lib at install time; the rest is
  # compiled on first import (a TSAN interpreter compiles slowly, and the
  # tests import a small part of the standard library).
  "${NO_ASLR[@]}" make install COMPILEALL_OPTS="-j$JOBS -l" || return 1
}
if ! (build) >"$LOG" 2>&1; then
  log "FAILED after $((SECONDS - t0))s; last lines of $LOG:"
  tail -n 40 "$LOG" >&2
  exit 1
fi
# The build tree goes; the suppressions file the runner uses stays.
cp "$WORK/src/Tools/tsan/suppressions_free_threading.txt" "$PREFIX/tsan-suppressions.txt"
# Free-threaded, and with the modules the tests need (ctypes needs
# libffi-dev at build time: without it configure silently leaves it out,
# and a cached interpreter without it would fail every later run).
if ! "${NO_ASLR[@]}" "$PREFIX/bin/python3.13t" -c '
import sys, sysconfig, ctypes, json, queue, subprocess
assert sysconfig.get_config_var("Py_GIL_DISABLED")
assert not sys._is_gil_enabled()' >&2; then
  log "the new interpreter is not free-threaded or lacks a module (see above)"
  exit 1
fi
touch "$PREFIX/.complete"
rm -rf "$WORK"
log "built in $((SECONDS - t0))s: $PREFIX"
echo "$PREFIX"
