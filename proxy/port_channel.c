/*
 * port_channel.c - port channels: creating one between two ranks (semaphores and buffers
 * exchanged over the bootstrap, a transport chosen), its device handle, and the host-side
 * pushes and waits (proxy.c carries out what they push).
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"
#include "proxy/port_wire.h"
#include "proxy/proxy_internal.h"
#include "src/host/os/socket.h"
#include "src/host/base/wire.h"

/* ------------------------------------------------------------------ channels */

/* The hello two ranks exchange when they create a channel: proxy/port_wire.h. */

/* The transport MACO_TRANSPORT names for channels created with MACO_TRANSPORT_AUTO. */
static maco_status_t maco__port_env_transport(maco_transport_t *t_p)
{
    const char *v = NULL;
    maco_status_t st = maco__config_word(MACO_CFG_TRANSPORT, &v);
    if (st != MACO_OK)
        return st;
    for (int t = MACO_TRANSPORT_AUTO; t < MACO__TRANSPORT_SLOTS; t++) {
        if (strcasecmp(v, maco__transport_word((maco_transport_t)t)) == 0) {
            *t_p = (maco_transport_t)t;
            return MACO_OK;
        }
    }
    return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                       "MACO_TRANSPORT=%s names no transport; it accepts auto, cuda, host, ib "
                       "or tcp",
                       v);
}

/* Whether transport t can carry a channel of these buffers to `peer`: 1, or 0 with why. */
static int maco__port_usable(struct maco_proxy *p, int peer, maco_transport_t t, maco_mem_t src,
                             maco_mem_t dst, char *why, size_t cap)
{
    maco_comm_t comm = p->comm;
    int remote = maco__mem_is_remote(dst);
    int host_src = maco__mem_is_host(src), host_dst = maco__mem_is_host(dst);
    why[0] = '\0';
    switch (t) {
    case MACO_TRANSPORT_CUDA_COPY:
        if (!p->has_device_fifo)
            snprintf(why, cap, "the CUDA copy transport needs GPUs: %s", comm->gpu_unavailable);
        else if (remote)
            snprintf(why, cap,
                     "the CUDA copy transport reaches only this node's GPUs; rank %d "
                     "is on another node",
                     peer);
        else if (host_src || host_dst)
            snprintf(why, cap,
                     "the CUDA copy transport needs device buffers on both sides (src "
                     "is %s, dst is %s)",
                     host_src ? "host memory" : "device memory",
                     host_dst ? "host memory" : "device memory");
        break;
    case MACO_TRANSPORT_HOST_MEMORY:
        if (remote)
            snprintf(why, cap,
                     "the host-memory transport reaches only this node; rank %d is on "
                     "another node",
                     peer);
        else if (!host_src || !host_dst)
            snprintf(why, cap,
                     "the host-memory transport needs maco_mem_alloc_host buffers on "
                     "both sides (src is %s, dst is %s)",
                     host_src ? "host memory" : "device memory",
                     host_dst ? "host memory" : "device memory");
        break;
    case MACO_TRANSPORT_IB:
    case MACO_TRANSPORT_TCP:
        if ((!host_src || !host_dst) && !p->has_device_fifo)
            snprintf(why, cap, "device buffers need a GPU on this rank: %s", comm->gpu_unavailable);
        break;
    default:
        snprintf(why, cap, "transport %d is not a maco_transport_t", (int)t);
        return 0;
    }
    if (why[0] != '\0')
        return 0;
    return maco__transport_ops(t)->available(comm, peer, why, cap);
}

/* The transport both ranks use: the one they asked for, or for auto the first that both can
 * use of: host memory or CUDA copy (same node), IB, TCP. Both ranks compute the same. */
