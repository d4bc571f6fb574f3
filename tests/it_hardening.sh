#!/bin/sh
# it_hardening.sh - issue 15's transport items against real heapd processes,
# with tests/prog_hostile.c (a socket-level client) as root and as a second
# uid (nobody, through setpriv):
#
#   1  a passed socket whose close() lingers does not freeze the loop
#   5  per uid: connections (the refused client gets an Error naming
#      max_clients_per_uid), unread reply bytes (max_queue_per_uid, logged);
#      per connection: a frame before Hello (max_frame_before_hello), the
#      Hello timeout, fds held for a partial header (max_fds_per_conn);
#      EMFILE pauses accepting (no busy loop) and accepting resumes; a uid
#      over max_fds_per_uid (set by SIGHUP) is not read until its fds close
#   6  200 pipelined frames in one write get 200 replies
#   7  admin_group through a supplementary group, from the socket's peer
#      groups: the connecting process is gone when heapd accepts
#   12 start and stop under valgrind --error-exitcode=1
#   14 heapd's RSS returns to its level after a flood of partial frames and
#      unread replies (waited for, bounded)
#
# Needs root and setpriv for the second uid (skipped otherwise); valgrind
# for item 12 (skipped without it).
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
B=$(cd "$BUILD" && pwd)
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null 2>&1; then
    echo "skipped: needs root and setpriv to run clients as a second uid"
    exit 0
fi
lib_tmpdir hard
chmod 755 "$T"
S=$T/heapd.sock
GROUP=heapdhard$$
hpid= hold= rankpid= made_group=0
lib_on_exit '[ -n "$hold" ] && kill -9 $hold 2>/dev/null; [ -n "$rankpid" ] && kill -9 $rankpid 2>/dev/null; [ -n "$hpid" ] && kill -9 $hpid 2>/dev/null; [ $made_group = 1 ] && groupdel $GROUP 2>/dev/null; wait 2>/dev/null'

# Binaries reachable by nobody.
cp "$B/tests/prog_hostile" "$B/tests/prog_rank" "$B/heapctl" "$T/"
H=$T/prog_hostile
if groupadd "$GROUP" 2>/dev/null; then made_group=1; fi
GID=$(getent group "$GROUP" | cut -d: -f3)
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
# In the background: the process itself, so that $! is the one to kill.
bg_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@" & }
as_admin() { setpriv --reuid=65534 --regid=65534 --groups="$GID" "$@"; }
serving() { "$B/heapctl" --socket "$S" heaps >/dev/null 2>&1; }
stop_heapd() {
    kill -TERM "$hpid" 2>/dev/null; wait "$hpid"; _rc=$?; hpid=
    return $_rc
}

cat >"$T/heapd.conf" <<EOF
socket = $S
socket_mode = 0666
backend = host
log_level = info
max_clients_per_uid = 40
max_queue_per_uid = 5M
hello_timeout_ms = 2000
$( [ $made_group = 1 ] && echo "admin_group = $GROUP" )
EOF
check "heapd starts" start_heapd "$T/heapd.conf" "$T/heapd.log"

# ---- 1: a lingering socket passed in an unfinished frame ------------------------------------
# uid 65534 passes more lingering sockets than heapd has closer threads; a
# Hello must still be answered, and root's fds still be closed meanwhile.
bg_nobody "$H" --socket "$S" linger 60 "$T/go" >"$T/linger.out" 2>&1
lp=$!
wait_for grep -q '^lingering' "$T/linger.out"
"$H" --socket "$S" fdprobe >"$T/probe.out" 2>&1; prc=$?
touch "$T/go"
wait $lp; rc=$?
cat "$T/linger.out" "$T/probe.out"
check "item 1: the loop never closes a client's fd itself (linger test, exit $rc)" test $rc = 0
check "item 1: one uid's lingering closes do not hold up another uid's (exit $prc)" test $prc = 0

# ---- 6: pipelining ---------------------------------------------------------------------------
"$H" --socket "$S" pipeline 65 >"$T/pipe.out" 2>&1 && "$H" --socket "$S" pipeline 200 >>"$T/pipe.out" 2>&1; rc=$?
cat "$T/pipe.out"
check "item 6: every pipelined frame is answered (exit $rc)" test $rc = 0

# ---- 5: connections per uid ----------------------------------------------------------------------
as_nobody "$H" --socket "$S" conns 60 >"$T/conns.out" 2>&1
cat "$T/conns.out"
check "item 5: uid 65534 gets 40 connections (max_clients_per_uid)" grep -q '^taken 40$' "$T/conns.out"
check "item 5: the refused client gets an Error naming max_clients_per_uid (ERR_QUOTA 17)" \
    grep -q 'refused after 40: Error 17: .*max_clients_per_uid = 40' "$T/conns.out"
