/* store_redis.c - the cross-node store on Redis (see store.h).
 *
 * Two async hiredis connections per node, both driven by heapd's libuv loop:
 *   cmd: EVALSHA of one Lua script per collect (and abort, timeout, force
 *        PUBLISH);
 *   sub: SUBSCRIBE heapd:node:NODE heapd:force, made at open; a collect is
 *        sent only once this subscription is confirmed, so the notification
 *        that completes it cannot be missed.
 *
 * The script (COLLECT_LUA, store_lua.h) keeps, per collect, a hash KEYS[1] (world
 * size, ranks covered, the nodes seen, the running intersection of their
 * candidate sets, and "abort" / "done" once decided) and a bitmap KEYS[2] of
 * the ranks seen. Each contribution intersects the node's set with the stored
 * one (so Redis holds one set, never one per node) and marks its ranks; the
 * one that covers the last rank publishes the result to every other node and
 * returns it. An abort or a timeout is recorded in the same hash, so every
 * node gets the same outcome: whichever of "complete" and "fail" reaches
 * Redis first wins, atomically.
 *
 * Nothing here calls a user callback from inside hiredis: results are parked
 * on the request and delivered from the request's own uv timer (0 ms).
 *
 * hiredis 0.14's adapters/libuv.h drops libuv's error status (libuv reports
 * POLLERR as status UV_EBADF and stops the handle), so a refused connect or a
 * reset connection is never noticed and the connection hangs. redis_uv.c is
 * that adapter with the error handed to hiredis, which then reads the socket
 * error and fails the connection. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "redis_uv.h"
#include "sha1.h"
#include "store.h"
#include "store_lua.h"

#define FORCE_CHANNEL "heapd:force"
#define NODE_CHANNEL "heapd:node:"
#define ABORT_REQ_TIMEOUT_MS 10000
#define FORCE_DEFAULT_TIMEOUT_MS 10000

/* ---- state ------------------------------------------------------------- */

enum req_kind { RQ_COLLECT, RQ_ABORT, RQ_FORCE };

enum req_state {
    ST_QUEUED,  /* waiting for both connections (and the subscription) */
    ST_SENT,    /* command sent, reply pending */
    ST_WAIT,    /* collect: Redis said wait; the result comes as a message */
    ST_TIMING,  /* collect: timed out here; the timeout op is in flight */
    ST_GRACE,   /* collect: Redis said it completed; the message is due */
    ST_DONE     /* result parked; delivered from the timer */
};

typedef struct req {
    struct req *prev, *next;
    hd_store *s;
    uint64_t id;
    enum req_kind kind;
    enum req_state state;
    uv_timer_t timer;
    char *heap, *inc;
    uint64_t cnum;
    char *prefix;         /* heapd:HEAP:INC:cN */
    uint32_t world, timeout_ms, ttl_s;
    char *ranks;          /* big-endian u32 */
    size_t ranks_len;
    char *set;            /* big-endian u64, ascending */
    size_t set_len;
    char *msg;            /* RQ_ABORT: the message */
    int code;             /* RQ_ABORT: its HD_STORE_E* code */
    uint64_t target;      /* RQ_ABORT: our collect that waits for this abort's reply */
    hd_store_cb cb;
    hd_store_force_cb fcb;
    void *arg;
    int status;           /* result */
    char *errmsg;
    uint64_t *res;
    size_t nres;
    uint64_t receivers;
} req;

typedef struct conn {
    redisAsyncContext *ac;
    int connected;      /* the connect callback said OK */
    int nsubs;          /* sub: subscriptions confirmed */
    int script_sent;    /* cmd: the script was sent with EVAL on this connection */
} conn;

typedef struct force_note {
    struct force_note *next;
    char *heap, *inc;
} force_note;

struct hd_store {
    uv_loop_t *loop;
    char url[320];
    char host[256];
    char hostport[300];   /* for messages: HOST:PORT */
    int port;
    char node[HD_STORE_NODE_MAX + 1];
    char node_chan[sizeof NODE_CHANNEL + HD_STORE_NODE_MAX];
    char addr[256];         /* numeric address connected to */
    int have_addr, host_is_ip;
    uv_getaddrinfo_t gai;
    int resolving;
    conn cmd, sub;
    char sha[41];
    req *reqs;              /* live requests, oldest first */
    req *reqs_tail;
    uint64_t next_id;
    uint64_t commands, messages;
    uv_timer_t defer;       /* delivers force notifications */
    force_note *fq, *fq_tail;
    void (*force_fn)(void *arg, const char *heap, const char *incarnation);
    void *force_arg;
    int closing;
    int nhandles;           /* defer + request timers + getaddrinfo in flight */
    const char *drop_reason;
};

/* ---- small helpers ------------------------------------------------------- */

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || !errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *p = NULL;
    va_start(ap, fmt);
    if (vasprintf(&p, fmt, ap) < 0)
        p = NULL;
    va_end(ap);
    return p;
}

static void put_be64(char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (char)(unsigned char)(v >> (56 - 8 * i));
}

static uint64_t get_be64(const char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | (unsigned char)p[i];
    return v;
}

static void put_be32(char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (char)(unsigned char)(v >> (24 - 8 * i));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Appends `name` to `out`, %-escaping what would make keys ambiguous or
 * awkward: ':', '%', spaces, control bytes, glob and hash-tag characters. */
static size_t esc_append(char *out, size_t at, const char *name)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if (*p <= 0x20 || *p == 0x7f || strchr(":%*?[]{}\\", *p)) {
            out[at++] = '%';
            out[at++] = hex[*p >> 4];
            out[at++] = hex[*p & 15];
        } else {
            out[at++] = (char)*p;
        }
    }
    out[at] = 0;
    return at;
}

static char *make_prefix(const char *heap, const char *inc, uint64_t cnum)
{
    size_t cap = 6 + 3 * strlen(heap) + 1 + 3 * strlen(inc) + 2 + 21 + 1;
    char *p = malloc(cap);
    size_t at;
    if (!p)
        return NULL;
    memcpy(p, "heapd:", 6);
    at = esc_append(p, 6, heap);
    p[at++] = ':';
    at = esc_append(p, at, inc);
    snprintf(p + at, cap - at, ":c%" PRIu64, cnum);
    return p;
}

static int name_ok(const char *what, const char *name, char *err, size_t errlen)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > HD_STORE_NAME_MAX) {
        seterr(err, errlen, "the %s name must be 1 to %d bytes (got %zu)", what, HD_STORE_NAME_MAX, n);
        return 0;
    }
    return 1;
}

