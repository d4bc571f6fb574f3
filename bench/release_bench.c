/* release_bench - what releasing a heap's memory and restoring it at the
 * same offsets costs (issue 30), against a pinned copy of the same bytes.
 *
 *   release_bench --socket S [--ranks 2] [--size 16G] [--chunk 256M]
 *                 [--anchor-size SIZE] [--host] [--heap NAME] [--json PATH]
 *
 * --ranks rank processes attach heap NAME (chunk_size --chunk, initial_size
 * = va_size = --size per rank, no persist) on one GPU (the cuda backend;
 * --host: the host backend, a dry run on a CPU machine), allocate blocks over
 * all of it and write a pattern of their own into their whole copy (a kernel
 * from embedded PTX on the GPU: word i of the rank's copy is (i + seed) * K,
 * K odd; a loop on the host). Then, in lockstep (a barrier between steps),
 * 4 rounds, each with a new seed written first (untimed):
 *   1. heapc_release(DISCARD), heapc_restore: the copy must read zeros;
 *   2. heapc_release(HOST): the first host release (heapd allocates and pins
 *      the host copy), heapc_restore (refills, frees the copy);
 *   3. heapc_release(HOST | KEEP): allocates and pins again, heapc_restore
 *      keeps the host copy;
 *   4. heapc_release(HOST | KEEP) with the kept copy: the copy only (the
 *      steady RL pattern), heapc_restore.
 * Each release and restore is timed per rank (the call, which is collective
 * over the local ranks); after each, heapc_state and the status page's
 * state / resident are checked, and after each host restore the whole copy
 * is compared word by word with the pattern (bit-identical, by the kernel:
 * it counts the words that differ). Rank 0 reads the device's free memory
 * (cuMemGetInfo; host backend: MemAvailable) before and after each release:
 * it should grow by the released bytes (every local rank's chunks).
 * The anchor, rank 0 alone before the rounds: --anchor-size bytes (default
 * --size) of its copy to a pinned buffer (cuMemHostAlloc) with cuMemcpyDtoH
 * and back with cuMemcpyHtoD, timed (host: memcpy to a touched buffer).
 * Prints key value lines (release_discard_ms, ..., the GiB/s of each host
 * copy = bytes of all ranks / the slowest rank's time, d2h_gib_s, h2d_gib_s,
 * release_host_over_pinned, restore_host_over_pinned: round 4's against the
 * anchor; device_free_*). Targets (judged by scripts/gpu.sh on the GPU):
 * release_discard_ms <= 50, the two ratios >= 0.80, device_free_growth_over_
 * released >= 0.98. Exit 0 when every check held, 1 otherwise, 2 usage;
 * without --socket or $HEAPD_SOCKET (make bench) it says it skipped, exit 0.
 */
#include "heapc.h"
#include "heapc_cuda.h"
#include "size.h"

#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct {
    const char *sock, *heap, *json;
    int ranks, host;
    uint64_t size, chunk, anchor;
} o = {NULL, "release", NULL, 2, 0, 16ull << 30, 256ull << 20, 0};

enum { ROUNDS = 4 };
static const int round_mode[ROUNDS] = {HEAPC_RELEASE_DISCARD, HEAPC_RELEASE_HOST,
                                       HEAPC_RELEASE_HOST | HEAPC_RELEASE_KEEP,
                                       HEAPC_RELEASE_HOST | HEAPC_RELEASE_KEEP};
static const char *const round_name[ROUNDS] = {"discard", "host", "host_keep_first", "host_keep"};

typedef struct result { /* one rank, in shared memory */
    double rel_ms[ROUNDS], res_ms[ROUNDS];
    uint64_t mapped, releases, restores;
    int ok;
    char why[1024];
} result;

typedef struct shared {
    _Atomic unsigned count, gen;
    _Atomic int abort;
    /* rank 0's */
    double d2h_ms, h2d_ms;
    uint64_t anchor_bytes;
    uint64_t free_before[ROUNDS], free_released[ROUNDS], free_restored[ROUNDS];
    uint64_t copy_released[ROUNDS], copy_restored[ROUNDS]; /* heapc_heap_stats.host_copy_bytes */
    result r[];
} shared;

