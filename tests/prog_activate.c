/* prog_activate - socket activation the way systemd does it, for the
 * integration tests.
 *
 *   prog_activate SOCKET PROGRAM [ARGS...]
 *
 * Binds and listens on the Unix stream socket SOCKET (an existing file there
 * is replaced), puts it on fd 3, sets LISTEN_FDS=1, LISTEN_PID=<own pid> and
 * LISTEN_FDNAMES=heapd.socket, and execs PROGRAM (which keeps the pid, so
 * LISTEN_PID names it). Exit status 2 on a usage error, 1 when the socket or
 * the exec fails; otherwise whatever PROGRAM exits with.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: prog_activate SOCKET PROGRAM [ARGS...]\n");
        return 2;
    }
    const char *path = argv[1];
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        fprintf(stderr, "prog_activate: socket path too long: %s\n", path);
        return 2;
    }
    memcpy(sa.sun_path, path, strlen(path));
    int fd = socket(AF_UNIX, SOCK_STREAM, 0); /* no CLOEXEC: it crosses exec */
    if (fd < 0) {
        fprintf(stderr, "prog_activate: socket: %s\n", strerror(errno));
        return 1;
    }
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128)) {
        fprintf(stderr, "prog_activate: bind/listen %s: %s\n", path, strerror(errno));
        return 1;
    }
    chmod(path, 0660);
    if (fd != 3) {
        if (dup2(fd, 3) < 0) {
            fprintf(stderr, "prog_activate: dup2: %s\n", strerror(errno));
            return 1;
        }
        close(fd);
    }
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", "1", 1);
    setenv("LISTEN_FDNAMES", "heapd.socket", 1);
    execvp(argv[2], argv + 2);
    fprintf(stderr, "prog_activate: cannot run %s: %s\n", argv[2], strerror(errno));
    return 1;
}
