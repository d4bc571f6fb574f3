/* store_redis_collect.c - the Redis store's collect round (see
 * store_redis_int.h): the keys of a collect, a node's contribution, the
 * timeout and abort ops of the script, their replies, the result, and
 * hd_store_collect / hd_store_collect_abort. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_redis_int.h"

/* ---- small helpers ------------------------------------------------------- */

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

/* ---- sending ------------------------------------------------------------- */

static void on_contrib_reply(redisAsyncContext *ac, void *reply, void *priv);
static void on_timeout_reply(redisAsyncContext *ac, void *reply, void *priv);
static void on_abort_reply(redisAsyncContext *ac, void *reply, void *priv);

/* A set over a piece is staged first (store_redis_merge.c) and the commit
 * names its length; a smaller one goes inline. */
int hd_store_send_contrib(hd_store *s, req *q)
{
    char world[16], head[400], staged[24] = "";
    const char *extra[5];
    size_t len[5];
    if (q->staged && !q->staged_sent) {
        if (hd_store_send_stage(s, q) != 0)
            return -1;
        q->staged_sent = 1;
    }
    if (q->staged)
        snprintf(staged, sizeof staged, "%zu", q->set_len);
    snprintf(world, sizeof world, "%" PRIu32, q->world);
    snprintf(head, sizeof head, "collect %" PRIu64 " of heap \"%s\"", q->cnum, q->heap);
    extra[0] = world, len[0] = strlen(world);
    extra[1] = head, len[1] = strlen(head);
    extra[2] = q->ranks ? q->ranks : "", len[2] = q->ranks_len;
    extra[3] = q->set && !q->staged ? q->set : "", len[3] = q->staged ? 0 : q->set_len;
    extra[4] = staged, len[4] = strlen(staged);
    return hd_store_send_script(s, q, on_contrib_reply, "c", 5, extra, len);
}

/* This call recorded a failure in Redis: tell the other nodes (signed). */
static void publish_abort(hd_store *s, req *q, const redisReply *r, const redisReply *msg)
{
    const redisReply *n = hd_store_reply_str(r, 2);
    if (msg && (!n || (n->len == 1 && n->str[0] == 'n')))
        hd_store_publish_signed(s, q, 'A', msg->str, msg->len);
}

int hd_store_send_timeout(hd_store *s, req *q)
{
    char world[16], head[400];
    const char *extra[2];
    size_t len[2];
    snprintf(world, sizeof world, "%" PRIu32, q->world);
    snprintf(head, sizeof head, "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms", q->cnum, q->heap,
             q->timeout_ms);
    extra[0] = world, len[0] = strlen(world);
    extra[1] = head, len[1] = strlen(head);
    return hd_store_send_script(s, q, on_timeout_reply, "t", 2, extra, len);
}

int hd_store_send_abort(hd_store *s, req *q)
{
    char *tagged = hd_store_xasprintf("E%d:%s", -q->code, q->msg);
    if (!tagged)
        return -1;
    const char *extra[1] = {tagged};
    size_t len[1] = {strlen(tagged)};
    int rc = hd_store_send_script(s, q, on_abort_reply, "a", 1, extra, len);
    free(tagged);
    return rc;
}

/* ---- replies and messages ------------------------------------------------ */

const char *hd_store_null_reply_why(hd_store *s, const redisAsyncContext *ac)
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

const redisReply *hd_store_reply_str(const redisReply *r, size_t i)
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
void hd_store_finish_with_blob(req *q, const char *p, size_t len)
{
    uint64_t *v = NULL;
    size_t n = len / 8;
    if (len % 8) {
        hd_store_req_failf(q,
                           "collect %" PRIu64
                           " of heap \"%s\": Redis returned a result of %zu bytes, not a multiple of 8 "
                           "(another program writing heapd keys?)",
                           q->cnum, q->heap, len);
        return;
    }
    if (n) {
        v = malloc(n * sizeof *v);
        if (!v) {
            hd_store_req_failf(q, "collect %" PRIu64 " of heap \"%s\": out of memory for a result of %zu offsets",
                               q->cnum, q->heap, n);
            return;
        }
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = get_be64(p + 8 * i);
        if (i && v[i] <= v[i - 1]) {
            free(v);
            hd_store_req_failf(q,
                               "collect %" PRIu64 " of heap \"%s\": Redis returned offsets out of order "
                               "(another program writing heapd keys?)",
                               q->cnum, q->heap);
            return;
        }
    }
    hd_store_req_finish(q, 0, NULL, v, n);
}

