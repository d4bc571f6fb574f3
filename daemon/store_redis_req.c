/* store_redis_req.c - the Redis store's requests (see store_redis_int.h):
 * their lifetime, outcomes and failures, and their timers: a request's
 * deadline, the round that decides a collect's timeout in Redis, and the
 * delivery of every outcome (from the request's own uv timer, never from
 * inside hiredis). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_redis_int.h"

/* ---- small helpers ------------------------------------------------------- */

void hd_store_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || !errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

char *hd_store_xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *p = NULL;
    va_start(ap, fmt);
    if (vasprintf(&p, fmt, ap) < 0)
        p = NULL;
    va_end(ap);
    return p;
}

int hd_store_name_ok(const char *what, const char *name, char *err, size_t errlen)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > HD_STORE_NAME_MAX) {
        hd_store_seterr(err, errlen, "the %s name must be 1 to %d bytes (got %zu)", what, HD_STORE_NAME_MAX, n);
        return 0;
    }
    return 1;
}

/* ---- requests ------------------------------------------------------------ */

void hd_store_maybe_free(hd_store *s)
{
    if (s->closing && s->nhandles == 0) {
        explicit_bzero(s->pass, sizeof s->pass);
        explicit_bzero(s->key, sizeof s->key);
        free(s);
    }
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
    free(q->inl);
    hd_store_fetch_free(q->fx);
    free(q);
}

static void req_timer_closed(uv_handle_t *h)
{
    req *q = h->data;
    hd_store *s = q->s;
    req_free(q);
    s->nhandles--;
    hd_store_maybe_free(s);
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

req *hd_store_req_find(hd_store *s, uint64_t id)
{
    for (req *q = s->reqs; q; q = q->next)
        if (q->id == id)
            return q;
    return NULL;
}

static void on_req_timer(uv_timer_t *t);

req *hd_store_req_new(hd_store *s, enum req_kind kind, uint32_t timeout_ms)
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
void hd_store_req_discard(req *q)
{
    req_unlink(q->s, q);
    uv_timer_stop(&q->timer);
    uv_close((uv_handle_t *)&q->timer, req_timer_closed);
}

/* Parks the outcome; the timer delivers it. msg NULL with status < 0 means
 * "out of memory" (the message itself could not be made). */
void hd_store_req_finish(req *q, int status, const char *msg, uint64_t *res, size_t nres)
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
    hd_store_req_finish(q, code, m ? m : "out of memory (while reporting a store failure)", NULL, 0);
    free(m);
}

/* Fails q with HD_STORE_EFAIL, or with `code`. */
void hd_store_req_failf(req *q, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    req_vfail(q, HD_STORE_EFAIL, fmt, ap);
    va_end(ap);
}

void hd_store_req_failc(req *q, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    req_vfail(q, code, fmt, ap);
    va_end(ap);
}

/* A failure recorded in Redis: "E<n>:" (n = -HD_STORE_E*) then the text,
 * as hd_store_send_abort and the script write it. */
#define CODE_TAG_LEN 3
void hd_store_req_fail_stored(req *q, const char *str, size_t len)
{
    int code = HD_STORE_EFAIL;
    if (len >= CODE_TAG_LEN && str[0] == 'E' && str[1] >= '1' && str[1] <= '9' && str[2] == ':') {
        code = -(str[1] - '0');
        str += CODE_TAG_LEN;
        len -= CODE_TAG_LEN;
    }
    hd_store_req_failc(q, code, "%.*s", (int)len, str);
}

/* Calls the user's callback (if any) and releases the request. */
void hd_store_req_deliver(req *q)
{
    hd_store *s = q->s;
    req_unlink(s, q);
    uv_timer_stop(&q->timer);
    if (q->kind == RQ_COLLECT && q->cb) {
        static const uint64_t none[1] = {0};
        q->cb(q->arg, q->status, q->status < 0 ? q->errmsg : NULL, q->res ? q->res : none, q->status < 0 ? 0 : q->nres);
    } else if (q->kind == RQ_FORCE && q->fcb) {
        q->fcb(q->arg, q->status, q->status < 0 ? q->errmsg : NULL, q->receivers);
    }
    uv_close((uv_handle_t *)&q->timer, req_timer_closed);
}

/* "collect 7 of heap "job"" / "the forced collect request for heap "job"" */
void hd_store_req_what(const req *q, char *buf, size_t len)
{
    if (q->kind == RQ_COLLECT)
        snprintf(buf, len, "collect %" PRIu64 " of heap \"%s\"", q->cnum, q->heap);
    else if (q->kind == RQ_FORCE)
        snprintf(buf, len, "the forced collect request for heap \"%s\"", q->heap);
    else
        snprintf(buf, len, "the abort of collect %" PRIu64 " of heap \"%s\"", q->cnum, q->heap);
}

