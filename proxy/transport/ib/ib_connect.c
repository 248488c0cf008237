/*
 * ib_connect.c - the IB verbs transport: one RC queue pair per peer proxy, brought to RTS
 * through an endpoint exchange over the bootstrap (ib_wire.h), channels set up on it, and
 * the proxy's teardown (transport_ib.c has the design).
 */
#include "proxy/transport/ib/ib_internal.h"

/* ------------------------------------------------------------------ connections */

static void maco__ib_conn_free(maco__ib_state_t *t, maco__ib_conn_t *c)
{
    if (c == NULL)
        return;
    if (c->qp != NULL)
        t->v->destroy_qp(c->qp);
    if (c->cq != NULL)
        t->v->destroy_cq(c->cq);
    if (c->slots_mr != NULL)
        t->v->dereg_mr(c->slots_mr);
    free(c->slots);
    free(c->ops);
    free(c);
}

/* A new connection's CQ, QP (INIT) and signal slots. */
static maco_status_t maco__ib_conn_create(struct maco_port_channel *ch, maco__ib_state_t *t,
                                          maco__ib_conn_t **c_p)
{
    const maco__ibv_table_t *v = t->v;
    maco__ib_conn_t *c = (maco__ib_conn_t *)calloc(1, sizeof(*c));
    if (c == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
    c->peer = ch->peer;
    c->peer_uid = ch->peer_proxy_uid;
    c->depth = t->depth;
    for (c->cap = 1; c->cap < 2u * t->depth;)
        c->cap *= 2;
    c->ops = (maco__ib_op_t *)calloc(c->cap, sizeof(*c->ops));
    c->slots = (uint64_t *)calloc(c->depth, sizeof(uint64_t));
    maco_status_t st = MACO_OK;
    if (c->ops == NULL || c->slots == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
        goto fail;
    }
    c->cq = v->create_cq(t->ctx, (int)c->depth, NULL, NULL, 0);
    if (c->cq == NULL) {
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                         "IB transport: ibv_create_cq (%u entries) on %s failed: %s", c->depth,
                         t->dev, strerror(errno));
        goto fail;
    }
    struct ibv_qp_init_attr qa;
    for (int inl = MACO__IB_INLINE; c->qp == NULL && inl >= 0; inl = inl > 0 ? 0 : -1) {
        memset(&qa, 0, sizeof(qa));
        qa.send_cq = c->cq;
        qa.recv_cq = c->cq;
        qa.qp_type = IBV_QPT_RC;
        qa.sq_sig_all = 0;
        qa.cap.max_send_wr = c->depth;
        qa.cap.max_recv_wr = 1;
        qa.cap.max_send_sge = 1;
        qa.cap.max_recv_sge = 1;
        qa.cap.max_inline_data = (uint32_t)inl;
        c->qp = v->create_qp(t->pd, &qa);
    }
    if (c->qp == NULL) {
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                         "IB transport: ibv_create_qp (RC, %u WRs) on %s for rank %d failed: %s",
                         c->depth, t->dev, ch->peer, strerror(errno));
        goto fail;
    }
    c->max_inline = qa.cap.max_inline_data;
    if (c->max_inline < sizeof(uint64_t)) {
        c->slots_mr =
            v->reg_mr(t->pd, c->slots, c->depth * sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE);
        if (c->slots_mr == NULL) {
            st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                             "IB transport: registering signal slots on %s failed: %s", t->dev,
                             strerror(errno));
            goto fail;
        }
    }
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = t->port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    int err = v->modify_qp(c->qp, &a,
                           IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (err != 0) {
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                         "IB transport: QP %u on %s to INIT failed: %s", c->qp->qp_num, t->dev,
                         strerror(err));
        goto fail;
    }
    *c_p = c;
    return MACO_OK;
fail:
    maco__ib_conn_free(t, c);
    return st;
}

/* Brings a new connection's QP to RTR and RTS with the peer's endpoint. */
static maco_status_t maco__ib_conn_rts(maco__ib_state_t *t, maco__ib_conn_t *c,
                                       const maco__ib_endpoint_t *theirs, uint32_t my_psn)
{
    const maco__ibv_table_t *v = t->v;
    uint8_t their_mtu = theirs->mtu;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)(their_mtu < t->mtu ? their_mtu : t->mtu);
    a.dest_qp_num = theirs->qpn;
    a.rq_psn = theirs->psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = t->port;
    a.ah_attr.dlid = theirs->lid;
    a.ah_attr.sl = 0;
    if (theirs->gid_valid != 0 && t->gid_index >= 0) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, theirs->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)t->gid_index;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.flow_label = 0;
        a.ah_attr.grh.traffic_class = 0;
    }
    c->remote_qpn = a.dest_qp_num;
    int err = v->modify_qp(c->qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err != 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                           "IB transport: QP %u on %s to RTR (rank %d's QP %u) failed: %s",
                           c->qp->qp_num, t->dev, c->peer, c->remote_qpn, strerror(err));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = (uint8_t)t->timeout;
    a.retry_cnt = (uint8_t)t->retry_cnt;
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = 1;
    err = v->modify_qp(c->qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (err != 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                           "IB transport: QP %u on %s to RTS failed: %s", c->qp->qp_num, t->dev,
                           strerror(err));
    return MACO_OK;
}

