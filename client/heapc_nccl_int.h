/* heapc_nccl_int.h - libheapc_nccl's private header: the context (struct
 * hnccl_ctx) and what its files share (prefix hni_, "hnccl internal"; hidden
 * like every client object). The files: heapc_nccl.c (the real function
 * table, the context, probe settings, counters), heapc_nccl_policy.c (op
 * names and the probe policy), heapc_nccl_call.c (the probe and the NCCL
 * wrappers), heapc_nccl_win.c (issue 32: the heap as NCCL windows). */
#ifndef HEAPC_NCCL_INT_H
#define HEAPC_NCCL_INT_H

#include "heapc_nccl.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ERRSTR_LEN 2048

#define OPBIT(op) (1u << (op))

/* Every op's own name, by hnccl_op (heapc_nccl_policy.c). */
extern const char *const hni_op_names[HNCCL_NOPS];

typedef struct counters_a {
    _Atomic uint64_t calls[HNCCL_NOPS];
    _Atomic uint64_t probes, probe_errors, below, callbacks, cuda_queries, cuda_reused, nccl_errors;
} counters_a;

/* Issue 32: one extent of the registered heap, heap offsets [off, off +
 * size); win is its window when ok (else its registration failed). */
typedef struct hni_extent {
    uint64_t off, size;
    ncclWindow_t win;
    int ok;
} hni_extent;

/*
 * The context. Calls may run on several threads at once (hnccl_all_reduce
 * and the probe read the atomics; hnccl_set_heapc may change `c` meanwhile);
 * `mu` guards errstr only (err is its code, readable without it). The
 * settings that are not atomic (cb, source, min_interval_ns, user_table) are
 * set before calls start.
 */
struct hnccl_ctx {
    _Atomic(heapc *) c; /* hnccl_set_heapc may change it while calls probe */
    _Atomic(const hnccl_table *) table;
    const hnccl_table *user_table; /* NULL: the real one */
    _Atomic uint32_t probe_mask;
    _Atomic uint64_t threshold;
    hnccl_release_fn cb;
    void *cb_arg;
    hnccl_source source;
    uint64_t min_interval_ns;
    /* HNCCL_SOURCE_CUDA: the last query (its time is 0 before the first) */
    _Atomic uint64_t cuda_at_ns, cuda_free, cuda_total;
    counters_a ctr;
    pthread_mutex_t mu; /* errstr */
    _Atomic int err;
    char errstr[ERRSTR_LEN];
    /* Issue 32 (heapc_nccl_win.c): `wmu` guards these. wc: the heapc
     * context whose heap is registered (NULL: none); ext: its extents,
     * ascending and disjoint (next of them, ext_cap allocated); wst: the
     * counters (wst.windows, extents, registered_bytes: of ext). */
    pthread_mutex_t wmu;
    heapc *wc;
    ncclComm_t wcomm;
    const hnccl_table *wt;
    hni_extent *ext;
    size_t next, ext_cap;
    hnccl_window_stats wst;
};

#define INC(field) atomic_fetch_add_explicit(&x->ctr.field, 1, memory_order_relaxed)

/* heapc_nccl.c */
int hni_set_err(hnccl_ctx *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int hni_ok(hnccl_ctx *x);
const hnccl_table *hni_load_table(hnccl_ctx *x);

/* heapc_nccl_win.c: deregisters at hnccl_free. */
void hni_win_free(hnccl_ctx *x);

/* The context's function table (the user's, or the real one loaded on first
 * use); NULL with the error set when libnccl cannot be loaded. */
static inline const hnccl_table *hni_table(hnccl_ctx *x)
{
    const hnccl_table *t = atomic_load_explicit(&x->table, memory_order_acquire);
    return t ? t : hni_load_table(x);
}

#endif
