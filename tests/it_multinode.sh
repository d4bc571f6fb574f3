#!/bin/sh
# it_multinode.sh - integration tests of heaps that span nodes: a real
# redis-server on a free loopback port, 4 heapd instances as nodes n0..n3
# (`store = redis://127.0.0.1:PORT`, `node = nN`, host backend) and 2 rank
# processes per node (tests/prog_rank.c, --local-size 2 --job ...; ranks 2n
# and 2n+1 attach to node n). Run by tests/run.sh.
#
# Covers: randomised per-rank free timing across nodes gives every rank on
# every node the same offsets and the same collects (`a` and `c` lines), both
# policies; the store's keys are namespaced per heap and job and all expire; a
# forged result published to a waiting node's channel is dropped (every node
# has store_key: issue 33 item 1) and the offsets stay identical; a
# forced collect (heapctl on one node) takes effect at the same allocation on
# every node, also during a random workload; a rank killed mid-collect is
# named on every node at once; a node or a rank that never arrives is named
# after the timeout on every waiting rank of every node; a world size that
# differs between nodes; Redis killed mid-collect gives ERR_STORE naming its
# address at once; after a restart on the same port the same heap and a new
# job collect again; an attach with local_size < world_size on a heapd with no
# store is refused. Redis comes from tests/redis_helper.sh; everything started
# here is stopped by the trap. About 15 s on 2 idle cores.
# shellcheck disable=SC2086,SC2154 # word lists on purpose; pid_R set through eval
set -u
BUILD=${BUILD:-build}
R=$BUILD/tests/prog_rank
CTL=$BUILD/heapctl

NODES="0 1 2 3"
ALL="0 1 2 3 4 5 6 7" # ranks; rank r attaches to node r/2
W=8

SRC=${HEAPD_SRC:-$(pwd)}
if [ ! -f "$SRC/tests/redis_helper.sh" ]; then
    echo "FAIL $SRC/tests/redis_helper.sh is missing (set HEAPD_SRC to the source tree)"
    exit 1
fi
# redis_available, redis_start (REDIS_PORT, REDIS_PID), redis_kill, redis_restart, redis_stop
. "$SRC/tests/redis_helper.sh"
if ! redis_available; then
    echo "skipped: redis-server not installed (needs redis-server and redis-cli)"
    exit 0
fi

. "$SRC/tests/lib.sh"
lib_tmpdir mn
fails=0
nspid=
pids=""   # rank processes and FIFO holders
hp_0= hp_1= hp_2= hp_3=
lib_on_exit 'lib_kill pids hp_0 hp_1 hp_2 hp_3 nspid; redis_stop'
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }

if ! redis_start; then
    echo "FAIL could not start redis-server on a free loopback port"; exit 1
fi
rport=$REDIS_PORT
ok "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$rport (pid $REDIS_PID)"

# ---- 4 heapd nodes ---------------------------------------------------------------
# The cluster key (issue 33 item 1): every node signs the results it publishes
# and drops unsigned ones, so every scenario below runs with signed messages.
(umask 077; echo "it-multinode-cluster-key-$$-0123456789" >"$T/store.key")
for n in $NODES; do
    cat >"$T/n$n.conf" <<EOF
socket = $T/n$n.sock
backend = host
log_level = debug
chunk_size = 1M
va_size = 256M
collect_timeout_ms = 5000
store = redis://127.0.0.1:$rport
store_key = $T/store.key
node = n$n
EOF
    S=$T/n$n.sock start_heapd "$T/n$n.conf" "$T/n$n.log"
    eval "hp_$n=\$hpid"
done
up=0
for n in $NODES; do [ -S "$T/n$n.sock" ] && up=$((up + 1)); done
check "4 heapd nodes start and listen" test $up = 4
# Each node subscribes to heapd:force and heapd:node:NAME at start.
i=0
while [ $i -lt 100 ]; do
    nsub=$(rcli PUBSUB NUMSUB heapd:force 2>/dev/null | sed -n 2p)
    [ "${nsub:-0}" = 4 ] && break
    sleep 0.05; i=$((i + 1))