static maco_transport_t maco__port_choose(maco_transport_t asked, uint32_t both)
{
    if (asked != MACO_TRANSPORT_AUTO)
        return (both >> asked) & 1u ? asked : MACO_TRANSPORT_AUTO;
    static const maco_transport_t order[] = { MACO_TRANSPORT_HOST_MEMORY, MACO_TRANSPORT_CUDA_COPY,
                                              MACO_TRANSPORT_IB, MACO_TRANSPORT_TCP };
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
        if ((both >> order[i]) & 1u)
            return order[i];
    return MACO_TRANSPORT_AUTO;
}

/* The proxy's instance of transport t, set up at its first channel. */
static maco_status_t maco__port_instance(struct maco_proxy *p, maco_transport_t t)
{
    if (p->tp[t].ops != NULL)
        return MACO_OK;
    const maco__transport_ops_t *ops = maco__transport_ops(t);
    void *state = NULL;
    maco_status_t st = ops->proxy_setup(p, &state);
    if (st != MACO_OK)
        return st;
    p->tp[t].state = state;
    __atomic_store_n(&p->tp[t].ops, ops, __ATOMIC_RELEASE); /* the proxy thread reads it */
    if (maco__transport_polls(t)) {
        p->polled[p->npolled] = (uint8_t)t;
        __atomic_store_n(&p->npolled, p->npolled + 1, __ATOMIC_RELEASE);
    }
    MACO_INFO(MACO_SUBSYS_PROXY, "rank %d's proxy uses the %s transport", p->comm->rank, ops->name);
    return MACO_OK;
}

/* The checks of maco_port_channel_create's arguments that need the communicator (the caller
 * checked for NULL): the peer, the owners of src and dst, the transport. */
static maco_status_t maco__port_check_args(maco_comm_t comm, int peer, maco_transport_t transport,
                                           maco_mem_t src, maco_mem_t dst)
{
    int src_owner, dst_owner;
    maco_mem_get_owner(src, &src_owner);
    maco_mem_get_owner(dst, &dst_owner);
    if (peer < 0 || peer >= comm->nranks || peer == comm->rank || src_owner != comm->rank ||
        dst_owner != peer)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_create: peer %d (of %d "
                           "ranks), src owned by rank %d (must be %d), "
                           "dst owned by rank %d (must be the peer)",
                           peer, comm->nranks, src_owner, comm->rank, dst_owner);
    if ((int)transport < MACO_TRANSPORT_AUTO || (int)transport >= MACO__TRANSPORT_SLOTS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_create: transport %d is "
                           "not a maco_transport_t",
                           (int)transport);
    return MACO_OK;
}

/* Sends this rank's hello for a channel to `peer` (what it asked for and can use, the channel
 * id, the semaphore slots offered, dst's address and size in the owner's process) and takes
 * the peer's into *their, checked: slots and ids inside this rank's tables, the same transport
 * asked. */
