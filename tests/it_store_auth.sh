#!/bin/sh
# it_store_auth.sh - issue 33 item 1: the store behind Redis ACLs. A real
# redis-server whose default user is off and whose user "heapd" has a
# password; two heapd nodes with store_credentials (a 0600 file) run a
# cross-node collect; a tenant with no credentials can neither list the
# store's keys and channels nor publish a forged result; a node with a wrong
# password fails its collect with an error naming the user and what to
# check; a credentials file others can read is refused at --check-config;
# a password in the store URL is never printed.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
R=$BUILD/tests/prog_rank
. "$SRC/tests/redis_helper.sh"
if ! redis_available; then
    echo "skipped: redis-server not installed (needs redis-server and redis-cli)"
    exit 0
fi
. "$SRC/tests/lib.sh"
lib_tmpdir sauth
hp_0= hp_1= hp_2= rp=
lib_on_exit 'lib_kill rp hp_0 hp_1 hp_2; redis_stop'

PW=s3cret-$$
REDIS_ARGS="--user default off --user heapd on >$PW ~heapd:* &heapd:* +@all"
REDIS_CLI_ARGS="--user heapd --pass $PW --no-auth-warning"
export REDIS_ARGS REDIS_CLI_ARGS
if ! redis_start; then
    echo "FAIL could not start redis-server with ACL users on a free loopback port"; exit 1
fi
ok "redis-server with ACL users (default off, heapd with a password) on port $REDIS_PORT"
has_re_out() { printf '%s\n' "$1" | grep -q -e "$2"; }
anon() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@" 2>&1; }

printf 'heapd %s\n' "$PW" >"$T/cred"
chmod 0600 "$T/cred"
printf 'heapd wrong-%s\n' "$PW" >"$T/bad"
chmod 0600 "$T/bad"
conf() { # conf N CREDFILE
    cat >"$T/n$1.conf" <<EOF
socket = $T/n$1.sock
backend = host
log_level = debug
chunk_size = 1M
va_size = 64M
collect_timeout_ms = 5000
store = redis://heapd@127.0.0.1:$REDIS_PORT
store_credentials = $2
node = n$1
EOF
}
conf 0 "$T/cred"; conf 1 "$T/cred"; conf 2 "$T/bad"
for n in 0 1 2; do
    S=$T/n$n.sock start_heapd "$T/n$n.conf" "$T/n$n.log"
    eval "hp_$n=\$hpid"
done
check "3 heapd nodes start" test -S "$T/n0.sock" -a -S "$T/n1.sock" -a -S "$T/n2.sock"

# A cross-node collect through the authenticated store: rank r on node r.
for r in 0 1; do
    bounded 60 "$R" --socket "$T/n$r.sock" --heap ha --rank $r --world 2 --local-size 1 --job j1 -- \
        alloc 4K alloc 8K free 0 collect alloc 4K >"$T/ha.$r.out" 2>"$T/ha.$r.err" &
    eval "p$r=\$!"
done
wait "$p0"; rc0=$?; wait "$p1"; rc1=$?
check "a cross-node collect through Redis as ACL user heapd (rc $rc0 $rc1)" \
    sh -c "[ $rc0 = 0 ] && [ $rc1 = 0 ] && grep -q '^c 1 1 ' '$T/ha.0.out' && grep -q '^c 1 1 ' '$T/ha.1.out'"

# The tenant: no credentials, so no SCAN, no PUBSUB CHANNELS, no PUBLISH.
check "a tenant without credentials cannot SCAN the store's keys" has_re_out "$(anon SCAN 0)" NOAUTH
check "nor list the nodes' channels" has_re_out "$(anon PUBSUB CHANNELS '*')" NOAUTH
check "nor PUBLISH a forged collect result to a node" has_re_out "$(anon PUBLISH heapd:node:n0 forged)" NOAUTH

# A node with a wrong password: its collect fails naming the user and the fix.
bounded 60 "$R" --socket "$T/n2.sock" --heap hb --rank 0 --world 2 --local-size 1 --job j2 -- \
    alloc 4K free 0 collect >"$T/hb.out" 2>"$T/hb.err"; rc=$?
check "a wrong password: the collect fails (rc $rc), naming user heapd and store_credentials" \
    sh -c "[ $rc != 0 ] && grep -q 'refused AUTH as user \"heapd\"' '$T/hb.err' && grep -q store_credentials '$T/hb.err'"
check "and heapd n2 logs why the store is unreachable" \
    within 30 grep -q 'refused AUTH as user' "$T/n2.log"

# The credentials file and the URL, checked before heapd starts.
cp "$T/cred" "$T/open"; chmod 0644 "$T/open"
conf 3 "$T/open"
"$BUILD/heapd" --config "$T/n3.conf" --check-config >"$T/cc.out" 2>&1; rc=$?
check "a credentials file others can read is refused (rc $rc), saying chmod 0600" \
    sh -c "[ $rc != 0 ] && grep -q 'chmod 0600' '$T/cc.out'"
sed -i "s|^store = .*|store = redis://heapd:$PW@127.0.0.1:$REDIS_PORT|; s|^store_credentials = .*|store_credentials =|" "$T/n3.conf"
"$BUILD/heapd" --config "$T/n3.conf" --check-config >"$T/cc.out" 2>&1; rc=$?
check "a password in the store URL is accepted and never printed (rc $rc)" \
    sh -c "[ $rc = 0 ] && grep -q '^store = redis://heapd:\*\*\*@127.0.0.1' '$T/cc.out' && ! grep -q '$PW' '$T/cc.out'"
sed -i "s|^store_credentials =.*|store_credentials = $T/cred|" "$T/n3.conf"
"$BUILD/heapd" --config "$T/n3.conf" >"$T/n3.log" 2>&1; rc=$?
check "a password in both the URL and store_credentials is refused (rc $rc)" \
    sh -c "[ $rc != 0 ] && grep -q 'give it once' '$T/n3.log'"

for n in 0 1 2; do clean_log "$T/n$n.log"; done
lib_kill hp_0 hp_1 hp_2
[ $fails = 0 ] && echo "it_store_auth: all passed" || echo "it_store_auth: $fails failed"
[ $fails = 0 ]
