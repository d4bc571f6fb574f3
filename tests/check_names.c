/*
 * check_names.c - unit tests for the heap wing's issue-29 parts: allocation
 * names and their symmetry, the block table and live sets, generations,
 * re-attach numbering, commit markers and the gone-rank semantics. Like
 * check_heap.c: requests go in decoded, answers come back through a
 * recording sink (the latest answer per peer), the host backend makes the
 * chunks. Heaps go with their last client here (persist is another part of
 * issue 29), so every re-attach happens while a peer stays attached.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "check_util.h"
#include "heap.h"

#define NPEER 4

/* ---- the recording sink: the latest answer of each peer ----------------- */

typedef enum { R_NONE, R_ERROR, R_ATTACH, R_ALLOC, R_FREE, R_COLLECT, R_DETACH, R_STATS, R_COMMIT } rec_kind;

typedef struct rec {
    rec_kind kind;
    Heapd__ErrCode code;
    char msg[1500];
    hd_asym_out asym;
    char names[HD_ASYM_RANKS][300]; /* asym.names[i] copied ("": NULL) */
    bool named[HD_ASYM_RANKS];
    uint64_t seq, offset, next_seq, generation, value;
    bool resumed, collect_needed;
    hd_live_block *live; /* names copied into live_names */
    char (*live_names)[256];
    size_t nlive;
    hd_marker markers[70];
    size_t nmarkers;
    uint32_t stat_markers;
    uint64_t bookkeeping;
    int count; /* answers so far */
} rec;

static rec recs[NPEER];

static rec *record(hd_peer *p, rec_kind kind)
{
    rec *r = &recs[(intptr_t)p->data];
    int count = r->count;
    free(r->live);
    free(r->live_names);
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->count = count + 1;
    return r;
}

