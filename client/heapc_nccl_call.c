/* heapc_nccl_call.c - libheapc_nccl: the memory probe and the NCCL wrappers
 * (the probe before each call, the error message with the memory state). */
#include "heapc_nccl_int.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Reads memory into *info; returns 1 below the threshold, 0 not, or
 * HNCCL_ESOURCE with the reason in why. Calls the callback when below. */
static int do_probe(hnccl_ctx *x, hnccl_op op, hnccl_probe_info *info, char *why, size_t whylen)
{
    info->op = op;
    info->op_name = hni_op_names[op];
    info->source = x->source;
    info->cuda_queried = 0;
    heapc *c = atomic_load_explicit(&x->c, memory_order_acquire);
    info->have_page = c && heapc_status(c, &info->page) == HEAPC_OK;
    if (!info->have_page)
        memset(&info->page, 0, sizeof info->page);
    if (x->source == HNCCL_SOURCE_PAGE) {
        if (!info->have_page) {
            INC(probe_errors);
            if (why)
                snprintf(why, whylen, "no status page: %s",
                         !c ? "the context has no heapc context (hnccl_new(NULL), or none set with hnccl_set_heapc)"
                            : "the heapc context is not attached, or heapd sent no page");
            return HNCCL_ESOURCE;
        }
        info->device_free = info->page.device_free;
        info->device_total = info->page.device_total;
    } else {
        const hnccl_table *t = atomic_load_explicit(&x->table, memory_order_acquire);
        if (!t || !t->MemGetInfo) {
            INC(probe_errors);
            if (why)
                snprintf(why, whylen, "the function table has no MemGetInfo");
            return HNCCL_ESOURCE;
        }
        uint64_t now = now_ns();
        uint64_t at = atomic_load_explicit(&x->cuda_at_ns, memory_order_acquire);
        if (at && now - at < x->min_interval_ns) {
            INC(cuda_reused);
            info->device_free = atomic_load_explicit(&x->cuda_free, memory_order_relaxed);
            info->device_total = atomic_load_explicit(&x->cuda_total, memory_order_relaxed);
        } else {
            size_t fb = 0, tb = 0;
            INC(cuda_queries);
            int rc = t->MemGetInfo(&fb, &tb);
            if (rc != 0) {
                INC(probe_errors);
                if (why)
                    snprintf(why, whylen,
                             "cuMemGetInfo failed: CUresult %d (is a CUDA context current on this thread?)", rc);
                return HNCCL_ESOURCE;
            }
            info->device_free = fb;
            info->device_total = tb;
            info->cuda_queried = 1;
            atomic_store_explicit(&x->cuda_free, fb, memory_order_relaxed);
            atomic_store_explicit(&x->cuda_total, tb, memory_order_relaxed);
            atomic_store_explicit(&x->cuda_at_ns, now ? now : 1, memory_order_release);
        }
    }
    INC(probes);
    info->threshold = atomic_load_explicit(&x->threshold, memory_order_relaxed);
    info->below = info->device_free < info->threshold;
    if (!info->below)
        return 0;
    INC(below);
    if (x->cb) {
        INC(callbacks);
        x->cb(x->cb_arg, info);
    }
    return 1;
}

int hnccl_probe(hnccl_ctx *x, hnccl_op op, hnccl_probe_info *out)
{
    if (!x)
        return HNCCL_EINVAL;
    if ((unsigned)op >= HNCCL_NOPS)
        return hni_set_err(x, HNCCL_EINVAL, "hnccl_probe: op %d out of range (0..%d)", (int)op, HNCCL_NOPS - 1);
    hnccl_probe_info info;
    memset(&info, 0, sizeof info);
    char why[256];
    int rc = do_probe(x, op, &info, why, sizeof why);
    if (out)
        *out = info;
    if (rc < 0)
        return hni_set_err(x, rc, "hnccl_probe(%s): %s", hni_op_names[op], why);
    hni_ok(x);
    return rc;
}

/* ---- wrappers --------------------------------------------------------------------- */

/* "1073741824 B (1.0 GiB)" */
static const char *bytes(uint64_t b, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    int u = -1;
    double v = (double)b;
    while (u < 3 && v >= 1024.0) {
        v /= 1024.0;
        u++;
    }
    if (u < 0)
        snprintf(buf, len, "%" PRIu64 " B", b);
    else
        snprintf(buf, len, "%" PRIu64 " B (%.1f %s)", b, v, units[u]);
    return buf;
}

