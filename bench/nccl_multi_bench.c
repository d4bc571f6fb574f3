/* nccl_multi_bench - issue 32 on several GPUs: all-reduce and all-gather on a
 * heap registered as NCCL windows (hnccl_register_heap,
 * NCCL_WIN_COLL_SYMMETRIC) against a plain buffer of the same size.
 *
 *   nccl_multi_bench --socket PATH [--ranks N] [--sizes LIST] [--iters N]
 *                    [--reps N] [--warmup N] [--grow] [--json FILE]
 *   nccl_multi_bench --host [--heapd PATH | --socket PATH] [--nccl-lib PATH] ...
 *
 * The parent forks N rank processes (2..8, default 2) before anything
 * touches CUDA; rank r makes GPU r's primary context current, attaches to
 * one heap of the heapd at --socket (cuda backend; extent_bound on, its
 * first extent large enough for every buffer; --grow: one chunk, so that
 * the buffers come from growths), creates the communicator
 * (rank 0's ncclUniqueId goes to the others through a pipe each), registers
 * the heap (hnccl_register_heap), allocates a send and a receive buffer of
 * the largest size on the heap and the same two with cuMemAlloc, and then,
 * per size (default 1K,4K,...,64M,128M: powers of 4, and 128 MiB) and op:
 *   - all_reduce (float sum, size bytes) and all_gather (size bytes
 *     received, size / N from each rank), through hnccl_all_reduce /
 *     hnccl_all_gather, on the heap buffers and then on the plain ones;
 *   - --warmup calls, then --reps runs of --iters calls each, the device
 *     synchronised after each run; the median run, us per call;
 *   - a small verification of the last result: the sends hold rank + 1, so
 *     all_reduce gives N(N+1)/2 and all_gather's slot r holds r + 1
 *     (elements sampled at the start, middle and end).
 * A recording layer over the NCCL table checks the control flow on every
 * rank: windows are NCCL_WIN_COLL_SYMMETRIC and cover each heap buffer, every
 * heap call has both buffers inside a window and no plain call does, the
 * call counts are the expected ones, and after hnccl_deregister_heap no
 * window is left.
 *
 * --host: the dry run for CPU machines: a host-backend heapd (its own,
 * started from --heapd, default dirname(argv[0])/../heapd, unless --socket)
 * and the recording NCCL stand-in (--nccl-lib, default
 * dirname(argv[0])/../tests/nccl_stub/libnccl.so.2), whose calls move no
 * data: the control flow above is checked (and the stand-in's own counts),
 * the results are not verified and the figures mean nothing (they say so).
 *
 * Prints per-rank lines, a table (op, size, heap us, plain us, heap/plain:
 * the slowest rank's median), "nccl_multi_bench: ok" or FAIL lines; --json
 * FILE writes JSON. Exit 0, 1 on any failure, 2 usage. */
#include "heapc.h"
#include "heapc_nccl.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/mman.h>

#define NAME "nccl_multi_bench"
#define BENCH_ONE_HEAPD
#include "bench_util.h"
#include "nccl_multi.h"

#define KiB       ((uint64_t)1 << 10)
#define MiB       ((uint64_t)1 << 20)
#define MAX_RANKS 8
#define MAX_SIZES 16
#define MAX_REPS  64

enum { K_HEAP, K_PLAIN, NKINDS };
static const char *const op_names[NOPS] = {"all_reduce", "all_gather"};
static const char *const kind_names[NKINDS] = {"heap", "plain"};

typedef struct opts {
    int ranks, host, grow, iters, reps, warmup, nsizes;
    uint64_t sizes[MAX_SIZES];
    const char *json, *socket;
    char heapd[PATH_MAX], nccl_lib[PATH_MAX];
} opts;

/* What a rank reports, in memory shared with the parent. */
typedef struct rank_out {
    int done;                              /* 1: the rank got to the end */
    double us[MAX_SIZES][NOPS][NKINDS];    /* median us per call */
    int verified[MAX_SIZES][NOPS][NKINDS]; /* 1 ok, 0 not checked (host), -1 wrong */
    uint64_t in_win[NOPS], outside[NOPS];  /* calls with both buffers in a window, or not */
    uint64_t heap_calls[NOPS], plain_calls[NOPS];
    uint64_t windows, registered_bytes, registrations, deregistrations, windows_after;
    int bufs_in_win, nonsymm;
    long stub_ar, stub_ag, stub_reg, stub_bytes_after; /* host: the stand-in's own counts */
} rank_out;

