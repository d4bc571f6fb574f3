#!/bin/sh
# it_service.sh - heapd as a service: options, configuration errors with
# FILE:LINE, --check-config, readiness through a NOTIFY_SOCKET this test
# listens on, SIGHUP reload (good and bad file), SIGTERM with clients
# attached, socket activation (LISTEN_PID/LISTEN_FDS), make install into a
# DESTDIR (file list, pkg-config), a program built against the installed
# heapc.pc attaching to a heapd, make uninstall, the man pages and
# systemd-analyze verify of the units.
#
# Run by tests/run.sh (BUILD = build dir, HEAPD_SRC = source root); exit 0 =
# pass. Everything it starts is stopped on exit (trap); its files live in a
# temporary directory that is removed.
# shellcheck disable=SC2015  # `cond && pass || fail`: pass and fail always succeed
set -u
BUILD=${BUILD:-build}
HEAPD_SRC=${HEAPD_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
. "$HEAPD_SRC/tests/lib.sh"
B=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "FAIL: no build directory $BUILD"; exit 1; }
HEAPD=$B/heapd
HEAPCTL=$B/heapctl
ACTIVATE=$B/tests/prog_activate
NLISTEN=$B/tests/prog_notify_listen
RANK=$B/tests/prog_rank
skips=""

