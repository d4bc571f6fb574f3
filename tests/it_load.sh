#!/bin/sh
# it_load.sh - load: 64 client processes (16 heaps x 4 ranks, prog_rank) at
# once against one heapd (host backend). Run by tests/run.sh.
#
# Every rank runs `random N` (LOAD_STEPS, default 2000) with its heap's seed:
# the same allocation sizes and collect points on the 4 ranks of a heap,
# per-rank random free timing, each block filled with a rank-specific byte
# and verified when freed (a block handed out twice, or overlapping one the
# rank still holds, corrupts it: exit 3). Then the rank frees every block it
# still holds, collects, and prints the heap's stats.
#
# Checks: every rank exits 0 (no corruption, no error); offsets identical on
# the 4 ranks of each heap; after the final collect every heap has 0 live and
# 0 released bytes and every rank's allocation number is N (no block lost or
# counted twice); heapd's fd count is back to its baseline after every client
# left (no fd leak) and every heap is destroyed; heapd's memory stays bounded
# (peak and after: see the bound below); total operations and runtime.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
R=$BUILD/tests/prog_rank
CTL=$BUILD/heapctl
HEAPS=${LOAD_HEAPS:-16}
RANKS=${LOAD_RANKS:-4}
STEPS=${LOAD_STEPS:-2000}
. "$SRC/tests/lib.sh"
lib_tmpdir load
S=$T/heapd.sock
fails=0
hpid=
pids=
lib_on_exit 'lib_kill pids hpid'

asan=0
if nm "$BUILD/heapd" 2>/dev/null | grep -q __asan_init; then
    asan=1
    ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=8:detect_leaks=1}
    export ASAN_OPTIONS
    echo "note: sanitizer build (ASAN_OPTIONS=$ASAN_OPTIONS)"
fi

cat >"$T/heapd.conf" <<EOF
socket = $S
backend = host
log_level = info
chunk_size = 256K
va_size = 64M
collect_timeout_ms = 60000
EOF
check "heapd starts and listens" start_heapd "$T/heapd.conf" "$T/heapd.log"
sleep 0.2
fd0=$(nfds); rss0=$(rss)
echo "heapd before the load: $fd0 fds, VmRSS $rss0 kB"

# The commands of every rank: the random workload, then free every block
# still held ('try': blocks already freed are refused locally and skipped),
# collect, stats.
{
    echo "random $STEPS"
    awk -v n="$STEPS" 'BEGIN { for (i = 0; i < n; i++) { printf "try free %d ", i; if (i % 80 == 79) print "" } print "" }'
    echo "collect"
    echo "stats"
} >"$T/cmds"

start=$(date +%s)
h=0
while [ $h -lt "$HEAPS" ]; do
    r=0
    while [ $r -lt "$RANKS" ]; do
        "$R" --socket "$S" --heap "load$h" --rank $r --world "$RANKS" --chunk 256K --initial 256K --va 64M \
            --seed $((h * 7919 + 1)) $( [ $((h % 2)) = 1 ] && echo "--policy seed") \
            <"$T/cmds" >"$T/load$h.$r.out" 2>"$T/load$h.$r.err" &
        pids="$pids $!"
        r=$((r + 1))
    done
    h=$((h + 1))
done
nclients=$(echo $pids | wc -w)

# Sample heapd while the clients run.
peak_rss=$rss0; peak_fds=$fd0
while :; do
    alive=0
    for p in $pids; do kill -0 "$p" 2>/dev/null && { alive=1; break; }; done
    [ $alive = 0 ] && break
    x=$(rss); [ -n "$x" ] && [ "$x" -gt "$peak_rss" ] && peak_rss=$x
    x=$(nfds); [ "$x" -gt "$peak_fds" ] && peak_fds=$x
    [ $(($(date +%s) - start)) -gt 300 ] && { echo "load still running after 300 s: killing it"; break; }
    sleep 0.2
done
allok=1
for p in $pids; do
    if kill -0 "$p" 2>/dev/null; then kill -9 "$p"; allok=0; fi
    wait "$p" || allok=0
