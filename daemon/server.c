/* server.c - heapd's transport (see server.h); it includes no message
 * header: dispatch.c and reply.c speak protobuf.
 *
 * Each connection is a nonblocking Unix stream socket driven by a uv_poll_t
 * (libuv's streams cannot pass raw fds such as memfd or CUDA chunk fds), with
 * the framing of common/wire.h. Connections that fail are not closed in the
 * middle of heap code: they are marked dead and closed from an idle handle
 * before the loop polls again. */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "wire.h"

#define SD_LISTEN_FDS_START 3

/* Reading a connection pauses while this much is queued for it
 * (backpressure); max_queue_per_conn closes it. */
#define HD_CONN_PAUSE_QUEUED (256u << 10)
#define HD_CLOSER_THREADS 4
/* malloc_trim once this many bytes were freed since the last trim. */
#define HD_TRIM_BYTES (8u << 20)
#define HD_UID_BUCKETS 64
/* Refusals and limit disconnects logged per second; the rest are counted. */
#define HD_LIMIT_LOGS_PER_S 10

/* Per uid use (limits; root has no entry). Invariant: conns, held and
 * queued are the sums over the uid's open connections (c->held, c->queued);
 * closing counts its fds the closer threads have not closed yet; an entry
 * whose four counts are 0 is freed; paused => held + closing >=
 * max_fds_per_uid when it was set, and none of its connections is read. */
typedef struct hd_uid {
    uid_t uid;
    uint32_t conns;
    size_t held, closing;
    size_t queued;
    bool paused;
    struct hd_uid *next;
} hd_uid;

/* Invariants: on the server's list <=> not yet closed; dead => on the close
 * list, no more frames are read or sent; poll events == READABLE iff it may
 * read (conn_may_read), plus WRITABLE iff the writer has pending frames;
 * on_busy <=> on the server's busy list (frames may wait in its reader);
 * u == NULL iff uid 0 or refused. */
struct hd_conn {
    uv_poll_t poll;
    int fd;
    hd_server *srv;
    hw_reader rd;
    hw_writer wr;
    bool dead, close_after_flush, admitted, refused, on_busy;
    int events;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    gid_t *groups;              /* supplementary groups at connect time */
    int ngroups;
    hd_uid *u;
    size_t held, queued;        /* what u counts of this connection */
    uint64_t opened_ms;         /* uv_now at accept */
    void *data;                 /* the handlers' */
    hd_conn *next, *prev;       /* server's list */
    hd_conn *next_dead, *next_busy;
};

/* Closer threads: received fds are closed here, never on the loop. A close
 * can block for as long as the client chose (SO_LINGER), so: at most one
 * thread closes fds of a given uid at a time (a uid that blocks its thread
 * delays only its own fds; the others go to the other threads), and the
 * threads are detached: the last one to leave frees this (heapd's stop never
 * waits for a lingering close; exit closes without lingering).
 * Invariants (under mu): q[0..n) in arrival order; busy[i] is the uid thread
 * i closes for, or -1; alive threads reference this; after stop, no thread
 * touches the loop (async). */
typedef struct closer_item {
    int fd;
    uid_t uid;
} closer_item;

typedef struct hd_closer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    closer_item *q;
    size_t n, cap;
    long busy[HD_CLOSER_THREADS];
    uid_t *done;                /* closed, not yet accounted by the loop */
    size_t ndone, donecap;
    bool stop;
    int alive;
    uv_async_t *async;
} hd_closer;

typedef struct closer_arg {
    hd_closer *k;
    int slot;
} closer_arg;

struct hd_server {
    uv_loop_t *loop;
    hd_config cfg;
    hd_server_handlers h;
    void *arg;
    int lfd;
    bool activated, listening, shutting, accept_paused, destroyed;
    uv_poll_t lpoll;
    uv_idle_t idle;             /* closes dead connections, reads busy ones */
    uv_timer_t sweep;           /* Hello timeouts, malloc_trim */
    uv_timer_t resume;          /* accepting again after EMFILE */
    hd_closer *closer;
    uv_async_t closer_async;    /* closed fds to account */
    bool async_open;
    int handles_open;           /* handles hd_server_destroy waits for */
    hd_conn *conns, *dead, *busy;
    uint32_t nconns;
    hd_uid *uids[HD_UID_BUCKETS];
    size_t freed;               /* bytes freed since the last malloc_trim */
    uint64_t log_window;        /* second of the last limit log */
    unsigned logs, suppressed;
};

