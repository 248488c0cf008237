/*
 * transport_tcp.c - the TCP transport: port channels between any two ranks the network
 * reaches, for clusters without RDMA (docs/design.md, "Transports").
 *
 * Connections. Two proxies that have channels between them share one group of
 * MACO_TCP_NSOCKS sockets (made at their first channel: the lower rank connects to the
 * higher rank's listener and presents a 64-bit secret that the listener sent over the
 * bootstrap, so strangers are refused). Every socket carries messages both ways.
 *
 * Messages: a 64-byte header (proxy/tcp_wire.h gives its fields), then `bytes` of payload for
 * a put. deps[q] counts the messages the sender had dealt to socket q before this put (all
 * pieces of one put carry the same deps) or this signal.
 * A put is cut into pieces of MACO_TCP_CHUNK_SIZE, dealt to the sockets in turn. Ordering:
 * messages of one socket are handled in order, and the receiver takes a put or applies a
 * signal from socket s only once every other socket q has stored deps[q] messages. So the
 * pieces of one put land in parallel, but nothing overtakes what was pushed before it on
 * another socket: puts land in trigger order (later bytes win), and a signal's data is
 * there before it. "Stored" means in the receiver's memory: received into host
 * memory, or copied into device memory (the copy's event has passed). The receiver
 * acknowledges, per socket, how many messages it stored; a flush on the sender completes when
 * every socket's acknowledgement has reached the count it had sent when the flush came.
 *
 * GPU memory travels through pinned host buffers of MACO_TCP_CHUNK_SIZE: a put from device
 * memory is copied to a send buffer (cudaMemcpyAsync, event) before its piece is sent; a piece
 * for device memory is received into a receive buffer and copied to the device. Send and
 * receive buffers are separate pools (8 each per proxy), so a rank that waits for send
 * buffers can always still receive: two ranks sending to each other cannot deadlock. A
 * signal to a device semaphore is a stream write (cuStreamWriteValue64) once its data is
 * stored.
 *
 * A proxy destroyed with nothing in flight says BYE on each socket before closing it, so its
 * peer takes the end of the connection quietly (its channels to it are closed: using them is
 * MACO_ERR_REMOTE); any other end of a connection is a failure.
 *
 * Every socket is non-blocking and only the proxy thread touches it after connection setup.
 * A closed or reset connection, or a message naming no channel of this group or a range
 * outside the channel's buffer, fails the group: the communicator's async error names the
 * peer, and later flushes on it complete at once (their callers see the async error).
 */
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

#include "bootstrap_internal.h"
#include "config.h"
#include "cuda_driver.h"
#include "log.h"
#include "proxy_internal.h"
#include "socket.h"
#include "tcp_wire.h"
#include "wire.h"

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

/* ------------------------------------------------------------------ failures */

static void maco__tcp_fail(struct maco_proxy *p, maco__tcp_group_t *g, int s, const char *what,
                           int err)
{
    if (g->failed)
        return;
    if (g->peer_left) {
        /* The peer destroyed its proxy after saying BYE: its sockets end, no error. */
        MACO_DEBUG(MACO_SUBSYS_PROXY, "TCP transport: rank %d's proxy left (%s)", g->peer, what);
        __atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE);
        return;
    }
    /* The async error first, then `failed`: a host flush that sees the group failed
     * (maco__tcp_alive) then also finds the communicator's async error set. */
    maco__proxy_fail(p, maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                                    "TCP transport: the connection to rank %d (socket %d of %d) "
                                    "failed: %s%s%s; its channels are dead",
                                    g->peer, s, g->nsocks, what, err ? ": " : "",
                                    err ? strerror(err) : ""));
    __atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE); /* read by maco__tcp_alive */
}

static maco_status_t maco__tcp_io_all(int fd, void *buf, size_t bytes, int writing,
                                      int64_t deadline, int peer);

/* ------------------------------------------------------------------ staging buffers */

