/* heap.h - the heap wing: heaps by name, their ranks, the allocation
 * sequence, collect orchestration and growth.
 *
 * What it promises:
 *   - Each allocation number of a heap is decided once, by the allocator
 *     core, and every rank's n-th allocation gets that decision; a rank whose
 *     n-th size differs gets ERR_ASYMMETRY naming n, both ranks and both
 *     sizes (hd_asym_out), and the heap is poisoned: from then on every
 *     call of every rank on it (attach, alloc, free, collect; a collect in
 *     progress too) gets that same error, until the heap is gone. Detach
 *     and stats still work.
 *   - Attach and Collect are collective over every rank of the heap; a rank
 *     that does not come within the heap's timeout, or disconnects, is named
 *     in the error every waiting rank gets.
 *   - Growth creates one chunk per rank; every client learns of every chunk
 *     (its own and its peers') before it uses an offset in it.
 *   - A heap is destroyed, and its chunks released, when its last client
 *     detaches or disconnects; unless it formed and persists (issue 29:
 *     HeapParams.persist_s, heapd.conf persist): then it stays detached,
 *     with its chunks, their content and its allocation sequence, for
 *     persist_s seconds or until dropped (hd_heap_drop), and a rank that
 *     attaches again finds it intact. The registry releases it when heapd
 *     stops.
 *   - Issue 29: an allocation may carry a name, symmetric like its size (a
 *     different name is ERR_ASYMMETRY with both names, hd_asym_out's
 *     with_names; it poisons nothing and consumes nothing). A rank that
 *     re-attaches gets its live set (every block it holds, ascending seq,
 *     with its name), the heap's generation (its re-attaches) and commit
 *     markers; after a disconnect without Detach, or to a heap without
 *     clients, it continues at the heap's allocation number. Commit is
 *     collective over the local ranks like Collect, with its own state.
 *
 * The wing knows no socket and builds no frame. Requests come in decoded
 * (dispatch.c); every answer leaves through the peer's reply sink
 * (hd_reply_ops: reply.c's sends frames, tests/check_heap.c's records), one
 * function per message. File descriptors handed to a sink are its own from
 * then on. Runs on the loop thread only. */
#ifndef HEAPD_HEAP_H
#define HEAPD_HEAP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "alloc.h"
#include "backend.h"
#include "config.h"
#include "hist.h"
#include "heapd.pb-c.h"

typedef struct hd_registry hd_registry;

/* HeapParams.persist_s asking for no persistence (docs/protocol.md). */
#define HD_PERSIST_NONE UINT32_C(0xFFFFFFFF)
/* Issue 27: HeapParams.grow_ahead asking for no spares (the most a heap may
 * ask for: config.h's HD_CONFIG_GROW_AHEAD_MAX). */
#define HD_GROW_AHEAD_NONE UINT32_C(0xFFFFFFFF)
/* Issue 30: HeapParams.trim_threshold asking for no automatic trim. */
#define HD_TRIM_NONE UINT64_C(0xFFFFFFFFFFFFFFFF)
/* Issue 28: the most allocations a replica decides between round trips
 * (HeapParams.local_every). */
#define HD_LOCAL_EVERY_MAX 4096u
typedef struct hd_heap hd_heap;
typedef struct hd_peer hd_peer;

/* Chunk `index` of rank `rank`; its fd is in the fds array beside. */
typedef struct hd_chunk_ref {
    uint32_t rank, index;
} hd_chunk_ref;

/* Issue 29: a block of a rank's live set (name NULL: none). */
typedef struct hd_live_block {
    uint64_t seq, offset, size, block_size;
    const char *name;
} hd_live_block;

/* Issue 29: a commit marker: every rank committed value under tag at
 * allocation number seq. */
#define HD_TAG_MAX 64
typedef struct hd_marker {
    char tag[HD_TAG_MAX + 1];
    uint64_t value, seq;
} hd_marker;

/* An AttachReply: chunks[i]'s fd is fds[i]; fds[status_index] (when >= 0)
 * is the rank's status page. nfds fds in all. Issue 29: live[0..nlive) the
 * blocks the rank holds, ascending seq (the sink sends those that do not fit
 * one frame first, in LiveBatch frames); resumed: the rank had attached
 * before; generation: the heap's re-attaches; markers[0..nmarkers). */
