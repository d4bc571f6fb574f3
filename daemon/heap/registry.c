/* registry.c - the heap wing's registry: heaps by name, their lifetime
 * (the one place a heap is made and destroyed), quotas, status pages and
 * the meminfo timer, the heap timer, stats, the validator (see heap.h).
 * Bottom floor (heap_int.h): it calls no other file of the wing. */
#include "heap_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "size.h"
#include "store.h"

uint64_t hh_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Writes every joined rank's status page from the heap's current state. */
void hh_heap_publish(hd_heap *h)
{
    h->gen++; /* what the page shows changed: so may Stats */
    ha_stats st;
    ha_get_stats(h->core, &st);
    hs_page v;
    memset(&v, 0, sizeof v);
    v.mapped = st.mapped;
    v.live = st.live_bytes;
    v.released = st.pending_bytes;
    v.free = st.free_bytes;
    v.collects = st.collects;
    v.growths = st.growths;
    v.allocs = h->decided;
    v.epoch = h->epoch;
    v.collects_skipped = st.collects_skipped;
    v.state = h->mstate;
    v.resident = hh_resident(h, hh_backed(&st));
    v.releases = h->releases;
    v.restores = h->restores;
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (!k->joined)
            continue;
        ha_rank_stats(h->core, k->lidx, &v.rank_held, &v.rank_released);
        v.device_free = k->dev_free;
        v.device_total = k->dev_total;
        v.device_sampled_ns = k->dev_ns;
        v.stream_waiting = k->stream_waiting;
        v.device_waits_avoided = k->dev_waits_avoided;
        hd_status_write(&k->status, &v);
    }
}

/* Timer: one cuMemGetInfo (or /proc/meminfo read) per device in use, off
 * every request path, then every page. */
static void sample_meminfo(uv_timer_t *t)
{
    hd_registry *r = t->data;
    enum { MAXDEV = 64 };
    uint64_t fr[MAXDEV], to[MAXDEV];
    bool have[MAXDEV] = {false};
    uint64_t ns = hh_now_ns();
    for (hd_heap *h = r->heaps; h; h = h->next) {
        for (uint32_t q = 0; q < h->world_size; q++) {
            hd_rank *k = &h->ranks[q];
            if (!k->joined || k->device < 0 || k->device >= MAXDEV)
                continue;
            int d = k->device;
            if (!have[d]) {
                char err[256];
                if (hb_meminfo(r->be, d, &fr[d], &to[d], err, sizeof err)) {
                    hd_debug("device %d memory sample failed: %s", d, err);
                    fr[d] = to[d] = 0;
                }
                have[d] = true;
            }
            k->dev_free = fr[d];
            k->dev_total = to[d];
            k->dev_ns = ns;
        }
        hh_heap_publish(h);
    }
}

int hh_registry_new(uv_loop_t *loop, hb_backend *be, const hd_config *cfg, uv_timer_cb heap_timeout, hd_registry **out)
{
    hd_registry *r = calloc(1, sizeof *r);
    if (!r)
        return -1;
    r->loop = loop;
    r->be = be;
    r->cfg = *cfg;
    r->heap_timeout = heap_timeout;
    r->next_epoch = 1;
    r->start_ns = uv_hrtime();
    uv_timer_init(loop, &r->meminfo);
    r->meminfo.data = r;
    uv_timer_start(&r->meminfo, sample_meminfo, 0, cfg->meminfo_interval_ms);
    uv_unref((uv_handle_t *)&r->meminfo);
    *out = r;
    return 0;
}

void hd_registry_set_config(hd_registry *r, const hd_config *cfg) { r->cfg = *cfg; }
int hd_registry_has_store(const hd_registry *r) { return r->store != NULL; }
uint32_t hd_registry_heaps(const hd_registry *r) { return r->nheaps; }

const char *hh_human(uint64_t b, char *buf, size_t len) { return hsz_format_size(b, buf, len); }

