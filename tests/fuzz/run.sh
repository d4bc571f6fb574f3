#!/bin/sh
# run.sh - build and run heapd's libFuzzer targets for a bounded time.
#
#   BUILD=build FUZZ_SECONDS=60 sh tests/fuzz/run.sh      (what `make fuzz` runs)
#
# Targets (tests/fuzz/fuzz_NAME.c):
#   wire   framing (common/wire.c, wire_write.c) and protobuf decoding (heapd.pb-c.c and
#          libprotobuf-c): bytes and fds through a socket pair into hw_read,
#          heapd__frame__unpack, re-encode, the writer, fd leak check
#   alloc  allocator call sequences (daemon/alloc*.c) on small
#          heaps of both policies: ha_validate after every call, a model of
#          the blocks, determinism against a twin heap
#   heap   request sequences from 6 clients straight into the heap wing
#          (daemon/heap/, in process: registry, host backend, libuv loop,
#          a checking reply sink): hd_heap_validate after every step, the
#          replies' fds, symmetric decisions, no fd or handle left at the end
#   dispatch  the same clients' requests as frames (packed, then maybe cut
#          or corrupted, or raw bytes) through daemon/dispatch.c's
#          hd_dispatch_frame: decoding, every state check, the wing behind
#          it, and reply.c's frames back through each client's frame sink
# heap and dispatch link the daemon's library (every daemon/*.c but the
# programs), built once into $BUILD/fuzz/wing/ (rebuilt when a source is
# newer).
#   ring   the request ring's decoder (common/ring_layout.c) and protobuf decoding
#          of its slots, as heapd's ring server reads a hostile client's ring
# Each is built with $FUZZ_CC -fsanitize=fuzzer,address,undefined straight
# from the sources into $BUILD/fuzz/, then run for FUZZ_SECONDS from the seed
# corpus tests/fuzz/corpus/NAME (read only) plus $BUILD/fuzz/corpus/NAME,
# where new inputs go. A crash leaves its input in $BUILD/fuzz/artifacts/NAME/
# (reproduce: $BUILD/fuzz/fuzz_NAME FILE).
#
# Environment: BUILD, HEAPD_SRC (source tree; default: the current
# directory), FUZZ_SECONDS (default 60; FUZZ_SECONDS_NAME for target NAME
# alone), FUZZ_CC (default clang),
# FUZZ_TARGETS (default "wire alloc heap dispatch ring"), FUZZ_FLAGS (extra libFuzzer flags).
# Prints one ok/FAIL line per target; exits 0 when none crashed, 1 when one
# did, 77 when clang cannot build fuzzers (the message says what is missing).
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
SECS=${FUZZ_SECONDS:-60}
FCC=${FUZZ_CC:-clang}
TARGETS=${FUZZ_TARGETS:-wire alloc heap dispatch ring}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
OUT=$BUILD/fuzz
PROTO=$BUILD/proto/heapd.pb-c.c

mkdir -p "$OUT"
if ! command -v "$FCC" >/dev/null 2>&1; then
    echo "skipped: libFuzzer not available: $FCC is not installed (Debian: apt-get install clang libclang-rt-14-dev)"
    exit 77
fi
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\nint LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$OUT/probe.c"
if ! "$FCC" -fsanitize=fuzzer,address,undefined -o "$OUT/probe" "$OUT/probe.c" >"$OUT/probe.log" 2>&1; then
    echo "skipped: libFuzzer not available: $FCC -fsanitize=fuzzer cannot link ($(grep -m1 -i error "$OUT/probe.log")); the runtime libclang_rt.fuzzer is in Debian's libclang-rt-<version>-dev (clang 14: libclang-rt-14-dev)"
    exit 77
fi
if [ ! -f "$PROTO" ]; then
    echo "FAIL $PROTO is missing: build heapd first (make)"
    exit 1
fi

CFLAGS_F="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -D_GNU_SOURCE -std=c11 -Wall -Wextra -Wno-unused-parameter -I$SRC/common -I$SRC/daemon -I$SRC/daemon/heap -I$BUILD/proto"
PBC_CFLAGS=$($PKG_CONFIG --cflags libprotobuf-c 2>/dev/null)
PBC_LIBS=$($PKG_CONFIG --libs libprotobuf-c 2>/dev/null || echo -lprotobuf-c)
WING_LIBS="$($PKG_CONFIG --libs libuv hiredis inih 2>/dev/null || echo -luv -lhiredis -linih) $PBC_LIBS -ldl -lpthread -lm"

