/* server.c - heapd's transport (see server.h); it includes no message
 * header: dispatch.c and reply.c speak protobuf.
 *
 * Each connection is a nonblocking Unix stream socket driven by a uv_poll_t
 * (libuv's streams cannot pass raw fds such as memfd or CUDA chunk fds), with
 * the framing of common/wire.h. Connections that fail are not closed in the
 * middle of heap code: they are marked dead and closed from an idle handle
 * before the loop polls again. */
#include "server_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define SD_LISTEN_FDS_START 3

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

uint32_t hd_server_clients(const hd_server *s) { return s->nconns; }
int hd_server_socket_activated(const hd_server *s) { return s->activated; }
int hd_server_stopping(const hd_server *s) { return s->shutting; }

/* ---- received fds: closed by the closer threads ----------------------------- */

/* The closer's notify (on a closer thread): wake the loop. */
static void closer_notify(void *arg) { uv_async_send(arg); }

/* On the loop: fds the threads closed leave their uid's count. */
static void closer_done_cb(uv_async_t *a)
{
    hd_server *s = a->data;
    uid_t batch[256];
    size_t n;
    if (!s->closer)
        return;
    while ((n = hd_closer_take_done(s->closer, batch, 256)) > 0)
        for (size_t i = 0; i < n; i++) {
            hd_uid **p = hd_server_uid_slot(s, batch[i]);
            if (*p && (*p)->closing) {
                (*p)->closing--;
                hd_server_uid_check(s, *p);
            }
        }
}

/* Hands a received fd of `uid` to the closer threads. */
void hd_server_close_received(hd_server *s, int fd, uid_t uid)
{
    if (!s->closer || hd_closer_push(s->closer, fd, uid)) {
        close(fd); /* no thread, or no memory: better than a leak */
        return;
    }
    hd_uid *u = uid == 0 ? NULL : hd_server_uid_get(s, uid);
    if (u)
        u->closing++;
}

/* The reader's closer (hw_reader_set_closer): arg is the connection. */
void hd_server_conn_close_fd(int fd, void *arg)
{
    hd_conn *c = arg;
    hd_server_close_received(c->srv, fd, c->uid);
}

static int closer_start(hd_server *s)
{
    if (uv_async_init(s->loop, &s->closer_async, closer_done_cb))
        return -1;
    s->closer_async.data = s;
    uv_unref((uv_handle_t *)&s->closer_async);
    s->async_open = true;
    s->handles_open++;
    s->closer = hd_closer_start(closer_notify, &s->closer_async);
    return s->closer ? 0 : -1;
}

/* ---- connections ------------------------------------------------------------ */

static void idle_cb(uv_idle_t *i);

/* The connection's queued fds are now `qfds`: its uid's count follows;
 * when the uid drops under max_queued_fds_per_uid its connections read. */
static void conn_set_qfds(hd_conn *c, size_t qfds)
{
    hd_uid *u = c->u;
    size_t lim = c->srv->opts.max_queued_fds_per_uid;
    if (u) {
        bool over = u->qfds >= lim;
        u->qfds += qfds - c->qfds;
        c->qfds = qfds;
        if (over && u->qfds < lim && !u->paused)
            for (hd_conn *o = c->srv->conns; o; o = o->next)
                if (o->u == u && o != c)
                    hd_server_conn_resume(o);
    }
    c->qfds = qfds;
}

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
    conn_set_qfds(c, 0);
    c->next_dead = c->srv->dead;
    c->srv->dead = c;
    uv_idle_start(&c->srv->idle, idle_cb);
}