static maco__tcp_buf_t *maco__tcp_buf_get(maco__tcp_state_t *t, int send)
{
    maco__tcp_buf_t **free_list = send ? &t->send_free : &t->recv_free;
    int *made = send ? &t->send_made : &t->recv_made;
    if (*free_list != NULL) {
        maco__tcp_buf_t *b = *free_list;
        *free_list = b->next;
        return b;
    }
    if (*made >= MACO__TCP_POOL)
        return NULL;
    maco__tcp_buf_t *b = (maco__tcp_buf_t *)calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    if (cudaHostAlloc((void **)&b->mem, (size_t)t->chunk, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        free(b);
        return NULL;
    }
    (*made)++;
    return b;
}

static void maco__tcp_buf_put(maco__tcp_state_t *t, maco__tcp_buf_t *b, int send)
{
    maco__tcp_buf_t **free_list = send ? &t->send_free : &t->recv_free;
    b->next = *free_list;
    *free_list = b;
}

static cudaEvent_t maco__tcp_event(void)
{
    cudaEvent_t ev = NULL;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return ev;
}

/* 1 once the event passed (or is NULL); 0 while not; -1 on a CUDA error. */
static int maco__tcp_event_done(cudaEvent_t ev)
{
    if (ev == NULL)
        return 1;
    cudaError_t err = cudaEventQuery(ev);
    if (err == cudaSuccess)
        return 1;
    if (err == cudaErrorNotReady)
        return 0;
    cudaGetLastError();
    return -1;
}

/* ------------------------------------------------------------------ proxy setup */

static int maco__tcp_available(maco_comm_t comm, int peer, char *why, size_t cap)
{
    return 1;
}

static maco_status_t maco__tcp_proxy_setup(struct maco_proxy *p, void **state_p)
{
    int64_t nsocks = 2, chunk = 1 << 20;
    maco_status_t st = maco__config_int64(MACO_CFG_TCP_NSOCKS, &nsocks);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_TCP_CHUNK_SIZE, &chunk);
    if (st != MACO_OK)
        return st;
    if (nsocks < 1 || nsocks > MACO__TCP_MAX_SOCKS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "MACO_TCP_NSOCKS=%lld is outside 1..%d", (long long)nsocks,
                           MACO__TCP_MAX_SOCKS);
    if (chunk < (64 << 10) || chunk > (64 << 20))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "MACO_TCP_CHUNK_SIZE=%lld is outside 64K..64M", (long long)chunk);
    maco__tcp_state_t *t = (maco__tcp_state_t *)calloc(1, sizeof(*t));
    if (t == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "TCP transport: no memory");
    t->listen_fd = -1;
    t->nsocks = nsocks;
    t->chunk = chunk;
    t->secret = maco__random_u64();
    if (p->comm->cuda_device >= 0 && p->comm->gpu_unavailable[0] == '\0') {
        cudaSetDevice(p->comm->cuda_device);
        if (cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking) != cudaSuccess) {
            cudaGetLastError();
            free(t);
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                               "TCP transport: cudaStreamCreate failed");
        }
        /* The pinned staging buffers, all of them now: a page-locked allocation is an
         * implicit synchronization point (CUDA C++ Programming Guide, "Implicit
         * Synchronization"), so a buffer allocated while a kernel runs made the proxy's copy
         * wait for that kernel, which waited for the copy (the collectives across nodes hung
         * on their first transfer). */
        for (int send = 0; send < 2; send++) {
            maco__tcp_buf_t *made[MACO__TCP_POOL];
            int k = 0;
            while (k < MACO__TCP_POOL && (made[k] = maco__tcp_buf_get(t, send)) != NULL)
                k++;
            while (k > 0)
                maco__tcp_buf_put(t, made[--k], send);
        }
    }
    *state_p = t;
    return MACO_OK;
}

static void maco__tcp_free_msgs(maco__tcp_msg_t *m)
{
    while (m != NULL) {
        maco__tcp_msg_t *n = m->next;
        if (m->ready)
            cudaEventDestroy(m->ready);
        free(m);
        m = n;
    }
}

static void maco__tcp_free_bufs(maco__tcp_buf_t *b)
{
    while (b != NULL) {
        maco__tcp_buf_t *n = b->next;
        cudaFreeHost(b->mem);
        free(b);
        b = n;
    }
}

static void maco__tcp_proxy_teardown(struct maco_proxy *p, void *state)
{
    maco__tcp_state_t *t = (maco__tcp_state_t *)state;
    if (t == NULL)
        return;
    if (t->stream)
        cudaStreamSynchronize(t->stream);
    for (maco__tcp_group_t *g = t->groups; g != NULL;) {
        maco__tcp_group_t *next = g->next;
        for (int s = 0; s < g->nsocks; s++) {
            maco__tcp_sock_t *k = &g->socks[s];
            /* BYE only between messages: one cut in the middle would garble the stream (the
             * peer then reports the end as a failure, which it is). */
            int between =
                (k->q_head == NULL || k->q_head->done == 0) && k->ack_done == MACO__TCP_HEADER;
            if (k->fd >= 0 && !g->failed && between) {
                uint8_t bye[MACO__TCP_HEADER];
                maco__tcp_header_t h;
                memset(&h, 0, sizeof(h));
                h.kind = MACO__TCP_BYE;
                maco__tcp_header_encode(bye, &h);
                maco__tcp_io_all(k->fd, bye, sizeof(bye), 1, maco__now_ms() + 200, g->peer);
            }
            if (k->fd >= 0)
                close(k->fd);
            for (maco__tcp_msg_t *m = k->q_head; m != NULL; m = m->next)
                if (m->buf)
                    maco__tcp_buf_put(t, m->buf, 1);
            maco__tcp_free_msgs(k->q_head);
            for (maco__tcp_item_t *it = k->items_head; it != NULL;) {
                maco__tcp_item_t *n = it->next;
                if (it->buf)
                    maco__tcp_buf_put(t, it->buf, 0);
                if (it->stored)
                    cudaEventDestroy(it->stored);
                free(it);
                it = n;
            }
        }
        for (maco__tcp_op_t *o = g->ops_head; o != NULL;) {
            maco__tcp_op_t *n = o->next;
            free(o);
            o = n;
        }
        free(g);
        g = next;
    }
    maco__tcp_free_msgs(t->msg_free);
    maco__tcp_free_bufs(t->send_free);
    maco__tcp_free_bufs(t->recv_free);
    if (t->stream)
        cudaStreamDestroy(t->stream);
    cudaGetLastError();
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    free(t);
}

/* ------------------------------------------------------------------ connection setup */

/* Writes or reads exactly `bytes` on a non-blocking socket before `deadline` (ms clock). */
static maco_status_t maco__tcp_io_all(int fd, void *buf, size_t bytes, int writing,
                                      int64_t deadline, int peer)
{
    size_t done = 0;
    while (done < bytes) {
        ssize_t n = writing ? send(fd, (char *)buf + done, bytes - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, bytes - done, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                               "TCP transport: rank %d closed the connection during setup", peer);
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                               "TCP transport: connection setup with rank %d: %s", peer,
                               strerror(errno));
        int64_t left = deadline - maco__now_ms();
        if (left <= 0)
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_PROXY,
                               "TCP transport: connection setup with rank %d timed out", peer);
        struct pollfd pf = { fd, (short)(writing ? POLLOUT : POLLIN), 0 };
        poll(&pf, 1, left > 100 ? 100 : (int)left);
    }
    return MACO_OK;
}

