#!/bin/sh
# demo.sh - the README's main job: heapd with the shipped heapd.conf (host
# backend), a 4-rank example trainer against it, heapctl stats, then stop.
# The socket goes to a private directory so a heapd already running on this
# machine is never disturbed.
set -eu
BUILD=${BUILD:-build}
dir=$(mktemp -d /tmp/heapd-demo.XXXXXX)
sock=$dir/heapd.sock
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM

echo "== starting heapd (heapd.conf, socket $sock)"
"$BUILD/heapd" --config heapd.conf --socket "$sock" 2>"$dir/heapd.log" &
pid=$!
i=0
while [ ! -S "$sock" ]; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "heapd did not start:"; cat "$dir/heapd.log"; exit 1
    fi
    sleep 0.05
done
echo "== running the example trainer: 4 rank processes"
"$BUILD/examples/trainer" --socket "$sock" --ranks 4 --heap demo \
    --stats-cmd "$BUILD/heapctl --socket $sock stats demo"
echo "== heapd log"
sed 's/^/   /' "$dir/heapd.log"
echo "== stopping heapd"
kill -TERM "$pid"; wait "$pid" || { echo "heapd exited with an error"; exit 1; }
pid=
echo "demo: ok"
