#!/bin/sh
# it_logs.sh - heapd's structured logs (issue 20) against a real heapd and
# real ranks: with JOURNAL_STREAM naming its stderr, every event reaches a
# journal-protocol listener (tests/journal_listen.py, in place of journald)
# with PRIORITY, MESSAGE and the fields HEAP=, RANK=, PID=, SEQ=, ERR=, REQ=;
# a JOURNAL_STREAM that does not match stderr's device and inode is ignored
# (plain lines); log_format = json gives one valid JSON object per line.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
R=$BUILD/tests/prog_rank
T=$(mktemp -d /tmp/heapd-logs.XXXXXX)
S=$T/heapd.sock
J=$T/journal.sock
hpid=
lpid=
cleanup() {
    [ -n "$hpid" ] && kill -9 "$hpid" 2>/dev/null
    [ -n "$lpid" ] && kill "$lpid" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT INT TERM
stop_heapd() { kill "$hpid"; wait "$hpid" 2>/dev/null; hpid=; rm -f "$S"; }

cat >"$T/heapd.conf" <<EOF2
socket = $S
backend = host
log_level = debug
chunk_size = 1M
va_size = 64M
collect_timeout_ms = 20000
EOF2

# ---- under the journal ------------------------------------------------------------
/usr/bin/python3 "$SRC/tests/journal_listen.py" "$J" "$T/journal.jsonl" &
lpid=$!
wait_for test -S "$J"
: >"$T/stderr"
js=$(stat -c '%d:%i' "$T/stderr")
JOURNAL_STREAM=$js HEAPD_JOURNAL_SOCKET=$J "$BUILD/heapd" --config "$T/heapd.conf" 2>>"$T/stderr" &
hpid=$!
wait_for test -S "$S"
check "heapd starts under a (stand-in) journal" test -S "$S"
"$R" --socket "$S" --heap 'jobλ' --rank 0 --world 1 --chunk 1M -- alloc 4K alloc 2M >"$T/r.out" 2>"$T/r.err"
"$BUILD/heapctl" --socket "$S" collect 'nosuchλ' >/dev/null 2>&1
stop_heapd
kill "$lpid"; wait "$lpid" 2>/dev/null; lpid=
check "nothing went to stderr: every event took the native protocol" test ! -s "$T/stderr"
/usr/bin/python3 - "$T/journal.jsonl" >"$T/jcheck.out" 2>&1 <<'PY'
import json, sys
es = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
bad = [e for e in es if "PARSE_ERROR" in e]
def has(pred, what):
    ok = any(pred(e) for e in es)
    print(("ok   " if ok else "FAIL ") + what)
    return ok
r = [not bad]
print(("ok   " if not bad else "FAIL ") + "%d entries, all well-formed" % len(es))
r.append(has(lambda e: e.get("SYSLOG_IDENTIFIER") == "heapd" and e.get("PRIORITY") == "6" and "MESSAGE" in e,
             "SYSLOG_IDENTIFIER=heapd, PRIORITY=6 (info), MESSAGE"))
r.append(has(lambda e: e.get("HEAP") == "job\u03bb" and e.get("RANK") == "0" and e.get("PID", "").isdigit()
             and e.get("REQ") == "attach", "attach: HEAP=job\u03bb RANK=0 PID= REQ=attach"))
r.append(has(lambda e: e.get("HEAP") == "job\u03bb" and e.get("SEQ") == "1" and e.get("REQ") == "alloc"
             and "grew" in e.get("MESSAGE", ""), "the growth of allocation 1: SEQ=1 REQ=alloc with HEAP"))
r.append(has(lambda e: e.get("ERR") == "ERR_NOT_FOUND" and e.get("PRIORITY") == "7" and e.get("HEAP") == "nosuch\u03bb"
             and e.get("REQ") == "force_collect", "the error sent to heapctl: ERR=ERR_NOT_FOUND PRIORITY=7 HEAP= REQ="))
r.append(has(lambda e: e.get("HEAP") == "job\u03bb" and "disconnect" in e.get("MESSAGE", "") + e.get("REQ", "x")
             or ("destroyed" in e.get("MESSAGE", "") and e.get("HEAP") == "job\u03bb"),
             "the heap's end carries HEAP"))
sys.exit(0 if all(r) else 1)
PY
jrc=$?
sed 's/^/    /' "$T/jcheck.out"
check "journal entries carry the fields" test $jrc = 0

# ---- JOURNAL_STREAM that is not stderr: ignored --------------------------------------
/usr/bin/python3 "$SRC/tests/journal_listen.py" "$J.2" "$T/journal2.jsonl" &
lpid=$!
wait_for test -S "$J.2"
JOURNAL_STREAM=$js HEAPD_JOURNAL_SOCKET=$J.2 "$BUILD/heapd" --config "$T/heapd.conf" 2>"$T/stderr2" &
hpid=$!
wait_for test -S "$S"
stop_heapd
kill "$lpid"; wait "$lpid" 2>/dev/null; lpid=
check "a JOURNAL_STREAM that names another file: plain lines on stderr, nothing to the journal" \
    sh -c "grep -q '^heapd\[[0-9]*\]: info: heapd .* ready' '$T/stderr2' && [ ! -s '$T/journal2.jsonl' ]"

# ---- log_format = json ------------------------------------------------------------------
echo "log_format = json" >>"$T/heapd.conf"
"$BUILD/heapd" --config "$T/heapd.conf" 2>"$T/stderr3" &
hpid=$!
wait_for test -S "$S"
# Heap names are UTF-8 without controls (issue 15); quotes, a backslash and
# U+2028 must still come out as valid JSON.
jsname=$(printf 'js"\\\342\200\250n')
"$R" --socket "$S" --heap "$jsname" --rank 0 --world 1 --chunk 1M -- alloc 2M >/dev/null 2>&1
stop_heapd
check "log_format = json: every line one JSON object (valid UTF-8), fields included" \
    env JSNAME="$jsname" /usr/bin/python3 -c "
import json, os, sys
ls = [l for l in open('$T/stderr3', 'rb').read().decode('utf-8').splitlines() if l]  # U+2028 comes escaped
es = [json.loads(l) for l in ls]
name = os.environb[b'JSNAME'].decode('utf-8')
ok = es and all({'time', 'level', 'message', 'heapd_pid'} <= set(e) for e in es)
ok = ok and any(e.get('heap') == name and e.get('req') == 'alloc' and e.get('seq') == 0 and 'pid' in e for e in es)
sys.exit(not ok)"

[ $fails = 0 ] && echo "it_logs: all passed" || echo "it_logs: $fails failed"
[ $fails = 0 ]
