/*
 * wire.c - framing for the heapd Unix-socket protocol. See wire.h for the
 * contract. Modelled on tmux's compat/imsg.c: lengths are checked before
 * allocation, fds are attached to messages, stray fds are closed. The Unix
 * sockets themselves (listen, connect) are in wire_sock.c.
 */
#include "wire_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HW_SCM_MAX_FD 253 /* kernel's SCM_MAX_FD */
#define HW_IOV_MAX    64  /* iovecs gathered by one flush sendmsg */

_Static_assert(HW_FDS_PER_MSG <= HW_SCM_MAX_FD, "fd batch over the kernel cap");
/* Each fd batch needs one byte of its frame; the header alone must suffice. */
_Static_assert((HW_FDS_MAX + HW_FDS_PER_MSG - 1) / HW_FDS_PER_MSG <= HW_HDR_SIZE,
               "too many fd batches for an empty frame");
_Static_assert(HW_FRAME_MAX <= UINT32_MAX - 1, "frame length must fit a u32");

/* ---- helpers ----------------------------------------------------------- */

void hw_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    int saved = errno;
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    errno = saved;
}

static void close_fds(const int *fds, size_t n)
{
    int saved = errno;
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    errno = saved;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

const char *hw_strerror(int code)
{
    switch (code) {
    case HW_AGAIN:
        return "HW_AGAIN";
    case HW_FRAME:
        return "HW_FRAME";
    case HW_EOF:
        return "HW_EOF";
    case HW_ESYS:
        return "HW_ESYS";
    case HW_ENOMEM:
        return "HW_ENOMEM";
    case HW_EINVAL:
        return "HW_EINVAL";
    case HW_ETOOBIG:
        return "HW_ETOOBIG";
    case HW_ETOOMANYFDS:
        return "HW_ETOOMANYFDS";
    case HW_EFDS:
        return "HW_EFDS";
    case HW_ECTRUNC:
        return "HW_ECTRUNC";
    case HW_EPARTIAL:
        return "HW_EPARTIAL";
    case HW_ETIMEDOUT:
        return "HW_ETIMEDOUT";
    case HW_EADDRINUSE:
        return "HW_EADDRINUSE";
    case HW_ENAMETOOLONG:
        return "HW_ENAMETOOLONG";
    case HW_EBROKEN:
        return "HW_EBROKEN";
    default:
        return "HW_E(unknown)";
    }
}

/* Same checks on both sides; `who` starts the sentence. */
static int check_limits(const char *who, uint64_t len, uint64_t nfds, char *err, size_t errlen)
{
    if (len > HW_FRAME_MAX) {
        hw_seterr(err, errlen, "%s of %llu bytes exceeds the %u-byte limit", who, (unsigned long long)len,
                  HW_FRAME_MAX);
        return HW_ETOOBIG;
    }
    if (nfds > HW_FDS_MAX) {
        hw_seterr(err, errlen, "%s with %llu file descriptors exceeds the limit of %u", who, (unsigned long long)nfds,
                  HW_FDS_MAX);
        return HW_ETOOMANYFDS;
    }
    return 0;
}

void hw_frame_free(hw_frame *f)
{
    if (f == NULL)
        return;
    free(f->data);
    if (f->fds != NULL)
        close_fds(f->fds, f->nfds);
    free(f->fds);
    memset(f, 0, sizeof(*f));
}

/* ---- reader ------------------------------------------------------------ */

void hw_reader_init(hw_reader *r) { memset(r, 0, sizeof(*r)); }

/* Received fds go to the reader's closer. */
static void reader_close_fds(const hw_reader *r, const int *fds, size_t n)
{
    int saved = errno;
    for (size_t i = 0; i < n; i++) {
        if (fds[i] < 0)
            continue;
        if (r->close_fd != NULL)
            r->close_fd(fds[i], r->close_arg);
        else
            close(fds[i]);
    }
    errno = saved;
}

static void reader_drop(hw_reader *r)
{
    int saved = errno;
    for (size_t i = 0; i < r->npfd; i++)
        reader_close_fds(r, &r->pfd[i].fd, 1);
    r->npfd = 0;
    free(r->data);
    r->data = NULL;
    r->have_hdr = 0;
    r->hdr_got = 0;
    r->start = r->end = 0;
    errno = saved;
}

void hw_reader_free(hw_reader *r)
{
    if (r == NULL)
        return;
    reader_drop(r);
    free(r->buf);
    free(r->pfd);
    memset(r, 0, sizeof(*r));
}

void hw_reader_set_limits(hw_reader *r, size_t max_len, size_t max_fds)
{
    r->max_len = max_len;
    r->max_fds = max_fds;
}

void hw_reader_set_closer(hw_reader *r, void (*close_fd)(int fd, void *arg), void *arg)
{
    r->close_fd = close_fd;
    r->close_arg = arg;
}

size_t hw_reader_fds_held(const hw_reader *r) { return r->npfd; }

int hw_reader_buffered(const hw_reader *r) { return r->start < r->end; }

void hw_reader_shrink(hw_reader *r)
{
    if (r->buf != NULL && r->start >= r->end) {
        free(r->buf);
        r->buf = NULL;
        r->start = r->end = 0;
    }
}

/* Break the framing: close every fd held, free the partial frame. */
static int reader_fail(hw_reader *r, int code)
{
    reader_drop(r);
    r->failed = code;
    return code;
}

/* Received fds that belong to the current frame (a prefix of r->pfd). */
static size_t fds_in_frame(const hw_reader *r)
{
    size_t n = 0;
    while (n < r->npfd && r->pfd[n].pos < r->frame_end)
        n++;
    return n;
}

static int check_extra_fds(hw_reader *r, char *err, size_t errlen)
{
    size_t n;

    if (!r->have_hdr)
        return 0;
    n = fds_in_frame(r);
    if (n > r->nfds) {
        hw_seterr(err, errlen,
                  "frame carried at least %zu file descriptors but its header "
                  "announced %u; closed them",
                  n, (unsigned)r->nfds);
        return reader_fail(r, HW_EFDS);
    }
    return 0;
}

static int finish_frame(hw_reader *r, hw_frame *out, char *err, size_t errlen)
{
    size_t n = fds_in_frame(r);
    int *fds = NULL;

    if (n != r->nfds) {
        hw_seterr(err, errlen,
                  "frame of %u bytes carried %zu file descriptors but its header "
                  "announced %u; closed them",
                  (unsigned)r->len, n, (unsigned)r->nfds);
        return reader_fail(r, HW_EFDS);
    }
    if (n > 0) {
        fds = malloc(n * sizeof(*fds));
        if (fds == NULL) {
            hw_seterr(err, errlen, "out of memory for %zu received fds", n);
            return reader_fail(r, HW_ENOMEM);
        }
        for (size_t i = 0; i < n; i++)
            fds[i] = r->pfd[i].fd;
        memmove(r->pfd, r->pfd + n, (r->npfd - n) * sizeof(*r->pfd));
        r->npfd -= n;
    }
    r->data[r->len] = 0;
    out->data = r->data;
    out->len = r->len;
    out->fds = fds;
    out->nfds = n;
    r->data = NULL;
    r->have_hdr = 0;
    r->hdr_got = 0;
    r->got = 0;
    return HW_FRAME;
}

/* Consume buffered bytes. HW_FRAME, HW_AGAIN (buffer used up) or error. */
static int parse(hw_reader *r, hw_frame *out, char *err, size_t errlen)
{
    size_t avail = r->end - r->start, k;
    int rc;

    if (!r->have_hdr) {
        if (avail == 0)
            return HW_AGAIN;
        if (r->hdr_got == 0)
            r->frame_start = r->pos;
        k = min_sz(HW_HDR_SIZE - r->hdr_got, avail);
        memcpy(r->hdr + r->hdr_got, r->buf + r->start, k);
        r->hdr_got += k;
        r->start += k;
        r->pos += k;
        avail -= k;
        if (r->hdr_got < HW_HDR_SIZE)
            return HW_AGAIN;
        r->len = get_u32(r->hdr);
        r->nfds = get_u32(r->hdr + 4);
        /* Limits from the header alone, before allocating anything. */
        rc = check_limits("frame", r->len, r->nfds, err, errlen);
        if (rc < 0)
            return reader_fail(r, rc);
        if (r->max_len > 0 && r->len > r->max_len) {
            hw_seterr(err, errlen,
                      "frame of %u bytes exceeds this connection's "
                      "%zu-byte limit",
                      (unsigned)r->len, r->max_len);
            return reader_fail(r, HW_ETOOBIG);
        }
        r->data = malloc((size_t)r->len + 1);
        if (r->data == NULL) {
            hw_seterr(err, errlen, "out of memory for a frame of %u bytes", (unsigned)r->len);
            return reader_fail(r, HW_ENOMEM);
        }
        r->got = 0;
        r->have_hdr = 1;
        r->frame_end = r->frame_start + HW_HDR_SIZE + r->len;
        rc = check_extra_fds(r, err, errlen);
        if (rc < 0)
            return rc;
    }
    k = min_sz(r->len - r->got, avail);
    if (k) /* an idle reader has dropped its buffer (r->buf NULL, avail 0) */
        memcpy(r->data + r->got, r->buf + r->start, k);
    r->got += k;
    r->start += k;
    r->pos += k;
    if (r->got < r->len)
        return HW_AGAIN;
    return finish_frame(r, out, err, errlen);
}

static int pfd_push(hw_reader *r, const int *fds, size_t n, uint64_t pos)
{
    if (r->npfd + n > r->pfdcap) {
        size_t cap = r->pfdcap ? r->pfdcap : 256;
        struct hw_pfd *p;
        while (cap < r->npfd + n)
            cap *= 2;
        p = realloc(r->pfd, cap * sizeof(*p));
        if (p == NULL)
            return -1;
        r->pfd = p;
        r->pfdcap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        r->pfd[r->npfd].fd = fds[i];
        r->pfd[r->npfd].pos = pos;
        r->npfd++;
    }
    return 0;
}

static int in_frame(const hw_reader *r) { return r->have_hdr || r->hdr_got > 0 || r->npfd > 0; }

/* hw_read, step 1: where the next read goes (*iov). The rest of a large
 * payload goes straight into the frame (*direct); else into the read buffer,
 * made on first use. 0, or an error code. */
static int read_target(hw_reader *r, struct iovec *iov, int *direct, char *err, size_t errlen)
{
    *direct = r->have_hdr && r->len - r->got >= HW_READ_BUF;
    if (*direct) {
        iov->iov_base = r->data + r->got;
        iov->iov_len = r->len - r->got;
        return 0;
    }
    if (r->buf == NULL) {
        r->buf = malloc(HW_READ_BUF);
        if (r->buf == NULL) {
            hw_seterr(err, errlen, "out of memory for the read buffer");
            return reader_fail(r, HW_ENOMEM);
        }
    }
    r->start = r->end = 0;
    iov->iov_base = r->buf;
    iov->iov_len = HW_READ_BUF;
    return 0;
}

/* The fds a read carries (rfds[HW_SCM_MAX_FD * 2]: its SCM_RIGHTS messages'). */
#define READ_FDS_MAX (HW_SCM_MAX_FD * 2)

#define READ_DONE 1 /* read_once read something (or the peer's close) */

/* hw_read, step 2: one recvmsg into iov; its byte count in *n and its fds in
 * rfds (*nr of them). READ_DONE, HW_AGAIN (nothing to read) or an error code. */
static int read_once(int fd, hw_reader *r, struct iovec *iov, ssize_t *n, int *rfds, size_t *nr, char *err,
                     size_t errlen)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(HW_SCM_MAX_FD * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
    } cbuf;
    struct msghdr msg;
    struct cmsghdr *c;

    *nr = 0;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.buf;
    msg.msg_controllen = sizeof(cbuf.buf);
    do
        *n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (*n < 0 && errno == EINTR);
    if (*n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return HW_AGAIN;
        hw_seterr(err, errlen, "recvmsg failed: %s", strerror(errno));
        return reader_fail(r, HW_ESYS);
    }

    for (c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        size_t k;
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        if (*nr + k > READ_FDS_MAX)
            k = READ_FDS_MAX - *nr; /* cannot happen */
        memcpy(rfds + *nr, CMSG_DATA(c), k * sizeof(int));
        *nr += k;
    }
    if (msg.msg_flags & MSG_CTRUNC) {
        reader_close_fds(r, rfds, *nr);
        hw_seterr(err, errlen,
                  "ancillary data was truncated (MSG_CTRUNC): file "
                  "descriptors were lost (too many open files?)");
        return reader_fail(r, HW_ECTRUNC);
    }
    return READ_DONE;
}

