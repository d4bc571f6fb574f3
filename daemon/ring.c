/* ring.c - heapd's side of the request rings (see ring.h). */
#include "ring.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ring_layout.h"

/* An unanswered request: its id and number. */
typedef struct pend {
    uint64_t id, s;
} pend;

/* Issue 33 item 10: what one account's rings (dispatch: a uid's) polled.
 * Invariant: nrings counts the open rings whose acct is this one (an entry
 * with none is freed); spent_ns is their polling since period_ns. */
typedef struct ring_acct {
    uint32_t key, nrings;
    uint64_t period_ns, spent_ns;
    struct ring_acct *next;
} ring_acct;

/* Invariants: npend <= geom.nslots; pend[0..npend) are the unanswered
 * requests taken, in ring order, each s < head; awake <=> r is on
 * rs->awake's list; stopped => no request is taken any more;
 * back_ns <= rs->backoff_ns (its own backoff, issue 33 item 10). */
struct hd_ring {
    hd_rings *rs;
    void *data;
    void *mem;
    size_t size;
    hr_geom geom;
    int memfd, efd;
    uv_poll_t poll;
    uint64_t head;    /* next request to take */
    uint64_t last_ns; /* last request taken (awake) */
    pend *pend;
    uint32_t npend;
    int awake, stopped;
    uint64_t back_ns;     /* this ring's backoff: shrinks while requests come late */
    ring_acct *acct;      /* NULL: no account (no per-account cap) */
    hd_ring *next, *prev; /* awake list */
    unsigned char *buf;   /* a slot's payload, copied */
};

/* Invariants: awake lists exactly the rings with awake == 1; the idle
 * handle runs iff awake != NULL. */
struct hd_rings {
    uv_loop_t *loop;
    hd_ring_handlers h;
    void *arg;
    uint64_t spin_ns, backoff_ns;
    hd_ring *awake;
    uv_idle_t idle;
    int idle_on;
    ring_acct *accts;
};

/* Issue 33 item 10: an account's rings may keep heapd polling for at most
 * HD_RING_ACCT_SHARE_NS of every HD_RING_PERIOD_NS; past it they sleep on
 * the doorbell right after each request until the period ends. */
#define HD_RING_PERIOD_NS     100000000ull
#define HD_RING_ACCT_SHARE_NS 20000000ull
/* A gap this short between two requests is a busy client, not idle
 * polling: it is not charged (back-to-back requests keep their spin). */
#define HD_RING_FREE_GAP_NS 10000ull

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static long ncpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

static void idle_cb(uv_idle_t *h);

int hd_rings_create(uv_loop_t *loop, const hd_ring_opts *opts, const hd_ring_handlers *h, void *arg, hd_rings **out)
{
    hd_rings *rs = calloc(1, sizeof *rs);
    if (!rs)
        return -1;
    rs->loop = loop;
    rs->h = *h;
    rs->arg = arg;
    int many = ncpus() > 2;
    long spin = opts->spin_us >= 0 ? opts->spin_us : (many ? 50 : 0);
    long back = opts->backoff_us >= 0 ? opts->backoff_us : (many ? 500 : 0);
    rs->spin_ns = (uint64_t)spin * 1000u;
    rs->backoff_ns = (uint64_t)back * 1000u;
    uv_idle_init(loop, &rs->idle);
    rs->idle.data = rs;
    *out = rs;
    return 0;
}

static void rings_freed(uv_handle_t *h) { free(h->data); }

void hd_rings_destroy(hd_rings *rs)
{
    if (!rs)
        return;
    uv_close((uv_handle_t *)&rs->idle, rings_freed);
}

void hd_rings_budget(const hd_rings *rs, long *spin_us, long *backoff_us)
{
    *spin_us = (long)(rs->spin_ns / 1000u);
    *backoff_us = (long)(rs->backoff_ns / 1000u);
}

static hr_header *hdr(hd_ring *r) { return r->mem; }

