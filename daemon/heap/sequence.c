/* sequence.c - the heap wing's allocation sequence: the decision log,
 * alloc, free and growth (see heap.h). */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "wire.h" /* HW_ALLOC_FREES_MAX: a limit of the protocol */

static int apply_frees(hd_heap *h, hd_peer *c, uint64_t id, const uint64_t *offsets, size_t n);

/* ---- alloc ------------------------------------------------------------------- */

static void trim_log(hd_heap *h)
{
    uint64_t min = h->decided;
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].conn && h->ranks[q].next_seq < min)
            min = h->ranks[q].next_seq;
    if (min <= h->log_base)
        return;
    size_t drop = (size_t)(min - h->log_base);
    memmove(h->log, h->log + drop, (h->nlog - drop) * sizeof *h->log);
    h->nlog -= drop;
    h->log_base = min;
}

/* 0 if a growth by `chunks` per rank (`top` of them extending the extent,
 * the others refilling holes) fits the quotas and the fd limit, its spares
 * counted as held and only the chunks it creates (hh_spare_fresh) as
 * added; else -1 with err. */
static int grow_fits(hd_heap *h, const ha_stats *st, uint32_t chunks, uint32_t top, char *err, size_t errlen)
{
    uint64_t fresh = hh_spare_fresh(h, chunks);
    uint64_t grown = st->mapped + (uint64_t)top * h->ap.chunk_size;
    return hh_quota_check(h->reg, h->name, h->owner, hh_backed(st) * h->local_size + hh_spare_bytes(h),
                          fresh * h->ap.chunk_size, ha_meta_bytes(&h->ap, grown) - ha_meta_bytes(&h->ap, st->mapped),
                          err, errlen) ||
                   hh_chunk_fds_check(h->reg, h->owner, fresh, err, errlen)
               ? -1
               : 0;
}

/* ha_grow_plan's indices. */
struct grow_plan {
    uint32_t *idx;
    uint32_t n;
};

static void plan_note(void *data, uint32_t i)
{
    struct grow_plan *g = data;
    g->idx[g->n++] = i;
}

/* Issue 30: rank k's holes idx[0..n) get chunks again (its spares first).
 * 0, or -1 with err (the chunks made stay: the caller releases them). */
