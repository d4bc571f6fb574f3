/* reply.c - every message heapd sends (see reply.h). */
#include "reply.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "ring.h"
#include "ring_layout.h"
#include "wire.h"

static void pack_frame(const void *msg, uint8_t *out) { heapd__frame__pack(msg, out); }

/* Queues `f` (with f->id set by the caller) and its fds, which the sink
 * owns from then on. */
static void send_frame(const hd_frame_sink *out, const Heapd__Frame *f, int *fds, size_t nfds)
{
    hd_frame_sink_send(out, f->id, f, heapd__frame__get_packed_size(f), pack_frame, fds, nfds);
}

/* The frame sink of a peer of hd_reply_frame_ops. */
static const hd_frame_sink *sink_of(const hd_peer *p) { return p->data; }

/* Queues a frame whose body is `msg`, the message of oneof case `bc`,
 * answering request `id` (0: unsolicited). Every body is a message pointer
 * in the frame's oneof: the field descriptor gives where it goes. */
static void send_body(const hd_frame_sink *out, uint64_t id, Heapd__Frame__BodyCase bc, const void *msg, int *fds,
                      size_t nfds)
{
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&heapd__frame__descriptor, (unsigned)bc);
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = bc;
    memcpy((char *)&f + fd->offset, &msg, sizeof msg);
    send_frame(out, &f, fds, nfds);
}

static void close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* asym: an asymmetric allocation's fields (the heap is poisoned), or NULL. */
static void send_error(const hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg, const hd_asym_out *asym)
{
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(&heapd__err_code__descriptor, (int)code);
    hd_log_ctx_err(ev ? ev->name : NULL);
    hd_debug("error to pid %ld (request %llu): %s", (long)p->pid, (unsigned long long)id, msg);
    hd_log_ctx_err(NULL);
    Heapd__Error e = HEAPD__ERROR__INIT;
    e.code = code;
    e.message = (char *)msg;
    if (asym) {
        e.asym_n = asym->n;
        e.n_asym_ranks = asym->nranks;
        e.asym_ranks = (uint32_t *)asym->ranks;
        e.n_asym_sizes = asym->nranks;
        e.asym_sizes = (uint64_t *)asym->sizes;
    }
    char *names[HD_ASYM_RANKS];
    if (asym && asym->with_names) { /* issue 29: the names differ ("": none) */
        for (uint32_t i = 0; i < asym->nranks && i < HD_ASYM_RANKS; i++)
            names[i] = (char *)(asym->names[i] ? asym->names[i] : "");
        e.n_asym_names = asym->nranks;
        e.asym_names = names;
    }
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_ERROR, &e, NULL, 0);
}

void hd_reply_hello(const hd_frame_sink *out, uint64_t id, const char *backend)
{
    Heapd__HelloReply r = HEAPD__HELLO_REPLY__INIT;
    r.version = HEAPD__CONST__PROTOCOL_VERSION;
    r.server = (char *)"heapd " HEAPD_VERSION;
    r.backend = (char *)backend;
    send_body(out, id, HEAPD__FRAME__BODY_HELLO_REPLY, &r, NULL, 0);
}

/* ---- the heap wing's sink ------------------------------------------------ */

/* grow_ahead: the heap's spares per rank (0: none, sent as
 * HD_GROW_AHEAD_NONE: issue 27). */
static void fill_params(const ha_params *ap, uint32_t timeout_ms, uint32_t persist_s, uint32_t grow_ahead,
                        uint32_t local_every, Heapd__HeapParams *p)
{
    heapd__heap_params__init(p);
    p->chunk_size = ap->chunk_size;
    p->initial_size = ap->initial_size;
    p->va_size = ap->va_size;
    p->min_block = ap->min_block;
    p->policy = (Heapd__Policy)hpo_to_wire(ap->policy); /* common/policy.h */
    p->reclaim = ap->reclaim == HA_RECLAIM_EAGER ? HEAPD__RECLAIM__RECLAIM_EAGER : HEAPD__RECLAIM__RECLAIM_COLLECT;
    p->collect_timeout_ms = timeout_ms;
    p->persist_s = persist_s;
    p->grow_ahead = grow_ahead ? grow_ahead : HD_GROW_AHEAD_NONE;
    p->trim_threshold = ap->trim_threshold ? ap->trim_threshold : HD_TRIM_NONE; /* issue 30 */
    p->extent_bound = ap->extent_bound;                                         /* issue 32 */
    p->local_every = local_every;                                               /* issue 28 */
}

