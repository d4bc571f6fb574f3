/* heapc.c - libheapc, the heapd client library. See heapc.h (the public API)
 * and docs/protocol.md (the contract with heapd). */
#include "heapc_int.h"
#include "policy.h"

int hci_set_err(heapc *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errstr, sizeof c->errstr, fmt, ap);
    va_end(ap);
    c->err = code;
    return code;
}

int hci_ok(heapc *c)
{
    c->err = HEAPC_OK;
    c->errstr[0] = '\0';
    return HEAPC_OK;
}

const char *heapc_errname(int code)
{
    switch (code) {
    case HEAPC_OK:
        return "OK";
    case HEAPC_EPROTOCOL:
        return "ERR_PROTOCOL";
    case HEAPC_EVERSION:
        return "ERR_VERSION";
    case HEAPC_EINVAL:
        return "ERR_INVALID";
    case HEAPC_EMISMATCH:
        return "ERR_MISMATCH";
    case HEAPC_EASYMMETRY:
        return "ERR_ASYMMETRY";
    case HEAPC_ETIMEOUT:
        return "ERR_TIMEOUT";
    case HEAPC_EPEER_GONE:
        return "ERR_PEER_GONE";
    case HEAPC_ENOMEM:
        return "ERR_NO_MEMORY";
    case HEAPC_EVA_EXHAUSTED:
        return "ERR_VA_EXHAUSTED";
    case HEAPC_ENOTFOUND:
        return "ERR_NOT_FOUND";
    case HEAPC_ESTATE:
        return "ERR_STATE";
    case HEAPC_ENOTHELD:
        return "ERR_NOT_HELD";
    case HEAPC_EBACKEND:
        return "ERR_BACKEND";
    case HEAPC_EDENIED:
        return "ERR_DENIED";
    case HEAPC_ESHUTDOWN:
        return "ERR_SHUTDOWN";
    case HEAPC_ESTORE:
        return "ERR_STORE";
    case HEAPC_EQUOTA:
        return "ERR_QUOTA";
    case HEAPC_ECONN:
        return "ERR_CONN";
    case HEAPC_EMAP:
        return "ERR_MAP";
    case HEAPC_EOOM:
        return "ERR_OOM";
    case HEAPC_ENOREPLY:
        return "ERR_NOREPLY";
    case HEAPC_ESYNC:
        return "ERR_SYNC";
    case HEAPC_EBUSY:
        return "ERR_BUSY";
    default:
        return "ERR_UNKNOWN";
    }
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
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    hcr_close(c->ring);
    c->ring = NULL;
    hw_reader_free(&c->rd);
    hw_reader_init(&c->rd);
    return hci_set_err(c, code, "%s", c->dead_msg);
}

static int map_daemon_code(int code);

/* heapd closed the connection. If it said why first (an unsolicited Error:
 * a refused connection names the limit and its key), that is the error. */
