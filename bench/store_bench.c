/* store_bench - collect latency of heaps that span nodes (collects reconciled
 * through Redis), with 2, 4, 8 and 16 heapd nodes on loopback, and the number
 * of Redis commands per collect per node.
 *
 *   store_bench [--json FILE] [--quick] [--heapd PATH] [--redis-server PATH]
 *               [--collects K] [--nodes LIST]
 *
 * Starts its own redis-server (from PATH, or --redis-server) on a free
 * loopback port (no persistence) and, for each node count N, N heapd
 * instances (PATH, default dirname(argv[0])/../heapd; each with its own
 * socket, backend = host, store = redis://127.0.0.1:PORT, node = nK), and
 * stops them all at the end, also on error. Without redis-server it prints
 * "skipped: redis-server not installed" and exits 0.
 *
 * For N nodes: N rank processes, one per node (local_size 1), attach to one
 * N-rank heap; each does warm-up iterations then K (default 1000; 100 with
 * --quick) timed iterations of
 *   { heapc_alloc(4 KiB); heapc_free; heapc_flush; heapc_collect }
 * exactly like collect_bench; only heapc_collect is timed, as seen by rank 0
 * (p50/p99/mean over its K collects): every node's local arrival, one
 * EVALSHA per node, the pub/sub message that tells the other nodes, the
 * reclaim and the replies. The same loop on one heapd without a store (N
 * ranks on one node) is the baseline.
 * Redis commands: INFO commandstats before and after the timed collects
 * (every rank waits at a barrier while the bench reads it); the deltas,
 * divided by K x N, give the commands heapd sent (EVAL/EVALSHA and any
 * other top-level command: SUBSCRIBE, ...) and the calls the Lua script made
 * inside Redis (HMGET, SETBIT, HSET, EXPIRE, PUBLISH, DEL, HDEL, GET); the
 * PUBLISH count per collect is the number of pub/sub messages. Our own INFO
 * calls are left out.
 * Every rank checks that it took part in exactly warm-up + K collects, that
 * heapd never asked for one by itself, and that the last collect reclaimed
 * the one block every rank released.
 *
 * Prints "bench store_bench: ..." lines and a table; --json FILE writes JSON.
 * Exit 0 (also when skipped), 1 on any error (printed), 2 on bad usage.
 */
#include "heapc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NAME "store_bench"
#include "bench_util.h"
#define KiB        ((uint64_t)1 << 10)
#define MiB        ((uint64_t)1 << 20)
#define ALLOC_SIZE (4 * KiB)
#define MAX_NODES  64
#define MAX_SIZES  8
#define MAX_CMDS   64

/* ---- process bookkeeping and cleanup ------------------------------------- */

static pid_t g_redis = -1;
static pid_t g_heapd[MAX_NODES];
static int g_nheapd;
static pid_t g_kids[MAX_NODES];
static int g_nkids;
static int g_port;
/* Short enough for sockaddr_un.sun_path (108 bytes). */
static char g_dir[64];
static char g_sock[MAX_NODES][100];
static redisContext *g_rc;

static void rm_dir(void)
{
    if (!g_dir[0])
        return;
    char p[160];
    for (int i = 0; i < MAX_NODES; i++) {
        snprintf(p, sizeof p, "%s/n%d.conf", g_dir, i);
        unlink(p);
        snprintf(p, sizeof p, "%s/n%d.sock", g_dir, i);
        unlink(p);
        snprintf(p, sizeof p, "%s/n%d.log", g_dir, i);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/redis.log", g_dir);
    unlink(p);
    rmdir(g_dir);
    g_dir[0] = '\0';
}

static void stop_nodes(void)
{
    for (int i = 0; i < g_nheapd; i++)
        if (g_heapd[i] > 0)
            kill(g_heapd[i], SIGTERM);
    for (int i = 0; i < g_nheapd; i++)
        reap(g_heapd[i], SIGTERM, 3000);
    g_nheapd = 0;
}

static void cleanup(void)
{
    if (g_is_child)
        return;
    for (int i = 0; i < g_nkids; i++)
        reap(g_kids[i], SIGKILL, 1000);
    g_nkids = 0;
    stop_nodes();
    if (g_rc) {
        redisFree(g_rc);
        g_rc = NULL;
    }
    reap(g_redis, SIGTERM, 3000);
    g_redis = -1;
    rm_dir();
}

/* The first executable NAME in $PATH into out; 0 if found. */
static int find_in_path(const char *name, char *out, size_t len)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
    while (*path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && n < PATH_MAX - 64) {
            snprintf(out, len, "%.*s/%s", (int)n, path, name);
            struct stat st;
            if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
                return 0;
        }
        path += n;
        if (*path == ':')
            path++;
    }
    return -1;
}

