/*
 * tcp_connect.c - the TCP transport: the proxy's state, its listener, a group of sockets
 * made at the first channel between two proxies (lower rank connects, presenting the secret
 * the listener sent over the bootstrap), a channel's connect and the teardown (transport_tcp.c
 * has the design).
 */
#include "proxy/transport/tcp/tcp_internal.h"

/* ------------------------------------------------------------------ proxy setup */

static maco_status_t maco__tcp_io_all(int fd, void *buf, size_t bytes, int writing,
                                      int64_t deadline, int peer);

int maco__tcp_available(maco_comm_t comm, int peer, char *why, size_t cap)
{
    return 1;
}

maco_status_t maco__tcp_proxy_setup(struct maco_proxy *p, void **state_p)
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

void maco__tcp_proxy_teardown(struct maco_proxy *p, void *state)
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
                /* A peer that revoked the communicator (it saw a death and went on to shrink)
                 * will not connect: stop now rather than at the deadline, which a shrink waiting
                 * for this rank would reach at the same time. */
                maco__bootstrap_poll(comm->bs);
                int by = maco__bootstrap_revoked_by(comm->bs);
                if (by >= 0) {
                    st = maco__error(MACO_ERR_REVOKED, MACO_SUBSYS_PROXY,
                                     "TCP transport: rank %d stopped waiting for rank %d's "
                                     "connections (%d of %d): rank %d revoked the communicator",
                                     comm->rank, peer, got, nsocks, by);
                    break;
                }
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

maco_status_t maco__tcp_connect(struct maco_port_channel *ch, void *state)
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
