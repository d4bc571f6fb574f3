/* heap_int.h - the heap wing's structs, their invariants, and the functions
 * its files share. Not for use outside daemon/heap/.
 *
 * The wing's floors: a file calls only files on floors below its own, never
 * one on its own floor or above (tests/it_layers.sh checks it, from the
 * object files' symbols):
 *
 *   top     force.c    forced collects; subscribes itself to the store
 *           timeout.c  the attach and collect timeouts
 *   middle  attach.c   attach rendezvous, detach, disconnect
 *           release.c  release, restore and trim (issue 30), a collective
 *                      like commit, with the heap's host copy
 *           sequence.c the decision log, alloc, free, growth
 *           collect.c  local and store collects
 *           commit.c   commit markers (a collective like collect)
 *   spares  spare.c    issue 27: growth ahead of need, each heap's spare
 *                      chunks made off the allocation path (a uv idle
 *                      handle), yielded to quotas, dropped at release
 *   bottom  registry.c heaps by name and their lifetime, quotas, status
 *                      pages, stats, the validator, the checks requests
 *                      share (a formed heap, an unconnected rank)
 *           chunks.c   a rank's chunks and the chunk refs replies carry
 *           poison.c   a heap poisoned by an asymmetric allocation, and the
 *                      one error every later call on it gets
 *   ground  blocks.c   the block table (seq, offset, size, name of every
 *                      decided block): live sets; the text check of names
 *
 * What a lower floor must reach above it, it reaches through a callback
 * set from above: the heap timer's expiry (registry's heap_timeout hook,
 * given by timeout.c's hd_registry_create), a rank leaving during a collect
 * (the heap's coll_left, set by collect.c when a collect starts), the heap
 * poisoned during a collect (coll_fail, set beside it), the
 * store's force requests (store.h's hd_store_on_force, called by force.c's
 * hd_registry_set_store). A heap's lifetime has one home: registry.c's
 * hh_heap_new and hh_heap_client_gone. */
#ifndef HEAPD_HEAP_INT_H
#define HEAPD_HEAP_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "heap.h"
#include "hist.h"
#include "statuspage.h"
#include "store.h"

/* Every file of the wing formats messages into fixed buffers, cut short
 * (with the most useful part first) rather than failing. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define HD_NAME_MAX 255
#define HD_JOB_MAX  127  /* bytes of a job string (h->job holds it with its NUL) */
#define HD_LOG_TRIM 4096 /* decisions kept before trying to trim the log */

/* One decision of the allocation sequence.
 * Invariant: offset + block_size <= mapped, mapped % chunk_size == 0;
 * name_hash == 0 <=> the allocation has no name (hh_name_hash). */
typedef struct hd_decision {
    uint64_t size, offset, block_size, mapped;
    uint32_t rank;      /* the rank that asked first */
    uint32_t name_hash; /* of its name (the string: the block table); 0: none */
} hd_decision;

/* Issue 29: the block table's entry of a decided block (blocks.c): an
 * entry is its block's while ha_block_size(core, offset) != 0 (a block
 * starts there: a later decision at the offset overwrites the entry; the
 * block's size is the core's). seq == UINT64_MAX: an empty slot. 32 bytes. */
typedef struct hh_block {
    uint64_t offset, seq, size;
    char *name; /* NULL: none */
} hh_block;

/* Open addressing keyed by offset (linear probing).
 * Invariants: cap is 0 or a power of two; n <= cap / 2; name_bytes is the
 * sum of the entries' strlen(name) + 1. */
typedef struct hh_blocks {
    hh_block *v;
    size_t cap, n;
    uint64_t name_bytes;
} hh_blocks;

#define HD_MARKERS_MAX 64 /* commit markers per heap */
struct hh_commit;         /* commit.c's state of a heap, made at its first Commit */

/* A rank's slot in a heap.
 * Invariants: nchunks == heap->mapped / chunk_size once the rank has
 *             attached (joined); conn != NULL <=> a client is attached as
 *             this rank; known_chunks <= nchunks;
 *             nchunks + nspare <= capchunks; issue 27: chunks[nchunks ..
 *             nchunks + nspare) are the rank's spares (created, fd ready,
 *             never sent), nspare <= heap->grow_ahead, and nspare > 0 =>
 *             joined and the heap is not released (hh_released);
 *             issue 30: joined and not released => for j < nchunks,
 *             chunks[j].fd < 0 <=> chunk j is a hole (ha_chunk_hole);
 *             joined and released => chunks[j].fd < 0 for j in
 *             heap->rel_idx. */
