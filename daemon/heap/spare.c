/* spare.c - the heap wing's growth ahead of need (issue 27): each local
 * rank of a heap keeps up to grow_ahead spare chunks, created and exported
 * (the backend's fd ready) off the allocation path, so that a growth costs
 * the fd passing and the client's mapping only (chunks.c's
 * hh_rank_add_chunks takes the spares first). The allocator core never sees
 * a spare: its decisions, and every rank's offsets, are what they were
 * without; spares change how fast a growth is served.
 *
 * The refill runs from one uv idle handle of the registry, started by
 * hh_spare_kick: the reply that asked for it went out before (the server
 * writes at once), and each loop turn makes one chunk, so requests queued
 * meanwhile are served between. Spares are charged like chunks (quota_heap,
 * quota_uid, max_chunk_fds_per_uid) and made only while they fit; they
 * yield to a real need (hh_spare_yield) and go with a release or the last
 * client. Spares floor (heap_int.h): it calls registry.c and chunks.c. */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>

#include "log.h"

static void idle_closed(uv_handle_t *t) { free(t); }

/* The registry's spare_gone: it is destroyed. */
static void spare_gone(hd_registry *r)
{
    uv_idle_stop(r->spare_idle);
    uv_close((uv_handle_t *)r->spare_idle, idle_closed);
    r->spare_idle = NULL;
    r->spare_gone = NULL;
}

/* The spares each local rank of h should hold now: grow_ahead, fewer where
 * va_size leaves less room; 0 while h cannot use one (no client, released,
 * poisoned, not formed). */
static uint32_t spare_target(const hd_heap *h)
{
    if (!h->grow_ahead || !h->formed || !h->nattached || h->mstate != HS_STATE_ACTIVE || hh_poisoned(h))
        return 0;
    ha_stats st;
    ha_get_stats(h->core, &st);
    uint64_t room = (h->ap.va_size - st.mapped) / h->ap.chunk_size;
    return room < h->grow_ahead ? (uint32_t)room : h->grow_ahead;
}

/* Makes one spare for a rank of h that lacks one. Returns true if it did
 * (there may be more to do), false when h needs none or one cannot be made
 * now (quota, fd limit, backend: the next kick tries again). */
static bool fill_one(hd_heap *h)
{
    uint32_t want = spare_target(h);
    hd_rank *k = NULL;
    for (uint32_t q = 0; q < h->world_size && !k; q++)
        if (h->ranks[q].joined && h->ranks[q].nspare < want)
            k = &h->ranks[q];
    if (!k)
        return false;
    ha_stats st;
    ha_get_stats(h->core, &st);
    char err[1024];
    if (hh_quota_check(h->reg, h->name, h->owner, hh_backed(&st) * h->local_size + hh_spare_bytes(h), h->ap.chunk_size,
                       0, err, sizeof err) ||
        hh_chunk_fds_check(h->reg, h->owner, 1, err, sizeof err) ||
        hh_rank_reserve(k, k->nchunks + k->nspare + 1, err, sizeof err)) {
        hd_debug("heap \"%s\": no spare chunk now: %s", h->name, err);
        return false;
    }
    hb_chunk *c = &k->chunks[k->nchunks + k->nspare];
    if (hb_chunk_create(h->reg->be, k->device, h->ap.chunk_size, c, err, sizeof err)) {
        hd_debug("heap \"%s\": no spare chunk now: %s", h->name, err);
        return false;
    }
    k->nspare++;
    h->gen++; /* Stats shows spare_bytes */
    return true;
}

static void refill(uv_idle_t *t)
{
    hd_registry *r = t->data;
    for (hd_heap *h = r->heaps; h; h = h->next)
        if (h->spare_want) {
            if (fill_one(h))
                return; /* one chunk a loop turn */
            h->spare_want = false;
        }
    uv_idle_stop(t);
}

void hh_spare_kick(hd_heap *h)
{
    hd_registry *r = h->reg;
    if (!h->grow_ahead)
        return;
    if (!r->spare_idle) {
        r->spare_idle = malloc(sizeof *r->spare_idle);
        if (!r->spare_idle)
            return; /* no spares: growths create their chunks */
        uv_idle_init(r->loop, r->spare_idle);
        r->spare_idle->data = r;
        r->spare_gone = spare_gone;
    }
    h->spare_want = true;
    uv_idle_start(r->spare_idle, refill);
}

void hh_spare_drop(hd_heap *h)
{
    uint32_t n = 0;
    for (uint32_t q = 0; q < h->world_size; q++)
        n += hh_rank_drop_spares(h, &h->ranks[q], 0);
    if (n)
        h->gen++;
}

uint32_t hh_spare_yield(hd_registry *r, uid_t uid, hd_heap *keep_h, uint32_t keep)
{
    uint32_t n = 0;
    for (hd_heap *h = r->heaps; h; h = h->next) {
        if (h->owner != uid)
            continue;
        uint32_t m = 0;
        for (uint32_t q = 0; q < h->world_size; q++)
            m += hh_rank_drop_spares(h, &h->ranks[q], h == keep_h ? keep : 0);
        if (m) {
            char b1[32];
            hd_info("heap \"%s\": %u spare chunk(s), %s, released: a quota needs their memory", h->name, m,
                    hh_human((uint64_t)m * h->ap.chunk_size, b1, sizeof b1));
            h->gen++;
        }
        n += m;
    }
    return n;
}

uint64_t hh_spare_fresh(const hd_heap *h, uint32_t chunks)
{
    uint64_t n = 0;
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].joined)
            n += chunks - (h->ranks[q].nspare < chunks ? h->ranks[q].nspare : chunks);
    return n;
}
