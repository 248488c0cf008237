/*
 * ib_data.c - the IB verbs transport's data path: puts and signals queued per
 * connection, posted as linked lists, completions polled, flush markers, failures
 * (transport_ib.c has the design).
 */
#include "proxy/transport/ib/ib_internal.h"

/* ------------------------------------------------------------------ failures */

static void maco__ib_fail(struct maco_proxy *p, maco__ib_state_t *t, maco__ib_conn_t *c,
                          const char *what)
{
    if (c->failed)
        return;
    /* The async error first, then `failed`, so a host flush that sees the connection failed
     * (maco__ib_alive) also finds the communicator's async error set. */
    maco__proxy_fail(p, maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                                    "IB transport: the connection to rank %d (%s port %u, QP %u "
                                    "-> rank %d's QP %u) failed: %s; its channels are dead",
                                    c->peer, t->dev, t->port, c->qp->qp_num, c->peer, c->remote_qpn,
                                    what));
    __atomic_store_n(&c->failed, 1, __ATOMIC_RELEASE); /* read by maco__ib_alive */
}

/* ------------------------------------------------------------------ puts and signals */

/* Queues an operation (proxy thread); the ring grows when full. */
static maco_status_t maco__ib_queue(struct maco_port_channel *ch, maco__ib_state_t *t,
                                    maco__ib_op_t *op)
{
    maco__ib_conn_t *c = ((maco__ib_channel_t *)ch->tp)->conn;
    if (__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                           "port channel %u: the IB connection to rank %d failed earlier", ch->id,
                           ch->peer);
    if (c->head - c->tail == c->cap) {
        uint64_t cap = 2 * c->cap;
        maco__ib_op_t *ops = (maco__ib_op_t *)malloc(cap * sizeof(*ops));
        if (ops == NULL)
            return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
        for (uint64_t i = c->tail; i < c->head; i++)
            ops[i & (cap - 1)] = c->ops[i & (c->cap - 1)];
        free(c->ops);
        c->ops = ops;
        c->cap = cap;
    }
    op->seq = ++t->seq;
    c->ops[c->head & (c->cap - 1)] = *op;
    c->head++;
    return MACO_OK;
}

maco_status_t maco__ib_put(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                           uint64_t src_offset, uint64_t bytes)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    maco__ib_channel_t *cs = (maco__ib_channel_t *)ch->tp;
    maco_status_t st = MACO_OK;
    while (bytes > 0 && st == MACO_OK) {
        uint64_t n = bytes < t->max_msg ? bytes : t->max_msg;
        maco__ib_op_t op;
        memset(&op, 0, sizeof(op));
        op.kind = MACO__IB_OP_PUT;
        op.laddr = (uint64_t)(uintptr_t)(ch->src + src_offset);
        op.lkey = cs->src_mr->mr->lkey;
        op.raddr = ch->dst_addr + dst_offset;
        op.rkey = cs->dst_rkey;
        op.bytes = (uint32_t)n;
        op.host_src = (uint8_t)ch->src_host;
        st = maco__ib_queue(ch, t, &op);
        bytes -= n;
        src_offset += n;
        dst_offset += n;
    }
    return st;
}

maco_status_t maco__ib_signal(struct maco_port_channel *ch, void *state)
{
    maco__ib_channel_t *cs = (maco__ib_channel_t *)ch->tp;
    maco__ib_op_t op;
    memset(&op, 0, sizeof(op));
    op.kind = MACO__IB_OP_SIGNAL;
    op.value = ch->signals_sent + 1;
    op.raddr = cs->sem_addr;
    op.rkey = cs->sem_rkey;
    op.bytes = sizeof(uint64_t);
    maco_status_t st = maco__ib_queue(ch, (maco__ib_state_t *)state, &op);
    if (st == MACO_OK)
        ch->signals_sent++;
    return st;
}

/* ------------------------------------------------------------------ progress, flushes */

/* Polls the connection's completions. Returns how many. */
static int maco__ib_poll(struct maco_proxy *p, maco__ib_state_t *t, maco__ib_conn_t *c)
{
    struct ibv_wc wc[MACO__IB_POLL];
    int n = ibv_poll_cq(c->cq, MACO__IB_POLL, wc);
    if (n < 0) {
        maco__ib_fail(p, t, c, "ibv_poll_cq failed");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS) {
            char what[256];
            snprintf(what, sizeof(what),
                     "a write completed with status %s (%d, vendor error 0x%x)%s",
                     t->v->wc_status_str(wc[i].status), (int)wc[i].status, wc[i].vendor_err,
                     wc[i].status == IBV_WC_RETRY_EXC_ERR
                         ? ": the peer did not answer within the QP's retries (gone, or "
                           "unreachable)"
                         : "");
            maco__ib_fail(p, t, c, what);
            return i;
        }
        /* In order on an RC send queue: everything up to this WR has completed. */
        if (wc[i].wr_id + 1 > c->tail && wc[i].wr_id < c->posted)
            c->tail = wc[i].wr_id + 1;
    }
    return n;
}

/* Posts what waits, as far as the send queue has room, with one ibv_post_send. Returns how
 * many WRs. */
