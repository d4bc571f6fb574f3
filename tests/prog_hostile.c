/* prog_hostile - a socket-level client that attacks heapd's transport the way
 * issue 15 did, for tests/it_hardening.sh and bench/hostile.sh. A sibling of
 * prog_raw (which checks malformed frames one case at a time): these modes
 * hold resources, pass fds whose close() blocks, and pipeline.
 *
 *   prog_hostile --socket PATH MODE [ARGS]
 *
 * Modes (each prints "ok   ..." or "FAIL ..." lines; exit 0 when all ok):
 *   linger SEC [GOFILE]
 *                     passes a loopback TCP socket with SO_LINGER SEC (over
 *                     BOUND_MS) and unsent data inside an unfinished frame (no
 *                     Hello), closes its own copy and the connection; a second
 *                     connection's Hello must then be answered within
 *                     BOUND_MS, while that socket still lingers; then reads
 *                     the socket's data so that its close ends
 *                     (LINGER_SOCKS sockets, more than heapd's closer threads;
 *                     with GOFILE it prints "lingering" and waits for GOFILE
 *                     before that)
 *   fdprobe           an fd sent on a Stats: heapd must close it (pipe probe)
 *   pipeline N        N Stats frames in one write: N replies
 *   conns N           opens up to N connections (Hello on each) and prints
 *                     how many were taken and the refusal's Error
 *   prehello LEN      a LEN-byte frame before Hello: heapd must close
 *   hello_timeout     connects and sends nothing: heapd must close
 *   fds_drip          a header sent one byte at a time, 253 fds with each
 *                     byte: heapd must close before the header is complete,
 *                     and close every fd (a pipe probe reads EOF)
 *   peergroups HEAP   connects, forks; the parent exits at once; the child
 *                     sends Hello and ForceCollect HEAP and prints the reply
 *   hold IDLE FDCONNS UNREAD
 *                     holds IDLE idle connections (no Hello), FDCONNS
 *                     connections with a partial header and 253 fds each, and
 *                     UNREAD connections flooding Stats without reading
 *                     (as far as heapd reads); prints "holding N" and waits
 *                     for SIGTERM
 *   partial N LEN BYTES
 *                     N connections (Hello) each with a LEN-byte frame of
 *                     which BYTES were sent; prints "holding" and waits for
 *                     SIGTERM
 *
 * Bounds (never figures): replies and closes are waited for up to BOUND_MS. */
#include "heapd.pb-c.h"
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BOUND_MS 30000

static const char *sock_path;
static int failures;

__attribute__((format(printf, 1, 2))) static void ok(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("ok   ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

__attribute__((format(printf, 1, 2))) static void bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    failures++;
}

static int conn_open(void)
{
    char err[512];
    int fd = hw_connect_unix(sock_path, err, sizeof err);
    if (fd < 0)
        fprintf(stderr, "prog_hostile: %s\n", err);
    return fd;
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* A whole frame (header and packed f) into buf; its length. */
static size_t pack(Heapd__Frame *f, uint8_t *buf)
{
    size_t len = heapd__frame__get_packed_size(f);
    put32(buf, (uint32_t)len);
    put32(buf + 4, 0);
    heapd__frame__pack(f, buf + 8);
    return 8 + len;
}

static size_t pack_hello(uint8_t *buf, uint64_t id)
{
    Heapd__Hello h = HEAPD__HELLO__INIT;
    h.version = 1;
    h.client = (char *)"prog_hostile";
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_HELLO;
    f.hello = &h;
    return pack(&f, buf);
}

static size_t pack_stats(uint8_t *buf, uint64_t id)
{
    Heapd__Stats m = HEAPD__STATS__INIT;
    m.heap = (char *)"";
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_STATS;
    f.stats = &m;
    return pack(&f, buf);
}

static int send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct pollfd pf = {fd, POLLOUT, 0};
                poll(&pf, 1, 1000);
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One sendmsg of len bytes with nfds fds. */
static ssize_t send_fds(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(253 * sizeof(int))];
    } cb;
    struct iovec iov = {(void *)buf, len};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    memset(&cb, 0, sizeof cb);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (nfds) {
        m.msg_control = cb.b;
        m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(h), fds, nfds * sizeof(int));
    }
    return sendmsg(fd, &m, MSG_NOSIGNAL);
}

