#!/bin/sh
# it_persist_life.sh - issue 29's heap lifetime with a real heapd (host
# backend): with heapd.conf's persist a heap outlives its ranks (one detaches,
# one exits without detaching); heapctl heaps, stats, --json and metrics show
# it detached, with its age, size and owner; its ranks attach again and find
# it as it was (the same bytes mapped); heapctl drop refuses it while a rank
# is attached and releases it once none is, and heapd's fd count returns to
# its baseline; after a SIGHUP to persist = 1 the persist timeout releases
# another heap; heapd stops cleanly (SIGTERM) with a detached heap, with no
# sanitizer report. Every wait is for a state, bounded.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
R=$BUILD/tests/prog_rank
CTL=$BUILD/heapctl
lib_tmpdir persist
S=$T/heapd.sock
hpid= r0= r1=
lib_on_exit 'lib_kill r0 r1 hpid'
for f in "$R" "$BUILD/heapd" "$CTL"; do
    [ -x "$f" ] || { echo "FAIL $f is not built"; exit 1; }
done

conf() {
    cat >"$T/heapd.conf" <<EOF
socket = $S
backend = host
chunk_size = 1M
va_size = 256M
collect_timeout_ms = 20000
persist = $1
EOF
}
# Waits (up to 5 s) until heapd's fd count is at most $1; prints the count.
# "At most": the baseline, taken just after a heapctl call, may still hold
# that call's connection if heapd had not yet seen it close (a loaded
# machine); a leak shows as a count above it.
settle_fds() {
    n=0
    while [ "$(nfds)" -gt "$1" ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
    nfds
}
heaps() { "$CTL" --socket "$S" heaps 2>&1; }
listed() { heaps | grep -q "^$1 "; }
detached() { heaps | grep -q "^$1 .*clients 0 .*detached [0-9]*s, persists $2s"; }
# rank R of 2-rank heap NAME runs CMD... (attaching first)
rank() { _h=$1 _r=$2; shift 2; "$R" --socket "$S" --heap "$_h" --rank "$_r" --world 2 --chunk 1M --va 64M -- "$@"; }

conf 600
check "heapd starts (persist = 600)" start_heapd "$T/heapd.conf" "$T/heapd.log"
heaps >/dev/null
base=$(settle_fds "$(nfds)")

# A heap that outlives its ranks: they grow it past its first chunk, write
# into a block; rank 0 detaches, rank 1 exits without detaching.
rank pl 0 alloc 3M write 0 0 0x5a detach >"$T/a0.out" 2>&1 &
r0=$!
rank pl 1 alloc 3M exit 0 >"$T/a1.out" 2>&1 &
r1=$!
lib_wait_pid "$r0" 60; rc0=$rc
lib_wait_pid "$r1" 60; rc1=$rc
r0= r1=
check "the ranks ran and left (exit $rc0 and $rc1)" test "$rc0$rc1" = 00
mapped=$(awk '/^attached/ {a=1} /^a 0/ && a {print "ok"}' "$T/a0.out")
check "rank 0 allocated" test "$mapped" = ok
check "heapctl heaps shows the heap detached (clients 0, its age, persists 600s)" within 10 detached pl 600
heaps >"$T/heaps.txt"
check "heapctl heaps names its owner (uid $(id -u))" grep -q "^pl .*owner $(id -u) " "$T/heaps.txt"
"$CTL" --socket "$S" stats pl >"$T/stats.txt" 2>&1
check "heapctl stats: STATE detached, persists 600s" grep -q "^pl .* detached [0-9]*s, persists 600s " "$T/stats.txt"
grow() {
    "$CTL" --socket "$S" --json stats pl >"$T/s.json" 2>/dev/null &&
        /usr/bin/python3 -c "
import json, sys
h = json.load(open('$T/s.json'))['heaps'][0]
sys.exit(0 if h['clients'] == 0 and h['persist_s'] == 600 and h['detached_ms'] >= 1100 and h['mapped'] > (1 << 20) else 1)"
}
check "heapctl --json stats: detached_ms grows (past 1.1 s), persist_s 600, mapped kept" within 30 grow
"$CTL" --socket "$S" metrics >"$T/m.prom" 2>&1
check "metrics: heapd_heap_detached_seconds > 0 and heapd_heap_persist_seconds 600 for the heap" \
    sh -c "grep -q '^heapd_heap_detached_seconds{heap=\"pl\",owner_uid=\"$(id -u)\"} [1-9]' '$T/m.prom' &&
           grep -q '^heapd_heap_persist_seconds{heap=\"pl\",owner_uid=\"$(id -u)\"} 600\$' '$T/m.prom'"
has_mapped=$(/usr/bin/python3 -c "import json; print(json.load(open('$T/s.json'))['heaps'][0]['mapped'])")

# Its ranks attach again, one after the other: the heap is as they left it.
rank pl 1 mapped >"$T/b1.out" 2>&1
check "rank 1 attaches again: the same $has_mapped bytes mapped" grep -q "^attached 1 2 $has_mapped " "$T/b1.out"
rank pl 0 mapped touch "$T/in0" waitfile "$T/go0" detach >"$T/b0.out" 2>&1 &
r0=$!
wait_for test -e "$T/in0"
check "rank 0 attaches again: the same bytes mapped" grep -q "^attached 0 2 $has_mapped " "$T/b0.out"
"$CTL" --socket "$S" drop pl >"$T/drop1.out" 2>&1
drc=$?
check "heapctl drop refuses a heap with a client (exit $drc: detach them first)" \
    sh -c "[ $drc = 1 ] && grep -q 'has 1 client(s) attached.*detach them first' '$T/drop1.out'"
touch "$T/go0"
lib_wait_pid "$r0" 60; r0=
check "rank 0 detached again" test "$rc" = 0
check "the heap is detached again" within 10 detached pl 600
"$CTL" --socket "$S" drop pl >"$T/drop2.out" 2>&1
check "heapctl drop releases it (exit $?: $(cat "$T/drop2.out"))" grep -q "^heap pl dropped: [1-9].* of chunks released" "$T/drop2.out"
check "heapctl heaps no longer lists it" sh -c "! heaps_out=\$('$CTL' --socket '$S' heaps) || ! echo \"\$heaps_out\" | grep -q '^pl '"
check "heapctl drop of an unknown heap fails (exit 1, no heap named)" \
    sh -c "! '$CTL' --socket '$S' drop pl 2>'$T/drop3.out' && grep -q 'no heap named' '$T/drop3.out'"
now=$(settle_fds "$base")
check "heapd's fds are back to their baseline after the drop ($now, baseline $base)" test "$now" -le "$base"

# The persist timeout: persist = 1 for new heaps (SIGHUP); a heap whose
# ranks are gone is released by the timeout.
conf 1
kill -HUP "$hpid"
check "SIGHUP reloads persist = 1" within 10 grep -q "SIGHUP: configuration reloaded" "$T/heapd.log"
rank ex 0 alloc 4K exit 0 >"$T/e0.out" 2>&1 &
r0=$!
rank ex 1 alloc 4K exit 0 >"$T/e1.out" 2>&1 &
r1=$!
lib_wait_pid "$r0" 60; lib_wait_pid "$r1" 60; r0= r1=
check "the persist timeout releases the heap (heapctl heaps, heapd's log)" \
    within 30 sh -c "! '$CTL' --socket '$S' heaps | grep -q '^ex ' && grep -q 'heap \"ex\" destroyed: persist of 1 s expired' '$T/heapd.log'"
now=$(settle_fds "$base")
check "heapd's fds are back to their baseline after the expiry ($now, baseline $base)" test "$now" -le "$base"

# Stopping heapd releases a detached heap.
conf 600
kill -HUP "$hpid"
within 10 sh -c "[ \$(grep -c 'SIGHUP: configuration reloaded' '$T/heapd.log') -ge 2 ]"
rank st 0 alloc 4K exit 0 >/dev/null 2>&1 &
r0=$!
rank st 1 alloc 4K exit 0 >/dev/null 2>&1 &
r1=$!
lib_wait_pid "$r0" 60; lib_wait_pid "$r1" 60; r0= r1=
check "a heap is detached before heapd stops" within 10 detached st 600
kill -TERM "$hpid"
lib_wait_pid "$hpid" 60; hpid=
check "heapd stops cleanly (SIGTERM) with a detached heap (exit $rc)" test "$rc" = 0
check "heapd's log: the detached heap released as heapd stopped" \
    grep -q 'heap "st" destroyed: heapd is stopping (it was detached)' "$T/heapd.log"
clean_log "$T/heapd.log"

[ $fails = 0 ] && echo "it_persist_life: all passed" || echo "it_persist_life: $fails failed"
[ $fails = 0 ]
