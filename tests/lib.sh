# lib.sh - helpers shared by the it_*.sh integration scripts. Source it
# after setting BUILD and SRC or HEAPD_SRC:  . "$SRC/tests/lib.sh"
#
#   ok NAME / bad NAME       one result line; bad counts into $fails
#   check NAME CMD...        ok when CMD succeeds
#   has FILE TEXT            FILE contains the fixed string TEXT
#   lacks FILE TEXT          FILE does not contain TEXT
#   start_heapd CONF LOG     starts $BUILD/heapd --config CONF in the background
#                            ($hpid) and waits until its socket ($S) exists
#                            (a state, bounded: heapd dead or 60 s)
#   wait_for CMD...          runs CMD until it succeeds (every 0.05 s, 60 s at most)
#   bounded SEC CMD...       CMD killed after SEC s: a hang fails the test, it is
#                            never a timed assertion of success
#   lib_tmpdir NAME          T=a fresh /tmp/heapd-NAME.XXXXXX, removed at exit
#   lib_on_exit CMD          CMD runs at exit (before T is removed), once
#   lib_wait_socket PATH PID [TRIES]
#                            waits (0.05 s steps, 600 by default: 30 s) until
#                            PATH is a socket or PID is gone; 0 if it listens
#
# lib.sh sets an EXIT/INT/TERM trap (lib_cleanup); a script that sets its
# own trap after sourcing replaces it (and cleans up itself).
fails=${fails:-0}
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
check() { _n=$1; shift; if "$@"; then ok "$_n"; else bad "$_n"; fi; }
has() { grep -qF -- "$2" "$1"; }
lacks() { ! grep -qF -- "$2" "$1"; }
wait_for() {
    _i=0
    while ! "$@" && [ $_i -lt 1200 ]; do sleep 0.05; _i=$((_i + 1)); done
    "$@"
}
start_heapd() {
    "$BUILD/heapd" --config "$1" 2>"$2" &
    hpid=$!
    _i=0
    while [ ! -S "$S" ] && [ $_i -lt 1200 ] && kill -0 "$hpid" 2>/dev/null; do sleep 0.05; _i=$((_i + 1)); done
    test -S "$S"
}
bounded() { _s=$1; shift; timeout -k 5 "$_s" "$@"; }

LIB_ON_EXIT=
LIB_TMP=
lib_cleanup() {
    [ -n "$LIB_ON_EXIT" ] && eval "$LIB_ON_EXIT"
    [ -n "$LIB_TMP" ] && rm -rf "$LIB_TMP"
    LIB_ON_EXIT=; LIB_TMP=
}
trap lib_cleanup EXIT INT TERM

lib_on_exit() { LIB_ON_EXIT="${LIB_ON_EXIT:+$LIB_ON_EXIT; }$1"; }

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
