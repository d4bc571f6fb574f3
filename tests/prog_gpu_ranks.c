/* prog_gpu_ranks - N rank processes on one GPU against a running heapd
 * (cuda backend): the GPU test of issue 4. Run by scripts/gpu.sh.
 *
 *   prog_gpu_ranks --socket PATH [--ranks N] [--chunk SIZE] [--heap NAME]
 *                  [--nalloc M] [--no-hook] [--host] [--while-attached CMD]
 *
 * The parent forks N ranks before anything touches CUDA; each rank makes
 * GPU 0's primary context current, connects, attaches to one heap (device
 * named by UUID), and then, every step checked:
 *   1. allocates a block; rank r fills slot r of every rank q's copy (peer
 *      pointer, cuMemsetD32) with a pattern naming r and q; collect (barrier;
 *      the device-sync hook runs cuCtxSynchronize first); each rank reads its
 *      own copy (cuMemcpyDtoH) and checks every rank's slot;
 *   2. times M small allocations that neither grow nor collect (alloc round
 *      trip), frees them, collects;
 *   3. allocates a chunk-sized block, which grows the heap by one chunk; every
 *      rank makes this allocation at once, because a growth is collective
 *      (step 2's collect just ran, so the coalesce policy asks for no other:
 *      alloc.h, issue 18), then heapd creates, zeroes and exports one chunk
 *      per rank and every client imports and maps all of them (timed per
 *      rank: the slowest and the median); the block ends in the new chunk
 *      (it may begin in chunk 0's free tail: the heap is one extent);
 *      repeats step 1's write/check over the whole block;
 *   4. allocates K blocks, frees them in a per-rank order (ascending,
 *      descending, shuffled), collects, re-allocates K blocks of other sizes;
 *      every offset goes to the parent, which checks them identical on every
 *      rank;
 *   5. tells the parent it is done and waits (still attached) while the
 *      parent runs --while-attached CMD (e.g. heapctl stats), then detaches.
 * --host runs the same steps on a host-backend heapd with CPU stores and
 * memcpy (for CPU machines). --no-hook installs no hook: libheapc's default,
 * which since issue 18 does not sync the device at a collect (the rank syncs
 * its own peer writes before using the collect as a barrier).
 *
 * Output: per-rank 'rank R: ...: ok' lines, then the parent's summary, then
 * 't NAME VALUE_US' timing lines. Exit 0 when every check passed; 1 on a
 * failure; 2 usage; 77 when CUDA is not available ("skipped: no GPU").
 */
#include "cuda_dl.h"
#include "heapc.h"
#include "heapc_cuda.h"
#include "heapc_map.h"
#include "size.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define X_SKIP    77
#define MAX_RANKS 64
#define NFREE     24

static struct {
    const char *sock;
    const char *heap;
    const char *while_cmd;
    int ranks;
    uint64_t chunk;
    int nalloc;
    int host;
    int no_hook;
    int timeout_s;
} o = {NULL, "gpu-ranks", NULL, 2, 64ull << 20, 2000, 0, 0, 240};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_dbl);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* ---- the device: CUDA through libheapc's dlopen'ed table, or host --------- */

typedef struct dev {
    int host;
    int hook_calls;
    char err[400];
#if HEAPD_HAVE_CUDA_H
    const hc_cuda *cu;
    CUcontext ctx;
    CUdevice device;
    CUresult (*MemsetD32)(CUdeviceptr, unsigned int, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
#endif
} dev;

static int dev_open(dev *d)
{
    memset(d, 0, sizeof *d);
    d->host = o.host;
    if (d->host)
        return 0;
#if HEAPD_HAVE_CUDA_H
    d->cu = hc_cuda_get(d->err, sizeof d->err);
    if (!d->cu)
        return X_SKIP;
    /* Entry points libheapc's table does not load, through the one loader. */
    void *lib = cd_open(d->err, sizeof d->err);
    if (!lib)
        return 1;
    const cd_sym syms[] = {
        {(void **)&d->MemsetD32, "cuMemsetD32_v2", NULL},
        {(void **)&d->MemcpyDtoH, "cuMemcpyDtoH_v2", NULL},
    };
    const char *missing;
    if (cd_resolve(lib, syms, sizeof syms / sizeof syms[0], &missing)) {
        snprintf(d->err, sizeof d->err, "libcuda.so.1 lacks %s: the driver is too old; update it", missing);
        return 1;
    }
    CUresult rc = d->cu->DeviceGet(&d->device, 0);
    if (rc == CUDA_SUCCESS)
        rc = d->cu->DevicePrimaryCtxRetain(&d->ctx, d->device);
    if (rc == CUDA_SUCCESS)
        rc = d->cu->CtxSetCurrent(d->ctx);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "making GPU 0's primary context current");
        return rc == CUDA_ERROR_NO_DEVICE ? X_SKIP : 1;
    }
    return 0;
