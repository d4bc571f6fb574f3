/*
 * check_ringd.c - unit tests for heapd's side of the request rings
 * (daemon/ring.c) and the ring's frame sink in front of a socket's
 * (daemon/ring_sink.c). The test is the client: it maps the ring it was
 * given and writes request slots with common/ring_layout.h, as libheapc does, rings
 * the doorbell, and runs its own libuv loop until heapd's side reached the
 * state it waits for. Covers on_request (ids, payload copies, order, the
 * window of nslots unanswered requests), hd_ring_answer (into the response
 * slot; the socket marker for fds or a payload too large; unknown ids),
 * on_corrupt (a torn slot, a reused id), and the ring sink's routing.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <uv.h>

#include "check_util.h"
#include "../daemon/ring.h"
#include "../daemon/ring_sink.h"
#include "ring_layout.h"

#define MAXREQ 16

static uv_loop_t loop;
static hd_rings *rings;
static hd_ring *ring;
static hd_ring_setup su;
static void *mem;
static hr_geom geom;
static int owner; /* the ring's data */
static int fds_before;

static struct {
    int n, corrupt;
    uint64_t id[MAXREQ];
    char payload[MAXREQ][64];
    char why[256];
} seen;

static void on_request(void *arg, hd_ring *r, void *data, uint64_t id, const uint8_t *p, size_t len)
{
    ck_assert_ptr_eq(arg, &seen);
    ck_assert_ptr_eq(r, ring);
    ck_assert_ptr_eq(data, &owner);
    ck_assert_int_lt(seen.n, MAXREQ);
    ck_assert_uint_lt(len, sizeof seen.payload[0]);
    seen.id[seen.n] = id;
    memcpy(seen.payload[seen.n], p, len);
    seen.payload[seen.n][len] = 0;
    seen.n++;
}

static void on_corrupt(void *arg, hd_ring *r, void *data, const char *why)
{
    ck_assert_ptr_eq(arg, &seen);
    ck_assert_ptr_eq(r, ring);
    ck_assert_ptr_eq(data, &owner);
    seen.corrupt++;
    snprintf(seen.why, sizeof seen.why, "%s", why);
}

static const hd_ring_handlers handlers = {on_request, on_corrupt};

/* The rings with no spin and no back-off: a quiet ring sleeps at once. */
static void rings_create(void)
{
    hd_ring_opts o = {.spin_us = 0, .backoff_us = 0};
    ck_assert_int_eq(hd_rings_create(&loop, &o, &handlers, &seen, &rings), 0);
}

static void setup(void)
{
    char err[256];
    fds_before = cku_count_fds();
    memset(&seen, 0, sizeof seen);
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    rings_create();
    ck_assert_msg(hd_ring_open(rings, &owner, &ring, &su, err, sizeof err) == 0, "%s", err);
    geom = (hr_geom){su.nslots, su.slot_size};
    ck_assert_int_eq(hr_geom_ok(geom), 0);
    mem = mmap(NULL, hr_size(geom), PROT_READ | PROT_WRITE, MAP_SHARED, su.memfd, 0);
    ck_assert_ptr_ne(mem, MAP_FAILED);
    char why[128];
    ck_assert_msg(hr_header_check(mem, hr_size(geom), &geom, why, sizeof why) == 0, "%s", why);
}

static void teardown(void)
{
    hd_ring_close(ring);
    hd_rings_destroy(rings);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    munmap(mem, hr_size(geom));
    close(su.memfd);
    close(su.doorbell);
    ck_assert_int_eq(cku_count_fds(), fds_before);
}

static const hr_header *hdr(void) { return mem; }

/* Request s with id and a string payload, as a client posts it; the
 * doorbell when heapd sleeps. */
static void post(uint64_t s, uint64_t id, const char *payload)
{
    hr_put(hr_req_slot(mem, geom, s), s, id, HR_KIND_REQUEST, payload, (uint32_t)strlen(payload));
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&((hr_header *)mem)->srv_sleeping)) {
        uint64_t one = 1;
        ck_assert_int_eq(write(su.doorbell, &one, sizeof one), (ssize_t)sizeof one);
    }
}

/* Runs the loop until heapd took n requests or saw corruption. */
static void run_until(int n)
{
    for (int turn = 0; turn < 10000 && seen.n < n && !seen.corrupt; turn++)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_ge(seen.n, n);
}

static void pack_str(const void *msg, uint8_t *out) { memcpy(out, msg, strlen(msg)); }

static int answer(uint64_t id, const char *msg, size_t nfds)
{
    return hd_ring_answer(ring, id, msg, strlen(msg), pack_str, nfds);
}