static void make_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 40)
        tmp = "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/" NAME ".XXXXXX", tmp);
    if (!mkdtemp(g_dir)) {
        int e = errno;
        g_dir[0] = '\0';
        die("mkdtemp: %s", strerror(e));
    }
}

/* ---- Redis -------------------------------------------------------------- */

static redisReply *rcmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(g_rc, fmt, ap);
    va_end(ap);
    if (!r)
        die("Redis at 127.0.0.1:%d: %s", g_port, g_rc->errstr[0] ? g_rc->errstr : "no reply");
    if (r->type == REDIS_REPLY_ERROR)
        die("Redis at 127.0.0.1:%d: %s", g_port, r->str);
    return r;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        die("cannot find a free loopback port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

/* Starts redis-server on a free loopback port; it is ours once the server on
 * that port reports our child's pid. Fills version. */
static void start_redis(const char *exe, char *version, size_t vlen)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        g_port = free_port();
        char port[16], logf[128];
        snprintf(port, sizeof port, "%d", g_port);
        snprintf(logf, sizeof logf, "%s/redis.log", g_dir);
        g_redis = fork_child();
        if (g_redis == 0) {
            int nul = open("/dev/null", O_RDWR);
            if (nul >= 0) {
                dup2(nul, 0);
                dup2(nul, 1);
            }
            execl(exe, exe, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", g_dir,
                  "--logfile", logf, "--daemonize", "no", (char *)NULL);
            fprintf(stderr, NAME ": exec %s: %s\n", exe, strerror(errno));
            _exit(127);
        }
        for (int i = 0; i < 500; i++) {
            int st;
            if (waitpid(g_redis, &st, WNOHANG) == g_redis) {
                g_redis = -1;
                break; /* the port was taken meanwhile, or redis cannot start */
            }
            struct timeval tv = {0, 200000};
            redisContext *c = redisConnectWithTimeout("127.0.0.1", g_port, tv);
            if (c && !c->err) {
                redisReply *r = redisCommand(c, "INFO server");
                long pid = -1;
                if (r && r->type == REDIS_REPLY_STRING) {
                    const char *p = strstr(r->str, "process_id:");
                    if (p)
                        pid = strtol(p + 11, NULL, 10);
                    p = strstr(r->str, "redis_version:");
                    if (p)
                        snprintf(version, vlen, "%.*s", (int)strcspn(p + 14, "\r\n"), p + 14);
                }
                freeReplyObject(r);
                if (pid == g_redis) {
                    g_rc = c;
                    return;
                }
                redisFree(c);
                break; /* someone else's server on that port */
            }
            if (c)
                redisFree(c);
            usleep(10000);
        }
        reap(g_redis, SIGKILL, 1000);
        g_redis = -1;
    }
    die("could not start %s on a free loopback port (see %s/redis.log)", exe, g_dir);
}

typedef struct cmdstats {
    int n;
    char name[MAX_CMDS][48];
    uint64_t calls[MAX_CMDS];
} cmdstats;

static void read_cmdstats(cmdstats *cs)
{
    memset(cs, 0, sizeof *cs);
    redisReply *r = rcmd("INFO commandstats");
    if (r->type != REDIS_REPLY_STRING)
        die("INFO commandstats: unexpected reply type %d", r->type);
    for (const char *p = r->str; (p = strstr(p, "cmdstat_")) != NULL;) {
        p += 8;
        size_t nl = strcspn(p, ":");
        const char *c = strstr(p, "calls=");
        if (!c || cs->n == MAX_CMDS)
            break;
        snprintf(cs->name[cs->n], sizeof cs->name[0], "%.*s", (int)nl, p);
        cs->calls[cs->n++] = strtoull(c + 6, NULL, 10);
    }
    freeReplyObject(r);
}

