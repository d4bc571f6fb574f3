#!/bin/sh
# gpu.sh - the GPU tests and benchmark of heapd's cuda backend (issue 4), for a
# machine with an NVIDIA GPU. Builds nothing: give it a build folder made with
#     make HEAPD_INNER=1 STATIC=1 BUILD=build-gpu -j all
# (STATIC=1: the binaries need only libc there, and load libcuda with dlopen).
#
#     sh scripts/gpu.sh [BUILD]        (default build-gpu; run from the repo root)
#
# Runs: check_backend (its cuda TCase must run, not skip); heapd with
# backend = cuda on a temporary socket; prog_gpu_ranks with 2 and 4 rank
# processes (hook = cuCtxSynchronize) and 2 ranks with libheapc's default
# device sync; `heapctl stats` while a heap is attached (DEVICE_FREE/TOTAL must
# be nonzero); gpu_bench against that heapd; heapd's clean stop. Prints a
# table LAST: test | result, then the timings and the bench table.
# Everything goes to /tmp/heapd-gpu-out (gpu.log, results.txt, heapd.log,
# stats.txt, stats.json, gpu_bench.json) and, when $OUT is set, into $OUT too.
# Exit 0 when every test passed, 1 otherwise.
# GPU_SH_HOST=1 is a dry run of this script on a CPU machine: host backend,
# CPU stores, small bench sizes (it proves the script, not the GPU).
set -u
B=${1:-build-gpu}
BE=cuda; RANKOPT=; BENCHOPT=
if [ "${GPU_SH_HOST:-0}" = 1 ]; then BE=host; RANKOPT="--host --chunk 32M"; BENCHOPT="--backend host --sizes 4K,2M,64M"; fi
O=/tmp/heapd-gpu-out
rm -rf "$O"
mkdir -p "$O"
RES=$O/results.txt
: >"$RES"
T=$(mktemp -d /tmp/heapd-gpu.XXXXXX)
S=$T/heapd.sock
hpid=

result() { # result NAME ok|FAIL|skipped [DETAIL]
    printf '%s|%s|%s\n' "$1" "$2" "${3:-}" >>"$RES"
    echo "== $1: $2${3:+ ($3)}"
}

cleanup() {
    [ -n "$hpid" ] && kill -9 "$hpid" 2>/dev/null
    rm -rf "$T"
}

