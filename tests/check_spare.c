/*
 * check_spare.c - issue 27's growth ahead of need (daemon/heap/spare.c) on
 * the host backend with the real heap wing: after a heap forms, each local
 * rank gets grow_ahead spare chunks, made by the loop after the replies (not
 * during the request); a growth takes them (heapd opens no fd for it) and
 * the loop refills them; grow_ahead 0 (heapd.conf) or none (the request)
 * means no spare; the offsets are those of a heap without spares; a quota
 * makes spares of the uid's other heaps yield before it refuses a growth;
 * release, detach and drop release them (heapd's fds counted). The fixture
 * is tests/check_wing.h's (its teardown checks that no fd is left).
 */
#include "check_wing.h"

#define MIB (UINT64_C(1) << 20)

/* Peer attaches as rank of heap `name` (world ranks, 1 MiB chunks, 64 MiB
 * va), asking for grow_ahead (0: heapd.conf's; HD_GROW_AHEAD_NONE: none). */
static void att(int peer, const char *name, uint32_t rank, uint32_t world, uint32_t grow_ahead, uint32_t persist)
{
    Heapd__HeapParams p = HEAPD__HEAP_PARAMS__INIT;
    p.chunk_size = MIB;
    p.initial_size = MIB;
    p.va_size = 64 * MIB;
    p.min_block = 4096;
    p.collect_timeout_ms = 10000;
    p.grow_ahead = grow_ahead;
    p.persist_s = persist;
    Heapd__Attach m = HEAPD__ATTACH__INIT;
    m.heap = (char *)name;
    m.world_size = world;
    m.rank = rank;
    m.params = &p;
    hd_heap_attach(reg, &peers[peer], 1, &m);
    validate();
}

/* Runs the loop until nothing is left to do (the refill's idle handle
 * stopped: every heap has its spares, or none can be made now). */
static void settle(void)
{
    for (int i = 0; i < 100000 && uv_run(&loop, UV_RUN_NOWAIT); i++)
        ;
    validate();
}

static const rec *stats_of(int peer, const char *name)
{
    Heapd__Stats m = HEAPD__STATS__INIT;
    m.heap = (char *)name;
    hd_heap_stats(reg, &peers[peer], 3, &m, "host", 0);
    ck_assert_msg(last(peer)->kind == R_STATS, "%s", last(peer)->msg);
    return last(peer);
}

static uint64_t alloc_on(int peer, uint64_t seq, uint64_t size)
{
    alloc_n(peer, seq, size, NULL);
    ck_assert_msg(last(peer)->kind == R_ALLOC, "peer %d: %s", peer, last(peer)->msg);
    return last(peer)->offset;
}

/* After the attach replies the heap has no spare yet; the loop makes one
 * per rank. A growth takes them: no fd opened, Stats shows none until the
 * loop refilled them. */
START_TEST(spare_made_taken_refilled)
{
    att(0, "h", 0, 2, 0, 0);
    att(1, "h", 1, 2, 0, 0);
    ck_assert_int_eq(last(1)->kind, R_ATTACH);
    ck_assert_uint_eq(stats_of(0, "h")->spare, 0); /* not on the attach's path */
    settle();
    const rec *s = stats_of(0, "h");
    ck_assert_uint_eq(s->grow_ahead, 1);
    ck_assert_uint_eq(s->spare, 2 * MIB);
    ck_assert_uint_eq(s->mapped, MIB);
    stats_of(1, "h");
    int fds = cku_count_fds();
    uint64_t seq = 0;
    while (stats_of(0, "h")->mapped == MIB) {
        uint64_t o = alloc_on(0, seq, 512 * 1024);
        ck_assert_uint_eq(alloc_on(1, seq, 512 * 1024), o);
        seq++;
        ck_assert_uint_lt(seq, 8);
    }
    s = stats_of(0, "h");
    ck_assert_uint_eq(s->mapped, 2 * MIB);
    ck_assert_uint_eq(s->spare, 0);
    stats_of(1, "h");
    ck_assert_int_eq(cku_count_fds(), fds); /* the growth opened no fd: it took the spares */
    settle();
    ck_assert_uint_eq(stats_of(0, "h")->spare, 2 * MIB);
    stats_of(1, "h");
    ck_assert_int_eq(cku_count_fds(), fds + 2); /* refilled: one spare per rank */
}
END_TEST

/* Issue 30: a hole (a wholly free chunk trimmed below a live one) is
 * refilled by a growth from the rank's spare, at its index: no fd opened,
 * the block at the hole's offset, the spares refilled after. */