done
nch=$(rcli PUBSUB CHANNELS 'heapd:node:*' 2>/dev/null | grep -c '^heapd:node:n[0-3]$')
check "every node subscribed: heapd:force has $nsub subscribers, $nch heapd:node:* channels" \
    test "${nsub:-0}" = 4 -a "$nch" = 4

# ---- helpers for ranks -------------------------------------------------------------
JOB=j1
rank() { # rank HEAP R [opts] -- CMDS: rank R of an 8-rank heap on node R/2, in the background
    heap=$1 r=$2; shift 2
    "$R" --socket "$T/n$((r / 2)).sock" --heap "$heap" --rank "$r" --world $W --local-size 2 --job "$JOB" \
        "$@" >"$T/$heap.$r.out" 2>"$T/$heap.$r.err" &
    eval "pid_$r=\$!"
    pids="$pids $!"
}
# frank HEAP R [opts]: rank R reading its commands from the FIFO $T/HEAP.R.in
# (send with `to HEAP R CMDS`); a holder keeps the FIFO open read-write, so a
# write never blocks and the rank sees end of input (and exits) when the
# holder is killed (`hang_up HEAP R`).
frank() {
    heap=$1 r=$2; shift 2
    mkfifo "$T/$heap.$r.in"
    sleep 120 <>"$T/$heap.$r.in" &
    eval "hold_$r=\$!"
    pids="$pids $!"
    "$R" --socket "$T/n$((r / 2)).sock" --heap "$heap" --rank "$r" --world $W --local-size 2 --job "$JOB" \
        "$@" <"$T/$heap.$r.in" >"$T/$heap.$r.out" 2>"$T/$heap.$r.err" &
    eval "pid_$r=\$!"
    pids="$pids $!"
}
to() { heap=$1 r=$2; shift 2; echo "$*" >"$T/$heap.$r.in"; }
hang_up() { eval "kill \$hold_$2; wait \$hold_$2" 2>/dev/null; }
waitrank() { # waitrank R -> exit code in $rc
    eval "p=\$pid_$1"
    wait "$p"; rc=$?
}
# waitout HEAP PATTERN SECONDS RANKS...: until every rank's output has a line
# matching PATTERN; 0 if they all did in time.
waitout() {
    heap=$1 pat=$2 secs=$3; shift 3
    j=0
    while [ $j -lt $((secs * 20)) ]; do
        all=1
        for r in "$@"; do grep -q "$pat" "$T/$heap.$r.out" 2>/dev/null || { all=0; break; }; done
        [ $all = 1 ] && return 0
        sleep 0.05; j=$((j + 1))
    done
    return 1
}
# same HEAP PREFIX RANKS...: the lines starting with PREFIX are identical on every rank
same() {
    heap=$1 pfx=$2; shift 2
    first=
    for r in "$@"; do
        grep "^$pfx " "$T/$heap.$r.out" >"$T/$heap.$r.$pfx"
        if [ -z "$first" ]; then first=$r; else cmp -s "$T/$heap.$first.$pfx" "$T/$heap.$r.$pfx" || return 1; fi
    done
}

# ---- 1. randomised per-rank free timing across nodes: identical offsets and collects --
for pol in default seed; do
    h=rnd$pol
    for r in $ALL; do
        rank $h $r --policy $pol --chunk 256K --initial 256K --va 64M --seed 7 random 3000
    done
    allok=1
    for r in $ALL; do waitrank $r; [ $rc = 0 ] || { allok=0; echo "rank $r: exit $rc: $(cat "$T/$h.$r.err")"; }; done
    check "random workload, policy $pol, 4 nodes x 2 ranks: every rank exits 0" test $allok = 1
    n=$(grep -c '^a ' "$T/$h.0.out")
    sa=0; same $h a $ALL && sa=1
    check "random workload, policy $pol: $n allocations, offsets identical on all 8 ranks of all 4 nodes" \
        test $sa = 1 -a "$n" -gt 1000
    ncol=$(grep -c '^c ' "$T/$h.0.out")
    blocks=$(awk '/^c /{s += $3} END {print s + 0}' "$T/$h.0.out")
    sc=0; same $h c $ALL && sc=1
    check "random workload, policy $pol: $ncol collects reclaimed the same blocks on every rank of every node ($blocks blocks)" \
        test $sc = 1 -a "$ncol" -gt 0 -a "$blocks" -gt 0
