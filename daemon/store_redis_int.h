/* store_redis_int.h - the Redis store's structs, their invariants, and the
 * functions its files share. Not for use outside daemon/store_redis*.c: the
 * store's API is store.h.
 *
 *   store_redis.c          the two connections (resolve, connect, reconnect,
 *                          SUBSCRIBE), the script (EVAL / EVALSHA), sending the
 *                          queued requests, the URL, open and close;
 *   store_redis_req.c      requests: lifetime, outcomes, failures, their timers
 *                          (a request's timeout, the timeout round, delivery);
 *   store_redis_collect.c  the collect round: keys, contributions, timeouts
 *                          and aborts in Redis, their replies, the result;
 *   store_redis_pubsub.c   pub/sub messages (collect results and failures of
 *                          other nodes, forced-collect requests) and forced
 *                          collect publishing;
 *   store_redis_merge.c    big candidate sets in pieces (staging, fetching,
 *                          intersecting on the completing node) and signed
 *                          messages (issue 33 items 1 and 5);
 *   store_redis_auth.c     the credentials file, AUTH and the MAC key.
 *
 * Every function these files share is hd_store_*, and every macro here
 * HD_STORE_*, like the API's; what only one file uses is static there. The
 * types and enums below (req, conn, force_note, RQ_*, ST_*) are seen by
 * these files only. */
#ifndef HEAPD_STORE_REDIS_INT_H
#define HEAPD_STORE_REDIS_INT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <uv.h>

#include "store.h"

#define HD_STORE_FORCE_CHANNEL            "heapd:force"
#define HD_STORE_NODE_CHANNEL             "heapd:node:"
#define HD_STORE_ABORT_REQ_TIMEOUT_MS     10000
#define HD_STORE_FORCE_DEFAULT_TIMEOUT_MS 10000
#define HD_STORE_PIECE_BYTES              (HD_STORE_PIECE * 8)
/* A message's MAC field when this node has no key: the same width. */
#define HD_STORE_NOMAC "----------------------------------------"

/* ---- state ------------------------------------------------------------- */

enum req_kind { RQ_COLLECT, RQ_ABORT, RQ_FORCE };

enum req_state {
    ST_QUEUED, /* waiting for both connections (and the subscription) */
    ST_SENT,   /* command sent, reply pending */
    ST_WAIT,   /* collect: Redis said wait; the result comes as a message */
    ST_TIMING, /* collect: timed out here; the timeout op is in flight */
    ST_GRACE,  /* collect: Redis said it completed; the message is due */
    ST_MERGE,  /* collect: we completed it; fetching the staged sets to intersect */
    ST_FETCH,  /* collect: a signed note said where the result is; fetching it */
    ST_DONE    /* result parked; delivered from the timer */
};

/* HGET of the pieces of one or more piece hashes into one buffer (issue 33
 * item 5). Invariants: nkeys >= 1; sum(klen) == len; ki < nkeys or all
 * replies are in; 0 <= koff <= klen[ki]; pending == HGET replies still
 * due; got <= len. */
typedef struct fetch {
    char **keys;
    size_t *klen;
    size_t nkeys;
    char *buf;
    size_t len, got;
    size_t ki, koff; /* where the next reply goes */
    size_t pending;
    int bad; /* a reply was short, or not a string */
} fetch;

/* One request: a collect contribution, an abort, or a force PUBLISH.
 * Invariants (while linked in s->reqs):
 *   0 < id <= s->next_id;
 *   state in {ST_WAIT, ST_TIMING, ST_GRACE, ST_MERGE, ST_FETCH} => kind ==
 *     RQ_COLLECT;
 *   state in {ST_MERGE, ST_FETCH} => fx != NULL (kept until the request is freed);
 *   staged == (set_len > HD_STORE_PIECE_BYTES); staged_sent => staged;
 *   state == ST_DONE <=> the outcome (status, errmsg, res, nres) is parked
 *     and the timer is due at 0 ms; else the timer is the request's deadline;
 *   state == ST_DONE and status < 0 => errmsg != NULL unless out of memory;
 *   kind == RQ_COLLECT: prefix == "heapd:" esc(heap) ":" esc(inc) ":c" cnum,
 *     ranks_len == 4 * (local ranks), set_len == 8 * (candidates), set
 *     strictly ascending;
 *   kind == RQ_ABORT: prefix as for a collect, msg != NULL, code in
 *     [-9, -1], target == 0 or the id of our RQ_COLLECT with that prefix;
 *   kind == RQ_FORCE: prefix == NULL, ranks == set == NULL.
 * cb is called for RQ_COLLECT, fcb for RQ_FORCE, each exactly once, from
 * the timer (hd_store_req_deliver). */
