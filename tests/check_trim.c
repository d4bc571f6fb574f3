/*
 * check_trim.c - unit tests for trim (issue 30): the allocator core's
 * ha_trim (both policies: only whole chunks above every live or pending
 * block leave, the extent keeps one chunk, a growth comes back at the same
 * offsets, the invariants after each step) and the heap wing's collective
 * (daemon/heap/release.c): the chunks given back on every rank, a live block
 * holding its chunk, the growth that sends the chunk indices again, Stats,
 * a rank gone or late, the refusals. The fixture is tests/check_wing.h's.
 */
#include "check_wing.h"

#include "alloc.h"
#include "status.h"

#define MIB (UINT64_C(1) << 20)

static void core_ok(ha_heap *h)
{
    char err[300];
    ck_assert_msg(ha_validate(h, err, sizeof err) == HA_OK, "%s", err);
}

/* One allocation through the alloc protocol (collect, grow, then place). */
static uint64_t core_alloc(ha_heap *h, uint64_t size, uint32_t *grown)
{
    ha_alloc_result r;
    for (;;) {
        int rc = ha_alloc(h, size, &r);
        if (rc == HA_NEED_COLLECT) {
            ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
        } else if (rc == HA_NEED_GROW) {
            ck_assert_int_eq(ha_grow(h, r.grow_chunks), HA_OK);
            if (grown)
                *grown += r.grow_chunks;
        } else {
            ck_assert_int_eq(rc, HA_OK);
            core_ok(h);
            return r.offset;
        }
    }
}

static ha_heap *core_new(ha_policy pol, ha_reclaim rcl, uint32_t ranks)
{
    ha_params p = {.ranks = ranks,
                   .chunk_size = MIB,
                   .initial_size = 4 * MIB,
                   .va_size = 64 * MIB,
                   .min_block = 4096,
                   .policy = pol,
                   .reclaim = rcl,
                   .one_decider = rcl == HA_RECLAIM_EAGER};
    ha_heap *h = NULL;
    char err[200];
    ck_assert_msg(ha_create(&p, &h, err, sizeof err) == HA_OK, "%s", err);
    return h;
}

static uint64_t mapped_of(const ha_heap *h)
{
    ha_stats st;
    ha_get_stats(h, &st);
    return st.mapped;
}

static void free_all(ha_heap *h, uint32_t ranks, uint64_t off)
{
    for (uint32_t r = 0; r < ranks; r++)
        ck_assert_int_eq(ha_free(h, r, off), HA_OK);
    core_ok(h);
}

/* Both policies: a fresh heap keeps one chunk; a block at the top holds
 * its chunks (and those below); once it goes they leave; growth comes back
 * at the offsets trimmed; the counters add up. */
static void core_top(ha_policy pol)
{
    ha_heap *h = core_new(pol, HA_RECLAIM_COLLECT, 2);
    uint32_t cut = 99;
    ck_assert_int_eq(ha_trim(h, &cut, NULL, NULL), HA_OK);
    ck_assert_uint_eq(cut, 3);
    ck_assert_uint_eq(mapped_of(h), MIB);
    core_ok(h);
    ck_assert_int_eq(ha_trim(h, &cut, NULL, NULL), HA_OK); /* nothing more: one chunk stays */
    ck_assert_uint_eq(cut, 0);
    /* Fill 3 chunks with 1 MiB blocks (the seed's bump, coalesce's fit). */
    uint64_t off[3];
    uint32_t grown = 0;
    for (int i = 0; i < 3; i++)
        off[i] = core_alloc(h, MIB, &grown);
    ck_assert_uint_eq(mapped_of(h), 3 * MIB);
    uint64_t top = off[0] > off[1] ? (off[0] > off[2] ? 0 : 2) : (off[1] > off[2] ? 1 : 2);
    ck_assert_uint_eq(off[top], 2 * MIB);
    /* Pending (every rank freed, no collect yet) is not free. */
    free_all(h, 2, off[top]);
    ck_assert_int_eq(ha_trim(h, &cut, NULL, NULL), HA_OK);
    ck_assert_uint_eq(cut, 0);
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    /* Live below the top: only the top chunk leaves. */
    ck_assert_int_eq(ha_trim(h, &cut, NULL, NULL), HA_OK);
    ck_assert_uint_eq(cut, 1);
    ck_assert_uint_eq(mapped_of(h), 2 * MIB);
    core_ok(h);
    /* A growth comes back at the offset trimmed. */
    grown = 0;
    ck_assert_uint_eq(core_alloc(h, MIB, &grown), 2 * MIB);
    ck_assert_uint_eq(grown, 1);
    ha_stats st;
    ha_get_stats(h, &st);
    ck_assert_uint_eq(st.trims, 2);
    ck_assert_uint_eq(st.trimmed_bytes, 4 * MIB);
    ck_assert_uint_eq(st.mapped, 3 * MIB);
    ha_destroy(h);
}

