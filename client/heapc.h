/* heapc.h - libheapc: the client library of heapd, the per-node symmetric heap
 * daemon. This header is the whole public API; nothing else in client/ is
 * public.
 *
 * A rank of a distributed job connects to its node's heapd, attaches to a
 * heap (collective: every rank of the heap attaches), and allocates from it.
 * The n-th allocation returns the same offset on every rank, so a rank reaches
 * a local peer's copy of a block at heapc_peer_ptr(c, peer, offset).
 *
 *     heapc *c = heapc_connect(NULL);               // $HEAPD_SOCKET or the default
 *     if (heapc_err(c)) { fprintf(stderr, "%s\n", heapc_errstr(c)); ... }
 *     heapc_attach(c, "job42", rank, world_size, NULL);
 *     void *p; uint64_t off;
 *     heapc_alloc(c, 1 << 20, &p, &off);            // same off on every rank
 *     ... heapc_peer_ptr(c, peer, off) ...
 *     heapc_free(c, off);                           // deferred (or heapc_free_async)
 *     heapc_collect(c);                             // collective: reuse what all ranks freed
 *     heapc_detach(c);
 *     heapc_free_ctx(c);
 *
 * Errors (the hiredis model). Every call that can fail returns HEAPC_OK (0)
 * or a negative HEAPC_E* code, and records it in the context: heapc_err(c)
 * is the code of the last call that set it (0 after a success) and
 * heapc_errstr(c) one sentence saying what happened and what to do. Errors
 * that heapd reports keep heapd's code (HEAPC_E<name> = -ERR_<name> of
 * docs/protocol.md) and heapd's message, verbatim: an asymmetry error, for
 * instance, names the allocation number, both ranks and both sizes (which
 * heapc_last_asymmetry gives as numbers). The library never
 * prints, never exits, never raises a signal (SIGPIPE included).
 *
 * Collective calls. heapc_attach, heapc_collect and (when heapd answers that a
 * collect is needed) heapc_alloc wait until every rank of the heap has made
 * the same call, or fail with HEAPC_ETIMEOUT (naming the ranks that never
 * came) or HEAPC_EPEER_GONE (naming the rank that disconnected). Every rank
 * must make the same sequence of heapc_alloc sizes and heapc_collect calls.
 *
 * Threads.
 *   - Lock-free and safe from any thread at any time while attached, also
 *     concurrently with heapc_alloc / heapc_free / heapc_collect on another
 *     thread: heapc_ptr, heapc_peer_ptr, heapc_base, heapc_mapped,
 *     heapc_rank, heapc_world_size, heapc_local_ranks. They read an
 *     immutable per-attach view and an atomic extent, never set heapc_err,
 *     never block. The extent only grows while attached, and a chunk is
 *     mapped before the extent that covers it is published.
 *     They must not race with heapc_detach, heapc_attach or heapc_free_ctx
 *     (which unmap and release the view): order those yourself.
 *   - Every other call takes an internal mutex, so calls from several
 *     threads on one context are serialised (a collective call holds it
 *     while it waits for the other ranks). heapc_err / heapc_errstr then
 *     describe the last failed call of any thread: read them before another
 *     thread's call can overwrite them, or use one context per thread.
 *   - Different contexts are independent.
 *   - fork: a context belongs to the process that created it; a child must
 *     connect its own (the trainer example forks its ranks before connecting).
 *
 * Memory. On the host backend the heap is shared memory (memfd chunks); base
 * and peer pointers are ordinary host pointers. On the cuda backend they are
 * CUDA device addresses (unified addressing), usable from kernels and
 * cuMemcpy, not dereferenceable on the CPU.
 */
#ifndef HEAPC_H
#define HEAPC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The API: what libheapc.so exports, and nothing else (it is built with
 * -fvisibility=hidden). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ---- error codes -------------------------------------------------------- */

/* Every error code, one table (as libuv's UV_ERRNO_MAP): X(code, value,
 * name, description). The table makes the HEAPC_E* constants,
 * heapc_errname and heapc_errdesc; codes are appended, never renumbered.
 * HEAPC_DAEMON_ERRNO_MAP: heapd's codes, the protocol's ErrCode ERR_<name>
 * negated (libheapc checks each against proto/heapd.proto at build time);
 * HEAPC_CLIENT_ERRNO_MAP: libheapc's own. */
#define HEAPC_DAEMON_ERRNO_MAP(X)                                                                                      \
    X(HEAPC_EPROTOCOL, -1, ERR_PROTOCOL, "malformed or unexpected message (either side)")                              \
    X(HEAPC_EVERSION, -2, ERR_VERSION, "protocol version mismatch between libheapc and heapd")                         \
    X(HEAPC_EINVAL, -3, ERR_INVALID, "bad argument (size 0, rank >= world_size, ...)")                                 \
    X(HEAPC_EMISMATCH, -4, ERR_MISMATCH, "attach parameters differ from the heap's")                                   \
    X(HEAPC_EASYMMETRY, -5, ERR_ASYMMETRY, "ranks disagree: n-th allocation sizes or collect points")                  \
    X(HEAPC_ETIMEOUT, -6, ERR_TIMEOUT, "a collective timed out; the message names missing ranks")                      \
    X(HEAPC_EPEER_GONE, -7, ERR_PEER_GONE, "a rank disconnected during a collective")                                  \
    X(HEAPC_ENOMEM, -8, ERR_NO_MEMORY, "heapd's backend could not create a chunk")                                     \
    X(HEAPC_EVA_EXHAUSTED, -9, ERR_VA_EXHAUSTED, "the heap would exceed its va_size")                                  \
    X(HEAPC_ENOTFOUND, -10, ERR_NOT_FOUND, "unknown heap (or block name, commit tag)")                                 \
    X(HEAPC_ESTATE, -11, ERR_STATE, "not valid now (not attached, already attached, rank taken)")                      \
    X(HEAPC_ENOTHELD, -12, ERR_NOT_HELD, "free of an offset this rank does not hold (double free)")                    \
    X(HEAPC_EBACKEND, -13, ERR_BACKEND, "backend or driver error; the message names the call")                         \
    X(HEAPC_EDENIED, -14, ERR_DENIED, "permission denied")                                                             \
    X(HEAPC_ESHUTDOWN, -15, ERR_SHUTDOWN, "heapd is stopping")                                                         \
    X(HEAPC_ESTORE, -16, ERR_STORE, "cross-node store failure")                                                        \
    X(HEAPC_EQUOTA, -17, ERR_QUOTA, "quota exceeded")
