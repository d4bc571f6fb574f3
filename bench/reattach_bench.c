/* reattach_bench - how long a restarted job takes to get its heap back
 * (issue 29), against the time to load the same bytes from a file.
 *
 *   reattach_bench --socket S [--ranks 2] [--size 16G] [--chunk 256M]
 *                  [--file-size SIZE] [--file-dir DIR] [--host] [--heap NAME] [--json PATH]
 *
 * 1. --ranks rank processes attach heap NAME (chunk_size --chunk,
 *    initial_size = va_size = --size per rank, persist 300 s), allocate
 *    named blocks over all of it, fill every chunk with a word of its own
 *    (cuMemsetD32 on the cuda backend) and exit.
 * 2. heapd keeps the heap (detached); the bench waits for that state.
 * 3. New rank processes (their CUDA context made first, untimed: a
 *    restarted job has one) re-attach: timed per rank, connect + attach +
 *    map of every chunk (own and local peers'), then the checksum of the
 *    rank's whole copy (the sum of its 64-bit words: a kernel from embedded
 *    PTX on the GPU, a loop on the host), compared with the fill's, and the
 *    live set checked (every block, heapc_lookup of the first).
 * 4. The anchor, rank 0, in the same run: the same bytes (--file-size of
 *    them, default --size) written to a file in --file-dir (default
 *    $TMPDIR, else /tmp) and read back into the heap (read(2), then
 *    cuMemcpyHtoD through a 64 MiB buffer on the cuda backend), timed. The
 *    page cache is not dropped (not allowed here): the figure is a warm
 *    read, a lower bound of a load from disk; it says so.
 * Prints `reattach_ms_per_rank` (the slowest rank), `attach_map_ms_per_rank`,
 * `file_load_ms` and their ratio. The heap stays (heapctl drop NAME).
 * Exit 0 when every checksum and live set held, 1 otherwise, 2 usage; without
 * --socket or $HEAPD_SOCKET (make bench) it says it skipped and exits 0.
 */
#include "heapc.h"
#include "heapc_cuda.h"
#include "size.h"

#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct {
    const char *sock, *heap, *dir, *json;
    int ranks, host;
    uint64_t size, chunk, file_size;
} o = {NULL, "reattach", NULL, NULL, 2, 0, 16ull << 30, 256ull << 20, 0};

typedef struct result { /* one rank of phase 3, in shared memory */
    double attach_ms, sum_ms, file_ms;
    uint64_t file_bytes;
    int ok;
    char why[1024];
} result;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint32_t fill_word(uint64_t chunk, uint32_t rank) { return (uint32_t)(0x9e3779b9u * (chunk + 1)) ^ rank << 24; }

/* ---- the device: the cuda driver API, or host memory ------------------------ */

