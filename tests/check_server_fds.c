/* check_server_fds.c - daemon/server_fds.c and the reply fd accounting of
 * server.c (issue 33 items 2, 3): a real hd_server whose handler answers
 * "fds N" with N fds; a client that does not read its replies gets at most
 * max_inflight_fds_per_conn fds in flight and max_queued_fds_per_conn (plus
 * one reply's) queued, and is not read meanwhile; reading resumes once it
 * reads. Another uid's (a child process): the per uid counts, and a closed
 * connection whose fds are unread keeps counting (hd_drain) until the peer
 * closes. Every wait is for a state (check's timeout bounds the rest). */
#include "server.h"

#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "check_util.h"
#include "log.h"
#include "server_int.h"
#include "wire.h"

#define OTHER_UID 64604
#define NREQ      100

static uv_loop_t loop;
static uv_timer_t tick;
static hd_server *srv;
static hd_conn *last;
static int frames, opens, closes, probe = -1, fds_before;
static char dir[32], sock[100];

#define WAIT(cond)                                                                                                     \
    do {                                                                                                               \
        while (!(cond))                                                                                                \
            uv_run(&loop, UV_RUN_ONCE);                                                                                \
    } while (0)

static void pack_text(const void *msg, uint8_t *out) { memcpy(out, msg, strlen(msg)); }

static int on_open(void *arg, hd_conn *c)
{
    (void)arg;
    hd_conn_set_data(c, c);
    last = c;
    opens++;
    return 0;
}

/* "fds N": a reply with N dup()s of the probe fd. */
static void on_frame(void *arg, hd_conn *c, const uint8_t *data, size_t len, size_t nfds)
{
    (void)arg;
    (void)nfds;
    frames++;
    hd_conn_admit(c);
    int fds[64];
    size_t n = len > 4 && !memcmp(data, "fds ", 4) ? (size_t)atoi((const char *)data + 4) : 0;
    for (size_t i = 0; i < n && i < 64; i++)
        fds[i] = dup(probe);
    hd_conn_send(c, "ok", 2, pack_text, fds, n);
}

static void on_closed(void *arg, hd_conn *c)
{
    (void)arg;
    if (last == c)
        last = NULL;
    closes++;
}

static const hd_server_handlers handlers = {on_open, on_frame, NULL, on_closed, NULL};

static void tick_cb(uv_timer_t *t) { (void)t; }

