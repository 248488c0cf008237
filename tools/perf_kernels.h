/*
 * perf_kernels.h - data generation and result checking on the GPU, for maco-perf and the
 * GPU tests. Independent of the library's kernels: the expected value of every element is
 * recomputed from the generator, not read from any buffer.
 *
 * Two generators: exact inputs for every collective, type and op (below), and random floats
 * for the allreduce sum of float32 / bfloat16 (further below). Comparison is bitwise.
 */
#ifndef MACO_PERF_KERNELS_H
#define MACO_PERF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "maco/collectives.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every collective, type and op (maco-perf's default checks and the collective tests).
 * Rank r's send-buffer element i for (seed, datatype, op) is drawn so that every result is
 * exact in the type, whatever the order of combination:
 *   integers: any value of the type (sum and prod wrap around, avg divides the wrapped sum);
 *   floating types with prod: one of -2, -1, 1, 2;
 *   floating types otherwise: an integer in [-M, M], M = max(1, 2^(p-4)) for a type with p
 *   significand bits, so that a sum over 8 ranks stays exactly representable.
 * The expected value is computed independently of the library: in float64 for floating
 * types (avg divides in float32, as the kernels, or float64 for float64) and in 64-bit
 * integers for integers, then converted to the type; the comparison is bitwise.
 */

/** Fills `count` elements of rank `rank`'s send buffer. */
cudaError_t maco_perf_fill_coll(void *buf, size_t count, maco_datatype_t datatype, maco_redop_t op,
                                uint64_t seed, int rank, cudaStream_t stream);

/**
 * Adds to *wrong the number of elements among `count` of rank `rank`'s receive buffer
 * that differ from the expected result of `coll` (allgather: block q holds rank q's send
 * buffer; reduce_scatter: element j is op over ranks of element rank * unit + j; broadcast:
 * the root's buffer; allreduce and reduce: op over ranks; alltoall: block q holds elements
 * [rank * unit, (rank + 1) * unit) of rank q's send buffer). `unit` is the collective's count
 * argument. Records the first wrong index in *first_wrong (initialised to UINT64_MAX).
 */
cudaError_t maco_perf_check_coll(const void *out, size_t count, maco_collective_t coll,
                                 maco_datatype_t datatype, maco_redop_t op, int root, size_t unit,
                                 uint64_t seed, int rank, int nranks, unsigned long long *wrong,
                                 unsigned long long *first_wrong, cudaStream_t stream);

/**
 * Received blocks (send/recv, all-to-allv): adds to *wrong the elements of out[0, count) that
 * differ from elements [src_offset, src_offset + count) of rank src_rank's send buffer as
 * maco_perf_fill_coll(.., seed, src_rank) wrote it; first wrong index in *first_wrong.
 */
cudaError_t maco_perf_check_from(const void *out, size_t count, maco_datatype_t datatype,
                                 maco_redop_t op, uint64_t seed, int src_rank, size_t src_offset,
                                 unsigned long long *wrong, unsigned long long *first_wrong,
                                 cudaStream_t stream);

/** Element i of rank `rank`'s input as maco_perf_fill_coll writes it (host). */
uint64_t maco_perf_input_host(size_t i, maco_datatype_t datatype, maco_redop_t op, uint64_t seed,
                              int rank);

/** The expected bits of receive element j (host; for diagnostics and host-side checks). */
uint64_t maco_perf_expected_coll_host(size_t j, maco_collective_t coll, maco_datatype_t datatype,
                                      maco_redop_t op, int root, size_t unit, uint64_t seed,
                                      int rank, int nranks);

/*
 * Random floats (allreduce sum of float32 and bfloat16 only): checks the rank-ordered
 * rounding, which exact inputs cannot. Input of rank r, element i: a pseudo-random float in
 * [-1, 1) from a hash of (seed, r, i), converted to the type (round to nearest even); the
 * expected sum widens each rank's input to float32, adds in rank order 0..n-1 and converts
 * once. dtype: 0 = float32, 1 = bfloat16.
 */
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
