/* check_util.h - what the check_*.c unit tests share: an fd count, a small
 * deterministic rng, and the suite runner main() calls. Header only: each
 * test is one program. */
#ifndef HEAPD_CHECK_UTIL_H
#define HEAPD_CHECK_UTIL_H

#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>

/* Open fds of this process (its /proc/self/fd, without the directory's own). */
static inline int cku_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

/* xorshift64*: the same sequence on every machine for a seed != 0. */
static inline uint64_t cku_rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

static inline uint64_t cku_rng_below(uint64_t *s, uint64_t n) { return n ? cku_rng_next(s) % n : 0; }

/* Runs every test of `s` (CK_ENV: CK_VERBOSITY=verbose lists each) and
 * returns main's exit status. */
static inline int cku_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