skip() { echo "skipped: $*"; skips="$skips
skipped: $*"; }

for p in "$HEAPD" "$HEAPCTL" "$ACTIVATE" "$NLISTEN" "$RANK"; do
    if [ ! -x "$p" ]; then
        echo "FAIL: $p not built; run make first"
        exit 1
    fi
done

lib_tmpdir svc || { echo "FAIL: mktemp"; exit 1; }
W=$T
PIDS=""
# stop_all: what is still running gets SIGTERM, then SIGKILL after 3 s.
stop_all() {
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $PIDS; do
        i=0
        while kill -0 "$p" 2>/dev/null && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
        kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null
}
lib_on_exit stop_all
trap 'exit 1' HUP

# forget PID: it has ended (no longer killed by cleanup).
forget() {
    n=""
    for p in $PIDS; do [ "$p" = "$1" ] || n="$n $p"; done
    PIDS=$n
}

# wait_exit SECONDS PID: waits for PID to end; sets $rc to its exit status
# (or 999 if it is still running after SECONDS; it is then left to cleanup).
wait_exit() {
    t=$(($1 * 10))
    while kill -0 "$2" 2>/dev/null && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
    if kill -0 "$2" 2>/dev/null; then rc=999; return 1; fi
    wait "$2"; rc=$?
    forget "$2"
    return 0
}

count() { grep -c -e "$2" "$1" 2>/dev/null; } # count FILE PATTERN
more_than() { [ "$(count "$1" "$2")" -gt "$3" ]; } # more_than FILE PATTERN N
alive() { kill -0 "$1" 2>/dev/null; }
show() { sed 's/^/    | /' "$1"; }

# expect_rc WHAT GOT WANT
expect_rc() {
    if [ "$2" = "$3" ]; then pass; else fail "$1: exit status $2, want $3"; fi
}

# ---- options ----------------------------------------------------------------
"$HEAPD" --help > "$W/out" 2> "$W/err"; expect_rc "heapd --help" $? 0
has_re "$W/out" "^usage: heapd" && has_re "$W/out" "check-config" && pass || fail "--help output: $(head -3 "$W/out")"
"$HEAPD" --version > "$W/out" 2> "$W/err"; expect_rc "heapd --version" $? 0
has_re "$W/out" "^heapd [0-9]" && pass || fail "--version prints '$(cat "$W/out")'"
"$HEAPD" --frobnicate > "$W/out" 2> "$W/err"; expect_rc "heapd --frobnicate" $? 2
"$HEAPD" extra-arg > "$W/out" 2> "$W/err"; expect_rc "heapd extra-arg" $? 2
has_re "$W/err" 'unexpected argument "extra-arg"' && pass || fail "extra argument message: $(cat "$W/err")"
"$HEAPD" --backend gpu --check-config -c /dev/null > "$W/out" 2> "$W/err"; expect_rc "--backend gpu" $? 2
"$HEAPD" --log-level loud --check-config -c /dev/null > "$W/out" 2> "$W/err"; expect_rc "--log-level loud" $? 2
"$HEAPD" --socket relative.sock --check-config -c /dev/null > "$W/out" 2> "$W/err"; expect_rc "--socket relative" $? 2
echo "ok: options"

# ---- configuration errors: FILE:LINE ---------------------------------------
# bad_config NAME LINE PATTERN CONTENT: heapd (started for real, and with
# --check-config) must exit 1 and report NAME.conf:LINE: PATTERN.
bad_config() {
    f=$W/$1.conf
    printf '%s' "$4" > "$f"
    "$HEAPD" -c "$f" --check-config > "$W/out" 2> "$W/err"
    expect_rc "--check-config $1" $? 1
    if grep -q -E "^heapd: $f:$2: $3" "$W/err"; then pass; else
        fail "config $1: want '$f:$2: $3' on stderr, got: $(cat "$W/err")"
    fi
    [ -s "$W/out" ] && fail "config $1: --check-config printed values for a bad file: $(cat "$W/out")"
    # The same file, starting for real: exits 1 before binding anything.
    "$HEAPD" -c "$f" --socket "$W/never.sock" --backend host > "$W/out" 2> "$W/err"
    expect_rc "heapd -c $1" $? 1
    grep -q -E "$f:$2: $3" "$W/err" && pass || fail "config $1 at start: $(cat "$W/err")"
    [ -e "$W/never.sock" ] && fail "config $1: heapd bound its socket despite the error"
}
bad_config unknown_key 3 'unknown key "chunksize"' \
    '# a comment
backend = host
chunksize = 64M
'
bad_config bad_size 2 'chunk_size: "12Q" is not a size' \
    'log_level = info
chunk_size = 12Q
'
bad_config bad_backend 4 'backend: "gpu" is not one of auto, cuda, host' \
    '; comment

socket = /run/heapd/heapd.sock
backend = gpu
'
# A section header is an error at its own line (issue 20: even without a key after it).
bad_config section 3 'unknown section \[heap\]' \
    'backend = host

[heap]
chunk_size = 64M
'
bad_config syntax 2 'syntax error' \
    'backend = host
just some words
'
bad_config bad_mode 1 'socket_mode: "0999"' 'socket_mode = 0999
'
bad_config bad_level 1 'log_level: "loud"' 'log_level = loud
'
bad_config bad_policy 1 'policy: "best"' 'policy = best
'
bad_config bad_timeout 1 'collect_timeout_ms: "0"' 'collect_timeout_ms = 0
'
# Cross-key checks name the key set in the file, its line and the values (issue 20).
printf 'min_block = 3000\n' > "$W/cross.conf"
"$HEAPD" -c "$W/cross.conf" --check-config > "$W/out" 2> "$W/err"; expect_rc "inconsistent defaults" $? 1
has_re "$W/err" "$W/cross.conf:1: min_block = 3000 B is not a power of two" && pass ||
    fail "inconsistent defaults message: $(cat "$W/err")"
"$HEAPD" -c "$W/does-not-exist.conf" --check-config > "$W/out" 2> "$W/err"; expect_rc "missing config" $? 1
has_re "$W/err" "does-not-exist.conf: cannot open" && pass || fail "missing config message: $(cat "$W/err")"
echo "ok: configuration errors name FILE:LINE"

# ---- --check-config on valid files ----------------------------------------
"$HEAPD" -c "$HEAPD_SRC/heapd.conf" --check-config > "$W/shipped.out" 2> "$W/err"
expect_rc "--check-config heapd.conf" $? 0
has_re "$W/shipped.out" "^$HEAPD_SRC/heapd.conf: ok" && pass || fail "--check-config: no 'ok' line: $(cat "$W/shipped.out")"
# Every key config.c accepts: printed by --check-config, shown with its
# default in the shipped heapd.conf, documented in heapd.conf(5) and in
# docs/operations.md.
KEYS=$(sed -n -e 's/^ *{"\([a-z_]*\)", parse_.*/\1/p' "$HEAPD_SRC/daemon/config.c" | sort -u)
nkeys=$(echo "$KEYS" | wc -w)
if [ "$nkeys" -ge 12 ]; then pass; else fail "found only $nkeys keys in daemon/config.c: $KEYS"; fi
for k in $KEYS; do
    has_re "$W/shipped.out" "^$k = " || fail "--check-config does not print $k"
    has_re "$HEAPD_SRC/heapd.conf" "^$k =" || fail "heapd.conf does not show $k"
    grep -q -E "^\\.BR $k \" \\(default " "$HEAPD_SRC/docs/man/heapd.conf.5" ||
        fail "heapd.conf(5) does not document $k with its default"
    has_re "$HEAPD_SRC/docs/operations.md" "| \`$k\` |" || fail "docs/operations.md does not list $k"
done
pass
# The shipped file shows the built-in defaults (backend excepted: auto).
"$HEAPD" -c /dev/null --check-config > "$W/defaults.out" 2> "$W/err"
expect_rc "--check-config /dev/null" $? 0
if [ "$(sed 1d "$W/defaults.out" | grep -v '^backend')" = "$(sed 1d "$W/shipped.out" | grep -v '^backend')" ]; then
    pass
else
    fail "heapd.conf values differ from the built-in defaults: $(sed 1d "$W/shipped.out" | diff - "$W/defaults.out" | tr '\n' ' ')"
fi
has_re "$W/defaults.out" "^backend = auto" && pass || fail "default backend is not auto"
# Options override the file.
"$HEAPD" -c "$HEAPD_SRC/heapd.conf" --check-config --backend cuda --socket "$W/x.sock" -l debug > "$W/out" 2> "$W/err"
expect_rc "--check-config with overrides" $? 0
has_re "$W/out" "^backend = cuda" && has_re "$W/out" "^socket = $W/x.sock" && has_re "$W/out" "^log_level = debug" && pass ||
    fail "--check-config ignores --backend/--socket/--log-level: $(cat "$W/out")"
# What --check-config prints is itself a valid heapd.conf with the same values.
sed 1d "$W/out" > "$W/roundtrip.conf"
"$HEAPD" -c "$W/roundtrip.conf" --check-config > "$W/out2" 2> "$W/err"
expect_rc "--check-config on its own output" $? 0
[ "$(sed 1d "$W/out2")" = "$(cat "$W/roundtrip.conf")" ] && pass ||
    fail "--check-config output does not read back: $(cat "$W/err") $(diff "$W/roundtrip.conf" "$W/out2" | tr '\n' ' ')"
# inih syntax: ';' comments after a value, ':' as separator, last value wins.
printf 'chunk_size = 2M ; two MiB\nva_size: 1G\npolicy = coalesce\npolicy = seed\n' > "$W/syntax.conf"
"$HEAPD" -c "$W/syntax.conf" --check-config > "$W/out" 2> "$W/err"
expect_rc "--check-config syntax.conf" $? 0
has_re "$W/out" "^chunk_size = 2097152" && has_re "$W/out" "^va_size = 1073741824" && has_re "$W/out" "^policy = seed" &&
    pass || fail "syntax.conf values: $(cat "$W/out") $(cat "$W/err")"
echo "ok: --check-config"

# ---- a heapd with its own socket: readiness, SIGHUP, SIGTERM ----------------
SOCK=$W/heapd.sock
CONF=$W/heapd.conf
write_conf() { # write_conf LEVEL [EXTRA LINE]
    printf 'socket = %s\nsocket_mode = 0660\nbackend = host\nlog_level = %s\nchunk_size = 2M\n%s\n' \
        "$SOCK" "$1" "${2:-}" > "$CONF"
}
write_conf info

# start_notify NAME: a notification listener on $W/NAME.nsock writing $W/NAME.notify.
start_notify() {
    "$NLISTEN" "$W/$1.nsock" "$W/$1.notify" 300 2> "$W/$1.nlisten.err" &
    NPID=$!
    PIDS="$PIDS $NPID"
    within 30 test -e "$W/$1.notify" || fail "prog_notify_listen did not start: $(cat "$W/$1.nlisten.err")"
}

start_notify own
NOTIFY_SOCKET=$W/own.nsock "$HEAPD" --config "$CONF" 2> "$W/heapd.log" &
HD=$!
PIDS="$PIDS $HD"
if within 30 has_re "$W/own.notify" "^READY=1$"; then
    # READY=1 promises a listening socket.
    [ -S "$SOCK" ] && pass || fail "READY=1 sent but $SOCK is not a socket"
    ok "readiness: READY=1 received on NOTIFY_SOCKET"
else
    fail "no READY=1 on NOTIFY_SOCKET within 30 s; notifications: $(cat "$W/own.notify"); log:"; show "$W/heapd.log"
fi
has_re "$W/own.notify" "^STATUS=.*heaps.*clients.*backend host" && pass || fail "no STATUS= line: $(cat "$W/own.notify")"
has_re "$W/own.notify" "^MAINPID=$HD$" && pass || fail "MAINPID is not heapd's pid $HD: $(cat "$W/own.notify")"
mode=$(stat -c %a "$SOCK" 2>/dev/null)
[ "$mode" = 660 ] && pass || fail "socket mode $mode, want 660 (socket_mode)"
"$HEAPCTL" --socket "$SOCK" stats > "$W/out" 2> "$W/err"; expect_rc "heapctl stats (own socket)" $? 0
has_re "$W/out" "backend host" && pass || fail "heapctl stats output: $(cat "$W/out") $(cat "$W/err")"

# SIGHUP: log_level info -> debug.
write_conf debug
kill -HUP "$HD"
if within 30 has_re "$W/heapd.log" "SIGHUP: configuration reloaded from $CONF"; then
    ok "SIGHUP reload logged"
else
    fail "SIGHUP: no 'configuration reloaded' in the log:"; show "$W/heapd.log"
fi
within 30 more_than "$W/own.notify" '^READY=1$' 1 && has_re "$W/own.notify" "^RELOADING=1$" && pass ||
    fail "SIGHUP: want RELOADING=1 then READY=1: $(cat "$W/own.notify")"
"$HEAPCTL" --socket "$SOCK" heaps > "$W/out" 2> "$W/err"; expect_rc "heapctl heaps after SIGHUP" $? 0
# The new level is in force: debug logs every connection.
within 30 has_re "$W/heapd.log" "debug: client connected" && pass ||
    fail "log_level = debug not applied after SIGHUP:"
# A setting that needs a restart is named and kept.
write_conf debug "max_clients = 7"
kill -HUP "$HD"
within 30 has_re "$W/heapd.log" "max_clients changed; restart heapd to apply" && pass ||
    fail "SIGHUP: a max_clients change is not reported as needing a restart"
# A bad file: reported with FILE:LINE, nothing applied, heapd keeps running.
write_conf info "bogus_key = 1"
kill -HUP "$HD"
if within 30 has_re "$W/heapd.log" "SIGHUP: configuration not reloaded: $CONF:6: unknown key \"bogus_key\""; then
    ok "SIGHUP with a bad file reported with FILE:LINE"
else
    fail "SIGHUP with a bad file: no 'configuration not reloaded: $CONF:6:' in the log:"; show "$W/heapd.log"
fi
sleep 0.2
alive "$HD" && pass || fail "heapd died after a SIGHUP with a bad file"
"$HEAPCTL" --socket "$SOCK" stats > "$W/out" 2> "$W/err"; expect_rc "heapctl stats after a bad SIGHUP" $? 0
# ... and the level stayed debug (the bad file said info).
n1=$(count "$W/heapd.log" "debug: client connected")
"$HEAPCTL" --socket "$SOCK" heaps > /dev/null 2>&1
within 30 more_than "$W/heapd.log" "debug: client connected" "$n1" && pass ||
    fail "a bad file on SIGHUP changed the log level"

# An empty file, a directory and a missing file (issue 15 item 10): the
# running configuration stays (quota_uid, admin_group, log level) and the log
# says why; heapd never reloads the built-in defaults.
: > "$CONF"
kill -HUP "$HD"
within 30 has "$W/heapd.log" "SIGHUP: configuration not reloaded: $CONF: has no keys" && pass ||
    { fail "SIGHUP with an empty file: no 'has no keys' in the log:"; show "$W/heapd.log"; }
rm -f "$CONF"; mkdir "$CONF"
kill -HUP "$HD"
within 30 has "$W/heapd.log" "SIGHUP: configuration not reloaded: $CONF: is a directory" && pass ||
    { fail "SIGHUP with a directory: no 'is a directory' in the log:"; show "$W/heapd.log"; }
rmdir "$CONF"; mkfifo "$CONF"
kill -HUP "$HD"
within 30 has "$W/heapd.log" "SIGHUP: configuration not reloaded: $CONF: is not a regular file" && pass ||
    { fail "SIGHUP with a FIFO: no 'is not a regular file' in the log (or heapd blocked on it):"; show "$W/heapd.log"; }
rm -f "$CONF"
kill -HUP "$HD"
within 30 has "$W/heapd.log" "SIGHUP: configuration not reloaded: $CONF: cannot open: No such file" && pass ||
    { fail "SIGHUP with a missing file: no 'cannot open' in the log:"; show "$W/heapd.log"; }
has "$W/heapd.log" "configuration reloaded from $CONF" && [ "$(count "$W/heapd.log" "configuration reloaded from")" -eq 2 ] &&
    pass || fail "a SIGHUP with an empty, directory, FIFO or missing file was logged as reloaded"
n1=$(count "$W/heapd.log" "debug: client connected")
"$HEAPCTL" --socket "$SOCK" heaps > /dev/null 2>&1
within 30 more_than "$W/heapd.log" "debug: client connected" "$n1" && pass ||
    fail "a SIGHUP with an empty file changed the log level (the built-in default is info)"
write_conf debug

# SIGTERM with clients attached: two ranks of one heap.
"$RANK" --socket "$SOCK" --heap svc --rank 0 --world 2 alloc 1M sleep 3000 alloc 1M > "$W/rank0.out" 2> "$W/rank0.err" &
R0=$!
"$RANK" --socket "$SOCK" --heap svc --rank 1 --world 2 alloc 1M sleep 3000 alloc 1M > "$W/rank1.out" 2> "$W/rank1.err" &
R1=$!
PIDS="$PIDS $R0 $R1"
if within 30 has_re "$W/rank0.out" "^a 0 " && within 30 has_re "$W/rank1.out" "^a 0 "; then pass; else
    fail "ranks did not attach and allocate: $(cat "$W/rank0.out" "$W/rank0.err" "$W/rank1.out" "$W/rank1.err")"
fi
"$HEAPCTL" --socket "$SOCK" heaps > "$W/out" 2> "$W/err"
has_re "$W/out" "^svc .*world 2 .*clients 2" && pass || fail "heapctl heaps with 2 ranks attached: $(cat "$W/out")"
kill -TERM "$HD"
if wait_exit 5 "$HD"; then
    expect_rc "heapd after SIGTERM" "$rc" 0
    ok "SIGTERM with clients attached: heapd exited $rc"
else
    fail "heapd still running 5 s after SIGTERM"
fi
[ -e "$SOCK" ] && fail "heapd left its socket $SOCK after SIGTERM" || pass
has_re "$W/own.notify" "^STOPPING=1$" && pass || fail "no STOPPING=1 on NOTIFY_SOCKET: $(cat "$W/own.notify")"
has_re "$W/heapd.log" 'heap "svc" destroyed' && has_re "$W/heapd.log" "info: stopped" && pass ||
    { fail "SIGTERM: heap not destroyed / no 'stopped' in the log:"; show "$W/heapd.log"; }
for r in 0 1; do
    if [ $r = 0 ]; then rp=$R0; else rp=$R1; fi
    if wait_exit 6 "$rp"; then
        # prog_rank: 7 = connection closed (HEAPC_ECONN), 1 = other errors (ERR_SHUTDOWN).
        if [ "$rc" != 0 ] && has_re "$W/rank$r.err" "error: ERR_\(CONN\|SHUTDOWN\)"; then pass; else
            fail "rank $r after SIGTERM: exit $rc, stderr: $(cat "$W/rank$r.err")"
        fi
    else
        fail "rank $r still running after heapd stopped"
    fi
done
kill -TERM "$NPID" 2>/dev/null; wait_exit 3 "$NPID"
echo "ok: clients saw an error after SIGTERM"

# ---- socket activation ------------------------------------------------------
# prog_activate binds the socket, puts it on fd 3 and execs heapd with
# LISTEN_PID = its own (heapd's) pid and LISTEN_FDS = 1, as systemd does.
ASOCK=$W/act.sock
printf 'socket = %s/unused.sock\nbackend = host\n' "$W" > "$W/act.conf"
start_notify act
NOTIFY_SOCKET=$W/act.nsock "$ACTIVATE" "$ASOCK" "$HEAPD" --config "$W/act.conf" 2> "$W/act.log" &
HA=$!
PIDS="$PIDS $HA"
within 30 has_re "$W/act.notify" "^READY=1$" && pass ||
    { fail "socket-activated heapd: no READY=1: $(cat "$W/act.notify")"; show "$W/act.log"; }
has_re "$W/act.log" "using the socket passed by systemd" && pass || { fail "heapd did not take the passed socket:"; show "$W/act.log"; }
[ -e "$W/unused.sock" ] && fail "socket-activated heapd also bound its configured socket" || pass
"$HEAPCTL" --socket "$ASOCK" stats > "$W/out" 2> "$W/err"
expect_rc "heapctl stats through the activated socket" $? 0
has_re "$W/out" "^heapd .*backend host" && ok "socket activation: heapctl talks to heapd through fd 3" ||
    fail "heapctl stats (activated): $(cat "$W/out") $(cat "$W/err")"
"$RANK" --socket "$ASOCK" --heap act --rank 0 --world 1 alloc 4K > "$W/out" 2> "$W/err"
expect_rc "prog_rank through the activated socket" $? 0
kill -TERM "$HA"
wait_exit 5 "$HA" && expect_rc "socket-activated heapd after SIGTERM" "$rc" 0 || fail "socket-activated heapd did not stop"
has_re "$W/act.notify" "^STOPPING=1$" && pass || fail "socket-activated heapd: no STOPPING=1"
# The socket belongs to the activator (systemd): heapd leaves the file.
[ -S "$ASOCK" ] && pass || fail "socket-activated heapd removed systemd's socket file"
kill -TERM "$NPID" 2>/dev/null; wait_exit 3 "$NPID"

# LISTEN_PID naming another process: not for heapd, which binds its own.
LISTEN_PID=1 LISTEN_FDS=1 "$HEAPD" --config "$W/act.conf" 2> "$W/notmine.log" 3<&- &
HN=$!
PIDS="$PIDS $HN"
if within 30 test -S "$W/unused.sock"; then
    "$HEAPCTL" --socket "$W/unused.sock" heaps > "$W/out" 2> "$W/err"
    expect_rc "heapctl with LISTEN_PID of another process" $? 0
else
    fail "heapd with LISTEN_PID=1 did not bind its own socket:"; show "$W/notmine.log"
fi
has_re "$W/notmine.log" "passed by systemd" && fail "heapd took fd 3 although LISTEN_PID is not its pid"
kill -TERM "$HN"; wait_exit 5 "$HN" && expect_rc "heapd (LISTEN_PID=1) after SIGTERM" "$rc" 0
echo "ok: socket activation"

# ---- make install into a DESTDIR --------------------------------------------
D=$W/destdir
# A make of its own (not the jobserver of a surrounding make check), with the
# build switches $B was built with, so that `install: all` relinks nothing
# differently: those of a surrounding make, else a sanitizer seen in libheapc.
san=""
nm -D "$B/libheapc.so" 2>/dev/null | grep -q __asan_ && san=address
nm -D "$B/libheapc.so" 2>/dev/null | grep -q __ubsan_ && san="${san:+$san,}undefined"
SAN=${san:+-fsanitize=$san}
SWITCHES=${san:+SANITIZE=$san}
# STATIC=1 builds link libuv statically.
ldd "$B/heapd" 2>/dev/null | grep -q libuv || SWITCHES="$SWITCHES STATIC=1"
for w in ${MAKEFLAGS:-}; do
    case "$w" in SANITIZE=*|DEBUG=*|WERROR=*|STATIC=*|CUDA_HOME=*) SWITCHES="$SWITCHES $w" ;; esac