static void close_all(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

static void s_error(hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg, const hd_asym_out *asym)
{
    (void)id;
    rec *r = record(p, R_ERROR);
    r->code = code;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    if (asym) {
        r->asym = *asym;
        for (int i = 0; i < HD_ASYM_RANKS; i++) {
            r->named[i] = asym->names[i] != NULL;
            snprintf(r->names[i], sizeof r->names[i], "%s", asym->names[i] ? asym->names[i] : "");
            r->asym.names[i] = NULL;
        }
    }
}

static void s_attach(hd_peer *p, uint64_t id, const hd_attach_out *a)
{
    (void)id;
    rec *r = record(p, R_ATTACH);
    r->next_seq = a->next_seq;
    r->generation = a->generation;
    r->resumed = a->resumed;
    r->nlive = a->nlive;
    r->live = calloc(a->nlive + 1, sizeof *r->live);
    r->live_names = calloc(a->nlive + 1, sizeof *r->live_names);
    ck_assert(r->live && r->live_names);
    for (size_t i = 0; i < a->nlive; i++) {
        r->live[i] = a->live[i];
        snprintf(r->live_names[i], sizeof r->live_names[i], "%s", a->live[i].name ? a->live[i].name : "");
        r->live[i].name = a->live[i].name ? r->live_names[i] : NULL;
    }
    ck_assert_uint_le(a->nmarkers, 70);
    if (a->nmarkers)
        memcpy(r->markers, a->markers, a->nmarkers * sizeof *a->markers);
    r->nmarkers = a->nmarkers;
    close_all(a->fds, a->nfds);
}

static void s_alloc(hd_peer *p, uint64_t id, const hd_alloc_out *a)
{
    (void)id;
    rec *r = record(p, R_ALLOC);
    r->seq = a->seq;
    r->offset = a->offset;
    r->collect_needed = a->collect_needed;
    close_all(a->fds, a->nchunks);
}

static void s_free(hd_peer *p, uint64_t id, uint32_t accepted) { (void)id, (void)accepted, record(p, R_FREE); }

static void s_collect(hd_peer *p, uint64_t id, uint64_t blocks, uint64_t bytes, uint64_t collects)
{
    (void)id, (void)blocks, (void)bytes, (void)collects;
    record(p, R_COLLECT);
}

static void s_detach(hd_peer *p, uint64_t id) { (void)id, record(p, R_DETACH); }

static void s_force(hd_peer *p, uint64_t id, uint64_t at_seq) { (void)p, (void)id, (void)at_seq; }

static void s_stats(hd_peer *p, uint64_t id, const hd_stats_out *s)
{
    (void)id;
    rec *r = record(p, R_STATS);
    ck_assert_uint_eq(s->nheaps, 1);
    r->generation = s->heaps[0].generation;
    r->stat_markers = s->heaps[0].markers;
    r->bookkeeping = s->heaps[0].bookkeeping_bytes;
}

static void s_commit(hd_peer *p, uint64_t id, uint64_t value, uint64_t generation)
{
    (void)id;
    rec *r = record(p, R_COMMIT);
    r->value = value;
    r->generation = generation;
}

static const hd_reply_ops sink = {.error = s_error,
                                  .attach = s_attach,
                                  .alloc = s_alloc,
                                  .free = s_free,
                                  .collect = s_collect,
                                  .detach = s_detach,
                                  .force = s_force,
                                  .stats = s_stats,
                                  .commit = s_commit}; /* drop: tests/check_persist.c */

/* ---- fixture ------------------------------------------------------------ */

static uv_loop_t loop;
static hb_backend *be;
static hd_registry *reg;
static hd_peer peers[NPEER];
static int fds_before;
static uint32_t persist_s; /* the heaps' HeapParams.persist_s (0: none) */

static int privileged(const hd_peer *p, long gid)
{
    (void)gid;
    return p->uid == 0;
}

static void setup(void)
{
    char err[256];
    fds_before = cku_count_fds();
    memset(recs, 0, sizeof recs);
    persist_s = 0;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_msg(hb_open("host", &be, err, sizeof err) == 0, "%s", err);
    hd_config cfg;
    hd_config_defaults(&cfg);
    ck_assert_int_eq(hd_registry_create(&loop, be, &cfg, &reg), 0);
    for (int i = 0; i < NPEER; i++) {
        memset(&peers[i], 0, sizeof peers[i]);
        peers[i].pid = 2000 + i;
        peers[i].uid = 4242;
        peers[i].privileged = privileged;
        peers[i].out = &sink;
        peers[i].data = (void *)(intptr_t)i;
    }
}

static void teardown(void)
{
    for (int i = 0; i < NPEER; i++)
        hd_heap_conn_closed(reg, &peers[i]);
    hd_registry_destroy(reg);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    hb_close(be);
    for (int i = 0; i < NPEER; i++) {
        free(recs[i].live);
        free(recs[i].live_names);
    }
    ck_assert_int_eq(cku_count_fds(), fds_before);
}

static void validate(void)
{
    char why[512];
    ck_assert_msg(hd_heap_validate(reg, why, sizeof why) == 0, "%s", why);
}

static const rec *last(int peer) { return &recs[peer]; }

/* Peer attaches as rank of heap "h" (2 ranks, chunk chunk_mb MiB). */
static void attach_p(int peer, uint32_t rank, uint64_t chunk_mb, uint64_t va_mb, uint32_t timeout_ms)
{
    Heapd__HeapParams p = HEAPD__HEAP_PARAMS__INIT;
    p.persist_s = persist_s;
    p.chunk_size = chunk_mb << 20;
    p.initial_size = chunk_mb << 20;
    p.va_size = va_mb << 20;
    p.min_block = 4096;
    p.collect_timeout_ms = timeout_ms;
    Heapd__Attach m = HEAPD__ATTACH__INIT;
    m.heap = (char *)"h";
    m.world_size = 2;
    m.rank = rank;
    m.params = &p;
    hd_heap_attach(reg, &peers[peer], 1, &m);
    validate();
}

static void attach(int peer, uint32_t rank) { attach_p(peer, rank, 1, 64, 200); }

/* Peers 0 and 1 attach as ranks 0 and 1: the heap forms. */
static void formed(void)
{
    attach(0, 0);
    attach(1, 1);
    ck_assert_int_eq(last(0)->kind, R_ATTACH);
    ck_assert_int_eq(last(1)->kind, R_ATTACH);
    ck_assert(!last(1)->resumed);
    ck_assert_uint_eq(last(1)->generation, 0);
    ck_assert_uint_eq(last(1)->nlive, 0);
}

static void alloc_n(int peer, uint64_t seq, uint64_t size, const char *name)
{
    Heapd__Alloc m = HEAPD__ALLOC__INIT;
    m.seq = seq;
    m.size = size;
    if (name)
        m.name = (char *)name;
    hd_heap_alloc(reg, &peers[peer], seq, &m);
    validate();
}

/* Both ranks allocate seq; the offset. */
static uint64_t alloc2(uint64_t seq, uint64_t size, const char *name)
{
    alloc_n(0, seq, size, name);
    ck_assert_msg(last(0)->kind == R_ALLOC, "%s", last(0)->msg);
    alloc_n(1, seq, size, name);
    ck_assert_msg(last(1)->kind == R_ALLOC, "%s", last(1)->msg);
    ck_assert_uint_eq(last(0)->offset, last(1)->offset);
    return last(0)->offset;
}

static void free1(int peer, uint64_t offset)
{
    Heapd__Free m = HEAPD__FREE__INIT;
    m.n_offsets = 1;
    m.offsets = &offset;
    hd_heap_free(reg, &peers[peer], 0, &m);
    validate();
    ck_assert_msg(last(peer)->kind == R_FREE, "%s", last(peer)->msg);
}

static void collect(int peer, uint64_t seq)
{
    Heapd__Collect m = HEAPD__COLLECT__INIT;
    m.seq = seq;
    hd_heap_collect(reg, &peers[peer], seq, &m);
    validate();
}

static void commit(int peer, const char *tag, uint64_t value, uint64_t seq)
{
    Heapd__Commit m = HEAPD__COMMIT__INIT;
    m.tag = (char *)tag;
    m.value = value;
    m.seq = seq;
    hd_heap_commit(reg, &peers[peer], 7, &m);
    validate();
}

static void stats(int peer)
{
    Heapd__Stats m = HEAPD__STATS__INIT;
    hd_heap_stats(reg, &peers[peer], 3, &m, "host", 0);
    ck_assert_int_eq(last(peer)->kind, R_STATS);
}

static void is_error(int peer, Heapd__ErrCode code, const char *part)
{
    const rec *r = last(peer);
    ck_assert_msg(r->kind == R_ERROR && r->code == code, "peer %d: kind %d code %d: %s", peer, r->kind, r->code,
                  r->msg);
    ck_assert_msg(strstr(r->msg, part), "peer %d: \"%s\" lacks \"%s\"", peer, r->msg, part);
}

/* Rank 1's client (peer 1) crashes: disconnects without Detach. */
static void crash1(void)
{
    hd_heap_conn_closed(reg, &peers[1]);
    validate();
}

/* ---- names ------------------------------------------------------------------ */

/* Names are recorded and come back in the live set of a re-attach; the
 * live set is exact: a block the rank freed is absent, one only its peer
 * freed present. */
START_TEST(names_in_live_set)
{
    formed();
    uint64_t o0 = alloc2(0, 4096, "weights");
    uint64_t o1 = alloc2(1, 8192, NULL);
    uint64_t o2 = alloc2(2, 100, "optim");
    free1(0, o0); /* freed by the peer only: rank 1 still holds it */
    free1(1, o1); /* freed by rank 1 */
    crash1();
    alloc_n(0, 3, 4096, "late"); /* decided while rank 1 is gone */
    ck_assert_int_eq(last(0)->kind, R_ALLOC);
    uint64_t o3 = last(0)->offset;
    attach(2, 1);
    const rec *r = last(2);
    ck_assert_msg(r->kind == R_ATTACH, "%s", r->msg);
    ck_assert(r->resumed);
    ck_assert_uint_eq(r->generation, 1);
    ck_assert_uint_eq(r->next_seq, 4); /* it crashed: where the heap is */
    ck_assert_uint_eq(r->nlive, 3);
    ck_assert_uint_eq(r->live[0].seq, 0);
    ck_assert_uint_eq(r->live[0].offset, o0);
    ck_assert_uint_eq(r->live[0].size, 4096);
    ck_assert_str_eq(r->live[0].name, "weights");
    ck_assert_uint_eq(r->live[1].seq, 2);
    ck_assert_uint_eq(r->live[1].offset, o2);
    ck_assert_uint_eq(r->live[1].size, 100);
    ck_assert_uint_ge(r->live[1].block_size, 100);
    ck_assert_str_eq(r->live[1].name, "optim");
    ck_assert_uint_eq(r->live[2].seq, 3);
    ck_assert_uint_eq(r->live[2].offset, o3);
    ck_assert_str_eq(r->live[2].name, "late");
    (void)o1;
    /* It goes on where the heap is, symmetrically. */
    alloc_n(2, 4, 4096, NULL);
    alloc_n(0, 4, 4096, NULL);
    ck_assert_int_eq(last(2)->kind, R_ALLOC);
    ck_assert_uint_eq(last(2)->offset, last(0)->offset);
    stats(0);
    ck_assert_uint_eq(last(0)->generation, 1);
}
END_TEST

/* A different name (or a name against none) at the same allocation number
 * is ERR_ASYMMETRY with both names; the heap is not poisoned and the
 * rank may ask again. */
START_TEST(name_asymmetry)
{
    formed();
    alloc_n(0, 0, 4096, "w");
    alloc_n(1, 0, 4096, "v");
    is_error(1, HEAPD__ERR_CODE__ERR_ASYMMETRY, "rank 1 gave it \"v\", rank 0 \"w\"");
    const rec *r = last(1);
    ck_assert(r->asym.with_names);
    ck_assert_uint_eq(r->asym.n, 0);
    ck_assert_uint_eq(r->asym.nranks, 2);
    ck_assert_uint_eq(r->asym.ranks[0], 0);
    ck_assert_uint_eq(r->asym.ranks[1], 1);
    ck_assert_uint_eq(r->asym.sizes[0], 4096);
    ck_assert_uint_eq(r->asym.sizes[1], 4096);
    ck_assert_str_eq(r->names[0], "w");
    ck_assert_str_eq(r->names[1], "v");
    uint64_t o = last(0)->offset;
    alloc_n(1, 0, 4096, "w"); /* not consumed: again, right */
    ck_assert_int_eq(last(1)->kind, R_ALLOC);
    ck_assert_uint_eq(last(1)->offset, o);
    /* A name where the first gave none, and none where it gave one. */
    alloc_n(0, 1, 64, NULL);
    alloc_n(1, 1, 64, "x");
    is_error(1, HEAPD__ERR_CODE__ERR_ASYMMETRY, "rank 1 gave it \"x\", rank 0 no name");
    ck_assert(!last(1)->named[0]);
    ck_assert(last(1)->named[1]);
    alloc_n(1, 1, 64, NULL);
    ck_assert_int_eq(last(1)->kind, R_ALLOC);
    alloc_n(0, 2, 64, "y");
    alloc_n(1, 2, 64, NULL);
    is_error(1, HEAPD__ERR_CODE__ERR_ASYMMETRY, "rank 1 gave it no name, rank 0 \"y\"");
    ck_assert_str_eq(last(1)->names[0], "y");
    alloc_n(1, 2, 64, "y");
    ck_assert_int_eq(last(1)->kind, R_ALLOC);
    /* A size asymmetry still poisons. */
    alloc_n(0, 3, 64, NULL);
    alloc_n(1, 3, 128, NULL);
    is_error(1, HEAPD__ERR_CODE__ERR_ASYMMETRY, "poisoned");
}
END_TEST

START_TEST(name_checked)
{
    formed();
    alloc_n(0, 0, 4096, "a\tb");
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "control character U+0009");
    char big[300];
    memset(big, 'n', 256);
    big[256] = 0;
    alloc_n(0, 0, 4096, big);
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "256 bytes, over the limit of 255");
    big[255] = 0;
    alloc_n(0, 0, 4096, big);
    ck_assert_int_eq(last(0)->kind, R_ALLOC);
    alloc_n(0, 1, 4096, "\xff");
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "not valid UTF-8");
}
END_TEST

