#!/bin/sh
# it_faults.sh - faults against a real heapd (host backend) and real ranks
# (tests/prog_rank.c). Run by tests/run.sh.
#
# Checks:
#   1-3. a rank killed with SIGKILL while it allocates (a tight loop of
#        allocations), while it frees (one Free request per block), and while
#        it waits in a collect: the ranks waiting in a collect are told at
#        once (ERR_PEER_GONE naming the dead rank, measured < 2 s while the
#        heap's collect timeout is 30 s); a rank that collects later is told
#        at once too; heapctl stats shows where the dead rank was; when the
#        last rank exits heapd logs the heap destroyed, `heapctl heaps` is
#        empty and heapd's fd count is back to where it was (chunks released).
#   4.   heapd killed with SIGKILL: a rank waiting in a collect and a rank
#        that calls heapc_alloc afterwards both fail at once with ERR_CONN
#        (prog_rank exit 7, "heapd closed the connection"); a new heapd on the
#        same socket path (the stale socket file is still there) starts and
#        serves new heaps.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
R=$BUILD/tests/prog_rank
CTL=$BUILD/heapctl
. "$SRC/tests/lib.sh"
lib_tmpdir faults
S=$T/heapd.sock
fails=0
hpid=
pids=
lib_on_exit 'lib_kill pids hpid'

# Waits up to $2 ms until file $1 has a line matching $3; prints the ms waited.
wait_line() {
    t0=$(now_ms)
    while ! grep -q "$3" "$1" 2>/dev/null; do
        [ $(($(now_ms) - t0)) -gt "$2" ] && break
        sleep 0.02
    done
    echo $(($(now_ms) - t0))
}
serving() { "$CTL" --socket "$S" heaps >/dev/null 2>&1; }
# heapd started and answering (the stale socket file of a killed one is
# there before the new one listens).
start_serving() { start_heapd "$T/heapd.conf" "$T/heapd.log"; wait_for serving; }
# rank HEAP R W [prog_rank args...]: one rank in the background; stdin from
# $T/HEAP.R.in when it exists. Sets pid_R.
rank() {
    heap=$1 r=$2 w=$3; shift 3
    in=/dev/null
    [ -e "$T/$heap.$r.in" ] && in=$T/$heap.$r.in
    "$R" --socket "$S" --heap "$heap" --rank "$r" --world "$w" --timeout-ms 30000 "$@" \
        <"$in" >"$T/$heap.$r.out" 2>"$T/$heap.$r.err" &
    eval "pid_$r=\$!"
    pids="$pids $!"
}
# Every rank of the heap has attached (its 'attached' line is out).
wait_attached() { # HEAP RANKS...
    heap=$1; shift
    for r in "$@"; do wait_line "$T/$heap.$r.out" 10000 '^attached' >/dev/null; done
}
heap_gone() { # HEAP: heapd logged its destruction and heapctl no longer lists it
    i=0
    while [ $i -lt 100 ]; do
        if grep -q "heap \"$1\" destroyed" "$T/heapd.log" && ! "$CTL" --socket "$S" heaps 2>/dev/null | grep -q "^$1 "; then
            return 0
        fi
        sleep 0.05; i=$((i + 1))
    done
    return 1
}
# stats_field HEAP RANK FIELD: a rank's figure from `heapctl stats --json`
stats_field() {
    "$CTL" --socket "$S" stats "$1" --json 2>/dev/null | tr -d ' \n' |
        sed 's/},{/}\n{/g' | grep "\"rank\":$2," | grep -o "\"$3\":[0-9a-z]*" | head -1 | cut -d: -f2
}

cat >"$T/heapd.conf" <<EOF
socket = $S
backend = host
log_level = info
chunk_size = 64M
va_size = 256M
collect_timeout_ms = 30000
EOF
start_serving
check "heapd starts and listens" test -S "$S"
sleep 0.2 # heapctl's probe connection closed
fd0=$(nfds)

# ---- 1-3. a rank killed while it allocates, frees, or waits in a collect --------------
# Heap of 3 ranks, one 64 MiB chunk (512-byte blocks: 131072 fit, no growth),
# collect timeout 30 s. The other ranks wait in a collect ('try collect': the
# error is printed as 'e CODE message' and the rank stays connected a while).
awk 'BEGIN { for (i = 0; i < 120000; i++) print "alloc 512" }' >"$T/allocs.in"
# Blocks of the free scenario: sanitizer builds validate the allocator after
# every call (O(blocks)), so they get fewer.
NFREE=80000
nm "$BUILD/heapd" 2>/dev/null | grep -q __asan_init && NFREE=3000
awk -v n=$NFREE 'BEGIN { print "batch 1"; for (i = 0; i < n; i++) print "alloc 512";
             for (i = 0; i < n; i++) print "free " i; print "sleep 60000" }' >"$T/frees.in"

