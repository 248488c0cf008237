/*
 * maco/device/copy.h - cooperative copies for device code.
 *
 * maco_copy() is called by `nthreads` threads with thread indices 0..nthreads-1 (any
 * subset of a CTA or grid, numbered by the caller); together they copy `bytes` bytes.
 * When source and destination have the same address modulo 16, the bulk moves in 16-byte
 * vectors (four loads in flight per thread before the stores); the unaligned head and the
 * tail move bytewise. Otherwise every byte moves singly (correct, much slower). Any size
 * and any alignment is correct. The caller synchronises (a __syncthreads() or a semaphore)
 * before reading the destination from other threads.
 */
#ifndef MACO_DEVICE_COPY_H
#define MACO_DEVICE_COPY_H

#include <stdint.h>

#if defined(__CUDACC__)

static __device__ __forceinline__ void maco_copy(void *dst, const void *src, uint64_t bytes,
                                                 uint32_t tid, uint32_t nthreads);

#include "maco/device/impl/copy.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_COPY_H */
