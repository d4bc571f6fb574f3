/* alloc_coalesce.c - the coalesce (default) policy: its free space
 * (extents in bitmaps, merging, the size bins' direction and the first
 * fit, prefix hac_), its allocation step, collects and validator, and its
 * table ha_coalesce_ops (the structures and their invariants are in
 * alloc_int.h). */
#include "alloc_int.h"

#include <stdio.h>

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

int hac_resize(ha_heap *h, uint64_t mapped)
{
    if (hab_resize(&h->fstart, mapped >> h->kmin) || hab_resize(&h->fend, mapped >> h->kmin))
        return HA_ENOMEM;
    for (uint32_t k = h->kmin; k <= h->kmax; k++)
        if (hab_resize(&h->freebits[k], mapped >> k))
            return HA_ENOMEM;
    return 0;
}

/* Bin k's lowest (highest) extent is the one in window i (HA_EMPTY: the
 * bin is empty), f if known (size 0: not resolved yet). The key is what
 * co_find compares: its start (end), or while f is not known the window's
 * bound on it. */
static inline void co_set_lo(ha_heap *h, uint32_t k, uint64_t i, hac_fx f)
{
    h->bin_lo[k] = i;
    h->bin_lo_fx[k] = f;
    h->lo_key[k] = f.size ? f.off : i << k;
}

static inline void co_set_hi(ha_heap *h, uint32_t k, uint64_t i, hac_fx f)
{
    h->bin_hi[k] = i;
    h->bin_hi_fx[k] = f;
    h->hi_key[k] = f.size ? f.off + f.size : (i + 3) << k;
}

/* Enters f into its size bin (freebits, nbin, the bin's cache, binmask). */
static void co_bin_add(ha_heap *h, hac_fx f)
{
    uint32_t k = log2u(f.size);
    uint64_t i = f.off >> k;
    hab_set(&h->freebits[k], i);
    if (h->nbin[k] == 0) {
        co_set_lo(h, k, i, f);
        co_set_hi(h, k, i, f);
    } else {
        if (i < h->bin_lo[k])
            co_set_lo(h, k, i, f);
        if (i > h->bin_hi[k])
            co_set_hi(h, k, i, f);
    }
    h->nbin[k]++;
    h->binmask |= UINT64_C(1) << k;
}

void hac_add(ha_heap *h, uint64_t start, uint64_t len)
{
    hab_set(&h->fstart, start >> h->kmin);
    hab_set(&h->fend, (start + len - 1) >> h->kmin);
    co_bin_add(h, (hac_fx){start, len});
    h->nfree++;
}

/* Asks for the lines fx_at(h, k, i) will read: the fstart and fend words
 * around the last min_block of window i (the extent starts in the window
 * and covers that min_block). */
static inline void co_prefetch_window(const ha_heap *h, uint32_t k, uint64_t i)
{
    uint64_t u = ((((i + 1) << k) - h->p.min_block) >> h->kmin) / 64;
    __builtin_prefetch(&h->fstart.w[0][u]);
    __builtin_prefetch(&h->fend.w[0][u]);
}

/* Takes f out of its size bin (co_bin_add's inverse). If it was the bin's
 * lowest (highest) extent, the next one's window is found now, while
 * freebits[k]'s lines around it are in the caches, and the lines that
 * resolving it will read are asked for: a bin whose lowest extent an
 * allocation carved is resolved again at the next allocation, at a place no
 * cache holds (issue 19: three dependent misses per allocation at 10^6
 * blocks). */
static inline void co_bin_del(ha_heap *h, hac_fx f)
{
    uint32_t k = log2u(f.size);
    uint64_t i = f.off >> k;
    hab_clear(&h->freebits[k], i);
    bool more = h->nbin[k] > 1;
    if (i == h->bin_lo[k]) {
        co_set_lo(h, k, more ? hab_next(&h->freebits[k], i + 1) : HA_EMPTY, (hac_fx){0, 0});
        if (h->bin_lo[k] != HA_EMPTY)
            co_prefetch_window(h, k, h->bin_lo[k]);
    }
    if (i == h->bin_hi[k]) {
        co_set_hi(h, k, more && i > 0 ? hab_prev(&h->freebits[k], i - 1) : HA_EMPTY, (hac_fx){0, 0});
        if (h->bin_hi[k] != HA_EMPTY)
            co_prefetch_window(h, k, h->bin_hi[k]);
    }
    if (--h->nbin[k] == 0)
        h->binmask &= ~(UINT64_C(1) << k);
}