void *hd_conn_data(const hd_conn *c) { return c->data; }
void hd_conn_set_data(hd_conn *c, void *data) { c->data = data; }
pid_t hd_conn_pid(const hd_conn *c) { return c->pid; }
uid_t hd_conn_uid(const hd_conn *c) { return c->uid; }

int hd_conn_privileged(const hd_conn *c, long gid)
{
    if (c->uid == 0)
        return 1;
    if (gid < 0)
        return 0;
    if ((long)c->gid == gid)
        return 1;
    for (int i = 0; i < c->ngroups; i++)
        if ((long)c->groups[i] == gid)
            return 1;
    return 0;
}

/* Supplementary groups of a peer as the kernel recorded them at connect
 * (SO_PEERGROUPS, Linux 4.13): no /proc lookup, which ProtectProc=invisible
 * hides and a reused pid would answer wrongly. */
static void read_groups(hd_conn *c)
{
    gid_t small[64];
    socklen_t len = sizeof small;
    gid_t *g = small;
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
        if (errno != ERANGE)
            return;
        g = malloc(len);
        if (!g || getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
            free(g);
            return;
        }
    }
    int n = (int)(len / sizeof(gid_t));
    if (!n) {
        if (g != small)
            free(g);
        return;
    }
    if (g == small) {
        g = malloc(len);
        if (!g)
            return;
        memcpy(g, small, len);
    }
    c->groups = g;
    c->ngroups = n;
}
uint32_t hd_server_clients(const hd_server *s) { return s->nconns; }
int hd_server_socket_activated(const hd_server *s) { return s->activated; }
int hd_server_stopping(const hd_server *s) { return s->shutting; }

/* ---- limit logs ---------------------------------------------------------- */

/* 1 if a limit message may be logged now (HD_LIMIT_LOGS_PER_S per second);
 * the first one of a new second says how many were left out before. */
static int limit_log_ok(hd_server *s)
{
    uint64_t sec = uv_now(s->loop) / 1000;
    if (sec != s->log_window) {
        if (s->suppressed)
            hd_warn("%u more connection limit messages in the last second were not logged", s->suppressed);
        s->log_window = sec;
        s->logs = 0;
        s->suppressed = 0;
    }
    if (s->logs < HD_LIMIT_LOGS_PER_S) {
        s->logs++;
        return 1;
    }
    s->suppressed++;
    return 0;
}

/* ---- per uid use ----------------------------------------------------------- */

static hd_uid **uid_slot(hd_server *s, uid_t uid)
{
    hd_uid **p = &s->uids[uid % HD_UID_BUCKETS];
    while (*p && (*p)->uid != uid)
        p = &(*p)->next;
    return p;
}

/* The uid's entry, created if absent (NULL: uid 0, or out of memory). */
static hd_uid *uid_get(hd_server *s, uid_t uid)
{
    if (uid == 0)
        return NULL;
    hd_uid **p = uid_slot(s, uid);
    if (!*p) {
        *p = calloc(1, sizeof **p);
        if (*p)
            (*p)->uid = uid;
    }
    return *p;
}

static void conn_resume(hd_conn *c);

/* Frees an unused entry; resumes its connections when its fds dropped. */
static void uid_check(hd_server *s, hd_uid *u)
{
    if (u->paused && u->held + u->closing < s->cfg.max_fds_per_uid) {
        u->paused = false;
        for (hd_conn *c = s->conns; c; c = c->next)
            if (c->u == u)
                conn_resume(c);
    }
    if (!u->conns && !u->held && !u->closing && !u->queued) {
        hd_uid **p = uid_slot(s, u->uid);
        *p = u->next;
        free(u);
    }
}

/* ---- closer threads ------------------------------------------------------- */

static void closer_free(hd_closer *k)
{
    free(k->q);
    free(k->done);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k);
}

/* The first queued fd whose uid no other thread is closing for (-1: none). */
static long closer_pick(const hd_closer *k)
{
    for (size_t i = 0; i < k->n; i++) {
        bool taken = false;
        for (int t = 0; t < HD_CLOSER_THREADS; t++)
            taken |= k->busy[t] == (long)k->q[i].uid;
        if (!taken)
            return (long)i;
    }
    return -1;
}

