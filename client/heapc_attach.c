/* heapc_attach.c - libheapc: attach (the address space, the chunks, the status
 * page), the parameters, detach. heapc_int.h has the context and its rules. */
#include "heapc_int.h"
#include "env.h"

/* ---- mapping ------------------------------------------------------------ */

/* Unmaps everything and forgets the attach state (not the connection). */
void hci_teardown(heapc *c)
{
    if (c->fence_on) { /* before the spaces go: cuda events live in the heap's context */
        c->ctr.stream_markers += c->fence.markers;
        c->ctr.stream_reuse_waits += c->fence.orders;
        hf_queue_destroy(&c->fence);
    }
    c->fence_on = 0;
    hrp_stop(&c->rep); /* issue 28 */
    const view *pv = atomic_load_explicit(&c->view, memory_order_acquire);
    hci_hook_drop(c, pv ? pv->rank : UINT32_MAX); /* issue 32: before the chunks go */
    view *v = atomic_exchange_explicit(&c->view, NULL, memory_order_acq_rel);
    atomic_store_explicit(&c->mapped, 0, memory_order_release);
    if (c->spaces) {
        uint32_t n = v ? v->nlocal : 0;
        for (uint32_t i = 0; i < n; i++)
            hm_unmap_all(&c->spaces[i]);
        free(c->spaces);
        c->spaces = NULL;
    }
    if (v) {
        free(v->local);
        free(v->bases);
        free(v);
    }
    free(c->local_index);
    c->local_index = NULL;
    free(c->heap);
    c->heap = NULL;
    const hs_page *sp = atomic_exchange(&c->status_page, NULL);
    if (sp)
        munmap((void *)sp, HS_PAGE_SIZE);
    if (c->status_fd >= 0)
        close(c->status_fd);
    c->status_fd = -1;
    hci_ls_clear(&c->live);
    hci_names_clear(c);
    free(c->fq);
    c->fq = NULL;
    c->fq_n = c->fq_cap = 0;
    c->attached = 0;
    c->mstate = HEAPC_STATE_ACTIVE;
    c->next_seq = 0;
    memset(&c->params, 0, sizeof c->params);
    c->uuid[0] = '\0';
}

/* hci_map_chunks' loop; mark (may be NULL) gets 1 for each of this rank's
 * chunks it mapped. */
static int map_refs(heapc *c, const view *v, Heapd__ChunkRef **refs, size_t n, const hw_frame *raw, uint8_t *mark)
{
    char merr[320];
    for (size_t i = 0; i < n; i++) {
        const Heapd__ChunkRef *r = refs[i];
        if (r->rank >= v->world || c->local_index[r->rank] < 0)
            return hci_set_err(c, HEAPC_EPROTOCOL,
                               "heapd sent a chunk of rank %" PRIu32 ", which is not a local rank "
                               "of this heap (world size %" PRIu32 ")",
                               r->rank, v->world);
        if (r->fd_index >= raw->nfds)
            return hci_set_err(c, HEAPC_EPROTOCOL,
                               "heapd sent chunk %" PRIu32 " of rank %" PRIu32 " with fd index %" PRIu32
                               " but only %zu fds",
                               r->index, r->rank, r->fd_index, raw->nfds);
        hm_space *s = &c->spaces[c->local_index[r->rank]];
        if (hm_is_mapped(s, r->index))
            continue;
        int rc = hm_map_chunk(s, r->index, raw->fds[r->fd_index], merr, sizeof merr);
        if (rc != HM_OK)
            return hci_set_err(c,
                               rc == HM_ENOMEM   ? HEAPC_EOOM
                               : rc == HM_EBADFD ? HEAPC_EBADFD
                                                 : HEAPC_EMAP,
                               "mapping chunk %" PRIu32 " of rank %" PRIu32 " of heap %s failed: %s", r->index, r->rank,
                               c->heap, merr);
        c->ctr.chunks_mapped++;
        if (mark && r->rank == v->rank)
            mark[r->index] = 1;
    }
    return HEAPC_OK;
}

/* Maps every chunk in refs (fds from raw). Chunks already mapped are
 * skipped. Issue 32: the map hook hears of this rank's chunks mapped here
 * (also when a later one failed: those stay mapped). */
