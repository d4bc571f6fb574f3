/*
 * check_heap.c - unit tests for the heap wing (daemon/heap/): no socket, no
 * server; requests go in as decoded messages and every answer comes back
 * through a recording reply sink (hd_reply_ops). A libuv loop of the test's
 * own runs the timeouts; the host backend (memfd) makes the chunks.
 */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#define MAXREC 256
#define NPEER  8
#include "check_wing_fixture.h"
#include "wire.h" /* HW_ALLOC_FREES_MAX */

/* ---- the recording sink ------------------------------------------------- */

typedef enum { R_ERROR, R_ATTACH, R_ALLOC, R_FREE, R_COLLECT, R_DETACH, R_FORCE, R_STATS } rec_kind;

typedef struct rec {
    rec_kind kind;
    int peer;
    uint64_t id;
    Heapd__ErrCode code;
    char msg[1500];
    uint64_t seq, offset, block_size, mapped, at_seq, blocks;
    bool collect_needed;
    size_t nchunks, nfds, nheaps;
    int status_index;
    uint32_t world_size;
    /* stats: of heaps[0] and its ranks[0] */
    uint32_t owner_uid;
    uint64_t coll_wait_count, growth_count, stream_waiting, dev_waits_avoided, uptime_ms;
    uint64_t collects, eager_reclaims;
    const char *store;
    hd_asym_out asym; /* an error's (nranks 0: none) */
} rec;

static rec recs[MAXREC];
static int nrecs;