START_TEST(core_trim_top_coalesce) { core_top(HA_POLICY_COALESCE); }
END_TEST

START_TEST(core_trim_top_seed) { core_top(HA_POLICY_SEED); }
END_TEST

/* Coalesce: a small live block near the top of a chunk holds it; a free
 * chunk below a live one stays (only the top is trimmed); eager reclaim
 * frees at the last release. Two heaps fed the same calls, trims
 * included, decide alike (determinism). */
START_TEST(core_trim_partial_and_deterministic)
{
    ha_heap *a = core_new(HA_POLICY_COALESCE, HA_RECLAIM_EAGER, 3);
    ha_heap *b = core_new(HA_POLICY_COALESCE, HA_RECLAIM_EAGER, 3);
    ha_heap *hs[2] = {a, b};
    uint64_t offs[2][8];
    for (int x = 0; x < 2; x++) {
        ha_heap *h = hs[x];
        uint32_t cut;
        ck_assert_int_eq(ha_trim(h, &cut, NULL, NULL), HA_OK);
        for (int i = 0; i < 6; i++)
            offs[x][i] = core_alloc(h, (uint64_t)(i + 1) * 300 * 1024, NULL);
        uint64_t m = mapped_of(h);
        /* Free every block but the lowest: the top chunks empty out. */
        uint64_t lowest = offs[x][0];
        for (int i = 1; i < 6; i++)
            if (offs[x][i] < lowest)
                lowest = offs[x][i];
        for (int i = 0; i < 6; i++)
            if (offs[x][i] != lowest)
                free_all(h, 3, offs[x][i]);
        ck_assert_int_eq(ha_trim(h, &cut, NULL, NULL), HA_OK);
        uint64_t keep = (lowest + ha_block_size(h, lowest) + MIB - 1) / MIB * MIB;
        ck_assert_uint_eq(mapped_of(h), keep);
        ck_assert_uint_eq(cut, (m - keep) / MIB);
        core_ok(h);
        offs[x][6] = core_alloc(h, 3 * MIB, NULL);
        offs[x][7] = core_alloc(h, 4096, NULL);
    }
    for (int i = 0; i < 8; i++)
        ck_assert_uint_eq(offs[0][i], offs[1][i]);
    ha_stats sa, sb;
    ha_get_stats(a, &sa);
    ha_get_stats(b, &sb);
    ck_assert_mem_eq(&sa, &sb, sizeof sa);
    ha_destroy(a);
    ha_destroy(b);
}
END_TEST

/* ha_trim's and ha_grow_plan's chunk indices, in order. */
typedef struct idx_list {
    uint32_t v[64];
    uint32_t n;
} idx_list;

static void note_idx(void *data, uint32_t i)
{
    idx_list *l = data;
    ck_assert_uint_lt(l->n, 64);
    l->v[l->n++] = i;
}

static uint32_t trim_list(ha_heap *h, idx_list *l)
{
    uint32_t cut = 99;
    l->n = 0;
    ck_assert_int_eq(ha_trim(h, &cut, note_idx, l), HA_OK);
    ck_assert_uint_eq(cut, l->n);
    core_ok(h);
    return cut;
}

static uint64_t holes_of(const ha_heap *h)
{
    ha_stats st;
    ha_get_stats(h, &st);
    return st.hole_bytes;
}

/* One allocation that grows: the chunks the growth backs (ha_grow_plan)
 * appended to l. */
