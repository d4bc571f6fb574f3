/* dispatch.c - one frame in (see dispatch.h). */
#include "dispatch.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heapd.pb-c.h"
#include "log.h"
#include "pbstr.h"
#include "reply.h"
#include "ring.h"

struct hd_dispatch {
    hd_registry *reg;
    hd_server *srv;
    char backend[16];
    hd_rings *rings; /* NULL: rings are off (heapd.conf ring = off) */
};

/* Per client. Invariant: peer.bind.heap != NULL => hello; ops != NULL. */
struct hd_session {
    hd_peer peer;
    const hd_client_ops *ops;
    bool hello;
    hd_ring *ring; /* issue 16: its request ring, or NULL */
};

hd_session *hd_dispatch_session_new(const hd_peer *p, const hd_client_ops *ops)
{
    hd_session *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->peer = *p;
    memset(&s->peer.bind, 0, sizeof s->peer.bind);
    s->ops = ops;
    return s;
}

hd_peer *hd_dispatch_session_peer(hd_session *s) { return &s->peer; }

int hd_dispatch_create(hd_registry *reg, const char *backend_name, hd_dispatch **out)
{
    hd_dispatch *d = calloc(1, sizeof *d);
    if (!d)
        return -1;
    d->reg = reg;
    snprintf(d->backend, sizeof d->backend, "%s", backend_name);
    *out = d;
    return 0;
}

void hd_dispatch_set_server(hd_dispatch *d, hd_server *s) { d->srv = s; }
void hd_dispatch_destroy(hd_dispatch *d)
{
    if (d)
        hd_rings_destroy(d->rings);
    free(d);
}

/* The log fields of what s does now: its pid, heap and rank, and of f
 * (NULL: none) the request's name, seq, heap and rank (issue 20). */
static void log_ctx(const hd_session *s, const Heapd__Frame *f)
{
    hd_log_ctx x = HD_LOG_CTX_NONE;
    x.pid = (long)s->peer.pid;
    if (s->peer.bind.heap) {
        x.heap = s->peer.bind.name;
        x.rank = (long)s->peer.bind.rank;
    }
    if (f) {
        const ProtobufCFieldDescriptor *d =
            protobuf_c_message_descriptor_get_field(&heapd__frame__descriptor, (unsigned)f->body_case);
        x.req = d ? d->name : NULL;
        if (f->body_case == HEAPD__FRAME__BODY_ALLOC && f->alloc)
            x.seq = (long long)f->alloc->seq;
        else if (f->body_case == HEAPD__FRAME__BODY_COLLECT && f->collect)
            x.seq = (long long)f->collect->seq;
        else if (f->body_case == HEAPD__FRAME__BODY_ATTACH && f->attach) {
            x.heap = f->attach->heap;
            x.rank = (long)f->attach->rank;
        } else if (f->body_case == HEAPD__FRAME__BODY_FORCE_COLLECT && f->force_collect)
            x.heap = f->force_collect->heap;
    }
    hd_log_ctx_set(&x);
}

static int peer_privileged(const hd_peer *p, long gid) { return hd_conn_privileged(p->data, gid); }

void hd_dispatch_closed(hd_dispatch *d, hd_session *s)
{
    log_ctx(s, NULL);
    hd_heap_conn_closed(d->reg, &s->peer);
    hd_ring_close(s->ring);
    hd_log_ctx_set(NULL);
    free(s);
}

void hd_dispatch_stop(hd_session *s)
{
    /* An unsolicited Error (id 0) tells the client why the connection
     * ends. */
    hd_peer_error(&s->peer, 0, HEAPD__ERR_CODE__ERR_SHUTDOWN, "heapd is stopping (SIGTERM); the heap is gone");
}

/* ---- the server's connections ------------------------------------------ */

/* Hello accepted: the pre-Hello limits end (hd_conn_admit), then the reply. */
static void conn_hello(hd_peer *p, uint64_t id, const char *backend)
{
    hd_conn_admit(p->data);
    hd_reply_hello(p->data, id, backend);
}
static void conn_close(hd_peer *p) { hd_conn_close_after_flush(p->data); }
static const hd_client_ops conn_ops = {conn_hello, conn_close};

static int on_open(void *arg, hd_conn *c)
{
    (void)arg;
    hd_peer p = {0};
    p.pid = hd_conn_pid(c);
    p.uid = hd_conn_uid(c);
    p.privileged = peer_privileged;
    p.out = &hd_reply_conn_ops;
    p.data = c;
    hd_session *s = hd_dispatch_session_new(&p, &conn_ops);
    if (!s)
        return -1;
    hd_conn_set_data(c, s);
    return 0;
}

static void on_closed(void *arg, hd_conn *c)
{
    hd_dispatch_closed(arg, hd_conn_data(c));
    hd_conn_set_data(c, NULL);
}

