/* utf8.h - UTF-8 validation for output that must be UTF-8 (JSON, Prometheus
 * labels, journal fields) while names from clients are arbitrary bytes. */
#ifndef HEAPD_UTF8_H
#define HEAPD_UTF8_H

/* Length of the valid UTF-8 sequence at p (1..4), or 0 when the bytes there
 * are not one (overlong forms, surrogates and values above U+10FFFF
 * included). p must be NUL-terminated. */
static inline int hu_len(const unsigned char *p)
{
    if (p[0] < 0x80)
        return 1;
    int n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (!n || p[0] > 0xf4)
        return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) || (p[0] == 0xf0 && p[1] < 0x90) ||
        (p[0] == 0xf4 && p[1] >= 0x90))
        return 0;
    return n;
}

#endif