done

# ---- 2. the store's keys: namespaced per heap and job, each with a TTL --------------
rcli --scan --pattern 'heapd:*' >"$T/keys" 2>/dev/null
nk=$(wc -l <"$T/keys")
# The incarnation is the job, a fingerprint of the heap parameters, the
# owner's uid and the job secret's hash ("-": none; issue 15).
# Issue 27: the default policy's heap also has its reclaim rounds' keys
# (incarnation INC#reclaim; the seed policy collects only).
nrnd=$(grep -c "^heapd:rnd\\(default\\|seed\\):j1~[0-9a-f]\\{8\\}~u$(id -u)~-\\(#reclaim\\)\\{0,1\\}:c[0-9]*:s\$" "$T/keys")
nrc=$(grep -c "^heapd:rnddefault:.*#reclaim:c[0-9]*:s\$" "$T/keys")
check "store keys: $nk keys, those of the two workloads named heapd:HEAP:JOB~PARAMS~uUID~SECRET[#reclaim]:cN:s ($nrnd; $nrc of reclaim rounds)" \
    test "$nrnd" -gt 0 -a "$nrnd" = "$nk" -a "$nrc" -gt 0
check "store keys: no rank bitmap (:r) left once every collect completed" sh -c "! grep -q ':r\$' $T/keys"
nottl=0; maxttl=0
while read -r k; do
    t=$(rcli TTL "$k")
    # -2: expired meanwhile (fine); -1: no TTL
    if [ "$t" = -1 ]; then nottl=$((nottl + 1)); elif [ "$t" -gt "$maxttl" ]; then maxttl=$t; fi
done <"$T/keys"
# heapd sets 10x collect_timeout_ms, at least 60 s: longer than this test, so
# the keys are not waited for; that each has a TTL is what bounds Redis.
check "store keys: every key has a TTL (none without; longest ${maxttl} s, expected <= 60)" \
    test $nottl = 0 -a "$maxttl" -gt 0 -a "$maxttl" -le 60

# ---- 2b. a forged collect result on a node channel (issue 33 item 1) ----------------
# Ranks 0..5 (nodes n0..n2) free blocks 0 and 1 and collect; n3's ranks free
# only block 0 and collect later. While n0 waits in the store, a program that
# can reach Redis publishes a result holding both blocks to heapd:node:n0 (in
# the format the script used to publish, and with a made-up MAC). Accepted, it
# would make n0 reclaim block 1, which n3's ranks still hold, and the next
# allocation would differ between nodes. n0 drops it (warn) and every rank
# gets the same collect and the same next offset.
for r in $ALL; do
    if [ $r -ge 6 ]; then rank fg $r --timeout-ms 15000 -- alloc 4K alloc 4K free 0 flush sleep 1500 collect alloc 4K
    else rank fg $r --timeout-ms 15000 -- alloc 4K alloc 4K free 0 free 1 flush collect alloc 4K; fi
done
be64() { i=56; while [ $i -ge 0 ]; do printf "\\$(printf %03o $((($1 >> i) & 255)))"; i=$((i - 8)); done; }
fk=; i=0
while [ $i -lt 200 ]; do   # until n0 waits in the store (10 s at most)
    fk=$(rcli --scan --pattern 'heapd:fg:*:s' 2>/dev/null | head -1)
    [ -n "$fk" ] && rcli HGET "$fk" nodes 2>/dev/null | grep -qw n0 && break
    sleep 0.05; i=$((i + 1))