/* The memory state now, for an error message. */
static void mem_state(hnccl_ctx *x, char *out, size_t len)
{
    heapc_status_t st;
    char a[48], b[48], c[48], d[48], e[48], f[48], g[48];
    size_t n = 0;
    heapc *hc = atomic_load_explicit(&x->c, memory_order_acquire);
    if (hc && heapc_status(hc, &st) == HEAPC_OK) {
        uint64_t now = now_ns();
        double age_ms =
            st.device_sampled_ns && now >= st.device_sampled_ns ? (double)(now - st.device_sampled_ns) / 1e6 : -1.0;
        int w =
            snprintf(out, len,
                     "memory at failure (heapd status page, rank %" PRIu32 ", epoch %" PRIu64
                     "): device free %s of %s (sampled %.0f ms ago); heap mapped %s, live %s, "
                     "released %s, free %s; this rank holds %s",
                     heapc_rank(hc), st.epoch, bytes(st.device_free, a, sizeof a), bytes(st.device_total, b, sizeof b),
                     age_ms, bytes(st.mapped, c, sizeof c), bytes(st.live, d, sizeof d),
                     bytes(st.released, e, sizeof e), bytes(st.free, f, sizeof f), bytes(st.rank_held, g, sizeof g));
        n = w > 0 ? (size_t)w : 0;
    } else {
        int w = snprintf(out, len, "memory at failure: unknown (no status page: %s)",
                         !hc ? "no heapc context" : "not attached, or heapd sent no page");
        n = w > 0 ? (size_t)w : 0;
    }
    const hnccl_table *t = atomic_load_explicit(&x->table, memory_order_acquire);
    if (n < len && x->source == HNCCL_SOURCE_CUDA && t && t->MemGetInfo) {
        size_t fb = 0, tb = 0;
        int rc = t->MemGetInfo(&fb, &tb);
        if (rc == 0)
            snprintf(out + n, len - n, "; cuMemGetInfo: free %s of %s", bytes(fb, a, sizeof a), bytes(tb, b, sizeof b));
        else
            snprintf(out + n, len - n, "; cuMemGetInfo failed: CUresult %d", rc);
    }
}

static int nccl_failed(hnccl_ctx *x, const hnccl_table *t, hnccl_op op, const char *call, ncclResult_t r,
                       ncclComm_t comm)
{
    INC(nccl_errors);
    const char *es = t->GetErrorString ? t->GetErrorString(r) : NULL;
    const char *last = t->GetLastError ? t->GetLastError(comm) : NULL;
    char mem[1024];
    mem_state(x, mem, sizeof mem);
    return hni_set_err(x, (int)r, "%s (op %s) failed: %s (%d): %s%s%s%s; %s", call, hni_op_names[op],
                       hnccl_errname((int)r), (int)r, es ? es : "no error string", last && *last ? "; NCCL: \"" : "",
                       last && *last ? last : "", last && *last ? "\"" : "", mem);
}

static inline int finish(hnccl_ctx *x, const hnccl_table *t, hnccl_op op, const char *call, ncclResult_t r,
                         ncclComm_t comm)
{
    if (r == ncclSuccess || r == ncclInProgress) {
        hni_ok(x);
        return (int)r;
    }
    return nccl_failed(x, t, op, call, r, comm);
}

static int missing(hnccl_ctx *x, const char *call)
{
    return hni_set_err(x, HNCCL_ELOAD, "%s: the function table set with hnccl_set_table has no %s", call, call + 4);
}

/* Counts the call, finds the table and the function, probes when the op's
 * policy says so. NULL when the call cannot be made (error set). */
#define PRE(op, fn, call)                                                                                              \
    if (!x)                                                                                                            \
        return HNCCL_EINVAL;                                                                                           \
    INC(calls[op]);                                                                                                    \
    const hnccl_table *t = hni_table(x);                                                                               \
    if (!t)                                                                                                            \
        return HNCCL_ELOAD;                                                                                            \
    if (!t->fn)                                                                                                        \
        return missing(x, call);                                                                                       \
    if (atomic_load_explicit(&x->probe_mask, memory_order_relaxed) & OPBIT(op)) {                                      \
        hnccl_probe_info info_;                                                                                        \
        do_probe(x, op, &info_, NULL, 0);                                                                              \
    }

int hnccl_all_reduce(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                     ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_ALL_REDUCE, AllReduce, "ncclAllReduce");
    return finish(x, t, HNCCL_OP_ALL_REDUCE, "ncclAllReduce", t->AllReduce(send, recv, count, dt, op, comm, stream),
                  comm);
}

int hnccl_all_gather(hnccl_ctx *x, const void *send, void *recv, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                     cudaStream_t stream)
{
    PRE(HNCCL_OP_ALL_GATHER, AllGather, "ncclAllGather");
    return finish(x, t, HNCCL_OP_ALL_GATHER, "ncclAllGather", t->AllGather(send, recv, sendcount, dt, comm, stream),
                  comm);
}

