/* prog_fakeserver - a hostile heapd for libheapc (issue 33 items 7 and 11):
 * it speaks the real protocol (common/wire framing, proto/heapd.proto) on a
 * socket of its own and forks a client that uses libheapc against it. For
 * tests/it_fakeserver.sh.
 *
 *   prog_fakeserver CASE
 *
 * Cases (the client's expected result in brackets):
 *   status0     the AttachReply's status page is a 0-byte memfd [ERR_BADFD]
 *   unsealed    chunk 0 is a memfd without seals, truncated to 0 bytes once
 *               the client has attached; the client then touches it
 *               [ERR_BADFD: the attach refuses it, nothing faults]
 *   status_unsealed
 *               the status page is a memfd without seals, truncated to 0
 *               bytes once the client has attached; the client then reads
 *               it (heapc_status) [ERR_BADFD: the attach refuses it]
 *   regular     chunk 0 is a regular file [ERR_BADFD]
 *   nofds       the AttachReply is a frame header announcing fds, then
 *               nothing more [ERR_NOREPLY, within HEAPC_FRAME_TIMEOUT_MS]
 *   nofds_body  that header and its payload, without the fds [ERR_CONN]
 *   ring        a good attach, then a request ring whose memfd has no seals
 *               and is truncated to 0 bytes once the client has attached;
 *               the client then allocates [the ring is refused: the Alloc
 *               comes on the socket and gets this server's ERR_INVALID]
 *   growbad     a good attach, then an AllocReply whose growth chunk is a
 *               memfd without seals [ERR_BADFD]
 *   busy        a good attach whose status page stays mid-update
 *               [heapc_status: ERR_BUSY]
 *   env         the client calls heapc_attach_env with the environment it
 *               was given; prints "heap=NAME" and "job=JOB" of the Attach
 *               [ERR_INVALID, this server's answer]
 *
 * Prints "ok   ..." or "FAIL ..." (a client killed by a signal, a hang past
 * BOUND_MS, another result); exit 0 when ok. */
#include "heapc.h"
#include "heapd.pb-c.h"
#include "ring_layout.h"
#include "status.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BOUND_MS 60000
#define CHUNK    4096u

static const char *kase;
static int c2p[2], p2c[2]; /* the client says "attached" ('m'); the server answers 'g' */

static int is(const char *name) { return strcmp(kase, name) == 0; }

/* ---- the server ---------------------------------------------------------- */

static int sealed_memfd(size_t size, int seals)
{
    int fd = memfd_create("fake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || (seals && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
        perror("fake memfd");
        exit(2);
    }
    return fd;
}

