/* fuzz_dispatch.c - libFuzzer target: daemon/dispatch.c's frame input
 * (hd_dispatch_frame: protobuf decoding, every state check, the call into
 * the heap wing) and daemon/reply.c behind it, with 6 clients as sessions
 * that are no connection: each has this file's frame sink, which decodes
 * reply.c's frames (ChunkBatch frames put back together) into calls of
 * fuzz_wing.h's checking sink, and records closes.
 *
 * Input: a config byte, then steps of an opcode byte (low 4 bits: what,
 * high bits: which client) and its arguments:
 *   0 a request (fuzz_wing.h's fw_request: kind byte 0..8, hello and commit
 *     included),
 *     packed into a Frame, then a byte m: below 200 sent whole, 200..227 cut
 *     to (m - 200)/28 of its length, above 227 one byte changed (position
 *     and xor from the input)
 *   1 raw bytes as a frame (length: 2 bytes, at most 1023)
 *   2 disconnect (hd_dispatch_closed; the client comes back as a new
 *     session)   3 tick (1 ms timeouts)
 *   4 a request as in 0 that came with 1..3 fds (the transport closed them)
 *   5 round: every client bound to a heap sends Alloc of one size at its
 *     next number, and Collect when told to; on a heap with local_every
 *     (issue 28) a client decides what another was given without heapd and
 *     tells it with its next Alloc (replica records)
 *   6 heapd stopping: the unsolicited ERR_SHUTDOWN (hd_dispatch_stop)
 * hd_heap_validate after every step; fuzz_wing.h's checks; a HelloReply
 * names the backend; a client told to close gets nothing more. */
#include "dispatch.h"
#include "fuzz_wing.h"
#include "wire.h"

static hd_dispatch *disp;
static hd_session *sess[NPEER];
static bool closing[NPEER];

static hd_peer *fw_peer(int i)
{
    static hd_peer none; /* a client between two sessions: bound to nothing */
    return sess[i] ? hd_dispatch_session_peer(sess[i]) : &none;
}

/* ---- client i's frame sink: reply.c's frames, decoded for fw_sink -------- */

/* ChunkBatch frames received before their reply: their chunks and fds. */
typedef struct batch {
    hd_chunk_ref *refs;
    int *fds;
    size_t n, cap;
} batch;
static batch batches[NPEER];

static void batch_add(batch *b, const hd_chunk_ref *r, const int *fd)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->refs = realloc(b->refs, b->cap * sizeof *b->refs);
        b->fds = realloc(b->fds, b->cap * sizeof *b->fds);
        CHECK(b->refs && b->fds, "out of memory");
    }
    b->refs[b->n] = *r;
    b->fds[b->n++] = *fd;
}

/* The batches' chunks, then a reply's n chunks (their fds from fds[]), then
 * `extra` fds; b is emptied for the next reply. */
static void batch_take(batch *b, Heapd__ChunkRef **refs, size_t n, const int *fds, size_t nfds, size_t extra)
{
    CHECK(nfds == n + extra, "a reply of %zu chunks (+%zu) with %zu fds", n, extra, nfds);
    for (size_t k = 0; k < n; k++) {
        CHECK(refs[k]->fd_index == k, "chunk %zu has fd_index %u", k, refs[k]->fd_index);
        batch_add(b, &(hd_chunk_ref){refs[k]->rank, refs[k]->index}, &fds[k]);
    }
    for (size_t k = 0; k < extra; k++)
        batch_add(b, &(hd_chunk_ref){0, 0}, &fds[n + k]);
}

static void f_attach(hd_peer *q, uint64_t id, const Heapd__AttachReply *r, int *fds, size_t nfds)
{
    batch *b = &batches[fw_index(q)];
    size_t before = b->n, extra = r->status_fd_index >= 0;
    CHECK(r->status_fd_index < 0 || (size_t)r->status_fd_index == r->n_chunks, "status page at %d of %zu chunks",
          r->status_fd_index, r->n_chunks);
    batch_take(b, r->chunks, r->n_chunks, fds, nfds, extra);
    ha_params ap = {0};
    ap.chunk_size = r->params ? r->params->chunk_size : 0;
    hd_attach_out a = {.ap = &ap,
                       .world_size = r->world_size,
                       .local_ranks = r->local_ranks,
                       .nlocal = r->n_local_ranks,
                       .mapped = r->mapped,
                       .chunks = b->refs,
                       .nchunks = b->n - extra,
                       .fds = b->fds,
                       .nfds = b->n,
                       .status_index = extra ? (int)(before + r->n_chunks) : -1,
                       .next_seq = r->next_seq,
                       .backend = r->backend,
                       .epoch = r->epoch,
                       .local_every = r->params ? r->params->local_every : 0};
    fw_sink.attach(q, id, &a);
    b->n = 0;
}