#define HEAPC_CLIENT_ERRNO_MAP(X)                                                                                      \
    X(HEAPC_ECONN, -100, ERR_CONN, "cannot connect, or heapd closed the connection: connect again")                    \
    X(HEAPC_EMAP, -101, ERR_MAP, "mapping a chunk into this process failed")                                           \
    X(HEAPC_EOOM, -102, ERR_OOM, "out of host memory in the client")                                                   \
    X(HEAPC_ENOREPLY, -103, ERR_NOREPLY, "no reply within heapc_set_timeout's limit; the connection was closed")       \
    X(HEAPC_ESYNC, -104, ERR_SYNC, "the device-sync hook failed before a collect")                                     \
    X(HEAPC_EBUSY, -105, ERR_BUSY, "heapc_status: the status page stayed mid-update (heapd died or stopped)")          \
    X(HEAPC_EBADFD, -106, ERR_BADFD,                                                                                   \
      "heapd sent an fd that is not a sealed memfd of the size needed (or not a doorbell)")
#define HEAPC_ERRNO_MAP(X) HEAPC_DAEMON_ERRNO_MAP(X) HEAPC_CLIENT_ERRNO_MAP(X)

enum {
    HEAPC_OK = 0,
#define HEAPC_ERRNO_ENUM(code, value, name, desc) code = value,
    HEAPC_ERRNO_MAP(HEAPC_ERRNO_ENUM)
#undef HEAPC_ERRNO_ENUM
};

/* Short name of a code: "ERR_ASYMMETRY" for heapd's codes (as in
 * docs/protocol.md), "ERR_CONN", "ERR_MAP", "ERR_OOM", "ERR_NOREPLY",
 * "ERR_SYNC", "ERR_BUSY", "ERR_BADFD" for the client's, "OK" for 0, "ERR_UNKNOWN" otherwise.
 * Thread-safe. */
const char *heapc_errname(int code);

/* One line saying what a code means (the table's description): "success"
 * for 0, "unknown error code" for a value not in the table. Never NULL;
 * thread-safe. heapc_errstr(c) says what happened to a call. */
const char *heapc_errdesc(int code);

/* ---- context ------------------------------------------------------------ */

typedef struct heapc heapc;

/* Default socket when neither the argument nor $HEAPD_SOCKET names one. */
#define HEAPC_DEFAULT_SOCKET   "/run/heapd/heapd.sock"
#define HEAPC_PROTOCOL_VERSION 1u

/* Connects to heapd at socket_path (NULL or "": $HEAPD_SOCKET, else
 * HEAPC_DEFAULT_SOCKET) and does the Hello handshake.
 *
 * Transport (issue 16): after an attach, Alloc, Free batches and Collect go
 * through a shared-memory request ring that heapd sets up for the
 * connection (no system call on the request path while heapd polls);
 * everything else, fds (growth chunks) and errors stay on the socket, and
 * every result is the same on both. $HEAPC_TRANSPORT: "ring" (default) or
 * "socket" (every request on the socket); another value fails the connect
 * with HEAPC_EINVAL. A heapd with `ring = off` in heapd.conf, or one that
 * predates rings, keeps the connection on the socket. The client spins a
 * few microseconds for an answer only on a machine with more cores than
 * spinners (heapd and the node's ranks of the heap), else it sleeps at
 * once; $HEAPC_RING_SPIN_US overrides the spin (0: never).
 *
 * Always returns a context, NULL only when the context itself cannot be allocated; check
 * heapc_err(c): HEAPC_ECONN (nothing listens there: the message names the
 * path and says to check heapd), HEAPC_EVERSION, HEAPC_EPROTOCOL. A failed
 * context must still be released with heapc_free_ctx. */
heapc *heapc_connect(const char *socket_path);

/* heapc_connect with a limit: the handshake fails with HEAPC_ENOREPLY after
 * timeout_ms (a heapd that accepts but does not answer: stopped, hung), and
 * the context keeps timeout_ms as its heapc_set_timeout. <0: no limit (as
 * heapc_connect). heapctl --timeout uses it. connect(2) itself does not wait
 * unless the socket's backlog is full. */
heapc *heapc_connect_timeout(const char *socket_path, int timeout_ms);

/* Closes the connection and releases the context. If still attached, the
 * heap is unmapped (the caller must make sure no device work still touches
 * it) and the connection just closes: queued frees that were not sent are
 * dropped and heapd sees a disconnect. Call heapc_detach first for an orderly
 * exit. NULL is a no-op. */
void heapc_free_ctx(heapc *c);

/* Last error code (0: none) and its sentence ("" when none). Never NULL. */
int heapc_err(const heapc *c);
const char *heapc_errstr(const heapc *c);

/* What heapd's Hello answered: "heapd 0.1.0", "host" / "cuda" ("" before). */
const char *heapc_server(const heapc *c);
const char *heapc_backend(const heapc *c);

/* Client-side limit, in milliseconds, on waiting for any one reply; < 0 (the
 * default) waits as long as heapd takes (heapd bounds collectives with the
 * heap's collect_timeout_ms). When it expires the call fails with
 * HEAPC_ENOREPLY and the connection is closed.
 * Whatever this limit, once the first byte of a frame from heapd has come,
 * the rest of it (payload and fds) must come within HEAPC_FRAME_TIMEOUT_MS
 * (default 10000; $HEAPC_FRAME_TIMEOUT_MS overrides, at connect), else the
 * call fails the same way: a frame cut short never hangs the client. */
#define HEAPC_FRAME_TIMEOUT_MS 10000
int heapc_set_timeout(heapc *c, int timeout_ms);

/* ---- attach ------------------------------------------------------------- */

typedef enum heapc_policy {
    HEAPC_POLICY_DEFAULT = 0,  /* heapd's default (coalesce) */
    HEAPC_POLICY_COALESCE = 1, /* exact sizes, free extents that merge; few collects */
    HEAPC_POLICY_SEED = 2,     /* the seed policy: LIFO classes, bump, mapped/8 trigger */
} heapc_policy;

/* "default" (0), else the policy's name ("coalesce", "seed": the values from
 * 1 up, without a gap), "unknown" past the last. */
const char *heapc_policy_name(heapc_policy p);

/* Issue 27: when a block every rank freed becomes reusable. EAGER: at the
 * free that completes it (no collect, no barrier; coalesce policy), on a
 * heap across nodes at an allocation number the nodes agree on through the
 * store (heapd.conf reclaim_lookahead; 0 there makes such heaps COLLECT);
 * COLLECT: at the next collect. A heap that uses the seed policy is always
 * COLLECT (heapc_get_params says which the heap got). */
typedef enum heapc_reclaim {
    HEAPC_RECLAIM_DEFAULT = 0, /* heapd.conf's reclaim (eager) */
    HEAPC_RECLAIM_EAGER = 1,
    HEAPC_RECLAIM_COLLECT = 2,
} heapc_reclaim;

/* Heap parameters. A zeroed struct (or params == NULL) takes heapd's
 * defaults for everything (heapd.conf). The first attach of a heap name
 * creates it; later attaches must give the same world size and the same
 * non-zero parameters, else HEAPC_EMISMATCH names the parameter. */
