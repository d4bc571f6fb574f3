/* hmac.c - HMAC-SHA1 (RFC 2104) over sha1.c; written for heapd from the RFC
 * text. */
#include "hmac.h"

#include <stdio.h>
#include <string.h>

void hmac_init(hmac_ctx *h, const void *key, size_t keylen)
{
    unsigned char k[64] = {0}, ipad[64];
    if (keylen > 64) {
        sha1_ctx c;
        sha1_init(&c);
        sha1_update(&c, key, keylen);
        sha1_final(&c, k);
    } else if (keylen) {
        memcpy(k, key, keylen);
    }
    for (int i = 0; i < 64; i++) {
        ipad[i] = k[i] ^ 0x36;
        h->opad[i] = k[i] ^ 0x5c;
    }
    sha1_init(&h->inner);
    sha1_update(&h->inner, ipad, sizeof ipad);
    explicit_bzero(k, sizeof k);
    explicit_bzero(ipad, sizeof ipad);
}

void hmac_update(hmac_ctx *h, const void *data, size_t len) { sha1_update(&h->inner, data, len); }

void hmac_final_hex(hmac_ctx *h, char out[HMAC_HEX_LEN + 1])
{
    unsigned char d[HMAC_SHA1_LEN];
    sha1_ctx o;
    sha1_final(&h->inner, d);
    sha1_init(&o);
    sha1_update(&o, h->opad, sizeof h->opad);
    sha1_update(&o, d, sizeof d);
    sha1_final(&o, d);
    for (int i = 0; i < HMAC_SHA1_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
    explicit_bzero(h, sizeof *h);
    explicit_bzero(&o, sizeof o);
}

int hmac_equal(const void *a, const void *b, size_t n)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}