/* ---- requests ------------------------------------------------------------ */

static void store_maybe_free(hd_store *s)
{
    if (s->closing && s->nhandles == 0)
        free(s);
}

static void req_free(req *q)
{
    free(q->heap);
    free(q->inc);
    free(q->prefix);
    free(q->ranks);
    free(q->set);
    free(q->msg);
    free(q->errmsg);
    free(q->res);
    free(q);
}

static void req_timer_closed(uv_handle_t *h)
{
    req *q = h->data;
    hd_store *s = q->s;
    req_free(q);
    s->nhandles--;
    store_maybe_free(s);
}

static void req_link(hd_store *s, req *q)
{
    q->prev = s->reqs_tail;
    q->next = NULL;
    if (s->reqs_tail)
        s->reqs_tail->next = q;
    else
        s->reqs = q;
    s->reqs_tail = q;
}

static void req_unlink(hd_store *s, req *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        s->reqs = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        s->reqs_tail = q->prev;
    q->prev = q->next = NULL;
}

static req *req_find(hd_store *s, uint64_t id)
{
    for (req *q = s->reqs; q; q = q->next)
        if (q->id == id)
            return q;
    return NULL;
}

static void on_req_timer(uv_timer_t *t);

static req *req_new(hd_store *s, enum req_kind kind, uint32_t timeout_ms)
{
    req *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->s = s;
    q->kind = kind;
    q->state = ST_QUEUED;
    q->id = ++s->next_id;
    q->timeout_ms = timeout_ms;
    uv_timer_init(s->loop, &q->timer);
    q->timer.data = q;
    s->nhandles++;
    req_link(s, q);
    /* The timeout counts from now, not from the start of this loop turn
     * (uv_now is cached per turn, and a turn can be long on a loaded node). */
    uv_update_time(s->loop);
    uv_timer_start(&q->timer, on_req_timer, timeout_ms, 0);
    return q;
}

/* Drops a request that was never handed out (its creator failed). */
static void req_discard(req *q)
{
    req_unlink(q->s, q);
    uv_timer_stop(&q->timer);
    uv_close((uv_handle_t *)&q->timer, req_timer_closed);
}

/* Parks the outcome; the timer delivers it. msg NULL with status < 0 means
 * "out of memory" (the message itself could not be made). */
static void req_finish(req *q, int status, const char *msg, uint64_t *res, size_t nres)
{
    if (q->state == ST_DONE) {
        free(res);
        return;
    }
    q->state = ST_DONE;
    q->status = status;
    if (status < 0) {
        q->errmsg = strdup(msg ? msg : "out of memory");
    }
    q->res = res;
    q->nres = nres;
    uv_timer_stop(&q->timer);
    uv_timer_start(&q->timer, on_req_timer, 0, 0);
}

static void req_vfail(req *q, int code, const char *fmt, va_list ap)
{
    char *m = NULL;
    if (q->state == ST_DONE)
        return;
    if (vasprintf(&m, fmt, ap) < 0)
        m = NULL;
    req_finish(q, code, m ? m : "out of memory (while reporting a store failure)", NULL, 0);
    free(m);
}