done
domake() {
    # shellcheck disable=SC2086
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$HEAPD_SRC" --no-print-directory HEAPD_NO_DEPS=1 \
        $SWITCHES BUILD="$B" DESTDIR="$D" PREFIX=/usr "$@"
}
if domake install > "$W/install.log" 2>&1; then pass; else
    fail "make install DESTDIR=$D PREFIX=/usr failed:"; tail -20 "$W/install.log" | show /dev/stdin
fi
(cd "$D" && find . ! -type d | sed 's|^\./||' | sort) > "$W/files"
cat > "$W/files.want" <<'EOF'
etc/heapd/heapd.conf
usr/bin/heapctl
usr/bin/heapsim
usr/include/heapc.h
usr/include/heapc_nccl.h
usr/lib/libheapc.a
usr/lib/libheapc.so
usr/lib/libheapc.so.0
usr/lib/libheapc_nccl.a
usr/lib/libheapc_nccl.so
usr/lib/libheapc_nccl.so.0
usr/lib/libheapc_nccl_preload.so
usr/lib/libheapc_torch.so
usr/lib/pkgconfig/heapc.pc
usr/lib/pkgconfig/heapc_nccl.pc
usr/lib/python3/dist-packages/heapd/__init__.py
usr/lib/python3/dist-packages/heapd/_args.py
usr/lib/python3/dist-packages/heapd/_errors.py
usr/lib/python3/dist-packages/heapd/_lib.py
usr/lib/python3/dist-packages/heapd/_release.py
usr/lib/python3/dist-packages/heapd/_resume.py
usr/lib/python3/dist-packages/heapd/_stats.py
usr/lib/python3/dist-packages/heapd/_windows.py
usr/lib/python3/dist-packages/heapd/torch.py
usr/lib/systemd/system/heapd-metrics.service
usr/lib/systemd/system/heapd-metrics.timer
usr/lib/systemd/system/heapd.service
usr/lib/systemd/system/heapd.socket
usr/lib/sysusers.d/heapd.conf
usr/lib/tmpfiles.d/heapd.conf
usr/sbin/heapd
usr/share/man/man1/heapctl.1
usr/share/man/man3/libheapc.3
usr/share/man/man3/libheapc_nccl.3
usr/share/man/man5/heapd.conf.5
usr/share/man/man8/heapd.8
EOF
echo "installed files:"; sed 's/^/    /' "$W/files"
if cmp -s "$W/files" "$W/files.want"; then ok "make install: the file list is as expected"; else
    fail "make install file list differs (< got, > want):"; diff "$W/files" "$W/files.want" | show /dev/stdin
