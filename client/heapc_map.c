/* heapc_map.c - maps heap chunks (memfds or CUDA POSIX fds) into one reserved
 * range per rank. See heapc_map.h. */
#include "heapc_map.h"
#include "heapc_cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void *hm_base(const hm_space *s) { return s ? s->base : NULL; }

int hm_is_mapped(const hm_space *s, uint32_t index) { return s && s->mapped && index < s->nchunks && s->mapped[index]; }

/* Common checks and the bookkeeping arrays; fills everything but base. */
static int space_init(hm_kind kind, uint64_t va_size, uint64_t chunk_size, hm_space *s, char *err, size_t errlen)
{
    if (chunk_size == 0 || va_size == 0)
        return fail(err, errlen, HM_EINVAL,
                    "hm_reserve: va_size (%" PRIu64 ") and chunk_size (%" PRIu64 ") must be "
                    "non-zero",
                    va_size, chunk_size);
    uint64_t n = va_size / chunk_size + (va_size % chunk_size != 0);
    if (n > UINT32_MAX || n > UINT64_MAX / chunk_size || n * chunk_size > (UINT64_MAX >> 1))
        return fail(err, errlen, HM_EINVAL,
                    "hm_reserve: va_size %" PRIu64 " is too large for chunk_size %" PRIu64
                    "; give the heap a smaller va_size",
                    va_size, chunk_size);
    s->kind = kind;
    s->chunk_size = chunk_size;
    s->nchunks = (uint32_t)n;
    s->va_size = n * chunk_size;
    s->mapped = calloc(n, 1);
    if (kind == HM_CUDA)
        s->handles = calloc(n, sizeof *s->handles);
    if (!s->mapped || (kind == HM_CUDA && !s->handles)) {
        free(s->mapped);
        free(s->handles);
        memset(s, 0, sizeof *s);
        return fail(err, errlen, HM_ENOMEM, "hm_reserve: out of host memory for %" PRIu64 " chunk slots", n);
    }
    return HM_OK;
}

static void space_free(hm_space *s)
{
    free(s->mapped);
    free(s->handles);
    memset(s, 0, sizeof *s);
}

/* ---- host --------------------------------------------------------------- */

static int host_reserve(hm_space *s, char *err, size_t errlen)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    if (s->chunk_size % (uint64_t)page != 0)
        return fail(err, errlen, HM_EINVAL, "hm_reserve: chunk_size %" PRIu64 " is not a multiple of the page size %ld",
                    s->chunk_size, page);
    /* Align the base to the largest power of two dividing chunk_size, up to
     * 2 MiB, so that huge pages can back the chunks: over-reserve, then trim
     * both ends. */
    uint64_t align = s->chunk_size & (~s->chunk_size + 1);
    if (align > (2u << 20))
        align = 2u << 20;
    uint64_t len = s->va_size + align - (uint64_t)page;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        return fail(err, errlen, e == ENOMEM ? HM_ENOMEM : HM_ESYS,
                    "reserving %" PRIu64 " bytes of address space failed: %s; give the heap a "
                    "smaller va_size or raise ulimit -v",
                    s->va_size, strerror(e));
    }
    uintptr_t start = (uintptr_t)p;
    uintptr_t base = (start + align - 1) & ~(uintptr_t)(align - 1);
    if (base > start)
        munmap(p, base - start);
    uintptr_t end = start + len, used_end = base + s->va_size;
    if (end > used_end)
        munmap((void *)used_end, end - used_end);
    s->base = (void *)base;
    return HM_OK;
}

_Static_assert(HM_SEALS_NEEDED == (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW), "HM_SEALS_NEEDED");

