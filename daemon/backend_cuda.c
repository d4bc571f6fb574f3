/* backend_cuda.c - the "cuda" backend: CUDA VMM chunks (cuMemCreate, pinned
 * device memory) exported once as POSIX fds. libcuda.so.1 is loaded through
 * common/cuda_dl.h (the one loader) at the first hb_cuda_open; heapd never
 * links it. See backend.h.
 *
 * This file keeps its own small table of driver entry points: the daemon
 * does not link libheapc, whose client/heapc_cuda.c has the client's. */
#define HEAPD_BACKEND_IMPL 1
#include "backend.h"
#include "cuda_dl.h"

#if !HEAPD_HAVE_CUDA_H

int hb_cuda_open(hb_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    return hb_fail(err, errlen, HB_EUNAVAIL,
                   "heapd was built without CUDA headers, so the cuda backend is unavailable: "
                   "rebuild with the CUDA toolkit installed (CUDA_HOME=/usr/local/cuda), or use "
                   "the host backend");
}

#else /* HEAPD_HAVE_CUDA_H */

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the driver entry points (the module's only global) ----------------- */

static struct cu_api {
    int status;    /* HB_OK once loaded, else the open error */
    char err[320]; /* why loading failed */
    void *lib;
    __typeof__(cuGetErrorName) *GetErrorName;
    __typeof__(cuGetErrorString) *GetErrorString;
    __typeof__(cuInit) *Init;
    __typeof__(cuDriverGetVersion) *DriverGetVersion;
    __typeof__(cuDeviceGetCount) *DeviceGetCount;
    __typeof__(cuDeviceGet) *DeviceGet;
    __typeof__(cuDeviceGetAttribute) *DeviceGetAttribute;
    __typeof__(cuDeviceGetUuid_v2) *DeviceGetUuid;
    __typeof__(cuDevicePrimaryCtxRetain) *DevicePrimaryCtxRetain;
    __typeof__(cuDevicePrimaryCtxRelease_v2) *DevicePrimaryCtxRelease;
    __typeof__(cuCtxGetCurrent) *CtxGetCurrent;
    __typeof__(cuCtxSetCurrent) *CtxSetCurrent;
    __typeof__(cuCtxSynchronize) *CtxSynchronize;
    __typeof__(cuMemGetInfo_v2) *MemGetInfo;
    __typeof__(cuMemGetAllocationGranularity) *MemGetAllocationGranularity;
    __typeof__(cuMemCreate) *MemCreate;
    __typeof__(cuMemRelease) *MemRelease;
    __typeof__(cuMemExportToShareableHandle) *MemExportToShareableHandle;
    __typeof__(cuMemAddressReserve) *MemAddressReserve;
    __typeof__(cuMemAddressFree) *MemAddressFree;
    __typeof__(cuMemMap) *MemMap;
    __typeof__(cuMemUnmap) *MemUnmap;
    __typeof__(cuMemSetAccess) *MemSetAccess;
    __typeof__(cuMemsetD8_v2) *MemsetD8;
    /* Issue 30: the host copy of a released heap. */
    __typeof__(cuMemcpyDtoH_v2) *MemcpyDtoH;
    __typeof__(cuMemcpyHtoD_v2) *MemcpyHtoD;
    __typeof__(cuMemHostRegister_v2) *MemHostRegister;
    __typeof__(cuMemHostUnregister) *MemHostUnregister;
} cu;

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
    cu.status = HB_EUNAVAIL;
    char why[128]; /* dlerror's reason, cut short to fit err */
    cu.lib = cd_open(why, sizeof why);
    if (!cu.lib) {
        snprintf(cu.err, sizeof cu.err,
                 "the cuda backend is unavailable: no NVIDIA driver was found (dlopen of "
                 "libcuda.so.1 failed: %s); use the host backend on machines without a GPU, "
                 "or install the NVIDIA driver",
                 why);
        return;
    }
    const cd_sym syms[] = {
        {(void **)&cu.GetErrorName, "cuGetErrorName", NULL},
        {(void **)&cu.GetErrorString, "cuGetErrorString", NULL},
        {(void **)&cu.Init, "cuInit", NULL},
        {(void **)&cu.DriverGetVersion, "cuDriverGetVersion", NULL},
        {(void **)&cu.DeviceGetCount, "cuDeviceGetCount", NULL},
        {(void **)&cu.DeviceGet, "cuDeviceGet", NULL},
        {(void **)&cu.DeviceGetAttribute, "cuDeviceGetAttribute", NULL},
        {(void **)&cu.DeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid"},
        {(void **)&cu.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL},
        {(void **)&cu.DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", NULL},
        {(void **)&cu.CtxGetCurrent, "cuCtxGetCurrent", NULL},
        {(void **)&cu.CtxSetCurrent, "cuCtxSetCurrent", NULL},
        {(void **)&cu.CtxSynchronize, "cuCtxSynchronize", NULL},
        {(void **)&cu.MemGetInfo, "cuMemGetInfo_v2", NULL},
        {(void **)&cu.MemGetAllocationGranularity, "cuMemGetAllocationGranularity", NULL},
        {(void **)&cu.MemCreate, "cuMemCreate", NULL},
        {(void **)&cu.MemRelease, "cuMemRelease", NULL},
        {(void **)&cu.MemExportToShareableHandle, "cuMemExportToShareableHandle", NULL},
        {(void **)&cu.MemAddressReserve, "cuMemAddressReserve", NULL},
        {(void **)&cu.MemAddressFree, "cuMemAddressFree", NULL},
        {(void **)&cu.MemMap, "cuMemMap", NULL},
        {(void **)&cu.MemUnmap, "cuMemUnmap", NULL},
        {(void **)&cu.MemSetAccess, "cuMemSetAccess", NULL},
        {(void **)&cu.MemsetD8, "cuMemsetD8_v2", NULL},
        {(void **)&cu.MemcpyDtoH, "cuMemcpyDtoH_v2", NULL},
        {(void **)&cu.MemcpyHtoD, "cuMemcpyHtoD_v2", NULL},
        {(void **)&cu.MemHostRegister, "cuMemHostRegister_v2", NULL},
        {(void **)&cu.MemHostUnregister, "cuMemHostUnregister", NULL},
    };
    const char *missing;
    if (cd_resolve(cu.lib, syms, sizeof syms / sizeof syms[0], &missing)) {
        snprintf(cu.err, sizeof cu.err,
                 "libcuda.so.1 has no %s: the NVIDIA driver is too old for heapd's cuda "
                 "backend (it needs CUDA VMM, driver 450 or newer); update the driver",
                 missing);
        cu.status = HB_ESYS;
        return;
    }
    cu.status = HB_OK;
}

/* "cuX(...) failed: CUDA_ERROR_Y (text)[; hint]" into err; returns the status
 * the CUDA error maps to. */
static int cu_fail(char *err, size_t errlen, CUresult rc, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int cu_fail(char *err, size_t errlen, CUresult rc, const char *hint, const char *fmt, ...)
{
    int code = rc == CUDA_ERROR_OUT_OF_MEMORY ? HB_ENOMEM : HB_ESYS;
    if (!err || !errlen)
        return code;
    const char *name = NULL, *text = NULL;
    if (cu.GetErrorName && cu.GetErrorName(rc, &name) != CUDA_SUCCESS)
        name = NULL;
    if (cu.GetErrorString && cu.GetErrorString(rc, &text) != CUDA_SUCCESS)
        text = NULL;
    char call[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call, sizeof call, fmt, ap);
    va_end(ap);
    char cuerr[48];
    if (!name) {
        snprintf(cuerr, sizeof cuerr, "CUDA error %d", (int)rc);
        name = cuerr;
    }
    snprintf(err, errlen, "%s failed: %s (%s)%s%s", call, name, text ? text : "no description", hint ? "; " : "",
             hint ? hint : "");
    return code;
}

/* ---- backend state ------------------------------------------------------ */

typedef struct cu_dev {
    CUdevice dev;
    unsigned char uuid_bytes[16];
    char uuid[HB_UUID_LEN];
    uint64_t gran; /* 0: heapd cannot use the device (why says why) */
    int rdma;      /* allocations may be GPUDirect RDMA capable */
    CUcontext ctx; /* retained primary context, NULL until first use */
    char why[200];
} cu_dev;

typedef struct cuda_backend {
    hb_backend base;
    int ndev;
    cu_dev *devs;
} cuda_backend;

#define CB(be)  ((cuda_backend *)(be))
#define CCB(be) ((const cuda_backend *)(be))

/* Makes device d's primary context current (retaining it on first use);
 * *prev receives the thread's previous context for ctx_leave. */
static int ctx_enter(cuda_backend *cb, int d, CUcontext *prev, char *err, size_t errlen)
{
    cu_dev *dv = &cb->devs[d];
    CUresult rc;
    if (!dv->ctx) {
        rc = cu.DevicePrimaryCtxRetain(&dv->ctx, dv->dev);
        if (rc != CUDA_SUCCESS) {
            dv->ctx = NULL;
            return cu_fail(err, errlen, rc, "check nvidia-smi for the GPU's state and compute mode",
                           "cuDevicePrimaryCtxRetain(device %d)", d);
        }
    }
    *prev = NULL;
    rc = cu.CtxGetCurrent(prev);
    if (rc != CUDA_SUCCESS)
        return cu_fail(err, errlen, rc, NULL, "cuCtxGetCurrent");
    if (*prev != dv->ctx) {
        rc = cu.CtxSetCurrent(dv->ctx);
        if (rc != CUDA_SUCCESS)
            return cu_fail(err, errlen, rc, NULL, "cuCtxSetCurrent(device %d)", d);
    }
    return HB_OK;
}

static void ctx_leave(cuda_backend *cb, int d, CUcontext prev)
{
    if (prev != cb->devs[d].ctx)
        cu.CtxSetCurrent(prev);
}

static void cuda_close(hb_backend *be)
{
    cuda_backend *cb = CB(be);
    for (int i = 0; i < cb->ndev; i++)
        if (cb->devs[i].ctx)
            cu.DevicePrimaryCtxRelease(cb->devs[i].dev);
    free(cb->devs);
    free(cb);
}

static int cuda_device_count(const hb_backend *be) { return CCB(be)->ndev; }

static int cuda_device_from_uuid(const hb_backend *be, const char *uuid, int *index, char *err, size_t errlen)
{
    const cuda_backend *cb = CCB(be);
    if (uuid[0] == '\0') {
        *index = 0;
        return HB_OK;
    }
    unsigned char want[16];
    int parsed = cd_uuid_parse(uuid, want) == 0;
    if (parsed)
        for (int i = 0; i < cb->ndev; i++)
            if (memcmp(want, cb->devs[i].uuid_bytes, 16) == 0) {
                *index = i;
                return HB_OK;
            }
    char seen[1024];
    size_t off = 0;
    seen[0] = '\0';
    for (int i = 0; i < cb->ndev && off < sizeof seen; i++) {
        int n = snprintf(seen + off, sizeof seen - off, "%s%d: %s", i ? ", " : "", i, cb->devs[i].uuid);
        if (n < 0)
            break;
        off += (size_t)n;
    }
    if (!parsed)
        return hb_fail(err, errlen, HB_EINVAL,
                       "\"%s\" is not a GPU UUID (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx "
                       "as nvidia-smi -L prints it); heapd sees %s",
                       uuid, seen);
    return hb_fail(err, errlen, HB_ENOTFOUND,
                   "no GPU of this node has UUID %s; heapd sees %s: name one of these, and check "
                   "that the rank runs on the same node as this heapd",
                   uuid, seen);
}

static int cuda_device_uuid(const hb_backend *be, int index, char *buf, size_t len)
{
    const char *u = CCB(be)->devs[index].uuid;
    if (strlen(u) >= len)
        return HB_EINVAL;
    memcpy(buf, u, strlen(u) + 1);
    return HB_OK;
}

static uint64_t cuda_granularity(const hb_backend *be, int device) { return CCB(be)->devs[device].gran; }

static void alloc_prop(const cu_dev *dv, CUmemAllocationProp *prop)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dv->dev;
    prop->allocFlags.gpuDirectRDMACapable = dv->rdma ? 1 : 0;
}

/* Maps handle's size bytes at a fresh *va, read/write for device d (the
 * device's context must be current); unmap_handle undoes it. */
static int map_handle(cuda_backend *cb, int d, CUmemGenericAllocationHandle h, uint64_t size, CUdeviceptr *va,
                      const char *why, char *err, size_t errlen)
{
    cu_dev *dv = &cb->devs[d];
    *va = 0;
    CUresult rc = cu.MemAddressReserve(va, size, dv->gran, 0, 0);
    if (rc != CUDA_SUCCESS)
        return cu_fail(err, errlen, rc, NULL, "cuMemAddressReserve(%" PRIu64 " bytes) to %s a chunk", size, why);
    rc = cu.MemMap(*va, size, 0, h, 0);
    if (rc != CUDA_SUCCESS) {
        cu.MemAddressFree(*va, size);
        return cu_fail(err, errlen, rc, NULL, "cuMemMap(%" PRIu64 " bytes, device %d) to %s a chunk", size, d, why);
    }
    CUmemAccessDesc ad;
    memset(&ad, 0, sizeof ad);
    ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ad.location.id = dv->dev;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = cu.MemSetAccess(*va, size, &ad, 1);
    if (rc != CUDA_SUCCESS) {
        cu.MemUnmap(*va, size);
        cu.MemAddressFree(*va, size);
        return cu_fail(err, errlen, rc, NULL, "cuMemSetAccess(%" PRIu64 " bytes, device %d)", size, d);
    }
    return HB_OK;
}

static void unmap_handle(CUdeviceptr va, uint64_t size)
{
    cu.MemUnmap(va, size);
    cu.MemAddressFree(va, size);
}

/* Zeroes handle's size bytes through a temporary mapping; the device's
 * context must be current. */
static int zero_handle(cuda_backend *cb, int d, CUmemGenericAllocationHandle h, uint64_t size, char *err, size_t errlen)
{
    CUdeviceptr va;
    int rcode = map_handle(cb, d, h, size, &va, "zero", err, errlen);
    if (rcode)
        return rcode;
    CUresult rc = cu.MemsetD8(va, 0, size);
    if (rc != CUDA_SUCCESS)
        rcode = cu_fail(err, errlen, rc, NULL, "cuMemsetD8(%" PRIu64 " bytes, device %d)", size, d);
    else if ((rc = cu.CtxSynchronize()) != CUDA_SUCCESS)
        rcode = cu_fail(err, errlen, rc, "the GPU may need a reset (nvidia-smi)",
                        "cuCtxSynchronize(device %d) after zeroing a chunk", d);
    unmap_handle(va, size);
    return rcode;
}

static int cuda_chunk_create(hb_backend *be, int device, uint64_t size, hb_chunk *out, char *err, size_t errlen)
{
    cuda_backend *cb = CB(be);
    cu_dev *dv = &cb->devs[device];
    if (!dv->gran)
        return hb_fail(err, errlen, HB_EUNAVAIL, "%s", dv->why);
    CUcontext prev;
    int rcode = ctx_enter(cb, device, &prev, err, errlen);
    if (rcode)
        return rcode;
    CUmemAllocationProp prop;
    alloc_prop(dv, &prop);
    CUmemGenericAllocationHandle h = 0;
    int fd = -1;
    CUresult rc = cu.MemCreate(&h, size, &prop, 0);
    if (rc != CUDA_SUCCESS) {
        rcode = cu_fail(err, errlen, rc,
                        rc == CUDA_ERROR_OUT_OF_MEMORY
                            ? "the GPU is full: free memory on it or give heaps a smaller va_size"
                            : NULL,
                        "cuMemCreate(%" PRIu64 " bytes, device %d)", size, device);
        goto out;
    }
    rc = cu.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (rc != CUDA_SUCCESS) {
        fd = -1;
        rcode = cu_fail(err, errlen, rc, "raise heapd's open-file limit if it is exhausted",
                        "cuMemExportToShareableHandle(POSIX fd, %" PRIu64 " bytes, device %d)", size, device);
        goto out;
    }
    int fl = fcntl(fd, F_GETFD);
    if (fl >= 0)
        fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    rcode = zero_handle(cb, device, h, size, err, errlen);
    if (rcode)
        goto out;
    out->fd = fd;
    out->device = device;
    out->size = size;
    out->handle = (uint64_t)h;
    ctx_leave(cb, device, prev);
    return HB_OK;
out:
    if (fd >= 0)
        close(fd);
    if (h)
        cu.MemRelease(h);
    ctx_leave(cb, device, prev);
    return rcode;
}

static void cuda_chunk_release(hb_backend *be, hb_chunk *c)
{
    (void)be;
    if (c->fd >= 0)
        close(c->fd);
    if (c->handle)
        cu.MemRelease((CUmemGenericAllocationHandle)c->handle);
}

static int cuda_chunk_scrub(hb_backend *be, hb_chunk *c, char *err, size_t errlen)
{
    cuda_backend *cb = CB(be);
    if (!c->handle)
        return hb_fail(err, errlen, HB_EINVAL, "hb_chunk_scrub: the chunk has no CUDA allocation");
    CUcontext prev;
    int rcode = ctx_enter(cb, c->device, &prev, err, errlen);
    if (rcode)
        return rcode;
    rcode = zero_handle(cb, c->device, (CUmemGenericAllocationHandle)c->handle, c->size, err, errlen);
    ctx_leave(cb, c->device, prev);
    return rcode;
}

/* Issue 30: c's bytes to host memory (save) or back (load), through a
 * temporary mapping; synchronous (cuMemcpy). */
static int cuda_chunk_copy(hb_backend *be, hb_chunk *c, void *host, int save, char *err, size_t errlen)
{
    cuda_backend *cb = CB(be);
    if (!c->handle)
        return hb_fail(err, errlen, HB_EINVAL, "the chunk has no CUDA allocation");
    CUcontext prev;
    int rcode = ctx_enter(cb, c->device, &prev, err, errlen);
    if (rcode)
        return rcode;
    CUdeviceptr va;
    rcode = map_handle(cb, c->device, (CUmemGenericAllocationHandle)c->handle, c->size, &va, save ? "save" : "load",
                       err, errlen);
    if (!rcode) {
        CUresult rc = save ? cu.MemcpyDtoH(host, va, c->size) : cu.MemcpyHtoD(va, host, c->size);
        if (rc != CUDA_SUCCESS)
            rcode =
                cu_fail(err, errlen, rc, "the GPU may need a reset (nvidia-smi)", "%s(%" PRIu64 " bytes, device %d)",
                        save ? "cuMemcpyDtoH" : "cuMemcpyHtoD", c->size, c->device);
        unmap_handle(va, c->size);
    }
    ctx_leave(cb, c->device, prev);
    return rcode;
}

static int cuda_host_pin(hb_backend *be, void *p, uint64_t len, int pin, char *err, size_t errlen)
{
    cuda_backend *cb = CB(be);
    CUcontext prev;
    int rcode = ctx_enter(cb, 0, &prev, err, errlen);
    if (rcode)
        return rcode;
    CUresult rc = pin ? cu.MemHostRegister(p, len, CU_MEMHOSTREGISTER_PORTABLE) : cu.MemHostUnregister(p);
    ctx_leave(cb, 0, prev);
    if (rc != CUDA_SUCCESS)
        return cu_fail(err, errlen, rc,
                       "raise heapd's RLIMIT_MEMLOCK (LimitMEMLOCK= in its unit) or use a smaller heap",
                       "%s(%" PRIu64 " bytes of host memory)", pin ? "cuMemHostRegister" : "cuMemHostUnregister", len);
    return HB_OK;
}

static int cuda_meminfo(hb_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes, char *err,
                        size_t errlen)
{
    cuda_backend *cb = CB(be);
    CUcontext prev;
    int rcode = ctx_enter(cb, device, &prev, err, errlen);
    if (rcode)
        return rcode;
    size_t f = 0, t = 0;
    CUresult rc = cu.MemGetInfo(&f, &t);
    ctx_leave(cb, device, prev);
    if (rc != CUDA_SUCCESS)
        return cu_fail(err, errlen, rc, NULL, "cuMemGetInfo(device %d)", device);
    *free_bytes = f;
    *total_bytes = t;
    return HB_OK;
}

static const hb_ops cuda_ops = {
    .name = "cuda",
    .close = cuda_close,
    .device_count = cuda_device_count,
    .device_from_uuid = cuda_device_from_uuid,
    .device_uuid = cuda_device_uuid,
    .granularity = cuda_granularity,
    .chunk_create = cuda_chunk_create,
    .chunk_release = cuda_chunk_release,
    .chunk_scrub = cuda_chunk_scrub,
    .chunk_copy = cuda_chunk_copy,
    .host_pin = cuda_host_pin,
    .meminfo = cuda_meminfo,
};

/* Fills what heapd needs to know about device i; a device that lacks VMM or
 * POSIX fd export keeps gran 0 and a reason. */
static int probe_device(cu_dev *dv, int i, char *err, size_t errlen)
{
    CUresult rc = cu.DeviceGet(&dv->dev, i);
    if (rc != CUDA_SUCCESS)
        return cu_fail(err, errlen, rc, NULL, "cuDeviceGet(%d)", i);
    CUuuid u;
    rc = cu.DeviceGetUuid(&u, dv->dev);
    if (rc != CUDA_SUCCESS)
        return cu_fail(err, errlen, rc, NULL, "cuDeviceGetUuid(device %d)", i);
    memcpy(dv->uuid_bytes, u.bytes, 16);
    cd_uuid_format(dv->uuid_bytes, dv->uuid, sizeof dv->uuid);

    int vmm = 0, posix = 0, rdma = 0;
    rc = cu.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dv->dev);
    if (rc != CUDA_SUCCESS)
        return cu_fail(err, errlen, rc, NULL, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device %d)",
                       i);
    rc = cu.DeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dv->dev);
    if (rc != CUDA_SUCCESS)
        posix = 0;
    rc = cu.DeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dv->dev);
    if (rc != CUDA_SUCCESS)
        rdma = 0;
    dv->rdma = rdma;
    if (!vmm) {
        snprintf(dv->why, sizeof dv->why,
                 "GPU %d (%s) does not support CUDA virtual memory management, which heapd "
                 "needs; serve it from a newer GPU or driver",
                 i, dv->uuid);
        return HB_OK;
    }
    if (!posix) {
        snprintf(dv->why, sizeof dv->why,
                 "GPU %d (%s) cannot export memory as POSIX file descriptors, which heapd "
                 "needs to share chunks with ranks; check the driver version",
                 i, dv->uuid);
        return HB_OK;
    }
    CUmemAllocationProp prop;
    alloc_prop(dv, &prop);
    size_t g = 0;
    rc = cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc != CUDA_SUCCESS || g == 0) {
        cu_fail(dv->why, sizeof dv->why, rc, NULL, "cuMemGetAllocationGranularity(pinned, POSIX fd, device %d)", i);
        return HB_OK;
    }
    dv->gran = g;
    return HB_OK;
}

