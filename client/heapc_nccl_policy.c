/* heapc_nccl_policy.c - libheapc_nccl: op names and their aliases, and the
 * probe policy (which ops probe: hnccl_set_policy, HEAPC_NCCL_PROBE/SKIP). */
#include "heapc_nccl_int.h"
#include "size.h"
#include "env.h"

#define NAME_MAX_LEN 64

/* ---- names ----------------------------------------------------------------- */

const char *const hni_op_names[HNCCL_NOPS] = {
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
#define GEN_ALL  UINT32_MAX
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

const char *hnccl_op_name(hnccl_op op) { return (unsigned)op < HNCCL_NOPS ? hni_op_names[op] : NULL; }

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
    case HNCCL_OK:
        return "OK";
    case HNCCL_EINVAL:
        return "ERR_INVAL";
    case HNCCL_ELOAD:
        return "ERR_LOAD";
    case HNCCL_ESOURCE:
        return "ERR_SOURCE";
    case HNCCL_EOOM:
        return "ERR_OOM";
    case 1:
        return "ncclUnhandledCudaError";
    case 2:
        return "ncclSystemError";
    case 3:
        return "ncclInternalError";
    case 4:
        return "ncclInvalidArgument";
    case 5:
        return "ncclInvalidUsage";
    case 6:
        return "ncclRemoteError";
    case 7:
        return "ncclInProgress";
    default:
        return "ERR_UNKNOWN";
    }
}

size_t hnccl_type_size(ncclDataType_t dt)
{
    switch ((int)dt) {
    case 0:
    case 1:
    case 10:
    case 11:
        return 1; /* int8, uint8, fp8 e4m3 / e5m2 */
    case 6:
    case 9:
        return 2; /* float16, bfloat16 */
    case 2:
    case 3:
    case 7:
        return 4; /* int32, uint32, float32 */
    case 4:
    case 5:
    case 8:
        return 8; /* int64, uint64, float64 */
    default:
        return 0;
    }
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
        return hni_set_err(x, HNCCL_EINVAL, "hnccl_set_policy: names is NULL; valid names: %s", hnccl_valid_names());
    if (mode != HNCCL_SKIP && mode != HNCCL_PROBE)
        return hni_set_err(x, HNCCL_EINVAL, "hnccl_set_policy: mode %d is neither HNCCL_SKIP nor HNCCL_PROBE",
                           (int)mode);
    parsed p;
    char e[ERRSTR_LEN];
    char where[128];
    snprintf(where, sizeof where, "hnccl_set_policy(\"%.64s\")", names);
    if (parse_names(names, &p, where, e, sizeof e) != HNCCL_OK)
        return hni_set_err(x, HNCCL_EINVAL, "%s", e);
    if (!p.count)
        return hni_set_err(x, HNCCL_EINVAL, "%s: no op name given; valid names: %s", where, hnccl_valid_names());
    uint32_t m = atomic_load_explicit(&x->probe_mask, memory_order_relaxed);
    atomic_store_explicit(&x->probe_mask, apply_parsed(m, &p, mode), memory_order_relaxed);
    return hni_ok(x);
}

int hnccl_set_op_policy(hnccl_ctx *x, hnccl_op op, hnccl_mode mode)
{
    if (!x)
        return HNCCL_EINVAL;
    if ((unsigned)op >= HNCCL_NOPS)
        return hni_set_err(x, HNCCL_EINVAL, "hnccl_set_op_policy: op %d out of range (0..%d)", (int)op, HNCCL_NOPS - 1);
    if (mode != HNCCL_SKIP && mode != HNCCL_PROBE)
        return hni_set_err(x, HNCCL_EINVAL, "hnccl_set_op_policy: mode %d is neither HNCCL_SKIP nor HNCCL_PROBE",
                           (int)mode);
    uint32_t m = atomic_load_explicit(&x->probe_mask, memory_order_relaxed);
    m = mode == HNCCL_PROBE ? m | OPBIT(op) : m & ~OPBIT(op);
    atomic_store_explicit(&x->probe_mask, m, memory_order_relaxed);
    return hni_ok(x);
}

