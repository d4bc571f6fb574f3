/* server.h - heapd's transport: the libuv loop's Unix socket, peer
 * credentials, framing (common/wire.h), send queues with backpressure, fd
 * passing and deferred close, for every client connection. It knows no
 * message: frames go up to the handlers whoever created the server gave
 * (dispatch.c), with a `void *data` per connection for them.
 *
 * What it promises to its user:
 *   - Frames reach on_frame one at a time, on the loop thread.
 *   - hd_conn_send() queues a frame (never blocks); fds passed to it are
 *     owned by the server from then on (closed once sent or when the
 *     connection dies).
 *   - on_closed is called once per connection that on_open accepted, when it
 *     ends (EOF, error, broken framing, shutdown), before it is freed; the
 *     user never hears of it again. A connection that fails is not closed in
 *     the middle of a handler: it is closed from an idle handle before the
 *     loop polls again.
 * A client that sends a malformed frame is disconnected. */
#ifndef HEAPD_SERVER_H
#define HEAPD_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

typedef struct hd_conn hd_conn;
typedef struct hd_server hd_server;
struct hd_config;

/* What the server calls; `arg` is hd_server_create's. */
typedef struct hd_server_handlers {
    /* A new connection: 0 to take it (set its data here), -1 to refuse. */
    int (*on_open)(void *arg, hd_conn *c);
    /* One frame of `len` bytes; `nfds` fds came with it (closed after the call). */
    void (*on_frame)(void *arg, hd_conn *c, const uint8_t *data, size_t len, size_t nfds);
    /* hd_server_shutdown: the connection's last words may be queued here. */
    void (*on_stop)(void *arg, hd_conn *c);
    /* The connection ends (see above). */
    void (*on_closed)(void *arg, hd_conn *c);
} hd_server_handlers;

void *hd_conn_data(const hd_conn *c);
void hd_conn_set_data(hd_conn *c, void *data);
pid_t hd_conn_pid(const hd_conn *c);
uid_t hd_conn_uid(const hd_conn *c);
/* 1 if the peer is root or in group `gid` (primary or supplementary, read
 * from /proc/PID/status at connect time); gid < 0: only root. */
int hd_conn_privileged(const hd_conn *c, long gid);

/* Writes a `len`-byte frame into `out` (from the message `msg`). */
typedef void (*hd_pack_fn)(const void *msg, uint8_t *out);
/* Queues a frame of `len` bytes that pack(msg) writes, and its fds. */
void hd_conn_send(hd_conn *c, const void *msg, size_t len, hd_pack_fn pack, int *fds, size_t nfds);
/* Reads no more frames; closes the connection once its queue is sent. */
void hd_conn_close_after_flush(hd_conn *c);

/* Creates the server: binds (or adopts the socket-activated fd), but does not
 * start accepting until hd_server_start. */
int hd_server_create(uv_loop_t *loop, const struct hd_config *cfg, const hd_server_handlers *handlers, void *arg,
                     hd_server **out, char *err, size_t errlen);
int hd_server_start(hd_server *s, char *err, size_t errlen);
/* Stops accepting, lets every client hear why (on_stop), closes connections. */
void hd_server_shutdown(hd_server *s);
void hd_server_destroy(hd_server *s);
uint32_t hd_server_clients(const hd_server *s);
/* 1 once hd_server_shutdown was called. */
int hd_server_stopping(const hd_server *s);
/* 1 if the listening socket came from systemd (LISTEN_FDS). */
int hd_server_socket_activated(const hd_server *s);

#endif
