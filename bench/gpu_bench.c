/* gpu_bench - GPU memory: cudaMalloc, CUDA VMM, and heapd's cuda backend.
 *
 *   gpu_bench [--json FILE] [--quick] [--socket PATH | --heapd PATH]
 *             [--sizes LIST] [--backend cuda|host] [--require-gpu]
 *
 * For each size (default 4K,2M,64M,256M,1G), medians of:
 *   cudaMalloc / cudaFree   libcudart loaded with dlopen (libcudart.so.13,
 *                           .12, libcudart.so; also $CUDA_HOME/lib64,
 *                           /usr/local/cuda-VERSION/lib64)
 *   VMM create+map          cuMemCreate (pinned, POSIX-fd handle type, size
 *                           rounded up to the granularity) + cuMemAddressReserve
 *                           + cuMemMap + cuMemSetAccess; the matching
 *                           cuMemUnmap + cuMemAddressFree + cuMemRelease timed
 *                           separately; cuMemExportToShareableHandle timed on
 *                           its own, right after cuMemCreate (heapd's order,
 *                           once per chunk) and again once the handle is mapped
 *   heapd alloc             a 1-rank heap whose chunk is the size rounded up
 *                           to 2 MiB (the granularity), pre-grown so that the
 *                           allocations of that size do not grow: the round
 *                           trip to heapd
 *   heapd growth            an allocation that grows that heap by one chunk
 *                           (at 4 KiB: a 2 MiB allocation in a 2 MiB-chunk
 *                           heap): heapd creates, zeroes and exports the chunk,
 *                           the client imports, maps and enables it. Under
 *                           reclaim collect the policy asks for one collect
 *                           before every growth (alloc.h), so the figure
 *                           includes that collect (one rank: a round trip);
 *                           under eager (the default) nothing is pending and
 *                           it grows at once. Issue 27: the heap keeps one
 *                           spare chunk (grow_ahead 1), and the bench waits
 *                           until heapd made it (Stats' spare_bytes) before
 *                           each timed growth: the growth served from the
 *                           spare (fd passing and the client's mapping)
 *   heapd growth, no spare  the same in a heap with grow_ahead none: heapd
 *                           creates and exports the chunk in the growth
 * and prints one table: size | each median in microseconds | ratios.
 *
 * heapd: started by the bench (fork/exec of --heapd, default the heapd beside
 * the bench's build folder, with a temporary config: socket in /tmp, backend
 * cuda), or the one listening at --socket. --backend host runs only the heapd
 * columns on the host backend (for CPU machines).
 *
 * Without libcuda or a GPU it prints "skipped: no GPU" and exits 0 (1 with
 * --require-gpu), so `make bench` passes on CPU machines.
 */
#include "heapc.h"
#include "heapc_cuda.h"
#include "heapc_map.h"
#include "size.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB      ((uint64_t)1 << 20)
#define MAXSIZES 16

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

static double pct(double *v, int n, double p)
{
    if (n <= 0)
        return -1;
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

typedef struct row {
    uint64_t size;
    int n_cm, n_vmm, n_ng, n_g;
    double cuda_malloc, cuda_free;
    double vmm_create, vmm_reserve, vmm_map, vmm_access, vmm_create_map, vmm_release, vmm_export, vmm_export_mapped;
    uint64_t chunk, initial;
    double heapd_attach, heapd_alloc, heapd_alloc_p99, heapd_growth, heapd_growth_max;
    double heapd_growth_nospare, heapd_growth_nospare_max; /* issue 27: grow_ahead none */
} row;

static struct {
    const char *json, *sock, *heapd, *backend;
    int quick, require_gpu, cuda;
    uint64_t sizes[MAXSIZES];
    int nsizes;
    /* heapd we started */
    pid_t hpid;
    char tmp[64], sockbuf[128];
    /* cudart */
    void *rt;
    char rt_name[PATH_MAX];
    int (*cudaMalloc)(void **, size_t);
    int (*cudaFree)(void *);
    int (*cudaSetDevice)(int);
    int (*cudaDeviceSynchronize)(void);
    const char *(*cudaGetErrorString)(int);
    char dev_name[128];
    int driver_version;
    uint64_t gran;
    char uuid[64];
#if HEAPD_HAVE_CUDA_H
    const hc_cuda *cu;
    CUcontext ctx;
    CUdevice device;
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemExport)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long);
#endif
    row rows[MAXSIZES];
} g = {.backend = "cuda"};

