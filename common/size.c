/* size.c - parse and format byte sizes. See size.h. */
#include "size.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Unit suffixes accepted by hsz_parse_size, with their power of 1024. */
static const struct {
    const char *name;
    unsigned shift;
} units[] = {
    {"", 0},     {"B", 0},  {"K", 10}, {"k", 10},   {"KiB", 10}, {"M", 20}, {"m", 20},
    {"MiB", 20}, {"G", 30}, {"g", 30}, {"GiB", 30}, {"T", 40},   {"t", 40}, {"TiB", 40},
};

int hsz_parse_size(const char *s, uint64_t *out)
{
    if (s == NULL || out == NULL || *s < '0' || *s > '9')
        return -1;
    uint64_t v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    const char *digits_end = p;
    while (*p == ' ')
        p++;
    /* Spaces only between the number and a suffix: "4 " is junk. */
    if (*p == '\0' && p != digits_end)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].name) != 0)
            continue;
        unsigned shift = units[i].shift;
        if (shift != 0 && v > (UINT64_MAX >> shift))
            return -1;
        *out = v << shift;
        return 0;
    }
    return -1;
}

const char *hsz_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const names[] = {"TiB", "GiB", "MiB", "KiB"};
    static const unsigned shifts[] = {40, 30, 20, 10};
    if (buf == NULL || len == 0)
        return NULL;
    int n = -1;
    if (bytes != 0) {
        for (size_t i = 0; i < 4; i++) {
            uint64_t unit = (uint64_t)1 << shifts[i];
            if (bytes % unit == 0) {
                n = snprintf(buf, len, "%" PRIu64 " %s", bytes >> shifts[i], names[i]);
                break;
            }
        }
    }
    if (n < 0)
        n = snprintf(buf, len, "%" PRIu64 " B", bytes);
    if (n < 0 || (size_t)n >= len)
        return NULL;
    return buf;
}
