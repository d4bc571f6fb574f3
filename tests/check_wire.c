/*
 * check_wire.c - unit tests for common/wire.c (framing, fd passing) and wire_sock.c (sockets).
 * Real socketpairs and real memfds; fd leaks are measured by counting
 * /proc/self/fd before and after.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wire.h"
#include "check_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

#define ERRLEN 512

/* ---- helpers ----------------------------------------------------------- */

static void raise_nofile(void)
{
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = rl.rlim_max;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < 4 * HW_FDS_MAX + 64)
        ck_abort_msg("RLIMIT_NOFILE hard limit %llu too low for the fd tests", (unsigned long long)rl.rlim_cur);
}

static void sockpair(int sv[2]) { ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0); }

static void close_pair(int sv[2])
{
    if (sv[0] >= 0)
        close(sv[0]);
    if (sv[1] >= 0)
        close(sv[1]);
    sv[0] = sv[1] = -1;
}

/* A memfd holding a 4-byte tag at offset 0. */
static int mk_memfd(uint32_t tag)
{
    int fd = memfd_create("check_wire", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, &tag, sizeof(tag), 0), (ssize_t)sizeof(tag));
    return fd;
}

static uint32_t read_tag(int fd)
{
    uint32_t tag = 0;
    ck_assert_int_eq(pread(fd, &tag, sizeof(tag), 0), (ssize_t)sizeof(tag));
    return tag;
}

static ino_t ino_of(int fd)
{
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    return st.st_ino;
}

static int *mk_memfds(size_t n, uint32_t base)
{
    int *fds = calloc(n ? n : 1, sizeof(int));
    ck_assert_ptr_nonnull(fds);
    for (size_t i = 0; i < n; i++)
        fds[i] = mk_memfd(base + (uint32_t)i);
    return fds;
}

static void close_all(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

static void put_hdr(unsigned char *p, uint32_t len, uint32_t nfds)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(len >> (8 * i));
        p[4 + i] = (unsigned char)(nfds >> (8 * i));
    }
}

/* One sendmsg of buf with fds attached; asserts everything went out. */
static void raw_send(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(253 * sizeof(int))];
    } cb;
    struct iovec iov = {.iov_base = (void *)(uintptr_t)buf, .iov_len = len};
    struct msghdr msg;

    ck_assert_uint_le(nfds, 253);
    memset(&msg, 0, sizeof(msg));
    memset(&cb, 0, sizeof(cb));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds > 0) {
        struct cmsghdr *c;
        msg.msg_control = cb.b;
        msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    ck_assert_int_eq(sendmsg(fd, &msg, MSG_NOSIGNAL), (ssize_t)len);
}

static unsigned char pattern(size_t i) { return (unsigned char)((i * 131u + (i >> 12) * 7u + 1u) & 0xff); }

static unsigned char *mk_payload(size_t len)
{
    unsigned char *p = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < len; i++)
        p[i] = pattern(i);
    return p;
}

static void check_payload(const hw_frame *f, size_t len)
{
    ck_assert_uint_eq(f->len, len);
    ck_assert_ptr_nonnull(f->data);
    for (size_t i = 0; i < len; i++)
        if (f->data[i] != pattern(i))
            ck_abort_msg("payload byte %zu is %u, want %u", i, f->data[i], pattern(i));
    ck_assert_uint_eq(f->data[len], 0);
}

/* Received fds are the sent ones (same inodes, same tags) and have
 * FD_CLOEXEC; writes through one are seen through the other. */
static void check_same_fds(const int *sent_ino_fds, const ino_t *inos, uint32_t base, const hw_frame *f, size_t n)
{
    ck_assert_uint_eq(f->nfds, n);
    if (n == 0) {
        ck_assert_ptr_null(f->fds);
        return;
    }
    ck_assert_ptr_nonnull(f->fds);
    for (size_t i = 0; i < n; i++) {
        int fd = f->fds[i];
        ck_assert_int_ge(fd, 0);
        ck_assert_uint_eq(ino_of(fd), inos[i]);
        ck_assert_uint_eq(read_tag(fd), base + (uint32_t)i);
        ck_assert_int_ne(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    }
    if (sent_ino_fds != NULL) {
        uint32_t magic = 0xC0FFEE00u;
        ck_assert_int_eq(pwrite(f->fds[n - 1], &magic, 4, 0), 4);
        ck_assert_uint_eq(read_tag(sent_ino_fds[n - 1]), magic);
    }
}

static ino_t *inos_of(const int *fds, size_t n)
{
    ino_t *v = calloc(n ? n : 1, sizeof(ino_t));
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = ino_of(fds[i]);
    return v;
}

/* Read one frame, waiting up to 5 s. */
static int recv5(int fd, hw_reader *r, hw_frame *f, char *err) { return hw_recv_frame(fd, r, f, 5000, err, ERRLEN); }

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define ck_assert_err_has(err, s) ck_assert_msg(strstr((err), (s)) != NULL, "error '%s' lacks '%s'", (err), (s))

/* Sender thread: hw_send_frame while the test thread reads. */
struct sender {
    pthread_t t;
    int fd;
    const void *data;
    size_t len;
    const int *fds;
    size_t nfds;
    int rc;
    char err[ERRLEN];
};

static void *sender_main(void *arg)
{
    struct sender *s = arg;
    s->rc = hw_send_frame(s->fd, s->data, s->len, s->fds, s->nfds, s->err, sizeof(s->err));
    return NULL;
}

static void sender_start(struct sender *s, int fd, const void *data, size_t len, const int *fds, size_t nfds)
{
    memset(s, 0, sizeof(*s));
    s->fd = fd;
    s->data = data;
    s->len = len;
    s->fds = fds;
    s->nfds = nfds;
    ck_assert_int_eq(pthread_create(&s->t, NULL, sender_main, s), 0);
}

static void sender_join(struct sender *s)
{
    ck_assert_int_eq(pthread_join(s->t, NULL), 0);
    ck_assert_msg(s->rc == 0, "hw_send_frame: %d %s", s->rc, s->err);
}

/* ---- round trips --------------------------------------------------------- */

START_TEST(test_empty_payload)
{
    int sv[2];
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char raw[16];

    sockpair(sv);
    hw_reader_init(&r);
    ck_assert_int_eq(hw_send_frame(sv[0], NULL, 0, NULL, 0, err, ERRLEN), 0);
    /* On the wire: exactly an 8-byte header of zeros. */
    ck_assert_int_eq(recv(sv[1], raw, sizeof(raw), MSG_PEEK | MSG_DONTWAIT), 8);
    ck_assert_int_eq(memcmp(raw, "\0\0\0\0\0\0\0\0", 8), 0);

    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_FRAME);
    ck_assert_uint_eq(f.len, 0);
    ck_assert_ptr_nonnull(f.data);
    ck_assert_uint_eq(f.data[0], 0);
    ck_assert_uint_eq(f.nfds, 0);
    ck_assert_ptr_null(f.fds);
    hw_frame_free(&f);
    ck_assert_ptr_null(f.data);
    /* Nothing more. */
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_AGAIN);
    ck_assert_ptr_null(f.data);
    hw_reader_free(&r);
    close_pair(sv);
}
END_TEST

