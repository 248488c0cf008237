/*
 * p2p.h - send/recv and all-to-all: the p2p kernel's arguments and launch (p2p_kernels.cu, one
 * launch per group and communicator; group.c builds it), the pairs with ranks of other nodes
 * (internode.c, internode_kernel.cu), and the checks the calls share (p2p.c). The plan of a
 * launch and the chunking of a message are in p2p_plan.h (pure, CPU-tested).
 */
#ifndef MACO_ALGORITHMS_P2P_H
#define MACO_ALGORITHMS_P2P_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/common/state.h"
#include "algorithms/p2p/p2p_plan.h"
#include "algorithms/tuning.h"
#include "maco/device/error.h"
#include "maco/device/port_channel.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Everything the p2p kernel needs (p2p_kernels.cu has the protocol): this launch's plan and
 * the communicator's send/recv resources. Filled by group.c, passed by value: the plan
 * (3352) + pointers, offsets and counts: 3520 bytes, under CUDA's 4 KiB parameter limit.
 */
typedef struct maco__p2p_args {
    maco__p2p_plan_t plan;
    char *buf;                                 /* this rank's collectives buffer */
    char *peer_buf[MACO__MAX_LOCAL_RANKS];     /* mapped buffers; [rank] = buf */
    const maco_memory_channel_device_t *chans; /* [nranks][lanes]: credit semaphores */
    maco_device_wait_bound_t bound;
    uint64_t ctr_offset, hdr_offset, ll_offset, cp_offset;
    uint64_t cp_slot_bytes; /* bytes per copy-mode slot */
    uint64_t chunk;         /* copy-mode payload per chunk (a multiple of 16) */
    /* lanes: the pair's lanes (slots, counters); lanes_used: the most any op of the launch
     * uses (maco__p2p_msg_lanes), which sets the work items: npairs x lanes_used. */
    int32_t rank, nranks, lanes, lanes_used;
} maco__p2p_args_t;
MACO_STATIC_ASSERT(sizeof(maco__p2p_args_t) == 3520, "maco__p2p_args_t is 3520 bytes");
MACO_STATIC_ASSERT(sizeof(maco__p2p_args_t) <= 4096, "maco__p2p_args_t fits the 4 KiB limit");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco__p2p_args_t) == 8, "maco__p2p_args_t alignment");

/** Launches the p2p kernel (p2p_kernels.cu); returns the launch's CUDA error. */
cudaError_t maco__launch_p2p(const maco__p2p_args_t *args, int blocks, int threads,
                             cudaStream_t stream);

/* Load the send/recv kernel and, from it, the cross-node send/recv and hierarchical all-to-all
 * kernels (collectives/collectives.h, "Kernel preloading"). */
cudaError_t maco__preload_p2p(void);
cudaError_t maco__preload_p2p_internode(void); /* internode_kernel.cu */

/*
 * Send/recv and all-to-all between ranks of different nodes (internode.c, internode_kernel.cu). Per
 * peer on another node, one buffer of pinned host memory on each side: MACO__P2P_INTERNODE_SLOTS
 * send slots, then as many receive slots, each a 16-byte header (the message's byte count, the
 * chunk's) and MACO_P2P_CHUNK_SIZE bytes; a data port channel (puts from a send slot into the
 * peer's receive slot of the same number, with a signal) and an acknowledgement port channel (the
 * receiver read a slot). Sequence counters live in the same mapped table, so calls and graph
 * replays continue where the last left off.
 */
/* Chunks a sender may have in flight to one peer (algorithms/tuning.h). */
enum { MACO__P2P_INTERNODE_SLOTS = MACO__TUNING_P2P_INTERNODE_SLOTS };

typedef struct maco__internode_peer_dev {
    maco_port_channel_device_t data, ack;
    char *buf;           /* the slots (device address of the mapped host buffer) */
    uint64_t slot_bytes; /* 16 + chunk */
    uint64_t sent, recvd;
} maco__internode_peer_dev_t;

typedef struct maco__p2p_internode_args {
    maco__p2p_plan_t plan; /* pairs name peers by rank; no local pair */
    maco__internode_peer_dev_t *peers;
    maco_device_wait_bound_t bound;
    uint64_t chunk;
} maco__p2p_internode_args_t;
MACO_STATIC_ASSERT(sizeof(maco__p2p_internode_args_t) <= 4096,
                   "maco__p2p_internode_args_t fits the 4 KiB limit");

/** Launches the cross-node p2p kernel (internode_kernel.cu); returns the launch's CUDA error. */
cudaError_t maco__launch_p2p_internode(const maco__p2p_internode_args_t *args, int blocks,
                                       int threads, cudaStream_t stream);

/*
 * Connects this rank with each rank on another node that `plan` names and that is not
 * connected yet, in ascending rank order (so the pairwise exchanges of all ranks cannot wait
 * in a cycle: every rank goes through its pairs in the global order of (lower, higher)
 * rank). Blocking, bounded by MACO_BOOTSTRAP_TIMEOUT; the peer must connect too (its
 * message to or from this rank, in its matching group). Errors name the peer.
 */
maco_status_t maco__p2p_internode_connect(maco_comm_t comm, maco__coll_t *c,
                                          const maco__p2p_plan_t *plan);

/* Launches `plan` (remote pairs only) on `stream`; nothing when it has no pairs. */
maco_status_t maco__p2p_internode_launch(maco_comm_t comm, maco__coll_t *c,
                                         const maco__p2p_plan_t *plan, maco_stream_t stream,
                                         const char *prefix);

/* Frees what maco__p2p_internode_connect made (the collectives' teardown; the proxy stopped first).
 */
void maco__p2p_internode_free(maco_comm_t comm, maco__coll_t *c);

/*
 * p2p/p2p.c: checks that maco_send, maco_recv and the all-to-all calls (alltoall/alltoall.c)
 * share. maco__p2p_fail: call `fn` failed its checks with `st` (already logged): records it in
 * the communicator and, inside a group, in the group; returns what the call returns.
 * maco__p2p_check_common: the communicator and the type. maco__p2p_check_bytes: `count`
 * elements of `esz` bytes, `mult` times, fit a message's byte size (and size_t); `what` names
 * the count in the message. maco__esz_log2: log2 of an element size (1, 2, 4 or 8 bytes).
 */
maco_status_t maco__p2p_fail(maco_comm_t comm, const char *fn, maco_status_t st);
maco_status_t maco__p2p_check_common(const char *fn, maco_comm_t comm, maco_datatype_t datatype);
maco_status_t maco__p2p_check_bytes(const char *fn, const char *what, size_t count, size_t esz,
                                    size_t mult);
uint8_t maco__esz_log2(size_t esz);

#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_P2P_H */
