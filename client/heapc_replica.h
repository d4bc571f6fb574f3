/* heapc_replica.h - libheapc's replica of its heap's allocator (issue 28:
 * allocation without a message), private to libheapc. Prefix hrp_.
 *
 * The allocator core (daemon/alloc.h) is pure and deterministic, so a rank
 * can run it: fed the same calls as heapd's core of the heap, it makes the
 * same decisions. The replica decides every allocation whose number is not a
 * multiple of the heap's local_every (HeapParams.local_every, L) and that it
 * can place in what is mapped; the others are round trips, and the replica
 * then follows heapd's answer: the round heapd reclaimed there and the
 * collect it ran (HeapOp, applied at their allocation number), the growth
 * (the core asks for the same one), the trim. Its decisions are records
 * (size, offset) that the next request carries (Alloc/Free.decided), which
 * heapd applies and checks: a difference poisons the heap.
 *
 * The replica tracks one rank (ranks = 1) and never reclaims by itself: the
 * core runs under reclaim = collect and not as one decider, as heapd's core
 * of a local_every heap does, so its decisions depend only on the
 * allocation sizes, the rounds and collects heapd sends, growths and trims.
 * A block heapd reclaims is released in the replica (ha_free) just before.
 *
 * Invariants (rep active, not lost):
 *   pos == the rank's next allocation number (heapc's next_seq);
 *   rec[0..2 * nrec) are the decisions rec_from .. pos - 1 not yet carried
 *   to heapd (nrec <= HW_DECIDED_MAX: every L - 1 at most, L <= 4096);
 *   asked != 0 => ha_alloc answered `asked` for allocation pos (the same
 *   answer heapd's core gave or will give there), with grow its chunks.
 * Once lost (a step it cannot follow: an op at another point, an answer
 * that differs, out of memory), it decides nothing more: every allocation
 * is a round trip; its records not yet carried still go. Not thread-safe
 * (heapc's mu). */
#ifndef HEAPC_REPLICA_H
#define HEAPC_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "heapd.pb-c.h"

struct ha_heap;

typedef struct hrp_replica {
    struct ha_heap *core; /* NULL: no replica (heapd decides every allocation) */
    uint32_t every;
    uint64_t va_size; /* heapd refuses a larger allocation without deciding it */
    int lost;
    char why[160]; /* why it was lost */
    uint64_t pos;
    uint64_t *rec;
    size_t nrec;
    uint64_t rec_from;
    int asked;
    uint32_t grow;
    uint64_t local, followed; /* allocations decided here; round trips followed */
} hrp_replica;

/* Starts a replica of a fresh heap (next_seq 0) with heapd's effective
 * parameters hp; every: the heap's local_every. 0, or -1 (out of memory or
 * parameters the core refuses: no replica, why says so). */
int hrp_start(hrp_replica *r, const Heapd__HeapParams *hp, uint32_t every);
void hrp_stop(hrp_replica *r);
/* 1 if allocation pos should be decided here (a replica, not lost, not a
 * multiple of every). */
int hrp_wants(const hrp_replica *r);
/* Decides allocation pos of `size` bytes if it fits below `mapped`: 1 with
 * *off and *bsize (recorded; pos advances), 0 when heapd must decide it
 * (the core asks for a step, or the block would lie past mapped), -1 lost. */
int hrp_decide(hrp_replica *r, uint64_t size, uint64_t mapped, uint64_t *off, uint64_t *bsize);
/* The records to carry: *from, *v (pairs), *nv values (0: none). */
void hrp_records(const hrp_replica *r, uint64_t *from, uint64_t **v, size_t *nv);
/* heapd applied them (the request that carried them succeeded). */
void hrp_records_done(hrp_replica *r);
/* A HeapOp of a reply, for allocation pos of `size` bytes (size: that
 * allocation's, 0 outside one). */
void hrp_op(hrp_replica *r, const Heapd__HeapOp *op, uint64_t size);
/* heapd answered allocation pos with collect_needed (trim: trim_needed). */
void hrp_needed(hrp_replica *r, uint64_t size, int trim);
/* A collect's reply without its blocks (ops_omitted). */
void hrp_lose(hrp_replica *r, const char *why);
/* A trim succeeded at pos (heapc_trim, or a trim_needed). */
void hrp_trimmed(hrp_replica *r);
/* heapd decided allocation pos at off: the replica follows (growth
 * included) and checks that it would decide the same; pos advances. */
void hrp_follow(hrp_replica *r, uint64_t size, uint64_t off);

#endif