int hm_check_memfd(int fd, uint64_t need, const char *role, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        return fail(err, errlen, HM_EBADFD, "the fd of %s is not usable: %s", role, strerror(e));
    }
    if (!S_ISREG(st.st_mode))
        return fail(err, errlen, HM_EBADFD, "the fd of %s is not a memfd (not even a file: mode 0%o)", role,
                    (unsigned)(st.st_mode & S_IFMT));
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        int e = errno;
        return fail(err, errlen, HM_EBADFD,
                    "the fd of %s is not a memfd (F_GET_SEALS: %s): heapd hands out sealed memfds only", role,
                    strerror(e));
    }
    if ((seals & HM_SEALS_NEEDED) != HM_SEALS_NEEDED)
        return fail(err, errlen, HM_EBADFD,
                    "the memfd of %s lacks the seals%s%s%s that heapd sets (it has 0x%x): it could be cut short "
                    "under the mapping",
                    role, seals & F_SEAL_SHRINK ? "" : " F_SEAL_SHRINK", seals & F_SEAL_GROW ? "" : " F_SEAL_GROW",
                    seals & F_SEAL_SEAL ? "" : " F_SEAL_SEAL", (unsigned)seals);
    if (st.st_size < 0 || (uint64_t)st.st_size < need)
        return fail(err, errlen, HM_EBADFD, "the memfd of %s holds %lld bytes, less than the %" PRIu64 " needed", role,
                    (long long)st.st_size, need);
    return HM_OK;
}

static int host_map(hm_space *s, uint32_t index, int fd, char *err, size_t errlen)
{
    char role[48];
    snprintf(role, sizeof role, "chunk %" PRIu32, index);
    int rc = hm_check_memfd(fd, s->chunk_size, role, err, errlen);
    if (rc != HM_OK)
        return rc;
    char *at = (char *)s->base + (uint64_t)index * s->chunk_size;
    void *p = mmap(at, s->chunk_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        /* MAP_FIXED failed: the old PROT_NONE mapping may be gone; restore it. */
        mmap(at, s->chunk_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        return fail(err, errlen, e == ENOMEM ? HM_ENOMEM : HM_ESYS,
                    "mapping chunk %" PRIu32 " (%" PRIu64 " bytes) failed: %s", index, s->chunk_size, strerror(e));
    }
    return HM_OK;
}

/* ---- cuda --------------------------------------------------------------- */

#if HEAPD_HAVE_CUDA_H

static int cu_code(CUresult rc) { return rc == CUDA_ERROR_OUT_OF_MEMORY ? HM_ENOMEM : HM_ESYS; }

/* When the thread has no current context, makes the space's primary context
 * current; *entered says whether cu_leave must undo it. */
static int cu_enter(const hc_cuda *cu, hm_space *s, int *entered, char *err, size_t errlen)
{
    CUcontext cur = NULL;
    *entered = 0;
    CUresult rc = cu->CtxGetCurrent(&cur);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuCtxGetCurrent");
        return cu_code(rc);
    }
    if (cur)
        return HM_OK;
    rc = cu->CtxSetCurrent((CUcontext)s->ctx);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuCtxSetCurrent(device %d)", s->device);
        return cu_code(rc);
    }
    *entered = 1;
    return HM_OK;
}

static void cu_leave(const hc_cuda *cu, int entered)
{
    if (entered)
        cu->CtxSetCurrent(NULL);
}

static void cu_prop(int device, CUmemAllocationProp *prop)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = device;
}

/* Checks chunk_size against device's granularity and retains its primary
 * context into *ctx. */
static int cu_bind_device(const hc_cuda *cu, hm_space *s, int device, void **ctx, char *err, size_t errlen)
{
    int n = 0;
    CUresult rc = cu->DeviceGetCount(&n);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuDeviceGetCount");
        return cu_code(rc);
    }
    if (device < 0 || device >= n)
        return fail(err, errlen, HM_EINVAL,
                    "CUDA device %d does not exist: this process sees %d GPU%s (check "
                    "CUDA_VISIBLE_DEVICES)",
                    device, n, n == 1 ? "" : "s");
    CUdevice dev;
    rc = cu->DeviceGet(&dev, device);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuDeviceGet(%d)", device);
        return cu_code(rc);
    }
    CUmemAllocationProp prop;
    cu_prop(dev, &prop);
    size_t g = 0;
    rc = cu->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, "the GPU may lack CUDA VMM or POSIX fd export",
                     "cuMemGetAllocationGranularity(pinned, POSIX fd, device %d)", device);
        return cu_code(rc);
    }
    if (g && s->chunk_size % g != 0)
        return fail(err, errlen, HM_EINVAL,
                    "chunk_size %" PRIu64 " is not a multiple of the allocation granularity %zu "
                    "of CUDA device %d; give the heap a chunk_size that is",
                    s->chunk_size, g, device);
    CUcontext c = NULL;
    rc = cu->DevicePrimaryCtxRetain(&c, dev);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, "check nvidia-smi for the GPU's state and compute mode",
                     "cuDevicePrimaryCtxRetain(device %d)", device);
        return cu_code(rc);
    }
    *ctx = c;
    return HM_OK;
}

