/* server_fds.c - the fds of replies (see server.h, issue 33 items 2 and 3):
 * fds in flight, sent by SCM_RIGHTS and maybe not yet received, counted per
 * connection and uid; the budget of fds each flush may send; ETOOMANYREFS as
 * backpressure; the timer that retries stalled connections; and closed
 * connections' sockets kept open (hd_drain) while fds are in flight, so
 * that their uid still answers for them. (Queued fds, open in heapd until
 * sent, are counted with the other queue counts in server.c.)
 *
 * The kernel keeps fds in flight in the peer's receive queue and charges
 * them to heapd's uid until the peer reads them or closes its end. heapd
 * cannot see which were received; SIOCOUTQ says whether the peer left any
 * byte of ours unread, and when it did not, every fd sent was received. So
 * c->inflight is an upper bound, reset when the peer's queue is empty. */
#include "server_int.h"

#include <errno.h>
#include <linux/sockios.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "log.h"

/* How often stalled connections retry, ms. */
#define HD_STALL_RETRY_MS 2

static void validate(hd_server *s);

/* 1 if the peer left bytes we sent unread (they may carry fds). */
static int peer_unread(int fd)
{
    int n = 0;
    if (ioctl(fd, SIOCOUTQ, &n) < 0)
        return 0; /* not a socket that tells: nothing to wait for */
    return n > 0;
}

/* The peer read everything: its fds are no longer in flight. */
static void inflight_refresh(hd_conn *c)
{
    if (!c->inflight || peer_unread(c->fd))
        return;
    if (c->u)
        c->u->inflight -= c->inflight;
    c->inflight = 0;
}

void hd_server_fds_before_flush(hd_conn *c)
{
    hd_server *s = c->srv;
    c->stalled = false;
    inflight_refresh(c);
    size_t lim = s->opts.max_inflight_fds_per_conn;
    size_t b = c->inflight < lim ? lim - c->inflight : 0;
    if (c->u) {
        size_t ul = s->opts.max_inflight_fds_per_uid;
        size_t ub = c->u->inflight < ul ? ul - c->u->inflight : 0;
        if (ub < b)
            b = ub;
    }
    hw_writer_set_fd_budget(&c->wr, b);
}

static void stall_cb(uv_timer_t *t);

void hd_server_fds_after_flush(hd_conn *c, size_t sent, int refused)
{
    hd_server *s = c->srv;
    c->inflight += sent;
    if (c->u)
        c->u->inflight += sent;
    if (sent)
        c->refs_logged = false;
    if (refused) {
        /* Once per stall of this connection: retries are not news. */
        if (!c->refs_logged && (c->refs_logged = true) && hd_server_limit_log_ok(s))
            hd_warn("client pid %ld uid %ld: the kernel refuses to send more fds (ETOOMANYREFS: heapd's uid has "
                    "more fds sent and not yet received than its RLIMIT_NOFILE; some client does not read its "
                    "replies); retrying when clients read: lower max_inflight_fds_per_uid or raise LimitNOFILE",
                    (long)c->pid, (long)c->uid);
        c->stalled = true;
    } else if (c->wr.fd_stalled) {
        c->stalled = true;
    }
    if (c->stalled && !uv_is_active((uv_handle_t *)&s->stall))
        uv_timer_start(&s->stall, stall_cb, HD_STALL_RETRY_MS, HD_STALL_RETRY_MS);
}

/* Every HD_STALL_RETRY_MS while a connection is stalled: what the peers
 * read leaves flight, and stalled connections try again. */
static void stall_cb(uv_timer_t *t)
{
    hd_server *s = t->data;
    int any = 0;
    for (hd_conn *c = s->conns; c; c = c->next)
        if (!c->dead)
            inflight_refresh(c);
    hd_server_fds_sweep(s);
    validate(s);
    for (hd_conn *c = s->conns; c; c = c->next)
        if (c->stalled && !c->dead) {
            hd_server_conn_flush(c);
            any |= c->stalled;
        }
    if (!any)
        uv_timer_stop(&s->stall);
}

/* A connection closes: 1 if its socket was kept (fds still in flight),
 * counted against its uid until the peer reads or closes. */
int hd_server_fds_close(hd_conn *c)
{
    hd_server *s = c->srv;
    inflight_refresh(c);
    if (!c->inflight)
        return 0;
    hd_drain *d = c->u && !s->shutting ? malloc(sizeof *d) : NULL;
    if (!d) { /* root is not counted; stopping; no memory: the kernel's */
        if (c->u)
            c->u->inflight -= c->inflight;
        c->inflight = 0;
        return 0;
    }
    d->fd = c->fd;
    d->u = c->u;
    d->inflight = c->inflight;
    d->next = s->drains;
    s->drains = d;
    c->fd = -1;
    c->inflight = 0;
    return 1;
}

static void drain_free(hd_server *s, hd_drain *d)
{
    close(d->fd);
    d->u->inflight -= d->inflight;
    d->u->conns--;
    hd_server_uid_check(s, d->u);
    free(d);
}

/* Closes the kept sockets whose peer read or closed. */
void hd_server_fds_sweep(hd_server *s)
{
    validate(s);
    for (hd_drain **p = &s->drains; *p;) {
        hd_drain *d = *p;
        if (peer_unread(d->fd)) {
            p = &d->next;
            continue;
        }
        *p = d->next;
        drain_free(s, d);
    }
}

#ifdef HEAPD_DEBUG
/* server_int.h's equations for qfds and inflight (debug builds): every
 * uid's counts are the sums over its connections and kept sockets. */
static void validate(hd_server *s)
{
    for (int b = 0; b < HD_UID_BUCKETS; b++)
        for (hd_uid *u = s->uids[b]; u; u = u->next) {
            size_t q = 0, f = 0;
            for (hd_conn *c = s->conns; c; c = c->next)
                if (c->u == u) {
                    q += c->qfds;
                    f += c->inflight;
                }
            for (hd_drain *d = s->drains; d; d = d->next)
                if (d->u == u)
                    f += d->inflight;
            if (q != u->qfds || f != u->inflight) {
                hd_error("server invariant broken: uid %ld counts %zu queued and %zu in-flight fds, its "
                         "connections %zu and %zu",
                         (long)u->uid, u->qfds, u->inflight, q, f);
                abort();
            }
        }
}
#else
static void validate(hd_server *s) { (void)s; }
#endif

/* hd_server_shutdown: the kept sockets close; the retry timer stops. */
void hd_server_fds_stop(hd_server *s)
{
    uv_timer_stop(&s->stall);
    while (s->drains) {
        hd_drain *d = s->drains;
        s->drains = d->next;
        drain_free(s, d);
    }
}
