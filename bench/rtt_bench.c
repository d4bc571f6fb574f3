/* rtt_bench - the alloc round trip through heapd, on the request ring
 * (issue 16) and on the socket, and the allocation decided locally (issue
 * 28), next to a raw Unix-socket ping-pong of the same message sizes; heapd's
 * CPU use while idle; heapd's memory per live block.
 *
 *   rtt_bench [--json FILE] [--quick] [--heapd PATH] [--iters N] [--mem-blocks N]
 *
 * RTT_RING_SPIN_US=N: heapd.conf gets ring_spin_us = N and every client
 * HEAPC_RING_SPIN_US=N (both poll instead of sleeping; by default neither
 * does on a machine with 2 or fewer cores).
 *
 * Starts its own heapd (PATH, default dirname(argv[0])/../heapd) on a
 * temporary configuration (socket in a mkdtemp directory, backend = host,
 * log_level = warn) and stops it at the end, also on error.
 *
 * 1. Round trip: for 1, 2, 4 and 8 concurrent clients, each client a separate
 *    process with its OWN 1-rank heap (so clients never wait for each other
 *    in lockstep: only heapd's one thread is shared), does warm-up allocations
 *    then N timed heapc_alloc(4 KiB) calls; only heapc_alloc is timed. Each
 *    block is freed right after its timed alloc (heapc_free, untimed: the
 *    library sends a Free batch every 1024 frees). The heap (va 4G, initial
 *    1G, chunk 1G, coalesce) never needs a collect or a growth during the run:
 *    the client checks its counters afterwards and fails otherwise.
 *    Three heapd columns, each client setting its environment in the forked
 *    process before heapc_attach: "ring" (HEAPC_TRANSPORT=ring) and "socket"
 *    (HEAPC_TRANSPORT=socket), both with HEAPC_DECIDE=daemon (heapd decides
 *    every allocation); "local" (HEAPC_TRANSPORT=ring, HEAPC_DECIDE=local,
 *    HEAPC_DECIDE_EVERY=64: the heap is created with local_every 64 and the
 *    client's replica decides every allocation but each 64th, which is a
 *    round trip on the ring). The local client fails unless its counters say
 *    local_allocs > 0 and replica_lost == 0, and reports the share of its
 *    timed allocations decided locally (63/64 when all goes well).
 *    The ping-pong: one forked echo server process (one thread, like heapd)
 *    accepting the same number of client processes; poll() then a blocking
 *    read of one request and a blocking write of one reply. The timed calls
 *    are split over 4 rounds (2 with --quick) that alternate ring, socket,
 *    local and ping-pong, so all see the same machine load. Besides p50/p99
 *    each column reports (in the "bench" lines and the JSON) the mean, the
 *    calls per second of all clients together and the clients' concurrency
 *    (the sum of their loop times over the wall time: 1 means they ran one
 *    after another), and its p50 over the ping-pong's (issue 28's CPU-machine
 *    target for local: <= 0.1x).
 *    The request has the size of an encoded Alloc frame plus the 8-byte
 *    header, the reply that of an encoded AllocReply frame plus the header
 *    (heapd__frame__get_packed_size of representative frames). p50/p99 are
 *    over the samples of all clients.
 * 2. Memory: 10^5 live 4 KiB blocks in one 1-rank heap on a fresh heapd;
 *    heapd's VmRSS (and RssAnon) from /proc/PID/status before and after.
 *
 * Prints "bench rtt_bench: ..." lines and a table; --json FILE writes JSON.
 * Exit 0, or 1 on any error (printed).
 */
#include "heapc.h"
#include "heapd.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NAME "rtt_bench"
#define BENCH_ONE_HEAPD
#include "bench_util.h"
#define KiB         ((uint64_t)1 << 10)
#define GiB         ((uint64_t)1 << 30)
#define ALLOC_SIZE  (4 * KiB)
#define HDR         8u
#define MAX_CLIENTS 8
#define LOCAL_EVERY "64"              /* HEAPC_DECIDE_EVERY of the local column */
static uint32_t MEM_BLOCKS = 100000u; /* --mem-blocks */

