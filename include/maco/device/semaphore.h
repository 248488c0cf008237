/*
 * maco/device/semaphore.h - device-to-device semaphores between two ranks.
 *
 * Protocol (DESIGN.md, "Semaphores"): a semaphore is a monotonic 64-bit counter in the
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

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)

/** Signals the peer: release add of 1 on its counter. One thread. */
static __device__ __forceinline__ void maco_semaphore_signal(const maco_semaphore_device_t *s)
{
    maco_red_add_release_sys_u64(s->remote_inbound, 1);
}

/** Signals without ordering earlier writes (an execution barrier only). One thread. */
static __device__ __forceinline__ void
maco_semaphore_relaxed_signal(const maco_semaphore_device_t *s)
{
    maco_red_add_relaxed_sys_u64(s->remote_inbound, 1);
}

/** True (and consumes one signal) when the next expected signal has arrived. One thread. */
static __device__ __forceinline__ int maco_semaphore_poll(const maco_semaphore_device_t *s)
{
    uint64_t want = *s->expected + 1;
    if (maco_load_acquire_sys_u64(s->inbound) < want)
        return 0;
    *s->expected = want;
    return 1;
}

static __device__ __forceinline__ maco_status_t
maco__semaphore_wait(const maco_semaphore_device_t *s, int acquire)
{
    uint64_t want = *s->expected + 1;
    *s->expected = want;
    maco_spin_state_t spin = { 0, 0 };
    for (;;) {
        uint64_t seen =
            acquire ? maco_load_acquire_sys_u64(s->inbound) : maco_load_relaxed_sys_u64(s->inbound);
        if (seen >= want)
            return MACO_OK;
        maco_status_t st = maco_spin_check(&s->bound, &spin);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco_device_error_record(&s->bound, st, s->peer, s->id, MACO_DEVICE_WAIT_SEMAPHORE,
                                         want, seen);
            return st;
        }
    }
}

/**
 * Waits for the next signal with acquire ordering. One thread. Returns MACO_OK;
 * MACO_ERR_TIMEOUT after MACO_DEVICE_TIMEOUT (the report names peer, semaphore id,
 * expected and observed counts); MACO_ERR_REMOTE when another wait of the communicator
 * already failed. After a failure the semaphore is out of step and the communicator must
 * be destroyed.
 */
static __device__ __forceinline__ maco_status_t
maco_semaphore_wait(const maco_semaphore_device_t *s)
{
    return maco__semaphore_wait(s, 1);
}

/** As maco_semaphore_wait() but relaxed: no data ordering, only "the peer got here". */
static __device__ __forceinline__ maco_status_t
maco_semaphore_relaxed_wait(const maco_semaphore_device_t *s)
{
    return maco__semaphore_wait(s, 0);
}

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_SEMAPHORE_H */
