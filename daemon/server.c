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

/* Invariants: on the server's list <=> not yet closed; dead => on the close
 * list, no more frames are read or sent; poll events == READABLE plus
 * WRITABLE iff the writer has pending frames. */
struct hd_conn {
    uv_poll_t poll;
    int fd;
    hd_server *srv;
    hw_reader rd;
    hw_writer wr;
    bool dead, close_after_flush;
    int events;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    gid_t groups[64];           /* supplementary groups at connect time */
    int ngroups;
    void *data;                 /* the handlers' */
    hd_conn *next, *prev;       /* server's list */
    hd_conn *next_dead;
};

struct hd_server {
    uv_loop_t *loop;
    hd_config cfg;
    hd_server_handlers h;
    void *arg;
    int lfd;
    bool activated, listening, shutting;
    uv_poll_t lpoll;
    uv_idle_t reaper;
    hd_conn *conns, *dead;
    uint32_t nconns;
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

/* Supplementary groups of a peer: the "Groups:" line of /proc/PID/status. */
static void read_groups(hd_conn *c)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)c->pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Groups:", 7))
            continue;
        char *p = line + 7, *end;
        while (c->ngroups < (int)(sizeof c->groups / sizeof c->groups[0])) {
            long g = strtol(p, &end, 10);
            if (end == p)
                break;
            c->groups[c->ngroups++] = (gid_t)g;
            p = end;
        }
        break;
    }
    fclose(f);
}
uint32_t hd_server_clients(const hd_server *s) { return s->nconns; }
int hd_server_socket_activated(const hd_server *s) { return s->activated; }
int hd_server_stopping(const hd_server *s) { return s->shutting; }

static void conn_poll_cb(uv_poll_t *p, int status, int events);
static void reaper_cb(uv_idle_t *i);

static void conn_kill(hd_conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    c->next_dead = c->srv->dead;
    c->srv->dead = c;
    uv_idle_start(&c->srv->reaper, reaper_cb);
}

static void conn_closed_cb(uv_handle_t *h)
{
    hd_conn *c = h->data;
    close(c->fd);
    hw_reader_free(&c->rd);
    hw_writer_free(&c->wr);
    free(c);
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
    uv_poll_stop(&c->poll);
    uv_close((uv_handle_t *)&c->poll, conn_closed_cb);
}

static void reaper_cb(uv_idle_t *i)
{
    hd_server *s = i->data;
    while (s->dead) {
        hd_conn *c = s->dead;
        s->dead = c->next_dead;
        conn_close_now(c); /* may kill others: they join s->dead */
    }
    uv_idle_stop(&s->reaper);
}

/* A client that does not read its replies: stop reading its requests while
 * this much is queued for it (backpressure), so it cannot grow heapd. */
#define HD_CONN_MAX_QUEUED (4u << 20)

static void conn_update_events(hd_conn *c)
{
    int want = (hw_writer_pending_bytes(&c->wr) < HD_CONN_MAX_QUEUED ? UV_READABLE : 0) |
               (hw_writer_pending(&c->wr) ? UV_WRITABLE : 0);
    if (want != c->events && !c->dead) {
        c->events = want;
        uv_poll_start(&c->poll, want, conn_poll_cb);
    }
}

static void conn_flush(hd_conn *c)
{
    char err[256];
    int rc = hw_writer_flush(c->fd, &c->wr, err, sizeof err);
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
    conn_flush(c);
}

void hd_conn_close_after_flush(hd_conn *c)
{
    c->close_after_flush = true;
    conn_flush(c);
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
    for (int n = 0; n < 64 && !c->dead && !c->close_after_flush &&
                    hw_writer_pending_bytes(&c->wr) < HD_CONN_MAX_QUEUED;
         n++) {
        hw_frame fr;
        char err[256];
        int rc = hw_read(c->fd, &c->rd, &fr, err, sizeof err);
        if (rc == HW_AGAIN)
            return;
        if (rc == HW_EOF) {
            conn_kill(c);
            return;
        }
        if (rc < 0) {
            hd_warn("client pid %ld: %s; closing the connection", (long)c->pid, err);
            conn_kill(c);
            return;
        }
        c->srv->h.on_frame(c->srv->arg, c, fr.data, fr.len, fr.nfds);
        hw_frame_free(&fr);
    }
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
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                hd_warn("accept failed: %s", strerror(errno));
            return;
        }
        if (s->nconns >= s->cfg.max_clients) {
            hd_warn("refusing a client: %u connections is the max_clients limit", s->nconns);
            close(fd);
            continue;
        }
        hd_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->srv = s;
        hw_reader_init(&c->rd);
        hw_writer_init(&c->wr);
        struct ucred cr;
        socklen_t crl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) == 0) {
            c->pid = cr.pid;
            c->uid = cr.uid;
            c->gid = cr.gid;
            read_groups(c);
        }
        if (s->h.on_open(s->arg, c)) {
            close(fd);
            free(c);
            continue;
        }
        if (uv_poll_init(s->loop, &c->poll, fd)) {
            s->h.on_closed(s->arg, c);
            close(fd);
            free(c);
            continue;
        }
        c->poll.data = c;
        c->events = UV_READABLE;
        uv_poll_start(&c->poll, UV_READABLE, conn_poll_cb);
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->nconns++;
        hd_debug("client connected: pid %ld uid %ld", (long)c->pid, (long)c->uid);
    }
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
    uv_idle_init(loop, &s->reaper);
    s->reaper.data = s;
    *out = s;
    return 0;
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
    for (hd_conn *c = s->conns; c; c = c->next) {
        if (c->dead)
            continue;
        /* Its last words go out if the socket takes them right away. */
        if (s->h.on_stop)
            s->h.on_stop(s->arg, c);
        conn_kill(c);
    }
}

void hd_server_destroy(hd_server *s)
{
    if (!s)
        return;
    uv_close((uv_handle_t *)&s->reaper, NULL);
    free(s);
}
