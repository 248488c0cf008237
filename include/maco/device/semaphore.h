/*
 * maco/device/semaphore.h - device-to-device semaphores between two ranks.
 *
 * Protocol (docs/design.md, "Semaphores"): a semaphore is a monotonic 64-bit counter in the
 * waiter's GPU memory, never reset. The signaller does a system-scope release add of 1 on
 * the peer's counter (through the peer mapping); the waiter keeps its own expected count,
 * adds 1 per wait and spins with system-scope acquire loads until counter >= expected.
 * The release add pairs with the acquire load: data the signaller wrote before signal()
 * is visible to the waiter after wait() returns. To cover writes of other threads of the
 * signalling CTA, put a __syncthreads() between those writes and signal(); after wait(),
 * a __syncthreads() makes the data safe for the whole CTA.
 *
 * One thread signals and one thread waits per call; a semaphore's wait side must not be
 * used by two threads at once (the expected count is a plain variable).
 */
#ifndef MACO_DEVICE_SEMAPHORE_H
#define MACO_DEVICE_SEMAPHORE_H

#include <stdint.h>

#include "maco/device/macros.h"

#include "maco/device/atomics.h"
#include "maco/device/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Device handle of one direction-pair semaphore; POD, copy it anywhere (shared memory...). */
typedef struct maco_semaphore_device {
    uint64_t *inbound;        /**< this rank's counter, which the peer signals */
    uint64_t *remote_inbound; /**< the peer's counter for signals from this rank (mapped) */
    uint64_t *expected;       /**< this rank's count of waits so far (device memory) */
    maco_device_wait_bound_t bound;
    int32_t peer; /**< peer rank, for error reports */
    int32_t id;   /**< semaphore id on this rank, for error reports */
} maco_semaphore_device_t;

/* Filled by the host (maco__memory_channels_setup, port channels): 3 pointers (24), the wait
 * bound (24), peer and id (8): 56 bytes, 8-byte aligned. */
MACO_STATIC_ASSERT(sizeof(maco_semaphore_device_t) == 56, "maco_semaphore_device_t is 56 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_semaphore_device_t) == 8, "maco_semaphore_device_t alignment");

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)

/** Signals the peer: release add of 1 on its counter. One thread. */
static __device__ __forceinline__ void maco_semaphore_signal(const maco_semaphore_device_t *s);

/** Signals without ordering earlier writes (an execution barrier only). One thread. */
static __device__ __forceinline__ void
maco_semaphore_relaxed_signal(const maco_semaphore_device_t *s);

/** True (and consumes one signal) when the next expected signal has arrived. One thread. */
static __device__ __forceinline__ int maco_semaphore_poll(const maco_semaphore_device_t *s);

/**
 * Waits for the next signal with acquire ordering. One thread. Returns MACO_OK;
 * MACO_ERR_TIMEOUT after MACO_DEVICE_TIMEOUT (the report names peer, semaphore id,
 * expected and observed counts); MACO_ERR_REMOTE when another wait of the communicator
 * already failed. After a failure the semaphore is out of step and the communicator must
 * be destroyed.
 */
static __device__ __forceinline__ maco_status_t
maco_semaphore_wait(const maco_semaphore_device_t *s);

/** As maco_semaphore_wait() but relaxed: no data ordering, only "the peer got here". */
static __device__ __forceinline__ maco_status_t
maco_semaphore_relaxed_wait(const maco_semaphore_device_t *s);

#include "maco/device/impl/semaphore.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_SEMAPHORE_H */