void hac_del(ha_heap *h, hac_fx f)
{
    hab_clear(&h->fstart, f.off >> h->kmin);
    hab_clear(&h->fend, (f.off + f.size - 1) >> h->kmin);
    co_bin_del(h, f);
    h->nfree--;
}

/* The free extent f becomes g in place (the same extent grown or shrunk at
 * one end or both, g.size != 0): the same state hac_del(f) then hac_add(g)
 * leave, with fewer bitmap writes. A start or end that stays keeps its bit
 * in fstart / fend; an extent that stays in its bin and window keeps its
 * bit in freebits and its place in the bin's cache (the cached extent is
 * updated, the window's bound stays exact). */
void hac_move(ha_heap *h, hac_fx f, hac_fx g)
{
    if (f.off != g.off)
        hab_move(&h->fstart, f.off >> h->kmin, g.off >> h->kmin);
    uint64_t fe = f.off + f.size, ge = g.off + g.size;
    if (fe != ge)
        hab_move(&h->fend, (fe - 1) >> h->kmin, (ge - 1) >> h->kmin);
    uint32_t k = log2u(f.size);
    uint64_t i = f.off >> k;
    if (log2u(g.size) != k || g.off >> k != i) {
        /* another bin or window: out of the old one, into the new one */
        co_bin_del(h, f);
        co_bin_add(h, g);
        return;
    }
    if (h->bin_lo_fx[k].size && i == h->bin_lo[k])
        co_set_lo(h, k, i, g);
    if (h->bin_hi_fx[k].size && i == h->bin_hi[k])
        co_set_hi(h, k, i, g);
}

/* The free extent that starts at min_block unit u (a bit of fstart). */
static inline hac_fx fx_from(const ha_heap *h, uint64_t u)
{
    uint64_t e = hab_next(&h->fend, u);
    return (hac_fx){u << h->kmin, (e - u + 1) << h->kmin};
}

/* The free extent of bin k that starts in window i (bit i of freebits[k]).
 * It is at least 2^k long, so it covers the last min_block of the window:
 * it is the free extent with the highest start at or below that point. */
static hac_fx fx_at(const ha_heap *h, uint32_t k, uint64_t i)
{
    uint64_t p = ((i + 1) << k) - h->p.min_block;
    co_prefetch_window(h, k, i); /* both lines at once, not one after the other */
    uint64_t u = hab_prev(&h->fstart, p >> h->kmin);
    return u == HA_EMPTY ? (hac_fx){0, 0} : fx_from(h, u);
}

/* Frees [start, start + len), merging with free neighbours. */
void hac_insert_merge(ha_heap *h, uint64_t start, uint64_t len)
{
    uint64_t end = start + len;
    hac_fx n = {0, 0}, q = {0, 0};
    if (end < h->mapped && hab_test(&h->fstart, end >> h->kmin) && !hae_at(h, end))
        n = fx_from(h, end >> h->kmin);
    if (start > 0 && hab_test(&h->fend, (start >> h->kmin) - 1) && !hae_at(h, start)) {
        /* the left neighbour ends at start: only its start is looked up */
        uint64_t qs = hab_prev(&h->fstart, (start >> h->kmin) - 1) << h->kmin;
        q = (hac_fx){qs, start - qs};
    }
    if (q.size) { /* the left neighbour grows over [start, end) and n */
        if (n.size)
            hac_del(h, n);
        hac_move(h, q, (hac_fx){q.off, q.size + len + n.size});
    } else if (n.size) { /* the right neighbour grows down over [start, end) */
        hac_move(h, n, (hac_fx){start, len + n.size});
    } else {
        hac_add(h, start, len);
    }
}

/* Top-down (from the top of the heap down): a block of at least
 * mapped / CO_TOP_DIV, and the size bins whose blocks nearly all
 * (CO_HOT_PERMILLE per mille) die before a collect; the others bottom-up.
 * Large blocks at the top, long-lived small ones at the bottom: before
 * (issue 19), a scratch bin at 95% went top-down, and the few long-lived
 * blocks among its many pinned the top of the heap at each growth, where
 * the next large block needed room (g683: 1.50 of the seed). */