/* The next frame, unpacked (NULL: closed or timed out; *closed says which). */
static Heapd__Frame *recv_reply(int fd, hw_reader *rd, int ms, bool *closed)
{
    hw_frame fr;
    char err[256];
    *closed = false;
    int rc = hw_recv_frame(fd, rd, &fr, ms, err, sizeof err);
    if (rc != HW_FRAME) {
        *closed = rc != HW_ETIMEDOUT;
        return NULL;
    }
    Heapd__Frame *f = heapd__frame__unpack(NULL, fr.len, fr.data);
    hw_frame_free(&fr);
    return f;
}

/* 1 once heapd closed fd (EOF or reset) within ms, 0 if not. */
static int wait_closed(int fd, int ms)
{
    struct pollfd pf = {fd, POLLIN, 0};
    char b[4096];
    for (;;) {
        int n = poll(&pf, 1, ms);
        if (n <= 0)
            return 0;
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            return 1;
    }
}

/* A Hello answered on a new connection within BOUND_MS: 0, else -1. */
static int hello_roundtrip(int *out_fd)
{
    int fd = conn_open();
    if (fd < 0)
        return -1;
    uint8_t buf[256];
    size_t n = pack_hello(buf, 1);
    hw_reader rd;
    hw_reader_init(&rd);
    bool closed = false;
    Heapd__Frame *f = send_all(fd, buf, n) ? NULL : recv_reply(fd, &rd, BOUND_MS, &closed);
    int rc = f && f->body_case == HEAPD__FRAME__BODY_HELLO_REPLY ? 0 : -1;
    if (f)
        heapd__frame__free_unpacked(f, NULL);
    hw_reader_free(&rd);
    if (out_fd && !rc)
        *out_fd = fd;
    else
        close(fd);
    return rc;
}

/* ---- linger (item 1) ------------------------------------------------------- */

#define LINGER_SOCKS 6 /* more than heapd's closer threads */

static int mode_linger(int sec, const char *gofile)
{
    /* Loopback TCP connections nobody reads: their send queues stay full. */
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int rcv = 4096;
    setsockopt(ls, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, LINGER_SOCKS) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) {
        bad("linger: loopback listener: %s", strerror(errno));
        return 1;
    }
    static char junk[65536];
    size_t queued = 0;
    for (int k = 0; k < LINGER_SOCKS; k++) {
        int ts = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(ts, (struct sockaddr *)&a, sizeof a)) {
            bad("linger: connect: %s", strerror(errno));
            return 1;
        }
        fcntl(ts, F_SETFL, O_NONBLOCK);
        for (;;) {
            ssize_t n = send(ts, junk, sizeof junk, MSG_NOSIGNAL);
            if (n <= 0)
                break;
            queued += (size_t)n;
        }
        struct linger lg = {1, sec};
        setsockopt(ts, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        /* An unfinished frame (header: 100 bytes, 1 fd; 10 bytes sent) with
         * the socket attached, then our copy and the connection closed:
         * heapd holds the last reference and closes it when the frame
         * breaks. */
        int c = conn_open();
        if (c < 0)
            return 1;
        unsigned char fr[18] = {0};
        put32(fr, 100);
        put32(fr + 4, 1);
        if (send_fds(c, fr, sizeof fr, &ts, 1) < 0) {
            bad("linger: sending the socket: %s", strerror(errno));
            return 1;
        }
        close(ts);
        close(c);
    }

    /* heapd must answer another client while those sockets still linger
     * (sec > BOUND_MS: a loop blocked in close() answers only after it). */
    int rc = hello_roundtrip(NULL);
    if (rc)
        bad("linger: no HelloReply to a second client within %d ms after sockets with a %d s linger were passed "
            "(the loop is blocked in close())",
            BOUND_MS, sec);
    else
        ok("linger: heapd answered another client while %d passed sockets (%d s linger, %zu bytes unsent) were "
           "still closing",
           LINGER_SOCKS, sec, queued);
    if (gofile) {
        /* The script checks other uids meanwhile; it creates gofile when done. */
        printf("lingering\n");
        fflush(stdout);
        for (int i = 0; i < BOUND_MS * 2 / 50 && access(gofile, F_OK); i++)
            usleep(50000);
    }
    /* Let those closes finish: read what the sockets queued, to their end. */
    for (int k = 0; k < LINGER_SOCKS; k++) {
        int as = accept(ls, NULL, NULL);
        while (as >= 0) {
            struct pollfd pf = {as, POLLIN, 0};
            if (poll(&pf, 1, BOUND_MS) <= 0 || read(as, junk, sizeof junk) <= 0)
                break;
        }
        if (as >= 0)
            close(as);
    }
    close(ls);
    return failures ? 1 : 0;
}

