#!/bin/sh
# it_heapd.sh - integration tests: a real heapd (host backend) and real rank
# processes (tests/prog_rank.c) and heapctl. Run by tests/run.sh.
#
# Covers: identical offsets on every rank under randomised per-rank free
# timing (both policies); data written through a peer pointer read by that
# peer; growth; forced collect from heapctl during a workload; a missing rank
# named after the timeout (attach and collect); a disconnected rank named at
# once; the asymmetry error and the heap it poisons (ring and socket);
# heapctl text and JSON output and exit codes.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
R=$BUILD/tests/prog_rank
CTL=$BUILD/heapctl
. "$SRC/tests/lib.sh"
lib_tmpdir it
S=$T/heapd.sock
fails=0
hpid=
lib_on_exit 'lib_kill hpid; pkill -9 -f "prog_rank --socket $S" 2>/dev/null'

cat >"$T/heapd.conf" <<EOF
socket = $S
backend = host
log_level = debug
chunk_size = 1M
va_size = 256M
collect_timeout_ms = 2000
EOF
check "heapd starts and listens" start_heapd "$T/heapd.conf" "$T/heapd.log"

rank() { # rank HEAP R W [opts] -- CMDS: runs one rank in the background
    heap=$1 r=$2 w=$3; shift 3
    "$R" --socket "$S" --heap "$heap" --rank "$r" --world "$w" "$@" >"$T/$heap.$r.out" 2>"$T/$heap.$r.err" &
    eval "pid_${r}=\$!"
}
waitfiles() { # waitfiles FILE...: until every FILE exists (a rank reached a state); 300 s at most
    for f in "$@"; do
        n=0
        while [ ! -e "$f" ] && [ $n -lt 6000 ]; do sleep 0.05; n=$((n + 1)); done
        [ -e "$f" ] || echo "waitfiles: $f did not appear within 300 s"
    done
}
waitrank() { # waitrank R -> exit code in $rc
    eval "p=\$pid_$1"
    wait "$p"; rc=$?
}

# ---- 1. randomised per-rank free timing: identical offsets --------------------
for pol in coalesce seed; do
    for r in 0 1 2 3; do
        rank rnd$pol $r 4 --policy $pol --chunk 256K --initial 256K --va 64M --seed 7 random 3000
    done
    allok=1
    for r in 0 1 2 3; do waitrank $r; [ $rc = 0 ] || { allok=0; cat "$T/rnd$pol.$r.err"; }; done
    check "random workload, 4 ranks, policy $pol: every rank exits 0" test $allok = 1
    for r in 0 1 2 3; do grep '^a ' "$T/rnd$pol.$r.out" >"$T/rnd$pol.$r.a"; done
    n=$(wc -l <"$T/rnd$pol.0.a")
    same=1
    for r in 1 2 3; do cmp -s "$T/rnd$pol.0.a" "$T/rnd$pol.$r.a" || same=0; done
    check "random workload, policy $pol: $n allocations, offsets identical on all 4 ranks" test $same = 1 -a "$n" -gt 1000
    ncol=$(grep -c '^c ' "$T/rnd$pol.0.out")
    check "random workload, policy $pol: collects happened ($ncol)" test "$ncol" -gt 0
done

# ---- 2. peer writes, growth -----------------------------------------------------
rank peer 0 2 --chunk 1M --initial 1M -- alloc 64K collect write 0 1 0x11 collect check 0 0x22 \
    alloc 512K alloc 1M write 2 1 0x33 collect check 2 0x44 mapped stats
rank peer 1 2 --chunk 1M --initial 1M -- alloc 64K collect write 0 0 0x22 collect check 0 0x11 \
    alloc 512K alloc 1M write 2 0 0x44 collect check 2 0x33 mapped
waitrank 0; r0=$rc; waitrank 1; r1=$rc
check "peer writes: each rank reads what its peer wrote (also in a grown chunk)" test $r0 = 0 -a $r1 = 0
check "growth: the heap grew past its first chunk" grep -q '^m [2-9][0-9]*' "$T/peer.0.out"
g=$(sed -n 's/^s heap .*growths=\([0-9]*\).*/\1/p' "$T/peer.0.out")
check "growth: stats count growths ($g)" test "${g:-0}" -ge 1
check "growth: same offsets on both ranks" sh -c "grep '^a ' $T/peer.0.out > $T/p0; grep '^a ' $T/peer.1.out > $T/p1; cmp -s $T/p0 $T/p1"

