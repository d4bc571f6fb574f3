/* heapc_nccl_preload.c - libheapc_nccl_preload.so: libheapc_nccl's probe and
 * policy around an unmodified program's NCCL calls, through LD_PRELOAD.
 *
 *     LD_PRELOAD=libheapc_nccl_preload.so HEAPC_NCCL_PROBE=all_gather_into_tensor \
 *         torchrun --nproc-per-node 8 train.py
 *
 * It defines NCCL's collective and group entry points (ncclAllReduce,
 * ncclAllGather, ncclReduceScatter, ncclBroadcast, ncclReduce, ncclSend,
 * ncclRecv, ncclGroupStart, ncclGroupEnd); the dynamic linker binds the
 * program's (and torch's) references to these. Each call goes through one
 * process-wide hnccl context (hnccl_new: the policy and threshold from
 * HEAPC_NCCL_PROBE / HEAPC_NCCL_SKIP / HEAPC_NCCL_FREE_MIN, see heapc_nccl.h)
 * and then to the real function: dlsym(RTLD_NEXT), else the already loaded
 * libnccl.so.2 (dlopen RTLD_NOLOAD: torch loads NCCL into a local scope).
 * The library carries libheapc and libheapc_nccl and exports their API, so a
 * process has one libheapc: the Python package (python/heapd) uses this copy
 * when it finds hnccl_preload_bind, and binds the heap it attaches, whose
 * status page the probes then read. Before a heap is bound, probes count as
 * probe_errors and the NCCL calls go ahead.
 *
 * Errors: an intercepted call returns NCCL's result. When the wrapper cannot
 * call NCCL (no real function found) it returns ncclSystemError and
 * hnccl_preload_errstr() says why. When NCCL fails, hnccl_preload_errstr()
 * (the last failure, kept until the next one) names the call, NCCL's error
 * and the memory state from the status page.
 *
 * HEAPC_NCCL_PRELOAD_DUMP=PATH ("-": stderr) writes the counters there at
 * exit (the one place this library writes: asked for by the environment).
 *
 * HEAPC_NCCL_REGISTER=1 (issue 32): the first intercepted collective,
 * outside a group, whose send or receive buffer lies in the bound heap
 * (this rank's copy, below heapc_mapped) registers the heap as NCCL windows
 * with that call's communicator (hnccl_register_heap on the process-wide
 * context), before the call; every rank makes that same call first, so the
 * collective registration meets. Once per hnccl_preload_bind (a heap bound
 * again, after a detach, registers again); one communicator. A failed
 * registration is reported by hnccl_preload_errstr and the call goes on
 * (NCCL's ordinary path). "0" or unset: off; another value is an error at
 * start (hnccl_preload_errstr), and off.
 */
#include "heapc_nccl.h"
#include "env.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The entry points this library defines, with NCCL's signatures (nccl.h
 * declares them when it is included). */
#if !defined(NCCL_H_)
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t dt, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream);
#endif
/* (nccl.h declares these two without a prototype) */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char last_fail[1536]; /* the last failed call's message */
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static hnccl_ctx *ctx;
static hnccl_table real;
static char env_err[768];  /* what hnccl_new said about the environment */
static char load_err[512]; /* the entry points that could not be found */

static void *next_sym(const char *name, void *self)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (!p || p == self) {
        p = NULL;
        static const char *const libs[] = {"libnccl.so.2", "libnccl.so"};
        for (size_t i = 0; i < sizeof libs / sizeof libs[0] && !p; i++) {
            void *h = dlopen(libs[i], RTLD_NOLOAD | RTLD_LAZY);
            if (h) {
                p = dlsym(h, name);
                if (p == self)
                    p = NULL;
                dlclose(h);
            }
        }
    }
    return p;
}

#define RESOLVE(field, name, self, required)                                                                           \
    do {                                                                                                               \
        *(void **)&real.field = next_sym(name, (void *)(self));                                                        \
        if (!real.field && (required))                                                                                 \
            snprintf(load_err + strlen(load_err), sizeof load_err - strlen(load_err), "%s%s", load_err[0] ? ", " : "", \
                     name);                                                                                            \
    } while (0)

static void dump(void);

/* Finds the real functions still missing: at the first intercepted call
 * (not before: NCCL may be loaded after this library is first used, e.g. by
 * hnccl_preload_bind at attach) and again at later calls until all are
 * found. */
static pthread_mutex_t resolve_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int resolved;

