/* release.c - the heap wing's release, restore and trim (issue 30):
 * collective over the heap's local ranks like Commit, with its own state and
 * timer (the heap's collect timeout). When every local rank asked, Release
 * copies the chunks into the heap's host copy (mode host), releases every
 * local rank's chunks and answers each rank; Restore creates them again (the
 * same count and size), refills them from the host copy and sends them to
 * each rank; Trim gives back the whole chunks that hold no block (ha_trim:
 * the top's and holes below a live block), on every local rank. A release
 * may name blocks: only the chunks wholly inside them go (rel_list). A rank gone or a timeout
 * fails it on every rank with nothing changed.
 * Middle floor (heap_int.h). */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"

/* The collectives: their names for messages, past participles, and the
 * heap's state a failure leaves. */
enum { REL_RELEASE, REL_RESTORE, REL_TRIM };
static const struct {
    const char *name, *done, *after_fail;
} rel_kinds[] = {
    [REL_RELEASE] = {"release", "released", "still active"},
    [REL_RESTORE] = {"restore", "restored", "still released"},
    [REL_TRIM] = {"trim", "trimmed", "unchanged"},
};

/* The collective in progress. Invariant: active <=> waiting > 0 <=> the
 * heap's rel_left is set; waiting == number of ranks with in_rel; kind is
 * REL_*; kind == REL_TRIM => the heap's mstate is ACTIVE. */
struct hh_release {
    uv_timer_t timer; /* first: the close callback frees the struct */
    hd_heap *h;
    bool active;
    int kind;
    int mode;
    bool keep;
    uint32_t first, waiting;
    char **names; /* a release of named blocks: the first rank's (n_names) */
    size_t n_names;
};

static void names_free(struct hh_release *s)
{
    for (size_t i = 0; i < s->n_names; i++)
        free(s->names[i]);
    free(s->names);
    s->names = NULL;
    s->n_names = 0;
}

static void rel_closed(uv_handle_t *t)
{
    names_free(t->data);
    free(t->data);
}

/* The collective is over (every waiting rank was answered). */
static void rel_end(hd_heap *h)
{
    struct hh_release *s = h->rel;
    s->active = false;
    s->waiting = 0;
    names_free(s);
    h->rel_left = NULL;
    uv_timer_stop(&s->timer);
}

static void host_copy_free(hd_heap *h)
{
    if (!h->hc_ptr)
        return;
    if (h->hc_pinned)
        hb_host_unpin(h->reg->be, h->hc_ptr);
    munmap(h->hc_ptr, h->hc_size);
    h->hc_ptr = NULL;
    h->hc_size = 0;
    h->hc_pinned = h->hc_full = h->hc_keep = false;
}

/* The heap's rel_gone: the heap is destroyed. */
static void rel_gone(hd_heap *h)
{
    struct hh_release *s = h->rel;
    host_copy_free(h);
    free(h->rel_idx);
    h->rel_idx = NULL;
    h->rel_n = 0;
    h->rel = NULL;
    h->rel_left = NULL;
    uv_timer_stop(&s->timer);
    uv_close((uv_handle_t *)&s->timer, rel_closed);
}

static const char *what(int kind) { return rel_kinds[kind].name; }

/* The next rank (from *q on) waiting in the collective, taken out of it
 * (in_rel cleared); NULL when none is left. */
static hd_rank *take_waiting(hd_heap *h, uint32_t *q)
{
    for (; *q < h->world_size; ++*q)
        if (h->ranks[*q].in_rel) {
            h->ranks[*q].in_rel = false;
            return &h->ranks[(*q)++];
        }
    return NULL;
}

static bool in_rel(const hd_rank *k) { return k->in_rel; }

/* Ends the collective: every waiting rank gets code and msg; the state goes
 * back to what it was before it began. */
static void rel_fail(hd_heap *h, Heapd__ErrCode code, const char *msg)
{
    struct hh_release *s = h->rel;
    h->mstate = s->kind == REL_RESTORE ? HS_STATE_RELEASED : HS_STATE_ACTIVE;
    hh_heap_publish(h); /* the page is current before any rank hears back */
    uint32_t q = 0;
    for (hd_rank *k; (k = take_waiting(h, &q));)
        if (k->conn)
            hd_peer_error(k->conn, k->rel_id, code, "%s", msg);
    rel_end(h);
}

