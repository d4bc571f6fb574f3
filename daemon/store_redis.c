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
 * one (so Redis holds one set of the small contributions; a set over a piece
 * is staged apart: store_redis_merge.c) and marks its ranks; the one that
 * covers the last rank returns the result, and that node publishes it, signed,
 * to every other node (op 'p'). An abort or a timeout is recorded in the same hash, so every
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
 * error and fails the connection.
 *
 * The store is four files (store_redis_int.h lists them and holds the structs
 * with their invariants); this one holds the two connections, the script
 * (EVAL / EVALSHA) and sending, the URL, open and close. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "redis_uv.h"
#include "sha1.h"
#include "store_lua.h"
#include "store_redis_int.h"

/* ---- connections --------------------------------------------------------- */

static void on_connect(const redisAsyncContext *ac, int status);
static void on_disconnect(const redisAsyncContext *ac, int status);

static conn *conn_of(hd_store *s, const redisAsyncContext *ac)
{
    if (ac && s->cmd.ac == ac)
        return &s->cmd;
    if (ac && s->sub.ac == ac)
        return &s->sub;
    return NULL;
}

int hd_store_can_send(const hd_store *s) { return s->cmd.ac && s->sub.ac && s->sub.nsubs >= 2; }

/* Connection `c` is gone (or never came): fail whatever depended on it. The
 * caller frees (or hiredis is freeing) the context. */
static void conn_lost(hd_store *s, conn *c, const char *why)
{
    int was = c->connected;
    int is_sub = c == &s->sub;
    c->ac = NULL;
    c->connected = c->nsubs = c->script_sent = 0;
    if (!was && !s->host_is_ip)
        s->have_addr = 0; /* resolve again next time: the address may have moved */
    if (s->closing)
        return;
    for (req *q = s->reqs; q; q = q->next) {
        if (q->state == ST_DONE)
            continue;
        if (q->kind == RQ_ABORT && (q->state == ST_QUEUED || (!is_sub && q->state == ST_SENT))) {
            /* The abort will not be recorded: our own collect fails with
             * its message (Redis is gone for the other nodes too). */
            req *t = q->target ? hd_store_req_find(s, q->target) : NULL;
            if (t && t->state != ST_DONE)
                hd_store_req_failc(t, q->code, "%s", q->msg);
            hd_store_req_finish(q, 0, NULL, NULL, 0);
        } else if (q->state == ST_QUEUED)
            hd_store_req_fail_conn(q, was, why);
        else if (q->kind == RQ_COLLECT && is_sub && q->state != ST_MERGE && q->state != ST_FETCH)
            hd_store_req_fail_conn(q, was, why); /* its result can no longer reach us */
        else if (!is_sub &&
                 (q->state == ST_SENT || q->state == ST_TIMING || q->state == ST_MERGE || q->state == ST_FETCH))
            hd_store_req_fail_conn(q, was, why); /* its reply is lost */
    }
}

/* Fails every queued request (resolution or connect failed before a context
 * existed). */
static void fail_queued(hd_store *s, const char *why)
{
    for (req *q = s->reqs; q; q = q->next)
        if (q->state == ST_QUEUED)
            hd_store_req_fail_conn(q, 0, why);
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
    c->connected = c->nsubs = c->script_sent = c->auth_failed = 0;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    if (hd_store_auth_send(s, ac) != 0) {
        c->ac = NULL;
        redisAsyncFree(ac);
        fail_queued(s, "cannot queue AUTH");
        return;
    }
    if (c == &s->sub && redisAsyncCommand(ac, hd_store_on_sub, NULL, "SUBSCRIBE %s %s", s->node_chan,
                                          HD_STORE_FORCE_CHANNEL) != REDIS_OK) {
        c->ac = NULL;
        redisAsyncFree(ac);
        fail_queued(s, "cannot queue SUBSCRIBE");
    }
}

/* Frees a connection of ours from outside hiredis callbacks. */
void hd_store_conn_drop(hd_store *s, conn *c, const char *why)
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
        conn_lost(s, c, why); /* hiredis frees the context after this returns */
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
    if (c->auth_failed) {
        conn_lost(s, c, s->auth_err);
        return;
    }
    snprintf(why, sizeof why, "%s",
             ac->c.err        ? ac->c.errstr
             : s->drop_reason ? s->drop_reason
                              : "the connection was closed");
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
        hd_store_maybe_free(s);
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
    hd_store_kick(s);
}

/* ---- sending ------------------------------------------------------------- */

/* EVALSHA (EVAL the first time on a connection) of the script for request q,
 * op-specific arguments extra[0..nextra). Returns 0 or -1 (nothing sent). */