static int cuda_reserve(hm_space *s, char *err, size_t errlen)
{
    const hc_cuda *cu = hc_cuda_get(err, errlen);
    if (!cu)
        return HM_EUNAVAIL;
    int device = 0;
    CUcontext cur = NULL;
    if (cu->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur) {
        CUdevice d;
        if (cu->CtxGetDevice(&d) == CUDA_SUCCESS)
            device = (int)d;
    }
    void *ctx = NULL;
    int rcode = cu_bind_device(cu, s, device, &ctx, err, errlen);
    if (rcode)
        return rcode;
    s->device = device;
    s->ctx = ctx;
    int entered;
    rcode = cu_enter(cu, s, &entered, err, errlen);
    if (rcode) {
        cu->DevicePrimaryCtxRelease(device);
        s->ctx = NULL;
        return rcode;
    }
    CUdeviceptr va = 0;
    CUresult rc = cu->MemAddressReserve(&va, s->va_size, 0, 0, 0);
    cu_leave(cu, entered);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, "give the heap a smaller va_size", "cuMemAddressReserve(%" PRIu64 " bytes)",
                     s->va_size);
        cu->DevicePrimaryCtxRelease(device);
        s->ctx = NULL;
        return cu_code(rc);
    }
    s->base = (void *)(uintptr_t)va;
    return HM_OK;
}

static int cuda_map(hm_space *s, uint32_t index, int fd, char *err, size_t errlen)
{
    const hc_cuda *cu = hc_cuda_get(err, errlen);
    if (!cu)
        return HM_EUNAVAIL;
    int entered;
    int rcode = cu_enter(cu, s, &entered, err, errlen);
    if (rcode)
        return rcode;
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)s->base + (CUdeviceptr)index * s->chunk_size;
    CUmemGenericAllocationHandle h = 0;
    int mapped = 0;
    CUresult rc = cu->MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, "the fd must come from heapd's cuda backend",
                     "cuMemImportFromShareableHandle(fd %d, chunk %" PRIu32 ")", fd, index);
        rcode = cu_code(rc);
        goto fail;
    }
    rc = cu->MemMap(at, s->chunk_size, 0, h, 0);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, "the chunk may be smaller than the heap's chunk_size",
                     "cuMemMap(chunk %" PRIu32 ", %" PRIu64 " bytes)", index, s->chunk_size);
        rcode = cu_code(rc);
        goto fail;
    }
    mapped = 1;
    CUmemAccessDesc ad;
    memset(&ad, 0, sizeof ad);
    ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ad.location.id = s->device;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = cu->MemSetAccess(at, s->chunk_size, &ad, 1);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, "a peer's chunk needs peer access between the two GPUs (nvidia-smi topo -p2p rw)",
                     "cuMemSetAccess(chunk %" PRIu32 ", device %d, read/write)", index, s->device);
        rcode = cu_code(rc);
        goto fail;
    }
    cu_leave(cu, entered);
    s->handles[index] = (uint64_t)h;
    return HM_OK;
fail:
    if (mapped)
        cu->MemUnmap(at, s->chunk_size);
    if (h)
        cu->MemRelease(h);
    cu_leave(cu, entered);
    return rcode;
}

/* Unmaps and releases every mapped slot of [from, to) (the context
 * entered). */
