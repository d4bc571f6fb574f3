/* prog_raw - a raw-protocol client that sends heapd bad input, for
 * tests/it_badinput.sh.
 *
 *   prog_raw --socket PATH [options] CASE...      run the cases, once each
 *   prog_raw --socket PATH --repeat N CASE...     run them N times
 *   prog_raw --list                               list the cases
 *
 * It speaks the wire format itself (common/wire.h, the generated protobuf-c
 * code), so it can send what libheapc never sends: truncated frames, lengths
 * over the cap, fds where none belong, invalid protobuf, reply bodies as
 * requests, wrong versions, requests in the wrong state, bad frees. Every case
 * checks heapd's answer: the expected Error code (with the request's id), or a
 * closed connection when the framing is broken; that the connection still
 * works after an error reply; and, with a pipe's write end sent among the fds,
 * that heapd closed every fd it was sent (the pipe reads EOF).
 *
 * Output: one line per case, "ok   CASE: what" or "FAIL CASE: expected ...,
 * got ..."; with --repeat only failures and a summary line
 * ("repeat: N rounds, K cases, F failures"). Exit 0 when every case passed,
 * 1 when one failed, 2 on usage errors.
 */
#include "heapd.pb-c.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define REPLY_MS 30000 /* how long a reply (or the close) may take: a bound, not a figure (ASan, loaded CI) */
#define PROBE_MS 30000 /* how long heapd may take to close sent fds (a bound) */

static const char *sock_path;
static char why[4096];     /* the failing case's explanation */
static unsigned long uniq; /* own heap names */

/* Victim heap (a heap another client uses while the cases run). */
static const char *victim_heap;
static uint32_t victim_world;
static uint64_t victim_chunk;

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- connections ------------------------------------------------------------ */

typedef struct rconn {
    int fd;
    hw_reader rd;
    uint64_t next_id;
    uint64_t last_id; /* id of the last request sent */
} rconn;

static int rc_open(rconn *c)
{
    char err[512];
    memset(c, 0, sizeof *c);
    hw_reader_init(&c->rd);
    c->fd = hw_connect_unix(sock_path, err, sizeof err);
    if (c->fd < 0)
        return fail("cannot connect: %s", err);
    c->next_id = 100;
    return 0;
}

static void rc_close(rconn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    hw_reader_free(&c->rd);
}

/* One sendmsg of buf with fds attached (SCM_RIGHTS), then the rest of buf
 * without fds. Returns 0 or -1 (errno). */
static int send_raw(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    const char *p = buf;
    size_t off = 0;
    bool first = true;
    while (off < len || first) {
        union {
            struct cmsghdr align;
            char b[CMSG_SPACE(253 * sizeof(int))];
        } cb;
        struct iovec iov = {(void *)(p + off), len - off};
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        if (first && nfds) {
            memset(&cb, 0, sizeof cb);
            m.msg_control = cb.b;
            m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
            struct cmsghdr *h = CMSG_FIRSTHDR(&m);
            h->cmsg_level = SOL_SOCKET;
            h->cmsg_type = SCM_RIGHTS;
            h->cmsg_len = CMSG_LEN(nfds * sizeof(int));
            memcpy(CMSG_DATA(h), fds, nfds * sizeof(int));
        }
        ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        off += (size_t)n;
        first = false;
        if (len == 0)
            break;
    }
    return 0;
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* A frame header. */
static void hdr(unsigned char *h, uint32_t len, uint32_t nfds)
{
    put32(h, len);
    put32(h + 4, nfds);
}

/* Sends f (id set here) with fds, through the library's framing. */
static int send_frame(rconn *c, Heapd__Frame *f, const int *fds, size_t nfds)
{
    char err[512];
    f->id = ++c->next_id;
    c->last_id = f->id;
    size_t len = heapd__frame__get_packed_size(f);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return fail("out of memory packing %zu bytes", len);
    heapd__frame__pack(f, buf);
    int rc = hw_send_frame(c->fd, buf, len, fds, nfds, err, sizeof err);
    free(buf);
    if (rc < 0)
        return fail("sending a %zu-byte frame failed: %s", len, err);
    return 0;
}

/* Sends a payload (any bytes) in one correct frame. */
static int send_payload(rconn *c, const void *data, size_t len, const int *fds, size_t nfds)
{
    char err[512];
    if (hw_send_frame(c->fd, data, len, fds, nfds, err, sizeof err) < 0)
        return fail("sending a %zu-byte payload failed: %s", len, err);
    return 0;
}

enum { R_FRAME, R_CLOSED, R_TIMEOUT, R_BAD };

typedef struct reply {
    int kind;
    Heapd__Frame *f; /* R_FRAME */
    size_t nfds;
    char desc[1400]; /* what arrived, for messages */
} reply;

static const char *errname(int code)
{
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&heapd__err_code__descriptor, code);
    return v ? v->name : "ERR_?";
}

static const char *bodyname(int bc)
{
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&heapd__frame__descriptor, (unsigned)bc);
    return fd ? fd->name : "(no body)";
}

static void reply_free(reply *r)
{
    if (r->f)
        heapd__frame__free_unpacked(r->f, NULL);
    memset(r, 0, sizeof *r);
}

static void get_reply(rconn *c, int timeout_ms, reply *r)
{
    char err[512];
    hw_frame fr;
    memset(r, 0, sizeof *r);
    int rc = hw_recv_frame(c->fd, &c->rd, &fr, timeout_ms, err, sizeof err);
    if (rc == HW_EOF || rc == HW_EPARTIAL || (rc == HW_ESYS && (errno == ECONNRESET || errno == EPIPE))) {
        r->kind = R_CLOSED;
        snprintf(r->desc, sizeof r->desc, "connection closed (%s)", hw_strerror(rc));
        return;
    }
    if (rc == HW_ETIMEDOUT) {
        r->kind = R_TIMEOUT;
        snprintf(r->desc, sizeof r->desc, "no reply within %d ms", timeout_ms);
        return;
    }
    if (rc < 0) {
        r->kind = R_BAD;
        snprintf(r->desc, sizeof r->desc, "reading the reply failed: %s", err);
        return;
    }
    r->nfds = fr.nfds;
    r->f = heapd__frame__unpack(NULL, fr.len, fr.data);
    size_t len = fr.len;
    hw_frame_free(&fr); /* closes the fds (chunks of attach/alloc replies) */
    if (!r->f) {
        r->kind = R_BAD;
        snprintf(r->desc, sizeof r->desc, "a %zu-byte reply that is not a heapd.Frame", len);
        return;
    }
    r->kind = R_FRAME;
    if (r->f->body_case == HEAPD__FRAME__BODY_ERROR)
        snprintf(r->desc, sizeof r->desc, "Error %s (id %" PRIu64 ") \"%.1200s\"", errname(r->f->error->code), r->f->id,
                 r->f->error->message ? r->f->error->message : "");
    else
        snprintf(r->desc, sizeof r->desc, "%s (id %" PRIu64 ")", bodyname(r->f->body_case), r->f->id);
}

/* The next reply must be Error `code` for request `id` (UINT64_MAX: any id). */
static int expect_error_id(rconn *c, int code, uint64_t id, const char *what)
{
    reply r;
    get_reply(c, REPLY_MS, &r);
    int ok = r.kind == R_FRAME && r.f->body_case == HEAPD__FRAME__BODY_ERROR && (int)r.f->error->code == code &&
             (id == UINT64_MAX || r.f->id == id) && r.nfds == 0;
    if (!ok)
        fail("%s: expected Error %s (id %" PRIu64 "), got %s", what, errname(code), id, r.desc);
    reply_free(&r);
    return ok ? 0 : -1;
}

static int expect_error(rconn *c, int code, const char *what) { return expect_error_id(c, code, c->last_id, what); }

/* The next reply must have body `bc` for the last request; *out keeps it. */
static int expect_body(rconn *c, int bc, const char *what, reply *out)
{
    reply r;
    get_reply(c, REPLY_MS, &r);
    int ok = r.kind == R_FRAME && (int)r.f->body_case == bc && r.f->id == c->last_id;
    if (!ok)
        fail("%s: expected %s (id %" PRIu64 "), got %s", what, bodyname(bc), c->last_id, r.desc);
    if (ok && out)
        *out = r;
    else
        reply_free(&r);
    return ok ? 0 : -1;
}

/* heapd must close the connection; replies before that are allowed only if
 * allow_frames. */
static int expect_closed(rconn *c, bool allow_frames, const char *what)
{
    for (int i = 0; i < 4; i++) {
        reply r;
        get_reply(c, REPLY_MS, &r);
        if (r.kind == R_CLOSED) {
            reply_free(&r);
            return 0;
        }
        if (r.kind != R_FRAME || !allow_frames) {
            fail("%s: expected heapd to close the connection, got %s", what, r.desc);
            reply_free(&r);
            return -1;
        }
        reply_free(&r);
    }
    return fail("%s: expected heapd to close the connection, got more and more replies", what);
}

/* ---- requests ------------------------------------------------------------------ */

static int send_hello(rconn *c, uint32_t version)
{
    Heapd__Hello h = HEAPD__HELLO__INIT;
    h.version = version;
    h.client = (char *)"prog_raw";
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_HELLO;
    f.hello = &h;
    return send_frame(c, &f, NULL, 0);
}

static int hello(rconn *c)
{
    if (send_hello(c, 1))
        return -1;
    return expect_body(c, HEAPD__FRAME__BODY_HELLO_REPLY, "Hello", NULL);
}

static int open_hello(rconn *c)
{
    if (rc_open(c))
        return -1;
    if (hello(c)) {
        rc_close(c);
        return -1;
    }
    return 0;
}

typedef struct aparams {
    uint64_t chunk, initial, va, min_block;
    uint32_t timeout_ms;
    int policy;
} aparams;

/* Parameters of the heaps this program creates for itself. */
static const aparams own = {64 << 10, 64 << 10, 1 << 20, 512, 5000, 0};

static int send_attach(rconn *c, const char *heap, uint32_t rank, uint32_t world, const aparams *p)
{
    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    Heapd__Attach a = HEAPD__ATTACH__INIT;
    a.heap = (char *)heap;
    a.rank = rank;
    a.world_size = world;
    a.device_uuid = (char *)"";
    if (p) {
        hp.chunk_size = p->chunk;
        hp.initial_size = p->initial;
        hp.va_size = p->va;
        hp.min_block = p->min_block;
        hp.collect_timeout_ms = p->timeout_ms;
        hp.policy = p->policy;
        a.params = &hp;
    }
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_ATTACH;
    f.attach = &a;
    return send_frame(c, &f, NULL, 0);
}

static int send_alloc(rconn *c, uint64_t seq, uint64_t size)
{
    Heapd__Alloc a = HEAPD__ALLOC__INIT;
    a.seq = seq;
    a.size = size;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_ALLOC;
    f.alloc = &a;
    return send_frame(c, &f, NULL, 0);
}

/* Issue 29: a named Alloc (name may hold a NUL: len bytes of it). */
static int send_alloc_named(rconn *c, uint64_t seq, uint64_t size, const char *name, size_t len)
{
    Heapd__Alloc a = HEAPD__ALLOC__INIT;
    a.seq = seq;
    a.size = size;
    a.name = (char *)name;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_ALLOC;
    f.alloc = &a;
    if (memchr(name, 0, len)) {
        /* protobuf-c packs strings with strlen: pack "X...", then put the NUL */
        char *tmp = malloc(len + 1);
        if (tmp) {
            memcpy(tmp, name, len);
            tmp[len] = 0;
        }
        for (size_t i = 0; tmp && i < len; i++)
            tmp[i] = tmp[i] ? tmp[i] : 'X';
        a.name = tmp;
        f.id = ++c->next_id;
        c->last_id = f.id;
        size_t n = heapd__frame__get_packed_size(&f);
        uint8_t *buf = tmp ? malloc(n) : NULL;
        if (!buf) {
            free(tmp);
            return fail("out of memory");
        }
        heapd__frame__pack(&f, buf);
        uint8_t *p = memmem(buf, n, tmp, len);
        for (size_t i = 0; p && i < len; i++)
            p[i] = (uint8_t)name[i];
        int rc = send_payload(c, buf, n, NULL, 0);
        free(buf);
        free(tmp);
        return rc;
    }
    return send_frame(c, &f, NULL, 0);
}

/* Issue 29: a Commit. */
static int send_commit(rconn *c, const char *tag, uint64_t value, uint64_t seq)
{
    Heapd__Commit m = HEAPD__COMMIT__INIT;
    m.tag = (char *)tag;
    m.value = value;
    m.seq = seq;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_COMMIT;
    f.commit = &m;
    return send_frame(c, &f, NULL, 0);
}

