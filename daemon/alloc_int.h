/* alloc_int.h - the allocator core's private structures (daemon/alloc*.c).
 *
 * daemon/alloc.h is the public API; this header is shared only by the
 * files of the core:
 *   alloc.c           the public functions: parameters, lifetime, alloc,
 *                     grow, free, collect, introspection
 *   alloc_bits.c      hierarchical bitmaps (prefix hab_)
 *   alloc_table.c     the block table, offset vectors, the offset sort (hat_)
 *   alloc_coalesce.c  the coalesce policy: free extents, fit, its table
 *                     ha_coalesce_ops (hac_)
 *   alloc_seed.c      the seed policy: LIFO lists, bump pointer, its table
 *                     ha_seed_ops
 *   alloc_validate.c  ha_validate, every invariant written below (each
 *                     policy's own through its table)
 *
 * Notation used in the invariants below:
 *   E        = h->mapped (the extent), a multiple of chunk_size, <= va_size
 *   B        = the set of block records in the table (held or pending)
 *   F        = the set of free regions (coalesce: the extents the fstart
 *              and fend bitmaps delimit; seed: entries of h->lifo plus the
 *              bump region [bump, E))
 *   size(b)  = b.size (seed: always 2^b.klog)
 *   R        = params.ranks
 */
#ifndef HEAPD_ALLOC_INT_H
#define HEAPD_ALLOC_INT_H

#include "alloc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HA_EMPTY    UINT64_MAX
#define HA_MAX_VA   (UINT64_C(1) << 56)
#define HA_DECAY_AT (UINT64_C(1) << 20)

/* ---- small helpers ----------------------------------------------------- */

static inline bool is_pow2(uint64_t x) { return x && !(x & (x - 1)); }
static inline uint32_t log2u(uint64_t x) { return 63u - (uint32_t)__builtin_clzll(x); }
static inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

/* ---- hierarchical bitmap (alloc_bits.c) -----------------------------
 *
 * A set of positions 0..nbits-1 with O(levels) insert, erase, first, last.
 *
 * Invariants:
 *   level 0: bit i of w[0]          <=> position i is in the set
 *   level l+1: bit j of w[l+1]      <=> w[l][j] != 0
 *   nw[l+1] = ceil(nw[l] / 64), nw[top] == 1 (top = nlevels - 1)
 *   no bit at or beyond nbits is set
 */
#define HAB_MAXLV 8
typedef struct hab_bits {
    uint64_t nbits;
    uint32_t nlevels;
    size_t nw[HAB_MAXLV];
    uint64_t *w[HAB_MAXLV];
} hab_bits;

void hab_free(hab_bits *b);
/* Resizes to at least nbits (only grows, at least doubling), keeping level
 * 0, rebuilding the rest. */
int hab_resize(hab_bits *b, uint64_t nbits);

static inline bool hab_test(const hab_bits *b, uint64_t i) { return i < b->nbits && (b->w[0][i / 64] >> (i % 64)) & 1; }

static inline void hab_set(hab_bits *b, uint64_t i)
{
    for (uint32_t l = 0; l < b->nlevels; l++) {
        uint64_t *w = &b->w[l][i / 64];
        bool was_zero = *w == 0;
        *w |= UINT64_C(1) << (i % 64);
        if (!was_zero)
            break;
        i /= 64;
    }
}

static inline void hab_clear(hab_bits *b, uint64_t i)
{
    for (uint32_t l = 0; l < b->nlevels; l++) {
        uint64_t *w = &b->w[l][i / 64];
        *w &= ~(UINT64_C(1) << (i % 64));
        if (*w)
            break;
        i /= 64;
    }
}

/* Moves position i (in the set) to j (not in it): one word's update when
 * both are in one level-0 word (that word stays non-zero: no summary bit
 * changes), else a clear and a set. */
static inline void hab_move(hab_bits *b, uint64_t i, uint64_t j)
{
    if (i / 64 == j / 64) {
        uint64_t *w = &b->w[0][i / 64];
        *w = (*w & ~(UINT64_C(1) << (i % 64))) | (UINT64_C(1) << (j % 64));
        return;
    }
    hab_clear(b, i);
    hab_set(b, j);
}

