/* heap.c - the heap registry (see heap.h). */
#include "heap.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hist.h"
#include "log.h"
#include "size.h"
#include "statuspage.h"
#include "store.h"
#include "wire.h"

#define HD_NAME_MAX 255
#define HD_LOG_TRIM 4096
#pragma GCC diagnostic ignored "-Wformat-truncation" /* decisions kept before trying to trim the log */

/* One decision of the allocation sequence.
 * Invariant: offset + block_size <= mapped, mapped % chunk_size == 0. */
typedef struct hd_decision {
    uint64_t size, offset, block_size, mapped;
    uint32_t rank;            /* the rank that asked first */
} hd_decision;

/* A rank's slot in a heap.
 * Invariants: nchunks == heap->mapped / chunk_size once the rank has
 *             attached (joined); conn != NULL <=> a client is attached as
 *             this rank; known_chunks <= nchunks. */
typedef struct hd_rank {
    bool joined;              /* attached at least once: chunks exist */
    uint32_t lidx;            /* index among this node's ranks (allocator core rank) */
    hd_conn *conn;
    pid_t pid;
    int device;
    char uuid[HB_UUID_LEN];
    uint64_t next_seq;        /* next allocation number of this rank */
    hb_chunk *chunks;
    uint32_t nchunks, capchunks;
    uint32_t known_chunks;    /* chunk indices the attached client was sent */
    bool attach_wait;         /* waiting for the heap to form */
    uint64_t attach_id;
    bool in_collect;
    uint64_t collect_id;
    hd_status status;         /* the rank's status page (fd -1 until joined) */
    uint64_t dev_free, dev_total, dev_ns; /* last device memory sample */
    uint64_t stream_waiting, dev_waits_avoided; /* from the rank's last Collect */
} hd_rank;

/* Invariants:
 *   log holds decisions log_base .. decided-1;
 *   log_base <= min(next_seq of attached ranks) (trimmed lazily);
 *   collect_at == UINT64_MAX or collect_at == decided (a collect is owed
 *   before allocation number `decided`);
 *   coll_active => coll_waiting == number of ranks with in_collect. */
struct hd_heap {
    hd_registry *reg;
    char name[HD_NAME_MAX + 1];
    uint32_t world_size;
    uint32_t local_size;      /* ranks served by this node (== world_size: single node) */
    char job[128];            /* job incarnation, namespaces store keys */
    ha_params ap;
    uint32_t timeout_ms;
    uint64_t epoch;
    uid_t owner;              /* the uid that created the heap */
    ha_heap *core;
    hd_rank *ranks;
    uint32_t njoined, nattached;
    bool formed;
    hd_decision *log;
    size_t nlog, caplog;
    uint64_t log_base, decided;
    uint64_t collect_at;
    bool forced;              /* collect_at was set by an operator */
    /* Cross-node forced collects owed before these allocation numbers
     * (agreed by every node), ascending; force_at[0] is the next one. */
    uint64_t force_at[16];
    uint32_t nforce;
    char inc[200];            /* store incarnation: job + parameter fingerprint */
    bool coll_active;
    uint64_t coll_seq;
    uint32_t coll_waiting;
    /* Cross-node collect (local_size < world_size). */
    uint64_t cnum;            /* store collect number of the collect in progress */
    uint64_t cnum_seq, cnum_sub; /* collects started at allocation cnum_seq so far */
    bool store_wait;          /* every local rank arrived; waiting for the store */
    bool store_abandoned;     /* failed here while the store still decides it */
    /* Cross-node forced collect: agreement on the allocation number. */
    bool frozen;              /* no new decisions until the agreement returns */
    bool force_busy;
    uint32_t force_queued;
    uint64_t force_count;
    struct held_alloc { hd_conn *conn; uint64_t id, seq, size; } *held;
    size_t nheld, capheld;
    hd_conn *force_conn;      /* heapctl waiting for the agreed point */
    uint64_t force_id;
    uv_timer_t timer;         /* attach and collect timeouts */
    bool timer_attach;
    uint64_t coll_start_ns;   /* metrics (issue 20): when the collect began */
    hd_hist coll_wait, growth;
    hd_heap *next;
};

struct hd_registry {
    uv_loop_t *loop;
    hb_backend *be;
    hd_config cfg;
    uv_timer_t meminfo;       /* samples device memory for the status pages */
    struct hd_store *store;   /* cross-node collect; NULL: single node */
    hd_heap *heaps;
    uint32_t nheaps;
    uint64_t next_epoch;
    uint64_t start_ns;        /* uv_hrtime at creation: uptime in stats */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Writes every joined rank's status page from the heap's current state. */
static void heap_publish(hd_heap *h)
{
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
    uint64_t ns = now_ns();
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
        heap_publish(h);
    }
}

int hd_registry_create(uv_loop_t *loop, hb_backend *be, const hd_config *cfg, hd_registry **out)
{
    hd_registry *r = calloc(1, sizeof *r);
    if (!r)
        return -1;
    r->loop = loop;
    r->be = be;
    r->cfg = *cfg;
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

static const char *human(uint64_t b, char *buf, size_t len) { return hs_format_size(b, buf, len); }

/* ---- heap lifetime ------------------------------------------------------- */

static void timer_closed(uv_handle_t *h)
{
    hd_heap *hp = h->data;
    free(hp);
}

static void heap_destroy(hd_heap *h)
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
        for (uint32_t j = 0; j < k->nchunks; j++) {
            released += k->chunks[j].size;
            hb_chunk_release(r->be, &k->chunks[j]);
        }
        free(k->chunks);
        hd_status_destroy(&k->status);
    }
    char b1[32];
    hd_info("heap \"%s\" destroyed: last client gone, %s of chunks released", h->name,
            human(released, b1, sizeof b1));
    free(h->ranks);
    free(h->log);
    free(h->held);
    ha_destroy(h->core);
    uv_timer_stop(&h->timer);
    uv_close((uv_handle_t *)&h->timer, timer_closed);
}

static hd_heap *heap_find(hd_registry *r, const char *name)
{
    for (hd_heap *h = r->heaps; h; h = h->next)
        if (!strcmp(h->name, name))
            return h;
    return NULL;
}

static void registry_closed(uv_handle_t *h) { free(h->data); }

void hd_registry_destroy(hd_registry *r)
{
    if (!r)
        return;
    while (r->heaps)
        heap_destroy(r->heaps);
    uv_timer_stop(&r->meminfo);
    uv_close((uv_handle_t *)&r->meminfo, registry_closed);
}

/* Lists ranks matching `want` (in_collect / attach state) as "0, 2, 5". */
static void rank_list(const hd_heap *h, int which, char *buf, size_t len)
{
    size_t n = 0;
    int count = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < h->world_size && n + 16 < len; i++) {
        const hd_rank *k = &h->ranks[i];
        bool match = which == 0 ? k->joined && !k->in_collect /* missing from collect */
                   : which == 1 ? k->in_collect        /* waiting in collect */
                   : which == 2 ? !k->conn              /* never attached / gone */
                                : k->attach_wait;       /* waiting in attach */
        if (!match)
            continue;
        n += (size_t)snprintf(buf + n, len - n, "%s%u", count ? ", " : "", i);
        count++;
    }
    if (n + 16 >= len)
        snprintf(buf + n, len - n, ", ...");
}