/* No Nagle; 4 MiB buffers; and a link that stops carrying data (a cut cable, a dead host
 * that sends no reset) fails the connection once sent data has gone unacknowledged for half
 * the proxy's bound (TCP_USER_TIMEOUT, RFC 5482), so a flush reports the peer instead of
 * only timing out. */
static void maco__tcp_tune(int fd, int64_t bound_ms)
{
    int one = 1, buf = 4 << 20;
    unsigned int user_timeout = (unsigned int)(bound_ms / 2 < 1000 ? 1000 : bound_ms / 2);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
}

/* The listener, bound to the address this rank uses to reach `peer` over the bootstrap (an
 * address the peer can reach), port chosen by the kernel. */
static maco_status_t maco__tcp_listen(struct maco_proxy *p, maco__tcp_state_t *t, int peer)
{
    if (t->listen_fd >= 0)
        return MACO_OK;
    int link = maco__bootstrap_link_fd(p->comm->bs, peer);
    maco__sockaddr_t addr;
    maco_status_t st =
        link >= 0 ? maco__socket_local_address(link, &addr) : maco__socket_default_address(&addr);
    if (st != MACO_OK)
        return st;
    maco__sockaddr_set_port(&addr, 0);
    st = maco__socket_listen(&addr, &t->listen_fd);
    if (st != MACO_OK)
        return st;
    t->listen_addr = addr;
    char text[96];
    maco__sockaddr_format(&addr, text, sizeof(text));
    MACO_INFO(MACO_SUBSYS_PROXY, "TCP transport of rank %d listens at %s", p->comm->rank, text);
    return MACO_OK;
}

/*
 * Connects this proxy to the peer's proxy: both ranks exchange {listen address, secret,
 * nsocks} over the bootstrap; the lower rank opens the sockets and presents on each
 * {magic, version, its rank, its proxy uid, socket index, the listener's secret}; the higher
 * rank accepts them. Blocking, bounded by the bootstrap timeout.
 */
static maco_status_t maco__tcp_group_connect(struct maco_port_channel *ch, maco__tcp_state_t *t,
                                             maco__tcp_group_t **g_p)
{
    struct maco_proxy *p = ch->proxy;
    maco_comm_t comm = p->comm;
    int peer = ch->peer;
    maco_status_t st = maco__tcp_listen(p, t, peer);
    uint8_t mine[48], theirs[48];
    memset(mine, 0, sizeof(mine));
    maco__sockaddr_to_wire(&t->listen_addr, mine);
    maco__put_u64(mine + 24, t->secret);
    maco__put_u32(mine + 32, (uint32_t)t->nsocks);
    maco__put_u32(mine + 36, st == MACO_OK ? 1u : 0u);
    maco__put_u64(mine + 40, (uint64_t)t->chunk);
    /* Exchange even after a failure, so the peer does not wait for the bootstrap timeout. */
    maco_status_t xst = maco__port_exchange(ch, mine, theirs, sizeof(mine));
    if (st != MACO_OK)
        return st;
    if (xst != MACO_OK)
        return xst;
    if (maco__get_u32(theirs + 36) != 1u)
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                           "TCP transport: rank %d could not listen (its log says why)", peer);
    maco__sockaddr_t peer_addr;
    if (maco__sockaddr_from_wire(theirs, &peer_addr) != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "TCP transport: rank %d sent an unreadable listen address", peer);
    uint32_t their_n = maco__get_u32(theirs + 32);
    int nsocks = (int)(their_n < (uint32_t)t->nsocks ? their_n : (uint32_t)t->nsocks);
    if (nsocks < 1)
        nsocks = 1;
    maco__tcp_group_t *g = (maco__tcp_group_t *)calloc(1, sizeof(*g));
    if (g == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "TCP transport: no memory");
    g->peer = peer;
    g->peer_uid = ch->peer_proxy_uid;
    g->nsocks = nsocks;
    g->ack_ms = maco__now_ms();
    uint64_t their_chunk = maco__get_u64(theirs + 40);
    g->chunk = their_chunk >= (64u << 10) && their_chunk < (uint64_t)t->chunk ? (int64_t)their_chunk
                                                                              : t->chunk;
    for (int s = 0; s < MACO__TCP_MAX_SOCKS; s++) {
        g->socks[s].fd = -1;
        g->socks[s].ack_done = MACO__TCP_HEADER;
    }
    int64_t deadline = maco__deadline_ms(maco__bootstrap_timeout_ms(comm->bs));
    char text[96];
    maco__sockaddr_format(&peer_addr, text, sizeof(text));
    if (comm->rank < peer) {
        for (int s = 0; s < nsocks && st == MACO_OK; s++) {
            char what[64];
            snprintf(what, sizeof(what), "rank %d's TCP transport", peer);
            int fd = -1;
            st = maco__socket_connect(&peer_addr, deadline, what, &fd);
            if (st != MACO_OK)
                break;
            g->socks[s].fd = fd;
            uint8_t hello[MACO__TCP_HELLO];
            maco__tcp_hello_t h = { (uint32_t)comm->rank, (uint32_t)s, p->uid,
                                    maco__get_u64(theirs + 24) };
            maco__tcp_hello_encode(hello, &h);
            st = maco__tcp_io_all(fd, hello, sizeof(hello), 1, deadline, peer);
        }
    } else {
        int got = 0;
        while (got < nsocks && st == MACO_OK) {
            int fd = -1;
            maco__sockaddr_t from;
            st = maco__socket_accept(t->listen_fd, &fd, &from);
            if (st != MACO_OK)
                break;
            if (fd < 0) {
                if (maco__now_ms() > deadline) {
                    st = maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_PROXY,
                                     "TCP transport: rank %d connected %d of %d sockets before "
                                     "the deadline",
                                     peer, got, nsocks);
                    break;
                }
                struct pollfd pf = { t->listen_fd, POLLIN, 0 };
                poll(&pf, 1, 50);
                continue;
            }
            uint8_t hello[MACO__TCP_HELLO];
            int64_t hello_deadline = maco__now_ms() + 2000;
            if (hello_deadline > deadline)
                hello_deadline = deadline;
            maco_status_t hst = maco__tcp_io_all(fd, hello, sizeof(hello), 0, hello_deadline, peer);
            uint32_t s = 0;
            if (hst != MACO_OK ||
                !maco__tcp_hello_check(hello, (uint32_t)peer, ch->peer_proxy_uid, t->secret,
                                       (uint32_t)nsocks, &s) ||
                g->socks[s].fd >= 0) {
                char from_text[96];
                maco__sockaddr_format(&from, from_text, sizeof(from_text));
                MACO_WARN(MACO_SUBSYS_PROXY,
                          "TCP transport of rank %d: refused a connection from %s that is not "
                          "rank %d's proxy (wrong hello or secret)",
                          comm->rank, from_text, peer);
                close(fd);
                continue;
            }
            g->socks[s].fd = fd;
            got++;
        }
    }
    if (st != MACO_OK) {
        for (int s = 0; s < nsocks; s++)
            if (g->socks[s].fd >= 0)
                close(g->socks[s].fd);
        free(g);
        return st;
    }
    for (int s = 0; s < nsocks; s++)
        maco__tcp_tune(g->socks[s].fd, maco__proxy_host_bound_ms(p));
    MACO_INFO(MACO_SUBSYS_PROXY,
              "TCP transport: rank %d connected to rank %d (%s) with %d "
              "socket(s)",
              comm->rank, peer, text, nsocks);
    *g_p = g;
    return MACO_OK;
}

