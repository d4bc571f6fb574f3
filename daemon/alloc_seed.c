/* alloc_seed.c - the seed policy (the seed pull request's final algorithm,
 * docs/design.md): power-of-two classes, LIFO free lists, a bump pointer
 * with top-of-heap rollback at collect, a collect when mapped / 8 was
 * handed out since the last one. Its table, ha_seed_ops; the structures and
 * invariants (h->lifo, h->bump) are in alloc_int.h. */
#include "alloc_int.h"

#include <stdio.h>
#include <stdlib.h>

static uint64_t seed_class_size(const ha_params *p, uint64_t size)
{
    (void)p;
    return is_pow2(size) ? size : UINT64_C(1) << (log2u(size) + 1);
}

static uint64_t seed_meta_bytes(const ha_params *p, uint64_t mapped)
{
    (void)p;
    (void)mapped;
    return 0;
}

static void seed_destroy(ha_heap *h)
{
    for (int k = 0; k < 64; k++)
        free(h->lifo[k].v);
}

/* The seed policy's step: HA_OK with *off, or the answer to return. */
static int seed_step(ha_heap *h, uint64_t c, uint32_t k, ha_alloc_result *res, uint64_t *off)
{
    if (!h->collect_answered && h->handed_since_collect >= h->mapped / 8)
        return ha_ask_collect(h, res, HA_COLLECT_TRIGGER);
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
        return ha_ask_collect(h, res, HA_COLLECT_FULL);
    uint64_t need = h->bump + c;
    if (need > h->p.va_size) {
        h->collect_answered = h->asked_answered = false;
        return HA_EVA;
    }
    res->grow_chunks = (uint32_t)((need - h->mapped + h->p.chunk_size - 1) / h->p.chunk_size);
    return HA_NEED_GROW;
}

static int seed_grow(ha_heap *h, uint64_t nm)
{
    h->mapped = nm; /* the new chunks lie above the bump pointer */
    return HA_OK;
}

static void seed_shrink(ha_heap *h, uint64_t nm) { h->mapped = nm; /* the chunks cut lay above the bump pointer */ }

/* Makes room in the LIFO lists for the reclaimed offsets. */
static int seed_reserve(ha_heap *h, const uint64_t *offs, size_t n)
{
    size_t need[64] = {0};
    for (size_t i = 0; i < n; i++) {
        if (i + HA_PREFETCH < n)
            hat_prefetch(&h->tab, offs[i + HA_PREFETCH]);
        need[hat_find(&h->tab, offs[i])->klog]++;
    }
    for (int k = 0; k < 64; k++)
        if (need[k] && hat_vec_reserve(&h->lifo[k], need[k]))
            return HA_ENOMEM;
    return 0;
}

/* Top-of-heap rollback (while the highest reclaimed block ends at the bump
 * pointer, the bump pointer drops to its start), then the LIFO lists in
 * ascending order. */
static uint64_t seed_reclaim(ha_heap *h, const uint64_t *offs, size_t n)
{
    uint64_t total = 0;
    size_t end = n;
    while (end > 0) {
        ha_blk *b = hat_find(&h->tab, offs[end - 1]);
        if (b->off + b->size != h->bump)
            break;
        h->bump = b->off;
        end--;
    }
    bool pf = h->tab.cap >= HA_PREFETCH_CAP;
    for (size_t i = 0; i < n; i++) {
        if (pf && i + 2 * HA_PREFETCH < n)
            hat_prefetch(&h->tab, offs[i + 2 * HA_PREFETCH]);
        ha_blk *b = hat_find(&h->tab, offs[i]);
        uint32_t k = b->klog;
        uint64_t sz = b->size;
        hat_erase(&h->tab, b);
        if (i < end)
            h->lifo[k].v[h->lifo[k].n++] = offs[i]; /* room reserved by seed_reserve */
        total += sz;
    }
    return total;
}

static uint64_t seed_top(const ha_heap *h) { return h->bump; }

#define SFAIL(...)                                                                                                     \
    do {                                                                                                               \
        if (err && errlen)                                                                                             \
            snprintf(err, errlen, __VA_ARGS__);                                                                        \
        return HA_EINVAL;                                                                                              \
    } while (0)

/* Blocks of exact classes below the bump pointer; the free regions: the
 * LIFO entries and [bump, E). */
static int seed_validate(const ha_heap *h, ha_region_fn add, void *data, char *err, size_t errlen)
{
    for (size_t i = 0; i < h->tab.cap; i++) {
        const ha_blk *b = &h->tab.slot[i];
        if (b->off == HA_EMPTY)
            continue;
        if (b->size != UINT64_C(1) << b->klog)
            SFAIL("seed block at %llu has size %llu, not a power of two", (unsigned long long)b->off,
                  (unsigned long long)b->size);
        if (b->off + b->size > h->bump)
            SFAIL("block at %llu (+%llu) ends past the bump pointer", (unsigned long long)b->off,
                  (unsigned long long)b->size);
    }
    if (h->bump % h->p.min_block || h->bump > h->mapped)
        SFAIL("bump %llu is misaligned or past the extent %llu", (unsigned long long)h->bump,
              (unsigned long long)h->mapped);
    for (uint32_t k = 0; k < 64; k++)
        for (size_t i = 0; i < h->lifo[k].n; i++) {
            uint64_t o = h->lifo[k].v[i], sz = UINT64_C(1) << k;
            if (o + sz > h->bump)
                SFAIL("free-list block at %llu ends past the bump pointer", (unsigned long long)o);
            if (add(data, o, sz))
                SFAIL("out of memory while validating");
        }
    if (h->mapped > h->bump && add(data, h->bump, h->mapped - h->bump))
        SFAIL("out of memory while validating");
    return HA_OK;
}

static int seed_alloc(ha_heap *h, uint64_t size, ha_alloc_result *res)
{
    return ha_alloc_with(h, size, res, seed_class_size, seed_step);
}

const ha_policy_ops ha_seed_ops = {
    .class_size = seed_class_size,
    .meta_bytes = seed_meta_bytes,
    .destroy = seed_destroy,
    .alloc = seed_alloc,
    .grow = seed_grow,
    .shrink = seed_shrink,
    .reserve = seed_reserve,
    .reclaim = seed_reclaim,
    .top = seed_top,
    .validate = seed_validate,
    .every_collect_answers = false,
};
