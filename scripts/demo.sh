#!/usr/bin/env bash
# The project's run command: build the release preset and run the demo.
#
#   scripts/demo.sh [ARGS...]      (ARGS go to `pinpool demo`)
#
# Package installation and build output go to stderr; stdout is the demo's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

export DEBIAN_FRONTEND=noninteractive
PACKAGES=(cmake ninja-build gcc libc6-dev pkg-config libjansson-dev libdw-dev libunwind8)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
    grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ "$(id -u)" == 0 ]]; then
    echo "demo: installing ${missing[*]}" >&2
    {
      apt-get update -q &&
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    } >&2
  else
    echo "demo: missing packages (run as root to install): ${missing[*]}" >&2
    exit 1
  fi
fi

{
  # Tests are not needed (nor their packages) to run the demo.
  cmake --preset release -DBUILD_TESTING=OFF
  cmake --build --preset release --target pinpool_cli
} >&2

exec "$ROOT/build/release/tools/pinpool" demo "$@"