done
o0=$(sed -n 's/^a 0 //p' "$T/fg.0.out") o1=$(sed -n 's/^a 1 //p' "$T/fg.0.out")
fp=${fk%:s}
{ printf 'R%s\n' "$fp"; be64 "${o0:-0}"; be64 "${o1:-0}"; } >"$T/forged1"
{ printf 'R%s\n0123456789abcdef0123456789abcdef01234567' "$fp"; be64 "${o0:-0}"; be64 "${o1:-0}"; } >"$T/forged2"
nrecv=0
for f in forged1 forged2; do
    n=$(rcli -x PUBLISH heapd:node:n0 <"$T/$f" 2>/dev/null); nrecv=$((nrecv + ${n:-0}))
done
check "forged results published to heapd:node:n0 while n0 waits in collect $fp (received by $nrecv)" \
    test -n "$fk" -a "$nrecv" = 2
allok=1
for r in $ALL; do waitrank $r; [ $rc = 0 ] || { allok=0; echo "rank $r: exit $rc: $(cat "$T/fg.$r.err")"; }; done
check "forged results: every rank of every node exits 0" test $allok = 1
sfg=0; same fg c $ALL && same fg a $ALL && sfg=1
check "forged results ignored: the collect and the next offsets are identical on all 8 ranks ($(grep '^c ' "$T/fg.0.out"))" \
    test $sfg = 1
check "forged results: n0's log says it dropped them, at warn" \
    grep -q 'warn: store: dropped .* message(s) on heapd:node:n0: .*MAC' "$T/n0.log"

# ---- 3. forced collect from heapctl on one node ------------------------------------
for r in $ALL; do rank fc $r -- alloc 4K sleep 800 alloc 4K alloc 8K stats; done
waitout fc '^a 0 ' 10 $ALL
"$CTL" --socket "$T/n1.sock" collect fc >"$T/fc.ctl" 2>&1; crc=$?
# Every rank made allocation 0: the agreed point is past it and past the
# allocation every node may already be trying (1): allocation 2.
check "heapctl collect on node n1: exit 0, agreed at allocation 2 ($(cat "$T/fc.ctl"))" \
    sh -c "test $crc = 0 && grep -q 'allocation 2\$' $T/fc.ctl"
allok=1; cols=""
for r in $ALL; do
    waitrank $r; [ $rc = 0 ] || allok=0
    cols="$cols $(sed -n 's/^s heap .*collects=\([0-9]*\).*/\1/p' "$T/fc.$r.out")"
done
check "forced collect: every rank of every node completes" test $allok = 1
check "forced collect: it ran once, on every rank of every node (collects:$cols)" \
    test "${cols# }" = "1 1 1 1 1 1 1 1"
check "forced collect: offsets identical on all 8 ranks" same fc a $ALL
agreed=0
for n in $NODES; do grep -q 'heap "fc": forced collect agreed by every node at allocation 2$' "$T/n$n.log" && agreed=$((agreed + 1)); done
check "forced collect: every node's log says it was agreed at allocation 2 ($agreed of 4)" test $agreed = 4

# During a random workload: several requests from node n1 while the ranks
# allocate, free and collect. Each node must run exactly the same collects,
# whether the agreement reaches it before or after its own collect (or the
# allocator's request for one) at the agreed allocation number.
for r in $ALL; do
    rank fcw $r --timeout-ms 2000 --chunk 256K --initial 256K --va 64M --seed 11 random 4000