static pid_t g_pids[MAX_RANKS];

static void cleanup(void)
{
    for (int r = 0; r < MAX_RANKS; r++)
        if (g_pids[r] > 0) {
            reap(g_pids[r], SIGKILL, 1000);
            g_pids[r] = 0;
        }
    remove_heapd();
}

/* ---- one rank ---------------------------------------------------------------------- */

typedef struct rank_ctx {
    const opts *o;
    rank_out *out;
    heapc *c;
    hnccl_ctx *x;
    ncclComm_t comm;
    void *stub;
    char *hbuf[2], *pbuf[2]; /* send, recv: heap and plain */
    uint64_t hoff[2];
} rank_ctx;

static uint64_t max_size(const opts *o)
{
    uint64_t m = 0;
    for (int i = 0; i < o->nsizes; i++)
        m = o->sizes[i] > m ? o->sizes[i] : m;
    return m;
}

/* Attach, the communicator (the id through idfd), the registration. */
static void rank_setup(rank_ctx *k, const char *sock, const char *heap, int idfd, const int *idw)
{
    const opts *o = k->o;
    if (!o->host)
        cuda_open(o->ranks);
    hnccl_table base;
    char why[512] = "";
    if (o->host) {
        k->stub = stub_open(o->nccl_lib, &base);
        g_base = &base;
    } else if (!(g_base = hnccl_load(why, sizeof why))) {
        die("rank %d: NCCL: %s", g_rank, why);
    }
    static hnccl_table keep;
    keep = *g_base;
    g_base = &keep;
    g_tab = keep;
    g_tab.AllReduce = rec_all_reduce;
    g_tab.AllGather = rec_all_gather;
    g_tab.CommWindowRegister = rec_register;
    g_tab.CommWindowDeregister = rec_deregister;
    if (!keep.CommWindowRegister || !keep.CommWindowDeregister)
        die("rank %d: this NCCL has no ncclCommWindowRegister: windows need NCCL 2.27 or newer", g_rank);
    k->c = heapc_connect(sock);
    if (!k->c || heapc_err(k->c))
        die("rank %d: heapc_connect(%s): %s", g_rank, sock, k->c ? heapc_errstr(k->c) : "out of memory");
    heapc_params p;
    memset(&p, 0, sizeof p);
    p.chunk_size = o->host ? 16 * MiB : 64 * MiB;
    uint64_t need = 2 * max_size(o) + 2 * MiB;
    p.initial_size = (need + p.chunk_size - 1) / p.chunk_size * p.chunk_size;
    p.va_size = 2 * p.initial_size + p.chunk_size;
    if (o->grow) /* one chunk: the buffers come from growths, registered as they are mapped */
        p.initial_size = p.chunk_size;
    p.extent_bound = 1;
    if (heapc_attach(k->c, heap, (uint32_t)g_rank, (uint32_t)o->ranks, &p) != HEAPC_OK)
        die("rank %d: heapc_attach(%s): %s", g_rank, heap, heapc_errstr(k->c));
    ncclUniqueId id;
    if (g_rank == 0) {
        ncclResult_t ur = g_base->GetUniqueId(&id);
        if (ur != ncclSuccess)
            die("rank 0: ncclGetUniqueId: %s (%d); NCCL_DEBUG=INFO tells more", g_base->GetErrorString(ur), (int)ur);
        for (int r = 1; r < o->ranks; r++)
            if (write(idw[r], &id, sizeof id) != (ssize_t)sizeof id)
                die("rank 0: passing the NCCL id to rank %d: %s", r, strerror(errno));
    } else if (read(idfd, &id, sizeof id) != (ssize_t)sizeof id) {
        die("rank %d: no NCCL id from rank 0 (it failed first)", g_rank);
    }
    ncclResult_t nr = g_base->CommInitRank(&k->comm, o->ranks, id, g_rank);
    if (nr != ncclSuccess)
        die("rank %d: ncclCommInitRank(%d ranks): %s", g_rank, o->ranks, g_base->GetErrorString(nr));
    k->x = hnccl_new(k->c);
    if (!k->x)
        die("rank %d: hnccl_new: out of memory", g_rank);
    if (hnccl_set_table(k->x, &g_tab) != HNCCL_OK || hnccl_register_heap(k->x, k->comm, k->c) != HNCCL_OK)
        die("rank %d: hnccl_register_heap: %s", g_rank, hnccl_errstr(k->x));
}

