#!/bin/sh
# it_security.sh - who may do what, quotas, and zeroing between heaps, with
# two real uids (root and nobody) against a real heapd.
#
# Needs root (to run clients as another uid with setpriv); prints
# "skipped: ..." and passes otherwise.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
R=$(cd "$(dirname "$BUILD/x")" && pwd)/tests/prog_rank
CTL=$(cd "$(dirname "$BUILD/x")" && pwd)/heapctl
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null 2>&1; then
    echo "skipped: needs root and setpriv to run clients as a second uid"
    exit 0
fi
lib_tmpdir sec
chmod 755 "$T"
S=$T/heapd.sock
GROUP=heapdtest$$
fails=0
hpid=
made_group=0
lib_on_exit 'lib_kill hpid; pkill -9 -f "prog_rank --socket $S" 2>/dev/null; [ $made_group = 1 ] && groupdel "$GROUP" 2>/dev/null'

# Binaries must be reachable by nobody: copy them into the test directory.
cp "$R" "$CTL" "$T/"
R=$T/prog_rank
CTL=$T/heapctl
if groupadd "$GROUP" 2>/dev/null; then made_group=1; fi
GID=$(getent group "$GROUP" | cut -d: -f3)

cat >"$T/heapd.conf" <<EOF
socket = $S
socket_mode = 0666
backend = host
collect_timeout_ms = 5000
quota_heap = 8M
quota_uid = 12M
$( [ $made_group = 1 ] && echo "admin_group = $GROUP" )
EOF
check "heapd starts" start_heapd "$T/heapd.conf" "$T/heapd.log"

as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
as_admin() { setpriv --reuid=65534 --regid=65534 --groups="$GID" "$@"; }

# ---- ownership ----------------------------------------------------------------------
"$R" --socket "$S" --heap rootheap --rank 0 --world 1 --chunk 1M -- alloc 4K sleep 3000 >"$T/root.out" 2>&1 &
rootpid=$!
as_nobody "$R" --socket "$S" --heap userheap --rank 0 --world 1 --chunk 1M -- alloc 4K sleep 3000 >"$T/user.out" 2>&1 &
userpid=$!
sleep 0.5
as_nobody "$R" --socket "$S" --heap rootheap --rank 0 --world 1 --chunk 1M -- alloc 4K >"$T/steal.out" 2>&1
rc=$?
check "another uid cannot attach to root's heap (refused, exit $rc)" test $rc != 0
check "the refusal names the owner and says who may" grep -q 'belongs to uid 0; uid 65534 may not attach' "$T/steal.out"
as_nobody "$CTL" --socket "$S" stats >"$T/ustats.txt" 2>&1
check "a user's heapctl stats shows its own heap" grep -q '^userheap' "$T/ustats.txt"
check "a user's heapctl stats does not show root's heap" sh -c "! grep -q '^rootheap' $T/ustats.txt"
"$CTL" --socket "$S" stats >"$T/rstats.txt" 2>&1
check "root's heapctl stats shows every heap" sh -c "grep -q '^rootheap' $T/rstats.txt && grep -q '^userheap' $T/rstats.txt"
as_nobody "$CTL" --socket "$S" collect rootheap >"$T/ucol.txt" 2>&1; rc=$?
check "a user cannot force a collect on root's heap (exit 1)" sh -c "test $rc = 1 && grep -q 'needs root or membership' $T/ucol.txt"
as_nobody "$CTL" --socket "$S" collect userheap >/dev/null 2>&1; rc=$?
check "a user can force a collect on its own heap" test $rc = 0
"$CTL" --socket "$S" collect userheap >/dev/null 2>&1; rc=$?
check "root can force a collect on a user's heap" test $rc = 0
if [ $made_group = 1 ]; then
    as_admin "$CTL" --socket "$S" collect rootheap >/dev/null 2>&1; rc=$?
    check "a member of admin_group can force a collect on root's heap" test $rc = 0
    as_admin "$CTL" --socket "$S" stats >"$T/astats.txt" 2>&1
    check "a member of admin_group sees every heap" grep -q '^rootheap' "$T/astats.txt"
else
    echo "skipped: groupadd failed (admin_group checks)"
fi
wait $rootpid $userpid

# ---- quotas -----------------------------------------------------------------------------
"$R" --socket "$S" --heap q1 --rank 0 --world 2 --chunk 2M --initial 2M -- alloc 1M alloc 2M \
    try alloc 2M sleep 1500 >"$T/q1.0.out" 2>&1 &
p0=$!
"$R" --socket "$S" --heap q1 --rank 1 --world 2 --chunk 2M --initial 2M -- alloc 1M alloc 2M \
    try alloc 2M sleep 1500 >"$T/q1.1.out" 2>&1 &
p1=$!
sleep 0.7
"$R" --socket "$S" --heap q2 --rank 0 --world 1 --chunk 2M --initial 6M -- alloc 1M >"$T/q2.out" 2>&1
rc=$?
wait $p0 $p1
check "per-heap quota: growth past 8 MiB of chunks is refused with ERR_QUOTA" \
    grep -q 'e .*QUOTA.*per-heap quota of 8 MiB' "$T/q1.0.out"
check "per-uid quota: a second heap that would take uid 0 past 12 MiB is refused" \
    sh -c "test $rc != 0 && grep -q 'per-uid quota of 12 MiB' $T/q2.out"

# Bookkeeping counts against quota_uid (issue 15 item 4): 8 MiB of chunks
# fit in 12 MiB with min_block 512 (~8 KiB of bitmaps), not with min_block 1
# (~4.1 MiB of bitmaps).
"$R" --socket "$S" --heap qb --rank 0 --world 1 --chunk 2M --initial 8M --va 8M --min-block 512 -- alloc 1M \
    >"$T/qb1.out" 2>&1
check "per-uid quota: 8 MiB of chunks with min_block 512 fit in 12 MiB" test $? = 0
"$R" --socket "$S" --heap qb --rank 0 --world 1 --chunk 2M --initial 8M --va 8M --min-block 1 -- alloc 1M \
    >"$T/qb2.out" 2>&1
rc=$?
check "per-uid quota: the same heap with min_block 1 is refused, its bookkeeping named" \
    sh -c "test $rc != 0 && grep -q 'chunk memory and heapd bookkeeping.*per-uid quota of 12 MiB' $T/qb2.out"

# ---- zeroing between heaps ---------------------------------------------------------------
"$R" --socket "$S" --heap dirty --rank 0 --world 1 --chunk 1M -- alloc 1M write 0 0 0xab check 0 0xab >/dev/null 2>&1
"$R" --socket "$S" --heap clean --rank 0 --world 1 --chunk 1M -- alloc 1M check 0 0 >"$T/clean.out" 2>&1
rc=$?
check "a new heap never reads an old heap's data (reads zeros)" test $rc = 0

kill -TERM "$hpid"; wait "$hpid"; rc=$?
hpid=
check "heapd stops cleanly" test $rc = 0
echo "it_security: $fails failure(s)"
[ $fails = 0 ]
