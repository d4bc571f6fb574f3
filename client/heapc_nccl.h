/* heapc_nccl.h - libheapc_nccl: NCCL calls wrapped with a memory probe that
 * costs a few loads instead of an allocator walk plus a driver sync.
 *
 * Why. A trainer that checks free device memory before every collective
 * (torch.cuda.memory_stats, O(allocator segments), plus cudaMemGetInfo,
 * which synchronises with the driver) and releases memory when it runs low
 * pays that probe on the hot path, again and again. Here the probe reads the
 * status page heapd keeps for this rank (heapc_status(): loads from shared
 * memory, no syscall, no driver call), and by default the hot collectives do
 * not probe at all.
 *
 *     heapc *c = heapc_connect(NULL);
 *     heapc_attach(c, "job42", rank, world, NULL);
 *     hnccl_ctx *x = hnccl_new(c);              // reads HEAPC_NCCL_* (below)
 *     if (hnccl_err(x)) { fprintf(stderr, "%s\n", hnccl_errstr(x)); ... }
 *     hnccl_set_release_cb(x, empty_caches, trainer);
 *     hnccl_set_policy(x, "all_gather_into_tensor,allreduce", HNCCL_PROBE);
 *     int rc = hnccl_all_reduce(x, buf, buf, n, ncclFloat, ncclSum, comm, stream);
 *     if (rc != 0) fprintf(stderr, "%s\n", hnccl_errstr(x)); // names the memory state
 *     hnccl_free(x);
 *
 * NCCL is loaded with dlopen("libnccl.so.2") on the first wrapped call (or
 * hnccl_load), so programs link this library on machines without NCCL; only
 * the calls fail there. The function table can be replaced (hnccl_set_table):
 * the tests record the calls instead of running NCCL, and a program whose
 * communicators come from an NCCL it already has (linked in, or inside
 * another library) gives that NCCL's functions, since a communicator must be
 * used with the NCCL instance that created it.
 *
 * Ops. Each wrapper carries an op (hnccl_op) whose policy says whether it
 * probes before calling NCCL: HNCCL_SKIP or HNCCL_PROBE. Defaults: the hot
 * collectives (all_reduce, all_gather, reduce_scatter, broadcast, reduce,
 * all_to_all, send, recv) skip; group_start and group_end probe (once per
 * group of calls). Policies take names (hnccl_set_policy, and the
 * environment): an op's own name, or the spelling a trainer uses:
 *
 *   op              torch.distributed                      c10d ProcessGroup methods
 *   all_reduce      all_reduce                             allreduce
 *   all_gather      all_gather, all_gather_into_tensor     allgather, _allgather_base,
 *                                                          allgather_into_tensor_coalesced
 *   reduce_scatter  reduce_scatter, reduce_scatter_tensor  reduce_scatter, _reduce_scatter_base,
 *                                                          reduce_scatter_tensor_coalesced
 *   broadcast       broadcast                              broadcast
 *   reduce          reduce                                 reduce
 *   all_to_all      all_to_all, all_to_all_single          alltoall, alltoall_base
 *   send            send, isend                            send
 *   recv            recv, irecv                            recv
 *   send + recv     batch_isend_irecv
 *   group_start, group_end (their own names only)
 *   every op: "all"; "none" gives every op the opposite setting.
 *
 * Names are case-sensitive; a list separates names by commas or blanks. An
 * unknown name fails the whole call (nothing changes) with HNCCL_EINVAL and a
 * message that names it and lists the valid names.
 *
 * Environment, read by hnccl_new and hnccl_apply_env:
 *   HEAPC_NCCL_PROBE   names of ops that probe     e.g. "all_gather_into_tensor,_allgather_base,allreduce"
 *   HEAPC_NCCL_SKIP    names of ops that skip      e.g. "all" or "group_end"
 *   HEAPC_NCCL_FREE_MIN  the threshold, a size: "3G", "512M", "1073741824" (see size.h)
 * "all" / "none" in either variable apply first, then the named ops, so
 * HEAPC_NCCL_PROBE=all HEAPC_NCCL_SKIP=send probes everything but send, and
 * HEAPC_NCCL_SKIP=all HEAPC_NCCL_PROBE=allreduce only all_reduce. An op named
 * in both variables is an error. Unset or empty variables change nothing.
 *
 * The probe. It reads device free memory - from the status page by default
 * (heapd samples the device on a timer: heapd.conf meminfo_interval_ms; on
 * the host backend it is the host's MemAvailable), or with
 * HNCCL_SOURCE_CUDA from cuMemGetInfo at most once per interval - and, when
 * free < threshold (default HNCCL_DEFAULT_THRESHOLD, 3 GiB), calls the
 * release callback before the NCCL call. A probe that cannot read memory (not
 * attached, no page, cuMemGetInfo failing) is counted (probe_errors) and the
 * NCCL call is made anyway: skipping a collective on one rank would hang the
 * others.
 *
 * Errors. The wrappers return what NCCL returned (ncclSuccess = 0, an error
 * ncclResult_t > 0, or ncclInProgress for non-blocking communicators, which
 * is not an error), or a negative HNCCL_E* code when the wrapper itself could
 * not call NCCL. Every other call returns HNCCL_OK or a negative code. A
 * failure records hnccl_err / hnccl_errstr in the context; for an NCCL error
 * the message names the NCCL call, the op, ncclGetErrorString, NCCL's last
 * error text when available, and the memory state at that moment from the
 * status page (device free/total, heap mapped/live/released/free, what this
 * rank holds). A successful call sets hnccl_err to 0. The library never
 * prints and never exits.
 *
 * Threads. Configure a context (hnccl_set_*, hnccl_apply_env) before sharing
 * it; configuration calls must not run concurrently with wrapped calls on the
 * same context. Wrapped calls, hnccl_probe and hnccl_get_counters may then
 * run on several threads at once: the counters are atomic, the probe is
 * lock-free (the error message takes a mutex, on failures only). hnccl_err /
 * hnccl_errstr describe the last failed call of any thread. The heapc context
 * must stay attached while wrapped calls probe its page (heapc_detach and
 * heapc_free_ctx must not race with them).
 */