/* Fails q with HD_STORE_EFAIL, or with `code`. */
static void req_failf(req *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void req_failf(req *q, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    req_vfail(q, HD_STORE_EFAIL, fmt, ap);
    va_end(ap);
}

static void req_failc(req *q, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void req_failc(req *q, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    req_vfail(q, code, fmt, ap);
    va_end(ap);
}

/* A failure recorded in Redis: "E<n>:" (n = -HD_STORE_E*) then the text,
 * as send_abort and the script write it. */
#define CODE_TAG_LEN 3
static void req_fail_stored(req *q, const char *str, size_t len)
{
    int code = HD_STORE_EFAIL;
    if (len >= CODE_TAG_LEN && str[0] == 'E' && str[1] >= '1' && str[1] <= '9' && str[2] == ':') {
        code = -(str[1] - '0');
        str += CODE_TAG_LEN;
        len -= CODE_TAG_LEN;
    }
    req_failc(q, code, "%.*s", (int)len, str);
}

/* Calls the user's callback (if any) and releases the request. */
static void req_deliver(req *q)
{
    hd_store *s = q->s;
    req_unlink(s, q);
    uv_timer_stop(&q->timer);
    if (q->kind == RQ_COLLECT && q->cb) {
        static const uint64_t none[1] = {0};
        q->cb(q->arg, q->status, q->status < 0 ? q->errmsg : NULL, q->res ? q->res : none,
              q->status < 0 ? 0 : q->nres);
    } else if (q->kind == RQ_FORCE && q->fcb) {
        q->fcb(q->arg, q->status, q->status < 0 ? q->errmsg : NULL, q->receivers);
    }
    uv_close((uv_handle_t *)&q->timer, req_timer_closed);
}

/* "collect 7 of heap "job"" / "the forced collect request for heap "job"" */
static void req_what(const req *q, char *buf, size_t len)
{
    if (q->kind == RQ_COLLECT)
        snprintf(buf, len, "collect %" PRIu64 " of heap \"%s\"", q->cnum, q->heap);
    else if (q->kind == RQ_FORCE)
        snprintf(buf, len, "the forced collect request for heap \"%s\"", q->heap);
    else
        snprintf(buf, len, "the abort of collect %" PRIu64 " of heap \"%s\"", q->cnum, q->heap);
}

static void req_fail_conn(req *q, int was_connected, const char *why)
{
    char what[400];
    hd_store *s = q->s;
    req_what(q, what, sizeof what);
    if (was_connected)
        req_failf(q, "the connection to Redis at %s was lost: %s; %s failed; heapd retries the connection at the next collect",
                  s->hostport, why, what);
    else
        req_failf(q, "Redis at %s is unreachable: %s; %s failed; heapd retries the connection at the next collect",
                  s->hostport, why, what);
}

/* ---- connections --------------------------------------------------------- */

static void kick(hd_store *s);
static void on_connect(const redisAsyncContext *ac, int status);
static void on_disconnect(const redisAsyncContext *ac, int status);
static void on_sub(redisAsyncContext *ac, void *reply, void *priv);

static conn *conn_of(hd_store *s, const redisAsyncContext *ac)
{
    if (ac && s->cmd.ac == ac)
        return &s->cmd;
    if (ac && s->sub.ac == ac)
        return &s->sub;
    return NULL;
}

static int ready(const hd_store *s)
{
    return s->cmd.ac && s->sub.ac && s->sub.nsubs >= 2;
}

/* Connection `c` is gone (or never came): fail whatever depended on it. The
 * caller frees (or hiredis is freeing) the context. */
static void conn_lost(hd_store *s, conn *c, const char *why)
{
    int was = c->connected;
    int is_sub = c == &s->sub;
    c->ac = NULL;
    c->connected = c->nsubs = c->script_sent = 0;
    if (!was && !s->host_is_ip)
        s->have_addr = 0;   /* resolve again next time: the address may have moved */
    if (s->closing)
        return;
    for (req *q = s->reqs; q; q = q->next) {
        if (q->state == ST_DONE)
            continue;
        if (q->kind == RQ_ABORT && (q->state == ST_QUEUED || (!is_sub && q->state == ST_SENT))) {
            /* The abort will not be recorded: our own collect fails with
             * its message (Redis is gone for the other nodes too). */
            req *t = q->target ? req_find(s, q->target) : NULL;
            if (t && t->state != ST_DONE)
                req_failc(t, q->code, "%s", q->msg);
            req_finish(q, 0, NULL, NULL, 0);
        } else if (q->state == ST_QUEUED)
            req_fail_conn(q, was, why);
        else if (q->kind == RQ_COLLECT && is_sub)
            req_fail_conn(q, was, why);   /* its result can no longer reach us */
        else if (!is_sub && (q->state == ST_SENT || q->state == ST_TIMING))
            req_fail_conn(q, was, why);   /* its reply is lost */
    }
}

/* Fails every queued request (resolution or connect failed before a context
 * existed). */
static void fail_queued(hd_store *s, const char *why)
{
    for (req *q = s->reqs; q; q = q->next)
        if (q->state == ST_QUEUED)
            req_fail_conn(q, 0, why);
}

static void conn_start(hd_store *s, conn *c)
{
    redisAsyncContext *ac = redisAsyncConnect(s->addr, s->port);
    char why[160];

    if (!ac) {
        fail_queued(s, "out of memory creating the connection");
        return;
    }
    if (ac->c.err) {
        snprintf(why, sizeof why, "%s", ac->c.errstr);
        redisAsyncFree(ac);
        if (!s->host_is_ip)
            s->have_addr = 0;
        fail_queued(s, why);
        return;
    }
    ac->data = s;
    if (redis_uv_attach(ac, s->loop) != 0) {
        redisAsyncFree(ac);
        fail_queued(s, "cannot watch the socket on the event loop (uv_poll_init failed)");
        return;
    }
    c->ac = ac;
    c->connected = c->nsubs = c->script_sent = 0;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    if (c == &s->sub &&
        redisAsyncCommand(ac, on_sub, NULL, "SUBSCRIBE %s %s", s->node_chan, FORCE_CHANNEL) != REDIS_OK) {
        c->ac = NULL;
        redisAsyncFree(ac);
        fail_queued(s, "cannot queue SUBSCRIBE");
    }
}

/* Frees a connection of ours from outside hiredis callbacks. */
static void conn_drop(hd_store *s, conn *c, const char *why)
{
    redisAsyncContext *ac = c->ac;
    if (!ac)
        return;
    conn_lost(s, c, why);
    s->drop_reason = why;
    redisAsyncFree(ac);
    s->drop_reason = NULL;
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    hd_store *s = ac->data;
    conn *c = conn_of(s, ac);
    if (!c)
        return;
    if (status != REDIS_OK) {
        char why[160];
        snprintf(why, sizeof why, "%s", ac->c.err ? ac->c.errstr : "connect failed");
        conn_lost(s, c, why);   /* hiredis frees the context after this returns */
        return;
    }
    c->connected = 1;
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    hd_store *s = ac->data;
    conn *c = conn_of(s, ac);
    char why[160];
    if (!c)
        return;
    snprintf(why, sizeof why, "%s",
             ac->c.err ? ac->c.errstr : s->drop_reason ? s->drop_reason : "the connection was closed");
    conn_lost(s, c, why);
}

static void on_resolved(uv_getaddrinfo_t *g, int status, struct addrinfo *res)
{
    hd_store *s = g->data;
    s->resolving = 0;
    s->nhandles--;
    if (s->closing) {
        if (res)
            uv_freeaddrinfo(res);
        store_maybe_free(s);
        return;
    }
    if (status < 0 || !res) {
        char why[400];
        snprintf(why, sizeof why, "cannot resolve host \"%s\" (%s); check `store =` in heapd.conf and this node's DNS",
                 s->host, status < 0 ? uv_strerror(status) : "no address");
        fail_queued(s, why);
        if (res)
            uv_freeaddrinfo(res);
        return;
    }
    /* The first IPv4 address, else the first IPv6 one (hiredis's own order:
     * "localhost" is often ::1 first while Redis listens on 127.0.0.1). */
    {
        const struct addrinfo *pick = res;
        for (const struct addrinfo *a = res; a; a = a->ai_next)
            if (a->ai_family == AF_INET) {
                pick = a;
                break;
            }
        if (pick->ai_family == AF_INET6)
            uv_ip6_name((const struct sockaddr_in6 *)pick->ai_addr, s->addr, sizeof s->addr);
        else
            uv_ip4_name((const struct sockaddr_in *)pick->ai_addr, s->addr, sizeof s->addr);
    }
    uv_freeaddrinfo(res);
    s->have_addr = 1;
    kick(s);
}

/* ---- sending ------------------------------------------------------------- */

static void on_contrib_reply(redisAsyncContext *ac, void *reply, void *priv);
static void on_timeout_reply(redisAsyncContext *ac, void *reply, void *priv);
static void on_abort_reply(redisAsyncContext *ac, void *reply, void *priv);
static void on_publish_reply(redisAsyncContext *ac, void *reply, void *priv);

/* EVALSHA (EVAL the first time on a connection) of the script for request q,
 * op-specific arguments extra[0..nextra). Returns 0 or -1 (nothing sent). */
static int send_script(hd_store *s, req *q, redisCallbackFn *fn, const char *op, int nextra,
                       const char *const *extra, const size_t *extralen)
{
    const char *argv[16];
    size_t len[16];
    int argc = 0, rc;
    char ttl[16];
    char *ks = NULL, *kr = NULL;
    int eval = !s->cmd.script_sent;

    if (!s->cmd.ac)
        return -1;
    ks = xasprintf("%s:s", q->prefix);
    kr = xasprintf("%s:r", q->prefix);
    if (!ks || !kr) {
        free(ks);
        free(kr);
        return -1;
    }
    snprintf(ttl, sizeof ttl, "%" PRIu32, q->ttl_s ? q->ttl_s : HD_STORE_ABORT_TTL_S);
#define ARG(p, n) (argv[argc] = (p), len[argc] = (n), argc++)
    ARG(eval ? "EVAL" : "EVALSHA", eval ? 4 : 7);
    ARG(eval ? COLLECT_LUA : s->sha, eval ? sizeof COLLECT_LUA - 1 : 40);
    ARG("2", 1);
    ARG(ks, strlen(ks));
    ARG(kr, strlen(kr));
    ARG(op, 1);
    ARG(s->node, strlen(s->node));
    ARG(ttl, strlen(ttl));
    ARG(q->prefix, strlen(q->prefix));
    for (int i = 0; i < nextra; i++)
        ARG(extra[i], extralen[i]);
#undef ARG
    rc = redisAsyncCommandArgv(s->cmd.ac, fn, (void *)(uintptr_t)q->id, argc, argv, len);
    free(ks);
    free(kr);
    if (rc != REDIS_OK)
        return -1;
    s->commands++;
    if (eval)
        s->cmd.script_sent = 1;
    return 0;
}

static int send_contrib(hd_store *s, req *q)
{
    char world[16], head[400];
    const char *extra[4];
    size_t len[4];
    snprintf(world, sizeof world, "%" PRIu32, q->world);
    snprintf(head, sizeof head, "collect %" PRIu64 " of heap \"%s\"", q->cnum, q->heap);
    extra[0] = world, len[0] = strlen(world);
    extra[1] = head, len[1] = strlen(head);
    extra[2] = q->ranks ? q->ranks : "", len[2] = q->ranks_len;
    extra[3] = q->set ? q->set : "", len[3] = q->set_len;
    return send_script(s, q, on_contrib_reply, "c", 4, extra, len);
}

static int send_timeout(hd_store *s, req *q)
{
    char world[16], head[400];
    const char *extra[2];
    size_t len[2];
    snprintf(world, sizeof world, "%" PRIu32, q->world);
    snprintf(head, sizeof head, "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms",
             q->cnum, q->heap, q->timeout_ms);
    extra[0] = world, len[0] = strlen(world);
    extra[1] = head, len[1] = strlen(head);
    return send_script(s, q, on_timeout_reply, "t", 2, extra, len);
}

static int send_abort(hd_store *s, req *q)
{
    char *tagged = xasprintf("E%d:%s", -q->code, q->msg);
    if (!tagged)
        return -1;
    const char *extra[1] = {tagged};
    size_t len[1] = {strlen(tagged)};
    int rc = send_script(s, q, on_abort_reply, "a", 1, extra, len);
    free(tagged);
    return rc;
}

static int send_publish(hd_store *s, req *q)
{
    char *payload = xasprintf("F%zu:%s%s", strlen(q->heap), q->heap, q->inc);
    int rc;
    if (!payload || !s->cmd.ac) {
        free(payload);
        return -1;
    }
    rc = redisAsyncCommand(s->cmd.ac, on_publish_reply, (void *)(uintptr_t)q->id, "PUBLISH %s %s",
                           FORCE_CHANNEL, payload);
    free(payload);
    if (rc != REDIS_OK)
        return -1;
    s->commands++;
    return 0;
}

static void flush_queued(hd_store *s)
{
    for (req *q = s->reqs; q; q = q->next) {
        int rc;
        if (q->state != ST_QUEUED)
            continue;
        if (q->kind == RQ_COLLECT)
            rc = send_contrib(s, q);
        else if (q->kind == RQ_ABORT)
            rc = send_abort(s, q);
        else
            rc = send_publish(s, q);
        if (rc == 0)
            q->state = ST_SENT;
        else
            req_fail_conn(q, s->cmd.connected, "the command could not be queued (connection closing or out of memory)");
    }
}

/* Connects whatever is down, and sends the queued requests once both
 * connections are there and the subscription is confirmed. Never calls a
 * user callback. */
static void kick(hd_store *s)
{
    if (s->closing || s->resolving)
        return;
    if (!s->cmd.ac || !s->sub.ac) {
        if (!s->have_addr) {
            struct addrinfo hints;
            int rc;
            memset(&hints, 0, sizeof hints);
            hints.ai_family = AF_UNSPEC;
            hints.ai_socktype = SOCK_STREAM;
            s->gai.data = s;
            rc = uv_getaddrinfo(s->loop, &s->gai, on_resolved, s->host, NULL, &hints);
            if (rc < 0) {
                char why[300];
                snprintf(why, sizeof why, "cannot start resolving host \"%s\" (%s)", s->host, uv_strerror(rc));
                fail_queued(s, why);
                return;
            }
            s->resolving = 1;
            s->nhandles++;
            return;
        }
        if (!s->cmd.ac)
            conn_start(s, &s->cmd);
        if (!s->sub.ac)
            conn_start(s, &s->sub);
    }
    if (ready(s))
        flush_queued(s);
}

/* ---- replies and messages ------------------------------------------------ */

static const char *null_reply_why(hd_store *s, const redisAsyncContext *ac)
{
    if (ac->c.err)
        return ac->c.errstr;
    if (s->drop_reason)
        return s->drop_reason;
    return s->closing ? "heapd is stopping" : "the connection was closed";
}

static int reply_is(const redisReply *r, size_t i, const char *word)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements > i && r->element[i]->type == REDIS_REPLY_STRING &&
           r->element[i]->len == strlen(word) && !memcmp(r->element[i]->str, word, r->element[i]->len);
}

static const redisReply *reply_str(const redisReply *r, size_t i)
{
    if (r->type == REDIS_REPLY_ARRAY && r->elements > i && r->element[i]->type == REDIS_REPLY_STRING)
        return r->element[i];
    return NULL;
}

static int is_noscript(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR && r->len >= 8 && !strncmp(r->str, "NOSCRIPT", 8);
}

/* A result blob: big-endian u64, strictly ascending. */
static void finish_with_blob(req *q, const char *p, size_t len)
{
    uint64_t *v = NULL;
    size_t n = len / 8;
    if (len % 8) {
        req_failf(q, "collect %" PRIu64 " of heap \"%s\": Redis returned a result of %zu bytes, not a multiple of 8 "
                  "(another program writing heapd keys?)", q->cnum, q->heap, len);
        return;
    }
    if (n) {
        v = malloc(n * sizeof *v);
        if (!v) {
            req_failf(q, "collect %" PRIu64 " of heap \"%s\": out of memory for a result of %zu offsets", q->cnum,
                      q->heap, n);
            return;
        }
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = get_be64(p + 8 * i);
        if (i && v[i] <= v[i - 1]) {
            free(v);
            req_failf(q, "collect %" PRIu64 " of heap \"%s\": Redis returned offsets out of order "
                      "(another program writing heapd keys?)", q->cnum, q->heap);
            return;
        }
    }
    req_finish(q, 0, NULL, v, n);
}

static void on_contrib_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = req_find(s, (uint64_t)(uintptr_t)priv);
    const redisReply *e;

    if (!q || q->state == ST_DONE)
        return;
    if (!r) {
        req_fail_conn(q, 1, null_reply_why(s, ac));
        return;
    }
    if (is_noscript(r)) {
        /* The script cache was flushed: send it whole again. */
        s->cmd.script_sent = 0;
        if (send_contrib(s, q) != 0)
            req_fail_conn(q, 1, "the command could not be queued");
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        req_failf(q, "collect %" PRIu64 " of heap \"%s\": Redis at %s refused heapd's collect script: %.*s; "
                  "heapd needs Redis 4.0 or later with scripting enabled", q->cnum, q->heap, s->hostport,
                  (int)r->len, r->str);
        return;
    }
    if (reply_is(r, 0, "ok") && (e = reply_str(r, 1)) != NULL) {
        finish_with_blob(q, e->str, e->len);
    } else if (reply_is(r, 0, "wait")) {
        if (q->state == ST_SENT)
            q->state = ST_WAIT;
    } else if (reply_is(r, 0, "abort") && (e = reply_str(r, 1)) != NULL) {
        req_fail_stored(q, e->str, e->len);
    } else if (reply_is(r, 0, "done")) {
        req_failf(q, "collect %" PRIu64 " of heap \"%s\" had already completed in Redis without this node (%s): "
                  "another node serves the same ranks; each rank must be served by exactly one node",
                  q->cnum, q->heap, s->node);
    } else {
        req_failf(q, "collect %" PRIu64 " of heap \"%s\": unexpected reply from Redis at %s to the collect script "
                  "(another program using heapd's keys?)", q->cnum, q->heap, s->hostport);
    }
}