/* ---- heap lifetime -------------------------------------------------------
 * The one home of a heap's lifetime: it is created by its first Attach
 * (hh_heap_new) and lives while a client is attached to it. When the last
 * one leaves (hh_heap_client_gone) it is destroyed, unless it formed and
 * persists (issue 29): then it stays detached, chunks, content, allocator
 * state and decision log, for persist_s seconds (its timer), until a rank
 * attaches again (hh_heap_client_back), an operator drops it
 * (hd_heap_drop) or the registry goes. */

hd_heap *hh_heap_new(hd_registry *r, const char *name, uint32_t world_size, const ha_params *ap)
{
    char why[512];
    hd_heap *h = calloc(1, sizeof *h);
    if (!h || !(h->ranks = calloc(world_size, sizeof *h->ranks)) || ha_create(ap, &h->core, why, sizeof why)) {
        if (h)
            free(h->ranks);
        free(h);
        return NULL;
    }
    h->reg = r;
    for (uint32_t q = 0; q < world_size; q++)
        h->ranks[q].status.fd = -1; /* no page until the rank joins */
    snprintf(h->name, sizeof h->name, "%s", name);
    h->world_size = world_size;
    h->local_size = ap->ranks;
    h->ap = *ap;
    h->ap_shown = *ap;
    h->epoch = r->next_epoch++;
    h->collect_at = h->trim_at = UINT64_MAX;
    uv_timer_init(r->loop, &h->timer);
    h->timer.data = h;
    h->next = r->heaps;
    r->heaps = h;
    r->nheaps++;
    char b1[32], b2[32], b3[32];
    hd_info("heap \"%s\" created: %u ranks (%u here), chunk %s, initial %s, va %s, policy %s", h->name, h->world_size,
            h->local_size, hh_human(ap->chunk_size, b1, sizeof b1), hh_human(ap->initial_size, b2, sizeof b2),
            hh_human(ap->va_size, b3, sizeof b3), ha_policy_name(ap->policy));
    return h;
}

static void timer_closed(uv_handle_t *h)
{
    hd_heap *hp = h->data;
    free(hp);
}

