/* alloc_bench - the allocator core (daemon/alloc.h) on the CPU.
 *
 *   alloc_bench [--json FILE] [--quick] [--ranks R] [--live N] [--cost-only] [--batch N] [--policy P]
 *
 * 1. Cost: ns per alloc + free-on-every-rank pair with 10^3, 10^5 and 10^6
 *    live blocks of mixed small sizes, both policies. The live set is built
 *    first (not timed); then each timed cycle frees a random live block on
 *    every rank and allocates a new one through the alloc protocol, with an
 *    explicit collect every COLLECT_EVERY cycles (plus those the allocator
 *    asks for). Growth during the timed part is counted in the time. Two
 *    clocks: wall (ns/pair) and the thread's CPU time (cpu ns/pair: the
 *    time other work on a loaded machine takes from this thread left out;
 *    its cache misses stay in). Per policy, the 10^6 / 10^3 ratio and the
 *    10^6 figure against the goals (1.5x, 100 ns). Each row twice: frees
 *    one call of ha_free per rank and block ('call', the old figure), and
 *    frees in batches of --batch blocks (default 256), one ha_free_batch
 *    per rank, as the heap wing serves a client's Free batch ('bN').
 * 2. Footprint: both policies on the seed review's two models and on random
 *    multi-rank traces (mapped, growths, collects), one table at the end:
 *    figure | seed | coalesce | ratio (coalesce / seed).
 *
 * Prints the tables; --json FILE also writes them as JSON. Exit 0, or 1 on
 * an allocator error (printed).
 */
#include "alloc.h"
#include "size.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KiB           ((uint64_t)1 << 10)
#define MiB           ((uint64_t)1 << 20)
#define GiB           ((uint64_t)1 << 30)
#define COLLECT_EVERY 4096

static const ha_policy policies[2] = {HA_POLICY_SEED, HA_POLICY_COALESCE};

