/* heapc_cuda.h - libheapc's loader for the CUDA driver API.
 *
 * What the module promises:
 *   - libcuda.so.1 is loaded on first use (common/cuda_dl.h, the one loader)
 *     and cuInit(0) is called once; libheapc never links libcuda, so it
 *     loads on machines without a GPU and only the CUDA paths fail there,
 *     with a message.
 *   - The table is loaded once per process (pthread_once), never unloaded,
 *     and is the module's only global state; hc_cuda_get is thread-safe.
 *   - Entry points are the versioned symbols cuda.h maps the names to
 *     (cuDevicePrimaryCtxRelease_v2, cuDeviceGetUuid_v2, ...).
 *   - Without cuda.h at build time (HEAPD_HAVE_CUDA_H unset) nothing here
 *     exists; client code must guard its CUDA paths the same way. The UUID
 *     helpers are cuda_dl.h's.
 *
 * heapd's daemon has its own table (daemon/backend_cuda.c) over the same
 * loader: it does not link libheapc.
 */
#ifndef HEAPC_CUDA_H
#define HEAPC_CUDA_H

#include <stddef.h>

#include "cuda_dl.h"

#if HEAPD_HAVE_CUDA_H
#include <cuda.h>

typedef struct hc_cuda {
    __typeof__(cuGetErrorName) *GetErrorName;
    __typeof__(cuGetErrorString) *GetErrorString;
    __typeof__(cuInit) *Init;
    __typeof__(cuDeviceGetCount) *DeviceGetCount;
    __typeof__(cuDeviceGet) *DeviceGet;
    __typeof__(cuDeviceGetUuid_v2) *DeviceGetUuid;
    __typeof__(cuDevicePrimaryCtxRetain) *DevicePrimaryCtxRetain;
    __typeof__(cuDevicePrimaryCtxRelease_v2) *DevicePrimaryCtxRelease;
    __typeof__(cuCtxGetCurrent) *CtxGetCurrent;
    __typeof__(cuCtxSetCurrent) *CtxSetCurrent;
    __typeof__(cuCtxGetDevice) *CtxGetDevice;
    __typeof__(cuCtxSynchronize) *CtxSynchronize;
    __typeof__(cuMemGetAllocationGranularity) *MemGetAllocationGranularity;
    __typeof__(cuMemAddressReserve) *MemAddressReserve;
    __typeof__(cuMemAddressFree) *MemAddressFree;
    __typeof__(cuMemImportFromShareableHandle) *MemImportFromShareableHandle;
    __typeof__(cuMemMap) *MemMap;
    __typeof__(cuMemUnmap) *MemUnmap;
    __typeof__(cuMemSetAccess) *MemSetAccess;
    __typeof__(cuMemRelease) *MemRelease;
    /* stream-ordered frees (heapc_fence.c) */
    __typeof__(cuEventCreate) *EventCreate;
    __typeof__(cuEventRecord) *EventRecord;
    __typeof__(cuEventQuery) *EventQuery;
    __typeof__(cuEventDestroy_v2) *EventDestroy;
    /* stream-ordered reuse (issue 27) */
    __typeof__(cuEventSynchronize) *EventSynchronize;
    __typeof__(cuStreamWaitEvent) *StreamWaitEvent;
} hc_cuda;

/* The loaded table, cuInit done; NULL with a message in err when libcuda is
 * missing, too old, or cuInit fails (no GPU). */
const hc_cuda *hc_cuda_get(char *err, size_t errlen);

/* Writes "<call> failed: CUDA_ERROR_X (text)[; hint]" into err, where call
 * is formatted from fmt. */
void hc_cuda_fail(char *err, size_t errlen, CUresult rc, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif /* HEAPD_HAVE_CUDA_H */

#endif /* HEAPC_CUDA_H */
