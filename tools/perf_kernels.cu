/* perf_kernels.cu - see perf_kernels.h. */
#include "perf_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

/* splitmix64 finaliser (Steele, Lea, Flood: "Fast splittable pseudorandom number
 * generators", OOPSLA 2014). */
static __host__ __device__ __forceinline__ uint64_t perf_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Rank r's input element i as a float in [-1, 1) with 24 significant bits. */
static __host__ __device__ __forceinline__ float perf_value(uint64_t seed, int rank, uint64_t i)
{
    uint64_t h = perf_mix(seed ^ perf_mix((uint64_t)rank * 0x100000001B3ull + i * 0x9E37ull));
    return (float)(int32_t)(h >> 40) / 8388608.0f - 1.0f; /* (0 .. 2^24-1) / 2^23 - 1 */
}

/* The element as stored (bits) and as widened back to float. */
static __host__ __device__ __forceinline__ uint32_t perf_bits(float v, int dtype)
{
    if (dtype == MACO_PERF_BF16)
        return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v));
    union {
        float f;
        uint32_t u;
    } x;
    x.f = v;
    return x.u;
}

static __host__ __device__ __forceinline__ float perf_widen(uint32_t bits, int dtype)
{
    union {
        float f;
        uint32_t u;
    } x;
    x.u = dtype == MACO_PERF_BF16 ? bits << 16 : bits;
    return x.f;
}

static __host__ __device__ __forceinline__ uint32_t perf_expected(uint64_t i, int dtype,
                                                                  uint64_t seed, int nranks)
{
    float acc = perf_widen(perf_bits(perf_value(seed, 0, i), dtype), dtype);
    for (int q = 1; q < nranks; q++)
        acc += perf_widen(perf_bits(perf_value(seed, q, i), dtype), dtype);
    return perf_bits(acc, dtype);
}

__global__ void perf_fill_kernel(void *buf, size_t count, int dtype, uint64_t seed, int rank)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t b = perf_bits(perf_value(seed, rank, i), dtype);
        if (dtype == MACO_PERF_BF16)
            ((uint16_t *)buf)[i] = (uint16_t)b;
        else
            ((uint32_t *)buf)[i] = b;
    }
}

/* Adds every thread's count of wrong elements to *wrong: a warp-level sum, then one atomic
 * per warp. Every thread of the warp must call it (full-warp shuffle). */
static __device__ __forceinline__ void perf_add_wrong(unsigned long long mine,
                                                      unsigned long long *wrong)
{
    for (int o = 16; o > 0; o >>= 1)
        mine += __shfl_down_sync(0xffffffffu, mine, o);
    if ((threadIdx.x & 31) == 0 && mine)
        atomicAdd(wrong, mine);
}

__global__ void perf_check_kernel(const void *out, size_t count, int dtype, uint64_t seed,
                                  int nranks, unsigned long long *wrong,
                                  unsigned long long *first_wrong)
{
    unsigned long long mine = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t got =
            dtype == MACO_PERF_BF16 ? ((const uint16_t *)out)[i] : ((const uint32_t *)out)[i];
        if (got != perf_expected(i, dtype, seed, nranks)) {
            mine++;
            atomicMin(first_wrong, (unsigned long long)i);
        }
    }
    perf_add_wrong(mine, wrong);
}

__global__ void perf_check_bytes_kernel(const uint8_t *buf, size_t bytes, uint8_t value,
                                        unsigned long long *wrong)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes;
         i += (size_t)gridDim.x * blockDim.x)
        if (buf[i] != value)
            atomicAdd(wrong, 1ull);
}

static int perf_blocks(size_t n)
{
    size_t b = (n + 255) / 256;
    return b > 2048 ? 2048 : (b == 0 ? 1 : (int)b);
}

extern "C" cudaError_t maco_perf_fill(void *buf, size_t count, int dtype, uint64_t seed, int rank,
                                      cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    perf_fill_kernel<<<perf_blocks(count), 256, 0, stream>>>(buf, count, dtype, seed, rank);
    return cudaGetLastError();
}

