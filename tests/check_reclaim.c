/* check_reclaim.c - issue 27: reclaim = eager in the allocator core (a block
 * every rank released is reusable from the release that completes it, with
 * no collect), one_decider's collect rule (a release after a collect makes
 * the next growth collect first), and a differential workload: the same
 * seeded multi-rank allocation sequence and per-rank free timing under eager
 * and under collect, every answer checked against a shadow of what each rank
 * still holds (no block is handed out while a rank holds any byte of it). */
#include "alloc.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include "check_util.h"

#define MIB (UINT64_C(1) << 20)

static ha_heap *mk(uint32_t ranks, ha_reclaim rc, bool one, ha_policy pol)
{
    ha_params p = {.ranks = ranks,
                   .chunk_size = 4 * MIB,
                   .initial_size = 4 * MIB,
                   .va_size = 1024 * MIB,
                   .min_block = 4096,
                   .policy = pol,
                   .reclaim = rc,
                   .one_decider = one};
    char err[256];
    ha_heap *h = NULL;
    ck_assert_msg(ha_create(&p, &h, err, sizeof err) == HA_OK, "%s", err);
    return h;
}

static ha_stats st(const ha_heap *h)
{
    ha_stats s;
    ha_get_stats(h, &s);
    return s;
}

/* The allocation protocol (alloc.h); *collects counts the collects run. */
static uint64_t alloc_loop(ha_heap *h, uint64_t size, unsigned *collects)
{
    ha_alloc_result r;
    for (int i = 0; i < 8; i++) {
        int rc = ha_alloc(h, size, &r);
        if (rc == HA_OK)
            return r.offset;
        if (rc == HA_NEED_COLLECT) {
            ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
            (*collects)++;
        } else {
            ck_assert_int_eq(rc, HA_NEED_GROW);
            ck_assert_int_eq(ha_grow(h, r.grow_chunks), HA_OK);
        }
    }
    ck_abort_msg("allocation of %llu did not settle", (unsigned long long)size);
    return 0;
}

START_TEST(params_checked)
{
    ha_params p = {.ranks = 2, .chunk_size = MIB, .initial_size = MIB, .va_size = 64 * MIB, .min_block = 4096};
    char err[256] = "";
    p.reclaim = HA_RECLAIM_EAGER;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "one decider"));
    p.one_decider = true;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_OK);
    p.policy = HA_POLICY_SEED;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "seed"));
    p.policy = HA_POLICY_COALESCE;
    p.reclaim = (ha_reclaim)7;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "reclaim"));
}
END_TEST

/* The last release reclaims: the next allocation of the size gets the
 * block back, and no collect is ever asked for. */
START_TEST(last_release_reclaims)
{
    ha_heap *h = mk(2, HA_RECLAIM_EAGER, true, HA_POLICY_COALESCE);
    unsigned collects = 0;
    uint64_t a = alloc_loop(h, 64 * 1024, &collects);
    uint64_t b = alloc_loop(h, 64 * 1024, &collects);
    ck_assert_int_eq(ha_free(h, 0, a), HA_OK);
    ck_assert_uint_eq(st(h).live_bytes, 128 * 1024); /* rank 1 holds it */
    ck_assert_uint_eq(st(h).eager_reclaims, 0);
    uint64_t c = alloc_loop(h, 64 * 1024, &collects);
    ck_assert(c != a); /* rank 1 still holds a */
    ck_assert_int_eq(ha_free(h, 1, a), HA_OK);
    ck_assert_uint_eq(st(h).pending_bytes, 0);
    ck_assert_uint_eq(st(h).pending_blocks, 0);
    ck_assert_uint_eq(st(h).eager_reclaims, 1);
    ck_assert_uint_eq(alloc_loop(h, 64 * 1024, &collects), a);
    /* a batch: b and c released by both ranks, in two batches */
    uint64_t offs[2] = {b, c};
    ck_assert_int_eq(ha_free_batch(h, 1, offs, 2, NULL), HA_OK);
    ck_assert_int_eq(ha_free_batch(h, 0, offs, 2, NULL), HA_OK);
    ck_assert_uint_eq(st(h).eager_reclaims, 3);
    ck_assert_uint_eq(st(h).pending_blocks, 0);
    ck_assert_uint_eq(collects, 0);
    ck_assert_uint_eq(st(h).collects, 0);
    /* a double free is still refused, and changes nothing */
    ck_assert_int_eq(ha_free(h, 0, b), HA_ENOTHELD);
    char err[256];
    ck_assert_msg(ha_validate(h, err, sizeof err) == HA_OK, "%s", err);
    ha_destroy(h);
}
END_TEST

