/*
 * kernels.cuh - the collectives' kernel families, templated on element type and op, and
 * their launchers; kernels_<type>.cu instantiate them, one type per file: twelve files of four
 * lines, so that the twelve heavy compilations run in parallel and each object shows its
 * calls to the layers check under its own path (a CMake template would give the same objects
 * from generated files outside the tree). The kernels: ll.cuh (one-shot LL),
 * allreduce/twoshot_ll.cuh (two-shot LL), mesh.cuh (mesh, in place or through scratch),
 * hier/hier.cuh (across nodes); shared device code in src/device (reduce.cuh, words.cuh).
 */
#ifndef MACO_COLL_KERNELS_CUH
#define MACO_COLL_KERNELS_CUH

#include "algorithms/allreduce/twoshot_ll.cuh"
#include "algorithms/collectives/ll.cuh"
#include "algorithms/collectives/mesh.cuh"
#include "algorithms/common/select.h"
#include "algorithms/hier/hier.cuh"

/* ------------------------------------------------------------------ instantiation */

template <class T, int Op>
static cudaError_t maco__launch_one(const maco__coll_args_t *args, int kernel, int blocks,
                                    int threads, cudaStream_t stream)
{
    if (kernel == MACO__KERNEL_LL)
        maco__ll_kernel<T, Op><<<blocks, threads, 0, stream>>>(*args);
    else if (kernel == MACO__KERNEL_LL2)
        maco__ll2_kernel<T, Op><<<blocks, threads, 0, stream>>>(*args);
    else {
        if (args->gated)
            maco__mesh_gate_kernel<<<1, MACO__GATE_THREADS, 0, stream>>>(*args);
        maco__mesh_kernel<T, Op><<<blocks, threads, 0, stream>>>(*args);
    }
    return cudaGetLastError();
}

/* Loads the kernels of type T and op Op into the current device's context (collectives.h,
 * maco__coll_preload). */
template <class T, int Op> static cudaError_t maco__preload_one()
{
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, maco__ll_kernel<T, Op>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&fa, maco__ll2_kernel<T, Op>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&fa, maco__mesh_kernel<T, Op>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&fa, maco__hier_kernel<T, Op>);
    return e;
}

/* Defines maco__launch_coll_<name>, maco__launch_hier_<name> and maco__preload_coll_<name>
 * for type trait T (collectives.h, hier/hier.h). */
#define MACO__DEFINE_LAUNCHER(name, T)                                                             \
    extern "C" cudaError_t maco__launch_coll_##name(const maco__coll_args_t *args, int kernel,     \
                                                    int op, int blocks, int threads,               \
                                                    cudaStream_t stream)                           \
    {                                                                                              \
        /* prod, min, max: one kernel reading args->op (reduce.cuh, ops). */                       \
        if (op == MACO_PROD || op == MACO_MIN || op == MACO_MAX)                                   \
            return maco__launch_one<T, MACO__OP_RUNTIME>(args, kernel, blocks, threads, stream);   \
        return maco__launch_one<T, MACO__OP_SUM>(args, kernel, blocks, threads, stream);           \
    }                                                                                              \
    extern "C" cudaError_t maco__launch_hier_##name(const maco__hier_args_t *args, int op,         \
                                                    int blocks, int threads, cudaStream_t stream)  \
    {                                                                                              \
        if (op == MACO_PROD || op == MACO_MIN || op == MACO_MAX)                                   \
            maco__hier_kernel<T, MACO__OP_RUNTIME><<<blocks, threads, 0, stream>>>(*args);         \
        else                                                                                       \
            maco__hier_kernel<T, MACO__OP_SUM><<<blocks, threads, 0, stream>>>(*args);             \
        return cudaGetLastError();                                                                 \
    }                                                                                              \
    extern "C" cudaError_t maco__preload_coll_##name(void)                                         \
    {                                                                                              \
        cudaError_t e = maco__preload_one<T, MACO__OP_SUM>();                                      \
        return e == cudaSuccess ? maco__preload_one<T, MACO__OP_RUNTIME>() : e;                    \
    }

#endif /* MACO_COLL_KERNELS_CUH */
