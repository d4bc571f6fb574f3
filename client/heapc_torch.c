/* heapc_torch.c - libheapc_torch.so: the allocator functions of
 * torch.cuda.memory.CUDAPluggableAllocator for python/heapd's
 * heapd.torch.use_heap (see docs/python.md, "The allocator route").
 *
 * Installed once per process, before the first CUDA allocation
 * (torch.cuda.memory.change_current_allocator: it replaces torch's caching
 * allocator, so every torch allocation and free calls these functions; no
 * cache sits between torch and heapd). While a heap is current
 * (heapc_torch_set_current), heapc_torch_alloc is heapc_alloc_async of the
 * exact size on torch's stream and heapc_torch_free of a block of a
 * registered heap is heapc_free_async on its stream: released at once and,
 * under reclaim eager, reused from the next allocation on the same stream
 * (stream order, torch's rule; another stream waits for it: issue 27). The
 * n-th allocation gets the same offset on every rank whatever order the
 * ranks free in (or heapd reports
 * ERR_ASYMMETRY when the ranks' allocation sizes differ - never a silent
 * mismatch). Otherwise the memory comes from the CUDA driver's stream-ordered
 * allocator (cuMemAllocAsync / cuMemFreeAsync on the device's default pool,
 * which caches: its release threshold is set to the maximum).
 *
 * The heapc calls are given by the caller (heapc_torch_init: the functions
 * of the libheapc that attached the heap), so a process has one libheapc.
 * libcuda.so.1 is loaded with dlopen.
 *
 * Errors. torch's CUDAPluggableAllocator does not check the pointer it gets
 * (a NULL becomes a tensor at address 0 and a device fault later), so when
 * heapd refuses an allocation (ERR_ASYMMETRY, quota, ...) the block comes
 * from the driver instead, the failure is counted (heap_failures) and its
 * code and message kept (heapc_torch_last_code / heapc_torch_last_error),
 * and an asymmetric allocation's figures (heapc_torch_last_asymmetry, from
 * libheapc's heapc_last_asymmetry): python/heapd raises them when the
 * use_heap block ends. Only when the
 * driver fails too is NULL returned. Thread-safe: torch allocates from
 * several threads (autograd's device threads): the heap calls serialise in
 * libheapc; the current heap is one process-wide atomic pointer.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

typedef struct heapc heapc;
typedef int (*alloc_fn)(heapc *c, size_t size, void *stream, void **ptr, uint64_t *offset); /* heapc_alloc_async */
typedef int (*free_fn)(heapc *c, uint64_t offset, void *stream);                            /* heapc_free_async */
typedef const char *(*errstr_fn)(const heapc *c);
typedef void *(*base_fn)(heapc *c, uint32_t rank);
typedef uint32_t (*rank_fn)(heapc *c);
typedef uint64_t (*mapped_fn)(heapc *c);
typedef size_t (*asym_fn)(const heapc *c, uint64_t *n, uint32_t *ranks, uint64_t *sizes, size_t max);

void *heapc_torch_alloc(ssize_t size, int device, void *stream);
void heapc_torch_free(void *ptr, ssize_t size, int device, void *stream);
/* asym (heapc_last_asymmetry) may be NULL: no figures then. */
int heapc_torch_init(void *alloc, void *free, void *errstr, void *base, void *rank, void *mapped, void *asym);
int heapc_torch_register(heapc *c, uint64_t va_size);
int heapc_torch_unregister(heapc *c);
heapc *heapc_torch_set_current(heapc *c);
const char *heapc_torch_last_error(void);
int heapc_torch_last_code(void);
size_t heapc_torch_last_asymmetry(uint64_t *n, uint32_t *ranks, uint64_t *sizes, size_t max);
void heapc_torch_counters(uint64_t out[6]);

static alloc_fn h_alloc;
static free_fn h_free;
static errstr_fn h_errstr;
static base_fn h_base;
static rank_fn h_rank;
static mapped_fn h_mapped;
static asym_fn h_asym;