static int conn_closed_by_heapd(heapc *c, const char *when, const char *req)
{
    hw_frame f;
    char werr[128];
    if (c->fd >= 0 && hw_recv_frame(c->fd, &c->rd, &f, 0, werr, sizeof werr) == HW_FRAME) {
        Heapd__Frame *m = heapd__frame__unpack(NULL, f.len, f.data);
        hw_frame_free(&f);
        if (m && m->id == 0 && m->body_case == HEAPD__FRAME__BODY_ERROR && m->error && m->error->message) {
            int rc = conn_dead(c, map_daemon_code((int)m->error->code), "%s (heapd closed the connection %s %s)",
                               m->error->message, when, req);
            heapd__frame__free_unpacked(m, NULL);
            return rc;
        }
        if (m)
            heapd__frame__free_unpacked(m, NULL);
    }
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

/* rpc, step 1: encodes req (its id set here) and sends it. */
static int rpc_send(heapc *c, Heapd__Frame *req)
{
    char werr[256];
    req->id = ++c->next_id;
    size_t len = heapd__frame__get_packed_size(req);
    unsigned char stackbuf[512];
    unsigned char *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
    if (!buf)
        return hci_set_err(c, HEAPC_EOOM, "out of memory encoding a %zu-byte %s request", len,
                           body_name(req->body_case));
    heapd__frame__pack(req, buf);
    int rc = hw_send_frame(c->fd, buf, len, NULL, 0, werr, sizeof werr);
    if (buf != stackbuf)
        free(buf);
    if (rc < 0) {
        if (rc == HW_ESYS && (errno == EPIPE || errno == ECONNRESET))
            return conn_closed_by_heapd(c, "while sending", body_name(req->body_case));
        if (rc == HW_ETOOBIG)
            return hci_set_err(c, HEAPC_EINVAL, "the %s request is too large to send: %s", body_name(req->body_case),
                               werr);
        return conn_dead(c, HEAPC_ECONN, "sending %s to heapd failed: %s; connect again", body_name(req->body_case),
                         werr);
    }
    return HEAPC_OK;
}

/* rpc, step 2: the next frame from heapd, decoded into *m (its fds in *f). */
static int rpc_recv(heapc *c, const Heapd__Frame *req, Heapd__Frame **m, hw_frame *f)
{
    char werr[256];
    int rc = hw_recv_frame(c->fd, &c->rd, f, c->timeout_ms, werr, sizeof werr);
    if (rc == HW_EOF || rc == HW_EPARTIAL || (rc == HW_ESYS && (errno == ECONNRESET || errno == EPIPE)))
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
    *m = heapd__frame__unpack(NULL, f->len, f->data);
    if (!*m) {
        hw_frame_free(f);
        return conn_dead(c, HEAPC_EPROTOCOL,
                         "heapd's reply to %s is not a valid heapd.Frame; libheapc and heapd "
                         "do not speak the same protocol: check their versions",
                         body_name(req->body_case));
    }
    return HEAPC_OK;
}

/* Issue 16: rpc through the ring. ring.used: 0 the socket carries the
 * request; RING_REPLY_SOCKET the reply comes on the socket (heapd said so);
 * RING_MAYBE the socket had something to read while the reply may still
 * come in the ring (after a frame that is not the reply, wait on the ring
 * again). */
#define RING_REPLY_SOCKET 1
#define RING_MAYBE        2
typedef struct rpc_ring_state {
    int used, got;
    char werr[256];
} rpc_ring_state;

/* What hcr_call or hcr_wait returned (rc), into st; *m: the ring's reply
 * when st->got. */
static int rpc_ring_result(heapc *c, Heapd__Frame *req, int rc, rpc_ring_state *st, Heapd__Frame **m, hw_frame *f)
{
    st->got = 0;
    if (rc == HCR_TIMEOUT)
        return conn_dead(c, HEAPC_ENOREPLY,
                         "no reply from heapd to %s within %d ms on the request ring; the connection "
                         "was closed because its state is unknown: connect and attach again",
                         body_name(req->body_case), c->timeout_ms);
    if (rc == HCR_EPROTO)
        return conn_dead(c, HEAPC_EPROTOCOL, "%s; the connection was closed: connect again", st->werr);
    if (rc == HCR_SOCKET || rc == HCR_READABLE) {
        st->used = rc == HCR_READABLE ? RING_MAYBE : RING_REPLY_SOCKET;
        return HEAPC_OK;
    }
    *m = heapd__frame__unpack(NULL, f->len, f->data);
    if (!*m) {
        hw_frame_free(f);
        return conn_dead(c, HEAPC_EPROTOCOL,
                         "heapd's reply to %s on the request ring is not a valid heapd.Frame; libheapc "
                         "and heapd do not speak the same protocol: check their versions",
                         body_name(req->body_case));
    }
    st->got = 1;
    return HEAPC_OK;
}

/* Posts req through the ring when the connection has one, req is an Alloc,
 * Free or Collect and fits a slot (else st->used stays 0), and waits. */
static int rpc_ring(heapc *c, Heapd__Frame *req, rpc_ring_state *st, Heapd__Frame **m, hw_frame *f)
{
    st->used = st->got = 0;
    if (!c->ring || (req->body_case != HEAPD__FRAME__BODY_ALLOC && req->body_case != HEAPD__FRAME__BODY_FREE &&
                     req->body_case != HEAPD__FRAME__BODY_COLLECT))
        return HEAPC_OK;
    req->id = c->next_id + 1;
    size_t len = heapd__frame__get_packed_size(req);
    unsigned char buf[4096];
    if (len > hcr_payload_max(c->ring) || len > sizeof buf)
        return HEAPC_OK; /* too large for a slot: the socket */
    c->next_id++;
    st->used = RING_REPLY_SOCKET;
    heapd__frame__pack(req, buf);
    int rc = hcr_call(c->ring, c->fd, req->id, buf, len, c->timeout_ms, f, st->werr, sizeof st->werr);
    return rpc_ring_result(c, req, rc, st, m, f);
}

#define RPC_STALE 1 /* rpc_check: a reply to an earlier request, not ours */

/* rpc, step 3: is m the reply to req, with body `want`? HEAPC_OK: yes (the
 * caller keeps m and f); RPC_STALE or an error: m and f are freed. */
static int rpc_check(heapc *c, const Heapd__Frame *req, Heapd__Frame__BodyCase want, Heapd__Frame *m, hw_frame *f)
{
    int rc = HEAPC_OK;
    if (m->id == 0 && m->body_case == HEAPD__FRAME__BODY_ERROR && m->error) {
        /* Unsolicited: heapd says why it is closing the connection. */
        char why[512];
        snprintf(why, sizeof why, "%s", m->error->message ? m->error->message : "heapd closed the connection");
        int code = map_daemon_code((int)m->error->code);
        rc = conn_dead(c, code, "%s (while waiting for the reply to %s)", why, body_name(req->body_case));
    } else if (m->id != req->id) {
        rc = RPC_STALE;
    } else if (m->body_case == HEAPD__FRAME__BODY_ERROR && m->error) {
        int code = map_daemon_code((int)m->error->code);
        const char *msg = m->error->message ? m->error->message : "";
        if (!*msg)
            hci_set_err(c, code, "heapd refused %s: %s", body_name(req->body_case), heapc_errname(code));
        else
            hci_set_err(c, code, "%s", msg);
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

/*
 * Sends req (its id is set here) and waits for the reply with the same id.
 * On success *rep is the decoded reply with body `want` and *raw holds the
 * frame's fds (the caller frees both: heapd__frame__free_unpacked,
 * hw_frame_free). An Error reply keeps heapd's code and message. The one
 * path between libheapc and heapd: every request goes through here.
 */
int hci_rpc(heapc *c, Heapd__Frame *req, Heapd__Frame__BodyCase want, Heapd__Frame **rep, hw_frame *raw)
{
    *rep = NULL;
    memset(raw, 0, sizeof *raw);
    if (c->fd < 0)
        return hci_set_err(c, HEAPC_ECONN, "%s", c->dead_msg);
    Heapd__Frame *m;
    hw_frame f;
    rpc_ring_state st;
    int rc = rpc_ring(c, req, &st, &m, &f);
    if (rc == HEAPC_OK && !st.used)
        rc = rpc_send(c, req);
    if (rc != HEAPC_OK)
        return rc;
    chunk_acc acc;
    memset(&acc, 0, sizeof acc);
    for (;;) {
        if (st.got)
            st.got = 0; /* the ring's reply: checked like a socket frame */
        else if ((rc = rpc_recv(c, req, &m, &f)) != HEAPC_OK)
            break;
        if (m->id == req->id && m->body_case == HEAPD__FRAME__BODY_CHUNK_BATCH && m->chunk_batch) {
            /* Part of a reply with more fds than one frame: kept for it. */
            rc = acc_add(&acc, m->chunk_batch, &f);
            heapd__frame__free_unpacked(m, NULL);
            hw_frame_free(&f);
            if (rc) {
                rc = conn_dead(c, HEAPC_EOOM,
                               "out of memory collecting the chunks of heapd's reply to %s "
                               "(or a chunk names an fd its frame lacks); the connection was closed",
                               body_name(req->body_case));
                break;
            }
            continue;
        }
        rc = rpc_check(c, req, want, m, &f);
        if (rc == RPC_STALE && st.used == RING_MAYBE) {
            /* Not the reply: it may still come in the ring. */
            rc = rpc_ring_result(c, req, hcr_wait(c->ring, c->fd, req->id, c->timeout_ms, &f, st.werr, sizeof st.werr),
                                 &st, &m, &f);
            if (rc != HEAPC_OK)
                break;
            continue;
        }
        if (rc == RPC_STALE)
            continue;
        if (rc != HEAPC_OK)
            break;
        if (want == HEAPD__FRAME__BODY_ATTACH_REPLY && m->attach_reply)
            rc = acc_merge(&acc, &m->attach_reply->chunks, &m->attach_reply->n_chunks,
                           &m->attach_reply->status_fd_index, &f);
        else if (want == HEAPD__FRAME__BODY_ALLOC_REPLY && m->alloc_reply)
            rc = acc_merge(&acc, &m->alloc_reply->new_chunks, &m->alloc_reply->n_new_chunks, NULL, &f);
        if (rc) {
            hci_rpc_done(m, &f);
            rc = conn_dead(c, HEAPC_EOOM,
                           "out of memory collecting the chunks of heapd's reply to %s; the "
                           "connection was closed",
                           body_name(req->body_case));
            break;
        }
        *rep = m;
        *raw = f;
        return HEAPC_OK;
    }
    acc_free(&acc);
    return rc;
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
        hci_set_err(c, HEAPC_EOOM, "out of memory");
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
    if (hci_rpc(c, &req, HEAPD__FRAME__BODY_HELLO_REPLY, &rep, &raw) != HEAPC_OK) {
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

/* ---- the request ring (issue 16) ------------------------------------------- */

hcr_ring *hcr_of(heapc *c) { return c->ring; }

void hci_ring_setup(heapc *c, uint32_t nlocal)
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
    if (hci_rpc(c, &req, HEAPD__FRAME__BODY_RING_SETUP_REPLY, &rep, &raw) != HEAPC_OK) {
        c->ring_want = 0; /* ring = off, or an older heapd: the socket, as before */
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
    hci_rpc_done(rep, &raw);
}
