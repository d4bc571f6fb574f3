#!/bin/sh
# run.sh - run the benchmarks that make sense on a CPU machine.
#
# Runs every $BUILD/bench/*_bench program that is not in SKIP (GPU-only
# benchmarks; add their names there) nor in $BENCH_SKIP (space-separated
# names, from the environment), each as `NAME --json $BUILD/bench/NAME.json`
# plus $BENCH_ARGS (e.g. BENCH_ARGS=--quick), and lets their tables through.
# A skipped benchmark's JSON from an earlier run is removed, so that the
# summary shows only this run. Then:
#   - bench/summary.sh writes $BUILD/bench/summary.json, summary.md and the
#     chart's data (chart-*.dat);
#   - gnuplot draws $BUILD/bench/chart.svg from bench/plot.gp ("chart
#     skipped: gnuplot not installed" without it: Debian package gnuplot-nox);
#   - the summary table (figure | value | compared with | ratio) comes LAST.
# Exits 1 if any benchmark failed (after the table) or the summary failed.
set -u
BUILD=${BUILD:-build}
SKIP=" nccl_multi_bench "  # names that cannot run on a CPU machine and do not skip themselves
          # (gpu_bench prints "skipped: no GPU" and exits 0 there, so it runs; nccl_multi_bench
          # needs several GPUs and a cuda heapd: make check runs its --host dry run)
BENCH_SKIP=${BENCH_SKIP:-}
BENCH_ARGS=${BENCH_ARGS:-}
mkdir -p "$BUILD/bench"
ran=0; failed=""
for b in "$BUILD"/bench/*_bench; do
    if [ ! -f "$b" ] || [ ! -x "$b" ]; then continue; fi
    name=$(basename "$b")
    case " $SKIP $BENCH_SKIP " in
        *" $name "*) echo "== $name: skipped"; rm -f "$BUILD/bench/$name.json"; continue ;;
    esac
    echo "== $name"
    rm -f "$BUILD/bench/$name.json"
    # shellcheck disable=SC2086 # BENCH_ARGS is a word list on purpose
    if "$b" --json "$BUILD/bench/$name.json" $BENCH_ARGS; then
        if [ -f "$BUILD/bench/$name.json" ]; then
            echo "   (results: $BUILD/bench/$name.json)"
        fi
    else
        failed="$failed $name"
    fi
    ran=$((ran + 1))
    echo
done
if [ $ran = 0 ]; then
    echo "bench: no benchmark programs in $BUILD/bench: run make first" >&2
    exit 1
fi
echo "bench: $ran benchmark(s) ran${failed:+; failed:$failed}"

# The summary (its files first, its table last) and the chart.
status=0
here=$(dirname "$0")
if table=$(sh "$here/summary.sh" "$BUILD/bench"); then
    if [ ! -f "$BUILD/bench/summary.json" ]; then
        echo "chart skipped: no summary (see below)"
    elif command -v gnuplot >/dev/null 2>&1; then
        rm -f "$BUILD/bench/chart.svg"
        if gnuplot -e "dir='$BUILD/bench'" "$here/plot.gp" && [ -s "$BUILD/bench/chart.svg" ]; then
            echo "chart: $BUILD/bench/chart.svg"
        else
            echo "bench: the chart failed (gnuplot $here/plot.gp)" >&2
            status=1
        fi
    else
        echo "chart skipped: gnuplot not installed (Debian package gnuplot-nox)"
    fi
    if [ -f "$BUILD/bench/rtt_bench.json" ] && command -v python3 >/dev/null 2>&1; then
        echo
        echo "one allocation on every path (issue 16; torch and cudaMalloc rows come from the GPU script):"
        python3 "$here/../scripts/alloc_table.py" "$BUILD/bench" || status=1
    fi
    echo
    printf '%s\n' "$table"
else
    echo "bench: the summary failed (sh $here/summary.sh $BUILD/bench)" >&2
    status=1
fi
if [ -n "$failed" ]; then
    echo "bench: failed:$failed" >&2
    exit 1
fi
exit $status