/* ---- chunks ------------------------------------------------------------------ */

static int rank_add_chunks(hd_heap *h, hd_rank *k, uint32_t upto, char *err, size_t errlen)
{
    if (upto > k->capchunks) {
        uint32_t nc = k->capchunks ? k->capchunks : 4;
        while (nc < upto)
            nc *= 2;
        hb_chunk *n = realloc(k->chunks, nc * sizeof *n);
        if (!n) {
            snprintf(err, errlen, "out of memory for chunk records");
            return -1;
        }
        k->chunks = n;
        k->capchunks = nc;
    }
    while (k->nchunks < upto) {
        int rc = hb_chunk_create(h->reg->be, k->device, h->ap.chunk_size, &k->chunks[k->nchunks], err, errlen);
        if (rc)
            return rc;
        k->nchunks++;
    }
    return 0;
}

/* Drops chunks beyond `keep` (rollback of a failed growth). */
static void rank_trim_chunks(hd_heap *h, hd_rank *k, uint32_t keep)
{
    while (k->nchunks > keep)
        hb_chunk_release(h->reg->be, &k->chunks[--k->nchunks]);
}

/* Appends ChunkRefs (and dup'ed fds) for chunk indices [from, to) of every
 * joined rank. Returns 0, or -1 if out of memory / fds. */
typedef struct chunk_msg {
    Heapd__ChunkRef *refs;
    Heapd__ChunkRef **ptrs;
    int *fds;
    size_t n;
} chunk_msg;

static void chunk_msg_free(chunk_msg *m, bool close_fds)
{
    if (close_fds)
        for (size_t i = 0; i < m->n; i++)
            if (m->fds[i] >= 0)
                close(m->fds[i]);
    free(m->refs);
    free(m->ptrs);
    free(m->fds);
    memset(m, 0, sizeof *m);
}

static int chunk_msg_build(hd_heap *h, uint32_t from, uint32_t to, chunk_msg *m)
{
    memset(m, 0, sizeof *m);
    if (to <= from)
        return 0;
    size_t max = (size_t)(to - from) * h->world_size;
    m->refs = calloc(max, sizeof *m->refs);
    m->ptrs = calloc(max, sizeof *m->ptrs);
    m->fds = calloc(max, sizeof *m->fds);
    if (!m->refs || !m->ptrs || !m->fds) {
        chunk_msg_free(m, false);
        return -1;
    }
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (!k->joined)
            continue;
        for (uint32_t j = from; j < to && j < k->nchunks; j++) {
            int fd = dup(k->chunks[j].fd);
            if (fd < 0) {
                chunk_msg_free(m, true);
                return -1;
            }
            heapd__chunk_ref__init(&m->refs[m->n]);
            m->refs[m->n].rank = q;
            m->refs[m->n].index = j;
            m->refs[m->n].fd_index = (uint32_t)m->n;
            m->ptrs[m->n] = &m->refs[m->n];
            m->fds[m->n] = fd;
            m->n++;
        }
    }
    return 0;
}

/* ---- attach ------------------------------------------------------------------ */

static void fill_params(const hd_heap *h, Heapd__HeapParams *p)
{
    heapd__heap_params__init(p);
    p->chunk_size = h->ap.chunk_size;
    p->initial_size = h->ap.initial_size;
    p->va_size = h->ap.va_size;
    p->min_block = h->ap.min_block;
    p->policy = h->ap.policy == HA_POLICY_SEED ? HEAPD__POLICY__POLICY_SEED : HEAPD__POLICY__POLICY_COALESCE;
    p->collect_timeout_ms = h->timeout_ms;
}

