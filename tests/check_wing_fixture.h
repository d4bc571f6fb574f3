/* check_wing_fixture.h - what the heap wing's unit tests (check_heap.c,
 * check_persist.c, and check_names.c and check_commit.c through
 * check_wing.h) share: a libuv loop of the test's own, the host backend, a
 * registry, NPEER peers answered by the test's recording sink, the fd
 * count that teardown checks, the validator, and main's suite runner.
 * The includer defines NPEER (default 4) first. Header only, like
 * check_util.h: each test is one program. */
#ifndef HEAPD_CHECK_WING_FIXTURE_H
#define HEAPD_CHECK_WING_FIXTURE_H

#include <check.h>
#include <stdint.h>
#include <string.h>

#include <uv.h>

#include "check_util.h"
#include "heap.h"

#ifndef NPEER
#define NPEER 4
#endif

static uv_loop_t loop;
static hb_backend *be;
static hd_registry *reg;
static hd_peer peers[NPEER];
static int fds_before;

static inline int ckw_privileged(const hd_peer *p, long gid)
{
    (void)gid;
    return p->uid == 0;
}

/* A registry of config `cfg` on a fresh loop and host backend; peer i has
 * pid pid0 + i, uid 4242, data i, and `sink` for its answers. */
static inline void ckw_start(const hd_config *cfg, const hd_reply_ops *sink, int pid0)
{
    char err[256];
    fds_before = cku_count_fds();
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_msg(hb_open("host", &be, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(hd_registry_create(&loop, be, cfg, &reg), 0);
    for (int i = 0; i < NPEER; i++) {
        memset(&peers[i], 0, sizeof peers[i]);
        peers[i].pid = pid0 + i;
        peers[i].uid = 4242;
        peers[i].privileged = ckw_privileged;
        peers[i].out = sink;
        peers[i].data = (void *)(intptr_t)i;
    }
}

/* Closes every peer and releases every heap, detached ones too (what
 * stopping heapd does); then no fd of the test stays open. */
static inline void ckw_stop(void)
{
    for (int i = 0; i < NPEER; i++)
        hd_heap_conn_closed(reg, &peers[i]);
    hd_registry_destroy(reg);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    hb_close(be);
    ck_assert_int_eq(cku_count_fds(), fds_before);
}

static inline void validate(void)
{
    char why[512];
    ck_assert_msg(hd_heap_validate(reg, why, sizeof why) == 0, "%s", why);
}

/* main's body: runs `s` (cku_run) after libuv's first loop has opened the
 * process-wide pipe it never closes, before any test counts fds. */
static inline int ckw_main(Suite *s)
{
    uv_loop_t l;
    if (uv_loop_init(&l) == 0)
        uv_loop_close(&l);
    return cku_run(s);
}

#endif
