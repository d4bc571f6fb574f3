/* check_size.c - common/size.h: hsz_parse_size and hsz_format_size. */
#include "size.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check_util.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define TiB ((uint64_t)1 << 40)

/* Parses s, expecting success with value want. */
static void parse_ok(const char *s, uint64_t want)
{
    uint64_t v = 12345;
    ck_assert_msg(hsz_parse_size(s, &v) == 0, "hsz_parse_size(\"%s\") failed, want %llu", s, (unsigned long long)want);
    ck_assert_msg(v == want, "hsz_parse_size(\"%s\") = %llu, want %llu", s, (unsigned long long)v,
                  (unsigned long long)want);
}

/* Parses s, expecting -1 and *out untouched. */
static void parse_bad(const char *s)
{
    uint64_t v = 12345;
    ck_assert_msg(hsz_parse_size(s, &v) == -1, "hsz_parse_size(\"%s\") accepted (%llu)", s ? s : "(null)",
                  (unsigned long long)v);
    ck_assert_msg(v == 12345, "hsz_parse_size(\"%s\") wrote *out on failure", s ? s : "(null)");
}

START_TEST(parse_plain_bytes)
{
    parse_ok("0", 0);
    parse_ok("1", 1);
    parse_ok("512", 512);
    parse_ok("4096", 4096);
    parse_ok("0004096", 4096);
    parse_ok("1000B", 1000);
    parse_ok("1000 B", 1000);
    parse_ok("18446744073709551615", UINT64_MAX);
}
END_TEST

START_TEST(parse_suffixes)
{
    parse_ok("1K", KiB);
    parse_ok("1k", KiB);
    parse_ok("512K", 512 * KiB);
    parse_ok("1M", MiB);
    parse_ok("256M", 256 * MiB);
    parse_ok("256m", 256 * MiB);
    parse_ok("4G", 4 * GiB);
    parse_ok("4g", 4 * GiB);
    parse_ok("2T", 2 * TiB);
    parse_ok("2t", 2 * TiB);
    parse_ok("1KiB", KiB);
    parse_ok("64MiB", 64 * MiB);
    parse_ok("3GiB", 3 * GiB);
    parse_ok("5TiB", 5 * TiB);
    parse_ok("256 MiB", 256 * MiB);
    parse_ok("256  M", 256 * MiB);
    parse_ok("0K", 0);
    parse_ok("0T", 0);
}
END_TEST

START_TEST(parse_overflow_at_2_64)
{
    /* 2^64 - 1 is the largest; 2^64 and beyond are rejected, in every unit. */
    parse_ok("18446744073709551615", UINT64_MAX);
    parse_bad("18446744073709551616");
    parse_bad("18446744073709551620");
    parse_bad("99999999999999999999");
    parse_bad("184467440737095516150");
    parse_bad("100000000000000000000000000000");
    parse_ok("18014398509481983K", UINT64_MAX - (KiB - 1));
    parse_bad("18014398509481984K"); /* 2^54 K = 2^64 */
    parse_ok("17592186044415M", UINT64_MAX - (MiB - 1));
    parse_bad("17592186044416M"); /* 2^44 M */
    parse_ok("17179869183G", UINT64_MAX - (GiB - 1));
    parse_bad("17179869184G"); /* 2^34 G */
    parse_bad("17179869184GiB");
    parse_ok("16777215T", UINT64_MAX - (TiB - 1));
    parse_bad("16777216T"); /* 2^24 T */
    parse_bad("16777216TiB");
    parse_bad("18446744073709551615K");
}
END_TEST

START_TEST(parse_junk)
{
    parse_bad("-1");
    parse_bad("-0");
    parse_bad("+1");
    parse_bad(" 1");
    parse_bad("\t1");
    parse_bad("1 ");
    parse_bad("1M ");
    parse_bad("1\n");
    parse_bad("1x");
    parse_bad("1KB");
    parse_bad("1MB");
    parse_bad("1Ki");
    parse_bad("1kib");
    parse_bad("1KIB");
    parse_bad("1P");
    parse_bad("1E");
    parse_bad("1MM");
    parse_bad("1M1");
    parse_bad("1.5M");
    parse_bad("1,000");
    parse_bad("0x10");
    parse_bad("1e6");
    parse_bad("K");
    parse_bad("M1");
    parse_bad("MiB");
    parse_bad("one");
}
END_TEST