static void *closer_main(void *arg)
{
    closer_arg *ca = arg;
    hd_closer *k = ca->k;
    int slot = ca->slot;
    free(ca);
    pthread_mutex_lock(&k->mu);
    for (;;) {
        long i;
        while (!k->stop && (i = closer_pick(k)) < 0)
            pthread_cond_wait(&k->cv, &k->mu);
        if (k->stop)
            break;
        closer_item it = k->q[i];
        memmove(k->q + i, k->q + i + 1, (k->n - (size_t)i - 1) * sizeof *k->q);
        k->n--;
        k->busy[slot] = (long)it.uid;
        pthread_mutex_unlock(&k->mu);
        close(it.fd); /* may block for the socket's linger time */
        pthread_mutex_lock(&k->mu);
        k->busy[slot] = -1;
        if (k->stop)
            break;
        if (k->ndone == k->donecap) {
            size_t cap = k->donecap ? k->donecap * 2 : 256;
            uid_t *d = realloc(k->done, cap * sizeof *d);
            if (d) {
                k->done = d;
                k->donecap = cap;
            }
        }
        if (k->ndone < k->donecap)
            k->done[k->ndone++] = it.uid;
        uv_async_send(k->async);
        pthread_cond_broadcast(&k->cv); /* this uid's next fd may go now */
    }
    int last = --k->alive == 0;
    pthread_mutex_unlock(&k->mu);
    if (last)
        closer_free(k);
    return NULL;
}

/* On the loop: fds the threads closed leave their uid's count. */
static void closer_done_cb(uv_async_t *a)
{
    hd_server *s = a->data;
    hd_closer *k = s->closer;
    uid_t batch[256];
    if (!k)
        return;
    for (;;) {
        pthread_mutex_lock(&k->mu);
        size_t n = k->ndone < 256 ? k->ndone : 256;
        memcpy(batch, k->done + (k->ndone - n), n * sizeof *batch);
        k->ndone -= n;
        pthread_mutex_unlock(&k->mu);
        if (!n)
            break;
        for (size_t i = 0; i < n; i++) {
            hd_uid **p = uid_slot(s, batch[i]);
            if (*p && (*p)->closing) {
                (*p)->closing--;
                uid_check(s, *p);
            }
        }
    }
}

/* Hands a received fd of `uid` to the closer threads. */
static void closer_push(hd_server *s, int fd, uid_t uid)
{
    hd_closer *k = s->closer;
    if (!k) {
        close(fd); /* no thread could start: better than a leak */
        return;
    }
    pthread_mutex_lock(&k->mu);
    if (k->n == k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 256;
        closer_item *q = realloc(k->q, cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&k->mu);
            close(fd);
            return;
        }
        k->q = q;
        k->cap = cap;
    }
    k->q[k->n++] = (closer_item){fd, uid};
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    hd_uid *u = uid == 0 ? NULL : uid_get(s, uid);
    if (u)
        u->closing++;
}

/* The reader's closer (hw_reader_set_closer): arg is the connection. */
static void conn_close_fd(int fd, void *arg)
{
    hd_conn *c = arg;
    closer_push(c->srv, fd, c->uid);
}

static int closer_start(hd_server *s)
{
    if (uv_async_init(s->loop, &s->closer_async, closer_done_cb))
        return -1;
    s->closer_async.data = s;
    uv_unref((uv_handle_t *)&s->closer_async);
    s->async_open = true;
    s->handles_open++;
    hd_closer *k = calloc(1, sizeof *k);
    if (!k)
        return -1;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->async = &s->closer_async;
    for (int i = 0; i < HD_CLOSER_THREADS; i++)
        k->busy[i] = -1;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&k->mu);
    for (int i = 0; i < HD_CLOSER_THREADS; i++) {
        closer_arg *ca = malloc(sizeof *ca);
        pthread_t th;
        if (!ca)
            break;
        ca->k = k;
        ca->slot = i;
        if (pthread_create(&th, &at, closer_main, ca) == 0)
            k->alive++;
        else
            free(ca);
    }
    pthread_attr_destroy(&at);
    int alive = k->alive;
    pthread_mutex_unlock(&k->mu);
    if (!alive) {
        closer_free(k);
        return -1;
    }
    s->closer = k;
    return 0;
}

/* Tells the threads to leave (a thread in a lingering close leaves when it
 * returns; the last one frees the closer). fds still queued stay open: the
 * process exits next, and exit closes them without lingering. */
