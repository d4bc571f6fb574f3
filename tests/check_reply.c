/*
 * check_reply.c - unit tests for daemon/reply.c over a recording frame sink
 * (frame_sink.h): every frame reply.c sends is decoded and kept with its id
 * and fds. Covers the heap wing's sink in frames (hd_reply_frame_ops):
 * errors, ids, each reply's body, a reply's chunks split into ChunkBatch
 * frames of 1024 fds, the status page's fd after the chunks, a Stats reply
 * too large for a frame, and the HelloReply and RingSetupReply. The fds are
 * numbers only: the recorder closes none.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_util.h"
#include "reply.h"
#include "../daemon/ring.h"
#include "wire.h"
#include "ring_layout.h"

#define MAXF 16

typedef struct rec {
    Heapd__Frame *f;
    uint64_t id;
    int *fds;
    size_t nfds;
    size_t len;
} rec;

static rec got[MAXF];
static int nrec, admits, closes;

static void rec_send(void *data, uint64_t id, const void *msg, size_t len, hd_frame_sink_pack_fn pack, int *fds,
                     size_t nfds)
{
    ck_assert_ptr_eq(data, &got);
    ck_assert_int_lt(nrec, MAXF);
    ck_assert_uint_le(len, HW_FRAME_MAX);
    ck_assert_uint_le(nfds, HW_FDS_MAX);
    uint8_t *buf = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(buf);
    pack(msg, buf);
    rec *r = &got[nrec++];
    r->f = heapd__frame__unpack(NULL, len, buf);
    free(buf);
    ck_assert_ptr_nonnull(r->f);
    r->id = id;
    r->len = len;
    r->nfds = nfds;
    r->fds = malloc((nfds ? nfds : 1) * sizeof *fds);
    ck_assert_ptr_nonnull(r->fds);
    if (nfds)
        memcpy(r->fds, fds, nfds * sizeof *fds);
}
static void rec_admit(void *data) { (void)data, admits++; }
static void rec_close(void *data) { (void)data, closes++; }
static const hd_frame_sink_ops rec_ops = {rec_send, rec_admit, rec_close};

static hd_frame_sink sink;
static hd_peer peer;

static void setup(void)
{
    nrec = admits = closes = 0;
    sink = (hd_frame_sink){&rec_ops, &got};
    memset(&peer, 0, sizeof peer);
    peer.pid = 77;
    peer.uid = 1000;
    peer.out = &hd_reply_frame_ops;
    peer.data = &sink;
}

static void teardown(void)
{
    for (int i = 0; i < nrec; i++) {
        heapd__frame__free_unpacked(got[i].f, NULL);
        free(got[i].fds);
    }
}

/* Frame i: its id is `id` (the sink's and the frame's), its body `bc`. */
static const Heapd__Frame *frame(int i, uint64_t id, Heapd__Frame__BodyCase bc)
{
    ck_assert_int_lt(i, nrec);
    ck_assert_uint_eq(got[i].id, id);
    ck_assert_uint_eq(got[i].f->id, id);
    ck_assert_int_eq(got[i].f->body_case, bc);
    return got[i].f;
}

START_TEST(errors_carry_code_message_and_id)
{
    hd_peer_error(&peer, 42, HEAPD__ERR_CODE__ERR_INVALID, "size %d is not a size", -3);
    hd_peer_error(&peer, 0, HEAPD__ERR_CODE__ERR_SHUTDOWN, "heapd is stopping");
    ck_assert_int_eq(nrec, 2);
    const Heapd__Frame *f = frame(0, 42, HEAPD__FRAME__BODY_ERROR);
    ck_assert_int_eq(f->error->code, HEAPD__ERR_CODE__ERR_INVALID);
    ck_assert_str_eq(f->error->message, "size -3 is not a size");
    ck_assert_uint_eq(got[0].nfds, 0);
    ck_assert_uint_eq(f->error->n_asym_ranks, 0); /* no figures but an asymmetry's */
    f = frame(1, 0, HEAPD__FRAME__BODY_ERROR);
    ck_assert_int_eq(f->error->code, HEAPD__ERR_CODE__ERR_SHUTDOWN);
    ck_assert_int_eq(admits + closes, 0);
}
END_TEST

