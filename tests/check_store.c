/*
 * check_store.c - unit tests for daemon/store_redis*.c (the cross-node store).
 *
 * Starts a real redis-server on a free loopback port (fork/exec, a temporary
 * --dir, killed in teardown; PR_SET_PDEATHSIG kills it too if a test process
 * dies), runs a libuv loop in the test, and simulates nodes with several
 * hd_store instances on that loop, each with its own node name. The keys are
 * inspected with a synchronous hiredis connection (fine in a test, never in
 * the daemon). Without redis-server the test prints "skipped: redis-server
 * not installed" and passes.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <uv.h>

#include "store.h"
#include "check_util.h"

#define ERRLEN 1024
#define NNODES 3

/* ---- redis-server ------------------------------------------------------ */

static char redis_dir[64]; /* made by main, shared by every test */
static pid_t redis_pid = -1;
static int redis_port;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int have_redis_server(void)
{
    const char *path = getenv("PATH");
    char buf[4096], *save = NULL, *dir;
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    snprintf(buf, sizeof buf, "%s", path);
    for (dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        char f[4200];
        snprintf(f, sizeof f, "%s/redis-server", *dir ? dir : ".");
        if (access(f, X_OK) == 0)
            return 1;
    }
    return 0;
}

static int port_free(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static int redis_ping(int port)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    int ok = 0;
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "PING");
        ok = r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG");
        if (r)
            freeReplyObject(r);
    }
    if (c)
        redisFree(c);
    return ok;
}

/* Starts redis-server on `port`; 0 when it answers PING, -1 if it died. */
static int redis_start_on(int port)
{
    pid_t parent = getpid(), pid;
    char p[16];
    uint64_t end;

    snprintf(p, sizeof p, "%d", port);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_RDWR);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        if (fd >= 0) {
            dup2(fd, 0);
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--daemonize", "no", "--dir", redis_dir, "--logfile", "", (char *)NULL);
        _exit(127);
    }
    end = now_ms() + 10000;
    while (now_ms() < end) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return -1; /* port taken, or broken install */
        if (redis_ping(port)) {
            redis_pid = pid;
            redis_port = port;
            return 0;
        }
        sleep_ms(20);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void redis_start(void)
{
    int base = 20000 + (int)(getpid() % 10000);
    for (int i = 0; i < 200; i++) {
        int port = base + i * 7 % 20000;
        if (port > 65000)
            port -= 40000;
        if (port_free(port) && redis_start_on(port) == 0)
            return;
    }
    ck_abort_msg("could not start redis-server on any free loopback port from %d", base);
}

static void redis_kill(int sig)
{
    if (redis_pid > 0) {
        kill(redis_pid, sig);
        waitpid(redis_pid, NULL, 0);
        redis_pid = -1;
    }
}

static void redis_restart(void)
{
    uint64_t end = now_ms() + 10000;
    redis_kill(SIGKILL);
    while (redis_start_on(redis_port) != 0) {
        ck_assert_msg(now_ms() < end, "redis-server did not restart on port %d", redis_port);
        sleep_ms(50);
    }
}

static redisContext *redis_sync(void)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    ck_assert_ptr_nonnull(c);
    ck_assert_msg(!c->err, "redisConnect: %s", c->errstr);
    return c;
}

static long long redis_int(redisContext *c, const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(c, fmt, arg);
    long long v;
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_INTEGER);
    v = r->integer;
    freeReplyObject(r);
    return v;
}

/* ---- loop and nodes ------------------------------------------------------ */

static uv_loop_t loop;
static uv_timer_t tick;

typedef struct node {
    hd_store *s;
    char name[16];
    int done;
    int status;
    char msg[ERRLEN];
    uint64_t *res;
    size_t nres;
    uint64_t t_done;
    int seq; /* the order callbacks came in, over all nodes */
    int forces;
    char fheap[300], finc[300];
    int fdone, fstatus;
    uint64_t receivers;
    /* a delayed contribution */
    uv_timer_t delay;
    int delay_init;
    uint64_t d_cnum;
    uint32_t d_world, d_timeout;
    uint32_t d_ranks[8];
    size_t d_nranks;
    uint64_t *d_offs;
    size_t d_n;
} node;

static node N[NNODES];
static char url[64];
static int done_seq;
/* Issue 33 item 1: two cluster keys (files, mode 0600) and the warnings. */
static char key_dir[64], key1[128], key2[128];
static int nwarn;
static char warned[1024];

static void on_tick(uv_timer_t *t) { (void)t; }

typedef int (*pred_fn)(void *);

static int run_until(pred_fn pred, void *arg, uint32_t ms)
{
    uint64_t end = now_ms() + ms;
    uv_timer_start(&tick, on_tick, 2, 2);
    while (!pred(arg) && now_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&tick);
    return pred(arg);
}

static int never(void *arg)
{
    (void)arg;
    return 0;
}

static void run_for(uint32_t ms) { run_until(never, NULL, ms); }

static int nodes_done(void *arg)
{
    int k = *(int *)arg;
    for (int i = 0; i < k; i++)
        if (!N[i].done)
            return 0;
    return 1;
}

static int node_done(void *arg) { return ((node *)arg)->done > 0; }

static int nodes_ready(void *arg)
{
    int k = *(int *)arg;
    for (int i = 0; i < k; i++)
        if (!hd_store_ready(N[i].s))
            return 0;
    return 1;
}

static void on_collect(void *arg, int status, const char *errmsg, const uint64_t *offs, size_t n)
{
    node *nd = arg;
    nd->done++;
    nd->status = status;
    nd->t_done = now_ms();
    nd->seq = ++done_seq;
    snprintf(nd->msg, sizeof nd->msg, "%s", errmsg ? errmsg : "");
    free(nd->res);
    nd->res = NULL;
    nd->nres = n;
    if (status == 0) {
        ck_assert_ptr_null(errmsg);
        nd->res = malloc((n ? n : 1) * sizeof *nd->res);
        ck_assert_ptr_nonnull(nd->res);
        if (n)
            memcpy(nd->res, offs, n * sizeof *offs);
    } else {
        ck_assert_ptr_nonnull(errmsg);
        ck_assert_uint_eq(n, 0);
    }
}

static void on_force(void *arg, const char *heap, const char *inc)
{
    node *nd = arg;
    nd->forces++;
    snprintf(nd->fheap, sizeof nd->fheap, "%s", heap);
    snprintf(nd->finc, sizeof nd->finc, "%s", inc);
}

static void on_force_done(void *arg, int status, const char *errmsg, uint64_t receivers)
{
    node *nd = arg;
    nd->fdone++;
    nd->fstatus = status;
    nd->receivers = receivers;
    snprintf(nd->msg, sizeof nd->msg, "%s", errmsg ? errmsg : "");
}

static void open_node(int i, const char *u)
{
    char err[ERRLEN];
    snprintf(N[i].name, sizeof N[i].name, "n%d", i);
    ck_assert_msg(hd_store_open(&loop, u, N[i].name, &N[i].s, err, sizeof err) == 0, "open: %s", err);
    hd_store_on_force(N[i].s, on_force, &N[i]);
}

static void open_nodes(int k)
{
    for (int i = 0; i < k; i++)
        open_node(i, url);
    ck_assert_msg(run_until(nodes_ready, &k, 5000), "stores did not connect to Redis at %s", url);
}

static void reset_node(node *nd)
{
    nd->done = 0;
    nd->status = 1;
    nd->msg[0] = 0;
    free(nd->res);
    nd->res = NULL;
    nd->nres = 0;
}

