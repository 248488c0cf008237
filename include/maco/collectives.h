/*
 * maco/collectives.h - collective operations, stream-ordered and asynchronous like NCCL's.
 *
 * A call validates its arguments, picks an algorithm and enqueues kernels on `stream`; it
 * returns before the data has moved. The buffers must stay valid until the stream reaches
 * the operation. Every rank must make the same collective calls in the same order with the
 * same count, type, op and root (sends and receives pair up instead: maco_send below).
 *
 * Buffers: device memory of the communicator's GPU, any alignment, registered or not;
 * registering is never required. Unregistered buffers go through the communicator's
 * registered scratch (MACO_SCRATCH_SIZE). Registered buffers (maco_mem_register on this
 * communicator, or memory from maco_mem_alloc, which registers itself) are used in place
 * by the mesh-family algorithms (the ones above the LL sizes): peers read and write them
 * directly over NVLink, with no scratch copies. That happens for a call when on every rank
 * every buffer a peer touches is registered and 16-byte aligned and every peer has mapped
 * it; otherwise the call goes through scratch, with the same results. A rank maps its
 * peers' registrations only in maco_collective_map_registrations() (a collective call never
 * imports memory: it does no socket I/O): register on every rank, wait until every rank has
 * (e.g. maco_bootstrap_barrier on maco_comm_get_bootstrap()), then map on every rank;
 * until then calls on those buffers go through scratch (a CUDA graph captured before the
 * map keeps that path when replayed: the counts are part of the captured launch). Mappings
 * stay until the communicator is destroyed, and a buffer must stay registered until the
 * operations using it have completed on every rank.
 * maco_collective_get_stats() counts which path calls took. Counts are in elements;
 * count 0 returns MACO_OK and does nothing.
 *
 * Results are bitwise identical on every rank and from run to run: each element is reduced
 * in rank order 0, 1, ..., n-1; float16, bfloat16, fp8 and float32 accumulate in float32
 * and round once at the end (round to nearest even; fp8 without saturation), float64 in
 * float64; integers wrap around in their own width (sum, prod); avg is the sum divided once
 * by the number of ranks (integers truncate toward zero), as NCCL's post-divide.
 *
 * Threads and streams: calls on one communicator must not run concurrently (one host
 * thread at a time), and the operations must execute in call order: use one stream per
 * communicator, or order the streams with events. Two collectives of one communicator
 * running at the same time on two streams share its scratch and would corrupt each other.
 * Different communicators are independent. Every call is safe to capture in a CUDA graph
 * and the graph can be replayed any number of times (the kernels keep their flags and
 * semaphore counts on the device).
 *
 * Devices: every call works on the communicator's device whichever device the calling
 * thread has current, and leaves the current device as it found it, so one thread may drive
 * the communicators of several GPUs (put their calls in one maco_group_start/end: each
 * communicator's kernels wait for its peers' kernels). `stream` is a stream of the
 * communicator's device, or 0 (that device's legacy default stream), cudaStreamLegacy or
 * cudaStreamPerThread (taken on the communicator's device); a stream created on another
 * device is refused.
 *
 * Errors common to every call (nothing is enqueued, nothing written):
 *   MACO_ERR_INVALID_ARGUMENT  comm NULL; datatype or op out of range; root not in
 *                              [0, nranks); a buffer NULL with count > 0; count * element
 *                              size (times nranks where a buffer holds every rank's block)
 *                              overflows size_t; send and receive buffers that overlap other
 *                              than exactly in place (below); a forced algorithm too small
 *                              for the size; a stream of another device than the
 *                              communicator's (cudaStreamGetDevice; both devices named).
 *                              The message names the argument and the limit.
 *   MACO_ERR_UNSUPPORTED       no GPU on this rank; ranks on several nodes whose
 *                              collectives could not be set up (the message says why:
 *                              MACO_SCRATCH_SIZE too small, no transport); an unknown
 *                              MACO_ALGO_<COLLECTIVE> value.
 *   MACO_ERR_INVALID_USAGE     an earlier asynchronous error on this communicator.
 *   MACO_ERR_CUDA              the launch failed, or making the communicator's device
 *                              current did (cudaSetDevice).
 * A kernel that waits longer than MACO_DEVICE_TIMEOUT for a peer stops and reports
 * through maco_comm_get_async_error() (naming the peer); nothing hangs. When a proxy sees a
 * peer's connection fail (across nodes), every device wait of the communicator ends at once
 * with that error.
 */
