/*
 * words.cuh - loading and storing a W-byte word (8 or 16 bytes) of which only the first
 * `valid` bytes are real, at any alignment: the edges of every collective kernel's buffers
 * (device code the library compiles; src/device is shared by the algorithms).
 */
#ifndef MACO_DEVICE_WORDS_CUH
#define MACO_DEVICE_WORDS_CUH

#include <stdint.h>

/* `valid` (1..W) bytes at p as a W-byte word (maco__vec); the rest read as zero. */
template <int W, class V>
static __device__ __forceinline__ V maco__load_part(const char *p, uint32_t valid)
{
    if (valid == (uint32_t)W && ((uintptr_t)p % W) == 0)
        return *(const V *)p;
    V v;
#pragma unroll
    for (int k = 0; k < W / 4; k++)
        v.w[k] = 0u;
    for (uint32_t k = 0; k < valid; k++)
        v.w[k / 4] |= (uint32_t)(uint8_t)p[k] << (8 * (k % 4));
    return v;
}

/* Stores the first `valid` (1..W) bytes of a W-byte word at p. */
template <int W, class V>
static __device__ __forceinline__ void maco__store_part(char *p, const V &v, uint32_t valid)
{
    if (valid == (uint32_t)W && ((uintptr_t)p % W) == 0) {
        *(V *)p = v;
        return;
    }
    for (uint32_t k = 0; k < valid; k++)
        p[k] = (char)(v.w[k / 4] >> (8 * (k % 4)));
}

#endif /* MACO_DEVICE_WORDS_CUH */
