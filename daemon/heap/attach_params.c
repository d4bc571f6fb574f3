/* attach_params.c - the heap wing's attach, its part that makes a new
 * heap's parameters: the request's, else heapd.conf's, within heapd.conf's
 * bounds (one unit with attach.c: heap_int.h's floors). */
#include "heap_int.h"

#include <stdio.h>
#include <string.h>

uint64_t hh_pick(uint64_t requested, uint64_t dflt) { return requested ? requested : dflt; }

/* heapd.conf's bounds on a heap's size (max_chunks, max_blocks): checked
 * before anything is allocated, so that no Attach costs more than they
 * allow. 0, or -1 with why. */
static int heap_limits(const hd_registry *r, const ha_params *ap, char *why, size_t len)
{
    char b1[32], b2[32];
    uint64_t chunks = ap->va_size / ap->chunk_size, blocks = ap->va_size / ap->min_block;
    if (chunks > r->cfg.max_chunks) {
        snprintf(why, len,
                 "va_size %s / chunk_size %s = %llu chunks per rank, over heapd's limit of %u "
                 "(heapd.conf max_chunks); use a larger chunk_size or a smaller va_size",
                 hh_human(ap->va_size, b1, sizeof b1), hh_human(ap->chunk_size, b2, sizeof b2),
                 (unsigned long long)chunks, r->cfg.max_chunks);
        return -1;
    }
    if (blocks > r->cfg.max_blocks) {
        snprintf(why, len,
                 "va_size %s / min_block %s = %llu blocks per rank, over heapd's limit of %u "
                 "(heapd.conf max_blocks; the allocator keeps ~4 bits per block); use a larger min_block or "
                 "a smaller va_size",
                 hh_human(ap->va_size, b1, sizeof b1), hh_human(ap->min_block, b2, sizeof b2),
                 (unsigned long long)blocks, r->cfg.max_blocks);
        return -1;
    }
    return 0;
}

/* Issue 29: the seconds the heap persists that persist_s asks for (0:
 * heapd.conf's persist; HD_PERSIST_NONE: none), into *out. 0, or -1 with
 * why (over heapd.conf's max_persist). */
static int persist_of(const hd_config *cfg, uint32_t persist_s, uint32_t *out, char *why, size_t len)
{
    if (persist_s > cfg->max_persist && persist_s != HD_PERSIST_NONE) {
        snprintf(why, len,
                 "persist_s %u is over heapd's max_persist of %u seconds (heapd.conf max_persist); ask for at most "
                 "%u, or 0 for heapd.conf's persist",
                 persist_s, cfg->max_persist, cfg->max_persist);
        return -1;
    }
    *out = persist_s == HD_PERSIST_NONE ? 0 : persist_s ? persist_s : cfg->persist;
    return 0;
}

/* Issue 27: the spares per rank grow_ahead asks for (0: heapd.conf's;
 * HD_GROW_AHEAD_NONE: none), into *out. 0, or -1 with why. */
static int grow_ahead_of(const hd_config *cfg, uint32_t ask, uint32_t *out, char *why, size_t len)
{
    if (ask != HD_GROW_AHEAD_NONE && ask > HD_CONFIG_GROW_AHEAD_MAX) {
        snprintf(why, len,
                 "grow_ahead %u is over the limit of %u spare chunks per rank; ask for at most %u, 0 for "
                 "heapd.conf's grow_ahead, or none",
                 ask, HD_CONFIG_GROW_AHEAD_MAX, HD_CONFIG_GROW_AHEAD_MAX);
        return -1;
    }
    *out = ask == HD_GROW_AHEAD_NONE ? 0 : ask ? ask : cfg->grow_ahead;
    return 0;
}

/* Issue 27: the reclaim a heap of these ranks and policy gets for the
 * request's ask (RECLAIM_DEFAULT: heapd.conf's, cfg): eager only where one core
 * decides for every rank (a heap on one node) under a policy that reclaims
 * outside collects (not seed); collect otherwise. */
ha_reclaim hh_reclaim_of(const hd_config *cfg, int ask, uint32_t local_size, uint32_t world_size, ha_policy pol)
{
    ha_reclaim want = ask == HEAPD__RECLAIM__RECLAIM_EAGER     ? HA_RECLAIM_EAGER
                      : ask == HEAPD__RECLAIM__RECLAIM_COLLECT ? HA_RECLAIM_COLLECT
                      : cfg                                    ? cfg->reclaim
                                                               : HA_RECLAIM_EAGER;
    if (local_size < world_size || pol == HA_POLICY_SEED)
        return HA_RECLAIM_COLLECT;
    return want;
}

/* Issue 27: the lookahead of a heap's cross-node eager reclaim (horizon.c):
 * heapd.conf's reclaim_lookahead for a heap across nodes under coalesce that
 * asks for eager (or leaves it to heapd.conf's eager), else 0 (collect). */
uint32_t hh_lookahead_of(const hd_config *cfg, int ask, uint32_t local_size, uint32_t world_size, ha_policy pol)
{
    bool eager = ask == HEAPD__RECLAIM__RECLAIM_EAGER ||
                 (ask != HEAPD__RECLAIM__RECLAIM_COLLECT && cfg->reclaim == HA_RECLAIM_EAGER);
    return local_size < world_size && pol == HA_POLICY_COALESCE && eager ? cfg->reclaim_lookahead : 0;
}