#ifndef MACO_COLLECTIVES_H
#define MACO_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

#include "maco/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t without including the CUDA headers (the same type). */
typedef struct CUstream_st *maco_stream_t;

typedef enum maco_datatype {
    MACO_INT8 = 0,
    MACO_UINT8 = 1,
    MACO_INT32 = 2,
    MACO_UINT32 = 3,
    MACO_INT64 = 4,
    MACO_UINT64 = 5,
    MACO_FLOAT16 = 6,
    MACO_BFLOAT16 = 7,
    MACO_FLOAT32 = 8,
    MACO_FLOAT64 = 9,
    MACO_FP8_E4M3 = 10,
    MACO_FP8_E5M2 = 11,
    MACO_DATATYPE_COUNT
} maco_datatype_t;

typedef enum maco_redop {
    MACO_SUM = 0,
    MACO_PROD = 1,
    MACO_MIN = 2,
    MACO_MAX = 3,
    MACO_AVG = 4,
    MACO_REDOP_COUNT
} maco_redop_t;

/** Size of one element in bytes (0 for an unknown type). */
MACO_API size_t maco_datatype_size(maco_datatype_t datatype);
/** "bfloat16", "float32", ...; "unknown" for other values. */
MACO_API const char *maco_datatype_name(maco_datatype_t datatype);
/** "sum", "prod", "min", "max", "avg"; "unknown" for other values. */
MACO_API const char *maco_redop_name(maco_redop_t op);

/** The collectives, for maco_collective_get_algorithm() and _set_algorithm().
 * MACO_COLL_ALLTOALL covers maco_alltoall and maco_alltoallv, MACO_COLL_SENDRECV maco_send
 * and maco_recv (their count: elements per message). */
typedef enum maco_collective {
    MACO_COLL_ALLREDUCE = 0,
    MACO_COLL_ALLGATHER = 1,
    MACO_COLL_REDUCE_SCATTER = 2,
    MACO_COLL_BROADCAST = 3,
    MACO_COLL_REDUCE = 4,
    MACO_COLL_ALLTOALL = 5,
    MACO_COLL_SENDRECV = 6,
    MACO_COLLECTIVE_COUNT
} maco_collective_t;

/** "allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall",
 * "sendrecv"; else "unknown". */
MACO_API const char *maco_collective_name(maco_collective_t coll);

/**
 * recvbuf[i] = op over ranks r of sendbuf_r[i], for i in [0, count), on every rank.
 * In place: sendbuf == recvbuf.
 * Algorithms (MACO_ALGO_ALLREDUCE forces one):
 *   oneshot_ll  up to 128 KiB (and MACO_ALLREDUCE_ONESHOT_MAX): every rank writes its
 *               whole input as LL16 packets into every peer's scratch and reduces all of
 *               them itself;
 *   twoshot_ll  up to nranks * MACO_ALLREDUCE_ONESHOT_MAX bytes: rank q's block goes to
 *               rank q as LL16 packets, q reduces it and sends it back to every rank as
 *               packets, all in one launch (where it beats oneshot_ll and rsag was
 *               measured: docs/performance.md, "Tuning");
 *   rsag        larger: pieces are pushed to their owner rank, reduced there in rank order
 *               (reduce-scatter), and the reduced pieces pushed to every rank (allgather),
 *               pipelined through scratch with one semaphore per peer and CTA; with
 *               registered buffers (above) up to MACO_ALLREDUCE_INPLACE_MAX bytes, owner
 *               j reads piece j of every rank's sendbuf, reduces it and writes it into
 *               every rank's recvbuf, in one pass.
 */