/* An asymmetric allocation's figures go into the Error's fields (issue 31). */
START_TEST(asymmetry_figures_in_the_error)
{
    hd_asym_out a = {.n = 5, .nranks = 2, .ranks = {3, 1}, .sizes = {4096, 8192}};
    peer.out->error(&peer, 9, HEAPD__ERR_CODE__ERR_ASYMMETRY, "poisoned", &a);
    const Heapd__Frame *f = frame(0, 9, HEAPD__FRAME__BODY_ERROR);
    ck_assert_int_eq(f->error->code, HEAPD__ERR_CODE__ERR_ASYMMETRY);
    ck_assert_str_eq(f->error->message, "poisoned");
    ck_assert_uint_eq(f->error->asym_n, 5);
    ck_assert_uint_eq(f->error->n_asym_ranks, 2);
    ck_assert_uint_eq(f->error->n_asym_sizes, 2);
    ck_assert_uint_eq(f->error->asym_ranks[0], 3);
    ck_assert_uint_eq(f->error->asym_ranks[1], 1);
    ck_assert_uint_eq(f->error->asym_sizes[0], 4096);
    ck_assert_uint_eq(f->error->asym_sizes[1], 8192);
}
END_TEST

/* Issue 29: a name asymmetry's names ("": none) beside its figures. */
START_TEST(asymmetry_names_in_the_error)
{
    hd_asym_out a = {.n = 2, .nranks = 2, .ranks = {0, 1}, .sizes = {64, 64}, .with_names = true};
    a.names[0] = "w";
    peer.out->error(&peer, 4, HEAPD__ERR_CODE__ERR_ASYMMETRY, "names differ", &a);
    const Heapd__Error *e = frame(0, 4, HEAPD__FRAME__BODY_ERROR)->error;
    ck_assert_uint_eq(e->n_asym_names, 2);
    ck_assert_str_eq(e->asym_names[0], "w");
    ck_assert_str_eq(e->asym_names[1], "");
    ck_assert_uint_eq(e->asym_sizes[1], 64);
    peer.out->commit(&peer, 5, 77, 3);
    const Heapd__CommitReply *cr = frame(1, 5, HEAPD__FRAME__BODY_COMMIT_REPLY)->commit_reply;
    ck_assert_uint_eq(cr->value, 77);
    ck_assert_uint_eq(cr->generation, 3);
}
END_TEST

/* Issue 29: a live set of 40000 blocks goes in LiveBatch frames of 16384
 * first, the rest in the AttachReply, ascending seq, with the markers. */