done
pids=
end=$(date +%s)
check "$nclients client processes ($HEAPS heaps x $RANKS ranks) all exit 0" test $allok = 1
if [ $allok = 0 ]; then
    for f in "$T"/load*.err; do [ -s "$f" ] && echo "    $(basename "$f"): $(tail -1 "$f")"; done | head -10
fi

# Offsets identical within each heap; operation counts.
same=1; allocs=0; collects=0; frees=0; zero=1; seqok=1
h=0
while [ $h -lt "$HEAPS" ]; do
    grep '^a ' "$T/load$h.0.out" >"$T/a.ref"
    r=0
    while [ $r -lt "$RANKS" ]; do
        grep '^a ' "$T/load$h.$r.out" >"$T/a.cur"
        cmp -s "$T/a.ref" "$T/a.cur" || { same=0; echo "    heap load$h: rank $r's offsets differ from rank 0's"; }
        allocs=$((allocs + $(wc -l <"$T/a.cur")))
        collects=$((collects + $(grep -c '^c ' "$T/load$h.$r.out")))
        f=$(sed -n "s/^s client .* frees=\\([0-9]*\\).*/\\1/p" "$T/load$h.$r.out")
        frees=$((frees + ${f:-0}))
        # after the last collect, while every rank is still attached
        grep -q "^s rank rank=$r attached=1 .*live=0 released=0 next_seq=$STEPS\$" "$T/load$h.$r.out" || seqok=0
        r=$((r + 1))
    done
    grep -q '^s heap .* live=0 released=0 ' "$T/load$h.0.out" || { zero=0; grep '^s heap' "$T/load$h.0.out" | sed 's/^/    /'; }
    h=$((h + 1))
done
check "offsets identical on the $RANKS ranks of every heap" test $same = 1
check "every heap ends with 0 live and 0 released bytes after the ranks freed everything and collected (no block lost)" \
    test $zero = 1
check "every rank ends at allocation $STEPS with nothing held or released (heapd's per-rank view)" test $seqok = 1
echo "load: $allocs allocations, $frees frees, $collects collect replies, $nclients processes, $((end - start)) s"
check "tens of thousands of operations ($((allocs + frees + collects)))" test $((allocs + frees + collects)) -ge 20000

# fds and memory.
i=0; while [ "$(nfds)" != "$fd0" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
fd1=$(nfds); rss1=$(rss)
echo "heapd: fds $fd0 before, peak $peak_fds, $fd1 after; VmRSS $rss0 kB before, peak $peak_rss kB, $rss1 kB after"
check "no fd leak: heapd's fd count back to $fd0 after every client left ($fd1)" test "$fd1" = "$fd0"
"$CTL" --socket "$S" heaps >"$T/heaps.txt" 2>&1
check "every heap destroyed (heapctl heaps empty; $(grep -c 'destroyed' "$T/heapd.log") destroyed in the log)" \
    test ! -s "$T/heaps.txt"
# Bound: per connection a 64 KiB read buffer and reply queues (64 x ~100 KiB),
# per heap the allocator's bookkeeping (~2 bits per min_block of a 64 MiB
# extent, hash table, decision log trimmed to the slowest rank: well under
# 1 MiB) and the status pages: 6.4 + 16 = ~23 MiB; 48 MiB leaves room for
# malloc's fragmentation. Sanitizer builds: x6 (ASan's quarantine, shadow and
# size-class regions, and the allocator validation after every call, grow
# with the number of allocations: ~105 MiB measured for this load).
bound=49152; [ $asan = 1 ] && bound=294912
check "heapd's memory stays bounded: peak $((peak_rss - rss0)) kB over the start (bound $bound kB)" \
    test $((peak_rss - rss0)) -le $bound
check "heapd's memory after the load: $((rss1 - rss0)) kB over the start (bound $bound kB)" \
    test $((rss1 - rss0)) -le $bound

kill -TERM "$hpid"; wait "$hpid"; rc=$?; hpid=
check "heapd stops on SIGTERM with exit 0 ($rc)" test $rc = 0
clean_log "$T/heapd.log"
if [ $fails != 0 ]; then
    echo "--- heapd log (tail)"; tail -20 "$T/heapd.log"
fi
echo "it_load: $fails failure(s)"
[ $fails = 0 ]
