/* check_xport.c - libheapc's transports (client/heapc_xport.h, issue 26):
 * the request ring (heapc_ring.c) over a fake socket transport that records
 * what the ring asks of it, with this test playing heapd's side of the ring
 * (hr_put into the response slots); and the socket transport (heapc_sock.c)
 * over a socket pair: stale frames dropped, a hang-up, heapd's last words. */
#include <check.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_util.h"
#include "heapc.h"
#include "heapc_ring.h"
#include "heapc_sock.h"
#include "ring_layout.h"

static const hr_geom G = {HR_NSLOTS_DEFAULT, HR_SLOT_SIZE_DEFAULT};

/* ---- frames ---------------------------------------------------------------- */

static size_t pack_alloc_reply(uint64_t id, unsigned char *buf)
{
    Heapd__AllocReply ar = HEAPD__ALLOC_REPLY__INIT;
    ar.offset = 4096 * id;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ALLOC_REPLY;
    f.alloc_reply = &ar;
    return heapd__frame__pack(&f, buf);
}

static size_t pack_error(uint64_t id, const char *msg, unsigned char *buf)
{
    Heapd__Error er = HEAPD__ERROR__INIT;
    er.code = HEAPD__ERR_CODE__ERR_SHUTDOWN;
    er.message = (char *)msg;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ERROR;
    f.error = &er;
    return heapd__frame__pack(&f, buf);
}

static Heapd__Frame *unpack(const unsigned char *buf, size_t len)
{
    Heapd__Frame *m = heapd__frame__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(m);
    return m;
}

/* ---- a fake socket transport ------------------------------------------------ */

typedef struct fake_side {
    int readable;        /* what readable answers (then 0) */
    int nreadable;       /* readable calls */
    int nnext, nawait;   /* next and await calls */
    uint64_t await_id;   /* the id await was asked for */
    uint64_t next_id[2]; /* next's frames: next_id[0] first; 0 with next_err: unsolicited */
    int nnext_frames;
    /* next's side effect: heapd answers request ring_s in the ring */
    void *ring_mem;
    int answer_s;
    uint64_t answer_id;
} fake_side;

static int fake_readable(void *data)
{
    fake_side *f = data;
    f->nreadable++;
    int r = f->readable;
    f->readable = 0;
    return r;
}

static void frame_of(unsigned char *buf, size_t len, Heapd__Frame **m, hw_frame *raw)
{
    memset(raw, 0, sizeof *raw);
    raw->data = malloc(len + 1);
    memcpy(raw->data, buf, len);
    raw->len = len;
    *m = unpack(buf, len);
}

static int fake_next(void *data, int timeout_ms, Heapd__Frame **m, hw_frame *raw, hcx_err *e)
{
    fake_side *f = data;
    unsigned char buf[256];
    ck_assert_int_lt(f->nnext, f->nnext_frames);
    uint64_t id = f->next_id[f->nnext++];
    size_t len = id ? pack_alloc_reply(id, buf) : pack_error(0, "heapd is stopping", buf);
    frame_of(buf, len, m, raw);
    if (f->ring_mem && f->answer_s >= 0) {
        unsigned char r[256];
        size_t n = pack_alloc_reply(f->answer_id, r);
        hr_put(hr_resp_slot(f->ring_mem, G, (uint64_t)f->answer_s), (uint64_t)f->answer_s, f->answer_id, HR_KIND_FRAME,
               r, (uint32_t)n);
        f->answer_s = -1;
    }
    return HCX_OK;
}

static int fake_await(void *data, uint64_t id, int timeout_ms, Heapd__Frame **m, hw_frame *raw, hcx_err *e)
{
    fake_side *f = data;
    unsigned char buf[256];
    f->nawait++;
    f->await_id = id;
    frame_of(buf, pack_alloc_reply(id, buf), m, raw);
    return HCX_OK;
}

static const hcx_ops fake_ops = {
    .send = NULL,
    .await = fake_await,
    .next = fake_next,
    .readable = fake_readable,
};

/* A ring as heapd sets one up: its mapping here (heapd's side) and the ring. */
typedef struct rig {
    void *mem;
    hcr_ring *r;
    fake_side side;
} rig;