# ---- 2b. status page values -------------------------------------------------------
# (stats after flush: a round trip on the same connection, so heapd has taken
# the free batch before the page is read; rank 1 waits for rank 0's files.)
rank sp 0 2 --chunk 1M --initial 1M -- status alloc 4K status free 0 flush stats status touch "$T/sp.a" \
    collect status touch "$T/sp.b" alloc 2M status
rank sp 1 2 --chunk 1M --initial 1M -- waitfile "$T/sp.a" alloc 4K free 0 flush collect waitfile "$T/sp.b" alloc 2M
waitrank 0; r0=$rc; waitrank 1; r1=$rc
check "status page: both ranks ran (exit 0)" test $r0 = 0 -a $r1 = 0
sed -n 's/^p //p' "$T/sp.0.out" >"$T/sp.p"
pv() { sed -n "${1}p" "$T/sp.p" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
check "status page: fresh heap: 1 MiB mapped, nothing live, all free" \
    test "$(pv 1 mapped)" = 1048576 -a "$(pv 1 live)" = 0 -a "$(pv 1 free)" = 1048576 -a "$(pv 1 allocs)" = 0
check "status page: host memory sampled (device_total > 0, free <= total)" \
    sh -c "test $(pv 1 device_total) -gt 0 && test $(pv 1 device_free) -le $(pv 1 device_total)"
check "status page: after an allocation: 4 KiB live and held, 1 allocation" \
    test "$(pv 2 live)" = 4096 -a "$(pv 2 rank_held)" = 4096 -a "$(pv 2 allocs)" = 1
check "status page: after this rank's free: 4 KiB released by this rank, none held" \
    test "$(pv 3 rank_released)" = 4096 -a "$(pv 3 rank_held)" = 0
check "status page: after the collect: nothing live or released, all free, 1 collect" \
    test "$(pv 4 live)" = 0 -a "$(pv 4 released)" = 0 -a "$(pv 4 rank_released)" = 0 -a "$(pv 4 free)" = 1048576 -a "$(pv 4 collects)" = 1
check "status page: after growth: 2 MiB mapped, 1 growth, 2 MiB live" \
    test "$(pv 5 mapped)" = 2097152 -a "$(pv 5 growths)" = 1 -a "$(pv 5 live)" = 2097152
check "status page: every update was published (updates grow)" test "$(pv 5 updates)" -gt "$(pv 1 updates)"

# ---- 3. forced collect from heapctl during a workload ---------------------------
rank fc 0 2 -- alloc 4K touch "$T/fc.0" waitfile "$T/fc.go" alloc 4K alloc 8K stats
rank fc 1 2 -- alloc 4K touch "$T/fc.1" waitfile "$T/fc.go" alloc 4K alloc 8K
waitfiles "$T/fc.0" "$T/fc.1"
"$CTL" --socket "$S" collect fc >"$T/fc.ctl" 2>&1
touch "$T/fc.go"
check "heapctl collect exits 0 and names the allocation number" grep -q '1' "$T/fc.ctl"
waitrank 0; r0=$rc; waitrank 1; r1=$rc
check "forced collect: both ranks complete" test $r0 = 0 -a $r1 = 0
c=$(sed -n 's/^s heap .*collects=\([0-9]*\).*/\1/p' "$T/fc.0.out")
check "forced collect: it ran at allocation 1 on both ranks (collects=$c)" test "${c:-0}" = 1
check "forced collect: offsets identical" sh -c "grep '^a ' $T/fc.0.out > $T/f0; grep '^a ' $T/fc.1.out > $T/f1; cmp -s $T/f0 $T/f1"

for r in 0 1 2; do
    rank fcw $r 3 --chunk 256K --initial 256K --seed 11 random 4000
done
for k in 1 2 3 4 5; do sleep 0.1; "$CTL" --socket "$S" collect fcw >/dev/null 2>&1; done
allok=1
for r in 0 1 2; do waitrank $r; [ $rc = 0 ] || allok=0; done
check "forced collects during a random workload: every rank exits 0" test $allok = 1
check "forced collects during a random workload: offsets identical" sh -c \
    "for r in 0 1 2; do grep '^a ' $T/fcw.\$r.out > $T/w\$r; done; cmp -s $T/w0 $T/w1 && cmp -s $T/w0 $T/w2"

# ---- 4. missing and disconnected ranks -------------------------------------------
rank miss 0 3 --timeout-ms 800 -- alloc 1K
rank miss 1 3 --timeout-ms 800 -- alloc 1K
waitrank 0; r0=$rc; waitrank 1; r1=$rc
check "attach timeout: the waiting ranks fail with a timeout (exit 5)" test $r0 = 5 -a $r1 = 5
check "attach timeout: the error names the missing rank 2" grep -q 'rank(s) 2 never attached' "$T/miss.0.err"

rank ct 0 2 --timeout-ms 800 -- alloc 1K collect
rank ct 1 2 --timeout-ms 800 -- alloc 1K sleep 2500
waitrank 0; r0=$rc; waitrank 1
check "collect timeout: the waiting rank fails with a timeout (exit 5)" test $r0 = 5
check "collect timeout: the error names the missing rank 1" grep -q 'rank(s) 1 never arrived' "$T/ct.0.err"

rank gone 0 2 --timeout-ms 20000 -- alloc 1K touch "$T/gone.0" collect
rank gone 1 2 --timeout-ms 20000 -- alloc 1K touch "$T/gone.1" sleep 30000
waitfiles "$T/gone.0" "$T/gone.1"
start=$(date +%s)
kill -9 "$pid_1"
waitrank 0; r0=$rc; waitrank 1
end=$(date +%s)
check "disconnect during collect: the waiting rank fails at once (exit 6, $((end - start)) s)" test $r0 = 6 -a $((end - start)) -lt 5
check "disconnect during collect: the error names rank 1" grep -q 'rank 1 (pid [0-9]*) disconnected' "$T/gone.0.err"

# ---- 5. asymmetry ----------------------------------------------------------------------
rank asym 0 2 -- alloc 1024 touch "$T/asym.0" waitfile "$T/asym.go"
rank asym 1 2 -- waitfile "$T/asym.0" alloc 2048
waitrank 1; r1=$rc; touch "$T/asym.go"; waitrank 0
check "asymmetry: the second rank gets ERR_ASYMMETRY (exit 4)" test $r1 = 4
check "asymmetry: the message names allocation 0 and both sizes" \
    grep -q 'asymmetric allocation 0 .*2048 bytes.*1024' "$T/asym.1.err"

# The heap is poisoned (issue 31): rank 0 allocated 4K as allocation 1, rank 1
# asks 8K; rank 0's next call (an alloc, a flush of its frees, a collect; a
# collect it waits in) fails too, with the same figures: n, both ranks, both
# sizes. On the request ring and on the socket.
rings() { grep -c 'request ring of' "$T/heapd.log"; }
for tr in ring socket; do
    export HEAPC_TRANSPORT=$tr
    before=$(rings)
    # next call: a flush of a free, then an alloc (both refused)
    rank pa$tr 0 2 -- alloc 1K alloc 4K touch "$T/pa$tr.0" waitfile "$T/pa$tr.go" \
        free 0 try flush alloc 1K
    rank pa$tr 1 2 -- alloc 1K waitfile "$T/pa$tr.0" alloc 8K
    waitrank 1; r1=$rc; touch "$T/pa$tr.go"; waitrank 0; r0=$rc
    fig='n=1 ranks=0,1 sizes=4096,8192'
    want="asymmetry: $fig"
    check "poison ($tr): the later rank gets ERR_ASYMMETRY with n, both ranks and sizes (exit $r1)" \
        sh -c "test $r1 = 4 && grep -qx '$want' '$T/pa$tr.1.err'"
    check "poison ($tr): the earlier rank's free is refused with the same figures" \
        sh -c "grep -q '^e ERR_ASYMMETRY .*poisoned' '$T/pa$tr.0.out' && grep -qx 'x asymmetry $fig' '$T/pa$tr.0.out'"
    check "poison ($tr): the earlier rank's next alloc gets ERR_ASYMMETRY with the same figures (exit $r0)" \
        sh -c "test $r0 = 4 && grep -qx '$want' '$T/pa$tr.0.err'"
    # next call: a collect (rank 0 may already wait in it when rank 1 asks)
    rank pc$tr 0 2 -- alloc 1K alloc 4K touch "$T/pc$tr.0" collect
    rank pc$tr 1 2 -- alloc 1K waitfile "$T/pc$tr.0" alloc 8K
    waitrank 1; r1=$rc; waitrank 0; r0=$rc
    check "poison ($tr): the earlier rank's collect gets ERR_ASYMMETRY with the same figures (exit $r0, $r1)" \
        sh -c "test $r0 = 4 -a $r1 = 4 && grep -qx '$want' '$T/pc$tr.0.err' && grep -qx '$want' '$T/pc$tr.1.err'"
    after=$(rings)
    if [ $tr = ring ]; then
        check "poison (ring): the ranks used request rings" test $((after - before)) = 4
    else
        check "poison (socket): no ring was set up" test $((after - before)) = 0
    fi
    unset HEAPC_TRANSPORT
done

# ---- 6. heapctl ------------------------------------------------------------------------
rank ctl 0 2 -- alloc 3000 alloc 1M free 0 flush stats touch "$T/ctl.0" waitfile "$T/ctl.go"
rank ctl 1 2 -- alloc 3000 alloc 1M touch "$T/ctl.1" waitfile "$T/ctl.go"
waitfiles "$T/ctl.0" "$T/ctl.1"
"$CTL" --socket "$S" heaps >"$T/heaps.txt" 2>&1
check "heapctl heaps lists the heap" grep -q '^ctl' "$T/heaps.txt"
"$CTL" --socket "$S" stats ctl >"$T/stats.txt" 2>&1; rc=$?
check "heapctl stats: exit 0" test $rc = 0
check "heapctl stats: text shows the heap, both ranks and the columns" sh -c \
    "grep -q 'MAPPED' $T/stats.txt && grep -q 'NEXT_SEQ' $T/stats.txt && grep -Eq '^ctl +0 +yes' $T/stats.txt && grep -Eq '^ctl +1 +yes' $T/stats.txt"
"$CTL" --socket "$S" stats ctl --json >"$T/stats.json" 2>&1; rc=$?
check "heapctl stats --json: exit 0" test $rc = 0
if command -v python3 >/dev/null 2>&1; then
    check "heapctl stats --json: valid JSON with the heap's figures" python3 - "$T/stats.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
h = [x for x in d["heaps"] if x["name"] == "ctl"][0]
assert h["world_size"] == 2, h
assert h["mapped"] >= 2 << 20, h
ranks = {r["rank"]: r for r in h["ranks"]}
# rank 0 freed allocation 0 (3000 bytes: a 3 KiB block, the next multiple of
# min_block 512 under the default policy): released but not reclaimed
assert ranks[0]["released_bytes"] == 3072, ranks[0]
assert ranks[1]["released_bytes"] == 0, ranks[1]
assert ranks[0]["live_bytes"] == 1 << 20 and ranks[1]["live_bytes"] == (1 << 20) + 3072, ranks
assert ranks[0]["next_seq"] == 2 and h["clients"] == 2, h
EOF
else
    echo "skipped: python3 not installed (JSON structure check)"
fi
"$CTL" --socket "$S" stats nosuchheap >/dev/null 2>"$T/nosuch.err"; rc=$?
check "heapctl stats of an unknown heap: exit 1 with a message" sh -c "test $rc = 1 && grep -q nosuchheap $T/nosuch.err"
"$CTL" --socket "$S" frobnicate >/dev/null 2>&1; rc=$?
check "heapctl unknown command: exit 2" test $rc = 2
"$CTL" --socket "$T/nothere.sock" stats >/dev/null 2>"$T/noconn.err"; rc=$?
check "heapctl with no heapd: exit 1 naming the socket" sh -c "test $rc = 1 && grep -q nothere.sock $T/noconn.err"
touch "$T/ctl.go"
waitrank 0; waitrank 1

# ---- 6b. attach retried after ERR_TIMEOUT (issue 15 item 8) ---------------------------
# Rank 0 attaches alone and times out; libheapc retries on the same context
# once rank 1 is there: heapd forgot the timed-out claim.
"$R" --socket "$S" --heap retry --rank 0 --world 2 --timeout-ms 300 --no-attach -- \
    try attach touch "$T/retry.t0" waitfile "$T/retry.go" attach alloc 4K >"$T/retry0.out" 2>&1 &
pid_0=$!
i=0; while [ ! -e "$T/retry.t0" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
"$R" --socket "$S" --heap retry --rank 1 --world 2 --timeout-ms 300 --no-attach -- \
    waitfile "$T/retry.go" attach alloc 4K >"$T/retry1.out" 2>&1 &
pid_1=$!
touch "$T/retry.go"
waitrank 0; r0=$rc; waitrank 1; r1=$rc
check "an attach retried after ERR_TIMEOUT succeeds (rank 0: timeout, then attached; exits $r0 $r1)" \
    sh -c "test $r0 = 0 -a $r1 = 0 && grep -q '^e ERR_TIMEOUT' '$T/retry0.out' && grep -q '^attached 0 2' '$T/retry0.out'"

# ---- 7. shutdown -------------------------------------------------------------------------
kill -TERM "$hpid"; wait "$hpid"; rc=$?
hpid=
check "heapd stops on SIGTERM with exit 0" test $rc = 0
check "heapd removed its socket" test ! -e "$S"
if grep -q 'invariant broken' "$T/heapd.log"; then bad "allocator invariants held in heapd"; else ok "allocator invariants held in heapd"; fi

if [ $fails != 0 ]; then
    echo "--- heapd log (tail)"; tail -30 "$T/heapd.log"
fi
echo "it_heapd: $fails failure(s)"
[ $fails = 0 ]
