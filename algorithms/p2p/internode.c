/*
 * xp2p.c - send/recv and all-to-all between ranks of different nodes: the pair's buffers and
 * port channels, made on the first message between two ranks, and the launch. The protocol
 * is in xp2p_kernel.cu; the buffers are pinned host memory for the reason setup.c gives for
 * the rails (a proxy that needs no copy engine cannot wait behind the application's work).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/common/state.h"
#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"

enum { MACO__XP2P_THREADS = 512 }; /* xp2p_kernel.cu's __launch_bounds__ */

/* Host side of one peer on another node. */
typedef struct maco__xpeer {
    int connected;
    char *buf; /* MACO__XP2P_SLOTS send slots, then as many receive slots */
    maco_mem_t mem, peer_mem;
    maco_port_channel_t data, ack;
} maco__xpeer_t;

static maco_status_t maco__xp2p_tables(maco_comm_t comm, maco__coll_t *c)
{
    if (c->xpeer != NULL)
        return MACO_OK;
    const size_t n = (size_t)comm->nranks;
    c->xpeer = (maco__xpeer_t *)calloc(n, sizeof(maco__xpeer_t));
    if (c->xpeer == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL,
                           "send/recv across nodes: no memory");
    maco_status_t st = MACO_OK;
    MACO_CUDA_GOTO(
        cudaHostAlloc((void **)&c->xpeer_dev, n * sizeof(maco__xpeer_dev_t), cudaHostAllocMapped),
        st, fail);
    memset(c->xpeer_dev, 0, n * sizeof(maco__xpeer_dev_t));
    return MACO_OK;
fail:
    free(c->xpeer);
    c->xpeer = NULL;
    c->xpeer_dev = NULL;
    return st;
}

/* The pair (this rank, q): buffers, their exchange, the two port channels. */
static maco_status_t maco__xp2p_connect_one(maco_comm_t comm, maco__coll_t *c, int q)
{
    maco__xpeer_t *x = &c->xpeer[q];
    maco__xpeer_dev_t *d = &c->xpeer_dev[q];
    const uint64_t slot = 16 + (uint64_t)c->layout.p2p_chunk;
    const size_t bytes = (size_t)(2 * MACO__XP2P_SLOTS * slot);
    maco_status_t st = MACO_OK;
    uint8_t mine[MACO_MEM_HANDLE_BYTES], theirs[MACO_MEM_HANDLE_BYTES];
    char *dev = NULL;
    MACO_CUDA_GOTO(cudaHostAlloc((void **)&x->buf, bytes, cudaHostAllocMapped), st, out);
    memset(x->buf, 0, bytes);
    MACO_CUDA_GOTO(cudaHostGetDevicePointer((void **)&dev, x->buf, 0), st, out);
    st = maco_mem_register(comm, x->buf, bytes, &x->mem);
    if (st == MACO_OK)
        st = maco_mem_serialize(x->mem, mine);
    if (st == MACO_OK)
        st = maco__bootstrap_exchange(comm->bs, q, MACO__TAG_XP2P, mine, theirs, sizeof(mine));
    if (st == MACO_OK)
        st = maco_mem_import(comm, theirs, &x->peer_mem);
    if (st == MACO_OK)
        st = maco_port_channel_create(c->proxy, q, MACO_TRANSPORT_AUTO, x->mem, x->peer_mem,
                                      &x->data);
    if (st == MACO_OK)
        st = maco_port_channel_create(c->proxy, q, MACO_TRANSPORT_AUTO, x->mem, x->peer_mem,
                                      &x->ack);
    if (st == MACO_OK)
        st = maco_port_channel_get_device_handle(x->data, &d->data);
    if (st == MACO_OK)
        st = maco_port_channel_get_device_handle(x->ack, &d->ack);
    if (st != MACO_OK)
        goto out;
    d->buf = dev;
    d->slot_bytes = slot;
    d->sent = 0;
    d->recvd = 0;
    x->connected = 1;
    MACO_DEBUG(MACO_SUBSYS_COLL, "rank %d: send/recv with rank %d (node %d) connected", comm->rank,
               q, maco__node_of(c, q));
out:
    if (st != MACO_OK) {
        char why[400];
        snprintf(why, sizeof(why), "%s", maco__last_error());
        st = maco__error(st, MACO_SUBSYS_COLL,
                         "connecting send/recv with rank %d on node %d (this rank is on node "
                         "%d): %s",
                         q, maco__node_of(c, q), c->node, why);
    }
    return st;
}

