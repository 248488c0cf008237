/*
 * transport_host.c - the host-memory transport: processes of one node copy between buffers
 * of shared host memory (maco_mem_alloc_host), mapped into each process.
 *
 * put is a memcpy, done when it returns. signal is a release add of 1 on the peer's semaphore
 * (shared memory): the peer's acquire load of the new value sees the data copied before it.
 * Nothing is ever outstanding, so flushes complete at once.
 */
#include <string.h>

#include "proxy/proxy_internal.h"

static maco_status_t maco__host_put(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                                    uint64_t src_offset, uint64_t bytes)
{
    memcpy(ch->dst + dst_offset, ch->src + src_offset, bytes);
    return MACO_OK;
}

static maco_status_t maco__host_signal(struct maco_port_channel *ch, void *state)
{
    __atomic_fetch_add(ch->remote_inbound, 1, __ATOMIC_RELEASE);
    return MACO_OK;
}

const maco__transport_ops_t maco__transport_host_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "host memory",
    .put = maco__host_put,
    .signal = maco__host_signal,
};
