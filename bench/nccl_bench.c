/* nccl_bench - what libheapc_nccl's memory probe costs.
 *
 *   nccl_bench [--json FILE] [--quick] [--heapd PATH] [--iters N] [--max-blocks N]
 *
 * Starts its own heapd (PATH, default dirname(argv[0])/../heapd) on a
 * temporary configuration (socket in a mkdtemp directory, backend = host,
 * log_level = warn) and stops it at the end, also on error.
 *
 * 1. Probe cost against live blocks. One 1-rank heap (1 GiB chunk and
 *    initial size, min_block 512) holds 10^2, 10^3, ... 10^6 live 512-byte
 *    blocks (--quick: up to 10^5), allocated one by one through heapd; at
 *    each level the status page is checked (live = blocks x 512) and three
 *    things are timed, N calls each (--iters, default 2,000,000; the median
 *    of 5 runs, ns per call):
 *      - heapc_status(): the seqlock read of the page;
 *      - hnccl_probe(): the wrapper's probe (page read, threshold compare,
 *        counters; the threshold is 0, so no callback);
 *      - hnccl_all_reduce() with all_reduce set to probe, through a
 *        recording table whose ncclAllReduce returns at once.
 *    These must stay flat: the bench fails when the slowest level's probe
 *    costs more than 3x the fastest's.
 * 2. The cudaMemGetInfo probe the page replaces (GPU machines: libcudart's
 *    cudaMemGetInfo per call, and hnccl's HNCCL_SOURCE_CUDA with interval 0
 *    and 1 ms, through libcuda's cuMemGetInfo); "skipped: no GPU" elsewhere.
 * 3. For reference, per-call overhead of a wrapped call over the raw call
 *    through the same recording table (ncclAllReduce returning at once):
 *    skip policy; probe (page); probe below the threshold with a no-op
 *    release callback; probe with HNCCL_SOURCE_CUDA at 1 ms through the
 *    table's recorded cuMemGetInfo (no driver).
 *
 * Prints "bench nccl_bench: ..." lines and tables; --json FILE writes JSON.
 * Exit 0, or 1 on any error (printed) or a probe cost that is not flat.
 */
#include "heapc.h"
#include "heapc_nccl.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NAME "nccl_bench"
#define BENCH_ONE_HEAPD
#include "bench_util.h"
#define KiB        ((uint64_t)1 << 10)
#define MiB        ((uint64_t)1 << 20)
#define GiB        ((uint64_t)1 << 30)
#define BLOCK      512u
#define REPS       5
#define MAX_LEVELS 5
#define FLAT_LIMIT 3.0

/* ---- heapd -------------------------------------------------------------- */

static void cleanup(void) { remove_heapd(); }

/* ---- the recording table: calls that return at once ----------------------- */

static volatile uint64_t g_sink;

static ncclResult_t nop_all_reduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t st)
{
    (void)s, (void)r, (void)dt, (void)op, (void)comm, (void)st;
    g_sink += n;
    return ncclSuccess;
}

static const char *nop_error_string(ncclResult_t r)
{
    (void)r;
    return "recorded";
}

static int fake_mem_get_info(size_t *f, size_t *t)
{
    g_sink++;
    *f = 10 * GiB;
    *t = 80 * GiB;
    return 0;
}

static hnccl_table nop_table = {
    .AllReduce = nop_all_reduce,
    .GetErrorString = nop_error_string,
    .MemGetInfo = fake_mem_get_info,
};

static void nop_cb(void *arg, const hnccl_probe_info *info)
{
    (void)arg;
    g_sink += info->device_free & 1;
}

/* ---- timing ------------------------------------------------------------------ */

typedef enum what { W_STATUS, W_PROBE, W_WRAPPED, W_RAW, W_CUDART, W_HNCCL_CUDA } what;

typedef int (*cudart_meminfo_fn)(size_t *, size_t *);
static cudart_meminfo_fn g_cudart_meminfo;