static shared *sh;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Every rank waits for the others; -1 when one gave up (abort) or after 300 s. */
static int barrier(void)
{
    unsigned g = atomic_load(&sh->gen);
    if (atomic_fetch_add(&sh->count, 1) == (unsigned)o.ranks - 1) {
        atomic_store(&sh->count, 0);
        atomic_fetch_add(&sh->gen, 1);
        return 0;
    }
    double end = now_ms() + 300e3;
    for (int i = 0; atomic_load(&sh->gen) == g; i++) {
        if (atomic_load(&sh->abort) || now_ms() > end)
            return -1;
        if (i > 1000)
            usleep(20);
        else
            sched_yield();
    }
    return 0;
}

/* ---- the device: the cuda driver API, or host memory ------------------------ */

#define PTX_HEAD(name, params)                                                                                         \
    ".visible .entry " name "(" params ")\n{\n"                                                                        \
    "    .reg .pred %p<3>;\n    .reg .b32 %r<5>;\n    .reg .b64 %rd<16>;\n"
/* %rd4: this thread's first word, %rd6: the grid's stride */
#define PTX_INDEX                                                                                                      \
    "    mov.u32 %r1, %tid.x;\n    mov.u32 %r2, %ctaid.x;\n"                                                           \
    "    mov.u32 %r3, %ntid.x;\n    mov.u32 %r4, %nctaid.x;\n"                                                         \
    "    mul.wide.u32 %rd4, %r2, %r3;\n    cvt.u64.u32 %rd5, %r1;\n"                                                   \
    "    add.u64 %rd4, %rd4, %rd5;\n    mul.wide.u32 %rd6, %r3, %r4;\n"
#define PTX_K  "0x9E3779B97F4A7C15U"
#define HOST_K 0x9E3779B97F4A7C15ull
/* fill64(dst, words, seed): dst[i] = (i + seed) * K.
 * check64(src, words, seed, mask, out): *out += the number of i with
 * src[i] != ((i + seed) * K) & mask (mask 0: the words that are not zero).
 * Both grid-stride. (ptxas -arch=sm_90 accepts it.) */
#define PTX_FILL64                                                                                                     \
    PTX_HEAD("fill64", ".param .u64 p_dst, .param .u64 p_words, .param .u64 p_seed")                                   \
    "    ld.param.u64 %rd1, [p_dst];\n    ld.param.u64 %rd2, [p_words];\n"                                             \
    "    ld.param.u64 %rd3, [p_seed];\n" PTX_INDEX "FLOOP:\n"                                                          \
    "    setp.ge.u64 %p1, %rd4, %rd2;\n    @%p1 bra FDONE;\n"                                                          \
    "    add.u64 %rd7, %rd4, %rd3;\n"                                                                                  \
    "    mul.lo.u64 %rd7, %rd7, " PTX_K ";\n"                                                                          \
    "    shl.b64 %rd8, %rd4, 3;\n    add.u64 %rd9, %rd1, %rd8;\n"                                                      \
    "    st.global.u64 [%rd9], %rd7;\n    add.u64 %rd4, %rd4, %rd6;\n"                                                 \
    "    bra FLOOP;\n"                                                                                                 \
    "FDONE:\n"                                                                                                         \
    "    ret;\n"                                                                                                       \
    "}\n"
#define PTX_CHECK64                                                                                                    \
    PTX_HEAD("check64", ".param .u64 p_src, .param .u64 p_words, .param .u64 p_seed, .param .u64 p_mask, "             \
                        ".param .u64 p_out")                                                                           \
    "    ld.param.u64 %rd1, [p_src];\n    ld.param.u64 %rd2, [p_words];\n"                                             \
    "    ld.param.u64 %rd3, [p_seed];\n    ld.param.u64 %rd12, [p_mask];\n"                                            \
    "    ld.param.u64 %rd13, [p_out];\n" PTX_INDEX "    mov.u64 %rd7, 0;\n"                                            \
    "CLOOP:\n"                                                                                                         \
    "    setp.ge.u64 %p1, %rd4, %rd2;\n    @%p1 bra CDONE;\n"                                                          \
    "    shl.b64 %rd8, %rd4, 3;\n    add.u64 %rd9, %rd1, %rd8;\n"                                                      \
    "    ld.global.u64 %rd10, [%rd9];\n    add.u64 %rd11, %rd4, %rd3;\n"                                               \
    "    mul.lo.u64 %rd11, %rd11, " PTX_K ";\n"                                                                        \
    "    and.b64 %rd11, %rd11, %rd12;\n    setp.ne.u64 %p2, %rd10, %rd11;\n"                                           \
    "    selp.u64 %rd14, 1, 0, %p2;\n    add.u64 %rd7, %rd7, %rd14;\n"                                                 \
    "    add.u64 %rd4, %rd4, %rd6;\n    bra CLOOP;\n"                                                                  \
    "CDONE:\n"                                                                                                         \
    "    atom.global.add.u64 %rd15, [%rd13], %rd7;\n    ret;\n"                                                        \
    "}\n"