/* Destroys h; why: what the log says after "heap NAME destroyed: ". */
static uint64_t heap_destroy(hd_heap *h, const char *why)
{
    hd_registry *r = h->reg;
    for (hd_heap **pp = &r->heaps; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    r->nheaps--;
    uint64_t released = 0;
    for (uint32_t i = 0; i < h->world_size; i++) {
        hd_rank *k = &h->ranks[i];
        for (uint32_t j = 0; j < k->nchunks + k->nspare; j++) { /* issue 27: the spares too */
            released += k->chunks[j].size;
            hb_chunk_release(r->be, &k->chunks[j]);
        }
        free(k->chunks);
        hd_status_destroy(&k->status);
    }
    char b1[32];
    hd_info("heap \"%s\" destroyed: %s, %s of chunks released", h->name, why, hh_human(released, b1, sizeof b1));
    free(h->ranks);
    free(h->log);
    free(h->held);
    free(h->hz_set);
    free(h->hz_gone);
    for (size_t i = 0; i < h->nlr; i++) /* issue 28: horizon.c's rounds kept for the replicas */
        free(h->lr[i].offsets);
    free(h->lr);
    free(h->memo.full);
    free(h->memo.bare);
    if (h->commit_gone)
        h->commit_gone(h);
    if (h->rel_gone)
        h->rel_gone(h);
    hh_blocks_free(h);
    free(h->markers);
    ha_destroy(h->core);
    uv_timer_stop(&h->timer);
    uv_close((uv_handle_t *)&h->timer, timer_closed);
    return released;
}

/* Seconds h has been detached (0: it is not). */
static uint64_t detached_s(const hd_heap *h)
{
    return h->detached_ns ? (hh_now_ns() - h->detached_ns) / 1000000000u : 0;
}

/* Chunk bytes of every local rank of h. */
static uint64_t heap_chunk_bytes(const hd_heap *h)
{
    ha_stats st;
    ha_get_stats(h->core, &st);
    return hh_backed(&st) * h->njoined;
}

/* The timer of a detached heap (timer.data): its persist ran out. */
static void persist_expired(uv_timer_t *t)
{
    hd_heap *h = t->data;
    if (!h->detached_ns)
        return; /* attached again meanwhile */
    char b1[32], why[160];
    hd_info("heap \"%s\" (uid %ld, %s of chunks) expired: detached for %llu s, persist %u s", h->name, (long)h->owner,
            hh_human(heap_chunk_bytes(h), b1, sizeof b1), (unsigned long long)detached_s(h), h->persist_s);
    snprintf(why, sizeof why, "persist of %u s expired", h->persist_s);
    heap_destroy(h, why);
}

bool hh_heap_client_gone(hd_heap *h)
{
    if (h->nattached)
        return false;
    if (!h->formed || !h->persist_s || hh_poisoned(h)) { /* a poisoned heap can never be used again */
        heap_destroy(h, "last client gone");
        return true;
    }
    /* No collect or attach is in progress without a client: the timer is
     * free for the expiry. */
    char b1[32];
    h->detached_ns = hh_now_ns();
    uv_update_time(h->timer.loop);
    uv_timer_start(&h->timer, persist_expired, (uint64_t)h->persist_s * 1000u, 0);
    uv_unref((uv_handle_t *)&h->timer); /* a detached heap does not keep heapd's loop (a stop) going */
    hd_info("heap \"%s\" detached: last client gone; it persists %u s with %s of chunks (`heapctl drop %s` "
            "releases it now)",
            h->name, h->persist_s, hh_human(heap_chunk_bytes(h), b1, sizeof b1), h->name);
    return false;
}

void hh_heap_client_back(hd_heap *h)
{
    if (!h->detached_ns)
        return;
    hd_info("heap \"%s\" attached again after %llu s detached", h->name, (unsigned long long)detached_s(h));
    h->detached_ns = 0;
    uv_timer_stop(&h->timer);
    uv_ref((uv_handle_t *)&h->timer);
}

void hd_heap_drop(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Drop *m)
{
    const char *name = m->heap ? m->heap : "";
    hd_heap *h = hh_heap_find(r, name);
    if (!h) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NOT_FOUND, "no heap named \"%s\"; `heapctl heaps` lists them", name);
        return;
    }
    if (h->owner != hd_peer_uid(c) && !hd_peer_privileged(c, r->cfg.admin_gid)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_DENIED,
                      "dropping heap \"%s\" (uid %ld) needs its owner, root or membership of heapd.conf's "
                      "admin_group; uid %ld is none of them",
                      name, (long)h->owner, (long)hd_peer_uid(c));
        return;
    }
    if (h->nattached || !h->detached_ns) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                      "heap \"%s\" has %u client(s) attached: only a detached heap (no client) is dropped; detach "
                      "them first (stop the job's ranks), then drop it",
                      name, h->nattached);
        return;
    }
    char why[160];
    snprintf(why, sizeof why, "dropped by uid %ld (pid %ld) after %llu s detached", (long)hd_peer_uid(c),
             (long)hd_peer_pid(c), (unsigned long long)detached_s(h));
    uint64_t released = heap_destroy(h, why);
    c->out->drop(c, id, released);
}

/* The heap's one timer (attach and collect timeouts): fires the registry's
 * heap_timeout hook after the heap's timeout. */
void hh_arm_timer(hd_heap *h, bool attach)
{
    h->timer_attach = attach;
    uv_update_time(h->timer.loop); /* from now, not from the start of the loop turn */
    uv_timer_start(&h->timer, h->reg->heap_timeout, h->timeout_ms, 0);
}

