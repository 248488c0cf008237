/*
 * reduce.cuh - element arithmetic of the reduction kernels (internal).
 *
 * A type trait says how an element is stored (`bits`), what it accumulates in (`acc`) and
 * how to convert between the two; an op trait combines two accumulators. Every reduction
 * combines the ranks' values in rank order 0..n-1 and converts once at the end, which is
 * what makes results bitwise identical on every rank and every run (collectives.h):
 *   - float16, bfloat16, fp8 e4m3/e5m2 and float32 accumulate in float32, narrowed once
 *     with round to nearest even (fp8 without saturation: NaN / inf on overflow, as the
 *     OCP FP8 specification's non-saturating mode); float64 in float64;
 *   - integers accumulate in their own width with wrap-around (two's complement) for sum
 *     and prod, as NCCL does;
 *   - avg is sum followed by one division by the number of ranks (floating types in the
 *     accumulator's precision; integers truncate toward zero, like NCCL's post-divide).
 *
 * Kernels move data in 8- or 16-byte words (maco__vec); maco__reduce_vec reduces word
 * position by word position, each word holding 16 / sizeof(bits) elements.
 */
#ifndef MACO_REDUCE_CUH
#define MACO_REDUCE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "src/host/comm/comm_internal.h"

/* ------------------------------------------------------------------ types */

template <class Bits, class Acc> struct maco__int_type {
    typedef Bits bits;
    typedef Acc acc;
    static __host__ __device__ __forceinline__ acc widen(bits b)
    {
        return (acc)b;
    }
    static __host__ __device__ __forceinline__ bits narrow(acc a)
    {
        return (bits)a;
    }
    static __host__ __device__ __forceinline__ acc div(acc a, int n)
    {
        return a / (acc)n;
    }
    /* Sum and product wrap around: computed on the unsigned type of the same width. */
    static __host__ __device__ __forceinline__ acc add(acc a, acc b)
    {
        return (acc)((bits)((bits)a + (bits)b));
    }
    static __host__ __device__ __forceinline__ acc mul(acc a, acc b)
    {
        return (acc)((bits)((bits)a * (bits)b));
    }
};

/* Signed types keep their signed value in acc (for min, max and avg); bits is unsigned. */
struct maco__t_i8 : maco__int_type<uint8_t, int8_t> {
};
struct maco__t_u8 : maco__int_type<uint8_t, uint8_t> {
};
struct maco__t_i32 : maco__int_type<uint32_t, int32_t> {
};
struct maco__t_u32 : maco__int_type<uint32_t, uint32_t> {
};
struct maco__t_i64 : maco__int_type<uint64_t, int64_t> {
};
struct maco__t_u64 : maco__int_type<uint64_t, uint64_t> {
};

template <class Bits, class Acc> struct maco__float_type {
    typedef Bits bits;
    typedef Acc acc;
    static __host__ __device__ __forceinline__ acc div(acc a, int n)
    {
        return a / (acc)n;
    }
    static __host__ __device__ __forceinline__ acc add(acc a, acc b)
    {
        return a + b;
    }
    static __host__ __device__ __forceinline__ acc mul(acc a, acc b)
    {
        return a * b;
    }
};

/* The bits of `v` as another type of the same size. */
template <class To, class From> static __host__ __device__ __forceinline__ To maco__bit_cast(From v)
{
    static_assert(sizeof(To) == sizeof(From), "bit cast between equal sizes");
    union {
        From f;
        To t;
    } x;
    x.f = v;
    return x.t;
}

struct maco__t_f32 : maco__float_type<uint32_t, float> {
    static __host__ __device__ __forceinline__ float widen(uint32_t b)
    {
        return maco__bit_cast<float>(b);
    }
    static __host__ __device__ __forceinline__ uint32_t narrow(float a)
    {
        return maco__bit_cast<uint32_t>(a);
    }
};

struct maco__t_f64 : maco__float_type<uint64_t, double> {
    static __host__ __device__ __forceinline__ double widen(uint64_t b)
    {
        return maco__bit_cast<double>(b);
    }
    static __host__ __device__ __forceinline__ uint64_t narrow(double a)
    {
        return maco__bit_cast<uint64_t>(a);
    }
};