/* Lowest / highest set position, or HA_EMPTY. */
static inline uint64_t hab_first(const hab_bits *b)
{
    if (!b->nlevels)
        return HA_EMPTY;
    uint64_t idx = 0;
    for (int l = (int)b->nlevels - 1; l >= 0; l--) {
        uint64_t w = b->w[l][idx];
        if (!w)
            return HA_EMPTY;
        idx = idx * 64 + (uint64_t)__builtin_ctzll(w);
    }
    return idx;
}

static inline uint64_t hab_last(const hab_bits *b)
{
    if (!b->nlevels)
        return HA_EMPTY;
    uint64_t idx = 0;
    for (int l = (int)b->nlevels - 1; l >= 0; l--) {
        uint64_t w = b->w[l][idx];
        if (!w)
            return HA_EMPTY;
        idx = idx * 64 + 63u - (uint64_t)__builtin_clzll(w);
    }
    return idx;
}

/* Lowest set position >= i / highest set position <= i, or HA_EMPTY. Climb
 * while the rest of the word is empty, then descend: O(levels). */
static inline uint64_t hab_next(const hab_bits *b, uint64_t i)
{
    uint32_t l = 0;
    for (;;) {
        if (l == b->nlevels || i >= (uint64_t)b->nw[l] * 64)
            return HA_EMPTY;
        uint64_t w = b->w[l][i / 64] & (UINT64_MAX << (i % 64));
        if (w) {
            i = (i & ~UINT64_C(63)) + (uint64_t)__builtin_ctzll(w);
            break;
        }
        i = i / 64 + 1;
        l++;
    }
    while (l > 0) {
        l--;
        i = i * 64 + (uint64_t)__builtin_ctzll(b->w[l][i]);
    }
    return i;
}

static inline uint64_t hab_prev(const hab_bits *b, uint64_t i)
{
    uint32_t l = 0;
    if (!b->nlevels)
        return HA_EMPTY;
    if (i >= (uint64_t)b->nw[0] * 64)
        i = (uint64_t)b->nw[0] * 64 - 1;
    for (;;) {
        if (l == b->nlevels)
            return HA_EMPTY;
        uint32_t bit = (uint32_t)(i % 64);
        uint64_t w = b->w[l][i / 64] & (bit == 63 ? UINT64_MAX : (UINT64_C(2) << bit) - 1);
        if (w) {
            i = (i & ~UINT64_C(63)) + 63u - (uint64_t)__builtin_clzll(w);
            break;
        }
        if (i / 64 == 0)
            return HA_EMPTY;
        i = i / 64 - 1;
        l++;
    }
    while (l > 0) {
        l--;
        i = i * 64 + 63u - (uint64_t)__builtin_clzll(b->w[l][i]);
    }
    return i;
}

/* ---- block table (alloc_table.c) --------------------------------------
 *
 * Open addressing (linear probing, backward-shift deletion) from a block's
 * offset to its record, one per block in B. A record is 32 bytes, two to a
 * cache line, and carries
 * the holder bits of up to 64 ranks itself, so ha_free touches one line;
 * more ranks keep their bits in a side array (words per record).
 *
 * Invariants, for every record b:
 *   b.off % min_block == 0, b.size % min_block == 0, b.off + b.size <= E
 *   b.klog == floor(log2(b.size)); seed: b.size == 2^b.klog
 *   held(b) = the ranks whose bit is set in b's holder row;
 *   |held(b)| = R - b.nrel
 *   b.pending == 1  <=>  b.nrel == R  <=>  b.off is in h->pending
 *   count == number of records, count <= cap / 2, cap a power of two >= 64
 *   bit i of occ[i / 64] == 1  <=>  slot[i].off != HA_EMPTY
 *
 * occ (one bit per slot, cap / 8 bytes: 256 KiB at 10^6 records, where the
 * slots take 64 MiB) lets an insert find its empty slot, and an erase the
 * end of its probe run, without reading the slots: an insert's only access
 * to its record's line is a write, which does not wait for the line.
 */
typedef struct ha_blk {
    uint64_t off;  /* HA_EMPTY: slot unused */
    uint64_t size; /* bytes */
    uint64_t held; /* ranks <= 64: bit r <=> rank r holds the block */
    uint32_t nrel; /* ranks that released this block */
    uint8_t klog;
    uint8_t pending;
    uint8_t mark; /* scratch for collect_apply */
    uint8_t pad;
} ha_blk;