typedef struct heapc_params {
    uint64_t chunk_size;   /* growth unit; 0: default */
    uint64_t initial_size; /* mapped at creation; 0: one chunk */
    uint64_t va_size;      /* maximum extent per rank; 0: default */
    uint64_t min_block;    /* smallest block (power of two); 0: default */
    heapc_policy policy;
    uint32_t collect_timeout_ms; /* collectives fail after this; 0: default */
    /* cuda backend: this rank's GPU, "GPU-xxxxxxxx-..." (nvidia-smi -L).
     * NULL or "": the GPU of the calling thread's current CUDA context, else
     * device 0. Ignored (sent empty) on the host backend. */
    const char *device_uuid;
    /* Heaps spanning nodes: how many of the world_size ranks attach to this
     * node's heapd (0: all of them, a single-node heap), and the job's
     * incarnation (e.g. the launcher's run id; NULL or "": "0"), which must be
     * the same on every rank and keeps a rerun's store keys apart. */
    uint32_t local_size;
    const char *job;
    /* Issue 29: seconds the heap stays, with its chunks and their content,
     * once its last client is gone, so that a restarted job re-attaches to
     * it (at most heapd.conf's max_persist). 0: heapd.conf's persist
     * (heapc_attach_env: $HEAPD_PERSIST first); < 0: none, the heap goes with
     * its last client. heapc_get_params gives the heap's: seconds, or -1
     * for none. */
    int32_t persist_s;
    heapc_reclaim reclaim; /* issue 27: 0, heapd's default */
    /* Issue 27: spare chunks heapd keeps for each local rank, created and
     * exported ahead of need so that a growth only passes fds and maps them
     * (offsets do not depend on it). 0: heapd.conf's grow_ahead; < 0: none;
     * at most 16. heapc_get_params gives the heap's: a count, or -1 for
     * none. */
    int32_t grow_ahead;
    /* Issue 30, automatic trim (a heap on one node): when the bytes of
     * wholly free chunks (what heapc_trim would give back) reach this many
     * at an allocation, that allocation runs the collective trim first, on
     * every rank (heapd decides it once for the allocation number). 0:
     * heapd.conf's trim_threshold (default off); < 0: none. heapc_get_params
     * gives the heap's: bytes, or -1 for none. */
    int64_t trim_threshold;
    /* Issue 32: non-zero: no block straddles two extents (the initial
     * chunks, or one run of chunks a growth mapped), so that every block
     * lies in one NCCL window (libheapc_nccl's hnccl_register_heap); the
     * coalesce policy only (HEAPC_EINVAL otherwise). 0: off (the default's
     * placement: a growth may extend the top's free run, and a block may
     * cross into it). A later attach with 0 takes the heap's;
     * heapc_get_params gives it (1 or 0). */
    int32_t extent_bound;
    /* Issue 28, allocation without a message: > 0
     * (2..4096) asks for a heap whose ranks decide their allocations with a
     * replica of its allocator in libheapc, every local_every-th allocation
     * (and one that needs a collect, growth or trim) a round trip to heapd;
     * the others make no system call. 0: $HEAPD_DECIDE ("local": every
     * $HEAPD_DECIDE_EVERY-th, default 64; "daemon": as < 0), else the heap's
     * way (heapd decides, unless the heap was made with local_every). < 0:
     * heapd decides this rank's allocations, whatever the heap. Across
     * nodes every node must give the same (its eager rounds then go through
     * the store every local_every allocations, instead of heapd.conf's
     * reclaim_lookahead). heapc_get_params gives the heap's (0: heapd
     * decides). */
    int32_t local_every;
} heapc_params;

/* Attaches to heap `heap` as `rank` of `world_size` and maps the heap: its own
 * chunks and those of every rank this heapd serves (local peers), each rank
 * in its own reserved range of va_size bytes. Collective: returns when every
 * rank has attached (HEAPC_ETIMEOUT otherwise). A rank that attaches again
 * after a crash, or to a heap with no client, continues at the heap's
 * allocation number (after a clean detach while peers stayed: at its own)
 * and holds what it held, its peers' allocations since included
 * (heapc_resumed, heapc_live, heapc_lookup): also after
 * every rank was gone, for a heap kept by persist (issue 29: the heap's
 * generation counts such re-attaches; another uid, job secret or parameter
 * set is refused with HEAPC_EMISMATCH or HEAPC_EDENIED naming which).
 * Errors: HEAPC_ESTATE (this context is already attached, or the rank is
 * taken), HEAPC_EMISMATCH, HEAPC_EINVAL, HEAPC_EMAP (reserving or mapping
 * failed: nothing stays mapped), HEAPC_ECONN, ... */
int heapc_attach(heapc *c, const char *heap, uint32_t rank, uint32_t world_size, const heapc_params *params);

/* heapc_attach with the rank, world size and job taken from the launcher's
 * environment, so that a trainer started by torchrun or srun needs no
 * arguments. Read, in this order of preference:
 *   torchrun:  RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID
 *   Slurm:     SLURM_PROCID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE (else
 *              SLURM_TASKS_PER_NODE, e.g. "4(x2),3", with SLURM_NODEID),
 *              SLURM_JOB_ID and SLURM_STEP_ID
 * (torchrun's set wins when RANK is set). The number of ranks on this node
 * becomes params->local_size (0, a single-node heap, when it equals the
 * world size) and the run or job id params->job, unless params sets them.
 * `heap` NULL or "": $HEAPD_HEAP, else "torch-<run id>" (torchrun) or
 * "slurm-<job id>.<step id>" (Slurm). The rank and world size are then
 * heapc_rank(c) and heapc_world_size(c). When params->persist_s is 0,
 * $HEAPD_PERSIST gives it (issue 29: seconds, or "none"; unset: heapd's
 * default), so that a restarted job finds its heap and re-attaches.
 * Errors: HEAPC_EINVAL when neither launcher's variables are set, one is
 * missing or not a number (the message names the variable, its value and
 * the launcher), HEAPD_PERSIST is not one, and those of heapc_attach. */
int heapc_attach_env(heapc *c, const char *heap, const heapc_params *params);

/* The heap's effective parameters (heapd's defaults filled in) into *out;
 * out->device_uuid points into the context (valid until detach).
 * HEAPC_ESTATE when not attached. */
int heapc_get_params(heapc *c, heapc_params *out);

/* Unmaps every chunk and releases the reservations. Queued frees are sent
 * first, then Detach. The caller must make sure no device work still touches
 * the heap. When heapd is gone the heap is still unmapped locally and the
 * call returns HEAPC_ECONN. HEAPC_ESTATE when not attached. */
int heapc_detach(heapc *c);

/* ---- allocation --------------------------------------------------------- */