static maco_status_t maco__port_hello_exchange(maco_proxy_t p, int peer, maco_transport_t asked,
                                               uint32_t can, maco_mem_t src, maco_mem_t dst,
                                               uint32_t host_slot, uint32_t dev_slot,
                                               maco__port_hello_t *their)
{
    maco_comm_t comm = p->comm;
    maco_status_t st;
    uint8_t mine[MACO__PORT_HELLO_BYTES], theirs[MACO__PORT_HELLO_BYTES];
    maco__port_hello_t my;
    memset(&my, 0, sizeof(my));
    my.asked = (uint16_t)asked;
    my.can = can;
    my.channel = p->nchannels;
    my.uid = p->uid;
    my.host_slot = host_slot;
    my.dev_slot = dev_slot;
    size_t dst_bytes = 0, src_bytes = 0;
    maco_mem_get_size(dst, &dst_bytes);
    maco_mem_get_size(src, &src_bytes);
    my.dst_addr = maco__mem_owner_addr(dst);
    my.dst_bytes = dst_bytes;
    my.dst_host = (uint32_t)maco__mem_is_host(dst);
    my.src_host = (uint32_t)maco__mem_is_host(src);
    st = maco_mem_serialize(p->host_sems_mem, my.sems);
    if (st == MACO_OK) {
        maco__port_hello_encode(mine, &my);
        st = maco__bootstrap_send(comm->bs, peer, MACO__TAG_PORT, mine, sizeof(mine));
    }
    if (st == MACO_OK)
        st = maco__bootstrap_recv(comm->bs, peer, MACO__TAG_PORT, theirs, sizeof(theirs));
    if (st != MACO_OK)
        return st;
    /* A peer's slots and ids index this rank's tables below: checked before any use. */
    const maco__port_hello_limits_t lim = { MACO__HOST_SEMS, MACO__NSEM,
                                            MACO_TRIGGER_MAX_CHANNELS };
    char bad[160];
    if (maco__port_hello_decode(theirs, &lim, their, bad, sizeof(bad)) != 0)
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                           "maco_port_channel_create: rank %d answered "
                           "with a hello this rank refuses: %s",
                           peer, bad);
    maco_transport_t their_asked = (maco_transport_t)their->asked;
    if (their_asked != asked)
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                           "rank %d created its channel to rank %d "
                           "with transport %s, this rank with %s",
                           peer, comm->rank, maco__transport_word(their_asked),
                           maco__transport_word(asked));
    return MACO_OK;
}

/* The transport both ranks take (maco__port_choose over what both can use), or the error that
 * none fits: what this rank asked for, or anything at all. */
static maco_status_t maco__port_agree(maco_comm_t comm, int peer, maco_transport_t asked,
                                      uint32_t can, uint32_t their_can,
                                      maco_transport_t *transport_p)
{
    uint32_t both = can & their_can;
    maco_transport_t transport = maco__port_choose(asked, both);
    if (transport == MACO_TRANSPORT_AUTO && asked != MACO_TRANSPORT_AUTO)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                           "maco_port_channel_create: to rank %d over %s: %s", peer,
                           maco__transport_word(asked),
                           "the peer cannot use it (its log says why)");
    if (transport == MACO_TRANSPORT_AUTO)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                           "maco_port_channel_create: no transport both rank %d and rank %d "
                           "can use (%s asked; this rank can use:%s%s%s%s; rank %d: "
                           "mask 0x%x, its log says why)",
                           comm->rank, peer, maco__transport_word(asked),
                           (can >> 1) & 1 ? " cuda" : "", (can >> 2) & 1 ? " host" : "",
                           (can >> 3) & 1 ? " ib" : "", (can >> 4) & 1 ? " tcp" : "", peer,
                           their_can);
    *transport_p = transport;
    return MACO_OK;
}

/* Where the channel's signals land: the peer's semaphore this rank's signals raise
 * (remote_inbound: host memory and CUDA copy) and the one here that the peer's signals raise
 * (inbound in host memory, inbound_dev as the GPU sees it). */
static maco_status_t maco__port_channel_sems(maco_proxy_t p, struct maco_port_channel *ch,
                                             const maco__port_hello_t *their, int gpu,
                                             uint32_t host_slot, uint32_t dev_slot)
{
    maco_comm_t comm = p->comm;
    int peer = ch->peer;
    maco_transport_t transport = ch->transport;
    if (transport == MACO_TRANSPORT_HOST_MEMORY) {
        if (p->peer_host_sems[peer] == NULL) {
            maco_status_t st = maco_mem_import(comm, their->sems, &p->peer_host_sems[peer]);
            if (st != MACO_OK)
                return st;
        }
        void *peer_sems = NULL;
        maco_mem_get_pointer(p->peer_host_sems[peer], &peer_sems);
        ch->remote_inbound = (uint64_t *)peer_sems + their->host_slot;
    } else if (transport == MACO_TRANSPORT_CUDA_COPY) {
        ch->remote_inbound =
            (uint64_t *)(comm->peer_buf[peer] + comm->layout.sem_offset) + their->dev_slot;
    }
    if (ch->sem_host) {
        ch->inbound = p->host_sems + host_slot;
        if (gpu &&
            cudaHostGetDevicePointer((void **)&ch->inbound_dev, ch->inbound, 0) != cudaSuccess) {
            cudaGetLastError();
            ch->inbound_dev = NULL; /* not mapped: device waits are unavailable on it */
        }
    } else if (gpu) {
        ch->inbound_dev = (uint64_t *)(comm->buf + comm->layout.sem_offset) + dev_slot;
    }
    return MACO_OK;
}

