#!/bin/sh
# it_link.sh - a program linked against the build folder's shared libheapc,
# as a user links one (cc ... -L build -lheapc), runs: the loader finds
# build/libheapc.so.0 (the soname), and the program works against a real
# heapd. The same for libheapc_nccl's soname.
#
# Run by tests/run.sh (BUILD = build dir, HEAPD_SRC = source root); exit 0 =
# pass.
set -u
BUILD=${BUILD:-build}
HEAPD_SRC=${HEAPD_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
case $BUILD in /*) B=$BUILD;; *) B=$(pwd)/$BUILD;; esac
CC=${CC:-cc}
. "$HEAPD_SRC/tests/lib.sh"
lib_tmpdir link
S=$T/heapd.sock
hpid=
lib_on_exit '[ -n "$hpid" ] && kill -9 "$hpid" 2>/dev/null'

for so in libheapc.so.0 libheapc_nccl.so.0; do
    if [ -e "$B/$so" ]; then ok "$BUILD/$so exists"; else bad "$BUILD/$so is missing"; fi
done
soname=$(readelf -d "$B/libheapc.so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ "$soname" = libheapc.so.0 ]; then ok "libheapc.so's soname is libheapc.so.0"; else bad "soname '$soname'"; fi

# Only the public API leaves the shared library: its exported functions are
# exactly those heapc.h declares (heapc_errdesc, issue 26, among them; the
# client and common objects are built with hidden symbols). Names that
# start with _ are the toolchain's (an instrumented build's runtime hooks).
grep -o '\bheapc_[a-z_0-9]*(' "$HEAPD_SRC/client/heapc.h" | tr -d '(' | sort -u >"$T/api.txt"
nm -D --defined-only "$B/libheapc.so" 2>/dev/null | awk '{print $3}' | grep -v '^_' | sort -u >"$T/exported.txt"
if [ -s "$T/api.txt" ] && cmp -s "$T/api.txt" "$T/exported.txt"; then
    ok "libheapc.so exports heapc.h's $(wc -l <"$T/api.txt") functions and nothing else"
else
    bad "libheapc.so's exports differ from heapc.h's functions (< heapc.h, > exported):"; diff "$T/api.txt" "$T/exported.txt"
fi
if grep -qx heapc_errdesc "$T/exported.txt"; then ok "heapc_errdesc is exported"; else bad "heapc_errdesc is not exported"; fi
# The API bindings rely on (issue 31: python/heapd checks layouts and parses
# sizes through them) is exported.
for f in heapc_abi_version heapc_sizeof heapc_parse_size heapc_attach_env; do
    if nm -D --defined-only "$B/libheapc.so" 2>/dev/null | grep -q " T $f\$"; then ok "libheapc.so exports $f"
    else bad "libheapc.so does not export $f"; fi
done

# An instrumented build (make SANITIZE=...) links its programs the same way.
SAN=
if nm -D "$B/libheapc.so" 2>/dev/null | grep -q '__asan_'; then SAN="-fsanitize=address,undefined"; fi
if $CC $SAN -std=c11 -Wall -Werror -I"$HEAPD_SRC/client" -o "$T/trainer" "$HEAPD_SRC/examples/trainer.c" \
        -L"$B" -lheapc -Wl,-rpath,"$B" 2>"$T/cc.err"; then
    ok "examples/trainer.c links with -L$BUILD -lheapc"
else
    bad "examples/trainer.c does not link:"; cat "$T/cc.err"
fi
need=$(readelf -d "$T/trainer" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(libheapc[^]]*\)\]/\1/p')
if [ "$need" = libheapc.so.0 ]; then ok "the program needs libheapc.so.0"; else bad "the program needs '$need'"; fi

cat >"$T/heapd.conf" <<CONF
socket = $S
backend = host
chunk_size = 1M
va_size = 256M
CONF
"$B/heapd" --config "$T/heapd.conf" 2>"$T/heapd.log" &
hpid=$!
if lib_wait_socket "$S" "$hpid"; then ok "heapd listens"; else bad "heapd did not start"; cat "$T/heapd.log"; fi
"$T/trainer" --socket "$S" --ranks 2 --steps 2 --chunk 1M >"$T/trainer.out" 2>&1; rc=$?
if [ $rc = 0 ]; then ok "the dynamically linked trainer runs 2 ranks against heapd"
else bad "the dynamically linked trainer: exit $rc"; cat "$T/trainer.out"; fi
kill -TERM "$hpid"; wait "$hpid"; hpid=

echo "it_link: $fails failure(s)"
[ $fails = 0 ]