static void on_timeout_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = req_find(s, (uint64_t)(uintptr_t)priv);
    const redisReply *e;

    if (!q || q->state == ST_DONE)
        return;
    if (!r) {
        req_failc(q, HD_STORE_ETIMEOUT, "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms, and the connection to "
                  "Redis at %s was lost (%s) while heapd asked which ranks were missing",
                  q->cnum, q->heap, q->timeout_ms, s->hostport, null_reply_why(s, ac));
        return;
    }
    if (is_noscript(r)) {
        s->cmd.script_sent = 0;
        if (send_timeout(s, q) != 0)
            req_fail_conn(q, 1, "the command could not be queued");
        return;
    }
    if (reply_is(r, 0, "abort") && (e = reply_str(r, 1)) != NULL) {
        req_fail_stored(q, e->str, e->len);
    } else if (reply_is(r, 0, "done")) {
        /* It completed just before: the message with the result was sent to
         * us before this reply; give it the grace period. */
        q->state = ST_GRACE;
    } else {
        req_failc(q, HD_STORE_ETIMEOUT, "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms; Redis at %s gave an "
                  "unexpected answer when asked which ranks were missing: %.*s", q->cnum, q->heap, q->timeout_ms,
                  s->hostport, r->type == REDIS_REPLY_ERROR ? (int)r->len : 0,
                  r->type == REDIS_REPLY_ERROR ? r->str : "");
    }
}

