/* reply.h - every message heapd sends, built in one place: the only daemon
 * file that builds a Heapd__Frame (reply.c). Each frame leaves through a
 * frame sink (frame_sink.h): the one the client's session owns (dispatch.c),
 * so reply knows no transport, no session and nothing above it.
 *
 * A reply whose chunks need more fds than one frame carries (HW_FDS_MAX)
 * goes out as ChunkBatch frames with the request's id, then the reply
 * (docs/protocol.md). */
#ifndef HEAPD_REPLY_H
#define HEAPD_REPLY_H

#include <stdint.h>

#include "frame_sink.h"
#include "heap.h"
#include "heapd.pb-c.h"

/* The heap wing's reply sink in frames: a peer's data is the
 * `const hd_frame_sink *` its frames go through. Errors go through it too:
 * hd_peer_error (heap.h) formats them. */
extern const hd_reply_ops hd_reply_frame_ops;

/* The HelloReply. */
void hd_reply_hello(const hd_frame_sink *out, uint64_t id, const char *backend);
/* The RingSetupReply with the ring's two fds (issue 16). */
struct hd_ring_setup;
void hd_reply_ring_setup(const hd_frame_sink *out, uint64_t id, const struct hd_ring_setup *su);

#endif
