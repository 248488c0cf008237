/*
 * maco/device/sync.h - synchronisation among the CTAs of one GPU.
 *
 * maco_grid_barrier: every CTA of a launch waits until all `nblocks` CTAs have arrived.
 *   The barrier object lives in zero-initialised device memory and is reused across calls
 *   and launches (a generation counter, never reset). All CTAs must be co-resident (a grid
 *   no larger than what fits on the GPU at once, e.g. launched with
 *   cudaLaunchCooperativeKernel or sized from the occupancy calculator), or the barrier
 *   waits until its bound. Writes before the barrier are visible to every thread after it
 *   (the arrival is a gpu-scope acquire-release add; the wait an acquire load).
 * maco_device_semaphore: a counting semaphore in device memory shared by CTAs: acquire
 *   takes one unit when available (bounded wait), release adds one.
 * Both waits are bounded by the bound they are given (MACO_DEVICE_TIMEOUT through a
 * channel's semaphore.bound) and report like the channel waits.
 */
#ifndef MACO_DEVICE_SYNC_H
#define MACO_DEVICE_SYNC_H

#include <stdint.h>

#include "maco/device/atomics.h"
#include "maco/device/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco_grid_barrier {
    uint32_t arrived;    /* CTAs arrived at the current generation */
    uint32_t generation; /* completed barriers */
} maco_grid_barrier_t;

typedef struct maco_device_semaphore {
    int32_t value;
} maco_device_semaphore_t;

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)

/**
 * Waits until all `nblocks` CTAs called it. Called by every thread of every CTA. Returns
 * MACO_OK, or the bounded wait's error (to every thread of the CTA).
 */
static __device__ __forceinline__ maco_status_t
maco_grid_barrier(maco_grid_barrier_t *b, uint32_t nblocks, const maco_device_wait_bound_t *bound);

/** Sets the semaphore's count (before any CTA uses it). One thread. */
static __device__ __forceinline__ void maco_device_semaphore_set(maco_device_semaphore_t *s,
                                                                 int32_t value);

/** Adds one unit, releasing this thread's earlier writes to the acquirer. One thread. */
static __device__ __forceinline__ void maco_device_semaphore_release(maco_device_semaphore_t *s);

/** Takes one unit, waiting (bounded) while there is none. One thread. */
static __device__ __forceinline__ maco_status_t
maco_device_semaphore_acquire(maco_device_semaphore_t *s, const maco_device_wait_bound_t *bound);

#include "maco/device/impl/sync.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_SYNC_H */