static void maco__ib_channel_free(maco__ib_state_t *t, maco__ib_channel_t *cs)
{
    if (cs == NULL)
        return;
    maco__ib_mr_put(t, cs->src_mr);
    maco__ib_mr_put(t, cs->recv_mr);
    maco__ib_mr_put(t, cs->sem_mr);
    free(cs);
}

maco_status_t maco__ib_connect(struct maco_port_channel *ch, void *state)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    struct maco_proxy *p = ch->proxy;
    int peer = ch->peer;
    maco__ib_conn_t *c = NULL;
    for (maco__ib_conn_t *it = t->conns; it != NULL; it = it->next)
        if (it->peer == peer && it->peer_uid == ch->peer_proxy_uid)
            c = it;
    int fresh = c == NULL;
    maco__ib_channel_t *cs = (maco__ib_channel_t *)calloc(1, sizeof(*cs));
    maco_status_t st =
        cs != NULL ? maco__ib_open(p, t)
                   : maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
    /* What this rank's memory regions cover: the source, what the peer writes here, the
     * semaphore its signals raise. */
    if (st == MACO_OK)
        st = maco__ib_mr_get(t, (uint64_t)(uintptr_t)ch->src, ch->src_bytes, "source buffer",
                             &cs->src_mr);
    if (st == MACO_OK)
        st = maco__ib_mr_get(t, (uint64_t)(uintptr_t)ch->recv, ch->recv_bytes,
                             "buffer the peer writes", &cs->recv_mr);
    uint64_t sem = (uint64_t)(uintptr_t)(ch->sem_host ? ch->inbound : ch->inbound_dev);
    if (st == MACO_OK && sem == 0)
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                         "IB transport: port channel %u to rank %d has no semaphore address "
                         "for the peer to write",
                         ch->id, peer);
    if (st == MACO_OK)
        st = maco__ib_mr_get(t, sem, sizeof(uint64_t), "semaphore", &cs->sem_mr);
    if (st == MACO_OK && fresh)
        st = maco__ib_conn_create(ch, t, &c);
    else if (st == MACO_OK && __atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
        st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                         "IB transport: the connection to rank %d failed earlier (QP %u; the "
                         "communicator's async error says why); no new channel on it",
                         peer, c->qp->qp_num);
    uint32_t psn = (uint32_t)maco__random_u64() & 0xffffffu;
    uint8_t mine[MACO__IB_ENDPOINT], theirs[MACO__IB_ENDPOINT];
    maco__ib_endpoint_t me, te;
    memset(&me, 0, sizeof(me));
    memset(theirs, 0, sizeof(theirs));
    me.flags = (uint16_t)((st == MACO_OK ? MACO__IB_FLAG_OK : 0) | (fresh ? MACO__IB_FLAG_NEW : 0));
    me.uid = p->uid;
    if (st == MACO_OK) {
        if (fresh) {
            me.qpn = c->qp->qp_num;
            me.psn = psn;
            me.lid = t->lid;
            me.link_layer = t->link_layer;
            me.mtu = t->mtu;
            me.gid_valid = t->gid_index >= 0;
            me.port = t->port;
            if (t->gid_index >= 0)
                memcpy(me.gid, t->gid.raw, 16);
        }
        me.recv_addr = (uint64_t)(uintptr_t)ch->recv;
        me.recv_bytes = ch->recv_bytes;
        me.recv_rkey = cs->recv_mr->mr->rkey;
        me.sem_rkey = cs->sem_mr->mr->rkey;
        me.sem_addr = sem;
        me.channel = ch->id;
    }
    maco__ib_endpoint_encode(mine, &me);
    /* Exchange even after a failure, so the peer fails now instead of at its deadline. */
    maco_status_t xst = maco__port_exchange(ch, mine, theirs, sizeof(mine));
    if (st == MACO_OK)
        st = xst;
    int foreign = maco__ib_endpoint_decode(theirs, &te) != 0;
    uint16_t flags = te.flags;
    if (st == MACO_OK && foreign)
        st = maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d sent an endpoint with magic 0x%08x version %u "
                         "(expected 0x%08x version %u): different MACO builds?",
                         peer, maco__get_u32(theirs), maco__get_u16(theirs + 4), MACO__IB_MAGIC,
                         MACO__IB_VERSION);
    else if (st == MACO_OK && !(flags & MACO__IB_FLAG_OK))
        st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d could not set up its side of port channel %u "
                         "(its log says why)",
                         peer, ch->id);
    else if (st == MACO_OK && (!(flags & MACO__IB_FLAG_NEW)) != !fresh)
        st = maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d %s a queue pair with this proxy, this rank %s",
                         peer, fresh ? "has" : "has no", fresh ? "has none" : "has one");
    else if (st == MACO_OK && (te.uid != ch->peer_proxy_uid || te.recv_addr != ch->dst_addr ||
                               te.recv_bytes != ch->dst_bytes))
        st = maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d's endpoint names another proxy or destination "
                         "than its channel hello did",
                         peer);
    else if (st == MACO_OK && fresh && !maco__ib_endpoint_port_ok(&te, t->link_layer))
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d's port (link layer %u, MTU code %u, %s GID) "
                         "cannot reach this rank's %s port %u (link layer %u): both must be "
                         "InfiniBand, or both Ethernet with a GID",
                         peer, te.link_layer, te.mtu, te.gid_valid ? "with a" : "without", t->dev,
                         t->port, t->link_layer);
    /* A new connection: both QPs to RTS, then both say so, so that no write reaches a QP not
     * ready for it. Both ranks decide from the two endpoints alone whether this second
     * exchange happens (each sent "ready" and "new"), so neither waits for one that never
     * comes; what fails after the first exchange travels in it. */
    uint16_t mine_flags = me.flags;
    int handshake = xst == MACO_OK && (mine_flags & MACO__IB_FLAG_OK) &&
                    (mine_flags & MACO__IB_FLAG_NEW) && (flags & MACO__IB_FLAG_OK) &&
                    (flags & MACO__IB_FLAG_NEW);
    if (handshake) {
        if (st == MACO_OK)
            st = maco__ib_conn_rts(t, c, &te, psn);
        uint8_t ready[MACO__IB_READY], their_ready[MACO__IB_READY];
        memset(their_ready, 0, sizeof(their_ready));
        maco__ib_ready_encode(ready, st == MACO_OK);
        maco_status_t rst = maco__port_exchange(ch, ready, their_ready, sizeof(ready));
        if (st == MACO_OK && rst != MACO_OK)
            st = rst;
        else if (st == MACO_OK && !maco__ib_ready_ok(their_ready))
            st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                             "IB transport: rank %d could not bring its queue pair to RTS (its "
                             "log says why)",
                             peer);
    }
    if (st != MACO_OK) {
        if (fresh)
            maco__ib_conn_free(t, c);
        maco__ib_channel_free(t, cs);
        return st;
    }
    cs->conn = c;
    cs->dst_rkey = te.recv_rkey;
    cs->sem_rkey = te.sem_rkey;
    cs->sem_addr = te.sem_addr;
    if (fresh) {
        c->next = t->conns;
        __atomic_store_n(&t->conns, c, __ATOMIC_RELEASE); /* the proxy thread picks it up */
        MACO_INFO(MACO_SUBSYS_PROXY,
                  "IB transport: rank %d connected to rank %d: %s port %u QP %u <-> QP %u (%u "
                  "WRs, %u inline bytes)",
                  p->comm->rank, peer, t->dev, t->port, c->qp->qp_num, c->remote_qpn, c->depth,
                  c->max_inline);
    }
    ch->tp = cs;
    return MACO_OK;
}

void maco__ib_disconnect(struct maco_port_channel *ch, void *state)
{
    maco__ib_channel_free((maco__ib_state_t *)state, (maco__ib_channel_t *)ch->tp);
    ch->tp = NULL;
}

void maco__ib_proxy_teardown(struct maco_proxy *p, void *state)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    if (t == NULL)
        return;
    for (maco__ib_conn_t *c = t->conns; c != NULL;) {
        maco__ib_conn_t *next = c->next;
        maco__ib_conn_free(t, c);
        c = next;
    }
    while (t->mrs != NULL) {
        maco__ib_mr_t *m = t->mrs;
        t->mrs = m->next;
        t->v->dereg_mr(m->mr);
        free(m);
    }
    if (t->pd != NULL)
        t->v->dealloc_pd(t->pd);
    if (t->ctx != NULL)
        t->v->close_device(t->ctx);
    free(t->wrs);
    free(t->sges);
    free(t);
}