/* Response s: its kind, id and payload (HR_EMPTY when not written). */
static int response(uint64_t s, uint64_t *id, char *buf, uint32_t *kind)
{
    static unsigned char pl[HR_SLOT_SIZE_MAX];
    uint32_t len;
    int rc = hr_read_resp(hr_resp_slot(mem, geom, s), s, geom, pl, id, &len, kind);
    if (rc == HR_OK) {
        memcpy(buf, pl, len);
        buf[len] = 0;
    }
    return rc;
}

START_TEST(requests_and_answers)
{
    ck_assert_uint_eq(atomic_load(&hdr()->srv_sleeping), 1); /* asleep from the start */
    post(0, 5, "alloc");
    post(1, 9, "free");
    run_until(2);
    ck_assert_int_eq(seen.n, 2);
    ck_assert_uint_eq(seen.id[0], 5);
    ck_assert_str_eq(seen.payload[0], "alloc");
    ck_assert_uint_eq(seen.id[1], 9);
    ck_assert_str_eq(seen.payload[1], "free");
    /* Answers in any order, each into its request's response slot. */
    uint32_t futex = atomic_load(&hdr()->resp_futex);
    ck_assert_int_eq(answer(9, "freed", 0), 0);
    ck_assert_int_eq(answer(5, "offset 0", 0), 0);
    ck_assert_uint_eq(atomic_load(&hdr()->resp_futex), futex + 2);
    uint64_t id;
    uint32_t kind;
    char buf[HR_SLOT_SIZE_MAX];
    ck_assert_int_eq(response(0, &id, buf, &kind), HR_OK);
    ck_assert_uint_eq(id, 5);
    ck_assert_uint_eq(kind, HR_KIND_FRAME);
    ck_assert_str_eq(buf, "offset 0");
    ck_assert_int_eq(response(1, &id, buf, &kind), HR_OK);
    ck_assert_uint_eq(id, 9);
    ck_assert_str_eq(buf, "freed");
    ck_assert_int_eq(response(2, &id, buf, &kind), HR_EMPTY);
    /* An id answered already, one never asked, and no ring: -1. */
    ck_assert_int_eq(answer(5, "again", 0), -1);
    ck_assert_int_eq(answer(77, "who", 0), -1);
    ck_assert_int_eq(hd_ring_answer(NULL, 5, "x", 1, pack_str, 0), -1);
    ck_assert_int_eq(seen.corrupt, 0);
}
END_TEST

START_TEST(fds_or_size_leave_the_socket_marker)
{
    post(0, 1, "attach-ish");
    post(1, 2, "big");
    run_until(2);
    ck_assert_int_eq(answer(1, "with an fd", 1), 1);
    char *big = malloc(hr_payload_max(geom) + 2);
    ck_assert_ptr_nonnull(big);
    memset(big, 'x', hr_payload_max(geom) + 1);
    big[hr_payload_max(geom) + 1] = 0;
    ck_assert_int_eq(answer(2, big, 0), 1);
    free(big);
    uint64_t id;
    uint32_t kind;
    char buf[HR_SLOT_SIZE_MAX];
    ck_assert_int_eq(response(0, &id, buf, &kind), HR_OK);
    ck_assert_uint_eq(kind, HR_KIND_SOCKET);
    ck_assert_uint_eq(id, 1);
    ck_assert_str_eq(buf, "");
    ck_assert_int_eq(response(1, &id, buf, &kind), HR_OK);
    ck_assert_uint_eq(kind, HR_KIND_SOCKET);
    ck_assert_uint_eq(id, 2);
}
END_TEST

START_TEST(window_of_nslots)
{
    char p[16];
    for (uint64_t s = 0; s < geom.nslots; s++) {
        snprintf(p, sizeof p, "r%llu", (unsigned long long)s);
        post(s, 100 + s, p);
    }
    run_until((int)geom.nslots);
    /* A hostile client posts request N before it read response 0: heapd
     * does not take it while N requests are unanswered. */
    post(geom.nslots, 100 + geom.nslots, "over");
    for (int k = 0; k < 4; k++)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(seen.n, (int)geom.nslots);
    ck_assert_int_eq(answer(100, "done", 0), 0);
    run_until((int)geom.nslots + 1);
    ck_assert_uint_eq(seen.id[geom.nslots], 100 + geom.nslots);
    ck_assert_str_eq(seen.payload[geom.nslots], "over");
    ck_assert_int_eq(seen.corrupt, 0);
}
END_TEST

START_TEST(torn_slot_is_corrupt)
{
    post(0, 1, "fine");
    run_until(1);
    hr_slot *sl = hr_req_slot(mem, geom, 1);
    hr_put(sl, 1, 2, HR_KIND_REQUEST, "torn", 4);
    sl->payload[0] ^= 0x40; /* after the checksum: a scribbled write */
    uint64_t one = 1;
    ck_assert_int_eq(write(su.doorbell, &one, sizeof one), (ssize_t)sizeof one);
    for (int turn = 0; turn < 1000 && !seen.corrupt; turn++)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(seen.corrupt, 1);
    ck_assert_msg(strstr(seen.why, "request 1 of the ring"), "%s", seen.why);
    ck_assert_int_eq(seen.n, 1);
    /* A stopped ring serves nothing more and swallows its answers. */
    post(2, 3, "after");
    for (int k = 0; k < 4; k++)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(seen.n, 1);
    ck_assert_int_eq(seen.corrupt, 1);
    ck_assert_int_eq(answer(1, "late", 0), 0);
    uint64_t id;
    uint32_t kind;
    char buf[HR_SLOT_SIZE_MAX];
    ck_assert_int_eq(response(0, &id, buf, &kind), HR_EMPTY);
}
END_TEST