/* ns per call, the median of REPS runs of n calls. */
static double timeit(what w, heapc *c, hnccl_ctx *x, uint64_t n)
{
    double r[REPS];
    const hnccl_table *volatile tp = &nop_table;
    float b = 0;
    for (int k = 0; k < REPS; k++) {
        double t0 = (now_us() / 1e6);
        switch (w) {
        case W_STATUS:
            for (uint64_t i = 0; i < n; i++) {
                heapc_status_t st;
                if (heapc_status(c, &st) != HEAPC_OK)
                    die("heapc_status failed");
                g_sink += st.device_free & 1;
            }
            break;
        case W_PROBE:
        case W_HNCCL_CUDA:
            for (uint64_t i = 0; i < n; i++)
                if (hnccl_probe(x, HNCCL_OP_ALL_REDUCE, NULL) < 0)
                    die("hnccl_probe: %s", hnccl_errstr(x));
            break;
        case W_WRAPPED:
            for (uint64_t i = 0; i < n; i++)
                if (hnccl_all_reduce(x, &b, &b, 1, ncclFloat, ncclSum, NULL, NULL) != 0)
                    die("hnccl_all_reduce: %s", hnccl_errstr(x));
            break;
        case W_RAW:
            for (uint64_t i = 0; i < n; i++)
                if (tp->AllReduce(&b, &b, 1, ncclFloat, ncclSum, NULL, NULL) != ncclSuccess)
                    die("raw AllReduce failed");
            break;
        case W_CUDART:
            for (uint64_t i = 0; i < n; i++) {
                size_t f, t;
                if (g_cudart_meminfo(&f, &t) != 0)
                    die("cudaMemGetInfo failed");
                g_sink += f & 1;
            }
            break;
        }
        r[k] = ((now_us() / 1e6) - t0) * 1e9 / (double)n;
    }
    qsort(r, REPS, sizeof r[0], cmp_double);
    return r[REPS / 2];
}

/* ---- GPU --------------------------------------------------------------------- */

typedef int (*cu_meminfo_fn)(size_t *, size_t *);
static cu_meminfo_fn g_cu_meminfo;

/* 1 when a GPU answers through libcudart and libcuda; why otherwise. */
static int gpu_open(char *why, size_t len)
{
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu) {
        snprintf(why, len, "%s", dlerror());
        return 0;
    }
    static const char *const rt_names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};
    void *rt = NULL;
    for (size_t i = 0; i < sizeof rt_names / sizeof rt_names[0] && !rt; i++)
        rt = dlopen(rt_names[i], RTLD_NOW | RTLD_LOCAL);
    if (!rt) {
        snprintf(why, len, "no libcudart.so (cudaMemGetInfo)");
        return 0;
    }
    void *cnt = dlsym(rt, "cudaGetDeviceCount"), *setdev = dlsym(rt, "cudaSetDevice"),
         *rtmi = dlsym(rt, "cudaMemGetInfo"), *cumi = dlsym(cu, "cuMemGetInfo_v2");
    if (!cnt || !setdev || !rtmi || !cumi) {
        snprintf(why, len,
                 "libcudart/libcuda lack cudaGetDeviceCount, cudaSetDevice, cudaMemGetInfo or "
                 "cuMemGetInfo_v2");
        return 0;
    }
    int (*get_count)(int *);
    int (*set_device)(int);
    memcpy(&get_count, &cnt, sizeof cnt);
    memcpy(&set_device, &setdev, sizeof setdev);
    memcpy(&g_cudart_meminfo, &rtmi, sizeof rtmi);
    memcpy(&g_cu_meminfo, &cumi, sizeof cumi);
    int n = 0, rc = get_count(&n);
    if (rc != 0 || n <= 0) {
        snprintf(why, len, "cudaGetDeviceCount: error %d, %d devices", rc, n);
        return 0;
    }
    rc = set_device(0); /* makes device 0's primary context current (runtime) */
    size_t f, t;
    if (rc == 0)
        rc = g_cudart_meminfo(&f, &t); /* creates it */
    if (rc != 0) {
        snprintf(why, len, "cudaSetDevice(0)/cudaMemGetInfo: error %d", rc);
        return 0;
    }
    return 1;
}

/* ---- main ------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f, "usage: " NAME " [--json FILE] [--quick] [--heapd PATH] [--iters N] [--max-blocks N]\n"
               "  --json FILE   also write the results as JSON to FILE\n"
               "  --quick       up to 10^5 live blocks, 200000 calls per timing\n"
               "  --heapd PATH  the heapd to start (default: dirname(argv[0])/../heapd)\n"
               "  --iters N     calls per timing run (default 2000000)\n"
               "  --max-blocks N  stop at the level of at most N live blocks (>= 100; e.g. for\n"
               "                a debug build, whose heapd validates its heap at every call)\n");
}

typedef struct level {
    uint64_t blocks;
    double alloc_s; /* to reach this level from the previous one */
    uint64_t page_live, page_allocs;
    double status_ns, probe_ns, wrapped_ns;
} level;

typedef struct overhead {
    const char *name;
    double ns, over_ns, ratio;
} overhead;