typedef struct req {
    struct req *prev, *next;
    hd_store *s;
    uint64_t id;
    enum req_kind kind;
    enum req_state state;
    uv_timer_t timer;
    char *heap, *inc;
    uint64_t cnum;
    char *prefix; /* heapd:HEAP:INC:cN */
    uint32_t world, timeout_ms, ttl_s;
    char *ranks; /* big-endian u32 */
    size_t ranks_len;
    char *set; /* big-endian u64, ascending */
    size_t set_len;
    char *msg;       /* RQ_ABORT: the message */
    int code;        /* RQ_ABORT: its HD_STORE_E* code */
    uint64_t target; /* RQ_ABORT: our collect that waits for this abort's reply */
    hd_store_cb cb;
    hd_store_force_cb fcb;
    void *arg;
    int status; /* result */
    char *errmsg;
    uint64_t *res;
    size_t nres;
    uint64_t receivers;
    /* big sets (issue 33 item 5) */
    int staged;      /* the set goes to PREFIX:u:NODE in pieces, then commits */
    int staged_sent; /* its pieces are queued on cmd */
    fetch *fx;       /* ST_MERGE: the staged sets of the others; ST_FETCH: the result */
    char *inl;       /* ST_MERGE: the inline intersection, when has_inl */
    size_t inl_len;
    int has_inl;
    char rmac[41]; /* ST_FETCH: the result's MAC the note promised */
} req;

/* One hiredis connection.
 * Invariants (while the store is not closing):
 *   ac == NULL => connected == nsubs == script_sent == 0;
 *   nsubs <= 2 (s->node_chan and HD_STORE_FORCE_CHANNEL), and nsubs == 0 on cmd;
 *   script_sent == 1 <=> EVAL carried the script on this ac (EVALSHA next). */
typedef struct conn {
    redisAsyncContext *ac;
    int connected;   /* the connect callback said OK */
    int nsubs;       /* sub: subscriptions confirmed */
    int script_sent; /* cmd: the script was sent with EVAL on this connection */
    int auth_failed; /* Redis refused this connection's AUTH (s->auth_err says how) */
} conn;

typedef struct force_note {
    struct force_note *next;
    char *heap, *inc;
} force_note;

/* Invariants:
 *   nhandles == (defer not yet closed) + (request timers not yet closed,
 *     linked or closing) + resolving; the store is freed when
 *     closing == 1 and nhandles == 0 (hd_store_maybe_free);
 *   resolving == 1 <=> uv_getaddrinfo on gai is in flight;
 *   host_is_ip == 1 => have_addr == 1 and addr == host;
 *   have_addr == 1 => addr is a numeric address of host;
 *   reqs .. reqs_tail: the live requests, ids strictly ascending (oldest
 *     first); reqs == NULL <=> reqs_tail == NULL; closing => reqs == NULL
 *     once hd_store_close returned;
 *   hd_store_can_send(s) <=> cmd.ac != NULL and sub.ac != NULL and
 *     sub.nsubs == 2; a request leaves ST_QUEUED only then;
 *   fq == NULL <=> fq_tail == NULL;
 *   sha == SHA-1 of COLLECT_LUA (hex);
 *   commands == commands sent on cmd since open; messages == pub/sub
 *     messages received on sub since open. */
struct hd_store {
    uv_loop_t *loop;
    char url[320];
    char host[256];
    char hostport[300]; /* for messages: HOST:PORT */
    int port;
    char node[HD_STORE_NODE_MAX + 1];
    char node_chan[sizeof HD_STORE_NODE_CHANNEL + HD_STORE_NODE_MAX];
    char addr[256]; /* numeric address connected to */
    int have_addr, host_is_ip;
    uv_getaddrinfo_t gai;
    int resolving;
    conn cmd, sub;
    char sha[41];
    req *reqs; /* live requests, oldest first */
    req *reqs_tail;
    uint64_t next_id;
    uint64_t commands, messages;
    uv_timer_t defer; /* delivers force notifications */
    force_note *fq, *fq_tail;
    void (*force_fn)(void *arg, const char *heap, const char *incarnation);
    void *force_arg;
    int closing;
    int nhandles; /* defer + request timers + getaddrinfo in flight */
    const char *drop_reason;
    /* AUTH (issue 33 item 1): have_auth => pass != "" (user "": the default
     * user); auth_err: the last refusal, "" after a successful AUTH. */
    int have_auth;
    char user[128], pass[256];
    char auth_err[1024];
    /* Signed results (issue 33 item 1): have_key => keylen > 0; messages on
     * the node channel are accepted only with a valid MAC then. dropped:
     * messages dropped since the last warning (one a second at most). */
    int have_key;
    unsigned char key[64];
    size_t keylen;
    void (*warn)(void *arg, const char *msg);
    void *warn_arg;
    uint64_t dropped, warned_at;
};

/* ---- store_redis.c: connections and the script ------------------------- */

/* Both connections exist and the subscription is confirmed. */
int hd_store_can_send(const hd_store *s);
/* Connects whatever is down, and sends the queued requests once
 * hd_store_can_send. Never calls a user callback. */
void hd_store_kick(hd_store *s);
/* Frees connection c from outside hiredis callbacks; why goes to the
 * requests that fail with it. */