typedef struct hd_attach_out {
    const ha_params *ap;
    uint32_t timeout_ms;
    uint32_t world_size;
    const uint32_t *local_ranks;
    size_t nlocal;
    uint64_t mapped;
    const hd_chunk_ref *chunks;
    size_t nchunks;
    int *fds;
    size_t nfds;
    int status_index;
    uint64_t next_seq;
    const char *backend;
    uint64_t epoch;
    uint32_t persist_s; /* issue 29: the seconds the heap persists (0: none) */
    uint64_t generation;
    bool resumed;
    const hd_live_block *live;
    size_t nlive;
    const hd_marker *markers;
    size_t nmarkers;
    bool released;        /* issue 30: the heap is released here (no chunks) */
    uint32_t grow_ahead;  /* issue 27: spares per rank (0: none) */
    uint32_t local_every; /* issue 28: 0, or the replicas' round-trip period */
} hd_attach_out;

/* Issue 30: a ReleaseReply: the bytes released (every local rank's), of
 * them those copied into host memory; some: only chunks[0..nchunks) (a
 * release of named blocks), else every chunk. */
typedef struct hd_release_out {
    uint64_t released, saved, elapsed_us;
    bool some;
    const uint32_t *chunks;
    size_t nchunks;
} hd_release_out;

/* Issue 30: a RestoreReply; chunks[i]'s fd is fds[i]. */
typedef struct hd_restore_out {
    const hd_chunk_ref *chunks;
    int *fds;
    size_t nchunks;
    uint64_t mapped, restored_bytes, elapsed_us;
} hd_restore_out;

/* Issue 30: a TrimReply: trimmed_bytes per rank, the extent after it
 * (mapped), the chunk indices given back on every local rank (holes and the
 * top's). */
typedef struct hd_trim_out {
    uint64_t trimmed_bytes, mapped, elapsed_us;
    const uint32_t *chunks;
    size_t nchunks;
} hd_trim_out;

/* An AllocReply: a decision, or collect_needed or trim_needed (issue 30);
 * new_chunks[i]'s fd is fds[i]. */
/* Issue 28: what a replica must do before allocation `at` (a HeapOp):
 * reclaim offsets[0..n) (ascending), as a collect (collect; asked: the
 * allocator had asked for it there) or as an eager-reclaim round. */
typedef struct hd_op_out {
    uint64_t at;
    bool collect, asked;
    const uint64_t *offsets;
    size_t n;
} hd_op_out;

typedef struct hd_alloc_out {
    uint64_t seq, offset, block_size, mapped;
    bool collect_needed, trim_needed;
    const hd_chunk_ref *new_chunks;
    int *fds;
    size_t nchunks;
    const hd_op_out *op; /* issue 28: the round applied before seq (NULL: none) */
} hd_alloc_out;

/* A CollectReply: op is the collect's blocks for the replicas (issue 28;
 * NULL: none, or omitted: too many). */
typedef struct hd_collect_out {
    uint64_t blocks, bytes, collects;
    const hd_op_out *op;
    bool omitted;
} hd_collect_out;

typedef struct hd_rank_info {
    uint32_t rank;
    bool attached;
    uint64_t live_bytes, released_bytes, next_seq;
    uint32_t pid;
    uint64_t stream_waiting, device_waits_avoided; /* from the rank's last Collect */
} hd_rank_info;

/* Issue 33 item 4: one heap's Stats figures as the sink packed them, kept by
 * the heap wing (one per heap, freed with it) so that a flood of Stats of a
 * big heap does not rebuild and repack its rank list each time. The wing
 * says when it may be reused (hd_heap_info.memo_valid: the heap did not
 * change since, and it is younger than HD_STATS_REUSE_MS); the sink
 * (reply.c) writes it. Invariant: full == NULL => bare == NULL and the memo
 * is not valid; full != NULL => full_len and bare_len bytes are a packed
 * heapd.HeapStats with and without its ranks, of the heap at generation
 * gen, built at built_ns. */
