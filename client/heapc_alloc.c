/* heapc_alloc.c - libheapc: frees (queued, stream-ordered), collect, alloc
 * (issue 28: the replica's decisions, heapc_replica.h). heapc_int.h has the
 * context and its rules. */
#include "heapc_int.h"

/* ---- device sync -------------------------------------------------------- */

/* The user's sync hook before a collect (heapc_set_device_sync). Without
 * one there is no device sync at all (issue 18): blocks freed on a stream
 * wait for their own stream's work (heapc_fence.h). */
static int device_sync(heapc *c)
{
    if (!c->sync_fn)
        return HEAPC_OK;
    int rc = c->sync_fn(c->sync_arg);
    if (rc != 0)
        return hci_set_err(c, HEAPC_ESYNC,
                           "the device-sync hook returned %d before a collect on heap %s; the collect "
                           "was not started: fix the device error, then call heapc_collect again",
                           rc, c->heap ? c->heap : "?");
    return HEAPC_OK;
}

int heapc_set_device_sync(heapc *c, heapc_sync_fn fn, void *arg)
{
    pthread_mutex_lock(&c->mu);
    c->sync_fn = fn;
    c->sync_arg = arg;
    int rc = hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- frees -------------------------------------------------------------- */

/* The first n queued frees leave the queue (n may be 0: a Free that
 * carried only the replica's records, where the queue may not exist). */
static void fq_drop(heapc *c, size_t n)
{
    if (!n)
        return;
    memmove(c->fq, c->fq + n, (c->fq_n - n) * sizeof *c->fq);
    c->fq_n -= n;
}

int hci_flush_locked(heapc *c)
{
    /* Issue 28: the replica's records go first (a Free of no offsets when
     * there are no frees), before a Collect, a Trim or a Detach. */
    while (c->fq_n > 0 || c->rep.nrec > 0) {
        size_t n = c->fq_n < FREE_BATCH_MAX ? c->fq_n : FREE_BATCH_MAX;
        Heapd__Free fr = HEAPD__FREE__INIT;
        fr.n_offsets = n;
        fr.offsets = c->fq;
        hrp_records(&c->rep, &fr.decided_from, &fr.decided, &fr.n_decided);
        Heapd__Frame req = HEAPD__FRAME__INIT;
        req.body_case = HEAPD__FRAME__BODY_FREE;
        req.free = &fr;
        Heapd__Frame *rep;
        hw_frame raw;
        int rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_FREE_REPLY, &rep, &raw);
        if (rc != HEAPC_OK) {
            if (rc != HEAPC_ECONN && rc != HEAPC_ENOREPLY) {
                /* heapd applied none of the batch (docs/protocol.md: Free): drop
                 * it, else every later flush fails the same way. */
                fq_drop(c, n);
                char msg[ERRSTR_LEN];
                snprintf(msg, sizeof msg, "%s", c->errstr);
                hci_set_err(c, rc, "%s (heapd refused a batch of %zu frees; they were dropped)", msg, n);
            }
            return rc;
        }
        hci_rpc_done(rep, &raw);
        hrp_records_done(&c->rep);
        fq_drop(c, n);
        c->ctr.free_batches++;
    }
    return HEAPC_OK;
}

/* Appends offsets to the free queue (all or none). */
static int fq_push(heapc *c, const uint64_t *offs, size_t n)
{
    if (c->fq_n + n > c->fq_cap) {
        size_t ncap = c->fq_cap ? c->fq_cap : 256;
        while (ncap < c->fq_n + n)
            ncap *= 2;
        uint64_t *nq = realloc(c->fq, ncap * sizeof *nq);
        if (!nq)
            return hci_set_err(c, HEAPC_EOOM, "out of memory queueing %zu frees", n);
        c->fq = nq;
        c->fq_cap = ncap;
    }
    memcpy(c->fq + c->fq_n, offs, n * sizeof *offs);
    c->fq_n += n;
    return HEAPC_OK;
}

