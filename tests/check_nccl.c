/*
 * check_nccl.c - libheapc_nccl (client/heapc_nccl.h) against a real heapd
 * (build/heapd, host backend, started by main() on a temporary socket) and
 * its status page. NCCL's calls go to a recording function table (NCCL
 * cannot run without a GPU): which ops probe by default, every policy alias
 * and the environment variables, unknown names, threshold and release
 * callback (called before the recorded NCCL call), the cuMemGetInfo source's
 * rate limit, the memory state in NCCL error messages, all_to_all as grouped
 * send/recv, and the page values the wrapper sees after allocations, frees,
 * a collect and growth.
 *
 * Real NCCL: where libnccl.so.2 loads (no GPU needed) its error path runs
 * through the wrappers (a NULL communicator). Where a GPU and libcuda are
 * present too, a one-rank communicator all-reduces heap memory of a second
 * heapd with the cuda backend; elsewhere that TCase prints
 * "skipped: no GPU (real NCCL)".
 *
 * heapd: $HEAPD (a path), else $BUILD/heapd, else build/heapd.
 */
#include "heapc.h"
#include "heapc_nccl.h"

#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check_util.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

/* ---- heapd ------------------------------------------------------------------- */

static pid_t g_main_pid;
static char g_dir[64];

typedef struct daemon_proc {
    pid_t pid;
    char conf[128], sock[108], log[128];
} daemon_proc;

static daemon_proc g_heapd; /* the host-backend heapd every test uses */

static const char *heapd_path(void)
{
    static char path[512];
    const char *h = getenv("HEAPD");
    if (h && *h)
        return h;
    const char *b = getenv("BUILD");
    snprintf(path, sizeof path, "%s/heapd", b && *b ? b : "build");
    return path;
}

static void daemon_stop(daemon_proc *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGTERM);
    for (int i = 0; i < 300; i++) {
        if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
            d->pid = -1;
            return;
        }
        usleep(10000);
    }
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    d->pid = -1;
}

/* Starts heapd with `extra` config lines; 0, or -1 with why. */
static int daemon_start(daemon_proc *d, const char *tag, const char *extra, char *why, size_t whylen)
{
    memset(d, 0, sizeof *d);
    d->pid = -1;
    snprintf(d->conf, sizeof d->conf, "%s/%s.conf", g_dir, tag);
    snprintf(d->sock, sizeof d->sock, "%s/%s.sock", g_dir, tag);
    snprintf(d->log, sizeof d->log, "%s/%s.log", g_dir, tag);
    FILE *f = fopen(d->conf, "w");
    if (!f) {
        snprintf(why, whylen, "cannot write %s: %s", d->conf, strerror(errno));
        return -1;
    }
    fprintf(f, "socket = %s\nlog_level = warn\ncollect_timeout_ms = 5000\nmeminfo_interval_ms = 10\n%s", d->sock,
            extra);
    fclose(f);
    const char *bin = heapd_path();
    if (access(bin, X_OK) != 0) {
        snprintf(why, whylen, "heapd %.200s: %s (build it, or set HEAPD or BUILD)", bin, strerror(errno));
        return -1;
    }
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    d->pid = fork();
    if (d->pid < 0) {
        snprintf(why, whylen, "fork: %s", strerror(errno));
        return -1;
    }
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        FILE *lf = freopen(d->log, "w", stderr);
        (void)lf;
        execl(bin, bin, "--config", d->conf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = -1;
            snprintf(why, whylen, "heapd exited during startup (see %s)", d->log);
            return -1;
        }
        heapc *c = heapc_connect(d->sock);
        int okc = c && heapc_err(c) == 0;
        heapc_free_ctx(c);
        if (okc)
            return 0;
        usleep(10000);
    }
    snprintf(why, whylen, "heapd did not answer on %s within 10 s", d->sock);
    daemon_stop(d);
    return -1;
}

static void cleanup(void)
{
    if (getpid() != g_main_pid)
        return; /* a forked test */
    daemon_stop(&g_heapd);
    if (g_dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "check_nccl: could not remove %s\n", g_dir);
        g_dir[0] = '\0';
    }
}

static heapc *attach_on(const char *sock, const char *heap, uint64_t chunk)
{
    heapc *c = heapc_connect(sock);
    ck_assert_ptr_nonnull(c);
    ck_assert_msg(heapc_err(c) == 0, "heapc_connect: %s", heapc_errstr(c));
    heapc_params p;
    memset(&p, 0, sizeof p);
    p.chunk_size = chunk;
    p.initial_size = chunk;
    p.va_size = 256 * MiB;
    int rc = heapc_attach(c, heap, 0, 1, &p);
    ck_assert_msg(rc == HEAPC_OK, "heapc_attach(%s): %s", heap, heapc_errstr(c));
    return c;
}

static heapc *attach(const char *heap) { return attach_on(g_heapd.sock, heap, 1 * MiB); }

static heapc_status_t page(heapc *c)
{
    heapc_status_t st;
    ck_assert_int_eq(heapc_status(c, &st), HEAPC_OK);
    return st;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the recording table ------------------------------------------------------ */

#define LOG_MAX 128
static char rec_log[LOG_MAX][96];
static int rec_n;
static ncclResult_t rec_result[HNCCL_NOPS + 2]; /* by call: index below */
static int rec_nranks = 2;
static const char *rec_sbase, *rec_rbase; /* for Send/Recv offsets */
static size_t rec_free = 1 * GiB, rec_total = 80 * GiB;
static int rec_meminfo_calls, rec_meminfo_rc;
static int rec_cb_calls;
static hnccl_probe_info rec_info; /* what the last callback saw */

enum { R_ALLREDUCE, R_ALLGATHER, R_REDSCAT, R_BCAST, R_REDUCE, R_SEND, R_RECV, R_GSTART, R_GEND, R_COUNT, R_N };
static ncclResult_t rec_fail[R_N];

static void rec(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void rec(const char *fmt, ...)
{
    if (rec_n >= LOG_MAX)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rec_log[rec_n++], sizeof rec_log[0], fmt, ap);
    va_end(ap);
}

static void rec_reset(void)
{
    rec_n = 0;
    memset(rec_fail, 0, sizeof rec_fail);
    memset(rec_result, 0, sizeof rec_result);
    rec_nranks = 2;
    rec_sbase = rec_rbase = NULL;
    rec_free = 1 * GiB;
    rec_total = 80 * GiB;
    rec_meminfo_calls = rec_meminfo_rc = 0;
    rec_cb_calls = 0;
    memset(&rec_info, 0, sizeof rec_info);
}

/* "a | b | c" */
static const char *rec_joined(void)
{
    static char buf[LOG_MAX * 100];
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < rec_n && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? " | " : "", rec_log[i]);
    return buf;
}

static int rec_is(const char *const *want, int n)
{
    if (rec_n != n)
        return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(rec_log[i], want[i]))
            return 0;
    return 1;
}
#define REC_IS(...)                                                                                                    \
    do {                                                                                                               \
        static const char *const want_[] = {__VA_ARGS__};                                                              \
        ck_assert_msg(rec_is(want_, (int)(sizeof want_ / sizeof want_[0])), "recorded: %s", rec_joined());             \
    } while (0)

