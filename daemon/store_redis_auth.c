/* store_redis_auth.c - the store's credentials (issue 33 item 1): the
 * credentials file, and AUTH as the first command of every connection. A
 * tenant that can reach Redis but has no credentials can then neither read
 * the store's keys nor publish to the nodes' channels (with an ACL user for
 * heapd and the default user off: docs/multinode.md). */
#include "store_redis_int.h"
#include "hmac.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first line of a credentials file (at most 511 bytes). */
static int read_line(const char *what, const char *path, char *line, size_t linelen, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        hd_store_seterr(err, errlen, "%s %s: cannot open it (%s)", what, path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        hd_store_seterr(err, errlen, "%s %s is not a regular file", what, path);
        close(fd);
        return -1;
    }
    if (st.st_mode & 077) {
        hd_store_seterr(err, errlen,
                        "%s %s is readable or writable by others (mode %04o): chmod 0600 it "
                        "(owned by heapd's user)",
                        what, path, (unsigned)(st.st_mode & 07777));
        close(fd);
        return -1;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        hd_store_seterr(err, errlen, "%s %s belongs to uid %u, not to heapd's uid %u or root", what, path,
                        (unsigned)st.st_uid, (unsigned)geteuid());
        close(fd);
        return -1;
    }
    ssize_t n = read(fd, line, linelen - 1);
    close(fd);
    if (n < 0) {
        hd_store_seterr(err, errlen, "%s %s: cannot read it (%s)", what, path, strerror(errno));
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
    if (read_line("store_credentials", path, line, sizeof line, err, errlen) != 0)
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

/* ---- the MAC key (issue 33 item 1) --------------------------------------- */

int hd_store_check_key(const char *path, unsigned char *key, size_t keycap, size_t *keylen, char *err, size_t errlen)
{
    char line[512];
    size_t n;
    if (!path || !path[0]) {
        hd_store_seterr(err, errlen, "store_key: no file named");
        return -1;
    }
    if (read_line("store_key", path, line, sizeof line, err, errlen) != 0)
        return -1;
    n = strlen(line);
    if (n < HD_STORE_KEY_MIN || n > HD_STORE_KEY_MAX) {
        hd_store_seterr(err, errlen,
                        "store_key %s: the key (its first line) is %zu bytes; it must be %d to %d (e.g. "
                        "`head -c 32 /dev/urandom | base64`), the same on every node",
                        path, n, HD_STORE_KEY_MIN, HD_STORE_KEY_MAX);
        explicit_bzero(line, sizeof line);
        return -1;
    }
    if (key) {
        if (n > keycap) {
            explicit_bzero(line, sizeof line);
            hd_store_seterr(err, errlen, "store_key %s: no room for the key", path);
            return -1;
        }
        memcpy(key, line, n);
        *keylen = n;
    }
    explicit_bzero(line, sizeof line);
    return 0;
}

/* The key: store_key's, else derived from the credentials file's password
 * (HMAC-SHA1(password, a fixed label): the password itself never signs). */
int hd_store_load_key(hd_store *s, const char *key_file, const char *credentials, char *err, size_t errlen)
{
    unsigned char raw[HD_STORE_KEY_MAX];
    size_t n = 0;
    s->have_key = 0;
    if (key_file && key_file[0]) {
        if (hd_store_check_key(key_file, raw, sizeof raw, &n, err, errlen) != 0)
            return -1;
        /* hashed down to 20 bytes, so the key fits s->key whatever its length */
        hmac_ctx h;
        char hex[HMAC_HEX_LEN + 1];
        hmac_init(&h, raw, n);
        hmac_update(&h, "heapd store key v1", 18);
        hmac_final_hex(&h, hex);
        memcpy(s->key, hex, HMAC_HEX_LEN);
        s->keylen = HMAC_HEX_LEN;
        explicit_bzero(raw, sizeof raw);
        explicit_bzero(hex, sizeof hex);
        s->have_key = 1;
    } else if (credentials && credentials[0] && s->pass[0]) {
        hmac_ctx h;
        char hex[HMAC_HEX_LEN + 1];
        hmac_init(&h, s->pass, strlen(s->pass));
        hmac_update(&h, "heapd store result key v1", 25);
        hmac_final_hex(&h, hex);
        memcpy(s->key, hex, HMAC_HEX_LEN);
        s->keylen = HMAC_HEX_LEN;
        explicit_bzero(hex, sizeof hex);
        s->have_key = 1;
    }
    return 0;
}

int hd_store_signed(const hd_store *s) { return s && s->have_key; }