static void collect(int i, uint64_t cnum, uint32_t world, const uint32_t *ranks, size_t nranks, const uint64_t *offs,
                    size_t n, uint32_t timeout_ms, const char *heap)
{
    char err[ERRLEN];
    reset_node(&N[i]);
    ck_assert_msg(hd_store_collect(N[i].s, heap, "inc-1", cnum, world, ranks, nranks, offs, n, timeout_ms, 60,
                                   on_collect, &N[i], err, sizeof err) == 0,
                  "collect on %s: %s", N[i].name, err);
    ck_assert_int_eq(N[i].done, 0); /* never from inside the call */
}

static void setup(void)
{
    memset(N, 0, sizeof N);
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    uv_timer_init(&loop, &tick);
    redis_start();
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", redis_port);
}

static void teardown(void)
{
    for (int i = 0; i < NNODES; i++) {
        if (N[i].s)
            hd_store_close(N[i].s);
        N[i].s = NULL;
        if (N[i].delay_init)
            uv_close((uv_handle_t *)&N[i].delay, NULL);
        N[i].delay_init = 0;
        free(N[i].res);
        free(N[i].d_offs);
        N[i].res = NULL;
        N[i].d_offs = NULL;
    }
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0); /* every handle of the store closed */
    redis_kill(SIGTERM);
}

/* Sorted, unique intersection of a and b (both sorted, unique). */
static size_t isect(const uint64_t *a, size_t na, const uint64_t *b, size_t nb, uint64_t *out)
{
    size_t i = 0, j = 0, k = 0;
    while (i < na && j < nb) {
        if (a[i] < b[j])
            i++;
        else if (a[i] > b[j])
            j++;
        else
            out[k++] = a[i], i++, j++;
    }
    return k;
}

static void expect_result(int i, const uint64_t *want, size_t nwant)
{
    ck_assert_msg(N[i].done == 1, "%s: callback called %d times", N[i].name, N[i].done);
    ck_assert_msg(N[i].status == 0, "%s: %s", N[i].name, N[i].msg);
    ck_assert_msg(N[i].nres == nwant, "%s: %zu offsets, want %zu", N[i].name, N[i].nres, nwant);
    for (size_t k = 0; k < nwant; k++)
        ck_assert_msg(N[i].res[k] == want[k], "%s: offset %zu is %" PRIu64 ", want %" PRIu64, N[i].name, k, N[i].res[k],
                      want[k]);
}

static void counters(int i, uint64_t *cmd, uint64_t *msg) { hd_store_counters(N[i].s, cmd, msg); }

/* One collect of k nodes: one command each, and one more (the signed
 * PUBLISH of the result, issue 33 item 1) from the node that completed it. */
static void expect_one_collect(const uint64_t *c0, const uint64_t *c1, int k)
{
    uint64_t sum = 0;
    for (int i = 0; i < k; i++) {
        ck_assert_msg(c1[i] - c0[i] >= 1 && c1[i] - c0[i] <= 2, "%s sent %" PRIu64 " commands for one collect",
                      N[i].name, c1[i] - c0[i]);
        sum += c1[i] - c0[i];
    }
    ck_assert_uint_eq(sum, (uint64_t)k + 1);
}

/* ---- tests --------------------------------------------------------------- */

START_TEST(t_three_nodes_intersection)
{
    static const uint32_t r0[] = {0, 3}, r1[] = {1, 4}, r2[] = {2, 5};
    /* values above 2^53 and near 2^64 check that byte order is numeric order */
    const uint64_t big = (uint64_t)1 << 60, top = UINT64_MAX - 7;
    const uint64_t s0[] = {0, 64, 128, 192, 256, (uint64_t)1 << 40, big, top};
    const uint64_t s1[] = {64, 128, 256, 4096, (uint64_t)1 << 40, big + 512, top};
    const uint64_t s2[] = {64, 128, 256, 8192, (uint64_t)1 << 40, big, big + 512, top};
    const uint64_t want[] = {64, 128, 256, (uint64_t)1 << 40, top};
    uint64_t c0[NNODES], m0[NNODES], c1[NNODES], m1[NNODES], msgs = 0;
    int k = NNODES;

    open_nodes(NNODES);
    for (int i = 0; i < NNODES; i++)
        counters(i, &c0[i], &m0[i]);
    collect(0, 1, 6, r0, 2, s0, 8, 5000, "job");
    collect(1, 1, 6, r1, 2, s1, 7, 5000, "job");
    collect(2, 1, 6, r2, 2, s2, 8, 5000, "job");
    ck_assert(run_until(nodes_done, &k, 5000));
    for (int i = 0; i < NNODES; i++) {
        expect_result(i, want, 5);
        counters(i, &c1[i], &m1[i]);
        ck_assert_uint_le(m1[i] - m0[i], 1);
        msgs += m1[i] - m0[i];
    }
    expect_one_collect(c0, c1, NNODES);
    /* every node but the one that completed it got one message */
    ck_assert_uint_eq(msgs, NNODES - 1);
    printf("3 nodes: 1 command per node per collect (+1 publish), %" PRIu64 " messages in all\n", msgs);
}
END_TEST

START_TEST(t_latency)
{
    /* Not a benchmark (bench/ has those): a figure for the log, and a check
     * that back-to-back collects keep costing one command per node. */
    static const uint32_t r[NNODES][2] = {{0, 1}, {2, 3}, {4, 5}};
    enum { ROUNDS = 200, NOFF = 1000 };
    uint64_t *offs = malloc(NOFF * sizeof *offs), c0[NNODES], c1[NNODES], t0, m0, m1, mm;
    int k = NNODES;

    for (size_t i = 0; i < NOFF; i++)
        offs[i] = i * 4096;
    open_nodes(NNODES);
    for (int i = 0; i < NNODES; i++)
        counters(i, &c0[i], NULL);
    hd_store_counters(N[0].s, NULL, &m0);
    t0 = now_ms();
    for (uint64_t round = 1; round <= ROUNDS; round++) {
        for (int i = 0; i < NNODES; i++)
            collect(i, round, 6, r[i], 2, offs, NOFF, 5000, "lat");
        ck_assert(run_until(nodes_done, &k, 5000));
        for (int i = 0; i < NNODES; i++)
            ck_assert_uint_eq(N[i].nres, NOFF);
    }
    printf("latency: 3 nodes x %d offsets, %d collects: %.2f ms per collect\n", NOFF, ROUNDS,
           (double)(now_ms() - t0) / ROUNDS);
    hd_store_counters(N[0].s, NULL, &m1);
    mm = m1 - m0;
    {
        uint64_t sum = 0;
        for (int i = 0; i < NNODES; i++) {
            counters(i, &c1[i], NULL);
            ck_assert_uint_ge(c1[i] - c0[i], ROUNDS);
            sum += c1[i] - c0[i];
        }
        ck_assert_uint_eq(sum, (uint64_t)ROUNDS * (NNODES + 1)); /* + the completer's publish */
    }
    ck_assert_uint_le(mm, ROUNDS);
    free(offs);
}
END_TEST

static void on_delay(uv_timer_t *t)
{
    node *nd = t->data;
    collect((int)(nd - N), nd->d_cnum, nd->d_world, nd->d_ranks, nd->d_nranks, nd->d_offs, nd->d_n, nd->d_timeout,
            "job");
}

