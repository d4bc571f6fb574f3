/* heapc_ring.c - libheapc's side of the request ring (see heapc_ring.h). */
#include "heapc_ring.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "heapc_map.h"
#include "ring_layout.h"
#include "env.h"

/* Invariants: s is the number of the next request; every request before
 * s - 1 was answered or abandoned (its reply came on the socket); mem maps
 * the whole memfd, whose geometry hr_header_check accepted; sock_id != 0 =>
 * the rest of request sock_id's reply comes on `side` (heapd's marker said
 * so, or a frame of it came there). */
struct hcr_ring {
    void *mem;
    size_t size;
    hr_geom geom;
    int doorbell;
    uint64_t s;
    uint64_t spin_ns; /* 0: no spinning */
    hcx side;         /* the socket: replies heapd sends there, its hang-up */
    uint64_t sock_id;
};

/* What the wait for a response slot found. */
#define WAIT_REPLY    0 /* *out holds the reply frame (no fds) */
#define WAIT_SOCKET   1 /* heapd's marker: the reply comes on the socket */
#define WAIT_READABLE 2 /* the socket has something to read (or hung up) */
#define WAIT_TIMEOUT  3 /* nothing within timeout_ms */
#define WAIT_EPROTO   4 /* the ring broke its invariants (why says how) */

/* Requests above this many bytes take the socket, as they did before the
 * transports had one interface (issue 16 packed them on the stack). */
#define HCR_REQ_MAX 4096u

int hcr_wanted(char *why, size_t len)
{
    const char *t = henv_get("TRANSPORT");
    if (!t || !*t || !strcmp(t, "ring"))
        return 1;
    if (!strcmp(t, "socket"))
        return 0;
    char var[64];
    snprintf(why, len, "%s=%s: use ring (the default) or socket", henv_which("TRANSPORT", var, sizeof var), t);
    return -1;
}

static long ncpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

hcr_ring *hcr_open(int memfd, int doorbell, uint32_t nslots, uint32_t slot_size, uint32_t nlocal, hcx side, char *why,
                   size_t len)
{
    hcr_ring *r = calloc(1, sizeof *r);
    if (len)
        why[0] = '\0';
    struct stat st;
    if (!r) {
        snprintf(why, len, "out of memory");
        goto fail;
    }
    /* A sealed memfd only: one heapd (or whoever answers on its socket)
     * could shrink under the mapping would fault (SIGBUS) at a request. */
    if (hm_check_memfd(memfd, HR_HDR_SIZE, "the request ring", why, len) != HM_OK || fstat(memfd, &st)) {
        if (!why[0])
            snprintf(why, len, "heapd's ring memfd is not usable: %s", strerror(errno));
        goto fail;
    }
    /* The doorbell is written: an eventfd (an anonymous inode) never raises
     * a signal there, a pipe or socket with no reader would (SIGPIPE), a
     * file over RLIMIT_FSIZE too (SIGXFSZ). */
    struct stat dst;
    if (fstat(doorbell, &dst) || (dst.st_mode & S_IFMT) != 0) {
        snprintf(why, len, "heapd's ring doorbell is not an eventfd (file type 0%o)", (unsigned)(dst.st_mode & S_IFMT));
        goto fail;
    }
    r->size = (size_t)st.st_size;
    r->mem = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (r->mem == MAP_FAILED) {
        snprintf(why, len, "mapping heapd's %zu-byte ring failed: %s", r->size, strerror(errno));
        r->mem = NULL;
        goto fail;
    }
    if (hr_header_check(r->mem, r->size, &r->geom, why, len))
        goto fail;
    if (r->geom.nslots != nslots || r->geom.slot_size != slot_size) {
        snprintf(why, len, "heapd's ring header (%u slots of %u bytes) differs from its RingSetupReply (%u of %u)",
                 r->geom.nslots, r->geom.slot_size, nslots, slot_size);
        goto fail;
    }
    close(memfd);
    r->doorbell = doorbell;
    r->side = side;
    /* Spin only where it pays: more cores than spinners (heapd and every
     * local rank); HEAPC_RING_SPIN_US overrides (0: never). */
    const char *e = henv_get("RING_SPIN_US");
    long spin_us = ncpus() > (long)nlocal + 1 ? 20 : 0;
    if (e && *e)
        spin_us = strtol(e, NULL, 10);
    r->spin_ns = spin_us > 0 ? (uint64_t)spin_us * 1000u : 0;
    return r;
fail:
    if (r && r->mem)
        munmap(r->mem, r->size);
    free(r);
    close(memfd);
    close(doorbell);
    return NULL;
}