/* ---- re-attach numbering, live sets, generations ------------------------------ */

/* A clean Detach while the peer stays: the rank continues at its own next
 * allocation number and gets the same decisions. */
START_TEST(clean_detach_own_seq)
{
    formed();
    alloc2(0, 4096, NULL);
    alloc2(1, 4096, NULL);
    hd_heap_detach(reg, &peers[1], 9);
    ck_assert_int_eq(last(1)->kind, R_DETACH);
    alloc_n(0, 2, 4096, NULL);
    uint64_t o2 = last(0)->offset;
    alloc_n(0, 3, 4096, NULL);
    attach(1, 1);
    ck_assert_int_eq(last(1)->kind, R_ATTACH);
    ck_assert_uint_eq(last(1)->next_seq, 2);
    ck_assert_uint_eq(last(1)->generation, 1);
    ck_assert(last(1)->resumed);
    alloc_n(1, 2, 4096, NULL);
    ck_assert_uint_eq(last(1)->offset, o2);
    /* A second re-attach, after a crash this time: generation 2, at 4. */
    crash1();
    attach(3, 1);
    ck_assert_uint_eq(last(3)->generation, 2);
    ck_assert_uint_eq(last(3)->next_seq, 4);
    ck_assert_uint_eq(last(3)->nlive, 4);
    stats(0);
    ck_assert_uint_eq(last(0)->generation, 2);
}
END_TEST

