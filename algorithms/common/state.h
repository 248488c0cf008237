/* algorithms.h - collective algorithms: kernel arguments and launchers (internal). */
#ifndef MACO_ALGORITHMS_H
#define MACO_ALGORITHMS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "src/host/comm/comm_internal.h"
#include "maco/collectives.h"
#include "maco/device/macros.h"
#include "maco/port_channel.h"
#include "algorithms/p2p/p2p_plan.h"

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
    /* Across nodes (hier.cuh): per CTA slot, hier_regions regions of hier_piece_max bytes
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

/* MACO_P2P_CHUNK_SIZE=0 (the default): the largest power of two from 16 KiB to
 * MACO__P2P_AUTO_CHUNK_MAX whose copy slots for `srcs` peers and `lanes` lanes (2 slots each)
 * fit MACO__P2P_AUTO_BYTES (2x H200: 512 KiB chunks on 32 lanes reached 0.98-1.01x NCCL's
 * send/recv at 1 GiB where 128 KiB reached 0.67x; docs/performance.md, 2026-11-27). Pure
 * (layout.c). */
enum { MACO__P2P_AUTO_CHUNK_MAX = 512 << 10 };
#define MACO__P2P_AUTO_BYTES ((size_t)64 << 20)
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
 * rank order (its local rank). Every array below over "local peers" has ln entries; on one
 * node the local index is the rank. Across nodes the collectives are hierarchical
 * (hier.cuh): the kernels' intra-node parts run on the local view, and each rank talks to
 * the ranks of the same local index on the other nodes (its rail) over port channels.
 */