#else
    snprintf(d->err, sizeof d->err, "built without cuda.h (HEAPD_HAVE_CUDA_H unset)");
    return X_SKIP;
#endif
}

static void dev_close(dev *d)
{
#if HEAPD_HAVE_CUDA_H
    if (!d->host && d->ctx) {
        d->cu->CtxSetCurrent(NULL);
        d->cu->DevicePrimaryCtxRelease(d->device);
    }
#endif
    (void)d;
}

static int dev_fill32(dev *d, void *p, uint32_t v, size_t words)
{
    if (d->host) {
        uint32_t *w = p;
        for (size_t i = 0; i < words; i++)
            w[i] = v;
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    CUresult rc = d->MemsetD32((CUdeviceptr)(uintptr_t)p, v, words);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuMemsetD32(%p, %zu words)", p, words);
        return -1;
    }
#endif
    return 0;
}

static int dev_read(dev *d, void *dst, const void *src, size_t n)
{
    if (d->host) {
        memcpy(dst, src, n);
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    CUresult rc = d->MemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, n);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuMemcpyDtoH(%p, %zu bytes)", src, n);
        return -1;
    }
#endif
    return 0;
}

/* The device-sync hook: cuCtxSynchronize (host: nothing). */
static int sync_hook(void *arg)
{
    dev *d = arg;
    d->hook_calls++;
#if HEAPD_HAVE_CUDA_H
    if (!d->host) {
        CUresult rc = d->cu->CtxSynchronize();
        if (rc != CUDA_SUCCESS) {
            hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuCtxSynchronize");
            return 1;
        }
    }
#endif
    return 0;
}

/* ---- one rank ------------------------------------------------------------- */

static int R = -1; /* this rank, in the child */
static int report_fd = -1;

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = sizeof buf - 1;
    ssize_t w = write(report_fd, buf, (size_t)n);
    (void)w;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("rank %d: ", R);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        printf("rank %d: FAIL ", R);                                                                                   \
        printf(__VA_ARGS__);                                                                                           \
        printf("\n");                                                                                                  \
        fflush(stdout);                                                                                                \
        report("E\n");                                                                                                 \
        return 1;                                                                                                      \
    } while (0)