/* refs + i and fds + i, where a reply without chunks may have NULL arrays
 * (NULL + 0 is undefined behaviour). */
static const hd_chunk_ref *refs_at(const hd_chunk_ref *refs, size_t i) { return refs ? refs + i : NULL; }
static int *fds_at(int *fds, size_t i) { return fds ? fds + i : NULL; }

/* ChunkRefs for refs[0..n) (fd_index i). NULL if out of memory (n > 0). */
static Heapd__ChunkRef **chunk_refs(const hd_chunk_ref *refs, size_t n, Heapd__ChunkRef **store)
{
    *store = NULL;
    if (!n)
        return NULL;
    Heapd__ChunkRef *r = calloc(n, sizeof *r);
    Heapd__ChunkRef **p = calloc(n, sizeof *p);
    if (!r || !p) {
        free(r);
        free(p);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        heapd__chunk_ref__init(&r[i]);
        r[i].rank = refs[i].rank;
        r[i].index = refs[i].index;
        r[i].fd_index = (uint32_t)i;
        p[i] = &r[i];
    }
    *store = r;
    return p;
}

/* A reply whose chunks need more fds than one frame carries (HW_FDS_MAX):
 * ChunkBatch frames of HW_FDS_MAX chunks each go first, with the request's
 * id, until the chunks left and `extra` more fds (the status page's) fit the
 * reply's frame (docs/protocol.md). Returns how many chunks went out; out of
 * memory: every fd not sent (fds[sent..n + extra)) is closed and SIZE_MAX
 * returned. */
static size_t send_chunk_batches(const hd_frame_sink *out, uint64_t id, const hd_chunk_ref *refs, size_t n, int *fds,
                                 size_t extra)
{
    size_t sent = 0;
    while (n - sent + extra > HW_FDS_MAX) {
        size_t k = n - sent < HW_FDS_MAX ? n - sent : HW_FDS_MAX;
        Heapd__ChunkRef *store;
        Heapd__ChunkRef **ptrs = chunk_refs(refs + sent, k, &store);
        if (!ptrs) {
            close_fds(fds + sent, n - sent + extra);
            return SIZE_MAX;
        }
        Heapd__ChunkBatch b = HEAPD__CHUNK_BATCH__INIT;
        b.n_chunks = k;
        b.chunks = ptrs;
        send_body(out, id, HEAPD__FRAME__BODY_CHUNK_BATCH, &b, fds + sent, k);
        free(ptrs);
        free(store);
        sent += k;
    }
    return sent;
}

/* Issue 29: LiveBlocks for live[0..n); the messages in *store. NULL if out
 * of memory (n > 0). */
static Heapd__LiveBlock **live_blocks(const hd_live_block *live, size_t n, Heapd__LiveBlock **store)
{
    *store = NULL;
    if (!n)
        return NULL;
    Heapd__LiveBlock *v = calloc(n, sizeof *v);
    Heapd__LiveBlock **p = calloc(n, sizeof *p);
    if (!v || !p) {
        free(v);
        free(p);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        heapd__live_block__init(&v[i]);
        v[i].seq = live[i].seq;
        v[i].offset = live[i].offset;
        v[i].size = live[i].size;
        v[i].block_size = live[i].block_size;
        v[i].name = (char *)(live[i].name ? live[i].name : "");
        p[i] = &v[i];
    }
    *store = v;
    return p;
}

/* The live blocks of one frame from live[from..n): at most HD_LIVE_BATCH
 * blocks and about HD_LIVE_BYTES bytes. */
#define HD_LIVE_BATCH 16384
#define HD_LIVE_BYTES (HW_FRAME_MAX / 4)
static size_t live_chunk(const hd_live_block *live, size_t from, size_t n)
{
    size_t k = 0, bytes = 0;
    while (from + k < n && k < HD_LIVE_BATCH && bytes < HD_LIVE_BYTES) {
        bytes += 48 + (live[from + k].name ? strlen(live[from + k].name) : 0);
        k++;
    }
    return k;
}