/* The collect (of ours) an abort is about, if it still waits. */
static req *abort_target(hd_store *s, const req *a)
{
    req *t = a->target ? req_find(s, a->target) : NULL;
    return t && t->state != ST_DONE ? t : NULL;
}

static void on_abort_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = req_find(s, (uint64_t)(uintptr_t)priv);
    req *t;
    const redisReply *e;

    if (!q || q->state == ST_DONE)
        return;
    t = abort_target(s, q);
    if (r && is_noscript(r)) {
        s->cmd.script_sent = 0;
        if (send_abort(s, q) == 0)
            return;
        r = NULL;
    }
    if (r && (reply_is(r, 0, "aborted") || reply_is(r, 0, "abort")) && (e = reply_str(r, 1)) != NULL) {
        /* Recorded (ours or an earlier failure: every node reports that one). */
        if (t)
            req_fail_stored(t, e->str, e->len);
    } else if (r && reply_is(r, 0, "done")) {
        /* Completed before the abort: our collect gets the result like every
         * other node (its message is on its way, or it has come). */
    } else if (t) {
        req_failc(t, q->code, "%s", q->msg);
    }
    req_finish(q, 0, NULL, NULL, 0);
}

static void on_publish_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = req_find(s, (uint64_t)(uintptr_t)priv);

    if (!q || q->state == ST_DONE)
        return;
    if (!r) {
        req_fail_conn(q, 1, null_reply_why(s, ac));
    } else if (r->type == REDIS_REPLY_INTEGER) {
        q->receivers = r->integer > 0 ? (uint64_t)r->integer : 0;
        req_finish(q, 0, NULL, NULL, 0);
    } else {
        req_failf(q, "Redis at %s refused to publish the forced collect request for heap \"%s\": %.*s", s->hostport,
                  q->heap, r->type == REDIS_REPLY_ERROR ? (int)r->len : 0,
                  r->type == REDIS_REPLY_ERROR ? r->str : "");
    }
}

static void on_defer(uv_timer_t *t)
{
    hd_store *s = t->data;
    while (s->fq && !s->closing) {
        force_note *f = s->fq;
        s->fq = f->next;
        if (!s->fq)
            s->fq_tail = NULL;
        if (s->force_fn)
            s->force_fn(s->force_arg, f->heap, f->inc);
        free(f->heap);
        free(f);
    }
}

static void got_force(hd_store *s, const char *p, size_t len)
{
    /* "F" heaplen ":" heap incarnation */
    char *end;
    unsigned long hl;
    force_note *f;
    const char *colon;

    if (len < 3 || p[0] != 'F' || !s->force_fn)
        return;
    colon = memchr(p, ':', len);
    if (!colon)
        return;
    hl = strtoul(p + 1, &end, 10);
    if (end != colon || hl == 0 || hl > HD_STORE_NAME_MAX || (size_t)(colon + 1 - p) + hl >= len)
        return;
    f = calloc(1, sizeof *f);
    if (!f)
        return;
    /* one allocation: heap NUL incarnation NUL */
    f->heap = malloc(len + 2);
    if (!f->heap) {
        free(f);
        return;
    }
    memcpy(f->heap, colon + 1, hl);
    f->heap[hl] = 0;
    f->inc = f->heap + hl + 1;
    memcpy(f->inc, colon + 1 + hl, len - (size_t)(colon + 1 - p) - hl);
    f->inc[len - (size_t)(colon + 1 - p) - hl] = 0;
    if (strlen(f->heap) != hl || !*f->inc) {
        free(f->heap);
        free(f);
        return;
    }
    if (s->fq_tail)
        s->fq_tail->next = f;
    else
        s->fq = f;
    s->fq_tail = f;
    uv_timer_start(&s->defer, on_defer, 0, 0);
}