typedef struct maco__coll {
    maco__coll_layout_t layout;
    int ln, lrank;            /* ranks on this node, this rank's local index */
    int nnodes, node;         /* nodes, this rank's node (numbered as maco_comm_get_node) */
    int *rank_at;             /* [nnodes][ln] the rank of local index i on node k */
    int *rank_at_dev;         /* the same on the device (hier kernels), NULL on one node */
    char *buf;                /* this rank's collectives buffer */
    maco_mem_t buf_mem;       /* its registration */
    char **peer_buf;          /* [ln] mapped buffers of local peers (own: buf) */
    maco_mem_t *peer_buf_mem; /* [nranks] imports by rank (own: NULL) */
    maco_memory_channel_device_t *rsag_channels; /* device array [rsag_slots][ln] */
    maco_memory_channel_device_t *p2p_channels;  /* device array [ln][p2p_lanes]: credits */
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
    /* Send/recv and all-to-all with ranks of other nodes (xp2p.c): per rank, made on the
     * first message between the two; the device view is mapped host memory. */
    struct maco__xpeer *xpeer;         /* [nranks] host side */
    struct maco__xpeer_dev *xpeer_dev; /* [nranks] pinned, mapped: the kernel's view */
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

/* ---- plan_exec.c ---- */

/**
 * Loads the plan of every MACO_ALGO_<COLLECTIVE>=plan:FILE into c->plans (at creation,
 * collective). MACO_ERR_INVALID_ARGUMENT for a plan of another collective or a collective
 * without plans (broadcast, reduce, all-to-all, send/recv), else maco_plan_load's status.
 */
maco_status_t maco__plan_load_forced(maco_comm_t comm, maco__coll_t *c);
/** Destroys c->plans (at destruction). */
void maco__plan_free_forced(maco__coll_t *c);

/** The collectives' state of `comm`, or NULL (no GPU, or set up without them). */
static inline maco__coll_t *maco__coll_of(maco_comm_t comm)
{
    return (maco__coll_t *)comm->coll;
}

/*
 * The most CTAs a collective or send/recv kernel may launch: maco_collective_set_max_ctas's
 * cap where set, else comm->coresident_ctas, halved when ranks share a GPU (any GPU of the
 * job, so the number is the same on every rank). Why the half: with k ranks on one GPU, k x (SMs /
 * k) waiting CTAs fill every SM, and on one H100 with 4 ranks under MPS (33 CTAs each) the fused
 * GEMM + allreduce test's plain allreduce then timed out in 3 of 4 runs, every rank waiting for LL
 * packets from a rank whose CTAs never ran; with 16 CTAs each (MACO_COLL_MAX_CTAS=16), 4 of 4
 * passed (docs/results/2026-11-24/context-h100/). Leaving half the SMs free gives other kernels
 * (another rank's GEMM, a persistent kernel) room beside the waiting CTAs.
 */
static inline int maco__coll_ctas(maco_comm_t comm, const maco__coll_t *c)
{
    int bound = comm->coresident_ctas;
    if (comm->any_gpu_shared && bound > 1)
        bound /= 2;
    return c->max_ctas > 0 && c->max_ctas < bound ? c->max_ctas : bound;
}

/** The node of rank r (from rank_at). */
static inline int maco__node_of(const maco__coll_t *c, int r)
{
    for (int i = 0; i < c->nnodes * c->ln; i++)
        if (c->rank_at[i] == r)
            return i / c->ln;
    return -1;
}

/* ---- setup.c ---- */

/**
 * The collectives' state of `comm` for a call named `fn`: MACO_OK and *c_p, or
 * MACO_ERR_UNSUPPORTED (recorded, with why) when the communicator has no usable GPU.
 */
maco_status_t maco__coll_require(maco_comm_t comm, const char *fn, maco__coll_t **c_p);

/* ---- select.c ---- */

/**
 * Sets c->max_ctas to `max_ctas` after checking over the bootstrap that every rank passed the
 * same value (collective, blocking). MACO_ERR_INVALID_ARGUMENT naming the first rank that
 * differs (`what` starts the message), else the bootstrap's errors.
 */
maco_status_t maco__coll_agree_max_ctas(maco_comm_t comm, maco__coll_t *c, int max_ctas,
                                        const char *what);

/** Reads MACO_ALGO_<COLLECTIVE> and MACO_ALLREDUCE_INPLACE_MAX into c (at creation). */
maco_status_t maco__coll_read_settings(maco__coll_t *c);
/** The collective's name ("allreduce") and the name of its kernel `kernel` (MACO__KERNEL_*). */
const char *maco__coll_name(maco_collective_t coll);
const char *maco__coll_algorithm(maco_collective_t coll, int kernel);
/**
 * Picks the kernel (MACO__KERNEL_*) for `count` elements of `esz` bytes (the collective's
 * unit): the forced algorithm, else by size. MACO_ERR_INVALID_ARGUMENT when the forced one
 * cannot take the call, MACO_ERR_UNSUPPORTED when it is not an algorithm of `coll`.
 */
maco_status_t maco__coll_select(maco_comm_t comm, const maco__coll_t *c, maco_collective_t coll,
                                size_t count, size_t esz, int *kernel_p);
/** Whether a sender sends a message of `bytes` bytes of `coll` (MACO_COLL_ALLTOALL or
 * MACO_COLL_SENDRECV) as LL packets: the forced choice ("ll", "copy"), else up to
 * MACO_P2P_LL_MAX bytes. Call maco__coll_select first to reject unknown forced names. */
int maco__p2p_ll(const maco__coll_t *c, maco_collective_t coll, uint64_t bytes);
/** Elements per two-shot block, or 0 when two-shot cannot take the call (select.c). */
size_t maco__coll_twoshot_block(size_t count, size_t esz, size_t n, size_t cap);

/* ---- registry.c (its file comment has the protocol) ---- */

/** Creates this rank's directory and maps every peer's (collective; at creation). */
maco_status_t maco__registry_setup(maco_comm_t comm);
/** Unmaps everything the registry mapped; live registrations stay registered. */
void maco__registry_free(maco_comm_t comm);
/** Publishes a device-memory registration of this rank; returns 1 if published. */
int maco__registry_publish(maco_comm_t comm, maco_mem_t mem, const void *ptr, size_t bytes);
/** Marks a published registration dead (at deregistration). */
void maco__registry_withdraw(maco_comm_t comm, maco_mem_t mem);
/** Id (1-based) of a live published registration holding [ptr, ptr+bytes), 0 if none;
 * *offset_p: ptr's offset inside it. */
uint32_t maco__registry_find(maco_comm_t comm, const void *ptr, size_t bytes, uint64_t *offset_p);
/** Maps peers' new entries (maco_collective_map_registrations; may fetch descriptors from
 * peers' fd servers: never called on a launch path). Returns the first entry that failed to
 * map (it stays unmapped and is tried again next time); MACO_OK without a registry. Call with
 * the communicator's device current. */
maco_status_t maco__registry_map(maco_comm_t comm);
/** Writes seen[0..local ranks) (peer entries mapped or skipped so far); no I/O, no CUDA. */
void maco__registry_seen(maco_comm_t comm, uint32_t *seen_p);
/** Device addresses of the mapped-address table and the kernels' cache of it
 * ([nranks][MACO__REG_MAX] u64 each), NULL without a registry. */
const uint64_t *maco__registry_table(maco_comm_t comm);
uint64_t *maco__registry_cache(maco_comm_t comm);

/*
 * What a kernel computes (the public maco_collective_t values). `count` below is the
 * "unit" of each: allreduce, broadcast, reduce: the whole buffer; allgather: the send
 * buffer of one rank; reduce-scatter: the receive buffer of one rank.
 */

/*
 * What a rank tells its peers at the start of a mesh-family kernel (registry.c has the
 * protocol): its send and receive buffers as registry ids (1-based) and byte offsets inside
 * those registrations, and how many registry entries of each peer it has looked at. An id
 * is MACO__DESC_NONE when the buffer cannot be used in place (not registered, or not 16-byte
 * aligned) and MACO__DESC_LOCAL when no peer touches it in place (only its own rank, or no
 * one, uses it). 14 32-bit words, sent as 7 LL16 packets (8 data bytes each) in this order.
 */
typedef struct maco__coll_desc {
    uint32_t send_id, recv_id;
    uint64_t send_off, recv_off;
    uint32_t seen[MACO__MAX_LOCAL_RANKS];
} maco__coll_desc_t;
#define MACO__DESC_NONE 0u
#define MACO__DESC_LOCAL 0xffffffffu
enum { MACO__DESC_WORDS = 14, MACO__DESC_PKTS = 7 };
MACO_STATIC_ASSERT(sizeof(maco__coll_desc_t) == 4 * MACO__DESC_WORDS, "descriptor is 14 words");
MACO_STATIC_ASSERT(16 * MACO__DESC_PKTS <= MACO__DESC_BYTES, "descriptor fits its scratch");

/* Everything a collective kernel needs; passed by value (well under the 4 KiB limit). */
typedef struct maco__coll_args {
    const void *input;
    void *output;
    uint64_t count; /* elements of the unit (above) */
    uint32_t esz;   /* bytes per element */
    int32_t coll;   /* maco_collective_t */
    int32_t avg;    /* sum, then divide by nranks */
    int32_t op;     /* MACO__OP_SUM/PROD/MIN/MAX (reduce.cuh): what MACO__OP_RUNTIME kernels do */
    int32_t root;   /* broadcast, reduce */
    int32_t rank;
    int32_t nranks;
    char *buf;                             /* this rank's comm buffer */
    char *peer_buf[MACO__MAX_LOCAL_RANKS]; /* mapped comm buffers; [rank] = buf */
    uint64_t ll_offset, ll_slot_bytes;
    uint64_t rsag_offset, rsag_slot_bytes, rsag_piece_max;
    uint64_t piece_elems; /* mesh: elements per piece; LL2: elements per block */
    uint32_t *ll_flag, *ll_done;
    unsigned long long *paths;                    /* [0] in-place, [1] scratch mesh launches */
    const maco_memory_channel_device_t *channels; /* [rsag_slots][nranks] */
    uint32_t desc[MACO__DESC_WORDS];              /* this rank's maco__coll_desc_t */
    uint64_t desc_offset;                         /* descriptors' scratch */
    const uint64_t *reg_table; /* [nranks][MACO__REG_MAX] peer registrations mapped here */
    uint64_t *reg_cache;       /* device copy of reg_table's entries, filled on use */
    maco_device_wait_bound_t bound;
    int32_t gated;    /* MESH: maco__mesh_gate_kernel ran before it and sent the descriptors */
    int32_t reserved; /* 0 */
} maco__coll_args_t;

/* Filled by the host (collectives.c), passed by value to every kernel: 320 bytes on LP64
 * (pointers and u64 fields 8-byte aligned; desc is 14 u32 words); well under CUDA's 4 KiB
 * parameter limit. */
MACO_STATIC_ASSERT(sizeof(maco__coll_args_t) == 320, "maco__coll_args_t is 320 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco__coll_args_t) == 8, "maco__coll_args_t alignment");

/*
 * The hierarchical kernel's arguments (hier.cuh): the intra-node view in `c` (rank = this
 * rank's local index, nranks = ranks on this node, peer_buf and channels over local peers,
 * piece_elems = elements per piece) and the rails. Passed by value: 320 + 80 = 400 bytes.
 */
typedef struct maco__hier_args {
    maco__coll_args_t c;
    const maco_port_channel_device_t *rail; /* [hier_slots][nnodes][2]: data, acknowledgements */
    const int *rank_at;                     /* [nnodes][ln]: rank of local index i on node k */
    uint64_t hier_offset, hier_slot_bytes;  /* the slots in every rank's collectives buffer */
    char *rail_buf;                         /* the rail buffer (mapped host memory) */
    uint64_t rail_slot_bytes;               /* its slots: CARRY, FINAL, ACC [nnodes] each */
    uint64_t hpiece;                        /* bytes per region of a slot */
    int32_t node, nnodes;                   /* this rank's node and the node count */
    int32_t nranks;                         /* ranks in all (avg divides by it) */
    int32_t root_node, root_local;          /* broadcast, reduce: where the root is */
    uint32_t accsz;                         /* bytes of the type's accumulator (carries) */
} maco__hier_args_t;
MACO_STATIC_ASSERT(sizeof(maco__hier_args_t) == 400, "maco__hier_args_t is 400 bytes");

/* The kernels (coll_kernels.cuh): LL (one-shot), MESH, and LL2 (two-shot LL allreduce).
 * For all-to-all and send/recv (MACO_COLL_ALLTOALL, MACO_COLL_SENDRECV) the same numbers name
 * how a sender moves a message: LL = as LL packets ("ll"), MESH = copied through scratch
 * ("copy"); both run in the one p2p kernel (p2p_kernels.cu). */
enum { MACO__KERNEL_LL = 0, MACO__KERNEL_MESH = 1, MACO__KERNEL_LL2 = 2, MACO__KERNEL_HIER = 3 };

/*
 * Launches kernel `kernel` for args->coll with element type `datatype` and `op` (avg runs
 * the sum kernel with args->avg set). One launcher per type, in coll_kernels_<type>.cu.
 * Returns the launch's CUDA error.
 */
typedef cudaError_t (*maco__coll_launcher_t)(const maco__coll_args_t *args, int kernel, int op,
                                             int blocks, int threads, cudaStream_t stream);
/* The same for the hierarchical kernel (hier.cuh), one per type. */
typedef cudaError_t (*maco__hier_launcher_t)(const maco__hier_args_t *args, int op, int blocks,
                                             int threads, cudaStream_t stream);

#define MACO__DECLARE_LAUNCHER(name)                                                               \
    cudaError_t maco__launch_coll_##name(const maco__coll_args_t *args, int kernel, int op,        \
                                         int blocks, int threads, cudaStream_t stream);            \
    cudaError_t maco__launch_hier_##name(const maco__hier_args_t *args, int op, int blocks,        \
                                         int threads, cudaStream_t stream);                        \
    cudaError_t maco__preload_coll_##name(void);