static int refill_holes(hd_heap *h, hd_rank *k, const uint32_t *idx, uint32_t n, char *err, size_t errlen)
{
    for (uint32_t j = 0; j < n; j++) {
        hb_chunk *c = &k->chunks[idx[j]];
        if (k->nspare) { /* issue 27: a spare after the chunks fills it */
            hb_chunk *s = &k->chunks[k->nchunks + --k->nspare];
            *c = *s;
            *s = (hb_chunk){.fd = -1, .device = -1};
            continue;
        }
        int rc = hb_chunk_create(h->reg->be, k->device, h->ap.chunk_size, c, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* A failed growth: every rank's chunks as they were (holes absent again,
 * the top's chunks and the spares dropped). */
static void grow_undo(hd_heap *h, uint32_t have, const uint32_t *idx, uint32_t nholes)
{
    for (uint32_t p = 0; p < h->world_size; p++) {
        if (!h->ranks[p].joined)
            continue;
        for (uint32_t j = 0; j < nholes; j++)
            hb_chunk_release(h->reg->be, &h->ranks[p].chunks[idx[j]]);
        hh_rank_trim_chunks(h, &h->ranks[p], have);
    }
}

/* Returns 0, -1 (backend failure) or -2 (quota), with err filled. Issue 27:
 * each rank's spares serve first (hh_rank_add_chunks), and yield to the
 * quotas before a refusal; the refill follows (after the reply). Issue 30:
 * the core's holes come first (ha_grow_plan), at their indices; each
 * client is sent the chunks again from the lowest one on. */
static int grow(hd_heap *h, uint32_t chunks, char *err, size_t errlen)
{
    ha_stats st;
    ha_get_stats(h->core, &st);
    uint32_t have = hh_heap_chunks(h, st.mapped);
    uint64_t t0 = uv_hrtime();
    struct grow_plan g = {malloc(chunks * sizeof *g.idx), 0};
    if (!g.idx || ha_grow_plan(h->core, chunks, plan_note, &g)) {
        free(g.idx);
        snprintf(err, errlen, "the allocator refused to grow by %u chunks (out of memory or va_size)", chunks);
        return -1;
    }
    uint32_t nholes = 0;
    while (nholes < g.n && g.idx[nholes] < have)
        nholes++;
    int rc = 0;
    if (grow_fits(h, &st, chunks, chunks - nholes, err, errlen) &&
        (!hh_spare_yield(h->reg, h->owner, h, chunks) || grow_fits(h, &st, chunks, chunks - nholes, err, errlen)))
        rc = -2;
    for (uint32_t q = 0; !rc && q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (k->joined && (refill_holes(h, k, g.idx, nholes, err, errlen) ||
                          hh_rank_add_chunks(h, k, have + chunks - nholes, err, errlen)))
            rc = -1;
    }
    if (!rc && ha_grow(h->core, chunks)) {
        snprintf(err, errlen, "the allocator refused to grow by %u chunks", chunks);
        rc = -1;
    }
    if (rc == -1)
        grow_undo(h, have, g.idx, nholes);
    for (uint32_t q = 0; !rc && nholes && q < h->world_size; q++)
        if (h->ranks[q].known_chunks > g.idx[0])
            h->ranks[q].known_chunks = g.idx[0]; /* the refilled holes go out again */
    free(g.idx);
    if (rc)
        return rc;
    char b1[32], b2[32];
    hd_info("heap \"%s\" grew from %s to %s per rank (%u chunk%s on each of %u ranks, %u of them into holes)", h->name,
            hh_human(hh_backed(&st), b1, sizeof b1),
            hh_human(hh_backed(&st) + (uint64_t)chunks * h->ap.chunk_size, b2, sizeof b2), chunks,
            chunks == 1 ? "" : "s", h->local_size, nholes);
    hd_hist_observe(&h->growth, uv_hrtime() - t0);
    hh_spare_kick(h);
    return 0;
}

/* Allocation seq waits for a collect, or (trim: issue 30) a trim. Issue
 * 28: with the round applied at seq, if the rank has not had it. */
static void send_needed(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, bool trim)
{
    hd_alloc_out ar = {0};
    hd_op_out op;
    ar.seq = seq;
    ar.collect_needed = !trim;
    ar.trim_needed = trim;
    ar.op = hh_local_round(h, &h->ranks[hd_peer_binding(c)->rank], seq, &op);
    c->out->alloc(c, id, &ar);
}

/* Holds an allocation while a cross-node forced collect agrees on its
 * point (force.c replays it). */
static void hold_alloc(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, const char *name)
{
    if (h->nheld == h->capheld) {
        size_t nc = h->capheld ? h->capheld * 2 : 8;
        struct held_alloc *nh = realloc(h->held, nc * sizeof *nh);
        if (!nh) {
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
            return;
        }
        h->held = nh;
        h->capheld = nc;
    }
    struct held_alloc *x = &h->held[h->nheld++];
    *x = (struct held_alloc){c, id, seq, size, ""};
    if (name)
        snprintf(x->name, sizeof x->name, "%s", name);
}

/* The owner's quota_uid charged for the bookkeeping decision `seq` adds
 * before it is made: the log doubling to `ncap` entries and the block
 * records' growth (the core's ha_block_bytes and the wing's block table,
 * with the name). Returns 0, or -1 once the peer got ERR_QUOTA naming the
 * figures. */
static int charge_decision(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, size_t ncap,
                           const char *name)
{
    uint64_t log_add = (uint64_t)(ncap - h->caplog) * sizeof *h->log;
    uint64_t tab_add = ha_block_bytes(h->core, 1) - ha_block_bytes(h->core, 0) + hh_blocks_add_bytes(h, name);
    char why[1024];
#define FITS() !hh_quota_check(h->reg, h->name, h->owner, 0, 0, log_add + tab_add, why, sizeof why)
    if ((!log_add && !tab_add) || FITS() || (hh_spare_yield(h->reg, h->owner, NULL, 0) && FITS()))
        return 0; /* issue 27: the uid's spares yield first */
#undef FITS
    char b1[32], b2[32], logmsg[160] = "";
    if (log_add)
        snprintf(logmsg, sizeof logmsg,
                 "%sthe decision log by %s, which keeps the %llu decisions the slowest rank has not made",
                 tab_add ? " and " : "", hh_human(log_add, b2, sizeof b2),
                 (unsigned long long)(h->decided - h->log_base));
    hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_QUOTA,
                  "allocation %llu of %llu bytes on heap \"%s\" would grow %s%s%s; %s", (unsigned long long)seq,
                  (unsigned long long)size, h->name, tab_add ? "the block records by " : "",
                  tab_add ? hh_human(tab_add, b1, sizeof b1) : "", logmsg, why);
    return -1;
}

/* Room for one more decision, its bookkeeping charged (charge_decision).
 * Returns 0, or -1 once the peer got the error. */
static int log_reserve(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, const char *name)
{
    if (h->nlog == h->caplog && h->nlog >= HD_LOG_TRIM)
        trim_log(h);
    size_t nc = h->nlog < h->caplog ? h->caplog : h->caplog ? h->caplog * 2 : 64;
    if (charge_decision(h, c, id, seq, size, nc, name))
        return -1;
    if (nc > h->caplog) {
        hd_decision *nl = realloc(h->log, nc * sizeof *nl);
        if (!nl) {
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
            return -1;
        }
        h->log = nl;
        h->caplog = nc;
    }
    return 0;
}

/* The allocator core could not place allocation seq (rc: HA_EVA or worse). */
static void alloc_failed(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, int rc)
{
    if (rc == HA_EVA) {
        ha_stats st;
        ha_get_stats(h->core, &st);
        char b1[32], b2[32], b3[32];
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_VA_EXHAUSTED,
                      "allocation %llu of %llu bytes does not fit: heap \"%s\" has %s mapped, %s live, "
                      "va_size %s; free memory or attach with a larger va_size",
                      (unsigned long long)seq, (unsigned long long)size, h->name, hh_human(st.mapped, b1, sizeof b1),
                      hh_human(st.live_bytes, b2, sizeof b2), hh_human(h->ap.va_size, b3, sizeof b3));
        return;
    }
    hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "allocation %llu failed: %s", (unsigned long long)seq,
                  ha_strerror(rc));
}

