#!/bin/sh
# it_fdpin.sh - issue 33 items 2 and 3: a tenant (uid 64602) pipelines
# Detach + Attach on the 8 connections of a 1-chunk-per-rank heap and never
# reads (tests/prog_fdpin.c); another uid (64603) must still attach and grow
# a heap, and heapd's fd table must stay bounded.
#
#   2  heapd as root (CAP_SYS_RESOURCE: the kernel does not bound fds in
#      flight) with 1024 fds: the fds queued for the tenant are bounded
#      (max_queued_fds_per_conn / _per_uid pause reading), so heapd's fd
#      table does not fill and the other uid's memfd_create still works;
#      chunk fds per uid are bounded (max_chunk_fds_per_uid: ERR_QUOTA)
#   3  heapd as uid 64601 without capabilities (as heapd.service runs it)
#      with RLIMIT_NOFILE 1024, which is also the kernel's bound on the fds
#      heapd's uid has in flight: max_inflight_fds_per_uid keeps the tenant
#      under it; then, with the bounds raised past it by SIGHUP, the kernel
#      refuses (ETOOMANYREFS), which heapd logs at warn and treats as
#      backpressure: the other uid's attach waits, is not closed, and
#      completes once the tenant is gone
#
# Needs root, setpriv and prlimit (skipped otherwise).
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
B=$(cd "$BUILD" && pwd)
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null 2>&1 || ! command -v prlimit >/dev/null 2>&1; then
    echo "skipped: needs root, setpriv and prlimit to run heapd and clients as other uids"
    exit 0
fi
lib_tmpdir fdpin
chmod 777 "$T"
S=$T/heapd.sock
hpid= pin=
lib_on_exit 'lib_kill pin hpid'
cp "$B/heapd" "$B/heapctl" "$B/tests/prog_fdpin" "$B/tests/prog_rank" "$T/"
# Uids of their own: the kernel counts fds in flight per uid, system-wide.
UH=64601 UT=64602 UV=64603
serving() { "$T/heapctl" --socket "$S" heaps >/dev/null 2>&1; }

# $1: config, $2: log, $3: empty (root) or a uid without capabilities.
start() {
    rm -f "$S"
    if [ -n "$3" ]; then
        prlimit --nofile=1024:1024 setpriv --reuid="$3" --regid="$3" --clear-groups --inh-caps=-all \
            --bounding-set=-all "$T/heapd" --config "$1" 2>>"$2" &
    else
        prlimit --nofile=1024:1024 "$T/heapd" --config "$1" 2>>"$2" &
    fi
    hpid=$!
    wait_for serving
}
stop() { kill -TERM "$hpid" 2>/dev/null; wait "$hpid"; _rc=$?; hpid=; return $_rc; }

# The tenant's pin: "pinning N" once its requests are written.
pin_start() {
    rm -f "$T/pin.out"
    setpriv --reuid=$UT --regid=$UT --clear-groups --inh-caps=-all --bounding-set=-all "$T/prog_fdpin" --socket "$S" "$1" 8 1 "$2" >"$T/pin.out" 2>&1 &
    pin=$!
    wait_for grep -q '^pinning' "$T/pin.out"
}
pin_stop() { kill -TERM "$pin" 2>/dev/null; wait "$pin" 2>/dev/null; pin=; }

# The other uid: a heap of 4 KiB chunks that grows (each growth sends fds).
victim() {
    bounded 60 setpriv --reuid=$UV --regid=$UV --clear-groups --inh-caps=-all --bounding-set=-all "$T/prog_rank" --socket "$S" --heap "v$1" --rank 0 --world 1 --chunk 4096 \
        alloc 64K alloc 64K alloc 256K >"$T/victim$1.out" 2>&1
}