MACO_API maco_status_t maco_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                      maco_datatype_t datatype, maco_redop_t op, maco_comm_t comm,
                                      maco_stream_t stream);

/**
 * recvbuf[r * sendcount + i] = sendbuf_r[i] for every rank r and i in [0, sendcount), on
 * every rank. recvbuf holds nranks * sendcount elements. In place: sendbuf == recvbuf +
 * rank * sendcount elements (as in NCCL).
 * Algorithms (MACO_ALGO_ALLGATHER): ll (LL16 packets, up to MACO_ALLREDUCE_ONESHOT_MAX
 * bytes per rank), mesh (pipelined through scratch, every rank pushes to every peer).
 */
MACO_API maco_status_t maco_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                      maco_datatype_t datatype, maco_comm_t comm,
                                      maco_stream_t stream);

/**
 * recvbuf[i] = op over ranks r of sendbuf_r[rank * recvcount + i], for i in
 * [0, recvcount). sendbuf holds nranks * recvcount elements. In place: recvbuf == sendbuf +
 * rank * recvcount elements.
 * Algorithms (MACO_ALGO_REDUCE_SCATTER): ll, mesh (as allgather).
 */
MACO_API maco_status_t maco_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                           maco_datatype_t datatype, maco_redop_t op,
                                           maco_comm_t comm, maco_stream_t stream);

/**
 * recvbuf[i] = sendbuf_root[i] on every rank, i in [0, count). sendbuf is read on the root
 * only (other ranks may pass NULL). In place: sendbuf == recvbuf on the root.
 * Algorithms (MACO_ALGO_BROADCAST): ll, mesh.
 */
MACO_API maco_status_t maco_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                                      maco_datatype_t datatype, int root, maco_comm_t comm,
                                      maco_stream_t stream);

/**
 * recvbuf[i] = op over ranks r of sendbuf_r[i] on the root only; recvbuf is not touched on
 * the other ranks (they may pass NULL). In place: sendbuf == recvbuf.
 * Algorithms (MACO_ALGO_REDUCE): ll, mesh.
 */
MACO_API maco_status_t maco_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                   maco_datatype_t datatype, maco_redop_t op, int root,
                                   maco_comm_t comm, maco_stream_t stream);

/* ------------------------------------------------------------------ all-to-all, send/recv */

/*
 * All-to-all, send and receive, and groups. Stream-ordered and asynchronous like the
 * collectives above, with the same buffer rules (device memory of the communicator's GPU, any
 * alignment, registered or not; every message goes through the receiver's scratch) and the
 * same common errors (comm NULL, datatype out of range, a buffer NULL with a count > 0, sizes
 * that overflow; MACO_ERR_UNSUPPORTED without a GPU; MACO_ERR_INVALID_USAGE
 * after an asynchronous error; MACO_ERR_CUDA when the launch fails). Nothing is enqueued and
 * nothing written when a call returns an error. Counts and displacements are in elements;
 * one message is at most 2^48 - 1 bytes.
 *
 * How messages move (docs/design.md, "Send/recv and all-to-all"): every message goes from
 * the sender to a scratch area of the receiver reserved for that pair of ranks, in chunks
 * dealt to MACO_P2P_LANES lanes (32 by default, one CTA each); messages up to MACO_P2P_LL_MAX
 * bytes (256 KiB by default) travel as LL packets, larger ones are copied in chunks spread
 * over every lane (at most MACO_P2P_CHUNK_SIZE each) with credits, so a sender never
 * overwrites a chunk its receiver has not consumed (MACO_ALGO_ALLTOALL and
 * MACO_ALGO_SENDRECV force "ll" or "copy"). All of one group's sends and receives on a
 * communicator, all-to-alls included, are one kernel launch. Every launch is safe to capture
 * in a CUDA graph and to replay (the sequence counters live on the device).
 *
 * Count checks by the receiver: every message carries its sender's byte count, and a
 * receive whose count differs (a maco_recv, or an all-to-all(v) block) writes nothing of
 * that message and reports MACO_ERR_INVALID_ARGUMENT through maco_comm_get_async_error(),
 * naming both ranks and both counts; the sender is not held up. Other messages of the same
 * launch still complete, and the communicator is failed (destroy it).
 */