START_TEST(t_any_order)
{
    /* Ranks interleaved over the nodes; node i arrives after a random delay,
     * in every order; random candidate sets (one unsorted, with duplicates). */
    static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    uint64_t *sets[NNODES], *ref, *tmp;
    size_t nset[NNODES], nref;
    uint64_t c0[NNODES], c1[NNODES];
    int k = NNODES;

    uint64_t rs = 12345;
    open_nodes(NNODES);
    ref = malloc(400 * sizeof *ref);
    tmp = malloc(400 * sizeof *tmp);
    for (int i = 0; i < NNODES; i++) {
        sets[i] = malloc(400 * sizeof *sets[i]);
        uv_timer_init(&loop, &N[i].delay);
        N[i].delay.data = &N[i];
        N[i].delay_init = 1;
    }
    for (int round = 0; round < 24; round++) {
        const int *perm = perms[round % 6];
        for (int i = 0; i < NNODES; i++) {
            size_t n = 0;
            int density = 20 + (int)cku_rng_below(&rs, 80);
            for (uint64_t v = 0; v < 300; v++)
                if ((int)cku_rng_below(&rs, 100) < density)
                    sets[i][n++] = v * 4096;
            if (round % 5 == 4 && i == 1)
                n = 0; /* an empty set now and then */
            nset[i] = n;
            counters(i, &c0[i], NULL);
        }
        nref = nset[0];
        memcpy(ref, sets[0], nref * sizeof *ref);
        for (int i = 1; i < NNODES; i++) {
            nref = isect(ref, nref, sets[i], nset[i], tmp);
            memcpy(ref, tmp, nref * sizeof *ref);
        }
        for (int j = 0; j < NNODES; j++) {
            int i = perm[j];
            node *nd = &N[i];
            reset_node(nd);
            nd->d_cnum = (uint64_t)round + 100;
            nd->d_world = 6;
            nd->d_nranks = 2;
            nd->d_ranks[0] = (uint32_t)i;
            nd->d_ranks[1] = (uint32_t)(i + 3);
            nd->d_timeout = 5000;
            free(nd->d_offs);
            nd->d_offs = malloc((nset[i] * 2 + 1) * sizeof *nd->d_offs);
            memcpy(nd->d_offs, sets[i], nset[i] * sizeof *sets[i]);
            nd->d_n = nset[i];
            if (i == 2 && nset[i] > 2) {
                /* unsorted, with duplicates: the store sorts a copy */
                memcpy(nd->d_offs + nset[i], sets[i], 2 * sizeof *sets[i]);
                nd->d_n = nset[i] + 2;
                for (size_t a = 0; a < nd->d_n / 2; a++) {
                    uint64_t t = nd->d_offs[a];
                    nd->d_offs[a] = nd->d_offs[nd->d_n - 1 - a];
                    nd->d_offs[nd->d_n - 1 - a] = t;
                }
            }
            uv_timer_start(&nd->delay, on_delay, (uint64_t)(j * cku_rng_below(&rs, 15)), 0);
        }
        ck_assert(run_until(nodes_done, &k, 5000));
        for (int i = 0; i < NNODES; i++) {
            expect_result(i, ref, nref);
            counters(i, &c1[i], NULL);
        }
        expect_one_collect(c0, c1, NNODES);
    }
    for (int i = 0; i < NNODES; i++)
        free(sets[i]);
    free(ref);
    free(tmp);
}
END_TEST

START_TEST(t_empty)
{
    static const uint32_t r[NNODES][1] = {{0}, {1}, {2}};
    const uint64_t a[] = {8, 16}, b[] = {24, 32};
    int k = NNODES;

    open_nodes(NNODES);
    /* disjoint sets */
    collect(0, 1, 3, r[0], 1, a, 2, 5000, "job");
    collect(1, 1, 3, r[1], 1, b, 2, 5000, "job");
    collect(2, 1, 3, r[2], 1, a, 2, 5000, "job");
    ck_assert(run_until(nodes_done, &k, 5000));
    for (int i = 0; i < NNODES; i++)
        expect_result(i, NULL, 0);
    /* one node with nothing; then every node with nothing */
    collect(0, 2, 3, r[0], 1, a, 2, 5000, "job");
    collect(1, 2, 3, r[1], 1, NULL, 0, 5000, "job");
    collect(2, 2, 3, r[2], 1, a, 2, 5000, "job");
    ck_assert(run_until(nodes_done, &k, 5000));
    for (int i = 0; i < NNODES; i++)
        expect_result(i, NULL, 0);
    for (int i = 0; i < NNODES; i++)
        collect(i, 3, 3, r[i], 1, NULL, 0, 5000, "job");
    ck_assert(run_until(nodes_done, &k, 5000));
    for (int i = 0; i < NNODES; i++)
        expect_result(i, NULL, 0);
}
END_TEST

static void open_node_key(int i, const char *keyfile);

START_TEST(t_large)
{
    enum { L = 100000 };
    static const uint32_t r[NNODES][2] = {{0, 1}, {2, 3}, {4, 5}};
    uint64_t *s[NNODES], *want, *tmp;
    size_t n[NNODES], nw;
    uint64_t c0[NNODES], c1[NNODES], t0;
    int k = NNODES;

    /* signed (issue 33 item 1): the big result's note and its fetched pieces are checked */
    for (int i = 0; i < NNODES; i++)
        open_node_key(i, key1);
    ck_assert(run_until(nodes_ready, &k, 5000));
    for (int i = 0; i < NNODES; i++) {
        s[i] = malloc(L * sizeof *s[i]);
        n[i] = 0;
        for (uint64_t v = 0; n[i] < L; v++)
            if (i == 0 || v % (uint64_t)(i + 6) != 0) /* each drops a different residue */
                s[i][n[i]++] = v * 512;
        counters(i, &c0[i], NULL);
    }
    want = malloc(L * sizeof *want);
    tmp = malloc(L * sizeof *tmp);
    nw = isect(s[0], n[0], s[1], n[1], tmp);
    nw = isect(tmp, nw, s[2], n[2], want);
    t0 = now_ms();
    for (int i = 0; i < NNODES; i++)
        collect(i, 1, 6, r[i], 2, s[i], n[i], 20000, "big");
    ck_assert(run_until(nodes_done, &k, 20000));
    printf("large: 3 nodes x %d offsets -> %zu in common, %" PRIu64 " ms\n", L, nw, now_ms() - t0);
    for (int i = 0; i < NNODES; i++) {
        expect_result(i, want, nw);
        counters(i, &c1[i], NULL);
        /* staged in pieces (issue 33 item 5), then the commit */
        ck_assert_uint_ge(c1[i] - c0[i], 1 + (L + HD_STORE_PIECE - 1) / HD_STORE_PIECE);
    }
    ck_assert_uint_gt(nw, L / 2);
    for (int i = 0; i < NNODES; i++)
        free(s[i]);
    free(want);
    free(tmp);
}
END_TEST

