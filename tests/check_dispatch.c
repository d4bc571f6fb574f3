/*
 * check_dispatch.c - unit tests for daemon/dispatch.c through its session
 * entry point (hd_dispatch_session_new, hd_dispatch_frame): no socket, no
 * server; frames go in as bytes, answers come back through a recording sink
 * (the heap wing's hd_reply_ops) and recording client ops (HelloReply,
 * close). The heap wing behind it is the real one (host backend, a loop of
 * the test's own).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "check_util.h"
#include "dispatch.h"
#include "log.h"

typedef struct got {
    int errors, hellos, closes, attaches, allocs;
    Heapd__ErrCode code;
    char msg[1500];
    uint64_t id, offset;
} got;

static got g[2];

static int idx(const hd_peer *p) { return (int)(intptr_t)p->data; }

static void close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

static void s_error(hd_peer *p, uint64_t id, Heapd__ErrCode code, const char *msg)
{
    got *x = &g[idx(p)];
    x->errors++;
    x->code = code;
    x->id = id;
    snprintf(x->msg, sizeof x->msg, "%s", msg);
}
static void s_attach(hd_peer *p, uint64_t id, const hd_attach_out *a)
{
    (void)id;
    g[idx(p)].attaches++;
    close_fds(a->fds, a->nfds);
}
static void s_alloc(hd_peer *p, uint64_t id, const hd_alloc_out *a)
{
    (void)id;
    g[idx(p)].allocs++;
    g[idx(p)].offset = a->offset;
    close_fds(a->fds, a->nchunks);
}
static void s_free(hd_peer *p, uint64_t id, uint32_t n) { (void)p, (void)id, (void)n; }
static void s_collect(hd_peer *p, uint64_t id, uint64_t b, uint64_t by, uint64_t n)
{
    (void)p, (void)id, (void)b, (void)by, (void)n;
}
static void s_detach(hd_peer *p, uint64_t id) { (void)p, (void)id; }
static void s_force(hd_peer *p, uint64_t id, uint64_t at) { (void)p, (void)id, (void)at; }
static void s_stats(hd_peer *p, uint64_t id, const hd_stats_out *s) { (void)p, (void)id, (void)s; }
static const hd_reply_ops sink = {s_error, s_attach, s_alloc, s_free, s_collect, s_detach, s_force, s_stats};

static void c_hello(hd_peer *p, uint64_t id, const char *backend)
{
    g[idx(p)].hellos++;
    g[idx(p)].id = id;
    ck_assert_str_eq(backend, "host");
}
static void c_close(hd_peer *p) { g[idx(p)].closes++; }
static const hd_client_ops cops = {c_hello, c_close};

static uv_loop_t loop;
static hb_backend *be;
static hd_registry *reg;
static hd_dispatch *disp;
static hd_session *s[2];
static int fds_before;

static int privileged(const hd_peer *p, long gid)
{
    (void)gid;
    return p->uid == 0;
}

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
    for (int i = 0; i < 2; i++) {
        hd_peer p = {0};
        p.pid = 2000 + i;
        p.uid = 4242;
        p.privileged = privileged;
        p.out = &sink;
        p.data = (void *)(intptr_t)i;
        ck_assert_ptr_nonnull(s[i] = hd_dispatch_session_new(&p, &cops));
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
    hd_dispatch_frame(disp, s[i], buf, n, nfds);
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
    hello(0, HEAPD__CONST__PROTOCOL_VERSION);
    ck_assert_int_eq(g[0].hellos, 1);
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
    hd_dispatch_frame(disp, s[0], junk, sizeof junk, 0);
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

static Suite *dispatch_suite(void)
{
    Suite *su = suite_create("dispatch");
    TCase *tc = tcase_create("sessions");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, hello_first);
    tcase_add_test(tc, version_mismatch_closes);
    tcase_add_test(tc, bad_bytes_and_fds);
    tcase_add_test(tc, frames_reach_the_wing);
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