START_TEST(test_small_payload)
{
    int sv[2];
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char raw[32];
    const unsigned char want[] = {5, 0, 0, 0, 0, 0, 0, 0, 'h', 'e', 'l', 'l', 'o'};

    sockpair(sv);
    hw_reader_init(&r);
    ck_assert_int_eq(hw_send_frame(sv[0], "hello", 5, NULL, 0, err, ERRLEN), 0);
    /* Header is little-endian u32 length, u32 nfds. */
    ck_assert_int_eq(recv(sv[1], raw, sizeof(raw), MSG_PEEK | MSG_DONTWAIT), 13);
    ck_assert_int_eq(memcmp(raw, want, sizeof(want)), 0);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_FRAME);
    ck_assert_uint_eq(f.len, 5);
    ck_assert_str_eq((char *)f.data, "hello");
    hw_frame_free(&f);

    /* Header with a multi-byte length, decoded little-endian. */
    unsigned char *p = mk_payload(0x01F3);
    ck_assert_int_eq(hw_send_frame(sv[0], p, 0x01F3, NULL, 0, err, ERRLEN), 0);
    ck_assert_int_eq(recv(sv[1], raw, 8, MSG_PEEK | MSG_DONTWAIT), 8);
    ck_assert_uint_eq(raw[0], 0xF3);
    ck_assert_uint_eq(raw[1], 0x01);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_FRAME);
    check_payload(&f, 0x01F3);
    hw_frame_free(&f);
    free(p);
    hw_reader_free(&r);
    close_pair(sv);
}
END_TEST

/* A payload of exactly HW_FRAME_MAX, split by the socket into many reads. */
START_TEST(test_max_payload)
{
    int sv[2];
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char *p = mk_payload(HW_FRAME_MAX);
    struct sender s;

    for (int nonblock = 0; nonblock < 2; nonblock++) {
        sockpair(sv);
        if (nonblock) /* hw_send_frame must poll when the socket is full */
            ck_assert_int_eq(hw_set_nonblock(sv[0]), 0);
        hw_reader_init(&r);
        sender_start(&s, sv[0], p, HW_FRAME_MAX, NULL, 0);
        ck_assert_msg(recv5(sv[1], &r, &f, err) == HW_FRAME, "%s", err);
        sender_join(&s);
        check_payload(&f, HW_FRAME_MAX);
        hw_frame_free(&f);
        close(sv[0]);
        ck_assert_int_eq(recv5(sv[1], &r, &f, err), HW_EOF);
        hw_reader_free(&r);
        close(sv[1]);
    }
    free(p);
}
END_TEST

START_TEST(test_oversize_header)
{
    static const struct {
        uint32_t len, nfds;
        int rc;
        const char *msg;
    } cases[] = {
        {HW_FRAME_MAX + 1, 0, HW_ETOOBIG, "frame of 4194305 bytes exceeds the 4194304-byte limit"},
        {0xFFFFFFFFu, 0, HW_ETOOBIG, "4294967295 bytes"},
        {10, HW_FDS_MAX + 1, HW_ETOOMANYFDS, "1025 file descriptors"},
        {10, 0xFFFFFFFFu, HW_ETOOMANYFDS, "limit of 1024"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int sv[2];
        hw_reader r;
        hw_frame f;
        char err[ERRLEN] = "";
        unsigned char hdr[8];

        sockpair(sv);
        hw_reader_init(&r);
        put_hdr(hdr, cases[i].len, cases[i].nfds);
        /* Only the header: the error must come from it alone. */
        raw_send(sv[0], hdr, 8, NULL, 0);
        ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), cases[i].rc);
        ck_assert_err_has(err, cases[i].msg);
        ck_assert_ptr_null(r.data); /* no payload buffer allocated */
        ck_assert_ptr_null(f.data);
        /* The reader stays failed. */
        ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_EBROKEN);
        hw_reader_free(&r);
        close_pair(sv);
    }
}
END_TEST

/* With the address space capped a few MiB above current use, a header of
 * HW_FRAME_MAX fails to allocate (HW_ENOMEM: the cap bites) while a header of
 * HW_FRAME_MAX + 1 is refused before allocating (HW_ETOOBIG). */
START_TEST(test_oversize_no_alloc)
{
#ifdef UNDER_ASAN
    return; /* ASan reserves terabytes of address space: RLIMIT_AS unusable */
#else
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int a[2], b[2], code = 0;
        hw_reader ra, rb;
        hw_frame f;
        char err[ERRLEN];
        unsigned char h1[8], h2[8];
        unsigned long pages = 0;
        FILE *fp;
        struct rlimit rl;

        if (socketpair(AF_UNIX, SOCK_STREAM, 0, a) || socketpair(AF_UNIX, SOCK_STREAM, 0, b))
            _exit(10);
        hw_reader_init(&ra);
        hw_reader_init(&rb);
        /* Warm up: allocates the read buffers. */
        if (hw_read(a[1], &ra, &f, err, ERRLEN) != HW_AGAIN || hw_read(b[1], &rb, &f, err, ERRLEN) != HW_AGAIN)
            _exit(11);
        put_hdr(h1, HW_FRAME_MAX, 0);
        put_hdr(h2, HW_FRAME_MAX + 1, 0);
        if (write(a[0], h1, 8) != 8 || write(b[0], h2, 8) != 8)
            _exit(12);
        fp = fopen("/proc/self/statm", "r");
        if (fp == NULL || fscanf(fp, "%lu", &pages) != 1)
            _exit(13);
        fclose(fp);
        rl.rlim_cur = rl.rlim_max = pages * (unsigned long)sysconf(_SC_PAGESIZE) + (2u << 20);
        if (setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(14);
        if (hw_read(a[1], &ra, &f, err, ERRLEN) != HW_ENOMEM)
            code |= 1;
        if (hw_read(b[1], &rb, &f, err, ERRLEN) != HW_ETOOBIG)
            code |= 2;
        _exit(code);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st), "child died");
    ck_assert_msg(WEXITSTATUS(st) == 0,
                  "child exit %d (1: cap did not bite, "
                  "2: oversize frame was not refused before allocating)",
                  WEXITSTATUS(st));
