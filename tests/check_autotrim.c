/*
 * check_autotrim.c - unit tests for the automatic trim (issue 30,
 * trim_threshold): the allocator core answers HA_NEED_TRIM at an
 * allocation's first step exactly when ha_trimmable reaches the threshold
 * (twin cores alike, both policies, never at 0, never again within the
 * allocation: a growth is not given back), ha_trimmable is what ha_trim
 * gives back; and the heap wing (daemon/heap/sequence.c, release.c): every
 * rank's allocation n answers trim_needed, the trim clears it, Stats counts
 * it, the threshold is the heap's (a mismatch refused, heapd.conf's by
 * default, none across nodes: refused there).
 * The wing's fixture is tests/check_wing.h's.
 */
#include "check_wing.h"

#include "alloc.h"

#define MIB (UINT64_C(1) << 20)

static void core_ok(ha_heap *h)
{
    char err[300];
    ck_assert_msg(ha_validate(h, err, sizeof err) == HA_OK, "%s", err);
}

static ha_heap *core_new(ha_policy pol, uint64_t threshold)
{
    bool eager = pol == HA_POLICY_COALESCE;
    ha_params p = {.ranks = 2,
                   .chunk_size = MIB,
                   .initial_size = MIB,
                   .va_size = 64 * MIB,
                   .min_block = 4096,
                   .policy = pol,
                   .reclaim = eager ? HA_RECLAIM_EAGER : HA_RECLAIM_COLLECT,
                   .one_decider = eager,
                   .trim_threshold = threshold};
    ha_heap *h = NULL;
    char err[200];
    ck_assert_msg(ha_create(&p, &h, err, sizeof err) == HA_OK, "%s", err);
    return h;
}

/* Twin cores t[0..1] (t[1] may be NULL) run one allocation through the
 * protocol alike: collect, grow and (issue 30) trim, each step answered
 * the same by both. HA_NEED_TRIM is asked for exactly when the first
 * step finds ha_trimmable >= the threshold; its trim gives back what
 * ha_trimmable said. *trims (may be NULL) counts the trims; the offset. */
static uint64_t twin_alloc(ha_heap **t, uint64_t size, uint64_t threshold, unsigned *trims)
{
    ha_alloc_result r[2];
    for (int step = 0;; step++) {
        uint64_t can = ha_trimmable(t[0], UINT64_MAX);
        int rc = ha_alloc(t[0], size, &r[0]);
        if (t[1])
            ck_assert_int_eq(ha_alloc(t[1], size, &r[1]), rc);
        if (step == 0)
            ck_assert_msg((rc == HA_NEED_TRIM) == (threshold && can >= threshold),
                          "step 0: rc %d with %llu trimmable, threshold %llu", rc, (unsigned long long)can,
                          (unsigned long long)threshold);
        else
            ck_assert_int_ne(rc, HA_NEED_TRIM); /* once per allocation, first */
        if (rc == HA_NEED_TRIM) {
            uint32_t c0 = 0, c1 = 0;
            ck_assert_int_eq(ha_trim(t[0], &c0, NULL, NULL), HA_OK);
            ck_assert_uint_eq(c0 * MIB, can);
            if (t[1]) {
                ck_assert_int_eq(ha_trim(t[1], &c1, NULL, NULL), HA_OK);
                ck_assert_uint_eq(c0, c1);
            }
            ck_assert_uint_eq(ha_trimmable(t[0], UINT64_MAX), 0);
            if (trims)
                ++*trims;
        } else if (rc == HA_NEED_COLLECT) {
            for (int i = 0; i < 2 && t[i]; i++)
                ck_assert_int_eq(ha_collect(t[i], NULL, NULL), HA_OK);
        } else if (rc == HA_NEED_GROW) {
            for (int i = 0; i < 2 && t[i]; i++)
                ck_assert_int_eq(ha_grow(t[i], r[0].grow_chunks), HA_OK);
        } else {
            ck_assert_int_eq(rc, HA_OK);
            if (t[1])
                ck_assert_uint_eq(r[0].offset, r[1].offset);
            core_ok(t[0]);
            return r[0].offset;
        }
    }
}