/**
 * All-to-all: block q of rank r's sendbuf (elements [q count, (q + 1) count)) goes to rank q
 * and lands in block r of q's recvbuf. sendbuf and recvbuf hold nranks * count elements each
 * and must not overlap (there is no in-place form). Every rank must call it, in the same
 * order relative to the other calls on the communicator, with the same count (a receiver that
 * gets a different count reports it, see above). count 0 returns MACO_OK and does nothing.
 * Inside a group it joins the group's sends and receives (one launch).
 * Across nodes, outside a group, it may run hierarchical ("hier", docs/design.md,
 * "Collectives across nodes"): each rank hands its blocks for another node to the local rank
 * of the destination's local index, which sends one message per node over its rail; forced
 * with MACO_ALGO_ALLTOALL=hier, else chosen by size (blocks of 512 KiB and more with 2 or more
 * ranks per node, provisionally). Its own kernel launch, also safe to capture in a graph.
 * Errors: the common ones; MACO_ERR_INVALID_ARGUMENT for overlapping buffers, and for
 * MACO_ALGO_ALLTOALL=hier on one node (the message names the variable).
 */
MACO_API maco_status_t maco_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                                     maco_datatype_t datatype, maco_comm_t comm,
                                     maco_stream_t stream);

/**
 * All-to-all with per-rank counts and displacements (arrays of nranks elements each, read
 * during the call only): sendcounts[q] elements from sendbuf + sdispls[q] go to rank q, and
 * recvcounts[q] elements from rank q land at recvbuf + rdispls[q]. recvcounts[q] on rank r
 * must equal sendcounts[r] on rank q (a receiver that gets another count reports it, see
 * above; blocks of 0 elements are exchanged too, so every pair's counts are checked). No
 * receive block may overlap another receive block; send blocks may overlap each other and
 * receive blocks (in place: the send blocks a receive block overlaps are copied aside on the
 * stream before the exchange, so they are sent as they were; see maco_recv). Every rank must
 * call it, in the same order relative to the other calls.
 * Errors: the common ones; MACO_ERR_INVALID_ARGUMENT for a NULL array, a displacement plus
 * count that overflows, sendcounts[rank] != recvcounts[rank], or overlapping receive blocks
 * (these last found when the call is issued: at maco_group_end inside a group);
 * MACO_ERR_CUDA when the copy of in-place blocks cannot be allocated (cudaMallocAsync).
 */
MACO_API maco_status_t maco_alltoallv(const void *sendbuf, const size_t *sendcounts,
                                      const size_t *sdispls, void *recvbuf,
                                      const size_t *recvcounts, const size_t *rdispls,
                                      maco_datatype_t datatype, maco_comm_t comm,
                                      maco_stream_t stream);