maco_status_t maco__xp2p_connect(maco_comm_t comm, maco__coll_t *c, const maco__p2p_plan_t *plan)
{
    if (plan->npairs == 0)
        return MACO_OK;
    if (c->proxy == NULL)
        return maco__error(MACO_ERR_INTERNAL, MACO_SUBSYS_COLL,
                           "send/recv across nodes: the collectives have no proxy");
    maco_status_t st = maco__xp2p_tables(comm, c);
    /* Ascending rank: the global order of pairs (lower, higher) seen from this rank. */
    for (int q = 0; q < comm->nranks && st == MACO_OK; q++) {
        if (c->xpeer[q].connected)
            continue;
        for (int k = 0; k < plan->npairs; k++)
            if (plan->pair_peer[k] == q) {
                st = maco__xp2p_connect_one(comm, c, q);
                break;
            }
    }
    return st;
}

maco_status_t maco__xp2p_launch(maco_comm_t comm, maco__coll_t *c, const maco__p2p_plan_t *plan,
                                maco_stream_t stream, const char *prefix)
{
    if (plan->npairs == 0)
        return MACO_OK;
    maco__xp2p_args_t a;
    memset(&a, 0, sizeof(a));
    a.plan = *plan;
    a.bound = comm->bound;
    a.chunk = c->layout.p2p_chunk;
    void *peers = NULL;
    cudaError_t cerr = cudaHostGetDevicePointer(&peers, c->xpeer_dev, 0);
    a.peers = (maco__xpeer_dev_t *)peers;
    /* One CTA per pair: each may wait on its peer, so at most the co-resident CTAs. */
    int blocks = plan->npairs;
    if (cerr == cudaSuccess && blocks > comm->coresident_ctas)
        cerr = cudaErrorLaunchOutOfResources;
    if (cerr == cudaSuccess)
        cerr = maco__launch_xp2p(&a, blocks, MACO__XP2P_THREADS, (cudaStream_t)stream);
    if (cerr != cudaSuccess) {
        cudaGetLastError();
        return maco__comm_record(comm,
                                 maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                             "%slaunching the send/recv kernel across "
                                             "nodes (%d pairs, %d ops) failed: %s (%s)",
                                             prefix, plan->npairs, plan->nops,
                                             cudaGetErrorName(cerr), cudaGetErrorString(cerr)));
    }
    c->last_ctas = blocks;
    MACO_TRACE(MACO_SUBSYS_COLL, "%ssend/recv kernel across nodes: %d pairs, %d ops", prefix,
               plan->npairs, plan->nops);
    return MACO_OK;
}

void maco__xp2p_free(maco_comm_t comm, maco__coll_t *c)
{
    if (c->xpeer != NULL) {
        for (int q = 0; q < comm->nranks; q++) {
            maco__xpeer_t *x = &c->xpeer[q];
            maco_port_channel_destroy(x->data);
            maco_port_channel_destroy(x->ack);
            maco_mem_deregister(x->peer_mem);
            maco_mem_deregister(x->mem);
            if (x->buf != NULL)
                cudaFreeHost(x->buf);
        }
        free(c->xpeer);
        c->xpeer = NULL;
    }
    if (c->xpeer_dev != NULL)
        cudaFreeHost(c->xpeer_dev);
    c->xpeer_dev = NULL;
    cudaGetLastError();
}
