/* check_alloc.c - the allocator core's contract (daemon/alloc.h), for both
 * policies: parameters, size classes, the alloc protocol (collect, grow,
 * HA_EVA), frees and their errors, partial releases, the seed policy's
 * rollback, LIFO order and trigger, the coalesce policy's merging, collect
 * with a subset of candidates, and a randomised multi-rank test checked
 * against this file's own model of which bytes may be handed out. */
#include "alloc.h"

#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check_util.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

static const ha_policy policies[2] = {HA_POLICY_SEED, HA_POLICY_COALESCE};

/* ---- helpers ------------------------------------------------------------ */

static ha_heap *mk(ha_policy pol, uint32_t ranks, uint64_t chunk, uint64_t initial, uint64_t va, uint64_t min_block)
{
    ha_params p = {.ranks = ranks,
                   .chunk_size = chunk,
                   .initial_size = initial,
                   .va_size = va,
                   .min_block = min_block,
                   .policy = pol};
    char err[256] = "";
    ha_heap *h = NULL;
    int rc = ha_create(&p, &h, err, sizeof err);
    ck_assert_msg(rc == HA_OK && h != NULL, "ha_create failed: %d %s", rc, err);
    return h;
}

static void valid(const ha_heap *h)
{
    char err[512] = "";
    int rc = ha_validate(h, err, sizeof err);
    ck_assert_msg(rc == HA_OK, "ha_validate: %s", err);
}

static ha_stats stats(const ha_heap *h)
{
    ha_stats s;
    memset(&s, 0, sizeof s);
    ha_get_stats(h, &s);
    return s;
}

static void same_stats(const ha_stats *a, const ha_stats *b, const char *what)
{
    ck_assert_msg(memcmp(a, b, sizeof *a) == 0,
                  "%s changed the heap: mapped %" PRIu64 "->%" PRIu64 " live %" PRIu64 "->%" PRIu64 " pending %" PRIu64
                  "->%" PRIu64 " free %" PRIu64 "->%" PRIu64 " allocs %" PRIu64 "->%" PRIu64 " frees %" PRIu64
                  "->%" PRIu64 " collects %" PRIu64 "->%" PRIu64,
                  what, a->mapped, b->mapped, a->live_bytes, b->live_bytes, a->pending_bytes, b->pending_bytes,
                  a->free_bytes, b->free_bytes, a->allocs, b->allocs, a->frees, b->frees, a->collects, b->collects);
}

typedef struct loop_out {
    int collects;
    int grows;
    uint32_t grow_chunks;
    uint8_t reason;
} loop_out;

/* The alloc protocol of alloc.h. Returns the final rc. */
static int alloc_loop(ha_heap *h, uint64_t size, ha_alloc_result *res, loop_out *lo)
{
    loop_out dummy;
    if (lo == NULL)
        lo = &dummy;
    memset(lo, 0, sizeof *lo);
    for (int step = 0; step < 8; step++) {
        memset(res, 0, sizeof *res);
        int rc = ha_alloc(h, size, res);
        if (rc == HA_NEED_COLLECT) {
            ck_assert_msg(lo->collects == 0, "ha_alloc(%" PRIu64 ") asked for a second collect", size);
            ck_assert_msg(lo->grows == 0,
                          "ha_alloc(%" PRIu64 ") asked for a collect after a "
                          "growth",
                          size);
            lo->reason = res->collect_reason;
            ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
            lo->collects++;
            continue;
        }
        if (rc == HA_NEED_GROW) {
            ck_assert_msg(res->grow_chunks > 0, "HA_NEED_GROW with 0 chunks");
            ck_assert_msg(lo->grows == 0, "ha_alloc(%" PRIu64 ") asked to grow twice", size);
            lo->grow_chunks = res->grow_chunks;
            int g = ha_grow(h, res->grow_chunks);
            ck_assert_msg(g == HA_OK, "ha_grow(%" PRIu32 ") after HA_NEED_GROW: %s", res->grow_chunks, ha_strerror(g));
            lo->grows++;
            continue;
        }
        return rc;
    }
    ck_abort_msg("the alloc protocol did not finish in 8 steps");
    return HA_ESTATE;
}

/* Allocates through the protocol and expects success. */
static uint64_t must_alloc(ha_heap *h, uint64_t size, uint64_t *block)
{
    ha_alloc_result res;
    int rc = alloc_loop(h, size, &res, NULL);
    ck_assert_msg(rc == HA_OK, "allocating %" PRIu64 " bytes: %s", size, ha_strerror(rc));
    if (block)
        *block = res.block_size;
    valid(h);
    return res.offset;
}

/* Allocates with a single ha_alloc call and expects HA_OK. */
static uint64_t direct_alloc(ha_heap *h, uint64_t size)
{
    ha_alloc_result res;
    int rc = ha_alloc(h, size, &res);
    ck_assert_msg(rc == HA_OK, "ha_alloc(%" PRIu64 ") = %d (%s), want HA_OK at once", size, rc, ha_strerror(rc));
    valid(h);
    return res.offset;
}

static void free_all_ranks(ha_heap *h, uint32_t ranks, uint64_t off)
{
    for (uint32_t r = 0; r < ranks; r++) {
        int rc = ha_free(h, r, off);
        ck_assert_msg(rc == HA_OK, "ha_free(rank %u, %" PRIu64 "): %s", r, off, ha_strerror(rc));
    }
    valid(h);
}

static void collect(ha_heap *h)
{
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    valid(h);
}

/* ---- parameters, names, classes ---------------------------------------- */

static ha_params good_params(void)
{
    return (ha_params){.ranks = 4,
                       .chunk_size = 2 * MiB,
                       .initial_size = 4 * MiB,
                       .va_size = 64 * MiB,
                       .min_block = 512,
                       .policy = HA_POLICY_COALESCE};
}

/* Expects p to be rejected with an error that names `name`. */
static void bad_param(const ha_params *p, const char *name, const char *what)
{
    char err[256] = "";
    int rc = ha_params_check(p, err, sizeof err);
    ck_assert_msg(rc == HA_EINVAL, "ha_params_check accepted %s", what);
    ck_assert_msg(strstr(err, name) != NULL, "error for %s does not name %s: \"%s\"", what, name, err);
    ha_heap *h = NULL;
    char err2[256] = "";
    rc = ha_create(p, &h, err2, sizeof err2);
    ck_assert_msg(rc == HA_EINVAL, "ha_create accepted %s", what);
    ck_assert_ptr_null(h);
    ck_assert_msg(strstr(err2, name) != NULL, "ha_create error for %s does not name %s: \"%s\"", what, name, err2);
}

START_TEST(params_check)
{
    ha_params p = good_params();
    char err[256] = "x";
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_OK);
    ck_assert_int_eq(ha_params_check(&p, NULL, 0), HA_OK);
    p.ranks = 1;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_OK);
    p.ranks = HA_MAX_RANKS;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_OK);
    p = good_params();
    p.va_size = p.initial_size;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_OK);
    p = good_params();
    p.initial_size = p.chunk_size;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_OK);
    p = good_params();
    p.policy = HA_POLICY_SEED;
    ck_assert_int_eq(ha_params_check(&p, err, sizeof err), HA_OK);

    p = good_params();
    p.ranks = 0;
    bad_param(&p, "ranks", "ranks = 0");
    p = good_params();
    p.ranks = HA_MAX_RANKS + 1;
    bad_param(&p, "ranks", "ranks = HA_MAX_RANKS + 1");
    p = good_params();
    p.min_block = 0;
    bad_param(&p, "min_block", "min_block = 0");
    p = good_params();
    p.min_block = 1000;
    bad_param(&p, "min_block", "min_block = 1000 (not a power of two)");
    p = good_params();
    p.min_block = 3 * MiB;
    bad_param(&p, "min_block", "min_block = 3 MiB");
    p = good_params();
    p.chunk_size = 0;
    bad_param(&p, "chunk", "chunk_size = 0");
    p = good_params();
    p.min_block = 4096;
    p.chunk_size = 6144;
    p.initial_size = 6144;
    p.va_size = 6144 * 4;
    bad_param(&p, "chunk", "chunk_size not a multiple of min_block");
    p = good_params();
    p.initial_size = 0;
    bad_param(&p, "initial", "initial_size = 0");
    p = good_params();
    p.initial_size = 3 * MiB;
    bad_param(&p, "initial", "initial_size not a multiple of chunk_size");
    p = good_params();
    p.va_size = 2 * MiB;
    bad_param(&p, "va", "va_size < initial_size");
    p = good_params();
    p.va_size = 65 * MiB;
    bad_param(&p, "va", "va_size not a multiple of chunk_size");
    p = good_params();
    p.policy = (ha_policy)7;
    bad_param(&p, "policy", "policy = 7");

    /* err may be NULL or tiny. */
    p = good_params();
    p.ranks = 0;
    ck_assert_int_eq(ha_params_check(&p, NULL, 0), HA_EINVAL);
    char tiny[4] = "abc";
    ck_assert_int_eq(ha_params_check(&p, tiny, sizeof tiny), HA_EINVAL);
    ck_assert_msg(memchr(tiny, '\0', sizeof tiny) != NULL, "err not terminated");
}
END_TEST

START_TEST(policy_names)
{
    ha_policy pol = (ha_policy)99;
    ck_assert_str_eq(ha_policy_name(HA_POLICY_SEED), "seed");
    ck_assert_str_eq(ha_policy_name(HA_POLICY_COALESCE), "coalesce");
    ck_assert_int_eq(ha_policy_parse("seed", &pol), HA_OK);
    ck_assert_int_eq(pol, HA_POLICY_SEED);
    ck_assert_int_eq(ha_policy_parse("coalesce", &pol), HA_OK);
    ck_assert_int_eq(pol, HA_POLICY_COALESCE);
    pol = HA_POLICY_SEED;
    ck_assert_int_eq(ha_policy_parse("default", &pol), HA_OK);
    ck_assert_int_eq(pol, HA_POLICY_COALESCE);
    pol = HA_POLICY_SEED;
    ck_assert_int_eq(ha_policy_parse("buddy", &pol), HA_EINVAL);
    ck_assert_int_eq(ha_policy_parse("", &pol), HA_EINVAL);
    ck_assert_int_eq(pol, HA_POLICY_SEED);
    for (int c = HA_EINVAL; c >= HA_ESTATE; c--)
        ck_assert_msg(ha_strerror(c) != NULL && ha_strerror(c)[0] != '\0', "ha_strerror(%d)", c);
    ck_assert_ptr_nonnull(ha_strerror(HA_OK));
}
END_TEST

