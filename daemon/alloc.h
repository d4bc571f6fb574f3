/* alloc.h - the symmetric allocator core.
 *
 * One ha_heap is the bookkeeping of one symmetric heap as seen by one node:
 * the offset space shared by every rank (free blocks, extent) and, per rank
 * this core tracks, which blocks the rank still holds and which it released.
 *
 * What this module promises:
 *   - Pure and deterministic: no I/O, no CUDA, no clock, no locks, no
 *     globals. Two heaps built with the same parameters and fed the same
 *     sequence of calls make the same decisions, byte for byte. That is what
 *     keeps offsets symmetric: every node (and heapsim) runs this same code.
 *   - It never grows the heap or collects by itself. ha_alloc() answers
 *     HA_NEED_COLLECT or HA_NEED_GROW and the caller makes that happen
 *     (collectively, across ranks and nodes), then calls ha_alloc() again.
 *   - Frees are deferred: ha_free() only records that a rank released a
 *     block. A block is reused only after every rank released it: under
 *     reclaim = collect after a collect that follows those releases
 *     (ha_collect / ha_collect_apply), under reclaim = eager (one decider)
 *     from the release that completes it on.
 *   - Cost of ha_alloc and ha_free does not grow with the number of live
 *     blocks (one hash lookup into 32-byte records that carry the holder
 *     bits of up to 64 ranks; per-bin hierarchical bitmaps, O(levels), or
 *     LIFO lists), nor, up to 64 ranks, with the ranks (no per-rank counter
 *     changes at an allocation; beyond 64, ranks / 64 words of holder bits).
 *     A collect costs O(k) in the k blocks it reclaims (radix sort) plus
 *     O(ranks) once.
 *   - Errors are negative codes (ha_strerror gives a sentence); nothing is
 *     printed. A failed call leaves the heap unchanged.
 *   - Not thread-safe: one heap is driven by one thread.
 *
 * The alloc protocol, as the daemon and heapsim drive it:
 *
 *     for (;;) {
 *         rc = ha_alloc(h, size, &res);
 *         if (rc == HA_NEED_COLLECT) { every rank collects; ha_collect(h); continue; }
 *         if (rc == HA_NEED_GROW)    { create res.grow_chunks chunks (ha_grow_plan's indices);
 *                                      ha_grow(h, res.grow_chunks); continue; }
 *         break;   // HA_OK: res.offset, res.block_size; or an error
 *     }
 *
 * Once ha_alloc has asked for a collect and a collect has run, it does not
 * ask again until an allocation succeeds or fails with HA_EVA, so the loop
 * terminates: collect, then (only if still needed) grow, then succeed or
 * fail. Under the coalesce policy every collect answers, the ones the caller
 * runs on its own (explicit, forced) included, and no collect is asked for
 * while no block exists (a fresh heap grows at once): a collect that can
 * reclaim nothing is never asked for. (When the heap cannot grow, va_size
 * reached, the seed's rule decides: a collect rather than HA_EVA.) Under the seed policy a collect the
 * caller runs on its own does not count (the seed's algorithm, unchanged).
 * These decisions depend only
 * on the allocation sequence and collects, never on which rank released what
 * when, so every node of a multi-node heap decides alike.
 */
#ifndef HEAPD_ALLOC_H
#define HEAPD_ALLOC_H

#include "policy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HA_MAX_RANKS 4096u

/* The policies (the rows of common/policy.h, in its order; each one's
 * algorithm in its file, alloc_<name>.c, behind an ha_policy_ops table,
 * alloc_int.h):
 *
 * coalesce (HA_POLICY_COALESCE, 0) - the default. Exact sizes (the next
 *   multiple of min_block), free extents merged with their free neighbours
 *   when reclaimed; address-ordered first fit; a block of a size bin whose
 *   blocks nearly all (98%) die before a collect, and every block of at
 *   least mapped / 16, is placed from the top of the heap down, the others
 *   from the bottom up; a collect before growing, and a compaction collect
 *   once half the heap was handed out since the last one and a bottom-up
 *   block would land more than half the heap above what that collect left in
 *   use, or once an eighth was handed out before a block of at least an
 *   eighth of the heap (alloc_coalesce.c).
 * seed (HA_POLICY_SEED, 1) - the seed pull request's final algorithm: exact
 *   power-of-two classes with LIFO free lists, a bump pointer aligned to
 *   min_block, top-of-heap rollback at collect, collect when the bytes handed
 *   out since the last collect reach mapped / 8, collect before growing
 *   (alloc_seed.c). */
