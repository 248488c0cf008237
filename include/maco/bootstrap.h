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
 * The job as the environment describes it (maco_launch_info_from_env). Counts and indices are
 * -1 where the launcher does not say.
 */
typedef struct maco_launch_info {
    /** Whose variables describe the job: "maco" (MACO_RANK, MACO_WORLD_SIZE: maco-run or set
     * by hand), "torchrun" (RANK, WORLD_SIZE), "ompi" (Open MPI's mpirun), "mpich" (MPICH's
     * Hydra), "pmix" (a PMIx launcher: prterun...) or "slurm" (srun). */
    char launcher[16];
    /** How the unique id reaches the ranks: "address" (MACO_BOOTSTRAP_ADDR or MASTER_ADDR and
     * MASTER_PORT, with MACO_BOOTSTRAP_NONCE), "torchrun-store" (torchrun's agent store),
     * "pmix" (the launcher's PMIx server) or "slurm-nodelist" (the step's first node and
     * MACO_BOOTSTRAP_PORT, with MACO_BOOTSTRAP_NONCE). */
    char id_source[16];
    int rank, world_size;
    int local_rank, local_size; /**< among the job's ranks on this node, as the launcher says */
    int node, num_nodes;        /**< this rank's node index and the node count, as it says */
} maco_launch_info_t;

/**
 * Says who started this process and how the job's unique id would travel, as
 * maco_bootstrap_create_from_env() reads it (docs/multi-node.md gives the order in which
 * launchers are recognised), without contacting any other rank. Not blocking (under a bare
 * PMIx launcher or the "pmix" id source it asks the local PMIx server, loading libpmix).
 * Thread-safe. *info_p is written only on success.
 * Errors: as maco_bootstrap_create_from_env() before it connects (MACO_ERR_INVALID_ARGUMENT
 * naming the variables; MACO_ERR_UNSUPPORTED when libpmix is needed and cannot be loaded).
 */
MACO_API maco_status_t maco_launch_info_from_env(maco_launch_info_t *info_p);

/**
 * The unique id, rank and world size of the job the environment describes: what
 * maco_bootstrap_create_from_env() passes to maco_bootstrap_create(). Collective over the
 * job's ranks when the id travels through a store (rank 0 creates it with
 * maco_unique_id_create and publishes it; the others wait for it), so every rank must call it
 * (or maco_bootstrap_create_from_env) the same number of times in the same order; rank 0 must
 * then call maco_bootstrap_create in this process. Blocking, bounded by
 * MACO_BOOTSTRAP_TIMEOUT. Logs one INFO line naming the launcher, the rank, the node and the
 * id's way ("launcher slurm: rank 5 of 16, node 1 of 4, local rank 1 of 4 ...").
 * Outputs are written only on success.
 * Errors: MACO_ERR_INVALID_ARGUMENT (a NULL output; no launcher's variables; a malformed or
 * missing variable, contradictory variables, or a launcher without a store and no
 * MACO_BOOTSTRAP_NONCE: each message names the variables and what to add);
 * MACO_ERR_UNSUPPORTED (PMIx is offered but libpmix cannot be loaded or initialised);
 * MACO_ERR_TIMEOUT (the store is unreachable, or rank 0 published no id in time: the message
 * names the store and the key); MACO_ERR_REMOTE (the store answered outside its protocol).
 */
MACO_API maco_status_t maco_unique_id_from_env(maco_unique_id_t *id_p, int *rank_p, int *nranks_p);

/**
 * Joins the job described by the environment: maco_unique_id_from_env(), then
 * maco_bootstrap_create() with the bootstrap timeout. The launchers recognised, first found
 * first (MACO_LAUNCHER names one to use alone; docs/multi-node.md):
 *   - MACO's own variables MACO_RANK, MACO_WORLD_SIZE (maco-run);
 *   - torchrun's RANK, WORLD_SIZE (also set by Kubernetes' PyTorchJob);
 *   - Open MPI's OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE;
 *   - MPICH's PMI_RANK, PMI_SIZE;
 *   - PMIx's PMIX_RANK (the size from the PMIx server);
 *   - Slurm's SLURM_PROCID, SLURM_STEP_NUM_TASKS inside a step started by srun.
 * Variables set by hand (MACO's, or RANK without torchrun) that disagree with the launcher
 * found after them are an error naming both. The unique id travels, first possible first:
 *   1. MACO_BOOTSTRAP_ADDR (host:port where rank 0 listens) with MACO_BOOTSTRAP_NONCE (the
 *      same random 1 to 16 hex digits on every rank; maco-run sets both);
 *   2. torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR, MASTER_PORT):
 *      rank 0 creates an id and stores it under
 *      "/maco/c_unique_id/<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>/<n>" (c10d's
 *      TCPStore protocol), the others read it;
 *   3. the launcher's PMIx server (mpirun, srun --mpi=pmix; libpmix loaded at run time,
 *      MACO_PMIX_LIBRARY): rank 0 creates an id, puts it under "maco.unique_id.<n>" and every
 *      rank passes a fence, the others get it;
 *   4. MASTER_ADDR:MASTER_PORT with MACO_BOOTSTRAP_NONCE (torch's variables without torchrun);
 *   5. under srun without PMIx, the first node of the step and MACO_BOOTSTRAP_PORT (default
 *      20000 + (job id * 16 + step id) mod 10000) with MACO_BOOTSTRAP_NONCE (exported by the
 *      batch script).
 * (<n> counts this process's creations from the environment, so every rank must make them in
 * the same order.) No nonce is ever derived from the address or a run id (another process
 * could compute it and take a rank): a launcher without a store and no MACO_BOOTSTRAP_NONCE
 * is MACO_ERR_INVALID_ARGUMENT saying what to add. Rank 0 listens on the given address
 * itself (1, 4, 5), or on the one maco_unique_id_create picks (2, 3: MACO_SOCKET_IFNAME).
 * Blocking; errors as maco_unique_id_from_env() and maco_bootstrap_create().
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