static ncclResult_t r_all_reduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t st)
{
    (void)s, (void)r, (void)dt, (void)op, (void)comm, (void)st;
    rec("AllReduce n=%zu", n);
    return rec_fail[R_ALLREDUCE];
}
static ncclResult_t r_all_gather(const void *s, void *r, size_t n, ncclDataType_t dt, ncclComm_t comm, cudaStream_t st)
{
    (void)s, (void)r, (void)dt, (void)comm, (void)st;
    rec("AllGather n=%zu", n);
    return rec_fail[R_ALLGATHER];
}
static ncclResult_t r_reduce_scatter(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                                     ncclComm_t comm, cudaStream_t st)
{
    (void)s, (void)r, (void)dt, (void)op, (void)comm, (void)st;
    rec("ReduceScatter n=%zu", n);
    return rec_fail[R_REDSCAT];
}
static ncclResult_t r_broadcast(const void *s, void *r, size_t n, ncclDataType_t dt, int root, ncclComm_t comm,
                                cudaStream_t st)
{
    (void)s, (void)r, (void)dt, (void)comm, (void)st;
    rec("Broadcast n=%zu root=%d", n, root);
    return rec_fail[R_BCAST];
}
static ncclResult_t r_reduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op, int root,
                             ncclComm_t comm, cudaStream_t st)
{
    (void)s, (void)r, (void)dt, (void)op, (void)comm, (void)st;
    rec("Reduce n=%zu root=%d", n, root);
    return rec_fail[R_REDUCE];
}
static ncclResult_t r_send(const void *s, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t st)
{
    (void)dt, (void)comm, (void)st;
    rec("Send peer=%d +%td n=%zu", peer, rec_sbase ? (const char *)s - rec_sbase : 0, n);
    return rec_fail[R_SEND];
}
static ncclResult_t r_recv(void *r, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t st)
{
    (void)dt, (void)comm, (void)st;
    rec("Recv peer=%d +%td n=%zu", peer, rec_rbase ? (const char *)r - rec_rbase : 0, n);
    return rec_fail[R_RECV];
}
static ncclResult_t r_group_start(void)
{
    rec("GroupStart");
    return rec_fail[R_GSTART];
}
static ncclResult_t r_group_end(void)
{
    rec("GroupEnd");
    return rec_fail[R_GEND];
}
static ncclResult_t r_comm_count(const ncclComm_t comm, int *n)
{
    (void)comm;
    *n = rec_nranks;
    return rec_fail[R_COUNT];
}
static const char *r_error_string(ncclResult_t r)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "recorded error string %d", (int)r);
    return buf;
}
static const char *r_last_error(ncclComm_t comm)
{
    (void)comm;
    return "recording table: last error";
}
static int r_mem_get_info(size_t *f, size_t *t)
{
    rec_meminfo_calls++;
    if (rec_meminfo_rc)
        return rec_meminfo_rc;
    *f = rec_free;
    *t = rec_total;
    return 0;
}

static const hnccl_table rec_table = {
    .AllReduce = r_all_reduce,
    .AllGather = r_all_gather,
    .ReduceScatter = r_reduce_scatter,
    .Broadcast = r_broadcast,
    .Reduce = r_reduce,
    .Send = r_send,
    .Recv = r_recv,
    .GroupStart = r_group_start,
    .GroupEnd = r_group_end,
    .CommCount = r_comm_count,
    .GetErrorString = r_error_string,
    .GetLastError = r_last_error,
    .MemGetInfo = r_mem_get_info,
};

static void rec_cb(void *arg, const hnccl_probe_info *info)
{
    (void)arg;
    rec_cb_calls++;
    rec_info = *info;
    rec("cb:%s", info->op_name);
}

static void clear_env(void)
{
    unsetenv("HEAPC_NCCL_PROBE");
    unsetenv("HEAPC_NCCL_SKIP");
    unsetenv("HEAPC_NCCL_FREE_MIN");
}

/* A context on c with the recording table and the recording callback. */
static hnccl_ctx *new_ctx(heapc *c)
{
    clear_env();
    rec_reset();
    hnccl_ctx *x = hnccl_new(c);
    ck_assert_ptr_nonnull(x);
    ck_assert_msg(hnccl_err(x) == 0, "hnccl_new: %s", hnccl_errstr(x));
    ck_assert_int_eq(hnccl_set_table(x, &rec_table), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_release_cb(x, rec_cb, NULL), HNCCL_OK);
    return x;
}