static void rank_buffers(rank_ctx *k)
{
    uint64_t m = max_size(k->o);
    for (int b = 0; b < 2; b++) {
        void *ptr;
        if (heapc_alloc(k->c, m, &ptr, &k->hoff[b]) != HEAPC_OK)
            die("rank %d: heapc_alloc(%" PRIu64 "): %s", g_rank, m, heapc_errstr(k->c));
        k->hbuf[b] = ptr;
        k->pbuf[b] = plain_alloc(m);
    }
    k->out->bufs_in_win =
        in_window(k->hbuf[0], m) && in_window(k->hbuf[1], m) && !in_window(k->pbuf[0], m) && !in_window(k->pbuf[1], m);
    if (!k->out->bufs_in_win)
        fprintf(stderr, NAME ": rank %d: FAIL: the heap buffers are not both inside one window each (%d windows)\n",
                g_rank, g_nwin);
    fill(k->hbuf[0], m, (float)(g_rank + 1));
    fill(k->pbuf[0], m, (float)(g_rank + 1));
    sync_dev();
}

static void call(rank_ctx *k, int op, const char *s, char *r, uint64_t bytes)
{
    int rc = op == OP_AR ? hnccl_all_reduce(k->x, s, r, bytes / 4, ncclFloat, ncclSum, k->comm, NULL)
                         : hnccl_all_gather(k->x, s, r, bytes / 4 / (uint64_t)k->o->ranks, ncclFloat, k->comm, NULL);
    if (rc != 0)
        die("rank %d: hnccl_%s(%" PRIu64 " bytes): %s", g_rank, op_names[op], bytes, hnccl_errstr(k->x));
}

/* 1 when the sampled elements of the result are right, -1 when not. */
static int verify(rank_ctx *k, int op, const char *r, uint64_t bytes)
{
    int n = k->o->ranks;
    if (op == OP_AR) {
        size_t cnt = bytes / 4, idx[3] = {0, cnt / 2, cnt - 1};
        for (int i = 0; i < 3; i++)
            if (peek(r, idx[i]) != (float)(n * (n + 1) / 2))
                return -1;
        return 1;
    }
    size_t per = bytes / 4 / (size_t)n;
    for (int q = 0; q < n; q++)
        if (peek(r, q * per) != (float)(q + 1) || peek(r, q * per + per - 1) != (float)(q + 1))
            return -1;
    return 1;
}

static double time_op(rank_ctx *k, int op, int kind, uint64_t bytes)
{
    const opts *o = k->o;
    char *s = kind == K_HEAP ? k->hbuf[0] : k->pbuf[0], *r = kind == K_HEAP ? k->hbuf[1] : k->pbuf[1];
    fill(r, bytes, 0);
    for (int i = 0; i < o->warmup; i++)
        call(k, op, s, r, bytes);
    sync_dev();
    double t[MAX_REPS];
    for (int j = 0; j < o->reps; j++) {
        double t0 = now_us();
        for (int i = 0; i < o->iters; i++)
            call(k, op, s, r, bytes);
        sync_dev();
        t[j] = (now_us() - t0) / o->iters;
    }
    k->out->heap_calls[op] += kind == K_HEAP ? (uint64_t)(o->warmup + o->reps * o->iters) : 0;
    k->out->plain_calls[op] += kind == K_PLAIN ? (uint64_t)(o->warmup + o->reps * o->iters) : 0;
    qsort(t, (size_t)o->reps, sizeof t[0], cmp_double);
    return t[o->reps / 2];
}

