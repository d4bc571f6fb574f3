/* check_replica.c - libheapc's replica of the heap's allocator (issue 28,
 * client/heapc_replica.c) against an allocator core driven as heapd drives
 * a local_every heap's (daemon/heap/sequence.c, horizon.c, collect.c): the
 * rank's local decisions equal the core's, round trips (rounds, collects
 * asked and explicit, growths) keep both alike, and a step the replica
 * cannot follow makes it lost rather than wrong. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check_util.h"
#include "heapc_replica.h"
#include "policy.h"

#define KIB 1024ull
#define L   8u

typedef struct twin {
    ha_heap *core; /* heapd's: 2 ranks, reclaim collect, not one decider */
    hrp_replica rep;
    uint64_t live[512];
    size_t nlive;
    uint64_t lag[1024]; /* released by rank 0, not yet by rank 1 */
    size_t nlag;
    bool rounds; /* reclaim eager: heapd's rounds (not under seed) */
} twin;

static void twin_init(twin *t, ha_policy pol)
{
    memset(t, 0, sizeof *t);
    ha_params p = {.ranks = 2,
                   .chunk_size = 64 * KIB,
                   .initial_size = 64 * KIB,
                   .va_size = 64 * 1024 * KIB,
                   .min_block = 256,
                   .policy = pol,
                   .reclaim = HA_RECLAIM_COLLECT};
    char err[200];
    ck_assert_int_eq(ha_create(&p, &t->core, err, sizeof err), HA_OK);
    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    hp.chunk_size = p.chunk_size;
    hp.initial_size = p.initial_size;
    hp.va_size = p.va_size;
    hp.min_block = p.min_block;
    hp.policy = (Heapd__Policy)hpo_to_wire(pol);
    hp.trim_threshold = UINT64_MAX;
    ck_assert_int_eq(hrp_start(&t->rep, &hp, L), 0);
    t->rounds = pol == HA_POLICY_COALESCE;
}

static void twin_fini(twin *t)
{
    hrp_stop(&t->rep);
    ha_destroy(t->core);
}

static uint64_t mapped_of(const ha_heap *h)
{
    ha_stats st;
    ha_get_stats(h, &st);
    return st.mapped;
}

/* heapd's collect (collect.c, local_every): its list goes to the replica. */
static void heapd_collect(twin *t, bool asked, uint64_t size)
{
    uint64_t *offs = NULL;
    size_t n = 0;
    ck_assert_int_eq(ha_collect_candidates(t->core, &offs, &n), HA_OK);
    ck_assert_int_eq(ha_collect_apply(t->core, offs, n, NULL), HA_OK);
    Heapd__HeapOp op = HEAPD__HEAP_OP__INIT;
    op.at = t->rep.pos;
    op.collect = true;
    op.asked = asked;
    op.offsets = offs;
    op.n_offsets = n;
    hrp_op(&t->rep, &op, size);
    free(offs);
}

/* A round trip for allocation pos (heapd decides, the replica follows). */
static uint64_t round_trip(twin *t, uint64_t size)
{
    hrp_records_done(&t->rep);                            /* the Alloc carried them (applied above, record by record) */
    if (t->rounds && t->rep.pos % L == 0 && t->rep.pos) { /* horizon.c's local round (reclaim eager) */
        uint64_t *offs = NULL;
        size_t n = 0;
        ck_assert_int_eq(ha_collect_candidates(t->core, &offs, &n), HA_OK);
        ck_assert_int_eq(ha_reclaim_apply(t->core, offs, n, NULL), HA_OK);
        Heapd__HeapOp op = HEAPD__HEAP_OP__INIT;
        op.at = t->rep.pos;
        op.offsets = offs;
        op.n_offsets = n;
        hrp_op(&t->rep, &op, size);
        free(offs);
    }
    ha_alloc_result res;
    for (;;) {
        int rc = ha_alloc(t->core, size, &res);
        if (rc == HA_OK)
            break;
        if (rc == HA_NEED_COLLECT) {
            hrp_needed(&t->rep, size, 0);
            heapd_collect(t, true, size);
        } else {
            ck_assert_int_eq(rc, HA_NEED_GROW);
            ck_assert_int_eq(ha_grow(t->core, res.grow_chunks), HA_OK);
        }
    }
    hrp_follow(&t->rep, size, res.offset);
    return res.offset;
}

