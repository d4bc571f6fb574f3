/*
 * check_extent.c - issue 32: the allocator core's extent bounds
 * (ha_params.extent_bound). An extent is the initial chunks or one run of
 * chunks one growth mapped (ha_grow_plan's indices: holes refilled, chunks
 * added at the top); libheapc_nccl registers each as one NCCL window, so a
 * block across two is in none. The test keeps its own model of the bounds
 * from the growths it makes and checks every block the core places against
 * it, over random sequences of allocations, frees, collects and trims (the
 * invariants after each step: ha_validate); off, the same sequences
 * straddle (the default's decisions are unchanged); the seed policy refuses
 * the option.
 */
#include "alloc.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check_util.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)

/* The model: bound[i] when an extent starts at chunk i. */
typedef struct model {
    uint8_t bound[1024];
    uint32_t grown[1024]; /* the chunk indices of the growth being made */
    size_t ngrown;
} model;

static void on_chunk(void *data, uint32_t i)
{
    model *m = data;
    ck_assert_uint_lt(m->ngrown, 1024);
    m->grown[m->ngrown++] = i;
}

/* Runs of the grown chunks: each one an extent (one window: libheapc
 * reports each run of chunks a growth mapped), bounds inside it gone. */
static void mark_runs(model *m)
{
    for (size_t k = 0; k < m->ngrown; k++) {
        uint32_t i = m->grown[k];
        int first = k == 0 || m->grown[k - 1] != i - 1;
        m->bound[i] = (uint8_t)first;
        if (k + 1 == m->ngrown || m->grown[k + 1] != i + 1)
            m->bound[i + 1] = 1;
    }
    m->ngrown = 0;
}

static void valid(const ha_heap *h)
{
    char err[300];
    ck_assert_msg(ha_validate(h, err, sizeof err) == HA_OK, "%s", err);
}

/* Allocates through the protocol (collect, grow); the offset. */
static uint64_t alloc(ha_heap *h, model *m, uint64_t size)
{
    ha_alloc_result r;
    for (;;) {
        int rc = ha_alloc(h, size, &r);
        if (rc == HA_NEED_COLLECT) {
            ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
        } else if (rc == HA_NEED_GROW) {
            ck_assert_int_eq(ha_grow_plan(h, r.grow_chunks, on_chunk, m), HA_OK);
            ck_assert_int_eq(ha_grow(h, r.grow_chunks), HA_OK);
            mark_runs(m);
        } else {
            ck_assert_int_eq(rc, HA_OK);
            return r.offset;
        }
    }
}

static ha_heap *heap(bool bound, uint64_t chunk)
{
    ha_params p = {.ranks = 1,
                   .chunk_size = chunk,
                   .initial_size = chunk,
                   .va_size = 1000 * chunk,
                   .min_block = 256,
                   .policy = HA_POLICY_COALESCE,
                   .reclaim = HA_RECLAIM_COLLECT,
                   .extent_bound = bound};
    ha_heap *h;
    char err[200];
    ck_assert_msg(ha_create(&p, &h, err, sizeof err) == HA_OK, "%s", err);
    return h;
}

/* Blocks of a random sequence that straddle a bound of the model. */
static int straddles(bool bound, uint64_t seed)
{
    const uint64_t cs = 64 * KIB;
    ha_heap *h = heap(bound, cs);
    model m;
    memset(&m, 0, sizeof m);
    m.bound[0] = m.bound[1] = 1;
    uint64_t live[64], s = seed;
    size_t nlive = 0;
    int across = 0;
    for (int step = 0; step < 3000; step++) {
        uint64_t op = cku_rng_below(&s, 10);
        if (op < 5 && nlive < 64) {
            uint64_t size = 256 + cku_rng_below(&s, op == 0 ? 3 * cs : cs / 2);
            uint64_t off = alloc(h, &m, size);
            for (uint64_t c = off / cs + 1; c <= (off + size - 1) / cs; c++)
                across += m.bound[c];
            live[nlive++] = off;
        } else if (op < 9 && nlive) {
            size_t i = cku_rng_below(&s, nlive);
            ck_assert_int_eq(ha_free(h, 0, live[i]), HA_OK);
            live[i] = live[--nlive];
        } else if (step % 3 == 0) {
            ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
            ck_assert_int_eq(ha_trim(h, NULL, NULL, NULL), HA_OK);
        } else {
            ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
        }
        if (step % 50 == 0)
            valid(h);
    }
    valid(h);
    ha_destroy(h);
    return across;
}

START_TEST(random_sequences_keep_blocks_inside_extents)
{
    for (uint64_t seed = 1; seed <= 8; seed++) {
        int on = straddles(true, seed * 7919), off = straddles(false, seed * 7919);
        ck_assert_msg(on == 0, "seed %llu: %d blocks straddle an extent bound with extent_bound",
                      (unsigned long long)seed, on);
        if (seed == 1)
            ck_assert_msg(off > 0, "without extent_bound the sequence should straddle (the default's growth "
                                   "extends the top's free run)");
    }
}
END_TEST

START_TEST(seed_refuses)
{
    ha_params p = {.ranks = 1,
                   .chunk_size = MIB,
                   .initial_size = MIB,
                   .va_size = 64 * MIB,
                   .min_block = 256,
                   .policy = HA_POLICY_SEED,
                   .extent_bound = true};
    char err[200] = "";
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_EINVAL);
    ck_assert_msg(strstr(err, "extent_bound needs the coalesce policy"), "%s", err);
}
END_TEST

static Suite *extent_suite(void)
{
    Suite *s = suite_create("extent");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, random_sequences_keep_blocks_inside_extents);
    tcase_add_test(tc, seed_refuses);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(extent_suite()); }
