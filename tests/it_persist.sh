#!/bin/sh
# it_persist.sh - heaps that outlive their ranks (issue 29), against a real
# heapd (host backend), with tests/prog_resume.c as the ranks. Run by
# tests/run.sh.
#
# Rounds (different seeds, world 2, and one of world 4): every rank runs a
# seeded workload (named allocations of random sizes on 64 KiB chunks, so
# that growths are frequent, pattern writes, frees, collects, commits of the
# marker "step") and is killed with SIGKILL at a point drawn from the seed,
# once one rank's log is that long: every rank at once (wherever each is:
# mid-allocation, maybe a growth, mid-write, mid-release, mid-collect), or
# that rank alone and then each other rank once it is blocked in a
# collective waiting for it (mid-collect, mid-growth, mid-commit). The heap stays
# (persist); the ranks restart with --resume and re-attach. Checked: each
# rank's live set is exact against its own log (prog_resume: blocks logged
# and not freed are live with their seq, offset, size and name; blocks whose
# free was acknowledged are gone; a block whose free was in flight at the
# kill may be either, and the script says which it was; an allocation in
# flight may have been decided), every block whose write was logged is bit
# for bit what was written (its FNV-1a checksum here and the ranks' own
# comparison), the ranks' live sets agree wherever both hold a block (same
# seq, offset, size, name) and differ only where a log explains it, the
# marker is one of the commits in flight or done; the ranks then go on with
# the workload and every allocation after the resume gets the same offset on
# every rank, and the ranks end holding the same blocks. Then: another uid,
# another job secret, another chunk_size or world size cannot re-attach and
# the error says which; a rank that is attached cannot be taken; the persist
# timeout releases a heap; heapctl drop releases one; heapd's fds and VmRSS
# return to their baseline after the drops (VmRSS not under ASan).
#
# Environment: BUILD, HEAPD_SRC; PERSIST_SEEDS (default "3 8 13 21"), KEEP.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
lib_tmpdir persist
chmod 755 "$T"
S=$T/heapd.sock
SEEDS=${PERSIST_SEEDS:-3 8 13 21}
OPS=1500
hpid= rpids=
lib_on_exit 'lib_kill rpids hpid'
for f in "$BUILD/tests/prog_resume" "$BUILD/heapd" "$BUILD/heapctl"; do
    [ -x "$f" ] || { echo "FAIL $f is not built"; exit 1; }
done
# The ranks and heapctl run from $T, where another uid can reach them.
cp "$BUILD/tests/prog_resume" "$BUILD/heapctl" "$T/"
P=$T/prog_resume
CTL=$T/heapctl
asan=0
if nm "$BUILD/heapd" 2>/dev/null | grep -q __asan_init; then
    asan=1
    ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=8:detect_leaks=1:abort_on_error=0}
    export ASAN_OPTIONS
fi

cat >"$T/heapd.conf" <<EOF
socket = $S
socket_mode = 0666
backend = host
log_level = info
chunk_size = 64K
va_size = 64M
collect_timeout_ms = 30000
max_persist = 600
EOF
check "heapd starts and listens" start_heapd "$T/heapd.conf" "$T/heapd.log"
within 5 "$CTL" --socket "$S" heaps >/dev/null
fdbase=$(nfds)

# hclients HEAP: the heap's client count ("" when heapd has no such heap).
hclients() {
    "$CTL" --socket "$S" --json heaps 2>/dev/null |
        sed -n "s/.*{\"name\": \"$1\", \"world_size\": [0-9]*, \"clients\": \([0-9]*\).*/\1/p"
}
detached() { [ "$(hclients "$1")" = 0 ]; }
gone() { [ -z "$(hclients "$1")" ]; }
lines() { wc -l <"$1" 2>/dev/null || echo 0; }
# settle_fds BASE: waits (up to 10 s) until heapd's fd count is at most BASE;
# prints the count. "At most": the baseline, taken just after a heapctl
# call, may still hold that call's connection if heapd had not yet seen it
# close (a loaded machine); a leak shows as a count above it.
settle_fds() {
    n=0
    while [ "$(nfds)" -gt "$1" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
    nfds
}
# ranks HEAP W TAG ARGS...: W ranks of HEAP in the background (pids in $rpids,
# stdout in $T/HEAP.TAG.R)
ranks() {
    _h=$1 _w=$2 _t=$3; shift 3
    rpids=
    _r=0
    while [ $_r -lt "$_w" ]; do
        "$P" --socket "$S" --heap "$_h" --rank $_r --world "$_w" --chunk 64K --va 64M --persist 120 "$@" \
            >"$T/$_h.$_t.$_r" 2>"$T/$_h.$_t.$_r.err" &
        rpids="$rpids $!"
        _r=$((_r + 1))
    done
}
# wait_ranks: waits for $rpids (120 s at most each); rcs gets their exit codes
wait_ranks() {
    rcs=
    for _p in $rpids; do lib_wait_pid "$_p" 120; rcs="$rcs $rc"; done
    rpids=
}
kind_of() { # what the last line of a log says the rank was doing
    case $(tail -n 1 "$1" 2>/dev/null | cut -c1) in
    A) echo "mid-allocation";; C) echo "mid-collect";; F) echo "mid-release";; M) echo "mid-commit";;
    a) echo "mid-write";; *) echo "between operations";; esac
}