START_TEST(reused_id_is_corrupt)
{
    post(0, 7, "one");
    post(1, 7, "two");
    for (int turn = 0; turn < 1000 && !seen.corrupt; turn++)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(seen.n, 1);
    ck_assert_int_eq(seen.corrupt, 1);
    ck_assert_msg(strstr(seen.why, "reuses the id of an unanswered request"), "%s", seen.why);
}
END_TEST

/* ---- the ring's sink in front of a socket's ----------------------------- */

static struct {
    int sends, admits, closes;
    uint64_t id;
    char frame[64];
    size_t nfds;
} next;

static void next_send(void *data, uint64_t id, const void *msg, size_t len, hd_frame_sink_pack_fn pack, int *fds,
                      size_t nfds)
{
    ck_assert_ptr_eq(data, &next);
    ck_assert_uint_lt(len, sizeof next.frame);
    (void)fds;
    next.sends++;
    next.id = id;
    pack(msg, (uint8_t *)next.frame);
    next.frame[len] = 0;
    next.nfds = nfds;
}
static void next_admit(void *data) { (void)data, next.admits++; }
static void next_close(void *data) { (void)data, next.closes++; }
static const hd_frame_sink_ops next_ops = {next_send, next_admit, next_close};

START_TEST(ring_sink_routes)
{
    memset(&next, 0, sizeof next);
    hd_ring_sink rs;
    hd_frame_sink out = hd_ring_sink_init(&rs, ring, (hd_frame_sink){&next_ops, &next});
    post(0, 5, "alloc");
    post(1, 6, "attach-ish");
    run_until(2);
    /* The answer to a ring request: into the ring, not the socket. */
    hd_frame_sink_send(&out, 5, "reply", 5, pack_str, NULL, 0);
    ck_assert_int_eq(next.sends, 0);
    uint64_t id;
    uint32_t kind;
    char buf[HR_SLOT_SIZE_MAX];
    ck_assert_int_eq(response(0, &id, buf, &kind), HR_OK);
    ck_assert_uint_eq(kind, HR_KIND_FRAME);
    ck_assert_str_eq(buf, "reply");
    /* With fds: the marker in the ring, the frame and fds on the socket. */
    int fd = 42;
    hd_frame_sink_send(&out, 6, "chunks", 6, pack_str, &fd, 1);
    ck_assert_int_eq(response(1, &id, buf, &kind), HR_OK);
    ck_assert_uint_eq(kind, HR_KIND_SOCKET);
    ck_assert_int_eq(next.sends, 1);
    ck_assert_uint_eq(next.id, 6);
    ck_assert_str_eq(next.frame, "chunks");
    ck_assert_uint_eq(next.nfds, 1);
    /* Unsolicited, and the answer to a socket request: the socket's. */
    hd_frame_sink_send(&out, 0, "bye", 3, pack_str, NULL, 0);
    ck_assert_int_eq(next.sends, 2);
    ck_assert_uint_eq(next.id, 0);
    hd_frame_sink_send(&out, 99, "stats", 5, pack_str, NULL, 0);
    ck_assert_int_eq(next.sends, 3);
    ck_assert_str_eq(next.frame, "stats");
    ck_assert_int_eq(response(2, &id, buf, &kind), HR_EMPTY);
    hd_frame_sink_admit(&out);
    hd_frame_sink_close_after_flush(&out);
    ck_assert_int_eq(next.admits, 1);
    ck_assert_int_eq(next.closes, 1);
}
END_TEST

static Suite *ringd_suite(void)
{
    Suite *st = suite_create("ringd");
    TCase *tc = tcase_create("ring");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, requests_and_answers);
    tcase_add_test(tc, fds_or_size_leave_the_socket_marker);
    tcase_add_test(tc, window_of_nslots);
    tcase_add_test(tc, torn_slot_is_corrupt);
    tcase_add_test(tc, reused_id_is_corrupt);
    tcase_add_test(tc, ring_sink_routes);
    suite_add_tcase(st, tc);
    return st;
}

int main(void)
{
    /* libuv's first loop opens a process-wide pipe it never closes: open it
     * before any test counts fds. */
    uv_loop_t l;
    if (uv_loop_init(&l) == 0)
        uv_loop_close(&l);
    return cku_run(ringd_suite());
}
