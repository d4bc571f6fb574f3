/* store_redis_pubsub.c - the Redis store's pub/sub side (see
 * store_redis_int.h): the subscription's messages (collect results and
 * failures other nodes publish, forced-collect requests) and publishing a
 * forced-collect request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hmac.h"
#include "store_redis_int.h"

/* ---- forced collects ------------------------------------------------------ */

static void on_publish_reply(redisAsyncContext *ac, void *reply, void *priv);

int hd_store_send_publish(hd_store *s, req *q)
{
    char *payload = hd_store_xasprintf("F%zu:%s%s", strlen(q->heap), q->heap, q->inc);
    int rc;
    if (!payload || !s->cmd.ac) {
        free(payload);
        return -1;
    }
    rc = redisAsyncCommand(s->cmd.ac, on_publish_reply, (void *)(uintptr_t)q->id, "PUBLISH %s %s",
                           HD_STORE_FORCE_CHANNEL, payload);
    free(payload);
    if (rc != REDIS_OK)
        return -1;
    s->commands++;
    return 0;
}

static void on_publish_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = hd_store_req_find(s, (uint64_t)(uintptr_t)priv);

    if (!q || q->state == ST_DONE)
        return;
    if (!r) {
        hd_store_req_fail_conn(q, 1, hd_store_null_reply_why(s, ac));
    } else if (r->type == REDIS_REPLY_INTEGER) {
        q->receivers = r->integer > 0 ? (uint64_t)r->integer : 0;
        hd_store_req_finish(q, 0, NULL, NULL, 0);
    } else {
        hd_store_req_failf(q, "Redis at %s refused to publish the forced collect request for heap \"%s\": %.*s",
                           s->hostport, q->heap, r->type == REDIS_REPLY_ERROR ? (int)r->len : 0,
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

/* The collect of ours a message names, if it waits for one. */
static req *waiting_collect(hd_store *s, const char *prefix, size_t plen)
{
    for (req *q = s->reqs; q; q = q->next) {
        if (q->kind != RQ_COLLECT || q->state == ST_DONE || q->state == ST_QUEUED || q->state == ST_MERGE ||
            q->state == ST_FETCH)
            continue;
        if (strlen(q->prefix) == plen && !memcmp(q->prefix, prefix, plen))
            return q;
    }
    return NULL;
}

/* kind prefix '\n' MAC(40 hex) body: 'R' a result, 'A' a failure, 'S' a
 * note "LEN RMAC" for a result stored at PREFIX:res. Without a valid MAC
 * (with a key) the message is dropped (issue 33 item 1). */
static void got_node_message(hd_store *s, const char *p, size_t len)
{
    const char *nl = len ? memchr(p, '\n', len) : NULL, *body;
    char mac[HMAC_HEX_LEN + 1];
    size_t plen, blen;
    req *q;
    if (!nl || (p[0] != 'R' && p[0] != 'A' && p[0] != 'S'))
        return;
    plen = (size_t)(nl - p) - 1;
    if (!(q = waiting_collect(s, p + 1, plen)))
        return;
    if ((size_t)(p + len - (nl + 1)) < HMAC_HEX_LEN) {
        hd_store_warn_drop(s, "a message too short to carry a MAC");
        return;
    }
    body = nl + 1 + HMAC_HEX_LEN;
    blen = len - (size_t)(body - p);
    if (s->have_key) {
        hd_store_sign(s, p[0], q->prefix, body, blen, mac);
        if (!hmac_equal(mac, nl + 1, HMAC_HEX_LEN)) {
            char why[400];
            snprintf(why, sizeof why, "a %s for %s %s", p[0] == 'A' ? "failure" : "result", q->prefix,
                     memcmp(nl + 1, HD_STORE_NOMAC, HMAC_HEX_LEN) ? "with a bad MAC" : "without a MAC");
            hd_store_warn_drop(s, why);
            return;
        }
    }
    if (p[0] == 'R') {
        hd_store_finish_with_blob(q, body, blen);
    } else if (p[0] == 'A') {
        hd_store_req_fail_stored(q, body, blen);
    } else {
        char note[80], *end;
        unsigned long long n;
        snprintf(note, sizeof note, "%.*s", (int)(blen < sizeof note - 1 ? blen : sizeof note - 1), body);
        n = strtoull(note, &end, 10);
        if (*end != ' ' || strlen(end + 1) != HMAC_HEX_LEN || n % 8) {
            hd_store_warn_drop(s, "a malformed result note");
            return;
        }
        hd_store_fetch_result(s, q, (size_t)n, end + 1);
    }
}

void hd_store_on_sub(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    const redisReply *kind, *chan, *body;

    if (!r || s->sub.ac != ac || r->type != REDIS_REPLY_ARRAY || r->elements < 3)
        return;
    kind = hd_store_reply_str(r, 0);
    chan = hd_store_reply_str(r, 1);
    if (!kind || !chan)
        return;
    if (kind->len == 9 && !strncasecmp(kind->str, "subscribe", 9)) {
        s->sub.nsubs++;
        if (hd_store_can_send(s))
            hd_store_kick(s);
        return;
    }
    if (kind->len != 7 || strncasecmp(kind->str, "message", 7) || !(body = hd_store_reply_str(r, 2)))
        return;
    s->messages++;
    if (chan->len == strlen(HD_STORE_FORCE_CHANNEL) && !memcmp(chan->str, HD_STORE_FORCE_CHANNEL, chan->len))
        got_force(s, body->str, body->len);
    else if (chan->len == strlen(s->node_chan) && !memcmp(chan->str, s->node_chan, chan->len))
        got_node_message(s, body->str, body->len);
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
        hd_store_seterr(err, errlen, "hd_store_publish_force: no store");
        return -1;
    }
    if (s->closing) {
        hd_store_seterr(err, errlen, "cannot request a forced collect: the store is closing (heapd is stopping)");
        return -1;
    }
    if (!hd_store_name_ok("heap", heap, err, errlen) || !hd_store_name_ok("incarnation", incarnation, err, errlen))
        return -1;
    q = hd_store_req_new(s, RQ_FORCE, timeout_ms ? timeout_ms : HD_STORE_FORCE_DEFAULT_TIMEOUT_MS);
    if (!q) {
        hd_store_seterr(err, errlen, "forced collect of heap \"%s\": out of memory", heap);
        return -1;
    }
    q->heap = strdup(heap);
    q->inc = strdup(incarnation);
    if (!q->heap || !q->inc) {
        hd_store_req_discard(q);
        hd_store_seterr(err, errlen, "forced collect of heap \"%s\": out of memory", heap);
        return -1;
    }
    q->fcb = cb;
    q->arg = arg;
    hd_store_kick(s);
    return 0;
}

int hd_store_publish_force(hd_store *s, const char *heap, const char *incarnation, char *err, size_t errlen)
{
    return hd_store_publish_force_cb(s, heap, incarnation, HD_STORE_FORCE_DEFAULT_TIMEOUT_MS, NULL, NULL, err, errlen);
}
