/* alloc_table.c - the allocator core's block table (open addressing from a
 * block's offset to its record), offset vectors and the offset sort (prefix
 * hat_; the structures and their invariants are in alloc_int.h). */
#include "alloc_int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HAT_HUGE (UINT64_C(2) << 20)

void *hat_big_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    size_t bytes = n * size;
    if (bytes < HAT_HUGE)
        return calloc(n ? n : 1, size ? size : 1);
    bytes = (bytes + HAT_HUGE - 1) & ~(size_t)(HAT_HUGE - 1);
    void *p = aligned_alloc(HAT_HUGE, bytes);
    if (!p)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice only: no error to handle */
#endif
    memset(p, 0, bytes);
    return p;
}

int hat_init(ha_table *t, size_t cap, size_t words, uint32_t kmin)
{
    if (cap < 64)
        cap = 64; /* occ: whole words */
    t->slot = hat_big_calloc(cap, sizeof *t->slot);
    t->occ = hat_big_calloc(cap / 64, sizeof(uint64_t));
    t->xheld = words > 1 ? hat_big_calloc(cap * words, sizeof(uint64_t)) : NULL;
    if (!t->slot || !t->occ || (words > 1 && !t->xheld)) {
        free(t->slot);
        free(t->occ);
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

void hat_free(ha_table *t)
{
    free(t->slot);
    free(t->occ);
    free(t->xheld);
    memset(t, 0, sizeof *t);
}

static inline void hat_move(ha_table *t, size_t to, const ha_table *from, size_t i)
{
    t->slot[to] = from->slot[i];
    if (t->words > 1)
        memcpy(&t->xheld[to * t->words], &from->xheld[i * from->words], t->words * sizeof(uint64_t));
}

int hat_grow(ha_table *t)
{
    ha_table n;
    int rc = hat_init(&n, t->cap * 2, t->words, t->kmin);
    if (rc)
        return rc;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slot[i].off == HA_EMPTY)
            continue;
        size_t j = hat_empty_from(&n, hat_hash(&n, t->slot[i].off));
        n.occ[j / 64] |= UINT64_C(1) << (j % 64);
        hat_move(&n, j, t, i);
    }
    n.count = t->count;
    hat_free(t);
    *t = n;
    return 0;
}

/* Makes room for `extra` more records (so that hat_insert cannot fail). */
int hat_reserve_grow(ha_table *t, size_t extra)
{
    while ((t->count + extra) * 2 > t->cap)
        if (hat_grow(t))
            return HA_ENOMEM;
    return 0;
}

void hat_erase(ha_table *t, ha_blk *b)
{
    size_t mask = t->cap - 1;
    size_t i = (size_t)(b - t->slot);
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!((t->occ[j / 64] >> (j % 64)) & 1))
            break;
        size_t home = hat_hash(t, t->slot[j].off);
        /* Move j back to i if its home is not in the cyclic range (i, j]. */
        bool in_range = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!in_range) {
            hat_move(t, i, t, j);
            i = j;
        }
    }
    t->slot[i].off = HA_EMPTY;
    t->occ[i / 64] &= ~(UINT64_C(1) << (i % 64));
    t->count--;
}

/* ---- offset vectors ---------------------------------------------------- */

int hat_vec_reserve(ha_vec *v, size_t extra)
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
void hat_sort_offsets(uint64_t *v, size_t n, uint32_t kmin, uint32_t bits)
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
