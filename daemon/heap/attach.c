/* attach.c - the heap wing's attach rendezvous, chunk hand-out, detach and
 * disconnect (see heap.h). */
#include "heap_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "sha1.h"

/* ---- attach ------------------------------------------------------------------ */

static void send_attach_reply(hd_heap *h, uint32_t rank, uint64_t id)
{
    hd_rank *k = &h->ranks[rank];
    ha_stats st;
    ha_get_stats(h->core, &st);
    uint32_t nch = hh_heap_chunks(h, st.mapped);
    /* Issue 29: the live set (with the generation and the markers below). */
    hd_live_block *live = NULL;
    long nlive = hh_blocks_held(h, k->lidx, &live);
    if (nlive < 0) {
        hd_peer_error(k->conn, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory listing the live set");
        return;
    }
    chunk_msg cm;
    /* Issue 30: a released heap's chunks come with the restore. */
    if (hh_chunk_msg_build(h, 0, hh_released(h) ? 0 : nch, &cm)) {
        free(live);
        hd_peer_error(k->conn, id, HEAPD__ERR_CODE__ERR_NO_MEMORY,
                      "heapd could not duplicate chunk fds for the attach reply (out of fds or memory); "
                      "raise heapd's fd limit (LimitNOFILE) or use a larger chunk_size");
        return;
    }
    int sfd = k->status.fd >= 0 ? dup(k->status.fd) : -1;
    int *fds = cm.fds;
    int status_index = -1;
    if (sfd >= 0) {
        int *nf = realloc(cm.fds, (cm.n + 1) * sizeof *nf);
        if (nf) {
            nf[cm.n] = sfd;
            cm.fds = fds = nf;
            status_index = (int)cm.n;
        } else {
            close(sfd);
        }
    }
    uint32_t *local = calloc(h->world_size, sizeof *local);
    size_t nlocal = 0;
    for (uint32_t q = 0; local && q < h->world_size; q++)
        if (h->ranks[q].joined)
            local[nlocal++] = q;
    hd_attach_out ar = {0};
    ar.ap = &h->ap_shown;
    ar.local_every = h->local_every;
    ar.timeout_ms = h->timeout_ms;
    ar.world_size = h->world_size;
    ar.nlocal = nlocal;
    ar.local_ranks = local;
    ar.mapped = st.mapped;
    ar.nchunks = cm.n;
    ar.chunks = cm.refs;
    ar.fds = fds;
    ar.nfds = cm.n + (status_index >= 0);
    ar.status_index = status_index;
    ar.next_seq = k->next_seq;
    ar.backend = hb_name(h->reg->be);
    ar.epoch = h->epoch;
    ar.persist_s = h->persist_s;
    ar.live = live;
    ar.nlive = (size_t)nlive;
    ar.generation = h->generation;
    ar.resumed = k->resumed;
    ar.markers = h->markers;
    ar.nmarkers = h->nmarkers;
    ar.released = hh_released(h);
    ar.grow_ahead = h->grow_ahead;
    k->known_chunks = nch;
    k->conn->out->attach(k->conn, id, &ar);
    free(live);
    free(local);
    hh_chunk_msg_free(&cm, false);
}

/* The job secret as kept: the first 16 hex digits of its SHA-1, "-" when
 * none was given. */
static void secret_hash(const ProtobufCBinaryData *s, char out[17])
{
    if (!s->len) {
        snprintf(out, 17, "-");
        return;
    }
    char hex[41];
    sha1_hex(s->data, s->len, hex);
    snprintf(out, 17, "%.16s", hex);
}

/* Nodes with different heap parameters must never meet in the store: the
 * fingerprint puts them in different keys (they time out naming each
 * other's ranks instead of diverging silently). */
static void heap_fingerprint(hd_heap *h, const ha_params *pa)
{
    /* Issue 27: and the lookahead: nodes that would reclaim at different
     * points never meet either (0, a single node's, changes nothing). */
    /* Ownership too (issue 15): another uid, or the same uid with another
     * job secret, lands in other keys, so it can neither complete nor
     * force the collects of a heap it does not own on another node. */
    ha_params ap = *pa;
    uint64_t fp = UINT64_C(1469598103934665603);
    /* Issue 32: extent_bound (folded in only when on: the fingerprints of
     * before stay). */
    uint64_t v[7] = {ap.chunk_size, ap.initial_size, ap.va_size, ap.min_block, (uint64_t)ap.policy, h->hz_every, 1};
    for (int i = 0; i < (ap.extent_bound ? 7 : 6); i++)
        for (int b = 0; b < 8; b++)
            fp = (fp ^ ((v[i] >> (8 * b)) & 0xff)) * UINT64_C(1099511628211);
    snprintf(h->inc, sizeof h->inc, "%s~%08llx~u%ld~%s", h->job, (unsigned long long)(fp & 0xffffffffu), (long)h->owner,
             h->secret);
}

/* A new heap for the request's Attach (registry.c makes it, with its
 * lifetime). NULL once the peer got the error. */
static hd_heap *heap_create(hd_registry *r, const Heapd__Attach *m, hd_peer *c, uint64_t id)
{
    const Heapd__HeapParams *rp = m->params;
    ha_params ap;
    uint32_t persist, grow_ahead;
    if (hh_heap_params(r, m, c, id, &ap, &persist, &grow_ahead))
        return NULL;
    /* Issue 28: replicas decide as on several nodes: reclaims at collects
     * and rounds, never at a release. */
    uint32_t le = rp ? rp->local_every : 0; /* within its bound: hh_heap_params */
    bool eager = ap.reclaim == HA_RECLAIM_EAGER;
    if (le) {
        ap.reclaim = HA_RECLAIM_COLLECT;
        ap.one_decider = false;
    }
    hd_heap *h = hh_heap_new(r, m->heap, m->world_size, &ap);
    if (!h) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory creating heap \"%s\"", m->heap);
        return NULL;
    }
    snprintf(h->job, sizeof h->job, "%s", m->job && m->job[0] ? m->job : "0");
    h->owner = hd_peer_uid(c);
    secret_hash(&m->job_secret, h->secret);
    h->hz_every = hh_lookahead_of(&r->cfg, rp ? (int)rp->reclaim : 0, ap.ranks, m->world_size, ap.policy);
    h->local_every = le;
    if (le && (eager || h->hz_every)) /* issue 28: the rounds the replicas follow, every le allocations */
        h->hz_every = le;
    h->ap_shown = h->ap;
    if (h->hz_every) /* its core reclaims what the nodes agree on, eagerly */
        h->ap_shown.reclaim = HA_RECLAIM_EAGER;
    heap_fingerprint(h, &ap);
    h->timeout_ms = hh_pick(rp ? rp->collect_timeout_ms : 0, r->cfg.collect_timeout_ms);
    h->persist_s = persist;
    h->grow_ahead = grow_ahead;
    return h;
}