#define CO_HOT_PERMILLE 980
#define CO_TOP_DIV      16

bool hac_top_down(const ha_heap *h, uint32_t k, uint64_t c)
{
    return c >= h->mapped / CO_TOP_DIV ||
           (h->cls_alloc[k] > 0 && 1000 * h->cls_reclaim[k] > CO_HOT_PERMILLE * h->cls_alloc[k]);
}

/* Is a better than b for the direction? (b may be NULL.) */
static inline bool co_better(hac_fx a, hac_fx b, bool down)
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
/* The lowest (highest, down) bit of non-empty bin k's bitmap (always known). */
static inline uint64_t co_bin_end(const ha_heap *h, uint32_t k, bool down)
{
    return down ? h->bin_hi[k] : h->bin_lo[k];
}

/* The free extent in window co_bin_end(h, k, down) of bin k, through the
 * cache (fx_at's answer: the window holds exactly one extent of bin k). */
static inline hac_fx co_end_fx(ha_heap *h, uint32_t k, bool down)
{
    hac_fx *c = down ? &h->bin_hi_fx[k] : &h->bin_lo_fx[k];
    if (!c->size) {
        uint64_t i = co_bin_end(h, k, down);
        if (down)
            co_set_hi(h, k, i, fx_at(h, k, i));
        else
            co_set_lo(h, k, i, fx_at(h, k, i));
    }
    return *c;
}

/* hac_find for one direction: `down` a constant in each copy, so that the
 * bins loop carries no direction test. */
static inline __attribute__((always_inline)) hac_fx co_find(ha_heap *h, uint64_t s, const bool down)
{
    uint32_t ks = log2u(s);
    hac_fx best = {0, 0};
    /* Bins above ks: every extent fits, so each bin offers its lowest
     * (highest) one; the answer is the best of them (unique: extents are
     * disjoint). Each bin's key is that extent's start (end) once resolved,
     * else a bound on it (the window's start; end: (i + 3) << j), so the
     * bin with the least (greatest) key wins if its key is exact; if it is
     * a bound, the bin is resolved (its key becomes exact) and the choice
     * made again. Only bins whose bound could win are ever resolved. */
    uint64_t m = ks < 63 ? h->binmask & (UINT64_MAX << (ks + 1)) : 0;
    while (m) {
        uint32_t bj = 64;
        if (down) {
            uint64_t bk = 0;
            for (uint64_t mm = m; mm; mm &= mm - 1) {
                uint32_t j = (uint32_t)__builtin_ctzll(mm);
                bj = h->hi_key[j] > bk ? j : bj;
                bk = h->hi_key[j] > bk ? h->hi_key[j] : bk;
            }
        } else {
            uint64_t bk = UINT64_MAX;
            for (uint64_t mm = m; mm; mm &= mm - 1) {
                uint32_t j = (uint32_t)__builtin_ctzll(mm);
                bj = h->lo_key[j] < bk ? j : bj;
                bk = h->lo_key[j] < bk ? h->lo_key[j] : bk;
            }
        }
        if (bj == 64)
            break;
        bool exact = (down ? h->bin_hi_fx[bj].size : h->bin_lo_fx[bj].size) != 0;
        hac_fx b = co_end_fx(h, bj, down);
        if (!b.size) { /* cannot happen: bj is not empty */
            m &= ~(UINT64_C(1) << bj);
            continue;
        }
        if (exact) {
            best = b;
            break;
        }
    }
    if (h->nbin[ks]) {
        const hab_bits *bb = &h->freebits[ks];
        uint64_t i = co_bin_end(h, ks, down);
        for (unsigned n = 0; i != HA_EMPTY && (!best.size || n < CO_SCAN); n++) {
            if (best.size &&
                (down ? ((i + 1) << ks) + (UINT64_C(2) << ks) <= best.off + best.size : i << ks >= best.off))
                break;
            hac_fx b = n == 0 ? co_end_fx(h, ks, down) : fx_at(h, ks, i);
            if (!b.size || (best.size && !co_better(b, best, down)))
                break;
            if (b.size >= s) {
                best = b;
                break;
            }
            if (down)
                i = i ? hab_prev(bb, i - 1) : HA_EMPTY;
            else
                i = hab_next(bb, i + 1);
        }
    }
    return best;
}

