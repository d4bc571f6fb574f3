#!/bin/sh
# it_quota.sh - quota_uid charges heapd's bookkeeping of a uid's heaps, not
# only their chunks (issue 33 item 9): the block records of many small
# allocations and the decision log a lagging rank makes heapd keep. A real
# heapd (host backend) and real clients (prog_rank); another uid (nobody,
# through setpriv) must stay unaffected.
#
# The figures: a heap of 32 MiB (min_block 512) holds 65,536 blocks of
# 512 B; their block records take ~72-145 B each, and a rank that lags lets
# the log keep 40 B per decision; the wing's block table (issue 29: seq,
# size, name of each block) 32 B a slot, at most half of its slots used,
# doubling with the allocator's. quota_uid leaves 5 MiB above the chunks:
#   - one rank allocating alone is refused at the block table's doubling
#     from 2^16 to 2^17 slots (32,768 blocks), before it holds 4.7 MiB of
#     records;
#   - with a second rank that makes no allocation (two ranks of 16 MiB), the
#     log doubles with the table, and the refusal comes at 16,384 blocks.
# Before the fix both ran until the heap's va_size or a collect the lagging
# rank never joins. Debug and sanitizer builds (HEAPD_VALIDATING: the
# allocator validates its O(blocks) invariants at every call) run the same
# at a quarter of the scale: 8 MiB, 1352 KiB above it, refusals at 8,192 and
# 4,096 blocks (the log is trimmed from 4,096 decisions on, so the lagging
# rank's log shows from there).
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
B=$(cd "$(dirname "$BUILD/x")" && pwd)
lib_tmpdir quota
chmod 755 "$T"
S=$T/heapd.sock
hpid=
pids=
lib_on_exit 'lib_kill hpid pids'
cp "$B/tests/prog_rank" "$B/heapctl" "$T/"
R=$T/prog_rank
CTL=$T/heapctl

if [ -n "${HEAPD_VALIDATING:-}" ]; then
    SOLO=8M LAG=4M QUOTA=9544K NSOLO=8192 NLAG=4096 NOTHER=2000 MIB=8
    SOLO_GROW="1090 KiB" SOLO_LOG="160 KiB" LAG_LOG="160 KiB" BK_MIN=409600
else
    SOLO=32M LAG=16M QUOTA=37M NSOLO=32768 NLAG=16384 NOTHER=20000 MIB=32
    SOLO_GROW="4360 KiB" SOLO_LOG="160 KiB" LAG_LOG="640 KiB" BK_MIN=1572864
fi
cat >"$T/heapd.conf" <<EOF
socket = $S
socket_mode = 0666
backend = host
collect_timeout_ms = 20000
quota_uid = $QUOTA
EOF
QUOTA_B=$("$B/heapd" --config "$T/heapd.conf" --check-config | sed -n 's/^quota_uid = //p')
QUOTA_H=$(echo "$QUOTA" | sed 's/M$/ MiB/; s/K$/ KiB/')
check "heapd starts" start_heapd "$T/heapd.conf" "$T/heapd.log"

HEAP="--chunk $SOLO --initial $SOLO --va $SOLO --min-block 512"
LHEAP="--chunk $LAG --initial $LAG --va $LAG --min-block 512"
allocs() { i=0; while [ $i -lt "$1" ]; do echo "alloc 512"; i=$((i + 1)); done; }
allocs $((NSOLO + NSOLO / 4)) >"$T/allocs.txt"
count() { grep -c '^a ' "$1"; }

# ---- one rank: the block records --------------------------------------------------
"$R" --socket "$S" --heap solo --rank 0 --world 1 $HEAP <"$T/allocs.txt" >"$T/solo.out" 2>"$T/solo.err"
rc=$?
n=$(count "$T/solo.out")
echo "   solo: $n allocations of 512 B, exit $rc: $(cat "$T/solo.err")"
check "many small allocations are refused with ERR_QUOTA (exit 1)" \
    sh -c "test $rc = 1 && grep -q 'ERR_QUOTA' $T/solo.err"