/* Returns the name of the first parameter that differs, with both values. */
static bool params_differ(const hd_heap *h, const Heapd__Attach *m, char *why, size_t len)
{
    if (m->world_size != h->world_size) {
        snprintf(why, len, "world_size %u differs from the heap's %u", m->world_size, h->world_size);
        return true;
    }
    uint32_t ls = m->local_size ? m->local_size : m->world_size;
    if (ls != h->local_size) {
        snprintf(why, len, "local_size %u differs from the heap's %u", ls, h->local_size);
        return true;
    }
    const char *job = m->job && m->job[0] ? m->job : "0";
    if (strcmp(job, h->job)) {
        snprintf(why, len, "job \"%s\" differs from the heap's \"%s\"", job, h->job);
        return true;
    }
    char sh[17];
    secret_hash(&m->job_secret, sh);
    if (strcmp(sh, h->secret)) {
        snprintf(why, len,
                 "the job secret (HEAPC_JOB_SECRET) differs from the one the heap was created with%s; "
                 "give every rank of the job the same secret",
                 h->secret[0] == '-' ? " (none)" : "");
        return true;
    }
    const Heapd__HeapParams *p = m->params;
    if (!p)
        return false;
#define CHK(field, name, have)                                                                                         \
    if (p->field && p->field != (have)) {                                                                              \
        snprintf(why, len, "%s %llu differs from the heap's %llu", name, (unsigned long long)p->field,                 \
                 (unsigned long long)(have));                                                                          \
        return true;                                                                                                   \
    }
    CHK(chunk_size, "chunk_size", h->ap.chunk_size)
    CHK(initial_size, "initial_size", h->ap.initial_size)
    CHK(va_size, "va_size", h->ap.va_size)
    CHK(min_block, "min_block", h->ap.min_block)
    CHK(collect_timeout_ms, "collect_timeout_ms", h->timeout_ms)
#undef CHK
    uint32_t persist = p->persist_s == HD_PERSIST_NONE ? 0 : p->persist_s;
    if (p->persist_s && persist != h->persist_s) {
        snprintf(why, len, "persist_s %u differs from the heap's %u seconds", p->persist_s, h->persist_s);
        return true;
    }
    if (p->local_every && p->local_every != h->local_every) { /* issue 28 */
        snprintf(why, len, "local_every %u differs from the heap's %u (0: heapd decides)", p->local_every,
                 h->local_every);
        return true;
    }
    if (p->extent_bound && !h->ap.extent_bound) { /* issue 32 */
        snprintf(why, len, "extent_bound on differs from the heap's (off): attach without it, or use another heap");
        return true;
    }
    uint32_t ga = p->grow_ahead == HD_GROW_AHEAD_NONE ? 0 : p->grow_ahead;
    if (p->grow_ahead && ga != h->grow_ahead) {
        snprintf(why, len, "grow_ahead %u differs from the heap's %u", ga, h->grow_ahead);
        return true;
    }
    uint64_t tt = p->trim_threshold == HD_TRIM_NONE ? 0 : p->trim_threshold;
    if (p->trim_threshold && tt != h->ap.trim_threshold) {
        snprintf(why, len, "trim_threshold %llu differs from the heap's %llu (0: none)", (unsigned long long)tt,
                 (unsigned long long)h->ap.trim_threshold);
        return true;
    }
    /* Eager as the heap gets it: on one node, or across nodes in rounds. */
    bool eager = h->ap.reclaim == HA_RECLAIM_EAGER || h->hz_every;
    if (p->reclaim != HEAPD__RECLAIM__RECLAIM_DEFAULT &&
        (hh_reclaim_of(NULL, (int)p->reclaim, h->local_size, h->world_size, h->ap.policy) == HA_RECLAIM_EAGER ||
         hh_lookahead_of(&h->reg->cfg, (int)p->reclaim, h->local_size, h->world_size, h->ap.policy)) != eager) {
        snprintf(why, len, "reclaim %s differs from the heap's %s",
                 p->reclaim == HEAPD__RECLAIM__RECLAIM_EAGER ? "eager" : "collect", eager ? "eager" : "collect");
        return true;
    }
    if (p->policy != HEAPD__POLICY__POLICY_DEFAULT) {
        ha_policy want = (ha_policy)hpo_from_wire(p->policy); /* known: attach_check */
        if (want != h->ap.policy) {
            snprintf(why, len, "policy %s differs from the heap's %s", ha_policy_name(want),
                     ha_policy_name(h->ap.policy));
            return true;
        }
    }
    return false;
}

