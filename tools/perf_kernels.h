/*
 * perf_kernels.h - data generation and result checking on the GPU, for maco-perf and the
 * GPU tests. Independent of the library's kernels: the expected value of every element is
 * recomputed from the generator, not read from any buffer.
 *
 * Input of rank r, element i, for a seed: a pseudo-random float in [-1, 1) from a hash of
 * (seed, r, i), converted to the element type (round to nearest even). The expected
 * allreduce sum is: widen each rank's input to float32, add in rank order 0..n-1, convert
 * once to the type. Comparison is bitwise.
 */
#ifndef MACO_PERF_KERNELS_H
#define MACO_PERF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dtype: 0 = float32, 1 = bfloat16 (the types allreduce implements). */
enum { MACO_PERF_F32 = 0, MACO_PERF_BF16 = 1 };

/** Fills count elements of rank `rank`'s input for `seed`. */
cudaError_t maco_perf_fill(void *buf, size_t count, int dtype, uint64_t seed, int rank,
                           cudaStream_t stream);

/**
 * Adds to *wrong (device counter) the number of elements of `out` that differ bitwise from
 * the rank-ordered sum of the `nranks` ranks' inputs for `seed`, and records the first
 * wrong index in *first_wrong (device, initialised to UINT64_MAX by the caller).
 */
cudaError_t maco_perf_check_sum(const void *out, size_t count, int dtype, uint64_t seed, int nranks,
                                unsigned long long *wrong, unsigned long long *first_wrong,
                                cudaStream_t stream);

/** Adds to *wrong the number of bytes in [buf, buf+bytes) that are not `value`. */
cudaError_t maco_perf_check_bytes(const void *buf, size_t bytes, uint8_t value,
                                  unsigned long long *wrong, cudaStream_t stream);

/** The expected value's bits and the value of rank r's input, for diagnostics (host). */
uint32_t maco_perf_expected_bits_host(size_t i, int dtype, uint64_t seed, int nranks);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PERF_KERNELS_H */
