/* dispatch.c - one frame in (see dispatch.h). */
#include "dispatch.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "heapd.pb-c.h"
#include "log.h"
#include "pbstr.h"
#include "reply.h"
#include "ring.h"
#include "ring_sink.h"

struct hd_dispatch {
    hd_registry *reg;
    hd_server *srv;
    char backend[16];
    hd_rings *rings; /* NULL: rings are off (heapd.conf ring = off) */
};

/* Per client. Invariants (session_check): peer.bind.heap != NULL => hello;
 * peer.out == &hd_reply_frame_ops and peer.data == &out (reply.c sends
 * through out); ring == NULL => out == the transport's sink (tdata is its
 * data); ring != NULL => out.data == &rsink, rsink.ring == ring and
 * rsink.next is the transport's sink; ring != NULL => rings && hello. */
struct hd_session {
    hd_peer peer; /* first: session_privileged finds the session from it */
    hd_frame_sink out;
    int (*privileged)(void *data, long gid);
    void *tdata;
    bool rings, hello;
    hd_ring *ring; /* issue 16: its request ring, or NULL */
    hd_ring_sink rsink;
};

static int session_privileged(const hd_peer *p, long gid)
{
    const hd_session *s = (const hd_session *)p;
    return s->privileged && s->privileged(s->tdata, gid);
}

hd_session *hd_dispatch_session_new(const hd_client *c)
{
    hd_session *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->out = c->sink;
    s->privileged = c->privileged;
    s->tdata = c->sink.data;
    s->rings = c->rings;
    s->peer.pid = c->pid;
    s->peer.uid = c->uid;
    s->peer.privileged = session_privileged;
    s->peer.out = &hd_reply_frame_ops;
    s->peer.data = &s->out;
    return s;
}

hd_peer *hd_dispatch_session_peer(hd_session *s) { return &s->peer; }

#ifdef HEAPD_DEBUG
static void session_check(const hd_session *s)
{
    const char *why = NULL;
    if (s->peer.bind.heap && !s->hello)
        why = "bound to a heap before Hello";
    else if (s->peer.out != &hd_reply_frame_ops || s->peer.data != &s->out)
        why = "its peer does not send through its sink";
    else if (!s->ring && s->out.data != s->tdata)
        why = "no ring, but its sink is not the transport's";
    else if (s->ring && (s->out.data != &s->rsink || s->rsink.ring != s->ring || s->rsink.next.data != s->tdata))
        why = "a ring, but its sink is not the ring's in front of the transport's";
    else if (s->ring && !(s->rings && s->hello))
        why = "a ring on a transport without rings, or before Hello";
    if (why) {
        fprintf(stderr, "heapd: session of pid %ld: %s\n", (long)s->peer.pid, why);
        abort();
    }
}
#endif

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
        else if (f->body_case == HEAPD__FRAME__BODY_COMMIT && f->commit)
            x.seq = (long long)f->commit->seq;
        else if (f->body_case == HEAPD__FRAME__BODY_ATTACH && f->attach) {
            x.heap = f->attach->heap;
            x.rank = (long)f->attach->rank;
        } else if (f->body_case == HEAPD__FRAME__BODY_FORCE_COLLECT && f->force_collect)
            x.heap = f->force_collect->heap;
        else if (f->body_case == HEAPD__FRAME__BODY_DROP && f->drop)
            x.heap = f->drop->heap;
    }
    hd_log_ctx_set(&x);
}

void hd_dispatch_closed(hd_dispatch *d, hd_session *s)
{
    log_ctx(s, NULL);
    hd_heap_touch(d->reg, &s->peer, NULL);
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

/* ---- request rings (issue 16) ------------------------------------------- */

/* s's ring broke (why: for people): it serves nothing more, and the client
 * is told and disconnected. */
static void ring_broken(hd_session *s, const char *why)
{
    hd_ring_stop(s->ring);
    log_ctx(s, NULL);
    hd_warn("pid %ld: its request ring is corrupt (%s): disconnecting it", (long)s->peer.pid, why);
    hd_peer_error(&s->peer, 0, HEAPD__ERR_CODE__ERR_PROTOCOL,
                  "heapd disconnected this client: its request ring is corrupt (%s); something in the client "
                  "wrote into the ring's memory, or libheapc and heapd are of different releases: check both, "
                  "then connect and attach again (HEAPC_TRANSPORT=socket avoids the ring)",
                  why);
    hd_frame_sink_close_after_flush(&s->out);
    hd_log_ctx_set(NULL);
}

static void ring_setup(hd_dispatch *d, hd_session *s, uint64_t id)
{
    char err[256];
    hd_ring_setup su;
    hd_ring *r;
    if (!d->rings)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_STATE,
                      "request rings are off in heapd.conf (ring = off): send every request on the socket "
                      "(HEAPC_TRANSPORT=socket), or set ring = on and restart heapd");
    else if (!s->rings)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_STATE, "request rings are for socket connections only");
    else if (s->ring)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_STATE, "this connection already has a request ring");
    else if (hd_ring_open(d->rings, s, &r, &su, err, sizeof err))
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "no request ring: %s; use the socket", err);
    else if (hd_ring_set_account(r, (uint32_t)s->peer.uid)) {
        hd_ring_close(r);
        close(su.memfd);
        close(su.doorbell);
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_NO_MEMORY, "no request ring: heapd is out of memory");
    } else {
        hd_debug("pid %ld: request ring of %u slots of %u bytes", (long)s->peer.pid, su.nslots, su.slot_size);
        /* From now on the ring's answers go into it, the rest to the
         * transport (the setup's reply too: its id is no ring request). */
        s->ring = r;
        s->out = hd_ring_sink_init(&s->rsink, r, s->out);
        hd_reply_ring_setup(&s->out, id, &su);
    }
}

