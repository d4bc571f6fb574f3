#!/bin/sh
# it_layers.sh - the daemon's floors hold (issue 26). Two kinds of rules,
# each a list below:
#   floors    in each rule, a file references (calls, or takes the address
#             of) only symbols defined on floors below its own: never one of
#             its own floor or above. Read from the object files' symbols
#             (nm: defined against undefined), so a callback named from a
#             lower floor counts as a call. Symbols defined outside the
#             rule's files (the allocator, libuv, ...) are not its business.
#   includes  none of a rule's files includes one of its headers, directly
#             or through the project's own headers (from the sources).
# Run by tests/run.sh after the build ($BUILD/obj). A failure names the
# file, the symbol and both floors; fix the code, or, when the design
# changed, the rule and docs/design.md together.
set -u
SRC=${HEAPD_SRC:-$(pwd)}
BUILD=${BUILD:-build}
. "$SRC/tests/lib.sh"

# Floor rules, one a line: NAME DIR COVER FLOORS...
#   DIR     the objects $BUILD/obj/DIR/UNIT.o
#   COVER   all: every object in DIR must be on a floor (a new file needs
#           one); some: only the files named
#   FLOORS  lowest first, floors separated by "<"; on a floor, units: a file
#           name without .c, or NAME=FILE,FILE,... for one module of several
#           files (calls inside a unit are free)
FLOOR_RULES='
heap-wing   daemon/heap  all   blocks < registry chunks poison < spare horizon < attach=attach,attach_params sequence collect commit release < force timeout
daemon-top  daemon       some  server=server,server_accept,server_fds,server_sink ring=ring,ring_sink < reply < dispatch < heapd
'
# Include rules, one a line: NAME FILES... ! HEADERS... (FILES: globs under
# $SRC; HEADERS: as spelled in #include "...").
INCLUDE_RULES='
transports  daemon/server*.c daemon/ring*.c ! config.h alloc.h
below-reply  daemon/server*.c daemon/ring*.c ! reply.h dispatch.h
below-dispatch  daemon/reply.c ! dispatch.h
'

# ---- floors ----------------------------------------------------------------

# floor_violations [count]: reads "FILE FLOOR UNIT D|U SYMBOL" lines, prints
# one line per reference that does not go strictly down (with "count": the
# number of references from one unit to another, instead).
floor_violations() {
    awk -v count="${1:-}" '
    { f[NR] = $1; fl[NR] = $2; u[NR] = $3; k[NR] = $4; s[NR] = $5
      if ($4 == "D") { df[$5] = $1; dfl[$5] = $2; du[$5] = $3 } }
    END {
        for (i = 1; i <= NR; i++) {
            if (k[i] != "U" || !(s[i] in df) || du[s[i]] == u[i])
                continue
            n++
            if (dfl[s[i]] >= fl[i] && count == "")
                printf "%s (floor %d) uses %s of %s (floor %d)\n", f[i], fl[i], s[i], df[s[i]], dfl[s[i]]
        }
        if (count != "")
            print n + 0
    }'
}

# floor_symbols DIR FLOORS...: the "FILE FLOOR UNIT D|U SYMBOL" lines of
# the rule's objects (a missing object is reported on stderr, exit 1).
floor_symbols() {
    dir=$1
    shift
    floor=0
    missing=0
    for w in "$@"; do
        if [ "$w" = "<" ]; then
            floor=$((floor + 1))
            continue
        fi
        unit=${w%%=*}
        files=$unit
        case $w in *=*) files=$(echo "${w#*=}" | tr ',' ' ') ;; esac
        for file in $files; do
            o=$BUILD/obj/$dir/$file.o
            if [ ! -f "$o" ]; then
                echo "no object $o (build first)" >&2
                missing=1
                continue
            fi
            nm -P "$o" | awk -v f="$file.c" -v fl="$floor" -v u="$unit" '
                $2 == "U" { print f, fl, u, "U", $1; next }
                $2 ~ /^[A-TV-Z]$/ { print f, fl, u, "D", $1 }'
        done
    done
    return $missing
}

# floor_units FLOORS...: every file the floors name, one a line.
floor_units() {
    for w in "$@"; do
        [ "$w" = "<" ] && continue
        case $w in
        *=*) echo "${w#*=}" | tr ',' '\n' ;;
        *) echo "$w" ;;
        esac
    done
}

