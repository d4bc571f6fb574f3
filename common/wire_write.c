/*
 * wire_write.c - framing for the heapd Unix-socket protocol, its writing
 * half: the writer (hw_writer_*: a queue of frames sent with their fds in
 * batches), nonblocking mode, and the blocking helpers the client uses
 * (hw_send_frame, hw_recv_frame over wire.c's reader). See wire.h.
 */
#include "wire_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HW_IOV_MAX 64 /* iovecs gathered by one flush sendmsg */

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* ---- writer ------------------------------------------------------------ */

struct hw_wframe {
    struct hw_wframe *next;
    unsigned char hdr[HW_HDR_SIZE];
    const unsigned char *data;
    size_t len;
    int *fds;
    size_t nfds;
    size_t off; /* bytes of hdr+data sent */
    size_t fds_sent;
    int owned; /* heap frame: free it, close its fds */
};

static size_t wf_total(const struct hw_wframe *f) { return HW_HDR_SIZE + f->len; }

/* Append iovecs for up to max unsent bytes of f. */
static int wf_iov(const struct hw_wframe *f, struct iovec *iov, size_t max, size_t *bytes)
{
    int n = 0;
    size_t off = f->off, k;

    if (off < HW_HDR_SIZE && max > 0) {
        k = hw_min_sz(HW_HDR_SIZE - off, max);
        iov[n].iov_base = (void *)(f->hdr + off);
        iov[n].iov_len = k;
        n++;
        max -= k;
        *bytes += k;
        off = HW_HDR_SIZE;
    }
    if (off < wf_total(f) && max > 0) {
        k = hw_min_sz(wf_total(f) - off, max);
        iov[n].iov_base = (void *)(f->data + (off - HW_HDR_SIZE));
        iov[n].iov_len = k;
        n++;
        *bytes += k;
    }
    return n;
}

void hw_writer_init(hw_writer *w)
{
    memset(w, 0, sizeof(*w));
    w->fd_budget = SIZE_MAX;
}

static void wf_free(struct hw_wframe *f)
{
    if (f->owned) {
        hw_close_fds(f->fds + f->fds_sent, f->nfds - f->fds_sent);
        free(f);
    }
}

void hw_writer_free(hw_writer *w)
{
    struct hw_wframe *f, *next;

    if (w == NULL)
        return;
    for (f = w->head; f != NULL; f = next) {
        next = f->next;
        wf_free(f);
    }
    hw_writer_init(w);
}

static int check_out(const void *data, size_t len, const int *fds, size_t nfds, char *err, size_t errlen)
{
    int rc = hw_check_limits("outgoing frame", len, nfds, err, errlen);
    if (rc < 0)
        return rc;
    if (len > 0 && data == NULL) {
        hw_seterr(err, errlen, "outgoing frame of %zu bytes has no data", len);
        return HW_EINVAL;
    }
    if (nfds > 0 && fds == NULL) {
        hw_seterr(err, errlen, "outgoing frame announces %zu fds but has none", nfds);
        return HW_EINVAL;
    }
    for (size_t i = 0; i < nfds; i++) {
        if (fds[i] < 0) {
            hw_seterr(err, errlen, "outgoing frame: fd %zu of %zu is %d", i, nfds, fds[i]);
            return HW_EINVAL;
        }
    }
    return 0;
}

static void wf_setup(struct hw_wframe *f, const unsigned char *data, size_t len, int *fds, size_t nfds, int owned)
{
    memset(f, 0, sizeof(*f));
    put_u32(f->hdr, (uint32_t)len);
    put_u32(f->hdr + 4, (uint32_t)nfds);
    f->data = data;
    f->len = len;
    f->fds = fds;
    f->nfds = nfds;
    f->owned = owned;
}

static void writer_append(hw_writer *w, struct hw_wframe *f)
{
    f->next = NULL;
    if (w->tail != NULL)
        w->tail->next = f;
    else
        w->head = f;
    w->tail = f;
    w->frames++;
    w->bytes += wf_total(f) - f->off;
    w->fds += f->nfds - f->fds_sent;
}

int hw_writer_push(hw_writer *w, const void *data, size_t len, const int *fds, size_t nfds, char *err, size_t errlen)
{
    struct hw_wframe *f;
    unsigned char *p;
    int rc;

    rc = check_out(data, len, fds, nfds, err, errlen);
    if (rc < 0)
        return rc;
    /* One block: frame, fd array, payload. */
    f = malloc(sizeof(*f) + nfds * sizeof(int) + len);
    if (f == NULL) {
        hw_seterr(err, errlen, "out of memory queueing a frame of %zu bytes", len);
        return HW_ENOMEM;
    }
    p = (unsigned char *)(f + 1);
    wf_setup(f, p + nfds * sizeof(int), len, (int *)(void *)p, nfds, 1);
    if (nfds > 0)
        memcpy(f->fds, fds, nfds * sizeof(int));
    if (len > 0)
        memcpy(p + nfds * sizeof(int), data, len);
    writer_append(w, f);
    return 0;
}

size_t hw_writer_pending(const hw_writer *w) { return w->frames; }
size_t hw_writer_pending_bytes(const hw_writer *w) { return w->bytes; }
size_t hw_writer_pending_fds(const hw_writer *w) { return w->fds; }
void hw_writer_set_fd_budget(hw_writer *w, size_t n) { w->fd_budget = n; }

/*
 * One sendmsg. A frame with unsent fds gets a sendmsg of its own: the next
 * batch of fds with only this frame's bytes, leaving one byte for each later
 * batch. Otherwise the unsent bytes of the head frame and of the following
 * fd-less frames go out together.
 * Returns 1 (progress), 0 (would block) or a negative error.
 */