typedef struct ha_table {
    ha_blk *slot;
    uint64_t *occ;   /* cap / 64 words: bit i <=> slot i holds a record */
    uint64_t *xheld; /* words > 1 only: cap * words holder bits */
    size_t cap, count, words;
    uint32_t shift; /* 64 - log2(cap) */
    uint32_t kmin;
} ha_table;

/* calloc(n, size); blocks of 2 MiB or more 2 MiB aligned and advised
 * MADV_HUGEPAGE (a random access at 10^6 blocks then misses no TLB); free()
 * releases it. */
void *hat_big_calloc(size_t n, size_t size);
int hat_init(ha_table *t, size_t cap, size_t words, uint32_t kmin);
void hat_free(ha_table *t);
int hat_grow(ha_table *t);
/* Makes room for `extra` more records (so that hat_insert cannot fail). */
int hat_reserve_grow(ha_table *t, size_t extra);
static inline int hat_reserve(ha_table *t, size_t extra)
{
    return (t->count + extra) * 2 > t->cap ? hat_reserve_grow(t, extra) : 0;
}
void hat_erase(ha_table *t, ha_blk *b);

static inline size_t hat_hash(const ha_table *t, uint64_t off)
{
    return (size_t)(((off >> t->kmin) * UINT64_C(0x9E3779B97F4A7C15)) >> t->shift);
}

/* Asks for the line a lookup or insert of off reads first (its home slot;
 * a second line for the rest of the probe run made no difference). */
static inline void hat_prefetch(const ha_table *t, uint64_t off) { __builtin_prefetch(&t->slot[hat_hash(t, off)], 1); }

static inline ha_blk *hat_find(const ha_table *t, uint64_t off)
{
    if (off == HA_EMPTY) /* the mark of an unused slot is no offset */
        return NULL;
    size_t mask = t->cap - 1;
    for (size_t i = hat_hash(t, off);; i = (i + 1) & mask) {
        if (t->slot[i].off == off)
            return &t->slot[i];
        if (t->slot[i].off == HA_EMPTY)
            return NULL;
    }
}

static inline uint64_t *hat_held(const ha_table *t, const ha_blk *b)
{
    if (t->words == 1)
        return (uint64_t *)&b->held;
    return &t->xheld[(size_t)(b - t->slot) * t->words];
}

/* Inserts a record held by all `ranks`; the caller made room. */
/* The first empty slot at or after i (cyclically), from occ alone. */
static inline size_t hat_empty_from(const ha_table *t, size_t i)
{
    size_t nw = t->cap / 64;
    for (size_t w = i / 64;; w = (w + 1) & (nw - 1), i = w * 64) {
        uint64_t e = ~t->occ[w] & (UINT64_MAX << (i % 64));
        if (e)
            return w * 64 + (size_t)__builtin_ctzll(e);
    }
}

static inline ha_blk *hat_insert(ha_table *t, uint64_t off, uint64_t size, uint32_t ranks)
{
    size_t i = hat_empty_from(t, hat_hash(t, off));
    t->occ[i / 64] |= UINT64_C(1) << (i % 64);
    ha_blk *b = &t->slot[i];
    /* the record in one 32-byte store (the line may not be here yet) */
    uint64_t all = ranks >= 64 ? UINT64_MAX : (UINT64_C(1) << ranks) - 1;
    *b = (ha_blk){.off = off, .size = size, .held = t->words == 1 ? all : 0, .klog = (uint8_t)log2u(size)};
    if (t->words > 1) {
        uint64_t *h = hat_held(t, b);
        for (size_t w = 0; w < t->words; w++) {
            uint32_t left = ranks > w * 64 ? ranks - (uint32_t)(w * 64) : 0;
            h[w] = left >= 64 ? UINT64_MAX : (left ? (UINT64_C(1) << left) - 1 : 0);
        }
    }
    t->count++;
    return b;
}

/* ---- offset vectors (alloc_table.c) ------------------------------------ */

typedef struct ha_vec {
    uint64_t *v;
    size_t n, cap;
} ha_vec;

int hat_vec_reserve(ha_vec *v, size_t extra);
/* Sorts n offsets, each a multiple of 2^kmin below 2^bits (radix sort). */
void hat_sort_offsets(uint64_t *v, size_t n, uint32_t kmin, uint32_t bits);

