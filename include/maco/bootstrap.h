/*
 * maco/bootstrap.h - the TCP bootstrap: how the ranks of a job find each other and exchange
 * setup data (memory handles, channel endpoints) before any GPU traffic.
 *
 * Every rank opens one TCP connection to every other rank (a full mesh, set up through
 * rank 0). All waits are bounded by the bootstrap's timeout (MACO_BOOTSTRAP_TIMEOUT,
 * default 120 s). When a peer dies or closes its connection without maco_bootstrap_destroy,
 * every call blocked on any rank returns MACO_ERR_REMOTE naming that rank as soon as the
 * operating system reports the closed connection, not at the deadline; from then on the
 * bootstrap stays failed and every call returns the same error.
 *
 * Thread-safety: a bootstrap is used by one thread at a time (calls on one bootstrap must
 * not overlap); different bootstraps are independent.
 *
 * Collective calls (allgather, barrier, broadcast) must be made by all ranks in the same
 * order. Tagged send/recv deliver messages in order per (peer, tag) and may interleave
 * with collectives.
 */
#ifndef MACO_BOOTSTRAP_H
#define MACO_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Size of a unique id in bytes: the same as ncclUniqueId, so it fits the same plumbing. */
#define MACO_UNIQUE_ID_BYTES 128

/**
 * Identifies one job: magic, version, a random 64-bit nonce and rank 0's address.
 * Wire layout (little-endian): u32 magic 'MACO', u16 version (1), u16 reserved,
 * u64 nonce, 24-byte address (family, port, address, scope), the rest zero.
 * Treat as opaque; copy it to every rank by any means (a file, MPI, torch.distributed).
 */
typedef struct maco_unique_id {
    uint8_t bytes[MACO_UNIQUE_ID_BYTES];
} maco_unique_id_t;

typedef struct maco_bootstrap *maco_bootstrap_t;

/** User tags must be below this value; tags from here up are MACO's own. */
#define MACO_BOOTSTRAP_MAX_USER_TAG 0xFFFF0000u

/**
 * Creates a unique id whose root address is a listening socket opened now in this
 * process: on the interface named by MACO_SOCKET_IFNAME, else the first non-loopback IPv4
 * interface, else 127.0.0.1. Rank 0 must call maco_bootstrap_create() in this same process
 * (it takes the socket over). Not blocking. Thread-safe.
 * Errors: MACO_ERR_INVALID_ARGUMENT (id_p NULL, bad MACO_SOCKET_IFNAME),
 *         MACO_ERR_SYSTEM (socket calls failed; the message has errno's text).
 */
MACO_API maco_status_t maco_unique_id_create(maco_unique_id_t *id_p);

/**
 * Joins the job named by `id` as `rank` of `nranks` (1 to MACO_MAX_RANKS). Blocks until all nranks
 * ranks have joined and the mesh is connected, or until `timeout_ms` passes (negative: use
 * MACO_BOOTSTRAP_TIMEOUT; the same timeout bounds every later call on this bootstrap).
 * Connections that do not present the id's magic and nonce (port scanners, a stale job
 * on the same port) are refused with a warning and do not disturb the job.
 * Errors: MACO_ERR_INVALID_ARGUMENT (id not a MACO id, rank outside [0, nranks),
 *         nranks < 1 or above MACO_MAX_RANKS, bs_p NULL, MACO_HOST_ID longer than 127 bytes);
 * MACO_ERR_TIMEOUT (rank 0 unreachable or some rank did not join in time; the message says which);
 * MACO_ERR_REMOTE (rank 0 rejected the job: duplicate rank, world-size mismatch; or a peer died
 * during setup); MACO_ERR_SYSTEM; MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_bootstrap_create(const maco_unique_id_t *id, int rank, int nranks,
                                             int timeout_ms, maco_bootstrap_t *bs_p);

/** The most ranks a job may have (2^20): the bootstrap keeps a connection to every other rank
 * (a descriptor each) and a table entry of about 300 bytes per rank. */
#define MACO_MAX_RANKS (1 << 20)