/* The channel's device handle (with a GPU): the FIFO, the ordering its pushes need, inline
 * puts where they are allowed, and its semaphore in the comm buffer's device pool. */
static void maco__port_channel_device_init(maco_proxy_t p, struct maco_port_channel *ch,
                                           uint32_t dev_slot)
{
    maco_comm_t comm = p->comm;
    int peer = ch->peer;
    maco_transport_t transport = ch->transport;
    maco_port_channel_device_t *d = &ch->device;
    d->fifo = p->device_fifo.view;
    d->channel = ch->id;
    /* CUDA copy: puts are read by this GPU's copy engines, signals written by them after
     * the data: a GPU-scope fence orders what they need (maco/device/port_channel.h).
     * Host memory, IB and TCP: the proxy's CPU or a NIC reads the source: a system-scope
     * release. */
    d->push_order =
        transport == MACO_TRANSPORT_CUDA_COPY ? MACO__PUSH_FENCE_GPU : MACO__PUSH_RELEASE_SYS;
    /* Puts of 4 or 8 bytes travel inline (fifo.h) on the CUDA copy transport and on TCP
     * from device memory, where both buffers start 8-byte aligned: the device checks the
     * offsets' alignment, and stream memory operations need naturally aligned addresses. */
    int inline_ok = (transport == MACO_TRANSPORT_CUDA_COPY ||
                     (transport == MACO_TRANSPORT_TCP && !ch->src_host)) &&
                    (((uintptr_t)ch->src | ch->dst_addr) & 7u) == 0;
    d->src = inline_ok ? ch->src : NULL;
    d->src_bytes = inline_ok ? ch->src_bytes : 0;
    d->semaphore.inbound = ch->inbound_dev;
    d->semaphore.remote_inbound = NULL;
    d->semaphore.expected = (uint64_t *)(comm->buf + comm->layout.expected_offset) + dev_slot;
    d->semaphore.bound = p->device_fifo.view.bound;
    d->semaphore.peer = peer;
    d->semaphore.id = (int32_t)dev_slot;
}

