/* heapc_nccl.c - libheapc_nccl: NCCL calls wrapped with a status-page memory
 * probe. See heapc_nccl.h (the public API); heapc_nccl_int.h has the context
 * and the other files.
 *
 * Module state: the real function table (loaded once, pthread_once, never
 * unloaded) and, in heapc_nccl_policy.c, the list of valid names (built
 * once). Everything else lives in the context. */
#include "heapc_nccl_int.h"
#include "cuda_dl.h"

#include <dlfcn.h>

/* ---- the real table ---------------------------------------------------------- */

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static hnccl_table real;
static int real_ok;
static char load_err[512];

typedef int (*cu_init_fn)(unsigned flags);
typedef int (*cu_meminfo_fn)(size_t *free_bytes, size_t *total_bytes);
static cu_init_fn cu_init;
static cu_meminfo_fn cu_meminfo;
static pthread_once_t cuinit_once = PTHREAD_ONCE_INIT;
static int cuinit_rc;

static void do_cuinit(void) { cuinit_rc = cu_init(0); }

static int real_mem_get_info(size_t *free_bytes, size_t *total_bytes)
{
    pthread_once(&cuinit_once, do_cuinit);
    if (cuinit_rc != 0)
        return cuinit_rc;
    return cu_meminfo(free_bytes, total_bytes);
}

#define SYM(field, name, required)                                                                                     \
    do {                                                                                                               \
        void *s_ = dlsym(h, name);                                                                                     \
        if (!s_ && (required)) {                                                                                       \
            snprintf(load_err, sizeof load_err,                                                                        \
                     "libnccl.so.2 has no symbol %s: NCCL too old or not NCCL (need 2.7 or newer)", name);             \
            return;                                                                                                    \
        }                                                                                                              \
        memcpy(&real.field, &s_, sizeof s_);                                                                           \
    } while (0)

static void do_load(void)
{
    dlerror();
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(load_err, sizeof load_err,
                 "dlopen(\"libnccl.so.2\") failed: %s; install NCCL 2.7 or newer or add its "
                 "directory to LD_LIBRARY_PATH",
                 e ? e : "unknown error");
        return;
    }
    SYM(AllReduce, "ncclAllReduce", 1);
    SYM(AllGather, "ncclAllGather", 1);
    SYM(ReduceScatter, "ncclReduceScatter", 1);
    SYM(Broadcast, "ncclBroadcast", 1);
    SYM(Reduce, "ncclReduce", 1);
    SYM(Send, "ncclSend", 1);
    SYM(Recv, "ncclRecv", 1);
    SYM(GroupStart, "ncclGroupStart", 1);
    SYM(GroupEnd, "ncclGroupEnd", 1);
    SYM(CommCount, "ncclCommCount", 1);
    SYM(GetErrorString, "ncclGetErrorString", 1);
    SYM(GetLastError, "ncclGetLastError", 0);
    SYM(GetVersion, "ncclGetVersion", 1);
    SYM(GetUniqueId, "ncclGetUniqueId", 1);
    SYM(CommInitRank, "ncclCommInitRank", 1);
    SYM(CommDestroy, "ncclCommDestroy", 1);
    SYM(CommWindowRegister, "ncclCommWindowRegister", 0); /* NCCL >= 2.27 */
    SYM(CommWindowDeregister, "ncclCommWindowDeregister", 0);
    int v = 0;
    ncclResult_t r = real.GetVersion(&v);
    if (r != ncclSuccess || v < 2700) {
        snprintf(load_err, sizeof load_err,
                 "libnccl.so.2 is NCCL version code %d (ncclGetVersion returned %d); need 2.7 or newer "
                 "(ncclSend/ncclRecv)",
                 v, (int)r);
        return;
    }
    /* Optional: the driver's cuMemGetInfo for HNCCL_SOURCE_CUDA. */
    void *cu = cd_open(NULL, 0);
    if (cu) {
        void *i = dlsym(cu, "cuInit"), *m = dlsym(cu, "cuMemGetInfo_v2");
        if (i && m) {
            memcpy(&cu_init, &i, sizeof i);
            memcpy(&cu_meminfo, &m, sizeof m);
            real.MemGetInfo = real_mem_get_info;
        }
    }
    real_ok = 1;
}

#undef SYM

const hnccl_table *hnccl_load(char *err, size_t errlen)
{
    pthread_once(&load_once, do_load);
    if (real_ok)
        return &real;
    if (err && errlen)
        snprintf(err, errlen, "%s", load_err);
    return NULL;
}

/* ---- context --------------------------------------------------------------- */

int hni_set_err(hnccl_ctx *x, int code, const char *fmt, ...)
{
    pthread_mutex_lock(&x->mu);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->errstr, sizeof x->errstr, fmt, ap);
    va_end(ap);
    atomic_store_explicit(&x->err, code, memory_order_relaxed);
    pthread_mutex_unlock(&x->mu);
    return code;
}

int hni_ok(hnccl_ctx *x)
{
    if (atomic_load_explicit(&x->err, memory_order_relaxed) != HNCCL_OK) {
        pthread_mutex_lock(&x->mu);
        x->errstr[0] = '\0';
        atomic_store_explicit(&x->err, HNCCL_OK, memory_order_relaxed);
        pthread_mutex_unlock(&x->mu);
    }
    return HNCCL_OK;
}