done
waitout fcw '^a 20 ' 10 $ALL
for k in 1 2 3 4 5 6; do "$CTL" --socket "$T/n1.sock" collect fcw >>"$T/fcw.ctl" 2>&1; sleep 0.03; done
allok=1
for r in $ALL; do waitrank $r; [ $rc = 0 ] || { allok=0; echo "rank $r: exit $rc: $(cat "$T/fcw.$r.err")"; }; done
nf=$(grep -c 'takes effect at allocation' "$T/fcw.ctl")
check "forced collects during a random workload ($nf agreed): every rank of every node exits 0" test $allok = 1
sac=0; same fcw a $ALL && same fcw c $ALL && sac=1
check "forced collects during a random workload: offsets and collects identical on all 8 ranks" test $sac = 1
agreed=""
for n in $NODES; do agreed="$agreed $(grep -c 'heap "fcw": forced collect agreed' "$T/n$n.log")"; done
check "forced collects during a random workload: every node agreed to each ($agreed)" \
    test "${agreed# }" = "$nf $nf $nf $nf"

# ---- 4. a rank killed mid-collect: named on every node at once ------------------
for r in $ALL; do
    if [ $r = 3 ]; then rank gone $r --timeout-ms 20000 -- alloc 1K sleep 30000
    else rank gone $r --timeout-ms 20000 -- alloc 1K collect; fi
done
waitout gone '^a 0 ' 10 $ALL
sleep 0.3
p3=$pid_3
t0=$(now_ms)
kill -9 "$p3"
allok=1; named=1
for r in 0 1 2 4 5 6 7; do
    waitrank $r; [ $rc = 6 ] || allok=0
    grep -q "ERR_PEER_GONE: .*rank 3 (pid $p3) disconnected" "$T/gone.$r.err" || named=0
done
dt=$(($(now_ms) - t0))
waitrank 3
check "rank 3 killed mid-collect: the 7 others, on all 4 nodes, fail with ERR_PEER_GONE (exit 6) within $dt ms" \
    test $allok = 1 -a $dt -lt 3000
check "rank 3 killed mid-collect: every node's error names rank 3 and its pid" test $named = 1

# ---- 5. a node and a rank that never arrive: timeout naming them everywhere -------
# heap miss: node n3's ranks (6, 7) never start. heap miss1: rank 7 attaches
# but never collects (its node-mate 6 does).
# 6 s: long enough to see the waiting collect's keys on a loaded, sanitized run
for r in 0 1 2 3 4 5; do rank miss $r --timeout-ms 6000 -- alloc 1K collect; done
waitout miss '^a 0 ' 10 0 1 2 3 4 5
t0=$(now_ms)
pids_miss="$pid_0 $pid_1 $pid_2 $pid_3 $pid_4 $pid_5"
for r in $ALL; do
    if [ $r = 7 ]; then rank miss1 $r --timeout-ms 1500 -- alloc 1K sleep 5000
    else rank miss1 $r --timeout-ms 1500 -- alloc 1K collect; fi
done
pids_miss1="$pid_0 $pid_1 $pid_2 $pid_3 $pid_4 $pid_5 $pid_6 $pid_7"
# While the collects wait: their keys (state hash and rank bitmap) have a TTL.
i=0
while [ $i -lt 300 ]; do   # until both keys exist (the collect started); 30 s at most
    rcli --scan --pattern 'heapd:miss:j1~*' >"$T/mkeys" 2>/dev/null
    grep -q ':s$' "$T/mkeys" && grep -q ':r$' "$T/mkeys" && break
    sleep 0.1; i=$((i + 1))
done
mttl=1
while read -r k; do t=$(rcli TTL "$k"); [ "$t" -gt 0 ] || mttl=0; done <"$T/mkeys"
check "a waiting collect's keys ($(tr '\n' ' ' <"$T/mkeys")) exist, each with a TTL" \
    sh -c "test $mttl = 1 && grep -q ':s\$' $T/mkeys && grep -q ':r\$' $T/mkeys"
allok=1; named=1; r=0
for p in $pids_miss; do
    wait "$p"; [ $? = 5 ] || allok=0
    grep -q 'ERR_TIMEOUT: .*rank(s) 6, 7 never arrived' "$T/miss.$r.err" || named=0
    r=$((r + 1))