static void resolve(void)
{
    pthread_mutex_lock(&resolve_mu);
    if (!atomic_load(&resolved)) {
        load_err[0] = '\0';
        RESOLVE(AllReduce, "ncclAllReduce", ncclAllReduce, 1);
        RESOLVE(AllGather, "ncclAllGather", ncclAllGather, 1);
        RESOLVE(ReduceScatter, "ncclReduceScatter", ncclReduceScatter, 1);
        RESOLVE(Broadcast, "ncclBroadcast", ncclBroadcast, 1);
        RESOLVE(Reduce, "ncclReduce", ncclReduce, 1);
        RESOLVE(Send, "ncclSend", ncclSend, 1);
        RESOLVE(Recv, "ncclRecv", ncclRecv, 1);
        RESOLVE(GroupStart, "ncclGroupStart", ncclGroupStart, 1);
        RESOLVE(GroupEnd, "ncclGroupEnd", ncclGroupEnd, 1);
        RESOLVE(CommCount, "ncclCommCount", NULL, 0);
        RESOLVE(GetErrorString, "ncclGetErrorString", NULL, 0);
        RESOLVE(GetLastError, "ncclGetLastError", NULL, 0);
        RESOLVE(CommWindowRegister, "ncclCommWindowRegister", NULL, 0); /* NCCL >= 2.27 */
        RESOLVE(CommWindowDeregister, "ncclCommWindowDeregister", NULL, 0);
        if (!load_err[0])
            atomic_store(&resolved, 1);
    }
    pthread_mutex_unlock(&resolve_mu);
}

/* ---- HEAPC_NCCL_REGISTER (issue 32) ------------------------------------------ */

static int reg_wanted;                /* HEAPC_NCCL_REGISTER=1 */
static _Atomic(heapc *) bound;        /* hnccl_preload_bind's */
static _Atomic int reg_armed;         /* 1: the next heap collective registers */
static _Thread_local int group_depth; /* ncclGroupStart calls not yet ended */

static void reg_env(void)
{
    const char *v = henv_get("NCCL_REGISTER");
    if (!v || !*v || !strcmp(v, "0"))
        return;
    if (!strcmp(v, "1")) {
        reg_wanted = 1;
        return;
    }
    size_t n = strlen(env_err);
    snprintf(env_err + n, sizeof env_err - n,
             "%sHEAPC_NCCL_REGISTER=\"%.64s\": want 1 (register the heap as NCCL "
             "windows at its first collective) or 0; not registering",
             n ? "; " : "", v);
}

static int in_heap(heapc *c, const void *p)
{
    const char *b = heapc_base(c, heapc_rank(c));
    return p && b && (const char *)p >= b && (uint64_t)((const char *)p - b) < heapc_mapped(c);
}

static void maybe_register(const void *a, const void *b, ncclComm_t comm)
{
    if (!atomic_load_explicit(&reg_armed, memory_order_relaxed) || group_depth)
        return;
    heapc *c = atomic_load_explicit(&bound, memory_order_acquire);
    if (!c || (!in_heap(c, a) && !in_heap(c, b)))
        return;
    int one = 1;
    if (!atomic_compare_exchange_strong(&reg_armed, &one, 0))
        return;
    int rc = hnccl_register_heap(ctx, comm, c);
    if (rc != HNCCL_OK) {
        pthread_mutex_lock(&fail_mu);
        snprintf(last_fail, sizeof last_fail, "HEAPC_NCCL_REGISTER: %s", hnccl_errstr(ctx));
        pthread_mutex_unlock(&fail_mu);
    }
}

static void init(void)
{
    ctx = hnccl_new(NULL);
    if (!ctx)
        return;
    if (hnccl_err(ctx))
        snprintf(env_err, sizeof env_err, "%s", hnccl_errstr(ctx));
    reg_env();
    hnccl_set_table(ctx, &real);
    const char *d = henv_get("NCCL_PRELOAD_DUMP");
    if (d && *d)
        atexit(dump);
}

static hnccl_ctx *get(void)
{
    pthread_once(&once, init);
    return ctx;
}

/* The context for an intercepted call: the real functions resolved. */
static inline hnccl_ctx *call_ctx(void)
{
    hnccl_ctx *x = get();
    if (!atomic_load_explicit(&resolved, memory_order_acquire))
        resolve();
    return x;
}

/* A wrapper's result as an ncclResult_t: NCCL's own, or ncclSystemError when
 * the wrapper could not call NCCL. */