# wing: $OUT/libwing.a, the daemon's library for the heap and dispatch
# targets (the fuzzer's instrumentation: -fsanitize=fuzzer-no-link).
wing() {
    wsrc=$(ls "$SRC"/daemon/*.c "$SRC"/daemon/heap/*.c "$SRC"/common/*.c | grep -v -e '/heapd\.c$' -e '/heapsim\.c$')
    if [ -f "$OUT/libwing.a" ] && [ -z "$(find $wsrc "$PROTO" "$SRC"/daemon "$SRC"/common -newer "$OUT/libwing.a" 2>/dev/null | head -1)" ]; then
        return 0
    fi
    rm -rf "$OUT/wing" "$OUT/libwing.a"
    mkdir -p "$OUT/wing"
    wflags=$(echo "$CFLAGS_F" | sed 's/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,/')
    for f in $wsrc "$PROTO"; do
        # dir_name.o: two directories may hold files of one name
        o=$OUT/wing/$(basename "$(dirname "$f")")_$(basename "$f" .c).o
        # shellcheck disable=SC2086
        if ! "$FCC" $wflags $PBC_CFLAGS -DHEAPD_VERSION='"fuzz"' -c -o "$o" "$f" >>"$OUT/build_wing.log" 2>&1; then
            echo "FAIL the daemon library for the fuzzers: $f did not build:"; sed 's/^/    | /' "$OUT/build_wing.log" | tail -20
            return 1
        fi
    done
    ar rcs "$OUT/libwing.a" "$OUT"/wing/*.o
}

build() { # build NAME: $OUT/fuzz_NAME
    case $1 in
    wire) srcs="$SRC/tests/fuzz/fuzz_wire.c $SRC/common/wire.c $SRC/common/wire_write.c $PROTO"; extra="$PBC_CFLAGS"; libs="$PBC_LIBS" ;;
    alloc) srcs="$SRC/tests/fuzz/fuzz_alloc.c $SRC/daemon/alloc*.c"; extra=""; libs="" ;;
    ring) srcs="$SRC/tests/fuzz/fuzz_ring.c $SRC/common/ring_layout.c $PROTO"; extra="$PBC_CFLAGS"; libs="$PBC_LIBS" ;;
    heap | dispatch)
        : >"$OUT/build_wing.log"
        wing || return 1
        srcs="$SRC/tests/fuzz/fuzz_$1.c $OUT/libwing.a"; extra="$PBC_CFLAGS"; libs="$WING_LIBS" ;;
    *) echo "FAIL unknown fuzz target '$1'"; return 1 ;;
    esac
    # shellcheck disable=SC2086
    if ! "$FCC" $CFLAGS_F $extra -o "$OUT/fuzz_$1" $srcs $libs >"$OUT/build_$1.log" 2>&1; then
        echo "FAIL fuzz_$1: build failed:"; sed 's/^/    | /' "$OUT/build_$1.log" | tail -20
        return 1
    fi
}

maxlen() { case $1 in wire) echo 8192 ;; alloc | heap) echo 1024 ;; ring) echo 2200 ;; *) echo 4096 ;; esac; }

fails=0
for t in $TARGETS; do
    build "$t" || { fails=$((fails + 1)); continue; }
    mkdir -p "$OUT/corpus/$t" "$OUT/artifacts/$t"
    log=$OUT/fuzz_$t.log
    start=$(date +%s)
    secs=$(eval "echo \${FUZZ_SECONDS_$t:-$SECS}")
    # shellcheck disable=SC2086
    "$OUT/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$(maxlen "$t")" \
        -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t/" ${FUZZ_FLAGS:-} \
        "$OUT/corpus/$t" "$SRC/tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    end=$(date +%s)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1)
    corp=$(grep -Eo 'corp: [0-9]+' "$log" | tail -1)
    if [ $rc = 0 ]; then
        echo "ok   fuzz_$t: ${runs:-?} runs in $((end - start)) s, ${cov:-cov: ?}, ${corp:-corp: ?} inputs, no crash"
    else
        art=$(ls -t "$OUT/artifacts/$t/" 2>/dev/null | head -1)
        echo "FAIL fuzz_$t: exit $rc after $((end - start)) s; input: $OUT/artifacts/$t/$art (reproduce: $OUT/fuzz_$t $OUT/artifacts/$t/$art)"
        grep -E -m1 -A25 'check failed|ERROR: (Address|Leak|libFuzzer)|runtime error|SUMMARY' "$log" | sed 's/^/    | /' | head -40
        fails=$((fails + 1))
    fi
done
exit $((fails > 0))