/* Allocates `size` bytes (rounded up to the heap's size class). *offset (if
 * not NULL) gets the offset, identical on every rank for the same allocation
 * number; *ptr (if not NULL) gets heapc_ptr(c, offset). Every rank's n-th
 * heapc_alloc must ask for the same size, else HEAPC_EASYMMETRY (heapd's
 * message names n, both ranks and both sizes, heapc_last_asymmetry gives
 * them; the heap is poisoned: every rank's next call on it fails so).
 * When heapd says a collect is needed first (before the heap grows, on the
 * policy's trigger, or forced by `heapctl collect`) the call sends the queued
 * frees whose stream work completed (heapc_free_async), takes part in the
 * collect (collective: waits for every rank) and retries. It does not wait
 * for the device (unless a hook is installed: heapc_set_device_sync). New chunks (own and local
 * peers') are mapped before the call returns.
 * HEAPC_EMAP: heapd made the allocation (the allocation number advanced and
 * *offset is set; free it as usual) but a new chunk could not be mapped.
 * Other errors: HEAPC_EINVAL (size 0), HEAPC_ESTATE (not attached),
 * HEAPC_EVA_EXHAUSTED, HEAPC_ENOMEM, HEAPC_ETIMEOUT, HEAPC_EPEER_GONE, ... */
int heapc_alloc(heapc *c, size_t size, void **ptr, uint64_t *offset);

/* heapc_alloc of a block with a name (issue 29), so that a job that
 * re-attaches after a restart finds it again (heapc_lookup). name: 1 to 255
 * bytes of UTF-8 text; NULL or "": heapc_alloc. Names are symmetric: every
 * rank's n-th allocation gives the same name, else HEAPC_EASYMMETRY naming n
 * and both names (heapc_last_asymmetry_name); a name alone does not poison
 * the heap and the allocation number is not consumed. A name may be given to
 * several blocks; heapc_lookup finds the latest. Errors: those of
 * heapc_alloc, HEAPC_EINVAL for a name of more than 255 bytes (nothing is
 * sent). The name travels on the request ring like any Alloc. */
#define HEAPC_NAME_MAX 255
int heapc_alloc_named(heapc *c, size_t size, const char *name, void **ptr, uint64_t *offset);

/* Releases the block at offset: heapc_free_async(c, offset, NULL), the
 * default stream (cuda backend: the legacy default stream, which waits for
 * the work of every blocking stream of the context; host backend: no stream,
 * the block is released at once).
 * Deferred: the offset is queued locally and
 * sent to heapd in one batch when the queue reaches the batch size
 * (heapc_set_free_batch), before a collect, at heapc_flush and at detach.
 * The block is reused only after a collect that follows its release by every
 * rank. The library tracks this rank's live blocks and refuses a double free
 * or an offset it never handed out at once (HEAPC_ENOTHELD); heapd checks
 * again when the batch arrives. After re-attaching to a heap this rank used
 * before, the attach reply's live set tells the library what the rank holds
 * (issue 29); from a heapd that sends none, blocks from the earlier
 * connection are unknown to the library: such an offset is sent to heapd
 * alone, at once, and heapd's verdict (HEAPC_ENOTHELD naming it) is this
 * call's result. A named block's name is forgotten here (heapc_lookup). */
int heapc_free(heapc *c, uint64_t offset);

/* Stream-ordered free: releases the block at offset once the work queued on
 * `stream` so far has completed, so a kernel still reading or writing the
 * block when this is called keeps it until it finished. stream: cuda
 * backend, a CUstream / cudaStream_t of the heap's device (NULL: the legacy
 * default stream); host backend, a heapc_hstream (NULL: none, released at
 * once). Frees on one stream are batched: one completion marker (a CUDA
 * event, recorded without timing) per run of frees on a stream, recorded
 * when the run ends (a free on another stream, heapc_set_free_batch's
 * count, heapc_flush, a collect). The marker is queried, never waited for,
 * at heapc_flush and at every collect (one recorded by that very call gets
 * at most 50 us of polling in all, so that an idle stream's block goes at
 * once): only then is the block sent to heapd
 * with the other queued frees. A block whose stream has not finished is
 * simply not released at this collect; a later one reclaims it (the
 * counters' stream_waiting counts such blocks). So a collect reclaims what
 * every rank released and finished using, and no rank waits for its device.
 * At heapc_detach every waiting block is sent (detach requires that no
 * device work still touches the heap). An offset from an earlier connection
 * (see heapc_free) is sent at once, without waiting for its stream: heapd's
 * verdict is the call's result. Errors: those of heapc_free, and
 * HEAPC_EBACKEND when the event cannot be recorded on stream (the message
 * names the call and the stream). */
int heapc_free_async(heapc *c, uint64_t offset, void *stream);

/* Issue 27, stream-ordered reuse (on unless $HEAPC_STREAM_REUSE is 0, or
 * heapc_set_stream_reuse(c, 0)): heapc_free_async releases the block to
 * heapd at once, not when its stream's work completed, so that under
 * reclaim eager the next allocation may reuse it while that work still
 * runs - torch's own rule. libheapc keeps the block's stream marker until
 * the work completed, and an allocation that reuses any part of the block
 * is ordered after it: on the same stream (heapc_alloc_async), nothing to
 * do; on another stream, that stream waits for the marker
 * (cuStreamWaitEvent: the call does not block); for heapc_alloc (no
 * stream), the call waits for the marker (cuEventSynchronize; host
 * backend: until the heapc_hstream completes). The counters' stream_early,
 * stream_in_flight and stream_reuse_waits count it. This orders the new
 * owner after the freeing rank's own work on its own copy; work another
 * rank queued on its copy is ordered by that rank's free. So free a block
 * only after every access to any rank's copy of it is queued before the
 * free on the accessing rank's stream, or has completed (a collective
 * orders the peers' accesses; one-sided peer reads need the reader's own
 * free to come after them, and the owner's reuse to follow a barrier or
 * collective with the reader). Off: the issue 18 behaviour above. */
int heapc_set_stream_reuse(heapc *c, int on);

/* heapc_alloc for a block that will be used on `stream` (cuda: a CUstream
 * of the heap's device, NULL the legacy default stream; host: a
 * heapc_hstream): a reused block that was freed on the same stream needs no
 * ordering at all, one freed on another stream is ordered with
 * cuStreamWaitEvent (host: waited for). Otherwise heapc_alloc. */
int heapc_alloc_async(heapc *c, size_t size, void *stream, void **ptr, uint64_t *offset);

/* A host stand-in for a device stream (host backend, and tests): a timeline
 * of work items. heapc_hstream_begin starts one and returns its ticket;
 * heapc_hstream_complete(s, t) marks every item up to ticket t done (any
 * thread). A block freed with heapc_free_async(c, off, s) is released once
 * every item begun before the free's marker is complete. Lock-free. */
