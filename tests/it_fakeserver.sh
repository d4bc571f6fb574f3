#!/bin/sh
# it_fakeserver.sh - libheapc against a hostile heapd (issue 33 items 7 and
# 11), with tests/prog_fakeserver.c: a server that speaks the real protocol
# and sends what heapd never does. The client must return an error, never
# die of a signal (SIGBUS) nor hang:
#   7  a 0-byte status page, an unsealed status page and an unsealed chunk
#      truncated after the attach, a regular file as a chunk (ERR_BADFD);
#      a frame header promising fds that
#      never come (ERR_NOREPLY after the default HEAPC_FRAME_TIMEOUT_MS, and
#      after $HEAPC_FRAME_TIMEOUT_MS), the same with its payload (ERR_CONN);
#      an unsealed ring memfd truncated after the attach (refused: the Alloc
#      goes on the socket); a growth chunk without seals (ERR_BADFD); a status
#      page left mid-update (ERR_BUSY, bounded)
#   11 heapc_attach_env with launcher ids over 127 bytes: two ids sharing
#      their first 127 bytes make two heap names (the id is cut and hashed),
#      a job heapd takes (at most 127 bytes, valid UTF-8); short ids as before
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
F=$BUILD/tests/prog_fakeserver
lib_tmpdir fake

# ---- item 7: fds and frames from a hostile server ------------------------------------
for c in status0 status_unsealed unsealed regular nofds_body ring growbad busy; do
    bounded 120 "$F" "$c" >"$T/$c.out" 2>&1 || sed 's/^/    | /' "$T/$c.out"
    check "$(sed -n 's/^ok   //p; s/^FAIL //p' "$T/$c.out" | head -1 | cut -c1-150)" grep -q '^ok ' "$T/$c.out"
done
check "ring: the truncated ring was refused: the Alloc came on the socket" \
    grep -q 'got a request (body 14) on the socket' "$T/ring.out"
HEAPC_FRAME_TIMEOUT_MS=300 bounded 120 "$F" nofds >"$T/nofds300.out" 2>&1
check "nofds, HEAPC_FRAME_TIMEOUT_MS=300: ERR_NOREPLY naming 300 ms" grep -q '^ok .*ERR_NOREPLY.*within 300 ms' "$T/nofds300.out"
# No limit set anywhere: the default bounds it (10 s).
bounded 60 env -u HEAPC_FRAME_TIMEOUT_MS "$F" nofds >"$T/nofds.out" 2>&1
check "nofds, no limit set: ERR_NOREPLY after the default 10000 ms (no hang)" \
    grep -q '^ok .*ERR_NOREPLY.*within 10000 ms' "$T/nofds.out"

# ---- item 11: long launcher ids ------------------------------------------------
env_attach() { # OUT VAR=VALUE...: heapc_attach_env's Attach as the server saw it
    _o=$1; shift
    bounded 60 env -u TORCHELASTIC_RUN_ID -u MASTER_ADDR -u MASTER_PORT -u SLURM_PROCID -u RANK -u HEAPD_HEAP \
        "$@" "$F" env >"$_o" 2>&1
}
long=$(printf 'x%.0s' $(seq 1 127))
T1="RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1"
env_attach "$T/a.out" $T1 TORCHELASTIC_RUN_ID="${long}A"
env_attach "$T/b.out" $T1 TORCHELASTIC_RUN_ID="${long}B"
ha=$(sed -n 's/^heap=//p' "$T/a.out"); hb=$(sed -n 's/^heap=//p' "$T/b.out")
ja=$(sed -n 's/^job=//p' "$T/a.out")
check "torchrun ids of 128 bytes sharing 127: two heap names ($ha, $hb)" \
    sh -c "[ -n '$ha' ] && [ -n '$hb' ] && [ '$ha' != '$hb' ]"
check "the job heapd gets holds at most 127 bytes (${#ja})" sh -c "[ ${#ja} -le 127 ] && [ ${#ja} -gt 100 ]"
env_attach "$T/c.out" $T1 TORCHELASTIC_RUN_ID=run-42
check "a short id is kept as it is (torch-run-42, job run-42)" \
    sh -c "grep -qx heap=torch-run-42 '$T/c.out' && grep -qx job=run-42 '$T/c.out'"
env_attach "$T/u.out" $T1 TORCHELASTIC_RUN_ID="$(printf '\303\251%.0s' $(seq 1 100))"
check "an id of 100 two-byte characters is cut between characters (valid UTF-8)" \
    /usr/bin/python3 -c "import sys; b=open(sys.argv[1],'rb').read(); b.decode('utf-8'); sys.exit(b'job=' not in b or len(b.split(b'job=')[1].split(b'\n')[0]) > 127)" "$T/u.out"
env_attach "$T/m1.out" $T1 MASTER_ADDR="${long}.a" MASTER_PORT=29500
env_attach "$T/m2.out" $T1 MASTER_ADDR="${long}.b" MASTER_PORT=29500
check "long MASTER_ADDR hostnames that share 127 bytes: two heap names" \
    sh -c "[ \"\$(grep ^heap= '$T/m1.out')\" != \"\$(grep ^heap= '$T/m2.out')\" ]"
S1="SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_NTASKS_PER_NODE=1 SLURM_STEP_ID=0"
env_attach "$T/s1.out" $S1 SLURM_JOB_ID="${long}1"
env_attach "$T/s2.out" $S1 SLURM_JOB_ID="${long}2"
check "Slurm job ids that share 127 bytes: two heap names" \
    sh -c "[ \"\$(grep ^heap= '$T/s1.out')\" != \"\$(grep ^heap= '$T/s2.out')\" ] && grep -q ^heap=slurm- '$T/s1.out'"

echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
