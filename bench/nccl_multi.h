/* nccl_multi.h - nccl_multi_bench's device and NCCL layers, one header so
 * that the bench stays one program of two readable files: the CUDA driver
 * calls of a GPU rank (loaded with dlopen in the rank, after the fork), the
 * same buffer calls on host memory for the dry run (--host), and the
 * recording layer over NCCL's function table (the windows registered, each
 * collective counted by whether both its buffers lie in one window). Include
 * after bench_util.h, with NAME defined. */
#ifndef HEAPD_NCCL_MULTI_H
#define HEAPD_NCCL_MULTI_H

#include <dlfcn.h>
#include <stdint.h>

#include "heapc_nccl.h"

#define MAX_WINS 64
enum { OP_AR, OP_AG, NOPS };

static int g_host, g_rank, g_nranks;

/* ---- the CUDA driver (GPU runs), loaded with dlopen in each rank ------------- */

static struct {
    int (*Init)(unsigned);
    int (*DeviceGetCount)(int *);
    int (*DeviceGet)(int *, int);
    int (*DevicePrimaryCtxRetain)(void **, int);
    int (*CtxSetCurrent)(void *);
    int (*CtxSynchronize)(void);
    int (*MemAlloc)(unsigned long long *, size_t);
    int (*MemFree)(unsigned long long);
    int (*MemsetD32)(unsigned long long, unsigned, size_t);
    int (*MemcpyDtoH)(void *, unsigned long long, size_t);
} cu;

#define CUCK(call, what)                                                                                               \
    do {                                                                                                               \
        int e_ = (call);                                                                                               \
        if (e_ != 0)                                                                                                   \
            die("rank %d: %s: CUresult %d", g_rank, what, e_);                                                         \
    } while (0)

static void cuda_open(int ranks)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        die("rank %d: %s; on a CPU machine run with --host", g_rank, dlerror());
    static const char *const names[] = {
        "cuInit",           "cuDeviceGetCount", "cuDeviceGet",  "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
        "cuCtxSynchronize", "cuMemAlloc_v2",    "cuMemFree_v2", "cuMemsetD32_v2",           "cuMemcpyDtoH_v2"};
    void **slots[] = {(void **)&cu.Init,          (void **)&cu.DeviceGetCount,
                      (void **)&cu.DeviceGet,     (void **)&cu.DevicePrimaryCtxRetain,
                      (void **)&cu.CtxSetCurrent, (void **)&cu.CtxSynchronize,
                      (void **)&cu.MemAlloc,      (void **)&cu.MemFree,
                      (void **)&cu.MemsetD32,     (void **)&cu.MemcpyDtoH};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *s = dlsym(h, names[i]);
        if (!s)
            die("rank %d: libcuda.so.1 has no %s (driver too old)", g_rank, names[i]);
        memcpy(slots[i], &s, sizeof s);
    }
    int n = 0, dev = 0;
    void *ctx = NULL;
    CUCK(cu.Init(0), "cuInit");
    CUCK(cu.DeviceGetCount(&n), "cuDeviceGetCount");
    if (n < ranks)
        die("rank %d: %d ranks need %d GPUs, this machine has %d; pass --ranks %d or fewer", g_rank, ranks, ranks, n,
            n);
    CUCK(cu.DeviceGet(&dev, g_rank), "cuDeviceGet");
    CUCK(cu.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CUCK(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

static void *plain_alloc(size_t n)
{
    if (g_host) {
        void *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096); /* C11: a multiple of the alignment */
        if (!p)
            die("rank %d: out of host memory (%zu bytes)", g_rank, n);
        return p;
    }
    unsigned long long d = 0;
    CUCK(cu.MemAlloc(&d, n), "cuMemAlloc");
    return (void *)(uintptr_t)d;
}

static void plain_free(void *p)
{
    if (g_host)
        free(p);
    else
        cu.MemFree((unsigned long long)(uintptr_t)p);
}

static void fill(void *p, size_t bytes, float v)
{
    unsigned bits;
    memcpy(&bits, &v, sizeof bits);
    if (g_host) {
        for (size_t i = 0; i < bytes / 4; i++)
            memcpy((char *)p + 4 * i, &bits, 4);
        return;
    }
    CUCK(cu.MemsetD32((unsigned long long)(uintptr_t)p, bits, bytes / 4), "cuMemsetD32");
}

static void sync_dev(void)
{
    if (!g_host)
        CUCK(cu.CtxSynchronize(), "cuCtxSynchronize");
}

static float peek(const void *p, size_t idx)
{
    float v;
    CUCK(cu.MemcpyDtoH(&v, (unsigned long long)(uintptr_t)p + 4 * idx, 4), "cuMemcpyDtoH");
    return v;
}

/* ---- the recording layer over NCCL's table ----------------------------------- */

static const hnccl_table *g_base;
static hnccl_table g_tab;
static struct {
    uintptr_t lo, hi;
    ncclWindow_t w;
} g_win[MAX_WINS];
static int g_nwin, g_nonsymm;
static uint64_t g_reg, g_dereg, g_in[NOPS], g_out[NOPS];

static int in_window(const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < g_nwin; i++)
        if (g_win[i].lo <= a && a + len <= g_win[i].hi)
            return 1;
    return 0;
}