int main(int argc, char **argv)
{
    const char *json = NULL;
    char heapd[PATH_MAX] = "";
    uint64_t iters = 2000000;
    int quick = 0;
    uint64_t max_blocks = UINT64_MAX;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json = argv[++i];
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
            iters = 200000;
        } else if (!strcmp(argv[i], "--heapd") && i + 1 < argc) {
            snprintf(heapd, sizeof heapd, "%s", argv[++i]);
        } else if (!strcmp(argv[i], "--max-blocks") && i + 1 < argc) {
            char *end;
            max_blocks = strtoull(argv[++i], &end, 10);
            if (*end || max_blocks < 100) {
                fprintf(stderr, NAME ": --max-blocks takes a number >= 100, not '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            char *end;
            iters = strtoull(argv[++i], &end, 10);
            if (*end || iters < 1000 || iters > 100000000) {
                fprintf(stderr, NAME ": --iters takes 1000..100000000, not '%s'\n", argv[i]);
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
    alarm(600);
    unsetenv("HEAPC_NCCL_PROBE");
    unsetenv("HEAPC_NCCL_SKIP");
    unsetenv("HEAPC_NCCL_FREE_MIN");
    double t_start = (now_us() / 1e6);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    /* ---- 1. probe cost against live blocks ---- */
    start_heapd(heapd);
    heapc *c = heapc_connect(g_sock);
    if (!c || heapc_err(c))
        die("heapc_connect(%s): %s", g_sock, c ? heapc_errstr(c) : "out of memory");
    heapc_params p;
    memset(&p, 0, sizeof p);
    p.chunk_size = 1 * GiB;
    p.initial_size = 1 * GiB;
    p.va_size = 4 * GiB;
    p.min_block = BLOCK;
    if (heapc_attach(c, "nccl-bench", 0, 1, &p) != HEAPC_OK)
        die("heapc_attach: %s", heapc_errstr(c));
    hnccl_ctx *x = hnccl_new(c);
    if (!x || hnccl_err(x))
        die("hnccl_new: %s", x ? hnccl_errstr(x) : "out of memory");
    if (hnccl_set_table(x, &nop_table) || hnccl_set_policy(x, "all_reduce", HNCCL_PROBE) || hnccl_set_threshold(x, 0))
        die("hnccl setup: %s", hnccl_errstr(x));
    printf("bench " NAME ": heapd %s (pid %d), backend host, %ld CPU(s); one 1-rank heap, %u-byte blocks; "
           "%" PRIu64 " calls per timing, median of %d\n",
           heapd, (int)g_heapd, cpus, BLOCK, iters, REPS);
    fflush(stdout);

    int nlev = quick ? 4 : 5;
    for (uint64_t top = 100, l = 1; l < (uint64_t)nlev; l++) {
        top *= 10;
        if (top > max_blocks) {
            nlev = (int)l;
            break;
        }
    }
    level lv[MAX_LEVELS];
    uint64_t live = 0;
    for (int l = 0; l < nlev; l++) {
        uint64_t want = 100;
        for (int k = 0; k < l; k++)
            want *= 10;
        double t0 = (now_us() / 1e6);
        for (; live < want; live++)
            if (heapc_alloc(c, BLOCK, NULL, NULL) != HEAPC_OK)
                die("heapc_alloc #%" PRIu64 ": %s", live, heapc_errstr(c));
        lv[l].blocks = want;
        lv[l].alloc_s = (now_us() / 1e6) - t0;
        heapc_status_t st;
        if (heapc_status(c, &st) != HEAPC_OK)
            die("no status page");
        lv[l].page_live = st.live;
        lv[l].page_allocs = st.allocs;
        if (st.live != want * BLOCK || st.allocs != want)
            die("status page at %" PRIu64 " live blocks: live %" PRIu64 " bytes, %" PRIu64 " allocations", want,
                st.live, st.allocs);
        lv[l].status_ns = timeit(W_STATUS, c, x, iters);
        lv[l].probe_ns = timeit(W_PROBE, c, x, iters);
        lv[l].wrapped_ns = timeit(W_WRAPPED, c, x, iters);
        printf("bench " NAME ": %" PRIu64 " live blocks (page: live %" PRIu64 " B, %" PRIu64
               " allocations; %.1f s to allocate): heapc_status %.1f ns, hnccl_probe %.1f ns, "
               "probing hnccl_all_reduce %.1f ns\n",
               want, st.live, st.allocs, lv[l].alloc_s, lv[l].status_ns, lv[l].probe_ns, lv[l].wrapped_ns);
        fflush(stdout);
    }
    double pmin = lv[0].probe_ns, pmax = lv[0].probe_ns;
    for (int l = 1; l < nlev; l++) {
        pmin = lv[l].probe_ns < pmin ? lv[l].probe_ns : pmin;
        pmax = lv[l].probe_ns > pmax ? lv[l].probe_ns : pmax;
    }
    double spread = pmax / pmin;
    int flat = spread <= FLAT_LIMIT;

    /* ---- 3. per-call overhead through the recording table ---- */
    overhead ov[5] = {{"raw ncclAllReduce (recording table)", 0, 0, 0},
                      {"wrapped, skip (default policy)", 0, 0, 0},
                      {"wrapped, probe: status page", 0, 0, 0},
                      {"wrapped, probe: page, below, no-op callback", 0, 0, 0},
                      {"wrapped, probe: cuda source 1 ms (recorded)", 0, 0, 0}};
    ov[0].ns = timeit(W_RAW, c, x, iters);
    hnccl_set_policy(x, "all_reduce", HNCCL_SKIP);
    ov[1].ns = timeit(W_WRAPPED, c, x, iters);
    hnccl_set_policy(x, "all_reduce", HNCCL_PROBE);
    ov[2].ns = timeit(W_WRAPPED, c, x, iters);
    hnccl_set_threshold(x, UINT64_MAX);
    hnccl_set_release_cb(x, nop_cb, NULL);
    ov[3].ns = timeit(W_WRAPPED, c, x, iters);
    hnccl_set_threshold(x, 0);
    hnccl_set_release_cb(x, NULL, NULL);
    if (hnccl_set_probe_source(x, HNCCL_SOURCE_CUDA, 1000) != HNCCL_OK)
        die("hnccl_set_probe_source: %s", hnccl_errstr(x));
    ov[4].ns = timeit(W_WRAPPED, c, x, iters);
    hnccl_set_probe_source(x, HNCCL_SOURCE_PAGE, 0);
    for (int i = 0; i < 5; i++) {
        ov[i].over_ns = ov[i].ns - ov[0].ns;
        ov[i].ratio = ov[i].ns / ov[0].ns;
    }

    /* ---- 2. cudaMemGetInfo, when there is a GPU ---- */
    char why[512] = "";
    int gpu = gpu_open(why, sizeof why);
    double cudart_ns = 0, cu0_ns = 0, cu1ms_ns = 0;
    uint64_t gpu_iters = iters / 20 < 1000 ? 1000 : iters / 20;
    if (gpu) {
        cudart_ns = timeit(W_CUDART, c, x, gpu_iters);
        hnccl_table t = nop_table;
        memcpy(&t.MemGetInfo, &g_cu_meminfo, sizeof g_cu_meminfo);
        hnccl_set_table(x, &t);
        if (hnccl_set_probe_source(x, HNCCL_SOURCE_CUDA, 0) != HNCCL_OK)
            die("hnccl_set_probe_source: %s", hnccl_errstr(x));
        cu0_ns = timeit(W_HNCCL_CUDA, c, x, gpu_iters);
        hnccl_set_probe_source(x, HNCCL_SOURCE_CUDA, 1000);
        cu1ms_ns = timeit(W_HNCCL_CUDA, c, x, gpu_iters);
        hnccl_set_probe_source(x, HNCCL_SOURCE_PAGE, 0);
        hnccl_set_table(x, &nop_table);
    } else {
        printf("bench " NAME ": cudaMemGetInfo: skipped: no GPU (%s)\n", why);
    }

    hnccl_counters k;
    hnccl_get_counters(x, &k);
    hnccl_free(x);
    if (heapc_detach(c) != HEAPC_OK)
        die("heapc_detach: %s", heapc_errstr(c));
    heapc_free_ctx(c);
    cleanup();

    /* ---- tables ---- */
    printf("\n" NAME ": probe cost against live blocks (ns per call, median of %d x %" PRIu64 ")\n", REPS, iters);
    printf("%12s %14s %12s %12s %18s\n", "live blocks", "page live B", "heapc_status", "hnccl_probe",
           "probing all_reduce");
    for (int l = 0; l < nlev; l++)
        printf("%12" PRIu64 " %14" PRIu64 " %12.1f %12.1f %18.1f\n", lv[l].blocks, lv[l].page_live, lv[l].status_ns,
               lv[l].probe_ns, lv[l].wrapped_ns);
    printf("probe max/min over the levels: %.2f (%s; limit %.1f)\n", spread, flat ? "flat" : "NOT FLAT", FLAT_LIMIT);
    printf("\n" NAME ": the cudaMemGetInfo probe (GPU 0)\n");
    if (gpu) {
        printf("%-44s %10s %12s\n", "probe", "ns/call", "x page probe");
        printf("%-44s %10.1f %12.1f\n", "cudaMemGetInfo (libcudart)", cudart_ns, cudart_ns / lv[0].probe_ns);
        printf("%-44s %10.1f %12.1f\n", "hnccl_probe, cuda source, interval 0", cu0_ns, cu0_ns / lv[0].probe_ns);
        printf("%-44s %10.1f %12.1f\n", "hnccl_probe, cuda source, interval 1 ms", cu1ms_ns, cu1ms_ns / lv[0].probe_ns);
        printf("%-44s %10.1f %12.1f\n", "hnccl_probe, status page (10^2 blocks)", lv[0].probe_ns, 1.0);
    } else {
        printf("skipped: no GPU\n");
    }
    printf("\n" NAME ": per-call overhead of a wrapped call over the raw call (recording table, "
           "ncclAllReduce returns at once; %" PRIu64 " live blocks)\n",
           lv[nlev - 1].blocks);
    printf("%-46s %10s %12s %8s\n", "call", "ns/call", "overhead ns", "ratio");
    for (int i = 0; i < 5; i++)
        printf("%-46s %10.1f %12.1f %8.2f\n", ov[i].name, ov[i].ns, ov[i].over_ns, ov[i].ratio);
    printf("bench " NAME ": counters: %" PRIu64 " probes, %" PRIu64 " callbacks, %" PRIu64 " cuMemGetInfo "
           "queries, %" PRIu64 " reused; done in %.1f s\n",
           k.probes, k.callbacks, k.cuda_queries, k.cuda_reused, (now_us() / 1e6) - t_start);

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, NAME ": cannot write %s: %s\n", json, strerror(errno));
            return 1;
        }
        fprintf(f,
                "{\n  \"bench\": \"" NAME "\",\n  \"quick\": %s,\n  \"cpus\": %ld,\n  \"iters\": %" PRIu64
                ",\n  \"reps\": %d,\n  \"block_bytes\": %u,\n  \"probe_vs_live\": [\n",
                quick ? "true" : "false", cpus, iters, REPS, BLOCK);
        for (int l = 0; l < nlev; l++)
            fprintf(f,
                    "    {\"live_blocks\": %" PRIu64 ", \"page_live_bytes\": %" PRIu64 ", \"page_allocs\": %" PRIu64
                    ", \"alloc_s\": %.3f, \"heapc_status_ns\": %.2f, \"hnccl_probe_ns\": %.2f, "
                    "\"probing_all_reduce_ns\": %.2f}%s\n",
                    lv[l].blocks, lv[l].page_live, lv[l].page_allocs, lv[l].alloc_s, lv[l].status_ns, lv[l].probe_ns,
                    lv[l].wrapped_ns, l < nlev - 1 ? "," : "");
        fprintf(f, "  ],\n  \"probe_max_over_min\": %.3f,\n  \"flat\": %s,\n", spread, flat ? "true" : "false");
        if (gpu)
            fprintf(f,
                    "  \"cuda\": {\"skipped\": false, \"cudaMemGetInfo_ns\": %.2f, \"hnccl_cuda_interval0_ns\": %.2f, "
                    "\"hnccl_cuda_interval1ms_ns\": %.2f, \"iters\": %" PRIu64 "},\n",
                    cudart_ns, cu0_ns, cu1ms_ns, gpu_iters);
        else
            fprintf(f, "  \"cuda\": {\"skipped\": true, \"reason\": \"no GPU\"},\n");
        fprintf(f, "  \"overhead\": [\n");
        for (int i = 0; i < 5; i++)
            fprintf(f, "    {\"call\": \"%s\", \"ns\": %.2f, \"overhead_ns\": %.2f, \"ratio\": %.3f}%s\n", ov[i].name,
                    ov[i].ns, ov[i].over_ns, ov[i].ratio, i < 4 ? "," : "");
        fprintf(f, "  ]\n}\n");
        if (fclose(f) != 0) {
            fprintf(stderr, NAME ": cannot write %s\n", json);
            return 1;
        }
    }
    if (!flat) {
        fprintf(stderr, NAME ": the probe is not flat: %.1f ns at best, %.1f ns at worst (x%.2f > x%.1f)\n", pmin, pmax,
                spread, FLAT_LIMIT);
        return 1;
    }
    return 0;
}
