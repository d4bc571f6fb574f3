/* alloc.c - the symmetric allocator core (see alloc.h for the contract).
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
#include "alloc.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HA_EMPTY UINT64_MAX
#define HA_MAX_VA (UINT64_C(1) << 56)
#define HA_DECAY_AT (UINT64_C(1) << 20)

/* ---- small helpers ----------------------------------------------------- */

static inline bool is_pow2(uint64_t x) { return x && !(x & (x - 1)); }
static inline uint32_t log2u(uint64_t x) { return 63u - (uint32_t)__builtin_clzll(x); }
static inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

static void set_err(char *err, size_t errlen, const char *fmt, const char *what, unsigned long long v)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, what, v);
}

/* ---- hierarchical bitmap ------------------------------------------------
 *
 * A set of positions 0..nbits-1 with O(levels) insert, erase, first, last.
 *
 * Invariants:
 *   level 0: bit i of w[0]          <=> position i is in the set
 *   level l+1: bit j of w[l+1]      <=> w[l][j] != 0
 *   nw[l+1] = ceil(nw[l] / 64), nw[top] == 1 (top = nlevels - 1)
 *   no bit at or beyond nbits is set
 */
#define HB_MAXLV 8
typedef struct hbits {
    uint64_t nbits;
    uint32_t nlevels;
    size_t nw[HB_MAXLV];
    uint64_t *w[HB_MAXLV];
} hbits;

static void hb_free(hbits *b)
{
    for (uint32_t l = 0; l < HB_MAXLV; l++)
        free(b->w[l]);
    memset(b, 0, sizeof *b);
}

/* Resizes to nbits (only grows), keeping level 0, rebuilding the rest. */
static int hb_resize(hbits *b, uint64_t nbits)
{
    if (nbits <= b->nbits && b->nlevels)
        return 0;
    size_t nw[HB_MAXLV] = {0};
    uint32_t nl = 0;
    size_t n = (size_t)((nbits + 63) / 64);
    if (n == 0)
        n = 1;
    for (;;) {
        nw[nl++] = n;
        if (n == 1 || nl == HB_MAXLV)
            break;
        n = (n + 63) / 64;
    }
    uint64_t *nwp[HB_MAXLV] = {0};
    for (uint32_t l = 0; l < nl; l++) {
        nwp[l] = calloc(nw[l], sizeof(uint64_t));
        if (!nwp[l]) {
            for (uint32_t m = 0; m < l; m++)
                free(nwp[m]);
            return HA_ENOMEM;
        }
    }
    if (b->nlevels)
        memcpy(nwp[0], b->w[0], b->nw[0] * sizeof(uint64_t));
    for (uint32_t l = 1; l < nl; l++)
        for (size_t j = 0; j < nw[l - 1]; j++)
            if (nwp[l - 1][j])
                nwp[l][j / 64] |= UINT64_C(1) << (j % 64);
    hb_free(b);
    b->nbits = nbits;
    b->nlevels = nl;
    for (uint32_t l = 0; l < nl; l++) {
        b->nw[l] = nw[l];
        b->w[l] = nwp[l];
    }
    return 0;
}

static inline bool hb_test(const hbits *b, uint64_t i)
{
    return i < b->nbits && (b->w[0][i / 64] >> (i % 64)) & 1;
}

static void hb_set(hbits *b, uint64_t i)
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

static void hb_clear(hbits *b, uint64_t i)
{
    for (uint32_t l = 0; l < b->nlevels; l++) {
        uint64_t *w = &b->w[l][i / 64];
        *w &= ~(UINT64_C(1) << (i % 64));
        if (*w)
            break;
        i /= 64;
    }
}

/* Lowest / highest set position, or HA_EMPTY. */
static uint64_t hb_first(const hbits *b)
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

static uint64_t hb_last(const hbits *b)
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
static uint64_t hb_next(const hbits *b, uint64_t i)
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

static uint64_t hb_prev(const hbits *b, uint64_t i)
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

/* ---- region table -------------------------------------------------------
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
 *   count == number of records, count <= cap * 3/4, cap a power of two
 */
typedef struct ha_blk {
    uint64_t off;      /* HA_EMPTY: slot unused */
    uint64_t size;     /* bytes */
    uint64_t held;     /* ranks <= 64: bit r <=> rank r holds the block */
    uint32_t nrel;     /* ranks that released this block */
    uint8_t klog;
    uint8_t pending;
    uint8_t mark;      /* scratch for collect_apply */
    uint8_t pad;
} ha_blk;

typedef struct ha_table {
    ha_blk *slot;
    uint64_t *xheld;   /* words > 1 only: cap * words holder bits */
    size_t cap, count, words;
    uint32_t shift;    /* 64 - log2(cap) */
    uint32_t kmin;
} ha_table;

static inline size_t tb_hash(const ha_table *t, uint64_t off)
{
    return (size_t)(((off >> t->kmin) * UINT64_C(0x9E3779B97F4A7C15)) >> t->shift);
}

static int tb_init(ha_table *t, size_t cap, size_t words, uint32_t kmin)
{
    t->slot = malloc(cap * sizeof *t->slot);
    t->xheld = words > 1 ? calloc(cap * words, sizeof(uint64_t)) : NULL;
    if (!t->slot || (words > 1 && !t->xheld)) {
        free(t->slot);
        free(t->xheld);
        return HA_ENOMEM;
    }
    for (size_t i = 0; i < cap; i++)
        t->slot[i].off = HA_EMPTY;
    t->cap = cap;
    t->count = 0;
    t->words = words;
    t->kmin = kmin;
    t->shift = 64u - log2u(cap);
    return 0;
}

static void tb_free(ha_table *t)
{
    free(t->slot);
    free(t->xheld);
    memset(t, 0, sizeof *t);
}

static inline ha_blk *tb_find(const ha_table *t, uint64_t off)
{
    if (off == HA_EMPTY) /* the mark of an unused slot is no offset */
        return NULL;
    size_t mask = t->cap - 1;
    for (size_t i = tb_hash(t, off);; i = (i + 1) & mask) {
        if (t->slot[i].off == off)
            return &t->slot[i];
        if (t->slot[i].off == HA_EMPTY)
            return NULL;
    }
}

static inline uint64_t *tb_held(const ha_table *t, const ha_blk *b)
{
    if (t->words == 1)
        return (uint64_t *)&b->held;
    return &t->xheld[(size_t)(b - t->slot) * t->words];
}

static inline void tb_move(ha_table *t, size_t to, const ha_table *from, size_t i)
{
    t->slot[to] = from->slot[i];
    if (t->words > 1)
        memcpy(&t->xheld[to * t->words], &from->xheld[i * from->words], t->words * sizeof(uint64_t));
}

