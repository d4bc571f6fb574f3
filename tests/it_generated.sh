#!/bin/sh
# it_generated.sh - the default policy against the seed on generated
# random multi-rank traces (heapsim --generate SEED, seeds 1..N).
#
# Asserts, over the N traces (N = 200 unless GEN_TRACES says otherwise):
#   - no replay fails and the overlap checker finds nothing, either policy;
#   - mapped, default / seed: <= 1.00 in total, <= 1.05 on every trace;
#   - the default policy collects fewer times than the seed in total.
# (The review's model 2, <= 110 collects, is checked by it_heapsim.sh.)
# Prints the compare table's worst traces and the totals.
#
# Run by tests/run.sh (BUILD = build dir, HEAPD_SRC = source root); exit 0 =
# pass. The traces are written to $BUILD/traces/gen (about 20 MB for 200).
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
SIM=$BUILD/heapsim
N=${GEN_TRACES:-200}
# Debug and sanitizer builds (make check passes HEAPD_VALIDATING=1) run the
# allocator's validator after every call, O(blocks) each: there every trace
# is cut to its first GEN_MAX_ALLOCS allocations (150 unless set). Cut
# traces check the validator, the overlaps, the total ratio and the collects;
# the per-trace bound is a claim about the generator's whole traces (made by
# the normal build): prefixes of them are other traces, where the default
# policy still maps more than the seed on a few (seeds 1-200 cut to 150
# allocations: g195 1.07; cut to 250: g169 1.50; docs/benchmarks.md).
MAX=${GEN_MAX_ALLOCS:-}
if [ -z "$MAX" ] && [ -n "${HEAPD_VALIDATING:-}" ]; then MAX=150; fi
if [ -n "$MAX" ]; then
    echo "validating build: each trace cut to its first $MAX allocations"
fi
W=$BUILD/traces/gen
if [ ! -x "$SIM" ]; then
    echo "FAIL: $SIM not built; run make first"
    exit 1
fi
rm -rf "$W"
mkdir -p "$W"
i=1
while [ "$i" -le "$N" ]; do
    # shellcheck disable=SC2086 # $MAX is empty or one number
    if ! "$SIM" --generate "$i" $MAX > "$W/g$i.trace"; then
        echo "FAIL: heapsim --generate $i"
        exit 1
    fi
    i=$((i + 1))
done
start=$(date +%s)
"$SIM" --compare "$W"/g*.trace > "$W/compare.out" 2> "$W/compare.err"
rc=$?
end=$(date +%s)
sed -n '/^worst/,$p' "$W/compare.out"
echo "($N traces replayed under both policies in $((end - start)) s)"
last=$(tail -n 1 "$W/compare.out")
field() { printf '%s\n' "$last" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
if [ $rc != 0 ]; then
    fail "heapsim --compare exited $rc: $(head -5 "$W/compare.err")"
fi
case "$last" in compare:*) ;; *) fail "no compare summary line: '$last'" ;; esac
[ "$(field traces)" = "$N" ] || fail "compared $(field traces) traces, want $N"
[ "$(field overlaps)" = 0 ] || fail "the overlap checker found $(field overlaps) overlaps"
[ "$(field failed)" = 0 ] || fail "$(field failed) replays failed"
# le A B: A <= B for decimals.
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }
t=$(field mapped_total_ratio); m=$(field mapped_max_ratio)
le "$t" 1.00 || fail "mapped in total, default / seed: $t, want <= 1.00"
if [ -z "$MAX" ]; then
    le "$m" 1.05 || fail "mapped on trace $(field worst), default / seed: $m, want <= 1.05"
else
    echo "skipped: the per-trace bound (<= 1.05) on traces cut to $MAX allocations (worst here: $(field worst) $m)"
fi
cc=$(field collects_coalesce); cs=$(field collects_seed)
if [ -n "$cc" ] && [ -n "$cs" ] && [ "$cc" -lt "$cs" ]; then :; else
    fail "collects in total: default $cc, seed $cs; want fewer"
fi
# Issue 27: the default policy under reclaim eager (one decider), against
# the seed: <= 0.8x of its mapped in total and <= 1.00x on every trace.
"$SIM" --compare --reclaim eager --worst 3 "$W"/g*.trace > "$W/eager.out" 2> "$W/eager.err"
rc=$?
last=$(tail -n 1 "$W/eager.out")
echo "eager: $last"
[ $rc = 0 ] || fail "heapsim --compare --reclaim eager exited $rc: $(head -5 "$W/eager.err")"
[ "$(field reclaim)" = eager ] || fail "the eager compare ran under reclaim '$(field reclaim)'"
[ "$(field overlaps)" = 0 ] || fail "eager: the overlap checker found $(field overlaps) overlaps"
[ "$(field failed)" = 0 ] || fail "eager: $(field failed) replays failed"
t=$(field mapped_total_ratio); m=$(field mapped_max_ratio)
if [ -z "$MAX" ]; then
    le "$t" 0.80 || fail "eager: mapped in total, default / seed: $t, want <= 0.80"
    le "$m" 1.00 || fail "eager: mapped on trace $(field worst), default / seed: $m, want <= 1.00"
else
    le "$t" 1.00 || fail "eager: mapped in total, default / seed: $t, want <= 1.00 (cut traces)"
    echo "skipped: eager's bounds (<= 0.80 total, <= 1.00 each) on traces cut to $MAX allocations"
fi
ce=$(field collects_coalesce)
if [ -n "$ce" ] && [ -n "$cc" ] && [ "$ce" -lt "$cc" ]; then :; else
    fail "eager: collects in total $ce, want fewer than under collect ($cc)"
fi
if [ $fails = 0 ]; then
    rm -rf "$W"
    echo "ok: $N generated traces${MAX:+, cut to $MAX allocations each}"
fi
[ $fails = 0 ]