# ---- rounds: kill every rank, resume ---------------------------------------------
# round SEED W MODE: the heap pSEED of W ranks. When rank SEED % W has logged
# L lines (L from the seed): MODE all, SIGKILL to every rank at once; MODE one,
# SIGKILL to that rank, then to each other rank once it is blocked in a
# collective waiting for it (mid-collect, mid-growth, mid-commit) or gone.
round() {
    seed=$1 w=$2 mode=$3 h=p$1
    L=$((60 + (seed * 7919) % 2400)) watch=$((seed % w))
    rm -f "$T/$h".*
    ranks "$h" "$w" run --seed "$seed" --ops $OPS --pace-us 200
    within 120 sh -c "test \$(wc -l <'$T/$h.run.$watch') -ge $L || grep -q '^d' '$T/$h.run.$watch'"
    if [ "$mode" = all ]; then
        lib_kill rpids
    else
        set -- $rpids
        eval "first=\${$((watch + 1))}"
        kill -9 "$first"
        r=0
        for p in $rpids; do
            [ $r = $watch ] || within 40 sh -c "! kill -0 $p || { _a=\$(tail -n 1 '$T/$h.run.$r'); sleep 0.2;
                [ \"\$_a\" = \"\$(tail -n 1 '$T/$h.run.$r')\" ] && case \$_a in A*|C*|M*) true;; *) false;; esac; }"
            r=$((r + 1))
        done
        lib_kill rpids
    fi
    how=
    r=0
    while [ $r -lt "$w" ]; do how="$how rank $r $(kind_of "$T/$h.run.$r") (line $(lines "$T/$h.run.$r"));"; r=$((r + 1)); done
    echo "round $h (world $w, kill $mode): SIGKILL:$how"
    if grep -q '^d' "$T/$h.run.$watch"; then echo "note: round $h: the workload ended before the kill"; fi
    check "round $h: the heap stays detached after every rank was killed" within 20 detached "$h"
    r=0
    while [ $r -lt "$w" ]; do cp "$T/$h.run.$r" "$T/$h.log.$r"; r=$((r + 1)); done
    # the resumed ranks, each reading its own log
    rpids=
    r=0
    while [ $r -lt "$w" ]; do
        "$P" --socket "$S" --heap "$h" --rank $r --world "$w" --chunk 64K --va 64M --persist 120 --seed "$seed" \
            --ops $OPS --resume "$T/$h.log.$r" >"$T/$h.res.$r" 2>"$T/$h.res.$r.err" &
        rpids="$rpids $!"
        r=$((r + 1))
    done
    wait_ranks
    check_round "$h" "$w"
    check "round $h: heapctl drop releases the heap" "$CTL" --socket "$S" drop "$h"
    check "round $h: the heap is gone after the drop" within 10 gone "$h"
}

check_round() {
    h=$1 w=$2
    i=0
    for x in $rcs; do
        if [ "$x" = 0 ]; then pass; else
            bad "round $h: resumed rank $i exit $x"
            grep '^e' "$T/$h.res.$i" | head -5; head -3 "$T/$h.res.$i.err"
        fi
        i=$((i + 1))
    done
    r=0
    while [ $r -lt "$w" ]; do
        g=$(sed -n 's/^s [0-9]* \([0-9]*\) \([01]\)$/\1 \2/p' "$T/$h.res.$r")
        case $g in "0 "*|*" 0"|"") bad "round $h rank $r: generation and resumed '$g' (want >= 1 and 1)";; *) pass;; esac
        # checksums: the `w` of the log against the `l` of the re-attach
        awk -v who="round $h rank $r" 'FNR == NR { if ($1 == "w") w[$2] = $3; next }
            $1 == "l" && ($5 in w) { n++; if (w[$5] != $6) { bad++; print "FAIL " who ": block " $5 " checksum " $6 ", written " w[$5] } }
            END { print "round: " who ": " n + 0 " written blocks checksummed, " bad + 0 " differ"; exit bad > 0 }' \
            "$T/$h.log.$r" "$T/$h.res.$r" >"$T/cs.out"
        if [ $? = 0 ]; then pass; else bad "round $h rank $r: checksums"; fi
        grep FAIL "$T/cs.out" | head -3
        # the frees in flight at the kill (no collect or commit acknowledged them)
        awk 'FNR == NR { if ($1 == "a") { s[$3] = $2 } else if ($1 == "F") { f[$2] = s[$2] } else if ($1 == "c" || $1 == "m") { split("", f) }; next }
            $1 == "l" { live[$2] = 1 }
            END { for (o in f) { n++; if (f[o] in live) k++ }
                  if (n) print "note: rank '"$r"': " n " free(s) in flight at the kill: " k + 0 " still live, " n - k " released (either is right)" }' \
            "$T/$h.log.$r" "$T/$h.res.$r"
        r=$((r + 1))
    done
    # cross-rank: same seq -> same offset, size, name; a block only one rank
    # holds is explained by the other's log (it freed it, or never got that far)
    r=1
    while [ $r -lt "$w" ]; do
        awk -v A=0 -v B=$r 'function key(f) { return $3 " " $4 " " $5 }
            FILENAME ~ /log\.0$/ { if ($1 == "a") { m0 = $2 + 1; so0[$3] = $2 } else if ($1 == "F") fr0[so0[$2]] = 1; next }
            FILENAME ~ /log\./ { if ($1 == "a") { m1 = $2 + 1; so1[$3] = $2 } else if ($1 == "F") fr1[so1[$2]] = 1; next }
            FILENAME ~ /res\.0$/ { if ($1 == "l") l0[$2] = key(); next }
            $1 == "l" { l1[$2] = key() }
            END {
                for (s in l0) if (s in l1) { both++; if (l0[s] != l1[s]) { print "FAIL seq " s ": rank " A " " l0[s] ", rank " B " " l1[s]; bad++ } }
                for (s in l0) if (!(s in l1)) { if (s + 0 < m1 && !(s in fr1)) { print "FAIL seq " s " held by rank " A " only, rank " B " neither freed it nor was behind"; bad++ } else only++ }
                for (s in l1) if (!(s in l0)) { if (s + 0 < m0 && !(s in fr0)) { print "FAIL seq " s " held by rank " B " only, rank " A " neither freed it nor was behind"; bad++ } else only++ }
                print "live sets of ranks " A " and " B ": " both + 0 " blocks in both (identical: " (both - bad) + 0 "), " only + 0 " in one only, each explained by the other rank'"'"'s log"
                exit bad > 0 }' "$T/$h.log.0" "$T/$h.log.$r" "$T/$h.res.0" "$T/$h.res.$r" >"$T/x.out"
        if [ $? = 0 ]; then pass; else bad "round $h: the live sets of ranks 0 and $r disagree"; fi
        sed 's/^/  /' "$T/x.out" | head -4
        # after the resume: the same allocations at the same offsets, the same blocks held at the end
        grep '^a ' "$T/$h.res.0" | cut -d' ' -f1-5 | sort >"$T/a0"
        grep '^a ' "$T/$h.res.$r" | cut -d' ' -f1-5 | sort >"$T/a1"
        cat "$T/$h.log.0" "$T/$h.log.$r" | grep '^a ' | cut -d' ' -f1-5 | sort -u >"$T/ab"
        n0=$(wc -l <"$T/a0")
        if cat "$T/a0" "$T/a1" "$T/ab" | sort -u | awk '{ if (seen[$2]++) exit 1 }'; then
            pass
        else
            bad "round $h: an allocation number got different offsets on ranks 0 and $r"
        fi
        grep '^L' "$T/$h.res.0" >"$T/L0"; grep '^L' "$T/$h.res.$r" >"$T/L1"
        if [ -s "$T/L0" ] && cmp -s "$T/L0" "$T/L1"; then
            pass
        else
            bad "round $h: ranks 0 and $r end holding different blocks"; diff "$T/L0" "$T/L1" | head -4
        fi
        r=$((r + 1))
    done
    ok "round $h: $(grep -c '^v' "$T/$h.res.0") blocks verified bit for bit on rank 0, $n0 allocations after the resume, symmetric; marker $(grep '^k' "$T/$h.res.0" | cut -d' ' -f3); $(grep '^r' "$T/$h.res.0" || echo 'no op in flight') on rank 0"
}