static void closer_stop(hd_server *s)
{
    hd_closer *k = s->closer;
    if (!k)
        return;
    s->closer = NULL;
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

/* ---- connections ------------------------------------------------------------ */

static void conn_poll_cb(uv_poll_t *p, int status, int events);
static void idle_cb(uv_idle_t *i);
static void accept_resume(hd_server *s);

static void conn_kill(hd_conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    /* Its queue is dropped: it no longer counts against its uid. */
    if (c->u) {
        c->u->queued -= c->queued;
        c->srv->freed += c->queued;
        c->queued = 0;
    }
    c->next_dead = c->srv->dead;
    c->srv->dead = c;
    uv_idle_start(&c->srv->idle, idle_cb);
}

/* A connection over a limit: closed, with the reason logged. */
__attribute__((format(printf, 2, 3))) static void conn_kill_limit(hd_conn *c, const char *fmt, ...)
{
    if (c->dead)
        return;
    if (limit_log_ok(c->srv)) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        hd_warn("client pid %ld uid %ld: %s; closing the connection", (long)c->pid, (long)c->uid, msg);
    }
    conn_kill(c);
}

/* The uid's counts follow this connection's held fds and queued bytes. */
static void conn_account(hd_conn *c)
{
    hd_server *s = c->srv;
    if (c->dead)
        return;
    size_t held = hw_reader_fds_held(&c->rd), queued = hw_writer_pending_bytes(&c->wr);
    if (queued < c->queued)
        s->freed += c->queued - queued;
    if (c->u) {
        c->u->held += held - c->held;
        c->u->queued += queued - c->queued;
    }
    c->held = held;
    c->queued = queued;
}

/* Reads may go on: not dead, not closing, replies taken, the uid's fds
 * under budget. */
static int conn_may_read(const hd_conn *c)
{
    return !c->dead && !c->close_after_flush && hw_writer_pending_bytes(&c->wr) < HD_CONN_PAUSE_QUEUED &&
           !(c->u && c->u->paused);
}

static void busy_add(hd_conn *c)
{
    if (c->on_busy || c->dead)
        return;
    c->on_busy = true;
    c->next_busy = c->srv->busy;
    c->srv->busy = c;
    uv_idle_start(&c->srv->idle, idle_cb);
}

static void busy_remove(hd_conn *c)
{
    if (!c->on_busy)
        return;
    for (hd_conn **p = &c->srv->busy; *p; p = &(*p)->next_busy)
        if (*p == c) {
            *p = c->next_busy;
            break;
        }
    c->on_busy = false;
}

static void conn_update_events(hd_conn *c)
{
    if (c->dead || c->refused)
        return;
    int may = conn_may_read(c);
    int want = (may ? UV_READABLE : 0) | (hw_writer_pending(&c->wr) ? UV_WRITABLE : 0);
    if (want != c->events) {
        c->events = want;
        uv_poll_start(&c->poll, want, conn_poll_cb);
    }
    /* Frames already in the reader's buffer get no readable event. */
    if (may && hw_reader_buffered(&c->rd))
        busy_add(c);
}

static void conn_resume(hd_conn *c)
{
    conn_update_events(c);
    if (conn_may_read(c))
        busy_add(c);
}

static void conn_closed_cb(uv_handle_t *h)
{
    hd_conn *c = h->data;
    hd_server *s = c->srv;
    hw_reader_free(&c->rd); /* fds still held go to the closer */
    hw_writer_free(&c->wr);
    close(c->fd);
    free(c->groups);
    free(c);
    if (s->accept_paused)
        accept_resume(s);
}

static void conn_close_now(hd_conn *c)
{
    hd_server *s = c->srv;
    s->h.on_closed(s->arg, c);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    busy_remove(c);
    s->freed += c->queued + HW_READ_BUF;
    if (c->u) {
        /* Held fds move to the closer (hw_reader_free): counted there. */
        c->u->held -= c->held;
        c->u->queued -= c->queued;
        c->u->conns--;
        hd_uid *u = c->u;
        c->u = NULL;
        c->held = c->queued = 0;
        uid_check(s, u);
    }
    uv_poll_stop(&c->poll);
    uv_close((uv_handle_t *)&c->poll, conn_closed_cb);
}

