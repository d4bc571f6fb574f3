#!/bin/sh
# it_stream_free.sh - stream-ordered frees (issue 18) on a real heapd (host
# backend) with real rank processes (tests/prog_stream_free.c, the GPU
# test's program with --host): the host completion source (heapc_hstream)
# holds a freed block "in use" while a thread that stands for the kernel has
# not written into it yet; the collect an allocation triggers does not wait
# for it, the block is not handed out again until the thread finished, and
# the next owner's data survives the thread's write. With the old sync hook
# the collect waits for the thread instead. Also heapctl's new figures.
#
# Run by tests/run.sh (BUILD = build dir, HEAPD_SRC = source root); exit 0 =
# pass.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
P=$BUILD/tests/prog_stream_free
CTL=$BUILD/heapctl
lib_tmpdir sf
S=$T/heapd.sock
hpid= rpid=
lib_on_exit 'lib_kill rpid hpid'

cat >"$T/heapd.conf" <<EOC
socket = $S
backend = host
chunk_size = 64M
va_size = 4G
collect_timeout_ms = 60000
EOC
if start_heapd "$T/heapd.conf" "$T/heapd.log"; then ok "heapd listens"; else fail "heapd did not start: $(cat "$T/heapd.log")"; exit 1; fi

for n in 1 2 4; do
    if "$P" --socket "$S" --ranks $n --host --heap "sf$n" >"$T/r$n.out" 2>&1; then
        ok "prog_stream_free --host --ranks $n"
    else
        fail "prog_stream_free --host --ranks $n:"; sed 's/^/    | /' "$T/r$n.out"
    fi
done
# Every rank of the stream round saw its block wait for the stream, and got
# it back (Z on B's offset) once the thread finished.
w=$(grep -c 'stream: B 0 freed.*kernel still running after it; stream_waiting 1' "$T/r4.out")
if [ "$w" = 4 ]; then ok "4 ranks: the block waited for its stream during the collect"; else
    fail "4 ranks: $w of 4 saw their block wait"; grep 'stream:' "$T/r4.out"; fi
r=$(grep -c 'stream: after the kernel: Z at 0 (reuses B)' "$T/r4.out")
if [ "$r" = 4 ]; then ok "4 ranks: the block was reused once the thread finished"; else
    fail "4 ranks: $r of 4 reused B"; fi
# Issue 27: stream-ordered reuse - every rank reused B on its stream while
# the thread still held it, and its heapc_alloc waited for the stream once.
r=$(grep -c 'reuse: B 0 reused on its stream while the kernel ran (running), no wait' "$T/r4.out")
if [ "$r" = 4 ]; then ok "4 ranks: B reused on its own stream while in use, no wait"; else
    fail "4 ranks: $r of 4 reused B on its stream"; grep 'reuse' "$T/r4.out"; fi

# heapctl shows the new figures: one rank grows a fresh heap (no collect: no
# block exists), collects, grows again (no collect: one just ran).
"$BUILD/tests/prog_rank" --socket "$S" --heap skip --rank 0 --world 1 --chunk 1M --va 64M \
    alloc 2M collect alloc 4M touch "$T/ready" waitfile "$T/go" >"$T/skip.out" 2>&1 &
rpid=$!
n=0
while [ ! -e "$T/ready" ] && [ $n -lt 6000 ] && kill -0 $rpid 2>/dev/null; do sleep 0.05; n=$((n + 1)); done
"$CTL" --socket "$S" --json stats skip >"$T/stats.json" 2>&1
"$CTL" --socket "$S" stats skip >"$T/stats.txt" 2>&1
touch "$T/go"
wait $rpid || fail "prog_rank (heap skip): $(cat "$T/skip.out")"
rpid=
if grep -q '"collects": 1,.*"collects_skipped": 2,' "$T/stats.json"; then
    ok "heapctl --json stats: 1 collect, 2 skipped"
else
    fail "heapctl --json stats, want collects 1 and collects_skipped 2: $(cat "$T/stats.json")"
fi
if grep -q '"stream_waiting": 0, "device_waits_avoided": 0' "$T/stats.json"; then
    ok "heapctl --json stats: per-rank stream_waiting, device_waits_avoided"
else
    fail "heapctl --json stats lacks the per-rank stream figures: $(cat "$T/stats.json")"
fi
if grep -q 'SKIPPED' "$T/stats.txt" && grep -q 'STREAM_WAIT' "$T/stats.txt"; then
    ok "heapctl stats: SKIPPED and STREAM_WAIT columns"
else
    fail "heapctl stats text: $(cat "$T/stats.txt")"
fi

kill -TERM "$hpid"; wait "$hpid"; hpid=
echo "it_stream_free: $passes passed, $fails failure(s)"
[ $fails = 0 ]