static int maco__ib_post(struct maco_proxy *p, maco__ib_state_t *t, maco__ib_conn_t *c)
{
    uint64_t room = c->depth - (c->posted - c->tail);
    uint64_t waiting = c->head - c->posted;
    uint64_t k = room < waiting ? room : waiting;
    if (k == 0)
        return 0;
    for (uint64_t j = 0; j < k; j++) {
        uint64_t idx = c->posted + j;
        maco__ib_op_t *o = &c->ops[idx & (c->cap - 1)];
        struct ibv_send_wr *wr = &t->wrs[j];
        struct ibv_sge *sge = &t->sges[j];
        memset(wr, 0, sizeof(*wr));
        wr->wr_id = idx;
        wr->opcode = IBV_WR_RDMA_WRITE;
        wr->sg_list = sge;
        wr->num_sge = 1;
        wr->wr.rdma.remote_addr = o->raddr;
        wr->wr.rdma.rkey = o->rkey;
        sge->length = o->bytes;
        if (o->kind == MACO__IB_OP_SIGNAL) {
            if (c->max_inline >= sizeof(uint64_t)) {
                sge->addr = (uint64_t)(uintptr_t)&o->value; /* copied by the post */
                sge->lkey = 0;
                wr->send_flags |= IBV_SEND_INLINE;
            } else {
                uint64_t *slot = &c->slots[idx % c->depth]; /* free: its last WR completed */
                *slot = o->value;
                sge->addr = (uint64_t)(uintptr_t)slot;
                sge->lkey = c->slots_mr->lkey;
            }
        } else {
            sge->addr = o->laddr;
            sge->lkey = o->lkey;
            if (o->host_src && o->bytes <= c->max_inline)
                wr->send_flags |= IBV_SEND_INLINE;
        }
        int last = j + 1 == k;
        if ((idx + 1) % MACO__IB_SIGNAL_EVERY == 0 || idx + 1 == c->signal_at ||
            (last && idx + 1 == c->head))
            wr->send_flags |= IBV_SEND_SIGNALED;
        wr->next = last ? NULL : &t->wrs[j + 1];
    }
    struct ibv_send_wr *bad = NULL;
    int err = ibv_post_send(c->qp, &t->wrs[0], &bad);
    if (err != 0) {
        uint64_t ok =
            bad != NULL && bad >= t->wrs && bad < t->wrs + k ? (uint64_t)(bad - t->wrs) : 0;
        c->posted += ok;
        char what[200];
        snprintf(what, sizeof(what), "ibv_post_send of %llu WRs failed at WR %llu: %s",
                 (unsigned long long)k, (unsigned long long)ok, strerror(err));
        maco__ib_fail(p, t, c, what);
        return (int)ok;
    }
    c->posted += k;
    return (int)k;
}

/*
 * Posted work that has seen no completion for MACO__IB_STALL_MS: once every 500 ms, looks at the
 * peer's bootstrap link. A peer whose process is gone cannot answer, so the connection fails
 * now, naming it, instead of when the QP's retries run out (which some providers never do
 * with retry_cnt 7). Nothing is looked at while no work is in flight: a peer that left after
 * everything completed is no error.
 */
static void maco__ib_check_stall(struct maco_proxy *p, maco__ib_state_t *t, maco__ib_conn_t *c)
{
    int64_t now = maco__now_ms();
    if (now - c->moved_ms < MACO__IB_STALL_MS || now < c->next_look_ms)
        return;
    c->next_look_ms = now + 500;
    if (maco__bootstrap_peer_alive(p->comm->bs, c->peer) == MACO_OK)
        return;
    char what[640];
    snprintf(what, sizeof(what),
             "%llu write(s) in flight without a completion for %lld ms, and rank %d's process is "
             "gone (%s)",
             (unsigned long long)(c->posted - c->tail), (long long)(now - c->moved_ms), c->peer,
             maco__last_error());
    maco__ib_fail(p, t, c, what);
}

int maco__ib_progress(struct maco_proxy *p, void *state)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    int work = 0;
    for (maco__ib_conn_t *c = __atomic_load_n(&t->conns, __ATOMIC_ACQUIRE); c != NULL;
         c = c->next) {
        if (c->failed || c->tail == c->head)
            continue;
        int idle = c->tail == c->posted;
        if (!idle) {
            int n = maco__ib_poll(p, t, c);
            work += n;
            if (n > 0 || c->failed)
                c->moved_ms = maco__now_ms();
            else
                maco__ib_check_stall(p, t, c);
        }
        if (!c->failed) {
            int n = maco__ib_post(p, t, c);
            work += n;
            if (n > 0 && idle)
                c->moved_ms = maco__now_ms();
        }
    }
    return work;
}

maco_status_t maco__ib_mark(struct maco_proxy *p, void *state, uint64_t *marker_p)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    /* The newest operation of each connection that still waits gets a signalled WR, so the
     * flush does not wait for the next MACO__IB_SIGNAL_EVERY. */
    for (maco__ib_conn_t *c = __atomic_load_n(&t->conns, __ATOMIC_ACQUIRE); c != NULL; c = c->next)
        if (c->head > c->posted)
            c->signal_at = c->head;
    *marker_p = t->seq;
    return MACO_OK;
}

int maco__ib_marker_done(struct maco_proxy *p, void *state, uint64_t marker)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    for (maco__ib_conn_t *c = __atomic_load_n(&t->conns, __ATOMIC_ACQUIRE); c != NULL;
         c = c->next) {
        if (c->failed || c->tail == c->head)
            continue; /* failed: the async error says why; the flush must not wait forever */
        if (c->ops[c->tail & (c->cap - 1)].seq <= marker)
            return 0;
    }
    return 1;
}

int maco__ib_outstanding(struct maco_proxy *p, void *state)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    for (maco__ib_conn_t *c = __atomic_load_n(&t->conns, __ATOMIC_ACQUIRE); c != NULL; c = c->next)
        if (!c->failed && c->tail != c->head)
            return 1;
    return 0;
}

int maco__ib_alive(struct maco_port_channel *ch, void *state)
{
    maco__ib_channel_t *cs = (maco__ib_channel_t *)ch->tp;
    return cs == NULL || cs->conn == NULL || !__atomic_load_n(&cs->conn->failed, __ATOMIC_ACQUIRE);
}