hnccl_ctx *hnccl_new(heapc *c)
{
    hnccl_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    atomic_init(&x->c, c);
    atomic_init(&x->table, NULL);
    atomic_init(&x->probe_mask, HNCCL_DEFAULT_PROBE_MASK);
    atomic_init(&x->threshold, HNCCL_DEFAULT_THRESHOLD);
    x->source = HNCCL_SOURCE_PAGE;
    atomic_init(&x->err, HNCCL_OK);
    pthread_mutex_init(&x->mu, NULL);
    pthread_mutex_init(&x->wmu, NULL);
    hnccl_apply_env(x);
    return x;
}

void hnccl_free(hnccl_ctx *x)
{
    if (!x)
        return;
    hni_win_free(x);
    pthread_mutex_destroy(&x->mu);
    free(x);
}

int hnccl_err(const hnccl_ctx *x) { return x ? atomic_load_explicit(&x->err, memory_order_relaxed) : HNCCL_EINVAL; }

const char *hnccl_errstr(const hnccl_ctx *x) { return x ? x->errstr : "hnccl: NULL context"; }

int hnccl_set_heapc(hnccl_ctx *x, heapc *c)
{
    if (!x)
        return HNCCL_EINVAL;
    atomic_store_explicit(&x->c, c, memory_order_release);
    return hni_ok(x);
}

int hnccl_set_table(hnccl_ctx *x, const hnccl_table *t)
{
    if (!x)
        return HNCCL_EINVAL;
    x->user_table = t;
    atomic_store_explicit(&x->table, t, memory_order_release);
    return hni_ok(x);
}

/* Slow path of table(): the real table, loaded. */
const hnccl_table *hni_load_table(hnccl_ctx *x)
{
    char e[512];
    const hnccl_table *t = hnccl_load(e, sizeof e);
    if (!t) {
        hni_set_err(x, HNCCL_ELOAD, "%s", e);
        return NULL;
    }
    atomic_store_explicit(&x->table, t, memory_order_release);
    return t;
}

const hnccl_table *hnccl_get_table(hnccl_ctx *x)
{
    if (!x)
        return NULL;
    const hnccl_table *t = hni_table(x);
    if (t)
        hni_ok(x);
    return t;
}

/* ---- probe -------------------------------------------------------------------- */

int hnccl_set_threshold(hnccl_ctx *x, uint64_t bytes)
{
    if (!x)
        return HNCCL_EINVAL;
    atomic_store_explicit(&x->threshold, bytes, memory_order_relaxed);
    return hni_ok(x);
}

uint64_t hnccl_get_threshold(const hnccl_ctx *x)
{
    return x ? atomic_load_explicit(&x->threshold, memory_order_relaxed) : 0;
}

int hnccl_set_release_cb(hnccl_ctx *x, hnccl_release_fn fn, void *arg)
{
    if (!x)
        return HNCCL_EINVAL;
    x->cb = fn;
    x->cb_arg = arg;
    return hni_ok(x);
}

int hnccl_set_probe_source(hnccl_ctx *x, hnccl_source source, uint64_t min_interval_us)
{
    if (!x)
        return HNCCL_EINVAL;
    if (source == HNCCL_SOURCE_PAGE) {
        x->source = source;
        return hni_ok(x);
    }
    if (source != HNCCL_SOURCE_CUDA)
        return hni_set_err(x, HNCCL_EINVAL,
                           "hnccl_set_probe_source: source %d is neither HNCCL_SOURCE_PAGE nor HNCCL_SOURCE_CUDA",
                           (int)source);
    if (min_interval_us > UINT64_MAX / 1000)
        return hni_set_err(x, HNCCL_EINVAL, "hnccl_set_probe_source: min_interval_us %" PRIu64 " is too large",
                           min_interval_us);
    const hnccl_table *t = hni_table(x);
    if (!t)
        return HNCCL_ELOAD;
    if (!t->MemGetInfo)
        return hni_set_err(x, HNCCL_ELOAD,
                           "hnccl_set_probe_source(HNCCL_SOURCE_CUDA): no cuMemGetInfo (%s); keep the status page "
                           "source",
                           x->user_table ? "the function table set with hnccl_set_table has no MemGetInfo"
                                         : "libcuda.so.1 could not be loaded");
    x->source = source;
    x->min_interval_ns = min_interval_us * 1000;
    atomic_store_explicit(&x->cuda_at_ns, 0, memory_order_relaxed);
    return hni_ok(x);
}

/* ---- counters -------------------------------------------------------------------- */

#define LD(field)   atomic_load_explicit(&x->ctr.field, memory_order_relaxed)
#define ZERO(field) atomic_store_explicit(&x->ctr.field, 0, memory_order_relaxed)

int hnccl_get_counters(const hnccl_ctx *x, hnccl_counters *out)
{
    if (!x || !out)
        return HNCCL_EINVAL;
    for (int i = 0; i < HNCCL_NOPS; i++)
        out->calls[i] = LD(calls[i]);
    out->probes = LD(probes);
    out->probe_errors = LD(probe_errors);
    out->below = LD(below);
    out->callbacks = LD(callbacks);
    out->cuda_queries = LD(cuda_queries);
    out->cuda_reused = LD(cuda_reused);
    out->nccl_errors = LD(nccl_errors);
    return HNCCL_OK;
}

int hnccl_reset_counters(hnccl_ctx *x)
{
    if (!x)
        return HNCCL_EINVAL;
    for (int i = 0; i < HNCCL_NOPS; i++)
        ZERO(calls[i]);
    ZERO(probes);
    ZERO(probe_errors);
    ZERO(below);
    ZERO(callbacks);
    ZERO(cuda_queries);
    ZERO(cuda_reused);
    ZERO(nccl_errors);
    return hni_ok(x);
}

#undef LD
#undef ZERO
