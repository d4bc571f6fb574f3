/* loaded_bench - a tenant's latency while another uid attacks heapd's
 * transport (issue 15, "Done when", bullet 2).
 *
 *   loaded_bench [--rounds N] [--cycles N] [--idle N] [--fdconns N] [--unread N] [--json FILE]
 *                [--stats-flood CONNS [--flood-world W]] [--victims N] [--transport socket|ring]
 *                [--fd-pin PAIRS] [--heapd-nofile N]
 *
 * --stats-flood (issue 33 item 4): the attacker, instead of holding
 * connections, floods Stats of its own heap of W ranks (default 4096; rank 0
 * attached, the rest never come) from CONNS connections, each writing 64
 * Stats at once and reading their replies, again and again. --victims N runs
 * N victims at once (each its own heap; default 1), --transport sets their
 * HEAPC_TRANSPORT (default: libheapc's).
 *
 * Starts its own heapd (dirname(argv[0])/../heapd, host backend, a temporary
 * socket; limits raised so that the attacker really holds what it opens:
 * max_clients 4096, max_clients_per_uid 2000, hello_timeout_ms 600000; the
 * per-uid fd and queue limits keep their defaults). The victim, uid 65533,
 * runs N rounds (default 200) of: connect and attach a 1-rank heap, 16
 * allocations of 4 KiB, free them, collect, detach; each step is timed. It
 * runs in the same run unloaded, then while the attacker, uid 65534
 * (tests/prog_hostile hold), holds IDLE idle connections (default 1000),
 * FDCONNS connections with 253 fds in a partial header each (default 64), and
 * UNREAD connections that flood Stats without reading (default 64); in
 * CYCLES cycles (default 10: unloaded, attacker set up, loaded, attacker
 * killed) so that both sides see the machine's load alike. Prints
 * p50/p99 per step for both and the ratio of the p99s (target: at most 5),
 * heapd's fds and RSS under the load. Figures, not assertions: exit 0 unless
 * something failed to run. Needs root (to run two uids); prints
 * "skipped: ..." otherwise.
 *
 * --fd-pin (issue 33 items 2, 3): the attacker, instead of holding
 * connections, runs tests/prog_fdpin: the 8 connections of an 8-rank heap
 * of one 4 KiB chunk per rank each pipeline PAIRS Detach + Attach and never
 * read (every AttachReply carries 9 fds). --heapd-nofile N starts heapd
 * with RLIMIT_NOFILE N (soft and hard), so that a pin that heapd does not
 * bound fills its fd table at a small PAIRS.
 */
#define NAME "loaded_bench"
#include "heapc.h"
#include "heapd.pb-c.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[64], sock[128];
static pid_t heapd_pid, hostile_pid;
static const char *victim_transport; /* NULL: libheapc's default */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void stop(pid_t *p)
{
    if (*p > 0) {
        kill(*p, SIGTERM);
        waitpid(*p, NULL, 0);
    }
    *p = 0;
}

static void cleanup(void)
{
    if (hostile_pid > 0) {
        kill(-hostile_pid, SIGKILL); /* the Stats flooders too */
        kill(hostile_pid, SIGKILL);
    }
    stop(&hostile_pid);
    stop(&heapd_pid);
    if (dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd)) {
        }
    }
}

/* SIGTERM (a test's time bound): heapd and the attacker go too. */
static void on_term(int sig)
{
    (void)sig;
    cleanup();
    _exit(124);
}

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, NAME ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    cleanup();
    exit(1);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_d);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

enum { S_ATTACH, S_ALLOC, S_FREE_COLLECT, S_DETACH, S_N };
static const char *const step_name[S_N] = {"connect+attach", "alloc 4K", "free+collect", "detach"};

typedef struct result {
    double p50[S_N], p99[S_N];
    size_t n[S_N];
} result;

/* Samples (us) per step, of every cycle. */
typedef struct samples {
    double *v[S_N];
    size_t n[S_N];
} samples;

static void read_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t k = read(fd, p, len);
        if (k <= 0)
            die("the victim's figures were cut short");
        p += k;
        len -= (size_t)k;
    }
}

