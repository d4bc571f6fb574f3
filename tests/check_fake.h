/* check_fake.h - what the libheapc unit tests (check_heapc.c,
 * check_heapc_names.c) share: a scripted fake heapd in a thread on a unix
 * socket, with its frame helpers. A test's own fake starts with a ckf_fake
 * (its first member) and its script casts the ckf_fake back. The first
 * script failure lands in fail; the test asserts that it stayed empty.
 * Header only: each test is one program. */
#ifndef HEAPD_CHECK_FAKE_H
#define HEAPD_CHECK_FAKE_H

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "heapd.pb-c.h"
#include "wire.h"

typedef struct ckf_fake {
    char path[108];
    int lfd, fd;
    hw_reader rd;
    pthread_t th;
    void (*script)(struct ckf_fake *); /* runs on the accepted connection */
    char fail[512];                    /* first script failure */
} ckf_fake;

static void ckf_fail(ckf_fake *k, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static void ckf_fail(ckf_fake *k, const char *fmt, ...)
{
    if (k->fail[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->fail, sizeof k->fail, fmt, ap);
    va_end(ap);
}

/* Next request; NULL on EOF or error. The caller frees it. */
static inline Heapd__Frame *ckf_recv(ckf_fake *k)
{
    hw_frame raw;
    char err[256];
    int rc = hw_recv_frame(k->fd, &k->rd, &raw, 5000, err, sizeof err);
    if (rc != HW_FRAME)
        return NULL;
    Heapd__Frame *m = heapd__frame__unpack(NULL, raw.len, raw.data);
    hw_frame_free(&raw);
    if (!m)
        ckf_fail(k, "fake heapd: undecodable frame");
    return m;
}

/* The next request, which must be of body `want`; NULL (and a failure) if
 * not. The caller frees it. */
static inline Heapd__Frame *ckf_expect(ckf_fake *k, Heapd__Frame__BodyCase want)
{
    Heapd__Frame *m = ckf_recv(k);
    if (!m) {
        ckf_fail(k, "fake heapd: connection ended, expected body %d", (int)want);
        return NULL;
    }
    if (m->body_case != want) {
        ckf_fail(k, "fake heapd: got body %d, expected %d", (int)m->body_case, (int)want);
        heapd__frame__free_unpacked(m, NULL);
        return NULL;
    }
    return m;
}

static inline void ckf_send(ckf_fake *k, Heapd__Frame *rep, const int *fds, size_t nfds)
{
    size_t len = heapd__frame__get_packed_size(rep);
    unsigned char *buf = malloc(len ? len : 1);
    heapd__frame__pack(rep, buf);
    char err[256];
    if (hw_send_frame(k->fd, buf, len, fds, nfds, err, sizeof err) < 0)
        ckf_fail(k, "fake heapd: send failed: %s", err);
    free(buf);
}

/* The handshake: Hello (version 1), HelloReply of a host backend. */
static inline int ckf_hello(ckf_fake *k)
{
    Heapd__Frame *m = ckf_expect(k, HEAPD__FRAME__BODY_HELLO);
    if (!m)
        return -1;
    if (m->hello->version != 1)
        ckf_fail(k, "fake heapd: Hello version %u", m->hello->version);
    Heapd__HelloReply hr = HEAPD__HELLO_REPLY__INIT;
    hr.version = 1;
    hr.server = "fake-heapd 0";
    hr.backend = "host";
    Heapd__Frame rep = HEAPD__FRAME__INIT;
    rep.id = m->id;
    rep.body_case = HEAPD__FRAME__BODY_HELLO_REPLY;
    rep.hello_reply = &hr;
    ckf_send(k, &rep, NULL, 0);
    heapd__frame__free_unpacked(m, NULL);
    return 0;
}

static inline void *ckf_main(void *arg)
{
    ckf_fake *k = arg;
    k->fd = accept(k->lfd, NULL, NULL);
    if (k->fd < 0) {
        ckf_fail(k, "fake heapd: accept: %s", strerror(errno));
        return NULL;
    }
    hw_reader_init(&k->rd);
    k->script(k);
    hw_reader_free(&k->rd);
    close(k->fd);
    return NULL;
}

/* Listens on /tmp/<name>.<pid>.sock and runs `script` in a thread on the
 * first connection. The caller has zeroed *k and made what the script
 * needs. */
static inline void ckf_start(ckf_fake *k, const char *name, void (*script)(ckf_fake *))
{
    snprintf(k->path, sizeof k->path, "/tmp/%s.%ld.sock", name, (long)getpid());
    char err[256];
    k->lfd = hw_listen_unix(k->path, 4, err, sizeof err);
    ck_assert_msg(k->lfd >= 0, "listen: %s", err);
    k->script = script;
    ck_assert_int_eq(pthread_create(&k->th, NULL, ckf_main, k), 0);
}

/* Waits for the script and closes the socket; the caller then asserts
 * that fail stayed empty. */
static inline void ckf_stop(ckf_fake *k)
{
    pthread_join(k->th, NULL);
    close(k->lfd);
    unlink(k->path);
}

#endif
