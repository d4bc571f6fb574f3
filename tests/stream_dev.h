/* stream_dev.h - the device of the stream-ordered free tests
 * (prog_stream_free.c): a spin kernel from embedded PTX on a CUDA stream, or
 * a host thread on a heapc_hstream; owner writes and checks. Header-only
 * (static functions) for that one program, split from it to keep it short.
 */
#ifndef HEAPD_TESTS_STREAM_DEV_H
#define HEAPD_TESTS_STREAM_DEV_H

#include "cuda_dl.h"
#include "heapc.h"
#include "heapc_cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define X_SKIP 77
#define KPAT   0xdeadbeefu

/* ---- the device: a spin kernel from embedded PTX, or a host thread -------- */

/* spin_write(ns, dst, words, val): one block spins on %globaltimer for ns
 * nanoseconds, then writes val into dst[0 .. words). No nvcc needed: the
 * driver compiles this text (cuModuleLoadData). */
static const char spin_ptx[] = ".version 6.0\n"
                               ".target sm_50\n"
                               ".address_size 64\n"
                               ".visible .entry spin_write(.param .u64 p_ns, .param .u64 p_dst, .param .u32 p_words,\n"
                               "                           .param .u32 p_val)\n"
                               "{\n"
                               "    .reg .pred %p<3>;\n"
                               "    .reg .b32 %r<6>;\n"
                               "    .reg .b64 %rd<8>;\n"
                               "    ld.param.u64 %rd1, [p_ns];\n"
                               "    ld.param.u64 %rd2, [p_dst];\n"
                               "    ld.param.u32 %r1, [p_words];\n"
                               "    ld.param.u32 %r2, [p_val];\n"
                               "    mov.u64 %rd3, %globaltimer;\n"
                               "    add.u64 %rd4, %rd3, %rd1;\n"
                               "WAIT:\n"
                               "    mov.u64 %rd5, %globaltimer;\n"
                               "    setp.lt.u64 %p1, %rd5, %rd4;\n"
                               "    @%p1 bra WAIT;\n"
                               "    mov.u32 %r3, %tid.x;\n"
                               "    mov.u32 %r4, %ntid.x;\n"
                               "LOOP:\n"
                               "    setp.ge.u32 %p2, %r3, %r1;\n"
                               "    @%p2 bra DONE;\n"
                               "    mul.wide.u32 %rd6, %r3, 4;\n"
                               "    add.u64 %rd7, %rd2, %rd6;\n"
                               "    st.global.u32 [%rd7], %r2;\n"
                               "    add.u32 %r3, %r3, %r4;\n"
                               "    bra LOOP;\n"
                               "DONE:\n"
                               "    ret;\n"
                               "}\n";

typedef struct dev {
    int host;
    int spin_ms; /* the kernel's spin */
    char err[400];
    /* host: the "kernel" thread */
    heapc_hstream *hs;
    pthread_t th;
    int th_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go, done;
    uint32_t *kdst;
    size_t kwords;
    uint64_t ticket;
#if HEAPD_HAVE_CUDA_H
    const hc_cuda *cu;
    CUcontext ctx;
    CUdevice device;
    CUmodule mod;
    CUfunction fn;
    CUstream s, s2; /* the kernel's stream; the owners' writes */
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*MemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
#endif
} dev;