static void send_attach_reply(hd_heap *h, uint32_t rank, uint64_t id)
{
    hd_rank *k = &h->ranks[rank];
    ha_stats st;
    ha_get_stats(h->core, &st);
    uint32_t nch = (uint32_t)(st.mapped / h->ap.chunk_size);
    chunk_msg cm;
    if (chunk_msg_build(h, 0, nch, &cm)) {
        hd_conn_error(k->conn, id, HEAPD__ERR_CODE__ERR_NO_MEMORY,
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
    Heapd__HeapParams params;
    fill_params(h, &params);
    uint32_t *local = calloc(h->world_size, sizeof *local);
    size_t nlocal = 0;
    for (uint32_t q = 0; local && q < h->world_size; q++)
        if (h->ranks[q].joined)
            local[nlocal++] = q;
    Heapd__AttachReply ar = HEAPD__ATTACH_REPLY__INIT;
    ar.params = &params;
    ar.world_size = h->world_size;
    ar.n_local_ranks = nlocal;
    ar.local_ranks = local;
    ar.mapped = st.mapped;
    ar.n_chunks = cm.n;
    ar.chunks = cm.ptrs;
    ar.status_fd_index = status_index;
    ar.next_seq = k->next_seq;
    ar.backend = (char *)hb_name(h->reg->be);
    ar.epoch = h->epoch;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ATTACH_REPLY;
    f.attach_reply = &ar;
    k->known_chunks = nch;
    hd_conn_send(k->conn, &f, fds, cm.n + (status_index >= 0));
    free(local);
    chunk_msg_free(&cm, false);
}

static void heap_timeout(uv_timer_t *t);

static void arm_timer(hd_heap *h, bool attach)
{
    h->timer_attach = attach;
    uv_update_time(h->timer.loop);   /* from now, not from the start of the loop turn */
    uv_timer_start(&h->timer, heap_timeout, h->timeout_ms, 0);
}

/* Chunk bytes the heaps of `uid` use (every rank's chunks). */
static uint64_t uid_bytes(const hd_registry *r, uid_t uid)
{
    uint64_t sum = 0;
    for (const hd_heap *h = r->heaps; h; h = h->next)
        if (h->owner == uid) {
            ha_stats st;
            ha_get_stats(h->core, &st);
            sum += st.mapped * h->local_size;
        }
    return sum;
}

/* 0 if `add` more chunk bytes for heap h (NULL: a new heap named `name`)
 * of `uid` fit the quotas (current heap bytes `have`), else -1 with why. */
static int quota_check(const hd_registry *r, const char *name, uid_t uid, uint64_t have, uint64_t add, char *why,
                       size_t len)
{
    char b1[32], b2[32], b3[32];
    if (r->cfg.quota_heap && have + add > r->cfg.quota_heap) {
        snprintf(why, len, "heap \"%s\" would use %s of chunk memory (now %s), over the per-heap quota of %s "
                 "(heapd.conf quota_heap); free memory, use fewer ranks or a smaller heap",
                 name, human(have + add, b1, sizeof b1), human(have, b2, sizeof b2),
                 human(r->cfg.quota_heap, b3, sizeof b3));
        return -1;
    }
    uint64_t u = uid_bytes(r, uid);
    if (r->cfg.quota_uid && u + add > r->cfg.quota_uid) {
        snprintf(why, len, "uid %ld would use %s of chunk memory over all its heaps (now %s), over the per-uid "
                 "quota of %s (heapd.conf quota_uid)",
                 (long)uid, human(u + add, b1, sizeof b1), human(u, b2, sizeof b2),
                 human(r->cfg.quota_uid, b3, sizeof b3));
        return -1;
    }
    return 0;
}

static uint64_t pick(uint64_t requested, uint64_t dflt) { return requested ? requested : dflt; }

static hd_heap *heap_create(hd_registry *r, const Heapd__Attach *m, hd_conn *c, uint64_t id)
{
    const Heapd__HeapParams *rp = m->params;
    const hd_config *cfg = &r->cfg;
    ha_params ap;
    memset(&ap, 0, sizeof ap);
    uint32_t local_size = m->local_size ? m->local_size : m->world_size;
    if (local_size > m->world_size) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "local_size %u is larger than world_size %u",
                      local_size, m->world_size);
        return NULL;
    }
    if (local_size < m->world_size && !hd_registry_has_store(r)) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "heap \"%s\" spans nodes (local_size %u < world_size %u) but this heapd has no store: set "
                      "`store = redis://HOST:PORT` in heapd.conf on every node",
                      m->heap, local_size, m->world_size);
        return NULL;
    }
    ap.ranks = local_size;
    ap.chunk_size = pick(rp ? rp->chunk_size : 0, cfg->chunk_size);
    ap.min_block = pick(rp ? rp->min_block : 0, cfg->min_block);
    ap.va_size = pick(rp ? rp->va_size : 0, cfg->va_size);
    ap.initial_size = pick(rp ? rp->initial_size : 0, cfg->initial_size ? cfg->initial_size : ap.chunk_size);
    ap.policy = cfg->policy;
    if (rp && rp->policy == HEAPD__POLICY__POLICY_SEED)
        ap.policy = HA_POLICY_SEED;
    else if (rp && rp->policy == HEAPD__POLICY__POLICY_COALESCE)
        ap.policy = HA_POLICY_COALESCE;
    uint64_t gran = hb_granularity(r->be, 0);
    if (gran && ap.chunk_size % gran) {
        char b1[32], b2[32];
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "chunk_size %s is not a multiple of the %s backend's granularity %s; use a multiple of %s",
                      human(ap.chunk_size, b1, sizeof b1), hb_name(r->be), human(gran, b2, sizeof b2), b2);
        return NULL;
    }
    char why[512];
    if (ha_params_check(&ap, why, sizeof why)) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "heap parameters rejected: %s", why);
        return NULL;
    }
    if (quota_check(r, m->heap, hd_conn_uid(c), 0, ap.initial_size * local_size, why, sizeof why)) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_QUOTA, "%s", why);
        return NULL;
    }
    hd_heap *h = calloc(1, sizeof *h);
    if (!h || !(h->ranks = calloc(m->world_size, sizeof *h->ranks)) ||
        ha_create(&ap, &h->core, why, sizeof why)) {
        if (h)
            free(h->ranks);
        free(h);
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory creating heap \"%s\"", m->heap);
        return NULL;
    }
    h->reg = r;
    for (uint32_t q = 0; q < m->world_size; q++)
        h->ranks[q].status.fd = -1; /* no page until the rank joins */
    snprintf(h->name, sizeof h->name, "%s", m->heap);
    h->world_size = m->world_size;
    h->local_size = local_size;
    snprintf(h->job, sizeof h->job, "%s", m->job && m->job[0] ? m->job : "0");
    {
        /* Nodes with different heap parameters must never meet in the store:
         * the fingerprint puts them in different keys (they time out naming
         * each other's ranks instead of diverging silently). */
        uint64_t fp = UINT64_C(1469598103934665603);
        uint64_t v[7] = {ap.chunk_size, ap.initial_size, ap.va_size, ap.min_block, (uint64_t)ap.policy,
                         0, 0};
        for (int i = 0; i < 6; i++)
            for (int b = 0; b < 8; b++)
                fp = (fp ^ ((v[i] >> (8 * b)) & 0xff)) * UINT64_C(1099511628211);
        snprintf(h->inc, sizeof h->inc, "%s~%08llx", h->job, (unsigned long long)(fp & 0xffffffffu));
    }
    h->ap = ap;
    h->timeout_ms = pick(rp ? rp->collect_timeout_ms : 0, cfg->collect_timeout_ms);
    h->epoch = r->next_epoch++;
    h->owner = hd_conn_uid(c);
    h->collect_at = UINT64_MAX;
    uv_timer_init(r->loop, &h->timer);
    h->timer.data = h;
    h->next = r->heaps;
    r->heaps = h;
    r->nheaps++;
    char b1[32], b2[32], b3[32];
    hd_info("heap \"%s\" created: %u ranks (%u here), chunk %s, initial %s, va %s, policy %s", h->name,
            h->world_size, h->local_size,
            human(ap.chunk_size, b1, sizeof b1), human(ap.initial_size, b2, sizeof b2),
            human(ap.va_size, b3, sizeof b3), ha_policy_name(ap.policy));
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
    const Heapd__HeapParams *p = m->params;
    if (!p)
        return false;
#define CHK(field, name, have)                                                                      \
    if (p->field && p->field != (have)) {                                                           \
        snprintf(why, len, "%s %llu differs from the heap's %llu", name, (unsigned long long)p->field,   \
                 (unsigned long long)(have));                                                       \
        return true;                                                                                \
    }
    CHK(chunk_size, "chunk_size", h->ap.chunk_size)
    CHK(initial_size, "initial_size", h->ap.initial_size)
    CHK(va_size, "va_size", h->ap.va_size)
    CHK(min_block, "min_block", h->ap.min_block)
    CHK(collect_timeout_ms, "collect_timeout_ms", h->timeout_ms)
#undef CHK
    if (p->policy != HEAPD__POLICY__POLICY_DEFAULT) {
        ha_policy want = p->policy == HEAPD__POLICY__POLICY_SEED ? HA_POLICY_SEED : HA_POLICY_COALESCE;
        if (want != h->ap.policy) {
            snprintf(why, len, "policy %s differs from the heap's %s", ha_policy_name(want),
                     ha_policy_name(h->ap.policy));
            return true;
        }
    }
    return false;
}