static void set_awake(hd_ring *r, int on)
{
    hd_rings *rs = r->rs;
    if (on == r->awake)
        return;
    r->awake = on;
    if (on) {
        r->prev = NULL;
        r->next = rs->awake;
        if (rs->awake)
            rs->awake->prev = r;
        rs->awake = r;
        if (!rs->idle_on) {
            uv_idle_start(&rs->idle, idle_cb);
            rs->idle_on = 1;
        }
    } else {
        if (r->prev)
            r->prev->next = r->next;
        else
            rs->awake = r->next;
        if (r->next)
            r->next->prev = r->prev;
        r->next = r->prev = NULL;
        if (!rs->awake && rs->idle_on) {
            uv_idle_stop(&rs->idle);
            rs->idle_on = 0;
        }
    }
}

static void corrupt(hd_ring *r, const char *fmt, int rc)
{
    char why[256];
    snprintf(why, sizeof why, fmt, (unsigned long long)r->head, hr_strerror(rc));
    hd_ring_stop(r);
    r->rs->h.on_corrupt(r->rs->arg, r, r->data, why);
}

/* Takes every posted request (up to nslots unanswered); the number taken. */
static int serve(hd_ring *r)
{
    int n = 0;
    while (!r->stopped && r->npend < r->geom.nslots) {
        uint64_t id;
        uint32_t len;
        int rc = hr_take(hr_req_slot(r->mem, r->geom, r->head), r->head, r->geom, r->buf, &id, &len);
        if (rc == HR_EMPTY)
            break;
        if (rc != HR_OK) {
            corrupt(r, "request %llu of the ring: %s", rc);
            break;
        }
        for (uint32_t i = 0; i < r->npend; i++)
            if (r->pend[i].id == id) {
                corrupt(r, "request %llu of the ring reuses the id of an unanswered request (%s)", HR_ESEQ);
                return n;
            }
        r->pend[r->npend++] = (pend){id, r->head};
        r->head++;
        n++;
        r->rs->h.on_request(r->rs->arg, r, r->data, id, r->buf, len);
    }
    return n;
}

