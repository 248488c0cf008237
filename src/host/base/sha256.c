/* sha256.c - SHA-256 and HMAC-SHA256; see sha256.h. The section numbers are FIPS 180-4's. */
#include "src/host/base/sha256.h"

#include <string.h>

/* 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64 primes. */
static const uint32_t maco__sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u,
};

static inline uint32_t maco__rotr(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

/* 6.2.2: one 64-byte block into the hash value. */
static void maco__sha256_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
               (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = maco__rotr(w[t - 15], 7) ^ maco__rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = maco__rotr(w[t - 2], 17) ^ maco__rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t S1 = maco__rotr(e, 6) ^ maco__rotr(e, 11) ^ maco__rotr(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = k + S1 + ch + maco__sha256_k[t] + w[t];
        uint32_t S0 = maco__rotr(a, 2) ^ maco__rotr(a, 13) ^ maco__rotr(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

void maco__sha256_init(maco__sha256_t *s)
{
    /* 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8
     * primes. */
    static const uint32_t h0[8] = { 0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                    0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u };
    memcpy(s->h, h0, sizeof(h0));
    s->bytes = 0;
    s->used = 0;
}

void maco__sha256_update(maco__sha256_t *s, const void *data, size_t len)
{
    const uint8_t *p = (const uint8_t *)data;
    s->bytes += len;
    while (len > 0) {
        size_t take = MACO__SHA256_BLOCK - s->used;
        if (take > len)
            take = len;
        memcpy(s->block + s->used, p, take);
        s->used += take;
        p += take;
        len -= take;
        if (s->used == MACO__SHA256_BLOCK) {
            maco__sha256_block(s->h, s->block);
            s->used = 0;
        }
    }
}

void maco__sha256_final(maco__sha256_t *s, uint8_t out[MACO__SHA256_BYTES])
{
    /* 5.1.1: a 1 bit, zeros up to 56 bytes modulo 64, the length in bits (big-endian u64). */
    uint64_t bits = s->bytes * 8u;
    uint8_t pad = 0x80;
    maco__sha256_update(s, &pad, 1);
    pad = 0;
    while (s->used != 56)
        maco__sha256_update(s, &pad, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(bits >> (56 - 8 * i));
    maco__sha256_update(s, len, sizeof(len));
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void maco__sha256(const void *data, size_t len, uint8_t out[MACO__SHA256_BYTES])
{
    maco__sha256_t s;
    maco__sha256_init(&s);
    maco__sha256_update(&s, data, len);
    maco__sha256_final(&s, out);
}

void maco__hmac_sha256(const void *key, size_t key_len, const maco__bytes_t *parts, int nparts,
                       uint8_t out[MACO__SHA256_BYTES])
{
    /* RFC 2104: H((K ^ opad) || H((K ^ ipad) || message)), K padded with zeros to a block. */
    uint8_t k[MACO__SHA256_BLOCK];
    memset(k, 0, sizeof(k));
    if (key_len > MACO__SHA256_BLOCK)
        maco__sha256(key, key_len, k);
    else if (key_len > 0)
        memcpy(k, key, key_len);
    uint8_t pad[MACO__SHA256_BLOCK];
    for (int i = 0; i < MACO__SHA256_BLOCK; i++)
        pad[i] = (uint8_t)(k[i] ^ 0x36);
    maco__sha256_t s;
    maco__sha256_init(&s);
    maco__sha256_update(&s, pad, sizeof(pad));
    for (int i = 0; i < nparts; i++)
        maco__sha256_update(&s, parts[i].data, parts[i].len);
    uint8_t inner[MACO__SHA256_BYTES];
    maco__sha256_final(&s, inner);
    for (int i = 0; i < MACO__SHA256_BLOCK; i++)
        pad[i] = (uint8_t)(k[i] ^ 0x5c);
    maco__sha256_init(&s);
    maco__sha256_update(&s, pad, sizeof(pad));
    maco__sha256_update(&s, inner, sizeof(inner));
    maco__sha256_final(&s, out);
}

int maco__bytes_equal(const uint8_t *a, const uint8_t *b, size_t len)
{
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < len; i++)
        diff = (uint8_t)(diff | (a[i] ^ b[i]));
    return diff == 0;
}