/**
 * Joins a job described by the environment: MACO_RANK, MACO_WORLD_SIZE,
 * MACO_BOOTSTRAP_ADDR (host:port where rank 0 listens) and MACO_BOOTSTRAP_NONCE (the same
 * random 1 to 16 hex digits on every rank; maco-run sets it); or torchrun's RANK, WORLD_SIZE,
 * MASTER_ADDR and MASTER_PORT. No nonce is ever derived from the address or a run id (another
 * process could compute it and take a rank): without MACO_BOOTSTRAP_NONCE, only the torchrun
 * agent-store start below works, and anything else is MACO_ERR_INVALID_ARGUMENT naming it. Rank 0
 * listens on that address itself, except under torchrun, whose agent holds MASTER_PORT for its
 * key-value store (TORCHELASTIC_USE_AGENT_STORE=True) and MACO_BOOTSTRAP_ADDR unset: there rank 0
 * creates a unique id (maco_unique_id_create) and stores it in torchrun's store under
 * "/maco/c_unique_id/<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>/<n>" (n counts this
 * process's creations from the environment, so every rank must make them in the same order),
 * and the other ranks read it from there (c10d's TCPStore protocol). Blocking and errors as
 * maco_bootstrap_create(); a missing or malformed variable is MACO_ERR_INVALID_ARGUMENT naming
 * it, and so is a rank not below the world size (naming both variables); under torchrun also
 * MACO_ERR_TIMEOUT naming the store and the key when rank 0 published no id within
 * MACO_BOOTSTRAP_TIMEOUT.
 */
MACO_API maco_status_t maco_bootstrap_create_from_env(maco_bootstrap_t *bs_p);

/**
 * Says goodbye to every peer (so they do not mistake this exit for a crash), closes the
 * connections and frees the bootstrap. Not collective; does not wait for peers.
 * NULL is accepted and ignored.
 */
MACO_API maco_status_t maco_bootstrap_destroy(maco_bootstrap_t bs);

/** This rank, and the number of ranks. MACO_ERR_INVALID_ARGUMENT on NULL. */
MACO_API maco_status_t maco_bootstrap_get_rank(maco_bootstrap_t bs, int *rank_p);
MACO_API maco_status_t maco_bootstrap_get_nranks(maco_bootstrap_t bs, int *nranks_p);

/**
 * Node identity of `rank`: the string MACO_HOST_ID gave that rank, or its host name and
 * boot id. Ranks with equal ids are on one node. The string is owned by the bootstrap.
 */
MACO_API maco_status_t maco_bootstrap_get_host_id(maco_bootstrap_t bs, int rank,
                                                  const char **host_id_p);

/**
 * Gathers `bytes_per_rank` bytes from every rank into `buffer` (nranks * bytes_per_rank
 * bytes; this rank's contribution must already be at offset rank * bytes_per_rank).
 * Collective, blocking. 0 bytes is valid (then it is a barrier).
 * Errors: MACO_ERR_INVALID_ARGUMENT, MACO_ERR_TIMEOUT, MACO_ERR_REMOTE (a peer died or sent
 * a different size; the message names it), MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_bootstrap_allgather(maco_bootstrap_t bs, void *buffer,
                                                size_t bytes_per_rank);

/** Returns once every rank has entered the barrier. Collective; errors as allgather. */
MACO_API maco_status_t maco_bootstrap_barrier(maco_bootstrap_t bs);

/**
 * Copies `bytes` bytes of `buffer` on `root` into `buffer` on every rank. Collective; all
 * ranks pass the same root and size. Errors as allgather, plus MACO_ERR_INVALID_ARGUMENT
 * for a root outside [0, nranks).
 */
MACO_API maco_status_t maco_bootstrap_broadcast(maco_bootstrap_t bs, int root, void *buffer,
                                                size_t bytes);

/**
 * Sends `bytes` bytes to `peer` under `tag` (< MACO_BOOTSTRAP_MAX_USER_TAG). Returns when
 * the data has been handed to the operating system (the buffer may then be reused); it
 * does not wait for the peer to receive. Messages to one peer with one tag arrive in order.
 * Errors: MACO_ERR_INVALID_ARGUMENT (peer out of range or this rank, tag reserved, NULL
 *         data with bytes > 0), MACO_ERR_TIMEOUT, MACO_ERR_REMOTE.
 */
MACO_API maco_status_t maco_bootstrap_send(maco_bootstrap_t bs, int peer, uint32_t tag,
                                           const void *data, size_t bytes);

/**
 * Receives the next message from `peer` with `tag` into `data`, which must be exactly the
 * size sent: a different size is MACO_ERR_INVALID_USAGE naming both sizes (the message is
 * consumed). Messages with other tags that arrive meanwhile are kept for later receives.
 * Blocking, bounded by the timeout. Errors as maco_bootstrap_send().
 */
MACO_API maco_status_t maco_bootstrap_recv(maco_bootstrap_t bs, int peer, uint32_t tag, void *data,
                                           size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* MACO_BOOTSTRAP_H */