static void got_node_message(hd_store *s, const char *p, size_t len)
{
    /* kind prefix '\n' body */
    const char *nl = len ? memchr(p, '\n', len) : NULL;
    size_t plen;
    if (!nl || (p[0] != 'R' && p[0] != 'A'))
        return;
    plen = (size_t)(nl - p) - 1;
    for (req *q = s->reqs; q; q = q->next) {
        if (q->kind != RQ_COLLECT || q->state == ST_DONE || q->state == ST_QUEUED)
            continue;
        if (strlen(q->prefix) != plen || memcmp(q->prefix, p + 1, plen))
            continue;
        if (p[0] == 'R')
            finish_with_blob(q, nl + 1, len - (size_t)(nl + 1 - p));
        else
            req_fail_stored(q, nl + 1, len - (size_t)(nl + 1 - p));
        return;
    }
}

static void on_sub(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    const redisReply *kind, *chan, *body;

    if (!r || s->sub.ac != ac || r->type != REDIS_REPLY_ARRAY || r->elements < 3)
        return;
    kind = reply_str(r, 0);
    chan = reply_str(r, 1);
    if (!kind || !chan)
        return;
    if (kind->len == 9 && !strncasecmp(kind->str, "subscribe", 9)) {
        s->sub.nsubs++;
        if (ready(s))
            kick(s);
        return;
    }
    if (kind->len != 7 || strncasecmp(kind->str, "message", 7) || !(body = reply_str(r, 2)))
        return;
    s->messages++;
    if (chan->len == strlen(FORCE_CHANNEL) && !memcmp(chan->str, FORCE_CHANNEL, chan->len))
        got_force(s, body->str, body->len);
    else if (chan->len == strlen(s->node_chan) && !memcmp(chan->str, s->node_chan, chan->len))
        got_node_message(s, body->str, body->len);
}

/* ---- timers -------------------------------------------------------------- */

static void on_req_timer(uv_timer_t *t)
{
    req *q = t->data;
    hd_store *s = q->s;
    char what[400];

    switch (q->state) {
    case ST_DONE:
        req_deliver(q);
        return;
    case ST_QUEUED: {
        const char *why = s->resolving ? "resolving its host name did not finish"
                          : !s->cmd.connected || !(s->sub.ac && s->sub.connected)
                              ? "the connection was not established"
                              : "the subscription was not confirmed";
        char reason[200];
        req_what(q, what, sizeof what);
        snprintf(reason, sizeof reason, "%s within %" PRIu32 " ms", why, q->timeout_ms);
        if (q->kind == RQ_ABORT) {
            req *tg = abort_target(s, q);
            if (tg)
                req_failc(tg, q->code, "%s", q->msg);
            req_finish(q, 0, NULL, NULL, 0);
        } else {
            req_failf(q, "Redis at %s is unreachable: %s; %s failed; heapd retries the connection at the next collect",
                      s->hostport, reason, what);
        }
        /* Do not let the next collect wait on a connect that hangs: drop the
         * half-made connections once nothing queued waits on them. */
        int queued = 0;
        for (req *o = s->reqs; o; o = o->next)
            queued |= o->state == ST_QUEUED;
        if (!queued) {
            if (s->cmd.ac && !s->cmd.connected)
                conn_drop(s, &s->cmd, reason);
            if (s->sub.ac && (!s->sub.connected || s->sub.nsubs < 2))
                conn_drop(s, &s->sub, reason);
        }
        return;
    }
    case ST_SENT:
    case ST_WAIT:
        if (q->kind != RQ_COLLECT) {
            req_what(q, what, sizeof what);
            if (q->kind == RQ_ABORT) {
                req *tg = abort_target(s, q);
                if (tg)
                    req_failc(tg, q->code, "%s", q->msg);
                req_finish(q, 0, NULL, NULL, 0);
            } else {
                req_failf(q, "Redis at %s did not answer within %" PRIu32 " ms; %s failed", s->hostport,
                          q->timeout_ms, what);
            }
            return;
        }
        /* Decide the timeout in Redis (atomically against completion) and
         * learn which ranks are missing: one command. */
        if (!s->cmd.ac)
            kick(s);
        if (!s->cmd.ac || send_timeout(s, q) != 0) {
            req_failc(q, HD_STORE_ETIMEOUT, "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms; the connection to "
                      "Redis at %s is down, so which ranks are missing is unknown", q->cnum, q->heap,
                      q->timeout_ms, s->hostport);
            return;
        }
        q->state = ST_TIMING;
        uv_timer_start(&q->timer, on_req_timer, HD_STORE_GRACE_MS, 0);
        return;
    case ST_TIMING:
        req_failc(q, HD_STORE_ETIMEOUT, "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms; Redis at %s did not "
                  "answer within %d ms more, so which ranks are missing is unknown", q->cnum, q->heap,
                  q->timeout_ms, s->hostport, HD_STORE_GRACE_MS);
        return;
    case ST_GRACE:
        req_failc(q, HD_STORE_ETIMEOUT, "collect %" PRIu64 " of heap \"%s\" completed in Redis just as it timed out here (after %" PRIu32
                  " ms), but its result did not reach this node within %d ms more (pub/sub message lost?); "
                  "this node's heap can no longer be kept symmetric", q->cnum, q->heap, q->timeout_ms,
                  HD_STORE_GRACE_MS);
        return;
    }
}

/* ---- API ----------------------------------------------------------------- */