static maco_status_t maco__tcp_connect(struct maco_port_channel *ch, void *state)
{
    maco__tcp_state_t *t = (maco__tcp_state_t *)state;
    struct maco_proxy *p = ch->proxy;
    if ((!ch->src_host || !ch->recv_host) && t->stream == NULL)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                           "TCP transport: device buffers need a GPU on rank %d", p->comm->rank);
    maco__tcp_group_t *g = NULL;
    for (maco__tcp_group_t *it = __atomic_load_n(&t->groups, __ATOMIC_ACQUIRE); it != NULL;
         it = it->next)
        if (it->peer == ch->peer && it->peer_uid == ch->peer_proxy_uid)
            g = it;
    if (g == NULL) {
        maco_status_t st = maco__tcp_group_connect(ch, t, &g);
        if (st != MACO_OK)
            return st;
        g->next = t->groups;
        __atomic_store_n(&t->groups, g, __ATOMIC_RELEASE); /* the proxy thread picks it up */
    }
    ch->tp = g;
    return MACO_OK;
}

/* ------------------------------------------------------------------ sending */

static maco__tcp_msg_t *maco__tcp_msg_new(maco__tcp_state_t *t)
{
    maco__tcp_msg_t *m = t->msg_free;
    if (m != NULL)
        t->msg_free = m->next;
    else
        m = (maco__tcp_msg_t *)malloc(sizeof(*m));
    if (m != NULL)
        memset(m, 0, sizeof(*m));
    return m;
}

static void maco__tcp_enqueue(maco__tcp_sock_t *k, maco__tcp_msg_t *m)
{
    m->next = NULL;
    if (k->q_tail)
        k->q_tail->next = m;
    else
        k->q_head = m;
    k->q_tail = m;
    k->assigned++;
}

static maco_status_t maco__tcp_queue_op(struct maco_port_channel *ch, int kind, uint64_t dst_offset,
                                        uint64_t src_offset, uint64_t bytes, uint64_t value)
{
    maco__tcp_group_t *g = (maco__tcp_group_t *)ch->tp;
    if (__atomic_load_n(&g->failed, __ATOMIC_ACQUIRE))
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                           "port channel %u: the TCP connection to rank %d %s", ch->id, ch->peer,
                           g->peer_left ? "was closed by its proxy (destroyed)" : "failed earlier");
    maco__tcp_op_t *o = (maco__tcp_op_t *)calloc(1, sizeof(*o));
    if (o == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "TCP transport: no memory");
    o->ch = ch;
    o->kind = kind;
    o->dst_offset = dst_offset;
    o->src_offset = src_offset;
    o->bytes = bytes;
    o->value = value;
    g->ops_queued++;
    if (g->ops_tail)
        g->ops_tail->next = o;
    else
        g->ops_head = o;
    g->ops_tail = o;
    return MACO_OK;
}

static maco_status_t maco__tcp_put(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                                   uint64_t src_offset, uint64_t bytes)
{
    return maco__tcp_queue_op(ch, MACO__TCP_PUT, dst_offset, src_offset, bytes, 0);
}

/* An inline put (the device sends them when both buffers start 8-byte aligned and the source
 * is device memory): the value rides in the header; the signal follows when asked. */
static maco_status_t maco__tcp_put_value(struct maco_port_channel *ch, void *state,
                                         uint64_t dst_offset, uint64_t value, uint32_t bytes,
                                         int with_signal)
{
    maco_status_t st = maco__tcp_queue_op(ch, MACO__TCP_VALUE, dst_offset, 0, bytes, value);
    if (with_signal) {
        maco_status_t sst = maco__tcp_queue_op(ch, MACO__TCP_SIGNAL, 0, 0, 0, 0);
        if (st == MACO_OK)
            st = sst;
    }
    return st;
}

static maco_status_t maco__tcp_signal(struct maco_port_channel *ch, void *state)
{
    return maco__tcp_queue_op(ch, MACO__TCP_SIGNAL, 0, 0, 0, 0);
}

