/* check_ring_layout.c - common/ring_layout.h: the request ring's layout, hr_put, hr_take,
 * hr_read_resp and hr_header_check, on a real sealed-size memory image. */
#include "ring_layout.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const hr_geom G = {4, 128};

static unsigned char *ring_new(void)
{
    unsigned char *m = aligned_alloc(64, hr_size(G));
    ck_assert_ptr_nonnull(m);
    hr_init(m, G);
    return m;
}

START_TEST(geometry)
{
    ck_assert_int_eq(hr_geom_ok(G), 0);
    ck_assert_int_eq(hr_geom_ok((hr_geom){0, 128}), -1);
    ck_assert_int_eq(hr_geom_ok((hr_geom){4, 100}), -1);         /* not a multiple of 64 */
    ck_assert_int_eq(hr_geom_ok((hr_geom){4, HR_SLOT_HDR}), -1); /* no payload */
    ck_assert_uint_eq(hr_size(G), HR_HDR_SIZE + 2 * 4 * 128);
    ck_assert_uint_eq(hr_payload_max(G), 128 - HR_SLOT_HDR);
    unsigned char *m = ring_new();
    /* slot s % N, request slots before response slots, inside the image */
    ck_assert_ptr_eq(hr_req_slot(m, G, 5), (void *)(m + HR_HDR_SIZE + 128));
    ck_assert_ptr_eq(hr_resp_slot(m, G, 5), (void *)(m + HR_HDR_SIZE + 5 * 128));
    hr_geom out;
    char why[256];
    ck_assert_int_eq(hr_header_check(m, hr_size(G), &out, why, sizeof why), 0);
    ck_assert_uint_eq(out.nslots, 4);
    ck_assert_int_eq(hr_header_check(m, hr_size(G) - 64, &out, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "geometry") != NULL, "%s", why);
    ((hr_header *)m)->magic = 0;
    ck_assert_int_eq(hr_header_check(m, hr_size(G), &out, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "magic") != NULL, "%s", why);
    free(m);
}
END_TEST

START_TEST(round_trip_over_laps)
{
    unsigned char *m = ring_new();
    unsigned char buf[128];
    uint64_t id;
    uint32_t len, kind;
    for (uint64_t s = 0; s < 3 * G.nslots; s++) {
        /* not posted yet: the previous lap's seq */
        ck_assert_int_eq(hr_take(hr_req_slot(m, G, s), s, G, buf, &id, &len), HR_EMPTY);
        char msg[32];
        int n = snprintf(msg, sizeof msg, "request %llu", (unsigned long long)s);
        hr_put(hr_req_slot(m, G, s), s, 100 + s, HR_KIND_REQUEST, msg, (uint32_t)n);
        ck_assert(hr_posted(hr_req_slot(m, G, s), s));
        ck_assert_int_eq(hr_take(hr_req_slot(m, G, s), s, G, buf, &id, &len), HR_OK);
        ck_assert_uint_eq(id, 100 + s);
        ck_assert_uint_eq(len, (uint32_t)n);
        ck_assert(memcmp(buf, msg, len) == 0);
        ck_assert_int_eq(hr_read_resp(hr_resp_slot(m, G, s), s, G, buf, &id, &len, &kind), HR_EMPTY);
        hr_put(hr_resp_slot(m, G, s), s, 100 + s, HR_KIND_SOCKET, NULL, 0);
        ck_assert_int_eq(hr_read_resp(hr_resp_slot(m, G, s), s, G, buf, &id, &len, &kind), HR_OK);
        ck_assert_uint_eq(kind, HR_KIND_SOCKET);
        ck_assert_uint_eq(len, 0);
    }
    free(m);
}
END_TEST

START_TEST(hostile_slots)
{
    unsigned char *m = ring_new();
    unsigned char buf[128];
    uint64_t id;
    uint32_t len;
    hr_slot *sl = hr_req_slot(m, G, 0);
    atomic_store(&sl->seq, 7); /* neither 1 (posted) nor 0 (previous lap) */
    ck_assert_int_eq(hr_take(sl, 0, G, buf, &id, &len), HR_ESEQ);
    hr_put(sl, 0, 1, HR_KIND_REQUEST, "abc", 3);
    sl->len = (uint32_t)hr_payload_max(G) + 1;
    ck_assert_int_eq(hr_take(sl, 0, G, buf, &id, &len), HR_ELEN);
    hr_put(sl, 0, 1, HR_KIND_REQUEST, "abc", 3);
    sl->payload[1] ^= 1; /* written after the checksum: torn */
    ck_assert_int_eq(hr_take(sl, 0, G, buf, &id, &len), HR_ETORN);
    hr_put(sl, 0, 1, HR_KIND_REQUEST, "abc", 3);
    sl->id = 2;
    ck_assert_int_eq(hr_take(sl, 0, G, buf, &id, &len), HR_ETORN);
    hr_put(sl, 0, 1, HR_KIND_FRAME, "abc", 3);
    ck_assert_int_eq(hr_take(sl, 0, G, buf, &id, &len), HR_EKIND);
    /* a later lap's seq in a slot of this lap */
    hr_put(sl, 0 + 2 * G.nslots, 1, HR_KIND_REQUEST, "abc", 3);
    ck_assert_int_eq(hr_take(sl, 0, G, buf, &id, &len), HR_ESEQ);
    for (int rc = HR_OK; rc >= HR_EKIND; rc--)
        ck_assert_str_ne(hr_strerror(rc), "unknown ring error");
        /* The code table: named after itself, described. */
#define CODE_CHECK(name, value, desc)                                                                                  \
    ck_assert_str_eq(hr_errname(name), #name);                                                                         \
    ck_assert_str_eq(hr_strerror(name), desc);
    HR_CODE_MAP(CODE_CHECK)
#undef CODE_CHECK
    ck_assert_str_eq(hr_strerror(-99), "unknown ring error");
    ck_assert_str_eq(hr_errname(-99), "HR_E(unknown)");
    free(m);
}
END_TEST

static Suite *ring_suite(void)
{
    Suite *s = suite_create("ring");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, geometry);
    tcase_add_test(tc, round_trip_over_laps);
    tcase_add_test(tc, hostile_slots);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ring_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