static ncclResult_t failed(int rc)
{
    pthread_mutex_lock(&fail_mu);
    snprintf(last_fail, sizeof last_fail, "%s", ctx ? hnccl_errstr(ctx) : "no context");
    pthread_mutex_unlock(&fail_mu);
    return rc >= 0 ? (ncclResult_t)rc : ncclSystemError;
}

static inline ncclResult_t res(int rc)
{
    if (__builtin_expect(rc == ncclSuccess || rc == ncclInProgress, 1))
        return (ncclResult_t)rc;
    return failed(rc);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    hnccl_ctx *x = call_ctx();
    maybe_register(send, recv, comm);
    return res(hnccl_all_reduce(x, send, recv, count, dt, op, comm, stream));
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t stream)
{
    hnccl_ctx *x = call_ctx();
    maybe_register(send, recv, comm);
    return res(hnccl_all_gather(x, send, recv, sendcount, dt, comm, stream));
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t dt, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream)
{
    hnccl_ctx *x = call_ctx();
    maybe_register(send, recv, comm);
    return res(hnccl_reduce_scatter(x, send, recv, recvcount, dt, op, comm, stream));
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t stream)
{
    hnccl_ctx *x = call_ctx();
    maybe_register(send, recv, comm);
    return res(hnccl_broadcast(x, send, recv, count, dt, root, comm, stream));
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream)
{
    hnccl_ctx *x = call_ctx();
    maybe_register(send, recv, comm);
    return res(hnccl_reduce(x, send, recv, count, dt, op, root, comm, stream));
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream)
{
    return res(hnccl_send(call_ctx(), send, count, dt, peer, comm, stream));
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream)
{
    return res(hnccl_recv(call_ctx(), recv, count, dt, peer, comm, stream));
}

ncclResult_t ncclGroupStart(void)
{
    ncclResult_t r = res(hnccl_group_start(call_ctx()));
    group_depth += r == ncclSuccess;
    return r;
}

ncclResult_t ncclGroupEnd(void)
{
    group_depth -= group_depth > 0;
    return res(hnccl_group_end(call_ctx()));
}

/* ---- the library's own API (declared in heapc_nccl.h) ----------------------- */

hnccl_ctx *hnccl_preload_ctx(void) { return get(); }

int hnccl_preload_bind(heapc *c)
{
    hnccl_ctx *x = get();
    if (!x)
        return HNCCL_EOOM;
    atomic_store_explicit(&bound, c, memory_order_release);
    atomic_store(&reg_armed, reg_wanted && c); /* HEAPC_NCCL_REGISTER: at its first collective */
    return hnccl_set_heapc(x, c);
}

int hnccl_preload_counters(hnccl_counters *out)
{
    hnccl_ctx *x = get();
    return x ? hnccl_get_counters(x, out) : HNCCL_EOOM;
}

const char *hnccl_preload_errstr(void)
{
    hnccl_ctx *x = get();
    if (!x)
        return "out of memory creating the preload's context";
    if (last_fail[0])
        return last_fail;
    if (env_err[0])
        return env_err;
    return "";
}

const char *hnccl_preload_missing(void)
{
    get();
    if (!atomic_load(&resolved))
        resolve();
    return load_err;
}

static void dump(void)
{
    const char *d = henv_get("NCCL_PRELOAD_DUMP");
    hnccl_counters k;
    if (!d || !ctx || hnccl_get_counters(ctx, &k))
        return;
    FILE *f = strcmp(d, "-") ? fopen(d, "w") : stderr;
    if (!f)
        return;
    fprintf(f, "heapc_nccl_preload: pid %ld", (long)getpid());
    for (int i = 0; i < HNCCL_NOPS; i++)
        fprintf(f, " %s=%" PRIu64, hnccl_op_name((hnccl_op)i), k.calls[i]);
    fprintf(f,
            " probes=%" PRIu64 " probe_errors=%" PRIu64 " below=%" PRIu64 " callbacks=%" PRIu64 " nccl_errors=%" PRIu64
            " probe_mask=%#x%s%s%s%s\n",
            k.probes, k.probe_errors, k.below, k.callbacks, k.nccl_errors, hnccl_probe_mask(ctx),
            env_err[0] ? " env_error=\"" : "", env_err, env_err[0] ? "\"" : "",
            load_err[0] ? " (NCCL functions not found)" : "");
    if (f != stderr)
        fclose(f);
}
