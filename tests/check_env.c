/* check_env.c - common/env.h: HEAPD_NAME first, HEAPC_NAME as its alias. */
#include <check.h>
#include <stdlib.h>

#include "check_util.h"
#include "env.h"

START_TEST(prefix_and_alias)
{
    unsetenv("HEAPD_CHECK_ENV_X");
    unsetenv("HEAPC_CHECK_ENV_X");
    ck_assert_ptr_null(henv_get("CHECK_ENV_X"));
    setenv("HEAPC_CHECK_ENV_X", "old", 1);
    ck_assert_str_eq(henv_get("CHECK_ENV_X"), "old");
    setenv("HEAPD_CHECK_ENV_X", "new", 1);
    ck_assert_str_eq(henv_get("CHECK_ENV_X"), "new");
    unsetenv("HEAPC_CHECK_ENV_X");
    ck_assert_str_eq(henv_get("CHECK_ENV_X"), "new");
}
END_TEST

/* Messages name the variable that was read. */
START_TEST(which_variable)
{
    char b[64];
    unsetenv("HEAPD_CHECK_ENV_Y");
    unsetenv("HEAPC_CHECK_ENV_Y");
    ck_assert_str_eq(henv_which("CHECK_ENV_Y", b, sizeof b), "HEAPD_CHECK_ENV_Y");
    setenv("HEAPC_CHECK_ENV_Y", "old", 1);
    ck_assert_str_eq(henv_which("CHECK_ENV_Y", b, sizeof b), "HEAPC_CHECK_ENV_Y");
    setenv("HEAPD_CHECK_ENV_Y", "new", 1);
    ck_assert_str_eq(henv_which("CHECK_ENV_Y", b, sizeof b), "HEAPD_CHECK_ENV_Y");
    volatile size_t small = 8; /* too small for the name: "" (not known at compile time) */
    ck_assert_str_eq(henv_which("CHECK_ENV_Y", b, small), "");
    unsetenv("HEAPD_CHECK_ENV_Y");
    unsetenv("HEAPC_CHECK_ENV_Y");
}
END_TEST

/* A name too long for the buffer is never read (NULL), not cut short. */
START_TEST(long_name)
{
    char n[200];
    for (int i = 0; i < 199; i++)
        n[i] = 'A';
    n[199] = 0;
    ck_assert_ptr_null(henv_get(n));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("env");
    TCase *tc = tcase_create("env");
    tcase_add_test(tc, prefix_and_alias);
    tcase_add_test(tc, long_name);
    tcase_add_test(tc, which_variable);
    suite_add_tcase(s, tc);
    return cku_run(s);
}