static int cuda_unmap_slots_in(const hc_cuda *cu, hm_space *s, uint32_t from, uint32_t to)
{
    int rcode = HM_OK;
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)s->base;
    for (uint32_t i = from; i < to; i++) {
        if (!s->mapped[i])
            continue;
        if (cu->MemUnmap(base + (CUdeviceptr)i * s->chunk_size, s->chunk_size) != CUDA_SUCCESS)
            rcode = HM_ESYS;
        if (cu->MemRelease((CUmemGenericAllocationHandle)s->handles[i]) != CUDA_SUCCESS)
            rcode = HM_ESYS;
        s->mapped[i] = 0;
        s->handles[i] = 0;
        s->nmapped--;
    }
    return rcode;
}

static int cuda_unmap_slots(hm_space *s, uint32_t from, uint32_t to)
{
    const hc_cuda *cu = hc_cuda_get(NULL, 0);
    if (!cu)
        return HM_ESYS;
    int entered = 0;
    if (cu_enter(cu, s, &entered, NULL, 0) != HM_OK)
        return HM_ESYS;
    int rcode = cuda_unmap_slots_in(cu, s, from, to);
    cu_leave(cu, entered);
    return rcode;
}

static int cuda_unmap_all(hm_space *s)
{
    const hc_cuda *cu = hc_cuda_get(NULL, 0);
    if (!cu)
        return HM_ESYS; /* cannot happen: the space was reserved through it */
    int rcode = HM_OK, entered = 0;
    if (cu_enter(cu, s, &entered, NULL, 0) != HM_OK)
        rcode = HM_ESYS;
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)s->base;
    if (cuda_unmap_slots_in(cu, s, 0, s->nchunks) != HM_OK)
        rcode = HM_ESYS;
    if (cu->MemAddressFree(base, s->va_size) != CUDA_SUCCESS)
        rcode = HM_ESYS;
    cu_leave(cu, entered);
    if (s->ctx && cu->DevicePrimaryCtxRelease(s->device) != CUDA_SUCCESS)
        rcode = HM_ESYS;
    return rcode;
}

int hm_set_cuda_device(hm_space *s, int ordinal, char *err, size_t errlen)
{
    if (!s || !s->base || s->kind != HM_CUDA)
        return fail(err, errlen, HM_EINVAL, "hm_set_cuda_device: not a reserved HM_CUDA space");
    if (s->nmapped)
        return fail(err, errlen, HM_EINVAL,
                    "hm_set_cuda_device: %" PRIu32 " chunks are already mapped for device %d; "
                    "choose the device before mapping",
                    s->nmapped, s->device);
    if (ordinal == s->device)
        return HM_OK;
    const hc_cuda *cu = hc_cuda_get(err, errlen);
    if (!cu)
        return HM_EUNAVAIL;
    void *ctx = NULL;
    int rcode = cu_bind_device(cu, s, ordinal, &ctx, err, errlen);
    if (rcode)
        return rcode;
    cu->DevicePrimaryCtxRelease(s->device);
    s->device = ordinal;
    s->ctx = ctx;
    return HM_OK;
}

int hm_cuda_device_by_uuid(const char *uuid, int *ordinal, char *err, size_t errlen)
{
    if (!ordinal)
        return fail(err, errlen, HM_EINVAL, "hm_cuda_device_by_uuid: ordinal is NULL");
    const hc_cuda *cu = hc_cuda_get(err, errlen);
    if (!cu)
        return HM_EUNAVAIL;
    int n = 0;
    CUresult rc = cu->DeviceGetCount(&n);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuDeviceGetCount");
        return cu_code(rc);
    }
    if (!uuid || !*uuid) {
        if (n <= 0)
            return fail(err, errlen, HM_ENOTFOUND, "this process sees no GPU");
        *ordinal = 0;
        return HM_OK;
    }
    unsigned char want[16];
    if (cd_uuid_parse(uuid, want) != 0)
        return fail(err, errlen, HM_EINVAL,
                    "\"%s\" is not a GPU UUID: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx "
                    "as nvidia-smi -L prints it",
                    uuid);
    char seen[768];
    size_t off = 0;
    seen[0] = '\0';
    for (int i = 0; i < n; i++) {
        CUdevice d;
        CUuuid u;
        if ((rc = cu->DeviceGet(&d, i)) != CUDA_SUCCESS || (rc = cu->DeviceGetUuid(&u, d)) != CUDA_SUCCESS) {
            hc_cuda_fail(err, errlen, rc, NULL, "cuDeviceGetUuid(device %d)", i);
            return cu_code(rc);
        }
        if (memcmp(u.bytes, want, 16) == 0) {
            *ordinal = i;
            return HM_OK;
        }
        char one[48];
        cd_uuid_format((const unsigned char *)u.bytes, one, sizeof one);
        if (off < sizeof seen) {
            int k = snprintf(seen + off, sizeof seen - off, "%s%d: %s", i ? ", " : "", i, one);
            if (k > 0)
                off += (size_t)k;
        }
    }
    return fail(err, errlen, HM_ENOTFOUND,
                "this process sees no GPU with UUID %s (it sees %s); check CUDA_VISIBLE_DEVICES", uuid,
                n ? seen : "none");
}

