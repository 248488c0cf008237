/*
 * reduce.cuh - element arithmetic of the reduction kernels (internal).
 *
 * Values travel as 32-bit words; each type says how many elements a word holds and how to
 * widen them to float and narrow back. Every reduction accumulates in float32 in rank
 * order 0..n-1 and narrows once (round to nearest even), which is what makes results
 * bitwise identical on every rank and every run (collectives.h).
 */
#ifndef MACO_REDUCE_CUH
#define MACO_REDUCE_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "comm_internal.h"

struct maco__f32 {
    static constexpr int per_word = 1;
    static constexpr int elem_bytes = 4;
    static __device__ __forceinline__ void widen(uint32_t w, float *f)
    {
        f[0] = __uint_as_float(w);
    }
    static __device__ __forceinline__ uint32_t narrow(const float *f)
    {
        return __float_as_uint(f[0]);
    }
};

struct maco__bf16 {
    static constexpr int per_word = 2;
    static constexpr int elem_bytes = 2;
    static __device__ __forceinline__ void widen(uint32_t w, float *f)
    {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    }
    static __device__ __forceinline__ uint32_t narrow(const float *f)
    {
        uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(f[0]));
        uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(f[1]));
        return lo | (hi << 16);
    }
};

/* Sum of words w[0..n) of one position, in rank order. */
template <class D>
static __device__ __forceinline__ uint32_t maco__sum_word(const uint32_t *w, int n)
{
    float acc[D::per_word], t[D::per_word];
    D::widen(w[0], acc);
#pragma unroll
    for (int q = 1; q < MACO__MAX_LOCAL_RANKS; q++) {
        if (q < n) {
            D::widen(w[q], t);
#pragma unroll
            for (int l = 0; l < D::per_word; l++)
                acc[l] += t[l];
        }
    }
    return D::narrow(acc);
}

/* Sum of single elements (tails that do not fill a word): `src[q]` points at rank q's
 * element (naturally aligned). Returns the result's bits in the low elem_bytes bytes. */
template <class D>
static __device__ __forceinline__ uint32_t maco__sum_element(const char *const *src, int n)
{
    uint32_t w[MACO__MAX_LOCAL_RANKS];
#pragma unroll
    for (int q = 0; q < MACO__MAX_LOCAL_RANKS; q++) {
        w[q] = 0u;
        if (q < n)
            w[q] = D::elem_bytes == 4 ? *(const uint32_t *)src[q]
                                      : (uint32_t) * (const uint16_t *)src[q];
    }
    /* A 16-bit element sits in the low half of the word; the high half sums zeros. */
    return maco__sum_word<D>(w, n);
}

#endif /* MACO_REDUCE_CUH */
