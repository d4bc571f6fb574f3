#!/bin/sh
# it_fuzz.sh - the libFuzzer targets (tests/fuzz/) in a short bounded mode:
# what `make fuzz FUZZ_SECONDS=10` runs (tests/fuzz/run.sh), 10 s for wire and
# alloc, 5 s for heap and dispatch (FUZZ_SECONDS, FUZZ_SECONDS_NAME override). Prints "skipped: libFuzzer not available" and
# passes when clang cannot build fuzzers. Run by tests/run.sh.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
export BUILD HEAPD_SRC="$SRC"
FUZZ_SECONDS=${FUZZ_SECONDS:-10} FUZZ_SECONDS_heap=${FUZZ_SECONDS_heap:-5} \
    FUZZ_SECONDS_dispatch=${FUZZ_SECONDS_dispatch:-5} sh "$SRC/tests/fuzz/run.sh"
rc=$?
if [ $rc = 77 ]; then
    exit 0 # run.sh printed "skipped: libFuzzer not available: ..."
fi
echo "it_fuzz: $([ $rc = 0 ] && echo 0 || echo 1) failure(s)"
exit $rc