static void rel_rank_left(hd_heap *h, uint32_t rank, bool clean)
{
    char msg[512];
    snprintf(msg, sizeof msg,
             "%s of heap \"%s\" failed: rank %u (pid %ld) %s while the others waited; nothing was %s (the heap "
             "is %s)",
             what(h->rel->kind), h->name, rank, (long)h->ranks[rank].pid, clean ? "detached" : "disconnected",
             rel_kinds[h->rel->kind].done, rel_kinds[h->rel->kind].after_fail);
    rel_fail(h, HEAPD__ERR_CODE__ERR_PEER_GONE, msg);
}

static void rel_timeout(uv_timer_t *t)
{
    struct hh_release *s = t->data;
    hd_heap *h = s->h;
    if (!s->active)
        return;
    char missing[400], msg[1000];
    hh_ranks_not_in(h, in_rel, missing, sizeof missing);
    snprintf(msg, sizeof msg,
             "%s of heap \"%s\" timed out after %u ms: rank(s) %s never called it; every local rank must call "
             "it (nothing changed)",
             what(s->kind), h->name, h->timeout_ms, missing);
    hd_warn("%s", msg);
    rel_fail(h, HEAPD__ERR_CODE__ERR_TIMEOUT, msg);
}

static struct hh_release *rel_state(hd_heap *h)
{
    if (h->rel)
        return h->rel;
    struct hh_release *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->h = h;
    uv_timer_init(h->reg->loop, &s->timer);
    s->timer.data = s;
    h->rel = s;
    h->rel_gone = rel_gone;
    return s;
}

/* Chunks per rank (every joined rank has the same count). */
static uint32_t rank_chunks(const hd_heap *h)
{
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].joined)
            return h->ranks[q].nchunks;
    return 0;
}

/* A host copy of `size` bytes (a memfd heapd maps; its pages come at the
 * first copy), pinned for the device's copies. 0, or -1 with why. */
static int host_copy_make(hd_heap *h, uint64_t size, char *why, size_t len)
{
    if (h->hc_ptr && h->hc_size == size)
        return 0;
    host_copy_free(h);
    char name[64];
    snprintf(name, sizeof name, "heapd-copy-%.40s", h->name);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        snprintf(why, len,
                 "heapd could not make a %llu-byte host copy of heap \"%s\" (memfd: %m); free host "
                 "memory or release with mode discard",
                 (unsigned long long)size, h->name);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, len, "heapd could not map a %llu-byte host copy of heap \"%s\": %m", (unsigned long long)size,
                 h->name);
        return -1;
    }
    h->hc_ptr = p;
    h->hc_size = size;
    char err[400];
    if (hb_host_pin(h->reg->be, p, size, err, sizeof err) == HB_OK)
        h->hc_pinned = true;
    else
        hd_warn("heap \"%s\": the host copy is not pinned (copies run slower): %s", h->name, err);
    return 0;
}

/* Local rank k's p-th chunk of the n released (rel_idx) in the host copy. */
static uint8_t *copy_at(const hd_heap *h, const hd_rank *k, uint32_t p, uint32_t n)
{
    return (uint8_t *)h->hc_ptr + ((uint64_t)k->lidx * n + p) * h->ap.chunk_size;
}

/* The chunk indices the release gives up, ascending, into *idx (malloc'd)
 * and *n: every chunk but the holes, or (names) those wholly inside the
 * named live blocks. 0, or -1 with the error. */
static int rel_list(hd_heap *h, uint32_t nch, uint32_t **idx, uint32_t *n, Heapd__ErrCode *code, char *err, size_t len)
{
    const struct hh_release *s = h->rel;
    uint8_t *mark = calloc(nch + 1, 1);
    *idx = calloc(nch + 1, sizeof **idx);
    *n = 0;
    const char *missing = NULL;
    *code = HEAPD__ERR_CODE__ERR_NO_MEMORY;
    if (!mark || !*idx)
        snprintf(err, len, "heapd is out of memory (nothing was released)");
    else if (s->n_names && hh_blocks_chunks(h, s->names, s->n_names, nch, mark, &missing)) {
        *code = HEAPD__ERR_CODE__ERR_NOT_FOUND;
        snprintf(err, len,
                 "release of heap \"%s\": no live block is named \"%s\" (heapc_live lists them); nothing was "
                 "released",
                 h->name, missing);
    } else {
        for (uint32_t j = 0; j < nch; j++)
            if (s->n_names ? mark[j] : !ha_chunk_hole(h->core, j))
                (*idx)[(*n)++] = j;
        free(mark);
        return 0;
    }
    free(mark);
    free(*idx);
    *idx = NULL;
    return -1;
}