static int send_free(rconn *c, const uint64_t *offs, size_t n)
{
    Heapd__Free m = HEAPD__FREE__INIT;
    m.offsets = (uint64_t *)offs;
    m.n_offsets = n;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_FREE;
    f.free = &m;
    return send_frame(c, &f, NULL, 0);
}

static int send_collect(rconn *c, uint64_t seq)
{
    Heapd__Collect m = HEAPD__COLLECT__INIT;
    m.seq = seq;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_COLLECT;
    f.collect = &m;
    return send_frame(c, &f, NULL, 0);
}

static int send_stats(rconn *c, const char *heap)
{
    Heapd__Stats m = HEAPD__STATS__INIT;
    m.heap = (char *)heap;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_STATS;
    f.stats = &m;
    return send_frame(c, &f, NULL, 0);
}

static int send_force(rconn *c, const char *heap)
{
    Heapd__ForceCollect m = HEAPD__FORCE_COLLECT__INIT;
    m.heap = (char *)heap;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_FORCE_COLLECT;
    f.force_collect = &m;
    return send_frame(c, &f, NULL, 0);
}

static int send_detach(rconn *c)
{
    Heapd__Detach m = HEAPD__DETACH__INIT;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_DETACH;
    f.detach = &m;
    return send_frame(c, &f, NULL, 0);
}

/* The connection still answers: Stats of every heap gets a StatsReply. */
static int still_works(rconn *c, const char *after)
{
    char what[256];
    snprintf(what, sizeof what, "the connection answers after %s", after);
    if (send_stats(c, ""))
        return -1;
    return expect_body(c, HEAPD__FRAME__BODY_STATS_REPLY, what, NULL);
}

static void heap_name(char *buf, size_t len, const char *tag)
{
    snprintf(buf, len, "raw-%ld-%s-%lu", (long)getpid(), tag, ++uniq);
}

/* Attach as rank/world; the reply must be AttachReply (for world > 1 call
 * attach_reply after every rank sent its Attach). */
static int attach_reply(rconn *c, const char *what)
{
    return expect_body(c, HEAPD__FRAME__BODY_ATTACH_REPLY, what, NULL);
}

static int attach1(rconn *c, const char *heap)
{
    if (send_attach(c, heap, 0, 1, &own))
        return -1;
    return attach_reply(c, "Attach (world 1)");
}

/* Allocation `seq` of `size` on a world-1 heap: collects when asked. */
static int alloc1(rconn *c, uint64_t seq, uint64_t size, uint64_t *off)
{
    for (int i = 0; i < 3; i++) {
        reply r;
        if (send_alloc(c, seq, size))
            return -1;
        if (expect_body(c, HEAPD__FRAME__BODY_ALLOC_REPLY, "Alloc", &r))
            return -1;
        bool cn = r.f->alloc_reply->collect_needed;
        *off = r.f->alloc_reply->offset;
        reply_free(&r);
        if (!cn)
            return 0;
        if (send_collect(c, seq) || expect_body(c, HEAPD__FRAME__BODY_COLLECT_REPLY, "Collect", NULL))
            return -1;
    }
    return fail("Alloc %" PRIu64 ": collect_needed three times", seq);
}

/* Allocation `seq` must fail with `code` (after a collect heapd may ask for). */
static int alloc1_error(rconn *c, uint64_t seq, uint64_t size, int code, const char *what)
{
    for (int i = 0; i < 3; i++) {
        reply r;
        if (send_alloc(c, seq, size))
            return -1;
        get_reply(c, REPLY_MS, &r);
        if (r.kind == R_FRAME && r.f->body_case == HEAPD__FRAME__BODY_ALLOC_REPLY && r.f->id == c->last_id &&
            r.f->alloc_reply->collect_needed) {
            reply_free(&r);
            if (send_collect(c, seq) || expect_body(c, HEAPD__FRAME__BODY_COLLECT_REPLY, "Collect", NULL))
                return -1;
            continue;
        }
        int ok = r.kind == R_FRAME && r.f->body_case == HEAPD__FRAME__BODY_ERROR && (int)r.f->error->code == code &&
                 r.f->id == c->last_id;
        if (!ok)
            fail("%s: expected Error %s, got %s", what, errname(code), r.desc);
        reply_free(&r);
        return ok ? 0 : -1;
    }
    return fail("%s: collect_needed three times", what);
}

/* ---- fds ------------------------------------------------------------------------ */

/* A pipe whose write end is sent to heapd: once heapd (and this process)
 * closed every copy, the read end reads EOF. */
typedef struct probe {
    int rd, wr;
} probe;

static int probe_open(probe *p)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC))
        return fail("pipe2: %s", strerror(errno));
    p->rd = fds[0];
    p->wr = fds[1];
    return 0;
}

/* Closes our write end and waits until heapd closed its copies. */
static int probe_check(probe *p, const char *what)
{
    if (p->wr >= 0)
        close(p->wr);
    p->wr = -1;
    struct pollfd pf = {p->rd, POLLIN, 0};
    int n;
    do
        n = poll(&pf, 1, PROBE_MS);
    while (n < 0 && errno == EINTR);
    int rc = 0;
    if (n <= 0) {
        rc = fail("%s: heapd kept a file descriptor it was sent (a pipe's write end still open after %d ms)", what,
                  PROBE_MS);
    } else {
        char b;
        ssize_t k = read(p->rd, &b, 1);
        if (k != 0)
            rc = fail("%s: the probe pipe did not read EOF (read returned %zd)", what, k);
    }
    close(p->rd);
    p->rd = -1;
    return rc;
}

static void probe_abandon(probe *p)
{
    if (p->wr >= 0)
        close(p->wr);
    if (p->rd >= 0)
        close(p->rd);
    p->rd = p->wr = -1;
}

/* n fds to send: fds[0] is the probe's write end, the others memfds (or dups
 * of one). Caller closes them with close_all. */
static int make_fds(int *fds, size_t n, probe *p)
{
    if (probe_open(p))
        return -1;
    fds[0] = p->wr;
    int mfd = -1;
    for (size_t i = 1; i < n; i++) {
        if (i <= 3) {
            fds[i] = memfd_create("prog_raw-junk", MFD_CLOEXEC);
            if (fds[i] >= 0 && ftruncate(fds[i], 4096) != 0) {
                close(fds[i]);
                fds[i] = -1;
            }
            mfd = fds[i];
        } else {
            fds[i] = fcntl(mfd, F_DUPFD_CLOEXEC, 0);
        }
        if (fds[i] < 0) {
            int e = errno;
            for (size_t j = 1; j < i; j++)
                close(fds[j]);
            probe_abandon(p);
            return fail("creating fd %zu of %zu to send: %s", i, n, strerror(e));
        }
    }
    return 0;
}

/* Closes our copies of fds[1..n) (fds[0] is the probe's, closed by probe_check). */
static void close_rest(int *fds, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* ---- cases: broken framing (connection closed) ------------------------------------ */

/* Sends bytes (with fds) and expects heapd to close the connection and every
 * fd. shut: shutdown our write side after sending (a frame cut short). */
static int broken(const void *bytes, size_t len, size_t nfds, bool shut, const char *what)
{
    rconn c;
    probe p = {-1, -1};
    int fds[256];
    int rc = -1;
    if (rc_open(&c))
        return -1;
    if (nfds && make_fds(fds, nfds, &p))
        goto out;
    if (send_raw(c.fd, bytes, len, fds, nfds)) {
        /* heapd may already have closed the connection: that is the point */
        if (errno != EPIPE && errno != ECONNRESET) {
            fail("%s: sendmsg: %s", what, strerror(errno));
            goto out_fds;
        }
    }
    if (shut)
        shutdown(c.fd, SHUT_WR);
    rc = expect_closed(&c, false, what);
out_fds:
    if (nfds) {
        close_rest(fds, nfds);
        if (probe_check(&p, what))
            rc = -1;
    }
out:
    probe_abandon(&p);
    rc_close(&c);
    return rc;
}

static int case_trunc_header(void)
{
    unsigned char h[8];
    hdr(h, 16, 0);
    return broken(h, 5, 0, true, "5 of 8 header bytes, then EOF");
}

static int case_trunc_payload(void)
{
    unsigned char b[8 + 50];
    hdr(b, 100, 0);
    memset(b + 8, 0x0a, 50);
    return broken(b, sizeof b, 0, true, "header for 100 bytes, 50 sent, then EOF");
}

static int case_trunc_with_fds(void)
{
    unsigned char b[8 + 10];
    hdr(b, 100, 3);
    memset(b + 8, 0, 10);
    return broken(b, sizeof b, 3, true, "header for 100 bytes and 3 fds, 10 bytes and the fds sent, then EOF");
}

static int case_len_over_cap(void)
{
    unsigned char h[8];
    hdr(h, HW_FRAME_MAX + 1, 0);
    return broken(h, 8, 0, false, "length HW_FRAME_MAX + 1");
}

static int case_len_max(void)
{
    unsigned char b[8 + 64];
    hdr(b, UINT32_MAX, 0);
    memset(b + 8, 0xff, 64);
    return broken(b, sizeof b, 0, false, "length 0xffffffff");
}

static int case_nfds_over_cap(void)
{
    unsigned char h[8 + 4];
    hdr(h, 4, HW_FDS_MAX + 1);
    memset(h + 8, 0, 4);
    return broken(h, sizeof h, 5, false, "fd count HW_FDS_MAX + 1 in the header (5 fds sent)");
}

static int case_fds_undeclared(void)
{
    /* A valid Hello frame whose header says 0 fds, sent with 3 fds. */
    Heapd__Hello hm = HEAPD__HELLO__INIT;
    hm.version = 1;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 1;
    f.body_case = HEAPD__FRAME__BODY_HELLO;
    f.hello = &hm;
    unsigned char b[64];
    size_t n = heapd__frame__pack(&f, b + 8);
    hdr(b, (uint32_t)n, 0);
    return broken(b, 8 + n, 3, false, "3 fds on a frame whose header announces 0");
}

static int case_fds_missing(void)
{
    unsigned char b[8 + 2];
    hdr(b, 2, 4);
    b[8] = 0x08; /* id = 1 */
    b[9] = 0x01;
    return broken(b, sizeof b, 1, false, "header announces 4 fds, 1 sent with the frame");
}

static int case_fds_no_frame(void)
{
    /* A complete Hello, then one more byte carrying fds (a header cut short). */
    rconn c;
    probe p = {-1, -1};
    int fds[2];
    int rc = -1;
    if (open_hello(&c))
        return -1;
    if (make_fds(fds, 2, &p))
        goto out;
    unsigned char one = 0;
    if (send_raw(c.fd, &one, 1, fds, 2) && errno != EPIPE && errno != ECONNRESET) {
        fail("sendmsg: %s", strerror(errno));
    } else {
        shutdown(c.fd, SHUT_WR);
        rc = expect_closed(&c, false, "2 fds on the first byte of a header, then EOF");
    }
    close_rest(fds, 2);
    if (probe_check(&p, "fds on a cut header"))
        rc = -1;
out:
    probe_abandon(&p);
    rc_close(&c);
    return rc;
}

/* ---- cases: error replies, connection kept -------------------------------------- */

static int case_garbage(void)
{
    static const struct {
        const char *bytes;
        size_t len;
        const char *what;
    } g[] = {
        {"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11, "an over-long varint"},
        {"\x52\x10\x08\x01", 4, "a submessage longer than the frame"},
        {"\x52\x02\x08", 3, "a submessage cut inside a varint"},
        {"\x0f", 1, "wire type 7"},
        {"\x08", 1, "a tag without its value"},
        {"\x52\x03\x08\x01\x08", 5, "Hello whose last field is cut"},
        {"\x00\x00", 2, "field number 0"},
        {"\x0a\x01x", 3, "id with the wrong wire type"},
    };
    rconn c;
    if (rc_open(&c))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < sizeof g / sizeof g[0] && rc == 0; i++) {
        char what[128];
        snprintf(what, sizeof what, "invalid protobuf (%s)", g[i].what);
        Heapd__Frame *local = heapd__frame__unpack(NULL, g[i].len, (const uint8_t *)g[i].bytes);
        if (local) {
            heapd__frame__free_unpacked(local, NULL);
            rc = fail("test bug: %s decodes with this protobuf-c", what);
            break;
        }
        if (send_payload(&c, g[i].bytes, g[i].len, NULL, 0) ||
            expect_error_id(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, 0, what))
            rc = -1;
    }
    if (rc == 0 && hello(&c))
        rc = -1;
    if (rc == 0)
        rc = still_works(&c, "invalid protobuf");
    rc_close(&c);
    return rc;
}

static int case_empty_frame(void)
{
    rconn c;
    if (rc_open(&c))
        return -1;
    int rc = -1;
    if (send_payload(&c, "", 0, NULL, 0) ||
        expect_error_id(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, 0, "an empty frame before Hello"))
        goto out;
    if (hello(&c))
        goto out;
    if (send_payload(&c, "", 0, NULL, 0) ||
        expect_error_id(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, 0, "an empty frame after Hello"))
        goto out;
    rc = still_works(&c, "empty frames");
out:
    rc_close(&c);
    return rc;
}

static int case_unknown_type(void)
{
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    /* id 7 and field 99 (a body heapd does not know), field 60 as a
     * submessage, and a huge field number. */
    static const unsigned char m1[] = {0x08, 0x07, 0x9a, 0x06, 0x02, 0x08, 0x01};
    static const unsigned char m2[] = {0x08, 0x07, 0xe2, 0x03, 0x00};
    static const unsigned char m3[] = {0x08, 0x07, 0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01};
    const unsigned char *m[] = {m1, m2, m3};
    size_t ml[] = {sizeof m1, sizeof m2, sizeof m3};
    for (int i = 0; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "unknown message type #%d", i + 1);
        if (send_payload(&c, m[i], ml[i], NULL, 0) || expect_error_id(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, 7, what))
            goto out;
    }
    rc = still_works(&c, "unknown message types");
out:
    rc_close(&c);
    return rc;
}