static uint64_t alloc_plan(ha_heap *h, uint64_t size, idx_list *l)
{
    ha_alloc_result r;
    for (;;) {
        int rc = ha_alloc(h, size, &r);
        if (rc == HA_NEED_COLLECT) {
            ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
        } else if (rc == HA_NEED_GROW) {
            ck_assert_int_eq(ha_grow_plan(h, r.grow_chunks, note_idx, l), HA_OK);
            ck_assert_int_eq(ha_grow(h, r.grow_chunks), HA_OK);
            core_ok(h);
        } else {
            ck_assert_int_eq(rc, HA_OK);
            core_ok(h);
            return r.offset;
        }
    }
}

/* Coalesce, issue 30's holes: 32 blocks of 128 KiB fill 4 chunks bottom
 * up. A chunk whose blocks all went (and were collected) becomes a hole
 * below live chunks; one a live block touches, or whose blocks are only
 * pending, stays. Allocations never land in a hole; the growth they need
 * refills the lowest hole first, at its offsets. Returns the offsets of
 * the allocations after the trims in out[0..5). */
static void core_holes_run(ha_heap *h, uint64_t *out)
{
    const uint64_t b = 128 * 1024;
    for (uint64_t i = 0; i < 32; i++)
        ck_assert_uint_eq(core_alloc(h, b, NULL), i * b);
    for (uint64_t i = 8; i < 16; i++) /* chunk 1, wholly */
        free_all(h, 2, i * b);
    free_all(h, 2, 20 * b); /* part of chunk 2 */
    for (uint64_t i = 27; i < 32; i++)
        free_all(h, 2, i * b); /* part of chunk 3, the top */
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    for (uint64_t i = 0; i < 8; i++) /* chunk 0: pending, not free yet */
        free_all(h, 2, i * b);
    idx_list l;
    ck_assert_uint_eq(trim_list(h, &l), 1);
    ck_assert_uint_eq(l.v[0], 1);
    ck_assert_uint_eq(mapped_of(h), 4 * MIB);
    ck_assert_uint_eq(holes_of(h), MIB);
    ck_assert(ha_chunk_hole(h, 1) && !ha_chunk_hole(h, 0) && !ha_chunk_hole(h, 2));
    ck_assert_uint_eq(trim_list(h, &l), 0); /* nothing more */
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    ck_assert_uint_eq(trim_list(h, &l), 1); /* chunk 0, collected now */
    ck_assert_uint_eq(l.v[0], 0);
    ck_assert_uint_eq(holes_of(h), 2 * MIB);
    /* What is free outside the holes is taken first. */
    out[0] = core_alloc(h, b, NULL);
    ck_assert_uint_eq(out[0], 20 * b);
    out[1] = core_alloc(h, 5 * b, NULL);
    ck_assert_uint_eq(out[1], 27 * b);
    /* No room: the growth refills hole 0 (the lowest), at its offset. */
    l.n = 0;
    out[2] = alloc_plan(h, b, &l);
    ck_assert_uint_eq(l.n, 1);
    ck_assert_uint_eq(l.v[0], 0);
    ck_assert_uint_eq(out[2], 0);
    ck_assert_uint_eq(holes_of(h), MIB);
    ck_assert_uint_eq(mapped_of(h), 4 * MIB);
    /* 1 MiB does not fit in chunk 0's rest: hole 1 comes back, merged
     * with it ([b, 2 MiB) free); a block of mapped / 16 or more goes top
     * down: hole 1's offsets. */
    l.n = 0;
    out[3] = alloc_plan(h, MIB, &l);
    ck_assert_uint_eq(l.n, 1);
    ck_assert_uint_eq(l.v[0], 1);
    ck_assert_uint_eq(out[3], MIB);
    ck_assert_uint_eq(holes_of(h), 0);
    /* No hole left: a growth extends the top again. */
    l.n = 0;
    out[4] = alloc_plan(h, MIB, &l);
    ck_assert_uint_eq(l.n, 1);
    ck_assert_uint_eq(l.v[0], 4);
    ck_assert_uint_eq(out[4], 4 * MIB);
    ha_stats st;
    ha_get_stats(h, &st);
    ck_assert_uint_eq(st.trims, 2);
    ck_assert_uint_eq(st.trimmed_bytes, 2 * MIB);
    ck_assert_uint_eq(st.mapped, 5 * MIB);
}