typedef struct hd_rank {
    bool joined;   /* attached at least once: chunks exist */
    uint32_t lidx; /* index among this node's ranks (allocator core rank) */
    hd_peer *conn;
    pid_t pid;
    int device;
    char uuid[HB_UUID_LEN];
    uint64_t next_seq; /* next allocation number of this rank */
    bool left_unclean; /* issue 29: its last client disconnected without Detach */
    bool resumed;      /* issue 29: its client re-attached (it had joined before) */
    bool in_commit;    /* waiting in a commit (commit.c) */
    uint64_t commit_id;
    bool in_rel; /* issue 30: waiting in a release or restore (release.c) */
    uint64_t rel_id;
    hb_chunk *chunks;
    uint32_t nchunks, capchunks;
    uint32_t nspare;       /* issue 27: spares after the chunks (spare.c) */
    uint32_t known_chunks; /* chunk indices the attached client was sent */
    bool attach_wait;      /* waiting for the heap to form */
    uint64_t attach_id;
    bool in_collect;
    uint64_t collect_id;
    hd_status status;                           /* the rank's status page (fd -1 until joined) */
    uint64_t dev_free, dev_total, dev_ns;       /* last device memory sample */
    uint64_t stream_waiting, dev_waits_avoided; /* from the rank's last Collect */
    uint64_t lr_sent;                           /* issue 28: rounds at horizons below this were sent to it */
} hd_rank;

/* Invariants:
 *   log holds decisions log_base .. decided-1;
 *   log_base <= min(next_seq of attached ranks) (trimmed lazily);
 *   collect_at == UINT64_MAX or collect_at == decided (a collect is owed
 *   before allocation number `decided`); likewise trim_at (issue 30: a
 *   trim, the core's HA_NEED_TRIM; release.c's trim clears it);
 *   coll_active => coll_waiting == number of ranks with in_collect;
 *   poison.nranks == 0 (healthy) or HD_ASYM_RANKS with
 *   poison.sizes[0] != poison.sizes[1] or poison_replica (issue 28: a
 *   replica's decision differed from heapd's) (poisoned: set once, never cleared;
 *   poison_msg is the message every later call gets). */