struct maco__t_bf16 : maco__float_type<uint16_t, float> {
    static __host__ __device__ __forceinline__ float widen(uint16_t b)
    {
        return maco__t_f32::widen((uint32_t)b << 16);
    }
    static __host__ __device__ __forceinline__ uint16_t narrow(float a)
    {
        return __bfloat16_as_ushort(__float2bfloat16_rn(a));
    }
};

struct maco__t_f16 : maco__float_type<uint16_t, float> {
    static __host__ __device__ __forceinline__ float widen(uint16_t b)
    {
        return __half2float(__ushort_as_half(b));
    }
    static __host__ __device__ __forceinline__ uint16_t narrow(float a)
    {
        return __half_as_ushort(__float2half_rn(a));
    }
};

template <__nv_fp8_interpretation_t Kind> struct maco__t_fp8 : maco__float_type<uint8_t, float> {
    static __host__ __device__ __forceinline__ float widen(uint8_t b)
    {
        __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, Kind);
        return __half2float(__half(h));
    }
    static __host__ __device__ __forceinline__ uint8_t narrow(float a)
    {
        return (uint8_t)__nv_cvt_float_to_fp8(a, __NV_NOSAT, Kind);
    }
};
typedef maco__t_fp8<__NV_E4M3> maco__t_e4m3;
typedef maco__t_fp8<__NV_E5M2> maco__t_e5m2;

/* ------------------------------------------------------------------ ops */

/*
 * avg is MACO__OP_SUM plus a division by n at the end (a run-time flag of the kernels).
 * Kernels are compiled for two ops only: SUM, the one that matters for speed, and RUNTIME,
 * which reads prod, min or max from the kernel's arguments (`rop`, one of the first four
 * values) per element: a uniform branch in memory-bound code. One instantiation instead of
 * three halves the kernels' build time (README, build time) for no measurable cost on
 * those ops.
 */
enum {
    MACO__OP_SUM = 0,
    MACO__OP_PROD = 1,
    MACO__OP_MIN = 2,
    MACO__OP_MAX = 3,
    MACO__OP_RUNTIME = 4
};

template <class T, int Op>
static __host__ __device__ __forceinline__ typename T::acc maco__combine(typename T::acc a,
                                                                         typename T::acc b, int rop)
{
    const int op = Op == MACO__OP_RUNTIME ? rop : Op;
    if (op == MACO__OP_SUM)
        return T::add(a, b);
    if (op == MACO__OP_PROD)
        return T::mul(a, b);
    if (op == MACO__OP_MIN)
        return b < a ? b : a;
    return b > a ? b : a;
}

/* ------------------------------------------------------------------ words */

/* W bytes (8 or 16) seen as 32-bit words or as elements. */
template <int W, class Bits> union __align__(W) maco__vec
{
    uint32_t w[W / 4];
    Bits e[W / sizeof(Bits)];
};

/*
 * out = op over q in [0, n) of v[q], element by element, in rank order; avg divides by n
 * at the end (sum only). v has MACO__MAX_LOCAL_RANKS entries, of which the first n are used.
 * `rop` is the op when Op is MACO__OP_RUNTIME.
 */
template <class T, int Op, int W>
static __device__ __forceinline__ void maco__reduce_vec(maco__vec<W, typename T::bits> *out,
                                                        const maco__vec<W, typename T::bits> *v,
                                                        int n, bool avg, int rop)
{
    constexpr int E = W / (int)sizeof(typename T::bits);
#pragma unroll
    for (int j = 0; j < E; j++) {
        typename T::acc acc = T::widen(v[0].e[j]);
#pragma unroll
        for (int q = 1; q < MACO__MAX_LOCAL_RANKS; q++)
            if (q < n)
                acc = maco__combine<T, Op>(acc, T::widen(v[q].e[j]), rop);
        if (Op == MACO__OP_SUM && avg)
            acc = T::div(acc, n);
        out->e[j] = T::narrow(acc);
    }
}

#endif /* MACO_REDUCE_CUH */
