/*
 * tcp_internal.h - the TCP transport's shared state and the calls between its files
 * (transport_tcp.c has the design: socket groups, message ordering, staging, failures):
 *   tcp_common.c   failures, pinned staging buffers and CUDA events
 *   tcp_connect.c  the proxy's state, listening, connecting a group of sockets, teardown
 *   tcp_send.c     puts and signals queued, dealt to sockets and sent
 *   tcp_recv.c     messages received, stored, signals applied, acknowledgements
 * transport_tcp.c itself runs progress and flushes and has the ops table. Internal.
 */
#ifndef MACO_TCP_INTERNAL_H
#define MACO_TCP_INTERNAL_H

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_driver.h"
#include "src/host/base/log.h"
#include "proxy/proxy_internal.h"
#include "src/host/os/socket.h"
#include "proxy/transport/tcp/tcp_wire.h"
#include "src/host/base/wire.h"

enum {
    MACO__TCP_POOL = 8, /* pinned buffers per pool (send, receive) */
};

/* ------------------------------------------------------------------ state */

/* A pinned host buffer of chunk bytes (GPU staging). */
typedef struct maco__tcp_buf {
    struct maco__tcp_buf *next;
    char *mem;
} maco__tcp_buf_t;

/* An outgoing message on one socket. */
typedef struct maco__tcp_msg {
    struct maco__tcp_msg *next;
    uint8_t header[MACO__TCP_HEADER];
    const char *payload; /* host memory: the source itself, or a send buffer */
    uint64_t bytes;
    uint64_t done;        /* bytes of header + payload written */
    maco__tcp_buf_t *buf; /* send buffer to return when written, or NULL */
    cudaEvent_t ready;    /* device source: the copy into buf; NULL when none */
} maco__tcp_msg_t;

/* A received message not yet stored or applied, in socket order. */
typedef struct maco__tcp_item {
    struct maco__tcp_item *next;
    int kind;
    struct maco_port_channel *ch;
    uint32_t deps[MACO__TCP_MAX_SOCKS]; /* SIGNAL */
    maco__tcp_buf_t *buf;               /* PUT to device memory: its receive buffer */
    cudaEvent_t stored;                 /* ... and the copy's event */
} maco__tcp_item_t;

/* A put or signal of a channel that is not yet dealt to sockets (proxy thread). */
typedef struct maco__tcp_op {
    struct maco__tcp_op *next;
    struct maco_port_channel *ch;
    int kind;
    uint64_t dst_offset, src_offset, bytes; /* PUT: what is left */
    uint64_t value;                         /* VALUE */
    int started;                            /* its first message was dealt: deps are set */
    uint32_t deps[MACO__TCP_MAX_SOCKS];
} maco__tcp_op_t;

typedef struct maco__tcp_sock {
    int fd;
    /* send side */
    maco__tcp_msg_t *q_head, *q_tail;
    uint64_t assigned; /* data messages dealt to this socket */
    uint64_t acked;    /* ... that the peer stored */
    uint64_t ack_sent; /* the last count this side acknowledged */
    uint8_t ack_header[MACO__TCP_HEADER];
    uint32_t ack_done; /* bytes of ack_header written; MACO__TCP_HEADER when none in progress */
    /* receive side */
    uint8_t rx_header[MACO__TCP_HEADER];
    uint32_t rx_have;         /* header bytes received */
    uint64_t rx_left;         /* payload bytes still to receive for the current message */
    char *rx_dst;             /* where the payload goes (host memory or a receive buffer) */
    maco__tcp_item_t *rx_cur; /* the item the current payload belongs to */
    maco__tcp_item_t *items_head, *items_tail;
    uint64_t stored; /* messages received and stored, in order */
} maco__tcp_sock_t;

