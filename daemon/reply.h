/* reply.h - every message heapd sends, built in one place: the only daemon
 * file that builds a Heapd__Frame (reply.c). Requests come in through
 * dispatch.c; the heap wing answers through hd_reply_conn_ops. */
#ifndef HEAPD_REPLY_H
#define HEAPD_REPLY_H

#include <stdint.h>

#include "heap.h"
#include "heapd.pb-c.h"
#include "server.h"

/* The heap wing's reply sink over a connection: a peer's data is its
 * hd_conn. */
extern const hd_reply_ops hd_reply_conn_ops;

/* Errors go through the sink: hd_peer_error (heap.h) formats them. */
/* Queues the HelloReply. */
void hd_reply_hello(hd_conn *c, uint64_t id, const char *backend);
/* Queues the RingSetupReply with the ring's fds (issue 16). */
struct hd_ring_setup;
void hd_reply_ring_setup(hd_conn *c, uint64_t id, const struct hd_ring_setup *su);

#endif
