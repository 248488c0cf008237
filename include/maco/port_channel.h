/*
 * maco/port_channel.h - port channels: puts and signals carried out by a CPU proxy thread.
 *
 * A proxy service owns a CPU thread (bound to cores of the GPU's NUMA node when it can read
 * them from sysfs) and two trigger FIFOs (maco/device/fifo.h): one that device code pushes
 * to (when the communicator has a GPU) and one for host threads. The thread polls both,
 * carries out each trigger on its channel's transport, publishes its progress and the
 * completion of flushes. Transports:
 *   MACO_TRANSPORT_CUDA_COPY    peers on this node with GPUs: cudaMemcpyAsync on the proxy's
 *                               stream into the peer's mapped memory; a signal is a
 *                               stream-ordered write of the semaphore (after the data, with a
 *                               memory barrier) into the peer's device memory.
 *   MACO_TRANSPORT_HOST_MEMORY  processes on this node: memcpy between host buffers from
 *                               maco_mem_alloc_host(); a signal is a release add on the
 *                               peer's semaphore in shared memory. Needs no GPU.
 *   MACO_TRANSPORT_IB           any peer an RDMA device reaches (InfiniBand, RoCE v2): RDMA
 *                               WRITEs on a reliable-connected queue pair, the signal an RDMA
 *                               WRITE of the semaphore after the data on the same QP.
 *                               libibverbs is loaded at run time (MACO_IB_LIBRARY).
 *   MACO_TRANSPORT_TCP          any peer the network reaches: MACO_TCP_NSOCKS sockets per
 *                               pair of proxies, GPU memory staged through pinned host memory
 *                               in chunks; the peer's proxy stores the data and raises the
 *                               semaphore after it, and acknowledges what it stored.
 * MACO_TRANSPORT_AUTO picks per peer: on the same node CUDA copy (device buffers) or host
 * memory (host buffers); on another node IB where both ranks have a usable RDMA device, else
 * TCP. The environment variable MACO_TRANSPORT=auto|cuda|host|ib|tcp overrides what a
 * channel created with MACO_TRANSPORT_AUTO gets. For IB and TCP the peer's buffer need not be
 * mapped here: `dst` may be the import of memory on another node (maco_mem_import).
 * Device code uses the channel's device handle (maco/device/port_channel.h); host threads use
 * the calls below. Triggers of one FIFO are carried out in order; there is no order between
 * the device FIFO and the host FIFO.
 *
 * Thread-safety: the host push calls (put, signal, put_with_signal, flush) may be made from
 * any number of threads at once; waits on one channel by one thread at a time. Creation,
 * start, stop and destruction are not thread-safe.
 */
#ifndef MACO_PORT_CHANNEL_H
#define MACO_PORT_CHANNEL_H

#include <stdint.h>

#include "maco/comm.h"
#include "maco/device/port_channel.h"
#include "maco/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco_proxy *maco_proxy_t;
typedef struct maco_port_channel *maco_port_channel_t;

typedef enum maco_transport {
    MACO_TRANSPORT_AUTO = 0, /* chosen per peer (above) */
    MACO_TRANSPORT_CUDA_COPY = 1,
    MACO_TRANSPORT_HOST_MEMORY = 2,
    MACO_TRANSPORT_IB = 3,
    MACO_TRANSPORT_TCP = 4,
} maco_transport_t;

/**
 * Creates a proxy service for the communicator: FIFOs of MACO_PROXY_FIFO_SIZE triggers, the
 * semaphore memory of its channels. The thread starts with maco_proxy_start(). Not
 * collective. Errors: MACO_ERR_INVALID_ARGUMENT, MACO_ERR_CUDA, MACO_ERR_SYSTEM,
 * MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_proxy_create(maco_comm_t comm, maco_proxy_t *proxy_p);

/**
 * Starts the proxy thread. MACO_ERR_INVALID_USAGE if it runs already, or when restarting it
 * after kernels gave up pushing into its device FIFO (it was stopped, or their wait timed
 * out): their reserved positions are never published and the proxy would stop at them
 * (maco/device/fifo.h); create a new proxy then.
 */
MACO_API maco_status_t maco_proxy_start(maco_proxy_t proxy);

/**
 * Stops the proxy: first marks its FIFOs stopped, so device and host calls waiting for ring
 * space or for a flush return MACO_ERR_REMOTE at once instead of waiting (kernels exit with
 * an error, never hang), and no flush completes after that; then stops the thread and carries
 * out the puts and signals already published, until none arrives for 10 ms, and waits for
 * their copies, all within MACO_DEVICE_TIMEOUT. Triggers published later are not carried out.
 * Blocking. Returns MACO_ERR_TIMEOUT if triggers kept arriving until the deadline (the rest is
 * dropped; the communicator's async error says so).
 */
MACO_API maco_status_t maco_proxy_stop(maco_proxy_t proxy);

/**
 * Stops the proxy if it runs and frees it. Its channels must be destroyed first:
 * MACO_ERR_INVALID_USAGE naming the live channels otherwise, and nothing is freed. NULL is
 * ignored.
 */
MACO_API maco_status_t maco_proxy_destroy(maco_proxy_t proxy);