static void free_both(ha_heap **t, uint64_t off)
{
    for (int i = 0; i < 2 && t[i]; i++)
        for (uint32_t r = 0; r < 2; r++)
            ck_assert_int_eq(ha_free(t[i], r, off), HA_OK);
}

static uint64_t mapped_of(const ha_heap *h)
{
    ha_stats st;
    ha_get_stats(h, &st);
    return st.mapped;
}

/* Four 1 MiB blocks, then the three above the lowest freed: 3 MiB of
 * wholly free chunks at the top. At a threshold of 3 MiB the next
 * allocation trims first (the extent drops to a chunk), then grows for its
 * block without a second trim; at 3 MiB + 1 or 0 it does not trim. */
static void core_crossing(ha_policy pol)
{
    uint64_t thr[] = {3 * MIB, 3 * MIB + 1, 0};
    for (int i = 0; i < 3; i++) {
        ha_heap *t[2] = {core_new(pol, thr[i]), NULL};
        uint64_t off[4];
        unsigned trims = 0;
        for (int j = 0; j < 4; j++)
            off[j] = twin_alloc(t, MIB, thr[i], &trims);
        ck_assert_uint_eq(trims, 0);
        ck_assert_uint_eq(mapped_of(t[0]), 4 * MIB);
        uint64_t low = off[0];
        for (int j = 1; j < 4; j++)
            low = off[j] < low ? off[j] : low;
        ck_assert_uint_eq(low, 0);
        for (int j = 0; j < 4; j++)
            if (off[j] != low)
                free_both(t, off[j]);
        if (pol == HA_POLICY_SEED)
            ck_assert_int_eq(ha_collect(t[0], NULL, NULL), HA_OK);
        ck_assert_uint_eq(ha_trimmable(t[0], UINT64_MAX), 3 * MIB);
        ck_assert_uint_ge(ha_trimmable(t[0], MIB), MIB); /* counted at least that far */
        twin_alloc(t, 4096, thr[i], &trims);
        ha_stats st;
        ha_get_stats(t[0], &st);
        ck_assert_uint_eq(trims, i == 0);
        ck_assert_uint_eq(st.trims_asked, i == 0);
        ck_assert_uint_eq(st.trims, i == 0);
        ck_assert_uint_eq(st.mapped, i == 0 ? 2 * MIB : 4 * MIB); /* trimmed to 1, grown by 1 */
        ha_destroy(t[0]);
    }
}

START_TEST(core_autotrim_crossing_coalesce) { core_crossing(HA_POLICY_COALESCE); }
END_TEST

START_TEST(core_autotrim_crossing_seed) { core_crossing(HA_POLICY_SEED); }
END_TEST

/* Twin cores fed the same random allocations and frees (every rank) ask
 * for a trim at the same allocations, exactly when the threshold is
 * reached (twin_alloc checks it at each), holes included; the same
 * sequence without a threshold never asks. */
static unsigned random_run(uint64_t threshold, ha_stats *out)
{
    ha_heap *t[2] = {core_new(HA_POLICY_COALESCE, threshold), core_new(HA_POLICY_COALESCE, threshold)};
    uint64_t live[64];
    unsigned n = 0, trims = 0;
    uint32_t x = 7;
    for (int step = 0; step < 4000; step++) {
        x = x * 1103515245u + 12345u;
        unsigned op = (x >> 16) % 16;
        if (op < 8 && n < 40) {
            uint64_t size = 4096 + (uint64_t)((x >> 4) % (3 * MIB / 2));
            live[n++] = twin_alloc(t, size, threshold, &trims);
        } else if (n) {
            unsigned i = (x >> 8) % n;
            free_both(t, live[i]);
            live[i] = live[--n];
        }
    }
    ha_stats sb;
    ha_get_stats(t[0], out);
    ha_get_stats(t[1], &sb);
    ck_assert_mem_eq(out, &sb, sizeof sb);
    ck_assert_uint_eq(out->trims_asked, trims);
    ha_destroy(t[0]);
    ha_destroy(t[1]);
    return trims;
}