check "the refusal comes before the heap is full ($NSOLO of $((NSOLO * 2)) blocks)" test "$n" = $NSOLO
check "the refusal names the figures: the block records' growth, chunks, bookkeeping, the quota" \
    grep -q "would grow the block records by $SOLO_GROW; uid 0 would use .* of chunk memory and heapd bookkeeping .*now $MIB MiB of chunks, .* of allocator bookkeeping, $SOLO_LOG of decision logs.*per-uid quota of $QUOTA_H" "$T/solo.err"

# ---- a lagging rank: the decision log --------------------------------------------
"$R" --socket "$S" --heap lag --rank 1 --world 2 $LHEAP \
    -- touch "$T/lag1.ready" waitfile "$T/lag.done" >"$T/lag1.out" 2>&1 &
p1=$!
pids="$p1"
"$R" --socket "$S" --heap lag --rank 0 --world 2 $LHEAP \
    <"$T/allocs.txt" >"$T/lag0.out" 2>"$T/lag0.err"
rc=$?
n=$(count "$T/lag0.out")
echo "   lag: $n allocations of 512 B by rank 0, none by rank 1, exit $rc: $(cat "$T/lag0.err")"
check "a rank far ahead of its peer is refused with ERR_QUOTA" \
    sh -c "test $rc = 1 && grep -q 'ERR_QUOTA' $T/lag0.err"
check "the decision log counts: refused at $NLAG blocks, not at the table alone's $((NLAG * 2))" test "$n" = $NLAG
check "the refusal names the decision log and the decisions it keeps" \
    grep -q "the decision log by $LAG_LOG, which keeps the $NLAG decisions the slowest rank has not made;.* $LAG_LOG of decision logs" "$T/lag0.err"

# ---- stats and metrics show the charge (rank 1 keeps heap lag) ---------------------
"$CTL" --socket "$S" --json stats lag >"$T/stats.json" 2>&1
check "heapctl --json stats shows the heap's bookkeeping_bytes (block records and log: over $BK_MIN B)" \
    python3 -c "import json,sys; h=json.load(open(sys.argv[1])); h=h['heaps'][0] if 'heaps' in h else h; \
sys.exit(0 if h['bookkeeping_bytes'] > int(sys.argv[2]) else 1)" "$T/stats.json" $BK_MIN
"$CTL" --socket "$S" metrics >"$T/metrics.txt" 2>&1
check "heapctl metrics: heapd_uid_quota_bytes of uid 0 within quota_uid and above its chunks" \
    awk -v lo=$((MIB * 1048576)) -v hi="$QUOTA_B" \
    '/^heapd_uid_quota_bytes\{owner_uid="0"\}/ { v = $2 } END { exit !(v > lo && v <= hi) }' "$T/metrics.txt"
check "heapctl metrics: heapd_heap_bookkeeping_bytes of heap lag" grep -q '^heapd_heap_bookkeeping_bytes{heap="lag"' "$T/metrics.txt"

# ---- another uid is unaffected -----------------------------------------------------
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
    head -n $NOTHER "$T/allocs.txt" | setpriv --reuid=65534 --regid=65534 --clear-groups \
        "$R" --socket "$S" --heap other --rank 0 --world 1 $HEAP >"$T/other.out" 2>"$T/other.err"
    rc=$?
    check "another uid's $NOTHER small allocations succeed meanwhile (exit $rc)" \
        sh -c "test $rc = 0 && test $(count "$T/other.out") = $NOTHER"
else
    echo "skipped: needs root and setpriv to run a client as a second uid"
fi
touch "$T/lag.done"
lib_wait_pid "$p1" 30
pids=

kill -TERM "$hpid"; wait "$hpid"; rc=$?
hpid=
check "heapd stops cleanly" test $rc = 0
clean_log "$T/heapd.log"
echo "it_quota: $fails failure(s)"
[ $fails = 0 ]
