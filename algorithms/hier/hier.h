/*
 * hier.h - the collectives across nodes (hier.cuh: the five collectives; alltoall_kernel.cu:
 * the hierarchical all-to-all): the kernels' arguments, their launchers, the all-to-all's
 * shape (alltoall_shape.c, pure) and the launch of both (launch.c).
 */
#ifndef MACO_ALGORITHMS_HIER_H
#define MACO_ALGORITHMS_HIER_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "algorithms/collectives/collectives.h"
#include "algorithms/common/state.h"
#include "maco/device/port_channel.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The hierarchical kernel's arguments (hier.cuh): the intra-node view in `c` (rank = this
 * rank's local index, nranks = ranks on this node, peer_buf and channels over local peers,
 * piece_elems = elements per piece) and the rails. Passed by value: 320 + 80 = 400 bytes.
 */
typedef struct maco__hier_args {
    maco__coll_args_t c;
    const maco_port_channel_device_t *rail; /* [hier_slots][nnodes][2]: data, acknowledgements */
    const int *rank_at; /* [nnodes][local_nranks]: rank of local index i on node k */
    uint64_t hier_offset, hier_slot_bytes; /* the slots in every rank's collectives buffer */
    char *rail_buf;                        /* the rail buffer (mapped host memory) */
    uint64_t rail_slot_bytes;              /* its slots: CARRY, FINAL, ACC [nnodes] each */
    uint64_t region_bytes;                 /* bytes per region of a slot */
    int32_t node, nnodes;                  /* this rank's node and the node count */
    int32_t nranks;                        /* ranks in all (avg divides by it) */
    int32_t root_node, root_local;         /* broadcast, reduce: where the root is */
    uint32_t accsz;                        /* bytes of the type's accumulator (carries) */
} maco__hier_args_t;
MACO_STATIC_ASSERT(sizeof(maco__hier_args_t) == 400, "maco__hier_args_t is 400 bytes");

/* Launches the hierarchical kernel (hier.cuh) for one element type; one per type, in
 * collectives/kernels_<type>.cu. Returns the launch's CUDA error. */
typedef cudaError_t (*maco__hier_launcher_t)(const maco__hier_args_t *args, int op, int blocks,
                                             int threads, cudaStream_t stream);
#define MACO__DECLARE_HIER_LAUNCHER(name)                                                          \
    cudaError_t maco__launch_hier_##name(const maco__hier_args_t *args, int op, int blocks,        \
                                         int threads, cudaStream_t stream);
MACO__COLL_TYPES(MACO__DECLARE_HIER_LAUNCHER)
#undef MACO__DECLARE_HIER_LAUNCHER

/* The hierarchical all-to-all across nodes (hier/alltoall_kernel.cu), on the hier kernel's
 * arguments (c.piece_elems: maco__hier_a2a_shape's piece); returns the launch's CUDA error. */
cudaError_t maco__launch_hier_a2a(const maco__hier_args_t *args, int blocks, int threads,
                                  cudaStream_t stream);

/* Loads the hierarchical all-to-all kernel (collectives/collectives.h, "Kernel preloading"). */
cudaError_t maco__preload_hier_a2a(void);

/*
 * Launches call `c` across nodes (launch.c): the hier kernel for the five collectives, the
 * hierarchical all-to-all for MACO_COLL_ALLTOALL, with the single-node arguments `a` the
 * collectives' launch filled; the pieces, segments and CTAs every rank computes alike. Records
 * and returns launch errors.
 */
maco_status_t maco__hier_launch(const maco__coll_call_t *c, maco_comm_t comm, maco__coll_t *coll,
                                maco__coll_args_t *a, cudaStream_t s);

/*
 * The hierarchical all-to-all across nodes (MACO_ALGO_ALLTOALL=hier; alltoall_kernel.cu has
 * the protocol). With L ranks on each of the nodes, rank (k, i) hands its block for rank
 * (m, j) of another node to its local peer (k, j) over memory channels; (k, j) sends node m's
 * rail peer (m, j) one message holding the L blocks of node k's ranks for (m, j). The blocks
 * move in segments: segment s is elements [s P, min(count, (s + 1) P)) of every block (P =
 * piece), and CTA b carries segments b, b + blocks, ... through its own slot. A rail message
 * of a segment holds the L pieces at a stride of P elements; it must fit one region of the
 * slot (region_bytes: common/state.h, the hier layout).
 */
typedef struct maco__hier_a2a_shape {
    uint64_t piece;     /* P: elements of each block per segment (whole 16-byte words) */
    uint64_t nseg;      /* segments: ceil(count / P) */
    uint64_t msg_bytes; /* bytes of a full segment's rail message: L * P * esz */
    int32_t blocks;     /* CTAs: min(nseg, slots) */
    int32_t pad;
} maco__hier_a2a_shape_t;

/*
 * The shape of a hierarchical all-to-all of `count` elements of `esz` bytes per block (esz
 * 1, 2, 4 or 8; count > 0), `local_ranks` ranks per node, `slots` CTA slots whose regions hold
 * `region_bytes` bytes: pieces of about count / slots elements (enough segments for every
 * slot), at least MACO__TUNING_HIER_ALLTOALL_RAIL_MESSAGE_MIN / local_ranks bytes (fewer,
 * larger rail messages) where the block allows, a whole number of 16-byte words, and at most
 * region_bytes / local_ranks bytes (one rail message per region). Every rank gets the same
 * shape from the same inputs. Returns 0 and leaves *shape_p untouched when a region cannot
 * hold local_ranks words (region_bytes < 16 local_ranks) or an argument is out of range; else
 * 1. Pure (alltoall_shape.c).
 */
int maco__hier_a2a_shape(uint64_t count, uint64_t esz, int local_ranks, uint64_t region_bytes,
                         int slots, maco__hier_a2a_shape_t *shape_p);
#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_HIER_H */
