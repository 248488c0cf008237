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
#include <time.h>

#include "bootstrap_internal.h"
#include "config.h"
#include "cuda_util.h"
#include "log.h"
#include "proxy_internal.h"
#include "socket.h"
#include "wire.h"

/* ------------------------------------------------------------------ channels */

/* What two ranks tell each other when they create a channel (fixed layout). */
enum { MACO__PORT_HELLO_BYTES = 16 + MACO_MEM_HANDLE_BYTES };

maco_status_t maco_port_channel_create(maco_proxy_t p, int peer, maco_transport_t transport,
                                       maco_mem_t src, maco_mem_t dst, maco_port_channel_t *ch_p)
{
    if (p == NULL || src == NULL || dst == NULL || ch_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_create: NULL argument");
    maco_comm_t comm = p->comm;
    int src_owner, dst_owner;
    maco_mem_get_owner(src, &src_owner);
    maco_mem_get_owner(dst, &dst_owner);
    if (peer < 0 || peer >= comm->nranks || peer == comm->rank || src_owner != comm->rank ||
        dst_owner != peer)
        return maco__comm_record(comm,
                                 maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                                             "maco_port_channel_create: peer %d (of %d "
                                             "ranks), src owned by rank %d (must be %d), "
                                             "dst owned by rank %d (must be the peer)",
                                             peer, comm->nranks, src_owner, comm->rank, dst_owner));
    if (transport != MACO_TRANSPORT_CUDA_COPY && transport != MACO_TRANSPORT_HOST_MEMORY)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: transport %d is "
                                                   "not a maco_transport_t",
                                                   (int)transport));
    if (transport == MACO_TRANSPORT_CUDA_COPY && !p->has_device_fifo)
        return maco__comm_record(comm, maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: the CUDA copy "
                                                   "transport needs GPUs: %s",
                                                   comm->gpu_unavailable));
    int host_src = maco__mem_is_host(src), host_dst = maco__mem_is_host(dst);
    if ((transport == MACO_TRANSPORT_HOST_MEMORY) != (host_src && host_dst) &&
        (transport == MACO_TRANSPORT_HOST_MEMORY || host_src || host_dst))
        return maco__comm_record(
            comm,
            maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                        "maco_port_channel_create: the %s transport needs %s buffers on "
                        "both sides (src is %s, dst is %s)",
                        transport == MACO_TRANSPORT_HOST_MEMORY ? "host-memory" : "CUDA copy",
                        transport == MACO_TRANSPORT_HOST_MEMORY ? "maco_mem_alloc_host" : "device",
                        host_src ? "host memory" : "device memory",
                        host_dst ? "host memory" : "device memory"));
    if (p->nchannels >= MACO_TRIGGER_MAX_CHANNELS)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: the proxy has "
                                                   "%d channels, the most a trigger can name",
                                                   MACO_TRIGGER_MAX_CHANNELS));
    /* Semaphores: this rank's inbound for the peer's signals. Host memory: the proxy's shared
     * pool; CUDA copy: the communicator's device pool. The expected count of device waits is
     * always in the device pool (when there is a GPU). */
    int gpu = comm->gpu_unavailable[0] == '\0';
    if ((transport == MACO_TRANSPORT_HOST_MEMORY && p->host_sem_next >= MACO__HOST_SEMS) ||
        (gpu && comm->sem_next >= MACO__NSEM))
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: the semaphore "
                                                   "pool is used up (%d host, %d device)",
                                                   MACO__HOST_SEMS, MACO__NSEM));
    uint32_t host_slot = p->host_sem_next, dev_slot = gpu ? (uint32_t)comm->sem_next : 0;
    uint8_t mine[MACO__PORT_HELLO_BYTES], theirs[MACO__PORT_HELLO_BYTES];
    memset(mine, 0, sizeof(mine));
    maco__put_u32(mine, (uint32_t)transport);
    maco__put_u32(mine + 4, host_slot);
    maco__put_u32(mine + 8, dev_slot);
    maco_status_t st = MACO_OK;
    if (transport == MACO_TRANSPORT_HOST_MEMORY)
        st = maco_mem_serialize(p->host_sems_mem, mine + 16);
    if (st == MACO_OK)
        st = maco__bootstrap_send(comm->bs, peer, MACO__TAG_PORT, mine, sizeof(mine));
    if (st == MACO_OK)
        st = maco__bootstrap_recv(comm->bs, peer, MACO__TAG_PORT, theirs, sizeof(theirs));
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    if (maco__get_u32(theirs) != (uint32_t)transport)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                                                   "rank %d created its channel to rank %d "
                                                   "with transport %u, this rank with %d",
                                                   peer, comm->rank, maco__get_u32(theirs),
                                                   (int)transport));
    struct maco_port_channel *ch = (struct maco_port_channel *)calloc(1, sizeof(*ch));
    if (ch == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY,
                                                   "maco_port_channel_create: no memory"));
    if (transport == MACO_TRANSPORT_HOST_MEMORY) {
        if (p->peer_host_sems[peer] == NULL) {
            st = maco_mem_import(comm, theirs + 16, &p->peer_host_sems[peer]);
            if (st != MACO_OK) {
                free(ch);
                return maco__comm_record(comm, st);
            }
        }
        void *peer_sems;
        maco_mem_get_pointer(p->peer_host_sems[peer], &peer_sems);
        ch->remote_inbound = (uint64_t *)peer_sems + maco__get_u32(theirs + 4);
        ch->inbound = p->host_sems + host_slot;
        ch->ops = &maco__transport_host_ops;
        p->host_sem_next++;
    } else {
        ch->remote_inbound = (uint64_t *)(comm->peer_buf[peer] + comm->layout.sem_offset) +
                             maco__get_u32(theirs + 8);
        ch->ops = &maco__transport_cuda_ops;
    }
    if (gpu)
        comm->sem_next++;
    ch->proxy = p;
    ch->peer = peer;
    ch->transport = transport;
    void *ptr;
    size_t bytes;
    maco_mem_get_pointer(src, &ptr);
    maco_mem_get_size(src, &bytes);
    ch->src = (char *)ptr;
    ch->src_bytes = bytes;
    maco_mem_get_pointer(dst, &ptr);
    maco_mem_get_size(dst, &bytes);
    ch->dst = (char *)ptr;
    ch->dst_bytes = bytes;
    ch->id = p->nchannels;
    if (gpu) {
        maco_port_channel_device_t *d = &ch->device;
        d->fifo = p->device_fifo.view;
        d->channel = ch->id;
        /* CUDA copy: puts are read by this GPU's copy engines, signals written by them after
         * the data: a GPU-scope fence orders what they need (maco/device/port_channel.h).
         * Host memory: the proxy's CPU reads the source, a system-scope release. */
        d->push_order =
            transport == MACO_TRANSPORT_CUDA_COPY ? MACO__PUSH_FENCE_GPU : MACO__PUSH_RELEASE_SYS;
        /* Puts of 4 or 8 bytes travel inline on the CUDA copy transport (fifo.h), where both
         * buffers start 8-byte aligned: the device checks the offsets' alignment, and the
         * stream memory operations need naturally aligned addresses. */
        int inline_ok = transport == MACO_TRANSPORT_CUDA_COPY &&
                        (((uintptr_t)ch->src | (uintptr_t)ch->dst) & 7u) == 0;
        d->src = inline_ok ? ch->src : NULL;
        d->src_bytes = inline_ok ? ch->src_bytes : 0;
        uint64_t *dev_inbound = transport == MACO_TRANSPORT_CUDA_COPY
                                    ? (uint64_t *)(comm->buf + comm->layout.sem_offset) + dev_slot
                                    : NULL;
        if (transport == MACO_TRANSPORT_HOST_MEMORY &&
            cudaHostGetDevicePointer((void **)&dev_inbound, ch->inbound, 0) != cudaSuccess) {
            cudaGetLastError();
            dev_inbound = NULL; /* not mapped: device waits are unavailable on this channel */
        }
        d->semaphore.inbound = dev_inbound;
        d->semaphore.remote_inbound = NULL;
        d->semaphore.expected = (uint64_t *)(comm->buf + comm->layout.expected_offset) + dev_slot;
        d->semaphore.bound = p->device_fifo.view.bound;
        d->semaphore.peer = peer;
        d->semaphore.id = (int32_t)dev_slot;
    }
    __atomic_store_n(&p->channels[ch->id], ch, __ATOMIC_RELEASE);
    p->nchannels++;
    *ch_p = ch;
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