/* 17000 live blocks (more than one LiveBatch frame's worth: reply.c
 * sends 16384 a frame, check_reply.c tests the frames) come back exact,
 * ascending. */
START_TEST(many_live_blocks)
{
    enum { N = 17000 };
    attach_p(0, 0, 64, 256, 0);
    attach_p(1, 1, 64, 256, 0);
    ck_assert_int_eq(last(1)->kind, R_ATTACH);
    for (uint64_t s = 0; s < N; s++) {
        char nm[32];
        snprintf(nm, sizeof nm, "b%llu", (unsigned long long)s);
        alloc_n(0, s, 4096, s % 3 ? NULL : nm);
        if (last(0)->collect_needed) { /* the allocator's periodic collect */
            collect(0, s);
            collect(1, s);
            ck_assert_int_eq(last(1)->kind, R_COLLECT);
            alloc_n(0, s, 4096, s % 3 ? NULL : nm);
        }
        ck_assert_msg(last(0)->kind == R_ALLOC, "%s", last(0)->msg);
        alloc_n(1, s, 4096, s % 3 ? NULL : nm);
        ck_assert_msg(last(1)->kind == R_ALLOC, "%s", last(1)->msg);
    }
    crash1();
    attach_p(2, 1, 64, 256, 0);
    const rec *r = last(2);
    ck_assert_msg(r->kind == R_ATTACH, "%s", r->msg);
    ck_assert_uint_eq(r->nlive, N);
    ck_assert_uint_eq(r->next_seq, N);
    for (uint64_t s = 0; s < N; s++) {
        ck_assert_uint_eq(r->live[s].seq, s);
        ck_assert(!r->live[s].name == !!(s % 3));
    }
    ck_assert_str_eq(r->live[16998].name, "b16998");
}
END_TEST

