/* heapc_fence.c - completion sources (host, cuda) and the queue of blocks
 * freed on a stream whose work has not completed yet. See heapc_fence.h. */
#include "heapc_fence.h"
#include "heapc.h"
#include "heapc_cuda.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- host source: heapc_hstream ----------------------------------------- */

struct heapc_hstream {
    _Atomic uint64_t begun;     /* tickets handed out */
    _Atomic uint64_t completed; /* highest ticket whose work is done */
    _Atomic uint64_t waiters;   /* callers blocked in host_wait on it now */
};

heapc_hstream *heapc_hstream_create(void)
{
    heapc_hstream *s = calloc(1, sizeof *s);
    if (s) {
        atomic_init(&s->begun, 0);
        atomic_init(&s->completed, 0);
        atomic_init(&s->waiters, 0);
    }
    return s;
}

void heapc_hstream_destroy(heapc_hstream *s) { free(s); }

uint64_t heapc_hstream_begin(heapc_hstream *s)
{
    return atomic_fetch_add_explicit(&s->begun, 1, memory_order_acq_rel) + 1;
}

void heapc_hstream_complete(heapc_hstream *s, uint64_t ticket)
{
    uint64_t cur = atomic_load_explicit(&s->completed, memory_order_acquire);
    while (cur < ticket && !atomic_compare_exchange_weak_explicit(&s->completed, &cur, ticket, memory_order_acq_rel,
                                                                  memory_order_acquire))
        ;
}

uint64_t heapc_hstream_pending(heapc_hstream *s)
{
    uint64_t b = atomic_load_explicit(&s->begun, memory_order_acquire);
    uint64_t d = atomic_load_explicit(&s->completed, memory_order_acquire);
    return b > d ? b - d : 0;
}

uint64_t heapc_hstream_waiters(heapc_hstream *s) { return atomic_load_explicit(&s->waiters, memory_order_acquire); }

typedef struct host_marker {
    heapc_hstream *s; /* NULL: no stream, done at once */
    uint64_t ticket;
} host_marker;

static int host_record(void *impl, void *stream, void **marker, char *err, size_t errlen)
{
    (void)impl;
    host_marker *m = malloc(sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory for a host stream marker");
        return -1;
    }
    m->s = stream;
    m->ticket = m->s ? atomic_load_explicit(&m->s->begun, memory_order_acquire) : 0;
    *marker = m;
    return 0;
}

static int host_query(void *impl, void *marker, char *err, size_t errlen)
{
    (void)impl, (void)err, (void)errlen;
    host_marker *m = marker;
    return !m->s || atomic_load_explicit(&m->s->completed, memory_order_acquire) >= m->ticket;
}

/* Polls until the marker's ticket completed (host streams are completed by
 * other threads: 20 us naps between looks). */
static int host_wait(void *impl, void *marker, char *err, size_t errlen)
{
    host_marker *m = marker;
    if (host_query(impl, marker, err, errlen))
        return 0;
    atomic_fetch_add_explicit(&m->s->waiters, 1, memory_order_acq_rel);
    struct timespec nap = {0, 20000};
    while (!host_query(impl, marker, err, errlen))
        nanosleep(&nap, NULL);
    atomic_fetch_sub_explicit(&m->s->waiters, 1, memory_order_acq_rel);
    return 0;
}

static void host_release(void *impl, void *marker)
{
    (void)impl;
    free(marker);
}

static void host_destroy(void *impl) { (void)impl; }

static const hf_ops host_ops = {"host", host_record, host_query, host_wait, NULL, host_release, host_destroy};

void hf_host_source(hf_source *out)
{
    out->ops = &host_ops;
    out->impl = NULL;
}

/* ---- cuda source: pooled events ------------------------------------------ */

#if HEAPD_HAVE_CUDA_H

typedef struct cuda_src {
    const hc_cuda *cu;
    CUcontext ctx;
    CUevent *pool; /* idle events */
    size_t npool, cappool;
} cuda_src;

/* Makes ctx current; *prev gets the thread's context to restore. */
static CUresult cuda_enter(cuda_src *s, CUcontext *prev)
{
    CUresult rc = s->cu->CtxGetCurrent(prev);
    if (rc == CUDA_SUCCESS && *prev != s->ctx)
        rc = s->cu->CtxSetCurrent(s->ctx);
    return rc;
}

static void cuda_leave(cuda_src *s, CUcontext prev)
{
    if (prev != s->ctx)
        s->cu->CtxSetCurrent(prev);
}