static void summarize(samples *sm, result *r)
{
    for (int s = 0; s < S_N; s++) {
        r->n[s] = sm->n[s];
        r->p50[s] = pct(sm->v[s], sm->n[s], 0.5);
        r->p99[s] = pct(sm->v[s], sm->n[s], 0.99);
    }
}

/* The victim, in a child of uid 65533: its figures come back through a pipe. */
static void victim(int rounds, int wfd)
{
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    if (setgroups(0, NULL) || setgid(65533) || setuid(65533))
        _exit(3);
    if (victim_transport)
        setenv("HEAPC_TRANSPORT", victim_transport, 1);
    char name[32];
    snprintf(name, sizeof name, "victim%d", (int)getpid());
    double *v[S_N];
    size_t n[S_N] = {0};
    for (int s = 0; s < S_N; s++)
        v[s] = malloc(sizeof(double) * (size_t)rounds * 16);
    heapc_params p = {0};
    p.chunk_size = 1 << 20;
    p.va_size = 64 << 20;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_us();
        heapc *c = heapc_connect(sock);
        if (heapc_err(c) || heapc_attach(c, name, 0, 1, &p)) {
            fprintf(stderr, NAME ": victim round %d: %s\n", r, heapc_errstr(c));
            _exit(4);
        }
        v[S_ATTACH][n[S_ATTACH]++] = now_us() - t0;
        uint64_t off[16];
        for (int i = 0; i < 16; i++) {
            void *ptr;
            double t = now_us();
            if (heapc_alloc(c, 4096, &ptr, &off[i])) {
                fprintf(stderr, NAME ": victim alloc: %s\n", heapc_errstr(c));
                _exit(4);
            }
            v[S_ALLOC][n[S_ALLOC]++] = now_us() - t;
        }
        double t = now_us();
        for (int i = 0; i < 16; i++)
            heapc_free(c, off[i]);
        if (heapc_collect(c)) {
            fprintf(stderr, NAME ": victim collect: %s\n", heapc_errstr(c));
            _exit(4);
        }
        v[S_FREE_COLLECT][n[S_FREE_COLLECT]++] = now_us() - t;
        t = now_us();
        heapc_detach(c);
        heapc_free_ctx(c);
        v[S_DETACH][n[S_DETACH]++] = now_us() - t;
    }
    for (int s = 0; s < S_N; s++)
        if (write(wfd, &n[s], sizeof n[s]) != (ssize_t)sizeof n[s] ||
            write(wfd, v[s], n[s] * sizeof(double)) != (ssize_t)(n[s] * sizeof(double)))
            _exit(5);
    _exit(0);
}

/* One victim's figures from its pipe, added to *out; then its exit. */
static void collect_victim(pid_t p, int rfd, samples *out)
{
    for (int s = 0; s < S_N; s++) {
        size_t n;
        read_all(rfd, &n, sizeof n);
        double *v = realloc(out->v[s], (out->n[s] + n) * sizeof(double));
        if (!v)
            die("out of memory");
        read_all(rfd, v + out->n[s], n * sizeof(double));
        out->v[s] = v;
        out->n[s] += n;
    }
    close(rfd);
    int st;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        die("the victim failed (status %d)", st);
}

/* n victims at once, `rounds` rounds each; their samples are added to *out. */
static void run_victims(int n, int rounds, samples *out)
{
    pid_t *pid = calloc((size_t)n, sizeof *pid);
    int *rfd = calloc((size_t)n, sizeof *rfd);
    if (!pid || !rfd)
        die("out of memory");
    for (int i = 0; i < n; i++) {
        int pp[2];
        if (pipe(pp))
            die("pipe: %s", strerror(errno));
        pid[i] = fork();
        if (pid[i] == 0) {
            close(pp[0]);
            victim(rounds, pp[1]);
        }
        close(pp[1]);
        rfd[i] = pp[0];
    }
    for (int i = 0; i < n; i++)
        collect_victim(pid[i], rfd[i], out);
    free(pid);
    free(rfd);
}

