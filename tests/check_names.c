/*
 * check_names.c - unit tests for the heap wing's issue-29 parts: allocation
 * names and their symmetry, the block table and live sets, generations,
 * re-attach numbering and the gone-rank semantics (commit markers:
 * check_commit.c). Like check_heap.c: requests go in decoded, answers come
 * back through a recording sink (tests/check_wing.h: the latest answer per
 * peer), the host backend makes the chunks.
 */
#include "check_wing.h"

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
    /* many_live_blocks makes 34,000 allocations; a sanitizer build validates
     * the allocator and the wing after each (O(blocks) each): 45-52 s on an
     * idle 2-core machine, more when it is loaded. The bound is for a hang,
     * not a speed check. */
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, names_in_live_set);
    tcase_add_test(tc, name_asymmetry);
    tcase_add_test(tc, name_checked);
    tcase_add_test(tc, clean_detach_own_seq);
    tcase_add_test(tc, many_live_blocks);
    tcase_add_test(tc, table_swept);
    tcase_add_test(tc, gone_rank);
    tcase_add_test(tc, all_gone_reattach);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ckw_main(names_suite()); }