/* ---- process bookkeeping and cleanup ------------------------------------- */

static pid_t g_echo = -1;
static char g_echo_sock[108]; /* in g_dir, next to heapd's socket */
static int g_echo_status;     /* when wait_clients reaped the echo server */
static pid_t g_kids[MAX_CLIENTS];
static int g_nkids;

static void cleanup(void)
{
    if (g_is_child)
        return;
    for (int i = 0; i < g_nkids; i++)
        reap(g_kids[i], SIGKILL, 1000);
    g_nkids = 0;
    reap(g_echo, SIGKILL, 1000);
    g_echo = -1;
    if (g_echo_sock[0])
        unlink(g_echo_sock);
    g_echo_sock[0] = '\0';
    remove_heapd();
}

/* ---- shared state of one run --------------------------------------------- */

/* One method (heapd or ping-pong) at one client count, over every round.
 * Client idx writes round r's samples at lat[idx * stride + base]. */
typedef struct shared {
    pthread_barrier_t start;
    size_t len; /* of this mapping */
    int clients;
    uint64_t stride;                                 /* samples per client over every round */
    uint64_t base;                                   /* this round's first sample */
    double busy, wall;                               /* sums over the rounds (parent only) */
    double t_begin[MAX_CLIENTS], t_end[MAX_CLIENTS]; /* this round's timed loops */
    uint64_t local[MAX_CLIENTS];                     /* timed allocations decided locally, every round */
    double lat[];                                    /* clients * stride, microseconds */
} shared;

static shared *shared_new(int clients, uint64_t iters)
{
    size_t len = sizeof(shared) + (size_t)clients * iters * sizeof(double);
    shared *s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        die("mmap of %zu shared bytes: %s", len, strerror(errno));
    s->len = len;
    s->clients = clients;
    s->stride = iters;
    return s;
}

static void round_begin(shared *s, uint64_t base)
{
    pthread_barrierattr_t a;
    pthread_barrierattr_init(&a);
    pthread_barrierattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (pthread_barrier_init(&s->start, &a, (unsigned)s->clients) != 0)
        die("pthread_barrier_init failed");
    pthread_barrierattr_destroy(&a);
    s->base = base;
}

static void round_end(shared *s)
{
    pthread_barrier_destroy(&s->start);
    double b = s->t_begin[0], e = s->t_end[0];
    for (int i = 0; i < s->clients; i++) {
        b = s->t_begin[i] < b ? s->t_begin[i] : b;
        e = s->t_end[i] > e ? s->t_end[i] : e;
        s->busy += s->t_end[i] - s->t_begin[i];
    }
    s->wall += e - b;
}