int hnccl_get_policy(const hnccl_ctx *x, hnccl_op op)
{
    if (!x || (unsigned)op >= HNCCL_NOPS)
        return HNCCL_EINVAL;
    return (atomic_load_explicit(&x->probe_mask, memory_order_relaxed) & OPBIT(op)) ? HNCCL_PROBE : HNCCL_SKIP;
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
            int w = snprintf(buf + n, len - n, "%s%s", n ? ", " : "", hni_op_names[i]);
            if (w < 0)
                break;
            n += (size_t)w;
        }
}

int hnccl_apply_env(hnccl_ctx *x)
{
    if (!x)
        return HNCCL_EINVAL;
    const char *pv = henv_get("NCCL_PROBE");
    const char *sv = henv_get("NCCL_SKIP");
    const char *fv = henv_get("NCCL_FREE_MIN");
    parsed pp, sp;
    char e[ERRSTR_LEN], where[160], pn[40], sn[40], fn[40];
    henv_which("NCCL_PROBE", pn, sizeof pn);
    henv_which("NCCL_SKIP", sn, sizeof sn);
    henv_which("NCCL_FREE_MIN", fn, sizeof fn);
    snprintf(where, sizeof where, "%s=\"%.100s\"", pn, pv ? pv : "");
    if (parse_names(pv ? pv : "", &pp, where, e, sizeof e) != HNCCL_OK)
        return hni_set_err(x, HNCCL_EINVAL, "%s", e);
    snprintf(where, sizeof where, "%s=\"%.100s\"", sn, sv ? sv : "");
    if (parse_names(sv ? sv : "", &sp, where, e, sizeof e) != HNCCL_OK)
        return hni_set_err(x, HNCCL_EINVAL, "%s", e);
    /* What each generic means for every op: 1 probe, 0 skip, -1 unset. */
    int pg = pp.generic == GEN_ALL ? 1 : pp.generic == GEN_NONE ? 0 : -1;
    int sg = sp.generic == GEN_ALL ? 0 : sp.generic == GEN_NONE ? 1 : -1;
    if (pg >= 0 && sg >= 0 && pg != sg)
        return hni_set_err(x, HNCCL_EINVAL,
                           "%s=\"%.100s\" and %s=\"%.100s\" contradict each other "
                           "for every op; give \"all\"/\"none\" in one of them",
                           pn, pv, sn, sv);
    uint32_t both = pp.named & sp.named;
    if (both) {
        char names[256];
        mask_names(both, names, sizeof names);
        return hni_set_err(x, HNCCL_EINVAL,
                           "op %s named in both %s=\"%.100s\" and %s=\"%.100s\"; "
                           "name each op in one of them",
                           names, pn, pv, sn, sv);
    }
    uint64_t thr = atomic_load_explicit(&x->threshold, memory_order_relaxed);
    if (fv && *fv && hsz_parse_size(fv, &thr) != 0)
        return hni_set_err(x, HNCCL_EINVAL,
                           "%s=\"%.100s\" is not a size (bytes, or a number with K, M, G, T: "
                           "\"3G\")",
                           fn, fv);
    uint32_t m = atomic_load_explicit(&x->probe_mask, memory_order_relaxed);
    if (pg >= 0)
        m = pg ? HNCCL_ALL_OPS_MASK : 0u;
    else if (sg >= 0)
        m = sg ? HNCCL_ALL_OPS_MASK : 0u;
    m = (m | pp.named) & ~sp.named;
    atomic_store_explicit(&x->probe_mask, m, memory_order_relaxed);
    atomic_store_explicit(&x->threshold, thr, memory_order_relaxed);
    return hni_ok(x);
}
