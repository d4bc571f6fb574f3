/* prog_resume - one rank of a seeded workload on a persistent heap (issue 29),
 * for tests/it_persist.sh: killed with SIGKILL anywhere, restarted with
 * --resume, it re-attaches and checks what it finds against its own log.
 *
 *   prog_resume --socket S --heap H --rank R --world W [options]
 *
 * The workload: --ops operations drawn from --seed alone (the same on every
 * rank): allocations named "sSEED.K" of random sizes (each block filled with
 * a pattern of its name and the rank), frees of random live blocks, collects,
 * and every --commit-every allocations a commit of the marker "step" (0: no
 * commits, for heaps that span nodes). One line per event on stdout, flushed
 * at once; upper case when begun, lower case once completed:
 *   s NEXT_SEQ GENERATION RESUMED   attached
 *   A K / a SEQ OFF SIZE NAME N     allocation K of the plan (N: the heap's collects)
 *   w NAME CSUM                     its pattern is written (FNV-1a 64 of the block)
 *   F OFF / f OFF                   a free (batch 1: sent at once, no reply)
 *   C / c N                         a collect (N: the heap's collects after it)
 *   M STEP / m STEP                 a commit of the marker "step"
 *   L SEQ OFF SIZE NAME             at the end: every block this rank holds
 *   d                               the plan is done
 * --resume LOG (the previous runs' stdout, concatenated): after the attach,
 *   l SEQ OFF SIZE NAME CSUM        every block of the live set, ascending seq
 *   v NAME ok                       a block whose `w` was logged holds its pattern
 *   k step VALUE | k step none      the marker
 *   r I done|again                  the plan's op I, in flight at the kill, took
 *                                   effect (or is made again)
 * It checks the live set against LOG: a block whose `a` was logged and not
 * freed is live with the same seq, offset, size and name (heapc_lookup
 * agrees); one whose free was acknowledged (a `c` or `m` logged after its
 * `F`: a Free has no reply of its own) is not; one whose free was in flight
 * may be either; a live block not in LOG is the allocation in flight at the
 * kill (seq past LOG's last); every block whose `w` was logged holds its
 * pattern bit for bit; the marker lies between the last `m` and `M` logged.
 * Each failure prints `e WHAT` (exit 3). Then it goes on with the plan where
 * this rank left it: the allocations decided while it was gone (a rank
 * re-attaches at the heap's allocation number; the live set holds what the
 * others allocated meanwhile) are taken from the live set (`a`/`w` lines),
 * the rest is made as planned.
 * --wait-peers: collectives that fail with ERR_PEER_GONE or ERR_TIMEOUT (a
 * rank gone, not yet back) are retried, 150 s at most, as a resumed rank's are.
 * --attach-only: attach, print the `s` line, exit; --hold-ms MS: stay
 * attached MS ms after the `s` line first.
 * Exit codes: 0 ok, 1 heapc error (`E CODE MESSAGE` on stderr), 2 usage,
 * 3 check failed.
 */
#include "heapc.h"
#include "size.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXB 4096 /* blocks of one run */

enum op_kind { OP_ALLOC, OP_FREE, OP_COLLECT, OP_COMMIT };
typedef struct op {
    enum op_kind kind;
    uint64_t size; /* OP_ALLOC */
    int idx;       /* OP_ALLOC: its alloc number K; OP_FREE: the K freed */
} op;

static struct {
    const char *sock, *heap, *resume, *job;
    uint32_t rank, world, local;
    int32_t persist;
    uint64_t seed, chunk, va, max_size;
    int ops, commit_every, pace_us, hold_ms, wait_peers;
} o = {.seed = 1, .max_size = 40000, .ops = 200, .commit_every = 8};

static heapc *c;
static op ops[MAXB];
static int nops;
static int failures;
static uint64_t seq0; /* the workload's first allocation number */

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void die(const char *what)
{
    fprintf(stderr, "E %s %s: %s\n", heapc_errname(heapc_err(c)), what, heapc_errstr(c));
    exit(1);
}

static void bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("e ");
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
    failures++;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The pattern of block `name` on `rank`: byte j of mix(h + j / 8). */
static void pattern(unsigned char *p, uint64_t size, const char *name, uint32_t rank)
{
    uint64_t h = fnv(name, strlen(name)) ^ ((uint64_t)rank + 1) * 0x9e3779b97f4a7c15ull;
    for (uint64_t j = 0; j < size; j += 8) {
        uint64_t w = mix(h + j / 8);
        for (uint64_t b = 0; b < 8 && j + b < size; b++)
            p[j + b] = (unsigned char)(w >> (8 * b));
    }
}