void hd_heap_attach(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Attach *m)
{
    hd_binding *b = hd_conn_binding(c);
    if (b->heap) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                      "this connection is already attached to heap \"%s\" as rank %u; detach first",
                      b->heap->name, b->rank);
        return;
    }
    if (!m->heap || !m->heap[0] || strlen(m->heap) > HD_NAME_MAX) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "heap name must be 1 to %d bytes", HD_NAME_MAX);
        return;
    }
    for (const unsigned char *p = (const unsigned char *)m->heap; *p; p++)
        if (*p < 0x20 || *p == 0x7f) {
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                          "heap name contains a control character (byte %u); use printable characters", *p);
            return;
        }
    if (m->world_size < 1 || m->world_size > HA_MAX_RANKS) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "world_size %u is out of range (1..%u)", m->world_size,
                      HA_MAX_RANKS);
        return;
    }
    if (m->rank >= m->world_size) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "rank %u is out of range: world_size is %u (ranks 0..%u)",
                      m->rank, m->world_size, m->world_size - 1);
        return;
    }
    int device = 0;
    char err[512];
    if (hb_device_from_uuid(r->be, m->device_uuid ? m->device_uuid : "", &device, err, sizeof err)) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "%s", err);
        return;
    }
    hd_heap *h = heap_find(r, m->heap);
    bool created = false;
    if (!h) {
        h = heap_create(r, m, c, id);
        if (!h)
            return;
        created = true;
    } else if (h->owner != hd_conn_uid(c) && !hd_conn_privileged(c, r->cfg.admin_gid)) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_DENIED,
                      "heap \"%s\" belongs to uid %ld; uid %ld may not attach to it (only its owner, root and "
                      "members of heapd.conf's admin_group may); pick another heap name",
                      h->name, (long)h->owner, (long)hd_conn_uid(c));
        return;
    } else if (params_differ(h, m, err, sizeof err)) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_MISMATCH, "heap \"%s\" exists with other parameters: %s",
                      h->name, err);
        return;
    }
    hd_rank *k = &h->ranks[m->rank];
    if (k->conn) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                      "rank %u of heap \"%s\" is already attached by pid %ld; each rank attaches once",
                      m->rank, h->name, (long)k->pid);
        return;
    }
    if (!k->joined && h->njoined == h->local_size) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "heap \"%s\" already has its %u local rank(s) on this node; rank %u must attach to the heapd "
                      "of its own node, or local_size is wrong",
                      h->name, h->local_size, m->rank);
        return;
    }
    if (!k->joined) {
        k->lidx = h->njoined;
        k->device = device;
        snprintf(k->uuid, sizeof k->uuid, "%s", m->device_uuid ? m->device_uuid : "");
        ha_stats st;
        ha_get_stats(h->core, &st);
        if (rank_add_chunks(h, k, (uint32_t)(st.mapped / h->ap.chunk_size), err, sizeof err)) {
            rank_trim_chunks(h, k, 0);
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "could not create the chunks of rank %u: %s",
                          m->rank, err);
            if (created && h->nattached == 0)
                heap_destroy(h);
            return;
        }
        if (hd_status_create(&k->status, m->rank, err, sizeof err)) {
            rank_trim_chunks(h, k, 0);
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "could not create the status page of rank %u: %s",
                          m->rank, err);
            if (created && h->nattached == 0)
                heap_destroy(h);
            return;
        }
        k->joined = true;
        h->njoined++;
        {
            char e2[256];
            if (hb_meminfo(r->be, device, &k->dev_free, &k->dev_total, e2, sizeof e2) == 0)
                k->dev_ns = now_ns();
        }
        heap_publish(h);
    } else if (k->next_seq < h->log_base) {
        hd_warn("heap \"%s\": rank %u re-attached at allocation %llu, which is no longer logged; "
                "it continues at %llu", h->name, m->rank, (unsigned long long)k->next_seq,
                (unsigned long long)h->decided);
        k->next_seq = h->decided;
    }
    k->conn = c;
    k->pid = hd_conn_pid(c);
    h->nattached++;
    b->heap = h;
    b->rank = m->rank;
    b->name = h->name;
    hd_info("heap \"%s\": rank %u attached (pid %ld, %u of %u local ranks)", h->name, m->rank, (long)k->pid,
            h->nattached, h->local_size);
    if (h->formed) {
        send_attach_reply(h, m->rank, id);
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
    } else if (!uv_is_active((uv_handle_t *)&h->timer)) {
        arm_timer(h, true);
    }
}

/* ---- collect ----------------------------------------------------------------- */

static bool multi(const hd_heap *h) { return h->local_size < h->world_size; }

/* Answers every rank waiting in the collect with the error and ends it. */
static void collect_fail_waiting(hd_heap *h, Heapd__ErrCode code, const char *msg)
{
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (k->in_collect) {
            k->in_collect = false;
            if (k->conn)
                hd_conn_error(k->conn, k->collect_id, code, "%s", msg);
        }
    }
    h->coll_active = false;
    h->coll_waiting = 0;
    uv_timer_stop(&h->timer);
}

/* A collect fails here (timeout, a rank gone, ...). */
static void collect_fail(hd_heap *h, Heapd__ErrCode code, const char *msg)
{
    /* Tell the other nodes, unless the failure came from the store. */
    if (multi(h) && h->coll_active && code != HEAPD__ERR_CODE__ERR_STORE && h->reg->store)
        hd_store_collect_abort(h->reg->store, h->name, h->inc, h->cnum, msg);
    /* If the abort loses the race with completion in the store, every other
     * node applies the result: this one must too (store_collect_cb). */
    if (h->store_wait)
        h->store_abandoned = true;
    h->store_wait = false;
    collect_fail_waiting(h, code, msg);
}

static void collect_reply_all(hd_heap *h, uint64_t blocks, uint64_t bytes)
{
    if (h->nforce && h->force_at[0] == h->coll_seq) {
        memmove(h->force_at, h->force_at + 1, (h->nforce - 1) * sizeof h->force_at[0]);
        h->nforce--;
    }
    if (h->collect_at == h->coll_seq) {
        h->collect_at = UINT64_MAX;
        h->forced = false;
    }
    hd_hist_observe(&h->coll_wait, uv_hrtime() - h->coll_start_ns);
    ha_stats st;
    ha_get_stats(h->core, &st);
    char b1[32];
    hd_debug("heap \"%s\": collect at allocation %llu reclaimed %llu blocks (%s)", h->name,
             (unsigned long long)h->coll_seq, (unsigned long long)blocks, human(bytes, b1, sizeof b1));
    heap_publish(h); /* the page is current before any rank hears back */
    Heapd__CollectReply cr = HEAPD__COLLECT_REPLY__INIT;
    cr.reclaimed_blocks = blocks;
    cr.reclaimed_bytes = bytes;
    cr.collects = st.collects;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_COLLECT_REPLY;
    f.collect_reply = &cr;
    for (uint32_t q = 0; q < h->world_size; q++) {
        hd_rank *k = &h->ranks[q];
        if (!k->in_collect)
            continue;
        k->in_collect = false;
        f.id = k->collect_id;
        hd_conn_send(k->conn, &f, NULL, 0);
    }
    h->coll_active = false;
    h->coll_waiting = 0;
    h->store_wait = false;
    uv_timer_stop(&h->timer);
    heap_publish(h);
}

/* Identifies a heap across an asynchronous store call (it may be destroyed
 * meanwhile). */
typedef struct heap_ref {
    hd_registry *reg;
    char name[HD_NAME_MAX + 1];
    uint64_t epoch;
} heap_ref;

static heap_ref *heap_ref_new(hd_heap *h)
{
    heap_ref *x = malloc(sizeof *x);
    if (x) {
        x->reg = h->reg;
        snprintf(x->name, sizeof x->name, "%s", h->name);
        x->epoch = h->epoch;
    }
    return x;
}

static hd_heap *heap_find(hd_registry *r, const char *name);

static hd_heap *heap_ref_get(heap_ref *x)
{
    hd_heap *h = heap_find(x->reg, x->name);
    return h && h->epoch == x->epoch ? h : NULL;
}

static uint32_t store_ttl_s(const hd_heap *h)
{
    uint32_t t = h->timeout_ms / 100; /* 10x the timeout */
    return t < 60 ? 60 : t;
}

static size_t local_ranks(const hd_heap *h, uint32_t *out)
{
    size_t n = 0;
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].joined)
            out[n++] = q;
    return n;
}

