/* horizon.c - the heap wing's eager reclaim across nodes (issue 27): the
 * nodes of a heap agree through the store which released blocks every rank
 * of every node released, and reclaim them at the same allocation number,
 * with no collect and no barrier of the ranks. Spares floor (heap_int.h):
 * sequence.c asks it before each new decision and collect.c tells it what
 * collects reclaimed; it reaches sequence.c only through the heap's
 * hz_replay.
 *
 * The rounds. L = hz_every (heapd.conf reclaim_lookahead). When a node
 * decides allocation m*L (m >= 1) it posts round m: the blocks every local
 * rank released (ha_collect_candidates) and its rank list, through
 * hd_store_collect under the incarnation INC#reclaim, number m. The store
 * answers every node alike: the intersection once every rank of the world is
 * covered, or one failure. Before allocation (m+1)*L is decided the node
 * reclaims that intersection (ha_reclaim_apply), less what collects
 * reclaimed since it posted (a block reclaimed by a collect may be decided
 * again at the same offset: the round must not take the new one), and posts
 * round m+1. Every node does the same at the same allocation numbers, so the
 * cores stay identical. A node that reaches (m+1)*L before the answer holds
 * the allocation there (hold_alloc) until it comes: that is the only wait.
 *
 * Failures: a round the store failed alike on every node (a node never came
 * within the heap's timeout: HD_STORE_ETIMEOUT, ...) reclaims nothing and the
 * next round goes on. A failure this node alone may see (Redis unreachable
 * or killed: HD_STORE_EFAIL) leaves it unable to know what the others
 * reclaimed, so it decides nothing past the horizon: every allocation there
 * gets ERR_STORE naming the store and what to do.
 *
 * Issue 28, allocation without a message (local_every = L on a heap of one
 * node): the ranks' replicas decide every allocation but those at multiples
 * of L, which are round trips. Under reclaim eager the same rounds run with
 * hz_every = L, each answered and applied at once with this node's own
 * candidates (no store: nothing to wait for), and each round applied at a
 * horizon is kept (lr) until every rank got it with its reply there
 * (hh_local_round): the replicas reclaim the same blocks at the same
 * allocation number. Runs on the loop thread. */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "store.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void hz_stop(hd_heap *h, uint64_t at, const char *why)
{
    snprintf(h->hz_err, sizeof h->hz_err,
             "heap \"%s\" makes no decision from allocation %llu on, on this node: the cross-node reclaim agreement "
             "(reclaim eager, reclaim_lookahead %u) failed: %s; the nodes may no longer decide alike, so restart the "
             "job (and check the store; reclaim = collect or reclaim_lookahead = 0 in heapd.conf avoids the "
             "agreement)",
             h->name, (unsigned long long)at, h->hz_every, why);
    hd_error("%s", h->hz_err);
}

static void hz_cb(void *arg, int status, const char *errmsg, const uint64_t *offsets, size_t n)
{
    heap_ref *x = arg;
    hd_heap *h = hh_heap_ref_get(x);
    free(x);
    if (!h || !h->hz_busy)
        return;
    h->hz_busy = false;
    uint64_t next = h->hz_at + h->hz_every;
    if (status == 0) {
        h->hz_set = n ? malloc(n * sizeof *h->hz_set) : NULL;
        if (n && !h->hz_set) {
            hz_stop(h, next, "heapd is out of memory for the agreed reclaim");
        } else {
            if (n)
                memcpy(h->hz_set, offsets, n * sizeof *offsets);
            h->hz_nset = n;
            h->hz_done = true;
        }
    } else if (status == HD_STORE_ETIMEOUT || status == HD_STORE_EGONE || status == HD_STORE_EASYM) {
        /* Decided in the store, so every node got it: nothing is reclaimed
         * at this horizon anywhere. */
        hd_warn("heap \"%s\": the reclaim round posted at allocation %llu agreed nothing: %s", h->name,
                (unsigned long long)h->hz_at, errmsg ? errmsg : "store error");
        h->hz_nset = 0;
        h->hz_done = true;
    } else {
        hz_stop(h, next, errmsg ? errmsg : "store error");
    }
    if (h->nheld && h->hz_replay)
        h->hz_replay(h);
}