START_TEST(t_timeout)
{
    static const uint32_t r[NNODES][2] = {{0, 1}, {2, 3}, {4, 5}};
    const uint64_t a[] = {512, 1024};
    const char *want = "collect 7 of heap \"job\" timed out after 600 ms: rank(s) 4, 5 never arrived "
                       "(nodes seen: n0, n1)";
    uint64_t c0[NNODES], c1[NNODES], t0;
    int k = 2;

    open_nodes(NNODES);
    for (int i = 0; i < NNODES; i++)
        counters(i, &c0[i], NULL);
    t0 = now_ms();
    collect(0, 7, 6, r[0], 2, a, 2, 600, "job");
    run_for(50); /* n0 arrives first: "nodes seen" is in arrival order */
    collect(1, 7, 6, r[1], 2, a, 2, 3000, "job");
    ck_assert(run_until(nodes_done, &k, 600 + HD_STORE_GRACE_MS + 1000));
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(N[i].done, 1);
        ck_assert_int_lt(N[i].status, 0);
        ck_assert_msg(!strcmp(N[i].msg, want), "%s got \"%s\"", N[i].name, N[i].msg);
        /* n0 times out at 600 ms; n1 learns it then, long before its own 3000 */
        ck_assert_uint_ge(N[i].t_done - t0 + 2, 600);
        ck_assert_uint_lt(N[i].t_done - t0, 3000); /* n1: before its own 3000 ms timeout */
    }
    printf("timeout: \"%s\" on n0 after %" PRIu64 " ms, on n1 after %" PRIu64 " ms\n", N[0].msg, N[0].t_done - t0,
           N[1].t_done - t0);
    /* the late node sees the failure at once */
    t0 = now_ms();
    collect(2, 7, 6, r[2], 2, a, 2, 5000, "job");
    ck_assert(run_until(node_done, &N[2], 2000));
    ck_assert_int_lt(N[2].status, 0);
    ck_assert_str_eq(N[2].msg, want);
    ck_assert_uint_lt(N[2].t_done - t0, 2500); /* at once, not at its 5 s timeout */
    for (int i = 0; i < NNODES; i++)
        counters(i, &c1[i], NULL);
    ck_assert_uint_eq(c1[0] - c0[0], 3); /* the collect, the timeout's decision + lookup, its publish */
    ck_assert_uint_eq(c1[1] - c0[1], 1);
    ck_assert_uint_eq(c1[2] - c0[2], 1);

    /* Both waiting nodes time out at about the same time: one message. */
    collect(0, 8, 6, r[0], 2, a, 2, 400, "job");
    collect(1, 8, 6, r[1], 2, a, 2, 400, "job");
    ck_assert(run_until(nodes_done, &k, 400 + HD_STORE_GRACE_MS + 1000));
    ck_assert_int_lt(N[0].status, 0);
    ck_assert_str_eq(N[0].msg, N[1].msg);
    ck_assert_msg(strstr(N[0].msg, "rank(s) 4, 5 never arrived"), "%s", N[0].msg);
}
END_TEST

START_TEST(t_timeout_redis_stopped)
{
    /* Redis stops answering (SIGSTOP): the callback still comes, by the
     * timeout plus the grace period. */
    static const uint32_t r0[] = {0};
    uint64_t t0;

    open_nodes(1);
    t0 = now_ms();
    collect(0, 1, 2, r0, 1, NULL, 0, 300, "job");
    run_for(50);
    kill(redis_pid, SIGSTOP);
    ck_assert(run_until(node_done, &N[0], 300 + HD_STORE_GRACE_MS + 1000));
    kill(redis_pid, SIGCONT);
    ck_assert_int_lt(N[0].status, 0);
    ck_assert_msg(strstr(N[0].msg, "timed out after 300 ms") && strstr(N[0].msg, "did not answer"), "%s", N[0].msg);
    ck_assert_uint_lt(N[0].t_done - t0, 300 + HD_STORE_GRACE_MS + 1000); /* + slack for a loaded machine */
    printf("redis stopped: \"%s\" after %" PRIu64 " ms\n", N[0].msg, N[0].t_done - t0);
}
END_TEST

START_TEST(t_codes)
{
    static const uint32_t r[NNODES][2] = {{0, 1}, {2, 3}, {4, 5}};
    const uint64_t a[] = {512};
    static const int codes[] = {HD_STORE_EGONE, HD_STORE_EASYM, HD_STORE_ETIMEOUT, HD_STORE_EFAIL};
    int k = 2;

    open_nodes(NNODES);
    /* A timeout reaches every waiting node as HD_STORE_ETIMEOUT. */
    collect(0, 1, 6, r[0], 2, a, 1, 300, "job");
    collect(1, 1, 6, r[1], 2, a, 1, 3000, "job");
    ck_assert(run_until(nodes_done, &k, 300 + HD_STORE_GRACE_MS + 1000));
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(N[i].status, HD_STORE_ETIMEOUT);
        ck_assert_msg(!strncmp(N[i].msg, "collect 1 of heap", 17) && strstr(N[i].msg, "rank(s) 4, 5 never arrived"),
                      "%s", N[i].msg);
    }
    /* An abort's code reaches the other nodes with its message, as it was. */
    for (int c = 0; c < 4; c++) {
        k = 1;
        collect(0, 2 + (uint64_t)c, 6, r[0], 2, a, 1, 10000, "job");
        run_for(50);
        ck_assert_int_eq(
            hd_store_collect_abort_code(N[2].s, "job", "inc-1", 2 + (uint64_t)c, codes[c], "rank 4 went away"), 0);
        ck_assert(run_until(nodes_done, &k, 2000));
        ck_assert_int_eq(N[0].status, codes[c]);
        ck_assert_str_eq(N[0].msg, "rank 4 went away");
    }
}
END_TEST

START_TEST(t_abort)
{
    static const uint32_t r[NNODES][2] = {{0, 1}, {2, 3}, {4, 5}};
    const uint64_t a[] = {512};
    const char *msg = "rank 5 (pid 4242) died during collect 3 of heap \"job\"";
    uint64_t t0, c0, c1;
    int k = 1;

    open_nodes(NNODES);
    /* n0 waits; n2 (whose rank died) aborts; n0 hears it; n1 comes late */
    collect(0, 3, 6, r[0], 2, a, 1, 10000, "job");
    run_for(50);
    t0 = now_ms();
    ck_assert_int_eq(hd_store_collect_abort(N[2].s, "job", "inc-1", 3, msg), 0);
    ck_assert(run_until(nodes_done, &k, 2000));
    ck_assert_int_lt(N[0].status, 0);
    ck_assert_str_eq(N[0].msg, msg);
    ck_assert_uint_lt(N[0].t_done - t0, 5000); /* at once, not at the 10 s timeout */
    t0 = now_ms();
    collect(1, 3, 6, r[1], 2, a, 1, 10000, "job");
    ck_assert(run_until(node_done, &N[1], 2000));
    ck_assert_int_lt(N[1].status, 0);
    ck_assert_str_eq(N[1].msg, msg);
    ck_assert_uint_lt(N[1].t_done - t0, 5000);

    /* A node aborts a collect it had contributed to: its own callback gets
     * the message too, and so does every other waiting node. */
    k = 3;
    counters(2, &c0, NULL);
    collect(0, 4, 6, r[0], 2, a, 1, 10000, "job");
    collect(2, 4, 6, r[2], 2, a, 1, 10000, "job");
    run_for(50);
    ck_assert_int_eq(hd_store_collect_abort(N[2].s, "job", "inc-1", 4, "rank 4 died"), 0);
    k = 1;
    ck_assert(run_until(nodes_done, &k, 2000));
    ck_assert(run_until(node_done, &N[2], 2000));
    ck_assert_str_eq(N[0].msg, "rank 4 died");
    ck_assert_str_eq(N[2].msg, "rank 4 died");
    ck_assert_int_eq(N[2].done, 1);
    counters(2, &c1, NULL);
    ck_assert_uint_eq(c1 - c0, 3); /* contribute + abort + its publish */

    /* Abort before contributing: the callback comes without a round trip. */
    collect(1, 5, 6, r[1], 2, a, 1, 10000, "job");
    ck_assert_int_eq(hd_store_collect_abort(N[1].s, "job", "inc-1", 5, "rank 2 died"), 0);
    ck_assert_int_eq(N[1].done, 0);
    ck_assert(run_until(node_done, &N[1], 2000));
    ck_assert_str_eq(N[1].msg, "rank 2 died");
    /* ...and the others see it when they come */
    collect(0, 5, 6, r[0], 2, a, 1, 10000, "job");
    ck_assert(run_until(node_done, &N[0], 2000));
    ck_assert_str_eq(N[0].msg, "rank 2 died");
}
END_TEST