/* Checks the queue limits after the queue grew. */
static void conn_check_queue(hd_conn *c)
{
    hd_server *s = c->srv;
    if (c->dead)
        return;
    if (c->queued > s->cfg.max_queue_per_conn)
        conn_kill_limit(c, "%zu bytes of replies are not read, over max_queue_per_conn = %llu (a client must "
                           "read its replies; raise max_queue_per_conn in heapd.conf if this one is legitimate)",
                        c->queued, (unsigned long long)s->cfg.max_queue_per_conn);
    else if (c->u && c->u->queued > s->cfg.max_queue_per_uid)
        conn_kill_limit(c, "the uid's %u connections leave %zu bytes of replies unread, over max_queue_per_uid "
                           "= %llu (raise max_queue_per_uid in heapd.conf if this is legitimate)",
                        c->u->conns, c->u->queued, (unsigned long long)s->cfg.max_queue_per_uid);
}

static void conn_flush(hd_conn *c)
{
    char err[256];
    int rc = hw_writer_flush(c->fd, &c->wr, err, sizeof err);
    conn_account(c);
    if (rc < 0) {
        hd_debug("client pid %ld: send failed: %s", (long)c->pid, err);
        conn_kill(c);
        return;
    }
    if (rc == 1 && c->close_after_flush) {
        conn_kill(c);
        return;
    }
    conn_update_events(c);
}

void hd_conn_send(hd_conn *c, const void *msg, size_t len, hd_pack_fn pack, int *fds, size_t nfds)
{
    if (c->dead) {
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        return;
    }
    uint8_t *buf = malloc(len ? len : 1);
    char err[256];
    if (!buf) {
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        hd_error("out of memory encoding a reply for pid %ld; closing its connection", (long)c->pid);
        conn_kill(c);
        return;
    }
    pack(msg, buf);
    if (hw_writer_push(&c->wr, buf, len, fds, nfds, err, sizeof err) < 0) {
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        hd_error("cannot queue a reply for pid %ld: %s; closing its connection", (long)c->pid, err);
        free(buf);
        conn_kill(c);
        return;
    }
    free(buf);
    if (c->refused) /* the refusal's one frame: refuse() sends it */
        return;
    conn_account(c);
    conn_check_queue(c);
    if (!c->dead)
        conn_flush(c);
}

void hd_conn_close_after_flush(hd_conn *c)
{
    c->close_after_flush = true;
    if (!c->refused)
        conn_flush(c);
}

void hd_conn_admit(hd_conn *c)
{
    c->admitted = true;
    hw_reader_set_limits(&c->rd, 0, c->srv->cfg.max_fds_per_conn);
}

/* Handles the frames the client sent, HD_FRAMES_PER_TURN at most: the rest
 * wait on the busy list for the next loop turn. */
static void conn_read(hd_conn *c)
{
    hd_server *s = c->srv;
    for (int n = 0;; n++) {
        if (!conn_may_read(c)) {
            conn_update_events(c);
            return;
        }
        if (n == HD_FRAMES_PER_TURN) {
            busy_add(c);
            return;
        }
        hw_frame fr;
        char err[256];
        int rc = hw_read(c->fd, &c->rd, &fr, err, sizeof err);
        conn_account(c);
        if (c->u && !c->u->paused && c->u->held + c->u->closing >= s->cfg.max_fds_per_uid) {
            c->u->paused = true;
            if (limit_log_ok(s))
                hd_warn("uid %ld: its connections hold %zu received fds (%zu being closed), the max_fds_per_uid "
                        "limit of %u; not reading its connections until they are closed",
                        (long)c->uid, c->u->held + c->u->closing, c->u->closing, s->cfg.max_fds_per_uid);
        }
        if (rc == HW_AGAIN) {
            if (!hw_reader_buffered(&c->rd) && c->rd.buf) {
                hw_reader_shrink(&c->rd);
                s->freed += HW_READ_BUF;
            }
            return;
        }
        if (rc == HW_EOF) {
            conn_kill(c);
            return;
        }
        if (rc < 0) {
            if ((rc == HW_ETOOBIG || rc == HW_ETOOMANYFDS) && limit_log_ok(s))
                hd_warn("client pid %ld uid %ld: %s (%s); closing the connection", (long)c->pid, (long)c->uid, err,
                        c->admitted ? "max_fds_per_conn, or the wire's limits"
                                    : "before Hello: max_frame_before_hello, max_fds_per_conn");
            else if (rc != HW_ETOOBIG && rc != HW_ETOOMANYFDS)
                hd_warn("client pid %ld: %s; closing the connection", (long)c->pid, err);
            conn_kill(c);
            return;
        }
        /* The handler sees the fds; they are closed by the closer after. */
        s->h.on_frame(s->arg, c, fr.data, fr.len, fr.nfds);
        for (size_t i = 0; i < fr.nfds; i++)
            if (fr.fds[i] >= 0) {
                closer_push(s, fr.fds[i], c->uid);
                fr.fds[i] = -1;
            }
        if (fr.len >= HW_READ_BUF)
            s->freed += fr.len;
        hw_frame_free(&fr);
    }
}