struct hd_heap {
    hd_registry *reg;
    char name[HD_NAME_MAX + 1];
    uint32_t world_size;
    uint32_t local_size;      /* ranks served by this node (== world_size: single node) */
    char job[HD_JOB_MAX + 1]; /* job incarnation, namespaces store keys */
    ha_params ap;
    uint32_t timeout_ms;
    /* Issue 29: seconds the heap stays once formed and without a client
     * (0: released with its last client). detached_ns: when its last client
     * left (hh_now_ns), 0 while one is attached or before it formed.
     * Invariant: detached_ns != 0 => nattached == 0 and formed, and the
     * heap's timer runs its expiry (registry.c). */
    uint32_t persist_s;
    uint64_t detached_ns;
    uint64_t epoch;
    uid_t owner; /* the uid that created the heap */
    ha_heap *core;
    hd_rank *ranks;
    uint32_t njoined, nattached;
    bool formed;
    hd_decision *log;
    size_t nlog, caplog;
    uint64_t log_base, decided;
    uint64_t collect_at, trim_at;
    bool forced; /* collect_at was set by an operator */
    /* Cross-node forced collects owed before these allocation numbers
     * (agreed by every node), ascending; force_at[0] is the next one. */
    uint64_t force_at[16];
    uint32_t nforce;
    char secret[17]; /* first 16 hex digits of SHA-1 of the job secret ("-": none) */
    char inc[200];   /* store incarnation: job, parameter fingerprint, owner uid and
                      * secret hash (tenants never share store keys) */
    bool coll_active;
    /* While coll_active (coll_active => coll_left != NULL): a rank's
     * client left; set by collect.c, called by attach.c. */
    void (*coll_left)(hd_heap *h, uint32_t rank, bool clean);
    /* While coll_active (coll_active => coll_fail != NULL): the collect in
     * progress fails (the heap was poisoned); set by collect.c, called by
     * sequence.c. */
    void (*coll_fail)(hd_heap *h, Heapd__ErrCode code, const char *msg);
    hd_asym_out poison; /* poison.c */
    char poison_msg[600];
    bool poison_replica;
    uint64_t coll_seq;
    uint32_t coll_waiting;
    /* Cross-node collect (local_size < world_size). */
    uint64_t cnum;               /* store collect number of the collect in progress */
    uint64_t cnum_seq, cnum_sub; /* collects started at allocation cnum_seq so far */
    bool store_wait;             /* every local rank arrived; waiting for the store */
    bool store_abandoned;        /* failed here while the store still decides it */
    uint64_t abandoned_seq;      /* that collect's allocation number */
    /* Cross-node forced collect: agreement on the allocation number. */
    bool frozen; /* no new decisions until the agreement returns */
    bool force_busy;
    uint32_t force_queued;
    uint64_t force_count;
    struct held_alloc {
        hd_peer *conn;
        uint64_t id, seq, size;
        char name[HD_NAME_MAX + 1]; /* "": none */
    } * held;
    size_t nheld, capheld;
    hd_peer *force_conn; /* heapctl waiting for the agreed point */
    uint64_t force_id;
    uv_timer_t timer; /* attach and collect timeouts */
    bool timer_attach;
    uint64_t coll_start_ns; /* metrics (issue 20): when the collect began */
    hd_hist coll_wait, growth;
    /* Issue 33 item 4: gen counts the changes Stats could see (requests
     * dispatch announces, status page writes); memo.gen == gen and a young
     * memo => the memo's figures are the heap's. */
    uint64_t gen;
    hd_stats_memo memo;
    /* Issue 29. blocks: every decided block (blocks.c); generation: the
     * re-attaches of its ranks; markers: its commit markers, nmarkers <=
     * HD_MARKERS_MAX; commit: commit.c's state (NULL until the first
     * Commit), commit_gone its destructor (registry.c's heap_destroy calls
     * it; set with commit); commit_left: while a commit waits, a rank's
     * client left (set by commit.c, called by attach.c). */
    hh_blocks blocks;
    uint64_t generation;
    hd_marker *markers;
    uint32_t nmarkers;
    struct hh_commit *commit;
    void (*commit_gone)(hd_heap *h);
    void (*commit_left)(hd_heap *h, uint32_t rank, bool clean);
    /* Issue 30 (release.c). mstate: HS_STATE_* of the heap's memory here.
     * Invariants: mstate == RELEASED or RESTORING <=> every joined rank's
     * chunk records at rel_idx[0..rel_n) are released (fd -1; nchunks
     * unchanged; ascending: every chunk but the holes, or those wholly
     * inside the named blocks of a partial release, the others staying;
     * what restore creates again; rel_idx stays until a restore succeeds,
     * rel_n is 0 while active); hc_ptr != NULL <=> a host copy of hc_size
     * bytes is mapped (a memfd's), pinned when hc_pinned, with local rank
     * lidx's chunk j at (lidx * nchunks + j) * chunk_size; hc_full => it
     * holds the released content (mstate RELEASED or RESTORING); hc_keep:
     * it stays after restore. rel: release.c's collective (NULL until the
     * first Release), rel_gone its destructor (frees the host copy too;
     * registry.c's heap_destroy calls it), rel_left: while one waits, a
     * rank's client left (set by release.c, called by attach.c). */
    uint32_t mstate;
    void *hc_ptr;
    uint64_t hc_size;
    bool hc_pinned, hc_full, hc_keep;
    uint64_t releases, restores;
    uint32_t *rel_idx, rel_n;
    /* Issue 27 (spare.c): spares each local rank keeps (0: none);
     * spare_want: the refill may have work on this heap. */
    uint32_t grow_ahead;
    bool spare_want;
    /* Issue 30 (trim): trims that gave chunks back, and the chunk bytes
     * they gave back, every local rank's: trimmed_bytes == local_size *
     * the core's ha_stats.trimmed_bytes. */
    uint64_t trims, trimmed_bytes;
    struct hh_release *rel;
    void (*rel_gone)(hd_heap *h);
    void (*rel_left)(hd_heap *h, uint32_t rank, bool clean);
    /* Issue 27 (horizon.c): eager reclaim across nodes. hz_every: the
     * lookahead L (heapd.conf reclaim_lookahead; 0: off, the heap reclaims
     * at collects). Round m >= 1 is posted when allocation m * L is decided
     * and its answer reclaimed before (m + 1) * L is, on every node.
     * Invariants: hz_every == 0 => !hz_busy && !hz_done;
     * hz_at % hz_every == 0 (the last horizon passed; 0: none);
     * hz_busy => round hz_at / hz_every waits in the store and !hz_done;
     * hz_done => its answer is hz_set[0..hz_nset), ascending;
     * hz_ngone > 0 => hz_busy || hz_done (what collects reclaimed since
     * that round was posted); hz_err[0] != 0 => nothing is decided at or
     * past the next horizon. hz_replay (set by sequence.c): replays the
     * allocations held at a horizon (h->held). */
    uint32_t hz_every;
    ha_params ap_shown; /* ap as Attach and Stats show it: reclaim eager when hz_every */
    uint64_t hz_at;
    bool hz_busy, hz_done;
    uint64_t *hz_set, *hz_gone;
    size_t hz_nset, hz_ngone, hz_capgone;
    uint64_t hz_rounds, hz_waits; /* rounds reclaimed; allocations held at a horizon */
    uint64_t hz_wait_at;          /* the horizon last waited at (logged once) */
    char hz_err[700];
    void (*hz_replay)(hd_heap *h);
    /* Issue 28 (horizon.c): allocation without a message. local_every: the
     * replicas' period L (0: heapd decides every allocation). The core then
     * runs as on several nodes (reclaim at collects, not one decider), and
     * under reclaim eager hz_every == local_every: the rounds are this
     * node's own, answered at once. lr[0..nlr): the rounds applied at
     * horizons some rank has not reached (ascending at), each sent once to
     * each rank (hd_rank.lr_sent). */
    uint32_t local_every;
    struct hh_lround {
        uint64_t at;
        uint64_t *offsets;
        size_t n;
    } * lr;
    size_t nlr, caplr;
    uint64_t local_records, local_bad; /* decisions of replicas checked; poisonings by one */
    hd_heap *next;
};