check_floor_rule() { # NAME DIR COVER FLOORS...
    name=$1 dir=$2 cover=$3
    shift 3
    if [ "$cover" = all ]; then
        for o in "$BUILD/obj/$dir"/*.o; do
            [ -f "$o" ] || continue
            b=$(basename "$o" .o)
            floor_units "$@" | grep -qx "$b" || bad "$name: $dir/$b.c is on no floor (add it to FLOOR_RULES and docs/design.md)"
        done
    fi
    syms=$(floor_symbols "$dir" "$@") || {
        bad "$name: objects missing under $BUILD/obj/$dir"
        return
    }
    v=$(echo "$syms" | floor_violations)
    if [ -n "$v" ]; then
        bad "$name: references that do not go down:"
        echo "$v" | sed 's/^/    /'
    else
        ok "$name: all $(echo "$syms" | floor_violations count) references between its files go down ($*)"
    fi
}

# ---- includes --------------------------------------------------------------

# includes_of FILE: every project header FILE includes, directly or not, as
# spelled in its #include "..." (one a line).
includes_of() {
    todo=$1
    seen=""
    while [ -n "$todo" ]; do
        # shellcheck disable=SC2086
        set -- $todo
        f=$1
        shift
        todo="$*"
        d=$(dirname "$f")
        for h in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
            for idir in "$d" "$SRC" "$SRC/common" "$SRC/daemon" "$SRC/daemon/heap" "$SRC/client" "$BUILD/proto"; do
                [ -f "$idir/$h" ] || continue
                p=$idir/$h
                case " $seen " in
                *" $p "*) ;;
                *)
                    seen="$seen $p"
                    todo="$todo $p"
                    echo "$h"
                    ;;
                esac
                break
            done
        done
    done
}

check_include_rule() { # NAME FILES... ! HEADERS...
    name=$1
    shift
    files=""
    while [ $# -gt 0 ] && [ "$1" != "!" ]; do
        files="$files $1"
        shift
    done
    [ $# -gt 0 ] && shift
    n=0
    before=$fails
    for g in $files; do
        for f in "$SRC"/$g; do
            [ -f "$f" ] || {
                bad "$name: no file $g"
                continue
            }
            n=$((n + 1))
            inc=$(includes_of "$f")
            for h in "$@"; do
                echo "$inc" | grep -qx "$h" && bad "$name: ${f#"$SRC"/} includes $h (directly or through its headers)"
            done
        done
    done
    [ "$fails" = "$before" ] && ok "$name: none of its $n file(s) includes $*"
}

# ---- the checker checks itself -----------------------------------------------

selftest=$(
    printf '%s\n' 'a.c 0 a D a_f' 'b.c 0 b D b_f' 'b.c 0 b U a_f' 'c.c 1 c D c_f' 'c.c 1 c U a_f' \
        'a.c 0 a U c_f' 'd.c 1 m D d_f' 'e.c 1 m U d_f' 'e.c 1 m U malloc' | floor_violations
)
check "the floor check finds a same-floor and an upward reference, only them" \
    test "$selftest" = "$(printf '%s\n%s' 'b.c (floor 0) uses a_f of a.c (floor 0)' 'a.c (floor 0) uses c_f of c.c (floor 1)')"
reply_reaches_pb() { includes_of "$SRC/daemon/reply.c" | grep -qx "heapd.pb-c.h"; }
check "the include scan follows headers (daemon/reply.c reaches heapd.pb-c.h through heap.h)" reply_reaches_pb

# ---- the rules ---------------------------------------------------------------

# (here-documents, not pipes: the loops run in this shell, which counts)
while read -r line; do
    case $line in '' | '#'*) continue ;; esac
    # shellcheck disable=SC2086
    check_floor_rule $line
done <<EOF
$FLOOR_RULES
EOF
while read -r line; do
    case $line in '' | '#'*) continue ;; esac
    # shellcheck disable=SC2086
    check_include_rule $line
done <<EOF
$INCLUDE_RULES
EOF
[ "$fails" = 0 ] && echo "it_layers: all passed" || echo "it_layers: $fails failed"
[ "$fails" = 0 ]