static void stop_heapd(void)
{
    if (g.hpid > 0) {
        kill(g.hpid, SIGTERM);
        int st;
        for (int i = 0; i < 100; i++) {
            if (waitpid(g.hpid, &st, WNOHANG) == g.hpid) {
                g.hpid = 0;
                break;
            }
            usleep(50000);
        }
        if (g.hpid > 0) {
            kill(g.hpid, SIGKILL);
            waitpid(g.hpid, &st, 0);
            g.hpid = 0;
        }
    }
    if (g.tmp[0]) {
        char p[160];
        snprintf(p, sizeof p, "%s/heapd.conf", g.tmp);
        unlink(p);
        snprintf(p, sizeof p, "%s/heapd.log", g.tmp);
        unlink(p);
        rmdir(g.tmp);
        g.tmp[0] = '\0';
    }
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpu_bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    if (g.tmp[0]) {
        char p[160];
        snprintf(p, sizeof p, "%s/heapd.log", g.tmp);
        FILE *f = fopen(p, "r");
        if (f) {
            char line[512];
            fprintf(stderr, "gpu_bench: heapd's log:\n");
            while (fgets(line, sizeof line, f))
                fprintf(stderr, "  %s", line);
            fclose(f);
        }
    }
    stop_heapd();
    exit(1);
}

/* ---- heapd ---------------------------------------------------------------- */

static const char *default_heapd(void)
{
    static char p[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", p, sizeof p - 16);
    if (n <= 0)
        return "heapd";
    p[n] = '\0';
    for (int k = 0; k < 2; k++) { /* BUILD/bench/gpu_bench -> BUILD */
        char *s = strrchr(p, '/');
        if (!s)
            return "heapd";
        *s = '\0';
    }
    strcat(p, "/heapd");
    return p;
}

static void start_heapd(void)
{
    snprintf(g.tmp, sizeof g.tmp, "/tmp/gpu_bench.XXXXXX");
    if (!mkdtemp(g.tmp)) {
        g.tmp[0] = '\0';
        die("mkdtemp: %s", strerror(errno));
    }
    char conf[160], log[160];
    snprintf(conf, sizeof conf, "%s/heapd.conf", g.tmp);
    snprintf(log, sizeof log, "%s/heapd.log", g.tmp);
    snprintf(g.sockbuf, sizeof g.sockbuf, "%s/heapd.sock", g.tmp);
    FILE *f = fopen(conf, "w");
    if (!f)
        die("cannot write %s: %s", conf, strerror(errno));
    fprintf(f, "socket = %s\nbackend = %s\nlog_level = warn\ncollect_timeout_ms = 15000\n", g.sockbuf, g.backend);
    fclose(f);
    const char *exe = g.heapd ? g.heapd : default_heapd();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        FILE *lf = freopen(log, "w", stderr);
        (void)lf;
        execl(exe, "heapd", "--config", conf, (char *)NULL);
        fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    g.hpid = pid;
    g.sock = g.sockbuf;
    for (int i = 0; i < 200; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            g.hpid = 0;
            die("heapd (%s) exited at start with status %d; its log is %s", exe, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                log);
        }
        heapc *c = heapc_connect(g.sock);
        int ok = c && heapc_err(c) == HEAPC_OK;
        heapc_free_ctx(c);
        if (ok) {
            printf("gpu_bench: started %s (backend %s, socket %s)\n", exe, g.backend, g.sock);
            return;
        }
        usleep(50000);
    }
    die("heapd (%s) did not listen on %s within 10 s", exe, g.sock);
}

/* ---- CUDA ----------------------------------------------------------------- */