int hnccl_reduce_scatter(hnccl_ctx *x, const void *send, void *recv, size_t recvcount, ncclDataType_t dt,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_REDUCE_SCATTER, ReduceScatter, "ncclReduceScatter");
    return finish(x, t, HNCCL_OP_REDUCE_SCATTER, "ncclReduceScatter",
                  t->ReduceScatter(send, recv, recvcount, dt, op, comm, stream), comm);
}

int hnccl_broadcast(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt, int root,
                    ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_BROADCAST, Broadcast, "ncclBroadcast");
    return finish(x, t, HNCCL_OP_BROADCAST, "ncclBroadcast", t->Broadcast(send, recv, count, dt, root, comm, stream),
                  comm);
}

int hnccl_reduce(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                 ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_REDUCE, Reduce, "ncclReduce");
    return finish(x, t, HNCCL_OP_REDUCE, "ncclReduce", t->Reduce(send, recv, count, dt, op, root, comm, stream), comm);
}

int hnccl_send(hnccl_ctx *x, const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
               cudaStream_t stream)
{
    PRE(HNCCL_OP_SEND, Send, "ncclSend");
    return finish(x, t, HNCCL_OP_SEND, "ncclSend", t->Send(send, count, dt, peer, comm, stream), comm);
}

int hnccl_recv(hnccl_ctx *x, void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
               cudaStream_t stream)
{
    PRE(HNCCL_OP_RECV, Recv, "ncclRecv");
    return finish(x, t, HNCCL_OP_RECV, "ncclRecv", t->Recv(recv, count, dt, peer, comm, stream), comm);
}

int hnccl_group_start(hnccl_ctx *x)
{
    PRE(HNCCL_OP_GROUP_START, GroupStart, "ncclGroupStart");
    return finish(x, t, HNCCL_OP_GROUP_START, "ncclGroupStart", t->GroupStart(), NULL);
}

int hnccl_group_end(hnccl_ctx *x)
{
    PRE(HNCCL_OP_GROUP_END, GroupEnd, "ncclGroupEnd");
    return finish(x, t, HNCCL_OP_GROUP_END, "ncclGroupEnd", t->GroupEnd(), NULL);
}

int hnccl_all_to_all(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                     cudaStream_t stream)
{
    if (!x)
        return HNCCL_EINVAL;
    INC(calls[HNCCL_OP_ALL_TO_ALL]);
    const hnccl_table *t = hni_table(x);
    if (!t)
        return HNCCL_ELOAD;
    static const char *const need[] = {"ncclCommCount", "ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd"};
    const int have[] = {!!t->CommCount, !!t->GroupStart, !!t->Send, !!t->Recv, !!t->GroupEnd};
    for (size_t i = 0; i < sizeof have / sizeof have[0]; i++)
        if (!have[i])
            return missing(x, need[i]);
    size_t es = hnccl_type_size(dt);
    if (!es)
        return hni_set_err(x, HNCCL_EINVAL, "hnccl_all_to_all: unknown data type %d", (int)dt);
    if (atomic_load_explicit(&x->probe_mask, memory_order_relaxed) & OPBIT(HNCCL_OP_ALL_TO_ALL)) {
        hnccl_probe_info info;
        do_probe(x, HNCCL_OP_ALL_TO_ALL, &info, NULL, 0);
    }
    int n = 0;
    ncclResult_t r = t->CommCount(comm, &n);
    if (r != ncclSuccess)
        return nccl_failed(x, t, HNCCL_OP_ALL_TO_ALL, "ncclCommCount", r, comm);
    if (n <= 0 || count > SIZE_MAX / es / (size_t)n)
        return hni_set_err(x, HNCCL_EINVAL,
                           "hnccl_all_to_all: %zu elements of %zu bytes to each of %d ranks "
                           "do not fit in size_t",
                           count, es, n);
    size_t stride = count * es;
    r = t->GroupStart();
    if (r != ncclSuccess)
        return nccl_failed(x, t, HNCCL_OP_ALL_TO_ALL, "ncclGroupStart", r, comm);
    ncclResult_t first = ncclSuccess;
    const char *first_call = NULL;
    for (int p = 0; p < n && first == ncclSuccess; p++) {
        r = t->Send((const char *)send + (size_t)p * stride, count, dt, p, comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) {
            first = r;
            first_call = "ncclSend";
            break;
        }
        r = t->Recv((char *)recv + (size_t)p * stride, count, dt, p, comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) {
            first = r;
            first_call = "ncclRecv";
        }
    }
    r = t->GroupEnd(); /* always closes the group NCCL opened */
    if (first != ncclSuccess)
        return nccl_failed(x, t, HNCCL_OP_ALL_TO_ALL, first_call, first, comm);
    return finish(x, t, HNCCL_OP_ALL_TO_ALL, "ncclGroupEnd", r, comm);
}