static int dev_open(dev *d, int host, int spin_ms)
{
    memset(d, 0, sizeof *d);
    d->host = host;
    d->spin_ms = spin_ms;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if (d->host) {
        d->hs = heapc_hstream_create();
        if (!d->hs) {
            snprintf(d->err, sizeof d->err, "heapc_hstream_create: out of memory");
            return 1;
        }
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    d->cu = hc_cuda_get(d->err, sizeof d->err);
    if (!d->cu)
        return X_SKIP;
    void *lib = cd_open(d->err, sizeof d->err);
    if (!lib)
        return 1;
    const cd_sym syms[] = {
        {(void **)&d->ModuleLoadData, "cuModuleLoadData", NULL},
        {(void **)&d->ModuleGetFunction, "cuModuleGetFunction", NULL},
        {(void **)&d->LaunchKernel, "cuLaunchKernel", NULL},
        {(void **)&d->StreamCreate, "cuStreamCreate", NULL},
        {(void **)&d->StreamSynchronize, "cuStreamSynchronize", NULL},
        {(void **)&d->StreamQuery, "cuStreamQuery", NULL},
        {(void **)&d->MemsetD32Async, "cuMemsetD32Async", NULL},
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
    if ((rc = d->ModuleLoadData(&d->mod, spin_ptx)) != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuModuleLoadData(spin kernel PTX)");
        return 1;
    }
    if ((rc = d->ModuleGetFunction(&d->fn, d->mod, "spin_write")) != CUDA_SUCCESS ||
        (rc = d->StreamCreate(&d->s, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS ||
        (rc = d->StreamCreate(&d->s2, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "spin kernel or streams");
        return 1;
    }
    /* Warm up (module loading is lazy): a launch that neither spins nor
     * writes, so that the timed round does not pay for the first one. */
    unsigned long long ns = 0;
    CUdeviceptr p0 = 0;
    unsigned int w0 = 0, v0 = 0;
    void *args[] = {&ns, &p0, &w0, &v0};
    if ((rc = d->LaunchKernel(d->fn, 1, 1, 1, 256, 1, 1, 0, d->s, args, NULL)) != CUDA_SUCCESS ||
        (rc = d->StreamSynchronize(d->s)) != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "warm-up launch of the spin kernel");
        return 1;
    }
    return 0;
#else
    snprintf(d->err, sizeof d->err, "built without cuda.h (HEAPD_HAVE_CUDA_H unset)");
    return X_SKIP;
#endif
}

/* The stream heapc_free_async gets. */
static void *dev_stream(dev *d)
{
#if HEAPD_HAVE_CUDA_H
    if (!d->host)
        return d->s;
#endif
    return d->hs;
}

static void *host_kernel(void *arg)
{
    dev *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->go)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    for (size_t i = 0; i < d->kwords; i++) /* writes into the freed block */
        __atomic_store_n(&d->kdst[i], KPAT, __ATOMIC_RELAXED);
    heapc_hstream_complete(d->hs, d->ticket);
    pthread_mutex_lock(&d->mu);
    d->done = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Starts the kernel: spin, then KPAT over words of dst. */
static int dev_kernel(dev *d, void *dst, size_t words)
{
    if (d->host) {
        d->kdst = dst;
        d->kwords = words;
        d->go = d->done = 0;
        d->ticket = heapc_hstream_begin(d->hs);
        if (pthread_create(&d->th, NULL, host_kernel, d) != 0) {
            snprintf(d->err, sizeof d->err, "pthread_create failed");
            return -1;
        }
        d->th_on = 1;
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    unsigned long long ns = (unsigned long long)d->spin_ms * 1000000ull;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)dst;
    unsigned int w = (unsigned int)words, v = KPAT;
    void *args[] = {&ns, &p, &w, &v};
    CUresult rc = d->LaunchKernel(d->fn, 1, 1, 1, 256, 1, 1, 0, d->s, args, NULL);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuLaunchKernel(spin_write)");
        return -1;
    }
#endif
    return 0;
}

/* 1 while the kernel has not finished (no wait). */
static int dev_kernel_running(dev *d)
{
    if (d->host) {
        pthread_mutex_lock(&d->mu);
        int r = !d->done;
        pthread_mutex_unlock(&d->mu);
        return r;
    }
#if HEAPD_HAVE_CUDA_H
    return d->StreamQuery(d->s) == CUDA_ERROR_NOT_READY;
#endif
    return 0;
}

/* Lets the kernel write (host) and waits until it finished. */
static int dev_kernel_wait(dev *d)
{
    if (d->host) {
        if (!d->th_on)
            return 0;
        pthread_mutex_lock(&d->mu);
        d->go = 1;
        pthread_cond_broadcast(&d->cv);
        while (!d->done)
            pthread_cond_wait(&d->cv, &d->mu);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->th, NULL);
        d->th_on = 0;
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    CUresult rc = d->StreamSynchronize(d->s);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuStreamSynchronize(kernel stream)");
        return -1;
    }
#endif
    return 0;
}

/* The old default device sync, as a hook: host, let the kernel finish and
 * wait for it; cuda, cuCtxSynchronize. */
static int sync_hook(void *arg)
{
    dev *d = arg;
    if (d->host)
        return dev_kernel_wait(d);
#if HEAPD_HAVE_CUDA_H
    return d->cu->CtxSynchronize() != CUDA_SUCCESS;
#endif
    return 0;
}

/* Fills words of p with v (on the owners' stream, without waiting for the
 * kernel's stream), then waits for that write only. */
static int dev_fill(dev *d, void *p, uint32_t v, size_t words)
{
    if (d->host) {
        uint32_t *w = p;
        for (size_t i = 0; i < words; i++)
            __atomic_store_n(&w[i], v, __ATOMIC_RELAXED);
        return 0;
    }
#if HEAPD_HAVE_CUDA_H
    CUresult rc = d->MemsetD32Async((CUdeviceptr)(uintptr_t)p, v, words, d->s2);
    if (rc == CUDA_SUCCESS)
        rc = d->StreamSynchronize(d->s2);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuMemsetD32Async + sync (owner write)");
        return -1;
    }
#endif
    return 0;
}

/* Queues a fill of words of p with v on stream (cuda; host: at once) and
 * waits for it. */
static int dev_fill_on(dev *d, void *p, uint32_t v, size_t words, void *stream)
{
    if (d->host)
        return dev_fill(d, p, v, words);
#if HEAPD_HAVE_CUDA_H
    CUresult rc = d->MemsetD32Async((CUdeviceptr)(uintptr_t)p, v, words, (CUstream)stream);
    if (rc == CUDA_SUCCESS)
        rc = d->StreamSynchronize((CUstream)stream);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuMemsetD32Async + sync (owner write on a stream)");
        return -1;
    }
#else
    (void)stream;
#endif
    return 0;
}

/* Index of the first word of p that is not v, or -1; -2 on an error. */
static long dev_check(dev *d, const void *p, uint32_t v, size_t words, uint32_t *got)
{
    uint32_t *buf = malloc(words * 4);
    if (!buf)
        return -2;
    if (d->host) {
        const uint32_t *w = p;
        for (size_t i = 0; i < words; i++)
            buf[i] = __atomic_load_n(&w[i], __ATOMIC_RELAXED);
    }
#if HEAPD_HAVE_CUDA_H
    else {
        CUresult rc = d->MemcpyDtoH(buf, (CUdeviceptr)(uintptr_t)p, words * 4);
        if (rc != CUDA_SUCCESS) {
            hc_cuda_fail(d->err, sizeof d->err, rc, NULL, "cuMemcpyDtoH");
            free(buf);
            return -2;
        }
    }
#endif
    long bad = -1;
    for (size_t i = 0; i < words; i++)
        if (buf[i] != v) {
            bad = (long)i;
            *got = buf[i];
            break;
        }
    free(buf);
    return bad;
}

#endif
