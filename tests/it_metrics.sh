#!/bin/sh
# it_metrics.sh - `heapctl metrics` read by a real Prometheus parser
# (python3-prometheus-client, tests/prom_check.py) after a real workload (2
# ranks, growths, collects, a forced collect); the FILE form replaces the
# file atomically and says heapd_up 0 when heapd is gone; heapctl's output
# never truncates a 255-byte heap name and is valid UTF-8 for a name that is
# not; the metrics units verify (systemd-analyze).
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
R=$BUILD/tests/prog_rank
CTL=$BUILD/heapctl
T=$(mktemp -d /tmp/heapd-metrics.XXXXXX)
S=$T/heapd.sock
hpid=
cleanup() {
    [ -n "$hpid" ] && kill -9 "$hpid" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT INT TERM
if ! /usr/bin/python3 -c 'import prometheus_client' 2>/dev/null; then
    echo "FAIL python3-prometheus-client is not installed (scripts/deps.sh installs it)"
    exit 1
fi

cat >"$T/heapd.conf" <<EOF2
socket = $S
backend = host
chunk_size = 1M
va_size = 256M
collect_timeout_ms = 20000
EOF2
check "heapd starts" start_heapd "$T/heapd.conf" "$T/heapd.log"

# A workload: 2 ranks allocate past the first chunk (growths), free, collect.
for r in 0 1; do
    "$R" --socket "$S" --heap mx --rank $r --world 2 --chunk 1M --va 64M -- \
        alloc 512K alloc 768K alloc 1M free 0 collect alloc 4K touch "$T/done.$r" waitfile "$T/go" \
        >"$T/r$r.out" 2>"$T/r$r.err" &
    eval "rp$r=\$!"
done
wait_for test -e "$T/done.0" -a -e "$T/done.1"
"$CTL" --socket "$S" metrics >"$T/m.prom" 2>"$T/m.err"
check "heapctl metrics exits 0" test $? = 0
if /usr/bin/python3 "$SRC/tests/prom_check.py" "$T/m.prom" mx >"$T/pc.out" 2>&1; then
    ok "prometheus_client's parser reads heapctl metrics: $(tail -1 "$T/pc.out")"
else
    bad "prometheus_client's parser:"; sed 's/^/    /' "$T/pc.out"; sed 's/^/    | /' "$T/m.prom" | head -60
fi
check "the workload's growths and collects are counted" \
    sh -c "grep -q '^heapd_heap_growths_total{heap=\"mx\",owner_uid=\"$(id -u)\"} [1-9]' '$T/m.prom' &&
           grep -q '^heapd_heap_collects_total{heap=\"mx\",owner_uid=\"$(id -u)\"} [1-9]' '$T/m.prom'"

# FILE form: atomic, and heapd_up 0 once heapd is gone.
"$CTL" --socket "$S" metrics "$T/heapd.prom" 2>"$T/m.err"
check "heapctl metrics FILE writes the file (no temporary file left)" \
    sh -c "grep -q '^heapd_up 1' '$T/heapd.prom' && ! ls '$T'/heapd.prom.?* >/dev/null 2>&1"
check "the metrics file is mode 0644" test "$(stat -c %a "$T/heapd.prom")" = 644

# Issue 33 item 8: another uid plants FILE.tmp in a writable collector
# directory, as a symlink to a file root owns, or as a FIFO. heapctl follows
# neither (its temporary file is mkstemp's) and does not hang on the FIFO
# (timeout is only a bound: a hang fails the check).
mkdir -p "$T/coll"
echo precious >"$T/victim"
ln -s "$T/victim" "$T/coll/heapd.prom.tmp"
mkfifo "$T/coll/fifo.prom.tmp"
timeout 60 "$CTL" --socket "$S" metrics "$T/coll/heapd.prom" 2>"$T/m.err"
check "a planted FILE.tmp symlink is not followed" \
    sh -c "[ \"\$(cat '$T/victim')\" = precious ] && grep -q '^heapd_up 1' '$T/coll/heapd.prom' && [ ! -L '$T/coll/heapd.prom' ]"
timeout 60 "$CTL" --socket "$S" metrics "$T/coll/fifo.prom" 2>"$T/m.err"; frc=$?
check "a planted FILE.tmp FIFO does not hang heapctl (rc $frc)" \
    sh -c "[ $frc = 0 ] && grep -q '^heapd_up 1' '$T/coll/fifo.prom' && [ -p '$T/coll/fifo.prom.tmp' ]"

# Names: never truncated; JSON and metrics stay valid. Since issue 15 heapd
# refuses names that are not UTF-8 or hold control characters (heapctl still
# replaces an invalid byte, for an older heapd); a name with quotes,
# backslashes, U+2028 and an emoji must come out as valid JSON.
long=$(printf 'n%.0s' $(seq 1 254))L
odd=$(printf 'q"b\\s\342\200\250e\303\251\360\237\230\200')
bad=$(printf 'bad\377\376name\303\251')
"$R" --socket "$S" --heap "$bad" --rank 0 --world 1 --chunk 1M -- alloc 4K >"$T/bad.out" 2>&1
check "an invalid UTF-8 heap name is refused (ERR_INVALID, not UTF-8)" grep -q "INVALID.*not valid UTF-8" "$T/bad.out"
for nm in "$long" "$odd"; do
    "$R" --socket "$S" --heap "$nm" --rank 0 --world 1 --chunk 1M -- alloc 4K touch "$T/named" waitfile "$T/go" \
        >/dev/null 2>"$T/named.err" &
    wait_for test -e "$T/named"; rm -f "$T/named"
done
"$CTL" --socket "$S" stats >"$T/st.txt" 2>&1
check "heapctl stats prints a 255-byte heap name whole" grep -q "$long" "$T/st.txt"
check "heapctl stats output is valid UTF-8" /usr/bin/python3 -c "open('$T/st.txt', encoding='utf-8').read()"
"$CTL" --socket "$S" heaps >"$T/hp.txt" 2>&1
check "heapctl heaps prints the long name whole, valid UTF-8" \
    sh -c "grep -q '$long' '$T/hp.txt' && /usr/bin/python3 -c \"open('$T/hp.txt', encoding='utf-8').read()\""
"$CTL" --socket "$S" --json stats >"$T/st.json" 2>&1
"$CTL" --socket "$S" --json heaps >"$T/hp.json" 2>&1
check "heapctl --json stats and heaps are valid UTF-8 JSON with both names" \
    env LONG="$long" ODD="$odd" /usr/bin/python3 -c "
import json, os, sys
for f in ('$T/st.json', '$T/hp.json'):
    d = json.loads(open(f, 'rb').read().decode('utf-8'))
    names = [h['name'] for h in d['heaps']]
    want = [os.environb[k].decode('utf-8') for k in (b'LONG', b'ODD')]
    if not all(w in names for w in want):
        sys.exit('%s: %r' % (f, names))"
"$CTL" --socket "$S" metrics >"$T/m2.prom" 2>&1
check "metrics with odd names still parse" /usr/bin/python3 "$SRC/tests/prom_check.py" "$T/m2.prom" mx

touch "$T/go"
wait "$rp0" "$rp1" 2>/dev/null
kill "$hpid"; wait "$hpid" 2>/dev/null; hpid=
"$CTL" --socket "$S" --timeout 2 metrics "$T/heapd.prom" 2>"$T/m.err"; mrc=$?
check "heapd gone: heapd_up 0 in the file, exit 1" sh -c "[ $mrc = 1 ] && grep -qx 'heapd_up 0' '$T/heapd.prom'"

# The units, as installed (BINDIR substituted), verify.
if command -v systemd-analyze >/dev/null 2>&1; then
    mkdir -p "$T/u/man/man1"
    cp "$SRC/docs/man/heapctl.1" "$T/u/man/man1/"
    sed "s|@BINDIR@|$(cd "$BUILD" && pwd)|" "$SRC/systemd/heapd-metrics.service.in" >"$T/u/heapd-metrics.service"
    cp "$SRC/systemd/heapd-metrics.timer" "$T/u/"
    if (cd "$T/u" && MANPATH=$T/u/man: SYSTEMD_LOG_LEVEL=notice systemd-analyze verify \
            ./heapd-metrics.service ./heapd-metrics.timer) >"$T/verify.out" 2>&1 && [ ! -s "$T/verify.out" ]; then
        ok "systemd-analyze verify heapd-metrics.service heapd-metrics.timer"
    else
        bad "systemd-analyze verify:"; sed 's/^/    /' "$T/verify.out"
    fi
else
    echo "    skipped: systemd-analyze not installed"
fi

[ $fails = 0 ] && echo "it_metrics: all passed" || echo "it_metrics: $fails failed"
[ $fails = 0 ]