MACO__DECLARE_LAUNCHER(int8)
MACO__DECLARE_LAUNCHER(uint8)
MACO__DECLARE_LAUNCHER(int32)
MACO__DECLARE_LAUNCHER(uint32)
MACO__DECLARE_LAUNCHER(int64)
MACO__DECLARE_LAUNCHER(uint64)
MACO__DECLARE_LAUNCHER(float16)
MACO__DECLARE_LAUNCHER(bfloat16)
MACO__DECLARE_LAUNCHER(float32)
MACO__DECLARE_LAUNCHER(float64)
MACO__DECLARE_LAUNCHER(fp8_e4m3)
MACO__DECLARE_LAUNCHER(fp8_e5m2)
#undef MACO__DECLARE_LAUNCHER

/* The hierarchical all-to-all across nodes (hier_a2a_kernel.cu), on the hier kernel's
 * arguments (c.piece_elems: maco__hier_a2a_shape's piece); returns the launch's CUDA error. */
cudaError_t maco__launch_hier_a2a(const maco__hier_args_t *args, int blocks, int threads,
                                  cudaStream_t stream);

/* ------------------------------------------------------------------ send/recv, all-to-all */

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

/*
 * Send/recv and all-to-all between ranks of different nodes (xp2p.c, xp2p_kernel.cu). Per
 * peer on another node, one buffer of pinned host memory on each side: MACO__XP2P_SLOTS send
 * slots, then as many receive slots, each a 16-byte header (the message's byte count, the chunk's)
 * and MACO_P2P_CHUNK_SIZE bytes; a data port channel (puts from a send slot into the peer's receive
 * slot of the same number, with a signal) and an acknowledgement port channel (the receiver read a
 * slot). Sequence counters live in the same mapped table, so calls and graph replays continue where
 * the last left off.
 */