extern "C" cudaError_t maco_perf_check_sum(const void *out, size_t count, int dtype, uint64_t seed,
                                           int nranks, unsigned long long *wrong,
                                           unsigned long long *first_wrong, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    perf_check_kernel<<<perf_blocks(count), 256, 0, stream>>>(out, count, dtype, seed, nranks,
                                                              wrong, first_wrong);
    return cudaGetLastError();
}

extern "C" cudaError_t maco_perf_check_bytes(const void *buf, size_t bytes, uint8_t value,
                                             unsigned long long *wrong, cudaStream_t stream)
{
    if (bytes == 0)
        return cudaSuccess;
    perf_check_bytes_kernel<<<perf_blocks(bytes), 256, 0, stream>>>((const uint8_t *)buf, bytes,
                                                                    value, wrong);
    return cudaGetLastError();
}

extern "C" uint32_t maco_perf_expected_bits_host(size_t i, int dtype, uint64_t seed, int nranks)
{
    return perf_expected(i, dtype, seed, nranks);
}

/* ------------------------------------------------------------------ every collective */

static __host__ __device__ __forceinline__ int perf_is_float(int dt)
{
    return dt >= MACO_FLOAT16 && dt != MACO_DATATYPE_COUNT;
}

/* Significand bits (implicit bit included) of the floating types. */
static __host__ __device__ __forceinline__ int perf_precision(int dt)
{
    switch (dt) {
    case MACO_FLOAT16:
        return 11;
    case MACO_BFLOAT16:
        return 8;
    case MACO_FLOAT32:
        return 24;
    case MACO_FLOAT64:
        return 53;
    case MACO_FP8_E4M3:
        return 4;
    default: /* MACO_FP8_E5M2 */
        return 3;
    }
}

/* Widest-type bits of a floating value converted to `dt` (round to nearest even). */
static __host__ __device__ uint64_t perf_from_double(double v, int dt)
{
    union {
        double d;
        uint64_t u;
    } x;
    union {
        float f;
        uint32_t u;
    } y;
    switch (dt) {
    case MACO_FLOAT64:
        x.d = v;
        return x.u;
    case MACO_FLOAT32:
        y.f = (float)v;
        return y.u;
    case MACO_FLOAT16:
        return __half_as_ushort(__float2half_rn((float)v));
    case MACO_BFLOAT16:
        return __bfloat16_as_ushort(__float2bfloat16_rn((float)v));
    case MACO_FP8_E4M3:
        return __nv_cvt_float_to_fp8((float)v, __NV_NOSAT, __NV_E4M3);
    default:
        return __nv_cvt_float_to_fp8((float)v, __NV_NOSAT, __NV_E5M2);
    }
}

/* Rank r's element i: integers as their 64-bit two's complement value (signed types sign-
 * extended), floating types as an exact double. */
static __host__ __device__ __forceinline__ void perf_draw(uint64_t seed, int dt, int op, int rank,
                                                          uint64_t i, int64_t *iv, double *fv)
{
    uint64_t h = perf_mix(seed ^ perf_mix((uint64_t)rank * 0x100000001B3ull + i * 0x9E37ull) ^
                          ((uint64_t)dt << 40));
    if (!perf_is_float(dt)) {
        switch (dt) {
        case MACO_INT8:
            *iv = (int8_t)h;
            break;
        case MACO_UINT8:
            *iv = (uint8_t)h;
            break;
        case MACO_INT32:
            *iv = (int32_t)h;
            break;
        case MACO_UINT32:
            *iv = (uint32_t)h;
            break;
        default:
            *iv = (int64_t)h;
        }
        return;
    }
    if (op == MACO_PROD) {
        const double v[4] = { -2.0, -1.0, 1.0, 2.0 };
        *fv = v[h >> 62];
        return;
    }
    int p = perf_precision(dt);
    int64_t m = p > 4 ? (int64_t)1 << (p - 4) : 1;
    *fv = (double)(int64_t)((h >> 8) % (uint64_t)(2 * m + 1)) - (double)m;
}

static __host__ __device__ __forceinline__ uint64_t perf_int_bits(int64_t v, int dt)
{
    size_t bits = dt == MACO_INT8 || dt == MACO_UINT8 ? 8 : (dt <= MACO_UINT32 ? 32 : 64);
    return bits == 64 ? (uint64_t)v : (uint64_t)v & ((1ull << bits) - 1);
}

