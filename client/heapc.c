/* heapc.c - libheapc, the heapd client library. See heapc.h (the public API)
 * and docs/protocol.md (the contract with heapd). */
#include "heapc.h"
#include "heapc_map.h"
#include "heapc_cuda.h"
#include "heapc_fence.h"
#include "heapc_ring.h"
#include "ring.h"
#include "wire.h"
#include "status.h"
#include "heapd.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ERRSTR_LEN 512
#define FREE_BATCH_DEFAULT 1024u
#define FREE_BATCH_MAX 65536u   /* 65536 varints of <= 10 bytes: far below HW_FRAME_MAX */
#define ALLOC_MAX_ROUNDS 8      /* collect_needed answers tolerated for one allocation */

/* ---- live-offset set ------------------------------------------------------
 * Open addressing, linear probing, backward-shift deletion. Keys are block
 * offsets; EMPTY marks a free slot (no block starts at UINT64_MAX). */
#define EMPTY UINT64_MAX

typedef struct liveset {
    uint64_t *keys;
    size_t cap, n;   /* cap: power of two or 0 */
} liveset;

static size_t ls_hash(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

static int ls_find(const liveset *s, uint64_t k, size_t *slot)
{
    if (!s->cap)
        return 0;
    for (size_t i = ls_hash(k, s->cap);; i = (i + 1) & (s->cap - 1)) {
        if (s->keys[i] == EMPTY)
            return 0;
        if (s->keys[i] == k) {
            *slot = i;
            return 1;
        }
    }
}

static int ls_grow(liveset *s)
{
    size_t ncap = s->cap ? s->cap * 2 : 256;
    uint64_t *nk = malloc(ncap * sizeof *nk);
    if (!nk)
        return -1;
    for (size_t i = 0; i < ncap; i++)
        nk[i] = EMPTY;
    for (size_t i = 0; i < s->cap; i++) {
        if (s->keys[i] == EMPTY)
            continue;
        size_t j = ls_hash(s->keys[i], ncap);
        while (nk[j] != EMPTY)
            j = (j + 1) & (ncap - 1);
        nk[j] = s->keys[i];
    }
    free(s->keys);
    s->keys = nk;
    s->cap = ncap;
    return 0;
}

/* 1 inserted, 0 already there, -1 out of memory. */
static int ls_insert(liveset *s, uint64_t k)
{
    size_t slot;
    if (ls_find(s, k, &slot))
        return 0;
    if ((s->n + 1) * 4 > s->cap * 3 && ls_grow(s) != 0)
        return -1;
    size_t i = ls_hash(k, s->cap);
    while (s->keys[i] != EMPTY)
        i = (i + 1) & (s->cap - 1);
    s->keys[i] = k;
    s->n++;
    return 1;
}

static int ls_remove(liveset *s, uint64_t k)
{
    size_t i;
    if (!ls_find(s, k, &i))
        return 0;
    size_t mask = s->cap - 1;
    for (size_t j = (i + 1) & mask; s->keys[j] != EMPTY; j = (j + 1) & mask) {
        size_t h = ls_hash(s->keys[j], s->cap);
        /* Move j into the hole at i if j's home is not in (i, j]. */
        if (((j - h) & mask) >= ((j - i) & mask)) {
            s->keys[i] = s->keys[j];
            i = j;
        }
    }
    s->keys[i] = EMPTY;
    s->n--;
    return 1;
}

static void ls_clear(liveset *s)
{
    free(s->keys);
    memset(s, 0, sizeof *s);
}

/* ---- context ----------------------------------------------------------- */

/* Immutable while attached; published with the release store of c->view. */
typedef struct view {
    uint32_t rank, world;
    uint32_t nlocal;
    uint32_t *local;       /* ascending */
    char **bases;          /* [world]: base of rank q's copy, NULL when not local */
} view;

struct heapc {
    int err;
    char errstr[ERRSTR_LEN];

    pthread_mutex_t mu;
    int fd;                    /* -1 once the connection is gone */
    char dead_msg[ERRSTR_LEN]; /* why the connection is gone */
    hw_reader rd;
    uint64_t next_id;
    int timeout_ms;
    char *socket_path;
    char server[128];
    char backend[32];

    /* attach state */
    int attached;
    char *heap;
    heapc_params params;       /* effective; params.device_uuid -> uuid */
    char uuid[64];
    hm_kind kind;
    hm_space *spaces;          /* [nlocal], same order as view->local */
    int32_t *local_index;      /* [world]: index into spaces, -1 when not local */
    _Atomic(view *) view;
    _Atomic uint64_t mapped;
    uint64_t next_seq;
    int status_fd;
    _Atomic(const hs_page *) status_page; /* mapped read-only, or NULL */

    liveset live;
    int live_complete;         /* every live block of this rank is in `live` */
    uint64_t *fq;              /* queued frees */
    size_t fq_n, fq_cap, fq_batch;
    /* Stream-ordered frees (issue 18): blocks freed on a stream whose work
     * may not have completed; they join fq once it has (heapc_fence.h).
     * fence_on: the queue and its completion source exist. */
    int fence_on;
    hf_queue fence;

    heapc_sync_fn sync_fn;
    void *sync_arg;
    heapc_counters ctr;

    /* Issue 16: Alloc, Free and Collect go through ring when set
     * (heapc_ring.h); ring_want: HEAPC_TRANSPORT allows one. */
    hcr_ring *ring;
    int ring_want;
};

static int set_err(heapc *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int set_err(heapc *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errstr, sizeof c->errstr, fmt, ap);
    va_end(ap);
    c->err = code;
    return code;
}

static int ok(heapc *c)
{
    c->err = HEAPC_OK;
    c->errstr[0] = '\0';
    return HEAPC_OK;
}

const char *heapc_errname(int code)
{
    switch (code) {
    case HEAPC_OK: return "OK";
    case HEAPC_EPROTOCOL: return "ERR_PROTOCOL";
    case HEAPC_EVERSION: return "ERR_VERSION";
    case HEAPC_EINVAL: return "ERR_INVALID";
    case HEAPC_EMISMATCH: return "ERR_MISMATCH";
    case HEAPC_EASYMMETRY: return "ERR_ASYMMETRY";
    case HEAPC_ETIMEOUT: return "ERR_TIMEOUT";
    case HEAPC_EPEER_GONE: return "ERR_PEER_GONE";
    case HEAPC_ENOMEM: return "ERR_NO_MEMORY";
    case HEAPC_EVA_EXHAUSTED: return "ERR_VA_EXHAUSTED";
    case HEAPC_ENOTFOUND: return "ERR_NOT_FOUND";
    case HEAPC_ESTATE: return "ERR_STATE";
    case HEAPC_ENOTHELD: return "ERR_NOT_HELD";
    case HEAPC_EBACKEND: return "ERR_BACKEND";
    case HEAPC_EDENIED: return "ERR_DENIED";
    case HEAPC_ESHUTDOWN: return "ERR_SHUTDOWN";
    case HEAPC_ESTORE: return "ERR_STORE";
    case HEAPC_EQUOTA: return "ERR_QUOTA";
    case HEAPC_ECONN: return "ERR_CONN";
    case HEAPC_EMAP: return "ERR_MAP";
    case HEAPC_EOOM: return "ERR_OOM";
    case HEAPC_ENOREPLY: return "ERR_NOREPLY";
    case HEAPC_ESYNC: return "ERR_SYNC";
    case HEAPC_EBUSY: return "ERR_BUSY";
    default: return "ERR_UNKNOWN";
    }
}

const char *heapc_policy_name(heapc_policy p)
{
    switch (p) {
    case HEAPC_POLICY_DEFAULT: return "default";
    case HEAPC_POLICY_COALESCE: return "coalesce";
    case HEAPC_POLICY_SEED: return "seed";
    default: return "unknown";
    }
}

int heapc_err(const heapc *c)
{
    return c ? c->err : HEAPC_EOOM;
}

const char *heapc_errstr(const heapc *c)
{
    return c ? c->errstr : "out of memory allocating the heapc context";
}

const char *heapc_server(const heapc *c)
{
    return c ? c->server : "";
}

const char *heapc_backend(const heapc *c)
{
    return c ? c->backend : "";
}

/* ---- connection --------------------------------------------------------- */

static const char *body_name(Heapd__Frame__BodyCase b)
{
    switch (b) {
    case HEAPD__FRAME__BODY_HELLO: return "Hello";
    case HEAPD__FRAME__BODY_HELLO_REPLY: return "HelloReply";
    case HEAPD__FRAME__BODY_ATTACH: return "Attach";
    case HEAPD__FRAME__BODY_ATTACH_REPLY: return "AttachReply";
    case HEAPD__FRAME__BODY_ALLOC: return "Alloc";
    case HEAPD__FRAME__BODY_ALLOC_REPLY: return "AllocReply";
    case HEAPD__FRAME__BODY_FREE: return "Free";
    case HEAPD__FRAME__BODY_FREE_REPLY: return "FreeReply";
    case HEAPD__FRAME__BODY_COLLECT: return "Collect";
    case HEAPD__FRAME__BODY_COLLECT_REPLY: return "CollectReply";
    case HEAPD__FRAME__BODY_STATS: return "Stats";
    case HEAPD__FRAME__BODY_STATS_REPLY: return "StatsReply";
    case HEAPD__FRAME__BODY_FORCE_COLLECT: return "ForceCollect";
    case HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY: return "ForceCollectReply";
    case HEAPD__FRAME__BODY_DETACH: return "Detach";
    case HEAPD__FRAME__BODY_DETACH_REPLY: return "DetachReply";
    case HEAPD__FRAME__BODY_ERROR: return "Error";
    default: return "an empty frame";
    }
}

/* The connection is unusable: close it and remember why. Returns code. */
static int conn_dead(heapc *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int conn_dead(heapc *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->dead_msg, sizeof c->dead_msg, fmt, ap);
    va_end(ap);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    hcr_close(c->ring);
    c->ring = NULL;
    hw_reader_free(&c->rd);
    hw_reader_init(&c->rd);
    return set_err(c, code, "%s", c->dead_msg);
}

static int conn_closed_by_heapd(heapc *c, const char *when, const char *req)
{
    return conn_dead(c, HEAPC_ECONN,
                     "heapd closed the connection (socket %s) %s %s; check that heapd is running "
                     "(systemctl status heapd) and listens on %s, then connect again",
                     c->socket_path, when, req, c->socket_path);
}

static int map_daemon_code(int code)
{
    if (code >= 1 && code <= 99)
        return -code;
    return HEAPC_EPROTOCOL;
}

/*
 * Sends req (its id is set here) and waits for the reply with the same id.
 * On success *rep is the decoded reply with body `want` and *raw holds the
 * frame's fds (the caller frees both: heapd__frame__free_unpacked,
 * hw_frame_free). An Error reply keeps heapd's code and message.
 */
static int rpc(heapc *c, Heapd__Frame *req, Heapd__Frame__BodyCase want, Heapd__Frame **rep,
               hw_frame *raw)
{
    char werr[256];
    *rep = NULL;
    memset(raw, 0, sizeof *raw);
    if (c->fd < 0)
        return set_err(c, HEAPC_ECONN, "%s", c->dead_msg);

    req->id = ++c->next_id;
    size_t len = heapd__frame__get_packed_size(req);
    unsigned char stackbuf[512];
    unsigned char *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
    if (!buf)
        return set_err(c, HEAPC_EOOM, "out of memory encoding a %zu-byte %s request",
                       len, body_name(req->body_case));
    heapd__frame__pack(req, buf);
    hw_frame ringf = {0};
    int from_ring = 0, rc;
    if (c->ring && len <= hcr_payload_max(c->ring) &&
        (req->body_case == HEAPD__FRAME__BODY_ALLOC || req->body_case == HEAPD__FRAME__BODY_FREE ||
         req->body_case == HEAPD__FRAME__BODY_COLLECT)) {
        /* Issue 16: through the ring; an answer with fds comes on the socket. */
        rc = hcr_call(c->ring, c->fd, req->id, buf, len, c->timeout_ms, &ringf, werr, sizeof werr);
        if (buf != stackbuf)
            free(buf);
        if (rc == HCR_TIMEOUT)
            return conn_dead(c, HEAPC_ENOREPLY,
                             "no reply from heapd to %s within %d ms on the request ring; the connection "
                             "was closed because its state is unknown: connect and attach again",
                             body_name(req->body_case), c->timeout_ms);
        if (rc == HCR_EPROTO)
            return conn_dead(c, HEAPC_EPROTOCOL, "%s; the connection was closed: connect again", werr);
        from_ring = rc == HCR_REPLY;
        goto receive;
    }
    rc = hw_send_frame(c->fd, buf, len, NULL, 0, werr, sizeof werr);
    if (buf != stackbuf)
        free(buf);
    if (rc < 0) {
        if (rc == HW_ESYS && (errno == EPIPE || errno == ECONNRESET))
            return conn_closed_by_heapd(c, "while sending", body_name(req->body_case));
        if (rc == HW_ETOOBIG)
            return set_err(c, HEAPC_EINVAL, "the %s request is too large to send: %s",
                           body_name(req->body_case), werr);
        return conn_dead(c, HEAPC_ECONN, "sending %s to heapd failed: %s; connect again",
                         body_name(req->body_case), werr);
    }

receive:
    for (;;) {
        hw_frame f;
        if (from_ring) {
            f = ringf;
            from_ring = 0;
            rc = 0;
        } else
            rc = hw_recv_frame(c->fd, &c->rd, &f, c->timeout_ms, werr, sizeof werr);
        if (rc == HW_EOF || rc == HW_EPARTIAL ||
            (rc == HW_ESYS && (errno == ECONNRESET || errno == EPIPE)))
            return conn_closed_by_heapd(c, "before answering", body_name(req->body_case));
        if (rc == HW_ETIMEDOUT)
            return conn_dead(c, HEAPC_ENOREPLY,
                             "no reply from heapd to %s within %d ms; the connection was closed "
                             "because its state is unknown: connect and attach again",
                             body_name(req->body_case), c->timeout_ms);
        if (rc < 0)
            return conn_dead(c, HEAPC_ECONN,
                             "reading heapd's reply to %s failed: %s; the connection was closed: "
                             "connect again",
                             body_name(req->body_case), werr);
        Heapd__Frame *m = heapd__frame__unpack(NULL, f.len, f.data);
        if (!m) {
            hw_frame_free(&f);
            return conn_dead(c, HEAPC_EPROTOCOL,
                             "heapd's reply to %s is not a valid heapd.Frame; libheapc and heapd "
                             "do not speak the same protocol: check their versions",
                             body_name(req->body_case));
        }
        if (m->id == 0 && m->body_case == HEAPD__FRAME__BODY_ERROR && m->error) {
            /* Unsolicited: heapd says why it is closing the connection. */
            char why[512];
            snprintf(why, sizeof why, "%s", m->error->message ? m->error->message : "heapd closed the connection");
            int code = map_daemon_code((int)m->error->code);
            heapd__frame__free_unpacked(m, NULL);
            hw_frame_free(&f);
            return conn_dead(c, code, "%s (while waiting for the reply to %s)", why, body_name(req->body_case));
        }
        if (m->id != req->id) { /* a stale reply: not ours */
            heapd__frame__free_unpacked(m, NULL);
            hw_frame_free(&f);
            continue;
        }
        if (m->body_case == HEAPD__FRAME__BODY_ERROR && m->error) {
            int code = map_daemon_code((int)m->error->code);
            const char *msg = m->error->message ? m->error->message : "";
            if (!*msg)
                set_err(c, code, "heapd refused %s: %s", body_name(req->body_case),
                        heapc_errname(code));
            else
                set_err(c, code, "%s", msg);
            heapd__frame__free_unpacked(m, NULL);
            hw_frame_free(&f);
            if (code == HEAPC_EVERSION)
                conn_dead(c, code, "%s", c->errstr);
            return code;
        }
        if (m->body_case != want) {
            Heapd__Frame__BodyCase got = m->body_case;
            heapd__frame__free_unpacked(m, NULL);
            hw_frame_free(&f);
            return set_err(c, HEAPC_EPROTOCOL,
                           "heapd answered %s with %s instead of %s; libheapc and heapd do not "
                           "agree on the protocol: check their versions",
                           body_name(req->body_case), body_name(got), body_name(want));
        }
        *rep = m;
        *raw = f;
        return HEAPC_OK;
    }
}

static void rpc_done(Heapd__Frame *rep, hw_frame *raw)
{
    if (rep)
        heapd__frame__free_unpacked(rep, NULL);
    hw_frame_free(raw);
}

heapc *heapc_connect(const char *socket_path)
{
    return heapc_connect_timeout(socket_path, -1);
}

heapc *heapc_connect_timeout(const char *socket_path, int timeout_ms)
{
    heapc *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->fd = -1;
    c->status_fd = -1;
    c->timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
    c->fq_batch = FREE_BATCH_DEFAULT;
    hw_reader_init(&c->rd);
    atomic_init(&c->view, NULL);
    atomic_init(&c->mapped, 0);

    if (!socket_path || !*socket_path)
        socket_path = getenv("HEAPD_SOCKET");
    if (!socket_path || !*socket_path)
        socket_path = HEAPC_DEFAULT_SOCKET;
    c->socket_path = strdup(socket_path);
    if (!c->socket_path) {
        set_err(c, HEAPC_EOOM, "out of memory");
        return c;
    }
    snprintf(c->dead_msg, sizeof c->dead_msg, "not connected to heapd at %s", c->socket_path);

    char werr[320];
    int fd = hw_connect_unix(c->socket_path, werr, sizeof werr);
    if (fd < 0) {
        conn_dead(c, HEAPC_ECONN, "%s", werr);
        return c;
    }
    c->fd = fd;

    char who[96];
    snprintf(who, sizeof who, "%s[%ld] libheapc", program_invocation_short_name, (long)getpid());
    Heapd__Hello hello = HEAPD__HELLO__INIT;
    hello.version = HEAPC_PROTOCOL_VERSION;
    hello.client = who;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_HELLO;
    req.hello = &hello;
    Heapd__Frame *rep;
    hw_frame raw;
    if (rpc(c, &req, HEAPD__FRAME__BODY_HELLO_REPLY, &rep, &raw) != HEAPC_OK) {
        /* No session without a handshake: later calls report this too. */
        if (c->fd >= 0) {
            char msg[ERRSTR_LEN];
            snprintf(msg, sizeof msg, "%s", c->errstr);
            conn_dead(c, c->err, "heapd at %s refused the handshake: %s", c->socket_path, msg);
        }
        return c;
    }
    Heapd__HelloReply *hr = rep->hello_reply;
    if (!hr || hr->version != HEAPC_PROTOCOL_VERSION) {
        unsigned v = hr ? hr->version : 0;
        rpc_done(rep, &raw);
        conn_dead(c, HEAPC_EVERSION,
                  "heapd at %s speaks protocol version %u, libheapc speaks %u; install matching "
                  "versions of heapd and libheapc",
                  c->socket_path, v, HEAPC_PROTOCOL_VERSION);
        return c;
    }
    snprintf(c->server, sizeof c->server, "%s", hr->server ? hr->server : "");
    char twhy[128];
    c->ring_want = hcr_wanted(twhy, sizeof twhy);
    if (c->ring_want < 0) {
        rpc_done(rep, &raw);
        conn_dead(c, HEAPC_EINVAL, "%s", twhy);
        return c;
    }
    snprintf(c->backend, sizeof c->backend, "%s", hr->backend ? hr->backend : "");
    rpc_done(rep, &raw);
    ok(c);
    return c;
}

int heapc_set_timeout(heapc *c, int timeout_ms)
{
    pthread_mutex_lock(&c->mu);
    c->timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
    int rc = ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- mapping ------------------------------------------------------------ */

/* Unmaps everything and forgets the attach state (not the connection). */
static void teardown(heapc *c)
{
    if (c->fence_on) { /* before the spaces go: cuda events live in the heap's context */
        c->ctr.stream_markers += c->fence.markers;
        hf_queue_destroy(&c->fence);
    }
    c->fence_on = 0;
    view *v = atomic_exchange_explicit(&c->view, NULL, memory_order_acq_rel);
    atomic_store_explicit(&c->mapped, 0, memory_order_release);
    if (c->spaces) {
        uint32_t n = v ? v->nlocal : 0;
        for (uint32_t i = 0; i < n; i++)
            hm_unmap_all(&c->spaces[i]);
        free(c->spaces);
        c->spaces = NULL;
    }
    if (v) {
        free(v->local);
        free(v->bases);
        free(v);
    }
    free(c->local_index);
    c->local_index = NULL;
    free(c->heap);
    c->heap = NULL;
    const hs_page *sp = atomic_exchange(&c->status_page, NULL);
    if (sp)
        munmap((void *)sp, HS_PAGE_SIZE);
    if (c->status_fd >= 0)
        close(c->status_fd);
    c->status_fd = -1;
    ls_clear(&c->live);
    free(c->fq);
    c->fq = NULL;
    c->fq_n = c->fq_cap = 0;
    c->attached = 0;
    c->next_seq = 0;
    memset(&c->params, 0, sizeof c->params);
    c->uuid[0] = '\0';
}

/* Maps every chunk in refs (fds from raw). Chunks already mapped are skipped. */
static int map_chunks(heapc *c, const view *v, Heapd__ChunkRef **refs, size_t n,
                      const hw_frame *raw)
{
    char merr[320];
    for (size_t i = 0; i < n; i++) {
        const Heapd__ChunkRef *r = refs[i];
        if (r->rank >= v->world || c->local_index[r->rank] < 0)
            return set_err(c, HEAPC_EPROTOCOL,
                           "heapd sent a chunk of rank %" PRIu32 ", which is not a local rank "
                           "of this heap (world size %" PRIu32 ")",
                           r->rank, v->world);
        if (r->fd_index >= raw->nfds)
            return set_err(c, HEAPC_EPROTOCOL,
                           "heapd sent chunk %" PRIu32 " of rank %" PRIu32 " with fd index %" PRIu32
                           " but only %zu fds",
                           r->index, r->rank, r->fd_index, raw->nfds);
        hm_space *s = &c->spaces[c->local_index[r->rank]];
        if (hm_is_mapped(s, r->index))
            continue;
        int rc = hm_map_chunk(s, r->index, raw->fds[r->fd_index], merr, sizeof merr);
        if (rc != HM_OK)
            return set_err(c, rc == HM_ENOMEM ? HEAPC_EOOM : HEAPC_EMAP,
                           "mapping chunk %" PRIu32 " of rank %" PRIu32 " of heap %s failed: %s",
                           r->index, r->rank, c->heap, merr);
        c->ctr.chunks_mapped++;
    }
    return HEAPC_OK;
}

/* Publishes the extent every local rank has mapped without a hole, up to
 * `mapped` (what heapd reports). strict: every chunk below `mapped` must be
 * there (attach, whose reply carries every chunk). */
static int publish_extent(heapc *c, const view *v, uint64_t mapped, int strict)
{
    uint64_t cs = c->params.chunk_size;
    uint64_t want = mapped / cs + (mapped % cs != 0);
    uint64_t have = atomic_load_explicit(&c->mapped, memory_order_relaxed) / cs;
    for (uint32_t i = 0; i < v->nlocal; i++) {
        const hm_space *s = &c->spaces[i];
        if (want > s->nchunks)
            return set_err(c, HEAPC_EPROTOCOL,
                           "heapd reports heap %s mapped to %" PRIu64 " bytes, beyond its va_size "
                           "%" PRIu64 "; report this heapd bug",
                           c->heap, mapped, c->params.va_size);
    }
    uint64_t n = have;
    while (n < want) {
        uint32_t i;
        for (i = 0; i < v->nlocal && hm_is_mapped(&c->spaces[i], (uint32_t)n); i++)
            ;
        if (i < v->nlocal) {
            if (strict)
                return set_err(c, HEAPC_EPROTOCOL,
                               "heapd reports heap %s mapped to %" PRIu64 " bytes but never sent "
                               "chunk %" PRIu64 " of rank %" PRIu32 "; report this heapd bug",
                               c->heap, mapped, n, v->local[i]);
            break;
        }
        n++;
    }
    uint64_t ext = n * cs < mapped ? n * cs : mapped;
    if (ext > atomic_load_explicit(&c->mapped, memory_order_relaxed))
        atomic_store_explicit(&c->mapped, ext, memory_order_release);
    return HEAPC_OK;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- device sync -------------------------------------------------------- */

/* The user's sync hook before a collect (heapc_set_device_sync). Without
 * one there is no device sync at all (issue 18): blocks freed on a stream
 * wait for their own stream's work (heapc_fence.h). */
static int device_sync(heapc *c)
{
    if (!c->sync_fn)
        return HEAPC_OK;
    int rc = c->sync_fn(c->sync_arg);
    if (rc != 0)
        return set_err(c, HEAPC_ESYNC,
                       "the device-sync hook returned %d before a collect on heap %s; the collect "
                       "was not started: fix the device error, then call heapc_collect again",
                       rc, c->heap ? c->heap : "?");
    return HEAPC_OK;
}

int heapc_set_device_sync(heapc *c, heapc_sync_fn fn, void *arg)
{
    pthread_mutex_lock(&c->mu);
    c->sync_fn = fn;
    c->sync_arg = arg;
    int rc = ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- attach / detach ---------------------------------------------------- */

hcr_ring *hcr_of(heapc *c) { return c->ring; }

/* Issue 16: a request ring for this connection, unless HEAPC_TRANSPORT=socket
 * or heapd offers none (ring = off, an older heapd): then the socket carries
 * everything, as before. */
static void ring_setup(heapc *c, uint32_t nlocal)
{
    if (c->ring || !c->ring_want || c->fd < 0)
        return;
    Heapd__RingSetup rs = HEAPD__RING_SETUP__INIT;
    rs.version = HR_VERSION;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_RING_SETUP;
    req.ring_setup = &rs;
    Heapd__Frame *rep;
    hw_frame raw;
    if (rpc(c, &req, HEAPD__FRAME__BODY_RING_SETUP_REPLY, &rep, &raw) != HEAPC_OK) {
        c->ring_want = 0;
        return;
    }
    Heapd__RingSetupReply *r = rep->ring_setup_reply;
    char why[256];
    if (r && r->version == HR_VERSION && raw.nfds == 2) {
        c->ring = hcr_open(raw.fds[0], raw.fds[1], r->nslots, r->slot_size, nlocal, why, sizeof why);
        raw.fds[0] = raw.fds[1] = -1;
    }
    if (!c->ring)
        c->ring_want = 0;
    rpc_done(rep, &raw);
}

static int attach_locked(heapc *c, const char *heap, uint32_t rank, uint32_t world,
                         const heapc_params *p)
{
    if (c->attached)
        return set_err(c, HEAPC_ESTATE,
                       "this context is already attached to heap %s as rank %" PRIu32
                       "; detach first or use another context",
                       c->heap, atomic_load(&c->view)->rank);
    if (!heap || !*heap)
        return set_err(c, HEAPC_EINVAL, "heapc_attach: the heap name is empty; name the heap");
    if (world == 0 || rank >= world)
        return set_err(c, HEAPC_EINVAL,
                       "heapc_attach: rank %" PRIu32 " is not below world size %" PRIu32, rank,
                       world);
    if (c->fd < 0)
        return set_err(c, HEAPC_ECONN, "%s", c->dead_msg);

    char merr[320];
    /* The device: cuda needs this rank's GPU by UUID. */
    char uuid[64] = "";
    int ordinal = 0;
    int cuda = strcmp(c->backend, "cuda") == 0;
    if (cuda) {
        if (p && p->device_uuid && *p->device_uuid) {
            snprintf(uuid, sizeof uuid, "%s", p->device_uuid);
            if (hm_cuda_device_by_uuid(uuid, &ordinal, merr, sizeof merr) != HM_OK)
                return set_err(c, HEAPC_EMAP, "heapc_attach: %s", merr);
        } else {
            if (hm_cuda_current_device(&ordinal, merr, sizeof merr) != HM_OK)
                ordinal = 0;
            if (hm_cuda_device_uuid(ordinal, uuid, sizeof uuid, merr, sizeof merr) != HM_OK)
                return set_err(c, HEAPC_EMAP,
                               "heapc_attach: cannot name this rank's GPU (device %d) to heapd: "
                               "%s",
                               ordinal, merr);
        }
    }

    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    if (p) {
        hp.chunk_size = p->chunk_size;
        hp.initial_size = p->initial_size;
        hp.va_size = p->va_size;
        hp.min_block = p->min_block;
        hp.policy = (Heapd__Policy)p->policy;
        hp.collect_timeout_ms = p->collect_timeout_ms;
    }
    Heapd__Attach at = HEAPD__ATTACH__INIT;
    at.heap = (char *)heap;
    at.rank = rank;
    at.world_size = world;
    at.params = &hp;
    at.device_uuid = uuid;
    if (p) {
        at.local_size = p->local_size;
        at.job = (char *)(p->job ? p->job : "");
    }
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_ATTACH;
    req.attach = &at;
    Heapd__Frame *rep;
    hw_frame raw;
    int rc = rpc(c, &req, HEAPD__FRAME__BODY_ATTACH_REPLY, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__AttachReply *ar = rep->attach_reply;
    view *v = NULL;

    /* Validate what heapd sent before touching the address space. */
    if (!ar || !ar->params || ar->params->chunk_size == 0 || ar->params->va_size == 0) {
        rc = set_err(c, HEAPC_EPROTOCOL,
                     "heapd's AttachReply for heap %s has no chunk_size or va_size", heap);
        goto fail;
    }
    if (ar->world_size != world) {
        rc = set_err(c, HEAPC_EPROTOCOL,
                     "heapd's AttachReply for heap %s says world size %" PRIu32 ", asked %" PRIu32,
                     heap, ar->world_size, world);
        goto fail;
    }
    const char *backend = ar->backend && *ar->backend ? ar->backend : c->backend;
    if (strcmp(backend, "host") == 0) {
        c->kind = HM_HOST;
    } else if (strcmp(backend, "cuda") == 0) {
        c->kind = HM_CUDA;
    } else {
        rc = set_err(c, HEAPC_EPROTOCOL,
                     "heapd serves heap %s from backend \"%s\", which libheapc cannot map "
                     "(it knows host and cuda); upgrade libheapc",
                     heap, backend);
        goto fail;
    }

    c->heap = strdup(heap);
    v = calloc(1, sizeof *v);
    c->local_index = malloc((size_t)world * sizeof *c->local_index);
    if (v) {
        v->bases = calloc(world, sizeof *v->bases);
        v->local = malloc((ar->n_local_ranks + 1) * sizeof *v->local);
    }
    if (!c->heap || !v || !v->bases || !v->local || !c->local_index) {
        rc = set_err(c, HEAPC_EOOM, "out of memory attaching heap %s", heap);
        goto fail;
    }
    v->rank = rank;
    v->world = world;
    for (uint32_t q = 0; q < world; q++)
        c->local_index[q] = -1;
    /* Local ranks: heapd's list, self included, sorted, no duplicates. */
    int self_seen = 0;
    for (size_t i = 0; i < ar->n_local_ranks; i++) {
        uint32_t q = ar->local_ranks[i];
        if (q >= world) {
            rc = set_err(c, HEAPC_EPROTOCOL,
                         "heapd lists local rank %" PRIu32 " of heap %s, beyond world size %" PRIu32,
                         q, heap, world);
            goto fail;
        }
        if (c->local_index[q] >= 0)
            continue;
        c->local_index[q] = 0;
        v->local[v->nlocal++] = q;
        self_seen |= q == rank;
    }
    if (!self_seen) {
        c->local_index[rank] = 0;
        v->local[v->nlocal++] = rank;
    }
    qsort(v->local, v->nlocal, sizeof *v->local, cmp_u32);
    for (uint32_t i = 0; i < v->nlocal; i++)
        c->local_index[v->local[i]] = (int32_t)i;

    c->params.chunk_size = ar->params->chunk_size;
    c->params.initial_size = ar->params->initial_size;
    c->params.va_size = ar->params->va_size;
    c->params.min_block = ar->params->min_block;
    c->params.policy = (heapc_policy)ar->params->policy;
    c->params.collect_timeout_ms = ar->params->collect_timeout_ms;
    snprintf(c->uuid, sizeof c->uuid, "%s", uuid);
    c->params.device_uuid = c->uuid;

    c->spaces = calloc(v->nlocal, sizeof *c->spaces);
    if (!c->spaces) {
        rc = set_err(c, HEAPC_EOOM, "out of memory attaching heap %s", heap);
        goto fail;
    }
    for (uint32_t i = 0; i < v->nlocal; i++) {
        int mr = hm_reserve(c->kind, c->params.va_size, c->params.chunk_size, &c->spaces[i], merr,
                            sizeof merr);
        if (mr == HM_OK && c->kind == HM_CUDA)
            mr = hm_set_cuda_device(&c->spaces[i], ordinal, merr, sizeof merr);
        if (mr != HM_OK) {
            rc = set_err(c, mr == HM_ENOMEM ? HEAPC_EOOM : HEAPC_EMAP,
                         "reserving %" PRIu64 " bytes of address space for rank %" PRIu32
                         " of heap %s failed: %s",
                         c->params.va_size, v->local[i], heap, merr);
            goto fail;
        }
        v->bases[v->local[i]] = hm_base(&c->spaces[i]);
    }
    memset(&c->ctr, 0, sizeof c->ctr);
    rc = map_chunks(c, v, ar->chunks, ar->n_chunks, &raw);
    if (rc != HEAPC_OK)
        goto fail;
    /* The status page stays open for libheapc_nccl; every other fd is closed
     * by rpc_done (heapc_map.h: hm_map_chunk never takes the fd). */
    if (ar->status_fd_index >= 0 && (size_t)ar->status_fd_index < raw.nfds) {
        c->status_fd = raw.fds[ar->status_fd_index];
        raw.fds[ar->status_fd_index] = -1;
        void *pg = mmap(NULL, HS_PAGE_SIZE, PROT_READ, MAP_SHARED, c->status_fd, 0);
        if (pg != MAP_FAILED && ((const hs_page *)pg)->magic == HS_MAGIC &&
            ((const hs_page *)pg)->version == HS_VERSION)
            atomic_store_explicit(&c->status_page, (const hs_page *)pg, memory_order_release);
        else if (pg != MAP_FAILED)
            munmap(pg, HS_PAGE_SIZE);
    }
    /* Publish: the view first, then the extent (it checks the chunks). */
    c->next_seq = ar->next_seq;
    c->live_complete = ar->next_seq == 0;
    c->attached = 1;
    atomic_store_explicit(&c->view, v, memory_order_release);
    rc = publish_extent(c, v, ar->mapped, 1);
    if (rc != HEAPC_OK) {
        v = NULL; /* owned by c->view now: teardown frees it */
        goto fail;
    }
    rpc_done(rep, &raw);
    ring_setup(c, v->nlocal);
    return ok(c);

fail:
    rpc_done(rep, &raw);
    if (v && atomic_load(&c->view) != v) {
        /* Not published: teardown would not find it. */
        if (c->spaces) {
            for (uint32_t i = 0; i < v->nlocal; i++)
                hm_unmap_all(&c->spaces[i]);
            free(c->spaces);
            c->spaces = NULL;
        }
        free(v->local);
        free(v->bases);
        free(v);
    }
    int keep = c->err;
    char msg[ERRSTR_LEN];
    memcpy(msg, c->errstr, sizeof msg);
    teardown(c);
    /* heapd attached us; we cannot use the heap: leave it so the rank is free. */
    if (c->fd >= 0) {
        Heapd__Detach d = HEAPD__DETACH__INIT;
        Heapd__Frame dreq = HEAPD__FRAME__INIT;
        dreq.body_case = HEAPD__FRAME__BODY_DETACH;
        dreq.detach = &d;
        Heapd__Frame *drep;
        hw_frame draw;
        if (rpc(c, &dreq, HEAPD__FRAME__BODY_DETACH_REPLY, &drep, &draw) == HEAPC_OK)
            rpc_done(drep, &draw);
    }
    c->err = keep;
    memcpy(c->errstr, msg, sizeof msg);
    return keep;
}

int heapc_attach(heapc *c, const char *heap, uint32_t rank, uint32_t world_size,
                 const heapc_params *params)
{
    pthread_mutex_lock(&c->mu);
    int rc = attach_locked(c, heap, rank, world_size, params);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- attach from the launcher's environment ------------------------------ */

/* An unsigned decimal variable into *out; 0 when set and valid, else an
 * error naming it. */
static int env_u32(heapc *c, const char *launcher, const char *name, uint32_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return set_err(c, HEAPC_EINVAL,
                       "heapc_attach_env: %s is not set, but the other %s variables are: "
                       "start the job with %s, or set %s", name, launcher,
                       launcher[0] == 't' ? "torchrun" : "srun", name);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || x > UINT32_MAX || v[0] == '-')
        return set_err(c, HEAPC_EINVAL, "heapc_attach_env: %s=\"%s\" is not a rank count or "
                       "rank number (want a decimal integer below 2^32)", name, v);
    *out = (uint32_t)x;
    return 0;
}

/* Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of 3 nodes, then
 * 1) at node `node`; 0 when the list does not reach it. */
static uint32_t slurm_tasks_on_node(const char *list, uint32_t node)
{
    const char *p = list;
    uint64_t at = 0;
    while (*p) {
        char *end;
        unsigned long n = strtoul(p, &end, 10), rep = 1;
        if (end == p)
            return 0;
        p = end;
        if (p[0] == '(' && p[1] == 'x') {
            rep = strtoul(p + 2, &end, 10);
            if (end == p + 2 || *end != ')')
                return 0;
            p = end + 1;
        }
        if (node < at + rep)
            return (uint32_t)n;
        at += rep;
        if (*p == ',')
            p++;
        else if (*p)
            return 0;
    }
    return 0;
}

int heapc_attach_env(heapc *c, const char *heap, const heapc_params *params)
{
    if (!c)
        return HEAPC_EINVAL;
    heapc_params p;
    if (params)
        p = *params;
    else
        memset(&p, 0, sizeof p);
    uint32_t rank, world, local = 0;
    char job[128] = "", name[192];
    const char *launcher;
    int rc;
    pthread_mutex_lock(&c->mu);
    if (getenv("RANK") && *getenv("RANK")) {
        launcher = "torchrun";
        if ((rc = env_u32(c, launcher, "RANK", &rank)) || (rc = env_u32(c, launcher, "WORLD_SIZE", &world)) ||
            (rc = env_u32(c, launcher, "LOCAL_WORLD_SIZE", &local)))
            goto out;
        const char *id = getenv("TORCHELASTIC_RUN_ID");
        snprintf(job, sizeof job, "%s", id && *id ? id : "none");
        snprintf(name, sizeof name, "torch-%s", job);
    } else if (getenv("SLURM_PROCID") && *getenv("SLURM_PROCID")) {
        launcher = "Slurm";
        if ((rc = env_u32(c, launcher, "SLURM_PROCID", &rank)) ||
            (rc = env_u32(c, launcher, "SLURM_NTASKS", &world)))
            goto out;
        const char *tpn = getenv("SLURM_NTASKS_PER_NODE");
        if (tpn && *tpn) {
            if ((rc = env_u32(c, launcher, "SLURM_NTASKS_PER_NODE", &local)))
                goto out;
        } else {
            const char *list = getenv("SLURM_TASKS_PER_NODE");
            uint32_t node;
            if ((rc = env_u32(c, launcher, "SLURM_NODEID", &node)))
                goto out;
            if (!list || !(local = slurm_tasks_on_node(list, node))) {
                rc = set_err(c, HEAPC_EINVAL, "heapc_attach_env: cannot tell how many Slurm tasks "
                             "run on node %" PRIu32 ": SLURM_NTASKS_PER_NODE is not set and "
                             "SLURM_TASKS_PER_NODE=\"%s\" does not say; set SLURM_NTASKS_PER_NODE",
                             node, list ? list : "(unset)");
                goto out;
            }
        }
        const char *id = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
        if (!id || !*id) {
            rc = set_err(c, HEAPC_EINVAL, "heapc_attach_env: SLURM_JOB_ID is not set, but "
                         "SLURM_PROCID is: start the job with srun, or set SLURM_JOB_ID");
            goto out;
        }
        snprintf(job, sizeof job, "%s.%s", id, step && *step ? step : "0");
        snprintf(name, sizeof name, "slurm-%s", job);
    } else {
        rc = set_err(c, HEAPC_EINVAL, "heapc_attach_env: no launcher environment: RANK "
                     "(torchrun: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID) and "
                     "SLURM_PROCID (srun: SLURM_PROCID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, "
                     "SLURM_JOB_ID) are both unset; start the job with torchrun or srun, or "
                     "call heapc_attach with the rank and world size");
        goto out;
    }
    if (world == 0 || rank >= world) {
        rc = set_err(c, HEAPC_EINVAL, "heapc_attach_env: %s rank %" PRIu32 " is not below its "
                     "world size %" PRIu32, launcher, rank, world);
        goto out;
    }
    if (local == 0 || local > world) {
        rc = set_err(c, HEAPC_EINVAL, "heapc_attach_env: %s says %" PRIu32 " rank(s) on this node "
                     "of a world of %" PRIu32 "; want 1 to the world size", launcher, local, world);
        goto out;
    }
    if (p.local_size == 0 && local < world)
        p.local_size = local;
    if (!p.job || !*p.job)
        p.job = job;
    if (!heap || !*heap) {
        const char *h = getenv("HEAPD_HEAP");
        heap = h && *h ? h : name;
    }
    rc = attach_locked(c, heap, rank, world, &p);
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_get_params(heapc *c, heapc_params *out)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached) {
        rc = set_err(c, HEAPC_ESTATE, "heapc_get_params: not attached to a heap; call heapc_attach");
    } else {
        *out = c->params;
        rc = ok(c);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- frees -------------------------------------------------------------- */

static int flush_locked(heapc *c)
{
    while (c->fq_n > 0) {
        size_t n = c->fq_n < FREE_BATCH_MAX ? c->fq_n : FREE_BATCH_MAX;
        Heapd__Free fr = HEAPD__FREE__INIT;
        fr.n_offsets = n;
        fr.offsets = c->fq;
        Heapd__Frame req = HEAPD__FRAME__INIT;
        req.body_case = HEAPD__FRAME__BODY_FREE;
        req.free = &fr;
        Heapd__Frame *rep;
        hw_frame raw;
        int rc = rpc(c, &req, HEAPD__FRAME__BODY_FREE_REPLY, &rep, &raw);
        if (rc != HEAPC_OK) {
            if (rc != HEAPC_ECONN && rc != HEAPC_ENOREPLY) {
                /* heapd applied none of the batch (docs/protocol.md: Free): drop
                 * it, else every later flush fails the same way. */
                memmove(c->fq, c->fq + n, (c->fq_n - n) * sizeof *c->fq);
                c->fq_n -= n;
                char msg[ERRSTR_LEN];
                snprintf(msg, sizeof msg, "%s", c->errstr);
                set_err(c, rc, "%s (heapd refused a batch of %zu frees; they were dropped)", msg,
                        n);
            }
            return rc;
        }
        rpc_done(rep, &raw);
        memmove(c->fq, c->fq + n, (c->fq_n - n) * sizeof *c->fq);
        c->fq_n -= n;
        c->ctr.free_batches++;
    }
    return HEAPC_OK;
}

/* Appends offsets to the free queue (all or none). */
static int fq_push(heapc *c, const uint64_t *offs, size_t n)
{
    if (c->fq_n + n > c->fq_cap) {
        size_t ncap = c->fq_cap ? c->fq_cap : 256;
        while (ncap < c->fq_n + n)
            ncap *= 2;
        uint64_t *nq = realloc(c->fq, ncap * sizeof *nq);
        if (!nq)
            return set_err(c, HEAPC_EOOM, "out of memory queueing %zu frees", n);
        c->fq = nq;
        c->fq_cap = ncap;
    }
    memcpy(c->fq + c->fq_n, offs, n * sizeof *offs);
    c->fq_n += n;
    return HEAPC_OK;
}

static int fence_emit(void *data, const uint64_t *offs, size_t n)
{
    return fq_push(data, offs, n);
}

/* The completion source of this context's backend, made on first use. */
static int fence_start(heapc *c)
{
    if (c->fence_on)
        return HEAPC_OK;
    hf_source src;
    if (c->kind == HM_CUDA) {
        view *v = atomic_load(&c->view);
        void *ctx = v && c->local_index && c->local_index[v->rank] >= 0
                        ? c->spaces[c->local_index[v->rank]].ctx
                        : NULL;
        char merr[320];
        if (hf_cuda_source(&src, ctx, merr, sizeof merr) != 0)
            return set_err(c, HEAPC_EBACKEND, "stream-ordered free on heap %s: %s", c->heap, merr);
    } else {
        hf_host_source(&src);
    }
    hf_queue_init(&c->fence, src, c->fq_batch);
    c->fence_on = 1;
    return HEAPC_OK;
}

static int fence_fail(heapc *c, int frc, const char *what, const char *merr)
{
    if (frc == HF_ENOMEM)
        return set_err(c, HEAPC_EOOM, "%s on heap %s: %s", what, c->heap, merr);
    if (frc == HF_EDEVICE)
        return set_err(c, HEAPC_EBACKEND, "%s on heap %s: %s", what, c->heap, merr);
    return frc; /* fq_push's error, already set */
}

/* Closes the open group (its marker) when asked and moves every group whose
 * stream work completed to the free queue. Never waits for device work
 * (poll: flush and collect time, a just-recorded marker gets a grace of at
 * most HF_FRESH_POLL_NS); with no stream-ordered free pending it does nothing
 * device-related. */
static int fence_reap(heapc *c, int close, int poll)
{
    if (!c->fence_on || c->fence.waiting == 0)
        return HEAPC_OK;
    char merr[320] = "";
    int frc = close ? hf_queue_close(&c->fence, merr, sizeof merr) : HF_OK;
    if (frc == HF_OK)
        frc = hf_queue_reap(&c->fence, poll, fence_emit, c, merr, sizeof merr);
    return frc == HF_OK ? HEAPC_OK : fence_fail(c, frc, "checking freed blocks' streams", merr);
}

/* Detach: the caller promised no device work still touches the heap, so
 * every waiting block goes to the free queue without a query. */
static int fence_drain_all(heapc *c)
{
    if (!c->fence_on)
        return HEAPC_OK;
    hf_queue *q = &c->fence;
    int rc = q->open.n ? fq_push(c, q->open.offs, q->open.n) : HEAPC_OK;
    for (size_t i = 0; rc == HEAPC_OK && i < q->nclosed; i++)
        rc = fq_push(c, q->closed[i].offs, q->closed[i].n);
    c->ctr.stream_markers += q->markers;
    hf_queue_destroy(q);
    c->fence_on = 0;
    return rc;
}

static int free_locked(heapc *c, uint64_t offset, void *stream, int on_stream)
{
    if (!c->attached)
        return set_err(c, HEAPC_ESTATE, "heapc_free: not attached to a heap; call heapc_attach");
    /* The host backend's plain free has no stream to wait for: straight to
     * the free queue, as before issue 18. */
    if (!stream && c->kind != HM_CUDA)
        on_stream = 0;
    if (on_stream) {
        int rc = fence_start(c);
        if (rc != HEAPC_OK)
            return rc;
    }
    int known = ls_remove(&c->live, offset);
    if (!known && c->live_complete)
        return set_err(c, HEAPC_ENOTHELD,
                       "heapc_free: offset %" PRIu64 " (0x%" PRIx64 ") is not a block rank %" PRIu32
                       " holds in heap %s: it was already freed or never allocated here; free "
                       "each offset heapc_alloc returned exactly once",
                       offset, offset, atomic_load(&c->view)->rank, c->heap);
    if (!known) {
        /* Not allocated through this attach (the rank re-attached): only heapd
         * knows whether the rank holds it. Send it alone, now, so that heapd's
         * verdict is about this offset and comes back from this call. */
        Heapd__Free fr = HEAPD__FREE__INIT;
        fr.n_offsets = 1;
        fr.offsets = &offset;
        Heapd__Frame req = HEAPD__FRAME__INIT;
        req.body_case = HEAPD__FRAME__BODY_FREE;
        req.free = &fr;
        Heapd__Frame *rep;
        hw_frame raw;
        int rc = rpc(c, &req, HEAPD__FRAME__BODY_FREE_REPLY, &rep, &raw);
        if (rc != HEAPC_OK)
            return rc;
        rpc_done(rep, &raw);
        c->ctr.frees++;
        c->ctr.free_batches++;
        return ok(c);
    }
    if (on_stream) {
        char merr[320] = "";
        uint64_t markers = c->fence.markers;
        int frc = hf_queue_add(&c->fence, stream, offset, merr, sizeof merr);
        if (frc != HF_OK) {
            ls_insert(&c->live, offset);
            return fence_fail(c, frc, "heapc_free_async", merr);
        }
        c->ctr.frees++;
        if (c->fence.markers != markers) { /* a group closed: see what completed */
            int rc = fence_reap(c, 0, 0);
            if (rc != HEAPC_OK)
                return rc;
        }
    } else {
        if (fq_push(c, &offset, 1) != HEAPC_OK) {
            ls_insert(&c->live, offset);
            return set_err(c, HEAPC_EOOM, "heapc_free: out of memory queueing offset %" PRIu64,
                           offset);
        }
        c->ctr.frees++;
    }
    if (c->fq_n >= c->fq_batch) {
        int rc = flush_locked(c);
        if (rc != HEAPC_OK)
            return rc;
    }
    return ok(c);
}

int heapc_free(heapc *c, uint64_t offset)
{
    pthread_mutex_lock(&c->mu);
    int rc = free_locked(c, offset, NULL, 1);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_free_async(heapc *c, uint64_t offset, void *stream)
{
    pthread_mutex_lock(&c->mu);
    int rc = free_locked(c, offset, stream, 1);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_free_ptr(heapc *c, void *ptr)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    uint64_t m = atomic_load_explicit(&c->mapped, memory_order_acquire);
    if (!c->attached || !v) {
        rc = set_err(c, HEAPC_ESTATE, "heapc_free_ptr: not attached to a heap; call heapc_attach");
    } else {
        uintptr_t base = (uintptr_t)v->bases[v->rank], p = (uintptr_t)ptr;
        if (p < base || p - base >= m)
            rc = set_err(c, HEAPC_EINVAL,
                         "heapc_free_ptr: %p is not in this rank's copy of heap %s "
                         "[%p, +%" PRIu64 "); pass a pointer heapc_alloc returned",
                         ptr, c->heap, (void *)base, m);
        else
            rc = free_locked(c, (uint64_t)(p - base), NULL, 1);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_set_free_batch(heapc *c, size_t n)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (n == 0 || n > FREE_BATCH_MAX) {
        rc = set_err(c, HEAPC_EINVAL, "heapc_set_free_batch: %zu is not in 1..%u", n,
                     FREE_BATCH_MAX);
    } else {
        c->fq_batch = n;
        if (c->fence_on)
            c->fence.batch = n;
        rc = c->fq_n >= n && c->attached ? flush_locked(c) : HEAPC_OK;
        if (rc == HEAPC_OK)
            ok(c);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_flush(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached)
        rc = set_err(c, HEAPC_ESTATE, "heapc_flush: not attached to a heap; call heapc_attach");
    else if ((rc = fence_reap(c, 1, 1)) == HEAPC_OK && (rc = flush_locked(c)) == HEAPC_OK)
        ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- collect ------------------------------------------------------------ */

static int collect_locked(heapc *c)
{
    /* Issue 18: no device-wide wait by default. Blocks freed on a stream go
     * to heapd only once their stream's work completed (an event query, no
     * wait); the others wait for a later flush or collect. With a sync hook
     * the markers are recorded first, so that the hook's sync completes
     * them. */
    int rc = HEAPC_OK;
    if (c->fence_on && c->fence.open.n) {
        char merr[320] = "";
        int frc = hf_queue_close(&c->fence, merr, sizeof merr);
        if (frc != HF_OK)
            return fence_fail(c, frc, "closing the frees' group before a collect", merr);
    }
    if (c->sync_fn) {
        rc = device_sync(c);
        if (rc != HEAPC_OK)
            return rc;
    } else if (c->kind == HM_CUDA || (c->fence_on && c->fence.waiting)) {
        c->ctr.device_waits_avoided++;
    }
    rc = fence_reap(c, 0, 1);
    if (rc != HEAPC_OK)
        return rc;
    rc = flush_locked(c);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__Collect co = HEAPD__COLLECT__INIT;
    co.seq = c->next_seq;
    co.stream_waiting = c->fence_on ? c->fence.waiting : 0;
    co.device_waits_avoided = c->ctr.device_waits_avoided;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_COLLECT;
    req.collect = &co;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = rpc(c, &req, HEAPD__FRAME__BODY_COLLECT_REPLY, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    if (rep->collect_reply) {
        c->ctr.heap_collects = rep->collect_reply->collects;
        c->ctr.last_reclaimed_blocks = rep->collect_reply->reclaimed_blocks;
        c->ctr.last_reclaimed_bytes = rep->collect_reply->reclaimed_bytes;
    }
    c->ctr.collects++;
    rpc_done(rep, &raw);
    return HEAPC_OK;
}

int heapc_collect(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached)
        rc = set_err(c, HEAPC_ESTATE, "heapc_collect: not attached to a heap; call heapc_attach");
    else if ((rc = collect_locked(c)) == HEAPC_OK)
        ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- alloc -------------------------------------------------------------- */

static int alloc_locked(heapc *c, size_t size, void **ptr, uint64_t *offset)
{
    if (!c->attached)
        return set_err(c, HEAPC_ESTATE, "heapc_alloc: not attached to a heap; call heapc_attach");
    if (size == 0)
        return set_err(c, HEAPC_EINVAL, "heapc_alloc: size 0; ask for at least one byte");
    view *v = atomic_load_explicit(&c->view, memory_order_relaxed);
    for (int round = 0;; round++) {
        if (round >= ALLOC_MAX_ROUNDS)
            return set_err(c, HEAPC_EPROTOCOL,
                           "heapd answered collect_needed %d times in a row to allocation %" PRIu64
                           " of heap %s; report this heapd bug",
                           round, c->next_seq, c->heap);
        Heapd__Alloc al = HEAPD__ALLOC__INIT;
        al.seq = c->next_seq;
        al.size = size;
        Heapd__Frame req = HEAPD__FRAME__INIT;
        req.body_case = HEAPD__FRAME__BODY_ALLOC;
        req.alloc = &al;
        Heapd__Frame *rep;
        hw_frame raw;
        int rc = rpc(c, &req, HEAPD__FRAME__BODY_ALLOC_REPLY, &rep, &raw);
        if (rc != HEAPC_OK)
            return rc;
        Heapd__AllocReply *ar = rep->alloc_reply;
        if (!ar) {
            rpc_done(rep, &raw);
            return set_err(c, HEAPC_EPROTOCOL, "heapd sent an empty AllocReply");
        }
        if (ar->collect_needed) {
            rpc_done(rep, &raw);
            rc = collect_locked(c);
            if (rc != HEAPC_OK)
                return rc;
            c->ctr.collects_needed++;
            continue;
        }
        /* heapd made allocation next_seq: from here on it counts. */
        uint64_t off = ar->offset;
        c->next_seq++;
        c->ctr.allocs++;
        int ins = ls_insert(&c->live, off);
        if (offset)
            *offset = off;
        if (ptr)
            *ptr = NULL;
        rc = map_chunks(c, v, ar->new_chunks, ar->n_new_chunks, &raw);
        if (rc == HEAPC_OK && ar->mapped)
            rc = publish_extent(c, v, ar->mapped, 0);
        uint64_t m = atomic_load_explicit(&c->mapped, memory_order_relaxed);
        if (rc == HEAPC_OK && (off >= m || size > m - off))
            rc = set_err(c, HEAPC_EPROTOCOL,
                         "heapd placed allocation %" PRIu64 " (%zu bytes) at offset %" PRIu64
                         ", beyond the %" PRIu64 " bytes it sent chunks for; report this heapd bug",
                         c->next_seq - 1, size, off, m);
        if (rc != HEAPC_OK) {
            int keep = c->err;
            char msg[ERRSTR_LEN];
            snprintf(msg, sizeof msg, "%s", c->errstr);
            set_err(c, keep == HEAPC_EOOM ? HEAPC_EOOM : HEAPC_EMAP,
                    "allocation %" PRIu64 " of heap %s was made at offset %" PRIu64
                    " but is not usable here: %s (free it; detach and attach again to remap)",
                    c->next_seq - 1, c->heap, off, msg);
            rpc_done(rep, &raw);
            return c->err;
        }
        rpc_done(rep, &raw);
        if (ins == 0)
            return set_err(c, HEAPC_EPROTOCOL,
                           "heapd handed out offset %" PRIu64 " for allocation %" PRIu64
                           " of heap %s while rank %" PRIu32 " still holds it; report this heapd "
                           "bug",
                           off, c->next_seq - 1, c->heap, v->rank);
        if (ins < 0)
            c->live_complete = 0; /* cannot track it: let heapd check frees */
        if (ptr)
            *ptr = v->bases[v->rank] + off;
        return HEAPC_OK;
    }
}

int heapc_alloc(heapc *c, size_t size, void **ptr, uint64_t *offset)
{
    pthread_mutex_lock(&c->mu);
    int rc = alloc_locked(c, size, ptr, offset);
    if (rc == HEAPC_OK)
        ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- detach ------------------------------------------------------------- */

int heapc_detach(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!c->attached) {
        rc = set_err(c, HEAPC_ESTATE, "heapc_detach: not attached to a heap");
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    rc = fence_drain_all(c);
    if (rc == HEAPC_OK)
        rc = flush_locked(c);
    int frc = rc;
    char fmsg[ERRSTR_LEN];
    snprintf(fmsg, sizeof fmsg, "%s", c->errstr);
    if (c->fd >= 0) {
        Heapd__Detach d = HEAPD__DETACH__INIT;
        Heapd__Frame req = HEAPD__FRAME__INIT;
        req.body_case = HEAPD__FRAME__BODY_DETACH;
        req.detach = &d;
        Heapd__Frame *rep;
        hw_frame raw;
        rc = rpc(c, &req, HEAPD__FRAME__BODY_DETACH_REPLY, &rep, &raw);
        if (rc == HEAPC_OK)
            rpc_done(rep, &raw);
    } else {
        rc = set_err(c, HEAPC_ECONN, "%s", c->dead_msg);
    }
    teardown(c);
    if (rc == HEAPC_OK && frc != HEAPC_OK) /* report the lost frees */
        rc = set_err(c, frc, "%s", fmsg);
    if (rc == HEAPC_OK)
        ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void heapc_free_ctx(heapc *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    teardown(c);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    hcr_close(c->ring);
    c->ring = NULL;
    hw_reader_free(&c->rd);
    free(c->socket_path);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- lock-free lookups -------------------------------------------------- */

void *heapc_peer_ptr(heapc *c, uint32_t rank, uint64_t offset)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    if (!v || rank >= v->world || !v->bases[rank])
        return NULL;
    if (offset >= atomic_load_explicit(&c->mapped, memory_order_acquire))
        return NULL;
    return v->bases[rank] + offset;
}

void *heapc_ptr(heapc *c, uint64_t offset)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    return v ? heapc_peer_ptr(c, v->rank, offset) : NULL;
}

void *heapc_base(heapc *c, uint32_t rank)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    if (!v || rank >= v->world)
        return NULL;
    return v->bases[rank];
}

uint64_t heapc_mapped(heapc *c)
{
    return atomic_load_explicit(&c->mapped, memory_order_acquire);
}

const char *heapc_heap_name(heapc *c)
{
    return c && c->attached && c->heap ? c->heap : "";
}

uint32_t heapc_rank(heapc *c)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    return v ? v->rank : UINT32_MAX;
}

uint32_t heapc_world_size(heapc *c)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    return v ? v->world : 0;
}

size_t heapc_local_ranks(heapc *c, uint32_t *out, size_t max)
{
    view *v = atomic_load_explicit(&c->view, memory_order_acquire);
    if (!v)
        return 0;
    for (size_t i = 0; i < v->nlocal && i < max; i++)
        out[i] = v->local[i];
    return v->nlocal;
}

uint64_t heapc_next_seq(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t s = c->next_seq;
    pthread_mutex_unlock(&c->mu);
    return s;
}

int heapc_status_fd(heapc *c)
{
    pthread_mutex_lock(&c->mu);
    int fd = c->status_fd;
    pthread_mutex_unlock(&c->mu);
    return fd;
}

#define GET(field) out->field = __atomic_load_n(&p->field, __ATOMIC_RELAXED)

int heapc_status(heapc *c, heapc_status_t *out)
{
    const hs_page *p = atomic_load_explicit(&c->status_page, memory_order_acquire);
    if (!p)
        return HEAPC_ESTATE;
    /* Bounded: a heapd that died (or stopped) mid-write leaves seq odd. */
    for (unsigned tries = 0;; tries++) {
        if (tries >= HEAPC_STATUS_TRIES)
            return HEAPC_EBUSY;
        if (tries >= 64)
            sched_yield(); /* heapd may be descheduled mid-write */
        uint64_t s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1)
            continue;
        GET(mapped);
        GET(live);
        GET(released);
        GET(free);
        GET(rank_held);
        GET(rank_released);
        GET(collects);
        GET(growths);
        GET(allocs);
        GET(epoch);
        GET(device_free);
        GET(device_total);
        GET(device_sampled_ns);
        GET(updates);
        GET(collects_skipped);
        GET(stream_waiting);
        GET(device_waits_avoided);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&p->seq, __ATOMIC_RELAXED) == s1)
            return HEAPC_OK;
    }
}

#undef GET

int heapc_get_counters(heapc *c, heapc_counters *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->ctr;
    out->queued_frees = c->fq_n;
    out->stream_waiting = c->fence_on ? c->fence.waiting : 0;
    out->stream_markers = c->ctr.stream_markers + (c->fence_on ? c->fence.markers : 0);
    int rc = ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- admin -------------------------------------------------------------- */

static void copy_hist(heapc_hist *o, const Heapd__Histogram *g)
{
    if (!g)
        return;
    size_t nb = g->n_bounds < HEAPC_HIST_MAX - 1 ? g->n_bounds : HEAPC_HIST_MAX - 1;
    o->nbounds = nb;
    memcpy(o->bounds, g->bounds, nb * sizeof *o->bounds);
    for (size_t i = 0; i < g->n_counts; i++)
        o->counts[i < nb ? i : nb] += g->counts[i]; /* more buckets than fit: the rest to +Inf */
    o->count = g->count;
    o->sum_seconds = g->sum_seconds;
}

void heapc_stats_free(heapc_daemon_stats *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nheaps; i++) {
        free(s->heaps[i].name);
        free(s->heaps[i].ranks);
    }
    free(s->heaps);
    free(s->version);
    free(s->backend);
    free(s->store);
    free(s);
}

static char *dupstr(const char *s)
{
    return strdup(s ? s : "");
}

static int stats_locked(heapc *c, const char *heap, heapc_daemon_stats **out)
{
    *out = NULL;
    Heapd__Stats st = HEAPD__STATS__INIT;
    st.heap = (char *)(heap ? heap : "");
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_STATS;
    req.stats = &st;
    Heapd__Frame *rep;
    hw_frame raw;
    int rc = rpc(c, &req, HEAPD__FRAME__BODY_STATS_REPLY, &rep, &raw);
    if (rc != HEAPC_OK)
        return rc;
    Heapd__StatsReply *sr = rep->stats_reply;
    heapc_daemon_stats *s = calloc(1, sizeof *s);
    if (!s)
        goto oom;
    s->version = dupstr(sr ? sr->version : NULL);
    s->backend = dupstr(sr ? sr->backend : NULL);
    s->clients = sr ? sr->clients : 0;
    s->store = dupstr(sr ? sr->store : NULL);
    s->uptime_ms = sr ? sr->uptime_ms : 0;
    s->store_connected = sr && sr->store_connected;
    s->quota_heap = sr ? sr->quota_heap : 0;
    s->quota_uid = sr ? sr->quota_uid : 0;
    if (!s->version || !s->backend || !s->store)
        goto oom;
    size_t nh = sr ? sr->n_heaps : 0;
    if (nh) {
        s->heaps = calloc(nh, sizeof *s->heaps);
        if (!s->heaps)
            goto oom;
    }
    for (size_t i = 0; i < nh; i++) {
        const Heapd__HeapStats *h = sr->heaps[i];
        heapc_heap_stats *o = &s->heaps[i];
        s->nheaps++;
        o->name = dupstr(h->name);
        if (!o->name)
            goto oom;
        o->world_size = h->world_size;
        if (h->params) {
            o->params.chunk_size = h->params->chunk_size;
            o->params.initial_size = h->params->initial_size;
            o->params.va_size = h->params->va_size;
            o->params.min_block = h->params->min_block;
            o->params.policy = (heapc_policy)h->params->policy;
            o->params.collect_timeout_ms = h->params->collect_timeout_ms;
        }
        o->mapped = h->mapped;
        o->live_bytes = h->live_bytes;
        o->released_bytes = h->released_bytes;
        o->free_bytes = h->free_bytes;
        o->collects = h->collects;
        o->collects_skipped = h->collects_skipped;
        o->growths = h->growths;
        o->clients = h->clients;
        o->next_seq = h->next_seq;
        o->epoch = h->epoch;
        o->pending_collect_seq = h->pending_collect_seq;
        o->collect_pending = h->collect_pending;
        o->owner_uid = h->owner_uid;
        copy_hist(&o->collect_wait, h->collect_wait);
        copy_hist(&o->growth, h->growth);
        o->device_free = h->device_free;
        o->device_total = h->device_total;
        if (h->n_ranks) {
            o->ranks = calloc(h->n_ranks, sizeof *o->ranks);
            if (!o->ranks)
                goto oom;
        }
        o->nranks = h->n_ranks;
        for (size_t r = 0; r < h->n_ranks; r++) {
            const Heapd__RankStats *rs = h->ranks[r];
            o->ranks[r].rank = rs->rank;
            o->ranks[r].attached = rs->attached ? 1 : 0;
            o->ranks[r].live_bytes = rs->live_bytes;
            o->ranks[r].released_bytes = rs->released_bytes;
            o->ranks[r].next_seq = rs->next_seq;
            o->ranks[r].pid = rs->pid;
            o->ranks[r].stream_waiting = rs->stream_waiting;
            o->ranks[r].device_waits_avoided = rs->device_waits_avoided;
        }
    }
    rpc_done(rep, &raw);
    *out = s;
    return HEAPC_OK;
oom:
    rpc_done(rep, &raw);
    heapc_stats_free(s);
    return set_err(c, HEAPC_EOOM, "out of memory decoding heapd's statistics");
}

int heapc_stats(heapc *c, const char *heap, heapc_daemon_stats **out)
{
    pthread_mutex_lock(&c->mu);
    int rc = stats_locked(c, heap, out);
    if (rc == HEAPC_OK)
        ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int heapc_force_collect(heapc *c, const char *heap, uint64_t *at_seq)
{
    pthread_mutex_lock(&c->mu);
    int rc;
    if (!heap || !*heap) {
        rc = set_err(c, HEAPC_EINVAL, "heapc_force_collect: name the heap to collect");
        goto out;
    }
    Heapd__ForceCollect fc = HEAPD__FORCE_COLLECT__INIT;
    fc.heap = (char *)heap;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_FORCE_COLLECT;
    req.force_collect = &fc;
    Heapd__Frame *rep;
    hw_frame raw;
    rc = rpc(c, &req, HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY, &rep, &raw);
    if (rc == HEAPC_OK) {
        if (at_seq)
            *at_seq = rep->force_collect_reply ? rep->force_collect_reply->at_seq : 0;
        rpc_done(rep, &raw);
        ok(c);
    }
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}