/* Waits for every client; the first failure kills the others and dies. */
static void wait_clients(const char *what)
{
    int left = g_nkids;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0)
            die("waitpid: %s", strerror(errno));
        int idx = -1;
        for (int i = 0; i < g_nkids; i++)
            if (g_kids[i] == p)
                idx = i;
        if (p == g_heapd) {
            g_heapd = -1;
            die("%s: heapd died (%s %d)", what, WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        }
        if (p == g_echo) { /* it ends when its last client closes */
            g_echo_status = st;
            g_echo = -1;
        }
        if (idx < 0)
            continue; /* heapd: its clients fail if it dies */
        g_kids[idx] = -1;
        left--;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die("%s: client %d failed (%s %d)", what, idx, WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    g_nkids = 0;
}

typedef struct pct {
    double p50, p99, mean;
    double wall_us;     /* per round: first client's start to last client's end, summed */
    double concurrency; /* sum of the clients' loop times / wall_us: 1 = serial */
    double ops_per_s;   /* every client's timed calls / wall_us */
} pct;

static pct summarize(shared *s)
{
    double *v = s->lat;
    size_t n = (size_t)s->clients * s->stride;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    pct r = {v[(size_t)(0.50 * (double)(n - 1))], v[(size_t)(0.99 * (double)(n - 1))], sum / (double)n, 0, 0, 0};
    r.wall_us = s->wall;
    r.concurrency = s->busy / r.wall_us;
    r.ops_per_s = (double)n / r.wall_us * 1e6;
    return r;
}

/* ---- heapd round trip ---------------------------------------------------- */

static heapc_params big_params(void)
{
    heapc_params p;
    memset(&p, 0, sizeof p);
    p.chunk_size = 1 * GiB;
    p.initial_size = 1 * GiB;
    p.va_size = 4 * GiB;
    p.policy = HEAPC_POLICY_COALESCE;
    return p;
}

static heapc *attach_1rank(const char *heap)
{
    heapc *c = heapc_connect(g_sock);
    if (!c)
        die("heapc_connect: out of memory");
    if (heapc_err(c))
        die("heapc_connect(%s): %s", g_sock, heapc_errstr(c));
    heapc_params p = big_params();
    if (heapc_attach(c, heap, 0, 1, &p) != HEAPC_OK)
        die("heapc_attach(%s): %s", heap, heapc_errstr(c));
    return c;
}

/* The columns: the three heapd ways, then the ping-pong. */
enum { RING, SOCKET, LOCAL, PP, NCOL };
static const char *const COL_NAME[NCOL] = {"ring", "socket", "local", "pingpong"};

/* The environment of column `col`, set in the client before it attaches. */
static void client_env(int col)
{
    setenv("HEAPC_TRANSPORT", col == SOCKET ? "socket" : "ring", 1);
    setenv("HEAPC_DECIDE", col == LOCAL ? "local" : "daemon", 1); /* issue 28 */
    setenv("HEAPC_DECIDE_EVERY", LOCAL_EVERY, 1);
    unsetenv("HEAPD_DECIDE"); /* it would win over HEAPC_DECIDE */
    unsetenv("HEAPD_DECIDE_EVERY");
}

static void heapd_client(shared *s, int idx, int round, uint64_t warm, uint64_t iters, int col)
{
    char heap[64];
    snprintf(heap, sizeof heap, "rtt-%d-%d-%d-%s", s->clients, round, idx, COL_NAME[col]);
    client_env(col);
    heapc *c = attach_1rank(heap);
    heapc_counters c0, cw, c1;
    heapc_get_counters(c, &c0);
    uint64_t off;
    for (uint64_t i = 0; i < warm; i++) {
        if (heapc_alloc(c, ALLOC_SIZE, NULL, &off) != HEAPC_OK)
            die("client %d: heapc_alloc: %s", idx, heapc_errstr(c));
        if (heapc_free(c, off) != HEAPC_OK)
            die("client %d: heapc_free: %s", idx, heapc_errstr(c));
    }
    heapc_get_counters(c, &cw);
    pthread_barrier_wait(&s->start);
    double *lat = s->lat + (size_t)idx * s->stride + s->base;
    s->t_begin[idx] = now_us();
    for (uint64_t i = 0; i < iters; i++) {
        double t0 = now_us();
        int rc = heapc_alloc(c, ALLOC_SIZE, NULL, &off);
        double t1 = now_us();
        if (rc != HEAPC_OK)
            die("client %d: heapc_alloc: %s", idx, heapc_errstr(c));
        lat[i] = t1 - t0;
        if (heapc_free(c, off) != HEAPC_OK)
            die("client %d: heapc_free: %s", idx, heapc_errstr(c));
    }
    s->t_end[idx] = now_us();
    heapc_get_counters(c, &c1);
    if (c1.collects != c0.collects || c1.chunks_mapped != c0.chunks_mapped)
        die("client %d: the heap collected (%" PRIu64 ") or grew (%" PRIu64
            " chunks mapped) during the run; the figures would include them",
            idx, c1.collects - c0.collects, c1.chunks_mapped - c0.chunks_mapped);
    if (col == LOCAL && (c1.local_allocs == 0 || c1.replica_lost))
        die("client %d: HEAPC_DECIDE=local: %" PRIu64 " allocations decided locally, replica_lost %" PRIu64
            " (want > 0 and 0)",
            idx, c1.local_allocs, c1.replica_lost);
    s->local[idx] += c1.local_allocs - cw.local_allocs;
    if (heapc_detach(c) != HEAPC_OK)
        die("client %d: heapc_detach: %s", idx, heapc_errstr(c));
    heapc_free_ctx(c);
    _exit(0);
}

static void run_heapd(shared *s, int round, uint64_t warm, uint64_t iters, int col)
{
    round_begin(s, (uint64_t)round * iters);
    for (int i = 0; i < s->clients; i++) {
        pid_t p = fork_child();
        if (p == 0)
            heapd_client(s, i, round, warm, iters, col);
        g_kids[g_nkids++] = p;
    }
    wait_clients("heapd round trip");
    round_end(s);
}

#include "rtt_bench_pp.h"  /* the raw ping-pong, the anchor */
#include "rtt_bench_mem.h" /* memory per live block, heapd idle */

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f, "usage: " NAME " [--json FILE] [--quick] [--heapd PATH] [--iters N] [--mem-blocks N]\n"
               "  --json FILE   also write the results as JSON to FILE\n"
               "  --quick       2000 timed allocations per client (smoke test)\n"
               "  --heapd PATH  the heapd to start (default: dirname(argv[0])/../heapd)\n"
               "  --iters N     timed allocations per client (default 20000)\n"
               "  --mem-blocks N  live blocks of the memory figure (default 100000)\n");
}