#define HC(call)                                                                                                       \
    do {                                                                                                               \
        if ((call) != HEAPC_OK)                                                                                        \
            FAIL("%s: %s: %s", #call, heapc_errname(heapc_err(c)), heapc_errstr(c));                                   \
    } while (0)

static uint32_t pattern(int writer, int owner, int phase)
{
    return 0x80000000u | ((uint32_t)phase << 24) | ((uint32_t)writer << 12) | (uint32_t)owner;
}

/* Rank R fills slot R of every rank's copy of the block at off with
 * pattern(R, q, phase); collect; checks its own copy. slot: bytes per rank. */
static int peer_write_check(heapc *c, dev *d, uint64_t off, uint64_t slot, int phase, uint32_t *host)
{
    int n = o.ranks;
    for (int q = 0; q < n; q++) {
        char *p = heapc_peer_ptr(c, (uint32_t)q, off);
        if (!p)
            FAIL("heapc_peer_ptr(rank %d, offset %" PRIu64 ") is NULL (mapped %" PRIu64 ")", q, off, heapc_mapped(c));
        if (dev_fill32(d, p + (uint64_t)R * slot, pattern(R, q, phase), slot / 4))
            FAIL("writing rank %d's copy: %s", q, d->err);
    }
    int hooks = d->hook_calls;
    /* Without the hook the collect no longer syncs the device (issue 18):
     * a rank that uses it as a barrier for its own writes syncs them first. */
    if (o.no_hook && sync_hook(d))
        FAIL("syncing the writes before the barrier: %s", d->err);
    HC(heapc_collect(c));
    if (!o.no_hook && d->hook_calls == hooks)
        FAIL("heapc_collect did not call the device-sync hook");
    if (dev_read(d, host, heapc_ptr(c, off), slot * (uint64_t)n))
        FAIL("reading own copy: %s", d->err);
    size_t words = slot / 4;
    for (int w = 0; w < n; w++) {
        uint32_t want = pattern(w, R, phase);
        for (size_t i = 0; i < words; i++)
            if (host[(size_t)w * words + i] != want)
                FAIL("phase %d: own copy at offset %" PRIu64 " + %zu holds 0x%08x, want 0x%08x "
                     "(written by rank %d through its peer pointer)",
                     phase, off, (size_t)w * slot + i * 4, host[(size_t)w * words + i], want, w);
    }
    return 0;
}

static int rank_main(int go_r)
{
    dev d;
    int rc = dev_open(&d);
    if (rc) {
        printf("rank %d: %s%s\n", R, rc == X_SKIP ? "skipped: no GPU: " : "FAIL ", d.err);
        fflush(stdout);
        report("E\n");
        return rc;
    }
    heapc *c = heapc_connect(o.sock);
    if (!c)
        FAIL("heapc_connect: out of memory");
    HC(heapc_err(c));
    const char *want_be = o.host ? "host" : "cuda";
    if (strcmp(heapc_backend(c), want_be) != 0)
        FAIL("heapd at %s runs the %s backend; this test needs %s", o.sock, heapc_backend(c), want_be);
    heapc_set_timeout(c, (o.timeout_s + 10) * 1000);

    char uuid[64] = "", err[320];
    if (!o.host && hm_cuda_device_uuid(0, uuid, sizeof uuid, err, sizeof err) != HM_OK)
        FAIL("hm_cuda_device_uuid(0): %s", err);
    heapc_params p = {0};
    p.chunk_size = o.chunk;
    p.va_size = 16 * o.chunk;
    p.collect_timeout_ms = (uint32_t)o.timeout_s * 1000;
    p.device_uuid = uuid;
    /* step 4 checks what a collect reclaims, and the device sync it runs */
    p.reclaim = HEAPC_RECLAIM_COLLECT;
    double t0 = now_us();
    HC(heapc_attach(c, o.heap, (uint32_t)R, (uint32_t)o.ranks, &p));
    double t_attach = now_us() - t0;
    if (!o.no_hook)
        HC(heapc_set_device_sync(c, sync_hook, &d));
    size_t nl = heapc_local_ranks(c, NULL, 0);
    if (nl != (size_t)o.ranks)
        FAIL("heapd serves %zu local ranks, want %d", nl, o.ranks);
    uint64_t m0 = heapc_mapped(c);
    if (m0 < o.chunk)
        FAIL("mapped %" PRIu64 " after attach, want at least one chunk (%" PRIu64 ")", m0, o.chunk);
    say("attached to heap %s (%s backend, GPU %s), %d local ranks, mapped %" PRIu64 " MiB", o.heap, heapc_backend(c),
        o.host ? "-" : uuid, o.ranks, m0 >> 20);
    report("T attach %.1f\n", t_attach);

    uint32_t *host = malloc(o.chunk);
    if (!host)
        FAIL("out of host memory");

    /* 1. peer writes in chunk 0 */
    uint64_t slot1 = 64 << 10, off1;
    HC(heapc_alloc(c, slot1 * (uint64_t)o.ranks, NULL, &off1));
    if (off1 + slot1 * (uint64_t)o.ranks > m0)
        FAIL("first block at %" PRIu64 " is beyond the first chunk", off1);
    if (peer_write_check(c, &d, off1, slot1, 1, host))
        return 1;
    say("chunk 0: block at offset %" PRIu64 ": read the patterns all %d ranks wrote through "
        "peer pointers: ok",
        off1, o.ranks);

    /* 2. alloc round trip: small allocations that neither grow nor collect */
    heapc_counters k0, k1;
    HC(heapc_get_counters(c, &k0));
    int m = o.nalloc;
    uint64_t *offs = malloc(sizeof *offs * (size_t)m);
    double *lat = malloc(sizeof *lat * (size_t)m);
    if (!offs || !lat)
        FAIL("out of host memory");
    for (int i = 0; i < m; i++) {
        double a = now_us();
        HC(heapc_alloc(c, 4096, NULL, &offs[i]));
        lat[i] = now_us() - a;
    }
    HC(heapc_get_counters(c, &k1));
    if (heapc_mapped(c) != m0 || k1.collects_needed != k0.collects_needed)
        FAIL("the %d small allocations grew the heap or collected", m);
    double med = pct(lat, (size_t)m, 0.5), p99 = pct(lat, (size_t)m, 0.99);
    say("%d allocations of 4 KiB (no growth, no collect): median %.1f us, p99 %.1f us", m, med, p99);
    report("T alloc_med %.1f\nT alloc_p99 %.1f\n", med, p99);
    for (int i = 0; i < m; i++)
        HC(heapc_free(c, offs[i]));
    HC(heapc_collect(c)); /* reclaims them */

    /* 3. growth by one chunk, every rank at once: no rank may wait for another
     * to finish an allocation that may be collective (the collect before a
     * growth needs every rank). */
    HC(heapc_get_counters(c, &k0));
    uint64_t off2;
    t0 = now_us();
    HC(heapc_alloc(c, o.chunk, NULL, &off2));
    double t_grow = now_us() - t0;
    HC(heapc_get_counters(c, &k1));
    uint64_t m1 = heapc_mapped(c);
    if (m1 != m0 + o.chunk)
        FAIL("mapped %" PRIu64 " after the growing allocation, want %" PRIu64, m1, m0 + o.chunk);
    /* The heap is one extent: the block may begin in chunk 0's free tail and
     * run on into the new chunk (the mappings are contiguous on every rank). */
    if (off2 + o.chunk <= m0 || off2 + o.chunk > m1)
        FAIL("the chunk-sized block [%" PRIu64 ", %" PRIu64 ") does not end in the new chunk [%" PRIu64 ", %" PRIu64
             ")",
             off2, off2 + o.chunk, m0, m1);
    if (k1.chunks_mapped - k0.chunks_mapped != (uint64_t)o.ranks)
        FAIL("the growth mapped %" PRIu64 " chunks in this client, want %d (one per rank)",
             k1.chunks_mapped - k0.chunks_mapped, o.ranks);
    /* The coalesce policy's rule (alloc.h, issue 18): every collect answers,
     * the ones the caller runs on its own included; this growth comes right
     * after step 2's heapc_collect, so it needs none. */
    if (k1.collects_needed - k0.collects_needed != 0)
        FAIL("the growing allocation needed %" PRIu64 " collects, want 0 (a collect just ran: "
             "the coalesce policy grows at once)",
             k1.collects_needed - k0.collects_needed);
    say("growth: chunk-sized block at offset %" PRIu64 " (ends in new chunk 1), mapped %" PRIu64
        " MiB, %d chunks mapped, no collect (one just ran), in %.0f us",
        off2, m1 >> 20, o.ranks, t_grow);
    report("T grow %.1f\n", t_grow);
    uint64_t slot2 = (o.chunk / (uint64_t)o.ranks) & ~(uint64_t)3;
    if (peer_write_check(c, &d, off2, slot2, 2, host))
        return 1;
    say("chunks 0-1: block at offset %" PRIu64 ": read the patterns all %d ranks wrote through "
        "peer pointers (%" PRIu64 " KiB each): ok",
        off2, o.ranks, slot2 >> 10);

    /* 4. frees in per-rank orders, collect, re-allocation: offsets to the parent */
    uint64_t a[NFREE], b[NFREE];
    int ord[NFREE];
    for (int i = 0; i < NFREE; i++) {
        HC(heapc_alloc(c, (uint64_t)4096 << (i % 5), NULL, &a[i]));
        report("O a%d %" PRIu64 "\n", i, a[i]);
        ord[i] = R == 1 ? NFREE - 1 - i : i;
    }
    if (R >= 2) { /* shuffled, seeded by the rank */
        uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(R + 1);
        for (int i = NFREE - 1; i > 0; i--) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            int j = (int)(s % (uint64_t)(i + 1)), t = ord[i];
            ord[i] = ord[j], ord[j] = t;
        }
    }
    for (int i = 0; i < NFREE; i++)
        HC(heapc_free(c, a[ord[i]]));
    HC(heapc_collect(c));
    HC(heapc_get_counters(c, &k1));
    if (k1.last_reclaimed_blocks != NFREE)
        FAIL("the collect reclaimed %" PRIu64 " blocks, want %d", k1.last_reclaimed_blocks, NFREE);
    int reused = 0;
    for (int i = 0; i < NFREE; i++) {
        HC(heapc_alloc(c, (uint64_t)4096 << ((i * 3 + 2) % 5), NULL, &b[i]));
        report("O b%d %" PRIu64 "\n", i, b[i]);
        for (int j = 0; j < NFREE; j++)
            reused += b[i] == a[j];
    }
    say("freed %d blocks in %s order, collect reclaimed %" PRIu64
        ", re-allocated %d (%d at freed offsets): offsets sent to the parent",
        NFREE,
        R == 0   ? "ascending"
        : R == 1 ? "descending"
                 : "shuffled",
        k1.last_reclaimed_blocks, NFREE, reused);

    /* 5. done: wait (attached) for the parent, then detach */
    report("D\n");
    char g;
    if (read(go_r, &g, 1) != 1)
        FAIL("the parent went away");
    HC(heapc_detach(c));
    heapc_free_ctx(c);
    dev_close(&d);
    free(host);
    free(offs);
    free(lat);
    return 0;
}

