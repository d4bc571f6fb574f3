/* store_big_bench.c - another tenant's collect latency while one tenant runs a
 * big cross-node collect (issue 33 item 5; store_bench measures the small
 * collects of whole heapd nodes).
 *
 * Starts redis-server on a free loopback port, and in this process three
 * stores (daemon/store.h) on one libuv loop: nodes a and b collect a heap of
 * world 2 with L candidates each (L = 10^5 and 10^6 by default; b's set
 * drops every fifth offset), and node v, "another uid", runs back-to-back
 * collects of its own heap (world 1, 2 candidates) before and during the big
 * collect. Reports v's p50/p99/max collect latency unloaded and during the
 * big collect, the big collect's duration, and the longest command Redis ran
 * (SLOWLOG with every command logged).
 *
 *   store_big_bench [--sizes 100000,1000000] [--quick: 10^5 only] [--json FILE]
 *                   [--redis-server PATH]
 */
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <uv.h>

#define NAME "store_big_bench"
#include "bench_util.h"
#include "store.h"

static pid_t g_redis = -1;
static char g_dir[64];

static void cleanup(void)
{
    reap(g_redis, SIGTERM, 2000);
    g_redis = -1;
    if (g_dir[0])
        rmdir(g_dir);
}

static int port_free(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static redisContext *rconn(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    return c && !c->err ? c : NULL;
}

static int start_redis(const char *exe)
{
    char p[16];
    snprintf(g_dir, sizeof g_dir, "/tmp/store_big_bench.XXXXXX");
    if (!mkdtemp(g_dir))
        die("mkdtemp: %s", strerror(errno));
    for (int port = 21000 + (int)(getpid() % 20000);; port++) {
        if (!port_free(port))
            continue;
        snprintf(p, sizeof p, "%d", port);
        g_redis = fork_child();
        if (g_redis == 0) {
            int fd = open("/dev/null", O_RDWR);
            dup2(fd, 1);
            dup2(fd, 2);
            execl(exe, exe, "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", g_dir,
                  (char *)NULL);
            _exit(127);
        }
        for (int i = 0; i < 500; i++) {
            redisContext *c = rconn(port);
            if (c) {
                redisFree(c);
                return port;
            }
            usleep(10000);
        }
        die("redis-server did not start on port %d", port);
    }
}

typedef struct node {
    hd_store *s;
    int done, status;
    double t0, t1;
} node;

static uv_loop_t loop;
static node A, B, V;
static double lat[1000000];
static size_t nlat;

static void on_done(void *arg, int status, const char *msg, const uint64_t *o, size_t n)
{
    node *nd = arg;
    (void)o, (void)n;
    nd->done = 1;
    nd->status = status;
    nd->t1 = now_us();
    if (status)
        die("collect failed: %s", msg);
}

static void start(node *nd, const char *heap, uint64_t cnum, uint32_t world, uint32_t rank, const uint64_t *offs,
                  size_t n)
{
    char err[1024];
    nd->done = 0;
    nd->t0 = now_us();
    if (hd_store_collect(nd->s, heap, "bench", cnum, world, &rank, 1, offs, n, 60000, 120, on_done, nd, err,
                         sizeof err))
        die("collect: %s", err);
}

/* Shared with the victim process: its collects' start times and latencies. */
typedef struct shared {
    volatile int stop;
    volatile size_t n;
    double t[1000000], l[1000000];
} shared;
static shared *g_sh;

/* The victim, another uid on another node: its own process, loop and store,
 * collecting back to back until told to stop. */
static void victim_main(const char *url)
{
    static const uint64_t two[] = {512, 1024};
    char err[1024];
    uint64_t cnum = 0;
    uv_loop_init(&loop);
    if (hd_store_open(&loop, url, "v", &V.s, err, sizeof err))
        die("open: %s", err);
    while (!hd_store_ready(V.s))
        uv_run(&loop, UV_RUN_NOWAIT);
    while (!g_sh->stop && g_sh->n < sizeof g_sh->t / sizeof g_sh->t[0]) {
        start(&V, "victim", ++cnum, 1, 0, two, 2);
        while (!V.done)
            uv_run(&loop, UV_RUN_ONCE);
        g_sh->t[g_sh->n] = V.t0;
        g_sh->l[g_sh->n] = V.t1 - V.t0;
        g_sh->n++;
    }
    _exit(0);
}

typedef struct pstat {
    size_t n;
    double p50, p99, max;
} pstat;

/* The victim's collects that started in [t0, t1]. */
static pstat pct(const char *what, double t0, double t1)
{
    pstat st = {0};
    nlat = 0;
    for (size_t i = 0; i < g_sh->n; i++)
        if (g_sh->t[i] >= t0 && g_sh->t[i] <= t1)
            lat[nlat++] = g_sh->l[i];
    if (!nlat) {
        printf("  %-28s no collects\n", what);
        return st;
    }
    qsort(lat, nlat, sizeof lat[0], cmp_double);
    st = (pstat){nlat, lat[nlat / 2], lat[nlat * 99 / 100], lat[nlat - 1]};
    printf("  %-28s %6zu collects: p50 %8.1f us  p99 %8.1f us  max %8.1f us\n", what, st.n, st.p50, st.p99, st.max);
    return st;
}

static void json_stat(FILE *f, const char *key, pstat st)
{
    fprintf(f, "\"%s\": {\"collects\": %zu, \"p50_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f}", key, st.n, st.p50,
            st.p99, st.max);
}

/* The longest command since SLOWLOG RESET, its name in name. */
static long long slowest(redisContext *c, char *name, size_t len)
{
    redisReply *r = redisCommand(c, "SLOWLOG GET 1000000");
    long long most = 0;
    for (size_t i = 0; r && i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->elements >= 4 && e->element[2]->integer > most && e->element[3]->elements &&
            strcasecmp(e->element[3]->element[0]->str, "slowlog")) {
            most = e->element[2]->integer;
            snprintf(name, len, "%s", e->element[3]->elements ? e->element[3]->element[0]->str : "?");
        }
    }
    if (r)
        freeReplyObject(r);
    return most;
}