enum { NROWS = 4 };
static const int NS[NROWS] = {1, 2, 4, 8};

typedef struct row {
    int clients;
    pct c[NCOL];       /* RING, SOCKET, LOCAL, PP */
    double local_frac; /* of the local column's timed allocations, decided locally */
} row;

/* One run: its options and results. */
typedef struct run {
    const char *json, *spin;
    char heapd[PATH_MAX];
    uint64_t iters, per, warm;
    int quick, rounds;
    size_t req, rep;
    long cpus, spin_us;
    double load1, idle_s, idle0, idle8;
    mem_result mem;
    row rows[NROWS];
} run;

/* -1: go on; else main's exit code. */
static int parse_args(int argc, char **argv, run *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json") && i + 1 < argc) {
            o->json = argv[++i];
        } else if (!strcmp(a, "--quick")) {
            o->quick = 1;
            o->iters = 2000;
        } else if (!strcmp(a, "--heapd") && i + 1 < argc) {
            snprintf(o->heapd, sizeof o->heapd, "%s", argv[++i]);
        } else if ((!strcmp(a, "--iters") || !strcmp(a, "--mem-blocks")) && i + 1 < argc) {
            char *end;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (*end || v < 100 || v > 10000000) {
                fprintf(stderr, NAME ": %s takes 100..10000000, not '%s'\n", a, argv[i]);
                return 2;
            }
            if (!strcmp(a, "--iters"))
                o->iters = v;
            else
                MEM_BLOCKS = (uint32_t)v;
        } else if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, NAME ": unknown argument '%s'; run " NAME " --help\n", a);
            return 2;
        }
    }
    return -1;
}

/* The round trips of one client count: the columns' rounds alternate so
 * that all see the same machine (other load comes and goes). */