/* ---- the parent ----------------------------------------------------------- */

typedef struct child {
    pid_t pid;
    int rfd, gofd;
    char *buf;
    size_t len, cap;
    int done, eof;
} child;

static child ch[MAX_RANKS];

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "prog_gpu_ranks: FAIL timeout: killing the ranks\n";
    ssize_t w = write(1, m, sizeof m - 1);
    (void)w;
    for (int i = 0; i < o.ranks; i++)
        if (ch[i].pid > 0)
            kill(ch[i].pid, SIGKILL);
    _exit(1);
}

/* Reads child i's report pipe until a "D" line (stop_at_done) or EOF. */
static void drain(child *k, int stop_at_done)
{
    for (;;) {
        if (stop_at_done && k->done)
            return;
        if (k->eof)
            return;
        if (k->cap - k->len < 1024) {
            k->cap = k->cap ? k->cap * 2 : 8192;
            k->buf = realloc(k->buf, k->cap);
            if (!k->buf) {
                perror("realloc");
                exit(1);
            }
        }
        ssize_t n = read(k->rfd, k->buf + k->len, k->cap - k->len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            k->eof = 1;
            return;
        }
        k->len += (size_t)n;
        k->buf[k->len] = '\0';
        if (strncmp(k->buf, "D\n", 2) == 0 || strstr(k->buf, "\nD\n"))
            k->done = 1;
    }
}

