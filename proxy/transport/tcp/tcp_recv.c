/*
 * tcp_recv.c - the TCP transport's receiving side: message headers and payloads read,
 * stored in host memory or copied to the GPU, signals applied in order, acknowledgements
 * (transport_tcp.c has the design).
 */
#include "proxy/transport/tcp/tcp_internal.h"

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
int maco__tcp_complete(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s)
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
int maco__tcp_recv(struct maco_proxy *p, maco__tcp_state_t *t, maco__tcp_group_t *g, int s)
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
