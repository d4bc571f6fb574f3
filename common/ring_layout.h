/* ring_layout.h - the shared-memory request path (issue 16): the layout of one
 * client's request/response ring, shared by heapd (daemon/ring.c) and
 * libheapc (client/heapc_ring.c). Prefix hr_.
 *
 * A ring is a sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL: a
 * client cannot truncate it under heapd) that heapd creates for one client
 * at RingSetup and hands over with an eventfd, the doorbell. Layout:
 *
 *   [0, HR_HDR_SIZE)                         hr_header
 *   [HR_HDR_SIZE, + nslots * slot_size)       request slots 0..nslots-1
 *   [.. , + nslots * slot_size)               response slots 0..nslots-1
 *
 * Each slot is an hr_slot header (HR_SLOT_HDR bytes) and a payload of
 * slot_size - HR_SLOT_HDR bytes: one packed heapd.Frame (proto/heapd.proto),
 * exactly what the socket would carry without its 8-byte frame header.
 *
 * Invariants (s = a request's number on this ring, N = nslots; both sides
 * count requests 0, 1, 2, ... from RingSetup on):
 *   - request s lives in request slot s % N; response s in response slot
 *     s % N;
 *   - a slot's seq == s + 1 once its writer finished writing request
 *     (response) s into it; the writer stores seq last, with release, and
 *     the reader loads it first, with acquire;
 *   - a request slot heapd waits on holds seq == s + 1 (posted) or
 *     seq == s + 1 - N (the previous lap: not posted yet; 0 on the first
 *     lap); any other value is a corrupt ring;
 *   - chk == hr_chk(id, len, kind, payload): a slot whose chk does not match
 *     after its seq was read is a torn or scribbled write;
 *   - heapd serves request s only while fewer than N of its requests are
 *     unanswered, so response s never overwrites an unanswered response;
 *     the client posts request s + N only after it read response s;
 *   - srv_sleeping == 1 => heapd no longer polls the ring: a client that
 *     posts a request writes the doorbell (Dekker: the client stores seq,
 *     fences (seq_cst), loads srv_sleeping; heapd stores srv_sleeping,
 *     fences, loads the slot's seq);
 *   - resp_futex is incremented after every response; cli_waiting == 1 =>
 *     the client may sleep in FUTEX_WAIT on resp_futex and heapd wakes it
 *     (same Dekker pairing with the response's seq).
 * heapd reads nothing from the header and trusts no byte of a request slot:
 * its geometry is its own copy, every request is copied out, checked (seq,
 * len <= payload, chk) and decoded from the copy. */
#ifndef HEAPD_RING_LAYOUT_H
#define HEAPD_RING_LAYOUT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define HR_MAGIC             0x474e5248u /* "HRNG" little-endian */
#define HR_VERSION           1u
#define HR_HDR_SIZE          4096u
#define HR_SLOT_HDR          32u
#define HR_NSLOTS_DEFAULT    8u
#define HR_SLOT_SIZE_DEFAULT 2048u
#define HR_NSLOTS_MAX        1024u
#define HR_SLOT_SIZE_MAX     65536u

/* Response kinds. */
#define HR_KIND_REQUEST 0u /* a request slot */
#define HR_KIND_FRAME   1u /* the payload is the reply Frame */
#define HR_KIND_SOCKET  2u /* the reply to `id` travels on the socket (it carries fds, or is too large) */

typedef struct hr_header {
    uint32_t magic, version;
    uint32_t nslots, slot_size;
    uint64_t size; /* bytes of the memfd */
    _Alignas(64) _Atomic uint32_t srv_sleeping;
    _Alignas(64) _Atomic uint32_t resp_futex;
    _Atomic uint32_t cli_waiting;
} hr_header;

typedef struct hr_slot {
    _Atomic uint64_t seq; /* s + 1 once complete; 0: never written */
    uint64_t id;          /* the Frame's id */
    uint32_t len;         /* payload bytes */
    uint32_t kind;        /* HR_KIND_* */
    uint32_t chk;         /* hr_chk(id, len, kind, payload) */
    uint32_t pad;
    unsigned char payload[];
} hr_slot;

_Static_assert(sizeof(hr_header) <= HR_HDR_SIZE, "ring header fits its page");
_Static_assert(sizeof(hr_slot) == HR_SLOT_HDR, "slot header size");

/* A ring's geometry as one side knows it. */
typedef struct hr_geom {
    uint32_t nslots, slot_size;
} hr_geom;

/* Results of hr_take and hr_read_resp, one table: X(name, value,
 * description). It makes the constants (an enum), hr_errname and
 * hr_strerror. */
#define HR_CODE_MAP(X)                                                                                                 \
    X(HR_OK, 0, "ok")                                                                                                  \
    X(HR_EMPTY, 1, "not posted yet")                                                                                   \
    X(HR_ESEQ, -1, "a request slot's sequence number is neither the expected one nor the previous lap's")              \
    X(HR_ELEN, -2, "a slot's length exceeds its payload")                                                              \
    X(HR_ETORN, -3, "a slot's checksum does not match its contents (a torn or scribbled write)")                       \
    X(HR_EKIND, -4, "a request slot is marked as a response")

enum {
#define HR_CODE_ENUM(name, value, desc) name = value,
    HR_CODE_MAP(HR_CODE_ENUM)
#undef HR_CODE_ENUM
};

/* 0 if g is a geometry both sides accept; -1 otherwise. */
int hr_geom_ok(hr_geom g);
/* Bytes of a ring of geometry g. */
size_t hr_size(hr_geom g);
static inline size_t hr_payload_max(hr_geom g) { return g.slot_size - HR_SLOT_HDR; }
/* Writes a fresh header and zeroes every slot of the ring at mem. */
void hr_init(void *mem, hr_geom g);
/* Checks a header a client mapped: 0, or -1 with why. */
int hr_header_check(const void *mem, size_t size, hr_geom *out, char *why, size_t len);

hr_slot *hr_req_slot(void *mem, hr_geom g, uint64_t s);
hr_slot *hr_resp_slot(void *mem, hr_geom g, uint64_t s);

uint32_t hr_chk(uint64_t id, uint32_t len, uint32_t kind, const void *payload);

/* Writes message s (id, kind, len payload bytes: len <= hr_payload_max) into
 * sl: payload and fields, then seq = s + 1 with release. */
void hr_put(hr_slot *sl, uint64_t s, uint64_t id, uint32_t kind, const void *payload, uint32_t len);

/* Reads request s from sl, treating every byte as hostile: copies its
 * payload into buf (payload_max bytes) and sets *id and *len. HR_OK,
 * HR_EMPTY (seq still the previous lap's), or HR_E* (the ring is corrupt;
 * hr_strerror says why). */
int hr_take(const hr_slot *sl, uint64_t s, hr_geom g, unsigned char *buf, uint64_t *id, uint32_t *len);
/* 1 if request s was posted into sl (seq == s + 1); no copy. */
int hr_posted(const hr_slot *sl, uint64_t s);

/* Reads response s if complete: HR_OK (*kind, *id, *len set, payload copied
 * into buf of payload_max bytes), HR_EMPTY, or HR_ELEN / HR_ETORN. */
int hr_read_resp(const hr_slot *sl, uint64_t s, hr_geom g, unsigned char *buf, uint64_t *id, uint32_t *len,
                 uint32_t *kind);

/* The code's sentence ("unknown ring error" for a value not in the table)
 * and its name ("HR_ETORN"; "HR_E(unknown)"). Never NULL. */
const char *hr_strerror(int rc);
const char *hr_errname(int rc);

#endif
