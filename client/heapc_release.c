/* heapc_release.c - release, restore and trim (issue 30; heapc.h): the
 * rank's side of heapd's collective. A trim unmaps the chunks heapd gave
 * back (every local rank's: the top's, lowering `mapped` first, and the
 * holes below it, which a later growth maps again at their addresses). A release unmaps every local rank's chunks
 * once heapd answered (heapd copied and released its own references
 * first); a restore maps the chunks heapd made again at the same slots. The
 * address reservations and `mapped` stay, so pointers stay valid. */
#include "heapc_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* heapd released the chunks rr lists (some), or every chunk: ours go now,
 * every local rank's (the memory goes with the last reference). 0, or 1 if
 * some unmapping failed. */
/* Issue 32: the map hook hears of this rank's chunks an operation unmaps
 * before they go: chunks[0..n) and [from, to) (a trim's holes and top, a
 * release of named blocks' chunks). */
static void removing_hook(heapc *c, const view *v, const uint32_t *chunks, size_t n, uint64_t from, uint64_t to)
{
    if (!c->map_fn)
        return;
    int32_t own = c->local_index[v->rank];
    uint32_t slots = own >= 0 ? c->spaces[own].nchunks : 0;
    uint8_t *mark = calloc(slots ? slots : 1, 1);
    if (!mark) { /* out of memory: every chunk (the hook loses the rest too) */
        hci_hook_emit(c, v->rank, HEAPC_MAP_REMOVING, NULL);
        return;
    }
    for (size_t j = 0; j < n; j++)
        if (chunks[j] < slots)
            mark[chunks[j]] = 1;
    for (uint64_t j = from; j < to && j < slots; j++)
        mark[j] = 1;
    hci_hook_emit(c, v->rank, HEAPC_MAP_REMOVING, mark);
    free(mark);
}

static int release_unmap(heapc *c, const Heapd__ReleaseReply *rr)
{
    const view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    if (!rr->some) /* issue 32: the hook hears of it first */
        hci_hook_emit(c, v->rank, HEAPC_MAP_REMOVING, NULL);
    else
        removing_hook(c, v, rr->chunks, rr->n_chunks, 0, 0);
    int bad = 0;
    for (uint32_t i = 0; i < v->nlocal; i++) {
        if (!rr->some) {
            bad |= hm_unmap_chunks(&c->spaces[i]) != HM_OK;
            continue;
        }
        for (size_t j = 0; j < rr->n_chunks; j++)
            bad |= hm_unmap_range(&c->spaces[i], rr->chunks[j], rr->chunks[j] + 1) != HM_OK;
    }
    return bad;
}

static int release_locked(heapc *c, int mode, const char *const *names, size_t nnames)
{
    if (!c->attached)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_release: not attached to a heap; call heapc_attach");
    int base = mode & ~HEAPC_RELEASE_KEEP;
    if (base != HEAPC_RELEASE_DISCARD && base != HEAPC_RELEASE_HOST)
        return hci_set_err(c, HEAPC_EINVAL,
                           "heapc_release: mode %d is unknown; give HEAPC_RELEASE_DISCARD or HEAPC_RELEASE_HOST "
                           "(| HEAPC_RELEASE_KEEP with host)",
                           mode);
    if ((mode & HEAPC_RELEASE_KEEP) && base != HEAPC_RELEASE_HOST)
        return hci_set_err(c, HEAPC_EINVAL, "heapc_release: HEAPC_RELEASE_KEEP goes with HEAPC_RELEASE_HOST only");
    for (size_t i = 0; i < nnames; i++)
        if (!names[i] || !names[i][0])
            return hci_set_err(c, HEAPC_EINVAL,
                               "heapc_release_named: name %zu is %s; give the names the blocks were allocated with", i,
                               names[i] ? "empty" : "NULL");
    if (c->mstate == HEAPC_STATE_RELEASED)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_release: heap %s is already released; call heapc_restore first",
                           c->heap);
    int rc = hci_fence_wait_early(c); /* the memory goes: nothing freed early may be in use */
    if (rc == HEAPC_OK)
        rc = hci_flush_all_locked(c);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__Release rm = HEAPD__RELEASE__INIT;
    rm.mode = base == HEAPC_RELEASE_HOST ? HEAPD__RELEASE_MODE__RELEASE_HOST : HEAPD__RELEASE_MODE__RELEASE_DISCARD;
    rm.keep = (mode & HEAPC_RELEASE_KEEP) != 0;
    rm.n_names = nnames;
    rm.names = (char **)names;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_RELEASE;
    req.release = &rm;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_RELEASE_REPLY, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    int bad = release_unmap(c, rep->release_reply);
    hci_rpc_done(rep, &raw);
    c->mstate = HEAPC_STATE_RELEASED;
    if (bad)
        return hci_set_err(c, HEAPC_EMAP,
                           "heapc_release: heap %s is released, but unmapping some of its chunks here failed (their "
                           "memory stays until this process exits)",
                           c->heap);
    return HEAPC_OK;
}

/* Issue 30: chunk j is a hole (trimmed below the top): no local rank has it. */
static int hole_everywhere(heapc *c, const view *v, uint64_t j)
{
    for (uint32_t i = 0; i < v->nlocal; i++)
        if (hm_is_mapped(&c->spaces[i], (uint32_t)j))
            return 0;
    return 1;
}

