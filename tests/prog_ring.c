/* prog_ring - a client that scribbles on its own request ring (issue 16),
 * for tests/it_ring.sh.
 *
 *   prog_ring --socket PATH --heap NAME MODE
 *
 * Connects with HEAPC_TRANSPORT=ring, attaches a 1-rank heap NAME, makes
 * one allocation through the ring (it must work), then writes into the
 * request slot heapd reads next, as MODE says, and makes another
 * allocation, which libheapc posts one slot further on:
 *   seq    a sequence number of neither this lap nor the previous one
 *   len    the right sequence number, a length beyond the slot
 *   torn   the right sequence number and length, a checksum that does not
 *          match (a torn write)
 *   kind   a complete slot marked as a response
 *   frame  a complete, consistent slot whose payload is no heapd.Frame
 *   id     a complete slot holding a valid Alloc frame whose id differs
 *          from the slot's
 *   random random bytes over the whole slot, its sequence number included
 * heapd must disconnect the client with an error: the second allocation
 * fails with HEAPC_ECONN or HEAPC_EPROTOCOL and a message that names the
 * ring. Prints "disconnected: MESSAGE" and exits 0 then; exits 1 if the
 * allocation succeeded or failed otherwise, 2 on bad usage. */
#include "heapc.h"
#include "heapc_ring.h"
#include "heapd.pb-c.h"
#include "ring_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *sock = NULL, *heap = NULL, *mode = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc)
            sock = argv[++i];
        else if (!strcmp(argv[i], "--heap") && i + 1 < argc)
            heap = argv[++i];
        else
            mode = argv[i];
    }
    if (!sock || !heap || !mode) {
        fprintf(stderr, "usage: prog_ring --socket PATH --heap NAME seq|len|torn|kind|frame|id|random\n");
        return 2;
    }
    setenv("HEAPC_TRANSPORT", "ring", 1);
    heapc *c = heapc_connect(sock);
    if (!c || heapc_err(c)) {
        fprintf(stderr, "prog_ring: connect: %s\n", c ? heapc_errstr(c) : "out of memory");
        return 1;
    }
    heapc_params p;
    memset(&p, 0, sizeof p);
    p.chunk_size = 1 << 20;
    p.va_size = 16 << 20;
    if (heapc_attach(c, heap, 0, 1, &p)) {
        fprintf(stderr, "prog_ring: attach: %s\n", heapc_errstr(c));
        return 1;
    }
    hcr_ring *r = hcr_of(c);
    if (!r) {
        fprintf(stderr, "prog_ring: heapd set up no request ring (ring = off?)\n");
        return 1;
    }
    uint64_t off;
    if (heapc_alloc(c, 4096, NULL, &off)) {
        fprintf(stderr, "prog_ring: first allocation: %s\n", heapc_errstr(c));
        return 1;
    }
    uint64_t s;
    int bell;
    hr_slot *sl = hcr_test_slot(r, &s, &bell);
    const uint32_t max = HR_SLOT_SIZE_DEFAULT - HR_SLOT_HDR;
    unsigned char junk[HR_SLOT_SIZE_DEFAULT];
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)rand();
    if (!strcmp(mode, "seq")) {
        atomic_store(&sl->seq, s + 1 + 3 * HR_NSLOTS_DEFAULT);
    } else if (!strcmp(mode, "len")) {
        sl->len = max + 1;
        atomic_store(&sl->seq, s + 1);
    } else if (!strcmp(mode, "torn")) {
        hr_put(sl, s, 99999, HR_KIND_REQUEST, junk, 16);
        sl->payload[3] ^= 0x40; /* after the checksum: torn */
    } else if (!strcmp(mode, "kind")) {
        hr_put(sl, s, 99999, HR_KIND_FRAME, junk, 16);
    } else if (!strcmp(mode, "frame")) {
        junk[0] = 0xff; /* field 31, wire type 7: no valid protobuf */
        hr_put(sl, s, 99999, HR_KIND_REQUEST, junk, 64);
    } else if (!strcmp(mode, "id")) {
        Heapd__Alloc al = HEAPD__ALLOC__INIT;
        al.seq = 1;
        al.size = 4096;
        Heapd__Frame f = HEAPD__FRAME__INIT;
        f.id = 1234;
        f.body_case = HEAPD__FRAME__BODY_ALLOC;
        f.alloc = &al;
        size_t n = heapd__frame__pack(&f, junk);
        hr_put(sl, s, 4321, HR_KIND_REQUEST, junk, (uint32_t)n);
    } else if (!strcmp(mode, "random")) {
        memcpy(sl, junk, HR_SLOT_SIZE_DEFAULT);
        if (atomic_load(&sl->seq) == (s >= HR_NSLOTS_DEFAULT ? s + 1 - HR_NSLOTS_DEFAULT : 0))
            atomic_store(&sl->seq, s + 7); /* not the "not posted yet" value by chance */
    } else {
        fprintf(stderr, "prog_ring: unknown mode '%s'\n", mode);
        return 2;
    }
    uint64_t one = 1;
    if (write(bell, &one, sizeof one) != sizeof one)
        perror("prog_ring: doorbell");
    int rc = heapc_alloc(c, 4096, NULL, &off);
    if (rc == HEAPC_OK) {
        fprintf(stderr, "prog_ring: %s: the allocation behind the scribbled slot succeeded\n", mode);
        return 1;
    }
    const char *msg = heapc_errstr(c);
    if ((rc != HEAPC_ECONN && rc != HEAPC_EPROTOCOL) || !strstr(msg, "ring")) {
        fprintf(stderr, "prog_ring: %s: unexpected error %s: %s\n", mode, heapc_errname(rc), msg);
        return 1;
    }
    printf("disconnected: %s\n", msg);
    heapc_free_ctx(c);
    return 0;
}