static int load_cudart(void)
{
    static const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    for (size_t i = 0; i < 3 && !g.rt; i++)
        if ((g.rt = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)))
            snprintf(g.rt_name, sizeof g.rt_name, "%s", names[i]);
    const char *home = getenv("CUDA_HOME");
    char pat[PATH_MAX];
    const char *pats[3] = {NULL, "/usr/local/cuda/lib64/libcudart.so*", "/usr/local/cuda*/lib64/libcudart.so*"};
    if (home) {
        snprintf(pat, sizeof pat, "%s/lib64/libcudart.so*", home);
        pats[0] = pat;
    }
    for (int k = 0; k < 3 && !g.rt; k++) {
        if (!pats[k])
            continue;
        glob_t gl;
        if (glob(pats[k], 0, NULL, &gl) == 0) {
            for (size_t i = gl.gl_pathc; i-- > 0 && !g.rt;)
                if ((g.rt = dlopen(gl.gl_pathv[i], RTLD_NOW | RTLD_LOCAL)))
                    snprintf(g.rt_name, sizeof g.rt_name, "%s", gl.gl_pathv[i]);
            globfree(&gl);
        }
    }
    if (!g.rt)
        return -1;
    *(void **)&g.cudaMalloc = dlsym(g.rt, "cudaMalloc");
    *(void **)&g.cudaFree = dlsym(g.rt, "cudaFree");
    *(void **)&g.cudaSetDevice = dlsym(g.rt, "cudaSetDevice");
    *(void **)&g.cudaDeviceSynchronize = dlsym(g.rt, "cudaDeviceSynchronize");
    *(void **)&g.cudaGetErrorString = dlsym(g.rt, "cudaGetErrorString");
    if (!g.cudaMalloc || !g.cudaFree || !g.cudaSetDevice || !g.cudaDeviceSynchronize || !g.cudaGetErrorString)
        return -1;
    return 0;
}