static int tb_grow(ha_table *t)
{
    ha_table n;
    int rc = tb_init(&n, t->cap * 2, t->words, t->kmin);
    if (rc)
        return rc;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slot[i].off == HA_EMPTY)
            continue;
        size_t j = tb_hash(&n, t->slot[i].off);
        while (n.slot[j].off != HA_EMPTY)
            j = (j + 1) & (n.cap - 1);
        tb_move(&n, j, t, i);
    }
    n.count = t->count;
    tb_free(t);
    *t = n;
    return 0;
}

/* Makes room for `extra` more records (so that tb_insert cannot fail). */
static int tb_reserve(ha_table *t, size_t extra)
{
    while ((t->count + extra) * 4 > t->cap * 3)
        if (tb_grow(t))
            return HA_ENOMEM;
    return 0;
}

/* Inserts a record held by all `ranks`; the caller made room. */
static ha_blk *tb_insert(ha_table *t, uint64_t off, uint64_t size, uint32_t ranks)
{
    size_t mask = t->cap - 1, i = tb_hash(t, off);
    while (t->slot[i].off != HA_EMPTY)
        i = (i + 1) & mask;
    ha_blk *b = &t->slot[i];
    b->off = off;
    b->size = size;
    b->held = 0;
    b->nrel = 0;
    b->klog = (uint8_t)log2u(size);
    b->pending = 0;
    b->mark = 0;
    b->pad = 0;
    uint64_t *h = tb_held(t, b);
    for (size_t w = 0; w < t->words; w++) {
        uint32_t left = ranks > w * 64 ? ranks - (uint32_t)(w * 64) : 0;
        h[w] = left >= 64 ? UINT64_MAX : (left ? (UINT64_C(1) << left) - 1 : 0);
    }
    t->count++;
    return b;
}

static void tb_erase(ha_table *t, ha_blk *b)
{
    size_t mask = t->cap - 1;
    size_t i = (size_t)(b - t->slot);
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (t->slot[j].off == HA_EMPTY)
            break;
        size_t home = tb_hash(t, t->slot[j].off);
        /* Move j back to i if its home is not in the cyclic range (i, j]. */
        bool in_range = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!in_range) {
            tb_move(t, i, t, j);
            i = j;
        }
    }
    t->slot[i].off = HA_EMPTY;
    t->count--;
}

/* ---- offset vectors ---------------------------------------------------- */

typedef struct ha_vec {
    uint64_t *v;
    size_t n, cap;
} ha_vec;