/* Mode host: copies every local rank's chunks idx[0..n) into the host
 * copy. 0, or -1 with the error. */
static int save_chunks(hd_heap *h, const uint32_t *idx, uint32_t n, uint64_t *saved, char *err, size_t len)
{
    char e2[400];
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        for (uint32_t p = 0; k->joined && p < n; p++) {
            if (hb_chunk_save(h->reg->be, &k->chunks[idx[p]], copy_at(h, k, p, n), e2, sizeof e2)) {
                snprintf(err, len,
                         "release of heap \"%s\": copying chunk %u of rank %u failed: %s (nothing was released)",
                         h->name, idx[p], q, e2);
                return -1;
            }
            *saved += h->ap.chunk_size;
        }
    }
    return 0;
}

/* Every local rank asked for the release: copy (mode host), release, reply. */
static void release_done(hd_heap *h)
{
    struct hh_release *s = h->rel;
    uint64_t t0 = uv_hrtime(), released = 0, saved = 0;
    uint32_t *idx, n;
    char err[800];
    Heapd__ErrCode code = HEAPD__ERR_CODE__ERR_NO_MEMORY;
    if (rel_list(h, rank_chunks(h), &idx, &n, &code, err, sizeof err)) {
        rel_fail(h, code, err);
        return;
    }
    if (s->mode == HEAPD__RELEASE_MODE__RELEASE_HOST && n) { /* n 0: named blocks without a whole chunk */
        int rc = host_copy_make(h, (uint64_t)h->local_size * n * h->ap.chunk_size, err, sizeof err);
        if (!rc && save_chunks(h, idx, n, &saved, err, sizeof err))
            rc = -1, code = HEAPD__ERR_CODE__ERR_BACKEND;
        if (rc) {
            free(idx);
            rel_fail(h, code, err);
            return;
        }
        h->hc_full = true;
        h->hc_keep = s->keep;
    } else if (h->hc_ptr && !h->hc_keep) {
        host_copy_free(h);
    } else {
        h->hc_full = false;
    }
    hh_spare_drop(h); /* issue 27: a released heap keeps no spares */
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        for (uint32_t p = 0; k->joined && p < n; p++) {
            released += k->chunks[idx[p]].size;
            hb_chunk_release(h->reg->be, &k->chunks[idx[p]]);
        }
    }
    free(h->rel_idx);
    h->rel_idx = idx;
    h->rel_n = n;
    h->mstate = HS_STATE_RELEASED;
    h->releases++;
    uint64_t us = (uv_hrtime() - t0) / 1000;
    char b1[32];
    hd_info("heap \"%s\" released: %s of chunks%s (%s into host memory) in %llu us", h->name,
            hh_human(released, b1, sizeof b1), s->n_names ? ", those of the named blocks" : "",
            saved ? "copied" : "nothing copied", (unsigned long long)us);
    hh_heap_publish(h);
    hd_release_out o = {released, saved, us, s->n_names > 0, idx, n};
    uint32_t q = 0;
    for (hd_rank *k; (k = take_waiting(h, &q));)
        k->conn->out->release(k->conn, k->rel_id, &o);
    rel_end(h);
}

/* Creates every local rank's released chunks (rel_idx) again and refills
 * them from the host copy. 0, or -1 with the error (every chunk made is
 * released again). */