typedef struct heapc_hstream heapc_hstream;
heapc_hstream *heapc_hstream_create(void);    /* NULL: out of memory */
void heapc_hstream_destroy(heapc_hstream *s); /* after the frees on it were sent */
uint64_t heapc_hstream_begin(heapc_hstream *s);
void heapc_hstream_complete(heapc_hstream *s, uint64_t ticket);
uint64_t heapc_hstream_pending(heapc_hstream *s); /* items begun, not complete */
/* Callers blocked now until work on s completes (a heapc_alloc that reuses a
 * block freed on s, issue 27): lets a test complete s once it sees one. */
uint64_t heapc_hstream_waiters(heapc_hstream *s);

/* heapc_free of the block that starts at ptr (a pointer heapc_alloc or
 * heapc_ptr gave for this rank's own copy). HEAPC_EINVAL when ptr is not in
 * this rank's mapped heap. */
int heapc_free_ptr(heapc *c, void *ptr);

/* Queue length that triggers sending a Free batch: 1..65536, default 1024
 * (1: every free is sent at once). */
int heapc_set_free_batch(heapc *c, size_t n);

/* Checks the streams of blocks freed with heapc_free_async (no wait) and
 * sends the queued frees now. */
int heapc_flush(heapc *c);

/* Collective: sends the queued frees (those freed on a stream once its work
 * completed: heapc_free_async) and collects (every rank must call it at the
 * same point of its allocation sequence; heapd reports HEAPC_EASYMMETRY
 * otherwise). Blocks released by every rank become reusable. Also usable as
 * a barrier across the heap's ranks (of the CPU: it does not sync the
 * device; sync your own work first if peers read what you wrote). */
int heapc_collect(heapc *c);

/* An optional device sync run before every collect (e.g.
 * cudaDeviceSynchronize): after it, every block this rank freed counts as
 * finished and is released at this collect. fn returns 0, or non-zero to
 * fail the collect with HEAPC_ESYNC. NULL (the default) runs nothing: since
 * issue 18 libheapc never syncs the device by itself; blocks wait for their
 * own stream instead (heapc_free_async), checked without blocking. Install a
 * hook only when frees must be reclaimed at the very next collect whatever
 * the device still runs; it costs the whole queue of work on every rank. */
typedef int (*heapc_sync_fn)(void *arg);
int heapc_set_device_sync(heapc *c, heapc_sync_fn fn, void *arg);

/* ---- addresses (lock-free, see Threads) ---------------------------------- */

/* This rank's address of offset; NULL when not attached or offset >=
 * heapc_mapped(c). */
void *heapc_ptr(heapc *c, uint64_t offset);

/* Local peer `rank`'s copy of offset (rank may be this rank); NULL when rank
 * is not served by this node's heapd, or offset >= heapc_mapped(c). */
void *heapc_peer_ptr(heapc *c, uint32_t rank, uint64_t offset);

/* Start of rank's copy of the heap (offset 0); NULL when not local. */
void *heapc_base(heapc *c, uint32_t rank);

/* Bytes mapped per rank (the heap's extent as this client has mapped it);
 * 0 when not attached. Only grows while attached. */
uint64_t heapc_mapped(heapc *c);

/* The name of the heap attached to ("" when not attached); valid until
 * detach. Lock-free like the calls above. */
const char *heapc_heap_name(heapc *c);

/* This rank and the heap's world size; UINT32_MAX and 0 when not attached. */
uint32_t heapc_rank(heapc *c);
uint32_t heapc_world_size(heapc *c);

/* The ranks this node's heapd serves (self included), ascending: writes up to
 * max of them into out (out may be NULL when max is 0) and returns how many
 * there are (0 when not attached). */
size_t heapc_local_ranks(heapc *c, uint32_t *out, size_t max);

/* This rank's next allocation number (0 for a new heap). Serialised. */
uint64_t heapc_next_seq(heapc *c);

/* The status page fd heapd sent at attach (read-only shared memory with the
 * heap's counters, for libheapc_nccl's probe), or -1. Owned by the context. */
int heapc_status_fd(heapc *c);

/* A snapshot of the status page heapd keeps for this rank. heapd updates it
 * at every allocation decision, free batch, collect and growth, and samples
 * the device's memory on a timer (heapd.conf meminfo_interval_ms; host
 * backend: the host's MemAvailable/MemTotal). */
typedef struct heapc_status_t {
    uint64_t mapped;        /* heap bytes mapped per rank */
    uint64_t live;          /* bytes of blocks some rank still holds */
    uint64_t released;      /* bytes every rank released, awaiting collect */
    uint64_t free;          /* bytes available to allocations */
    uint64_t rank_held;     /* bytes this rank holds */
    uint64_t rank_released; /* bytes this rank released, not yet reclaimed */
    uint64_t collects, growths;
    uint64_t allocs;                    /* allocations decided */
    uint64_t epoch;                     /* heap incarnation */
    uint64_t device_free, device_total; /* sampled device memory */
    uint64_t device_sampled_ns;         /* CLOCK_MONOTONIC of that sample */
    uint64_t updates;                   /* writes heapd made to the page */
    /* Issue 18 (0 from an older heapd). */
    uint64_t collects_skipped;     /* collects the coalesce policy did not ask for: one
                                      had just run, or no block existed */
    uint64_t stream_waiting;       /* this rank's blocks waiting for their stream, as
                                      of its last collect */
    uint64_t device_waits_avoided; /* this rank's collects without a device sync */
    /* Issue 30 (0 from an older heapd). */
    uint64_t state;    /* HEAPC_STATE_*: the heap's memory on this node */
    uint64_t resident; /* this rank's chunk bytes backed by memory now */
    uint64_t releases, restores;
} heapc_status_t;

/* Reads the status page: loads from shared memory, no syscall, no driver
 * call, no lock; a consistent snapshot (seqlock). Lock-free and safe from
 * any thread while attached (not against a concurrent detach). Returns 0,
 * HEAPC_ESTATE when not attached or heapd sent no page, or HEAPC_EBUSY when
 * the page stayed mid-update for HEAPC_STATUS_TRIES reads (yielding the CPU
 * after the first 64): heapd died or was stopped while writing it, so the
 * call never spins forever on a hot path (microseconds normally, at most a
 * few milliseconds before HEAPC_EBUSY). Does not touch heapc_err. */
#define HEAPC_STATUS_TRIES 4096
int heapc_status(heapc *c, heapc_status_t *out);

/* ---- re-attach: names, live sets, commit markers (issue 29) ---------------- */