START_TEST(live_set_split_into_batches)
{
    enum { N = 40000 };
    hd_live_block *lv = calloc(N, sizeof *lv);
    ck_assert_ptr_nonnull(lv);
    for (size_t i = 0; i < N; i++)
        lv[i] = (hd_live_block){i, i * 4096, 100, 4096, i % 2 ? "n" : NULL};
    hd_marker mk = {"step", 41, 7};
    ha_params ap;
    memset(&ap, 0, sizeof ap);
    ap.chunk_size = 1 << 20;
    hd_attach_out a = {.ap = &ap, .world_size = 1, .status_index = -1, .backend = "host"};
    a.live = lv;
    a.nlive = N;
    a.generation = 2;
    a.resumed = true;
    a.markers = &mk;
    a.nmarkers = 1;
    peer.out->attach(&peer, 6, &a);
    ck_assert_int_eq(nrec, 3);
    uint64_t seq = 0;
    for (int i = 0; i < 2; i++) {
        const Heapd__LiveBatch *b = frame(i, 6, HEAPD__FRAME__BODY_LIVE_BATCH)->live_batch;
        ck_assert_uint_eq(b->n_blocks, 16384);
        for (size_t j = 0; j < b->n_blocks; j++, seq++)
            ck_assert_uint_eq(b->blocks[j]->seq, seq);
    }
    const Heapd__AttachReply *ar = frame(2, 6, HEAPD__FRAME__BODY_ATTACH_REPLY)->attach_reply;
    ck_assert_uint_eq(ar->n_live, N - 2 * 16384);
    ck_assert_uint_eq(ar->live[0]->seq, seq);
    ck_assert_uint_eq(ar->live[0]->offset, seq * 4096);
    ck_assert_str_eq(ar->live[1]->name, "n");
    ck_assert_str_eq(ar->live[0]->name, "");
    ck_assert_uint_eq(ar->generation, 2);
    ck_assert(ar->resumed);
    ck_assert_uint_eq(ar->n_markers, 1);
    ck_assert_str_eq(ar->markers[0]->tag, "step");
    ck_assert_uint_eq(ar->markers[0]->value, 41);
    ck_assert_uint_eq(ar->markers[0]->seq, 7);
    free(lv);
}
END_TEST

START_TEST(small_replies)
{
    hd_reply_hello(&sink, 1, "host");
    peer.out->free(&peer, 2, 5);
    uint64_t offs[2] = {0, 8192};
    hd_op_out op = {.at = 12, .collect = true, .asked = true, .offsets = offs, .n = 2};
    hd_collect_out co = {.blocks = 10, .bytes = 4096, .collects = 7, .op = &op};
    peer.out->collect(&peer, 3, &co);
    peer.out->detach(&peer, 4);
    peer.out->force(&peer, 5, 99);
    int fds[2] = {101, 102};
    hd_ring_setup su = {fds[0], fds[1], 8, 2048};
    hd_reply_ring_setup(&sink, 6, &su);
    ck_assert_int_eq(nrec, 6);
    const Heapd__Frame *f = frame(0, 1, HEAPD__FRAME__BODY_HELLO_REPLY);
    ck_assert_uint_eq(f->hello_reply->version, HEAPD__CONST__PROTOCOL_VERSION);
    ck_assert_str_eq(f->hello_reply->backend, "host");
    ck_assert_uint_eq(frame(1, 2, HEAPD__FRAME__BODY_FREE_REPLY)->free_reply->accepted, 5);
    f = frame(2, 3, HEAPD__FRAME__BODY_COLLECT_REPLY);
    ck_assert_uint_eq(f->collect_reply->reclaimed_blocks, 10);
    ck_assert_uint_eq(f->collect_reply->reclaimed_bytes, 4096);
    ck_assert_uint_eq(f->collect_reply->collects, 7);
    /* issue 28: the collect's blocks for the replicas */
    ck_assert_uint_eq(f->collect_reply->n_ops, 1);
    ck_assert_uint_eq(f->collect_reply->ops[0]->at, 12);
    ck_assert(f->collect_reply->ops[0]->collect && f->collect_reply->ops[0]->asked);
    ck_assert_uint_eq(f->collect_reply->ops[0]->n_offsets, 2);
    ck_assert_uint_eq(f->collect_reply->ops[0]->offsets[1], 8192);
    frame(3, 4, HEAPD__FRAME__BODY_DETACH_REPLY);
    ck_assert_uint_eq(frame(4, 5, HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY)->force_collect_reply->at_seq, 99);
    f = frame(5, 6, HEAPD__FRAME__BODY_RING_SETUP_REPLY);
    ck_assert_uint_eq(f->ring_setup_reply->version, HR_VERSION);
    ck_assert_uint_eq(f->ring_setup_reply->nslots, 8);
    ck_assert_uint_eq(f->ring_setup_reply->slot_size, 2048);
    ck_assert_uint_eq(got[5].nfds, 2);
    ck_assert_int_eq(got[5].fds[0], 101);
    ck_assert_int_eq(got[5].fds[1], 102);
}
END_TEST