static uint64_t calls_of(const cmdstats *cs, const char *name)
{
    for (int i = 0; i < cs->n; i++)
        if (!strcmp(cs->name[i], name))
            return cs->calls[i];
    return 0;
}

/* Commands the collect script runs inside Redis (never sent by heapd in a
 * collect; PUBLISH is sent directly only for forced collects). */
static int in_script(const char *name)
{
    static const char *const s[] = {"hmget", "hget", "hset", "hdel", "setbit", "get", "del", "expire", "publish", NULL};
    for (int i = 0; s[i]; i++)
        if (!strcmp(name, s[i]))
            return 1;
    return 0;
}

static long numsub(const char *channel)
{
    redisReply *r = rcmd("PUBSUB NUMSUB %s", channel);
    long n = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_INTEGER)
        n = (long)r->element[1]->integer;
    freeReplyObject(r);
    return n;
}

/* ---- heapd nodes ------------------------------------------------------------ */

static void start_nodes(const char *heapd, int n, int with_store)
{
    if (access(heapd, X_OK) != 0)
        die("heapd %s: %s; build it (make) or pass --heapd PATH", heapd, strerror(errno));
    for (int i = 0; i < n; i++) {
        char conf[128], logf[128];
        snprintf(conf, sizeof conf, "%s/n%d.conf", g_dir, i);
        snprintf(logf, sizeof logf, "%s/n%d.log", g_dir, i);
        snprintf(g_sock[i], sizeof g_sock[i], "%s/n%d.sock", g_dir, i);
        FILE *f = fopen(conf, "w");
        if (!f)
            die("cannot write %s: %s", conf, strerror(errno));
        fprintf(f, "socket = %s\nbackend = host\nlog_level = warn\ncollect_timeout_ms = 10000\n", g_sock[i]);
        if (with_store)
            fprintf(f, "store = redis://127.0.0.1:%d\nnode = n%d\n", g_port, i);
        if (fclose(f) != 0)
            die("cannot write %s: %s", conf, strerror(errno));
        pid_t p = fork_child();
        if (p == 0) {
            int fd = open(logf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd >= 0)
                dup2(fd, 2);
            execl(heapd, heapd, "-c", conf, (char *)NULL);
            fprintf(stderr, NAME ": exec %s: %s\n", heapd, strerror(errno));
            _exit(127);
        }
        g_heapd[g_nheapd++] = p;
    }
    for (int i = 0; i < n; i++) {
        int ok = 0;
        for (int k = 0; k < 1000 && !ok; k++) {
            int st;
            if (waitpid(g_heapd[i], &st, WNOHANG) == g_heapd[i]) {
                g_heapd[i] = -1;
                die("heapd node n%d exited during startup (status %d; log %s/n%d.log)", i,
                    WIFEXITED(st) ? WEXITSTATUS(st) : -1, g_dir, i);
            }
            heapc *c = heapc_connect(g_sock[i]);
            ok = c && heapc_err(c) == 0;
            heapc_free_ctx(c);
            if (!ok)
                usleep(10000);
        }
        if (!ok)
            die("heapd node n%d did not answer on %s within 10 s", i, g_sock[i]);
    }
    if (with_store) {
        /* Every node subscribes (heapd:node:NAME, heapd:force) at start; a
         * collect waits for the subscription, so wait here, untimed. */
        long s = 0;
        for (int k = 0; k < 1000 && (s = numsub("heapd:force")) != n; k++)
            usleep(10000);
        if (s != n)
            die("%ld of %d heapd nodes subscribed to heapd:force within 10 s", s, n);
    }
}

/* ---- the benchmark ------------------------------------------------------- */

typedef struct shared {
    volatile int ready, go, done; /* __atomic */
    double wall_us;               /* rank 0: its whole timed loop */
    uint64_t iters;
    double lat[]; /* rank 0's collects, microseconds */
} shared;

