#!/bin/sh
# it_python.sh - the Python package (python/heapd) under pytest against a real
# heapd (host backend, temporary socket) with real rank processes, Debian's
# python3-torch (CPU) and the preload library over a recording NCCL stand-in.
# Run by tests/run.sh. Fails (not skips) when python3-torch or pytest is
# missing: scripts/deps.sh installs them.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
PY=${HEAPD_PYTHON:-/usr/bin/python3}
. "$SRC/tests/lib.sh"
lib_tmpdir py
S=$T/heapd.sock
hpid=
lib_on_exit 'lib_kill hpid'

if ! "$PY" -c 'import torch, pytest, numpy' 2>"$T/imp.err"; then
    echo "FAIL $PY cannot import torch, pytest and numpy: $(tail -1 "$T/imp.err")"
    echo "     install python3-torch python3-pytest python3-numpy (scripts/deps.sh does)"
    exit 1
fi
case "${SANITIZE:-}$(nm -D "$BUILD/libheapc.so" 2>/dev/null | grep -c __asan_init)" in
    *[1-9]*)
        # An ASan-built libheapc cannot be loaded into an uninstrumented python
        # without LD_PRELOAD of libasan, which then reports CPython's and
        # torch's own leaks and aborts; the package is tested in the normal build.
        echo "skipped: pytest of python/heapd under a sanitizer build ($BUILD/libheapc.so is ASan-instrumented)"
        exit 0;;
esac

cat >"$T/heapd.conf" <<EOF2
socket = $S
backend = host
log_level = info
chunk_size = 1M
va_size = 1G
collect_timeout_ms = 20000
EOF2
start_heapd "$T/heapd.conf" "$T/heapd.log" || { echo "FAIL heapd did not start"; cat "$T/heapd.log"; exit 1; }

cd "$SRC" || exit 1
HEAPD_SOCKET=$S HEAPC_LIB=$BUILD/libheapc.so BUILD=$BUILD PYTHONPATH=$SRC/python \
    PYTHONDONTWRITEBYTECODE=1 timeout 900 "$PY" -m pytest -p no:cacheprovider -q -ra tests/python
rc=$?
if grep -q 'invariant broken' "$T/heapd.log"; then echo "FAIL allocator invariants in heapd"; rc=1; fi
[ $rc = 0 ] || { echo "--- heapd log (tail)"; tail -20 "$T/heapd.log"; }
echo "it_python: exit $rc"
exit $rc