static void rank_finish(rank_ctx *k)
{
    rank_out *out = k->out;
    hnccl_window_stats ws;
    hnccl_get_window_stats(k->x, &ws);
    out->windows = ws.windows;
    out->registered_bytes = ws.registered_bytes;
    if (hnccl_deregister_heap(k->x) != HNCCL_OK)
        die("rank %d: hnccl_deregister_heap: %s", g_rank, hnccl_errstr(k->x));
    hnccl_get_window_stats(k->x, &ws);
    out->windows_after = ws.windows + (uint64_t)g_nwin;
    out->registrations = g_reg;
    out->deregistrations = g_dereg;
    out->nonsymm = g_nonsymm;
    for (int op = 0; op < NOPS; op++)
        out->in_win[op] = g_in[op], out->outside[op] = g_out[op];
    if (k->stub) {
        unsigned long *calls = dlsym(k->stub, "stub_calls"), *reg = dlsym(k->stub, "stub_win_reg");
        size_t *bytes = dlsym(k->stub, "stub_win_bytes");
        if (!calls || !reg || !bytes)
            die("rank %d: %s lacks stub_calls/stub_win_reg/stub_win_bytes", g_rank, k->o->nccl_lib);
        out->stub_ar = (long)calls[0], out->stub_ag = (long)calls[1]; /* S_ALLREDUCE, S_ALLGATHER */
        out->stub_reg = (long)*reg, out->stub_bytes_after = (long)*bytes;
    }
    hnccl_free(k->x);
    for (int b = 0; b < 2; b++) {
        heapc_free(k->c, k->hoff[b]);
        plain_free(k->pbuf[b]);
    }
    if (heapc_detach(k->c) != HEAPC_OK)
        die("rank %d: heapc_detach: %s", g_rank, heapc_errstr(k->c));
    heapc_free_ctx(k->c);
    g_base->CommDestroy(k->comm);
    out->done = 1;
}

static void rank_main(const opts *o, rank_out *out, const char *sock, const char *heap, int idfd, const int *idw)
{
    rank_ctx k = {.o = o, .out = out};
    rank_setup(&k, sock, heap, idfd, idw);
    rank_buffers(&k);
    for (int i = 0; i < o->nsizes; i++)
        for (int op = 0; op < NOPS; op++)
            for (int kind = 0; kind < NKINDS; kind++) {
                out->us[i][op][kind] = time_op(&k, op, kind, o->sizes[i]);
                out->verified[i][op][kind] =
                    o->host ? 0 : verify(&k, op, kind == K_HEAP ? k.hbuf[1] : k.pbuf[1], o->sizes[i]);
            }
    rank_finish(&k);
}

/* ---- the parent -------------------------------------------------------------------- */

/* Checks one rank's report; prints its line; returns the failures. */
static int check_rank(const opts *o, int r, const rank_out *ro)
{
    uint64_t want = (uint64_t)o->nsizes * (uint64_t)(o->warmup + o->reps * o->iters);
    int bad = 0;
#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            printf(NAME ": rank %d: FAIL: ", r);                                                                       \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
            bad++;                                                                                                     \
        }                                                                                                              \
    } while (0)
    EXPECT(ro->done, "did not finish (see its error above)");
    if (!ro->done)
        return bad;
    EXPECT(ro->registrations >= 1 && ro->windows >= 1, "%" PRIu64 " registrations, %" PRIu64 " windows",
           ro->registrations, ro->windows);
    EXPECT(ro->nonsymm == 0, "%d windows without NCCL_WIN_COLL_SYMMETRIC", ro->nonsymm);
    EXPECT(ro->bufs_in_win, "heap buffers not inside windows, or plain buffers inside one");
    for (int op = 0; op < NOPS; op++) {
        EXPECT(ro->heap_calls[op] == want && ro->in_win[op] == want,
               "%s: %" PRIu64 " heap calls, %" PRIu64 " in windows, want %" PRIu64, op_names[op], ro->heap_calls[op],
               ro->in_win[op], want);
        EXPECT(ro->plain_calls[op] == want && ro->outside[op] == want,
               "%s: %" PRIu64 " plain calls, %" PRIu64 " outside windows, want %" PRIu64, op_names[op],
               ro->plain_calls[op], ro->outside[op], want);
    }
    EXPECT(ro->deregistrations == ro->registrations && ro->windows_after == 0,
           "%" PRIu64 " registrations, %" PRIu64 " deregistrations, %" PRIu64 " windows left", ro->registrations,
           ro->deregistrations, ro->windows_after);
    if (o->host)
        EXPECT(ro->stub_ar == (long)(2 * want) && ro->stub_ag == (long)(2 * want) &&
                   ro->stub_reg == (long)ro->registrations && ro->stub_bytes_after == 0,
               "the stand-in recorded %ld all_reduce, %ld all_gather (want %" PRIu64 " each), %ld registrations, "
               "%ld bytes still in windows",
               ro->stub_ar, ro->stub_ag, 2 * want, ro->stub_reg, ro->stub_bytes_after);
    for (int i = 0; i < o->nsizes; i++)
        for (int op = 0; op < NOPS; op++)
            for (int kd = 0; kd < NKINDS; kd++)
                EXPECT(ro->verified[i][op][kd] >= 0, "%s on %s buffers of %" PRIu64 " bytes: wrong result",
                       op_names[op], kind_names[kd], o->sizes[i]);
