/* algorithms.h - collective algorithms: kernel arguments and launchers (internal). */
#ifndef MACO_ALGORITHMS_H
#define MACO_ALGORITHMS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "comm_internal.h"
#include "maco/collectives.h"

#ifdef __cplusplus
extern "C" {
#endif

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
#ifdef __cplusplus
static_assert(sizeof(maco__coll_desc_t) == 4 * MACO__DESC_WORDS, "descriptor is 14 words");
static_assert(16 * MACO__DESC_PKTS <= MACO__DESC_BYTES, "descriptor fits its scratch");
#else
_Static_assert(sizeof(maco__coll_desc_t) == 4 * MACO__DESC_WORDS, "descriptor is 14 words");
_Static_assert(16 * MACO__DESC_PKTS <= MACO__DESC_BYTES, "descriptor fits its scratch");
#endif

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