int hb_cuda_open(hb_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    pthread_once(&cu_once, cu_load);
    if (cu.status != HB_OK)
        return hb_fail(err, errlen, cu.status, "%s", cu.err);

    CUresult rc = cu.Init(0);
    if (rc != CUDA_SUCCESS) {
        /* No usable GPU: the caller may fall back to the host backend. */
        cu_fail(err, errlen, rc,
                "the NVIDIA driver found no usable GPU; use the host backend on machines "
                "without a GPU",
                "cuInit");
        return HB_EUNAVAIL;
    }
    int n = 0;
    rc = cu.DeviceGetCount(&n);
    if (rc != CUDA_SUCCESS) {
        cu_fail(err, errlen, rc, NULL, "cuDeviceGetCount");
        return HB_EUNAVAIL;
    }
    if (n <= 0)
        return hb_fail(err, errlen, HB_EUNAVAIL,
                       "the NVIDIA driver is loaded but no GPU was found (check "
                       "CUDA_VISIBLE_DEVICES and nvidia-smi); use the host backend on machines "
                       "without a GPU");

    cuda_backend *cb = calloc(1, sizeof *cb);
    cu_dev *devs = calloc((size_t)n, sizeof *devs);
    if (!cb || !devs) {
        free(cb);
        free(devs);
        return hb_fail(err, errlen, HB_ENOMEM, "out of host memory opening the cuda backend");
    }
    cb->base.ops = &cuda_ops;
    cb->ndev = n;
    cb->devs = devs;
    for (int i = 0; i < n; i++) {
        int rcode = probe_device(&devs[i], i, err, errlen);
        if (rcode) {
            cuda_close(&cb->base);
            return rcode;
        }
    }
    *out = &cb->base;
    return HB_OK;
}

#endif /* HEAPD_HAVE_CUDA_H */
