/* ring.h - heapd's side of the request rings (issue 16): a second transport
 * beside server.c. One ring per client that asked for one (RingSetup over
 * its socket): a sealed memfd (common/ring_layout.h has the layout and its
 * invariants) and an eventfd doorbell the libuv loop watches (uv_poll).
 * It knows no message: each request slot's payload goes up to the handlers
 * its creator gave (dispatch.c), with the `void *data` of its ring.
 *
 * Serving: a ring is *awake* while heapd polls it. A request (doorbell or
 * poll) wakes it; after its last request heapd busy-polls it for spin_us
 * (an idle handle keeps the loop from blocking), then for backoff_us polls
 * it once per loop turn with a sched_yield() between turns, then sets
 * srv_sleeping and sleeps on the doorbell. Issue 33 item 10: each ring
 * has its own backoff, halved whenever a request comes in the backoff
 * phase (a trickle just slower than the spin window would otherwise keep
 * heapd polling) and doubled back when one comes within the spin window;
 * and an account's rings (hd_ring_set_account) poll at most 20 ms of every
 * 100 ms. spin_us and backoff_us are
 * hd_ring_opts' (heapd fills them from heapd.conf's ring_spin_us and
 * ring_backoff_us); auto: 50 and 500 us with more than 2 cores, 0 and 0
 * otherwise.
 *
 * What it promises to its user:
 *   - on_request is called once per request, in ring order, on the loop
 *     thread, with a private copy of the payload; never more than nslots of
 *     a ring's requests are unanswered (the next waits in its slot).
 *   - A slot that breaks the layout's invariants (sequence, length,
 *     checksum, kind) calls on_corrupt once; the ring then serves nothing
 *     more. heapd never reads the ring's header.
 *   - hd_ring_answer writes a request's answer into its response slot and
 *     wakes the client; an answer that carries fds or does not fit a slot
 *     leaves a HR_KIND_SOCKET marker instead, and the caller sends it on the
 *     socket.
 *   - hd_ring_close frees the ring (memfd, eventfd, handle); the client's
 *     mapping stays valid until it unmaps it. */
#ifndef HEAPD_RING_H
#define HEAPD_RING_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct hd_rings hd_rings;
typedef struct hd_ring hd_ring;

/* The polling budgets of every ring, in microseconds; -1: auto (above). */
typedef struct hd_ring_opts {
    long spin_us;
    long backoff_us;
} hd_ring_opts;

typedef struct hd_ring_handlers {
    /* Request `id` from ring r: len payload bytes (valid during the call). */
    void (*on_request)(void *arg, hd_ring *r, void *data, uint64_t id, const uint8_t *p, size_t len);
    /* Ring r is corrupt (why: for people); nothing more is served from it. */
    void (*on_corrupt)(void *arg, hd_ring *r, void *data, const char *why);
} hd_ring_handlers;

/* What a client needs to use its ring: fds it owns from then on. */
typedef struct hd_ring_setup {
    int memfd, doorbell;
    uint32_t nslots, slot_size;
} hd_ring_setup;

int hd_rings_create(uv_loop_t *loop, const hd_ring_opts *opts, const hd_ring_handlers *h, void *arg, hd_rings **out);
/* Every ring must be closed. */
void hd_rings_destroy(hd_rings *rs);
/* The polling budgets in effect (after auto). */
void hd_rings_budget(const hd_rings *rs, long *spin_us, long *backoff_us);

/* A new ring for a client (data: the owner's); *su gets duplicates of its
 * fds for the client. 0, or -1 with err. */
int hd_ring_open(hd_rings *rs, void *data, hd_ring **out, hd_ring_setup *su, char *err, size_t errlen);
/* Issue 33 item 10: r's polling counts against account `key` (dispatch:
 * the client's uid): an account's rings keep heapd polling for at most a
 * fifth of every 100 ms (then they sleep on the doorbell after each
 * request until the period ends). Counted: the gap before each request
 * (unless under 10 us: a busy client) and each window that ends in sleep. Once per ring; 0, or -1 out of memory. */
int hd_ring_set_account(hd_ring *r, uint32_t key);
/* Serve no more requests from r (its client is being disconnected). */
void hd_ring_stop(hd_ring *r);
/* Frees r. */
void hd_ring_close(hd_ring *r);

typedef void (*hd_ring_pack_fn)(const void *msg, uint8_t *out);
/* The answer to request `id` (len bytes that pack(msg) writes, nfds fds
 * beside) if r has it unanswered: 0 when written into the ring, 1 when a
 * HR_KIND_SOCKET marker sends the client to the socket (the caller sends
 * the answer there), -1 when id is no unanswered request of r (NULL r: -1).
 * A stopped ring swallows its answers (0). */
int hd_ring_answer(hd_ring *r, uint64_t id, const void *msg, size_t len, hd_ring_pack_fn pack, size_t nfds);

#endif