void hd_store_conn_drop(hd_store *s, conn *c, const char *why);
/* EVALSHA (EVAL the first time on a connection) of the script for q, with
 * the op-specific arguments extra[0..nextra). Returns 0 or -1 (nothing sent). */
int hd_store_send_script(hd_store *s, req *q, redisCallbackFn *fn, const char *op, int nextra, const char *const *extra,
                         const size_t *extralen);

/* ---- store_redis_req.c: requests --------------------------------------- */

/* store_redis_auth.c: queues AUTH on ac when the store has credentials
 * (before anything else on that connection): 0, or -1 if it cannot. */
int hd_store_auth_send(hd_store *s, redisAsyncContext *ac);
/* Sets s->key from key_file, else from the credentials file's password
 * (s->pass, already loaded), else none: 0, or -1 with err filled. */
int hd_store_load_key(hd_store *s, const char *key_file, const char *credentials, char *err, size_t errlen);
#define HD_STORE_KEY_MIN 16
#define HD_STORE_KEY_MAX 256
void hd_store_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
char *hd_store_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 1 when name is 1 to HD_STORE_NAME_MAX bytes, else 0 with err filled. */
int hd_store_name_ok(const char *what, const char *name, char *err, size_t errlen);
void hd_store_maybe_free(hd_store *s);
req *hd_store_req_find(hd_store *s, uint64_t id);
/* Links a new request and starts its timer (timeout_ms from now). */
req *hd_store_req_new(hd_store *s, enum req_kind kind, uint32_t timeout_ms);
/* Drops a request that was never handed out (its creator failed). */
void hd_store_req_discard(req *q);
/* Parks the outcome; the timer delivers it. msg NULL with status < 0 means
 * "out of memory". Takes res. */
void hd_store_req_finish(req *q, int status, const char *msg, uint64_t *res, size_t nres);
/* Fails q with HD_STORE_EFAIL, or with `code`. */
void hd_store_req_failf(req *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hd_store_req_failc(req *q, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A failure recorded in Redis: "E<n>:" (n = -HD_STORE_E*) then the text. */
void hd_store_req_fail_stored(req *q, const char *str, size_t len);
/* Calls the user's callback (if any) and releases the request. */
void hd_store_req_deliver(req *q);
/* "collect 7 of heap "job"" / "the forced collect request for heap "job"" */
void hd_store_req_what(const req *q, char *buf, size_t len);
void hd_store_req_fail_conn(req *q, int was_connected, const char *why);

/* ---- store_redis_collect.c: the collect round -------------------------- */

int hd_store_send_contrib(hd_store *s, req *q);
int hd_store_send_timeout(hd_store *s, req *q);
int hd_store_send_abort(hd_store *s, req *q);
/* The collect (of ours) an abort is about, if it still waits. */
req *hd_store_abort_target(hd_store *s, const req *a);
/* A result blob: big-endian u64, strictly ascending. */
void hd_store_finish_with_blob(req *q, const char *p, size_t len);
/* Why a command's reply is NULL (the connection's error, heapd stopping). */
const char *hd_store_null_reply_why(hd_store *s, const redisAsyncContext *ac);
/* Element i of an array reply when it is a string, else NULL. */
const redisReply *hd_store_reply_str(const redisReply *r, size_t i);

/* ---- store_redis_merge.c: big sets, signed messages (issue 33) ---------- */

/* Queues q's pieces (HSET PREFIX:u:NODE I PIECE, EXPIRE): 0 or -1. */
int hd_store_send_stage(hd_store *s, req *q);
/* out: HMAC-SHA1 hex of kind || prefix || '\n' || body, or HD_STORE_NOMAC
 * without a key. */
void hd_store_sign(const hd_store *s, char kind, const char *prefix, const char *body, size_t len, char out[41]);
/* Signs and publishes kind prefix '\n' MAC body to every other node of q's
 * collect (op 'p'): 0 or -1. */
int hd_store_publish_signed(hd_store *s, req *q, char kind, const char *body, size_t len);
/* We completed q inline: publish the result, then deliver it. */
void hd_store_complete(hd_store *s, req *q, const char *res, size_t len);
/* We completed q with staged sets: r is the script's 4-element 'ok'. */
void hd_store_merge_start(hd_store *s, req *q, const redisReply *r);
/* A verified 'S' note for q: fetch the result (len bytes, MAC rmac). */
void hd_store_fetch_result(hd_store *s, req *q, size_t len, const char *rmac);
void hd_store_fetch_free(fetch *f);
/* Counts a dropped message and warns (rate-limited) through s->warn. */
void hd_store_warn_drop(hd_store *s, const char *why);

/* ---- store_redis_pubsub.c: messages and forced collects ---------------- */

int hd_store_send_publish(hd_store *s, req *q);
/* The sub connection's callback: subscription confirmations and messages. */
void hd_store_on_sub(redisAsyncContext *ac, void *reply, void *priv);

#endif
