/* fuzz_wire.c - libFuzzer target: heapd's framing (common/wire.c) and message
 * decoding (heapd.pb-c.c + libprotobuf-c), as the daemon's read path uses
 * them: bytes and fds arrive on a Unix stream socket, hw_read cuts frames,
 * heapd__frame__unpack decodes them.
 *
 * Input: 4 control bytes, then the stream.
 *   ctl bit 0      1: the stream is ONE payload; the harness writes a correct
 *                  header (length, fd count) so the decoder sees it whole.
 *                  0: the stream is sent as it is (headers are the input's).
 *   ctl bits 1-2   fds attached to the first piece (framed mode: announced).
 *   ctl bits 3-31  seed of the split: the stream is sent in pieces of random
 *                  length (some with 1-3 fds attached in raw mode), read
 *                  back after every piece (MSG_DONTWAIT), then the sender
 *                  shuts down its side (EOF).
 *
 * Checked (abort on violation):
 *   - hw_read returns only documented codes; after an error it stays failed;
 *   - a frame has data != NULL, data[len] == 0, len <= HW_FRAME_MAX,
 *     nfds <= HW_FDS_MAX, every fd open and close-on-exec;
 *   - in framed mode the payload and fd count come back exactly;
 *   - a decoded Frame re-encodes to bytes that decode again and re-encode
 *     identically (the canonical form is stable), its strings are readable
 *     and NUL-terminated;
 *   - the frame survives the writer: hw_writer_push + hw_writer_flush through
 *     a second socket pair and hw_read again give the same bytes and fd count;
 *   - no fd leaks: after each input no fd refers to the memfd whose dups were
 *     sent (the harness's own excepted).
 */
#include "heapd.pb-c.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define FD_SCAN 2048

static int base_fd = -1; /* a memfd whose dups are the fds sent */

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "fuzz_wire: check failed: %s: ", #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* Every fd sent is a dup of base_fd, so a leaked one refers to its inode.
 * (Counting all open fds would race with libFuzzer's own threads.) */
static dev_t base_dev;
static ino_t base_ino;

static int count_base_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < FD_SCAN; fd++) {
        struct stat st;
        if (fstat(fd, &st) == 0 && st.st_dev == base_dev && st.st_ino == base_ino)
            n++;
    }
    return n;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void send_piece(int fd, const uint8_t *p, size_t len, int nfds)
{
    int fds[4];
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(4 * sizeof(int))];
    } cb;
    struct iovec iov = {(void *)p, len};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (nfds > 0) {
        for (int i = 0; i < nfds; i++) {
            fds[i] = fcntl(base_fd, F_DUPFD_CLOEXEC, 0);
            CHECK(fds[i] >= 0, "dup: %s", strerror(errno));
        }
        memset(&cb, 0, sizeof cb);
        m.msg_control = cb.b;
        m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(h), fds, (size_t)nfds * sizeof(int));
    }
    ssize_t n;
    do
        n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    /* The pieces are small and the reader drains after each: no EAGAIN. A
     * failed reader's socket is still open, so EPIPE cannot happen either. */
    CHECK(n == (ssize_t)len, "sendmsg of %zu bytes returned %zd (%s)", len, n, n < 0 ? strerror(errno) : "");
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
}

static int valid_code(int rc)
{
    return rc == HW_FRAME || rc == HW_AGAIN || rc == HW_EOF || rc == HW_ETOOBIG || rc == HW_ETOOMANYFDS ||
           rc == HW_EFDS || rc == HW_ECTRUNC || rc == HW_EPARTIAL || rc == HW_ENOMEM || rc == HW_EBROKEN;
}

static volatile size_t sink;

/* Touch what a decoded Frame points to, as the daemon would. */
static void walk(const Heapd__Frame *f)
{
    size_t s = 0;
    switch (f->body_case) {
    case HEAPD__FRAME__BODY_HELLO:
        if (f->hello->client)
            s += strlen(f->hello->client);
        break;
    case HEAPD__FRAME__BODY_ATTACH:
        if (f->attach->heap)
            s += strlen(f->attach->heap);
        if (f->attach->device_uuid)
            s += strlen(f->attach->device_uuid);
        if (f->attach->params)
            s += f->attach->params->chunk_size + (size_t)f->attach->params->policy;
        break;
    case HEAPD__FRAME__BODY_FREE:
        for (size_t i = 0; i < f->free->n_offsets; i++)
            s += f->free->offsets[i];
        break;
    case HEAPD__FRAME__BODY_STATS:
        if (f->stats->heap)
            s += strlen(f->stats->heap);
        break;
    case HEAPD__FRAME__BODY_FORCE_COLLECT:
        if (f->force_collect->heap)
            s += strlen(f->force_collect->heap);
        break;
    case HEAPD__FRAME__BODY_ATTACH_REPLY:
        for (size_t i = 0; i < f->attach_reply->n_chunks; i++)
            s += f->attach_reply->chunks[i]->fd_index;
        for (size_t i = 0; i < f->attach_reply->n_local_ranks; i++)
            s += f->attach_reply->local_ranks[i];
        break;
    case HEAPD__FRAME__BODY_STATS_REPLY:
        for (size_t i = 0; i < f->stats_reply->n_heaps; i++) {
            const Heapd__HeapStats *h = f->stats_reply->heaps[i];
            if (h->name)
                s += strlen(h->name);
            for (size_t j = 0; j < h->n_ranks; j++)
                s += h->ranks[j]->live_bytes;
        }
        break;
    case HEAPD__FRAME__BODY_ERROR:
        if (f->error->message)
            s += strlen(f->error->message);
        break;
    default:
        break;
    }
    sink += s;
}