#endif
}
END_TEST

/* ---- fds ----------------------------------------------------------------- */

/* Flush w into a and read one frame from b (nonblocking) until both are
 * done: the frame may be larger than the socket buffer. */
static void pump(int a, hw_writer *w, int b, hw_reader *r, hw_frame *f)
{
    char err[ERRLEN] = "";
    int done = 0, got = 0;

    for (long rounds = 0; !done || !got; rounds++) {
        int rc;
        ck_assert_int_lt(rounds, 10000000);
        if (!done) {
            rc = hw_writer_flush(a, w, err, ERRLEN);
            ck_assert_msg(rc >= 0, "flush: %s", err);
            done = rc == 1;
        }
        if (!got) {
            rc = hw_read(b, r, f, err, ERRLEN);
            ck_assert_msg(rc == HW_AGAIN || rc == HW_FRAME, "read: %d %s", rc, err);
            got = rc == HW_FRAME;
        }
    }
}

static void fd_roundtrip(size_t n, size_t len, int use_writer)
{
    int sv[2];
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    int before, *fds;
    ino_t *inos;
    unsigned char *p = mk_payload(len);
    uint32_t base = 1000u * (uint32_t)n + 7;

    raise_nofile();
    sockpair(sv);
    hw_reader_init(&r);
    before = cku_count_fds();
    fds = mk_memfds(n, base);
    inos = inos_of(fds, n);
    if (use_writer) {
        hw_writer w;
        hw_writer_init(&w);
        ck_assert_msg(hw_writer_push(&w, p, len, fds, n, err, ERRLEN) == 0, "%s", err);
        ck_assert_uint_eq(hw_writer_pending(&w), 1);
        pump(sv[0], &w, sv[1], &r, &f);
        ck_assert_uint_eq(hw_writer_pending(&w), 0);
        ck_assert_uint_eq(hw_writer_pending_bytes(&w), 0);
        hw_writer_free(&w);
        /* The writer closed its fds once sent: only the received ones remain. */
        ck_assert_int_eq(cku_count_fds(), before + (int)n);
    } else {
        ck_assert_msg(hw_send_frame(sv[0], p, len, fds, n, err, ERRLEN) == 0, "%s", err);
        /* hw_send_frame does not take ownership: ours are still open. */
        for (size_t i = 0; i < n; i++)
            ck_assert_int_ge(fcntl(fds[i], F_GETFD), 0);
        ck_assert_msg(recv5(sv[1], &r, &f, err) == HW_FRAME, "n=%zu: %s", n, err);
    }
    check_payload(&f, len);
    check_same_fds(use_writer ? NULL : fds, inos, base, &f, n);
    if (n > 0) {
        /* Taking an fd: hw_frame_free leaves it open. */
        int kept = f.fds[0];
        f.fds[0] = -1;
        hw_frame_free(&f);
        ck_assert_uint_eq(ino_of(kept), inos[0]);
        close(kept);
    } else {
        hw_frame_free(&f);
    }
    if (!use_writer)
        close_all(fds, n);
    ck_assert_int_eq(cku_count_fds(), before);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_AGAIN);
    hw_reader_free(&r);
    close_pair(sv);
    free(fds);
    free(inos);
    free(p);
}

static const size_t fd_counts[] = {0, 1, 249, 250, 251, 253, 254, 500, 501, 1000, HW_FDS_MAX};

START_TEST(test_fds_counts)
{
    size_t n = fd_counts[_i];
    fd_roundtrip(n, 0, 0); /* empty payload: batches share the header */
    fd_roundtrip(n, 100, 0);
    fd_roundtrip(n, 0, 1);
    fd_roundtrip(n, 300000, 1); /* large payload: partial sendmsg with fds */
}
END_TEST

START_TEST(test_sender_refuses)
{
    int sv[2], fd, fds[HW_FDS_MAX + 1];
    hw_reader r;
    hw_frame f;
    hw_writer w;
    char err[ERRLEN] = "";
    static unsigned char big[16];

    sockpair(sv);
    hw_reader_init(&r);
    hw_writer_init(&w);
    fd = mk_memfd(1);
    for (size_t i = 0; i < HW_FDS_MAX + 1; i++)
        fds[i] = fd;
    ck_assert_int_eq(hw_send_frame(sv[0], "x", 1, fds, HW_FDS_MAX + 1, err, ERRLEN), HW_ETOOMANYFDS);
    ck_assert_err_has(err, "1025 file descriptors exceeds the limit of 1024");
    ck_assert_int_eq(hw_writer_push(&w, "x", 1, fds, HW_FDS_MAX + 1, err, ERRLEN), HW_ETOOMANYFDS);
    /* Length is checked before the data is touched. */
    ck_assert_int_eq(hw_send_frame(sv[0], big, HW_FRAME_MAX + 1, NULL, 0, err, ERRLEN), HW_ETOOBIG);
    ck_assert_err_has(err, "4194305 bytes exceeds the 4194304-byte limit");
    ck_assert_int_eq(hw_writer_push(&w, big, HW_FRAME_MAX + 1, NULL, 0, err, ERRLEN), HW_ETOOBIG);
    fds[1] = -1;
    ck_assert_int_eq(hw_writer_push(&w, "x", 1, fds, 2, err, ERRLEN), HW_EINVAL);
    ck_assert_int_eq(hw_send_frame(sv[0], NULL, 3, NULL, 0, err, ERRLEN), HW_EINVAL);
    ck_assert_uint_eq(hw_writer_pending(&w), 0);
    /* Refused pushes leave the fds with the caller. */
    ck_assert_int_ge(fcntl(fd, F_GETFD), 0);
    /* Nothing was sent. */
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_AGAIN);
    close(fd);
    hw_writer_free(&w);
    hw_reader_free(&r);
    close_pair(sv);
}
END_TEST

/* A header announcing `announced` fds, with `batches` raw sendmsgs carrying
 * `per` fds each: the reader must fail with HW_EFDS and close them all. */