/* Issue 30: the automatic trim's threshold for the request's ask (0:
 * heapd.conf's, off on a heap that spans nodes; HD_TRIM_NONE: off), into
 * *out (0: off). 0, or -1 with why: a heap that spans nodes cannot trim. */
static int trim_threshold_of(const hd_config *cfg, uint64_t ask, bool multi, uint64_t *out, char *why, size_t len)
{
    if (multi && ask && ask != HD_TRIM_NONE) {
        snprintf(why, len,
                 "trim_threshold %llu: a heap that spans nodes cannot trim (each node's allocator would have to "
                 "shrink at the same allocation number); leave trim_threshold at 0 or none",
                 (unsigned long long)ask);
        return -1;
    }
    *out = multi || ask == HD_TRIM_NONE ? 0 : ask ? ask : cfg->trim_threshold;
    return 0;
}

/* Issue 28: local_every within HD_LOCAL_EVERY_MAX (0: heapd decides). 0,
 * or -1 with why. */
static int local_every_check(uint32_t ask, char *why, size_t len)
{
    if (ask <= HD_LOCAL_EVERY_MAX)
        return 0;
    snprintf(why, len,
             "local_every %u is over the limit of %u allocations between round trips; ask for at most %u, or 0 "
             "for heapd to decide every allocation",
             ask, HD_LOCAL_EVERY_MAX, HD_LOCAL_EVERY_MAX);
    return -1;
}

/* The new heap's parameters: the request's, else heapd.conf's (the
 * seconds it persists into *persist). Returns 0, or -1 once the peer got
 * the error. */
int hh_heap_params(hd_registry *r, const Heapd__Attach *m, hd_peer *c, uint64_t id, ha_params *out, uint32_t *persist,
                   uint32_t *grow_ahead)
{
    const Heapd__HeapParams *rp = m->params;
    const hd_config *cfg = &r->cfg;
    ha_params ap;
    memset(&ap, 0, sizeof ap);
    uint32_t local_size = m->local_size ? m->local_size : m->world_size;
    if (local_size > m->world_size) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "local_size %u is larger than world_size %u", local_size,
                      m->world_size);
        return -1;
    }
    if (local_size < m->world_size && !hd_registry_has_store(r)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "heap \"%s\" spans nodes (local_size %u < world_size %u) but this heapd has no store: set "
                      "`store = redis://HOST:PORT` in heapd.conf on every node",
                      m->heap, local_size, m->world_size);
        return -1;
    }
    ap.ranks = local_size;
    ap.chunk_size = hh_pick(rp ? rp->chunk_size : 0, cfg->chunk_size);
    ap.min_block = hh_pick(rp ? rp->min_block : 0, cfg->min_block);
    ap.va_size = hh_pick(rp ? rp->va_size : 0, cfg->va_size);
    ap.initial_size = hh_pick(rp ? rp->initial_size : 0, cfg->initial_size ? cfg->initial_size : ap.chunk_size);
    ap.policy = cfg->policy;
    if (rp && hpo_from_wire(rp->policy) >= 0) /* common/policy.h */
        ap.policy = (ha_policy)hpo_from_wire(rp->policy);
    ap.one_decider = local_size == m->world_size;
    ap.extent_bound = rp && rp->extent_bound; /* issue 32 */
    ap.reclaim = hh_reclaim_of(cfg, rp ? (int)rp->reclaim : 0, local_size, m->world_size, ap.policy);
    char why[512];
    if (trim_threshold_of(cfg, rp ? rp->trim_threshold : 0, local_size < m->world_size, &ap.trim_threshold, why,
                          sizeof why) ||
        local_every_check(rp ? rp->local_every : 0, why, sizeof why)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "heap \"%s\": %s", m->heap, why);
        return -1;
    }
    uint64_t gran = hb_granularity(r->be, 0);
    if (gran && ap.chunk_size % gran) {
        char b1[32], b2[32];
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "chunk_size %s is not a multiple of the %s backend's granularity %s; use a multiple of %s",
                      hh_human(ap.chunk_size, b1, sizeof b1), hb_name(r->be), hh_human(gran, b2, sizeof b2), b2);
        return -1;
    }
    if (ha_params_check(&ap, why, sizeof why)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "heap parameters rejected: %s", why);
        return -1;
    }
    if (heap_limits(r, &ap, why, sizeof why)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "heap \"%s\": %s", m->heap, why);
        return -1;
    }
    if (persist_of(cfg, rp ? rp->persist_s : 0, persist, why, sizeof why) ||
        grow_ahead_of(cfg, rp ? rp->grow_ahead : 0, grow_ahead, why, sizeof why)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "heap \"%s\": %s", m->heap, why);
        return -1;
    }
    /* Issue 27: the uid's spares yield first. */
#define QUOTA_REFUSES(check) ((check) && (!hh_spare_yield(r, hd_peer_uid(c), NULL, 0) || (check)))
    if (QUOTA_REFUSES(hh_quota_check(r, m->heap, hd_peer_uid(c), 0, ap.initial_size * local_size,
                                     ha_meta_bytes(&ap, ap.initial_size), why, sizeof why))) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_QUOTA, "%s", why);
        return -1;
    }
    uint64_t first = ap.initial_size / ap.chunk_size;
    if (QUOTA_REFUSES(hh_chunk_fds_check(r, hd_peer_uid(c), (first ? first : 1) * local_size, why, sizeof why))) {
#undef QUOTA_REFUSES
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_QUOTA, "%s", why);
        return -1;
    }
    *out = ap;
    return 0;
}