typedef enum ha_policy {
#define HA_POLICY_X(U, l, w) HA_POLICY_##U,
    HPO_POLICIES(HA_POLICY_X)
#undef HA_POLICY_X
        HA_POLICY_COUNT
} ha_policy;

/* When a block every rank released becomes reusable (issue 27):
 * collect (0) - at the next collect (ha_collect, ha_collect_apply): the
 *   decisions depend only on the allocation sequence and collects, so every
 *   node of a multi-node heap, each with its own core, decides alike.
 * eager (1) - at the release that completes it (ha_free, ha_free_batch),
 *   with no collect: a decision then depends on where the frees fall
 *   between the allocations, so it needs one_decider (one core decides
 *   every rank's allocations and the others read its decisions: heapd on a
 *   single node). Not under the seed policy (its algorithm reclaims at
 *   collects). */
typedef enum ha_reclaim { HA_RECLAIM_COLLECT = 0, HA_RECLAIM_EAGER = 1 } ha_reclaim;

typedef struct ha_params {
    uint32_t ranks;        /* ranks tracked by this core: 1..HA_MAX_RANKS */
    uint64_t chunk_size;   /* growth unit; a multiple of min_block */
    uint64_t initial_size; /* mapped at creation; a multiple of chunk_size, >= one chunk */
    uint64_t va_size;      /* maximum extent; a multiple of chunk_size, >= initial_size */
    uint64_t min_block;    /* smallest block; a power of two */
    ha_policy policy;
    ha_reclaim reclaim; /* default (0): collect */
    /* One core decides for every rank of the heap (one node): a decision may
     * depend on when frees arrive. Under coalesce a release that completes a
     * block after a collect makes the next growth collect first (that
     * collect is not useless). false (several nodes): the rules above,
     * identical on every node. */
    bool one_decider;
    /* Issue 30, automatic trim: 0 (off), or the bytes of wholly free chunks
     * (what ha_trim would give back: ha_trimmable) at which an allocation's
     * first step answers HA_NEED_TRIM instead. */
    uint64_t trim_threshold;
    /* Issue 32 (coalesce only): no block straddles two extents, an extent
     * being the initial chunks or one run of chunks a growth mapped (a hole
     * refilled, the chunks added at the top): NCCL registers each as one
     * window. Free space never merges across an extent's bound, and a
     * growth adds the whole block's chunks rather than extending the top's
     * free run. Off (false): the decisions of before, byte for byte. */
    bool extent_bound;
} ha_params;

/* Return codes. >= 0: the call did what it says (or asks for a step);
 * < 0: an error, nothing changed. HA_ERRORS(X): X(NAME, value, the
 * protocol's ErrCode the daemon answers it with (ERR_<wire>; NONE: no error),
 * description); it generates the HA_<NAME> codes, ha_errname and
 * ha_strerror (and, with heapd.proto's header, HA_CHECK_WIRE's asserts). */
#define HA_ERRORS(X)                                                                                                   \
    X(OK, 0, NONE, "success")                                                                                          \
    X(NEED_COLLECT, 1, NONE, "a collect is needed before this allocation")                                             \
    X(NEED_GROW, 2, NONE, "the heap must grow before this allocation")                                                 \
    X(NEED_TRIM, 3, NONE, "a trim is needed before this allocation")                                                   \
    X(EINVAL, -1, INVALID, "invalid argument")                                                                         \
    X(ENOMEM, -2, NO_MEMORY, "out of memory for allocator bookkeeping")                                                \
    X(EVA, -3, VA_EXHAUSTED, "the allocation does not fit in the heap's va_size")                                      \
    X(ENOTHELD, -4, NOT_HELD, "no block held by this rank starts at this offset")                                      \
    X(ESTATE, -5, STATE, "call not valid in the heap's current state")