/* Calls every wrapper once (all_to_all over rec_nranks ranks). */
static void call_all(hnccl_ctx *x)
{
    static float buf[64];
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 1, ncclFloat, ncclSum, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_all_gather(x, buf, buf, 2, ncclFloat, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_reduce_scatter(x, buf, buf, 3, ncclFloat, ncclSum, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_broadcast(x, buf, buf, 4, ncclFloat, 1, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_reduce(x, buf, buf, 5, ncclFloat, ncclMax, 0, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_all_to_all(x, buf, buf, 6, ncclFloat, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_send(x, buf, 7, ncclFloat, 1, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_recv(x, buf, 8, ncclFloat, 1, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_group_start(x), 0);
    ck_assert_int_eq(hnccl_group_end(x), 0);
}

/* ---- policies ---------------------------------------------------------------------- */

START_TEST(default_policy)
{
    heapc *c = attach("defaults");
    hnccl_ctx *x = new_ctx(c);
    static const int probes[HNCCL_NOPS] = {[HNCCL_OP_GROUP_START] = 1, [HNCCL_OP_GROUP_END] = 1};
    for (int op = 0; op < HNCCL_NOPS; op++)
        ck_assert_msg(hnccl_get_policy(x, (hnccl_op)op) == (probes[op] ? HNCCL_PROBE : HNCCL_SKIP), "op %s: policy %d",
                      hnccl_op_name((hnccl_op)op), hnccl_get_policy(x, (hnccl_op)op));
    ck_assert_uint_eq(hnccl_probe_mask(x), HNCCL_DEFAULT_PROBE_MASK);
    ck_assert_uint_eq(hnccl_get_threshold(x), 3 * GiB);
    ck_assert_int_eq(hnccl_get_policy(x, HNCCL_NOPS), HNCCL_EINVAL);

    /* Behaviour: every probe fires (threshold above any free memory); only
     * the group calls probe, the hot collectives go straight to NCCL, and
     * all_to_all's internal group is not probed. */
    ck_assert_int_eq(hnccl_set_threshold(x, UINT64_MAX), HNCCL_OK);
    call_all(x);
    REC_IS("AllReduce n=1", "AllGather n=2", "ReduceScatter n=3", "Broadcast n=4 root=1", "Reduce n=5 root=0",
           "GroupStart", "Send peer=0 +0 n=6", "Recv peer=0 +0 n=6", "Send peer=1 +0 n=6", "Recv peer=1 +0 n=6",
           "GroupEnd", "Send peer=1 +0 n=7", "Recv peer=1 +0 n=8", "cb:group_start", "GroupStart", "cb:group_end",
           "GroupEnd");
    hnccl_counters k;
    ck_assert_int_eq(hnccl_get_counters(x, &k), HNCCL_OK);
    for (int op = 0; op < HNCCL_NOPS; op++)
        ck_assert_msg(k.calls[op] == 1, "calls[%s] = %" PRIu64, hnccl_op_name((hnccl_op)op), k.calls[op]);
    ck_assert_uint_eq(k.probes, 2);
    ck_assert_uint_eq(k.below, 2);
    ck_assert_uint_eq(k.callbacks, 2);
    ck_assert_uint_eq(k.probe_errors, 0);
    ck_assert_uint_eq(k.nccl_errors, 0);

    /* Everything probing: one callback before each wrapped call. */
    rec_reset();
    ck_assert_int_eq(hnccl_set_policy(x, "all", HNCCL_PROBE), HNCCL_OK);
    call_all(x);
    ck_assert_int_eq(rec_cb_calls, HNCCL_NOPS);
    ck_assert_str_eq(rec_log[0], "cb:all_reduce");
    ck_assert_str_eq(rec_log[1], "AllReduce n=1");
    ck_assert_int_eq(hnccl_reset_counters(x), HNCCL_OK);
    ck_assert_int_eq(hnccl_get_counters(x, &k), HNCCL_OK);
    ck_assert_uint_eq(k.probes + k.callbacks + k.calls[0], 0);
    hnccl_free(x);
    heapc_detach(c);
    heapc_free_ctx(c);
}
END_TEST

/* Every name of the brief and the ops it means. */
static const struct {
    const char *name;
    uint32_t mask;
} names[] = {
#define B(op) (1u << HNCCL_OP_##op)
    /* op names */
    {"all_reduce", B(ALL_REDUCE)},
    {"all_gather", B(ALL_GATHER)},
    {"reduce_scatter", B(REDUCE_SCATTER)},
    {"broadcast", B(BROADCAST)},
    {"reduce", B(REDUCE)},
    {"all_to_all", B(ALL_TO_ALL)},
    {"send", B(SEND)},
    {"recv", B(RECV)},
    {"group_start", B(GROUP_START)},
    {"group_end", B(GROUP_END)},
    /* torch.distributed */
    {"all_gather_into_tensor", B(ALL_GATHER)},
    {"reduce_scatter_tensor", B(REDUCE_SCATTER)},
    {"all_to_all_single", B(ALL_TO_ALL)},
    {"isend", B(SEND)},
    {"irecv", B(RECV)},
    {"batch_isend_irecv", B(SEND) | B(RECV)},
    /* c10d ProcessGroup methods */
    {"allreduce", B(ALL_REDUCE)},
    {"allgather", B(ALL_GATHER)},
    {"_allgather_base", B(ALL_GATHER)},
    {"allgather_into_tensor_coalesced", B(ALL_GATHER)},
    {"_reduce_scatter_base", B(REDUCE_SCATTER)},
    {"reduce_scatter_tensor_coalesced", B(REDUCE_SCATTER)},
    {"alltoall", B(ALL_TO_ALL)},
    {"alltoall_base", B(ALL_TO_ALL)},
    /* generic */
    {"all", HNCCL_ALL_OPS_MASK},
    {"none", 0},
#undef B
};
#define NNAMES (sizeof names / sizeof names[0])

START_TEST(aliases)
{
    hnccl_ctx *x = new_ctx(NULL);
    const char *valid = hnccl_valid_names();
    for (size_t i = 0; i < NNAMES; i++) {
        uint32_t m = 12345;
        ck_assert_msg(hnccl_ops_from_name(names[i].name, &m) == HNCCL_OK, "%s", names[i].name);
        ck_assert_msg(m == names[i].mask, "%s: mask %#x, want %#x", names[i].name, m, names[i].mask);
        ck_assert_msg(strstr(valid, names[i].name), "%s not in the valid names: %s", names[i].name, valid);
        if (!strcmp(names[i].name, "all") || !strcmp(names[i].name, "none"))
            continue;
        /* Set alone: exactly its ops probe, or exactly its ops skip. */
        ck_assert_int_eq(hnccl_set_policy(x, "all", HNCCL_SKIP), HNCCL_OK);
        ck_assert_int_eq(hnccl_set_policy(x, names[i].name, HNCCL_PROBE), HNCCL_OK);
        ck_assert_msg(hnccl_probe_mask(x) == names[i].mask, "%s: probe mask %#x", names[i].name, hnccl_probe_mask(x));
        ck_assert_int_eq(hnccl_set_policy(x, "all", HNCCL_PROBE), HNCCL_OK);
        ck_assert_int_eq(hnccl_set_policy(x, names[i].name, HNCCL_SKIP), HNCCL_OK);
        ck_assert_msg(hnccl_probe_mask(x) == (HNCCL_ALL_OPS_MASK & ~names[i].mask), "%s: probe mask %#x", names[i].name,
                      hnccl_probe_mask(x));
    }
    /* Generic names: all / none, in both modes. */
    ck_assert_int_eq(hnccl_set_policy(x, "all", HNCCL_PROBE), HNCCL_OK);
    ck_assert_uint_eq(hnccl_probe_mask(x), HNCCL_ALL_OPS_MASK);
    ck_assert_int_eq(hnccl_set_policy(x, "all", HNCCL_SKIP), HNCCL_OK);
    ck_assert_uint_eq(hnccl_probe_mask(x), 0);
    ck_assert_int_eq(hnccl_set_policy(x, "none", HNCCL_SKIP), HNCCL_OK); /* nothing skips */
    ck_assert_uint_eq(hnccl_probe_mask(x), HNCCL_ALL_OPS_MASK);
    ck_assert_int_eq(hnccl_set_policy(x, "none", HNCCL_PROBE), HNCCL_OK); /* nothing probes */
    ck_assert_uint_eq(hnccl_probe_mask(x), 0);
    /* Lists: commas and blanks; the generic name applies first. */
    ck_assert_int_eq(hnccl_set_policy(x, " allreduce, _allgather_base\tall_gather_into_tensor ,,", HNCCL_PROBE),
                     HNCCL_OK);
    ck_assert_uint_eq(hnccl_probe_mask(x), (1u << HNCCL_OP_ALL_REDUCE) | (1u << HNCCL_OP_ALL_GATHER));
    ck_assert_int_eq(hnccl_set_policy(x, "send,all", HNCCL_SKIP), HNCCL_OK);
    ck_assert_uint_eq(hnccl_probe_mask(x), 0);
    ck_assert_int_eq(hnccl_set_policy(x, "isend,none", HNCCL_SKIP), HNCCL_OK);
    ck_assert_uint_eq(hnccl_probe_mask(x), HNCCL_ALL_OPS_MASK & ~(1u << HNCCL_OP_SEND));
    ck_assert_int_eq(hnccl_set_op_policy(x, HNCCL_OP_SEND, HNCCL_PROBE), HNCCL_OK);
    ck_assert_uint_eq(hnccl_probe_mask(x), HNCCL_ALL_OPS_MASK);

    /* Unknown names: an error naming the name and listing the valid ones;
     * nothing changes, also for the valid names of the same list. */
    uint32_t before = hnccl_probe_mask(x);
    ck_assert_int_eq(hnccl_set_policy(x, "allreduce,all-reduce", HNCCL_SKIP), HNCCL_EINVAL);
    ck_assert_int_eq(hnccl_err(x), HNCCL_EINVAL);
    ck_assert_uint_eq(hnccl_probe_mask(x), before);
    const char *e = hnccl_errstr(x);
    ck_assert_msg(strstr(e, "unknown op name \"all-reduce\""), "%s", e);
    for (size_t i = 0; i < NNAMES; i++)
        ck_assert_msg(strstr(e, names[i].name), "%s not listed in: %s", names[i].name, e);
    ck_assert_int_eq(hnccl_set_policy(x, "AllReduce", HNCCL_SKIP), HNCCL_EINVAL); /* case-sensitive */
    ck_assert_int_eq(hnccl_set_policy(x, "all,none", HNCCL_SKIP), HNCCL_EINVAL);
    ck_assert_msg(strstr(hnccl_errstr(x), "both \"all\" and \"none\""), "%s", hnccl_errstr(x));
    ck_assert_int_eq(hnccl_set_policy(x, " , ", HNCCL_SKIP), HNCCL_EINVAL);
    ck_assert_int_eq(hnccl_set_policy(x, NULL, HNCCL_SKIP), HNCCL_EINVAL);
    ck_assert_int_eq(hnccl_set_policy(x, "send", (hnccl_mode)7), HNCCL_EINVAL);
    ck_assert_int_eq(hnccl_set_op_policy(x, HNCCL_NOPS, HNCCL_SKIP), HNCCL_EINVAL);
    ck_assert_uint_eq(hnccl_probe_mask(x), before);
    uint32_t m;
    ck_assert_int_eq(hnccl_ops_from_name("bogus", &m), HNCCL_EINVAL);
    ck_assert_int_eq(hnccl_ops_from_name(NULL, &m), HNCCL_EINVAL);
    /* A success clears the error. */
    ck_assert_int_eq(hnccl_set_policy(x, "send", HNCCL_SKIP), HNCCL_OK);
    ck_assert_int_eq(hnccl_err(x), 0);
    ck_assert_str_eq(hnccl_errstr(x), "");
    for (int op = 0; op < HNCCL_NOPS; op++)
        ck_assert_ptr_nonnull(hnccl_op_name((hnccl_op)op));
    ck_assert_ptr_null(hnccl_op_name(HNCCL_NOPS));
    ck_assert_str_eq(hnccl_errname(HNCCL_EINVAL), "ERR_INVAL");
    ck_assert_str_eq(hnccl_errname(ncclInvalidArgument), "ncclInvalidArgument");
    hnccl_free(x);
}
END_TEST

/* hnccl_new under the given environment (NULL: unset). */
static hnccl_ctx *env_ctx(const char *probe, const char *skip, const char *free_min)
{
    clear_env();
    if (probe)
        setenv("HEAPC_NCCL_PROBE", probe, 1);
    if (skip)
        setenv("HEAPC_NCCL_SKIP", skip, 1);
    if (free_min)
        setenv("HEAPC_NCCL_FREE_MIN", free_min, 1);
    hnccl_ctx *x = hnccl_new(NULL);
    ck_assert_ptr_nonnull(x);
    return x;
}

#define OPM(op) (1u << HNCCL_OP_##op)

START_TEST(environment)
{
    const uint32_t def = HNCCL_DEFAULT_PROBE_MASK;
    hnccl_ctx *x = env_ctx("all_gather_into_tensor,_allgather_base,allreduce", NULL, NULL);
    ck_assert_msg(hnccl_err(x) == 0, "%s", hnccl_errstr(x));
    ck_assert_uint_eq(hnccl_probe_mask(x), def | OPM(ALL_GATHER) | OPM(ALL_REDUCE));
    hnccl_free(x);

    /* every alias, through the variable */
    for (size_t i = 0; i < NNAMES; i++) {
        if (!strcmp(names[i].name, "all") || !strcmp(names[i].name, "none"))
            continue;
        x = env_ctx(NULL, "all", NULL);
        ck_assert_int_eq(hnccl_probe_mask(x), 0);
        setenv("HEAPC_NCCL_SKIP", "none", 1);  /* nothing skips ... */
        setenv("HEAPC_NCCL_PROBE", "none", 1); /* ... contradicts nothing probes */
        ck_assert_int_eq(hnccl_apply_env(x), HNCCL_EINVAL);
        ck_assert_msg(strstr(hnccl_errstr(x), "contradict"), "%s", hnccl_errstr(x));
        unsetenv("HEAPC_NCCL_SKIP");
        setenv("HEAPC_NCCL_PROBE", names[i].name, 1);
        ck_assert_int_eq(hnccl_apply_env(x), HNCCL_OK);
        ck_assert_msg(hnccl_probe_mask(x) == names[i].mask, "HEAPC_NCCL_PROBE=%s: %#x", names[i].name,
                      hnccl_probe_mask(x));
        hnccl_free(x);
        x = env_ctx(NULL, names[i].name, NULL);
        ck_assert_msg(hnccl_err(x) == 0, "%s", hnccl_errstr(x));
        ck_assert_msg(hnccl_probe_mask(x) == (def & ~names[i].mask), "HEAPC_NCCL_SKIP=%s: %#x", names[i].name,
                      hnccl_probe_mask(x));
        hnccl_free(x);
    }

    /* all / none, and their order against named ops */
    x = env_ctx("all", "send", NULL);
    ck_assert_uint_eq(hnccl_probe_mask(x), HNCCL_ALL_OPS_MASK & ~OPM(SEND));
    hnccl_free(x);
    x = env_ctx("allreduce", "all", NULL);
    ck_assert_uint_eq(hnccl_probe_mask(x), OPM(ALL_REDUCE));
    hnccl_free(x);
    x = env_ctx("none", NULL, NULL);
    ck_assert_uint_eq(hnccl_probe_mask(x), 0);
    hnccl_free(x);
    x = env_ctx(NULL, "none", NULL);
    ck_assert_uint_eq(hnccl_probe_mask(x), HNCCL_ALL_OPS_MASK);
    hnccl_free(x);
    x = env_ctx("all", "none", NULL); /* the same thing twice */
    ck_assert_int_eq(hnccl_err(x), 0);
    ck_assert_uint_eq(hnccl_probe_mask(x), HNCCL_ALL_OPS_MASK);
    hnccl_free(x);
    x = env_ctx("", "", ""); /* empty: nothing changes */
    ck_assert_int_eq(hnccl_err(x), 0);
    ck_assert_uint_eq(hnccl_probe_mask(x), def);
    ck_assert_uint_eq(hnccl_get_threshold(x), 3 * GiB);
    hnccl_free(x);

    /* errors: the context keeps its settings, the message names the variable */
    x = env_ctx("allreduce,bogus_op", NULL, "1G");
    ck_assert_int_eq(hnccl_err(x), HNCCL_EINVAL);
    ck_assert_uint_eq(hnccl_probe_mask(x), def);
    ck_assert_uint_eq(hnccl_get_threshold(x), 3 * GiB);
    ck_assert_msg(strstr(hnccl_errstr(x), "HEAPC_NCCL_PROBE") && strstr(hnccl_errstr(x), "\"bogus_op\"") &&
                      strstr(hnccl_errstr(x), "valid names") && strstr(hnccl_errstr(x), "_reduce_scatter_base"),
                  "%s", hnccl_errstr(x));
    hnccl_free(x);
    x = env_ctx(NULL, "Send", NULL);
    ck_assert_int_eq(hnccl_err(x), HNCCL_EINVAL);
    ck_assert_msg(strstr(hnccl_errstr(x), "HEAPC_NCCL_SKIP") && strstr(hnccl_errstr(x), "\"Send\""), "%s",
                  hnccl_errstr(x));
    hnccl_free(x);
    x = env_ctx("allreduce,isend", "all_reduce", NULL);
    ck_assert_int_eq(hnccl_err(x), HNCCL_EINVAL);
    ck_assert_msg(strstr(hnccl_errstr(x), "op all_reduce named in both"), "%s", hnccl_errstr(x));
    ck_assert_uint_eq(hnccl_probe_mask(x), def);
    hnccl_free(x);

    /* the threshold */
    x = env_ctx(NULL, NULL, "3G");
    ck_assert_uint_eq(hnccl_get_threshold(x), 3 * GiB);
    hnccl_free(x);
    x = env_ctx(NULL, NULL, "512M");
    ck_assert_uint_eq(hnccl_get_threshold(x), 512 * MiB);
    hnccl_free(x);
    x = env_ctx(NULL, NULL, "1073741824");
    ck_assert_uint_eq(hnccl_get_threshold(x), GiB);
    hnccl_free(x);
    x = env_ctx(NULL, NULL, "0");
    ck_assert_uint_eq(hnccl_get_threshold(x), 0);
    hnccl_free(x);
    x = env_ctx("allreduce", NULL, "3X");
    ck_assert_int_eq(hnccl_err(x), HNCCL_EINVAL);
    ck_assert_msg(strstr(hnccl_errstr(x), "HEAPC_NCCL_FREE_MIN=\"3X\""), "%s", hnccl_errstr(x));
    ck_assert_uint_eq(hnccl_get_threshold(x), 3 * GiB);
    ck_assert_uint_eq(hnccl_probe_mask(x), def); /* nothing of a failed environment applies */
    /* apply_env on a configured context adds to its settings */
    clear_env();
    ck_assert_int_eq(hnccl_set_threshold(x, 5), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_policy(x, "broadcast", HNCCL_PROBE), HNCCL_OK);
    setenv("HEAPC_NCCL_PROBE", "recv", 1);
    ck_assert_int_eq(hnccl_apply_env(x), HNCCL_OK);
    ck_assert_uint_eq(hnccl_probe_mask(x), def | OPM(BROADCAST) | OPM(RECV));
    ck_assert_uint_eq(hnccl_get_threshold(x), 5);
    hnccl_free(x);
    clear_env();
}
END_TEST

/* ---- threshold and callback -------------------------------------------------------- */

static uint64_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

START_TEST(threshold_and_callback)
{
    heapc *c = attach("threshold");
    hnccl_ctx *x = new_ctx(c);
    heapc_status_t st = page(c);
    ck_assert_uint_gt(st.device_total, 0);
    ck_assert_uint_le(st.device_free, st.device_total);
    /* the host backend's "device" is the host: MemAvailable */
    uint64_t avail = meminfo_available(), slack = avail / 5 > 512 * MiB ? avail / 5 : 512 * MiB;
    ck_assert_msg(st.device_free + slack >= avail && st.device_free <= avail + slack,
                  "page device_free %" PRIu64 ", MemAvailable %" PRIu64, st.device_free, avail);
    float buf[4] = {0};
    ck_assert_int_eq(hnccl_set_policy(x, "allreduce", HNCCL_PROBE), HNCCL_OK);

    /* Above the host's free memory: the callback fires, before NCCL's call. */
    ck_assert_int_eq(hnccl_set_threshold(x, st.device_total + 1), HNCCL_OK);
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 4, ncclFloat, ncclSum, NULL, NULL), 0);
    REC_IS("cb:all_reduce", "AllReduce n=4");
    ck_assert_int_eq(rec_info.op, HNCCL_OP_ALL_REDUCE);
    ck_assert_str_eq(rec_info.op_name, "all_reduce");
    ck_assert_int_eq(rec_info.source, HNCCL_SOURCE_PAGE);
    ck_assert_int_eq(rec_info.below, 1);
    ck_assert_int_eq(rec_info.have_page, 1);
    ck_assert_uint_eq(rec_info.threshold, st.device_total + 1);
    ck_assert_uint_eq(rec_info.device_free, rec_info.page.device_free);
    ck_assert_uint_eq(rec_info.device_total, st.device_total);
    ck_assert_uint_eq(rec_info.page.mapped, 1 * MiB);
    /* Other ops still skip. */
    ck_assert_int_eq(hnccl_broadcast(x, buf, buf, 4, ncclFloat, 0, NULL, NULL), 0);
    REC_IS("cb:all_reduce", "AllReduce n=4", "Broadcast n=4 root=0");

    /* Below it: no callback. */
    rec_reset();
    ck_assert_int_eq(hnccl_set_threshold(x, 1), HNCCL_OK);
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 4, ncclFloat, ncclSum, NULL, NULL), 0);
    REC_IS("AllReduce n=4");
    ck_assert_int_eq(hnccl_set_threshold(x, 0), HNCCL_OK); /* never */
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 4, ncclFloat, ncclSum, NULL, NULL), 0);
    REC_IS("AllReduce n=4", "AllReduce n=4");
    hnccl_counters k;
    hnccl_get_counters(x, &k);
    ck_assert_uint_eq(k.probes, 3);
    ck_assert_uint_eq(k.below, 1);
    ck_assert_uint_eq(k.callbacks, 1);

    /* Between: the threshold compares with what the page says. */
    st = page(c);
    rec_reset();
    hnccl_probe_info info;
    ck_assert_int_eq(hnccl_set_threshold(x, 3 * GiB), HNCCL_OK);
    int r = hnccl_probe(x, HNCCL_OP_SEND, &info);
    ck_assert_int_eq(r, info.device_free < 3 * GiB);
    ck_assert_int_eq(rec_cb_calls, r);

    /* hnccl_probe probes whatever the policy; without a callback the
     * probe still counts as below. */
    ck_assert_int_eq(hnccl_set_release_cb(x, NULL, NULL), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_threshold(x, UINT64_MAX), HNCCL_OK);
    hnccl_reset_counters(x);
    rec_reset();
    ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_RECV, &info), 1);
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 4, ncclFloat, ncclSum, NULL, NULL), 0);
    REC_IS("AllReduce n=4");
    hnccl_get_counters(x, &k);
    ck_assert_uint_eq(k.probes, 2);
    ck_assert_uint_eq(k.below, 2);
    ck_assert_uint_eq(k.callbacks, 0);
    ck_assert_int_eq(hnccl_probe(x, HNCCL_NOPS, NULL), HNCCL_EINVAL);
    hnccl_free(x);

    /* No page (no heapc context, or not attached): the call goes on, the
     * probe counts as an error, hnccl_probe says why. */
    x = new_ctx(NULL);
    ck_assert_int_eq(hnccl_set_policy(x, "all_reduce", HNCCL_PROBE), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_threshold(x, UINT64_MAX), HNCCL_OK);
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 4, ncclFloat, ncclSum, NULL, NULL), 0);
    REC_IS("AllReduce n=4");
    hnccl_get_counters(x, &k);
    ck_assert_uint_eq(k.probe_errors, 1);
    ck_assert_uint_eq(k.probes, 0);
    ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, NULL), HNCCL_ESOURCE);
    ck_assert_msg(strstr(hnccl_errstr(x), "no status page"), "%s", hnccl_errstr(x));
    hnccl_free(x);
    heapc *c2 = heapc_connect(g_heapd.sock);
    x = new_ctx(c2);
    ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, NULL), HNCCL_ESOURCE);
    ck_assert_msg(strstr(hnccl_errstr(x), "not attached"), "%s", hnccl_errstr(x));
    hnccl_free(x);
    heapc_free_ctx(c2);
    heapc_detach(c);
    heapc_free_ctx(c);
}
END_TEST