static long proc_value(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key)))
            v = strtol(line + strlen(key), NULL, 10);
    if (f)
        fclose(f);
    return v;
}

static int count_fds(pid_t pid)
{
    char cmd[96];
    snprintf(cmd, sizeof cmd, "ls /proc/%ld/fd | wc -l", (long)pid);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f) {
        if (fscanf(f, "%d", &n) != 1)
            n = -1;
        pclose(f);
    }
    return n;
}

typedef struct opts {
    int rounds, idle, fdconns, unread, cycles;
    const char *json;
    int flood, flood_world, victims; /* issue 33 item 4 */
    int fdpin, heapd_nofile;         /* issue 33 items 2, 3 */
} opts;

/* 0, or 2 after a usage message. */
static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){200, 1000, 64, 64, 10, NULL, 0, 4096, 1, 0, 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            o->rounds = 50;
        else if (i + 1 < argc && !strcmp(argv[i], "--rounds"))
            o->rounds = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--idle"))
            o->idle = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--fdconns"))
            o->fdconns = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--unread"))
            o->unread = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--cycles"))
            o->cycles = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--json"))
            o->json = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--stats-flood"))
            o->flood = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--flood-world"))
            o->flood_world = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--victims"))
            o->victims = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--transport"))
            victim_transport = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--fd-pin"))
            o->fdpin = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--heapd-nofile"))
            o->heapd_nofile = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: " NAME " [--rounds N] [--cycles N] [--idle N] [--fdconns N] [--unread N] [--json FILE]\n"
                    "       [--stats-flood CONNS [--flood-world W]] [--victims N] [--transport socket|ring]\n"
                    "       [--fd-pin PAIRS] [--heapd-nofile N]\n");
            return 2;
        }
    }
    return 0;
}

static char hcopy[128], hout[128];
static int heapd_nofile; /* --heapd-nofile */

/* The temporary folder, heapd's configuration, heapd started and listening. */
static void start_heapd(const char *argv0)
{
    char self[PATH_MAX], heapd[PATH_MAX + 32], hostile[PATH_MAX + 32];
    if (!realpath(argv0, self))
        die("cannot resolve %s", argv0);
    char *bdir = dirname(self);
    snprintf(heapd, sizeof heapd, "%s/../heapd", bdir);
    snprintf(hostile, sizeof hostile, "%s/../tests/prog_hostile", bdir);
    if (access(heapd, X_OK) || access(hostile, X_OK))
        die("%s and %s must be built (make)", heapd, hostile);
    snprintf(dir, sizeof dir, "/tmp/heapd-loaded.XXXXXX");
    if (!mkdtemp(dir))
        die("mkdtemp: %s", strerror(errno));
    chmod(dir, 0755);
    char conf[128], log[128];
    snprintf(sock, sizeof sock, "%s/heapd.sock", dir);
    snprintf(conf, sizeof conf, "%s/heapd.conf", dir);
    snprintf(log, sizeof log, "%s/heapd.log", dir);
    snprintf(hcopy, sizeof hcopy, "%s/prog_hostile", dir);
    snprintf(hout, sizeof hout, "%s/hostile.out", dir);
    FILE *f = fopen(conf, "w");
    if (!f)
        die("cannot write %s", conf);
    fprintf(f,
            "socket = %s\nsocket_mode = 0666\nbackend = host\nlog_level = warn\nmax_clients = 4096\n"
            "max_clients_per_uid = 2000\nhello_timeout_ms = 600000\ncollect_timeout_ms = 600000\n",
            sock);
    fclose(f);
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", hostile, hcopy);
    if (system(cmd))
        die("cannot copy %s", hostile);
    heapd_pid = fork();
    if (heapd_pid == 0) {
        int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(lf, 2);
        struct rlimit nl = {(rlim_t)heapd_nofile, (rlim_t)heapd_nofile};
        if (heapd_nofile > 0)
            setrlimit(RLIMIT_NOFILE, &nl);
        execl(heapd, heapd, "--config", conf, (char *)NULL);
        _exit(127);
    }
    struct stat st;
    for (int i = 0; i < 600 && stat(sock, &st); i++)
        usleep(50000);
    if (stat(sock, &st))
        die("heapd did not start (see its log)");
}

