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

#include "maco/device/macros.h"

#include "maco/device/copy.h"
#include "maco/device/packet.h"
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

/* Filled by the host (maco_memory_channel_get_device_handle): the semaphore (56), 2 pointers
 * and 2 u64 sizes (32): 88 bytes, 8-byte aligned. */
MACO_STATIC_ASSERT(sizeof(maco_memory_channel_device_t) == 88,
                   "maco_memory_channel_device_t is 88 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_memory_channel_device_t) == 8,
                   "maco_memory_channel_device_t alignment");

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)

/** Copies local[src_offset..+bytes) to remote[dst_offset..). Cooperative. */
static __device__ __forceinline__ void
maco_memory_channel_put(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                        uint64_t src_offset, uint64_t bytes, uint32_t tid, uint32_t nthreads);

/** Copies remote[src_offset..+bytes) to local[dst_offset..). Cooperative. */
static __device__ __forceinline__ void
maco_memory_channel_get(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                        uint64_t src_offset, uint64_t bytes, uint32_t tid, uint32_t nthreads);

/*
 * One element through the mapping, by one thread: read from the peer's buffer, write to it.
 * `offset` is in bytes and must be aligned to the element's size.
 */
static __device__ __forceinline__ uint32_t
maco_memory_channel_read_u32(const maco_memory_channel_device_t *ch, uint64_t offset);

static __device__ __forceinline__ uint64_t
maco_memory_channel_read_u64(const maco_memory_channel_device_t *ch, uint64_t offset);

static __device__ __forceinline__ void
maco_memory_channel_write_u32(const maco_memory_channel_device_t *ch, uint64_t offset, uint32_t v);

static __device__ __forceinline__ void
maco_memory_channel_write_u64(const maco_memory_channel_device_t *ch, uint64_t offset, uint64_t v);

/*
 * LL packets through the channel. put_packets reads `src_bytes` bytes of local[src_offset..)
 * and writes them as packets with `flag` to remote[dst_offset..): LL16 carries 8 bytes per
 * 16-byte packet, LL8 4 bytes per 8-byte packet; a partial last packet is padded with zero.
 * dst_offset must be 16- (LL16) or 8-byte (LL8) aligned; src_offset may have any alignment.
 * unpack_packets is the receiving side: it waits (bounded) for each packet of
 * local[src_offset..) to carry `flag` and writes the payload, `dst_bytes` bytes in all, to
 * local[dst_offset..). Both are cooperative over (tid, nthreads). unpack returns MACO_OK, or
 * MACO_ERR_TIMEOUT / MACO_ERR_REMOTE from the first packet that did not arrive (the caller's
 * threads may then return different statuses; combine them, e.g. __syncthreads_or).
 * Packet p is written and read by thread p % nthreads, so use the same thread numbering on
 * both sides only if you need a packet's writer and reader to be the same thread.
 */
static __device__ __forceinline__ void
maco_memory_channel_put_packets_ll16(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                                     uint64_t src_offset, uint64_t src_bytes, uint32_t tid,
                                     uint32_t nthreads, uint32_t flag);

static __device__ __forceinline__ maco_status_t maco_memory_channel_unpack_packets_ll16(
    const maco_memory_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset,
    uint64_t dst_bytes, uint32_t tid, uint32_t nthreads, uint32_t flag);

static __device__ __forceinline__ void
maco_memory_channel_put_packets_ll8(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                                    uint64_t src_offset, uint64_t src_bytes, uint32_t tid,
                                    uint32_t nthreads, uint32_t flag);

static __device__ __forceinline__ maco_status_t maco_memory_channel_unpack_packets_ll8(
    const maco_memory_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset,
    uint64_t dst_bytes, uint32_t tid, uint32_t nthreads, uint32_t flag);

/** Signals the peer (release). One thread. */
static __device__ __forceinline__ void
maco_memory_channel_signal(const maco_memory_channel_device_t *ch);

/** Signals the peer without ordering earlier writes. One thread. */
static __device__ __forceinline__ void
maco_memory_channel_relaxed_signal(const maco_memory_channel_device_t *ch);

/** Waits for the peer's next signal (acquire, bounded). One thread. See semaphore.h. */
static __device__ __forceinline__ maco_status_t
maco_memory_channel_wait(const maco_memory_channel_device_t *ch);

/** Relaxed wait: execution ordering only. One thread. */
static __device__ __forceinline__ maco_status_t
maco_memory_channel_relaxed_wait(const maco_memory_channel_device_t *ch);

/** Non-blocking: true (consuming the signal) when the peer's next signal has arrived. */
static __device__ __forceinline__ int
maco_memory_channel_poll(const maco_memory_channel_device_t *ch);

#include "maco/device/impl/memory_channel.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_MEMORY_CHANNEL_H */