static int cuda_record(void *impl, void *stream, void **marker, char *err, size_t errlen)
{
    cuda_src *s = impl;
    CUcontext prev = NULL;
    CUresult rc = cuda_enter(s, &prev);
    if (rc != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc, NULL, "cuCtxSetCurrent(heap device) for a free's event");
        return -1;
    }
    CUevent ev = NULL;
    if (s->npool)
        ev = s->pool[--s->npool];
    else if ((rc = s->cu->EventCreate(&ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
        hc_cuda_fail(err, errlen, rc, "too many frees in flight on the device?", "cuEventCreate");
    if (rc == CUDA_SUCCESS && (rc = s->cu->EventRecord(ev, (CUstream)stream)) != CUDA_SUCCESS) {
        hc_cuda_fail(err, errlen, rc,
                     "pass heapc_free_async a stream of the heap's device (or NULL: the default "
                     "stream)",
                     "cuEventRecord(stream %p)", stream);
        s->cu->EventDestroy(ev);
    }
    cuda_leave(s, prev);
    if (rc != CUDA_SUCCESS)
        return -1;
    *marker = ev;
    return 0;
}

static int cuda_query(void *impl, void *marker, char *err, size_t errlen)
{
    cuda_src *s = impl;
    CUresult rc = s->cu->EventQuery((CUevent)marker);
    if (rc == CUDA_SUCCESS)
        return 1;
    if (rc == CUDA_ERROR_NOT_READY)
        return 0;
    hc_cuda_fail(err, errlen, rc, "a kernel that used the freed block failed", "cuEventQuery");
    return -1;
}

static int cuda_wait(void *impl, void *marker, char *err, size_t errlen)
{
    cuda_src *s = impl;
    CUresult rc = s->cu->EventSynchronize((CUevent)marker);
    if (rc == CUDA_SUCCESS)
        return 0;
    hc_cuda_fail(err, errlen, rc, "a kernel that used the freed block failed", "cuEventSynchronize");
    return -1;
}

static int cuda_stream_wait(void *impl, void *stream, void *marker, char *err, size_t errlen)
{
    cuda_src *s = impl;
    CUcontext prev = NULL;
    CUresult rc = cuda_enter(s, &prev);
    if (rc == CUDA_SUCCESS)
        rc = s->cu->StreamWaitEvent((CUstream)stream, (CUevent)marker, 0);
    cuda_leave(s, prev);
    if (rc == CUDA_SUCCESS)
        return 0;
    hc_cuda_fail(err, errlen, rc, "pass a stream of the heap's device (or NULL: the default stream)",
                 "cuStreamWaitEvent(stream %p)", stream);
    return -1;
}

static void cuda_release(void *impl, void *marker)
{
    cuda_src *s = impl;
    if (s->npool == s->cappool) {
        size_t ncap = s->cappool ? 2 * s->cappool : 16;
        CUevent *np = realloc(s->pool, ncap * sizeof *np);
        if (!np) {
            s->cu->EventDestroy((CUevent)marker);
            return;
        }
        s->pool = np;
        s->cappool = ncap;
    }
    s->pool[s->npool++] = (CUevent)marker;
}

static void cuda_destroy(void *impl)
{
    cuda_src *s = impl;
    for (size_t i = 0; i < s->npool; i++)
        s->cu->EventDestroy(s->pool[i]);
    free(s->pool);
    free(s);
}

static const hf_ops cuda_ops = {"cuda",           cuda_record,  cuda_query,  cuda_wait,
                                cuda_stream_wait, cuda_release, cuda_destroy};

int hf_cuda_source(hf_source *out, void *ctx, char *err, size_t errlen)
{
    const hc_cuda *cu = hc_cuda_get(err, errlen);
    if (!cu)
        return -1;
    cuda_src *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory for the cuda completion source");
        return -1;
    }
    s->cu = cu;
    s->ctx = (CUcontext)ctx;
    out->ops = &cuda_ops;
    out->impl = s;
    return 0;
}

#else

int hf_cuda_source(hf_source *out, void *ctx, char *err, size_t errlen)
{
    (void)out, (void)ctx;
    snprintf(err, errlen, "libheapc was built without cuda.h: no cuda completion source");
    return -1;
}

#endif

/* ---- the queue ------------------------------------------------------------ */

void hf_queue_init(hf_queue *q, hf_source src, size_t batch)
{
    memset(q, 0, sizeof *q);
    q->src = src;
    q->batch = batch ? batch : 1;
}

void hf_queue_destroy(hf_queue *q)
{
    for (size_t i = 0; i < q->nclosed; i++) {
        q->src.ops->release(q->src.impl, q->closed[i].marker);
        free(q->closed[i].offs);
        free(q->closed[i].sizes);
    }
    free(q->closed);
    free(q->open.offs);
    free(q->open.sizes);
    if (q->src.ops)
        q->src.ops->destroy(q->src.impl);
    memset(q, 0, sizeof *q);
}

int hf_queue_close(hf_queue *q, char *err, size_t errlen)
{
    if (q->open.n == 0)
        return HF_OK;
    if (q->nclosed == q->capclosed) {
        size_t ncap = q->capclosed ? 2 * q->capclosed : 8;
        hf_group *ng = realloc(q->closed, ncap * sizeof *ng);
        if (!ng) {
            snprintf(err, errlen, "out of memory closing a group of %zu frees", q->open.n);
            return HF_ENOMEM;
        }
        q->closed = ng;
        q->capclosed = ncap;
    }
    void *marker = NULL;
    if (q->src.ops->record(q->src.impl, q->open.stream, &marker, err, errlen) != 0)
        return HF_EDEVICE;
    q->open.marker = marker;
    q->open.fresh = 1;
    q->closed[q->nclosed++] = q->open;
    memset(&q->open, 0, sizeof q->open);
    q->markers++;
    return HF_OK;
}

int hf_queue_add(hf_queue *q, void *stream, uint64_t offset, uint64_t size, int early, char *err, size_t errlen)
{
    if (q->open.n && (q->open.stream != stream || q->open.early != early || q->open.n >= q->batch)) {
        int rc = hf_queue_close(q, err, errlen);
        if (rc != HF_OK)
            return rc;
    }
    hf_group *g = &q->open;
    if (g->n == g->cap) {
        size_t ncap = g->cap ? 2 * g->cap : 64;
        uint64_t *no = realloc(g->offs, ncap * sizeof *no);
        if (no)
            g->offs = no;
        uint64_t *ns = no ? realloc(g->sizes, ncap * sizeof *ns) : NULL;
        if (!ns) {
            snprintf(err, errlen, "out of memory queueing offset %llu on its stream", (unsigned long long)offset);
            return HF_ENOMEM;
        }
        g->sizes = ns;
        g->cap = ncap;
    }
    g->stream = stream;
    g->early = early;
    g->offs[g->n] = offset;
    g->sizes[g->n++] = size;
    q->waiting++;
    q->held += !early;
    return HF_OK;
}

static int overlaps(const hf_group *g, uint64_t off, uint64_t size)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->offs[i] < off + size && off < g->offs[i] + g->sizes[i])
            return 1;
    return 0;
}