/* 1 if m or a message inside it kept an unknown field numbered 0.
 * libprotobuf-c 1.4.1 accepts field number 0 when its tag is a non-minimal
 * varint (80 00) and keeps it; re-encoded as 00 it no longer decodes. heapd
 * never re-encodes what it receives, so that quirk is tolerated here. */
static int has_tag0(const ProtobufCMessage *m)
{
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        const char *base = (const char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (v[k] && has_tag0(v[k]))
                    return 1;
        } else {
            if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && *(const uint32_t *)(base + f->quantifier_offset) != f->id)
                continue;
            const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
            if (sub && has_tag0(sub))
                return 1;
        }
    }
    return 0;
}

/* Decode, re-encode, decode again: the canonical form is stable. */
static void check_decode(const uint8_t *data, size_t len)
{
    Heapd__Frame *f = heapd__frame__unpack(NULL, len, data);
    if (!f)
        return;
    walk(f);
    size_t n1 = heapd__frame__get_packed_size(f);
    uint8_t *b1 = malloc(n1 ? n1 : 1);
    CHECK(b1 != NULL, "malloc");
    CHECK(heapd__frame__pack(f, b1) == n1, "pack size");
    Heapd__Frame *g = heapd__frame__unpack(NULL, n1, b1);
    if (!g && has_tag0(&f->base)) {
        free(b1);
        heapd__frame__free_unpacked(f, NULL);
        return;
    }
    CHECK(g != NULL, "a re-encoded frame (%zu bytes, from %zu) does not decode", n1, len);
    CHECK(g->id == f->id && g->body_case == f->body_case, "re-encoding changed id or body");
    size_t n2 = heapd__frame__get_packed_size(g);
    uint8_t *b2 = malloc(n2 ? n2 : 1);
    CHECK(b2 != NULL, "malloc");
    CHECK(heapd__frame__pack(g, b2) == n2, "pack size");
    CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0, "re-encoding is not stable (%zu vs %zu bytes)", n1, n2);
    free(b1);
    free(b2);
    heapd__frame__free_unpacked(g, NULL);
    heapd__frame__free_unpacked(f, NULL);
}

/* The frame goes through the writer and a fresh reader unchanged. */
static void check_writer(const hw_frame *fr)
{
    int sv[2];
    char err[256];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s", strerror(errno));
    CHECK(hw_set_nonblock(sv[0]) == 0 && hw_set_nonblock(sv[1]) == 0, "nonblock");
    hw_writer w;
    hw_writer_init(&w);
    int fds[HW_FDS_MAX];
    for (size_t i = 0; i < fr->nfds; i++) {
        fds[i] = fcntl(fr->fds[i], F_DUPFD_CLOEXEC, 0);
        CHECK(fds[i] >= 0, "dup: %s", strerror(errno));
    }
    CHECK(hw_writer_push(&w, fr->data, fr->len, fds, fr->nfds, err, sizeof err) == 0, "push: %s", err);
    hw_reader r;
    hw_reader_init(&r);
    hw_frame out;
    int got = 0;
    for (int round = 0; round < 10000 && !got; round++) {
        int rc = hw_writer_flush(sv[0], &w, err, sizeof err);
        CHECK(rc >= 0, "flush: %s", err);
        for (;;) {
            int rr = hw_read(sv[1], &r, &out, err, sizeof err);
            CHECK(rr == HW_FRAME || rr == HW_AGAIN, "re-read of a written frame: %s (%s)", hw_strerror(rr), err);
            if (rr == HW_AGAIN)
                break;
            CHECK(out.len == fr->len && memcmp(out.data, fr->data, fr->len) == 0 && out.nfds == fr->nfds,
                  "the writer changed the frame (%zu/%zu bytes, %zu/%zu fds)", out.len, fr->len, out.nfds, fr->nfds);
            hw_frame_free(&out);
            got = 1;
            break;
        }
    }
    CHECK(got, "the written frame never arrived");
    CHECK(hw_writer_pending(&w) == 0, "writer still has frames");
    hw_writer_free(&w);
    hw_reader_free(&r);
    close(sv[0]);
    close(sv[1]);
}

