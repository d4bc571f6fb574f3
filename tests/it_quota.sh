#!/bin/sh
# it_quota.sh - quota_uid charges heapd's bookkeeping of a uid's heaps, not
# only their chunks (issue 33 item 9): the block records of many small
# allocations and the decision log a lagging rank makes heapd keep. A real
# heapd (host backend) and real clients (prog_rank); another uid (nobody,
# through setpriv) must stay unaffected.
#
# The figures: a heap of 32 MiB (min_block 512) holds 65,536 blocks of
# 512 B; their block records take ~72-145 B each, and a rank that lags lets
# the log keep 40 B per decision. quota_uid leaves 3 MiB above the chunks:
#   - one rank allocating alone is refused at the block table's doubling
#     from 2^16 to 2^17 slots (32,768 blocks), before it holds 4.7 MiB of
#     records;
#   - with a second rank that makes no allocation, the log doubles with the
#     table, and the refusal comes at 16,384 blocks.
# Before the fix both ran until the heap's va_size (ERR_VA_EXHAUSTED).
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

cat >"$T/heapd.conf" <<EOF
socket = $S
socket_mode = 0666
backend = host
collect_timeout_ms = 20000
quota_uid = 35M
EOF
check "heapd starts" start_heapd "$T/heapd.conf" "$T/heapd.log"

HEAP="--chunk 32M --initial 32M --va 32M --min-block 512"
allocs() { i=0; while [ $i -lt "$1" ]; do echo "alloc 512"; i=$((i + 1)); done; }
allocs 40000 >"$T/allocs.txt"
count() { grep -c '^a ' "$1"; }

# ---- one rank: the block records --------------------------------------------------
"$R" --socket "$S" --heap solo --rank 0 --world 1 $HEAP <"$T/allocs.txt" >"$T/solo.out" 2>"$T/solo.err"
rc=$?
n=$(count "$T/solo.out")
echo "   solo: $n allocations of 512 B, exit $rc: $(cat "$T/solo.err")"
check "many small allocations are refused with ERR_QUOTA (exit 1)" \
    sh -c "test $rc = 1 && grep -q 'ERR_QUOTA' $T/solo.err"
check "the refusal comes before the heap is full (32768 of 65536 blocks)" test "$n" = 32768
check "the refusal names the figures: the block records' growth, chunks, bookkeeping, the quota" \
    grep -q 'would grow the block records by 2312 KiB; uid 0 would use .* of chunk memory and heapd bookkeeping .*now 32 MiB of chunks, .* of allocator bookkeeping, 160 KiB of decision logs.*per-uid quota of 35 MiB' "$T/solo.err"

# ---- a lagging rank: the decision log --------------------------------------------
"$R" --socket "$S" --heap lag --rank 1 --world 2 --chunk 16M --initial 16M --va 16M --min-block 512 \
    -- touch "$T/lag1.ready" waitfile "$T/lag.done" >"$T/lag1.out" 2>&1 &
p1=$!
pids="$p1"
"$R" --socket "$S" --heap lag --rank 0 --world 2 --chunk 16M --initial 16M --va 16M --min-block 512 \
    <"$T/allocs.txt" >"$T/lag0.out" 2>"$T/lag0.err"
rc=$?
n=$(count "$T/lag0.out")
echo "   lag: $n allocations of 512 B by rank 0, none by rank 1, exit $rc: $(cat "$T/lag0.err")"
check "a rank far ahead of its peer is refused with ERR_QUOTA" \
    sh -c "test $rc = 1 && grep -q 'ERR_QUOTA' $T/lag0.err"
check "the decision log counts: refused at 16384 blocks, not at the table alone's 32768" test "$n" = 16384
check "the refusal names the decision log and the decisions it keeps" \
    grep -q 'the decision log by 640 KiB, which keeps the 16384 decisions the slowest rank has not made;.* 640 KiB of decision logs' "$T/lag0.err"

# ---- stats and metrics show the charge (rank 1 keeps heap lag) ---------------------
"$CTL" --socket "$S" --json stats lag >"$T/stats.json" 2>&1
check "heapctl --json stats shows the heap's bookkeeping_bytes (block records and log: over 1.5 MiB)" \
    python3 -c "import json,sys; h=json.load(open(sys.argv[1])); h=h['heaps'][0] if 'heaps' in h else h; \
sys.exit(0 if h['bookkeeping_bytes'] > 3 << 19 else 1)" "$T/stats.json"
"$CTL" --socket "$S" metrics >"$T/metrics.txt" 2>&1
check "heapctl metrics: heapd_uid_quota_bytes of uid 0 within quota_uid and above its chunks" \
    awk '/^heapd_uid_quota_bytes\{owner_uid="0"\}/ { v = $2 } END { exit !(v > 32 * 1048576 && v <= 35 * 1048576) }' \
    "$T/metrics.txt"
check "heapctl metrics: heapd_heap_bookkeeping_bytes of heap lag" grep -q '^heapd_heap_bookkeeping_bytes{heap="lag"' "$T/metrics.txt"

# ---- another uid is unaffected -----------------------------------------------------
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
    head -n 20000 "$T/allocs.txt" | setpriv --reuid=65534 --regid=65534 --clear-groups \
        "$R" --socket "$S" --heap other --rank 0 --world 1 $HEAP >"$T/other.out" 2>"$T/other.err"
    rc=$?
    check "another uid's 20000 small allocations succeed meanwhile (exit $rc)" \
        sh -c "test $rc = 0 && test $(count "$T/other.out") = 20000"
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
