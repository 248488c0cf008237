/* algorithms.h - collective algorithms: kernel arguments and launchers (internal). */
#ifndef MACO_ALGORITHMS_H
#define MACO_ALGORITHMS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "comm_internal.h"
#include "maco/device/macros.h"
#include "maco/collectives.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MACO__RSAG_MAX_SLOTS = 128, /* most rsag CTAs (each: own scratch slot, semaphores) */
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
 *   rsag_offset     rsag scratch: [slot rsag_slots][IN n | OUT n][rsag_piece_max bytes]
 * Offsets are multiples of 256 bytes. The sizes come from MACO_ALLREDUCE_ONESHOT_MAX,
 * MACO_SCRATCH_SIZE and MACO_ALLREDUCE_RSAG_CTAS, which must agree on all ranks (checked at
 * creation).
 */
typedef struct maco__coll_layout {
    size_t desc_offset;
    size_t ll_offset, ll_slot_bytes; /* 4 * oneshot_max: two-shot's two LL16 regions */
    size_t rsag_offset, rsag_piece_max, rsag_slot_bytes;
    int rsag_slots; /* MACO_ALLREDUCE_RSAG_CTAS */
    size_t total_bytes;
    size_t oneshot_max; /* bytes per rank */
} maco__coll_layout_t;

/* Registrations published to peers for in-place collectives (registry.c). */
typedef struct maco__registry maco__registry_t;

/* The collectives' state on a communicator (comm->coll), made by setup.c at creation. */
typedef struct maco__coll {
    maco__coll_layout_t layout;
    char *buf;                                   /* this rank's collectives buffer */
    maco_mem_t buf_mem;                          /* its registration */
    char **peer_buf;                             /* [nranks] mapped buffers (own: buf) */
    maco_mem_t *peer_buf_mem;                    /* [nranks] imports (own: NULL) */
    maco_memory_channel_device_t *rsag_channels; /* device array [rsag_slots][nranks] */
    maco__registry_t *reg;
    /* Settings, read once at creation (select.c): the forced algorithm of each collective
     * ("" = by size; maco_collective_set_algorithm changes it) and the largest allreduce
     * that uses registered buffers in place. */
    char forced[MACO_COLLECTIVE_COUNT][32];
    int64_t inplace_max;
} maco__coll_t;

/** The collectives' state of `comm`, or NULL (no GPU, or set up without them). */
static inline maco__coll_t *maco__coll_of(maco_comm_t comm)
{
    return (maco__coll_t *)comm->coll;
}

/* ---- setup.c ---- */

/**
 * The collectives' state of `comm` for a call named `fn`: MACO_OK and *c_p, or
 * MACO_ERR_UNSUPPORTED (recorded, with why) when the communicator has no usable GPU.
 */
maco_status_t maco__coll_require(maco_comm_t comm, const char *fn, maco__coll_t **c_p);

/* ---- select.c ---- */

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
/** Maps peers' new entries and writes seen[0..nranks) (entries looked at, per peer). */
void maco__registry_refresh(maco_comm_t comm, uint32_t *seen_p);
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
} maco__coll_args_t;

/* Filled by the host (collectives.c), passed by value to every kernel: 312 bytes on LP64
 * (pointers and u64 fields 8-byte aligned; desc is 14 u32 words); well under CUDA's 4 KiB
 * parameter limit. */
MACO_STATIC_ASSERT(sizeof(maco__coll_args_t) == 312, "maco__coll_args_t is 312 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco__coll_args_t) == 8, "maco__coll_args_t alignment");

/* The kernels (coll_kernels.cuh): LL (one-shot), MESH, and LL2 (two-shot LL allreduce). */
enum { MACO__KERNEL_LL = 0, MACO__KERNEL_MESH = 1, MACO__KERNEL_LL2 = 2 };

/*
 * Launches kernel `kernel` for args->coll with element type `datatype` and `op` (avg runs
 * the sum kernel with args->avg set). One launcher per type, in coll_kernels_<type>.cu.
 * Returns the launch's CUDA error.
 */
typedef cudaError_t (*maco__coll_launcher_t)(const maco__coll_args_t *args, int kernel, int op,
                                             int blocks, int threads, cudaStream_t stream);

#define MACO__DECLARE_LAUNCHER(name)                                                               \
    cudaError_t maco__launch_coll_##name(const maco__coll_args_t *args, int kernel, int op,        \
                                         int blocks, int threads, cudaStream_t stream);
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

#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_H */
