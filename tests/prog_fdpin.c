/* prog_fdpin - issue 33's fd pin (items 2 and 3), for tests/it_fdpin.sh and
 * bench/loaded_bench: a tenant that makes heapd send chunk fds it never
 * reads.
 *
 *   prog_fdpin --socket PATH HEAP WORLD CHUNKS PAIRS
 *
 * Opens WORLD connections, attaches rank r of heap HEAP (world WORLD,
 * 4 KiB chunks, CHUNKS chunks per rank at first) on connection r and reads
 * the WORLD AttachReplies (closing their fds); then writes, on every
 * connection, PAIRS pipelined Detach + Attach (each AttachReply carries the
 * heap's WORLD * CHUNKS chunk fds and its status page) and never reads again,
 * as far as heapd reads its requests. Prints "pinning N" (N: pairs written
 * in all) and holds its connections until SIGTERM. Exit 1 when the setup
 * fails. */
#include "heapd.pb-c.h"
#include "wire.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXW    64
#define WAIT_MS 30000

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A whole frame (header, packed f) into buf; its length. */
static size_t pack(Heapd__Frame *f, uint8_t *buf)
{
    size_t len = heapd__frame__get_packed_size(f);
    put32(buf, (uint32_t)len);
    put32(buf + 4, 0);
    heapd__frame__pack(f, buf + 8);
    return 8 + len;
}

static size_t pack_hello(uint8_t *buf)
{
    Heapd__Hello h = HEAPD__HELLO__INIT;
    h.version = 1;
    h.client = (char *)"prog_fdpin";
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 1;
    f.body_case = HEAPD__FRAME__BODY_HELLO;
    f.hello = &h;
    return pack(&f, buf);
}

static const char *g_heap;
static uint32_t g_world, g_chunks;

static size_t pack_attach(uint8_t *buf, uint64_t id, uint32_t rank)
{
    Heapd__HeapParams p = HEAPD__HEAP_PARAMS__INIT;
    p.chunk_size = 4096;
    p.initial_size = (uint64_t)g_chunks * 4096;
    Heapd__Attach a = HEAPD__ATTACH__INIT;
    a.heap = (char *)g_heap;
    a.rank = rank;
    a.world_size = g_world;
    a.params = &p;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ATTACH;
    f.attach = &a;
    return pack(&f, buf);
}

static size_t pack_detach(uint8_t *buf, uint64_t id)
{
    Heapd__Detach d = HEAPD__DETACH__INIT;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_DETACH;
    f.detach = &d;
    return pack(&f, buf);
}

/* The next reply on fd (its fds closed): its body, or -1. */
static int reply(int fd, hw_reader *rd)
{
    hw_frame fr;
    char err[256];
    if (hw_recv_frame(fd, rd, &fr, WAIT_MS, err, sizeof err) != HW_FRAME) {
        fprintf(stderr, "prog_fdpin: no reply: %s\n", err);
        return -1;
    }
    Heapd__Frame *f = heapd__frame__unpack(NULL, fr.len, fr.data);
    int body = f ? (int)f->body_case : -1;
    if (f && f->body_case == HEAPD__FRAME__BODY_ERROR)
        fprintf(stderr, "prog_fdpin: error: %s\n", f->error->message);
    if (f)
        heapd__frame__free_unpacked(f, NULL);
    hw_frame_free(&fr);
    return body;
}

/* Writes as much of buf as heapd takes until it stops reading for 300 ms;
 * returns the bytes written. */
static size_t push(int fd, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN)
            break;
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 300) <= 0 || !(p.revents & POLLOUT))
            break;
    }
    return off;
}

static volatile sig_atomic_t stop;
static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

/* Connection r: Hello answered, Attach of rank r sent. */
static int setup(int *fd, hw_reader *rd, uint32_t r, const char *path)
{
    char err[256];
    uint8_t buf[512];
    fd[r] = hw_connect_unix(path, err, sizeof err);
    if (fd[r] < 0) {
        fprintf(stderr, "prog_fdpin: %s\n", err);
        return -1;
    }
    hw_reader_init(&rd[r]);
    size_t n = pack_hello(buf);
    if (hw_send_frame(fd[r], buf + 8, n - 8, NULL, 0, err, sizeof err) ||
        reply(fd[r], &rd[r]) != HEAPD__FRAME__BODY_HELLO_REPLY)
        return -1;
    n = pack_attach(buf, 2, r);
    return hw_send_frame(fd[r], buf + 8, n - 8, NULL, 0, err, sizeof err) ? -1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 7 || strcmp(argv[1], "--socket")) {
        fprintf(stderr, "usage: prog_fdpin --socket PATH HEAP WORLD CHUNKS PAIRS\n");
        return 2;
    }
    g_heap = argv[3];
    g_world = (uint32_t)atoi(argv[4]);
    g_chunks = (uint32_t)atoi(argv[5]);
    size_t pairs = (size_t)atol(argv[6]);
    if (g_world < 1 || g_world > MAXW || g_chunks < 1 || pairs < 1) {
        fprintf(stderr, "prog_fdpin: WORLD 1..%d, CHUNKS and PAIRS >= 1\n", MAXW);
        return 2;
    }
    signal(SIGTERM, on_term);
    int fd[MAXW];
    hw_reader rd[MAXW];
    for (uint32_t r = 0; r < g_world; r++)
        if (setup(fd, rd, r, argv[2]))
            return 1;
    for (uint32_t r = 0; r < g_world; r++)
        if (reply(fd[r], &rd[r]) != HEAPD__FRAME__BODY_ATTACH_REPLY)
            return 1;
    /* PAIRS Detach + Attach per connection, in one buffer. */
    size_t written = 0;
    uint8_t one[512];
    size_t pair = pack_detach(one, 3);
    pair += pack_attach(one + pair, 4, 0);
    uint8_t *buf = malloc((pair + 32) * pairs); /* ids grow: room for their varints */
    if (!buf)
        return 1;
    for (uint32_t r = 0; r < g_world; r++) {
        size_t off = 0;
        for (size_t i = 0; i < pairs; i++) {
            off += pack_detach(buf + off, 3 + 2 * i);
            off += pack_attach(buf + off, 4 + 2 * i, r);
        }
        written += push(fd[r], buf, off) / pair;
    }
    free(buf);
    printf("pinning %zu\n", written);
    fflush(stdout);
    while (!stop)
        pause();
    for (uint32_t r = 0; r < g_world; r++) {
        close(fd[r]);
        hw_reader_free(&rd[r]);
    }
    return 0;
}
