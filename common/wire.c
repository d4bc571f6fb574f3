/*
 * wire.c - framing for the heapd Unix-socket protocol, its reading half: the
 * result codes, received frames, the reader (hw_read). See wire.h for the
 * contract. Modelled on tmux's compat/imsg.c: lengths are checked before
 * allocation, fds are attached to messages, stray fds are closed. The writer
 * and the blocking client helpers are in wire_write.c, the Unix sockets
 * (listen, connect) in wire_sock.c; wire_int.h holds what they share.
 */
#include "wire_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

void hw_close_fds(const int *fds, size_t n)
{
    int saved = errno;
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    errno = saved;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

const char *hw_strerror(int code)
{
    switch (code) {
#define HW_CODE_NAME(name, value, desc)                                                                                \
    case name:                                                                                                         \
        return #name;
        HW_CODE_MAP(HW_CODE_NAME)
#undef HW_CODE_NAME
    }
    return "HW_E(unknown)";
}

const char *hw_errdesc(int code)
{
    switch (code) {
#define HW_CODE_DESC(name, value, desc)                                                                                \
    case name:                                                                                                         \
        return desc;
        HW_CODE_MAP(HW_CODE_DESC)
#undef HW_CODE_DESC
    }
    return "unknown wire code";
}

/* Same checks on both sides; `who` starts the sentence. */
int hw_check_limits(const char *who, uint64_t len, uint64_t nfds, char *err, size_t errlen)
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
        hw_close_fds(f->fds, f->nfds);
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
        k = hw_min_sz(HW_HDR_SIZE - r->hdr_got, avail);
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
        rc = hw_check_limits("frame", r->len, r->nfds, err, errlen);
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
    k = hw_min_sz(r->len - r->got, avail);
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

int hw_reader_in_frame(const hw_reader *r) { return in_frame(r) || r->start < r->end; }

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