static void op_name(char *buf, size_t len, int k) { snprintf(buf, len, "s%" PRIu64 ".%d", o.seed, k); }

/* The workload of --seed: the same list on every rank. */
static void plan(void)
{
    int live[MAXB], nlive = 0, k = 0;
    uint64_t r = o.seed * 0x2545f4914f6cdd1dull;
    for (nops = 0; nops < o.ops && nops < MAXB; nops++) {
        op *p = &ops[nops];
        r = mix(r);
        int u = (int)(r % 20);
        if (nlive > 0 && u < 6) {
            int j = (int)((r >> 20) % (uint64_t)nlive);
            *p = (op){OP_FREE, 0, live[j]};
            live[j] = live[--nlive];
        } else if (u == 6) {
            *p = (op){OP_COLLECT, 0, 0};
        } else if (o.commit_every > 0 && k > 0 && k % o.commit_every == 0 && ops[nops - 1].kind == OP_ALLOC) {
            *p = (op){OP_COMMIT, 0, k};
        } else {
            *p = (op){OP_ALLOC, 1 + (r >> 24) % o.max_size, k};
            live[nlive++] = k++;
        }
    }
}

static void pace(void)
{
    if (o.pace_us > 0) {
        struct timespec ts = {0, (long)o.pace_us * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Plan allocation K as this rank knows it: from the log, the live set, and
 * what this run did. */
typedef struct blk {
    uint64_t seq, off, size, csum;
    int logged;  /* its `a` was logged */
    int written; /* its `w` was logged */
    int freed;   /* 0 no, 1 `F` logged (in flight), 2 acknowledged (a `c` or `m` after it) */
    int held;    /* in the live set, or allocated by this run; not freed since */
} blk;
static blk kb[MAXB];

static uint64_t heap_collects(void) /* the heap's collect count (status page) */
{
    heapc_status_t st;
    return heapc_status(c, &st) == 0 ? st.collects : 0;
}

/* After a re-attach, heapd fails a collective at once (ERR_PEER_GONE) while
 * another rank is still gone: a resumed rank retries (150 s at most). */
static int resumed;
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
/* A wait for peers ends 150 s after its first failed try (not after a count
 * of tries: a try that times out takes collect_timeout_ms, one that fails at
 * once 10 ms, and a loaded sanitizer build needs long to restart a rank). */
static int again(int rc)
{
    static double since;
    if (!(rc == HEAPC_EPEER_GONE || (o.wait_peers && rc == HEAPC_ETIMEOUT)) || !(resumed || o.wait_peers)) {
        since = 0;
        return 0;
    }
    if (since == 0)
        since = now_s();
    else if (now_s() - since > 150)
        return 0;
    usleep(10000);
    return 1;
}

static void do_alloc(uint64_t size, const char *name, int k)
{
    void *p;
    uint64_t off;
    int rc;
    out("A %d", k);
    while (again(rc = heapc_alloc_named(c, size, name, &p, &off)))
        ;
    if (rc != 0)
        die("heapc_alloc_named");
    uint64_t seq = heapc_next_seq(c) - 1;
    out("a %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %" PRIu64, seq, off, size, name, heap_collects());
    kb[k] = (blk){.seq = seq, .off = off, .size = size, .held = 1};
    pattern(p, size, name, o.rank);
    out("w %s %016" PRIx64, name, fnv(p, size));
}

static void do_free(int k)
{
    out("F %" PRIu64, kb[k].off);
    if (heapc_free(c, kb[k].off) != 0)
        die("heapc_free");
    kb[k].held = 0;
    out("f %" PRIu64, kb[k].off);
}

static void do_collect(void)
{
    int rc;
    out("C");
    while (again(rc = heapc_collect(c)))
        ;
    if (rc != 0)
        die("heapc_collect");
    out("c %" PRIu64, heap_collects());
}

static void run_op(const op *p)
{
    char name[64];
    int rc;
    switch (p->kind) {
    case OP_ALLOC:
        op_name(name, sizeof name, p->idx);
        do_alloc(p->size, name, p->idx);
        break;
    case OP_FREE:
        do_free(p->idx);
        break;
    case OP_COLLECT:
        do_collect();
        break;
    case OP_COMMIT:
        out("M %d", p->idx);
        while (again(rc = heapc_commit(c, "step", (uint64_t)p->idx)))
            ;
        if (rc != 0)
            die("heapc_commit");
        out("m %d", p->idx);
        break;
    }
    pace();
}

/* ---- --resume: the previous run's log -------------------------------------- */

static struct {
    uint64_t max_seq;     /* past the last logged allocation */
    long m_done, m_begun; /* the last `m` and `M` (-1: none) */
    int begun, done;      /* plan ops begun and completed */
    uint64_t collects;    /* the heap's collect count at the last logged `a` or `c` */
} lg = {0, -1, -1, 0, 0, 0};

static int k_of(const char *name) /* "sSEED.K" -> K, else -1 */
{
    uint64_t sd;
    int k;
    if (sscanf(name, "s%" SCNu64 ".%d", &sd, &k) != 2 || sd != o.seed || k < 0 || k >= MAXB)
        return -1;
    return k;
}

static void log_line(const char *line)
{
    char name[64];
    uint64_t a, b, d, n;
    long m;
    int k;
    if (line[0] == 'A' || line[0] == 'F' || line[0] == 'C' || line[0] == 'M')
        lg.begun++;
    if (line[0] == 'w' || line[0] == 'f' || line[0] == 'c' || line[0] == 'm')
        lg.done++;
    if (sscanf(line, "s %" SCNu64, &a) == 1 && lg.begun == 0) {
        seq0 = a;
    } else if (sscanf(line, "a %" SCNu64 " %" SCNu64 " %" SCNu64 " %63s %" SCNu64, &a, &b, &d, name, &n) == 5 &&
               (k = k_of(name)) >= 0) {
        kb[k] = (blk){.seq = a, .off = b, .size = d, .logged = 1};
        lg.max_seq = a + 1 > lg.max_seq ? a + 1 : lg.max_seq;
        lg.collects = n;
    } else if (sscanf(line, "w %63s %" SCNx64, name, &a) == 2 && (k = k_of(name)) >= 0) {
        kb[k].written = 1, kb[k].csum = a;
    } else if (sscanf(line, "F %" SCNu64, &a) == 1) {
        for (k = 0; k < MAXB; k++)
            if (kb[k].logged && !kb[k].freed && kb[k].off == a)
                kb[k].freed = 1;
    } else if (line[0] == 'c' || line[0] == 'm') {
        for (k = 0; k < MAXB; k++)
            kb[k].freed = kb[k].freed == 1 ? 2 : kb[k].freed;
        if (sscanf(line, "m %ld", &m) == 1)
            lg.m_done = m;
        if (sscanf(line, "c %" SCNu64, &n) == 1)
            lg.collects = n;
    } else if (sscanf(line, "M %ld", &m) == 1) {
        lg.m_begun = m;
    }
}

static void read_log(void)
{
    FILE *f = fopen(o.resume, "r");
    char line[512];
    if (!f) {
        perror(o.resume);
        exit(2);
    }
    while (fgets(line, sizeof line, f))
        log_line(line);
    fclose(f);
}

static void check_block(int k, const heapc_block *l)
{
    const blk *x = &kb[k];
    char name[64];
    op_name(name, sizeof name, k);
    if (x->freed == 2 && l)
        bad("block %s (seq %" PRIu64 ") is live, its free was acknowledged", name, x->seq);
    if (x->freed == 0 && !l)
        bad("block %s (seq %" PRIu64 ") is missing from the live set", name, x->seq);
    if (!l)
        return;
    if (l->seq != x->seq || l->offset != x->off || l->size != x->size)
        bad("block %s (seq %" PRIu64 ") differs: seq %" PRIu64 ", offset, size", name, x->seq, l->seq);
    uint64_t off = 0, size = 0;
    if (heapc_lookup(c, name, &off, &size) != 0 || off != x->off || size != x->size)
        bad("heapc_lookup(%s) does not give the block (seq %" PRIu64 ")", name, x->seq);
    if (x->written) {
        unsigned char *want = malloc(x->size);
        pattern(want, x->size, name, o.rank);
        if (memcmp(want, heapc_ptr(c, x->off), x->size) || fnv(want, x->size) != x->csum)
            bad("block %s (seq %" PRIu64 ") does not hold its pattern", name, x->seq);
        else
            out("v %s ok", name);
        free(want);
    }
}

static heapc_block live[MAXB];

/* The live set against the log; the blocks found are `held`. */
static void verify(void)
{
    const heapc_block *byk[MAXB] = {0};
    size_t n = heapc_live(c, live, MAXB);
    for (size_t i = 0; i < n && i < MAXB; i++) {
        const heapc_block *l = &live[i];
        void *p = heapc_ptr(c, l->offset);
        int k = k_of(l->name);
        out("l %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %016" PRIx64, l->seq, l->offset, l->size,
            l->name[0] ? l->name : "-", p ? fnv(p, l->size) : 0);
        if (k < 0) {
            bad("live block seq %" PRIu64 " has a name not of this workload: '%s'", l->seq, l->name);
            continue;
        }
        byk[k] = l;
        if (!kb[k].logged && l->seq < lg.max_seq)
            bad("live block %s (seq %" PRIu64 ") is not in the log", l->name, l->seq);
        if (!kb[k].logged) /* an allocation in flight at the kill, decided */
            kb[k] = (blk){.seq = l->seq, .off = l->offset, .size = l->size};
    }
    for (int k = 0; k < MAXB; k++)
        if (kb[k].logged)
            check_block(k, byk[k]);
    for (int k = 0; k < MAXB; k++)
        kb[k].held = byk[k] != NULL;
    uint64_t v;
    int rc = heapc_committed(c, "step", &v);
    if (rc == 0)
        out("k step %" PRIu64, v);
    else
        out("k step none");
    if (rc == 0 && ((long)v < lg.m_done || (long)v > lg.m_begun))
        bad("marker step = %" PRIu64 " is outside the logged commits (%ld done, %ld begun)", v, lg.m_done, lg.m_begun);
    if (rc != 0 && lg.m_done >= 0)
        bad("marker step is gone (last commit logged: %ld)", lg.m_done);
}

/* Whether the op begun and not completed at the kill took effect. */
static int in_flight_done(const op *p)
{
    uint64_t v;
    switch (p->kind) {
    case OP_ALLOC:
        return kb[p->idx].held; /* decided: in the live set */
    case OP_FREE:
        return !kb[p->idx].held;
    case OP_COLLECT:
        return heap_collects() > lg.collects;
    case OP_COMMIT:
        return heapc_committed(c, "step", &v) == 0 && v == (uint64_t)p->idx;
    }
    return 0;
}

/* Re-attached: check, finish the op in flight, go on with the plan. */
static void resume_run(void)
{
    uint64_t next = heapc_next_seq(c); /* the heap's allocation number */
    resumed = 1;
    read_log();
    verify();
    int i = lg.done;
    if (lg.begun > lg.done && i < nops) {
        const op *p = &ops[i];
        int done = in_flight_done(p);
        out("r %d %s", i, done ? "done" : "again");
        if (done && p->kind == OP_ALLOC) { /* decided or logged: (re)write its pattern */
            char name[64];
            op_name(name, sizeof name, p->idx);
            pattern(heapc_ptr(c, kb[p->idx].off), kb[p->idx].size, name, o.rank);
            out("w %s %016" PRIx64, name, fnv(heapc_ptr(c, kb[p->idx].off), kb[p->idx].size));
        }
        if (done)
            i++;
    }
    for (; i < nops; i++) {
        const op *p = &ops[i];
        char name[64];
        if (p->kind != OP_ALLOC || seq0 + (uint64_t)p->idx >= next) {
            run_op(p);
            continue;
        }
        /* decided while this rank was gone (another rank made it): in the
         * live set, with its name; this rank writes its copy */
        blk *b = &kb[p->idx];
        op_name(name, sizeof name, p->idx);
        if (!b->held) {
            bad("allocation %s (seq %" PRIu64 ") was decided before the re-attach but is not live", name,
                seq0 + (uint64_t)p->idx);
            continue;
        }
        out("a %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %" PRIu64, b->seq, b->off, b->size, name, heap_collects());
        pattern(heapc_ptr(c, b->off), b->size, name, o.rank);
        out("w %s %016" PRIx64, name, fnv(heapc_ptr(c, b->off), b->size));
    }
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: prog_resume --socket S --heap H --rank R --world W [--chunk SIZE] [--va SIZE]\n"
               "         [--persist S] [--seed N] [--ops N] [--max-size B] [--commit-every K]\n"
               "         [--pace-us US] [--local-size N --job J] [--attach-only] [--hold-ms MS]\n"
               "         [--wait-peers]\n"
               "         [--resume LOG]\n"
               "See the comment at the top of tests/prog_resume.c.\n");
}

/* One option into o; 0, else the exit code. */
static int set_opt(int ch, const char *arg, int *attach_only)
{
    switch (ch) {
    case 's':
        o.sock = arg;
        break;
    case 'H':
        o.heap = arg;
        break;
    case 'r':
        o.rank = (uint32_t)atoi(arg);
        break;
    case 'w':
        o.world = (uint32_t)atoi(arg);
        break;
    case 'k':
        if (hsz_parse_size(arg, &o.chunk)) {
            usage(stderr);
            return 2;
        }
        break;
    case 'v':
        if (hsz_parse_size(arg, &o.va)) {
            usage(stderr);
            return 2;
        }
        break;
    case 'p':
        o.persist = atoi(arg);
        break;
    case 'S':
        o.seed = strtoull(arg, NULL, 0);
        break;
    case 'o':
        o.ops = atoi(arg);
        break;
    case 'm':
        o.max_size = strtoull(arg, NULL, 0);
        break;
    case 'R':
        o.resume = arg;
        break;
    case 'K':
        o.commit_every = atoi(arg);
        break;
    case 'P':
        o.pace_us = atoi(arg);
        break;
    case 'l':
        o.local = (uint32_t)atoi(arg);
        break;
    case 'j':
        o.job = arg;
        break;
    case 'a':
        *attach_only = 1;
        break;
    case 'D':
        o.hold_ms = atoi(arg);
        break;
    case 'W':
        o.wait_peers = 1;
        break;
    case 'h':
        usage(stdout);
        exit(0);
    default:
        usage(stderr);
        return 2;
    }
    return 0;
}

/* Options into o; 0, else the exit code. */
static int parse_args(int argc, char **argv, int *attach_only)
{
    static const struct option lo[] = {
        {"socket", 1, 0, 's'},  {"heap", 1, 0, 'H'},       {"rank", 1, 0, 'r'},    {"world", 1, 0, 'w'},
        {"chunk", 1, 0, 'k'},   {"va", 1, 0, 'v'},         {"persist", 1, 0, 'p'}, {"seed", 1, 0, 'S'},
        {"ops", 1, 0, 'o'},     {"max-size", 1, 0, 'm'},   {"resume", 1, 0, 'R'},  {"commit-every", 1, 0, 'K'},
        {"pace-us", 1, 0, 'P'}, {"local-size", 1, 0, 'l'}, {"job", 1, 0, 'j'},     {"attach-only", 0, 0, 'a'},
        {"hold-ms", 1, 0, 'D'}, {"wait-peers", 0, 0, 'W'}, {"help", 0, 0, 'h'},    {0, 0, 0, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        int rc = set_opt(ch, optarg, attach_only);
        if (rc)
            return rc;
    }
    if (!o.heap || !o.world || o.max_size == 0) {
        usage(stderr);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int attach_only = 0, rc = parse_args(argc, argv, &attach_only);
    if (rc)
        return rc;
    plan();
    c = heapc_connect(o.sock);
    if (!c || heapc_err(c))
        die("heapc_connect");
    heapc_params hp = {.chunk_size = o.chunk,
                       .va_size = o.va,
                       .persist_s = o.persist,
                       .local_size = o.local,
                       .job = o.job,
                       .collect_timeout_ms = 20000};
    if (heapc_attach(c, o.heap, o.rank, o.world, &hp) != 0)
        die("heapc_attach");
    heapc_set_free_batch(c, 1);
    out("s %" PRIu64 " %" PRIu64 " %d", heapc_next_seq(c), heapc_generation(c), heapc_resumed(c));
    if (o.hold_ms > 0) /* attached, doing nothing: a rank that is taken */
        usleep((useconds_t)o.hold_ms * 1000);
    if (attach_only)
        return 0;
    if (o.resume) {
        resume_run();
    } else {
        seq0 = heapc_next_seq(c);
        for (int i = 0; i < nops; i++)
            run_op(&ops[i]);
    }
    for (int k = 0; k < MAXB; k++) /* what this rank holds at the end */
        if (kb[k].held)
            out("L %" PRIu64 " %" PRIu64 " %" PRIu64 " s%" PRIu64 ".%d", kb[k].seq, kb[k].off, kb[k].size, o.seed, k);
    out("d");
    heapc_free_ctx(c); /* a disconnect: the heap persists */
    return failures ? 3 : 0;
}