/* Drains what the socket has; returns 1 once the reader has failed or hit EOF. */
static int drain(int fd, hw_reader *r, int *failed, const uint8_t *expect, size_t elen, int efds, int *frames)
{
    char err[256];
    for (;;) {
        hw_frame fr;
        int rc = hw_read(fd, r, &fr, err, sizeof err);
        CHECK(valid_code(rc), "hw_read returned %d (%s)", rc, hw_strerror(rc));
        if (*failed) {
            CHECK(rc == HW_EBROKEN, "a failed reader returned %s", hw_strerror(rc));
            return 1;
        }
        if (rc == HW_AGAIN)
            return 0;
        if (rc == HW_EOF)
            return 1;
        if (rc < 0) {
            CHECK(fr.data == NULL && fr.nfds == 0, "an error left a frame behind");
            *failed = 1;
            /* once more: it must stay failed */
            continue;
        }
        CHECK(fr.data != NULL && fr.data[fr.len] == 0, "frame data");
        CHECK(fr.len <= HW_FRAME_MAX && fr.nfds <= HW_FDS_MAX, "frame over the limits");
        for (size_t i = 0; i < fr.nfds; i++) {
            int fl = fcntl(fr.fds[i], F_GETFD);
            CHECK(fl >= 0 && (fl & FD_CLOEXEC), "received fd %d not open or not close-on-exec", fr.fds[i]);
        }
        if (expect) {
            CHECK(*frames == 0 && fr.len == elen && memcmp(fr.data, expect, elen) == 0 && (int)fr.nfds == efds,
                  "framed mode: payload or fds changed (%zu/%zu bytes, %zu/%d fds)", fr.len, elen, fr.nfds, efds);
        }
        (*frames)++;
        check_decode(fr.data, fr.len);
        check_writer(&fr);
        hw_frame_free(&fr);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    base_fd = memfd_create("fuzz-wire", MFD_CLOEXEC);
    if (base_fd < 0) {
        perror("memfd_create");
        abort();
    }
    struct stat st;
    if (fstat(base_fd, &st) != 0) {
        perror("fstat");
        abort();
    }
    base_dev = st.st_dev;
    base_ino = st.st_ino;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    uint32_t ctl = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    data += 4;
    size -= 4;
    int framed = ctl & 1;
    int first_fds = (int)((ctl >> 1) & 3);
    uint64_t seed = ctl >> 3;
    int any_fds = first_fds > 0;

    uint8_t *stream = NULL;
    size_t slen = size;
    if (framed) {
        if (size > HW_FRAME_MAX)
            return 0;
        stream = malloc(size + HW_HDR_SIZE);
        CHECK(stream != NULL, "malloc");
        uint32_t l = (uint32_t)size, nf = (uint32_t)first_fds;
        for (int i = 0; i < 4; i++) {
            stream[i] = (uint8_t)(l >> (8 * i));
            stream[4 + i] = (uint8_t)(nf >> (8 * i));
        }
        memcpy(stream + HW_HDR_SIZE, data, size);
        slen = size + HW_HDR_SIZE;
    } else {
        stream = malloc(size ? size : 1);
        CHECK(stream != NULL, "malloc");
        memcpy(stream, data, size);
    }

    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s", strerror(errno));
    hw_reader r;
    hw_reader_init(&r);
    int failed = 0, done = 0, frames = 0;
    size_t off = 0;
    int piece = 0;
    while (off < slen && !done) {
        uint64_t x = rng_next(&seed);
        size_t len = (x & 7) == 0 ? slen - off : 1 + (size_t)((x >> 3) % 64);
        if (len > slen - off)
            len = slen - off;
        int nf = 0;
        if (piece == 0)
            nf = first_fds;
        else if (!framed && ((x >> 16) & 15) == 0)
            nf = 1 + (int)((x >> 20) % 3);
        if (nf)
            any_fds = 1;
        send_piece(sv[0], stream + off, len, nf);
        off += len;
        piece++;
        done = drain(sv[1], &r, &failed, framed ? data : NULL, size, first_fds, &frames);
    }
    if (!done) {
        shutdown(sv[0], SHUT_WR);
        drain(sv[1], &r, &failed, framed ? data : NULL, size, first_fds, &frames);
    }
    if (framed)
        CHECK(frames == 1 || failed, "framed mode: %d frames and no error", frames);
    hw_reader_free(&r);
    close(sv[0]);
    close(sv[1]);
    free(stream);
    if (any_fds) {
        int n = count_base_fds();
        CHECK(n == 1, "fd leak: %d fds refer to the memfd that was sent, 1 expected (the harness's own)", n);
    }
    return 0;
}
