/* trainer - heapd's demo: N rank processes share one symmetric heap.
 *
 *   trainer [--socket PATH] [--heap NAME] [--ranks N] [--steps N] [--chunk SIZE]
 *
 * The parent forks N ranks. Each connects to heapd, attaches to the heap and,
 * for every step, allocates a series of blocks of varied sizes, writes a
 * rank-specific pattern into its slice of every peer's copy of each block
 * (heapc_peer_ptr: plain stores into the peer's memory), meets the others in
 * a collect (a barrier), checks what every peer wrote into its own copy, then
 * frees the blocks in an order of its own (shuffled with the rank as seed)
 * with collects in between. Finally it allocates past the first chunk so the
 * heap grows and checks the new chunk on every rank. Each rank sends its
 * offsets and counts to the parent through a pipe; the parent checks that
 * the offsets are identical on every rank and prints what was verified;
 * then (--stats-cmd) it runs a command while the ranks are still attached,
 * and releases them to detach.
 *
 * Needs the host backend (the pattern is written with CPU stores) and every
 * rank on this node. Exit status: 0 when everything was verified, 1 on any
 * failure (the message says which rank and what), 2 on a usage error.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fdopen, getopt_long: the example builds on its own with cc -std=c11 */
#endif
#include "heapc.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCKS_PER_STEP   16
#define FREES_PER_COLLECT 4
#define MAX_RANKS         64

typedef struct opts {
    const char *sock;
    const char *heap;
    int ranks;
    int steps;
    uint64_t chunk;
    const char *stats_cmd;
} opts;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: trainer [--socket PATH] [--heap NAME] [--ranks N] [--steps N] [--chunk SIZE]\n"
            "               [--stats-cmd CMD]\n"
            "\n"
            "heapd's demo: forks N rank processes that share heap NAME, write into each\n"
            "other's copies of symmetric blocks, verify what they read, free in different\n"
            "orders, and grow the heap. Prints what was verified; exits 1 on any failure.\n"
            "\n"
            "  --socket PATH   heapd's socket (default: $HEAPD_SOCKET, else " HEAPC_DEFAULT_SOCKET ")\n"
            "  --heap NAME     heap to use (default: trainer)\n"
            "  --ranks N       ranks to fork, 1..%d (default 4)\n"
            "  --steps N       allocate/write/check/free rounds (default 3)\n"
            "  --chunk SIZE    heap chunk size in bytes, K or M (default 4M); the heap\n"
            "                  starts with one chunk and may grow to 64 chunks\n"
            "  --stats-cmd CMD run CMD with /bin/sh once everything is verified, while\n"
            "                  every rank is still attached (e.g. \"heapctl stats trainer\");\n"
            "                  its failure fails the trainer\n"
            "\n"
            "Needs heapd with backend = host (the ranks write with CPU stores).\n",
            MAX_RANKS);
}

/* ---- rank ---------------------------------------------------------------- */

typedef struct rank_ctx {
    heapc *c;
    FILE *out; /* to the parent */
    int go_fd; /* from the parent: a byte or EOF releases the rank */
    uint32_t r, n;
    uint64_t verified; /* bytes written by peers, checked here */
} rank_ctx;

static int rank_fail(rank_ctx *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rank_fail(rank_ctx *k, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "trainer: rank %" PRIu32 ": %s\n", k->r, msg);
    if (k->out)
        fprintf(k->out, "err %s\n", msg);
    return 1;
}

static int heapc_fail(rank_ctx *k, const char *what)
{
    return rank_fail(k, "%s: %s (%s)", what, heapc_errstr(k->c), heapc_errname(heapc_err(k->c)));
}

static unsigned char pattern(uint32_t writer, uint32_t owner, uint64_t seq)
{
    return (unsigned char)(writer * 37u + owner * 11u + (unsigned)seq * 7u + 1u);
}

/* Each writer owns slice `writer` of a block: [w*len/n, (w+1)*len/n). */
static void slice(uint64_t size, uint32_t w, uint32_t n, uint64_t *start, uint64_t *len)
{
    *start = size * w / n;
    *len = size * (w + 1) / n - *start;
}

typedef struct blk {
    uint64_t seq, off, size;
} blk;

static int alloc_block(rank_ctx *k, uint64_t size, blk *b)
{
    b->seq = heapc_next_seq(k->c);
    b->size = size;
    if (heapc_alloc(k->c, size, NULL, &b->off) != HEAPC_OK)
        return heapc_fail(k, "heapc_alloc");
    fprintf(k->out, "off %" PRIu64 " %" PRIu64 "\n", b->seq, b->off);
    return 0;
}

