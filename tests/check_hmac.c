/* check_hmac.c - unit tests for daemon/hmac.c and sha1.c's incremental API:
 * the RFC 2202 and FIPS 180 vectors, pieces of any size. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_util.h"
#include "hmac.h"
#include "sha1.h"

static void hmac_hex(const char *key, size_t kl, const char *msg, size_t ml, char out[41])
{
    hmac_ctx h;
    hmac_init(&h, key, kl);
    hmac_update(&h, msg, ml);
    hmac_final_hex(&h, out);
}

START_TEST(t_rfc2202)
{
    char out[41], key[80];
    memset(key, 0x0b, 20);
    hmac_hex(key, 20, "Hi There", 8, out);
    ck_assert_str_eq(out, "b617318655057264e28bc0b6fb378c8ef146be00");
    hmac_hex("Jefe", 4, "what do ya want for nothing?", 28, out);
    ck_assert_str_eq(out, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
    memset(key, 0xaa, 80); /* a key longer than a block is hashed first */
    hmac_hex(key, 80, "Test Using Larger Than Block-Size Key - Hash Key First", 54, out);
    ck_assert_str_eq(out, "aa4ae5e15272d00e95705637ce8a3b55ed402112");
}
END_TEST

START_TEST(t_sha1_pieces)
{
    static char buf[1000];
    char one[41], hex[41];
    unsigned char d[20];
    sha1_hex("abc", 3, one);
    ck_assert_str_eq(one, "a9993e364706816aba3e25717850c26c9cd0d89d");
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (char)(i * 7);
    sha1_hex(buf, sizeof buf, one);
    for (size_t step = 1; step < 130; step += 9) {
        sha1_ctx c;
        sha1_init(&c);
        for (size_t at = 0; at < sizeof buf; at += step)
            sha1_update(&c, buf + at, at + step > sizeof buf ? sizeof buf - at : step);
        sha1_final(&c, d);
        for (int i = 0; i < 20; i++)
            snprintf(hex + 2 * i, 3, "%02x", d[i]);
        ck_assert_str_eq(hex, one);
    }
    ck_assert(hmac_equal("abcd", "abcd", 4));
    ck_assert(!hmac_equal("abcd", "abce", 4));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hmac");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, t_rfc2202);
    tcase_add_test(tc, t_sha1_pieces);
    suite_add_tcase(s, tc);
    return cku_run(s);
}