/* Issue 28: a reply's HeapOps (at most one) as the wing's sink sees them. */
static const hd_op_out *f_op(Heapd__HeapOp **ops, size_t n, hd_op_out *o)
{
    CHECK(n <= 1, "a reply with %zu HeapOps", n);
    if (!n)
        return NULL;
    *o = (hd_op_out){.at = ops[0]->at,
                     .collect = ops[0]->collect,
                     .asked = ops[0]->asked,
                     .offsets = ops[0]->offsets,
                     .n = ops[0]->n_offsets};
    return o;
}

static void f_alloc(hd_peer *q, uint64_t id, const Heapd__AllocReply *r, int *fds, size_t nfds)
{
    batch *b = &batches[fw_index(q)];
    hd_op_out op;
    batch_take(b, r->new_chunks, r->n_new_chunks, fds, nfds, 0);
    hd_alloc_out a = {.seq = r->seq,
                      .offset = r->offset,
                      .block_size = r->block_size,
                      .mapped = r->mapped,
                      .collect_needed = r->collect_needed,
                      .new_chunks = b->refs,
                      .fds = b->fds,
                      .nchunks = b->n,
                      .op = f_op(r->ops, r->n_ops, &op)};
    fw_sink.alloc(q, id, &a);
    b->n = 0;
}

static void f_stats(hd_peer *q, uint64_t id, const Heapd__StatsReply *r)
{
    hd_heap_info *h = calloc(r->n_heaps ? r->n_heaps : 1, sizeof *h);
    CHECK(h, "out of memory");
    for (size_t k = 0; k < r->n_heaps; k++) {
        const Heapd__HeapStats *x = r->heaps[k];
        h[k].name = x->name;
        h[k].world_size = x->world_size;
        h[k].mapped = x->mapped;
        h[k].free_bytes = x->free_bytes;
        /* reply.c drops every rank list of a reply that would not fit. */
        h[k].n_ranks = x->n_ranks ? x->n_ranks : x->world_size;
    }
    hd_stats_out so = {.heaps = h, .nheaps = r->n_heaps, .backend = r->backend, .clients = r->clients};
    fw_sink.stats(q, id, &so);
    free(h);
}

static void f_hello(int i, const Heapd__HelloReply *r)
{
    TRACE("%d: hello\n", i);
    CHECK(!closing[i], "a HelloReply to a client told to close");
    CHECK(r->backend && !strcmp(r->backend, "host"), "HelloReply names backend \"%s\"",
          r->backend ? r->backend : "(null)");
}

/* An Error frame, its asymmetry figures (issue 31) decoded, to the wing's
 * checking sink. */
static void fw_error(hd_peer *q, const Heapd__Frame *f)
{
    const Heapd__Error *e = f->error;
    CHECK(e->n_asym_ranks == e->n_asym_sizes && e->n_asym_ranks <= HD_ASYM_RANKS,
          "an Error with %zu asymmetry ranks and %zu sizes", e->n_asym_ranks, e->n_asym_sizes);
    hd_asym_out a = {.n = e->asym_n, .nranks = (uint32_t)e->n_asym_ranks, .with_names = e->n_asym_names > 0};
    CHECK(!e->n_asym_names || e->n_asym_names == e->n_asym_ranks, "an Error with %zu asymmetry ranks and %zu names",
          e->n_asym_ranks, e->n_asym_names);
    for (size_t k = 0; k < e->n_asym_ranks && k < HD_ASYM_RANKS; k++) {
        a.ranks[k] = e->asym_ranks[k];
        a.sizes[k] = e->asym_sizes[k];
    }
    fw_sink.error(q, f->id, e->code, e->message, a.nranks ? &a : NULL);
}