/* An fd sent on a request (heapd answers ERR_PROTOCOL and closes it): the
 * pipe probe must read EOF within BOUND_MS. */
static int mode_fdprobe(void)
{
    int fd;
    if (hello_roundtrip(&fd)) {
        bad("fdprobe: Hello not answered");
        return 1;
    }
    int pp[2];
    if (pipe(pp))
        return 1;
    uint8_t buf[64];
    size_t n = pack_stats(buf, 5);
    put32(buf + 4, 1);
    send_fds(fd, buf, n, &pp[1], 1);
    close(pp[1]);
    struct pollfd pf = {pp[0], POLLIN, 0};
    char ch;
    if (poll(&pf, 1, BOUND_MS) > 0 && read(pp[0], &ch, 1) == 0)
        ok("fdprobe: heapd closed the fd this uid sent");
    else
        bad("fdprobe: heapd did not close the fd this uid sent within %d ms (its closer threads are all blocked?)",
            BOUND_MS);
    close(pp[0]);
    close(fd);
    return failures ? 1 : 0;
}

/* ---- pipeline (item 6) ------------------------------------------------------------ */

static int mode_pipeline(int n)
{
    int fd;
    if (hello_roundtrip(&fd)) {
        bad("pipeline: Hello not answered");
        return 1;
    }
    uint8_t *buf = malloc((size_t)n * 64), *p = buf;
    for (int i = 0; i < n; i++)
        p += pack_stats(p, (uint64_t)i + 10);
    send_all(fd, buf, (size_t)(p - buf));
    free(buf);
    hw_reader rd;
    hw_reader_init(&rd);
    int got = 0;
    bool closed = false;
    Heapd__Frame *f;
    while (got < n && (f = recv_reply(fd, &rd, BOUND_MS, &closed))) {
        if (f->body_case == HEAPD__FRAME__BODY_STATS_REPLY && f->id == (uint64_t)got + 10)
            got++;
        heapd__frame__free_unpacked(f, NULL);
    }
    hw_reader_free(&rd);
    close(fd);
    if (got == n)
        ok("pipeline: %d Stats frames in one write got %d replies, in order", n, got);
    else
        bad("pipeline: %d Stats frames in one write got %d replies (the rest stranded)", n, got);
    return failures ? 1 : 0;
}

/* ---- conns (item 5) ---------------------------------------------------------------- */

static int mode_conns(int n)
{
    int taken = 0;
    for (int i = 0; i < n; i++) {
        int fd = conn_open();
        if (fd < 0)
            break;
        uint8_t buf[256];
        size_t len = pack_hello(buf, 1);
        hw_reader rd;
        hw_reader_init(&rd);
        bool closed = false;
        /* A refused connection may be closed before the Hello is sent: its
         * Error is read all the same. */
        (void)send_all(fd, buf, len);
        Heapd__Frame *f = recv_reply(fd, &rd, BOUND_MS, &closed);
        hw_reader_free(&rd);
        if (f && f->body_case == HEAPD__FRAME__BODY_HELLO_REPLY) {
            taken++;
            heapd__frame__free_unpacked(f, NULL);
            continue; /* kept open */
        }
        if (f && f->body_case == HEAPD__FRAME__BODY_ERROR)
            printf("refused after %d: Error %d: %s\n", taken, f->error->code, f->error->message);
        else
            printf("refused after %d: %s\n", taken, closed ? "connection closed without a reply" : "no reply");
        if (f)
            heapd__frame__free_unpacked(f, NULL);
        close(fd);
        break;
    }
    printf("taken %d\n", taken);
    fflush(stdout);
    return 0;
}

/* ---- prehello, hello_timeout (item 5) --------------------------------------------------- */

static int mode_prehello(uint32_t len)
{
    int fd = conn_open();
    if (fd < 0)
        return 1;
    unsigned char *b = calloc(1, 8 + (size_t)len);
    put32(b, len);
    put32(b + 4, 0);
    memset(b + 8, 0xff, len); /* not a valid Frame either */
    send_all(fd, b, 8 + (size_t)len);
    free(b);
    hw_reader rd;
    hw_reader_init(&rd);
    bool closed = false;
    Heapd__Frame *f = recv_reply(fd, &rd, BOUND_MS, &closed);
    hw_reader_free(&rd);
    if (!f && closed)
        ok("prehello: a %u-byte frame before Hello: connection closed", len);
    else
        bad("prehello: a %u-byte frame before Hello was %s", len, f ? "answered (read whole)" : "not closed");
    if (f)
        heapd__frame__free_unpacked(f, NULL);
    close(fd);
    return failures ? 1 : 0;
}