/* HA_NEED_COLLECT: nothing allocated: collect, then call again.
 * HA_NEED_GROW: nothing allocated: grow by res.grow_chunks, call again.
 * HA_NEED_TRIM (issue 30, trim_threshold != 0): nothing allocated: trim
 * (ha_trim), then call again; asked only at an allocation's first step,
 * when ha_trimmable >= trim_threshold (a function of the state alone, so
 * twin cores ask at the same allocation number).
 * HA_EINVAL: bad parameter or argument. HA_ENOMEM: bookkeeping memory could
 * not be allocated. HA_EVA: the allocation does not fit even at va_size.
 * HA_ENOTHELD: free of an offset the rank does not hold. HA_ESTATE: call not
 * valid now (grow not requested, ...). */
enum {
#define HA_ERR_X(N, v, w, s) HA_##N = v,
    HA_ERRORS(HA_ERR_X)
#undef HA_ERR_X
};

/* Where heapd.proto's header is included: each code's ErrCode exists (a
 * renamed or removed ErrCode fails the build). */
#define HA_CHECK_WIRE_X(N, v, w, s) _Static_assert(HEAPD__ERR_CODE__ERR_##w >= 0, "ha: ErrCode of HA_" #N);
#define HA_CHECK_WIRE()             HA_ERRORS(HA_CHECK_WIRE_X) _Static_assert(HEAPD__ERR_CODE__ERR_NONE == 0, "");

typedef struct ha_alloc_result {
    uint64_t offset;        /* HA_OK: where the block starts (same on every rank) */
    uint64_t block_size;    /* HA_OK: the size class reserved */
    uint32_t grow_chunks;   /* HA_NEED_GROW: chunks to add */
    uint8_t collect_reason; /* HA_NEED_COLLECT: HA_COLLECT_TRIGGER or HA_COLLECT_FULL */
} ha_alloc_result;

enum { HA_COLLECT_TRIGGER = 1, HA_COLLECT_FULL = 2 };

typedef struct ha_stats {
    uint64_t mapped;        /* current extent in bytes */
    uint64_t live_bytes;    /* blocks at least one rank still holds */
    uint64_t pending_bytes; /* blocks every rank released, not yet reclaimed */
    uint64_t free_bytes;    /* mapped bytes not in any block */
    uint64_t live_blocks;
    uint64_t pending_blocks;
    uint64_t allocs; /* successful ha_alloc calls */
    uint64_t frees;  /* successful ha_free calls (one per rank per block) */
    uint64_t collects;
    uint64_t growths;              /* ha_grow calls */
    uint64_t handed_since_collect; /* bytes handed out since the last collect */
    uint64_t top;                  /* highest byte in use or pending + 1 (seed: bump) */
    uint64_t collects_skipped;     /* coalesce: collects before a growth not asked for
                                    * because one had just run (explicit or forced
                                    * ones included) or no block existed; 0 (seed) */
    uint64_t eager_reclaims;       /* reclaim = eager: blocks reclaimed at their last release */
    uint64_t trims;                /* ha_trim calls that took chunks off (issue 30) */
    uint64_t trims_asked;          /* HA_NEED_TRIM answers (trim_threshold) */
    uint64_t trimmed_bytes;        /* bytes they took off (the top and holes), in all */
    uint64_t hole_bytes;           /* chunks trimmed below the top, not refilled yet */
} ha_stats;

typedef struct ha_heap ha_heap;

/* Parameters ------------------------------------------------------------- */

/* Checks p; on error returns HA_EINVAL and writes which parameter is wrong
 * and why into err. */
int ha_params_check(const ha_params *p, char *err, size_t errlen);
/* Bytes of bookkeeping (the coalesce policy's free-extent bitmaps) a heap
 * with parameters p keeps for an extent of `mapped` bytes: about 4 bits per
 * min_block; 0 under the seed policy. Block records are not included. */
uint64_t ha_meta_bytes(const ha_params *p, uint64_t mapped);
/* The policy's name (common/policy.h), "unknown" for no policy. */
const char *ha_policy_name(ha_policy p);
/* A policy's name (also "default": the first) -> *out; HA_EINVAL otherwise. */
int ha_policy_parse(const char *s, ha_policy *out);

