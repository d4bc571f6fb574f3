/* poison.c - the heap wing's poison: a heap whose ranks asked for different
 * sizes as their n-th allocation (sequence.c detects it) answers every later
 * call of every rank with the same ERR_ASYMMETRY, its structured fields
 * (hd_asym_out: n, the ranks, their sizes) and its message (see heap.h). */
#include "heap_int.h"

#include <stdio.h>

#include "log.h"

void hh_poison_set(hd_heap *h, uint64_t n, uint32_t first, uint64_t first_size, uint32_t rank, uint64_t size)
{
    hd_asym_out *p = &h->poison;
    p->n = n;
    p->nranks = HD_ASYM_RANKS;
    p->ranks[0] = first;
    p->sizes[0] = first_size;
    p->ranks[1] = rank;
    p->sizes[1] = size;
    snprintf(h->poison_msg, sizeof h->poison_msg,
             "asymmetric allocation %llu on heap \"%s\": rank %u asked for %llu bytes, rank %u for %llu; every "
             "rank must make the same allocations in the same order. The heap is poisoned: every call on it "
             "fails with this error; detach every rank and start again",
             (unsigned long long)n, h->name, rank, (unsigned long long)size, first, (unsigned long long)first_size);
    hd_warn("heap \"%s\" poisoned: allocation %llu was %llu bytes on rank %u, %llu on rank %u", h->name,
            (unsigned long long)n, (unsigned long long)first_size, first, (unsigned long long)size, rank);
}

void hh_poison_replica(hd_heap *h, uint64_t n, uint32_t rank, uint64_t size, uint64_t said, uint64_t decided,
                       const char *why)
{
    hd_asym_out *p = &h->poison;
    p->n = n;
    p->nranks = HD_ASYM_RANKS;
    p->ranks[0] = p->ranks[1] = rank;
    p->sizes[0] = p->sizes[1] = size;
    h->poison_replica = true;
    char where[64];
    snprintf(where, sizeof where, "places it at offset %llu", (unsigned long long)decided);
    snprintf(h->poison_msg, sizeof h->poison_msg,
             "allocation %llu on heap \"%s\": rank %u's libheapc decided it (%llu bytes) at offset %llu, but heapd's "
             "allocator %s: libheapc's replica differs from heapd (a bug, or a program that writes libheapc's "
             "memory). The heap is poisoned: every call on it fails with this error; detach every rank and start "
             "again (HEAPC_DECIDE=daemon makes heapd decide every allocation)",
             (unsigned long long)n, h->name, rank, (unsigned long long)size, (unsigned long long)said,
             why && why[0] ? why : where);
    hd_warn("heap \"%s\" poisoned: rank %u's replica decided allocation %llu at offset %llu; heapd: %s", h->name, rank,
            (unsigned long long)n, (unsigned long long)said, why && why[0] ? why : where);
}

void hh_poison_reply(const hd_heap *h, hd_peer *c, uint64_t id)
{
    c->out->error(c, id, HEAPD__ERR_CODE__ERR_ASYMMETRY, h->poison_msg, &h->poison);
}

bool hh_poison_check(const hd_heap *h, hd_peer *c, uint64_t id)
{
    if (!hh_poisoned(h))
        return false;
    hh_poison_reply(h, c, id);
    return true;
}
