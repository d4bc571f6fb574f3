/* hmac.h - HMAC-SHA1 (RFC 2104), for the store's signed collect results
 * (issue 33 item 1): a node accepts a result only with the cluster key's
 * MAC (hmac.c). */
#ifndef HEAPD_HMAC_H
#define HEAPD_HMAC_H

#include <stddef.h>

#include "sha1.h"

#define HMAC_SHA1_LEN 20
#define HMAC_HEX_LEN  40

/* An HMAC in progress over pieces of one message. Invariant: inner has
 * consumed key ^ ipad (64 bytes) and the pieces so far; opad holds key ^
 * opad. */
typedef struct hmac_ctx {
    sha1_ctx inner;
    unsigned char opad[64];
} hmac_ctx;

void hmac_init(hmac_ctx *h, const void *key, size_t keylen);
void hmac_update(hmac_ctx *h, const void *data, size_t len);
/* out: 40 lowercase hex digits and a NUL. Wipes h. */
void hmac_final_hex(hmac_ctx *h, char out[HMAC_HEX_LEN + 1]);
/* 1 when a and b (n bytes each) are equal, in time that does not depend
 * on where they differ. */
int hmac_equal(const void *a, const void *b, size_t n);

#endif
