/* frame_sink.h - where one client's frames go: an ops table and its
 * `void *data`, as libuv's streams and Redis's ae take a callback and a
 * pointer. Each transport is one sink: a socket connection
 * (server_sink.c: hd_conn_sink), a request ring in front of another sink
 * (ring_sink.c); a test's recording sink is one too. Every session
 * (dispatch.c) owns one, and reply.c sends every frame of that client
 * through it. Header only; it knows no message and no transport.
 *
 * What a sink promises to its caller:
 *   - send() never blocks and never calls back into its caller; pack(msg)
 *     is called at most once, during send(), and writes exactly `len` bytes;
 *   - the nfds fds given to send() are the sink's from then on (closed once
 *     sent, or when the client is gone), even when the frame cannot go out;
 *   - after close_after_flush() the client is heard no more: its transport
 *     closes once the frames already queued are out. */
#ifndef HEAPD_FRAME_SINK_H
#define HEAPD_FRAME_SINK_H

#include <stddef.h>
#include <stdint.h>

/* Writes a packed frame into `out` (from the message `msg`). The same type
 * as server.h's hd_pack_fn and ring.h's hd_ring_pack_fn. */
typedef void (*hd_frame_sink_pack_fn)(const void *msg, uint8_t *out);

typedef struct hd_frame_sink_ops {
    /* Queues the frame answering request `id` (0: unsolicited): `len` bytes
     * that pack(msg) writes, and nfds fds beside it. */
    void (*send)(void *data, uint64_t id, const void *msg, size_t len, hd_frame_sink_pack_fn pack, int *fds,
                 size_t nfds);
    /* The client passed its handshake (Hello): pre-Hello limits end. */
    void (*admit)(void *data);
    /* Read no more from the client; close once the queued frames are out. */
    void (*close_after_flush)(void *data);
} hd_frame_sink_ops;

/* Invariant: ops != NULL and its three functions are set. */
typedef struct hd_frame_sink {
    const hd_frame_sink_ops *ops;
    void *data;
} hd_frame_sink;

static inline void hd_frame_sink_send(const hd_frame_sink *s, uint64_t id, const void *msg, size_t len,
                                      hd_frame_sink_pack_fn pack, int *fds, size_t nfds)
{
    s->ops->send(s->data, id, msg, len, pack, fds, nfds);
}
static inline void hd_frame_sink_admit(const hd_frame_sink *s) { s->ops->admit(s->data); }
static inline void hd_frame_sink_close_after_flush(const hd_frame_sink *s) { s->ops->close_after_flush(s->data); }

#endif