hd_heap *hh_heap_find(hd_registry *r, const char *name)
{
    for (hd_heap *h = r->heaps; h; h = h->next)
        if (!strcmp(h->name, name))
            return h;
    return NULL;
}

hd_heap *hh_formed_heap(hd_peer *c, uint64_t id, const char *what)
{
    hd_heap *h = hd_peer_binding(c)->heap;
    if (!h || !h->formed) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE, "%s before attach: attach to a heap first", what);
        return NULL;
    }
    return h;
}

bool hh_unconnected_rank(const hd_heap *h, const char *what, const char *advice, char *msg, size_t len)
{
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].joined && !h->ranks[q].conn) {
            snprintf(msg, len,
                     "%s on heap \"%s\" cannot complete: rank %u is not connected (pid %ld disconnected or "
                     "detached); %s",
                     what, h->name, q, (long)h->ranks[q].pid, advice);
            return true;
        }
    return false;
}

size_t hh_ranks_not_in(const hd_heap *h, bool (*in)(const hd_rank *k), char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t q = 0; q < h->world_size && n + 16 < len; q++) {
        const hd_rank *k = &h->ranks[q];
        if (k->joined && !in(k))
            n += (size_t)snprintf(buf + n, len - n, "%s%u", n ? ", " : "", q);
    }
    return n;
}

static void registry_closed(uv_handle_t *h) { free(h->data); }

void hd_registry_destroy(hd_registry *r)
{
    if (!r)
        return;
    while (r->heaps)
        heap_destroy(r->heaps, r->heaps->detached_ns ? "heapd is stopping (it was detached)" : "heapd is stopping");
    if (r->spare_gone)
        r->spare_gone(r);
    uv_timer_stop(&r->meminfo);
    uv_close((uv_handle_t *)&r->meminfo, registry_closed);
}

uint64_t hh_heap_log_bytes(const hd_heap *h) { return h->caplog * sizeof *h->log + h->capheld * sizeof *h->held; }

uint64_t hh_heap_meta_bytes(const hd_heap *h)
{
    ha_stats st;
    ha_get_stats(h->core, &st);
    return ha_meta_bytes(&h->ap, st.mapped) + ha_block_bytes(h->core, 0) + hh_blocks_bytes(h) + hh_heap_log_bytes(h);
}

/* What the heaps of `uid` use, as quota_uid counts it: every rank's chunks
 * (*chunks), the allocator's bookkeeping (*core: ha_meta_bytes, the
 * free-space bitmaps, and ha_block_bytes, the block records) and the
 * decision logs (*log: hh_heap_log_bytes). */
static void uid_use(const hd_registry *r, uid_t uid, uint64_t *chunks, uint64_t *core, uint64_t *log)
{
    *chunks = *core = *log = 0;
    for (const hd_heap *h = r->heaps; h; h = h->next)
        if (h->owner == uid) {
            ha_stats st;
            ha_get_stats(h->core, &st);
            *chunks += hh_resident(h, hh_backed(&st)) * h->local_size + hh_spare_bytes(h); /* issues 30, 27 */
            *core += ha_meta_bytes(&h->ap, st.mapped) + ha_block_bytes(h->core, 0) + hh_blocks_bytes(h);
            *log += hh_heap_log_bytes(h);
        }
}

/* 0 if `add` more chunk bytes and `meta_add` more bookkeeping bytes for
 * heap h (NULL: a new heap named `name`) of `uid` fit the quotas (current
 * heap chunk bytes `have`), else -1 with why. quota_heap counts chunks
 * only; quota_uid counts both (uid_use). */
