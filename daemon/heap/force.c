/* force.c - the heap wing's forced collects: local, and the cross-node
 * agreement on the allocation number (see heap.h). Top floor (heap_int.h):
 * it subscribes itself to the store (hd_registry_set_store) and replays the
 * allocations held during an agreement through sequence.c. */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "store.h"

#define HD_FORCE_WINDOW 4096 /* nodes may be this many allocations apart */

static void force_start(hd_heap *h);

static void force_reply(hd_heap *h, int ok, uint64_t at, const char *msg)
{
    if (!h->force_conn)
        return;
    if (ok) {
        h->force_conn->out->force(h->force_conn, h->force_id, at);
    } else {
        hd_peer_error(h->force_conn, h->force_id, HEAPD__ERR_CODE__ERR_STORE, "%s", msg);
    }
    h->force_conn = NULL;
}

/* Decisions may go on: replay the allocations held during the agreement. */
static void force_thaw(hd_heap *h)
{
    h->frozen = false;
    h->force_busy = false;
    heap_ref *x = hh_heap_ref_new(h);
    hh_heap_replay_held(h);
    if (x && hh_heap_ref_get(x) && h->force_queued) {
        h->force_queued--;
        force_start(h);
    }
    free(x);
}

static void force_cb(void *arg, int status, const char *errmsg, const uint64_t *offsets, size_t n)
{
    heap_ref *x = arg;
    hd_heap *h = hh_heap_ref_get(x);
    free(x);
    if (!h || !h->force_busy)
        return;
    if (status < 0 || n == 0) {
        char msg[768];
        snprintf(msg, sizeof msg, "forced collect of heap \"%s\" abandoned: %s", h->name,
                 status < 0 ? (errmsg ? errmsg : "store error")
                            : "the nodes are more than 4096 allocations apart; retry");
        hd_warn("%s", msg);
        force_reply(h, 0, 0, msg);
    } else {
        /* The smallest common point is the furthest node's position. */
        uint64_t at = offsets[0];
        if (h->nforce < sizeof h->force_at / sizeof h->force_at[0] &&
            (h->nforce == 0 || at > h->force_at[h->nforce - 1]))
            h->force_at[h->nforce++] = at;
        else
            hd_warn("heap \"%s\": forced collect at %llu dropped: %u forced collects are already pending", h->name,
                    (unsigned long long)at, h->nforce);
        hd_info("heap \"%s\": forced collect agreed by every node at allocation %llu", h->name, (unsigned long long)at);
        force_reply(h, 1, at, NULL);
    }
    force_thaw(h);
}

/* Freezes decisions and asks the store for the common point: each node
 * offers [decided, decided + window); the intersection's least element is
 * the largest `decided` of all nodes. */
static void force_start(hd_heap *h)
{
    char err[512];
    uint32_t *lr = calloc(h->world_size, sizeof *lr);
    uint64_t *offs = calloc(HD_FORCE_WINDOW, sizeof *offs);
    heap_ref *x = hh_heap_ref_new(h);
    char inc[sizeof h->inc + 8];
    snprintf(inc, sizeof inc, "%s#force", h->inc);
    if (!lr || !offs || !x) {
        free(lr);
        free(offs);
        free(x);
        hd_error("heap \"%s\": out of memory for a forced collect", h->name);
        return;
    }
    /* Past every allocation any node has decided or tried: no node can
     * have a collect of its own at the agreed point. */
    /* Issue 28: a heap whose ranks decide offers the next horizons only
     * (a rank may be anywhere below the next one). */
    uint64_t le = h->local_every, first = le ? (h->decided + le) / le * le : h->decided + 1;
    for (uint64_t i = 0; i < HD_FORCE_WINDOW; i++)
        offs[i] = first + i * (le ? le : 1);
    size_t nl = hh_local_ranks(h, lr);
    h->force_busy = true;
    h->frozen = true;
    int rc = hd_store_collect(h->reg->store, h->name, inc, h->force_count++, h->world_size, lr, nl, offs,
                              HD_FORCE_WINDOW, h->timeout_ms, hh_store_ttl_s(h), force_cb, x, err, sizeof err);
    free(lr);
    free(offs);
    if (rc < 0) {
        free(x);
        hd_warn("heap \"%s\": forced collect not started: %s", h->name, err);
        force_reply(h, 0, 0, err);
        force_thaw(h);
    }
}

/* A force request reached this node (every node gets every request). */
static void on_force(void *arg, const char *heap, const char *incarnation)
{
    hd_registry *r = arg;
    hd_heap *h = hh_heap_find(r, heap);
    if (!h || !hh_multi(h) || !h->formed || strcmp(h->inc, incarnation))
        return;
    if (h->force_busy) {
        h->force_queued++;
        return;
    }
    force_start(h);
}

/* The registry's store, set here so that force.c subscribes itself to the
 * store's force requests (on_force, with the registry as data): the
 * registry does not know this file. */
void hd_registry_set_store(hd_registry *r, hd_store *store)
{
    r->store = store;
    if (store)
        hd_store_on_force(store, on_force, r);
}

void hd_heap_force_collect(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__ForceCollect *m)
{
    hd_heap *h = hh_heap_find(r, m->heap ? m->heap : "");
    if (!h) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NOT_FOUND, "no heap named \"%s\"; `heapctl heaps` lists them",
                      m->heap ? m->heap : "");
        return;
    }
    if (h->owner != hd_peer_uid(c) && !hd_peer_privileged(c, r->cfg.admin_gid)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_DENIED,
                      "forcing a collect on heap \"%s\" (uid %ld) needs root or membership of heapd.conf's "
                      "admin_group; uid %ld has neither",
                      h->name, (long)h->owner, (long)hd_peer_uid(c));
        return;
    }
    if (hh_multi(h)) {
        char err[512];
        if (h->force_conn) {
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                          "a forced collect of heap \"%s\" requested here is still being agreed on; retry", h->name);
            return;
        }
        if (hd_store_publish_force(r->store, h->name, h->inc, err, sizeof err) < 0) {
            hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STORE, "%s", err);
            return;
        }
        /* The reply comes once the nodes agreed on the allocation number. */
        h->force_conn = c;
        h->force_id = id;
        hd_info("heap \"%s\": forced collect requested by pid %ld; asking every node", h->name, (long)hd_peer_pid(c));
        return;
    }
    /* Issue 28: where ranks decide, at the next horizon, which none has
     * passed (one may have decided every allocation below it). */
    uint64_t le = h->local_every;
    h->collect_at = le ? (h->decided + le - 1) / le * le : h->decided;
    h->forced = true;
    hd_info("heap \"%s\": forced collect requested by pid %ld, at allocation %llu", h->name, (long)hd_peer_pid(c),
            (unsigned long long)h->collect_at);
    c->out->force(c, id, h->collect_at);
}
