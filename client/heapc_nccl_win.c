/* heapc_nccl_win.c - libheapc_nccl: the heap as NCCL windows (issue 32,
 * heapc_nccl.h: hnccl_register_heap). libheapc's map hook
 * (heapc_set_map_hook) reports this rank's mapped runs; each run becomes an
 * extent registered as one window (NCCL_WIN_COLL_SYMMETRIC), and a run about
 * to be unmapped takes the windows it touches with it (what of them stays
 * mapped is registered again). The extents are kept ascending and disjoint,
 * so no byte is registered twice. heapc_nccl_int.h has the context. */
#include "heapc_nccl_int.h"

/* ---- extents (x->wmu held) --------------------------------------------------- */

static int ext_insert(hnccl_ctx *x, size_t at, hni_extent e)
{
    if (x->next == x->ext_cap) {
        size_t cap = x->ext_cap ? 2 * x->ext_cap : 16;
        hni_extent *n = realloc(x->ext, cap * sizeof *n);
        if (!n)
            return HNCCL_EOOM;
        x->ext = n;
        x->ext_cap = cap;
    }
    memmove(&x->ext[at + 1], &x->ext[at], (x->next - at) * sizeof *x->ext);
    x->ext[at] = e;
    x->next++;
    x->wst.extents++;
    if (e.ok) {
        x->wst.windows++;
        x->wst.registered_bytes += e.size;
    }
    return HNCCL_OK;
}

static void ext_remove(hnccl_ctx *x, size_t at)
{
    const hni_extent *e = &x->ext[at];
    x->wst.extents--;
    if (e->ok) {
        x->wst.windows--;
        x->wst.registered_bytes -= e->size;
    }
    memmove(&x->ext[at], &x->ext[at + 1], (x->next - at - 1) * sizeof *x->ext);
    x->next--;
}

/* Registers heap offsets [off, off + size) (no extent there yet) as one
 * window and records the extent, a failed one too. */
static void reg_one(hnccl_ctx *x, char *base, uint64_t off, uint64_t size, size_t at)
{
    hni_extent e = {off, size, NULL, 0};
    ncclResult_t r = x->wt->CommWindowRegister(x->wcomm, base + off, (size_t)size, &e.win, NCCL_WIN_COLL_SYMMETRIC);
    if (r == ncclSuccess) {
        e.ok = 1;
        x->wst.registrations++;
    } else {
        x->wst.register_errors++;
        const char *es = x->wt->GetErrorString ? x->wt->GetErrorString(r) : NULL;
        hni_set_err(x, (int)r,
                    "ncclCommWindowRegister(comm %p, %p, %" PRIu64 " bytes: heap %s offsets %" PRIu64 "..%" PRIu64
                    ", NCCL_WIN_COLL_SYMMETRIC) failed: %s (%d): %s; that extent stays without a window (NCCL's "
                    "ordinary path for buffers there)",
                    (void *)x->wcomm, (void *)(base + off), size, heapc_heap_name(x->wc), off, off + size,
                    hnccl_errname((int)r), (int)r, es ? es : "no error string");
    }
    if (ext_insert(x, at, e) != HNCCL_OK) {
        hni_set_err(x, HNCCL_EOOM, "out of memory recording a window of heap %s", heapc_heap_name(x->wc));
        if (e.ok && x->wt->CommWindowDeregister(x->wcomm, e.win) == ncclSuccess)
            x->wst.deregistrations++;
    }
}

static void dereg_one(hnccl_ctx *x, size_t at)
{
    hni_extent e = x->ext[at];
    ext_remove(x, at);
    if (!e.ok)
        return;
    ncclResult_t r = x->wt->CommWindowDeregister(x->wcomm, e.win);
    if (r == ncclSuccess) {
        x->wst.deregistrations++;
        return;
    }
    x->wst.register_errors++;
    const char *es = x->wt->GetErrorString ? x->wt->GetErrorString(r) : NULL;
    hni_set_err(x, (int)r,
                "ncclCommWindowDeregister(comm %p, the window of heap offsets %" PRIu64 "..%" PRIu64
                ") failed: %s (%d): %s; the window is forgotten",
                (void *)x->wcomm, e.off, e.off + e.size, hnccl_errname((int)r), (int)r, es ? es : "no error string");
}