/* Issue 28: rank `rank`'s replica decided allocation seq (size bytes) at
 * `said`, which heapd's core placed at `decided` (UINT64_MAX: it needs a
 * step there, why): the heap is poisoned; the peer, and a collect in
 * progress, get it. */
static void poison_replica(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, uint64_t said,
                           uint64_t decided, const char *why)
{
    hh_poison_replica(h, seq, hd_peer_binding(c)->rank, size, said, decided, why);
    h->local_bad++;
    hh_poison_reply(h, c, id);
    if (h->coll_active)
        h->coll_fail(h, HEAPD__ERR_CODE__ERR_ASYMMETRY, h->poison_msg);
}

/* Decides allocation `seq` (the next one) and logs it. Returns the
 * decision, or NULL once the peer got its answer (collect needed, error).
 * Issue 28: replica (a rank's replica decided it at that offset): no step
 * may be needed, else the heap is poisoned. */
static const hd_decision *decide(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, uint32_t rank,
                                 const char *name, const uint64_t *replica)
{
    if (log_reserve(h, c, id, seq, size, name))
        return NULL;
    ha_alloc_result res;
    char err[1024];
    for (;;) {
        int rc = ha_alloc(h->core, size, &res);
        if (rc == HA_OK)
            break;
        if (replica) {
            snprintf(err, sizeof err, "answers \"%s\" there", ha_strerror(rc));
            poison_replica(h, c, id, seq, size, *replica, UINT64_MAX, err);
            return NULL;
        }
        if (rc == HA_NEED_COLLECT || rc == HA_NEED_TRIM) { /* issue 30: trim_threshold reached */
            *(rc == HA_NEED_TRIM ? &h->trim_at : &h->collect_at) = seq;
            send_needed(h, c, id, seq, rc == HA_NEED_TRIM);
            return NULL;
        }
        if (rc == HA_NEED_GROW) {
            int g = grow(h, res.grow_chunks, err, sizeof err);
            if (g == -2) {
                hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_QUOTA, "allocation %llu of %llu bytes: %s",
                              (unsigned long long)seq, (unsigned long long)size, err);
                return NULL;
            }
            if (g) {
                hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY,
                              "allocation %llu of %llu bytes needs the heap to grow by %u chunk(s), which failed: %s",
                              (unsigned long long)seq, (unsigned long long)size, res.grow_chunks, err);
                return NULL;
            }
            continue;
        }
        alloc_failed(h, c, id, seq, size, rc);
        return NULL;
    }
    ha_stats st;
    ha_get_stats(h->core, &st);
    hd_decision *nd = &h->log[h->nlog++];
    nd->size = size;
    nd->offset = res.offset;
    nd->block_size = res.block_size;
    nd->mapped = st.mapped;
    nd->rank = rank;
    nd->name_hash = hh_name_hash(name);
    if (hh_blocks_put(h, seq, res.offset, size, name))
        hd_warn("heap \"%s\": out of memory recording block %llu: it is missing from live sets", h->name,
                (unsigned long long)seq);
    h->decided++;
    if (!replica) /* issue 28: once for a request's records (replica_decided) */
        hh_heap_publish(h);
    return nd;
}