struct hd_registry {
    uv_loop_t *loop;
    hb_backend *be;
    hd_config cfg;
    uv_timer_cb heap_timeout; /* a heap's timer fired (timeout.c; data: the heap) */
    uv_timer_t meminfo;       /* samples device memory for the status pages */
    struct hd_store *store;   /* cross-node collect; NULL: single node */
    hd_heap *heaps;
    uint32_t nheaps;
    uint64_t next_epoch;
    uint64_t start_ns; /* uv_hrtime at creation: uptime in stats */
    /* Issue 27: spare.c's refill (NULL until its first use) and its
     * destructor, which the registry's destruction calls (set with it). */
    uv_idle_t *spare_idle;
    void (*spare_gone)(hd_registry *r);
};

/* Identifies a heap across an asynchronous store call (it may be destroyed
 * meanwhile). */
typedef struct heap_ref {
    hd_registry *reg;
    char name[HD_NAME_MAX + 1];
    uint64_t epoch;
} heap_ref;

/* Chunk refs (and dup'ed fds) for chunk indices [from, to) of every joined
 * rank; fds has room for one more (the attach reply's status page). */
typedef struct chunk_msg {
    hd_chunk_ref *refs;
    int *fds;
    size_t n;
} chunk_msg;

/* Issue 30: true while h's chunks are released (RELEASED or RESTORING). */
static inline bool hh_released(const hd_heap *h)
{
    return h->mstate == HS_STATE_RELEASED || h->mstate == HS_STATE_RESTORING;
}

/* Issue 30: of `bytes` of one rank's chunks (all it has but holes), those
 * backed by memory now (a release of named blocks keeps the others). */
static inline uint64_t hh_resident(const hd_heap *h, uint64_t bytes)
{
    return hh_released(h) ? bytes - (uint64_t)h->rel_n * h->ap.chunk_size : bytes;
}

/* Issue 30: the bytes of chunks each rank holds for an extent: the
 * extent less its holes. */
static inline uint64_t hh_backed(const ha_stats *st) { return st->mapped - st->hole_bytes; }

/* Lifetime of a store call's keys: 10x the heap's timeout, at least 60 s. */
static inline uint32_t hh_store_ttl_s(const hd_heap *h)
{
    uint32_t t = h->timeout_ms / 100;
    return t < 60 ? 60 : t;
}

/* Issue 27: the bytes of h's spare chunks (every local rank's). */
static inline uint64_t hh_spare_bytes(const hd_heap *h)
{
    uint64_t n = 0;
    for (uint32_t q = 0; q < h->world_size; q++)
        n += h->ranks[q].nspare;
    return n * h->ap.chunk_size;
}