/* Registers what of [off, off + size) no extent covers, one window per gap. */
static void add_run(hnccl_ctx *x, char *base, uint64_t off, uint64_t size)
{
    uint64_t at = off, end = off + size;
    size_t i = 0;
    while (at < end) {
        while (i < x->next && x->ext[i].off + x->ext[i].size <= at)
            i++;
        if (i < x->next && x->ext[i].off <= at) { /* covered: skip it */
            uint64_t e = x->ext[i].off + x->ext[i].size;
            uint64_t stop = e < end ? e : end;
            x->wst.overlaps_skipped += stop - at;
            at = stop;
            continue;
        }
        uint64_t gap_end = i < x->next && x->ext[i].off < end ? x->ext[i].off : end;
        reg_one(x, base, at, gap_end - at, i);
        at = gap_end;
    }
}

static int in_runs(uint64_t a, uint64_t b, const uint64_t *offs, const uint64_t *sizes, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (a < offs[k] + sizes[k] && offs[k] < b)
            return 1;
    return 0;
}

/* Runs about to be unmapped: every extent they touch goes (deregistered);
 * what of those extents lies outside the runs stays mapped and is
 * registered again, after every deregistration. */
static void remove_runs(hnccl_ctx *x, char *base, const uint64_t *offs, const uint64_t *sizes, size_t n)
{
    size_t nkeep = 0, cap = 0;
    uint64_t(*keep)[2] = NULL;
    for (size_t i = 0; i < x->next;) {
        hni_extent e = x->ext[i];
        if (!in_runs(e.off, e.off + e.size, offs, sizes, n)) {
            i++;
            continue;
        }
        dereg_one(x, i);
        /* The parts of e outside every run, ascending. */
        uint64_t at = e.off, end = e.off + e.size;
        while (at < end) {
            uint64_t skip = 0, stop = end;
            for (size_t k = 0; k < n; k++) {
                uint64_t ro = offs[k], re = offs[k] + sizes[k];
                if (ro <= at && at < re)
                    skip = re; /* at is inside run k */
                else if (ro > at && ro < stop)
                    stop = ro;
            }
            if (skip) {
                at = skip < end ? skip : end;
                continue;
            }
            if (nkeep == cap) {
                size_t ncap = cap ? 2 * cap : 8;
                uint64_t(*nk)[2] = realloc(keep, ncap * sizeof *keep);
                if (!nk)
                    break; /* out of memory: that part stays without a window */
                keep = nk;
                cap = ncap;
            }
            keep[nkeep][0] = at;
            keep[nkeep][1] = stop - at;
            nkeep++;
            at = stop;
        }
    }
    for (size_t k = 0; k < nkeep; k++)
        add_run(x, base, keep[k][0], keep[k][1]);
    free(keep);
}

/* Forgets every extent, deregistering the windows (x->wmu held). */
static void drop_all(hnccl_ctx *x)
{
    while (x->next)
        dereg_one(x, x->next - 1);
}

/* ---- libheapc's map hook ------------------------------------------------------ */

static void map_hook(void *arg, int event, char *base, const uint64_t *offs, const uint64_t *sizes, size_t n)
{
    hnccl_ctx *x = arg;
    pthread_mutex_lock(&x->wmu);
    if (x->wc) {
        if (event == HEAPC_MAP_ADDED) {
            for (size_t k = 0; k < n; k++)
                add_run(x, base, offs[k], sizes[k]);
        } else if (event == HEAPC_MAP_REMOVING) {
            remove_runs(x, base, offs, sizes, n);
        } else if (event == HEAPC_MAP_DROPPED) { /* detach: the registration ends */
            drop_all(x);
            x->wc = NULL;
            x->wst.registered = 0;
        }
    }
    pthread_mutex_unlock(&x->wmu);
}

