# redis_helper.sh - a private redis-server for the integration tests (sourced).
#
#   . "$HEAPD_SRC/tests/redis_helper.sh"
#   redis_available || { echo "skipped: redis-server not installed"; exit 0; }
#   trap redis_stop EXIT
#   redis_start           # sets REDIS_PORT, REDIS_PID, REDIS_URL, REDIS_DIR
#   ...                   # heapd.conf: store = $REDIS_URL
#   redis_kill            # crash it (SIGKILL); redis_restart brings it back
#   redis_restart         # same port, empty (no persistence)
#   redis_stop            # stops it, removes REDIS_DIR
#
# REDIS_ARGS: more redis-server arguments (e.g. ACL users: --user ...);
# REDIS_CLI_ARGS: what redis-cli then needs to be let in (--user U --pass P).
# The server listens on 127.0.0.1 only, saves nothing (--save '', no AOF),
# and logs to $REDIS_DIR/redis.log. Ports are tried from 20000 + $$ % 10000
# upward; a port is ours only when the server answering PING there reports
# our process id. POSIX sh; every function returns non-zero (with a message
# on stderr) when it cannot do its job. Shell variables it uses start with
# _redis_ or REDIS_.

redis_available() {
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1
}

# _redis_launch PORT: starts redis-server on PORT in the background; 0 once it
# answers PING as our process, 1 if it exited (port taken) or never answered.
_redis_launch() {
    # shellcheck disable=SC2086 # REDIS_ARGS is a word list on purpose
    redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
        --dir "$REDIS_DIR" --logfile "$REDIS_DIR/redis.log" ${REDIS_ARGS:-} >/dev/null 2>&1 &
    REDIS_PID=$!
    _redis_i=0
    while [ "$_redis_i" -lt 200 ]; do
        if ! kill -0 "$REDIS_PID" 2>/dev/null; then
            wait "$REDIS_PID" 2>/dev/null
            REDIS_PID=
            return 1
        fi
        # shellcheck disable=SC2086
        if redis-cli -h 127.0.0.1 -p "$1" ${REDIS_CLI_ARGS:-} info server 2>/dev/null | tr -d '\r' |
            grep -qx "process_id:$REDIS_PID"; then
            REDIS_PORT=$1
            REDIS_URL=redis://127.0.0.1:$1
            export REDIS_PORT REDIS_PID REDIS_URL REDIS_DIR
            return 0
        fi
        sleep 0.05
        _redis_i=$((_redis_i + 1))
    done
    kill -9 "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null
    REDIS_PID=
    return 1
}

redis_start() {
    if ! redis_available; then
        echo "redis_start: redis-server and redis-cli are not installed (Debian: apt-get install redis-server)" >&2
        return 1
    fi
    if [ -n "${REDIS_PID:-}" ]; then
        echo "redis_start: redis-server $REDIS_PID is already running on port $REDIS_PORT; redis_stop it first" >&2
        return 1
    fi
    REDIS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/heapd-redis.XXXXXX") || {
        echo "redis_start: cannot create a temporary directory in ${TMPDIR:-/tmp}" >&2
        return 1
    }
    _redis_p=$((20000 + $$ % 10000))
    _redis_n=0
    while [ "$_redis_n" -lt 100 ]; do
        if _redis_launch "$_redis_p"; then
            return 0
        fi
        _redis_p=$((_redis_p + 1))
        [ "$_redis_p" -le 65000 ] || _redis_p=20000
        _redis_n=$((_redis_n + 1))
    done
    echo "redis_start: redis-server did not start on any of 100 loopback ports from $((20000 + $$ % 10000));" \
        "see $REDIS_DIR/redis.log" >&2
    return 1
}

# _redis_end SIGNAL: signals the server and waits until it has exited.
_redis_end() {
    [ -n "${REDIS_PID:-}" ] || return 0
    kill "-$1" "$REDIS_PID" 2>/dev/null
    _redis_i=0
    while kill -0 "$REDIS_PID" 2>/dev/null && [ "$_redis_i" -lt 100 ]; do
        sleep 0.05
        _redis_i=$((_redis_i + 1))
    done
    if kill -0 "$REDIS_PID" 2>/dev/null; then
        kill -9 "$REDIS_PID" 2>/dev/null
    fi
    wait "$REDIS_PID" 2>/dev/null
    REDIS_PID=
    return 0
}

redis_kill() {
    if [ -z "${REDIS_PID:-}" ]; then
        echo "redis_kill: no redis-server of ours is running" >&2
        return 1
    fi
    _redis_end KILL
}

redis_stop() {
    _redis_end TERM
    if [ -n "${REDIS_DIR:-}" ] && [ -d "$REDIS_DIR" ]; then
        rm -rf "$REDIS_DIR"
    fi
    REDIS_DIR=
    return 0
}

redis_restart() {
    if [ -z "${REDIS_PORT:-}" ] || [ -z "${REDIS_DIR:-}" ]; then
        echo "redis_restart: redis_start was not called" >&2
        return 1
    fi
    _redis_end TERM
    # The port can stay busy for a moment after the old server exits.
    _redis_n=0
    while [ "$_redis_n" -lt 50 ]; do
        if _redis_launch "$REDIS_PORT"; then
            return 0
        fi
        sleep 0.1
        _redis_n=$((_redis_n + 1))
    done
    echo "redis_restart: redis-server did not start again on port $REDIS_PORT; see $REDIS_DIR/redis.log" >&2
    return 1
}