static void wait_flag(volatile int *f, int want, uint32_t rank)
{
    double t0 = now_us();
    while (__atomic_load_n(f, __ATOMIC_ACQUIRE) < want) {
        if (now_us() - t0 > 120e6)
            die("rank %u: the bench did not give the start signal within 120 s", rank);
        usleep(200);
    }
}

static void rank_main(shared *s, uint32_t rank, uint32_t ranks, int spread, uint64_t warm, uint64_t iters)
{
    const char *sock = g_sock[spread ? rank : 0];
    heapc *c = heapc_connect(sock);
    if (!c)
        die("rank %u: heapc_connect: out of memory", rank);
    if (heapc_err(c))
        die("rank %u: heapc_connect(%s): %s", rank, sock, heapc_errstr(c));
    char heap[32], job[32];
    snprintf(heap, sizeof heap, "store-%u-%s", ranks, spread ? "nodes" : "local");
    snprintf(job, sizeof job, "bench%ld", (long)getppid());
    heapc_params p;
    memset(&p, 0, sizeof p);
    p.chunk_size = 1 * MiB;
    p.initial_size = 1 * MiB;
    p.va_size = 64 * MiB;
    p.policy = HEAPC_POLICY_COALESCE;
    p.local_size = spread ? 1 : 0;
    p.job = job;
    if (heapc_attach(c, heap, rank, ranks, &p) != HEAPC_OK)
        die("rank %u: heapc_attach(%s): %s", rank, heap, heapc_errstr(c));
    heapc_counters c0, c1;
    heapc_get_counters(c, &c0);
    double t_begin = 0;
    for (uint64_t i = 0; i < warm + iters; i++) {
        if (i == warm) {
            /* Barrier: the bench reads Redis's counters while every rank waits. */
            __atomic_add_fetch(&s->ready, 1, __ATOMIC_ACQ_REL);
            wait_flag(&s->go, 1, rank);
            t_begin = now_us();
        }
        uint64_t off;
        if (heapc_alloc(c, ALLOC_SIZE, NULL, &off) != HEAPC_OK)
            die("rank %u: heapc_alloc: %s", rank, heapc_errstr(c));
        if (heapc_free(c, off) != HEAPC_OK)
            die("rank %u: heapc_free: %s", rank, heapc_errstr(c));
        if (heapc_flush(c) != HEAPC_OK)
            die("rank %u: heapc_flush: %s", rank, heapc_errstr(c));
        double t0 = now_us();
        int rc = heapc_collect(c);
        double t1 = now_us();
        if (rc != HEAPC_OK)
            die("rank %u: heapc_collect: %s", rank, heapc_errstr(c));
        if (i >= warm && rank == 0)
            s->lat[i - warm] = t1 - t0;
    }
    if (rank == 0)
        s->wall_us = now_us() - t_begin;
    __atomic_add_fetch(&s->done, 1, __ATOMIC_ACQ_REL);
    heapc_get_counters(c, &c1);
    if (c1.collects - c0.collects != warm + iters || c1.collects_needed != c0.collects_needed)
        die("rank %u: %" PRIu64 " collects (%" PRIu64 " asked for by heapd), expected %" PRIu64 " and none asked for",
            rank, c1.collects - c0.collects, c1.collects_needed - c0.collects_needed, warm + iters);
    if (c1.last_reclaimed_blocks != 1)
        die("rank %u: the last collect reclaimed %" PRIu64 " blocks, expected 1", rank, c1.last_reclaimed_blocks);
    if (heapc_detach(c) != HEAPC_OK)
        die("rank %u: heapc_detach: %s", rank, heapc_errstr(c));
    heapc_free_ctx(c);
    _exit(0);
}