/* Answers allocation `seq` of rank k with decision d and the chunks it has
 * not seen. */
static void send_alloc(hd_heap *h, hd_rank *k, hd_peer *c, uint64_t id, uint64_t seq, const hd_decision *d)
{
    /* Issue 30: a decision made before a trim may name a larger extent
     * than the chunks there are now; its block lies below (a trim takes
     * only chunks without a block), the chunks above come with a growth. */
    uint32_t upto = hh_heap_chunks(h, d->mapped);
    if (upto > k->nchunks)
        upto = k->nchunks;
    chunk_msg cm = {0};
    if (upto > k->known_chunks && hh_chunk_msg_build(h, k->known_chunks, upto, &cm)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY,
                      "heapd could not duplicate chunk fds (out of fds or memory); raise heapd's fd limit");
        return;
    }
    hd_alloc_out ar = {0};
    ar.seq = seq;
    ar.offset = d->offset;
    ar.block_size = d->block_size;
    ar.mapped = (uint64_t)upto * h->ap.chunk_size < d->mapped ? (uint64_t)upto * h->ap.chunk_size : d->mapped;
    ar.nchunks = cm.n;
    ar.new_chunks = cm.refs;
    ar.fds = cm.fds;
    hd_op_out op;
    ar.op = hh_local_round(h, k, seq, &op); /* issue 28 */
    if (upto > k->known_chunks)
        k->known_chunks = upto;
    k->next_seq++;
    c->out->alloc(c, id, &ar);
    hh_chunk_msg_free(&cm, false);
}

/* The peer's rank asked for `size` bytes as allocation seq, decided as d:
 * the heap is poisoned; the peer, and a collect in progress, get it. */
static void poison(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, const hd_decision *d, uint64_t size)
{
    hh_poison_set(h, seq, d->rank, d->size, hd_peer_binding(c)->rank, size);
    hh_poison_reply(h, c, id);
    if (h->coll_active)
        h->coll_fail(h, HEAPD__ERR_CODE__ERR_ASYMMETRY, h->poison_msg);
}

/* Issue 29: the peer's rank gave allocation seq (decided as d) another
 * name than the rank that decided it: ERR_ASYMMETRY naming both, the heap
 * not poisoned and the allocation not consumed. Returns true if so. */
static bool name_differs(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, const hd_decision *d, uint64_t size,
                         const char *name)
{
    uint32_t nh = hh_name_hash(name);
    const hh_block *e = nh || d->name_hash ? hh_blocks_get(h, d->offset) : NULL;
    const char *first = e && e->seq == seq ? e->name : NULL;
    if (nh == d->name_hash && (!nh || !first || !strcmp(first, name)))
        return false;
    uint32_t rank = hd_peer_binding(c)->rank;
    hd_asym_out a = {.n = seq, .nranks = HD_ASYM_RANKS, .with_names = true};
    a.ranks[0] = d->rank;
    a.sizes[0] = d->size;
    a.names[0] = d->name_hash ? (first ? first : "(gone)") : NULL;
    a.ranks[1] = rank;
    a.sizes[1] = size;
    a.names[1] = nh ? name : NULL;
    char msg[1200], n0[300], n1[300];
    snprintf(n0, sizeof n0, a.names[0] ? "\"%s\"" : "no name", a.names[0] ? a.names[0] : "");
    snprintf(n1, sizeof n1, nh ? "\"%s\"" : "no name", nh ? name : "");
    snprintf(msg, sizeof msg,
             "asymmetric allocation name at allocation %llu on heap \"%s\": rank %u gave it %s, rank %u %s; every "
             "rank must give its n-th allocation the same name (the heap is not poisoned: ask again with %s)",
             (unsigned long long)seq, h->name, rank, n1, d->rank, n0, n0);
    c->out->error(c, id, HEAPD__ERR_CODE__ERR_ASYMMETRY, msg, &a);
    return true;
}