/* A heap that keeps freeing and allocating the same sizes stays at its
 * first extent under eager, with no collect; under collect it needs
 * collects (or growths) to do the same. */
START_TEST(steady_loop_no_growth)
{
    ha_heap *h = mk(2, HA_RECLAIM_EAGER, true, HA_POLICY_COALESCE);
    unsigned collects = 0;
    uint64_t o[8];
    for (int step = 0; step < 200; step++) {
        for (int i = 0; i < 8; i++)
            o[i] = alloc_loop(h, 256 * 1024 + 4096 * (uint64_t)i, &collects);
        for (int i = 0; i < 8; i++)
            for (uint32_t r = 0; r < 2; r++)
                ck_assert_int_eq(ha_free(h, (r + (uint32_t)i) % 2, o[i]), HA_OK);
    }
    ck_assert_uint_eq(collects, 0);
    ck_assert_uint_eq(st(h).growths, 0);
    ck_assert_uint_eq(st(h).mapped, 4 * MIB);
    ck_assert_uint_eq(st(h).eager_reclaims, 1600);
    ha_destroy(h);
}
END_TEST

/* one_decider, reclaim = collect (issue 27's skipped-collect rule): a
 * collect, then releases, then an allocation that does not fit: the heap
 * collects first instead of growing. Several nodes (one_decider false): the
 * old rule, identical on every node, grows. */
START_TEST(release_after_collect_collects)
{
    for (int one = 0; one < 2; one++) {
        ha_heap *h = mk(1, HA_RECLAIM_COLLECT, one, HA_POLICY_COALESCE);
        unsigned collects = 0;
        uint64_t a = alloc_loop(h, 3 * MIB, &collects);
        ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK); /* the step boundary */
        ck_assert_int_eq(ha_free(h, 0, a), HA_OK);          /* the last step's buffers */
        ha_alloc_result r;
        int rc = ha_alloc(h, 3 * MIB, &r);
        if (one) {
            ck_assert_int_eq(rc, HA_NEED_COLLECT);
            ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
            ck_assert_int_eq(ha_alloc(h, 3 * MIB, &r), HA_OK);
            ck_assert_uint_eq(r.offset, a);
            ck_assert_uint_eq(st(h).growths, 0);
        } else {
            ck_assert_int_eq(rc, HA_NEED_GROW);
        }
        ha_destroy(h);
    }
}
END_TEST

/* A rank that runs ahead: rank 0 freed A, rank 1 not yet; nothing else
 * fits. Eager asks for a collect (a barrier that brings rank 1's release
 * in) rather than grow; after rank 1's release and the collect, A is
 * reused. With no partial release, the heap grows at once. */
START_TEST(lagging_rank_collects_instead_of_growing)
{
    ha_heap *h = mk(2, HA_RECLAIM_EAGER, true, HA_POLICY_COALESCE);
    ha_alloc_result r;
    ck_assert_int_eq(ha_alloc(h, 3 * MIB, &r), HA_OK);
    uint64_t a = r.offset;
    ck_assert_int_eq(ha_free(h, 0, a), HA_OK);
    ck_assert_int_eq(ha_alloc(h, 3 * MIB, &r), HA_NEED_COLLECT);
    ck_assert_int_eq(ha_free(h, 1, a), HA_OK); /* rank 1 reaches the barrier */
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    ck_assert_int_eq(ha_alloc(h, 3 * MIB, &r), HA_OK);
    ck_assert_uint_eq(r.offset, a);
    ck_assert_uint_eq(st(h).growths, 0);
    /* nothing released by anyone: no collect, a growth */
    ck_assert_int_eq(ha_alloc(h, 3 * MIB, &r), HA_NEED_GROW);
    ha_destroy(h);
}
END_TEST

/* ---- the differential workload ------------------------------------------- */

