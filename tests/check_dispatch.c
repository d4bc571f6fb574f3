/*
 * check_dispatch.c - unit tests for daemon/dispatch.c through its session
 * entry points (hd_dispatch_session_new, hd_dispatch_frame): no socket, no
 * server; frames go in as bytes, answers come back as frames through each
 * client's recording frame sink (reply.c builds them), decoded here. The
 * heap wing behind it is the real one (host backend, a loop of the test's
 * own); with rings on, RingSetup opens a real ring.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <uv.h>

#include "check_util.h"
#include "dispatch.h"
#include "ring.h"
#include "log.h"
#include "ring_layout.h"

typedef struct got {
    int errors, hellos, closes, admits, attaches, allocs, ring_setups, frames;
    Heapd__ErrCode code;
    char msg[1500];
    uint64_t id, offset;
    int ring_fds[2];
} got;

static got g[2];

static void close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

/* Client i's frame sink: decodes what reply.c sent and records it. */
static void rec_send(void *data, uint64_t id, const void *msg, size_t len, hd_frame_sink_pack_fn pack, int *fds,
                     size_t nfds)
{
    got *x = &g[(intptr_t)data];
    uint8_t *buf = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(buf);
    pack(msg, buf);
    Heapd__Frame *f = heapd__frame__unpack(NULL, len, buf);
    free(buf);
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->id, id);
    x->frames++;
    x->id = id;
    switch (f->body_case) {
    case HEAPD__FRAME__BODY_ERROR:
        x->errors++;
        x->code = f->error->code;
        snprintf(x->msg, sizeof x->msg, "%s", f->error->message);
        break;
    case HEAPD__FRAME__BODY_HELLO_REPLY:
        x->hellos++;
        ck_assert_str_eq(f->hello_reply->backend, "host");
        break;
    case HEAPD__FRAME__BODY_ATTACH_REPLY:
        x->attaches++;
        break;
    case HEAPD__FRAME__BODY_ALLOC_REPLY:
        x->allocs++;
        x->offset = f->alloc_reply->offset;
        break;
    case HEAPD__FRAME__BODY_RING_SETUP_REPLY:
        x->ring_setups++;
        ck_assert_uint_eq(nfds, 2);
        x->ring_fds[0] = fds[0];
        x->ring_fds[1] = fds[1];
        nfds = 0; /* the test's */
        break;
    default:
        break;
    }
    heapd__frame__free_unpacked(f, NULL);
    close_fds(fds, nfds);
}
static void rec_admit(void *data) { g[(intptr_t)data].admits++; }
static void rec_close(void *data) { g[(intptr_t)data].closes++; }
static const hd_frame_sink_ops rec_ops = {rec_send, rec_admit, rec_close};

static int privileged(void *data, long gid)
{
    (void)data, (void)gid;
    return 0;
}

static uv_loop_t loop;
static hb_backend *be;
static hd_registry *reg;
static hd_dispatch *disp;
static hd_session *s[2];
static int fds_before;

static void setup(void)
{
    char err[256];
    fds_before = cku_count_fds();
    memset(g, 0, sizeof g);
    hd_log_set_level(HD_LOG_ERROR);
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_msg(hb_open("host", &be, err, sizeof err) == 0, "%s", err);
    hd_config cfg;
    hd_config_defaults(&cfg);
    cfg.chunk_size = 1 << 20;
    ck_assert_int_eq(hd_registry_create(&loop, be, &cfg, &reg), 0);
    ck_assert_int_eq(hd_dispatch_create(reg, "host", &disp), 0);
    hd_ring_opts ro = {.spin_us = 0, .backoff_us = 0};
    ck_assert_int_eq(hd_dispatch_rings(disp, &loop, &ro), 0);
    for (int i = 0; i < 2; i++) {
        hd_client c = {.pid = 2000 + i,
                       .uid = 4242,
                       .privileged = privileged,
                       .sink = {&rec_ops, (void *)(intptr_t)i},
                       .rings = i == 0};
        ck_assert_ptr_nonnull(s[i] = hd_dispatch_session_new(&c));
    }
}

