/* heapc_int.h - libheapc's private header: the context (struct heapc) with its
 * invariants and locking rules, and the functions the libheapc files share
 * (prefix hci_, "heapc internal"; not exported: the objects are built with
 * hidden visibility). The files: heapc.c (errors, the connection and hci_rpc,
 * the one request/reply path, over the transports of heapc_xport.h:
 * heapc_sock.c the socket, heapc_ring.c the request ring), heapc_attach.c
 * (attach, mapping, detach), heapc_env.c (heapc_attach_env), heapc_alloc.c
 * (live set, frees, collect, alloc), heapc_names.c (issue 29: named blocks,
 * the attach reply's live set and commit markers, commit), heapc_stats.c
 * (lookups, status page, counters, admin requests), heapc_hook.c (issue 32:
 * the map hook's events). */
#ifndef HEAPC_INT_H
#define HEAPC_INT_H

#include "heapc.h"
#include "heapc_map.h"
#include "heapc_cuda.h"
#include "heapc_fence.h"
#include "heapc_ring.h"
#include "heapc_replica.h"
#include "heapc_sock.h"
#include "ring_layout.h"
#include "wire.h"
#include "status.h"
#include "heapd.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ERRSTR_LEN         512
#define FREE_BATCH_DEFAULT 1024u
#define FREE_BATCH_MAX     65536u /* 65536 varints of <= 10 bytes: far below HW_FRAME_MAX */
#define ALLOC_MAX_ROUNDS   8      /* collect_needed answers tolerated for one allocation */
#define ASYM_MAX           16     /* ranks of an asymmetry error kept (heapd names 2) */

/* ---- live-offset set ------------------------------------------------------
 * Open addressing, linear probing, backward-shift deletion. Keys are block
 * offsets; EMPTY marks a free slot (no block starts at UINT64_MAX). */
#define EMPTY UINT64_MAX

typedef struct liveset {
    uint64_t *keys;
    uint64_t *sizes; /* each key's block size (0: not known), parallel to keys */
    size_t cap, n;   /* cap: power of two or 0 */
} liveset;

/* ---- named blocks, live set, markers (issue 29, heapc_names.c) ------------
 * named: the named blocks this rank holds, ascending offset (one entry per
 * offset; a free removes it), named_n <= named_cap. live: the attach
 * reply's live set, ascending seq, immutable until detach (names owned, ""
 * for none). markers: one per tag, owned strings. */
typedef struct named_block {
    char *name;
    uint64_t seq, offset, size, block_size;
} named_block;

typedef struct marker {
    char *tag;
    uint64_t value, seq;
} marker;

/* LiveBatch frames before an AttachReply (heapc.c's rpc_reply): their
 * blocks, taken from the frames, until the reply. */
typedef struct live_acc {
    Heapd__LiveBlock **b;
    size_t n, cap;
} live_acc;

/* ---- context ----------------------------------------------------------- */

/* Immutable while attached; published with the release store of c->view. */
typedef struct view {
    uint32_t rank, world;
    uint32_t nlocal;
    uint32_t *local; /* ascending */
    char **bases;    /* [world]: base of rank q's copy, NULL when not local */
} view;

