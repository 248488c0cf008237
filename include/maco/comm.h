/*
 * maco/comm.h - the communicator: a set of ranks, one CUDA device per rank, and the
 * resources (scratch buffer, semaphores, channels) MACO's collectives use.
 *
 * Thread-safety: a communicator is used by one thread at a time, except for the
 * maco_comm_get_* queries and maco_comm_get_async_error(), which any thread may call.
 * Collectives on one communicator must be issued in the same order on every rank and must
 * not run concurrently with each other (issue them on one stream, or order the streams).
 */
#ifndef MACO_COMM_H
#define MACO_COMM_H

#include "maco/bootstrap.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco_comm *maco_comm_t;

/**
 * Number of CUDA devices this process can use (CUDA_VISIBLE_DEVICES applies). When it is 0,
 * `why` (if not NULL) gets a sentence saying what is true, then what to do about it: no NVIDIA
 * driver (libcuda.so.1 not found), a driver older than the CUDA runtime MACO was built with
 * (both versions), or no device visible (with CUDA_VISIBLE_DEVICES when set); "" when devices
 * exist. `why_bytes` should be at least 512 (a shorter text is cut). Does not create a CUDA
 * context. Thread-safe.
 */
MACO_API int maco_cuda_device_count(char *why, size_t why_bytes);

/**
 * Creates a communicator over an existing bootstrap. Collective over all ranks of `bs`.
 * `cuda_device` is the CUDA device of this rank, or -1 to use local_rank modulo the number
 * of visible devices; the call makes it the calling thread's current device. On a machine
 * with no usable CUDA device the communicator is still created (bootstrap-only); GPU
 * operations on it return MACO_ERR_UNSUPPORTED. `bs` is borrowed: it must outlive the
 * communicator, and the caller destroys it after maco_comm_destroy().
 * Blocking; bounded by the bootstrap's timeout.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, cuda_device out of range), MACO_ERR_CUDA
 * (allocation, IPC export/import), MACO_ERR_TIMEOUT / MACO_ERR_REMOTE (from the
 * bootstrap), MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_comm_create(maco_bootstrap_t bs, int cuda_device, maco_comm_t *comm_p);

/**
 * Creates a bootstrap from the environment (maco_bootstrap_create_from_env) and a
 * communicator over it (device -1), which owns and destroys the bootstrap.
 * Errors: as maco_bootstrap_create_from_env() and maco_comm_create().
 */
MACO_API maco_status_t maco_comm_init_from_env(maco_comm_t *comm_p);

/**
 * Frees the communicator's resources: waits for its device work to finish (bounded by
 * MACO_DEVICE_TIMEOUT through the kernels' own waits), unmaps peers' memory, frees
 * device memory. Works on the communicator's device whichever device the calling thread has
 * current, and leaves the caller's current device as it was. Not collective. NULL is
 * accepted and ignored.
 */
MACO_API maco_status_t maco_comm_destroy(maco_comm_t comm);

/**
 * Stops this rank's device work on the communicator that is blocked in a wait, without waiting
 * out MACO_DEVICE_TIMEOUT: it sets, from the host, the error word that every bounded device
 * wait of the communicator already reads whenever it reads its clock (every 1024 spins:
 * semaphores, LL packets, FIFO space, flushes, grid barriers, the persistent kernel's waits;
 * maco/device/error.h), so each such wait returns MACO_ERR_REMOTE at its next check and its
 * kernel ends. Waits never slow down for it: the word is read only where the clock is. The
 * write is a 4-byte copy on a stream of its own (the copy engine, not an SM, so a GPU full of
 * waiting CTAs does not delay it); the call blocks until it has landed, not until the kernels
 * end (maco_comm_destroy, or a synchronisation of their streams, waits for that, now briefly).
 * Device work that does not wait (a copy, a reduction) runs to its end.
 * Local: peers are not told; their waits for this rank end at their own timeout or abort.
 * Afterwards maco_comm_get_async_error reports MACO_ERR_REMOTE (unless an earlier error was
 * recorded) and the last error says the communicator was aborted; results of work in flight
 * are undefined, and so are those of later work (a wait satisfied at once never looks at the
 * word): the communicator is left to be destroyed. On a communicator without a GPU only the
 * error is recorded. Idempotent. Thread-safe: another thread may be blocked in a call on the
 * communicator (not in maco_comm_destroy).
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL); MACO_ERR_CUDA (the stream or the copy failed).
 */
