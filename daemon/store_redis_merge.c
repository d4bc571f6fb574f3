/* store_redis_merge.c - big candidate sets and signed messages (issue 33;
 * see store_redis_int.h).
 *
 * Item 5: one node's contribution of more than HD_STORE_PIECE offsets is
 * staged in pieces (HSET PREFIX:u:NODE I PIECE) to PREFIX:u:NODE before its commit,
 * so no command costs Redis more than a piece and other jobs' commands run in
 * between. The node whose commit covers the last rank fetches the staged
 * sets of the others (HGET, one piece per command), intersects them with
 * its own and with the script's inline intersection, and distributes the
 * result: inline in the message when it fits a piece, else stored in pieces
 * at PREFIX:res and announced with a short note that every node follows.
 *
 * Item 1: the script publishes nothing; the node that decided an outcome
 * publishes it, signed: kind PREFIX '\n' MAC body, MAC = HMAC-SHA1(key, kind
 * || PREFIX || '\n' || body) in hex (HD_STORE_NOMAC without a key). A note
 * ('S') carries "LEN RMAC", RMAC being the 'R' MAC of the stored result, so
 * a receiver checks the note before fetching and the result after. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hmac.h"
#include "store_redis_int.h"

/* store_lua.h's staged check counts pieces of this size. */
_Static_assert(HD_STORE_PIECE_BYTES == 32768, "the script's `piece`");

/* ---- signing ------------------------------------------------------------- */

void hd_store_sign(const hd_store *s, char kind, const char *prefix, const char *body, size_t len, char out[41])
{
    hmac_ctx h;
    if (!s->have_key) {
        memcpy(out, HD_STORE_NOMAC, HMAC_HEX_LEN + 1);
        return;
    }
    hmac_init(&h, s->key, s->keylen);
    hmac_update(&h, &kind, 1);
    hmac_update(&h, prefix, strlen(prefix));
    hmac_update(&h, "\n", 1);
    hmac_update(&h, body, len);
    hmac_final_hex(&h, out);
}

int hd_store_publish_signed(hd_store *s, req *q, char kind, const char *body, size_t len)
{
    size_t pl = strlen(q->prefix), ml = 1 + pl + 1 + HMAC_HEX_LEN + len;
    char *msg = malloc(ml), mac[HMAC_HEX_LEN + 1];
    int rc;
    if (!msg)
        return -1;
    hd_store_sign(s, kind, q->prefix, body, len, mac);
    msg[0] = kind;
    memcpy(msg + 1, q->prefix, pl);
    msg[1 + pl] = '\n';
    memcpy(msg + 2 + pl, mac, HMAC_HEX_LEN);
    if (len)
        memcpy(msg + 2 + pl + HMAC_HEX_LEN, body, len);
    const char *extra[1] = {msg};
    size_t elen[1] = {ml};
    rc = hd_store_send_script(s, q, NULL, "p", 1, extra, elen);
    free(msg);
    return rc;
}

void hd_store_warn_drop(hd_store *s, const char *why)
{
    uint64_t now = uv_now(s->loop);
    char msg[600];
    s->dropped++;
    if (!s->warn || (s->warned_at && now - s->warned_at < 1000))
        return;
    snprintf(msg, sizeof msg,
             "store: dropped %" PRIu64 " message(s) on %s: %s (forged by a program that can reach Redis at %s, "
             "or a node with another store_key)",
             s->dropped, s->node_chan, why, s->hostport);
    s->warn(s->warn_arg, msg);
    s->dropped = 0;
    s->warned_at = now ? now : 1;
}

/* ---- pieces -------------------------------------------------------------- */

/* HSET key I piece for each piece I (fields "0", "1", ...: each its own
 * allocation in Redis, so no command copies what came before, as APPEND's
 * reallocations would), then EXPIRE key ttl. */
