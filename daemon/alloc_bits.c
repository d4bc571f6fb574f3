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

/* Resizes to at least nbits (only grows, at least doubling), keeping level
 * 0, rebuilding the rest. */
int hab_resize(hab_bits *b, uint64_t nbits)
{
    if (nbits <= b->nbits && b->nlevels)
        return 0;
    /* Growths come one chunk at a time: at least double, so that a run of
     * them costs O(final size) in copies, not O(size) each (the positions
     * beyond the caller's are never set). */
    if (b->nlevels && nbits < 2 * b->nbits)
        nbits = 2 * b->nbits;
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
        nwp[l] = hat_big_calloc(nw[l], sizeof(uint64_t));
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