static void measure_row(run *o, row *rw, int clients)
{
    shared *s[NCOL];
    for (int m = 0; m < NCOL; m++)
        s[m] = shared_new(clients, o->iters);
    for (int r = 0; r < o->rounds; r++) {
        for (int m = RING; m <= LOCAL; m++)
            run_heapd(s[m], r, o->warm, o->per, m);
        run_pingpong(s[PP], r, o->warm, o->per, o->req, o->rep);
    }
    rw->clients = clients;
    uint64_t local = 0;
    for (int i = 0; i < clients; i++)
        local += s[LOCAL]->local[i];
    rw->local_frac = (double)local / ((double)clients * (double)o->iters);
    for (int m = 0; m < NCOL; m++) {
        rw->c[m] = summarize(s[m]);
        munmap(s[m], s[m]->len);
    }
    const pct *g = &rw->c[RING], *h = &rw->c[SOCKET], *l = &rw->c[LOCAL], *p = &rw->c[PP];
    printf("bench " NAME ": %d client(s): ring p50 %.2f us p99 %.2f us mean %.2f us, %.0f allocs/s "
           "in all, concurrency %.2f\n",
           clients, g->p50, g->p99, g->mean, g->ops_per_s, g->concurrency);
    printf("bench " NAME ": %d client(s): heapd p50 %.2f us p99 %.2f us mean %.2f us, %.0f allocs/s "
           "in all, concurrency %.2f; ping-pong p50 %.2f us p99 %.2f us mean %.2f us, %.0f "
           "round trips/s, concurrency %.2f\n",
           clients, h->p50, h->p99, h->mean, h->ops_per_s, h->concurrency, p->p50, p->p99, p->mean, p->ops_per_s,
           p->concurrency);
    printf("bench " NAME ": %d client(s): local (HEAPC_DECIDE=local, every " LOCAL_EVERY "th a ring round trip) "
           "p50 %.3f us p99 %.2f us mean %.3f us, %.0f allocs/s in all, concurrency %.2f, %.1f%% of the timed "
           "allocations decided locally; local p50 / ping-pong p50 %.3fx (target <= 0.1x)\n",
           clients, l->p50, l->p99, l->mean, l->ops_per_s, l->concurrency, rw->local_frac * 100.0, l->p50 / p->p50);
    fflush(stdout);
}

static void print_table(const run *o)
{
    printf("\n" NAME ": alloc round trip (4 KiB, one 1-rank heap per client process) on the request ring "
           "and on the socket, and decided locally (HEAPC_DECIDE=local, every " LOCAL_EVERY "th on the ring), vs "
           "raw Unix-socket ping-pong (%zu B / %zu B), microseconds; ring spin %s\n",
           o->req, o->rep, o->spin_us >= 0 ? o->spin : "auto");
    printf("%7s %9s %9s %11s %11s %12s %12s %9s %9s %9s %9s %9s\n", "clients", "ring p50", "ring p99", "socket p50",
           "socket p99", "pingpong p50", "pingpong p99", "ring/pp", "sock/pp", "local p50", "local p99", "local/pp");
    for (int k = 0; k < NROWS; k++) {
        const pct *c = o->rows[k].c;
        printf("%7d %9.2f %9.2f %11.2f %11.2f %12.2f %12.2f %9.2f %9.2f %9.3f %9.2f %9.4f\n", o->rows[k].clients,
               c[RING].p50, c[RING].p99, c[SOCKET].p50, c[SOCKET].p99, c[PP].p50, c[PP].p99, c[RING].p50 / c[PP].p50,
               c[SOCKET].p50 / c[PP].p50, c[LOCAL].p50, c[LOCAL].p99, c[LOCAL].p50 / c[PP].p50);
    }
    printf("(ratios of p50s; ring allocs/s with 8 clients: %.0f, local: %.0f; heapd idle: %.3f%% of a core, %.3f%% "
           "with 8 idle ring clients)\n",
           o->rows[NROWS - 1].c[RING].ops_per_s, o->rows[NROWS - 1].c[LOCAL].ops_per_s, o->idle0, o->idle8);
    const mem_result *m = &o->mem;
    printf("\n" NAME ": heapd memory per live block (%u x 4 KiB, one heap)\n", MEM_BLOCKS);
    printf("%12s %12s %12s %16s\n", "VmRSS before", "VmRSS after", "delta KiB", "bytes/block");
    printf("%9" PRIu64 " KiB %8" PRIu64 " KiB %12" PRId64 " %16.1f\n", m->rss0, m->rss1,
           (int64_t)m->rss1 - (int64_t)m->rss0, m->bytes_per_block);
}

