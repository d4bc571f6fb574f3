/* heapc.c - libheapc, the heapd client library. See heapc.h (the public API)
 * and docs/protocol.md (the contract with heapd). */
#include "heapc_int.h"
#include "env.h"
#include "policy.h"

int hci_set_err(heapc *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errstr, sizeof c->errstr, fmt, ap);
    va_end(ap);
    c->err = code;
    if (code != HEAPC_EASYMMETRY)
        c->asym_count = 0; /* a rewrapped asymmetry keeps heapd's figures */
    return code;
}

int hci_ok(heapc *c)
{
    c->err = HEAPC_OK;
    c->errstr[0] = '\0';
    c->asym_count = 0;
    return HEAPC_OK;
}

/* The figures of heapd's Error e (an asymmetric allocation's, else none). */
static void keep_asymmetry(heapc *c, const Heapd__Error *e)
{
    size_t n = e->n_asym_ranks < e->n_asym_sizes ? e->n_asym_ranks : e->n_asym_sizes;
    if (e->code != HEAPD__ERR_CODE__ERR_ASYMMETRY)
        n = 0;
    c->asym_count = n < ASYM_MAX ? n : ASYM_MAX;
    c->asym_n = e->asym_n;
    for (size_t i = 0; i < c->asym_count; i++) {
        c->asym_ranks[i] = e->asym_ranks[i];
        c->asym_sizes[i] = e->asym_sizes[i];
    }
    /* Issue 29: a name asymmetry names both names. */
    c->asym_named = c->asym_count && e->n_asym_names >= c->asym_count;
    for (size_t i = 0; c->asym_named && i < c->asym_count; i++)
        snprintf(c->asym_names[i], sizeof c->asym_names[i], "%s", e->asym_names[i] ? e->asym_names[i] : "");
}

const char *heapc_last_asymmetry_name(const heapc *c, size_t i)
{
    if (!c || c->err != HEAPC_EASYMMETRY || !c->asym_named || i >= c->asym_count)
        return NULL;
    return c->asym_names[i];
}

size_t heapc_last_asymmetry(const heapc *c, uint64_t *n, uint32_t *ranks, uint64_t *sizes, size_t max)
{
    if (!c || c->err != HEAPC_EASYMMETRY || !c->asym_count)
        return 0;
    if (n)
        *n = c->asym_n;
    for (size_t i = 0; i < max && i < c->asym_count; i++) {
        if (ranks)
            ranks[i] = c->asym_ranks[i];
        if (sizes)
            sizes[i] = c->asym_sizes[i];
    }
    return c->asym_count;
}