int hd_store_send_script(hd_store *s, req *q, redisCallbackFn *fn, const char *op, int nextra, const char *const *extra,
                         const size_t *extralen)
{
    const char *argv[16];
    size_t len[16];
    int argc = 0, rc;
    char ttl[16];
    char *ks = NULL, *kr = NULL;
    int eval = !s->cmd.script_sent;

    if (!s->cmd.ac)
        return -1;
    ks = hd_store_xasprintf("%s:s", q->prefix);
    kr = hd_store_xasprintf("%s:r", q->prefix);
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

static void flush_queued(hd_store *s)
{
    for (req *q = s->reqs; q; q = q->next) {
        int rc;
        if (q->state != ST_QUEUED)
            continue;
        if (q->kind == RQ_COLLECT)
            rc = hd_store_send_contrib(s, q);
        else if (q->kind == RQ_ABORT)
            rc = hd_store_send_abort(s, q);
        else
            rc = hd_store_send_publish(s, q);
        if (rc == 0)
            q->state = ST_SENT;
        else
            hd_store_req_fail_conn(q, s->cmd.connected,
                                   "the command could not be queued (connection closing or out of memory)");
    }
}

/* Connects whatever is down, and sends the queued requests once both
 * connections are there and the subscription is confirmed. Never calls a
 * user callback. */
void hd_store_kick(hd_store *s)
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
    if (hd_store_can_send(s))
        flush_queued(s);
}

/* ---- API ----------------------------------------------------------------- */

/* "USER:PASSWORD@", ":PASSWORD@" or "USER@" (the password then comes from
 * the credentials file) before the host; *p moves past it. */
static int parse_userinfo(hd_store *s, const char *url, const char **p, char *err, size_t errlen)
{
    const char *at = strchr(*p, '@');
    if (!at)
        return 0;
    const char *colon = memchr(*p, ':', (size_t)(at - *p));
    size_t ul = (size_t)((colon ? colon : at) - *p);
    size_t pl = colon ? (size_t)(at - colon - 1) : 0;
    if (ul >= sizeof s->user || pl >= sizeof s->pass || memchr(at + 1, '@', strlen(at + 1))) {
        hd_store_seterr(err, errlen, "store URL \"%s\": the user or password is too long, or '@' appears twice", url);
        return -1;
    }
    memcpy(s->user, *p, ul);
    s->user[ul] = 0;
    if (colon)
        memcpy(s->pass, colon + 1, pl);
    s->pass[pl] = 0;
    if (!s->pass[0] && !s->user[0]) {
        hd_store_seterr(err, errlen, "store URL \"%s\": '@' with neither a user nor a password", url);
        return -1;
    }
    s->have_auth = 1;
    *p = at + 1;
    return 0;
}

static int parse_url(hd_store *s, const char *url, char *err, size_t errlen)
{
    const char *p, *hs, *he, *rest;
    long port = 6379;
    static const char scheme[] = "redis://";

    if (!url || strncmp(url, scheme, sizeof scheme - 1)) {
        hd_store_seterr(err, errlen, "store URL \"%s\" must start with redis:// (e.g. redis://10.0.0.5:6379)",
                        url ? url : "(null)");
        return -1;
    }
    p = url + sizeof scheme - 1;
    if (parse_userinfo(s, url, &p, err, errlen) != 0)
        return -1;
    if (*p == '[') {
        hs = p + 1;
        he = strchr(hs, ']');
        if (!he) {
            hd_store_seterr(err, errlen, "store URL \"%s\": missing ']' after the IPv6 address", url);
            return -1;
        }
        rest = he + 1;
    } else {
        hs = p;
        he = hs + strcspn(hs, ":/");
        rest = he;
    }
    if (he == hs || (size_t)(he - hs) >= sizeof s->host) {
        hd_store_seterr(err, errlen, "store URL \"%s\": the host is missing or too long", url);
        return -1;
    }
    memcpy(s->host, hs, (size_t)(he - hs));
    s->host[he - hs] = 0;
    if (*rest == ':') {
        char *end;
        errno = 0;
        port = strtol(rest + 1, &end, 10);
        if (end == rest + 1 || errno || port < 1 || port > 65535) {
            hd_store_seterr(err, errlen, "store URL \"%s\": the port must be 1 to 65535", url);
            return -1;
        }
        rest = end;
    }
    if (*rest && strcmp(rest, "/") && strcmp(rest, "/0")) {
        hd_store_seterr(err, errlen,
                        "store URL \"%s\": unexpected \"%s\" after the port (database selection is not "
                        "supported: heapd uses database 0)",
                        url, rest);
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
        hd_store_seterr(err, errlen, "out of memory checking the store URL");
        return -1;
    }
    int rc = parse_url(s, url, err, errlen);
    free(s);
    return rc;
}