scenario() { # NAME DEADRANK: ranks 0..2 of heap NAME set up by the caller; kills DEADRANK
    name=$1 dead=$2
    eval "dpid=\$pid_$dead"
    t0=$(now_ms)
    kill -9 "$dpid"
    wait "$dpid" 2>/dev/null
    pids=$(echo "$pids" | sed "s/ $dpid\b//")
    waited=""
    allnamed=1
    for r in 0 1 2; do
        [ "$r" = "$dead" ] && continue
        [ "$r" = "${late:-x}" ] && continue
        ms=$(wait_line "$T/$name.$r.out" 35000 '^e ')
        waited="$waited rank $r: ${ms} ms;"
        grep -q "^e ERR_PEER_GONE .*rank $dead (pid [0-9]*) disconnected" "$T/$name.$r.out" || allnamed=0
        [ "$ms" -lt 2000 ] || allnamed=0
    done
    elapsed=$(($(now_ms) - t0))
    check "$name: the ranks waiting in a collect get ERR_PEER_GONE naming rank $dead at once ($waited timeout 30000 ms)" \
        test $allnamed = 1
    [ $allnamed = 1 ] || { for r in 0 1 2; do sed "s/^/    $name.$r: /" "$T/$name.$r.out" | grep -v '^    .*: a ' | tail -3; done; }
}

# 1. during alloc: rank 2 allocates 512-byte blocks in a loop; ranks 0, 1 wait
rank kalloc 0 3 --chunk 64M --initial 64M --va 64M -- try collect sleep 3000
rank kalloc 1 3 --chunk 64M --initial 64M --va 64M -- try collect sleep 3000
cp "$T/allocs.in" "$T/kalloc.2.in"
rank kalloc 2 3 --chunk 64M --initial 64M --va 64M
wait_attached kalloc 0 1 2
wait_line "$T/kalloc.2.out" 10000 '^a 2000 ' >/dev/null   # well into its loop
scenario kalloc 2
n=$(grep -c '^a ' "$T/kalloc.2.out")
check "kalloc: rank 2 was killed in the middle of its allocations ($n of 120000 made)" test "$n" -gt 2000 -a "$n" -lt 120000
seq2=$(stats_field kalloc 2 next_seq); att=$(stats_field kalloc 2 attached)
check "kalloc: heapctl stats shows rank 2 detached at allocation ${seq2:-?} (${n} seen by the rank)" \
    sh -c "test '$att' = false && test '${seq2:-0}' -ge $n"

# 2. during free: rank 2 allocates NFREE blocks, then frees them one request
#    at a time (batch 1); killed in the free phase. Ranks 0 and 1 read their
#    commands from FIFOs and start their collect once rank 2 is halfway
#    through its allocations. (128 MiB: its NFREE * 512 bytes stay below
#    half the heap, so the default policy asks for no compaction collect.)
mkfifo "$T/kfree.0.in" "$T/kfree.1.in"
rank kfree 0 3 --chunk 64M --initial 128M --va 128M
rank kfree 1 3 --chunk 64M --initial 128M --va 128M
exec 5>"$T/kfree.0.in" 6>"$T/kfree.1.in"
cp "$T/frees.in" "$T/kfree.2.in"
rank kfree 2 3 --chunk 64M --initial 128M --va 128M
wait_attached kfree 0 1 2
wait_line "$T/kfree.2.out" 60000 "^a $((NFREE / 2)) " >/dev/null
echo "try collect sleep 3000" >&5
echo "try collect sleep 3000" >&6
exec 5>&- 6>&-
wait_line "$T/kfree.2.out" 60000 "^a $((NFREE - 1)) " >/dev/null
sleep 0.05
scenario kfree 2
rel=$(stats_field kfree 2 released_bytes)
check "kfree: rank 2 was killed in the middle of its frees (${rel:-?} of $((NFREE * 512)) bytes released)" \
    sh -c "test '${rel:-0}' -gt 0 -a '${rel:-0}' -lt $((NFREE * 512))"

