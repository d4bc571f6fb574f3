/* dispatch.h - one frame in: decode it, check the connection's state (Hello
 * first, heapd stopping), and hand the request to the heap wing. It owns the
 * per-connection state (the server's `void *data`): the heap wing's peer. */
#ifndef HEAPD_DISPATCH_H
#define HEAPD_DISPATCH_H

#include "heap.h"
#include "server.h"

typedef struct hd_dispatch hd_dispatch;

int hd_dispatch_create(hd_registry *reg, const char *backend_name, hd_dispatch **out);
/* The handlers to create the server with (arg: the dispatch). */
const hd_server_handlers *hd_dispatch_handlers(void);
/* The server the frames come from (its client count goes into Stats). */
void hd_dispatch_set_server(hd_dispatch *d, hd_server *s);
void hd_dispatch_destroy(hd_dispatch *d);

/* Issue 16: serve request rings (RingSetup) with cfg's budgets (none when
 * cfg->ring is 0). 0, or -1 when out of memory. */
struct hd_ring;
int hd_dispatch_rings(hd_dispatch *d, uv_loop_t *loop, const hd_config *cfg);
/* The request ring of connection c, or NULL (reply.c routes answers by it). */
struct hd_ring *hd_dispatch_conn_ring(const hd_conn *c);

#endif