/* One row's JSON object. */
static void json_row(FILE *f, const row *rw, int last)
{
    const pct *h = &rw->c[SOCKET], *p = &rw->c[PP];
    fprintf(f,
            "    {\"clients\": %d, \"heapd_p50_us\": %.3f, \"heapd_p99_us\": %.3f, "
            "\"heapd_mean_us\": %.3f, \"pingpong_p50_us\": %.3f, \"pingpong_p99_us\": %.3f, "
            "\"pingpong_mean_us\": %.3f, \"overhead_p50_us\": %.3f, \"ratio_p50\": %.3f, "
            "\"heapd_ops_per_s\": %.0f, \"pingpong_ops_per_s\": %.0f, "
            "\"heapd_concurrency\": %.3f, \"pingpong_concurrency\": %.3f",
            rw->clients, h->p50, h->p99, h->mean, p->p50, p->p99, p->mean, h->p50 - p->p50, h->p50 / p->p50,
            h->ops_per_s, p->ops_per_s, h->concurrency, p->concurrency);
    static const int cols[] = {RING, LOCAL};
    for (int j = 0; j < 2; j++) {
        int m = cols[j];
        const pct *c = &rw->c[m];
        const char *k = COL_NAME[m];
        fprintf(f,
                ", \"%s_p50_us\": %.3f, \"%s_p99_us\": %.3f, \"%s_mean_us\": %.3f, "
                "\"%s_ratio_p50\": %.*f, \"%s_ops_per_s\": %.0f",
                k, c->p50, k, c->p99, k, c->mean, k, m == LOCAL ? 4 : 3, c->p50 / p->p50, k, c->ops_per_s);
    }
    fprintf(f, ", \"local_concurrency\": %.3f, \"local_decided_fraction\": %.4f}%s\n", rw->c[LOCAL].concurrency,
            rw->local_frac, last ? "" : ",");
}

static int write_json(const run *o)
{
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, NAME ": cannot write %s: %s\n", o->json, strerror(errno));
        return 1;
    }
    fprintf(f, "{\n  \"bench\": \"" NAME "\",\n  \"quick\": %s,\n  \"cpus\": %ld,\n  \"loadavg_1min\": %.2f,\n",
            o->quick ? "true" : "false", o->cpus, o->load1);
    fprintf(f,
            "  \"alloc_size\": %" PRIu64 ",\n  \"iters_per_client\": %" PRIu64
            ",\n  \"rounds\": %d,\n  \"warmup_per_round\": %" PRIu64 ",\n",
            ALLOC_SIZE, o->iters, o->rounds, o->warm);
    fprintf(f, "  \"heaps\": \"one 1-rank heap per client process\",\n  \"local_every\": " LOCAL_EVERY ",\n");
    fprintf(f, "  \"request_bytes\": %zu,\n  \"reply_bytes\": %zu,\n  \"rtt\": [\n", o->req, o->rep);
    for (int k = 0; k < NROWS; k++)
        json_row(f, &o->rows[k], k == NROWS - 1);
    fprintf(f,
            "  ],\n  \"ring_spin_us\": %ld,\n  \"heapd_idle_cpu_pct\": %.4f,\n"
            "  \"heapd_idle_cpu_pct_8_ring_clients\": %.4f,\n",
            o->spin_us, o->idle0, o->idle8);
    const mem_result *m = &o->mem;
    fprintf(f,
            "  \"memory\": {\"live_blocks\": %u, \"vmrss_before_kib\": %" PRIu64 ", \"vmrss_after_kib\": %" PRIu64
            ", \"bytes_per_live_block\": %.1f, "
            "\"rssanon_before_kib\": %" PRIu64 ", \"rssanon_after_kib\": %" PRIu64
            ", \"anon_bytes_per_live_block\": %.1f}\n}\n",
            MEM_BLOCKS, m->rss0, m->rss1, m->bytes_per_block, m->anon0, m->anon1, m->anon_bytes_per_block);
    if (fclose(f) != 0) {
        fprintf(stderr, NAME ": cannot write %s\n", o->json);
        return 1;
    }
    return 0;
}