typedef struct hd_stats_memo {
    uint64_t built_ns, gen;
    uint8_t *full, *bare;
    size_t full_len, bare_len;
} hd_stats_memo;

/* A memo is reused for at most this long (changes the wing does not see
 * as a request or a status page write show after at most this). */
#define HD_STATS_REUSE_MS 10

typedef struct hd_heap_info {
    /* memo_valid: memo holds this heap's figures and nothing below is set;
     * else the figures below are, and memo (NULL: none) is to be filled. */
    hd_stats_memo *memo;
    bool memo_valid;
    const char *name;
    uint32_t world_size;
    const ha_params *ap;
    uint32_t timeout_ms;
    /* Issue 29: persist_s, the seconds it persists without a client;
     * detached_ms, how long it has been without one (0: it has clients). */
    uint32_t persist_s;
    uint64_t detached_ms;
    uint64_t mapped, live_bytes, released_bytes, free_bytes, collects, growths;
    uint64_t collects_skipped;
    uint32_t owner_uid;
    uint64_t bookkeeping_bytes;           /* what quota_uid charges besides chunks (issue 33) */
    const hd_hist *collect_wait, *growth; /* metrics (issue 20) */
    uint32_t clients;
    uint64_t next_seq, epoch;
    uint64_t generation; /* issue 29: re-attaches */
    uint32_t markers;    /* issue 29: commit markers */
    /* Issue 30: HS_STATE_*, chunk bytes backed now (every local rank's),
     * the host copy's bytes, releases and restores. */
    uint32_t state;
    uint64_t resident_bytes, host_copy_bytes, releases, restores;
    uint64_t eager_reclaims; /* issue 27: blocks reclaimed at their last release */
    /* Issue 27: the spare chunks' bytes (every local rank's) and the spares
     * each rank keeps (grow_ahead, 0: none). */
    uint64_t spare_bytes;
    uint32_t grow_ahead;
    uint32_t local_every;          /* issue 28: 0, or the replicas' round-trip period */
    uint64_t trims, trimmed_bytes; /* issue 30: trims, chunk bytes they gave back (every local rank's) */
    bool collect_pending;
    uint64_t pending_collect_seq;
    uint64_t device_free, device_total;
    hd_rank_info *ranks;
    size_t n_ranks;
} hd_heap_info;

/* A StatsReply. */
typedef struct hd_stats_out {
    hd_heap_info *heaps;
    size_t nheaps;
    const char *backend;
    uint32_t clients;
    uint64_t uptime_ms;
    const char *store; /* "" without a store */
    bool store_connected;
    uint64_t quota_heap, quota_uid;
} hd_stats_out;

/* An asymmetric allocation, the structured part of its ERR_ASYMMETRY
 * (docs/protocol.md, Error): allocation n; ranks[i] asked for sizes[i]
 * bytes, in the order they asked (ranks[0] decided n), i < nranks. Issue
 * 29: with_names: the names differ (the heap is not poisoned), ranks[i]
 * gave names[i] (NULL: none). */
#define HD_ASYM_RANKS 2
typedef struct hd_asym_out {
    uint64_t n;
    uint32_t nranks;
    uint32_t ranks[HD_ASYM_RANKS];
    uint64_t sizes[HD_ASYM_RANKS];
    bool with_names;
    const char *names[HD_ASYM_RANKS];
} hd_asym_out;

/* Every message the heap wing sends, one function each. An Error's asym is
 * NULL but for an asymmetric allocation's. */
typedef struct hd_reply_ops {
    void (*error)(hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg, const hd_asym_out *asym);
    void (*attach)(hd_peer *p, uint64_t id, const hd_attach_out *a);
    void (*alloc)(hd_peer *p, uint64_t id, const hd_alloc_out *a);
    void (*free)(hd_peer *p, uint64_t id, uint32_t accepted);
    void (*collect)(hd_peer *p, uint64_t id, const hd_collect_out *o);
    void (*detach)(hd_peer *p, uint64_t id);
    void (*force)(hd_peer *p, uint64_t id, uint64_t at_seq);
    void (*stats)(hd_peer *p, uint64_t id, const hd_stats_out *s);
    void (*drop)(hd_peer *p, uint64_t id, uint64_t released_bytes);
    void (*commit)(hd_peer *p, uint64_t id, uint64_t value, uint64_t generation); /* issue 29 */
    void (*release)(hd_peer *p, uint64_t id, const hd_release_out *o);            /* issue 30 */
    void (*restore)(hd_peer *p, uint64_t id, const hd_restore_out *o);
    void (*trim)(hd_peer *p, uint64_t id, const hd_trim_out *o);
} hd_reply_ops;

