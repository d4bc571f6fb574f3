/* bench_util.h - what the CPU benchmark programs share: child processes that
 * die with the bench, fatal errors that clean up first, a monotonic clock,
 * finding sibling binaries, and (with BENCH_ONE_HEAPD) one private heapd on a
 * temporary socket.
 *
 * Header-only on purpose: every bench program is one .c file. Define NAME (the
 * program's name, for messages) before including, and define
 * `static void cleanup(void)`, which die() calls in the parent: it stops
 * every child and removes every file the bench made. Children never clean
 * up: die() in a child only exits. */
#ifndef HEAPD_BENCH_UTIL_H
#define HEAPD_BENCH_UTIL_H

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "heapc.h"

static int g_is_child; /* set in every process fork_child made */

static void cleanup(void);

/* Sends sig to pid, waits up to wait_ms, then SIGKILL. pid <= 0: nothing. */
static void reap(pid_t pid, int sig, int wait_ms)
{
    if (pid <= 0)
        return;
    kill(pid, sig);
    for (int i = 0; i < wait_ms / 10; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void on_signal(int sig)
{
    cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...)
{
    char msg[1024]; /* one write: children and the parent share stderr */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, NAME ": %s\n", msg);
    fflush(stderr);
    if (g_is_child)
        _exit(1);
    cleanup();
    exit(1);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A child that dies with the bench (even if the bench is killed). */
static pid_t fork_child(void)
{
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        g_is_child = 1;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
    }
    return pid;
}

/* out = this program's directory + "/" + rel (e.g. "../heapd"). */
static void self_dir_file(const char *argv0, const char *rel, char *out, size_t len)
{
    char self[PATH_MAX];
    if (strchr(argv0, '/')) {
        snprintf(self, sizeof self, "%s", argv0);
    } else {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
            die("cannot find this program's directory; pass --heapd PATH");
        self[n] = '\0';
    }
    snprintf(out, len, "%s/%s", dirname(self), rel);
}

#ifdef BENCH_ONE_HEAPD
/* One heapd (host backend) on a socket in a private directory. */
static pid_t g_heapd = -1;
/* Short enough for sockaddr_un.sun_path (108 bytes). */
static char g_dir[64], g_conf[108], g_sock[108];
/* More heapd.conf lines (rtt_bench: the ring's spin budget). */
static char g_conf_extra[256];

/* Starts heapd (the directory and config are made on the first call and
 * kept) and waits until it answers. */
static void start_heapd(const char *heapd)
{
    if (access(heapd, X_OK) != 0)
        die("heapd %s: %s; build it (make) or pass --heapd PATH", heapd, strerror(errno));
    if (!g_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        if (!tmp || !*tmp || strlen(tmp) > 40)
            tmp = "/tmp";
        snprintf(g_dir, sizeof g_dir, "%s/" NAME ".XXXXXX", tmp);
        if (!mkdtemp(g_dir)) {
            int e = errno;
            g_dir[0] = '\0';
            die("mkdtemp: %s", strerror(e));
        }
        snprintf(g_conf, sizeof g_conf, "%s/heapd.conf", g_dir);
        snprintf(g_sock, sizeof g_sock, "%s/heapd.sock", g_dir);
        FILE *f = fopen(g_conf, "w");
        if (!f)
            die("cannot write %s: %s", g_conf, strerror(errno));
        fprintf(f, "socket = %s\nbackend = host\nlog_level = warn\n%s", g_sock, g_conf_extra);
        if (fclose(f) != 0)
            die("cannot write %s: %s", g_conf, strerror(errno));
    }
    g_heapd = fork_child();
    if (g_heapd == 0) {
        execl(heapd, heapd, "-c", g_conf, (char *)NULL);
        fprintf(stderr, NAME ": exec %s: %s\n", heapd, strerror(errno));
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
        int st;
        if (waitpid(g_heapd, &st, WNOHANG) == g_heapd) {
            g_heapd = -1;
            die("heapd exited during startup (status %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        }
        heapc *c = heapc_connect(g_sock);
        int ok = c && heapc_err(c) == 0;
        heapc_free_ctx(c);
        if (ok)
            return;
        usleep(10000);
    }
    die("heapd did not answer on %s within 10 s", g_sock);
}

static void stop_heapd(void)
{
    reap(g_heapd, SIGTERM, 3000);
    g_heapd = -1;
}

/* Stops heapd and removes its config, socket and directory. */
static void remove_heapd(void)
{
    stop_heapd();
    if (g_conf[0])
        unlink(g_conf);
    if (g_sock[0])
        unlink(g_sock);
    if (g_dir[0])
        rmdir(g_dir);
    g_conf[0] = g_sock[0] = g_dir[0] = '\0';
}
#endif

#endif