static Heapd__ErrCode store_code(const char *msg)
{
    if (strstr(msg, "timed out"))
        return HEAPD__ERR_CODE__ERR_TIMEOUT;
    if (strstr(msg, "disconnected") || strstr(msg, "detached"))
        return HEAPD__ERR_CODE__ERR_PEER_GONE;
    if (strstr(msg, "asymmetric"))
        return HEAPD__ERR_CODE__ERR_ASYMMETRY;
    return HEAPD__ERR_CODE__ERR_STORE;
}

static void store_collect_cb(void *arg, int status, const char *errmsg, const uint64_t *offsets, size_t n)
{
    heap_ref *x = arg;
    hd_heap *h = heap_ref_get(x);
    free(x);
    if (!h)
        return;
    if (!h->store_wait) {
        if (h->store_abandoned && status == 0 && ha_collect_apply(h->core, offsets, n, NULL) == HA_OK) {
            hd_warn("heap \"%s\": the collect failed here but completed on the other nodes; its result was "
                    "applied so that offsets stay symmetric",
                    h->name);
            heap_publish(h);
        }
        h->store_abandoned = false;
        return;
    }
    h->store_wait = false;
    h->store_abandoned = false;
    if (status < 0) {
        Heapd__ErrCode code = store_code(errmsg ? errmsg : "");
        hd_warn("heap \"%s\": cross-node collect failed: %s", h->name, errmsg ? errmsg : "store error");
        /* Every node got this same answer: nothing to tell the store. */
        collect_fail_waiting(h, code, errmsg ? errmsg : "store error");
        return;
    }
    uint64_t bytes = 0;
    if (ha_collect_apply(h->core, offsets, n, &bytes) != HA_OK) {
        collect_fail(h, HEAPD__ERR_CODE__ERR_STORE,
                     "the store's collect result holds offsets this node did not release: the nodes disagree "
                     "(different heap parameters or allocation sequences?); restart the job");
        return;
    }
    collect_reply_all(h, n, bytes);
}

static void collect_finish(hd_heap *h)
{
    if (!multi(h)) {
        uint64_t blocks = 0, bytes = 0;
        ha_collect(h->core, &blocks, &bytes);
        collect_reply_all(h, blocks, bytes);
        return;
    }
    char err[512];
    uint64_t *offs = NULL;
    size_t n = 0;
    uint32_t *lr = calloc(h->world_size, sizeof *lr);
    heap_ref *x = heap_ref_new(h);
    if (!lr || !x || ha_collect_candidates(h->core, &offs, &n) != HA_OK) {
        free(lr);
        free(x);
        collect_fail(h, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
        return;
    }
    size_t nl = local_ranks(h, lr);
    uv_timer_stop(&h->timer);
    h->store_wait = true;
    int rc = hd_store_collect(h->reg->store, h->name, h->inc, h->cnum, h->world_size, lr, nl, offs, n,
                              h->timeout_ms, store_ttl_s(h), store_collect_cb, x, err, sizeof err);
    free(lr);
    free(offs);
    if (rc < 0) {
        free(x);
        h->store_wait = false;
        collect_fail(h, HEAPD__ERR_CODE__ERR_STORE, err);
    }
}

static void heap_timeout(uv_timer_t *t)
{
    hd_heap *h = t->data;
    char missing[400], waiting[400], msg[1400];
    msg[0] = 0;
    if (h->timer_attach) {
        if (h->formed)
            return;
        rank_list(h, 2, missing, sizeof missing);
        rank_list(h, 3, waiting, sizeof waiting);
        snprintf(msg, sizeof msg,
                 "attach to heap \"%s\" timed out after %u ms: rank(s) %s never attached (attached: %s); "
                 "start every rank, or raise collect_timeout_ms",
                 h->name, h->timeout_ms, missing, waiting);
        hd_warn("%s", msg);
        for (uint32_t q = 0; q < h->world_size; q++) {
            hd_rank *k = &h->ranks[q];
            if (k->attach_wait && k->conn) {
                k->attach_wait = false;
                hd_conn_error(k->conn, k->attach_id, HEAPD__ERR_CODE__ERR_TIMEOUT, "%s", msg);
            }
        }
        return;
    }
    if (!h->coll_active)
        return;
    rank_list(h, 0, missing, sizeof missing);
    rank_list(h, 1, waiting, sizeof waiting);
    snprintf(msg, sizeof msg,
             "collect on heap \"%s\" at allocation %llu timed out after %u ms: rank(s) %s never arrived "
             "(waiting: %s); check that every rank reaches the same allocation",
             h->name, (unsigned long long)h->coll_seq, h->timeout_ms, missing, waiting);
    hd_warn("%s", msg);
    collect_fail(h, HEAPD__ERR_CODE__ERR_TIMEOUT, msg);
}

void hd_heap_collect(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Collect *m)
{
    (void)r;
    hd_binding *b = hd_conn_binding(c);
    hd_heap *h = b->heap;
    if (!h || !h->formed) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_STATE, "collect before attach: attach to a heap first");
        return;
    }
    hd_rank *k = &h->ranks[b->rank];
    if (k->in_collect) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "rank %u is already waiting in a collect", b->rank);
        return;
    }
    if (m->seq != k->next_seq) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL,
                      "collect at allocation %llu, but rank %u is at allocation %llu",
                      (unsigned long long)m->seq, b->rank, (unsigned long long)k->next_seq);
        return;
    }
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].joined && !h->ranks[q].conn) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "collect on heap \"%s\" cannot complete: rank %u is not connected (pid %ld disconnected "
                     "or detached); restart the job",
                     h->name, q, (long)h->ranks[q].pid);
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_PEER_GONE, "%s", msg);
            if (h->coll_active)
                collect_fail(h, HEAPD__ERR_CODE__ERR_PEER_GONE, msg);
            return;
        }
    if (h->coll_active && m->seq != h->coll_seq) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "asymmetric collect on heap \"%s\": rank %u collects at allocation %llu but the collect in "
                 "progress is at %llu; every rank must collect at the same point of its allocation sequence",
                 h->name, b->rank, (unsigned long long)m->seq, (unsigned long long)h->coll_seq);
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_ASYMMETRY, "%s", msg);
        collect_fail(h, HEAPD__ERR_CODE__ERR_ASYMMETRY, msg);
        return;
    }
    if (!h->coll_active) {
        h->coll_active = true;
        h->coll_start_ns = uv_hrtime();
        h->coll_seq = m->seq;
        h->coll_waiting = 0;
        /* Collect number: the allocation number and how many collects
         * started there before: the same on every node. */
        if (h->cnum_seq != m->seq || !h->cnum_sub) {
            h->cnum_seq = m->seq;
            h->cnum_sub = 0;
        }
        h->cnum = (m->seq << 16) | (h->cnum_sub++ & 0xffff);
        arm_timer(h, false);
    }
    k->in_collect = true;
    k->collect_id = id;
    k->stream_waiting = m->stream_waiting;
    k->dev_waits_avoided = m->device_waits_avoided;
    h->coll_waiting++;
    if (h->coll_waiting == h->local_size)
        collect_finish(h);
}

/* ---- alloc ------------------------------------------------------------------- */

static void trim_log(hd_heap *h)
{
    uint64_t min = h->decided;
    for (uint32_t q = 0; q < h->world_size; q++)
        if (h->ranks[q].conn && h->ranks[q].next_seq < min)
            min = h->ranks[q].next_seq;
    if (min <= h->log_base)
        return;
    size_t drop = (size_t)(min - h->log_base);
    memmove(h->log, h->log + drop, (h->nlog - drop) * sizeof *h->log);
    h->nlog -= drop;
    h->log_base = min;
}