static void ring_request(void *arg, hd_ring *r, void *data, uint64_t id, const uint8_t *p, size_t len)
{
    (void)r;
    hd_frame_in in = {.via = HD_VIA_RING, .slot_id = id, .data = p, .len = len};
    hd_dispatch_frame(arg, data, &in);
}

static void ring_corrupt(void *arg, hd_ring *r, void *data, const char *why)
{
    (void)arg, (void)r;
    ring_broken(data, why);
}

static const hd_ring_handlers ring_handlers = {.on_request = ring_request, .on_corrupt = ring_corrupt};

int hd_dispatch_rings(hd_dispatch *d, uv_loop_t *loop, const hd_ring_opts *opts)
{
    return hd_rings_create(loop, opts, &ring_handlers, d, &d->rings);
}

/* ---- one frame in ------------------------------------------------------- */

static void handle_hello(hd_dispatch *d, hd_session *s, uint64_t id, const Heapd__Hello *m)
{
    if (m->version != HEAPD__CONST__PROTOCOL_VERSION) {
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_VERSION,
                      "protocol version %u is not supported: this heapd speaks version %d; use a libheapc "
                      "built from the same heapd release",
                      m->version, HEAPD__CONST__PROTOCOL_VERSION);
        hd_frame_sink_close_after_flush(&s->out);
        return;
    }
    s->hello = true;
    /* The pre-Hello limits end, then the reply. */
    hd_frame_sink_admit(&s->out);
    hd_reply_hello(&s->out, id, d->backend);
}

/* Issue 33 item 4: a request that may change a heap makes its Stats memo
 * stale (heap.h, hd_heap_touch), before the wing handles it (after, the
 * heap may be gone). */
static void touch_heap(hd_dispatch *d, hd_session *s, const Heapd__Frame *f)
{
    switch (f->body_case) {
    case HEAPD__FRAME__BODY_HELLO:
    case HEAPD__FRAME__BODY_STATS:
    case HEAPD__FRAME__BODY_RING_SETUP:
        break;
    case HEAPD__FRAME__BODY_ATTACH:
        hd_heap_touch(d->reg, &s->peer, f->attach->heap);
        hd_heap_touch(d->reg, &s->peer, NULL);
        break;
    case HEAPD__FRAME__BODY_FORCE_COLLECT:
        hd_heap_touch(d->reg, &s->peer, f->force_collect->heap);
        break;
    case HEAPD__FRAME__BODY_DROP:
        hd_heap_touch(d->reg, &s->peer, f->drop->heap);
        break;
    default:
        hd_heap_touch(d->reg, &s->peer, NULL);
        break;
    }
}

