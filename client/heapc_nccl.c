/* heapc_nccl.c - libheapc_nccl: NCCL calls wrapped with a status-page memory
 * probe. See heapc_nccl.h (the public API).
 *
 * Module state: the real function table (loaded once, pthread_once, never
 * unloaded) and the list of valid names (built once). Everything else lives
 * in the context. */
#include "heapc_nccl.h"
#include "cuda_dl.h"
#include "size.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ERRSTR_LEN 2048
#define NAME_MAX_LEN 64

/* ---- names ----------------------------------------------------------------- */

#define OPBIT(op) (1u << (op))

static const char *const op_names[HNCCL_NOPS] = {
    [HNCCL_OP_ALL_REDUCE] = "all_reduce",
    [HNCCL_OP_ALL_GATHER] = "all_gather",
    [HNCCL_OP_REDUCE_SCATTER] = "reduce_scatter",
    [HNCCL_OP_BROADCAST] = "broadcast",
    [HNCCL_OP_REDUCE] = "reduce",
    [HNCCL_OP_ALL_TO_ALL] = "all_to_all",
    [HNCCL_OP_SEND] = "send",
    [HNCCL_OP_RECV] = "recv",
    [HNCCL_OP_GROUP_START] = "group_start",
    [HNCCL_OP_GROUP_END] = "group_end",
};

/* Generic names first, then every op's own name followed by its aliases
 * (torch.distributed, then c10d ProcessGroup method names). */
#define GEN_ALL UINT32_MAX
#define GEN_NONE (UINT32_MAX - 1)
static const struct alias {
    const char *name;
    uint32_t mask; /* GEN_ALL / GEN_NONE for the generic names */
} aliases[] = {
    {"all", GEN_ALL},
    {"none", GEN_NONE},
    {"all_reduce", OPBIT(HNCCL_OP_ALL_REDUCE)},
    {"allreduce", OPBIT(HNCCL_OP_ALL_REDUCE)},
    {"all_gather", OPBIT(HNCCL_OP_ALL_GATHER)},
    {"all_gather_into_tensor", OPBIT(HNCCL_OP_ALL_GATHER)},
    {"allgather", OPBIT(HNCCL_OP_ALL_GATHER)},
    {"_allgather_base", OPBIT(HNCCL_OP_ALL_GATHER)},
    {"allgather_into_tensor_coalesced", OPBIT(HNCCL_OP_ALL_GATHER)},
    {"reduce_scatter", OPBIT(HNCCL_OP_REDUCE_SCATTER)},
    {"reduce_scatter_tensor", OPBIT(HNCCL_OP_REDUCE_SCATTER)},
    {"_reduce_scatter_base", OPBIT(HNCCL_OP_REDUCE_SCATTER)},
    {"reduce_scatter_tensor_coalesced", OPBIT(HNCCL_OP_REDUCE_SCATTER)},
    {"broadcast", OPBIT(HNCCL_OP_BROADCAST)},
    {"reduce", OPBIT(HNCCL_OP_REDUCE)},
    {"all_to_all", OPBIT(HNCCL_OP_ALL_TO_ALL)},
    {"all_to_all_single", OPBIT(HNCCL_OP_ALL_TO_ALL)},
    {"alltoall", OPBIT(HNCCL_OP_ALL_TO_ALL)},
    {"alltoall_base", OPBIT(HNCCL_OP_ALL_TO_ALL)},
    {"send", OPBIT(HNCCL_OP_SEND)},
    {"isend", OPBIT(HNCCL_OP_SEND)},
    {"recv", OPBIT(HNCCL_OP_RECV)},
    {"irecv", OPBIT(HNCCL_OP_RECV)},
    {"batch_isend_irecv", OPBIT(HNCCL_OP_SEND) | OPBIT(HNCCL_OP_RECV)},
    {"group_start", OPBIT(HNCCL_OP_GROUP_START)},
    {"group_end", OPBIT(HNCCL_OP_GROUP_END)},
};
#define NALIASES (sizeof aliases / sizeof aliases[0])