#undef EXPECT
    printf(NAME ": rank %d: attached, %" PRIu64 " window(s) (%" PRIu64
                " bytes, NCCL_WIN_COLL_SYMMETRIC) cover both heap "
                "buffers; %" PRIu64 "+%" PRIu64 " heap calls in windows, %" PRIu64 "+%" PRIu64 " plain calls outside; "
                "%" PRIu64 " deregistered, %" PRIu64 " left: %s\n",
           r, ro->windows, ro->registered_bytes, ro->in_win[OP_AR], ro->in_win[OP_AG], ro->outside[OP_AR],
           ro->outside[OP_AG], ro->deregistrations, ro->windows_after, bad ? "FAIL" : "ok");
    return bad;
}

/* The slowest rank's median for (size, op, kind). */
static double slowest(const opts *o, const rank_out *ro, int i, int op, int kind)
{
    double m = 0;
    for (int r = 0; r < o->ranks; r++)
        m = ro[r].us[i][op][kind] > m ? ro[r].us[i][op][kind] : m;
    return m;
}

static const char *verdict(const opts *o, const rank_out *ro, int i, int op)
{
    if (o->host)
        return "not checked (host)";
    for (int r = 0; r < o->ranks; r++)
        for (int kd = 0; kd < NKINDS; kd++)
            if (ro[r].verified[i][op][kd] != 1)
                return "WRONG";
    return "ok";
}

static void report(const opts *o, const rank_out *ro)
{
    printf("\n" NAME ": %d ranks, median of %d runs of %d calls (after %d), slowest rank, us per call%s\n", o->ranks,
           o->reps, o->iters, o->warmup,
           o->host ? "; HOST DRY RUN: the NCCL stand-in moves no data, these figures mean nothing" : "");
    printf("%-10s %10s %12s %12s %11s  %s\n", "op", "bytes", "heap us", "plain us", "heap/plain", "verified");
    for (int i = 0; i < o->nsizes; i++)
        for (int op = 0; op < NOPS; op++) {
            double h = slowest(o, ro, i, op, K_HEAP), p = slowest(o, ro, i, op, K_PLAIN);
            printf("%-10s %10" PRIu64 " %12.2f %12.2f %11.3f  %s\n", op_names[op], o->sizes[i], h, p, p > 0 ? h / p : 0,
                   verdict(o, ro, i, op));
        }
    if (!o->json)
        return;
    FILE *f = fopen(o->json, "w");
    if (!f)
        die("cannot write %s: %s", o->json, strerror(errno));
    fprintf(f,
            "{\n  \"bench\": \"" NAME "\",\n  \"host_dry_run\": %s,\n  \"meaningful\": %s,\n  \"ranks\": %d,\n"
            "  \"iters\": %d,\n  \"reps\": %d,\n  \"warmup\": %d,\n  \"results\": [\n",
            o->host ? "true" : "false", o->host ? "false" : "true", o->ranks, o->iters, o->reps, o->warmup);
    for (int i = 0; i < o->nsizes; i++)
        for (int op = 0; op < NOPS; op++) {
            double h = slowest(o, ro, i, op, K_HEAP), p = slowest(o, ro, i, op, K_PLAIN);
            fprintf(f,
                    "    {\"op\": \"%s\", \"bytes\": %" PRIu64 ", \"heap_us\": %.3f, \"plain_us\": %.3f, "
                    "\"heap_over_plain\": %.4f, \"verified\": \"%s\"}%s\n",
                    op_names[op], o->sizes[i], h, p, p > 0 ? h / p : 0, verdict(o, ro, i, op),
                    i == o->nsizes - 1 && op == NOPS - 1 ? "" : ",");
        }
    fprintf(f, "  ],\n  \"windows_per_rank\": [");
    for (int r = 0; r < o->ranks; r++)
        fprintf(f, "%s%" PRIu64, r ? ", " : "", ro[r].windows);
    fprintf(f, "]\n}\n");
    if (fclose(f) != 0)
        die("cannot write %s", o->json);
}