/* The request in f, to the heap wing (or to dispatch: Hello, RingSetup). */
static void handle_request(hd_dispatch *d, hd_session *s, const Heapd__Frame *f)
{
    uint64_t id = f->id;
    hd_peer *p = &s->peer;
    touch_heap(d, s, f);
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
    case HEAPD__FRAME__BODY_DROP:
        hd_heap_drop(d->reg, p, id, f->drop);
        break;
    case HEAPD__FRAME__BODY_COMMIT:
        hd_heap_commit(d->reg, p, id, f->commit);
        break;
    case HEAPD__FRAME__BODY_RELEASE:
        hd_heap_release(d->reg, p, id, f->release);
        break;
    case HEAPD__FRAME__BODY_RESTORE:
        hd_heap_restore(d->reg, p, id, f->restore);
        break;
    case HEAPD__FRAME__BODY_TRIM:
        hd_heap_trim(d->reg, p, id, f->trim);
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

static bool ring_carries(Heapd__Frame__BodyCase bc)
{
    return bc == HEAPD__FRAME__BODY_ALLOC || bc == HEAPD__FRAME__BODY_FREE || bc == HEAPD__FRAME__BODY_COLLECT;
}

/* A ring's request with a string: an Alloc with a name (issue 29; absent,
 * it is protobuf-c's empty default). */
static bool ring_has_string(const Heapd__Frame *f)
{
    return f->body_case == HEAPD__FRAME__BODY_ALLOC && f->alloc->name != protobuf_c_empty_string;
}

/* Every check a frame passes before it is handled, in one place: true when
 * f (NULL: it did not decode) may be handled; else it was answered (or its
 * ring broken). NULs in strings: what a ring carries (ring_carries) has no
 * string field but Alloc.name (tests/check_dispatch.c checks), so only a
 * stream's frames and named Allocs are walked, and the ring's other
 * requests do not pay for it. */
static bool frame_admissible(hd_dispatch *d, hd_session *s, const hd_frame_in *in, const Heapd__Frame *f)
{
    bool ring = in->via == HD_VIA_RING;
    if (ring && (!f || f->id != in->slot_id)) {
        char why[160];
        snprintf(why, sizeof why, "request id %llu: %s", (unsigned long long)in->slot_id,
                 f ? "the frame in the slot has another id" : "the slot holds no heapd.Frame");
        ring_broken(s, why);
        return false;
    }
    if (!f) {
        hd_peer_error(&s->peer, 0, HEAPD__ERR_CODE__ERR_PROTOCOL, "a %zu-byte frame is not a valid heapd.Frame message",
                      in->len);
        return false;
    }
    uint64_t id = f->id;
    const char *field;
    if (in->nfds)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_PROTOCOL,
                      "clients send no file descriptors: %zu received with this message were closed", in->nfds);
    else if ((!ring || ring_has_string(f)) && hd_pbstr_nul(&heapd__frame__descriptor, in->data, in->len, &field))
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_INVALID,
                      "string field %s contains a NUL byte; heap names, jobs and other strings are UTF-8 text "
                      "without NUL",
                      field);
    else if (d->srv && hd_server_stopping(d->srv))
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_SHUTDOWN, "heapd is stopping; retry once it is back");
    else if (!s->hello && f->body_case != HEAPD__FRAME__BODY_HELLO)
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_PROTOCOL, "the first message must be Hello");
    else if (ring && !ring_carries(f->body_case))
        hd_peer_error(&s->peer, id, HEAPD__ERR_CODE__ERR_PROTOCOL,
                      "message type %d does not travel on a request ring (Alloc, Free and Collect do): send it "
                      "on the socket",
                      (int)f->body_case);
    else
        return true;
    return false;
}

void hd_dispatch_frame(hd_dispatch *d, hd_session *s, const hd_frame_in *in)
{
    Heapd__Frame *f = heapd__frame__unpack(NULL, in->len, in->data);
    log_ctx(s, f);
    if (frame_admissible(d, s, in, f)) {
        handle_request(d, s, f);
#ifdef HEAPD_DEBUG
        hd_heap_check(d->reg);
        session_check(s);
#endif
    }
    hd_log_ctx_set(NULL);
    if (f)
        heapd__frame__free_unpacked(f, NULL);
}

/* ---- the server's connections ------------------------------------------ */

static int conn_privileged(void *data, long gid) { return hd_conn_privileged(data, gid); }

static int on_open(void *arg, hd_conn *c)
{
    (void)arg;
    hd_client cl = {.pid = hd_conn_pid(c),
                    .uid = hd_conn_uid(c),
                    .privileged = conn_privileged,
                    .sink = hd_conn_sink(c),
                    .rings = true};
    hd_session *s = hd_dispatch_session_new(&cl);
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
    hd_frame_in in = {.via = HD_VIA_STREAM, .data = data, .len = len, .nfds = nfds};
    hd_dispatch_frame(arg, hd_conn_data(c), &in);
}

/* A connection the server refused: its one frame says which limit, with
 * the key that sets it. */
static void on_refuse(void *arg, hd_conn *c, hd_refusal why, uint64_t limit)
{
    (void)arg;
    /* No session: a peer for the one Error, through the connection's sink. */
    hd_frame_sink out = hd_conn_sink(c);
    hd_peer p;
    memset(&p, 0, sizeof p);
    p.pid = hd_conn_pid(c);
    p.uid = hd_conn_uid(c);
    p.out = &hd_reply_frame_ops;
    p.data = &out;
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