m=all
for seed in $SEEDS; do
    round "$seed" 2 $m
    [ $m = all ] && m=one || m=all
    [ -n "${rss1:-}" ] || { settle_fds "$fdbase" >/dev/null; rss1=$(rss); }
done
round 5 4 one

# ---- who may re-attach -------------------------------------------------------------
HEAPC_JOB_SECRET=sec-one
export HEAPC_JOB_SECRET
ranks ref 2 run --seed 9 --ops 60 --commit-every 4
wait_ranks
check "heap ref: the first job ran (exit$rcs)" test "$rcs" = " 0 0"
check "heap ref: detached once its ranks exited" within 20 detached ref
probe() { # probe TAG ARGS...: a rank 0 of ref that attaches and exits at once
    _t=$1; shift
    bounded 60 "$P" --socket "$S" --heap ref --rank 0 --world 2 --chunk 64K --va 64M --persist 120 --attach-only "$@" \
        >"$T/probe.$_t" 2>&1
}
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
    setpriv --reuid=65534 --regid=65534 --clear-groups env HEAPC_JOB_SECRET=sec-one \
        "$P" --socket "$S" --heap ref --rank 0 --world 2 --chunk 64K --va 64M --persist 120 --attach-only \
        >"$T/probe.uid" 2>&1
    rc=$?
    check "another uid cannot re-attach (exit $rc): $(head -c 160 "$T/probe.uid")" \
        sh -c "test $rc != 0 && grep -q 'uid 65534' '$T/probe.uid'"
