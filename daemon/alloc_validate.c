/* alloc_validate.c - ha_validate: every invariant written above the
 * structs in alloc_int.h, checked from scratch. */
#include "alloc_int.h"

#include <stdio.h>
#include <stdlib.h>

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

#define VFAIL(...)                                                                                                     \
    do {                                                                                                               \
        if (err && errlen)                                                                                             \
            snprintf(err, errlen, __VA_ARGS__);                                                                        \
        rc = HA_EINVAL;                                                                                                \
        goto out;                                                                                                      \
    } while (0)

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
        if (((h->tab.occ[i / 64] >> (i % 64)) & 1) != (b->off != HA_EMPTY))
            VFAIL("table slot %zu: occupancy bit %d but %s", i, (int)((h->tab.occ[i / 64] >> (i % 64)) & 1),
                  b->off == HA_EMPTY ? "no record" : "a record");
        if (b->off == HA_EMPTY)
            continue;
        count++;
        uint64_t sz = b->size;
        const char *what = "block";
        if (sz == 0 || sz % h->p.min_block || b->klog != log2u(sz))
            VFAIL("%s at %llu has size %llu (class 2^%u): not a multiple of min_block or a wrong class", what,
                  (unsigned long long)b->off, (unsigned long long)sz, b->klog);
        if (b->klog < h->kmin || b->klog > h->kmax)
            VFAIL("%s at %llu has class 2^%u outside 2^%u..2^%u", what, (unsigned long long)b->off, b->klog, h->kmin,
                  h->kmax);
        if (!co && sz != UINT64_C(1) << b->klog)
            VFAIL("seed block at %llu has size %llu, not a power of two", (unsigned long long)b->off,
                  (unsigned long long)sz);
        if (b->off % h->p.min_block)
            VFAIL("%s at %llu is not aligned to min_block", what, (unsigned long long)b->off);
        if (b->off + sz > (!co ? h->bump : h->mapped) || b->off + sz < b->off)
            VFAIL("%s at %llu (+%llu) ends past the %s", what, (unsigned long long)b->off, (unsigned long long)sz,
                  !co ? "bump pointer" : "extent");
        if (hat_find(&h->tab, b->off) != b)
            VFAIL("%s at %llu is not reachable in the table", what, (unsigned long long)b->off);
        if (b->mark)
            VFAIL("%s at %llu carries a stale mark", what, (unsigned long long)b->off);
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
                VFAIL("block at %llu has held bits for ranks >= %u", (unsigned long long)b->off, h->p.ranks);
        }
        if (nheld + b->nrel != h->p.ranks)
            VFAIL("block at %llu: %u holders + %u releases != %u ranks", (unsigned long long)b->off, nheld, b->nrel,
                  h->p.ranks);
        if ((b->nrel == h->p.ranks) != (b->pending == 1))
            VFAIL("block at %llu: pending flag %u but %u of %u ranks released", (unsigned long long)b->off, b->pending,
                  b->nrel, h->p.ranks);
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
    if (count * 2 > h->tab.cap || (h->tab.cap & (h->tab.cap - 1)))
        VFAIL("table holds %zu records in %zu slots: over half full or not a power of two", count, h->tab.cap);
    if (npend != h->pending.n)
        VFAIL("%zu pending records but the pending list has %zu", npend, h->pending.n);
    for (size_t i = 0; i < h->pending.n; i++) {
        const ha_blk *b = hat_find(&h->tab, h->pending.v[i]);
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
                uint64_t e = hab_next(&h->fend, u);
                if (u >= h->fstart.nbits || e == HA_EMPTY || ((e + 1) << h->kmin) > h->mapped)
                    VFAIL("free extent at %llu has no end inside the extent", (unsigned long long)(u << h->kmin));
                uint64_t o = u << h->kmin, sz = (e - u + 1) << h->kmin;
                uint32_t k = log2u(sz);
                if (k < h->kmin || k > h->kmax || !hab_test(&h->freebits[k], o >> k))
                    VFAIL("free extent at %llu (+%llu) is missing from the bitmap of its bin 2^%u",
                          (unsigned long long)o, (unsigned long long)sz, k);
                if (hab_next(&h->fstart, u + 1) <= e)
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
        const hab_bits *all[66];
        uint64_t want[66];
        uint32_t na = 0;
        all[na] = &h->fstart;
        want[na++] = nfx;
        all[na] = &h->fend;
        want[na++] = nfx;
        for (uint32_t k = h->kmin; k <= h->kmax; k++) {
            if ((nbin[k] != 0) != ((h->binmask >> k) & 1))
                VFAIL("bin 2^%u: the mask of non-empty bins is stale", k);
            if (nbin[k] && (h->bin_lo[k] != hab_first(&h->freebits[k]) || h->bin_hi[k] != hab_last(&h->freebits[k])))
                VFAIL("bin 2^%u: the cached lowest or highest extent is stale", k);
            for (int d = 0; d < 2; d++) {
                const hac_fx *c = d ? &h->bin_hi_fx[k] : &h->bin_lo_fx[k];
                uint64_t w = d ? h->bin_hi[k] : h->bin_lo[k];
                if (!c->size)
                    continue;
                uint64_t u = c->off >> h->kmin, e = hab_next(&h->fend, u);
                if (!nbin[k] || w == HA_EMPTY || c->off >> k != w || c->off % h->p.min_block ||
                    !hab_test(&h->fstart, u) || e == HA_EMPTY || ((e - u + 1) << h->kmin) != c->size ||
                    log2u(c->size) != k)
                    VFAIL("bin 2^%u: the cached %s extent (%llu, +%llu) is not the free extent of "
                          "window %llu",
                          k, d ? "highest" : "lowest", (unsigned long long)c->off, (unsigned long long)c->size,
                          (unsigned long long)w);
            }
            if (nbin[k] && h->lo_key[k] != (h->bin_lo_fx[k].size ? h->bin_lo_fx[k].off : h->bin_lo[k] << k))
                VFAIL("bin 2^%u: the key of its lowest extent is stale", k);
            if (nbin[k] && h->hi_key[k] != (h->bin_hi_fx[k].size ? h->bin_hi_fx[k].off + h->bin_hi_fx[k].size
                                                                 : (h->bin_hi[k] + 3) << k))
                VFAIL("bin 2^%u: the key of its highest extent is stale", k);
            if (nbin[k] != h->nbin[k])
                VFAIL("bin 2^%u holds %llu free extents but its count says %llu", k, (unsigned long long)nbin[k],
                      (unsigned long long)h->nbin[k]);
            all[na] = &h->freebits[k];
            want[na++] = nbin[k];
        }
        for (uint32_t a = 0; a < na; a++) {
            const hab_bits *b = all[a];
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
                VFAIL("free bitmap %u has %llu bits set for %llu free extents", a, (unsigned long long)bits,
                      (unsigned long long)want[a]);
        }
    }
    if (live != h->live_bytes || pend != h->pending_bytes || fr != h->free_bytes)
        VFAIL("counters live=%llu pending=%llu free=%llu, counted %llu %llu %llu", (unsigned long long)h->live_bytes,
              (unsigned long long)h->pending_bytes, (unsigned long long)h->free_bytes, (unsigned long long)live,
              (unsigned long long)pend, (unsigned long long)fr);
    for (uint32_t r = 0; r < h->p.ranks; r++)
        if (held[r] != h->live_bytes + h->pending_bytes - h->rel_bytes[r] || rel[r] != h->rel_bytes[r])
            VFAIL("rank %u: counters held=%llu released=%llu, counted %llu %llu", r,
                  (unsigned long long)(h->live_bytes + h->pending_bytes - h->rel_bytes[r]),
                  (unsigned long long)h->rel_bytes[r], (unsigned long long)held[r], (unsigned long long)rel[r]);
    if (n)
        qsort(v, n, sizeof *v, cmp_iv);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].off != at)
            VFAIL("%s at %llu (+%llu) %s the previous region, which ends at %llu", v[i].kind ? "free block" : "block",
                  (unsigned long long)v[i].off, (unsigned long long)v[i].size,
                  v[i].off < at ? "overlaps" : "leaves a gap after", (unsigned long long)at);
        if (co && i && v[i].kind && v[i - 1].kind)
            VFAIL("free extents at %llu and %llu are adjacent (not merged)", (unsigned long long)v[i - 1].off,
                  (unsigned long long)v[i].off);
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
