/* sha1.h - SHA-1 of a buffer as 40 hex digits, or incrementally (sha1.c). */
#ifndef HEAPD_SHA1_H
#define HEAPD_SHA1_H

#include <stddef.h>
#include <stdint.h>

/* out gets 40 lowercase hex digits and a NUL. */
void sha1_hex(const void *data, size_t len, char out[41]);

/* Incremental: init, any number of updates, final (20 bytes).
 * Invariant: used == total bytes fed % 64 bytes wait in buf; total counts all. */
typedef struct sha1_ctx {
    uint32_t h[5];
    unsigned char buf[64];
    size_t used;
    uint64_t total;
} sha1_ctx;
void sha1_init(sha1_ctx *c);
void sha1_update(sha1_ctx *c, const void *data, size_t len);
void sha1_final(sha1_ctx *c, unsigned char out[20]);

#endif
