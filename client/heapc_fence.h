/* heapc_fence.h - stream-ordered frees: completion sources and the queue of
 * freed blocks that wait for their stream (issue 18). Internal to libheapc.
 *
 * A *completion source* answers one question without blocking: has the work
 * queued on a stream before a given point completed? It records a marker on
 * a stream (record) and later queries it (query). Two sources:
 *   - cuda: a marker is a CUDA event (CU_EVENT_DISABLE_TIMING) recorded on
 *     the stream in the heap device's context; query is cuEventQuery. Events
 *     are pooled and reused.
 *   - host: a stream is a heapc_hstream (heapc.h), a timeline of host work
 *     with two counters, begun and completed; a marker is the begun count at
 *     record time, done once completed reaches it. A test holds a block "in
 *     use" by beginning work on an hstream and releases it from another
 *     thread with heapc_hstream_complete.
 * A stream of NULL on the host source has no work: its markers are done at
 * once (the plain heapc_free on the host backend).
 *
 * The queue (hf_queue) batches: offsets freed on one stream join one open
 * group; the group gets its marker only when it closes (another stream's
 * free, the group reaching its batch size, or hf_queue_close at flush and
 * collect time), so there is one marker per run of frees, not one per free.
 * Recording late is safe: a marker covers at least the work queued before
 * every free of its group. hf_queue_reap queries the closed groups and hands
 * the offsets of each completed group to a callback (the caller's free
 * queue); a group not yet complete stays. Nothing here blocks or waits.
 *
 * Not thread-safe: libheapc calls it under the context's mutex. The module
 * never calls up: results go through the emit callback and its data pointer.
 */
#ifndef HEAPC_FENCE_H
#define HEAPC_FENCE_H

#include <stddef.h>
#include <stdint.h>

typedef struct hf_ops {
    const char *name; /* "cuda", "host" */
    /* A marker after the work queued on stream so far into *marker. 0, or
     * -1 with a sentence in err. */
    int (*record)(void *impl, void *stream, void **marker, char *err, size_t errlen);
    /* 1: the work before marker completed; 0: not yet; -1: error (err).
     * Never blocks. */
    int (*query)(void *impl, void *marker, char *err, size_t errlen);
    /* Blocks until the work before marker completed. 0, or -1 (err). */
    int (*wait)(void *impl, void *marker, char *err, size_t errlen);
    /* Work queued on stream from now on waits for marker, without blocking
     * the caller (cuStreamWaitEvent). NULL: the source has none (host), and
     * hf_queue_order waits instead. 0, or -1 (err). */
    int (*stream_wait)(void *impl, void *stream, void *marker, char *err, size_t errlen);
    /* The marker is no longer needed (done or abandoned). */
    void (*release)(void *impl, void *marker);
    void (*destroy)(void *impl);
} hf_ops;

typedef struct hf_source {
    const hf_ops *ops;
    void *impl;
} hf_source;

/* The host source (heapc_hstream streams). */
void hf_host_source(hf_source *out);
/* The cuda source for the context ctx (a CUcontext): events are created and
 * recorded with ctx current (restored after). -1 with err when libcuda is
 * missing. Without cuda.h at build time: -1 always. */
int hf_cuda_source(hf_source *out, void *ctx, char *err, size_t errlen);

/* A run of frees on one stream. early: the offsets were sent to heapd at
 * their free (stream-ordered reuse, issue 27); the group only remembers
 * them, with their block sizes, until the stream's work completes, so that
 * an allocation on another stream that reuses one of them waits for it
 * (hf_queue_order). Otherwise the offsets go to heapd when it completes. */
typedef struct hf_group {
    void *stream;
    void *marker; /* NULL while the group is open */
    int fresh;    /* recorded since the last reap */
    int early;
    uint64_t *offs;
    uint64_t *sizes; /* block sizes, parallel to offs */
    size_t n, cap;
} hf_group;

typedef struct hf_queue {
    hf_source src;
    hf_group open;    /* n == 0: no open group */
    hf_group *closed; /* groups with a marker, oldest first */
    size_t nclosed, capclosed;
    size_t batch;     /* an open group closes at this many offsets */
    uint64_t waiting; /* offsets in every group (open and closed) */
    uint64_t held;    /* of them, not early: not sent yet (held <= waiting) */
    uint64_t orders;  /* allocations that had to wait for a reused block's stream */
    uint64_t markers; /* markers recorded so far */
} hf_queue;

/* Blocks released early (sent at their free) whose groups the queue still
 * keeps: their stream work is not known complete. */
static inline uint64_t hf_queue_early(const hf_queue *q) { return q->waiting - q->held; }

/* Error codes (codes cross modules; err holds the sentence). */
enum { HF_OK = 0, HF_ENOMEM = -1, HF_EDEVICE = -2 };

void hf_queue_init(hf_queue *q, hf_source src, size_t batch);
/* Releases every marker and group (the offsets are dropped) and destroys
 * the source. */
void hf_queue_destroy(hf_queue *q);
/* offset (a block of size bytes) was freed on stream: joins the open group
 * (closing the open group first when it belongs to another stream, has the
 * other `early`, or is full). */
int hf_queue_add(hf_queue *q, void *stream, uint64_t offset, uint64_t size, int early, char *err, size_t errlen);
/* A new block [off, off + size) is about to be used on stream (known = 0:
 * on a stream the caller does not know). For every early group of another
 * stream with a block overlapping it: stream work on `stream` waits for its
 * marker (stream_wait), or the caller waits (wait; unknown stream, or a
 * source without stream_wait). Same stream: nothing, stream order suffices.
 * Counts each wait in q->orders. */
int hf_queue_order(hf_queue *q, uint64_t off, uint64_t size, void *stream, int known, char *err, size_t errlen);
/* Waits until the work of every early group's stream completed (trim and
 * release take the memory away, so nothing freed early may still be in
 * use). */
int hf_queue_wait_early(hf_queue *q, char *err, size_t errlen);
/* Records the open group's marker (nothing when there is no open group). */
int hf_queue_close(hf_queue *q, char *err, size_t errlen);
/* Queries the closed groups; for each completed one calls emit(data,
 * offsets, n) unless it is early (an emit error stops the reap and is
 * returned; the group stays). Never waits for device work: with poll_fresh (flush and collect
 * time) the markers recorded since the last such reap get at most
 * HF_FRESH_POLL_NS of polling in all (an idle stream completes a marker in
 * microseconds, so that a block freed after its work ended is released at
 * this collect, not the next); every other marker is queried once. Returns
 * HF_OK or an error. */
#define HF_FRESH_POLL_NS 50000u
/* libheapc reaps the closed groups released early (stream-ordered reuse)
 * once there are this many: their markers only free their events. */
#define HF_EARLY_REAP 16u
typedef int (*hf_emit_fn)(void *data, const uint64_t *offs, size_t n);
int hf_queue_reap(hf_queue *q, int poll_fresh, hf_emit_fn emit, void *data, char *err, size_t errlen);

#endif
