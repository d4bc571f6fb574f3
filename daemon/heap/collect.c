/* collect.c - the heap wing's collects: local and through the store (see
 * heap.h). Their timeout is timeout.c's. */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "store.h"

/* ---- collect ----------------------------------------------------------------- */

bool hh_multi(const hd_heap *h) { return h->local_size < h->world_size; }

/* Answers every rank waiting in the collect with the error and ends it. */
static void collect_fail_waiting(hd_heap *h, Heapd__ErrCode code, const char *msg)
{
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (k->in_collect) {
            k->in_collect = false;
            if (k->conn && code == HEAPD__ERR_CODE__ERR_ASYMMETRY && hh_poisoned(h))
                hh_poison_reply(h, k->conn, k->collect_id);
            else if (k->conn)
                hd_peer_error(k->conn, k->collect_id, code, "%s", msg);
        }
    }
    h->coll_active = false;
    h->coll_waiting = 0;
    uv_timer_stop(&h->timer);
}

/* The store's code for a failure here, and back. */
/* The failures that cross nodes: heapd's code and the store's (HD_STORE_E*)
 * for each. Any other code goes to the store as HD_STORE_EFAIL, any other
 * store status comes back as ERR_STORE. */
static const struct {
    Heapd__ErrCode code;
    int store;
} store_codes[] = {
    {HEAPD__ERR_CODE__ERR_TIMEOUT, HD_STORE_ETIMEOUT},
    {HEAPD__ERR_CODE__ERR_PEER_GONE, HD_STORE_EGONE},
    {HEAPD__ERR_CODE__ERR_ASYMMETRY, HD_STORE_EASYM},
};
#define N_STORE_CODES (sizeof store_codes / sizeof store_codes[0])

static int store_code_of(Heapd__ErrCode code)
{
    for (size_t i = 0; i < N_STORE_CODES; i++)
        if (store_codes[i].code == code)
            return store_codes[i].store;
    return HD_STORE_EFAIL;
}

static Heapd__ErrCode store_code(int status)
{
    for (size_t i = 0; i < N_STORE_CODES; i++)
        if (store_codes[i].store == status)
            return store_codes[i].code;
    return HEAPD__ERR_CODE__ERR_STORE;
}

/* A collect fails here (timeout, a rank gone, ...). */
void hh_collect_fail(hd_heap *h, Heapd__ErrCode code, const char *msg)
{
    /* Tell the other nodes, unless the failure came from the store. */
    if (hh_multi(h) && h->coll_active && code != HEAPD__ERR_CODE__ERR_STORE && h->reg->store)
        hd_store_collect_abort_code(h->reg->store, h->name, h->inc, h->cnum, store_code_of(code), msg);
    /* If the abort loses the race with completion in the store, every other
     * node applies the result: this one must too (store_collect_cb). */
    if (h->store_wait) {
        h->store_abandoned = true;
        h->abandoned_seq = h->coll_seq;
    }
    h->store_wait = false;
    collect_fail_waiting(h, code, msg);
}

/* The collect at allocation seq is done (here, or on the other nodes with
 * its result applied here): what was owed there is paid. */
static void collect_owed_done(hd_heap *h, uint64_t seq)
{
    if (h->nforce && h->force_at[0] == seq) {
        memmove(h->force_at, h->force_at + 1, (h->nforce - 1) * sizeof h->force_at[0]);
        h->nforce--;
    }
    if (h->collect_at == seq) {
        h->collect_at = UINT64_MAX;
        h->forced = false;
    }
}

/* Issue 28: a collect's blocks go to the replicas up to this many. */
#define LOCAL_OPS_MAX 262144u

/* Issue 28: the collect at coll_seq that reclaimed offsets[0..n), as the
 * replicas apply it (asked: the allocator asked for it, not an operator). */
