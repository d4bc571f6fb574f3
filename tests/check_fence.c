/* check_fence.c - client/heapc_fence.c on its host source (heapc_hstream):
 * groups per stream run, the reap (completed groups go out unless released
 * early), hf_queue_order (issue 27: a reused block waits only for another
 * stream's work, and only where it overlaps), hf_queue_wait_early. */
#include "heapc_fence.h"
#include "heapc.h"

#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include "check_util.h"

static uint64_t emitted[64];
static size_t nemitted;

static int emit(void *data, const uint64_t *offs, size_t n)
{
    (void)data;
    for (size_t i = 0; i < n && nemitted < 64; i++)
        emitted[nemitted++] = offs[i];
    return 0;
}

static hf_queue mkq(size_t batch)
{
    hf_source src;
    hf_host_source(&src);
    hf_queue q;
    hf_queue_init(&q, src, batch);
    nemitted = 0;
    return q;
}

START_TEST(reap_emits_completed_held_groups_only)
{
    char err[256];
    hf_queue q = mkq(8);
    heapc_hstream *s = heapc_hstream_create(), *t = heapc_hstream_create();
    uint64_t ks = heapc_hstream_begin(s);
    heapc_hstream_begin(t); /* t's work never completes here */
    ck_assert_int_eq(hf_queue_add(&q, s, 100, 10, 0, err, sizeof err), HF_OK);
    ck_assert_int_eq(hf_queue_add(&q, s, 200, 10, 1, err, sizeof err), HF_OK); /* early: a new group */
    ck_assert_int_eq(hf_queue_add(&q, t, 300, 10, 0, err, sizeof err), HF_OK); /* another stream */
    ck_assert_uint_eq(q.waiting, 3);
    ck_assert_uint_eq(q.held, 2);
    ck_assert_int_eq(hf_queue_close(&q, err, sizeof err), HF_OK);
    ck_assert_uint_eq(q.nclosed, 3);
    ck_assert_int_eq(hf_queue_reap(&q, 0, emit, NULL, err, sizeof err), HF_OK);
    ck_assert_uint_eq(nemitted, 0); /* nothing completed */
    heapc_hstream_complete(s, ks);
    ck_assert_int_eq(hf_queue_reap(&q, 0, emit, NULL, err, sizeof err), HF_OK);
    ck_assert_uint_eq(nemitted, 1); /* 100; 200 was sent at its free */
    ck_assert_uint_eq(emitted[0], 100);
    ck_assert_uint_eq(q.waiting, 1);
    ck_assert_uint_eq(q.held, 1);
    hf_queue_destroy(&q);
    heapc_hstream_destroy(s);
    heapc_hstream_destroy(t);
}
END_TEST

START_TEST(order_waits_for_another_stream_where_it_overlaps)
{
    char err[256];
    hf_queue q = mkq(8);
    heapc_hstream *s = heapc_hstream_create(), *t = heapc_hstream_create();
    uint64_t ks = heapc_hstream_begin(s);
    ck_assert_int_eq(hf_queue_add(&q, s, 4096, 4096, 1, err, sizeof err), HF_OK);
    /* the same stream: stream order, nothing to do (s is still busy) */
    ck_assert_int_eq(hf_queue_order(&q, 4096, 4096, s, 1, err, sizeof err), HF_OK);
    ck_assert_uint_eq(q.orders, 0);
    /* another stream, no overlap: nothing */
    ck_assert_int_eq(hf_queue_order(&q, 8192, 4096, t, 1, err, sizeof err), HF_OK);
    ck_assert_int_eq(hf_queue_order(&q, 0, 4096, t, 1, err, sizeof err), HF_OK);
    ck_assert_uint_eq(q.orders, 0);
    ck_assert_uint_eq(q.nclosed, 0); /* the open group got no marker for them */
    /* another stream, overlapping the block's middle: its work is waited for
     * (host: completed first, so this does not block) */
    heapc_hstream_complete(s, ks);
    ck_assert_int_eq(hf_queue_order(&q, 6000, 100, t, 1, err, sizeof err), HF_OK);
    ck_assert_uint_eq(q.orders, 1); /* once, though the group closed on the way */
    ck_assert_uint_eq(q.nclosed, 1);
    /* no stream known: waited for as well */
    ck_assert_int_eq(hf_queue_order(&q, 4096, 1, NULL, 0, err, sizeof err), HF_OK);
    ck_assert_uint_eq(q.orders, 2);
    hf_queue_destroy(&q);
    heapc_hstream_destroy(s);
    heapc_hstream_destroy(t);
}
END_TEST

static void *complete_when_waited(void *arg)
{
    heapc_hstream *s = arg;
    while (heapc_hstream_waiters(s) == 0)
        sched_yield();
    heapc_hstream_complete(s, 1);
    return NULL;
}

START_TEST(wait_early_blocks_until_the_work_completed)
{
    char err[256];
    hf_queue q = mkq(8);
    heapc_hstream *s = heapc_hstream_create();
    ck_assert_uint_eq(heapc_hstream_begin(s), 1);
    ck_assert_int_eq(hf_queue_add(&q, s, 0, 64, 1, err, sizeof err), HF_OK);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, complete_when_waited, s), 0);
    ck_assert_int_eq(hf_queue_wait_early(&q, err, sizeof err), HF_OK);
    ck_assert_uint_eq(heapc_hstream_pending(s), 0); /* it returned after the work, not before */
    pthread_join(th, NULL);
    hf_queue_destroy(&q);
    heapc_hstream_destroy(s);
}
END_TEST

static Suite *fence_suite(void)
{
    Suite *s = suite_create("fence");
    TCase *tc = tcase_create("host");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, reap_emits_completed_held_groups_only);
    tcase_add_test(tc, order_waits_for_another_stream_where_it_overlaps);
    tcase_add_test(tc, wait_early_blocks_until_the_work_completed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(fence_suite()); }
