/* heapc_stats.c - libheapc: lock-free lookups, the status page, counters,
 * heapd's statistics and forced collects (the admin requests). */
#include "heapc_int.h"

/* ---- lock-free lookups -------------------------------------------------- */

void *heapc_peer_ptr(heapc *c, uint32_t rank, uint64_t offset)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    if (!v || rank >= v->world || !v->bases[rank])
        return NULL;
    if (offset >= atomic_load_explicit(&c->mapped, memory_order_acquire))
        return NULL;
    return v->bases[rank] + offset;
}

void *heapc_ptr(heapc *c, uint64_t offset)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    return v ? heapc_peer_ptr(c, v->rank, offset) : NULL;
}

void *heapc_base(heapc *c, uint32_t rank)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    if (!v || rank >= v->world)
        return NULL;
    return v->bases[rank];
}

uint64_t heapc_mapped(heapc *c) { return atomic_load_explicit(&c->mapped, memory_order_acquire); }

const char *heapc_heap_name(heapc *c) { return c && c->attached && c->heap ? c->heap : ""; }

uint32_t heapc_rank(heapc *c)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    return v ? v->rank : UINT32_MAX;
}

uint32_t heapc_world_size(heapc *c)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    return v ? v->world : 0;
}

size_t heapc_local_ranks(heapc *c, uint32_t *out, size_t max)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    if (!v)
        return 0;
    for (size_t i = 0; i < v->nlocal && i < max; i++)
        out[i] = v->local[i];
    return v->nlocal;
}

uint64_t heapc_next_seq(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t s = c->next_seq;
    pthread_mutex_unlock(&c->mu);
    return s;
}

int heapc_status_fd(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int fd = c->status_fd;
    pthread_mutex_unlock(&c->mu);
    return fd;
}

#define GET(field) out->field = __atomic_load_n(&p->field, __ATOMIC_RELAXED)

int heapc_status(heapc *c, heapc_status_t *out)
{
    const hs_page *p = atomic_load_explicit(&c->status_page, memory_order_acquire);
    if (!p)
        return HEAPC_ESTATE;
    /* Bounded: a heapd that died (or stopped) mid-write leaves seq odd. */
    for (unsigned tries = 0;; tries++) {
        if (tries >= HEAPC_STATUS_TRIES)
            return HEAPC_EBUSY;
        if (tries >= 64)
            sched_yield(); /* heapd may be descheduled mid-write */
        uint64_t s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1)
            continue;
        GET(mapped);
        GET(live);
        GET(released);
        GET(free);
        GET(rank_held);
        GET(rank_released);
        GET(collects);
        GET(growths);
        GET(allocs);
        GET(epoch);
        GET(device_free);
        GET(device_total);
        GET(device_sampled_ns);
        GET(updates);
        GET(collects_skipped);
        GET(stream_waiting);
        GET(device_waits_avoided);
        GET(state);
        GET(resident);
        GET(releases);
        GET(restores);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&p->seq, __ATOMIC_RELAXED) == s1)
            return HEAPC_OK;
    }
}

#undef GET

int heapc_get_counters(heapc *c, heapc_counters *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->ctr;
    out->queued_frees = c->fq_n;
    out->stream_waiting = c->fence_on ? c->fence.held : 0;
    out->stream_markers = c->ctr.stream_markers + (c->fence_on ? c->fence.markers : 0);
    out->stream_in_flight = c->fence_on ? hf_queue_early(&c->fence) : 0;
    out->stream_reuse_waits = c->ctr.stream_reuse_waits + (c->fence_on ? c->fence.orders : 0);
    out->local_allocs = c->rep.local; /* issue 28 */
    out->replica_lost = (uint64_t)c->rep.lost;
    int rc = hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- admin -------------------------------------------------------------- */

static void copy_hist(heapc_hist *o, const Heapd__Histogram *g)
{
    if (!g)
        return;
    size_t nb = g->n_bounds < HEAPC_HIST_MAX - 1 ? g->n_bounds : HEAPC_HIST_MAX - 1;
    o->nbounds = nb;
    memcpy(o->bounds, g->bounds, nb * sizeof *o->bounds);
    for (size_t i = 0; i < g->n_counts; i++)
        o->counts[i < nb ? i : nb] += g->counts[i]; /* more buckets than fit: the rest to +Inf */
    o->count = g->count;
    o->sum_seconds = g->sum_seconds;
}

void heapc_stats_free(heapc_daemon_stats *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nheaps; i++) {
        free(s->heaps[i].name);
        free(s->heaps[i].ranks);
    }
    free(s->heaps);
    free(s->version);
    free(s->backend);
    free(s->store);
    free(s);
}

static char *dupstr(const char *s) { return strdup(s ? s : ""); }