/* Lifetime --------------------------------------------------------------- */

int ha_create(const ha_params *p, ha_heap **out, char *err, size_t errlen);
void ha_destroy(ha_heap *h);
const ha_params *ha_get_params(const ha_heap *h);

/* Allocation ------------------------------------------------------------- */

/* Size class of an allocation of `size` bytes, the block_size ha_alloc
 * reserves: seed, the next power of two of max(size, min_block); coalesce,
 * the next multiple of min_block. 0 if size is 0 or exceeds 2^63. */
uint64_t ha_class_size(const ha_heap *h, uint64_t size);

/* One step of an allocation of `size` bytes (the protocol above). The
 * block is held by every rank on HA_OK. HA_EINVAL for size 0; HA_EVA when
 * the block can never fit in va_size. */
int ha_alloc(ha_heap *h, uint64_t size, ha_alloc_result *res);

/* Adds `chunks` chunks of memory. Issue 30's holes first: the lowest
 * min(chunks, holes) holes (chunk indices, ascending) become free again,
 * merged with their free neighbours; the rest, chunks - that many, extend
 * the extent at its top (indices mapped / chunk_size, ...). ha_grow_plan
 * names those indices in that order. Valid after HA_NEED_GROW (with at
 * most that many chunks... or more: the caller may grow further; a growth
 * that refilled holes may leave the allocation still without room: it
 * answers HA_NEED_GROW again, for the chunks its top still needs); HA_EVA
 * if the extent would exceed va_size, HA_ENOMEM (nothing changes). */
int ha_grow(ha_heap *h, uint32_t chunks);

/* A chunk index (chunk i spans [i * chunk_size, (i + 1) * chunk_size)). */
typedef void (*ha_chunk_fn)(void *data, uint32_t index);

/* Calls fn(data, i) for each chunk index i that ha_grow(h, chunks) would
 * back, in ha_grow's order (holes lowest first, then the top). Changes
 * nothing; HA_EVA as ha_grow (then fn is not called). */
int ha_grow_plan(const ha_heap *h, uint32_t chunks, ha_chunk_fn fn, void *data);

/* Issue 30 (trim): every wholly free chunk (a chunk-aligned chunk_size
 * range inside one free region: no live or pending block touches it)
 * leaves the memory the heap holds, and fn(data, i) (fn may be NULL) is
 * called once for each such chunk index i, ascending (the holes below the
 * top, then the chunks the extent lost). *chunks (may be NULL) gets how
 * many (0: none).
 *   - The top: the wholly free chunks that end the extent leave it
 *     (mapped shrinks, and so do holes that then end it, then the wholly
 *     free chunks below them...); the extent keeps at least one chunk
 *     (which may be a hole). A later growth adds chunks at the same
 *     offsets.
 *   - Below the top (coalesce policy only; the seed policy trims only the
 *     top): each such chunk becomes a hole, inside the extent but in no
 *     free region, never handed out while a hole; ha_grow refills holes
 *     first, lowest index first, so offsets stay where they were.
 * The decisions that read the extent (mapped / 8, / 16...) read `mapped`,
 * holes included. Every node of a heap must trim at the same allocation
 * number (heapd trims single-node heaps only). Pure: a function of the
 * state alone. HA_ENOMEM (nothing changes): no room for the hole bitmap. */
int ha_trim(ha_heap *h, uint32_t *chunks, ha_chunk_fn fn, void *data);

/* Issue 30: the bytes ha_trim would give back now (the top's and, under
 * coalesce, the holes'), counted at least up to `enough` (it may stop
 * there: UINT64_MAX counts all). Changes nothing. */
uint64_t ha_trimmable(const ha_heap *h, uint64_t enough);

/* 1 if chunk index i is a hole (ha_trim), 0 otherwise. */
int ha_chunk_hole(const ha_heap *h, uint32_t index);

/* Rank `rank` releases the block that starts at `offset`: deferred (under
 * reclaim = eager the release that completes a block reclaims it). Returns
 * HA_ENOTHELD if no block starts there or the rank already released it. */