/* The stored bits of rank r's element i. */
static __host__ __device__ __forceinline__ uint64_t perf_input_bits(uint64_t seed, int dt, int op,
                                                                    int rank, uint64_t i)
{
    int64_t iv = 0;
    double fv = 0;
    perf_draw(seed, dt, op, rank, i, &iv, &fv);
    return perf_is_float(dt) ? perf_from_double(fv, dt) : perf_int_bits(iv, dt);
}

/* Sign-extends / zero-extends an integer of type dt held in the low bits of v. */
static __host__ __device__ __forceinline__ int64_t perf_int_value(uint64_t v, int dt)
{
    switch (dt) {
    case MACO_INT8:
        return (int8_t)v;
    case MACO_UINT8:
        return (uint8_t)v;
    case MACO_INT32:
        return (int32_t)v;
    case MACO_UINT32:
        return (uint32_t)v;
    default:
        return (int64_t)v;
    }
}

/* op over ranks of element i, as bits of dt. */
static __host__ __device__ uint64_t perf_reduce_bits(uint64_t seed, int dt, int op, int nranks,
                                                     uint64_t i)
{
    if (perf_is_float(dt)) {
        double acc = 0;
        for (int q = 0; q < nranks; q++) {
            int64_t iv;
            double v;
            perf_draw(seed, dt, op, q, i, &iv, &v);
            if (q == 0)
                acc = v;
            else if (op == MACO_PROD)
                acc *= v;
            else if (op == MACO_MIN)
                acc = v < acc ? v : acc;
            else if (op == MACO_MAX)
                acc = v > acc ? v : acc;
            else
                acc += v;
        }
        if (op == MACO_AVG)
            acc = dt == MACO_FLOAT64 ? acc / nranks : (double)((float)acc / (float)nranks);
        return perf_from_double(acc, dt);
    }
    int sgn = dt == MACO_INT8 || dt == MACO_INT32 || dt == MACO_INT64;
    uint64_t acc = 0;
    for (int q = 0; q < nranks; q++) {
        int64_t v;
        double fv;
        perf_draw(seed, dt, op, q, i, &v, &fv);
        uint64_t u = (uint64_t)v;
        if (q == 0)
            acc = u;
        else if (op == MACO_PROD)
            acc *= u;
        else if (op == MACO_MIN || op == MACO_MAX) {
            int less = sgn ? (int64_t)u < (int64_t)acc : u < acc;
            if ((op == MACO_MIN) == (less != 0))
                acc = u;
        } else
            acc += u;
        /* Wrap in the type's width, keeping signed values sign-extended for min / max. */
        acc = (uint64_t)perf_int_value(perf_int_bits((int64_t)acc, dt), dt);
    }
    if (op == MACO_AVG) {
        int64_t s = perf_int_value(acc, dt);
        acc = sgn ? (uint64_t)(s / nranks) : (uint64_t)s / (uint64_t)nranks;
    }
    return perf_int_bits((int64_t)acc, dt);
}

static __host__ __device__ uint64_t perf_expected_coll(uint64_t j, int coll, int dt, int op,
                                                       int root, uint64_t unit, uint64_t seed,
                                                       int rank, int nranks)
{
    switch (coll) {
    case MACO_COLL_ALLGATHER:
        return perf_input_bits(seed, dt, op, (int)(j / unit), j % unit);
    case MACO_COLL_BROADCAST:
        return perf_input_bits(seed, dt, op, root, j);
    case MACO_COLL_REDUCE_SCATTER:
        return perf_reduce_bits(seed, dt, op, nranks, (uint64_t)rank * unit + j);
    case MACO_COLL_ALLTOALL: /* block q: rank q's send block for this rank */
        return perf_input_bits(seed, dt, op, (int)(j / unit), (uint64_t)rank * unit + j % unit);
    default: /* allreduce, reduce */
        return perf_reduce_bits(seed, dt, op, nranks, j);
    }
}

static __host__ __device__ __forceinline__ int perf_esz(int dt)
{
    const int sizes[MACO_DATATYPE_COUNT] = { 1, 1, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1 };
    return sizes[dt];
}

