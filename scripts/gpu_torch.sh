#!/bin/sh
# gpu_torch.sh - issue 17's GPU part alone (scripts/gpu.sh runs the same as its
# step "python/heapd and torch"): its own cuda-backend heapd on a temporary
# socket, then tests/gpu/test_torch_gpu.py and bench/torch_bench.py.
#
#     sh scripts/gpu_torch.sh [BUILD]     (default build-gpu, made with make STATIC=1 BUILD=build-gpu)
#
# Every step is bounded (pytest 200 s with 60 s per case, bench 180 s).
# Output: stdout, and torch_gpu.log / torch_bench.json / heapd_torch.log in
# $OUT when set. GPU_SH_HOST=1: host backend, the bench's CPU subset.
# Exit 0 when both passed.
set -u
B=${1:-build-gpu}
BE=cuda; BOPT=
[ "${GPU_SH_HOST:-0}" = 1 ] && { BE=host; BOPT=--host; }
BUILD=$B
. "$(dirname "$0")/../tests/lib.sh"
lib_tmpdir torch
S=$T/heapd.sock
O=${OUT:-$T}
hpid=
lib_on_exit 'lib_kill hpid'
PYT=
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, pytest' >/dev/null 2>&1; then PYT=$p; break; fi
done
[ -n "$PYT" ] || { echo "gpu_torch.sh: FAIL no python3 with torch and pytest"; exit 1; }
printf 'socket = %s\nbackend = %s\nlog_level = info\nchunk_size = 64M\nva_size = 64G\ncollect_timeout_ms = 60000\n' \
    "$S" "$BE" >"$T/heapd.conf"
start_heapd "$T/heapd.conf" "$O/heapd_torch.log" || { cat "$O/heapd_torch.log"; echo "gpu_torch.sh: FAIL heapd did not start"; exit 1; }
export HEAPD_SOCKET=$S HEAPD_BUILD=$B HEAPC_LIB=$B/libheapc.so HEAPC_TORCH_LIB=$B/libheapc_torch.so \
    PYTHONPATH=python PYTHONDONTWRITEBYTECODE=1
fails=0
{
    echo "gpu_torch.sh: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), build $B, backend $BE, $PYT"
    if [ $BE = cuda ]; then
        HEAPD_GPU_CASE_TIMEOUT=60 timeout 200 "$PYT" -m pytest -p no:cacheprovider -q -ra tests/gpu/test_torch_gpu.py
        echo "torch_gpu exit $?"
    else
        echo "skipped: tests/gpu/test_torch_gpu.py (host dry run: no GPU)"
    fi
    timeout 180 "$PYT" bench/torch_bench.py $BOPT --build "$B" --json "$O/torch_bench.json"
    echo "torch_bench exit $?"
    # Issue 31: the one-shot all-reduce over heap.bases, 2 processes on GPU 0
    # (Triton), timed beside torch.distributed.all_reduce of the same size.
    if [ $BE = cuda ] && "$PYT" -c 'import triton' 2>/dev/null; then
        for n in 262144 4194304; do
            timeout 120 "$PYT" examples/allreduce_triton.py --nproc 2 --elements $n --iters 100
            echo "allreduce_triton exit $?"
        done
    elif [ $BE = cuda ]; then
        echo "skipped: examples/allreduce_triton.py (no triton for $PYT)"
    else
        timeout 120 "$PYT" examples/allreduce_triton.py --nproc 2 --cpu --elements 65536 --iters 20
        echo "allreduce_triton exit $?"
    fi
} 2>&1 | tee "$O/torch_gpu.log"
grep -q '^allreduce_triton exit [1-9]' "$O/torch_gpu.log" && fails=1
grep -q '^torch_gpu exit [1-9]' "$O/torch_gpu.log" && fails=1
grep -q '^torch_bench exit 0' "$O/torch_gpu.log" || fails=1
kill -TERM "$hpid"; wait "$hpid"; hpid=
if [ $fails = 0 ]; then echo "gpu_torch.sh: all passed"; else echo "gpu_torch.sh: FAILED"; fi
exit $fails