START_TEST(core_trim_holes)
{
    ha_heap *a = core_new(HA_POLICY_COALESCE, HA_RECLAIM_COLLECT, 2);
    ha_heap *b = core_new(HA_POLICY_COALESCE, HA_RECLAIM_COLLECT, 2);
    uint64_t oa[5], ob[5];
    core_holes_run(a, oa);
    core_holes_run(b, ob);
    ck_assert_mem_eq(oa, ob, sizeof oa);
    ha_stats sa, sb;
    ha_get_stats(a, &sa);
    ha_get_stats(b, &sb);
    ck_assert_mem_eq(&sa, &sb, sizeof sa);
    ha_destroy(a);
    ha_destroy(b);
}
END_TEST

/* A hole that comes to end the extent leaves it (with the wholly free
 * chunks then below it); ha_grow_plan names holes before the top. */
START_TEST(core_trim_hole_at_top)
{
    ha_heap *h = core_new(HA_POLICY_COALESCE, HA_RECLAIM_COLLECT, 1);
    const uint64_t b = 128 * 1024;
    for (uint64_t i = 0; i < 32; i++)
        ck_assert_uint_eq(core_alloc(h, b, NULL), i * b);
    for (uint64_t i = 8; i < 24; i++) /* chunks 1 and 2 */
        free_all(h, 1, i * b);
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    idx_list l;
    ck_assert_uint_eq(trim_list(h, &l), 2);
    ck_assert_uint_eq(l.v[0], 1);
    ck_assert_uint_eq(l.v[1], 2);
    l.n = 0;
    ck_assert_int_eq(ha_grow_plan(h, 3, note_idx, &l), HA_OK);
    ck_assert_uint_eq(l.n, 3);
    ck_assert_uint_eq(l.v[0], 1);
    ck_assert_uint_eq(l.v[1], 2);
    ck_assert_uint_eq(l.v[2], 4);
    for (uint64_t i = 24; i < 32; i++) /* chunk 3 */
        free_all(h, 1, i * b);
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    ck_assert_uint_eq(trim_list(h, &l), 1);
    ck_assert_uint_eq(l.v[0], 3);
    ck_assert_uint_eq(mapped_of(h), MIB);
    ck_assert_uint_eq(holes_of(h), 0);
    ck_assert_uint_eq(core_alloc(h, MIB, NULL), MIB);
    ha_destroy(h);
}
END_TEST

/* The extent keeps one chunk, which may be a hole: everything trimmed,
 * the next allocation refills it (chunk 0, at its offsets). */
START_TEST(core_trim_one_chunk_hole)
{
    ha_heap *h = core_new(HA_POLICY_COALESCE, HA_RECLAIM_COLLECT, 1);
    const uint64_t b = 128 * 1024;
    for (uint64_t i = 0; i < 16; i++)
        ck_assert_uint_eq(core_alloc(h, b, NULL), i * b);
    for (uint64_t i = 0; i < 8; i++)
        free_all(h, 1, i * b);
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    idx_list l;
    ck_assert_uint_eq(trim_list(h, &l), 3); /* hole 0, top chunks 2 and 3 */
    ck_assert_uint_eq(l.v[0], 0);
    ck_assert_uint_eq(l.v[1], 2);
    ck_assert_uint_eq(l.v[2], 3);
    ck_assert_uint_eq(mapped_of(h), 2 * MIB);
    for (uint64_t i = 8; i < 16; i++)
        free_all(h, 1, i * b);
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    ck_assert_uint_eq(trim_list(h, &l), 1);
    ck_assert_uint_eq(l.v[0], 1);
    ck_assert_uint_eq(mapped_of(h), MIB);
    ck_assert_uint_eq(holes_of(h), MIB);
    ck_assert_uint_eq(trim_list(h, &l), 0);
    l.n = 0;
    /* in chunk 0 (top down: every block of its size bin died) */
    ck_assert_uint_eq(alloc_plan(h, b, &l), MIB - b);
    ck_assert_uint_eq(l.n, 1);
    ck_assert_uint_eq(l.v[0], 0);
    ck_assert_uint_eq(holes_of(h), 0);
    ck_assert_uint_eq(mapped_of(h), MIB);
    ha_destroy(h);
}
END_TEST

