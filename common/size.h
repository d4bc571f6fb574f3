/* size.h - byte sizes as people write them: "4096", "512K", "256M", "4G",
 * "1T", "64MiB", "256 MiB".
 *
 * What this module promises:
 *   - hsz_parse_size accepts a decimal number of bytes (digits only: no sign,
 *     no leading space, no fraction, no hex) with an optional suffix, K, M, G,
 *     T (either case) or KiB, MiB, GiB, TiB or B, optionally after spaces.
 *     Every unit is a power of 1024. It rejects the empty string, NULL, a
 *     sign, anything after the suffix and any value of 2^64 bytes or more.
 *   - hsz_format_size writes the largest binary unit that divides the value
 *     exactly ("256 MiB", "3 KiB", "1 TiB"), else the bytes ("1000 B");
 *     0 is "0 B". Its output parses back with hsz_parse_size.
 *   - No allocation, no globals, no printing: thread-safe.
 */
#ifndef HEAPD_SIZE_H
#define HEAPD_SIZE_H

#include <stddef.h>
#include <stdint.h>

/* Enough for any hsz_format_size output ("18446744073709551615 B" + NUL). */
#define HSZ_SIZE_BUFLEN 32

/* Parses s into *out. Returns 0, or -1 (and leaves *out unchanged) when s is
 * NULL, empty, not a size as described above, or 2^64 bytes or more. */
int hsz_parse_size(const char *s, uint64_t *out);

/* Writes bytes into buf as described above and returns buf. Returns NULL
 * when buf is NULL, len is 0, or the text does not fit (buf then holds as
 * much as fits, NUL-terminated); HSZ_SIZE_BUFLEN bytes always suffice. */
const char *hsz_format_size(uint64_t bytes, char *buf, size_t len);

#endif
