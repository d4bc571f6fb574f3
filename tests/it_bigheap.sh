#!/bin/sh
# it_bigheap.sh - replies that need more than 1024 fds (issue 15, item 3):
# heaps of many small chunks (host backend, 64 KiB chunks) whose AttachReply
# and AllocReply carry more chunk fds than one frame may (1024), so heapd
# sends them as ChunkBatch frames before the reply and libheapc reassembles
# them (docs/protocol.md).
#
#   1. a 1-rank heap of 1,120 chunks attaches, allocates 150 MiB (a growth of
#      about 1,280 chunks in one AllocReply), writes and checks its data,
#      detaches, and attaches again;
#   2. a 2-rank heap: both ranks attach (2 x 1,120 chunks each) and allocate
#      150 MiB (2 x ~1,280 new chunks each); rank 0 detaches and re-attaches
#      the grown heap (~4,800 fds) while rank 1 holds it, writes rank 1's copy
#      of the 150 MiB block through its mapping, and rank 1 reads it back.
#
# The clients need about 5,000 fds at once: the script raises its open-files
# limit (skipped, saying so, where it cannot).
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
R=$BUILD/tests/prog_rank
if ! ulimit -n 16384 2>/dev/null; then
    echo "skipped: cannot raise the open-files limit to 16384 (ulimit -n: $(ulimit -n))"
    exit 0
fi
lib_tmpdir big
S=$T/heapd.sock
hpid= p0= p1=
lib_on_exit '[ -n "$p0" ] && kill -9 $p0 2>/dev/null; [ -n "$p1" ] && kill -9 $p1 2>/dev/null; [ -n "$hpid" ] && kill -9 $hpid 2>/dev/null; wait 2>/dev/null'
cat >"$T/heapd.conf" <<EOF
socket = $S
backend = host
collect_timeout_ms = 60000
EOF
check "heapd starts" start_heapd "$T/heapd.conf" "$T/heapd.log"
P="--chunk 64K --initial 70M --va 1G"

# ---- 1 rank ------------------------------------------------------------------------------
bounded 120 "$R" --socket "$S" --heap big1 --rank 0 --world 1 $P -- \
    mapped alloc 4K alloc 150M mapped write 1 0 0x5a check 1 0x5a detach attach mapped alloc 4K \
    >"$T/one.out" 2>&1; rc=$?
cat "$T/one.out" | grep -v '^a ' | head -12
check "1 rank, 1,120 chunks: attach, alloc 150 MiB (growth over 1,024 chunks), data, re-attach (exit $rc)" test $rc = 0
m2=$(awk '/^m /{n++; if (n == 2) print $2}' "$T/one.out")
check "... the growth mapped more than 1,024 chunks at once (${m2:-no} bytes mapped)" test "${m2:-0}" -ge $((2304 * 65536))

# ---- 2 ranks: re-attach a grown heap -------------------------------------------------------
"$R" --socket "$S" --heap big2 --rank 1 --world 2 $P -- \
    alloc 4K alloc 150M touch "$T/r1" waitfile "$T/w0" check 1 0x77 detach >"$T/r1.out" 2>&1 &
p1=$!
"$R" --socket "$S" --heap big2 --rank 0 --world 2 $P -- \
    alloc 4K alloc 150M waitfile "$T/r1" detach attach mapped write 1 1 0x77 touch "$T/w0" detach \
    >"$T/r0.out" 2>&1 &
p0=$!
wait $p0; r0=$?; p0=
wait $p1; r1=$?; p1=
grep -v '^a ' "$T/r0.out" | head -8
grep -v '^a ' "$T/r1.out" | head -4
check "2 ranks: rank 0 re-attaches the grown heap (about 4,800 chunk fds) and writes rank 1's block (exit $r0)" test $r0 = 0
check "2 ranks: rank 1 reads what rank 0 wrote through its re-attached mapping (exit $r1)" test $r1 = 0
if has "$T/heapd.log" "cannot queue a reply"; then bad "heapd dropped a reply"; grep "cannot queue" "$T/heapd.log" | head -3; fi

kill -TERM "$hpid"; wait "$hpid"; rc=$?; hpid=
check "heapd stops cleanly (exit $rc)" test $rc = 0
echo "it_bigheap: $fails failure(s)"
[ $fails = 0 ]