/* Twin heaps fed the same random allocations, frees (every rank), collects
 * and trims decide alike, report the same chunk indices, and stay valid
 * (blocks, free space and holes tile the extent: no block in a hole). */
START_TEST(core_trim_random_twins)
{
    ha_heap *t[2] = {core_new(HA_POLICY_COALESCE, HA_RECLAIM_COLLECT, 2),
                     core_new(HA_POLICY_COALESCE, HA_RECLAIM_COLLECT, 2)};
    uint64_t live[256];
    unsigned n = 0, holes_seen = 0, refills = 0;
    uint32_t x = 42;
    for (int step = 0; step < 3000; step++) {
        x = x * 1103515245u + 12345u;
        unsigned op = (x >> 16) % 16;
        if (op < 8 && n < 40) {
            uint64_t size = 4096 + (uint64_t)((x >> 4) % (3 * MIB / 2));
            uint64_t had = holes_of(t[0]);
            uint64_t o0 = core_alloc(t[0], size, NULL), o1 = core_alloc(t[1], size, NULL);
            ck_assert_uint_eq(o0, o1);
            refills += holes_of(t[0]) < had;
            live[n++] = o0;
        } else if (op < 13 && n) {
            unsigned i = (x >> 8) % n;
            free_all(t[0], 2, live[i]);
            free_all(t[1], 2, live[i]);
            live[i] = live[--n];
        } else if (op < 14) {
            ck_assert_int_eq(ha_collect(t[0], NULL, NULL), HA_OK);
            ck_assert_int_eq(ha_collect(t[1], NULL, NULL), HA_OK);
        } else {
            idx_list a, b;
            trim_list(t[0], &a);
            trim_list(t[1], &b);
            ck_assert_uint_eq(a.n, b.n);
            ck_assert_mem_eq(a.v, b.v, a.n * sizeof a.v[0]);
            for (uint32_t j = 0; j + 1 < a.n; j++)
                ck_assert_uint_lt(a.v[j], a.v[j + 1]);
            holes_seen += holes_of(t[0]) > 0;
        }
    }
    ck_assert_uint_gt(holes_seen, 0); /* the sequence made holes */
    ck_assert_uint_gt(refills, 0);    /* and growths refilled some */
    ha_stats sa, sb;
    ha_get_stats(t[0], &sa);
    ha_get_stats(t[1], &sb);
    ck_assert_mem_eq(&sa, &sb, sizeof sa);
    ha_destroy(t[0]);
    ha_destroy(t[1]);
}
END_TEST

/* The seed policy trims only the top: a free chunk below a live block
 * stays. */
START_TEST(core_trim_seed_top_only)
{
    ha_heap *h = core_new(HA_POLICY_SEED, HA_RECLAIM_COLLECT, 1);
    uint64_t o[4];
    for (int i = 0; i < 4; i++)
        o[i] = core_alloc(h, MIB, NULL);
    free_all(h, 1, o[0] == 0 ? o[0] : o[1] == 0 ? o[1] : o[2] == 0 ? o[2] : o[3]);
    ck_assert_int_eq(ha_collect(h, NULL, NULL), HA_OK);
    idx_list l;
    ck_assert_uint_eq(trim_list(h, &l), 0);
    ck_assert_uint_eq(holes_of(h), 0);
    ha_destroy(h);
}
END_TEST

/* ---- the heap wing --------------------------------------------------------- */

static void trim(int peer)
{
    Heapd__Trim m = HEAPD__TRIM__INIT;
    hd_heap_trim(reg, &peers[peer], 13, &m);
    validate();
}

static void both_trim(void)
{
    trim(0);
    trim(1);
    ck_assert_msg(last(0)->kind == R_TRIM, "%s", last(0)->msg);
    ck_assert_msg(last(1)->kind == R_TRIM, "%s", last(1)->msg);
}

static void release(int peer)
{
    Heapd__Release m = HEAPD__RELEASE__INIT;
    hd_heap_release(reg, &peers[peer], 11, &m);
    validate();
}

static void restore(int peer)
{
    Heapd__Restore m = HEAPD__RESTORE__INIT;
    hd_heap_restore(reg, &peers[peer], 12, &m);
    validate();
}

