/* alloc.c - the symmetric allocator core (see alloc.h for the contract).
 *
 * Notation used in the invariants below:
 *   E        = h->mapped (the extent), a multiple of chunk_size, <= va_size
 *   B        = the set of block records in the table (held or pending)
 *   F        = the set of free blocks (coalesce: bits in h->freebits;
 *              seed: entries of h->lifo plus the bump region [bump, E))
 *   size(b)  = 2^klog(b)
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

/* ---- block table --------------------------------------------------------
 *
 * Open addressing (linear probing, backward-shift deletion) from a block's
 * offset to its record. One record per block in B.
 *
 * Invariants, for every record b:
 *   b.off % min_block == 0, b.off + size(b) <= E
 *   held(b) = the ranks whose bit is set in b's word row; |held(b)| = R - b.nrel
 *   b.pending == 1  <=>  b.nrel == R  <=>  b.off is in h->pending
 *   coalesce: b.off % size(b) == 0
 *   count == number of records, count <= cap * 3/4, cap a power of two
 */
typedef struct ha_blk {
    uint64_t off;      /* HA_EMPTY: slot unused */
    uint8_t klog;
    uint8_t pending;
    uint8_t mark;      /* scratch for collect_apply */
    uint32_t nrel;     /* ranks that released this block */
} ha_blk;

typedef struct ha_table {
    ha_blk *slot;
    uint64_t *held;    /* cap * words bits: rank r holds slot i's block */
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
    t->held = calloc(cap * words, sizeof(uint64_t));
    if (!t->slot || !t->held) {
        free(t->slot);
        free(t->held);
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
    free(t->held);
    memset(t, 0, sizeof *t);
}

static ha_blk *tb_find(const ha_table *t, uint64_t off)
{
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
    return &t->held[(size_t)(b - t->slot) * t->words];
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
        n.slot[j] = t->slot[i];
        memcpy(&n.held[j * n.words], &t->held[i * t->words], t->words * sizeof(uint64_t));
    }
    n.count = t->count;
    tb_free(t);
    *t = n;
    return 0;
}

/* Makes room for one more record (so that tb_insert cannot fail). */
static int tb_reserve(ha_table *t)
{
    if ((t->count + 1) * 4 > t->cap * 3)
        return tb_grow(t);
    return 0;
}