START_TEST(t_redis_killed)
{
    static const uint32_t r[NNODES][2] = {{0, 1}, {2, 3}, {4, 5}};
    const uint64_t a[] = {512, 4096};
    char port[32];
    uint64_t t0, c0[NNODES], c1[NNODES];
    int k = 2;

    open_nodes(NNODES);
    snprintf(port, sizeof port, "127.0.0.1:%d", redis_port);
    collect(0, 1, 6, r[0], 2, a, 2, 10000, "job");
    collect(1, 1, 6, r[1], 2, a, 2, 10000, "job");
    run_for(50);
    t0 = now_ms();
    redis_kill(SIGKILL);
    ck_assert(run_until(nodes_done, &k, 3000));
    for (int i = 0; i < 2; i++) {
        ck_assert_int_lt(N[i].status, 0);
        ck_assert_msg(strstr(N[i].msg, port) && strstr(N[i].msg, "heapd retries the connection at the next collect"),
                      "%s", N[i].msg);
        ck_assert_uint_lt(N[i].t_done - t0, 5000); /* at once, not at the 10 s timeout */
    }
    printf("redis killed: \"%s\" after %" PRIu64 " ms\n", N[0].msg, N[0].t_done - t0);

    /* Redis down: a collect fails at once, naming it. */
    t0 = now_ms();
    collect(2, 1, 6, r[2], 2, a, 2, 10000, "job");
    ck_assert(run_until(node_done, &N[2], 3000));
    ck_assert_int_lt(N[2].status, 0);
    ck_assert_msg(strstr(N[2].msg, "is unreachable: Connection refused") && strstr(N[2].msg, port), "%s", N[2].msg);
    ck_assert_uint_lt(N[2].t_done - t0, 5000);
    printf("redis down: \"%s\" after %" PRIu64 " ms\n", N[2].msg, N[2].t_done - t0);

    /* Redis back (empty): the next collect reconnects and works. */
    redis_restart();
    k = NNODES;
    for (int i = 0; i < NNODES; i++)
        counters(i, &c0[i], NULL);
    for (int i = 0; i < NNODES; i++)
        collect(i, 2, 6, r[i], 2, a, 2, 10000, "job");
    ck_assert(run_until(nodes_done, &k, 5000));
    for (int i = 0; i < NNODES; i++) {
        expect_result(i, a, 2);
        counters(i, &c1[i], NULL);
        ck_assert(hd_store_ready(N[i].s));
    }
    expect_one_collect(c0, c1, NNODES);
}
END_TEST

START_TEST(t_keys_ttl)
{
    static const uint32_t r[2][1] = {{0}, {1}};
    const uint64_t a[] = {512};
    const char *ks = "heapd:a%3Ab%20c:inc-1:c9:s", *kr = "heapd:a%3Ab%20c:inc-1:c9:r";
    redisContext *c;
    redisReply *rep;
    long long ttl;
    int k = 2;

    open_nodes(2);
    c = redis_sync();
    /* a heap name with ':' and ' ' is escaped in the keys */
    collect(0, 9, 2, r[0], 1, a, 1, 5000, "a:b c");
    run_for(100);
    ttl = redis_int(c, "TTL %s", ks);
    ck_assert_msg(ttl > 0 && ttl <= 60, "TTL of %s while waiting: %lld", ks, ttl);
    ttl = redis_int(c, "TTL %s", kr);
    ck_assert_msg(ttl > 0 && ttl <= 60, "TTL of %s while waiting: %lld", kr, ttl);
    collect(1, 9, 2, r[1], 1, a, 1, 5000, "a:b c");
    ck_assert(run_until(nodes_done, &k, 5000));
    expect_result(0, a, 1);
    expect_result(1, a, 1);
    /* completed: the bitmap and the set are gone, a small marker expires */
    ck_assert_int_eq(redis_int(c, "EXISTS %s", kr), 0);
    ttl = redis_int(c, "TTL %s", ks);
    ck_assert_msg(ttl > 0 && ttl <= 60, "TTL of %s after completion: %lld", ks, ttl);
    ck_assert_int_eq(redis_int(c, "HEXISTS %s set", ks), 0);
    rep = redisCommand(c, "KEYS heapd:*");
    ck_assert_ptr_nonnull(rep);
    ck_assert_int_eq(rep->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < rep->elements; i++) {
        ttl = redis_int(c, "TTL %s", rep->element[i]->str);
        ck_assert_msg(ttl > 0, "key %s has no expiry (TTL %lld)", rep->element[i]->str, ttl);
    }
    ck_assert_uint_eq(rep->elements, 1);
    freeReplyObject(rep);
    /* an abort's keys expire too */
    ck_assert_int_eq(hd_store_collect_abort(N[0].s, "a:b c", "inc-1", 10, "rank 0 died"), 0);
    run_for(200);
    ttl = redis_int(c, "TTL %s", "heapd:a%3Ab%20c:inc-1:c10:s");
    ck_assert_msg(ttl > 0 && ttl <= HD_STORE_ABORT_TTL_S, "TTL of the aborted collect's key: %lld", ttl);
    redisFree(c);
}
END_TEST

START_TEST(t_force)
{
    char err[ERRLEN];
    int k = NNODES;
    open_nodes(NNODES);
    ck_assert_int_eq(hd_store_publish_force_cb(N[1].s, "job", "inc-7", 2000, on_force_done, &N[1], err, sizeof err), 0);
    ck_assert_int_eq(N[1].fdone, 0);
    {
        uint64_t end = now_ms() + 3000;
        while (now_ms() < end) {
            int all = N[1].fdone == 1;
            for (int i = 0; i < NNODES; i++)
                all &= N[i].forces == 1;
            if (all)
                break;
            run_for(10);
        }
    }
    ck_assert_int_eq(N[1].fdone, 1);
    ck_assert_int_eq(N[1].fstatus, 0);
    ck_assert_uint_eq(N[1].receivers, NNODES);
    for (int i = 0; i < NNODES; i++) {
        ck_assert_int_eq(N[i].forces, 1);
        ck_assert_str_eq(N[i].fheap, "job");
        ck_assert_str_eq(N[i].finc, "inc-7");
    }
    /* the plain variant; a heap name with ':' and digits */
    ck_assert_int_eq(hd_store_publish_force(N[0].s, "12:x y", "i:2", err, sizeof err), 0);
    run_for(300);
    for (int i = 0; i < NNODES; i++) {
        ck_assert_int_eq(N[i].forces, 2);
        ck_assert_str_eq(N[i].fheap, "12:x y");
        ck_assert_str_eq(N[i].finc, "i:2");
    }

    /* Redis restarts: hd_store_connect resubscribes without a collect, and
     * force requests reach every node again. */
    redis_restart();
    run_for(100);
    for (int i = 0; i < NNODES; i++)
        hd_store_connect(N[i].s);
    ck_assert(run_until(nodes_ready, &k, 5000));
    N[2].fdone = 0;
    ck_assert_int_eq(hd_store_publish_force_cb(N[2].s, "job", "inc-8", 2000, on_force_done, &N[2], err, sizeof err), 0);
    {
        uint64_t end = now_ms() + 3000;
        while (now_ms() < end && !(N[2].fdone && N[0].forces == 3 && N[1].forces == 3 && N[2].forces == 3))
            run_for(10);
    }
    ck_assert_int_eq(N[2].fdone, 1);
    ck_assert_uint_eq(N[2].receivers, NNODES);
    for (int i = 0; i < NNODES; i++) {
        ck_assert_int_eq(N[i].forces, 3);
        ck_assert_str_eq(N[i].finc, "inc-8");
    }
}
END_TEST