int hh_quota_check(const hd_registry *r, const char *name, uid_t uid, uint64_t have, uint64_t add, uint64_t meta_add,
                   char *why, size_t len)
{
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
    if (r->cfg.quota_heap && have + add > r->cfg.quota_heap) {
        snprintf(why, len,
                 "heap \"%s\" would use %s of chunk memory (now %s), over the per-heap quota of %s "
                 "(heapd.conf quota_heap); free memory, use fewer ranks or a smaller heap",
                 name, hh_human(have + add, b1, sizeof b1), hh_human(have, b2, sizeof b2),
                 hh_human(r->cfg.quota_heap, b3, sizeof b3));
        return -1;
    }
    if (!r->cfg.quota_uid)
        return 0;
    uint64_t ch, core, log;
    uid_use(r, uid, &ch, &core, &log);
    uint64_t u = ch + core + log;
    if (u + add + meta_add > r->cfg.quota_uid) {
        snprintf(
            why, len,
            "uid %ld would use %s of chunk memory and heapd bookkeeping (now %s of chunks, %s of "
            "allocator bookkeeping, %s of decision logs; adding %s of chunks, %s of bookkeeping), over the per-uid "
            "quota of %s (heapd.conf quota_uid); use a larger min_block, fewer and larger allocations, a "
            "smaller heap, or a larger quota_uid",
            (long)uid, hh_human(u + add + meta_add, b1, sizeof b1), hh_human(ch, b2, sizeof b2),
            hh_human(core, b5, sizeof b5), hh_human(log, b6, sizeof b6), hh_human(add, b7, sizeof b7),
            hh_human(meta_add, b4, sizeof b4), hh_human(r->cfg.quota_uid, b3, sizeof b3));
        return -1;
    }
    return 0;
}

heap_ref *hh_heap_ref_new(hd_heap *h)
{
    heap_ref *x = malloc(sizeof *x);
    if (x) {
        x->reg = h->reg;
        snprintf(x->name, sizeof x->name, "%s", h->name);
        x->epoch = h->epoch;
    }
    return x;
}

hd_heap *hh_heap_ref_get(heap_ref *x)
{
    hd_heap *h = hh_heap_find(x->reg, x->name);
    return h && h->epoch == x->epoch ? h : NULL;
}

size_t hh_local_ranks(const hd_heap *h, uint32_t *out)
{
    size_t n = 0;
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].joined)
            out[n++] = q;
    return n;
}

/* ---- replies ---------------------------------------------------------------- */

void hd_peer_error(hd_peer *c, uint64_t id, Heapd__ErrCode code, const char *fmt, ...)
{
    char msg[1500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->out->error(c, id, code, msg, NULL);
}

/* ---- stats ----------------------------------------------------------------- */

/* Fills `s` (and its ranks from `rs`) with heap h's figures; returns the
 * number of rank records used. */
static size_t heap_info(hd_heap *h, hd_heap_info *s, hd_rank_info *rs)
{
    ha_stats st;
    ha_get_stats(h->core, &st);
    memset(s, 0, sizeof *s);
    s->name = h->name;
    s->world_size = h->world_size;
    s->ap = &h->ap_shown;
    s->timeout_ms = h->timeout_ms;
    s->persist_s = h->persist_s;
    /* detached_ms > 0 says detached (0: it has clients), from its first ms. */
    s->detached_ms = h->detached_ns ? (hh_now_ns() - h->detached_ns) / 1000000u + 1 : 0;
    s->mapped = st.mapped;
    s->live_bytes = st.live_bytes;
    s->released_bytes = st.pending_bytes;
    s->free_bytes = st.free_bytes;
    s->collects = st.collects;
    s->collects_skipped = st.collects_skipped;
    s->growths = st.growths;
    s->owner_uid = (uint32_t)h->owner;
    s->bookkeeping_bytes = hh_heap_meta_bytes(h);
    s->collect_wait = &h->coll_wait;
    s->growth = &h->growth;
    s->clients = h->nattached;
    s->next_seq = h->decided;
    s->epoch = h->epoch;
    s->generation = h->generation;
    s->markers = h->nmarkers;
    s->state = h->mstate;
    s->resident_bytes = hh_resident(h, hh_backed(&st)) * h->local_size;
    s->host_copy_bytes = h->hc_ptr ? h->hc_size : 0;
    s->releases = h->releases;
    s->restores = h->restores;
    s->eager_reclaims = st.eager_reclaims;
    s->spare_bytes = hh_spare_bytes(h);
    s->grow_ahead = h->grow_ahead;
    s->local_every = h->local_every;
    s->trims = h->trims;
    s->trimmed_bytes = h->trimmed_bytes;
    uint64_t fa = h->nforce ? h->force_at[0] : UINT64_MAX;
    uint64_t owed = h->collect_at < fa ? h->collect_at : fa;
    s->collect_pending = owed != UINT64_MAX;
    s->pending_collect_seq = s->collect_pending ? owed : 0;
    /* Device memory: the latest sample (the meminfo timer). */
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].joined) {
            s->device_free = h->ranks[q].dev_free;
            s->device_total = h->ranks[q].dev_total;
            break;
        }
    s->ranks = rs;
    s->n_ranks = 0;
    size_t j = 0;
    for (uint32_t q = 0; q < h->world_size; q++) {
        /* A multi-node heap lists the ranks served here. */
        if (h->local_size < h->world_size && !h->ranks[q].joined)
            continue;
        s->n_ranks++;
        memset(&rs[j], 0, sizeof rs[j]);
        rs[j].rank = q;
        rs[j].attached = h->ranks[q].conn != NULL;
        if (h->ranks[q].joined)
            ha_rank_stats(h->core, h->ranks[q].lidx, &rs[j].live_bytes, &rs[j].released_bytes);
        rs[j].next_seq = h->ranks[q].next_seq;
        rs[j].pid = (uint32_t)h->ranks[q].pid;
        rs[j].stream_waiting = h->ranks[q].stream_waiting;
        rs[j].device_waits_avoided = h->ranks[q].dev_waits_avoided;
        j++;
    }
    return j;
}