/* Issue 29: the live blocks that do not fit in the AttachReply go first, in
 * LiveBatch frames with the request's id. Returns how many went out, or
 * SIZE_MAX out of memory. */
static size_t send_live_batches(const hd_frame_sink *out, uint64_t id, const hd_live_block *live, size_t n)
{
    size_t sent = 0;
    for (size_t k; (k = live_chunk(live, sent, n)) < n - sent; sent += k) {
        Heapd__LiveBlock *store;
        Heapd__LiveBlock **ptrs = live_blocks(live + sent, k, &store);
        if (!ptrs)
            return SIZE_MAX;
        Heapd__LiveBatch b = HEAPD__LIVE_BATCH__INIT;
        b.n_blocks = k;
        b.blocks = ptrs;
        send_body(out, id, HEAPD__FRAME__BODY_LIVE_BATCH, &b, NULL, 0);
        free(ptrs);
        free(store);
    }
    return sent;
}

/* Issue 29: an AttachReply's live set (the rest after the LiveBatch
 * frames) and markers, into ar; their messages to free in *lv, *lp, *mv,
 * *mp. -1 out of memory. */
static int attach_issue29(const hd_frame_sink *out, uint64_t id, const hd_attach_out *a, Heapd__AttachReply *ar,
                          Heapd__LiveBlock **lv, Heapd__LiveBlock ***lp, Heapd__Marker **mv, Heapd__Marker ***mp)
{
    *lv = NULL, *lp = NULL, *mv = NULL, *mp = NULL;
    size_t sent = send_live_batches(out, id, a->live, a->nlive);
    if (sent == SIZE_MAX)
        return -1;
    *lp = live_blocks(a->live ? a->live + sent : NULL, a->nlive - sent, lv);
    if (a->nlive > sent && !*lp)
        return -1;
    if (a->nmarkers) {
        *mv = calloc(a->nmarkers, sizeof **mv);
        *mp = calloc(a->nmarkers, sizeof **mp);
        if (!*mv || !*mp)
            return -1;
        for (size_t i = 0; i < a->nmarkers; i++) {
            heapd__marker__init(&(*mv)[i]);
            (*mv)[i].tag = (char *)a->markers[i].tag;
            (*mv)[i].value = a->markers[i].value;
            (*mv)[i].seq = a->markers[i].seq;
            (*mp)[i] = &(*mv)[i];
        }
    }
    ar->generation = a->generation;
    ar->resumed = a->resumed;
    ar->n_live = a->nlive - sent;
    ar->live = *lp;
    ar->n_markers = a->nmarkers;
    ar->markers = *mp;
    return 0;
}

static void out_error(hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg, const hd_asym_out *asym)
{
    send_error(p, id, code, msg, asym);
}