START_TEST(core_autotrim_random_twins)
{
    ha_stats on, off;
    unsigned trims = random_run(4 * MIB, &on);
    ck_assert_uint_gt(trims, 0);
    ck_assert_uint_gt(on.hole_bytes + on.trimmed_bytes, 0);
    ck_assert_uint_eq(random_run(0, &off), 0);
    ck_assert_uint_eq(off.trims, 0);
    ck_assert_uint_eq(off.trims_asked, 0);
}
END_TEST

/* ---- the heap wing ---------------------------------------------------------- */

static void trim(int peer)
{
    Heapd__Trim m = HEAPD__TRIM__INIT;
    hd_heap_trim(reg, &peers[peer], 13, &m);
    validate();
}

/* Four 1 MiB blocks on both ranks (seq 0..3), the three above offset 0
 * freed by both: 3 MiB of wholly free chunks. */
static void four_freed(void)
{
    formed();
    uint64_t off[4];
    for (uint64_t i = 0; i < 4; i++)
        off[i] = alloc2(i, MIB, NULL);
    for (int i = 0; i < 4; i++)
        if (off[i]) {
            free1(0, off[i]);
            free1(1, off[i]);
        }
    stats(2);
    ck_assert_uint_eq(last(2)->mapped, 4 * MIB);
}

/* With trim_threshold 2 MiB, allocation 4 answers trim_needed to each
 * rank (decided once: the second rank reads it), nothing allocated; the
 * collective trim gives the 3 chunks back on both ranks; then allocation
 * 4 is decided (a growth for it, not trimmed again) and Stats counts the
 * trim. */
START_TEST(wing_autotrim_every_rank)
{
    trim_threshold = 2 * MIB;
    four_freed();
    alloc_n(0, 4, 4096, NULL);
    ck_assert_msg(last(0)->kind == R_ALLOC && last(0)->trim_needed && !last(0)->collect_needed, "%s", last(0)->msg);
    alloc_n(1, 4, 4096, NULL);
    ck_assert_msg(last(1)->kind == R_ALLOC && last(1)->trim_needed, "%s", last(1)->msg);
    alloc_n(0, 4, 4096, NULL); /* asking again before the trim: the same answer */
    ck_assert(last(0)->trim_needed);
    trim(0);
    trim(1);
    ck_assert_msg(last(0)->kind == R_TRIM, "%s", last(0)->msg);
    ck_assert_uint_eq(last(1)->trimmed, 3 * MIB);
    ck_assert_uint_eq(last(1)->mapped, MIB);
    alloc_n(0, 4, 4096, NULL);
    ck_assert_msg(last(0)->kind == R_ALLOC && !last(0)->trim_needed, "%s", last(0)->msg);
    alloc_n(1, 4, 4096, NULL);
    ck_assert_msg(last(1)->kind == R_ALLOC && !last(1)->trim_needed, "%s", last(1)->msg);
    ck_assert_uint_eq(last(0)->offset, last(1)->offset);
    stats(2);
    ck_assert_uint_eq(last(2)->trims, 1);
    ck_assert_uint_eq(last(2)->trimmed, 6 * MIB); /* 3 chunks on each of 2 ranks */
    ck_assert_uint_eq(last(2)->mapped, 2 * MIB);
}
END_TEST