int hci_map_chunks(heapc *c, const view *v, Heapd__ChunkRef **refs, size_t n, const hw_frame *raw)
{
    int32_t own = c->local_index[v->rank];
    uint8_t *mark = c->map_fn && own >= 0 && n ? calloc(c->spaces[own].nchunks, 1) : NULL;
    int rc = map_refs(c, v, refs, n, raw, mark);
    if (c->map_fn && own >= 0 && n) /* out of memory for mark: every mapped slot (the layer skips what it has) */
        hci_hook_emit(c, v->rank, HEAPC_MAP_ADDED, mark);
    free(mark);
    return rc;
}

/* Publishes the extent every local rank has mapped without a hole, up to
 * `mapped` (what heapd reports). strict: every chunk below `mapped` must be
 * there (attach, whose reply carries every chunk), but for issue 30's
 * holes: a chunk no local rank has. */
int hci_publish_extent(heapc *c, const view *v, uint64_t mapped, int strict)
{
    uint64_t cs = c->params.chunk_size;
    uint64_t want = mapped / cs + (mapped % cs != 0);
    uint64_t have = atomic_load_explicit(&c->mapped, memory_order_relaxed) / cs;
    for (uint32_t i = 0; i < v->nlocal; i++) {
        const hm_space *s = &c->spaces[i];
        if (want > s->nchunks)
            return hci_set_err(c, HEAPC_EPROTOCOL,
                               "heapd reports heap %s mapped to %" PRIu64 " bytes, beyond its va_size "
                               "%" PRIu64 "; report this heapd bug",
                               c->heap, mapped, c->params.va_size);
    }
    uint64_t n = have;
    while (n < want) {
        uint32_t i, none = 0;
        for (i = 0; i < v->nlocal && hm_is_mapped(&c->spaces[i], (uint32_t)n); i++)
            ;
        for (uint32_t j = 0; j < v->nlocal; j++)
            none += !hm_is_mapped(&c->spaces[j], (uint32_t)n);
        if (i < v->nlocal && strict && none == v->nlocal) {
            n++; /* issue 30: a hole, absent on every local rank */
            continue;
        }
        if (i < v->nlocal) {
            if (strict)
                return hci_set_err(c, HEAPC_EPROTOCOL,
                                   "heapd reports heap %s mapped to %" PRIu64 " bytes but never sent "
                                   "chunk %" PRIu64 " of rank %" PRIu32 "; report this heapd bug",
                                   c->heap, mapped, n, v->local[i]);
            break;
        }
        n++;
    }
    uint64_t ext = n * cs < mapped ? n * cs : mapped;
    if (ext > atomic_load_explicit(&c->mapped, memory_order_relaxed))
        atomic_store_explicit(&c->mapped, ext, memory_order_release);
    return HEAPC_OK;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- attach / detach ---------------------------------------------------- */

/* attach, step 1: the context and the arguments allow an attach. */
static int attach_check(heapc *c, const char *heap, uint32_t rank, uint32_t world)
{
    if (c->attached)
        return hci_set_err(c, HEAPC_ESTATE,
                           "this context is already attached to heap %s as rank %" PRIu32
                           "; detach first or use another context",
                           c->heap, atomic_load(&c->view)->rank);
    if (!heap || !*heap)
        return hci_set_err(c, HEAPC_EINVAL, "heapc_attach: the heap name is empty; name the heap");
    if (world == 0 || rank >= world)
        return hci_set_err(c, HEAPC_EINVAL, "heapc_attach: rank %" PRIu32 " is not below world size %" PRIu32, rank,
                           world);
    if (c->sock.fd < 0)
        return hci_set_err(c, HEAPC_ECONN, "%s", c->dead_msg);
    return HEAPC_OK;
}

/* attach, step 2: the device. cuda needs this rank's GPU by UUID (into
 * uuid[64]) and its ordinal; host: uuid stays empty. */
static int attach_device(heapc *c, const heapc_params *p, char *uuid, int *ordinal)
{
    char merr[320];
    *ordinal = 0;
    if (strcmp(c->backend, "cuda") != 0)
        return HEAPC_OK;
    if (p && p->device_uuid && *p->device_uuid) {
        snprintf(uuid, 64, "%s", p->device_uuid);
        if (hm_cuda_device_by_uuid(uuid, ordinal, merr, sizeof merr) != HM_OK)
            return hci_set_err(c, HEAPC_EMAP, "heapc_attach: %s", merr);
    } else {
        if (hm_cuda_current_device(ordinal, merr, sizeof merr) != HM_OK)
            *ordinal = 0;
        if (hm_cuda_device_uuid(*ordinal, uuid, 64, merr, sizeof merr) != HM_OK)
            return hci_set_err(c, HEAPC_EMAP,
                               "heapc_attach: cannot name this rank's GPU (device %d) to heapd: "
                               "%s",
                               *ordinal, merr);
    }
    return HEAPC_OK;
}

/* Issue 28: $HEAPD_DECIDE (or HEAPC_DECIDE): "local" asks for a heap whose
 * ranks decide with a replica, every $HEAPD_DECIDE_EVERY-th allocation a
 * round trip (default 64); "daemon": heapd decides every allocation of
 * this rank (no replica, whatever the heap); unset: the heap's way. *ask:
 * local_every to ask for; *use: 1 to run a replica where the heap has one. */
static int decide_env(heapc *c, const heapc_params *p, uint32_t *ask, int *use)
{
    const char *d = henv_get("DECIDE"), *e = henv_get("DECIDE_EVERY");
    char w1[64], w2[64];
    *ask = 0;
    if (p && p->local_every) { /* the params first */
        *use = p->local_every > 0;
        if (p->local_every > 0 && (p->local_every < 2 || (uint32_t)p->local_every > HW_DECIDED_MAX))
            return hci_set_err(c, HEAPC_EINVAL,
                               "heapc_attach: local_every %" PRId32 ": give 2 to %u allocations between round trips, "
                               "0 for $HEAPD_DECIDE, or < 0 for heapd to decide",
                               p->local_every, HW_DECIDED_MAX);
        *ask = p->local_every > 0 ? (uint32_t)p->local_every : 0;
        return HEAPC_OK;
    }
    *use = !d || strcmp(d, "daemon") != 0;
    if (!d || !*d || !strcmp(d, "daemon"))
        return HEAPC_OK;
    if (strcmp(d, "local"))
        return hci_set_err(c, HEAPC_EINVAL, "heapc_attach: %s=\"%s\": give local or daemon",
                           henv_which("DECIDE", w1, sizeof w1), d);
    char *end = NULL;
    unsigned long n = e && *e ? strtoul(e, &end, 10) : 64;
    if ((e && *e && (*end || e[0] == '-')) || n < 2 || n > HW_DECIDED_MAX)
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_attach: %s=\"%s\": give the allocations between round trips, 2 to %u (default 64)",
                           henv_which("DECIDE_EVERY", w2, sizeof w2), e ? e : "", HW_DECIDED_MAX);
    *ask = (uint32_t)n;
    return HEAPC_OK;
}

