#!/usr/bin/env bash
# Install a pinpool build tree into a temporary prefix, then build and run a
# consumer against it three ways: CMake package (shared and static targets)
# and pkg-config. Exits non-zero on any failure.
#
#   tests/consumer/run.sh [BUILD_DIR]     (default build/release)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="${1:-build/release}"
case "$BUILD" in
  /*) ;;
  *) BUILD="$ROOT/$BUILD" ;;
esac
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  echo "consumer: $BUILD is not a configured build directory" >&2
  exit 2
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/pinpool-consumer.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
PREFIX="$TMP/prefix"

echo "== consumer: install $BUILD -> $PREFIX"
cmake --build "$BUILD"
cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" ||
  { cat "$TMP/install.log"; exit 1; }

# The library directory is whatever GNUInstallDirs chose (lib, lib64 or
# lib/<multiarch>): find it from the installed pkg-config file.
PC="$(find "$PREFIX" -name pinpool.pc -print -quit)"
if [[ -z "$PC" ]]; then
  echo "consumer: pinpool.pc was not installed" >&2
  exit 1
fi
PCDIR="$(dirname "$PC")"
LIBDIR="$(dirname "$PCDIR")"
for f in "$PREFIX/include/pinpool.h" "$LIBDIR/libpinpool.so" \
  "$LIBDIR/libpinpool.a" "$LIBDIR/cmake/pinpool/pinpoolConfig.cmake" \
  "$LIBDIR/cmake/pinpool/pinpoolConfigVersion.cmake"; do
  [[ -e "$f" ]] || { echo "consumer: missing $f" >&2; exit 1; }
done
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== consumer: CMake find_package(pinpool)"
cmake -S "$HERE" -B "$TMP/cmake-build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
  >"$TMP/configure.log" || { cat "$TMP/configure.log"; exit 1; }
cmake --build "$TMP/cmake-build"
"$TMP/cmake-build/consumer"
"$TMP/cmake-build/consumer_static"

echo "== consumer: pkg-config"
export PKG_CONFIG_PATH="$PCDIR"
CFLAGS_LIBS="$(pkg-config --cflags --libs pinpool)"
echo "pkg-config --cflags --libs pinpool: $CFLAGS_LIBS"
# shellcheck disable=SC2086 # word splitting of pkg-config output is intended
cc -std=c11 -Wall -Werror "$HERE/main.c" -o "$TMP/consumer-pc" $CFLAGS_LIBS
"$TMP/consumer-pc"
# Static link: the archive plus Libs.private.
STATIC_LIBS="$(pkg-config --cflags --static --libs pinpool)"
STATIC_LIBS="${STATIC_LIBS/-lpinpool/-Wl,-Bstatic -lpinpool -Wl,-Bdynamic}"
echo "static: $STATIC_LIBS"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror "$HERE/main.c" -o "$TMP/consumer-pc-static" \
  $STATIC_LIBS
"$TMP/consumer-pc-static"

echo "consumer: OK"
