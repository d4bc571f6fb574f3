# lib.sh - helpers shared by the integration scripts (sourced: . "$SRC/tests/lib.sh").
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
