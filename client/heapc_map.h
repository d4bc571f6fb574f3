/* heapc_map.h - libheapc's mapping of heap chunks into a rank's address space.
 *
 * An hm_space is one reserved virtual range for one rank's copy of a heap
 * (the client's own and one per local peer). Chunk k of that rank is mapped
 * at base + k * chunk_size, so heap offsets are plain additions to base.
 *
 *   HM_HOST  base is a host address. The range is reserved with an anonymous
 *            PROT_NONE MAP_NORESERVE mapping; a chunk (a sealed memfd from
 *            heapd's host backend, checked by hm_check_memfd) replaces its
 *            slot with a MAP_SHARED read/write mapping. Unmapped slots
 *            fault on access.
 *   HM_CUDA  base is a CUDA device address (unified addressing): the range is
 *            reserved with cuMemAddressReserve; a chunk (a POSIX fd exported
 *            by heapd's cuda backend, on this rank's GPU or a local peer's) is
 *            imported with cuMemImportFromShareableHandle, mapped with
 *            cuMemMap and made read/write for the space's device.
 *
 * What the module promises:
 *   - hm_map_chunk never takes ownership of fd: the caller may (and should)
 *     close it once the call returns, whether it succeeded or not. The mapping
 *     (host) or the imported allocation handle (cuda) holds its own
 *     reference to the memory.
 *   - A failed call leaves the space as it was (no half-mapped slot).
 *   - hm_unmap_all unmaps every chunk, releases the CUDA handles and the VA
 *     reservation, and leaves *s zeroed (base NULL); calling it again, or on
 *     a zeroed hm_space, is a no-op. Before it, the caller must make sure no
 *     device work still touches the range (device or stream sync).
 *   - HM_CUDA calls work with or without a current CUDA context: when the
 *     thread has none, the space's device's primary context (retained by
 *     hm_reserve, the one the CUDA runtime uses) is made current for the call
 *     and the thread is left with no context again.
 *   - Errors: HM_OK (0) or a negative hm_status, and one sentence in err
 *     (when not NULL) saying what happened and what to do; CUDA messages name
 *     the driver call and the CUDA error. Nothing prints, nothing exits.
 *   - Threads: one hm_space is used by one thread at a time; different
 *     spaces are independent. libcuda is loaded with dlopen (heapc_cuda.h),
 *     never linked; without a GPU or driver only HM_CUDA fails.
 */
#ifndef HEAPC_MAP_H
#define HEAPC_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef enum hm_kind { HM_HOST = 0, HM_CUDA = 1 } hm_kind;

typedef enum hm_status {
    HM_OK = 0,
    HM_EINVAL = -1,    /* a bad argument: sizes, index, fd, slot already mapped */
    HM_ENOMEM = -2,    /* out of address space or device memory */
    HM_EUNAVAIL = -3,  /* CUDA is not available (no driver, no GPU, no headers) */
    HM_ENOTFOUND = -4, /* no GPU has that UUID */
    HM_ESYS = -5,      /* a system or driver call failed */
    HM_EBADFD = -6     /* host: the fd is not a sealed memfd of the size needed */
} hm_status;

/* Fields are read-only for callers; set them only through this API. */
typedef struct hm_space {
    hm_kind kind;
    void *base;       /* start of the range; NULL when not reserved */
    uint64_t va_size; /* reserved bytes: nchunks * chunk_size */
    uint64_t chunk_size;
    uint32_t nchunks;  /* slots in the range */
    uint32_t nmapped;  /* slots mapped now */
    int device;        /* HM_CUDA: ordinal given read/write access */
    uint8_t *mapped;   /* per slot: 1 when mapped */
    uint64_t *handles; /* HM_CUDA: per slot, the imported allocation handle */
    void *ctx;         /* HM_CUDA: the retained primary context of device */
} hm_space;

/* Reserves a range of va_size bytes, rounded up to whole chunks, with no
 * chunk mapped. chunk_size: a multiple of the page size (host) or of the
 * device's allocation granularity (cuda, 2 MiB on H100/H200).
 * HM_CUDA: access goes to the device of the calling thread's current CUDA
 * context, or device 0 when no context is current; hm_set_cuda_device
 * changes it. */
int hm_reserve(hm_kind kind, uint64_t va_size, uint64_t chunk_size, hm_space *out, char *err, size_t errlen);

/* HM_CUDA: gives read/write access of the chunks mapped from now on to
 * device ordinal (as this process numbers its GPUs, e.g. from
 * hm_cuda_device_by_uuid). Only before the first hm_map_chunk. */
int hm_set_cuda_device(hm_space *s, int ordinal, char *err, size_t errlen);

/* Maps the chunk behind fd at base + index * chunk_size. The fd is not
 * consumed (see above). Errors: index out of range, slot already mapped,
 * host: an fd that hm_check_memfd refuses (HM_EBADFD: unsealed, short, not a
 * memfd); cuda: the driver's refusal (a CUDA POSIX fd is no memfd and has
 * no seals: cuMemImportFromShareableHandle checks it). */
int hm_map_chunk(hm_space *s, uint32_t index, int fd, char *err, size_t errlen);

/* The seals every memfd heapd hands out carries (F_SEAL_SHRINK,
 * F_SEAL_GROW, F_SEAL_SEAL): nobody can shrink it under a mapping, so a
 * mapping of its first `need` bytes never faults (SIGBUS). */
#define HM_SEALS_NEEDED 0x0007 /* F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW */

/* HM_OK if fd is a memfd sealed with HM_SEALS_NEEDED (F_GET_SEALS; a file
 * of any other kind has no such seals: a regular file, a pipe) holding at
 * least need bytes (fstat); else HM_EBADFD with a sentence naming role
 * ("chunk 3 of rank 1", "the status page") and what is missing. */
int hm_check_memfd(int fd, uint64_t need, const char *role, char *err, size_t errlen);

/* base, or NULL when s is not reserved. */
void *hm_base(const hm_space *s);

/* 1 when slot index is mapped. */
int hm_is_mapped(const hm_space *s, uint32_t index);

/* Issue 30: unmaps every mapped chunk and releases its memory (cuda: the
 * imported handles), keeping the reserved range: its slots fault on access
 * again, and hm_map_chunk maps them anew at the same addresses. HM_OK, or
 * HM_ESYS when a call failed (every slot is still marked unmapped). The
 * caller makes sure no device work touches the range. */
int hm_unmap_chunks(hm_space *s);

/* Issue 30 (trim): the same for slots [from, to) only (to is clipped to
 * the range). */
int hm_unmap_range(hm_space *s, uint32_t from, uint32_t to);

/* Unmaps and releases everything (see above). Returns HM_OK, or HM_ESYS when
 * a release call failed (everything else is still released). */
int hm_unmap_all(hm_space *s);

/* Client-side GPU naming (CUDA): the ordinal, in this process's numbering
 * (after CUDA_VISIBLE_DEVICES), of the GPU whose UUID is uuid (nvidia-smi
 * form "GPU-…"; "" means ordinal 0); and the UUID of an ordinal. A rank names
 * its GPU to heapd by UUID because ordinals differ between processes. */
int hm_cuda_device_by_uuid(const char *uuid, int *ordinal, char *err, size_t errlen);
int hm_cuda_device_uuid(int ordinal, char *buf, size_t len, char *err, size_t errlen);

/* The ordinal of the calling thread's current CUDA context; HM_ENOTFOUND
 * when the thread has none. */
int hm_cuda_current_device(int *ordinal, char *err, size_t errlen);

#endif /* HEAPC_MAP_H */