static void die(const char *what, int rc)
{
    fprintf(stderr, "alloc_bench: %s: %s\n", what, ha_strerror(rc));
    exit(1);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

static uint64_t rng_below(uint64_t *s, uint64_t n) { return n ? rng_next(s) % n : 0; }

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static ha_heap *mk(ha_policy pol, uint32_t ranks, uint64_t chunk, uint64_t initial, uint64_t va, uint64_t min_block)
{
    ha_params p = {.ranks = ranks,
                   .chunk_size = chunk,
                   .initial_size = initial,
                   .va_size = va,
                   .min_block = min_block,
                   .policy = pol};
    char err[256];
    ha_heap *h = NULL;
    if (ha_create(&p, &h, err, sizeof err) != HA_OK) {
        fprintf(stderr, "alloc_bench: cannot create a heap: %s\n", err);
        exit(1);
    }
    return h;
}

/* The alloc protocol of alloc.h; every collect is a collect on every rank. */
static uint64_t alloc_loop(ha_heap *h, uint64_t size)
{
    ha_alloc_result res;
    for (int step = 0; step < 8; step++) {
        int rc = ha_alloc(h, size, &res);
        if (rc == HA_NEED_COLLECT) {
            if ((rc = ha_collect(h, NULL, NULL)) != HA_OK)
                die("ha_collect", rc);
            continue;
        }
        if (rc == HA_NEED_GROW) {
            if ((rc = ha_grow(h, res.grow_chunks)) != HA_OK)
                die("ha_grow", rc);
            continue;
        }
        if (rc != HA_OK)
            die("ha_alloc", rc);
        return res.offset;
    }
    fprintf(stderr, "alloc_bench: the alloc protocol did not finish in 8 steps\n");
    exit(1);
}

static void free_all_ranks(ha_heap *h, uint32_t ranks, uint64_t off)
{
    for (uint32_t r = 0; r < ranks; r++) {
        int rc = ha_free(h, r, off);
        if (rc != HA_OK)
            die("ha_free", rc);
    }
}

/* Mixed small sizes: 1 B .. 16 KiB, log-uniform (skewed small). */
static uint64_t small_size(uint64_t *rs) { return 1 + rng_below(rs, (uint64_t)1 << (6 + rng_below(rs, 9))); }

/* ---- 1. cost per pair --------------------------------------------------- */

typedef struct cost_row {
    ha_policy pol;
    uint64_t live;
    uint64_t iters;
    uint32_t batch; /* 0: a call of ha_free per rank and block; else frees in batches */
    double ns_per_pair;
    double cpu_ns_per_pair; /* the thread's CPU time */
    uint64_t collects;      /* during the timed part */
    uint64_t growths;       /* during the timed part */
    uint64_t mapped;
    size_t mem; /* bookkeeping bytes at the end */
} cost_row;

/* Frees n blocks on every rank the way the heap wing does with a Free
 * batch: one ha_free_batch per rank (a core without it, built with
 * -DALLOC_BENCH_NO_BATCH to measure an older core: n calls of ha_free). */
static void free_batch_all_ranks(ha_heap *h, uint32_t ranks, const uint64_t *offs, size_t n)
{
    for (uint32_t r = 0; r < ranks; r++) {
#ifdef ALLOC_BENCH_NO_BATCH
        for (size_t i = 0; i < n; i++) {
            int rc = ha_free(h, r, offs[i]);
            if (rc != HA_OK)
                die("ha_free", rc);
        }
#else
        int rc = ha_free_batch(h, r, offs, n, NULL);
        if (rc != HA_OK)
            die("ha_free_batch", rc);
#endif
    }
}

static cost_row bench_cost(ha_policy pol, uint32_t ranks, uint64_t live, uint64_t iters, uint32_t batch)
{
    /* Room for the live set several times over: 10^6 blocks of <= 16 KiB. */
    uint64_t chunk = 64 * MiB;
    uint64_t need = live * 8 * KiB * 2;
    uint64_t initial = (need + chunk - 1) / chunk * chunk;
    ha_heap *h = mk(pol, ranks, chunk, initial, 256 * GiB, 512);
    uint64_t *offs = malloc(live * sizeof *offs);
    uint64_t *kk = malloc((batch ? batch : 1) * sizeof *kk);
    if (offs == NULL || kk == NULL) {
        fprintf(stderr, "alloc_bench: out of memory for %" PRIu64 " offsets\n", live);
        exit(1);
    }
    uint64_t rs = 0x1234567ull + live;
    for (uint64_t i = 0; i < live; i++)
        offs[i] = alloc_loop(h, small_size(&rs));
    ha_collect(h, NULL, NULL);
    ha_stats s0, s1;
    ha_get_stats(h, &s0);
    double t0 = now_ns(), c0 = cpu_ns();
    if (batch == 0) {
        /* The next block is drawn one cycle ahead and its slot in offs[]
         * prefetched: the bench's own miss on offs[] is not the core's cost. */
        uint64_t knext = rng_below(&rs, live);
        for (uint64_t i = 0; i < iters; i++) {
            uint64_t k = knext;
            knext = rng_below(&rs, live);
            __builtin_prefetch(&offs[knext]);
            free_all_ranks(h, ranks, offs[k]);
            offs[k] = alloc_loop(h, small_size(&rs));
            if (i % COLLECT_EVERY == COLLECT_EVERY - 1)
                ha_collect(h, NULL, NULL);
        }
    } else {
        /* Batches of `batch` distinct random live blocks (a partial shuffle
         * moves them to the end of offs[]), freed on every rank, then as
         * many allocations; a collect after every COLLECT_EVERY cycles. */
        for (uint64_t i = 0; i < iters; i += batch) {
            uint64_t *b = &offs[live - batch];
            /* the bench's own misses on offs[] overlap: drawn and asked
             * for first */
            for (uint32_t j = 0; j < batch; j++) {
                kk[j] = rng_below(&rs, live - j);
                __builtin_prefetch(&offs[kk[j]]);
            }
            for (uint32_t j = 0; j < batch; j++) {
                uint64_t k = kk[j], t = offs[k];
                offs[k] = offs[live - 1 - j];
                offs[live - 1 - j] = t;
            }
            free_batch_all_ranks(h, ranks, b, batch);
            for (uint32_t j = 0; j < batch; j++)
                b[j] = alloc_loop(h, small_size(&rs));
            if ((i + batch) / COLLECT_EVERY != i / COLLECT_EVERY)
                ha_collect(h, NULL, NULL);
        }
        iters = (iters + batch - 1) / batch * batch;
    }
    double t1 = now_ns(), c1 = cpu_ns();
    ha_get_stats(h, &s1);
    cost_row row = {.pol = pol,
                    .live = live,
                    .iters = iters,
                    .batch = batch,
                    .ns_per_pair = (t1 - t0) / (double)iters,
                    .cpu_ns_per_pair = (c1 - c0) / (double)iters,
                    .collects = s1.collects - s0.collects,
                    .growths = s1.growths - s0.growths,
                    .mapped = s1.mapped,
                    .mem = ha_memory_usage(h)};
    free(offs);
    free(kk);
    ha_destroy(h);
    return row;
}

/* The anchor: ns per dependent read at a random place in a 64 MiB array
 * (one cache and TLB miss each; the block table at 10^6 blocks is 64 MiB). */
static double miss_anchor(void)
{
    size_t n = (size_t)(64 * MiB / sizeof(uint64_t));
    uint64_t *a = malloc(n * sizeof *a);
    if (a == NULL)
        return 0;
    for (size_t i = 0; i < n; i++)
        a[i] = i;
    uint64_t rs = 0xC0FFEEull;
    for (size_t i = n - 1; i > 0; i--) { /* Sattolo: one cycle through all */
        size_t j = (size_t)rng_below(&rs, i);
        uint64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
    uint64_t x = 0, steps = 2000000;
    double c0 = cpu_ns();
    for (uint64_t i = 0; i < steps; i++)
        x = a[x];
    double c1 = cpu_ns();
    free(a);
    return x == UINT64_MAX ? 0 : (c1 - c0) / (double)steps;
}

/* ---- 2. footprint ------------------------------------------------------- */

typedef struct fig {
    uint64_t mapped, growths, collects;
} fig;

static fig fig_of(ha_heap *h)
{
    ha_stats s;
    ha_get_stats(h, &s);
    return (fig){s.mapped, s.growths, s.collects};
}

/* The seed review's models: 1 rank, 256 MiB chunk and initial extent. */
static fig run_model(ha_policy pol, int which)
{
    ha_heap *h = mk(pol, 1, 256 * MiB, 256 * MiB, 4 * GiB, 512);
    if (which == 1) {
        for (int i = 0; i < 1000; i++)
            free_all_ranks(h, 1, alloc_loop(h, 1 * MiB));
        alloc_loop(h, 128 * MiB);
    } else {
        for (int step = 0; step < 20000; step++) {
            free_all_ranks(h, 1, alloc_loop(h, 1 * MiB));
            if (step % 100 == 0)
                alloc_loop(h, 512 * KiB);
        }
        alloc_loop(h, 64 * MiB);
    }
    fig f = fig_of(h);
    ha_destroy(h);
    return f;
}

typedef struct rblock {
    uint64_t off;
    uint32_t nheld;
    uint8_t *held;
} rblock;

/* A random multi-rank trace: allocations (1 B .. max_size, log-uniform),
 * every rank frees each block at its own random time, no explicit collects.
 * The operations depend only on the RNG and on which ranks still hold which
 * blocks, never on offsets: both policies replay the same trace. */
static fig run_random(ha_policy pol, uint32_t ranks, uint64_t steps, uint64_t max_size, uint64_t target_live,
                      uint64_t seed)
{
    /* A heap a few times the live set: 16 MiB chunks, 64 MiB to start. */
    ha_heap *h = mk(pol, ranks, 16 * MiB, 64 * MiB, 64 * GiB, 512);
    rblock *live = calloc(target_live * 4 + 16, sizeof *live);
    uint8_t *held = calloc((target_live * 4 + 16) * ranks, 1);
    if (!live || !held) {
        fprintf(stderr, "alloc_bench: out of memory\n");
        exit(1);
    }
    size_t nlive = 0, cap = target_live * 4 + 16;
    unsigned max_bits = 0;
    while (((uint64_t)1 << max_bits) < max_size)
        max_bits++;
    uint64_t rs = seed;
    for (uint64_t step = 0; step < steps; step++) {
        uint64_t r = rng_below(&rs, 1000);
        uint64_t p_alloc = 1000 * (nlive < target_live ? 3 : 1) / (2 * (ranks + 1));
        if ((r < p_alloc && nlive < cap) || nlive == 0) {
            uint64_t size = 1 + rng_below(&rs, (uint64_t)1 << rng_below(&rs, max_bits + 1));
            if (size > max_size)
                size = max_size;
            rblock *b = &live[nlive];
            b->held = held + nlive * ranks;
            memset(b->held, 1, ranks);
            b->nheld = ranks;
            b->off = alloc_loop(h, size);
            nlive++;
        } else {
            size_t k = (size_t)rng_below(&rs, nlive);
            rblock *b = &live[k];
            uint32_t q;
            do
                q = (uint32_t)rng_below(&rs, ranks);
            while (!b->held[q]);
            int rc = ha_free(h, q, b->off);
            if (rc != HA_OK)
                die("ha_free", rc);
            b->held[q] = 0;
            if (--b->nheld == 0) {
                /* Keep slot k's held bytes with slot k: copy the last in. */
                nlive--;
                if (k != nlive) {
                    live[k].off = live[nlive].off;
                    live[k].nheld = live[nlive].nheld;
                    memcpy(live[k].held, live[nlive].held, ranks);
                }
            }
        }
    }
    fig f = fig_of(h);
    ha_destroy(h);
    free(live);
    free(held);
    return f;
}

/* ---- output ------------------------------------------------------------- */

typedef struct fig_row {
    char name[64];
    uint64_t v[2]; /* seed, coalesce */
} fig_row;

static void ratio_str(uint64_t seed, uint64_t co, char *buf, size_t len)
{
    if (seed == 0)
        snprintf(buf, len, "%s", co == 0 ? "1.00" : "-");
    else
        snprintf(buf, len, "%.2f", (double)co / (double)seed);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: alloc_bench [--json FILE] [--quick] [--ranks R] [--live N] [--cost-only]\n"
               "                   [--batch N] [--policy P]\n"
               "  --json FILE  also write the results as JSON to FILE\n"
               "  --quick      fewer iterations and no 10^6 live-block run (smoke test)\n"
               "  --ranks R    ranks in the cost benchmark (default 4)\n"
               "  --live N     the cost benchmark at N live blocks only (profiling)\n"
               "  --policy P   the cost rows of policy P only (seed or coalesce; profiling)\n"
               "  --cost-only  the cost table only (no footprint table, no JSON)\n"
               "  --batch N    also the cost with frees in batches of N blocks (default 256,\n"
               "               at most a quarter of the live blocks; 0: per-call rows only)\n");
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    int quick = 0;
    uint32_t ranks = 4;
    uint64_t only_live = 0;
    int cost_only = 0;
    uint64_t batch = 256;
    int only_pol = -1; /* --policy: that policy's cost rows only */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
            char *end;
            unsigned long v = strtoul(argv[++i], &end, 10);
            if (*end || v < 1 || v > 64) {
                fprintf(stderr, "alloc_bench: --ranks takes 1..64, not '%s'\n", argv[i]);
                return 2;
            }
            ranks = (uint32_t)v;
        } else if (strcmp(argv[i], "--live") == 0 && i + 1 < argc) {
            char *end;
            only_live = strtoull(argv[++i], &end, 10);
            if (*end || only_live < 1 || only_live > 100000000) {
                fprintf(stderr, "alloc_bench: --live takes 1..10^8 blocks, not '%s'\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            char *end;
            batch = strtoull(argv[++i], &end, 10);
            if (*end || batch > 65536) {
                fprintf(stderr, "alloc_bench: --batch takes 0..65536 blocks, not '%s'\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--policy") == 0 && i + 1 < argc) {
            ha_policy pol;
            if (ha_policy_parse(argv[++i], &pol) != HA_OK) {
                fprintf(stderr, "alloc_bench: --policy takes seed or coalesce, not '%s'\n", argv[i]);
                return 2;
            }
            only_pol = (int)pol;
        } else if (strcmp(argv[i], "--cost-only") == 0) {
            cost_only = 1;
        } else if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "alloc_bench: unknown argument '%s'; run alloc_bench --help\n", argv[i]);
            return 2;
        }
    }

    /* 1. cost */
    uint64_t lives[3] = {1000, 100000, 1000000};
    int nlives = quick ? 2 : 3;
    if (only_live) {
        lives[0] = only_live;
        nlives = 1;
    }
    uint64_t iters = quick ? 50000 : 1000000;
#ifdef HEAPD_DEBUG
    /* Debug and sanitizer builds validate the whole heap after every call:
     * the cost table would measure that, and take hours. */
    printf("alloc_bench: debug build (HEAPD_DEBUG): timings are not meaningful; smoke run "
           "only. Build without DEBUG/SANITIZE for figures.\n");
    quick = 1;
    nlives = 1;
    iters = 2000;
#endif
    cost_row cost[12];
    int ncost = 0;
    printf("alloc_bench: ns per alloc + free on all %u ranks (sizes 1 B..16 KiB, collect every "
           "%d cycles); frees: 'call' = one ha_free per rank and block, 'bN' = batches of N "
           "blocks, one ha_free_batch per rank (the heap wing's Free batches)\n",
           ranks, COLLECT_EVERY);
    printf("%-9s %5s %9s %10s %12s %12s %9s %8s %12s %12s\n", "policy", "frees", "live", "cycles", "ns/pair",
           "cpu ns/pair", "collects", "growths", "mapped", "bookkeeping");
    for (int li = 0; li < nlives; li++) {
        for (int pi = 0; pi < 2; pi++)
            for (int bi = 0; bi < (batch ? 2 : 1) && (only_pol < 0 || (int)policies[pi] == only_pol); bi++) {
                uint32_t bt = bi ? (uint32_t)(batch < lives[li] / 4 ? batch : lives[li] / 4) : 0;
                cost_row c = bench_cost(policies[pi], ranks, lives[li], iters, bt);
                cost[ncost++] = c;
                char fr[16];
                if (bt)
                    snprintf(fr, sizeof fr, "b%u", bt);
                else
                    snprintf(fr, sizeof fr, "call");
                char m[HSZ_SIZE_BUFLEN], mem[HSZ_SIZE_BUFLEN];
                hsz_format_size(c.mapped, m, sizeof m);
                snprintf(mem, sizeof mem, "%.1f MiB", (double)c.mem / (double)MiB);
                printf("%-9s %5s %9" PRIu64 " %10" PRIu64 " %12.1f %12.1f %9" PRIu64 " %8" PRIu64 " %12s %12s\n",
                       ha_policy_name(c.pol), fr, c.live, c.iters, c.ns_per_pair, c.cpu_ns_per_pair, c.collects,
                       c.growths, m, mem);
                fflush(stdout);
            }
    }

    double anchor = miss_anchor();
    printf("anchor: a dependent random read in 64 MiB: %.1f ns cpu\n", anchor);
    int per = (batch ? 2 : 1) * (only_pol < 0 ? 2 : 1); /* rows per live level */
    if (ncost == 3 * per)
        for (int pi = 0; pi < per; pi++) {
            const cost_row *lo = &cost[pi], *hi = &cost[2 * per + pi];
            printf("%-9s %-5s 10^6 / 10^3: %.2fx wall, %.2fx cpu (goal <= 1.5x); at 10^6: %.1f ns "
                   "wall, %.1f ns cpu (goal <= 100 ns)\n",
                   ha_policy_name(lo->pol), lo->batch ? "batch" : "call", hi->ns_per_pair / lo->ns_per_pair,
                   hi->cpu_ns_per_pair / lo->cpu_ns_per_pair, hi->ns_per_pair, hi->cpu_ns_per_pair);
        }
    if (cost_only)
        return 0;

    /* 2. footprint */
    fig_row rows[32];
    int nrows = 0;
    struct {
        const char *name;
        int model;
        uint32_t ranks;
        uint64_t steps, max_size, live, seed;
    } runs[] = {
        {"model1", 1, 1, 0, 0, 0, 0},
        {"model2", 2, 1, 0, 0, 0, 0},
        {"random r2 <=1MiB", 0, 2, 200000, 1 * MiB, 300, 3},
        {"random r4 <=4MiB", 0, 4, 200000, 4 * MiB, 200, 1},
        {"random r8 <=64KiB", 0, 8, 400000, 64 * KiB, 4000, 2},
    };
    for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
        fig f[2];
        for (int pi = 0; pi < 2; pi++) {
            if (runs[ri].model)
                f[pi] = run_model(policies[pi], runs[ri].model);
            else
                f[pi] = run_random(policies[pi], runs[ri].ranks, quick ? runs[ri].steps / 10 : runs[ri].steps,
                                   runs[ri].max_size, runs[ri].live, runs[ri].seed);
        }
        const char *what[3] = {"mapped", "growths", "collects"};
        for (int k = 0; k < 3; k++) {
            fig_row *r = &rows[nrows++];
            snprintf(r->name, sizeof r->name, "%s %s", runs[ri].name, what[k]);
            r->v[0] = k == 0 ? f[0].mapped : k == 1 ? f[0].growths : f[0].collects;
            r->v[1] = k == 0 ? f[1].mapped : k == 1 ? f[1].growths : f[1].collects;
        }
    }
    printf("\nalloc_bench: footprint, seed vs coalesce (ratio = coalesce / seed)\n");
    printf("%-28s %14s %14s %8s\n", "figure", "seed", "coalesce", "ratio");
    for (int i = 0; i < nrows; i++) {
        char ratio[32];
        ratio_str(rows[i].v[0], rows[i].v[1], ratio, sizeof ratio);
        printf("%-28s %14" PRIu64 " %14" PRIu64 " %8s\n", rows[i].name, rows[i].v[0], rows[i].v[1], ratio);
    }

    if (json) {
        FILE *f = fopen(json, "w");
        if (f == NULL) {
            perror("alloc_bench: cannot write the JSON file");
            return 1;
        }
        fprintf(f, "{\n  \"bench\": \"alloc_bench\",\n  \"ranks\": %u,\n  \"quick\": %s,\n", ranks,
                quick ? "true" : "false");
        fprintf(f, "  \"miss_anchor_ns\": %.1f,\n", anchor);
        fprintf(f, "  \"cost\": [\n");
        for (int i = 0; i < ncost; i++)
            fprintf(f,
                    "    {\"policy\": \"%s\", \"batch\": %u, \"live\": %" PRIu64 ", \"cycles\": %" PRIu64
                    ", \"ns_per_pair\": %.1f, \"cpu_ns_per_pair\": %.1f, \"collects\": %" PRIu64
                    ", \"growths\": %" PRIu64 ", \"mapped\": %" PRIu64 ", \"bookkeeping_bytes\": %zu}%s\n",
                    ha_policy_name(cost[i].pol), cost[i].batch, cost[i].live, cost[i].iters, cost[i].ns_per_pair,
                    cost[i].cpu_ns_per_pair, cost[i].collects, cost[i].growths, cost[i].mapped, cost[i].mem,
                    i + 1 < ncost ? "," : "");
        fprintf(f, "  ],\n  \"figures\": [\n");
        for (int i = 0; i < nrows; i++) {
            char ratio[32];
            ratio_str(rows[i].v[0], rows[i].v[1], ratio, sizeof ratio);
            fprintf(f, "    {\"figure\": \"%s\", \"seed\": %" PRIu64 ", \"coalesce\": %" PRIu64 ", \"ratio\": %s}%s\n",
                    rows[i].name, rows[i].v[0], rows[i].v[1], strcmp(ratio, "-") == 0 ? "null" : ratio,
                    i + 1 < nrows ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        if (fclose(f) != 0) {
            perror("alloc_bench: cannot write the JSON file");
            return 1;
        }
    }
    return 0;
}
