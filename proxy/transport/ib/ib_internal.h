/*
 * ib_internal.h - the IB verbs transport's shared state and the calls between its files
 * (transport_ib.c has the design: connections, posting, memory regions, failures):
 *   ib_device.c   device port and GID choice, the proxy's state, opening the port
 *   ib_mr.c       memory regions over whole allocations, cached per proxy
 *   ib_connect.c  queue pairs (one per peer proxy), endpoint exchange, channel setup, teardown
 *   ib_data.c     puts and signals queued and posted, completions polled, flushes, failures
 * Compiled only where <infiniband/verbs.h> exists (MACO_HAVE_IBVERBS). Internal.
 */
#ifndef MACO_IB_INTERNAL_H
#define MACO_IB_INTERNAL_H

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_driver.h"
#include "proxy/transport/ib/ib_symbols.h"
#include "proxy/transport/ib/ib_wire.h"
#include "src/host/base/log.h"
#include "proxy/proxy_internal.h"
#include "src/host/os/socket.h"
#include "src/host/base/wire.h"

enum {
    MACO__IB_DEPTH = 256,       /* send queue depth (at most the device's max_qp_wr) */
    MACO__IB_SIGNAL_EVERY = 32, /* a signalled WR at least this often (< depth) */
    MACO__IB_POLL = 32,         /* completions per poll */
    MACO__IB_INLINE = 64,       /* inline bytes asked for */
    MACO__IB_MAX_PORTS = 64,    /* candidate ports remembered */
    MACO__IB_OP_PUT = 1,        /* operation kinds */
    MACO__IB_OP_SIGNAL = 2,     /* ... */
    MACO__IB_NAME = 64,         /* device name bytes */
    MACO__IB_STALL_MS = 2000,   /* posted work waiting this long for a completion: peer alive? */
};
_Static_assert((int)MACO__IB_LINK_IB == (int)IBV_LINK_LAYER_INFINIBAND &&
                   (int)MACO__IB_LINK_ETH == (int)IBV_LINK_LAYER_ETHERNET &&
                   (int)MACO__IB_MTU_MIN == (int)IBV_MTU_256 &&
                   (int)MACO__IB_MTU_MAX == (int)IBV_MTU_4096,
               "ib_wire.h's codes are the verbs' own");
#define MACO__IB_ACCESS                                                                            \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |                   \
     IBV_ACCESS_REMOTE_ATOMIC)

/* ------------------------------------------------------------------ state */

/* A memory region over one allocation, shared by the channels that use it (caller thread). */
typedef struct maco__ib_mr {
    struct maco__ib_mr *next;
    char *base;
    size_t bytes;
    int is_host;
    struct ibv_mr *mr;
    int refs;
} maco__ib_mr_t;

/* A queued or posted operation (proxy thread). */
typedef struct maco__ib_op {
    uint64_t seq;   /* the transport's operation sequence number (flush markers) */
    uint64_t laddr; /* PUT: source address */
    uint64_t raddr; /* destination in the peer's process */
    uint64_t value; /* SIGNAL: the count written */
    uint32_t lkey, rkey;
    uint32_t bytes;
    uint8_t kind;
    uint8_t host_src; /* PUT: the source is host memory (may go inline) */
} maco__ib_op_t;

/* The RC queue pair between this proxy and one peer proxy. */
typedef struct maco__ib_conn {
    struct maco__ib_conn *next; /* published list (release/acquire) */
    int peer;
    uint64_t peer_uid;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t remote_qpn;
    uint32_t depth;      /* send queue slots */
    uint32_t max_inline; /* what the QP took */
    /* Operations by local sequence number: [tail, posted) posted and not known complete,
     * [posted, head) waiting to be posted. ops has cap (a power of two) entries. */
    maco__ib_op_t *ops;
    uint64_t cap;
    uint64_t tail, posted, head;
    uint64_t signal_at; /* 1 + the local number a flush marker wants signalled (0: none) */
    uint64_t *slots;    /* [depth] signal values when they cannot go inline */
    struct ibv_mr *slots_mr;
    int64_t moved_ms;     /* the last completion, or when posted work began to wait */
    int64_t next_look_ms; /* the next look at the peer's bootstrap link while stalled */
    int failed;           /* set once (release): the connection is unusable */
} maco__ib_conn_t;

typedef struct maco__ib_state {
    const maco__ibv_table_t *v;
    /* The device port, opened at the first connect (a failed open is tried again). */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    char dev[MACO__IB_NAME];
    uint8_t port;
    uint8_t link_layer;
    uint8_t mtu;
    uint16_t lid;
    int gid_index; /* -1: none (InfiniBand, LID routed) */
    union ibv_gid gid;
    uint64_t max_msg;
    uint32_t depth;
    int timeout, retry_cnt;
    maco__ib_mr_t *mrs;
    maco__ib_conn_t *conns;  /* pushed by the caller thread, read by the proxy thread */
    uint64_t seq;            /* proxy thread: the last operation sequence number given */
    struct ibv_send_wr *wrs; /* [depth] scratch for one post (proxy thread) */
    struct ibv_sge *sges;
} maco__ib_state_t;

/* A channel's state (ch->tp). */
typedef struct maco__ib_channel {
    maco__ib_conn_t *conn;
    maco__ib_mr_t *src_mr, *recv_mr, *sem_mr;
    uint32_t dst_rkey, sem_rkey;
    uint64_t sem_addr; /* the peer's semaphore in its process */
} maco__ib_channel_t;

/* ------------------------------------------------------------------ calls between the files */

/* ib_device.c: is IB usable (why not in `why`); the proxy's state; opening the port (first
 * connect; a failed open is tried again). */
int maco__ib_available(maco_comm_t comm, int peer, char *why, size_t cap);
maco_status_t maco__ib_proxy_setup(struct maco_proxy *p, void **state_p);
maco_status_t maco__ib_open(struct maco_proxy *p, maco__ib_state_t *t);

/* ib_mr.c: the memory region over the allocation holding [addr, addr + bytes) (`what` names it
 * in errors): cached, one more reference; maco__ib_mr_put drops one and frees the region with
 * the last (caller thread). */
maco_status_t maco__ib_mr_get(maco__ib_state_t *t, uint64_t addr, uint64_t bytes, const char *what,
                              maco__ib_mr_t **mr_p);
void maco__ib_mr_put(maco__ib_state_t *t, maco__ib_mr_t *m);

/* ib_connect.c: a channel's connect and disconnect; the proxy's teardown. */
maco_status_t maco__ib_connect(struct maco_port_channel *ch, void *state);
void maco__ib_disconnect(struct maco_port_channel *ch, void *state);
void maco__ib_proxy_teardown(struct maco_proxy *p, void *state);

/* ib_data.c: the ops that move data and report progress (proxy/transport.h has each one's
 * contract). */
maco_status_t maco__ib_put(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                           uint64_t src_offset, uint64_t bytes);
maco_status_t maco__ib_signal(struct maco_port_channel *ch, void *state);
maco_status_t maco__ib_mark(struct maco_proxy *p, void *state, uint64_t *marker_p);
int maco__ib_marker_done(struct maco_proxy *p, void *state, uint64_t marker);
int maco__ib_progress(struct maco_proxy *p, void *state);
int maco__ib_outstanding(struct maco_proxy *p, void *state);
int maco__ib_alive(struct maco_port_channel *ch, void *state);

#endif /* MACO_IB_INTERNAL_H */