START_TEST(class_sizes)
{
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 2, 2 * MiB, 2 * MiB, 8 * MiB, 512);
    const uint64_t two62 = (uint64_t)1 << 62, two63 = (uint64_t)1 << 63;
    ck_assert_uint_eq(ha_class_size(h, 0), 0);
    ck_assert_uint_eq(ha_class_size(h, 1), 512);
    ck_assert_uint_eq(ha_class_size(h, 511), 512);
    ck_assert_uint_eq(ha_class_size(h, 512), 512);
    ck_assert_uint_eq(ha_class_size(h, 1024), 1024);
    ck_assert_uint_eq(ha_class_size(h, two62), two62);
    if (pol == HA_POLICY_SEED) { /* next power of two */
        ck_assert_uint_eq(ha_class_size(h, 513), 1024);
        ck_assert_uint_eq(ha_class_size(h, 3 * MiB), 4 * MiB);
        ck_assert_uint_eq(ha_class_size(h, two62 - 1), two62);
        ck_assert_uint_eq(ha_class_size(h, two62 + 1), two63);
    } else { /* exact sizes: the next multiple of min_block */
        ck_assert_uint_eq(ha_class_size(h, 513), 1024);
        ck_assert_uint_eq(ha_class_size(h, 1025), 1536);
        ck_assert_uint_eq(ha_class_size(h, 3 * MiB), 3 * MiB);
        ck_assert_uint_eq(ha_class_size(h, 3 * MiB + 1), 3 * MiB + 512);
        ck_assert_uint_eq(ha_class_size(h, two62 - 1), two62);
        ck_assert_uint_eq(ha_class_size(h, two62 + 1), two62 + 512);
    }
    ck_assert_uint_eq(ha_class_size(h, two63), two63);
    ck_assert_uint_eq(ha_class_size(h, two63 + 1), 0);
    ck_assert_uint_eq(ha_class_size(h, UINT64_MAX), 0);

    /* Allocation sizes the classes cannot hold are errors, nothing changes. */
    ha_stats before = stats(h);
    ha_alloc_result res;
    ck_assert_int_eq(ha_alloc(h, 0, &res), HA_EINVAL);
    ha_stats after = stats(h);
    same_stats(&before, &after, "ha_alloc(0)");
    ck_assert_int_lt(alloc_loop(h, two63 + 1, &res, NULL), 0);
    ck_assert_int_eq(alloc_loop(h, 16 * MiB, &res, NULL), HA_EVA);
    after = stats(h);
    ck_assert_uint_eq(after.mapped, 2 * MiB);
    ck_assert_uint_eq(after.live_bytes, 0);
    ck_assert_uint_eq(after.allocs, 0);
    ck_assert_uint_eq(after.growths, 0);
    valid(h);

    /* Every block is the class of its request and aligned to min_block. */
    uint64_t sizes[] = {1, 100, 512, 513, 4000, 70000, 1 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ck_assert_int_eq(alloc_loop(h, sizes[i], &res, NULL), HA_OK);
        ck_assert_uint_eq(res.block_size, ha_class_size(h, sizes[i]));
        ck_assert_uint_eq(res.offset % 512, 0);
        ck_assert_uint_eq(ha_block_size(h, res.offset), res.block_size);
    }
    ha_destroy(h);
}
END_TEST

START_TEST(create_and_params)
{
    ha_params p = good_params();
    p.policy = policies[_i];
    ha_heap *h = NULL;
    char err[128];
    ck_assert_int_eq(ha_create(&p, &h, err, sizeof err), HA_OK);
    const ha_params *g = ha_get_params(h);
    ck_assert_int_eq(memcmp(g, &p, sizeof p), 0);
    ha_stats s = stats(h);
    ck_assert_uint_eq(s.mapped, 4 * MiB);
    ck_assert_uint_eq(s.free_bytes, 4 * MiB);
    ck_assert_uint_eq(s.live_bytes + s.pending_bytes + s.live_blocks + s.pending_blocks, 0);
    ck_assert_uint_eq(s.allocs + s.frees + s.collects + s.growths, 0);
    ck_assert_uint_eq(s.top, 0);
    ck_assert_uint_gt(ha_memory_usage(h), 0);
    valid(h);
    uint64_t held = 1, rel = 1;
    ha_rank_stats(h, 3, &held, &rel);
    ck_assert_uint_eq(held + rel, 0);
    ha_destroy(h);
}
END_TEST

/* ha_block_bytes (issue 33 item 9): the block table at its capacity, which
 * doubles when an insert would make it more than half full, with a bit a
 * slot of occupancy and 8 bytes per two slots for the released list. */
START_TEST(block_bytes_double_with_the_table)
{
    ha_heap *h = mk(policies[_i], 4, 4 * MiB, 4 * MiB, 4 * MiB, 4 * KiB);
    const size_t one = 64 * 32 + 64 / 8 + 32 * 8; /* 64 slots of 32 bytes */
    ck_assert_uint_eq(ha_block_bytes(h, 0), one);
    ck_assert_uint_eq(ha_block_bytes(h, 32), one);
    ck_assert_uint_eq(ha_block_bytes(h, 33), 2 * one);
    ha_alloc_result r;
    for (int i = 0; i < 32; i++)
        ck_assert_int_eq(ha_alloc(h, 4 * KiB, &r), HA_OK);
    ck_assert_uint_eq(ha_block_bytes(h, 0), one);
    ck_assert_uint_eq(ha_block_bytes(h, 1), 2 * one);
    ck_assert_int_eq(ha_alloc(h, 4 * KiB, &r), HA_OK);
    ck_assert_uint_eq(ha_block_bytes(h, 0), 2 * one);
    ha_destroy(h);
    h = mk(policies[_i], 100, 4 * MiB, 4 * MiB, 4 * MiB, 4 * KiB); /* two words of holder bits */
    ck_assert_uint_eq(ha_block_bytes(h, 0), 64 * (32 + 16) + 64 / 8 + 32 * 8);
    ha_destroy(h);
}
END_TEST

/* ---- the alloc protocol ------------------------------------------------- */

START_TEST(exact_fit_then_grow)
{
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 3, 1 * MiB, 4 * MiB, 16 * MiB, 512);
    /* The whole initial extent in one block, with no collect or growth. */
    uint64_t off = direct_alloc(h, 4 * MiB);
    ck_assert_uint_eq(off, 0);
    ha_stats s = stats(h);
    ck_assert_uint_eq(s.mapped, 4 * MiB);
    ck_assert_uint_eq(s.free_bytes, 0);
    ck_assert_uint_eq(s.live_bytes, 4 * MiB);
    ck_assert_uint_eq(s.top, 4 * MiB);
    ck_assert_uint_eq(s.growths, 0);

    /* One byte over: collect first, then grow by one chunk, then success. */
    ha_alloc_result res;
    ha_stats before = stats(h);
    ck_assert_int_eq(ha_alloc(h, 1, &res), HA_NEED_COLLECT);
    if (pol == HA_POLICY_SEED) /* 4 MiB handed out >= mapped / 8 */
        ck_assert_int_eq(res.collect_reason, HA_COLLECT_TRIGGER);
    else
        ck_assert_int_eq(res.collect_reason, HA_COLLECT_FULL);
    s = stats(h);
    same_stats(&before, &s, "ha_alloc answering HA_NEED_COLLECT");
    uint64_t blocks = 9, bytes = 9;
    ck_assert_int_eq(ha_collect(h, &blocks, &bytes), HA_OK);
    ck_assert_uint_eq(blocks, 0);
    ck_assert_uint_eq(bytes, 0);
    ck_assert_uint_eq(stats(h).collects, 1);
    ck_assert_uint_eq(stats(h).handed_since_collect, 0);
    before = stats(h);
    ck_assert_int_eq(ha_alloc(h, 1, &res), HA_NEED_GROW);
    ck_assert_uint_eq(res.grow_chunks, 1);
    s = stats(h);
    same_stats(&before, &s, "ha_alloc answering HA_NEED_GROW");
    /* Growing past va_size fails and changes nothing. */
    ck_assert_int_eq(ha_grow(h, 13), HA_EVA);
    s = stats(h);
    same_stats(&before, &s, "ha_grow past va_size");
    ck_assert_int_eq(ha_grow(h, 1), HA_OK);
    valid(h);
    s = stats(h);
    ck_assert_uint_eq(s.mapped, 5 * MiB);
    ck_assert_uint_eq(s.growths, 1);
    ck_assert_uint_eq(s.free_bytes, 1 * MiB);
    ck_assert_int_eq(ha_alloc(h, 1, &res), HA_OK);
    ck_assert_uint_eq(res.block_size, 512);
    ck_assert_uint_ge(res.offset, 4 * MiB);
    ck_assert_uint_lt(res.offset, 5 * MiB);
    valid(h);
    s = stats(h);
    ck_assert_uint_eq(s.allocs, 2);
    ck_assert_uint_eq(s.live_blocks, 2);
    ck_assert_uint_eq(s.live_bytes, 4 * MiB + 512);
    ha_destroy(h);
}
END_TEST

