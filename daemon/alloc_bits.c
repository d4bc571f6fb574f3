/* alloc_bits.c - hierarchical bitmaps of the allocator core (prefix hab_;
 * the structure and its invariants are in alloc_int.h). */
#include "alloc_int.h"

#include <stdlib.h>
#include <string.h>

void hab_free(hab_bits *b)
{
    for (uint32_t l = 0; l < HAB_MAXLV; l++)
        free(b->w[l]);
    memset(b, 0, sizeof *b);
}

/* Resizes to nbits (only grows), keeping level 0, rebuilding the rest. */
int hab_resize(hab_bits *b, uint64_t nbits)
{
    if (nbits <= b->nbits && b->nlevels)
        return 0;
    size_t nw[HAB_MAXLV] = {0};
    uint32_t nl = 0;
    size_t n = (size_t)((nbits + 63) / 64);
    if (n == 0)
        n = 1;
    for (;;) {
        nw[nl++] = n;
        if (n == 1 || nl == HAB_MAXLV)
            break;
        n = (n + 63) / 64;
    }
    uint64_t *nwp[HAB_MAXLV] = {0};
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
    hab_free(b);
    b->nbits = nbits;
    b->nlevels = nl;
    for (uint32_t l = 0; l < nl; l++) {
        b->nw[l] = nw[l];
        b->w[l] = nwp[l];
    }
    return 0;
}


/* Lowest / highest set position, or HA_EMPTY. */
uint64_t hab_first(const hab_bits *b)
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

uint64_t hab_last(const hab_bits *b)
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
uint64_t hab_next(const hab_bits *b, uint64_t i)
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

uint64_t hab_prev(const hab_bits *b, uint64_t i)
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