#define MAXHEAPS 16
static struct {
    _Atomic(heapc *) c;
    _Atomic uintptr_t lo, hi; /* this rank's reserved range */
} heaps[MAXHEAPS];
static _Atomic(heapc *) current;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char last_err[512];
static _Atomic int last_code;
#define ASYM_MAX 16
static struct { /* the last refusal's asymmetric allocation (count 0: none), under mu */
    uint64_t n;
    size_t count;
    uint32_t ranks[ASYM_MAX];
    uint64_t sizes[ASYM_MAX];
} last_asym;
/* heap allocs, heap frees, heap alloc failures, driver allocs, driver frees,
 * frees of blocks of no registered heap after it went (ignored) */
static _Atomic uint64_t ctr[6];

int heapc_torch_init(void *alloc, void *free, void *errstr, void *base, void *rank, void *mapped, void *asym)
{
    if (!alloc || !free || !errstr || !base || !rank || !mapped)
        return -1;
    *(void **)&h_alloc = alloc;
    *(void **)&h_free = free;
    *(void **)&h_errstr = errstr;
    *(void **)&h_base = base;
    *(void **)&h_rank = rank;
    *(void **)&h_mapped = mapped;
    *(void **)&h_asym = asym;
    return 0;
}

int heapc_torch_register(heapc *c, uint64_t va_size)
{
    if (!h_base)
        return -1;
    uintptr_t lo = (uintptr_t)h_base(c, h_rank(c));
    if (!lo)
        return -1;
    pthread_mutex_lock(&mu);
    int rc = -1;
    for (int i = 0; i < MAXHEAPS; i++) {
        if (!atomic_load(&heaps[i].c)) {
            atomic_store(&heaps[i].lo, lo);
            atomic_store(&heaps[i].hi, lo + va_size);
            atomic_store(&heaps[i].c, c);
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int heapc_torch_unregister(heapc *c)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAXHEAPS; i++)
        if (atomic_load(&heaps[i].c) == c)
            atomic_store(&heaps[i].c, NULL);
    heapc *cur = c;
    atomic_compare_exchange_strong(&current, &cur, NULL);
    pthread_mutex_unlock(&mu);
    return 0;
}

heapc *heapc_torch_set_current(heapc *c) { return atomic_exchange(&current, c); }

const char *heapc_torch_last_error(void) { return last_err; }

int heapc_torch_last_code(void) { return atomic_load(&last_code); }

size_t heapc_torch_last_asymmetry(uint64_t *n, uint32_t *ranks, uint64_t *sizes, size_t max)
{
    pthread_mutex_lock(&mu);
    size_t k = last_asym.count;
    if (k && n)
        *n = last_asym.n;
    for (size_t i = 0; i < k && i < max; i++) {
        if (ranks)
            ranks[i] = last_asym.ranks[i];
        if (sizes)
            sizes[i] = last_asym.sizes[i];
    }
    pthread_mutex_unlock(&mu);
    return k;
}

void heapc_torch_counters(uint64_t out[6])
{
    for (int i = 0; i < 6; i++)
        out[i] = atomic_load_explicit(&ctr[i], memory_order_relaxed);
}

/* ---- the CUDA driver, for allocations outside use_heap -------------------- */
typedef int (*cu_alloc_async)(uintptr_t *p, size_t n, void *stream);
typedef int (*cu_free_async)(uintptr_t p, void *stream);
typedef int (*cu_ctx_get)(void **ctx);
typedef int (*cu_ctx_set)(void *ctx);
typedef int (*cu_primary)(void **ctx, int dev);
typedef int (*cu_pool_get)(void **pool, int dev);
typedef int (*cu_pool_set)(void *pool, int attr, void *value);
static cu_alloc_async cu_alloc;
static cu_free_async cu_free;
static cu_ctx_get cu_get;
static cu_ctx_set cu_set;
static cu_primary cu_retain;
static cu_pool_get cu_pool;
static cu_pool_set cu_pool_attr;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t pool_done; /* bit per device: release threshold set */

static void cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    *(void **)&cu_alloc = dlsym(h, "cuMemAllocAsync");
    *(void **)&cu_free = dlsym(h, "cuMemFreeAsync");
    *(void **)&cu_get = dlsym(h, "cuCtxGetCurrent");
    *(void **)&cu_set = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu_retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&cu_pool = dlsym(h, "cuDeviceGetDefaultMemPool");
    *(void **)&cu_pool_attr = dlsym(h, "cuMemPoolSetAttribute");
}

