/* heapc_replica.c - libheapc's replica of its heap's allocator (issue 28);
 * heapc_replica.h has the model and its invariants. */
#include "heapc_replica.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "policy.h"
#include "wire.h"

int hrp_start(hrp_replica *r, const Heapd__HeapParams *hp, uint32_t every)
{
    memset(r, 0, sizeof *r);
    if (!every || every > HW_DECIDED_MAX || hpo_from_wire(hp->policy) < 0)
        return -1;
    ha_params p;
    memset(&p, 0, sizeof p);
    p.ranks = 1;
    p.chunk_size = hp->chunk_size;
    p.initial_size = hp->initial_size;
    p.va_size = hp->va_size;
    p.min_block = hp->min_block;
    p.policy = (ha_policy)hpo_from_wire(hp->policy);
    p.reclaim = HA_RECLAIM_COLLECT; /* heapd's core of a local_every heap: rounds and collects only */
    p.one_decider = false;
    p.trim_threshold = hp->trim_threshold == UINT64_MAX ? 0 : hp->trim_threshold;
    p.extent_bound = hp->extent_bound;
    r->rec = malloc(2 * (size_t)every * sizeof *r->rec);
    if (!r->rec || ha_create(&p, &r->core, r->why, sizeof r->why) != HA_OK) {
        free(r->rec);
        memset(r, 0, sizeof *r);
        return -1;
    }
    r->every = every;
    r->va_size = p.va_size;
    return 0;
}

void hrp_stop(hrp_replica *r)
{
    if (r->core)
        ha_destroy(r->core);
    free(r->rec);
    memset(r, 0, sizeof *r);
}

void hrp_lose(hrp_replica *r, const char *why)
{
    if (!r->core || r->lost)
        return;
    r->lost = 1;
    snprintf(r->why, sizeof r->why, "%s", why);
}

int hrp_wants(const hrp_replica *r) { return r->core && !r->lost && !r->asked && r->pos % r->every != 0; }

int hrp_decide(hrp_replica *r, uint64_t size, uint64_t mapped, uint64_t *off, uint64_t *bsize)
{
    if (r->nrec >= r->every || size > r->va_size) /* records not carried yet (a round trip failed), */
        return 0;                                 /* or heapd refuses it undecided: heapd answers */
    ha_alloc_result res;
    int rc = ha_alloc(r->core, size, &res);
    if (rc == HA_NEED_COLLECT || rc == HA_NEED_GROW || rc == HA_NEED_TRIM) {
        r->asked = rc; /* heapd's core answers the same there */
        r->grow = res.grow_chunks;
        return 0;
    }
    if (rc != HA_OK) {
        hrp_lose(r, rc == HA_EVA ? "an allocation did not fit the heap's va_size" : "out of memory");
        return -1;
    }
    if (res.offset > mapped || size > mapped - res.offset) {
        hrp_lose(r, "it placed a block past the mapped extent");
        return -1;
    }
    if (r->nrec == 0)
        r->rec_from = r->pos;
    r->rec[2 * r->nrec] = size;
    r->rec[2 * r->nrec + 1] = res.offset;
    r->nrec++;
    r->pos++;
    r->local++;
    *off = res.offset;
    *bsize = res.block_size;
    return 1;
}

void hrp_records(const hrp_replica *r, uint64_t *from, uint64_t **v, size_t *nv)
{
    *from = r->rec_from;
    *v = r->rec;
    *nv = 2 * r->nrec;
}

void hrp_records_done(hrp_replica *r)
{
    r->rec_from += r->nrec;
    r->nrec = 0;
}

/* Asks the core for allocation pos as heapd's did (want: its answer). */
static int ask(hrp_replica *r, uint64_t size, int want)
{
    if (r->asked == want)
        return 0;
    ha_alloc_result res;
    if (r->asked || !size || ha_alloc(r->core, size, &res) != want) {
        hrp_lose(r, "heapd asked for a step its replica did not");
        return -1;
    }
    r->asked = want;
    return 0;
}

void hrp_op(hrp_replica *r, const Heapd__HeapOp *op, uint64_t size)
{
    if (!r->core || r->lost)
        return;
    if (op->at != r->pos || ((!op->collect || !op->asked) && r->asked) ||
        (op->asked && ask(r, size, HA_NEED_COLLECT))) {
        hrp_lose(r, "heapd reclaimed at an allocation number it could not follow");
        return;
    }
    char why[160];
    for (size_t i = 0; i < op->n_offsets; i++) {
        if (ha_free(r->core, 0, op->offsets[i]) != HA_OK) {
            snprintf(why, sizeof why, "heapd reclaimed a block it does not hold (offset %llu, at %llu)",
                     (unsigned long long)op->offsets[i], (unsigned long long)op->at);
            hrp_lose(r, why);
            return;
        }
    }
    int rc = op->collect ? ha_collect_apply(r->core, op->offsets, op->n_offsets, NULL)
                         : ha_reclaim_apply(r->core, op->offsets, op->n_offsets, NULL);
    if (rc != HA_OK) {
        snprintf(why, sizeof why, "heapd's reclaim of %zu blocks at %llu does not apply to it (%s)", op->n_offsets,
                 (unsigned long long)op->at, ha_strerror(rc));
        hrp_lose(r, why);
        return;
    }
    if (op->collect)
        r->asked = 0; /* heapd asks its core again after a collect */
}

void hrp_needed(hrp_replica *r, uint64_t size, int trim)
{
    /* A collect: its op says whether the allocator asked for it (an
     * operator's forced collect it did not). */
    if (r->core && !r->lost && trim)
        (void)ask(r, size, HA_NEED_TRIM);
}

static void no_chunk(void *data, uint32_t index) { (void)data, (void)index; }

void hrp_trimmed(hrp_replica *r)
{
    if (!r->core || r->lost)
        return;
    if ((r->asked && r->asked != HA_NEED_TRIM) || ha_trim(r->core, NULL, no_chunk, NULL) != HA_OK) {
        hrp_lose(r, "heapd trimmed where it could not follow");
        return;
    }
    r->asked = 0;
}

void hrp_follow(hrp_replica *r, uint64_t size, uint64_t off)
{
    if (!r->core || r->lost)
        return;
    ha_alloc_result res = {0};
    int rc = r->asked;
    res.grow_chunks = r->grow;
    if (rc == 0)
        rc = ha_alloc(r->core, size, &res);
    for (int i = 0; rc == HA_NEED_GROW && i < 4; i++) {
        if (ha_grow(r->core, res.grow_chunks) != HA_OK)
            break;
        rc = ha_alloc(r->core, size, &res);
    }
    r->asked = 0;
    if (rc != HA_OK || res.offset != off) {
        char why[128];
        snprintf(why, sizeof why, "allocation %llu: heapd placed it at %llu, the replica %s",
                 (unsigned long long)r->pos, (unsigned long long)off, rc == HA_OK ? "elsewhere" : "could not");
        hrp_lose(r, why);
        return;
    }
    r->pos++;
    r->followed++;
    if (r->nrec == 0)
        r->rec_from = r->pos;
}