int hd_store_open(uv_loop_t *loop, const char *url, const char *node, hd_store **out, char *err, size_t errlen)
{
    hd_store_opts o = {.url = url, .node = node, .credentials = NULL};
    return hd_store_open_opts(loop, &o, out, err, errlen);
}

/* The credentials file beside the URL's: the password once, from one place. */
static int load_credentials(hd_store *s, const char *path, char *err, size_t errlen)
{
    if (path && path[0]) {
        char user[sizeof s->user];
        if (s->pass[0]) {
            hd_store_seterr(err, errlen,
                            "the store URL has a password and store_credentials is set too: give it once "
                            "(store_credentials, readable by heapd only, is the safer place)");
            return -1;
        }
        if (hd_store_check_credentials(path, user, sizeof user, s->pass, sizeof s->pass, err, errlen) != 0)
            return -1;
        if (user[0] && s->user[0] && strcmp(user, s->user)) {
            hd_store_seterr(err, errlen, "store_credentials %s names user \"%s\" but the store URL user \"%s\"", path,
                            user, s->user);
            return -1;
        }
        if (user[0])
            snprintf(s->user, sizeof s->user, "%s", user);
        s->have_auth = 1;
    } else if (s->have_auth && !s->pass[0]) {
        hd_store_seterr(err, errlen,
                        "the store URL names user \"%s\" without a password: put the password in a file "
                        "readable by heapd only and set store_credentials to it",
                        s->user);
        return -1;
    }
    return 0;
}

int hd_store_open_opts(uv_loop_t *loop, const hd_store_opts *o, hd_store **out, char *err, size_t errlen)
{
    hd_store *s;
    const char *url = o ? o->url : NULL, *node = o ? o->node : NULL;
    size_t nl = node ? strlen(node) : 0;

    if (out)
        *out = NULL;
    if (!loop || !out) {
        hd_store_seterr(err, errlen, "hd_store_open: loop and out must not be NULL");
        return -1;
    }
    if (nl == 0 || nl > HD_STORE_NODE_MAX ||
        strspn(node, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                     "0123456789._-") != nl) {
        hd_store_seterr(err, errlen,
                        "node name \"%s\" is not valid: use 1 to %d of A-Z a-z 0-9 . _ - (e.g. the host name), "
                        "unique per node",
                        node ? node : "(null)", HD_STORE_NODE_MAX);
        return -1;
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        hd_store_seterr(err, errlen, "out of memory creating the store");
        return -1;
    }
    if (parse_url(s, url, err, errlen) != 0 || load_credentials(s, o->credentials, err, errlen) != 0 ||
        hd_store_load_key(s, o->key_file, o->credentials, err, errlen) != 0) {
        explicit_bzero(s->key, sizeof s->key);
        explicit_bzero(s->pass, sizeof s->pass);
        free(s);
        return -1;
    }
    s->loop = loop;
    s->warn = o->warn;
    s->warn_arg = o->warn_arg;
    memcpy(s->node, node, nl + 1);
    snprintf(s->node_chan, sizeof s->node_chan, HD_STORE_NODE_CHANNEL "%s", node);
    sha1_hex(COLLECT_LUA, sizeof COLLECT_LUA - 1, s->sha);
    uv_timer_init(loop, &s->defer);
    s->defer.data = s;
    s->nhandles = 1;
    *out = s;
    hd_store_kick(s); /* connect and subscribe now; errors surface at the first collect */
    return 0;
}

static void defer_closed(uv_handle_t *h)
{
    hd_store *s = h->data;
    s->nhandles--;
    hd_store_maybe_free(s);
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
            hd_store_req_what(q, what, sizeof what);
            hd_store_req_failf(q, "heapd is stopping: %s was abandoned", what);
        }
        hd_store_req_deliver(q);
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

void hd_store_counters(const hd_store *s, uint64_t *commands, uint64_t *messages)
{
    if (commands)
        *commands = s ? s->commands : 0;
    if (messages)
        *messages = s ? s->messages : 0;
}

const char *hd_store_url(const hd_store *s) { return s ? s->url : ""; }

const char *hd_store_node(const hd_store *s) { return s ? s->node : ""; }

int hd_store_ready(const hd_store *s) { return s && !s->closing && hd_store_can_send(s) && s->cmd.connected; }

void hd_store_connect(hd_store *s)
{
    if (s)
        hd_store_kick(s);
}