/* Until *f reaches want; dies if a rank or a heapd exits meanwhile. */
static void parent_wait(volatile int *f, int want, const char *what)
{
    double t0 = now_us();
    while (__atomic_load_n(f, __ATOMIC_ACQUIRE) < want) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int i = 0; i < g_nkids; i++)
                if (g_kids[i] == p) {
                    g_kids[i] = -1; /* reaped: wait_ranks skips it */
                    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                        die("%s: rank %d failed (%s %d)", what, i, WIFEXITED(st) ? "exit" : "signal",
                            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                }
            for (int i = 0; i < g_nheapd; i++)
                if (g_heapd[i] == p) {
                    g_heapd[i] = -1;
                    die("%s: heapd node n%d died (log %s/n%d.log)", what, i, g_dir, i);
                }
            if (p == g_redis) {
                g_redis = -1;
                die("%s: redis-server died", what);
            }
        }
        if (now_us() - t0 > 120e6)
            die("%s: the ranks did not get there within 120 s", what);
        usleep(500);
    }
}

static void wait_ranks(const char *what)
{
    for (int i = 0; i < g_nkids; i++) {
        int st;
        if (g_kids[i] <= 0)
            continue; /* reaped (exit 0) by parent_wait */
        if (waitpid(g_kids[i], &st, 0) != g_kids[i])
            die("%s: waitpid: %s", what, strerror(errno));
        g_kids[i] = -1;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die("%s: rank %d failed (%s %d)", what, i, WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    g_nkids = 0;
}

typedef struct result {
    double p50, p99, mean, max, iter_us;
    cmdstats before, after;
} result;

/* N ranks: one per heapd node (spread, through Redis) or all on node 0. */
static result run(uint32_t ranks, int spread, uint64_t warm, uint64_t iters)
{
    size_t len = sizeof(shared) + iters * sizeof(double);
    shared *s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        die("mmap of %zu shared bytes: %s", len, strerror(errno));
    s->iters = iters;
    for (uint32_t r = 0; r < ranks; r++) {
        pid_t p = fork_child();
        if (p == 0)
            rank_main(s, r, ranks, spread, warm, iters);
        g_kids[g_nkids++] = p;
    }
    char what[64];
    snprintf(what, sizeof what, "%u ranks on %s", ranks, spread ? "as many nodes" : "one heapd");
    result res;
    memset(&res, 0, sizeof res);
    parent_wait(&s->ready, (int)ranks, what);
    if (spread)
        read_cmdstats(&res.before);
    __atomic_store_n(&s->go, 1, __ATOMIC_RELEASE);
    parent_wait(&s->done, (int)ranks, what);
    if (spread)
        read_cmdstats(&res.after);
    wait_ranks(what);
    res.iter_us = s->wall_us / (double)iters;
    qsort(s->lat, iters, sizeof(double), cmp_double);
    double sum = 0;
    for (uint64_t i = 0; i < iters; i++)
        sum += s->lat[i];
    res.p50 = s->lat[(size_t)(0.50 * (double)(iters - 1))];
    res.p99 = s->lat[(size_t)(0.99 * (double)(iters - 1))];
    res.max = s->lat[iters - 1];
    res.mean = sum / (double)iters;
    munmap(s, len);
    return res;
}

typedef struct row {
    int nodes;
    result st, loc;
    double evals, other, script, publish; /* per collect per node (publish: per collect) */
    cmdstats delta;
} row;

static void tally(row *w, uint64_t iters)
{
    const cmdstats *b = &w->st.before, *a = &w->st.after;
    double per = (double)iters * (double)w->nodes;
    uint64_t ev = 0, other = 0, script = 0;
    memset(&w->delta, 0, sizeof w->delta);
    for (int i = 0; i < a->n; i++) {
        const char *nm = a->name[i];
        uint64_t d = a->calls[i] - calls_of(b, nm);
        if (!strcmp(nm, "info") || d == 0)
            continue; /* ours */
        snprintf(w->delta.name[w->delta.n], sizeof w->delta.name[0], "%s", nm);
        w->delta.calls[w->delta.n++] = d;
        if (!strcmp(nm, "evalsha") || !strcmp(nm, "eval"))
            ev += d;
        else if (in_script(nm))
            script += d;
        else
            other += d;
    }
    w->evals = (double)ev / per;
    w->other = (double)other / per;
    w->script = (double)script / per;
    w->publish = (double)(calls_of(a, "publish") - calls_of(b, "publish")) / (double)iters;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " NAME " [--json FILE] [--quick] [--heapd PATH] [--redis-server PATH]\n"
            "                   [--collects K] [--nodes LIST]\n"
            "  --json FILE          also write the results as JSON to FILE\n"
            "  --quick              100 timed collects per node count (smoke test)\n"
            "  --heapd PATH         the heapd to start (default: dirname(argv[0])/../heapd)\n"
            "  --redis-server PATH  the redis-server to start (default: the one in $PATH)\n"
            "  --collects K         timed collects per node count (default 1000)\n"
            "  --nodes LIST         comma-separated node counts (default 2,4,8,16; at most %d)\n",
            MAX_NODES);
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    char heapd[PATH_MAX] = "", redis[PATH_MAX] = "";
    uint64_t iters = 1000;
    int quick = 0;
    int sizes[MAX_SIZES] = {2, 4, 8, 16}, nsizes = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json = argv[++i];
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
            iters = 100;
        } else if (!strcmp(argv[i], "--heapd") && i + 1 < argc) {
            snprintf(heapd, sizeof heapd, "%s", argv[++i]);
        } else if (!strcmp(argv[i], "--redis-server") && i + 1 < argc) {
            snprintf(redis, sizeof redis, "%s", argv[++i]);
        } else if (!strcmp(argv[i], "--collects") && i + 1 < argc) {
            char *end;
            iters = strtoull(argv[++i], &end, 10);
            if (*end || iters < 10 || iters > 1000000) {
                fprintf(stderr, NAME ": --collects takes 10..1000000, not '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--nodes") && i + 1 < argc) {
            const char *p = argv[++i];
            nsizes = 0;
            while (*p) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p || v < 2 || v > MAX_NODES || nsizes == MAX_SIZES || (*end && *end != ',')) {
                    fprintf(stderr, NAME ": --nodes takes up to %d comma-separated counts of 2..%d, not '%s'\n",
                            MAX_SIZES, MAX_NODES, argv[i]);
                    return 2;
                }
                sizes[nsizes++] = (int)v;
                p = *end ? end + 1 : end;
            }
            if (!nsizes) {
                fprintf(stderr, NAME ": --nodes needs at least one count\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, NAME ": unknown argument '%s'; run " NAME " --help\n", argv[i]);
            return 2;
        }
    }
    if (!redis[0] && find_in_path("redis-server", redis, sizeof redis) != 0) {
        printf("skipped: redis-server not installed (bench " NAME " needs it in $PATH, or --redis-server PATH)\n");
        return 0;
    }
    if (access(redis, X_OK) != 0) {
        fprintf(stderr, NAME ": %s: %s\n", redis, strerror(errno));
        return 1;
    }
    if (!heapd[0])
        self_dir_file(argv[0], "../heapd", heapd, sizeof heapd);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGALRM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    alarm(300); /* a hung rank, heapd or Redis must not hang `make bench` */
    uint64_t warm = iters / 10 < 30 ? (iters / 10 < 5 ? 5 : iters / 10) : 30;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double load1 = -1;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load1) != 1)
            load1 = -1;
        fclose(la);
    }
    double t_start = now_us();

    make_dir();
    char version[64] = "?";
    start_redis(redis, version, sizeof version);
    printf("bench " NAME ": redis-server %s (%s, pid %d) on 127.0.0.1:%d, no persistence; heapd %s; %ld CPU(s), "
           "1-min load average %.2f\n",
           version, redis, (int)g_redis, g_port, heapd, cpus, load1);
    printf("bench " NAME ": per node count N: N heapd nodes (host backend), one rank process per node "
           "(local_size 1), %" PRIu64 " warm-up + %" PRIu64 " timed iterations of {alloc 4 KiB, free, flush, "
           "collect}; only heapc_collect is timed, as seen by rank 0; baseline: the same N ranks on one heapd "
           "without a store\n",
           warm, iters);
    fflush(stdout);

    row rows[MAX_SIZES];
    for (int k = 0; k < nsizes; k++) {
        row *w = &rows[k];
        memset(w, 0, sizeof *w);
        w->nodes = sizes[k];
        start_nodes(heapd, sizes[k], 1);
        w->st = run((uint32_t)sizes[k], 1, warm, iters);
        stop_nodes();
        start_nodes(heapd, 1, 0);
        w->loc = run((uint32_t)sizes[k], 0, warm, iters);
        stop_nodes();
        tally(w, iters);
        printf("bench " NAME ": %d nodes: collect p50 %.1f us p99 %.1f us mean %.1f us max %.1f us; "
               "Redis per collect per node: %.2f EVALSHA/EVAL, %.2f other commands, %.2f calls inside the "
               "script; %.2f PUBLISH per collect; one heapd, %d ranks: p50 %.1f us p99 %.1f us\n",
               w->nodes, w->st.p50, w->st.p99, w->st.mean, w->st.max, w->evals, w->other, w->script, w->publish,
               w->nodes, w->loc.p50, w->loc.p99);
        fflush(stdout);
    }
    cleanup();

    printf("\n" NAME ": heapc_collect latency (rank 0, microseconds) with N heapd nodes reconciled through Redis, "
           "1 rank per node; Redis commands per collect per node\n");
    printf("%5s %9s %9s %9s %12s %12s %9s %9s %9s %8s\n", "nodes", "p50", "p99", "mean", "1-heapd p50", "1-heapd p99",
           "cmds", "other", "in-script", "PUBLISH");
    for (int k = 0; k < nsizes; k++) {
        const row *w = &rows[k];
        printf("%5d %9.1f %9.1f %9.1f %12.1f %12.1f %9.2f %9.2f %9.2f %8.2f\n", w->nodes, w->st.p50, w->st.p99,
               w->st.mean, w->loc.p50, w->loc.p99, w->evals, w->other, w->script, w->publish);
    }
    printf("(cmds: EVALSHA/EVAL heapd sent per collect per node; other: any other command heapd sent, per "
           "collect per node; in-script: Redis calls the Lua script made, per collect per node; PUBLISH: "
           "pub/sub messages per collect, all from inside the script; 1-heapd: the same N ranks on one heapd, "
           "no store)\n");
    printf("bench " NAME ": done in %.1f s\n", (now_us() - t_start) / 1e6);

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, NAME ": cannot write %s: %s\n", json, strerror(errno));
            return 1;
        }
        fprintf(f, "{\n  \"bench\": \"" NAME "\",\n  \"quick\": %s,\n  \"cpus\": %ld,\n  \"loadavg_1min\": %.2f,\n",
                quick ? "true" : "false", cpus, load1);
        fprintf(f,
                "  \"redis_version\": \"%s\",\n  \"collects\": %" PRIu64 ",\n  \"warmup\": %" PRIu64
                ",\n  \"ranks_per_node\": 1,\n  \"alloc_size\": %" PRIu64 ",\n  \"rows\": [\n",
                version, iters, warm, ALLOC_SIZE);
        for (int k = 0; k < nsizes; k++) {
            const row *w = &rows[k];
            fprintf(f,
                    "    {\"nodes\": %d, \"p50_us\": %.3f, \"p99_us\": %.3f, \"mean_us\": %.3f, \"max_us\": %.3f, "
                    "\"iter_us\": %.3f, \"one_heapd_p50_us\": %.3f, \"one_heapd_p99_us\": %.3f, "
                    "\"one_heapd_mean_us\": %.3f, \"commands_per_collect_per_node\": %.4f, "
                    "\"evalsha_per_collect_per_node\": %.4f, "
                    "\"other_cmds_per_collect_per_node\": %.4f, \"script_calls_per_collect_per_node\": %.4f, "
                    "\"publish_per_collect\": %.4f, \"commandstats_delta\": {",
                    w->nodes, w->st.p50, w->st.p99, w->st.mean, w->st.max, w->st.iter_us, w->loc.p50, w->loc.p99,
                    w->loc.mean, w->evals + w->other, w->evals, w->other, w->script, w->publish);
            for (int i = 0; i < w->delta.n; i++)
                fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", w->delta.name[i], w->delta.calls[i]);
            fprintf(f, "}}%s\n", k < nsizes - 1 ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        if (fclose(f) != 0) {
            fprintf(stderr, NAME ": cannot write %s\n", json);
            return 1;
        }
    }
    return 0;
}