static void on_stop(void *arg, hd_conn *c)
{
    (void)arg;
    hd_dispatch_stop(hd_conn_data(c));
}

static void on_frame(void *arg, hd_conn *c, const uint8_t *data, size_t len, size_t nfds)
{
    hd_dispatch_frame(arg, hd_conn_data(c), data, len, nfds);
}

/* ---- one frame in ------------------------------------------------------- */

static void handle_hello(hd_dispatch *d, hd_session *s, uint64_t id, const Heapd__Hello *m)
{
    if (m->version != HEAPD__CONST__PROTOCOL_VERSION) {
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_VERSION,
                      "protocol version %u is not supported: this heapd speaks version %d; use a libheapc "
                      "built from the same heapd release",
                      m->version, HEAPD__CONST__PROTOCOL_VERSION);
        s->ops->close_after_flush(&s->peer);
        return;
    }
    s->hello = true;
    s->ops->hello(&s->peer, id, d->backend);
}

/* The request in f, to the heap wing. */
/* ---- request rings (issue 16) ------------------------------------------- */

static void ring_setup(hd_dispatch *d, hd_session *s, uint64_t id)
{
    char err[256];
    hd_ring_setup su;
    if (!d->rings)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_STATE,
                      "request rings are off in heapd.conf (ring = off): send every request on the socket "
                      "(HEAPC_TRANSPORT=socket), or set ring = on and restart heapd");
    else if (s->ops != &conn_ops)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_STATE, "request rings are for socket connections only");
    else if (s->ring)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_STATE, "this connection already has a request ring");
    else if (hd_ring_open(d->rings, s, &s->ring, &su, err, sizeof err))
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "no request ring: %s; use the socket", err);
    else {
        hd_debug("pid %ld: request ring of %u slots of %u bytes", (long)s->peer.pid, su.nslots, su.slot_size);
        hd_reply_ring_setup(s->peer.data, id, &su);
    }
}

hd_ring *hd_dispatch_conn_ring(const hd_conn *c)
{
    const hd_session *s = hd_conn_data(c);
    return s ? s->ring : NULL;
}

static void handle_request(hd_dispatch *d, hd_session *s, const Heapd__Frame *f);

static void ring_corrupt(void *arg, hd_ring *r, void *data, const char *why)
{
    hd_session *s = data;
    log_ctx(s, NULL);
    hd_warn("pid %ld: its request ring is corrupt (%s): disconnecting it", (long)s->peer.pid, why);
    hd_peer_error(&s->peer, 0, HEAPD__ERR_CODE__ERR_PROTOCOL,
                  "heapd disconnected this client: its request ring is corrupt (%s); something in the client "
                  "wrote into the ring's memory, or libheapc and heapd are of different releases: check both, "
                  "then connect and attach again (HEAPC_TRANSPORT=socket avoids the ring)",
                  why);
    s->ops->close_after_flush(&s->peer);
    hd_log_ctx_set(NULL);
}

/* A request from s's ring: the same checks and heap-wing calls as a frame
 * from the socket; only Alloc, Free and Collect travel on a ring. */
static void ring_request(void *arg, hd_ring *r, void *data, uint64_t id, const uint8_t *p, size_t len)
{
    hd_dispatch *d = arg;
    hd_session *s = data;
    Heapd__Frame *f = heapd__frame__unpack(NULL, len, p);
    log_ctx(s, f);
    if (!f || f->id != id) {
        char why[160];
        snprintf(why, sizeof why, "request id %llu: %s", (unsigned long long)id,
                 f ? "the frame in the slot has another id" : "the slot holds no heapd.Frame");
        hd_ring_stop(r);
        ring_corrupt(d, r, s, why);
        goto out;
    }
    if (d->srv && hd_server_stopping(d->srv))
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_SHUTDOWN, "heapd is stopping; retry once it is back");
    else if (f->body_case != HEAPD__FRAME__BODY_ALLOC && f->body_case != HEAPD__FRAME__BODY_FREE &&
             f->body_case != HEAPD__FRAME__BODY_COLLECT)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_PROTOCOL,
                      "message type %d does not travel on a request ring (Alloc, Free and Collect do): send it "
                      "on the socket",
                      (int)f->body_case);
    else
        handle_request(d, s, f);
#ifdef HEAPD_DEBUG
    hd_heap_check(d->reg);
#endif
out:
    hd_log_ctx_set(NULL);
    if (f)
        heapd__frame__free_unpacked(f, NULL);
}

static const hd_ring_handlers ring_handlers = {.on_request = ring_request, .on_corrupt = ring_corrupt};

int hd_dispatch_rings(hd_dispatch *d, uv_loop_t *loop, const hd_ring_opts *opts)
{
    return hd_rings_create(loop, opts, &ring_handlers, d, &d->rings);
}