static void on_contrib_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = hd_store_req_find(s, (uint64_t)(uintptr_t)priv);
    const redisReply *e;

    if (!q || q->state == ST_DONE || q->state == ST_FETCH || q->state == ST_MERGE)
        return;
    if (!r) {
        hd_store_req_fail_conn(q, 1, hd_store_null_reply_why(s, ac));
        return;
    }
    if (is_noscript(r)) {
        /* The script cache was flushed: send it whole again. */
        s->cmd.script_sent = 0;
        if (hd_store_send_contrib(s, q) != 0)
            hd_store_req_fail_conn(q, 1, "the command could not be queued");
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        hd_store_req_failf(q,
                           "collect %" PRIu64 " of heap \"%s\": Redis at %s refused heapd's collect script: %.*s; "
                           "heapd needs Redis 4.0 or later with scripting enabled",
                           q->cnum, q->heap, s->hostport, (int)r->len, r->str);
        return;
    }
    if (reply_is(r, 0, "ok") && r->elements >= 4) {
        hd_store_merge_start(s, q, r);
    } else if (reply_is(r, 0, "ok") && (e = hd_store_reply_str(r, 1)) != NULL) {
        hd_store_complete(s, q, e->str, e->len);
    } else if (reply_is(r, 0, "wait")) {
        if (q->state == ST_SENT)
            q->state = ST_WAIT;
    } else if (reply_is(r, 0, "abort") && (e = hd_store_reply_str(r, 1)) != NULL) {
        if (r->elements >= 3)
            publish_abort(s, q, r, e);
        hd_store_req_fail_stored(q, e->str, e->len);
    } else if (reply_is(r, 0, "done")) {
        hd_store_req_failf(q,
                           "collect %" PRIu64 " of heap \"%s\" had already completed in Redis without this node (%s): "
                           "another node serves the same ranks; each rank must be served by exactly one node",
                           q->cnum, q->heap, s->node);
    } else {
        hd_store_req_failf(q,
                           "collect %" PRIu64
                           " of heap \"%s\": unexpected reply from Redis at %s to the collect script "
                           "(another program using heapd's keys?)",
                           q->cnum, q->heap, s->hostport);
    }
}

static void on_timeout_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = hd_store_req_find(s, (uint64_t)(uintptr_t)priv);
    const redisReply *e;

    /* ST_FETCH: the signed note came first; the fetch decides. */
    if (!q || q->state == ST_DONE || q->state == ST_FETCH || q->state == ST_MERGE)
        return;
    if (!r) {
        hd_store_req_failc(q, HD_STORE_ETIMEOUT,
                           "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms, and the connection to "
                           "Redis at %s was lost (%s) while heapd asked which ranks were missing",
                           q->cnum, q->heap, q->timeout_ms, s->hostport, hd_store_null_reply_why(s, ac));
        return;
    }
    if (is_noscript(r)) {
        s->cmd.script_sent = 0;
        if (hd_store_send_timeout(s, q) != 0)
            hd_store_req_fail_conn(q, 1, "the command could not be queued");
        return;
    }
    if (reply_is(r, 0, "abort") && (e = hd_store_reply_str(r, 1)) != NULL) {
        if (r->elements >= 3)
            publish_abort(s, q, r, e);
        hd_store_req_fail_stored(q, e->str, e->len);
    } else if (reply_is(r, 0, "done")) {
        /* It completed just before: the message with the result was sent to
         * us before this reply; give it the grace period. */
        q->state = ST_GRACE;
    } else {
        hd_store_req_failc(q, HD_STORE_ETIMEOUT,
                           "collect %" PRIu64 " of heap \"%s\" timed out after %" PRIu32 " ms; Redis at %s gave an "
                           "unexpected answer when asked which ranks were missing: %.*s",
                           q->cnum, q->heap, q->timeout_ms, s->hostport, r->type == REDIS_REPLY_ERROR ? (int)r->len : 0,
                           r->type == REDIS_REPLY_ERROR ? r->str : "");
    }
}

