/* sha1.h - SHA-1 of a buffer as 40 hex digits (sha1.c). */
#ifndef HEAPD_SHA1_H
#define HEAPD_SHA1_H

#include <stddef.h>

/* out gets 40 lowercase hex digits and a NUL. */
void sha1_hex(const void *data, size_t len, char out[41]);

#endif