static int restore_chunks(hd_heap *h, uint64_t *restored, Heapd__ErrCode *code, char *err, size_t len)
{
    uint32_t n = h->rel_n;
    uint64_t bytes = (uint64_t)h->local_size * n * h->ap.chunk_size;
    *code = HEAPD__ERR_CODE__ERR_QUOTA;
    if (hh_quota_check(h->reg, h->name, h->owner, 0, bytes, 0, err, len) &&
        (!hh_spare_yield(h->reg, h->owner, NULL, 0) ||
         hh_quota_check(h->reg, h->name, h->owner, 0, bytes, 0, err, len)))
        return -1; /* issue 27: the uid's spares yield first */
    *code = HEAPD__ERR_CODE__ERR_NO_MEMORY;
    char e2[400];
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        for (uint32_t p = 0; k->joined && p < n; p++) {
            uint32_t j = h->rel_idx[p];
            int rc = hb_chunk_create(h->reg->be, k->device, h->ap.chunk_size, &k->chunks[j], e2, sizeof e2);
            if (!rc && h->hc_full) {
                rc = hb_chunk_load(h->reg->be, &k->chunks[j], copy_at(h, k, p, n), e2, sizeof e2);
                *code = rc ? HEAPD__ERR_CODE__ERR_BACKEND : *code;
                *restored += rc ? 0 : h->ap.chunk_size;
            }
            if (rc) {
                snprintf(err, len,
                         "restore of heap \"%s\": chunk %u of rank %u: %s (the heap stays released; "
                         "free device memory and restore again)",
                         h->name, j, q, e2);
                for (uint32_t r = 0; r <= q; r++)
                    for (uint32_t i = 0; i < n; i++)
                        hb_chunk_release(h->reg->be, &h->ranks[r].chunks[h->rel_idx[i]]);
                return -1;
            }
        }
    }
    return 0;
}

static void restore_done(hd_heap *h)
{
    uint64_t t0 = uv_hrtime(), restored = 0;
    uint32_t nch = rank_chunks(h);
    char err[800];
    Heapd__ErrCode code;
    if (restore_chunks(h, &restored, &code, err, sizeof err)) {
        rel_fail(h, code, err);
        return;
    }
    uint32_t made = h->rel_n;
    free(h->rel_idx);
    h->rel_idx = NULL;
    h->rel_n = 0;
    h->hc_full = false;
    if (!h->hc_keep)
        host_copy_free(h);
    h->mstate = HS_STATE_ACTIVE;
    h->restores++;
    uint64_t us = (uv_hrtime() - t0) / 1000;
    ha_stats st;
    ha_get_stats(h->core, &st);
    hd_info("heap \"%s\" restored: %u of its %u chunks per rank, %llu bytes refilled, in %llu us", h->name, made, nch,
            (unsigned long long)restored, (unsigned long long)us);
    hh_heap_publish(h);
    uint32_t q = 0;
    for (hd_rank *k; (k = take_waiting(h, &q));) {
        chunk_msg cm;
        if (hh_chunk_msg_build(h, 0, nch, &cm)) {
            hd_peer_error(k->conn, k->rel_id, HEAPD__ERR_CODE__ERR_NO_MEMORY,
                          "heapd could not duplicate chunk fds for the restore reply (out of fds or memory); raise "
                          "heapd's fd limit (LimitNOFILE); the heap is restored: detach and attach again");
            continue;
        }
        hd_restore_out o = {.chunks = cm.refs,
                            .fds = cm.fds,
                            .nchunks = cm.n,
                            .mapped = st.mapped,
                            .restored_bytes = restored,
                            .elapsed_us = us};
        k->conn->out->restore(k->conn, k->rel_id, &o);
        hh_chunk_msg_free(&cm, false);
    }
    rel_end(h);
    hh_spare_kick(h); /* issue 27: after the replies */
}

/* ha_trim's chunk indices, in idx (room for every chunk). */
struct trim_idx {
    uint32_t *idx;
    uint32_t n;
};

static void trim_note(void *data, uint32_t i)
{
    struct trim_idx *t = data;
    t->idx[t->n++] = i;
}

/* Every local rank asked for the trim: the allocator gives up the wholly
 * free chunks (ha_trim: no live or pending block there, and none can be
 * decided meanwhile: this runs within one request), the holes below the
 * top and the top's, every local rank's chunk records there are released
 * (a hole's record stays, absent: fd -1), and each rank is told which
 * indices to unmap. */