/*
 * The context (heapc.h: heapc). Invariants and locking rules:
 * - `mu` guards every field below except `view`, `mapped` and `status_page`;
 *   each public function that touches them takes it (the *_locked helpers and
 *   every hci_* function expect it held). The lock-free lookups (heapc_ptr,
 *   heapc_peer_ptr, heapc_mapped, heapc_status...) read only those three
 *   atomics, and heapc_heap_name reads `attached` and `heap`, which change
 *   only at attach and detach (heapc.h: those calls must not race with
 *   them). `view` is published with a release store once complete and is
 *   immutable until hci_teardown swaps it out; `mapped` only grows while
 *   attached, and every chunk below it is mapped for every local rank.
 * - sock.fd < 0 <=> the connection is gone (then ring == NULL); dead_msg
 *   says why, and every request fails with it. hci_rpc is the only place
 *   that talks to heapd, through a transport (heapc_xport.h: ring when it
 *   carries the request, else sock); the transports are used under `mu`
 *   only (the ring's slots and the socket's reader have one user).
 * - attached <=> heap, view, spaces and local_index are set (spaces[i] is the
 *   address space of view->local[i]; local_index is its inverse);
 *   next_seq is the number of this rank's allocations heapd decided.
 * - live_complete => `live` holds every live block of this rank (frees of
 *   other offsets are refused here); fq holds queued frees (fq_n <= fq_cap).
 * - fence_on <=> `fence` and its completion source exist (made on the first
 *   stream-ordered free, gone at detach or teardown).
 * - err/errstr: the last call's result (HEAPC_OK and "" after a success);
 *   asym_count > 0 only while err == HEAPC_EASYMMETRY came from heapd with
 *   an asymmetric allocation's figures (asym_count <= ASYM_MAX); asym_named
 *   => asym_names[i] is the name asym_ranks[i] gave, for i < asym_count.
 * - issue 29: attached or not, named/live/markers are those of the current
 *   attach (empty when not attached); every offset in `named` is in `live`
 *   when live_complete.
 */
struct heapc {
    int err;
    char errstr[ERRSTR_LEN];
    uint64_t asym_n;
    size_t asym_count;
    uint32_t asym_ranks[ASYM_MAX];
    uint64_t asym_sizes[ASYM_MAX];
    int asym_named;
    char asym_names[ASYM_MAX][HEAPC_NAME_MAX + 1];

    pthread_mutex_t mu;
    hcs_sock sock;             /* sock.fd: -1 once the connection is gone */
    char dead_msg[ERRSTR_LEN]; /* why the connection is gone */
    uint64_t next_id;
    int timeout_ms;
    char *socket_path;
    char server[128];
    char backend[32];

    /* attach state */
    int attached;
    char *heap;
    heapc_params params; /* effective; params.device_uuid -> uuid */
    char uuid[64];
    hm_kind kind;
    hm_space *spaces;     /* [nlocal], same order as view->local */
    int32_t *local_index; /* [world]: index into spaces, -1 when not local */
    _Atomic(view *) view;
    _Atomic uint64_t mapped;
    uint64_t next_seq;
    int status_fd;
    _Atomic(const hs_page *) status_page; /* mapped read-only, or NULL */

    liveset live;
    int live_complete; /* every live block of this rank is in `live` */
    uint64_t *fq;      /* queued frees */
    size_t fq_n, fq_cap, fq_batch;
    /* Stream-ordered frees (issue 18): blocks freed on a stream whose work
     * may not have completed; they join fq once it has (heapc_fence.h).
     * fence_on: the queue and its completion source exist. */
    int fence_on;
    /* Issue 27: heapc_free_async releases at once (heapc_set_stream_reuse,
     * $HEAPC_STREAM_REUSE; default on). */
    int stream_reuse;
    hf_queue fence;

    heapc_sync_fn sync_fn;
    void *sync_arg;
    heapc_counters ctr;

    /* Issue 16: Alloc, Free and Collect go through ring when set
     * (heapc_ring.h: it wraps sock); ring_want: HEAPC_TRANSPORT allows one. */
    hcr_ring *ring;
    int ring_want;

    /* Issue 29 (heapc_names.c). */
    named_block *named;
    size_t named_n, named_cap;
    heapc_block *live_blocks;
    size_t live_n;
    marker *markers;
    size_t markers_n;
    uint64_t generation;
    int resumed;
    /* Issue 30 (heapc_release.c): HEAPC_STATE_ACTIVE or _RELEASED. While
     * released, `mapped` keeps the extent but no chunk is mapped. */
    int mstate;
    /* Issue 32 (heapc_hook.c): heapc_set_map_hook's callback, or NULL. */
    heapc_map_fn map_fn;
    void *map_arg;
    /* Issue 28 (heapc_replica.h): the allocator's replica (rep.core NULL:
     * heapd decides every allocation). rep.pos == next_seq while it
     * decides. */
    hrp_replica rep;
};