/* The request's own checks. Returns 0, or -1 once the peer got the error. */
static int attach_check(hd_peer *c, uint64_t id, const Heapd__Attach *m)
{
    hd_binding *b = hd_peer_binding(c);
    if (b->heap) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                      "this connection is already attached to heap \"%s\" as rank %u; detach first", b->heap->name,
                      b->rank);
        return -1;
    }
    if (!m->heap || !m->heap[0] || strlen(m->heap) > HD_NAME_MAX) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "heap name must be 1 to %d bytes", HD_NAME_MAX);
        return -1;
    }
    char why[200];
    if (hh_text_check(m->heap, why, sizeof why)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "heap name %s", why);
        return -1;
    }
    if (m->job && strlen(m->job) > HD_JOB_MAX) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "job is %zu bytes, over the limit of %d; use a shorter job id (e.g. the launcher's run id)",
                      strlen(m->job), HD_JOB_MAX);
        return -1;
    }
    if (m->job && hh_text_check(m->job, why, sizeof why)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "job %s", why);
        return -1;
    }
    if (m->params && m->params->policy != HEAPD__POLICY__POLICY_DEFAULT && hpo_from_wire(m->params->policy) < 0) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "policy %d is unknown: use 0 (heapd's default)%s",
                      (int)m->params->policy, HPO_WIRE_CHOICES);
        return -1;
    }
    if (m->params && (unsigned)m->params->reclaim > HEAPD__RECLAIM__RECLAIM_COLLECT) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "reclaim %d is unknown: use 0 (heapd's default), 1 (eager) or 2 (collect)",
                      (int)m->params->reclaim);
        return -1;
    }
    if (m->world_size < 1 || m->world_size > HA_MAX_RANKS) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "world_size %u is out of range (1..%u)", m->world_size,
                      HA_MAX_RANKS);
        return -1;
    }
    if (m->rank >= m->world_size) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "rank %u is out of range: world_size is %u (ranks 0..%u)",
                      m->rank, m->world_size, m->world_size - 1);
        return -1;
    }
    return 0;
}