/* Issue 28: keeps offs[0..n) (taken over), the round applied at `at`, for
 * the replicas; drops the rounds every connected rank has passed. 1 kept,
 * 0 not (out of memory: the ranks' replicas then stop at `at`, their
 * records and heapd's decisions differing there, which poisons the heap). */
static int lr_keep(hd_heap *h, uint64_t at, uint64_t *offs, size_t n)
{
    size_t drop = 0;
    while (drop < h->nlr) {
        bool passed = true;
        for (uint32_t q = 0; q < h->world_size && passed; q++)
            if (h->ranks[q].conn && h->ranks[q].next_seq <= h->lr[drop].at)
                passed = false;
        if (!passed)
            break;
        free(h->lr[drop++].offsets);
    }
    if (drop) { /* (h->lr may still be NULL) */
        memmove(h->lr, h->lr + drop, (h->nlr - drop) * sizeof *h->lr);
        h->nlr -= drop;
    }
    if (h->nlr == h->caplr) {
        size_t nc = h->caplr ? h->caplr * 2 : 8;
        struct hh_lround *nl = realloc(h->lr, nc * sizeof *nl);
        if (!nl)
            return 0;
        h->lr = nl;
        h->caplr = nc;
    }
    h->lr[h->nlr++] = (struct hh_lround){at, offs, n};
    return 1;
}

const hd_op_out *hh_local_round(hd_heap *h, hd_rank *k, uint64_t seq, hd_op_out *op)
{
    if (!h->local_every || k->lr_sent > seq)
        return NULL;
    for (size_t i = h->nlr; i-- > 0;) {
        if (h->lr[i].at == seq) {
            k->lr_sent = seq + 1;
            *op = (hd_op_out){.at = seq, .offsets = h->lr[i].offsets, .n = h->lr[i].n};
            return op;
        }
    }
    return NULL;
}

static int hz_apply(hd_heap *h, uint64_t at);

/* Issue 28: this node's own round at `at`: the blocks every local rank
 * released, reclaimed at once (no other node to agree with). 0, or -1 with
 * hz_err set. */
static int lr_post(hd_heap *h, uint64_t at)
{
    uint64_t *offs = NULL;
    size_t n = 0;
    if (ha_collect_candidates(h->core, &offs, &n) != HA_OK) {
        hz_stop(h, at + h->hz_every, "heapd is out of memory for the reclaim round");
        return -1;
    }
    h->hz_set = offs;
    h->hz_nset = n;
    h->hz_ngone = 0;
    h->hz_done = true;
    return hz_apply(h, at);
}

/* Reclaims the answer of the round in hand, less what collects took since
 * it was posted. 0, or -1 with hz_err set. */
static int hz_apply(hd_heap *h, uint64_t at)
{
    size_t n = 0;
    if (h->hz_ngone > 1)
        qsort(h->hz_gone, h->hz_ngone, sizeof *h->hz_gone, cmp_u64);
    for (size_t i = 0, j = 0; i < h->hz_nset; i++) {
        while (j < h->hz_ngone && h->hz_gone[j] < h->hz_set[i])
            j++;
        if (j < h->hz_ngone && h->hz_gone[j] == h->hz_set[i])
            continue;
        h->hz_set[n++] = h->hz_set[i];
    }
    uint64_t bytes = 0;
    int rc = ha_reclaim_apply(h->core, h->hz_set, n, &bytes);
    if (rc == HA_OK && n && h->local_every && lr_keep(h, at, h->hz_set, n))
        h->hz_set = NULL; /* kept for the replicas */
    free(h->hz_set);
    h->hz_set = NULL;
    h->hz_nset = 0;
    h->hz_ngone = 0;
    h->hz_done = false;
    if (rc != HA_OK) {
        char why[256];
        snprintf(why, sizeof why, "the agreed blocks could not be reclaimed here (%s)", ha_strerror(rc));
        hz_stop(h, at, why);
        return -1;
    }
    h->hz_rounds++;
    if (n) {
        char b1[32];
        hd_debug("heap \"%s\": reclaimed %zu agreed blocks (%s) at allocation %llu", h->name, n,
                 hh_human(bytes, b1, sizeof b1), (unsigned long long)at);
    }
    return 0;
}