/* The attacker's first line (starting with `word`, 7 letters) into line,
 * within 60 s (else die with `fail`); then until heapd took in what it sent
 * (its fd count holds still: 3 samples 100 ms apart). */
static void await_attacker(const char *word, char *line, size_t len, const char *fail)
{
    line[0] = 0;
    for (int i = 0; i < 1200 && strncmp(line, word, 7); i++) {
        FILE *h = fopen(hout, "r");
        if (h) {
            if (!fgets(line, (int)len, h))
                line[0] = 0;
            fclose(h);
        }
        if (strncmp(line, word, 7))
            usleep(50000);
    }
    if (strncmp(line, word, 7))
        die("%s", fail);
    int fds = count_fds(heapd_pid), same = 0;
    for (int i = 0; i < 300 && same < 3; i++) {
        usleep(100000);
        int n = count_fds(heapd_pid);
        same = n == fds ? same + 1 : 0;
        fds = n;
    }
}

/* The attacker, uid 65534, set up; its "holding" line into line. Then waits
 * until heapd took in what it sent (its fd count holds still: 3 samples
 * 100 ms apart, 30 s at most). */
static void start_hostile(const opts *o, char *line, size_t len)
{
    hostile_pid = fork();
    if (hostile_pid == 0) {
        int of = open(hout, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(of, 1);
        if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
            _exit(3);
        char a[3][16];
        snprintf(a[0], 16, "%d", o->idle);
        snprintf(a[1], 16, "%d", o->fdconns);
        snprintf(a[2], 16, "%d", o->unread);
        execl(hcopy, hcopy, "--socket", sock, "hold", a[0], a[1], a[2], (char *)NULL);
        _exit(127);
    }
    await_attacker("holding", line, len, "the attacker did not set up within 60 s");
}

/* ---- the Stats flood (issue 33 item 4) ----------------------------------- */

/* Frame f packed and sent on fd (blocking); 0 or -1. */
static int flood_send(int fd, Heapd__Frame *f)
{
    uint8_t buf[512];
    size_t len = heapd__frame__get_packed_size(f);
    heapd__frame__pack(f, buf);
    return hw_send_frame(fd, buf, len, NULL, 0, NULL, 0) < 0 ? -1 : 0;
}

/* A connection past Hello, or -1. */
static int flood_conn(void)
{
    int fd = hw_connect_unix(sock, NULL, 0);
    Heapd__Hello h = HEAPD__HELLO__INIT;
    h.version = HEAPD__CONST__PROTOCOL_VERSION;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 1;
    f.body_case = HEAPD__FRAME__BODY_HELLO;
    f.hello = &h;
    hw_reader rd;
    hw_frame fr;
    hw_reader_init(&rd);
    int ok = fd >= 0 && !flood_send(fd, &f) && hw_recv_frame(fd, &rd, &fr, 10000, NULL, 0) == HW_FRAME;
    if (ok)
        hw_frame_free(&fr);
    hw_reader_free(&rd);
    if (!ok && fd >= 0)
        close(fd);
    return ok ? fd : -1;
}

/* One flooder: 64 Stats of heap "flood" at once, their replies read, forever. */
static void flood_loop(int fd)
{
    Heapd__Stats m = HEAPD__STATS__INIT;
    m.heap = (char *)"flood";
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_STATS;
    f.stats = &m;
    uint8_t one[64], burst[64 * 80];
    size_t len = heapd__frame__get_packed_size(&f), bl = 0;
    for (int i = 0; i < 64; i++) {
        f.id = 100 + (uint64_t)i;
        len = heapd__frame__get_packed_size(&f);
        uint32_t hdr[2] = {(uint32_t)len, 0}; /* little-endian hosts */
        memcpy(one, hdr, 8);
        heapd__frame__pack(&f, one + 8);
        memcpy(burst + bl, one, 8 + len);
        bl += 8 + len;
    }
    hw_reader rd;
    hw_reader_init(&rd);
    for (;;) {
        if (write(fd, burst, bl) != (ssize_t)bl)
            _exit(0);
        for (int i = 0; i < 64; i++) {
            hw_frame fr;
            if (hw_recv_frame(fd, &rd, &fr, 60000, NULL, 0) != HW_FRAME)
                _exit(0);
            hw_frame_free(&fr);
        }
    }
}

/* The attacker, uid 65534: rank 0 of a heap of o->flood_world ranks, then
 * o->flood flooders (children); the "holding" line into line. */
static void start_flood(const opts *o, char *line, size_t len)
{
    int pp[2];
    if (pipe(pp))
        die("pipe: %s", strerror(errno));
    hostile_pid = fork();
    if (hostile_pid == 0) {
        close(pp[0]);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        setpgid(0, 0);
        if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
            _exit(3);
        int hfd = flood_conn();
        Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
        hp.chunk_size = 4096;
        Heapd__Attach a = HEAPD__ATTACH__INIT;
        a.heap = (char *)"flood";
        a.world_size = (uint32_t)o->flood_world;
        a.params = &hp;
        Heapd__Frame f = HEAPD__FRAME__INIT;
        f.id = 2;
        f.body_case = HEAPD__FRAME__BODY_ATTACH;
        f.attach = &a;
        if (hfd < 0 || flood_send(hfd, &f))
            _exit(4);
        for (int i = 0; i < o->flood; i++) {
            int fd = flood_conn();
            if (fd < 0)
                _exit(4);
            if (fork() == 0)
                flood_loop(fd);
            close(fd);
        }
        dprintf(pp[1], "holding rank 0 of a %d-rank heap, %d connections flooding its Stats\n", o->flood_world,
                o->flood);
        while (1)
            pause();
    }
    setpgid(hostile_pid, hostile_pid);
    close(pp[1]);
    ssize_t k = read(pp[0], line, len - 1);
    close(pp[0]);
    line[k > 0 ? k : 0] = 0;
    if (strncmp(line, "holding", 7))
        die("the Stats flood did not start");
    usleep(200000); /* the flood under way */
}

/* The attacker gone: its process group (the flooders too). */
static void stop_attacker(void)
{
    kill(-hostile_pid, SIGKILL);
    kill(hostile_pid, SIGKILL);
    waitpid(hostile_pid, NULL, 0);
    hostile_pid = 0;
}

/* ---- the fd pin (issue 33 items 2, 3) ------------------------------------- */

/* The attacker, uid 65534: tests/prog_fdpin (copied next to the socket),
 * PAIRS pipelined Detach + Attach on each of the 8 connections of heap
 * "pin", never read; its "pinning" line into line. Then waits until heapd
 * took in what it could (its fd count holds still: 3 samples 100 ms apart). */
static void start_fdpin(const opts *o, char *line, size_t len)
{
    char self[PATH_MAX], pin[160], cmd[PATH_MAX + 200];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0)
        die("cannot resolve /proc/self/exe");
    self[k] = 0;
    snprintf(pin, sizeof pin, "%s/prog_fdpin", dir);
    snprintf(cmd, sizeof cmd, "cp '%s/../tests/prog_fdpin' '%s'", dirname(self), pin);
    if (system(cmd))
        die("cannot copy prog_fdpin (make builds it)");
    hostile_pid = fork();
    if (hostile_pid == 0) {
        int of = open(hout, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(of, 1);
        if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
            _exit(3);
        char pairs[16];
        snprintf(pairs, sizeof pairs, "%d", o->fdpin);
        execl(pin, pin, "--socket", sock, "pin", "8", "1", pairs, (char *)NULL);
        _exit(127);
    }
    await_attacker("pinning", line, len, "the fd pin did not set up within 60 s");
}

static void report(const opts *o, const result *base, const result *loaded)
{
    printf("victims (uid 65533): %d at once, transport %s; %zu rounds in all, same run:\n", o->victims,
           victim_transport ? victim_transport : "default", base->n[S_ATTACH]);
    printf("%-16s %12s %12s %12s %12s %8s\n", "step", "p50 unloaded", "p99 unloaded", "p50 loaded", "p99 loaded",
           "p99 x");
    double worst = 0;
    for (int s = 0; s < S_N; s++) {
        double r = base->p99[s] > 0 ? loaded->p99[s] / base->p99[s] : 0;
        if (r > worst)
            worst = r;
        printf("%-16s %10.1fus %10.1fus %10.1fus %10.1fus %7.2fx\n", step_name[s], base->p50[s], base->p99[s],
               loaded->p50[s], loaded->p99[s], r);
        printf("bench " NAME ": %s p99 unloaded %.1f us, loaded %.1f us, ratio %.2f\n", step_name[s], base->p99[s],
               loaded->p99[s], r);
    }
    printf("worst p99 ratio loaded/unloaded: %.2fx (target: at most 5x)\n", worst);
    FILE *j = o->json ? fopen(o->json, "w") : NULL;
    if (!j)
        return;
    fprintf(j,
            "{\"rounds\": %d, \"idle\": %d, \"fdconns\": %d, \"unread\": %d, \"stats_flood\": %d, "
            "\"flood_world\": %d, \"victims\": %d, \"transport\": \"%s\", \"steps\": [",
            o->rounds, o->idle, o->fdconns, o->unread, o->flood, o->flood_world, o->victims,
            victim_transport ? victim_transport : "default");
    for (int s = 0; s < S_N; s++)
        fprintf(j,
                "%s{\"step\": \"%s\", \"p50_unloaded_us\": %.1f, \"p99_unloaded_us\": %.1f, "
                "\"p50_loaded_us\": %.1f, \"p99_loaded_us\": %.1f}",
                s ? ", " : "", step_name[s], base->p50[s], base->p99[s], loaded->p50[s], loaded->p99[s]);
    fprintf(j, "], \"fd_pin\": %d, \"heapd_nofile\": %d, \"worst_p99_ratio\": %.2f}\n", o->fdpin, o->heapd_nofile,
            worst);
    fclose(j);
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o))
        return 2;
    if (getuid() != 0) {
        printf("skipped: " NAME " needs root (a hostile uid and a victim uid)\n");
        FILE *j = o.json ? fopen(o.json, "w") : NULL;
        if (j) {
            fprintf(j, "{\"skipped\": \"needs root\"}\n");
            fclose(j);
        }
        return 0;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    heapd_nofile = o.heapd_nofile;
    start_heapd(argv[0]);
    /* Cycles of unloaded rounds, then loaded ones (the attacker set up, then
     * killed and its connections gone): both see the same machine load. */
    samples sb = {0}, sl = {0};
    char line[512] = "";
    int fds = 0, base_fds = count_fds(heapd_pid);
    long rss = 0;
    if (o.cycles < 1)
        o.cycles = 1;
    for (int cy = 0; cy < o.cycles; cy++) {
        run_victims(o.victims, o.rounds / o.cycles, &sb);
        if (o.flood)
            start_flood(&o, line, sizeof line);
        else if (o.fdpin)
            start_fdpin(&o, line, sizeof line);
        else
            start_hostile(&o, line, sizeof line);
        fds = count_fds(heapd_pid);
        rss = proc_value(heapd_pid, "VmRSS:");
        run_victims(o.victims, o.rounds / o.cycles, &sl);
        stop_attacker();
        for (int i = 0; i < 300 && count_fds(heapd_pid) > base_fds; i++)
            usleep(100000);
    }
    result base, loaded;
    summarize(&sb, &base);
    summarize(&sl, &loaded);
    for (int s = 0; s < S_N; s++) {
        free(sb.v[s]);
        free(sl.v[s]);
    }
    printf("attacker (uid 65534): %s", line);
    printf("heapd under attack: %d fds, VmRSS %ld kB; %d cycles of %d unloaded then %d loaded rounds\n", fds, rss,
           o.cycles, o.rounds / o.cycles, o.rounds / o.cycles);
    report(&o, &base, &loaded);
    cleanup();
    return 0;
}