START_TEST(parse_empty_and_null)
{
    parse_bad("");
    parse_bad(" ");
    parse_bad(NULL);
    ck_assert_int_eq(hsz_parse_size("1", NULL), -1);
}
END_TEST

/* Formats v, expecting want. */
static void format_is(uint64_t v, const char *want)
{
    char buf[HSZ_SIZE_BUFLEN];
    memset(buf, 'x', sizeof buf);
    const char *r = hsz_format_size(v, buf, sizeof buf);
    ck_assert_ptr_eq(r, buf);
    ck_assert_str_eq(buf, want);
}

START_TEST(format_exact_units)
{
    format_is(0, "0 B");
    format_is(1, "1 B");
    format_is(512, "512 B");
    format_is(1000, "1000 B");
    format_is(1023, "1023 B");
    format_is(KiB, "1 KiB");
    format_is(1536, "1536 B"); /* 1.5 KiB is not exact */
    format_is(3 * KiB, "3 KiB");
    format_is(512 * KiB, "512 KiB");
    format_is(MiB, "1 MiB");
    format_is(MiB + KiB, "1025 KiB");
    format_is(MiB + 1, "1048577 B");
    format_is(256 * MiB, "256 MiB");
    format_is(1536 * MiB, "1536 MiB");
    format_is(GiB, "1 GiB");
    format_is(4 * GiB, "4 GiB");
    format_is(TiB, "1 TiB");
    format_is(1024 * TiB, "1024 TiB");
    format_is((uint64_t)1 << 63, "8388608 TiB");
    format_is(UINT64_MAX, "18446744073709551615 B");
    format_is(UINT64_MAX - (TiB - 1), "16777215 TiB");
}
END_TEST

START_TEST(format_round_trips)
{
    const uint64_t vals[] = {0,
                             1,
                             7,
                             1000,
                             KiB,
                             3 * KiB + 1,
                             512 * KiB,
                             64 * MiB,
                             3 * GiB,
                             7 * TiB,
                             UINT64_MAX,
                             UINT64_MAX - (TiB - 1),
                             (uint64_t)1 << 63};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        char buf[HSZ_SIZE_BUFLEN];
        ck_assert_ptr_nonnull(hsz_format_size(vals[i], buf, sizeof buf));
        uint64_t back = 0;
        ck_assert_msg(hsz_parse_size(buf, &back) == 0, "\"%s\" does not parse back", buf);
        ck_assert_msg(back == vals[i], "\"%s\" parsed back as %llu, want %llu", buf, (unsigned long long)back,
                      (unsigned long long)vals[i]);
    }
}
END_TEST

START_TEST(format_small_buffers)
{
    char buf[8];
    ck_assert_ptr_null(hsz_format_size(1, NULL, 8));
    ck_assert_ptr_null(hsz_format_size(1, buf, 0));
    /* "256 MiB" needs 8 bytes with its NUL. */
    ck_assert_ptr_eq(hsz_format_size(256 * MiB, buf, 8), buf);
    ck_assert_str_eq(buf, "256 MiB");
    memset(buf, 'x', sizeof buf);
    ck_assert_ptr_null(hsz_format_size(256 * MiB, buf, 7));
    ck_assert_str_eq(buf, "256 Mi"); /* truncated, still terminated */
    ck_assert_ptr_null(hsz_format_size(1000, buf, 1));
    ck_assert_str_eq(buf, "");
}
END_TEST

static Suite *size_suite(void)
{
    Suite *s = suite_create("size");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, parse_plain_bytes);
    tcase_add_test(tc, parse_suffixes);
    tcase_add_test(tc, parse_overflow_at_2_64);
    tcase_add_test(tc, parse_junk);
    tcase_add_test(tc, parse_empty_and_null);
    suite_add_tcase(s, tc);
    tc = tcase_create("format");
    tcase_add_test(tc, format_exact_units);
    tcase_add_test(tc, format_round_trips);
    tcase_add_test(tc, format_small_buffers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(size_suite()); }