# 3. during collect: ranks 0 and 1 wait in a collect, rank 2 comes later;
#    rank 1 is killed while it waits
rank kcoll 0 3 --chunk 64M --initial 64M --va 64M -- alloc 4K try collect sleep 3000
rank kcoll 1 3 --chunk 64M --initial 64M --va 64M -- alloc 4K collect
rank kcoll 2 3 --chunk 64M --initial 64M --va 64M -- alloc 4K sleep 1500 try collect sleep 1500
wait_attached kcoll 0 1 2
sleep 0.5
late=2; scenario kcoll 1; late=
ms=$(wait_line "$T/kcoll.2.out" 5000 '^e ')
check "kcoll: rank 2, collecting after rank 1 died, gets ERR_PEER_GONE naming rank 1" \
    grep -Eq '^e ERR_PEER_GONE .*rank 1 (\(pid [0-9]+\) disconnected|is not connected)' "$T/kcoll.2.out"

# every surviving rank exits 0 once its sleep ends; the heaps go away
wait_all_ok=1
for p in $pids; do lib_wait_pid "$p" 20; [ "$rc" = 0 ] || wait_all_ok=0; done
pids=
check "the surviving ranks finish and exit 0" test $wait_all_ok = 1
for h in kalloc kfree kcoll; do
    check "$h: heap destroyed when its last client left (heapd log, heapctl heaps)" heap_gone "$h"
done
"$CTL" --socket "$S" heaps >"$T/heaps.txt" 2>&1
check "heapctl heaps is empty" test ! -s "$T/heaps.txt"
i=0; while [ "$(nfds)" != "$fd0" ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i + 1)); done
check "heapd's fd count is back to $fd0 (every chunk and connection released): $(nfds)" test "$(nfds)" = "$fd0"

# ---- 4. heapd killed with SIGKILL ------------------------------------------------------------
rank hk 0 2 -- alloc 4K collect
rank hk 1 2 -- alloc 4K sleep 1500 alloc 4K
wait_attached hk 0 1
wait_line "$T/hk.1.out" 5000 '^a 0 ' >/dev/null
sleep 0.3
t0=$(now_ms)
kill -9 "$hpid"; wait "$hpid" 2>/dev/null; hpid=
lib_wait_pid "$pid_0" 10; r0=$rc; t1=$(now_ms)
lib_wait_pid "$pid_1" 10; r1=$rc
pids=
check "heapd killed: the rank waiting in a collect fails at once with ERR_CONN (exit $r0, $((t1 - t0)) ms)" \
    test "$r0" = 7 -a $((t1 - t0)) -lt 2000
check "heapd killed: the rank's next heapc_alloc fails with ERR_CONN (exit $r1)" test "$r1" = 7
check "heapd killed: the errors say heapd closed the connection" \
    sh -c "grep -q 'ERR_CONN: heapd closed the connection' $T/hk.0.err && grep -q 'ERR_CONN: heapd closed the connection' $T/hk.1.err"
sed 's/^/    rank 1: /' "$T/hk.1.err" | head -2
check "heapd killed: its socket file is left behind (stale)" test -S "$S"
start_serving
check "a new heapd starts on the same socket path (stale file replaced)" sh -c "kill -0 $hpid && test -S $S"
rank new 0 2 -- alloc 4K alloc 1M collect alloc 64K stats
rank new 1 2 -- alloc 4K alloc 1M collect alloc 64K
lib_wait_pid "$pid_0" 20; n0=$rc; lib_wait_pid "$pid_1" 20; n1=$rc
pids=
check "the new heapd serves a new heap (both ranks exit 0: $n0, $n1)" test "$n0" = 0 -a "$n1" = 0
check "the new heap's offsets are identical on both ranks" sh -c \
    "grep '^a ' $T/new.0.out > $T/n0; grep '^a ' $T/new.1.out > $T/n1; test -s $T/n0 && cmp -s $T/n0 $T/n1"
check "the new heapd knows nothing of the old heaps (epoch 1)" grep -q '^s heap name=new .*epoch=1 ' "$T/new.0.out"

# ---- shutdown ----------------------------------------------------------------------------------
kill -TERM "$hpid"; lib_wait_pid "$hpid" 20; hpid=
check "heapd stops on SIGTERM with exit 0 ($rc)" test "$rc" = 0
clean_log "$T/heapd.log"
if [ $fails != 0 ]; then
    echo "--- heapd log (tail)"; tail -20 "$T/heapd.log"
fi
echo "it_faults: $fails failure(s)"
[ $fails = 0 ]