/* The block table is swept: rounds of allocating and freeing everything
 * leave its memory where it was after the first rounds. */
START_TEST(table_swept)
{
    formed();
    uint64_t seq = 0, bk = 0;
    static uint64_t offs[600];
    for (int round = 0; round < 12; round++) {
        for (int i = 0; i < 600; i++, seq++) {
            alloc_n(0, seq, 4096, "blk");
            if (last(0)->collect_needed) {
                collect(0, seq);
                collect(1, seq);
                ck_assert_int_eq(last(1)->kind, R_COLLECT);
                alloc_n(0, seq, 4096, "blk");
            }
            ck_assert_msg(last(0)->kind == R_ALLOC, "%s", last(0)->msg);
            offs[i] = last(0)->offset;
            alloc_n(1, seq, 4096, "blk");
            ck_assert_msg(last(1)->kind == R_ALLOC, "%s", last(1)->msg);
        }
        for (int i = 0; i < 600; i++) {
            free1(0, offs[i]);
            free1(1, offs[i]);
        }
        collect(0, seq);
        collect(1, seq);
        ck_assert_int_eq(last(1)->kind, R_COLLECT);
        stats(0);
        if (round == 3)
            bk = last(0)->bookkeeping;
        if (round > 3)
            ck_assert_uint_le(last(0)->bookkeeping, bk + bk / 16);
    }
}
END_TEST

/* ---- the gone-rank semantics ---------------------------------------------------- */

/* A rank gone: its blocks stay held, allocations that need no collect go
 * on, collects fail naming it until it re-attaches, then go on. */
START_TEST(gone_rank)
{
    formed();
    uint64_t o0 = alloc2(0, 4096, NULL);
    crash1();
    free1(0, o0);
    alloc_n(0, 1, 4096, NULL);
    ck_assert_int_eq(last(0)->kind, R_ALLOC);
    collect(0, 2);
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "rank 1 is not connected");
    attach(2, 1);
    ck_assert_uint_eq(last(2)->next_seq, 2);
    ck_assert_uint_eq(last(2)->nlive, 2); /* o0 (the peer freed it) and 1 */
    free1(2, o0);
    collect(0, 2);
    collect(2, 2);
    ck_assert_int_eq(last(0)->kind, R_COLLECT);
    ck_assert_int_eq(last(2)->kind, R_COLLECT);
}
END_TEST