/* hw_read, step 3: the peer closed (a read of 0 bytes, with nr fds). HW_EOF
 * between frames, else an error code. */
static int read_closed(hw_reader *r, const int *rfds, size_t nr, char *err, size_t errlen)
{
    if (nr > 0) {
        reader_close_fds(r, rfds, nr);
        hw_seterr(err, errlen,
                  "%zu file descriptors arrived without any frame "
                  "bytes; closed them",
                  nr);
        return reader_fail(r, HW_EFDS);
    }
    if (!in_frame(r))
        return HW_EOF;
    if (r->have_hdr)
        hw_seterr(err, errlen,
                  "connection closed in the middle of a frame "
                  "(%zu of %u payload bytes received)",
                  r->got, (unsigned)r->len);
    else if (r->hdr_got > 0)
        hw_seterr(err, errlen,
                  "connection closed in the middle of a frame "
                  "header (%zu of %u bytes received)",
                  r->hdr_got, HW_HDR_SIZE);
    else
        hw_seterr(err, errlen,
                  "connection closed with %zu file descriptors "
                  "outside any frame",
                  r->npfd);
    return reader_fail(r, HW_EPARTIAL);
}

int hw_read(int fd, hw_reader *r, hw_frame *out, char *err, size_t errlen)
{
    int rfds[READ_FDS_MAX];
    int rc;

    memset(out, 0, sizeof(*out));
    if (r->failed) {
        hw_seterr(err, errlen, "connection framing is already broken (%s); close it", hw_strerror(r->failed));
        return HW_EBROKEN;
    }
    for (;;) {
        struct iovec iov;
        size_t nr;
        ssize_t n;
        int direct;

        rc = parse(r, out, err, errlen);
        if (rc != HW_AGAIN)
            return rc;

        /* Buffer used up: read more. */
        rc = read_target(r, &iov, &direct, err, errlen);
        if (rc != 0)
            return rc;
        rc = read_once(fd, r, &iov, &n, rfds, &nr, err, errlen);
        if (rc != READ_DONE)
            return rc;
        if (n == 0)
            return read_closed(r, rfds, nr, err, errlen);
        /* The fds belong to the frame holding the last byte of this read. */
        if (nr > 0 && pfd_push(r, rfds, nr, r->pos + (uint64_t)n - 1) < 0) {
            reader_close_fds(r, rfds, nr);
            hw_seterr(err, errlen, "out of memory for received fds");
            return reader_fail(r, HW_ENOMEM);
        }
        if (direct) {
            r->got += (size_t)n;
            r->pos += (uint64_t)n;
        } else {
            r->end = (size_t)n;
        }
        rc = check_extra_fds(r, err, errlen);
        if (rc < 0)
            return rc;
        if (r->npfd > (r->max_fds > 0 ? r->max_fds : HW_FDS_MAX)) {
            hw_seterr(err, errlen,
                      "%zu file descriptors arrived for frames not "
                      "yet complete, over this connection's limit of %zu; "
                      "closed them",
                      r->npfd, r->max_fds > 0 ? r->max_fds : (size_t)HW_FDS_MAX);
            return reader_fail(r, HW_ETOOMANYFDS);
        }
    }
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
        k = min_sz(HW_HDR_SIZE - off, max);
        iov[n].iov_base = (void *)(f->hdr + off);
        iov[n].iov_len = k;
        n++;
        max -= k;
        *bytes += k;
        off = HW_HDR_SIZE;
    }
    if (off < wf_total(f) && max > 0) {
        k = min_sz(wf_total(f) - off, max);
        iov[n].iov_base = (void *)(f->data + (off - HW_HDR_SIZE));
        iov[n].iov_len = k;
        n++;
        *bytes += k;
    }
    return n;
}

void hw_writer_init(hw_writer *w) { memset(w, 0, sizeof(*w)); }

static void wf_free(struct hw_wframe *f)
{
    if (f->owned) {
        close_fds(f->fds + f->fds_sent, f->nfds - f->fds_sent);
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
    memset(w, 0, sizeof(*w));
}

static int check_out(const void *data, size_t len, const int *fds, size_t nfds, char *err, size_t errlen)
{
    int rc = check_limits("outgoing frame", len, nfds, err, errlen);
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

        nb = min_sz(HW_FDS_PER_MSG, left);
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
            close_fds(f->fds + f->fds_sent, nb);
        f->fds_sent += nb;
    }
    while (n > 0) {
        size_t take;
        g = w->head;
        take = min_sz((size_t)n, wf_total(g) - g->off);
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
    while (w->head != NULL) {
        int rc = writer_step(fd, w, err, errlen);
        if (rc <= 0)
            return rc;
    }
    return 1;
}

/* ---- nonblocking mode ------------------------------------------------- */

/* Here, not in wire_sock.c: what the framing needs of a socket (the fuzz
 * target, tests/fuzz/run.sh, links wire.c alone). */
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