static int send_pieces(hd_store *s, const char *key, const char *data, size_t len, uint32_t ttl)
{
    char ttls[16], idx[24];
    snprintf(ttls, sizeof ttls, "%" PRIu32, ttl ? ttl : HD_STORE_ABORT_TTL_S);
    for (size_t off = 0; off < len || off == 0; off += HD_STORE_PIECE_BYTES) {
        size_t n = len - off < HD_STORE_PIECE_BYTES ? len - off : HD_STORE_PIECE_BYTES;
        snprintf(idx, sizeof idx, "%zu", off / HD_STORE_PIECE_BYTES);
        const char *argv[4] = {"HSET", key, idx, data + off};
        size_t alen[4] = {4, strlen(key), strlen(idx), n};
        if (redisAsyncCommandArgv(s->cmd.ac, NULL, NULL, 4, argv, alen) != REDIS_OK)
            return -1;
        s->commands++;
        if (!len)
            break;
    }
    if (redisAsyncCommand(s->cmd.ac, NULL, NULL, "EXPIRE %s %s", key, ttls) != REDIS_OK)
        return -1;
    s->commands++;
    return 0;
}

int hd_store_send_stage(hd_store *s, req *q)
{
    char *key = hd_store_xasprintf("%s:u:%s", q->prefix, s->node);
    int rc = key && s->cmd.ac ? send_pieces(s, key, q->set, q->set_len, q->ttl_s) : -1;
    free(key);
    return rc;
}

/* ---- fetching ------------------------------------------------------------ */

void hd_store_fetch_free(fetch *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->nkeys; i++)
        free(f->keys[i]);
    free(f->keys);
    free(f->klen);
    free(f->buf);
    free(f);
}

static fetch *fetch_new(size_t nkeys)
{
    fetch *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->keys = calloc(nkeys, sizeof *f->keys);
    f->klen = calloc(nkeys, sizeof *f->klen);
    f->nkeys = nkeys;
    if (!f->keys || !f->klen) {
        hd_store_fetch_free(f);
        return NULL;
    }
    return f;
}

static void on_fetch_reply(redisAsyncContext *ac, void *reply, void *priv);

/* Queues every HGET of q->fx (a piece each): 0 or -1. */
static int fetch_send(hd_store *s, req *q)
{
    fetch *f = q->fx;
    f->len = 0;
    for (size_t i = 0; i < f->nkeys; i++)
        f->len += f->klen[i];
    f->buf = malloc(f->len ? f->len : 1);
    if (!f->buf || !s->cmd.ac)
        return -1;
    for (size_t i = 0; i < f->nkeys; i++)
        for (size_t off = 0; off < f->klen[i]; off += HD_STORE_PIECE_BYTES) {
            size_t n = f->klen[i] - off < HD_STORE_PIECE_BYTES ? f->klen[i] - off : HD_STORE_PIECE_BYTES;
            char idx[24];
            (void)n;
            snprintf(idx, sizeof idx, "%zu", off / HD_STORE_PIECE_BYTES);
            if (redisAsyncCommand(s->cmd.ac, on_fetch_reply, (void *)(uintptr_t)q->id, "HGET %s %s", f->keys[i], idx) !=
                REDIS_OK)
                return -1;
            s->commands++;
            f->pending++;
        }
    while (f->ki < f->nkeys && f->klen[f->ki] == 0)
        f->ki++;
    return 0;
}

static void merge_finish(hd_store *s, req *q);
static void result_fetched(hd_store *s, req *q);

/* Both fetch kinds end here once every reply is in. */
static void fetch_done(hd_store *s, req *q)
{
    if (q->fx->bad) {
        char what[400];
        hd_store_req_what(q, what, sizeof what);
        if (q->state == ST_MERGE) {
            char *m =
                hd_store_xasprintf("E1:%s: node %s could not read back the candidates other nodes staged in "
                                   "Redis at %s (keys expired or evicted, or another program writing heapd keys?)",
                                   what, s->node, s->hostport);
            if (m)
                hd_store_publish_signed(s, q, 'A', m, strlen(m));
            hd_store_req_fail_stored(q, m ? m : "E1:out of memory", m ? strlen(m) : 16);
            free(m);
        } else {
            hd_store_req_failf(q,
                               "%s: its result could not be read back from Redis at %s (the key expired or was "
                               "evicted, or another program writes heapd keys)",
                               what, s->hostport);
        }
        return;
    }
    if (q->state == ST_MERGE)
        merge_finish(s, q);
    else
        result_fetched(s, q);
}