int hh_store_post(hd_heap *h, const char *inc, uint64_t cnum, hd_store_cb cb, char *err, size_t errlen)
{
    uint64_t *offs = NULL;
    size_t n = 0;
    uint32_t *lr = calloc(h->world_size, sizeof *lr);
    heap_ref *x = hh_heap_ref_new(h);
    if (!lr || !x || ha_collect_candidates(h->core, &offs, &n) != HA_OK) {
        free(lr);
        free(x);
        snprintf(err, errlen, "heapd is out of memory");
        return -2;
    }
    size_t nl = hh_local_ranks(h, lr);
    int rc = hd_store_collect(h->reg->store, h->name, inc, cnum, h->world_size, lr, nl, offs, n, h->timeout_ms,
                              hh_store_ttl_s(h), cb, x, err, errlen);
    free(lr);
    free(offs);
    if (rc < 0)
        free(x);
    return rc < 0 ? -1 : 0;
}

/* Posts the round of point `at`. 0, or -1 with hz_err set. */
static int hz_post(hd_heap *h, uint64_t at)
{
    if (h->local_every && h->local_size == h->world_size)
        return lr_post(h, at); /* one node: nothing to agree on */
    char err[512], inc[sizeof h->inc + 16];
    snprintf(inc, sizeof inc, "%s#reclaim", h->inc);
    if (hh_store_post(h, inc, at / h->hz_every, hz_cb, err, sizeof err)) {
        hz_stop(h, at + h->hz_every, err);
        return -1;
    }
    h->hz_busy = true;
    return 0;
}

int hh_horizon_gate(hd_heap *h, uint64_t seq, char *err, size_t errlen)
{
    if (!h->hz_every || !seq || seq % h->hz_every || seq == h->hz_at)
        return 0;
    if (h->hz_err[0]) {
        snprintf(err, errlen, "%s", h->hz_err);
        return -1;
    }
    if (h->hz_busy) {
        if (h->hz_wait_at != seq)
            hd_info("heap \"%s\": allocation %llu waits at the horizon for the other nodes' reclaim round %llu",
                    h->name, (unsigned long long)seq, (unsigned long long)(h->hz_at / h->hz_every));
        h->hz_wait_at = seq;
        h->hz_waits++;
        return 1;
    }
    if (!h->reg->store && !h->local_every) {
        hz_stop(h, seq, "this heapd has no store");
        snprintf(err, errlen, "%s", h->hz_err);
        return -1;
    }
    if ((h->hz_done && hz_apply(h, seq)) || hz_post(h, seq)) {
        snprintf(err, errlen, "%s", h->hz_err);
        return -1;
    }
    h->hz_at = seq;
    return 0;
}

void hh_horizon_collected(hd_heap *h, const uint64_t *offsets, size_t n)
{
    if (!h->hz_every || !(h->hz_busy || h->hz_done) || !n)
        return;
    if (h->hz_ngone + n > h->hz_capgone) {
        size_t nc = h->hz_capgone ? h->hz_capgone * 2 : 64;
        while (nc < h->hz_ngone + n)
            nc *= 2;
        uint64_t *g = realloc(h->hz_gone, nc * sizeof *g);
        if (!g) {
            hz_stop(h, h->hz_at + h->hz_every, "heapd is out of memory recording a collect's blocks");
            return;
        }
        h->hz_gone = g;
        h->hz_capgone = nc;
    }
    memcpy(h->hz_gone + h->hz_ngone, offsets, n * sizeof *offsets);
    h->hz_ngone += n;
}