/**
 * Sends `count` elements of buf to rank `peer`. Sends and receives match in call order per
 * (sender, receiver) pair, as NCCL's: the k-th maco_send from r to q is received by q's
 * k-th maco_recv from r, and its count must equal that receive's (checked by the receiver,
 * see above). count 0 does nothing, matches nothing and returns MACO_OK.
 * Outside a group the call is a group of its own, so it completes only when its receiver has
 * posted the matching receive: a rank that sends to and receives from peers must put those
 * calls in one group (maco_group_start). A send to this rank needs the matching maco_recv
 * from this rank in the same group (it becomes a local copy). Across nodes, the first message
 * between two ranks connects them when its group is issued, before anything is launched:
 * 8 x (16 + the send/recv chunk size, MACO_P2P_CHUNK_SIZE) bytes of pinned host memory per
 * pair, a bootstrap exchange and two port channels (socket I/O, each wait bounded by
 * MACO_BOOTSTRAP_TIMEOUT); later messages reuse the connection. Inside a node nothing is
 * connected at a call (the pairs' slots are made at communicator creation).
 * Errors: the common ones; MACO_ERR_INVALID_ARGUMENT for peer outside [0, nranks), a send to
 * this rank without its receive in the same group (found when the group is issued).
 */
MACO_API maco_status_t maco_send(const void *buf, size_t count, maco_datatype_t datatype, int peer,
                                 maco_comm_t comm, maco_stream_t stream);

/**
 * Receives `count` elements from rank `peer` into buf (see maco_send for matching and
 * counts). buf must not overlap another receive buffer of the same group (which write lands
 * last would be undefined). It may overlap send buffers of the group: in place, as
 * nccl-tests' in-place sendrecv (send X to rank r + 1, receive into X from rank r - 1).
 * Every send whose buffer overlaps a receive buffer of the group is then copied aside first,
 * on the group's stream (a temporary from cudaMallocAsync, freed with cudaFreeAsync after the
 * launch: stream-ordered, so CUDA graphs capture it), and sent from the copy: the send
 * carries the buffer as it was before the group, the receive leaves the new contents. That
 * costs one device-to-device copy of each such send and its size in device memory until the
 * group's kernel is done.
 * Errors: the common ones; MACO_ERR_INVALID_ARGUMENT for peer outside [0, nranks), a receive
 * from this rank without its send in the same group, buf overlapping another receive buffer
 * of the group (the last two found when the group is issued); MACO_ERR_CUDA when the copy of
 * in-place sends cannot be made (cudaMallocAsync or cudaMemcpyAsync failed).
 */
MACO_API maco_status_t maco_recv(void *buf, size_t count, maco_datatype_t datatype, int peer,
                                 maco_comm_t comm, maco_stream_t stream);

/**
 * Groups, as NCCL's ncclGroupStart/End. Between maco_group_start() and the matching
 * maco_group_end(), the calling thread's collectives, all-to-alls, sends and receives are
 * checked and queued, not issued (their pointer and count arguments are copied; the buffers
 * must stay valid until the operations complete). The outermost maco_group_end() issues them
 * all: per communicator, in the order each communicator first appeared, first its
 * collectives in call order, then one kernel launch moving all its sends and receives. So a
 * rank can post sends and receives to many peers at once without deadlock. Groups nest (the
 * inner ends issue nothing) and are per thread: another thread's calls are not part of this
 * thread's group. Every rank must name the communicators of a group in the same order. All
 * calls of a group on one communicator must use the same stream.
 *
 * A call inside a group returns its own argument errors at once; maco_group_end then returns
 * the first of them, logs which call it was (its number in the group and its name) and
 * issues nothing of the group. maco_group_end checks everything before issuing anything: an
 * error it finds (the communicator's GPU or nodes, an earlier asynchronous error, a local
 * send without its receive, receive buffers that overlap, more than 128 sends and receives
 * on one communicator) is returned, naming the call, and nothing is issued. Only a failed
 * launch can leave part of a group issued (MACO_ERR_CUDA).
 * maco_group_start: MACO_OK, or MACO_ERR_INVALID_USAGE when nested more than 2^20 deep.
 * maco_group_end: MACO_ERR_INVALID_USAGE without an open group; else as above.
 */
MACO_API maco_status_t maco_group_start(void);
MACO_API maco_status_t maco_group_end(void);

