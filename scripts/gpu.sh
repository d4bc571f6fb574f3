#!/bin/sh
# gpu.sh - the GPU tests and benchmark of heapd's cuda backend, for a machine
# with an NVIDIA GPU. Builds nothing: give it a build folder made with
#     make HEAPD_INNER=1 STATIC=1 BUILD=build-gpu -j all
# (STATIC=1: the binaries need only libc there, and load libcuda with dlopen).
#
#     sh scripts/gpu.sh [BUILD]        (default build-gpu; run from the repo root)
#
# Runs: check_backend (its cuda TCase must run, not skip); heapd with
# backend = cuda on a temporary socket and collect_timeout_ms = 15000;
# prog_gpu_ranks with 2 and 4 rank processes (hook = cuCtxSynchronize) and 2
# ranks with libheapc's default (no device sync); prog_stream_free (issue 18:
# stream-ordered frees, a ~50 ms kernel in flight on every rank while an
# allocation triggers a collect, with and without the old sync hook);
# `heapctl stats` while a heap is
# attached (DEVICE_FREE/TOTAL must be nonzero); gpu_bench against that heapd;
# reattach_bench (issue 29: re-attach to a kept 16 GiB heap, <= 100 ms per rank,
# against a file load of the same bytes); release_bench (issue 30: release and restore a
# 2 x 16 GiB heap at the same offsets: discard <= 50 ms, host copies >= 0.80 of a pinned copy);
# check_nccl with real NCCL; nccl_bench; nccl_multi_bench (issue 32: the heap as NCCL windows
# against plain buffers, one rank per GPU; only with 2+ GPUs); torch's anchors; python/heapd with
# torch on the GPU (tests/gpu/test_torch_gpu.py) and bench/torch_bench.py;
# bench/train_bench.py (issue 27: a training loop, torch's caching allocator
# against the whole loop on the heap, 1 and 2 ranks; lines "train KEY VALUE");
# examples/train_resume.py killed and resumed on the GPU (issue 29);
# heapd's clean stop.
# Prints a table LAST: test | result, then the timings and the bench table.
#
# Bounded: the whole script ends within GPU_SH_BUDGET seconds (default 330)
# even when every step hangs. Each step has its own short timeout, cut to
# what is left of the budget; a step with no time left is a FAIL that says so.
#
# Output: into $OUT when it is set (the device tool's folder), else into a
# fresh folder from mktemp -d, named on the first and last lines: gpu.log (all
# of every step's output, written as it goes, so a killed run still has it),
# results.txt, heapd.log, stats.json, gpu_bench.json, nccl_bench.json,
# torch.json, torch_bench.json (8 files: what the device tool returns).
# Exit 0 when every test passed, 1 otherwise.
# GPU_SH_HOST=1 is a dry run of this script on a CPU machine: host backend,
# CPU stores, small bench sizes (it proves the script, not the GPU); make
# check runs it (tests/it_gpu_host.sh).
set -u
B=${1:-build-gpu}
BE=cuda; RANKOPT=; BENCHOPT=; NBOPT=; SFOPT=; RTTOPT=; RAOPT="--size 16G --chunk 256M"; RLOPT="--size 16G --chunk 256M"; SCALE=1; BUDGET=${GPU_SH_BUDGET:-330}
if [ "${GPU_SH_HOST:-0}" = 1 ]; then
    # The dry run runs in make check, on a loaded 2-core machine and under
    # ASan: the step timeouts are 4 times longer, the budget 900 s.
    BE=host; RANKOPT="--host --chunk 32M"; RAOPT="--host --size 128M --chunk 16M"; RLOPT="--host --size 128M --chunk 16M"; BENCHOPT="--backend host --sizes 4K,2M,64M"; NBOPT="--iters 20000 --max-blocks 10000"; SFOPT=--host
    # make check's sanitizer pass: heapd validates its heap at every call
    RTTOPT="--quick --mem-blocks 10000"
    [ "${HEAPD_VALIDATING:-}" = 1 ] && NBOPT="--iters 20000 --max-blocks 1000" && RTTOPT="--quick --iters 200 --mem-blocks 1000"
    SCALE=4; BUDGET=${GPU_SH_BUDGET:-900}