hac_fx hac_find(ha_heap *h, uint64_t s, bool down)
{
    if (!down)
        return co_find(h, s, false);
    /* Top-down: the free run that ends at the extent ends highest of all;
     * when it is long enough it is co_find's answer (no other extent can
     * beat it, in its own bin or another), found without the bins. */
    uint64_t last = (h->mapped >> h->kmin) - 1;
    if (hab_test(&h->fend, last)) {
        uint64_t st = hab_prev(&h->fstart, last) << h->kmin;
        if (h->mapped - st >= s)
            return (hac_fx){st, h->mapped - st};
    }
    return co_find(h, s, true);
}

/* Takes s bytes from the free extent best (hac_find's answer). */
uint64_t hac_carve(ha_heap *h, hac_fx best, uint64_t s, bool down)
{
    uint64_t st = best.off, len = best.size;
    if (len == s)
        hac_del(h, best);
    else if (down)
        hac_move(h, best, (hac_fx){st, len - s});
    else
        hac_move(h, best, (hac_fx){st + s, len - s});
    return down ? st + len - s : st;
}

/* Start of the free extent that ends at the extent (the extent itself if
 * the last region is a block). */
uint64_t hac_top_free_run(const ha_heap *h)
{
    uint64_t last = (h->mapped >> h->kmin) - 1;
    if (h->mapped == 0 || !hab_test(&h->fend, last))
        return h->mapped;
    return hab_prev(&h->fstart, last) << h->kmin;
}

/* ---- the policy's table ---------------------------------------------------- */

static uint64_t co_class_size(const ha_params *p, uint64_t size) { return align_up(size, p->min_block); }

static uint64_t co_meta_bytes(const ha_params *p, uint64_t mapped)
{
    /* fstart and fend: a bit per min_block each; freebits[k] for every bin
     * k >= log2(min_block): mapped >> k bits, about as many again; the
     * 64-ary summary levels add 1/63. */
    uint64_t bytes = (mapped / p->min_block) / 2;
    return bytes + bytes / 63;
}

static int co_create(ha_heap *h)
{
    if (hac_resize(h, h->mapped))
        return HA_ENOMEM;
    hac_add(h, 0, h->mapped);
    return HA_OK;
}

static void co_destroy(ha_heap *h)
{
    hab_free(&h->fstart);
    hab_free(&h->fend);
    for (int k = 0; k < 64; k++)
        hab_free(&h->freebits[k]);
}

/* May a collect reclaim anything? reclaim collect: some block exists (the
 * same on every node); eager: some block is pending, or some rank released
 * a block another rank still holds (rel_bytes[r] > pending_bytes). The
 * latter is a rank that runs ahead of another: rather than grow by what
 * the other has not freed yet, the heap asks for a collect, a barrier at
 * this allocation that brings the other rank's releases in (issue 27: ranks
 * that drift apart within a step otherwise map a step's memory more). */
static inline bool co_reclaimable(const ha_heap *h)
{
    if (h->p.reclaim != HA_RECLAIM_EAGER)
        return h->tab.count > 0;
    if (h->pending.n > 0)
        return true;
    for (uint32_t r = 0; r < h->p.ranks; r++)
        if (h->rel_bytes[r] > h->pending_bytes)
            return true;
    return false;
}

/* The answer when nothing fits: a collect, a growth or HA_EVA. */
static int co_nofit(ha_heap *h, uint64_t c, ha_alloc_result *res)
{
    /* No provably empty collect: none when a collect already ran
     * since the last allocation (whoever started it), none when no
     * block exists (a fresh heap; tab.count is the same on every
     * node: blocks appear at allocations and go at collects); eager:
     * none unless a block is pending or released by some rank only
     * (co_reclaimable). (One decider: a release after a collect clears
     * collect_answered, so the next growth collects first: issue 27.) */
    if (!h->collect_answered && co_reclaimable(h))
        return ha_ask_collect(h, res, HA_COLLECT_FULL);
    /* Issue 32: with extent bounds the top's free run and the growth stay
     * apart: the growth holds the whole block. */
    uint64_t need = (h->p.extent_bound ? h->mapped : hac_top_free_run(h)) + c;
    if (need > h->p.va_size) {
        /* No growth can help: a collect the seed's rule asks for
         * may (blocks may have been freed since the last one), so
         * ask for it rather than fail. */
        if (!h->asked_answered && co_reclaimable(h))
            return ha_ask_collect(h, res, HA_COLLECT_FULL);
        h->collect_answered = h->asked_answered = h->skip_pending = false;
        return HA_EVA;
    }
    /* Counted when the growth happens (an answer changes no stats). */
    h->skip_pending = !h->asked_answered;
    res->grow_chunks = (uint32_t)((need - h->mapped + h->p.chunk_size - 1) / h->p.chunk_size);
    return HA_NEED_GROW;
}

