/* heapc_sock.c - libheapc's socket transport (see heapc_sock.h). */
#include "heapc_sock.h"
#include "heapc.h"
#include "env.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void hcs_init(hcs_sock *s)
{
    s->fd = -1;
    hw_reader_init(&s->rd);
    s->stall_ms = HEAPC_FRAME_TIMEOUT_MS;
    const char *e = henv_get("FRAME_TIMEOUT_MS");
    char *end;
    long v = e && *e ? strtol(e, &end, 10) : 0;
    if (e && *e && !*end && v > 0 && v <= INT_MAX)
        s->stall_ms = (int)v;
}

int hcs_connect(hcs_sock *s, const char *path, char *why, size_t len)
{
    int fd = hw_connect_unix(path, why, len);
    if (fd < 0)
        return -1;
    s->fd = fd;
    return 0;
}

void hcs_close(hcs_sock *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    hw_reader_free(&s->rd);
    hw_reader_init(&s->rd);
}

static int sock_send(void *data, uint64_t id, const void *buf, size_t len, const int *fds, size_t nfds, hcx_err *e)
{
    hcs_sock *s = data;
    e->ring = 0;
    int rc = hw_send_frame(s->fd, buf, len, fds, nfds, e->why, sizeof e->why);
    if (rc >= 0)
        return HCX_OK;
    if (rc == HW_ESYS && (errno == EPIPE || errno == ECONNRESET))
        return HCX_ECLOSED;
    return rc == HW_ETOOBIG ? HCX_ETOOBIG : HCX_EIO;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The next frame within timeout_ms (< 0: no limit); once part of a frame
 * has come, its rest within s->stall_ms whatever timeout_ms says: a server
 * that announces a frame (or its fds) and sends no more never hangs us.
 * hw_recv_frame's codes; *stalled: the timeout was the stall limit. */
static int recv_bounded(hcs_sock *s, int timeout_ms, hw_frame *raw, int *stalled, char *why, size_t len)
{
    int64_t t0 = now_ms(), stall0 = -1;
    for (;;) {
        int rc = hw_read(s->fd, &s->rd, raw, why, len);
        if (rc != HW_AGAIN)
            return rc;
        int64_t now = now_ms(), deadline = timeout_ms < 0 ? INT64_MAX : t0 + timeout_ms;
        *stalled = 0;
        if (!hw_reader_in_frame(&s->rd)) {
            stall0 = -1;
        } else {
            if (stall0 < 0)
                stall0 = now;
            if (stall0 + s->stall_ms < deadline) {
                deadline = stall0 + s->stall_ms;
                *stalled = 1;
            }
        }
        if (now >= deadline) {
            if (*stalled)
                snprintf(why, len,
                         "heapd began a frame and sent no more of it (its bytes or the fds its header announced) "
                         "within %d ms",
                         s->stall_ms);
            else
                snprintf(why, len, "no frame arrived within %d ms", timeout_ms);
            return HW_ETIMEDOUT;
        }
        int64_t left = deadline == INT64_MAX ? -1 : deadline - now;
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        if (poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left) < 0 && errno != EINTR) {
            snprintf(why, len, "poll on heapd's socket failed: %s", strerror(errno));
            return HW_ESYS;
        }
    }
}

static int sock_next(void *data, int timeout_ms, Heapd__Frame **m, hw_frame *raw, hcx_err *e)
{
    hcs_sock *s = data;
    e->ring = 0;
    *m = NULL;
    int stalled = 0;
    int rc = recv_bounded(s, timeout_ms, raw, &stalled, e->why, sizeof e->why);
    if (rc == HW_EOF || rc == HW_EPARTIAL || (rc == HW_ESYS && (errno == ECONNRESET || errno == EPIPE)))
        return HCX_ECLOSED;
    if (rc == HW_ETIMEDOUT)
        return stalled ? HCX_ESTALL : HCX_ETIMEOUT;
    if (rc < 0)
        return HCX_EIO;
    *m = heapd__frame__unpack(NULL, raw->len, raw->data);
    if (!*m) {
        hw_frame_free(raw);
        return HCX_EDECODE;
    }
    return HCX_OK;
}

static int sock_await(void *data, uint64_t id, int timeout_ms, Heapd__Frame **m, hw_frame *raw, hcx_err *e)
{
    for (;;) {
        int rc = sock_next(data, timeout_ms, m, raw, e);
        if (rc != HCX_OK || hcx_for(*m, id))
            return rc;
        heapd__frame__free_unpacked(*m, NULL); /* a reply to an earlier request */
        hw_frame_free(raw);
    }
}

static int sock_readable(void *data)
{
    hcs_sock *s = data;
    struct pollfd p = {.fd = s->fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

const hcx_ops hcs_ops = {
    .carries = NULL,
    .send = sock_send,
    .await = sock_await,
    .next = sock_next,
    .readable = sock_readable,
};

int hcs_last_words(hcs_sock *s, int *code, char *msg, size_t len)
{
    hw_frame f;
    char werr[128];
    if (s->fd < 0 || hw_recv_frame(s->fd, &s->rd, &f, 0, werr, sizeof werr) != HW_FRAME)
        return 0;
    Heapd__Frame *m = heapd__frame__unpack(NULL, f.len, f.data);
    hw_frame_free(&f);
    int got = m && m->id == 0 && m->body_case == HEAPD__FRAME__BODY_ERROR && m->error && m->error->message;
    if (got) {
        *code = (int)m->error->code;
        snprintf(msg, len, "%s", m->error->message);
    }
    if (m)
        heapd__frame__free_unpacked(m, NULL);
    return got;
}
