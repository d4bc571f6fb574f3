/* collect_bench - collect latency for 2, 4 and 8 local ranks on one heapd.
 *
 *   collect_bench [--json FILE] [--quick] [--heapd PATH] [--iters K]
 *
 * Starts its own heapd (PATH, default dirname(argv[0])/../heapd) on a
 * temporary configuration (socket in a mkdtemp directory, backend = host,
 * log_level = warn) and stops it at the end, also on error.
 *
 * For R = 2, 4, 8: R rank processes attach to one R-rank heap (host backend)
 * and each does warm-up iterations then K timed iterations of
 *   { heapc_alloc(4 KiB); heapc_free; heapc_flush; heapc_collect }
 * Only heapc_collect is timed (the queued free is sent first by an explicit,
 * untimed heapc_flush, so the timed call is the Collect round trip: every
 * rank's arrival, the reclaim, the replies; the host backend's device sync
 * is a no-op). Latency is as seen by rank 0; p50/p99 over its K collects.
 * Also reported: the span of each collect (the first rank's call to the last
 * rank's return, from every rank's timestamps; CLOCK_MONOTONIC is one clock
 * for every process) and rank 0's loop time per iteration.
 * Every rank checks afterwards that it took part in exactly warm-up + K
 * collects, that heapd never asked for one by itself, and that the last
 * collect reclaimed the one block every rank released.
 *
 * Prints "bench collect_bench: ..." lines and a table; --json FILE writes
 * JSON. Exit 0, or 1 on any error (printed).
 */
#include "heapc.h"

#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NAME "collect_bench"
#define BENCH_ONE_HEAPD
#include "bench_util.h"
#define KiB        ((uint64_t)1 << 10)
#define ALLOC_SIZE (4 * KiB)
#define MAX_RANKS  8

/* ---- process bookkeeping and cleanup ------------------------------------- */

static pid_t g_kids[MAX_RANKS];
static int g_nkids;

static void cleanup(void)
{
    if (g_is_child)
        return;
    for (int i = 0; i < g_nkids; i++)
        reap(g_kids[i], SIGKILL, 1000);
    g_nkids = 0;
    remove_heapd();
}

/* ---- heapd -------------------------------------------------------------- */

