/*
 * collectives.h - the five collectives that reduce or gather (allreduce, allgather,
 * reduce-scatter, broadcast, reduce): one call's arguments, the kernels' arguments and
 * launchers (kernels.cuh, kernels_<type>.cu: the LL and mesh kernels of ll.cuh and mesh.cuh,
 * allreduce's two-shot LL, the hier kernel across nodes), and the launch (launch.c).
 */
#ifndef MACO_ALGORITHMS_COLLECTIVES_H
#define MACO_ALGORITHMS_COLLECTIVES_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/common/registry.h"
#include "algorithms/common/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Threads per CTA of the collectives' kernels (their __launch_bounds__). */
enum { MACO__COLL_THREADS = 512 };

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
 * Launches kernel `kernel` for args->coll with element type `datatype` and `op` (avg runs
 * the sum kernel with args->avg set). One launcher per type, in collectives/kernels_<type>.cu,
 * which also defines the hier kernel's (hier/hier.h). Returns the launch's CUDA error.
 */
typedef cudaError_t (*maco__coll_launcher_t)(const maco__coll_args_t *args, int kernel, int op,
                                             int blocks, int threads, cudaStream_t stream);

/* The element types, in maco_datatype_t's order: one kernels_<type>.cu each. */
#define MACO__COLL_TYPES(X)                                                                        \
    X(int8)                                                                                        \
    X(uint8)                                                                                       \
    X(int32)                                                                                       \
    X(uint32)                                                                                      \
    X(int64)                                                                                       \
    X(uint64)                                                                                      \
    X(float16)                                                                                     \
    X(bfloat16)                                                                                    \
    X(float32)                                                                                     \
    X(float64)                                                                                     \
    X(fp8_e4m3)                                                                                    \
    X(fp8_e5m2)

#define MACO__DECLARE_LAUNCHER(name)                                                               \
    cudaError_t maco__launch_coll_##name(const maco__coll_args_t *args, int kernel, int op,        \
                                         int blocks, int threads, cudaStream_t stream);            \
    cudaError_t maco__preload_coll_##name(void);
MACO__COLL_TYPES(MACO__DECLARE_LAUNCHER)
#undef MACO__DECLARE_LAUNCHER

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
 * per type, collectives/kernels.cuh) loads the LL, two-shot LL, mesh and hier kernels of both op
 * variants; maco__preload_p2p (p2p/p2p.h) the send/recv, cross-node send/recv and
 * hierarchical all-to-all kernels. On the current device; return cudaSuccess or CUDA's error.
 */
/* One collective call's arguments as the checks and the launcher see them (collectives.c,
 * collectives/launch.c, group.c). */
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
 * collectives/launch.c. maco__coll_prepare: what every collective checks once its arguments are
 * valid: the communicator's collectives exist (GPU, one node), no earlier asynchronous
 * error, the forced algorithm fits; writes the state and the kernel. Records errors.
 * maco__coll_launch: enqueues the prepared call (count > 0) on `stream`.
 */
maco_status_t maco__coll_prepare(const maco__coll_call_t *c, maco_comm_t comm,
                                 maco__coll_t **coll_p, int *kernel_p);
maco_status_t maco__coll_launch(const maco__coll_call_t *c, maco_comm_t comm, maco__coll_t *coll,
                                int kernel, maco_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_COLLECTIVES_H */