static int fence_emit(void *data, const uint64_t *offs, size_t n) { return fq_push(data, offs, n); }

/* The completion source of this context's backend, made on first use. */
static int fence_start(heapc *c)
{
    if (c->fence_on)
        return HEAPC_OK;
    hf_source src;
    if (c->kind == HM_CUDA) {
        view *v = atomic_load(&c->view);
        void *ctx = v && c->local_index && c->local_index[v->rank] >= 0 ? c->spaces[c->local_index[v->rank]].ctx : NULL;
        char merr[320];
        if (hf_cuda_source(&src, ctx, merr, sizeof merr) != 0)
            return hci_set_err(c, HEAPC_EBACKEND, "stream-ordered free on heap %s: %s", c->heap, merr);
    } else {
        hf_host_source(&src);
    }
    hf_queue_init(&c->fence, src, c->fq_batch);
    c->fence_on = 1;
    return HEAPC_OK;
}

static int fence_fail(heapc *c, int frc, const char *what, const char *merr)
{
    if (frc == HF_ENOMEM)
        return hci_set_err(c, HEAPC_EOOM, "%s on heap %s: %s", what, c->heap, merr);
    if (frc == HF_EDEVICE)
        return hci_set_err(c, HEAPC_EBACKEND, "%s on heap %s: %s", what, c->heap, merr);
    return frc; /* fq_push's error, already set */
}

/* Closes the open group (its marker) when asked and moves every group whose
 * stream work completed to the free queue. Never waits for device work
 * (poll: flush and collect time, a just-recorded marker gets a grace of at
 * most HF_FRESH_POLL_NS); with no stream-ordered free pending it does nothing
 * device-related. */
static int fence_reap(heapc *c, int close, int poll)
{
    if (!c->fence_on || c->fence.waiting == 0)
        return HEAPC_OK;
    /* Issue 27: groups released early were sent already; their markers only
     * serve hf_queue_order, which records one when it needs it. So no
     * marker per allocation for them, and their completed markers are
     * collected in batches (HF_EARLY_REAP closed groups), not queried at
     * every call. */
    hf_queue *q = &c->fence;
    if (q->held == 0 && q->nclosed < HF_EARLY_REAP && !poll)
        return HEAPC_OK;
    if (q->open.early)
        close = 0;
    char merr[320] = "";
    int frc = close ? hf_queue_close(&c->fence, merr, sizeof merr) : HF_OK;
    if (frc == HF_OK)
        frc = hf_queue_reap(&c->fence, poll, fence_emit, c, merr, sizeof merr);
    return frc == HF_OK ? HEAPC_OK : fence_fail(c, frc, "checking freed blocks' streams", merr);
}

/* Trim and release: blocks released early (stream-ordered reuse) whose
 * stream work may still run are waited for first. */
int hci_fence_wait_early(heapc *c)
{
    if (!c->fence_on || !hf_queue_early(&c->fence))
        return HEAPC_OK;
    char merr[320] = "";
    int frc = hf_queue_wait_early(&c->fence, merr, sizeof merr);
    return frc == HF_OK ? HEAPC_OK : fence_fail(c, frc, "waiting for freed blocks' streams", merr);
}

/* Detach: the caller promised no device work still touches the heap, so
 * every waiting block goes to the free queue without a query. */
int hci_fence_drain_all(heapc *c)
{
    if (!c->fence_on)
        return HEAPC_OK;
    hf_queue *q = &c->fence;
    int rc = q->open.n && !q->open.early ? fq_push(c, q->open.offs, q->open.n) : HEAPC_OK;
    for (size_t i = 0; rc == HEAPC_OK && i < q->nclosed; i++) /* early ones were sent */
        rc = q->closed[i].early ? HEAPC_OK : fq_push(c, q->closed[i].offs, q->closed[i].n);
    c->ctr.stream_reuse_waits += q->orders;
    c->ctr.stream_markers += q->markers;
    hf_queue_destroy(q);
    c->fence_on = 0;
    return rc;
}