/* Returns 0, -1 (backend failure) or -2 (quota), with err filled. */
static int grow(hd_heap *h, uint32_t chunks, char *err, size_t errlen)
{
    ha_stats st;
    ha_get_stats(h->core, &st);
    uint32_t have = (uint32_t)(st.mapped / h->ap.chunk_size);
    uint64_t t0 = uv_hrtime();
    if (quota_check(h->reg, h->name, h->owner, st.mapped * h->local_size,
                    (uint64_t)chunks * h->ap.chunk_size * h->local_size, err, errlen))
        return -2;
    for (uint32_t q = 0; q < h->world_size; q++) {
        if (!h->ranks[q].joined)
            continue;
        if (rank_add_chunks(h, &h->ranks[q], have + chunks, err, errlen)) {
            for (uint32_t p = 0; p <= q; p++)
                rank_trim_chunks(h, &h->ranks[p], have);
            return -1;
        }
    }
    if (ha_grow(h->core, chunks)) {
        for (uint32_t p = 0; p < h->world_size; p++)
            rank_trim_chunks(h, &h->ranks[p], have);
        snprintf(err, errlen, "the allocator refused to grow by %u chunks", chunks);
        return -1;
    }
    char b1[32], b2[32];
    hd_info("heap \"%s\" grew from %s to %s per rank (%u chunk%s on each of %u ranks)", h->name,
            human(st.mapped, b1, sizeof b1), human(st.mapped + (uint64_t)chunks * h->ap.chunk_size, b2, sizeof b2),
            chunks, chunks == 1 ? "" : "s", h->local_size);
    hd_hist_observe(&h->growth, uv_hrtime() - t0);
    return 0;
}

static void send_collect_needed(hd_conn *c, uint64_t id, uint64_t seq)
{
    Heapd__AllocReply ar = HEAPD__ALLOC_REPLY__INIT;
    ar.seq = seq;
    ar.collect_needed = true;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ALLOC_REPLY;
    f.alloc_reply = &ar;
    hd_conn_send(c, &f, NULL, 0);
}

void hd_heap_alloc(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Alloc *m)
{
    (void)r;
    hd_binding *b = hd_conn_binding(c);
    hd_heap *h = b->heap;
    if (!h || !h->formed) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_STATE, "alloc before attach: attach to a heap first");
        return;
    }
    hd_rank *k = &h->ranks[b->rank];
    if (m->seq != k->next_seq) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "allocation number %llu out of order: rank %u is at %llu",
                      (unsigned long long)m->seq, b->rank, (unsigned long long)k->next_seq);
        return;
    }
    if (m->size == 0) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_INVALID, "allocation %llu: size 0 is not allowed",
                      (unsigned long long)m->seq);
        return;
    }
    if (m->size > h->ap.va_size) {
        char b1[32];
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_VA_EXHAUSTED,
                      "allocation %llu of %llu bytes is larger than the heap's va_size (%s); attach with a larger va_size",
                      (unsigned long long)m->seq, (unsigned long long)m->size, human(h->ap.va_size, b1, sizeof b1));
        return;
    }
    const hd_decision *d;
    if (m->seq < h->decided) {
        d = &h->log[m->seq - h->log_base];
        if (d->size != m->size) {
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_ASYMMETRY,
                          "asymmetric allocation %llu on heap \"%s\": rank %u asked for %llu bytes, rank %u for %llu; "
                          "every rank must make the same allocations in the same order",
                          (unsigned long long)m->seq, h->name, b->rank, (unsigned long long)m->size, d->rank,
                          (unsigned long long)d->size);
            return;
        }
    } else {
        if (h->collect_at == m->seq || (h->nforce && h->force_at[0] == m->seq)) {
            send_collect_needed(c, id, m->seq);
            return;
        }
        if (h->frozen) {
            /* A cross-node forced collect is agreeing on its allocation
             * number: decide nothing new until it has. */
            if (h->nheld == h->capheld) {
                size_t nc = h->capheld ? h->capheld * 2 : 8;
                struct held_alloc *nh = realloc(h->held, nc * sizeof *nh);
                if (!nh) {
                    hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
                    return;
                }
                h->held = nh;
                h->capheld = nc;
            }
            h->held[h->nheld++] = (struct held_alloc){c, id, m->seq, m->size};
            return;
        }
        if (h->nlog == h->caplog) {
            if (h->nlog >= HD_LOG_TRIM)
                trim_log(h);
            if (h->nlog == h->caplog) {
                size_t nc = h->caplog ? h->caplog * 2 : 64;
                hd_decision *nl = realloc(h->log, nc * sizeof *nl);
                if (!nl) {
                    hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
                    return;
                }
                h->log = nl;
                h->caplog = nc;
            }
        }
        ha_alloc_result res;
        char err[512];
        for (;;) {
            int rc = ha_alloc(h->core, m->size, &res);
            if (rc == HA_OK)
                break;
            if (rc == HA_NEED_COLLECT) {
                h->collect_at = m->seq;
                send_collect_needed(c, id, m->seq);
                return;
            }
            if (rc == HA_NEED_GROW) {
                int g = grow(h, res.grow_chunks, err, sizeof err);
                if (g == -2) {
                    hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_QUOTA, "allocation %llu of %llu bytes: %s",
                                  (unsigned long long)m->seq, (unsigned long long)m->size, err);
                    return;
                }
                if (g) {
                    hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY,
                                  "allocation %llu of %llu bytes needs the heap to grow by %u chunk(s), which failed: %s",
                                  (unsigned long long)m->seq, (unsigned long long)m->size, res.grow_chunks, err);
                    return;
                }
                continue;
            }
            if (rc == HA_EVA) {
                ha_stats st;
                ha_get_stats(h->core, &st);
                char b1[32], b2[32], b3[32];
                hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_VA_EXHAUSTED,
                              "allocation %llu of %llu bytes does not fit: heap \"%s\" has %s mapped, %s live, "
                              "va_size %s; free memory or attach with a larger va_size",
                              (unsigned long long)m->seq, (unsigned long long)m->size, h->name,
                              human(st.mapped, b1, sizeof b1), human(st.live_bytes, b2, sizeof b2),
                              human(h->ap.va_size, b3, sizeof b3));
                return;
            }
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "allocation %llu failed: %s",
                          (unsigned long long)m->seq, ha_strerror(rc));
            return;
        }
        ha_stats st;
        ha_get_stats(h->core, &st);
        hd_decision *nd = &h->log[h->nlog++];
        nd->size = m->size;
        nd->offset = res.offset;
        nd->block_size = res.block_size;
        nd->mapped = st.mapped;
        nd->rank = b->rank;
        h->decided++;
        d = nd;
        heap_publish(h);
    }
    uint32_t upto = (uint32_t)(d->mapped / h->ap.chunk_size);
    chunk_msg cm = {0};
    if (upto > k->known_chunks && chunk_msg_build(h, k->known_chunks, upto, &cm)) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY,
                      "heapd could not duplicate chunk fds (out of fds or memory); raise heapd's fd limit");
        return;
    }
    Heapd__AllocReply ar = HEAPD__ALLOC_REPLY__INIT;
    ar.seq = m->seq;
    ar.offset = d->offset;
    ar.block_size = d->block_size;
    ar.mapped = d->mapped;
    ar.n_new_chunks = cm.n;
    ar.new_chunks = cm.ptrs;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ALLOC_REPLY;
    f.alloc_reply = &ar;
    if (upto > k->known_chunks)
        k->known_chunks = upto;
    k->next_seq++;
    hd_conn_send(c, &f, cm.fds, cm.n);
    chunk_msg_free(&cm, false);
}