START_TEST(t_script_flush)
{
    /* The script cache is flushed (SCRIPT FLUSH, or a Redis that evicts
     * scripts): EVALSHA gets NOSCRIPT and the store sends the script again. */
    static const uint32_t r[2][1] = {{0}, {1}};
    const uint64_t a[] = {512, 1024};
    uint64_t c0[2], c1[2];
    redisContext *c;
    redisReply *rep;
    int k = 2;

    open_nodes(2);
    for (uint64_t round = 1; round <= 3; round++) {
        if (round == 2) {
            c = redis_sync();
            rep = redisCommand(c, "SCRIPT FLUSH");
            ck_assert_ptr_nonnull(rep);
            freeReplyObject(rep);
            redisFree(c);
        }
        for (int i = 0; i < 2; i++)
            counters(i, &c0[i], NULL);
        for (int i = 0; i < 2; i++)
            collect(i, round, 2, r[i], 1, a, 2, 5000, "job");
        ck_assert(run_until(nodes_done, &k, 5000));
        uint64_t sum = 0;
        for (int i = 0; i < 2; i++) {
            expect_result(i, a, 2);
            counters(i, &c1[i], NULL);
            sum += c1[i] - c0[i];
        }
        /* round 1 is EVAL; round 2 is EVALSHA -> NOSCRIPT -> EVAL; + the publish */
        ck_assert_uint_eq(sum, round == 2 ? 5 : 3);
    }
}
END_TEST

START_TEST(t_close_pending)
{
    static const uint32_t r0[] = {0};
    char err[ERRLEN];
    open_nodes(2);
    collect(0, 1, 2, r0, 1, NULL, 0, 10000, "job");
    run_for(50);
    ck_assert_int_eq(hd_store_publish_force_cb(N[1].s, "job", "x", 5000, on_force_done, &N[1], err, sizeof err), 0);
    hd_store_close(N[0].s);
    N[0].s = NULL;
    ck_assert_int_eq(N[0].done, 1); /* called inside close */
    ck_assert_msg(strstr(N[0].msg, "heapd is stopping"), "%s", N[0].msg);
    hd_store_close(N[1].s);
    N[1].s = NULL;
    ck_assert_int_eq(N[1].fdone, 1);
    ck_assert_int_lt(N[1].fstatus, 0);
    ck_assert_msg(strstr(N[1].msg, "heapd is stopping"), "%s", N[1].msg);
}
END_TEST

START_TEST(t_args)
{
    char err[ERRLEN];
    hd_store *s = NULL;
    static const uint32_t r0[] = {0}, r9[] = {9};

    ck_assert_int_ne(hd_store_open(&loop, "http://x", "n0", &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "redis://"), "%s", err);
    /* Credentials (issue 33 item 1): a password in the URL opens; a user
     * without one needs store_credentials; the file must be its owner's only. */
    ck_assert_int_eq(hd_store_open(&loop, "redis://:pw@h:1", "n0", &s, err, sizeof err), 0);
    ck_assert_str_eq(hd_store_url(s), "redis://h:1");
    hd_store_close(s);
    ck_assert_int_ne(hd_store_open(&loop, "redis://u@h:1", "n0", &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "store_credentials"), "%s", err);
    ck_assert_int_ne(hd_store_open(&loop, "redis://@h:1", "n0", &s, err, sizeof err), 0);
    {
        char path[] = "/tmp/check_store_cred.XXXXXX", user[128], pass[256];
        int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, "heapd pw1\n", 10), 10);
        close(fd);
        ck_assert_int_eq(hd_store_check_credentials(path, user, sizeof user, pass, sizeof pass, err, sizeof err), 0);
        ck_assert_str_eq(user, "heapd");
        ck_assert_str_eq(pass, "pw1");
        hd_store_opts o = {.url = "redis://h:1", .node = "n0", .credentials = path};
        ck_assert_int_eq(hd_store_open_opts(&loop, &o, &s, err, sizeof err), 0);
        hd_store_close(s);
        o.url = "redis://other@h:1";
        ck_assert_int_ne(hd_store_open_opts(&loop, &o, &s, err, sizeof err), 0);
        ck_assert_msg(strstr(err, "names user"), "%s", err);
        o.url = "redis://:x@h:1";
        ck_assert_int_ne(hd_store_open_opts(&loop, &o, &s, err, sizeof err), 0);
        ck_assert_msg(strstr(err, "give it once"), "%s", err);
        ck_assert_int_eq(chmod(path, 0640), 0);
        ck_assert_int_ne(hd_store_check_credentials(path, user, sizeof user, pass, sizeof pass, err, sizeof err), 0);
        ck_assert_msg(strstr(err, "chmod 0600"), "%s", err);
        ck_assert_int_eq(chmod(path, 0600), 0);
        fd = open(path, O_WRONLY | O_TRUNC);
        ck_assert_int_eq(write(fd, "a b c\n", 6), 6);
        close(fd);
        ck_assert_int_ne(hd_store_check_credentials(path, user, sizeof user, pass, sizeof pass, err, sizeof err), 0);
        unlink(path);
        ck_assert_int_ne(hd_store_check_credentials(path, user, sizeof user, pass, sizeof pass, err, sizeof err), 0);
        ck_assert_msg(strstr(err, "cannot open"), "%s", err);
    }
    ck_assert_int_ne(hd_store_open(&loop, "redis://h:0", "n0", &s, err, sizeof err), 0);
    ck_assert_int_ne(hd_store_open(&loop, "redis://h:1/3", "n0", &s, err, sizeof err), 0);
    ck_assert_int_ne(hd_store_open(&loop, "redis://", "n0", &s, err, sizeof err), 0);
    ck_assert_int_ne(hd_store_open(&loop, url, "bad name", &s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "node name"), "%s", err);
    ck_assert_int_ne(hd_store_open(&loop, url, "", &s, err, sizeof err), 0);
    ck_assert_ptr_null(s);

    ck_assert_int_eq(hd_store_open(&loop, "redis://[::1]", "n0", &s, err, sizeof err), 0);
    ck_assert_str_eq(hd_store_url(s), "redis://[::1]:6379");
    hd_store_close(s);
    ck_assert_int_eq(hd_store_open(&loop, "redis://localhost:7000/", "n0", &s, err, sizeof err), 0);
    ck_assert_str_eq(hd_store_url(s), "redis://localhost:7000");
    hd_store_close(s);

    open_nodes(1);
    ck_assert_str_eq(hd_store_node(N[0].s), "n0");
    ck_assert_int_ne(
        hd_store_collect(N[0].s, "job", "i", 1, 4, r9, 1, NULL, 0, 100, 10, on_collect, &N[0], err, sizeof err), 0);
    ck_assert_msg(strstr(err, "rank 9"), "%s", err);
    ck_assert_int_ne(
        hd_store_collect(N[0].s, "", "i", 1, 4, r0, 1, NULL, 0, 100, 10, on_collect, &N[0], err, sizeof err), 0);
    ck_assert_int_ne(
        hd_store_collect(N[0].s, "job", "i", 1, 4, r0, 0, NULL, 0, 100, 10, on_collect, &N[0], err, sizeof err), 0);
    ck_assert_int_ne(
        hd_store_collect(N[0].s, "job", "i", 1, 4, r0, 1, NULL, 3, 100, 10, on_collect, &N[0], err, sizeof err), 0);
    ck_assert_int_ne(
        hd_store_collect(N[0].s, "job", "i", 1, 4, r0, 1, NULL, 0, 0, 10, on_collect, &N[0], err, sizeof err), 0);
    /* one pending collect per heap incarnation */
    collect(0, 1, 4, r0, 1, NULL, 0, 300, "job");
    ck_assert_int_ne(
        hd_store_collect(N[0].s, "job", "inc-1", 2, 4, r0, 1, NULL, 0, 100, 10, on_collect, &N[0], err, sizeof err), 0);
    ck_assert_msg(strstr(err, "still pending"), "%s", err);
    ck_assert(run_until(node_done, &N[0], 300 + HD_STORE_GRACE_MS + 1000));
    ck_assert_msg(strstr(N[0].msg, "rank(s) 1, 2, 3 never arrived (nodes seen: n0)"), "%s", N[0].msg);
    ck_assert_int_ne(hd_store_collect_abort(N[0].s, "job", "inc-1", 1, ""), 0);
}
END_TEST