static int cu_ready(int device)
{
    pthread_once(&cu_once, cu_load);
    if (!cu_alloc || !cu_free || !cu_get || !cu_set || !cu_retain)
        return 0;
    void *ctx = NULL;
    if (cu_get(&ctx) != 0 || !ctx) {
        if (cu_retain(&ctx, device) != 0 || cu_set(ctx) != 0)
            return 0;
    }
    if (device >= 0 && device < 64 && !(atomic_load(&pool_done) & (1ull << device)) && cu_pool && cu_pool_attr) {
        void *pool;
        uint64_t max = UINT64_MAX;
        if (cu_pool(&pool, device) == 0)
            cu_pool_attr(pool, 4 /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */, &max);
        atomic_fetch_or(&pool_done, 1ull << device);
    }
    return 1;
}

void *heapc_torch_alloc(ssize_t size, int device, void *stream)
{
    heapc *c = atomic_load_explicit(&current, memory_order_acquire);
    if (size <= 0)
        size = 1;
    if (c && h_alloc) {
        void *p = NULL;
        int rc = h_alloc(c, (size_t)size, stream, &p, NULL); /* on torch's stream: issue 27 */
        if (rc == 0) {
            atomic_fetch_add_explicit(&ctr[0], 1, memory_order_relaxed);
            return p;
        }
        /* Refused: counted and kept; the driver's memory below instead. */
        atomic_fetch_add_explicit(&ctr[2], 1, memory_order_relaxed);
        pthread_mutex_lock(&mu);
        snprintf(last_err, sizeof last_err, "heapd allocation of %zd bytes failed: %s", size, h_errstr(c));
        atomic_store(&last_code, rc);
        size_t k = h_asym ? h_asym(c, &last_asym.n, last_asym.ranks, last_asym.sizes, ASYM_MAX) : 0;
        last_asym.count = k < ASYM_MAX ? k : ASYM_MAX;
        pthread_mutex_unlock(&mu);
    }
    uintptr_t p = 0;
    int rc = -1;
    if (!cu_ready(device) || (rc = cu_alloc(&p, (size_t)size, stream)) != 0) {
        pthread_mutex_lock(&mu);
        snprintf(last_err, sizeof last_err,
                 "cuMemAllocAsync of %zd bytes on device %d failed: "
                 "CUresult %d%s",
                 size, device, rc, cu_alloc ? "" : " (libcuda.so.1 not loaded)");
        pthread_mutex_unlock(&mu);
        return NULL;
    }
    atomic_fetch_add_explicit(&ctr[3], 1, memory_order_relaxed);
    return (void *)p;
}

void heapc_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
    uintptr_t a = (uintptr_t)ptr;
    for (int i = 0; i < MAXHEAPS; i++) {
        heapc *c = atomic_load_explicit(&heaps[i].c, memory_order_acquire);
        if (c && a >= atomic_load(&heaps[i].lo) && a < atomic_load(&heaps[i].hi)) {
            /* Stream-ordered (issue 18): released once the work torch queued
             * on the block's stream completed, then reused after a collect. */
            h_free(c, a - atomic_load(&heaps[i].lo), stream);
            atomic_fetch_add_explicit(&ctr[1], 1, memory_order_relaxed);
            return;
        }
    }
    if (cu_free && cu_ready(device)) {
        /* A pointer of no registered heap that the driver did not give either
         * (a heap detached while torch still held its tensors) fails here and
         * is counted, not freed. */
        if (cu_free(a, stream) == 0) {
            atomic_fetch_add_explicit(&ctr[4], 1, memory_order_relaxed);
            return;
        }
    }
    atomic_fetch_add_explicit(&ctr[5], 1, memory_order_relaxed);
}