/* Chunks a sender may have in flight to one peer: 4 measured faster than 2 on one H100 over
 * loopback TCP (docs/performance.md); each costs 2 x (16 + MACO_P2P_CHUNK_SIZE) bytes of
 * pinned host memory per peer on another node. */
enum { MACO__XP2P_SLOTS = 4 };

typedef struct maco__xpeer_dev {
    maco_port_channel_device_t data, ack;
    char *buf;           /* the slots (device address of the mapped host buffer) */
    uint64_t slot_bytes; /* 16 + chunk */
    uint64_t sent, recvd;
} maco__xpeer_dev_t;

typedef struct maco__xp2p_args {
    maco__p2p_plan_t plan; /* pairs name peers by rank; no local pair */
    maco__xpeer_dev_t *peers;
    maco_device_wait_bound_t bound;
    uint64_t chunk;
} maco__xp2p_args_t;
MACO_STATIC_ASSERT(sizeof(maco__xp2p_args_t) <= 4096, "maco__xp2p_args_t fits the 4 KiB limit");

/** Launches the cross-node p2p kernel (xp2p_kernel.cu); returns the launch's CUDA error. */
cudaError_t maco__launch_xp2p(const maco__xp2p_args_t *args, int blocks, int threads,
                              cudaStream_t stream);

