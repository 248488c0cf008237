/*
 * state.h - the collectives' state on a communicator (maco__coll_t, made by setup.c at creation)
 * and the buffer every family's kernels share (its layout: layout.c), with the limits that
 * shape them. Each family has a header of its own for its calls and kernels:
 * collectives/collectives.h, hier/hier.h, p2p/p2p.h; common/ has select.h (which algorithm),
 * registry.h (buffers used in place) and group.h (groups of calls).
 */
#ifndef MACO_ALGORITHMS_COMMON_STATE_H
#define MACO_ALGORITHMS_COMMON_STATE_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/tuning.h"
#include "maco/collectives.h"
#include "maco/device/macros.h"
#include "maco/port_channel.h"
#include "src/host/comm/comm_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MACO__RSAG_MAX_SLOTS = 128, /* most rsag CTAs (each: own scratch slot, semaphores) */
    MACO__HIER_MAX_SLOTS = 64,  /* most hier CTAs (MACO_HIER_CTAS) */
    MACO__REG_MAX = 1024,       /* registrations per rank collectives can use in place */
    MACO__DESC_BYTES = 128,     /* one rank's in-place descriptor as LL16 packets */
};

/* Byte offsets of the counters at the start of the collectives' buffer (256 bytes). */
enum {
    MACO__CTR_LL_FLAG = 0,  /* u32: the LL packet flag of the next launch */
    MACO__CTR_LL_DONE = 4,  /* u32: CTAs of the current launch done */
    MACO__CTR_INPLACE = 16, /* u64: mesh launches in place (maco_collective_get_stats) */
    MACO__CTR_SCRATCH = 24, /* u64: mesh launches through scratch */
};

/*
 * The collectives' buffer on each rank (one cudaMalloc, registered, mapped by every peer;
 * setup.c), identical on every rank:
 *   0               counters (above), 256 bytes
 *   desc_offset     descriptors:  [parity 2][source rank n][MACO__DESC_BYTES] (LL16)
 *   ll_offset       LL16 scratch: [parity 2][source rank n][ll_slot_bytes]
 *   rsag_offset     rsag scratch: [slot rsag_slots][half 2][IN n | OUT n][rsag_piece_max]
 *   p2p_ctr_offset  send/recv sequence counters: u64 sent[peer n][lane], u64 recvd[peer n][lane]
 *   p2p_hdr_offset  chunk headers: [source n - 1][lane][slot MACO__P2P_SLOTS] x 16 bytes (LL16)
 *   p2p_ll_offset   LL payload:    [source n - 1][lane][slot] x MACO__P2P_LL_SLOT bytes
 *   p2p_cp_offset   copy payload:  [source n - 1][lane][slot] x p2p_cp_slot_bytes
 *                   (the sources are the peers: maco__p2p_src_index in p2p_plan.h)
 * Offsets are multiples of 256 bytes. The sizes come from MACO_ALLREDUCE_ONESHOT_MAX,
 * MACO_SCRATCH_SIZE, MACO_ALLREDUCE_RSAG_CTAS, MACO_P2P_LANES and MACO_P2P_CHUNK_SIZE, which
 * must agree on all ranks (checked at creation).
 */
typedef struct maco__coll_layout {
    size_t desc_offset;
    size_t ll_offset, ll_slot_bytes; /* 4 * oneshot_max: two-shot's two LL16 regions */
    size_t rsag_offset, rsag_piece_max, rsag_slot_bytes;
    int rsag_slots; /* MACO_ALLREDUCE_RSAG_CTAS */
    int p2p_lanes;  /* MACO_P2P_LANES */
    size_t p2p_ctr_offset, p2p_hdr_offset, p2p_ll_offset, p2p_cp_offset;
    size_t p2p_chunk;         /* copy-mode slot payload: MACO_P2P_CHUNK_SIZE, or automatic */
    size_t p2p_cp_slot_bytes; /* p2p_chunk + 16 (the skew), rounded up to 256 */
    /* Across nodes (hier/hier.cuh): per CTA slot, hier_regions regions of hier_piece_max bytes
     * in the collectives buffer (IN, OUT) and 3 * nodes in the rail buffer in pinned host
     * memory (CARRY, FINAL, ACC: rail_slot_bytes per slot); 0 on one node. */
    size_t hier_offset, hier_piece_max, hier_slot_bytes;
    size_t rail_slot_bytes;
    int hier_slots;   /* MACO_HIER_CTAS */
    int hier_regions; /* 2 * local ranks * nodes */
    size_t total_bytes;
    size_t oneshot_max; /* bytes per rank */
} maco__coll_layout_t;