static void out_attach(hd_peer *p, uint64_t id, const hd_attach_out *a)
{
    /* Chunks first, the status page fd last (status_index == nchunks). */
    size_t sent = send_chunk_batches(sink_of(p), id, a->chunks, a->nchunks, a->fds, a->nfds - a->nchunks);
    if (sent == SIZE_MAX) {
        send_error(p, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory", NULL);
        return;
    }
    Heapd__ChunkRef *store;
    Heapd__ChunkRef **ptrs = chunk_refs(refs_at(a->chunks, sent), a->nchunks - sent, &store);
    if (a->nchunks > sent && !ptrs) {
        close_fds(fds_at(a->fds, sent), a->nfds - sent);
        send_error(p, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory", NULL);
        return;
    }
    Heapd__HeapParams params;
    fill_params(a->ap, a->timeout_ms, a->persist_s, a->grow_ahead, a->local_every, &params);
    Heapd__AttachReply ar = HEAPD__ATTACH_REPLY__INIT;
    ar.params = &params;
    ar.world_size = a->world_size;
    ar.n_local_ranks = a->nlocal;
    ar.local_ranks = (uint32_t *)a->local_ranks;
    ar.mapped = a->mapped;
    ar.n_chunks = a->nchunks - sent;
    ar.chunks = ptrs;
    ar.status_fd_index = a->status_index >= 0 ? a->status_index - (int32_t)sent : -1;
    ar.next_seq = a->next_seq;
    ar.backend = (char *)a->backend;
    ar.epoch = a->epoch;
    ar.released = a->released;
    Heapd__LiveBlock *lv, **lp;
    Heapd__Marker *mv, **mp;
    if (attach_issue29(sink_of(p), id, a, &ar, &lv, &lp, &mv, &mp)) {
        close_fds(fds_at(a->fds, sent), a->nfds - sent);
        send_error(p, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory", NULL);
    } else {
        send_body(sink_of(p), id, HEAPD__FRAME__BODY_ATTACH_REPLY, &ar, fds_at(a->fds, sent), a->nfds - sent);
    }
    free(lv);
    free(lp);
    free(mv);
    free(mp);
    free(ptrs);
    free(store);
}

/* Issue 28: a HeapOp in *m (its offsets point into o's). */
static Heapd__HeapOp *op_fill(const hd_op_out *o, Heapd__HeapOp *m)
{
    heapd__heap_op__init(m);
    m->at = o->at;
    m->collect = o->collect;
    m->asked = o->asked;
    m->n_offsets = o->n;
    m->offsets = (uint64_t *)o->offsets;
    return m;
}

static void out_alloc(hd_peer *p, uint64_t id, const hd_alloc_out *a)
{
    size_t sent = send_chunk_batches(sink_of(p), id, a->new_chunks, a->nchunks, a->fds, 0);
    if (sent == SIZE_MAX) {
        send_error(p, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory", NULL);
        return;
    }
    Heapd__ChunkRef *store;
    Heapd__ChunkRef **ptrs = chunk_refs(refs_at(a->new_chunks, sent), a->nchunks - sent, &store);
    if (a->nchunks > sent && !ptrs) {
        close_fds(fds_at(a->fds, sent), a->nchunks - sent);
        send_error(p, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory", NULL);
        return;
    }
    Heapd__AllocReply ar = HEAPD__ALLOC_REPLY__INIT;
    ar.seq = a->seq;
    ar.collect_needed = a->collect_needed;
    ar.trim_needed = a->trim_needed;
    ar.offset = a->offset;
    ar.block_size = a->block_size;
    ar.mapped = a->mapped;
    ar.n_new_chunks = a->nchunks - sent;
    ar.new_chunks = ptrs;
    Heapd__HeapOp op, *opp[1];
    if (a->op) {
        opp[0] = op_fill(a->op, &op);
        ar.n_ops = 1;
        ar.ops = opp;
    }
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_ALLOC_REPLY, &ar, fds_at(a->fds, sent), a->nchunks - sent);
    free(ptrs);
    free(store);
}

static void out_free(hd_peer *p, uint64_t id, uint32_t accepted)
{
    Heapd__FreeReply fr = HEAPD__FREE_REPLY__INIT;
    fr.accepted = accepted;
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_FREE_REPLY, &fr, NULL, 0);
}

static void out_collect(hd_peer *p, uint64_t id, const hd_collect_out *o)
{
    Heapd__CollectReply cr = HEAPD__COLLECT_REPLY__INIT;
    cr.reclaimed_blocks = o->blocks;
    cr.reclaimed_bytes = o->bytes;
    cr.collects = o->collects;
    cr.ops_omitted = o->omitted;
    Heapd__HeapOp op, *opp[1];
    if (o->op) {
        opp[0] = op_fill(o->op, &op);
        cr.n_ops = 1;
        cr.ops = opp;
    }
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_COLLECT_REPLY, &cr, NULL, 0);
}

static void out_detach(hd_peer *p, uint64_t id)
{
    Heapd__DetachReply dr = HEAPD__DETACH_REPLY__INIT;
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_DETACH_REPLY, &dr, NULL, 0);
}

static void out_release(hd_peer *p, uint64_t id, const hd_release_out *o)
{
    Heapd__ReleaseReply rr = HEAPD__RELEASE_REPLY__INIT;
    rr.released_bytes = o->released;
    rr.saved_bytes = o->saved;
    rr.elapsed_us = o->elapsed_us;
    rr.some = o->some;
    rr.n_chunks = o->nchunks;
    rr.chunks = (uint32_t *)o->chunks;
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_RELEASE_REPLY, &rr, NULL, 0);
}