/* Chunks per rank of an extent of `mapped` bytes (<= va_size). Fits in 32
 * bits: heap_limits refuses va_size / chunk_size > max_chunks <= INT32_MAX. */
static inline uint32_t hh_heap_chunks(const hd_heap *h, uint64_t mapped)
{
    return (uint32_t)(mapped / h->ap.chunk_size);
}

/* ---- bottom floor --------------------------------------------------------- */

/* registry.c */
/* The registry, calling heap_timeout when a heap's timer fires
 * (hd_registry_create gives it). */
int hh_registry_new(uv_loop_t *loop, hb_backend *be, const hd_config *cfg, uv_timer_cb heap_timeout, hd_registry **out);
uint64_t hh_now_ns(void);
void hh_heap_publish(hd_heap *h);
const char *hh_human(uint64_t b, char *buf, size_t len);
/* A new heap named `name` with world_size ranks and parameters ap (local
 * ranks: ap->ranks), in the registry; NULL if out of memory. The caller
 * fills its identity (job, owner, secret, inc, timeout_ms). */
hd_heap *hh_heap_new(hd_registry *r, const char *name, uint32_t world_size, const ha_params *ap);
/* A client left h (or a new heap's first attach failed): when no client
 * is attached, h is destroyed, its chunks released, unless it formed and
 * persists (persist_s > 0): then it stays detached, its timer running the
 * expiry (issue 29). Returns true if h is gone. */
bool hh_heap_client_gone(hd_heap *h);
/* A client attached to h again (nattached > 0): a detached heap's expiry
 * stops (issue 29). */
void hh_heap_client_back(hd_heap *h);
/* Starts the heap's one timer: attach (true) or collect timeout after
 * timeout_ms, then the registry's heap_timeout. */
void hh_arm_timer(hd_heap *h, bool attach);
hd_heap *hh_heap_find(hd_registry *r, const char *name);
/* The formed heap c is attached to; NULL if none, request id answered
 * ERR_STATE "<what> before attach: attach to a heap first". */
hd_heap *hh_formed_heap(hd_peer *c, uint64_t id, const char *what);
/* If a joined rank of h is not connected (its client disconnected or
 * detached): true, with msg "<what> on heap ... cannot complete: rank ...
 * is not connected (...); <advice>" for a collective that cannot finish. */
bool hh_unconnected_rank(const hd_heap *h, const char *what, const char *advice, char *msg, size_t len);
/* Writes "1, 3" into buf: the joined ranks for which in(k) is false (not
 * waiting in a commit, a release...), for a timeout's message. Returns its
 * length. */
size_t hh_ranks_not_in(const hd_heap *h, bool (*in)(const hd_rank *k), char *buf, size_t len);
/* Bookkeeping heapd keeps for heap h that quota_uid charges besides its
 * chunks: the allocator's (ha_meta_bytes of its extent, ha_block_bytes) and
 * hh_heap_log_bytes. */
uint64_t hh_heap_meta_bytes(const hd_heap *h);
/* The decision log and the held allocations, at their capacity. */
uint64_t hh_heap_log_bytes(const hd_heap *h);
int hh_quota_check(const hd_registry *r, const char *name, uid_t uid, uint64_t have, uint64_t add, uint64_t meta_add,
                   char *why, size_t len);
/* chunks.c: max_chunk_fds_per_uid. */
int hh_chunk_fds_check(const hd_registry *r, uid_t uid, uint64_t add, char *why, size_t len);
heap_ref *hh_heap_ref_new(hd_heap *h);
hd_heap *hh_heap_ref_get(heap_ref *x);
size_t hh_local_ranks(const hd_heap *h, uint32_t *out);
static inline hd_binding *hd_peer_binding(hd_peer *c) { return &c->bind; }
static inline uid_t hd_peer_uid(const hd_peer *c) { return c->uid; }
static inline pid_t hd_peer_pid(const hd_peer *c) { return c->pid; }
static inline int hd_peer_privileged(const hd_peer *c, long gid) { return c->privileged(c, gid); }

/* chunks.c */
/* Room for n chunk records (chunks and spares) in k. 0, or -1 with err. */
int hh_rank_reserve(hd_rank *k, uint32_t n, char *err, size_t errlen);
/* Gives rank k chunks up to index `upto` (exclusive) on its device: its
 * spares first (issue 27), then new ones. 0, or the backend's error with
 * err; the chunks made so far stay (the caller trims them). */