/* attach, step 3: the Attach request and heapd's AttachReply. */
static int attach_request(heapc *c, const char *heap, uint32_t rank, uint32_t world, const heapc_params *p,
                          uint32_t local_every, const char *uuid, Heapd__Frame **rep, hw_frame *raw)
{
    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    hp.local_every = local_every; /* issue 28: decide_env's */
    if (p) {
        hp.chunk_size = p->chunk_size;
        hp.initial_size = p->initial_size;
        hp.va_size = p->va_size;
        hp.min_block = p->min_block;
        hp.policy = (Heapd__Policy)p->policy;
        hp.collect_timeout_ms = p->collect_timeout_ms;
        hp.persist_s = p->persist_s < 0 ? UINT32_MAX : (uint32_t)p->persist_s; /* issue 29 */
        hp.reclaim = (Heapd__Reclaim)p->reclaim;                               /* issue 27 */
        hp.grow_ahead = p->grow_ahead < 0 ? UINT32_MAX : (uint32_t)p->grow_ahead;
        hp.trim_threshold = p->trim_threshold < 0 ? UINT64_MAX : (uint64_t)p->trim_threshold; /* issue 30 */
        hp.extent_bound = p->extent_bound != 0;                                               /* issue 32 */
    }
    Heapd__Attach at = HEAPD__ATTACH__INIT;
    at.heap = (char *)heap;
    at.rank = rank;
    at.world_size = world;
    at.params = &hp;
    at.device_uuid = (char *)uuid;
    if (p) {
        at.local_size = p->local_size;
        at.job = (char *)(p->job ? p->job : "");
    }
    /* The job's secret: only ranks that share it (and the uid) meet in the
     * store; heapd keeps a hash of it, never the text. */
    const char *secret = henv_get("JOB_SECRET");
    if (secret && *secret) {
        at.job_secret.data = (uint8_t *)secret;
        at.job_secret.len = strlen(secret);
    }
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_ATTACH;
    req.attach = &at;
    return hci_rpc(c, &req, HEAPD__FRAME__BODY_ATTACH_REPLY, rep, raw);
}

