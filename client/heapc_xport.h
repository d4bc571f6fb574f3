/* heapc_xport.h - libheapc's transport interface (issue 26), private to
 * libheapc. Prefix hcx_.
 *
 * hci_rpc (heapc.c) talks to heapd through a transport: a table of
 * operations (hcx_ops) and its `void *data`. Two implement it:
 *   - the socket (heapc_sock.c): every request, the replies that carry fds
 *     (ChunkBatch frames included), heapd's unsolicited frames;
 *   - the request ring (heapc_ring.c, issue 16): Alloc, Free and Collect that
 *     fit a slot. It wraps the socket, which it is given as an hcx: a reply
 *     heapd sends on the socket (a "fetch it on the socket" marker in the
 *     ring, or a frame the socket has while the ring is quiet: heapd's last
 *     words, a hang-up) is read through the socket's operations.
 * A transport never calls up into heapc.c: a failure comes back as an HCX_E*
 * code with a sentence (hcx_err), which hci_rpc turns into the context's
 * error, closing the connection where the code says so. A third transport is
 * one file and one hcx_ops. */
#ifndef HEAPC_XPORT_H
#define HEAPC_XPORT_H

#include <stddef.h>
#include <stdint.h>

#include "heapd.pb-c.h"
#include "wire.h"

/* Results of the operations. Every error but HCX_ETOOBIG leaves the
 * connection in an unknown state: hci_rpc closes it. */
enum {
    HCX_OK = 0,
    HCX_ECLOSED = -1,  /* heapd closed the connection (EOF, EPIPE, ECONNRESET, a frame cut short) */
    HCX_ETOOBIG = -2,  /* the request is too large to send (why says how); nothing was sent */
    HCX_ETIMEOUT = -3, /* no reply within timeout_ms */
    HCX_EIO = -4,      /* the transport failed (why says how) */
    HCX_EDECODE = -5,  /* heapd's bytes are not a heapd.Frame */
    HCX_EPROTO = -6,   /* the ring broke its invariants (why says how) */
    HCX_ESTALL = -7,   /* a frame begun and not finished within the socket's stall limit */
};

/* What went wrong, for hci_rpc's sentence. */
typedef struct hcx_err {
    int ring;      /* 1: on the request ring (else on the socket) */
    char why[256]; /* the lower layer's sentence, "" when it has none */
} hcx_err;

typedef struct hcx_ops {
    /* 1 if the transport carries this request (body, len packed bytes, nfds
     * fds to pass). NULL: it carries every request. */
    int (*carries)(void *data, Heapd__Frame__BodyCase body, size_t len, size_t nfds);
    /* Sends request `id`: buf holds its packed heapd.Frame (len bytes), fds
     * go with it (not taken). */
    int (*send)(void *data, uint64_t id, const void *buf, size_t len, const int *fds, size_t nfds, hcx_err *e);
    /* Waits (timeout_ms < 0: no limit) for the next frame of request `id` or
     * an unsolicited one (hcx_for); frames of earlier requests are dropped.
     * HCX_OK: *m is decoded and *raw holds its fds (the caller frees both);
     * on error both are empty. Called again for the rest of a reply that
     * comes in several frames (ChunkBatch). */
    int (*await)(void *data, uint64_t id, int timeout_ms, Heapd__Frame **m, hw_frame *raw, hcx_err *e);
    /* The next frame, whatever its id (as await; NULL where not offered):
     * what a transport that wraps this one reads when `readable` says so. */
    int (*next)(void *data, int timeout_ms, Heapd__Frame **m, hw_frame *raw, hcx_err *e);
    /* 1 if heapd sent something (or hung up) that `next` reads now; never
     * waits. NULL where not offered. */
    int (*readable)(void *data);
} hcx_ops;

/* A transport: its operations and their data. */
typedef struct hcx {
    const hcx_ops *ops;
    void *data;
} hcx;

/* 1 if m belongs to request id: its reply (or a part of it), or an
 * unsolicited Error (id 0: heapd says why it closes the connection). */
static inline int hcx_for(const Heapd__Frame *m, uint64_t id)
{
    return m->id == id || (m->id == 0 && m->body_case == HEAPD__FRAME__BODY_ERROR && m->error);
}

#endif