/* Writes this rank's slice of every block into every peer's copy. */
static int write_peers(rank_ctx *k, const blk *bs, int nb)
{
    for (int i = 0; i < nb; i++) {
        uint64_t st, len;
        slice(bs[i].size, k->r, k->n, &st, &len);
        for (uint32_t q = 0; q < k->n; q++) {
            unsigned char *p = heapc_peer_ptr(k->c, q, bs[i].off);
            if (!p)
                return rank_fail(k,
                                 "rank %" PRIu32 "'s copy of offset %" PRIu64 " is not mapped "
                                 "here: every rank must run on this node",
                                 q, bs[i].off);
            memset(p + st, pattern(k->r, q, bs[i].seq), len);
        }
    }
    return 0;
}

/* Checks every peer's slice in this rank's own copies. */
static int check_own(rank_ctx *k, const blk *bs, int nb)
{
    for (int i = 0; i < nb; i++) {
        const unsigned char *p = heapc_ptr(k->c, bs[i].off);
        if (!p)
            return rank_fail(k, "offset %" PRIu64 " is not mapped", bs[i].off);
        for (uint32_t w = 0; w < k->n; w++) {
            uint64_t st, len;
            slice(bs[i].size, w, k->n, &st, &len);
            unsigned char want = pattern(w, k->r, bs[i].seq);
            for (uint64_t j = 0; j < len; j++)
                if (p[st + j] != want)
                    return rank_fail(k,
                                     "allocation %" PRIu64 " (offset %" PRIu64 ", %" PRIu64 " bytes): byte +%" PRIu64
                                     " written by rank %" PRIu32 " is 0x%02x, expected 0x%02x",
                                     bs[i].seq, bs[i].off, bs[i].size, st + j, w, p[st + j], want);
            if (w != k->r)
                k->verified += len;
        }
    }
    return 0;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int collect(rank_ctx *k) { return heapc_collect(k->c) == HEAPC_OK ? 0 : heapc_fail(k, "heapc_collect"); }

/* Frees blocks in an order shuffled with this rank's seed, collecting after
 * every FREES_PER_COLLECT frees (the same number of collects on every rank). */
static int free_shuffled(rank_ctx *k, blk *bs, int nb, uint64_t seed)
{
    int order[256];
    for (int i = 0; i < nb; i++)
        order[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)(rng_next(&seed) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < nb; i++) {
        if (heapc_free(k->c, bs[order[i]].off) != HEAPC_OK)
            return heapc_fail(k, "heapc_free");
        if ((i + 1) % FREES_PER_COLLECT == 0 && collect(k))
            return 1;
    }
    return collect(k);
}

static int rank_run(rank_ctx *k, const opts *o)
{
    heapc *c = k->c = heapc_connect(o->sock);
    if (!c)
        return rank_fail(k, "out of memory");
    if (heapc_err(c))
        return heapc_fail(k, "connecting to heapd");
    if (strcmp(heapc_backend(c), "host") != 0)
        return rank_fail(k,
                         "heapd serves the %s backend; the trainer writes with CPU stores and "
                         "needs backend = host in heapd.conf",
                         heapc_backend(c));
    heapc_params p = {0};
    p.chunk_size = o->chunk;
    p.initial_size = o->chunk;
    p.va_size = o->chunk * 64;
    if (heapc_attach(c, o->heap, k->r, k->n, &p) != HEAPC_OK)
        return heapc_fail(k, "heapc_attach");
    if (heapc_local_ranks(c, NULL, 0) != k->n)
        return rank_fail(k,
                         "heapd serves %zu of the %" PRIu32 " ranks here; the trainer needs "
                         "every rank on this node",
                         heapc_local_ranks(c, NULL, 0), k->n);
    uint64_t mapped0 = heapc_mapped(c);
    fprintf(k->out, "mapped0 %" PRIu64 "\n", mapped0);

    blk bs[256];
    for (int step = 0; step < o->steps; step++) {
        /* Sizes identical on every rank: 600 B .. ~100 KiB. */
        for (int i = 0; i < BLOCKS_PER_STEP; i++) {
            uint64_t size = ((uint64_t)600 << ((i * 5 + step) % 8)) + (uint64_t)(i * 97 + step * 13);
            if (alloc_block(k, size, &bs[i]))
                return 1;
        }
        if (write_peers(k, bs, BLOCKS_PER_STEP))
            return 1;
        if (collect(k)) /* everyone has written */
            return 1;
        if (check_own(k, bs, BLOCKS_PER_STEP))
            return 1;
        if (free_shuffled(k, bs, BLOCKS_PER_STEP, k->r * 1000003u + (uint64_t)step))
            return 1;
    }

    /* Grow: quarter-chunk blocks until one lies past the first chunk. */
    int nb = 0;
    uint64_t q = o->chunk / 4;
    while (nb < 256) {
        if (alloc_block(k, q, &bs[nb]))
            return 1;
        if (bs[nb++].off + q > mapped0)
            break;
    }
    uint64_t mapped1 = heapc_mapped(c);
    if (mapped1 <= mapped0)
        return rank_fail(k, "the heap did not grow: %d blocks of %" PRIu64 " bytes fit in %" PRIu64 " bytes", nb, q,
                         mapped0);
    /* The new chunk: every rank writes into every peer's copy of it. */
    if (write_peers(k, bs + nb - 1, 1) || collect(k) || check_own(k, bs + nb - 1, 1))
        return 1;
    if (free_shuffled(k, bs, nb, k->r * 7919u + 17u))
        return 1;

    heapc_counters ctr;
    heapc_get_counters(c, &ctr);
    fprintf(k->out, "mapped1 %" PRIu64 "\n", mapped1);
    fprintf(k->out, "verified %" PRIu64 "\n", k->verified);
    fprintf(k->out, "collects %" PRIu64 " %" PRIu64 "\n", ctr.collects, ctr.heap_collects);
    /* Tell the parent, and stay attached until it says go (or goes away). */
    fprintf(k->out, "ready\n");
    if (fflush(k->out) != 0)
        return rank_fail(k, "writing to the parent failed: %s", strerror(errno));
    char go;
    while (read(k->go_fd, &go, 1) < 0 && errno == EINTR)
        ;
    if (heapc_detach(c) != HEAPC_OK)
        return heapc_fail(k, "heapc_detach");
    fprintf(k->out, "done\n");
    return 0;
}

static int rank_main(int fd, int go_fd, uint32_t r, const opts *o)
{
    rank_ctx k = {0};
    k.go_fd = go_fd;
    k.r = r;
    k.n = (uint32_t)o->ranks;
    k.out = fdopen(fd, "w");
    if (!k.out)
        return rank_fail(&k, "fdopen: %s", strerror(errno));
    int rc = rank_run(&k, o);
    heapc_free_ctx(k.c);
    if (fclose(k.out) != 0 && rc == 0) {
        k.out = NULL;
        rc = rank_fail(&k, "writing to the parent failed: %s", strerror(errno));
    }
    return rc;
}

/* ---- parent --------------------------------------------------------------- */

typedef struct result {
    char line[1024]; /* partial line */
    size_t llen;
    uint64_t *offs; /* by seq; UINT64_MAX: not reported */
    size_t noffs, cap;
    uint64_t mapped0, mapped1, verified, collects, heap_collects;
    int ready, done, oom;
    char err[768];
} result;

static void handle_line(result *res, const char *line)
{
    uint64_t a, b;
    if (sscanf(line, "off %" SCNu64 " %" SCNu64, &a, &b) == 2) {
        if (a >= res->cap) {
            size_t ncap = res->cap ? res->cap * 2 : 256;
            while (ncap <= a)
                ncap *= 2;
            uint64_t *n = realloc(res->offs, ncap * sizeof *n);
            if (!n) {
                res->oom = 1;
                return;
            }
            for (size_t i = res->cap; i < ncap; i++)
                n[i] = UINT64_MAX;
            res->offs = n;
            res->cap = ncap;
        }
        res->offs[a] = b;
        if (a + 1 > res->noffs)
            res->noffs = a + 1;
    } else if (sscanf(line, "mapped0 %" SCNu64, &a) == 1) {
        res->mapped0 = a;
    } else if (sscanf(line, "mapped1 %" SCNu64, &a) == 1) {
        res->mapped1 = a;
    } else if (sscanf(line, "verified %" SCNu64, &a) == 1) {
        res->verified = a;
    } else if (sscanf(line, "collects %" SCNu64 " %" SCNu64, &a, &b) == 2) {
        res->collects = a;
        res->heap_collects = b;
    } else if (!strcmp(line, "ready")) {
        res->ready = 1;
    } else if (!strcmp(line, "done")) {
        res->done = 1;
    } else if (!strncmp(line, "err ", 4) && !res->err[0]) {
        size_t l = strlen(line + 4);
        if (l >= sizeof res->err)
            l = sizeof res->err - 1;
        memcpy(res->err, line + 4, l);
        res->err[l] = '\0';
    }
}

static void feed(result *res, const char *data, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n') {
            res->line[res->llen] = '\0';
            handle_line(res, res->line);
            res->llen = 0;
        } else if (res->llen + 1 < sizeof res->line) {
            res->line[res->llen++] = data[i];
        }
    }
}