static const struct alias *find_alias(const char *name, size_t len)
{
    for (size_t i = 0; i < NALIASES; i++)
        if (strlen(aliases[i].name) == len && !memcmp(aliases[i].name, name, len))
            return &aliases[i];
    return NULL;
}

const char *hnccl_op_name(hnccl_op op)
{
    return (unsigned)op < HNCCL_NOPS ? op_names[op] : NULL;
}

int hnccl_ops_from_name(const char *name, uint32_t *mask)
{
    if (!name || !mask)
        return HNCCL_EINVAL;
    const struct alias *a = find_alias(name, strlen(name));
    if (!a)
        return HNCCL_EINVAL;
    *mask = a->mask == GEN_ALL ? HNCCL_ALL_OPS_MASK : a->mask == GEN_NONE ? 0u : a->mask;
    return HNCCL_OK;
}

static pthread_once_t names_once = PTHREAD_ONCE_INIT;
static char valid_names[1024];

static void build_names(void)
{
    size_t n = 0;
    for (size_t i = 0; i < NALIASES && n < sizeof valid_names; i++) {
        int w = snprintf(valid_names + n, sizeof valid_names - n, "%s%s", i ? ", " : "", aliases[i].name);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}

const char *hnccl_valid_names(void)
{
    pthread_once(&names_once, build_names);
    return valid_names;
}

const char *hnccl_errname(int code)
{
    switch (code) {
    case HNCCL_OK: return "OK";
    case HNCCL_EINVAL: return "ERR_INVAL";
    case HNCCL_ELOAD: return "ERR_LOAD";
    case HNCCL_ESOURCE: return "ERR_SOURCE";
    case HNCCL_EOOM: return "ERR_OOM";
    case 1: return "ncclUnhandledCudaError";
    case 2: return "ncclSystemError";
    case 3: return "ncclInternalError";
    case 4: return "ncclInvalidArgument";
    case 5: return "ncclInvalidUsage";
    case 6: return "ncclRemoteError";
    case 7: return "ncclInProgress";
    default: return "ERR_UNKNOWN";
    }
}

size_t hnccl_type_size(ncclDataType_t dt)
{
    switch ((int)dt) {
    case 0: case 1: case 10: case 11: return 1;   /* int8, uint8, fp8 e4m3 / e5m2 */
    case 6: case 9: return 2;                     /* float16, bfloat16 */
    case 2: case 3: case 7: return 4;             /* int32, uint32, float32 */
    case 4: case 5: case 8: return 8;             /* int64, uint64, float64 */
    default: return 0;
    }
}

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

static void do_cuinit(void)
{
    cuinit_rc = cu_init(0);
}

static int real_mem_get_info(size_t *free_bytes, size_t *total_bytes)
{
    pthread_once(&cuinit_once, do_cuinit);
    if (cuinit_rc != 0)
        return cuinit_rc;
    return cu_meminfo(free_bytes, total_bytes);
}

#define SYM(field, name, required)                                                              \
    do {                                                                                        \
        void *s_ = dlsym(h, name);                                                              \
        if (!s_ && (required)) {                                                                \
            snprintf(load_err, sizeof load_err,                                                 \
                     "libnccl.so.2 has no symbol %s: NCCL too old or not NCCL (need 2.7 or newer)", \
                     name);                                                                     \
            return;                                                                             \
        }                                                                                       \
        memcpy(&real.field, &s_, sizeof s_);                                                    \
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

typedef struct counters_a {
    _Atomic uint64_t calls[HNCCL_NOPS];
    _Atomic uint64_t probes, probe_errors, below, callbacks, cuda_queries, cuda_reused, nccl_errors;
} counters_a;

struct hnccl_ctx {
    _Atomic(heapc *) c;          /* hnccl_set_heapc may change it while calls probe */
    _Atomic(const hnccl_table *) table;
    const hnccl_table *user_table;     /* NULL: the real one */
    _Atomic uint32_t probe_mask;
    _Atomic uint64_t threshold;
    hnccl_release_fn cb;
    void *cb_arg;
    hnccl_source source;
    uint64_t min_interval_ns;
    /* HNCCL_SOURCE_CUDA: the last query (its time is 0 before the first) */
    _Atomic uint64_t cuda_at_ns, cuda_free, cuda_total;
    counters_a ctr;
    pthread_mutex_t mu;                /* errstr */
    _Atomic int err;
    char errstr[ERRSTR_LEN];
};

#define INC(field) atomic_fetch_add_explicit(&x->ctr.field, 1, memory_order_relaxed)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int set_err(hnccl_ctx *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int set_err(hnccl_ctx *x, int code, const char *fmt, ...)
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

static int ok(hnccl_ctx *x)
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
    hnccl_apply_env(x);
    return x;
}

void hnccl_free(hnccl_ctx *x)
{
    if (!x)
        return;
    pthread_mutex_destroy(&x->mu);
    free(x);
}

int hnccl_err(const hnccl_ctx *x)
{
    return x ? atomic_load_explicit(&x->err, memory_order_relaxed) : HNCCL_EINVAL;
}

const char *hnccl_errstr(const hnccl_ctx *x)
{
    return x ? x->errstr : "hnccl: NULL context";
}

int hnccl_set_heapc(hnccl_ctx *x, heapc *c)
{
    if (!x)
        return HNCCL_EINVAL;
    atomic_store_explicit(&x->c, c, memory_order_release);
    return ok(x);
}

int hnccl_set_table(hnccl_ctx *x, const hnccl_table *t)
{
    if (!x)
        return HNCCL_EINVAL;
    x->user_table = t;
    atomic_store_explicit(&x->table, t, memory_order_release);
    return ok(x);
}

/* Slow path of table(): the real table, loaded. */
static const hnccl_table *load_table(hnccl_ctx *x)
{
    char e[512];
    const hnccl_table *t = hnccl_load(e, sizeof e);
    if (!t) {
        set_err(x, HNCCL_ELOAD, "%s", e);
        return NULL;
    }
    atomic_store_explicit(&x->table, t, memory_order_release);
    return t;
}

static inline const hnccl_table *table(hnccl_ctx *x)
{
    const hnccl_table *t = atomic_load_explicit(&x->table, memory_order_acquire);
    return t ? t : load_table(x);
}

const hnccl_table *hnccl_get_table(hnccl_ctx *x)
{
    if (!x)
        return NULL;
    const hnccl_table *t = table(x);
    if (t)
        ok(x);
    return t;
}

/* ---- policies ---------------------------------------------------------------- */

typedef struct parsed {
    uint32_t named;   /* ops named explicitly */
    uint32_t generic; /* 0, GEN_ALL or GEN_NONE */
    int count;        /* names seen */
} parsed;

/* Parses a list of names; on an error writes a message starting with `where`. */
static int parse_names(const char *list, parsed *p, const char *where, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    const char *s = list;
    while (*s) {
        s += strspn(s, ", \t\r\n");
        size_t len = strcspn(s, ", \t\r\n");
        if (!len)
            break;
        const struct alias *a = find_alias(s, len);
        if (!a) {
            snprintf(err, errlen, "%s: unknown op name \"%.*s\"; valid names: %s", where,
                     (int)(len > NAME_MAX_LEN ? NAME_MAX_LEN : len), s, hnccl_valid_names());
            return HNCCL_EINVAL;
        }
        if (a->mask == GEN_ALL || a->mask == GEN_NONE) {
            if (p->generic && p->generic != a->mask) {
                snprintf(err, errlen, "%s: both \"all\" and \"none\"; give one of them", where);
                return HNCCL_EINVAL;
            }
            p->generic = a->mask;
        } else {
            p->named |= a->mask;
        }
        p->count++;
        s += len;
    }
    return HNCCL_OK;
}

/* The mask after applying p with mode to mask. */
static uint32_t apply_parsed(uint32_t mask, const parsed *p, hnccl_mode mode)
{
    if (p->generic == GEN_ALL)
        mask = mode == HNCCL_PROBE ? HNCCL_ALL_OPS_MASK : 0u;
    else if (p->generic == GEN_NONE)
        mask = mode == HNCCL_PROBE ? 0u : HNCCL_ALL_OPS_MASK;
    if (mode == HNCCL_PROBE)
        mask |= p->named;
    else
        mask &= ~p->named;
    return mask;
}

int hnccl_set_policy(hnccl_ctx *x, const char *names, hnccl_mode mode)
{
    if (!x)
        return HNCCL_EINVAL;
    if (!names)
        return set_err(x, HNCCL_EINVAL, "hnccl_set_policy: names is NULL; valid names: %s",
                       hnccl_valid_names());
    if (mode != HNCCL_SKIP && mode != HNCCL_PROBE)
        return set_err(x, HNCCL_EINVAL, "hnccl_set_policy: mode %d is neither HNCCL_SKIP nor HNCCL_PROBE",
                       (int)mode);
    parsed p;
    char e[ERRSTR_LEN];
    char where[128];
    snprintf(where, sizeof where, "hnccl_set_policy(\"%.64s\")", names);
    if (parse_names(names, &p, where, e, sizeof e) != HNCCL_OK)
        return set_err(x, HNCCL_EINVAL, "%s", e);
    if (!p.count)
        return set_err(x, HNCCL_EINVAL, "%s: no op name given; valid names: %s", where,
                       hnccl_valid_names());
    uint32_t m = atomic_load_explicit(&x->probe_mask, memory_order_relaxed);
    atomic_store_explicit(&x->probe_mask, apply_parsed(m, &p, mode), memory_order_relaxed);
    return ok(x);
}

int hnccl_set_op_policy(hnccl_ctx *x, hnccl_op op, hnccl_mode mode)
{
    if (!x)
        return HNCCL_EINVAL;
    if ((unsigned)op >= HNCCL_NOPS)
        return set_err(x, HNCCL_EINVAL, "hnccl_set_op_policy: op %d out of range (0..%d)", (int)op,
                       HNCCL_NOPS - 1);
    if (mode != HNCCL_SKIP && mode != HNCCL_PROBE)
        return set_err(x, HNCCL_EINVAL, "hnccl_set_op_policy: mode %d is neither HNCCL_SKIP nor HNCCL_PROBE",
                       (int)mode);
    uint32_t m = atomic_load_explicit(&x->probe_mask, memory_order_relaxed);
    m = mode == HNCCL_PROBE ? m | OPBIT(op) : m & ~OPBIT(op);
    atomic_store_explicit(&x->probe_mask, m, memory_order_relaxed);
    return ok(x);
}

int hnccl_get_policy(const hnccl_ctx *x, hnccl_op op)
{
    if (!x || (unsigned)op >= HNCCL_NOPS)
        return HNCCL_EINVAL;
    return (atomic_load_explicit(&x->probe_mask, memory_order_relaxed) & OPBIT(op)) ? HNCCL_PROBE
                                                                                    : HNCCL_SKIP;
}

uint32_t hnccl_probe_mask(const hnccl_ctx *x)
{
    return x ? atomic_load_explicit(&x->probe_mask, memory_order_relaxed) : 0u;
}

/* "all_reduce, send" for the ops in mask. */
static void mask_names(uint32_t mask, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < HNCCL_NOPS && n < len; i++)
        if (mask & OPBIT(i)) {
            int w = snprintf(buf + n, len - n, "%s%s", n ? ", " : "", op_names[i]);
            if (w < 0)
                break;
            n += (size_t)w;
        }
}