static void f_frame(int i, hd_peer *q, const Heapd__Frame *f, int *fds, size_t nfds)
{
    switch (f->body_case) {
    case HEAPD__FRAME__BODY_ERROR:
        /* An Error may end a reply whose ChunkBatch frames went out (out
         * of memory): their fds are the client's to close. */
        fw_take_fds(batches[i].fds, batches[i].n, "ChunkBatch before an Error");
        batches[i].n = 0;
        fw_error(q, f);
        break;
    case HEAPD__FRAME__BODY_HELLO_REPLY:
        f_hello(i, f->hello_reply);
        break;
    case HEAPD__FRAME__BODY_CHUNK_BATCH:
        CHECK(f->chunk_batch->n_chunks == nfds && nfds, "a ChunkBatch of %zu chunks with %zu fds",
              f->chunk_batch->n_chunks, nfds);
        batch_take(&batches[i], f->chunk_batch->chunks, f->chunk_batch->n_chunks, fds, nfds, 0);
        return;
    case HEAPD__FRAME__BODY_ATTACH_REPLY:
        f_attach(q, f->id, f->attach_reply, fds, nfds);
        return;
    case HEAPD__FRAME__BODY_ALLOC_REPLY:
        f_alloc(q, f->id, f->alloc_reply, fds, nfds);
        return;
    case HEAPD__FRAME__BODY_FREE_REPLY:
        fw_sink.free(q, f->id, f->free_reply->accepted);
        break;
    case HEAPD__FRAME__BODY_COLLECT_REPLY: {
        const Heapd__CollectReply *c = f->collect_reply;
        hd_op_out op;
        hd_collect_out o = {.blocks = c->reclaimed_blocks,
                            .bytes = c->reclaimed_bytes,
                            .collects = c->collects,
                            .op = f_op(c->ops, c->n_ops, &op),
                            .omitted = c->ops_omitted};
        fw_sink.collect(q, f->id, &o);
        break;
    }
    case HEAPD__FRAME__BODY_DETACH_REPLY:
        fw_sink.detach(q, f->id);
        break;
    case HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY:
        fw_sink.force(q, f->id, f->force_collect_reply->at_seq);
        break;
    case HEAPD__FRAME__BODY_STATS_REPLY:
        f_stats(q, f->id, f->stats_reply);
        break;
    case HEAPD__FRAME__BODY_COMMIT_REPLY:
        fw_sink.commit(q, f->id, f->commit_reply->value, f->commit_reply->generation);
        break;
    case HEAPD__FRAME__BODY_LIVE_BATCH: /* issue 29: between ChunkBatch frames and the AttachReply */
        CHECK(nfds == 0 && f->live_batch->n_blocks, "a LiveBatch of %zu blocks with %zu fds", f->live_batch->n_blocks,
              nfds);
        return;
    default:
        CHECK(0, "client %d: a frame of type %d", i, (int)f->body_case);
    }
    CHECK(nfds == 0, "a frame of type %d with %zu fds", (int)f->body_case, nfds);
    CHECK(batches[i].n == 0, "%zu chunks of ChunkBatch frames before a frame of type %d", batches[i].n,
          (int)f->body_case);
}

static void c_send(void *data, uint64_t id, const void *msg, size_t len, hd_frame_sink_pack_fn pack, int *fds,
                   size_t nfds)
{
    int i = (int)(intptr_t)data;
    static uint8_t *buf;
    static size_t cap;
    CHECK(len <= HW_FRAME_MAX, "a %zu-byte frame", len);
    if (len > cap) {
        free(buf);
        cap = len;
        CHECK(buf = malloc(cap), "out of memory");
    }
    pack(msg, buf);
    Heapd__Frame *f = heapd__frame__unpack(NULL, len, buf);
    CHECK(f, "client %d: reply.c sent a %zu-byte frame that does not decode", i, len);
    CHECK(f->id == id, "a frame of id %llu sent as %llu", (unsigned long long)f->id, (unsigned long long)id);
    hd_peer q = {0}; /* what fw_sink knows of a client: its index */
    q.data = (void *)(intptr_t)i;
    f_frame(i, &q, f, fds, nfds);
    heapd__frame__free_unpacked(f, NULL);
}

static void c_admit(void *data) { (void)data; }
static void c_close(void *data) { closing[(intptr_t)data] = true; }
static const hd_frame_sink_ops c_ops = {c_send, c_admit, c_close};

static int c_privileged(void *data, long gid)
{
    (void)gid;
    return fw_peer((int)(intptr_t)data)->uid == 0;
}

static void open_session(int i, uint8_t b)
{
    hd_peer p;
    fw_peer_init(&p, i, b);
    hd_client c = {.pid = p.pid, .uid = p.uid, .privileged = c_privileged, .sink = {&c_ops, (void *)(intptr_t)i}};
    sess[i] = hd_dispatch_session_new(&c);
    CHECK(sess[i], "hd_dispatch_session_new");
    closing[i] = false;
}

/* The transport closes a client it was told to close once its replies are
 * out: here, before its next frame. */
static void reopen_if_closing(int i)
{
    if (!closing[i])
        return;
    hd_dispatch_closed(disp, sess[i]);
    open_session(i, 0);
}

static void send_frame(int i, const uint8_t *buf, size_t len, size_t nfds)
{
    reopen_if_closing(i);
    hd_frame_in fin = {.via = HD_VIA_STREAM, .data = buf, .len = len, .nfds = nfds};
    hd_dispatch_frame(disp, sess[i], &fin);
}

static void fw_deliver_free(int i, Heapd__Free *m)
{
    uint8_t buf[64 + 2 * NPEND * 10];
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 4;
    f.body_case = HEAPD__FRAME__BODY_FREE;
    f.free = m;
    send_frame(i, buf, heapd__frame__pack(&f, buf), 0);
}

