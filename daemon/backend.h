/* backend.h - heapd's physical-chunk layer.
 *
 * A backend owns physical memory in chunks and exports each chunk as a POSIX
 * file descriptor that heapd passes to clients (SCM_RIGHTS); clients map the
 * fds themselves (client/heapc_map.h). Two backends:
 *
 *   "host"  memfd chunks in host memory: CPU machines, CI, the demo. One
 *           pseudo-device, index 0, named by the empty UUID "".
 *   "cuda"  CUDA VMM chunks (cuMemCreate, pinned device memory, exported
 *           once as a POSIX fd). libcuda is loaded with dlopen, so the same
 *           binary runs on machines with and without a GPU. Devices are the
 *           driver's ordinals as heapd's process sees them, named by UUID in
 *           nvidia-smi form "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
 *
 * What the module promises:
 *   - hb_open("auto") picks "cuda" when libcuda.so.1 loads, cuInit succeeds
 *     and the driver reports at least one device; otherwise "host". Once
 *     libcuda says there is a GPU, a later cuda failure is an error, never a
 *     silent fall back to host memory.
 *   - Every chunk returned by hb_chunk_create is zero-filled before its fd is
 *     handed out, its size is a multiple of hb_granularity(device), and its
 *     fd is close-on-exec. The caller dup()s chunk.fd for every client it
 *     sends it to; the chunk keeps its own fd until hb_chunk_release.
 *   - Host chunk fds are memfds sealed against shrinking and growing, so a
 *     client cannot truncate a chunk under the other ranks.
 *   - hb_chunk_release closes the fd and drops heapd's reference. Memory a
 *     client still maps (or holds an fd for) stays alive until that client
 *     lets go: release does not revoke mappings.
 *   - CUDA primary contexts are retained the first time a device is used
 *     (chunk create/scrub, meminfo) and released by hb_close; every call
 *     that needs a context makes the device's primary context current and
 *     restores the thread's previous context before returning.
 *   - Errors: functions return HB_OK (0) or a negative hb_status and, when
 *     err is not NULL, write one sentence into err saying what happened and
 *     what to do. CUDA messages name the driver call and the CUDA error, e.g.
 *     "cuMemCreate(67108864 bytes, device 0) failed: CUDA_ERROR_OUT_OF_MEMORY
 *     (out of memory)". The module never prints and never exits.
 *   - Threads: a backend is used from one thread at a time (heapd's loop
 *     thread). The only global state is the table of libcuda entry points,
 *     loaded once and never unloaded.
 */
#ifndef HEAPD_BACKEND_H
#define HEAPD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef enum hb_status {
    HB_OK = 0,
    HB_EINVAL = -1,    /* a bad argument (size, device index, kind) */
    HB_ENOMEM = -2,    /* the device or host is out of memory */
    HB_EUNAVAIL = -3,  /* the backend cannot run here (no driver, no GPU, no headers) */
    HB_ENOTFOUND = -4, /* no device has that UUID */
    HB_ESYS = -5       /* a system or driver call failed */
} hb_status;

/* Longest UUID string plus its NUL ("GPU-" + 36). */
#define HB_UUID_LEN 48

typedef struct hb_backend hb_backend;

/* One physical chunk. Filled by hb_chunk_create; fd is -1 after release. */
typedef struct hb_chunk {
    int fd;          /* owned by the chunk: dup() it to hand it out */
    int device;      /* device index the memory lives on */
    uint64_t size;   /* bytes, a multiple of hb_granularity(device) */
    uint64_t handle; /* opaque: the CUmemGenericAllocationHandle (cuda), 0 (host) */
} hb_chunk;

/* The kinds hb_open takes: the one list of the backends' names (heapd.conf's
 * `backend`, heapd --backend), in the order sentences list them. */
typedef enum hb_kind { HB_KIND_AUTO, HB_KIND_CUDA, HB_KIND_HOST, HB_KIND_N } hb_kind;
extern const char *const hb_kind_names[HB_KIND_N];

/* The hb_kind named `name`, or -1 (NULL or unknown). */
int hb_kind_parse(const char *name);

/* Writes every kind's name into buf for a sentence, ", " between them and
 * `last` before the last one ("auto, cuda or host" with " or "), each in
 * double quotes when `quoted`. Returns buf (cut at len, NUL-terminated). */
const char *hb_kind_list(char *buf, size_t len, const char *last, int quoted);

/* kind: one of hb_kind_names (NULL or "" means "auto"). On success *out is
 * a backend to pass to hb_close, and err is empty, except when "auto" fell
 * back to host: then err says why cuda could not be used (the caller logs
 * it; the backend never does). */
int hb_open(const char *kind, hb_backend **out, char *err, size_t errlen);

/* Releases the backend (and the CUDA primary contexts it retained).
 * Release every chunk first. NULL is a no-op. */
void hb_close(hb_backend *be);

/* "host" or "cuda". */
const char *hb_name(const hb_backend *be);

