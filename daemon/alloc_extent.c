/* alloc_extent.c - extent bounds (issue 32, ha_params.extent_bound; prefix
 * hae_): the chunk indices where an extent starts, so that the coalesce
 * policy never merges free space across one and no block straddles two
 * extents (NCCL registers each extent as one window). An extent is the
 * initial chunks or one run of chunks one growth mapped; its bound and the
 * chunk after it are marked. A trimmed chunk keeps its marks until a growth
 * maps it again (a mark there keeps nothing apart: no free space, no block);
 * that growth's run then drops the marks inside it. */
#include "alloc_int.h"

static int mark(ha_heap *h, uint64_t i)
{
    if (i >= h->bounds.nbits && hab_resize(&h->bounds, i + 1))
        return HA_ENOMEM;
    hab_set(&h->bounds, i);
    return HA_OK;
}

int hae_create(ha_heap *h)
{
    if (!h->p.extent_bound)
        return HA_OK;
    if (mark(h, 0) || mark(h, h->mapped / h->p.chunk_size))
        return HA_ENOMEM;
    return HA_OK;
}

int hae_grow(ha_heap *h, uint64_t refill, uint64_t from, uint64_t to)
{
    if (!h->p.extent_bound)
        return HA_OK;
    if (from < to && (mark(h, to) || mark(h, from)))
        return HA_ENOMEM;
    /* One extent: the marks of earlier extents there (trimmed since) go. */
    for (uint64_t i = from < to ? hab_next(&h->bounds, from + 1) : HA_EMPTY; i < to; i = hab_next(&h->bounds, i + 1))
        hab_clear(&h->bounds, i);
    uint64_t i = 0;
    for (uint64_t n = 0; n < refill; n++, i++) { /* the holes ha_grow refills: the lowest */
        i = hab_next(&h->holes, i);
        if (mark(h, i + 1) || mark(h, i))
            return HA_ENOMEM;
    }
    return HA_OK;
}