/* maco_port_channel_create's work, with the communicator's device current. */
static maco_status_t maco__port_channel_create_on_its_device(maco_proxy_t p, int peer,
                                                             maco_transport_t transport,
                                                             maco_mem_t src, maco_mem_t dst,
                                                             maco_port_channel_t *ch_p)
{
    if (p == NULL || src == NULL || dst == NULL || ch_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_create: NULL argument");
    maco_comm_t comm = p->comm;
    maco_status_t st = maco__port_check_args(comm, peer, transport, src, dst);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    maco_transport_t asked = transport;
    if (asked == MACO_TRANSPORT_AUTO) {
        st = maco__port_env_transport(&asked);
        if (st != MACO_OK)
            return maco__comm_record(comm, st);
    }
    /* What this rank could use. An explicit choice this rank cannot use fails here, before
     * any exchange (the peer, if it went on, then fails at its bootstrap deadline naming this
     * rank); one only the peer cannot use fails on both after the exchange. */
    uint32_t can = 0;
    char why[MACO__TRANSPORT_SLOTS][768];
    for (int t = MACO_TRANSPORT_CUDA_COPY; t < MACO__TRANSPORT_SLOTS; t++)
        if (maco__port_usable(p, peer, (maco_transport_t)t, src, dst, why[t], sizeof(why[t])))
            can |= 1u << t;
    if (asked != MACO_TRANSPORT_AUTO && !((can >> asked) & 1u))
        return maco__comm_record(comm, maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: to rank %d over "
                                                   "%s: %s",
                                                   peer, maco__transport_word(asked), why[asked]));
    if (p->nchannels >= MACO_TRIGGER_MAX_CHANNELS)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: the proxy has "
                                                   "%d channels, the most a trigger can name",
                                                   MACO_TRIGGER_MAX_CHANNELS));
    /* Semaphores: a slot of the proxy's host pool and one of the communicator's device pool
     * (with a GPU) are offered; the transport chosen decides which one the peer's signals
     * raise. The expected count of device waits is always in the device pool. */
    int gpu = comm->gpu_unavailable[0] == '\0';
    if (p->host_sem_next >= MACO__HOST_SEMS || (gpu && comm->sem_next >= MACO__NSEM))
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: the semaphore "
                                                   "pool is used up (%d host, %d device)",
                                                   MACO__HOST_SEMS, MACO__NSEM));
    uint32_t host_slot = p->host_sem_next, dev_slot = gpu ? (uint32_t)comm->sem_next : 0;
    maco__port_hello_t their;
    st = maco__port_hello_exchange(p, peer, asked, can, src, dst, host_slot, dev_slot, &their);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    st = maco__port_agree(comm, peer, asked, can, their.can, &transport);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    size_t dst_bytes = 0, src_bytes = 0;
    maco_mem_get_size(dst, &dst_bytes);
    maco_mem_get_size(src, &src_bytes);
    int network = transport == MACO_TRANSPORT_IB || transport == MACO_TRANSPORT_TCP;
    /* Network transports: the peer's channel writes what it named as its dst here; it must
     * be memory this rank registered. */
    maco__mem_region_t recv_region;
    memset(&recv_region, 0, sizeof(recv_region));
    uint64_t recv_addr = their.dst_addr, recv_bytes = their.dst_bytes;
    if (network) {
        st = maco__mem_lookup(recv_addr, recv_bytes, &recv_region);
        if (st != MACO_OK)
            return maco__comm_record(comm, st);
    }
    struct maco_port_channel *ch = (struct maco_port_channel *)calloc(1, sizeof(*ch));
    if (ch == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: no memory"));
    ch->proxy = p;
    ch->peer = peer;
    ch->transport = transport;
    ch->ops = maco__transport_ops(transport);
    ch->id = p->nchannels;
    ch->peer_channel = their.channel;
    ch->peer_proxy_uid = their.uid;
    void *ptr = NULL;
    maco_mem_get_pointer(src, &ptr);
    ch->src = (char *)ptr;
    ch->src_bytes = src_bytes;
    ch->src_host = maco__mem_is_host(src);
    ch->dst_bytes = dst_bytes;
    ch->dst_addr = maco__mem_owner_addr(dst);
    ch->dst_host = maco__mem_is_host(dst);
    if (network) {
        ch->recv = (char *)(uintptr_t)recv_addr;
        ch->recv_bytes = recv_bytes;
        ch->recv_host = recv_region.is_host;
        ch->sem_host = recv_region.is_host || !gpu;
    } else {
        ptr = NULL;
        maco_mem_get_pointer(dst, &ptr);
        ch->dst = (char *)ptr;
        ch->sem_host = transport == MACO_TRANSPORT_HOST_MEMORY;
    }
    st = maco__port_channel_sems(p, ch, &their, gpu, host_slot, dev_slot);
    if (st != MACO_OK)
        goto fail;
    st = maco__port_instance(p, transport);
    if (st == MACO_OK)
        st = ch->ops->connect(ch, maco__transport_state(ch));
    if (st != MACO_OK)
        goto fail;
    if (ch->sem_host)
        p->host_sem_next++;
    if (gpu)
        comm->sem_next++;
    if (gpu)
        maco__port_channel_device_init(p, ch, dev_slot);
    MACO_DEBUG(MACO_SUBSYS_PROXY,
               "port channel %u to rank %d over %s (peer's channel %u, semaphore in %s memory)",
               ch->id, peer, ch->ops->name, ch->peer_channel, ch->sem_host ? "host" : "device");
    __atomic_store_n(&p->channels[ch->id], ch, __ATOMIC_RELEASE);
    /* Read by the TCP receiver (a message for the channel being created waits for it). */
    __atomic_store_n(&p->nchannels, p->nchannels + 1, __ATOMIC_RELEASE);
    *ch_p = ch;
    return MACO_OK;
fail:
    free(ch);
    return maco__comm_record(comm, st);
}

