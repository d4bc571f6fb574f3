/* server_int.h - what the server's files share (server.c: connections,
 * reading, writing, lifetime; server_accept.c: accepting, per uid use and
 * limits, the Hello sweep). Not for other modules: server.h is the API. */
#ifndef HEAPD_SERVER_INT_H
#define HEAPD_SERVER_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "closer.h"
#include "server.h"
#include "wire.h"

/* Reading a connection pauses while this much is queued for it
 * (backpressure); max_queue_per_conn closes it. */
#define HD_CONN_PAUSE_QUEUED (256u << 10)
/* malloc_trim once this many bytes were freed since the last trim. */
#define HD_TRIM_BYTES  (8u << 20)
#define HD_UID_BUCKETS 64
/* Refusals and limit disconnects logged per second; the rest are counted. */
#define HD_LIMIT_LOGS_PER_S 10

/* Per uid use (limits; root has no entry). Invariant: held, queued and
 * qfds are the sums over the uid's open connections (c->held, c->queued,
 * c->qfds); conns and inflight those over its open connections and its
 * draining sockets (hd_drain); closing counts its fds the closer threads
 * have not closed yet; an entry whose counts are all 0 is freed; paused =>
 * held + closing >= max_fds_per_uid when it was set, and none of its
 * connections is read; qfds >= max_queued_fds_per_uid => none is read. */
typedef struct hd_uid {
    uid_t uid;
    uint32_t conns;
    size_t held, closing;
    size_t queued;
    size_t qfds;     /* fds queued in its connections' writers (open in heapd) */
    size_t inflight; /* fds sent to it that it may not have received */
    bool paused;
    struct hd_uid *next;
} hd_uid;

/* A closed connection whose socket still has fds in flight (the peer did
 * not read them): kept open, and counted against its uid (conns,
 * inflight), until the peer reads or closes (server_fds.c). */
typedef struct hd_drain {
    int fd;
    hd_uid *u;
    size_t inflight;
    struct hd_drain *next;
} hd_drain;

/* Invariants: on the server's list <=> not yet closed; dead => on the close
 * list, no more frames are read or sent; poll events == READABLE iff it may
 * read (conn_may_read), else DISCONNECT, plus WRITABLE iff the writer has
 * pending frames;
 * on_busy <=> on the server's busy list (frames may wait in its reader);
 * u == NULL iff uid 0 or refused. */
struct hd_conn {
    uv_poll_t poll;
    int fd;
    hd_server *srv;
    hw_reader rd;
    hw_writer wr;
    bool dead, close_after_flush, admitted, refused, on_busy;
    bool stalled;     /* fds wait for the in-flight budget or ETOOMANYREFS */
    bool refs_logged; /* this stall's ETOOMANYREFS was logged */
    int events;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    gid_t *groups; /* supplementary groups at connect time */
    int ngroups;
    hd_uid *u;
    size_t held, queued;  /* what u counts of this connection */
    size_t turn_bytes;    /* replies queued since its frames' turn began */
    size_t qfds;          /* fds queued in wr (u counts them) */
    size_t inflight;      /* fds sent, maybe not received (u counts them) */
    uint64_t opened_ms;   /* uv_now at accept */
    void *data;           /* the handlers' */
    hd_conn *next, *prev; /* server's list */
    hd_conn *next_dead, *next_busy;
};

struct hd_server {
    uv_loop_t *loop;
    hd_server_opts opts;
    hd_server_handlers h;
    void *arg;
    int lfd;
    bool activated, listening, shutting, accept_paused, destroyed;
    uv_poll_t lpoll;
    uv_idle_t idle;    /* closes dead connections, reads busy ones */
    uv_timer_t sweep;  /* Hello timeouts, malloc_trim */
    uv_timer_t resume; /* accepting again after EMFILE */
    uv_timer_t stall;  /* retries stalled fd sends (server_fds.c) */
    hd_drain *drains;
    hd_closer *closer;       /* NULL: no thread started (closes inline) */
    uv_async_t closer_async; /* closed fds to account */
    bool async_open;
    int handles_open; /* handles hd_server_destroy waits for */
    hd_conn *conns, *dead, *busy;
    uint32_t nconns;
    hd_uid *uids[HD_UID_BUCKETS];
    size_t freed;        /* bytes freed since the last malloc_trim */
    uint64_t log_window; /* second of the last limit log */
    unsigned logs, suppressed;
};

/* server_accept.c */
int hd_server_limit_log_ok(hd_server *s);
hd_uid **hd_server_uid_slot(hd_server *s, uid_t uid);
hd_uid *hd_server_uid_get(hd_server *s, uid_t uid);
void hd_server_uid_check(hd_server *s, hd_uid *u);
void hd_server_accept_cb(uv_poll_t *p, int status, int events);
void hd_server_accept_resume(hd_server *s);
void hd_server_sweep_cb(uv_timer_t *t);
uint64_t hd_server_sweep_period(const hd_server_opts *opts);

/* server_fds.c: fds queued and in flight */
void hd_server_fds_before_flush(hd_conn *c);
void hd_server_fds_after_flush(hd_conn *c, size_t sent, int refused);
int hd_server_fds_close(hd_conn *c);
void hd_server_fds_sweep(hd_server *s);
void hd_server_fds_stop(hd_server *s);

/* server.c */
void hd_server_conn_flush(hd_conn *c);
void hd_server_conn_poll_cb(uv_poll_t *p, int status, int events);
void hd_server_conn_resume(hd_conn *c);
void hd_server_conn_kill_limit(hd_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hd_server_conn_close_fd(int fd, void *arg);
void hd_server_close_received(hd_server *s, int fd, uid_t uid);

#endif