static void out_restore(hd_peer *p, uint64_t id, const hd_restore_out *o)
{
    size_t sent = send_chunk_batches(sink_of(p), id, o->chunks, o->nchunks, o->fds, 0);
    if (sent == SIZE_MAX) {
        send_error(p, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory", NULL);
        return;
    }
    Heapd__ChunkRef *store;
    Heapd__ChunkRef **ptrs = chunk_refs(refs_at(o->chunks, sent), o->nchunks - sent, &store);
    if (o->nchunks > sent && !ptrs) {
        close_fds(fds_at(o->fds, sent), o->nchunks - sent);
        send_error(p, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory", NULL);
        return;
    }
    Heapd__RestoreReply rr = HEAPD__RESTORE_REPLY__INIT;
    rr.n_chunks = o->nchunks - sent;
    rr.chunks = ptrs;
    rr.mapped = o->mapped;
    rr.restored_bytes = o->restored_bytes;
    rr.elapsed_us = o->elapsed_us;
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_RESTORE_REPLY, &rr, fds_at(o->fds, sent), o->nchunks - sent);
    free(ptrs);
    free(store);
}

static void out_trim(hd_peer *p, uint64_t id, const hd_trim_out *o)
{
    Heapd__TrimReply tr = HEAPD__TRIM_REPLY__INIT;
    tr.trimmed_bytes = o->trimmed_bytes;
    tr.mapped = o->mapped;
    tr.elapsed_us = o->elapsed_us;
    tr.n_chunks = o->nchunks;
    tr.chunks = (uint32_t *)o->chunks;
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_TRIM_REPLY, &tr, NULL, 0);
}

static void out_commit(hd_peer *p, uint64_t id, uint64_t value, uint64_t generation)
{
    Heapd__CommitReply cr = HEAPD__COMMIT_REPLY__INIT;
    cr.value = value;
    cr.generation = generation;
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_COMMIT_REPLY, &cr, NULL, 0);
}

static void out_force(hd_peer *p, uint64_t id, uint64_t at_seq)
{
    Heapd__ForceCollectReply fr = HEAPD__FORCE_COLLECT_REPLY__INIT;
    fr.at_seq = at_seq;
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY, &fr, NULL, 0);
}

static void out_drop(hd_peer *p, uint64_t id, uint64_t released_bytes)
{
    Heapd__DropReply dr = HEAPD__DROP_REPLY__INIT;
    dr.released_bytes = released_bytes;
    send_body(sink_of(p), id, HEAPD__FRAME__BODY_DROP_REPLY, &dr, NULL, 0);
}

/* A Histogram of h; its counts live in `counts`. */
static Heapd__Histogram *fill_hist(Heapd__Histogram *g, uint64_t *counts, const hd_hist *h)
{
    heapd__histogram__init(g);
    g->n_bounds = HD_HIST_N - 1;
    g->bounds = (double *)hd_hist_bounds;
    g->n_counts = HD_HIST_N;
    g->counts = counts;
    memcpy(counts, h->n, sizeof h->n);
    g->count = h->count;
    g->sum_seconds = (double)h->sum_ns / 1e9;
    return g;
}