static void release_some(twin *t, uint64_t *rng)
{
    while (t->nlive > 4 && cku_rng_below(rng, 3) == 0) { /* rank 0 frees, rank 1 later */
        size_t i = cku_rng_below(rng, t->nlive);
        ck_assert_int_eq(ha_free(t->core, 0, t->live[i]), HA_OK);
        t->lag[t->nlag++] = t->live[i];
        t->live[i] = t->live[--t->nlive];
    }
    while (t->nlag && (t->nlag > 64 || cku_rng_below(rng, 2) == 0)) {
        ck_assert_int_eq(ha_free(t->core, 1, t->lag[0]), HA_OK);
        memmove(t->lag, t->lag + 1, --t->nlag * sizeof *t->lag);
    }
}

static void run_workload(ha_policy pol, uint64_t seed)
{
    twin t;
    twin_init(&t, pol);
    uint64_t rng = seed;
    for (int i = 0; i < 6000; i++) {
        uint64_t size = 256 + cku_rng_below(&rng, cku_rng_below(&rng, 8) ? 4 * KIB : 96 * KIB);
        uint64_t off, bs;
        if (hrp_wants(&t.rep) && hrp_decide(&t.rep, size, mapped_of(t.core), &off, &bs) > 0) {
            ha_alloc_result res; /* heapd applies the record: its core must agree */
            ck_assert_int_eq(ha_alloc(t.core, size, &res), HA_OK);
            ck_assert_uint_eq(res.offset, off);
        } else {
            off = round_trip(&t, size);
        }
        ck_assert_msg(!t.rep.lost, "allocation %d: replica lost: %s", i, t.rep.why);
        t.live[t.nlive++] = off;
        if (t.nlive == 512 || cku_rng_below(&rng, 400) == 0) { /* every rank's explicit collect */
            while (t.nlag) {
                ck_assert_int_eq(ha_free(t.core, 1, t.lag[0]), HA_OK);
                memmove(t.lag, t.lag + 1, --t.nlag * sizeof *t.lag);
            }
            while (t.nlive > 256) {
                ck_assert_int_eq(ha_free(t.core, 0, t.live[t.nlive - 1]), HA_OK);
                ck_assert_int_eq(ha_free(t.core, 1, t.live[--t.nlive]), HA_OK);
            }
            heapd_collect(&t, false, 0);
        }
        release_some(&t, &rng);
    }
    ck_assert_msg(!t.rep.lost, "replica lost: %s", t.rep.why);
    ck_assert_uint_gt(t.rep.local, 6000 / 2);
    ck_assert_uint_gt(t.rep.followed, 6000 / L - 1);
    ck_assert_uint_eq(mapped_of(t.rep.core), mapped_of(t.core));
    twin_fini(&t);
}

START_TEST(follows_heapd_coalesce) { run_workload(HA_POLICY_COALESCE, 0x9e3779b97f4a7c15ull + (uint64_t)_i); }
END_TEST

START_TEST(follows_heapd_seed) { run_workload(HA_POLICY_SEED, 0x2545f4914f6cdd1dull + (uint64_t)_i); }
END_TEST

START_TEST(records_and_boundaries)
{
    twin t;
    twin_init(&t, HA_POLICY_COALESCE);
    ck_assert(!hrp_wants(&t.rep)); /* allocation 0: a round trip */
    uint64_t o0 = round_trip(&t, 4 * KIB), off, bs, from, *v;
    size_t nv;
    for (unsigned i = 1; i < L; i++) {
        ck_assert(hrp_wants(&t.rep));
        ck_assert_int_eq(hrp_decide(&t.rep, 4 * KIB, mapped_of(t.core), &off, &bs), 1);
        ck_assert_uint_ne(off, o0);
        ha_alloc_result res; /* heapd applies the record */
        ck_assert_int_eq(ha_alloc(t.core, 4 * KIB, &res), HA_OK);
        ck_assert_uint_eq(res.offset, off);
    }
    ck_assert(!hrp_wants(&t.rep)); /* allocation L: a round trip */
    hrp_records(&t.rep, &from, &v, &nv);
    ck_assert_uint_eq(from, 1);
    ck_assert_uint_eq(nv, 2 * (L - 1));
    ck_assert_uint_eq(v[0], 4 * KIB);
    ck_assert_uint_eq(v[2 * (L - 1) - 1], off);
    hrp_records_done(&t.rep);
    hrp_records(&t.rep, &from, &v, &nv);
    ck_assert_uint_eq(nv, 0);
    ck_assert_uint_eq(from, L);
    ck_assert_int_eq(t.rep.pos, L);
    round_trip(&t, 4 * KIB);
    /* larger than va_size: heapd refuses it without deciding; the replica stays */
    ck_assert_int_eq(hrp_decide(&t.rep, 65 * 1024 * KIB, mapped_of(t.core), &off, &bs), 0);
    ck_assert(!t.rep.lost && !t.rep.asked && hrp_wants(&t.rep));
    twin_fini(&t);
}
END_TEST

