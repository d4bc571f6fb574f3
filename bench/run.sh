#!/bin/sh
# run.sh - run the benchmarks that make sense on a CPU machine.
#
# Runs every $BUILD/bench/*_bench program that is not in SKIP (GPU-only
# benchmarks; add their names there) nor in $BENCH_SKIP (space-separated
# names, from the environment), each as `NAME --json $BUILD/bench/NAME.json`
# plus $BENCH_ARGS (e.g. BENCH_ARGS=--quick), and lets their tables through.
# Exits 1 if any benchmark failed.
set -u
BUILD=${BUILD:-build}
SKIP=""   # names that cannot run on a CPU machine and do not skip themselves
          # (gpu_bench prints "skipped: no GPU" and exits 0 there, so it runs)
BENCH_SKIP=${BENCH_SKIP:-}
BENCH_ARGS=${BENCH_ARGS:-}
mkdir -p "$BUILD/bench"
ran=0; failed=""
for b in "$BUILD"/bench/*_bench; do
    if [ ! -f "$b" ] || [ ! -x "$b" ]; then continue; fi
    name=$(basename "$b")
    case " $SKIP $BENCH_SKIP " in
        *" $name "*) echo "== $name: skipped"; continue ;;
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
if [ -n "$failed" ]; then
    echo "bench: failed:$failed" >&2
    exit 1
fi
echo "bench: $ran benchmark(s) ran"
