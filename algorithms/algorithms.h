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

/* Everything an allreduce kernel needs; passed by value (well under the 4 KiB limit). */
typedef struct maco__allreduce_args {
    const void *input;
    void *output;
    uint64_t count; /* elements */
    int32_t datatype;
    int32_t rank;
    int32_t nranks;
    int32_t reserved;
    char *buf;                             /* this rank's comm buffer */
    char *peer_buf[MACO__MAX_LOCAL_RANKS]; /* mapped comm buffers; [rank] = buf */
    uint64_t ll_offset, ll_slot_bytes;
    uint64_t rsag_offset, rsag_slot_bytes, rsag_piece_max;
    uint64_t piece_elems; /* rsag: elements per piece */
    uint32_t *ll_flag, *ll_done;
    const maco_memory_channel_device_t *channels; /* [rsag_slots][nranks] */
    maco_device_wait_bound_t bound;
} maco__allreduce_args_t;

/* Launchers (allreduce_kernels.cu). They return the launch's CUDA error. */
cudaError_t maco__launch_allreduce_oneshot_ll(const maco__allreduce_args_t *args, int blocks,
                                              int threads, cudaStream_t stream);
cudaError_t maco__launch_allreduce_rsag(const maco__allreduce_args_t *args, int blocks, int threads,
                                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_H */
