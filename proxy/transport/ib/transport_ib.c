/*
 * transport_ib.c - the IB verbs transport: port channels over RDMA, InfiniBand or RoCE
 * (docs/design.md, "Transports").
 *
 * libibverbs is dlopen'ed (ib_symbols.h); without it, or without an ACTIVE port, the
 * transport is unavailable and says why. Each proxy uses one device port: MACO_IB_HCA's
 * choice, else the ACTIVE port nearest the GPU in the PCI tree, local ranks spread over equally
 * near ones. The GID is MACO_IB_GID_INDEX, else a RoCE v2 IPv4-mapped GID (sysfs says each
 * entry's type); on the InfiniBand link layer the LID addresses the peer.
 *
 * Connections. Two proxies with channels between them share one RC queue pair (a
 * "connection": this proxy, the peer's proxy), made at their first channel. Every channel's
 * connect exchanges an endpoint over the bootstrap (layout below): the queue pair's number,
 * PSN, LID, GID and MTU when the connection is new, and always the rkey and address of what
 * the peer's channel writes here: its destination buffer (ch->recv) and the semaphore its
 * signals raise (ch->inbound, or ch->inbound_dev in the comm buffer). A new connection is
 * brought to RTS on both sides, then a second exchange says both are ready, so the first
 * write never reaches a queue pair that cannot take it yet.
 *
 * The endpoint and ready messages: proxy/transport/ib/ib_wire.h.
 *
 * Puts are RDMA WRITEs from the source's memory region (split at the port's max_msg_sz);
 * a signal is an 8-byte RDMA WRITE of the channel's new count to the peer's semaphore
 * (inline where the QP takes inline data, else from a registered slot untouched until its
 * completion), posted after the channel's data on the same QP: an RC responder executes a
 * QP's writes in PSN order, so a waiter that sees the count sees the data. (GPU memory on the
 * receiving side: a NIC's writes over PCIe stay in order as long as relaxed ordering is off,
 * and it is not asked for; NCCL also reads back before a GPU consumes received data, which is
 * not done here. Not run on our machines.)
 *
 * Posting. put and signal queue operations on the connection (a ring indexed by a local
 * sequence number); progress posts what waits, as one linked list per ibv_post_send, as far
 * as the send queue has room, then polls the connection's CQ. A WR is signalled every
 * MACO__IB_SIGNAL_EVERY, when it is the last one a flush marker covers, and when it empties
 * the queue, so no posted WR is left without a later signalled one (a completion means every
 * earlier WR of its QP completed). Markers are the transport's operation sequence number;
 * one is done when no connection has an operation at or before it outstanding.
 *
 * Memory regions cover whole allocations (maco__mem_lookup), with LOCAL_WRITE, REMOTE_WRITE,
 * REMOTE_READ and REMOTE_ATOMIC, cached per proxy and counted by the channels that use them.
 * Host memory uses ibv_reg_mr; GPU memory a dma-buf from the CUDA driver
 * (cuMemGetHandleForAddressRange, ibv_reg_dmabuf_mr), else ibv_reg_mr (nvidia-peermem).
 *
 * Failures. An error completion, a failed post or a failed poll fails the connection: the
 * communicator's async error names the peer, the device, the QP and the status, `alive` says
 * 0, later flushes complete at once and their callers see MACO_ERR_REMOTE. A dead peer is
 * found when the QP's retries run out (MACO_IB_TIMEOUT, MACO_IB_RETRY_CNT: about
 * 4.096 us * 2^timeout * (retry_cnt + 1)), or sooner when work to it has waited 2 s for a
 * completion and its bootstrap link says its process is gone; a peer that leaves with nothing
 * in flight is no error (nothing is sent to it, nothing is looked at).
 *
 * Files: this one has the ops table (and the stub of a build without verbs.h); ib_device.c
 * device port and GID choice, ib_mr.c memory regions, ib_connect.c queue pairs and channels,
 * ib_data.c posting, polling and flushes; ib_internal.h their shared state.
 */
#include <stdio.h>

#include "proxy/proxy_internal.h"

#ifndef MACO_HAVE_IBVERBS

/* Built without <infiniband/verbs.h>: IB is never offered. */
static int maco__ib_available(maco_comm_t comm, int peer, char *why, size_t cap)
{
    snprintf(why, cap,
             "MACO was built without the IB transport (no infiniband/verbs.h at build time: "
             "install libibverbs-dev and rebuild)");
    return 0;
}

const maco__transport_ops_t maco__transport_ib_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "IB verbs",
    .available = maco__ib_available,
};

#else /* MACO_HAVE_IBVERBS */

#include "proxy/transport/ib/ib_internal.h"

const maco__transport_ops_t maco__transport_ib_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "IB verbs",
    .available = maco__ib_available,
    .proxy_setup = maco__ib_proxy_setup,
    .proxy_teardown = maco__ib_proxy_teardown,
    .connect = maco__ib_connect,
    .disconnect = maco__ib_disconnect,
    .put = maco__ib_put,
    .signal = maco__ib_signal,
    .mark = maco__ib_mark,
    .marker_done = maco__ib_marker_done,
    .progress = maco__ib_progress,
    .outstanding = maco__ib_outstanding,
    .alive = maco__ib_alive,
};

#endif /* MACO_HAVE_IBVERBS */
