/* alloc_validate.c - ha_validate: every invariant written above the
 * structs in alloc_int.h, checked from scratch: the blocks, the counters
 * and the tiling here, each policy's own structures through its table's
 * validate. */
#include "alloc_int.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- validator ----------------------------------------------------------- */

typedef struct iv {
    uint64_t off, size;
    int kind; /* 0 block, 1 free, 2 hole (issue 30) */
} iv;

typedef struct iv_vec {
    iv *v;
    size_t n, cap;
} iv_vec;

static int iv_push(iv_vec *a, uint64_t off, uint64_t size, int kind)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 1024;
        iv *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (iv){off, size, kind};
    return 0;
}

/* The policy's free regions (ha_region_fn). */
static int add_free(void *data, uint64_t off, uint64_t size) { return iv_push(data, off, size, 1); }

static int cmp_iv(const void *a, const void *b)
{
    const iv *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

#define VFAIL(...)                                                                                                     \
    do {                                                                                                               \
        if (err && errlen)                                                                                             \
            snprintf(err, errlen, __VA_ARGS__);                                                                        \
        rc = HA_EINVAL;                                                                                                \
        goto out;                                                                                                      \
    } while (0)

#define BFAIL(...)                                                                                                     \
    do {                                                                                                               \
        if (err && errlen)                                                                                             \
            snprintf(err, errlen, __VA_ARGS__);                                                                        \
        return HA_EINVAL;                                                                                              \
    } while (0)

/* One block record b: its size, class, place, holder bits and flags; adds
 * its size to held[r] or rel[r] for every rank r. */
static int check_block(const ha_heap *h, const ha_blk *b, uint64_t *held, uint64_t *rel, char *err, size_t errlen)
{
    uint64_t sz = b->size;
    const char *what = "block";
    if (sz == 0 || sz % h->p.min_block || b->klog != log2u(sz))
        BFAIL("%s at %llu has size %llu (class 2^%u): not a multiple of min_block or a wrong class", what,
              (unsigned long long)b->off, (unsigned long long)sz, b->klog);
    if (b->klog < h->kmin || b->klog > h->kmax)
        BFAIL("%s at %llu has class 2^%u outside 2^%u..2^%u", what, (unsigned long long)b->off, b->klog, h->kmin,
              h->kmax);
    if (b->off % h->p.min_block)
        BFAIL("%s at %llu is not aligned to min_block", what, (unsigned long long)b->off);
    if (b->off + sz > h->mapped || b->off + sz < b->off)
        BFAIL("%s at %llu (+%llu) ends past the extent", what, (unsigned long long)b->off, (unsigned long long)sz);
    if (hat_find(&h->tab, b->off) != b)
        BFAIL("%s at %llu is not reachable in the table", what, (unsigned long long)b->off);
    if (b->mark)
        BFAIL("%s at %llu carries a stale mark", what, (unsigned long long)b->off);
    const uint64_t *hw = hat_held(&h->tab, b);
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
            BFAIL("block at %llu has held bits for ranks >= %u", (unsigned long long)b->off, h->p.ranks);
    }
    if (nheld + b->nrel != h->p.ranks)
        BFAIL("block at %llu: %u holders + %u releases != %u ranks", (unsigned long long)b->off, nheld, b->nrel,
              h->p.ranks);
    if ((b->nrel == h->p.ranks) != (b->pending == 1))
        BFAIL("block at %llu: pending flag %u but %u of %u ranks released", (unsigned long long)b->off, b->pending,
              b->nrel, h->p.ranks);
    return HA_OK;
}

/* Issue 30's holes: their count, each inside the extent and not its last
 * chunk (unless the extent is one chunk), none under the seed policy; each
 * hole's chunk joins the tiling (kind 2). */
static int check_holes(const ha_heap *h, iv_vec *a, char *err, size_t errlen)
{
    uint64_t cs = h->p.chunk_size, n = 0, nch = h->mapped / cs;
    for (uint64_t i = hab_first(&h->holes); i != HA_EMPTY; i = hab_next(&h->holes, i + 1)) {
        if (i >= nch || (i + 1 == nch && nch > 1))
            BFAIL("hole at chunk %llu: the extent has %llu chunks (a hole lies inside it, never at its end)",
                  (unsigned long long)i, (unsigned long long)nch);
        if (iv_push(a, i * cs, cs, 2))
            BFAIL("out of memory while validating");
        n++;
    }
    if (n != h->nholes)
        BFAIL("%llu holes but the count says %llu", (unsigned long long)n, (unsigned long long)h->nholes);
    if (n && !h->ops->punch)
        BFAIL("%llu holes under policy %s, which makes none", (unsigned long long)n, ha_policy_name(h->p.policy));
    return HA_OK;
}