int hm_cuda_device_uuid(int ordinal, char *buf, size_t len, char *err, size_t errlen)
{
    if (!buf || len < 41)
        return fail(err, errlen, HM_EINVAL, "hm_cuda_device_uuid: the buffer must hold at least 41 bytes");
    const hc_cuda *cu = hc_cuda_get(err, errlen);
    if (!cu)
        return HM_EUNAVAIL;
    int n = 0;
    CUresult rc = cu->DeviceGetCount(&n);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuDeviceGetCount");
        return cu_code(rc);
    }
    if (ordinal < 0 || ordinal >= n)
        return fail(err, errlen, HM_EINVAL, "CUDA device %d does not exist: this process sees %d GPU%s", ordinal, n,
                    n == 1 ? "" : "s");
    CUdevice d;
    CUuuid u;
    if ((rc = cu->DeviceGet(&d, ordinal)) != CUDA_SUCCESS || (rc = cu->DeviceGetUuid(&u, d)) != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuDeviceGetUuid(device %d)", ordinal);
        return cu_code(rc);
    }
    cd_uuid_format((const unsigned char *)u.bytes, buf, len);
    return HM_OK;
}

int hm_cuda_current_device(int *ordinal, char *err, size_t errlen)
{
    if (!ordinal)
        return fail(err, errlen, HM_EINVAL, "hm_cuda_current_device: ordinal is NULL");
    const hc_cuda *cu = hc_cuda_get(err, errlen);
    if (!cu)
        return HM_EUNAVAIL;
    CUcontext cur = NULL;
    CUresult rc = cu->CtxGetCurrent(&cur);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuCtxGetCurrent");
        return cu_code(rc);
    }
    if (!cur)
        return fail(err, errlen, HM_ENOTFOUND,
                    "this thread has no current CUDA context: select the rank's GPU first "
                    "(cudaSetDevice)");
    CUdevice d;
    rc = cu->CtxGetDevice(&d);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuCtxGetDevice");
        return cu_code(rc);
    }
    *ordinal = (int)d;
    return HM_OK;
}

#else /* !HEAPD_HAVE_CUDA_H */

#define NO_CUDA_MSG                                                                                                    \
    "libheapc was built without CUDA headers, so it cannot map GPU chunks: rebuild it with "                           \
    "the CUDA toolkit installed (CUDA_HOME=/usr/local/cuda), or use a host-backend heap"

static int cuda_reserve(hm_space *s, char *err, size_t errlen)
{
    (void)s;
    return fail(err, errlen, HM_EUNAVAIL, NO_CUDA_MSG);
}

static int cuda_map(hm_space *s, uint32_t index, int fd, char *err, size_t errlen)
{
    (void)s;
    (void)index;
    (void)fd;
    return fail(err, errlen, HM_EUNAVAIL, NO_CUDA_MSG);
}

static int cuda_unmap_all(hm_space *s)
{
    (void)s;
    return HM_ESYS;
}

static int cuda_unmap_slots(hm_space *s, uint32_t from, uint32_t to)
{
    (void)s, (void)from, (void)to;
    return HM_ESYS;
}

int hm_set_cuda_device(hm_space *s, int ordinal, char *err, size_t errlen)
{
    (void)s;
    (void)ordinal;
    return fail(err, errlen, HM_EUNAVAIL, NO_CUDA_MSG);
}