/* What the heap wing keeps per client. */
typedef struct hd_binding {
    hd_heap *heap; /* NULL: not attached */
    uint32_t rank;
    const char *name; /* the heap's name while heap != NULL (log fields) */
} hd_binding;

/* A client as the heap wing sees it; its owner (dispatch.c: one per
 * session) fills every field but bind, which starts zeroed. */
struct hd_peer {
    hd_binding bind;
    pid_t pid;
    uid_t uid;
    /* 1 if the peer is root or in group `gid` (gid < 0: only root). */
    int (*privileged)(const hd_peer *p, long gid);
    const hd_reply_ops *out; /* where its replies go */
    void *data;              /* the sink's (reply.c: the session's frame sink) */
};

/* In timeout.c: it installs the heap timer's hook (heap_int.h's floors). */
int hd_registry_create(uv_loop_t *loop, hb_backend *be, const hd_config *cfg, hd_registry **out);
/* Releases every heap and its chunks (clients must be gone). */
void hd_registry_destroy(hd_registry *r);
uint32_t hd_registry_heaps(const hd_registry *r);
/* Replace the heap defaults (SIGHUP); existing heaps keep their parameters. */
void hd_registry_set_config(hd_registry *r, const hd_config *cfg);
struct hd_store;
/* Heaps whose ranks span nodes reconcile collects through `store` (NULL:
 * single node only). In force.c, which subscribes to its force requests. */
void hd_registry_set_store(hd_registry *r, struct hd_store *store);
/* 1 if heaps may span nodes (a store is configured). */
int hd_registry_has_store(const hd_registry *r);

void hd_heap_attach(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Attach *m);
void hd_heap_alloc(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Alloc *m);
void hd_heap_free(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Free *m);
void hd_heap_collect(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Collect *m);
void hd_heap_detach(hd_registry *r, hd_peer *c, uint64_t id);
void hd_heap_stats(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Stats *m, const char *backend_name,
                   uint32_t clients);
/* Issue 29: a commit marker, collective over the heap's local ranks (commit.c). */
void hd_heap_commit(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Commit *m);
/* Issue 30: release and restore, collective over the heap's local ranks
 * (release.c; docs/protocol.md). */
void hd_heap_release(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Release *m);
void hd_heap_restore(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Restore *m);
/* Issue 30: trim, collective like release (release.c): the wholly free
 * chunks (the top's and holes below a live block) are given back on every
 * local rank. */
void hd_heap_trim(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Trim *m);
void hd_heap_force_collect(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__ForceCollect *m);
/* Issue 29: releases detached heap m->heap now (its owner, root and
 * admin_group may): DropReply with the chunk bytes released, or
 * ERR_NOT_FOUND, ERR_DENIED, ERR_STATE (it has clients). In registry.c. */
void hd_heap_drop(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Drop *m);
/* The request dispatch is about to hand the wing may change heap `name`
 * (NULL: c's bound heap, if any): its Stats memo is stale from now on. */
void hd_heap_touch(hd_registry *r, const hd_peer *c, const char *name);
/* The client is going away: detach it, fail collectives it was part of. */
void hd_heap_conn_closed(hd_registry *r, hd_peer *c);

/* Formats an Error (at most 1500 bytes) and sends it through c's sink: the
 * one place heapd formats an error message (dispatch.c's errors use it too). */
void hd_peer_error(hd_peer *c, uint64_t id, Heapd__ErrCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Checks the heap wing's invariants (heap_int.h); 0, or -1 with why. */
int hd_heap_validate(const hd_registry *r, char *why, size_t len);
/* hd_heap_validate, aborting with why on failure: dispatch.c calls it after
 * every request in debug and sanitizer builds (HEAPD_DEBUG). */
void hd_heap_check(const hd_registry *r);

#endif