static hd_op_out collect_op(const hd_heap *h, const uint64_t *offsets, size_t n)
{
    return (hd_op_out){.at = h->coll_seq,
                       .collect = true,
                       .asked = h->collect_at == h->coll_seq && !h->forced,
                       .offsets = offsets,
                       .n = n};
}

static void collect_reply_all(hd_heap *h, uint64_t blocks, uint64_t bytes, const hd_op_out *op)
{
    hd_collect_out o = {.blocks = blocks, .op = op && op->n <= LOCAL_OPS_MAX ? op : NULL};
    o.omitted = op && op->n > LOCAL_OPS_MAX;
    o.bytes = bytes;
    collect_owed_done(h, h->coll_seq);
    hd_hist_observe(&h->coll_wait, uv_hrtime() - h->coll_start_ns);
    ha_stats st;
    ha_get_stats(h->core, &st);
    char b1[32];
    hd_debug("heap \"%s\": collect at allocation %llu reclaimed %llu blocks (%s)", h->name,
             (unsigned long long)h->coll_seq, (unsigned long long)blocks, hh_human(bytes, b1, sizeof b1));
    hh_heap_publish(h); /* the page is current before any rank hears back */
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (!k->in_collect)
            continue;
        k->in_collect = false;
        o.collects = st.collects;
        k->conn->out->collect(k->conn, k->collect_id, &o);
    }
    h->coll_active = false;
    h->coll_waiting = 0;
    h->store_wait = false;
    uv_timer_stop(&h->timer);
}

static void store_collect_cb(void *arg, int status, const char *errmsg, const uint64_t *offsets, size_t n)
{
    heap_ref *x = arg;
    hd_heap *h = hh_heap_ref_get(x);
    free(x);
    if (!h)
        return;
    if (!h->store_wait) {
        if (h->store_abandoned && status == 0 && ha_collect_apply(h->core, offsets, n, NULL) == HA_OK) {
            hh_horizon_collected(h, offsets, n);
            hd_warn("heap \"%s\": the collect failed here but completed on the other nodes; its result was "
                    "applied so that offsets stay symmetric",
                    h->name);
            /* and it owes no collect there any more: the other nodes' ranks
             * went on, so a rank here (resumed, issue 29) must not be sent to
             * collect at that allocation again */
            collect_owed_done(h, h->abandoned_seq);
            hh_heap_publish(h);
        }
        h->store_abandoned = false;
        return;
    }
    h->store_wait = false;
    h->store_abandoned = false;
    if (status < 0) {
        Heapd__ErrCode code = store_code(status);
        hd_warn("heap \"%s\": cross-node collect failed: %s", h->name, errmsg ? errmsg : "store error");
        /* Every node got this same answer: nothing to tell the store. */
        collect_fail_waiting(h, code, errmsg ? errmsg : "store error");
        return;
    }
    uint64_t bytes = 0;
    if (ha_collect_apply(h->core, offsets, n, &bytes) != HA_OK) {
        hh_collect_fail(h, HEAPD__ERR_CODE__ERR_STORE,
                        "the store's collect result holds offsets this node did not release: the nodes disagree "
                        "(different heap parameters or allocation sequences?); restart the job");
        return;
    }
    hh_horizon_collected(h, offsets, n);
    hd_op_out op = collect_op(h, offsets, n); /* issue 28: the same list on every node */
    collect_reply_all(h, n, bytes, h->local_every ? &op : NULL);
}