static void on_fetch_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    req *q = hd_store_req_find(s, (uint64_t)(uintptr_t)priv);
    fetch *f;

    if (!q || !q->fx || (q->state != ST_MERGE && q->state != ST_FETCH))
        return;
    if (!r) {
        hd_store_req_fail_conn(q, 1, hd_store_null_reply_why(s, ac));
        return;
    }
    f = q->fx;
    if (f->ki < f->nkeys) {
        size_t want = f->klen[f->ki] - f->koff < HD_STORE_PIECE_BYTES ? f->klen[f->ki] - f->koff : HD_STORE_PIECE_BYTES;
        if (r->type != REDIS_REPLY_STRING || (size_t)r->len != want)
            f->bad = 1;
        else
            memcpy(f->buf + f->got, r->str, want);
        f->got += want;
        f->koff += want;
        while (f->ki < f->nkeys && f->koff >= f->klen[f->ki]) {
            f->ki++;
            f->koff = 0;
        }
    }
    if (--f->pending == 0)
        fetch_done(s, q);
}

/* ---- the completing node -------------------------------------------------- */

/* The sorted intersection of a and b (big-endian u64 each) into out (room
 * for the shorter); returns its length in bytes. */
static size_t isect_be(const char *a, size_t na, const char *b, size_t nb, char *out)
{
    size_t i = 0, j = 0, k = 0;
    while (i + 8 <= na && j + 8 <= nb) {
        int c = memcmp(a + i, b + j, 8);
        if (c < 0)
            i += 8;
        else if (c > 0)
            j += 8;
        else {
            memmove(out + k, a + i, 8);
            k += 8, i += 8, j += 8;
        }
    }
    return k;
}

void hd_store_complete(hd_store *s, req *q, const char *res, size_t len)
{
    if (len <= HD_STORE_PIECE_BYTES) {
        hd_store_publish_signed(s, q, 'R', res, len);
    } else {
        char *key = hd_store_xasprintf("%s:res", q->prefix), body[64], rmac[HMAC_HEX_LEN + 1];
        hd_store_sign(s, 'R', q->prefix, res, len, rmac);
        snprintf(body, sizeof body, "%zu %s", len, rmac);
        if (key && send_pieces(s, key, res, len, q->ttl_s) == 0)
            hd_store_publish_signed(s, q, 'S', body, strlen(body));
        free(key);
    }
    /* A publish that failed leaves the others to their timeout: Redis says
     * "done" to them, and they report the lost result (ST_GRACE). */
    hd_store_finish_with_blob(q, res, len);
}

/* Every set is in: our own (staged, or inside the inline intersection), the
 * inline intersection, and the others' staged sets (q->fx). */
static void merge_finish(hd_store *s, req *q)
{
    fetch *f = q->fx;
    size_t cap = q->staged ? q->set_len : q->inl_len, len, at = 0;
    char *cur = malloc(cap ? cap : 1);
    if (!cur) {
        hd_store_req_finish(q, HD_STORE_EFAIL, NULL, NULL, 0);
        return;
    }
    if (q->staged) {
        memcpy(cur, q->set, q->set_len);
        len = q->set_len;
        if (q->has_inl)
            len = isect_be(cur, len, q->inl, q->inl_len, cur);
    } else {
        memcpy(cur, q->inl, q->inl_len);
        len = q->inl_len;
    }
    for (size_t i = 0; i < f->nkeys; at += f->klen[i], i++)
        len = isect_be(cur, len, f->buf + at, f->klen[i], cur);
    {
        /* The staged keys (ours too) are done with. */
        const char **argv = calloc(f->nkeys + 2, sizeof *argv);
        size_t *alen = calloc(f->nkeys + 2, sizeof *alen);
        char *own = q->staged ? hd_store_xasprintf("%s:u:%s", q->prefix, s->node) : NULL;
        if (argv && alen) {
            int argc = 0;
            argv[argc] = "DEL", alen[argc++] = 3;
            for (size_t i = 0; i < f->nkeys; i++)
                argv[argc] = f->keys[i], alen[argc] = strlen(f->keys[i]), argc++;
            if (own)
                argv[argc] = own, alen[argc] = strlen(own), argc++;
            if (s->cmd.ac && redisAsyncCommandArgv(s->cmd.ac, NULL, NULL, argc, argv, alen) == REDIS_OK)
                s->commands++;
        }
        free(argv);
        free(alen);
        free(own);
    }
    hd_store_complete(s, q, cur, len);
    free(cur);
}