# ---- 2: queued fds, heapd as root -----------------------------------------------------------
cat >"$T/root.conf" <<EOF
socket = $S
socket_mode = 0666
backend = host
log_level = info
max_clients_per_uid = 40
max_queued_fds_per_conn = 64
max_queued_fds_per_uid = 256
max_chunk_fds_per_uid = 512
EOF
check "item 2: heapd (root, 1024 fds) starts" start "$T/root.conf" "$T/root.log" ""
pin_start p2 3000
cat "$T/pin.out"
n=$(nfds)
echo "heapd holds $n fds while the tenant pins"
check "item 2: the tenant's queued fds are bounded ($n fds open in heapd, under 700)" test "$n" -gt 0 -a "$n" -lt 700
victim 2; rc=$?
cat "$T/victim2.out"
check "item 2: another uid attaches and grows its heap while the tenant pins (exit $rc)" test $rc = 0
check "item 2: heapctl still answers" serving
# Chunks are fds too: 4 KiB chunks per uid are bounded.
bounded 60 setpriv --reuid=$UV --regid=$UV --clear-groups --inh-caps=-all --bounding-set=-all "$T/prog_rank" \
    --socket "$S" --heap v2big --rank 0 --world 1 --chunk 4096 --initial 4M >"$T/big.out" 2>&1
cat "$T/big.out"
check "item 2: 1024 chunks of 4 KiB for one uid: ERR_QUOTA naming max_chunk_fds_per_uid" has_re "$T/big.out" \
    "ERR_QUOTA.*max_chunk_fds_per_uid"
pin_stop
check "item 2: heapd stops cleanly" stop
lacks "$T/root.log" "Too many open files" || { bad "item 2: heapd ran out of fds"; grep -m3 "Too many" "$T/root.log"; }

# ---- 3: fds in flight, heapd as uid $UH without capabilities -----------------------------
cat >"$T/nobody.conf" <<EOF
socket = $S
socket_mode = 0666
backend = host
log_level = info
max_clients_per_uid = 40
max_inflight_fds_per_conn = 250
max_inflight_fds_per_uid = 256
max_queued_fds_per_uid = 256
EOF
chmod 644 "$T/nobody.conf"
check "item 3: heapd (uid $UH, no capabilities, 1024 fds) starts" start "$T/nobody.conf" "$T/nobody.log" $UH
caps=$(sed -n 's/^CapEff:[[:space:]]*//p' "/proc/$hpid/status" 2>/dev/null)
check "item 3: heapd runs as uid $UH with no effective capability ($caps)" test "$caps" = 0000000000000000
pin_start p3 200
cat "$T/pin.out"
victim 3; rc=$?
cat "$T/victim3.out"
check "item 3: another uid attaches and grows while the tenant's fds are in flight (exit $rc)" test $rc = 0
lacks "$T/nobody.log" "ETOOMANYREFS" || bad "item 3: max_inflight_fds_per_uid did not keep the tenant under the kernel's bound"

# The bounds raised past RLIMIT_NOFILE: the kernel refuses, and that is backpressure.
sed -i -e 's/^max_inflight_fds_per_conn.*/max_inflight_fds_per_conn = 1000000/' \
    -e 's/^max_inflight_fds_per_uid.*/max_inflight_fds_per_uid = 1000000/' "$T/nobody.conf"
pin_stop
kill -HUP "$hpid"
wait_for grep -q "SIGHUP: configuration reloaded" "$T/nobody.log"
pin_start p3b 400
cat "$T/pin.out"
wait_for grep -q "ETOOMANYREFS" "$T/nobody.log"
setpriv --reuid=$UV --regid=$UV --clear-groups --inh-caps=-all --bounding-set=-all "$T/prog_rank" --socket "$S" --heap v3b --rank 0 --world 1 --chunk 4096 --initial 64K \
    alloc 4K touch "$T/v3b.done" >"$T/victim3b.out" 2>&1 &
vpid=$!
wait_for grep -q "heap \"v3b\": rank 0 attached" "$T/nobody.log"
check "item 3: ETOOMANYREFS is logged at warn" has_re "$T/nobody.log" "warn.*ETOOMANYREFS"
check "item 3: the other uid waits (backpressure), its connection is not closed" kill -0 $vpid
pin_stop
lib_wait_pid $vpid 60
cat "$T/victim3b.out"
check "item 3: once the tenant is gone the other uid's attach completes (exit $rc)" test $rc = 0
check "item 3: heapd stops cleanly" stop
clean_log "$T/nobody.log"
clean_log "$T/root.log"

echo "it_fdpin: $passes passed, $fails failed"
[ "$fails" = 0 ]