/* ---- cuMemGetInfo source: the rate limit ---------------------------------------------- */

START_TEST(rate_limit)
{
    heapc *c = attach("ratelimit");
    hnccl_ctx *x = new_ctx(c);
    hnccl_probe_info info;
    hnccl_counters k;
    float buf[2] = {0};

    /* 500 ms: many probes, one query */
    ck_assert_int_eq(hnccl_set_probe_source(x, HNCCL_SOURCE_CUDA, 500000), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_policy(x, "all_reduce", HNCCL_PROBE), HNCCL_OK);
    for (int i = 0; i < 20; i++)
        ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, &info), 1); /* 1 GiB < 3 GiB */
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 2, ncclFloat, ncclSum, NULL, NULL), 0);
    ck_assert_int_eq(rec_meminfo_calls, 1);
    hnccl_get_counters(x, &k);
    ck_assert_uint_eq(k.cuda_queries, 1);
    ck_assert_uint_eq(k.cuda_reused, 24);
    ck_assert_uint_eq(k.probes, 25);
    ck_assert_uint_eq(k.callbacks, 25);
    ck_assert_int_eq(info.source, HNCCL_SOURCE_CUDA);
    ck_assert_uint_eq(info.device_free, 1 * GiB);
    ck_assert_uint_eq(info.device_total, 80 * GiB);
    ck_assert_int_eq(info.cuda_queried, 0);
    ck_assert_int_eq(info.have_page, 1); /* the page is read too, for the callback */

    /* Within the interval the last value is reused, even when memory changed. */
    rec_free = 10 * GiB;
    ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, &info), 1);
    ck_assert_uint_eq(info.device_free, 1 * GiB);
    ck_assert_int_eq(rec_meminfo_calls, 1);
    /* After it, a new query. */
    sleep_ms(550);
    rec_cb_calls = 0;
    ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, &info), 0);
    ck_assert_int_eq(info.cuda_queried, 1);
    ck_assert_uint_eq(info.device_free, 10 * GiB);
    ck_assert_int_eq(rec_meminfo_calls, 2);
    ck_assert_int_eq(rec_cb_calls, 0);

    /* Interval 0: every probe queries. */
    ck_assert_int_eq(hnccl_set_probe_source(x, HNCCL_SOURCE_CUDA, 0), HNCCL_OK);
    rec_meminfo_calls = 0;
    for (int i = 0; i < 7; i++)
        ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, &info), 0);
    ck_assert_int_eq(rec_meminfo_calls, 7);

    /* A failing cuMemGetInfo: a probe error, and the call is made anyway. */
    rec_meminfo_rc = 201; /* CUDA_ERROR_INVALID_CONTEXT */
    ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, &info), HNCCL_ESOURCE);
    ck_assert_msg(strstr(hnccl_errstr(x), "cuMemGetInfo failed: CUresult 201"), "%s", hnccl_errstr(x));
    rec_n = 0;
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 2, ncclFloat, ncclSum, NULL, NULL), 0);
    REC_IS("AllReduce n=2");
    hnccl_get_counters(x, &k);
    ck_assert_uint_eq(k.probe_errors, 2);
    rec_meminfo_rc = 0;

    /* Back to the page: no more queries. */
    ck_assert_int_eq(hnccl_set_probe_source(x, HNCCL_SOURCE_PAGE, 0), HNCCL_OK);
    rec_meminfo_calls = 0;
    int r = hnccl_probe(x, HNCCL_OP_ALL_REDUCE, &info);
    ck_assert_int_eq(r, info.device_free < 3 * GiB);
    ck_assert_int_eq(info.source, HNCCL_SOURCE_PAGE);
    ck_assert_int_eq(rec_meminfo_calls, 0);

    /* A table without MemGetInfo: the CUDA source is refused. */
    hnccl_table t = rec_table;
    t.MemGetInfo = NULL;
    ck_assert_int_eq(hnccl_set_table(x, &t), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_probe_source(x, HNCCL_SOURCE_CUDA, 1000), HNCCL_ELOAD);
    ck_assert_msg(strstr(hnccl_errstr(x), "no MemGetInfo"), "%s", hnccl_errstr(x));
    ck_assert_int_eq(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, &info) >= 0, 1);
    ck_assert_int_eq(info.source, HNCCL_SOURCE_PAGE);
    ck_assert_int_eq(hnccl_set_probe_source(x, (hnccl_source)9, 0), HNCCL_EINVAL);
    hnccl_free(x);
    heapc_detach(c);
    heapc_free_ctx(c);
}
END_TEST

