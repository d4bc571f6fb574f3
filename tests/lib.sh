# lib.sh - what the it_*.sh integration scripts share. Source it after
# setting BUILD and HEAPD_SRC:  . "$HEAPD_SRC/tests/lib.sh"
#
#   ok MSG / bad MSG      a result line; bad counts into $fails
#   lib_tmpdir NAME       T=a fresh /tmp/heapd-NAME.XXXXXX, removed at exit
#   lib_on_exit CMD       CMD runs at exit (before T is removed), once
#   lib_wait_socket PATH PID [TRIES]
#                         waits (0.05 s steps, 600 by default: 30 s) until
#                         PATH is a socket or PID is gone; 0 if it listens
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

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