/* hg: two Histograms (collect wait, growth), hn: their counts. */
static void heap_stats(const hd_heap_info *in, Heapd__HeapStats *s, Heapd__HeapParams *pp, Heapd__RankStats *rs,
                       Heapd__RankStats **rsp, Heapd__Histogram *hg, uint64_t (*hn)[HD_HIST_N])
{
    heapd__heap_stats__init(s);
    if (in->collect_wait)
        s->collect_wait = fill_hist(&hg[0], hn[0], in->collect_wait);
    if (in->growth)
        s->growth = fill_hist(&hg[1], hn[1], in->growth);
    fill_params(in->ap, in->timeout_ms, in->persist_s, in->grow_ahead, in->local_every, pp);
    s->name = (char *)in->name;
    s->world_size = in->world_size;
    s->params = pp;
    s->mapped = in->mapped;
    s->live_bytes = in->live_bytes;
    s->released_bytes = in->released_bytes;
    s->free_bytes = in->free_bytes;
    s->collects = in->collects;
    s->collects_skipped = in->collects_skipped;
    s->growths = in->growths;
    s->owner_uid = in->owner_uid;
    s->bookkeeping_bytes = in->bookkeeping_bytes;
    s->clients = in->clients;
    s->next_seq = in->next_seq;
    s->epoch = in->epoch;
    s->persist_s = in->persist_s;
    s->detached_ms = in->detached_ms;
    s->generation = in->generation;
    s->markers = in->markers;
    s->state = (Heapd__HeapState)in->state;
    s->resident_bytes = in->resident_bytes;
    s->host_copy_bytes = in->host_copy_bytes;
    s->releases = in->releases;
    s->restores = in->restores;
    s->eager_reclaims = in->eager_reclaims;
    s->spare_bytes = in->spare_bytes;
    s->grow_ahead = in->grow_ahead;
    s->trims = in->trims;
    s->trimmed_bytes = in->trimmed_bytes;
    s->collect_pending = in->collect_pending;
    s->pending_collect_seq = in->pending_collect_seq;
    s->device_free = in->device_free;
    s->device_total = in->device_total;
    s->ranks = rsp;
    s->n_ranks = in->n_ranks;
    for (size_t j = 0; j < in->n_ranks; j++) {
        const hd_rank_info *ri = &in->ranks[j];
        heapd__rank_stats__init(&rs[j]);
        rsp[j] = &rs[j];
        rs[j].rank = ri->rank;
        rs[j].attached = ri->attached;
        rs[j].live_bytes = ri->live_bytes;
        rs[j].released_bytes = ri->released_bytes;
        rs[j].next_seq = ri->next_seq;
        rs[j].pid = ri->pid;
        rs[j].stream_waiting = ri->stream_waiting;
        rs[j].device_waits_avoided = ri->device_waits_avoided;
    }
}

/* Issue 33 item 4: packs heap `in`'s HeapStats into m, with its ranks
 * (full) and without (bare). 0, or -1 (out of memory; m left empty). */