/* Threshold 0 (heapd.conf's default, off): the same frees trim nothing. */
START_TEST(wing_autotrim_off)
{
    four_freed();
    alloc_n(0, 4, 4096, NULL);
    ck_assert_msg(last(0)->kind == R_ALLOC && !last(0)->trim_needed, "%s", last(0)->msg);
    alloc_n(1, 4, 4096, NULL);
    ck_assert_msg(last(1)->kind == R_ALLOC && !last(1)->trim_needed, "%s", last(1)->msg);
    stats(2);
    ck_assert_uint_eq(last(2)->trims, 0);
    ck_assert_uint_eq(last(2)->mapped, 4 * MIB);
}
END_TEST

/* The threshold is the heap's: a later attach asking another is refused. */
START_TEST(wing_autotrim_mismatch)
{
    trim_threshold = 2 * MIB;
    attach(0, 0);
    trim_threshold = 3 * MIB;
    attach(1, 1);
    ck_assert_int_eq(last(1)->kind, R_ERROR);
    ck_assert_int_eq(last(1)->code, HEAPD__ERR_CODE__ERR_MISMATCH);
    ck_assert_msg(strstr(last(1)->msg, "trim_threshold 3145728 differs from the heap's 2097152"), "%s", last(1)->msg);
}
END_TEST

/* heapd.conf's trim_threshold is the default of a heap on one node (its
 * attach leaves it at 0); a heap that spans nodes takes none, and asking
 * for one there is refused. (A store that never connects: the attach forms
 * over the local rank.) */
START_TEST(wing_autotrim_config_and_multinode)
{
    hd_config cfg;
    hd_config_defaults(&cfg);
    cfg.trim_threshold = 2 * MIB;
    hd_registry_set_config(reg, &cfg);
    four_freed();
    alloc_n(0, 4, 4096, NULL);
    ck_assert_msg(last(0)->kind == R_ALLOC && last(0)->trim_needed, "%s", last(0)->msg);
    char err[256];
    hd_store *st = NULL;
    ck_assert_msg(hd_store_open(&loop, "redis://127.0.0.1:1", "n0", &st, err, sizeof err) == 0, "%s", err);
    hd_registry_set_store(reg, st);
    Heapd__HeapParams p = HEAPD__HEAP_PARAMS__INIT;
    p.chunk_size = 1 << 20;
    p.va_size = 64 << 20;
    p.min_block = 4096;
    p.trim_threshold = 2 * MIB;
    Heapd__Attach m = HEAPD__ATTACH__INIT;
    m.heap = (char *)"multi";
    m.world_size = 2;
    m.local_size = 1;
    m.params = &p;
    hd_heap_attach(reg, &peers[2], 1, &m);
    is_error(2, HEAPD__ERR_CODE__ERR_INVALID, "a heap that spans nodes cannot trim");
    p.trim_threshold = 0; /* heapd.conf's 2 MiB does not apply across nodes */
    hd_heap_attach(reg, &peers[2], 1, &m);
    ck_assert_msg(last(2)->kind == R_ATTACH, "%s", last(2)->msg);
    hd_heap_conn_closed(reg, &peers[2]);
    hd_registry_set_store(reg, NULL);
    hd_store_close(st);
    uv_run(&loop, UV_RUN_NOWAIT);
}
END_TEST

static Suite *autotrim_suite(void)
{
    Suite *s = suite_create("autotrim");
    TCase *core = tcase_create("core");
    tcase_set_timeout(core, 60);
    tcase_add_test(core, core_autotrim_crossing_coalesce);
    tcase_add_test(core, core_autotrim_crossing_seed);
    tcase_add_test(core, core_autotrim_random_twins);
    suite_add_tcase(s, core);
    TCase *tc = tcase_create("wing");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, wing_autotrim_every_rank);
    tcase_add_test(tc, wing_autotrim_off);
    tcase_add_test(tc, wing_autotrim_mismatch);
    tcase_add_test(tc, wing_autotrim_config_and_multinode);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ckw_main(autotrim_suite()); }