main() {
    trap cleanup EXIT INT TERM
    echo "gpu.sh: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), build $B, $(uname -srm)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader \
            | sed 's/^/gpu.sh: GPU: /'
    else
        echo "gpu.sh: no nvidia-smi on PATH"
    fi
    for f in heapd heapctl tests/check_backend tests/prog_gpu_ranks bench/gpu_bench; do
        if [ ! -x "$B/$f" ]; then
            result build FAIL "$B/$f is missing: build with make HEAPD_INNER=1 STATIC=1 BUILD=$B all"
            return
        fi
    done
    result build ok "$B"

    # 1. check_backend: host, map_host and cuda TCases.
    echo; echo "== check_backend"
    CK_VERBOSITY=verbose timeout 300 "$B/tests/check_backend" >"$T/cb.out" 2>&1; rc=$?
    cat "$T/cb.out"
    if [ $rc = 0 ] && [ $BE = cuda ] && grep -q 'skipped: no GPU' "$T/cb.out"; then
        result check_backend FAIL "the cuda TCase was skipped: no GPU seen"
    elif [ $rc = 0 ]; then
        result check_backend ok "$(grep -E '^[0-9]+%:' "$T/cb.out" | tail -1)"
    else
        result check_backend FAIL "exit $rc"
    fi

    # 2. heapd, cuda backend.
    cat >"$T/heapd.conf" <<EOF
socket = $S
backend = $BE
log_level = info
chunk_size = 64M
va_size = 64G
collect_timeout_ms = 60000
EOF
    echo; echo "== heapd (backend $BE)"
    "$B/heapd" --config "$T/heapd.conf" 2>"$O/heapd.log" &
    hpid=$!
    i=0
    while [ ! -S "$S" ] && [ $i -lt 200 ] && kill -0 "$hpid" 2>/dev/null; do sleep 0.05; i=$((i + 1)); done
    if [ ! -S "$S" ]; then
        cat "$O/heapd.log"
        result heapd_start FAIL "heapd did not listen on $S"
        return
    fi
    head -5 "$O/heapd.log"
    if grep -q "backend $BE" "$O/heapd.log"; then
        result heapd_start ok "backend $BE"
    else
        result heapd_start FAIL "heapd is not on the $BE backend"
    fi

    # 3. rank processes on the GPU.
    STATS="$B/heapctl --socket $S stats >$O/stats.txt 2>&1; $B/heapctl --socket $S --json stats >$O/stats.json 2>&1"
    for n in 2 4; do
        echo; echo "== prog_gpu_ranks --ranks $n"
        if [ $n = 2 ]; then
            timeout 300 "$B/tests/prog_gpu_ranks" --socket "$S" --ranks $n --heap "ranks$n" $RANKOPT \
                --while-attached "$STATS" >"$T/r$n.out" 2>&1; rc=$?
        else
            timeout 300 "$B/tests/prog_gpu_ranks" --socket "$S" --ranks $n --heap "ranks$n" $RANKOPT \
                >"$T/r$n.out" 2>&1; rc=$?
        fi
        cat "$T/r$n.out"
        sed -n "s/^t \([a-z0-9_]*\) \(.*\)/ranks$n \1 \2/p" "$T/r$n.out" >>"$O/timings.txt"
        if [ $rc = 0 ]; then
            result "gpu_ranks_$n" ok "peer writes, growth, symmetric offsets"
        else
            result "gpu_ranks_$n" FAIL "exit $rc"
        fi
    done
    echo; echo "== prog_gpu_ranks --ranks 2 --no-hook (libheapc's default device sync)"
    timeout 300 "$B/tests/prog_gpu_ranks" --socket "$S" --ranks 2 --heap defsync --no-hook $RANKOPT \
        >"$T/rd.out" 2>&1; rc=$?
    cat "$T/rd.out"
    if [ $rc = 0 ]; then result gpu_ranks_default_sync ok; else result gpu_ranks_default_sync FAIL "exit $rc"; fi

    # 4. heapctl stats while the 2-rank heap was attached.
    echo; echo "== heapctl stats (taken while 2 ranks were attached)"
    cat "$O/stats.txt" 2>/dev/null
    df=$(sed -n 's/.*"device_free": \([0-9]*\).*/\1/p' "$O/stats.json" 2>/dev/null | head -1)
    dt=$(sed -n 's/.*"device_total": \([0-9]*\).*/\1/p' "$O/stats.json" 2>/dev/null | head -1)
    if [ -n "$df" ] && [ -n "$dt" ] && [ "$df" != 0 ] && [ "$dt" != 0 ] &&
        grep -q "\"backend\": \"$BE\"" "$O/stats.json"; then
        result heapctl_stats ok "device_free $df, device_total $dt"
    else
        result heapctl_stats FAIL "device_free '${df:-}' device_total '${dt:-}' (want nonzero, backend $BE)"
    fi

    # 5. the benchmark, against this heapd.
    echo; echo "== gpu_bench"
    timeout 400 "$B/bench/gpu_bench" --socket "$S" --require-gpu $BENCHOPT --json "$O/gpu_bench.json" \
        >"$T/bench.out" 2>&1; rc=$?
    cat "$T/bench.out"
    if [ $rc = 0 ]; then result gpu_bench ok; else result gpu_bench FAIL "exit $rc"; fi

    # 5b. libheapc_nccl with real NCCL (a one-rank communicator on this GPU).
    if [ -x "$B/tests/check_nccl" ]; then
        echo; echo "== check_nccl (real NCCL)"
        HEAPD="$B/heapd" CK_DEFAULT_TIMEOUT=60 timeout 150 "$B/tests/check_nccl" >"$T/nccl.out" 2>&1; rc=$?
        tail -20 "$T/nccl.out"
        if [ $rc = 0 ] && [ $BE = cuda ] && grep -q 'skipped: no GPU' "$T/nccl.out"; then
            result check_nccl FAIL "the real-NCCL TCase was skipped"
        elif [ $rc = 0 ]; then
            result check_nccl ok "$(grep -E '^[0-9]+%:' "$T/nccl.out" | tail -1)"
        else
            result check_nccl FAIL "exit $rc"
        fi
    fi
    # 5c. probe cost: the status page against cudaMemGetInfo and torch.
    if [ -x "$B/bench/nccl_bench" ]; then
        echo; echo "== nccl_bench (probe cost)"
        timeout 120 "$B/bench/nccl_bench" --quick --json "$O/nccl_bench.json" >"$T/nb.out" 2>&1; rc=$?
        cat "$T/nb.out"
        if [ $rc = 0 ]; then result nccl_bench ok; else result nccl_bench FAIL "exit $rc"; fi
    fi
    if command -v python3 >/dev/null 2>&1; then
        echo; echo "== torch anchors (caching allocator, memory probes)"
        timeout 150 python3 scripts/torch_probe.py "$O/torch.json" >"$T/torch.out" 2>&1; rc=$?
        cat "$T/torch.out"
        if [ $rc = 0 ]; then result torch_anchors ok "$(grep -c '^torch ' "$T/torch.out") figures"; \
        else result torch_anchors FAIL "exit $rc"; fi
    fi

    # 5d. issue 17: python/heapd with torch on this GPU (tests/gpu/test_torch_gpu.py:
    # CUDA tensors, peer writes between two processes, the allocator route,
    # NCCL world 1 under the preload library, the example) and bench/torch_bench.py.
    # Host dry run: the bench's CPU subset; the GPU tests skip visibly.
    PYT=
    for p in python3 /usr/bin/python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, pytest' >/dev/null 2>&1; then PYT=$p; break; fi
    done
    if [ -z "$PYT" ]; then
        result torch_gpu skipped "no python3 with torch and pytest"
    elif [ ! -f "$B/libheapc.so" ] || [ ! -f "$B/libheapc_nccl_preload.so" ] || [ ! -f "$B/libheapc_torch.so" ]; then
        result torch_gpu FAIL "$B lacks libheapc.so / libheapc_nccl_preload.so / libheapc_torch.so (make STATIC=1 BUILD=$B)"
    else
        echo; echo "== python/heapd and torch ($PYT)"
        PYENV="HEAPD_SOCKET=$S HEAPD_BUILD=$B HEAPC_LIB=$B/libheapc.so HEAPC_TORCH_LIB=$B/libheapc_torch.so PYTHONPATH=python PYTHONDONTWRITEBYTECODE=1"
        if [ $BE = cuda ]; then
            env $PYENV HEAPD_GPU_CASE_TIMEOUT=60 timeout 200 "$PYT" -m pytest -p no:cacheprovider -q -ra \
                tests/gpu/test_torch_gpu.py >"$T/tg.out" 2>&1; rc=$?
            cat "$T/tg.out"
            if [ $rc = 0 ] && ! grep -q SKIPPED "$T/tg.out"; then
                result torch_gpu ok "$(tail -1 "$T/tg.out")"
            else
                result torch_gpu FAIL "exit $rc: $(tail -1 "$T/tg.out")"
            fi
            BOPT=
        else
            result torch_gpu skipped "host dry run: no GPU (bench's CPU subset only)"
            BOPT=--host
        fi
        env $PYENV timeout 180 "$PYT" bench/torch_bench.py $BOPT --build "$B" --json "$O/torch_bench.json" \
            >"$T/tb.out" 2>&1; rc=$?
        cat "$T/tb.out"
        if [ $rc = 0 ]; then result torch_bench ok "$(grep -c '^torch_bench ' "$T/tb.out") figures"; \
        else result torch_bench FAIL "exit $rc"; fi
    fi

    # 6. heapd stops cleanly.
    echo; echo "== heapd stop"
    kill -TERM "$hpid"; wait "$hpid"; rc=$?; hpid=
    tail -5 "$O/heapd.log"
    if [ $rc = 0 ] && [ ! -e "$S" ]; then
        result heapd_stop ok "exit 0, socket removed"
    else
        result heapd_stop FAIL "exit $rc"
    fi
    if grep -E ' (error|warn):' "$O/heapd.log" >/dev/null; then
        echo "heapd logged warnings or errors:"; grep -E ' (error|warn):' "$O/heapd.log" | head -20
    fi
}