/* n chunk refs (rank i % 4, index i) and n + extra fds 1000 + i. */
static hd_chunk_ref *refs_of(size_t n, int **fds, size_t extra)
{
    hd_chunk_ref *r = calloc(n ? n : 1, sizeof *r);
    *fds = calloc(n + extra, sizeof **fds);
    ck_assert(r && *fds);
    for (size_t i = 0; i < n; i++)
        r[i] = (hd_chunk_ref){(uint32_t)(i % 4), (uint32_t)i};
    for (size_t i = 0; i < n + extra; i++)
        (*fds)[i] = 1000 + (int)i;
    return r;
}

/* Frames [0, nrec): chunks [0, n) in order, each frame's fd_index from 0
 * and its fds those of its chunks; returns the chunks the last frame has. */
static size_t check_chunks(size_t n, size_t extra)
{
    size_t seen = 0;
    for (int i = 0; i < nrec; i++) {
        const Heapd__Frame *f = got[i].f;
        Heapd__ChunkRef **c;
        size_t k;
        if (i < nrec - 1) {
            ck_assert_int_eq(f->body_case, HEAPD__FRAME__BODY_CHUNK_BATCH);
            c = f->chunk_batch->chunks, k = f->chunk_batch->n_chunks;
            ck_assert_uint_eq(k, HW_FDS_MAX);
            ck_assert_uint_eq(got[i].nfds, k);
        } else if (f->body_case == HEAPD__FRAME__BODY_ATTACH_REPLY) {
            c = f->attach_reply->chunks, k = f->attach_reply->n_chunks;
            ck_assert_uint_eq(got[i].nfds, k + extra);
        } else {
            ck_assert_int_eq(f->body_case, HEAPD__FRAME__BODY_ALLOC_REPLY);
            c = f->alloc_reply->new_chunks, k = f->alloc_reply->n_new_chunks;
            ck_assert_uint_eq(got[i].nfds, k);
        }
        for (size_t j = 0; j < k; j++) {
            ck_assert_uint_eq(c[j]->index, seen + j);
            ck_assert_uint_eq(c[j]->rank, (seen + j) % 4);
            ck_assert_uint_eq(c[j]->fd_index, j);
            ck_assert_int_eq(got[i].fds[j], 1000 + (int)(seen + j));
        }
        if (i == nrec - 1) {
            ck_assert_uint_eq(seen + k, n);
            return k;
        }
        seen += k;
    }
    ck_abort_msg("no frame");
    return 0;
}

/* An attach of n chunks and a status page: ceil((n + 1) / 1024) - 1
 * ChunkBatch frames, then the AttachReply; all with the request's id. */
static void attach_of(size_t n, int nframes)
{
    int *fds;
    hd_chunk_ref *r = refs_of(n, &fds, 1);
    ha_params ap;
    memset(&ap, 0, sizeof ap);
    ap.chunk_size = 1 << 20;
    ap.policy = HA_POLICY_SEED;
    uint32_t local[2] = {0, 1};
    hd_attach_out a = {.ap = &ap,
                       .timeout_ms = 500,
                       .world_size = 4,
                       .local_ranks = local,
                       .nlocal = 2,
                       .mapped = n << 20,
                       .chunks = r,
                       .nchunks = n,
                       .fds = fds,
                       .nfds = n + 1,
                       .status_index = (int)n,
                       .next_seq = 12,
                       .backend = "host",
                       .epoch = 3};
    peer.out->attach(&peer, 9, &a);
    ck_assert_int_eq(nrec, nframes);
    for (int i = 0; i < nrec; i++)
        ck_assert_uint_eq(got[i].id, 9);
    size_t k = check_chunks(n, 1);
    const Heapd__AttachReply *ar = frame(nrec - 1, 9, HEAPD__FRAME__BODY_ATTACH_REPLY)->attach_reply;
    ck_assert_int_eq(ar->status_fd_index, (int)k);
    ck_assert_int_eq(got[nrec - 1].fds[k], 1000 + (int)n);
    ck_assert_uint_eq(ar->world_size, 4);
    ck_assert_uint_eq(ar->n_local_ranks, 2);
    ck_assert_uint_eq(ar->mapped, n << 20);
    ck_assert_uint_eq(ar->next_seq, 12);
    ck_assert_uint_eq(ar->epoch, 3);
    ck_assert_str_eq(ar->backend, "host");
    ck_assert_uint_eq(ar->params->chunk_size, 1 << 20);
    ck_assert_uint_eq(ar->params->collect_timeout_ms, 500);
    ck_assert_int_eq(ar->params->policy, HEAPD__POLICY__POLICY_SEED);
    free(r);
    free(fds);
}