/*
 * Connects this rank with each rank on another node that `plan` names and that is not
 * connected yet, in ascending rank order (so the pairwise exchanges of all ranks cannot wait
 * in a cycle: every rank goes through its pairs in the global order of (lower, higher)
 * rank). Blocking, bounded by MACO_BOOTSTRAP_TIMEOUT; the peer must connect too (its
 * message to or from this rank, in its matching group). Errors name the peer.
 */
maco_status_t maco__xp2p_connect(maco_comm_t comm, maco__coll_t *c, const maco__p2p_plan_t *plan);

/* Launches `plan` (remote pairs only) on `stream`; nothing when it has no pairs. */
maco_status_t maco__xp2p_launch(maco_comm_t comm, maco__coll_t *c, const maco__p2p_plan_t *plan,
                                maco_stream_t stream, const char *prefix);

/* Frees what maco__xp2p_connect made (the collectives' teardown; the proxy stopped first). */
void maco__xp2p_free(maco_comm_t comm, maco__coll_t *c);

/** Launches the p2p kernel (p2p_kernels.cu); returns the launch's CUDA error. */
cudaError_t maco__launch_p2p(const maco__p2p_args_t *args, int blocks, int threads,
                             cudaStream_t stream);

/*
 * Kernel preloading. CUDA loads a kernel into a device's context at its first launch when
 * lazy loading is on (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2), and loading may
 * synchronise that context (CUDA C++ Programming Guide, "Lazy Loading": a kernel spinning
 * until another kernel starts can deadlock). When one thread drives several communicators, a
 * kernel of one communicator waits for its peers' kernels, which the same thread launches
 * only afterwards: if the next launch on the same device (the p2p kernel after a collective
 * of the same group, or another algorithm) had to load its kernel, it would wait for the
 * first kernel, which waits for it. So every kernel a communicator may launch is loaded at
 * its creation, as NCCL does (cudaFuncGetAttributes on each). maco__preload_coll_<type> (one
 * per type, coll_kernels.cuh) loads the LL, two-shot LL, mesh and hier kernels of both op
 * variants; maco__preload_p2p the send/recv, cross-node send/recv and hierarchical
 * all-to-all kernels. On the current device; return cudaSuccess or CUDA's error.
 */