void hcr_close(hcr_ring *r)
{
    if (!r)
        return;
    munmap(r->mem, r->size);
    close(r->doorbell);
    free(r);
}

void *hcr_test_slot(hcr_ring *r, uint64_t *s, int *doorbell)
{
    *s = r->s++;
    *doorbell = r->doorbell;
    return hr_req_slot(r->mem, r->geom, *s);
}

/* Response s: HR_OK (out filled, or *sock set for HR_KIND_SOCKET), HR_EMPTY,
 * or an error. */
static int take_resp(hcr_ring *r, uint64_t s, uint64_t id, hw_frame *out, int *sock, char *why, size_t whylen)
{
    hr_slot *sl = hr_resp_slot(r->mem, r->geom, s);
    if (atomic_load_explicit(&sl->seq, memory_order_acquire) != s + 1)
        return HR_EMPTY;
    size_t max = hr_payload_max(r->geom);
    unsigned char *buf = malloc(max + 1);
    if (!buf) {
        snprintf(why, whylen, "out of memory reading heapd's answer from the ring");
        return HR_ELEN;
    }
    uint64_t rid;
    uint32_t len, kind;
    int rc = hr_read_resp(sl, s, r->geom, buf, &rid, &len, &kind);
    if (rc == HR_OK && rid != id) {
        snprintf(why, whylen, "heapd's ring answer %llu carries id %llu instead of %llu", (unsigned long long)s,
                 (unsigned long long)rid, (unsigned long long)id);
        rc = HR_ESEQ;
    } else if (rc != HR_OK) {
        snprintf(why, whylen, "heapd's ring answer %llu: %s", (unsigned long long)s, hr_strerror(rc));
    }
    if (rc != HR_OK) {
        free(buf);
        return rc;
    }
    if (kind == HR_KIND_SOCKET) {
        free(buf);
        *sock = 1;
        return HR_OK;
    }
    buf[len] = 0;
    memset(out, 0, sizeof *out);
    out->data = buf;
    out->len = len;
    return HR_OK;
}

static int ring_carries(void *data, Heapd__Frame__BodyCase body, size_t len, size_t nfds)
{
    hcr_ring *r = data;
    if (body != HEAPD__FRAME__BODY_ALLOC && body != HEAPD__FRAME__BODY_FREE && body != HEAPD__FRAME__BODY_COLLECT)
        return 0;
    return nfds == 0 && len <= hr_payload_max(r->geom) && len <= HCR_REQ_MAX;
}

/* Posts request id into the next request slot; rings the doorbell only
 * while heapd sleeps (Dekker: store seq, fence, load srv_sleeping). */
static int ring_send(void *data, uint64_t id, const void *req, size_t len, const int *fds, size_t nfds, hcx_err *e)
{
    hcr_ring *r = data;
    hr_header *h = r->mem;
    uint64_t s = r->s++;
    hr_put(hr_req_slot(r->mem, r->geom, s), s, id, HR_KIND_REQUEST, req, (uint32_t)len);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&h->srv_sleeping, memory_order_relaxed)) {
        uint64_t one = 1;
        ssize_t w = write(r->doorbell, &one, sizeof one);
        (void)w; /* a full counter (EAGAIN) rings as well */
    }
    return HCX_OK;
}

