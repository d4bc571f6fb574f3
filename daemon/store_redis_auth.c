/* store_redis_auth.c - the store's credentials (issue 33 item 1): the
 * credentials file, and AUTH as the first command of every connection. A
 * tenant that can reach Redis but has no credentials can then neither read
 * the store's keys nor publish to the nodes' channels (with an ACL user for
 * heapd and the default user off: docs/multinode.md). */
#include "store_redis_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first line of a credentials file (at most 511 bytes). */
static int read_line(const char *path, char *line, size_t linelen, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        hd_store_seterr(err, errlen, "store_credentials %s: cannot open it (%s)", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        hd_store_seterr(err, errlen, "store_credentials %s is not a regular file", path);
        close(fd);
        return -1;
    }
    if (st.st_mode & 077) {
        hd_store_seterr(err, errlen,
                        "store_credentials %s is readable or writable by others (mode %04o): chmod 0600 it "
                        "(owned by heapd's user)",
                        path, (unsigned)(st.st_mode & 07777));
        close(fd);
        return -1;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        hd_store_seterr(err, errlen, "store_credentials %s belongs to uid %u, not to heapd's uid %u or root", path,
                        (unsigned)st.st_uid, (unsigned)geteuid());
        close(fd);
        return -1;
    }
    ssize_t n = read(fd, line, linelen - 1);
    close(fd);
    if (n < 0) {
        hd_store_seterr(err, errlen, "store_credentials %s: cannot read it (%s)", path, strerror(errno));
        return -1;
    }
    line[n] = 0;
    line[strcspn(line, "\r\n")] = 0;
    return 0;
}

int hd_store_check_credentials(const char *path, char *user, size_t userlen, char *pass, size_t passlen, char *err,
                               size_t errlen)
{
    char line[512];
    if (!path || !path[0]) {
        hd_store_seterr(err, errlen, "store_credentials: no file named");
        return -1;
    }
    if (read_line(path, line, sizeof line, err, errlen) != 0)
        return -1;
    const char *sp = strchr(line, ' ');
    const char *pw = sp ? sp + 1 : line;
    size_t ul = sp ? (size_t)(sp - line) : 0;
    if (!pw[0] || strchr(pw, ' ')) {
        hd_store_seterr(err, errlen,
                        "store_credentials %s: the first line must be \"USER PASSWORD\" or \"PASSWORD\" "
                        "(no spaces in either)",
                        path);
        return -1;
    }
    if (ul >= userlen || strlen(pw) >= passlen) {
        hd_store_seterr(err, errlen, "store_credentials %s: the user (at most %zu bytes) or password (%zu) is too long",
                        path, userlen - 1, passlen - 1);
        return -1;
    }
    memcpy(user, line, ul);
    user[ul] = 0;
    snprintf(pass, passlen, "%s", pw);
    return 0;
}

const char *hd_store_auth_error(const hd_store *s) { return s ? s->auth_err : ""; }

static void on_auth(redisAsyncContext *ac, void *reply, void *priv)
{
    hd_store *s = ac->data;
    redisReply *r = reply;
    conn *c = ac == s->cmd.ac ? &s->cmd : ac == s->sub.ac ? &s->sub : NULL;
    (void)priv;
    if (!r || !c)
        return; /* the connection went first: its own callback said why */
    if (r->type != REDIS_REPLY_ERROR) {
        s->auth_err[0] = 0;
        return;
    }
    snprintf(s->auth_err, sizeof s->auth_err,
             "Redis at %s refused AUTH as %s%s%s (%.*s): check store_credentials or the store URL's "
             "credentials, and the Redis ACL (docs/multinode.md)",
             s->hostport, s->user[0] ? "user \"" : "the default user", s->user, s->user[0] ? "\"" : "",
             (int)(r->len > 200 ? 200 : r->len), r->str ? r->str : "");
    c->auth_failed = 1;
    redisAsyncDisconnect(ac); /* the commands behind AUTH get NOAUTH; on_disconnect names auth_err */
}

int hd_store_auth_send(hd_store *s, redisAsyncContext *ac)
{
    if (!s->have_auth)
        return 0;
    const char *argv[3] = {"AUTH", s->user, s->pass};
    size_t len[3] = {4, strlen(s->user), strlen(s->pass)};
    if (s->user[0])
        return redisAsyncCommandArgv(ac, on_auth, NULL, 3, argv, len) == REDIS_OK ? 0 : -1;
    argv[1] = s->pass;
    len[1] = len[2];
    return redisAsyncCommandArgv(ac, on_auth, NULL, 2, argv, len) == REDIS_OK ? 0 : -1;
}