#ifndef HEAPC_NCCL_H
#define HEAPC_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "heapc.h"

/* NCCL's types: from nccl.h when it is available (or already included), else
 * declared here with the same representation (the library never needs nccl.h
 * at run time: it dlopens libnccl). */
#if !defined(NCCL_H_) && ((defined(HEAPD_HAVE_CUDA_H) && HEAPD_HAVE_CUDA_H) || defined(HNCCL_USE_NCCL_H))
#if defined(__has_include)
#if __has_include(<nccl.h>)
#define HNCCL_INCLUDE_NCCL_H 1
#endif
#else
#define HNCCL_INCLUDE_NCCL_H 1
#endif
#endif

#if defined(HNCCL_INCLUDE_NCCL_H)
/* nccl.h declares ncclGroupStart() and a few others without a prototype
 * (C only: in C++ an empty list is a prototype). */
#ifndef __cplusplus
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#endif
#include <nccl.h>
#ifndef __cplusplus
#pragma GCC diagnostic pop
#endif
#endif

#if !defined(NCCL_H_)
/* The subset of nccl.h (2.x) this API uses; values as in nccl.h. Include
 * nccl.h before this header (or define HNCCL_USE_NCCL_H) to use NCCL's own. */
typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;
typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;
typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;
#endif

/* Windows (NCCL >= 2.27), as nccl.h has them; declared here when the nccl.h
 * included (or none) predates them. */
#if !defined(NCCL_WIN_COLL_SYMMETRIC)
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_WIN_DEFAULT        0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The API: what libheapc_nccl.so exports, and nothing else (it is built with
 * -fvisibility=hidden). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ---- codes --------------------------------------------------------------- */

enum {
    HNCCL_OK = 0,
    /* 1 .. 7: the ncclResult_t NCCL returned (wrappers only). */
    HNCCL_EINVAL = -1,  /* bad argument: unknown op name, NULL, unknown data type, ... */
    HNCCL_ELOAD = -2,   /* libnccl.so.2 (or libcuda.so.1 for HNCCL_SOURCE_CUDA) could not
                           be loaded, lacks a symbol, or the table lacks the function */
    HNCCL_ESOURCE = -3, /* hnccl_probe: memory could not be read (no status page: not
                           attached; cuMemGetInfo failed) */
    HNCCL_EOOM = -4,    /* out of host memory */
};

