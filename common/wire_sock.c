/*
 * wire_sock.c - the Unix sockets of the heapd protocol: nonblocking mode, the
 * socket path's checks, listen (a stale socket replaced, a live one refused)
 * and connect, with error messages that name the fix. See wire.h (its
 * "sockets" section); the framing is in wire.c.
 */
#include "wire_int.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- sockets ---------------------------------------------------------- */

int hw_socket_path_ok(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    size_t n;

    if (path == NULL || path[0] == '\0') {
        hw_seterr(err, errlen, "the socket path is empty");
        return HW_EINVAL;
    }
    n = strlen(path);
    if (n >= sizeof(sa.sun_path)) {
        hw_seterr(err, errlen,
                  "socket path '%.60s...' is %zu bytes long; a Unix socket path "
                  "must be shorter than %zu bytes",
                  path, n, sizeof(sa.sun_path));
        return HW_ENAMETOOLONG;
    }
    return 0;
}

static void make_addr(struct sockaddr_un *sa, const char *path)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path, path, strlen(path) + 1);
}

/* Is something listening at path? 1 yes, 0 no (stale or absent), <0 error. */
static int probe_live(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    int s, rc;

    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) {
        hw_seterr(err, errlen, "socket failed: %s", strerror(errno));
        return HW_ESYS;
    }
    make_addr(&sa, path);
    rc = connect(s, (struct sockaddr *)&sa, sizeof(sa));
    if (rc == 0 || errno == EAGAIN || errno == EINPROGRESS || errno == EINTR) {
        rc = 1; /* accepted, or a full backlog: alive */
    } else if (errno == ECONNREFUSED || errno == ENOENT) {
        rc = 0;
    } else {
        hw_seterr(err, errlen, "cannot check whether %s is in use: connect: %s", path, strerror(errno));
        rc = HW_ESYS;
    }
    close(s);
    return rc;
}

int hw_listen_unix(const char *path, int backlog, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    struct stat st;
    int s, rc;

    rc = hw_socket_path_ok(path, err, errlen);
    if (rc < 0)
        return rc;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            hw_seterr(err, errlen,
                      "%s exists and is not a socket; not removing "
                      "it",
                      path);
            return HW_EADDRINUSE;
        }
        rc = probe_live(path, err, errlen);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            hw_seterr(err, errlen,
                      "another process (a running heapd?) is "
                      "already listening on %s",
                      path);
            return HW_EADDRINUSE;
        }
        if (unlink(path) < 0 && errno != ENOENT) {
            hw_seterr(err, errlen, "cannot remove the stale socket %s: %s", path, strerror(errno));
            return HW_ESYS;
        }
    } else if (errno != ENOENT) {
        hw_seterr(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        return HW_ESYS;
    }

    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
        hw_seterr(err, errlen, "socket failed: %s", strerror(errno));
        return HW_ESYS;
    }
    make_addr(&sa, path);
    if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        close(s);
        errno = e;
        if (e == EADDRINUSE) {
            hw_seterr(err, errlen,
                      "cannot bind %s: it was created by another "
                      "process meanwhile",
                      path);
            return HW_EADDRINUSE;
        }
        hw_seterr(err, errlen, "cannot bind %s: %s", path, strerror(e));
        return HW_ESYS;
    }
    if (listen(s, backlog) < 0) {
        int e = errno;
        close(s);
        unlink(path);
        errno = e;
        hw_seterr(err, errlen, "cannot listen on %s: %s", path, strerror(e));
        return HW_ESYS;
    }
    return s;
}

/* The group's name, else its number. */
static const char *group_name(gid_t gid, char *buf, size_t len)
{
    struct group g, *r = NULL;
    char tmp[1024];
    if (getgrgid_r(gid, &g, tmp, sizeof tmp, &r) == 0 && r)
        snprintf(buf, len, "%s", r->gr_name);
    else
        snprintf(buf, len, "%u", (unsigned)gid);
    return buf;
}

/* One message per cause: who may connect (EACCES), a path that is not a
 * socket, nobody listening, no socket at all. */
static void connect_error(const char *path, int e, char *err, size_t errlen)
{
    struct stat st;
    char grp[64];
    int have = stat(path, &st) == 0;
    if (e == EACCES) {
        if (have && access(path, W_OK) != 0) {
            hw_seterr(err, errlen,
                      "cannot connect to heapd at %s: permission denied: the socket belongs to "
                      "group %s (mode %04o); ask to be added to group %s (usermod -aG %s USER, then log in "
                      "again)",
                      path, group_name(st.st_gid, grp, sizeof grp), (unsigned)(st.st_mode & 07777), grp, grp);
            return;
        }
        /* The socket is reachable by mode, or stat failed: a directory on
         * the way is what refuses. */
        char dir[sizeof((struct sockaddr_un *)0)->sun_path];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, "/");
        if (stat(dir, &st) == 0)
            hw_seterr(err, errlen,
                      "cannot connect to heapd at %s: permission denied by its directory %s "
                      "(group %s, mode %04o); ask to be added to group %s (usermod -aG %s USER, then log in "
                      "again)",
                      path, dir, group_name(st.st_gid, grp, sizeof grp), (unsigned)(st.st_mode & 07777), grp, grp);
        else
            hw_seterr(err, errlen,
                      "cannot connect to heapd at %s: permission denied (%s); check the "
                      "permissions of the path",
                      path, strerror(errno));
        return;
    }
    if (have && !S_ISSOCK(st.st_mode)) {
        hw_seterr(err, errlen,
                  "cannot connect to heapd at %s: it is a %s, not a socket; point "
                  "HEAPD_SOCKET or --socket at heapd's socket (heapd.conf `socket`)",
                  path,
                  S_ISDIR(st.st_mode)   ? "directory"
                  : S_ISREG(st.st_mode) ? "regular file"
                                        : "special file");
        return;
    }
    if (e == ECONNREFUSED) {
        hw_seterr(err, errlen,
                  "cannot connect to heapd at %s: %s: the socket exists but nothing listens "
                  "on it: is heapd running? (a heapd that stopped leaves its socket behind) check "
                  "systemctl status heapd.socket heapd",
                  path, strerror(e));
        return;
    }
    if (e == ENOENT) {
        hw_seterr(err, errlen,
                  "cannot connect to heapd at %s: %s: is heapd running? check systemctl status "
                  "heapd.socket heapd, and the path (HEAPD_SOCKET, --socket)",
                  path, strerror(e));
        return;
    }
    hw_seterr(err, errlen,
              "cannot connect to heapd at %s: %s (is heapd running? check the socket path "
              "and systemctl status heapd)",
              path, strerror(e));
}

int hw_connect_unix(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    int s, rc;

    rc = hw_socket_path_ok(path, err, errlen);
    if (rc < 0)
        return rc;
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
        hw_seterr(err, errlen, "socket failed: %s", strerror(errno));
        return HW_ESYS;
    }
    make_addr(&sa, path);
    rc = connect(s, (struct sockaddr *)&sa, sizeof(sa));
    if (rc < 0 && errno == EINTR) {
        /* The connection goes on in the background: wait for its result. */
        socklen_t sl = sizeof(int);
        int soerr = 0;
        for (;;) {
            struct pollfd p = {.fd = s, .events = POLLOUT, .revents = 0};
            if (poll(&p, 1, -1) >= 0 || errno != EINTR)
                break;
        }
        if (getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
            soerr = errno;
        rc = soerr ? -1 : 0;
        errno = soerr;
    }
    if (rc < 0) {
        int e = errno;
        close(s);
        connect_error(path, e, err, errlen);
        errno = e;
        return HW_ESYS;
    }
    return s;
}