static int writer_step(int fd, hw_writer *w, char *err, size_t errlen)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(HW_FDS_PER_MSG * sizeof(int))];
    } cbuf;
    struct iovec iov[HW_IOV_MAX];
    struct hw_wframe *f = w->head, *g;
    struct msghdr msg;
    size_t bytes = 0, nb = 0;
    ssize_t n;
    int niov = 0;

    memset(&msg, 0, sizeof(msg));
    if (f->fds_sent < f->nfds) {
        size_t left = f->nfds - f->fds_sent, later;
        struct cmsghdr *c;

        nb = hw_min_sz(HW_FDS_PER_MSG, left);
        if (nb > w->fd_budget) {
            w->fd_stalled = 1;
            return 0;
        }
        later = (left - nb + HW_FDS_PER_MSG - 1) / HW_FDS_PER_MSG;
        niov = wf_iov(f, iov, wf_total(f) - f->off - later, &bytes);
        memset(&cbuf, 0, sizeof(cbuf));
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = CMSG_SPACE(nb * sizeof(int));
        c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nb * sizeof(int));
        memcpy(CMSG_DATA(c), f->fds + f->fds_sent, nb * sizeof(int));
    } else {
        for (g = f; g != NULL && niov + 2 <= HW_IOV_MAX; g = g->next) {
            if (g != f && g->nfds > 0)
                break;
            niov += wf_iov(g, iov + niov, SIZE_MAX, &bytes);
        }
    }
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)niov;

    do
        n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        if (errno == EPIPE || errno == ECONNRESET)
            hw_seterr(err, errlen,
                      "sendmsg failed: %s (peer closed the "
                      "connection)",
                      strerror(errno));
        else
            hw_seterr(err, errlen, "sendmsg failed: %s", strerror(errno));
        return HW_ESYS;
    }
    if (n == 0) { /* cannot happen: every sendmsg has bytes */
        errno = EIO;
        hw_seterr(err, errlen, "sendmsg sent nothing");
        return HW_ESYS;
    }
    if (nb > 0) {
        /* n > 0: the kernel holds references to these fds now. */
        if (f->owned)
            hw_close_fds(f->fds + f->fds_sent, nb);
        f->fds_sent += nb;
        w->fds -= nb;
        if (w->fd_budget != SIZE_MAX)
            w->fd_budget -= nb;
    }
    while (n > 0) {
        size_t take;
        g = w->head;
        take = hw_min_sz((size_t)n, wf_total(g) - g->off);
        g->off += take;
        w->bytes -= take;
        n -= (ssize_t)take;
        if (g->off == wf_total(g) && g->fds_sent == g->nfds) {
            w->head = g->next;
            if (w->head == NULL)
                w->tail = NULL;
            w->frames--;
            wf_free(g);
        }
    }
    return 1;
}

int hw_writer_flush(int fd, hw_writer *w, char *err, size_t errlen)
{
    w->fd_stalled = 0;
    while (w->head != NULL) {
        int rc = writer_step(fd, w, err, errlen);
        if (rc <= 0)
            return rc;
    }
    return 1;
}

/* ---- nonblocking mode ------------------------------------------------- */

/* Here, not in wire_sock.c: what the framing needs of a socket (the fuzz
 * target, tests/fuzz/run.sh, links wire.c and wire_write.c alone). */
int hw_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return HW_ESYS;
    return 0;
}

/* ---- blocking helpers ------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for events on fd; timeout_ms < 0 forever. 1 ready, 0 timeout, <0. */
static int wait_fd(int fd, short events, int timeout_ms, char *err, size_t errlen)
{
    struct pollfd p = {.fd = fd, .events = events, .revents = 0};
    int n;

    n = poll(&p, 1, timeout_ms);
    if (n < 0) {
        if (errno == EINTR)
            return 1; /* caller retries and re-waits */
        hw_seterr(err, errlen, "poll failed: %s", strerror(errno));
        return HW_ESYS;
    }
    if (n > 0 && (p.revents & POLLNVAL)) {
        errno = EBADF;
        hw_seterr(err, errlen, "poll: fd %d is not open", fd);
        return HW_ESYS;
    }
    return n > 0;
}

int hw_send_frame(int fd, const void *data, size_t len, const int *fds, size_t nfds, char *err, size_t errlen)
{
    struct hw_wframe f;
    hw_writer w;
    int rc;

    rc = check_out(data, len, fds, nfds, err, errlen);
    if (rc < 0)
        return rc;
    /* A stack frame that borrows the caller's bytes and fds. */
    wf_setup(&f, data, len, (int *)(uintptr_t)fds, nfds, 0);
    hw_writer_init(&w);
    writer_append(&w, &f);
    for (;;) {
        rc = hw_writer_flush(fd, &w, err, errlen);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        rc = wait_fd(fd, POLLOUT, -1, err, errlen);
        if (rc < 0)
            return rc;
    }
}

int hw_recv_frame(int fd, hw_reader *r, hw_frame *out, int timeout_ms, char *err, size_t errlen)
{
    int64_t deadline = timeout_ms >= 0 ? now_ms() + timeout_ms : 0;

    for (;;) {
        int rc = hw_read(fd, r, out, err, errlen);
        int wait = -1;

        if (rc != HW_AGAIN)
            return rc;
        if (timeout_ms >= 0) {
            int64_t left = deadline - now_ms();
            if (left <= 0) {
                hw_seterr(err, errlen, "no frame arrived within %d ms", timeout_ms);
                return HW_ETIMEDOUT;
            }
            wait = left > INT32_MAX ? INT32_MAX : (int)left;
        }
        rc = wait_fd(fd, POLLIN, wait, err, errlen);
        if (rc < 0)
            return rc;
        /* On a timeout loop once more: hw_read then the deadline check. */
    }
}
