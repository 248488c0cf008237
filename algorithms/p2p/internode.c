/*
 * internode.c - send/recv and all-to-all between ranks of different nodes: the pair's buffers and
 * port channels, made on the first message between two ranks, and the launch. The protocol
 * is in internode_kernel.cu; the buffers are pinned host memory for the reason common/setup.c gives
 * for the rails (a proxy that needs no copy engine cannot wait behind the application's work).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/p2p/p2p.h"
#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"

enum { MACO__P2P_INTERNODE_THREADS = 512 }; /* internode_kernel.cu's __launch_bounds__ */

/* Host side of one peer on another node. */
typedef struct maco__internode_peer {
    int connected;
    char *buf; /* MACO__P2P_INTERNODE_SLOTS send slots, then as many receive slots */
    maco_mem_t mem, peer_mem;
    maco_port_channel_t data, ack;
} maco__internode_peer_t;

static maco_status_t maco__p2p_internode_tables(maco_comm_t comm, maco__coll_t *c)
{
    if (c->internode_peer != NULL)
        return MACO_OK;
    const size_t n = (size_t)comm->nranks;
    c->internode_peer = (maco__internode_peer_t *)calloc(n, sizeof(maco__internode_peer_t));
    if (c->internode_peer == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL,
                           "send/recv across nodes: no memory");
    maco_status_t st = MACO_OK;
    MACO_CUDA_GOTO(cudaHostAlloc((void **)&c->internode_peer_dev,
                                 n * sizeof(maco__internode_peer_dev_t), cudaHostAllocMapped),
                   st, fail);
    memset(c->internode_peer_dev, 0, n * sizeof(maco__internode_peer_dev_t));
    return MACO_OK;
fail:
    free(c->internode_peer);
    c->internode_peer = NULL;
    c->internode_peer_dev = NULL;
    return st;
}

/* The pair (this rank, q): buffers, their exchange, the two port channels. */
static maco_status_t maco__p2p_internode_connect_one(maco_comm_t comm, maco__coll_t *c, int q)
{
    maco__internode_peer_t *x = &c->internode_peer[q];
    maco__internode_peer_dev_t *d = &c->internode_peer_dev[q];
    const uint64_t slot = 16 + (uint64_t)c->layout.p2p_chunk;
    const size_t bytes = (size_t)(2 * MACO__P2P_INTERNODE_SLOTS * slot);
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
        st = maco__bootstrap_exchange(comm->bs, q, MACO__TAG_P2P_INTERNODE, mine, theirs,
                                      sizeof(mine));
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

maco_status_t maco__p2p_internode_connect(maco_comm_t comm, maco__coll_t *c,
                                          const maco__p2p_plan_t *plan)
{
    if (plan->npairs == 0)
        return MACO_OK;
    if (c->proxy == NULL)
        return maco__error(MACO_ERR_INTERNAL, MACO_SUBSYS_COLL,
                           "send/recv across nodes: the collectives have no proxy");
    maco_status_t st = maco__p2p_internode_tables(comm, c);
    /* Ascending rank: the global order of pairs (lower, higher) seen from this rank. */
    for (int q = 0; q < comm->nranks && st == MACO_OK; q++) {
        if (c->internode_peer[q].connected)
            continue;
        for (int k = 0; k < plan->npairs; k++)
            if (plan->pair_peer[k] == q) {
                st = maco__p2p_internode_connect_one(comm, c, q);
                break;
            }
    }
    return st;
}

maco_status_t maco__p2p_internode_launch(maco_comm_t comm, maco__coll_t *c,
                                         const maco__p2p_plan_t *plan, maco_stream_t stream,
                                         const char *prefix)
{
    if (plan->npairs == 0)
        return MACO_OK;
    maco__p2p_internode_args_t a;
    memset(&a, 0, sizeof(a));
    a.plan = *plan;
    a.bound = comm->bound;
    a.chunk = c->layout.p2p_chunk;
    void *peers = NULL;
    cudaError_t cerr = cudaHostGetDevicePointer(&peers, c->internode_peer_dev, 0);
    a.peers = (maco__internode_peer_dev_t *)peers;
    /* One CTA per pair: each may wait on its peer, so at most the co-resident CTAs. */
    int blocks = plan->npairs;
    if (cerr == cudaSuccess && blocks > comm->coresident_ctas)
        cerr = cudaErrorLaunchOutOfResources;
    if (cerr == cudaSuccess)
        cerr = maco__launch_p2p_internode(&a, blocks, MACO__P2P_INTERNODE_THREADS,
                                          (cudaStream_t)stream);
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

void maco__p2p_internode_free(maco_comm_t comm, maco__coll_t *c)
{
    if (c->internode_peer != NULL) {
        for (int q = 0; q < comm->nranks; q++) {
            maco__internode_peer_t *x = &c->internode_peer[q];
            maco_port_channel_destroy(x->data);
            maco_port_channel_destroy(x->ack);
            maco_mem_deregister(x->peer_mem);
            maco_mem_deregister(x->mem);
            if (x->buf != NULL)
                cudaFreeHost(x->buf);
        }
        free(c->internode_peer);
        c->internode_peer = NULL;
    }
    if (c->internode_peer_dev != NULL)
        cudaFreeHost(c->internode_peer_dev);
    c->internode_peer_dev = NULL;
    cudaGetLastError();
}
