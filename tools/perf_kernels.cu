/* perf_kernels.cu - see perf_kernels.h. */
#include "perf_kernels.h"

#include <cuda_bf16.h>
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
    /* Warp-level sum before one atomic per warp. */
    for (int o = 16; o > 0; o >>= 1)
        mine += __shfl_down_sync(0xffffffffu, mine, o);
    if ((threadIdx.x & 31) == 0 && mine)
        atomicAdd(wrong, mine);
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