/* "NODE LEN NODE LEN ..." without our own entry: the number of others, or
 * -1 when the list is malformed; f (when not NULL) gets their keys. */
static long parse_staged(hd_store *s, req *q, const char *p, size_t plen, fetch *f)
{
    char *copy = strndup(p, plen), *save = NULL, *tok;
    long n = 0;
    if (!copy)
        return -1;
    for (tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *lens = strtok_r(NULL, " ", &save), *end;
        unsigned long long v;
        if (!lens)
            goto bad;
        v = strtoull(lens, &end, 10);
        if (*end || v % 8)
            goto bad;
        if (!strcmp(tok, s->node))
            continue;
        if (f) {
            f->keys[n] = hd_store_xasprintf("%s:u:%s", q->prefix, tok);
            f->klen[n] = (size_t)v;
            if (!f->keys[n])
                goto bad;
        }
        n++;
    }
    free(copy);
    return n;
bad:
    free(copy);
    return -1;
}

void hd_store_merge_start(hd_store *s, req *q, const redisReply *r)
{
    const redisReply *inl = hd_store_reply_str(r, 1), *has = hd_store_reply_str(r, 2), *big = hd_store_reply_str(r, 3);
    long n = big ? parse_staged(s, q, big->str, big->len, NULL) : -1;
    fetch *f;

    if (!inl || !has || n < 0 || inl->len % 8) {
        hd_store_req_failf(q,
                           "collect %" PRIu64 " of heap \"%s\": Redis at %s gave a malformed completion "
                           "(another program writing heapd keys?)",
                           q->cnum, q->heap, s->hostport);
        return;
    }
    q->has_inl = has->len == 1 && has->str[0] == '1';
    q->inl = malloc(inl->len ? inl->len : 1);
    f = fetch_new(n ? (size_t)n : 1);
    if (!q->inl || !f || (n && parse_staged(s, q, big->str, big->len, f) != n)) {
        hd_store_fetch_free(f);
        hd_store_req_finish(q, HD_STORE_EFAIL, NULL, NULL, 0);
        return;
    }
    memcpy(q->inl, inl->str, inl->len);
    q->inl_len = inl->len;
    f->nkeys = (size_t)n;
    q->fx = f;
    q->state = ST_MERGE;
    if (fetch_send(s, q) != 0) {
        hd_store_req_fail_conn(q, 1, "the command could not be queued");
        return;
    }
    if (f->pending == 0)
        merge_finish(s, q);
}

/* ---- a receiving node ----------------------------------------------------- */

void hd_store_fetch_result(hd_store *s, req *q, size_t len, const char *rmac)
{
    fetch *f = fetch_new(1);
    if (!f || !(f->keys[0] = hd_store_xasprintf("%s:res", q->prefix))) {
        hd_store_fetch_free(f);
        hd_store_req_finish(q, HD_STORE_EFAIL, NULL, NULL, 0);
        return;
    }
    f->klen[0] = len;
    memcpy(q->rmac, rmac, HMAC_HEX_LEN);
    q->rmac[HMAC_HEX_LEN] = 0;
    q->fx = f;
    q->state = ST_FETCH;
    if (fetch_send(s, q) != 0)
        hd_store_req_fail_conn(q, 1, "the command could not be queued");
    else if (f->pending == 0)
        result_fetched(s, q);
}

static void result_fetched(hd_store *s, req *q)
{
    char mac[HMAC_HEX_LEN + 1];
    if (s->have_key) {
        hd_store_sign(s, 'R', q->prefix, q->fx->buf, q->fx->len, mac);
        if (!hmac_equal(mac, q->rmac, HMAC_HEX_LEN)) {
            hd_store_req_failf(q,
                               "collect %" PRIu64 " of heap \"%s\": the result stored in Redis at %s does not match "
                               "the signed note of the node that completed it (%s:res changed by another program?)",
                               q->cnum, q->heap, s->hostport, q->prefix);
            return;
        }
    }
    hd_store_finish_with_blob(q, q->fx->buf, q->fx->len);
}