/* Inserts a record held by all `ranks`; the caller made room. */
static ha_blk *tb_insert(ha_table *t, uint64_t off, uint32_t klog, uint32_t ranks)
{
    size_t mask = t->cap - 1, i = tb_hash(t, off);
    while (t->slot[i].off != HA_EMPTY)
        i = (i + 1) & mask;
    ha_blk *b = &t->slot[i];
    b->off = off;
    b->klog = (uint8_t)klog;
    b->pending = 0;
    b->mark = 0;
    b->nrel = 0;
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
            t->slot[i] = t->slot[j];
            memcpy(&t->held[i * t->words], &t->held[j * t->words], t->words * sizeof(uint64_t));
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

/* ---- the heap -----------------------------------------------------------
 *
 * Invariants (checked by ha_validate):
 *   B and F tile [0, E) exactly: disjoint, and their sizes sum to E.
 *   live_bytes    = sum of size(b) for b in B with b.nrel < R
 *   pending_bytes = sum of size(b) for b in B with b.nrel == R
 *   free_bytes    = sum of sizes in F  (= E - live_bytes - pending_bytes)
 *   held_bytes[r] = sum of size(b) for b in B that rank r holds
 *   rel_bytes[r]  = sum of size(b) for b in B that rank r released
 *   coalesce: every free block f is naturally aligned (f.off % size(f) == 0),
 *             lies in [0, E), and its buddy (f.off ^ size(f)) is not free at
 *             the same class (free neighbours are always merged);
 *             freebits[k] has bit i <=> [i*2^k, (i+1)*2^k) is a free block.
 *   seed:     bump % min_block == 0, bump <= E, every block and every LIFO
 *             entry lies below bump, lifo[k] holds free blocks of class k.
 *   collect_asked    == ha_alloc answered HA_NEED_COLLECT and no collect ran since;
 *   collect_answered == a collect ran after that answer, and no allocation
 *                       has succeeded or failed with HA_EVA since.
 *   (Both depend only on the allocation sequence and collects, never on
 *   which rank released what when, so every node decides alike.)
 */
struct ha_heap {
    ha_params p;
    uint32_t kmin, kmax;       /* classes 2^kmin .. 2^kmax */
    uint64_t mapped;
    ha_table tab;
    ha_vec pending;            /* offsets every rank released, unsorted */
    /* coalesce */
    hbits freebits[64];
    uint64_t cls_alloc[64];    /* allocations of class k (decayed) */
    uint64_t cls_reclaim[64];  /* reclaims of class k (decayed alike) */
    /* seed */
    ha_vec lifo[64];
    uint64_t bump;
    /* counters */
    uint64_t live_bytes, pending_bytes, free_bytes;
    uint64_t allocs, frees, collects, growths, handed_since_collect;
    bool collect_asked, collect_answered;
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

uint64_t ha_class_size(const ha_heap *h, uint64_t size)
{
    if (size == 0 || size > (UINT64_C(1) << 63))
        return 0;
    if (size < h->p.min_block)
        size = h->p.min_block;
    return is_pow2(size) ? size : UINT64_C(1) << (log2u(size) + 1);
}

/* ---- coalesce free space ----------------------------------------------- */

static int co_resize(ha_heap *h, uint64_t mapped)
{
    for (uint32_t k = h->kmin; k <= h->kmax; k++) {
        int rc = hb_resize(&h->freebits[k], mapped >> k);
        if (rc)
            return rc;
    }
    return 0;
}

/* Inserts the free block [off, off + 2^k), merging with free buddies. */
static void co_insert(ha_heap *h, uint64_t off, uint32_t k)
{
    while (k < h->kmax) {
        uint64_t buddy = off ^ (UINT64_C(1) << k);
        hbits *b = &h->freebits[k];
        if (!hb_test(b, buddy >> k))
            break;
        hb_clear(b, buddy >> k);
        off &= ~(UINT64_C(1) << k);
        k++;
    }
    hb_set(&h->freebits[k], off >> k);
}

/* Inserts [a, b) as naturally aligned blocks (each merged). */
static void co_insert_range(ha_heap *h, uint64_t a, uint64_t b)
{
    while (a < b) {
        uint32_t k = h->kmin;
        while (k < h->kmax && a % (UINT64_C(1) << (k + 1)) == 0 && a + (UINT64_C(1) << (k + 1)) <= b)
            k++;
        co_insert(h, a, k);
        a += UINT64_C(1) << k;
    }
}

/* Classes whose blocks mostly die before a collect go top-down. */
static bool co_top_down(const ha_heap *h, uint32_t k)
{
    return h->cls_alloc[k] > 0 && 2 * h->cls_reclaim[k] > h->cls_alloc[k];
}

/* Finds a free block for class k: address-ordered first fit, from the
 * bottom or from the top. Returns false if no free block is large enough. */
static bool co_take(ha_heap *h, uint32_t k, uint64_t *off_out)
{
    bool down = co_top_down(h, k);
    uint64_t best = HA_EMPTY;
    uint32_t bestk = 0;
    for (uint32_t j = k; j <= h->kmax; j++) {
        uint64_t i = down ? hb_last(&h->freebits[j]) : hb_first(&h->freebits[j]);
        if (i == HA_EMPTY)
            continue;
        uint64_t start = i << j, end = start + (UINT64_C(1) << j);
        if (best == HA_EMPTY || (down ? end > best : start < best)) {
            best = down ? end : start;
            bestk = j;
        }
    }
    if (best == HA_EMPTY)
        return false;
    uint64_t off = down ? best - (UINT64_C(1) << bestk) : best;
    hb_clear(&h->freebits[bestk], off >> bestk);
    /* Split down to class k; the unused halves become free blocks. Their
     * buddies are the half still being split, so no merge can happen. */
    for (uint32_t j = bestk; j > k; j--) {
        uint64_t half = UINT64_C(1) << (j - 1);
        if (down) {
            hb_set(&h->freebits[j - 1], off >> (j - 1));
            off += half;
        } else {
            hb_set(&h->freebits[j - 1], (off + half) >> (j - 1));
        }
    }
    *off_out = off;
    return true;
}

/* Start of the run of free blocks that ends at the extent (the extent
 * itself if the last block is in use). O(classes^2). */
static uint64_t co_top_free_run(const ha_heap *h)
{
    uint64_t t = h->mapped;
    for (bool moved = true; moved && t > 0;) {
        moved = false;
        for (uint32_t j = h->kmin; j <= h->kmax; j++) {
            uint64_t sz = UINT64_C(1) << j;
            if (t % sz == 0 && t >= sz && hb_test(&h->freebits[j], (t - sz) >> j)) {
                t -= sz;
                moved = true;
                break;
            }
        }
    }
    return t;
}

/* The extent needed so that a naturally aligned block of class k fits. */
static uint64_t co_grow_need(const ha_heap *h, uint32_t k)
{
    return align_up(co_top_free_run(h), UINT64_C(1) << k) + (UINT64_C(1) << k);
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
        co_insert_range(h, 0, h->mapped);
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
    if (tb_reserve(&h->tab))
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
                h->collect_answered = false;
                return HA_EVA;
            }
            res->grow_chunks = (uint32_t)((need - h->mapped + h->p.chunk_size - 1) / h->p.chunk_size);
            return HA_NEED_GROW;
        }
    } else {
        found = co_take(h, k, &off);
        if (!found) {
            if (!h->collect_answered)
                return ask_collect(h, res, HA_COLLECT_FULL);
            uint64_t need = co_grow_need(h, k);
            if (need > h->p.va_size) {
                h->collect_answered = false;
                return HA_EVA;
            }
            res->grow_chunks = (uint32_t)((need - h->mapped + h->p.chunk_size - 1) / h->p.chunk_size);
            return HA_NEED_GROW;
        }
        if (++h->cls_alloc[k] >= HA_DECAY_AT) {
            h->cls_alloc[k] /= 2;
            h->cls_reclaim[k] /= 2;
        }
    }
    tb_insert(&h->tab, off, k, h->p.ranks);
    for (uint32_t r = 0; r < h->p.ranks; r++)
        h->held_bytes[r] += c;
    h->live_bytes += c;
    h->free_bytes -= c;
    h->allocs++;
    h->handed_since_collect += c;
    h->collect_answered = false;
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
        co_insert_range(h, old, nm);
    } else {
        h->mapped = nm;
    }
    h->free_bytes += add;
    h->growths++;
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
    uint64_t sz = UINT64_C(1) << b->klog;
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
    return b ? UINT64_C(1) << b->klog : 0;
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
            uint64_t sz = UINT64_C(1) << b->klog;
            if (b->off + sz != h->bump)
                break;
            h->bump = b->off;
            end--;
        }
    }
    for (size_t i = 0; i < n; i++) {
        ha_blk *b = tb_find(&h->tab, offs[i]);
        uint32_t k = b->klog;
        uint64_t sz = UINT64_C(1) << k;
        if (h->p.policy == HA_POLICY_SEED) {
            if (i < end)
                h->lifo[k].v[h->lifo[k].n++] = offs[i]; /* room reserved by caller */
        } else {
            co_insert(h, offs[i], k);
            if (++h->cls_reclaim[k] > h->cls_alloc[k])
                h->cls_reclaim[k] = h->cls_alloc[k];
        }
        for (uint32_t r = 0; r < h->p.ranks; r++)
            h->rel_bytes[r] -= sz;
        total += sz;
        tb_erase(&h->tab, b);
    }
    h->pending_bytes -= total;
    h->free_bytes += total;
    h->collects++;
    h->handed_since_collect = 0;
    if (h->collect_asked) {
        h->collect_asked = false;
        h->collect_answered = true;
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
        qsort(h->pending.v, h->pending.n, sizeof(uint64_t), cmp_u64);
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
    qsort(v, h->pending.n, sizeof *v, cmp_u64);
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
    m += h->tab.cap * (sizeof(ha_blk) + h->tab.words * sizeof(uint64_t));
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
    if (h->p.policy == HA_POLICY_SEED) {
        for (int k = 0; k < 64; k++)
            nfree += h->lifo[k].n;
        nfree++;
    } else {
        for (uint32_t k = h->kmin; k <= h->kmax; k++)
            for (size_t w = 0; w < h->freebits[k].nw[0]; w++)
                nfree += (size_t)__builtin_popcountll(h->freebits[k].w[0][w]);
    }
    size_t cap = h->tab.count + nfree + 1, n = 0;
    v = malloc(cap * sizeof *v);
    held = calloc(h->p.ranks, sizeof(uint64_t));
    rel = calloc(h->p.ranks, sizeof(uint64_t));
    if (!v || !held || !rel)
        VFAIL("out of memory while validating");

    uint64_t live = 0, pend = 0, fr = 0;
    size_t npend = 0, count = 0;
    for (size_t i = 0; i < h->tab.cap; i++) {
        const ha_blk *b = &h->tab.slot[i];
        if (b->off == HA_EMPTY)
            continue;
        count++;
        uint64_t sz = UINT64_C(1) << b->klog;
        if (b->klog < h->kmin || b->klog > h->kmax)
            VFAIL("block at %llu has class 2^%u outside 2^%u..2^%u", (unsigned long long)b->off,
                  b->klog, h->kmin, h->kmax);
        if (b->off % h->p.min_block)
            VFAIL("block at %llu is not aligned to min_block", (unsigned long long)b->off);
        if (h->p.policy == HA_POLICY_COALESCE && b->off % sz)
            VFAIL("block at %llu is not naturally aligned to its size %llu", (unsigned long long)b->off,
                  (unsigned long long)sz);
        if (b->off + sz > (h->p.policy == HA_POLICY_SEED ? h->bump : h->mapped))
            VFAIL("block at %llu (+%llu) ends past the %s", (unsigned long long)b->off,
                  (unsigned long long)sz, h->p.policy == HA_POLICY_SEED ? "bump pointer" : "extent");
        if (tb_find(&h->tab, b->off) != b)
            VFAIL("block at %llu is not reachable in the table", (unsigned long long)b->off);
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
        if (b->mark)
            VFAIL("block at %llu carries a stale mark", (unsigned long long)b->off);
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

    if (h->p.policy == HA_POLICY_SEED) {
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
        for (uint32_t k = h->kmin; k <= h->kmax; k++) {
            const hbits *b = &h->freebits[k];
            uint64_t sz = UINT64_C(1) << k;
            for (uint32_t l = 0; l + 1 < b->nlevels; l++)
                for (size_t j = 0; j < b->nw[l]; j++) {
                    bool up = (b->w[l + 1][j / 64] >> (j % 64)) & 1;
                    if (up != (b->w[l][j] != 0))
                        VFAIL("free bitmap of class 2^%u: summary level %u word %zu is stale", k, l + 1, j);
                }
            for (size_t w = 0; w < b->nw[0]; w++) {
                uint64_t word = b->w[0][w];
                while (word) {
                    uint64_t i = w * 64 + (uint64_t)__builtin_ctzll(word);
                    word &= word - 1;
                    uint64_t o = i << k;
                    if (i >= b->nbits || o + sz > h->mapped)
                        VFAIL("free block at %llu (+%llu) lies past the extent", (unsigned long long)o,
                              (unsigned long long)sz);
                    if (k < h->kmax && hb_test(b, i ^ 1))
                        VFAIL("free block at %llu and its buddy are both free at size %llu",
                              (unsigned long long)o, (unsigned long long)sz);
                    v[n++] = (iv){o, sz, 1};
                    fr += sz;
                }
            }
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