START_TEST(grow_chunk_count)
{
    /* One 1 MiB chunk, full; then 3 MiB. The seed policy rounds it to 4 MiB
     * and bumps from 1 MiB (needs 5 MiB: 4 chunks); coalesce keeps it at
     * 3 MiB and places it at 1 MiB too (needs 4 MiB: 3 chunks). */
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 2, 1 * MiB, 1 * MiB, 64 * MiB, 4096);
    ck_assert_uint_eq(direct_alloc(h, 1 * MiB), 0);
    ha_alloc_result res;
    loop_out lo;
    ck_assert_int_eq(alloc_loop(h, 3 * MiB, &res, &lo), HA_OK);
    ck_assert_int_eq(lo.collects, 1);
    ck_assert_int_eq(lo.grows, 1);
    ck_assert_uint_eq(res.offset, 1 * MiB);
    if (pol == HA_POLICY_SEED) {
        ck_assert_uint_eq(res.block_size, 4 * MiB);
        ck_assert_uint_eq(lo.grow_chunks, 4);
    } else {
        ck_assert_uint_eq(res.block_size, 3 * MiB);
        ck_assert_uint_eq(lo.grow_chunks, 3);
    }
    ck_assert_uint_eq(stats(h).mapped, (1 + lo.grow_chunks) * MiB);
    valid(h);
    ha_destroy(h);
}
END_TEST

START_TEST(eva_past_va_size)
{
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 2, 1 * MiB, 1 * MiB, 4 * MiB, 512);
    ha_alloc_result res;
    /* Can never fit. */
    ck_assert_int_eq(alloc_loop(h, 4 * MiB + 1, &res, NULL), HA_EVA);
    ck_assert_int_eq(alloc_loop(h, 1 * GiB, &res, NULL), HA_EVA);
    ha_stats s = stats(h);
    ck_assert_uint_eq(s.mapped, 1 * MiB);
    ck_assert_uint_eq(s.allocs, 0);
    ck_assert_uint_eq(s.growths, 0);
    valid(h);
    /* Exactly va_size fits, after growing to it. */
    ck_assert_uint_eq(must_alloc(h, 4 * MiB, NULL), 0);
    ck_assert_uint_eq(stats(h).mapped, 4 * MiB);
    /* Then nothing fits any more: HA_EVA, the heap unchanged. */
    ha_stats before = stats(h);
    loop_out lo;
    ck_assert_int_eq(alloc_loop(h, 1, &res, &lo), HA_EVA);
    s = stats(h);
    ck_assert_uint_eq(s.mapped, before.mapped);
    ck_assert_uint_eq(s.live_bytes, before.live_bytes);
    ck_assert_uint_eq(s.allocs, before.allocs);
    ck_assert_uint_eq(s.growths, before.growths);
    ck_assert_int_le(lo.collects, 1);
    ck_assert_int_eq(lo.grows, 0);
    valid(h);
    ha_destroy(h);
}
END_TEST

START_TEST(alloc_after_eva_collects)
{
    /* A heap at va_size, full; an allocation fails with HA_EVA. Then every
     * rank frees a block: the next allocation must collect first and
     * succeed (a failed allocation must not use up the next one's collect). */
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 2, 1 * MiB, 1 * MiB, 1 * MiB, 512);
    ck_assert_uint_eq(direct_alloc(h, 1 * MiB), 0);
    ha_alloc_result res;
    ck_assert_int_eq(alloc_loop(h, 1, &res, NULL), HA_EVA);
    free_all_ranks(h, 2, 0);
    loop_out lo;
    int rc = alloc_loop(h, 1, &res, &lo);
    ck_assert_msg(rc == HA_OK,
                  "%s: 1 MiB heap at va_size with its only block freed by every rank: "
                  "ha_alloc(1) after an earlier HA_EVA gives %d (%s), want a collect and HA_OK",
                  ha_policy_name(pol), rc, ha_strerror(rc));
    ck_assert_int_eq(lo.collects, 1);
    ck_assert_uint_eq(stats(h).pending_bytes, 0);
    ha_destroy(h);
}
END_TEST

START_TEST(collect_before_grow_after_free)
{
    /* An explicit collect, then every rank frees a block, then an allocation
     * that fits only in that block. Seed: a collect the caller ran on its own
     * does not count: collect first, then no growth. Coalesce: every collect
     * answers (issue 18): no second collect, the heap grows; the next
     * collect reclaims the block. */
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 2, 1 * MiB, 1 * MiB, 64 * MiB, 512);
    uint64_t a = must_alloc(h, 512 * KiB, NULL);
    uint64_t b = must_alloc(h, 512 * KiB, NULL);
    ck_assert_uint_eq(a ^ b, 512 * KiB);
    collect(h);
    free_all_ranks(h, 2, a);
    ha_alloc_result res;
    loop_out lo;
    ck_assert_int_eq(alloc_loop(h, 512 * KiB, &res, &lo), HA_OK);
    if (pol == HA_POLICY_COALESCE) {
        /* 512 KiB >= mapped / 16: top-down, at the new chunk's end */
        ck_assert_msg(lo.collects == 0 && lo.grows == 1 && res.offset == 1536 * KiB,
                      "coalesce: heap of 1 MiB with two 512 KiB blocks; collect; every rank "
                      "frees one; allocating 512 KiB took %d collects and %d growths and gave "
                      "offset %" PRIu64 ", want no collect (one just ran), a growth, offset "
                      "1.5 MiB (top-down)",
                      lo.collects, lo.grows, res.offset);
        ck_assert_uint_eq(stats(h).collects_skipped, 1);
        ck_assert_uint_eq(stats(h).pending_bytes, 512 * KiB);
        ha_destroy(h);
        /* The same at va_size (no growth possible): the collect, not HA_EVA. */
        h = mk(pol, 2, 1 * MiB, 1 * MiB, 1 * MiB, 512);
        a = must_alloc(h, 512 * KiB, NULL);
        must_alloc(h, 512 * KiB, NULL);
        collect(h);
        free_all_ranks(h, 2, a);
        int rc = alloc_loop(h, 512 * KiB, &res, &lo);
        ck_assert_msg(rc == HA_OK && lo.collects == 1 && res.offset == a,
                      "coalesce at va_size: collect; every rank frees a block; allocating it "
                      "again gave %d (%s) after %d collects at offset %" PRIu64 ", want HA_OK "
                      "after 1 collect at %" PRIu64,
                      rc, ha_strerror(rc), lo.collects, res.offset, a);
        ha_destroy(h);
        return;
    }
    ck_assert_msg(lo.collects == 1 && lo.grows == 0 && res.offset == a,
                  "%s: heap of 1 MiB with two 512 KiB blocks; collect; every rank frees the "
                  "one at %" PRIu64 "; allocating 512 KiB took %d collects and %d growths "
                  "(%" PRIu32 " chunks) and gave offset %" PRIu64 ", want 1 collect, no "
                  "growth, offset %" PRIu64,
                  ha_policy_name(pol), a, lo.collects, lo.grows, lo.grow_chunks, res.offset, a);
    ck_assert_uint_eq(stats(h).mapped, 1 * MiB);
    ha_destroy(h);
}
END_TEST

/* ---- frees -------------------------------------------------------------- */

START_TEST(no_provably_empty_collects)
{
    /* A fresh heap that must grow: coalesce grows without a collect (no
     * block exists), the seed collects first. Then, with blocks live, an
     * explicit collect followed by an allocation that must grow: coalesce
     * grows at once (the collect answered), the seed collects again. */
    ha_policy pol = policies[_i];
    int co = pol == HA_POLICY_COALESCE;
    ha_heap *h = mk(pol, 2, 1 * MiB, 1 * MiB, 64 * MiB, 512);
    ha_alloc_result res;
    loop_out lo;
    ck_assert_int_eq(alloc_loop(h, 2 * MiB, &res, &lo), HA_OK);
    ck_assert_msg(lo.collects == (co ? 0 : 1) && lo.grows == 1,
                  "%s: first allocation of 2 MiB in a fresh 1 MiB heap took %d collects and "
                  "%d growths, want %d collects and 1 growth",
                  ha_policy_name(pol), lo.collects, lo.grows, co ? 0 : 1);
    collect(h);
    ck_assert_int_eq(alloc_loop(h, 4 * MiB, &res, &lo), HA_OK);
    ck_assert_msg(lo.collects == (co ? 0 : 1) && lo.grows == 1,
                  "%s: explicit collect, then an allocation that must grow took %d collects "
                  "and %d growths, want %d collects and 1 growth",
                  ha_policy_name(pol), lo.collects, lo.grows, co ? 0 : 1);
    ck_assert_uint_eq(stats(h).collects_skipped, co ? 2 : 0);
    /* After a successful allocation the next growth collects again. */
    ck_assert_int_eq(alloc_loop(h, 8 * MiB, &res, &lo), HA_OK);
    ck_assert_int_eq(lo.collects, 1);
    valid(h);
    ha_destroy(h);
}
END_TEST