/* The sockets between this proxy and one peer proxy. */
typedef struct maco__tcp_group {
    struct maco__tcp_group *next; /* published list (acquire/release) */
    int peer;
    uint64_t peer_uid;
    int nsocks;
    maco__tcp_sock_t socks[MACO__TCP_MAX_SOCKS];
    int64_t chunk; /* piece size: the smaller of the two ranks' MACO_TCP_CHUNK_SIZE */
    maco__tcp_op_t *ops_head, *ops_tail;
    uint64_t ops_queued, ops_dealt; /* operations queued and fully dealt to sockets */
    uint32_t next_sock;             /* round robin for puts */
    int64_t ack_ms; /* when an acknowledgement last moved (or work began waiting for one) */
    int failed;     /* set once (release): the connection is unusable */
    int peer_left;  /* the peer said BYE: the end of its sockets is not an error */
} maco__tcp_group_t;

typedef struct maco__tcp_state {
    int listen_fd;
    maco__sockaddr_t listen_addr;
    uint64_t secret; /* connectors present it */
    int64_t nsocks;
    int64_t chunk;
    maco__tcp_group_t *groups; /* list head: pushed by the caller thread, read by the proxy */
    /* GPU staging (proxy thread) */
    cudaStream_t stream;
    maco__tcp_buf_t *send_free, *recv_free;
    int send_made, recv_made;
    maco__tcp_msg_t *msg_free;
} maco__tcp_state_t;

/* A flush marker: per group, the operations queued before the flush and, once all of them
 * are dealt to sockets (`snapped`), how many messages each socket had been dealt then. */
typedef struct maco__tcp_marker {
    int ngroups;
    struct {
        maco__tcp_group_t *g;
        uint64_t ops_queued;
        int snapped;
        uint64_t assigned[MACO__TCP_MAX_SOCKS];
    } at[];
} maco__tcp_marker_t;

/* ------------------------------------------------------------------ calls between the files */

/* tcp_common.c: a group's failure (once; quiet after the peer's BYE); the pools of pinned
 * staging buffers (NULL when the pool is used up); CUDA events (NULL on an error), and whether
 * one passed (1), not yet (0) or a CUDA error (-1). */
void maco__tcp_fail(struct maco_proxy *p, maco__tcp_group_t *g, int s, const char *what, int err);
maco__tcp_buf_t *maco__tcp_buf_get(maco__tcp_state_t *t, int send);
void maco__tcp_buf_put(maco__tcp_state_t *t, maco__tcp_buf_t *b, int send);
cudaEvent_t maco__tcp_event(void);
int maco__tcp_event_done(cudaEvent_t ev);

/* tcp_connect.c: availability (always), the proxy's state and teardown, a channel's connect. */
int maco__tcp_available(maco_comm_t comm, int peer, char *why, size_t cap);
maco_status_t maco__tcp_proxy_setup(struct maco_proxy *p, void **state_p);
void maco__tcp_proxy_teardown(struct maco_proxy *p, void *state);
maco_status_t maco__tcp_connect(struct maco_port_channel *ch, void *state);

/* tcp_send.c: the put and signal ops; maco__tcp_deal deals queued operations to a group's
 * sockets and returns how many messages it made; maco__tcp_send writes what socket `s` takes
 * (1: wrote something, 0: nothing, -1: the connection failed). */
maco_status_t maco__tcp_put(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                            uint64_t src_offset, uint64_t bytes);
maco_status_t maco__tcp_put_value(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                                  uint64_t value, uint32_t bytes, int with_signal);
maco_status_t maco__tcp_signal(struct maco_port_channel *ch, void *state);
int maco__tcp_deal(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g);
int maco__tcp_send(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s);

/* tcp_recv.c: maco__tcp_recv reads what socket `s` has (1: read something, 0: nothing, -1:
 * the connection failed); maco__tcp_complete completes its stored puts and satisfied signals
 * in socket order and returns how many. */
int maco__tcp_complete(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s);
int maco__tcp_recv(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s);

#endif /* MACO_TCP_INTERNAL_H */