static void bad_fd_frame(uint32_t announced, size_t batches, size_t per)
{
    int sv[2], before, *fds;
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char buf[8 + 16];
    int rc;

    sockpair(sv);
    hw_reader_init(&r);
    before = cku_count_fds();
    fds = mk_memfds(per, 0);
    put_hdr(buf, 16, announced);
    memset(buf + 8, 'z', 16);
    /* batch k carries bytes [k, k+1), the last carries the rest */
    for (size_t k = 0; k < batches; k++) {
        size_t end = k + 1 == batches ? sizeof(buf) : k + 1;
        raw_send(sv[0], buf + k, end - k, fds, per);
    }
    close_all(fds, per);
    do
        rc = hw_read(sv[1], &r, &f, err, ERRLEN);
    while (rc == HW_AGAIN);
    ck_assert_msg(rc == HW_EFDS, "announced %u, sent %zu: rc %d (%s)", announced, batches * per, rc, err);
    ck_assert_err_has(err, "announced");
    ck_assert_ptr_null(f.fds);
    ck_assert_int_eq(cku_count_fds(), before);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_EBROKEN);
    hw_reader_free(&r);
    ck_assert_int_eq(cku_count_fds(), before);
    close_pair(sv);
    free(fds);
}

START_TEST(test_fd_count_mismatch)
{
    bad_fd_frame(0, 1, 3);     /* fds on a frame that announced none */
    bad_fd_frame(2, 1, 5);     /* more than announced */
    bad_fd_frame(3, 1, 1);     /* fewer than announced */
    bad_fd_frame(4, 2, 3);     /* more, spread over two batches */
    bad_fd_frame(250, 3, 100); /* more, found early in the second batch */
}
END_TEST

/* fds that arrive with no frame to belong to: with part of a header then
 * EOF, and with nothing at all. */
START_TEST(test_fds_outside_frame)
{
    int sv[2], before, *fds;
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char hdr[8];
    int rc;

    sockpair(sv);
    hw_reader_init(&r);
    before = cku_count_fds();
    fds = mk_memfds(4, 0);
    put_hdr(hdr, 0, 4);
    raw_send(sv[0], hdr, 3, fds, 4); /* 3 header bytes + 4 fds, then EOF */
    close_all(fds, 4);
    close(sv[0]);
    sv[0] = -1;
    do
        rc = hw_read(sv[1], &r, &f, err, ERRLEN);
    while (rc == HW_AGAIN);
    ck_assert_int_eq(rc, HW_EPARTIAL);
    ck_assert_err_has(err, "closed in the middle of a frame header");
    ck_assert_int_eq(cku_count_fds(), before - 1);
    hw_reader_free(&r);
    close_pair(sv);

    /* A complete fd-less frame followed by stray fds on the next bytes:
     * the fds land in a frame that announced none. */
    sockpair(sv);
    hw_reader_init(&r);
    before = cku_count_fds();
    fds = realloc(fds, 2 * sizeof(int));
    fds[0] = mk_memfd(1);
    fds[1] = mk_memfd(2);
    {
        unsigned char two[16];
        put_hdr(two, 0, 0);
        put_hdr(two + 8, 0, 0);
        raw_send(sv[0], two, 8, NULL, 0);
        raw_send(sv[0], two + 8, 8, fds, 2);
    }
    close_all(fds, 2);
    ck_assert_int_eq(recv5(sv[1], &r, &f, err), HW_FRAME);
    ck_assert_uint_eq(f.nfds, 0);
    hw_frame_free(&f);
    ck_assert_int_eq(recv5(sv[1], &r, &f, err), HW_EFDS);
    ck_assert_int_eq(cku_count_fds(), before);
    hw_reader_free(&r);
    close_pair(sv);
    free(fds);
}
END_TEST

/* Issue 15: a reader's own limits. A header over max_len fails at once; fds
 * over max_fds fail as they arrive, before the header is complete; the fds
 * the reader closes go to its closer, never to close() directly. */
static int closed_by_closer[2048];
static size_t nclosed_by_closer;
static void test_closer(int fd, void *arg)
{
    ck_assert_ptr_eq(arg, (void *)&nclosed_by_closer);
    if (nclosed_by_closer < 2048)
        closed_by_closer[nclosed_by_closer++] = fd;
    close(fd);
}

START_TEST(test_reader_limits)
{
    int sv[2], before, *fds;
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char hdr[8];

    /* max_len: a 4097-byte frame on a 4096-byte reader. */
    sockpair(sv);
    hw_reader_init(&r);
    hw_reader_set_limits(&r, 4096, 0);
    put_hdr(hdr, 4097, 0);
    raw_send(sv[0], hdr, 8, NULL, 0);
    ck_assert_int_eq(recv5(sv[1], &r, &f, err), HW_ETOOBIG);
    ck_assert_err_has(err, "4096-byte limit");
    hw_reader_free(&r);
    close_pair(sv);

    /* max_fds: 3 header bytes with 2 fds each on a reader that holds 5;
     * the closer gets every fd. */
    sockpair(sv);
    hw_reader_init(&r);
    hw_reader_set_limits(&r, 0, 5);
    nclosed_by_closer = 0;
    hw_reader_set_closer(&r, test_closer, &nclosed_by_closer);
    before = cku_count_fds();
    fds = mk_memfds(2, 0);
    put_hdr(hdr, 0, 6);
    raw_send(sv[0], hdr, 1, fds, 2);
    raw_send(sv[0], hdr + 1, 1, fds, 2);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_AGAIN);
    ck_assert_uint_eq(hw_reader_fds_held(&r), 4);
    raw_send(sv[0], hdr + 2, 1, fds, 2);
    ck_assert_int_eq(recv5(sv[1], &r, &f, err), HW_ETOOMANYFDS);
    ck_assert_err_has(err, "limit of 5");
    ck_assert_uint_eq(hw_reader_fds_held(&r), 0);
    ck_assert_uint_eq(nclosed_by_closer, 6);
    close_all(fds, 2);
    free(fds);
    ck_assert_int_eq(cku_count_fds(), before);
    hw_reader_free(&r);
    close_pair(sv);

    /* shrink: no buffer while nothing is buffered; frames still parse. */
    sockpair(sv);
    hw_reader_init(&r);
    {
        unsigned char two[8 + 3 + 8 + 2];
        put_hdr(two, 3, 0);
        memcpy(two + 8, "abc", 3);
        put_hdr(two + 11, 2, 0);
        memcpy(two + 19, "de", 2);
        raw_send(sv[0], two, sizeof two, NULL, 0);
    }
    ck_assert_int_eq(recv5(sv[1], &r, &f, err), HW_FRAME);
    hw_frame_free(&f);
    ck_assert_int_eq(hw_reader_buffered(&r), 1);
    hw_reader_shrink(&r); /* bytes left: kept */
    ck_assert_int_eq(recv5(sv[1], &r, &f, err), HW_FRAME);
    ck_assert_uint_eq(f.len, 2);
    hw_frame_free(&f);
    ck_assert_int_eq(hw_reader_buffered(&r), 0);
    hw_reader_shrink(&r);
    ck_assert_ptr_null(r.buf);
    hw_reader_free(&r);
    close_pair(sv);
}
END_TEST

