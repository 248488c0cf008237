/*
 * maco/device/error.h - how a device-side wait reports a timeout to the host.
 *
 * Each communicator owns one report in host-mapped pinned memory and one claim word in
 * device memory. The first failing thread wins the claim (atomicCAS 0 -> 1 on the device
 * word; the claim is in device memory because atomics on host-mapped memory are not
 * guaranteed atomic over PCIe), fills the report with plain stores, then publishes
 * `status` last after a system-scope fence. The host reads `status` first and the other
 * fields only when it is non-zero (maco_comm_get_async_error). Later failures of the same
 * launch only make waits return early; the first one is what the user sees.
 *
 * Layout (32 bytes, shared by host C code and device code):
 *   0  int32 status    maco_status_t, 0 = no error (written last)
 *   4  int32 peer      rank that was waited for, -1 if none
 *   8  int32 object    semaphore id or packet slot the wait was on
 *  12  uint32 what     MACO_DEVICE_WAIT_* (semaphore, packet, FIFO space, flush, EP flag) or
 *                     MACO_DEVICE_ERR_* (not a wait: a registration, a count mismatch);
 *                     16-20: the persistent-kernel runtime's (maco/device/persistent.h)
 *  16  uint64 expected value (semaphore count or packet flag) waited for
 *  24  uint64 observed last value read
 */
#ifndef MACO_DEVICE_ERROR_H
#define MACO_DEVICE_ERROR_H

#include <stdint.h>

#include "maco/device/macros.h"

#include "maco/device/atomics.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MACO_DEVICE_WAIT_SEMAPHORE = 1,   /* a semaphore's next signal */
    MACO_DEVICE_WAIT_PACKET = 2,      /* an LL packet's flag */
    MACO_DEVICE_WAIT_FIFO = 3,        /* space in a proxy's trigger FIFO */
    MACO_DEVICE_WAIT_FLUSH = 4,       /* a proxy's flush */
    MACO_DEVICE_ERR_REGISTRATION = 5, /* not a wait: a peer named a registration not mapped */
    /* not a wait: a receive's byte count (`expected`) differs from its sender's (`observed`);
     * `peer` is the sender, `object` the receive's kind and element size (algorithms'
     * p2p_plan.h, MACO__P2P_FLAGS) */
    MACO_DEVICE_ERR_COUNT_MISMATCH = 6,
    /* an expert-parallel buffer's flag from `peer` (maco/ep.h); `object`: 1 dispatch counts,
     * 2 dispatch rows done, 3 combine ready, 4 combine rows done; `expected`: the sequence
     * number or CTA count waited for */
    MACO_DEVICE_WAIT_EP = 7,
};

typedef struct maco_device_error {
    volatile int32_t status;
    volatile int32_t peer;
    volatile int32_t object;
    volatile uint32_t what;
    volatile uint64_t expected;
    volatile uint64_t observed;
} maco_device_error_t;

/* Host-mapped, written by the GPU, read by the host: 4 x i32/u32 then 2 x u64, 32 bytes. */
MACO_STATIC_ASSERT(sizeof(maco_device_error_t) == 32, "maco_device_error_t is 32 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_device_error_t) == 8, "maco_device_error_t is 8-byte aligned");

/** Where and how long device waits of one communicator may wait; POD, copied freely. */
typedef struct maco_device_wait_bound {
    maco_device_error_t *report; /**< host-mapped report (device address) */
    int32_t *claim;              /**< device-memory claim word */
    uint64_t timeout_ns;         /**< 0: wait forever (MACO_DEVICE_TIMEOUT=0) */
} maco_device_wait_bound_t;

/* Filled by the host, copied into every device handle: 2 pointers and a u64, 24 bytes. */
MACO_STATIC_ASSERT(sizeof(maco_device_wait_bound_t) == 24, "maco_device_wait_bound_t is 24 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_device_wait_bound_t) == 8,
                   "maco_device_wait_bound_t alignment");

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)

/* Records a failed wait; only the first caller per communicator writes the report. */
static __device__ __forceinline__ void
maco_device_error_record(const maco_device_wait_bound_t *b, maco_status_t status, int peer,
                         int object, uint32_t what, uint64_t expected, uint64_t observed);

/* True once any wait of this communicator has failed (checked while spinning). */
static __device__ __forceinline__ int maco_device_error_claimed(const maco_device_wait_bound_t *b);

/*
 * Spin-loop helper: call once per iteration with state zero-initialised before the loop.
 * Every 1024 iterations it reads the global timer; returns MACO_ERR_TIMEOUT once the wait
 * has lasted longer than the bound, MACO_ERR_REMOTE when another wait of the communicator
 * has already failed (so one lost signal does not leave other threads spinning), else
 * MACO_OK.
 */
typedef struct maco_spin_state {
    uint64_t start_ns;
    uint32_t iterations;
} maco_spin_state_t;

static __device__ __forceinline__ maco_status_t maco_spin_check(const maco_device_wait_bound_t *b,
                                                                maco_spin_state_t *s);

#include "maco/device/impl/error.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_ERROR_H */