/* Deals queued operations to sockets while resources last. Returns how many messages. */
static int maco__tcp_deal(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g)
{
    int made = 0;
    while (g->ops_head != NULL) {
        maco__tcp_op_t *o = g->ops_head;
        maco__tcp_msg_t *m = maco__tcp_msg_new(t);
        if (m == NULL)
            break;
        if (!o->started) {
            for (int s = 0; s < g->nsocks; s++)
                o->deps[s] = (uint32_t)g->socks[s].assigned;
            o->started = 1;
        }
        maco__tcp_header_t h;
        memset(&h, 0, sizeof(h));
        for (int s = 0; s < g->nsocks; s++)
            h.deps[s] = o->deps[s];
        h.channel = o->ch->peer_channel;
        h.offset = o->dst_offset;
        if (o->kind == MACO__TCP_SIGNAL || o->kind == MACO__TCP_VALUE) {
            h.kind = (uint32_t)o->kind;
            h.bytes = o->bytes;
            h.value = o->value;
            maco__tcp_header_encode(m->header, &h);
            maco__tcp_enqueue(&g->socks[g->next_sock++ % (uint32_t)g->nsocks], m);
            g->ops_head = o->next;
            g->ops_dealt++;
            free(o);
            made++;
            continue;
        }
        uint64_t n = o->bytes < (uint64_t)g->chunk ? o->bytes : (uint64_t)g->chunk;
        if (o->ch->src_host) {
            m->payload = o->ch->src + o->src_offset;
        } else {
            maco__tcp_buf_t *b = maco__tcp_buf_get(t, 1);
            cudaEvent_t ev = b != NULL ? maco__tcp_event() : NULL;
            if (b == NULL || ev == NULL) {
                if (b != NULL)
                    maco__tcp_buf_put(t, b, 1);
                m->next = t->msg_free;
                t->msg_free = m;
                break; /* out of send buffers: later */
            }
            cudaError_t err = cudaMemcpyAsync(b->mem, o->ch->src + o->src_offset, n,
                                              cudaMemcpyDeviceToHost, t->stream);
            if (err == cudaSuccess)
                err = cudaEventRecord(ev, t->stream);
            if (err != cudaSuccess) {
                cudaGetLastError();
                maco__proxy_fail(p, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                                                "port channel %u to rank %d: staging %llu bytes "
                                                "from the GPU failed: %s",
                                                o->ch->id, o->ch->peer, (unsigned long long)n,
                                                cudaGetErrorString(err)));
                cudaEventDestroy(ev);
                maco__tcp_buf_put(t, b, 1);
                m->next = t->msg_free;
                t->msg_free = m;
                g->ops_head = o->next; /* dropped: the async error says so */
                g->ops_dealt++;
                free(o);
                continue;
            }
            m->buf = b;
            m->ready = ev;
            m->payload = b->mem;
        }
        h.kind = MACO__TCP_PUT;
        h.bytes = n;
        maco__tcp_header_encode(m->header, &h);
        m->bytes = n;
        maco__tcp_enqueue(&g->socks[g->next_sock++ % (uint32_t)g->nsocks], m);
        made++;
        o->dst_offset += n;
        o->src_offset += n;
        o->bytes -= n;
        if (o->bytes == 0) {
            g->ops_head = o->next;
            g->ops_dealt++;
            free(o);
        }
    }
    if (g->ops_head == NULL)
        g->ops_tail = NULL;
    return made;
}

/* Writes what the socket takes: a pending acknowledgement first, then queued messages.
 * Returns 1 if anything was written, 0 if not, -1 on a failed connection. */
static int maco__tcp_send(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s)
{
    maco__tcp_sock_t *k = &g->socks[s];
    int wrote = 0;
    for (;;) {
        /* An acknowledgement goes between messages, never inside one. */
        maco__tcp_msg_t *m = k->q_head;
        int between = m == NULL || m->done == 0;
        if (k->ack_done == MACO__TCP_HEADER && between && k->stored > k->ack_sent) {
            maco__tcp_header_t h;
            memset(&h, 0, sizeof(h));
            h.kind = MACO__TCP_ACK;
            h.value = k->stored;
            maco__tcp_header_encode(k->ack_header, &h);
            k->ack_sent = k->stored;
            k->ack_done = 0;
        }
        if (k->ack_done < MACO__TCP_HEADER) {
            ssize_t n = send(k->fd, k->ack_header + k->ack_done, MACO__TCP_HEADER - k->ack_done,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                    return wrote;
                maco__tcp_fail(p, g, s, "send", errno);
                return -1;
            }
            k->ack_done += (uint32_t)n;
            wrote = 1;
            continue;
        }
        if (m == NULL)
            return wrote;
        int ready = maco__tcp_event_done(m->ready);
        if (ready == 0)
            return wrote;
        if (ready < 0) {
            maco__proxy_fail(p, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                                            "TCP transport: a copy from the GPU for rank %d "
                                            "failed",
                                            g->peer));
            m->ready = NULL; /* sends what the buffer holds; the async error says so */
        }
        struct iovec iov[2];
        int niov = 0;
        uint64_t total = MACO__TCP_HEADER + m->bytes;
        if (m->done < MACO__TCP_HEADER) {
            iov[niov].iov_base = m->header + m->done;
            iov[niov].iov_len = MACO__TCP_HEADER - m->done;
            niov++;
        }
        if (m->bytes > 0) {
            uint64_t off = m->done > MACO__TCP_HEADER ? m->done - MACO__TCP_HEADER : 0;
            iov[niov].iov_base = (void *)(m->payload + off);
            iov[niov].iov_len = m->bytes - off;
            niov++;
        }
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)niov;
        ssize_t n = sendmsg(k->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return wrote;
            maco__tcp_fail(p, g, s, "send", errno);
            return -1;
        }
        wrote = 1;
        m->done += (uint64_t)n;
        if (m->done < total)
            return wrote;
        k->q_head = m->next;
        if (k->q_head == NULL)
            k->q_tail = NULL;
        if (m->buf)
            maco__tcp_buf_put(t, m->buf, 1);
        if (m->ready)
            cudaEventDestroy(m->ready);
        m->ready = NULL; /* a recycled message owns no event */
        m->buf = NULL;
        m->next = t->msg_free;
        t->msg_free = m;
    }
}