/* MSG_CTRUNC: the receiver cannot install all fds (RLIMIT_NOFILE); the ones
 * that were installed are closed and the read fails. */
START_TEST(test_ctrunc)
{
    int sv[2], before, *fds, fill[4096];
    size_t nfill = 0;
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    struct rlimit rl, low;
    int rc;

    raise_nofile();
    sockpair(sv);
    hw_reader_init(&r);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_AGAIN); /* buffers */
    fds = mk_memfds(10, 0);
    ck_assert_int_eq(hw_send_frame(sv[0], "abc", 3, fds, 10, err, ERRLEN), 0);
    close_all(fds, 10);
    before = cku_count_fds();
    /* Leave exactly 3 free descriptor slots. */
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    low = rl;
    low.rlim_cur = (rlim_t)before + 64;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    for (;;) {
        int d = dup(sv[0]);
        if (d < 0) {
            ck_assert_int_eq(errno, EMFILE);
            break;
        }
        ck_assert_uint_lt(nfill, sizeof(fill) / sizeof(fill[0]));
        fill[nfill++] = d;
    }
    ck_assert_uint_ge(nfill, 3);
    for (int i = 0; i < 3; i++)
        close(fill[--nfill]);
    rc = hw_read(sv[1], &r, &f, err, ERRLEN);
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    close_all(fill, nfill);
    ck_assert_msg(rc == HW_ECTRUNC, "rc %d: %s", rc, err);
    ck_assert_err_has(err, "MSG_CTRUNC");
    ck_assert_ptr_null(f.fds);
    /* The 3 fds the kernel did install were closed. */
    ck_assert_int_eq(cku_count_fds(), before);
    hw_reader_free(&r);
    close_pair(sv);
    free(fds);
}
END_TEST

/* ---- stream handling ------------------------------------------------------ */

START_TEST(test_many_frames_one_write)
{
    static const size_t lens[] = {0, 1, 100, 70000, 3, 0, 65536};
    const size_t nf = sizeof(lens) / sizeof(lens[0]);
    int sv[2];
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    size_t total = 0, off = 0;
    unsigned char *buf;

    for (size_t i = 0; i < nf; i++)
        total += 8 + lens[i];
    buf = malloc(total);
    ck_assert_ptr_nonnull(buf);
    for (size_t i = 0; i < nf; i++) {
        put_hdr(buf + off, (uint32_t)lens[i], 0);
        for (size_t j = 0; j < lens[i]; j++)
            buf[off + 8 + j] = pattern(j);
        off += 8 + lens[i];
    }
    sockpair(sv);
    hw_reader_init(&r);
    ck_assert_int_eq(write(sv[0], buf, total), (ssize_t)total);
    close(sv[0]);
    sv[0] = -1;
    for (size_t i = 0; i < nf; i++) {
        ck_assert_msg(hw_read(sv[1], &r, &f, err, ERRLEN) == HW_FRAME, "frame %zu: %s", i, err);
        check_payload(&f, lens[i]);
        ck_assert_uint_eq(f.nfds, 0);
        hw_frame_free(&f);
    }
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_EOF);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_EOF);
    hw_reader_free(&r);
    close_pair(sv);
    free(buf);
}
END_TEST

/* Frames with and without fds queued together: each frame gets its own fds. */
START_TEST(test_writer_mixed_fds)
{
    static const size_t nfds[] = {0, 2, 0, 0, 3, 300, 0, 1};
    static const size_t lens[] = {10, 0, 5, 70000, 1, 0, 2, 4};
    const size_t nf = sizeof(nfds) / sizeof(nfds[0]);
    int sv[2], before, *fds[8];
    ino_t *inos[8];
    hw_reader r;
    hw_writer w;
    hw_frame f;
    char err[ERRLEN] = "";

    raise_nofile();
    sockpair(sv);
    hw_reader_init(&r);
    hw_writer_init(&w);
    before = cku_count_fds();
    for (size_t i = 0; i < nf; i++) {
        unsigned char *p = mk_payload(lens[i]);
        fds[i] = mk_memfds(nfds[i], 100u * (uint32_t)i);
        inos[i] = inos_of(fds[i], nfds[i]);
        ck_assert_int_eq(hw_writer_push(&w, p, lens[i], fds[i], nfds[i], err, ERRLEN), 0);
        free(p);
    }
    ck_assert_uint_eq(hw_writer_pending(&w), nf);
    ck_assert_int_eq(hw_writer_flush(sv[0], &w, err, ERRLEN), 1);
    ck_assert_uint_eq(hw_writer_pending(&w), 0);
    for (size_t i = 0; i < nf; i++) {
        ck_assert_msg(recv5(sv[1], &r, &f, err) == HW_FRAME, "frame %zu: %s", i, err);
        check_payload(&f, lens[i]);
        check_same_fds(NULL, inos[i], 100u * (uint32_t)i, &f, nfds[i]);
        hw_frame_free(&f);
        free(fds[i]);
        free(inos[i]);
    }
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_AGAIN);
    ck_assert_int_eq(cku_count_fds(), before);
    hw_writer_free(&w);
    hw_reader_free(&r);
    close_pair(sv);
}
END_TEST

/* One byte per write, fds attached to two different bytes; nonblocking
 * reads return HW_AGAIN until the last byte. */