static int case_reply_bodies(void)
{
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    Heapd__HelloReply hr = HEAPD__HELLO_REPLY__INIT;
    Heapd__AttachReply ar = HEAPD__ATTACH_REPLY__INIT;
    Heapd__AllocReply alr = HEAPD__ALLOC_REPLY__INIT;
    Heapd__FreeReply fr = HEAPD__FREE_REPLY__INIT;
    Heapd__CollectReply cr = HEAPD__COLLECT_REPLY__INIT;
    Heapd__StatsReply sr = HEAPD__STATS_REPLY__INIT;
    Heapd__ForceCollectReply fcr = HEAPD__FORCE_COLLECT_REPLY__INIT;
    Heapd__DetachReply dr = HEAPD__DETACH_REPLY__INIT;
    Heapd__CommitReply cmr = HEAPD__COMMIT_REPLY__INIT;
    Heapd__LiveBatch lb = HEAPD__LIVE_BATCH__INIT;
    Heapd__Error er = HEAPD__ERROR__INIT;
    alr.offset = 4096;
    alr.collect_needed = 1;
    er.code = HEAPD__ERR_CODE__ERR_SHUTDOWN;
    er.message = (char *)"not a request";
    struct {
        int bc;
        void *m;
    } b[] = {
        {HEAPD__FRAME__BODY_HELLO_REPLY, &hr},
        {HEAPD__FRAME__BODY_ATTACH_REPLY, &ar},
        {HEAPD__FRAME__BODY_ALLOC_REPLY, &alr},
        {HEAPD__FRAME__BODY_FREE_REPLY, &fr},
        {HEAPD__FRAME__BODY_COLLECT_REPLY, &cr},
        {HEAPD__FRAME__BODY_STATS_REPLY, &sr},
        {HEAPD__FRAME__BODY_FORCE_COLLECT_REPLY, &fcr},
        {HEAPD__FRAME__BODY_DETACH_REPLY, &dr},
        {HEAPD__FRAME__BODY_COMMIT_REPLY, &cmr},
        {HEAPD__FRAME__BODY_LIVE_BATCH, &lb},
        {HEAPD__FRAME__BODY_ERROR, &er},
    };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        Heapd__Frame f = HEAPD__FRAME__INIT;
        f.body_case = b[i].bc;
        /* every body pointer shares the union */
        f.hello_reply = b[i].m;
        char what[96];
        snprintf(what, sizeof what, "%s sent as a request", bodyname(b[i].bc));
        if (send_frame(&c, &f, NULL, 0) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, what))
            goto out;
    }
    rc = still_works(&c, "reply bodies sent as requests");
out:
    rc_close(&c);
    return rc;
}

static int case_before_hello(void)
{
    rconn c;
    if (rc_open(&c))
        return -1;
    int rc = -1;
    uint64_t off = 0;
    if (send_attach(&c, "raw-before-hello", 0, 1, &own) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Attach before Hello"))
        goto out;
    if (send_alloc(&c, 0, 4096) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Alloc before Hello"))
        goto out;
    if (send_free(&c, &off, 1) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Free before Hello"))
        goto out;
    if (send_collect(&c, 0) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Collect before Hello"))
        goto out;
    if (send_stats(&c, "") || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Stats before Hello"))
        goto out;
    if (send_force(&c, victim_heap ? victim_heap : "x") ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "ForceCollect before Hello"))
        goto out;
    if (send_detach(&c) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Detach before Hello"))
        goto out;
    if (send_commit(&c, "step", 1, 0) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Commit before Hello"))
        goto out;
    if (hello(&c))
        goto out;
    rc = still_works(&c, "requests before Hello");
out:
    rc_close(&c);
    return rc;
}

static int case_bad_version(void)
{
    static const uint32_t v[] = {0, 2, UINT32_MAX};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        rconn c;
        char what[96];
        if (rc_open(&c))
            return -1;
        snprintf(what, sizeof what, "Hello version %" PRIu32, v[i]);
        int rc = send_hello(&c, v[i]);
        if (!rc)
            rc = expect_error(&c, HEAPD__ERR_CODE__ERR_VERSION, what);
        if (!rc) {
            char w2[256];
            snprintf(w2, sizeof w2, "%s: the connection is closed after ERR_VERSION", what);
            rc = expect_closed(&c, false, w2);
        }
        rc_close(&c);
        if (rc)
            return -1;
    }
    return 0;
}

static int case_double_hello(void)
{
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    if (send_hello(&c, 1) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "a second Hello"))
        goto out;
    rc = still_works(&c, "a second Hello");
out:
    rc_close(&c);
    return rc;
}

static int case_fds_on_request(void)
{
    /* Valid requests (Hello; then Stats) with memfds and a probe attached,
     * the header announcing them: ERR_PROTOCOL, every fd closed. */
    rconn c;
    probe p = {-1, -1};
    int fds[4];
    int rc = -1;
    if (rc_open(&c))
        return -1;
    if (make_fds(fds, 4, &p))
        goto out;
    Heapd__Hello hm = HEAPD__HELLO__INIT;
    hm.version = 1;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_HELLO;
    f.hello = &hm;
    if (send_frame(&c, &f, fds, 4) == 0 &&
        expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Hello with 4 fds (3 memfds, a pipe)") == 0)
        rc = 0;
    close_rest(fds, 4);
    if (probe_check(&p, "fds attached to Hello"))
        rc = -1;
    if (rc)
        goto out;
    rc = -1;
    if (hello(&c)) /* the Hello with fds was refused: this is the first */
        goto out;
    if (make_fds(fds, 3, &p))
        goto out;
    Heapd__Stats sm = HEAPD__STATS__INIT;
    sm.heap = (char *)"";
    Heapd__Frame g = HEAPD__FRAME__INIT;
    g.body_case = HEAPD__FRAME__BODY_STATS;
    g.stats = &sm;
    if (send_frame(&c, &g, fds, 3) == 0 && expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Stats with 3 fds") == 0)
        rc = 0;
    close_rest(fds, 3);
    if (probe_check(&p, "fds attached to Stats"))
        rc = -1;
    if (rc == 0)
        rc = still_works(&c, "requests with fds");
out:
    probe_abandon(&p);
    rc_close(&c);
    return rc;
}

static int many_fds(size_t n, bool garbage)
{
    rconn c;
    probe p = {-1, -1};
    int *fds = calloc(n, sizeof *fds);
    int rc = -1;
    char what[128];
    snprintf(what, sizeof what, "%s with %zu fds (the header announcing them)", garbage ? "invalid protobuf" : "Stats",
             n);
    if (!fds)
        return fail("out of memory");
    if (open_hello(&c)) {
        free(fds);
        return -1;
    }
    if (make_fds(fds, n, &p))
        goto out;
    if (garbage) {
        rc = send_payload(&c, "\xff\xff\xff", 3, fds, n);
        if (!rc)
            rc = expect_error_id(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, 0, what);
    } else {
        Heapd__Stats sm = HEAPD__STATS__INIT;
        sm.heap = (char *)"";
        Heapd__Frame g = HEAPD__FRAME__INIT;
        g.body_case = HEAPD__FRAME__BODY_STATS;
        g.stats = &sm;
        rc = send_frame(&c, &g, fds, n);
        if (!rc)
            rc = expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, what);
    }
    close_rest(fds, n);
    if (probe_check(&p, what))
        rc = -1;
    if (!rc)
        rc = still_works(&c, what);
out:
    probe_abandon(&p);
    rc_close(&c);
    free(fds);
    return rc;
}

static int case_fds_max(void) { return many_fds(HW_FDS_MAX, false); }
static int case_fds_253(void) { return many_fds(253, true); }

static int case_fds_over_cap_real(void)
{
    /* 1100 fds really sent (5 sendmsg calls of 220) on a frame whose header
     * announces them: over HW_FDS_MAX, the connection is closed. */
    enum { N = 1100, PER = 220 };
    rconn c;
    probe p = {-1, -1};
    int *fds = calloc(N, sizeof *fds);
    int rc = -1;
    if (!fds)
        return fail("out of memory");
    if (rc_open(&c)) {
        free(fds);
        return -1;
    }
    if (make_fds(fds, N, &p))
        goto out;
    unsigned char b[8 + 8];
    hdr(b, 8, N);
    memset(b + 8, 0, 8);
    int sent = 0;
    for (int k = 0; k < N / PER; k++) {
        if (send_raw(c.fd, b + 3 * k, k == N / PER - 1 ? sizeof b - 3 * k : 3, fds + k * PER, PER)) {
            if (errno != EPIPE && errno != ECONNRESET) {
                fail("sendmsg: %s", strerror(errno));
                sent = -1;
            }
            break;
        }
    }
    if (sent == 0)
        rc = expect_closed(&c, false, "1100 fds really sent with a frame announcing them");
    close_rest(fds, N);
    if (probe_check(&p, "1100 fds"))
        rc = -1;
out:
    probe_abandon(&p);
    rc_close(&c);
    free(fds);
    return rc;
}

static int case_not_attached(void)
{
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t off = 0;
    if (send_alloc(&c, 0, 4096) || expect_error(&c, HEAPD__ERR_CODE__ERR_STATE, "Alloc without Attach"))
        goto out;
    if (send_free(&c, &off, 1) || expect_error(&c, HEAPD__ERR_CODE__ERR_STATE, "Free without Attach"))
        goto out;
    if (send_collect(&c, 0) || expect_error(&c, HEAPD__ERR_CODE__ERR_STATE, "Collect without Attach"))
        goto out;
    if (send_detach(&c) || expect_error(&c, HEAPD__ERR_CODE__ERR_STATE, "Detach without Attach"))
        goto out;
    if (send_commit(&c, "step", 1, 0) || expect_error(&c, HEAPD__ERR_CODE__ERR_STATE, "Commit without Attach"))
        goto out;
    rc = still_works(&c, "requests without Attach");
out:
    rc_close(&c);
    return rc;
}

static int case_attach_invalid(void)
{
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    char name[64], *longname = NULL;
    heap_name(name, sizeof name, "inv");
    struct {
        uint32_t rank, world;
        aparams p;
        const char *what;
    } t[] = {
        {1, 1, own, "rank 1 of world_size 1"},
        {7, 4, own, "rank 7 of world_size 4"},
        {UINT32_MAX, 2, own, "rank 2^32-1"},
        {0, 0, own, "world_size 0"},
        {0, 4097, own, "world_size 4097"},
        {0, UINT32_MAX, own, "world_size 2^32-1"},
        {0, 1, {64 << 10, 64 << 10, 1 << 20, 3, 0, 0}, "min_block 3"},
        {0, 1, {1000, 0, 0, 8, 0, 0}, "chunk_size 1000 (not a page multiple)"},
        {0, 1, {64 << 10, 128 << 10, 64 << 10, 512, 0, 0}, "va_size < initial_size"},
        {0, 1, {64 << 10, 100 << 10, 1 << 20, 512, 0, 0}, "initial_size not a multiple of chunk_size"},
        {0, 1, {64 << 10, 64 << 10, (uint64_t)1 << 60, 512, 0, 0}, "va_size 2^60"},
        {0, 1, {64 << 10, 64 << 10, 1 << 20, (uint64_t)1 << 40, 0, 0}, "min_block larger than chunk_size"},
        {0, 1, {UINT64_MAX, 0, 0, 0, 0, 0}, "chunk_size 2^64-1"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (send_attach(&c, name, t[i].rank, t[i].world, &t[i].p) ||
            expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, t[i].what))
            goto out;
    }
    if (send_attach(&c, "", 0, 1, &own) || expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "an empty heap name"))
        goto out;
    longname = malloc(1 << 20);
    if (!longname) {
        fail("out of memory");
        goto out;
    }
    memset(longname, 'n', (1 << 20) - 1);
    longname[(1 << 20) - 1] = 0;
    if (send_attach(&c, longname, 0, 1, &own) || expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "a heap name of 1 MiB"))
        goto out;
    longname[256] = 0;
    if (send_attach(&c, longname, 0, 1, &own) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "a heap name of 256 bytes"))
        goto out;
    rc = still_works(&c, "invalid attaches");
    /* Nothing was created. */
    if (!rc && (send_stats(&c, name) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_FOUND, "Stats of the refused heap")))
        rc = -1;
out:
    free(longname);
    rc_close(&c);
    return rc;
}

static int case_attach_victim(void)
{
    /* Attaches to the heap another client uses: with other parameters, and
     * as a rank that is taken. The victim must not notice. */
    if (!victim_heap)
        return fail("--victim is required for this case");
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    aparams p = {victim_chunk, 0, 0, 0, 0, 0};
    if (send_attach(&c, victim_heap, 0, victim_world + 1, &p) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_MISMATCH, "Attach to the victim heap with another world_size"))
        goto out;
    p.chunk = victim_chunk * 2;
    if (send_attach(&c, victim_heap, 0, victim_world, &p) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_MISMATCH, "Attach to the victim heap with another chunk_size"))
        goto out;
    p.chunk = victim_chunk;
    p.min_block = 1 << 20;
    if (send_attach(&c, victim_heap, 0, victim_world, &p) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_MISMATCH, "Attach to the victim heap with another min_block"))
        goto out;
    p.min_block = 0;
    p.policy = HEAPD__POLICY__POLICY_SEED;
    if (send_attach(&c, victim_heap, 0, victim_world, &p) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_MISMATCH, "Attach to the victim heap with another policy"))
        goto out;
    p.policy = 0;
    if (send_attach(&c, victim_heap, 0, victim_world, &p) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_STATE, "Attach to the victim heap as its rank 0 (taken)"))
        goto out;
    if (send_attach(&c, victim_heap, victim_world, victim_world, &p) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "Attach to the victim heap as rank world_size"))
        goto out;
    rc = still_works(&c, "attaches to the victim heap");