/* Value of "T name v" in child i's report; -1 when missing. */
static double tval(const child *k, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "T %s ", name);
    const char *s = k->buf;
    while (s && (s = strstr(s, key)) != NULL) {
        if (s == k->buf || s[-1] == '\n')
            return strtod(s + strlen(key), NULL);
        s++;
    }
    return -1;
}

/* The "O ..." lines of a report, in order, as one string. */
static char *offsets_of(const child *k)
{
    char *out = calloc(1, k->len + 1);
    if (!out || !k->buf)
        return out;
    const char *s = k->buf;
    while (*s) {
        const char *e = strchr(s, '\n');
        size_t n = e ? (size_t)(e - s + 1) : strlen(s);
        if (s[0] == 'O' && s[1] == ' ')
            strncat(out, s, n);
        s += n;
    }
    return out;
}

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: prog_gpu_ranks --socket PATH [options]\n"
            "\n"
            "N rank processes on GPU 0 against a running heapd (cuda backend): peer writes,\n"
            "growth, frees in per-rank orders and re-allocation (see the source's header).\n"
            "\n"
            "  --socket PATH          heapd's socket (default: $HEAPD_SOCKET, else the default)\n"
            "  --ranks N              rank processes (default 2, at most %d)\n"
            "  --chunk SIZE           heap chunk_size, a power of two, >= 2M on a GPU (default 64M)\n"
            "  --heap NAME            heap name (default gpu-ranks)\n"
            "  --nalloc M             small allocations timed (default 2000)\n"
            "  --no-hook              keep libheapc's default device sync (no hook)\n"
            "  --host                 host backend: CPU stores instead of cuMemset (no GPU)\n"
            "  --while-attached CMD   run CMD (sh -c) once every rank is done, still attached\n"
            "  --timeout S            give up after S seconds (default 240)\n"
            "\n"
            "Exit status: 0 ok, 1 a check failed, 2 usage, 77 no GPU (skipped).\n",
            MAX_RANKS);
}