/* Issue 33 item 4: h's memo may answer a Stats now (heap.h's hd_stats_memo). */
static bool memo_fresh(const hd_heap *h, uint64_t now)
{
    return h->memo.full && h->memo.gen == h->gen && now - h->memo.built_ns < HD_STATS_REUSE_MS * 1000000ull;
}

void hd_heap_touch(hd_registry *r, const hd_peer *c, const char *name)
{
    hd_heap *h = name ? hh_heap_find(r, name) : c->bind.heap;
    if (h)
        h->gen++;
}

void hd_heap_stats(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Stats *m, const char *backend_name,
                   uint32_t clients)
{
    const char *want = m->heap && m->heap[0] ? m->heap : NULL;
    bool all = hd_peer_privileged(c, r->cfg.admin_gid);
    uid_t uid = hd_peer_uid(c);
#define VISIBLE(h) (all || (h)->owner == uid)
    if (want && (!hh_heap_find(r, want) || !VISIBLE(hh_heap_find(r, want)))) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NOT_FOUND, "no heap named \"%s\"; `heapctl heaps` lists them", want);
        return;
    }
    size_t n = 0, nr = 0;
    for (hd_heap *h = r->heaps; h; h = h->next)
        if ((!want || !strcmp(h->name, want)) && VISIBLE(h)) {
            n++;
            nr += h->world_size;
        }
    hd_heap_info *hs = calloc(n ? n : 1, sizeof *hs);
    hd_rank_info *rs = calloc(nr ? nr : 1, sizeof *rs);
    if (!hs || !rs) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
        goto out;
    }
    size_t i = 0, j = 0;
    uint64_t now = hh_now_ns();
    for (hd_heap *h = r->heaps; h; h = h->next) {
        if ((want && strcmp(h->name, want)) || !VISIBLE(h))
            continue;
        if (memo_fresh(h, now)) {
            hs[i].memo = &h->memo;
            hs[i].memo_valid = true;
        } else {
            j += heap_info(h, &hs[i], &rs[j]);
            /* The sink fills the memo: figures of this generation, now. */
            free(h->memo.full);
            free(h->memo.bare);
            h->memo = (hd_stats_memo){.built_ns = now, .gen = h->gen};
            hs[i].memo = &h->memo;
        }
        i++;
    }
    hd_stats_out so = {hs, n, backend_name, clients, 0, "", false, 0, 0};
    so.uptime_ms = (uv_hrtime() - r->start_ns) / 1000000;
    so.store = r->store ? hd_store_url(r->store) : "";
    so.store_connected = r->store && hd_store_ready(r->store);
    so.quota_heap = r->cfg.quota_heap;
    so.quota_uid = r->cfg.quota_uid;
    c->out->stats(c, id, &so);