/**
 * The name of the algorithm `coll` would use for `count` elements of `datatype` (count as
 * that collective takes it) on this communicator; "copy" for a single rank; "plan" when
 * MACO_ALGO_<COLLECTIVE>=plan:FILE made it run an execution plan (maco/plan.h). For
 * MACO_COLL_ALLTOALL and MACO_COLL_SENDRECV, `count` is a message's elements and the name is
 * how its sender moves it: "ll" or "copy", or "hier" for maco_alltoall across nodes
 * outside a group (maco_alltoallv and all-to-alls inside groups always move their blocks
 * directly). The string is static. Errors: MACO_ERR_INVALID_ARGUMENT (NULL argument, type or
 * collective out of range), MACO_ERR_UNSUPPORTED and the forced-algorithm errors as the collective
 * itself.
 */
MACO_API maco_status_t maco_collective_get_algorithm(maco_comm_t comm, maco_collective_t coll,
                                                     size_t count, maco_datatype_t datatype,
                                                     const char **name_p);

/**
 * Forces `coll` to run the algorithm `name` on this communicator (the names
 * MACO_ALGO_<COLLECTIVE> accepts, any case), or restores the choice by size with NULL or "".
 * MACO_ALGO_<COLLECTIVE> and MACO_ALLREDUCE_INPLACE_MAX are read once, when the communicator
 * is created; this call overrides the former. Not collective, but a collective call runs the
 * same algorithm on every rank only if every rank forced the same one before it. Not
 * thread-safe with collective calls on the same communicator.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL comm, collective out of range),
 * MACO_ERR_UNSUPPORTED (no usable GPU, or `name` is not an algorithm of `coll`: the message
 * lists them).
 */
MACO_API maco_status_t maco_collective_set_algorithm(maco_comm_t comm, maco_collective_t coll,
                                                     const char *name);

/**
 * Caps the CTAs (thread blocks) of this communicator's collective and send/recv kernels at
 * `max_ctas`, leaving the other SMs of the GPU to work that runs beside them (the seeds'
 * "comm_sms": compute on the rest overlaps communication). 0 removes the cap. The cap never
 * raises a kernel above its default bound: maco_comm_get_coresident_ctas(), halved when any
 * GPU of the job runs several ranks (README, "Co-residency"); a kernel launches
 * min(its own choice by size, max_ctas, that bound) CTAs. One-shot and two-shot LL
 * kernels already stop at 64 CTAs, the mesh kernels at the scratch's slots. Not capped: the
 * direct send/recv and all-to-all between nodes (one CTA per remote pair; the
 * hierarchical all-to-all is capped) and execution plans
 * (their CTA count is part of the plan).
 *
 * Collective and blocking: every rank calls it with the same value before its next
 * collective on `comm` (the kernels' CTAs pair up across ranks, so a mismatch would hang);
 * the call exchanges the values over the bootstrap network and fails on every rank when one
 * differs. Not thread-safe with other calls on `comm`; stream-ordered calls already issued
 * keep the CTA count they were launched with.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL comm, max_ctas < 0, or ranks passed different
 * values: the message names the first rank whose value differs from rank 0's),
 * MACO_ERR_UNSUPPORTED (no usable GPU), the bootstrap's errors (a peer gone or timed out).
 */
MACO_API maco_status_t maco_collective_set_max_ctas(maco_comm_t comm, int max_ctas);

/** The cap set by maco_collective_set_max_ctas (0: none), in CTAs. Local and non-blocking;
 * not thread-safe with maco_collective_set_max_ctas on the same communicator. Errors:
 * MACO_ERR_INVALID_ARGUMENT (NULL argument), MACO_ERR_UNSUPPORTED (no usable GPU). */
MACO_API maco_status_t maco_collective_get_max_ctas(maco_comm_t comm, int *max_ctas_p);