START_TEST(t_world_mismatch)
{
    static const uint32_t r0[] = {0}, r1[] = {1};
    int k = 2;
    open_nodes(2);
    collect(0, 1, 3, r0, 1, NULL, 0, 5000, "job");
    run_for(50);
    collect(1, 1, 4, r1, 1, NULL, 0, 5000, "job");
    ck_assert(run_until(nodes_done, &k, 3000));
    ck_assert_str_eq(N[0].msg, N[1].msg);
    ck_assert_msg(strstr(N[0].msg, "node n1 says the heap has 4 ranks but node(s) n0 said 3"), "%s", N[0].msg);
}
END_TEST

START_TEST(t_hostname)
{
    /* "localhost" goes through uv_getaddrinfo (never blocking the loop) */
    static const uint32_t r[2][1] = {{0}, {1}};
    const uint64_t a[] = {4096};
    char u[64];
    int k = 2;
    snprintf(u, sizeof u, "redis://localhost:%d", redis_port);
    open_node(0, u);
    open_node(1, url);
    ck_assert(run_until(nodes_ready, &k, 5000));
    collect(0, 1, 2, r[0], 1, a, 1, 5000, "job");
    collect(1, 1, 2, r[1], 1, a, 1, 5000, "job");
    ck_assert(run_until(nodes_done, &k, 5000));
    expect_result(0, a, 1);
    expect_result(1, a, 1);
}
END_TEST

/* ---- tests without a working Redis --------------------------------------- */

static void on_warn(void *arg, const char *msg)
{
    (void)arg;
    nwarn++;
    snprintf(warned, sizeof warned, "%s", msg);
}

/* Node i with a cluster key file (NULL: none) and the warning callback. */
static void open_node_key(int i, const char *keyfile)
{
    char err[ERRLEN];
    hd_store_opts o = {.url = url, .node = N[i].name, .key_file = keyfile, .warn = on_warn, .warn_arg = &N[i]};
    snprintf(N[i].name, sizeof N[i].name, "n%d", i);
    ck_assert_msg(hd_store_open_opts(&loop, &o, &N[i].s, err, sizeof err) == 0, "open: %s", err);
    ck_assert_int_eq(hd_store_signed(N[i].s), keyfile != NULL);
}

static int warned_once(void *arg)
{
    (void)arg;
    return nwarn > 0;
}

static void publish_raw(redisContext *c, const char *chan, const char *msg, size_t len)
{
    redisReply *rep = redisCommand(c, "PUBLISH %s %b", chan, msg, len);
    ck_assert_ptr_nonnull(rep);
    ck_assert_int_eq(rep->type, REDIS_REPLY_INTEGER);
    ck_assert_int_eq(rep->integer, 1); /* n0 is subscribed */
    freeReplyObject(rep);
}

/* 'R' or 'A', the collect's prefix, '\n', then mac (NULL: the format the
 * script used to publish, without one) and the body. */
static size_t forge(char *out, char kind, const char *prefix, const char *mac, const uint64_t *v, size_t n,
                    const char *text)
{
    size_t at = (size_t)sprintf(out, "%c%s\n%s", kind, prefix, mac ? mac : "");
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++)
            out[at++] = (char)(unsigned char)(v[i] >> (56 - 8 * b));
    if (text)
        at += (size_t)sprintf(out + at, "%s", text);
    return at;
}

START_TEST(t_forged_result)
{
    /* Issue 33 item 1: a program that can reach Redis publishes a forged
     * result (and a forged failure) to a node's channel while that node waits
     * in a cross-node collect. The node drops them, warns, and then gets the
     * genuine result, the same as the other node's: no divergence. Before,
     * the node reclaimed 1024, which n1's rank still held. */
    static const uint32_t r0[] = {0}, r1[] = {1};
    const uint64_t a0[] = {512, 1024, 2048}, a1[] = {512, 2048, 4096}, want[] = {512, 2048};
    const char *prefix = "heapd:job:inc-1:c1", *chan = "heapd:node:n0";
    char msg[512];
    redisContext *c;
    int k = 2;

    for (int i = 0; i < 2; i++)
        open_node_key(i, key1);
    ck_assert(run_until(nodes_ready, &k, 5000));
    c = redis_sync();
    collect(0, 1, 2, r0, 1, a0, 3, 5000, "job");
    for (uint64_t end = now_ms() + 3000; now_ms() < end && !redis_int(c, "EXISTS %s", "heapd:job:inc-1:c1:s");)
        run_for(5);
    ck_assert_int_eq(redis_int(c, "EXISTS %s", "heapd:job:inc-1:c1:s"), 1); /* n0 waits in Redis */
    nwarn = 0;
    publish_raw(c, chan, msg, forge(msg, 'R', prefix, NULL, a0, 3, NULL));
    publish_raw(c, chan, msg, forge(msg, 'R', prefix, "0123456789abcdef0123456789abcdef01234567", a0, 3, NULL));
    publish_raw(c, chan, msg, forge(msg, 'R', prefix, "----------------------------------------", a0, 3, NULL));
    publish_raw(c, chan, msg, forge(msg, 'A', prefix, "0123456789abcdef0123456789abcdef01234567", NULL, 0, "E1:x"));
    ck_assert(run_until(warned_once, NULL, 3000));
    run_for(50);
    ck_assert_msg(N[0].done == 0, "n0 took a forged message: status %d \"%s\", %zu offsets", N[0].status, N[0].msg,
                  N[0].nres);
    ck_assert_msg(strstr(warned, "dropped") && strstr(warned, chan) && strstr(warned, "MAC"), "%s", warned);
    printf("forged: %s\n", warned);
    collect(1, 1, 2, r1, 1, a1, 3, 5000, "job");
    ck_assert(run_until(nodes_done, &k, 5000));
    expect_result(0, want, 2);
    expect_result(1, want, 2);

    /* A node with another key: its result is dropped too, so n0 reports the
     * lost result at its timeout instead of applying an unverified one. */
    hd_store_close(N[1].s);
    open_node_key(1, key2);
    ck_assert(run_until(nodes_ready, &k, 5000));
    collect(0, 2, 2, r0, 1, a0, 3, 500, "job");
    run_for(50);
    collect(1, 2, 2, r1, 1, a1, 3, 5000, "job");
    ck_assert(run_until(nodes_done, &k, 500 + HD_STORE_GRACE_MS + 2000));
    expect_result(1, want, 2);
    ck_assert_int_eq(N[0].status, HD_STORE_ETIMEOUT);
    ck_assert_msg(strstr(N[0].msg, "did not reach this node"), "%s", N[0].msg);
    redisFree(c);
}
END_TEST

static void fill(uint64_t *v, size_t *n, size_t want, unsigned skip)
{
    *n = 0;
    for (uint64_t x = 0; *n < want; x++)
        if (!skip || x % skip)
            v[(*n)++] = x * 512;
}

/* The longest command in SLOWLOG (every command is logged: threshold 0). */
static long long slowest(redisContext *c, char *name, size_t len)
{
    redisReply *rep = redisCommand(c, "SLOWLOG GET 1000000");
    long long most = 0;
    ck_assert_ptr_nonnull(rep);
    for (size_t i = 0; i < rep->elements; i++) {
        redisReply *e = rep->element[i];
        if (e->elements >= 4 && e->element[2]->integer > most) {
            most = e->element[2]->integer;
            snprintf(name, len, "%s", e->element[3]->elements ? e->element[3]->element[0]->str : "?");
        }
    }
    freeReplyObject(rep);
    return most;
}