START_TEST(lost_not_wrong)
{
    twin t;
    twin_init(&t, HA_POLICY_COALESCE);
    round_trip(&t, 4 * KIB);
    Heapd__HeapOp op = HEAPD__HEAP_OP__INIT;
    op.at = t.rep.pos + 3; /* a round at a number it has not reached */
    hrp_op(&t.rep, &op, 0);
    ck_assert(t.rep.lost);
    ck_assert(!hrp_wants(&t.rep));
    twin_fini(&t);

    twin_init(&t, HA_POLICY_COALESCE);
    round_trip(&t, 4 * KIB);
    hrp_follow(&t.rep, 4 * KIB, 1 << 20); /* heapd's answer differs from what it would decide */
    ck_assert(t.rep.lost);
    ck_assert_msg(strstr(t.rep.why, "heapd placed it at 1048576"), "%s", t.rep.why);
    twin_fini(&t);

    twin_init(&t, HA_POLICY_COALESCE);
    round_trip(&t, 4 * KIB);
    uint64_t bogus = 12345 * 256;
    op.at = t.rep.pos;
    op.collect = true;
    op.offsets = &bogus;
    op.n_offsets = 1; /* a block it never decided */
    hrp_op(&t.rep, &op, 0);
    ck_assert(t.rep.lost);
    twin_fini(&t);

    twin_init(&t, HA_POLICY_COALESCE);
    round_trip(&t, 4 * KIB);
    hrp_needed(&t.rep, 4 * KIB, 1); /* heapd asks a trim where its core would not */
    ck_assert(t.rep.lost);
    twin_fini(&t);

    twin_init(&t, HA_POLICY_COALESCE);
    round_trip(&t, 4 * KIB);
    uint64_t off, bs;
    ck_assert_int_eq(hrp_decide(&t.rep, 4 * KIB, mapped_of(t.core), &off, &bs), 1);
    ha_alloc_result res;
    ck_assert_int_eq(ha_alloc(t.core, 4 * KIB, &res), HA_OK);
    op.at = t.rep.pos;
    op.offsets = NULL;
    op.n_offsets = 0;
    op.asked = true; /* a collect heapd's core asked for at a number the replica decided alone */
    hrp_op(&t.rep, &op, 4 * KIB);
    ck_assert(t.rep.lost);
    twin_fini(&t);
}
END_TEST

START_TEST(forced_collect_followed)
{
    twin t;
    twin_init(&t, HA_POLICY_COALESCE);
    uint64_t o0 = round_trip(&t, 4 * KIB);
    ck_assert_int_eq(ha_free(t.core, 0, o0), HA_OK);
    ck_assert_int_eq(ha_free(t.core, 1, o0), HA_OK);
    hrp_needed(&t.rep, 4 * KIB, 0); /* an operator's collect: the allocator did not ask */
    ck_assert(!t.rep.lost);
    heapd_collect(&t, false, 4 * KIB);
    ck_assert_msg(!t.rep.lost, "%s", t.rep.why);
    ck_assert_uint_eq(round_trip(&t, 4 * KIB), o0); /* the collect's block, reused alike */
    ck_assert_msg(!t.rep.lost, "%s", t.rep.why);
    twin_fini(&t);
}
END_TEST

START_TEST(refuses_what_it_cannot_run)
{
    hrp_replica r;
    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    hp.chunk_size = 64 * KIB;
    hp.initial_size = 64 * KIB;
    hp.va_size = 64 * 1024 * KIB;
    hp.min_block = 256;
    hp.policy = (Heapd__Policy)hpo_to_wire(HA_POLICY_COALESCE);
    ck_assert_int_eq(hrp_start(&r, &hp, 0), -1);    /* heapd decides */
    ck_assert_int_eq(hrp_start(&r, &hp, 5000), -1); /* over HW_DECIDED_MAX */
    hp.min_block = 300;                             /* the core refuses it */
    ck_assert_int_eq(hrp_start(&r, &hp, L), -1);
    ck_assert_ptr_null(r.core);
    ck_assert(!hrp_wants(&r));
    hrp_stop(&r);
}
END_TEST

static Suite *replica_suite(void)
{
    Suite *s = suite_create("replica");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, follows_heapd_coalesce, 0, 3);
    tcase_add_loop_test(tc, follows_heapd_seed, 0, 2);
    tcase_add_test(tc, records_and_boundaries);
    tcase_add_test(tc, lost_not_wrong);
    tcase_add_test(tc, forced_collect_followed);
    tcase_add_test(tc, refuses_what_it_cannot_run);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(replica_suite()); }