done
dt=$(($(now_ms) - t0))
check "node n3 never arrives: the 6 ranks of n0..n2 fail with ERR_TIMEOUT (exit 5) after the 6000 ms timeout ($dt ms)" \
    test $allok = 1 -a $dt -ge 3000   # the shell saw the allocations after the collect began
check "node n3 never arrives: every waiting rank's error names ranks 6, 7" test $named = 1
allok=1; named=1; r=0
for p in $pids_miss1; do
    wait "$p"; rc=$?
    if [ $r != 7 ]; then
        [ $rc = 5 ] || allok=0
        grep -Eq 'ERR_TIMEOUT: .*rank\(s\) ([0-9]+, )*7 never arrived' "$T/miss1.$r.err" || named=0
    fi
    r=$((r + 1))
done
check "rank 7 never collects: ranks 0..6 on all 4 nodes fail with ERR_TIMEOUT (exit 5)" test $allok = 1
check "rank 7 never collects: every waiting rank's error names rank 7" test $named = 1

# ---- 6. world size that differs between nodes ---------------------------------------
for r in $ALL; do
    if [ $r -ge 6 ]; then W=10; fi
    rank ws $r --timeout-ms 3000 -- alloc 1K collect
done
W=8
allok=1
for r in $ALL; do
    waitrank $r; [ $rc != 0 ] || allok=0
    # whichever arrived first sets the size: "node X says the heap has A ranks but node(s) Y said B"
    grep -Eq 'ERR_STORE: .*(node n3 says the heap has 10 ranks but node\(s\) .* said 8|says the heap has 8 ranks but node\(s\) n3 said 10)' \
        "$T/ws.$r.err" || allok=0
done
check "a world size that differs on node n3: every rank of every node gets ERR_STORE naming n3 and both sizes" \
    test $allok = 1

# ---- 7. Redis killed mid-collect, then restarted -------------------------------------
for r in $ALL; do frank rs $r --timeout-ms 15000; done
for r in $ALL; do to rs $r alloc 1K; done
waitout rs '^a 0 ' 10 $ALL
for r in 0 1 2 3 4 5; do to rs $r try collect; done
sleep 0.3
t0=$(now_ms)
redis_kill
waitout rs '^e ' 20 0 1 2 3 4 5
dt=$(($(now_ms) - t0))
named=1
for r in 0 1 2 3 4 5; do grep -q "^e ERR_STORE .*127.0.0.1:$rport" "$T/rs.$r.out" || named=0; done
check "Redis killed mid-collect: the 6 waiting ranks of n0..n2 get ERR_STORE naming 127.0.0.1:$rport within $dt ms (timeout 15000)" \
    test $named = 1 -a $dt -lt 3000
t0=$(now_ms)
for r in 6 7; do to rs $r try collect; done
waitout rs '^e ' 20 6 7
dt=$(($(now_ms) - t0))
named=1
for r in 6 7; do grep -q "^e ERR_STORE .*127.0.0.1:$rport" "$T/rs.$r.out" || named=0; done
check "Redis down: a collect started on n3 fails with ERR_STORE naming 127.0.0.1:$rport within $dt ms" \
    test $named = 1 -a $dt -lt 3000
if redis_restart && [ "$REDIS_PORT" = "$rport" ]; then ok "Redis restarted on the same port $rport (pid $REDIS_PID)"
else bad "Redis restarted on the same port $rport"; fi
for r in $ALL; do to rs $r free 0 collect alloc 1K stats; done
waitout rs '^s heap ' 20 $ALL
for r in $ALL; do hang_up rs $r; done
allok=1
for r in $ALL; do waitrank $r; [ $rc = 0 ] || { allok=0; echo "rank $r: exit $rc: $(cat "$T/rs.$r.err")"; }; done
check "after the restart, the same heap collects again on every node (every rank exits 0)" test $allok = 1
sac=0; same rs a $ALL && same rs c $ALL && grep -q '^c 1 1 1024$' "$T/rs.0.out" && sac=1
check "after the restart: the collect reclaimed the freed block on every rank (c 1 1 1024), same offsets" test $sac = 1