static void handle_request(hd_dispatch *d, hd_session *s, const Heapd__Frame *f)
{
    uint64_t id = f->id;
    hd_peer *p = &s->peer;
    switch (f->body_case) {
    case HEAPD__FRAME__BODY_HELLO:
        if (s->hello)
            hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "Hello was already sent on this connection");
        else
            handle_hello(d, s, id, f->hello);
        break;
    case HEAPD__FRAME__BODY_ATTACH:
        hd_heap_attach(d->reg, p, id, f->attach);
        break;
    case HEAPD__FRAME__BODY_ALLOC:
        hd_heap_alloc(d->reg, p, id, f->alloc);
        break;
    case HEAPD__FRAME__BODY_FREE:
        hd_heap_free(d->reg, p, id, f->free);
        break;
    case HEAPD__FRAME__BODY_COLLECT:
        hd_heap_collect(d->reg, p, id, f->collect);
        break;
    case HEAPD__FRAME__BODY_STATS:
        hd_heap_stats(d->reg, p, id, f->stats, d->backend, d->srv ? hd_server_clients(d->srv) : 0);
        break;
    case HEAPD__FRAME__BODY_FORCE_COLLECT:
        hd_heap_force_collect(d->reg, p, id, f->force_collect);
        break;
    case HEAPD__FRAME__BODY_DETACH:
        hd_heap_detach(d->reg, p, id);
        break;
    case HEAPD__FRAME__BODY_RING_SETUP:
        ring_setup(d, s, id);
        break;
    default:
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "message type %d is not a request heapd accepts",
                      (int)f->body_case);
        break;
    }
}

void hd_dispatch_frame(hd_dispatch *d, hd_session *s, const uint8_t *data, size_t len, size_t nfds)
{
    Heapd__Frame *f = heapd__frame__unpack(NULL, len, data);
    log_ctx(s, f);
    if (!f) {
        hd_peer_error(&s->peer, 0, HEAPD__ERR_CODE__ERR_PROTOCOL, "a %zu-byte frame is not a valid heapd.Frame message",
                      len);
        hd_log_ctx_set(NULL);
        return;
    }
    uint64_t id = f->id;
    if (nfds) {
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_PROTOCOL,
                      "clients send no file descriptors: %zu received with this message were closed", nfds);
        goto out;
    }
    const char *field;
    if (hd_pbstr_nul(&heapd__frame__descriptor, data, len, &field)) {
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "string field %s contains a NUL byte; heap names, jobs and other strings are UTF-8 text "
                      "without NUL",
                      field);
        goto out;
    }
    if (d->srv && hd_server_stopping(d->srv)) {
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_SHUTDOWN, "heapd is stopping; retry once it is back");
        goto out;
    }
    if (!s->hello && f->body_case != HEAPD__FRAME__BODY_HELLO) {
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "the first message must be Hello");
        goto out;
    }
    handle_request(d, s, f);
#ifdef HEAPD_DEBUG
    hd_heap_check(d->reg);
#endif
out:
    hd_log_ctx_set(NULL);
    heapd__frame__free_unpacked(f, NULL);
}

/* A connection the server refused: its one frame says which limit, with
 * the key that sets it. */
static void on_refuse(void *arg, hd_conn *c, hd_refusal why, uint64_t limit)
{
    (void)arg;
    /* No session: a peer for the one Error, through the connection's sink. */
    hd_peer p;
    memset(&p, 0, sizeof p);
    p.pid = hd_conn_pid(c);
    p.uid = hd_conn_uid(c);
    p.out = &hd_reply_conn_ops;
    p.data = c;
    if (why == HD_REFUSE_UID_CLIENTS)
        hd_peer_error(&p, 0, HEAPD__ERR_CODE__ERR_QUOTA,
                      "heapd refuses this connection: uid %ld already has %llu connections open, the limit per "
                      "uid (heapd.conf max_clients_per_uid = %llu); close idle connections, or ask the operator "
                      "to raise max_clients_per_uid",
                      (long)hd_conn_uid(c), (unsigned long long)limit, (unsigned long long)limit);
    else
        hd_peer_error(&p, 0, HEAPD__ERR_CODE__ERR_QUOTA,
                      "heapd refuses this connection: %llu connections are open, its limit (heapd.conf "
                      "max_clients = %llu); retry later, or ask the operator to raise max_clients",
                      (unsigned long long)limit, (unsigned long long)limit);
}

static const hd_server_handlers handlers = {
    .on_open = on_open,
    .on_frame = on_frame,
    .on_stop = on_stop,
    .on_closed = on_closed,
    .on_refuse = on_refuse,
};

const hd_server_handlers *hd_dispatch_handlers(void) { return &handlers; }