START_TEST(free_errors_leave_heap_unchanged)
{
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 3, 1 * MiB, 4 * MiB, 16 * MiB, 512);
    uint64_t a = must_alloc(h, 4096, NULL);
    uint64_t b = must_alloc(h, 1000, NULL);
    ha_stats before = stats(h), s;

    /* No block starts there. */
    ck_assert_int_eq(ha_free(h, 0, a + 512), HA_ENOTHELD);
    ck_assert_int_eq(ha_free(h, 0, a + 4096 == b ? a + 2048 : a + 4096), HA_ENOTHELD);
    ck_assert_int_eq(ha_free(h, 1, 64 * MiB), HA_ENOTHELD);
    ck_assert_int_eq(ha_free(h, 1, UINT64_MAX), HA_ENOTHELD);
    /* Rank out of range. */
    ck_assert_int_lt(ha_free(h, 3, a), 0);
    ck_assert_int_lt(ha_free(h, HA_MAX_RANKS, a), 0);
    s = stats(h);
    same_stats(&before, &s, "a failed ha_free");
    valid(h);

    /* Double free by the same rank. */
    ck_assert_int_eq(ha_free(h, 1, a), HA_OK);
    ck_assert_int_eq(ha_rank_holds(h, 1, a), 0);
    ck_assert_int_eq(ha_rank_holds(h, 0, a), 1);
    ck_assert_int_eq(ha_rank_holds(h, 2, a), 1);
    ck_assert_int_eq(ha_rank_holds(h, 0, a + 512), 0);
    uint64_t held, rel;
    ha_rank_stats(h, 1, &held, &rel);
    ck_assert_uint_eq(held, 1024);
    ck_assert_uint_eq(rel, 4096);
    ha_rank_stats(h, 0, &held, &rel);
    ck_assert_uint_eq(held, 4096 + 1024);
    ck_assert_uint_eq(rel, 0);
    before = stats(h);
    ck_assert_uint_eq(before.frees, 1);
    ck_assert_int_eq(ha_free(h, 1, a), HA_ENOTHELD);
    s = stats(h);
    same_stats(&before, &s, "a double ha_free");
    valid(h);

    /* Released by every rank: pending; freeing again is still HA_ENOTHELD. */
    ck_assert_int_eq(ha_free(h, 0, a), HA_OK);
    ck_assert_int_eq(ha_free(h, 2, a), HA_OK);
    s = stats(h);
    ck_assert_uint_eq(s.pending_bytes, 4096);
    ck_assert_uint_eq(s.pending_blocks, 1);
    ck_assert_uint_eq(s.live_bytes, 1024);
    ck_assert_uint_eq(ha_block_size(h, a), 4096);
    before = s;
    ck_assert_int_eq(ha_free(h, 2, a), HA_ENOTHELD);
    s = stats(h);
    same_stats(&before, &s, "ha_free of a pending block");

    /* Reclaimed: gone. */
    collect(h);
    ck_assert_uint_eq(ha_block_size(h, a), 0);
    ck_assert_uint_eq(ha_block_size(h, b), 1024);
    before = stats(h);
    ck_assert_uint_eq(before.pending_bytes, 0);
    ck_assert_int_eq(ha_free(h, 0, a), HA_ENOTHELD);
    s = stats(h);
    same_stats(&before, &s, "ha_free of a reclaimed block");
    ha_rank_stats(h, 1, &held, &rel);
    ck_assert_uint_eq(held, 1024);
    ck_assert_uint_eq(rel, 0);
    /* After records came and went: the start of free space (coalesce: a
     * free extent record), and 2^64-1 (the table's mark of an unused
     * slot), are no blocks. */
    uint64_t top = b + 1024;
    ck_assert_int_eq(ha_free(h, 0, top), HA_ENOTHELD);
    ck_assert_int_eq(ha_rank_holds(h, 0, top), 0);
    ck_assert_uint_eq(ha_block_size(h, top), 0);
    ck_assert_int_eq(ha_free(h, 0, UINT64_MAX), HA_ENOTHELD);
    ck_assert_int_eq(ha_rank_holds(h, 0, UINT64_MAX), 0);
    ck_assert_uint_eq(ha_block_size(h, UINT64_MAX), 0);
    s = stats(h);
    same_stats(&before, &s, "ha_free of free space");
    valid(h);
    ha_destroy(h);
}
END_TEST

/* The same collect candidates (sorted) on two heaps. */
static void same_candidates(const ha_heap *a, const ha_heap *b)
{
    uint64_t *ca = NULL, *cb = NULL;
    size_t na = 0, nb = 0;
    ck_assert_int_eq(ha_collect_candidates(a, &ca, &na), HA_OK);
    ck_assert_int_eq(ha_collect_candidates(b, &cb, &nb), HA_OK);
    ck_assert_uint_eq(na, nb);
    for (size_t i = 0; i < na; i++)
        ck_assert_uint_eq(ca[i], cb[i]);
    free(ca);
    free(cb);
}

/* ha_free_batch is n calls of ha_free (the same heap after it, the same
 * later decisions), and all or nothing: a batch with an offset the rank
 * does not hold (none there, released, or repeated in the batch) changes
 * nothing and names that offset's index. */
START_TEST(free_batch)
{
    ha_policy pol = policies[_i];
    enum { N = 300, R = 3 };
    ha_heap *h = mk(pol, R, 1 * MiB, 4 * MiB, 64 * MiB, 512);
    ha_heap *twin = mk(pol, R, 1 * MiB, 4 * MiB, 64 * MiB, 512);
    uint64_t off[N], rs = 7;
    for (int i = 0; i < N; i++) {
        uint64_t size = 1 + (rs = rs * 6364136223846793005ull + 1442695040888963407ull) % 20000;
        off[i] = must_alloc(h, size, NULL);
        ck_assert_uint_eq(must_alloc(twin, size, NULL), off[i]);
    }
    /* Ranks 0 and 1 release the first 200 (rank 1 in reverse order), rank 2
     * the first 100: 100 blocks become pending. */
    uint64_t rev[N];
    for (int i = 0; i < 200; i++)
        rev[i] = off[199 - i];
    size_t bad = 12345;
    ck_assert_int_eq(ha_free_batch(h, 0, off, 200, &bad), HA_OK);
    ck_assert_int_eq(ha_free_batch(h, 1, rev, 200, NULL), HA_OK);
    ck_assert_int_eq(ha_free_batch(h, 2, off, 100, &bad), HA_OK);
    ck_assert_uint_eq(bad, 12345);
    ck_assert_int_eq(ha_free_batch(h, 2, off, 0, &bad), HA_OK);
    for (int i = 0; i < 200; i++) {
        ck_assert_int_eq(ha_free(twin, 0, off[i]), HA_OK);
        ck_assert_int_eq(ha_free(twin, 1, off[199 - i]), HA_OK);
        if (i < 100)
            ck_assert_int_eq(ha_free(twin, 2, off[i]), HA_OK);
    }
    valid(h);
    ha_stats a = stats(h), b = stats(twin);
    same_stats(&a, &b, "ha_free_batch against ha_free");
    ck_assert_uint_eq(a.pending_blocks, 100);
    same_candidates(h, twin);

    /* Refused batches: the 150th offset is not held (rank 2 makes 49 more
     * blocks pending before it), is inside a block, or repeats the first. */
    uint64_t bat[150];
    for (int i = 0; i < 149; i++)
        bat[i] = off[100 + i];
    uint64_t wrong[3] = {off[0], off[150] + 512, off[100]};
    for (int w = 0; w < 3; w++) {
        bat[149] = wrong[w];
        ha_stats before = stats(h), after;
        bad = 0;
        ck_assert_int_eq(ha_free_batch(h, 2, bat, 150, &bad), HA_ENOTHELD);
        ck_assert_uint_eq(bad, 149);
        after = stats(h);
        same_stats(&before, &after, "a refused ha_free_batch");
        valid(h);
        same_candidates(h, twin);
        for (int i = 100; i < 249; i++)
            ck_assert_int_eq(ha_rank_holds(h, 2, off[i]), 1);
    }
    ck_assert_int_eq(ha_free_batch(h, 3, off, 1, NULL), HA_EINVAL);

    /* After a collect both heaps decide alike. */
    ck_assert_int_eq(ha_free_batch(h, 2, bat, 149, NULL), HA_OK);
    for (int i = 0; i < 149; i++)
        ck_assert_int_eq(ha_free(twin, 2, bat[i]), HA_OK);
    collect(h);
    collect(twin);
    a = stats(h);
    b = stats(twin);
    same_stats(&a, &b, "a collect after ha_free_batch");
    for (int i = 0; i < 100; i++) {
        uint64_t size = 1 + (rs = rs * 6364136223846793005ull + 1442695040888963407ull) % 20000;
        ck_assert_uint_eq(must_alloc(h, size, NULL), must_alloc(twin, size, NULL));
    }
    ha_destroy(h);
    ha_destroy(twin);
}
END_TEST

START_TEST(partial_release_not_reclaimed)
{
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 3, 1 * MiB, 1 * MiB, 64 * MiB, 512);
    uint64_t a = must_alloc(h, 64 * KiB, NULL);
    uint64_t b = must_alloc(h, 16 * KiB, NULL);
    ck_assert_int_eq(ha_free(h, 0, a), HA_OK);
    ck_assert_int_eq(ha_free(h, 2, a), HA_OK);
    free_all_ranks(h, 3, b);
    uint64_t *cand = NULL;
    size_t n = 0;
    ck_assert_int_eq(ha_collect_candidates(h, &cand, &n), HA_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(cand[0], b);
    free(cand);
    uint64_t blocks = 0, bytes = 0;
    ck_assert_int_eq(ha_collect(h, &blocks, &bytes), HA_OK);
    ck_assert_uint_eq(blocks, 1);
    ck_assert_uint_eq(bytes, 16 * KiB);
    valid(h);
    ha_stats s = stats(h);
    ck_assert_uint_eq(s.live_bytes, 64 * KiB);
    ck_assert_uint_eq(s.pending_bytes, 0);
    ck_assert_uint_eq(ha_block_size(h, a), 64 * KiB);
    ck_assert_int_eq(ha_rank_holds(h, 1, a), 1);

    /* Many allocations of a's class, collects between them: none lands on a. */
    for (int i = 0; i < 40; i++) {
        uint64_t blk;
        uint64_t o = must_alloc(h, 64 * KiB, &blk);
        ck_assert_msg(o + blk <= a || o >= a + 64 * KiB,
                      "block [%" PRIu64 ", +%" PRIu64 ") overlaps a at %" PRIu64 " that rank 1 still holds", o, blk, a);
        free_all_ranks(h, 3, o);
        if (i % 3 == 0)
            collect(h);
    }
    /* The last rank's release makes a pending; only a collect reclaims it. */
    ck_assert_int_eq(ha_free(h, 1, a), HA_OK);
    ck_assert_int_eq(ha_collect_candidates(h, &cand, &n), HA_OK);
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found |= cand[i] == a;
    ck_assert_msg(found, "a is not a collect candidate after every rank released it");
    free(cand);
    collect(h);
    s = stats(h);
    ck_assert_uint_eq(s.live_bytes, 0);
    ck_assert_uint_eq(s.pending_bytes, 0);
    ck_assert_uint_eq(s.free_bytes, s.mapped);
    ha_destroy(h);
}
END_TEST

