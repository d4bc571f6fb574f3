#!/bin/sh
# it_resume_example.sh - examples/train_resume.py (issue 29) against a real
# heapd (host backend), 2 ranks set up by environment variables as torchrun
# would (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID): both ranks
# are killed with SIGKILL mid-run, the heap stays (persist), the ranks are
# started again the same way and re-attach. Checked: they resume from the
# committed step (the last `step K` rank 0 printed, or K + 1 when that commit
# completed unseen), the first loss after the resume is the one the killed
# run computed for that step when it printed it (same state, same batch:
# 1e-5), else within 25% of the last loss before the kill, and far below the
# initial loss; the job then makes every step, and its losses are those of
# the same job never killed (run after it on another heap), to the printed
# digit; heapctl drop releases the heap. Skips visibly without torch or under a sanitizer build (python
# cannot load an ASan libheapc; it_python skips too). Run by tests/run.sh;
# scripts/gpu.sh runs it with RESUME_BACKEND=cuda (a cuda heapd, the state on
# the GPU).
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
PY=${HEAPD_PYTHON:-/usr/bin/python3}
STEPS=${RESUME_STEPS:-240}
BACKEND=${RESUME_BACKEND:-host} # scripts/gpu.sh: cuda (the state on the GPU)
DEVOPT=--cpu
[ "$BACKEND" = cuda ] && DEVOPT=
. "$SRC/tests/lib.sh"
lib_tmpdir rex
S=$T/heapd.sock
hpid= rpids=
lib_on_exit 'lib_kill rpids hpid'
if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "skipped: train_resume.py ($PY cannot import torch; scripts/deps.sh installs python3-torch)"
    exit 0
fi
if nm -D "$BUILD/libheapc.so" 2>/dev/null | grep -q __asan_init; then
    echo "skipped: train_resume.py under a sanitizer build ($BUILD/libheapc.so is ASan-instrumented)"
    exit 0
fi
cat >"$T/heapd.conf" <<EOF
socket = $S
backend = $BACKEND
log_level = info
chunk_size = 2M
va_size = 1G
collect_timeout_ms = 30000
max_persist = 600
EOF
check "heapd starts" start_heapd "$T/heapd.conf" "$T/heapd.log"
hclients() {
    "$BUILD/heapctl" --socket "$S" --json heaps 2>/dev/null |
        sed -n "s/.*{\"name\": \"$1\", \"world_size\": [0-9]*, \"clients\": \([0-9]*\).*/\1/p"
}
start() { # start TAG [HEAP]: both ranks, output in $T/TAG.R
    rpids=
    for r in 0 1; do
        env RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=rex1 HEAPD_SOCKET="$S" \
            HEAPC_LIB="$BUILD/libheapc.so" PYTHONDONTWRITEBYTECODE=1 \
            "$PY" "$SRC/examples/train_resume.py" $DEVOPT --chunk 2M --heap "${2:-rex}" --steps "$STEPS" --step-ms 15 --persist 300 \
            >"$T/$1.$r" 2>"$T/$1.$r.err" &
        rpids="$rpids $!"
    done
}
nsteps() { grep -c '^step ' "$1" 2>/dev/null; }
steps_ge() { [ "$(nsteps "$1")" -ge "$2" ]; }
detached() { [ "$(hclients rex)" = 0 ]; }
start run
within 180 steps_ge "$T/run.0" 60
killed_at=$(nsteps "$T/run.0")
lib_kill rpids
K=$(grep '^step ' "$T/run.0" | tail -1 | cut -d' ' -f2)
check "both ranks ran and were killed mid-run (rank 0 at step ${K:-none} of $STEPS)" \
    sh -c "test -n '$K' && test '$K' -lt $STEPS"
[ -n "$K" ] || { sed 's/^/  | /' "$T/run.0.err" | tail -20; exit 1; }
check "the heap stays detached after the kill" within 20 detached
start res
for p in $rpids; do lib_wait_pid "$p" 300; rcs="${rcs:-} $rc"; done
rpids=
check "the restarted ranks made every step (exit$rcs)" sh -c "test '$rcs' = ' 0 0' && grep -q '^step $STEPS\$' '$T/res.0'"
[ "$rcs" = " 0 0" ] || sed 's/^/  | /' "$T/res.0.err" | tail -20
Sr=$(sed -n 's/^resumed from step \([0-9]*\) (generation \([0-9]*\))$/\1/p' "$T/res.0")
gen=$(sed -n 's/^resumed from step [0-9]* (generation \([0-9]*\))$/\1/p' "$T/res.0")
check "resumed from the committed step ${Sr:-none} (generation ${gen:-?}; the last step printed before the kill: $K)" \
    sh -c "test -n '$Sr' && { test '$Sr' = '$K' || test '$Sr' = $((K + 1)); }"
init=$(sed -n 's/^initial loss //p' "$T/run.0")
first=$(sed -n "s/^loss ${Sr:-x} //p" "$T/res.0" | head -1)
same=$(sed -n "s/^loss ${Sr:-x} //p" "$T/run.0" | tail -1)
last=$(grep '^loss ' "$T/run.0" | tail -1 | cut -d' ' -f3)
if [ -n "$same" ]; then
    check "the first loss after the resume ($first) is the killed run's for step $Sr ($same)" \
        awk -v a="$first" -v b="$same" 'BEGIN { d = a - b; exit !(a != "" && d * d <= 1e-10) }'
else
    check "the first loss after the resume ($first) continues the last before the kill ($last)" \
        awk -v a="$first" -v b="$last" 'BEGIN { d = a - b; exit !(a != "" && (d < 0 ? -d : d) <= 0.25 * b + 1e-4) }'
fi
check "it is not back at the initial loss ($first, initial $init)" \
    awk -v a="$first" -v i="$init" 'BEGIN { exit !(a != "" && a < 0.5 * i) }'
echo "loss: initial $init, last before the kill $last (step $K, killed after $killed_at steps), first after the resume $first, final $(grep '^loss ' "$T/res.0" | tail -1 | cut -d' ' -f3)"
check "heapctl drop releases the heap" "$BUILD/heapctl" --socket "$S" drop rex
# the same job, never killed, on a heap of its own: the killed and resumed job's
# curve is this one, step for step
rcs=
start ref rexref
for p in $rpids; do lib_wait_pid "$p" 300; rcs="${rcs:-} $rc"; done
rpids=
fin=$(grep '^loss ' "$T/res.0" | tail -1 | cut -d' ' -f3)
ref=$(grep '^loss ' "$T/ref.0" | tail -1 | cut -d' ' -f3)
refS=$(sed -n "s/^loss ${Sr:-x} //p" "$T/ref.0")
check "the uninterrupted job (exit$rcs) has the same loss at step $Sr ($refS) and at the end ($ref) as the resumed one ($first, $fin)" \
    sh -c "test '$rcs' = ' 0 0' && test -n '$ref' && test '$ref' = '$fin' && test '$refS' = '$first'"
"$BUILD/heapctl" --socket "$S" drop rexref >/dev/null
kill -TERM "$hpid"; lib_wait_pid "$hpid" 20; hpid=
check "heapd stops cleanly (exit $rc)" test $rc = 0
clean_log "$T/heapd.log"
echo "it_resume_example: $passes passed, $fails failure(s)"
[ $fails = 0 ]