/* ---- NCCL errors --------------------------------------------------------------------- */

static int has(const char *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int has(const char *s, const char *fmt, ...)
{
    char want[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof want, fmt, ap);
    va_end(ap);
    return strstr(s, want) != NULL;
}

START_TEST(error_message)
{
    heapc *c = attach("errors");
    uint64_t off;
    ck_assert_int_eq(heapc_alloc(c, 4 * KiB, NULL, &off), HEAPC_OK);
    hnccl_ctx *x = new_ctx(c);
    float buf[8] = {0};
    heapc_status_t st = page(c);

    rec_fail[R_ALLREDUCE] = ncclUnhandledCudaError;
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 8, ncclFloat, ncclSum, NULL, NULL), ncclUnhandledCudaError);
    ck_assert_int_eq(hnccl_err(x), ncclUnhandledCudaError);
    const char *e = hnccl_errstr(x);
    ck_assert_msg(has(e, "ncclAllReduce (op all_reduce) failed: ncclUnhandledCudaError (1): "
                         "recorded error string 1; NCCL: \"recording table: last error\""),
                  "%s", e);
    ck_assert_msg(has(e, "memory at failure (heapd status page, rank 0, epoch %" PRIu64 "): device free ", st.epoch),
                  "%s", e);
    ck_assert_msg(has(e, " of %" PRIu64 " B (", st.device_total), "%s", e);
    ck_assert_msg(has(e, "heap mapped 1048576 B (1.0 MiB), live 4096 B (4.0 KiB), released 0 B, "
                         "free 1044480 B (1020.0 KiB); this rank holds 4096 B (4.0 KiB)"),
                  "%s", e);
    ck_assert_msg(has(e, "sampled ") && has(e, " ms ago"), "%s", e);
    hnccl_counters k;
    hnccl_get_counters(x, &k);
    ck_assert_uint_eq(k.nccl_errors, 1);
    ck_assert_uint_eq(k.calls[HNCCL_OP_ALL_REDUCE], 1);

    /* The next successful call clears the error. */
    rec_fail[R_ALLREDUCE] = ncclSuccess;
    ck_assert_int_eq(hnccl_all_reduce(x, buf, buf, 8, ncclFloat, ncclSum, NULL, NULL), 0);
    ck_assert_int_eq(hnccl_err(x), 0);
    ck_assert_str_eq(hnccl_errstr(x), "");

    /* ncclInProgress (non-blocking communicators) is not an error. */
    rec_fail[R_SEND] = ncclInProgress;
    ck_assert_int_eq(hnccl_send(x, buf, 8, ncclFloat, 1, NULL, NULL), ncclInProgress);
    ck_assert_int_eq(hnccl_err(x), 0);

    /* Every wrapper reports its call. */
    rec_fail[R_SEND] = ncclRemoteError;
    ck_assert_int_eq(hnccl_send(x, buf, 8, ncclFloat, 1, NULL, NULL), ncclRemoteError);
    ck_assert_msg(has(hnccl_errstr(x), "ncclSend (op send) failed: ncclRemoteError (6)"), "%s", hnccl_errstr(x));
    rec_fail[R_GEND] = ncclInvalidUsage;
    ck_assert_int_eq(hnccl_group_end(x), ncclInvalidUsage);
    ck_assert_msg(has(hnccl_errstr(x), "ncclGroupEnd (op group_end) failed: ncclInvalidUsage (5)"), "%s",
                  hnccl_errstr(x));
    rec_fail[R_GEND] = ncclSuccess;

    /* all_to_all: a failing Recv still closes the group, and is named. */
    rec_fail[R_SEND] = ncclSuccess;
    rec_fail[R_RECV] = ncclSystemError;
    rec_n = 0;
    rec_nranks = 3;
    ck_assert_int_eq(hnccl_all_to_all(x, buf, buf, 2, ncclFloat, NULL, NULL), ncclSystemError);
    REC_IS("GroupStart", "Send peer=0 +0 n=2", "Recv peer=0 +0 n=2", "GroupEnd");
    ck_assert_msg(has(hnccl_errstr(x), "ncclRecv (op all_to_all) failed: ncclSystemError (2)"), "%s", hnccl_errstr(x));
    rec_fail[R_RECV] = ncclSuccess;
    rec_fail[R_COUNT] = ncclInvalidArgument;
    ck_assert_int_eq(hnccl_all_to_all(x, buf, buf, 2, ncclFloat, NULL, NULL), ncclInvalidArgument);
    ck_assert_msg(has(hnccl_errstr(x), "ncclCommCount (op all_to_all) failed"), "%s", hnccl_errstr(x));
    rec_fail[R_COUNT] = ncclSuccess;
    ck_assert_int_eq(hnccl_all_to_all(x, buf, buf, 2, (ncclDataType_t)99, NULL, NULL), HNCCL_EINVAL);
    ck_assert_msg(has(hnccl_errstr(x), "unknown data type 99"), "%s", hnccl_errstr(x));

    /* A table without the function. */
    hnccl_table t = rec_table;
    t.ReduceScatter = NULL;
    hnccl_set_table(x, &t);
    ck_assert_int_eq(hnccl_reduce_scatter(x, buf, buf, 1, ncclFloat, ncclSum, NULL, NULL), HNCCL_ELOAD);
    ck_assert_msg(has(hnccl_errstr(x), "has no ReduceScatter"), "%s", hnccl_errstr(x));
    hnccl_get_counters(x, &k);
    ck_assert_uint_eq(k.nccl_errors, 5);
    hnccl_free(x);

    /* Without a page the message says so. */
    x = new_ctx(NULL);
    rec_fail[R_BCAST] = ncclInternalError;
    ck_assert_int_eq(hnccl_broadcast(x, buf, buf, 1, ncclFloat, 0, NULL, NULL), ncclInternalError);
    ck_assert_msg(has(hnccl_errstr(x), "memory at failure: unknown (no status page: no heapc context)"), "%s",
                  hnccl_errstr(x));
    /* With the CUDA source the message also has a fresh cuMemGetInfo. */
    ck_assert_int_eq(hnccl_set_probe_source(x, HNCCL_SOURCE_CUDA, 1000000), HNCCL_OK);
    ck_assert_int_eq(hnccl_broadcast(x, buf, buf, 1, ncclFloat, 0, NULL, NULL), ncclInternalError);
    ck_assert_msg(has(hnccl_errstr(x), "; cuMemGetInfo: free 1073741824 B (1.0 GiB) of 85899345920 B (80.0 GiB)"), "%s",
                  hnccl_errstr(x));
    ck_assert_int_eq(hnccl_all_reduce(NULL, buf, buf, 1, ncclFloat, ncclSum, NULL, NULL), HNCCL_EINVAL);
    hnccl_free(x);
    heapc_free(c, off);
    heapc_detach(c);
    heapc_free_ctx(c);
}
END_TEST