/* attach, step 4: validates what heapd sent before touching the address
 * space; sets c->kind from the reply's backend. */
static int attach_reply_check(heapc *c, const Heapd__AttachReply *ar, const char *heap, uint32_t world)
{
    if (!ar || !ar->params || ar->params->chunk_size == 0 || ar->params->va_size == 0)
        return hci_set_err(c, HEAPC_EPROTOCOL, "heapd's AttachReply for heap %s has no chunk_size or va_size", heap);
    if (ar->world_size != world)
        return hci_set_err(c, HEAPC_EPROTOCOL,
                           "heapd's AttachReply for heap %s says world size %" PRIu32 ", asked %" PRIu32, heap,
                           ar->world_size, world);
    const char *backend = ar->backend && *ar->backend ? ar->backend : c->backend;
    if (strcmp(backend, "host") == 0) {
        c->kind = HM_HOST;
    } else if (strcmp(backend, "cuda") == 0) {
        c->kind = HM_CUDA;
    } else {
        return hci_set_err(c, HEAPC_EPROTOCOL,
                           "heapd serves heap %s from backend \"%s\", which libheapc cannot map "
                           "(it knows host and cuda); upgrade libheapc",
                           heap, backend);
    }
    return HEAPC_OK;
}

/* attach, step 5: the view (*vp, not yet published) and c->local_index.
 * Local ranks: heapd's list, self included, sorted, no duplicates. */
static int attach_view(heapc *c, const Heapd__AttachReply *ar, const char *heap, uint32_t rank, uint32_t world,
                       view **vp)
{
    c->heap = strdup(heap);
    view *v = *vp = calloc(1, sizeof *v);
    c->local_index = malloc((size_t)world * sizeof *c->local_index);
    if (v) {
        v->bases = calloc(world, sizeof *v->bases);
        v->local = malloc((ar->n_local_ranks + 1) * sizeof *v->local);
    }
    if (!c->heap || !v || !v->bases || !v->local || !c->local_index)
        return hci_set_err(c, HEAPC_EOOM, "out of memory attaching heap %s", heap);
    v->rank = rank;
    v->world = world;
    for (uint32_t q = 0; q < world; q++)
        c->local_index[q] = -1;
    int self_seen = 0;
    for (size_t i = 0; i < ar->n_local_ranks; i++) {
        uint32_t q = ar->local_ranks[i];
        if (q >= world)
            return hci_set_err(c, HEAPC_EPROTOCOL,
                               "heapd lists local rank %" PRIu32 " of heap %s, beyond world size %" PRIu32, q, heap,
                               world);
        if (c->local_index[q] >= 0)
            continue;
        c->local_index[q] = 0;
        v->local[v->nlocal++] = q;
        self_seen |= q == rank;
    }
    if (!self_seen) {
        c->local_index[rank] = 0;
        v->local[v->nlocal++] = rank;
    }
    qsort(v->local, v->nlocal, sizeof *v->local, cmp_u32);
    for (uint32_t i = 0; i < v->nlocal; i++)
        c->local_index[v->local[i]] = (int32_t)i;
    return HEAPC_OK;
}

/* attach, step 6: the heap's effective parameters, from heapd. */
static void attach_params(heapc *c, const Heapd__HeapParams *hp, const char *uuid)
{
    c->params.chunk_size = hp->chunk_size;
    c->params.initial_size = hp->initial_size;
    c->params.va_size = hp->va_size;
    c->params.min_block = hp->min_block;
    c->params.policy = (heapc_policy)hp->policy;
    c->params.collect_timeout_ms = hp->collect_timeout_ms;
    c->params.persist_s = hci_persist_of(hp->persist_s);
    c->params.reclaim = (heapc_reclaim)hp->reclaim;
    c->params.grow_ahead = hp->grow_ahead == UINT32_MAX ? -1 : (int32_t)hp->grow_ahead; /* issue 27 */
    c->params.trim_threshold = hci_trim_threshold_of(hp->trim_threshold);               /* issue 30 */
    c->params.extent_bound = hp->extent_bound;                                          /* issue 32 */
    c->params.local_every = (int32_t)hp->local_every;                                   /* issue 28 */
    snprintf(c->uuid, sizeof c->uuid, "%s", uuid);
    c->params.device_uuid = c->uuid;
}