/* Four 1 MiB blocks (seq 0..3) on both ranks: 4 chunks. off[i] the offsets. */
static void four(uint64_t *off)
{
    formed();
    for (uint64_t i = 0; i < 4; i++)
        off[i] = alloc2(i, MIB, NULL);
    stats(2);
    ck_assert_uint_eq(last(2)->mapped, 4 * MIB);
}

static int at(const uint64_t *off, uint64_t where)
{
    for (int i = 0; i < 4; i++)
        if (off[i] == where)
            return i;
    ck_abort_msg("no block at %llu", (unsigned long long)where);
    return -1;
}

START_TEST(wing_trim_gives_back_top_chunks)
{
    uint64_t off[4];
    four(off);
    /* A free chunk below a live one becomes a hole (chunk 2 free, chunk 3
     * live): released on both ranks, the extent stays. */
    int b2 = at(off, 2 * MIB), b3 = at(off, 3 * MIB);
    free1(0, off[b2]);
    free1(1, off[b2]);
    trim(0);
    ck_assert_int_eq(last(0)->kind, R_FREE); /* waits for rank 1 */
    trim(1);
    ck_assert_msg(last(0)->kind == R_TRIM, "%s", last(0)->msg);
    ck_assert_int_eq(last(1)->kind, R_TRIM);
    ck_assert_uint_eq(last(1)->trimmed, MIB);
    ck_assert_uint_eq(last(1)->mapped, 4 * MIB);
    ck_assert_uint_eq(last(1)->ntrim, 1);
    ck_assert_uint_eq(last(1)->trim_chunks[0], 2);
    stats(2);
    ck_assert_uint_eq(last(2)->mapped, 4 * MIB);
    ck_assert_uint_eq(last(2)->resident, 6 * MIB); /* 3 chunks on each of 2 ranks */
    ck_assert_uint_eq(last(2)->trims, 1);
    /* A block only one rank freed is live: it holds chunk 3. */
    free1(0, off[b3]);
    both_trim();
    ck_assert_uint_eq(last(0)->trimmed, 0);
    free1(1, off[b3]);
    both_trim();
    /* chunk 3 leaves, then the hole at 2 that ends the extent then */
    ck_assert_uint_eq(last(0)->trimmed, MIB);
    ck_assert_uint_eq(last(1)->mapped, 2 * MIB);
    ck_assert_uint_eq(last(1)->ntrim, 1);
    ck_assert_uint_eq(last(1)->trim_chunks[0], 3);
    stats(2);
    ck_assert_uint_eq(last(2)->mapped, 2 * MIB);
    ck_assert_uint_eq(last(2)->resident, 4 * MIB); /* 2 chunks on each of 2 ranks */
    ck_assert_uint_eq(last(2)->trims, 2);
    ck_assert_uint_eq(last(2)->trimmed, 4 * MIB);
    /* The growth comes back at the offsets trimmed, and sends chunk 2 of
     * both ranks again to each. */
    alloc_n(0, 4, MIB, NULL);
    ck_assert_msg(last(0)->kind == R_ALLOC, "%s", last(0)->msg);
    ck_assert_uint_eq(last(0)->offset, 2 * MIB);
    ck_assert_uint_eq(last(0)->alloc_nchunks, 2);
    ck_assert_uint_eq(last(0)->alloc_first, 2);
    alloc_n(1, 4, MIB, NULL);
    ck_assert_uint_eq(last(1)->offset, 2 * MIB);
    ck_assert_uint_eq(last(1)->alloc_nchunks, 2);
    ck_assert_uint_eq(last(1)->alloc_first, 2);
    stats(2);
    ck_assert_uint_eq(last(2)->mapped, 3 * MIB);
}
END_TEST

/* Issue 30's holes in the wing: chunk 1 free between live chunks 0 and 2
 * is released on both ranks; a growth refills it at index 1 on both and
 * sends it again (with the chunks above it, which the client skips as
 * mapped). */
