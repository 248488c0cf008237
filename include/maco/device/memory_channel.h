/*
 * maco/device/memory_channel.h - device side of a memory channel.
 *
 * A memory channel links this rank's registered buffer ("local") with a peer's registered
 * buffer mapped into this process over CUDA IPC ("remote"), plus one semaphore pair.
 * Device threads move data with plain loads and stores through the mapping (NVLink or
 * PCIe) and synchronise with signal/wait. Offsets and sizes are in bytes. The handle is
 * plain data: get it on the host with maco_memory_channel_get_device_handle(), pass it to
 * a kernel by value or in device memory.
 *
 * Cooperative calls (put, get) take the caller's thread index and thread count, so any
 * group of threads (a warp, a CTA, several CTAs) can share one transfer. Single-thread
 * calls (signal, wait, poll, read, write) are made by one thread.
 *
 * Ordering: put()/get() are plain accesses. To make a put visible to the peer, finish it on
 * all participating threads (__syncthreads() for a CTA), then signal() from one thread; the
 * peer's wait() then acquires it (see maco/device/semaphore.h).
 * Bounds: offsets and sizes are not checked on the device; stay within both buffers.
 */
#ifndef MACO_DEVICE_MEMORY_CHANNEL_H
#define MACO_DEVICE_MEMORY_CHANNEL_H

#include <stdint.h>

#include "maco/device/copy.h"
#include "maco/device/semaphore.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco_memory_channel_device {
    maco_semaphore_device_t semaphore;
    char *local;           /**< this rank's registered buffer */
    char *remote;          /**< the peer's registered buffer, mapped here */
    uint64_t local_bytes;  /**< size of the local buffer */
    uint64_t remote_bytes; /**< size of the remote buffer */
} maco_memory_channel_device_t;

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)

/** Copies local[src_offset..+bytes) to remote[dst_offset..). Cooperative. */
static __device__ __forceinline__ void
maco_memory_channel_put(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                        uint64_t src_offset, uint64_t bytes, uint32_t tid, uint32_t nthreads)
{
    maco_copy(ch->remote + dst_offset, ch->local + src_offset, bytes, tid, nthreads);
}

/** Copies remote[src_offset..+bytes) to local[dst_offset..). Cooperative. */
static __device__ __forceinline__ void
maco_memory_channel_get(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                        uint64_t src_offset, uint64_t bytes, uint32_t tid, uint32_t nthreads)
{
    maco_copy(ch->local + dst_offset, ch->remote + src_offset, bytes, tid, nthreads);
}

/** Signals the peer (release). One thread. */
static __device__ __forceinline__ void
maco_memory_channel_signal(const maco_memory_channel_device_t *ch)
{
    maco_semaphore_signal(&ch->semaphore);
}

/** Signals the peer without ordering earlier writes. One thread. */
static __device__ __forceinline__ void
maco_memory_channel_relaxed_signal(const maco_memory_channel_device_t *ch)
{
    maco_semaphore_relaxed_signal(&ch->semaphore);
}

/** Waits for the peer's next signal (acquire, bounded). One thread. See semaphore.h. */
static __device__ __forceinline__ maco_status_t
maco_memory_channel_wait(const maco_memory_channel_device_t *ch)
{
    return maco_semaphore_wait(&ch->semaphore);
}

/** Relaxed wait: execution ordering only. One thread. */
static __device__ __forceinline__ maco_status_t
maco_memory_channel_relaxed_wait(const maco_memory_channel_device_t *ch)
{
    return maco_semaphore_relaxed_wait(&ch->semaphore);
}

/** Non-blocking: true (consuming the signal) when the peer's next signal has arrived. */
static __device__ __forceinline__ int
maco_memory_channel_poll(const maco_memory_channel_device_t *ch)
{
    return maco_semaphore_poll(&ch->semaphore);
}

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_MEMORY_CHANNEL_H */