MACO_API maco_status_t maco_comm_abort(maco_comm_t comm);

/**
 * Revokes the communicator, on this rank and on its peers: every call on it that waits (a host
 * wait of the bootstrap, a port channel's flush or wait, a device wait of a kernel on it: the
 * same error word maco_comm_abort sets) ends with MACO_ERR_REVOKED, a host wait within one wake
 * of its poll (a few milliseconds; at most 1 s where the system has no eventfd) and a device
 * wait at its next clock check; every later call that needs the peers (collectives, channel
 * creation, memory exchange, bootstrap calls) returns MACO_ERR_REVOKED at once, and
 * maco_comm_get_async_error reports it, with maco_comm_get_last_error naming the rank that
 * revoked. The peers are told with a frame on each open bootstrap link (written within 1 s);
 * a peer's communicator takes it in at its next call that reads the bootstrap, or within 10 ms
 * of a maco_comm_get_async_error call (a watchdog thread's), and then ends its own device
 * waits. What stays possible: maco_comm_shrink (the way on after a failure), maco_comm_destroy
 * and the queries. Results of work in flight are undefined. Idempotent (a second call, or a
 * call after a peer's revoke, returns MACO_OK and sends nothing). Thread-safe: meant to be
 * called from a watchdog thread while another thread is blocked in a call on the communicator;
 * blocks only until that call has returned (it returns promptly) and the frames are written.
 * Not while another thread runs maco_comm_shrink or maco_comm_destroy on it.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL).
 */
MACO_API maco_status_t maco_comm_revoke(maco_comm_t comm);

/**
 * Splits the communicator, as ncclCommSplit: the ranks that pass the same `color` (>= 0) form a
 * new communicator, ordered by `key` and then by their rank here; a negative color (e.g.
 * MACO_SPLIT_NOCOLOR) joins none and gets *newcomm_p = NULL. The new communicator has its own
 * bootstrap (made through this one) and the same CUDA device as this rank here, and is
 * independent of this one (destroy each). Collective over every rank of `comm`, which must be
 * alive and not revoked (use maco_comm_shrink after a failure). Blocking, bounded by the
 * bootstrap's timeout. Errors: MACO_ERR_INVALID_ARGUMENT (NULL), MACO_ERR_REVOKED, those of
 * maco_bootstrap_create and maco_comm_create (MACO_ERR_REMOTE / MACO_ERR_TIMEOUT when a rank
 * fails meanwhile: the message names it).
 */
MACO_API maco_status_t maco_comm_split(maco_comm_t comm, int color, int key,
                                       maco_comm_t *newcomm_p);

/** maco_comm_split's color for a rank that joins no new communicator. */
#define MACO_SPLIT_NOCOLOR (-1)

/** maco_comm_shrink's flags: revoke `comm` first, ending its work in flight (ncclCommShrink's
 * NCCL_SHRINK_ABORT). Without it the shrink leaves `comm` as it is (usable, if it was). */
#define MACO_SHRINK_ABORT 1u

/**
 * Makes a communicator of the ranks of `comm` that are alive and not excluded, also when ranks
 * died at any point before or during the call: the way a job goes on after losing a rank.
 * Ranks keep their order; the new ranks are 0 .. m-1. `exclude[0 .. n_exclude)` are ranks this
 * caller wants out. Ranks that died need not be listed by anyone: every caller finds them
 * (their bootstrap links ended) and the survivors agree on one membership, the union of what
 * all callers excluded and found dead, so every survivor gets the same ranks in the same order,
 * also when each saw a different failure; a rank that is slow but alive is waited for, never
 * excluded. A rank that is alive but must leave has to be in every caller's `exclude` (as with
 * ncclCommShrink); it then need not call (if it calls, it gets *newcomm_p = NULL). If ranks die
 * while the call runs, the survivors start over without them (the protocol, with its failure
 * model: src/host/bootstrap/agree.c); the call returns only once every member has built the
 * new communicator, so either all survivors get it or (at the deadline) all fail.
 * The new communicator owns a new bootstrap and its own GPU resources (comm buffer, scratch,
 * channels of the collectives), built anew among the members, on the same CUDA device as this
 * rank's here: nothing of `comm` is reused, and nothing of the dead ranks is touched.
 * Registrations, proxies and port channels of `comm` stay with `comm`: make them again on the
 * new communicator. `comm` itself stays as it is (revoked with MACO_SHRINK_ABORT, failed if a
 * peer died); destroy it when done.
 * Collective over the live, non-excluded ranks of `comm`. Blocking, bounded by
 * MACO_BOOTSTRAP_TIMEOUT from the call (a death costs about one more message round, not a
 * timeout). Not thread-safe with other calls on `comm` (maco_comm_revoke included).
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL comm or newcomm_p, n_exclude outside [0, world size],
 * an exclude entry outside [0, world size), flags other than MACO_SHRINK_ABORT);
 * MACO_ERR_TIMEOUT (the deadline passed: the message names the ranks still awaited, e.g. a live
 * rank that neither calls nor is excluded by every caller); an error of maco_comm_create when a
 * member failed to build its part three times in a row (the message names it); MACO_ERR_NO_MEMORY;
 * MACO_ERR_SYSTEM.
 */
