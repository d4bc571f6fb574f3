/* dispatch.h - one frame in: decode it, check the client's state (Hello
 * first, heapd stopping), and hand the request to the heap wing. It owns the
 * per-client state, a session (the server's `void *data` per connection):
 * the heap wing's peer and how the client's transport sends a HelloReply and
 * closes. The server's connections come through hd_dispatch_handlers; a
 * client that is no connection (tests/fuzz/fuzz_dispatch.c) through
 * hd_dispatch_session_new and hd_dispatch_frame, with its own sink. */
#ifndef HEAPD_DISPATCH_H
#define HEAPD_DISPATCH_H

#include "heap.h"
#include "server.h"

typedef struct hd_dispatch hd_dispatch;
typedef struct hd_session hd_session;

/* A client's transport beside the heap wing's sink (peer.out): the
 * HelloReply, and closing once the queued replies are out. */
typedef struct hd_client_ops {
    void (*hello)(hd_peer *p, uint64_t id, const char *backend);
    void (*close_after_flush)(hd_peer *p);
} hd_client_ops;

int hd_dispatch_create(hd_registry *reg, const char *backend_name, hd_dispatch **out);
/* The handlers to create the server with (arg: the dispatch). */
const hd_server_handlers *hd_dispatch_handlers(void);
/* The server the frames come from (its client count goes into Stats). */
void hd_dispatch_set_server(hd_dispatch *d, hd_server *s);
void hd_dispatch_destroy(hd_dispatch *d);

/* A session for the client `p` (copied, its bind zeroed; p->out and
 * p->data are its sink's). NULL when out of memory. */
hd_session *hd_dispatch_session_new(const hd_peer *p, const hd_client_ops *ops);
hd_peer *hd_dispatch_session_peer(hd_session *s);
/* One frame of `len` bytes from s's client that came with nfds fds (already
 * closed by the transport). Without a server (none set) heapd is never
 * stopping and Stats counts 0 clients. */
void hd_dispatch_frame(hd_dispatch *d, hd_session *s, const uint8_t *data, size_t len, size_t nfds);
/* heapd is stopping: the unsolicited ERR_SHUTDOWN to s's client. */
void hd_dispatch_stop(hd_session *s);
/* s's client is gone: the heap wing detaches it; s is freed. */
void hd_dispatch_closed(hd_dispatch *d, hd_session *s);

/* Issue 16: serve request rings (RingSetup) with opts' budgets (without
 * this call RingSetup is refused: heapd.conf's ring = off). 0, or -1 when
 * out of memory. */
struct hd_ring;
struct hd_ring_opts;
int hd_dispatch_rings(hd_dispatch *d, uv_loop_t *loop, const struct hd_ring_opts *opts);
/* The request ring of connection c, or NULL (reply.c routes answers by it). */
struct hd_ring *hd_dispatch_conn_ring(const hd_conn *c);

#endif
