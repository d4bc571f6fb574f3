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
 *   - Every complete frame a client sent is handled, pipelined or not: at
 *     most HD_FRAMES_PER_TURN per connection per loop turn (fairness), and
 *     no more once their replies reach HD_REPLY_BYTES_PER_TURN, the rest in
 *     the next turns, without waiting for more bytes.
 *   - Received fds are never closed on the loop thread: a client can pass a
 *     socket whose close() blocks (SO_LINGER with unsent data). They go to a
 *     small pool of closer threads, and count against their uid until closed.
 *   - Limits (hd_server_opts; heapd fills them from heapd.conf's keys of the
 *     same names, docs/operations.md): per uid (root exempt)
 *     max_clients_per_uid, max_fds_per_uid, max_queue_per_uid; per
 *     connection hello_timeout_ms, max_frame_before_hello (until
 *     hd_conn_admit), max_fds_per_conn, max_queue_per_conn; and max_clients.
 *     Fds of replies: max_queued_fds_per_conn / _per_uid pause reading,
 *     max_inflight_fds_per_conn / _per_uid hold sending until the peer
 *     reads; the kernel's ETOOMANYREFS (heapd's uid has RLIMIT_NOFILE fds
 *     in flight) is backpressure too: the send is retried, logged at warn,
 *     and never closes the connection that happened to send next.
 *     A refused connection hears why (on_refuse); a connection over a limit
 *     is closed with a logged reason. At EMFILE the server stops accepting
 *     and resumes when a connection closes (or after a second): no busy loop.
 * A client that sends a malformed frame is disconnected. */
#ifndef HEAPD_SERVER_H
#define HEAPD_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "frame_sink.h"

typedef struct hd_conn hd_conn;
typedef struct hd_server hd_server;

/* What the server needs to know: where it listens and its limits (see
 * above). The server reads no configuration file: its creator fills this. */
typedef struct hd_server_opts {
    char socket_path[108]; /* a sockaddr_un's sun_path */
    unsigned socket_mode;  /* permissions of the socket file */
    uint32_t max_clients;
    /* Connections beyond max_clients that only root and admin_gid's members
     * may open, so that an operator's heapctl gets in when tenants filled
     * max_clients (issue 33 item 6). admin_gid < 0: root only. */
    uint32_t admin_reserve;
    long admin_gid;
    uint32_t max_clients_per_uid;
    uint32_t max_fds_per_uid;
    uint64_t max_queue_per_uid;
    uint32_t hello_timeout_ms;
    uint32_t max_frame_before_hello;
    uint32_t max_fds_per_conn;
    uint64_t max_queue_per_conn;
    /* Fds of replies (issue 33 items 2, 3): reading a connection pauses
     * while its writer holds max_queued_fds_per_conn fds (dup()ed, open in
     * heapd), or its uid's max_queued_fds_per_uid; sending waits while more
     * than max_inflight_fds_per_conn (per uid: _per_uid) sent fds may not be
     * received yet (the kernel charges those to heapd's uid). */
    uint32_t max_queued_fds_per_conn, max_queued_fds_per_uid;
    uint32_t max_inflight_fds_per_conn, max_inflight_fds_per_uid;
} hd_server_opts;

/* Why a new connection is refused (on_refuse). */
typedef enum hd_refusal {
    HD_REFUSE_MAX_CLIENTS = 1, /* max_clients connections are open */
    HD_REFUSE_UID_CLIENTS = 2, /* its uid has max_clients_per_uid open */
} hd_refusal;

#define HD_FRAMES_PER_TURN 64
/* Issue 33 item 4: fairness counts cost too. A connection's frames stop for
 * this loop turn once their replies reach this many bytes (a Stats of a big
 * heap is ~20 KB; the rest wait on the busy list, as past
 * HD_FRAMES_PER_TURN). */
#define HD_REPLY_BYTES_PER_TURN (64u << 10)

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
    /* A connection refused before on_open (`limit` is the limit's value):
     * queue its one frame saying why (hd_conn_send); it is then closed. */
    void (*on_refuse)(void *arg, hd_conn *c, hd_refusal why, uint64_t limit);
} hd_server_handlers;

void *hd_conn_data(const hd_conn *c);
void hd_conn_set_data(hd_conn *c, void *data);
pid_t hd_conn_pid(const hd_conn *c);
uid_t hd_conn_uid(const hd_conn *c);
/* 1 if the peer is root or in group `gid` (primary or supplementary, as
 * the socket recorded them at connect: SO_PEERGROUPS, no /proc lookup);
 * gid < 0: only root. */
int hd_conn_privileged(const hd_conn *c, long gid);
/* The connection passed its handshake (Hello): the pre-Hello frame limit
 * and the Hello timeout no longer apply. */
void hd_conn_admit(hd_conn *c);

/* Writes a `len`-byte frame into `out` (from the message `msg`). */
typedef void (*hd_pack_fn)(const void *msg, uint8_t *out);
/* Queues a frame of `len` bytes that pack(msg) writes, and its fds. */
void hd_conn_send(hd_conn *c, const void *msg, size_t len, hd_pack_fn pack, int *fds, size_t nfds);
/* Reads no more frames; closes the connection once its queue is sent. */
void hd_conn_close_after_flush(hd_conn *c);
/* c as a frame sink (server_sink.c): hd_conn_send, hd_conn_admit and
 * hd_conn_close_after_flush; its data is c. */
hd_frame_sink hd_conn_sink(hd_conn *c);

/* Creates the server: binds (or adopts the socket-activated fd), but does not
 * start accepting until hd_server_start. */
int hd_server_create(uv_loop_t *loop, const hd_server_opts *opts, const hd_server_handlers *handlers, void *arg,
                     hd_server **out, char *err, size_t errlen);
int hd_server_start(hd_server *s, char *err, size_t errlen);
/* The limits of opts apply from now on (SIGHUP); socket_path, socket_mode
 * and max_clients stay as they were created. */
void hd_server_set_opts(hd_server *s, const hd_server_opts *opts);
/* Stops accepting, lets every client hear why (on_stop), closes connections. */
void hd_server_shutdown(hd_server *s);
/* After hd_server_shutdown and a uv_run that closed the connections: stops
 * the closer threads and closes the server's handles; the server is freed by
 * the last close callback, so run the loop once more (uv_run) before
 * uv_loop_close. */
void hd_server_destroy(hd_server *s);
uint32_t hd_server_clients(const hd_server *s);
/* 1 once hd_server_shutdown was called. */
int hd_server_stopping(const hd_server *s);
/* 1 if the listening socket came from systemd (LISTEN_FDS). */
int hd_server_socket_activated(const hd_server *s);

#endif
