/*
 * proxy_internal.h - the proxy service, its FIFOs and its transports (internal).
 *
 * Layering: proxy.c owns the thread, the FIFOs and the channel table; each transport
 * (transport_cuda.c, transport_host.c) is one ops table; they do not include each other.
 */
#ifndef MACO_PROXY_INTERNAL_H
#define MACO_PROXY_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "comm_internal.h"
#include "fifo.h"
#include "maco/device/fifo.h"
#include "maco/port_channel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ channels, transports */

typedef struct maco__transport_ops maco__transport_ops_t;

struct maco_port_channel {
    struct maco_proxy *proxy;
    uint32_t id;
    int peer;
    maco_transport_t transport;
    const maco__transport_ops_t *ops;
    char *src; /* this rank's source buffer (host address for host memory) */
    uint64_t src_bytes;
    char *dst; /* the peer's destination buffer, mapped here */
    uint64_t dst_bytes;
    uint64_t *remote_inbound;          /* the peer's semaphore for signals from this channel */
    uint64_t signals_sent;             /* proxy thread: value the next signal writes */
    uint64_t *inbound;                 /* this rank's semaphore (host address) */
    uint64_t host_expected;            /* host waits */
    maco_port_channel_device_t device; /* device handle (when the comm has a GPU) */
};

/*
 * A transport's operations, called on the proxy thread. `size` first (libfabric style), so
 * the table can grow. put and signal queue or carry out the work; flush_mark returns 1 when
 * every earlier operation of the transport has completed, else queues a marker and returns
 * 0 (the proxy then polls flush_poll until it returns 1).
 */
struct maco__transport_ops {
    size_t size;
    const char *name;
    maco_status_t (*put)(struct maco_port_channel *ch, uint64_t dst_offset, uint64_t src_offset,
                         uint64_t bytes);
    maco_status_t (*signal)(struct maco_port_channel *ch);
    maco_status_t (*mark)(struct maco_proxy *proxy, void **marker_p);
    int (*marker_done)(struct maco_proxy *proxy, void *marker);
    void (*marker_free)(struct maco_proxy *proxy, void *marker);
    /* An inline put: `bytes` (4 or 8) of `value` (little-endian) to dst_offset, then, with
     * `with_signal`, the channel's signal after it. NULL: the transport gets no inline
     * triggers. */
    maco_status_t (*put_value)(struct maco_port_channel *ch, uint64_t dst_offset, uint64_t value,
                               uint32_t bytes, int with_signal);
};

extern const maco__transport_ops_t maco__transport_cuda_ops;
extern const maco__transport_ops_t maco__transport_host_ops;

/* A flush waiting for earlier CUDA work. */
typedef struct maco__pending_flush {
    struct maco__pending_flush *next;
    maco__fifo_t *fifo;
    uint64_t pos;
    void *marker; /* NULL: nothing to wait for */
} maco__pending_flush_t;

struct maco_proxy {
    maco_comm_t comm;
    maco__fifo_t host_fifo;
    maco__fifo_t device_fifo; /* valid when has_device_fifo */
    int has_device_fifo;
    pthread_t thread;
    int running;
    volatile int stop_requested;
    int draining; /* stopped: carry out published data and signals, complete no flush */
    maco_port_channel_t channels[MACO_TRIGGER_MAX_CHANNELS]; /* written before use, by id */
    uint32_t nchannels;
    /* Semaphores of host-memory channels: shared host memory, imported by peers. */
    uint64_t *host_sems;
    maco_mem_t host_sems_mem;
    maco_mem_t *peer_host_sems; /* [nranks], imported on first use */
    uint32_t host_sem_next;
    /* CUDA copy: one stream for all channels, so work completes in trigger order. */
    cudaStream_t stream;
    int cuda_work_since_marker;
    uint64_t *staging; /* fallback signal values when stream writes are unavailable */
    uint32_t staging_next;
    cudaEvent_t *staging_events;
    int stream_writes; /* cuStreamWriteValue64: 0 untried, 1 works, -1 staged copies instead */
    int batch_ops;     /* cuStreamBatchMemOp: the same */
    maco__pending_flush_t *pending_head, *pending_tail;
    int64_t timeout_ms; /* MACO_DEVICE_TIMEOUT in ms (0: device waits unbounded) */
    int started_before; /* maco_proxy_start ran once: a restart checks the device FIFO */
};

/* The bound of the proxy's own host waits, in ms: MACO_DEVICE_TIMEOUT, or 60 s where that is
 * 0 (unbounded), so that no proxy wait on the CPU is ever without a deadline. */
static inline int64_t maco__proxy_host_bound_ms(const struct maco_proxy *p)
{
    return p->timeout_ms > 0 ? p->timeout_ms : 60000;
}

enum { MACO__HOST_SEMS = 4096, MACO__STAGING_SLOTS = 1024 };

/** Records an error found on the proxy thread as the communicator's asynchronous error. */
static inline void maco__proxy_fail(struct maco_proxy *proxy, maco_status_t status)
{
    maco__comm_set_async_error(proxy->comm, status);
}

#ifdef __cplusplus
}
#endif

#endif /* MACO_PROXY_INTERNAL_H */
