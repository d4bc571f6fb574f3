/* alloc.c - the symmetric allocator core (see alloc.h for the contract):
 * parameters, lifetime, alloc, grow, free, collect, introspection. The
 * structures and their invariants are in alloc_int.h; the bitmaps, the block
 * table, the coalesce policy's free space and the validator in the other
 * alloc_*.c files. */
#include "alloc_int.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_err(char *err, size_t errlen, const char *fmt, const char *what, unsigned long long v)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, what, v);
}

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
    case HA_OK:
        return "success";
    case HA_NEED_COLLECT:
        return "a collect is needed before this allocation";
    case HA_NEED_GROW:
        return "the heap must grow before this allocation";
    case HA_EINVAL:
        return "invalid argument";
    case HA_ENOMEM:
        return "out of memory for allocator bookkeeping";
    case HA_EVA:
        return "the allocation does not fit in the heap's va_size";
    case HA_ENOTHELD:
        return "no block held by this rank starts at this offset";
    case HA_ESTATE:
        return "call not valid in the heap's current state";
    default:
        return "unknown allocator error";
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
#define BAD(fmt, what, v)                                                                                              \
    do {                                                                                                               \
        set_err(err, errlen, fmt, what, (unsigned long long)(v));                                                      \
        return HA_EINVAL;                                                                                              \
    } while (0)
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
    h->rel_bytes = calloc(p->ranks, sizeof(uint64_t));
    if (!h->rel_bytes)
        goto nomem;
    if (hat_init(&h->tab, 64, (p->ranks + 63) / 64, h->kmin))
        goto nomem;
    h->mapped = p->initial_size;
    h->free_bytes = p->initial_size;
    if (p->policy == HA_POLICY_COALESCE) {
        if (hac_resize(h, h->mapped))
            goto nomem;
        hac_add(h, 0, h->mapped);
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
    hat_free(&h->tab);
    free(h->pending.v);
    hab_free(&h->fstart);
    hab_free(&h->fend);
    for (int k = 0; k < 64; k++) {
        hab_free(&h->freebits[k]);
        free(h->lifo[k].v);
    }
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

/* The seed policy's step: HA_OK with *off, or the answer to return. */
static int alloc_seed(ha_heap *h, uint64_t c, uint32_t k, ha_alloc_result *res, uint64_t *off)
{
    if (!h->collect_answered && h->handed_since_collect >= h->mapped / 8)
        return ask_collect(h, res, HA_COLLECT_TRIGGER);
    ha_vec *l = &h->lifo[k];
    if (l->n) {
        *off = l->v[--l->n];
        if (l->n) /* the class's next block: its record's slot, ahead of time */
            hat_prefetch(&h->tab, l->v[l->n - 1]);
        return HA_OK;
    }
    if (h->bump + c <= h->mapped) {
        *off = h->bump;
        h->bump += c;
        return HA_OK;
    }
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

/* The coalesce policy's answer when nothing fits: a collect, a growth or
 * HA_EVA. */
static int alloc_coalesce_nofit(ha_heap *h, uint64_t c, ha_alloc_result *res)
{
    /* No provably empty collect: none when a collect already ran
     * since the last allocation (whoever started it), none when no
     * block exists (a fresh heap; tab.count is the same on every
     * node: blocks appear at allocations and go at collects). */
    if (!h->collect_answered && h->tab.count > 0)
        return ask_collect(h, res, HA_COLLECT_FULL);
    uint64_t need = hac_top_free_run(h) + c;
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

/* The coalesce policy's step: HA_OK with *off, or the answer to return. */
static int alloc_coalesce(ha_heap *h, uint64_t c, uint32_t k, ha_alloc_result *res, uint64_t *off)
{
    bool down = hac_top_down(h, k, c);
    hac_fx fit = hac_find(h, c, down);
    if (!h->collect_answered && fit.size) {
        uint64_t handed = h->handed_since_collect;
        bool large = c >= h->mapped / CO_LARGE_DIV && handed >= h->mapped / CO_LARGE_DIV;
        bool high =
            !down && handed >= h->mapped / CO_HIGH_DIV && fit.off + c > h->used_at_collect + h->mapped / CO_HIGH_DIV;
        if (large || high)
            return ask_collect(h, res, HA_COLLECT_TRIGGER);
    }
    if (!fit.size)
        return alloc_coalesce_nofit(h, c, res);
    *off = hac_carve(h, fit, c, down);
    if (!down && fit.size > c) /* where the next block from this extent goes */
        hat_prefetch(&h->tab, *off + c);
    if (++h->cls_alloc[k] >= HA_DECAY_AT) {
        h->cls_alloc[k] /= 2;
        h->cls_reclaim[k] /= 2;
    }
    return HA_OK;
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
    if (hat_reserve(&h->tab, 1))
        return HA_ENOMEM;

    uint64_t off = 0;
    int rc = h->p.policy == HA_POLICY_SEED ? alloc_seed(h, c, k, res, &off) : alloc_coalesce(h, c, k, res, &off);
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

int ha_grow(ha_heap *h, uint32_t chunks)
{
    if (!h || chunks == 0)
        return HA_EINVAL;
    uint64_t add = (uint64_t)chunks * h->p.chunk_size;
    if (add > h->p.va_size - h->mapped)
        return HA_EVA;
    uint64_t old = h->mapped, nm = old + add;
    if (h->p.policy == HA_POLICY_COALESCE) {
        if (hac_resize(h, nm))
            return HA_ENOMEM;
        h->mapped = nm;
        hac_insert_merge(h, old, add);
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
    ha_blk *b = hat_find(&h->tab, offset);
    if (!b)
        return HA_ENOTHELD;
    uint64_t *held = hat_held(&h->tab, b);
    uint64_t bit = UINT64_C(1) << (rank % 64);
    if (!(held[rank / 64] & bit))
        return HA_ENOTHELD;
    if (b->nrel + 1 == h->p.ranks && hat_vec_reserve(&h->pending, 1))
        return HA_ENOMEM;
    uint64_t sz = b->size;
    held[rank / 64] &= ~bit;
    b->nrel++;
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

/* Frees on a batch walk their offsets in order: each step asks for the home
 * slot of the record HA_FREE_AHEAD offsets ahead, so that the misses of a
 * batch (one per record at 10^6 blocks) overlap instead of adding up. */
#define HA_FREE_AHEAD 8

/* Prefetching pays where the table outgrows the caches (4 MiB of slots,
 * 2^17 of them: about 6.5 * 10^4 blocks and more); below, it is only
 * instructions (issue 19). */
#define HA_PREFETCH_CAP ((size_t)1 << 17)

/* Takes back one release of rank's bit on b (the undo of a step of
 * ha_free_batch, in reverse order: a block it made pending is the last
 * entry of the pending vector). */
static void unfree(ha_heap *h, uint32_t rank, ha_blk *b)
{
    uint64_t sz = b->size;
    if (b->pending) {
        b->pending = 0;
        h->pending.n--;
        h->live_bytes += sz;
        h->pending_bytes -= sz;
    }
    hat_held(&h->tab, b)[rank / 64] |= UINT64_C(1) << (rank % 64);
    b->nrel--;
    h->rel_bytes[rank] -= sz;
}

int ha_free_batch(ha_heap *h, uint32_t rank, const uint64_t *offsets, size_t n, size_t *bad)
{
    if (!h || rank >= h->p.ranks || (n && !offsets))
        return HA_EINVAL;
    if (hat_vec_reserve(&h->pending, n))
        return HA_ENOMEM;
    uint64_t bit = UINT64_C(1) << (rank % 64);
    size_t ahead = h->tab.cap < HA_PREFETCH_CAP ? 0 : n < HA_FREE_AHEAD ? n : HA_FREE_AHEAD;
    for (size_t i = 0; i < ahead; i++)
        hat_prefetch(&h->tab, offsets[i]);
    for (size_t i = 0; i < n; i++) {
        if (ahead && i + HA_FREE_AHEAD < n)
            hat_prefetch(&h->tab, offsets[i + HA_FREE_AHEAD]);
        ha_blk *b = hat_find(&h->tab, offsets[i]);
        uint64_t *held = b ? hat_held(&h->tab, b) : NULL;
        if (!b || !(held[rank / 64] & bit)) {
            /* all or nothing: the ones before i are in the caches */
            for (size_t j = i; j-- > 0;)
                unfree(h, rank, hat_find(&h->tab, offsets[j]));
            if (bad)
                *bad = i;
            HA_DEBUG_CHECK(h, "ha_free_batch");
            return HA_ENOTHELD;
        }
        uint64_t sz = b->size;
        held[rank / 64] &= ~bit;
        b->nrel++;
        h->rel_bytes[rank] += sz;
        if (b->nrel == h->p.ranks) {
            b->pending = 1;
            h->pending.v[h->pending.n++] = offsets[i];
            h->live_bytes -= sz;
            h->pending_bytes += sz;
        }
    }
    h->frees += n;
    HA_DEBUG_CHECK(h, "ha_free_batch");
    return HA_OK;
}

uint64_t ha_block_size(const ha_heap *h, uint64_t offset)
{
    const ha_blk *b = h ? hat_find(&h->tab, offset) : NULL;
    return b ? b->size : 0;
}

int ha_rank_holds(const ha_heap *h, uint32_t rank, uint64_t offset)
{
    if (!h || rank >= h->p.ranks)
        return 0;
    const ha_blk *b = hat_find(&h->tab, offset);
    if (!b)
        return 0;
    return (int)((hat_held(&h->tab, b)[rank / 64] >> (rank % 64)) & 1);
}

/* ---- collect ------------------------------------------------------------- */

/* Reclaims sorted offsets (each a pending record, already removed from the
 * pending vector). Seed: top-of-heap rollback, then LIFO lists in ascending
 * order. Coalesce: merge into free blocks. */
/* Collects walk their offsets in order: each step asks for the lines a
 * later step will touch (its record's home slot; coalesce: the free
 * bitmaps' words around it; reclaim_sorted 2 * HA_PREFETCH steps ahead and,
 * coalesce, its size bin's bitmap word HA_PREFETCH ahead), so that their
 * misses overlap. */
#define HA_PREFETCH 8

static inline void prefetch_block(const ha_heap *h, uint64_t off)
{
    hat_prefetch(&h->tab, off);
    if (h->p.policy == HA_POLICY_COALESCE) {
        uint64_t u = off >> h->kmin;
        __builtin_prefetch(&h->fstart.w[0][u / 64], 1);
        __builtin_prefetch(&h->fend.w[0][u ? (u - 1) / 64 : 0], 1);
    }
}

static void reclaim_sorted(ha_heap *h, const uint64_t *offs, size_t n, uint64_t *bytes)
{
    uint64_t total = 0;
    size_t end = n;
    if (h->p.policy == HA_POLICY_SEED) {
        while (end > 0) {
            ha_blk *b = hat_find(&h->tab, offs[end - 1]);
            if (b->off + b->size != h->bump)
                break;
            h->bump = b->off;
            end--;
        }
    }
    bool pf = h->tab.cap >= HA_PREFETCH_CAP;
    bool co = pf && h->p.policy == HA_POLICY_COALESCE;
    for (size_t i = 0; i < n; i++) {
        if (pf && i + 2 * HA_PREFETCH < n)
            prefetch_block(h, offs[i + 2 * HA_PREFETCH]);
        if (co && i + HA_PREFETCH < n) {
            /* second stage: the record asked for HA_PREFETCH steps ago
             * gives the block's size bin, whose bitmap word the free
             * extent will be entered in (unless it merges into another) */
            const ha_blk *a = hat_find(&h->tab, offs[i + HA_PREFETCH]);
            if (a)
                __builtin_prefetch(&h->freebits[a->klog].w[0][(a->off >> a->klog) / 64], 1);
        }
        ha_blk *b = hat_find(&h->tab, offs[i]);
        uint32_t k = b->klog;
        uint64_t sz = b->size;
        hat_erase(&h->tab, b);
        if (h->p.policy == HA_POLICY_SEED) {
            if (i < end)
                h->lifo[k].v[h->lifo[k].n++] = offs[i]; /* room reserved by caller */
        } else {
            hac_insert_merge(h, offs[i], sz);
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
    if (h->p.policy == HA_POLICY_COALESCE)
        h->collect_answered = true; /* every collect answers (docs/design.md) */
    if (bytes)
        *bytes = total;
}

/* Seed: makes room in the LIFO lists for the reclaimed offsets. */
static int reserve_lifo(ha_heap *h, const uint64_t *offs, size_t n)
{
    if (h->p.policy != HA_POLICY_SEED)
        return 0;
    size_t need[64] = {0};
    for (size_t i = 0; i < n; i++) {
        if (i + HA_PREFETCH < n)
            prefetch_block(h, offs[i + HA_PREFETCH]);
        need[hat_find(&h->tab, offs[i])->klog]++;
    }
    for (int k = 0; k < 64; k++)
        if (need[k] && hat_vec_reserve(&h->lifo[k], need[k]))
            return HA_ENOMEM;
    return 0;
}

int ha_collect(ha_heap *h, uint64_t *reclaimed_blocks, uint64_t *reclaimed_bytes)
{
    if (!h)
        return HA_EINVAL;
    if (h->pending.n)
        hat_sort_offsets(h->pending.v, h->pending.n, h->kmin, log2u(h->mapped) + 1);
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
    hat_sort_offsets(v, h->pending.n, h->kmin, log2u(h->mapped) + 1);
    *offsets = v;
    *n = h->pending.n;
    return HA_OK;
}

int ha_collect_apply(ha_heap *h, const uint64_t *offsets, size_t n, uint64_t *reclaimed_bytes)
{
    if (!h || (n && !offsets))
        return HA_EINVAL;
    for (size_t i = 0; i < n; i++) {
        ha_blk *b = hat_find(&h->tab, offsets[i]);
        if (!b || !b->pending || (i && offsets[i] <= offsets[i - 1])) {
            for (size_t j = 0; j < i; j++)
                hat_find(&h->tab, offsets[j])->mark = 0;
            return HA_EINVAL;
        }
        b->mark = 1;
    }
    if (reserve_lifo(h, offsets, n)) {
        for (size_t j = 0; j < n; j++)
            hat_find(&h->tab, offsets[j])->mark = 0;
        return HA_ENOMEM;
    }
    size_t w = 0;
    for (size_t i = 0; i < h->pending.n; i++) {
        ha_blk *b = hat_find(&h->tab, h->pending.v[i]);
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
        s->top = hac_top_free_run(h);
    }
}

void ha_rank_stats(const ha_heap *h, uint32_t rank, uint64_t *held_bytes, uint64_t *released_bytes)
{
    uint64_t hb = 0, rb = 0;
    if (h && rank < h->p.ranks) {
        hb = h->live_bytes + h->pending_bytes - h->rel_bytes[rank];
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
    m += h->tab.cap * (sizeof(ha_blk) + (h->tab.words > 1 ? h->tab.words * sizeof(uint64_t) : 0)) + h->tab.cap / 8;
    for (uint32_t l = 0; l < h->fstart.nlevels; l++)
        m += (h->fstart.nw[l] + h->fend.nw[l]) * sizeof(uint64_t);
    m += h->pending.cap * sizeof(uint64_t);
    m += h->p.ranks * sizeof(uint64_t);
    for (int k = 0; k < 64; k++) {
        m += h->lifo[k].cap * sizeof(uint64_t);
        for (uint32_t l = 0; l < h->freebits[k].nlevels; l++)
            m += h->freebits[k].nw[l] * sizeof(uint64_t);
    }
    return m;
}
