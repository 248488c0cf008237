/*
 * transport_tcp.c - the TCP transport: port channels between any two ranks the network
 * reaches, for clusters without RDMA (docs/design.md, "Transports").
 *
 * Connections. Two proxies that have channels between them share one group of
 * MACO_TCP_NSOCKS sockets (made at their first channel: the lower rank connects to the
 * higher rank's listener and presents a 64-bit secret that the listener sent over the
 * bootstrap, so strangers are refused). Every socket carries messages both ways.
 *
 * Messages: a 64-byte header (tcp_wire.h gives its fields), then `bytes` of payload for
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
#include "proxy/transport/tcp/tcp_internal.h"

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