static void rig_open(rig *g)
{
    memset(g, 0, sizeof *g);
    g->side.answer_s = -1;
    setenv("HEAPC_RING_SPIN_US", "0", 1);
    int memfd = memfd_create("check_xport", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ck_assert_int_ge(memfd, 0);
    ck_assert_int_eq(ftruncate(memfd, (off_t)hr_size(G)), 0);
    /* as heapd's ring: libheapc refuses others (issue 33 item 7) */
    ck_assert_int_eq(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    g->mem = mmap(NULL, hr_size(G), PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    ck_assert_ptr_ne(g->mem, MAP_FAILED);
    hr_init(g->mem, G);
    int bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ck_assert_int_ge(bell, 0);
    char why[256];
    hcx side = {&fake_ops, &g->side};
    g->r = hcr_open(memfd, bell, G.nslots, G.slot_size, 1, side, why, sizeof why);
    ck_assert_msg(g->r != NULL, "hcr_open: %s", why);
    g->side.ring_mem = g->mem;
}

static void rig_close(rig *g)
{
    hcr_close(g->r);
    munmap(g->mem, hr_size(G));
}

/* Posts request id (an Alloc) as request s and checks heapd would read it. */
static void post(rig *g, uint64_t s, uint64_t id)
{
    Heapd__Alloc al = HEAPD__ALLOC__INIT;
    al.size = 4096;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = id;
    f.body_case = HEAPD__FRAME__BODY_ALLOC;
    f.alloc = &al;
    unsigned char buf[256], got[HR_SLOT_SIZE_DEFAULT];
    size_t len = heapd__frame__pack(&f, buf);
    ck_assert(hcr_ops.carries(g->r, f.body_case, len, 0));
    hcx_err e = {0};
    ck_assert_int_eq(hcr_ops.send(g->r, id, buf, len, NULL, 0, &e), HCX_OK);
    uint64_t rid;
    uint32_t rlen;
    ck_assert_int_eq(hr_take(hr_req_slot(g->mem, G, s), s, G, got, &rid, &rlen), HR_OK);
    ck_assert_uint_eq(rid, id);
    ck_assert_uint_eq(rlen, len);
}

static void answer(rig *g, uint64_t s, uint64_t id, uint32_t kind)
{
    unsigned char buf[256];
    size_t n = kind == HR_KIND_FRAME ? pack_alloc_reply(id, buf) : 0;
    hr_put(hr_resp_slot(g->mem, G, s), s, id, kind, buf, (uint32_t)n);
}

/* ---- the ring ------------------------------------------------------------------ */

START_TEST(ring_carries)
{
    rig g;
    rig_open(&g);
    ck_assert(hcr_ops.carries(g.r, HEAPD__FRAME__BODY_FREE, 100, 0));
    ck_assert(hcr_ops.carries(g.r, HEAPD__FRAME__BODY_COLLECT, 100, 0));
    ck_assert(!hcr_ops.carries(g.r, HEAPD__FRAME__BODY_ATTACH, 100, 0));
    ck_assert(!hcr_ops.carries(g.r, HEAPD__FRAME__BODY_STATS, 100, 0));
    ck_assert(!hcr_ops.carries(g.r, HEAPD__FRAME__BODY_ALLOC, 100, 1));
    ck_assert(!hcr_ops.carries(g.r, HEAPD__FRAME__BODY_FREE, hr_payload_max(G) + 1, 0));
    rig_close(&g);
}
END_TEST

START_TEST(ring_reply_marker_readable)
{
    rig g;
    rig_open(&g);
    Heapd__Frame *m;
    hw_frame raw;
    hcx_err e = {0};

    /* The reply in the response slot: the socket is not asked. */
    post(&g, 0, 1);
    answer(&g, 0, 1, HR_KIND_FRAME);
    ck_assert_int_eq(hcr_ops.await(g.r, 1, -1, &m, &raw, &e), HCX_OK);
    ck_assert_uint_eq(m->id, 1);
    ck_assert_int_eq(m->body_case, HEAPD__FRAME__BODY_ALLOC_REPLY);
    heapd__frame__free_unpacked(m, NULL);
    hw_frame_free(&raw);
    ck_assert_int_eq(g.side.nawait + g.side.nnext, 0);

    /* "Fetch it on the socket": the side's await, for this id, and for the
     * rest of its reply too (a ChunkBatch came first). */
    post(&g, 1, 2);
    answer(&g, 1, 2, HR_KIND_SOCKET);
    for (int i = 1; i <= 2; i++) {
        ck_assert_int_eq(hcr_ops.await(g.r, 2, -1, &m, &raw, &e), HCX_OK);
        ck_assert_int_eq(g.side.nawait, i);
        ck_assert_uint_eq(g.side.await_id, 2);
        heapd__frame__free_unpacked(m, NULL);
        hw_frame_free(&raw);
    }

    /* The socket readable while the ring is quiet: a stale frame there is
     * dropped, then the reply comes in the ring. */
    post(&g, 2, 3);
    g.side.readable = 1;
    g.side.next_id[0] = 2;
    g.side.nnext_frames = 1;
    g.side.answer_s = 2;
    g.side.answer_id = 3;
    ck_assert_int_eq(hcr_ops.await(g.r, 3, -1, &m, &raw, &e), HCX_OK);
    ck_assert_uint_eq(m->id, 3);
    ck_assert_int_eq(g.side.nnext, 1);
    ck_assert_int_ge(g.side.nreadable, 1);
    heapd__frame__free_unpacked(m, NULL);
    hw_frame_free(&raw);

    /* heapd's last words on the socket end the wait with them. */
    post(&g, 3, 4);
    g.side.readable = 1;
    g.side.next_id[1] = 0;
    g.side.nnext_frames = 2;
    ck_assert_int_eq(hcr_ops.await(g.r, 4, -1, &m, &raw, &e), HCX_OK);
    ck_assert_uint_eq(m->id, 0);
    ck_assert_int_eq(m->body_case, HEAPD__FRAME__BODY_ERROR);
    heapd__frame__free_unpacked(m, NULL);
    hw_frame_free(&raw);
    rig_close(&g);
}
END_TEST

START_TEST(ring_failures)
{
    rig g;
    rig_open(&g);
    Heapd__Frame *m;
    hw_frame raw;
    hcx_err e = {0};

    post(&g, 0, 1); /* no answer, a quiet socket */
    ck_assert_int_eq(hcr_ops.await(g.r, 1, 0, &m, &raw, &e), HCX_ETIMEOUT);
    ck_assert_int_eq(e.ring, 1);
    ck_assert_ptr_null(m);

    post(&g, 1, 2);
    answer(&g, 1, 7, HR_KIND_FRAME); /* another request's id */
    ck_assert_int_eq(hcr_ops.await(g.r, 2, -1, &m, &raw, &e), HCX_EPROTO);
    ck_assert_ptr_nonnull(strstr(e.why, "carries id 7 instead of 2"));

    post(&g, 2, 3);
    unsigned char junk[8] = {0xff, 0xff, 0xff};
    hr_put(hr_resp_slot(g.mem, G, 2), 2, 3, HR_KIND_FRAME, junk, sizeof junk);
    ck_assert_int_eq(hcr_ops.await(g.r, 3, -1, &m, &raw, &e), HCX_EDECODE);
    ck_assert_ptr_null(raw.data);
    rig_close(&g);
}
END_TEST

/* ---- the socket ---------------------------------------------------------------- */

static void peer_send(int fd, size_t len, const unsigned char *buf)
{
    char err[128];
    ck_assert_int_eq(hw_send_frame(fd, buf, len, NULL, 0, err, sizeof err), 0);
}

START_TEST(sock_await_drops_stale)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    hcs_sock s;
    hcs_init(&s);
    s.fd = sv[0];
    unsigned char buf[256];
    ck_assert(!hcs_ops.readable(&s));
    peer_send(sv[1], pack_alloc_reply(7, buf), buf);
    peer_send(sv[1], pack_alloc_reply(8, buf), buf);
    ck_assert(hcs_ops.readable(&s));
    Heapd__Frame *m;
    hw_frame raw;
    hcx_err e = {0};
    ck_assert_int_eq(hcs_ops.await(&s, 8, -1, &m, &raw, &e), HCX_OK);
    ck_assert_uint_eq(m->id, 8);
    heapd__frame__free_unpacked(m, NULL);
    hw_frame_free(&raw);
    ck_assert_int_eq(hcs_ops.await(&s, 9, 0, &m, &raw, &e), HCX_ETIMEOUT);

    /* heapd's last words, then its hang-up. */
    peer_send(sv[1], pack_error(0, "heapd is stopping", buf), buf);
    int code;
    char msg[64];
    ck_assert_int_eq(hcs_last_words(&s, &code, msg, sizeof msg), 1);
    ck_assert_int_eq(code, HEAPD__ERR_CODE__ERR_SHUTDOWN);
    ck_assert_str_eq(msg, "heapd is stopping");
    ck_assert_int_eq(hcs_last_words(&s, &code, msg, sizeof msg), 0);
    close(sv[1]);
    ck_assert_int_eq(hcs_ops.await(&s, 9, -1, &m, &raw, &e), HCX_ECLOSED);
    ck_assert_int_eq(e.ring, 0);
    hcs_close(&s);
    ck_assert_int_eq(s.fd, -1);
}
END_TEST

/* Issue 33 item 7: a ring memfd without seals, or short, and a doorbell
 * that is no eventfd are refused (a truncated ring would fault at the next
 * request, a pipe doorbell raise SIGPIPE). */
START_TEST(ring_refuses_bad_fds)
{
    char why[256];
    hcx side = {&fake_ops, NULL};
    int seals[3] = {0, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL};
    size_t size[3] = {hr_size(G), 100, hr_size(G)};
    const char *want[3] = {"lacks the seals F_SEAL_SHRINK F_SEAL_GROW F_SEAL_SEAL", "less than", "not an eventfd"};
    for (int i = 0; i < 3; i++) {
        int memfd = memfd_create("check_xport", MFD_CLOEXEC | MFD_ALLOW_SEALING), p[2];
        ck_assert_int_eq(ftruncate(memfd, (off_t)size[i]), 0);
        ck_assert_int_eq(seals[i] ? fcntl(memfd, F_ADD_SEALS, seals[i]) : 0, 0);
        ck_assert_int_eq(pipe(p), 0);
        int bell = i == 2 ? p[1] : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (i != 2)
            close(p[1]);
        close(p[0]);
        ck_assert_ptr_null(hcr_open(memfd, bell, G.nslots, G.slot_size, 1, side, why, sizeof why));
        ck_assert_msg(strstr(why, want[i]), "case %d: %s", i, why);
    }
}
END_TEST

/* Issue 33 item 7: a frame whose header came and whose rest never does
 * ends after the stall limit even with no timeout (-1): HCX_ESTALL. */
/* HEAPD_TRANSPORT (or its alias HEAPC_TRANSPORT): ring, socket, or an
 * error naming the variable that was set. */
START_TEST(transport_env)
{
    char why[200];
    unsetenv("HEAPD_TRANSPORT");
    unsetenv("HEAPC_TRANSPORT");
    ck_assert_int_eq(hcr_wanted(why, sizeof why), 1);
    setenv("HEAPD_TRANSPORT", "socket", 1);
    ck_assert_int_eq(hcr_wanted(why, sizeof why), 0);
    setenv("HEAPD_TRANSPORT", "pigeon", 1);
    ck_assert_int_eq(hcr_wanted(why, sizeof why), -1);
    ck_assert_msg(strstr(why, "HEAPD_TRANSPORT=pigeon"), "%s", why);
    unsetenv("HEAPD_TRANSPORT");
    setenv("HEAPC_TRANSPORT", "carrier", 1);
    ck_assert_int_eq(hcr_wanted(why, sizeof why), -1);
    ck_assert_msg(strstr(why, "HEAPC_TRANSPORT=carrier"), "%s", why);
    unsetenv("HEAPC_TRANSPORT");
}
END_TEST

START_TEST(sock_stall_bounded)
{
    setenv("HEAPC_FRAME_TIMEOUT_MS", "200", 1);
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    hcs_sock s;
    hcs_init(&s);
    unsetenv("HEAPC_FRAME_TIMEOUT_MS");
    ck_assert_int_eq(s.stall_ms, 200);
    s.fd = sv[0];
    unsigned char hdr[8] = {10, 0, 0, 0, 2, 0, 0, 0}; /* 10 bytes and 2 fds, never sent */
    ck_assert_int_eq(write(sv[1], hdr, sizeof hdr), (ssize_t)sizeof hdr);
    Heapd__Frame *m;
    hw_frame raw;
    hcx_err e = {0};
    ck_assert_int_eq(hcs_ops.await(&s, 1, -1, &m, &raw, &e), HCX_ESTALL);
    ck_assert_msg(strstr(e.why, "within 200 ms"), "%s", e.why);
    hcs_close(&s);
    close(sv[1]);
    hcs_init(&s);
    ck_assert_int_eq(s.stall_ms, HEAPC_FRAME_TIMEOUT_MS);
}
END_TEST

static Suite *xport_suite(void)
{
    Suite *s = suite_create("xport");
    TCase *tc = tcase_create("ring");
    tcase_add_test(tc, ring_carries);
    tcase_add_test(tc, ring_reply_marker_readable);
    tcase_add_test(tc, ring_failures);
    tcase_add_test(tc, ring_refuses_bad_fds);
    suite_add_tcase(s, tc);
    tc = tcase_create("socket");
    tcase_add_test(tc, sock_await_drops_stale);
    tcase_add_test(tc, sock_stall_bounded);
    tcase_add_test(tc, transport_env);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(xport_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