cudaError_t maco__preload_p2p(void);
cudaError_t maco__preload_xp2p(void);     /* xp2p_kernel.cu (called by maco__preload_p2p) */
cudaError_t maco__preload_hier_a2a(void); /* hier_a2a_kernel.cu (the same) */

/* ------------------------------------------------------------------ calls, launches, groups */

/* One collective call's arguments as the checks and the launcher see them (collectives.c,
 * coll_launch.c, group.c). */
typedef struct maco__coll_call {
    maco_collective_t coll;
    const char *fn;
    const void *send;
    void *recv;
    size_t count; /* the unit's elements */
    maco_datatype_t datatype;
    maco_redop_t op;
    int root;
} maco__coll_call_t;

/*
 * coll_launch.c. maco__coll_prepare: what every collective checks once its arguments are
 * valid: the communicator's collectives exist (GPU, one node), no earlier asynchronous
 * error, the forced algorithm fits; writes the state and the kernel. Records errors.
 * maco__coll_launch: enqueues the prepared call (count > 0) on `stream`.
 */
maco_status_t maco__coll_prepare(const maco__coll_call_t *c, maco_comm_t comm,
                                 maco__coll_t **coll_p, int *kernel_p);
maco_status_t maco__coll_launch(const maco__coll_call_t *c, maco_comm_t comm, maco__coll_t *coll,
                                int kernel, maco_stream_t stream);

/*
 * group.c: the calling thread's group (maco_group_start/end). Every operation goes through
 * it: outside a group a call is a group of its own.
 * maco__group_depth: how deep the calling thread is inside maco_group_start (0: none).
 * maco__group_add_coll / _p2p: queue a checked call (its arguments copied); outside a group
 * the call is issued at once. `msgs` are the call's sends and receives (an all-to-all has
 * one of each per peer). maco__group_fail: a call inside a group failed its checks
 * (status and message are the thread's last error): the group will fail at its end.
 */
int maco__group_depth(void);
maco_status_t maco__group_add_coll(const maco__coll_call_t *c, maco_comm_t comm,
                                   maco_stream_t stream);
maco_status_t maco__group_add_p2p(const char *fn, const maco__p2p_msg_t *msgs, int nmsgs,
                                  maco_comm_t comm, maco_stream_t stream);
maco_status_t maco__group_fail(const char *fn, maco_status_t status);

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

#endif /* MACO_ALGORITHMS_H */