/* Forks the ranks, waits for them; returns the failures. */
static int run_ranks(const opts *o, rank_out *ro, const char *sock)
{
    char heap[64];
    snprintf(heap, sizeof heap, "nccl-multi-%d", (int)getpid());
    int idp[MAX_RANKS][2], idw[MAX_RANKS];
    for (int r = 0; r < o->ranks; r++) {
        if (pipe(idp[r]))
            die("pipe: %s", strerror(errno));
        idw[r] = idp[r][1];
    }
    for (int r = 0; r < o->ranks; r++) {
        g_pids[r] = fork_child();
        if (g_pids[r] == 0) {
            g_rank = r;
            for (int q = 0; q < o->ranks; q++)
                if (r != 0)
                    close(idp[q][1]); /* rank 0 failing early: EOF, not a hang */
            rank_main(o, &ro[r], sock, heap, idp[r][0], idw);
            _exit(0);
        }
    }
    for (int r = 0; r < o->ranks; r++)
        close(idp[r][0]), close(idp[r][1]);
    int bad = 0;
    for (int left = o->ranks; left > 0; left--) {
        int st;
        pid_t pid = wait(&st);
        if (pid < 0)
            die("wait: %s", strerror(errno));
        int mine = 0;
        for (int r = 0; r < o->ranks; r++)
            if (g_pids[r] == pid)
                g_pids[r] = 0, mine = 1;
        if (!mine) { /* our heapd (--host): the ranks fail without it */
            if (pid == g_heapd)
                g_heapd = -1;
            left++;
            continue;
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            bad++;
            for (int r = 0; r < o->ranks; r++) /* the others would wait for it in a collective */
                if (g_pids[r] > 0)
                    kill(g_pids[r], SIGKILL);
        }
    }
    return bad;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " NAME " --socket PATH [--ranks N] [--sizes LIST] [--iters N] [--reps N] [--warmup N]\n"
               "                        [--grow] [--json FILE]\n"
               "       " NAME " --host [--heapd PATH | --socket PATH] [--nccl-lib PATH] [same options]\n"
               "  --socket PATH   a running heapd (cuda backend on a GPU machine)\n"
               "  --ranks N       rank processes, one per GPU, 2..8 (default 2)\n"
               "  --sizes LIST    bytes, comma-separated, K/M suffixes (default 1K,4K,...,64M,128M)\n"
               "  --iters N, --reps N, --warmup N   calls per run, runs (median), calls before (20, 5, 5)\n"
               "  --host          dry run: host-backend heapd, the recording NCCL stand-in\n"
               "  --grow          a heap of one chunk at first: the buffers come from growths, whose\n"
               "                  windows libheapc_nccl registers inside them (default: the first extent\n"
               "                  holds them)\n");
}

static int parse_sizes(opts *o, const char *s)
{
    o->nsizes = 0;
    while (*s) {
        char *end;
        uint64_t v = strtoull(s, &end, 10);
        if (*end == 'K' || *end == 'k')
            v *= KiB, end++;
        else if (*end == 'M' || *end == 'm')
            v *= MiB, end++;
        if (end == s || (*end && *end != ',') || v < 64 || v % 4 || o->nsizes == MAX_SIZES)
            return -1;
        o->sizes[o->nsizes++] = v;
        s = *end ? end + 1 : end;
    }
    return o->nsizes ? 0 : -1;
}