START_TEST(t_big_interleave)
{
    /* Issue 33 item 5: two nodes collect 400,000 candidates each; another
     * heap's collect issued meanwhile completes first, and no command holds
     * Redis longer than a piece costs (SLOWLOG, every command logged): the
     * script used to intersect every candidate in one call (~0.3 s here). */
    enum { L = 400000 };
    static const uint32_t r0[] = {0}, r1[] = {1};
    const uint64_t small[] = {512, 1024};
    uint64_t *s0 = malloc(L * sizeof *s0), *s1 = malloc(L * sizeof *s1);
    size_t n0, n1;
    char name[64] = "";
    long long most;
    redisContext *c;
    redisReply *rep;
    int k = NNODES;

    open_nodes(NNODES);
    c = redis_sync();
    rep = redisCommand(c, "CONFIG SET slowlog-log-slower-than 0");
    freeReplyObject(rep);
    rep = redisCommand(c, "CONFIG SET slowlog-max-len 1000000");
    freeReplyObject(rep);
    fill(s0, &n0, L, 0);
    fill(s1, &n1, L, 5); /* s1 drops every fifth: the result is s0 ∩ s1 */
    {
        size_t nw = 0;
        uint64_t *want = malloc(L * sizeof *want);
        for (size_t i = 0; i < n1; i++)
            if (s1[i] < s0[n0 - 1] + 1)
                want[nw++] = s1[i];
        rep = redisCommand(c, "SLOWLOG RESET");
        freeReplyObject(rep);
        collect(0, 1, 2, r0, 1, s0, n0, 30000, "big");
        collect(1, 1, 2, r1, 1, s1, n1, 30000, "big");
        run_for(2); /* the big pieces are on their way */
        collect(2, 1, 1, r0, 1, small, 2, 30000, "small");
        ck_assert(run_until(nodes_done, &k, 30000));
        expect_result(0, want, nw);
        expect_result(1, want, nw);
        expect_result(2, small, 2);
        free(want);
    }
    ck_assert_msg(N[2].seq == 1, "the small collect came %d of 3", N[2].seq);
    most = slowest(c, name, sizeof name);
    printf("big: 2 nodes x %d offsets; the longest command took %lld us (%s); the small collect came first\n", L, most,
           name);
    ck_assert_msg(most < 60000, "a command held Redis %lld us (%s)", most, name);
    rep = redisCommand(c, "CONFIG SET slowlog-log-slower-than 10000");
    freeReplyObject(rep);
    redisFree(c);
    free(s0);
    free(s1);
}
END_TEST

static void setup_bare(void)
{
    memset(N, 0, sizeof N);
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    uv_timer_init(&loop, &tick);
}

START_TEST(t_unreachable)
{
    static const uint32_t r0[] = {0};
    char u[64];
    int port = 20000 + (int)(getpid() % 10000);
    uint64_t t0;
    while (!port_free(port))
        port++;
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", port);
    open_node(0, u);
    t0 = now_ms();
    collect(0, 1, 2, r0, 1, NULL, 0, 10000, "job");
    ck_assert(run_until(node_done, &N[0], 3000));
    ck_assert_msg(strstr(N[0].msg, "Redis at 127.0.0.1:") &&
                      strstr(N[0].msg,
                             "is unreachable: Connection refused; "
                             "collect 1 of heap \"job\" failed; heapd retries the connection at the next collect"),
                  "%s", N[0].msg);
    ck_assert_uint_lt(N[0].t_done - t0, 5000); /* at once, not at the 10 s timeout */
    ck_assert(!hd_store_ready(N[0].s));
    /* and again: no stale state */
    collect(0, 2, 2, r0, 1, NULL, 0, 10000, "job");
    ck_assert(run_until(node_done, &N[0], 3000));
    ck_assert_msg(strstr(N[0].msg, "Connection refused"), "%s", N[0].msg);
}
END_TEST

START_TEST(t_silent_server)
{
    /* A server that accepts TCP but never answers (listen, never accept):
     * the collect fails by its timeout, and the next one starts afresh. */
    static const uint32_t r0[] = {0};
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    char u[64];
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    uint64_t t0;

    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", ntohs(a.sin_port));
    open_node(0, u);
    for (int round = 0; round < 2; round++) {
        t0 = now_ms();
        collect(0, (uint64_t)round + 1, 2, r0, 1, NULL, 0, 300, "job");
        ck_assert(run_until(node_done, &N[0], 3000));
        ck_assert_msg(strstr(N[0].msg, "is unreachable: the subscription was not confirmed within 300 ms"), "%s",
                      N[0].msg);
        ck_assert_uint_ge(N[0].t_done - t0 + 2, 300); /* ms truncation on both clocks */
        ck_assert_uint_lt(N[0].t_done - t0, 3000);    /* by its 300 ms timeout, long before run_until's 3 s */
    }
    printf("silent server: \"%s\"\n", N[0].msg);
    hd_store_close(N[0].s);
    N[0].s = NULL;
    close(fd);
}
END_TEST

/* ---- main ---------------------------------------------------------------- */

static Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("redis");
    TCase *tb = tcase_create("no-redis");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_three_nodes_intersection);
    tcase_add_test(tc, t_any_order);
    tcase_add_test(tc, t_latency);
    tcase_add_test(tc, t_empty);
    tcase_add_test(tc, t_large);
    tcase_add_test(tc, t_timeout);
    tcase_add_test(tc, t_timeout_redis_stopped);
    tcase_add_test(tc, t_abort);
    tcase_add_test(tc, t_codes);
    tcase_add_test(tc, t_redis_killed);
    tcase_add_test(tc, t_keys_ttl);
    tcase_add_test(tc, t_force);
    tcase_add_test(tc, t_script_flush);
    tcase_add_test(tc, t_close_pending);
    tcase_add_test(tc, t_args);
    tcase_add_test(tc, t_world_mismatch);
    tcase_add_test(tc, t_hostname);
    tcase_add_test(tc, t_forged_result);
    tcase_add_test(tc, t_big_interleave);
    suite_add_tcase(s, tc);

    tcase_add_checked_fixture(tb, setup_bare, teardown);
    tcase_set_timeout(tb, 60);
    tcase_add_test(tb, t_unreachable);
    tcase_add_test(tb, t_silent_server);
    suite_add_tcase(s, tb);
    return s;
}

int main(void)
{
    int rc;

    if (!have_redis_server()) {
        printf("skipped: redis-server not installed\n");
        return 0;
    }
    signal(SIGPIPE, SIG_IGN); /* as heapd does: hiredis writes with write(2) */
    snprintf(redis_dir, sizeof redis_dir, "/tmp/check_store.XXXXXX");
    if (!mkdtemp(redis_dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(key_dir, sizeof key_dir, "/tmp/check_store_key.XXXXXX");
    if (!mkdtemp(key_dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(key1, sizeof key1, "%s/k1", key_dir);
    snprintf(key2, sizeof key2, "%s/k2", key_dir);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(i ? key2 : key1, "w");
        if (!f || fprintf(f, "%s\n", i ? "another-cluster-key-0123456789" : "the-cluster-key-0123456789abcdef") < 0 ||
            fclose(f) != 0 || chmod(i ? key2 : key1, 0600) != 0) {
            perror("key file");
            return 1;
        }
    }
    rc = cku_run(store_suite());
    unlink(key1);
    unlink(key2);
    rmdir(key_dir);
    /* redis-server writes nothing there (--save "", no AOF, log to stdout) */
    if (rmdir(redis_dir) != 0)
        fprintf(stderr, "could not remove %s: %s\n", redis_dir, strerror(errno));
    return rc;
}
