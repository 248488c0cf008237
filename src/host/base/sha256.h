/*
 * sha256.h - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the bootstrap's handshake
 * (internal).
 *
 * MACO proves that a peer knows the job nonce without sending it (bootstrap_private.h, "Setup
 * protocol"). This small implementation keeps libmaco free of a crypto library at link and run
 * time; tests/test_unit.cc checks it against the FIPS 180-4 examples and the RFC 4231 test
 * cases, and against OpenSSL's libcrypto where that is installed. Pure functions of bytes:
 * thread-safe, no allocation.
 */
#ifndef MACO_SHA256_H
#define MACO_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { MACO__SHA256_BYTES = 32, MACO__SHA256_BLOCK = 64 };

/** A running SHA-256 computation: init, update any number of times, final. */
typedef struct maco__sha256 {
    uint32_t h[8];
    uint64_t bytes; /* message length so far */
    uint8_t block[MACO__SHA256_BLOCK];
    size_t used; /* bytes of `block` filled */
} maco__sha256_t;

void maco__sha256_init(maco__sha256_t *s);
void maco__sha256_update(maco__sha256_t *s, const void *data, size_t len);
/** Writes the 32-byte digest; `s` must be initialised again before it is reused. */
void maco__sha256_final(maco__sha256_t *s, uint8_t out[MACO__SHA256_BYTES]);

/** SHA-256 of data[0, len). */
void maco__sha256(const void *data, size_t len, uint8_t out[MACO__SHA256_BYTES]);

/** One piece of an HMAC's message: the message is the pieces one after another. */
typedef struct maco__bytes {
    const void *data;
    size_t len;
} maco__bytes_t;

/**
 * HMAC-SHA256 (RFC 2104 with SHA-256; RFC 4231) of the concatenation of `parts[0, nparts)`
 * under key[0, key_len) (a key longer than the 64-byte block is hashed first, as the RFC says).
 */
void maco__hmac_sha256(const void *key, size_t key_len, const maco__bytes_t *parts, int nparts,
                       uint8_t out[MACO__SHA256_BYTES]);

/** 1 when a[0, len) equals b[0, len), in time that does not depend on where they differ. */
int maco__bytes_equal(const uint8_t *a, const uint8_t *b, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* MACO_SHA256_H */
