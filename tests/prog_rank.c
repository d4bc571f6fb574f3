/* prog_rank - one scriptable rank of a heap, for the integration tests.
 *
 *   prog_rank --socket PATH --heap NAME --rank R --world W [options] [CMD...]
 *
 * Connects, attaches (collective) and runs commands: from argv when any are
 * given, else from stdin, one or more per line ('#' starts a comment). See
 * usage() for the commands, their output lines and the exit codes.
 */
#include "heapc.h"
#include "size.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Exit codes. */
#define X_SUCCESS  0
#define X_ERROR    1 /* any other heapc error */
#define X_USAGE    2
#define X_CHECK    3  /* check / data verification failed */
#define X_ASYM     4  /* ERR_ASYMMETRY */
#define X_TIMEOUT  5  /* ERR_TIMEOUT (or ERR_NOREPLY) */
#define X_PEERGONE 6  /* ERR_PEER_GONE */
#define X_CONN     7  /* ERR_CONN: heapd unreachable or closed the connection */
#define X_NOTHELD  8  /* ERR_NOT_HELD: double free */
#define X_MISMATCH 9  /* ERR_MISMATCH: attach parameters differ */
#define X_VA       10 /* ERR_VA_EXHAUSTED */

static void usage(FILE *f)
{
    fprintf(f, "Usage: prog_rank --socket PATH --heap NAME --rank R --world W [options] [CMD...]\n"
               "\n"
               "One rank of heap NAME: connects to heapd, attaches (collective) and runs the\n"
               "commands given on the command line, or, when there are none, those read from\n"
               "stdin (whitespace-separated, several per line allowed, '#' starts a comment).\n"
               "Output goes to stdout, one line per event, flushed at once.\n"
               "\n"
               "Options:\n"
               "  --socket PATH       heapd's socket (default: $HEAPD_SOCKET, else the default path)\n"
               "  --heap NAME         heap name (required)\n"
               "  --rank R            this rank (required)\n"
               "  --world W           world size (required)\n"
               "  --chunk SIZE        heap chunk_size     (sizes: 4096, 64K, 2M, 1G...)\n"
               "  --initial SIZE      heap initial_size\n"
               "  --va SIZE           heap va_size\n"
               "  --min-block SIZE    heap min_block\n"
               "  --policy P          default | coalesce | seed\n"
               "  --reclaim R         default | eager | collect (issue 27)\n"
               "  --timeout-ms MS     heap collect_timeout_ms\n"
               "  --local-size N      ranks of the heap on this node (multi-node heaps)\n"
               "  --job ID            job incarnation (multi-node heaps)\n"
               "  --seed S            seed of 'random' (default 1): sizes and collect points\n"
               "                      depend on S only, free timing on S and the rank\n"
               "  --batch N           free batch size (heapc_set_free_batch)\n"
               "  --no-attach         connect only; use the 'attach' command\n"
               "  -h, --help          this text\n"
               "\n"
               "Commands (SEQ: an allocation number of this rank; BYTE: 0..255, decimal or 0x..):\n"
               "  alloc SIZE          allocate; prints 'a SEQ OFFSET'\n"
               "  free SEQ            free the block of allocation SEQ (deferred, batched)\n"
               "  freeoff OFFSET      free the block at OFFSET (e.g. one allocated before a\n"
               "                      reconnect, or a bogus one to provoke ERR_NOT_HELD)\n"
               "  flush               send the queued frees now\n"
               "  collect             collective collect; prints 'c COLLECTS BLOCKS BYTES' (the\n"
               "                      heap's collect count, what this collect reclaimed)\n"
               "  write SEQ PEER BYTE fill local rank PEER's copy of block SEQ with BYTE (host)\n"
               "  check SEQ BYTE      this rank's copy of block SEQ must be all BYTE (host), else\n"
               "                      exit 3\n"
               "  sleep MS            sleep MS milliseconds\n"
               "  touch PATH          create the file PATH (tells a test script a state was\n"
               "                      reached)\n"
               "  waitfile PATH       wait until the file PATH exists (the script's go-ahead;\n"
               "                      at most 300 s, then exit 1)\n"
               "  stats               print 's heap KEY=VALUE...', one 's rank KEY=VALUE...' per\n"
               "                      rank and 's client KEY=VALUE...' (this context's counters)\n"
               "  random N            N steps of a seeded workload: each step frees the blocks\n"
               "                      whose (per-rank random) lifetime ended, sometimes collects\n"
               "                      (same steps on every rank), and allocates a random size\n"
               "                      (same sizes on every rank); prints each 'a SEQ OFFSET' and\n"
               "                      'c ...'; on the host backend each block is filled and\n"
               "                      verified at its free (exit 3 on corruption)\n"
               "  batch N             set the free batch size\n"
               "  attach              attach again (after detach or --no-attach); prints\n"
               "                      'attached RANK WORLD MAPPED NEXT_SEQ'\n"
               "  detach              detach; prints 'detached'\n"
               "  mapped              print 'm MAPPED'\n"
               "  status              print the status page: 'p mapped=.. live=.. ...'\n"
               "  statusstuck         make the status page look mid-write (its seq odd, as\n"
               "                      a heapd dead mid-update leaves it) and read it: 'busy'\n"
               "                      when heapc_status gives up with ERR_BUSY; 'readonly'\n"
               "                      when heapd sealed the page against writes (EPERM)\n"
               "  try CMD ...         run CMD; on error print 'e CODE message' and go on\n"
               "  exit [CODE]         exit at once with CODE (default 0), without detaching\n"
               "\n"
               "At start (unless --no-attach) it prints 'attached RANK WORLD MAPPED NEXT_SEQ'.\n"
               "Errors print 'error: CODE: message' on stderr (CODE as ERR_ASYMMETRY); an\n"
               "asymmetric allocation's figures follow as 'asymmetry: n=N ranks=A,B\n"
               "sizes=SA,SB' (inside 'try': 'x asymmetry n=N ...' on stdout).\n"
               "\n"
               "Exit status: 0 ok; 1 other error; 2 usage; 3 check failed; 4 ERR_ASYMMETRY;\n"
               "5 ERR_TIMEOUT or no reply; 6 ERR_PEER_GONE; 7 connection to heapd failed or\n"
               "closed; 8 ERR_NOT_HELD; 9 ERR_MISMATCH; 10 ERR_VA_EXHAUSTED.\n");
}