/* attach, step 7: va_size of address space per local rank (c->spaces). */
static int attach_spaces(heapc *c, view *v, const char *heap, int ordinal)
{
    char merr[320];
    c->spaces = calloc(v->nlocal, sizeof *c->spaces);
    if (!c->spaces)
        return hci_set_err(c, HEAPC_EOOM, "out of memory attaching heap %s", heap);
    for (uint32_t i = 0; i < v->nlocal; i++) {
        int mr = hm_reserve(c->kind, c->params.va_size, c->params.chunk_size, &c->spaces[i], merr, sizeof merr);
        if (mr == HM_OK && c->kind == HM_CUDA)
            mr = hm_set_cuda_device(&c->spaces[i], ordinal, merr, sizeof merr);
        if (mr != HM_OK)
            return hci_set_err(c, mr == HM_ENOMEM ? HEAPC_EOOM : HEAPC_EMAP,
                               "reserving %" PRIu64 " bytes of address space for rank %" PRIu32
                               " of heap %s failed: %s",
                               c->params.va_size, v->local[i], heap, merr);
        v->bases[v->local[i]] = hm_base(&c->spaces[i]);
    }
    return HEAPC_OK;
}

/* attach, step 8: the status page stays open for libheapc_nccl; every other
 * fd is closed by hci_rpc_done (heapc_map.h: hm_map_chunk never takes the fd).
 * A page that is no sealed memfd of HS_PAGE_SIZE bytes fails the attach
 * (reading a short one would fault); one that is not a status page (magic,
 * version) is ignored as before. */
static int attach_status_page(heapc *c, const Heapd__AttachReply *ar, hw_frame *raw)
{
    if (ar->status_fd_index < 0 || (size_t)ar->status_fd_index >= raw->nfds)
        return HEAPC_OK;
    char merr[320];
    if (hm_check_memfd(raw->fds[ar->status_fd_index], HS_PAGE_SIZE, "the status page", merr, sizeof merr) != HM_OK)
        return hci_set_err(c, HEAPC_EBADFD, "attaching heap %s: %s", c->heap, merr);
    c->status_fd = raw->fds[ar->status_fd_index];
    raw->fds[ar->status_fd_index] = -1;
    void *pg = mmap(NULL, HS_PAGE_SIZE, PROT_READ, MAP_SHARED, c->status_fd, 0);
    if (pg != MAP_FAILED && ((const hs_page *)pg)->magic == HS_MAGIC && ((const hs_page *)pg)->version == HS_VERSION)
        atomic_store_explicit(&c->status_page, (const hs_page *)pg, memory_order_release);
    else if (pg != MAP_FAILED)
        munmap(pg, HS_PAGE_SIZE);
    return HEAPC_OK;
}

/* A failed attach: frees v when it was not published, forgets the attach
 * state and leaves the heap (heapd attached us; we cannot use the heap: the
 * rank must be free again). Keeps the error; returns its code. */
static int attach_undo(heapc *c, view *v)
{
    if (v && atomic_load(&c->view) != v) {
        /* Not published: teardown would not find it. */
        hci_hook_drop(c, v->rank);
        if (c->spaces) {
            for (uint32_t i = 0; i < v->nlocal; i++)
                hm_unmap_all(&c->spaces[i]);
            free(c->spaces);
            c->spaces = NULL;
        }
        free(v->local);
        free(v->bases);
        free(v);
    }
    int keep = c->err;
    char msg[ERRSTR_LEN];
    memcpy(msg, c->errstr, sizeof msg);
    hci_teardown(c);
    if (c->sock.fd >= 0) {
        Heapd__Detach d = HEAPD__DETACH__INIT;
        Heapd__Frame dreq = HEAPD__FRAME__INIT;
        dreq.body_case = HEAPD__FRAME__BODY_DETACH;
        dreq.detach = &d;
        Heapd__Frame *drep;
        hw_frame draw;
        if (hci_rpc(c, &dreq, HEAPD__FRAME__BODY_DETACH_REPLY, &drep, &draw) == HEAPC_OK)
            hci_rpc_done(drep, &draw);
    }
    c->err = keep;
    memcpy(c->errstr, msg, sizeof msg);
    return keep;
}