static int status_page(int odd, int seal)
{
    int fd = sealed_memfd(HS_PAGE_SIZE, 0);
    hs_page *p = mmap(NULL, HS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    p->magic = HS_MAGIC;
    p->version = HS_VERSION;
    p->seq = odd ? 1 : 2;
    munmap(p, HS_PAGE_SIZE);
    if (seal)
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    return fd;
}

static void send_frame(int fd, Heapd__Frame *f, const int *fds, size_t nfds)
{
    size_t len = heapd__frame__get_packed_size(f);
    unsigned char *buf = malloc(len + 1);
    heapd__frame__pack(f, buf);
    char err[256];
    if (hw_send_frame(fd, buf, len, fds, nfds, err, sizeof err) < 0)
        fprintf(stderr, "fakeserver: send: %s\n", err);
    free(buf);
}

static void send_error(int fd, uint64_t id, const char *msg)
{
    Heapd__Error e = HEAPD__ERROR__INIT;
    e.code = HEAPD__ERR_CODE__ERR_INVALID;
    e.message = (char *)msg;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ERROR;
    f.error = &e;
    send_frame(fd, &f, NULL, 0);
}

/* The memfd to truncate once the client says it attached (-1: none). */
static int pending = -1;

static void truncate_it(int fd)
{
    if (ftruncate(fd, 0) != 0)
        perror("ftruncate");
    else
        printf("     the server truncated the %s memfd after the client attached\n", is("ring")       ? "ring"
                                                                                     : is("unsealed") ? "chunk"
                                                                                                      : "status page");
    fflush(stdout);
}

static void send_attach(int fd, uint64_t id)
{
    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    hp.chunk_size = CHUNK;
    hp.initial_size = CHUNK;
    hp.va_size = 4 * CHUNK;
    hp.min_block = 64;
    hp.collect_timeout_ms = 1000;
    uint32_t local = 0;
    Heapd__ChunkRef ref = HEAPD__CHUNK_REF__INIT, *refs = &ref;
    Heapd__AttachReply ar = HEAPD__ATTACH_REPLY__INIT;
    ar.params = &hp;
    ar.world_size = 1;
    ar.n_local_ranks = 1;
    ar.local_ranks = &local;
    ar.mapped = CHUNK;
    ar.n_chunks = 1;
    ar.chunks = &refs;
    ar.status_fd_index = 1;
    ar.backend = (char *)"host";
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ATTACH_REPLY;
    f.attach_reply = &ar;
    int fds[2];
    if (is("unsealed")) {
        fds[0] = sealed_memfd(CHUNK, 0);
    } else if (is("regular")) {
        char path[] = "/tmp/prog_fakeserver.XXXXXX";
        fds[0] = mkstemp(path);
        unlink(path);
        if (fds[0] < 0 || ftruncate(fds[0], CHUNK) != 0) {
            perror("regular file");
            exit(2);
        }
    } else {
        fds[0] = sealed_memfd(CHUNK, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    }
    fds[1] = is("status0") ? sealed_memfd(0, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
                           : status_page(is("busy"), !is("status_unsealed"));
    if (is("nofds") || is("nofds_body")) {
        /* A header announcing 2 fds; with nofds_body its payload too, but
         * no fd ever comes. */
        size_t len = heapd__frame__get_packed_size(&f);
        unsigned char *buf = malloc(HW_HDR_SIZE + len);
        for (int i = 0; i < 4; i++) {
            buf[i] = (unsigned char)(len >> (8 * i));
            buf[4 + i] = (unsigned char)(2u >> (8 * i));
        }
        heapd__frame__pack(&f, buf + HW_HDR_SIZE);
        size_t out = is("nofds") ? HW_HDR_SIZE : HW_HDR_SIZE + len;
        if (write(fd, buf, out) != (ssize_t)out)
            perror("write");
        free(buf);
    } else {
        send_frame(fd, &f, fds, 2);
    }
    if (is("unsealed"))
        pending = dup(fds[0]);
    if (is("status_unsealed"))
        pending = dup(fds[1]);
    close(fds[0]);
    close(fds[1]);
}

static int ring_memfd = -1;

static void send_ring(int fd, uint64_t id)
{
    if (!is("ring")) {
        send_error(fd, id, "fakeserver: no ring");
        return;
    }
    hr_geom g = {HR_NSLOTS_DEFAULT, HR_SLOT_SIZE_DEFAULT};
    size_t size = hr_size(g);
    ring_memfd = sealed_memfd(size, 0); /* no seals */
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, ring_memfd, 0);
    if (mem == MAP_FAILED) {
        perror("mmap ring");
        exit(2);
    }
    hr_init(mem, g);
    munmap(mem, size);
    int fds[2] = {ring_memfd, eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    Heapd__RingSetupReply r = HEAPD__RING_SETUP_REPLY__INIT;
    r.version = HR_VERSION;
    r.nslots = g.nslots;
    r.slot_size = g.slot_size;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_RING_SETUP_REPLY;
    f.ring_setup_reply = &r;
    send_frame(fd, &f, fds, 2);
    close(fds[1]);
}

/* One request; 0 to go on, 1 when done. */
static int serve_one(int fd, const Heapd__Frame *m)
{
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = m->id;
    switch (m->body_case) {
    case HEAPD__FRAME__BODY_HELLO: {
        Heapd__HelloReply h = HEAPD__HELLO_REPLY__INIT;
        h.version = HEAPC_PROTOCOL_VERSION;
        h.server = (char *)"fakeserver";
        h.backend = (char *)"host";
        f.body_case = HEAPD__FRAME__BODY_HELLO_REPLY;
        f.hello_reply = &h;
        send_frame(fd, &f, NULL, 0);
        return 0;
    }
    case HEAPD__FRAME__BODY_ATTACH:
        if (is("env")) {
            printf("heap=%s\njob=%s\n", m->attach->heap, m->attach->job);
            fflush(stdout);
            send_error(fd, m->id, "fakeserver: noted");
            return 0;
        }
        send_attach(fd, m->id);
        if (is("ring")) /* the ring comes next; truncate it once attached */
            return 0;
        return is("nofds") || is("nofds_body");
    case HEAPD__FRAME__BODY_RING_SETUP:
        send_ring(fd, m->id);
        if (is("ring"))
            pending = ring_memfd;
        return 0;
    case HEAPD__FRAME__BODY_ALLOC:
        if (is("growbad")) { /* a growth whose new chunk has no seals */
            Heapd__ChunkRef ref = HEAPD__CHUNK_REF__INIT, *refs = &ref;
            ref.index = 1;
            Heapd__AllocReply ar = HEAPD__ALLOC_REPLY__INIT;
            ar.seq = m->alloc->seq;
            ar.offset = CHUNK;
            ar.block_size = CHUNK;
            ar.mapped = 2 * CHUNK;
            ar.n_new_chunks = 1;
            ar.new_chunks = &refs;
            f.body_case = HEAPD__FRAME__BODY_ALLOC_REPLY;
            f.alloc_reply = &ar;
            int cfd = sealed_memfd(CHUNK, 0);
            send_frame(fd, &f, &cfd, 1);
            close(cfd);
            return 0;
        }
        /* fall through */
    default:
        printf("     the server got a request (body %d) on the socket\n", (int)m->body_case);
        fflush(stdout);
        send_error(fd, m->id, "fakeserver: refused");
        return 0;
    }
}

/* The client said "attached" ('m'): truncate what is pending, answer 'g'.
 * 0, or -1 once the client closed its end. */
static int on_client(void)
{
    char b;
    if (read(c2p[0], &b, 1) != 1)
        return -1;
    if (pending >= 0)
        truncate_it(pending);
    if (write(p2c[1], "g", 1) != 1)
        perror("write");
    return 0;
}

/* Frames the socket has: 0 to go on, 1 when done (the case's last answer
 * sent, or the client gone). */
static int on_frames(int fd, hw_reader *rd)
{
    for (;;) {
        hw_frame raw;
        char err[256];
        int rc = hw_read(fd, rd, &raw, err, sizeof err);
        if (rc == HW_AGAIN)
            return 0;
        if (rc != HW_FRAME)
            return 1;
        Heapd__Frame *m = heapd__frame__unpack(NULL, raw.len, raw.data);
        int done = !m || serve_one(fd, m);
        if (m)
            heapd__frame__free_unpacked(m, NULL);
        hw_frame_free(&raw);
        if (done)
            return 1;
    }
}

static void serve(int lfd)
{
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    if (poll(&p, 1, BOUND_MS) != 1)
        return;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    hw_reader rd;
    hw_reader_init(&rd);
    int reading = 1;
    for (;;) {
        struct pollfd q[2] = {{.fd = fd, .events = POLLIN}, {.fd = c2p[0], .events = POLLIN}};
        if (poll(q, 2, BOUND_MS) <= 0)
            break;
        if (q[1].revents && on_client() < 0)
            c2p[0] = -1; /* poll ignores it from now on */
        if (q[0].revents && reading && on_frames(fd, &rd))
            reading = 0;
        if (q[0].revents && !reading) { /* hold the connection, silent, until the client closes it */
            char b[64];
            if (read(fd, b, sizeof b) <= 0)
                break;
        }
    }
    hw_reader_free(&rd);
    close(fd);
}

/* ---- the client ---------------------------------------------------------- */

/* Tells the server the attach succeeded and waits for its answer. */
static void attached(void)
{
    char b;
    if (write(c2p[1], "m", 1) != 1 || read(p2c[0], &b, 1) != 1)
        perror("sync");
}

/* The result as "ERRNAME message" on out. */
static int client(const char *path, int out)
{
    heapc *c = heapc_connect(path);
    int rc = heapc_err(c);
    if (rc == HEAPC_OK && is("env")) {
        rc = heapc_attach_env(c, NULL, NULL);
    } else if (rc == HEAPC_OK) {
        rc = heapc_attach(c, "fake", 0, 1, NULL);
        if (rc == HEAPC_OK && (is("unsealed") || is("ring") || is("status_unsealed")))
            attached();
        if (rc == HEAPC_OK && is("unsealed")) {
            volatile char *p = heapc_ptr(c, 0);
            p[0] = 1; /* SIGBUS if the chunk was cut short */
        }
        if (rc == HEAPC_OK && (is("ring") || is("growbad"))) {
            void *ptr;
            uint64_t off;
            rc = heapc_alloc(c, 64, &ptr, &off);
        }
        if (rc == HEAPC_OK && (is("busy") || is("status_unsealed"))) {
            heapc_status_t st;
            rc = heapc_status(c, &st);
        }
    }
    dprintf(out, "%s %s\n", heapc_errname(rc), rc == HEAPC_EBUSY ? "(heapc_status)" : heapc_errstr(c));
    heapc_free_ctx(c);
    return 0;
}

static const char *expected(void)
{
    if (is("nofds"))
        return "ERR_NOREPLY";
    if (is("nofds_body"))
        return "ERR_CONN";
    if (is("ring") || is("env"))
        return "ERR_INVALID";
    if (is("busy"))
        return "ERR_BUSY";
    return "ERR_BADFD";
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(
            stderr,
            "usage: prog_fakeserver status0|status_unsealed|unsealed|regular|nofds|nofds_body|ring|growbad|busy|env\n");
        return 2;
    }
    kase = argv[1];
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/prog_fakeserver.XXXXXX", path[64], err[256];
    if (!mkdtemp(dir))
        return 2;
    snprintf(path, sizeof path, "%s/s", dir);
    int lfd = hw_listen_unix(path, 4, err, sizeof err);
    int res[2];
    if (lfd < 0 || pipe(c2p) || pipe(p2c) || pipe(res)) {
        fprintf(stderr, "prog_fakeserver: %s\n", lfd < 0 ? err : strerror(errno));
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid == 0) {
        close(lfd);
        signal(SIGPIPE, SIG_DFL); /* as a program linking libheapc has it */
        alarm(BOUND_MS / 1000);   /* a hang ends as SIGALRM: FAIL below */
        _exit(client(path, res[1]));
    }
    close(res[1]);
    close(c2p[1]);
    close(p2c[0]);
    serve(lfd);
    char line[1024] = "";
    ssize_t n = read(res[0], line, sizeof line - 1);
    line[n > 0 ? n : 0] = 0;
    line[strcspn(line, "\n")] = 0;
    int st = 0;
    waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    unlink(path);
    rmdir(dir);
    const char *want = expected();
    if (WIFSIGNALED(st)) {
        printf("FAIL %s: the client died of signal %d (%s)\n", kase, WTERMSIG(st), strsignal(WTERMSIG(st)));
        return 1;
    }
    if (strncmp(line, want, strlen(want)) != 0 || line[strlen(want)] != ' ') {
        printf("FAIL %s: the client got \"%s\", want %s\n", kase, line, want);
        return 1;
    }
    printf("ok   %s: %s (%ld ms)\n", kase, line, ms);
    return 0;
}