START_TEST(attach_fits_one_frame) { attach_of(HW_FDS_MAX - 1, 1); }
END_TEST
START_TEST(attach_status_page_alone) { attach_of(HW_FDS_MAX, 2); }
END_TEST
START_TEST(attach_split_into_batches) { attach_of(2500, 3); }
END_TEST

START_TEST(alloc_split_into_batches)
{
    int *fds;
    size_t n = 1500;
    hd_chunk_ref *r = refs_of(n, &fds, 0);
    hd_alloc_out a = {.seq = 5,
                      .offset = 4096,
                      .block_size = 8192,
                      .mapped = n << 20,
                      .collect_needed = false,
                      .new_chunks = r,
                      .fds = fds,
                      .nchunks = n};
    peer.out->alloc(&peer, 11, &a);
    ck_assert_int_eq(nrec, 2);
    ck_assert_uint_eq(got[0].id, 11);
    ck_assert_uint_eq(check_chunks(n, 0), n - HW_FDS_MAX);
    const Heapd__AllocReply *ar = frame(1, 11, HEAPD__FRAME__BODY_ALLOC_REPLY)->alloc_reply;
    ck_assert_uint_eq(ar->seq, 5);
    ck_assert_uint_eq(ar->offset, 4096);
    ck_assert_uint_eq(ar->block_size, 8192);
    ck_assert(!ar->collect_needed);
    free(r);
    free(fds);
}
END_TEST

START_TEST(stats_too_large_drops_rank_lists)
{
    size_t nr = 300000; /* a RankStats each: far beyond a frame */
    hd_rank_info *ri = calloc(nr, sizeof *ri);
    ck_assert_ptr_nonnull(ri);
    for (size_t i = 0; i < nr; i++)
        ri[i] = (hd_rank_info){.rank = (uint32_t)i, .attached = true, .live_bytes = 1u << 30, .pid = 4000000};
    ha_params ap;
    memset(&ap, 0, sizeof ap);
    ap.chunk_size = 1 << 20;
    hd_heap_info h[2] = {
        {.name = "big", .world_size = (uint32_t)nr, .ap = &ap, .mapped = 7, .ranks = ri, .n_ranks = nr},
        {.name = "small", .world_size = 1, .ap = &ap, .mapped = 9, .ranks = ri, .n_ranks = 1}};
    hd_stats_out so = {.heaps = h, .nheaps = 2, .backend = "host", .clients = 3, .store = NULL};
    peer.out->stats(&peer, 13, &so);
    ck_assert_int_eq(nrec, 1);
    const Heapd__StatsReply *sr = frame(0, 13, HEAPD__FRAME__BODY_STATS_REPLY)->stats_reply;
    ck_assert_uint_le(got[0].len, HW_FRAME_MAX);
    ck_assert_uint_eq(sr->n_heaps, 2);
    ck_assert_str_eq(sr->heaps[0]->name, "big");
    ck_assert_uint_eq(sr->heaps[0]->world_size, nr);
    ck_assert_uint_eq(sr->heaps[0]->mapped, 7);
    ck_assert_uint_eq(sr->heaps[0]->n_ranks, 0);
    ck_assert_uint_eq(sr->heaps[1]->n_ranks, 0);
    ck_assert_str_eq(sr->store, "");
    ck_assert_uint_eq(sr->clients, 3);
    /* One that fits keeps its ranks. */
    so.nheaps = 1;
    so.heaps = &h[1];
    peer.out->stats(&peer, 14, &so);
    sr = frame(1, 14, HEAPD__FRAME__BODY_STATS_REPLY)->stats_reply;
    ck_assert_uint_eq(sr->heaps[0]->n_ranks, 1);
    ck_assert_uint_eq(sr->heaps[0]->ranks[0]->pid, 4000000);
    free(ri);
}
END_TEST