START_TEST(spare_fills_a_hole)
{
    att(0, "h", 0, 2, 0, 0);
    att(1, "h", 1, 2, 0, 0);
    settle();
    uint64_t o[3];
    for (uint64_t seq = 0; seq < 3; seq++) {
        o[seq] = alloc_on(0, seq, MIB);
        ck_assert_uint_eq(alloc_on(1, seq, MIB), o[seq]);
    }
    uint64_t mid = o[0] == MIB ? o[0] : o[1] == MIB ? o[1] : o[2];
    ck_assert_uint_eq(mid, MIB);
    free1(0, mid);
    free1(1, mid);
    Heapd__Trim m = HEAPD__TRIM__INIT;
    hd_heap_trim(reg, &peers[0], 13, &m);
    hd_heap_trim(reg, &peers[1], 13, &m);
    validate();
    ck_assert_msg(last(1)->kind == R_TRIM, "%s", last(1)->msg);
    ck_assert_uint_eq(last(1)->ntrim, 1);
    ck_assert_uint_eq(last(1)->trim_chunks[0], 1);
    settle(); /* the trim dropped the spares: the loop makes them again */
    const rec *s = stats_of(0, "h");
    ck_assert_uint_eq(s->spare, 2 * MIB);
    ck_assert_uint_eq(s->mapped, 3 * MIB);
    stats_of(1, "h");
    int fds = cku_count_fds();
    ck_assert_uint_eq(alloc_on(0, 3, MIB), MIB);
    ck_assert_uint_eq(alloc_on(1, 3, MIB), MIB);
    s = stats_of(0, "h");
    ck_assert_uint_eq(s->mapped, 3 * MIB);
    ck_assert_uint_eq(s->spare, 0);
    stats_of(1, "h");
    ck_assert_int_eq(cku_count_fds(), fds); /* the spares filled the hole */
    settle();
    ck_assert_uint_eq(stats_of(0, "h")->spare, 2 * MIB);
}
END_TEST

/* The same sequence of sizes and frees on a heap with 3 spares per rank
 * and on one with none gives the same offsets (the allocator never sees a
 * spare); the first holds 3 per rank after each refill, the second none. */
START_TEST(offsets_as_without_spares)
{
    att(0, "a", 0, 2, 3, 0);
    att(1, "a", 1, 2, 3, 0);
    att(2, "b", 0, 2, HD_GROW_AHEAD_NONE, 0);
    att(3, "b", 1, 2, HD_GROW_AHEAD_NONE, 0);
    settle();
    ck_assert_uint_eq(stats_of(0, "a")->spare, 6 * MIB);
    ck_assert_uint_eq(stats_of(2, "b")->spare, 0);
    ck_assert_uint_eq(last(2)->grow_ahead, 0);
    uint64_t held[64];
    unsigned nheld = 0;
    uint32_t x = 12345;
    for (uint64_t seq = 0; seq < 40; seq++) {
        x = x * 1103515245u + 12345u;
        uint64_t size = (uint64_t)((x >> 8) % (3 * MIB)) + 1;
        uint64_t o = alloc_on(0, seq, size);
        ck_assert_uint_eq(alloc_on(1, seq, size), o);
        ck_assert_uint_eq(alloc_on(2, seq, size), o);
        ck_assert_uint_eq(alloc_on(3, seq, size), o);
        held[nheld++] = o;
        if ((x >> 4) % 3 == 0 && nheld > 1) { /* free the oldest on every rank */
            for (int p = 0; p < 4; p++)
                free1(p, held[0]);
            memmove(held, held + 1, --nheld * sizeof *held);
        }
        if (seq % 5 == 0)
            settle();
    }
    settle();
    const rec *a = stats_of(0, "a");
    ck_assert_uint_gt(a->mapped, 3 * MIB); /* it grew more than once */
    ck_assert_uint_eq(a->mapped, stats_of(2, "b")->mapped);
    ck_assert_uint_eq(last(2)->spare, 0);
    ck_assert_uint_eq(stats_of(0, "a")->spare, 6 * MIB);
}
END_TEST

/* heapd.conf's grow_ahead 0 means none; a request may still ask; over 16
 * is refused, and a later attach asking for another count is a mismatch. */
START_TEST(grow_ahead_off_and_checked)
{
    ckw_stop();
    hd_config cfg;
    hd_config_defaults(&cfg);
    cfg.grow_ahead = 0;
    ckw_start(&cfg, &sink, 3000);
    att(0, "h", 0, 1, 0, 0);
    settle();
    ck_assert_uint_eq(stats_of(0, "h")->spare, 0);
    ck_assert_uint_eq(last(0)->grow_ahead, 0);
    att(1, "g", 0, 2, 17, 0);
    is_error(1, HEAPD__ERR_CODE__ERR_INVALID, "grow_ahead 17 is over the limit of 16");
    att(1, "g", 0, 2, 2, 0);
    att(2, "g", 1, 2, 3, 0);
    is_error(2, HEAPD__ERR_CODE__ERR_MISMATCH, "grow_ahead 3 differs from the heap's 2");
    att(2, "g", 1, 2, 0, 0);
    ck_assert_int_eq(last(2)->kind, R_ATTACH);
    settle();
    ck_assert_uint_eq(stats_of(1, "g")->spare, 4 * MIB);
}
END_TEST