static int mode_hello_timeout(void)
{
    int fd = conn_open();
    if (fd < 0)
        return 1;
    if (wait_closed(fd, BOUND_MS))
        ok("hello_timeout: a connection that sent nothing was closed");
    else
        bad("hello_timeout: a connection that sent nothing is still open after %d ms", BOUND_MS);
    close(fd);
    return failures ? 1 : 0;
}

/* ---- fds_drip (item 5) ------------------------------------------------------------------ */

static int mode_fds_drip(void)
{
    int fd = conn_open();
    if (fd < 0)
        return 1;
    int pp[2];
    if (pipe(pp))
        return 1;
    int fds[253];
    unsigned char hdr[8];
    put32(hdr, 16);
    put32(hdr + 4, 1024);
    int sent = 0, closed_at = 0;
    for (int i = 0; i < 8; i++) {
        for (int k = 0; k < 253; k++)
            fds[k] = dup(pp[1]);
        ssize_t n = send_fds(fd, hdr + i, 1, fds, 253);
        for (int k = 0; k < 253; k++)
            close(fds[k]);
        if (n < 0) {
            /* heapd closed it after reading the earlier bytes: its close may
             * come after the probe's answer (the socket is closed on a later
             * turn of its loop), so a refused byte is a close too. */
            if (errno == EPIPE || errno == ECONNRESET)
                closed_at = i;
            break;
        }
        sent += 253;
        /* heapd has read this byte once it answers the probe below or
         * closes: a Hello on another connection is a barrier of the loop. */
        hello_roundtrip(NULL);
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 0) > 0) {
            closed_at = i + 1;
            break;
        }
    }
    close(pp[1]);
    int probe_eof = 0;
    struct pollfd pf = {pp[0], POLLIN, 0};
    if (poll(&pf, 1, BOUND_MS) > 0) {
        char c;
        probe_eof = read(pp[0], &c, 1) == 0;
    }
    if (closed_at && closed_at < 8)
        ok("fds_drip: heapd closed the connection after %d header bytes (%d fds), before the header was complete",
           closed_at, sent);
    else
        bad("fds_drip: heapd still held the connection after %d header bytes with %d fds", 8, sent);
    if (probe_eof)
        ok("fds_drip: every fd sent was closed (the pipe probe reads EOF)");
    else
        bad("fds_drip: the pipe probe reads no EOF within %d ms: heapd still holds fds", BOUND_MS);
    close(pp[0]);
    close(fd);
    return failures ? 1 : 0;
}

/* ---- peergroups (item 7) ------------------------------------------------------------------ */

static int mode_peergroups(const char *heap)
{
    int fd = conn_open();
    if (fd < 0)
        return 1;
    pid_t p = fork();
    if (p < 0)
        return 1;
    if (p > 0)
        _exit(0); /* the pid heapd saw at connect is gone */
    setsid();
    uint8_t buf[512];
    size_t n = pack_hello(buf, 1);
    Heapd__ForceCollect m = HEAPD__FORCE_COLLECT__INIT;
    m.heap = (char *)heap;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 2;
    f.body_case = HEAPD__FRAME__BODY_FORCE_COLLECT;
    f.force_collect = &m;
    n += pack(&f, buf + n);
    send_all(fd, buf, n);
    hw_reader rd;
    hw_reader_init(&rd);
    bool closed = false;
    Heapd__Frame *r1 = recv_reply(fd, &rd, BOUND_MS * 2, &closed);
    Heapd__Frame *r2 = r1 ? recv_reply(fd, &rd, BOUND_MS * 2, &closed) : NULL;
    if (r2 && r2->body_case == HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY)
        ok("peergroups: a member of admin_group (supplementary) whose connecting process is gone may force a "
           "collect on another uid's heap");
    else if (r2 && r2->body_case == HEAPD__FRAME__BODY_ERROR)
        bad("peergroups: ForceCollect refused: Error %d: %s", r2->error->code, r2->error->message);
    else
        bad("peergroups: no ForceCollect reply");
    printf("peergroups done\n");
    fflush(stdout);
    _exit(failures ? 1 : 0);
}

/* ---- hold (item 5, the loaded bench) -------------------------------------------------------- */

