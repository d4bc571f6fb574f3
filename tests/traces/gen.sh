#!/bin/sh
# gen.sh - write the seed review's bookkeeping models as heapsim traces.
#
#   sh tests/traces/gen.sh model1|model2 > FILE
#   SIM=build/heapsim sh tests/traces/gen.sh decisions > tests/traces/decisions.md5
#
# Both: one rank, 256 MiB chunk and initial extent, min_block 512, va 4 GiB.
#   model1: 1000 times "allocate 1 MiB, free it", then allocate 128 MiB.
#   model2: for step in 0..19999: allocate 1 MiB, free it, and when
#           step % 100 == 0 allocate (and keep) 512 KiB; then allocate 64 MiB.
# model1.trace is committed next to this script (small); model2 (~40,000
# lines) is generated at test time into $BUILD by tests/it_heapsim.sh.
# The scratch block reuses the ID "s": an ID is free again once every rank
# freed it.
set -eu
case "${1:-}" in
model1)
    awk 'BEGIN {
        print "# seed 002 review, model 1: churn of a 1 MiB scratch buffer, then 128 MiB"
        print "heap ranks=1 chunk=256M initial=256M min_block=512 va=4G"
        for (i = 0; i < 1000; i++) { print "a s 1M"; print "f * s" }
        print "a big 128M"
    }' ;;
model2)
    awk 'BEGIN {
        print "# seed 002 review, model 2: scratch churn keeping 512 KiB every 100th step, then 64 MiB"
        print "heap ranks=1 chunk=256M initial=256M min_block=512 va=4G"
        for (step = 0; step < 20000; step++) {
            print "a s 1M"; print "f * s"
            if (step % 100 == 0) print "a k" step " 512K"
        }
        print "a big 64M"
    }' ;;
decisions)
    # The digest of every decision (heapsim --offsets: each allocation's
    # offset and each collect, in order) on the first 24 generated traces cut
    # to 400 allocations, and on both models, under both policies and under
    # coalesce with reclaim eager; SIM names
    # heapsim, DIR a scratch directory. tests/it_heapsim.sh compares it with
    # decisions.md5 next to this script: a change of the core that is not
    # meant to change a decision (speed work) must leave it as it is.
    SIM=${SIM:-build/heapsim}
    DIR=${DIR:-${TMPDIR:-/tmp}}
    here=$(cd "$(dirname "$0")" && pwd)
    sh "$here/gen.sh" model2 > "$DIR/model2.trace"
    # Only the decision lines count (the summary line's fields may grow);
    # "eager" is the coalesce policy under --reclaim eager (issue 27).
    dec() { "$SIM" $1 --offsets "$2" | grep -E '^(a|c)( |$)' | md5sum | cut -d' ' -f1; }
    for p in coalesce seed eager; do
        case $p in eager) o="--reclaim eager" ;; *) o="--policy $p" ;; esac
        for i in $(seq 1 24); do
            "$SIM" --generate "$i" 400 > "$DIR/g$i.trace"
            # shellcheck disable=SC2086 # $o is two words
            printf '%s g%s/400 %s\n' "$p" "$i" "$(dec "$o" "$DIR/g$i.trace")"
        done
        for m in model1 model2; do
            t="$here/$m.trace"
            [ $m = model2 ] && t="$DIR/model2.trace"
            printf '%s %s %s\n' "$p" "$m" "$(dec "$o" "$t")"
        done
    done ;;
*)
    echo "usage: sh gen.sh model1|model2 > FILE" >&2
    echo "       SIM=HEAPSIM DIR=SCRATCH sh gen.sh decisions > FILE" >&2
    exit 2 ;;
esac