/* ---- commit markers -------------------------------------------------------------- */

START_TEST(commit_agreement)
{
    formed();
    alloc2(0, 4096, NULL);
    commit(0, "step", 5, 1);
    ck_assert_int_eq(last(0)->kind, R_ALLOC); /* waiting: no answer yet */
    alloc2(1, 4096, NULL);                    /* a commit does not hold allocations */
    commit(1, "step", 5, 2);
    is_error(1, HEAPD__ERR_CODE__ERR_ASYMMETRY,
             "rank 0 committed \"step\" = 5 at allocation 1, rank 1 \"step\" = 5 at allocation 2");
    is_error(0, HEAPD__ERR_CODE__ERR_ASYMMETRY, "no marker was recorded");
    alloc_n(0, 1, 4096, NULL);
    commit(0, "step", 5, 2);
    commit(1, "step", 5, 2);
    ck_assert_int_eq(last(0)->kind, R_COMMIT);
    ck_assert_int_eq(last(1)->kind, R_COMMIT);
    ck_assert_uint_eq(last(1)->value, 5);
    ck_assert_uint_eq(last(1)->generation, 0);
    /* Different values: both told, the marker unchanged. */
    commit(0, "step", 6, 2);
    commit(1, "step", 7, 2);
    is_error(1, HEAPD__ERR_CODE__ERR_ASYMMETRY, "rank 0 committed \"step\" = 6");
    is_error(0, HEAPD__ERR_CODE__ERR_ASYMMETRY, "rank 1 \"step\" = 7");
    /* Wrong seq. */
    commit(0, "step", 6, 9);
    is_error(0, HEAPD__ERR_CODE__ERR_PROTOCOL, "rank 0 is at allocation 2");
    commit(0, "epoch", 1, 2);
    commit(1, "epoch", 1, 2);
    ck_assert_int_eq(last(1)->kind, R_COMMIT);
    stats(0);
    ck_assert_uint_eq(last(0)->stat_markers, 2);
    /* The markers come with a re-attach. */
    crash1();
    attach(2, 1);
    const rec *r = last(2);
    ck_assert_uint_eq(r->nmarkers, 2);
    ck_assert_str_eq(r->markers[0].tag, "step");
    ck_assert_uint_eq(r->markers[0].value, 5);
    ck_assert_uint_eq(r->markers[0].seq, 2);
    ck_assert_str_eq(r->markers[1].tag, "epoch");
    commit(0, "step", 8, 2);
    commit(2, "step", 8, 2);
    ck_assert_int_eq(last(2)->kind, R_COMMIT);
    ck_assert_uint_eq(last(2)->generation, 1);
}
END_TEST

START_TEST(commit_peer_gone)
{
    formed();
    commit(0, "s", 1, 0);
    crash1();
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "rank 1 (pid 2001) disconnected while the others waited");
    commit(0, "s", 1, 0);
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "rank 1 is not connected");
    hd_heap_conn_closed(reg, &peers[0]); /* the heap goes: its commit state with it */
}
END_TEST

START_TEST(commit_timeout)
{
    formed();
    commit(0, "s", 1, 0);
    uint64_t end = uv_now(&loop) + 5000;
    while (last(0)->kind != R_ERROR && uv_now(&loop) < end)
        uv_run(&loop, UV_RUN_ONCE);
    is_error(0, HEAPD__ERR_CODE__ERR_TIMEOUT, "rank(s) 1 never committed");
    validate();
}
END_TEST

START_TEST(commit_tags)
{
    formed();
    commit(0, "", 1, 0);
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "1 to 64 bytes");
    char tag[80];
    memset(tag, 't', 65);
    tag[65] = 0;
    commit(0, tag, 1, 0);
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "(it is 65)");
    commit(0, "a\nb", 1, 0);
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "control character");
    for (int i = 0; i < 64; i++) {
        snprintf(tag, sizeof tag, "tag%d", i);
        commit(0, tag, (uint64_t)i, 0);
        commit(1, tag, (uint64_t)i, 0);
        ck_assert_int_eq(last(1)->kind, R_COMMIT);
    }
    commit(0, "one more", 1, 0);
    is_error(0, HEAPD__ERR_CODE__ERR_QUOTA, "64 commit markers, the most");
    commit(0, "tag3", 33, 0); /* an existing tag: its new value */
    commit(1, "tag3", 33, 0);
    ck_assert_int_eq(last(1)->kind, R_COMMIT);
    Heapd__Commit m = HEAPD__COMMIT__INIT;
    m.tag = (char *)"x";
    hd_heap_commit(reg, &peers[3], 1, &m);
    is_error(3, HEAPD__ERR_CODE__ERR_STATE, "commit before attach");
}
END_TEST