static void teardown(void)
{
    for (int i = 0; i < 2; i++)
        hd_dispatch_closed(disp, s[i]);
    hd_dispatch_destroy(disp);
    hd_registry_destroy(reg);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    hb_close(be);
    ck_assert_int_eq(cku_count_fds(), fds_before);
}

static void send_f(int i, Heapd__Frame *f, size_t nfds)
{
    uint8_t buf[1024];
    size_t n = heapd__frame__pack(f, buf);
    hd_frame_in in = {.via = HD_VIA_STREAM, .data = buf, .len = n, .nfds = nfds};
    hd_dispatch_frame(disp, s[i], &in);
    char why[512];
    ck_assert_msg(hd_heap_validate(reg, why, sizeof why) == 0, "%s", why);
}

static void hello(int i, uint32_t version)
{
    Heapd__Hello m = HEAPD__HELLO__INIT;
    m.version = version;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 7;
    f.body_case = HEAPD__FRAME__BODY_HELLO;
    f.hello = &m;
    send_f(i, &f, 0);
}

static void attach(int i)
{
    Heapd__Attach m = HEAPD__ATTACH__INIT;
    m.heap = (char *)"h";
    m.world_size = 2;
    m.rank = (uint32_t)i;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 8;
    f.body_case = HEAPD__FRAME__BODY_ATTACH;
    f.attach = &m;
    send_f(i, &f, 0);
}

START_TEST(hello_first)
{
    attach(0);
    ck_assert_int_eq(g[0].errors, 1);
    ck_assert_int_eq(g[0].code, HEAPD__ERR_CODE__ERR_PROTOCOL);
    ck_assert_str_eq(g[0].msg, "the first message must be Hello");
    ck_assert_int_eq(g[0].attaches, 0);
    ck_assert_int_eq(g[0].admits, 0);
    hello(0, HEAPD__CONST__PROTOCOL_VERSION);
    ck_assert_int_eq(g[0].hellos, 1);
    ck_assert_int_eq(g[0].admits, 1);
    ck_assert_uint_eq(g[0].id, 7);
    hello(0, HEAPD__CONST__PROTOCOL_VERSION);
    ck_assert_int_eq(g[0].errors, 2);
    ck_assert_str_eq(g[0].msg, "Hello was already sent on this connection");
}
END_TEST

START_TEST(version_mismatch_closes)
{
    hello(1, 99);
    ck_assert_int_eq(g[1].hellos, 0);
    ck_assert_int_eq(g[1].closes, 1);
    ck_assert_int_eq(g[1].code, HEAPD__ERR_CODE__ERR_VERSION);
    ck_assert_msg(strstr(g[1].msg, "protocol version 99 is not supported"), "%s", g[1].msg);
}
END_TEST

START_TEST(bad_bytes_and_fds)
{
    static const uint8_t junk[] = {0x08, 0x01, 0x12, 0x00, 0xff};
    hd_frame_in in = {.data = junk, .len = sizeof junk};
    hd_dispatch_frame(disp, s[0], &in);
    ck_assert_int_eq(g[0].code, HEAPD__ERR_CODE__ERR_PROTOCOL);
    ck_assert_str_eq(g[0].msg, "a 5-byte frame is not a valid heapd.Frame message");
    hello(0, HEAPD__CONST__PROTOCOL_VERSION);
    Heapd__Stats m = HEAPD__STATS__INIT;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 9;
    f.body_case = HEAPD__FRAME__BODY_STATS;
    f.stats = &m;
    send_f(0, &f, 2);
    ck_assert_uint_eq(g[0].id, 9);
    ck_assert_msg(strstr(g[0].msg, "clients send no file descriptors: 2 received"), "%s", g[0].msg);
}
END_TEST

START_TEST(frames_reach_the_wing)
{
    for (int i = 0; i < 2; i++) {
        hello(i, HEAPD__CONST__PROTOCOL_VERSION);
        attach(i);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(g[i].attaches, 1);
        ck_assert_ptr_nonnull(hd_dispatch_session_peer(s[i])->bind.heap);
        Heapd__Alloc m = HEAPD__ALLOC__INIT;
        m.seq = 0;
        m.size = 4096;
        Heapd__Frame f = HEAPD__FRAME__INIT;
        f.id = 10;
        f.body_case = HEAPD__FRAME__BODY_ALLOC;
        f.alloc = &m;
        send_f(i, &f, 0);
        ck_assert_int_eq(g[i].allocs, 1);
    }
    ck_assert_uint_eq(g[0].offset, g[1].offset);
    ck_assert_int_eq(g[0].errors + g[1].errors, 0);
}
END_TEST