int hnccl_apply_env(hnccl_ctx *x)
{
    if (!x)
        return HNCCL_EINVAL;
    const char *pv = getenv("HEAPC_NCCL_PROBE");
    const char *sv = getenv("HEAPC_NCCL_SKIP");
    const char *fv = getenv("HEAPC_NCCL_FREE_MIN");
    parsed pp, sp;
    char e[ERRSTR_LEN], where[160];
    snprintf(where, sizeof where, "HEAPC_NCCL_PROBE=\"%.100s\"", pv ? pv : "");
    if (parse_names(pv ? pv : "", &pp, where, e, sizeof e) != HNCCL_OK)
        return set_err(x, HNCCL_EINVAL, "%s", e);
    snprintf(where, sizeof where, "HEAPC_NCCL_SKIP=\"%.100s\"", sv ? sv : "");
    if (parse_names(sv ? sv : "", &sp, where, e, sizeof e) != HNCCL_OK)
        return set_err(x, HNCCL_EINVAL, "%s", e);
    /* What each generic means for every op: 1 probe, 0 skip, -1 unset. */
    int pg = pp.generic == GEN_ALL ? 1 : pp.generic == GEN_NONE ? 0 : -1;
    int sg = sp.generic == GEN_ALL ? 0 : sp.generic == GEN_NONE ? 1 : -1;
    if (pg >= 0 && sg >= 0 && pg != sg)
        return set_err(x, HNCCL_EINVAL,
                       "HEAPC_NCCL_PROBE=\"%.100s\" and HEAPC_NCCL_SKIP=\"%.100s\" contradict each other "
                       "for every op; give \"all\"/\"none\" in one of them",
                       pv, sv);
    uint32_t both = pp.named & sp.named;
    if (both) {
        char names[256];
        mask_names(both, names, sizeof names);
        return set_err(x, HNCCL_EINVAL,
                       "op %s named in both HEAPC_NCCL_PROBE=\"%.100s\" and HEAPC_NCCL_SKIP=\"%.100s\"; "
                       "name each op in one of them",
                       names, pv, sv);
    }
    uint64_t thr = atomic_load_explicit(&x->threshold, memory_order_relaxed);
    if (fv && *fv && hsz_parse_size(fv, &thr) != 0)
        return set_err(x, HNCCL_EINVAL,
                       "HEAPC_NCCL_FREE_MIN=\"%.100s\" is not a size (bytes, or a number with K, M, G, T: "
                       "\"3G\")",
                       fv);
    uint32_t m = atomic_load_explicit(&x->probe_mask, memory_order_relaxed);
    if (pg >= 0)
        m = pg ? HNCCL_ALL_OPS_MASK : 0u;
    else if (sg >= 0)
        m = sg ? HNCCL_ALL_OPS_MASK : 0u;
    m = (m | pp.named) & ~sp.named;
    atomic_store_explicit(&x->probe_mask, m, memory_order_relaxed);
    atomic_store_explicit(&x->threshold, thr, memory_order_relaxed);
    return ok(x);
}