/* sum64(src, words, out): *out += the sum of src[0 .. words), grid-stride. */
static const char sum_ptx[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                              ".visible .entry sum64(.param .u64 p_src, .param .u64 p_words, .param .u64 p_out)\n"
                              "{\n"
                              "    .reg .pred %p<2>;\n    .reg .b32 %r<5>;\n    .reg .b64 %rd<12>;\n"
                              "    ld.param.u64 %rd1, [p_src];\n    ld.param.u64 %rd2, [p_words];\n"
                              "    ld.param.u64 %rd3, [p_out];\n"
                              "    mov.u32 %r1, %tid.x;\n    mov.u32 %r2, %ctaid.x;\n"
                              "    mov.u32 %r3, %ntid.x;\n    mov.u32 %r4, %nctaid.x;\n"
                              "    mul.wide.u32 %rd4, %r2, %r3;\n    cvt.u64.u32 %rd5, %r1;\n"
                              "    add.u64 %rd4, %rd4, %rd5;\n    mul.wide.u32 %rd6, %r3, %r4;\n"
                              "    mov.u64 %rd7, 0;\n"
                              "LOOP:\n"
                              "    setp.ge.u64 %p1, %rd4, %rd2;\n    @%p1 bra DONE;\n"
                              "    shl.b64 %rd8, %rd4, 3;\n    add.u64 %rd9, %rd1, %rd8;\n"
                              "    ld.global.u64 %rd10, [%rd9];\n    add.u64 %rd7, %rd7, %rd10;\n"
                              "    add.u64 %rd4, %rd4, %rd6;\n    bra LOOP;\n"
                              "DONE:\n"
                              "    atom.global.add.u64 %rd11, [%rd3], %rd7;\n    ret;\n"
                              "}\n";

static char derr[400];
#if HEAPD_HAVE_CUDA_H
static struct {
    const hc_cuda *cu;
    CUfunction fn;
    CUdeviceptr out;
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
} cu;
#define CK(call, what)                                                                                                 \
    do {                                                                                                               \
        CUresult rc_ = (call);                                                                                         \
        if (rc_ != CUDA_SUCCESS) {                                                                                     \
            hc_cuda_fail(derr, sizeof derr, rc_, NULL, "%s", what);                                                    \
            return -1;                                                                                                 \
        }                                                                                                              \
    } while (0)
#endif

static int dev_init(uint32_t rank)
{
    if (o.host)
        return 0;
#if HEAPD_HAVE_CUDA_H
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
    };
    const char *missing;
    if (!lib || cd_resolve(lib, syms, sizeof syms / sizeof syms[0], &missing)) {
        snprintf(derr, sizeof derr, "libcuda.so.1 lacks an entry point the bench needs");
        return -1;
    }
    int n = 0;
    CUdevice d;
    CUcontext ctx;
    CUmodule mod;
    CK(cu.cu->DeviceGetCount(&n), "cuDeviceGetCount");
    CK(cu.cu->DeviceGet(&d, n > 0 ? (int)(rank % (uint32_t)n) : 0), "cuDeviceGet");
    CK(cu.cu->DevicePrimaryCtxRetain(&ctx, d), "cuDevicePrimaryCtxRetain");
    CK(cu.cu->CtxSetCurrent(ctx), "cuCtxSetCurrent");
    CK(cu.ModuleLoadData(&mod, sum_ptx), "cuModuleLoadData(sum64 PTX)");
    CK(cu.ModuleGetFunction(&cu.fn, mod, "sum64"), "cuModuleGetFunction(sum64)");
    CK(cu.MemAlloc(&cu.out, 8), "cuMemAlloc(8)");
    /* a launch over nothing: module loading is lazy, the timed one must not pay it */
    CUdeviceptr none = 0;
    unsigned long long zero = 0;
    void *args[] = {&none, &zero, &cu.out};
    CK(cu.LaunchKernel(cu.fn, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel(sum64, warm-up)");
    CK(cu.cu->CtxSynchronize(), "cuCtxSynchronize");
    return 0;
#else
    (void)rank;
    snprintf(derr, sizeof derr, "built without cuda.h: only --host runs");
    return -1;
#endif
}

static int dev_fill(void *p, uint64_t bytes, uint32_t word)
{
    if (o.host) {
        uint32_t *w = p;
        for (uint64_t i = 0; i < bytes / 4; i++)
            w[i] = word;
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    CK(cu.MemsetD32((CUdeviceptr)(uintptr_t)p, word, bytes / 4), "cuMemsetD32");
    CK(cu.cu->CtxSynchronize(), "cuCtxSynchronize");
#endif
    return 0;
}

static int dev_sum(const void *p, uint64_t bytes, uint64_t *sum)
{
    if (o.host) {
        const uint64_t *w = p;
        uint64_t s = 0;
        for (uint64_t i = 0; i < bytes / 8; i++)
            s += w[i];
        *sum = s;
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    CUdeviceptr src = (CUdeviceptr)(uintptr_t)p;
    unsigned long long words = bytes / 8;
    void *args[] = {&src, &words, &cu.out};
    CK(cu.MemsetD32(cu.out, 0, 2), "cuMemsetD32(sum)");
    CK(cu.LaunchKernel(cu.fn, 2048, 1, 1, 256, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel(sum64)");
    CK(cu.MemcpyDtoH(sum, cu.out, 8), "cuMemcpyDtoH(sum)");
#endif
    return 0;
}

/* Copies n bytes between the heap at p and host memory h (to_heap: h -> p). */
static int dev_copy(void *p, void *h, size_t n, int to_heap)
{
    if (o.host) {
        memcpy(to_heap ? p : h, to_heap ? h : p, n);
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    if (to_heap)
        CK(cu.MemcpyHtoD((CUdeviceptr)(uintptr_t)p, h, n), "cuMemcpyHtoD");
    else
        CK(cu.MemcpyDtoH(h, (CUdeviceptr)(uintptr_t)p, n), "cuMemcpyDtoH");
#endif
    return 0;
}

/* ---- the ranks ---------------------------------------------------------------- */

static heapc *attach(uint32_t rank, char *why, size_t len)
{
    heapc *c = heapc_connect(o.sock);
    heapc_params hp = {.chunk_size = o.chunk,
                       .initial_size = o.size,
                       .va_size = o.size,
                       .persist_s = 300,
                       .collect_timeout_ms = 60000};
    if (!c || heapc_err(c) || heapc_attach(c, o.heap, rank, (uint32_t)o.ranks, &hp) != 0) {
        snprintf(why, len, "attach: %s", c ? heapc_errstr(c) : "out of memory");
        heapc_free_ctx(c);
        return NULL;
    }
    return c;
}

static uint64_t expected_sum(uint64_t mapped, uint32_t rank)
{
    uint64_t s = 0;
    for (uint64_t i = 0; i < mapped / o.chunk; i++) {
        uint64_t w = fill_word(i, rank);
        s += (o.chunk / 8) * (w << 32 | w);
    }
    return s;
}

static uint64_t nblocks(void) { return o.size / (o.chunk / 2) - 1; }

/* Phase 1: allocate the heap's blocks, fill every chunk, exit. */
static int first_rank(uint32_t rank)
{
    char why[512], name[32];
    if (dev_init(rank))
        return fprintf(stderr, "rank %u: %s\n", rank, derr), 1;
    heapc *c = attach(rank, why, sizeof why);
    if (!c)
        return fprintf(stderr, "rank %u: %s\n", rank, why), 1;
    for (uint64_t i = 0; i < nblocks(); i++) {
        snprintf(name, sizeof name, "w%" PRIu64, i);
        if (heapc_alloc_named(c, o.chunk / 2, name, NULL, NULL) != 0)
            return fprintf(stderr, "rank %u: alloc %s: %s\n", rank, name, heapc_errstr(c)), 1;
    }
    uint8_t *base = heapc_base(c, rank);
    for (uint64_t i = 0; i < heapc_mapped(c) / o.chunk; i++)
        if (dev_fill(base + i * o.chunk, o.chunk, fill_word(i, rank)))
            return fprintf(stderr, "rank %u: %s\n", rank, derr), 1;
    heapc_free_ctx(c); /* the process ends: heapd keeps the heap */
    return 0;
}

/* rank 0: the same bytes through a file: written, then read back, timed. */
static void file_anchor(heapc *c, result *r)
{
    char path[4200];
    uint64_t n = o.file_size ? o.file_size : o.size, done = 0;
    size_t bufsz = 64u << 20;
    uint8_t *base = heapc_base(c, 0), *buf = malloc(bufsz);
    const char *dir = o.dir ? o.dir : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/reattach_bench.%d", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || !buf)
        goto fail;
    for (done = 0; done < n; done += bufsz) {
        size_t k = n - done < bufsz ? (size_t)(n - done) : bufsz;
        if (dev_copy(base + done, buf, k, 0) || write(fd, buf, k) != (ssize_t)k)
            goto fail;
    }
    double t0 = now_ms();
    for (done = 0; done < n;) {
        size_t k = n - done < bufsz ? (size_t)(n - done) : bufsz;
        ssize_t got = pread(fd, o.host ? base + done : buf, k, (off_t)done);
        if (got <= 0 || (!o.host && dev_copy(base + done, buf, (size_t)got, 1)))
            goto fail;
        done += (uint64_t)got;
    }
    r->file_ms = now_ms() - t0;
    r->file_bytes = n;
fail:
    if (!r->file_bytes)
        snprintf(r->why, sizeof r->why, "file anchor failed at %" PRIu64 " bytes of %.300s: %.400s", done, path,
                 derr[0] ? derr : "I/O error");
    if (fd >= 0)
        close(fd), unlink(path);
    free(buf);
}

/* Phase 3: re-attach, map, checksum (timed); the live set checked. */
static int second_rank(uint32_t rank, result *r)
{
    uint64_t sum = 0, off, size;
    if (dev_init(rank))
        return snprintf(r->why, sizeof r->why, "%s", derr), 1;
    double t0 = now_ms();
    heapc *c = attach(rank, r->why, sizeof r->why);
    if (!c)
        return 1;
    double t1 = now_ms();
    uint64_t mapped = heapc_mapped(c);
    if (dev_sum(heapc_base(c, rank), mapped, &sum))
        return snprintf(r->why, sizeof r->why, "%s", derr), 1;
    double t2 = now_ms();
    r->attach_ms = t1 - t0, r->sum_ms = t2 - t1;
    size_t live = heapc_live(c, NULL, 0);
    if (sum != expected_sum(mapped, rank))
        snprintf(r->why, sizeof r->why, "checksum %016" PRIx64 ", filled %016" PRIx64, sum, expected_sum(mapped, rank));
    else if (!heapc_resumed(c) || live != nblocks() || heapc_lookup(c, "w0", &off, &size) || size != o.chunk / 2)
        snprintf(r->why, sizeof r->why, "resumed %d, live set of %zu blocks (want %" PRIu64 ")", heapc_resumed(c), live,
                 nblocks());
    else
        r->ok = 1;
    if (rank == 0)
        file_anchor(c, r);
    heapc_free_ctx(c);
    return r->ok ? 0 : 1;
}

static int detached(void)
{
    heapc *c = heapc_connect(o.sock);
    heapc_daemon_stats *s = NULL;
    int yes = 0;
    if (c && !heapc_err(c) && heapc_stats(c, o.heap, &s) == 0 && s->nheaps == 1)
        yes = s->heaps[0].clients == 0;
    heapc_stats_free(s);
    heapc_free_ctx(c);
    return yes;
}

static int run_ranks(int phase, result *res)
{
    int bad = 0;
    for (int r = 0; r < o.ranks; r++) {
        pid_t p = fork();
        if (p == 0)
            _exit(phase == 1 ? first_rank((uint32_t)r) : second_rank((uint32_t)r, &res[r]));
        if (p < 0)
            return 1;
    }
    for (int r = 0, st; r < o.ranks; r++)
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
            bad = 1;
    return bad;
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: reattach_bench --socket S [--ranks N] [--size SIZE] [--chunk SIZE] [--file-size SIZE]\n"
               "                      [--file-dir DIR] [--host] [--heap NAME] [--json PATH]\n"
               "See the comment at the top of bench/reattach_bench.c.\n");
}

static void report(const result *res)
{
    double worst = 0, worst_map = 0;
    for (int r = 0; r < o.ranks; r++) {
        double t = res[r].attach_ms + res[r].sum_ms;
        printf("reattach rank %d attach_map_ms %.2f checksum_ms %.2f total_ms %.2f %s%s\n", r, res[r].attach_ms,
               res[r].sum_ms, t, res[r].ok ? "ok" : "FAIL: ", res[r].ok ? "" : res[r].why);
        worst = t > worst ? t : worst;
        worst_map = res[r].attach_ms > worst_map ? res[r].attach_ms : worst_map;
    }
    double f = res[0].file_ms, scale = res[0].file_bytes ? (double)o.size / (double)res[0].file_bytes : 0;
    printf("reattach_ms_per_rank %.2f (connect + attach + map of every chunk + checksum of %" PRIu64
           " MiB per rank, %" PRIu64 " MiB chunks, slowest of %d ranks, %s)\n",
           worst, o.size >> 20, o.chunk >> 20, o.ranks, o.host ? "host" : "cuda");
    printf("attach_map_ms_per_rank %.2f\n", worst_map);
    if (res[0].file_bytes) {
        printf("file_load_ms %.2f (%" PRIu64 " MiB read back from a local file into the heap; warm page cache: "
               "a lower bound of a load from disk)\n",
               f * scale, o.size >> 20);
        if (scale != 1)
            printf("file_load_ms_measured %.2f for %" PRIu64 " MiB (scaled by %.1f)\n", f, res[0].file_bytes >> 20,
                   scale);
        printf("file_load_over_reattach %.1f\n", worst > 0 ? f * scale / worst : 0);
    } else {
        printf("file_load_ms none: %s\n", res[0].why);
    }
    if (o.json) {
        FILE *j = fopen(o.json, "w");
        if (j) {
            fprintf(j,
                    "{\"backend\": \"%s\", \"ranks\": %d, \"size\": %" PRIu64 ", \"chunk\": %" PRIu64
                    ", \"reattach_ms_per_rank\": %.3f, \"attach_map_ms_per_rank\": %.3f, \"file_load_ms\": %.3f, "
                    "\"file_bytes\": %" PRIu64 ", \"file_warm\": true}\n",
                    o.host ? "host" : "cuda", o.ranks, o.size, o.chunk, worst, worst_map, f * scale, res[0].file_bytes);
            fclose(j);
        }
    }
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"socket", 1, 0, 's'},    {"ranks", 1, 0, 'n'},    {"size", 1, 0, 'z'}, {"chunk", 1, 0, 'c'},
        {"file-size", 1, 0, 'f'}, {"file-dir", 1, 0, 'd'}, {"host", 0, 0, 'H'}, {"heap", 1, 0, 'h'},
        {"json", 1, 0, 'j'},      {"help", 0, 0, '?'},     {0, 0, 0, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        int bad = 0;
        switch (ch) {
        case 's':
            o.sock = optarg;
            break;
        case 'n':
            o.ranks = atoi(optarg);
            break;
        case 'z':
            bad = hsz_parse_size(optarg, &o.size);
            break;
        case 'c':
            bad = hsz_parse_size(optarg, &o.chunk);
            break;
        case 'f':
            bad = hsz_parse_size(optarg, &o.file_size);
            break;
        case 'd':
            o.dir = optarg;
            break;
        case 'H':
            o.host = 1;
            break;
        case 'h':
            o.heap = optarg;
            break;
        case 'j':
            o.json = optarg;
            break;
        default:
            usage(stderr);
            return 2;
        }
        if (bad) {
            usage(stderr);
            return 2;
        }
    }
    if (o.ranks < 1 || o.chunk < 4096 || o.size < 2 * o.chunk || o.size % o.chunk || o.file_size > o.size) {
        fprintf(stderr, "reattach_bench: want --ranks >= 1, --size a multiple of --chunk and at least 2 chunks, "
                        "--file-size <= --size\n");
        return 2;
    }
    if (!o.sock && !getenv("HEAPD_SOCKET")) { /* make bench: no heapd of its own */
        printf("skipped: reattach_bench needs a heapd (--socket or $HEAPD_SOCKET); scripts/gpu.sh runs it\n");
        return 0;
    }
    result *res =
        mmap(NULL, sizeof(result) * (size_t)o.ranks, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return 1;
    memset(res, 0, sizeof(result) * (size_t)o.ranks);
    double t0 = now_ms();
    if (run_ranks(1, res)) {
        fprintf(stderr, "reattach_bench: the first ranks failed\n");
        return 1;
    }
    printf("reattach filled %" PRIu64 " MiB per rank in %.0f ms\n", o.size >> 20, now_ms() - t0);
    for (int i = 0; i < 1000 && !detached(); i++)
        usleep(10000);
    if (!detached()) {
        fprintf(stderr, "reattach_bench: heap %s is not detached 10 s after its ranks exited\n", o.heap);
        return 1;
    }
    int bad = run_ranks(2, res);
    report(res);
    return bad;
}