trap cleanup EXIT INT TERM
: >"$O/timings.txt"
main 2>&1 | tee "$O/gpu.log"

{
    echo
    echo "================ heapd GPU tests ($B) ================"
    printf '%-24s | %s\n' test result
    printf '%-24s-+-%s\n' ------------------------ ------
    while IFS='|' read -r n r d; do
        printf '%-24s | %s%s\n' "$n" "$r" "${d:+  ($d)}"
    done <"$RES"
    echo
    echo "timings (us; prog_gpu_ranks: rank 0 = the rank whose allocation grew the heap):"
    sed 's/^/  /' "$O/timings.txt"
    if [ -f "$O/gpu_bench.json" ]; then
        echo
        echo "gpu_bench (medians, us):"
        grep '^|' "$O/gpu.log"
    fi
    if [ -f "$O/torch.json" ]; then
        echo
        echo "torch anchors (us):"
        grep '^torch ' "$O/gpu.log" | sed 's/^/  /'
    fi
    if [ -f "$O/torch_bench.json" ]; then
        echo
        echo "python/heapd against torch (us):"
        grep '^torch_bench ' "$O/gpu.log" | sed 's/^torch_bench /  /'
    fi
    if [ -f "$O/nccl_bench.json" ]; then
        echo
        echo "probe cost (ns) by live blocks:"
        grep -E '^ +[0-9]+ +[0-9]+ ' "$O/gpu.log" | sed 's/^/  /'
    fi
} | tee -a "$O/gpu.log"

if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    for f in gpu.log results.txt heapd.log stats.txt stats.json gpu_bench.json timings.txt torch.json nccl_bench.json torch_bench.json; do
        [ -f "$O/$f" ] && cp "$O/$f" "$OUT/"
    done
fi
if grep -q '|FAIL|' "$RES" || ! grep -q '^gpu_bench|ok' "$RES"; then
    echo "gpu.sh: FAILED"
    exit 1
fi
echo "gpu.sh: all passed"
exit 0