int hh_rank_add_chunks(hd_heap *h, hd_rank *k, uint32_t upto, char *err, size_t errlen);
/* Drops chunks beyond `keep` and every spare (rollback of a failed growth). */
void hh_rank_trim_chunks(hd_heap *h, hd_rank *k, uint32_t keep);
/* Issue 27: releases rank k's spares beyond `keep`; returns how many. */
uint32_t hh_rank_drop_spares(hd_heap *h, hd_rank *k, uint32_t keep);
void hh_chunk_msg_free(chunk_msg *m, bool close_fds);
int hh_chunk_msg_build(hd_heap *h, uint32_t from, uint32_t to, chunk_msg *m);

/* poison.c */
/* Poisons h: allocation n was decided for rank `first` at first_size bytes,
 * and rank `rank` asked for size. Logs it; answers nobody. */
void hh_poison_set(hd_heap *h, uint64_t n, uint32_t first, uint64_t first_size, uint32_t rank, uint64_t size);
/* Issue 28: rank `rank`'s replica decided allocation n (size bytes) at
 * offset `said`; heapd's core placed it at `decided` (why: UINT64_MAX
 * offsets aside, what heapd's core answered instead: "" or a sentence). */
void hh_poison_replica(hd_heap *h, uint64_t n, uint32_t rank, uint64_t size, uint64_t said, uint64_t decided,
                       const char *why);
static inline bool hh_poisoned(const hd_heap *h) { return h->poison.nranks > 0; }
/* Answers request id of c with h's poison (ERR_ASYMMETRY, its fields). */
void hh_poison_reply(const hd_heap *h, hd_peer *c, uint64_t id);
/* If h is poisoned: answers request id of c so and returns true. */
bool hh_poison_check(const hd_heap *h, hd_peer *c, uint64_t id);

/* ---- ground floor (below the bottom one: registry.c frees the table) ------ */

/* blocks.c */
/* Records the decision of allocation seq at offset (overwriting the entry
 * of an older block there); name NULL or "": none. 0, or -1 out of memory. */
int hh_blocks_put(hd_heap *h, uint64_t seq, uint64_t offset, uint64_t size, const char *name);
/* The entry of the block at offset, if it is still that block's; else NULL. */
const hh_block *hh_blocks_get(const hd_heap *h, uint64_t offset);
/* The blocks rank lidx holds, ascending seq, in *out (the caller frees it;
 * its names point into the table). The count, or -1 out of memory. */
long hh_blocks_held(const hd_heap *h, uint32_t lidx, hd_live_block **out);
/* Issue 30 (a release of named blocks): sets mark[j] for each chunk index
 * j < nch that lies wholly inside a live block (some local rank holds it)
 * named one of names[0..n) (no other block can touch it). 0, or -1 with
 * *missing the first name no live block has. */
int hh_blocks_chunks(const hd_heap *h, char *const *names, size_t n, uint32_t nch, uint8_t *mark, const char **missing);
/* The table's memory (quota_uid charges it with the allocator's), and what
 * the next hh_blocks_put with name adds to it at most. */
uint64_t hh_blocks_bytes(const hd_heap *h);
uint64_t hh_blocks_add_bytes(const hd_heap *h, const char *name);
void hh_blocks_free(hd_heap *h);
/* The 32-bit hash of a name a decision keeps (never 0); 0 for NULL or "". */
uint32_t hh_name_hash(const char *name);
/* Heap names, jobs, allocation names and tags (docs/protocol.md): valid
 * UTF-8 without control characters (C0, DEL, C1 U+0080..U+009F). 0, or -1
 * with why. */
int hh_text_check(const char *s, char *why, size_t len);
/* A block's name (not empty): at most HD_NAME_MAX bytes and hh_text_check's
 * text. 0, or -1 with why ("is N bytes, over the limit...; use a shorter
 * name", or hh_text_check's). Alloc and Release check names with it. */
int hh_name_check(const char *name, char *why, size_t len);

/* ---- spares floor (issue 27): above the bottom one, below the middle ------ */

/* spare.c */
/* The refill may have work on h (after its attach, a growth, a restore):
 * it runs from a uv idle handle, after the reply that asked for this went
 * out, one chunk per loop turn, until every local rank of h holds
 * grow_ahead spares or a quota, fd limit, va_size or the backend stops it. */
