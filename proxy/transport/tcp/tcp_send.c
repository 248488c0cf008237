/*
 * tcp_send.c - the TCP transport's sending side: puts and signals queued per group,
 * dealt to the sockets in pieces with their deps, staged from GPU memory and sent
 * (transport_tcp.c has the design).
 */
#include "proxy/transport/tcp/tcp_internal.h"

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

maco_status_t maco__tcp_put(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                            uint64_t src_offset, uint64_t bytes)
{
    return maco__tcp_queue_op(ch, MACO__TCP_PUT, dst_offset, src_offset, bytes, 0);
}

/* An inline put (the device sends them when both buffers start 8-byte aligned and the source
 * is device memory): the value rides in the header; the signal follows when asked. */
maco_status_t maco__tcp_put_value(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                                  uint64_t value, uint32_t bytes, int with_signal)
{
    maco_status_t st = maco__tcp_queue_op(ch, MACO__TCP_VALUE, dst_offset, 0, bytes, value);
    if (with_signal) {
        maco_status_t sst = maco__tcp_queue_op(ch, MACO__TCP_SIGNAL, 0, 0, 0, 0);
        if (st == MACO_OK)
            st = sst;
    }
    return st;
}

maco_status_t maco__tcp_signal(struct maco_port_channel *ch, void *state)
{
    return maco__tcp_queue_op(ch, MACO__TCP_SIGNAL, 0, 0, 0, 0);
}

/* Deals queued operations to sockets while resources last. Returns how many messages. */
int maco__tcp_deal(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g)
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
int maco__tcp_send(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s)
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
