/* rtt_bench_pp.h - part of rtt_bench.c (included once, where it stands,
 * after the shared state and process bookkeeping it uses): the raw
 * Unix-socket ping-pong every heapd column is measured against, and the
 * message sizes it echoes. A file of its own only to keep rtt_bench.c
 * readable. */
#ifndef RTT_BENCH_PP_H
#define RTT_BENCH_PP_H

/* ---- raw ping-pong ------------------------------------------------------- */

/* Reads (wr 0) or writes (wr 1) all n bytes: 0, or -1 (error or EOF). */
static int io_full(int fd, void *buf, size_t n, int wr)
{
    char *p = buf;
    while (n) {
        ssize_t r = wr ? write(fd, p, n) : read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}
#define read_full(fd, buf, n)  io_full(fd, buf, n, 0)
#define write_full(fd, buf, n) io_full(fd, buf, n, 1)

static struct sockaddr_un echo_addr(void)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", g_echo_sock);
    return a;
}

/* One process, one thread: accepts `clients` connections, then answers
 * every request (blocking read of req bytes, blocking write of rep bytes). */
static void echo_server(int lfd, int clients, size_t req, size_t rep)
{
    struct pollfd pf[MAX_CLIENTS];
    for (int i = 0; i < clients; i++) {
        pf[i].fd = accept(lfd, NULL, NULL);
        if (pf[i].fd < 0)
            die("echo server: accept: %s", strerror(errno));
        pf[i].events = POLLIN;
    }
    close(lfd);
    char in[256], out[256];
    memset(out, 0x5a, sizeof out);
    int open_fds = clients;
    while (open_fds > 0) {
        if (poll(pf, (nfds_t)clients, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("echo server: poll: %s", strerror(errno));
        }
        for (int i = 0; i < clients; i++) {
            if (pf[i].fd < 0 || !pf[i].revents)
                continue;
            if (read_full(pf[i].fd, in, req) != 0 || write_full(pf[i].fd, out, rep) != 0) {
                close(pf[i].fd);
                pf[i].fd = -1;
                open_fds--;
            }
        }
    }
    _exit(0);
}

static void pingpong_client(shared *s, int idx, uint64_t warm, uint64_t iters, size_t req, size_t rep)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = echo_addr();
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        die("ping-pong client %d: connect %s: %s", idx, g_echo_sock, strerror(errno));
    char out[256], in[256];
    memset(out, 0xa5, sizeof out);
    for (uint64_t i = 0; i < warm; i++)
        if (write_full(fd, out, req) || read_full(fd, in, rep))
            die("ping-pong client %d: the echo server went away", idx);
    pthread_barrier_wait(&s->start);
    double *lat = s->lat + (size_t)idx * s->stride + s->base;
    s->t_begin[idx] = now_us();
    for (uint64_t i = 0; i < iters; i++) {
        double t0 = now_us();
        if (write_full(fd, out, req) || read_full(fd, in, rep))
            die("ping-pong client %d: the echo server went away", idx);
        lat[i] = now_us() - t0;
    }
    s->t_end[idx] = now_us();
    close(fd);
    _exit(0);
}

static void run_pingpong(shared *s, int round, uint64_t warm, uint64_t iters, size_t req, size_t rep)
{
    int clients = s->clients;
    snprintf(g_echo_sock, sizeof g_echo_sock, "%s/echo.sock", g_dir);
    unlink(g_echo_sock);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = echo_addr();
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 64) != 0)
        die("echo socket %s: %s", g_echo_sock, strerror(errno));
    g_echo_status = 0;
    g_echo = fork_child();
    if (g_echo == 0)
        echo_server(lfd, clients, req, rep);
    close(lfd);
    round_begin(s, (uint64_t)round * iters);
    for (int i = 0; i < clients; i++) {
        pid_t p = fork_child();
        if (p == 0)
            pingpong_client(s, i, warm, iters, req, rep);
        g_kids[g_nkids++] = p;
    }
    wait_clients("ping-pong");
    int st = g_echo_status;
    if (g_echo > 0 && waitpid(g_echo, &st, 0) != g_echo)
        die("waitpid(echo server): %s", strerror(errno));
    g_echo = -1;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("the echo server failed");
    unlink(g_echo_sock);
    round_end(s);
}

/* The wire sizes of one representative Alloc / AllocReply exchange: the
 * 20000th allocation of a 4 KiB block in a 1 GiB heap. */
static void frame_sizes(size_t *req, size_t *rep)
{
    const uint64_t n = 20000;
    Heapd__Alloc al = HEAPD__ALLOC__INIT;
    al.seq = n;
    al.size = ALLOC_SIZE;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = n + 3; /* Hello and Attach came first */
    f.body_case = HEAPD__FRAME__BODY_ALLOC;
    f.alloc = &al;
    *req = heapd__frame__get_packed_size(&f) + HDR;
    Heapd__AllocReply ar = HEAPD__ALLOC_REPLY__INIT;
    ar.seq = n;
    ar.offset = n * ALLOC_SIZE;
    ar.block_size = ALLOC_SIZE;
    ar.mapped = 1 * GiB;
    Heapd__Frame g = HEAPD__FRAME__INIT;
    g.id = n + 3;
    g.body_case = HEAPD__FRAME__BODY_ALLOC_REPLY;
    g.alloc_reply = &ar;
    *rep = heapd__frame__get_packed_size(&g) + HDR;
}

#endif