/* ------------------------------------------------------------------ receiving */

/* Raises the channel's semaphore (host memory: a release add; device memory: a stream write
 * of the new count, its data being in GPU memory already). */
static void maco__tcp_raise(struct maco_proxy *p, maco__tcp_state_t *t,
                            struct maco_port_channel *ch)
{
    if (ch->sem_host) {
        __atomic_fetch_add(ch->inbound, 1, __ATOMIC_RELEASE);
        return;
    }
    uint64_t value = ++ch->signals_received;
    CUresult res = CUDA_ERROR_NOT_SUPPORTED;
    if (maco__cu()->cuStreamWriteValue64 != NULL)
        res = maco__cu()->cuStreamWriteValue64((CUstream)t->stream,
                                               (CUdeviceptr)(uintptr_t)ch->inbound_dev, value,
                                               CU_STREAM_WRITE_VALUE_DEFAULT);
    if (res != CUDA_SUCCESS) {
        /* No stream memory operations: a synchronous copy from this thread's stack. */
        cudaError_t err =
            cudaMemcpy(ch->inbound_dev, &value, sizeof(value), cudaMemcpyHostToDevice);
        if (err != cudaSuccess) {
            cudaGetLastError();
            maco__proxy_fail(p, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                                            "port channel %u: raising the semaphore for rank "
                                            "%d's signal failed: %s",
                                            ch->id, ch->peer, cudaGetErrorString(err)));
        }
    }
}

/* Completes received items in socket order: stored puts and satisfied signals. */
static int maco__tcp_complete(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g,
                              int s)
{
    maco__tcp_sock_t *k = &g->socks[s];
    int done = 0;
    while (k->items_head != NULL && k->items_head != k->rx_cur) {
        maco__tcp_item_t *it = k->items_head;
        if (it->kind == MACO__TCP_PUT) {
            int r = maco__tcp_event_done(it->stored);
            if (r == 0)
                break;
            if (r < 0)
                maco__proxy_fail(p, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                                                "TCP transport: a copy to the GPU of rank %d's "
                                                "data failed",
                                                g->peer));
        } else {
            int ok = 1;
            /* deps are the low 32 bits of the sender's counts: compared without wrapping. */
            for (int q = 0; q < g->nsocks && ok; q++)
                ok = q == s || (int32_t)((uint32_t)g->socks[q].stored - it->deps[q]) >= 0;
            if (!ok)
                break;
            maco__tcp_raise(p, t, it->ch);
        }
        k->items_head = it->next;
        if (k->items_head == NULL)
            k->items_tail = NULL;
        if (it->buf)
            maco__tcp_buf_put(t, it->buf, 0);
        if (it->stored)
            cudaEventDestroy(it->stored);
        free(it);
        k->stored++;
        done++;
    }
    return done;
}

static void maco__tcp_end(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s);

/* Checks a received header and sets up where its payload goes. 0, or -1 (group failed). */
static int maco__tcp_begin(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s)
{
    maco__tcp_sock_t *k = &g->socks[s];
    maco__tcp_header_t m;
    maco__tcp_header_decode(k->rx_header, &m);
    uint32_t kind = m.kind;
    if (kind == MACO__TCP_BYE) {
        g->peer_left = 1;
        k->rx_have = 0;
        return 0;
    }
    if (kind == MACO__TCP_ACK) {
        uint64_t count = m.value;
        if (count > k->assigned) {
            maco__tcp_fail(p, g, s, "the peer acknowledged messages never sent", 0);
            return -1;
        }
        if (count > k->acked) {
            k->acked = count;
            g->ack_ms = maco__now_ms();
        }
        k->rx_have = 0;
        return 0;
    }
    uint32_t id = m.channel;
    uint64_t off = m.offset, bytes = m.bytes;
    /* nchannels first: maco_port_channel_create stores channels[id] before it raises
     * nchannels past id, so with created > id the channel (or its destruction) is visible. */
    uint32_t created = __atomic_load_n(&p->nchannels, __ATOMIC_ACQUIRE);
    struct maco_port_channel *ch =
        id < MACO_TRIGGER_MAX_CHANNELS ? __atomic_load_n(&p->channels[id], __ATOMIC_ACQUIRE) : NULL;
    int data = kind == MACO__TCP_PUT || kind == MACO__TCP_VALUE;
    /* The channel this rank is creating right now: the peer's side of the creation can end
     * first and use it at once, before maco_port_channel_create publishes it here. The header
     * waits (as for a receive buffer); a creation that fails leaves it to the stall rule. */
    if (ch == NULL && (kind == MACO__TCP_SIGNAL || data) && id == created)
        return 1;
    if ((!data && kind != MACO__TCP_SIGNAL) || ch == NULL || ch->tp != g ||
        (data && !maco__tcp_header_data_ok(&m, ch->recv_bytes, (uint64_t)g->chunk))) {
        char what[200];
        snprintf(what, sizeof(what),
                 "a message (kind %u) for channel %u of %llu bytes at offset %llu that names no "
                 "channel of this connection or leaves its buffer",
                 kind, id, (unsigned long long)bytes, (unsigned long long)off);
        maco__tcp_fail(p, g, s, what, 0);
        return -1;
    }
    /* A put waits until what was pushed before it on the other sockets is stored (its own
     * socket is in order already); the header stays until then. */
    if (data) {
        for (int q = 0; q < g->nsocks; q++) {
            uint32_t dep = m.deps[q];
            if (q != s && (int32_t)((uint32_t)g->socks[q].stored - dep) < 0)
                return 1;
        }
    }
    maco__tcp_item_t *it = (maco__tcp_item_t *)calloc(1, sizeof(*it));
    if (it == NULL) {
        maco__tcp_fail(p, g, s, "no memory", 0);
        return -1;
    }
    it->kind = kind == MACO__TCP_VALUE ? MACO__TCP_PUT : (int)kind;
    it->ch = ch;
    if (kind == MACO__TCP_SIGNAL) {
        for (int q = 0; q < MACO__TCP_MAX_SOCKS; q++)
            it->deps[q] = m.deps[q];
        k->rx_have = 0;
    } else if (kind == MACO__TCP_VALUE) {
        /* The value is in the header: stored now (host) or copied like a piece (device). */
        uint8_t v[8];
        maco__put_u64(v, m.value);
        if (ch->recv_host) {
            memcpy(ch->recv + off, v, (size_t)bytes);
            k->rx_have = 0;
        } else {
            maco__tcp_buf_t *b = maco__tcp_buf_get(t, 0);
            if (b == NULL) {
                free(it);
                return 1;
            }
            memcpy(b->mem, v, (size_t)bytes);
            it->buf = b;
            k->rx_cur = it; /* maco__tcp_end copies it (no payload follows) */
        }
    } else if (ch->recv_host) {
        k->rx_dst = ch->recv + off;
        k->rx_left = bytes;
        k->rx_cur = it;
    } else {
        maco__tcp_buf_t *b = maco__tcp_buf_get(t, 0);
        if (b == NULL) {
            free(it);
            return 1; /* no receive buffer now: keep the header, try again later */
        }
        it->buf = b;
        k->rx_dst = b->mem;
        k->rx_left = bytes;
        k->rx_cur = it;
    }
    if (k->items_tail)
        k->items_tail->next = it;
    else
        k->items_head = it;
    k->items_tail = it;
    if (kind == MACO__TCP_VALUE && it->buf != NULL)
        maco__tcp_end(p, t, g, s); /* reads the offset and size from the header */
    return 0;
}