out:
    rc_close(&c);
    return rc;
}

static int case_attach_twice(void)
{
    rconn c;
    char name[64], other[64];
    heap_name(name, sizeof name, "twice");
    heap_name(other, sizeof other, "twice-other");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    if (attach1(&c, name))
        goto out;
    if (send_attach(&c, other, 0, 1, &own) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_STATE, "a second Attach on an attached connection"))
        goto out;
    if (send_detach(&c) || expect_body(&c, HEAPD__FRAME__BODY_DETACH_REPLY, "Detach", NULL))
        goto out;
    if (send_detach(&c) || expect_error(&c, HEAPD__ERR_CODE__ERR_STATE, "a second Detach"))
        goto out;
    /* The heap was destroyed with its last client: the name is free again. */
    if (send_stats(&c, name) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_FOUND, "Stats of the detached heap"))
        goto out;
    rc = still_works(&c, "attach twice, detach twice");
out:
    rc_close(&c);
    return rc;
}

/* ---- issue 15: names, jobs, policies, heap bounds, attach retry ---------------- */

static int send_attach_job(rconn *c, const char *heap, uint32_t rank, uint32_t world, const aparams *p, const char *job)
{
    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    Heapd__Attach a = HEAPD__ATTACH__INIT;
    a.heap = (char *)heap;
    a.rank = rank;
    a.world_size = world;
    a.device_uuid = (char *)"";
    a.job = (char *)job;
    if (p) {
        hp.chunk_size = p->chunk;
        hp.initial_size = p->initial;
        hp.va_size = p->va;
        hp.min_block = p->min_block;
        hp.collect_timeout_ms = p->timeout_ms;
        hp.policy = p->policy;
        a.params = &hp;
    }
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_ATTACH;
    f.attach = &a;
    return send_frame(c, &f, NULL, 0);
}

/* The next reply must be Error `code` for the last request, its message
 * containing `part` (the limit or key it names). */
static int expect_error_msg(rconn *c, int code, const char *part, const char *what)
{
    reply r;
    get_reply(c, REPLY_MS, &r);
    int ok = r.kind == R_FRAME && r.f->body_case == HEAPD__FRAME__BODY_ERROR && (int)r.f->error->code == code &&
             r.f->id == c->last_id && r.f->error->message && strstr(r.f->error->message, part);
    if (!ok)
        fail("%s: expected Error %s naming \"%s\", got %s", what, errname(code), part, r.desc);
    reply_free(&r);
    return ok ? 0 : -1;
}

/* Sends an Attach whose heap name is `name` with its '|' bytes made NUL on
 * the wire (protobuf-c would cut the string at the NUL). */
static int send_attach_nul(rconn *c, const char *name)
{
    Heapd__Attach a = HEAPD__ATTACH__INIT;
    a.heap = (char *)name;
    a.world_size = 1;
    a.device_uuid = (char *)"";
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_ATTACH;
    f.attach = &a;
    f.id = ++c->next_id;
    c->last_id = f.id;
    uint8_t buf[512];
    size_t len = heapd__frame__get_packed_size(&f);
    if (len > sizeof buf)
        return fail("frame too large");
    heapd__frame__pack(&f, buf);
    uint8_t *p = memmem(buf, len, name, strlen(name));
    if (!p)
        return fail("the name is not in the packed frame");
    for (size_t i = 0; i < strlen(name); i++)
        if (p[i] == '|')
            p[i] = 0;
    return send_payload(c, buf, len, NULL, 0);
}

static int case_attach_text(void)
{
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    char name[64], bad[96], job[200];
    heap_name(name, sizeof name, "text");
    static const char *const bad_tails[] = {"\xff\xfe", "\xc2\x85", "\x7f", "\xe2\x82", "\xc0\xaf", "\xed\xa0\x80"};
    static const char *const what[] = {"invalid UTF-8 (0xff)", "a C1 control (U+0085)", "DEL",
                                       "a cut UTF-8 sequence", "an overlong '/'",       "a surrogate"};
    for (size_t i = 0; i < sizeof bad_tails / sizeof bad_tails[0]; i++) {
        snprintf(bad, sizeof bad, "%s%s", name, bad_tails[i]);
        char w[128];
        snprintf(w, sizeof w, "a heap name with %s", what[i]);
        if (send_attach(&c, bad, 0, 1, &own) || expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, w))
            goto out;
        snprintf(w, sizeof w, "a job with %s", what[i]);
        if (send_attach_job(&c, name, 0, 1, &own, bad_tails[i]) || expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, w))
            goto out;
    }
    snprintf(bad, sizeof bad, "%s|x", name);
    if (send_attach_nul(&c, bad) || expect_error_msg(&c, HEAPD__ERR_CODE__ERR_INVALID, "NUL", "a heap name with a NUL"))
        goto out;
    /* Jobs: 128 bytes refused naming the limit (not cut to 127), 127 taken. */
    memset(job, 'j', 128);
    job[128] = 0;
    if (send_attach_job(&c, name, 0, 1, &own, job) ||
        expect_error_msg(&c, HEAPD__ERR_CODE__ERR_INVALID, "over the limit of 127", "a job of 128 bytes"))
        goto out;
    job[127] = 0;
    if (send_attach_job(&c, name, 0, 1, &own, job) || attach_reply(&c, "a job of 127 bytes"))
        goto out;
    if (send_detach(&c) || expect_body(&c, HEAPD__FRAME__BODY_DETACH_REPLY, "Detach", NULL))
        goto out;
    /* UTF-8 text is fine. */
    snprintf(bad, sizeof bad, "%s-\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", name);
    if (send_attach_job(&c, bad, 0, 1, &own, "r\xc3\xa9sum\xc3\xa9") || attach_reply(&c, "a UTF-8 name and job"))
        goto out;
    if (send_detach(&c) || expect_body(&c, HEAPD__FRAME__BODY_DETACH_REPLY, "Detach", NULL))
        goto out;
    rc = still_works(&c, "bad names and jobs");
    if (!rc && (send_stats(&c, name) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_FOUND, "Stats of the refused heap")))
        rc = -1;
out:
    rc_close(&c);
    return rc;
}

static int case_attach_policy(void)
{
    rconn c, d;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    bool dopen = false;
    char name[64];
    heap_name(name, sizeof name, "policy");
    aparams p = own;
    p.policy = 7;
    if (send_attach(&c, name, 0, 1, &p) ||
        expect_error_msg(&c, HEAPD__ERR_CODE__ERR_INVALID, "policy 7 is unknown", "policy 7 on a new heap"))
        goto out;
    /* ... and on an existing heap (it used to count as coalesce there). */
    if (send_attach(&c, name, 0, 2, &own) || open_hello(&d))
        goto out;
    dopen = true;
    p.policy = -1;
    if (send_attach(&d, name, 1, 2, &p) ||
        expect_error_msg(&d, HEAPD__ERR_CODE__ERR_INVALID, "is unknown", "policy -1 on an existing heap"))
        goto out;
    if (send_attach(&d, name, 1, 2, &own) || attach_reply(&c, "rank 0") || attach_reply(&d, "rank 1"))
        goto out;
    rc = still_works(&c, "unknown policies");
out:
    if (dopen)
        rc_close(&d);
    rc_close(&c);
    return rc;
}

static int case_attach_bounds(void)
{
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    char name[64];
    heap_name(name, sizeof name, "bounds");
    /* 2^32 chunks of 4 KiB: the chunk count used to be cut to 0 (16 TiB
     * "mapped" without one chunk). */
    aparams p = {4096, UINT64_C(16) << 40, UINT64_C(16) << 40, 512, 0, 0};
    if (send_attach(&c, name, 0, 1, &p) ||
        expect_error_msg(&c, HEAPD__ERR_CODE__ERR_INVALID, "max_chunks", "16 TiB of 4 KiB chunks"))
        goto out;
    /* min_block 1 over 1 GiB: 2^30 bitmap positions (seconds and ~300 MB). */
    aparams q = {64 << 20, 1 << 30, 1 << 30, 1, 0, 0};
    if (send_attach(&c, name, 0, 1, &q) ||
        expect_error_msg(&c, HEAPD__ERR_CODE__ERR_INVALID, "max_blocks", "min_block 1 over 1 GiB"))
        goto out;
    rc = still_works(&c, "heaps over the bounds");
    if (!rc && (send_stats(&c, name) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_FOUND, "Stats of the refused heap")))
        rc = -1;
out:
    rc_close(&c);
    return rc;
}

/* An Attach that timed out can be retried, on the same connection or on a
 * new one while the first stays open. */
static int case_attach_retry(void)
{
    rconn c[4];
    int nopen = 0, rc = -1;
    char name[64];
    heap_name(name, sizeof name, "retry");
    aparams quick = own, slow = own;
    quick.timeout_ms = 100;
    slow.timeout_ms = 20000;
    for (; nopen < 4; nopen++)
        if (open_hello(&c[nopen]))
            goto out;
    if (send_attach(&c[0], name, 0, 2, &quick) ||
        expect_error(&c[0], HEAPD__ERR_CODE__ERR_TIMEOUT, "rank 0 alone (100 ms timeout)"))
        goto out;
    if (send_attach(&c[0], name, 0, 2, &slow) || send_attach(&c[1], name, 1, 2, &slow) ||
        attach_reply(&c[0], "rank 0's retry on the same connection") || attach_reply(&c[1], "rank 1"))
        goto out;
    heap_name(name, sizeof name, "retry");
    if (send_attach(&c[2], name, 0, 2, &quick) ||
        expect_error(&c[2], HEAPD__ERR_CODE__ERR_TIMEOUT, "rank 0 alone again (100 ms timeout)"))
        goto out;
    if (send_attach(&c[3], name, 0, 2, &slow) || send_attach(&c[1], name, 1, 2, &slow))
        goto out;
    /* c[1] is attached to the first heap: ERR_STATE; use c[2] for rank 1. */
    if (expect_error(&c[1], HEAPD__ERR_CODE__ERR_STATE, "rank 1's connection is attached elsewhere") ||
        send_attach(&c[2], name, 1, 2, &slow) || attach_reply(&c[3], "rank 0's retry on a new connection") ||
        attach_reply(&c[2], "rank 1 (new heap)"))
        goto out;
    rc = still_works(&c[3], "attach retries");
out:
    while (nopen > 0)
        rc_close(&c[--nopen]);
    return rc;
}