static int free_locked(heapc *c, uint64_t offset, void *stream, int on_stream)
{
    if (!c->attached)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_free: not attached to a heap; call heapc_attach");
    /* The host backend's plain free has no stream to wait for: straight to
     * the free queue, as before issue 18. */
    if (!stream && c->kind != HM_CUDA)
        on_stream = 0;
    if (on_stream) {
        int rc = fence_start(c);
        if (rc != HEAPC_OK)
            return rc;
    }
    uint64_t bsize = 0;
    int known = hci_ls_remove(&c->live, offset, &bsize);
    if (c->named_n) /* issue 29: a named block's name goes with it */
        hci_names_forget(c, offset);
    if (!known && c->live_complete)
        return hci_set_err(c, HEAPC_ENOTHELD,
                           "heapc_free: offset %" PRIu64 " (0x%" PRIx64 ") is not a block rank %" PRIu32
                           " holds in heap %s: it was already freed or never allocated here; free "
                           "each offset heapc_alloc returned exactly once",
                           offset, offset, atomic_load(&c->view)->rank, c->heap);
    if (!known) {
        /* Not allocated through this attach (the rank re-attached): only heapd
         * knows whether the rank holds it. Send it alone, now, so that heapd's
         * verdict is about this offset and comes back from this call. */
        Heapd__Free fr = HEAPD__FREE__INIT;
        fr.n_offsets = 1;
        fr.offsets = &offset;
        Heapd__Frame req = HEAPD__FRAME__INIT;
        req.body_case = HEAPD__FRAME__BODY_FREE;
        req.free = &fr;
        Heapd__Frame *rep;
        hw_frame raw;
        int rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_FREE_REPLY, &rep, &raw);
        if (rc != HEAPC_OK)
            return rc;
        hci_rpc_done(rep, &raw);
        c->ctr.frees++;
        c->ctr.free_batches++;
        return hci_ok(c);
    }
    if (on_stream) {
        /* Issue 27, stream-ordered reuse: the release goes to heapd now; the
         * fence remembers the block until its stream's work completes, so
         * that a reuse on another stream waits for it (alloc_made). */
        int early = c->stream_reuse && bsize;
        if (early && fq_push(c, &offset, 1) != HEAPC_OK) {
            hci_ls_insert(&c->live, offset, bsize);
            return c->err;
        }
        char merr[320] = "";
        uint64_t markers = c->fence.markers;
        int frc = hf_queue_add(&c->fence, stream, offset, bsize, early, merr, sizeof merr);
        if (frc != HF_OK) {
            c->fq_n -= early;
            hci_ls_insert(&c->live, offset, bsize);
            return fence_fail(c, frc, "heapc_free_async", merr);
        }
        c->ctr.stream_early += early;
        c->ctr.frees++;
        if (c->fence.markers != markers) { /* a group closed: see what completed */
            int rc = fence_reap(c, 0, 0);
            if (rc != HEAPC_OK)
                return rc;
        }
    } else {
        if (fq_push(c, &offset, 1) != HEAPC_OK) {
            hci_ls_insert(&c->live, offset, bsize);
            return hci_set_err(c, HEAPC_EOOM, "heapc_free: out of memory queueing offset %" PRIu64, offset);
        }
        c->ctr.frees++;
    }
    if (c->fq_n >= c->fq_batch) {
        int rc = hci_flush_locked(c);
        if (rc != HEAPC_OK)
            return rc;
    }
    return hci_ok(c);
}