/* A payload fully received: device memory gets its copy. */
static void maco__tcp_end(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s)
{
    maco__tcp_sock_t *k = &g->socks[s];
    maco__tcp_item_t *it = k->rx_cur;
    k->rx_cur = NULL;
    k->rx_have = 0;
    if (it->buf == NULL)
        return;
    maco__tcp_header_t h;
    maco__tcp_header_decode(k->rx_header, &h);
    uint64_t off = h.offset, bytes = h.bytes;
    cudaEvent_t ev = maco__tcp_event();
    cudaError_t err = ev != NULL ? cudaMemcpyAsync(it->ch->recv + off, it->buf->mem, bytes,
                                                   cudaMemcpyHostToDevice, t->stream)
                                 : cudaErrorMemoryAllocation;
    if (err == cudaSuccess)
        err = cudaEventRecord(ev, t->stream);
    if (err != cudaSuccess) {
        cudaGetLastError();
        maco__proxy_fail(p, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                                        "port channel %u: copying %llu bytes from rank %d to the "
                                        "GPU failed: %s",
                                        it->ch->id, (unsigned long long)bytes, g->peer,
                                        cudaGetErrorString(err)));
        if (ev != NULL)
            cudaEventDestroy(ev);
        ev = NULL;
    }
    it->stored = ev;
}

/* Reads what the socket has (up to about 8 MiB per call, for fairness). Returns 1 if
 * anything was read, 0 if not, -1 on a failed connection. */