void hh_heap_replay_held(hd_heap *h)
{
    size_t n = h->nheld;
    struct held_alloc *held = h->held;
    h->held = NULL;
    h->nheld = h->capheld = 0;
    heap_ref *x = hh_heap_ref_new(h);
    for (size_t i = 0; i < n; i++) {
        if (x && !hh_heap_ref_get(x))
            break; /* the heap went away while replaying */
        hh_heap_alloc_seq(h, held[i].conn, held[i].id, held[i].seq, held[i].size, held[i].name);
    }
    free(held);
    free(x);
}

/* Allocation `seq` of `size` bytes, named `name` (NULL or "": none), by the
 * peer's rank (an Alloc, or one held during a forced collect's agreement). */
void hh_heap_alloc_seq(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, const char *name)
{
    hd_binding *b = hd_peer_binding(c);
    hd_rank *k = &h->ranks[b->rank];
    if (hh_poison_check(h, c, id))
        return;
    if (seq != k->next_seq) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "allocation number %llu out of order: rank %u is at %llu",
                      (unsigned long long)seq, b->rank, (unsigned long long)k->next_seq);
        return;
    }
    if (size == 0) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "allocation %llu: size 0 is not allowed",
                      (unsigned long long)seq);
        return;
    }
    if (size > h->ap.va_size) {
        char b1[32];
        hd_peer_error(
            c, id, HEAPD__ERR_CODE__ERR_VA_EXHAUSTED,
            "allocation %llu of %llu bytes is larger than the heap's va_size (%s); attach with a larger va_size",
            (unsigned long long)seq, (unsigned long long)size, hh_human(h->ap.va_size, b1, sizeof b1));
        return;
    }
    const hd_decision *d;
    if (seq < h->decided) {
        d = &h->log[seq - h->log_base];
        if (d->size != size) {
            poison(h, c, id, seq, d, size);
            return;
        }
        if ((d->name_hash || (name && name[0])) && name_differs(h, c, id, seq, d, size, name))
            return;
    } else {
        if (h->collect_at == seq || h->trim_at == seq || (h->nforce && h->force_at[0] == seq)) {
            send_needed(h, c, id, seq, h->trim_at == seq);
            return;
        }
        if (h->frozen) {
            /* A cross-node forced collect is agreeing on its allocation
             * number: decide nothing new until it has. */
            hold_alloc(h, c, id, seq, size, name);
            return;
        }
        char err[800];
        int g = hh_horizon_gate(h, seq, err, sizeof err);
        if (g) { /* issue 27: the nodes' reclaim at this horizon */
            if (g > 0) {
                h->hz_replay = hh_heap_replay_held;
                hold_alloc(h, c, id, seq, size, name);
            } else {
                hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STORE, "%s", err);
            }
            return;
        }
        d = decide(h, c, id, seq, size, b->rank, name, NULL);
        if (!d)
            return;
    }
    send_alloc(h, k, c, id, seq, d);
}

/* Issue 28: allocation seq of `size` bytes, decided by rank b's replica at
 * offset off, applied and checked. 0, or -1 once the peer got the error
 * (ERR_ASYMMETRY: the heap poisoned). */
static int replica_one(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, uint64_t off)
{
    hd_binding *b = hd_peer_binding(c);
    hd_rank *k = &h->ranks[b->rank];
    if (size == 0 || size > h->ap.va_size || seq % h->local_every == 0) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "decided allocation %llu of %llu bytes: %s",
                      (unsigned long long)seq, (unsigned long long)size,
                      size == 0 || size > h->ap.va_size ? "no replica decides that size"
                                                        : "a multiple of local_every is never decided by a replica");
        return -1;
    }
    const hd_decision *d;
    if (seq < h->decided) {
        d = &h->log[seq - h->log_base];
        if (d->size != size) {
            poison(h, c, id, seq, d, size);
            return -1;
        }
    } else {
        /* (While the nodes agree on a forced collect, frozen, a record still
         * goes: the point they agree on is a horizon, which no record is.) */
        const char *why = h->collect_at == seq || (h->nforce && h->force_at[0] == seq) ? "owes a collect there"
                          : h->trim_at == seq                                          ? "owes a trim there"
                                                                                       : NULL;
        if (why) {
            poison_replica(h, c, id, seq, size, off, UINT64_MAX, why);
            return -1;
        }
        if (!(d = decide(h, c, id, seq, size, b->rank, NULL, &off)))
            return -1;
    }
    if (d->offset != off) {
        poison_replica(h, c, id, seq, size, off, d->offset, NULL);
        return -1;
    }
    k->next_seq++;
    h->local_records++;
    return 0;
}