static int vec_reserve(ha_vec *v, size_t extra)
{
    if (v->n + extra <= v->cap)
        return 0;
    size_t nc = v->cap ? v->cap : 16;
    while (nc < v->n + extra)
        nc *= 2;
    uint64_t *nv = realloc(v->v, nc * sizeof *nv);
    if (!nv)
        return HA_ENOMEM;
    v->v = nv;
    v->cap = nc;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts n offsets, each a multiple of 2^kmin below 2^bits: LSD radix sort
 * on the significant bits, 11 at a time (qsort if no scratch memory). */
static void sort_offsets(uint64_t *v, size_t n, uint32_t kmin, uint32_t bits)
{
    if (n < 64) {
        for (size_t i = 1; i < n; i++) {
            uint64_t x = v[i];
            size_t j = i;
            for (; j > 0 && v[j - 1] > x; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
        return;
    }
    uint64_t *tmp = malloc(n * sizeof *tmp);
    if (!tmp) {
        qsort(v, n, sizeof *v, cmp_u64);
        return;
    }
    uint64_t *src = v, *dst = tmp;
    for (uint32_t sh = kmin; sh < bits; sh += 11) {
        size_t cnt[2048] = {0};
        for (size_t i = 0; i < n; i++)
            cnt[(src[i] >> sh) & 2047]++;
        size_t at = 0;
        for (size_t d = 0; d < 2048; d++) {
            size_t c = cnt[d];
            cnt[d] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++)
            dst[cnt[(src[i] >> sh) & 2047]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != v)
        memcpy(v, src, n * sizeof *v);
    free(tmp);
}

/* ---- the heap -----------------------------------------------------------
 *
 * Invariants (checked by ha_validate):
 *   B and F tile [0, E) exactly: disjoint, and their sizes sum to E.
 *   live_bytes    = sum of size(b) for b in B with b.nrel < R
 *   pending_bytes = sum of size(b) for b in B with b.nrel == R
 *   free_bytes    = sum of sizes in F  (= E - live_bytes - pending_bytes)
 *   held_bytes[r] = sum of size(b) for b in B that rank r holds
 *   rel_bytes[r]  = sum of size(b) for b in B that rank r released
 *   coalesce: no two free extents are adjacent (free neighbours are always
 *             merged: every free extent is maximal);
 *             fstart has bit u <=> a free extent starts at u * min_block;
 *             fend has bit u   <=> a free extent ends at (u + 1) * min_block;
 *             freebits[k] has bit i <=> a free extent f with
 *             floor(log2(size(f))) == k starts in [i*2^k, (i+1)*2^k)
 *             (at most one can: such extents are >= 2^k long and disjoint);
 *             nbin[k] = |{f in F : floor(log2(size(f))) == k}|, nfree = |F|.
 *   seed:     bump % min_block == 0, bump <= E, every block and every LIFO
 *             entry lies below bump, lifo[k] holds free blocks of class k.
 *   collect_asked    == ha_alloc answered HA_NEED_COLLECT and no collect ran since;
 *   collect_answered == seed: a collect ran after that answer; coalesce: a
 *                       collect ran (asked for or not: explicit and forced
 *                       ones count too); and no allocation has succeeded or
 *                       failed with HA_EVA since.
 *   asked_answered   == the seed's rule would not ask for a collect now: one
 *                       ran after an HA_NEED_COLLECT answer (or coalesce
 *                       skipped one it would have asked for, counted in
 *                       collects_skipped at the growth), and no allocation has succeeded
 *                       or failed with HA_EVA since. Only counts; decides
 *                       nothing under coalesce.
 *   (Both depend only on the allocation sequence and collects, never on
 *   which rank released what when, so every node decides alike.)
 */
struct ha_heap {
    ha_params p;
    uint32_t kmin, kmax;       /* sizes 2^kmin .. 2^kmax */
    uint64_t mapped;
    ha_table tab;
    ha_vec pending;            /* offsets every rank released, unsorted */
    /* coalesce */
    hbits fstart, fend;        /* free extent first / last min_block */
    hbits freebits[64];        /* free extent starts by size bin */
    uint64_t nbin[64], nfree;
    uint64_t binmask;          /* bit k <=> nbin[k] > 0 */
    uint64_t bin_lo[64], bin_hi[64]; /* nbin[k] > 0: lowest / highest bit of
                                      * freebits[k], or HA_EMPTY (not known) */
    uint64_t cls_alloc[64];    /* allocations of size bin k (decayed) */
    uint64_t cls_reclaim[64];  /* reclaims of size bin k (decayed alike) */
    uint64_t cls_seen[64];     /* cls_alloc[k] at the last collect (decayed alike) */
    uint64_t used_at_collect;  /* mapped - free_bytes after the last collect */
    /* seed */
    ha_vec lifo[64];
    uint64_t bump;
    /* counters */
    uint64_t live_bytes, pending_bytes, free_bytes;
    uint64_t allocs, frees, collects, growths, handed_since_collect;
    bool collect_asked, collect_answered, asked_answered;
    bool skip_pending;         /* the last HA_NEED_GROW skipped a collect the seed's rule asks for */
    uint64_t collects_skipped; /* coalesce: collects the seed's rule would have asked for */
    uint64_t *held_bytes, *rel_bytes; /* per rank */
};

#ifdef HEAPD_DEBUG
static void debug_check(const ha_heap *h, const char *where)
{
    char err[256];
    if (ha_validate(h, err, sizeof err) != HA_OK) {
        fprintf(stderr, "heapd: allocator invariant broken after %s: %s\n", where, err);
        abort();
    }
}
#define HA_DEBUG_CHECK(h, where) debug_check((h), (where))
#else
#define HA_DEBUG_CHECK(h, where) ((void)0)
#endif

const char *ha_strerror(int code)
{
    switch (code) {
    case HA_OK: return "success";
    case HA_NEED_COLLECT: return "a collect is needed before this allocation";
    case HA_NEED_GROW: return "the heap must grow before this allocation";
    case HA_EINVAL: return "invalid argument";
    case HA_ENOMEM: return "out of memory for allocator bookkeeping";
    case HA_EVA: return "the allocation does not fit in the heap's va_size";
    case HA_ENOTHELD: return "no block held by this rank starts at this offset";
    case HA_ESTATE: return "call not valid in the heap's current state";
    default: return "unknown allocator error";
    }
}

const char *ha_policy_name(ha_policy p)
{
    return p == HA_POLICY_SEED ? "seed" : p == HA_POLICY_COALESCE ? "coalesce" : "unknown";
}

int ha_policy_parse(const char *s, ha_policy *out)
{
    if (!s || !out)
        return HA_EINVAL;
    if (!strcmp(s, "seed"))
        *out = HA_POLICY_SEED;
    else if (!strcmp(s, "coalesce") || !strcmp(s, "default"))
        *out = HA_POLICY_COALESCE;
    else
        return HA_EINVAL;
    return HA_OK;
}

int ha_params_check(const ha_params *p, char *err, size_t errlen)
{
    if (!p) {
        set_err(err, errlen, "%s%llu", "no parameters given", 0);
        return HA_EINVAL;
    }
#define BAD(fmt, what, v) do { set_err(err, errlen, fmt, what, (unsigned long long)(v)); return HA_EINVAL; } while (0)
    if (p->ranks < 1 || p->ranks > HA_MAX_RANKS)
        BAD("%s must be between 1 and 4096, got %llu", "ranks", p->ranks);
    if (!is_pow2(p->min_block))
        BAD("%s must be a power of two, got %llu", "min_block", p->min_block);
    if (p->chunk_size == 0 || p->chunk_size % p->min_block)
        BAD("%s must be a non-zero multiple of min_block, got %llu", "chunk_size", p->chunk_size);
    if (p->initial_size < p->chunk_size || p->initial_size % p->chunk_size)
        BAD("%s must be a whole number (>= 1) of chunks, got %llu", "initial_size", p->initial_size);
    if (p->va_size < p->initial_size || p->va_size % p->chunk_size)
        BAD("%s must be a whole number of chunks and >= initial_size, got %llu", "va_size", p->va_size);
    if (p->va_size > HA_MAX_VA)
        BAD("%s must be at most 2^56 bytes, got %llu", "va_size", p->va_size);
    if (p->policy != HA_POLICY_COALESCE && p->policy != HA_POLICY_SEED)
        BAD("%s must be seed or coalesce, got %llu", "policy", (unsigned)p->policy);
#undef BAD
    return HA_OK;
}

const ha_params *ha_get_params(const ha_heap *h) { return &h->p; }

uint64_t ha_meta_bytes(const ha_params *p, uint64_t mapped)
{
    if (p->policy != HA_POLICY_COALESCE || !p->min_block)
        return 0;
    /* fstart and fend: a bit per min_block each; freebits[k] for every bin
     * k >= log2(min_block): mapped >> k bits, about as many again; the
     * 64-ary summary levels add 1/63. */
    uint64_t bytes = (mapped / p->min_block) / 2;
    return bytes + bytes / 63;
}

uint64_t ha_class_size(const ha_heap *h, uint64_t size)
{
    if (size == 0 || size > (UINT64_C(1) << 63))
        return 0;
    if (size < h->p.min_block)
        size = h->p.min_block;
    if (h->p.policy == HA_POLICY_COALESCE)
        return align_up(size, h->p.min_block);
    return is_pow2(size) ? size : UINT64_C(1) << (log2u(size) + 1);
}

/* ---- coalesce free space -----------------------------------------------
 *
 * Free extents live in bitmaps only, no table records, so that merging and
 * first fit touch compact memory (a few bits per min_block): fstart has a
 * bit at each extent's first min_block, fend at its last (so an extent's
 * length is one successor query on fend), and freebits[k] indexes the
 * extents of size bin k by start >> k. A bin's bitmap gives the extent's
 * start to within 2^k; fx_at() finds it with one predecessor query on
 * fstart. */

/* Scan of the exact-size bin for a fit, when a larger bin already offers
 * one: at most this many extents, in address order. */
#define CO_SCAN 8

typedef struct fx {
    uint64_t off, size; /* size 0: none */
} fx;

static int co_resize(ha_heap *h, uint64_t mapped)
{
    if (hb_resize(&h->fstart, mapped >> h->kmin) || hb_resize(&h->fend, mapped >> h->kmin))
        return HA_ENOMEM;
    for (uint32_t k = h->kmin; k <= h->kmax; k++)
        if (hb_resize(&h->freebits[k], mapped >> k))
            return HA_ENOMEM;
    return 0;
}

/* Adds the free extent [start, start + len); no merging. */
static void fx_add(ha_heap *h, uint64_t start, uint64_t len)
{
    uint32_t k = log2u(len);
    hb_set(&h->fstart, start >> h->kmin);
    hb_set(&h->fend, (start + len - 1) >> h->kmin);
    uint64_t i = start >> k;
    hb_set(&h->freebits[k], i);
    if (h->nbin[k] == 0) {
        h->bin_lo[k] = h->bin_hi[k] = i;
    } else {
        if (h->bin_lo[k] != HA_EMPTY && i < h->bin_lo[k])
            h->bin_lo[k] = i;
        if (h->bin_hi[k] != HA_EMPTY && i > h->bin_hi[k])
            h->bin_hi[k] = i;
    }
    h->nbin[k]++;
    h->binmask |= UINT64_C(1) << k;
    h->nfree++;
}

static void fx_del(ha_heap *h, fx f)
{
    uint32_t k = log2u(f.size);
    hb_clear(&h->fstart, f.off >> h->kmin);
    hb_clear(&h->fend, (f.off + f.size - 1) >> h->kmin);
    uint64_t i = f.off >> k;
    hb_clear(&h->freebits[k], i);
    if (i == h->bin_lo[k])
        h->bin_lo[k] = HA_EMPTY;
    if (i == h->bin_hi[k])
        h->bin_hi[k] = HA_EMPTY;
    if (--h->nbin[k] == 0)
        h->binmask &= ~(UINT64_C(1) << k);
    h->nfree--;
}

/* The free extent that starts at min_block unit u (a bit of fstart). */
static inline fx fx_from(const ha_heap *h, uint64_t u)
{
    uint64_t e = hb_next(&h->fend, u);
    return (fx){u << h->kmin, (e - u + 1) << h->kmin};
}

/* The free extent of bin k that starts in window i (bit i of freebits[k]).
 * It is at least 2^k long, so it covers the last min_block of the window:
 * it is the free extent with the highest start at or below that point. */
static fx fx_at(const ha_heap *h, uint32_t k, uint64_t i)
{
    uint64_t p = ((i + 1) << k) - h->p.min_block;
    uint64_t u = hb_prev(&h->fstart, p >> h->kmin);
    return u == HA_EMPTY ? (fx){0, 0} : fx_from(h, u);
}

/* Frees [start, start + len), merging with free neighbours. */
static void fx_insert_merge(ha_heap *h, uint64_t start, uint64_t len)
{
    uint64_t end = start + len;
    if (end < h->mapped && hb_test(&h->fstart, end >> h->kmin)) {
        fx n = fx_from(h, end >> h->kmin);
        len += n.size;
        fx_del(h, n);
    }
    if (start > 0 && hb_test(&h->fend, (start >> h->kmin) - 1)) {
        fx q = fx_from(h, hb_prev(&h->fstart, (start >> h->kmin) - 1));
        start = q.off;
        len += q.size;
        fx_del(h, q);
    }
    fx_add(h, start, len);
}

/* Size bins whose blocks mostly (CO_HOT_PCT percent) die before a collect
 * go top-down; the others bottom-up. Also top-down: a bin every block of
 * which, allocated before the last collect, was reclaimed (cls_seen), so
 * that a pure scratch bin keeps sweeping from the top between two collects
 * instead of turning bottom-up as its new, not yet collectable, blocks
 * dilute the ratio (fewer compaction collects: the review's models). */
#define CO_HOT_PCT 95
/* Compaction collects (see ha_alloc): a bottom-up block that would end more
 * than mapped / CO_HIGH_DIV above what the last collect left in use, or a
 * block of at least mapped / CO_LARGE_DIV, once as many bytes were handed
 * out since the last collect. */
#define CO_HIGH_DIV 2
#define CO_LARGE_DIV 8

static bool co_top_down(const ha_heap *h, uint32_t k)
{
    return (h->cls_alloc[k] > 0 && 100 * h->cls_reclaim[k] > CO_HOT_PCT * h->cls_alloc[k]) ||
           (h->cls_seen[k] > 0 && h->cls_reclaim[k] >= h->cls_seen[k]);
}

/* Is a better than b for the direction? (b may be NULL.) */
static inline bool co_better(fx a, fx b, bool down)
{
    if (!b.size)
        return true;
    return down ? a.off + a.size > b.off + b.size : a.off < b.off;
}

/* Finds room for s bytes: address-ordered first fit over every free extent
 * at least s long, lowest start (bottom-up) or highest end (top-down). Every
 * extent in a bin above s's fits, so each such bin offers its lowest
 * (highest) one; s's own bin is scanned in address order for one >= s (at
 * most CO_SCAN extents when a larger bin already offers a fit). Returns
 * false if nothing fits. */
/* The lowest (highest, down) bit of bin k's bitmap, through the cache. */
static inline uint64_t co_bin_end(ha_heap *h, uint32_t k, bool down)
{
    uint64_t *c = down ? &h->bin_hi[k] : &h->bin_lo[k];
    if (*c == HA_EMPTY)
        *c = down ? hb_last(&h->freebits[k]) : hb_first(&h->freebits[k]);
    return *c;
}

static fx co_find(ha_heap *h, uint64_t s, bool down)
{
    uint32_t ks = log2u(s);
    fx best = {0, 0};
    /* Bins above ks: the window of each bin's lowest (highest) extent
     * bounds its start (end); only windows that can beat the best so far
     * are resolved to their record, best-bound first. */
    uint64_t lo[64], hi[64];
    uint32_t cand[64], nc = 0;
    for (uint64_t m = ks < 63 ? h->binmask & (UINT64_MAX << (ks + 1)) : 0; m; m &= m - 1) {
        uint32_t j = (uint32_t)__builtin_ctzll(m);
        uint64_t i = co_bin_end(h, j, down);
        /* bottom-up: start in [lo, hi); top-down: end in [lo, hi) */
        lo[j] = down ? (i + 1) << j : i << j;
        hi[j] = down ? ((i + 1) << j) + (UINT64_C(2) << j) : (i + 1) << j;
        cand[nc++] = j;
    }
    uint32_t pick = 0;
    for (uint32_t c = 1; c < nc; c++) {
        uint32_t j = cand[c], q = cand[pick];
        if (down ? hi[j] > hi[q] : lo[j] < lo[q])
            pick = c;
    }
    for (uint32_t c = 0; c < nc; c++) {
        uint32_t j = cand[(c + pick) % nc]; /* the best bound first */
        if (best.size && (down ? hi[j] <= best.off + best.size : lo[j] >= best.off))
            continue;
        fx b = fx_at(h, j, down ? (lo[j] >> j) - 1 : lo[j] >> j);
        if (b.size && co_better(b, best, down))
            best = b;
    }
    if (h->nbin[ks]) {
        const hbits *bb = &h->freebits[ks];
        uint64_t i = co_bin_end(h, ks, down);
        for (unsigned n = 0; i != HA_EMPTY && (!best.size || n < CO_SCAN); n++) {
            if (best.size && (down ? ((i + 1) << ks) + (UINT64_C(2) << ks) <= best.off + best.size
                                   : i << ks >= best.off))
                break;
            fx b = fx_at(h, ks, i);
            if (!b.size || (best.size && !co_better(b, best, down)))
                break;
            if (b.size >= s) {
                best = b;
                break;
            }
            if (down)
                i = i ? hb_prev(bb, i - 1) : HA_EMPTY;
            else
                i = hb_next(bb, i + 1);
        }
    }
    return best;
}

/* Takes s bytes from the free extent best (co_find's answer). */
static uint64_t co_carve(ha_heap *h, fx best, uint64_t s, bool down)
{
    uint64_t st = best.off, len = best.size, off;
    fx_del(h, best);
    if (down) {
        off = st + len - s;
        if (len > s)
            fx_add(h, st, len - s);
    } else {
        off = st;
        if (len > s)
            fx_add(h, st + s, len - s);
    }
    return off;
}

/* Start of the free extent that ends at the extent (the extent itself if
 * the last region is a block). */
static uint64_t co_top_free_run(const ha_heap *h)
{
    uint64_t last = (h->mapped >> h->kmin) - 1;
    if (h->mapped == 0 || !hb_test(&h->fend, last))
        return h->mapped;
    return hb_prev(&h->fstart, last) << h->kmin;
}

/* ---- lifetime ------------------------------------------------------------ */

int ha_create(const ha_params *p, ha_heap **out, char *err, size_t errlen)
{
    if (!out)
        return HA_EINVAL;
    *out = NULL;
    int rc = ha_params_check(p, err, errlen);
    if (rc)
        return rc;
    ha_heap *h = calloc(1, sizeof *h);
    if (!h)
        goto nomem;
    h->p = *p;
    h->kmin = log2u(p->min_block);
    h->kmax = log2u(p->va_size);
    h->held_bytes = calloc(p->ranks, sizeof(uint64_t));
    h->rel_bytes = calloc(p->ranks, sizeof(uint64_t));
    if (!h->held_bytes || !h->rel_bytes)
        goto nomem;
    if (tb_init(&h->tab, 64, (p->ranks + 63) / 64, h->kmin))
        goto nomem;
    h->mapped = p->initial_size;
    h->free_bytes = p->initial_size;
    if (p->policy == HA_POLICY_COALESCE) {
        if (co_resize(h, h->mapped))
            goto nomem;
        fx_add(h, 0, h->mapped);
    }
    *out = h;
    HA_DEBUG_CHECK(h, "ha_create");
    return HA_OK;
nomem:
    ha_destroy(h);
    set_err(err, errlen, "%s%llu", "out of memory creating the allocator", 0);
    return HA_ENOMEM;
}

void ha_destroy(ha_heap *h)
{
    if (!h)
        return;
    tb_free(&h->tab);
    free(h->pending.v);
    hb_free(&h->fstart);
    hb_free(&h->fend);
    for (int k = 0; k < 64; k++) {
        hb_free(&h->freebits[k]);
        free(h->lifo[k].v);
    }
    free(h->held_bytes);
    free(h->rel_bytes);
    free(h);
}

/* ---- allocation ---------------------------------------------------------- */

static int ask_collect(ha_heap *h, ha_alloc_result *res, uint8_t reason)
{
    h->collect_asked = true;
    res->collect_reason = reason;
    return HA_NEED_COLLECT;
}

int ha_alloc(ha_heap *h, uint64_t size, ha_alloc_result *res)
{
    if (!h || !res)
        return HA_EINVAL;
    memset(res, 0, sizeof *res);
    uint64_t c = ha_class_size(h, size);
    if (c == 0)
        return size == 0 ? HA_EINVAL : HA_EVA;
    if (c > h->p.va_size)
        return HA_EVA;
    uint32_t k = log2u(c);
    if (tb_reserve(&h->tab, 1))
        return HA_ENOMEM;

    uint64_t off = 0;
    bool found;
    if (h->p.policy == HA_POLICY_SEED) {
        if (!h->collect_answered && h->handed_since_collect >= h->mapped / 8)
            return ask_collect(h, res, HA_COLLECT_TRIGGER);
        ha_vec *l = &h->lifo[k];
        found = true;
        if (l->n)
            off = l->v[--l->n];
        else if (h->bump + c <= h->mapped) {
            off = h->bump;
            h->bump += c;
        } else
            found = false;
        if (!found) {
            if (!h->collect_answered)
                return ask_collect(h, res, HA_COLLECT_FULL);
            uint64_t need = h->bump + c;
            if (need > h->p.va_size) {
                h->collect_answered = h->asked_answered = false;
                return HA_EVA;
            }
            res->grow_chunks = (uint32_t)((need - h->mapped + h->p.chunk_size - 1) / h->p.chunk_size);
            return HA_NEED_GROW;
        }
    } else {
        bool down = co_top_down(h, k);
        fx fit = co_find(h, c, down);
        if (!h->collect_answered && fit.size) {
            uint64_t handed = h->handed_since_collect;
            bool large = c >= h->mapped / CO_LARGE_DIV && handed >= h->mapped / CO_LARGE_DIV;
            bool high = !down && handed >= h->mapped / CO_HIGH_DIV &&
                        fit.off + c > h->used_at_collect + h->mapped / CO_HIGH_DIV;
            if (large || high)
                return ask_collect(h, res, HA_COLLECT_TRIGGER);
        }
        found = fit.size != 0;
        if (found)
            off = co_carve(h, fit, c, down);
        if (!found) {
            /* No provably empty collect: none when a collect already ran
             * since the last allocation (whoever started it), none when no
             * block exists (a fresh heap; tab.count is the same on every
             * node: blocks appear at allocations and go at collects). */
            if (!h->collect_answered && h->tab.count > 0)
                return ask_collect(h, res, HA_COLLECT_FULL);
            uint64_t need = co_top_free_run(h) + c;
            if (need > h->p.va_size) {
                /* No growth can help: a collect the seed's rule asks for
                 * may (blocks may have been freed since the last one), so
                 * ask for it rather than fail. */
                if (!h->asked_answered && h->tab.count > 0)
                    return ask_collect(h, res, HA_COLLECT_FULL);
                h->collect_answered = h->asked_answered = h->skip_pending = false;
                return HA_EVA;
            }
            /* Counted when the growth happens (an answer changes no stats). */
            h->skip_pending = !h->asked_answered;
            res->grow_chunks = (uint32_t)((need - h->mapped + h->p.chunk_size - 1) / h->p.chunk_size);
            return HA_NEED_GROW;
        }
        if (++h->cls_alloc[k] >= HA_DECAY_AT) {
            h->cls_alloc[k] /= 2;
            h->cls_reclaim[k] /= 2;
            h->cls_seen[k] /= 2;
        }
    }
    tb_insert(&h->tab, off, c, h->p.ranks);
    for (uint32_t r = 0; r < h->p.ranks; r++)
        h->held_bytes[r] += c;
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

int ha_grow(ha_heap *h, uint32_t chunks)
{
    if (!h || chunks == 0)
        return HA_EINVAL;
    uint64_t add = (uint64_t)chunks * h->p.chunk_size;
    if (add > h->p.va_size - h->mapped)
        return HA_EVA;
    uint64_t old = h->mapped, nm = old + add;
    if (h->p.policy == HA_POLICY_COALESCE) {
        if (co_resize(h, nm))
            return HA_ENOMEM;
        h->mapped = nm;
        fx_insert_merge(h, old, add);
    } else {
        h->mapped = nm;
    }
    h->free_bytes += add;
    h->growths++;
    if (h->skip_pending) {
        h->collects_skipped++;
        h->asked_answered = true; /* count each skip once */
        h->skip_pending = false;
    }
    HA_DEBUG_CHECK(h, "ha_grow");
    return HA_OK;
}

int ha_free(ha_heap *h, uint32_t rank, uint64_t offset)
{
    if (!h || rank >= h->p.ranks)
        return HA_EINVAL;
    ha_blk *b = tb_find(&h->tab, offset);
    if (!b)
        return HA_ENOTHELD;
    uint64_t *held = tb_held(&h->tab, b);
    uint64_t bit = UINT64_C(1) << (rank % 64);
    if (!(held[rank / 64] & bit))
        return HA_ENOTHELD;
    if (b->nrel + 1 == h->p.ranks && vec_reserve(&h->pending, 1))
        return HA_ENOMEM;
    uint64_t sz = b->size;
    held[rank / 64] &= ~bit;
    b->nrel++;
    h->held_bytes[rank] -= sz;
    h->rel_bytes[rank] += sz;
    h->frees++;
    if (b->nrel == h->p.ranks) {
        b->pending = 1;
        h->pending.v[h->pending.n++] = offset;
        h->live_bytes -= sz;
        h->pending_bytes += sz;
    }
    HA_DEBUG_CHECK(h, "ha_free");
    return HA_OK;
}

uint64_t ha_block_size(const ha_heap *h, uint64_t offset)
{
    const ha_blk *b = h ? tb_find(&h->tab, offset) : NULL;
    return b ? b->size : 0;
}

int ha_rank_holds(const ha_heap *h, uint32_t rank, uint64_t offset)
{
    if (!h || rank >= h->p.ranks)
        return 0;
    const ha_blk *b = tb_find(&h->tab, offset);
    if (!b)
        return 0;
    return (int)((tb_held(&h->tab, b)[rank / 64] >> (rank % 64)) & 1);
}

/* ---- collect ------------------------------------------------------------- */

/* Reclaims sorted offsets (each a pending record, already removed from the
 * pending vector). Seed: top-of-heap rollback, then LIFO lists in ascending
 * order. Coalesce: merge into free blocks. */
static void reclaim_sorted(ha_heap *h, const uint64_t *offs, size_t n, uint64_t *bytes)
{
    uint64_t total = 0;
    size_t end = n;
    if (h->p.policy == HA_POLICY_SEED) {
        while (end > 0) {
            ha_blk *b = tb_find(&h->tab, offs[end - 1]);
            if (b->off + b->size != h->bump)
                break;
            h->bump = b->off;
            end--;
        }
    }
    for (size_t i = 0; i < n; i++) {
        ha_blk *b = tb_find(&h->tab, offs[i]);
        uint32_t k = b->klog;
        uint64_t sz = b->size;
        tb_erase(&h->tab, b);
        if (h->p.policy == HA_POLICY_SEED) {
            if (i < end)
                h->lifo[k].v[h->lifo[k].n++] = offs[i]; /* room reserved by caller */
        } else {
            fx_insert_merge(h, offs[i], sz);
            if (++h->cls_reclaim[k] > h->cls_alloc[k])
                h->cls_reclaim[k] = h->cls_alloc[k];
        }
        total += sz;
    }
    for (uint32_t r = 0; r < h->p.ranks; r++)
        h->rel_bytes[r] -= total;
    h->pending_bytes -= total;
    h->free_bytes += total;
    h->collects++;
    h->handed_since_collect = 0;
    h->used_at_collect = h->mapped - h->free_bytes;
    if (h->collect_asked) {
        h->collect_asked = false;
        h->collect_answered = h->asked_answered = true;
    }
    h->skip_pending = false;
    if (h->p.policy == HA_POLICY_COALESCE) {
        h->collect_answered = true; /* every collect answers (docs/design.md) */
        memcpy(h->cls_seen, h->cls_alloc, sizeof h->cls_seen);
    }
    if (bytes)
        *bytes = total;
}

/* Seed: makes room in the LIFO lists for the reclaimed offsets. */
static int reserve_lifo(ha_heap *h, const uint64_t *offs, size_t n)
{
    if (h->p.policy != HA_POLICY_SEED)
        return 0;
    size_t need[64] = {0};
    for (size_t i = 0; i < n; i++)
        need[tb_find(&h->tab, offs[i])->klog]++;
    for (int k = 0; k < 64; k++)
        if (need[k] && vec_reserve(&h->lifo[k], need[k]))
            return HA_ENOMEM;
    return 0;
}

int ha_collect(ha_heap *h, uint64_t *reclaimed_blocks, uint64_t *reclaimed_bytes)
{
    if (!h)
        return HA_EINVAL;
    if (h->pending.n)
        sort_offsets(h->pending.v, h->pending.n, h->kmin, log2u(h->mapped) + 1);
    if (reserve_lifo(h, h->pending.v, h->pending.n))
        return HA_ENOMEM;
    size_t n = h->pending.n;
    reclaim_sorted(h, h->pending.v, n, reclaimed_bytes);
    h->pending.n = 0;
    if (reclaimed_blocks)
        *reclaimed_blocks = n;
    HA_DEBUG_CHECK(h, "ha_collect");
    return HA_OK;
}

int ha_collect_candidates(const ha_heap *h, uint64_t **offsets, size_t *n)
{
    if (!h || !offsets || !n)
        return HA_EINVAL;
    *offsets = NULL;
    *n = 0;
    if (h->pending.n == 0)
        return HA_OK;
    uint64_t *v = malloc(h->pending.n * sizeof *v);
    if (!v)
        return HA_ENOMEM;
    memcpy(v, h->pending.v, h->pending.n * sizeof *v);
    sort_offsets(v, h->pending.n, h->kmin, log2u(h->mapped) + 1);
    *offsets = v;
    *n = h->pending.n;
    return HA_OK;
}

int ha_collect_apply(ha_heap *h, const uint64_t *offsets, size_t n, uint64_t *reclaimed_bytes)
{
    if (!h || (n && !offsets))
        return HA_EINVAL;
    for (size_t i = 0; i < n; i++) {
        ha_blk *b = tb_find(&h->tab, offsets[i]);
        if (!b || !b->pending || (i && offsets[i] <= offsets[i - 1])) {
            for (size_t j = 0; j < i; j++)
                tb_find(&h->tab, offsets[j])->mark = 0;
            return HA_EINVAL;
        }
        b->mark = 1;
    }
    if (reserve_lifo(h, offsets, n)) {
        for (size_t j = 0; j < n; j++)
            tb_find(&h->tab, offsets[j])->mark = 0;
        return HA_ENOMEM;
    }
    size_t w = 0;
    for (size_t i = 0; i < h->pending.n; i++) {
        ha_blk *b = tb_find(&h->tab, h->pending.v[i]);
        if (!b->mark)
            h->pending.v[w++] = h->pending.v[i];
    }
    h->pending.n = w;
    reclaim_sorted(h, offsets, n, reclaimed_bytes);
    HA_DEBUG_CHECK(h, "ha_collect_apply");
    return HA_OK;
}

/* ---- introspection ------------------------------------------------------- */

void ha_get_stats(const ha_heap *h, ha_stats *s)
{
    memset(s, 0, sizeof *s);
    s->mapped = h->mapped;
    s->live_bytes = h->live_bytes;
    s->pending_bytes = h->pending_bytes;
    s->free_bytes = h->free_bytes;
    s->pending_blocks = h->pending.n;
    s->live_blocks = h->tab.count - h->pending.n;
    s->allocs = h->allocs;
    s->frees = h->frees;
    s->collects = h->collects;
    s->growths = h->growths;
    s->handed_since_collect = h->handed_since_collect;
    s->collects_skipped = h->collects_skipped;
    if (h->p.policy == HA_POLICY_SEED) {
        s->top = h->bump;
    } else {
        s->top = co_top_free_run(h);
    }
}

void ha_rank_stats(const ha_heap *h, uint32_t rank, uint64_t *held_bytes, uint64_t *released_bytes)
{
    uint64_t hb = 0, rb = 0;
    if (h && rank < h->p.ranks) {
        hb = h->held_bytes[rank];
        rb = h->rel_bytes[rank];
    }
    if (held_bytes)
        *held_bytes = hb;
    if (released_bytes)
        *released_bytes = rb;
}

size_t ha_memory_usage(const ha_heap *h)
{
    size_t m = sizeof *h;
    m += h->tab.cap * (sizeof(ha_blk) + (h->tab.words > 1 ? h->tab.words * sizeof(uint64_t) : 0));
    for (uint32_t l = 0; l < h->fstart.nlevels; l++)
        m += (h->fstart.nw[l] + h->fend.nw[l]) * sizeof(uint64_t);
    m += h->pending.cap * sizeof(uint64_t);
    m += 2 * h->p.ranks * sizeof(uint64_t);
    for (int k = 0; k < 64; k++) {
        m += h->lifo[k].cap * sizeof(uint64_t);
        for (uint32_t l = 0; l < h->freebits[k].nlevels; l++)
            m += h->freebits[k].nw[l] * sizeof(uint64_t);
    }
    return m;
}

/* ---- validator ----------------------------------------------------------- */

typedef struct iv {
    uint64_t off, size;
    int kind; /* 0 block, 1 free */
} iv;

static int cmp_iv(const void *a, const void *b)
{
    const iv *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

#define VFAIL(...) do { if (err && errlen) snprintf(err, errlen, __VA_ARGS__); rc = HA_EINVAL; goto out; } while (0)

int ha_validate(const ha_heap *h, char *err, size_t errlen)
{
    int rc = HA_OK;
    iv *v = NULL;
    uint64_t *held = NULL, *rel = NULL;
    size_t nfree = 0;
    bool co = h->p.policy == HA_POLICY_COALESCE;
    if (!co) {
        for (int k = 0; k < 64; k++)
            nfree += h->lifo[k].n;
        nfree++;
    } else {
        for (size_t w = 0; w < h->fstart.nw[0]; w++)
            nfree += (size_t)__builtin_popcountll(h->fstart.w[0][w]);
    }
    size_t cap = h->tab.count + nfree + 1, n = 0;
    v = malloc(cap * sizeof *v);
    held = calloc(h->p.ranks, sizeof(uint64_t));
    rel = calloc(h->p.ranks, sizeof(uint64_t));
    if (!v || !held || !rel)
        VFAIL("out of memory while validating");

    uint64_t live = 0, pend = 0, fr = 0;
    uint64_t nbin[64] = {0};
    size_t npend = 0, count = 0, nfx = 0;
    for (size_t i = 0; i < h->tab.cap; i++) {
        const ha_blk *b = &h->tab.slot[i];
        if (b->off == HA_EMPTY)
            continue;
        count++;
        uint64_t sz = b->size;
        const char *what = "block";
        if (sz == 0 || sz % h->p.min_block || b->klog != log2u(sz))
            VFAIL("%s at %llu has size %llu (class 2^%u): not a multiple of min_block or a wrong class",
                  what, (unsigned long long)b->off, (unsigned long long)sz, b->klog);
        if (b->klog < h->kmin || b->klog > h->kmax)
            VFAIL("%s at %llu has class 2^%u outside 2^%u..2^%u", what, (unsigned long long)b->off,
                  b->klog, h->kmin, h->kmax);
        if (!co && sz != UINT64_C(1) << b->klog)
            VFAIL("seed block at %llu has size %llu, not a power of two", (unsigned long long)b->off,
                  (unsigned long long)sz);
        if (b->off % h->p.min_block)
            VFAIL("%s at %llu is not aligned to min_block", what, (unsigned long long)b->off);
        if (b->off + sz > (!co ? h->bump : h->mapped) || b->off + sz < b->off)
            VFAIL("%s at %llu (+%llu) ends past the %s", what, (unsigned long long)b->off,
                  (unsigned long long)sz, !co ? "bump pointer" : "extent");
        if (tb_find(&h->tab, b->off) != b)
            VFAIL("%s at %llu is not reachable in the table", what, (unsigned long long)b->off);
        if (b->mark)
            VFAIL("%s at %llu carries a stale mark", what, (unsigned long long)b->off);
        const uint64_t *hw = tb_held(&h->tab, b);
        uint32_t nheld = 0;
        for (uint32_t r = 0; r < h->p.ranks; r++) {
            if ((hw[r / 64] >> (r % 64)) & 1) {
                nheld++;
                held[r] += sz;
            } else {
                rel[r] += sz;
            }
        }
        for (size_t w = 0; w < h->tab.words; w++) {
            uint32_t lo = (uint32_t)(w * 64);
            uint64_t valid = h->p.ranks - lo >= 64 ? UINT64_MAX : (UINT64_C(1) << (h->p.ranks - lo)) - 1;
            if (hw[w] & ~valid)
                VFAIL("block at %llu has held bits for ranks >= %u", (unsigned long long)b->off, h->p.ranks);
        }
        if (nheld + b->nrel != h->p.ranks)
            VFAIL("block at %llu: %u holders + %u releases != %u ranks", (unsigned long long)b->off, nheld,
                  b->nrel, h->p.ranks);
        if ((b->nrel == h->p.ranks) != (b->pending == 1))
            VFAIL("block at %llu: pending flag %u but %u of %u ranks released", (unsigned long long)b->off,
                  b->pending, b->nrel, h->p.ranks);
        if (b->pending) {
            pend += sz;
            npend++;
        } else {
            live += sz;
        }
        v[n++] = (iv){b->off, sz, 0};
    }
    if (count != h->tab.count)
        VFAIL("table counts %zu records but holds %zu", h->tab.count, count);
    if (npend != h->pending.n)
        VFAIL("%zu pending records but the pending list has %zu", npend, h->pending.n);
    for (size_t i = 0; i < h->pending.n; i++) {
        const ha_blk *b = tb_find(&h->tab, h->pending.v[i]);
        if (!b || !b->pending)
            VFAIL("pending list entry %llu is not a pending block", (unsigned long long)h->pending.v[i]);
    }

    if (!co) {
        if (h->bump % h->p.min_block || h->bump > h->mapped)
            VFAIL("bump %llu is misaligned or past the extent %llu", (unsigned long long)h->bump,
                  (unsigned long long)h->mapped);
        for (uint32_t k = 0; k < 64; k++)
            for (size_t i = 0; i < h->lifo[k].n; i++) {
                uint64_t o = h->lifo[k].v[i], sz = UINT64_C(1) << k;
                if (o + sz > h->bump)
                    VFAIL("free-list block at %llu ends past the bump pointer", (unsigned long long)o);
                v[n++] = (iv){o, sz, 1};
                fr += sz;
            }
        if (h->mapped > h->bump) {
            v[n++] = (iv){h->bump, h->mapped - h->bump, 1};
            fr += h->mapped - h->bump;
        }
    } else {
        for (size_t w = 0; w < h->fstart.nw[0]; w++) {
            uint64_t word = h->fstart.w[0][w];
            while (word) {
                uint64_t u = w * 64 + (uint64_t)__builtin_ctzll(word);
                word &= word - 1;
                uint64_t e = hb_next(&h->fend, u);
                if (u >= h->fstart.nbits || e == HA_EMPTY || ((e + 1) << h->kmin) > h->mapped)
                    VFAIL("free extent at %llu has no end inside the extent", (unsigned long long)(u << h->kmin));
                uint64_t o = u << h->kmin, sz = (e - u + 1) << h->kmin;
                uint32_t k = log2u(sz);
                if (k < h->kmin || k > h->kmax || !hb_test(&h->freebits[k], o >> k))
                    VFAIL("free extent at %llu (+%llu) is missing from the bitmap of its bin 2^%u",
                          (unsigned long long)o, (unsigned long long)sz, k);
                if (hb_next(&h->fstart, u + 1) <= e)
                    VFAIL("free extent at %llu (+%llu) contains another's start", (unsigned long long)o,
                          (unsigned long long)sz);
                nbin[k]++;
                nfx++;
                fr += sz;
                v[n++] = (iv){o, sz, 1};
            }
        }
        if (nfx != h->nfree)
            VFAIL("%zu free extents but the count says %llu", nfx, (unsigned long long)h->nfree);
        const hbits *all[66];
        uint64_t want[66];
        uint32_t na = 0;
        all[na] = &h->fstart;
        want[na++] = nfx;
        all[na] = &h->fend;
        want[na++] = nfx;
        for (uint32_t k = h->kmin; k <= h->kmax; k++) {
            if ((nbin[k] != 0) != ((h->binmask >> k) & 1))
                VFAIL("bin 2^%u: the mask of non-empty bins is stale", k);
            if (nbin[k] && ((h->bin_lo[k] != HA_EMPTY && h->bin_lo[k] != hb_first(&h->freebits[k])) ||
                            (h->bin_hi[k] != HA_EMPTY && h->bin_hi[k] != hb_last(&h->freebits[k]))))
                VFAIL("bin 2^%u: the cached lowest or highest extent is stale", k);
            if (nbin[k] != h->nbin[k])
                VFAIL("bin 2^%u holds %llu free extents but its count says %llu", k,
                      (unsigned long long)nbin[k], (unsigned long long)h->nbin[k]);
            all[na] = &h->freebits[k];
            want[na++] = nbin[k];
        }
        for (uint32_t a = 0; a < na; a++) {
            const hbits *b = all[a];
            uint64_t bits = 0;
            for (uint32_t l = 0; l + 1 < b->nlevels; l++)
                for (size_t j = 0; j < b->nw[l]; j++) {
                    bool up = (b->w[l + 1][j / 64] >> (j % 64)) & 1;
                    if (up != (b->w[l][j] != 0))
                        VFAIL("free bitmap %u: summary level %u word %zu is stale", a, l + 1, j);
                }
            for (size_t w = 0; w < b->nw[0]; w++)
                bits += (uint64_t)__builtin_popcountll(b->w[0][w]);
            if (bits != want[a])
                VFAIL("free bitmap %u has %llu bits set for %llu free extents", a,
                      (unsigned long long)bits, (unsigned long long)want[a]);
        }
    }
    if (live != h->live_bytes || pend != h->pending_bytes || fr != h->free_bytes)
        VFAIL("counters live=%llu pending=%llu free=%llu, counted %llu %llu %llu",
              (unsigned long long)h->live_bytes, (unsigned long long)h->pending_bytes,
              (unsigned long long)h->free_bytes, (unsigned long long)live, (unsigned long long)pend,
              (unsigned long long)fr);
    for (uint32_t r = 0; r < h->p.ranks; r++)
        if (held[r] != h->held_bytes[r] || rel[r] != h->rel_bytes[r])
            VFAIL("rank %u: counters held=%llu released=%llu, counted %llu %llu", r,
                  (unsigned long long)h->held_bytes[r], (unsigned long long)h->rel_bytes[r],
                  (unsigned long long)held[r], (unsigned long long)rel[r]);
    if (n)
        qsort(v, n, sizeof *v, cmp_iv);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].off != at)
            VFAIL("%s at %llu (+%llu) %s the previous region, which ends at %llu",
                  v[i].kind ? "free block" : "block", (unsigned long long)v[i].off,
                  (unsigned long long)v[i].size, v[i].off < at ? "overlaps" : "leaves a gap after",
                  (unsigned long long)at);
        if (co && i && v[i].kind && v[i - 1].kind)
            VFAIL("free extents at %llu and %llu are adjacent (not merged)",
                  (unsigned long long)v[i - 1].off, (unsigned long long)v[i].off);
        at += v[i].size;
    }
    if (at != h->mapped)
        VFAIL("blocks and free space cover %llu bytes but the extent is %llu", (unsigned long long)at,
              (unsigned long long)h->mapped);
out:
    free(v);
    free(held);
    free(rel);
    return rc;
}