else
    echo "skipped: re-attach as another uid (needs root and setpriv)"
fi
HEAPC_JOB_SECRET=sec-two probe secret; rc=$?
check "another job secret cannot re-attach (exit $rc): $(head -c 160 "$T/probe.secret")" \
    sh -c "test $rc != 0 && grep -qi 'secret' '$T/probe.secret'"
probe chunk --chunk 128K; rc=$?
check "another chunk_size cannot re-attach (exit $rc): $(head -c 160 "$T/probe.chunk")" \
    sh -c "test $rc != 0 && grep -q 'chunk_size' '$T/probe.chunk'"
bounded 60 "$P" --socket "$S" --heap ref --rank 0 --world 4 --chunk 64K --va 64M --persist 120 --attach-only \
    >"$T/probe.world" 2>&1; rc=$?
check "another world size cannot re-attach (exit $rc): $(head -c 160 "$T/probe.world")" \
    sh -c "test $rc != 0 && grep -qi 'world' '$T/probe.world'"
probe persist --heap big --persist 100000; rc=$?
check "a persist over max_persist is refused (exit $rc): $(head -c 160 "$T/probe.persist")" \
    sh -c "test $rc != 0 && grep -q 'max_persist' '$T/probe.persist'"
# rank 0 re-attaches and stays; a second rank 0 is refused
"$P" --socket "$S" --heap ref --rank 0 --world 2 --chunk 64K --va 64M --persist 120 --attach-only --hold-ms 60000 \
    >"$T/re.0" 2>&1 &
rpids=$!
within 20 grep -q '^s ' "$T/re.0"
probe taken; rc=$?
check "a rank that is attached cannot be taken (exit $rc): $(head -c 160 "$T/probe.taken")" test $rc != 0
check "the right uid, secret and parameters re-attach: $(cat "$T/re.0")" grep -q '^s [0-9]* [1-9][0-9]* 1$' "$T/re.0"
lib_kill rpids
within 20 detached ref
unset HEAPC_JOB_SECRET
check "heapctl drop releases ref: $("$CTL" --socket "$S" drop ref 2>&1)" within 10 gone ref

# ---- the persist timeout -----------------------------------------------------------
ranks short 2 run --seed 4 --ops 40 --persist 2
wait_ranks
check "heap short (persist 2 s) ran (exit$rcs)" test "$rcs" = " 0 0"
t0=$(now_ms)
check "heap short is released by its persist timeout" within 30 gone short
echo "heap short gone $(($(now_ms) - t0)) ms after its ranks exited (persist 2 s)"

# ---- baseline ----------------------------------------------------------------------
fd1=$(settle_fds "$fdbase")
check "heapd's fds back to the baseline after the drops ($fd1, baseline $fdbase)" test "$fd1" -le "$fdbase"
rss2=$(rss)
if [ $asan = 1 ]; then
    echo "note: not checked in a sanitizer build: VmRSS back to its baseline ($rss1 -> $rss2 kB)"
else
    check "heapd's VmRSS back to its baseline after the drops ($rss1 -> $rss2 kB, slack 4096 kB)" \
        test "$rss2" -le $((rss1 + 4096))
fi
kill -TERM "$hpid"; lib_wait_pid "$hpid" 20; hpid=
check "heapd stops cleanly (exit $rc)" test $rc = 0
clean_log "$T/heapd.log"
echo "it_persist: $passes passed, $fails failure(s)"
[ $fails = 0 ]