/* The sizes that shape the buffer; every rank must have the same (fixed layout). */
typedef struct maco__coll_sizes {
    uint64_t oneshot_max;
    uint64_t scratch_bytes;
    int32_t rsag_ctas;
    int32_t p2p_lanes;
    int32_t hier_ctas;
    uint64_t p2p_chunk;
} maco__coll_sizes_t;

/* MACO_P2P_CHUNK_SIZE=0 (the default): the largest power of two from
 * MACO__TUNING_P2P_AUTO_CHUNK_MIN to MACO__TUNING_P2P_AUTO_CHUNK_MAX whose copy slots for `srcs`
 * peers and `lanes` lanes (2 slots each) fit MACO__TUNING_P2P_AUTO_SLOT_BYTES (algorithms/
 * tuning.h). Pure (layout.c). */
size_t maco__p2p_auto_chunk(size_t srcs, size_t lanes);

/* The layout above for `nranks` ranks on this node and `nnodes` nodes from the sizes `z`
 * (checked by the caller: setup.c's maco__coll_read_sizes): every offset a multiple of 256
 * bytes, the regions back to back in the order listed, total_bytes the end. Pure (layout.c). */
void maco__coll_layout(maco__coll_layout_t *l, int nranks, int nnodes, const maco__coll_sizes_t *z);

/* Registrations published to peers for in-place collectives (registry.c). */
typedef struct maco__registry maco__registry_t;

/* The collectives' state on a communicator (comm->coll), made by setup.c at creation. */
/*
 * Peers are indexed by *local index*: the position of a rank among the ranks of its node in
 * rank order (its local rank). Every array below over "local peers" has local_nranks entries; on
 * one node the local index is the rank. Across nodes the collectives are hierarchical
 * (hier/hier.cuh): the kernels' intra-node parts run on the local view, and each rank talks to
 * the ranks of the same local index on the other nodes (its rail) over port channels.
 */