static void conn_poll_cb(uv_poll_t *p, int status, int events)
{
    hd_conn *c = p->data;
    if (c->dead)
        return;
    if (status < 0) {
        hd_debug("client pid %ld: poll error %s", (long)c->pid, uv_strerror(status));
        conn_kill(c);
        return;
    }
    if (events & UV_WRITABLE)
        conn_flush(c);
    /* After a flush, too: frames may wait in the reader's buffer while
     * reading was paused for backpressure. */
    if (c->dead)
        return;
    busy_remove(c);
    conn_read(c);
}

static void idle_cb(uv_idle_t *i)
{
    hd_server *s = i->data;
    /* Connections with frames left from the last turn. */
    hd_conn *b = s->busy;
    s->busy = NULL;
    while (b) {
        hd_conn *c = b;
        b = c->next_busy;
        c->on_busy = false;
        if (!c->dead)
            conn_read(c); /* may put c back on s->busy */
    }
    while (s->dead) {
        hd_conn *c = s->dead;
        s->dead = c->next_dead;
        conn_close_now(c); /* may kill others: they join s->dead */
    }
    if (!s->busy)
        uv_idle_stop(&s->idle);
}

/* ---- accepting --------------------------------------------------------------- */

/* A connection refused before on_open: the handlers queue one frame saying
 * why, it goes out if the socket takes it at once (a fresh socket does), and
 * the connection is closed. */
static void refuse(hd_server *s, int fd, const struct ucred *cr, hd_refusal why, uint64_t limit)
{
    hd_conn c;
    memset(&c, 0, sizeof c);
    c.fd = fd;
    c.srv = s;
    c.refused = true;
    c.pid = cr->pid;
    c.uid = cr->uid;
    c.gid = cr->gid;
    hw_writer_init(&c.wr);
    if (limit_log_ok(s))
        hd_warn("refusing a client (pid %ld uid %ld): %s", (long)cr->pid, (long)cr->uid,
                why == HD_REFUSE_MAX_CLIENTS ? "max_clients connections are open"
                                             : "its uid has max_clients_per_uid connections open");
    if (s->h.on_refuse)
        s->h.on_refuse(s->arg, &c, why, limit);
    char err[128];
    hw_writer_flush(fd, &c.wr, err, sizeof err);
    hw_writer_free(&c.wr);
    close(fd);
}

static void accept_cb(uv_poll_t *p, int status, int events);

static void accept_resume(hd_server *s)
{
    if (!s->accept_paused || s->shutting || !s->listening)
        return;
    s->accept_paused = false;
    uv_timer_stop(&s->resume);
    uv_poll_start(&s->lpoll, UV_READABLE, accept_cb);
}

static void resume_cb(uv_timer_t *t) { accept_resume(t->data); }

/* Out of fds (or memory) for a new connection: stop watching the listening
 * socket until a connection closes or a second passes. */
static void accept_pause(hd_server *s, int e)
{
    s->accept_paused = true;
    uv_poll_stop(&s->lpoll);
    uv_timer_start(&s->resume, resume_cb, 1000, 0);
    if (limit_log_ok(s))
        hd_warn("cannot accept a client: %s (%u connections open); not accepting until a connection closes "
                "(or for 1 s): raise LimitNOFILE / ulimit -n, or lower max_clients or max_clients_per_uid",
                strerror(e), s->nconns);
}

