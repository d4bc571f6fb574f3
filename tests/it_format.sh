#!/bin/sh
# it_format.sh - the C sources follow .clang-format (issue 14). Borrowed code
# keeps its upstream form (daemon/sha1.[ch], daemon/redis_uv.[ch]) and the Lua
# script in store_lua.h is a string, so those are left out. Run by
# tests/run.sh; fix a failure with: clang-format -i FILE.
set -u
SRC=${HEAPD_SRC:-$(pwd)}
BUILD=${BUILD:-build}
. "$SRC/tests/lib.sh"
if ! command -v clang-format >/dev/null 2>&1; then
    echo "skipped: clang-format not installed (Debian: apt-get install clang-format)"
    exit 0
fi
cd "$SRC" || exit 1
files=$(find daemon client common tests bench examples -name '*.[ch]' | grep -vE 'daemon/(sha1|redis_uv)\.|store_lua\.h|/corpus/' | sort)
n=0
for f in $files; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        bad "$f does not follow .clang-format (clang-format -i $f)"
    fi
    n=$((n + 1))
done
check "$n C files checked (at least 100)" test "$n" -ge 100
[ "$fails" = 0 ] && echo "it_format: all passed" || echo "it_format: $fails failed"
[ "$fails" = 0 ]
