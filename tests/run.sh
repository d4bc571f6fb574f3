#!/bin/sh
# run.sh - run every test that needs no GPU: the check unit tests
# (build/tests/check_*), then the integration scripts (tests/it_*.sh).
# Prints one line per test program and a summary; exits 1 if any failed.
set -u
BUILD=${BUILD:-build}
export BUILD
export HEAPD_SRC=$(cd "$(dirname "$0")/.." && pwd)
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-300}
pass=0; fail=0; failed=""
run() {
    name=$1; shift
    log=$BUILD/tests/$name.log
    start=$(date +%s)
    if "$@" >"$log" 2>&1; then
        pass=$((pass + 1)); res=ok
    else
        fail=$((fail + 1)); res=FAIL; failed="$failed $name"
    fi
    end=$(date +%s)
    printf '%-28s %-4s %3ss  %s\n' "$name" "$res" $((end - start)) "$(grep -E '^[0-9]+%:' "$log" | tail -1)"
    # Tests that cannot run here say so visibly (e.g. "skipped: no GPU").
    grep -iE '^ *skipped' "$log" | sort -u | sed 's/^ */    /'
    if [ $res = FAIL ]; then sed 's/^/    | /' "$log" | tail -40; fi
}
mkdir -p "$BUILD/tests"
for t in "$BUILD"/tests/check_*; do
    case "$t" in *.log|*.d|*.o) continue;; esac
    [ -x "$t" ] || continue
    run "$(basename "$t")" "$t"
done
for s in "$HEAPD_SRC"/tests/it_*.sh; do
    [ -f "$s" ] || continue
    run "$(basename "$s" .sh)" sh "$s"
done
# The failures once more at the end, where a log cut to its tail still shows them.
for name in $failed; do
    echo "--- $name: its failed checks ($BUILD/tests/$name.log)"
    grep -E '^(FAIL|not ok)|:[0-9]+:[EF]:' "$BUILD/tests/$name.log" | head -8 | sed 's/^/    | /'
done
echo "tests: $pass passed, $fail failed${failed:+ ($failed )}"
[ $fail = 0 ]