static volatile sig_atomic_t stop;
static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int mode_hold(int idle, int fdconns, int unread)
{
    raise_nofile();
    signal(SIGTERM, on_term);
    int held = 0, nfds_sent = 0;
    /* Unread first: once the fds below put this uid over max_fds_per_uid,
     * heapd reads none of its connections (a Hello would go unanswered). */
    int *uf = calloc((size_t)unread + 1, sizeof *uf);
    int nu = 0;
    for (int i = 0; i < unread; i++) {
        int fd;
        if (hello_roundtrip(&fd))
            continue;
        fcntl(fd, F_SETFL, O_NONBLOCK);
        uf[nu++] = fd;
        held++;
    }
    /* Stats requests until heapd stops reading each (its backpressure) or
     * closes it. */
    uint8_t one[64];
    size_t len = pack_stats(one, 7);
    static uint8_t burst[64 * 1024];
    size_t bl = 0;
    while (bl + len <= sizeof burst) {
        memcpy(burst + bl, one, len);
        bl += len;
    }
    for (int round = 0; round < 64; round++)
        for (int i = 0; i < nu; i++)
            if (uf[i] >= 0 && send(uf[i], burst, bl, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) {
                close(uf[i]);
                uf[i] = -1;
            }
    for (int i = 0; i < idle; i++)
        if (conn_open() >= 0)
            held++;
    int dn = open("/dev/null", O_RDONLY);
    for (int i = 0; i < fdconns; i++) {
        int fd = conn_open();
        if (fd < 0)
            continue;
        int fds[253];
        for (int k = 0; k < 253; k++)
            fds[k] = dn;
        unsigned char hdr[2] = {16, 0};
        if (send_fds(fd, hdr, 1, fds, 253) > 0)
            nfds_sent += 253;
        held++;
    }
    int still = 0;
    for (int i = 0; i < nu; i++)
        still += uf[i] >= 0;
    printf("holding %d connections: %d idle, %d with %d fds in partial headers, %d of %d not reading their "
           "replies still open\n",
           held, idle, fdconns, nfds_sent, still, unread);
    fflush(stdout);
    while (!stop)
        pause();
    return 0;
}

static int mode_partial(int n, uint32_t len, uint32_t bytes)
{
    raise_nofile();
    signal(SIGTERM, on_term);
    static uint8_t junk[1 << 16];
    memset(junk, 0x5a, sizeof junk);
    int held = 0;
    for (int i = 0; i < n; i++) {
        int fd;
        if (hello_roundtrip(&fd))
            continue;
        unsigned char hdr[8];
        put32(hdr, len);
        put32(hdr + 4, 0);
        send_all(fd, hdr, 8);
        for (uint32_t off = 0; off < bytes;) {
            uint32_t k = bytes - off < sizeof junk ? bytes - off : (uint32_t)sizeof junk;
            if (send_all(fd, junk, k))
                break;
            off += k;
        }
        held++;
    }
    printf("holding %d connections with %u of %u bytes of a frame each\n", held, bytes, len);
    fflush(stdout);
    while (!stop)
        pause();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4 || strcmp(argv[1], "--socket")) {
        fprintf(stderr, "usage: prog_hostile --socket PATH MODE [ARGS] (see the comment at the top)\n");
        return 2;
    }
    sock_path = argv[2];
    const char *m = argv[3];
    int a1 = argc > 4 ? atoi(argv[4]) : 0, a2 = argc > 5 ? atoi(argv[5]) : 0, a3 = argc > 6 ? atoi(argv[6]) : 0;
    signal(SIGPIPE, SIG_IGN);
    alarm(900); /* never outlives a test that forgot it */
    if (!strcmp(m, "linger"))
        return mode_linger(a1 ? a1 : 60, argc > 5 ? argv[5] : NULL);
    if (!strcmp(m, "fdprobe"))
        return mode_fdprobe();
    if (!strcmp(m, "pipeline"))
        return mode_pipeline(a1 ? a1 : 200);
    if (!strcmp(m, "conns"))
        return mode_conns(a1);
    if (!strcmp(m, "prehello"))
        return mode_prehello((uint32_t)a1);
    if (!strcmp(m, "hello_timeout"))
        return mode_hello_timeout();
    if (!strcmp(m, "fds_drip"))
        return mode_fds_drip();
    if (!strcmp(m, "peergroups") && argc > 4)
        return mode_peergroups(argv[4]);
    if (!strcmp(m, "hold"))
        return mode_hold(a1, a2, a3);
    if (!strcmp(m, "partial"))
        return mode_partial(a1, (uint32_t)a2, (uint32_t)a3);
    fprintf(stderr, "prog_hostile: unknown mode %s\n", m);
    return 2;
}