/* The coalesce policy's step: HA_OK with *off, or the answer to return. */
static int co_step(ha_heap *h, uint64_t c, uint32_t k, ha_alloc_result *res, uint64_t *off)
{
    bool down = hac_top_down(h, k, c);
    hac_fx fit = hac_find(h, c, down);
    if (!h->collect_answered && fit.size && (h->p.reclaim != HA_RECLAIM_EAGER || h->pending.n)) {
        uint64_t handed = h->handed_since_collect;
        bool large = c >= h->mapped / CO_LARGE_DIV && handed >= h->mapped / CO_LARGE_DIV;
        bool high =
            !down && handed >= h->mapped / CO_HIGH_DIV && fit.off + c > h->used_at_collect + h->mapped / CO_HIGH_DIV;
        if (large || high)
            return ha_ask_collect(h, res, HA_COLLECT_TRIGGER);
    }
    if (!fit.size)
        return co_nofit(h, c, res);
    *off = hac_carve(h, fit, c, down);
    if (!down && fit.size > c) /* where the next block from this extent goes */
        hat_prefetch(&h->tab, *off + c);
    if (++h->cls_alloc[k] >= HA_DECAY_AT) {
        h->cls_alloc[k] /= 2;
        h->cls_reclaim[k] /= 2;
    }
    return HA_OK;
}

static int co_grow(ha_heap *h, uint64_t nm)
{
    if (hac_resize(h, nm))
        return HA_ENOMEM;
    uint64_t old = h->mapped;
    h->mapped = nm;
    hac_insert_merge(h, old, nm - old);
    return HA_OK;
}

/* The free extent at the top, [t, mapped) with t <= nm (ha_trim's top),
 * ends at nm now (or goes, when t == nm). The bitmaps keep their size:
 * a growth reuses them. */
static void co_shrink(ha_heap *h, uint64_t nm)
{
    uint64_t t = hac_top_free_run(h);
    hac_fx f = {t, h->mapped - t};
    if (t == nm)
        hac_del(h, f);
    else
        hac_move(h, f, (hac_fx){t, nm - t});
    h->mapped = nm;
}

/* Issue 30's holes: each free extent that does not end the extent gives
 * up its whole chunks (what stays of it, before and after them, stays
 * free: a hole between keeps them apart, so each is still maximal). */
static uint64_t co_punch(ha_heap *h, ha_chunk_fn fn, void *data)
{
    uint64_t cs = h->p.chunk_size, bytes = 0;
    for (uint64_t u = hab_first(&h->fstart); u != HA_EMPTY; u = hab_next(&h->fstart, u + 1)) {
        hac_fx f = fx_from(h, u);
        uint64_t end = f.off + f.size, a = align_up(f.off, cs), b = end / cs * cs;
        if (end == h->mapped || a >= b)
            continue;
        hac_del(h, f);
        if (a > f.off)
            hac_add(h, f.off, a - f.off);
        if (end > b)
            hac_add(h, b, end - b);
        for (uint64_t i = a / cs; i < b / cs; i++)
            ha_hole(h, i, fn, data);
        bytes += b - a;
        u = (end - 1) >> h->kmin; /* on from the extent's end */
    }
    return bytes;
}

/* Issue 30's automatic trim: the bytes co_punch would take, counted up to
 * `enough` at least (it stops there). Only the size bins of at least a
 * chunk can hold a whole chunk: O(their extents), none when no extent is
 * that long. */