/* One heap of heapd's StatsReply into *o; -1 when out of memory. */
static int copy_heap_stats(heapc_heap_stats *o, const Heapd__HeapStats *h)
{
    o->name = dupstr(h->name);
    if (!o->name)
        return -1;
    o->world_size = h->world_size;
    if (h->params) {
        o->params.chunk_size = h->params->chunk_size;
        o->params.initial_size = h->params->initial_size;
        o->params.va_size = h->params->va_size;
        o->params.min_block = h->params->min_block;
        o->params.policy = (heapc_policy)h->params->policy;
        o->params.collect_timeout_ms = h->params->collect_timeout_ms;
        o->params.reclaim = (heapc_reclaim)h->params->reclaim;
        o->params.grow_ahead = h->params->grow_ahead == UINT32_MAX ? -1 : (int32_t)h->params->grow_ahead;
        o->params.trim_threshold = hci_trim_threshold_of(h->params->trim_threshold);
        o->params.extent_bound = h->params->extent_bound;
        o->params.local_every = (int32_t)h->params->local_every; /* issue 28 */
    }
    o->params.persist_s = hci_persist_of(h->persist_s ? h->persist_s : h->params ? h->params->persist_s : 0);
    o->mapped = h->mapped;
    o->live_bytes = h->live_bytes;
    o->released_bytes = h->released_bytes;
    o->free_bytes = h->free_bytes;
    o->collects = h->collects;
    o->collects_skipped = h->collects_skipped;
    o->growths = h->growths;
    o->clients = h->clients;
    o->next_seq = h->next_seq;
    o->epoch = h->epoch;
    o->pending_collect_seq = h->pending_collect_seq;
    o->collect_pending = h->collect_pending;
    o->owner_uid = h->owner_uid;
    o->bookkeeping_bytes = h->bookkeeping_bytes;
    o->persist_s = h->persist_s;
    o->detached_ms = h->detached_ms;
    o->generation = h->generation;
    o->markers = h->markers;
    o->state = (uint32_t)h->state;
    o->resident_bytes = h->resident_bytes;
    o->host_copy_bytes = h->host_copy_bytes;
    o->releases = h->releases;
    o->restores = h->restores;
    o->eager_reclaims = h->eager_reclaims;
    o->spare_bytes = h->spare_bytes; /* issue 27 */
    o->grow_ahead = h->grow_ahead;
    o->trims = h->trims;
    o->trimmed_bytes = h->trimmed_bytes;
    copy_hist(&o->collect_wait, h->collect_wait);
    copy_hist(&o->growth, h->growth);
    o->device_free = h->device_free;
    o->device_total = h->device_total;
    if (h->n_ranks) {
        o->ranks = calloc(h->n_ranks, sizeof *o->ranks);
        if (!o->ranks)
            return -1;
    }
    o->nranks = h->n_ranks;
    for (size_t r = 0; r < h->n_ranks; r++) {
        const Heapd__RankStats *rs = h->ranks[r];
        o->ranks[r].rank = rs->rank;
        o->ranks[r].attached = rs->attached ? 1 : 0;
        o->ranks[r].live_bytes = rs->live_bytes;
        o->ranks[r].released_bytes = rs->released_bytes;
        o->ranks[r].next_seq = rs->next_seq;
        o->ranks[r].pid = rs->pid;
        o->ranks[r].stream_waiting = rs->stream_waiting;
        o->ranks[r].device_waits_avoided = rs->device_waits_avoided;
    }
    return 0;
}

static int stats_locked(heapc *c, const char *heap, heapc_daemon_stats **out)
{
    *out = NULL;
    Heapd__Stats st = HEAPD__STATS__INIT;
    st.heap = (char *)(heap ? heap : "");
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_STATS;
    req.stats = &st;
    Heapd__Frame *rep;
    hw_frame raw;
    int rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_STATS_REPLY, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__StatsReply *sr = rep->stats_reply;
    heapc_daemon_stats *s = calloc(1, sizeof *s);
    if (!s)
        goto oom;
    s->version = dupstr(sr ? sr->version : NULL);
    s->backend = dupstr(sr ? sr->backend : NULL);
    s->clients = sr ? sr->clients : 0;
    s->store = dupstr(sr ? sr->store : NULL);
    s->uptime_ms = sr ? sr->uptime_ms : 0;
    s->store_connected = sr && sr->store_connected;
    s->quota_heap = sr ? sr->quota_heap : 0;
    s->quota_uid = sr ? sr->quota_uid : 0;
    if (!s->version || !s->backend || !s->store)
        goto oom;
    size_t nh = sr ? sr->n_heaps : 0;
    if (nh) {
        s->heaps = calloc(nh, sizeof *s->heaps);
        if (!s->heaps)
            goto oom;
    }
    for (size_t i = 0; i < nh; i++) {
        s->nheaps++;
        if (copy_heap_stats(&s->heaps[i], sr->heaps[i]) != 0)
            goto oom;
    }
    hci_rpc_done(rep, &raw);
    *out = s;
    return HEAPC_OK;
oom:
    hci_rpc_done(rep, &raw);
    heapc_stats_free(s);
    return hci_set_err(c, HEAPC_EOOM, "out of memory decoding heapd's statistics");
}

int heapc_stats(heapc *c, const char *heap, heapc_daemon_stats **out)
{
    pthread_mutex_lock(&c->mu);
    int rc = stats_locked(c, heap, out);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_force_collect(heapc *c, const char *heap, uint64_t *at_seq)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!heap || !*heap) {
        rc = hci_set_err(c, HEAPC_EINVAL, "heapc_force_collect: name the heap to collect");
        goto out;
    }
    Heapd__ForceCollect fc = HEAPD__FORCE_COLLECT__INIT;
    fc.heap = (char *)heap;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_FORCE_COLLECT;
    req.force_collect = &fc;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY, &rep, &raw);
    if (rc == HEAPC_OK) {
        if (at_seq)
            *at_seq = rep->force_collect_reply ? rep->force_collect_reply->at_seq : 0;
        hci_rpc_done(rep, &raw);
        hci_ok(c);
    }
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_drop(heapc *c, const char *heap, uint64_t *released_bytes)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!heap || !*heap) {
        rc = hci_set_err(c, HEAPC_EINVAL, "heapc_drop: name the heap to drop");
        goto out;
    }
    Heapd__Drop dm = HEAPD__DROP__INIT;
    dm.heap = (char *)heap;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_DROP;
    req.drop = &dm;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_DROP_REPLY, &rep, &raw);
    if (rc == HEAPC_OK) {
        if (released_bytes)
            *released_bytes = rep->drop_reply ? rep->drop_reply->released_bytes : 0;
        hci_rpc_done(rep, &raw);
        hci_ok(c);
    }
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}