/* A free extent (coalesce); size 0: none. */
typedef struct hac_fx {
    uint64_t off, size; /* size 0: none */
} hac_fx;

/* ---- policies ------------------------------------------------------------
 *
 * A policy is a row of common/policy.h and its table, ha_<name>_ops, in its
 * own file; the core reaches it only through h->ops (ha_create takes it from
 * ha_policy_ops_of). ha_alloc, ha_grow, ha_collect* do the policy-free part
 * (arguments, the block table, counters, the collect flags) and call:
 *   class_size  the size class of size bytes (min_block <= size <= 2^63)
 *   meta_bytes  ha_meta_bytes: the policy's bookkeeping for `mapped` bytes
 *   create      a fresh heap's free space: [0, h->mapped) (NULL: nothing)
 *   destroy     frees what the policy allocated (NULL: nothing)
 *   alloc       ha_alloc (h, res not NULL): ha_alloc_with(h, size, res,
 *               class size, step), the policy's step being one step of an
 *               allocation of class c (k = log2(c), the table has room for
 *               one record): HA_OK with *off (the bytes taken from the free
 *               space), or the answer to return (HA_NEED_*, HA_EVA; through
 *               ha_ask_collect for a collect). Static dispatch: the hot path
 *               makes one indirect call, ha_alloc's.
 *   grow        the extent becomes nm bytes (sets h->mapped; [old, nm) free);
 *               HA_ENOMEM leaves the heap unchanged
 *   shrink      the extent becomes nm bytes, nm >= top (sets h->mapped;
 *               [nm, old) was free and is no longer); cannot fail
 *   punch       issue 30's holes (NULL: the policy trims only the top):
 *               every free region that does not end the extent gives up
 *               the chunks wholly inside it (they leave the free space, and
 *               punch calls ha_hole(h, i, fn, data) for each chunk index i,
 *               ascending); the bytes; cannot fail (ha_trim sized h->holes)
 *   punchable   the bytes punch would take now, counted at least up to
 *               `enough` (it may stop there); changes nothing (NULL with
 *               punch)
 *   fill        chunk [off, off + chunk_size), a hole, becomes free (merged
 *               with its free neighbours); cannot fail
 *   reserve     room for reclaiming offs[0..n) (pending records) so that
 *               reclaim cannot fail (NULL: none needed)
 *   reclaim     returns the blocks of offs[0..n) (sorted ascending, pending
 *               records, already out of the pending vector) to the free
 *               space, erases their records; the bytes reclaimed
 *   top         ha_stats.top: the highest byte in use or pending + 1
 *   validate    the policy's invariants (alloc_int.h), and hands each free
 *               region to add (which tiles them with the blocks)
 *   every_collect_answers  a collect the caller ran on its own answers an
 *               HA_NEED_COLLECT to come (coalesce) or not (seed) */
typedef int (*ha_region_fn)(void *data, uint64_t off, uint64_t size);
typedef struct ha_policy_ops {
    uint64_t (*class_size)(const ha_params *p, uint64_t size);
    uint64_t (*meta_bytes)(const ha_params *p, uint64_t mapped);
    int (*create)(ha_heap *h);
    void (*destroy)(ha_heap *h);
    int (*alloc)(ha_heap *h, uint64_t size, ha_alloc_result *res);
    int (*grow)(ha_heap *h, uint64_t nm);
    void (*shrink)(ha_heap *h, uint64_t nm);
    uint64_t (*punch)(ha_heap *h, ha_chunk_fn fn, void *data);
    uint64_t (*punchable)(const ha_heap *h, uint64_t enough);
    void (*fill)(ha_heap *h, uint64_t off);
    int (*reserve)(ha_heap *h, const uint64_t *offs, size_t n);
    uint64_t (*reclaim)(ha_heap *h, const uint64_t *offs, size_t n);
    uint64_t (*top)(const ha_heap *h);
    int (*validate)(const ha_heap *h, ha_region_fn add, void *data, char *err, size_t errlen);
    bool every_collect_answers;
} ha_policy_ops;

/* One table per row of common/policy.h. */
#define HA_OPS_X(U, l, w) extern const ha_policy_ops ha_##l##_ops;
HPO_POLICIES(HA_OPS_X)
#undef HA_OPS_X

/* The table of policy p, NULL if p is none. */
const ha_policy_ops *ha_policy_ops_of(ha_policy p);