static void accept_cb(uv_poll_t *p, int status, int events)
{
    hd_server *s = p->data;
    (void)events;
    if (status < 0) {
        hd_error("listening socket: %s", uv_strerror(status));
        return;
    }
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                accept_pause(s, errno);
            else if (errno != EAGAIN && errno != EWOULDBLOCK)
                hd_warn("accept failed: %s", strerror(errno));
            return;
        }
        struct ucred cr = {0, (uid_t)-1, (gid_t)-1};
        socklen_t crl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) != 0) {
            close(fd);
            continue;
        }
        if (s->nconns >= s->cfg.max_clients) {
            refuse(s, fd, &cr, HD_REFUSE_MAX_CLIENTS, s->cfg.max_clients);
            continue;
        }
        hd_uid *u = uid_get(s, cr.uid);
        if (u && u->conns >= s->cfg.max_clients_per_uid) {
            refuse(s, fd, &cr, HD_REFUSE_UID_CLIENTS, s->cfg.max_clients_per_uid);
            continue;
        }
        hd_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            if (u)
                uid_check(s, u);
            continue;
        }
        c->fd = fd;
        c->srv = s;
        hw_reader_init(&c->rd);
        hw_reader_set_limits(&c->rd, s->cfg.max_frame_before_hello, s->cfg.max_fds_per_conn);
        hw_reader_set_closer(&c->rd, conn_close_fd, c);
        hw_writer_init(&c->wr);
        c->pid = cr.pid;
        c->uid = cr.uid;
        c->gid = cr.gid;
        c->opened_ms = uv_now(s->loop);
        read_groups(c);
        if (s->h.on_open(s->arg, c) || uv_poll_init(s->loop, &c->poll, fd)) {
            if (c->data)
                s->h.on_closed(s->arg, c);
            close(fd);
            free(c->groups);
            free(c);
            if (u)
                uid_check(s, u);
            continue;
        }
        c->u = u;
        if (u)
            u->conns++;
        c->poll.data = c;
        c->events = u && u->paused ? 0 : UV_READABLE;
        uv_poll_start(&c->poll, c->events, conn_poll_cb);
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->nconns++;
        hd_debug("client connected: pid %ld uid %ld", (long)c->pid, (long)c->uid);
    }
}

/* Every second or faster: connections without Hello past hello_timeout_ms
 * are closed; freed memory goes back to the system (malloc_trim). */
static void sweep_cb(uv_timer_t *t)
{
    hd_server *s = t->data;
    uint64_t now = uv_now(s->loop);
    for (hd_conn *c = s->conns; c; c = c->next)
        if (!c->admitted && !c->dead && now - c->opened_ms >= s->cfg.hello_timeout_ms)
            conn_kill_limit(c, "no Hello within hello_timeout_ms = %u ms", s->cfg.hello_timeout_ms);
    if (s->freed >= HD_TRIM_BYTES) {
        s->freed = 0;
        malloc_trim(0);
    }
}

static uint64_t sweep_period(const hd_config *cfg)
{
    uint64_t p = cfg->hello_timeout_ms / 4;
    return p < 10 ? 10 : p > 1000 ? 1000 : p;
}

static int mkdir_parent(const char *path)
{
    char dir[sizeof ((hd_config *)0)->socket_path];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = 0;
    for (char *q = dir + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            mkdir(dir, 0755);
            *q = '/';
        }
    if (mkdir(dir, 0755) && errno != EEXIST)
        return -1;
    return 0;
}

