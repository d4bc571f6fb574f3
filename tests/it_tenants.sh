#!/bin/sh
# it_tenants.sh - tenants across nodes (issue 15 item 2): a real redis-server
# on a free loopback port, 3 heapd nodes n0..n2 (host backend, socket mode
# 0666) and rank processes of two uids (root and nobody, through setpriv).
# Run by tests/run.sh.
#
# A victim heap "v" (2 ranks, job j, HEAPC_JOB_SECRET set) has rank 0 on n0
# and rank 1 on n1. On n2, with the same heap name, job and parameters:
#   - nobody (a second uid, no secret) attaches as rank 1 and collects: it
#     must not join the victim's collect (it times out alone), and nobody's
#     forced collect on n2 must not reach n0 or n1;
#   - root with a different secret does the same: it must time out too;
# then the victim's real rank 1 collects: the victim's collect completes and
# its next allocation has the same offset on both ranks; Redis holds no key
# or field with the secret in clear. Last, heap "w" of one tenant (same uid,
# same secret) whose rank 1 attaches on n1 and on n2: the collect fails on
# every node naming both nodes.
# shellcheck disable=SC2086
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/redis_helper.sh"
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null 2>&1; then
    echo "skipped: needs root and setpriv to run clients as a second uid"
    exit 0
fi
if ! redis_available; then
    echo "skipped: redis-server not installed (needs redis-server and redis-cli)"
    exit 0
fi
. "$SRC/tests/lib.sh"
lib_tmpdir ten
chmod 755 "$T"
mkdir "$T/x" && chmod 1777 "$T/x" # files nobody's ranks touch
cp "$BUILD/tests/prog_rank" "$BUILD/heapctl" "$T/"
R=$T/prog_rank
CTL=$T/heapctl
NODES="0 1 2"
pids=""
hp_0=; hp_1=; hp_2=
lib_on_exit 'lib_kill pids hp_0 hp_1 hp_2; redis_stop'
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }


exited() { ! kill -0 "$1" 2>/dev/null; }

redis_start || { echo "FAIL could not start redis-server"; exit 1; }
for n in $NODES; do
    cat >"$T/n$n.conf" <<EOF
socket = $T/n$n.sock
socket_mode = 0666
backend = host
log_level = debug
chunk_size = 1M
va_size = 64M
store = redis://127.0.0.1:$REDIS_PORT
node = n$n
EOF
    "$BUILD/heapd" --config "$T/n$n.conf" 2>"$T/n$n.log" &
    eval "hp_$n=\$!"
done
subscribed() { [ "$(rcli PUBSUB NUMSUB heapd:force | sed -n 2p)" = 3 ]; }
check "3 heapd nodes listen and subscribe to the store" within 20 subscribed

SECRET=victim-secret-4f1c9a
# vrank R NODE CMDS...: rank R of the victim heap on node NODE (root, secret).
vrank() {
    r=$1 n=$2; shift 2
    HEAPC_JOB_SECRET=$SECRET "$R" --socket "$T/n$n.sock" --heap v --rank "$r" --world 2 --local-size 1 --job j \
        --timeout-ms 30000 -- "$@" >"$T/v$r.out" 2>"$T/v$r.err" &
    pids="$pids $!"
}
# arank NAME [env...] -- CMDS: an attacker's rank 1 of "v" on n2.
vrank 0 0 alloc 64K touch "$T/v0.ready" waitfile "$T/go0" collect alloc 64K touch "$T/v0.done" waitfile "$T/end"
v0=$!
vrank 1 1 alloc 64K touch "$T/v1.ready" waitfile "$T/go1" collect alloc 64K touch "$T/v1.done" waitfile "$T/end"
v1=$!
check "victim ranks 0 (n0) and 1 (n1) attach and allocate" \
    within 20 test -e "$T/v0.ready" -a -e "$T/v1.ready"
touch "$T/go0" # rank 0 collects and waits for rank 1

# A second uid on a third node, no secret: same heap, job, parameters, rank 1.
as_nobody "$R" --socket "$T/n2.sock" --heap v --rank 1 --world 2 --local-size 1 --job j --timeout-ms 1500 \
    -- alloc 64K try collect >"$T/a1.out" 2>"$T/a1.err" &
a1=$!; pids="$pids $a1"
within 30 exited $a1
check "another uid's rank 1 on n2 does not join the victim's collect (its collect times out alone)" \
    sh -c "grep -q '^e .*TIMEOUT' '$T/a1.out' && ! grep -q '^c ' '$T/a1.out'"
# The same uid with another secret.
HEAPC_JOB_SECRET=guess "$R" --socket "$T/n2.sock" --heap v --rank 1 --world 2 --local-size 1 --job j \
    --timeout-ms 1500 -- alloc 64K try collect >"$T/a2.out" 2>"$T/a2.err" &