/* A heap with persist (heapc_params.persist_s) outlives its ranks: with
 * every client gone it stays, chunks and content, that long. A process that
 * attaches as one of its ranks (same heap name, uid, job secret, world size,
 * parameters; heapc_attach as the first time) maps every chunk at the same
 * offsets, goes on at the heap's allocation number and gets its live set
 * (with names) and the commit markers. Such an attach returns without
 * waiting for the other ranks, whose collectives fail (HEAPC_EPEER_GONE,
 * naming the rank) until they are back: a restarted job waits for its ranks
 * first (python/heapd does). Only heapc_commit below talks to heapd. */

/* The block named `name` that this rank holds: its offset and the size it
 * was allocated with (either may be NULL). Found in what the attach reply
 * gave and in this context's own heapc_alloc_named calls, latest first; a
 * freed block is forgotten at its heapc_free. Serialised. Returns 0, or
 * HEAPC_ENOTFOUND (none, or name NULL or ""), HEAPC_ESTATE (not attached). */
int heapc_lookup(heapc *c, const char *name, uint64_t *offset, uint64_t *size);

/* Collective over the heap's ranks: records `value` under `tag` (1 to 64
 * bytes of UTF-8 text, at most 64 tags per heap) as the heap's commit
 * marker, once every rank committed the same value at the same point of its
 * allocation sequence (the commit carries the rank's next allocation
 * number). The queued frees are sent first (as heapc_flush); device work is
 * not waited for: sync it first when the marker says that the device's
 * writes are complete. Typical use: the step whose state every rank holds,
 * which a restarted job reads with heapc_committed. Errors: HEAPC_EASYMMETRY
 * (ranks committed different values or at different points: the message
 * names them; the marker is unchanged), HEAPC_EINVAL (a tag of 0 or more
 * than 64 bytes, a heap that spans nodes), HEAPC_ETIMEOUT,
 * HEAPC_EPEER_GONE, HEAPC_ESTATE, ... */
#define HEAPC_TAG_MAX 64
int heapc_commit(heapc *c, const char *tag, uint64_t value);

/* The marker committed under tag, as of the attach reply or this context's
 * last heapc_commit of it, into *value (if not NULL). Returns 0, or
 * HEAPC_ENOTFOUND (never committed), HEAPC_ESTATE (not attached).
 * Serialised. */
int heapc_committed(heapc *c, const char *tag, uint64_t *value);

/* The heap's generation: how many times its ranks re-attached since it was
 * created (0: none), as of the attach reply (or the last heapc_commit's
 * reply). 0 when not attached. Serialised. */
uint64_t heapc_generation(heapc *c);

/* 1 when this attach found this rank's earlier attach of the heap (a
 * re-attach: heapc_live lists what the rank holds), 0 otherwise (a new
 * rank, or not attached). Serialised. */
int heapc_resumed(heapc *c);

/* A block this rank holds, as the attach reply listed it: allocation number
 * seq, offset, the size asked for and the size reserved, and its name (""
 * for none; valid until detach). */
typedef struct heapc_block {
    uint64_t seq, offset, size, block_size;
    const char *name;
} heapc_block;

/* The live set the attach reply gave (what this rank held when it
 * re-attached; empty on a first attach), ascending seq: writes up to max
 * blocks into out (out may be NULL when max is 0) and returns how many there
 * are. Not updated by later allocations and frees (heapc_lookup is).
 * Serialised. */
size_t heapc_live(heapc *c, heapc_block *out, size_t max);

/* ---- counters and stats -------------------------------------------------- */

/* What this context did since it attached (serialised). */
typedef struct heapc_counters {
    uint64_t allocs;                /* successful heapc_alloc calls */
    uint64_t frees;                 /* heapc_free calls accepted (queued) */
    uint64_t free_batches;          /* Free messages sent */
    uint64_t collects;              /* collects this rank took part in */
    uint64_t collects_needed;       /* of those, asked for by heapd during heapc_alloc */
    uint64_t chunks_mapped;         /* chunks mapped (own and peers') */
    uint64_t heap_collects;         /* the heap's collect count after the last collect */
    uint64_t last_reclaimed_blocks; /* what the last collect reclaimed */
    uint64_t last_reclaimed_bytes;
    uint64_t queued_frees; /* frees queued now, not yet sent */
    /* Issue 18: stream-ordered frees. */
    uint64_t stream_waiting;       /* blocks freed whose stream work has not completed
                                      (or was not checked yet): not yet sent */
    uint64_t stream_markers;       /* completion markers (CUDA events) recorded */
    uint64_t device_waits_avoided; /* collects without a device sync: no hook, and the
                                    cuda backend or blocks waiting for a stream */
    /* Issue 27: stream-ordered reuse (heapc_set_stream_reuse). */
    uint64_t stream_early;       /* stream-ordered frees released to heapd at the free */
    uint64_t stream_in_flight;   /* of them, blocks whose stream work has not completed
                                    (or was not checked yet) */
    uint64_t stream_reuse_waits; /* allocations that reused such a block on another
                                    stream, or on none, and so waited for its stream */
    /* Issue 28: allocation without a message (HEAPC_DECIDE=local). */
    uint64_t local_allocs; /* allocations this rank's replica decided (no message) */
    uint64_t replica_lost; /* 1 once the replica stopped deciding (a step it could
                              not follow): every allocation then asks heapd */
} heapc_counters;
int heapc_get_counters(heapc *c, heapc_counters *out);

typedef struct heapc_rank_stats {
    uint32_t rank;
    int attached;                  /* 1 when the rank is connected and attached */
    uint64_t live_bytes;           /* held by this rank */
    uint64_t released_bytes;       /* released by this rank, not yet reclaimed */
    uint64_t next_seq;             /* allocation number reached */
    uint32_t pid;                  /* 0 when unknown */
    uint64_t stream_waiting;       /* issue 18: blocks waiting for their stream at the
                                      rank's last collect */
    uint64_t device_waits_avoided; /* the rank's collects without a device sync */
} heapc_rank_stats;

/* A latency histogram from heapd: counts[i] observations <= bounds[i] (and
 * above bounds[i-1]; not cumulative), counts[nbounds] above every bound. */
#define HEAPC_HIST_MAX 16
typedef struct heapc_hist {
    size_t nbounds;                /* <= HEAPC_HIST_MAX - 1 */
    double bounds[HEAPC_HIST_MAX]; /* seconds, ascending */
    uint64_t counts[HEAPC_HIST_MAX];
    uint64_t count;
    double sum_seconds;
} heapc_hist;