maco_status_t maco_port_channel_create(maco_proxy_t p, int peer, maco_transport_t transport,
                                       maco_mem_t src, maco_mem_t dst, maco_port_channel_t *ch_p)
{
    if (p == NULL || src == NULL || dst == NULL || ch_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_create: NULL argument");
    /* A transport's first channel makes its streams and pinned buffers: on the
     * communicator's device whichever device the calling thread has current. */
    int saved = -1;
    maco_status_t st =
        maco__device_enter_status(p->comm->cuda_device, &saved, "maco_port_channel_create");
    if (st != MACO_OK)
        return maco__comm_record(p->comm, st);
    st = maco__port_channel_create_on_its_device(p, peer, transport, src, dst, ch_p);
    maco__device_leave(saved);
    return st;
}

maco_status_t maco_port_channel_get_transport(maco_port_channel_t ch, maco_transport_t *transport_p)
{
    if (ch == NULL || transport_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_get_transport: NULL argument");
    *transport_p = ch->transport;
    return MACO_OK;
}

maco_status_t maco_port_channel_get_device_handle(maco_port_channel_t ch,
                                                  maco_port_channel_device_t *handle_p)
{
    if (ch == NULL || handle_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_get_device_handle: NULL argument");
    if (!ch->proxy->has_device_fifo)
        return maco__comm_record(ch->proxy->comm,
                                 maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                                             "maco_port_channel_get_device_handle: %s",
                                             ch->proxy->comm->gpu_unavailable));
    if (ch->device.semaphore.inbound == NULL)
        return maco__comm_record(ch->proxy->comm,
                                 maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                                             "maco_port_channel_get_device_handle: channel %u's "
                                             "semaphore (host memory) is not mapped for the "
                                             "GPU, so device code could not wait on it",
                                             ch->id));
    *handle_p = ch->device;
    return MACO_OK;
}

/* maco_port_channel_destroy's work, with the communicator's device current. */
static maco_status_t maco__port_channel_destroy_on_its_device(maco_port_channel_t ch)
{
    if (ch == NULL)
        return MACO_OK;
    __atomic_store_n(&ch->proxy->channels[ch->id], NULL, __ATOMIC_RELEASE);
    ch->ops->disconnect(ch, maco__transport_state(ch));
    free(ch);
    return MACO_OK;
}

maco_status_t maco_port_channel_destroy(maco_port_channel_t ch)
{
    if (ch == NULL)
        return MACO_OK;
    int saved = -1;
    (void)maco__device_enter(ch->proxy->comm->cuda_device, &saved);
    maco_status_t st = maco__port_channel_destroy_on_its_device(ch);
    maco__device_leave(saved);
    return st;
}

/* ------------------------------------------------------------------ host-side calls */

static maco_status_t maco__port_host_push(maco_port_channel_t ch, uint32_t type,
                                          uint64_t dst_offset, uint64_t src_offset, uint64_t bytes,
                                          uint32_t last_extra, uint64_t *pos_p)
{
    if (type & MACO_TRIGGER_DATA) {
        if (src_offset > ch->src_bytes || bytes > ch->src_bytes - src_offset ||
            dst_offset > ch->dst_bytes || bytes > ch->dst_bytes - dst_offset)
            return maco__comm_record(
                ch->proxy->comm,
                maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                            "port channel %u to rank %d: a put of %llu bytes from offset %llu "
                            "(source %llu bytes) to offset %llu (destination %llu bytes) does "
                            "not fit",
                            ch->id, ch->peer, (unsigned long long)bytes,
                            (unsigned long long)src_offset, (unsigned long long)ch->src_bytes,
                            (unsigned long long)dst_offset, (unsigned long long)ch->dst_bytes));
    }
    if ((type & (MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL)) &&
        !ch->ops->alive(ch, maco__transport_state(ch)))
        /* Sticky: the failure was logged once where it was found (the async error); each later
         * push says so without another log line. */
        return maco__comm_record(
            ch->proxy->comm,
            maco__error_quiet(MACO_ERR_REMOTE,
                              "port channel %u: the %s connection to rank %d failed earlier "
                              "(see maco_comm_get_async_error); nothing was queued",
                              ch->id, ch->ops->name, ch->peer));
    const maco_fifo_device_t *f = &ch->proxy->host_fifo.view;
    maco_status_t st = MACO_OK;
    uint64_t total = bytes, queued = 0;
    do {
        uint64_t n = bytes > MACO_TRIGGER_MAX_SIZE ? (MACO_TRIGGER_MAX_SIZE & ~15ull) : bytes;
        uint32_t t = type | (n == bytes ? last_extra : 0u);
        st = maco__fifo_host_push(f, maco_trigger_make(t, ch->id, dst_offset, src_offset, n),
                                  ch->proxy->timeout_ms, pos_p);
        if (st == MACO_OK)
            queued += n;
        dst_offset += n;
        src_offset += n;
        bytes -= n;
    } while (bytes > 0 && st == MACO_OK);
    if (st != MACO_OK && queued > 0) {
        char why[512];
        snprintf(why, sizeof(why), "%s", maco__last_error());
        st = maco__error(st, MACO_SUBSYS_PROXY,
                         "port channel %u to rank %d: %llu of the put's %llu bytes were queued "
                         "before: %s",
                         ch->id, ch->peer, (unsigned long long)queued, (unsigned long long)total,
                         why);
    }
    return maco__comm_record(ch->proxy->comm, st);
}

