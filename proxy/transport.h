/*
 * transport.h - the contract between the proxy and its transports (internal).
 *
 * A transport moves a port channel's puts and signals to its peer. Each is one file
 * (transport_cuda.c, transport_host.c, transport_tcp.c, transport_ib.c) that exports one ops
 * table and keeps its state private; transports never include each other, and proxy.c names
 * none of them: it reaches them through maco__transport_ops(), which fills every operation a
 * transport leaves NULL with a default (as rdma-core's dummy ops do), so no caller tests for
 * NULL. docs/design.md ("Transports") has the picture.
 *
 * Threads. Operations marked [caller] run on the thread that creates or destroys channels
 * (under the proxy's setup lock); those marked [proxy] run on the proxy thread only (or on
 * the thread stopping the proxy, once the proxy thread has ended). A transport's state is
 * shared by both kinds only through what it publishes with atomics or its own lock.
 *
 * State. A proxy holds one instance of each transport that one of its channels uses:
 * proxy_setup creates it at the first such channel, proxy_teardown frees it when the proxy is
 * destroyed (stopped by then). Per-channel state hangs off ch->tp.
 *
 * Flushes. A flush completes when every operation the proxy carried out before it has
 * completed in the transport's sense: the data is in the peer's memory (a CUDA copy has run,
 * an RDMA WRITE has its completion, a TCP peer acknowledged it stored the bytes). The proxy
 * asks each transport that did work since its last marker for a marker (mark), then polls
 * marker_done until each has passed, and frees it (marker_free).
 */
#ifndef MACO_PROXY_TRANSPORT_H
#define MACO_PROXY_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "maco/port_channel.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct maco_proxy;
struct maco_port_channel;

/* Transport ids index the proxy's table: maco_transport_t values 1..4. */
enum { MACO__TRANSPORT_SLOTS = 5 };

typedef struct maco__transport_ops {
    size_t size; /* sizeof(maco__transport_ops_t) of the file that filled it */
    const char *name;

    /* [caller] Whether the transport can reach `peer` from this process at all (a library,
     * a device, a GPU): 1, or 0 with why (cap bytes; no log line). Default: 1. */
    int (*available)(maco_comm_t comm, int peer, char *why, size_t cap);

    /* [caller] The proxy's instance of the transport: *state_p (may stay NULL). Default:
     * nothing to set up. */
    maco_status_t (*proxy_setup)(struct maco_proxy *p, void **state_p);
    /* [caller] Frees the instance; the proxy thread has stopped and no channel is left. */
    void (*proxy_teardown)(struct maco_proxy *p, void *state);

    /* [caller] Connects a new channel: runs on both ranks at once (channel creation is
     * pairwise), so a transport may exchange what it needs over the bootstrap with
     * maco__port_exchange(). The channel's generic fields are filled (port_channel.c). On
     * failure it leaves nothing behind. Default: nothing to do. */
    maco_status_t (*connect)(struct maco_port_channel *ch, void *state);
    /* [caller] The channel is going away; nothing of it is in flight (its owner flushed). */
    void (*disconnect)(struct maco_port_channel *ch, void *state);

    /* [proxy] A put of `bytes` (> 0) from the channel's source at src_offset to its
     * destination at dst_offset, both checked against the buffers already. May only queue it;
     * completion is what a flush waits for. Default: MACO_ERR_UNSUPPORTED. */
    maco_status_t (*put)(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                         uint64_t src_offset, uint64_t bytes);
    /* [proxy] An inline put: `bytes` (4 or 8) of `value` (little-endian) to dst_offset, then,
     * with `with_signal`, the channel's signal after it (the signal is this call's job even
     * when it fails). Default: MACO_ERR_INVALID_USAGE (the device sends inline triggers only to
     * transports that take them). */
    maco_status_t (*put_value)(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                               uint64_t value, uint32_t bytes, int with_signal);
    /* [proxy] The channel's next signal: the peer's semaphore is raised by one after every
     * earlier put of the channel has landed. Default: MACO_ERR_UNSUPPORTED. */
    maco_status_t (*signal)(struct maco_port_channel *ch, void *state);

    /* [proxy] A marker for everything carried out so far: *marker_p. Default: 0 (nothing to
     * wait for). */
    maco_status_t (*mark)(struct maco_proxy *p, void *state, uint64_t *marker_p);
    /* [proxy] 1 once everything before the marker has completed (also when it failed: the
     * failure is then the communicator's async error), else 0. Default: 1. */
    int (*marker_done)(struct maco_proxy *p, void *state, uint64_t marker);
    /* [proxy] Frees a marker (done or not). Default: nothing. */
    void (*marker_free)(struct maco_proxy *p, void *state, uint64_t marker);

    /* [proxy] Moves work along (sends, receives, completions); called every loop of the proxy
     * thread, also while no trigger arrives. Returns how many things it did (0: idle); errors
     * go to the communicator's async error. Default: 0. */
    int (*progress)(struct maco_proxy *p, void *state);
    /* [proxy] 1 while work this rank started is still in flight, else 0. Default: 0. */
    int (*outstanding)(struct maco_proxy *p, void *state);
    /* [any thread] 1 while the channel's connection works; 0 once it failed for good (the
     * failure is the communicator's async error): a host flush that completed then says the
     * data may not have arrived. Default: 1. */
    int (*alive)(struct maco_port_channel *ch, void *state);
} maco__transport_ops_t;

/**
 * The complete ops table of transport `id` (MACO_TRANSPORT_CUDA_COPY .. MACO_TRANSPORT_TCP):
 * the transport's own operations with a default for each it leaves NULL. NULL for an id
 * that is not a transport. Thread-safe.
 */
const maco__transport_ops_t *maco__transport_ops(maco_transport_t id);

/** 1 when transport `id` has its own progress operation (the proxy calls only those). */
int maco__transport_polls(maco_transport_t id);

/** "cuda", "host", "ib", "tcp" (MACO_TRANSPORT's words), or "?" for an unknown id. */
const char *maco__transport_word(maco_transport_t id);

/**
 * [caller] Sends `bytes` of `mine` to the channel's peer and receives as many into `theirs`
 * over the bootstrap (the peer calls it at the same point of the same transport's connect).
 * Bounded by the bootstrap's timeout; a dead peer is MACO_ERR_REMOTE naming it.
 */
static inline maco_status_t maco__port_exchange(struct maco_port_channel *ch, const void *mine,
                                                void *theirs, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PROXY_TRANSPORT_H */