/* A connection over a limit: closed, with the reason logged. */
void hd_server_conn_kill_limit(hd_conn *c, const char *fmt, ...)
{
    if (c->dead)
        return;
    if (hd_server_limit_log_ok(c->srv)) {
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
    conn_set_qfds(c, hw_writer_pending_fds(&c->wr));
}

/* Reads may go on: not dead, not closing, replies taken (bytes and fds),
 * the uid's fds under budget. */
static int conn_may_read(const hd_conn *c)
{
    const hd_server_opts *o = &c->srv->opts;
    return !c->dead && !c->close_after_flush && hw_writer_pending_bytes(&c->wr) < HD_CONN_PAUSE_QUEUED &&
           hw_writer_pending_fds(&c->wr) < o->max_queued_fds_per_conn &&
           !(c->u && (c->u->paused || c->u->qfds >= o->max_queued_fds_per_uid));
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
    /* Not reading: still hear a hang-up (a paused uid's idle connections
     * would never be closed otherwise). */
    int want = (may ? UV_READABLE : UV_DISCONNECT) | (hw_writer_pending(&c->wr) && !c->stalled ? UV_WRITABLE : 0);
    if (want != c->events) {
        c->events = want;
        uv_poll_start(&c->poll, want, hd_server_conn_poll_cb);
    }
    /* Frames already in the reader's buffer get no readable event. */
    if (may && hw_reader_buffered(&c->rd))
        busy_add(c);
}

void hd_server_conn_resume(hd_conn *c)
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
    if (c->fd >= 0)
        close(c->fd);
    free(c->groups);
    free(c);
    if (s->accept_paused)
        hd_server_accept_resume(s);
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
    /* Fds in flight: the socket stays, and counts, until the peer reads. */
    int kept = hd_server_fds_close(c);
    if (c->u) {
        /* Held fds move to the closer (hw_reader_free): counted there. */
        c->u->held -= c->held;
        c->u->queued -= c->queued;
        c->u->conns -= !kept;
        hd_uid *u = c->u;
        c->u = NULL;
        c->held = c->queued = 0;
        hd_server_uid_check(s, u);
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
    if (c->queued > s->opts.max_queue_per_conn)
        hd_server_conn_kill_limit(c,
                                  "%zu bytes of replies are not read, over max_queue_per_conn = %llu (a client must "
                                  "read its replies; raise max_queue_per_conn in heapd.conf if this one is legitimate)",
                                  c->queued, (unsigned long long)s->opts.max_queue_per_conn);
    else if (c->u && c->u->queued > s->opts.max_queue_per_uid)
        hd_server_conn_kill_limit(c,
                                  "the uid's %u connections leave %zu bytes of replies unread, over max_queue_per_uid "
                                  "= %llu (raise max_queue_per_uid in heapd.conf if this is legitimate)",
                                  c->u->conns, c->u->queued, (unsigned long long)s->opts.max_queue_per_uid);
}

void hd_server_conn_flush(hd_conn *c)
{
    char err[256];
    hd_server_fds_before_flush(c);
    size_t fds = hw_writer_pending_fds(&c->wr);
    int rc = hw_writer_flush(c->fd, &c->wr, err, sizeof err);
    /* ETOOMANYREFS: heapd's uid has too many fds in flight, whoever's;
     * nothing was sent: backpressure, not this connection's fault. */
    int refused = rc < 0 && errno == ETOOMANYREFS;
    if (refused)
        rc = 0;
    hd_server_fds_after_flush(c, fds - hw_writer_pending_fds(&c->wr), refused);
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
    c->turn_bytes += len;
    if (c->refused) /* the refusal's one frame: refuse() sends it */
        return;
    conn_account(c);
    conn_check_queue(c);
    if (!c->dead)
        hd_server_conn_flush(c);
}

void hd_conn_close_after_flush(hd_conn *c)
{
    c->close_after_flush = true;
    if (!c->refused)
        hd_server_conn_flush(c);
}

void hd_conn_admit(hd_conn *c)
{
    c->admitted = true;
    hw_reader_set_limits(&c->rd, 0, c->srv->opts.max_fds_per_conn);
}

/* Handles the frames the client sent, HD_FRAMES_PER_TURN at most and until
 * their replies reach HD_REPLY_BYTES_PER_TURN: the rest wait on the busy
 * list for the next loop turn. */
static void conn_read(hd_conn *c)
{
    hd_server *s = c->srv;
    c->turn_bytes = 0;
    for (int n = 0;; n++) {
        if (!conn_may_read(c)) {
            conn_update_events(c);
            return;
        }
        if (n == HD_FRAMES_PER_TURN || c->turn_bytes >= HD_REPLY_BYTES_PER_TURN) {
            busy_add(c);
            return;
        }
        hw_frame fr;
        char err[256];
        int rc = hw_read(c->fd, &c->rd, &fr, err, sizeof err);
        conn_account(c);
        if (c->u && !c->u->paused && c->u->held + c->u->closing >= s->opts.max_fds_per_uid) {
            c->u->paused = true;
            if (hd_server_limit_log_ok(s))
                hd_warn("uid %ld: its connections hold %zu received fds (%zu being closed), the max_fds_per_uid "
                        "limit of %u; not reading its connections until they are closed",
                        (long)c->uid, c->u->held + c->u->closing, c->u->closing, s->opts.max_fds_per_uid);
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
            if ((rc == HW_ETOOBIG || rc == HW_ETOOMANYFDS) && hd_server_limit_log_ok(s))
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
                hd_server_close_received(s, fr.fds[i], c->uid);
                fr.fds[i] = -1;
            }
        if (fr.len >= HW_READ_BUF)
            s->freed += fr.len;
        hw_frame_free(&fr);
    }
}

void hd_server_conn_poll_cb(uv_poll_t *p, int status, int events)
{
    hd_conn *c = p->data;
    if (c->dead)
        return;
    if (status < 0) {
        hd_debug("client pid %ld: poll error %s", (long)c->pid, uv_strerror(status));
        conn_kill(c);
        return;
    }
    if ((events & UV_DISCONNECT) && !(c->events & UV_READABLE)) {
        /* Hung up while its requests are not read: nobody waits for them. */
        conn_kill(c);
        return;
    }
    if (events & UV_WRITABLE)
        hd_server_conn_flush(c);
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

static int mkdir_parent(const char *path)
{
    char dir[sizeof((hd_server_opts *)0)->socket_path];
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

int hd_server_create(uv_loop_t *loop, const hd_server_opts *opts, const hd_server_handlers *handlers, void *arg,
                     hd_server **out, char *err, size_t errlen)
{
    hd_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->loop = loop;
    s->opts = *opts;
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
        if (mkdir_parent(opts->socket_path)) {
            snprintf(err, errlen, "cannot create the directory of socket %s: %s", opts->socket_path, strerror(errno));
            free(s);
            return -1;
        }
        mode_t old = umask(0777 & ~opts->socket_mode);
        int fd = hw_listen_unix(opts->socket_path, 128, why, sizeof why);
        umask(old);
        if (fd < 0) {
            snprintf(err, errlen, "%s", why);
            free(s);
            return -1;
        }
        chmod(opts->socket_path, opts->socket_mode);
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
    uv_timer_init(loop, &s->stall);
    s->stall.data = s;
    uv_unref((uv_handle_t *)&s->stall);
    s->handles_open = 4;
    if (closer_start(s))
        hd_warn("cannot start the threads that close received fds (%s): heapd closes them itself, and a "
                "client-passed socket that lingers will block it",
                strerror(errno));
    *out = s;
    return 0;
}

void hd_server_set_opts(hd_server *s, const hd_server_opts *opts)
{
    hd_server_opts o = *opts;
    memcpy(o.socket_path, s->opts.socket_path, sizeof o.socket_path);
    o.socket_mode = s->opts.socket_mode;
    o.max_clients = s->opts.max_clients;
    s->opts = o;
    if (uv_is_active((uv_handle_t *)&s->sweep))
        uv_timer_start(&s->sweep, hd_server_sweep_cb, hd_server_sweep_period(&s->opts),
                       hd_server_sweep_period(&s->opts));
    for (hd_conn *c = s->conns; c; c = c->next)
        hw_reader_set_limits(&c->rd, c->admitted ? 0 : s->opts.max_frame_before_hello, s->opts.max_fds_per_conn);
}

int hd_server_start(hd_server *s, char *err, size_t errlen)
{
    int rc = uv_poll_init(s->loop, &s->lpoll, s->lfd);
    if (rc) {
        snprintf(err, errlen, "cannot watch the listening socket: %s", uv_strerror(rc));
        return -1;
    }
    s->lpoll.data = s;
    uv_poll_start(&s->lpoll, UV_READABLE, hd_server_accept_cb);
    s->listening = true;
    uv_timer_start(&s->sweep, hd_server_sweep_cb, hd_server_sweep_period(&s->opts), hd_server_sweep_period(&s->opts));
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
        unlink(s->opts.socket_path);
    }
    s->lfd = -1;
    uv_timer_stop(&s->sweep);
    uv_timer_stop(&s->resume);
    hd_server_fds_stop(s);
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
    hd_server_fds_stop(s);
    hd_closer_stop(s->closer);
    s->closer = NULL;
    for (int i = 0; i < HD_UID_BUCKETS; i++)
        while (s->uids[i]) {
            hd_uid *u = s->uids[i];
            s->uids[i] = u->next;
            free(u);
        }
    uv_close((uv_handle_t *)&s->idle, handle_closed_cb);
    uv_close((uv_handle_t *)&s->sweep, handle_closed_cb);
    uv_close((uv_handle_t *)&s->resume, handle_closed_cb);
    uv_close((uv_handle_t *)&s->stall, handle_closed_cb);
    if (s->async_open)
        uv_close((uv_handle_t *)&s->closer_async, handle_closed_cb);
}