/** CTAs (thread blocks) of the last collective, all-to-all or send/recv kernel launched on
 * `comm` (0: none yet): maco_collective_stats_t.last_launch_ctas without waiting for the
 * device, since it is counted on the host at launch. A call that launches no kernel (one
 * rank, a zero count) leaves it as it was. For profilers that read it after each call (the
 * Python maco.profiler). Local and non-blocking; not thread-safe with calls that launch on
 * the same communicator. Errors: MACO_ERR_INVALID_ARGUMENT (NULL argument),
 * MACO_ERR_UNSUPPORTED (no usable GPU). */
MACO_API maco_status_t maco_collective_get_last_ctas(maco_comm_t comm, int *ctas_p);

/**
 * Maps every registration that this rank's local peers (the ranks of its node) have
 * published on `comm` so far and this rank has not mapped yet: memory from maco_mem_alloc
 * and maco_mem_register, imported as maco_mem_import does (peer access for cudaMalloc
 * memory; for cuMem memory, a file descriptor fetched from the peer's fd server over a Unix
 * socket, each wait bounded by MACO_BOOTSTRAP_TIMEOUT). This is the one place where
 * collectives' registrations are imported: collective calls only read what it mapped. After
 * it, a mesh-family call whose buffers are registered on every rank runs in place once every
 * rank has mapped (the kernel checks every rank's count). Deregistered entries are skipped;
 * peers across nodes are never mapped (their calls use the hierarchical paths).
 *
 * Not collective; blocking (see above); enqueues no stream work, so it may be called while
 * a stream captures a CUDA graph. Typical use: register on every rank, maco_bootstrap_barrier,
 * then this call on every rank. Cheap when nothing is new (one load per local peer). Not
 * thread-safe with other calls on `comm`.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL comm), MACO_ERR_UNSUPPORTED (no usable GPU, or the
 * collectives were not set up), MACO_ERR_CUDA (cudaSetDevice or a mapping failed: the
 * message names the peer's rank, the registration and its size), MACO_ERR_REMOTE or
 * MACO_ERR_TIMEOUT (a peer's fd server refused or did not answer: it exited or hangs),
 * MACO_ERR_SYSTEM (a socket call failed), MACO_ERR_NO_MEMORY. A registration that failed stays
 * unmapped (calls on it use scratch) and the next call tries it again; the same peer's later
 * registrations wait behind it. The communicator stays usable: the message is this thread's
 * (maco_log_last_error(), logged once per registration), not the communicator's first error.
 */
MACO_API maco_status_t maco_collective_map_registrations(maco_comm_t comm);

/** Mesh-family kernel launches of a communicator since its creation, by the path they
 * took (counted on the device; graph replays count every replay), and the size of the last
 * launch. */
typedef struct maco_collective_stats {
    uint64_t inplace_launches; /* registered buffers used in place */
    uint64_t scratch_launches; /* through the scratch buffer */
    /* CTAs (thread blocks) of the last collective, all-to-all or send/recv kernel this
     * communicator launched, counted on the host at launch (0: none yet); shows the cap of
     * maco_collective_set_max_ctas at work. */
    int last_launch_ctas;
} maco_collective_stats_t;

/**
 * Reads the counters above. Blocking: waits for the communicator's device to finish all
 * work (cudaDeviceSynchronize), so it is for diagnostics and tests, not hot paths.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL), MACO_ERR_UNSUPPORTED (no GPU), MACO_ERR_CUDA.
 */
MACO_API maco_status_t maco_collective_get_stats(maco_comm_t comm,
                                                 maco_collective_stats_t *stats_p);

/** maco_collective_get_algorithm(comm, MACO_COLL_ALLREDUCE, ...). */
MACO_API maco_status_t maco_allreduce_get_algorithm(maco_comm_t comm, size_t count,
                                                    maco_datatype_t datatype, const char **name_p);

#ifdef __cplusplus
}
#endif

#endif /* MACO_COLLECTIVES_H */