static int memo_build(const hd_heap_info *in, hd_stats_memo *m)
{
    size_t nr = in->n_ranks;
    Heapd__RankStats *rs = calloc(nr ? nr : 1, sizeof *rs);
    Heapd__RankStats **rsp = calloc(nr ? nr : 1, sizeof *rsp);
    Heapd__HeapStats hs;
    Heapd__HeapParams pp;
    Heapd__Histogram hg[2];
    uint64_t hn[2][HD_HIST_N];
    int rc = -1;
    free(m->full);
    free(m->bare);
    m->full = m->bare = NULL;
    if (!rs || !rsp)
        goto out;
    heap_stats(in, &hs, &pp, rs, rsp, hg, hn);
    m->full_len = heapd__heap_stats__get_packed_size(&hs);
    hs.n_ranks = 0;
    m->bare_len = heapd__heap_stats__get_packed_size(&hs);
    m->full = malloc(m->full_len ? m->full_len : 1);
    m->bare = malloc(m->bare_len ? m->bare_len : 1);
    if (!m->full || !m->bare) {
        free(m->full);
        free(m->bare);
        m->full = m->bare = NULL;
        goto out;
    }
    heapd__heap_stats__pack(&hs, m->bare);
    hs.n_ranks = nr;
    heapd__heap_stats__pack(&hs, m->full);
    rc = 0;
out:
    free(rs);
    free(rsp);
    return rc;
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* A StatsReply frame assembled from packed HeapStats: the bytes protobuf-c
 * would write (fields in number order: Frame.id, Frame.stats_reply; in it
 * StatsReply.heaps, number 1, then the rest). */
typedef struct stats_frame {
    uint64_t id;
    const hd_stats_memo *const *memo;
    size_t n;
    bool bare;
    const Heapd__StatsReply *rest; /* every field but heaps */
    size_t rest_len, sr_len;
} stats_frame;

#define TAG(num, wt) (((uint64_t)(num) << 3) | (wt))
enum { F_ID = 1, F_STATS_REPLY = HEAPD__FRAME__BODY_STATS_REPLY, SR_HEAPS = 1 };

static size_t heap_len(const stats_frame *sf, size_t i)
{
    return sf->bare ? sf->memo[i]->bare_len : sf->memo[i]->full_len;
}

static size_t stats_frame_len(stats_frame *sf)
{
    sf->sr_len = sf->rest_len;
    for (size_t i = 0; i < sf->n; i++)
        sf->sr_len += varint_len(TAG(SR_HEAPS, 2)) + varint_len(heap_len(sf, i)) + heap_len(sf, i);
    return (sf->id ? varint_len(TAG(F_ID, 0)) + varint_len(sf->id) : 0) + varint_len(TAG(F_STATS_REPLY, 2)) +
           varint_len(sf->sr_len) + sf->sr_len;
}

static void pack_stats_frame(const void *msg, uint8_t *p)
{
    const stats_frame *sf = msg;
    if (sf->id) {
        p = put_varint(p, TAG(F_ID, 0));
        p = put_varint(p, sf->id);
    }
    p = put_varint(p, TAG(F_STATS_REPLY, 2));
    p = put_varint(p, sf->sr_len);
    for (size_t i = 0; i < sf->n; i++) {
        size_t len = heap_len(sf, i);
        p = put_varint(p, TAG(SR_HEAPS, 2));
        p = put_varint(p, len);
        memcpy(p, sf->bare ? sf->memo[i]->bare : sf->memo[i]->full, len);
        p += len;
    }
    heapd__stats_reply__pack(sf->rest, p);
}

/* Each heap's figures come packed from its memo (built now unless the wing
 * found it valid; a heap without one gets a memo for this reply only). */
static void out_stats(hd_peer *p, uint64_t id, const hd_stats_out *so)
{
    size_t n = so->nheaps, built = 0;
    const hd_stats_memo **memo = calloc(n ? n : 1, sizeof *memo);
    hd_stats_memo *own = calloc(n ? n : 1, sizeof *own);
    bool ok = memo && own;
    for (size_t i = 0; ok && i < n; i++) {
        hd_heap_info *in = &so->heaps[i];
        hd_stats_memo *m = in->memo ? in->memo : &own[i];
        if (!(in->memo_valid && m->full))
            ok = memo_build(in, m) == 0;
        memo[i] = m;
        built = i + 1;
    }
    if (!ok) {
        send_error(p, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory", NULL);
        goto out;
    }
    Heapd__StatsReply sr = HEAPD__STATS_REPLY__INIT;
    sr.backend = (char *)so->backend;
    sr.clients = so->clients;
    sr.version = (char *)HEAPD_VERSION;
    sr.uptime_ms = so->uptime_ms;
    sr.store = (char *)(so->store ? so->store : "");
    sr.store_connected = so->store_connected;
    sr.quota_heap = so->quota_heap;
    sr.quota_uid = so->quota_uid;
    stats_frame sf = {.id = id, .memo = memo, .n = n, .rest = &sr};
    sf.rest_len = heapd__stats_reply__get_packed_size(&sr);
    size_t len = stats_frame_len(&sf);
    if (len > HW_FRAME_MAX - 1024) {
        /* Too many ranks to list in one frame: keep the per-heap figures. */
        sf.bare = true;
        len = stats_frame_len(&sf);
    }
    hd_frame_sink_send(sink_of(p), id, &sf, len, pack_stats_frame, NULL, 0);
out:
    for (size_t i = 0; own && i < built; i++) {
        free(own[i].full);
        free(own[i].bare);
    }
    free(memo);
    free(own);
}

const hd_reply_ops hd_reply_frame_ops = {
    .error = out_error,
    .attach = out_attach,
    .alloc = out_alloc,
    .free = out_free,
    .collect = out_collect,
    .detach = out_detach,
    .force = out_force,
    .stats = out_stats,
    .drop = out_drop,
    .commit = out_commit,
    .release = out_release,
    .restore = out_restore,
    .trim = out_trim,
};

/* Issue 16: the RingSetupReply; su's two fds go with it. */
void hd_reply_ring_setup(const hd_frame_sink *out, uint64_t id, const hd_ring_setup *su)
{
    Heapd__RingSetupReply r = HEAPD__RING_SETUP_REPLY__INIT;
    r.version = HR_VERSION;
    r.nslots = su->nslots;
    r.slot_size = su->slot_size;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_RING_SETUP_REPLY;
    f.ring_setup_reply = &r;
    int fds[2] = {su->memfd, su->doorbell};
    send_frame(out, &f, fds, 2);
}