fi
for f in usr/sbin/heapd usr/bin/heapctl usr/bin/heapsim usr/lib/libheapc.so.0; do
    [ -x "$D/$f" ] || fail "$f is not executable"
done
[ -L "$D/usr/lib/libheapc.so" ] && [ "$(readlink "$D/usr/lib/libheapc.so")" = libheapc.so.0 ] && pass ||
    fail "libheapc.so is not a link to libheapc.so.0"
grep -q '@[A-Z_]*@' "$D/usr/lib/systemd/system/heapd.service" "$D/usr/lib/systemd/system/heapd-metrics.service" "$D/usr/lib/pkgconfig/heapc.pc" &&
    fail "@VARIABLE@ left in the installed unit or heapc.pc: $(grep -h '@[A-Z_]*@' "$D/usr/lib/systemd/system/heapd.service" "$D/usr/lib/pkgconfig/heapc.pc")"
has_re "$D/usr/lib/systemd/system/heapd.service" "^ExecStart=/usr/sbin/heapd --config /etc/heapd/heapd.conf$" && pass ||
    fail "installed heapd.service ExecStart: $(grep ExecStart "$D/usr/lib/systemd/system/heapd.service")"
has_re "$D/etc/heapd/heapd.conf" "^backend = auto$" && pass || fail "installed heapd.conf does not say backend = auto"
"$D/usr/sbin/heapd" -c "$D/etc/heapd/heapd.conf" --check-config > "$W/out" 2> "$W/err"
expect_rc "installed heapd --check-config on the installed heapd.conf" $? 0
# An operator's configuration is never overwritten.
echo "# changed by the operator" >> "$D/etc/heapd/heapd.conf"
domake install > "$W/install2.log" 2>&1 || fail "second make install failed: $(tail -5 "$W/install2.log")"
has_re "$D/etc/heapd/heapd.conf" "^# changed by the operator" && ok "make install keeps an existing heapd.conf" ||
    fail "make install overwrote the operator's heapd.conf"
