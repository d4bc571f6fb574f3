/* server.h - heapd's transport: the libuv loop, the Unix socket, framing,
 * protobuf decode/encode and fd passing for every client connection.
 *
 * What it promises to the heap layer (heap.c):
 *   - Requests reach it decoded, one at a time, on the loop thread.
 *   - hd_conn_send() queues a reply (never blocks); fds passed to it are owned
 *     by the server from then on (closed once sent or when the connection
 *     dies).
 *   - When a connection ends (EOF, error, broken framing, shutdown) the heap
 *     layer is told through hd_heap_conn_closed() before the connection is
 *     freed, and never hears of it again.
 * A client that sends a malformed frame is disconnected; one whose message is
 * not valid protobuf or not valid now gets an Error reply. */
#ifndef HEAPD_SERVER_H
#define HEAPD_SERVER_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "heapd.pb-c.h"

typedef struct hd_conn hd_conn;
typedef struct hd_server hd_server;
struct hd_registry;
struct hd_config;

/* What the heap layer keeps per connection. */
typedef struct hd_binding {
    struct hd_heap *heap;   /* NULL: not attached */
    uint32_t rank;
    const char *name;       /* the heap's name while heap != NULL (log fields) */
} hd_binding;

hd_binding *hd_conn_binding(hd_conn *c);
pid_t hd_conn_pid(const hd_conn *c);
uid_t hd_conn_uid(const hd_conn *c);
/* 1 if the peer is root or in group `gid` (primary or supplementary, read
 * from /proc/PID/status at connect time); gid < 0: only root. */
int hd_conn_privileged(const hd_conn *c, long gid);

/* Queues `f` (with f->id set by the caller) and its fds. */
void hd_conn_send(hd_conn *c, Heapd__Frame *f, int *fds, size_t nfds);
/* Queues an Error reply to request `id`. */
void hd_conn_error(hd_conn *c, uint64_t id, Heapd__ErrCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Creates the server: binds (or adopts the socket-activated fd), but does not
 * start accepting until hd_server_start. */
int hd_server_create(uv_loop_t *loop, const struct hd_config *cfg, struct hd_registry *reg,
                     const char *backend_name, hd_server **out, char *err, size_t errlen);
int hd_server_start(hd_server *s, char *err, size_t errlen);
/* Stops accepting, tells every client (ERR_SHUTDOWN), closes connections. */
void hd_server_shutdown(hd_server *s);
void hd_server_destroy(hd_server *s);
uint32_t hd_server_clients(const hd_server *s);
/* 1 if the listening socket came from systemd (LISTEN_FDS). */
int hd_server_socket_activated(const hd_server *s);

#endif
