/* prog_trickle - a client that trickles cheap requests through its request
 * ring (issue 33 item 10), for tests/it_fair.sh.
 *
 *   prog_trickle --socket PATH --heap NAME --pid HEAPD_PID [--period-us P] [--requests N]
 *
 * Connects (HEAPC_TRANSPORT as the environment says: the test sets ring),
 * attaches a 1-rank heap NAME and makes N allocations of 4 KiB (default
 * 5000), one every P microseconds (default 400), collecting every 256. Over
 * all but the first 100 it reads heapd's CPU time (utime + stime of
 * /proc/HEAPD_PID/stat) and prints
 *   cpu_share S requests N seconds T
 * where S is heapd's CPU time over the wall time T. Exits 0, or 1 when a
 * request failed, 2 on bad usage. */
#include "heapc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* heapd's utime + stime in seconds, or -1. */
static double cpu_s(long pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    /* after ") ": state, then fields 4..13, then utime (14) and stime (15) */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void sleep_until(double t)
{
    double d = t - now_s();
    if (d > 0 && d < 200e-6) { /* shorter than a timer's slack: spin */
        while (now_s() < t)
            ;
        return;
    }
    if (d > 0) {
        struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

int main(int argc, char **argv)
{
    const char *sock = NULL, *heap = NULL;
    long pid = 0, period_us = 400, nreq = 5000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--socket"))
            sock = argv[i + 1];
        else if (!strcmp(argv[i], "--heap"))
            heap = argv[i + 1];
        else if (!strcmp(argv[i], "--pid"))
            pid = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--period-us"))
            period_us = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--requests"))
            nreq = atol(argv[i + 1]);
        else
            sock = NULL, i = argc;
    }
    if (!sock || !heap || pid <= 0 || period_us <= 0 || nreq <= 100) {
        fprintf(stderr, "usage: prog_trickle --socket PATH --heap NAME --pid HEAPD_PID [--period-us P] "
                        "[--requests N]\n");
        return 2;
    }
    heapc_params p = {0};
    p.chunk_size = 1 << 20;
    p.initial_size = 16 << 20;
    p.va_size = 64 << 20;
    heapc *c = heapc_connect(sock);
    if (heapc_err(c) || heapc_attach(c, heap, 0, 1, &p)) {
        fprintf(stderr, "prog_trickle: %s\n", heapc_errstr(c));
        return 1;
    }
    double t0 = 0, c0 = 0, next = now_s();
    for (long i = 0; i < nreq; i++) {
        if (i == 100) {
            t0 = now_s();
            c0 = cpu_s(pid);
        }
        sleep_until(next);
        next += (double)period_us / 1e6;
        void *ptr;
        uint64_t off;
        if (heapc_alloc(c, 4096, &ptr, &off) || ((i + 1) % 256 == 0 && heapc_collect(c))) {
            fprintf(stderr, "prog_trickle: request %ld: %s\n", i, heapc_errstr(c));
            return 1;
        }
        heapc_free(c, off);
    }
    double t = now_s() - t0, cpu = cpu_s(pid) - c0;
    printf("cpu_share %.3f requests %ld seconds %.2f\n", c0 < 0 ? -1.0 : cpu / t, nreq - 100, t);
    heapc_detach(c);
    heapc_free_ctx(c);
    return 0;
}