static int case_alloc_bad(void)
{
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "alloc");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t off;
    if (attach1(&c, name))
        goto out;
    if (send_alloc(&c, 0, 0) || expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "Alloc of 0 bytes"))
        goto out;
    if (send_alloc(&c, 0, own.va + 1) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_VA_EXHAUSTED, "Alloc of va_size + 1 bytes"))
        goto out;
    if (send_alloc(&c, 0, UINT64_MAX) || expect_error(&c, HEAPD__ERR_CODE__ERR_VA_EXHAUSTED, "Alloc of 2^64-1 bytes"))
        goto out;
    if (send_alloc(&c, 1, 4096) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Alloc with seq 1 at seq 0"))
        goto out;
    if (send_alloc(&c, UINT64_MAX, 4096) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Alloc with seq 2^64-1 at seq 0"))
        goto out;
    /* None of that moved the allocation number: allocation 0 works. */
    if (alloc1(&c, 0, own.va, &off))
        goto out;
    /* The heap is full: va_size exhausted (after the collect heapd asks for). */
    if (alloc1_error(&c, 1, 512, HEAPD__ERR_CODE__ERR_VA_EXHAUSTED, "Alloc in a full heap"))
        goto out;
    rc = still_works(&c, "bad allocations");
out:
    rc_close(&c);
    return rc;
}

/* Issue 29: bad allocation names and commits. */
static int case_names_bad(void)
{
    rconn c;
    char name[64], big[300];
    heap_name(name, sizeof name, "names");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t off;
    memset(big, 'n', 256);
    big[256] = 0;
    if (attach1(&c, name))
        goto out;
    if (send_alloc_named(&c, 0, 4096, big, 256) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "Alloc with a 256-byte name"))
        goto out;
    if (send_alloc_named(&c, 0, 4096, "a\x01", 2) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "Alloc with a control character in its name"))
        goto out;
    if (send_alloc_named(&c, 0, 4096, "\xc0\xaf", 2) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "Alloc with an invalid UTF-8 name"))
        goto out;
    if (send_alloc_named(&c, 0, 4096, "a\0b", 3) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "Alloc with a NUL in its name"))
        goto out;
    if (send_commit(&c, "", 1, 0) || expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "Commit with an empty tag"))
        goto out;
    if (send_commit(&c, big, 1, 0) || expect_error(&c, HEAPD__ERR_CODE__ERR_INVALID, "Commit with a 256-byte tag"))
        goto out;
    if (send_commit(&c, "step", 1, 5) || expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Commit at seq 5 at seq 0"))
        goto out;
    /* None of that moved the allocation number: allocation 0 works. */
    if (alloc1(&c, 0, 4096, &off))
        goto out;
    if (send_commit(&c, "step", 1, 1) || expect_body(&c, HEAPD__FRAME__BODY_COMMIT_REPLY, "Commit at seq 1", NULL))
        goto out;
    rc = still_works(&c, "bad names and commits");
out:
    rc_close(&c);
    return rc;
}

static int case_alloc_with_fds(void)
{
    rconn c;
    probe p = {-1, -1};
    int fds[2];
    char name[64];
    heap_name(name, sizeof name, "allocfd");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t off;
    if (attach1(&c, name))
        goto out;
    if (make_fds(fds, 2, &p))
        goto out;
    Heapd__Alloc a = HEAPD__ALLOC__INIT;
    a.seq = 0;
    a.size = 4096;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_ALLOC;
    f.alloc = &a;
    rc = send_frame(&c, &f, fds, 2);
    if (!rc)
        rc = expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "Alloc with 2 fds attached");
    close_rest(fds, 2);
    if (probe_check(&p, "fds attached to Alloc"))
        rc = -1;
    if (!rc)
        rc = alloc1(&c, 0, 4096, &off); /* the refused Alloc did not count */
out:
    probe_abandon(&p);
    rc_close(&c);
    return rc;
}

static int case_free_bad(void)
{
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "free");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t a, b, o[4];
    if (attach1(&c, name) || alloc1(&c, 0, 4096, &a) || alloc1(&c, 1, 4096, &b))
        goto out;
    o[0] = 12345;
    if (send_free(&c, o, 1) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "Free of an unknown offset"))
        goto out;
    o[0] = a + 1;
    if (send_free(&c, o, 1) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "Free inside a block"))
        goto out;
    o[0] = UINT64_MAX;
    if (send_free(&c, o, 1) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "Free of offset 2^64-1"))
        goto out;
    o[0] = a;
    o[1] = a;
    if (send_free(&c, o, 2) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "Free of the same offset twice in one batch"))
        goto out;
    o[0] = b;
    o[1] = 777;
    if (send_free(&c, o, 2) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "a Free batch with one bad offset"))
        goto out;
    /* None of those batches freed anything: a and b free now. */
    o[0] = a;
    o[1] = b;
    reply r;
    if (send_free(&c, o, 2) || expect_body(&c, HEAPD__FRAME__BODY_FREE_REPLY, "Free of both blocks", &r))
        goto out;
    uint32_t acc = r.f->free_reply->accepted;
    reply_free(&r);
    if (acc != 2) {
        fail("Free of both blocks: accepted %" PRIu32 ", expected 2", acc);
        goto out;
    }
    o[0] = a;
    if (send_free(&c, o, 1) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "double free"))
        goto out;
    if (send_free(&c, o, 0) || expect_body(&c, HEAPD__FRAME__BODY_FREE_REPLY, "an empty Free", NULL))
        goto out;
    /* After the collect the block is gone from the heap too. */
    if (send_collect(&c, 2) || expect_body(&c, HEAPD__FRAME__BODY_COLLECT_REPLY, "Collect", NULL))
        goto out;
    if (send_free(&c, o, 1) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "free of a reclaimed block"))
        goto out;
    rc = still_works(&c, "bad frees");
out:
    rc_close(&c);
    return rc;
}

static int case_free_huge(void)
{
    /* A Free of 500000 offsets (4 MiB frame): all unknown, then all the same
     * held offset. */
    enum { N = 500000 };
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "freehuge");
    uint64_t *o = malloc(N * sizeof *o);
    if (!o)
        return fail("out of memory");
    if (open_hello(&c)) {
        free(o);
        return -1;
    }
    int rc = -1;
    uint64_t a;
    if (attach1(&c, name) || alloc1(&c, 0, 4096, &a))
        goto out;
    for (size_t i = 0; i < N; i++)
        o[i] = a + 1 + i;
    if (send_free(&c, o, N) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "Free of 500000 unknown offsets"))
        goto out;
    for (size_t i = 0; i < N; i++)
        o[i] = a;
    if (send_free(&c, o, N) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_HELD, "Free of one offset 500000 times in a batch"))
        goto out;
    rc = still_works(&c, "huge Free batches");
out:
    free(o);
    rc_close(&c);
    return rc;
}

static int case_free_foreign(void)
{
    /* Heap A has two ranks (two connections); heap B one. */
    rconn r0, r1, b0;
    char na[64], nb[64];
    heap_name(na, sizeof na, "fa");
    heap_name(nb, sizeof nb, "fb");
    int rc = -1;
    r0.fd = r1.fd = b0.fd = -1;
    memset(&r0.rd, 0, sizeof r0.rd);
    memset(&r1.rd, 0, sizeof r1.rd);
    memset(&b0.rd, 0, sizeof b0.rd);
    if (open_hello(&r0) || open_hello(&r1) || open_hello(&b0))
        goto out;
    if (send_attach(&r0, na, 0, 2, &own) || send_attach(&r1, na, 1, 2, &own) ||
        attach_reply(&r0, "Attach rank 0 of 2") || attach_reply(&r1, "Attach rank 1 of 2"))
        goto out;
    if (attach1(&b0, nb))
        goto out;
    uint64_t x0, x1, y[3], o;
    if (alloc1(&r0, 0, 4096, &x0) || alloc1(&r1, 0, 4096, &x1))
        goto out;
    if (x0 != x1) {
        fail("ranks 0 and 1 got different offsets for allocation 0: %" PRIu64 " and %" PRIu64, x0, x1);
        goto out;
    }
    /* B's allocations: 3 blocks of 16 KiB; offsets that are not blocks of A. */
    for (int i = 0; i < 3; i++)
        if (alloc1(&b0, (uint64_t)i, 16384, &y[i]))
            goto out;
    o = x0;
    if (send_free(&r0, &o, 1) || expect_body(&r0, HEAPD__FRAME__BODY_FREE_REPLY, "rank 0 frees its block", NULL))
        goto out;
    if (send_free(&r0, &o, 1) ||
        expect_error(&r0, HEAPD__ERR_CODE__ERR_NOT_HELD, "rank 0 frees again a block that rank 1 still holds"))
        goto out;
    for (int i = 0; i < 3; i++) {
        if (y[i] == x0)
            continue;
        o = y[i];
        if (send_free(&r1, &o, 1) ||
            expect_error(&r1, HEAPD__ERR_CODE__ERR_NOT_HELD, "rank 1 of heap A frees an offset of heap B"))
            goto out;
        if (send_free(&r0, &o, 1) ||
            expect_error(&r0, HEAPD__ERR_CODE__ERR_NOT_HELD, "rank 0 of heap A frees an offset of heap B"))
            goto out;
    }
    o = x0;
    if (send_free(&r1, &o, 1) || expect_body(&r1, HEAPD__FRAME__BODY_FREE_REPLY, "rank 1 frees the block", NULL))
        goto out;
    /* Heap B's blocks are untouched: B frees them fine. */
    if (send_free(&b0, y, 3) || expect_body(&b0, HEAPD__FRAME__BODY_FREE_REPLY, "heap B frees its blocks", NULL))
        goto out;
    /* Collect on A: both ranks; wrong seq first, then a second collect
     * while waiting, then an asymmetric one. */
    if (send_collect(&r0, 5) ||
        expect_error(&r0, HEAPD__ERR_CODE__ERR_PROTOCOL, "Collect at seq 5 when the rank is at 1"))
        goto out;
    if (send_collect(&r0, 1))
        goto out;
    uint64_t first = r0.last_id;
    if (send_collect(&r0, 1) ||
        expect_error(&r0, HEAPD__ERR_CODE__ERR_PROTOCOL, "a second Collect while waiting in one"))
        goto out;
    if (send_collect(&r1, 1) || expect_body(&r1, HEAPD__FRAME__BODY_COLLECT_REPLY, "Collect of rank 1", NULL))
        goto out;
    r0.last_id = first;
    if (expect_body(&r0, HEAPD__FRAME__BODY_COLLECT_REPLY, "Collect of rank 0", NULL))
        goto out;
    uint64_t z;
    if (alloc1(&r0, 1, 512, &z))
        goto out;
    if (send_collect(&r0, 2))
        goto out;
    first = r0.last_id;
    if (send_collect(&r1, 1) ||
        expect_error(&r1, HEAPD__ERR_CODE__ERR_ASYMMETRY, "Collect at seq 1 while rank 0 waits at seq 2"))
        goto out;
    r0.last_id = first;
    if (expect_error(&r0, HEAPD__ERR_CODE__ERR_ASYMMETRY, "the waiting rank 0 learns of the asymmetric collect"))
        goto out;
    rc = still_works(&r0, "foreign frees");
    if (!rc)
        rc = still_works(&r1, "foreign frees");
    if (!rc)
        rc = still_works(&b0, "foreign frees");
out:
    rc_close(&r0);
    rc_close(&r1);
    rc_close(&b0);
    return rc;
}

static int case_unknown_heap(void)
{
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    char name[64];
    heap_name(name, sizeof name, "nosuch");
    if (send_stats(&c, name) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_FOUND, "Stats of an unknown heap"))
        goto out;
    if (send_force(&c, name) || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_FOUND, "ForceCollect of an unknown heap"))
        goto out;
    if (send_force(&c, "") || expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_FOUND, "ForceCollect of an empty name"))
        goto out;
    rc = still_works(&c, "unknown heaps");