typedef struct heapc_heap_stats {
    char *name;
    uint32_t world_size;
    heapc_params params;     /* params.device_uuid is NULL */
    uint64_t mapped;         /* bytes mapped per rank */
    uint64_t live_bytes;     /* blocks some rank still holds */
    uint64_t released_bytes; /* blocks every rank released, awaiting collect */
    uint64_t free_bytes;     /* mapped bytes available to allocations */
    uint64_t collects;
    uint64_t growths;
    uint32_t clients;
    uint64_t next_seq;            /* allocations decided so far */
    uint64_t epoch;               /* heap incarnation */
    uint64_t pending_collect_seq; /* collect owed at this seq (0 if none, or at 0:
                                     see collect_pending) */
    uint64_t device_free;         /* the device's free and total bytes (host backend:
                                     the host's MemAvailable and MemTotal; 0: no sample yet) */
    uint64_t device_total;
    size_t nranks;
    heapc_rank_stats *ranks;
    uint64_t collects_skipped; /* issue 18: collects the coalesce policy did not ask
                                  for (one had just run, or no block existed) */
    int collect_pending;       /* 1: a collect (forced or the allocator's) is owed
                                  at pending_collect_seq, which may be 0 */
    uint32_t owner_uid;        /* the uid that created the heap */
    heapc_hist collect_wait;   /* seconds from the first rank's collect to the replies */
    heapc_hist growth;         /* seconds heapd took to create a growth's chunks */
    /* What quota_uid charges besides chunks: the allocator's bitmaps and
     * block records, the decision log (issue 33). */
    uint64_t bookkeeping_bytes;
    /* Issue 29: the seconds the heap stays once its clients are all gone
     * (0: it goes with its last client), and how long it has been without
     * one (0: it has clients; > 0: detached, awaiting a re-attach or
     * `heapctl drop`); its re-attaches since creation and its commit
     * markers. */
    uint32_t persist_s;
    uint64_t detached_ms;
    uint64_t generation;
    uint32_t markers;
    /* Issue 30: HEAPC_STATE_* on this node, the chunk bytes backed by memory
     * now (every local rank's), the host copy's bytes, releases, restores. */
    uint32_t state;
    uint64_t resident_bytes, host_copy_bytes;
    uint64_t releases, restores;
    /* Issue 27: blocks reclaimed at their last free (params.reclaim eager),
     * with no collect. */
    uint64_t eager_reclaims;
    /* Issue 27: the spare chunks' bytes heapd holds for the heap (every
     * local rank's; charged to the quotas like chunks) and the spares each
     * rank keeps (0: none). */
    uint64_t spare_bytes;
    uint32_t grow_ahead;
    /* Issue 30: trims that gave chunks back on this node, and the chunk
     * bytes they gave back (every local rank's), in all. */
    uint64_t trims, trimmed_bytes;
} heapc_heap_stats;

typedef struct heapc_daemon_stats {
    char *version;    /* heapd's version */
    char *backend;    /* "host" or "cuda" */
    uint32_t clients; /* connections heapd serves */
    size_t nheaps;
    heapc_heap_stats *heaps;
    uint64_t uptime_ms;  /* since heapd started */
    char *store;         /* the store URL ("" : single node) */
    int store_connected; /* 1: connected and subscribed */
    uint64_t quota_heap; /* heapd.conf quotas in bytes (0: none) */
    uint64_t quota_uid;
} heapc_daemon_stats;

/* Statistics of heap `heap` (NULL or "": every heap) into a new *out that
 * the caller releases with heapc_stats_free. Works without attaching.
 * HEAPC_ENOTFOUND for an unknown heap. */
int heapc_stats(heapc *c, const char *heap, heapc_daemon_stats **out);
void heapc_stats_free(heapc_daemon_stats *s);

/* Admin: makes every rank of `heap` collect at the same point of its
 * allocation sequence; *at_seq (if not NULL) gets the allocation number at
 * which it takes effect. Works without attaching. */
int heapc_force_collect(heapc *c, const char *heap, uint64_t *at_seq);

/* Admin (issue 29): releases detached heap `heap` (no client attached; see
 * heapc_heap_stats.detached_ms) now, with its chunks and their content;
 * *released_bytes (if not NULL) gets the chunk bytes released. Its owner,
 * root and heapd.conf's admin_group may. HEAPC_ENOTFOUND for an unknown
 * heap, HEAPC_ESTATE while clients are attached to it, HEAPC_EDENIED for
 * another uid's. Works without attaching. */
int heapc_drop(heapc *c, const char *heap, uint64_t *released_bytes);

/* ---- for bindings (python/heapd) ------------------------------------------ */

/* The layout of the public structs above: bumped whenever one of them
 * changes (a field added, moved or retyped). A binding that copies the
 * structs (ctypes) compares it, and heapc_sizeof of each, with its own at
 * load time and refuses a libheapc it does not match. */
#define HEAPC_ABI_VERSION 7u
uint32_t heapc_abi_version(void);

/* sizeof the public struct named `type` ("heapc_params", "heapc_status_t",
 * "heapc_counters", "heapc_rank_stats", "heapc_hist", "heapc_heap_stats",
 * "heapc_daemon_stats", "heapc_block"); 0 for another name. */
size_t heapc_sizeof(const char *type);

/* A byte size as heapd.conf writes it ("4096", "512K", "64M", "64MiB",
 * "256 MiB", "1T": decimal digits, an optional binary unit) into *out.
 * Returns 0, or HEAPC_EINVAL (and leaves *out) for anything else: a sign,
 * a fraction ("1.5G"), "64MB", "64Mi", 2^64 bytes or more. No context, no
 * allocation: the parser heapd itself uses. */
int heapc_parse_size(const char *s, uint64_t *out);

/* ---- release and restore (issue 30) ------------------------------------------ */

/* Collective over the heap's ranks (each node's heapd acts once its local
 * ranks all called): every local rank's chunks are unmapped in every
 * process and their memory given back (cudaMemGetInfo's free grows by it);
 * offsets, the allocator's state, live blocks and names, and each rank's
 * address reservation stay, so pointers and tensors made before are valid
 * again after heapc_restore. mode: HEAPC_RELEASE_DISCARD (the content is
 * dropped: restore gives zeros) or HEAPC_RELEASE_HOST (heapd copies it into
 * host memory it owns, which outlives the clients, and refills the chunks
 * at restore); | HEAPC_RELEASE_KEEP (host mode): the host copy stays with
 * the heap after restore, allocated and pinned, so the next host release
 * costs only the copy. The queued frees are sent first; the caller's device
 * work on the heap must be complete (sync first: python/heapd does).
 * Touching the heap's memory while released is the caller's error: a
 * segmentation fault (host) or a device fault (cuda), as any unmapped
 * address. While released, alloc fails with HEAPC_ESTATE; free, collect,
 * lookup and stats work. Errors: HEAPC_ESTATE (not attached, already
 * released), HEAPC_EINVAL (a bad mode, or ranks asked for different
 * modes), HEAPC_ETIMEOUT, HEAPC_EPEER_GONE (naming the rank; nothing was
 * released), HEAPC_EBACKEND, ... */
