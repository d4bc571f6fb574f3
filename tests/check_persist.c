/*
 * check_persist.c - unit tests for a heap's lifetime (issue 29, the heap
 * wing's registry.c): persist, detached heaps, their expiry, re-attach of a
 * detached heap, Drop, and the quotas that still charge them. Like
 * check_heap.c: requests go in decoded, answers come back through a
 * recording reply sink, a loop of the test's own runs the timers and the
 * host backend (memfd) makes the chunks.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#define MAXREC 64
#define NPEER  4
#include "check_wing_fixture.h"

/* ---- the recording sink ------------------------------------------------- */

typedef enum { R_ERROR, R_ATTACH, R_ALLOC, R_OTHER, R_STATS, R_DROP } rec_kind;

typedef struct rec {
    rec_kind kind;
    int peer;
    Heapd__ErrCode code;
    char msg[1500];
    uint64_t mapped, offset, released, detached_ms;
    size_t nchunks, nheaps;
    uint32_t persist_s, clients, bad_content;
} rec;

static rec recs[MAXREC];
static int nrecs;

/* What an AttachReply's sink does with the chunks it gets: write a pattern
 * into each (its rank and index at offset 0), or check that pattern. */
static enum { CH_NONE, CH_WRITE, CH_CHECK } chunk_mode;