int hd_server_create(uv_loop_t *loop, const hd_config *cfg, const hd_server_handlers *handlers, void *arg,
                     hd_server **out, char *err, size_t errlen)
{
    hd_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->loop = loop;
    s->cfg = *cfg;
    s->h = *handlers;
    s->arg = arg;
    s->lfd = -1;

    const char *lpid = getenv("LISTEN_PID"), *lfds = getenv("LISTEN_FDS");
    if (lpid && lfds && strtol(lpid, NULL, 10) == (long)getpid() && strtol(lfds, NULL, 10) >= 1) {
        s->lfd = SD_LISTEN_FDS_START;
        s->activated = true;
        int fl = fcntl(s->lfd, F_GETFD);
        if (fl < 0) {
            snprintf(err, errlen, "LISTEN_FDS says fd 3 is the socket, but it is not open");
            free(s);
            return -1;
        }
        fcntl(s->lfd, F_SETFD, fl | FD_CLOEXEC);
        if (strtol(lfds, NULL, 10) > 1)
            hd_warn("systemd passed %s sockets; heapd uses the first and ignores the rest", lfds);
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        hd_info("using the socket passed by systemd (socket activation)");
    } else {
        char why[512];
        if (mkdir_parent(cfg->socket_path)) {
            snprintf(err, errlen, "cannot create the directory of socket %s: %s", cfg->socket_path, strerror(errno));
            free(s);
            return -1;
        }
        mode_t old = umask(0777 & ~cfg->socket_mode);
        int fd = hw_listen_unix(cfg->socket_path, 128, why, sizeof why);
        umask(old);
        if (fd < 0) {
            snprintf(err, errlen, "%s", why);
            free(s);
            return -1;
        }
        chmod(cfg->socket_path, cfg->socket_mode);
        s->lfd = fd;
    }
    if (hw_set_nonblock(s->lfd)) {
        snprintf(err, errlen, "cannot make the listening socket nonblocking: %s", strerror(errno));
        if (!s->activated)
            close(s->lfd);
        free(s);
        return -1;
    }
    uv_idle_init(loop, &s->idle);
    s->idle.data = s;
    uv_timer_init(loop, &s->sweep);
    s->sweep.data = s;
    uv_timer_init(loop, &s->resume);
    s->resume.data = s;
    s->handles_open = 3;
    if (closer_start(s)) {
        snprintf(err, errlen, "cannot start the threads that close received fds: %s", strerror(errno));
        /* The handles are closed by hd_server_destroy. */
    }
    *out = s;
    return 0;
}

void hd_server_set_config(hd_server *s, const hd_config *cfg)
{
    uint32_t max_clients = s->cfg.max_clients;
    s->cfg = *cfg;
    s->cfg.max_clients = max_clients;
    if (uv_is_active((uv_handle_t *)&s->sweep))
        uv_timer_start(&s->sweep, sweep_cb, sweep_period(&s->cfg), sweep_period(&s->cfg));
    for (hd_conn *c = s->conns; c; c = c->next)
        hw_reader_set_limits(&c->rd, c->admitted ? 0 : s->cfg.max_frame_before_hello, s->cfg.max_fds_per_conn);
}

int hd_server_start(hd_server *s, char *err, size_t errlen)
{
    int rc = uv_poll_init(s->loop, &s->lpoll, s->lfd);
    if (rc) {
        snprintf(err, errlen, "cannot watch the listening socket: %s", uv_strerror(rc));
        return -1;
    }
    s->lpoll.data = s;
    uv_poll_start(&s->lpoll, UV_READABLE, accept_cb);
    s->listening = true;
    uv_timer_start(&s->sweep, sweep_cb, sweep_period(&s->cfg), sweep_period(&s->cfg));
    uv_unref((uv_handle_t *)&s->sweep);
    uv_unref((uv_handle_t *)&s->resume);
    return 0;
}

void hd_server_shutdown(hd_server *s)
{
    if (s->shutting)
        return;
    s->shutting = true;
    if (s->listening) {
        uv_poll_stop(&s->lpoll);
        uv_close((uv_handle_t *)&s->lpoll, NULL);
        s->listening = false;
    }
    if (!s->activated) {
        close(s->lfd);
        unlink(s->cfg.socket_path);
    }
    s->lfd = -1;
    uv_timer_stop(&s->sweep);
    uv_timer_stop(&s->resume);
    s->accept_paused = false;
    for (hd_conn *c = s->conns; c; c = c->next) {
        if (c->dead)
            continue;
        /* Its last words go out if the socket takes them right away. */
        if (s->h.on_stop)
            s->h.on_stop(s->arg, c);
        conn_kill(c);
    }
}

static void handle_closed_cb(uv_handle_t *h)
{
    hd_server *s = h->data;
    if (--s->handles_open == 0)
        free(s);
}

void hd_server_destroy(hd_server *s)
{
    if (!s || s->destroyed)
        return;
    s->destroyed = true;
    closer_stop(s);
    for (int i = 0; i < HD_UID_BUCKETS; i++)
        while (s->uids[i]) {
            hd_uid *u = s->uids[i];
            s->uids[i] = u->next;
            free(u);
        }
    uv_close((uv_handle_t *)&s->idle, handle_closed_cb);
    uv_close((uv_handle_t *)&s->sweep, handle_closed_cb);
    uv_close((uv_handle_t *)&s->resume, handle_closed_cb);
    if (s->async_open)
        uv_close((uv_handle_t *)&s->closer_async, handle_closed_cb);
}