#if HEAPD_HAVE_CUDA_H
#define CU(call)                                                                                                       \
    do {                                                                                                               \
        CUresult rc_ = (call);                                                                                         \
        if (rc_ != CUDA_SUCCESS) {                                                                                     \
            char e_[320];                                                                                              \
            hc_cuda_fail(e_, sizeof e_, rc_, NULL, "%s", #call);                                                       \
            die("%s", e_);                                                                                             \
        }                                                                                                              \
    } while (0)

/* Returns 0, or -1 with a message when there is no usable GPU. */
static int cuda_open(char *err, size_t errlen)
{
    g.cu = hc_cuda_get(err, errlen);
    if (!g.cu)
        return -1;
    int n = 0;
    if (g.cu->DeviceGetCount(&n) != CUDA_SUCCESS || n < 1) {
        snprintf(err, errlen, "the driver reports no GPU");
        return -1;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    *(void **)&g.MemCreate = lib ? dlsym(lib, "cuMemCreate") : NULL;
    *(void **)&g.MemExport = lib ? dlsym(lib, "cuMemExportToShareableHandle") : NULL;
    CUresult (*GetName)(char *, int, CUdevice) = NULL;
    CUresult (*DriverGetVersion)(int *) = NULL;
    *(void **)&GetName = lib ? dlsym(lib, "cuDeviceGetName") : NULL;
    *(void **)&DriverGetVersion = lib ? dlsym(lib, "cuDriverGetVersion") : NULL;
    if (!g.MemCreate || !g.MemExport) {
        snprintf(err, errlen, "libcuda.so.1 lacks cuMemCreate or cuMemExportToShareableHandle");
        return -1;
    }
    CU(g.cu->DeviceGet(&g.device, 0));
    CU(g.cu->DevicePrimaryCtxRetain(&g.ctx, g.device));
    CU(g.cu->CtxSetCurrent(g.ctx));
    if (GetName)
        GetName(g.dev_name, sizeof g.dev_name, g.device);
    if (DriverGetVersion)
        DriverGetVersion(&g.driver_version);
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g.device;
    size_t gr = 0;
    CU(g.cu->MemGetAllocationGranularity(&gr, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    g.gran = gr;
    char e[320];
    if (hm_cuda_device_uuid(0, g.uuid, sizeof g.uuid, e, sizeof e) != HM_OK)
        die("hm_cuda_device_uuid(0): %s", e);
    return 0;
}

static void bench_vmm(row *r, int reps)
{
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g.device;
    CUmemAccessDesc acc = {0};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = g.device;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t sz = (size_t)((r->size + g.gran - 1) / g.gran * g.gran);
    double *v[8];
    for (int k = 0; k < 8; k++)
        v[k] = calloc((size_t)reps, sizeof(double));
    for (int i = -1; i < reps; i++) { /* i = -1: warm-up */
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        int fd = -1, fd2 = -1;
        double t0 = now_us();
        CU(g.MemCreate(&h, sz, &prop, 0));
        double t1 = now_us();
        /* heapd's order: export right after create, before any mapping */
        CU(g.MemExport(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        double t1e = now_us();
        CU(g.cu->MemAddressReserve(&va, sz, 0, 0, 0));
        double t2 = now_us();
        CU(g.cu->MemMap(va, sz, 0, h, 0));
        double t3 = now_us();
        CU(g.cu->MemSetAccess(va, sz, &acc, 1));
        double t4 = now_us();
        /* a second export of the same handle, now mapped */
        CU(g.MemExport(&fd2, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        double t5 = now_us();
        close(fd);
        close(fd2);
        double t6 = now_us();
        CU(g.cu->MemUnmap(va, sz));
        CU(g.cu->MemAddressFree(va, sz));
        CU(g.cu->MemRelease(h));
        double t7 = now_us();
        if (i < 0)
            continue;
        v[0][i] = t1 - t0;
        v[1][i] = t2 - t1e;
        v[2][i] = t3 - t2;
        v[3][i] = t4 - t3;
        v[4][i] = (t1 - t0) + (t4 - t1e);
        v[5][i] = t7 - t6;
        v[6][i] = t1e - t1;
        v[7][i] = t5 - t4;
    }
    r->vmm_create = pct(v[0], reps, 0.5);
    r->vmm_reserve = pct(v[1], reps, 0.5);
    r->vmm_map = pct(v[2], reps, 0.5);
    r->vmm_access = pct(v[3], reps, 0.5);
    r->vmm_create_map = pct(v[4], reps, 0.5);
    r->vmm_release = pct(v[5], reps, 0.5);
    r->vmm_export = pct(v[6], reps, 0.5);
    r->vmm_export_mapped = pct(v[7], reps, 0.5);
    r->n_vmm = reps;
    for (int k = 0; k < 8; k++)
        free(v[k]);
}
#endif /* HEAPD_HAVE_CUDA_H */

static void bench_cudart(row *r, int reps)
{
    double *m = calloc((size_t)reps, sizeof(double)), *f = calloc((size_t)reps, sizeof(double));
    for (int i = -1; i < reps; i++) {
        void *p = NULL;
        double t0 = now_us();
        int rc = g.cudaMalloc(&p, (size_t)r->size);
        double t1 = now_us();
        if (rc != 0)
            die("cudaMalloc(%" PRIu64 "): %s", r->size, g.cudaGetErrorString(rc));
        rc = g.cudaFree(p);
        double t2 = now_us();
        if (rc != 0)
            die("cudaFree: %s", g.cudaGetErrorString(rc));
        if (i >= 0) {
            m[i] = t1 - t0;
            f[i] = t2 - t1;
        }
    }
    r->cuda_malloc = pct(m, reps, 0.5);
    r->cuda_free = pct(f, reps, 0.5);
    r->n_cm = reps;
    free(m);
    free(f);
}

/* ---- heapd ---------------------------------------------------------------- */

#define HC(c, call)                                                                                                    \
    do {                                                                                                               \
        if ((call) != HEAPC_OK)                                                                                        \
            die("%s: %s: %s", #call, heapc_errname(heapc_err(c)), heapc_errstr(c));                                    \
    } while (0)

/* Issue 27: waits until heapd holds `want` spare bytes for heap `name`
 * (made after the attach or the last growth, off its path). */
static void wait_spares(heapc *c, const char *name, uint64_t want)
{
    for (int i = 0;; i++) {
        heapc_daemon_stats *s = NULL;
        HC(c, heapc_stats(c, name, &s));
        uint64_t have = s->nheaps ? s->heaps[0].spare_bytes : 0;
        heapc_stats_free(s);
        if (have >= want)
            return;
        if (i > 300000) /* a hang guard (~60 s): heapd makes a spare in ms */
            die("heap %s: heapd holds %" PRIu64 " spare bytes, want %" PRIu64 "; heapd.conf's quotas?", name, have,
                want);
        usleep(200);
    }
}

/* spare: the heap keeps one spare chunk (grow_ahead 1) and every timed
 * allocation waits for it (the growth figures: heapd_growth); else none
 * (grow_ahead < 0: heapd_growth_nospare; the alloc figures stay). */
static void bench_heapd(row *r, int ng, int ngrow, int spare)
{
    uint64_t gran = g.gran ? g.gran : 2 * MiB;
    uint64_t chunk = (r->size + gran - 1) / gran * gran;
    uint64_t cls = 1;
    while (cls < r->size)
        cls <<= 1;
    /* Twice what the ng allocations take: the default policy asks for a
     * compaction collect once half the heap was handed out (alloc.h), and
     * this figure is an allocation that neither grows nor collects; and more
     * than eight blocks, as it also asks for one once an eighth was handed
     * out before a block of at least an eighth of the heap. */
    uint64_t need = 2 * cls * (uint64_t)ng;
    if (need < 9 * cls)
        need = 9 * cls;
    uint64_t initial = (need + chunk - 1) / chunk * chunk;
    uint64_t gsize = cls > chunk ? cls : chunk; /* one growth = one chunk */
    r->chunk = chunk;
    r->initial = initial;
    heapc *c = heapc_connect(g.sock);
    if (!c)
        die("heapc_connect: out of memory");
    HC(c, heapc_err(c));
    heapc_params p = {0};
    p.chunk_size = chunk;
    p.initial_size = initial;
    p.va_size = initial + (uint64_t)(ngrow + 2) * gsize;
    p.min_block = 512;
    p.collect_timeout_ms = 15000; /* seconds, not minutes: a hang fails fast */
    p.device_uuid = g.uuid;
    p.grow_ahead = spare ? 1 : -1;
    char name[64];
    snprintf(name, sizeof name, "gpu_bench-%" PRIu64 "%s", r->size, spare ? "" : "-nospare");
    double t0 = now_us();
    HC(c, heapc_attach(c, name, 0, 1, &p));
    if (spare)
        r->heapd_attach = now_us() - t0;
    uint64_t sp = spare ? chunk : 0; /* one rank, one spare */
    wait_spares(c, name, sp);        /* no allocation below waits for heapd making it */
    heapc_counters k0, k1;
    HC(c, heapc_get_counters(c, &k0));
    uint64_t m0 = heapc_mapped(c);
    if (m0 != initial)
        die("heap %s: mapped %" PRIu64 " after attach, want %" PRIu64, name, m0, initial);
    double *v = calloc((size_t)(ng > ngrow ? ng : ngrow), sizeof(double));
    for (int i = 0; i < ng; i++) {
        uint64_t off;
        double a = now_us();
        HC(c, heapc_alloc(c, r->size, NULL, &off));
        v[i] = now_us() - a;
    }
    HC(c, heapc_get_counters(c, &k1));
    if (heapc_mapped(c) != m0 || k1.collects_needed != k0.collects_needed)
        die("heap %s: the no-growth allocations grew the heap or collected", name);
    if (spare) {
        r->heapd_alloc_p99 = pct(v, ng, 0.99);
        r->heapd_alloc = pct(v, ng, 0.5);
        r->n_ng = ng;
    }
    /* Fill the rest (untimed), so that each allocation below grows the heap. */
    uint64_t used = (uint64_t)ng * ((r->size + p.min_block - 1) / p.min_block * p.min_block);
    if (m0 > used) {
        uint64_t fill;
        HC(c, heapc_alloc(c, m0 - used, NULL, &fill));
        if (heapc_mapped(c) != m0)
            die("heap %s: filling its last %" PRIu64 " bytes grew it", name, m0 - used);
    }
    /* alloc.h: under reclaim collect an allocation that would grow asks for
     * exactly one collect first, then grows without asking again; under
     * eager (heapd's default on one node) nothing is pending, so it grows
     * at once (issue 27). */
    heapc_params ep;
    HC(c, heapc_get_params(c, &ep));
    uint64_t want = ep.reclaim == HEAPC_RECLAIM_COLLECT ? 1 : 0;
    for (int i = 0; i < ngrow; i++) {
        wait_spares(c, name, sp);
        /* One untimed round trip on the allocations' transport (the request
         * ring): waiting for the spare left it asleep, and a wake-up is no
         * part of a growth; both variants do the same. */
        HC(c, heapc_collect(c));
        HC(c, heapc_get_counters(c, &k0));
        uint64_t before = heapc_mapped(c), off;
        double a = now_us();
        HC(c, heapc_alloc(c, gsize, NULL, &off));
        v[i] = now_us() - a;
        HC(c, heapc_get_counters(c, &k1));
        if (heapc_mapped(c) <= before || k1.collects_needed - k0.collects_needed != want)
            die("heap %s: growth %d: mapped %" PRIu64 " -> %" PRIu64 " (chunk %" PRIu64 "), collects needed %" PRIu64
                " -> %" PRIu64 " (want %" PRIu64 " more)",
                name, i, before, heapc_mapped(c), chunk, k0.collects_needed, k1.collects_needed, want);
    }
    *(spare ? &r->heapd_growth_max : &r->heapd_growth_nospare_max) = pct(v, ngrow, 1.0);
    *(spare ? &r->heapd_growth : &r->heapd_growth_nospare) = pct(v, ngrow, 0.5);
    r->n_g = ngrow;
    free(v);
    HC(c, heapc_detach(c));
    heapc_free_ctx(c);
}

/* ---- output --------------------------------------------------------------- */

static void cell(char *buf, size_t len, double v)
{
    if (v < 0)
        snprintf(buf, len, "n/a");
    else if (v >= 10000)
        snprintf(buf, len, "%.0f", v);
    else if (v >= 100)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%.1f", v);
}

static void ratio(char *buf, size_t len, double a, double b)
{
    if (a < 0 || b <= 0)
        snprintf(buf, len, "n/a");
    else
        snprintf(buf, len, "%.2f", a / b);
}

static void jnum(FILE *f, const char *k, double v, int last)
{
    if (v < 0)
        fprintf(f, "\"%s\": null%s", k, last ? "" : ", ");
    else
        fprintf(f, "\"%s\": %.2f%s", k, v, last ? "" : ", ");
}

static void print_table(void)
{
    printf("\nmedians in microseconds; VMM = cuMemCreate + cuMemAddressReserve + cuMemMap + "
           "cuMemSetAccess\n(size rounded up to %" PRIu64 " KiB), release = cuMemUnmap + "
           "cuMemAddressFree + cuMemRelease;\nVMM 1st export = cuMemExportToShareableHandle (POSIX fd) "
           "right after cuMemCreate (heapd's order; per handle, once), 2nd export = the same handle\nagain, "
           "mapped;\nheapd alloc = an allocation of "
           "that size in a "
           "1-rank heap that does not grow; heapd growth = one that grows it by one chunk, served from the\n"
           "spare chunk heapd made ahead (grow_ahead 1); no spare = the same with grow_ahead none\n\n",
           (g.gran ? g.gran : 2 * MiB) >> 10);
    printf("| size | cudaMalloc | cudaFree | VMM create+map | VMM release | VMM 1st export | "
           "VMM 2nd export | heapd alloc | heapd growth | heapd growth, no spare | growth/cudaMalloc | growth/VMM | "
           "cudaMalloc/heapd alloc |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < g.nsizes; i++) {
        row *r = &g.rows[i];
        char sz[HSZ_SIZE_BUFLEN], c[12][32];
        cell(c[11], 32, r->heapd_growth_nospare);
        hsz_format_size(r->size, sz, sizeof sz);
        cell(c[0], 32, r->cuda_malloc);
        cell(c[1], 32, r->cuda_free);
        cell(c[2], 32, r->vmm_create_map);
        cell(c[3], 32, r->vmm_release);
        cell(c[4], 32, r->vmm_export);
        cell(c[5], 32, r->heapd_alloc);
        cell(c[6], 32, r->heapd_growth);
        ratio(c[7], 32, r->heapd_growth, r->cuda_malloc);
        ratio(c[8], 32, r->heapd_growth, r->vmm_create_map);
        ratio(c[9], 32, r->cuda_malloc, r->heapd_alloc);
        cell(c[10], 32, r->vmm_export_mapped);
        printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sz, c[0], c[1], c[2], c[3], c[4],
               c[10], c[5], c[6], c[11], c[7], c[8], c[9]);
    }
    fflush(stdout);
}

static void write_json(void)
{
    FILE *f = fopen(g.json, "w");
    if (!f)
        die("cannot write %s: %s", g.json, strerror(errno));
    fprintf(f,
            "{\"bench\": \"gpu_bench\", \"backend\": \"%s\", \"device\": \"%s\", "
            "\"driver_version\": %d, \"cudart\": \"%s\", \"granularity\": %" PRIu64 ", \"rows\": [",
            g.backend, g.dev_name, g.driver_version, g.rt_name, g.gran);
    for (int i = 0; i < g.nsizes; i++) {
        row *r = &g.rows[i];
        fprintf(f,
                "%s\n  {\"size\": %" PRIu64 ", \"heapd_chunk\": %" PRIu64 ", \"heapd_initial\": %" PRIu64
                ", \"reps\": {\"cudaMalloc\": %d, \"vmm\": %d, "
                "\"heapd_alloc\": %d, \"heapd_growth\": %d}, ",
                i ? "," : "", r->size, r->chunk, r->initial, r->n_cm, r->n_vmm, r->n_ng, r->n_g);
        jnum(f, "cuda_malloc_us", r->cuda_malloc, 0);
        jnum(f, "cuda_free_us", r->cuda_free, 0);
        jnum(f, "vmm_create_us", r->vmm_create, 0);
        jnum(f, "vmm_reserve_us", r->vmm_reserve, 0);
        jnum(f, "vmm_map_us", r->vmm_map, 0);
        jnum(f, "vmm_set_access_us", r->vmm_access, 0);
        jnum(f, "vmm_create_map_us", r->vmm_create_map, 0);
        jnum(f, "vmm_release_us", r->vmm_release, 0);
        jnum(f, "vmm_export_us", r->vmm_export, 0);
        jnum(f, "vmm_export_mapped_us", r->vmm_export_mapped, 0);
        jnum(f, "heapd_attach_us", r->heapd_attach, 0);
        jnum(f, "heapd_alloc_us", r->heapd_alloc, 0);
        jnum(f, "heapd_alloc_p99_us", r->heapd_alloc_p99, 0);
        jnum(f, "heapd_growth_us", r->heapd_growth, 0);
        jnum(f, "heapd_growth_max_us", r->heapd_growth_max, 0);
        jnum(f, "heapd_growth_nospare_us", r->heapd_growth_nospare, 0);
        jnum(f, "heapd_growth_nospare_max_us", r->heapd_growth_nospare_max, 1);
        fprintf(f, "}");
    }
    fprintf(f, "\n]}\n");
    fclose(f);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gpu_bench [--json FILE] [--quick] [--socket PATH | --heapd PATH]\n"
               "                 [--sizes LIST] [--backend cuda|host] [--require-gpu]\n"
               "  --json FILE    also write the results as JSON to FILE\n"
               "  --quick        fewer repetitions\n"
               "  --socket PATH  use the heapd listening there (its backend must match)\n"
               "  --heapd PATH   the heapd to start (default: BUILD/heapd beside BUILD/bench)\n"
               "  --sizes LIST   comma-separated sizes (default 4K,2M,64M,256M,1G)\n"
               "  --backend B    cuda (default) or host (heapd columns only, no GPU needed)\n"
               "  --require-gpu  exit 1 instead of 0 when there is no GPU\n");
}

int main(int argc, char **argv)
{
    const char *sizes = "4K,2M,64M,256M,1G";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json") && v)
            g.json = v, i++;
        else if (!strcmp(a, "--socket") && v)
            g.sock = v, i++;
        else if (!strcmp(a, "--heapd") && v)
            g.heapd = v, i++;
        else if (!strcmp(a, "--sizes") && v)
            sizes = v, i++;
        else if (!strcmp(a, "--backend") && v)
            g.backend = v, i++;
        else if (!strcmp(a, "--quick"))
            g.quick = 1;
        else if (!strcmp(a, "--require-gpu"))
            g.require_gpu = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (strcmp(g.backend, "cuda") && strcmp(g.backend, "host")) {
        usage(stderr);
        return 2;
    }
    char list[256];
    snprintf(list, sizeof list, "%s", sizes);
    for (char *s = strtok(list, ","); s; s = strtok(NULL, ",")) {
        if (g.nsizes == MAXSIZES || hsz_parse_size(s, &g.sizes[g.nsizes]) || !g.sizes[g.nsizes]) {
            fprintf(stderr, "gpu_bench: bad --sizes entry %s\n", s);
            return 2;
        }
        g.rows[g.nsizes].size = g.sizes[g.nsizes];
        g.nsizes++;
    }
    g.cuda = !strcmp(g.backend, "cuda");
    signal(SIGPIPE, SIG_IGN);

    if (g.cuda) {
        char err[400] = "built without cuda.h";
        int ok = -1;
#if HEAPD_HAVE_CUDA_H
        ok = cuda_open(err, sizeof err);
#endif
        if (ok != 0) {
            printf("skipped: no GPU (%s)\n", err);
            if (g.json) {
                FILE *f = fopen(g.json, "w");
                if (f) {
                    fprintf(f, "{\"bench\": \"gpu_bench\", \"skipped\": \"no GPU\"}\n");
                    fclose(f);
                }
            }
            return g.require_gpu ? 1 : 0;
        }
        if (load_cudart() != 0)
            printf("gpu_bench: libcudart not found (tried libcudart.so.13, .12, .so, $CUDA_HOME "
                   "and /usr/local/cuda-VERSION/lib64): no cudaMalloc column\n");
        else {
            int rc = g.cudaSetDevice(0);
            if (rc == 0)
                rc = g.cudaFree(NULL); /* creates the runtime's context (primary) */
            if (rc != 0)
                die("cudaSetDevice(0)/cudaFree(NULL): %s", g.cudaGetErrorString(rc));
        }
        printf("gpu_bench: %s, driver %d.%d, %s, granularity %" PRIu64 " KiB\n", g.dev_name, g.driver_version / 1000,
               g.driver_version % 1000 / 10, g.rt ? g.rt_name : "no cudart", g.gran >> 10);
    }
    if (!g.sock)
        start_heapd();
    {
        heapc *c = heapc_connect(g.sock);
        if (!c || heapc_err(c))
            die("cannot connect to heapd at %s: %s", g.sock, c ? heapc_errstr(c) : "out of memory");
        if (strcmp(heapc_backend(c), g.backend) != 0)
            die("heapd at %s runs the %s backend; this run needs %s", g.sock, heapc_backend(c), g.backend);
        heapc_free_ctx(c);
    }

    for (int i = 0; i < g.nsizes; i++) {
        row *r = &g.rows[i];
        r->cuda_malloc = r->cuda_free = r->vmm_create = r->vmm_reserve = r->vmm_map = r->vmm_access =
            r->vmm_create_map = r->vmm_release = r->vmm_export = r->vmm_export_mapped = -1;
        int big = r->size >= 256 * MiB, huge = r->size >= 1024 * MiB;
        int reps = huge ? 10 : big ? 20 : 50;
        int ng = r->size <= 2 * MiB ? (r->size <= 64 * 1024 ? 200 : 50) : huge ? 4 : big ? 8 : 20;
        int ngrow = huge ? 3 : big ? 5 : r->size > 2 * MiB ? 10 : 20;
        if (g.quick) {
            reps = reps / 5 > 3 ? reps / 5 : 3;
            ng = ng / 4 > 3 ? ng / 4 : 3;
            ngrow = ngrow / 3 > 2 ? ngrow / 3 : 2;
        }
        char sz[HSZ_SIZE_BUFLEN];
        hsz_format_size(r->size, sz, sizeof sz);
        printf("gpu_bench: %s ...", sz);
        fflush(stdout);
        if (g.cuda) {
            if (g.rt)
                bench_cudart(r, reps);
#if HEAPD_HAVE_CUDA_H
            bench_vmm(r, reps);
#endif
        }
        /* Issue 27: the first heap of a size in a heapd pays a warm-up: each
         * growth's larger allocator bitmaps (hab_resize) land in memory heapd
         * never touched (page faults over the memmove) until an earlier heap
         * as large left it free (2-4x on the host backend at 64 MiB,
         * whichever variant runs first). So an untimed pass as large goes
         * first. */
        bench_heapd(r, ng, ngrow, 0);
        bench_heapd(r, ng, ngrow, 1);
        bench_heapd(r, ng, ngrow, 0);
        printf(" cudaMalloc %.1f, VMM %.1f, heapd alloc %.1f, growth %.1f us (no spare %.1f us)\n", r->cuda_malloc,
               r->vmm_create_map, r->heapd_alloc, r->heapd_growth, r->heapd_growth_nospare);
    }
    stop_heapd();
    print_table();
    if (g.json) {
        write_json();
        printf("gpu_bench: wrote %s\n", g.json);
    }
#if HEAPD_HAVE_CUDA_H
    if (g.cuda && g.ctx) {
        g.cu->CtxSetCurrent(NULL);
        g.cu->DevicePrimaryCtxRelease(g.device);
    }
#endif
    return 0;
}