/* heapc.c: the result of a call, and the one request/reply path. */
int hci_set_err(heapc *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int hci_ok(heapc *c);
int hci_rpc(heapc *c, Heapd__Frame *req, Heapd__Frame__BodyCase want, Heapd__Frame **rep, hw_frame *raw);
void hci_rpc_done(Heapd__Frame *rep, hw_frame *raw);
/* Issue 16: asks heapd for a request ring after an attach (nlocal: the
 * node's ranks of the heap); without one the socket carries everything. */
void hci_ring_setup(heapc *c, uint32_t nlocal);

/* An effective persist from heapd (HeapParams.persist_s, HeapStats.persist_s)
 * as heapc_params gives it: seconds, -1 for none (0 or 0xFFFFFFFF). */
static inline int32_t hci_persist_of(uint32_t wire)
{
    return wire == 0 || wire == UINT32_MAX ? -1 : wire > INT32_MAX ? INT32_MAX : (int32_t)wire;
}

/* heapc_attach.c */
void hci_teardown(heapc *c);
int hci_map_chunks(heapc *c, const view *v, Heapd__ChunkRef **refs, size_t n, const hw_frame *raw);
int hci_publish_extent(heapc *c, const view *v, uint64_t mapped, int strict);
int hci_attach_locked(heapc *c, const char *heap, uint32_t rank, uint32_t world, const heapc_params *p);

/* heapc_liveset.c */
void hci_ls_clear(liveset *s);
int hci_ls_insert(liveset *s, uint64_t k, uint64_t size);  /* 1 inserted, 0 there, -1 out of memory */
int hci_ls_remove(liveset *s, uint64_t k, uint64_t *size); /* 1 removed (*size: its block size), 0 not there */

/* heapc_alloc.c */
int hci_flush_locked(heapc *c);
int hci_flush_all_locked(heapc *c); /* heapc_flush: completed streams' frees too */
/* Issue 30: heapc_trim's body (c->mu held); also an allocation's
 * trim_needed. *trimmed (may be NULL) gets the bytes per rank. */
int hci_trim_locked(heapc *c, uint64_t *trimmed);
/* Issue 30: HeapParams.trim_threshold in a reply as heapc_params' (-1: none). */
static inline int64_t hci_trim_threshold_of(uint64_t t) { return t == 0 || t > (uint64_t)INT64_MAX ? -1 : (int64_t)t; }
int hci_fence_wait_early(heapc *c); /* trim, release: early frees' stream work done */
int hci_fence_drain_all(heapc *c);

/* heapc_hook.c (issue 32): the map hook's events for the slots of rank's
 * own space (rank: this rank) marked in mark[slot] (one byte per slot of
 * the space; NULL: every slot) and mapped now; nothing when no hook is set
 * or rank has no space. */
void hci_hook_emit(heapc *c, uint32_t rank, int event, const uint8_t *mark);
/* Teardown: REMOVING of every mapped slot, then DROPPED; forgets the hook. */
void hci_hook_drop(heapc *c, uint32_t rank);

/* heapc_names.c (issue 29) */
void hci_names_clear(heapc *c);
int hci_names_attach(heapc *c, const Heapd__AttachReply *ar);
int hci_names_add(heapc *c, const char *name, uint64_t seq, uint64_t offset, uint64_t size, uint64_t block_size);
void hci_names_forget(heapc *c, uint64_t offset);
int hci_live_add(live_acc *a, Heapd__LiveBatch *b);
int hci_live_merge(live_acc *a, Heapd__AttachReply *ar);
void hci_live_free(live_acc *a);

#endif