int ha_free(ha_heap *h, uint32_t rank, uint64_t offset);

/* Rank `rank` releases the blocks at offsets[0..n), all or nothing: if one
 * is not held by the rank (no block starts there, the rank released it, or
 * it appears earlier in the batch), none is released, *bad (may be NULL) is
 * its index and the answer HA_ENOTHELD. The same as n calls of ha_free, but
 * each record's line is asked for a few offsets ahead, so that the cache
 * misses of a batch overlap (the heap wing's Free batches use it). */
int ha_free_batch(ha_heap *h, uint32_t rank, const uint64_t *offsets, size_t n, size_t *bad);

/* Size of the block starting at offset (held or pending), 0 if none. */
uint64_t ha_block_size(const ha_heap *h, uint64_t offset);
/* 1 if `rank` holds the block at offset, 0 otherwise. */
int ha_rank_holds(const ha_heap *h, uint32_t rank, uint64_t offset);

/* Collect ---------------------------------------------------------------- */

/* Single node: reclaims every block every tracked rank released.
 * *reclaimed_blocks / *reclaimed_bytes may be NULL. */
int ha_collect(ha_heap *h, uint64_t *reclaimed_blocks, uint64_t *reclaimed_bytes);

/* Several nodes: the offsets every tracked rank released, sorted ascending,
 * in a malloc'd array the caller frees (NULL when *n == 0). */
int ha_collect_candidates(const ha_heap *h, uint64_t **offsets, size_t *n);
/* Reclaims exactly `offsets` (sorted ascending, each a current candidate:
 * HA_EINVAL otherwise, and nothing changes); the other candidates stay
 * pending. Counts as one collect. */
int ha_collect_apply(ha_heap *h, const uint64_t *offsets, size_t n, uint64_t *reclaimed_bytes);

/* Issue 27, cross-node eager reclaim: reclaims exactly `offsets` (sorted
 * ascending, each a current candidate: HA_EINVAL otherwise, and nothing
 * changes) as ha_collect_apply does, but not as a collect: they count as
 * eager reclaims, and the collect flags, handed_since_collect and the
 * collect count stay. Every node of a heap calls it with the same offsets
 * at the same allocation number (the horizon the nodes agreed through the
 * store), so their decisions stay identical. Coalesce policy only (seed:
 * HA_EINVAL). */
int ha_reclaim_apply(ha_heap *h, const uint64_t *offsets, size_t n, uint64_t *reclaimed_bytes);

/* Introspection ---------------------------------------------------------- */

void ha_get_stats(const ha_heap *h, ha_stats *out);
/* Bytes rank `rank` holds and has released but not yet seen reclaimed. */
void ha_rank_stats(const ha_heap *h, uint32_t rank, uint64_t *held_bytes, uint64_t *released_bytes);
/* Bytes of bookkeeping memory the heap uses (for benchmarks). */
size_t ha_memory_usage(const ha_heap *h);
/* Bytes of the block records once `more` more blocks exist: the block
 * table at its capacity (it doubles whenever it would be more than half
 * full and never shrinks; 32 bytes a slot, holder rows of more than 64
 * ranks beside, a bit a slot of occupancy) and room for the list of
 * released blocks (8 bytes per two slots, or its capacity if larger). What
 * heapd charges to quota_uid besides ha_meta_bytes; O(1) for small `more`. */
size_t ha_block_bytes(const ha_heap *h, size_t more);

/* Checks every invariant written above the structs in alloc_int.h: blocks and
 * free space tile [0, mapped) with no overlap, free structures consistent,
 * counters equal to what they count. O(blocks + free blocks). Returns HA_OK
 * or HA_EINVAL with the first violation in err. Debug builds (HEAPD_DEBUG)
 * run it after every mutating call and abort on a violation. */
int ha_validate(const ha_heap *h, char *err, size_t errlen);

/* The code's sentence / its name ("HA_EVA"); "unknown allocator error" /
 * "HA_UNKNOWN" for no code. */
const char *ha_strerror(int code);
const char *ha_errname(int code);

#endif