/* ---- API --------------------------------------------------------------------------- */

int hnccl_register_heap(hnccl_ctx *x, ncclComm_t comm, heapc *c)
{
    if (!x)
        return HNCCL_EINVAL;
    if (!c)
        c = atomic_load_explicit(&x->c, memory_order_acquire);
    if (!c)
        return hni_set_err(x, HNCCL_EINVAL,
                           "hnccl_register_heap: no heapc context: pass one, or give one to hnccl_new or "
                           "hnccl_set_heapc");
    if (heapc_world_size(c) == 0)
        return hni_set_err(x, HNCCL_EINVAL,
                           "hnccl_register_heap: the heapc context is not attached to a heap; call heapc_attach "
                           "first");
    const hnccl_table *t = hni_table(x);
    if (!t)
        return HNCCL_ELOAD;
    if (!t->CommWindowRegister || !t->CommWindowDeregister)
        return hni_set_err(x, HNCCL_ELOAD,
                           "hnccl_register_heap: %s has no ncclCommWindowRegister/ncclCommWindowDeregister; "
                           "windows need NCCL 2.27 or newer",
                           x->user_table ? "the function table set with hnccl_set_table" : "libnccl.so.2");
    pthread_mutex_lock(&x->wmu);
    if (x->wc) {
        const char *was = heapc_heap_name(x->wc);
        pthread_mutex_unlock(&x->wmu);
        return hni_set_err(x, HNCCL_EINVAL,
                           "hnccl_register_heap: this context registers heap %s already; call "
                           "hnccl_deregister_heap first, or use another context",
                           was);
    }
    x->wc = c;
    x->wcomm = comm;
    x->wt = t;
    x->wst.registered = 1;
    uint64_t errs = x->wst.register_errors;
    pthread_mutex_unlock(&x->wmu);
    hni_ok(x);
    if (heapc_set_map_hook(c, map_hook, x) != HEAPC_OK) { /* else: registers what is mapped now */
        pthread_mutex_lock(&x->wmu);
        x->wc = NULL;
        x->wst.registered = 0;
        pthread_mutex_unlock(&x->wmu);
        return hni_set_err(x, HNCCL_EINVAL, "hnccl_register_heap: %s", heapc_errstr(c));
    }
    pthread_mutex_lock(&x->wmu);
    int failed = x->wst.register_errors != errs;
    pthread_mutex_unlock(&x->wmu);
    if (!failed)
        return hni_ok(x);
    int code = hnccl_err(x);
    char msg[ERRSTR_LEN];
    snprintf(msg, sizeof msg, "%s", hnccl_errstr(x));
    hnccl_deregister_heap(x);
    return hni_set_err(x, code, "hnccl_register_heap: %s; nothing stays registered", msg);
}

int hnccl_deregister_heap(hnccl_ctx *x)
{
    if (!x)
        return HNCCL_EINVAL;
    pthread_mutex_lock(&x->wmu);
    heapc *c = x->wc;
    pthread_mutex_unlock(&x->wmu);
    if (!c)
        return hni_ok(x);
    heapc_set_map_hook(c, NULL, NULL);
    pthread_mutex_lock(&x->wmu);
    uint64_t errs = x->wst.register_errors;
    hni_ok(x);
    drop_all(x);
    int failed = x->wst.register_errors != errs;
    x->wc = NULL;
    x->wst.registered = 0;
    pthread_mutex_unlock(&x->wmu);
    return failed ? hnccl_err(x) : HNCCL_OK;
}

int hnccl_get_window_stats(hnccl_ctx *x, hnccl_window_stats *out)
{
    if (!x || !out)
        return HNCCL_EINVAL;
    pthread_mutex_lock(&x->wmu);
    *out = x->wst;
    pthread_mutex_unlock(&x->wmu);
    return HNCCL_OK;
}

void hni_win_free(hnccl_ctx *x)
{
    hnccl_deregister_heap(x);
    free(x->ext);
    x->ext = NULL;
    pthread_mutex_destroy(&x->wmu);
}