START_TEST(all_to_all_grouped)
{
    hnccl_ctx *x = new_ctx(NULL);
    double sbuf[12], rbuf[12];
    rec_sbase = (const char *)sbuf;
    rec_rbase = (const char *)rbuf;
    rec_nranks = 3;
    ck_assert_int_eq(hnccl_all_to_all(x, sbuf, rbuf, 4, ncclFloat64, NULL, NULL), 0);
    REC_IS("GroupStart", "Send peer=0 +0 n=4", "Recv peer=0 +0 n=4", "Send peer=1 +32 n=4", "Recv peer=1 +32 n=4",
           "Send peer=2 +64 n=4", "Recv peer=2 +64 n=4", "GroupEnd");
    rec_n = 0;
    rec_nranks = 1;
    ck_assert_int_eq(hnccl_all_to_all(x, sbuf, rbuf, 3, ncclBfloat16, NULL, NULL), 0);
    REC_IS("GroupStart", "Send peer=0 +0 n=3", "Recv peer=0 +0 n=3", "GroupEnd");
    ck_assert_uint_eq(hnccl_type_size(ncclInt8), 1);
    ck_assert_uint_eq(hnccl_type_size(ncclHalf), 2);
    ck_assert_uint_eq(hnccl_type_size(ncclFloat), 4);
    ck_assert_uint_eq(hnccl_type_size(ncclUint64), 8);
    ck_assert_uint_eq(hnccl_type_size((ncclDataType_t)12), 0);
    hnccl_free(x);
}
END_TEST

/* ---- page values after allocations, frees, collects, growth -------------------------- */