/* The ring is quiet: sleep on the doorbell unless a request came meanwhile. */
static void try_sleep(hd_ring *r)
{
    atomic_store_explicit(&hdr(r)->srv_sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    if (!r->stopped && r->npend < r->geom.nslots &&
        atomic_load_explicit(&hr_req_slot(r->mem, r->geom, r->head)->seq, memory_order_relaxed) !=
            (r->head >= r->geom.nslots ? r->head + 1 - r->geom.nslots : 0)) {
        atomic_store_explicit(&hdr(r)->srv_sleeping, 0, memory_order_relaxed);
        set_awake(r, 1); /* something is there (a request, or garbage): poll it */
        return;
    }
    set_awake(r, 0);
}

/* One turn of the loop while rings are awake: passes over them for up to
 * HD_RING_SLICE_NS while one of them is in its spin budget (a loop turn
 * costs an epoll_wait: polling only once per turn would add it to every
 * request), then back to the loop for the sockets and timers. */
#define HD_RING_SLICE_NS 10000u

/* Issue 33 item 10: r served a request quiet_ns after its last one. A
 * request that came in the backoff phase (polling found nothing for the
 * whole spin window) halves the ring's backoff: a trickle just slower than
 * the spin window sleeps on the doorbell instead of keeping heapd polling;
 * one that came within the spin window doubles it back (a busy ring). */
static void adapt(hd_ring *r, uint64_t quiet_ns)
{
    hd_rings *rs = r->rs;
    if (quiet_ns >= rs->spin_ns)
        r->back_ns /= 2;
    else if (r->back_ns < rs->backoff_ns)
        r->back_ns = r->back_ns * 2 + rs->backoff_ns / 16 < rs->backoff_ns ? r->back_ns * 2 + rs->backoff_ns / 16
                                                                           : rs->backoff_ns;
}

/* The polling window of r now: its spin and backoff, none once its
 * account is over its share in this period. */
static uint64_t window_ns(const hd_ring *r, uint64_t *spin)
{
    const ring_acct *a = r->acct;
    if (a && a->spent_ns >= HD_RING_ACCT_SHARE_NS) {
        *spin = 0;
        return 0;
    }
    *spin = r->rs->spin_ns;
    return r->rs->spin_ns + r->back_ns;
}

/* Charges ns of polling that found nothing to r's account (at time t):
 * the gap before a request, unless short (a busy client), or the whole
 * window of a ring that goes to sleep. */
static void charge(hd_ring *r, uint64_t ns, uint64_t t)
{
    ring_acct *a = r->acct;
    if (!a || ns < HD_RING_FREE_GAP_NS)
        return;
    if (t - a->period_ns >= HD_RING_PERIOD_NS) {
        a->period_ns = t;
        a->spent_ns = 0;
    }
    a->spent_ns += ns;
}

static void idle_cb(uv_idle_t *h)
{
    hd_rings *rs = h->data;
    uint64_t start = now_ns();
    for (uint64_t t = start;; t = now_ns()) {
        int busy = 0, spinning = 0;
        for (hd_ring *r = rs->awake, *nx; r; r = nx) {
            nx = r->next;
            uint64_t spin, win = window_ns(r, &spin);
            if (serve(r) > 0) {
                adapt(r, t - r->last_ns);
                charge(r, t - r->last_ns < win ? t - r->last_ns : win, t);
                r->last_ns = t;
                busy = 1;
            }
            uint64_t quiet = t - r->last_ns;
            if (r->stopped || quiet >= win) {
                charge(r, win, t);
                try_sleep(r);
            } else if (quiet < spin)
                spinning = 1;
        }
        if (!busy && !spinning) {
            if (rs->awake)
                sched_yield(); /* back-off: polling, but the core goes to whoever wants it */
            return;
        }
        if (t - start >= HD_RING_SLICE_NS)
            return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

static void on_doorbell(uv_poll_t *p, int status, int events)
{
    hd_ring *r = p->data;
    uint64_t v;
    ssize_t rc = read(r->efd, &v, sizeof v);
    (void)rc;
    if (r->stopped)
        return;
    atomic_store_explicit(&hdr(r)->srv_sleeping, 0, memory_order_relaxed);
    serve(r);
    r->last_ns = now_ns();
    uint64_t spin;
    if (window_ns(r, &spin) > 0)
        set_awake(r, 1);
    else
        try_sleep(r);
}

int hd_ring_open(hd_rings *rs, void *data, hd_ring **out, hd_ring_setup *su, char *err, size_t errlen)
{
    hr_geom g = {HR_NSLOTS_DEFAULT, HR_SLOT_SIZE_DEFAULT};
    hd_ring *r = calloc(1, sizeof *r);
    if (!r || !(r->pend = calloc(g.nslots, sizeof *r->pend)) || !(r->buf = malloc(hr_payload_max(g)))) {
        snprintf(err, errlen, "heapd is out of memory");
        goto fail_mem;
    }
    r->rs = rs;
    r->data = data;
    r->back_ns = rs->backoff_ns;
    r->geom = g;
    r->size = hr_size(g);
    r->memfd = memfd_create("heapd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r->memfd < 0) {
        snprintf(err, errlen, "memfd_create for a %zu-byte ring failed: %s", r->size, strerror(errno));
        goto fail_mem;
    }
    if (ftruncate(r->memfd, (off_t)r->size) ||
        fcntl(r->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
        snprintf(err, errlen, "sizing and sealing a %zu-byte ring memfd failed: %s", r->size, strerror(errno));
        goto fail_fd;
    }
    r->mem = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
    if (r->mem == MAP_FAILED) {
        snprintf(err, errlen, "mapping a %zu-byte ring failed: %s", r->size, strerror(errno));
        goto fail_fd;
    }
    hr_init(r->mem, g);
    r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->efd < 0) {
        snprintf(err, errlen, "eventfd for a ring's doorbell failed: %s", strerror(errno));
        goto fail_map;
    }
    su->memfd = fcntl(r->memfd, F_DUPFD_CLOEXEC, 0);
    su->doorbell = fcntl(r->efd, F_DUPFD_CLOEXEC, 0);
    if (su->memfd < 0 || su->doorbell < 0) {
        snprintf(err, errlen, "duplicating a ring's fds failed: %s (raise heapd's LimitNOFILE)", strerror(errno));
        if (su->memfd >= 0)
            close(su->memfd);
        if (su->doorbell >= 0)
            close(su->doorbell);
        close(r->efd);
        goto fail_map;
    }
    su->nslots = g.nslots;
    su->slot_size = g.slot_size;
    uv_poll_init(rs->loop, &r->poll, r->efd);
    r->poll.data = r;
    uv_poll_start(&r->poll, UV_READABLE, on_doorbell);
    /* Asleep from the start: the client's first request rings the doorbell. */
    atomic_store_explicit(&hdr(r)->srv_sleeping, 1, memory_order_seq_cst);
    *out = r;
    return 0;
fail_map:
    munmap(r->mem, r->size);
fail_fd:
    close(r->memfd);
fail_mem:
    if (r) {
        free(r->pend);
        free(r->buf);
    }
    free(r);
    return -1;
}

void hd_ring_stop(hd_ring *r)
{
    if (!r || r->stopped)
        return;
    r->stopped = 1;
    uv_poll_stop(&r->poll);
}

static void ring_freed(uv_handle_t *h)
{
    hd_ring *r = h->data;
    close(r->efd);
    free(r->pend);
    free(r->buf);
    free(r);
}

int hd_ring_set_account(hd_ring *r, uint32_t key)
{
    hd_rings *rs = r->rs;
    if (r->acct)
        return 0;
    ring_acct *a = rs->accts;
    while (a && a->key != key)
        a = a->next;
    if (!a) {
        if (!(a = calloc(1, sizeof *a)))
            return -1;
        a->key = key;
        a->next = rs->accts;
        rs->accts = a;
    }
    a->nrings++;
    r->acct = a;
    return 0;
}

static void acct_drop(hd_ring *r)
{
    ring_acct *a = r->acct;
    r->acct = NULL;
    if (!a || --a->nrings)
        return;
    for (ring_acct **pp = &r->rs->accts; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    free(a);
}

void hd_ring_close(hd_ring *r)
{
    if (!r)
        return;
    hd_ring_stop(r);
    set_awake(r, 0);
    acct_drop(r);
    munmap(r->mem, r->size);
    close(r->memfd);
    r->mem = NULL;
    uv_close((uv_handle_t *)&r->poll, ring_freed);
}

int hd_ring_answer(hd_ring *r, uint64_t id, const void *msg, size_t len, hd_ring_pack_fn pack, size_t nfds)
{
    if (!r)
        return -1;
    uint32_t i = 0;
    while (i < r->npend && r->pend[i].id != id)
        i++;
    if (i == r->npend)
        return -1;
    uint64_t s = r->pend[i].s;
    memmove(&r->pend[i], &r->pend[i + 1], (r->npend - i - 1) * sizeof *r->pend);
    r->npend--;
    if (r->stopped)
        return 0;
    hr_slot *sl = hr_resp_slot(r->mem, r->geom, s);
    int rc = 0;
    if (nfds || len > hr_payload_max(r->geom)) {
        hr_put(sl, s, id, HR_KIND_SOCKET, NULL, 0);
        rc = 1;
    } else {
        pack(msg, sl->payload);
        hr_put(sl, s, id, HR_KIND_FRAME, sl->payload, (uint32_t)len);
    }
    hr_header *h = hdr(r);
    atomic_fetch_add_explicit(&h->resp_futex, 1, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&h->cli_waiting, memory_order_relaxed))
        syscall(SYS_futex, &h->resp_futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    /* A slot freed up: requests waiting behind a full window may go on. */
    if (r->npend + 1 == r->geom.nslots && !r->awake) {
        r->last_ns = now_ns();
        set_awake(r, 1);
    }
    return rc;
}