/* Issue 28: the allocations from, from + 1, ... that the peer's rank
 * decided with its replica (v: size, offset pairs; nv values), before
 * anything else of the request. Those below the rank's next allocation
 * number were applied before (a request sent again). 0, or -1 once the peer
 * got the error. */
static int replica_decided(hd_heap *h, hd_peer *c, uint64_t id, uint64_t from, const uint64_t *v, size_t nv)
{
    if (!nv)
        return 0;
    hd_rank *k = &h->ranks[hd_peer_binding(c)->rank];
    if (hh_poison_check(h, c, id))
        return -1;
    const char *bad = !h->local_every      ? "heapd decides every allocation of this heap (local_every 0)"
                      : from > k->next_seq ? "they start past the rank's next allocation number (a gap)"
                      : nv % 2 || nv / 2 > HW_DECIDED_MAX ? "not (size, offset) pairs, or more than the limit"
                                                          : NULL;
    if (bad) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL,
                      "%zu values of allocations decided by a replica from %llu on heap \"%s\" (limit %u pairs): %s",
                      nv, (unsigned long long)from, h->name, HW_DECIDED_MAX, bad);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < nv / 2 && !rc; i++)
        if (from + i >= k->next_seq)
            rc = replica_one(h, c, id, from + i, v[2 * i], v[2 * i + 1]);
    hh_heap_publish(h);
    return rc;
}

void hd_heap_alloc(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Alloc *m)
{
    (void)r;
    hd_heap *h = hh_formed_heap(c, id, "alloc");
    if (!h)
        return;
    if (replica_decided(h, c, id, m->decided_from, m->decided, m->n_decided))
        return;
    /* Issue 27: the rank's releases first, whatever happens to the
     * allocation (docs/protocol.md: Alloc.frees). */
    if (m->n_frees) {
        if (m->n_frees > HW_ALLOC_FREES_MAX) {
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                          "allocation %llu carries %zu frees, over the limit of %u; send the rest in a Free",
                          (unsigned long long)m->seq, m->n_frees, HW_ALLOC_FREES_MAX);
            return;
        }
        if (hh_poison_check(h, c, id) || apply_frees(h, c, id, m->frees, m->n_frees))
            return;
    }
    /* Issue 30: while a release waits for ranks, the others still allocate. */
    if (hh_released(h)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                      "allocation %llu: heap \"%s\" is released on this node; no allocation until it is restored "
                      "(heapc_restore, heap.restore())",
                      (unsigned long long)m->seq, h->name);
        return;
    }
    if (m->name && m->name[0]) {
        char why[200];
        if (hh_name_check(m->name, why, sizeof why)) {
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "allocation %llu: its name %s",
                          (unsigned long long)m->seq, why);
            return;
        }
    }
    hh_heap_alloc_seq(h, c, id, m->seq, m->size, m->name);
}

/* Rank b's release of offsets[0..n) (a Free, or the frees an Alloc carries:
 * issue 27), all or nothing. Returns 0, or -1 once the peer got the error. */
static int apply_frees(hd_heap *h, hd_peer *c, uint64_t id, const uint64_t *offsets, size_t n)
{
    hd_binding *b = hd_peer_binding(c);
    size_t bad = 0;
    int rc = ha_free_batch(h->core, h->ranks[b->rank].lidx, offsets, n, &bad);
    if (rc == HA_ENOTHELD) {
        size_t j = 0; /* all or nothing: a repeat, or not held */
        while (j < bad && offsets[j] != offsets[bad])
            j++;
        if (j < bad)
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NOT_HELD,
                          "free of offset %llu: given twice in one batch (double free); none of the batch was freed",
                          (unsigned long long)offsets[bad]);
        else
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NOT_HELD,
                          "free of offset %llu: rank %u holds no block there (never allocated, or already freed); "
                          "none of the %zu offsets in this batch were freed",
                          (unsigned long long)offsets[bad], b->rank, n);
        return -1;
    }
    if (rc != HA_OK) { /* HA_ENOMEM: the pending list could not grow */
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
        return -1;
    }
    hh_heap_publish(h);
    return 0;
}

void hd_heap_free(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Free *m)
{
    (void)r;
    hd_heap *h = hh_formed_heap(c, id, "free");
    if (!h)
        return;
    if (hh_poison_check(h, c, id) || replica_decided(h, c, id, m->decided_from, m->decided, m->n_decided))
        return;
    if (m->n_offsets && apply_frees(h, c, id, m->offsets, m->n_offsets))
        return;
    c->out->free(c, id, (uint32_t)m->n_offsets);
}
