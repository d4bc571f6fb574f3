/* status.h - the status page: one small shared-memory page per heap and rank
 * that heapd writes and the rank's client maps read-only, so that a memory
 * probe is a load, not a syscall or a driver call.
 *
 * Layout (version 1), shared between heapd and libheapc; all fields are
 * naturally aligned 64-bit words so that loads are single-copy atomic.
 *
 * Consistency: a sequence counter (seqlock). The writer makes `seq` odd,
 * writes the fields, then makes `seq` even (release stores); a reader copies
 * the fields between two loads of `seq` (acquire) and retries while the two
 * differ or are odd. Only heapd writes; readers never block it.
 *
 * Invariants of a consistent snapshot: mapped = live + released + free
 * (heap bytes of this heap as seen by this rank's node); device_free <=
 * device_total; epoch identifies the heap incarnation.
 */
#ifndef HEAPD_STATUS_H
#define HEAPD_STATUS_H

#include <stdint.h>

#define HS_MAGIC     0x68656170647374ULL /* "heapdst" */
#define HS_VERSION   1u
#define HS_PAGE_SIZE 4096u

typedef struct hs_page {
    uint64_t magic;         /* HS_MAGIC */
    uint64_t version;       /* HS_VERSION */
    uint64_t seq;           /* seqlock: odd while heapd writes */
    uint64_t rank;          /* the rank this page belongs to */
    uint64_t mapped;        /* heap bytes mapped per rank */
    uint64_t live;          /* bytes of blocks some rank still holds */
    uint64_t released;      /* bytes every rank released, awaiting collect */
    uint64_t free;          /* bytes available to allocations */
    uint64_t rank_held;     /* bytes this rank holds */
    uint64_t rank_released; /* bytes this rank released, not yet reclaimed */
    uint64_t collects;
    uint64_t growths;
    uint64_t allocs;      /* allocations decided */
    uint64_t epoch;       /* heap incarnation */
    uint64_t device_free; /* device (host backend: host) free bytes, sampled */
    uint64_t device_total;
    uint64_t device_sampled_ns; /* CLOCK_MONOTONIC time of that sample */
    uint64_t updates;           /* number of completed writes */
    /* Appended by issue 18 (still version 1: an older heapd leaves them 0,
     * an older reader stops before them). */
    uint64_t collects_skipped;     /* collects the allocator did not ask for */
    uint64_t stream_waiting;       /* this rank's blocks waiting for their stream
                                      (as of its last collect) */
    uint64_t device_waits_avoided; /* this rank's collects without a device sync */
    /* Appended by issue 30 (still version 1). state: the heap's HS_STATE_*
     * on this node; resident: this rank's chunk bytes backed by memory now
     * (mapped while active, 0 while released). */
    uint64_t state;
    uint64_t resident;
    uint64_t releases;
    uint64_t restores;
} hs_page;

/* hs_page.state: the protocol's HeapState values. */
#define HS_STATE_ACTIVE    0u
#define HS_STATE_RELEASING 1u
#define HS_STATE_RELEASED  2u
#define HS_STATE_RESTORING 3u

#endif