static ncclResult_t rec_register(ncclComm_t comm, void *buf, size_t size, ncclWindow_t *win, int flags)
{
    ncclResult_t r = g_base->CommWindowRegister(comm, buf, size, win, flags);
    if (r != ncclSuccess)
        return r;
    g_reg++;
    if (flags != NCCL_WIN_COLL_SYMMETRIC)
        g_nonsymm++;
    else if (g_nwin < MAX_WINS)
        g_win[g_nwin].lo = (uintptr_t)buf, g_win[g_nwin].hi = (uintptr_t)buf + size, g_win[g_nwin++].w = *win;
    return r;
}

static ncclResult_t rec_deregister(ncclComm_t comm, ncclWindow_t win)
{
    ncclResult_t r = g_base->CommWindowDeregister(comm, win);
    if (r != ncclSuccess)
        return r;
    g_dereg++;
    for (int i = 0; i < g_nwin; i++)
        if (g_win[i].w == win) {
            g_win[i] = g_win[--g_nwin];
            break;
        }
    return r;
}

static void count(int op, const void *s, size_t sb, const void *r, size_t rb)
{
    if (in_window(s, sb) && in_window(r, rb))
        g_in[op]++;
    else
        g_out[op]++;
}

static ncclResult_t rec_all_reduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t st)
{
    count(OP_AR, s, n * 4, r, n * 4);
    return g_base->AllReduce(s, r, n, dt, op, comm, st);
}

static ncclResult_t rec_all_gather(const void *s, void *r, size_t n, ncclDataType_t dt, ncclComm_t comm,
                                   cudaStream_t st)
{
    count(OP_AG, s, n * 4, r, n * 4 * (size_t)g_nranks);
    return g_base->AllGather(s, r, n, dt, comm, st);
}

/* The stand-in's table (--host), from its symbols. */
static void *stub_open(const char *path, hnccl_table *t)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        die("rank %d: the NCCL stand-in %s: %s; build it (make) or pass --nccl-lib PATH", g_rank, path, dlerror());
    struct {
        void *slot;
        const char *name;
    } s[] = {{&t->AllReduce, "ncclAllReduce"},
             {&t->AllGather, "ncclAllGather"},
             {&t->GetErrorString, "ncclGetErrorString"},
             {&t->CommWindowRegister, "ncclCommWindowRegister"},
             {&t->CommWindowDeregister, "ncclCommWindowDeregister"},
             {&t->GetUniqueId, "ncclGetUniqueId"},
             {&t->CommInitRank, "ncclCommInitRank"},
             {&t->CommDestroy, "ncclCommDestroy"}};
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        void *f = dlsym(h, s[i].name);
        if (!f)
            die("rank %d: %s has no %s", g_rank, path, s[i].name);
        memcpy(s[i].slot, &f, sizeof f);
    }
    return h;
}

#endif
