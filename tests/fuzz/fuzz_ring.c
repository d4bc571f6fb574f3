/* fuzz_ring.c - libFuzzer target: the request ring's decoder (common/ring_layout.c)
 * as heapd's ring server uses it (daemon/ring.c: serve, dispatch.c:
 * ring_request): every byte of the ring is the client's, hostile.
 *
 * Input: 4 control bytes, then the ring's bytes.
 *   ctl[0] % 8 + 1      slots (slot size: 128 bytes, so that inputs cover them)
 *   ctl[1]              the first request number heapd expects (laps > 0 too)
 *   ctl[2] % 16 + 1     requests heapd tries to take
 *   ctl[3] bit 0        also parse the input as a ring header a client maps
 *   rest                copied over the ring from its first request slot on
 *                       (header first when ctl[3] bit 0)
 *
 * Checked (abort on violation):
 *   - hr_take returns only HR_OK, HR_EMPTY or a documented HR_E* code, and
 *     hr_strerror names each;
 *   - HR_OK: the length is within the slot's payload, the copy's checksum
 *     matches, the slot's seq is the expected one; the copy decodes (or not)
 *     with heapd__frame__unpack without reading past it, and a decoded
 *     Frame re-encodes within the slot's payload bound or is refused like
 *     dispatch.c does (id mismatch);
 *   - HR_EMPTY only for the previous lap's sequence number;
 *   - hr_header_check accepts only a header whose geometry matches the size;
 *   - hr_read_resp on the same bytes keeps the same bounds.
 */
#include "heapd.pb-c.h"
#include "ring_layout.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                                       \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "check failed: %s (%s:%d)\n", #c, __FILE__, __LINE__);                                     \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    if (n < 4)
        return 0;
    hr_geom g = {d[0] % 8u + 1u, 128u};
    CHECK(hr_geom_ok(g) == 0);
    uint64_t head = d[1];
    unsigned steps = d[2] % 16u + 1u;
    int header = d[3] & 1;
    d += 4;
    n -= 4;
    size_t size = hr_size(g);
    unsigned char *mem = aligned_alloc(64, size);
    if (!mem)
        return 0;
    hr_init(mem, g);
    size_t at = header ? 0 : HR_HDR_SIZE;
    memcpy(mem + at, d, n < size - at ? n : size - at);

    if (header) {
        hr_geom hg;
        char why[256];
        if (hr_header_check(mem, size, &hg, why, sizeof why) == 0)
            CHECK(hr_size(hg) == size && hr_geom_ok(hg) == 0);
        else
            CHECK(why[0] != '\0');
    }

    size_t max = hr_payload_max(g);
    unsigned char *buf = malloc(max);
    for (unsigned i = 0; i < steps && buf; i++, head++) {
        const hr_slot *sl = hr_req_slot(mem, g, head);
        CHECK((const unsigned char *)sl >= mem + HR_HDR_SIZE &&
              (const unsigned char *)sl + g.slot_size <= mem + HR_HDR_SIZE + (size_t)g.nslots * g.slot_size);
        uint64_t id = 0;
        uint32_t len = 0;
        uint64_t seq = atomic_load((_Atomic uint64_t *)&((hr_slot *)sl)->seq);
        int rc = hr_take(sl, head, g, buf, &id, &len);
        CHECK(rc == HR_OK || rc == HR_EMPTY || rc == HR_ESEQ || rc == HR_ELEN || rc == HR_ETORN || rc == HR_EKIND);
        CHECK(strcmp(hr_strerror(rc), "unknown ring error") != 0);
        if (rc == HR_EMPTY) {
            CHECK(seq == (head >= g.nslots ? head + 1 - g.nslots : 0));
            break;
        }
        if (rc != HR_OK)
            break; /* heapd: the ring is corrupt, the client is disconnected */
        CHECK(seq == head + 1);
        CHECK(len <= max);
        CHECK(hr_chk(id, len, HR_KIND_REQUEST, buf) == sl->chk);
        Heapd__Frame *f = heapd__frame__unpack(NULL, len, buf);
        if (f) {
            if (f->id == id) {
                size_t m = heapd__frame__get_packed_size(f);
                CHECK(m <= 2 * (size_t)len + 16); /* canonical form: no blow-up */
            }
            heapd__frame__free_unpacked(f, NULL);
        }
        /* A response slot holding the same bytes: the client's reader. */
        uint32_t kind;
        hr_slot *rs = hr_resp_slot(mem, g, head);
        memcpy(rs, sl, g.slot_size);
        rc = hr_read_resp(rs, head, g, buf, &id, &len, &kind);
        CHECK(rc == HR_OK || rc == HR_EMPTY || rc == HR_ELEN || rc == HR_ETORN);
        if (rc == HR_OK)
            CHECK(len <= max);
    }
    free(buf);
    free(mem);
    return 0;
}