/* Waits for every rank; the first failure kills the others and dies. */
static void wait_ranks(const char *what)
{
    int left = g_nkids;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0)
            die("waitpid: %s", strerror(errno));
        if (p == g_heapd) {
            g_heapd = -1;
            die("%s: heapd died (%s %d)", what, WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        }
        int idx = -1;
        for (int i = 0; i < g_nkids; i++)
            if (g_kids[i] == p)
                idx = i;
        if (idx < 0)
            continue;
        g_kids[idx] = -1;
        left--;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die("%s: rank %d failed (%s %d)", what, idx, WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    g_nkids = 0;
}

/* ---- the benchmark ------------------------------------------------------- */

typedef struct shared {
    double wall_us; /* rank 0: its whole timed loop (allocs, frees, collects) */
    uint64_t iters;
    double lat[]; /* rank 0's collects (iters), then every rank's call and return
                     times ([rank][iter][2], ranks * iters * 2), microseconds */
} shared;

static void rank_main(shared *s, uint32_t rank, uint32_t ranks, uint64_t warm, uint64_t iters)
{
    heapc *c = heapc_connect(g_sock);
    if (!c)
        die("rank %u: heapc_connect: out of memory", rank);
    if (heapc_err(c))
        die("rank %u: heapc_connect(%s): %s", rank, g_sock, heapc_errstr(c));
    char heap[32];
    snprintf(heap, sizeof heap, "collect-%u", ranks);
    heapc_params p;
    memset(&p, 0, sizeof p);                                /* heapd's defaults: 64 MiB chunk, coalesce */
    if (heapc_attach(c, heap, rank, ranks, &p) != HEAPC_OK) /* collective */
        die("rank %u: heapc_attach(%s): %s", rank, heap, heapc_errstr(c));
    heapc_counters c0, c1;
    heapc_get_counters(c, &c0);
    double t_begin = 0;
    for (uint64_t i = 0; i < warm + iters; i++) {
        if (i == warm)
            t_begin = now_us();
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
        if (i >= warm) {
            if (rank == 0)
                s->lat[i - warm] = t1 - t0;
            double *ts = s->lat + s->iters + ((size_t)rank * s->iters + (i - warm)) * 2;
            ts[0] = t0;
            ts[1] = t1;
        }
    }
    if (rank == 0)
        s->wall_us = now_us() - t_begin;
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

typedef struct row {
    uint32_t ranks;
    double p50, p99, mean, min, max;
    double iter_us;            /* rank 0's wall time per iteration (alloc + free + flush + collect) */
    double span_p50, span_p99; /* first rank's call to last rank's return, per collect */
} row;

static row run(uint32_t ranks, uint64_t warm, uint64_t iters)
{
    size_t len = sizeof(shared) + iters * (1 + 2 * (size_t)ranks) * sizeof(double);
    shared *s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        die("mmap of %zu shared bytes: %s", len, strerror(errno));
    s->iters = iters;
    for (uint32_t r = 0; r < ranks; r++) {
        pid_t p = fork_child();
        if (p == 0)
            rank_main(s, r, ranks, warm, iters);
        g_kids[g_nkids++] = p;
    }
    char what[32];
    snprintf(what, sizeof what, "%u ranks", ranks);
    wait_ranks(what);
    double *span = malloc(iters * sizeof(double));
    if (!span)
        die("out of memory");
    for (uint64_t i = 0; i < iters; i++) {
        double first = 0, last = 0;
        for (uint32_t q = 0; q < ranks; q++) {
            const double *ts = s->lat + iters + ((size_t)q * iters + i) * 2;
            if (q == 0 || ts[0] < first)
                first = ts[0];
            if (q == 0 || ts[1] > last)
                last = ts[1];
        }
        span[i] = last - first;
    }
    qsort(span, iters, sizeof(double), cmp_double);
    qsort(s->lat, iters, sizeof(double), cmp_double);
    double sum = 0;
    for (uint64_t i = 0; i < iters; i++)
        sum += s->lat[i];
    row r = {ranks,
             s->lat[(size_t)(0.50 * (double)(iters - 1))],
             s->lat[(size_t)(0.99 * (double)(iters - 1))],
             sum / (double)iters,
             s->lat[0],
             s->lat[iters - 1],
             s->wall_us / (double)iters,
             span[(size_t)(0.50 * (double)(iters - 1))],
             span[(size_t)(0.99 * (double)(iters - 1))]};
    free(span);
    munmap(s, len);
    return r;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " NAME " [--json FILE] [--quick] [--heapd PATH] [--iters K]\n"
               "  --json FILE   also write the results as JSON to FILE\n"
               "  --quick       1000 timed collects per rank count (smoke test)\n"
               "  --heapd PATH  the heapd to start (default: dirname(argv[0])/../heapd)\n"
               "  --iters K     timed iterations per rank count (default 10000)\n");
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    char heapd[PATH_MAX] = "";
    uint64_t iters = 10000;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json = argv[++i];
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
            iters = 1000;
        } else if (!strcmp(argv[i], "--heapd") && i + 1 < argc) {
            snprintf(heapd, sizeof heapd, "%s", argv[++i]);
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            char *end;
            iters = strtoull(argv[++i], &end, 10);
            if (*end || iters < 10 || iters > 1000000) {
                fprintf(stderr, NAME ": --iters takes 10..1000000, not '%s'\n", argv[i]);
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
    if (!heapd[0])
        self_dir_file(argv[0], "../heapd", heapd, sizeof heapd);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGALRM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    alarm(300); /* a hung rank or heapd must not hang `make bench` */
    uint64_t warm = iters / 10 < 100 ? iters / 10 : 100;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double load1 = -1;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load1) != 1)
            load1 = -1;
        fclose(la);
    }
    double t_start = now_us();

    start_heapd(heapd);
    printf("bench " NAME ": heapd %s (pid %d), socket %s, backend host, %ld CPU(s), 1-min load "
           "average at start %.2f\n",
           heapd, (int)g_heapd, g_sock, cpus, load1);
    printf("bench " NAME ": R rank processes on one R-rank heap; each does %" PRIu64 " warm-up + %" PRIu64
           " x { alloc 4 KiB; free; flush; collect }; only heapc_collect is timed, on rank 0\n",
           warm, iters);
    fflush(stdout);
    const uint32_t ns[3] = {2, 4, 8};
    row rows[3];
    for (int k = 0; k < 3; k++) {
        rows[k] = run(ns[k], warm, iters);
        printf("bench " NAME ": %u ranks: rank 0's collect p50 %.2f us p99 %.2f us mean %.2f us (min "
               "%.2f, max %.2f); first call to last return p50 %.2f us p99 %.2f us; %.2f us per "
               "whole iteration\n",
               ns[k], rows[k].p50, rows[k].p99, rows[k].mean, rows[k].min, rows[k].max, rows[k].span_p50,
               rows[k].span_p99, rows[k].iter_us);
        fflush(stdout);
    }
    cleanup();

    printf("\n" NAME ": collect latency as seen by rank 0 (host backend, one heapd, %" PRIu64
           " collects per row), microseconds\n",
           iters);
    printf("%5s %10s %10s %10s %10s %10s %14s\n", "ranks", "p50", "p99", "mean", "span p50", "span p99",
           "us/iteration");
    for (int k = 0; k < 3; k++)
        printf("%5u %10.2f %10.2f %10.2f %10.2f %10.2f %14.2f\n", rows[k].ranks, rows[k].p50, rows[k].p99, rows[k].mean,
               rows[k].span_p50, rows[k].span_p99, rows[k].iter_us);
    printf("(p50/p99/mean: heapc_collect on rank 0; span: first rank's heapc_collect call to the "
           "last rank's return; us/iteration: rank 0's loop time per alloc+free+flush+collect)\n");
    printf("bench " NAME ": done in %.1f s\n", (now_us() - t_start) / 1e6);

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, NAME ": cannot write %s: %s\n", json, strerror(errno));
            return 1;
        }
        fprintf(f,
                "{\n  \"bench\": \"" NAME "\",\n  \"quick\": %s,\n  \"cpus\": %ld,\n"
                "  \"loadavg_1min\": %.2f,\n  \"alloc_size\": %" PRIu64 ",\n  \"iters\": %" PRIu64
                ",\n  \"warmup\": %" PRIu64 ",\n  \"collect\": [\n",
                quick ? "true" : "false", cpus, load1, ALLOC_SIZE, iters, warm);
        for (int k = 0; k < 3; k++)
            fprintf(f,
                    "    {\"ranks\": %u, \"p50_us\": %.3f, \"p99_us\": %.3f, \"mean_us\": %.3f, "
                    "\"min_us\": %.3f, \"max_us\": %.3f, \"span_p50_us\": %.3f, "
                    "\"span_p99_us\": %.3f, \"iteration_us\": %.3f}%s\n",
                    rows[k].ranks, rows[k].p50, rows[k].p99, rows[k].mean, rows[k].min, rows[k].max, rows[k].span_p50,
                    rows[k].span_p99, rows[k].iter_us, k < 2 ? "," : "");
        fprintf(f, "  ]\n}\n");
        if (fclose(f) != 0) {
            fprintf(stderr, NAME ": cannot write %s\n", json);
            return 1;
        }
    }
    return 0;
}