static uint64_t co_punchable(const ha_heap *h, uint64_t enough)
{
    uint64_t cs = h->p.chunk_size, bytes = 0;
    for (uint32_t k = log2u(cs); k < 64 && bytes < enough; k++) {
        if (!(h->binmask >> k & 1))
            continue;
        for (uint64_t i = hab_first(&h->freebits[k]); i != HA_EMPTY && bytes < enough;
             i = hab_next(&h->freebits[k], i + 1)) {
            hac_fx f = fx_at(h, k, i);
            uint64_t end = f.off + f.size, a = align_up(f.off, cs), b = end / cs * cs;
            if (end != h->mapped && a < b)
                bytes += b - a;
        }
    }
    return bytes;
}

static void co_fill(ha_heap *h, uint64_t off) { hac_insert_merge(h, off, h->p.chunk_size); }

/* The record's home slot and the free bitmaps' words around the block. */
static inline void co_prefetch_block(const ha_heap *h, uint64_t off)
{
    hat_prefetch(&h->tab, off);
    uint64_t u = off >> h->kmin;
    __builtin_prefetch(&h->fstart.w[0][u / 64], 1);
    __builtin_prefetch(&h->fend.w[0][u ? (u - 1) / 64 : 0], 1);
}

/* Merges each block into the free space, in ascending order. */
static uint64_t co_reclaim(ha_heap *h, const uint64_t *offs, size_t n)
{
    uint64_t total = 0;
    bool pf = h->tab.cap >= HA_PREFETCH_CAP;
    for (size_t i = 0; i < n; i++) {
        if (pf && i + 2 * HA_PREFETCH < n)
            co_prefetch_block(h, offs[i + 2 * HA_PREFETCH]);
        if (pf && i + HA_PREFETCH < n) {
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
        hac_insert_merge(h, offs[i], sz);
        if (++h->cls_reclaim[k] > h->cls_alloc[k])
            h->cls_reclaim[k] = h->cls_alloc[k];
        total += sz;
    }
    return total;
}

static uint64_t co_top(const ha_heap *h) { return hac_top_free_run(h); }

#define CFAIL(...)                                                                                                     \
    do {                                                                                                               \
        if (err && errlen)                                                                                             \
            snprintf(err, errlen, __VA_ARGS__);                                                                        \
        return HA_EINVAL;                                                                                              \
    } while (0)

/* A bin's counts, mask, cached windows, extents and keys (co_validate). */
static int co_validate_bin(const ha_heap *h, uint32_t k, uint64_t n, char *err, size_t errlen)
{
    if ((n != 0) != ((h->binmask >> k) & 1))
        CFAIL("bin 2^%u: the mask of non-empty bins is stale", k);
    if (n && (h->bin_lo[k] != hab_first(&h->freebits[k]) || h->bin_hi[k] != hab_last(&h->freebits[k])))
        CFAIL("bin 2^%u: the cached lowest or highest extent is stale", k);
    for (int d = 0; d < 2; d++) {
        const hac_fx *c = d ? &h->bin_hi_fx[k] : &h->bin_lo_fx[k];
        uint64_t w = d ? h->bin_hi[k] : h->bin_lo[k];
        if (!c->size)
            continue;
        uint64_t u = c->off >> h->kmin, e = hab_next(&h->fend, u);
        if (!n || w == HA_EMPTY || c->off >> k != w || c->off % h->p.min_block || !hab_test(&h->fstart, u) ||
            e == HA_EMPTY || ((e - u + 1) << h->kmin) != c->size || log2u(c->size) != k)
            CFAIL("bin 2^%u: the cached %s extent (%llu, +%llu) is not the free extent of "
                  "window %llu",
                  k, d ? "highest" : "lowest", (unsigned long long)c->off, (unsigned long long)c->size,
                  (unsigned long long)w);
    }
    if (n && h->lo_key[k] != (h->bin_lo_fx[k].size ? h->bin_lo_fx[k].off : h->bin_lo[k] << k))
        CFAIL("bin 2^%u: the key of its lowest extent is stale", k);
    if (n &&
        h->hi_key[k] != (h->bin_hi_fx[k].size ? h->bin_hi_fx[k].off + h->bin_hi_fx[k].size : (h->bin_hi[k] + 3) << k))
        CFAIL("bin 2^%u: the key of its highest extent is stale", k);
    if (n != h->nbin[k])
        CFAIL("bin 2^%u holds %llu free extents but its count says %llu", k, (unsigned long long)n,
              (unsigned long long)h->nbin[k]);
    return HA_OK;
}

/* A bitmap's summary levels, and its count of positions (co_validate). */
static int co_validate_bits(const hab_bits *b, uint32_t a, uint64_t want, char *err, size_t errlen)
{
    uint64_t bits = 0;
    for (uint32_t l = 0; l + 1 < b->nlevels; l++)
        for (size_t j = 0; j < b->nw[l]; j++) {
            bool up = (b->w[l + 1][j / 64] >> (j % 64)) & 1;
            if (up != (b->w[l][j] != 0))
                CFAIL("free bitmap %u: summary level %u word %zu is stale", a, l + 1, j);
        }
    for (size_t w = 0; w < b->nw[0]; w++)
        bits += (uint64_t)__builtin_popcountll(b->w[0][w]);
    if (bits != want)
        CFAIL("free bitmap %u has %llu bits set for %llu free extents", a, (unsigned long long)bits,
              (unsigned long long)want);
    return HA_OK;
}

/* Free extents maximal and in their bins, every bin's cache, every bitmap's
 * summary; the free regions: the extents. */
static int co_validate(const ha_heap *h, ha_region_fn add, void *data, char *err, size_t errlen)
{
    uint64_t nbin[64] = {0};
    size_t nfx = 0;
    for (size_t w = 0; w < h->fstart.nw[0]; w++) {
        uint64_t word = h->fstart.w[0][w];
        while (word) {
            uint64_t u = w * 64 + (uint64_t)__builtin_ctzll(word);
            word &= word - 1;
            uint64_t e = hab_next(&h->fend, u);
            if (u >= h->fstart.nbits || e == HA_EMPTY || ((e + 1) << h->kmin) > h->mapped)
                CFAIL("free extent at %llu has no end inside the extent", (unsigned long long)(u << h->kmin));
            uint64_t o = u << h->kmin, sz = (e - u + 1) << h->kmin;
            uint32_t k = log2u(sz);
            if (k < h->kmin || k > h->kmax || !hab_test(&h->freebits[k], o >> k))
                CFAIL("free extent at %llu (+%llu) is missing from the bitmap of its bin 2^%u", (unsigned long long)o,
                      (unsigned long long)sz, k);
            if (hab_next(&h->fstart, u + 1) <= e)
                CFAIL("free extent at %llu (+%llu) contains another's start", (unsigned long long)o,
                      (unsigned long long)sz);
            if (hab_test(&h->fstart, e + 1) && !hae_at(h, o + sz))
                CFAIL("free extents at %llu and %llu are adjacent (not merged)", (unsigned long long)o,
                      (unsigned long long)(o + sz));
            for (uint64_t b = o / h->p.chunk_size + 1; h->p.extent_bound && b * h->p.chunk_size < o + sz; b++)
                if (hae_at(h, b * h->p.chunk_size))
                    CFAIL("free extent at %llu (+%llu) spans the extent bound at %llu", (unsigned long long)o,
                          (unsigned long long)sz, (unsigned long long)(b * h->p.chunk_size));
            nbin[k]++;
            nfx++;
            if (add(data, o, sz))
                CFAIL("out of memory while validating");
        }
    }
    if (nfx != h->nfree)
        CFAIL("%zu free extents but the count says %llu", nfx, (unsigned long long)h->nfree);
    int rc = co_validate_bits(&h->fstart, 0, nfx, err, errlen);
    if (!rc)
        rc = co_validate_bits(&h->fend, 1, nfx, err, errlen);
    for (uint32_t k = h->kmin, a = 2; !rc && k <= h->kmax; k++, a++) {
        rc = co_validate_bin(h, k, nbin[k], err, errlen);
        if (!rc)
            rc = co_validate_bits(&h->freebits[k], a, nbin[k], err, errlen);
    }
    return rc;
}

static int co_alloc(ha_heap *h, uint64_t size, ha_alloc_result *res)
{
    return ha_alloc_with(h, size, res, co_class_size, co_step);
}

const ha_policy_ops ha_coalesce_ops = {
    .class_size = co_class_size,
    .meta_bytes = co_meta_bytes,
    .create = co_create,
    .destroy = co_destroy,
    .alloc = co_alloc,
    .grow = co_grow,
    .shrink = co_shrink,
    .punch = co_punch,
    .punchable = co_punchable,
    .fill = co_fill,
    .reclaim = co_reclaim,
    .top = co_top,
    .validate = co_validate,
    .every_collect_answers = true,
};