out:
    free(hs);
    free(rs);
}
#undef VISIBLE

/* ---- invariants ------------------------------------------------------------ */

#define BAD(...)                                                                                                       \
    do {                                                                                                               \
        snprintf(why, len, __VA_ARGS__);                                                                               \
        return -1;                                                                                                     \
    } while (0)

static int rank_validate(const hd_heap *h, uint32_t q, uint64_t mapped, char *why, size_t len)
{
    const hd_rank *k = &h->ranks[q];
    if (k->joined && k->nchunks != mapped / h->ap.chunk_size)
        BAD("heap \"%s\" rank %u: %u chunks, %llu bytes mapped", h->name, q, k->nchunks, (unsigned long long)mapped);
    if (k->conn && !k->joined)
        BAD("heap \"%s\" rank %u: attached but not joined", h->name, q);
    if (k->conn && (k->conn->bind.heap != h || k->conn->bind.rank != q))
        BAD("heap \"%s\" rank %u: its peer is bound elsewhere", h->name, q);
    if (k->known_chunks > k->nchunks)
        BAD("heap \"%s\" rank %u: knows %u chunks of %u", h->name, q, k->known_chunks, k->nchunks);
    for (uint32_t j = 0; k->joined && !hh_released(h) && j < k->nchunks; j++)
        if ((k->chunks[j].fd < 0) != (ha_chunk_hole(h->core, j) != 0))
            BAD("heap \"%s\" rank %u: chunk %u is %s but the allocator has it %s", h->name, q, j,
                k->chunks[j].fd < 0 ? "absent" : "present", ha_chunk_hole(h->core, j) ? "a hole" : "in use");
    if (k->nspare > h->grow_ahead || k->nchunks + k->nspare > k->capchunks ||
        (k->nspare && (!k->joined || hh_released(h))))
        BAD("heap \"%s\" rank %u: %u spares (grow_ahead %u, %u of %u records, state %u)", h->name, q, k->nspare,
            h->grow_ahead, k->nchunks + k->nspare, k->capchunks, h->mstate);
    if (k->conn && k->next_seq < h->log_base)
        BAD("heap \"%s\" rank %u: at allocation %llu, the log starts at %llu", h->name, q,
            (unsigned long long)k->next_seq, (unsigned long long)h->log_base);
    return 0;
}