/* ---- state ----------------------------------------------------------------- */

typedef struct block {
    uint64_t offset;
    uint64_t size;
    int live;
    uint64_t death; /* random: step at which it is freed; 0: never */
    int filled;     /* random: own copy filled with fill */
    unsigned char fill;
} block;

static struct {
    heapc *c;
    const char *sock, *heap;
    uint32_t rank, world;
    int have_rank, have_world;
    heapc_params params;
    uint64_t seed;
    size_t batch;
    int host;
    block *b;
    size_t nb, cap;
    /* random */
    uint64_t shared_rng, rank_rng;
    int rng_init;
    uint64_t step;
} g;

static int try_mode; /* inside 'try' */

static int exit_code(int err)
{
    switch (err) {
    case HEAPC_EASYMMETRY:
        return X_ASYM;
    case HEAPC_ETIMEOUT:
    case HEAPC_ENOREPLY:
        return X_TIMEOUT;
    case HEAPC_EPEER_GONE:
        return X_PEERGONE;
    case HEAPC_ECONN:
        return X_CONN;
    case HEAPC_ENOTHELD:
        return X_NOTHELD;
    case HEAPC_EMISMATCH:
        return X_MISMATCH;
    case HEAPC_EVA_EXHAUSTED:
        return X_VA;
    default:
        return X_ERROR;
    }
}

/* An asymmetric allocation's figures (heapc_last_asymmetry) as
 * "n=N ranks=A,B sizes=SA,SB" into buf; "" when the error has none. */
static const char *asym_line(char *buf, size_t len)
{
    uint64_t n = 0, sizes[8];
    uint32_t ranks[8];
    size_t k = heapc_last_asymmetry(g.c, &n, ranks, sizes, 8);
    buf[0] = '\0';
    if (!k)
        return buf;
    size_t o = (size_t)snprintf(buf, len, "n=%" PRIu64 " ranks=", n);
    for (size_t i = 0; i < k && i < 8 && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu32, i ? "," : "", ranks[i]);
    if (o < len)
        o += (size_t)snprintf(buf + o, len - o, " sizes=");
    for (size_t i = 0; i < k && i < 8 && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, i ? "," : "", sizes[i]);
    return buf;
}