/**
 * Creates a channel from this rank to `peer`, carried out by `proxy` over `transport`
 * (MACO_TRANSPORT_AUTO: chosen as above): puts copy from `src` (a registration of this rank)
 * into `dst` (the peer's buffer, imported here), signals go to the peer's channel to this
 * rank. Pairwise collective with `peer`, which creates its channel to this rank in the same
 * order with the same `transport` argument (semaphore ids, and the transport's endpoints, are
 * exchanged over the bootstrap; blocking, bounded by its timeout). Host buffers (from
 * maco_mem_alloc_host, or for IB and TCP any registered pinned host memory) and device
 * buffers may both be used with IB and TCP; host waits (maco_port_channel_wait) need the
 * buffer the peer writes here to be host memory. At most 4096 channels per proxy.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, peer out of range, `src` not this rank's, `dst` not
 * the peer's, host-memory transport with buffers not from maco_mem_alloc_host, CUDA copy
 * with host buffers, a peer naming memory this rank never registered), MACO_ERR_UNSUPPORTED
 * (CUDA copy without a GPU or to another node, host memory to another node, IB without a
 * usable RDMA device on either rank: the message says which and why, MACO_TRANSPORT naming no
 * transport), MACO_ERR_INVALID_USAGE (the two ranks asked for different transports),
 * MACO_ERR_NO_MEMORY (4096 channels or the semaphore pool used up), MACO_ERR_SYSTEM (a
 * transport's sockets or device), bootstrap errors.
 */
MACO_API maco_status_t maco_port_channel_create(maco_proxy_t proxy, int peer,
                                                maco_transport_t transport, maco_mem_t src,
                                                maco_mem_t dst, maco_port_channel_t *ch_p);

/**
 * Copies the channel's device handle (plain data) for kernels into *handle_p.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL), MACO_ERR_UNSUPPORTED (no GPU, or a host-memory
 * channel whose semaphore could not be mapped for the GPU).
 */
MACO_API maco_status_t maco_port_channel_get_device_handle(maco_port_channel_t ch,
                                                           maco_port_channel_device_t *handle_p);

/**
 * The transport the channel uses (what MACO_TRANSPORT_AUTO chose). Errors:
 * MACO_ERR_INVALID_ARGUMENT (NULL).
 */
MACO_API maco_status_t maco_port_channel_get_transport(maco_port_channel_t ch,
                                                       maco_transport_t *transport_p);

/** Frees the channel; nothing may be in flight on it (flush first). NULL is ignored. */
MACO_API maco_status_t maco_port_channel_destroy(maco_port_channel_t ch);

/**
 * Host-side pushes: queue a put of `bytes` bytes from src[src_offset..] to dst[dst_offset..]
 * (split into triggers of < 4 GiB), a signal, or both; they return once queued (waiting,
 * bounded by MACO_DEVICE_TIMEOUT, only while the ring is full). The proxy reads the source
 * later: its bytes may change once a maco_port_channel_flush that follows the put returned.
 * Offsets and sizes are checked
 * against both buffers. A push that fails queues nothing (no part of it reaches the ring).
 * Errors: MACO_ERR_INVALID_ARGUMENT (range outside a buffer: the message gives offset, size
 * and buffer size), MACO_ERR_TIMEOUT (ring full), MACO_ERR_REMOTE (the proxy is not running:
 * never started, or stopped; or the channel's network connection to the peer failed earlier:
 * nothing is queued, and only the first failure is logged, as the communicator's async error;
 * the proxy likewise drops, without a log line each, puts and signals the device pushes on
 * such a channel). A put split into several triggers can fail after its first
 * parts were queued; the message says how much was.
 */
MACO_API maco_status_t maco_port_channel_put(maco_port_channel_t ch, uint64_t dst_offset,
                                             uint64_t src_offset, uint64_t bytes);
MACO_API maco_status_t maco_port_channel_signal(maco_port_channel_t ch);
MACO_API maco_status_t maco_port_channel_put_with_signal(maco_port_channel_t ch,
                                                         uint64_t dst_offset, uint64_t src_offset,
                                                         uint64_t bytes);

/**
 * Waits until every trigger host threads pushed to this proxy before the call has been
 * carried out and its data has landed (bounded by MACO_DEVICE_TIMEOUT). Errors:
 * MACO_ERR_TIMEOUT, MACO_ERR_REMOTE (the proxy stopped, or the channel's network connection
 * to the peer failed: the data may not have arrived; the message names the peer).
 */
MACO_API maco_status_t maco_port_channel_flush(maco_port_channel_t ch);

/**
 * Waits for the peer's next signal on this channel, host side (channels whose semaphore is
 * in host memory: the host-memory transport, and IB or TCP with host buffers),
 * at most `timeout_ms` milliseconds: 0 looks once without waiting; negative uses
 * MACO_DEVICE_TIMEOUT (where 0 means no bound). Data the peer put before signalling is then
 * visible. The calling thread spins for about a thousand polls, then yields, then sleeps 50
 * and then 200 us between polls (about 1% of a core). Errors: MACO_ERR_TIMEOUT (naming the peer),
 * MACO_ERR_REMOTE (the peer exited, crashed or left the job without sending the signal: noticed
 * within about 100 ms through its bootstrap link, bounded or not), MACO_ERR_REVOKED (the
 * communicator was revoked, here or by a peer: noticed within about 100 ms the same way),
 * MACO_ERR_UNSUPPORTED (the semaphore is in device memory: wait on the device).
 */
MACO_API maco_status_t maco_port_channel_wait(maco_port_channel_t ch, int64_t timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PORT_CHANNEL_H */