static rec *record(hd_peer *p, rec_kind kind)
{
    ck_assert_int_lt(nrecs, MAXREC);
    rec *r = &recs[nrecs++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->peer = (int)(intptr_t)p->data;
    return r;
}

static void s_error(hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg, const hd_asym_out *asym)
{
    (void)id, (void)asym;
    rec *r = record(p, R_ERROR);
    r->code = code;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
}

static void s_attach(hd_peer *p, uint64_t id, const hd_attach_out *a)
{
    (void)id;
    rec *r = record(p, R_ATTACH);
    r->mapped = a->mapped;
    r->nchunks = a->nchunks;
    r->persist_s = a->persist_s;
    for (size_t i = 0; i < a->nchunks; i++) {
        uint64_t want = 0xC0DE000000000000ull | (uint64_t)a->chunks[i].rank << 16 | a->chunks[i].index, have = 0;
        if (chunk_mode == CH_WRITE)
            ck_assert_int_eq(pwrite(a->fds[i], &want, sizeof want, 0), (ssize_t)sizeof want);
        else if (chunk_mode == CH_CHECK) {
            ck_assert_int_eq(pread(a->fds[i], &have, sizeof have, 0), (ssize_t)sizeof have);
            r->bad_content += have != want;
        }
    }
    for (size_t i = 0; i < a->nfds; i++)
        close(a->fds[i]);
}

static void s_alloc(hd_peer *p, uint64_t id, const hd_alloc_out *a)
{
    (void)id;
    rec *r = record(p, R_ALLOC);
    r->offset = a->offset;
    for (size_t i = 0; i < a->nchunks; i++)
        close(a->fds[i]);
}

static void s_free(hd_peer *p, uint64_t id, uint32_t accepted)
{
    (void)id, (void)accepted;
    record(p, R_OTHER);
}

static void s_collect(hd_peer *p, uint64_t id, const hd_collect_out *o)
{
    (void)id, (void)o;
    record(p, R_OTHER);
}

static void s_detach(hd_peer *p, uint64_t id)
{
    (void)id;
    record(p, R_OTHER);
}

static void s_force(hd_peer *p, uint64_t id, uint64_t at_seq)
{
    (void)id, (void)at_seq;
    record(p, R_OTHER);
}

static void s_stats(hd_peer *p, uint64_t id, const hd_stats_out *s)
{
    (void)id;
    rec *r = record(p, R_STATS);
    r->nheaps = s->nheaps;
    if (s->nheaps) {
        ck_assert(!s->heaps[0].memo_valid); /* this sink never fills the memo */
        r->persist_s = s->heaps[0].persist_s;
        r->detached_ms = s->heaps[0].detached_ms;
        r->clients = s->heaps[0].clients;
        r->mapped = s->heaps[0].mapped;
    }
}

static void s_drop(hd_peer *p, uint64_t id, uint64_t released)
{
    (void)id;
    record(p, R_DROP)->released = released;
}

static const hd_reply_ops sink = {.error = s_error,
                                  .attach = s_attach,
                                  .alloc = s_alloc,
                                  .free = s_free,
                                  .collect = s_collect,
                                  .detach = s_detach,
                                  .force = s_force,
                                  .stats = s_stats,
                                  .drop = s_drop};

/* ---- fixture ------------------------------------------------------------ */

/* A registry with heapd.conf's persist, quota_uid and max_chunk_fds_per_uid
 * (0: the default) set so. */
static void start(uint32_t persist, uint64_t quota_uid, uint32_t max_chunk_fds)
{
    nrecs = 0;
    chunk_mode = CH_NONE;
    hd_config cfg;
    hd_config_defaults(&cfg);
    cfg.persist = persist;
    cfg.quota_uid = quota_uid;
    if (max_chunk_fds)
        cfg.max_chunk_fds_per_uid = max_chunk_fds;
    ckw_start(&cfg, &sink, 1000);
}

static void setup(void) { start(0, 0, 0); }
static void setup_persist(void) { start(600, 0, 0); }

/* Releases every heap, detached ones too (what stopping heapd does): no
 * fd stays open. */
static void teardown(void) { ckw_stop(); }

/* Peer `peer` attaches as `rank` of 2-rank heap `name`, asking persist_s. */
static void attach_as(int peer, const char *name, uint32_t rank, uint32_t persist_s)
{
    Heapd__HeapParams p = HEAPD__HEAP_PARAMS__INIT;
    p.chunk_size = 1 << 20;
    p.initial_size = 1 << 20;
    p.va_size = 64 << 20;
    p.min_block = 4096;
    p.persist_s = persist_s;
    Heapd__Attach m = HEAPD__ATTACH__INIT;
    m.heap = (char *)name;
    m.world_size = 2;
    m.rank = rank;
    m.params = &p;
    hd_heap_attach(reg, &peers[peer], 100 + (uint64_t)peer, &m);
    validate();
}

static void attach(int peer, uint32_t rank, uint32_t persist_s) { attach_as(peer, "h", rank, persist_s); }

static void detach(int peer)
{
    hd_heap_detach(reg, &peers[peer], 7);
    validate();
}

static const rec *last(int peer)
{
    for (int i = nrecs - 1; i >= 0; i--)
        if (recs[i].peer == peer)
            return &recs[i];
    ck_abort_msg("no reply to peer %d", peer);
    return NULL;
}

static const rec *stats(int peer, const char *heap)
{
    Heapd__Stats m = HEAPD__STATS__INIT;
    m.heap = (char *)heap;
    hd_heap_stats(reg, &peers[peer], 9, &m, "host", 0);
    return last(peer);
}

static const rec *drop(int peer, const char *heap)
{
    Heapd__Drop m = HEAPD__DROP__INIT;
    m.heap = (char *)heap;
    hd_heap_drop(reg, &peers[peer], 11, &m);
    validate();
    return last(peer);
}

/* Heap "h" of 2 ranks (peers 0 and 1) formed, asking persist_s; both got
 * their AttachReply (chunks written with the pattern), records cleared. */
static void formed(uint32_t persist_s)
{
    chunk_mode = CH_WRITE;
    attach(0, 0, persist_s);
    attach(1, 1, persist_s);
    chunk_mode = CH_NONE;
    ck_assert_int_eq(nrecs, 2);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(recs[i].kind == R_ATTACH, "%s", recs[i].msg);
    nrecs = 0;
}

/* Both ranks leave: the heap stays, detached. */
static void both_gone(void)
{
    detach(0);
    hd_heap_conn_closed(reg, &peers[1]); /* a disconnect counts as leaving too */
    validate();
    ck_assert_uint_eq(hd_registry_heaps(reg), 1);
}

static void tick(uv_timer_t *t) { (void)t; }

/* ---- tests ----------------------------------------------------------------- */

/* persist 0 (heapd.conf's default): released with the last client. */
START_TEST(persist_0_releases)
{
    formed(0);
    detach(0);
    ck_assert_uint_eq(hd_registry_heaps(reg), 1);
    detach(1);
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
}
END_TEST

/* A heap that never formed goes with its last client, whatever it asks. */
START_TEST(unformed_releases)
{
    attach(0, 0, 60);
    ck_assert_int_eq(nrecs, 0);
    detach(0);
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
}
END_TEST

/* A formed heap that persists stays detached: stats show it, its
 * detached_ms grows; a re-attach gets its chunks back with their content. */
START_TEST(detached_and_back)
{
    formed(0); /* heapd.conf's persist: 600 */
    ck_assert_uint_eq(stats(0, "h")->persist_s, 600);
    ck_assert_uint_eq(last(0)->detached_ms, 0);
    Heapd__Alloc am = HEAPD__ALLOC__INIT;
    am.size = 4096;
    am.seq = 0;
    hd_heap_alloc(reg, &peers[0], 1, &am);
    hd_heap_alloc(reg, &peers[1], 1, &am);
    ck_assert_int_eq(last(0)->kind, R_ALLOC);
    uint64_t off = last(0)->offset;
    both_gone();
    const rec *s = stats(2, "h");
    ck_assert_uint_eq(s->nheaps, 1);
    ck_assert_uint_eq(s->clients, 0);
    ck_assert_uint_eq(s->persist_s, 600);
    ck_assert_uint_eq(s->mapped, 1 << 20);
    /* detached_ms grows: run the loop until it does (bounded). */
    uint64_t first = s->detached_ms, end = uv_now(&loop) + 5000;
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    while (stats(2, "h")->detached_ms <= first && uv_now(&loop) < end) {
        uv_timer_start(&t, tick, 5, 0);
        uv_run(&loop, UV_RUN_ONCE);
    }
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT); /* t is closed before it goes out of scope */
    ck_assert_uint_gt(last(2)->detached_ms, first);
    /* Rank 1 comes back first (on another connection): its chunks and rank
     * 0's, with the content written before. */
    chunk_mode = CH_CHECK;
    attach(3, 1, 0);
    const rec *a = last(3);
    ck_assert_msg(a->kind == R_ATTACH, "%s", a->msg);
    ck_assert_uint_eq(a->nchunks, 2);
    ck_assert_uint_eq(a->mapped, 1 << 20);
    ck_assert_uint_eq(a->persist_s, 600);
    ck_assert_uint_eq(a->bad_content, 0);
    ck_assert_uint_eq(stats(2, "h")->detached_ms, 0);
    ck_assert_uint_eq(last(2)->clients, 1);
    attach(2, 0, 600);
    ck_assert_msg(last(2)->kind == R_ATTACH, "%s", last(2)->msg);
    ck_assert_uint_eq(last(2)->bad_content, 0);
    chunk_mode = CH_NONE;
    /* The block allocated before is still held: a new one goes elsewhere. */
    am.seq = 1;
    hd_heap_alloc(reg, &peers[2], 2, &am);
    hd_heap_alloc(reg, &peers[3], 2, &am);
    ck_assert_msg(last(2)->kind == R_ALLOC, "%s", last(2)->msg);
    ck_assert_uint_ne(last(2)->offset, off);
    /* Leaving again detaches it again. */
    detach(2);
    detach(3);
    ck_assert_uint_eq(hd_registry_heaps(reg), 1);
}
END_TEST

