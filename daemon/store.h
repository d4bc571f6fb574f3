/* store.h - the cross-node store: collects of a heap whose ranks span several
 * nodes (one heapd each) are reconciled through Redis (hiredis, async, on
 * heapd's libuv loop; the loop is never blocked).
 *
 * What it promises:
 *   - hd_store_collect: every node of a collect gets the same answer: the
 *     intersection of the candidate sets every node contributed, once the
 *     union of the contributed rank lists covers all world_size ranks; or the
 *     same error on every node (an abort, a timeout naming the missing ranks,
 *     a world size that differs, a rank two nodes contribute: the message
 *     names both nodes). Success and failure are decided atomically
 *     in Redis (one Lua script), so no node can apply a result another node
 *     reports as failed, as long as Redis stays up.
 *   - Traffic: one command per node per collect on the command connection
 *     (EVALSHA; EVAL the first time on each connection), and one more from
 *     the node that completed the collect (or recorded its failure): it
 *     publishes the signed outcome to every other node (one pub/sub message
 *     each). A node that times out sends one more command (which decides
 *     the timeout in Redis and fetches the missing ranks). A node with more
 *     than HD_STORE_PIECE (4096) candidates stages them in pieces first
 *     (one command per piece), the completing node fetches those and
 *     intersects them, and a result over a piece is stored in pieces that
 *     every node fetches: no command costs Redis more than one piece
 *     (issue 33 item 5).
 *   - A callback is called exactly once, never from inside the call that
 *     registered it and never from inside hiredis: always from a libuv timer
 *     of the store (except hd_store_close, which calls every pending callback
 *     before it returns).
 *   - Redis unreachable, killed or restarted: every pending collect fails at
 *     once (not at its timeout) with a message naming Redis's address; the
 *     next collect reconnects both connections.
 *   - Keys: heapd:HEAP:INCARNATION:cCNUM:s (a hash) and ...:r (a bitmap of
 *     the ranks seen; the caller puts ownership into the incarnation: the
 *     heap wing's is job~params~uUID~secret-hash), each with the caller's TTL; on completion the bitmap
 *     and the candidate set are deleted and only a small "done" hash remains
 *     until it expires. ':', '%', spaces and control characters in heap and
 *     incarnation names are %-escaped.
 *   - Pub/sub channels: heapd:node:NODE (one per node; collect results and
 *     failures, published by the node that decided them, signed with the
 *     cluster key when there is one) and heapd:force (forced-collect
 *     requests, every node).
 * Runs on the loop thread only. A library: it never prints or exits. The
 * program must ignore SIGPIPE (heapd does): hiredis writes with write(2). */
#ifndef HEAPD_STORE_H
#define HEAPD_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct hd_store hd_store;

/* Longest heap or incarnation name, and node name, in bytes. */
#define HD_STORE_NAME_MAX 255
#define HD_STORE_NODE_MAX 64

/* url: "redis://HOST:PORT" (also "redis://HOST", port 6379; "[v6addr]" for
 * IPv6; a trailing "/" or "/0" is accepted). node: this node's name, unique
 * per node: 1 to 64 of [A-Za-z0-9._-]. Connects asynchronously on `loop` (a
 * host name is resolved with uv_getaddrinfo); failures surface at the first
 * collect. Returns 0, or <0 with err filled. */
int hd_store_open(uv_loop_t *loop, const char *url, const char *node, hd_store **out, char *err, size_t errlen);
/* What heapd opens the store with (issue 33 item 1). url may carry
 * credentials: "redis://[USER[:PASSWORD]@]HOST[:PORT]" (":PASSWORD@" alone:
 * the default user); credentials, when not NULL or "", is a file readable by
 * heapd's user only (hd_store_check_credentials) whose first line is
 * "USER PASSWORD" or "PASSWORD". With either, every connection sends AUTH
 * before anything else; a refused AUTH fails the pending requests with a
 * message naming the user and what to check. */
/* Signed results (issue 33 item 1): key_file, when not NULL or "", is a
 * file readable by heapd's user only whose first line (16 to 256 bytes) is
 * the cluster key, the same on every node; without it the key is derived
 * from the credentials file's password; with neither, messages are not
 * signed. With a key, every collect result and failure a node publishes
 * carries HMAC-SHA1(key, kind || collect || result), and a node drops any
 * message on its channel without a valid one (warn is called, at most once
 * a second, with a sentence naming what was dropped; NULL: silently). */
typedef struct hd_store_opts {
    const char *url;
    const char *node;
    const char *credentials;
    const char *key_file;
    void (*warn)(void *arg, const char *msg);
    void *warn_arg;
} hd_store_opts;
int hd_store_open_opts(uv_loop_t *loop, const hd_store_opts *o, hd_store **out, char *err, size_t errlen);
/* Reads and checks a credentials file as hd_store_open_opts would: 0 with
 * user ("" for the default user) and pass filled, or -1 with err saying what
 * is wrong (missing, not a regular file, readable or writable by group or
 * others, owned by another user, empty, too long). */
int hd_store_check_credentials(const char *path, char *user, size_t userlen, char *pass, size_t passlen, char *err,
                               size_t errlen);
/* Reads and checks a key file as hd_store_open_opts would: 0, or -1 with
 * err saying what is wrong (the credentials file's checks, and a key of 16
 * to 256 bytes). key may be NULL (check only). */
int hd_store_check_key(const char *path, unsigned char *key, size_t keycap, size_t *keylen, char *err, size_t errlen);
/* 1 when this store signs and checks its messages (a key), else 0. */
int hd_store_signed(const hd_store *s);
/* The last AUTH refusal ("" : none since the last successful AUTH). */
const char *hd_store_auth_error(const hd_store *s);
/* Checks url with hd_store_open's parser (nothing connects): 0, or -1 with
 * err saying what is wrong (a user without a password, port out of 1..65535, a database
 * number, no host). heapd --check-config uses it. */