/* Each of heapd's codes is the protocol's ErrCode negated. */
#define HEAPC_ERRNO_PROTO(code, value, name, desc)                                                                     \
    _Static_assert((code) == -HEAPD__ERR_CODE__##name, #code " is -" #name " of proto/heapd.proto");
HEAPC_DAEMON_ERRNO_MAP(HEAPC_ERRNO_PROTO)
#undef HEAPC_ERRNO_PROTO

const char *heapc_errname(int code)
{
    switch (code) {
    case HEAPC_OK:
        return "OK";
#define HEAPC_ERRNO_NAME(code, value, name, desc)                                                                      \
    case code:                                                                                                         \
        return #name;
        HEAPC_ERRNO_MAP(HEAPC_ERRNO_NAME)
#undef HEAPC_ERRNO_NAME
    }
    return "ERR_UNKNOWN";
}

const char *heapc_errdesc(int code)
{
    switch (code) {
    case HEAPC_OK:
        return "success";
#define HEAPC_ERRNO_DESC(code, value, name, desc)                                                                      \
    case code:                                                                                                         \
        return desc;
        HEAPC_ERRNO_MAP(HEAPC_ERRNO_DESC)
#undef HEAPC_ERRNO_DESC
    }
    return "unknown error code";
}

/* The names of common/policy.h's list, by wire value (heapctl, python/heapd). */
const char *heapc_policy_name(heapc_policy p)
{
    int i = hpo_from_wire((int)p);
    return p == HEAPC_POLICY_DEFAULT ? "default" : i < 0 ? "unknown" : hpo_name((unsigned)i);
}

int heapc_err(const heapc *c) { return c ? c->err : HEAPC_EOOM; }

const char *heapc_errstr(const heapc *c) { return c ? c->errstr : "out of memory allocating the heapc context"; }

const char *heapc_server(const heapc *c) { return c ? c->server : ""; }

const char *heapc_backend(const heapc *c) { return c ? c->backend : ""; }

/* ---- connection --------------------------------------------------------- */

static const char *body_name(Heapd__Frame__BodyCase b)
{
    switch (b) {
    case HEAPD__FRAME__BODY_HELLO:
        return "Hello";
    case HEAPD__FRAME__BODY_HELLO_REPLY:
        return "HelloReply";
    case HEAPD__FRAME__BODY_ATTACH:
        return "Attach";
    case HEAPD__FRAME__BODY_ATTACH_REPLY:
        return "AttachReply";
    case HEAPD__FRAME__BODY_ALLOC:
        return "Alloc";
    case HEAPD__FRAME__BODY_ALLOC_REPLY:
        return "AllocReply";
    case HEAPD__FRAME__BODY_CHUNK_BATCH:
        return "ChunkBatch";
    case HEAPD__FRAME__BODY_FREE:
        return "Free";
    case HEAPD__FRAME__BODY_FREE_REPLY:
        return "FreeReply";
    case HEAPD__FRAME__BODY_COLLECT:
        return "Collect";
    case HEAPD__FRAME__BODY_COLLECT_REPLY:
        return "CollectReply";
    case HEAPD__FRAME__BODY_STATS:
        return "Stats";
    case HEAPD__FRAME__BODY_STATS_REPLY:
        return "StatsReply";
    case HEAPD__FRAME__BODY_FORCE_COLLECT:
        return "ForceCollect";
    case HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY:
        return "ForceCollectReply";
    case HEAPD__FRAME__BODY_DETACH:
        return "Detach";
    case HEAPD__FRAME__BODY_DETACH_REPLY:
        return "DetachReply";
    case HEAPD__FRAME__BODY_ERROR:
        return "Error";
    case HEAPD__FRAME__BODY_COMMIT:
        return "Commit";
    case HEAPD__FRAME__BODY_COMMIT_REPLY:
        return "CommitReply";
    case HEAPD__FRAME__BODY_LIVE_BATCH:
        return "LiveBatch";
    default:
        return "an empty frame";
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
    hcr_close(c->ring);
    c->ring = NULL;
    hcs_close(&c->sock);
    return hci_set_err(c, code, "%s", c->dead_msg);
}

static int map_daemon_code(int code)
{
    if (code >= 1 && code <= 99)
        return -code;
    return HEAPC_EPROTOCOL;
}

/* heapd closed the connection. If it said why first (an unsolicited Error:
 * a refused connection names the limit and its key), that is the error. */
static int conn_closed_by_heapd(heapc *c, const char *when, const char *req)
{
    int code;
    char msg[ERRSTR_LEN];
    if (hcs_last_words(&c->sock, &code, msg, sizeof msg))
        return conn_dead(c, map_daemon_code(code), "%s (heapd closed the connection %s %s)", msg, when, req);
    return conn_dead(c, HEAPC_ECONN,
                     "heapd closed the connection (socket %s) %s %s; check that heapd is running "
                     "(systemctl status heapd) and listens on %s, then connect again",
                     c->socket_path, when, req, c->socket_path);
}

/* A transport's failure (heapc_xport.h) as the call's error; every one but
 * a request too large closes the connection. sending: before the request
 * left (else while waiting for its reply). */
static int rpc_fail(heapc *c, const Heapd__Frame *req, int rc, const hcx_err *e, int sending)
{
    const char *b = body_name(req->body_case);
    const char *on = e->ring ? " on the request ring" : "";
    switch (rc) {
    case HCX_ECLOSED:
        return conn_closed_by_heapd(c, sending ? "while sending" : "before answering", b);
    case HCX_ETOOBIG:
        return hci_set_err(c, HEAPC_EINVAL, "the %s request is too large to send: %s", b, e->why);
    case HCX_ESTALL:
        return conn_dead(c, HEAPC_ENOREPLY,
                         "reading heapd's reply to %s: %s; the connection was closed because its state is "
                         "unknown: connect and attach again",
                         b, e->why);
    case HCX_ETIMEOUT:
        return conn_dead(c, HEAPC_ENOREPLY,
                         "no reply from heapd to %s within %d ms%s; the connection was closed because its "
                         "state is unknown: connect and attach again",
                         b, c->timeout_ms, on);
    case HCX_EDECODE:
        return conn_dead(c, HEAPC_EPROTOCOL,
                         "heapd's reply to %s%s is not a valid heapd.Frame; libheapc and heapd do not "
                         "speak the same protocol: check their versions",
                         b, on);
    case HCX_EPROTO:
        return conn_dead(c, HEAPC_EPROTOCOL, "%s; the connection was closed: connect again", e->why);
    default:
        if (sending)
            return conn_dead(c, HEAPC_ECONN, "sending %s to heapd failed: %s; connect again", b, e->why);
        return conn_dead(c, HEAPC_ECONN,
                         "reading heapd's reply to %s failed: %s; the connection was closed: connect again", b, e->why);
    }
}

/* The transport for a request of len packed bytes: the ring when the
 * connection has one and it carries the request, else the socket. */
static hcx rpc_transport(heapc *c, Heapd__Frame__BodyCase body, size_t len)
{
    if (c->ring && hcr_ops.carries(c->ring, body, len, 0))
        return (hcx){&hcr_ops, c->ring};
    return (hcx){&hcs_ops, &c->sock};
}

/* rpc, step 1: gives req its id, encodes it and sends it through *t. */
static int rpc_send(heapc *c, Heapd__Frame *req, hcx *t)
{
    req->id = ++c->next_id;
    size_t len = heapd__frame__get_packed_size(req);
    unsigned char stackbuf[512];
    unsigned char *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
    if (!buf)
        return hci_set_err(c, HEAPC_EOOM, "out of memory encoding a %zu-byte %s request", len,
                           body_name(req->body_case));
    heapd__frame__pack(req, buf);
    *t = rpc_transport(c, req->body_case, len);
    hcx_err e = {0};
    int rc = t->ops->send(t->data, req->id, buf, len, NULL, 0, &e);
    if (buf != stackbuf)
        free(buf);
    return rc == HCX_OK ? HEAPC_OK : rpc_fail(c, req, rc, &e, 1);
}

/* rpc, step 3: is m (a frame of req, or unsolicited) the reply to req, with
 * body `want`? HEAPC_OK: yes (the caller keeps m and f); an error: m and f
 * are freed. */
static int rpc_check(heapc *c, const Heapd__Frame *req, Heapd__Frame__BodyCase want, Heapd__Frame *m, hw_frame *f)
{
    int rc = HEAPC_OK;
    if (m->id == 0 && m->body_case == HEAPD__FRAME__BODY_ERROR && m->error) {
        /* Unsolicited: heapd says why it is closing the connection. */
        char why[512];
        snprintf(why, sizeof why, "%s", m->error->message ? m->error->message : "heapd closed the connection");
        int code = map_daemon_code((int)m->error->code);
        rc = conn_dead(c, code, "%s (while waiting for the reply to %s)", why, body_name(req->body_case));
    } else if (m->body_case == HEAPD__FRAME__BODY_ERROR && m->error) {
        int code = map_daemon_code((int)m->error->code);
        const char *msg = m->error->message ? m->error->message : "";
        if (!*msg)
            hci_set_err(c, code, "heapd refused %s: %s", body_name(req->body_case), heapc_errname(code));
        else
            hci_set_err(c, code, "%s", msg);
        keep_asymmetry(c, m->error);
        if (code == HEAPC_EVERSION)
            conn_dead(c, code, "%s", c->errstr);
        rc = code;
    } else if (m->body_case != want) {
        rc = hci_set_err(c, HEAPC_EPROTOCOL,
                         "heapd answered %s with %s instead of %s; libheapc and heapd do not "
                         "agree on the protocol: check their versions",
                         body_name(req->body_case), body_name(m->body_case), body_name(want));
    }
    if (rc != HEAPC_OK) {
        heapd__frame__free_unpacked(m, NULL);
        hw_frame_free(f);
    }
    return rc;
}

/* Chunks and fds of ChunkBatch frames (a reply with more than 1024 fds comes
 * as batches, then the reply itself: docs/protocol.md), until the reply. */
typedef struct chunk_acc {
    Heapd__ChunkRef **refs; /* each malloc'd, fd_index rebased onto fds */
    size_t n, cap;
    int *fds;
    size_t nfds, fdcap;
} chunk_acc;

static void acc_free(chunk_acc *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->refs[i]);
    for (size_t i = 0; i < a->nfds; i++)
        if (a->fds[i] >= 0)
            close(a->fds[i]);
    free(a->refs);
    free(a->fds);
    memset(a, 0, sizeof *a);
}

/* Takes the batch's chunks and the frame's fds (f->fds[i] = -1 after). */
static int acc_add(chunk_acc *a, const Heapd__ChunkBatch *b, hw_frame *f)
{
    if (a->n + b->n_chunks > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 1024;
        while (cap < a->n + b->n_chunks)
            cap *= 2;
        Heapd__ChunkRef **r = realloc(a->refs, cap * sizeof *r);
        if (!r)
            return -1;
        a->refs = r;
        a->cap = cap;
    }
    if (a->nfds + f->nfds > a->fdcap) {
        size_t cap = a->fdcap ? a->fdcap * 2 : 1024;
        while (cap < a->nfds + f->nfds)
            cap *= 2;
        int *p = realloc(a->fds, cap * sizeof *p);
        if (!p)
            return -1;
        a->fds = p;
        a->fdcap = cap;
    }
    for (size_t i = 0; i < b->n_chunks; i++) {
        if (b->chunks[i]->fd_index >= f->nfds)
            return -1;
        Heapd__ChunkRef *r = malloc(sizeof *r);
        if (!r)
            return -1;
        heapd__chunk_ref__init(r);
        r->rank = b->chunks[i]->rank;
        r->index = b->chunks[i]->index;
        r->fd_index = (uint32_t)(a->nfds + b->chunks[i]->fd_index);
        a->refs[a->n++] = r;
    }
    for (size_t i = 0; i < f->nfds; i++) {
        a->fds[a->nfds++] = f->fds[i];
        f->fds[i] = -1;
    }
    return 0;
}

/* The reply gets the batches' chunks first and their fds before its own:
 * as if it had come in one frame. *chunks / *n are the reply's repeated
 * ChunkRef field (unpacked with the default allocator: malloc). */
static int acc_merge(chunk_acc *a, Heapd__ChunkRef ***chunks, size_t *n, int32_t *status_index, hw_frame *f)
{
    if (!a->n && !a->nfds)
        return 0;
    Heapd__ChunkRef **all = malloc((a->n + *n) * sizeof *all);
    int *fds = malloc((a->nfds + f->nfds) * sizeof *fds);
    if (!all || !fds) {
        free(all);
        free(fds);
        return -1;
    }
    memcpy(all, a->refs, a->n * sizeof *all);
    for (size_t i = 0; i < *n; i++) {
        (*chunks)[i]->fd_index += (uint32_t)a->nfds;
        all[a->n + i] = (*chunks)[i];
    }
    memcpy(fds, a->fds, a->nfds * sizeof *fds);
    if (f->nfds)
        memcpy(fds + a->nfds, f->fds, f->nfds * sizeof *fds);
    if (status_index && *status_index >= 0)
        *status_index += (int32_t)a->nfds;
    free(*chunks);
    *chunks = all;
    *n += a->n;
    free(f->fds);
    f->fds = fds;
    f->nfds += a->nfds;
    free(a->refs);
    free(a->fds);
    memset(a, 0, sizeof *a);
    return 0;
}

/* The reply gets the ChunkBatch frames' chunks and fds (acc), when it is
 * one that carries chunks, and an AttachReply the LiveBatch frames' blocks
 * (lacc, issue 29) before its own. 0, or -1 (out of memory: m and f are freed). */
static int rpc_merge(chunk_acc *acc, live_acc *lacc, Heapd__Frame__BodyCase want, Heapd__Frame *m, hw_frame *f)
{
    int rc = 0;
    if (want == HEAPD__FRAME__BODY_ATTACH_REPLY && m->attach_reply)
        rc = acc_merge(acc, &m->attach_reply->chunks, &m->attach_reply->n_chunks, &m->attach_reply->status_fd_index,
                       f) ||
             hci_live_merge(lacc, m->attach_reply);
    else if (want == HEAPD__FRAME__BODY_ALLOC_REPLY && m->alloc_reply)
        rc = acc_merge(acc, &m->alloc_reply->new_chunks, &m->alloc_reply->n_new_chunks, NULL, f);
    else if (want == HEAPD__FRAME__BODY_RESTORE_REPLY && m->restore_reply)
        rc = acc_merge(acc, &m->restore_reply->chunks, &m->restore_reply->n_chunks, NULL, f);
    if (rc)
        hci_rpc_done(m, f);
    return rc;
}

/* A frame that comes before req's reply and belongs to it: a ChunkBatch
 * (a reply with more fds than one frame) into acc, a LiveBatch (issue 29: a
 * live set larger than one frame) into lacc. 1: taken (m and f freed), 0:
 * not such a frame, -1: out of memory (m and f freed). */
static int rpc_batch(const Heapd__Frame *req, Heapd__Frame__BodyCase want, Heapd__Frame *m, hw_frame *f, chunk_acc *acc,
                     live_acc *lacc)
{
    int rc;
    if (m->id != req->id)
        return 0;
    if (m->body_case == HEAPD__FRAME__BODY_CHUNK_BATCH && m->chunk_batch)
        rc = acc_add(acc, m->chunk_batch, f);
    else if (m->body_case == HEAPD__FRAME__BODY_LIVE_BATCH && m->live_batch && want == HEAPD__FRAME__BODY_ATTACH_REPLY)
        rc = hci_live_add(lacc, m->live_batch);
    else
        return 0;
    hci_rpc_done(m, f);
    return rc ? -1 : 1;
}

/* rpc, step 2: req's frames from t until its reply (ChunkBatch and
 * LiveBatch frames before it kept and merged into it), checked by
 * rpc_check. */
static int rpc_reply(heapc *c, hcx t, const Heapd__Frame *req, Heapd__Frame__BodyCase want, Heapd__Frame **rep,
                     hw_frame *raw)
{
    chunk_acc acc;
    memset(&acc, 0, sizeof acc);
    live_acc lacc = {0};
    for (;;) {
        Heapd__Frame *m;
        hw_frame f;
        hcx_err e = {0};
        int rc = t.ops->await(t.data, req->id, c->timeout_ms, &m, &f, &e);
        if (rc != HCX_OK) {
            rc = rpc_fail(c, req, rc, &e, 0);
        } else if ((rc = rpc_batch(req, want, m, &f, &acc, &lacc)) > 0) {
            continue;
        } else if (rc < 0) {
            rc = conn_dead(c, HEAPC_EOOM,
                           "out of memory collecting the chunks or live set of heapd's reply to %s "
                           "(or a chunk names an fd its frame lacks); the connection was closed",
                           body_name(req->body_case));
        } else {
            rc = rpc_check(c, req, want, m, &f);
            if (rc == HEAPC_OK && rpc_merge(&acc, &lacc, want, m, &f))
                rc = conn_dead(c, HEAPC_EOOM,
                               "out of memory collecting the chunks of heapd's reply to %s; the "
                               "connection was closed",
                               body_name(req->body_case));
            if (rc == HEAPC_OK) {
                *rep = m;
                *raw = f;
            }
        }
        acc_free(&acc);
        hci_live_free(&lacc);
        return rc;
    }
}

/*
 * Sends req (its id is set here) and waits for the reply with the same id.
 * On success *rep is the decoded reply with body `want` and *raw holds the
 * frame's fds (the caller frees both: heapd__frame__free_unpacked,
 * hw_frame_free). An Error reply keeps heapd's code and message. The one
 * path between libheapc and heapd: every request goes through here, on the
 * transport that carries it (heapc_xport.h: the request ring, else the
 * socket).
 */
int hci_rpc(heapc *c, Heapd__Frame *req, Heapd__Frame__BodyCase want, Heapd__Frame **rep, hw_frame *raw)
{
    *rep = NULL;
    memset(raw, 0, sizeof *raw);
    if (c->sock.fd < 0)
        return hci_set_err(c, HEAPC_ECONN, "%s", c->dead_msg);
    hcx t;
    int rc = rpc_send(c, req, &t);
    if (rc != HEAPC_OK)
        return rc;
    return rpc_reply(c, t, req, want, rep, raw);
}

void hci_rpc_done(Heapd__Frame *rep, hw_frame *raw)
{
    if (rep)
        heapd__frame__free_unpacked(rep, NULL);
    hw_frame_free(raw);
}

heapc *heapc_connect(const char *socket_path) { return heapc_connect_timeout(socket_path, -1); }

heapc *heapc_connect_timeout(const char *socket_path, int timeout_ms)
{
    heapc *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->status_fd = -1;
    c->timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
    c->fq_batch = FREE_BATCH_DEFAULT;
    const char *sr = henv_get("STREAM_REUSE"); /* issue 27: default on */
    c->stream_reuse = !(sr && strcmp(sr, "0") == 0);
    hcs_init(&c->sock);
    atomic_init(&c->view, NULL);
    atomic_init(&c->mapped, 0);

    if (!socket_path || !*socket_path)
        socket_path = getenv("HEAPD_SOCKET");
    if (!socket_path || !*socket_path)
        socket_path = HEAPC_DEFAULT_SOCKET;
    c->socket_path = strdup(socket_path);
    if (!c->socket_path) {
        hci_set_err(c, HEAPC_EOOM, "out of memory");
        return c;
    }
    snprintf(c->dead_msg, sizeof c->dead_msg, "not connected to heapd at %s", c->socket_path);

    char werr[320];
    if (hcs_connect(&c->sock, c->socket_path, werr, sizeof werr)) {
        conn_dead(c, HEAPC_ECONN, "%s", werr);
        return c;
    }

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
    if (hci_rpc(c, &req, HEAPD__FRAME__BODY_HELLO_REPLY, &rep, &raw) != HEAPC_OK) {
        /* No session without a handshake: later calls report this too. */
        if (c->sock.fd >= 0) {
            char msg[ERRSTR_LEN];
            snprintf(msg, sizeof msg, "%s", c->errstr);
            conn_dead(c, c->err, "heapd at %s refused the handshake: %s", c->socket_path, msg);
        }
        return c;
    }
    Heapd__HelloReply *hr = rep->hello_reply;
    if (!hr || hr->version != HEAPC_PROTOCOL_VERSION) {
        unsigned v = hr ? hr->version : 0;
        hci_rpc_done(rep, &raw);
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
        hci_rpc_done(rep, &raw);
        conn_dead(c, HEAPC_EINVAL, "%s", twhy);
        return c;
    }
    snprintf(c->backend, sizeof c->backend, "%s", hr->backend ? hr->backend : "");
    hci_rpc_done(rep, &raw);
    hci_ok(c);
    return c;
}

int heapc_set_timeout(heapc *c, int timeout_ms)
{
    pthread_mutex_lock(&c->mu);
    c->timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
    int rc = hci_ok(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void heapc_free_ctx(heapc *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    hci_teardown(c);
    hcr_close(c->ring);
    c->ring = NULL;
    hcs_close(&c->sock);
    free(c->socket_path);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- the request ring (issue 16) ------------------------------------------- */

hcr_ring *hcr_of(heapc *c) { return c->ring; }

void hci_ring_setup(heapc *c, uint32_t nlocal)
{
    if (c->ring || !c->ring_want || c->sock.fd < 0)
        return;
    Heapd__RingSetup rs = HEAPD__RING_SETUP__INIT;
    rs.version = HR_VERSION;
    Heapd__Frame req = HEAPD__FRAME__INIT;
    req.body_case = HEAPD__FRAME__BODY_RING_SETUP;
    req.ring_setup = &rs;
    Heapd__Frame *rep;
    hw_frame raw;
    if (hci_rpc(c, &req, HEAPD__FRAME__BODY_RING_SETUP_REPLY, &rep, &raw) != HEAPC_OK) {
        c->ring_want = 0; /* ring = off, or an older heapd: the socket, as before */
        return;
    }
    Heapd__RingSetupReply *r = rep->ring_setup_reply;
    char why[256];
    if (r && r->version == HR_VERSION && raw.nfds == 2) {
        hcx side = {&hcs_ops, &c->sock};
        c->ring = hcr_open(raw.fds[0], raw.fds[1], r->nslots, r->slot_size, nlocal, side, why, sizeof why);
        raw.fds[0] = raw.fds[1] = -1;
    }
    if (!c->ring)
        c->ring_want = 0;
    hci_rpc_done(rep, &raw);
}
