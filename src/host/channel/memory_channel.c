/* memory_channel.c - creating memory channels: semaphores from the pool, ids exchanged. */
#include "maco/memory_channel.h"

#include <stdlib.h>
#include <string.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/comm/comm_internal.h"
#include "src/host/base/log.h"

struct maco_memory_channel {
    maco_comm_t comm;
    maco_memory_channel_device_t handle;
};

maco_status_t maco__memory_channels_setup(maco_comm_t comm, int peer, maco_mem_t local,
                                          maco_mem_t remote, int count,
                                          maco_memory_channel_device_t *handles)
{
    if (comm->sem_next + count > MACO__NSEM)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_CHANNEL,
                           "rank %d: the semaphore pool is exhausted (%d of %d in use, %d more "
                           "asked for)",
                           comm->rank, comm->sem_next, MACO__NSEM, count);
    uint8_t mine[8], theirs[8];
    uint32_t base = (uint32_t)comm->sem_next;
    for (int i = 0; i < 4; i++) {
        mine[i] = (uint8_t)(base >> (8 * i));
        mine[4 + i] = (uint8_t)((uint32_t)count >> (8 * i));
    }
    maco_status_t st = maco__bootstrap_send(comm->bs, peer, MACO__TAG_CHANNEL, mine, sizeof(mine));
    if (st == MACO_OK)
        st = maco__bootstrap_recv(comm->bs, peer, MACO__TAG_CHANNEL, theirs, sizeof(theirs));
    if (st != MACO_OK)
        return st;
    uint32_t peer_base = 0, peer_count = 0;
    for (int i = 0; i < 4; i++) {
        peer_base |= (uint32_t)theirs[i] << (8 * i);
        peer_count |= (uint32_t)theirs[4 + i] << (8 * i);
    }
    if (peer_count != (uint32_t)count || peer_base + peer_count > MACO__NSEM)
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_CHANNEL,
                           "rank %d created %u channel(s) to rank %d at semaphore %u while "
                           "this rank created %d: channel creations between two ranks must "
                           "match one to one",
                           peer, peer_count, comm->rank, peer_base, count);
    comm->sem_next += count;
    void *local_ptr, *remote_ptr;
    size_t local_bytes, remote_bytes;
    maco_mem_get_pointer(local, &local_ptr);
    maco_mem_get_pointer(remote, &remote_ptr);
    maco_mem_get_size(local, &local_bytes);
    maco_mem_get_size(remote, &remote_bytes);
    const maco__comm_layout_t *l = &comm->layout;
    for (int i = 0; i < count; i++) {
        maco_memory_channel_device_t *h = &handles[i];
        memset(h, 0, sizeof(*h));
        h->semaphore.inbound = (uint64_t *)(comm->buf + l->sem_offset) + base + (uint32_t)i;
        h->semaphore.remote_inbound =
            (uint64_t *)(comm->peer_buf[peer] + l->sem_offset) + peer_base + (uint32_t)i;
        h->semaphore.expected = (uint64_t *)(comm->buf + l->expected_offset) + base + (uint32_t)i;
        h->semaphore.bound = comm->bound;
        h->semaphore.peer = peer;
        h->semaphore.id = (int32_t)(base + (uint32_t)i);
        h->local = (char *)local_ptr;
        h->remote = (char *)remote_ptr;
        h->local_bytes = local_bytes;
        h->remote_bytes = remote_bytes;
    }
    return MACO_OK;
}

maco_status_t maco_memory_channel_create(maco_comm_t comm, int peer, maco_mem_t local,
                                         maco_mem_t remote, maco_memory_channel_t *ch_p)
{
    if (comm == NULL || local == NULL || remote == NULL || ch_p == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_CHANNEL,
                                                   "maco_memory_channel_create: NULL argument"));
    maco_status_t st = maco__comm_require_gpu(comm, "maco_memory_channel_create");
    if (st != MACO_OK)
        return st;
    int local_owner, remote_owner;
    maco_mem_get_owner(local, &local_owner);
    maco_mem_get_owner(remote, &remote_owner);
    if (peer < 0 || peer >= comm->nranks || peer == comm->rank)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_CHANNEL,
                                                   "maco_memory_channel_create: peer %d is not "
                                                   "another rank of [0, %d)",
                                                   peer, comm->nranks));
    if (local_owner != comm->rank || remote_owner != peer)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_CHANNEL,
                                                   "maco_memory_channel_create: local belongs "
                                                   "to rank %d (expected %d) and remote to "
                                                   "rank %d (expected peer %d)",
                                                   local_owner, comm->rank, remote_owner, peer));
    if (maco__mem_is_remote(remote))
        return maco__comm_record(comm, maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_CHANNEL,
                                                   "maco_memory_channel_create: rank %d is on "
                                                   "another node; memory channels reach only "
                                                   "this node's GPUs (use a port channel over "
                                                   "IB or TCP)",
                                                   peer));
    maco_memory_channel_t ch = (maco_memory_channel_t)calloc(1, sizeof(*ch));
    if (ch == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_CHANNEL,
                                                   "maco_memory_channel_create: no memory"));
    st = maco__memory_channels_setup(comm, peer, local, remote, 1, &ch->handle);
    if (st != MACO_OK) {
        free(ch);
        return maco__comm_record(comm, st);
    }
    ch->comm = comm;
    *ch_p = ch;
    return MACO_OK;
}

maco_status_t maco_memory_channel_get_device_handle(maco_memory_channel_t ch,
                                                    maco_memory_channel_device_t *handle_p)
{
    if (ch == NULL || handle_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_CHANNEL,
                           "maco_memory_channel_get_device_handle: NULL argument");
    *handle_p = ch->handle;
    return MACO_OK;
}

maco_status_t maco_memory_channel_destroy(maco_memory_channel_t ch)
{
    free(ch);
    return MACO_OK;
}
