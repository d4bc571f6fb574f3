/* heapc_cuda.c - libheapc's dlopen loader for the CUDA driver API. See
 * heapc_cuda.h. */
#include "heapc_cuda.h"

#include <stdio.h>
#include <string.h>

#if HEAPD_HAVE_CUDA_H

#include <pthread.h>
#include <stdarg.h>

static struct {
    int ok;
    char err[320];
    hc_cuda api;
} hc_state;

static pthread_once_t hc_once = PTHREAD_ONCE_INIT;

static void hc_load(void)
{
    char why[128]; /* dlerror's reason, cut short to fit err */
    void *lib = cd_open(why, sizeof why);
    if (!lib) {
        snprintf(hc_state.err, sizeof hc_state.err,
                 "no NVIDIA driver was found (dlopen of libcuda.so.1 failed: %s); use a heap "
                 "on the host backend on machines without a GPU",
                 why);
        return;
    }
    hc_cuda *a = &hc_state.api;
    const cd_sym syms[] = {
        {(void **)&a->GetErrorName, "cuGetErrorName", NULL},
        {(void **)&a->GetErrorString, "cuGetErrorString", NULL},
        {(void **)&a->Init, "cuInit", NULL},
        {(void **)&a->DeviceGetCount, "cuDeviceGetCount", NULL},
        {(void **)&a->DeviceGet, "cuDeviceGet", NULL},
        {(void **)&a->DeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid"},
        {(void **)&a->DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL},
        {(void **)&a->DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", NULL},
        {(void **)&a->CtxGetCurrent, "cuCtxGetCurrent", NULL},
        {(void **)&a->CtxSetCurrent, "cuCtxSetCurrent", NULL},
        {(void **)&a->CtxGetDevice, "cuCtxGetDevice", NULL},
        {(void **)&a->CtxSynchronize, "cuCtxSynchronize", NULL},
        {(void **)&a->MemGetAllocationGranularity, "cuMemGetAllocationGranularity", NULL},
        {(void **)&a->MemAddressReserve, "cuMemAddressReserve", NULL},
        {(void **)&a->MemAddressFree, "cuMemAddressFree", NULL},
        {(void **)&a->MemImportFromShareableHandle, "cuMemImportFromShareableHandle", NULL},
        {(void **)&a->MemMap, "cuMemMap", NULL},
        {(void **)&a->MemUnmap, "cuMemUnmap", NULL},
        {(void **)&a->MemSetAccess, "cuMemSetAccess", NULL},
        {(void **)&a->MemRelease, "cuMemRelease", NULL},
        {(void **)&a->EventCreate, "cuEventCreate", NULL},
        {(void **)&a->EventRecord, "cuEventRecord", NULL},
        {(void **)&a->EventQuery, "cuEventQuery", NULL},
        {(void **)&a->EventDestroy, "cuEventDestroy_v2", "cuEventDestroy"},
        {(void **)&a->EventSynchronize, "cuEventSynchronize", NULL},
        {(void **)&a->StreamWaitEvent, "cuStreamWaitEvent", NULL},
    };
    const char *missing;
    if (cd_resolve(lib, syms, sizeof syms / sizeof syms[0], &missing)) {
        snprintf(hc_state.err, sizeof hc_state.err,
                 "libcuda.so.1 has no %s: the NVIDIA driver is too old for libheapc (it "
                 "needs CUDA VMM, driver 450 or newer); update the driver",
                 missing);
        return;
    }
    CUresult rc = a->Init(0);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(hc_state.err, sizeof hc_state.err, rc,
                     "the NVIDIA driver found no usable GPU for this process; check "
                     "CUDA_VISIBLE_DEVICES and nvidia-smi",
                     "cuInit");
        return;
    }
    hc_state.ok = 1;
}

const hc_cuda *hc_cuda_get(char *err, size_t errlen)
{
    pthread_once(&hc_once, hc_load);
    if (hc_state.ok)
        return &hc_state.api;
    if (err && errlen)
        snprintf(err, errlen, "%s", hc_state.err);
    return NULL;
}

void hc_cuda_fail(char *err, size_t errlen, CUresult rc, const char *hint, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    const char *name = NULL, *text = NULL;
    if (hc_state.api.GetErrorName && hc_state.api.GetErrorName(rc, &name) != CUDA_SUCCESS)
        name = NULL;
    if (hc_state.api.GetErrorString && hc_state.api.GetErrorString(rc, &text) != CUDA_SUCCESS)
        text = NULL;
    char call[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call, sizeof call, fmt, ap);
    va_end(ap);
    char num[48];
    if (!name) {
        snprintf(num, sizeof num, "CUDA error %d", (int)rc);
        name = num;
    }
    snprintf(err, errlen, "%s failed: %s (%s)%s%s", call, name, text ? text : "no description", hint ? "; " : "",
             hint ? hint : "");
}

#endif /* HEAPD_HAVE_CUDA_H */