int hm_cuda_device_by_uuid(const char *uuid, int *ordinal, char *err, size_t errlen)
{
    (void)uuid;
    (void)ordinal;
    return fail(err, errlen, HM_EUNAVAIL, NO_CUDA_MSG);
}

int hm_cuda_device_uuid(int ordinal, char *buf, size_t len, char *err, size_t errlen)
{
    (void)ordinal;
    (void)buf;
    (void)len;
    return fail(err, errlen, HM_EUNAVAIL, NO_CUDA_MSG);
}

int hm_cuda_current_device(int *ordinal, char *err, size_t errlen)
{
    (void)ordinal;
    return fail(err, errlen, HM_EUNAVAIL, NO_CUDA_MSG);
}

#endif /* HEAPD_HAVE_CUDA_H */

/* ---- dispatch ----------------------------------------------------------- */

int hm_reserve(hm_kind kind, uint64_t va_size, uint64_t chunk_size, hm_space *out, char *err, size_t errlen)
{
    if (!out)
        return fail(err, errlen, HM_EINVAL, "hm_reserve: out is NULL");
    memset(out, 0, sizeof *out);
    if (kind != HM_HOST && kind != HM_CUDA)
        return fail(err, errlen, HM_EINVAL, "hm_reserve: unknown kind %d", (int)kind);
    int rc = space_init(kind, va_size, chunk_size, out, err, errlen);
    if (rc)
        return rc;
    rc = kind == HM_HOST ? host_reserve(out, err, errlen) : cuda_reserve(out, err, errlen);
    if (rc)
        space_free(out);
    return rc;
}

int hm_map_chunk(hm_space *s, uint32_t index, int fd, char *err, size_t errlen)
{
    if (!s || !s->base)
        return fail(err, errlen, HM_EINVAL, "hm_map_chunk: the space is not reserved");
    if (index >= s->nchunks)
        return fail(err, errlen, HM_EINVAL,
                    "hm_map_chunk: chunk %" PRIu32 " is past the end of the range (%" PRIu32 " chunks of %" PRIu64
                    " bytes); the heap would exceed its va_size",
                    index, s->nchunks, s->chunk_size);
    if (s->mapped[index])
        return fail(err, errlen, HM_EINVAL, "hm_map_chunk: chunk %" PRIu32 " is already mapped", index);
    if (fd < 0)
        return fail(err, errlen, HM_EINVAL, "hm_map_chunk: chunk %" PRIu32 " has no fd (%d)", index, fd);
    int rc = s->kind == HM_HOST ? host_map(s, index, fd, err, errlen) : cuda_map(s, index, fd, err, errlen);
    if (rc == HM_OK) {
        s->mapped[index] = 1;
        s->nmapped++;
    }
    return rc;
}

int hm_unmap_range(hm_space *s, uint32_t from, uint32_t to)
{
    if (!s || !s->base)
        return HM_OK;
    if (to > s->nchunks)
        to = s->nchunks;
    if (from >= to)
        return HM_OK;
    if (s->kind != HM_HOST)
        return cuda_unmap_slots(s, from, to);
    int rc = HM_OK;
    for (uint32_t i = from; i < to; i++) {
        if (!s->mapped[i])
            continue;
        void *at = (char *)s->base + (uint64_t)i * s->chunk_size;
        if (mmap(at, s->chunk_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) ==
            MAP_FAILED)
            rc = HM_ESYS;
        s->mapped[i] = 0;
        s->nmapped--;
    }
    return rc;
}

int hm_unmap_chunks(hm_space *s) { return hm_unmap_range(s, 0, s ? s->nchunks : 0); }

int hm_unmap_all(hm_space *s)
{
    if (!s || !s->base) {
        if (s)
            space_free(s);
        return HM_OK;
    }
    int rc = HM_OK;
    if (s->kind == HM_HOST) {
        if (munmap(s->base, s->va_size) != 0)
            rc = HM_ESYS;
    } else {
        rc = cuda_unmap_all(s);
    }
    space_free(s);
    return rc;
}