__global__ void perf_fill_coll_kernel(void *buf, size_t count, int dt, int op, uint64_t seed,
                                      int rank)
{
    int esz = perf_esz(dt);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t b = perf_input_bits(seed, dt, op, rank, i);
        /* Byte by byte: callers test misaligned buffers. */
        for (int k = 0; k < esz; k++)
            ((uint8_t *)buf)[i * esz + k] = (uint8_t)(b >> (8 * k));
    }
}

__global__ void perf_check_coll_kernel(const void *out, size_t count, int coll, int dt, int op,
                                       int root, size_t unit, uint64_t seed, int rank, int nranks,
                                       unsigned long long *wrong, unsigned long long *first_wrong)
{
    unsigned long long mine = 0;
    int esz = perf_esz(dt);
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count;
         j += (size_t)gridDim.x * blockDim.x) {
        uint64_t got = 0;
        for (int k = 0; k < esz; k++)
            got |= (uint64_t)((const uint8_t *)out)[j * esz + k] << (8 * k);
        if (got != perf_expected_coll(j, coll, dt, op, root, unit, seed, rank, nranks)) {
            mine++;
            atomicMin(first_wrong, (unsigned long long)j);
        }
    }
    perf_add_wrong(mine, wrong);
}

extern "C" cudaError_t maco_perf_fill_coll(void *buf, size_t count, maco_datatype_t datatype,
                                           maco_redop_t op, uint64_t seed, int rank,
                                           cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    perf_fill_coll_kernel<<<perf_blocks(count), 256, 0, stream>>>(buf, count, (int)datatype,
                                                                  (int)op, seed, rank);
    return cudaGetLastError();
}

extern "C" cudaError_t maco_perf_check_coll(const void *out, size_t count, maco_collective_t coll,
                                            maco_datatype_t datatype, maco_redop_t op, int root,
                                            size_t unit, uint64_t seed, int rank, int nranks,
                                            unsigned long long *wrong,
                                            unsigned long long *first_wrong, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    perf_check_coll_kernel<<<perf_blocks(count), 256, 0, stream>>>(
        out, count, (int)coll, (int)datatype, (int)op, root, unit, seed, rank, nranks, wrong,
        first_wrong);
    return cudaGetLastError();
}

extern "C" uint64_t maco_perf_expected_coll_host(size_t j, maco_collective_t coll,
                                                 maco_datatype_t datatype, maco_redop_t op,
                                                 int root, size_t unit, uint64_t seed, int rank,
                                                 int nranks)
{
    return perf_expected_coll(j, (int)coll, (int)datatype, (int)op, root, unit, seed, rank, nranks);
}

/* ------------------------------------------------------------------ received blocks */

__global__ void perf_check_from_kernel(const void *out, size_t count, int dt, int op, uint64_t seed,
                                       int src_rank, uint64_t src_offset, unsigned long long *wrong,
                                       unsigned long long *first_wrong)
{
    unsigned long long mine = 0;
    int esz = perf_esz(dt);
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count;
         j += (size_t)gridDim.x * blockDim.x) {
        uint64_t got = 0;
        for (int k = 0; k < esz; k++)
            got |= (uint64_t)((const uint8_t *)out)[j * esz + k] << (8 * k);
        if (got != perf_input_bits(seed, dt, op, src_rank, src_offset + j)) {
            mine++;
            atomicMin(first_wrong, (unsigned long long)j);
        }
    }
    perf_add_wrong(mine, wrong);
}

extern "C" cudaError_t maco_perf_check_from(const void *out, size_t count, maco_datatype_t datatype,
                                            maco_redop_t op, uint64_t seed, int src_rank,
                                            size_t src_offset, unsigned long long *wrong,
                                            unsigned long long *first_wrong, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    perf_check_from_kernel<<<perf_blocks(count), 256, 0, stream>>>(
        out, count, (int)datatype, (int)op, seed, src_rank, src_offset, wrong, first_wrong);
    return cudaGetLastError();
}

extern "C" uint64_t maco_perf_input_host(size_t i, maco_datatype_t datatype, maco_redop_t op,
                                         uint64_t seed, int rank)
{
    return perf_input_bits(seed, (int)datatype, (int)op, rank, i);
}