/* "OK", "ERR_INVAL", "ERR_LOAD", "ERR_SOURCE", "ERR_OOM"; NCCL's codes by
 * their enum name ("ncclUnhandledCudaError"); "ERR_UNKNOWN" otherwise. */
const char *hnccl_errname(int code);

/* ---- ops and policies ------------------------------------------------------ */

typedef enum hnccl_op {
    HNCCL_OP_ALL_REDUCE = 0,
    HNCCL_OP_ALL_GATHER,
    HNCCL_OP_REDUCE_SCATTER,
    HNCCL_OP_BROADCAST,
    HNCCL_OP_REDUCE,
    HNCCL_OP_ALL_TO_ALL,
    HNCCL_OP_SEND,
    HNCCL_OP_RECV,
    HNCCL_OP_GROUP_START,
    HNCCL_OP_GROUP_END,
    HNCCL_NOPS
} hnccl_op;

typedef enum hnccl_mode {
    HNCCL_SKIP = 0,  /* no probe before the call */
    HNCCL_PROBE = 1, /* probe (and maybe call the release callback) before the call */
} hnccl_mode;

/* Bit (1u << op) for each op that probes by default (group_start, group_end). */
#define HNCCL_DEFAULT_PROBE_MASK ((1u << HNCCL_OP_GROUP_START) | (1u << HNCCL_OP_GROUP_END))
#define HNCCL_ALL_OPS_MASK       ((1u << HNCCL_NOPS) - 1u)

/* The op's own name ("all_reduce", ..., "group_end"); NULL when out of range. */
const char *hnccl_op_name(hnccl_op op);

/* The ops one name means, as a mask of (1u << op): an op name, an alias of
 * the table above, or "all" (every op). "none" gives 0 with HNCCL_OK (in a
 * policy it gives every op the opposite mode). HNCCL_EINVAL for an unknown
 * name or NULL. No context, no message: thread-safe. */
int hnccl_ops_from_name(const char *name, uint32_t *mask);

/* Every accepted name, comma-separated ("all, none, all_reduce, allreduce,
 * ..."), a static string. */
const char *hnccl_valid_names(void);

/* ---- NCCL function table --------------------------------------------------- */

/* The NCCL entry points the wrappers call, with NCCL's signatures. A
 * replacement (hnccl_set_table) must provide the wrapped calls it is used
 * with, CommCount for all_to_all, and GetErrorString for error messages; the
 * other members may be NULL. */