/* quota_uid leaves room for half a chunk more than what the uid's two heaps
 * use: heap b's growth needs a chunk, so heap a's spare yields (released),
 * and the growth is served; the next one is refused (nothing to yield). */
START_TEST(quota_spares_yield)
{
    att(0, "a", 0, 1, 1, 0);
    att(1, "b", 0, 1, HD_GROW_AHEAD_NONE, 0);
    alloc_on(1, 0, 512 * 1024); /* b's log and block records exist before the measure */
    settle();
    const rec *s = stats_of(0, "a");
    ck_assert_uint_eq(s->spare, MIB);
    uint64_t use = s->mapped + s->spare + s->bookkeeping;
    s = stats_of(1, "b");
    use += s->mapped + s->spare + s->bookkeeping;
    hd_config cfg;
    hd_config_defaults(&cfg);
    cfg.quota_uid = use + MIB / 2;
    hd_registry_set_config(reg, &cfg);
    uint64_t seq = 1;
    while (stats_of(1, "b")->mapped == MIB) {
        alloc_on(1, seq++, 512 * 1024);
        ck_assert_uint_lt(seq, 8);
    }
    ck_assert_uint_eq(stats_of(0, "a")->spare, 0); /* it yielded */
    settle();
    ck_assert_uint_eq(stats_of(0, "a")->spare, 0); /* and is not made again: no room */
    for (int i = 0; i < 8 && last(1)->kind != R_ERROR; i++)
        alloc_n(1, seq++, 512 * 1024, NULL);
    is_error(1, HEAPD__ERR_CODE__ERR_QUOTA, "quota_uid");
}
END_TEST

/* A release drops the spares with the chunks, a restore makes them again;
 * the last client's detach (the heap persists) drops them; heapd's fds say
 * so. Dropping the heap leaves nothing (teardown). */
START_TEST(release_detach_drop)
{
    att(0, "h", 0, 2, 0, 60);
    att(1, "h", 1, 2, 0, 60);
    settle();
    ck_assert_uint_eq(stats_of(0, "h")->spare, 2 * MIB);
    stats_of(1, "h");
    int fds = cku_count_fds();
    Heapd__Release rm = HEAPD__RELEASE__INIT;
    rm.mode = HEAPD__RELEASE_MODE__RELEASE_DISCARD;
    hd_heap_release(reg, &peers[0], 11, &rm);
    hd_heap_release(reg, &peers[1], 11, &rm);
    validate();
    ck_assert_int_eq(last(1)->kind, R_RELEASE);
    settle();
    ck_assert_uint_eq(stats_of(0, "h")->spare, 0);
    stats_of(1, "h");
    ck_assert_int_eq(cku_count_fds(), fds - 4); /* 2 chunks, 2 spares */
    Heapd__Restore sm = HEAPD__RESTORE__INIT;
    hd_heap_restore(reg, &peers[0], 12, &sm);
    hd_heap_restore(reg, &peers[1], 12, &sm);
    validate();
    ck_assert_int_eq(last(1)->kind, R_RESTORE);
    settle();
    ck_assert_uint_eq(stats_of(0, "h")->spare, 2 * MIB);
    stats_of(1, "h");
    ck_assert_int_eq(cku_count_fds(), fds);
    hd_heap_detach(reg, &peers[0], 5);
    hd_heap_detach(reg, &peers[1], 5);
    validate();
    settle();
    ck_assert_uint_eq(stats_of(0, "h")->spare, 0);
    stats_of(1, "h");
    ck_assert_int_eq(cku_count_fds(), fds - 2);
    /* Back again: the spares with it. */
    att(0, "h", 0, 2, 0, 60);
    settle();
    ck_assert_uint_eq(stats_of(0, "h")->spare, 2 * MIB);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("spare");
    TCase *tc = tcase_create("spare");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, spare_made_taken_refilled);
    tcase_add_test(tc, spare_fills_a_hole);
    tcase_add_test(tc, offsets_as_without_spares);
    tcase_add_test(tc, grow_ahead_off_and_checked);
    tcase_add_test(tc, quota_spares_yield);
    tcase_add_test(tc, release_detach_drop);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ckw_main(suite()); }