int hd_store_check_url(const char *url, char *err, size_t errlen);
/* Pending collects and force publishes get an error callback ("heapd is
 * stopping"), called before this returns; both connections are closed. The
 * memory is released when the loop has run the handles' close callbacks. */
void hd_store_close(hd_store *s);

/* Why a collect failed: the callback's status (0: it completed). Codes cross
 * the module boundary (and the store, between nodes); the message is for
 * people. */
#define HD_STORE_EFAIL                                                                                                 \
    (-1)                       /* the store: Redis unreachable or refusing, heapd stopping, nodes that                 \
                                  disagree (world size, ranks served twice), out of memory */
#define HD_STORE_ETIMEOUT (-2) /* a rank never arrived; the message names the missing ranks */
#define HD_STORE_EGONE    (-3) /* a node gave up: one of its ranks disconnected or detached */
#define HD_STORE_EASYM    (-4) /* a node gave up: its ranks collected at different allocations */

/* offsets (n of them, sorted ascending) are the intersection; they belong to
 * the store and are valid during the call only. */
typedef void (*hd_store_cb)(void *arg, int status /* 0 ok, <0 an HD_STORE_E* code */,
                            const char *errmsg /* NULL when ok */, const uint64_t *offsets, size_t n);

/* Contribute and wait (asynchronously). One pending collect per (heap,
 * incarnation) at a time. local_ranks: this node's ranks (each < world_size,
 * at least one). offsets: this node's candidates (sorted ascending is
 * cheapest; any order and duplicates are accepted). timeout_ms: the callback
 * comes by then (plus at most HD_STORE_GRACE_MS for the one round trip that
 * decides the timeout in Redis and names the missing ranks). ttl_s: lifetime
 * of the collect's keys (e.g. 10x the timeout). Returns 0 (cb will be called
 * exactly once, never from inside this call) or <0 with err filled (cb never
 * called). */
int hd_store_collect(hd_store *s, const char *heap, const char *incarnation, uint64_t cnum, uint32_t world_size,
                     const uint32_t *local_ranks, size_t nlocal, const uint64_t *offsets, size_t n, uint32_t timeout_ms,
                     uint32_t ttl_s, hd_store_cb cb, void *arg, char *err, size_t errlen);

/* Issue 33 item 5: the most offsets one command carries (a contribution
 * inline, a staged piece, a fetched piece, a result inline): Redis's time
 * per call is bounded by it, whatever the block count. */
#define HD_STORE_PIECE 4096

/* The most a timed-out collect's callback comes after its timeout_ms. */
#define HD_STORE_GRACE_MS 1000

/* This node gives up on a collect (a local rank died): every node waiting in
 * it gets `msg`, and a node contributing later gets it at once; our own
 * pending callback for that collect (if any) is called with msg too (once
 * Redis has recorded the abort; if the collect had already completed in
 * Redis, the callback gets the result instead, like every other node). The
 * keys live for the pending collect's ttl_s, else HD_STORE_ABORT_TTL_S.
 * Returns 0, or <0 (bad arguments, store closing, no memory). */
int hd_store_collect_abort(hd_store *s, const char *heap, const char *incarnation, uint64_t cnum, const char *msg);
/* Same, with the code every node's callback gets (HD_STORE_E*; the plain
 * call gives HD_STORE_EFAIL). */
int hd_store_collect_abort_code(hd_store *s, const char *heap, const char *incarnation, uint64_t cnum, int code,
                                const char *msg);
#define HD_STORE_ABORT_TTL_S 600

/* Counters for benchmarks: commands sent on the command connection, pub/sub
 * messages received. Either pointer may be NULL. */
void hd_store_counters(const hd_store *s, uint64_t *commands, uint64_t *messages);
/* "redis://HOST:PORT" as parsed (the port is always shown). */
const char *hd_store_url(const hd_store *s);
const char *hd_store_node(const hd_store *s);

/* 1 when both connections are up and this node's channels are subscribed
 * (pub/sub messages reach it), else 0. */
int hd_store_ready(const hd_store *s);
/* Starts (re)connecting whichever connection is down, now (a collect does it
 * too). Lets the program resubscribe after a Redis restart without waiting
 * for a collect, so force requests reach this node again. */
void hd_store_connect(hd_store *s);

/* Forced collect across nodes: a request for (heap, incarnation) is
 * broadcast on heapd:force to every subscribed node, the requesting one
 * included; each node's fn is called once per request (from a timer of the
 * store). A node whose subscription is down at that moment misses it
 * (pub/sub does not queue). fn NULL: requests are dropped. */
void hd_store_on_force(hd_store *s, void (*fn)(void *arg, const char *heap, const char *incarnation), void *arg);
/* Publishes once this node is subscribed (so that it gets its own request).
 * Returns 0 when queued, <0 with err filled. Failures after that are not
 * reported; use hd_store_publish_force_cb to learn them. */
int hd_store_publish_force(hd_store *s, const char *heap, const char *incarnation, char *err, size_t errlen);
/* Same; cb gets status 0 and the number of nodes the request reached
 * (PUBLISH's count of subscribers), or <0 and a message (Redis unreachable,
 * not published within timeout_ms, heapd stopping). */
typedef void (*hd_store_force_cb)(void *arg, int status, const char *errmsg, uint64_t receivers);
int hd_store_publish_force_cb(hd_store *s, const char *heap, const char *incarnation, uint32_t timeout_ms,
                              hd_store_force_cb cb, void *arg, char *err, size_t errlen);

#endif