has_re "$W/install2.log" "kept .*heapd.conf" && pass || fail "make install does not say it kept heapd.conf"

# ---- a program built against the installed heapc.pc -------------------------
cat > "$W/attach.c" <<'EOF'
/* Built against the installed libheapc: connects, attaches a 1-rank heap,
 * allocates, writes, frees, collects, detaches. */
#include <heapc.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    heapc *c = heapc_connect(argc > 1 ? argv[1] : NULL);
    if (!c || heapc_err(c)) {
        fprintf(stderr, "connect: %s\n", c ? heapc_errstr(c) : "out of memory");
        return 1;
    }
    void *p = NULL;
    uint64_t off = 0;
    if (heapc_attach(c, "installed", 0, 1, NULL) || heapc_alloc(c, 1 << 20, &p, &off)) {
        fprintf(stderr, "%s: %s\n", heapc_errname(heapc_err(c)), heapc_errstr(c));
        return 1;
    }
    memset(p, 0x5a, 1 << 20);   /* host backend: an ordinary pointer */
    if (heapc_peer_ptr(c, 0, off) != p || heapc_free(c, off) || heapc_collect(c) || heapc_detach(c)) {
        fprintf(stderr, "%s: %s\n", heapc_errname(heapc_err(c)), heapc_errstr(c));
        return 1;
    }
    printf("ok %s backend %s offset %llu\n", heapc_server(c), heapc_backend(c), (unsigned long long)off);
    heapc_free_ctx(c);
    return 0;
}
EOF
# pkg-config against the DESTDIR tree only: --define-prefix maps the .pc's
# ${prefix} to $D/usr (the .pc lies in $D/usr/lib/pkgconfig).
PC="env PKG_CONFIG_LIBDIR=$D/usr/lib/pkgconfig PKG_CONFIG_PATH= pkg-config --define-prefix"
$PC --exists heapc && pass || fail "pkg-config does not find the installed heapc.pc"
[ "$($PC --modversion heapc)" = "$(sed -n 's/^VERSION *:= *//p' "$HEAPD_SRC/Makefile")" ] && pass ||
    fail "heapc.pc version $($PC --modversion heapc)"
