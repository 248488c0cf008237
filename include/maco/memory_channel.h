/*
 * maco/memory_channel.h - host side of memory channels (device side:
 * maco/device/memory_channel.h).
 */
#ifndef MACO_MEMORY_CHANNEL_H
#define MACO_MEMORY_CHANNEL_H

#include "maco/comm.h"
#include "maco/device/memory_channel.h"
#include "maco/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco_memory_channel *maco_memory_channel_t;

/**
 * Creates a channel from this rank to `peer` over `local` (registered here) and `remote`
 * (the peer's buffer, imported here). Pairwise collective: `peer` must create its channel
 * to this rank in the same order relative to other channel creations between the two, as
 * the call exchanges semaphore ids with it over the bootstrap (blocking, bounded by the
 * bootstrap timeout). Each channel takes one semaphore from the communicator's pool.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, peer out of range or this rank, `remote` not
 * owned by `peer`, `local` not owned by this rank), MACO_ERR_UNSUPPORTED (no GPU; `peer` on
 * another node: use a port channel over IB or TCP), MACO_ERR_NO_MEMORY (semaphore pool
 * exhausted: the message gives its size), MACO_ERR_INVALID_USAGE (the two ranks' channel
 * creations do not match one to one: the message gives both counts), MACO_ERR_TIMEOUT /
 * MACO_ERR_REMOTE (bootstrap).
 */
MACO_API maco_status_t maco_memory_channel_create(maco_comm_t comm, int peer, maco_mem_t local,
                                                  maco_mem_t remote, maco_memory_channel_t *ch_p);

/** Copies the channel's device handle (plain data) into *handle_p. */
MACO_API maco_status_t maco_memory_channel_get_device_handle(
    maco_memory_channel_t ch, maco_memory_channel_device_t *handle_p);

/** Frees the channel (its semaphore is not reused). NULL is accepted and ignored. */
MACO_API maco_status_t maco_memory_channel_destroy(maco_memory_channel_t ch);

#ifdef __cplusplus
}
#endif

#endif /* MACO_MEMORY_CHANNEL_H */