out:
    rc_close(&c);
    return rc;
}

static int case_big_frame(void)
{
    /* A frame of exactly HW_FRAME_MAX bytes: a Stats whose heap name fills it. */
    rconn c;
    if (open_hello(&c))
        return -1;
    int rc = -1;
    size_t n = HW_FRAME_MAX - 16;
    char *s = malloc(n + 1);
    if (!s) {
        rc_close(&c);
        return fail("out of memory");
    }
    memset(s, 'z', n);
    s[n] = 0;
    Heapd__Stats sm = HEAPD__STATS__INIT;
    sm.heap = s;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_STATS;
    f.stats = &sm;
    f.id = 0;
    /* adjust the name so that the frame is exactly HW_FRAME_MAX bytes */
    size_t len = heapd__frame__get_packed_size(&f);
    if (len > HW_FRAME_MAX) {
        s[n - (len - HW_FRAME_MAX)] = 0;
    }
    if (send_frame(&c, &f, NULL, 0) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_NOT_FOUND, "a Stats frame of 4 MiB (heap name of 4 MiB)"))
        goto out;
    rc = still_works(&c, "a 4 MiB frame");
out:
    free(s);
    rc_close(&c);
    return rc;
}

static int case_partial_heap(void)
{
    /* A heap some of whose ranks never attached is destroyed when its only
     * client hangs up; another connection, opened before, must not notice.
     * Three times, so that fd numbers freed by the first round are reused. */
    for (int i = 0; i < 3; i++) {
        rconn keep, c;
        char name[64];
        heap_name(name, sizeof name, "partial");
        if (open_hello(&keep))
            return -1;
        if (open_hello(&c)) {
            rc_close(&keep);
            return -1;
        }
        int rc = send_attach(&c, name, 0, 4, &own);
        rc_close(&c);
        for (int k = 0; !rc && k < 100; k++) { /* until the heap is gone */
            reply r;
            if (send_stats(&keep, name))
                rc = -1;
            else {
                get_reply(&keep, REPLY_MS, &r);
                bool gone = r.kind == R_FRAME && r.f->body_case == HEAPD__FRAME__BODY_ERROR &&
                            r.f->error->code == HEAPD__ERR_CODE__ERR_NOT_FOUND;
                if (r.kind != R_FRAME)
                    rc = fail("round %d: a connection opened before a 4-rank heap (1 rank attached) was destroyed: "
                              "%s",
                              i + 1, r.desc);
                reply_free(&r);
                if (gone)
                    break;
                usleep(10000);
            }
        }
        if (!rc) {
            char what[96];
            snprintf(what, sizeof what, "round %d: the destroy of a partly attached heap", i + 1);
            rc = still_works(&keep, what);
        }
        rc_close(&keep);
        if (rc)
            return -1;
    }
    return 0;
}

static int case_flood(void)
{
    /* Requests sent without reading a reply: FLOOD_N (default 200000) Stats
     * of ~10 bytes, then the connection stays open FLOOD_HOLD_MS (default
     * 1500) before it closes. heapd may stop reading (the sends block: after
     * 5 s this stops, fine) or close the connection (fine too). Checked from
     * outside: heapd's memory while the replies pile up. */
    rconn c;
    if (open_hello(&c))
        return -1;
    const char *e = getenv("FLOOD_N");
    long n = e ? strtol(e, NULL, 10) : 200000;
    e = getenv("FLOOD_HOLD_MS");
    long hold = e ? strtol(e, NULL, 10) : 1500;
    Heapd__Stats sm = HEAPD__STATS__INIT;
    sm.heap = (char *)"";
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_STATS;
    f.stats = &sm;
    uint8_t buf[64];
    size_t len = heapd__frame__get_packed_size(&f);
    heapd__frame__pack(&f, buf + 8);
    hdr(buf, (uint32_t)len, 0);
    int rc = 0;
    for (long i = 0; i < n; i++) {
        struct pollfd pf = {c.fd, POLLOUT, 0};
        if (poll(&pf, 1, 5000) <= 0) {
            printf("flood: heapd stopped reading after %ld requests\n", i);
            break;
        }
        if (send(c.fd, buf, 8 + len, MSG_NOSIGNAL) < 0) {
            if (errno == EPIPE || errno == ECONNRESET)
                printf("flood: heapd closed the connection after %ld requests\n", i);
            else
                rc = fail("flood: send: %s after %ld requests", strerror(errno), i);
            break;
        }
    }
    usleep((useconds_t)hold * 1000);
    rc_close(&c);
    return rc;
}

static int case_hangup(void)
{
    /* Requests sent, then the connection closed before the reply: an Attach
     * of a world-2 heap (waiting) and a Stats. The heap must be gone. */
    rconn c, q;
    char name[64];
    heap_name(name, sizeof name, "hangup");
    if (open_hello(&c))
        return -1;
    if (send_attach(&c, name, 0, 2, &own) || send_stats(&c, "")) {
        rc_close(&c);
        return -1;
    }
    rc_close(&c);
    if (open_hello(&q))
        return -1;
    int rc = -1;
    for (int i = 0; i < 100; i++) {
        reply r;
        if (send_stats(&q, name))
            break;
        get_reply(&q, REPLY_MS, &r);
        bool gone = r.kind == R_FRAME && r.f->body_case == HEAPD__FRAME__BODY_ERROR &&
                    r.f->error->code == HEAPD__ERR_CODE__ERR_NOT_FOUND;
        if (gone) {
            rc = 0;
            reply_free(&r);
            break;
        }
        if (r.kind != R_FRAME) {
            fail("Stats after a hang-up: %s", r.desc);
            reply_free(&r);
            break;
        }
        reply_free(&r);
        usleep(20000);
    }
    if (rc && !why[0])
        fail("the heap of a client that hung up in its Attach still exists after 2 s");
    rc_close(&q);
    return rc;
}

/* ---- issue 28: replica records (Alloc/Free.decided_from, decided) ---------------- */

#define LE  8                   /* the local_every of the replica cases' heaps */
#define LIE ((uint64_t)1 << 40) /* an offset heapd never chooses (past va_size) */

static int send_attach_le(rconn *c, const char *heap, uint32_t rank, uint32_t world, uint32_t le)
{
    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    Heapd__Attach a = HEAPD__ATTACH__INIT;
    a.heap = (char *)heap;
    a.rank = rank;
    a.world_size = world;
    a.device_uuid = (char *)"";
    hp.chunk_size = own.chunk;
    hp.initial_size = own.initial;
    hp.va_size = own.va;
    hp.min_block = own.min_block;
    hp.collect_timeout_ms = own.timeout_ms;
    hp.local_every = le;
    a.params = &hp;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_ATTACH;
    f.attach = &a;
    return send_frame(c, &f, NULL, 0);
}

/* The AttachReply of a heap asked for with local_every le: its params say le. */
static int attach_le_reply(rconn *c, uint32_t le, const char *what)
{
    reply r;
    if (expect_body(c, HEAPD__FRAME__BODY_ATTACH_REPLY, what, &r))
        return -1;
    uint32_t got = r.f->attach_reply->params ? r.f->attach_reply->params->local_every : 0;
    reply_free(&r);
    return got == le ? 0 : fail("%s: the reply's local_every is %" PRIu32 ", asked for %" PRIu32, what, got, le);
}

/* A world-1 heap with local_every LE. */
static int attach_le(rconn *c, const char *heap)
{
    if (send_attach_le(c, heap, 0, 1, LE))
        return -1;
    return attach_le_reply(c, LE, "Attach (world 1, local_every 8)");
}

/* Ranks 0 and 1 of a new world-2 heap with local_every LE, each on its own
 * connection (set up or -1: rc_close takes either). */
static int attach_le_pair(rconn *r0, rconn *r1, const char *heap)
{
    return open_hello(r0) || open_hello(r1) || send_attach_le(r0, heap, 0, 2, LE) ||
                   send_attach_le(r1, heap, 1, 2, LE) || attach_le_reply(r0, LE, "Attach rank 0 of 2") ||
                   attach_le_reply(r1, LE, "Attach rank 1 of 2")
               ? -1
               : 0;
}

/* An Alloc (seq, size) carrying the records v[0..nv) of allocations from on. */
static int send_alloc_rec(rconn *c, uint64_t seq, uint64_t size, uint64_t from, const uint64_t *v, size_t nv)
{
    Heapd__Alloc a = HEAPD__ALLOC__INIT;
    a.seq = seq;
    a.size = size;
    a.decided_from = from;
    a.decided = (uint64_t *)v;
    a.n_decided = nv;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_ALLOC;
    f.alloc = &a;
    return send_frame(c, &f, NULL, 0);
}

/* A Free of offs[0..n) carrying the records v[0..nv) of allocations from on. */
static int send_free_rec(rconn *c, const uint64_t *offs, size_t n, uint64_t from, const uint64_t *v, size_t nv)
{
    Heapd__Free m = HEAPD__FREE__INIT;
    m.offsets = (uint64_t *)offs;
    m.n_offsets = n;
    m.decided_from = from;
    m.decided = (uint64_t *)v;
    m.n_decided = nv;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.body_case = HEAPD__FRAME__BODY_FREE;
    f.free = &m;
    return send_frame(c, &f, NULL, 0);
}

/* The records must be refused with `code`, on an Alloc at the rank's next
 * number `next` (its own part valid) and on a Free of nothing. Lying
 * offsets in the records make a heapd that applied one poison the heap
 * (ERR_ASYMMETRY), a heapd that ignored them answer the request. */
static int rec_refused(rconn *c, uint64_t next, uint64_t from, const uint64_t *v, size_t nv, int code, const char *what)
{
    char w[200];
    snprintf(w, sizeof w, "an Alloc carrying %s", what);
    if (send_alloc_rec(c, next, 4096, from, v, nv) || expect_error(c, code, w))
        return -1;
    snprintf(w, sizeof w, "a Free carrying %s", what);
    if (send_free_rec(c, NULL, 0, from, v, nv) || expect_error(c, code, w))
        return -1;
    return 0;
}

/* After refused records: the rank is still at allocation `next` (a normal
 * Alloc there works) and the connection answers. */
static int rec_unmoved(rconn *c, uint64_t next, const char *after)
{
    uint64_t off;
    if (alloc1(c, next, 4096, &off)) {
        char w[sizeof why];
        snprintf(w, sizeof w, "%s", why);
        return fail("after %s, Alloc %" PRIu64 ": %s", after, next, w);
    }
    return still_works(c, after);
}

/* (a) Records on a heap that heapd decides alone (local_every 0). */
static int case_replica_no_local(void)
{
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "rnolocal");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t o0, v[2], o;
    if (attach1(&c, name) || alloc1(&c, 0, 4096, &o0))
        goto out;
    v[0] = 4096;
    v[1] = o0 + 4096;
    if (rec_refused(&c, 1, 1, v, 2, HEAPD__ERR_CODE__ERR_PROTOCOL, "a record on a heap of local_every 0"))
        goto out;
    o = o0; /* refused whole: the block it frees stays held */
    if (send_free_rec(&c, &o, 1, 1, v, 2) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "a Free of a block carrying a record (local_every 0)"))
        goto out;
    if (rec_unmoved(&c, 1, "records on a heap of local_every 0"))
        goto out;
    if (send_free(&c, &o, 1) || expect_body(&c, HEAPD__FRAME__BODY_FREE_REPLY, "Free of allocation 0", NULL))
        goto out;
    rc = 0;
out:
    rc_close(&c);
    return rc;
}

/* (b) Records that start past the rank's next allocation number. */
static int case_replica_gap(void)
{
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "rgap");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t o0, v[6] = {4096, LIE, 4096, LIE + 4096, 4096, LIE + 8192};
    if (attach_le(&c, name) || alloc1(&c, 0, 4096, &o0))
        goto out;
    if (rec_refused(&c, 1, 2, v, 2, HEAPD__ERR_CODE__ERR_PROTOCOL, "a record of allocation 2 at 1 (a gap)") ||
        rec_refused(&c, 1, 5, v, 6, HEAPD__ERR_CODE__ERR_PROTOCOL, "records of allocations 5..7 at 1") ||
        rec_refused(&c, 1, UINT64_MAX, v, 2, HEAPD__ERR_CODE__ERR_PROTOCOL, "a record of allocation 2^64-1"))
        goto out;
    rc = rec_unmoved(&c, 1, "records past the rank's next allocation");
out:
    rc_close(&c);
    return rc;
}