#define DR   3   /* ranks */
#define DN   400 /* allocations */
#define DMAX 64  /* blocks alive at once, at most */

typedef struct dblk {
    uint64_t off, size;
    int held[DR];  /* the shadow: rank r still holds it */
    int death[DR]; /* the step at which rank r frees it */
} dblk;

static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* No byte of [off, off + size) is in a block some rank holds. */
static void check_free_of_holders(const dblk *b, int n, uint64_t off, uint64_t size)
{
    for (int i = 0; i < n; i++) {
        int any = 0;
        for (int r = 0; r < DR; r++)
            any |= b[i].held[r];
        if (any && off < b[i].off + b[i].size && b[i].off < off + size)
            ck_abort_msg("block at %llu (%llu bytes) handed out while a rank holds %llu (%llu bytes)",
                         (unsigned long long)off, (unsigned long long)size, (unsigned long long)b[i].off,
                         (unsigned long long)b[i].size);
    }
}

/* Runs the seeded workload on h; returns the offsets in order (out[DN]). */
static void run_workload(ha_heap *h, uint64_t seed, uint64_t *out, unsigned *collects)
{
    dblk b[DMAX];
    int n = 0;
    uint64_t s = seed;
    for (int step = 0; step < DN; step++) {
        /* each rank frees what its own timing says (a rank's lag differs) */
        for (int r = 0; r < DR; r++)
            for (int i = 0; i < n; i++)
                if (b[i].held[r] && b[i].death[r] <= step) {
                    ck_assert_int_eq(ha_free(h, (uint32_t)r, b[i].off), HA_OK);
                    b[i].held[r] = 0;
                }
        int w = 0; /* drop the records no rank holds */
        for (int i = 0; i < n; i++) {
            int any = 0;
            for (int r = 0; r < DR; r++)
                any |= b[i].held[r];
            if (any)
                b[w++] = b[i];
        }
        n = w;
        if (n == DMAX)
            continue;
        uint64_t size = (rnd(&s) % 5 == 0) ? MIB + 4096 * (rnd(&s) % 256) : 512 + rnd(&s) % (200 * 1024);
        uint64_t off = alloc_loop(h, size, collects);
        check_free_of_holders(b, n, off, size);
        dblk *x = &b[n++];
        x->off = off;
        x->size = ha_class_size(h, size);
        int life = 1 + (int)(rnd(&s) % 30);
        for (int r = 0; r < DR; r++) {
            x->held[r] = 1;
            x->death[r] = step + life + (int)(rnd(&s) % 6); /* per-rank lag */
        }
        out[step] = off;
    }
    char err[256];
    ck_assert_msg(ha_validate(h, err, sizeof err) == HA_OK, "%s", err);
}

/* Issue 27 across nodes: two nodes' cores (one rank each, reclaim collect,
 * no one decider) whose ranks release at different times reclaim the agreed
 * offsets with ha_reclaim_apply at the same allocation number: their
 * decisions stay identical, nothing counts as a collect, an offset that is
 * not pending on a node is refused with nothing changed, and the seed
 * policy refuses it. */