START_TEST(collect_apply_subset)
{
    ha_policy pol = policies[_i];
    ha_heap *h = mk(pol, 2, 1 * MiB, 4 * MiB, 64 * MiB, 512);
    uint64_t o[4], sz[4] = {4 * KiB, 16 * KiB, 1 * KiB, 64 * KiB};
    for (int i = 0; i < 4; i++)
        o[i] = must_alloc(h, sz[i], NULL);
    for (int i = 0; i < 3; i++)
        free_all_ranks(h, 2, o[i]);
    ck_assert_int_eq(ha_free(h, 0, o[3]), HA_OK);

    uint64_t *cand = NULL;
    size_t n = 0;
    ck_assert_int_eq(ha_collect_candidates(h, &cand, &n), HA_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_msg(cand[0] < cand[1] && cand[1] < cand[2], "candidates not sorted ascending");
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(cand[i] == o[0] || cand[i] == o[1] || cand[i] == o[2],
                      "candidate %" PRIu64 " was not released by every rank", cand[i]);
    uint64_t cbytes[3];
    for (int i = 0; i < 3; i++)
        cbytes[i] = ha_block_size(h, cand[i]);

    /* Refused: unsorted, a non-candidate, a duplicate, an unknown offset. */
    ha_stats before = stats(h), s;
    uint64_t bad1[2] = {cand[2], cand[0]};
    uint64_t bad2[2] = {cand[0], o[3]};
    uint64_t bad3[2] = {cand[1], cand[1]};
    uint64_t bad4[1] = {cand[2] + 512};
    uint64_t bytes = 77;
    ck_assert_int_eq(ha_collect_apply(h, bad1, 2, &bytes), HA_EINVAL);
    ck_assert_int_eq(ha_collect_apply(h, bad2, 2, &bytes), HA_EINVAL);
    ck_assert_int_eq(ha_collect_apply(h, bad3, 2, &bytes), HA_EINVAL);
    ck_assert_int_eq(ha_collect_apply(h, bad4, 1, &bytes), HA_EINVAL);
    s = stats(h);
    same_stats(&before, &s, "a refused ha_collect_apply");
    valid(h);

    /* The first and the last candidate: the middle one stays pending. */
    uint64_t sub[2] = {cand[0], cand[2]};
    ck_assert_int_eq(ha_collect_apply(h, sub, 2, &bytes), HA_OK);
    valid(h);
    ck_assert_uint_eq(bytes, cbytes[0] + cbytes[2]);
    s = stats(h);
    ck_assert_uint_eq(s.collects, before.collects + 1);
    ck_assert_uint_eq(s.pending_bytes, cbytes[1]);
    ck_assert_uint_eq(s.pending_blocks, 1);
    ck_assert_uint_eq(s.live_bytes, 64 * KiB);
    ck_assert_uint_eq(ha_block_size(h, cand[0]), 0);
    ck_assert_uint_eq(ha_block_size(h, cand[1]), cbytes[1]);
    ck_assert_uint_eq(ha_block_size(h, cand[2]), 0);
    uint64_t *c2 = NULL;
    size_t n2 = 0;
    ck_assert_int_eq(ha_collect_candidates(h, &c2, &n2), HA_OK);
    ck_assert_uint_eq(n2, 1);
    ck_assert_uint_eq(c2[0], cand[1]);
    free(c2);
    /* The pending middle block is never handed out before its collect. */
    for (int i = 0; i < 8; i++) {
        uint64_t blk, off = must_alloc(h, cbytes[1], &blk);
        ck_assert_msg(off + blk <= cand[1] || off >= cand[1] + cbytes[1],
                      "block at %" PRIu64 " overlaps the pending block at %" PRIu64, off, cand[1]);
    }
    /* Applying a reclaimed offset again is refused. */
    before = stats(h);
    ck_assert_int_eq(ha_collect_apply(h, &cand[0], 1, NULL), HA_EINVAL);
    s = stats(h);
    same_stats(&before, &s, "ha_collect_apply of a reclaimed offset");
    ck_assert_int_eq(ha_collect_apply(h, &cand[1], 1, &bytes), HA_OK);
    ck_assert_uint_eq(bytes, cbytes[1]);
    ck_assert_uint_eq(stats(h).pending_bytes, 0);
    free(cand);

    /* No candidates: n = 0, no array. */
    cand = (uint64_t *)&bytes;
    ck_assert_int_eq(ha_collect_candidates(h, &cand, &n), HA_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_null(cand);
    valid(h);
    ha_destroy(h);
}
END_TEST

/* ---- seed policy -------------------------------------------------------- */

START_TEST(seed_rollback)
{
    ha_heap *h = mk(HA_POLICY_SEED, 2, 1 * MiB, 1 * MiB, 8 * MiB, 512);
    uint64_t a = direct_alloc(h, 1 * KiB);
    uint64_t b = direct_alloc(h, 4 * KiB);
    uint64_t c = direct_alloc(h, 2 * KiB);
    ck_assert_uint_eq(a, 0);
    ck_assert_uint_eq(b, 1 * KiB);
    ck_assert_uint_eq(c, 5 * KiB);
    ck_assert_uint_eq(stats(h).top, 7 * KiB);
    /* The top block goes back to the bump pointer. */
    free_all_ranks(h, 2, c);
    ck_assert_uint_eq(stats(h).top, 7 * KiB); /* not before the collect */
    collect(h);
    ha_stats s = stats(h);
    ck_assert_uint_eq(s.top, 5 * KiB);
    ck_assert_uint_eq(s.free_bytes, 1 * MiB - 5 * KiB);
    /* So a block of another class starts there. */
    uint64_t d = direct_alloc(h, 8 * KiB);
    ck_assert_uint_eq(d, 5 * KiB);
    ck_assert_uint_eq(stats(h).top, 13 * KiB);
    /* A block below the top goes to its free list and is reused first. */
    free_all_ranks(h, 2, b);
    collect(h);
    ck_assert_uint_eq(stats(h).top, 13 * KiB);
    ck_assert_uint_eq(direct_alloc(h, 4 * KiB), b);
    ck_assert_uint_eq(direct_alloc(h, 4 * KiB), 13 * KiB);
    /* Rollback walks down from the top across adjacent blocks, highest first;
     * blocks only some ranks released stop it. */
    uint64_t e = 13 * KiB; /* 4 KiB, top = 17 KiB */
    free_all_ranks(h, 2, e);
    free_all_ranks(h, 2, d);
    free_all_ranks(h, 2, b);
    ck_assert_int_eq(ha_free(h, 0, a), HA_OK);
    collect(h);
    s = stats(h);
    ck_assert_uint_eq(s.top, 1 * KiB);
    ck_assert_uint_eq(s.live_bytes, 1 * KiB);
    ck_assert_uint_eq(s.pending_bytes, 0);
    ck_assert_uint_eq(s.free_bytes, 1 * MiB - 1 * KiB);
    ck_assert_uint_eq(direct_alloc(h, 2 * KiB), 1 * KiB);
    ck_assert_int_eq(ha_free(h, 1, a), HA_OK);
    free_all_ranks(h, 2, 1 * KiB);
    collect(h);
    s = stats(h);
    ck_assert_uint_eq(s.top, 0);
    ck_assert_uint_eq(s.free_bytes, s.mapped);
    ha_destroy(h);
}
END_TEST

START_TEST(seed_lifo_order)
{
    ha_heap *h = mk(HA_POLICY_SEED, 1, 1 * MiB, 1 * MiB, 8 * MiB, 512);
    uint64_t x[4];
    for (int i = 0; i < 4; i++) {
        x[i] = direct_alloc(h, 4 * KiB);
        ck_assert_uint_eq(x[i], (uint64_t)i * 4 * KiB);
    }
    uint64_t keep = direct_alloc(h, 512); /* stops the rollback */
    ck_assert_uint_eq(keep, 16 * KiB);
    /* Freed in the order 0, 2, 1: collected in sorted order, so the free
     * list (LIFO) hands them out highest first. */
    free_all_ranks(h, 1, x[0]);
    free_all_ranks(h, 1, x[2]);
    free_all_ranks(h, 1, x[1]);
    collect(h);
    ck_assert_uint_eq(direct_alloc(h, 4 * KiB), x[2]);
    ck_assert_uint_eq(direct_alloc(h, 3 * KiB), x[1]);
    ck_assert_uint_eq(direct_alloc(h, 2049), x[0]);
    ck_assert_uint_eq(direct_alloc(h, 4 * KiB), 16 * KiB + 512);
    /* Exact classes: a freed 4 KiB block does not serve 2 KiB or 8 KiB. */
    free_all_ranks(h, 1, x[1]);
    collect(h);
    ck_assert_uint_eq(direct_alloc(h, 2 * KiB), 20 * KiB + 512);
    ck_assert_uint_eq(direct_alloc(h, 8 * KiB), 22 * KiB + 512);
    ck_assert_uint_eq(direct_alloc(h, 4 * KiB), x[1]);
    ha_destroy(h);
}
END_TEST

START_TEST(seed_trigger_at_mapped_eighth)
{
    /* mapped 8 MiB: the trigger is at 1 MiB handed out since the last collect. */
    ha_heap *h = mk(HA_POLICY_SEED, 2, 8 * MiB, 8 * MiB, 64 * MiB, 512);
    uint64_t handed = 0;
    /* 512 KiB + 256 KiB + ... + 512 B = 1 MiB - 512, requests just over half a
     * class: handed counts classes, not requests. */
    for (uint64_t cls = 512 * KiB; cls >= 512; cls /= 2) {
        uint64_t req = cls == 512 ? 1 : cls / 2 + 1;
        ha_alloc_result res;
        int rc = ha_alloc(h, req, &res);
        ck_assert_msg(rc == HA_OK, "ha_alloc(%" PRIu64 ") with %" PRIu64 " handed out: %d", req, handed, rc);
        handed += cls;
        ck_assert_uint_eq(stats(h).handed_since_collect, handed);
    }
    ck_assert_uint_eq(handed, 1 * MiB - 512);
    /* Below the trigger: served at once, and now exactly mapped / 8. */
    direct_alloc(h, 512);
    ck_assert_uint_eq(stats(h).handed_since_collect, 1 * MiB);
    ck_assert_uint_eq(stats(h).collects, 0);
    /* Reached: the next allocation asks for a collect, with nothing pending. */
    ha_alloc_result res;
    ha_stats before = stats(h), s;
    ck_assert_int_eq(ha_alloc(h, 512, &res), HA_NEED_COLLECT);
    ck_assert_int_eq(res.collect_reason, HA_COLLECT_TRIGGER);
    s = stats(h);
    same_stats(&before, &s, "HA_NEED_COLLECT");
    collect(h);
    ck_assert_uint_eq(stats(h).handed_since_collect, 0);
    uint64_t o = direct_alloc(h, 512);
    ck_assert_uint_eq(o, 1 * MiB);
    ck_assert_uint_eq(stats(h).handed_since_collect, 512);

    /* Free-list pops count too. */
    free_all_ranks(h, 2, 0); /* the 512 KiB block at 0: not at the top */
    collect(h);
    ck_assert_uint_eq(stats(h).handed_since_collect, 0);
    ck_assert_uint_eq(direct_alloc(h, 300 * KiB), 0);
    ck_assert_uint_eq(stats(h).handed_since_collect, 512 * KiB);
    ck_assert_uint_eq(direct_alloc(h, 256 * KiB + 1), 1 * MiB + 512);
    ck_assert_uint_eq(stats(h).handed_since_collect, 1 * MiB);
    ck_assert_int_eq(ha_alloc(h, 1, &res), HA_NEED_COLLECT);
    ck_assert_int_eq(res.collect_reason, HA_COLLECT_TRIGGER);

    /* The threshold follows the mapped extent: after growing to 16 MiB it is
     * 2 MiB. (The collect the trigger asks for serves before growing too.) */
    loop_out lo;
    ck_assert_int_eq(alloc_loop(h, 8 * MiB, &res, &lo), HA_OK);
    ck_assert_int_eq(lo.collects, 1);
    ck_assert_int_eq(lo.reason, HA_COLLECT_TRIGGER);
    ck_assert_int_eq(lo.grows, 1);
    ck_assert_uint_eq(stats(h).mapped, 16 * MiB);
    collect(h);
    for (int i = 0; i < 3; i++)
        direct_alloc(h, 512 * KiB); /* 1.5 MiB < 2 MiB */
    direct_alloc(h, 512 * KiB);     /* 2 MiB: reached */
    ck_assert_int_eq(ha_alloc(h, 1, &res), HA_NEED_COLLECT);
    ck_assert_int_eq(res.collect_reason, HA_COLLECT_TRIGGER);
    ha_destroy(h);
}
END_TEST

START_TEST(seed_collect_before_grow)
{
    /* Below the trigger, an allocation that would grow asks for a collect
     * first (reason FULL), even with nothing pending. */
    ha_heap *h = mk(HA_POLICY_SEED, 2, 8 * MiB, 8 * MiB, 64 * MiB, 512);
    loop_out lo;
    ha_alloc_result res;
    /* Each allocation after the first reaches the 1 MiB trigger. */
    const uint64_t sizes[4] = {4 * MiB, 2 * MiB, 1 * MiB, 512 * KiB};
    const uint64_t offs[4] = {0, 4 * MiB, 6 * MiB, 7 * MiB};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(alloc_loop(h, sizes[i], &res, &lo), HA_OK);
        ck_assert_uint_eq(res.offset, offs[i]);
        ck_assert_int_eq(lo.collects, i > 0);
        if (i > 0)
            ck_assert_int_eq(lo.reason, HA_COLLECT_TRIGGER);
    }
    /* 512 KiB handed out: below the trigger, but 1 MiB does not fit. */
    ck_assert_uint_eq(stats(h).handed_since_collect, 512 * KiB);
    ck_assert_int_eq(ha_alloc(h, 1 * MiB, &res), HA_NEED_COLLECT);
    ck_assert_int_eq(res.collect_reason, HA_COLLECT_FULL);
    collect(h);
    ck_assert_int_eq(ha_alloc(h, 1 * MiB, &res), HA_NEED_GROW);
    ck_assert_uint_eq(res.grow_chunks, 1);
    ck_assert_int_eq(ha_grow(h, 1), HA_OK);
    ck_assert_int_eq(ha_alloc(h, 1 * MiB, &res), HA_OK);
    ck_assert_uint_eq(res.offset, 7 * MiB + 512 * KiB);
    ha_destroy(h);

    /* The collect before growing reclaims what is pending, and that serves
     * the allocation without growth. A full heap of 512 KiB blocks: */
    h = mk(HA_POLICY_SEED, 2, 8 * MiB, 8 * MiB, 64 * MiB, 512);
    for (int i = 0; i < 16; i++)
        ck_assert_uint_eq(must_alloc(h, 512 * KiB, NULL), (uint64_t)i * 512 * KiB);
    free_all_ranks(h, 2, 3 * 512 * KiB);
    ck_assert_int_eq(ha_alloc(h, 512 * KiB, &res), HA_NEED_COLLECT);
    collect(h);
    ck_assert_int_eq(ha_alloc(h, 512 * KiB, &res), HA_OK);
    ck_assert_uint_eq(res.offset, 3 * 512 * KiB);
    ck_assert_uint_eq(stats(h).growths, 0);
    ck_assert_uint_eq(stats(h).free_bytes, 0);
    ha_destroy(h);
}
END_TEST

/* ---- coalesce policy ---------------------------------------------------- */

START_TEST(coalesce_merges_back)
{
    ha_heap *h = mk(HA_POLICY_COALESCE, 2, 4 * MiB, 16 * MiB, 256 * MiB, 512);
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    uint64_t offs[600];
    int n = 0;
    /* Fill about half the heap with mixed sizes, free in a scattered order
     * over several collects. */
    uint64_t used = 0;
    while (n < 600 && used < 8 * MiB) {
        uint64_t x = cku_rng_next(&rs);
        uint64_t sz = 1 + x % (1u << (x >> 40) % 17);
        uint64_t blk;
        offs[n++] = must_alloc(h, sz, &blk);
        used += blk;
    }
    ck_assert_uint_eq(stats(h).mapped, 16 * MiB);
    for (int i = 0; i < n; i++) {
        int j = (int)((uint64_t)i * 7919 % (uint64_t)n);
        free_all_ranks(h, 2, offs[j]);
        if (i % 97 == 0)
            collect(h);
    }
    collect(h);
    ha_stats s = stats(h);
    ck_assert_uint_eq(s.live_bytes, 0);
    ck_assert_uint_eq(s.pending_bytes, 0);
    ck_assert_uint_eq(s.free_bytes, s.mapped);
    ck_assert_uint_eq(s.growths, 0);
    /* Free neighbours merged back into the whole extent. */
    ck_assert_uint_eq(direct_alloc(h, 16 * MiB), 0);
    ck_assert_uint_eq(stats(h).growths, 0);
    free_all_ranks(h, 2, 0);
    collect(h);
    ck_assert_uint_eq(stats(h).free_bytes, 16 * MiB);

    /* Two neighbouring min_block blocks merge back into the whole. */
    uint64_t p = direct_alloc(h, 512);
    uint64_t q = direct_alloc(h, 512);
    ck_assert_uint_eq(q > p ? q - p : p - q, 512);
    free_all_ranks(h, 2, p);
    free_all_ranks(h, 2, q);
    collect(h);
    ck_assert_uint_eq(stats(h).free_bytes, 16 * MiB);
    ck_assert_uint_eq(direct_alloc(h, 16 * MiB), 0);
    ha_destroy(h);
}
END_TEST

START_TEST(coalesce_collects_rarely)
{
    /* Churn of one scratch size: a collect when the heap is full, or (before
     * the size is known to die young and goes top-down) a compaction collect
     * once half the heap was handed out; never a growth. */
    ha_heap *h = mk(HA_POLICY_COALESCE, 2, 1 * MiB, 4 * MiB, 64 * MiB, 512);
    int collects = 0;
    for (int i = 0; i < 100; i++) {
        ha_alloc_result res;
        loop_out lo;
        ck_assert_int_eq(alloc_loop(h, 64 * KiB, &res, &lo), HA_OK);
        ck_assert_int_eq(lo.grows, 0);
        if (lo.collects)
            ck_assert(lo.reason == HA_COLLECT_FULL || lo.reason == HA_COLLECT_TRIGGER);
        collects += lo.collects;
        free_all_ranks(h, 2, res.offset);
    }
    /* 4 MiB holds 64 blocks of 64 KiB: at most 3 collects for 100. */
    ck_assert_int_ge(collects, 1);
    ck_assert_int_le(collects, 3);
    ck_assert_uint_eq(stats(h).growths, 0);
    ha_destroy(h);
}
END_TEST

/* ---- the seed review's models (one rank, 256 MiB heap) ------------------- */

typedef struct model_out {
    uint64_t mapped, growths, collects;
} model_out;

static model_out run_model(ha_policy pol, int which)
{
    ha_heap *h = mk(pol, 1, 256 * MiB, 256 * MiB, 4 * GiB, 512);
    if (which == 1) {
        for (int i = 0; i < 1000; i++)
            free_all_ranks(h, 1, must_alloc(h, 1 * MiB, NULL));
        must_alloc(h, 128 * MiB, NULL);
    } else {
        for (int step = 0; step < 20000; step++) {
            ha_alloc_result res;
            ck_assert_int_eq(alloc_loop(h, 1 * MiB, &res, NULL), HA_OK);
            ck_assert_int_eq(ha_free(h, 0, res.offset), HA_OK);
            if (step % 100 == 0)
                ck_assert_int_eq(alloc_loop(h, 512 * KiB, &res, NULL), HA_OK);
        }
        must_alloc(h, 64 * MiB, NULL);
    }
    ha_stats s = stats(h);
    ha_destroy(h);
    return (model_out){s.mapped, s.growths, s.collects};
}

START_TEST(seed_review_models)
{
    model_out m = run_model(HA_POLICY_SEED, 1);
    ck_assert_uint_eq(m.mapped, 256 * MiB);
    ck_assert_uint_eq(m.growths, 0);
    m = run_model(HA_POLICY_SEED, 2);
    ck_assert_msg(m.mapped == 256 * MiB && m.growths == 0 && m.collects == 625,
                  "seed model 2: mapped %" PRIu64 " growths %" PRIu64 " collects %" PRIu64 ", want 268435456 0 625",
                  m.mapped, m.growths, m.collects);
    m = run_model(HA_POLICY_COALESCE, 1);
    ck_assert_uint_eq(m.mapped, 256 * MiB);
    ck_assert_uint_eq(m.growths, 0);
    m = run_model(HA_POLICY_COALESCE, 2);
    ck_assert_msg(m.mapped == 256 * MiB && m.growths == 0 && m.collects <= 110,
                  "coalesce model 2: mapped %" PRIu64 " growths %" PRIu64 " collects %" PRIu64
                  ", want 268435456 0 <=110",
                  m.mapped, m.growths, m.collects);
}
END_TEST

/* ---- randomised multi-rank test against an independent model ----------- */

enum { M_LIVE = 1, M_PENDING = 2, M_REUSABLE = 3 };

typedef struct mblock {
    uint64_t off, size, req;
    uint32_t nheld;
    uint8_t held[8];
    int state;
} mblock;

typedef struct model {
    mblock *b;
    size_t n, cap;
    size_t *live; /* indices of M_LIVE blocks */
    size_t nlive;
    size_t *busy; /* indices of M_LIVE and M_PENDING blocks */
    size_t nbusy;
    uint64_t live_bytes, pending_bytes, live_blocks, pending_blocks;
    uint64_t allocs, frees, collects;
} model;

static void model_push(size_t **arr, size_t *n, size_t v, size_t cap)
{
    ck_assert_uint_lt(*n, cap);
    (*arr)[(*n)++] = v;
}

/* The bytes [off, off+size) may be handed out: no block a rank still holds,
 * nor one every rank released but no collect has reclaimed since, overlaps
 * them. */
static void model_check_new(const model *m, uint64_t off, uint64_t size, uint64_t step)
{
    for (size_t i = 0; i < m->nbusy; i++) {
        const mblock *o = &m->b[m->busy[i]];
        ck_assert_msg(off + size <= o->off || off >= o->off + o->size,
                      "step %" PRIu64 ": new block [%" PRIu64 ", %" PRIu64 ") overlaps %s "
                      "block [%" PRIu64 ", %" PRIu64 ")",
                      step, off, off + size, o->state == M_LIVE ? "a held" : "a pending", o->off, o->off + o->size);
    }
}

/* Drops reclaimed blocks from the busy set: all pending ones, or only those
 * whose offsets are in `offs` (sorted). */
static void model_reclaim(model *m, const uint64_t *offs, size_t n, int all)
{
    size_t w = 0;
    for (size_t i = 0; i < m->nbusy; i++) {
        mblock *o = &m->b[m->busy[i]];
        int drop = 0;
        if (o->state == M_PENDING) {
            if (all) {
                drop = 1;
            } else {
                size_t lo = 0, hi = n;
                while (lo < hi) {
                    size_t mid = (lo + hi) / 2;
                    if (offs[mid] < o->off)
                        lo = mid + 1;
                    else
                        hi = mid;
                }
                drop = lo < n && offs[lo] == o->off;
            }
        }
        if (drop) {
            o->state = M_REUSABLE;
            m->pending_bytes -= o->size;
            m->pending_blocks--;
        } else {
            m->busy[w++] = m->busy[i];
        }
    }
    m->nbusy = w;
    m->collects++;
}

static void check_against_model(const ha_heap *h, const model *m, uint64_t step)
{
    char err[512] = "";
    int rc = ha_validate(h, err, sizeof err);
    ck_assert_msg(rc == HA_OK, "step %" PRIu64 ": ha_validate: %s", step, err);
    ha_stats s = stats(h);
    ck_assert_msg(s.live_bytes == m->live_bytes && s.pending_bytes == m->pending_bytes &&
                      s.live_blocks == m->live_blocks && s.pending_blocks == m->pending_blocks,
                  "step %" PRIu64 ": heap says live %" PRIu64 "/%" PRIu64 " pending %" PRIu64 "/%" PRIu64
                  ", model %" PRIu64 "/%" PRIu64 " %" PRIu64 "/%" PRIu64,
                  step, s.live_bytes, s.live_blocks, s.pending_bytes, s.pending_blocks, m->live_bytes, m->live_blocks,
                  m->pending_bytes, m->pending_blocks);
    ck_assert_uint_eq(s.free_bytes, s.mapped - s.live_bytes - s.pending_bytes);
    ck_assert_uint_eq(s.allocs, m->allocs);
    ck_assert_uint_eq(s.frees, m->frees);
    ck_assert_uint_eq(s.collects, m->collects);
}

/* Runs the randomised test on heap h and, fed the identical sequence, twin
 * (determinism: identical answers). */
static void random_run(ha_policy pol, uint32_t ranks, uint64_t seed, int steps)
{
    ha_params p = {.ranks = ranks,
                   .chunk_size = 2 * MiB,
                   .initial_size = 8 * MiB,
                   .va_size = 2 * GiB,
                   .min_block = 512,
                   .policy = pol};
    ha_heap *h = NULL, *twin = NULL;
    char err[256];
    ck_assert_int_eq(ha_create(&p, &h, err, sizeof err), HA_OK);
    ck_assert_int_eq(ha_create(&p, &twin, err, sizeof err), HA_OK);
    model m;
    memset(&m, 0, sizeof m);
    size_t cap = (size_t)steps + 16;
    m.b = calloc(cap, sizeof *m.b);
    m.live = calloc(cap, sizeof *m.live);
    m.busy = calloc(cap, sizeof *m.busy);
    ck_assert(m.b && m.live && m.busy);
    uint64_t rs = seed * 0x9e3779b97f4a7c15ull + ranks * 1000003ull + (uint64_t)pol + 1;
    const size_t target_live = 150;
    uint64_t triggered = 0, explicit_collects = 0, subsets = 0, grows = 0;

    for (uint64_t step = 0; step < (uint64_t)steps; step++) {
        uint64_t r = cku_rng_below(&rs, 1000);
        /* Balance allocs against the ranks' frees around target_live blocks:
         * each block needs `ranks` frees. */
        uint64_t p_alloc = 1000 * (m.nlive < target_live ? 3 : 1) / (2 * (ranks + 1));
        if (r < 12) {
            /* An explicit collect. */
            uint64_t b1 = 0, y1 = 0, b2 = 0, y2 = 0;
            ck_assert_int_eq(ha_collect(h, &b1, &y1), HA_OK);
            ck_assert_int_eq(ha_collect(twin, &b2, &y2), HA_OK);
            ck_assert_uint_eq(y1, m.pending_bytes);
            ck_assert_uint_eq(b1, m.pending_blocks);
            ck_assert(b1 == b2 && y1 == y2);
            model_reclaim(&m, NULL, 0, 1);
            explicit_collects++;
        } else if (r < 18) {
            /* A multi-node style collect of a random subset of candidates. */
            uint64_t *c = NULL, *c2 = NULL;
            size_t n = 0, n2 = 0;
            ck_assert_int_eq(ha_collect_candidates(h, &c, &n), HA_OK);
            ck_assert_int_eq(ha_collect_candidates(twin, &c2, &n2), HA_OK);
            ck_assert_uint_eq(n, m.pending_blocks);
            ck_assert(n == n2 && (n == 0 || memcmp(c, c2, n * sizeof *c) == 0));
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (cku_rng_below(&rs, 2))
                    c[k++] = c[i];
            uint64_t y1 = 0, y2 = 0;
            ck_assert_int_eq(ha_collect_apply(h, c, k, &y1), HA_OK);
            ck_assert_int_eq(ha_collect_apply(twin, c, k, &y2), HA_OK);
            ck_assert_uint_eq(y1, y2);
            uint64_t before = m.pending_bytes;
            model_reclaim(&m, c, k, 0);
            ck_assert_uint_eq(y1, before - m.pending_bytes);
            free(c);
            free(c2);
            subsets++;
        } else if (r < 18 + p_alloc || m.nlive == 0) {
            /* An allocation: 1 B .. 4 MiB, skewed small (log-uniform). */
            uint64_t bits = cku_rng_below(&rs, 23);
            uint64_t size = 1 + cku_rng_below(&rs, (uint64_t)1 << bits);
            ha_alloc_result res, res2;
            int rc, rc2;
            for (int guard = 0;; guard++) {
                ck_assert_msg(guard < 8, "alloc protocol did not finish");
                memset(&res, 0, sizeof res);
                memset(&res2, 0, sizeof res2);
                rc = ha_alloc(h, size, &res);
                rc2 = ha_alloc(twin, size, &res2);
                ck_assert_msg(rc == rc2 && memcmp(&res, &res2, sizeof res) == 0,
                              "step %" PRIu64 ": twin heaps disagree: rc %d/%d offset %" PRIu64 "/%" PRIu64, step, rc,
                              rc2, res.offset, res2.offset);
                if (rc == HA_NEED_COLLECT) {
                    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
                    ck_assert_int_eq(ha_collect(twin, NULL, NULL), HA_OK);
                    model_reclaim(&m, NULL, 0, 1);
                    triggered++;
                    continue;
                }
                if (rc == HA_NEED_GROW) {
                    ck_assert_int_eq(ha_grow(h, res.grow_chunks), HA_OK);
                    ck_assert_int_eq(ha_grow(twin, res.grow_chunks), HA_OK);
                    grows++;
                    continue;
                }
                break;
            }
            ck_assert_msg(rc == HA_OK, "step %" PRIu64 ": allocating %" PRIu64 ": %s", step, size, ha_strerror(rc));
            ck_assert_uint_eq(res.block_size, ha_class_size(h, size));
            ck_assert_uint_eq(res.offset % p.min_block, 0);
            ck_assert_uint_le(res.offset + res.block_size, stats(h).mapped);
            model_check_new(&m, res.offset, res.block_size, step);
            mblock *nb = &m.b[m.n];
            *nb = (mblock){.off = res.offset, .size = res.block_size, .req = size, .nheld = ranks, .state = M_LIVE};
            memset(nb->held, 1, ranks);
            model_push(&m.live, &m.nlive, m.n, cap);
            model_push(&m.busy, &m.nbusy, m.n, cap);
            m.n++;
            m.live_bytes += res.block_size;
            m.live_blocks++;
            m.allocs++;
            ck_assert_uint_eq(ha_block_size(h, res.offset), res.block_size);
            for (uint32_t q = 0; q < ranks; q++)
                ck_assert_int_eq(ha_rank_holds(h, q, res.offset), 1);
        } else if (r < 990) {
            /* One rank frees one block it holds. */
            size_t li = (size_t)cku_rng_below(&rs, m.nlive);
            mblock *o = &m.b[m.live[li]];
            uint32_t q;
            do
                q = (uint32_t)cku_rng_below(&rs, ranks);
            while (!o->held[q]);
            int rc = ha_free(h, q, o->off);
            ck_assert_msg(rc == HA_OK, "step %" PRIu64 ": rank %u frees %" PRIu64 ": %s", step, q, o->off,
                          ha_strerror(rc));
            ck_assert_int_eq(ha_free(twin, q, o->off), HA_OK);
            ck_assert_int_eq(ha_rank_holds(h, q, o->off), 0);
            o->held[q] = 0;
            o->nheld--;
            m.frees++;
            if (o->nheld == 0) {
                o->state = M_PENDING;
                m.live[li] = m.live[--m.nlive];
                m.live_bytes -= o->size;
                m.live_blocks--;
                m.pending_bytes += o->size;
                m.pending_blocks++;
            }
        } else if (m.n > 0) {
            /* A wrong free: by a rank that already released the block, of a
             * pending or reclaimed block, or of an offset inside a block.
             * Must fail with HA_ENOTHELD and change nothing. */
            mblock *o = &m.b[cku_rng_below(&rs, m.n)];
            uint32_t q = (uint32_t)cku_rng_below(&rs, ranks);
            uint64_t off = o->off;
            int wrong = !(o->state == M_LIVE && o->held[q]);
            if (o->size > p.min_block && cku_rng_below(&rs, 4) == 0) {
                off = o->off + p.min_block; /* inside: no block starts there... */
                wrong = 1;
            }
            for (size_t i = 0; i < m.nbusy && wrong; i++) /* ...unless reused since */
                if (m.b[m.busy[i]].off == off && m.b[m.busy[i]].state == M_LIVE && m.b[m.busy[i]].held[q])
                    wrong = 0;
            if (wrong) {
                ha_stats before = stats(h), after;
                int rc = ha_free(h, q, off);
                ck_assert_msg(rc == HA_ENOTHELD,
                              "step %" PRIu64 ": rank %u freeing %" PRIu64
                              " (not held by it) gave %d, want HA_ENOTHELD",
                              step, q, off, rc);
                after = stats(h);
                same_stats(&before, &after, "a refused ha_free");
                ck_assert_int_eq(ha_free(twin, q, off), HA_ENOTHELD);
            }
        }
        check_against_model(h, &m, step);
    }

    /* Free everything, collect: empty. */
    for (size_t i = 0; i < m.nlive; i++) {
        mblock *o = &m.b[m.live[i]];
        for (uint32_t q = 0; q < ranks; q++)
            if (o->held[q]) {
                ck_assert_int_eq(ha_free(h, q, o->off), HA_OK);
                ck_assert_int_eq(ha_free(twin, q, o->off), HA_OK);
            }
    }
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    ck_assert_int_eq(ha_collect(twin, NULL, NULL), HA_OK);
    valid(h);
    ha_stats s = stats(h), s2 = stats(twin);
    ck_assert_uint_eq(s.live_bytes, 0);
    ck_assert_uint_eq(s.pending_bytes, 0);
    ck_assert_uint_eq(s.live_blocks + s.pending_blocks, 0);
    ck_assert_uint_eq(s.free_bytes, s.mapped);
    same_stats(&s, &s2, "the twin heap (determinism)");
    for (uint32_t q = 0; q < ranks; q++) {
        uint64_t held = 1, rel = 1;
        ha_rank_stats(h, q, &held, &rel);
        ck_assert_uint_eq(held + rel, 0);
    }
    if (getenv("CHECK_ALLOC_VERBOSE"))
        fprintf(stderr,
                "random %s ranks=%u seed=%" PRIu64 ": allocs %" PRIu64 " mapped %" PRIu64 " growths %" PRIu64
                " (%" PRIu64 ") collects %" PRIu64 " (triggered %" PRIu64 ", explicit %" PRIu64 ", subset %" PRIu64
                ")\n",
                ha_policy_name(pol), ranks, seed, s.allocs, s.mapped, s.growths, grows, s.collects, triggered,
                explicit_collects, subsets);
    ha_destroy(h);
    ha_destroy(twin);
    free(m.b);
    free(m.live);
    free(m.busy);
}

#define RANDOM_SEEDS 3
START_TEST(random_multi_rank)
{
    /* _i: policy (2) x ranks 2..8 (7) x seed (RANDOM_SEEDS). */
    int i = _i;
    uint64_t seed = (uint64_t)(i % RANDOM_SEEDS) + 1;
    i /= RANDOM_SEEDS;
    uint32_t ranks = (uint32_t)(i % 7) + 2;
    ha_policy pol = policies[i / 7];
    random_run(pol, ranks, seed, 6000);
}
END_TEST

START_TEST(determinism_offsets)
{
    /* The same sequence on two heaps built alike: identical offsets, also
     * when the heaps are built at different times with other heaps around. */
    ha_policy pol = policies[_i];
    ha_heap *a = mk(pol, 4, 1 * MiB, 2 * MiB, 1 * GiB, 512);
    ha_heap *noise = mk(pol, 2, 1 * MiB, 1 * MiB, 8 * MiB, 4096);
    must_alloc(noise, 5000, NULL);
    ha_heap *b = mk(pol, 4, 1 * MiB, 2 * MiB, 1 * GiB, 512);
    uint64_t rs = 42, live_a[256], live_b[256];
    int n = 0;
    for (int step = 0; step < 5000; step++) {
        uint64_t r = cku_rng_next(&rs);
        if (n < 256 && (r % 3 != 0 || n == 0)) {
            uint64_t size = 1 + cku_rng_below(&rs, (uint64_t)1 << cku_rng_below(&rs, 21));
            live_a[n] = must_alloc(a, size, NULL);
            live_b[n] = must_alloc(b, size, NULL);
            ck_assert_msg(live_a[n] == live_b[n], "step %d: offsets %" PRIu64 " vs %" PRIu64, step, live_a[n],
                          live_b[n]);
            n++;
        } else {
            int k = (int)cku_rng_below(&rs, (uint64_t)n);
            free_all_ranks(a, 4, live_a[k]);
            free_all_ranks(b, 4, live_b[k]);
            live_a[k] = live_a[n - 1];
            live_b[k] = live_b[n - 1];
            n--;
        }
    }
    ha_stats sa = stats(a), sb = stats(b);
    same_stats(&sa, &sb, "the second heap");
    ha_destroy(a);
    ha_destroy(b);
    ha_destroy(noise);
}
END_TEST

static Suite *alloc_suite(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("params");
    tcase_add_test(tc, params_check);
    tcase_add_test(tc, policy_names);
    tcase_add_loop_test(tc, class_sizes, 0, 2);
    tcase_add_loop_test(tc, create_and_params, 0, 2);
    tcase_add_loop_test(tc, block_bytes_double_with_the_table, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("protocol");
    tcase_add_loop_test(tc, exact_fit_then_grow, 0, 2);
    tcase_add_loop_test(tc, grow_chunk_count, 0, 2);
    tcase_add_loop_test(tc, eva_past_va_size, 0, 2);
    tcase_add_loop_test(tc, alloc_after_eva_collects, 0, 2);
    tcase_add_loop_test(tc, collect_before_grow_after_free, 0, 2);
    tcase_add_loop_test(tc, no_provably_empty_collects, 0, 2);
    tcase_add_loop_test(tc, free_errors_leave_heap_unchanged, 0, 2);
    tcase_add_loop_test(tc, free_batch, 0, 2);
    tcase_add_loop_test(tc, partial_release_not_reclaimed, 0, 2);
    tcase_add_loop_test(tc, collect_apply_subset, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("seed");
    tcase_add_test(tc, seed_rollback);
    tcase_add_test(tc, seed_lifo_order);
    tcase_add_test(tc, seed_trigger_at_mapped_eighth);
    tcase_add_test(tc, seed_collect_before_grow);
    suite_add_tcase(s, tc);

    tc = tcase_create("coalesce");
    tcase_add_test(tc, coalesce_merges_back);
    tcase_add_test(tc, coalesce_collects_rarely);
    suite_add_tcase(s, tc);

    tc = tcase_create("models");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, seed_review_models);
    suite_add_tcase(s, tc);

    tc = tcase_create("random");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, random_multi_rank, 0, 2 * 7 * RANDOM_SEEDS);
    tcase_add_loop_test(tc, determinism_offsets, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(alloc_suite()); }