static const char bench_ptx[] = ".version 6.0\n.target sm_50\n.address_size 64\n" PTX_FILL64 PTX_CHECK64;

static char derr[400];
#if HEAPD_HAVE_CUDA_H
static struct {
    const hc_cuda *cu;
    CUfunction fill, check;
    CUdeviceptr out;
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemGetInfo)(size_t *, size_t *);
} cu;
#define CK(call, what)                                                                                                 \
    do {                                                                                                               \
        CUresult rc_ = (call);                                                                                         \
        if (rc_ != CUDA_SUCCESS) {                                                                                     \
            hc_cuda_fail(derr, sizeof derr, rc_, NULL, "%s", what);                                                    \
            return -1;                                                                                                 \
        }                                                                                                              \
    } while (0)

static int cu_load(void)
{
    if (!(cu.cu = hc_cuda_get(derr, sizeof derr)))
        return -1;
    void *lib = cd_open(derr, sizeof derr);
    const cd_sym syms[] = {
        {(void **)&cu.ModuleLoadData, "cuModuleLoadData", NULL},
        {(void **)&cu.ModuleGetFunction, "cuModuleGetFunction", NULL},
        {(void **)&cu.LaunchKernel, "cuLaunchKernel", NULL},
        {(void **)&cu.MemAlloc, "cuMemAlloc_v2", NULL},
        {(void **)&cu.MemsetD32, "cuMemsetD32_v2", NULL},
        {(void **)&cu.MemcpyDtoH, "cuMemcpyDtoH_v2", NULL},
        {(void **)&cu.MemcpyHtoD, "cuMemcpyHtoD_v2", NULL},
        {(void **)&cu.MemHostAlloc, "cuMemHostAlloc", NULL},
        {(void **)&cu.MemFreeHost, "cuMemFreeHost", NULL},
        {(void **)&cu.MemGetInfo, "cuMemGetInfo_v2", NULL},
    };
    const char *missing;
    if (!lib || cd_resolve(lib, syms, sizeof syms / sizeof syms[0], &missing)) {
        snprintf(derr, sizeof derr, "libcuda.so.1 lacks an entry point the bench needs (%s)",
                 lib ? missing : "no libcuda");
        return -1;
    }
    return 0;
}
#endif

static int dev_init(uint32_t rank)
{
    if (o.host)
        return 0;
#if HEAPD_HAVE_CUDA_H
    int n = 0;
    CUdevice d;
    CUcontext ctx;
    CUmodule mod;
    if (cu_load())
        return -1;
    CK(cu.cu->DeviceGetCount(&n), "cuDeviceGetCount");
    (void)rank; /* every rank on device 0: one GPU */
    CK(cu.cu->DeviceGet(&d, 0), "cuDeviceGet(0)");
    CK(cu.cu->DevicePrimaryCtxRetain(&ctx, d), "cuDevicePrimaryCtxRetain");
    CK(cu.cu->CtxSetCurrent(ctx), "cuCtxSetCurrent");
    CK(cu.ModuleLoadData(&mod, bench_ptx), "cuModuleLoadData(fill64/check64 PTX)");
    CK(cu.ModuleGetFunction(&cu.fill, mod, "fill64"), "cuModuleGetFunction(fill64)");
    CK(cu.ModuleGetFunction(&cu.check, mod, "check64"), "cuModuleGetFunction(check64)");
    CK(cu.MemAlloc(&cu.out, 8), "cuMemAlloc(8)");
    /* launches over nothing: module loading is lazy */
    CUdeviceptr none = 0;
    unsigned long long zero = 0;
    void *fargs[] = {&none, &zero, &zero}, *cargs[] = {&none, &zero, &zero, &zero, &cu.out};
    CK(cu.LaunchKernel(cu.fill, 1, 1, 1, 32, 1, 1, 0, NULL, fargs, NULL), "cuLaunchKernel(fill64, warm-up)");
    CK(cu.LaunchKernel(cu.check, 1, 1, 1, 32, 1, 1, 0, NULL, cargs, NULL), "cuLaunchKernel(check64, warm-up)");
    CK(cu.cu->CtxSynchronize(), "cuCtxSynchronize");
    return 0;
#else
    (void)rank;
    snprintf(derr, sizeof derr, "built without cuda.h: only --host runs");
    return -1;
#endif
}