/* Orders use on stream after closed group g's work. */
static int order_after(hf_queue *q, hf_group *g, void *stream, int known, char *err, size_t errlen)
{
    const hf_ops *o = q->src.ops;
    int rc = known && o->stream_wait ? o->stream_wait(q->src.impl, stream, g->marker, err, errlen)
                                     : o->wait(q->src.impl, g->marker, err, errlen);
    if (rc != 0)
        return HF_EDEVICE;
    q->orders++;
    return HF_OK;
}

int hf_queue_wait_early(hf_queue *q, char *err, size_t errlen)
{
    if (q->open.n && q->open.early) {
        int rc = hf_queue_close(q, err, errlen);
        if (rc != HF_OK)
            return rc;
    }
    for (size_t i = 0; i < q->nclosed; i++)
        if (q->closed[i].early && q->src.ops->wait(q->src.impl, q->closed[i].marker, err, errlen) != 0)
            return HF_EDEVICE;
    return HF_OK;
}

int hf_queue_order(hf_queue *q, uint64_t off, uint64_t size, void *stream, int known, char *err, size_t errlen)
{
    hf_group *o = &q->open;
    size_t n = q->nclosed; /* the groups closed before: the open one is ordered here */
    if (o->n && o->early && !(known && o->stream == stream) && overlaps(o, off, size)) {
        int rc = hf_queue_close(q, err, errlen); /* its marker covers its work so far */
        if (rc != HF_OK)
            return rc;
        if ((rc = order_after(q, &q->closed[q->nclosed - 1], stream, known, err, errlen)) != HF_OK)
            return rc;
    }
    for (size_t i = 0; i < n; i++) {
        hf_group *g = &q->closed[i];
        if (!g->early || (known && g->stream == stream) || !overlaps(g, off, size))
            continue;
        int rc = order_after(q, g, stream, known, err, errlen);
        if (rc != HF_OK)
            return rc;
    }
    return HF_OK;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Queries g's marker; a fresh one is polled until *deadline (set at the
 * first fresh marker of a reap, shared by the others). */
static int query_group(hf_queue *q, hf_group *g, int poll, uint64_t *deadline, char *err, size_t errlen)
{
    int done = q->src.ops->query(q->src.impl, g->marker, err, errlen);
    if (!poll)
        return done;
    if (done == 0 && g->fresh) {
        if (*deadline == 0)
            *deadline = mono_ns() + HF_FRESH_POLL_NS;
        while (done == 0 && mono_ns() < *deadline)
            done = q->src.ops->query(q->src.impl, g->marker, err, errlen);
    }
    g->fresh = 0;
    return done;
}

int hf_queue_reap(hf_queue *q, int poll_fresh, hf_emit_fn emit, void *data, char *err, size_t errlen)
{
    int rc = HF_OK;
    size_t keep = 0, i = 0;
    uint64_t deadline = 0;
    for (; i < q->nclosed; i++) {
        hf_group *g = &q->closed[i];
        int done = rc == HF_OK ? query_group(q, g, poll_fresh, &deadline, err, errlen) : 0;
        if (done < 0) {
            rc = HF_EDEVICE;
            done = 0;
        }
        if (done && !g->early) {
            int erc = emit(data, g->offs, g->n);
            if (erc != 0) {
                rc = erc;
                done = 0;
            }
        }
        if (done) {
            q->waiting -= g->n;
            q->held -= g->early ? 0 : g->n;
            q->src.ops->release(q->src.impl, g->marker);
            free(g->offs);
            free(g->sizes);
        } else {
            q->closed[keep++] = *g;
        }
    }
    q->nclosed = keep;
    return rc;
}
