#!/bin/sh
# it_persist_mn.sh - a re-attach on one node of a heap that spans nodes (issue
# 29): a real redis-server on a loopback port (tests/redis_helper.sh), 3
# heapd nodes n0..n2 (host backend, signed store messages), 2 ranks per node
# (tests/prog_resume.c, --local-size 2, world 6), running one seeded workload
# of named allocations, frees and collects (no commit markers: they do not
# cross nodes). Node n1's two ranks are killed with SIGKILL mid-run; the
# other nodes' ranks wait (their collectives fail with ERR_PEER_GONE or time
# out while n1's ranks are gone, and they retry: --wait-peers); n1's ranks
# restart with --resume and re-attach on n1, check their live sets and
# patterns against their logs, and every rank goes on. Checked: every rank
# ends the workload (exit 0), every allocation number has the same offset,
# size and name on all 6 ranks (before and after the restart), and the ranks
# end holding the same blocks; n1's heap stayed detached while its ranks
# were gone; the nodes stop cleanly. Run by tests/run.sh.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
P=$BUILD/tests/prog_resume
CTL=$BUILD/heapctl
. "$SRC/tests/redis_helper.sh"
if ! redis_available; then
    echo "skipped: redis-server not installed (needs redis-server and redis-cli)"
    exit 0
fi
. "$SRC/tests/lib.sh"
lib_tmpdir pmn
hp_0= hp_1= hp_2= rpids= opids=
lib_on_exit 'lib_kill rpids opids hp_0 hp_1 hp_2; redis_stop'
if ! redis_start; then
    echo "FAIL could not start redis-server on a free loopback port"; exit 1
fi
(umask 077; echo "it-persist-mn-cluster-key-$$-0123456789" >"$T/store.key")
for n in 0 1 2; do
    cat >"$T/n$n.conf" <<EOF
socket = $T/n$n.sock
backend = host
log_level = info
chunk_size = 64K
va_size = 64M
collect_timeout_ms = 3000
max_persist = 600
store = $REDIS_URL
store_key = $T/store.key
node = n$n
EOF
    S=$T/n$n.sock start_heapd "$T/n$n.conf" "$T/n$n.log"
    eval "hp_$n=\$hpid"
done
check "redis-server and 3 heapd nodes listen" test -S "$T/n0.sock" -a -S "$T/n1.sock" -a -S "$T/n2.sock"

SEED=17 OPS=1500 H=mn
# rank R [ARGS...]: rank R of heap mn on node R/2 (exec: run it with &, its pid is the rank's)
rank() {
    _r=$1; shift
    exec "$P" --socket "$T/n$((_r / 2)).sock" --heap $H --rank "$_r" --world 6 --local-size 2 --job j1 --chunk 64K --va 64M \
        --persist 120 --seed $SEED --ops $OPS --commit-every 0 --pace-us 500 --wait-peers "$@"
}
for r in 0 1 4 5; do rank $r >"$T/run.$r" 2>"$T/run.$r.err" & opids="$opids $!"; done
for r in 2 3; do rank $r >"$T/run.$r" 2>"$T/run.$r.err" & rpids="$rpids $!"; done
lines_ge() { [ "$(wc -l <"$1" 2>/dev/null || echo 0)" -ge "$2" ]; }
within 120 lines_ge "$T/run.2" 400
lib_kill rpids
rpids=
echo "node n1's ranks killed: rank 2 at line $(wc -l <"$T/run.2") ($(tail -n 1 "$T/run.2" | cut -c1-20)), rank 3 at line $(wc -l <"$T/run.3") ($(tail -n 1 "$T/run.3" | cut -c1-20))"
hclients() {
    "$CTL" --socket "$T/n1.sock" --json heaps 2>/dev/null |
        sed -n "s/.*{\"name\": \"$H\", \"world_size\": [0-9]*, \"clients\": \([0-9]*\).*/\1/p"
}
detached() { [ "$(hclients)" = 0 ]; }
check "the heap stays on n1 (detached) while its ranks are gone" within 20 detached
# blocked: the log does not grow for 0.3 s (a collective waiting for n1's ranks)
stalled() { _a=$(wc -l <"$1"); sleep 0.3; [ "$_a" = "$(wc -l <"$1")" ] && ! grep -q '^d' "$1"; }
for r in 0 1 4 5; do within 30 stalled "$T/run.$r"; done
alive=0
for p in $opids; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
check "the other nodes' ranks wait meanwhile ($alive of 4 running, blocked at: $(for r in 0 1 4 5; do tail -n 1 "$T/run.$r" | cut -c1-12; done | tr '\n' ' '))" test $alive = 4
for r in 2 3; do cp "$T/run.$r" "$T/log.$r"; rank $r --resume "$T/log.$r" >"$T/res.$r" 2>"$T/res.$r.err" & rpids="$rpids $!"; done
rcs=
for p in $opids $rpids; do lib_wait_pid "$p" 180; rcs="$rcs $rc"; done
opids= rpids=
# The ranks' errors (E CODE MESSAGE, e WHAT) go into the check's line, which
# tests/run.sh repeats at the end of a failed run.
errs=
for f in run.0 run.1 run.4 run.5 res.2 res.3; do
    if grep -q '^E\|^e' "$T/$f" "$T/$f.err" 2>/dev/null; then
        echo "--- $f:"; grep -h '^E\|^e' "$T/$f" "$T/$f.err" | head -3
        errs="$errs; $f: $(grep -h '^E\|^e' "$T/$f" "$T/$f.err" | head -1 | cut -c1-160)"
    elif [ "$rcs" != " 0 0 0 0 0 0" ] && [ -s "$T/$f" ]; then errs="$errs; $f ends at '$(tail -n 1 "$T/$f" | cut -c1-24)'"; fi
done
check "every rank ends the workload (exit$rcs: ranks 0 1 4 5, then n1's 2 3$errs)" test "$rcs" = " 0 0 0 0 0 0"
check "n1's ranks re-attached ($(grep -h '^s' "$T/res.2" "$T/res.3" | tr '\n' ' ')) and verified $(grep -c '^v' "$T/res.2") blocks of rank 2 bit for bit" \
    sh -c "grep -q '^s [0-9]* [0-9]* 1\$' '$T/res.2' && grep -q '^s [0-9]* [0-9]* 1\$' '$T/res.3'"
cat "$T"/run.* "$T"/res.[23] | grep '^a ' | cut -d' ' -f1-5 | sort -u >"$T/all.a"
n=$(cut -d' ' -f2 "$T/all.a" | sort -u | wc -l)
check "every allocation number has one offset, size and name on all 6 ranks ($n allocations)" \
    test "$(wc -l <"$T/all.a")" = "$n" -a "$n" -gt 0
for r in 0 1 4 5; do grep '^L' "$T/run.$r" >"$T/L.$r"; done
for r in 2 3; do grep '^L' "$T/res.$r" >"$T/L.$r"; done
same=1
for r in 1 2 3 4 5; do cmp -s "$T/L.0" "$T/L.$r" || same=0; done
check "the 6 ranks end holding the same $(wc -l <"$T/L.0") blocks" test $same = 1 -a -s "$T/L.0"
for n in 0 1 2; do
    eval "p=\$hp_$n"
    kill -TERM "$p"; lib_wait_pid "$p" 20; eval "hp_$n="
    check "node n$n stops cleanly (exit $rc)" test $rc = 0
    clean_log "$T/n$n.log"
done
echo "it_persist_mn: $passes passed, $fails failure(s)"
[ $fails = 0 ]