FLAGS=$($PC --cflags --libs heapc)
case "$FLAGS" in *"-I$D/usr/include"*"-L$D/usr/lib"*"-lheapc"*|*"-L$D/usr/lib"*"-lheapc"*"-I$D/usr/include"*) pass ;;
    *) fail "pkg-config --cflags --libs heapc: '$FLAGS'" ;; esac
SFLAGS=$($PC --static --libs heapc)
case "$SFLAGS" in *-lprotobuf-c*) pass ;; *) fail "pkg-config --static --libs heapc lacks -lprotobuf-c: '$SFLAGS'" ;; esac
# A sanitizer build's libheapc needs the program linked with the same runtime ($SAN).
# shellcheck disable=SC2086
if ${CC:-cc} $SAN -o "$W/attach" "$W/attach.c" $FLAGS 2> "$W/cc.err"; then pass; else
    fail "cc against the installed heapc.pc failed: $(cat "$W/cc.err")"
fi
# Static: libheapc.a plus Libs.private.
SLIBS=$($PC --static --libs-only-l heapc | sed 's/-lheapc//')
CFL=$($PC --cflags heapc)
# shellcheck disable=SC2086
if ${CC:-cc} $SAN -o "$W/attach_static" "$W/attach.c" $CFL "$D/usr/lib/libheapc.a" $SLIBS 2> "$W/cc.err"; then
    pass
