/* heapc_ring.h - libheapc's side of the request ring (issue 16), private to
 * libheapc. Prefix hcr_.
 *
 * A connection that has a ring (RingSetup after attach) sends Alloc, Free
 * and Collect through it: the packed request goes into the next request
 * slot, the doorbell is written only while heapd sleeps (srv_sleeping), and
 * the caller waits for the response slot: spinning for a few microseconds
 * when the machine has more cores than spinners (heapd and this node's
 * ranks), else at once in FUTEX_WAIT on resp_futex, in slices of at most
 * HCR_SLICE_MS between which it polls the socket: a socket that hung up or
 * has something to read (heapd's last words, an answer that carries fds)
 * ends the wait with HCR_SOCKET, so that a client never hangs on a dead
 * heapd. HEAPC_TRANSPORT=socket (or ring = off in heapd.conf) keeps every
 * request on the socket. */
#ifndef HEAPC_RING_H
#define HEAPC_RING_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define HCR_SLICE_MS 20

typedef struct hcr_ring hcr_ring;

/* Results of hcr_call. */
#define HCR_REPLY  0 /* *out holds the reply frame (no fds) */
#define HCR_SOCKET 1 /* heapd said: the reply comes on the socket */
#define HCR_READABLE                                                                                                   \
    3                    /* the socket has something to read (or hung up): read it, then                               \
                          * hcr_wait again unless it was the reply */
#define HCR_TIMEOUT 2    /* nothing within timeout_ms */
#define HCR_EPROTO  (-1) /* the ring broke its invariants (why says how) */

/* 1 unless HEAPC_TRANSPORT=socket; -1 (why set) for another value. */
int hcr_wanted(char *why, size_t len);
/* Maps the ring (takes both fds, closed on failure). nlocal: this node's
 * ranks of the heap (spinners = nlocal + heapd). NULL with why. */
hcr_ring *hcr_open(int memfd, int doorbell, uint32_t nslots, uint32_t slot_size, uint32_t nlocal, char *why,
                   size_t len);
void hcr_close(hcr_ring *r);
/* The largest request the ring carries. */
size_t hcr_payload_max(const hcr_ring *r);
/* Sends request `id` (len bytes, <= hcr_payload_max) and waits for its
 * answer (timeout_ms < 0: no limit), watching socket `sock`. */
int hcr_call(hcr_ring *r, int sock, uint64_t id, const void *req, size_t len, int timeout_ms, hw_frame *out, char *why,
             size_t whylen);
/* Waits again for the answer to the last request hcr_call posted (after
 * HCR_READABLE and a frame on the socket that was not its reply). */
int hcr_wait(hcr_ring *r, int sock, uint64_t id, int timeout_ms, hw_frame *out, char *why, size_t whylen);
/* Tests only (tests/prog_ring.c scribbles): the request slot the next call
 * would use, with its number in *s; that number is then skipped, so the
 * next call posts behind whatever the test writes there. */
void *hcr_test_slot(hcr_ring *r, uint64_t *s, int *doorbell);
/* Tests only: c's ring, or NULL (heapc.c). */
struct heapc;
hcr_ring *hcr_of(struct heapc *c);

#endif
