/* dispatch.h - one frame in: decode it, check it against the client's
 * state, and hand the request to the heap wing. It owns the per-client
 * state, a session: the heap wing's peer, the frame sink its replies go
 * through (reply.c builds them), and its request ring.
 *
 * Every frame of every transport enters through hd_dispatch_frame, the one
 * place of every check: a frame that does not decode, fds sent along, NULs
 * in strings (pbstr.h), heapd stopping, Hello first, and what a request ring
 * may carry. The server's connections come through hd_dispatch_handlers and
 * the rings through hd_dispatch_rings; any other transport (a test,
 * tests/fuzz/fuzz_dispatch.c, a third transport) makes a session with its
 * own sink (hd_dispatch_session_new) and feeds it frames. */
#ifndef HEAPD_DISPATCH_H
#define HEAPD_DISPATCH_H

#include <stdbool.h>

#include "frame_sink.h"
#include "heap.h"
#include "server.h"

typedef struct hd_dispatch hd_dispatch;
typedef struct hd_session hd_session;

/* A client as its transport knows it. */
typedef struct hd_client {
    pid_t pid;
    uid_t uid;
    /* 1 if the client is root or in group `gid` (gid < 0: only root);
     * data is sink.data. */
    int (*privileged)(void *data, long gid);
    hd_frame_sink sink; /* where its frames go */
    bool rings;         /* its sink passes fds: it may set up a request ring */
} hd_client;

/* How a frame reached heapd. */
typedef enum hd_via {
    /* The client's own transport (a socket): any request, Hello first. */
    HD_VIA_STREAM = 0,
    /* The session's request ring: Alloc, Free and Collect only; a slot that
     * holds no Frame, or one whose id is not the slot's, breaks the ring:
     * the client is disconnected. */
    HD_VIA_RING = 1,
} hd_via;

/* One frame from a client. */
typedef struct hd_frame_in {
    hd_via via;
    uint64_t slot_id; /* HD_VIA_RING: the id its slot carries */
    const uint8_t *data;
    size_t len;
    size_t nfds; /* fds that came with it (already closed by the transport) */
} hd_frame_in;

int hd_dispatch_create(hd_registry *reg, const char *backend_name, hd_dispatch **out);
/* The handlers to create the server with (arg: the dispatch). */
const hd_server_handlers *hd_dispatch_handlers(void);
/* The server the frames come from (its client count goes into Stats, its
 * stopping refuses requests). */
void hd_dispatch_set_server(hd_dispatch *d, hd_server *s);
void hd_dispatch_destroy(hd_dispatch *d);

/* A session for client c (copied). NULL when out of memory. */
hd_session *hd_dispatch_session_new(const hd_client *c);
hd_peer *hd_dispatch_session_peer(hd_session *s);
/* One frame from s's client. Without a server (none set) heapd is never
 * stopping and Stats counts 0 clients. */
void hd_dispatch_frame(hd_dispatch *d, hd_session *s, const hd_frame_in *in);
/* heapd is stopping: the unsolicited ERR_SHUTDOWN to s's client. */
void hd_dispatch_stop(hd_session *s);
/* s's client is gone: the heap wing detaches it, its ring is closed; s is
 * freed. */
void hd_dispatch_closed(hd_dispatch *d, hd_session *s);

/* Issue 16: serve request rings (RingSetup) with opts' budgets (without
 * this call RingSetup is refused: heapd.conf's ring = off). 0, or -1 when
 * out of memory. */
struct hd_ring_opts;
int hd_dispatch_rings(hd_dispatch *d, uv_loop_t *loop, const struct hd_ring_opts *opts);

#endif
