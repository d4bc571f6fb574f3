/*
 * check_commit.c - unit tests for the heap wing's commit markers (issue 29,
 * daemon/heap/commit.c): agreement, mismatches, wrong allocation numbers, a
 * rank gone or late, tags and their limit, heaps across nodes, markers in a
 * re-attach. The fixture is tests/check_wing.h's.
 */
#include "check_wing.h"

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

/* A heap that spans nodes refuses Commit: markers do not cross nodes yet.
 * (A store that never connects: the attach forms over the local rank.) */
START_TEST(commit_multinode_refused)
{
    char err[256];
    hd_store *st = NULL;
    ck_assert_msg(hd_store_open(&loop, "redis://127.0.0.1:1", "n0", &st, err, sizeof err) == 0, "%s", err);
    hd_registry_set_store(reg, st);
    Heapd__HeapParams p = HEAPD__HEAP_PARAMS__INIT;
    p.chunk_size = 1 << 20;
    p.va_size = 64 << 20;
    p.min_block = 4096;
    Heapd__Attach m = HEAPD__ATTACH__INIT;
    m.heap = (char *)"multi";
    m.world_size = 2;
    m.local_size = 1;
    m.rank = 0;
    m.params = &p;
    hd_heap_attach(reg, &peers[0], 1, &m);
    ck_assert_msg(last(0)->kind == R_ATTACH, "%s", last(0)->msg);
    commit(0, "step", 1, 0);
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "commit markers do not cross nodes yet");
    hd_heap_conn_closed(reg, &peers[0]);
    hd_registry_set_store(reg, NULL);
    hd_store_close(st);
    uv_run(&loop, UV_RUN_NOWAIT);
}
END_TEST

static Suite *commit_suite(void)
{
    Suite *s = suite_create("commit");
    TCase *tc = tcase_create("markers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, commit_agreement);
    tcase_add_test(tc, commit_peer_gone);
    tcase_add_test(tc, commit_timeout);
    tcase_add_test(tc, commit_tags);
    tcase_add_test(tc, commit_multinode_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ckw_main(commit_suite()); }