/* (c) An odd number of values: not (size, offset) pairs. */
static int case_replica_odd(void)
{
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "rodd");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t o0, v[5] = {4096, LIE, 4096, LIE + 4096, 4096};
    if (attach_le(&c, name) || alloc1(&c, 0, 4096, &o0))
        goto out;
    if (rec_refused(&c, 1, 1, v, 1, HEAPD__ERR_CODE__ERR_PROTOCOL, "1 value") ||
        rec_refused(&c, 1, 1, v, 3, HEAPD__ERR_CODE__ERR_PROTOCOL, "3 values") ||
        rec_refused(&c, 1, 1, v, 5, HEAPD__ERR_CODE__ERR_PROTOCOL, "5 values"))
        goto out;
    rc = rec_unmoved(&c, 1, "odd value counts");
out:
    rc_close(&c);
    return rc;
}

/* (d) More pairs than the limit (HW_DECIDED_MAX, 4096). */
static int case_replica_many(void)
{
    enum { N = 65536 };
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "rmany");
    uint64_t *v = malloc(2 * N * sizeof *v), o0;
    if (!v)
        return fail("out of memory");
    for (size_t i = 0; i < N; i++) {
        v[2 * i] = 4096;
        v[2 * i + 1] = LIE + 4096 * i;
    }
    int rc = -1;
    if (open_hello(&c)) {
        free(v);
        return -1;
    }
    if (attach_le(&c, name) || alloc1(&c, 0, 4096, &o0))
        goto out;
    if (rec_refused(&c, 1, 1, v, 2 * (HW_DECIDED_MAX + 1), HEAPD__ERR_CODE__ERR_PROTOCOL, "4097 pairs") ||
        rec_refused(&c, 1, 1, v, 2 * N, HEAPD__ERR_CODE__ERR_PROTOCOL, "65536 pairs"))
        goto out;
    rc = rec_unmoved(&c, 1, "more records than the limit");
out:
    free(v);
    rc_close(&c);
    return rc;
}

/* (e) A record of an allocation that is a multiple of local_every (0, 8):
 * heapd decides those. */
static int case_replica_at_round(void)
{
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "rround");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t o, v[2] = {4096, 0};
    if (attach_le(&c, name))
        goto out;
    /* Offset 0: what heapd would decide, so that only the rule refuses it. */
    if (rec_refused(&c, 0, 0, v, 2, HEAPD__ERR_CODE__ERR_PROTOCOL, "a record of allocation 0"))
        goto out;
    if (send_alloc_rec(&c, 1, 4096, 0, v, 2) ||
        expect_error(&c, HEAPD__ERR_CODE__ERR_PROTOCOL, "an Alloc 1 carrying a record of allocation 0"))
        goto out;
    for (uint64_t s = 0; s < LE; s++)
        if (alloc1(&c, s, 4096, &o))
            goto out;
    v[1] = o + 4096;
    if (rec_refused(&c, LE, LE, v, 2, HEAPD__ERR_CODE__ERR_PROTOCOL, "a record of allocation 8 (local_every 8)"))
        goto out;
    rc = rec_unmoved(&c, LE, "records of allocations heapd decides");
out:
    rc_close(&c);
    return rc;
}

/* Records of size 0 and over va_size: no replica decides those. */
static int case_replica_size(void)
{
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "rsize");
    if (open_hello(&c))
        return -1;
    int rc = -1;
    uint64_t o0, v[2] = {0, LIE};
    if (attach_le(&c, name) || alloc1(&c, 0, 4096, &o0))
        goto out;
    if (rec_refused(&c, 1, 1, v, 2, HEAPD__ERR_CODE__ERR_PROTOCOL, "a record of size 0"))
        goto out;
    v[0] = own.va + 1;
    if (rec_refused(&c, 1, 1, v, 2, HEAPD__ERR_CODE__ERR_PROTOCOL, "a record of va_size + 1 bytes"))
        goto out;
    v[0] = UINT64_MAX;
    if (rec_refused(&c, 1, 1, v, 2, HEAPD__ERR_CODE__ERR_PROTOCOL, "a record of 2^64-1 bytes"))
        goto out;
    rc = rec_unmoved(&c, 1, "records of impossible sizes");
out:
    rc_close(&c);
    return rc;
}

/* The heap of c (rank at allocation `next`) is poisoned: every request on
 * it gets ERR_ASYMMETRY. */
static int poisoned(rconn *c, uint64_t next, uint64_t held, const char *who)
{
    char w[160];
    uint64_t o = held, v[2] = {4096, LIE};
    snprintf(w, sizeof w, "%s: an Alloc on the poisoned heap", who);
    if (send_alloc(c, next, 4096) || expect_error(c, HEAPD__ERR_CODE__ERR_ASYMMETRY, w))
        return -1;
    snprintf(w, sizeof w, "%s: a Free on the poisoned heap", who);
    if (send_free(c, &o, 1) || expect_error(c, HEAPD__ERR_CODE__ERR_ASYMMETRY, w))
        return -1;
    snprintf(w, sizeof w, "%s: an empty Free carrying a record on the poisoned heap", who);
    if (send_free_rec(c, NULL, 0, next, v, 2) || expect_error(c, HEAPD__ERR_CODE__ERR_ASYMMETRY, w))
        return -1;
    v[0] = 0; /* malformed too: the poison comes first */
    snprintf(w, sizeof w, "%s: an Alloc carrying a record of size 0 on the poisoned heap", who);
    if (send_alloc_rec(c, next + 1, 4096, next, v, 2) || expect_error(c, HEAPD__ERR_CODE__ERR_ASYMMETRY, w))
        return -1;
    snprintf(w, sizeof w, "%s: a Collect on the poisoned heap", who);
    if (send_collect(c, next) || expect_error(c, HEAPD__ERR_CODE__ERR_ASYMMETRY, w))
        return -1;
    snprintf(w, sizeof w, "%s: a poisoned heap", who);
    return still_works(c, w);
}

/* Another heap, attached now, still allocates. */
static int other_heap_works(void)
{
    rconn c;
    char name[64];
    heap_name(name, sizeof name, "rother");
    if (open_hello(&c))
        return -1;
    uint64_t o;
    int rc = attach_le(&c, name) || alloc1(&c, 0, 4096, &o) || alloc1(&c, 1, 4096, &o) ? -1 : 0;
    rc_close(&c);
    return rc;
}

/* (f) A rank whose replica lies about an offset: offset of a block it holds
 * (world 1, on an Alloc), past va_size (world 2, on a Free: the other rank
 * is poisoned too). */
static int case_replica_lie(void)
{
    rconn a, r0, r1;
    char na[64], nb[64];
    heap_name(na, sizeof na, "rlie");
    heap_name(nb, sizeof nb, "rlie2");
    a.fd = r0.fd = r1.fd = -1;
    memset(&a.rd, 0, sizeof a.rd);
    memset(&r0.rd, 0, sizeof r0.rd);
    memset(&r1.rd, 0, sizeof r1.rd);
    int rc = -1;
    uint64_t o0, p0, v[2] = {4096, 0};
    if (open_hello(&a) || attach_le(&a, na) || alloc1(&a, 0, 4096, &o0))
        goto out;
    v[1] = o0; /* allocation 0's block, still held */
    if (send_alloc_rec(&a, 2, 4096, 1, v, 2) ||
        expect_error_msg(&a, HEAPD__ERR_CODE__ERR_ASYMMETRY, "replica",
                         "an Alloc 2 carrying allocation 1 at allocation 0's offset"))
        goto out;
    if (poisoned(&a, 1, o0, "world 1") || poisoned(&a, 2, o0, "world 1, again"))
        goto out;
    if (attach_le_pair(&r0, &r1, nb))
        goto out;
    if (alloc1(&r0, 0, 4096, &p0))
        goto out;
    v[1] = LIE;
    if (send_free_rec(&r0, NULL, 0, 1, v, 2) ||
        expect_error_msg(&r0, HEAPD__ERR_CODE__ERR_ASYMMETRY, "replica",
                         "a Free carrying allocation 1 at an offset past va_size"))
        goto out;
    if (poisoned(&r0, 1, p0, "rank 0 of 2") || poisoned(&r1, 0, p0, "rank 1 of 2 (never allocated)"))
        goto out;
    rc = other_heap_works();
out:
    rc_close(&a);
    rc_close(&r0);
    rc_close(&r1);
    return rc;
}

/* A rank's record of allocation 1 gives another size than the other rank's
 * allocation 1 (which heapd decided). */
static int case_replica_lie_size(void)
{
    rconn r0, r1;
    char name[64];
    heap_name(name, sizeof name, "rliesize");
    r0.fd = r1.fd = -1;
    memset(&r0.rd, 0, sizeof r0.rd);
    memset(&r1.rd, 0, sizeof r1.rd);
    int rc = -1;
    uint64_t p0, p1, q0, v[2];
    if (attach_le_pair(&r0, &r1, name))
        goto out;
    if (alloc1(&r0, 0, 4096, &p0) || alloc1(&r0, 1, 8192, &p1) || alloc1(&r1, 0, 4096, &q0))
        goto out;
    v[0] = 4096; /* rank 0 asked for 8192 */
    v[1] = p1;
    if (send_free_rec(&r1, NULL, 0, 1, v, 2) ||
        expect_error(&r1, HEAPD__ERR_CODE__ERR_ASYMMETRY, "a record of 4096 bytes where rank 0 asked for 8192"))
        goto out;
    if (poisoned(&r1, 1, q0, "rank 1 of 2") || poisoned(&r0, 2, p0, "rank 0 of 2"))
        goto out;
    rc = other_heap_works();
out:
    rc_close(&r0);
    rc_close(&r1);
    return rc;
}

/* Records where heapd's allocator would need a step: a growth (a block
 * larger than the mapped chunk), a collect it asked for (collect_needed). */
static int case_replica_lie_step(void)
{
    rconn a, b;
    char na[64], nb[64];
    heap_name(na, sizeof na, "rliegrow");
    heap_name(nb, sizeof nb, "rliecoll");
    a.fd = b.fd = -1;
    memset(&a.rd, 0, sizeof a.rd);
    memset(&b.rd, 0, sizeof b.rd);
    int rc = -1;
    reply r;
    uint64_t o0, v[2];
    if (open_hello(&a) || attach_le(&a, na) || alloc1(&a, 0, 4096, &o0))
        goto out;
    v[0] = 2 * own.chunk;
    v[1] = o0 + 4096;
    if (send_alloc_rec(&a, 2, 4096, 1, v, 2) ||
        expect_error(&a, HEAPD__ERR_CODE__ERR_ASYMMETRY, "a record of a block that needs the heap to grow"))
        goto out;
    if (poisoned(&a, 1, o0, "after a record that needs a growth"))
        goto out;
    /* The chunk's one block released (reclaimed at the next round, 8):
     * allocation 1 of a chunk needs a collect. */
    if (open_hello(&b) || attach_le(&b, nb) || alloc1(&b, 0, own.chunk, &o0))
        goto out;
    if (send_free(&b, &o0, 1) || expect_body(&b, HEAPD__FRAME__BODY_FREE_REPLY, "Free of allocation 0", NULL))
        goto out;
    if (send_alloc(&b, 1, own.chunk) || expect_body(&b, HEAPD__FRAME__BODY_ALLOC_REPLY, "Alloc 1 of a chunk", &r))
        goto out;
    bool needed = r.f->alloc_reply->collect_needed;
    reply_free(&r);
    if (!needed) {
        fail("Alloc 1 of a chunk whose only block is released: no collect_needed");
        goto out;
    }
    v[0] = own.chunk;
    v[1] = o0;
    if (send_free_rec(&b, NULL, 0, 1, v, 2) ||
        expect_error(&b, HEAPD__ERR_CODE__ERR_ASYMMETRY, "a record of allocation 1 where heapd asked for a collect"))
        goto out;
    if (poisoned(&b, 1, o0, "after a record where a collect is owed"))
        goto out;
    rc = other_heap_works();
out:
    rc_close(&a);
    rc_close(&b);
    return rc;
}

/* (g) Truthful records are taken: the offsets a twin heap's heapd decided
 * (normal Allocs), sent again (skipped), and the rank holds their blocks. */