/* Spins for response s while it pays: a WAIT_* result, or -1 (nothing). */
static int ring_spin(hcr_ring *r, uint64_t s, uint64_t id, hw_frame *out, char *why, size_t whylen)
{
    int sock = 0;
    uint64_t t0 = now_ns();
    for (unsigned i = 0;; i++) {
        int rc = take_resp(r, s, id, out, &sock, why, whylen);
        if (rc != HR_EMPTY)
            return rc != HR_OK ? WAIT_EPROTO : sock ? WAIT_SOCKET : WAIT_REPLY;
        if ((i & 63) == 63 && now_ns() - t0 > r->spin_ns)
            return -1;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* Waits for the response to the last request posted: spinning first where
 * it pays, then in FUTEX_WAIT on resp_futex in slices of HCR_SLICE_MS,
 * polling the socket between them (heapd's last words, a frame with fds, a
 * hang-up end the wait). A WAIT_* result. */
static int ring_wait(hcr_ring *r, uint64_t id, int timeout_ms, hw_frame *out, char *why, size_t whylen)
{
    hr_header *h = r->mem;
    uint64_t s = r->s - 1;
    int sock = 0, rc;
    if (r->spin_ns && (rc = ring_spin(r, s, id, out, why, whylen)) >= 0)
        return rc;
    uint64_t w0 = now_ns();
    long waited_ms = 0;
    for (;;) {
        atomic_store_explicit(&h->cli_waiting, 1, memory_order_relaxed);
        uint32_t v = atomic_load_explicit(&h->resp_futex, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        rc = take_resp(r, s, id, out, &sock, why, whylen);
        if (rc != HR_EMPTY)
            break;
        long slice = HCR_SLICE_MS;
        if (timeout_ms >= 0 && timeout_ms - waited_ms < slice)
            slice = timeout_ms - waited_ms;
        if (slice > 0) {
            struct timespec ts = {slice / 1000, (long)(slice % 1000) * 1000000L};
            syscall(SYS_futex, &h->resp_futex, FUTEX_WAIT, v, &ts, NULL, 0);
        }
        rc = take_resp(r, s, id, out, &sock, why, whylen);
        if (rc != HR_EMPTY)
            break;
        if (r->side.ops->readable(r->side.data)) {
            atomic_store_explicit(&h->cli_waiting, 0, memory_order_relaxed);
            return WAIT_READABLE;
        }
        waited_ms = (long)((now_ns() - w0) / 1000000u);
        if (timeout_ms >= 0 && waited_ms >= timeout_ms) {
            atomic_store_explicit(&h->cli_waiting, 0, memory_order_relaxed);
            return WAIT_TIMEOUT;
        }
    }
    atomic_store_explicit(&h->cli_waiting, 0, memory_order_relaxed);
    return rc != HR_OK ? WAIT_EPROTO : sock ? WAIT_SOCKET : WAIT_REPLY;
}

/* The reply of request id: from the response slot, or from the socket once
 * heapd put it there; a frame the socket has meanwhile that is not id's is
 * dropped, and the wait on the ring goes on. */
static int ring_await(void *data, uint64_t id, int timeout_ms, Heapd__Frame **m, hw_frame *raw, hcx_err *e)
{
    hcr_ring *r = data;
    *m = NULL;
    memset(raw, 0, sizeof *raw);
    for (;;) {
        if (r->sock_id == id)
            return r->side.ops->await(r->side.data, id, timeout_ms, m, raw, e);
        e->ring = 1;
        int rc = ring_wait(r, id, timeout_ms, raw, e->why, sizeof e->why);
        if (rc == WAIT_TIMEOUT)
            return HCX_ETIMEOUT;
        if (rc == WAIT_EPROTO)
            return HCX_EPROTO;
        if (rc == WAIT_SOCKET) {
            r->sock_id = id;
            continue;
        }
        if (rc == WAIT_REPLY) {
            *m = heapd__frame__unpack(NULL, raw->len, raw->data);
            if (*m)
                return HCX_OK;
            hw_frame_free(raw);
            return HCX_EDECODE;
        }
        rc = r->side.ops->next(r->side.data, timeout_ms, m, raw, e);
        if (rc != HCX_OK || hcx_for(*m, id)) {
            if (rc == HCX_OK && (*m)->id == id)
                r->sock_id = id; /* a part of the reply came there: so does the rest */
            return rc;
        }
        heapd__frame__free_unpacked(*m, NULL); /* a reply to an earlier request */
        hw_frame_free(raw);
    }
}

const hcx_ops hcr_ops = {
    .carries = ring_carries,
    .send = ring_send,
    .await = ring_await,
    .next = NULL,
    .readable = NULL,
};