static int parse_url(hd_store *s, const char *url, char *err, size_t errlen)
{
    const char *p, *hs, *he, *rest;
    long port = 6379;
    static const char scheme[] = "redis://";

    if (!url || strncmp(url, scheme, sizeof scheme - 1)) {
        seterr(err, errlen, "store URL \"%s\" must start with redis:// (e.g. redis://10.0.0.5:6379)",
               url ? url : "(null)");
        return -1;
    }
    p = url + sizeof scheme - 1;
    if (strchr(p, '@')) {
        seterr(err, errlen, "store URL \"%s\": credentials in the URL are not supported; give Redis access "
               "by network (bind, firewall) instead", url);
        return -1;
    }
    if (*p == '[') {
        hs = p + 1;
        he = strchr(hs, ']');
        if (!he) {
            seterr(err, errlen, "store URL \"%s\": missing ']' after the IPv6 address", url);
            return -1;
        }
        rest = he + 1;
    } else {
        hs = p;
        he = hs + strcspn(hs, ":/");
        rest = he;
    }
    if (he == hs || (size_t)(he - hs) >= sizeof s->host) {
        seterr(err, errlen, "store URL \"%s\": the host is missing or too long", url);
        return -1;
    }
    memcpy(s->host, hs, (size_t)(he - hs));
    s->host[he - hs] = 0;
    if (*rest == ':') {
        char *end;
        errno = 0;
        port = strtol(rest + 1, &end, 10);
        if (end == rest + 1 || errno || port < 1 || port > 65535) {
            seterr(err, errlen, "store URL \"%s\": the port must be 1 to 65535", url);
            return -1;
        }
        rest = end;
    }
    if (*rest && strcmp(rest, "/") && strcmp(rest, "/0")) {
        seterr(err, errlen, "store URL \"%s\": unexpected \"%s\" after the port (database selection is not "
               "supported: heapd uses database 0)", url, rest);
        return -1;
    }
    s->port = (int)port;
    {
        unsigned char buf[sizeof(struct in6_addr)];
        int v6 = inet_pton(AF_INET6, s->host, buf) == 1;
        s->host_is_ip = v6 || inet_pton(AF_INET, s->host, buf) == 1;
        snprintf(s->hostport, sizeof s->hostport, v6 ? "[%s]:%d" : "%s:%d", s->host, s->port);
        snprintf(s->url, sizeof s->url, "redis://%s", s->hostport);
    }
    if (s->host_is_ip) {
        snprintf(s->addr, sizeof s->addr, "%s", s->host);
        s->have_addr = 1;
    }
    return 0;
}

int hd_store_check_url(const char *url, char *err, size_t errlen)
{
    hd_store *s = calloc(1, sizeof *s);
    if (!s) {
        seterr(err, errlen, "out of memory checking the store URL");
        return -1;
    }
    int rc = parse_url(s, url, err, errlen);
    free(s);
    return rc;
}

int hd_store_open(uv_loop_t *loop, const char *url, const char *node, hd_store **out, char *err, size_t errlen)
{
    hd_store *s;
    size_t nl = node ? strlen(node) : 0;

    if (out)
        *out = NULL;
    if (!loop || !out) {
        seterr(err, errlen, "hd_store_open: loop and out must not be NULL");
        return -1;
    }
    if (nl == 0 || nl > HD_STORE_NODE_MAX || strspn(node, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                      "0123456789._-") != nl) {
        seterr(err, errlen, "node name \"%s\" is not valid: use 1 to %d of A-Z a-z 0-9 . _ - (e.g. the host name), "
               "unique per node", node ? node : "(null)", HD_STORE_NODE_MAX);
        return -1;
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        seterr(err, errlen, "out of memory creating the store");
        return -1;
    }
    if (parse_url(s, url, err, errlen) != 0) {
        free(s);
        return -1;
    }
    s->loop = loop;
    memcpy(s->node, node, nl + 1);
    snprintf(s->node_chan, sizeof s->node_chan, NODE_CHANNEL "%s", node);
    sha1_hex(COLLECT_LUA, sizeof COLLECT_LUA - 1, s->sha);
    uv_timer_init(loop, &s->defer);
    s->defer.data = s;
    s->nhandles = 1;
    *out = s;
    kick(s);   /* connect and subscribe now; errors surface at the first collect */
    return 0;
}

static void defer_closed(uv_handle_t *h)
{
    hd_store *s = h->data;
    s->nhandles--;
    store_maybe_free(s);
}

void hd_store_close(hd_store *s)
{
    if (!s || s->closing)
        return;
    s->closing = 1;
    while (s->reqs) {
        req *q = s->reqs;
        if (q->state != ST_DONE) {
            char what[400];
            req_what(q, what, sizeof what);
            req_failf(q, "heapd is stopping: %s was abandoned", what);
        }
        req_deliver(q);
    }
    s->drop_reason = "heapd is stopping";
    if (s->cmd.ac) {
        redisAsyncContext *ac = s->cmd.ac;
        s->cmd.ac = NULL;
        redisAsyncFree(ac);
    }
    if (s->sub.ac) {
        redisAsyncContext *ac = s->sub.ac;
        s->sub.ac = NULL;
        redisAsyncFree(ac);
    }
    s->drop_reason = NULL;
    while (s->fq) {
        force_note *f = s->fq;
        s->fq = f->next;
        free(f->heap);
        free(f);
    }
    s->fq_tail = NULL;
    if (s->resolving)
        uv_cancel((uv_req_t *)&s->gai);
    uv_close((uv_handle_t *)&s->defer, defer_closed);
}

static req *pending_collect(hd_store *s, const char *heap, const char *inc)
{
    for (req *q = s->reqs; q; q = q->next)
        if (q->kind == RQ_COLLECT && !strcmp(q->heap, heap) && !strcmp(q->inc, inc))
            return q;
    return NULL;
}