/* ---- probe -------------------------------------------------------------------- */

int hnccl_set_threshold(hnccl_ctx *x, uint64_t bytes)
{
    if (!x)
        return HNCCL_EINVAL;
    atomic_store_explicit(&x->threshold, bytes, memory_order_relaxed);
    return ok(x);
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
    return ok(x);
}

int hnccl_set_probe_source(hnccl_ctx *x, hnccl_source source, uint64_t min_interval_us)
{
    if (!x)
        return HNCCL_EINVAL;
    if (source == HNCCL_SOURCE_PAGE) {
        x->source = source;
        return ok(x);
    }
    if (source != HNCCL_SOURCE_CUDA)
        return set_err(x, HNCCL_EINVAL,
                       "hnccl_set_probe_source: source %d is neither HNCCL_SOURCE_PAGE nor HNCCL_SOURCE_CUDA",
                       (int)source);
    if (min_interval_us > UINT64_MAX / 1000)
        return set_err(x, HNCCL_EINVAL, "hnccl_set_probe_source: min_interval_us %" PRIu64 " is too large",
                       min_interval_us);
    const hnccl_table *t = table(x);
    if (!t)
        return HNCCL_ELOAD;
    if (!t->MemGetInfo)
        return set_err(x, HNCCL_ELOAD,
                       "hnccl_set_probe_source(HNCCL_SOURCE_CUDA): no cuMemGetInfo (%s); keep the status page "
                       "source",
                       x->user_table ? "the function table set with hnccl_set_table has no MemGetInfo"
                                     : "libcuda.so.1 could not be loaded");
    x->source = source;
    x->min_interval_ns = min_interval_us * 1000;
    atomic_store_explicit(&x->cuda_at_ns, 0, memory_order_relaxed);
    return ok(x);
}

