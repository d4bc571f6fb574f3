/* log.c - see log.h. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "utf8.h"

static int log_level = HD_LOG_INFO;
static int log_format = HD_LOG_FMT_TEXT;
static int log_journal; /* 1: native protocol */
static int jfd = -1;    /* datagram socket to the journal */
static struct sockaddr_un jaddr;
static hd_log_ctx ctx = HD_LOG_CTX_NONE;

static const char *const names[] = {"error", "warn", "info", "debug"};
static const int syslog_prio[] = {3, 4, 6, 7};

int hd_log_parse_level(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (name && !strcmp(name, names[i]))
            return i;
    if (name && !strcmp(name, "warning"))
        return HD_LOG_WARN;
    return -1;
}

int hd_log_parse_format(const char *name)
{
    if (name && !strcmp(name, "text"))
        return HD_LOG_FMT_TEXT;
    if (name && !strcmp(name, "json"))
        return HD_LOG_FMT_JSON;
    return -1;
}

void hd_log_set_level(int level) { log_level = level; }
int hd_log_get_level(void) { return log_level; }
void hd_log_set_format(int format) { log_format = format; }

static char ctx_heap[256]; /* a copy: the heap may be destroyed mid-request */

void hd_log_ctx_set(const hd_log_ctx *c)
{
    static const hd_log_ctx none = HD_LOG_CTX_NONE;
    ctx = c ? *c : none;
    if (ctx.heap) {
        snprintf(ctx_heap, sizeof ctx_heap, "%s", ctx.heap);
        ctx.heap = ctx_heap;
    }
}

void hd_log_ctx_err(const char *err) { ctx.err = err; }

int hd_log_setup(void)
{
    /* JOURNAL_STREAM=DEV:INODE of the stream systemd connected; only when
     * it is still our stderr is stderr the journal. */
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    log_journal = 0;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(2, &st) != 0 || (unsigned long long)st.st_dev != dev ||
        (unsigned long long)st.st_ino != ino)
        return 0;
    const char *path = getenv("HEAPD_JOURNAL_SOCKET");
    if (!path || !*path)
        path = "/run/systemd/journal/socket";
    if (strlen(path) >= sizeof jaddr.sun_path)
        return 0;
    memset(&jaddr, 0, sizeof jaddr);
    jaddr.sun_family = AF_UNIX;
    memcpy(jaddr.sun_path, path, strlen(path) + 1);
    if (jfd < 0)
        jfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    log_journal = jfd >= 0;
    return log_journal;
}

/* ---- journal native protocol --------------------------------------------- */

typedef struct jbuf {
    char b[8192];
    size_t n;
} jbuf;

/* KEY\n<64-bit little-endian length><value>\n: any bytes, newlines included. */
static void jfield(jbuf *j, const char *key, const char *val)
{
    size_t kl = strlen(key), vl = strlen(val);
    if (j->n + kl + 1 + 8 + vl + 1 > sizeof j->b)
        vl = sizeof j->b > j->n + kl + 10 ? sizeof j->b - j->n - kl - 10 : 0;
    if (j->n + kl + 10 > sizeof j->b)
        return;
    memcpy(j->b + j->n, key, kl);
    j->n += kl;
    j->b[j->n++] = '\n';
    uint64_t l = vl;
    for (int i = 0; i < 8; i++)
        j->b[j->n++] = (char)((l >> (8 * i)) & 0xff);
    memcpy(j->b + j->n, val, vl);
    j->n += vl;
    j->b[j->n++] = '\n';
}

static void jnum(jbuf *j, const char *key, long long v)
{
    char s[32];
    snprintf(s, sizeof s, "%lld", v);
    jfield(j, key, s);
}

static int journal_send(int level, const char *msg)
{
    jbuf j;
    j.n = 0;
    jfield(&j, "MESSAGE", msg);
    jnum(&j, "PRIORITY", syslog_prio[level]);
    jfield(&j, "SYSLOG_IDENTIFIER", "heapd");
    jfield(&j, "HEAPD_LEVEL", names[level]);
    if (ctx.heap)
        jfield(&j, "HEAP", ctx.heap);
    if (ctx.rank >= 0)
        jnum(&j, "RANK", ctx.rank);
    if (ctx.pid >= 0)
        jnum(&j, "PID", ctx.pid);
    if (ctx.seq >= 0)
        jnum(&j, "SEQ", ctx.seq);
    if (ctx.err)
        jfield(&j, "ERR", ctx.err);
    if (ctx.req)
        jfield(&j, "REQ", ctx.req);
    ssize_t w;
    do
        w = sendto(jfd, j.b, j.n, MSG_NOSIGNAL, (struct sockaddr *)&jaddr, sizeof jaddr);
    while (w < 0 && errno == EINTR);
    return w == (ssize_t)j.n ? 0 : -1;
}

/* ---- JSON lines ------------------------------------------------------------ */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = hu_len(p);
        if (!n) {
            fputs("\\ufffd", f);
            p++;
            continue;
        }
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else if (n == 3 && p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9))
            fprintf(f, "\\u%04x", 0x2000 | (p[2] - 0x80)); /* U+2028/9: line breaks to some readers */
        else
            fwrite(p, 1, (size_t)n, f);
        p += n;
    }
    fputc('"', f);
}

static void json_line(int level, const char *msg)
{
    struct timespec ts;
    struct tm tm;
    char t[40];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "{\"time\": \"%s.%06ldZ\", \"level\": \"%s\", \"heapd_pid\": %ld, \"message\": ", t,
            ts.tv_nsec / 1000, names[level], (long)getpid());
    json_str(stderr, msg);
    if (ctx.heap) {
        fputs(", \"heap\": ", stderr);
        json_str(stderr, ctx.heap);
    }
    if (ctx.rank >= 0)
        fprintf(stderr, ", \"rank\": %ld", ctx.rank);
    if (ctx.pid >= 0)
        fprintf(stderr, ", \"pid\": %ld", ctx.pid);
    if (ctx.seq >= 0)
        fprintf(stderr, ", \"seq\": %lld", ctx.seq);
    if (ctx.err) {
        fputs(", \"err\": ", stderr);
        json_str(stderr, ctx.err);
    }
    if (ctx.req) {
        fputs(", \"req\": ", stderr);
        json_str(stderr, ctx.req);
    }
    fputs("}\n", stderr);
}

void hd_log(int level, const char *fmt, ...)
{
    if (level > log_level || level < 0 || level > 3)
        return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (log_journal) {
        if (journal_send(level, buf) == 0)
            return;
        fprintf(stderr, "<%d>%s: %s\n", syslog_prio[level], names[level], buf);
    } else if (log_format == HD_LOG_FMT_JSON) {
        json_line(level, buf);
    } else {
        fprintf(stderr, "heapd[%ld]: %s: %s\n", (long)getpid(), names[level], buf);
    }
    fflush(stderr);
}