typedef struct maco__coll {
    maco__coll_layout_t layout;
    int local_nranks, local_index; /* ranks on this node, this rank's local index */
    int nnodes, node;              /* nodes, this rank's node (numbered as maco_comm_get_node) */
    int *rank_at;                  /* [nnodes][local_nranks] the rank of local index i on node k */
    int *rank_at_dev;              /* the same on the device (hier kernels), NULL on one node */
    char *buf;                     /* this rank's collectives buffer */
    maco_mem_t buf_mem;            /* its registration */
    char **peer_buf;               /* [local_nranks] mapped buffers of local peers (own: buf) */
    maco_mem_t *peer_buf_mem;      /* [nranks] imports by rank (own: NULL) */
    maco_memory_channel_device_t *rsag_channels; /* device array [rsag_slots][local_nranks] */
    maco_memory_channel_device_t
        *p2p_channels; /* device array [local_nranks][p2p_lanes]: credits */
    /* Across nodes: the collectives' proxy and its port channels to the rail peers,
     * [hier_slots][nnodes][2] (0: data, 1: acknowledgements; none to this node). */
    maco_proxy_t proxy;
    maco_port_channel_t *rail; /* host handles */
    maco_port_channel_device_t *rail_dev;
    /* The rails' buffer: pinned host memory, mapped for the kernels (setup.c says why it is
     * not GPU memory), its registration and the rail peers' imports [nnodes] (own: NULL). */
    char *rail_buf, *rail_buf_dev;
    maco_mem_t rail_mem;
    maco_mem_t *peer_rail_mem;
    /* Send/recv and all-to-all with ranks of other nodes (internode.c): per rank, made on the
     * first message between the two; the device view is mapped host memory. */
    struct maco__internode_peer *internode_peer; /* [nranks] host side */
    struct maco__internode_peer_dev
        *internode_peer_dev; /* [nranks] pinned, mapped: the kernel's view */
    maco__registry_t *reg;
    /* Settings, read once at creation (select.c): the forced algorithm of each collective
     * ("" = by size; maco_collective_set_algorithm changes it) and the largest allreduce
     * that uses registered buffers in place. */
    char forced[MACO_COLLECTIVE_COUNT][32];
    int64_t inplace_max;
    int64_t p2p_ll_max;    /* MACO_P2P_LL_MAX: largest message a sender sends as LL packets */
    int64_t mesh_gate_min; /* MACO_MESH_GATE_MIN: mesh kernels from this many bytes (0: none)
                            * wait for every rank behind maco__mesh_gate_kernel (mesh.cuh) */
    /* maco_collective_set_max_ctas: the most CTAs a collective or send/recv kernel launches
     * (0: no cap beyond comm->coresident_ctas). Equal on every rank (the call checks). */
    int max_ctas;
    int last_ctas; /* CTAs of the last kernel launched (maco_collective_get_stats) */
    /* MACO_ALGO_<COLLECTIVE>=plan:FILE: the plan that runs the collective (plan_exec.c). */
    struct maco_plan *plans[MACO_COLLECTIVE_COUNT];
} maco__coll_t;

/* A MACO_ALGO_<COLLECTIVE> value that names an execution plan file: "plan:FILE". */
#define MACO__PLAN_PREFIX "plan:"

/** The collectives' state of `comm`, or NULL (no GPU, or set up without them). */
static inline maco__coll_t *maco__coll_of(maco_comm_t comm)
{
    return (maco__coll_t *)comm->coll;
}

/*
 * The most CTAs a collective or send/recv kernel may launch: maco_collective_set_max_ctas's
 * cap where set, else comm->coresident_ctas, divided by MACO__TUNING_SHARED_GPU_CTA_DIVISOR
 * when ranks share a GPU (any GPU of the job, so the number is the same on every rank). Why:
 * with k ranks on one GPU, k x (SMs / k) waiting CTAs fill every SM, and a rank whose CTAs
 * never run leaves its peers waiting for its LL packets until the bound; leaving SMs free gives
 * other kernels (another rank's GEMM, a persistent kernel) room beside the waiting CTAs
 * (docs/performance.md, "Tuning").
 */
static inline int maco__coll_ctas(maco_comm_t comm, const maco__coll_t *c)
{
    int bound = comm->coresident_ctas;
    if (comm->any_gpu_shared && bound > 1)
        bound /= MACO__TUNING_SHARED_GPU_CTA_DIVISOR;
    return c->max_ctas > 0 && c->max_ctas < bound ? c->max_ctas : bound;
}

/** The node of rank r (from rank_at). */
static inline int maco__node_of(const maco__coll_t *c, int r)
{
    for (int i = 0; i < c->nnodes * c->local_nranks; i++)
        if (c->rank_at[i] == r)
            return i / c->local_nranks;
    return -1;
}

/* ---- setup.c ---- */

/**
 * The collectives' state of `comm` for a call named `fn`: MACO_OK and *c_p, or
 * MACO_ERR_UNSUPPORTED (recorded, with why) when the communicator has no usable GPU.
 */
maco_status_t maco__coll_require(maco_comm_t comm, const char *fn, maco__coll_t **c_p);

#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_COMMON_STATE_H */