/* Writes the pattern of seed into bytes at p; returns once it is written. */
static int dev_fill(void *p, uint64_t bytes, uint64_t seed)
{
    if (o.host) {
        uint64_t *w = p;
        for (uint64_t i = 0; i < bytes / 8; i++)
            w[i] = (i + seed) * HOST_K;
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    CUdeviceptr dst = (CUdeviceptr)(uintptr_t)p;
    unsigned long long words = bytes / 8, s = seed;
    void *args[] = {&dst, &words, &s};
    CK(cu.LaunchKernel(cu.fill, 2048, 1, 1, 256, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel(fill64)");
    CK(cu.cu->CtxSynchronize(), "cuCtxSynchronize(fill64)");
#endif
    return 0;
}

/* *bad = the words at p that differ from seed's pattern (zeros: the words not 0). */
static int dev_check(const void *p, uint64_t bytes, uint64_t seed, int zeros, uint64_t *bad)
{
    uint64_t mask = zeros ? 0 : ~0ull;
    if (o.host) {
        const uint64_t *w = p;
        uint64_t n = 0;
        for (uint64_t i = 0; i < bytes / 8; i++)
            n += w[i] != ((i + seed) * HOST_K & mask);
        *bad = n;
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    CUdeviceptr src = (CUdeviceptr)(uintptr_t)p;
    unsigned long long words = bytes / 8, s = seed, m = mask;
    void *args[] = {&src, &words, &s, &m, &cu.out};
    CK(cu.MemsetD32(cu.out, 0, 2), "cuMemsetD32(count)");
    CK(cu.LaunchKernel(cu.check, 2048, 1, 1, 256, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel(check64)");
    CK(cu.MemcpyDtoH(bad, cu.out, 8), "cuMemcpyDtoH(count)");
#endif
    return 0;
}

/* The device's free bytes (host backend: the host's MemAvailable), 0 if unknown. */
static uint64_t dev_free(void)
{
    if (o.host) {
        FILE *f = fopen("/proc/meminfo", "r");
        char line[256];
        unsigned long long kb = 0;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
                break;
        if (f)
            fclose(f);
        return (uint64_t)kb << 10;
    }
#if HEAPD_HAVE_CUDA_H
    size_t fr = 0, total = 0;
    if (cu.MemGetInfo(&fr, &total) == CUDA_SUCCESS)
        return fr;
#endif
    return 0;
}

/* Rank 0: n bytes of its copy at p to a pinned buffer and back, timed. */
static int anchor(void *p, uint64_t n)
{
    size_t warm = n < (64u << 20) ? (size_t)n : 64u << 20;
    if (o.host) {
        uint8_t *h = malloc(n);
        if (!h)
            return snprintf(derr, sizeof derr, "anchor: no %" PRIu64 " bytes of memory", n), -1;
        memset(h, 1, n);
        double t0 = now_ms();
        memcpy(h, p, n);
        double t1 = now_ms();
        memcpy(p, h, n);
        sh->d2h_ms = t1 - t0, sh->h2d_ms = now_ms() - t1;
        free(h);
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    void *h = NULL;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
    CK(cu.MemHostAlloc(&h, n, 0), "cuMemHostAlloc(anchor: --anchor-size bytes pinned; try a smaller one)");
    CK(cu.MemcpyDtoH(h, d, warm), "cuMemcpyDtoH(warm-up)");
    CK(cu.MemcpyHtoD(d, h, warm), "cuMemcpyHtoD(warm-up)");
    double t0 = now_ms();
    CK(cu.MemcpyDtoH(h, d, n), "cuMemcpyDtoH(anchor)");
    double t1 = now_ms();
    CK(cu.MemcpyHtoD(d, h, n), "cuMemcpyHtoD(anchor)");
    sh->d2h_ms = t1 - t0, sh->h2d_ms = now_ms() - t1;
    CK(cu.MemFreeHost(h), "cuMemFreeHost(anchor)");
#else
    (void)warm, (void)p;
#endif
    return 0;
}

/* ---- the ranks ---------------------------------------------------------------- */

static uint64_t seed_of(uint32_t rank, int k) { return ((uint64_t)rank << 48) + ((uint64_t)k << 40) + 1; }

__attribute__((format(printf, 2, 3))) static int fail(result *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
    atomic_store(&sh->abort, 1);
    return 1;
}

/* heapc_state and the status page after a release (RELEASED, nothing
 * resident) or a restore (ACTIVE, all of it). */
static int expect(heapc *c, result *r, int want, uint64_t resident, int k, const char *what)
{
    heapc_status_t s;
    int st = heapc_state(c), rc = heapc_status(c, &s);
    if (st != want)
        return fail(r, "round %s: heapc_state is %d after the %s, want %d", round_name[k], st, what, want);
    if (rc)
        return fail(r, "round %s: heapc_status after the %s: %s", round_name[k], what, heapc_errstr(c));
    if (s.state != (uint64_t)want || s.resident != resident)
        return fail(
            r, "round %s: the status page has state %" PRIu64 ", resident %" PRIu64 " after the %s, want %d, %" PRIu64,
            round_name[k], s.state, s.resident, what, want, resident);
    return 0;
}

/* heapd's host copy of the heap (heapc_heap_stats.host_copy_bytes), or UINT64_MAX. */
static uint64_t host_copy(heapc *adm)
{
    heapc_daemon_stats *s = NULL;
    uint64_t n = UINT64_MAX;
    if (adm && heapc_stats(adm, o.heap, &s) == 0 && s->nheaps == 1)
        n = s->heaps[0].host_copy_bytes;
    heapc_stats_free(s);
    return n;
}

#define SYNC(r)                                                                                                        \
    do {                                                                                                               \
        if (barrier())                                                                                                 \
            return (r)->why[0] ? 1 : fail((r), "a peer rank failed or 300 s passed at a barrier");                     \
    } while (0)

/* One round: a new pattern, release (timed), restore (timed), the content checked. */
static int one_round(heapc *c, heapc *adm, uint32_t rank, int k, result *r)
{
    uint8_t *base = heapc_base(c, rank);
    uint64_t n = heapc_mapped(c), bad = 0, seed = seed_of(rank, k);
    if (dev_fill(base, n, seed) || dev_check(base, n, seed, 0, &bad))
        return fail(r, "round %s: %s", round_name[k], derr);
    if (bad)
        return fail(r, "round %s: %" PRIu64 " words differ right after the fill (the bench's kernel?)", round_name[k],
                    bad);
    SYNC(r);
    if (rank == 0)
        sh->free_before[k] = dev_free();
    SYNC(r);
    double t0 = now_ms();
    if (heapc_release(c, round_mode[k]))
        return fail(r, "round %s: heapc_release(0x%x): %s", round_name[k], (unsigned)round_mode[k], heapc_errstr(c));
    r->rel_ms[k] = now_ms() - t0;
    if (expect(c, r, HEAPC_STATE_RELEASED, 0, k, "release"))
        return 1;
    SYNC(r);
    if (rank == 0)
        sh->free_released[k] = dev_free(), sh->copy_released[k] = host_copy(adm);
    SYNC(r);
    t0 = now_ms();
    if (heapc_restore(c))
        return fail(r, "round %s: heapc_restore: %s", round_name[k], heapc_errstr(c));
    r->res_ms[k] = now_ms() - t0;
    if (expect(c, r, HEAPC_STATE_ACTIVE, n, k, "restore"))
        return 1;
    if (dev_check(base, n, seed, k == 0, &bad))
        return fail(r, "round %s: %s", round_name[k], derr);
    if (bad)
        return fail(r, "round %s: %" PRIu64 " of %" PRIu64 " words of rank %u's copy %s after the restore",
                    round_name[k], bad, n / 8, rank, k == 0 ? "are not zero" : "differ from what was written");
    SYNC(r);
    if (rank == 0)
        sh->free_restored[k] = dev_free(), sh->copy_restored[k] = host_copy(adm);
    return 0;
}

static heapc *attach(uint32_t rank, result *r)
{
    heapc *c = heapc_connect(o.sock);
    heapc_params hp = {
        .chunk_size = o.chunk, .initial_size = o.size, .va_size = o.size, .persist_s = -1, .collect_timeout_ms = 30000};
    if (!c || heapc_err(c) || heapc_attach(c, o.heap, rank, (uint32_t)o.ranks, &hp) != 0) {
        fail(r, "attach: %s", c ? heapc_errstr(c) : "out of memory");
        heapc_free_ctx(c);
        return NULL;
    }
    return c;
}

/* Blocks over the heap, the kernel's self-test, rank 0's anchor. */
static int setup(heapc *c, uint32_t rank, result *r)
{
    for (uint64_t i = 0; i < o.size / (o.chunk / 2) - 1; i++)
        if (heapc_alloc(c, o.chunk / 2, NULL, NULL) != 0)
            return fail(r, "alloc %" PRIu64 " of %" PRIu64 " MiB: %s", i, o.chunk >> 21, heapc_errstr(c));
    uint8_t *base = heapc_base(c, rank);
    uint64_t n = r->mapped = heapc_mapped(c), bad = 0;
    if (n != o.size)
        return fail(r, "%" PRIu64 " bytes mapped per rank, want --size %" PRIu64, n, o.size);
    /* the check must see every word of a wrong pattern */
    if (dev_fill(base, n, seed_of(rank, 0)) || dev_check(base, n, seed_of(rank, 0) + 1, 0, &bad))
        return fail(r, "self-test: %s", derr);
    if (bad != n / 8)
        return fail(r, "self-test: the check counted %" PRIu64 " of %" PRIu64 " wrong words", bad, n / 8);
    if (rank == 0 && anchor(base, sh->anchor_bytes = o.anchor ? o.anchor : n))
        return fail(r, "%s", derr);
    return 0;
}

static int rank_main(uint32_t rank)
{
    result *r = &sh->r[rank];
    heapc_status_t s;
    if (dev_init(rank))
        return fail(r, "%s", derr);
    heapc *c = attach(rank, r), *adm = rank == 0 ? heapc_connect(o.sock) : NULL;
    int bad = !c || setup(c, rank, r);
    if (!bad && barrier())
        bad = fail(r, "a peer rank failed or 300 s passed at a barrier");
    for (int k = 0; k < ROUNDS && !bad; k++)
        bad = one_round(c, adm, rank, k, r);
    if (!bad && heapc_status(c, &s) == 0)
        r->releases = s.releases, r->restores = s.restores;
    if (!bad && (r->releases != ROUNDS || r->restores != ROUNDS))
        bad = fail(r, "the status page counts %" PRIu64 " releases, %" PRIu64 " restores, want %d each", r->releases,
                   r->restores, ROUNDS);
    r->ok = !bad;
    heapc_free_ctx(c);
    heapc_free_ctx(adm);
    return bad;
}

static int run_ranks(void)
{
    int bad = 0;
    for (int r = 0; r < o.ranks; r++) {
        pid_t p = fork();
        if (p == 0)
            _exit(rank_main((uint32_t)r));
        if (p < 0)
            return 1;
    }
    for (int r = 0, st; r < o.ranks; r++)
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
            bad = 1;
    return bad;
}

/* ---- the report ----------------------------------------------------------------- */

static struct {
    double rel[ROUNDS], res[ROUNDS]; /* the slowest rank's ms */
    uint64_t bytes;                  /* every rank's chunk bytes */
    double d2h, h2d;                 /* the anchor's GiB/s */
} f;

static double gib_s(uint64_t bytes, double ms) { return ms > 0 ? (double)bytes / (1u << 30) / (ms / 1e3) : 0; }
static double ratio(double a, double b) { return b > 0 ? a / b : 0; }
static double mib(uint64_t b) { return (double)b / (1u << 20); }
static double growth(int k) { return (double)sh->free_released[k] - (double)sh->free_before[k]; }

static void print_ranks(void)
{
    for (int r = 0; r < o.ranks; r++) {
        const result *x = &sh->r[r];
        printf("release rank %d ms (release/restore):", r);
        for (int k = 0; k < ROUNDS; k++)
            printf(" %s %.2f/%.2f", round_name[k], x->rel_ms[k], x->res_ms[k]);
        printf(" %s%s\n", x->ok ? "ok" : "FAIL: ", x->ok ? "" : x->why[0] ? x->why : "the rank died (no reason given)");
        f.bytes += x->mapped;
        for (int k = 0; k < ROUNDS; k++) {
            f.rel[k] = x->rel_ms[k] > f.rel[k] ? x->rel_ms[k] : f.rel[k];
            f.res[k] = x->res_ms[k] > f.res[k] ? x->res_ms[k] : f.res[k];
        }
    }
}

static void print_times(void)
{
    static const char *const what[ROUNDS][2] = {
        {"target <= 50", "the content reads zeros"},
        {"the first: heapd allocates and pins the host copy", "refilled, the host copy freed"},
        {"HEAPC_RELEASE_KEEP, the host copy allocated and pinned again", "refilled, the host copy kept"},
        {"HEAPC_RELEASE_KEEP with the kept copy: the copy only", "refilled, the host copy kept"},
    };
    printf("release_bytes_mib %.0f (%d ranks x %" PRIu64 " MiB, %" PRIu64 " MiB chunks, %s backend; times: the "
           "slowest rank)\n",
           mib(f.bytes), o.ranks, o.size >> 20, o.chunk >> 20, o.host ? "host" : "cuda");
    for (int k = 0; k < ROUNDS; k++) {
        printf("release_%s_ms %.2f (%s)\n", round_name[k], f.rel[k], what[k][0]);
        if (k)
            printf("release_%s_gib_s %.2f\n", round_name[k], gib_s(f.bytes, f.rel[k]));
        printf("restore_%s_ms %.2f (%s)\n", round_name[k], f.res[k], what[k][1]);
        if (k)
            printf("restore_%s_gib_s %.2f\n", round_name[k], gib_s(f.bytes, f.res[k]));
    }
    f.d2h = gib_s(sh->anchor_bytes, sh->d2h_ms), f.h2d = gib_s(sh->anchor_bytes, sh->h2d_ms);
    const char *how = o.host ? "a touched buffer (memcpy)" : "a cuMemHostAlloc buffer (cuMemcpyDtoH)";
    printf("d2h_gib_s %.2f (%.0f MiB of rank 0's copy to %s in %.2f ms, rank 0 alone)\n", f.d2h, mib(sh->anchor_bytes),
           how, sh->d2h_ms);
    printf("h2d_gib_s %.2f (the same back in %.2f ms)\n", f.h2d, sh->h2d_ms);
    printf("release_host_over_pinned %.2f (release_host_keep_gib_s / d2h_gib_s; target >= 0.80)\n",
           ratio(gib_s(f.bytes, f.rel[3]), f.d2h));
    printf("restore_host_over_pinned %.2f (restore_host_keep_gib_s / h2d_gib_s; target >= 0.80)\n",
           ratio(gib_s(f.bytes, f.res[3]), f.h2d));
    printf("release_host_first_over_pinned %.2f\n", ratio(gib_s(f.bytes, f.rel[1]), f.d2h));
    printf("restore_host_first_over_pinned %.2f\n", ratio(gib_s(f.bytes, f.res[1]), f.h2d));
}

static void print_free(void)
{
    const char *dev = o.host ? "the host's MemAvailable" : "cuMemGetInfo";
    printf("released_mib %.0f (every local rank's chunks)\n", mib(f.bytes));
    printf("device_free_before_release_mib %.0f (%s, discard round)\n", mib(sh->free_before[0]), dev);
    printf("device_free_after_release_mib %.0f\n", mib(sh->free_released[0]));
    printf("device_free_after_restore_mib %.0f\n", mib(sh->free_restored[0]));
    printf("device_free_growth_mib %.0f\n", growth(0) / (1u << 20));
    printf("device_free_growth_over_released %.3f (target >= 0.98 on the GPU)\n", ratio(growth(0), (double)f.bytes));
    printf("device_free_growth_host_mib %.0f (host round)\n", growth(1) / (1u << 20));
    printf("device_free_growth_host_over_released %.3f\n", ratio(growth(1), (double)f.bytes));
    for (int k = 1; k < ROUNDS; k++)
        if (sh->copy_released[k] != UINT64_MAX && sh->copy_restored[k] != UINT64_MAX)
            printf("host_copy_%s_mib released %.0f restored %.0f\n", round_name[k], mib(sh->copy_released[k]),
                   mib(sh->copy_restored[k]));
}

static void write_json(int bad)
{
    FILE *j = fopen(o.json, "w");
    if (!j) {
        fprintf(stderr, "release_bench: cannot write %s\n", o.json);
        return;
    }
    fprintf(j,
            "{\"backend\": \"%s\", \"ranks\": %d, \"size\": %" PRIu64 ", \"chunk\": %" PRIu64 ", \"bytes\": %" PRIu64,
            o.host ? "host" : "cuda", o.ranks, o.size, o.chunk, f.bytes);
    for (int k = 0; k < ROUNDS; k++)
        fprintf(j, ", \"release_%s_ms\": %.3f, \"restore_%s_ms\": %.3f", round_name[k], f.rel[k], round_name[k],
                f.res[k]);
    fprintf(j,
            ", \"anchor_bytes\": %" PRIu64 ", \"d2h_gib_s\": %.3f, \"h2d_gib_s\": %.3f"
            ", \"release_host_over_pinned\": %.3f, \"restore_host_over_pinned\": %.3f"
            ", \"device_free_before_release\": %" PRIu64 ", \"device_free_after_release\": %" PRIu64
            ", \"device_free_growth_over_released\": %.4f, \"ok\": %s}\n",
            sh->anchor_bytes, f.d2h, f.h2d, ratio(gib_s(f.bytes, f.rel[3]), f.d2h),
            ratio(gib_s(f.bytes, f.res[3]), f.h2d), sh->free_before[0], sh->free_released[0],
            ratio(growth(0), (double)f.bytes), bad ? "false" : "true");
    fclose(j);
}

static void usage(FILE *fp)
{
    fprintf(fp, "Usage: release_bench --socket S [--ranks N] [--size SIZE] [--chunk SIZE] [--anchor-size SIZE]\n"
                "                     [--host] [--heap NAME] [--json PATH]\n"
                "See the comment at the top of bench/release_bench.c.\n");
}

static int parse(int argc, char **argv)
{
    static const struct option lo[] = {
        {"socket", 1, 0, 's'},      {"ranks", 1, 0, 'n'}, {"size", 1, 0, 'z'}, {"chunk", 1, 0, 'c'},
        {"anchor-size", 1, 0, 'a'}, {"host", 0, 0, 'H'},  {"heap", 1, 0, 'h'}, {"json", 1, 0, 'j'},
        {"help", 0, 0, '?'},        {0, 0, 0, 0},
    };
    int ch, bad = 0;
    while (!bad && (ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        uint64_t *sz = ch == 'z' ? &o.size : ch == 'c' ? &o.chunk : ch == 'a' ? &o.anchor : NULL;
        if (sz)
            bad = hsz_parse_size(optarg, sz);
        else if (ch == 's' || ch == 'h' || ch == 'j')
            *(ch == 's' ? &o.sock : ch == 'h' ? &o.heap : &o.json) = optarg;
        else if (ch == 'n')
            o.ranks = atoi(optarg);
        else if (ch == 'H')
            o.host = 1;
        else
            bad = 1;
    }
    if (bad || optind < argc)
        return usage(stderr), 2;
    if (o.ranks < 1 || o.ranks > 64 || o.chunk < 4096 || o.size < 2 * o.chunk || o.size % o.chunk ||
        o.anchor > o.size || o.anchor % 8) {
        fprintf(stderr, "release_bench: want --ranks 1 to 64, --size a multiple of --chunk and at least 2 chunks, "
                        "--anchor-size a multiple of 8 and <= --size\n");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rc = parse(argc, argv);
    if (rc)
        return rc;
    if (!o.sock)
        o.sock = getenv("HEAPD_SOCKET");
    if (!o.sock) { /* make bench: no heapd of its own */
        printf("skipped: release_bench needs a heapd (--socket or $HEAPD_SOCKET); scripts/gpu.sh runs it\n");
        return 0;
    }
    size_t len = sizeof(shared) + sizeof(result) * (size_t)o.ranks;
    sh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return fprintf(stderr, "release_bench: mmap of %zu bytes failed\n", len), 1;
    memset(sh, 0, len);
    double t0 = now_ms();
    int bad = run_ranks();
    printf("release_bench: %d ranks, %.0f ms in all\n", o.ranks, now_ms() - t0);
    print_ranks();
    print_times();
    print_free();
    if (!bad)
        printf("content: zeros after the discard restore, bit-identical after every host restore (%d ranks, "
               "%" PRIu64 " MiB each)\n",
               o.ranks, o.size >> 20);
    if (o.json)
        write_json(bad);
    return bad;
}