/* One wrapped all_reduce (probing, threshold above everything): the page
 * the wrapper saw. */
static heapc_status_t seen(hnccl_ctx *x)
{
    float b = 0;
    int before = rec_cb_calls;
    ck_assert_int_eq(hnccl_all_reduce(x, &b, &b, 1, ncclFloat, ncclSum, NULL, NULL), 0);
    ck_assert_int_eq(rec_cb_calls, before + 1);
    ck_assert_int_eq(rec_info.have_page, 1);
    return rec_info.page;
}

START_TEST(page_values)
{
    heapc *c = attach("pagevalues");
    hnccl_ctx *x = new_ctx(c);
    ck_assert_int_eq(hnccl_set_policy(x, "allreduce", HNCCL_PROBE), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_threshold(x, UINT64_MAX), HNCCL_OK);
    ck_assert_int_eq(heapc_set_free_batch(c, 1024), HEAPC_OK);

    heapc_status_t p = seen(x);
    ck_assert_uint_eq(p.mapped, 1 * MiB);
    ck_assert_uint_eq(p.live, 0);
    ck_assert_uint_eq(p.free, 1 * MiB);
    ck_assert_uint_eq(p.allocs, 0);
    ck_assert_uint_eq(p.collects, 0);
    ck_assert_uint_eq(p.growths, 0);
    ck_assert_uint_gt(p.device_total, 0);
    ck_assert_uint_eq(rec_info.device_free, p.device_free);
    uint64_t epoch = p.epoch, updates = p.updates;

    /* allocations */
    uint64_t a, b;
    ck_assert_int_eq(heapc_alloc(c, 4 * KiB, NULL, &a), HEAPC_OK);
    ck_assert_int_eq(heapc_alloc(c, 64 * KiB, NULL, &b), HEAPC_OK);
    p = seen(x);
    ck_assert_uint_eq(p.live, 68 * KiB);
    ck_assert_uint_eq(p.rank_held, 68 * KiB);
    ck_assert_uint_eq(p.allocs, 2);
    ck_assert_uint_eq(p.mapped, p.live + p.released + p.free);
    ck_assert_uint_eq(p.epoch, epoch);
    ck_assert_uint_gt(p.updates, updates);

    /* a free: queued until the flush, then heapd's page shows it: the heap's
     * only rank released it, so (reclaim eager, issue 27) it is free at once */
    ck_assert_int_eq(heapc_free(c, a), HEAPC_OK);
    p = seen(x);
    ck_assert_uint_eq(p.rank_held, 68 * KiB); /* still queued in the client */
    ck_assert_int_eq(heapc_flush(c), HEAPC_OK);
    for (int i = 0; i < 300 && (p = seen(x)).rank_held != 64 * KiB; i++)
        sleep_ms(10);
    ck_assert_uint_eq(p.rank_held, 64 * KiB);
    ck_assert_uint_eq(p.rank_released, 0);
    ck_assert_uint_eq(p.released, 0);
    ck_assert_uint_eq(p.live, 64 * KiB);
    ck_assert_uint_eq(p.free, 1 * MiB - 64 * KiB);
    ck_assert_uint_eq(p.mapped, p.live + p.released + p.free);

    /* a collect (nothing left to reclaim). heapd (daemon/heap.c, collect completion) sends
     * the CollectReply before it publishes the page, so the page may lag the
     * reply by a moment: wait for it. */
    ck_assert_int_eq(heapc_collect(c), HEAPC_OK);
    for (int i = 0; i < 300 && (p = seen(x)).collects != 1; i++)
        sleep_ms(10);
    ck_assert_uint_eq(p.collects, 1);
    ck_assert_uint_eq(p.released, 0);
    ck_assert_uint_eq(p.rank_released, 0);
    ck_assert_uint_eq(p.live, 64 * KiB);
    ck_assert_uint_eq(p.free, 1 * MiB - 64 * KiB);

    /* growth: a block larger than the chunk */
    uint64_t g;
    ck_assert_int_eq(heapc_alloc(c, 2 * MiB, NULL, &g), HEAPC_OK);
    p = seen(x);
    ck_assert_uint_ge(p.growths, 1);
    ck_assert_uint_ge(p.mapped, 3 * MiB);
    ck_assert_uint_eq(p.mapped, heapc_mapped(c));
    ck_assert_uint_eq(p.live, 2 * MiB + 64 * KiB);
    ck_assert_uint_eq(p.allocs, 3);
    ck_assert_uint_eq(p.mapped, p.live + p.released + p.free);

    /* heapd samples memory on its timer (10 ms here): the page moves */
    uint64_t t0 = p.device_sampled_ns;
    for (int i = 0; i < 100 && (p = seen(x)).device_sampled_ns == t0; i++)
        sleep_ms(10);
    ck_assert_uint_gt(p.device_sampled_ns, t0);

    hnccl_counters k;
    hnccl_get_counters(x, &k);
    ck_assert_uint_eq(k.probes, k.calls[HNCCL_OP_ALL_REDUCE]);
    ck_assert_uint_eq(k.probe_errors, 0);
    hnccl_free(x);
    heapc_free(c, b);
    heapc_free(c, g);
    heapc_detach(c);
    heapc_free_ctx(c);
}
END_TEST

/* ---- real NCCL ---------------------------------------------------------------------- */

/* libnccl.so.2 without a GPU: its error path through the wrappers. */
START_TEST(real_nccl_no_gpu)
{
    char e[512];
    const hnccl_table *t = hnccl_load(e, sizeof e);
    if (!t) {
        printf("skipped: libnccl.so.2 not loadable (real NCCL error path): %s\n", e);
        fflush(stdout);
        return;
    }
    int v = 0;
    ck_assert_int_eq(t->GetVersion(&v), ncclSuccess);
    ck_assert_int_ge(v, 2700);
    ck_assert_ptr_eq(hnccl_load(NULL, 0), t); /* loaded once */
    heapc *c = attach("realnccl");
    clear_env();
    hnccl_ctx *x = hnccl_new(c); /* no table set: the real one, loaded lazily */
    ck_assert_ptr_eq(hnccl_get_table(x), t);
    float buf[4] = {0};
    int rc = hnccl_all_reduce(x, buf, buf, 4, ncclFloat, ncclSum, NULL, NULL);
    ck_assert_int_eq(rc, ncclInvalidArgument);
    const char *m = hnccl_errstr(x);
    ck_assert_msg(has(m, "ncclAllReduce (op all_reduce) failed: ncclInvalidArgument (4): %s",
                      t->GetErrorString(ncclInvalidArgument)),
                  "%s", m);
    ck_assert_msg(has(m, "heap mapped 1048576 B (1.0 MiB), live 0 B"), "%s", m);
    if (t->GetLastError)
        ck_assert_msg(has(m, "; NCCL: \""), "%s", m);
    printf("real NCCL %d without a GPU: %s\n", v, m);
    fflush(stdout);
    hnccl_free(x);
    heapc_detach(c);
    heapc_free_ctx(c);
}
END_TEST

/* The CUDA driver calls of the GPU test, loaded with dlopen (no cuda.h). */
static struct {
    int (*Init)(unsigned);
    int (*DeviceGetCount)(int *);
    int (*DeviceGet)(int *, int);
    int (*DevicePrimaryCtxRetain)(void **, int);
    int (*DevicePrimaryCtxRelease)(int);
    int (*CtxSetCurrent)(void *);
    int (*CtxSynchronize)(void);
    int (*MemcpyHtoD)(unsigned long long, const void *, size_t);
    int (*MemcpyDtoH)(void *, unsigned long long, size_t);
} cu;

/* 1 when libcuda loads, cuInit succeeds and a device exists. */
static int cuda_open(char *why, size_t len)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, len, "%s", dlerror());
        return 0;
    }