static void collect_finish(hd_heap *h)
{
    if (!hh_multi(h) && h->local_every) { /* issue 28: the replicas reclaim the same blocks */
        uint64_t *offs = NULL, bytes = 0;
        size_t n = 0;
        if (ha_collect_candidates(h->core, &offs, &n) || ha_collect_apply(h->core, offs, n, &bytes)) {
            free(offs);
            hh_collect_fail(h, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory for the collect");
            return;
        }
        hh_horizon_collected(h, offs, n);
        hd_op_out op = collect_op(h, offs, n);
        collect_reply_all(h, n, bytes, &op);
        free(offs);
        return;
    }
    if (!hh_multi(h)) {
        uint64_t blocks = 0, bytes = 0;
        ha_collect(h->core, &blocks, &bytes);
        collect_reply_all(h, blocks, bytes, NULL);
        return;
    }
    char err[512];
    uv_timer_stop(&h->timer);
    h->store_wait = true;
    int rc = hh_store_post(h, h->inc, h->cnum, store_collect_cb, err, sizeof err);
    if (rc < 0) {
        h->store_wait = false;
        hh_collect_fail(h, rc == -2 ? HEAPD__ERR_CODE__ERR_NO_MEMORY : HEAPD__ERR_CODE__ERR_STORE, err);
    }
}

/* The heap's coll_left while a collect is active: rank `rank`'s client
 * left (attach.c's rank_leave), so the collect fails, naming it. */
static void collect_rank_left(hd_heap *h, uint32_t rank, bool clean)
{
    hd_rank *k = &h->ranks[rank];
    if (k->in_collect) {
        k->in_collect = false;
        h->coll_waiting--;
    }
    char msg[512];
    snprintf(msg, sizeof msg, "collect on heap \"%s\" failed: rank %u (pid %ld) %s while the others waited", h->name,
             rank, (long)k->pid, clean ? "detached" : "disconnected");
    hh_collect_fail(h, HEAPD__ERR_CODE__ERR_PEER_GONE, msg);
}

void hd_heap_collect(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Collect *m)
{
    (void)r;
    hd_binding *b = hd_peer_binding(c);
    hd_heap *h = hh_formed_heap(c, id, "collect");
    if (!h)
        return;
    if (hh_poison_check(h, c, id))
        return;
    hd_rank *k = &h->ranks[b->rank];
    if (k->in_collect) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "rank %u is already waiting in a collect", b->rank);
        return;
    }
    if (m->seq != k->next_seq) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL,
                      "collect at allocation %llu, but rank %u is at allocation %llu", (unsigned long long)m->seq,
                      b->rank, (unsigned long long)k->next_seq);
        return;
    }
    char gone[512];
    if (hh_unconnected_rank(h, "collect", "restart the job", gone, sizeof gone)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PEER_GONE, "%s", gone);
        if (h->coll_active)
            hh_collect_fail(h, HEAPD__ERR_CODE__ERR_PEER_GONE, gone);
        return;
    }
    if (h->coll_active && m->seq != h->coll_seq) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "asymmetric collect on heap \"%s\": rank %u collects at allocation %llu but the collect in "
                 "progress is at %llu; every rank must collect at the same point of its allocation sequence",
                 h->name, b->rank, (unsigned long long)m->seq, (unsigned long long)h->coll_seq);
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_ASYMMETRY, "%s", msg);
        hh_collect_fail(h, HEAPD__ERR_CODE__ERR_ASYMMETRY, msg);
        return;
    }
    if (!h->coll_active) {
        h->coll_active = true;
        h->coll_left = collect_rank_left;
        h->coll_fail = hh_collect_fail;
        h->coll_start_ns = uv_hrtime();
        h->coll_seq = m->seq;
        h->coll_waiting = 0;
        /* Collect number: the allocation number and how many collects
         * started there before: the same on every node. */
        if (h->cnum_seq != m->seq || !h->cnum_sub) {
            h->cnum_seq = m->seq;
            h->cnum_sub = 0;
        }
        h->cnum = (m->seq << 16) | (h->cnum_sub++ & 0xffff);
        hh_arm_timer(h, false);
    }
    k->in_collect = true;
    k->collect_id = id;
    k->stream_waiting = m->stream_waiting;
    k->dev_waits_avoided = m->device_waits_avoided;
    h->coll_waiting++;
    if (h->coll_waiting == h->local_size)
        collect_finish(h);
}