int hd_store_collect(hd_store *s, const char *heap, const char *incarnation, uint64_t cnum, uint32_t world_size,
                     const uint32_t *local_ranks, size_t nlocal, const uint64_t *offsets, size_t n,
                     uint32_t timeout_ms, uint32_t ttl_s, hd_store_cb cb, void *arg, char *err, size_t errlen)
{
    req *q;
    uint64_t *sorted = NULL;
    const uint64_t *src = offsets;

    if (!s || !cb) {
        seterr(err, errlen, "hd_store_collect: store and callback must not be NULL");
        return -1;
    }
    if (s->closing) {
        seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": the store is closing (heapd is stopping)", cnum,
               heap ? heap : "");
        return -1;
    }
    if (!name_ok("heap", heap, err, errlen) || !name_ok("incarnation", incarnation, err, errlen))
        return -1;
    if (world_size == 0 || nlocal == 0 || !local_ranks) {
        seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": world size %" PRIu32 " and %zu local ranks: both "
               "must be at least 1", cnum, heap, world_size, nlocal);
        return -1;
    }
    for (size_t i = 0; i < nlocal; i++)
        if (local_ranks[i] >= world_size) {
            seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": local rank %" PRIu32 " is not below the world "
                   "size %" PRIu32, cnum, heap, local_ranks[i], world_size);
            return -1;
        }
    if (n && !offsets) {
        seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": %zu offsets but no array", cnum, heap, n);
        return -1;
    }
    if (timeout_ms == 0 || ttl_s == 0) {
        seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": timeout_ms and ttl_s must be at least 1 "
               "(ttl_s should be well above the timeout, e.g. 10x)", cnum, heap);
        return -1;
    }
    if ((q = pending_collect(s, heap, incarnation)) != NULL) {
        seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": collect %" PRIu64 " of this heap (incarnation %s) "
               "is still pending; wait for its callback", cnum, heap, q->cnum, incarnation);
        return -1;
    }
    for (size_t i = 1; i < n; i++)
        if (offsets[i] <= offsets[i - 1]) {
            size_t k = 0;
            sorted = malloc(n * sizeof *sorted);
            if (!sorted) {
                seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": out of memory sorting %zu offsets", cnum,
                       heap, n);
                return -1;
            }
            memcpy(sorted, offsets, n * sizeof *sorted);
            qsort(sorted, n, sizeof *sorted, cmp_u64);
            for (size_t j = 0; j < n; j++)
                if (j == 0 || sorted[j] != sorted[k - 1])
                    sorted[k++] = sorted[j];
            n = k;
            src = sorted;
            break;
        }
    q = req_new(s, RQ_COLLECT, timeout_ms);
    if (!q) {
        free(sorted);
        seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": out of memory", cnum, heap);
        return -1;
    }
    q->heap = strdup(heap);
    q->inc = strdup(incarnation);
    q->prefix = make_prefix(heap, incarnation, cnum);
    q->cnum = cnum;
    q->world = world_size;
    q->ttl_s = ttl_s;
    q->cb = cb;
    q->arg = arg;
    q->ranks_len = nlocal * 4;
    q->ranks = malloc(q->ranks_len);
    q->set_len = n * 8;
    q->set = n ? malloc(q->set_len) : NULL;
    if (!q->heap || !q->inc || !q->prefix || !q->ranks || (n && !q->set)) {
        free(sorted);
        req_discard(q);   /* cb never called: we return an error */
        seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": out of memory (%zu offsets)", cnum, heap, n);
        return -1;
    }
    for (size_t i = 0; i < nlocal; i++)
        put_be32(q->ranks + 4 * i, local_ranks[i]);
    for (size_t i = 0; i < n; i++)
        put_be64(q->set + 8 * i, src[i]);
    free(sorted);
    kick(s);
    return 0;
}

int hd_store_collect_abort(hd_store *s, const char *heap, const char *incarnation, uint64_t cnum, const char *msg)
{
    return hd_store_collect_abort_code(s, heap, incarnation, cnum, HD_STORE_EFAIL, msg);
}

int hd_store_collect_abort_code(hd_store *s, const char *heap, const char *incarnation, uint64_t cnum, int code,
                                const char *msg)
{
    req *t, *q;

    if (code >= 0 || code < -9)
        code = HD_STORE_EFAIL;
    if (!s || s->closing || !msg || !*msg || !name_ok("heap", heap, NULL, 0) ||
        !name_ok("incarnation", incarnation, NULL, 0))
        return -1;
    t = pending_collect(s, heap, incarnation);
    if (t && (t->cnum != cnum || t->state == ST_DONE))
        t = NULL;
    q = req_new(s, RQ_ABORT, ABORT_REQ_TIMEOUT_MS);
    if (!q) {
        if (t)
            req_failc(t, code, "%s", msg);
        return -1;
    }
    q->heap = strdup(heap);
    q->inc = strdup(incarnation);
    q->prefix = make_prefix(heap, incarnation, cnum);
    q->msg = strdup(msg);
    q->code = code;
    q->cnum = cnum;
    q->ttl_s = t ? t->ttl_s : HD_STORE_ABORT_TTL_S;
    if (!q->heap || !q->inc || !q->prefix || !q->msg) {
        req_discard(q);
        if (t)
            req_failc(t, code, "%s", msg);
        return -1;
    }
    if (t) {
        if (t->state == ST_QUEUED)
            req_failc(t, code, "%s", msg);   /* not contributed: nothing in Redis can complete it */
        else
            q->target = t->id;         /* decided by the abort's reply */
    }
    kick(s);
    return 0;
}

void hd_store_counters(const hd_store *s, uint64_t *commands, uint64_t *messages)
{
    if (commands)
        *commands = s ? s->commands : 0;
    if (messages)
        *messages = s ? s->messages : 0;
}

const char *hd_store_url(const hd_store *s)
{
    return s ? s->url : "";
}

const char *hd_store_node(const hd_store *s)
{
    return s ? s->node : "";
}

int hd_store_ready(const hd_store *s)
{
    return s && !s->closing && ready(s) && s->cmd.connected;
}

void hd_store_connect(hd_store *s)
{
    if (s)
        kick(s);
}

void hd_store_on_force(hd_store *s, void (*fn)(void *arg, const char *heap, const char *incarnation), void *arg)
{
    if (!s)
        return;
    s->force_fn = fn;
    s->force_arg = arg;
}

int hd_store_publish_force_cb(hd_store *s, const char *heap, const char *incarnation, uint32_t timeout_ms,
                              hd_store_force_cb cb, void *arg, char *err, size_t errlen)
{
    req *q;
    if (!s) {
        seterr(err, errlen, "hd_store_publish_force: no store");
        return -1;
    }
    if (s->closing) {
        seterr(err, errlen, "cannot request a forced collect: the store is closing (heapd is stopping)");
        return -1;
    }
    if (!name_ok("heap", heap, err, errlen) || !name_ok("incarnation", incarnation, err, errlen))
        return -1;
    q = req_new(s, RQ_FORCE, timeout_ms ? timeout_ms : FORCE_DEFAULT_TIMEOUT_MS);
    if (!q) {
        seterr(err, errlen, "forced collect of heap \"%s\": out of memory", heap);
        return -1;
    }
    q->heap = strdup(heap);
    q->inc = strdup(incarnation);
    if (!q->heap || !q->inc) {
        req_discard(q);
        seterr(err, errlen, "forced collect of heap \"%s\": out of memory", heap);
        return -1;
    }
    q->fcb = cb;
    q->arg = arg;
    kick(s);
    return 0;
}

int hd_store_publish_force(hd_store *s, const char *heap, const char *incarnation, char *err, size_t errlen)
{
    return hd_store_publish_force_cb(s, heap, incarnation, FORCE_DEFAULT_TIMEOUT_MS, NULL, NULL, err, errlen);
}