#define HEAPC_RELEASE_DISCARD 0
#define HEAPC_RELEASE_HOST    1
#define HEAPC_RELEASE_KEEP    0x100
int heapc_release(heapc *c, int mode);
/* heapc_release of only the chunks that lie wholly inside the live blocks
 * named names[0..nnames) (heapc_alloc_named; the same names, in the same
 * order, on every rank): on every local rank those chunks are unmapped and
 * given back (saved in host mode), the heap's other chunks stay mapped and
 * usable; part of a named block that shares a chunk with another block
 * stays. The heap is released all the same (alloc fails with HEAPC_ESTATE
 * until heapc_restore, which brings those chunks back at their addresses).
 * NULL or nnames 0: heapc_release. HEAPC_ENOTFOUND (nothing released) when
 * no live block has one of the names; HEAPC_EINVAL for an empty name. */
int heapc_release_named(heapc *c, int mode, const char *const *names, size_t nnames);

/* Collective like heapc_release: the chunks are created again, refilled from
 * the host copy (host mode) and mapped at the addresses they had. Errors:
 * HEAPC_ESTATE (not released), HEAPC_ENOMEM (the device has no room: the
 * heap stays released, try again), HEAPC_EQUOTA, HEAPC_ETIMEOUT,
 * HEAPC_EPEER_GONE (the heap stays released), HEAPC_EMAP, ... */
int heapc_restore(heapc *c);

/* Trim (issue 30): collective over the heap's ranks like heapc_release. Once
 * every local rank called, heapd gives back every whole chunk of the heap
 * that no block, live or pending, touches: those at the top of the extent
 * leave it (the extent keeps at least one chunk), one below a live block
 * becomes a hole inside it (policy seed: only the top), on every local
 * rank: heapd releases its chunk and each
 * process unmaps it, its own and its peers' (the memory is free once the
 * last mapping goes). Offsets, live blocks and their content, names and the
 * allocator's state stay; heapc_mapped() shrinks by the top's chunks; a
 * later allocation that needs the room grows the heap again at the same
 * offsets, holes first (mapped again at their addresses). A block
 * freed with heapc_free_async whose stream work has not completed is still
 * held (not wholly free); the completed ones are sent first (heapc_flush),
 * with no device sync. Under reclaim = collect, blocks every rank freed are
 * pending until a collect: call heapc_collect first. *trimmed_bytes (may be
 * NULL) gets the bytes each rank gave back (0: nothing to trim).
 * Errors: HEAPC_ESTATE (not attached, released), HEAPC_EINVAL (a heap that
 * spans nodes), HEAPC_ETIMEOUT (naming the ranks that never called),
 * HEAPC_EPEER_GONE (naming the rank; nothing was trimmed), ...
 * With heapc_params.trim_threshold, heapc_alloc* runs this trim by itself
 * at the allocation heapd names (every rank at the same one), returning its
 * errors with nothing allocated. */
int heapc_trim(heapc *c, uint64_t *trimmed_bytes);

/* The heap's memory as this context knows it: HEAPC_STATE_ACTIVE or
 * HEAPC_STATE_RELEASED (after a heapc_release, or an attach to a released
 * heap, until heapc_restore); -1 when not attached. The status page's
 * `state` has heapd's view, RELEASING and RESTORING included. Serialised. */
#define HEAPC_STATE_ACTIVE    0
#define HEAPC_STATE_RELEASING 1
#define HEAPC_STATE_RELEASED  2
#define HEAPC_STATE_RESTORING 3
int heapc_state(heapc *c);

/* ---- the mapping hook (issue 32) ------------------------------------------ */

/* A callback told when this rank's own copy of the heap gains or loses
 * mapped chunks, for a layer above libheapc that registers the mapped
 * memory somewhere (libheapc_nccl: NCCL windows). Each call carries the
 * runs of one operation: n runs, ascending and disjoint, run i at heap
 * offsets [offsets[i], offsets[i] + sizes[i]) (whole chunks), at address
 * base + offsets[i] (base: heapc_base of this rank).
 *   HEAPC_MAP_ADDED     after heapc_attach, a growth (heapc_alloc*) or
 *                       heapc_restore mapped the runs. A growth reaches
 *                       every rank at the same allocation number, so the
 *                       event comes at the same point of every rank's
 *                       sequence.
 *   HEAPC_MAP_REMOVING  before heapc_release, heapc_trim, heapc_detach,
 *                       heapc_free_ctx (or a failed attach or restore)
 *                       unmap the runs.
 *   HEAPC_MAP_DROPPED   the context forgets the hook (detach, free_ctx, a
 *                       failed attach), after the REMOVING of every run;
 *                       n is 0 and the hook is not called again.
 * heapc_set_map_hook with fn != NULL on an attached context with mapped
 * chunks calls fn at once with HEAPC_MAP_ADDED for every run mapped now, so a
 * hook set after the attach learns the extent; fn NULL removes the hook (no
 * event). One hook per context: another fn or arg while one is set fails
 * with HEAPC_ESTATE (remove it first). The hook runs on the thread of the call, with the context's mutex
 * held: it must not call libheapc on c except the lock-free calls (see
 * Threads). It cannot fail a libheapc call: it keeps its own errors. */
#define HEAPC_MAP_ADDED    1
#define HEAPC_MAP_REMOVING 2
#define HEAPC_MAP_DROPPED  3
typedef void (*heapc_map_fn)(void *arg, int event, char *base, const uint64_t *offsets, const uint64_t *sizes,
                             size_t n);
int heapc_set_map_hook(heapc *c, heapc_map_fn fn, void *arg);

/* ---- an asymmetric allocation's figures ---------------------------------- */

/* When the last call failed with HEAPC_EASYMMETRY because ranks asked for
 * different sizes as their n-th allocation (heapd then poisons the heap:
 * every rank's next call on it, alloc, free, collect or attach, fails the
 * same way, a collect in progress too), the figures heapd sent with the
 * error (docs/protocol.md, Error): *n is that allocation number and
 * ranks[i] asked for sizes[i] bytes, in the order they asked (ranks[0]
 * decided n), for i < max. Returns how many ranks heapd named (2), or 0
 * when the last call did not fail so: a success, another error, an
 * asymmetric collect, a heapd that predates the fields. n, ranks and sizes
 * may be NULL (max 0: only the count). Reads the last call's result as
 * heapc_errstr does. */
size_t heapc_last_asymmetry(const heapc *c, uint64_t *n, uint32_t *ranks, uint64_t *sizes, size_t max);

/* Issue 29: when the last call failed with HEAPC_EASYMMETRY because ranks
 * named their n-th allocation differently (heapc_alloc_named), the name
 * ranks[i] of heapc_last_asymmetry gave; NULL for i at or past its count, or
 * when heapd sent no names (a size asymmetry). Valid until the next call on
 * c. */
const char *heapc_last_asymmetry_name(const heapc *c, size_t i);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* HEAPC_H */