fi
DEADLINE=$(($(date +%s) + BUDGET))
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then O=$OUT; else O=$(mktemp -d /tmp/heapd-gpu-out.XXXXXX) || exit 1; fi
RES=$O/results.txt
: >"$RES"
BUILD=$B
. "$(dirname "$0")/../tests/lib.sh"
lib_tmpdir gpu || exit 1
S=$T/heapd.sock
hpid=

# tmo N: N seconds (times SCALE), or what is left of the budget (less 15 s for the stop and
# the table) when that is shorter; 0 when nothing is left.
tmo() {
    left=$((DEADLINE - $(date +%s) - 15)); want=$(($1 * SCALE))
    if [ $left -le 0 ]; then echo 0; elif [ $want -lt $left ]; then echo $want; else echo $left; fi
}
# step NAME SECONDS CMD...: runs CMD under timeout (its whole process group is
# killed at the end), output to $T/NAME.out and then the log; sets rc (124:
# timed out, 125: no time was left).
step() {
    sn=$1; st=$(tmo "$2"); shift 2
    if [ "$st" = 0 ]; then
        echo "gpu.sh: no time left in the ${BUDGET} s budget for $sn" >"$T/$sn.out"; rc=125
    else
        timeout -k 5 "$st" "$@" >"$T/$sn.out" 2>&1; rc=$?
        [ $rc = 124 ] || [ $rc = 137 ] && echo "gpu.sh: $sn timed out after $st s" >>"$T/$sn.out"
    fi
    cat "$T/$sn.out"
}
why() { # why RC: the detail for a failed step
    case $1 in 124|137) echo "timed out";; 125) echo "no time left";; *) echo "exit $1";; esac
}

result() { # result NAME ok|FAIL|skipped [DETAIL]
    printf '%s|%s|%s\n' "$1" "$2" "${3:-}" >>"$RES"
    echo "== $1: $2${3:+ ($3)}"
}

# main runs in a subshell (its output goes through tee), so it records
# heapd's pid in a file for the cleanup of the outer shell (lib.sh's, which
# then removes $T).
kill_heapd() { [ -s "$T/heapd.pid" ] && kill -9 "$(cat "$T/heapd.pid")" 2>/dev/null; }