/* Prefetching pays where the table outgrows the caches (4 MiB of slots,
 * 2^17 of them: about 6.5 * 10^4 blocks and more); below, it is only
 * instructions (issue 19). */
#define HA_PREFETCH_CAP ((size_t)1 << 17)
/* Collects walk their offsets in order: each step asks for the lines a
 * later step will touch (its record's home slot; coalesce: the free
 * bitmaps' words around it; reclaim 2 * HA_PREFETCH steps ahead and,
 * coalesce, its size bin's bitmap word HA_PREFETCH ahead), so that their
 * misses overlap. */
#define HA_PREFETCH 8

/* ---- the heap -----------------------------------------------------------
 *
 * Invariants (checked by ha_validate):
 *   H        = the holes (issue 30): chunk indices i with bit i of h->holes
 *              set; nholes = |H|
 *   B, F and the holes' chunks tile [0, E) exactly: disjoint, and their
 *   sizes sum to E (a hole is in no block and no free region).
 *   every i in H: (i + 1) * chunk_size <= E, and i + 1 < E / chunk_size
 *   unless E == chunk_size (a hole never ends the extent: ha_trim drops
 *   it); no bit of h->holes at or beyond E / chunk_size is set; seed: H
 *   is empty.
 *   live_bytes    = sum of size(b) for b in B with b.nrel < R
 *   pending_bytes = sum of size(b) for b in B with b.nrel == R
 *   free_bytes    = sum of sizes in F  (= E - live_bytes - pending_bytes)
 *   E - nholes * chunk_size = p.initial_size + grown_bytes - trimmed_bytes
 *                   (grown_bytes: what ha_grow backed, holes refilled and
 *                   extent added; trimmed_bytes: what ha_trim took off,
 *                   the top and holes, issue 30; both multiples of
 *                   chunk_size); E >= chunk_size
 *   held bytes of rank r (sum of size(b) for b in B that r holds)
 *                 = live_bytes + pending_bytes - rel_bytes[r]
 *                   (not stored: an allocation touches no per-rank counter)
 *   rel_bytes[r]  = sum of size(b) for b in B that rank r released
 *   coalesce: no two free extents are adjacent (free neighbours are always
 *             merged: every free extent is maximal), but for an extent bound
 *             between them (p.extent_bound), which no free extent spans;
 *             fstart has bit u <=> a free extent starts at u * min_block;
 *             fend has bit u   <=> a free extent ends at (u + 1) * min_block;
 *             freebits[k] has bit i <=> a free extent f with
 *             floor(log2(size(f))) == k starts in [i*2^k, (i+1)*2^k)
 *             (at most one can: such extents are >= 2^k long and disjoint);
 *             nbin[k] = |{f in F : floor(log2(size(f))) == k}|, nfree = |F|.
             nbin[k] > 0 => bin_lo[k] = lowest bit of freebits[k] (bin_hi[k]:
             highest: always known, found when the old one goes);
             bin_lo_fx[k].size != 0 => nbin[k] > 0 and bin_lo_fx[k] = the f
             in F of bin k with floor(f.off / 2^k) == bin_lo[k] (bin_hi_fx
             alike).
             nbin[k] > 0 => lo_key[k] = bin_lo_fx[k].off if its size != 0,
             else bin_lo[k] * 2^k (a lower bound of that start);
             hi_key[k] = end of bin_hi_fx[k] if its size != 0, else
             (bin_hi[k] + 3) * 2^k (an upper bound of that end).
 *   seed:     bump % min_block == 0, bump <= E, every block and every LIFO
 *             entry lies below bump, lifo[k] holds free blocks of class k.
 *   collect_asked    == ha_alloc answered HA_NEED_COLLECT and no collect ran since;
 *   collect_answered == seed: a collect ran after that answer; coalesce: a
 *                       collect ran (asked for or not: explicit and forced
 *                       ones count too); and no allocation has succeeded or
 *                       failed with HA_EVA since (coalesce, one_decider: and
 *                       no block became pending since: issue 27).
 *   asked_answered   == the seed's rule would not ask for a collect now: one
 *                       ran after an HA_NEED_COLLECT answer (or coalesce
 *                       skipped one it would have asked for, counted in
 *                       collects_skipped at the growth), and no allocation has succeeded
 *                       or failed with HA_EVA since. Only counts; decides
 *                       nothing under coalesce.
 *   (Both depend only on the allocation sequence and collects, never on
 *   which rank released what when, so every node decides alike; except
 *   under one_decider, where one core decides for every rank.)
 *   reclaim = eager: pending is empty after every call (unless the policy
 *   could not make room: HA_ENOMEM at a reclaim), and eager_reclaims counts
 *   the blocks reclaimed at their last release; under reclaim = collect it
 *   counts those ha_reclaim_apply reclaimed (a heap across nodes: issue 27's
 *   agreed horizons).
 */
