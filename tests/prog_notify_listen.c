/* prog_notify_listen - the receiving end of the systemd notification
 * protocol (sd_notify), for the integration tests.
 *
 *   prog_notify_listen SOCKET OUTFILE [SECONDS]
 *
 * Binds the Unix datagram socket SOCKET (what NOTIFY_SOCKET names; an
 * existing file there is replaced) and appends every datagram it receives to
 * OUTFILE, each followed by a line "--" (a datagram holds one or more
 * "KEY=VALUE" lines), flushing after each. OUTFILE is created (empty) once
 * the socket is bound, so a test can wait for OUTFILE before it starts the
 * notifying program. Exits 0 after SECONDS (default 120) or on SIGTERM /
 * SIGINT, removing SOCKET; 1 on errors, 2 on a usage error.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int s)
{
    (void)s;
    stop = 1;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: prog_notify_listen SOCKET OUTFILE [SECONDS]\n");
        return 2;
    }
    const char *path = argv[1];
    long secs = argc == 4 ? strtol(argv[3], NULL, 10) : 120;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path || secs <= 0) {
        fprintf(stderr, "prog_notify_listen: bad socket path or seconds\n");
        return 2;
    }
    memcpy(sa.sun_path, path, strlen(path));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fprintf(stderr, "prog_notify_listen: socket: %s\n", strerror(errno));
        return 1;
    }
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa)) {
        fprintf(stderr, "prog_notify_listen: bind %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = on_signal;
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);
    FILE *out = fopen(argv[2], "a");
    if (!out) {
        fprintf(stderr, "prog_notify_listen: %s: %s\n", argv[2], strerror(errno));
        unlink(path);
        return 1;
    }
    time_t end = time(NULL) + secs;
    int rc = 0;
    while (!stop && time(NULL) < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, 200);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "prog_notify_listen: poll: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        if (n <= 0)
            continue;
        char buf[4096];
        ssize_t len = recv(fd, buf, sizeof buf - 1, 0);
        if (len < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            fprintf(stderr, "prog_notify_listen: recv: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        buf[len] = 0;
        fprintf(out, "%s%s--\n", buf, len && buf[len - 1] == '\n' ? "" : "\n");
        fflush(out);
    }
    fclose(out);
    close(fd);
    unlink(path);
    return rc;
}