static void trim_done(hd_heap *h)
{
    uint64_t t0 = uv_hrtime(), cs = h->ap.chunk_size;
    ha_stats st;
    ha_get_stats(h->core, &st);
    uint32_t have = hh_heap_chunks(h, st.mapped), cut = 0;
    struct trim_idx ti = {malloc(have * sizeof *ti.idx), 0};
    if (!ti.idx || ha_trim(h->core, &cut, trim_note, &ti)) {
        free(ti.idx);
        rel_fail(h, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory (nothing was trimmed)");
        return;
    }
    ha_get_stats(h->core, &st);
    uint32_t keep = hh_heap_chunks(h, st.mapped);
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (!k->joined)
            continue;
        for (uint32_t j = 0; j < ti.n && ti.idx[j] < keep; j++)
            hb_chunk_release(h->reg->be, &k->chunks[ti.idx[j]]); /* a hole: absent until a growth */
        hh_rank_trim_chunks(h, k, keep);
        if (k->known_chunks > keep)
            k->known_chunks = keep; /* a growth sends these indices again */
    }
    h->trim_at = UINT64_MAX; /* an automatic trim owed (issue 30) is done */
    uint64_t per_rank = (uint64_t)cut * cs, backed = hh_backed(&st);
    if (cut) {
        h->trims++;
        h->trimmed_bytes += per_rank * h->local_size;
    }
    uint64_t us = (uv_hrtime() - t0) / 1000;
    char b1[32], b2[32], b3[32];
    hd_log(cut ? HD_LOG_INFO : HD_LOG_DEBUG,
           "heap \"%s\" trimmed: %u chunk%s (%s) on each of %u ranks, %s mapped per rank now (%s in holes), in %llu us",
           h->name, cut, cut == 1 ? "" : "s", hh_human(per_rank, b1, sizeof b1), h->local_size,
           hh_human(backed, b2, sizeof b2), hh_human(st.hole_bytes, b3, sizeof b3), (unsigned long long)us);
    hh_heap_publish(h);
    hd_trim_out o = {
        .trimmed_bytes = per_rank, .mapped = st.mapped, .elapsed_us = us, .chunks = ti.idx, .nchunks = cut};
    uint32_t q = 0;
    for (hd_rank *k; (k = take_waiting(h, &q));)
        k->conn->out->trim(k->conn, k->rel_id, &o);
    free(ti.idx);
    rel_end(h);
}

#define REL_NAMES_MAX 256 /* names a Release may give */

/* A Release's names: at most REL_NAMES_MAX, each a valid allocation name.
 * 0, or -1 once answered. */
static int names_check(hd_peer *c, uint64_t id, char *const *names, size_t n)
{
    char why[200];
    if (n > REL_NAMES_MAX) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "release: %zu block names, over the limit of %d; release fewer names at a time", n,
                      REL_NAMES_MAX);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!names[i][0])
            snprintf(why, sizeof why, "is empty; give the names the blocks were allocated with");
        if (!names[i][0] || hh_name_check(names[i], why, sizeof why)) {
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "release: block name %zu %s", i, why);
            return -1;
        }
    }
    return 0;
}

/* The names of a release that began (s) and of a rank's request are the
 * same, in the same order. */
static bool same_names(const struct hh_release *s, char *const *names, size_t n)
{
    if (s->n_names != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(s->names[i], names[i]))
            return false;
    return true;
}

/* The first rank's names, kept for release_done. 0, or -1 out of memory. */
static int names_keep(struct hh_release *s, char *const *names, size_t n)
{
    s->names = n ? calloc(n, sizeof *s->names) : NULL;
    if (n && !s->names)
        return -1;
    for (s->n_names = 0; s->n_names < n; s->n_names++)
        if (!(s->names[s->n_names] = strdup(names[s->n_names]))) {
            names_free(s);
            return -1;
        }
    return 0;
}

