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

/* Everything a collective kernel needs; passed by value (well under the 4 KiB limit). */
typedef struct maco__coll_args {
    const void *input;
    void *output;
    uint64_t count; /* elements of the unit (above) */
    uint32_t esz;   /* bytes per element */
    int32_t coll;   /* maco_collective_t */
    int32_t avg;    /* sum, then divide by nranks */
    int32_t root;   /* broadcast, reduce */
    int32_t rank;
    int32_t nranks;
    char *buf;                             /* this rank's comm buffer */
    char *peer_buf[MACO__MAX_LOCAL_RANKS]; /* mapped comm buffers; [rank] = buf */
    uint64_t ll_offset, ll_slot_bytes;
    uint64_t rsag_offset, rsag_slot_bytes, rsag_piece_max;
    uint64_t piece_elems; /* mesh: elements per piece */
    uint32_t *ll_flag, *ll_done;
    const maco_memory_channel_device_t *channels; /* [rsag_slots][nranks] */
    maco_device_wait_bound_t bound;
} maco__coll_args_t;

/* The two kernel families (coll_kernels.cuh). */
enum { MACO__KERNEL_LL = 0, MACO__KERNEL_MESH = 1 };

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
