/*
 * proxy_internal.h - the proxy service, its FIFOs and its transports (internal).
 *
 * Layering: proxy.c owns the thread, the FIFOs and the channel table and names no
 * transport; each transport (transport_*.c) is one ops table behind transport.h, reached
 * through maco__transport_ops(); they do not include each other.
 */
#ifndef MACO_PROXY_INTERNAL_H
#define MACO_PROXY_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/comm/comm_internal.h"
#include "proxy/fifo.h"
#include "maco/device/fifo.h"
#include "proxy/transport.h"
#include "maco/port_channel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ channels, transports */

struct maco_port_channel {
    struct maco_proxy *proxy;
    uint32_t id;
    int peer;
    maco_transport_t transport;
    const maco__transport_ops_t *ops;
    void *tp; /* the transport's state for this channel */
    /* Send side: this rank's source and the peer's destination. */
    char *src; /* this rank's source buffer (host address for host memory) */
    uint64_t src_bytes;
    int src_host;
    char *dst; /* the peer's destination, mapped here (CUDA copy, host memory); else NULL */
    uint64_t dst_bytes;
    uint64_t dst_addr; /* the destination's address in the peer's process */
    int dst_host;
    uint64_t *remote_inbound; /* the peer's semaphore, mapped here (CUDA copy, host memory) */
    uint64_t signals_sent;    /* proxy thread: the count the last signal wrote */
    /* The peer's channel to this rank, created with this one. */
    uint32_t peer_channel;
    uint64_t peer_proxy_uid;
    /* Receive side (network transports): this rank's memory that the peer's channel writes,
     * checked against this rank's registrations when the channel was created. */
    char *recv;
    uint64_t recv_bytes;
    int recv_host;
    /* This rank's semaphore for the peer's signals: in host memory (sem_host; `inbound` is
     * its host address) or in the comm buffer's device pool (`inbound_dev` only). */
    int sem_host;
    uint64_t *inbound;         /* host address, or NULL */
    uint64_t *inbound_dev;     /* device address (NULL without a GPU, or host memory not mapped) */
    uint64_t host_expected;    /* host waits */
    uint64_t signals_received; /* network transports: the peer's signals applied here */
    maco_port_channel_device_t device; /* device handle (when the comm has a GPU) */
};

/* One transport's instance in a proxy. `ops` is published (release) after `state` is set, by
 * the thread creating the first channel that uses it; the proxy thread reads it (acquire). */
typedef struct maco__proxy_transport {
    const maco__transport_ops_t *ops; /* NULL: no channel used it yet */
    void *state;
    int work_since_marker; /* proxy thread */
} maco__proxy_transport_t;

/* A flush waiting for earlier work of one or more transports. */
typedef struct maco__pending_flush {
    struct maco__pending_flush *next;
    maco__fifo_t *fifo;
    uint64_t pos;
    uint64_t markers[MACO__TRANSPORT_SLOTS];
    uint8_t has_marker[MACO__TRANSPORT_SLOTS];
} maco__pending_flush_t;

struct maco_proxy {
    maco_comm_t comm;
    uint64_t uid; /* names this proxy to peers' transports (random) */
    maco__fifo_t host_fifo;
    maco__fifo_t device_fifo; /* valid when has_device_fifo */
    int has_device_fifo;
    pthread_t thread;
    int running;
    volatile int stop_requested;
    int draining; /* stopped: carry out published data and signals, complete no flush */
    maco_port_channel_t channels[MACO_TRIGGER_MAX_CHANNELS]; /* written before use, by id */
    uint32_t nchannels;
    /* Semaphores of channels whose signals land in host memory: shared host memory. */
    uint64_t *host_sems;
    maco_mem_t host_sems_mem;
    maco_mem_t *peer_host_sems; /* [nranks], imported on first use */
    uint32_t host_sem_next;
    maco__proxy_transport_t tp[MACO__TRANSPORT_SLOTS]; /* by maco_transport_t */
    /* The instances with a progress operation, so the proxy loop costs nothing for the
     * others: ids in polled[0..npolled), npolled published (release) after each entry. */
    uint8_t polled[MACO__TRANSPORT_SLOTS];
    int npolled;
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

enum { MACO__HOST_SEMS = 4096 };

/* transport.h: the connect step's exchange with the peer, over the bootstrap. */
static inline maco_status_t maco__port_exchange(struct maco_port_channel *ch, const void *mine,
                                                void *theirs, size_t bytes)
{
    return maco__bootstrap_exchange(ch->proxy->comm->bs, ch->peer, MACO__TAG_PORT_TRANSPORT, mine,
                                    theirs, bytes);
}

/** The state of the channel's transport instance in its proxy. */
static inline void *maco__transport_state(const struct maco_port_channel *ch)
{
    return ch->proxy->tp[ch->transport].state;
}

/** Records an error found on the proxy thread as the communicator's asynchronous error. */
static inline void maco__proxy_fail(struct maco_proxy *proxy, maco_status_t status)
{
    maco__comm_set_async_error(proxy->comm, status);
}

#ifdef __cplusplus
}
#endif

#endif /* MACO_PROXY_INTERNAL_H */