/* Number of devices: 1 for host. */
int hb_device_count(const hb_backend *be);

/* Device index of the GPU with this UUID (nvidia-smi form; "MIG-" prefixes
 * and a missing prefix are accepted, hex digits in either case). "" means
 * device 0, and is the only name the host backend accepts. An unknown UUID
 * is HB_ENOTFOUND with a message listing the UUIDs heapd sees. */
int hb_device_from_uuid(const hb_backend *be, const char *uuid, int *index, char *err, size_t errlen);

/* Writes device index's UUID ("" for host) into buf. HB_EINVAL when index
 * is out of range or len is too small (HB_UUID_LEN is always enough). */
int hb_device_uuid(const hb_backend *be, int index, char *buf, size_t len);

/* Chunk sizes must be multiples of this: host: the page size; cuda: the
 * minimum granularity of a pinned device allocation exportable as a POSIX
 * fd (2 MiB on H100/H200). 0 for a bad index or a device heapd cannot use
 * (hb_chunk_create then says why). */
uint64_t hb_granularity(const hb_backend *be, int device);

/* Creates a zero-filled chunk of size bytes on device and its fd. On
 * failure *out is {fd -1, size 0}: releasing it is harmless. */
int hb_chunk_create(hb_backend *be, int device, uint64_t size, hb_chunk *out, char *err, size_t errlen);

/* Closes c->fd and releases the memory handle; leaves c as {fd -1, size 0},
 * so a second release is a no-op. Only for chunks filled by hb_chunk_create. */
void hb_chunk_release(hb_backend *be, hb_chunk *c);

/* Zeroes an existing chunk (before it serves another heap or rank). Clients
 * that still map it see the zeros. cuda: waits until the zeros are written. */
int hb_chunk_scrub(hb_backend *be, hb_chunk *c, char *err, size_t errlen);

/* Issue 30: copies chunk c's c->size bytes into host memory at `host`
 * (save) or from it into the chunk (load); synchronous. cuda: through a
 * temporary mapping in heapd (cuMemcpyDtoH/HtoD), at the bus's speed when
 * the host memory was pinned with hb_host_pin; host: memcpy. */
int hb_chunk_save(hb_backend *be, hb_chunk *c, void *host, char *err, size_t errlen);
int hb_chunk_load(hb_backend *be, hb_chunk *c, const void *host, char *err, size_t errlen);

/* Issue 30: pins host memory [p, p + len) for the copies above (cuda:
 * cuMemHostRegister, portable; a no-op on host), or unpins it (len is
 * ignored). */
int hb_host_pin(hb_backend *be, void *p, uint64_t len, char *err, size_t errlen);
void hb_host_unpin(hb_backend *be, void *p);

/* Free and total bytes: host: MemAvailable and MemTotal of /proc/meminfo
 * (sysinfo if it cannot be read); cuda: cuMemGetInfo in the device's primary
 * context (~35 us: call it from a timer, not on the allocation path). */
int hb_meminfo(hb_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes, char *err, size_t errlen);

/* ---- Internal: the contract between backend.c and backend_host.c /
 * backend_cuda.c. Callers use the functions above. ------------------------ */
#ifdef HEAPD_BACKEND_IMPL

typedef struct hb_ops {
    const char *name;
    void (*close)(hb_backend *be);
    int (*device_count)(const hb_backend *be);
    int (*device_from_uuid)(const hb_backend *be, const char *uuid, int *index, char *err, size_t errlen);
    int (*device_uuid)(const hb_backend *be, int index, char *buf, size_t len);
    uint64_t (*granularity)(const hb_backend *be, int device);
    int (*chunk_create)(hb_backend *be, int device, uint64_t size, hb_chunk *out, char *err, size_t errlen);
    void (*chunk_release)(hb_backend *be, hb_chunk *c);
    int (*chunk_scrub)(hb_backend *be, hb_chunk *c, char *err, size_t errlen);
    int (*chunk_copy)(hb_backend *be, hb_chunk *c, void *host, int save, char *err, size_t errlen);
    int (*host_pin)(hb_backend *be, void *p, uint64_t len, int pin, char *err, size_t errlen);
    int (*meminfo)(hb_backend *be, int device, uint64_t *free_bytes, uint64_t *total_bytes, char *err, size_t errlen);
} hb_ops;

/* Every backend's state starts with this header. */
struct hb_backend {
    const hb_ops *ops;
};

/* Opens one kind. hb_cuda_open returns HB_EUNAVAIL when there is no
 * driver, no device or no CUDA headers at build time (hb_open("auto") then
 * falls back to host), another code when a GPU is there but unusable. */
int hb_host_open(hb_backend **out, char *err, size_t errlen);
int hb_cuda_open(hb_backend **out, char *err, size_t errlen);

/* snprintf into err when err is not NULL; returns code. */
int hb_fail(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif /* HEAPD_BACKEND_IMPL */

#endif /* HEAPD_BACKEND_H */