static int maco__tcp_recv(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s)
{
    maco__tcp_sock_t *k = &g->socks[s];
    int got = 0;
    size_t budget = 8u << 20;
    while (budget > 0) {
        ssize_t n;
        if (k->rx_cur != NULL) {
            size_t want = k->rx_left < budget ? (size_t)k->rx_left : budget;
            n = recv(k->fd, k->rx_dst, want, MSG_DONTWAIT);
            if (n > 0) {
                k->rx_dst += n;
                k->rx_left -= (uint64_t)n;
                budget -= (size_t)n;
                got = 1;
                if (k->rx_left == 0)
                    maco__tcp_end(p, t, g, s);
                continue;
            }
        } else if (k->rx_have < MACO__TCP_HEADER) {
            n = recv(k->fd, k->rx_header + k->rx_have, MACO__TCP_HEADER - k->rx_have, MSG_DONTWAIT);
            if (n > 0) {
                k->rx_have += (uint32_t)n;
                got = 1;
                if (k->rx_have < MACO__TCP_HEADER)
                    continue;
                int r = maco__tcp_begin(p, t, g, s);
                if (r < 0)
                    return -1;
                if (r > 0)
                    return got; /* waiting for a receive buffer */
                continue;
            }
        } else {
            /* A whole header waits for a receive buffer. */
            int r = maco__tcp_begin(p, t, g, s);
            if (r < 0)
                return -1;
            if (r > 0)
                return got;
            continue;
        }
        if (n == 0) {
            maco__tcp_fail(p, g, s, "the peer closed the connection", 0);
            return -1;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return got;
        maco__tcp_fail(p, g, s, "recv", errno);
        return -1;
    }
    return got;
}

/* ------------------------------------------------------------------ progress, flushes */

/*
 * A peer that stops acknowledging: the socket layer notices a dead link only while it has
 * data of its own unacknowledged (TCP_USER_TIMEOUT); a link that went down after the kernel
 * acknowledged everything but before the peer's acknowledgement came back would leave a flush
 * waiting for its bound without naming anyone. So the group fails once messages have waited
 * half the proxy's bound for acknowledgements that do not move.
 */
static void maco__tcp_check_stall(struct maco_proxy *p, maco__tcp_group_t *g)
{
    int waiting = 0;
    for (int s = 0; s < g->nsocks; s++)
        waiting |= g->socks[s].acked < g->socks[s].assigned;
    int64_t now = maco__now_ms();
    if (!waiting) {
        g->ack_ms = now;
        return;
    }
    int64_t limit = maco__proxy_host_bound_ms(p) / 2;
    if (limit < 1000)
        limit = 1000;
    if (now - g->ack_ms > limit) {
        char what[160];
        snprintf(what, sizeof(what), "no acknowledgement from the peer for %lld ms",
                 (long long)(now - g->ack_ms));
        maco__tcp_fail(p, g, 0, what, 0);
    }
}

static int maco__tcp_progress(struct maco_proxy *p, void *state)
{
    maco__tcp_state_t *t = (maco__tcp_state_t *)state;
    int work = 0;
    for (maco__tcp_group_t *g = __atomic_load_n(&t->groups, __ATOMIC_ACQUIRE); g != NULL;
         g = g->next) {
        if (g->failed)
            continue;
        maco__tcp_check_stall(p, g);
        if (g->failed)
            continue;
        work += maco__tcp_deal(p, t, g);
        for (int s = 0; s < g->nsocks && !g->failed; s++) {
            if (maco__tcp_recv(p, t, g, s) > 0)
                work++;
            if (!g->failed)
                work += maco__tcp_complete(p, t, g, s);
            if (!g->failed && maco__tcp_send(p, t, g, s) > 0)
                work++;
        }
        /* A signal completed on one socket may unblock another's. */
        for (int s = 0; s < g->nsocks && !g->failed; s++)
            work += maco__tcp_complete(p, t, g, s);
    }
    return work;
}

static void maco__tcp_snap(maco__tcp_marker_t *m, int i)
{
    maco__tcp_group_t *g = m->at[i].g;
    for (int s = 0; s < g->nsocks; s++)
        m->at[i].assigned[s] = g->socks[s].assigned;
    m->at[i].snapped = 1;
}

static maco_status_t maco__tcp_mark(struct maco_proxy *p, void *state, uint64_t *marker_p)
{
    maco__tcp_state_t *t = (maco__tcp_state_t *)state;
    int n = 0;
    for (maco__tcp_group_t *g = t->groups; g != NULL; g = g->next)
        n++;
    maco__tcp_marker_t *m =
        (maco__tcp_marker_t *)calloc(1, sizeof(*m) + (size_t)n * sizeof(m->at[0]));
    if (m == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "TCP flush: no memory");
    for (maco__tcp_group_t *g = t->groups; g != NULL && m->ngroups < n; g = g->next) {
        maco__tcp_deal(p, t, g);
        int i = m->ngroups++;
        m->at[i].g = g;
        m->at[i].ops_queued = g->ops_queued;
        if (g->ops_dealt >= g->ops_queued)
            maco__tcp_snap(m, i);
    }
    *marker_p = (uint64_t)(uintptr_t)m;
    return MACO_OK;
}

static int maco__tcp_marker_done(struct maco_proxy *p, void *state, uint64_t marker)
{
    maco__tcp_marker_t *m = (maco__tcp_marker_t *)(uintptr_t)marker;
    for (int i = 0; i < m->ngroups; i++) {
        maco__tcp_group_t *g = m->at[i].g;
        if (g->failed)
            continue; /* the async error says why; the flush's caller must not wait forever */
        if (!m->at[i].snapped) {
            /* Operations queued before the flush were waiting for send buffers: once all are
             * dealt, the counts then cover them (and perhaps a few later messages). */
            if (g->ops_dealt < m->at[i].ops_queued)
                return 0;
            maco__tcp_snap(m, i);
        }
        for (int s = 0; s < g->nsocks; s++)
            if (g->socks[s].acked < m->at[i].assigned[s])
                return 0;
    }
    return 1;
}

static void maco__tcp_marker_free(struct maco_proxy *p, void *state, uint64_t marker)
{
    free((void *)(uintptr_t)marker);
}

static int maco__tcp_outstanding(struct maco_proxy *p, void *state)
{
    maco__tcp_state_t *t = (maco__tcp_state_t *)state;
    for (maco__tcp_group_t *g = __atomic_load_n(&t->groups, __ATOMIC_ACQUIRE); g != NULL;
         g = g->next) {
        if (g->failed)
            continue;
        if (g->ops_head != NULL)
            return 1;
        /* Handed to the kernel is enough: waiting for acknowledgements here would make a
         * proxy stopping at the same time as its peer's wait for the bound. */
        for (int s = 0; s < g->nsocks; s++)
            if (g->socks[s].q_head != NULL)
                return 1;
    }
    return 0;
}

static int maco__tcp_alive(struct maco_port_channel *ch, void *state)
{
    maco__tcp_group_t *g = (maco__tcp_group_t *)ch->tp;
    return g == NULL || !__atomic_load_n(&g->failed, __ATOMIC_ACQUIRE);
}

const maco__transport_ops_t maco__transport_tcp_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "TCP",
    .available = maco__tcp_available,
    .proxy_setup = maco__tcp_proxy_setup,
    .proxy_teardown = maco__tcp_proxy_teardown,
    .connect = maco__tcp_connect,
    .put = maco__tcp_put,
    .put_value = maco__tcp_put_value,
    .signal = maco__tcp_signal,
    .mark = maco__tcp_mark,
    .marker_done = maco__tcp_marker_done,
    .marker_free = maco__tcp_marker_free,
    .progress = maco__tcp_progress,
    .outstanding = maco__tcp_outstanding,
    .alive = maco__tcp_alive,
};
