# lib.sh - helpers shared by the it_*.sh integration scripts and by
# scripts/*.sh (demo, gpu, gpu_torch). Source it after setting BUILD and SRC
# or HEAPD_SRC:  . "$SRC/tests/lib.sh"
#
#   ok NAME / bad NAME       one result line; ok counts into $passes, bad into
#                            $fails
#   pass / fail MSG          a silent pass (counted), a failure naming MSG (as bad)
#   check NAME CMD...        ok when CMD succeeds
#   has FILE TEXT            FILE contains the fixed string TEXT
#   lacks FILE TEXT          FILE does not contain TEXT
#   has_re FILE RE           FILE has a line matching the basic regex RE
#   start_heapd CONF LOG [ARG...]
#                            starts $BUILD/heapd --config CONF ARG... in the background
#                            ($hpid; its stderr appended to LOG) and waits until
#                            its socket ($S) exists (a state, bounded: heapd
#                            dead or 60 s)
#   lib_wait_pid PID SEC     waits until PID exits (SEC s at most); rc gets its
#                            exit status, or 124 when it was still running (it
#                            is then killed)
#   lib_kill VAR...          kill -9 (and reap) the pids held in the variables
#                            named (each may hold a list; empty ones are skipped):
#                            for lib_on_exit 'lib_kill hpid pids'
#   now_ms                   milliseconds since the epoch (for figures only)
#   nfds / rss               $hpid's open fds / VmRSS in kB (from /proc)
#   clean_log LOG            ok when LOG (heapd's stderr) holds no sanitizer
#                            report and no broken invariant, else bad and the
#                            report's first lines
#   wait_for CMD...          runs CMD until it succeeds (every 0.05 s, 60 s at most)
#   within SEC CMD...        the same, SEC s at most (its stderr discarded); 0
#                            when CMD succeeded in time
#   bounded SEC CMD...       CMD killed after SEC s: a hang fails the test, it is
#                            never a timed assertion of success
#   lib_tmpdir NAME          T=a fresh /tmp/heapd-NAME.XXXXXX, removed at exit
#                            (kept when KEEP is set)
#   lib_on_exit CMD          CMD runs at exit (before T is removed), once
#   lib_wait_socket PATH PID [TRIES]
#                            waits (0.05 s steps, 600 by default: 30 s) until
#                            PATH is a socket or PID is gone; 0 if it listens
#
# lib.sh sets an EXIT trap (lib_cleanup) and INT/TERM traps that exit 130
# (so the EXIT trap cleans up); a script that sets its own trap after
# sourcing replaces it (and cleans up itself).
fails=${fails:-0}
passes=${passes:-0}
ok() { echo "ok   $*"; passes=$((passes + 1)); }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
pass() { passes=$((passes + 1)); }
fail() { bad "$@"; }
check() { _n=$1; shift; if "$@"; then ok "$_n"; else bad "$_n"; fi; }
has() { grep -qF -- "$2" "$1"; }
lacks() { ! grep -qF -- "$2" "$1"; }
has_re() { grep -q -e "$2" "$1"; }
wait_for() {
    _i=0
    while ! "$@" && [ $_i -lt 1200 ]; do sleep 0.05; _i=$((_i + 1)); done
    "$@"
}
within() {
    _t=$(($1 * 20)); shift
    while [ $_t -gt 0 ]; do
        if "$@" 2>/dev/null; then return 0; fi
        sleep 0.05; _t=$((_t - 1))
    done
    return 1
}
start_heapd() {
    _c=$1 _l=$2; shift 2
    "$BUILD/heapd" --config "$_c" "$@" 2>>"$_l" &
    hpid=$!
    _i=0
    while [ ! -S "$S" ] && [ $_i -lt 1200 ] && kill -0 "$hpid" 2>/dev/null; do sleep 0.05; _i=$((_i + 1)); done
    test -S "$S"
}
bounded() { _s=$1; shift; timeout -k 5 "$_s" "$@"; }
lib_wait_pid() {
    _i=0
    while kill -0 "$1" 2>/dev/null && [ $_i -lt $(($2 * 20)) ]; do sleep 0.05; _i=$((_i + 1)); done
    if kill -0 "$1" 2>/dev/null; then kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; rc=124; else wait "$1"; rc=$?; fi
}
lib_kill() {
    for _v in "$@"; do
        eval "_p=\${$_v:-}"
        for _q in $_p; do kill -9 "$_q" 2>/dev/null; wait "$_q" 2>/dev/null; done
    done
    return 0
}
nfds() { ls "/proc/$hpid/fd" 2>/dev/null | wc -l; }
rss() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$hpid/status" 2>/dev/null; }
clean_log() {
    if grep -Eq 'invariant broken|AddressSanitizer|LeakSanitizer|runtime error' "$1"; then
        bad "no sanitizer report or broken invariant in heapd's log"
        grep -E -A12 'invariant broken|AddressSanitizer|LeakSanitizer|runtime error' "$1" | head -40
    else
        ok "no sanitizer report or broken invariant in heapd's log"
    fi
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

LIB_ON_EXIT=
LIB_TMP=
lib_cleanup() {
    [ -n "$LIB_ON_EXIT" ] && eval "$LIB_ON_EXIT"
    [ -n "$LIB_TMP" ] && [ -z "${KEEP:-}" ] && rm -rf "$LIB_TMP"
    LIB_ON_EXIT=; LIB_TMP=
}
trap lib_cleanup EXIT
trap 'exit 130' INT TERM

lib_on_exit() { LIB_ON_EXIT="${LIB_ON_EXIT:+$LIB_ON_EXIT; }$1"; }

# lib_node_start N [CONF LINE]: heapd node nN of a test's multi-node heaps
# (host backend, socket $T/nN.sock, 256K chunks, Redis at $REDIS_PORT from
# tests/redis_helper.sh), its log $T/nN.log; its pid in hp_N.
lib_node_start() {
    cat >"$T/n$1.conf" <<EOF
socket = $T/n$1.sock
backend = host
log_level = debug
chunk_size = 256K
va_size = 256M
collect_timeout_ms = 20000
store = redis://127.0.0.1:$REDIS_PORT
node = n$1
${2:-}
EOF
    S=$T/n$1.sock start_heapd "$T/n$1.conf" "$T/n$1.log"
    eval "hp_$1=\$hpid"
}

lib_tmpdir() {
    T=$(mktemp -d "/tmp/heapd-$1.XXXXXX")
    LIB_TMP=$T
}

lib_wait_socket() {
    _i=0
    while [ ! -S "$1" ] && [ $_i -lt "${3:-600}" ] && kill -0 "$2" 2>/dev/null; do
        sleep 0.05; _i=$((_i + 1))
    done
    [ -S "$1" ]
}