maco_status_t maco_port_channel_put(maco_port_channel_t ch, uint64_t dst_offset,
                                    uint64_t src_offset, uint64_t bytes)
{
    uint64_t pos;
    if (ch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_put: ch is NULL");
    return maco__port_host_push(ch, MACO_TRIGGER_DATA, dst_offset, src_offset, bytes, 0, &pos);
}

maco_status_t maco_port_channel_signal(maco_port_channel_t ch)
{
    uint64_t pos;
    if (ch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_signal: ch is NULL");
    return maco__port_host_push(ch, MACO_TRIGGER_SIGNAL, 0, 0, 0, 0, &pos);
}

maco_status_t maco_port_channel_put_with_signal(maco_port_channel_t ch, uint64_t dst_offset,
                                                uint64_t src_offset, uint64_t bytes)
{
    uint64_t pos;
    if (ch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_put_with_signal: ch is NULL");
    return maco__port_host_push(ch, MACO_TRIGGER_DATA, dst_offset, src_offset, bytes,
                                MACO_TRIGGER_SIGNAL, &pos);
}

maco_status_t maco_port_channel_flush(maco_port_channel_t ch)
{
    uint64_t pos;
    if (ch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_flush: ch is NULL");
    maco_status_t st = maco__port_host_push(ch, MACO_TRIGGER_FLUSH, 0, 0, 0, 0, &pos);
    if (st != MACO_OK)
        return st;
    st = maco__fifo_host_wait_flush(&ch->proxy->host_fifo.view, pos, ch->proxy->timeout_ms);
    if (st == MACO_ERR_TIMEOUT) {
        /* The FIFO's wait knows no channel; the caller wants the peer named. */
        char why[512];
        snprintf(why, sizeof(why), "%s", maco__last_error());
        st = maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_PROXY,
                         "port channel %u to rank %d (%s transport): %s", ch->id, ch->peer,
                         ch->ops->name, why);
    }
    if (st == MACO_OK && !ch->ops->alive(ch, maco__transport_state(ch)))
        st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                         "port channel %u: the %s connection to rank %d failed (see "
                         "maco_comm_get_async_error); data put before the flush may not have "
                         "arrived",
                         ch->id, ch->ops->name, ch->peer);
    return maco__comm_record(ch->proxy->comm, st);
}

maco_status_t maco_port_channel_wait(maco_port_channel_t ch, int64_t timeout_ms)
{
    if (ch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_wait: ch is NULL");
    if (!ch->sem_host)
        return maco__comm_record(ch->proxy->comm,
                                 maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                                             "maco_port_channel_wait: channel %u (%s transport) "
                                             "raises a semaphore in device memory; wait on the "
                                             "device",
                                             ch->id, ch->ops->name));
    /* timeout_ms 0: one look. Negative: MACO_DEVICE_TIMEOUT, whose 0 means no bound. */
    int bounded = 1;
    if (timeout_ms < 0) {
        timeout_ms = ch->proxy->timeout_ms;
        bounded = timeout_ms > 0;
    }
    uint64_t want = ch->host_expected + 1;
    int64_t start = maco__now_ms();
    int64_t deadline = maco__deadline_ms(timeout_ms);
    int64_t next_check = start + 100;
    uint32_t spins = 0;
    uint64_t seen;
    /* Spin briefly (a signal usually comes within microseconds), then yield, then sleep
     * 50 us, then 200 us (a 1 ms step made TCP ping-pongs on 2 cores take 2 ms), so a long wait
     * does not hold a core. Every 100 ms the
     * peer's bootstrap link is looked at: a dead peer fails the wait within a fraction of a
     * second, also when the wait has no bound (MACO_DEVICE_TIMEOUT=0). */
    while ((seen = __atomic_load_n(ch->inbound, __ATOMIC_ACQUIRE)) < want) {
        int64_t now = maco__now_ms();
        if (bounded && now >= deadline)
            return maco__comm_record(
                ch->proxy->comm,
                maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_PROXY,
                            "port channel %u: no signal from rank %d within %lld ms (waited for "
                            "signal %llu, saw %llu)",
                            ch->id, ch->peer, (long long)timeout_ms, (unsigned long long)want,
                            (unsigned long long)seen));
        if (now >= next_check) {
            next_check = now + 100;
            maco_status_t alive = maco__bootstrap_peer_alive(ch->proxy->comm->bs, ch->peer);
            if (alive != MACO_OK && __atomic_load_n(ch->inbound, __ATOMIC_ACQUIRE) < want) {
                char why[512];
                snprintf(why, sizeof(why), "%s", maco__last_error());
                return maco__comm_record(
                    ch->proxy->comm,
                    maco__error(alive == MACO_ERR_REVOKED ? MACO_ERR_REVOKED : MACO_ERR_REMOTE,
                                MACO_SUBSYS_PROXY,
                                "port channel %u: waited %lld ms for signal %llu from rank %d, "
                                "which can no longer send it: %s",
                                ch->id, (long long)(now - start), (unsigned long long)want,
                                ch->peer, why));
            }
        }
        spins++;
        if (spins < 1000) {
            maco__cpu_pause();
        } else if (spins < 2000) {
            sched_yield();
        } else {
            long us = spins < 2100 ? 50 : 200;
            struct timespec ts = { 0, us * 1000 };
            nanosleep(&ts, NULL);
        }
    }
    ch->host_expected = want;
    return MACO_OK;
}