/* Reads memory into *info; returns 1 below the threshold, 0 not, or
 * HNCCL_ESOURCE with the reason in why. Calls the callback when below. */
static int do_probe(hnccl_ctx *x, hnccl_op op, hnccl_probe_info *info, char *why, size_t whylen)
{
    info->op = op;
    info->op_name = op_names[op];
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
        return set_err(x, HNCCL_EINVAL, "hnccl_probe: op %d out of range (0..%d)", (int)op, HNCCL_NOPS - 1);
    hnccl_probe_info info;
    memset(&info, 0, sizeof info);
    char why[256];
    int rc = do_probe(x, op, &info, why, sizeof why);
    if (out)
        *out = info;
    if (rc < 0)
        return set_err(x, rc, "hnccl_probe(%s): %s", op_names[op], why);
    ok(x);
    return rc;
}

/* ---- counters -------------------------------------------------------------------- */

#define LD(field) atomic_load_explicit(&x->ctr.field, memory_order_relaxed)
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
    return ok(x);
}

#undef LD
#undef ZERO

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
        double age_ms = st.device_sampled_ns && now >= st.device_sampled_ns
                            ? (double)(now - st.device_sampled_ns) / 1e6
                            : -1.0;
        int w = snprintf(out, len,
                         "memory at failure (heapd status page, rank %" PRIu32 ", epoch %" PRIu64
                         "): device free %s of %s (sampled %.0f ms ago); heap mapped %s, live %s, "
                         "released %s, free %s; this rank holds %s",
                         heapc_rank(hc), st.epoch, bytes(st.device_free, a, sizeof a),
                         bytes(st.device_total, b, sizeof b), age_ms, bytes(st.mapped, c, sizeof c),
                         bytes(st.live, d, sizeof d), bytes(st.released, e, sizeof e),
                         bytes(st.free, f, sizeof f), bytes(st.rank_held, g, sizeof g));
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
            snprintf(out + n, len - n, "; cuMemGetInfo: free %s of %s", bytes(fb, a, sizeof a),
                     bytes(tb, b, sizeof b));
        else
            snprintf(out + n, len - n, "; cuMemGetInfo failed: CUresult %d", rc);
    }
}