void hh_spare_kick(hd_heap *h);
/* Releases every spare of h (its release, its last client gone). */
void hh_spare_drop(hd_heap *h);
/* Spares yield to a quota: releases the spares of uid's heaps, keeping on
 * heap `keep_h` (NULL: none) min(nspare, keep) per rank (the spares a
 * growth is about to take). Returns the number released (0: retrying the
 * quota check is useless). */
uint32_t hh_spare_yield(hd_registry *r, uid_t uid, hd_heap *keep_h, uint32_t keep);
/* Of a growth by `chunks` chunks per rank, the chunks (all local ranks)
 * its spares do not serve: those it creates. */
uint64_t hh_spare_fresh(const hd_heap *h, uint32_t chunks);

/* horizon.c (issue 27: eager reclaim across nodes; see the file) */
/* Posts this node's contribution to a store collect of h (incarnation inc,
 * number cnum): the blocks every local rank released and the local ranks;
 * cb gets the answer with a heap_ref (hh_heap_ref_get) as its arg. 0; -1
 * the store refused it, -2 out of memory (err says which; cb never called).
 * collect.c's collects and the reclaim rounds both post through it. */
int hh_store_post(hd_heap *h, const char *inc, uint64_t cnum, hd_store_cb cb, char *err, size_t errlen);
/* Before allocation seq (h->decided) is decided: 0 go on; 1 hold it (the
 * store has not answered the round to reclaim here yet: the heap's
 * hz_replay replays it once it has); -1 no decision (err says why). At a
 * horizon (a multiple of hz_every) it reclaims the agreed blocks and posts
 * the next round, once per horizon. */
int hh_horizon_gate(hd_heap *h, uint64_t seq, char *err, size_t errlen);
/* A collect reclaimed offsets[0..n) (a cross-node one: the same on every
 * node): the round in hand must not reclaim them again. */
void hh_horizon_collected(hd_heap *h, const uint64_t *offsets, size_t n);
/* The round applied at horizon seq for rank k, once (NULL: none, or sent);
 * *op is filled. Rounds every attached rank has passed are dropped. */
const hd_op_out *hh_local_round(hd_heap *h, hd_rank *k, uint64_t seq, hd_op_out *op);

/* ---- middle floor --------------------------------------------------------- */

/* attach_params.c (with attach.c, one unit) */
uint64_t hh_pick(uint64_t requested, uint64_t dflt);
/* Issue 27: the reclaim a heap of these ranks and policy gets for the
 * request's ask (RECLAIM_DEFAULT: heapd.conf's, cfg; NULL: eager). */
ha_reclaim hh_reclaim_of(const hd_config *cfg, int ask, uint32_t local_size, uint32_t world_size, ha_policy pol);
/* Issue 27: the lookahead of a heap's cross-node eager reclaim. */
uint32_t hh_lookahead_of(const hd_config *cfg, int ask, uint32_t local_size, uint32_t world_size, ha_policy pol);
/* The new heap's parameters: the request's, else heapd.conf's (the
 * seconds it persists into *persist, its spares into *grow_ahead). 0, or
 * -1 once the peer got the error. */
int hh_heap_params(hd_registry *r, const Heapd__Attach *m, hd_peer *c, uint64_t id, ha_params *out, uint32_t *persist,
                   uint32_t *grow_ahead);

/* attach.c */
/* The attach timeout: every waiting rank gets ERR_TIMEOUT with msg and is
 * detached (its claim forgotten), so that a retry, on the same connection
 * or a new one, attaches again as that rank. The heap is destroyed when no
 * rank stays attached (every attached rank of an unformed heap waits). */
void hh_attach_timed_out(hd_heap *h, const char *msg);

/* collect.c */
bool hh_multi(const hd_heap *h);
void hh_collect_fail(hd_heap *h, Heapd__ErrCode code, const char *msg);

/* sequence.c */
/* name: NULL or "": none. */
void hh_heap_alloc_seq(hd_heap *h, hd_peer *c, uint64_t id, uint64_t seq, uint64_t size, const char *name);
/* The allocations held (a forced collect's agreement, issue 27's horizon)
 * are asked again, in the order they came; those that still cannot be
 * decided are held again. */
void hh_heap_replay_held(hd_heap *h);

/* ---- top floor: force.c, timeout.c (nothing shared; heap.h's API) ---------- */

#endif