/* The expiry releases a detached heap: the loop runs until it does. */
START_TEST(expiry_releases)
{
    formed(1);
    both_gone();
    /* The expiry does not keep a loop alive (heapd stops with detached
     * heaps): a timer of the test's own drives it. */
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    uv_timer_start(&t, tick, 20, 20);
    uint64_t end = uv_now(&loop) + 10000;
    while (hd_registry_heaps(reg) && uv_now(&loop) < end)
        uv_run(&loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
    validate();
}
END_TEST

/* 0xFFFFFFFF asks for none over heapd.conf's persist. */
START_TEST(persist_none)
{
    formed(0xFFFFFFFFu);
    ck_assert_uint_eq(stats(0, "h")->persist_s, 0);
    detach(0);
    detach(1);
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
}
END_TEST

/* Drop: releases a detached heap; ERR_STATE while it has clients,
 * ERR_DENIED for another uid, ERR_NOT_FOUND for none. */
START_TEST(drop_detached)
{
    formed(0);
    const rec *d = drop(0, "h");
    ck_assert_int_eq(d->kind, R_ERROR);
    ck_assert_int_eq(d->code, HEAPD__ERR_CODE__ERR_STATE);
    ck_assert_msg(strstr(d->msg, "has 2 client(s) attached") && strstr(d->msg, "detach them first"), "%s", d->msg);
    both_gone();
    peers[2].uid = 5555;
    d = drop(2, "h");
    ck_assert_int_eq(d->code, HEAPD__ERR_CODE__ERR_DENIED);
    ck_assert_msg(strstr(d->msg, "uid 5555") && strstr(d->msg, "uid 4242"), "%s", d->msg);
    d = drop(2, "nope");
    ck_assert_int_eq(d->code, HEAPD__ERR_CODE__ERR_NOT_FOUND);
    ck_assert_uint_eq(hd_registry_heaps(reg), 1);
    d = drop(3, "h");
    ck_assert_msg(d->kind == R_DROP, "%s", d->msg);
    ck_assert_uint_eq(d->released, 2 << 20); /* both ranks' chunk */
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
    /* root may drop another uid's heap. */
    nrecs = 0;
    formed(0);
    both_gone();
    peers[2].uid = 0;
    ck_assert_int_eq(drop(2, "h")->kind, R_DROP);
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
}
END_TEST

/* persist_s over max_persist is ERR_INVALID naming both; another persist_s
 * than the heap's is ERR_MISMATCH naming it. */
START_TEST(persist_bounds)
{
    attach(0, 0, 86401);
    ck_assert_int_eq(last(0)->code, HEAPD__ERR_CODE__ERR_INVALID);
    ck_assert_msg(strstr(last(0)->msg, "persist_s 86401") && strstr(last(0)->msg, "max_persist of 86400"), "%s",
                  last(0)->msg);
    ck_assert_uint_eq(hd_registry_heaps(reg), 0);
    nrecs = 0;
    formed(30);
    both_gone();
    attach(2, 0, 31);
    ck_assert_int_eq(last(2)->code, HEAPD__ERR_CODE__ERR_MISMATCH);
    ck_assert_msg(strstr(last(2)->msg, "persist_s 31 differs from the heap's 30"), "%s", last(2)->msg);
    attach(2, 0, 30); /* the same, or 0, is the heap's */
    ck_assert_int_eq(last(2)->kind, R_ATTACH);
}
END_TEST

/* The fixture's registry, for one with other limits. */
static void restart(uint32_t persist, uint64_t quota_uid, uint32_t max_chunk_fds)
{
    hd_registry_destroy(reg);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    hb_close(be);
    start(persist, quota_uid, max_chunk_fds);
}

/* Quotas charge a detached heap: another heap of the uid does not fit
 * until it is dropped. */
START_TEST(quota_counts_detached)
{
    restart(600, 3 << 20, 0);
    formed(0);
    both_gone();
    attach_as(2, "h2", 0, 0);
    ck_assert_int_eq(last(2)->code, HEAPD__ERR_CODE__ERR_QUOTA);
    ck_assert_msg(strstr(last(2)->msg, "quota_uid"), "%s", last(2)->msg);
    ck_assert_int_eq(drop(3, "h")->kind, R_DROP);
    int n = nrecs;
    attach_as(2, "h2", 0, 0);
    ck_assert_uint_eq(hd_registry_heaps(reg), 1); /* h2, waiting for its rank 1 */
    ck_assert_int_eq(nrecs, n);                   /* no error */
}
END_TEST

/* So does max_chunk_fds_per_uid: a detached heap's chunks are fds open in
 * heapd. */
START_TEST(chunk_fds_count_detached)
{
    restart(600, 0, 3);
    formed(0); /* 2 chunks */
    both_gone();
    attach_as(2, "h2", 0, 0); /* 2 more: over 3 */
    ck_assert_int_eq(last(2)->code, HEAPD__ERR_CODE__ERR_QUOTA);
    ck_assert_msg(strstr(last(2)->msg, "max_chunk_fds_per_uid"), "%s", last(2)->msg);
    ck_assert_int_eq(drop(3, "h")->kind, R_DROP);
    int n = nrecs;
    attach_as(2, "h2", 0, 0);
    ck_assert_int_eq(nrecs, n);
}
END_TEST

static Suite *persist_suite(void)
{
    Suite *s = suite_create("persist");
    TCase *tc = tcase_create("default");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, persist_0_releases);
    tcase_add_test(tc, unformed_releases);
    tcase_add_test(tc, expiry_releases);
    tcase_add_test(tc, persist_bounds);
    suite_add_tcase(s, tc);
    TCase *tp = tcase_create("persist");
    tcase_add_checked_fixture(tp, setup_persist, teardown);
    tcase_add_test(tp, detached_and_back);
    tcase_add_test(tp, persist_none);
    tcase_add_test(tp, drop_detached);
    tcase_add_test(tp, quota_counts_detached);
    tcase_add_test(tp, chunk_fds_count_detached);
    tcase_add_test(tp, unformed_releases);
    suite_add_tcase(s, tp);
    return s;
}

int main(void) { return ckw_main(persist_suite()); }