/* ---- a request ring (issue 16) ------------------------------------------ */

typedef struct cli_ring {
    void *mem;
    size_t size;
    hr_geom geom;
    uint64_t next; /* the next request's number */
} cli_ring;

/* RingSetup on client i's stream: the ring mapped as libheapc would. */
static void ring_setup(int i, cli_ring *r)
{
    Heapd__RingSetup m = HEAPD__RING_SETUP__INIT;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 20;
    f.body_case = HEAPD__FRAME__BODY_RING_SETUP;
    f.ring_setup = &m;
    send_f(i, &f, 0);
    ck_assert_int_eq(g[i].ring_setups, 1);
    r->geom = (hr_geom){HR_NSLOTS_DEFAULT, HR_SLOT_SIZE_DEFAULT};
    r->size = hr_size(r->geom);
    r->mem = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, g[i].ring_fds[0], 0);
    ck_assert_ptr_ne(r->mem, MAP_FAILED);
    r->next = 0;
}

static void ring_unmap(int i, cli_ring *r)
{
    munmap(r->mem, r->size);
    close_fds(g[i].ring_fds, 2);
}

/* Posts f into the ring with the slot id `slot_id`, rings the doorbell, and
 * runs the loop until its response slot is written or client i was closed.
 * Returns the response's kind (HR_KIND_*), or -1 when it was closed. */
static int ring_call(int i, cli_ring *r, const Heapd__Frame *f, uint64_t slot_id, Heapd__Frame **reply)
{
    uint8_t buf[HR_SLOT_SIZE_DEFAULT];
    size_t n = heapd__frame__pack(f, buf);
    uint64_t sn = r->next++;
    hr_put(hr_req_slot(r->mem, r->geom, sn), sn, slot_id, HR_KIND_REQUEST, buf, (uint32_t)n);
    uint64_t one = 1;
    ck_assert_int_eq(write(g[i].ring_fds[1], &one, sizeof one), (ssize_t)sizeof one);
    int closes = g[i].closes;
    uint64_t id;
    uint32_t len, kind;
    for (int turn = 0; turn < 1000; turn++) {
        int rc = hr_read_resp(hr_resp_slot(r->mem, r->geom, sn), sn, r->geom, buf, &id, &len, &kind);
        if (rc == HR_OK) {
            ck_assert_uint_eq(id, slot_id);
            *reply = kind == HR_KIND_FRAME ? heapd__frame__unpack(NULL, len, buf) : NULL;
            return (int)kind;
        }
        ck_assert_int_eq(rc, HR_EMPTY);
        if (g[i].closes > closes)
            return -1;
        uv_run(&loop, UV_RUN_ONCE);
    }
    ck_abort_msg("no response to ring request %llu", (unsigned long long)sn);
    return -1;
}

