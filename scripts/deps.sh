#!/bin/sh
# deps.sh - find the Debian packages heapd needs and install the missing ones.
#
# Run as root: installs with apt-get. Otherwise: prints the exact command and
# exits 1. HEAPD_NO_DEPS=1 skips the step (packagers, the GPU machine).
# Usage: scripts/deps.sh [--check]   (--check: report only, never install)
set -eu

PKGS="libuv1-dev libprotobuf-c-dev protobuf-c-compiler check libhiredis-dev
libinih-dev redis-server pkg-config make gcc gnuplot-nox
clang libclang-rt-14-dev clang-format python3-torch python3-pytest python3-numpy
python3-prometheus-client python3-pip python3-setuptools"

[ "${HEAPD_NO_DEPS:-0}" = 1 ] && exit 0

missing=""
for p in $PKGS; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$st" in
        *"install ok installed"*) ;;
        *) missing="$missing $p" ;;
    esac
done

if [ -z "$missing" ]; then
    exit 0
fi

cmd="apt-get install -y --no-install-recommends$missing"
if [ "${1:-}" = "--check" ]; then
    echo "heapd: missing Debian packages:$missing" >&2
    echo "heapd: install them with: $cmd" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "heapd: missing Debian packages:$missing" >&2
    echo "heapd: run as root: apt-get update && $cmd" >&2
    exit 1
fi
echo "heapd: installing missing packages:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends $missing >/dev/null; then
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
echo "heapd: packages installed" >&2