static int case_replica_truth(void)
{
    static const uint64_t size[5] = {4096, 8192, 4096, 512, 4096};
    rconn t, o;
    char nt[64], no[64];
    heap_name(nt, sizeof nt, "rtruth");
    heap_name(no, sizeof no, "rtwin");
    t.fd = o.fd = -1;
    memset(&t.rd, 0, sizeof t.rd);
    memset(&o.rd, 0, sizeof o.rd);
    int rc = -1;
    uint64_t p[5], x, v[4];
    reply r;
    if (open_hello(&o) || attach_le(&o, no))
        goto out;
    for (int i = 0; i < 5; i++)
        if (alloc1(&o, (uint64_t)i, size[i], &p[i]))
            goto out;
    if (open_hello(&t) || attach_le(&t, nt) || alloc1(&t, 0, size[0], &x))
        goto out;
    if (x != p[0]) {
        fail("allocation 0 of two heaps of the same parameters: offsets %" PRIu64 " and %" PRIu64, x, p[0]);
        goto out;
    }
    v[0] = size[1], v[1] = p[1], v[2] = size[2], v[3] = p[2];
    if (send_free_rec(&t, NULL, 0, 1, v, 2) ||
        expect_body(&t, HEAPD__FRAME__BODY_FREE_REPLY, "a Free carrying the true record of allocation 1", NULL))
        goto out;
    if (send_free_rec(&t, NULL, 0, 1, v, 4) ||
        expect_body(&t, HEAPD__FRAME__BODY_FREE_REPLY, "a Free carrying records 1 (sent again) and 2", NULL))
        goto out;
    if (send_alloc_rec(&t, 3, size[3], 1, v, 4) ||
        expect_body(&t, HEAPD__FRAME__BODY_ALLOC_REPLY, "Alloc 3 carrying records 1 and 2 (sent again)", &r))
        goto out;
    x = r.f->alloc_reply->offset;
    reply_free(&r);
    if (alloc1(&t, 4, size[4], &p[0]))
        goto out;
    if (x != p[3] || p[0] != p[4]) {
        fail("allocations 3 and 4 after true records at %" PRIu64 " and %" PRIu64 ", the twin heap's at %" PRIu64
             " and %" PRIu64,
             x, p[0], p[3], p[4]);
        goto out;
    }
    if (send_free(&t, &v[1], 1) || expect_body(&t, HEAPD__FRAME__BODY_FREE_REPLY, "Free of allocation 1's block", &r))
        goto out;
    x = r.f->free_reply->accepted;
    reply_free(&r);
    if (x != 1) {
        fail("Free of allocation 1's block (a record): accepted %" PRIu64, x);
        goto out;
    }
    rc = still_works(&t, "true records");
out:
    rc_close(&t);
    rc_close(&o);
    return rc;
}

/* A rank waiting in a Collect when another rank's record poisons the heap
 * learns it (ERR_ASYMMETRY), as with a poison by sizes (before the fix it
 * waited for ERR_TIMEOUT, which named the poisoning rank). */
static int case_replica_collect(void)
{
    rconn r0, r1;
    char name[64];
    heap_name(name, sizeof name, "rcollwait");
    r0.fd = r1.fd = -1;
    memset(&r0.rd, 0, sizeof r0.rd);
    memset(&r1.rd, 0, sizeof r1.rd);
    int rc = -1;
    uint64_t p0, q0, v[2] = {4096, LIE};
    if (attach_le_pair(&r0, &r1, name))
        goto out;
    if (alloc1(&r0, 0, 4096, &p0) || alloc1(&r1, 0, 4096, &q0))
        goto out;
    if (send_collect(&r1, 1))
        goto out;
    uint64_t waiting = r1.last_id; /* a Stats answered after it: heapd has the Collect */
    if (send_stats(&r1, "") || expect_body(&r1, HEAPD__FRAME__BODY_STATS_REPLY, "Stats while in a Collect", NULL))
        goto out;
    if (send_free_rec(&r0, NULL, 0, 1, v, 2) ||
        expect_error(&r0, HEAPD__ERR_CODE__ERR_ASYMMETRY, "rank 0's lying record while rank 1 waits in a Collect"))
        goto out;
    if (expect_error_id(&r1, HEAPD__ERR_CODE__ERR_ASYMMETRY, waiting,
                        "rank 1's Collect, waiting when rank 0's record poisoned the heap"))
        goto out;
    rc = still_works(&r1, "a Collect ended by a poison");
out:
    rc_close(&r0);
    rc_close(&r1);
    return rc;
}

/* ---- driver ------------------------------------------------------------------- */

typedef struct tcase {
    const char *name;
    int (*fn)(void);
    const char *what;
} tcase;

static const tcase cases[] = {
    {"trunc_header", case_trunc_header, "header cut short, EOF: connection closed"},
    {"trunc_payload", case_trunc_payload, "payload cut short, EOF: connection closed"},
    {"trunc_with_fds", case_trunc_with_fds, "frame with fds cut short: closed, fds closed"},
    {"len_over_cap", case_len_over_cap, "length over HW_FRAME_MAX: connection closed"},
    {"len_max", case_len_max, "length 2^32-1: connection closed"},
    {"nfds_over_cap", case_nfds_over_cap, "fd count over HW_FDS_MAX: closed, fds closed"},
    {"fds_undeclared", case_fds_undeclared, "fds on a frame announcing none: closed, fds closed"},
    {"fds_missing", case_fds_missing, "fewer fds than announced: closed, fds closed"},
    {"fds_no_frame", case_fds_no_frame, "fds on a cut header: closed, fds closed"},
    {"fds_over_cap_real", case_fds_over_cap_real, "1100 fds really sent: closed, fds closed"},
    {"garbage", case_garbage, "invalid protobuf: ERR_PROTOCOL, connection kept"},
    {"empty_frame", case_empty_frame, "empty frames: ERR_PROTOCOL, connection kept"},
    {"unknown_type", case_unknown_type, "unknown message types: ERR_PROTOCOL"},
    {"reply_bodies", case_reply_bodies, "reply bodies as requests: ERR_PROTOCOL"},
    {"before_hello", case_before_hello, "every request before Hello: ERR_PROTOCOL"},
    {"bad_version", case_bad_version, "Hello version 0, 2, 2^32-1: ERR_VERSION, closed"},
    {"double_hello", case_double_hello, "a second Hello: ERR_PROTOCOL"},
    {"fds_on_request", case_fds_on_request, "memfds on Hello and Stats: ERR_PROTOCOL, fds closed"},
    {"fds_max", case_fds_max, "1024 fds on a Stats: ERR_PROTOCOL, fds closed"},
    {"fds_253", case_fds_253, "253 fds in one sendmsg on invalid protobuf: ERR_PROTOCOL, fds closed"},
    {"not_attached", case_not_attached, "Alloc/Free/Collect/Detach/Commit without Attach: ERR_STATE"},
    {"attach_invalid", case_attach_invalid, "bad rank, world_size, name, parameters: ERR_INVALID"},
    {"attach_victim", case_attach_victim, "attach to a busy heap: ERR_MISMATCH, ERR_STATE, ERR_INVALID"},
    {"attach_twice", case_attach_twice, "attach twice, detach twice: ERR_STATE"},
    {"attach_text", case_attach_text, "names/jobs: bad UTF-8, controls, NUL, 128-byte job: ERR_INVALID"},
    {"attach_policy", case_attach_policy, "unknown policy values: ERR_INVALID naming them"},
    {"attach_bounds", case_attach_bounds, "va_size/chunk_size, va_size/min_block over max_*: ERR_INVALID"},
    {"attach_retry", case_attach_retry, "attach retried after ERR_TIMEOUT: same and new connection"},
    {"alloc_bad", case_alloc_bad, "alloc of 0, > va_size, 2^64-1, wrong seq, heap full"},
    {"names_bad", case_names_bad, "Alloc names too long, controls, bad UTF-8, NUL; bad Commits"},
    {"alloc_with_fds", case_alloc_with_fds, "Alloc with fds: ERR_PROTOCOL, not counted"},
    {"free_bad", case_free_bad, "unknown, inside, doubled, double free: ERR_NOT_HELD, nothing freed"},
    {"free_huge", case_free_huge, "Free batches of 500000 offsets: ERR_NOT_HELD"},
    {"free_foreign", case_free_foreign, "frees of a peer's / another heap's blocks; bad collects"},
    {"unknown_heap", case_unknown_heap, "Stats / ForceCollect of unknown heaps: ERR_NOT_FOUND"},
    {"big_frame", case_big_frame, "a 4 MiB frame: answered"},
    {"hangup", case_hangup, "hang up with requests in flight: heap destroyed"},
    {"partial_heap", case_partial_heap, "destroy of a heap with ranks never attached: others unaffected"},
    {"replica_no_local", case_replica_no_local, "replica records on a heap of local_every 0: ERR_PROTOCOL"},
    {"replica_gap", case_replica_gap, "replica records past the next allocation number: ERR_PROTOCOL"},
    {"replica_odd", case_replica_odd, "replica records of 1, 3, 5 values: ERR_PROTOCOL"},
    {"replica_many", case_replica_many, "4097 and 65536 replica records: ERR_PROTOCOL"},
    {"replica_at_round", case_replica_at_round, "replica records of allocations 0 and 8 (local_every 8): ERR_PROTOCOL"},
    {"replica_size", case_replica_size, "replica records of 0, va_size + 1, 2^64-1 bytes: ERR_PROTOCOL"},
    {"replica_lie", case_replica_lie, "a replica's wrong offset: ERR_ASYMMETRY, heap poisoned, others fine"},
    {"replica_lie_size", case_replica_lie_size, "a record's size differs from a peer's: ERR_ASYMMETRY, poisoned"},
    {"replica_lie_step", case_replica_lie_step, "records where heapd must grow or collect: ERR_ASYMMETRY"},
    {"replica_truth", case_replica_truth, "true replica records (and resent ones) taken, blocks held"},
    {"replica_collect", case_replica_collect, "a record's poison ends a peer's waiting Collect: ERR_ASYMMETRY"},
    {"flood", case_flood, "200000 requests without reading a reply"},
};
#define NCASES (sizeof cases / sizeof cases[0])

static void usage(FILE *f)
{
    fprintf(f, "Usage: prog_raw --socket PATH [--repeat N] [--victim HEAP:WORLD:CHUNK] CASE...|all\n"
               "       prog_raw --list\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'}, {"repeat", required_argument, NULL, 'r'},
        {"victim", required_argument, NULL, 'v'}, {"list", no_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    long repeat = 0;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 's':
            sock_path = optarg;
            break;
        case 'r':
            repeat = strtol(optarg, NULL, 10);
            break;
        case 'v': {
            static char buf[512];
            snprintf(buf, sizeof buf, "%s", optarg);
            char *a = strchr(buf, ':'), *b = a ? strchr(a + 1, ':') : NULL;
            if (!a || !b) {
                usage(stderr);
                return 2;
            }
            *a = *b = 0;
            victim_heap = buf;
            victim_world = (uint32_t)strtoul(a + 1, NULL, 10);
            victim_chunk = strtoull(b + 1, NULL, 0);
            break;
        }
        case 'l':
            for (size_t i = 0; i < NCASES; i++)
                printf("%-18s %s\n", cases[i].name, cases[i].what);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!sock_path || optind >= argc) {
        usage(stderr);
        return 2;
    }
    /* Room for the 1100-fd cases. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    const tcase *sel[NCASES * 4];
    size_t nsel = 0;
    for (int i = optind; i < argc; i++) {
        if (!strcmp(argv[i], "all")) { /* every case but flood */
            for (size_t k = 0; k < NCASES && nsel < NCASES * 4; k++)
                if (strcmp(cases[k].name, "flood"))
                    sel[nsel++] = &cases[k];
            continue;
        }
        size_t k;
        for (k = 0; k < NCASES; k++)
            if (!strcmp(argv[i], cases[k].name))
                break;
        if (k == NCASES) {
            fprintf(stderr, "prog_raw: unknown case '%s' (--list)\n", argv[i]);
            return 2;
        }
        if (nsel < NCASES * 4)
            sel[nsel++] = &cases[k];
    }
    long rounds = repeat > 0 ? repeat : 1, failures = 0;
    for (long r = 0; r < rounds; r++) {
        for (size_t i = 0; i < nsel; i++) {
            why[0] = 0;
            int rc = sel[i]->fn();
            if (rc) {
                failures++;
                printf("FAIL %s: %s\n", sel[i]->name, why[0] ? why : "failed");
                if (repeat > 0)
                    printf("     (round %ld)\n", r + 1);
            } else if (repeat <= 0) {
                printf("ok   %s: %s\n", sel[i]->name, sel[i]->what);
            }
            fflush(stdout);
        }
        if (repeat > 0 && failures > 20)
            break;
    }
    if (repeat > 0)
        printf("repeat: %ld rounds of %zu cases, %ld failures\n", rounds, nsel, failures);
    return failures ? 1 : 0;
}