int main(int argc, char **argv)
{
    char redis[PATH_MAX] = "", url[64], err[1024];
    const char *json = NULL;
    size_t sizes[8] = {100000, 1000000}, nsizes = 2;
    FILE *jf = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--redis-server") && i + 1 < argc)
            snprintf(redis, sizeof redis, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            nsizes = 1;
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            char *p = argv[++i], *end;
            for (nsizes = 0; *p && nsizes < 8; p = *end ? end + 1 : end)
                sizes[nsizes++] = strtoull(p, &end, 10);
        } else {
            fprintf(stderr, "usage: " NAME " [--sizes N,N] [--quick] [--json FILE] [--redis-server PATH]\n");
            return 2;
        }
    }
    if (!redis[0]) {
        const char *path = getenv("PATH");
        char buf[4096], *save = NULL;
        snprintf(buf, sizeof buf, "%s", path ? path : "/usr/bin:/bin");
        for (char *d = strtok_r(buf, ":", &save); d && !redis[0]; d = strtok_r(NULL, ":", &save)) {
            snprintf(redis, sizeof redis, "%s/redis-server", d);
            if (access(redis, X_OK) != 0)
                redis[0] = 0;
        }
    }
    if (!redis[0] || access(redis, X_OK) != 0) {
        printf("skipped: redis-server not installed\n");
        return 0;
    }
    if (json && !(jf = fopen(json, "w")))
        die("%s: %s", json, strerror(errno));
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    (void)self_dir_file;
    int port = start_redis(redis);
    redisContext *c = rconn(port);
    freeReplyObject(redisCommand(c, "CONFIG SET slowlog-log-slower-than 0"));
    freeReplyObject(redisCommand(c, "CONFIG SET slowlog-max-len 1000000"));
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_sh == MAP_FAILED)
        die("mmap: %s", strerror(errno));
    pid_t vpid = fork_child();
    if (vpid == 0)
        victim_main(url);
    uv_loop_init(&loop);
    if (hd_store_open(&loop, url, "a", &A.s, err, sizeof err) || hd_store_open(&loop, url, "b", &B.s, err, sizeof err))
        die("open: %s", err);
    while (!hd_store_ready(A.s) || !hd_store_ready(B.s))
        uv_run(&loop, UV_RUN_NOWAIT);
    printf(NAME ": Redis on 127.0.0.1:%d; pieces of %d offsets; the victim runs in its own process\n", port,
           HD_STORE_PIECE);
    double u0 = now_us();
    while (g_sh->n < 2000)
        usleep(10000);
    pstat un = pct("another uid, unloaded", u0, now_us());
    if (jf) {
        fprintf(jf, "{\"bench\": \"" NAME "\", \"piece\": %d, ", HD_STORE_PIECE);
        json_stat(jf, "unloaded", un);
        fprintf(jf, ", \"big\": [");
    }
    for (size_t k = 0; k < nsizes; k++) {
        size_t L = sizes[k], nb = 0;
        uint64_t *sa = malloc(L * 8), *sb = malloc(L * 8);
        for (size_t i = 0; i < L; i++)
            sa[i] = i * 512;
        for (size_t i = 0; nb < L; i++)
            if (i % 5)
                sb[nb++] = i * 512;
        freeReplyObject(redisCommand(c, "SLOWLOG RESET"));
        start(&A, "big", k + 1, 2, 0, sa, L);
        start(&B, "big", k + 1, 2, 1, sb, nb);
        while (!A.done || !B.done)
            uv_run(&loop, UV_RUN_ONCE);
        double t1 = A.t1 > B.t1 ? A.t1 : B.t1;
        char name[64] = "";
        long long most = slowest(c, name, sizeof name);
        printf("big collect: 2 nodes x %zu candidates of 512 B took %.1f ms; longest Redis command %lld us (%s)\n", L,
               (t1 - A.t0) / 1000, most, name);
        pstat mw = pct("another uid, meanwhile", A.t0, t1);
        if (jf) {
            fprintf(jf, "%s{\"candidates\": %zu, \"collect_ms\": %.1f, \"longest_cmd_us\": %lld, ", k ? ", " : "", L,
                    (t1 - A.t0) / 1000, most);
            json_stat(jf, "victim", mw);
            fprintf(jf, "}");
        }
        free(sa);
        free(sb);
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    g_sh->stop = 1;
    reap(vpid, SIGTERM, 5000);
    hd_store_close(A.s);
    hd_store_close(B.s);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    redisFree(c);
    cleanup();
    return 0;
}