check "heapd serves other uids meanwhile and after" serving

# ---- 5: a big frame before Hello, the Hello timeout, fds dripped into a header ----------------------
"$H" --socket "$S" prehello 8192 >"$T/pre.out" 2>&1; rc=$?
cat "$T/pre.out"
check "item 5: an 8 KiB frame before Hello closes the connection (max_frame_before_hello 4096)" test $rc = 0
"$H" --socket "$S" hello_timeout >"$T/ht.out" 2>&1; rc=$?
cat "$T/ht.out"
check "item 5: a connection without Hello is closed (hello_timeout_ms)" test $rc = 0
check "item 5: ... with a logged reason" wait_for has "$T/heapd.log" "no Hello within hello_timeout_ms = 2000 ms"
as_nobody "$H" --socket "$S" fds_drip >"$T/drip.out" 2>&1; rc=$?
cat "$T/drip.out"
check "item 5: fds sent with a header byte by byte: closed at max_fds_per_conn, every fd closed" test $rc = 0

# ---- 5: unread replies per uid ----------------------------------------------------------------------
bg_nobody "$H" --socket "$S" hold 0 0 30 >"$T/unread.out" 2>&1
hold=$!
check "item 5: 30 connections of one uid that do not read their replies (set up)" wait_for grep -q '^holding' "$T/unread.out"
cat "$T/unread.out"
check "item 5: a connection is closed over max_queue_per_uid, with the reason logged" \
    wait_for has "$T/heapd.log" "over max_queue_per_uid = 5242880"
check "heapd serves other uids while one floods" serving
kill -TERM $hold; wait $hold 2>/dev/null; hold=

# ---- 5: received fds per uid (the limit changed by SIGHUP) -----------------------------------------
# (No Hello timeout now: only heapd hearing the hang-up of connections it
# does not read can close them.)
sed -i 's/^hello_timeout_ms = 2000$/hello_timeout_ms = 600000\nmax_fds_per_uid = 600/' "$T/heapd.conf"
kill -HUP "$hpid"
check "SIGHUP reloads the limits" wait_for has "$T/heapd.log" "SIGHUP: configuration reloaded"
bg_nobody "$H" --socket "$S" hold 0 3 0 >"$T/fdh.out" 2>&1
hold=$!
wait_for grep -q '^holding' "$T/fdh.out"
check "item 5: a uid over max_fds_per_uid (3 x 253 fds in partial headers) is not read any more (logged)" \
    wait_for has "$T/heapd.log" "the max_fds_per_uid limit of 600"
check "heapd serves other uids meanwhile" serving
kill -TERM $hold; wait $hold 2>/dev/null; hold=
check "item 5: once those connections hung up, the uid is served again" \
    wait_for as_nobody "$T/heapctl" --socket "$S" heaps

# ---- 7: admin_group from the socket's peer groups -------------------------------------------------
if [ $made_group = 1 ]; then
    "$T/prog_rank" --socket "$S" --heap rootheap --rank 0 --world 1 --chunk 1M -- alloc 4K sleep 60000 >/dev/null 2>&1 &
    rankpid=$!
    check "a root heap exists" wait_for sh -c "'$B/heapctl' --socket '$S' heaps | grep -q rootheap"
    # heapd stopped: the client connects (the backlog takes it), forks, and
    # its connecting process exits before heapd accepts and asks who it is.
    kill -STOP "$hpid"
    setpriv --reuid=65534 --regid=65534 --groups="$GID" "$H" --socket "$S" peergroups rootheap >"$T/pg.out" 2>&1 &
    wait $!
    kill -CONT "$hpid"
    wait_for grep -q 'peergroups done' "$T/pg.out"
    cat "$T/pg.out"
    check "item 7: admin_group membership comes from SO_PEERGROUPS (no /proc lookup)" grep -q '^ok   peergroups' "$T/pg.out"
    kill -9 $rankpid; wait $rankpid 2>/dev/null; rankpid=
else
    echo "skipped: groupadd failed (item 7)"
fi

# ---- 14: memory after a flood ----------------------------------------------------------------------
# Not in a sanitizer build: ASan's allocator keeps freed memory in its
# quarantine and does not give it back through malloc_trim (glibc's).
if nm "$B/heapd" 2>/dev/null | grep -q __asan_init; then
    echo "skipped: item 14 (RSS after a flood) in a sanitizer build: ASan's allocator is not glibc's"