static int heap_validate(const hd_heap *h, char *why, size_t len)
{
    ha_stats st;
    ha_get_stats(h->core, &st);
    if (st.mapped % h->ap.chunk_size)
        BAD("heap \"%s\": mapped %llu is not whole chunks", h->name, (unsigned long long)st.mapped);
    if (h->nlog != h->decided - h->log_base || h->nlog > h->caplog)
        BAD("heap \"%s\": %zu decisions logged, %llu..%llu decided", h->name, h->nlog, (unsigned long long)h->log_base,
            (unsigned long long)h->decided);
    /* Decisions are written once: the newest is checked (each was, after
     * the request that made it), so a check stays O(ranks) per heap. */
    if (h->nlog) {
        const hd_decision *d = &h->log[h->nlog - 1];
        if (d->offset + d->block_size > d->mapped || d->mapped % h->ap.chunk_size)
            BAD("heap \"%s\": decision %llu does not fit its mapped size", h->name,
                (unsigned long long)(h->decided - 1));
    }
    bool ahead = h->local_every && h->forced && h->collect_at % h->local_every == 0 && /* issue 28 */
                 h->collect_at > h->decided && h->collect_at - h->decided < h->local_every;
    if ((h->collect_at != UINT64_MAX && h->collect_at != h->decided && !ahead) ||
        (h->trim_at != UINT64_MAX && h->trim_at != h->decided))
        BAD("heap \"%s\": collect owed at %llu, trim at %llu (issue 30), %llu decided", h->name,
            (unsigned long long)h->collect_at, (unsigned long long)h->trim_at, (unsigned long long)h->decided);
    uint32_t joined = 0, attached = 0, waiting = 0;
    for (uint32_t q = 0; q < h->world_size; q++) {
        if (rank_validate(h, q, st.mapped, why, len))
            return -1;
        joined += h->ranks[q].joined;
        attached += h->ranks[q].conn != NULL;
        waiting += h->ranks[q].in_collect;
    }
    if (joined != h->njoined || attached != h->nattached || joined > h->local_size)
        BAD("heap \"%s\": %u joined, %u attached; counted %u and %u", h->name, joined, attached, h->njoined,
            h->nattached);
    if (h->detached_ns && (h->nattached || !h->formed || !uv_is_active((const uv_handle_t *)&h->timer)))
        BAD("heap \"%s\": detached with %u clients (formed %d), or without its expiry running", h->name, h->nattached,
            (int)h->formed);
    if (!h->nattached && !h->detached_ns && h->formed)
        BAD("heap \"%s\": formed, no client, yet not detached", h->name);
    if (h->coll_active && (!h->coll_left || !h->coll_fail))
        BAD("heap \"%s\": a collect is active without its coll_left or coll_fail", h->name);
    if (h->poison.nranks &&
        (h->poison.nranks != HD_ASYM_RANKS || (h->poison.sizes[0] == h->poison.sizes[1] && !h->poison_replica)))
        BAD("heap \"%s\": poisoned by allocation %llu without two ranks of different sizes", h->name,
            (unsigned long long)h->poison.n);
    if (waiting != (h->coll_active ? h->coll_waiting : 0))
        BAD("heap \"%s\": %u ranks in the collect, %u counted", h->name, waiting, h->coll_waiting);
    if (h->blocks.n > h->blocks.cap / 2 || h->nmarkers > HD_MARKERS_MAX || (h->commit && !h->commit_gone))
        BAD("heap \"%s\": block table %zu of %zu slots, %u markers, commit state without its destructor", h->name,
            h->blocks.n, h->blocks.cap, h->nmarkers);
    if (h->trims != st.trims || h->trimmed_bytes != st.trimmed_bytes * h->local_size)
        BAD("heap \"%s\": %llu trims of %llu bytes, the allocator's %llu of %llu bytes a rank", h->name,
            (unsigned long long)h->trims, (unsigned long long)h->trimmed_bytes, (unsigned long long)st.trims,
            (unsigned long long)st.trimmed_bytes);
    return 0;
}
#undef BAD

int hd_heap_validate(const hd_registry *r, char *why, size_t len)
{
    uint32_t n = 0;
    for (const hd_heap *h = r->heaps; h; h = h->next, n++) {
        if (heap_validate(h, why, len))
            return -1;
        if (!h->memo.full != !h->memo.bare || h->memo.gen > h->gen) {
            snprintf(why, len, "heap \"%s\": its Stats memo is half built or of a later generation", h->name);
            return -1;
        }
    }
    if (n != r->nheaps) {
        snprintf(why, len, "%u heaps listed, %u counted", n, r->nheaps);
        return -1;
    }
    return 0;
}

void hd_heap_check(const hd_registry *r)
{
    char why[512];
    if (hd_heap_validate(r, why, sizeof why)) {
        hd_error("heap invariant broken: %s", why);
        abort();
    }
}
