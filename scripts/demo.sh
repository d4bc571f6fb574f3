#!/bin/sh
# demo.sh - the README's main job: heapd with the shipped heapd.conf (host
# backend), a 4-rank example trainer against it, heapctl stats, then stop.
# The socket goes to a private directory so a heapd already running on this
# machine is never disturbed.
set -eu
BUILD=${BUILD:-build}
. "$(dirname "$0")/../tests/lib.sh"
lib_tmpdir demo
dir=$T
S=$dir/heapd.sock
sock=$S
hpid=
stop() {
    if [ -n "$hpid" ] && kill -0 "$hpid" 2>/dev/null; then
        kill -TERM "$hpid"; wait "$hpid" 2>/dev/null || true
    fi
}
lib_on_exit stop

echo "== starting heapd (heapd.conf, socket $sock)"
if ! start_heapd heapd.conf "$dir/heapd.log" --socket "$sock"; then
    echo "heapd did not start:"; cat "$dir/heapd.log"; exit 1
fi
echo "== running the example trainer: 4 rank processes"
"$BUILD/examples/trainer" --socket "$sock" --ranks 4 --heap demo \
    --stats-cmd "$BUILD/heapctl --socket $sock stats demo"
echo "== heapd log"
sed 's/^/   /' "$dir/heapd.log"
echo "== stopping heapd"
kill -TERM "$hpid"; wait "$hpid" || { echo "heapd exited with an error"; exit 1; }
hpid=
echo "demo: ok"