else
wait_for sh -c "! '$B/heapctl' --socket '$S' heaps | grep -q rootheap"
rss0=$(rss)
"$H" --socket "$S" partial 40 4194304 2097152 >"$T/part.out" 2>&1 &
hold=$!
wait_for grep -q '^holding' "$T/part.out"
"$H" --socket "$S" hold 0 0 30 >"$T/unread2.out" 2>&1 &
hold2=$!
wait_for grep -q '^holding' "$T/unread2.out"
# A heap made during the flood stays: its memory sits above the flood's.
"$T/prog_rank" --socket "$S" --heap keep --rank 0 --world 1 --chunk 1M -- alloc 4K sleep 60000 >"$T/keep.out" 2>&1 &
rankpid=$!
wait_for grep -q '^a ' "$T/keep.out"
rss1=$(rss)
kill -TERM $hold $hold2; wait $hold $hold2; hold=
back() { [ "$(rss)" -le $((rss0 + 4096)) ]; }
wait_for back
rss2=$(rss)
kill -9 $rankpid; wait $rankpid 2>/dev/null; rankpid=
echo "heapd VmRSS: $rss0 kB before, $rss1 kB with 40 partial 4 MiB frames (2 MiB sent each), 30 connections not reading and a new heap, $rss2 kB after the flood left (the heap stays)"
check "item 14: the flood raised heapd's RSS (by $((rss1 - rss0)) kB, at least 60 MiB)" test $((rss1 - rss0)) -ge 61440
check "item 14: heapd's RSS returned to within 4 MiB of its level before the flood ($rss2 kB; glibc alone keeps ~8 MiB)" back
fi

# ---- 5: a refused libheapc client reads why ----------------------------------------------------------
sed -i 's/^max_clients_per_uid = 40$/max_clients_per_uid = 1/' "$T/heapd.conf"
kill -HUP "$hpid"
wait_for sh -c "[ \$(grep -c 'SIGHUP: configuration reloaded' '$T/heapd.log') -ge 2 ]"
bg_nobody "$H" --socket "$S" hold 0 0 1 >"$T/one.out" 2>&1
hold=$!
wait_for grep -q '^holding' "$T/one.out"
as_nobody "$T/heapctl" --socket "$S" heaps >"$T/refused.out" 2>&1
cat "$T/refused.out"
check "item 5: heapctl (libheapc) over max_clients_per_uid says which limit and key" \
    grep -q 'max_clients_per_uid = 1' "$T/refused.out"
kill -TERM $hold; wait $hold 2>/dev/null; hold=

check "heapd stops cleanly (exit 0)" stop_heapd

# ---- 5: EMFILE: accepting pauses, then resumes ---------------------------------------------------------
cat >"$T/emfile.conf" <<EOF
socket = $S
backend = host
hello_timeout_ms = 600000
EOF
( ulimit -n 48; exec "$B/heapd" --config "$T/emfile.conf" ) 2>"$T/emfile.log" &
hpid=$!
check "heapd starts with 48 fds" lib_wait_socket "$S" "$hpid"
"$H" --socket "$S" hold 80 0 0 >"$T/emh.out" 2>&1 &
hold=$!
wait_for grep -q '^holding' "$T/emh.out"
check "heapd runs out of fds for new clients (logged)" wait_for has "$T/emfile.log" "cannot accept a client"
sleep 1 # a window in which a busy loop would show (not a timed assertion)
n=$(grep -c -e 'cannot accept a client' -e 'accept failed' "$T/emfile.log")
check "item 5: at EMFILE heapd pauses accepting instead of spinning ($n log lines)" test "$n" -le 5
kill -TERM $hold; wait $hold; hold=
check "item 5: heapd accepts again once connections closed" wait_for serving
check "heapd stops cleanly (exit 0)" stop_heapd

# ---- 12: valgrind start/stop ------------------------------------------------------------------------
if command -v valgrind >/dev/null 2>&1 && ! nm "$B/heapd" 2>/dev/null | grep -q __asan_init; then
    cat >"$T/vg.conf" <<EOF
socket = $S
backend = host
EOF
    valgrind -q --error-exitcode=1 "$B/heapd" --config "$T/vg.conf" 2>"$T/vg.log" &
    hpid=$!
    check "heapd starts under valgrind" lib_wait_socket "$S" "$hpid" 1200
    "$H" --socket "$S" pipeline 65 >/dev/null 2>&1
    "$H" --socket "$S" fds_drip >/dev/null 2>&1
    serving
    stop_heapd; rc=$?
    check "item 12: heapd starts and stops under valgrind with no error (exit $rc)" test $rc = 0
    [ $rc = 0 ] || tail -30 "$T/vg.log"
else
    echo "skipped: valgrind (not installed, or a sanitizer build)"
fi

echo "it_hardening: $fails failure(s)"
[ $fails = 0 ]