MACO_API maco_status_t maco_comm_shrink(maco_comm_t comm, const int *exclude, int n_exclude,
                                        unsigned flags, maco_comm_t *newcomm_p);

/**
 * Makes the id that new ranks join with (maco_comm_join) when `comm` grows
 * (maco_comm_grow): call on rank 0 of `comm`, which becomes rank 0 of the grown communicator,
 * then hand the id to the new processes (a file, a launcher's store, a socket); the existing
 * ranks get it from rank 0 inside maco_comm_grow. An id serves one grow; it holds a listening
 * socket of this process until then. A unique id (maco/bootstrap.h) with a grow mark and the
 * old world size in its reserved bytes. Not blocking.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL), MACO_ERR_INVALID_USAGE (not rank 0), those of
 * maco_unique_id_create.
 */
MACO_API maco_status_t maco_comm_get_grow_id(maco_comm_t comm, maco_unique_id_t *id_p);

/**
 * Grows `comm` to `nranks` ranks (ncclCommGrow): the existing ranks keep their numbers, the new
 * ones (maco_comm_join, ranks comm's size .. nranks-1) take the rest: to replace ranks lost by a
 * shrink, or to scale up. Every existing rank calls it; rank 0 passes the id it made with
 * maco_comm_get_grow_id, the others NULL (rank 0 sends it to them through `comm`). The grown
 * communicator is a new one, with its own bootstrap and GPU resources, on this rank's CUDA
 * device; `comm` stays usable and is destroyed separately. Collective over the existing and the
 * joining ranks. Blocking, bounded by MACO_BOOTSTRAP_TIMEOUT (a new rank that never joins is
 * waited for until then).
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL comm or newcomm_p; nranks not above the current size;
 * an id on a rank other than 0 or none on rank 0; an id that is not a grow id or was made for
 * another size; ranks that passed different nranks), those of maco_bootstrap_create and
 * maco_comm_create (MACO_ERR_REMOTE, MACO_ERR_TIMEOUT naming the rank).
 */
MACO_API maco_status_t maco_comm_grow(maco_comm_t comm, int nranks, const maco_unique_id_t *id,
                                      maco_comm_t *newcomm_p);

/**
 * The new ranks' side of maco_comm_grow: joins the grown communicator of `nranks` ranks as
 * `rank` (from the old size to nranks-1), with the grow id rank 0 made; `cuda_device` as in
 * maco_comm_create (-1: local rank modulo the visible devices). Blocking, bounded by
 * MACO_BOOTSTRAP_TIMEOUT. Errors: MACO_ERR_INVALID_ARGUMENT (NULL; not a grow id; rank outside
 * [old size, nranks); cuda_device below -1), those of maco_bootstrap_create and maco_comm_create.
 */
MACO_API maco_status_t maco_comm_join(const maco_unique_id_t *id, int rank, int nranks,
                                      int cuda_device, maco_comm_t *newcomm_p);