int main(int argc, char **argv)
{
    enum { O_NOHOOK = 256, O_HOST, O_WHILE, O_TIMEOUT, O_NALLOC };
    static const struct option lo[] = {{"socket", required_argument, NULL, 's'},
                                       {"ranks", required_argument, NULL, 'n'},
                                       {"chunk", required_argument, NULL, 'c'},
                                       {"heap", required_argument, NULL, 'H'},
                                       {"nalloc", required_argument, NULL, O_NALLOC},
                                       {"no-hook", no_argument, NULL, O_NOHOOK},
                                       {"host", no_argument, NULL, O_HOST},
                                       {"while-attached", required_argument, NULL, O_WHILE},
                                       {"timeout", required_argument, NULL, O_TIMEOUT},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "s:n:c:H:h", lo, NULL)) != -1) {
        switch (opt) {
        case 's':
            o.sock = optarg;
            break;
        case 'n':
            o.ranks = atoi(optarg);
            break;
        case 'c':
            if (hsz_parse_size(optarg, &o.chunk)) {
                fprintf(stderr, "prog_gpu_ranks: bad --chunk %s\n", optarg);
                return 2;
            }
            break;
        case 'H':
            o.heap = optarg;
            break;
        case O_NALLOC:
            o.nalloc = atoi(optarg);
            break;
        case O_NOHOOK:
            o.no_hook = 1;
            break;
        case O_HOST:
            o.host = 1;
            break;
        case O_WHILE:
            o.while_cmd = optarg;
            break;
        case O_TIMEOUT:
            o.timeout_s = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc || o.ranks < 1 || o.ranks > MAX_RANKS || o.nalloc < 1 || o.timeout_s < 1 || o.chunk < 65536 ||
        (o.chunk & (o.chunk - 1))) {
        usage(stderr);
        return 2;
    }
    uint64_t small = (uint64_t)o.nalloc * 4096 + ((uint64_t)o.ranks << 17);
    if (small > o.chunk / 2) {
        fprintf(stderr,
                "prog_gpu_ranks: --nalloc %d does not fit in half a chunk of %" PRIu64
                " bytes; lower it or raise --chunk\n",
                o.nalloc, o.chunk);
        return 2;
    }
    if (!o.sock || !*o.sock)
        o.sock = getenv("HEAPD_SOCKET");

    printf("prog_gpu_ranks: %d ranks, heap %s, chunk %" PRIu64 " MiB, %s, socket %s\n", o.ranks, o.heap, o.chunk >> 20,
           o.host ? "host backend" : "cuda backend, GPU 0", o.sock ? o.sock : HEAPC_DEFAULT_SOCKET);
    fflush(stdout);

    /* No CUDA in the parent before the forks. */
    for (int i = 0; i < o.ranks; i++) {
        int rp[2], gp[2];
        if (pipe(rp) || pipe(gp)) {
            perror("pipe");
            return 1;
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            close(rp[0]);
            close(gp[1]);
            for (int j = 0; j < i; j++) {
                close(ch[j].rfd);
                close(ch[j].gofd);
            }
            R = i;
            report_fd = rp[1];
            signal(SIGPIPE, SIG_IGN);
            int rc = rank_main(gp[0]);
            fflush(stdout);
            _exit(rc);
        }
        close(rp[1]);
        close(gp[0]);
        ch[i].pid = pid;
        ch[i].rfd = rp[0];
        ch[i].gofd = gp[1];
    }
    signal(SIGALRM, on_alarm);
    signal(SIGPIPE, SIG_IGN);
    alarm((unsigned)o.timeout_s + 30);

    int all_done = 1, fails = 0;
    for (int i = 0; i < o.ranks; i++) {
        drain(&ch[i], 1);
        all_done &= ch[i].done;
    }
    int cmd_rc = 0;
    if (all_done && o.while_cmd) {
        printf("prog_gpu_ranks: every rank done and attached; running: %s\n", o.while_cmd);
        fflush(stdout);
        cmd_rc = system(o.while_cmd);
        if (cmd_rc != 0) {
            printf("prog_gpu_ranks: FAIL --while-attached command exited with status %d\n",
                   WIFEXITED(cmd_rc) ? WEXITSTATUS(cmd_rc) : cmd_rc);
            fails++;
        }
        fflush(stdout);
    }
    for (int i = 0; i < o.ranks; i++) {
        if (write(ch[i].gofd, "g", 1) != 1) { /* a rank that failed is gone: fine */
        }
        close(ch[i].gofd);
    }
    int skipped = 0;
    for (int i = 0; i < o.ranks; i++) {
        drain(&ch[i], 0);
        int st = 0;
        while (waitpid(ch[i].pid, &st, 0) < 0 && errno == EINTR)
            ;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code == X_SKIP)
            skipped++;
        else if (code != 0) {
            printf("prog_gpu_ranks: FAIL rank %d exited with status %d\n", i, code);
            fails++;
        }
    }
    alarm(0);
    if (skipped == o.ranks) {
        printf("skipped: no GPU (prog_gpu_ranks needs libcuda and a GPU; --host runs it on the "
               "host backend)\n");
        return X_SKIP;
    }
    if (skipped) {
        printf("prog_gpu_ranks: FAIL %d of %d ranks found no GPU\n", skipped, o.ranks);
        fails++;
    }

    /* Offsets: every rank's allocation sequence must have given the same offsets. */
    if (all_done) {
        char *ref = offsets_of(&ch[0]);
        int same = 1;
        size_t nlines = 0;
        for (const char *s = ref; s && *s; s++)
            nlines += *s == '\n';
        for (int i = 1; i < o.ranks; i++) {
            char *x = offsets_of(&ch[i]);
            if (!ref || !x || strcmp(ref, x) != 0) {
                printf("prog_gpu_ranks: FAIL rank %d's offsets differ from rank 0's\n", i);
                printf("  rank 0:\n%s  rank %d:\n%s", ref ? ref : "", i, x ? x : "");
                same = 0;
                fails++;
            }
            free(x);
        }
        if (same && nlines == 2 * NFREE)
            printf("prog_gpu_ranks: offsets of %d allocations before and %d after frees in "
                   "per-rank orders and a collect: identical on all %d ranks: ok\n",
                   NFREE, NFREE, o.ranks);
        else if (same) {
            printf("prog_gpu_ranks: FAIL %zu offset lines, want %d\n", nlines, 2 * NFREE);
            fails++;
        }
        free(ref);
    }

    /* Timings. */
    if (all_done) {
        double grow[MAX_RANKS];
        for (int i = 0; i < o.ranks; i++)
            grow[i] = tval(&ch[i], "grow");
        printf("t attach_us %.1f\n", tval(&ch[0], "attach"));
        printf("t alloc_rtt_median_us %.1f\n", tval(&ch[0], "alloc_med"));
        printf("t alloc_rtt_p99_us %.1f\n", tval(&ch[0], "alloc_p99"));
        printf("t growth_slowest_rank_us %.1f\n", pct(grow, (size_t)o.ranks, 1.0));
        printf("t growth_median_rank_us %.1f\n", pct(grow, (size_t)o.ranks, 0.5));
    }
    printf("prog_gpu_ranks: %d ranks: %s\n", o.ranks, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