/* The heap the request names, created if new (*created set). NULL once the
 * peer got the error. */
static hd_heap *attach_heap(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Attach *m, bool *created)
{
    char err[512];
    hd_heap *h = hh_heap_find(r, m->heap);
    *created = false;
    if (!h) {
        h = heap_create(r, m, c, id);
        if (!h)
            return NULL;
        *created = true;
    } else if (h->owner != hd_peer_uid(c) && !hd_peer_privileged(c, r->cfg.admin_gid)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_DENIED,
                      "heap \"%s\" belongs to uid %ld; uid %ld may not attach to it (only its owner, root and "
                      "members of heapd.conf's admin_group may); pick another heap name",
                      h->name, (long)h->owner, (long)hd_peer_uid(c));
        return NULL;
    } else if (params_differ(h, m, err, sizeof err)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_MISMATCH, "heap \"%s\" exists with other parameters: %s", h->name,
                      err);
        return NULL;
    } else if (hh_poison_check(h, c, id)) {
        return NULL;
    }
    return h;
}

/* A rank's first attach: its chunks and status page. Returns 0, or -1 once
 * the peer got the error (and a heap created for it is gone). */
static int rank_join(hd_heap *h, hd_rank *k, hd_peer *c, uint64_t id, const Heapd__Attach *m, int device, bool created)
{
    hd_registry *r = h->reg;
    char err[512];
    k->lidx = h->njoined;
    k->device = device;
    snprintf(k->uuid, sizeof k->uuid, "%s", m->device_uuid ? m->device_uuid : "");
    ha_stats st;
    ha_get_stats(h->core, &st);
    if (hh_rank_add_chunks(h, k, hh_heap_chunks(h, st.mapped), err, sizeof err)) {
        hh_rank_trim_chunks(h, k, 0);
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "could not create the chunks of rank %u: %s", m->rank,
                      err);
        if (created)
            hh_heap_client_gone(h);
        return -1;
    }
    for (uint32_t j = 0; j < k->nchunks; j++) /* issue 30: holes stay absent */
        if (ha_chunk_hole(h->core, j))
            hb_chunk_release(r->be, &k->chunks[j]);
    if (hd_status_create(&k->status, m->rank, err, sizeof err)) {
        hh_rank_trim_chunks(h, k, 0);
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "could not create the status page of rank %u: %s", m->rank,
                      err);
        if (created)
            hh_heap_client_gone(h);
        return -1;
    }
    k->joined = true;
    h->njoined++;
    {
        char e2[256];
        if (hb_meminfo(r->be, device, &k->dev_free, &k->dev_total, e2, sizeof e2) == 0)
            k->dev_ns = hh_now_ns();
    }
    hh_heap_publish(h);
    return 0;
}

/* Rank `rank` is attached: answer it if the heap has formed, else wait
 * (every rank answered at once when the last one comes). */
static void attach_rendezvous(hd_heap *h, uint32_t rank, uint64_t id)
{
    hd_rank *k = &h->ranks[rank];
    if (h->formed) {
        send_attach_reply(h, rank, id);
        hh_spare_kick(h); /* issue 27: a re-attach to a detached heap makes its spares again */
        return;
    }
    k->attach_wait = true;
    k->attach_id = id;
    if (h->njoined == h->local_size) {
        h->formed = true;
        uv_timer_stop(&h->timer);
        for (uint32_t q = 0; q < h->world_size; q++)
            if (h->ranks[q].attach_wait && h->ranks[q].conn) {
                h->ranks[q].attach_wait = false;
                send_attach_reply(h, q, h->ranks[q].attach_id);
            }
        hh_spare_kick(h); /* issue 27: after the replies */
    } else if (!uv_is_active((uv_handle_t *)&h->timer)) {
        hh_arm_timer(h, true);
    }
}