#define CU(field, name)                                                                                                \
    do {                                                                                                               \
        void *s_ = dlsym(h, name);                                                                                     \
        if (!s_) {                                                                                                     \
            snprintf(why, len, "libcuda.so.1 has no %s", name);                                                        \
            return 0;                                                                                                  \
        }                                                                                                              \
        memcpy(&cu.field, &s_, sizeof s_);                                                                             \
    } while (0)
    CU(Init, "cuInit");
    CU(DeviceGetCount, "cuDeviceGetCount");
    CU(DeviceGet, "cuDeviceGet");
    CU(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    CU(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    CU(CtxSetCurrent, "cuCtxSetCurrent");
    CU(CtxSynchronize, "cuCtxSynchronize");
    CU(MemcpyHtoD, "cuMemcpyHtoD_v2");
    CU(MemcpyDtoH, "cuMemcpyDtoH_v2");
#undef CU
    int n = 0, rc = cu.Init(0);
    if (rc == 0)
        rc = cu.DeviceGetCount(&n);
    if (rc != 0 || n <= 0) {
        snprintf(why, len, "cuInit/cuDeviceGetCount: CUresult %d, %d devices", rc, n);
        return 0;
    }
    return 1;
}

static int sync_hook(void *arg)
{
    (void)arg;
    return cu.CtxSynchronize();
}

static int gpu_cb_calls;
static hnccl_probe_info gpu_info;
static void gpu_cb(void *arg, const hnccl_probe_info *info)
{
    (void)arg;
    gpu_cb_calls++;
    gpu_info = *info;
}

/* A one-rank communicator on GPU 0 all-reduces memory of a cuda-backend heap. */
START_TEST(real_nccl_gpu)
{
    char why[512];
    const hnccl_table *t = NULL;
    if (!cuda_open(why, sizeof why) || !(t = hnccl_load(why, sizeof why))) {
        printf("skipped: no GPU (real NCCL)\n");
        fprintf(stderr, "real NCCL GPU test: %s\n", why);
        fflush(stdout);
        return;
    }
    daemon_proc d;
    ck_assert_msg(daemon_start(&d, "cuda", "backend = cuda\nchunk_size = 64M\nva_size = 1G\n", why, sizeof why) == 0,
                  "%s", why);
    int dev = 0;
    void *ctx = NULL;
    ck_assert_int_eq(cu.DeviceGet(&dev, 0), 0);
    ck_assert_int_eq(cu.DevicePrimaryCtxRetain(&ctx, dev), 0);
    ck_assert_int_eq(cu.CtxSetCurrent(ctx), 0);

    heapc *c = heapc_connect(d.sock);
    ck_assert_msg(heapc_err(c) == 0, "%s", heapc_errstr(c));
    ck_assert_str_eq(heapc_backend(c), "cuda");
    heapc_params p;
    memset(&p, 0, sizeof p);
    p.chunk_size = 64 * MiB;
    p.va_size = 1 * GiB;
    ck_assert_msg(heapc_attach(c, "gpu-nccl", 0, 1, &p) == HEAPC_OK, "%s", heapc_errstr(c));
    ck_assert_int_eq(heapc_set_device_sync(c, sync_hook, NULL), HEAPC_OK);
    enum { N = 1 << 20 };
    void *sp, *rp;
    uint64_t so, ro;
    ck_assert_msg(heapc_alloc(c, N * sizeof(float), &sp, &so) == HEAPC_OK, "%s", heapc_errstr(c));
    ck_assert_msg(heapc_alloc(c, N * sizeof(float), &rp, &ro) == HEAPC_OK, "%s", heapc_errstr(c));
    float *host = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    ck_assert_ptr_nonnull(host);
    ck_assert_ptr_nonnull(back);
    for (int i = 0; i < N; i++)
        host[i] = (float)(i % 1000) * 0.5f;
    ck_assert_int_eq(cu.MemcpyHtoD((unsigned long long)(uintptr_t)sp, host, N * sizeof(float)), 0);

    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ck_assert_int_eq(t->GetUniqueId(&id), ncclSuccess);
    ck_assert_int_eq(t->CommInitRank(&comm, 1, id, 0), ncclSuccess);

    clear_env();
    hnccl_ctx *x = hnccl_new(c);
    ck_assert_ptr_eq(hnccl_get_table(x), t);
    heapc_status_t st = page(c);
    ck_assert_uint_gt(st.device_total, 1 * GiB); /* the GPU's memory, not the host's */
    ck_assert_int_eq(hnccl_set_policy(x, "allreduce", HNCCL_PROBE), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_threshold(x, st.device_total + 1), HNCCL_OK);
    ck_assert_int_eq(hnccl_set_release_cb(x, gpu_cb, NULL), HNCCL_OK);
    int rc = hnccl_all_reduce(x, sp, rp, N, ncclFloat, ncclSum, comm, NULL);
    ck_assert_msg(rc == 0, "%s", hnccl_errstr(x));
    ck_assert_int_eq(gpu_cb_calls, 1);
    ck_assert_uint_eq(gpu_info.device_total, st.device_total);
    ck_assert_uint_eq(gpu_info.page.live, 2 * N * sizeof(float));
    ck_assert_int_eq(cu.CtxSynchronize(), 0);
    ck_assert_int_eq(cu.MemcpyDtoH(back, (unsigned long long)(uintptr_t)rp, N * sizeof(float)), 0);
    ck_assert_msg(memcmp(host, back, N * sizeof(float)) == 0, "one-rank all_reduce changed the data");
    /* in place, through the default (skipping) policy */
    ck_assert_int_eq(hnccl_set_policy(x, "allreduce", HNCCL_SKIP), HNCCL_OK);
    ck_assert_int_eq(hnccl_all_reduce(x, rp, rp, N, ncclFloat, ncclMax, comm, NULL), 0);
    ck_assert_int_eq(gpu_cb_calls, 1);

    /* the cuMemGetInfo source agrees with heapd's sample on the total */
    hnccl_probe_info info;
    ck_assert_msg(hnccl_set_probe_source(x, HNCCL_SOURCE_CUDA, 0) == HNCCL_OK, "%s", hnccl_errstr(x));
    ck_assert_msg(hnccl_probe(x, HNCCL_OP_ALL_REDUCE, &info) >= 0, "%s", hnccl_errstr(x));
    ck_assert_uint_eq(info.device_total, st.device_total);
    ck_assert_int_eq(info.cuda_queried, 1);

    /* an NCCL error on a real communicator names the GPU's memory */
    rc = hnccl_all_reduce(x, sp, rp, N, (ncclDataType_t)99, ncclSum, comm, NULL);
    ck_assert_int_eq(rc, ncclInvalidArgument);
    ck_assert_msg(has(hnccl_errstr(x), " of %" PRIu64 " B (", st.device_total), "%s", hnccl_errstr(x));
    ck_assert_msg(has(hnccl_errstr(x), "; cuMemGetInfo: free "), "%s", hnccl_errstr(x));
    printf("real NCCL on the GPU: all_reduce of %d floats ok; error message: %s\n", N, hnccl_errstr(x));
    fflush(stdout);

    ck_assert_int_eq(cu.CtxSynchronize(), 0);
    t->CommDestroy(comm);
    hnccl_free(x);
    heapc_free(c, so);
    heapc_free(c, ro);
    ck_assert_int_eq(heapc_detach(c), HEAPC_OK);
    heapc_free_ctx(c);
    free(host);
    free(back);
    cu.CtxSetCurrent(NULL);
    cu.DevicePrimaryCtxRelease(dev);
    daemon_stop(&d);
}
END_TEST

static Suite *nccl_suite(void)
{
    Suite *s = suite_create("heapc_nccl");
    TCase *tc = tcase_create("recording table");
    tcase_add_test(tc, default_policy);
    tcase_add_test(tc, aliases);
    tcase_add_test(tc, environment);
    tcase_add_test(tc, threshold_and_callback);
    tcase_add_test(tc, rate_limit);
    tcase_add_test(tc, error_message);
    tcase_add_test(tc, all_to_all_grouped);
    tcase_add_test(tc, page_values);
    suite_add_tcase(s, tc);
    tc = tcase_create("real NCCL");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, real_nccl_no_gpu);
    tcase_add_test(tc, real_nccl_gpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_main_pid = getpid();
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 30)
        tmp = "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/check_nccl.XXXXXX", tmp);
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "check_nccl: mkdtemp: %s\n", strerror(errno));
        return EXIT_FAILURE;
    }
    atexit(cleanup);
    char why[512];
    if (daemon_start(&g_heapd, "host", "backend = host\nchunk_size = 1M\nva_size = 256M\n", why, sizeof why) != 0) {
        fprintf(stderr, "check_nccl: %s\n", why);
        return EXIT_FAILURE;
    }
    return cku_run(nccl_suite());
}