static rec *record(hd_peer *p, uint64_t id, rec_kind kind)
{
    ck_assert_int_lt(nrecs, MAXREC);
    rec *r = &recs[nrecs++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->peer = (int)(intptr_t)p->data;
    r->id = id;
    return r;
}

static void close_all(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

static void s_error(hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg, const hd_asym_out *asym)
{
    rec *r = record(p, id, R_ERROR);
    r->code = code;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    if (asym)
        r->asym = *asym;
}

static void s_attach(hd_peer *p, uint64_t id, const hd_attach_out *a)
{
    rec *r = record(p, id, R_ATTACH);
    r->mapped = a->mapped;
    r->nchunks = a->nchunks;
    r->nfds = a->nfds;
    r->status_index = a->status_index;
    r->world_size = a->world_size;
    r->seq = a->next_seq;
    close_all(a->fds, a->nfds);
}

static void s_alloc(hd_peer *p, uint64_t id, const hd_alloc_out *a)
{
    rec *r = record(p, id, R_ALLOC);
    r->seq = a->seq;
    r->offset = a->offset;
    r->block_size = a->block_size;
    r->mapped = a->mapped;
    r->collect_needed = a->collect_needed;
    r->nchunks = a->nchunks;
    close_all(a->fds, a->nchunks);
}

static void s_free(hd_peer *p, uint64_t id, uint32_t accepted) { record(p, id, R_FREE)->blocks = accepted; }

static void s_collect(hd_peer *p, uint64_t id, const hd_collect_out *o)
{
    rec *r = record(p, id, R_COLLECT);
    r->blocks = o->blocks;
    r->seq = o->collects;
}

static void s_detach(hd_peer *p, uint64_t id) { record(p, id, R_DETACH); }

static void s_force(hd_peer *p, uint64_t id, uint64_t at_seq) { record(p, id, R_FORCE)->at_seq = at_seq; }

static void s_stats(hd_peer *p, uint64_t id, const hd_stats_out *s)
{
    rec *r = record(p, id, R_STATS);
    r->nheaps = s->nheaps;
    r->uptime_ms = s->uptime_ms;
    r->store = s->store;
    if (s->nheaps) {
        const hd_heap_info *h = &s->heaps[0];
        r->owner_uid = h->owner_uid;
        r->coll_wait_count = h->collect_wait ? h->collect_wait->count : 0;
        r->growth_count = h->growth ? h->growth->count : 0;
        r->collects = h->collects;
        r->eager_reclaims = h->eager_reclaims;
        if (h->n_ranks) {
            r->stream_waiting = h->ranks[0].stream_waiting;
            r->dev_waits_avoided = h->ranks[0].device_waits_avoided;
        }
    }
}

static const hd_reply_ops sink = {s_error,
                                  s_attach,
                                  s_alloc,
                                  s_free,
                                  s_collect,
                                  s_detach,
                                  s_force,
                                  s_stats,
                                  NULL /* drop: tests/check_persist.c */,
                                  NULL /* commit */,
                                  NULL /* release: tests/check_release.c */,
                                  NULL,
                                  NULL /* trim: tests/check_trim.c */};

/* ---- fixture ------------------------------------------------------------ */

/* The wing's collect tests run under reclaim = collect; the "eager" ones
 * under heapd's default (issue 27). */
static void setup_reclaim(ha_reclaim rc)
{
    nrecs = 0;
    hd_config cfg;
    hd_config_defaults(&cfg);
    cfg.reclaim = rc;
    ckw_start(&cfg, &sink, 1000);
}

static void setup(void) { setup_reclaim(HA_RECLAIM_COLLECT); }

static void teardown(void) { ckw_stop(); }

static void attach(int peer, uint32_t rank, uint32_t world, uint32_t timeout_ms)
{
    Heapd__HeapParams p = HEAPD__HEAP_PARAMS__INIT;
    p.chunk_size = 1 << 20;
    p.initial_size = 1 << 20;
    p.va_size = 64 << 20;
    p.min_block = 4096;
    p.collect_timeout_ms = timeout_ms;
    Heapd__Attach m = HEAPD__ATTACH__INIT;
    m.heap = (char *)"h";
    m.world_size = world;
    m.rank = rank;
    m.params = &p;
    hd_heap_attach(reg, &peers[peer], 100 + (uint64_t)peer, &m);
    validate();
}

static void alloc(int peer, uint64_t seq, uint64_t size)
{
    Heapd__Alloc m = HEAPD__ALLOC__INIT;
    m.seq = seq;
    m.size = size;
    hd_heap_alloc(reg, &peers[peer], seq, &m);
    validate();
}

/* Collect at seq carrying the rank's stream-ordered free figures (issue 18). */
static void collect_sw(int peer, uint64_t seq, uint64_t waiting, uint64_t avoided)
{
    Heapd__Collect m = HEAPD__COLLECT__INIT;
    m.seq = seq;
    m.stream_waiting = waiting;
    m.device_waits_avoided = avoided;
    hd_heap_collect(reg, &peers[peer], seq, &m);
    validate();
}

static void collect(int peer, uint64_t seq) { collect_sw(peer, seq, 0, 0); }

static void free1(int peer, uint64_t offset)
{
    Heapd__Free m = HEAPD__FREE__INIT;
    m.n_offsets = 1;
    m.offsets = &offset;
    hd_heap_free(reg, &peers[peer], 0, &m);
    validate();
}

/* The latest record for `peer`. */
static const rec *last(int peer)
{
    for (int i = nrecs - 1; i >= 0; i--)
        if (recs[i].peer == peer)
            return &recs[i];
    ck_abort_msg("no reply to peer %d", peer);
    return NULL;
}

/* The attach sequence the tests start from: peers 0..n-1 attach as ranks
 * 0..n-1 of heap "h" (collect timeout timeout_ms, 0: heapd's default), the
 * heap forms and every rank gets its AttachReply; the records are then
 * cleared. */
static void heap_formed(int n, uint32_t timeout_ms)
{
    for (int i = 0; i < n; i++)
        attach(i, (uint32_t)i, (uint32_t)n, timeout_ms);
    ck_assert_int_eq(nrecs, n);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(recs[i].kind == R_ATTACH, "peer %d: %s", recs[i].peer, recs[i].msg);
        ck_assert_uint_eq(recs[i].world_size, (uint32_t)n);
    }
    ck_assert_uint_eq(hd_registry_heaps(reg), 1);
    nrecs = 0;
}

/* The fixture of the "formed" tests: setup, then a formed heap of 2 ranks. */
static void setup_formed2(void)
{
    setup();
    heap_formed(2, 0);
}

/* The "eager" tests: heapd's default reclaim, a formed heap of 2 ranks. */
static void setup_eager2(void)
{
    setup_reclaim(HA_RECLAIM_EAGER);
    heap_formed(2, 0);
}

/* Allocation seq of `size` carrying frees offs[0..n) (issue 27). */
static void alloc_frees(int peer, uint64_t seq, uint64_t size, uint64_t *offs, size_t n)
{
    Heapd__Alloc m = HEAPD__ALLOC__INIT;
    m.seq = seq;
    m.size = size;
    m.n_frees = n;
    m.frees = offs;
    hd_heap_alloc(reg, &peers[peer], seq, &m);
    validate();
}

/* Runs the loop until `n` records came or 5 s passed. */
static void run_until(int n)
{
    uint64_t end = uv_now(&loop) + 5000;
    while (nrecs < n && uv_now(&loop) < end)
        uv_run(&loop, UV_RUN_ONCE);
}

/* ---- tests ----------------------------------------------------------------- */

START_TEST(attach_rendezvous)
{
    attach(0, 0, 3, 0);
    attach(2, 2, 3, 0);
    ck_assert_int_eq(nrecs, 0); /* nobody hears back before every rank came */
    attach(1, 1, 3, 0);
    ck_assert_int_eq(nrecs, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(recs[i].kind, R_ATTACH);
        ck_assert_uint_eq(recs[i].world_size, 3);
        ck_assert_uint_eq(recs[i].mapped, 1 << 20);
        ck_assert_uint_eq(recs[i].nchunks, 3); /* every rank's chunk 0 */
        ck_assert_int_eq(recs[i].status_index, 3);
        ck_assert_uint_eq(recs[i].nfds, 4);
        ck_assert_uint_eq(recs[i].id, 100 + (uint64_t)recs[i].peer);
    }
    /* A second client for a rank is refused. */
    attach(3, 1, 3, 0);
    ck_assert_int_eq(last(3)->kind, R_ERROR);
    ck_assert_int_eq(last(3)->code, HEAPD__ERR_CODE__ERR_STATE);
}
END_TEST

START_TEST(identical_offsets)
{
    static const uint64_t sizes[] = {1000, 5000, 3 << 20, 4096, 12345, 1 << 20, 7};
    enum { N = sizeof sizes / sizeof sizes[0] };
    uint64_t off[4][N], mapped[4][N];
    heap_formed(4, 0);
    /* The ranks come in a different order at each number: the rank that
     * decides changes. */
    int collects = 0, freed = 0;
    for (uint64_t s = 0; s < N; s++) {
        int needed = 0;
        if (s == 2 && !freed++) /* a collect with something to reclaim */
            for (int p = 0; p < 4; p++) {
                free1(p, off[p][0]);
                ck_assert_int_eq(last(p)->kind, R_FREE);
            }
        for (int i = 0; i < 4; i++) {
            int peer = (int)((i + s) % 4);
            alloc(peer, s, sizes[s]);
            const rec *x = last(peer);
            ck_assert_msg(x->kind == R_ALLOC, "%s", x->msg);
            if (x->collect_needed) { /* then every rank hears it: collect, ask again */
                collect(peer, s);
                needed++;
                continue;
            }
            off[peer][s] = x->offset;
            mapped[peer][s] = x->mapped;
        }
        if (needed) {
            ck_assert_int_eq(needed, 4);
            for (int p = 0; p < 4; p++)
                ck_assert_int_eq(last(p)->kind, R_COLLECT);
            collects++;
            s--;
        }
    }
    for (int p = 1; p < 4; p++)
        for (int s = 0; s < N; s++) {
            ck_assert_uint_eq(off[p][s], off[0][s]);
            ck_assert_uint_eq(mapped[p][s], mapped[0][s]);
        }
    ck_assert_uint_gt(mapped[0][2], 1 << 20); /* the heap grew, after a collect */
    ck_assert_int_ge(collects, 1);
}
END_TEST

/* x is the poisoned heap's ERR_ASYMMETRY: allocation n, rank 0 decided it
 * at s0 bytes, rank 1 asked for s1. */
static void is_poison(const rec *x, uint64_t n, uint64_t s0, uint64_t s1)
{
    ck_assert_msg(x->kind == R_ERROR && x->code == HEAPD__ERR_CODE__ERR_ASYMMETRY, "kind %d code %d: %s", x->kind,
                  x->code, x->msg);
    ck_assert_uint_eq(x->asym.nranks, 2);
    ck_assert_uint_eq(x->asym.n, n);
    ck_assert_uint_eq(x->asym.ranks[0], 0);
    ck_assert_uint_eq(x->asym.ranks[1], 1);
    ck_assert_uint_eq(x->asym.sizes[0], s0);
    ck_assert_uint_eq(x->asym.sizes[1], s1);
    ck_assert_msg(strstr(x->msg, "asymmetric allocation ") && strstr(x->msg, "poisoned"), "%s", x->msg);
}

START_TEST(asymmetry)
{
    alloc(0, 0, 4096);
    uint64_t off = last(0)->offset;
    alloc(1, 0, 8192);
    const rec *x = last(1);
    is_poison(x, 0, 4096, 8192);
    ck_assert_msg(strstr(x->msg, "allocation 0 ") && strstr(x->msg, "8192") && strstr(x->msg, "4096"), "%s", x->msg);
    char msg[sizeof x->msg];
    snprintf(msg, sizeof msg, "%s", x->msg);
    /* Poisoned (issue 31): every later call of either rank gets the same
     * error, the right size too, the rank that decided too. */
    alloc(1, 0, 4096);
    is_poison(last(1), 0, 4096, 8192);
    alloc(0, 1, 4096);
    is_poison(last(0), 0, 4096, 8192);
    free1(0, off);
    is_poison(last(0), 0, 4096, 8192);
    collect(1, 0);
    is_poison(last(1), 0, 4096, 8192);
    ck_assert_str_eq(last(1)->msg, msg);
    /* A new client of the heap too; detach still works. */
    attach(2, 0, 2, 0);
    is_poison(last(2), 0, 4096, 8192);
    hd_heap_detach(reg, &peers[0], 7);
    ck_assert_int_eq(last(0)->kind, R_DETACH);
    validate();
}
END_TEST

/* A collect in progress when the heap is poisoned fails with the poison. */
START_TEST(asymmetry_wakes_collect)
{
    alloc(0, 0, 100);
    alloc(1, 0, 100);
    alloc(0, 1, 4096);
    collect(0, 2); /* rank 0 waits for rank 1 */
    int before = nrecs;
    alloc(1, 1, 8192);
    ck_assert_int_eq(nrecs, before + 2);
    is_poison(last(0), 1, 4096, 8192);
    is_poison(last(1), 1, 4096, 8192);
    collect(0, 2); /* the collect ended: asking again is not "already waiting" */
    is_poison(last(0), 1, 4096, 8192);
}
END_TEST

START_TEST(collect_timeout)
{
    heap_formed(3, 50);
    collect(0, 0);
    collect(2, 0);
    ck_assert_int_eq(nrecs, 0);
    run_until(2);
    ck_assert_int_eq(nrecs, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(recs[i].kind, R_ERROR);
        ck_assert_int_eq(recs[i].code, HEAPD__ERR_CODE__ERR_TIMEOUT);
        ck_assert_msg(strstr(recs[i].msg, "rank(s) 1 never arrived"), "%s", recs[i].msg);
    }
    validate();
}
END_TEST

START_TEST(rank_gone)
{
    heap_formed(3, 0);
    collect(0, 0);
    collect(1, 0);
    hd_heap_conn_closed(reg, &peers[2]);
    validate();
    ck_assert_int_eq(nrecs, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(recs[i].kind, R_ERROR);
        ck_assert_int_eq(recs[i].code, HEAPD__ERR_CODE__ERR_PEER_GONE);
        ck_assert_msg(strstr(recs[i].msg, "rank 2 (pid 1002) disconnected"), "%s", recs[i].msg);
    }
    /* A later collect names it at once. */
    collect(0, 0);
    ck_assert_int_eq(last(0)->code, HEAPD__ERR_CODE__ERR_PEER_GONE);
    ck_assert_msg(strstr(last(0)->msg, "rank 2 is not connected"), "%s", last(0)->msg);
}
END_TEST

START_TEST(forced_collect)
{
    alloc(0, 0, 4096);
    alloc(1, 0, 4096);
    uint64_t off = last(1)->offset;
    free1(0, off);
    free1(1, off);
    /* An operator of another uid may not. */
    peers[5].uid = 7;
    Heapd__ForceCollect fm = HEAPD__FORCE_COLLECT__INIT;
    fm.heap = (char *)"h";
    hd_heap_force_collect(reg, &peers[5], 9, &fm);
    ck_assert_int_eq(last(5)->code, HEAPD__ERR_CODE__ERR_DENIED);
    /* The owner may: at the next allocation number. */
    peers[4].uid = 4242;
    hd_heap_force_collect(reg, &peers[4], 9, &fm);
    ck_assert_int_eq(last(4)->kind, R_FORCE);
    ck_assert_uint_eq(last(4)->at_seq, 1);
    for (int p = 0; p < 2; p++) {
        alloc(p, 1, 4096);
        ck_assert_int_eq(last(p)->kind, R_ALLOC);
        ck_assert(last(p)->collect_needed);
    }
    collect(0, 1);
    ck_assert_int_eq(last(0)->kind, R_ALLOC); /* still waiting */
    collect(1, 1);
    for (int p = 0; p < 2; p++) {
        ck_assert_int_eq(last(p)->kind, R_COLLECT);
        ck_assert_uint_eq(last(p)->blocks, 1);
    }
    for (int p = 0; p < 2; p++) {
        alloc(p, 1, 4096);
        ck_assert_int_eq(last(p)->kind, R_ALLOC);
        ck_assert(!last(p)->collect_needed);
        ck_assert_uint_eq(last(p)->offset, last(0)->offset);
    }
}
END_TEST

START_TEST(detach_destroys)
{
    hd_heap_detach(reg, &peers[0], 7);
    ck_assert_int_eq(last(0)->kind, R_DETACH);
    ck_assert_uint_eq(hd_registry_heaps(reg), 1);
    hd_heap_detach(reg, &peers[1], 8);
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
    validate();
}
END_TEST

/* Stats carry issue 18's and 20's plain figures for reply.c: the owner,
 * the collect-wait and growth histograms, each rank's stream-ordered free
 * figures from its last Collect, uptime and the store. */
START_TEST(stats_figures)
{
    collect_sw(0, 0, 3, 5);
    collect_sw(1, 0, 3, 5);
    ck_assert_int_eq(last(0)->kind, R_COLLECT);
    alloc(0, 0, 3 << 20); /* grows past the 1 MiB initial size */
    alloc(1, 0, 3 << 20);
    Heapd__Stats m = HEAPD__STATS__INIT;
    hd_heap_stats(reg, &peers[0], 55, &m, "host", 2);
    const rec *x = last(0);
    ck_assert_int_eq(x->kind, R_STATS);
    ck_assert_uint_eq(x->nheaps, 1);
    ck_assert_uint_eq(x->owner_uid, 4242);
    ck_assert_uint_eq(x->coll_wait_count, 1);
    ck_assert_uint_ge(x->growth_count, 1);
    ck_assert_uint_eq(x->stream_waiting, 3);
    ck_assert_uint_eq(x->dev_waits_avoided, 5);
    ck_assert_str_eq(x->store, "");
}
END_TEST

/* Issue 27: a block both ranks freed is reused by the next allocation, with
 * no collect; frees an Alloc carries count before its decision; a bad one
 * refuses the Alloc (not consumed), and too many are refused. */
START_TEST(eager_reuse)
{
    for (int p = 0; p < 2; p++)
        alloc(p, 0, 8192);
    uint64_t a = last(0)->offset;
    free1(0, a);
    for (int p = 0; p < 2; p++)
        alloc(p, 1, 8192); /* rank 1 still holds a */
    uint64_t b = last(0)->offset;
    ck_assert(b != a);
    ck_assert(!last(1)->collect_needed);
    alloc_frees(1, 2, 8192, &a, 1); /* rank 1 decides 2, its free of a first */
    ck_assert_int_eq(last(1)->kind, R_ALLOC);
    ck_assert_uint_eq(last(1)->offset, a);
    alloc(0, 2, 8192);
    ck_assert_uint_eq(last(0)->offset, a);
    /* a free this rank does not hold: ERR_NOT_HELD, allocation 3 not made */
    uint64_t bad[2] = {b, 12345 * 4096};
    alloc_frees(0, 3, 8192, bad, 2);
    ck_assert_int_eq(last(0)->kind, R_ERROR);
    ck_assert_int_eq(last(0)->code, HEAPD__ERR_CODE__ERR_NOT_HELD);
    uint64_t many[HW_ALLOC_FREES_MAX + 1];
    for (size_t i = 0; i < HW_ALLOC_FREES_MAX + 1; i++)
        many[i] = b;
    alloc_frees(0, 3, 8192, many, HW_ALLOC_FREES_MAX + 1);
    ck_assert_int_eq(last(0)->code, HEAPD__ERR_CODE__ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(last(0)->msg, "limit"));
    alloc_frees(0, 3, 8192, &b, 1); /* b still held by rank 0: it was not freed */
    ck_assert_int_eq(last(0)->kind, R_ALLOC);
    Heapd__Stats m = HEAPD__STATS__INIT;
    hd_heap_stats(reg, &peers[0], 56, &m, "host", 2);
    ck_assert_int_eq(last(0)->kind, R_STATS);
    ck_assert_uint_eq(last(0)->collects, 0);
    ck_assert_uint_eq(last(0)->eager_reclaims, 1);
}
END_TEST

/* An attach that never completes (timeout.c): every waiting rank gets
 * ERR_TIMEOUT naming the missing ranks, and the heap, with no client left,
 * is gone (registry.c). */
START_TEST(attach_timeout)
{
    attach(0, 0, 3, 50);
    attach(2, 2, 3, 50);
    ck_assert_int_eq(nrecs, 0);
    run_until(2);
    ck_assert_int_eq(nrecs, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(recs[i].kind, R_ERROR);
        ck_assert_int_eq(recs[i].code, HEAPD__ERR_CODE__ERR_TIMEOUT);
        ck_assert_msg(strstr(recs[i].msg, "rank(s) 1 never attached (attached: 0, 2)"), "%s", recs[i].msg);
    }
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
    validate();
    /* A retry attaches again, as a new heap. */
    nrecs = 0;
    heap_formed(3, 0);
}
END_TEST

/* A rank that detaches while the others wait in a collect fails the
 * collect (collect.c, reached from attach.c through the heap's coll_left);
 * the heap stays for the rank still attached. */
START_TEST(detach_in_collect)
{
    collect(0, 0);
    ck_assert_int_eq(nrecs, 0);
    hd_heap_detach(reg, &peers[1], 7);
    validate();
    ck_assert_int_eq(last(1)->kind, R_DETACH);
    ck_assert_int_eq(last(0)->kind, R_ERROR);
    ck_assert_int_eq(last(0)->code, HEAPD__ERR_CODE__ERR_PEER_GONE);
    ck_assert_msg(strstr(last(0)->msg, "rank 1 (pid 1001) detached while the others waited"), "%s", last(0)->msg);
    ck_assert_uint_eq(hd_registry_heaps(reg), 1);
}
END_TEST

static Suite *heap_suite(void)
{
    Suite *s = suite_create("heap");
    TCase *tc = tcase_create("wing");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, attach_rendezvous);
    tcase_add_test(tc, identical_offsets);
    tcase_add_test(tc, collect_timeout);
    tcase_add_test(tc, rank_gone);
    tcase_add_test(tc, attach_timeout);
    suite_add_tcase(s, tc);
    /* Tests that start from a formed heap of 2 ranks. */
    TCase *tf = tcase_create("formed");
    tcase_add_checked_fixture(tf, setup_formed2, teardown);
    tcase_add_test(tf, asymmetry);
    tcase_add_test(tf, asymmetry_wakes_collect);
    tcase_add_test(tf, forced_collect);
    tcase_add_test(tf, detach_destroys);
    tcase_add_test(tf, stats_figures);
    tcase_add_test(tf, detach_in_collect);
    suite_add_tcase(s, tf);
    TCase *te = tcase_create("eager");
    tcase_add_checked_fixture(te, setup_eager2, teardown);
    tcase_add_test(te, eager_reuse);
    suite_add_tcase(s, te);
    return s;
}

int main(void) { return ckw_main(heap_suite()); }