/* The collect (of ours) an abort is about, if it still waits. */
req *hd_store_abort_target(hd_store *s, const req *a)
{
    req *t = a->target ? hd_store_req_find(s, a->target) : NULL;
    return t && t->state != ST_DONE ? t : NULL;
}

static void on_abort_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = hd_store_req_find(s, (uint64_t)(uintptr_t)priv);
    req *t;
    const redisReply *e;

    if (!q || q->state == ST_DONE)
        return;
    t = hd_store_abort_target(s, q);
    if (r && is_noscript(r)) {
        s->cmd.script_sent = 0;
        if (hd_store_send_abort(s, q) == 0)
            return;
        r = NULL;
    }
    if (r && (reply_is(r, 0, "aborted") || reply_is(r, 0, "abort")) && (e = hd_store_reply_str(r, 1)) != NULL) {
        /* Recorded (ours or an earlier failure: every node reports that one). */
        if (reply_is(r, 0, "aborted"))
            publish_abort(s, q, r, e);
        if (t)
            hd_store_req_fail_stored(t, e->str, e->len);
    } else if (r && reply_is(r, 0, "done")) {
        /* Completed before the abort: our collect gets the result like every
         * other node (its message is on its way, or it has come). */
    } else if (t) {
        hd_store_req_failc(t, q->code, "%s", q->msg);
    }
    hd_store_req_finish(q, 0, NULL, NULL, 0);
}

/* ---- API ----------------------------------------------------------------- */

static req *pending_collect(hd_store *s, const char *heap, const char *inc)
{
    for (req *q = s->reqs; q; q = q->next)
        if (q->kind == RQ_COLLECT && !strcmp(q->heap, heap) && !strcmp(q->inc, inc))
            return q;
    return NULL;
}

/* hd_store_collect's arguments, the store and the callback aside: 0, or -1
 * with err filled. */
static int collect_args_check(hd_store *s, const char *heap, const char *incarnation, uint64_t cnum,
                              uint32_t world_size, const uint32_t *local_ranks, size_t nlocal, const uint64_t *offsets,
                              size_t n, uint32_t timeout_ms, uint32_t ttl_s, char *err, size_t errlen)
{
    req *q;

    if (s->closing) {
        hd_store_seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": the store is closing (heapd is stopping)",
                        cnum, heap ? heap : "");
        return -1;
    }
    if (!hd_store_name_ok("heap", heap, err, errlen) || !hd_store_name_ok("incarnation", incarnation, err, errlen))
        return -1;
    if (world_size == 0 || nlocal == 0 || !local_ranks) {
        hd_store_seterr(err, errlen,
                        "collect %" PRIu64 " of heap \"%s\": world size %" PRIu32 " and %zu local ranks: both "
                        "must be at least 1",
                        cnum, heap, world_size, nlocal);
        return -1;
    }
    for (size_t i = 0; i < nlocal; i++)
        if (local_ranks[i] >= world_size) {
            hd_store_seterr(err, errlen,
                            "collect %" PRIu64 " of heap \"%s\": local rank %" PRIu32 " is not below the world "
                            "size %" PRIu32,
                            cnum, heap, local_ranks[i], world_size);
            return -1;
        }
    if (n && !offsets) {
        hd_store_seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": %zu offsets but no array", cnum, heap, n);
        return -1;
    }
    if (timeout_ms == 0 || ttl_s == 0) {
        hd_store_seterr(err, errlen,
                        "collect %" PRIu64 " of heap \"%s\": timeout_ms and ttl_s must be at least 1 "
                        "(ttl_s should be well above the timeout, e.g. 10x)",
                        cnum, heap);
        return -1;
    }
    if ((q = pending_collect(s, heap, incarnation)) != NULL) {
        hd_store_seterr(err, errlen,
                        "collect %" PRIu64 " of heap \"%s\": collect %" PRIu64 " of this heap (incarnation %s) "
                        "is still pending; wait for its callback",
                        cnum, heap, q->cnum, incarnation);
        return -1;
    }
    return 0;
}