static int restore_locked(heapc *c)
{
    if (!c->attached)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_restore: not attached to a heap; call heapc_attach");
    if (c->mstate != HEAPC_STATE_RELEASED)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_restore: heap %s is not released; nothing to restore", c->heap);
    Heapd__Restore rm = HEAPD__RESTORE__INIT;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_RESTORE;
    req.restore = &rm;
    Heapd__Frame *rep;
    hw_frame raw;
    int rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_RESTORE_REPLY, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    const view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    const Heapd__RestoreReply *rr = rep->restore_reply;
    rc = hci_map_chunks(c, v, rr->chunks, rr->n_chunks, &raw);
    uint64_t cs = c->params.chunk_size, want = atomic_load_explicit(&c->mapped, memory_order_relaxed) / cs;
    for (uint32_t i = 0; rc == HEAPC_OK && i < v->nlocal; i++)
        for (uint64_t j = 0; j < want; j++)
            if (!hm_is_mapped(&c->spaces[i], (uint32_t)j) && !hole_everywhere(c, v, j)) {
                rc = hci_set_err(c, HEAPC_EPROTOCOL,
                                 "heapc_restore: heapd restored heap %s without chunk %" PRIu64 " of rank %" PRIu32
                                 "; report this heapd bug",
                                 c->heap, j, v->local[i]);
                break;
            }
    hci_rpc_done(rep, &raw);
    if (rc != HEAPC_OK) {
        hci_hook_emit(c, v->rank, HEAPC_MAP_REMOVING, NULL);
        for (uint32_t i = 0; i < v->nlocal; i++)
            hm_unmap_chunks(&c->spaces[i]);
        return rc;
    }
    c->mstate = HEAPC_STATE_ACTIVE;
    return HEAPC_OK;
}

int hci_trim_locked(heapc *c, uint64_t *trimmed)
{
    if (!c->attached)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_trim: not attached to a heap; call heapc_attach");
    if (c->mstate == HEAPC_STATE_RELEASED)
        return hci_set_err(c, HEAPC_ESTATE, "heapc_trim: heap %s is released: nothing to trim; call heapc_restore",
                           c->heap);
    /* The frees whose stream work completed (no device sync): their blocks
     * may be all that holds a chunk. */
    int rc = hci_fence_wait_early(c); /* a block released early may still be in use */
    if (rc == HEAPC_OK)
        rc = hci_flush_all_locked(c);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__Trim tm = HEAPD__TRIM__INIT;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_TRIM;
    req.trim = &tm;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = hci_rpc(c, &req, HEAPD__FRAME__BODY_TRIM_REPLY, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    const Heapd__TrimReply *tr = rep->trim_reply;
    uint64_t cs = c->params.chunk_size, was = atomic_load_explicit(&c->mapped, memory_order_relaxed);
    /* Issue 30: the chunks trimmed are the top's, [mapped, was) (those not
     * listed were holes, unmapped already), and holes below mapped. */
    int odd = tr->mapped % cs || tr->mapped > was || tr->n_chunks * cs > was;
    for (size_t j = 0; !odd && j < tr->n_chunks; j++)
        odd = (uint64_t)tr->chunks[j] >= was / cs;
    if (odd) {
        rc = hci_set_err(c, HEAPC_EPROTOCOL,
                         "heapc_trim: heapd trimmed heap %s to %" PRIu64 " bytes by %zu chunks, but %" PRIu64
                         " bytes are mapped here; report this heapd bug",
                         c->heap, tr->mapped, tr->n_chunks, was);
        hci_rpc_done(rep, &raw);
        return rc;
    }
    /* heapd released its references: ours go now (the extent first, so
     * that lookups no longer reach the slots). */
    atomic_store_explicit(&c->mapped, tr->mapped, memory_order_release);
    hrp_trimmed(&c->rep); /* issue 28: heapd's core trimmed here (ha_trim) */
    const view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    removing_hook(c, v, tr->chunks, tr->n_chunks, tr->mapped / cs, was / cs);
    int bad = 0;
    for (size_t j = 0; j < tr->n_chunks; j++)
        for (uint32_t i = 0; i < v->nlocal; i++)
            bad |= hm_unmap_range(&c->spaces[i], tr->chunks[j], tr->chunks[j] + 1) != HM_OK;
    for (uint32_t i = 0; i < v->nlocal; i++) /* the top: what is left there (nothing: holes) */
        bad |= hm_unmap_range(&c->spaces[i], (uint32_t)(tr->mapped / cs), (uint32_t)(was / cs)) != HM_OK;
    if (trimmed)
        *trimmed = tr->trimmed_bytes;
    hci_rpc_done(rep, &raw);
    if (bad)
        return hci_set_err(c, HEAPC_EMAP,
                           "heapc_trim: heap %s is trimmed, but unmapping some of its chunks here failed (their "
                           "memory stays until this process exits)",
                           c->heap);
    return HEAPC_OK;
}

int heapc_trim(heapc *c, uint64_t *trimmed_bytes)
{
    if (trimmed_bytes)
        *trimmed_bytes = 0;
    pthread_mutex_lock(&c->mu);
    int rc = hci_trim_locked(c, trimmed_bytes);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_release(heapc *c, int mode)
{
    pthread_mutex_lock(&c->mu);
    int rc = release_locked(c, mode, NULL, 0);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_release_named(heapc *c, int mode, const char *const *names, size_t nnames)
{
    if (!names || !nnames)
        return heapc_release(c, mode);
    pthread_mutex_lock(&c->mu);
    int rc = release_locked(c, mode, names, nnames);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_restore(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int rc = restore_locked(c);
    if (rc == HEAPC_OK)
        hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_state(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int s = c->attached ? c->mstate : -1;
    pthread_mutex_unlock(&c->mu);
    return s;
}