int hci_attach_locked(heapc *c, const char *heap, uint32_t rank, uint32_t world, const heapc_params *p)
{
    char uuid[64] = "";
    int ordinal;
    uint32_t ask; /* issue 28: the local_every to ask for, and whether to run a replica */
    int use;
    int rc = attach_check(c, heap, rank, world);
    if (rc == HEAPC_OK)
        rc = decide_env(c, p, &ask, &use);
    if (rc == HEAPC_OK)
        rc = attach_device(c, p, uuid, &ordinal);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = attach_request(c, heap, rank, world, p, ask, uuid, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__AttachReply *ar = rep->attach_reply;
    view *v = NULL;
    if ((rc = attach_reply_check(c, ar, heap, world)) != HEAPC_OK ||
        (rc = attach_view(c, ar, heap, rank, world, &v)) != HEAPC_OK)
        goto fail;
    attach_params(c, ar->params, uuid);
    if ((rc = attach_spaces(c, v, heap, ordinal)) != HEAPC_OK)
        goto fail;
    /* Issue 28: a replica of a fresh heap whose ranks decide (a later
     * attach, or HEAPC_DECIDE=daemon: heapd decides this rank's). */
    if (use && ar->params->local_every && ar->next_seq == 0 && ar->generation == 0 && !ar->released)
        (void)hrp_start(&c->rep, ar->params, ar->params->local_every); /* fails: heapd decides */
    memset(&c->ctr, 0, sizeof c->ctr);
    if ((rc = hci_map_chunks(c, v, ar->chunks, ar->n_chunks, &raw)) != HEAPC_OK)
        goto fail;
    if ((rc = attach_status_page(c, ar, &raw)) != HEAPC_OK)
        goto fail;
    /* Publish: the view first, then the extent (it checks the chunks). */
    c->next_seq = ar->next_seq;
    c->live_complete = ar->next_seq == 0;
    if ((rc = hci_names_attach(c, ar)) != HEAPC_OK)
        goto fail;
    c->attached = 1;
    atomic_store_explicit(&c->view, v, memory_order_release);
    /* Issue 30: a released heap's chunks come with heapc_restore. */
    c->mstate = ar->released ? HEAPC_STATE_RELEASED : HEAPC_STATE_ACTIVE;
    if (ar->released)
        atomic_store_explicit(&c->mapped, ar->mapped, memory_order_release);
    rc = ar->released ? HEAPC_OK : hci_publish_extent(c, v, ar->mapped, 1);
    if (rc != HEAPC_OK) {
        v = NULL; /* owned by c->view now: teardown frees it */
        goto fail;
    }
    hci_rpc_done(rep, &raw);
    hci_ring_setup(c, v->nlocal);
    return hci_ok(c);

fail:
    hci_rpc_done(rep, &raw);
    return attach_undo(c, v);
}

int heapc_attach(heapc *c, const char *heap, uint32_t rank, uint32_t world_size, const heapc_params *params)
{
    pthread_mutex_lock(&c->mu);
    int rc = hci_attach_locked(c, heap, rank, world_size, params);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_get_params(heapc *c, heapc_params *out)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached) {
        rc = hci_set_err(c, HEAPC_ESTATE, "heapc_get_params: not attached to a heap; call heapc_attach");
    } else {
        *out = c->params;
        rc = hci_ok(c);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- detach ------------------------------------------------------------- */

int heapc_detach(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached) {
        rc = hci_set_err(c, HEAPC_ESTATE, "heapc_detach: not attached to a heap");
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    rc = hci_fence_drain_all(c);
    if (rc == HEAPC_OK)
        rc = hci_flush_locked(c);
    int frc = rc;
    char fmsg[ERRSTR_LEN];
    snprintf(fmsg, sizeof fmsg, "%s", c->errstr);
    if (c->sock.fd >= 0) {
        Heapd__Detach d = HEAPD__DETACH__INIT;
        Heapd__Frame req = HEAPD__FRAME__INIT;
        req.body_case = HEAPD__FRAME__BODY_DETACH;
        req.detach = &d;
        Heapd__Frame *rep;
        hw_frame raw;
        rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_DETACH_REPLY, &rep, &raw);
        if (rc == HEAPC_OK)
            hci_rpc_done(rep, &raw);
    } else {
        rc = hci_set_err(c, HEAPC_ECONN, "%s", c->dead_msg);
    }
    hci_teardown(c);
    if (rc == HEAPC_OK && frc != HEAPC_OK) /* report the lost frees */
        rc = hci_set_err(c, frc, "%s", fmsg);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