START_TEST(agreed_reclaim_keeps_nodes_alike)
{
    ha_heap *n0 = mk(1, HA_RECLAIM_COLLECT, false, HA_POLICY_COALESCE);
    ha_heap *n1 = mk(1, HA_RECLAIM_COLLECT, false, HA_POLICY_COALESCE);
    unsigned collects = 0;
    uint64_t o[6];
    for (int i = 0; i < 6; i++) {
        o[i] = alloc_loop(n0, (uint64_t)(i + 1) * 16384, &collects);
        ck_assert_uint_eq(alloc_loop(n1, (uint64_t)(i + 1) * 16384, &collects), o[i]);
    }
    /* node 0's rank released 0, 2, 4; node 1's rank 2, 3, 4: the store's
     * intersection is {2, 4} */
    uint64_t r0[3] = {o[0], o[2], o[4]}, r1[3] = {o[2], o[3], o[4]};
    ck_assert_int_eq(ha_free_batch(n0, 0, r0, 3, NULL), HA_OK);
    ck_assert_int_eq(ha_free_batch(n1, 0, r1, 3, NULL), HA_OK);
    uint64_t bad[2] = {o[3], o[4]}; /* o[3] is not pending on node 0 */
    ck_assert_int_eq(ha_reclaim_apply(n0, bad, 2, NULL), HA_EINVAL);
    ck_assert_uint_eq(st(n0).pending_blocks, 3);
    uint64_t agreed[2] = {o[2], o[4]}, b0 = 0, b1 = 0;
    ck_assert_int_eq(ha_reclaim_apply(n0, agreed, 2, &b0), HA_OK);
    ck_assert_int_eq(ha_reclaim_apply(n1, agreed, 2, &b1), HA_OK);
    ck_assert_uint_eq(b0, 3 * 16384 + 5 * 16384);
    ck_assert_uint_eq(b0, b1);
    ck_assert_uint_eq(st(n0).collects, 0);
    ck_assert_uint_eq(st(n0).eager_reclaims, 2);
    ck_assert_uint_eq(st(n0).pending_blocks, 1); /* o[0] waits for node 1 */
    /* the freed room is reused alike on both nodes, before any growth */
    for (int i = 0; i < 4; i++) {
        uint64_t a = alloc_loop(n0, 16384, &collects);
        ck_assert_uint_eq(alloc_loop(n1, 16384, &collects), a);
    }
    ck_assert_uint_eq(st(n0).growths, st(n1).growths);
    ck_assert_uint_eq(st(n0).mapped, st(n1).mapped);
    char err[256];
    ck_assert_msg(ha_validate(n0, err, sizeof err) == HA_OK, "%s", err);
    ck_assert_msg(ha_validate(n1, err, sizeof err) == HA_OK, "%s", err);
    ha_destroy(n0);
    ha_destroy(n1);
    ha_heap *sd = mk(1, HA_RECLAIM_COLLECT, false, HA_POLICY_SEED);
    uint64_t so = alloc_loop(sd, 4096, &collects);
    ck_assert_int_eq(ha_free(sd, 0, so), HA_OK);
    ck_assert_int_eq(ha_reclaim_apply(sd, &so, 1, NULL), HA_EINVAL);
    ha_destroy(sd);
}
END_TEST

START_TEST(differential)
{
    uint64_t mapped_eager = 0, mapped_collect = 0;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        static uint64_t o1[DN], o2[DN], o3[DN];
        unsigned ce = 0, cc = 0, c3 = 0;
        ha_heap *e = mk(DR, HA_RECLAIM_EAGER, true, HA_POLICY_COALESCE);
        ha_heap *c = mk(DR, HA_RECLAIM_COLLECT, true, HA_POLICY_COALESCE);
        ha_heap *e2 = mk(DR, HA_RECLAIM_EAGER, true, HA_POLICY_COALESCE);
        run_workload(e, seed, o1, &ce);
        run_workload(c, seed, o2, &cc);
        run_workload(e2, seed, o3, &c3);
        /* deterministic: the same calls, the same decisions */
        ck_assert_int_eq(memcmp(o1, o3, sizeof o1), 0);
        /* eager asks for a collect only when a rank released a block another
         * still holds and nothing fits (a barrier instead of a growth) */
        ck_assert_uint_lt(ce, cc);
        ck_assert_uint_eq(st(e).collects, ce);
        ck_assert_uint_gt(st(e).eager_reclaims, 0);
        ck_assert_uint_gt(cc, 0);
        mapped_eager += st(e).mapped;
        mapped_collect += st(c).mapped;
        ha_destroy(e);
        ha_destroy(c);
        ha_destroy(e2);
    }
    ck_assert_msg(mapped_eager <= mapped_collect, "eager mapped %llu, collect %llu", (unsigned long long)mapped_eager,
                  (unsigned long long)mapped_collect);
}
END_TEST

static Suite *reclaim_suite(void)
{
    Suite *s = suite_create("reclaim");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, params_checked);
    tcase_add_test(tc, last_release_reclaims);
    tcase_add_test(tc, steady_loop_no_growth);
    tcase_add_test(tc, release_after_collect_collects);
    tcase_add_test(tc, lagging_rank_collects_instead_of_growing);
    tcase_add_test(tc, agreed_reclaim_keeps_nodes_alike);
    tcase_add_test(tc, differential);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(reclaim_suite()); }
