/* check_heapc_abi.c - client/heapc_abi.c: heapc_abi_version, heapc_sizeof
 * and heapc_parse_size, what the bindings rely on. */
#include "heapc.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include "check_util.h"

START_TEST(abi_version_is_the_header_s) { ck_assert_uint_eq(heapc_abi_version(), HEAPC_ABI_VERSION); }
END_TEST

START_TEST(sizeof_names_every_public_struct)
{
    ck_assert_uint_eq(heapc_sizeof("heapc_params"), sizeof(heapc_params));
    ck_assert_uint_eq(heapc_sizeof("heapc_status_t"), sizeof(heapc_status_t));
    ck_assert_uint_eq(heapc_sizeof("heapc_counters"), sizeof(heapc_counters));
    ck_assert_uint_eq(heapc_sizeof("heapc_rank_stats"), sizeof(heapc_rank_stats));
    ck_assert_uint_eq(heapc_sizeof("heapc_hist"), sizeof(heapc_hist));
    ck_assert_uint_eq(heapc_sizeof("heapc_heap_stats"), sizeof(heapc_heap_stats));
    ck_assert_uint_eq(heapc_sizeof("heapc_daemon_stats"), sizeof(heapc_daemon_stats));
    ck_assert_uint_eq(heapc_sizeof("heapc_block"), sizeof(heapc_block));
    ck_assert_uint_eq(heapc_sizeof("heapc"), 0);
    ck_assert_uint_eq(heapc_sizeof(""), 0);
    ck_assert_uint_eq(heapc_sizeof(NULL), 0);
}
END_TEST

START_TEST(parse_size_is_heapd_conf_s)
{
    uint64_t v = 7;
    ck_assert_int_eq(heapc_parse_size("64M", &v), 0);
    ck_assert_uint_eq(v, (uint64_t)64 << 20);
    ck_assert_int_eq(heapc_parse_size("256 MiB", &v), 0);
    ck_assert_uint_eq(v, (uint64_t)256 << 20);
    const char *bad[] = {"1.5G", "64MB", "64Mi", "-1", "", " 4", "4 ", "18446744073709551616", NULL};
    for (int i = 0; bad[i]; i++) {
        v = 7;
        ck_assert_msg(heapc_parse_size(bad[i], &v) == HEAPC_EINVAL, "took \"%s\"", bad[i]);
        ck_assert_uint_eq(v, 7);
    }
    ck_assert_int_eq(heapc_parse_size(NULL, &v), HEAPC_EINVAL);
    ck_assert_int_eq(heapc_parse_size("4K", NULL), HEAPC_EINVAL);
}
END_TEST

static Suite *abi_suite(void)
{
    Suite *s = suite_create("heapc_abi");
    TCase *tc = tcase_create("abi");
    tcase_add_test(tc, abi_version_is_the_header_s);
    tcase_add_test(tc, sizeof_names_every_public_struct);
    tcase_add_test(tc, parse_size_is_heapd_conf_s);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return cku_run(abi_suite()); }