JOB=j2
for r in $ALL; do rank rnd2 $r --chunk 256K --initial 256K --va 64M --seed 3 random 1500; done
allok=1
for r in $ALL; do waitrank $r; [ $rc = 0 ] || { allok=0; echo "rank $r: exit $rc: $(cat "$T/rnd2.$r.err")"; }; done
ncol=$(grep -c '^c ' "$T/rnd2.0.out")
check "after the restart, a new job's random workload: every rank exits 0, $ncol collects" \
    test $allok = 1 -a "$ncol" -gt 0
sac=0; same rnd2 a $ALL && same rnd2 c $ALL && sac=1
check "after the restart, a new job: offsets and collects identical on all 8 ranks" test $sac = 1
nj2=$(rcli --scan --pattern 'heapd:rnd2:j2~*' | wc -l)
check "after the restart, the new job's keys are namespaced by its job (heapd:rnd2:j2~*: $nj2)" test "$nj2" -gt 0
JOB=j1

# ---- 8. a single-node heap on a node with a store; a spanning heap without a store ------
for r in 0 1; do
    "$R" --socket "$T/n0.sock" --heap single --rank $r --world 2 -- alloc 1K free 0 collect \
        >"$T/single.$r.out" 2>"$T/single.$r.err" &
    eval "pid_$r=\$!"; pids="$pids $!"
done
waitrank 0; r0=$rc; waitrank 1; r1=$rc
check "a heap with every rank on one node (no local_size) works on a heapd with a store (reclaim eager: the free reclaimed before the collect, c 1 0 0)" \
    sh -c "test $r0 = 0 -a $r1 = 0 && grep -q '^c 1 0 0\$' $T/single.0.out"
nsk=$(rcli --scan --pattern 'heapd:single:*' | wc -l)
check "a single-node heap's collects never touch Redis (heapd:single:* keys: $nsk)" test "$nsk" = 0

cat >"$T/ns.conf" <<EOF
socket = $T/ns.sock
backend = host
EOF
S=$T/ns.sock start_heapd "$T/ns.conf" "$T/ns.log"
nspid=$hpid
"$R" --socket "$T/ns.sock" --heap span --rank 0 --world 4 --local-size 2 --job j1 -- alloc 1K \
    >"$T/ns.out" 2>"$T/ns.err"; rc=$?
check "local_size < world_size on a heapd with no store: refused (exit $rc), saying to set store = redis://" \
    sh -c "test $rc != 0 && grep -q 'store = redis://' $T/ns.err"
kill -TERM "$nspid"; wait "$nspid"; nspid=

# ---- 9. shutdown -------------------------------------------------------------------
allok=1
for n in $NODES; do
    eval "p=\$hp_$n"
    kill -TERM "$p"; wait "$p"; rc=$?
    [ $rc = 0 ] || allok=0
    eval "hp_$n="
done
check "the 4 heapd nodes stop on SIGTERM with exit 0" test $allok = 1
if grep -q 'invariant broken' "$T"/n*.log; then bad "allocator invariants held on every node"; else ok "allocator invariants held on every node"; fi
p=$REDIS_PID
redis_stop
left=0
for q in $pids $p; do
    st=$(ps -o stat= -p "$q" 2>/dev/null)
    case "$st" in ""|Z*) ;; *) left=$((left + 1)); echo "still running: $(ps -o pid=,args= -p "$q")" ;; esac
done
check "nothing started here is left running (redis-server, heapd, ranks)" test $left = 0

if [ $fails != 0 ]; then
    for n in $NODES; do echo "--- node n$n log (warnings and errors, last 8)"; grep -E ': (warn|error): ' "$T/n$n.log" | tail -8; done
fi
echo "it_multinode: $fails failure(s)"
[ $fails = 0 ]