static int num_arg(const char *name, const char *v, int lo, int hi)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < lo || n > hi) {
        fprintf(stderr, NAME ": %s takes %d..%d, not '%s'\n", name, lo, hi, v);
        exit(2);
    }
    return (int)n;
}

static void parse(opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->ranks = 2, o->iters = -1, o->reps = -1, o->warmup = -1;
    parse_sizes(o, "1K,4K,16K,64K,256K,1M,4M,16M,64M,128M");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--host") || !strcmp(a, "--grow")) {
            *(a[2] == 'h' ? &o->host : &o->grow) = 1;
            continue;
        }
        if (!strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, NAME ": unknown argument '%s', or it lacks its value; run " NAME " --help\n", a);
            exit(2);
        }
        i++;
        if (!strcmp(a, "--socket"))
            o->socket = v;
        else if (!strcmp(a, "--json"))
            o->json = v;
        else if (!strcmp(a, "--heapd"))
            snprintf(o->heapd, sizeof o->heapd, "%s", v);
        else if (!strcmp(a, "--nccl-lib"))
            snprintf(o->nccl_lib, sizeof o->nccl_lib, "%s", v);
        else if (!strcmp(a, "--ranks"))
            o->ranks = num_arg(a, v, 2, MAX_RANKS);
        else if (!strcmp(a, "--iters"))
            o->iters = num_arg(a, v, 1, 100000);
        else if (!strcmp(a, "--reps"))
            o->reps = num_arg(a, v, 1, MAX_REPS);
        else if (!strcmp(a, "--warmup"))
            o->warmup = num_arg(a, v, 0, 100000);
        else if (!strcmp(a, "--sizes")) {
            if (parse_sizes(o, v)) {
                fprintf(stderr,
                        NAME ": --sizes takes up to %d sizes, at least 64 bytes, multiples of 4 ('4K,1M'), not '%s'\n",
                        MAX_SIZES, v);
                exit(2);
            }
        } else {
            fprintf(stderr, NAME ": unknown argument '%s'; run " NAME " --help\n", a);
            exit(2);
        }
    }
    o->iters = o->iters > 0 ? o->iters : o->host ? 2 : 20;
    o->reps = o->reps > 0 ? o->reps : o->host ? 3 : 5;
    o->warmup = o->warmup >= 0 ? o->warmup : o->host ? 1 : 5;
    if (!o->host && !o->socket) {
        fprintf(stderr, NAME ": pass --socket PATH of a cuda-backend heapd (or --host for the dry run)\n");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    opts o;
    parse(&o, argc, argv);
    g_host = o.host;
    g_nranks = o.ranks;
    if (!o.heapd[0])
        self_dir_file(argv[0], "../heapd", o.heapd, sizeof o.heapd);
    if (!o.nccl_lib[0])
        self_dir_file(argv[0], "../tests/nccl_stub/libnccl.so.2", o.nccl_lib, sizeof o.nccl_lib);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGALRM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    alarm(600);
    unsetenv("HEAPC_NCCL_PROBE");
    unsetenv("HEAPC_NCCL_SKIP");
    rank_out *ro = mmap(NULL, sizeof *ro * MAX_RANKS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ro == MAP_FAILED)
        die("mmap: %s", strerror(errno));
    memset(ro, 0, sizeof *ro * MAX_RANKS);
    const char *sock = o.socket;
    if (!sock) {
        start_heapd(o.heapd);
        sock = g_sock;
    }
    printf("bench " NAME ": %d ranks, heapd %s, %s; %d sizes, %d runs of %d calls after %d\n", o.ranks, sock,
           o.host ? "HOST DRY RUN (host backend, the recording NCCL stand-in: the figures mean nothing)"
                  : "one GPU per rank, NCCL",
           o.nsizes, o.reps, o.iters, o.warmup);
    int bad = run_ranks(&o, ro, sock);
    for (int r = 0; r < o.ranks; r++)
        bad += check_rank(&o, r, &ro[r]);
    cleanup();
    if (!bad || ro[0].done)
        report(&o, ro);
    printf(NAME ": %s\n", bad ? "FAIL" : "ok");
    return bad ? 1 : 0;
}