maco_status_t maco_port_channel_destroy(maco_port_channel_t ch)
{
    if (ch == NULL)
        return MACO_OK;
    __atomic_store_n(&ch->proxy->channels[ch->id], NULL, __ATOMIC_RELEASE);
    free(ch);
    return MACO_OK;
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
    return maco__comm_record(
        ch->proxy->comm,
        maco__fifo_host_wait_flush(&ch->proxy->host_fifo.view, pos, ch->proxy->timeout_ms));
}

maco_status_t maco_port_channel_wait(maco_port_channel_t ch, int64_t timeout_ms)
{
    if (ch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_port_channel_wait: ch is NULL");
    if (ch->transport != MACO_TRANSPORT_HOST_MEMORY)
        return maco__comm_record(ch->proxy->comm,
                                 maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                                             "maco_port_channel_wait: channel %u uses the CUDA "
                                             "copy transport; its signals land in device "
                                             "memory, wait on the device",
                                             ch->id));
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
     * with a growing pause up to 1 ms, so a long wait does not hold a core. Every 100 ms the
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
            if (maco__bootstrap_peer_alive(ch->proxy->comm->bs, ch->peer) != MACO_OK &&
                __atomic_load_n(ch->inbound, __ATOMIC_ACQUIRE) < want) {
                char why[512];
                snprintf(why, sizeof(why), "%s", maco__last_error());
                return maco__comm_record(
                    ch->proxy->comm,
                    maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
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
            long us = spins < 2100 ? 50 : spins < 2200 ? 200 : 1000;
            struct timespec ts = { 0, us * 1000 };
            nanosleep(&ts, NULL);
        }
    }
    ch->host_expected = want;
    return MACO_OK;
}