START_TEST(test_byte_at_a_time)
{
    const size_t len = 300, total = 8 + len;
    int sv[2], before, *fds;
    ino_t *inos;
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char *buf = malloc(total);

    ck_assert_ptr_nonnull(buf);
    put_hdr(buf, (uint32_t)len, 3);
    for (size_t i = 0; i < len; i++)
        buf[8 + i] = pattern(i);
    sockpair(sv);
    ck_assert_int_eq(hw_set_nonblock(sv[1]), 0);
    ck_assert_int_ne(fcntl(sv[1], F_GETFL) & O_NONBLOCK, 0);
    hw_reader_init(&r);
    before = cku_count_fds();
    fds = mk_memfds(3, 50);
    inos = inos_of(fds, 3);
    for (size_t i = 0; i < total; i++) {
        if (i == 3)
            raw_send(sv[0], buf + i, 1, fds, 2); /* mid-header */
        else if (i == 200)
            raw_send(sv[0], buf + i, 1, fds + 2, 1); /* mid-payload */
        else
            raw_send(sv[0], buf + i, 1, NULL, 0);
        int rc = hw_read(sv[1], &r, &f, err, ERRLEN);
        if (i + 1 < total) {
            ck_assert_msg(rc == HW_AGAIN, "byte %zu: rc %d %s", i, rc, err);
        } else {
            ck_assert_msg(rc == HW_FRAME, "last byte: rc %d %s", rc, err);
        }
    }
    check_payload(&f, len);
    check_same_fds(fds, inos, 50, &f, 3);
    hw_frame_free(&f);
    close_all(fds, 3);
    ck_assert_int_eq(cku_count_fds(), before);
    hw_reader_free(&r);
    close_pair(sv);
    free(fds);
    free(inos);
    free(buf);
}
END_TEST

START_TEST(test_eof)
{
    int sv[2];
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char buf[8 + 100];

    /* Mid-payload. */
    sockpair(sv);
    hw_reader_init(&r);
    put_hdr(buf, 100, 0);
    memset(buf + 8, 1, 100);
    raw_send(sv[0], buf, 8 + 50, NULL, 0);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_AGAIN);
    close(sv[0]);
    sv[0] = -1;
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_EPARTIAL);
    ck_assert_err_has(err, "50 of 100 payload bytes");
    ck_assert_ptr_null(f.data);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_EBROKEN);
    hw_reader_free(&r);
    close_pair(sv);

    /* Mid-header. */
    sockpair(sv);
    hw_reader_init(&r);
    raw_send(sv[0], buf, 3, NULL, 0);
    shutdown(sv[0], SHUT_WR);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_EPARTIAL);
    ck_assert_err_has(err, "3 of 8 bytes");
    hw_reader_free(&r);
    close_pair(sv);

    /* Clean: after a whole frame, and on a fresh connection. */
    sockpair(sv);
    hw_reader_init(&r);
    raw_send(sv[0], buf, sizeof(buf), NULL, 0);
    shutdown(sv[0], SHUT_WR);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_FRAME);
    ck_assert_uint_eq(f.len, 100);
    hw_frame_free(&f);
    ck_assert_int_eq(hw_read(sv[1], &r, &f, err, ERRLEN), HW_EOF);
    hw_reader_free(&r);
    close_pair(sv);

    sockpair(sv);
    hw_reader_init(&r);
    close(sv[0]);
    sv[0] = -1;
    ck_assert_int_eq(hw_recv_frame(sv[1], &r, &f, -1, err, ERRLEN), HW_EOF);
    hw_reader_free(&r);
    close_pair(sv);
}
END_TEST

/* ---- writer against a full socket ---------------------------------------- */