/* The request's checks against the heap's state. 0, or -1 once answered. */
static int rel_check(hd_heap *h, hd_peer *c, uint64_t id, int kind, int mode, bool keep)
{
    const struct hh_release *s = h->rel;
    uint32_t rank = hd_peer_binding(c)->rank;
    bool restore = kind == REL_RESTORE;
    char msg[512];
    if (h->ranks[rank].in_rel)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "rank %u is already waiting in a %s", rank, what(s->kind));
    else if (s && s->active && s->kind != kind)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                      "heap \"%s\": a %s is in progress (rank %u began it); every rank must call the same", h->name,
                      what(s->kind), s->first);
    else if (kind == REL_TRIM && h->local_size < h->world_size)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "heap \"%s\" spans nodes: trim is not built across nodes (each node's allocator must shrink "
                      "at the same allocation number); release and restore work",
                      h->name);
    else if (kind == REL_TRIM && hh_released(h))
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                      "heap \"%s\" is released: none of its chunks is backed, nothing to trim; restore it first",
                      h->name);
    else if (kind == REL_RELEASE && hh_released(h))
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE, "heap \"%s\" is already released; restore it first", h->name);
    else if (restore && h->mstate == HS_STATE_ACTIVE)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE, "heap \"%s\" is not released: nothing to restore", h->name);
    else if (kind == REL_RELEASE && mode != HEAPD__RELEASE_MODE__RELEASE_DISCARD &&
             mode != HEAPD__RELEASE_MODE__RELEASE_HOST)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "release mode %d is unknown: use discard (0) or host (1)",
                      mode);
    else if (kind == REL_RELEASE && keep && mode != HEAPD__RELEASE_MODE__RELEASE_HOST)
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "keep goes with release mode host only");
    else if (hh_unconnected_rank(h, what(kind), "it must re-attach first", msg, sizeof msg)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_PEER_GONE, "%s", msg);
        if (s && s->active)
            rel_fail(h, HEAPD__ERR_CODE__ERR_PEER_GONE, msg);
    } else
        return 0;
    return -1;
}

static void rel_join(hd_peer *c, uint64_t id, int kind, int mode, bool keep, char *const *names, size_t n)
{
    hd_heap *h = hh_formed_heap(c, id, what(kind));
    if (!h || hh_poison_check(h, c, id) || rel_check(h, c, id, kind, mode, keep) || names_check(c, id, names, n))
        return;
    struct hh_release *s = rel_state(h);
    if (!s) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
        return;
    }
    uint32_t rank = hd_peer_binding(c)->rank;
    if (s->active && kind == REL_RELEASE && (s->mode != mode || s->keep != keep || !same_names(s, names, n))) {
        char msg[600];
        snprintf(msg, sizeof msg,
                 "asymmetric release of heap \"%s\": rank %u asked for mode %s%s, rank %u for mode %s%s (%zu and "
                 "%zu block names); every rank must release the same way, the same block names in the same order "
                 "(nothing was released)",
                 h->name, s->first, s->mode ? "host" : "discard", s->keep ? " with keep" : "", rank,
                 mode ? "host" : "discard", keep ? " with keep" : "", s->n_names, n);
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "%s", msg);
        rel_fail(h, HEAPD__ERR_CODE__ERR_INVALID, msg);
        return;
    }
    if (!s->active && names_keep(s, names, n)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
        return;
    }
    if (!s->active) {
        s->active = true;
        s->kind = kind;
        s->mode = mode;
        s->keep = keep;
        s->first = rank;
        h->rel_left = rel_rank_left;
        if (kind != REL_TRIM)
            h->mstate = kind == REL_RESTORE ? HS_STATE_RESTORING : HS_STATE_RELEASING;
        uv_update_time(h->reg->loop);
        uv_timer_start(&s->timer, rel_timeout, h->timeout_ms, 0);
        hh_heap_publish(h);
    }
    hd_rank *k = &h->ranks[rank];
    k->in_rel = true;
    k->rel_id = id;
    if (++s->waiting == h->local_size)
        (kind == REL_RESTORE ? restore_done : kind == REL_TRIM ? trim_done : release_done)(h);
}

void hd_heap_release(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Release *m)
{
    (void)r;
    rel_join(c, id, REL_RELEASE, (int)m->mode, m->keep, m->names, m->n_names);
}

void hd_heap_restore(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Restore *m)
{
    (void)r, (void)m;
    rel_join(c, id, REL_RESTORE, 0, false, NULL, 0);
}

void hd_heap_trim(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Trim *m)
{
    (void)r, (void)m;
    rel_join(c, id, REL_TRIM, 0, false, NULL, 0);
}