static int nccl_failed(hnccl_ctx *x, const hnccl_table *t, hnccl_op op, const char *call,
                       ncclResult_t r, ncclComm_t comm)
{
    INC(nccl_errors);
    const char *es = t->GetErrorString ? t->GetErrorString(r) : NULL;
    const char *last = t->GetLastError ? t->GetLastError(comm) : NULL;
    char mem[1024];
    mem_state(x, mem, sizeof mem);
    return set_err(x, (int)r, "%s (op %s) failed: %s (%d): %s%s%s%s; %s", call, op_names[op],
                   hnccl_errname((int)r), (int)r, es ? es : "no error string",
                   last && *last ? "; NCCL: \"" : "", last && *last ? last : "",
                   last && *last ? "\"" : "", mem);
}

static inline int finish(hnccl_ctx *x, const hnccl_table *t, hnccl_op op, const char *call,
                         ncclResult_t r, ncclComm_t comm)
{
    if (r == ncclSuccess || r == ncclInProgress) {
        ok(x);
        return (int)r;
    }
    return nccl_failed(x, t, op, call, r, comm);
}

static int missing(hnccl_ctx *x, const char *call)
{
    return set_err(x, HNCCL_ELOAD, "%s: the function table set with hnccl_set_table has no %s", call,
                   call + 4);
}

/* Counts the call, finds the table and the function, probes when the op's
 * policy says so. NULL when the call cannot be made (error set). */
#define PRE(op, fn, call)                                                                         \
    if (!x)                                                                                       \
        return HNCCL_EINVAL;                                                                      \
    INC(calls[op]);                                                                               \
    const hnccl_table *t = table(x);                                                              \
    if (!t)                                                                                       \
        return HNCCL_ELOAD;                                                                       \
    if (!t->fn)                                                                                   \
        return missing(x, call);                                                                  \
    if (atomic_load_explicit(&x->probe_mask, memory_order_relaxed) & OPBIT(op)) {                 \
        hnccl_probe_info info_;                                                                   \
        do_probe(x, op, &info_, NULL, 0);                                                         \
    }

