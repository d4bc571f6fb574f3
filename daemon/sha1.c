/* sha1.c - SHA-1 (FIPS 180-4), for EVALSHA: the store names its Lua script
 * by its SHA-1, as Redis does. Written for heapd from the FIPS 180-4 text; no
 * code borrowed. Collisions matter nowhere here: HMAC-SHA1 (hmac.c) only
 * needs SHA-1 as a PRF. */
#include "sha1.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static uint32_t rol32(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void sha1_block(uint32_t h[5], const unsigned char *p)
{
    uint32_t w[80], a, b, c, d, e, f, k, t;
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
               (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol32(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; i++) {
        if (i < 20)
            f = (b & c) | (~b & d), k = 0x5A827999u;
        else if (i < 40)
            f = b ^ c ^ d, k = 0x6ED9EBA1u;
        else if (i < 60)
            f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDCu;
        else
            f = b ^ c ^ d, k = 0xCA62C1D6u;
        t = rol32(a, 5) + f + e + k + w[i];
        e = d, d = c, c = rol32(b, 30), b = a, a = t;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
}

void sha1_init(sha1_ctx *c)
{
    static const uint32_t h0[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
    memcpy(c->h, h0, sizeof h0);
    c->used = 0;
    c->total = 0;
}

void sha1_update(sha1_ctx *c, const void *data, size_t len)
{
    const unsigned char *p = data;
    c->total += len;
    if (c->used) {
        size_t take = 64 - c->used < len ? 64 - c->used : len;
        memcpy(c->buf + c->used, p, take);
        c->used += take;
        p += take;
        len -= take;
        if (c->used < 64)
            return;
        sha1_block(c->h, c->buf);
        c->used = 0;
    }
    for (; len >= 64; p += 64, len -= 64)
        sha1_block(c->h, p);
    memcpy(c->buf, p, len);
    c->used = len;
}

void sha1_final(sha1_ctx *c, unsigned char out[20])
{
    uint64_t bits = c->total * 8;
    unsigned char pad[72] = {0x80};
    size_t padlen = (c->used < 56 ? 56 : 120) - c->used;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha1_update(c, pad, padlen);
    sha1_update(c, len8, 8);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (unsigned char)(c->h[i] >> (24 - 8 * j));
}

void sha1_hex(const void *data, size_t len, char out[41])
{
    sha1_ctx c;
    unsigned char d[20];
    sha1_init(&c);
    sha1_update(&c, data, len);
    sha1_final(&c, d);
    for (int i = 0; i < 20; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}