static void server_up(void)
{
    hd_server_opts o = {.socket_mode = 0666,
                        .max_clients = 16,
                        .admin_gid = -1,
                        .max_clients_per_uid = 16,
                        .max_fds_per_uid = 64,
                        .max_queue_per_uid = 64u << 20,
                        .hello_timeout_ms = 60000,
                        .max_frame_before_hello = 4096,
                        .max_fds_per_conn = 16,
                        .max_queue_per_conn = 8u << 20,
                        .max_queued_fds_per_conn = 8,
                        .max_queued_fds_per_uid = 1000,
                        .max_inflight_fds_per_conn = 250,
                        .max_inflight_fds_per_uid = 260};
    snprintf(o.socket_path, sizeof o.socket_path, "%s", sock);
    char err[256] = "";
    ck_assert_msg(hd_server_create(&loop, &o, &handlers, NULL, &srv, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(hd_server_start(srv, err, sizeof err) == 0, "%s", err);
}

static void setup(void)
{
    frames = opens = closes = 0;
    last = NULL;
    hd_log_set_level(HD_LOG_ERROR);
    fds_before = cku_count_fds();
    snprintf(dir, sizeof dir, "/tmp/check_sfds.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    chmod(dir, 0755);
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    probe = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    uv_timer_init(&loop, &tick);
    uv_timer_start(&tick, tick_cb, 5, 5);
    server_up();
}

static void teardown(void)
{
    hd_server_shutdown(srv);
    WAIT(closes == opens);
    hd_server_destroy(srv);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    close(probe);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(cku_count_fds(), fds_before);
}

/* Connects and sends NREQ "fds 10" without reading (exits on failure). */
static int flood(void)
{
    char err[256];
    int fd = hw_connect_unix(sock, err, sizeof err);
    if (fd < 0)
        _exit(3);
    for (int i = 0; i < NREQ; i++)
        if (hw_send_frame(fd, "fds 10", 6, NULL, 0, err, sizeof err))
            _exit(4);
    return fd;
}

/* The server stopped reading c: its fds wait for the client. */
static int held_back(const hd_conn *c) { return c && c->stalled && !(c->events & UV_READABLE); }

START_TEST(queued_and_inflight_bounded)
{
    int fd = flood();
    WAIT(held_back(last));
    /* 25 replies in flight (250 fds), the 26th's 10 fds queued: not read. */
    ck_assert_int_eq(frames, 26);
    ck_assert_uint_eq(last->inflight, 250);
    ck_assert_uint_eq(last->qfds, 10);
    ck_assert_uint_eq(hw_writer_pending_fds(&last->wr), 10);
    /* The client reads: everything goes, every request is handled. */
    hw_reader rd;
    hw_reader_init(&rd);
    int got = 0, nfds = 0;
    while (got < NREQ) {
        hw_frame f;
        char err[256];
        int rc = hw_read(fd, &rd, &f, err, sizeof err);
        ck_assert_msg(rc >= 0, "%s", err);
        if (rc == HW_AGAIN) {
            uv_run(&loop, UV_RUN_ONCE);
            continue;
        }
        for (size_t i = 0; i < f.nfds; i++)
            close(f.fds[i]);
        nfds += (int)f.nfds;
        f.nfds = 0;
        hw_frame_free(&f);
        got++;
    }
    ck_assert_int_eq(frames, NREQ);
    ck_assert_int_eq(nfds, NREQ * 10);
    ck_assert_uint_eq(last->qfds, 0);
    hw_reader_free(&rd);
    close(fd);
    WAIT(closes == 1);
}
END_TEST

/* Another uid's client: floods, tells the parent (byte on `up`), shuts its
 * writing side down on the first byte of `go`, closes on the second. */
static void other_child(int up, int go)
{
    if (setgid(OTHER_UID) || setuid(OTHER_UID))
        _exit(2);
    int fd = flood();
    char b = 1;
    if (write(up, &b, 1) != 1 || read(go, &b, 1) != 1)
        _exit(5);
    shutdown(fd, SHUT_WR);
    if (read(go, &b, 1) != 1)
        _exit(6);
    close(fd);
    _exit(0);
}

START_TEST(uid_counts_and_drain)
{
    if (getuid() != 0)
        return; /* needs a second uid */
    int up[2], go[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(go), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        other_child(up[1], go[0]);
    close(up[1]);
    close(go[0]);
    WAIT(held_back(last));
    hd_uid *u = *hd_server_uid_slot(srv, OTHER_UID);
    ck_assert_ptr_nonnull(u);
    ck_assert_uint_eq(u->inflight, 250);
    ck_assert_uint_eq(u->qfds, 10);
    ck_assert_uint_eq(u->conns, 1);
    /* It hangs up its writing side: closed, but its 250 fds are unread. */
    char b = 1;
    ck_assert_int_eq(write(go[1], &b, 1), 1);
    WAIT(closes == 1 && srv->drains);
    ck_assert_uint_eq(u->conns, 1);
    ck_assert_uint_eq(u->inflight, 250);
    ck_assert_uint_eq(u->qfds, 0);
    /* It closes: the kernel drops its fds, the socket and the counts go. */
    ck_assert_int_eq(write(go[1], &b, 1), 1);
    int status = 0;
    WAIT(waitpid(pid, &status, WNOHANG) == pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    WAIT(!srv->drains);
    ck_assert_ptr_null(*hd_server_uid_slot(srv, OTHER_UID));
    close(up[0]);
    close(go[1]);
}
END_TEST

static Suite *suite(void)
{
    Suite *su = suite_create("server_fds");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, queued_and_inflight_bounded);
    tcase_add_test(tc, uid_counts_and_drain);
    suite_add_tcase(su, tc);
    return su;
}

int main(void)
{
    uv_loop_t l; /* libuv's process-wide pipe, before any fd count */
    if (uv_loop_init(&l) == 0)
        uv_loop_close(&l);
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