/** Queries; each returns MACO_ERR_INVALID_ARGUMENT when an argument is NULL. */
MACO_API maco_status_t maco_comm_get_rank(maco_comm_t comm, int *rank_p);
MACO_API maco_status_t maco_comm_get_nranks(maco_comm_t comm, int *nranks_p);
/** Rank among the ranks of this node, numbered in rank order (0 .. local_nranks-1). */
MACO_API maco_status_t maco_comm_get_local_rank(maco_comm_t comm, int *local_rank_p);
/** Number of ranks on this node. */
MACO_API maco_status_t maco_comm_get_local_nranks(maco_comm_t comm, int *local_nranks_p);
/** Index of this node (nodes numbered by their lowest rank) and the number of nodes. */
MACO_API maco_status_t maco_comm_get_node(maco_comm_t comm, int *node_p);
MACO_API maco_status_t maco_comm_get_nnodes(maco_comm_t comm, int *nnodes_p);
/** This rank's CUDA device, or -1 when the communicator has none. */
MACO_API maco_status_t maco_comm_get_cuda_device(maco_comm_t comm, int *device_p);
/**
 * Number of ranks of this communicator whose CUDA device is this rank's GPU (same UUID),
 * this rank included: 1 when the GPU is this rank's alone, 0 when the communicator has no
 * usable GPU. Ranks share a GPU as clients of one MPS server (maco-run starts one when a node
 * has fewer GPUs than ranks) or, slowly, by time slices with MACO_SHARED_GPU=1 (README,
 * "Several ranks on one GPU").
 */
MACO_API maco_status_t maco_comm_get_gpu_ranks(maco_comm_t comm, int *gpu_ranks_p);
/**
 * The most CTAs a kernel on this communicator may launch when any of its CTAs waits for
 * another rank (semaphore, LL packet, port-channel flush) or for other CTAs of its own grid
 * (grid barrier): every CTA waited for must be resident at the same time, on every rank that
 * shares the GPU, or the wait can only time out. The value is, over all ranks,
 * min(floor(SM count of the rank's CUDA context / ranks on its GPU)), at least 1: one CTA per
 * SM always fits, so launching at most this many (any block size the kernel can launch with)
 * is safe. Under MPS the SM count is what the client context reports (lower with
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); with one GPU per rank it is the smallest SM count of any
 * rank. MACO's collectives follow it. 0 when the communicator has no usable GPU.
 */
MACO_API maco_status_t maco_comm_get_coresident_ctas(maco_comm_t comm, int *ctas_p);
/** The bootstrap the communicator uses (borrowed). */
MACO_API maco_status_t maco_comm_get_bootstrap(maco_comm_t comm, maco_bootstrap_t *bs_p);

/**
 * The full message of the first error this communicator saw (which call, which peer,
 * why), or "" when none. A failure of the communicator's work (a timeout, a dead peer, a CUDA
 * or internal error) replaces an earlier rejected call (MACO_ERR_INVALID_ARGUMENT or
 * MACO_ERR_UNSUPPORTED, which leave the communicator usable), so the message says what broke
 * it. The string is owned by the communicator and stays valid until it is destroyed. NULL
 * comm gives "".
 */
MACO_API const char *maco_comm_get_last_error(maco_comm_t comm);

/**
 * Reports whether work of this communicator failed asynchronously, on the device or on a
 * proxy thread. *async_status_p is MACO_OK or the first failure's status, and then
 * maco_comm_get_last_error() says what failed, naming the peer rank where there is one:
 * - MACO_ERR_TIMEOUT: a bounded device wait timed out (the semaphore, packet slot, FIFO or
 *   flush position, expected and observed values), a proxy's staged write found an
 *   earlier copy unfinished past the bound, or maco_proxy_stop's drain ran past it (device
 *   waits that end because their proxy stopped return MACO_ERR_REMOTE to the kernel only);
 * - MACO_ERR_INVALID_ARGUMENT: a proxy skipped a device put whose offsets and size leave
 *   the channel's buffers, or an inline put to a misaligned destination (its signal is
 *   still sent, so the peer does not hang); or a receive (maco_recv, a block of
 *   maco_alltoall/maco_alltoallv) met a send of another count (the message names both ranks
 *   and both counts; nothing of that message was written);
 * - MACO_ERR_INVALID_USAGE: a proxy got a trigger for a channel that does not exist or that
 *   its transport cannot carry (a corrupt trigger), or a collective kernel met a peer's
 *   registration this rank has not mapped (deregistered while in use);
 * - MACO_ERR_CUDA: a proxy's copy, stream write or event failed; or the CUDA context of the
 *   communicator's device has a sticky error (a kernel faulted, e.g. on a dead peer's memory
 *   mapped by CUDA IPC: the message names the ranks whose bootstrap connection has ended).
 * The status stays set for the communicator's lifetime. Does not block and does not
 * synchronise with the device (it asks the context with cudaStreamQuery on an idle stream of
 * the communicator's own, made at the first call). Thread-safe.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL).
 */
MACO_API maco_status_t maco_comm_get_async_error(maco_comm_t comm, maco_status_t *async_status_p);

#ifdef __cplusplus
}
#endif

#endif /* MACO_COMM_H */