/* Every rank gone (a persisting heap, detached), then back: each continues
 * at the heap's allocation number with its exact live set and the markers,
 * whether it crashed or detached; the generation counts both. */
START_TEST(all_gone_reattach)
{
    persist_s = 60;
    formed();
    uint64_t o0 = alloc2(0, 4096, "a");
    alloc2(1, 8192, "b");
    commit(0, "step", 3, 2);
    commit(1, "step", 3, 2);
    ck_assert_int_eq(last(1)->kind, R_COMMIT);
    alloc_n(0, 2, 64, "c"); /* rank 0 ahead: rank 1 never asked for 2 */
    free1(0, o0);
    hd_heap_detach(reg, &peers[1], 9); /* rank 1: clean, at its allocation 2 */
    ck_assert_int_eq(last(1)->kind, R_DETACH);
    hd_heap_conn_closed(reg, &peers[0]); /* rank 0 crashes, the last to leave */
    validate();
    ck_assert_uint_eq(hd_registry_heaps(reg), 1); /* detached */
    attach(2, 1);                                 /* to a heap without clients: at the heap's 3, not its own 2 */
    const rec *r = last(2);
    ck_assert_msg(r->kind == R_ATTACH, "%s", r->msg);
    ck_assert(r->resumed);
    ck_assert_uint_eq(r->next_seq, 3);
    ck_assert_uint_eq(r->generation, 1);
    ck_assert_uint_eq(r->nlive, 3); /* "a" only rank 0 freed, "b", "c" */
    ck_assert_str_eq(r->live[0].name, "a");
    ck_assert_str_eq(r->live[2].name, "c");
    ck_assert_uint_eq(r->nmarkers, 1);
    ck_assert_str_eq(r->markers[0].tag, "step");
    ck_assert_uint_eq(r->markers[0].value, 3);
    ck_assert_uint_eq(r->markers[0].seq, 2);
    attach(3, 0); /* it crashed: at the heap's 3 */
    r = last(3);
    ck_assert_msg(r->kind == R_ATTACH, "%s", r->msg);
    ck_assert_uint_eq(r->next_seq, 3);
    ck_assert_uint_eq(r->generation, 2);
    ck_assert_uint_eq(r->nlive, 2); /* it freed "a" */
    ck_assert_str_eq(r->live[0].name, "b");
    alloc_n(2, 3, 4096, "d");
    alloc_n(3, 3, 4096, "d");
    ck_assert_int_eq(last(3)->kind, R_ALLOC);
    ck_assert_uint_eq(last(3)->offset, last(2)->offset);
    commit(2, "step", 4, 4);
    commit(3, "step", 4, 4);
    ck_assert_uint_eq(last(3)->value, 4);
    ck_assert_uint_eq(last(3)->generation, 2);
}
END_TEST

static Suite *names_suite(void)
{
    Suite *s = suite_create("names");
    TCase *tc = tcase_create("issue29");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, names_in_live_set);
    tcase_add_test(tc, name_asymmetry);
    tcase_add_test(tc, name_checked);
    tcase_add_test(tc, clean_detach_own_seq);
    tcase_add_test(tc, many_live_blocks);
    tcase_add_test(tc, table_swept);
    tcase_add_test(tc, gone_rank);
    tcase_add_test(tc, commit_agreement);
    tcase_add_test(tc, commit_peer_gone);
    tcase_add_test(tc, commit_timeout);
    tcase_add_test(tc, commit_tags);
    tcase_add_test(tc, all_gone_reattach);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* libuv's first loop opens a process-wide pipe it never closes: open it
     * before any test counts fds. */
    uv_loop_t l;
    if (uv_loop_init(&l) == 0)
        uv_loop_close(&l);
    return cku_run(names_suite());
}