else
    fail "static link with libheapc.a and Libs.private failed: $(cat "$W/cc.err")"
fi
# The installed heapd, with the installed configuration (socket overridden).
ISOCK=$W/inst.sock
"$D/usr/sbin/heapd" -c "$D/etc/heapd/heapd.conf" --socket "$ISOCK" --backend host 2> "$W/inst.log" &
HI=$!
PIDS="$PIDS $HI"
if within 30 test -S "$ISOCK"; then
    LD_LIBRARY_PATH=$D/usr/lib "$W/attach" "$ISOCK" > "$W/out" 2> "$W/err"
    expect_rc "program built against the installed heapc.pc" $? 0
    has_re "$W/out" "^ok heapd .* backend host offset 0" && ok "a program built with pkg-config heapc attached and allocated" ||
        fail "attach program output: $(cat "$W/out") $(cat "$W/err")"
    LD_LIBRARY_PATH=$D/usr/lib ldd "$W/attach" 2>/dev/null | grep -q "libheapc.so.0 => $D/usr/lib/libheapc.so.0" && pass ||
        fail "the program does not load the installed libheapc.so.0: $(LD_LIBRARY_PATH=$D/usr/lib ldd "$W/attach" | grep heapc)"
    if [ -x "$W/attach_static" ]; then
        "$W/attach_static" "$ISOCK" > "$W/out" 2> "$W/err"
        expect_rc "statically linked program" $? 0
    fi
    "$D/usr/bin/heapctl" --socket "$ISOCK" stats > "$W/out" 2> "$W/err"
    expect_rc "installed heapctl" $? 0