/* ---- free -------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void hd_heap_free(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Free *m)
{
    (void)r;
    hd_binding *b = hd_conn_binding(c);
    hd_heap *h = b->heap;
    if (!h || !h->formed) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_STATE, "free before attach: attach to a heap first");
        return;
    }
    for (size_t i = 0; i < m->n_offsets; i++)
        if (!ha_rank_holds(h->core, h->ranks[b->rank].lidx, m->offsets[i])) {
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NOT_HELD,
                          "free of offset %llu: rank %u holds no block there (never allocated, or already freed); "
                          "none of the %zu offsets in this batch were freed",
                          (unsigned long long)m->offsets[i], b->rank, m->n_offsets);
            return;
        }
    if (m->n_offsets > 1) {
        uint64_t *s = malloc(m->n_offsets * sizeof *s);
        if (!s) {
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
            return;
        }
        memcpy(s, m->offsets, m->n_offsets * sizeof *s);
        qsort(s, m->n_offsets, sizeof *s, cmp_u64);
        for (size_t i = 1; i < m->n_offsets; i++)
            if (s[i] == s[i - 1]) {
                hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NOT_HELD,
                              "free of offset %llu: given twice in one batch (double free); none of the batch was freed",
                              (unsigned long long)s[i]);
                free(s);
                return;
            }
        free(s);
    }
    for (size_t i = 0; i < m->n_offsets; i++)
        ha_free(h->core, h->ranks[b->rank].lidx, m->offsets[i]);
    heap_publish(h);
    Heapd__FreeReply fr = HEAPD__FREE_REPLY__INIT;
    fr.accepted = (uint32_t)m->n_offsets;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_FREE_REPLY;
    f.free_reply = &fr;
    hd_conn_send(c, &f, NULL, 0);
}

/* ---- detach and disconnect ---------------------------------------------------- */

static void forget_conn(hd_heap *h, const hd_conn *c)
{
    size_t w = 0;
    for (size_t i = 0; i < h->nheld; i++)
        if (h->held[i].conn != c)
            h->held[w++] = h->held[i];
    h->nheld = w;
    if (h->force_conn == c)
        h->force_conn = NULL;
}

static void rank_leave(hd_heap *h, uint32_t rank, bool clean)
{
    hd_rank *k = &h->ranks[rank];
    forget_conn(h, k->conn);
    k->conn = NULL;
    k->attach_wait = false;
    h->nattached--;
    hd_info("heap \"%s\": rank %u (pid %ld) %s", h->name, rank, (long)k->pid, clean ? "detached" : "disconnected");
    if (h->coll_active) {
        bool was_in = k->in_collect;
        if (was_in) {
            k->in_collect = false;
            h->coll_waiting--;
        }
        char msg[512];
        snprintf(msg, sizeof msg, "collect on heap \"%s\" failed: rank %u (pid %ld) %s while the others waited",
                 h->name, rank, (long)k->pid, clean ? "detached" : "disconnected");
        collect_fail(h, HEAPD__ERR_CODE__ERR_PEER_GONE, msg);
    }
    if (h->nattached == 0)
        heap_destroy(h);
}

void hd_heap_detach(hd_registry *r, hd_conn *c, uint64_t id)
{
    (void)r;
    hd_binding *b = hd_conn_binding(c);
    if (!b->heap) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_STATE, "detach: this connection is not attached to a heap");
        return;
    }
    hd_heap *h = b->heap;
    uint32_t rank = b->rank;
    b->heap = NULL;
    Heapd__DetachReply dr = HEAPD__DETACH_REPLY__INIT;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_DETACH_REPLY;
    f.detach_reply = &dr;
    hd_conn_send(c, &f, NULL, 0);
    rank_leave(h, rank, true);
}

void hd_heap_conn_closed(hd_registry *r, hd_conn *c)
{
    for (hd_heap *h = r->heaps; h; h = h->next)
        forget_conn(h, c);
    hd_binding *b = hd_conn_binding(c);
    if (!b->heap)
        return;
    hd_heap *h = b->heap;
    b->heap = NULL;
    rank_leave(h, b->rank, false);
}

/* ---- stats and forced collect --------------------------------------------------- */

#define HD_FORCE_WINDOW 4096 /* nodes may be this many allocations apart */

static void force_start(hd_heap *h);

static void force_reply(hd_heap *h, int ok, uint64_t at, const char *msg)
{
    if (!h->force_conn)
        return;
    if (ok) {
        Heapd__ForceCollectReply fr = HEAPD__FORCE_COLLECT_REPLY__INIT;
        fr.at_seq = at;
        Heapd__Frame f = HEAPD__FRAME__INIT;
        f.id = h->force_id;
        f.body_case = HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY;
        f.force_collect_reply = &fr;
        hd_conn_send(h->force_conn, &f, NULL, 0);
    } else {
        hd_conn_error(h->force_conn, h->force_id, HEAPD__ERR_CODE__ERR_STORE, "%s", msg);
    }
    h->force_conn = NULL;
}

/* Decisions may go on: replay the allocations held during the agreement. */
static void force_thaw(hd_heap *h)
{
    h->frozen = false;
    h->force_busy = false;
    size_t n = h->nheld;
    struct held_alloc *held = h->held;
    h->held = NULL;
    h->nheld = h->capheld = 0;
    heap_ref *x = heap_ref_new(h);
    for (size_t i = 0; i < n; i++) {
        if (x && !heap_ref_get(x))
            break; /* the heap went away while replaying */
        Heapd__Alloc a = HEAPD__ALLOC__INIT;
        a.seq = held[i].seq;
        a.size = held[i].size;
        hd_heap_alloc(h->reg, held[i].conn, held[i].id, &a);
    }
    free(held);
    if (x && heap_ref_get(x) && h->force_queued) {
        h->force_queued--;
        force_start(h);
    }
    free(x);
}

static void force_cb(void *arg, int status, const char *errmsg, const uint64_t *offsets, size_t n)
{
    heap_ref *x = arg;
    hd_heap *h = heap_ref_get(x);
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
            hd_warn("heap \"%s\": forced collect at %llu dropped: %u forced collects are already pending",
                    h->name, (unsigned long long)at, h->nforce);
        hd_info("heap \"%s\": forced collect agreed by every node at allocation %llu", h->name,
                (unsigned long long)at);
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
    heap_ref *x = heap_ref_new(h);
    char inc[160];
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
    for (uint64_t i = 0; i < HD_FORCE_WINDOW; i++)
        offs[i] = h->decided + 1 + i;
    size_t nl = local_ranks(h, lr);
    h->force_busy = true;
    h->frozen = true;
    int rc = hd_store_collect(h->reg->store, h->name, inc, h->force_count++, h->world_size, lr, nl, offs,
                              HD_FORCE_WINDOW, h->timeout_ms, store_ttl_s(h), force_cb, x, err, sizeof err);
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
    hd_heap *h = heap_find(r, heap);
    if (!h || !multi(h) || !h->formed || strcmp(h->inc, incarnation))
        return;
    if (h->force_busy) {
        h->force_queued++;
        return;
    }
    force_start(h);
}