void hd_store_req_fail_conn(req *q, int was_connected, const char *why)
{
    char what[400];
    hd_store *s = q->s;
    hd_store_req_what(q, what, sizeof what);
    if (was_connected)
        hd_store_req_failf(
            q,
            "the connection to Redis at %s was lost: %s; %s failed; heapd retries the connection at the next collect",
            s->hostport, why, what);
    else
        hd_store_req_failf(
            q, "Redis at %s is unreachable: %s; %s failed; heapd retries the connection at the next collect",
            s->hostport, why, what);
}

/* ---- timers -------------------------------------------------------------- */

/* A queued request's deadline passed: the connections (or the subscription)
 * never came. */
static void queued_expired(req *q)
{
    hd_store *s = q->s;
    char what[400];
    const char *why = s->resolving                                            ? "resolving its host name did not finish"
                      : !s->cmd.connected || !(s->sub.ac && s->sub.connected) ? "the connection was not established"
                                                                              : "the subscription was not confirmed";
    char reason[200];
    hd_store_req_what(q, what, sizeof what);
    snprintf(reason, sizeof reason, "%s within %" PRIu32 " ms", why, q->timeout_ms);
    if (q->kind == RQ_ABORT) {
        req *tg = hd_store_abort_target(s, q);
        if (tg)
            hd_store_req_failc(tg, q->code, "%s", q->msg);
        hd_store_req_finish(q, 0, NULL, NULL, 0);
    } else {
        hd_store_req_failf(
            q, "Redis at %s is unreachable: %s; %s failed; heapd retries the connection at the next collect",
            s->hostport, reason, what);
    }
    /* Do not let the next collect wait on a connect that hangs: drop the
     * half-made connections once nothing queued waits on them. */
    int queued = 0;
    for (req *o = s->reqs; o; o = o->next)
        queued |= o->state == ST_QUEUED;
    if (!queued) {
        if (s->cmd.ac && !s->cmd.connected)
            hd_store_conn_drop(s, &s->cmd, reason);
        if (s->sub.ac && (!s->sub.connected || s->sub.nsubs < 2))
            hd_store_conn_drop(s, &s->sub, reason);
    }
}

static void on_req_timer(uv_timer_t *t)
{
    req *q = t->data;
    hd_store *s = q->s;
    char what[400];

    switch (q->state) {
    case ST_DONE:
        hd_store_req_deliver(q);
        return;
    case ST_QUEUED:
        queued_expired(q);
        return;
    case ST_SENT:
    case ST_WAIT:
        if (q->kind != RQ_COLLECT) {
            hd_store_req_what(q, what, sizeof what);
            if (q->kind == RQ_ABORT) {
                req *tg = hd_store_abort_target(s, q);
                if (tg)
                    hd_store_req_failc(tg, q->code, "%s", q->msg);
                hd_store_req_finish(q, 0, NULL, NULL, 0);
            } else {
                hd_store_req_failf(q, "Redis at %s did not answer within %" PRIu32 " ms; %s failed", s->hostport,
                                   q->timeout_ms, what);
            }
            return;
        }
        /* Decide the timeout in Redis (atomically against completion) and
         * learn which ranks are missing: one command. */
        if (!s->cmd.ac)
            hd_store_kick(s);
        if (!s->cmd.ac || hd_store_send_timeout(s, q) != 0) {
            hd_store_req_failc(q, HD_STORE_ETIMEOUT,
                               "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms; the connection to "
                               "Redis at %s is down, so which ranks are missing is unknown",
                               q->cnum, q->heap, q->timeout_ms, s->hostport);
            return;
        }
        q->state = ST_TIMING;
        uv_timer_start(&q->timer, on_req_timer, HD_STORE_GRACE_MS, 0);
        return;
    case ST_TIMING:
        hd_store_req_failc(q, HD_STORE_ETIMEOUT,
                           "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms; Redis at %s did not "
                           "answer within %d ms more, so which ranks are missing is unknown",
                           q->cnum, q->heap, q->timeout_ms, s->hostport, HD_STORE_GRACE_MS);
        return;
    case ST_MERGE:
    case ST_FETCH:
        hd_store_req_failc(q, HD_STORE_ETIMEOUT,
                           "collect %" PRIu64 " of heap \"%s\" completed in Redis, but reading %s back from Redis at "
                           "%s did not finish within %" PRIu32 " ms",
                           q->cnum, q->heap, q->state == ST_MERGE ? "the staged candidate sets" : "its result",
                           s->hostport, q->timeout_ms);
        return;
    case ST_GRACE:
        hd_store_req_failc(q, HD_STORE_ETIMEOUT,
                           "collect %" PRIu64
                           " of heap \"%s\" completed in Redis just as it timed out here (after %" PRIu32
                           " ms), but its result did not reach this node within %d ms more (pub/sub message lost?); "
                           "this node's heap can no longer be kept symmetric",
                           q->cnum, q->heap, q->timeout_ms, HD_STORE_GRACE_MS);
        return;
    }
}