struct ha_heap {
    ha_params p;
    uint32_t kmin, kmax; /* sizes 2^kmin .. 2^kmax */
    uint64_t mapped;
    ha_table tab;
    ha_vec pending; /* offsets every rank released, unsorted */
    /* coalesce */
    hab_bits fstart, fend; /* free extent first / last min_block */
    hab_bits freebits[64]; /* free extent starts by size bin */
    uint64_t nbin[64], nfree;
    uint64_t binmask;                    /* bit k <=> nbin[k] > 0 */
    uint64_t bin_lo[64], bin_hi[64];     /* nbin[k] > 0: lowest / highest bit of
                                          * freebits[k] */
    hac_fx bin_lo_fx[64], bin_hi_fx[64]; /* size != 0: the free extent of bin k
                                          * that starts in window bin_lo[k] / bin_hi[k]
                                          * (resolved once; size 0: not yet) */
    uint64_t lo_key[64], hi_key[64];     /* nbin[k] > 0: what co_find compares (the
                                          * invariants above) */
    uint64_t cls_alloc[64];              /* allocations of size bin k (decayed) */
    uint64_t cls_reclaim[64];            /* reclaims of size bin k (decayed alike) */
    uint64_t used_at_collect;            /* mapped - free_bytes after the last collect */
    /* seed */
    ha_vec lifo[64];
    uint64_t bump;
    /* counters */
    uint64_t live_bytes, pending_bytes, free_bytes;
    uint64_t allocs, frees, collects, growths, handed_since_collect;
    bool collect_asked, collect_answered, asked_answered;
    bool skip_pending;         /* the last HA_NEED_GROW skipped a collect the seed's rule asks for */
    uint64_t collects_skipped; /* coalesce: collects the seed's rule would have asked for */
    uint64_t eager_reclaims;   /* blocks reclaimed at their last release, or by ha_reclaim_apply */
    uint64_t grown_bytes;      /* issue 30: what ha_grow added to the extent, in all */
    uint64_t trims;            /* ha_trim calls that took chunks off */
    uint64_t trims_asked;      /* HA_NEED_TRIM answers (trim_threshold) */
    uint64_t trimmed_bytes;    /* what they took off (the top and holes), in all */
    hab_bits bounds;           /* issue 32 (p.extent_bound): bit i <=> an extent starts
                                * at chunk i (no free extent spans i * chunk_size) */
    hab_bits holes;            /* issue 30: bit i <=> chunk i is a hole */
    uint64_t nholes;
    /* Issue 30's automatic trim: an allocation is under way (the last
     * ha_alloc answered HA_NEED_*): its later steps never ask for a trim,
     * which would give back what a growth just added for it. */
    bool alloc_open;
    uint64_t *rel_bytes;      /* per rank */
    const ha_policy_ops *ops; /* == ha_policy_ops_of(p.policy) */
    void *priv;               /* a policy's own state beyond the fields above
                               * (its create allocates it, its destroy frees it) */
};

/* ---- extent bounds (alloc_extent.c, issue 32: p.extent_bound) ----------- */

/* The bounds of the initial extent ([0, initial_size)). */
int hae_create(ha_heap *h);
/* A growth's bounds, before its chunks join the free space: each of the
 * `refill` lowest holes and [from, to) added at the top (chunk indices).
 * HA_ENOMEM leaves marks of chunks not yet added (they only keep free space
 * apart once added). */
int hae_grow(ha_heap *h, uint64_t refill, uint64_t from, uint64_t to);
/* 1 when no free extent may span offset off (an extent's first byte). */
static inline bool hae_at(const ha_heap *h, uint64_t off)
{
    return h->p.extent_bound && off % h->p.chunk_size == 0 && hab_test(&h->bounds, off / h->p.chunk_size);
}