START_TEST(wing_trim_hole_refilled)
{
    uint64_t off[4];
    four(off);
    int b1 = at(off, MIB), b3 = at(off, 3 * MIB);
    free1(0, off[b1]);
    free1(1, off[b1]);
    free1(0, off[b3]);
    free1(1, off[b3]);
    both_trim();
    ck_assert_uint_eq(last(1)->mapped, 3 * MIB);
    ck_assert_uint_eq(last(1)->ntrim, 2);
    ck_assert_uint_eq(last(1)->trim_chunks[0], 1);
    ck_assert_uint_eq(last(1)->trim_chunks[1], 3);
    stats(2);
    ck_assert_uint_eq(last(2)->resident, 4 * MIB);
    /* 1 MiB needs room: the hole is refilled first, at its offset. */
    alloc_n(0, 4, MIB, NULL);
    ck_assert_msg(last(0)->kind == R_ALLOC, "%s", last(0)->msg);
    ck_assert_uint_eq(last(0)->offset, MIB);
    ck_assert_uint_eq(last(0)->alloc_first, 1);
    ck_assert_uint_eq(last(0)->alloc_nchunks, 4); /* chunks 1, 2 of both ranks */
    alloc_n(1, 4, MIB, NULL);
    ck_assert_uint_eq(last(1)->offset, MIB);
    ck_assert_uint_eq(last(1)->alloc_first, 1);
    stats(2);
    ck_assert_uint_eq(last(2)->mapped, 3 * MIB);
    ck_assert_uint_eq(last(2)->resident, 6 * MIB);
}
END_TEST

START_TEST(wing_trim_peer_gone_and_timeout)
{
    persist_s = 60;
    uint64_t off[4];
    four(off);
    free1(0, off[at(off, 3 * MIB)]);
    free1(1, off[at(off, 3 * MIB)]);
    trim(0);
    crash1();
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "trim of heap \"h\" failed: rank 1 (pid 2001) disconnected");
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "nothing was trimmed");
    stats(2);
    ck_assert_uint_eq(last(2)->mapped, 4 * MIB);
    trim(0);
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "rank 1 is not connected");
    attach(3, 1);
    ck_assert_int_eq(last(3)->kind, R_ATTACH);
    stats(0); /* peer 0's latest answer is no error */
    trim(0);
    ck_assert_int_eq(last(0)->kind, R_STATS);
    uint64_t end = uv_now(&loop) + 5000;
    while (last(0)->kind != R_ERROR && uv_now(&loop) < end)
        uv_run(&loop, UV_RUN_ONCE);
    is_error(0, HEAPD__ERR_CODE__ERR_TIMEOUT, "rank(s) 1 never called it");
    trim(0);
    trim(3);
    ck_assert_msg(last(3)->kind == R_TRIM, "%s", last(3)->msg);
    ck_assert_uint_eq(last(3)->trimmed, MIB);
}
END_TEST

START_TEST(wing_trim_refusals)
{
    formed();
    trim(0);
    release(1);
    is_error(1, HEAPD__ERR_CODE__ERR_STATE, "a trim is in progress (rank 0 began it)");
    trim(0);
    is_error(0, HEAPD__ERR_CODE__ERR_PROTOCOL, "rank 0 is already waiting in a trim");
    trim(1);
    ck_assert_int_eq(last(1)->kind, R_TRIM);
    release(0);
    release(1);
    ck_assert_int_eq(last(1)->kind, R_RELEASE);
    trim(0);
    is_error(0, HEAPD__ERR_CODE__ERR_STATE, "nothing to trim; restore it first");
    restore(0);
    restore(1);
    ck_assert_int_eq(last(1)->kind, R_RESTORE);
}
END_TEST

static Suite *trim_suite(void)
{
    Suite *s = suite_create("trim");
    TCase *core = tcase_create("core");
    tcase_add_test(core, core_trim_top_coalesce);
    tcase_add_test(core, core_trim_top_seed);
    tcase_add_test(core, core_trim_partial_and_deterministic);
    tcase_add_test(core, core_trim_holes);
    tcase_add_test(core, core_trim_hole_at_top);
    tcase_add_test(core, core_trim_one_chunk_hole);
    tcase_add_test(core, core_trim_random_twins);
    tcase_add_test(core, core_trim_seed_top_only);
    suite_add_tcase(s, core);
    TCase *tc = tcase_create("wing");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, wing_trim_gives_back_top_chunks);
    tcase_add_test(tc, wing_trim_hole_refilled);
    tcase_add_test(tc, wing_trim_peer_gone_and_timeout);
    tcase_add_test(tc, wing_trim_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ckw_main(trim_suite()); }