else
    fail "the installed heapd did not start:"; show "$W/inst.log"
fi
kill -TERM "$HI"; wait_exit 5 "$HI" && expect_rc "installed heapd after SIGTERM" "$rc" 0

# ---- man pages ----------------------------------------------------------------
if command -v groff > /dev/null 2>&1; then
    for m in "$D"/usr/share/man/man*/*; do
        groff -man -Tutf8 -ww -z "$m" > "$W/groff.err" 2>&1
        if [ -s "$W/groff.err" ]; then fail "groff warnings in $(basename "$m"): $(cat "$W/groff.err")"; else pass; fi
    done
    echo "ok: man pages render without warnings"
else
    skip "groff not installed: man pages not render-checked"
fi

# ---- systemd-analyze verify ---------------------------------------------------
if command -v systemd-analyze > /dev/null 2>&1; then
    # The installed units, their binary paths pointed into the DESTDIR; the
    # Documentation= man pages are looked up in the DESTDIR too.
    U=$W/units
    mkdir -p "$U"
    sed "s|/usr/sbin/heapd|$D/usr/sbin/heapd|g" "$D/usr/lib/systemd/system/heapd.service" > "$U/heapd.service"
    cp "$D/usr/lib/systemd/system/heapd.socket" "$U/heapd.socket"
    if (cd "$U" && MANPATH=$D/usr/share/man: SYSTEMD_LOG_LEVEL=notice systemd-analyze verify \
            ./heapd.service ./heapd.socket) > "$W/verify.out" 2>&1 && [ ! -s "$W/verify.out" ]; then
        ok "systemd-analyze verify heapd.service heapd.socket"
    else
        fail "systemd-analyze verify:"; show "$W/verify.out"
    fi
    has_re "$D/usr/lib/systemd/system/heapd.service" "^Type=notify$" && pass || fail "heapd.service is not Type=notify"
    grep -q "^PrivateDevices=yes" "$D/usr/lib/systemd/system/heapd.service" && fail "heapd.service sets PrivateDevices (hides /dev/nvidia*)"
else
    skip "systemd-analyze not installed"
fi

# ---- the installed Python package finds the installed libheapc -----------------
if nm -D "$D/usr/lib/libheapc.so.0" 2>/dev/null | grep -q __asan_init; then
    skip "installed python package: libheapc is ASan-instrumented (python cannot load it without LD_PRELOAD of libasan)"
elif /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
    out=$(cd / && env -u HEAPC_LIB LD_LIBRARY_PATH="$D/usr/lib" PYTHONPATH="$D/usr/lib/python3/dist-packages" \
        /usr/bin/python3 -c 'import heapd, heapd.torch; print(heapd.__file__, heapd.library_path)' 2>&1)
    case "$out" in
        "$D/usr/lib/python3/dist-packages/heapd/__init__.py libheapc.so.0") ok "installed python package loads the installed libheapc.so.0";;
        *) fail "installed python package: $out";;
    esac
else
    fail "python3-torch or python3-numpy missing (scripts/deps.sh installs them)"
fi

# ---- make uninstall -----------------------------------------------------------
if domake uninstall > "$W/uninstall.log" 2>&1; then pass; else fail "make uninstall failed: $(tail -5 "$W/uninstall.log")"; fi
left=$(cd "$D" && find . ! -type d | sed 's|^\./||' | sort | tr '\n' ' ')
[ "$left" = "etc/heapd/heapd.conf " ] && ok "make uninstall removed everything but the configuration" ||
    fail "after make uninstall: $left"
has_re "$W/uninstall.log" "left .*heapd.conf" && pass || fail "make uninstall does not say it left heapd.conf"

echo "$passes passed, $fails failed"
[ -n "$skips" ] && printf '%s\n' "$skips" | sed '/^$/d'
[ $fails = 0 ]
