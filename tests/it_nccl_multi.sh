#!/bin/sh
# it_nccl_multi.sh - issue 32's multi-GPU benchmark (bench/nccl_multi_bench)
# in its host dry run: rank processes on a host-backend heapd of its own and
# the recording NCCL stand-in (tests/nccl_stub). Every rank attaches,
# registers the heap as NCCL_WIN_COLL_SYMMETRIC windows covering its heap
# buffers, calls all_reduce and all_gather on the heap buffers (inside a
# window) and on plain buffers (outside) the expected number of times for
# every size, deregisters every window (also windows registered by growths:
# --grow); the table and the JSON say the
# figures mean nothing on the host. Also: a rank that fails ends the run with
# its reason and exit 1, and the bench cleans up. Waits for the bench to
# exit (bounded), never sleeps.
#
# Run by tests/run.sh (BUILD = build dir, HEAPD_SRC = source root); exit 0 =
# pass.
set -u
BUILD=${BUILD:-build}
HEAPD_SRC=${HEAPD_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
case $BUILD in /*) B=$BUILD;; *) B=$(pwd)/$BUILD;; esac
. "$HEAPD_SRC/tests/lib.sh"
lib_tmpdir nccl_multi
NB=$B/bench/nccl_multi_bench
if [ ! -x "$NB" ] || [ ! -f "$B/tests/nccl_stub/libnccl.so.2" ]; then
    bad "$NB or $B/tests/nccl_stub/libnccl.so.2 is missing: make all"
    echo "it_nccl_multi: $passes passed, $fails failure(s)"
    exit 1
fi

# 1. 2 ranks, four sizes, JSON.
TMPDIR=$T bounded 60 "$NB" --host --ranks 2 --sizes 1K,16K,256K,4M --json "$T/nb.json" >"$T/r2.log" 2>&1; rc=$?
if [ $rc = 0 ]; then ok "2 ranks: exit 0"; else bad "2 ranks: exit $rc"; cat "$T/r2.log"; fi
check "2 ranks: the verdict is ok" has_re "$T/r2.log" '^nccl_multi_bench: ok$'
for r in 0 1; do
    check "rank $r: windows cover the heap buffers, calls in and outside windows, all deregistered" \
        has_re "$T/r2.log" "^nccl_multi_bench: rank $r: attached, [1-9][0-9]* window(s) ([0-9]* bytes, NCCL_WIN_COLL_SYMMETRIC) cover both heap buffers; 28+28 heap calls in windows, 28+28 plain calls outside; [1-9][0-9]* deregistered, 0 left: ok$"
done
check "the table says the figures mean nothing" has "$T/r2.log" "HOST DRY RUN: the NCCL stand-in moves no data, these figures mean nothing"
for s in 1024 16384 262144 4194304; do
    for op in all_reduce all_gather; do
        check "table: $op of $s bytes" has_re "$T/r2.log" "^$op  *$s  *[0-9.]*  *[0-9.]*  *[0-9.]*  not checked (host)$"
    done
done
check "JSON: host_dry_run true" has "$T/nb.json" '"host_dry_run": true'
check "JSON: meaningful false" has "$T/nb.json" '"meaningful": false'
n=$(grep -c '"op": "all_[a-z]*", "bytes": [0-9]*, "heap_us": ' "$T/nb.json")
check "JSON: 8 results ($n)" test "$n" = 8
check "JSON: a window count per rank" has_re "$T/nb.json" '"windows_per_rank": \[[1-9][0-9]*, [1-9][0-9]*\]'
check "no FAIL line" lacks "$T/r2.log" "FAIL"

# 2. 4 ranks; 3 ranks (1 KiB: all_gather's share of it is not a whole number of floats).
TMPDIR=$T bounded 60 "$NB" --host --ranks 4 --sizes 1K,64K >"$T/r4.log" 2>&1; rc=$?
n=$(grep -c '^nccl_multi_bench: rank [0-3]: attached, .*: ok$' "$T/r4.log")
if [ $rc = 0 ] && [ "$n" = 4 ]; then ok "4 ranks: exit 0, 4 ranks ok"; else bad "4 ranks: exit $rc, $n ranks ok"; cat "$T/r4.log"; fi
TMPDIR=$T bounded 60 "$NB" --host --ranks 3 --sizes 1K >"$T/r3.log" 2>&1; rc=$?
if [ $rc = 0 ]; then ok "3 ranks, 1 KiB: exit 0"; else bad "3 ranks: exit $rc"; cat "$T/r3.log"; fi

# 2b. --grow: a heap of one 16 MiB chunk, so both 20 MiB buffers come from growths, whose windows
# libheapc_nccl registers inside the growing heapc_alloc (the first chunk's window and one per growth).
TMPDIR=$T bounded 60 "$NB" --host --grow --sizes 1K,20M >"$T/grow.log" 2>&1; rc=$?
if [ $rc = 0 ]; then ok "--grow: exit 0"; else bad "--grow: exit $rc"; cat "$T/grow.log"; fi
for r in 0 1; do
    check "--grow: rank $r: 3 windows (the first chunk, two growths) cover the buffers, 3 deregistered" \
        has_re "$T/grow.log" "^nccl_multi_bench: rank $r: attached, 3 window(s) ([0-9]* bytes, NCCL_WIN_COLL_SYMMETRIC) cover both heap buffers; 14+14 heap calls in windows, 14+14 plain calls outside; 3 deregistered, 0 left: ok$"
done

# 3. A rank that cannot load NCCL: its reason, every rank fails, exit 1, nothing left behind.
TMPDIR=$T bounded 60 "$NB" --host --nccl-lib "$T/none/libnccl.so.2" --sizes 1K >"$T/bad.log" 2>&1; rc=$?
check "no NCCL: exit 1 ($rc)" test "$rc" = 1
check "no NCCL: the reason names the path and the fix" has "$T/bad.log" "the NCCL stand-in $T/none/libnccl.so.2: "
check "no NCCL: ... pass --nccl-lib PATH" has "$T/bad.log" "build it (make) or pass --nccl-lib PATH"
check "no NCCL: rank 0 did not finish" has "$T/bad.log" "nccl_multi_bench: rank 0: FAIL: did not finish"
left=$(find "$T" -maxdepth 1 -name 'nccl_multi_bench.*' | wc -l)
check "the bench removed its heapd folder ($left left)" test "$left" = 0

# 4. Usage: a GPU run needs a cuda heapd's socket.
bounded 10 "$NB" --sizes 1K >"$T/use.log" 2>&1; rc=$?
check "no --socket, no --host: exit 2 ($rc)" test "$rc" = 2
check "no --socket: says what to pass" has "$T/use.log" "pass --socket PATH of a cuda-backend heapd (or --host for the dry run)"

echo "it_nccl_multi: $passes passed, $fails failure(s)"
[ $fails = 0 ]