/* The options that follow from the arguments and the machine. */
static void setup(run *o, const char *argv0)
{
    if (!o->heapd[0])
        self_dir_file(argv0, "../heapd", o->heapd, sizeof o->heapd);
    o->spin = getenv("RTT_RING_SPIN_US");
    if (o->spin && *o->spin) {
        snprintf(g_conf_extra, sizeof g_conf_extra, "ring_spin_us = %s\n", o->spin);
        setenv("HEAPC_RING_SPIN_US", o->spin, 1);
    }
    o->spin_us = o->spin && *o->spin ? strtol(o->spin, NULL, 10) : -1;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGALRM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    alarm(300); /* a hung client or heapd must not hang `make bench` */
    o->rounds = o->quick ? 2 : 4;
    o->per = o->iters / (uint64_t)o->rounds;
    o->iters = o->per * (uint64_t)o->rounds;
    o->warm = o->per / 10 < 500 ? o->per / 10 : 500;
    o->idle_s = o->quick ? 1.0 : 3.0;
    frame_sizes(&o->req, &o->rep);
    o->cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->load1 = -1;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &o->load1) != 1)
            o->load1 = -1;
        fclose(la);
    }
}

int main(int argc, char **argv)
{
    static run o = {.iters = 20000};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    setup(&o, argv[0]);
    double t_start = now_us();

    /* 2 first, on a fresh heapd, so earlier heaps' freed memory does not
     * hide the growth. */
    start_heapd(o.heapd);
    printf("bench " NAME ": heapd %s (pid %d), socket %s, backend host, %ld CPU(s)\n", o.heapd, (int)g_heapd, g_sock,
           o.cpus);
    o.mem = run_memory();
    const mem_result *m = &o.mem;
    printf("bench " NAME ": memory: %u live 4 KiB blocks in one 1-rank heap: heapd VmRSS %" PRIu64 " -> %" PRIu64
           " KiB, %.1f bytes per live block (RssAnon %" PRIu64 " -> %" PRIu64 " KiB, %.1f B/block)\n",
           MEM_BLOCKS, m->rss0, m->rss1, m->bytes_per_block, m->anon0, m->anon1, m->anon_bytes_per_block);
    fflush(stdout);
    stop_heapd();

    start_heapd(o.heapd);
    printf("bench " NAME ": round trip: each client is a separate process with its own 1-rank heap "
           "(clients run concurrently, no lockstep); %" PRIu64 " timed heapc_alloc(4 KiB) per client "
           "in %d rounds (%" PRIu64 " warm-up each, ring, socket, local and ping-pong rounds alternate), frees "
           "untimed (batched by libheapc), no collect or growth; 1-min load average at start %.2f\n",
           o.iters, o.rounds, o.warm, o.load1);
    printf("bench " NAME ": ping-pong: one forked echo server process (poll + blocking read/write), "
           "request %zu B (Alloc frame + 8 B header), reply %zu B (AllocReply frame + header)\n",
           o.req, o.rep);
    fflush(stdout);
    for (int k = 0; k < NROWS; k++)
        measure_row(&o, &o.rows[k], NS[k]);
    o.idle0 = idle_cpu(0, o.idle_s);
    o.idle8 = idle_cpu(8, o.idle_s);
    printf("bench " NAME ": heapd idle: %.3f%% of a core with no client, %.3f%% with 8 idle ring clients "
           "attached (over %.0f s each, /proc/%d/stat)\n",
           o.idle0, o.idle8, o.idle_s, (int)g_heapd);
    cleanup();
    print_table(&o);
    printf("bench " NAME ": done in %.1f s\n", (now_us() - t_start) / 1e6);
    return o.json ? write_json(&o) : 0;
}