typedef struct hnccl_table {
    ncclResult_t (*AllReduce)(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*AllGather)(const void *send, void *recv, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                              cudaStream_t stream);
    ncclResult_t (*ReduceScatter)(const void *send, void *recv, size_t recvcount, ncclDataType_t dt, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Broadcast)(const void *send, void *recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                              cudaStream_t stream);
    ncclResult_t (*Reduce)(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                           ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Send)(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*Recv)(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*CommCount)(const ncclComm_t comm, int *count);
    const char *(*GetErrorString)(ncclResult_t result);
    const char *(*GetLastError)(ncclComm_t comm); /* NCCL >= 2.13; may be NULL */
    /* Communicator setup, for programs and tests that have no NCCL headers. */
    ncclResult_t (*GetVersion)(int *version);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    /* HNCCL_SOURCE_CUDA: the CUDA driver's cuMemGetInfo (current context of
     * the calling thread); returns 0 (CUDA_SUCCESS) or the CUresult. The real
     * table loads it from libcuda.so.1; NULL when that is missing. */
    int (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    /* Issue 32 (hnccl_register_heap): NCCL >= 2.27; NULL in the real table
     * when libnccl.so.2 is older. */
    ncclResult_t (*CommWindowRegister)(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int win_flags);
    ncclResult_t (*CommWindowDeregister)(ncclComm_t comm, ncclWindow_t win);
} hnccl_table;

/* The real table, loaded once per process (thread-safe, never unloaded):
 * dlopen("libnccl.so.2") and its symbols, NCCL >= 2.7 (send/recv); libcuda.so.1
 * for MemGetInfo when present (cuInit on first use). NULL when NCCL cannot be
 * loaded, with the reason in err (which may be NULL). */
const hnccl_table *hnccl_load(char *err, size_t errlen);

/* ---- context ------------------------------------------------------------- */

typedef struct hnccl_ctx hnccl_ctx;

/* A context probing c's status page (c may be NULL or not yet attached: the
 * probes then count as probe_errors until it is attached). Defaults: policy
 * HNCCL_DEFAULT_PROBE_MASK, threshold HNCCL_DEFAULT_THRESHOLD, source
 * HNCCL_SOURCE_PAGE, no release callback, no table (the real one is loaded
 * on the first wrapped call). Then the environment is applied
 * (hnccl_apply_env); when it is invalid the context keeps the defaults and
 * hnccl_err says why. NULL only when out of memory. */
hnccl_ctx *hnccl_new(heapc *c);

/* Releases the context (not the heapc context); a heap it registers as
 * NCCL windows is deregistered first (hnccl_deregister_heap: collective).
 * NULL is a no-op. */
void hnccl_free(hnccl_ctx *x);

/* Last error code (0: none) and its message ("" when none); never NULL. */
int hnccl_err(const hnccl_ctx *x);
const char *hnccl_errstr(const hnccl_ctx *x);

/* Makes probes read c's status page from now on (NULL: none; probes then
 * count as probe_errors). Unlike the other configuration calls it may run
 * while wrapped calls probe on other threads (the pointer is atomic), but
 * the previous context must stay attached until those calls return. */
int hnccl_set_heapc(hnccl_ctx *x, heapc *c);

/* Replaces the function table (the caller keeps *t alive while the context
 * uses it); NULL returns to the real table, loaded on the next call. */
int hnccl_set_table(hnccl_ctx *x, const hnccl_table *t);

/* The context's table: the one set, else the real one (loading it); NULL
 * with hnccl_err HNCCL_ELOAD when NCCL cannot be loaded. */
const hnccl_table *hnccl_get_table(hnccl_ctx *x);

/* Sets the mode of every op that `names` (one name or a list, see above)
 * means. "all" and "none" apply before the named ops; "all,none" together is
 * an error. On an error nothing changes. */
int hnccl_set_policy(hnccl_ctx *x, const char *names, hnccl_mode mode);

/* Same for one op. */
int hnccl_set_op_policy(hnccl_ctx *x, hnccl_op op, hnccl_mode mode);

/* HNCCL_SKIP or HNCCL_PROBE; HNCCL_EINVAL for an op out of range. */
int hnccl_get_policy(const hnccl_ctx *x, hnccl_op op);

/* The mask of ops that probe (bit 1u << op). */
uint32_t hnccl_probe_mask(const hnccl_ctx *x);

/* Applies HEAPC_NCCL_PROBE, HEAPC_NCCL_SKIP and HEAPC_NCCL_FREE_MIN (see
 * above) to the context's current settings. On an error (unknown name,
 * conflicting names, a bad size) nothing changes and the message names the
 * variable and its value. */
int hnccl_apply_env(hnccl_ctx *x);

/* ---- probe ------------------------------------------------------------- */

#define HNCCL_DEFAULT_THRESHOLD ((uint64_t)3 << 30) /* 3 GiB */

/* Free bytes below which a probe calls the release callback (0: never). */
int hnccl_set_threshold(hnccl_ctx *x, uint64_t bytes);
uint64_t hnccl_get_threshold(const hnccl_ctx *x);

typedef enum hnccl_source {
    HNCCL_SOURCE_PAGE = 0, /* heapd's status page: a few loads */
    HNCCL_SOURCE_CUDA = 1, /* cuMemGetInfo, at most once per min_interval_us */
} hnccl_source;

/* What a probe saw; given to the release callback and by hnccl_probe. */
typedef struct hnccl_probe_info {
    hnccl_op op;
    const char *op_name; /* hnccl_op_name(op) */
    hnccl_source source;
    uint64_t device_free; /* what was compared with the threshold */
    uint64_t device_total;
    uint64_t threshold;
    int below;           /* device_free < threshold */
    int cuda_queried;    /* HNCCL_SOURCE_CUDA: 1 when this probe called cuMemGetInfo,
                            0 when it reused the last value */
    int have_page;       /* page holds a snapshot of the status page */
    heapc_status_t page; /* read by every probe when the page exists */
} hnccl_probe_info;

/* Called before the NCCL call when a probe finds free < threshold. It runs
 * on the thread of the wrapped call; it must not call wrappers of the same
 * context. */
typedef void (*hnccl_release_fn)(void *arg, const hnccl_probe_info *info);
int hnccl_set_release_cb(hnccl_ctx *x, hnccl_release_fn fn, void *arg);

/* Where probes read memory. HNCCL_SOURCE_CUDA needs the table's MemGetInfo
 * (libcuda.so.1 for the real table; HNCCL_ELOAD otherwise) and a current CUDA
 * context on the probing thread; a probe within min_interval_us of the last
 * query reuses its value (0: query every time). */
int hnccl_set_probe_source(hnccl_ctx *x, hnccl_source source, uint64_t min_interval_us);

/* Runs op's probe now, whatever op's policy: reads memory, counts, calls the
 * release callback when below the threshold. *out (may be NULL) gets what it
 * saw. Returns 1 when free < threshold, 0 when not, HNCCL_ESOURCE (with a
 * message) when memory could not be read, HNCCL_EINVAL. */
int hnccl_probe(hnccl_ctx *x, hnccl_op op, hnccl_probe_info *out);

/* ---- counters ------------------------------------------------------------ */

typedef struct hnccl_counters {
    uint64_t calls[HNCCL_NOPS]; /* wrapped calls per op */
    uint64_t probes;            /* probes that read memory (wrappers and hnccl_probe) */
    uint64_t probe_errors;      /* probes that could not */
    uint64_t below;             /* probes that found free < threshold */
    uint64_t callbacks;         /* release callbacks called */
    uint64_t cuda_queries;      /* cuMemGetInfo calls (HNCCL_SOURCE_CUDA) */
    uint64_t cuda_reused;       /* probes that reused the last cuMemGetInfo value */
    uint64_t nccl_errors;       /* wrapped calls that NCCL failed */
} hnccl_counters;

/* A snapshot (each counter read atomically). */
int hnccl_get_counters(const hnccl_ctx *x, hnccl_counters *out);
int hnccl_reset_counters(hnccl_ctx *x);

/* ---- the heap as NCCL windows (issue 32) ------------------------------------
 *
 * NCCL's symmetric kernels (NCCL >= 2.27) run on buffers registered with
 * ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC), a collective call
 * that needs every rank to pass its buffer at the same offset of the same
 * registration: what a heapd heap is. hnccl_register_heap registers the
 * heap's mapped memory (this rank's own copy) with comm as windows, one per
 * extent:
 *   - at the call, every run of chunks mapped now (the heap's extent; a
 *     trimmed heap's holes split it);
 *   - then every growth, as this rank maps it (inside the heapc_alloc that
 *     grows the heap: every rank does so at the same allocation number, so
 *     the collective registrations meet without a collective of their own);
 *   - heapc_restore's chunks again (the same runs).
 * Windows are deregistered before their chunks are unmapped: heapc_release,
 * heapc_trim (the chunks that stay are registered again, without the
 * trimmed ones), heapc_detach and heapc_free_ctx (which end the
 * registration: register again after the next attach). A range that
 * already has a window is never registered twice (overlaps_skipped).
 * libheapc calls libheapc_nccl through heapc_set_map_hook; every call above
 * is collective over comm, so every rank of comm must register the same
 * heap. The heapc context's calls that map or unmap then make NCCL calls on
 * their thread (a CUDA context current there, as for the NCCL calls).
 *
 * A block of the heap is in one window only if it does not straddle two
 * extents (a block placed across a growth boundary is in none: NCCL then
 * takes its ordinary path for that buffer). docs/design.md, "Extents and
 * windows", says when the allocator keeps blocks inside one extent.
 *
 * A registration failing inside a libheapc call (a growth) cannot fail that
 * call: it is counted (register_errors) and recorded as this context's
 * error (hnccl_err), the extent stays without a window, and NCCL takes its
 * ordinary path for buffers there. */

/* Registers c's heap (NULL: the context's heapc, hnccl_new /
 * hnccl_set_heapc) with comm through the context's table
 * (CommWindowRegister, CommWindowDeregister: NCCL >= 2.27), flags
 * NCCL_WIN_COLL_SYMMETRIC. c must be attached. One heap and communicator per
 * context at a time. Returns HNCCL_OK, NCCL's error (nothing stays
 * registered), HNCCL_ELOAD (no window functions), HNCCL_EINVAL (not
 * attached, already registering). Must not race with c's other calls. */
int hnccl_register_heap(hnccl_ctx *x, ncclComm_t comm, heapc *c);

/* Deregisters every window (collective over comm, as NCCL's) and stops
 * following the heap. HNCCL_OK also when nothing was registered; NCCL's
 * first error otherwise (every window is forgotten anyway). hnccl_free
 * calls it: free the hnccl context before its heapc context. */
int hnccl_deregister_heap(hnccl_ctx *x);

typedef struct hnccl_window_stats {
    uint64_t registered_bytes; /* bytes in windows now */
    uint64_t windows;          /* windows now */
    uint64_t extents;          /* the heap's extents followed now, windows or not (a failed
                                  registration leaves an extent without one) */
    uint64_t registrations;    /* successful ncclCommWindowRegister calls, in all */
    uint64_t deregistrations;  /* successful ncclCommWindowDeregister calls, in all */
    uint64_t register_errors;  /* register or deregister calls that NCCL failed */
    uint64_t overlaps_skipped; /* bytes reported mapped that had a window already */
    int registered;            /* 1 while a heap is registered */
} hnccl_window_stats;

/* A snapshot (thread-safe). */
int hnccl_get_window_stats(hnccl_ctx *x, hnccl_window_stats *out);

/* ---- wrapped NCCL calls -------------------------------------------------- */
/* NCCL's signature plus the context; see Errors above for the result. */

int hnccl_all_reduce(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                     ncclComm_t comm, cudaStream_t stream);
int hnccl_all_gather(hnccl_ctx *x, const void *send, void *recv, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                     cudaStream_t stream);
int hnccl_reduce_scatter(hnccl_ctx *x, const void *send, void *recv, size_t recvcount, ncclDataType_t dt,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
int hnccl_broadcast(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt, int root,
                    ncclComm_t comm, cudaStream_t stream);
int hnccl_reduce(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                 ncclComm_t comm, cudaStream_t stream);
/* ncclAlltoAll's contract (count elements to and from each rank, at
 * send + j * count and recv + i * count), done as one group of ncclSend and
 * ncclRecv per rank (ncclCommCount ranks), so it works on every NCCL 2.7+. */
int hnccl_all_to_all(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                     cudaStream_t stream);
int hnccl_send(hnccl_ctx *x, const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
               cudaStream_t stream);
int hnccl_recv(hnccl_ctx *x, void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
               cudaStream_t stream);
int hnccl_group_start(hnccl_ctx *x);
int hnccl_group_end(hnccl_ctx *x);

/* Bytes of one element of dt; 0 for an unknown type. */
size_t hnccl_type_size(ncclDataType_t dt);

/* ---- libheapc_nccl_preload.so ---------------------------------------------
 * Defined only by the preload library (client/heapc_nccl_preload.c), which
 * interposes ncclAllReduce, ncclAllGather, ncclReduceScatter, ncclBroadcast,
 * ncclReduce, ncclSend, ncclRecv, ncclGroupStart and ncclGroupEnd under
 * LD_PRELOAD, routes each through one process-wide context (policy and
 * threshold from the environment, above) and calls the real NCCL. A program
 * finds these with dlsym(RTLD_DEFAULT, ...) to tell whether it runs under the
 * preload. */

/* The process-wide context: configure it with the calls above
 * (hnccl_set_release_cb, hnccl_set_threshold, hnccl_set_policy, ...) before
 * NCCL calls start on other threads. NULL when out of memory. */
hnccl_ctx *hnccl_preload_ctx(void);

/* Probes read c's status page from now on (NULL: none); hnccl_set_heapc. */
int hnccl_preload_bind(heapc *c);

/* hnccl_get_counters of the process-wide context. */
int hnccl_preload_counters(hnccl_counters *out);

/* The last failed intercepted call's message (kept until the next failure:
 * the NCCL call, its error, the memory state), else the environment's error
 * at start (an unknown name in HEAPC_NCCL_PROBE: the defaults apply), else "". */
const char *hnccl_preload_errstr(void);

/* The interposed NCCL functions whose real counterpart was not found
 * (comma-separated; "" when all were), resolved at the first call. */
const char *hnccl_preload_missing(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* HEAPC_NCCL_H */