int heapc_free(heapc *c, uint64_t offset)
{
    pthread_mutex_lock(&c->mu);
    int rc = free_locked(c, offset, NULL, 1);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_free_async(heapc *c, uint64_t offset, void *stream)
{
    pthread_mutex_lock(&c->mu);
    int rc = free_locked(c, offset, stream, 1);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_free_ptr(heapc *c, void *ptr)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    uint64_t m = atomic_load_explicit(&c->mapped, memory_order_acquire);
    if (!c->attached || !v) {
        rc = hci_set_err(c, HEAPC_ESTATE, "heapc_free_ptr: not attached to a heap; call heapc_attach");
    } else {
        uintptr_t base = (uintptr_t)v->bases[v->rank], p = (uintptr_t)ptr;
        if (p < base || p - base >= m)
            rc = hci_set_err(c, HEAPC_EINVAL,
                             "heapc_free_ptr: %p is not in this rank's copy of heap %s "
                             "[%p, +%" PRIu64 "); pass a pointer heapc_alloc returned",
                             ptr, c->heap, (void *)base, m);
        else
            rc = free_locked(c, (uint64_t)(p - base), NULL, 1);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_set_free_batch(heapc *c, size_t n)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (n == 0 || n > FREE_BATCH_MAX) {
        rc = hci_set_err(c, HEAPC_EINVAL, "heapc_set_free_batch: %zu is not in 1..%u", n, FREE_BATCH_MAX);
    } else {
        c->fq_batch = n;
        if (c->fence_on)
            c->fence.batch = n;
        rc = c->fq_n >= n && c->attached ? hci_flush_locked(c) : HEAPC_OK;
        if (rc == HEAPC_OK)
            hci_ok(c);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int hci_flush_all_locked(heapc *c)
{
    int rc = fence_reap(c, 1, 1);
    return rc == HEAPC_OK ? hci_flush_locked(c) : rc;
}

int heapc_flush(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached)
        rc = hci_set_err(c, HEAPC_ESTATE, "heapc_flush: not attached to a heap; call heapc_attach");
    else if ((rc = hci_flush_all_locked(c)) == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- collect ------------------------------------------------------------ */

/* size: the allocation that asked for the collect (0: heapc_collect). */
static int collect_locked(heapc *c, uint64_t size)
{
    /* Issue 18: no device-wide wait by default. Blocks freed on a stream go
     * to heapd only once their stream's work completed (an event query, no
     * wait); the others wait for a later flush or collect. With a sync hook
     * the markers are recorded first, so that the hook's sync completes
     * them. */
    int rc = HEAPC_OK;
    if (c->fence_on && c->fence.open.n) {
        char merr[320] = "";
        int frc = hf_queue_close(&c->fence, merr, sizeof merr);
        if (frc != HF_OK)
            return fence_fail(c, frc, "closing the frees' group before a collect", merr);
    }
    if (c->sync_fn) {
        rc = device_sync(c);
        if (rc != HEAPC_OK)
            return rc;
    } else if (c->kind == HM_CUDA || (c->fence_on && c->fence.waiting)) {
        c->ctr.device_waits_avoided++;
    }
    rc = fence_reap(c, 0, 1);
    if (rc != HEAPC_OK)
        return rc;
    rc = hci_flush_locked(c);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__Collect co = HEAPD__COLLECT__INIT;
    co.seq = c->next_seq;
    co.stream_waiting = c->fence_on ? c->fence.held : 0;
    co.device_waits_avoided = c->ctr.device_waits_avoided;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_COLLECT;
    req.collect = &co;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_COLLECT_REPLY, &rep, &raw);
    if (rc != HEAPC_OK) { /* heapd may still apply it (a cross-node result that came late) */
        hrp_lose(&c->rep, "a collect failed");
        return rc;
    }
    if (rep->collect_reply) {
        const Heapd__CollectReply *cr = rep->collect_reply;
        for (size_t i = 0; i < cr->n_ops; i++) /* issue 28: the replica reclaims the same */
            hrp_op(&c->rep, cr->ops[i], size);
        if (cr->ops_omitted || (!cr->n_ops && c->rep.core && cr->reclaimed_blocks))
            hrp_lose(&c->rep, "a collect's blocks did not come with its reply");
        c->ctr.heap_collects = rep->collect_reply->collects;
        c->ctr.last_reclaimed_blocks = rep->collect_reply->reclaimed_blocks;
        c->ctr.last_reclaimed_bytes = rep->collect_reply->reclaimed_bytes;
    }
    c->ctr.collects++;
    hci_rpc_done(rep, &raw);
    return HEAPC_OK;
}

int heapc_collect(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached)
        rc = hci_set_err(c, HEAPC_ESTATE, "heapc_collect: not attached to a heap; call heapc_attach");
    else if ((rc = collect_locked(c, 0)) == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- alloc -------------------------------------------------------------- */

/* heapd made allocation seq at off (the reply ar): the name, if any, is
 * recorded (issue 29). */
static int alloc_name(heapc *c, const char *name, size_t size, const Heapd__AllocReply *ar)
{
    if (!name || hci_names_add(c, name, c->next_seq - 1, ar->offset, size, ar->block_size) == 0)
        return HEAPC_OK;
    return hci_set_err(c, HEAPC_EOOM,
                       "allocation %" PRIu64 " of heap %s was made at offset %" PRIu64
                       " but libheapc is out of memory recording its name \"%s\" (heapc_lookup will "
                       "not find it; free it as usual)",
                       c->next_seq - 1, c->heap, ar->offset, name);
}

/* Where a new block will be used: on `stream` (known), or anywhere. */
typedef struct alloc_use {
    void *stream;
    int known;
} alloc_use;

/* Issue 27: the new block [off, off + size) may reuse blocks this rank freed
 * on a stream whose work has not completed (their releases went out at the
 * free). On the same stream, stream order makes that safe; on another, the
 * block's stream waits for theirs (cuStreamWaitEvent, no blocking); for a
 * block of no known stream (heapc_alloc), this call waits. Another rank's
 * work is that rank's own fence (and the caller's free rule: docs). */
static int alloc_order(heapc *c, uint64_t off, uint64_t size, const alloc_use *use)
{
    if (!c->fence_on || !hf_queue_early(&c->fence))
        return HEAPC_OK; /* nothing freed early is in flight */
    char merr[320] = "";
    int frc = hf_queue_order(&c->fence, off, size, use->stream, use->known, merr, sizeof merr);
    if (frc == HF_OK)
        return HEAPC_OK;
    fence_fail(c, frc, "ordering a reused block after its last stream work", merr);
    return c->err;
}

/* Allocation next_seq - 1 at off (block bsize) is made, whoever placed it
 * (who: for the message; bug: whose bug a block this rank holds is), ins:
 * the live set's answer: ordered after its last stream work, *ptr set. */
static int alloc_finish(heapc *c, const view *v, uint64_t off, uint64_t bsize, int ins, const alloc_use *use,
                        void **ptr, const char *who, const char *bug)
{
    int rc = alloc_order(c, off, bsize, use);
    if (rc != HEAPC_OK)
        return rc;
    if (ins == 0)
        return hci_set_err(c, HEAPC_EPROTOCOL,
                           "%s offset %" PRIu64 " for allocation %" PRIu64 " of heap %s while rank %" PRIu32
                           " still holds it; report this %s",
                           who, off, c->next_seq - 1, c->heap, v->rank, bug);
    if (ins < 0)
        c->live_complete = 0; /* cannot track it: let heapd check frees */
    if (ptr)
        *ptr = v->bases[v->rank] + off;
    return HEAPC_OK;
}

/* heapd made allocation next_seq (ar, with raw's fds): from here on it
 * counts. Maps its new chunks, records the block (and its name). */
static int alloc_made(heapc *c, view *v, const Heapd__AllocReply *ar, const hw_frame *raw, size_t size,
                      const char *name, const alloc_use *use, void **ptr, uint64_t *offset)
{
    uint64_t off = ar->offset, bsize = ar->block_size ? ar->block_size : size;
    c->next_seq++;
    c->ctr.allocs++;
    int ins = hci_ls_insert(&c->live, off, bsize);
    if (offset)
        *offset = off;
    if (ptr)
        *ptr = NULL;
    int rc = hci_map_chunks(c, v, ar->new_chunks, ar->n_new_chunks, raw);
    if (rc == HEAPC_OK && ar->mapped)
        rc = hci_publish_extent(c, v, ar->mapped, 0);
    uint64_t m = atomic_load_explicit(&c->mapped, memory_order_relaxed);
    if (rc == HEAPC_OK && (off >= m || size > m - off))
        rc = hci_set_err(c, HEAPC_EPROTOCOL,
                         "heapd placed allocation %" PRIu64 " (%zu bytes) at offset %" PRIu64 ", beyond the %" PRIu64
                         " bytes it sent chunks for; report this heapd bug",
                         c->next_seq - 1, size, off, m);
    if (rc != HEAPC_OK) {
        int keep = c->err;
        char msg[ERRSTR_LEN];
        snprintf(msg, sizeof msg, "%s", c->errstr);
        hci_set_err(c, keep == HEAPC_EOOM || keep == HEAPC_EBADFD ? keep : HEAPC_EMAP,
                    "allocation %" PRIu64 " of heap %s was made at offset %" PRIu64
                    " but is not usable here: %s (free it; detach and attach again to remap)",
                    c->next_seq - 1, c->heap, off, msg);
        return c->err;
    }
    rc = alloc_name(c, name, size, ar);
    if (rc != HEAPC_OK)
        return rc;
    return alloc_finish(c, v, off, bsize, ins, use, ptr, "heapd handed out", "heapd bug");
}

/* Issue 28: the replica decided allocation next_seq at off (block bsize):
 * no message; the record goes with the next request. */
static int local_made(heapc *c, const view *v, uint64_t off, uint64_t bsize, const alloc_use *use, void **ptr,
                      uint64_t *offset)
{
    c->next_seq++;
    c->ctr.allocs++;
    int ins = hci_ls_insert(&c->live, off, bsize);
    if (offset)
        *offset = off;
    if (ptr)
        *ptr = NULL;
    return alloc_finish(c, v, off, bsize, ins, use, ptr, "libheapc's replica placed",
                        "libheapc bug (HEAPC_DECIDE=daemon makes heapd decide every allocation)");
}

/* Issue 28: heapd's answer to allocation next_seq, for the replica. */
static void replica_hears(heapc *c, const Heapd__AllocReply *ar, size_t size)
{
    for (size_t i = 0; i < ar->n_ops; i++)
        hrp_op(&c->rep, ar->ops[i], size);
    if (ar->collect_needed || ar->trim_needed)
        hrp_needed(&c->rep, size, ar->trim_needed && !ar->collect_needed);
}

/* Issue 27: before each allocation, the stream-ordered frees whose work
 * completed join the free queue (an event query per closed group, no
 * wait; an open group held back until its work completes closes here, so
 * that it gets its marker now; fence_reap: groups released early), and
 * the queue goes with the Alloc (Alloc.frees), or first in Free batches
 * when it is longer than one Alloc carries. So a release reaches heapd at
 * the next call after its stream work completed, with no message of its
 * own, and heapd (reclaim eager) can reuse the block at once. */
static int frees_ready(heapc *c)
{
    int rc = fence_reap(c, 1, 0);
    if (rc == HEAPC_OK && c->fq_n > HW_ALLOC_FREES_MAX)
        rc = hci_flush_locked(c);
    return rc;
}

static int alloc_locked(heapc *c, size_t size, const char *name, const alloc_use *use, void **ptr, uint64_t *offset)
{
    if (!c->attached)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_alloc: not attached to a heap; call heapc_attach");
    if (size == 0)
        return hci_set_err(c, HEAPC_EINVAL, "heapc_alloc: size 0; ask for at least one byte");
    if (name && strlen(name) > HEAPC_NAME_MAX)
        return hci_set_err(c, HEAPC_EINVAL, "heapc_alloc_named: the name is %zu bytes; give at most %d", strlen(name),
                           HEAPC_NAME_MAX);
    view *v = atomic_load_explicit(&c->view, memory_order_relaxed);
    int rc = frees_ready(c);
    if (rc != HEAPC_OK)
        return rc;
    if (!name && c->mstate == HEAPC_STATE_ACTIVE && hrp_wants(&c->rep)) { /* issue 28: no message */
        uint64_t off, bsize;
        if (hrp_decide(&c->rep, size, atomic_load_explicit(&c->mapped, memory_order_relaxed), &off, &bsize) > 0)
            return local_made(c, v, off, bsize, use, ptr, offset);
    }
    for (int round = 0;; round++) {
        if (round >= ALLOC_MAX_ROUNDS)
            return hci_set_err(c, HEAPC_EPROTOCOL,
                               "heapd answered collect_needed %d times in a row to allocation %" PRIu64
                               " of heap %s; report this heapd bug",
                               round, c->next_seq, c->heap);
        Heapd__Alloc al = HEAPD__ALLOC__INIT;
        al.seq = c->next_seq;
        al.size = size;
        if (name)
            al.name = (char *)name;
        al.n_frees = c->fq_n; /* frees_ready: at most HW_ALLOC_FREES_MAX */
        al.frees = c->fq;
        hrp_records(&c->rep, &al.decided_from, &al.decided, &al.n_decided); /* issue 28 */
        Heapd__Frame req = HEAPD__FRAME__INIT;
        req.body_case = HEAPD__FRAME__BODY_ALLOC;
        req.alloc = &al;
        Heapd__Frame *rep;
        hw_frame raw;
        rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_ALLOC_REPLY, &rep, &raw);
        if (al.n_frees && rc != HEAPC_ECONN && rc != HEAPC_ENOREPLY) {
            /* heapd applied them, or (ERR_NOT_HELD) none: either way done */
            c->fq_n = 0;
            c->ctr.free_batches++;
        }
        if (rc != HEAPC_OK) {
            if (c->rep.asked)
                hrp_lose(&c->rep, "an allocation it had asked a step for failed");
            return rc;
        }
        hrp_records_done(&c->rep);
        Heapd__AllocReply *ar = rep->alloc_reply;
        if (!ar) {
            hci_rpc_done(rep, &raw);
            return hci_set_err(c, HEAPC_EPROTOCOL, "heapd sent an empty AllocReply");
        }
        replica_hears(c, ar, size);
        if (ar->collect_needed || ar->trim_needed) { /* issue 30: trim_threshold reached */
            int trim = ar->trim_needed && !ar->collect_needed;
            hci_rpc_done(rep, &raw);
            if ((rc = trim ? hci_trim_locked(c, NULL) : collect_locked(c, size)) != HEAPC_OK) {
                hrp_lose(&c->rep, "an allocation's collect or trim failed");
                return rc;
            }
            c->ctr.collects_needed += !trim;
            continue;
        }
        hrp_follow(&c->rep, size, ar->offset);
        rc = alloc_made(c, v, ar, &raw, size, name, use, ptr, offset);
        hci_rpc_done(rep, &raw);
        return rc;
    }
}

static const alloc_use anywhere = {NULL, 0};

int heapc_alloc(heapc *c, size_t size, void **ptr, uint64_t *offset)
{
    pthread_mutex_lock(&c->mu);
    int rc = alloc_locked(c, size, NULL, &anywhere, ptr, offset);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_alloc_named(heapc *c, size_t size, const char *name, void **ptr, uint64_t *offset)
{
    pthread_mutex_lock(&c->mu);
    int rc = alloc_locked(c, size, name && *name ? name : NULL, &anywhere, ptr, offset);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_alloc_async(heapc *c, size_t size, void *stream, void **ptr, uint64_t *offset)
{
    alloc_use use = {stream, 1};
    pthread_mutex_lock(&c->mu);
    int rc = alloc_locked(c, size, NULL, &use, ptr, offset);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_set_stream_reuse(heapc *c, int on)
{
    pthread_mutex_lock(&c->mu);
    c->stream_reuse = on != 0;
    int rc = hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