/* Issue 33 item 4: a heap's memo is built once, then answers alone (the
 * wing leaves the figures empty), with the bytes protobuf-c writes. */
START_TEST(stats_memo_reused)
{
    hd_rank_info ri[3] = {{.rank = 0, .pid = 11}, {.rank = 1, .pid = 12}, {.rank = 2, .pid = 13, .live_bytes = 5}};
    ha_params ap;
    memset(&ap, 0, sizeof ap);
    ap.chunk_size = 1 << 20;
    hd_stats_memo memo = {0};
    hd_heap_info h = {.memo = &memo, .name = "m", .world_size = 3, .ap = &ap, .mapped = 7, .ranks = ri, .n_ranks = 3};
    hd_stats_out so = {.heaps = &h, .nheaps = 1, .backend = "host", .clients = 2, .uptime_ms = 99};
    peer.out->stats(&peer, 21, &so);
    ck_assert_ptr_nonnull(memo.full);
    ck_assert_ptr_nonnull(memo.bare);
    hd_heap_info v = {.memo = &memo, .memo_valid = true}; /* no figures: the memo's */
    so.heaps = &v;
    so.clients = 4;
    peer.out->stats(&peer, 300, &so);
    for (int i = 0; i < 2; i++) {
        const Heapd__StatsReply *sr = frame(i, i ? 300 : 21, HEAPD__FRAME__BODY_STATS_REPLY)->stats_reply;
        ck_assert_uint_eq(heapd__frame__get_packed_size(got[i].f), got[i].len);
        ck_assert_uint_eq(sr->n_heaps, 1);
        ck_assert_str_eq(sr->heaps[0]->name, "m");
        ck_assert_uint_eq(sr->heaps[0]->mapped, 7);
        ck_assert_uint_eq(sr->heaps[0]->n_ranks, 3);
        ck_assert_uint_eq(sr->heaps[0]->ranks[2]->pid, 13);
        ck_assert_uint_eq(sr->heaps[0]->ranks[2]->live_bytes, 5);
        ck_assert_uint_eq(sr->clients, i ? 4 : 2); /* the rest is always fresh */
        ck_assert_uint_eq(sr->uptime_ms, 99);
        ck_assert_str_eq(sr->backend, "host");
    }
    free(memo.full);
    free(memo.bare);
}
END_TEST

static Suite *reply_suite(void)
{
    Suite *su = suite_create("reply");
    TCase *tc = tcase_create("frames");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, errors_carry_code_message_and_id);
    tcase_add_test(tc, asymmetry_figures_in_the_error);
    tcase_add_test(tc, asymmetry_names_in_the_error);
    tcase_add_test(tc, live_set_split_into_batches);
    tcase_add_test(tc, small_replies);
    tcase_add_test(tc, attach_fits_one_frame);
    tcase_add_test(tc, attach_status_page_alone);
    tcase_add_test(tc, attach_split_into_batches);
    tcase_add_test(tc, alloc_split_into_batches);
    tcase_add_test(tc, stats_too_large_drops_rank_lists);
    tcase_add_test(tc, stats_memo_reused);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) { return cku_run(reply_suite()); }