int ha_validate(const ha_heap *h, char *err, size_t errlen)
{
    int rc = HA_OK;
    iv_vec a = {0};
    uint64_t *held = NULL, *rel = NULL;
    held = calloc(h->p.ranks, sizeof(uint64_t));
    rel = calloc(h->p.ranks, sizeof(uint64_t));
    if (!held || !rel)
        VFAIL("out of memory while validating");
    if (h->ops != ha_policy_ops_of(h->p.policy))
        VFAIL("policy %u: the heap's table is not the policy's", (unsigned)h->p.policy);

    uint64_t live = 0, pend = 0, fr = 0;
    size_t npend = 0, count = 0;
    for (size_t i = 0; i < h->tab.cap; i++) {
        const ha_blk *b = &h->tab.slot[i];
        if (((h->tab.occ[i / 64] >> (i % 64)) & 1) != (b->off != HA_EMPTY))
            VFAIL("table slot %zu: occupancy bit %d but %s", i, (int)((h->tab.occ[i / 64] >> (i % 64)) & 1),
                  b->off == HA_EMPTY ? "no record" : "a record");
        if (b->off == HA_EMPTY)
            continue;
        count++;
        uint64_t sz = b->size;
        rc = check_block(h, b, held, rel, err, errlen);
        if (rc)
            goto out;
        if (b->pending) {
            pend += sz;
            npend++;
        } else {
            live += sz;
        }
        if (iv_push(&a, b->off, sz, 0))
            VFAIL("out of memory while validating");
    }
    if (count != h->tab.count)
        VFAIL("table counts %zu records but holds %zu", h->tab.count, count);
    if (count * 2 > h->tab.cap || (h->tab.cap & (h->tab.cap - 1)))
        VFAIL("table holds %zu records in %zu slots: over half full or not a power of two", count, h->tab.cap);
    if (npend != h->pending.n)
        VFAIL("%zu pending records but the pending list has %zu", npend, h->pending.n);
    for (size_t i = 0; i < h->pending.n; i++) {
        const ha_blk *b = hat_find(&h->tab, h->pending.v[i]);
        if (!b || !b->pending)
            VFAIL("pending list entry %llu is not a pending block", (unsigned long long)h->pending.v[i]);
    }

    size_t nblocks = a.n;
    rc = h->ops->validate(h, add_free, &a, err, errlen);
    if (rc)
        goto out;
    for (size_t i = nblocks; i < a.n; i++)
        fr += a.v[i].size;
    if (live != h->live_bytes || pend != h->pending_bytes || fr != h->free_bytes)
        VFAIL("counters live=%llu pending=%llu free=%llu, counted %llu %llu %llu", (unsigned long long)h->live_bytes,
              (unsigned long long)h->pending_bytes, (unsigned long long)h->free_bytes, (unsigned long long)live,
              (unsigned long long)pend, (unsigned long long)fr);
    for (uint32_t r = 0; r < h->p.ranks; r++)
        if (held[r] != h->live_bytes + h->pending_bytes - h->rel_bytes[r] || rel[r] != h->rel_bytes[r])
            VFAIL("rank %u: counters held=%llu released=%llu, counted %llu %llu", r,
                  (unsigned long long)(h->live_bytes + h->pending_bytes - h->rel_bytes[r]),
                  (unsigned long long)h->rel_bytes[r], (unsigned long long)held[r], (unsigned long long)rel[r]);
    rc = check_holes(h, &a, err, errlen);
    if (rc)
        goto out;
    iv *v = a.v;
    size_t n = a.n;
    if (n)
        qsort(v, n, sizeof *v, cmp_iv);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].off != at)
            VFAIL("%s at %llu (+%llu) %s the previous region, which ends at %llu",
                  v[i].kind == 2 ? "hole"
                  : v[i].kind    ? "free block"
                                 : "block",
                  (unsigned long long)v[i].off, (unsigned long long)v[i].size,
                  v[i].off < at ? "overlaps" : "leaves a gap after", (unsigned long long)at);
        at += v[i].size;
    }
    uint64_t hb = h->nholes * h->p.chunk_size;
    if (h->mapped - hb != h->p.initial_size + h->grown_bytes - h->trimmed_bytes || h->mapped < h->p.chunk_size)
        VFAIL("the extent is %llu bytes with %llu in holes but initial %llu + grown %llu - trimmed %llu (and at least "
              "one chunk, %llu)",
              (unsigned long long)h->mapped, (unsigned long long)hb, (unsigned long long)h->p.initial_size,
              (unsigned long long)h->grown_bytes, (unsigned long long)h->trimmed_bytes,
              (unsigned long long)h->p.chunk_size);
    if (at != h->mapped)
        VFAIL("blocks and free space cover %llu bytes but the extent is %llu", (unsigned long long)at,
              (unsigned long long)h->mapped);
out:
    free(a.v);
    free(held);
    free(rel);
    return rc;
}
