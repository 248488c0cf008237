/*
 * maco/device/port_channel.h - device side of a port channel (host side:
 * maco/port_channel.h).
 *
 * Every call is made by ONE thread. put/signal return once the trigger is in the proxy's
 * FIFO; the proxy then copies and signals on its transport. To make data written by other
 * threads of the CTA part of a put, __syncthreads() before the put. flush waits until the
 * proxy carried out every trigger of this GPU's FIFO up to the flush and the data landed;
 * the source buffer may then be reused. wait/poll take the peer's signals (sent by the peer
 * proxy after the peer's data, so the data is visible after wait() returns).
 *
 * Memory ordering of the pushes (maco/device/fifo.h), by transport:
 * - CUDA copy: put, signal and their combinations are pushed after a GPU-scope fence
 *   (fence.acq_rel.gpu). It orders before the trigger everything this thread wrote, or
 *   observed, in THIS GPU's memory: the source the copy engines read (they sit behind the
 *   same L2 as the SMs), and whatever a peer reads from this GPU's memory after it saw the
 *   signal (peers' NVLink reads are served by this GPU's L2). A signal reaches the peer after
 *   the data of every earlier put of this FIFO (stream order). It does NOT order writes this
 *   thread made to OTHER GPUs' memory or to host memory (memory-channel puts, mapped host
 *   buffers): call __threadfence_system() before the signal when the peer relies on those,
 *   as with NVSHMEM's signal operations. That the copy engines see what the fence made
 *   visible is how the hardware behaves (same L2), not a promise of the PTX memory model
 *   (maco/device/fifo.h). The fence is cheaper than a system-scope release, which shortens a
 *   put_with_signal ping-pong and back-to-back pushes (docs/performance.md, "Transports").
 * - host memory, IB verbs and TCP: a system-scope release (the proxy's CPU, or the NIC,
 *   reads the source).
 * - flush alone: no ordering (it carries no data).
 *
 * Small puts: on a CUDA copy channel, or a TCP channel whose source is device memory, whose
 * buffers start 8-byte aligned (cudaMalloc and maco_mem_alloc buffers do), a put (with or
 * without signal) of exactly 4 or 8 bytes whose source and destination offsets are multiples
 * of its size travels inside its trigger: the calling thread reads the value when it pushes
 * (so the source may be changed right after the call). On CUDA copy the proxy writes it with a
 * stream memory operation, in the same stream order as copies, instead of starting a copy
 * (faster per put: docs/performance.md, "Transports"); on TCP the proxy sends the value
 * without reading the source. Other sizes and alignments, and host-memory and IB channels,
 * use the copy.
 *
 * All waits are bounded (MACO_DEVICE_TIMEOUT) and return MACO_ERR_TIMEOUT with a device
 * error report, or MACO_ERR_REMOTE when the proxy has stopped or another wait failed.
 * Offsets and sizes are in bytes and are not checked on the device.
 */
#ifndef MACO_DEVICE_PORT_CHANNEL_H
#define MACO_DEVICE_PORT_CHANNEL_H

#include <stdint.h>

#include "maco/device/macros.h"

#include "maco/device/fifo.h"
#include "maco/device/semaphore.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco_port_channel_device {
    maco_fifo_device_t fifo;           /**< the proxy's device FIFO */
    maco_semaphore_device_t semaphore; /**< inbound: signals of the peer's proxy */
    uint32_t channel;                  /**< id within the proxy */
    uint32_t push_order;               /**< how puts and signals are pushed (MACO__PUSH_*
                                            of maco/device/fifo.h), set by the transport */
    const char *src;    /**< the source buffer (device address) when puts of 4 or 8 bytes
                             travel inside their trigger (CUDA copy channels whose source and
                             destination start 8-byte aligned), else NULL */
    uint64_t src_bytes; /**< its size in bytes */
} maco_port_channel_device_t;

/* Filled by the host (maco_port_channel_get_device_handle): the FIFO view (80), the semaphore
 * (56), channel and push order (8), the inline source pointer and size (16): 160 bytes. */
MACO_STATIC_ASSERT(sizeof(maco_port_channel_device_t) == 160,
                   "maco_port_channel_device_t is 160 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_port_channel_device_t) == 8,
                   "maco_port_channel_device_t alignment");

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)

/** Queues a put of `bytes` bytes from src[src_offset..] to the peer's dst[dst_offset..]. */
static __device__ __forceinline__ maco_status_t maco_port_channel_put(
    const maco_port_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset, uint64_t bytes);

/** Queues a signal to the peer (after every earlier trigger of this FIFO). */
static __device__ __forceinline__ maco_status_t
maco_port_channel_signal(const maco_port_channel_device_t *ch);

/** Queues a put and a signal in one trigger (the signal follows the data). */
static __device__ __forceinline__ maco_status_t maco_port_channel_put_with_signal(
    const maco_port_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset, uint64_t bytes);

/** Put, signal and flush in one trigger; waits for the flush. */
static __device__ __forceinline__ maco_status_t maco_port_channel_put_with_signal_and_flush(
    const maco_port_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset, uint64_t bytes);

/** Waits until the proxy has carried out every earlier trigger of this FIFO. */
static __device__ __forceinline__ maco_status_t
maco_port_channel_flush(const maco_port_channel_device_t *ch);

/** Waits for the peer's next signal (acquire, bounded). */
static __device__ __forceinline__ maco_status_t
maco_port_channel_wait(const maco_port_channel_device_t *ch);

/** True (consuming it) when the peer's next signal has arrived. */
static __device__ __forceinline__ int maco_port_channel_poll(const maco_port_channel_device_t *ch);

#include "maco/device/impl/port_channel.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_PORT_CHANNEL_H */