static int parse_size_arg(const char *s, uint64_t *out)
{
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 10);
    if (errno || e == s || *s == '-')
        return -1;
    if (*e == 'K' || *e == 'k')
        v <<= 10, e++;
    else if (*e == 'M' || *e == 'm')
        v <<= 20, e++;
    if (*e)
        return -1;
    *out = v;
    return 0;
}

static const char *human(uint64_t v, char *buf, size_t len)
{
    if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(buf, len, "%" PRIu64 " MiB", v >> 20);
    else if (v >= (1u << 20))
        snprintf(buf, len, "%.1f MiB", (double)v / (1u << 20));
    else if (v >= 1024)
        snprintf(buf, len, "%.1f KiB", (double)v / 1024);
    else
        snprintf(buf, len, "%" PRIu64 " B", v);
    return buf;
}

/* Every rank reported: compares and prints. Returns 0 when all is well. */
static int verify_and_report(const opts *o, result *res, int n)
{
    for (int r = 0; r < n; r++)
        if (res[r].oom) {
            fprintf(stderr, "trainer: out of memory collecting rank %d's report\n", r);
            return 1;
        }
    for (int r = 1; r < n; r++) {
        if (res[r].noffs != res[0].noffs) {
            fprintf(stderr, "trainer: FAILED: rank %d made %zu allocations, rank 0 made %zu\n", r, res[r].noffs,
                    res[0].noffs);
            return 1;
        }
        for (size_t s = 0; s < res[0].noffs; s++)
            if (res[r].offs[s] != res[0].offs[s]) {
                fprintf(stderr,
                        "trainer: FAILED: allocation %zu is at offset %" PRIu64 " on rank 0 but %" PRIu64
                        " on rank %d: the heap is not symmetric\n",
                        s, res[0].offs[s], res[r].offs[s], r);
                return 1;
            }
        if (res[r].collects != res[0].collects) {
            fprintf(stderr, "trainer: FAILED: rank %d took part in %" PRIu64 " collects, rank 0 in %" PRIu64 "\n", r,
                    res[r].collects, res[0].collects);
            return 1;
        }
    }
    uint64_t verified = 0;
    for (int r = 0; r < n; r++)
        verified += res[r].verified;
    char a[32], b[32], v[32];
    printf("%d rank%s attached to heap \"%s\"\n", n, n == 1 ? "" : "s", o->heap);
    printf("%zu allocations: offsets identical on every rank\n", res[0].noffs);
    printf("peer writes verified: %" PRIu64 " bytes (%s)\n", verified, human(verified, v, sizeof v));
    printf("heap grew from %s to %s\n", human(res[0].mapped0, a, sizeof a), human(res[0].mapped1, b, sizeof b));
    printf("collects: %" PRIu64 "\n", res[0].heap_collects);
    fflush(stdout);
    return 0;
}