void hd_heap_attach(hd_registry *r, hd_peer *c, uint64_t id, const Heapd__Attach *m)
{
    hd_binding *b = hd_peer_binding(c);
    if (attach_check(c, id, m))
        return;
    int device = 0;
    char err[512];
    if (hb_device_from_uuid(r->be, m->device_uuid ? m->device_uuid : "", &device, err, sizeof err)) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "%s", err);
        return;
    }
    bool created;
    hd_heap *h = attach_heap(r, c, id, m, &created);
    if (!h)
        return;
    hd_rank *k = &h->ranks[m->rank];
    if (k->conn) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                      "rank %u of heap \"%s\" is already attached by pid %ld; each rank attaches once", m->rank,
                      h->name, (long)k->pid);
        return;
    }
    if (!k->joined && h->njoined == h->local_size) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "heap \"%s\" already has its %u local rank(s) on this node; rank %u must attach to the heapd "
                      "of its own node, or local_size is wrong",
                      h->name, h->local_size, m->rank);
        return;
    }
    if (!k->joined) {
        if (rank_join(h, k, c, id, m, device, created))
            return;
    } else {
        /* Issue 29: a re-attach. After a crash (no Detach), or to a heap no
         * client was attached to, the rank continues where the heap is: the
         * allocations its peers decided meanwhile are in its live set (the
         * core holds every decided block for every rank). After a clean
         * Detach while peers stayed, at its own next allocation number. A
         * retry after an attach timeout (the heap never formed) is none. */
        if (h->formed) {
            h->generation++;
            k->resumed = true;
        }
        if (k->left_unclean || !h->nattached) {
            k->next_seq = h->decided;
        } else if (k->next_seq < h->log_base) {
            hd_warn("heap \"%s\": rank %u re-attached at allocation %llu, which is no longer logged; "
                    "it continues at %llu",
                    h->name, m->rank, (unsigned long long)k->next_seq, (unsigned long long)h->decided);
            k->next_seq = h->decided;
        }
        k->left_unclean = false;
    }
    k->conn = c;
    k->pid = hd_peer_pid(c);
    h->nattached++;
    hh_heap_client_back(h); /* a detached heap's expiry stops (issue 29) */
    b->heap = h;
    b->rank = m->rank;
    b->name = h->name;
    hd_info("heap \"%s\": rank %u attached (pid %ld, %u of %u local ranks)", h->name, m->rank, (long)k->pid,
            h->nattached, h->local_size);
    attach_rendezvous(h, m->rank, id);
}

/* ---- detach and disconnect ---------------------------------------------------- */

static void forget_conn(hd_heap *h, const hd_peer *c)
{
    size_t w = 0;
    for (size_t i = 0; i < h->nheld; i++)
        if (h->held[i].conn != c)
            h->held[w++] = h->held[i];
    h->nheld = w;
    if (h->force_conn == c)
        h->force_conn = NULL;
}

/* Rank `rank`'s client leaves (detach, disconnect, attach timeout): a
 * collect in progress fails (collect.c's coll_left), and the heap goes with
 * its last client. Returns true if the heap is gone. */
static bool rank_leave(hd_heap *h, uint32_t rank, bool clean)
{
    hd_rank *k = &h->ranks[rank];
    forget_conn(h, k->conn);
    k->conn = NULL;
    k->attach_wait = false;
    k->left_unclean = !clean;
    h->nattached--;
    hd_info("heap \"%s\": rank %u (pid %ld) %s", h->name, rank, (long)k->pid, clean ? "detached" : "disconnected");
    if (h->coll_active)
        h->coll_left(h, rank, clean);
    if (h->commit_left)
        h->commit_left(h, rank, clean);
    if (h->rel_left)
        h->rel_left(h, rank, clean);
    if (!h->nattached)
        hh_spare_drop(h); /* issue 27: a heap without client keeps no spares */
    return hh_heap_client_gone(h);
}

void hh_attach_timed_out(hd_heap *h, const char *msg)
{
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (!k->attach_wait || !k->conn)
            continue;
        hd_peer *c = k->conn;
        k->attach_wait = false;
        hd_peer_error(c, k->attach_id, HEAPD__ERR_CODE__ERR_TIMEOUT, "%s", msg);
        hd_peer_binding(c)->heap = NULL;
        if (rank_leave(h, q, true))
            return; /* the heap is gone */
    }
}

void hd_heap_detach(hd_registry *r, hd_peer *c, uint64_t id)
{
    (void)r;
    hd_binding *b = hd_peer_binding(c);
    if (!b->heap) {
        hd_peer_error(c, id, HEAPD__ERR_CODE__ERR_STATE, "detach: this connection is not attached to a heap");
        return;
    }
    hd_heap *h = b->heap;
    uint32_t rank = b->rank;
    b->heap = NULL;
    c->out->detach(c, id);
    rank_leave(h, rank, true);
}

void hd_heap_conn_closed(hd_registry *r, hd_peer *c)
{
    for (hd_heap *h = r->heaps; h; h = h->next)
        forget_conn(h, c);
    hd_binding *b = hd_peer_binding(c);
    if (!b->heap)
        return;
    hd_heap *h = b->heap;
    b->heap = NULL;
    rank_leave(h, b->rank, false);
}