static void send_req(fw_input *in, int i, size_t nfds)
{
    static fw_req r;
    static uint8_t buf[1 << 17]; /* issue 28: up to NREC records */
    fw_request(in, i, in8(in) % 9, &r);
    size_t len = heapd__frame__get_packed_size(&r.f);
    CHECK(len <= sizeof buf, "a %zu-byte request", len);
    heapd__frame__pack(&r.f, buf);
    uint8_t m = in8(in);
    if (m >= 200 && m < 228) {
        len = len * (size_t)(m - 200) / 28;
    } else if (m >= 228 && len) {
        size_t at = in16(in) % len;
        buf[at] ^= (uint8_t)(in8(in) | 1);
    }
    if (m >= 200) /* what heapd got is not what the client asked for */
        fw_cl[i].ask_seq = UINT64_MAX;
    uint64_t before = fw_rank_next(i);
    send_frame(i, buf, len, nfds);
    if (r.nrec)
        fw_rec_after(i, before, r.rec_from, r.rec, r.nrec, m < 200);
}

static void round_all(fw_input *in)
{
    uint64_t size = fw_size(in);
    int start = in8(in) % NPEER;
    for (int k = 0; k < NPEER; k++) {
        int i = (start + k) % NPEER;
        fw_sync(i);
        if (!fw_peer(i)->bind.heap)
            continue;
        if (fw_round_local(i, size))
            continue;
        uint8_t buf[64 + 2 * NPEND * 10];
        fw_client *cl = &fw_cl[i];
        Heapd__Alloc m = HEAPD__ALLOC__INIT;
        m.seq = cl->ask_seq = cl->next_seq + cl->npend;
        m.size = cl->ask_size = size;
        m.decided_from = cl->next_seq; /* issue 28: its pending records */
        m.decided = cl->pend;
        m.n_decided = 2 * cl->npend;
        Heapd__Frame f = HEAPD__FRAME__INIT;
        f.id = 1;
        f.body_case = HEAPD__FRAME__BODY_ALLOC;
        f.alloc = &m;
        uint64_t before = fw_rank_next(i);
        send_frame(i, buf, heapd__frame__pack(&f, buf), 0);
        if (m.n_decided)
            fw_rec_after(i, before, m.decided_from, m.decided, m.n_decided, 1);
        fw_validate("a round's alloc");
        fw_sync(i);
        if (fw_peer(i)->bind.heap && fw_cl[i].next_seq <= m.seq) {
            Heapd__Collect c = HEAPD__COLLECT__INIT;
            c.seq = fw_cl[i].next_seq;
            f.id = 2;
            f.body_case = HEAPD__FRAME__BODY_COLLECT;
            f.collect = &c;
            send_frame(i, buf, heapd__frame__pack(&f, buf), 0);
            fw_validate("a round's collect");
        }
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fw_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *what[] = {"a request",          "raw bytes", "disconnect", "tick",
                                 "a request with fds", "round",     "stop notice"};
    static uint8_t raw[1024];
    fw_input in = {data, size, 0};
    int fds0 = fw_count_fds();
    fw_begin(&in, fds0);
    CHECK(hd_dispatch_create(fw_reg, "host", &disp) == 0, "hd_dispatch_create");
    for (int i = 0; i < NPEER; i++)
        open_session(i, 0);
    while (!in_done(&in)) {
        uint8_t op = in8(&in);
        int i = (op >> 4) % NPEER;
        int k = (op & 15) % 7;
        switch (k) {
        case 0:
            send_req(&in, i, 0);
            break;
        case 1: {
            size_t len = in16(&in) % sizeof raw;
            for (size_t j = 0; j < len; j++)
                raw[j] = in8(&in);
            send_frame(i, raw, len, 0);
            break;
        }
        case 2:
            hd_dispatch_closed(disp, sess[i]);
            open_session(i, in8(&in));
            break;
        case 3:
            fw_tick();
            break;
        case 4:
            send_req(&in, i, 1 + in8(&in) % 3);
            break;
        case 5:
            round_all(&in);
            break;
        default:
            hd_dispatch_stop(sess[i]);
            break;
        }
        fw_validate(what[k]);
    }
    for (int i = 0; i < NPEER; i++) {
        hd_dispatch_closed(disp, sess[i]);
        sess[i] = NULL;
        fw_validate("a disconnect at the end");
    }
    hd_dispatch_destroy(disp);
    for (int i = 0; i < NPEER; i++)
        CHECK(batches[i].n == 0, "client %d: %zu chunks of ChunkBatch frames without their reply", i, batches[i].n);
    fw_end(fds0);
    return 0;
}