/* A heapc call failed: report; returns the exit code, or 0 inside 'try'.
 * An asymmetric allocation's figures follow on a line of their own:
 * 'x asymmetry n=N ranks=A,B sizes=SA,SB' (stdout inside 'try'), else
 * 'asymmetry: n=N ...' on stderr. */
static int fail_heapc(int rc)
{
    char al[256];
    asym_line(al, sizeof al);
    if (try_mode) {
        printf("e %s %s\n", heapc_errname(rc), heapc_errstr(g.c));
        if (al[0])
            printf("x asymmetry %s\n", al);
        fflush(stdout);
        return 0;
    }
    fprintf(stderr, "error: %s: %s\n", heapc_errname(rc), heapc_errstr(g.c));
    if (al[0])
        fprintf(stderr, "asymmetry: %s\n", al);
    return exit_code(rc);
}

static int fail_local(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_local(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (try_mode) {
        fputs("e ERR_LOCAL ", stdout);
        vprintf(fmt, ap);
        putchar('\n');
        fflush(stdout);
        va_end(ap);
        return 0;
    }
    fputs(code == X_CHECK ? "error: CHECK: " : "error: USAGE: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

static block *blk(uint64_t seq)
{
    if (seq >= g.nb)
        return NULL;
    return &g.b[seq];
}

static block *blk_put(uint64_t seq)
{
    if (seq >= g.cap) {
        size_t ncap = g.cap ? g.cap : 256;
        while (ncap <= seq)
            ncap *= 2;
        block *n = realloc(g.b, ncap * sizeof *n);
        if (!n)
            return NULL;
        memset(n + g.cap, 0, (ncap - g.cap) * sizeof *n);
        g.b = n;
        g.cap = ncap;
    }
    if (seq >= g.nb)
        g.nb = seq + 1;
    return &g.b[seq];
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return -1;
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 0);
    if (errno || *e)
        return -1;
    *out = v;
    return 0;
}

static int parse_size(const char *s, uint64_t *out) { return hsz_parse_size(s, out) == 0 ? 0 : parse_u64(s, out); }

/* splitmix64 */
static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ---- commands ---------------------------------------------------------------- */

static int do_attach(void)
{
    int rc = heapc_attach(g.c, g.heap, g.rank, g.world, &g.params);
    if (rc != HEAPC_OK)
        return fail_heapc(rc);
    g.host = strcmp(heapc_backend(g.c), "host") == 0;
    if (g.batch && (rc = heapc_set_free_batch(g.c, g.batch)) != HEAPC_OK)
        return fail_heapc(rc);
    printf("attached %" PRIu32 " %" PRIu32 " %" PRIu64 " %" PRIu64 "\n", g.rank, g.world, heapc_mapped(g.c),
           heapc_next_seq(g.c));
    fflush(stdout);
    return 0;
}

static int do_alloc(uint64_t size, uint64_t *seq_out)
{
    uint64_t seq = heapc_next_seq(g.c), off;
    int rc = heapc_alloc(g.c, (size_t)size, NULL, &off);
    if (rc != HEAPC_OK && rc != HEAPC_EMAP)
        return fail_heapc(rc);
    block *b = blk_put(seq);
    if (!b)
        return fail_local(X_ERROR, "out of memory");
    memset(b, 0, sizeof *b);
    b->offset = off;
    b->size = size;
    b->live = 1;
    printf("a %" PRIu64 " %" PRIu64 "\n", seq, off);
    fflush(stdout);
    if (seq_out)
        *seq_out = seq;
    return rc == HEAPC_OK ? 0 : fail_heapc(rc);
}

static int do_free(uint64_t seq)
{
    block *b = blk(seq);
    /* Unknown or already freed: still ask the library, which must refuse it. */
    uint64_t off = b ? b->offset : UINT64_MAX - 1;
    if (b && b->live && b->filled && g.host) {
        const unsigned char *p = heapc_ptr(g.c, b->offset);
        for (uint64_t i = 0; p && i < b->size; i++)
            if (p[i] != b->fill)
                return fail_local(X_CHECK,
                                  "block %" PRIu64 " (offset %" PRIu64 ", %" PRIu64 " bytes) was "
                                  "overwritten while this rank held it: byte +%" PRIu64 " is 0x%02x, expected 0x%02x",
                                  seq, b->offset, b->size, i, p[i], b->fill);
    }
    int rc = heapc_free(g.c, off);
    if (rc != HEAPC_OK)
        return fail_heapc(rc);
    if (b)
        b->live = 0;
    return 0;
}

static int do_collect(void)
{
    int rc = heapc_collect(g.c);
    if (rc != HEAPC_OK)
        return fail_heapc(rc);
    heapc_counters k;
    heapc_get_counters(g.c, &k);
    printf("c %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", k.heap_collects, k.last_reclaimed_blocks, k.last_reclaimed_bytes);
    fflush(stdout);
    return 0;
}

static int need_host(const char *cmd)
{
    if (!g.host)
        return fail_local(X_USAGE, "%s needs the host backend (heapd serves %s)", cmd, heapc_backend(g.c));
    return 0;
}

static int do_write(uint64_t seq, uint64_t peer, uint64_t byte)
{
    int rc;
    if ((rc = need_host("write")) || (!g.host))
        return rc;
    block *b = blk(seq);
    if (!b || !b->live)
        return fail_local(X_USAGE, "write: allocation %" PRIu64 " is not a live block of rank %" PRIu32, seq, g.rank);
    if (peer > UINT32_MAX || byte > 255)
        return fail_local(X_USAGE, "write: PEER or BYTE out of range");
    unsigned char *p = heapc_peer_ptr(g.c, (uint32_t)peer, b->offset);
    if (!p)
        return fail_local(X_USAGE,
                          "write: rank %" PRIu64 " is not served by this heapd (or "
                          "offset %" PRIu64 " is not mapped)",
                          peer, b->offset);
    memset(p, (int)byte, (size_t)b->size);
    return 0;
}

static int do_check(uint64_t seq, uint64_t byte)
{
    int rc;
    if ((rc = need_host("check")) || (!g.host))
        return rc;
    block *b = blk(seq);
    if (!b || !b->live)
        return fail_local(X_USAGE, "check: allocation %" PRIu64 " is not a live block of rank %" PRIu32, seq, g.rank);
    if (byte > 255)
        return fail_local(X_USAGE, "check: BYTE out of range");
    const unsigned char *p = heapc_ptr(g.c, b->offset);
    if (!p)
        return fail_local(X_CHECK, "check: offset %" PRIu64 " is not mapped", b->offset);
    for (uint64_t i = 0; i < b->size; i++)
        if (p[i] != byte)
            return fail_local(X_CHECK,
                              "check failed: rank %" PRIu32 ", block %" PRIu64 " (offset %" PRIu64 ", %" PRIu64
                              " bytes): byte +%" PRIu64 " is 0x%02x, expected 0x%02x",
                              g.rank, seq, b->offset, b->size, i, p[i], (unsigned)byte);
    return 0;
}

static int do_stats(void)
{
    heapc_daemon_stats *s;
    int rc = heapc_stats(g.c, g.heap, &s);
    if (rc != HEAPC_OK)
        return fail_heapc(rc);
    for (size_t i = 0; i < s->nheaps; i++) {
        const heapc_heap_stats *h = &s->heaps[i];
        printf("s heap name=%s world=%" PRIu32 " mapped=%" PRIu64 " live=%" PRIu64 " released=%" PRIu64 " free=%" PRIu64
               " collects=%" PRIu64 " growths=%" PRIu64 " clients=%" PRIu32 " next_seq=%" PRIu64 " epoch=%" PRIu64
               " pending_collect_seq=%" PRIu64 " chunk=%" PRIu64 " va=%" PRIu64 " min_block=%" PRIu64
               " policy=%s reclaim=%s eager=%" PRIu64 "\n",
               h->name, h->world_size, h->mapped, h->live_bytes, h->released_bytes, h->free_bytes, h->collects,
               h->growths, h->clients, h->next_seq, h->epoch, h->pending_collect_seq, h->params.chunk_size,
               h->params.va_size, h->params.min_block, heapc_policy_name(h->params.policy),
               h->params.reclaim == HEAPC_RECLAIM_EAGER ? "eager" : "collect", h->eager_reclaims);
        for (size_t r = 0; r < h->nranks; r++) {
            const heapc_rank_stats *k = &h->ranks[r];
            printf("s rank rank=%" PRIu32 " attached=%d pid=%" PRIu32 " live=%" PRIu64 " released=%" PRIu64
                   " next_seq=%" PRIu64 "\n",
                   k->rank, k->attached, k->pid, k->live_bytes, k->released_bytes, k->next_seq);
        }
    }
    heapc_stats_free(s);
    heapc_counters k;
    heapc_get_counters(g.c, &k);
    printf("s client allocs=%" PRIu64 " frees=%" PRIu64 " free_batches=%" PRIu64 " collects=%" PRIu64
           " collects_needed=%" PRIu64 " chunks_mapped=%" PRIu64 " queued_frees=%" PRIu64 " mapped=%" PRIu64
           " local_allocs=%" PRIu64 " replica_lost=%" PRIu64 "\n",
           k.allocs, k.frees, k.free_batches, k.collects, k.collects_needed, k.chunks_mapped, k.queued_frees,
           heapc_mapped(g.c), k.local_allocs, k.replica_lost);
    fflush(stdout);
    return 0;
}

static int do_random(uint64_t n)
{
    if (!g.rng_init) {
        g.shared_rng = g.seed * 0x2545f4914f6cdd1dULL + 1;
        g.rank_rng = (g.seed + 0x632be59bd9b4e019ULL) ^ ((uint64_t)(g.rank + 1) * 0x9e3779b97f4a7c15ULL);
        g.rng_init = 1;
    }
    for (uint64_t i = 0; i < n; i++) {
        g.step++;
        /* Frees whose lifetime ended, in allocation order. */
        for (uint64_t s = 0; s < g.nb; s++) {
            block *b = &g.b[s];
            if (b->live && b->death && b->death <= g.step) {
                int rc = do_free(s);
                if (rc)
                    return rc;
            }
        }
        /* Same on every rank: collect points and sizes. */
        uint64_t r = rnd(&g.shared_rng);
        if (r % 16 == 0) {
            int rc = do_collect();
            if (rc)
                return rc;
        }
        uint64_t e = rnd(&g.shared_rng) % 18;
        uint64_t size = 1 + rnd(&g.shared_rng) % ((uint64_t)1 << e);
        uint64_t seq;
        int rc = do_alloc(size, &seq);
        if (rc)
            return rc;
        /* Per rank: lifetime; one block in eight lives on. */
        uint64_t lr = rnd(&g.rank_rng);
        block *b = blk(seq);
        b->death = lr % 8 == 0 ? 0 : g.step + 1 + (lr >> 8) % 48;
        if (g.host) {
            unsigned char *p = heapc_ptr(g.c, b->offset);
            if (p) {
                b->fill = (unsigned char)(seq * 131 + g.rank * 7 + 1);
                memset(p, b->fill, (size_t)b->size);
                b->filled = 1;
            }
        }
    }
    return 0;
}

/* Runs the commands in tok[0..ntok); returns an exit code (0: go on), or -1
 * after 'exit' with *xcode set. */
static int run_tokens(char **tok, int ntok, int *xcode)
{
    for (int i = 0; i < ntok;) {
        const char *cmd = tok[i++];
        int rc = 0;
        uint64_t a = 0, b = 0, c = 0;
        int was_try = 0;
        if (!strcmp(cmd, "try")) {
            if (i >= ntok)
                return fail_local(X_USAGE, "try needs a command");
            try_mode = 1;
            was_try = 1;
            cmd = tok[i++];
        }
#define ARGS(n)                                                                                                        \
    do {                                                                                                               \
        if (i + (n) > ntok) {                                                                                          \
            try_mode = 0;                                                                                              \
            return fail_local(X_USAGE, "%s needs %d argument%s", cmd, (n), (n) == 1 ? "" : "s");                       \
        }                                                                                                              \
    } while (0)
#define NUM(idx, var, what)                                                                                            \
    do {                                                                                                               \
        if (parse_u64(tok[i + (idx)], &(var)) != 0) {                                                                  \
            try_mode = 0;                                                                                              \
            return fail_local(X_USAGE, "%s: %s '%s' is not a number", cmd, what, tok[i + (idx)]);                      \
        }                                                                                                              \
    } while (0)
        if (!strcmp(cmd, "alloc")) {
            ARGS(1);
            if (parse_size(tok[i], &a) != 0) {
                try_mode = 0;
                return fail_local(X_USAGE, "alloc: '%s' is not a size", tok[i]);
            }
            i += 1;
            rc = do_alloc(a, NULL);
        } else if (!strcmp(cmd, "free")) {
            ARGS(1);
            NUM(0, a, "SEQ");
            i += 1;
            rc = do_free(a);
        } else if (!strcmp(cmd, "freeoff")) {
            ARGS(1);
            NUM(0, a, "OFFSET");
            i += 1;
            int r = heapc_free(g.c, a);
            rc = r ? fail_heapc(r) : 0;
            for (size_t s = 0; !r && s < g.nb; s++)
                if (g.b[s].live && g.b[s].offset == a)
                    g.b[s].live = 0;
        } else if (!strcmp(cmd, "flush")) {
            int r = heapc_flush(g.c);
            rc = r ? fail_heapc(r) : 0;
        } else if (!strcmp(cmd, "collect")) {
            rc = do_collect();
        } else if (!strcmp(cmd, "write")) {
            ARGS(3);
            NUM(0, a, "SEQ");
            NUM(1, b, "PEER");
            NUM(2, c, "BYTE");
            i += 3;
            rc = do_write(a, b, c);
        } else if (!strcmp(cmd, "check")) {
            ARGS(2);
            NUM(0, a, "SEQ");
            NUM(1, b, "BYTE");
            i += 2;
            rc = do_check(a, b);
        } else if (!strcmp(cmd, "sleep")) {
            ARGS(1);
            NUM(0, a, "MS");
            i += 1;
            struct timespec ts = {(time_t)(a / 1000), (long)(a % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        } else if (!strcmp(cmd, "touch")) {
            ARGS(1);
            int fd = open(tok[i], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0)
                return fail_local(1, "touch %s: %s", tok[i], strerror(errno));
            close(fd);
            i += 1;
        } else if (!strcmp(cmd, "waitfile")) {
            ARGS(1);
            int waited = 0;
            struct stat st;
            while (stat(tok[i], &st) != 0) {
                if (waited++ >= 300 * 100)
                    return fail_local(1, "waitfile %s: not there after 300 s", tok[i]);
                struct timespec ts = {0, 10 * 1000000L};
                nanosleep(&ts, NULL);
            }
            i += 1;
        } else if (!strcmp(cmd, "stats")) {
            rc = do_stats();
        } else if (!strcmp(cmd, "random")) {
            ARGS(1);
            NUM(0, a, "N");
            i += 1;
            rc = do_random(a);
        } else if (!strcmp(cmd, "batch")) {
            ARGS(1);
            NUM(0, a, "N");
            i += 1;
            int r = heapc_set_free_batch(g.c, (size_t)a);
            rc = r ? fail_heapc(r) : 0;
            if (!r)
                g.batch = (size_t)a;
        } else if (!strcmp(cmd, "attach")) {
            rc = do_attach();
        } else if (!strcmp(cmd, "detach")) {
            int r = heapc_detach(g.c);
            if (r) {
                rc = fail_heapc(r);
            } else {
                printf("detached\n");
                fflush(stdout);
            }
        } else if (!strcmp(cmd, "mapped")) {
            printf("m %" PRIu64 "\n", heapc_mapped(g.c));
            fflush(stdout);
        } else if (!strcmp(cmd, "status")) {
            heapc_status_t st;
            if (heapc_status(g.c, &st) != 0) {
                fprintf(stderr, "error: no status page (not attached?)\n");
                return 1;
            }
            printf("p mapped=%" PRIu64 " live=%" PRIu64 " released=%" PRIu64 " free=%" PRIu64 " rank_held=%" PRIu64
                   " rank_released=%" PRIu64 " collects=%" PRIu64 " growths=%" PRIu64 " allocs=%" PRIu64
                   " device_free=%" PRIu64 " device_total=%" PRIu64 " updates=%" PRIu64 "\n",
                   st.mapped, st.live, st.released, st.free, st.rank_held, st.rank_released, st.collects, st.growths,
                   st.allocs, st.device_free, st.device_total, st.updates);
            fflush(stdout);
        } else if (!strcmp(cmd, "statusstuck")) {
            int sfd = heapc_status_fd(g.c);
            uint64_t *pg = sfd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
            if (pg == MAP_FAILED && sfd >= 0 && errno == EPERM) { /* heapd sealed it: F_SEAL_FUTURE_WRITE */
                printf("readonly\n");
                fflush(stdout);
            } else if (pg == MAP_FAILED) {
                fprintf(stderr, "error: cannot map the status page writable: %s\n", strerror(errno));
                return 1;
            } else {
                uint64_t *seq = (uint64_t *)((char *)pg + offsetof(hs_page, seq));
                __atomic_store_n(seq, __atomic_load_n(seq, __ATOMIC_RELAXED) | 1, __ATOMIC_RELEASE);
                heapc_status_t st;
                int src = heapc_status(g.c, &st);
                printf("%s\n", src == HEAPC_EBUSY ? "busy" : heapc_errname(src));
                fflush(stdout);
                munmap(pg, 4096);
            }
        } else if (!strcmp(cmd, "exit")) {
            *xcode = 0;
            if (i < ntok && parse_u64(tok[i], &a) == 0) {
                *xcode = (int)(a & 0xff);
                i++;
            }
            fflush(stdout);
            return -1;
        } else {
            try_mode = 0;
            return fail_local(X_USAGE, "unknown command '%s' (see --help)", cmd);
        }
        if (was_try)
            try_mode = 0;
        if (rc)
            return rc;
    }
    return 0;
#undef ARGS
#undef NUM
}

int main(int argc, char **argv)
{
    enum {
        O_SOCKET = 256,
        O_HEAP,
        O_RANK,
        O_WORLD,
        O_CHUNK,
        O_INITIAL,
        O_VA,
        O_MINBLOCK,
        O_POLICY,
        O_TIMEOUT,
        O_SEED,
        O_BATCH,
        O_NOATTACH,
        O_LOCAL,
        O_JOB,
        O_RECLAIM
    };
    static const struct option opts[] = {
        {"socket", required_argument, NULL, O_SOCKET},
        {"heap", required_argument, NULL, O_HEAP},
        {"rank", required_argument, NULL, O_RANK},
        {"world", required_argument, NULL, O_WORLD},
        {"chunk", required_argument, NULL, O_CHUNK},
        {"initial", required_argument, NULL, O_INITIAL},
        {"va", required_argument, NULL, O_VA},
        {"min-block", required_argument, NULL, O_MINBLOCK},
        {"policy", required_argument, NULL, O_POLICY},
        {"reclaim", required_argument, NULL, O_RECLAIM},
        {"timeout-ms", required_argument, NULL, O_TIMEOUT},
        {"seed", required_argument, NULL, O_SEED},
        {"batch", required_argument, NULL, O_BATCH},
        {"no-attach", no_argument, NULL, O_NOATTACH},
        {"local-size", required_argument, NULL, O_LOCAL},
        {"job", required_argument, NULL, O_JOB},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    g.seed = 1;
    int no_attach = 0, o;
    uint64_t v;
    while ((o = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (o) {
        case O_SOCKET:
            g.sock = optarg;
            break;
        case O_JOB:
            g.params.job = optarg;
            break;
        case O_LOCAL:
            if (parse_u64(optarg, &v) != 0 || v > UINT32_MAX) {
                fprintf(stderr, "prog_rank: --local-size: '%s' is not a number\n", optarg);
                return X_USAGE;
            }
            g.params.local_size = (uint32_t)v;
            break;
        case O_HEAP:
            g.heap = optarg;
            break;
        case O_RANK:
        case O_WORLD:
        case O_TIMEOUT:
            if (parse_u64(optarg, &v) != 0 || v > UINT32_MAX) {
                fprintf(stderr, "prog_rank: %s: '%s' is not a number\n",
                        o == O_RANK    ? "--rank"
                        : o == O_WORLD ? "--world"
                                       : "--timeout-ms",
                        optarg);
                return X_USAGE;
            }
            if (o == O_RANK) {
                g.rank = (uint32_t)v;
                g.have_rank = 1;
            } else if (o == O_WORLD) {
                g.world = (uint32_t)v;
                g.have_world = 1;
            } else {
                g.params.collect_timeout_ms = (uint32_t)v;
            }
            break;
        case O_CHUNK:
        case O_INITIAL:
        case O_VA:
        case O_MINBLOCK:
            if (parse_size(optarg, &v) != 0) {
                fprintf(stderr, "prog_rank: '%s' is not a size (4096, 64K, 2M, 1G)\n", optarg);
                return X_USAGE;
            }
            if (o == O_CHUNK)
                g.params.chunk_size = v;
            else if (o == O_INITIAL)
                g.params.initial_size = v;
            else if (o == O_VA)
                g.params.va_size = v;
            else
                g.params.min_block = v;
            break;
        case O_POLICY:
            if (!strcmp(optarg, "default"))
                g.params.policy = HEAPC_POLICY_DEFAULT;
            else if (!strcmp(optarg, "coalesce"))
                g.params.policy = HEAPC_POLICY_COALESCE;
            else if (!strcmp(optarg, "seed"))
                g.params.policy = HEAPC_POLICY_SEED;
            else {
                fprintf(stderr, "prog_rank: --policy: '%s' is not default, coalesce or seed\n", optarg);
                return X_USAGE;
            }
            break;
        case O_RECLAIM:
            if (!strcmp(optarg, "default"))
                g.params.reclaim = HEAPC_RECLAIM_DEFAULT;
            else if (!strcmp(optarg, "eager"))
                g.params.reclaim = HEAPC_RECLAIM_EAGER;
            else if (!strcmp(optarg, "collect"))
                g.params.reclaim = HEAPC_RECLAIM_COLLECT;
            else {
                fprintf(stderr, "prog_rank: --reclaim: '%s' is not default, eager or collect\n", optarg);
                return X_USAGE;
            }
            break;
        case O_SEED:
            if (parse_u64(optarg, &g.seed) != 0) {
                fprintf(stderr, "prog_rank: --seed: '%s' is not a number\n", optarg);
                return X_USAGE;
            }
            break;
        case O_BATCH:
            if (parse_u64(optarg, &v) != 0 || v == 0 || v > 65536) {
                fprintf(stderr, "prog_rank: --batch: '%s' is not in 1..65536\n", optarg);
                return X_USAGE;
            }
            g.batch = (size_t)v;
            break;
        case O_NOATTACH:
            no_attach = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            fprintf(stderr, "Try 'prog_rank --help'.\n");
            return X_USAGE;
        }
    }
    if (!g.heap || !g.have_rank || !g.have_world) {
        fprintf(stderr, "prog_rank: --heap, --rank and --world are required\nTry 'prog_rank --help'.\n");
        return X_USAGE;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    g.c = heapc_connect(g.sock);
    if (!g.c) {
        fprintf(stderr, "error: ERR_OOM: out of memory\n");
        return X_ERROR;
    }
    int xcode = 0, rc = 0;
    if (heapc_err(g.c)) {
        rc = fail_heapc(heapc_err(g.c));
        heapc_free_ctx(g.c);
        return rc;
    }
    if (!no_attach && (rc = do_attach()) != 0)
        goto out;

    if (optind < argc) {
        rc = run_tokens(argv + optind, argc - optind, &xcode);
    } else {
        char line[4096];
        while (rc == 0 && fgets(line, sizeof line, stdin)) {
            char *hash = strchr(line, '#');
            if (hash)
                *hash = '\0';
            char *tok[256];
            int ntok = 0;
            for (char *t = strtok(line, " \t\r\n"); t && ntok < 256; t = strtok(NULL, " \t\r\n"))
                tok[ntok++] = t;
            if (ntok)
                rc = run_tokens(tok, ntok, &xcode);
        }
    }
    if (rc == -1) { /* exit command: no detach, the connection just closes */
        fflush(stdout);
        _Exit(xcode);
    }
out:
    fflush(stdout);
    heapc_free_ctx(g.c);
    free(g.b);
    return rc;
}