main() {
    echo "gpu.sh: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), build $B, $(uname -srm)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader \
            | sed 's/^/gpu.sh: GPU: /'
    else
        echo "gpu.sh: no nvidia-smi on PATH"
    fi
    for f in heapd heapctl tests/check_backend tests/prog_gpu_ranks tests/prog_stream_free bench/gpu_bench; do
        if [ ! -x "$B/$f" ]; then
            result build FAIL "$B/$f is missing: build with make HEAPD_INNER=1 STATIC=1 BUILD=$B all"
            return
        fi
    done
    result build ok "$B"

    # 1. check_backend: host, map_host and cuda TCases.
    echo; echo "== check_backend"
    step cb 90 env CK_VERBOSITY=verbose CK_DEFAULT_TIMEOUT=60 "$B/tests/check_backend"
    if [ $rc = 0 ] && [ $BE = cuda ] && grep -q 'skipped: no GPU' "$T/cb.out"; then
        result check_backend FAIL "the cuda TCase was skipped: no GPU seen"
    elif [ $rc = 0 ]; then
        result check_backend ok "$(grep -E '^[0-9]+%:' "$T/cb.out" | tail -1)"
    else
        result check_backend FAIL "$(why $rc)"
    fi

    # 2. heapd, cuda backend.
    cat >"$T/heapd.conf" <<EOF
socket = $S
backend = $BE
log_level = info
chunk_size = 64M
va_size = 64G
collect_timeout_ms = 15000
EOF
    echo; echo "== heapd (backend $BE)"
    start_heapd "$T/heapd.conf" "$O/heapd.log"
    echo "$hpid" >"$T/heapd.pid"
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
    # Every rank makes the growing allocation at once (it needs one collect,
    # which every rank joins); --timeout 20 bounds each collect and attach.
    STATS="$B/heapctl --socket $S stats >$T/stats.txt 2>&1; $B/heapctl --socket $S --json stats >$O/stats.json 2>&1"
    for n in 2 4; do
        echo; echo "== prog_gpu_ranks --ranks $n"
        if [ $n = 2 ]; then
            step "r$n" 60 "$B/tests/prog_gpu_ranks" --socket "$S" --ranks $n --heap "ranks$n" --timeout 20 $RANKOPT \
                --while-attached "$STATS"
        else
            step "r$n" 60 "$B/tests/prog_gpu_ranks" --socket "$S" --ranks $n --heap "ranks$n" --timeout 20 $RANKOPT
        fi
        sed -n "s/^t \([a-z0-9_]*\) \(.*\)/ranks$n \1 \2/p" "$T/r$n.out" >>"$T/timings.txt"
        if [ $rc = 0 ]; then
            result "gpu_ranks_$n" ok "peer writes, growth by every rank at once, symmetric offsets"
        else
            result "gpu_ranks_$n" FAIL "$(why $rc)"
        fi
    done
    echo; echo "== prog_gpu_ranks --ranks 2 --no-hook (libheapc's default device sync)"
    step rd 60 "$B/tests/prog_gpu_ranks" --socket "$S" --ranks 2 --heap defsync --no-hook --timeout 20 $RANKOPT
    if [ $rc = 0 ]; then result gpu_ranks_default_sync ok; else result gpu_ranks_default_sync FAIL "$(why $rc)"; fi

    # 3b. issue 18: stream-ordered frees. Each of 2 ranks starts a ~50 ms kernel that then
    # writes into a block B, frees B on the kernel's stream, and makes an allocation that
    # triggers a collect (timed). Round "stream" (libheapc's default, no device sync): B
    # waits for its stream, the allocation does not wait for the kernel (target: < 1 ms on
    # the GPU) and the next owner's data survives the kernel's late write; round "hook"
    # (cuCtxSynchronize, the old default): the allocation waits for the kernel.
    # Host dry run: the kernel is a thread on a heapc_hstream (no figures that mean anything).
    echo; echo "== prog_stream_free --ranks 2 (stream-ordered frees, issue 18)"
    step sf 30 "$B/tests/prog_stream_free" --socket "$S" --ranks 2 --timeout 10 $SFOPT
    sfs=$(sed -n 's/^t alloc_stream_us //p' "$T/sf.out" | sort -n | tail -1)
    sfh=$(sed -n 's/^t alloc_hook_us //p' "$T/sf.out" | sort -n | tail -1)
    sfr=$(grep -c '^t kernel_running_after_alloc_stream 1' "$T/sf.out")
    echo "stream_free alloc_stream_us_slowest_rank ${sfs:-?}" >>"$T/timings.txt"
    echo "stream_free alloc_hook_us_slowest_rank ${sfh:-?}" >>"$T/timings.txt"
    sfd="allocation triggering a collect with a 50 ms kernel in flight, slowest of 2 ranks: ${sfs:-?} us stream-ordered, ${sfh:-?} us with the old cuCtxSynchronize hook; kernel still running after it on $sfr of 2 ranks; next owners' data intact"
    [ $BE = host ] && sfd="host dry run, a thread for the kernel (no meaningful figures): $sfd"
    if [ $rc != 0 ]; then
        result stream_free FAIL "$(why $rc)"
    elif [ $BE = cuda ] && grep -q 'skipped: no GPU' "$T/sf.out"; then
        result stream_free FAIL "skipped: no GPU seen"
    elif [ $BE = cuda ] && ! awk -v v="${sfs:-1e9}" 'BEGIN { exit !(v < 1000) }'; then
        result stream_free FAIL "not under 1 ms: $sfd"
    else
        result stream_free ok "$sfd"
    fi

    # 4. heapctl stats while the 2-rank heap was attached.
    echo; echo "== heapctl stats (taken while 2 ranks were attached)"
    cat "$T/stats.txt" 2>/dev/null
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
    step bench 120 "$B/bench/gpu_bench" --socket "$S" --require-gpu $BENCHOPT --json "$O/gpu_bench.json"
    if [ $rc = 0 ]; then result gpu_bench ok; else result gpu_bench FAIL "$(why $rc)"; fi

    # 5e. issue 29: a restarted job gets its heap back. 2 ranks fill a heap (16 GiB per rank
    # in 256 MiB chunks on the GPU), exit; heapd keeps it; new ranks re-attach: per rank,
    # attach + map of every chunk + a checksum of the whole copy (a kernel), against
    # reading the same bytes from a file on local disk into the heap (warm page cache).
    # GPU_SH_REATTACH_FILE (a size) shortens the file (the figure is then scaled).
    if [ -x "$B/bench/reattach_bench" ]; then
        echo; echo "== reattach_bench (issue 29: re-attach against a file load)"
        step ra 90 "$B/bench/reattach_bench" --socket "$S" $RAOPT --file-dir "$T" \
            ${GPU_SH_REATTACH_FILE:+--file-size "$GPU_SH_REATTACH_FILE"} --json "$T/reattach.json"
        ram=$(sed -n 's/^reattach_ms_per_rank \([0-9.]*\).*/\1/p' "$T/ra.out")
        raf=$(sed -n 's/^file_load_ms \([0-9.]*\).*/\1/p' "$T/ra.out")
        echo "reattach reattach_ms_per_rank ${ram:-?}" >>"$T/timings.txt"
        echo "reattach file_load_ms ${raf:-?}" >>"$T/timings.txt"
        rad="re-attach + map + checksum ${ram:-?} ms per rank (slowest), file load ${raf:-?} ms (warm), x$(sed -n 's/^file_load_over_reattach //p' "$T/ra.out")"
        [ $BE = host ] && rad="host dry run, small heap: $rad"
        "$B/heapctl" --socket "$S" drop reattach >/dev/null 2>&1
        if [ $rc != 0 ]; then
            result reattach FAIL "$(why $rc): $(grep -m1 -E 'FAIL|reattach_bench:' "$T/ra.out")"
        elif [ $BE = cuda ] && ! awk -v v="${ram:-1e9}" 'BEGIN { exit !(v <= 100) }'; then
            result reattach FAIL "over 100 ms: $rad"
        else
            result reattach ok "$rad"
        fi
    fi

    # 5f. issue 30: a heap's memory released and restored at the same offsets. 2 ranks of 16 GiB
    # (256 MiB chunks), each round timed per rank (the slowest counts) and the content checked
    # after its restore (a kernel compares every word): release discard + restore (zeros),
    # release host (the first: heapd allocates and pins the host copy) + restore, then
    # HEAPC_RELEASE_KEEP twice (the second: the copy only, the steady pattern); cuMemGetInfo
    # before and after the discard release; a pinned D2H/H2D copy of the same bytes (rank 0
    # alone) is the anchor. Targets: release discard <= 50 ms, the keep round's release and
    # restore >= 0.80 of the pinned copy's GiB/s, the device's free memory grows by the bytes.
    if [ -x "$B/bench/release_bench" ]; then
        echo; echo "== release_bench (issue 30: release and restore against a pinned copy)"
        step rl 90 "$B/bench/release_bench" --socket "$S" $RLOPT --json "$T/release.json"
        rlv() { sed -n "s/^$1 \([0-9.-]*\).*/\1/p" "$T/rl.out" | head -1; }
        for k in release_discard_ms restore_discard_ms release_host_ms restore_host_ms release_host_keep_ms \
                 restore_host_keep_ms release_host_keep_gib_s restore_host_keep_gib_s d2h_gib_s h2d_gib_s \
                 release_host_over_pinned restore_host_over_pinned device_free_growth_over_released; do
            echo "release $k $(v=$(rlv $k); echo "${v:-?}")" >>"$T/timings.txt"
        done
        rld="release discard $(rlv release_discard_ms) ms, restore $(rlv restore_discard_ms) ms; host, first: release $(rlv release_host_ms) ms, restore $(rlv restore_host_ms) ms; host, kept copy: release $(rlv release_host_keep_ms) ms ($(rlv release_host_keep_gib_s) GiB/s, x$(rlv release_host_over_pinned) of pinned d2h $(rlv d2h_gib_s) GiB/s), restore $(rlv restore_host_keep_ms) ms (x$(rlv restore_host_over_pinned) of h2d $(rlv h2d_gib_s) GiB/s); device free grew x$(rlv device_free_growth_over_released) of the released bytes"
        [ $BE = host ] && rld="host dry run, small heap: $rld"
        "$B/heapctl" --socket "$S" drop release >/dev/null 2>&1
        rlmiss=$(awk -v d="$(rlv release_discard_ms)" -v a="$(rlv release_host_over_pinned)" \
            -v b="$(rlv restore_host_over_pinned)" -v g="$(rlv device_free_growth_over_released)" 'BEGIN {
            if (d == "" || d > 50) printf "release discard over 50 ms; "
            if (a == "" || a < 0.8) printf "host release under 0.80 of pinned; "
            if (b == "" || b < 0.8) printf "host restore under 0.80 of pinned; "
            if (g == "" || g < 0.98) printf "device free memory grew by less than the released bytes; " }')
        if [ $rc != 0 ]; then
            result release FAIL "$(why $rc): $(grep -m1 FAIL "$T/rl.out" || tail -1 "$T/rl.out")"
        elif [ $BE = cuda ] && [ -n "$rlmiss" ]; then
            result release FAIL "${rlmiss%; }: $rld"
        else
            result release ok "$rld"
        fi
    fi

    # 5a. issue 16: alloc on the request ring, on the socket and the raw ping-pong
    # (1, 2, 4, 8 clients; its own host-backend heapd), heapd's idle CPU.
    if [ -x "$B/bench/rtt_bench" ]; then
        echo; echo "== rtt_bench (request ring vs socket vs ping-pong)"
        step rtt 60 "$B/bench/rtt_bench" --heapd "$B/heapd" $RTTOPT --json "$O/rtt_bench.json"
        if [ $rc = 0 ]; then result rtt_bench ok "$(grep -A1 '^clients  ring' "$T/rtt.out" | tail -1)"
        else result rtt_bench FAIL "$(why $rc)"; fi
    fi

    # 5b. libheapc_nccl with real NCCL (a one-rank communicator on this GPU).
    if [ -x "$B/tests/check_nccl" ]; then
        echo; echo "== check_nccl (real NCCL)"
        step nccl 60 env HEAPD="$B/heapd" CK_DEFAULT_TIMEOUT=40 "$B/tests/check_nccl"
        if [ $rc = 0 ] && [ $BE = cuda ] && grep -q 'skipped: no GPU' "$T/nccl.out"; then
            result check_nccl FAIL "the real-NCCL TCase was skipped"
        elif [ $rc = 0 ]; then
            result check_nccl ok "$(grep -E '^[0-9]+%:' "$T/nccl.out" | tail -1)"
        else
            result check_nccl FAIL "$(why $rc)"
        fi
    fi
    # 5c. probe cost: the status page against cudaMemGetInfo and torch.
    if [ -x "$B/bench/nccl_bench" ]; then
        echo; echo "== nccl_bench (probe cost)"
        step nb 45 "$B/bench/nccl_bench" --quick $NBOPT --json "$O/nccl_bench.json"
        if [ $rc = 0 ]; then result nccl_bench ok; else result nccl_bench FAIL "$(why $rc)"; fi
    fi
    # 5c'. issue 32 on several GPUs: all_reduce and all_gather, 1 KiB..128 MiB, on a heap registered
    # as NCCL windows (NCCL_WIN_COLL_SYMMETRIC) against cuMemAlloc buffers of the same size, one rank
    # per GPU (up to 8), results verified. Needs 2+ GPUs: skipped otherwise (and in the host dry run:
    # make check runs the bench's own --host dry run, tests/it_nccl_multi.sh). Its JSON stays in $T
    # (the device tool returns 8 files); its table is in gpu.log.
    if [ -x "$B/bench/nccl_multi_bench" ]; then
        echo; echo "== nccl_multi_bench (issue 32: registered heap against plain buffers, one rank per GPU)"
        ngpu=0
        if [ $BE = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU '); fi
        if [ "$ngpu" -ge 2 ]; then
            nr=$((ngpu > 8 ? 8 : ngpu))
            step nm 60 "$B/bench/nccl_multi_bench" --socket "$S" --ranks $nr --json "$T/nccl_multi.json"
            sed -n 's/^\(all_[a-z]*\)  *\([0-9]*\)  *\([0-9.]*\)  *\([0-9.]*\)  *\([0-9.]*\)  *\(.*\)$/nccl_multi \1_\2 heap_us \3 plain_us \4 heap_over_plain \5 \6/p' \
                "$T/nm.out" >>"$T/timings.txt"
            if [ $rc = 0 ]; then
                result nccl_multi ok "$nr ranks; heap/plain: $(grep -E '^all_[a-z]+ +(1024|134217728) ' "$T/nm.out" | awk '{printf "%s %s B %s; ", $1, $2, $5}')"
            else
                result nccl_multi FAIL "$(why $rc): $(grep -m1 FAIL "$T/nm.out" || tail -1 "$T/nm.out")"
            fi
        else
            echo "skipped: needs 2+ GPUs ($ngpu here)"
            result nccl_multi skipped "needs 2+ GPUs ($ngpu here)"
        fi
    fi
    if command -v python3 >/dev/null 2>&1; then
        echo; echo "== torch anchors (caching allocator, memory probes)"
        step torch 60 python3 scripts/torch_probe.py "$O/torch.json"
        nf=$(grep -c '^torch ' "$T/torch.out")
        if [ $rc != 0 ]; then
            result torch_anchors FAIL "$(why $rc)"
        elif [ "$nf" -gt 0 ]; then
            result torch_anchors ok "$nf figures"
        elif [ $BE = cuda ]; then
            result torch_anchors FAIL "no figures: $(grep -m1 skipped "$T/torch.out")"
        else
            result torch_anchors skipped "host dry run: $(grep -m1 skipped "$T/torch.out" | sed 's/^skipped: //')"
        fi
        # PyTorch's own symmetric memory (world 1): issue 16's anchors.
        step symm 60 python3 scripts/torch_symm_probe.py "$O/symm.json"
        nf=$(grep -c '^symm ' "$T/symm.out")
        if [ $rc != 0 ]; then
            result torch_symm FAIL "$(why $rc)"
        elif [ "$nf" -gt 0 ]; then
            result torch_symm ok "$(grep -E '^symm (symm|cuda)' "$T/symm.out" | sed 's/^symm //' | tr '\n' ' ')"
        elif [ $BE = cuda ]; then
            result torch_symm FAIL "no figures: $(grep -m1 skipped "$T/symm.out")"
        else
            result torch_symm skipped "host dry run: $(grep -m1 skipped "$T/symm.out" | sed 's/^skipped: //')"
        fi
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
    elif nm -D "$B/libheapc.so" 2>/dev/null | grep -q __asan_init; then
        # python cannot load an ASan-instrumented libheapc (it_python skips too)
        result torch_gpu skipped "sanitizer build: $B/libheapc.so is ASan-instrumented"
    elif [ ! -f "$B/libheapc.so" ] || [ ! -f "$B/libheapc_nccl_preload.so" ] || [ ! -f "$B/libheapc_torch.so" ]; then
        result torch_gpu FAIL "$B lacks libheapc.so / libheapc_nccl_preload.so / libheapc_torch.so (make STATIC=1 BUILD=$B)"
    else
        echo; echo "== python/heapd and torch ($PYT)"
        PYENV="HEAPD_SOCKET=$S HEAPD_BUILD=$B HEAPC_LIB=$B/libheapc.so HEAPC_TORCH_LIB=$B/libheapc_torch.so PYTHONPATH=python PYTHONDONTWRITEBYTECODE=1"
        if [ $BE = cuda ]; then
            step tg 180 env $PYENV HEAPD_GPU_CASE_TIMEOUT=60 "$PYT" -m pytest -p no:cacheprovider -q -ra \
                tests/gpu/test_torch_gpu.py
            if [ $rc = 0 ] && ! grep -q SKIPPED "$T/tg.out"; then
                result torch_gpu ok "$(tail -1 "$T/tg.out")"
            else
                result torch_gpu FAIL "$(why $rc): $(tail -1 "$T/tg.out")"
            fi
            BOPT=
        else
            result torch_gpu skipped "host dry run: no GPU (bench's CPU subset only)"
            BOPT=--host
        fi
        step tb 120 env $PYENV "$PYT" bench/torch_bench.py $BOPT --build "$B" --json "$O/torch_bench.json"
        if [ $rc = 0 ]; then result torch_bench ok "$(grep -c '^torch_bench ' "$T/tb.out") figures"; \
        else result torch_bench FAIL "$(why $rc)"; fi
        # issue 27: a training loop (TransformerEncoder, 6 layers, d_model 1024, batch 8 x 512,
        # bf16 autocast, AdamW) with torch's caching allocator against the whole loop on the heap
        # (heapd.torch.use_heap, 256 MiB chunks), 1 rank and 2 ranks on the one GPU, torch and
        # heap alternating in fresh processes, rounds while the time lasts. Targets (printed, not
        # failed): heap mapped <= 1.15x torch's max reserved, step time <= 1.15x. Issue 28: a third
        # mode, local, the heap run on a heap made with decide="local", decide_every 64 (each rank
        # decides its allocations with a replica); targets step <= 1.05x torch's, memory <= 1.15x;
        # a local run whose replica was lost or that decided nothing locally fails. Host dry run: a
        # small model on the CPU, parameters, gradients and moments as host-backend heap tensors.
        echo; echo "== train_bench (issue 27: a training loop, torch's allocator against use_heap; issue 28: local)"
        # The steps after it (the resume example, heapd's stop) keep 75 s of the budget; a round is
        # 6 runs (3 modes, 2 configurations): up to 120 s, where the budget has them.
        tl=$(tmo 165); tl=$((tl > 75 + 30 ? tl - 75 : 30)); tl=$((tl > 120 ? 120 : tl)); TROPT=
        [ $BE = host ] && TROPT="--host --rounds 2"
        step train $tl env $PYENV TMPDIR="$T" "$PYT" bench/train_bench.py $TROPT --build "$B" \
            --time-limit $((tl > 20 ? tl - 10 : tl))
        trv() { v=$(sed -n "s/^train $1 \([^ ]*\).*/\1/p" "$T/train.out" | head -1); echo "${v:-?}"; }
        for k in 1rank_torch_step_ms 1rank_heap_step_ms 1rank_step_ratio 1rank_torch_peak_mib 1rank_heap_peak_mib \
                 1rank_mem_ratio 2rank_torch_step_ms 2rank_heap_step_ms 2rank_step_ratio 2rank_torch_peak_mib \
                 2rank_heap_peak_mib 2rank_mem_ratio 1rank_collects 1rank_growths 1rank_eager_reclaims \
                 2rank_collects 2rank_growths 2rank_eager_reclaims 1rank_local_step_ms 1rank_local_step_ratio \
                 1rank_local_peak_mib 1rank_local_mem_ratio 1rank_local_collects 1rank_local_growths \
                 1rank_local_eager_reclaims 1rank_local_allocs 1rank_local_share 1rank_replica_lost \
                 2rank_local_step_ms 2rank_local_step_ratio 2rank_local_peak_mib 2rank_local_mem_ratio \
                 2rank_local_collects 2rank_local_growths 2rank_local_eager_reclaims 2rank_local_allocs \
                 2rank_local_share 2rank_replica_lost rounds; do
            echo "train $k $(trv $k)" >>"$T/timings.txt"
        done
        trd=""
        for c in 1rank 2rank; do
            trd="$trd$c: step $(trv ${c}_heap_step_ms) ms on the heap, $(trv ${c}_torch_step_ms) ms torch (x$(trv ${c}_step_ratio), target <= 1.15: $(trv ${c}_target_step)); peak $(trv ${c}_heap_peak_mib) MiB mapped, $(trv ${c}_torch_peak_mib) MiB torch reserved (x$(trv ${c}_mem_ratio): $(trv ${c}_target_mem)); collects $(trv ${c}_collects), growths $(trv ${c}_growths), eager_reclaims $(trv ${c}_eager_reclaims); local (issue 28): step $(trv ${c}_local_step_ms) ms (x$(trv ${c}_local_step_ratio), target <= 1.05: $(trv ${c}_local_target_step)), peak $(trv ${c}_local_peak_mib) MiB (x$(trv ${c}_local_mem_ratio): $(trv ${c}_local_target_mem)), local_allocs $(trv ${c}_local_allocs) (share $(trv ${c}_local_share)), replica_lost $(trv ${c}_replica_lost); "
        done
        trd="$(trv rounds) rounds; ${trd%; }"
        [ $BE = host ] && trd="host dry run, small CPU model (no meaningful figures): $trd"
        if [ $rc != 0 ]; then
            result train FAIL "$(why $rc): $(grep -m1 'FAIL' "$T/train.out" || tail -1 "$T/train.out")"
        else
            result train ok "$trd"
        fi
        # issue 29: examples/train_resume.py on the GPU, killed on every rank and resumed
        # (tests/it_resume_example.sh with its own cuda heapd; make check runs it on the host).
        if [ $BE = cuda ]; then
            step rex 150 env BUILD="$B" HEAPD_SRC="$(pwd)" HEAPD_PYTHON="$PYT" RESUME_BACKEND=cuda \
                sh tests/it_resume_example.sh
            if [ $rc = 0 ]; then result resume_example ok "$(grep -m1 '^loss:' "$T/rex.out")"
            else result resume_example FAIL "$(why $rc): $(grep -m1 '^FAIL' "$T/rex.out")"; fi
        else
            result resume_example skipped "host dry run: make check runs tests/it_resume_example.sh"
        fi
    fi

    # 6. heapd stops cleanly.
    echo; echo "== heapd stop"
    kill -TERM "$hpid"
    i=0
    while kill -0 "$hpid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$hpid" 2>/dev/null; then
        echo "gpu.sh: heapd did not stop within 10 s of SIGTERM; killing it"
        kill -9 "$hpid"
    fi
    wait "$hpid"; rc=$?; hpid=; : >"$T/heapd.pid"
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

lib_on_exit kill_heapd
: >"$T/timings.txt"
LOG=$O/gpu.log
echo "gpu.sh: output in $O (budget ${BUDGET} s)" | tee "$LOG"
main 2>&1 | tee -a "$LOG"

{
    echo
    echo "================ heapd GPU tests ($B) ================"
    printf '%-24s | %s\n' test result
    printf '%-24s-+-%s\n' ------------------------ ------
    while IFS='|' read -r n r d; do
        printf '%-24s | %s%s\n' "$n" "$r" "${d:+  ($d)}"
    done <"$RES"
    echo
    echo "timings (us; prog_gpu_ranks: every rank grows the heap at once; slowest and median rank):"
    sed 's/^/  /' "$T/timings.txt"
    if [ -f "$O/gpu_bench.json" ]; then
        echo
        echo "gpu_bench (medians, us):"
        grep '^|' "$LOG"
    fi
    if [ -f "$O/torch.json" ]; then
        echo
        echo "torch anchors (us):"
        grep '^torch [a-z_]* [0-9{]' "$LOG" | sed 's/^/  /'
    fi
    if [ -f "$O/torch_bench.json" ]; then
        echo
        echo "python/heapd against torch (us):"
        grep '^torch_bench [a-z]' "$LOG" | sed 's/^torch_bench /  /'
    fi
    if [ -f "$O/rtt_bench.json" ] && command -v python3 >/dev/null 2>&1; then
        echo
        echo "one allocation on every path (issue 16; this run):"
        python3 scripts/alloc_table.py "$O" | sed 's/^/  /'
    fi
    if [ -f "$O/nccl_bench.json" ]; then
        echo
        echo "probe cost (ns) by live blocks:"
        grep -E '^ +[0-9]+ +[0-9]+ ' "$LOG" | sed 's/^/  /'
    fi
    echo
    echo "gpu.sh: $(($(date +%s) - DEADLINE + BUDGET)) s of the ${BUDGET} s budget; output in $O"
} | tee -a "$LOG"

if grep -q '|FAIL|' "$RES" || ! grep -q '^gpu_bench|ok' "$RES"; then
    echo "gpu.sh: FAILED" | tee -a "$LOG"
    exit 1
fi
echo "gpu.sh: all passed" | tee -a "$LOG"
exit 0
