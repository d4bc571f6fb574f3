/* ring_sink.h - "the ring first, else the socket with a marker" as a frame
 * sink (frame_sink.h) in front of another one, the client's socket: an
 * answer to an unanswered request of the ring goes into its response slot;
 * one that carries fds or does not fit a slot leaves the ring's
 * "on the socket" marker (HR_KIND_SOCKET) and goes to `next`, as does every
 * other frame (unsolicited ones, answers to socket requests). Admitting and
 * closing are next's. A stopped ring swallows the answers to its requests
 * (hd_ring_answer). */
#ifndef HEAPD_RING_SINK_H
#define HEAPD_RING_SINK_H

#include "frame_sink.h"
#include "ring.h"

/* Invariant: ring != NULL; next is a sink (not this one). */
typedef struct hd_ring_sink {
    hd_ring *ring;
    hd_frame_sink next;
} hd_ring_sink;

/* Sets rs up over ring r in front of next; returns the sink to send
 * through (its data is rs, which must outlive it). */
hd_frame_sink hd_ring_sink_init(hd_ring_sink *rs, hd_ring *r, hd_frame_sink next);

#endif