static void release(int *go, int n)
{
    for (int r = 0; r < n; r++)
        if (go[r] >= 0) {
            close(go[r]); /* EOF on the rank's side: detach */
            go[r] = -1;
        }
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"socket", required_argument, NULL, 's'}, {"heap", required_argument, NULL, 'H'},
        {"ranks", required_argument, NULL, 'n'},  {"steps", required_argument, NULL, 't'},
        {"chunk", required_argument, NULL, 'c'},  {"stats-cmd", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    opts o = {NULL, "trainer", 4, 3, 4u << 20, NULL};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        char *e;
        long v;
        switch (ch) {
        case 's':
            o.sock = optarg;
            break;
        case 'H':
            o.heap = optarg;
            break;
        case 'S':
            o.stats_cmd = optarg;
            break;
        case 'n':
        case 't':
            errno = 0;
            v = strtol(optarg, &e, 10);
            if (errno || *e || e == optarg || v < (ch == 'n' ? 1 : 0) || v > (ch == 'n' ? MAX_RANKS : 1000000)) {
                fprintf(stderr, "trainer: --%s: '%s' is out of range (%s)\nTry 'trainer --help'.\n",
                        ch == 'n' ? "ranks" : "steps", optarg, ch == 'n' ? "1..64" : "0..1000000");
                return 2;
            }
            if (ch == 'n')
                o.ranks = (int)v;
            else
                o.steps = (int)v;
            break;
        case 'c':
            if (parse_size_arg(optarg, &o.chunk) != 0 || o.chunk < 4096 || o.chunk % 4096) {
                fprintf(stderr,
                        "trainer: --chunk: '%s' is not a multiple of 4096 bytes (e.g. "
                        "4M)\nTry 'trainer --help'.\n",
                        optarg);
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            fprintf(stderr, "Try 'trainer --help'.\n");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "trainer: unexpected argument '%s'\nTry 'trainer --help'.\n", argv[optind]);
        return 2;
    }

    int n = o.ranks;
    pid_t pids[MAX_RANKS];
    int fds[MAX_RANKS], go[MAX_RANKS];
    static result res[MAX_RANKS];
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        int p[2], q[2];
        if (pipe(p) != 0 || pipe(q) != 0) {
            fprintf(stderr, "trainer: pipe: %s\n", strerror(errno));
            return 1;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "trainer: fork: %s\n", strerror(errno));
            return 1;
        }
        if (pid == 0) {
            close(p[0]);
            close(q[1]);
            for (int i = 0; i < r; i++) {
                close(fds[i]);
                close(go[i]);
            }
            _exit(rank_main(p[1], q[0], (uint32_t)r, &o));
        }
        close(p[1]);
        close(q[0]);
        pids[r] = pid;
        fds[r] = p[0];
        go[r] = q[1];
    }

    /* Read every rank's report until all pipes close. When every rank is
     * ready (verified, still attached): compare, report, run --stats-cmd,
     * then let the ranks detach. A rank that ends early releases the rest. */
    int open_n = n, failed = 0, reported = 0;
    while (open_n > 0) {
        struct pollfd pf[MAX_RANKS];
        int map[MAX_RANKS], np = 0;
        for (int r = 0; r < n; r++)
            if (fds[r] >= 0) {
                pf[np].fd = fds[r];
                pf[np].events = POLLIN;
                map[np++] = r;
            }
        if (poll(pf, (nfds_t)np, -1) < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "trainer: poll: %s\n", strerror(errno));
            return 1;
        }
        for (int i = 0; i < np; i++) {
            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int r = map[i];
            char buf[4096];
            ssize_t got = read(pf[i].fd, buf, sizeof buf);
            if (got > 0) {
                feed(&res[r], buf, (size_t)got);
            } else if (got == 0 || errno != EINTR) {
                close(fds[r]);
                fds[r] = -1;
                open_n--;
                if (!res[r].ready)
                    release(go, n);
            }
        }
        if (!reported) {
            int all = 1;
            for (int r = 0; r < n; r++)
                all &= res[r].ready;
            if (all) {
                reported = 1;
                failed |= verify_and_report(&o, res, n);
                if (!failed && o.stats_cmd) {
                    int st = system(o.stats_cmd);
                    fflush(stdout);
                    if (st != 0) {
                        fprintf(stderr, "trainer: FAILED: --stats-cmd '%s' %s %d\n", o.stats_cmd,
                                st == -1 ? "could not run:" : "exited with status",
                                st == -1 ? errno : (WIFEXITED(st) ? WEXITSTATUS(st) : st));
                        failed = 1;
                    }
                }
                release(go, n);
            }
        }
    }
    release(go, n);
    for (int r = 0; r < n; r++) {
        int st;
        while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !res[r].done) {
            if (WIFSIGNALED(st))
                fprintf(stderr, "trainer: rank %d was killed by signal %d\n", r, WTERMSIG(st));
            failed = 1;
        }
    }
    int first_err = -1;
    for (int r = 0; r < n && first_err < 0; r++)
        if (res[r].err[0])
            first_err = r;
    if (first_err >= 0)
        fprintf(stderr, "trainer: FAILED: rank %d: %s\n", first_err, res[first_err].err);
    else if (failed && !reported)
        fprintf(stderr, "trainer: FAILED: a rank exited without finishing (see above)\n");
    for (int r = 0; r < n; r++)
        free(res[r].offs);
    return failed || first_err >= 0 ? 1 : 0;
}
