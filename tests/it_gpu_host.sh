#!/bin/sh
# it_gpu_host.sh - the host dry run of the GPU script (scripts/gpu.sh with
# GPU_SH_HOST=1): the same programs as on the GPU machine (prog_gpu_ranks,
# gpu_bench, check_backend, check_nccl, nccl_bench (nccl_multi_bench: skipped, it needs 2+ GPUs), heapctl, reattach_bench,
# release_bench, train_bench) against a real heapd on the host backend. A change that
# breaks the GPU tests fails here, on a CPU machine. Also: the script stays
# within its budget when steps cannot run, and says so.
#
# Run by tests/run.sh (BUILD = build dir, HEAPD_SRC = source root); exit 0 =
# pass.
set -u
BUILD=${BUILD:-build}
HEAPD_SRC=${HEAPD_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
W=$BUILD/tests/gpu_host
rm -rf "$W"
mkdir -p "$W/out" "$W/out2"
. "$HEAPD_SRC/tests/lib.sh"

cd "$HEAPD_SRC" || exit 1
case $BUILD in /*) B=$BUILD;; *) B=$HEAPD_SRC/$BUILD;; esac

# 1. The dry run passes, every step that can run here.
OUT=$W/out GPU_SH_HOST=1 sh scripts/gpu.sh "$B" >"$W/run.log" 2>&1; rc=$?
R=$W/out/results.txt
if [ $rc = 0 ]; then ok "gpu.sh host dry run: exit 0"; else fail "gpu.sh host dry run: exit $rc"; tail -60 "$W/run.log"; fi
for t in build check_backend heapd_start gpu_ranks_2 gpu_ranks_4 gpu_ranks_default_sync stream_free heapctl_stats gpu_bench reattach release \
         check_nccl nccl_bench heapd_stop; do
    if grep -q "^$t|ok|" "$R" 2>/dev/null; then ok "step $t: ok"; else fail "step $t: $(grep "^$t|" "$R" 2>/dev/null || echo 'not run')"; fi
done
# issue 32's multi-GPU bench needs 2+ GPUs: on the host its step skips visibly (tests/it_nccl_multi.sh runs its dry run)
if grep -q "^nccl_multi|skipped|needs 2+ GPUs" "$R"; then ok "step nccl_multi: skipped (needs 2+ GPUs)"; else fail "step nccl_multi: $(grep "^nccl_multi|" "$R" || echo 'not run')"; fi
if grep -q "^skipped: needs 2+ GPUs" "$W/out/gpu.log"; then ok "nccl_multi: a 'skipped: needs 2+ GPUs' line"; else fail "nccl_multi: no 'skipped: needs 2+ GPUs' line in gpu.log"; fi
# issue 17's step: on the host, the GPU tests skip and torch_bench runs its CPU subset
if nm -D "$B/libheapc.so" 2>/dev/null | grep -q __asan_init; then
    if grep -q "^torch_gpu|skipped|sanitizer build" "$R"; then ok "step torch_gpu: skipped visibly (sanitizer build)"; else fail "step torch_gpu: $(grep "^torch_gpu|" "$R" || echo 'not run')"; fi
elif /usr/bin/python3 -c 'import torch, pytest' >/dev/null 2>&1 || python3 -c 'import torch, pytest' >/dev/null 2>&1; then
    if grep -q "^torch_bench|ok|" "$R"; then ok "step torch_bench: ok"; else fail "step torch_bench: $(grep "^torch_bench|" "$R" || echo 'not run')"; fi
    if grep -q "^torch_gpu|skipped|" "$R"; then ok "step torch_gpu: skipped visibly"; else fail "step torch_gpu: $(grep "^torch_gpu|" "$R" || echo 'not run')"; fi
    # issue 27's training loop: the small CPU model, torch against heap tensors, 1 and 2 ranks
    if grep -q "^train|ok|host dry run" "$R"; then ok "step train: ok"; else fail "step train: $(grep "^train|" "$R" || echo 'not run')"; fi
    if grep -q "^train mode host$" "$W/out/gpu.log"; then ok "train: host marker"; else fail "train: no 'train mode host' line in gpu.log"; fi
    for c in 1rank 2rank; do
        for k in torch_step_ms heap_step_ms step_ratio heap_peak_mib collects growths eager_reclaims; do
            if grep -q "^train ${c}_$k [0-9]" "$W/out/gpu.log"; then ok "train ${c}_$k"; else fail "train ${c}_$k missing from gpu.log"; fi
        done
        if grep -qE "^train ${c}_target_step (met|missed) " "$W/out/gpu.log"; then ok "train ${c}_target_step"; else fail "train ${c}_target_step missing"; fi
    done
    if grep -q "^train result ok$" "$W/out/gpu.log"; then ok "train: result ok"; else fail "train: $(grep '^train result' "$W/out/gpu.log" || echo 'no result line')"; fi
    if grep -q "^train .*FAIL" "$W/out/gpu.log"; then fail "train: a run failed: $(grep -m1 '^train .*FAIL' "$W/out/gpu.log")"; else ok "train: no run failed"; fi
    # its failure path: a heap run that cannot attach says why in a FAIL line, the torch run still
    # gives its figures, and the bench exits 1
    PYT=/usr/bin/python3; $PYT -c 'import torch' 2>/dev/null || PYT=python3
    HEAPD_SOCKET=$W/no.sock HEAPC_LIB=$B/libheapc.so PYTHONPATH=python timeout 300 $PYT bench/train_bench.py \
        --host --build "$B" --rounds 1 --configs 1 >"$W/train_fail.log" 2>&1; rc=$?
    if [ $rc = 1 ] && grep -q "^train 1rank_heap FAIL round 0: rank 0: HeapdConnectionError: cannot connect to heapd at $W/no.sock" "$W/train_fail.log" &&
        grep -q "^train 1rank_torch_step_ms [0-9]" "$W/train_fail.log" && grep -q "^train result FAIL" "$W/train_fail.log"; then
        ok "train_bench: a failed heap run prints why, exit 1"
    else
        fail "train_bench without heapd: exit $rc, $(grep -m1 FAIL "$W/train_fail.log" || tail -3 "$W/train_fail.log")"
    fi
else
    echo "skipped: torch_bench (no python3 with torch and pytest)"
fi
# the figures the GPU table is made of (issue 18's: the triggering allocation, both rounds)
for k in alloc_stream_us_slowest_rank alloc_hook_us_slowest_rank; do
    if grep -q "stream_free $k [0-9]" "$W/out/gpu.log"; then ok "timing stream_free $k"; else fail "timing stream_free $k missing from gpu.log"; fi
done
for k in reattach_ms_per_rank file_load_ms; do
    if grep -q "reattach $k [0-9]" "$W/out/gpu.log"; then ok "timing reattach $k"; else fail "timing reattach $k missing from gpu.log"; fi
done
# issue 30's: release and restore against the pinned copy (host: memcpy)
for k in release_discard_ms restore_discard_ms release_host_ms restore_host_ms release_host_keep_ms \
         restore_host_keep_ms d2h_gib_s h2d_gib_s release_host_over_pinned restore_host_over_pinned \
         device_free_growth_over_released; do
    if grep -q "release $k [0-9-]" "$W/out/gpu.log"; then ok "timing release $k"; else fail "timing release $k missing from gpu.log"; fi
done
for k in growth_slowest_rank_us growth_median_rank_us alloc_rtt_median_us attach_us; do
    if grep -q "ranks4 $k [0-9]" "$W/out/gpu.log"; then ok "timing ranks4 $k"; else fail "timing ranks4 $k missing from gpu.log"; fi
done
for f in gpu.log results.txt heapd.log stats.json gpu_bench.json nccl_bench.json; do
    if [ -s "$W/out/$f" ]; then ok "\$OUT/$f written"; else fail "\$OUT/$f missing"; fi
done
n=$(ls "$W/out" | wc -l)
if [ "$n" -le 8 ]; then ok "at most 8 files in \$OUT ($n)"; else fail "$n files in \$OUT (the device tool returns 8)"; fi
if grep -qE "^gpu.sh: (all passed|FAILED)$" "$W/out/gpu.log"; then ok "gpu.log ends with the verdict"; else fail "no verdict in gpu.log"; fi

# 2. No time left: every step fails at once, saying so, and the script ends.
OUT=$W/out2 GPU_SH_HOST=1 GPU_SH_BUDGET=1 sh scripts/gpu.sh "$B" >"$W/run2.log" 2>&1; rc=$?
if [ $rc = 1 ]; then ok "budget spent: exit 1"; else fail "budget spent: exit $rc, want 1"; fi
if grep -q "^gpu_ranks_2|FAIL|no time left" "$W/out2/results.txt"; then ok "budget spent: the step says 'no time left'"
else fail "budget spent: $(grep gpu_ranks_2 "$W/out2/results.txt")"; fi
if grep -q "^train|FAIL|no time left" "$W/out2/results.txt" || ! grep -q "^torch_bench|" "$W/out2/results.txt"; then
    ok "budget spent: the train step says 'no time left' (or the python steps did not apply)"
else fail "budget spent: $(grep '^train|' "$W/out2/results.txt" || echo 'train: no result')"; fi
if grep -q "^heapd_stop|ok|" "$W/out2/results.txt"; then ok "budget spent: heapd still stopped cleanly"
else fail "budget spent: $(grep heapd_stop "$W/out2/results.txt")"; fi
if ls /tmp/heapd-gpu.* >/dev/null 2>&1 && [ -n "$(find /tmp -maxdepth 1 -name 'heapd-gpu.*' -newer "$W/run.log" 2>/dev/null)" ]; then
    fail "gpu.sh left its work folder in /tmp"
else
    ok "gpu.sh removed its work folder"
fi

echo "it_gpu_host: $passes passed, $fails failure(s)"
[ $fails = 0 ]