a2=$!; pids="$pids $a2"
within 30 exited $a2
check "a different job secret on n2 does not join the victim's collect (it times out alone)" \
    sh -c "grep -q '^e .*TIMEOUT' '$T/a2.out' && ! grep -q '^c ' '$T/a2.out'"
# nobody's forced collect of its own "v" on n2 must not reach n0 or n1.
as_nobody "$R" --socket "$T/n2.sock" --heap v --rank 1 --world 2 --local-size 1 --job j --timeout-ms 1500 \
    -- alloc 64K touch "$T/x/a3.ready" waitfile "$T/x/a3.end" >"$T/a3.out" 2>"$T/a3.err" &
a3=$!; pids="$pids $a3"
within 20 test -e "$T/x/a3.ready"
as_nobody "$CTL" --socket "$T/n2.sock" --timeout 10 collect v >"$T/force.out" 2>&1
check "nobody's forced collect of its own \"v\" is requested on n2" \
    within 10 grep -q 'heap "v": forced collect requested' "$T/n2.log"
touch "$T/x/a3.end"
within 20 exited $a3
check "nobody's forced collect on n2 reaches neither n0 nor n1" \
    sh -c "! grep -q 'heap \"v\": forced collect' '$T/n0.log' && ! grep -q 'heap \"v\": forced collect' '$T/n1.log'"

# The victim's real rank 1: the collect completes, offsets stay symmetric.
touch "$T/go1"
check "the victim's collect completes on both of its nodes" \
    within 30 test -e "$T/v0.done" -a -e "$T/v1.done"
o0=$(sed -n 's/^a 1 //p' "$T/v0.out"); o1=$(sed -n 's/^a 1 //p' "$T/v1.out")
check "the victim's next allocation has one offset on both ranks ($o0, $o1)" test -n "$o0" -a "$o0" = "$o1"
rcli --scan --pattern '*' >"$T/keys.txt"
for k in $(cat "$T/keys.txt"); do
    [ "$(rcli TYPE "$k")" = hash ] && rcli HGETALL "$k"
done >"$T/fields.txt"
check "the job secret is not in Redis in clear ($(wc -l <"$T/keys.txt") keys)" \
    sh -c "! grep -q '$SECRET' '$T/keys.txt' '$T/fields.txt'"
touch "$T/end"
wait $v0 $v1

# One tenant, rank 1 attached on two nodes: an error naming both.
wrank() { # wrank R NODE TAG CMDS...
    r=$1 n=$2 tag=$3; shift 3
    HEAPC_JOB_SECRET=$SECRET "$R" --socket "$T/n$n.sock" --heap w --rank "$r" --world 2 --local-size 1 --job j \
        --timeout-ms 20000 -- "$@" >"$T/w$tag.out" 2>"$T/w$tag.err" &
    pids="$pids $!"
}
wrank 1 1 b alloc 64K try collect
wb=$!
# n1's contribution is in Redis before n2's.
n1_in() { for k in $(rcli --scan --pattern 'heapd:w:*:s'); do rcli HGET "$k" nodes | grep -q n1 && return 0; done; return 1; }
within 20 n1_in
wrank 1 2 c alloc 64K try collect
wc_=$!
within 30 exited $wc_
check "rank 1 claimed by n1 and n2: n2's collect fails naming both nodes" \
    grep -q "^e .*rank 1 .*n1.*n2" "$T/wc.out"
within 30 exited $wb
check "... and so does n1's, the same error" grep -q "^e .*rank 1 .*n1.*n2" "$T/wb.out"

# On one node, a rank with another secret than the heap's: ERR_MISMATCH.
HEAPC_JOB_SECRET=$SECRET "$R" --socket "$T/n0.sock" --heap s --rank 0 --world 2 --timeout-ms 20000 \
    -- touch "$T/s0.started" >"$T/s0.out" 2>&1 &
s0=$!; pids="$pids $s0"
heap_s() { "$CTL" --socket "$T/n0.sock" heaps | grep -q '^s '; }
within 20 heap_s
HEAPC_JOB_SECRET=other "$R" --socket "$T/n0.sock" --heap s --rank 1 --world 2 --timeout-ms 20000 \
    >"$T/s1.out" 2>&1
rc=$?
check "a rank with another job secret on the same node: ERR_MISMATCH (exit $rc)" \
    sh -c "test $rc = 9 && grep -q 'job secret (HEAPC_JOB_SECRET) differs' '$T/s1.out'"
kill $s0 2>/dev/null; wait $s0 2>/dev/null

for n in $NODES; do
    eval "p=\$hp_$n"
    kill -TERM "$p"; wait "$p"; rc=$?
    eval "hp_$n="
    check "heapd n$n stops cleanly" test $rc = 0
done
echo "it_tenants: $fails failure(s)"
[ $fails = 0 ]
