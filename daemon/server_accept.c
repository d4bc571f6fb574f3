/* server_accept.c - the server's accepting side (see server.h): new
 * connections and their credentials (SO_PEERCRED, SO_PEERGROUPS), refusals
 * with a reason, the EMFILE pause, the per uid use that the limits count, the
 * Hello timeout sweep and malloc_trim. */
#include "server_int.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

/* Supplementary groups of a peer as the kernel recorded them at connect
 * (SO_PEERGROUPS, Linux 4.13): no /proc lookup, which ProtectProc=invisible
 * hides and a reused pid would answer wrongly. */
/* The peer's supplementary groups (SO_PEERGROUPS) into *out (malloc'd, NULL
 * when none or unreadable); returns their number. */
static int read_groups(int fd, gid_t **out)
{
    gid_t small[64];
    socklen_t len = sizeof small;
    gid_t *g = small;
    *out = NULL;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
        if (errno != ERANGE)
            return 0;
        g = malloc(len);
        if (!g || getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
            free(g);
            return 0;
        }
    }
    int n = (int)(len / sizeof(gid_t));
    if (!n) {
        if (g != small)
            free(g);
        return 0;
    }
    if (g == small) {
        g = malloc(len);
        if (!g)
            return 0;
        memcpy(g, small, len);
    }
    *out = g;
    return n;
}

/* Root or a member of admin_gid: may use the admin_reserve connections. */
static int peer_admin(const hd_server *s, const struct ucred *cr, const gid_t *g, int n)
{
    if (cr->uid == 0)
        return 1;
    if (s->opts.admin_gid < 0)
        return 0;
    if ((long)cr->gid == s->opts.admin_gid)
        return 1;
    for (int i = 0; i < n; i++)
        if ((long)g[i] == s->opts.admin_gid)
            return 1;
    return 0;
}
/* ---- limit logs ---------------------------------------------------------- */

/* 1 if a limit message may be logged now (HD_LIMIT_LOGS_PER_S per second);
 * the first one of a new second says how many were left out before. */
int hd_server_limit_log_ok(hd_server *s)
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

hd_uid **hd_server_uid_slot(hd_server *s, uid_t uid)
{
    hd_uid **p = &s->uids[uid % HD_UID_BUCKETS];
    while (*p && (*p)->uid != uid)
        p = &(*p)->next;
    return p;
}

/* The uid's entry, created if absent (NULL: uid 0, or out of memory). */
hd_uid *hd_server_uid_get(hd_server *s, uid_t uid)
{
    if (uid == 0)
        return NULL;
    hd_uid **p = hd_server_uid_slot(s, uid);
    if (!*p) {
        *p = calloc(1, sizeof **p);
        if (*p)
            (*p)->uid = uid;
    }
    return *p;
}

/* Frees an unused entry; resumes its connections when its fds dropped. */
void hd_server_uid_check(hd_server *s, hd_uid *u)
{
    if (u->paused && u->held + u->closing < s->opts.max_fds_per_uid) {
        u->paused = false;
        for (hd_conn *c = s->conns; c; c = c->next)
            if (c->u == u)
                hd_server_conn_resume(c);
    }
    if (!u->conns && !u->held && !u->closing && !u->queued && !u->qfds && !u->inflight) {
        hd_uid **p = hd_server_uid_slot(s, u->uid);
        *p = u->next;
        free(u);
    }
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
    if (hd_server_limit_log_ok(s))
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

void hd_server_accept_resume(hd_server *s)
{
    if (!s->accept_paused || s->shutting || !s->listening)
        return;
    s->accept_paused = false;
    uv_timer_stop(&s->resume);
    uv_poll_start(&s->lpoll, UV_READABLE, hd_server_accept_cb);
}

static void resume_cb(uv_timer_t *t) { hd_server_accept_resume(t->data); }

/* Out of fds (or memory) for a new connection: stop watching the listening
 * socket until a connection closes or a second passes. */
static void accept_pause(hd_server *s, int e)
{
    s->accept_paused = true;
    uv_poll_stop(&s->lpoll);
    uv_timer_start(&s->resume, resume_cb, 1000, 0);
    if (hd_server_limit_log_ok(s))
        hd_warn("cannot accept a client: %s (%u connections open); not accepting until a connection closes "
                "(or for 1 s): raise LimitNOFILE / ulimit -n, or lower max_clients or max_clients_per_uid",
                strerror(e), s->nconns);
}

void hd_server_accept_cb(uv_poll_t *p, int status, int events)
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
        gid_t *groups;
        int ngroups = read_groups(fd, &groups);
        if (s->nconns >= s->opts.max_clients &&
            (s->nconns >= s->opts.max_clients + s->opts.admin_reserve || !peer_admin(s, &cr, groups, ngroups))) {
            free(groups);
            refuse(s, fd, &cr, HD_REFUSE_MAX_CLIENTS, s->opts.max_clients);
            continue;
        }
        hd_uid *u = hd_server_uid_get(s, cr.uid);
        if (u && u->conns >= s->opts.max_clients_per_uid) {
            free(groups);
            refuse(s, fd, &cr, HD_REFUSE_UID_CLIENTS, s->opts.max_clients_per_uid);
            continue;
        }
        hd_conn *c = calloc(1, sizeof *c);
        if (!c) {
            free(groups);
            close(fd);
            if (u)
                hd_server_uid_check(s, u);
            continue;
        }
        c->groups = groups;
        c->ngroups = ngroups;
        c->fd = fd;
        c->srv = s;
        hw_reader_init(&c->rd);
        hw_reader_set_limits(&c->rd, s->opts.max_frame_before_hello, s->opts.max_fds_per_conn);
        hw_reader_set_closer(&c->rd, hd_server_conn_close_fd, c);
        hw_writer_init(&c->wr);
        c->pid = cr.pid;
        c->uid = cr.uid;
        c->gid = cr.gid;
        c->opened_ms = uv_now(s->loop);
        if (s->h.on_open(s->arg, c) || uv_poll_init(s->loop, &c->poll, fd)) {
            if (c->data)
                s->h.on_closed(s->arg, c);
            close(fd);
            free(c->groups);
            free(c);
            if (u)
                hd_server_uid_check(s, u);
            continue;
        }
        c->u = u;
        if (u)
            u->conns++;
        c->poll.data = c;
        c->events = u && u->paused ? UV_DISCONNECT : UV_READABLE;
        uv_poll_start(&c->poll, c->events, hd_server_conn_poll_cb);
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
void hd_server_sweep_cb(uv_timer_t *t)
{
    hd_server *s = t->data;
    uint64_t now = uv_now(s->loop);
    for (hd_conn *c = s->conns; c; c = c->next)
        if (!c->admitted && !c->dead && now - c->opened_ms >= s->opts.hello_timeout_ms)
            hd_server_conn_kill_limit(c, "no Hello within hello_timeout_ms = %u ms", s->opts.hello_timeout_ms);
    hd_server_fds_sweep(s);
    if (s->freed >= HD_TRIM_BYTES) {
        s->freed = 0;
        malloc_trim(0);
    }
}

uint64_t hd_server_sweep_period(const hd_server_opts *opts)
{
    uint64_t p = opts->hello_timeout_ms / 4;
    return p < 10 ? 10 : p > 1000 ? 1000 : p;
}