void hd_registry_set_store(hd_registry *r, hd_store *store)
{
    r->store = store;
    if (store)
        hd_store_on_force(store, on_force, r);
}

void hd_heap_force_collect(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__ForceCollect *m)
{
    hd_heap *h = heap_find(r, m->heap ? m->heap : "");
    if (!h) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NOT_FOUND, "no heap named \"%s\"; `heapctl heaps` lists them",
                      m->heap ? m->heap : "");
        return;
    }
    if (h->owner != hd_conn_uid(c) && !hd_conn_privileged(c, r->cfg.admin_gid)) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_DENIED,
                      "forcing a collect on heap \"%s\" (uid %ld) needs root or membership of heapd.conf's "
                      "admin_group; uid %ld has neither",
                      h->name, (long)h->owner, (long)hd_conn_uid(c));
        return;
    }
    if (multi(h)) {
        char err[512];
        if (h->force_conn) {
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_STATE,
                          "a forced collect of heap \"%s\" requested here is still being agreed on; retry", h->name);
            return;
        }
        if (hd_store_publish_force(r->store, h->name, h->inc, err, sizeof err) < 0) {
            hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_STORE, "%s", err);
            return;
        }
        /* The reply comes once the nodes agreed on the allocation number. */
        h->force_conn = c;
        h->force_id = id;
        hd_info("heap \"%s\": forced collect requested by pid %ld; asking every node", h->name,
                (long)hd_conn_pid(c));
        return;
    }
    h->collect_at = h->decided;
    h->forced = true;
    hd_info("heap \"%s\": forced collect requested by pid %ld, at allocation %llu", h->name, (long)hd_conn_pid(c),
            (unsigned long long)h->decided);
    Heapd__ForceCollectReply fr = HEAPD__FORCE_COLLECT_REPLY__INIT;
    fr.at_seq = h->decided;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY;
    f.force_collect_reply = &fr;
    hd_conn_send(c, &f, NULL, 0);
}

static Heapd__Histogram *fill_hist(Heapd__Histogram *g, uint64_t *counts, const hd_hist *h)
{
    heapd__histogram__init(g);
    g->n_bounds = HD_HIST_N - 1;
    g->bounds = (double *)hd_hist_bounds;
    g->n_counts = HD_HIST_N;
    g->counts = counts;
    memcpy(counts, h->n, sizeof h->n);
    g->count = h->count;
    g->sum_seconds = (double)h->sum_ns / 1e9;
    return g;
}

void hd_heap_stats(hd_registry *r, hd_conn *c, uint64_t id, const Heapd__Stats *m, const char *backend_name,
                   uint32_t clients)
{
    const char *want = m->heap && m->heap[0] ? m->heap : NULL;
    bool all = hd_conn_privileged(c, r->cfg.admin_gid);
    uid_t uid = hd_conn_uid(c);
#define VISIBLE(h) (all || (h)->owner == uid)
    if (want && (!heap_find(r, want) || !VISIBLE(heap_find(r, want)))) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NOT_FOUND, "no heap named \"%s\"; `heapctl heaps` lists them", want);
        return;
    }
    size_t n = 0, nr = 0;
    for (hd_heap *h = r->heaps; h; h = h->next)
        if ((!want || !strcmp(h->name, want)) && VISIBLE(h)) {
            n++;
            nr += h->world_size;
        }
    Heapd__HeapStats *hs = calloc(n ? n : 1, sizeof *hs);
    Heapd__HeapStats **hsp = calloc(n ? n : 1, sizeof *hsp);
    Heapd__HeapParams *pp = calloc(n ? n : 1, sizeof *pp);
    Heapd__RankStats *rs = calloc(nr ? nr : 1, sizeof *rs);
    Heapd__RankStats **rsp = calloc(nr ? nr : 1, sizeof *rsp);
    Heapd__Histogram *hg = calloc(2 * (n ? n : 1), sizeof *hg);
    uint64_t(*hn)[HD_HIST_N] = calloc(2 * (n ? n : 1), sizeof *hn);
    if (!hs || !hsp || !pp || !rs || !rsp || !hg || !hn) {
        hd_conn_error(c, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "heapd is out of memory");
        goto out;
    }
    size_t i = 0, j = 0;
    for (hd_heap *h = r->heaps; h; h = h->next) {
        if ((want && strcmp(h->name, want)) || !VISIBLE(h))
            continue;
        ha_stats st;
        ha_get_stats(h->core, &st);
        Heapd__HeapStats *s = &hs[i];
        heapd__heap_stats__init(s);
        fill_params(h, &pp[i]);
        s->name = h->name;
        s->world_size = h->world_size;
        s->params = &pp[i];
        s->owner_uid = (uint32_t)h->owner;
        s->collect_wait = fill_hist(&hg[2 * i], hn[2 * i], &h->coll_wait);
        s->growth = fill_hist(&hg[2 * i + 1], hn[2 * i + 1], &h->growth);
        s->mapped = st.mapped;
        s->live_bytes = st.live_bytes;
        s->released_bytes = st.pending_bytes;
        s->free_bytes = st.free_bytes;
        s->collects = st.collects;
        s->collects_skipped = st.collects_skipped;
        s->growths = st.growths;
        s->clients = h->nattached;
        s->next_seq = h->decided;
        s->epoch = h->epoch;
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
        s->ranks = &rsp[j];
        s->n_ranks = 0;
        for (uint32_t q = 0; q < h->world_size; q++) {
            /* A multi-node heap lists the ranks served here. */
            if (h->local_size < h->world_size && !h->ranks[q].joined)
                continue;
            s->n_ranks++;
            heapd__rank_stats__init(&rs[j]);
            rsp[j] = &rs[j];
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
        hsp[i] = s;
        i++;
    }
    Heapd__StatsReply sr = HEAPD__STATS_REPLY__INIT;
    sr.n_heaps = n;
    sr.heaps = hsp;
    sr.backend = (char *)backend_name;
    sr.clients = clients;
    sr.version = (char *)HEAPD_VERSION;
    sr.uptime_ms = (uv_hrtime() - r->start_ns) / 1000000;
    sr.store = r->store ? (char *)hd_store_url(r->store) : (char *)"";
    sr.store_connected = r->store && hd_store_ready(r->store);
    sr.quota_heap = r->cfg.quota_heap;
    sr.quota_uid = r->cfg.quota_uid;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_STATS_REPLY;
    f.stats_reply = &sr;
    if (heapd__frame__get_packed_size(&f) > HW_FRAME_MAX - 1024) {
        /* Too many ranks to list in one frame: keep the per-heap figures. */
        for (size_t q = 0; q < n; q++)
            hs[q].n_ranks = 0;
    }
    hd_conn_send(c, &f, NULL, 0);
out:
    free(hs);
    free(hsp);
    free(pp);
    free(rs);
    free(rsp);
    free(hg);
    free(hn);
}
#undef VISIBLE
