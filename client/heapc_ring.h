/* heapc_ring.h - libheapc's side of the request ring (issue 16), private to
 * libheapc. Prefix hcr_.
 *
 * The ring is an hcx transport (heapc_xport.h) for Alloc, Free and Collect
 * that fit a slot (hcr_ops; its data is the hcr_ring): the packed request
 * goes into the next request slot, the doorbell is written only while heapd
 * sleeps (srv_sleeping), and the caller waits for the response slot:
 * spinning for a few microseconds when the machine has more cores than
 * spinners (heapd and this node's ranks), else at once in FUTEX_WAIT on
 * resp_futex, in slices of at most HCR_SLICE_MS between which it asks the
 * socket (the `side` transport it wraps) whether it has something to read:
 * heapd's last words, an answer that carries fds, or a hang-up end the wait
 * there, so that a client never hangs on a dead heapd. A reply heapd marks
 * "fetch it on the socket" (it carries fds, or does not fit a slot) is read
 * through the side's await. HEAPC_TRANSPORT=socket (or ring = off in
 * heapd.conf) keeps every request on the socket. */
#ifndef HEAPC_RING_H
#define HEAPC_RING_H

#include <stddef.h>
#include <stdint.h>

#include "heapc_xport.h"

#define HCR_SLICE_MS 20

typedef struct hcr_ring hcr_ring;

/* The operations; their data is an hcr_ring. */
extern const hcx_ops hcr_ops;

/* 1 unless HEAPC_TRANSPORT=socket; -1 (why set) for another value. */
int hcr_wanted(char *why, size_t len);
/* Maps the ring (takes both fds, closed on failure). nlocal: this node's
 * ranks of the heap (spinners = nlocal + heapd). side: the socket, whose
 * readable, next and await the ring uses (it must outlive the ring). NULL
 * with why, also when memfd is not a sealed memfd (heapc_map.h:
 * hm_check_memfd) or doorbell is not an eventfd: nothing heapd sends can
 * make a later request fault or raise a signal. */
hcr_ring *hcr_open(int memfd, int doorbell, uint32_t nslots, uint32_t slot_size, uint32_t nlocal, hcx side, char *why,
                   size_t len);
void hcr_close(hcr_ring *r);
/* Tests only (tests/prog_ring.c scribbles): the request slot the next call
 * would use, with its number in *s; that number is then skipped, so the
 * next call posts behind whatever the test writes there. */
void *hcr_test_slot(hcr_ring *r, uint64_t *s, int *doorbell);
/* Tests only: c's ring, or NULL (heapc.c). */
struct heapc;
hcr_ring *hcr_of(struct heapc *c);

#endif