START_TEST(ring_answers_in_the_ring)
{
    cli_ring r;
    hello(0, HEAPD__CONST__PROTOCOL_VERSION);
    ring_setup(0, &r);
    /* Stats does not travel on a ring: its Error answers in the ring. */
    Heapd__Stats st = HEAPD__STATS__INIT;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 30;
    f.body_case = HEAPD__FRAME__BODY_STATS;
    f.stats = &st;
    int frames = g[0].frames;
    Heapd__Frame *a = NULL;
    ck_assert_int_eq(ring_call(0, &r, &f, 30, &a), HR_KIND_FRAME);
    ck_assert_ptr_nonnull(a);
    ck_assert_int_eq(a->body_case, HEAPD__FRAME__BODY_ERROR);
    ck_assert_uint_eq(a->id, 30);
    ck_assert_msg(strstr(a->error->message, "does not travel on a request ring"), "%s", a->error->message);
    heapd__frame__free_unpacked(a, NULL);
    ck_assert_int_eq(g[0].frames, frames); /* nothing on the stream */
    /* An Alloc before Attach: the wing's Error, in the ring too. */
    Heapd__Alloc al = HEAPD__ALLOC__INIT;
    al.size = 4096;
    f.id = 31;
    f.body_case = HEAPD__FRAME__BODY_ALLOC;
    f.alloc = &al;
    ck_assert_int_eq(ring_call(0, &r, &f, 31, &a), HR_KIND_FRAME);
    ck_assert_int_eq(a->body_case, HEAPD__FRAME__BODY_ERROR);
    heapd__frame__free_unpacked(a, NULL);
    /* A second RingSetup is refused (on the stream). */
    Heapd__RingSetup rs = HEAPD__RING_SETUP__INIT;
    f.id = 32;
    f.body_case = HEAPD__FRAME__BODY_RING_SETUP;
    f.ring_setup = &rs;
    send_f(0, &f, 0);
    ck_assert_str_eq(g[0].msg, "this connection already has a request ring");
    /* A slot whose frame has another id breaks the ring: an unsolicited
     * Error on the stream, and the client is closed. */
    f.id = 33;
    f.body_case = HEAPD__FRAME__BODY_ALLOC;
    f.alloc = &al;
    ck_assert_int_eq(ring_call(0, &r, &f, 34, &a), -1);
    ck_assert_int_eq(g[0].closes, 1);
    ck_assert_uint_eq(g[0].id, 0);
    ck_assert_int_eq(g[0].code, HEAPD__ERR_CODE__ERR_PROTOCOL);
    ck_assert_msg(strstr(g[0].msg, "its request ring is corrupt (request id 34: the frame in the slot has another id)"),
                  "%s", g[0].msg);
    ring_unmap(0, &r);
}
END_TEST

/* 1 if a message of d has a string field, at any depth. */
static int has_strings(const ProtobufCMessageDescriptor *d)
{
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].type == PROTOBUF_C_TYPE_STRING ||
            (d->fields[i].type == PROTOBUF_C_TYPE_MESSAGE && has_strings(d->fields[i].descriptor)))
            return 1;
    return 0;
}

/* dispatch.c walks no ring request for NULs in strings but a named Alloc:
 * what else a ring carries (Free, Collect) must have none. */
START_TEST(ring_bodies_have_no_strings)
{
    ck_assert(has_strings(&heapd__alloc__descriptor)); /* its name: dispatch walks named Allocs */
    ck_assert(!has_strings(&heapd__free__descriptor));
    ck_assert(!has_strings(&heapd__collect__descriptor));
    ck_assert(has_strings(&heapd__attach__descriptor));
}
END_TEST

START_TEST(ring_refused_without_fds)
{
    hello(1, HEAPD__CONST__PROTOCOL_VERSION);
    Heapd__RingSetup m = HEAPD__RING_SETUP__INIT;
    Heapd__Frame f = HEAPD__FRAME__INIT;
    f.id = 20;
    f.body_case = HEAPD__FRAME__BODY_RING_SETUP;
    f.ring_setup = &m;
    send_f(1, &f, 0);
    ck_assert_int_eq(g[1].ring_setups, 0);
    ck_assert_int_eq(g[1].code, HEAPD__ERR_CODE__ERR_STATE);
    ck_assert_str_eq(g[1].msg, "request rings are for socket connections only");
}
END_TEST

static Suite *dispatch_suite(void)
{
    Suite *su = suite_create("dispatch");
    TCase *tc = tcase_create("sessions");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, hello_first);
    tcase_add_test(tc, version_mismatch_closes);
    tcase_add_test(tc, bad_bytes_and_fds);
    tcase_add_test(tc, frames_reach_the_wing);
    tcase_add_test(tc, ring_answers_in_the_ring);
    tcase_add_test(tc, ring_refused_without_fds);
    tcase_add_test(tc, ring_bodies_have_no_strings);
    suite_add_tcase(su, tc);
    return su;
}

int main(void)
{
    /* libuv's first loop opens a process-wide pipe it never closes: open it
     * before any test counts fds. */
    uv_loop_t l;
    if (uv_loop_init(&l) == 0)
        uv_loop_close(&l);
    return cku_run(dispatch_suite());
}