/* offsets[0..*np) ascending without duplicates: *out is NULL when they
 * already are, else a sorted copy (the caller frees it) and *np its length.
 * Returns 0, or -1 (out of memory). */
static int sort_offsets(const uint64_t *offsets, size_t *np, uint64_t **out)
{
    size_t n = *np;

    *out = NULL;
    for (size_t i = 1; i < n; i++)
        if (offsets[i] <= offsets[i - 1]) {
            size_t k = 0;
            uint64_t *sorted = malloc(n * sizeof *sorted);
            if (!sorted)
                return -1;
            memcpy(sorted, offsets, n * sizeof *sorted);
            qsort(sorted, n, sizeof *sorted, cmp_u64);
            for (size_t j = 0; j < n; j++)
                if (j == 0 || sorted[j] != sorted[k - 1])
                    sorted[k++] = sorted[j];
            *np = k;
            *out = sorted;
            break;
        }
    return 0;
}

int hd_store_collect(hd_store *s, const char *heap, const char *incarnation, uint64_t cnum, uint32_t world_size,
                     const uint32_t *local_ranks, size_t nlocal, const uint64_t *offsets, size_t n, uint32_t timeout_ms,
                     uint32_t ttl_s, hd_store_cb cb, void *arg, char *err, size_t errlen)
{
    req *q;
    uint64_t *sorted = NULL;
    const uint64_t *src;

    if (!s || !cb) {
        hd_store_seterr(err, errlen, "hd_store_collect: store and callback must not be NULL");
        return -1;
    }
    if (collect_args_check(s, heap, incarnation, cnum, world_size, local_ranks, nlocal, offsets, n, timeout_ms, ttl_s,
                           err, errlen) != 0)
        return -1;
    if (sort_offsets(offsets, &n, &sorted) != 0) {
        hd_store_seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": out of memory sorting %zu offsets", cnum,
                        heap, n);
        return -1;
    }
    src = sorted ? sorted : offsets;
    q = hd_store_req_new(s, RQ_COLLECT, timeout_ms);
    if (!q) {
        free(sorted);
        hd_store_seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": out of memory", cnum, heap);
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
    q->staged = q->set_len > HD_STORE_PIECE_BYTES;
    q->set = n ? malloc(q->set_len) : NULL;
    if (!q->heap || !q->inc || !q->prefix || !q->ranks || (n && !q->set)) {
        free(sorted);
        hd_store_req_discard(q); /* cb never called: we return an error */
        hd_store_seterr(err, errlen, "collect %" PRIu64 " of heap \"%s\": out of memory (%zu offsets)", cnum, heap, n);
        return -1;
    }
    for (size_t i = 0; i < nlocal; i++)
        put_be32(q->ranks + 4 * i, local_ranks[i]);
    for (size_t i = 0; i < n; i++)
        put_be64(q->set + 8 * i, src[i]);
    free(sorted);
    hd_store_kick(s);
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
    if (!s || s->closing || !msg || !*msg || !hd_store_name_ok("heap", heap, NULL, 0) ||
        !hd_store_name_ok("incarnation", incarnation, NULL, 0))
        return -1;
    t = pending_collect(s, heap, incarnation);
    if (t && (t->cnum != cnum || t->state == ST_DONE))
        t = NULL;
    q = hd_store_req_new(s, RQ_ABORT, HD_STORE_ABORT_REQ_TIMEOUT_MS);
    if (!q) {
        if (t)
            hd_store_req_failc(t, code, "%s", msg);
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
        hd_store_req_discard(q);
        if (t)
            hd_store_req_failc(t, code, "%s", msg);
        return -1;
    }
    if (t) {
        if (t->state == ST_QUEUED)
            hd_store_req_failc(t, code, "%s", msg); /* not contributed: nothing in Redis can complete it */
        else
            q->target = t->id; /* decided by the abort's reply */
    }
    hd_store_kick(s);
    return 0;
}