/* Chunk i becomes a hole (a policy's punch: out of the free space already):
 * its bit, the count, and fn(data, i) if fn. */
static inline void ha_hole(ha_heap *h, uint64_t i, ha_chunk_fn fn, void *data)
{
    hab_set(&h->holes, i);
    h->nholes++;
    if (fn)
        fn(data, (uint32_t)i);
}

/* Debug builds (HEAPD_DEBUG): aborts, naming where, if ha_validate fails. */
#ifdef HEAPD_DEBUG
void ha_debug_check(const ha_heap *h, const char *where);
#define HA_DEBUG_CHECK(h, where) ha_debug_check((h), (where))
#else
#define HA_DEBUG_CHECK(h, where) ((void)0)
#endif

/* The body of every policy's alloc (ha_alloc, alloc.h): class and step
 * are the policy's own functions, inlined here. */
typedef uint64_t (*ha_class_fn)(const ha_params *p, uint64_t size);
typedef int (*ha_step_fn)(ha_heap *h, uint64_t c, uint32_t k, ha_alloc_result *res, uint64_t *off);
static inline __attribute__((always_inline)) int ha_alloc_with(ha_heap *h, uint64_t size, ha_alloc_result *res,
                                                               ha_class_fn cls, ha_step_fn step)
{
    memset(res, 0, sizeof *res);
    if (size == 0)
        return HA_EINVAL;
    if (size > (UINT64_C(1) << 63))
        return HA_EVA;
    uint64_t c = cls(&h->p, size < h->p.min_block ? h->p.min_block : size);
    if (c > h->p.va_size)
        return HA_EVA;
    uint32_t k = log2u(c);
    if (hat_reserve(&h->tab, 1))
        return HA_ENOMEM;
    uint64_t off = 0;
    int rc = step(h, c, k, res, &off);
    if (rc != HA_OK)
        return rc;
    hat_insert(&h->tab, off, c, h->p.ranks);
    h->live_bytes += c;
    h->free_bytes -= c;
    h->allocs++;
    h->handed_since_collect += c;
    h->collect_answered = h->asked_answered = h->skip_pending = false;
    res->offset = off;
    res->block_size = c;
    HA_DEBUG_CHECK(h, "ha_alloc");
    return HA_OK;
}

/* The answer HA_NEED_COLLECT (a policy's alloc step asks for a collect). */
static inline int ha_ask_collect(ha_heap *h, ha_alloc_result *res, uint8_t reason)
{
    h->collect_asked = true;
    res->collect_reason = reason;
    return HA_NEED_COLLECT;
}

/* ---- the coalesce policy (alloc_coalesce.c) --------------------------------
 *
 * Free extents live in bitmaps only (see alloc_coalesce.c). */

/* Compaction collects (see ha_alloc): a bottom-up block that would end more
 * than mapped / CO_HIGH_DIV above what the last collect left in use, or a
 * block of at least mapped / CO_LARGE_DIV, once as many bytes were handed
 * out since the last collect. */
#define CO_HIGH_DIV  2
#define CO_LARGE_DIV 8

int hac_resize(ha_heap *h, uint64_t mapped);
/* Adds the free extent [start, start + len); no merging. */
void hac_add(ha_heap *h, uint64_t start, uint64_t len);
void hac_del(ha_heap *h, hac_fx f);
/* The free extent f becomes g (the same extent, grown or shrunk), in place. */
void hac_move(ha_heap *h, hac_fx f, hac_fx g);
/* Frees [start, start + len), merging with free neighbours. */
void hac_insert_merge(ha_heap *h, uint64_t start, uint64_t len);
/* Is a block of c bytes (size bin k) placed from the top of the heap down? */
bool hac_top_down(const ha_heap *h, uint32_t k, uint64_t c);
/* Room for s bytes (first fit, see alloc_coalesce.c); size 0 if none. */
hac_fx hac_find(ha_heap *h, uint64_t s, bool down);
/* Takes s bytes from the free extent best (hac_find's answer). */
uint64_t hac_carve(ha_heap *h, hac_fx best, uint64_t s, bool down);
/* Start of the free extent that ends at the extent (the extent itself if
 * the last region is a block). */
uint64_t hac_top_free_run(const ha_heap *h);

#endif