START_TEST(test_writer_full_socket)
{
    const size_t len1 = 1u << 20, nfd1 = 600, len2 = 10;
    int sv[2], before, *fds1, *fds2, small = 4096;
    ino_t *inos1, *inos2;
    hw_reader r;
    hw_writer w;
    hw_frame f[2];
    char err[ERRLEN] = "";
    unsigned char *p1 = mk_payload(len1), *p2 = mk_payload(len2);
    int blocked = 0, got = 0, done = 0, rounds = 0;

    raise_nofile();
    sockpair(sv);
    ck_assert_int_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
    ck_assert_int_eq(setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
    ck_assert_int_eq(hw_set_nonblock(sv[0]), 0);
    ck_assert_int_eq(hw_set_nonblock(sv[1]), 0);
    hw_reader_init(&r);
    hw_writer_init(&w);
    before = cku_count_fds();
    fds1 = mk_memfds(nfd1, 0);
    inos1 = inos_of(fds1, nfd1);
    fds2 = mk_memfds(1, 9000);
    inos2 = inos_of(fds2, 1);
    ck_assert_int_eq(hw_writer_push(&w, p1, len1, fds1, nfd1, err, ERRLEN), 0);
    ck_assert_int_eq(hw_writer_push(&w, p2, len2, fds2, 1, err, ERRLEN), 0);
    ck_assert_uint_eq(hw_writer_pending_bytes(&w), 16 + len1 + len2);

    ck_assert_int_eq(hw_writer_flush(sv[0], &w, err, ERRLEN), 0);
    ck_assert_uint_eq(hw_writer_pending(&w), 2);
    ck_assert_uint_gt(hw_writer_pending_bytes(&w), len1 / 2);
    while (got < 2) {
        int rc;
        ck_assert_int_lt(++rounds, 1000000);
        if (!done) {
            rc = hw_writer_flush(sv[0], &w, err, ERRLEN);
            ck_assert_msg(rc >= 0, "flush: %s", err);
            if (rc == 0)
                blocked++;
            else
                done = 1;
        }
        rc = hw_read(sv[1], &r, &f[got], err, ERRLEN);
        ck_assert_msg(rc == HW_AGAIN || rc == HW_FRAME, "read: %d %s", rc, err);
        if (rc == HW_FRAME)
            got++;
    }
    ck_assert_int_eq(done, 1);
    ck_assert_int_gt(blocked, 10); /* really went through many partial writes */
    ck_assert_uint_eq(hw_writer_pending(&w), 0);
    ck_assert_uint_eq(hw_writer_pending_bytes(&w), 0);
    ck_assert_int_eq(hw_writer_flush(sv[0], &w, err, ERRLEN), 1);
    check_payload(&f[0], len1);
    check_same_fds(NULL, inos1, 0, &f[0], nfd1);
    check_payload(&f[1], len2);
    check_same_fds(NULL, inos2, 9000, &f[1], 1);
    hw_frame_free(&f[0]);
    hw_frame_free(&f[1]);
    /* The writer closed every fd it owned. */
    ck_assert_int_eq(cku_count_fds(), before);
    hw_writer_free(&w);
    hw_reader_free(&r);
    close_pair(sv);
    free(fds1);
    free(fds2);
    free(inos1);
    free(inos2);
    free(p1);
    free(p2);
}
END_TEST

START_TEST(test_writer_free_closes)
{
    int sv[2], before, *fds;
    hw_writer w;
    char err[ERRLEN] = "";
    unsigned char *p = mk_payload(1u << 20);
    int small = 4096;

    sockpair(sv);
    ck_assert_int_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
    hw_writer_init(&w);
    before = cku_count_fds();
    fds = mk_memfds(600, 0);
    ck_assert_int_eq(hw_writer_push(&w, p, 1u << 20, fds, 600, err, ERRLEN), 0);
    ck_assert_int_eq(hw_writer_push(&w, "x", 1, fds, 0, err, ERRLEN), 0);
    /* Part of the first frame (and some of its fds) goes out. */
    ck_assert_int_eq(hw_writer_flush(sv[0], &w, err, ERRLEN), 0);
    ck_assert_uint_eq(hw_writer_pending(&w), 2);
    hw_writer_free(&w);
    ck_assert_uint_eq(hw_writer_pending(&w), 0);
    close_pair(sv); /* drops the in-flight references too */
    ck_assert_int_eq(cku_count_fds(), before - 2);
    free(fds);
    free(p);
}
END_TEST

START_TEST(test_peer_closed)
{
    int sv[2], fd;
    hw_writer w;
    char err[ERRLEN] = "";

    signal(SIGPIPE, SIG_DFL); /* MSG_NOSIGNAL must keep us alive */
    sockpair(sv);
    close(sv[1]);
    sv[1] = -1;
    hw_writer_init(&w);
    fd = mk_memfd(3);
    ck_assert_int_eq(hw_writer_push(&w, "hi", 2, &fd, 1, err, ERRLEN), 0);
    errno = 0;
    ck_assert_int_eq(hw_writer_flush(sv[0], &w, err, ERRLEN), HW_ESYS);
    ck_assert_int_eq(errno, EPIPE);
    ck_assert_err_has(err, "peer closed");
    ck_assert_uint_eq(hw_writer_pending(&w), 1);
    hw_writer_free(&w);
    ck_assert_int_eq(fcntl(fd, F_GETFD), -1); /* closed by the writer */
    ck_assert_int_eq(hw_send_frame(sv[0], "hi", 2, NULL, 0, err, ERRLEN), HW_ESYS);
    ck_assert_int_eq(errno, EPIPE);
    close_pair(sv);
}
END_TEST

/* ---- blocking receive ---------------------------------------------------- */

START_TEST(test_recv_timeout)
{
    int sv[2];
    hw_reader r;
    hw_frame f;
    char err[ERRLEN] = "";
    unsigned char buf[8 + 20];
    int64_t t0, dt;

    sockpair(sv);
    hw_reader_init(&r);
    t0 = mono_ms();
    ck_assert_int_eq(hw_recv_frame(sv[1], &r, &f, 150, err, ERRLEN), HW_ETIMEDOUT);
    dt = mono_ms() - t0;
    ck_assert_int_ge(dt, 140);
    ck_assert_int_lt(dt, 3000);
    ck_assert_err_has(err, "within 150 ms");
    ck_assert_int_eq(hw_recv_frame(sv[1], &r, &f, 0, err, ERRLEN), HW_ETIMEDOUT);

    /* A partial frame survives a timeout; the rest completes it. */
    put_hdr(buf, 20, 0);
    memset(buf + 8, 'q', 20);
    raw_send(sv[0], buf, 12, NULL, 0);
    ck_assert_int_eq(hw_recv_frame(sv[1], &r, &f, 50, err, ERRLEN), HW_ETIMEDOUT);
    raw_send(sv[0], buf + 12, sizeof(buf) - 12, NULL, 0);
    ck_assert_int_eq(hw_recv_frame(sv[1], &r, &f, -1, err, ERRLEN), HW_FRAME);
    ck_assert_uint_eq(f.len, 20);
    ck_assert_int_eq(memcmp(f.data, buf + 8, 20), 0);
    hw_frame_free(&f);
    hw_reader_free(&r);
    close_pair(sv);
}
END_TEST

/* ---- sockets ------------------------------------------------------------- */

static char tmpdir[64];

static void mk_tmpdir(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/check_wire.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_tmpdir(const char *path)
{
    unlink(path);
    rmdir(tmpdir);
}

START_TEST(test_listen_connect)
{
    char path[128], err[ERRLEN] = "";
    int l, c, s, fd;
    hw_reader r;
    hw_frame f;
    ino_t ino;

    mk_tmpdir();
    snprintf(path, sizeof(path), "%s/heapd.sock", tmpdir);
    l = hw_listen_unix(path, 16, err, ERRLEN);
    ck_assert_msg(l >= 0, "%s", err);
    ck_assert_int_ne(fcntl(l, F_GETFD) & FD_CLOEXEC, 0);
    c = hw_connect_unix(path, err, ERRLEN);
    ck_assert_msg(c >= 0, "%s", err);
    ck_assert_int_ne(fcntl(c, F_GETFD) & FD_CLOEXEC, 0);
    s = accept(l, NULL, NULL);
    ck_assert_int_ge(s, 0);
    fd = mk_memfd(77);
    ino = ino_of(fd);
    ck_assert_int_eq(hw_send_frame(c, "ping", 4, &fd, 1, err, ERRLEN), 0);
    hw_reader_init(&r);
    ck_assert_int_eq(recv5(s, &r, &f, err), HW_FRAME);
    ck_assert_str_eq((char *)f.data, "ping");
    check_same_fds(&fd, &ino, 77, &f, 1);
    hw_frame_free(&f);
    hw_reader_free(&r);
    close(fd);
    close(s);
    close(c);
    close(l);
    rm_tmpdir(path);
}
END_TEST

START_TEST(test_listen_live_refused)
{
    char path[128], err[ERRLEN] = "";
    int l, l2, c;
    struct stat st;

    mk_tmpdir();
    snprintf(path, sizeof(path), "%s/heapd.sock", tmpdir);
    l = hw_listen_unix(path, 4, err, ERRLEN);
    ck_assert_msg(l >= 0, "%s", err);
    l2 = hw_listen_unix(path, 4, err, ERRLEN);
    ck_assert_int_eq(l2, HW_EADDRINUSE);
    ck_assert_err_has(err, "already listening");
    ck_assert_err_has(err, path);
    /* The live daemon's socket was left alone. */
    ck_assert_int_eq(lstat(path, &st), 0);
    c = hw_connect_unix(path, err, ERRLEN);
    ck_assert_msg(c >= 0, "%s", err);
    close(c);
    close(l);
    rm_tmpdir(path);
}
END_TEST

START_TEST(test_listen_stale)
{
    char path[128], err[ERRLEN] = "";
    int l, c, s;
    struct stat st;

    mk_tmpdir();
    snprintf(path, sizeof(path), "%s/heapd.sock", tmpdir);
    l = hw_listen_unix(path, 4, err, ERRLEN);
    ck_assert_msg(l >= 0, "%s", err);
    close(l); /* daemon died: the file stays */
    ck_assert_int_eq(lstat(path, &st), 0);
    ck_assert(S_ISSOCK(st.st_mode));
    c = hw_connect_unix(path, err, ERRLEN);
    ck_assert_int_lt(c, 0);
    ck_assert_err_has(err, path);
    ck_assert_err_has(err, "is heapd running");
    l = hw_listen_unix(path, 4, err, ERRLEN); /* removes the stale file */
    ck_assert_msg(l >= 0, "%s", err);
    c = hw_connect_unix(path, err, ERRLEN);
    ck_assert_msg(c >= 0, "%s", err);
    s = accept(l, NULL, NULL);
    ck_assert_int_ge(s, 0);
    close(s);
    close(c);
    close(l);
    rm_tmpdir(path);
}
END_TEST

START_TEST(test_listen_not_socket)
{
    char path[128], err[ERRLEN] = "";
    struct stat st;
    int fd;

    mk_tmpdir();
    snprintf(path, sizeof(path), "%s/heapd.sock", tmpdir);
    fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(hw_listen_unix(path, 4, err, ERRLEN), HW_EADDRINUSE);
    ck_assert_err_has(err, "not a socket");
    ck_assert_int_eq(lstat(path, &st), 0);
    ck_assert(S_ISREG(st.st_mode));
    rm_tmpdir(path);
}
END_TEST

START_TEST(test_connect_missing)
{
    char path[128], err[ERRLEN] = "";

    mk_tmpdir();
    snprintf(path, sizeof(path), "%s/nobody.sock", tmpdir);
    ck_assert_int_eq(hw_connect_unix(path, err, ERRLEN), HW_ESYS);
    ck_assert_int_eq(errno, ENOENT);
    ck_assert_err_has(err, path);
    ck_assert_err_has(err, "is heapd running");
    rm_tmpdir(path);
}
END_TEST

START_TEST(test_path_too_long)
{
    struct sockaddr_un sa;
    char path[256], err[ERRLEN] = "";
    size_t max = sizeof(sa.sun_path) - 1; /* longest that fits: 107 */

    memset(path, 'a', sizeof(path));
    path[0] = '/';
    path[max] = '\0';
    ck_assert_int_eq(hw_socket_path_ok(path, err, ERRLEN), 0);
    path[max] = 'a';
    path[max + 1] = '\0';
    ck_assert_int_eq(hw_socket_path_ok(path, err, ERRLEN), HW_ENAMETOOLONG);
    ck_assert_err_has(err, "108 bytes long");
    ck_assert_int_eq(hw_listen_unix(path, 4, err, ERRLEN), HW_ENAMETOOLONG);
    ck_assert_int_eq(hw_connect_unix(path, err, ERRLEN), HW_ENAMETOOLONG);
    ck_assert_int_eq(hw_socket_path_ok("", err, ERRLEN), HW_EINVAL);
    ck_assert_int_eq(hw_socket_path_ok(NULL, NULL, 0), HW_EINVAL);
    ck_assert_str_eq(hw_strerror(HW_ENAMETOOLONG), "HW_ENAMETOOLONG");
}
END_TEST

/* The code table: every code named after itself, described, distinct. */
START_TEST(test_code_table)
{
    static const struct {
        int code;
        const char *name;
    } codes[] = {
#define CODE_ROW(name, value, desc) {name, #name},
        HW_CODE_MAP(CODE_ROW)
#undef CODE_ROW
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        ck_assert_str_eq(hw_strerror(codes[i].code), codes[i].name);
        ck_assert_str_ne(hw_errdesc(codes[i].code), "unknown wire code");
        ck_assert_int_eq(codes[i].code < 0, strncmp(codes[i].name, "HW_E", 4) == 0 && codes[i].code != HW_EOF);
        for (size_t j = 0; j < i; j++)
            ck_assert_int_ne(codes[i].code, codes[j].code);
    }
    ck_assert_str_eq(hw_strerror(-99), "HW_E(unknown)");
    ck_assert_str_eq(hw_errdesc(-99), "unknown wire code");
    ck_assert_str_eq(hw_errdesc(HW_ETOOBIG), "payload longer than HW_FRAME_MAX");
}
END_TEST

/* ---- suite ---------------------------------------------------------------- */

static Suite *wire_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc;

    tc = tcase_create("roundtrip");
    tcase_add_test(tc, test_empty_payload);
    tcase_add_test(tc, test_small_payload);
    tcase_add_test(tc, test_max_payload);
    tcase_add_test(tc, test_oversize_header);
    tcase_add_test(tc, test_oversize_no_alloc);
    suite_add_tcase(s, tc);

    tc = tcase_create("fds");
    tcase_add_loop_test(tc, test_fds_counts, 0, (int)(sizeof(fd_counts) / sizeof(fd_counts[0])));
    tcase_add_test(tc, test_sender_refuses);
    tcase_add_test(tc, test_fd_count_mismatch);
    tcase_add_test(tc, test_fds_outside_frame);
    tcase_add_test(tc, test_ctrunc);
    tcase_add_test(tc, test_reader_limits);
    suite_add_tcase(s, tc);

    tc = tcase_create("stream");
    tcase_add_test(tc, test_many_frames_one_write);
    tcase_add_test(tc, test_writer_mixed_fds);
    tcase_add_test(tc, test_byte_at_a_time);
    tcase_add_test(tc, test_eof);
    suite_add_tcase(s, tc);

    tc = tcase_create("writer");
    tcase_add_test(tc, test_writer_full_socket);
    tcase_add_test(tc, test_writer_free_closes);
    tcase_add_test(tc, test_peer_closed);
    suite_add_tcase(s, tc);

    tc = tcase_create("blocking");
    tcase_add_test(tc, test_recv_timeout);
    suite_add_tcase(s, tc);

    tc = tcase_create("sockets");
    tcase_add_test(tc, test_listen_connect);
    tcase_add_test(tc, test_listen_live_refused);
    tcase_add_test(tc, test_listen_stale);
    tcase_add_test(tc, test_listen_not_socket);
    tcase_add_test(tc, test_connect_missing);
    tcase_add_test(tc, test_path_too_long);
    tcase_add_test(tc, test_code_table);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(wire_suite()); }