int hnccl_all_reduce(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt,
                     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_ALL_REDUCE, AllReduce, "ncclAllReduce");
    return finish(x, t, HNCCL_OP_ALL_REDUCE, "ncclAllReduce",
                  t->AllReduce(send, recv, count, dt, op, comm, stream), comm);
}

int hnccl_all_gather(hnccl_ctx *x, const void *send, void *recv, size_t sendcount,
                     ncclDataType_t dt, ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_ALL_GATHER, AllGather, "ncclAllGather");
    return finish(x, t, HNCCL_OP_ALL_GATHER, "ncclAllGather",
                  t->AllGather(send, recv, sendcount, dt, comm, stream), comm);
}

int hnccl_reduce_scatter(hnccl_ctx *x, const void *send, void *recv, size_t recvcount,
                         ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_REDUCE_SCATTER, ReduceScatter, "ncclReduceScatter");
    return finish(x, t, HNCCL_OP_REDUCE_SCATTER, "ncclReduceScatter",
                  t->ReduceScatter(send, recv, recvcount, dt, op, comm, stream), comm);
}

int hnccl_broadcast(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt,
                    int root, ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_BROADCAST, Broadcast, "ncclBroadcast");
    return finish(x, t, HNCCL_OP_BROADCAST, "ncclBroadcast",
                  t->Broadcast(send, recv, count, dt, root, comm, stream), comm);
}

int hnccl_reduce(hnccl_ctx *x, const void *send, void *recv, size_t count, ncclDataType_t dt,
                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_REDUCE, Reduce, "ncclReduce");
    return finish(x, t, HNCCL_OP_REDUCE, "ncclReduce",
                  t->Reduce(send, recv, count, dt, op, root, comm, stream), comm);
}

int hnccl_send(hnccl_ctx *x, const void *send, size_t count, ncclDataType_t dt, int peer,
               ncclComm_t comm, cudaStream_t stream)
{
    PRE(HNCCL_OP_SEND, Send, "ncclSend");
    return finish(x, t, HNCCL_OP_SEND, "ncclSend", t->Send(send, count, dt, peer, comm, stream), comm);
}

int hnccl_recv(hnccl_ctx *x, void *recv, size_t count, ncclDataType_t dt, int peer,
               ncclComm_t comm, cudaStream_t stream)
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

int hnccl_all_to_all(hnccl_ctx *x, const void *send, void *recv, size_t count,
                     ncclDataType_t dt, ncclComm_t comm, cudaStream_t stream)
{
    if (!x)
        return HNCCL_EINVAL;
    INC(calls[HNCCL_OP_ALL_TO_ALL]);
    const hnccl_table *t = table(x);
    if (!t)
        return HNCCL_ELOAD;
    static const char *const need[] = {"ncclCommCount", "ncclGroupStart", "ncclSend", "ncclRecv",
                                       "ncclGroupEnd"};
    const int have[] = {!!t->CommCount, !!t->GroupStart, !!t->Send, !!t->Recv, !!t->GroupEnd};
    for (size_t i = 0; i < sizeof have / sizeof have[0]; i++)
        if (!have[i])
            return missing(x, need[i]);
    size_t es = hnccl_type_size(dt);
    if (!es)
        return set_err(x, HNCCL_EINVAL, "hnccl_all_to_all: unknown data type %d", (int)dt);
    if (atomic_load_explicit(&x->probe_mask, memory_order_relaxed) & OPBIT(HNCCL_OP_ALL_TO_ALL)) {
        hnccl_probe_info info;
        do_probe(x, HNCCL_OP_ALL_TO_ALL, &info, NULL, 0);
    }
    int n = 0;
    ncclResult_t r = t->CommCount(comm, &n);
    if (r != ncclSuccess)
        return nccl_failed(x, t, HNCCL_OP_ALL_TO_ALL, "ncclCommCount", r, comm);
    if (n <= 0 || count > SIZE_MAX / es / (size_t)n)
        return set_err(x, HNCCL_EINVAL, "hnccl_all_to_all: %zu elements of %zu bytes to each of %d ranks "
                       "do not fit in size_t", count, es, n);
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
