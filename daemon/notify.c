/* notify.c - see notify.h. */
#include "notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int hd_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !path[0])
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof sa.sun_path) {
        errno = EINVAL;
        return -1;
    }
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@')
        sa.sun_path[0] = 0; /* abstract namespace */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, sl);
    int e = errno;
    close(fd);
    if (n < 0) {
        errno = e;
        return -1;
    }
    return 1;
}
