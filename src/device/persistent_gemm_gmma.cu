/*
 * persistent_gemm_gmma.cu - the library's persistent kernel with GEMM tiles made of Hopper's
 * warpgroup MMA (wgmma, HGMMA in SASS) through CuTe's SM90 GMMA atoms, from the CUTLASS that
 * NVIDIA MathDx ships (the same package as cuBLASDx). cuBLASDx 0.4 emits only mma.sync on
 * sm_90 (docs/performance.md); this tile is the alternative issue 20 names. We still write no
 * GEMM of our own: CuTe picks the instruction (SM90_64x128x16_F32BF16BF16_SS), the swizzled
 * shared-memory layouts and the wgmma descriptors; this file moves tiles and fences.
 *
 * Built for sm_90a only (wgmma needs the arch-specific target; CMake compiles this file in its
 * own object library with CUDA_ARCHITECTURES 90a when 90 is among the architectures). The
 * host picks this kernel or the cuBLASDx one (MACO_GEMM_TILE, src/host/persistent/kernel.c).
 *
 * A tile task computes the 128 x 128 tile A[m0 .. m0 + 128, 0..K) x B[0..K, n0 .. n0 + 128)
 * with bf16 inputs and fp32 accumulation, and stores it as fp32 or bf16 (the task's dtype) at
 * ptr[0] with row stride ldc; A is M x K row-major (lda = K: K-major for GMMA), B is K x N
 * row-major (ldb = N: N-major, "MN-major" for GMMA). The CTA's 256 threads are two consumer
 * warpgroups, each 64 rows x 128 columns of the tile. K advances in steps of 64 through
 * kStages shared-memory stages (32 KiB each) filled by cp.async from all 256 threads: the
 * copy of step s + kStages - 2 is in flight while step s multiplies, and one wgmma batch
 * (step s - 1) may still run when step s is issued. When K is not a multiple of 64 (it is a
 * multiple of 32) the last step's upper half is zero-filled (cp.async with src-size 0).
 */
#include <cute/tensor.hpp> /* first: the atom headers below need its declarations */

#include <cute/arch/copy_sm80.hpp>
#include <cute/atom/copy_traits_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "maco/device/persistent.h"
#include "persistent_launch.h"

namespace
{

using namespace cute;
using T = cutlass::bfloat16_t;

constexpr int kStages = MACO__PK_GEMM_GMMA_STAGES;
using TileM = Int<MACO__PK_GEMM_TM>;
using TileN = Int<MACO__PK_GEMM_TN>;
using TileK = Int<64>;

/* A stage: A's 128 x 64 (K-major, 128-byte swizzle) and B's 128 (N) x 64 (K) (N-major, 128-byte
 * swizzle), the layouts the GMMA descriptors describe. */
using SmemLayoutA =
    decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<TileM, TileK, Int<kStages>>{}));
using SmemLayoutB =
    decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<TileN, TileK, Int<kStages>>{}));
constexpr int kSmemElemsA = (int)cosize_v<SmemLayoutA>;
constexpr int kSmemElemsB = (int)cosize_v<SmemLayoutB>;
/* + 1024: the swizzled layouts need a 1024-byte aligned base; dynamic shared memory starts after
 * the runtime's static shared variables, so the base is aligned at run time. */
constexpr int kSmemBytes = (kSmemElemsA + kSmemElemsB) * (int)sizeof(T) + 1024;
static_assert(kSmemBytes <= MACO__PK_GEMM_GMMA_SMEM, "persistent_launch.h states the size");

/* Two warpgroups stacked along M: 128 x 128 per CTA, 64 x 128 x 16 per wgmma. */
using TiledMma = decltype(make_tiled_mma(
    SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_2, _1, _1>>{}));
static_assert(size(TiledMma{}) == MACO__PK_GEMM_THREADS, "two warpgroups per CTA");

/* gmem -> smem copies: 16 bytes (8 bf16) per cp.async, zero-filled past K. A: 32 rows x 8
 * threads along K per pass; B: 16 threads along N x 16 rows of K per pass. */
using CopyAtom = Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, T>;
using TiledCopyA = decltype(make_tiled_copy(CopyAtom{}, Layout<Shape<_32, _8>, Stride<_8, _1>>{},
                                            Layout<Shape<_1, _8>>{}));
using TiledCopyB = decltype(make_tiled_copy(CopyAtom{}, Layout<Shape<_16, _16>, Stride<_1, _16>>{},
                                            Layout<Shape<_8, _1>>{}));

} // namespace

__device__ maco_status_t maco__pk_gemm_gmma_tile(const maco_pk_view_t *v, const maco_pk_task_t *t,
                                                 uint32_t task)
{
    if (t->type != MACO_PK_GEMM_TILE) {
        if (threadIdx.x == 0)
            maco__pk_record(v, MACO_ERR_INVALID_ARGUMENT, (int)task, MACO_DEVICE_ERR_TASK_TYPE,
                            t->type, 0);
        return MACO_ERR_INVALID_ARGUMENT;
    }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char maco__pk_gmma_smem[];
    uint32_t base = (uint32_t)__cvta_generic_to_shared(maco__pk_gmma_smem);
    T *smem = (T *)(maco__pk_gmma_smem + ((1024u - (base & 1023u)) & 1023u));

    const T *A = (const T *)t->ptr[1];
    const T *B = (const T *)t->ptr[2];
    const int K = (int)(uint32_t)t->count, N = (int)(uint32_t)(t->count >> 32);
    const int ldc = (int)t->aux;
    const int m0 = (int)(uint32_t)t->ptr[3], n0 = (int)(uint32_t)(t->ptr[3] >> 32);
    const int steps = (K + TileK{} - 1) / TileK{};

    /* This tile's rows of A (128 x K, K-major) and columns of B (128 x K as (N, K), N-major). */
    Tensor gA = make_tensor(make_gmem_ptr(A + (size_t)m0 * K), make_shape(TileM{}, K),
                            make_stride(K, _1{}));
    Tensor gB = make_tensor(make_gmem_ptr(B + n0), make_shape(TileN{}, K), make_stride(_1{}, N));
    Tensor gAk = local_tile(gA, Shape<TileM, TileK>{}, make_coord(0, _)); /* (128, 64, steps) */
    Tensor gBk = local_tile(gB, Shape<TileN, TileK>{}, make_coord(0, _));
    Tensor sA = make_tensor(make_smem_ptr(smem), SmemLayoutA{}); /* (128, 64, kStages) */
    Tensor sB = make_tensor(make_smem_ptr(smem + kSmemElemsA), SmemLayoutB{});

    auto thr_copy_a = TiledCopyA{}.get_slice(threadIdx.x);
    auto thr_copy_b = TiledCopyB{}.get_slice(threadIdx.x);
    Tensor tAgA = thr_copy_a.partition_S(gAk); /* (CPY, CPY_M, CPY_K, steps) */
    Tensor tAsA = thr_copy_a.partition_D(sA);  /* (CPY, CPY_M, CPY_K, kStages) */
    Tensor tBgB = thr_copy_b.partition_S(gBk);
    Tensor tBsB = thr_copy_b.partition_D(sB);
    /* The K coordinate of each copy, for the zero fill past K. */
    Tensor tAcA = thr_copy_a.partition_S(make_identity_tensor(Shape<TileM, TileK>{}));
    Tensor tBcB = thr_copy_b.partition_S(make_identity_tensor(Shape<TileN, TileK>{}));
    CopyAtom atom;

    auto load = [&](int step, int stage) {
        const int k0 = step * TileK{};
        CUTE_UNROLL
        for (int m = 0; m < size<1>(tAsA); m++)
            CUTE_UNROLL
        for (int k = 0; k < size<2>(tAsA); k++)
            copy(atom.with(k0 + get<1>(tAcA(0, m, k)) < K), tAgA(_, m, k, step),
                 tAsA(_, m, k, stage));
        CUTE_UNROLL
        for (int n = 0; n < size<1>(tBsB); n++)
            CUTE_UNROLL
        for (int k = 0; k < size<2>(tBsB); k++)
            copy(atom.with(k0 + get<1>(tBcB(0, n, k)) < K), tBgB(_, n, k, step),
                 tBsB(_, n, k, stage));
    };

    TiledMma mma;
    auto thr_mma = mma.get_thread_slice(threadIdx.x);
    Tensor tCsA = thr_mma.partition_A(sA); /* (MMA, MMA_M, MMA_K, kStages) */
    Tensor tCsB = thr_mma.partition_B(sB);
    Tensor tCrA = thr_mma.make_fragment_A(tCsA); /* GMMA descriptors */
    Tensor tCrB = thr_mma.make_fragment_B(tCsB);
    Tensor acc = partition_fragment_C(mma, Shape<TileM, TileN>{});
    clear(acc);

    __syncthreads(); /* the previous tile of this CTA is done with the stages */
    CUTE_UNROLL
    for (int s = 0; s < kStages - 2; s++) {
        if (s < steps)
            load(s, s);
        cp_async_fence();
    }
    for (int s = 0; s < steps; s++) {
        const int stage = s % kStages;
        /* Step s has landed for this thread; the barrier makes every thread's copies visible
         * and, since each warpgroup waited for its step s - 2 batch before it, frees the stage
         * of step s - 2 for the load below. */
        cp_async_wait<kStages - 3>();
        __syncthreads();
        warpgroup_fence_operand(acc);
        warpgroup_arrive();
        gemm(mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), acc);
        warpgroup_commit_batch();
        if (s + kStages - 2 < steps)
            load(s + kStages - 2, (s + kStages - 2) % kStages);
        cp_async_fence();
        warpgroup_wait<1>(); /* step s - 1's batch is done: its stage is free after the barrier */
        warpgroup_fence_operand(acc);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);

    if (t->dtype == MACO__PK_BF16) {
        T *C = (T *)t->ptr[0];
        Tensor gC =
            make_tensor(make_gmem_ptr(C), make_shape(TileM{}, TileN{}), make_stride(ldc, _1{}));
        Tensor tCgC = thr_mma.partition_C(gC);
        CUTE_UNROLL
        for (int i = 0; i < size(acc); i++)
            tCgC(i) = T(acc(i));
    } else {
        float *C = (float *)t->ptr[0];
        Tensor gC =
            make_tensor(make_gmem_ptr(C), make_shape(TileM{}, TileN{}), make_stride(ldc, _1{}));
        Tensor tCgC = thr_mma.partition_C(gC);
        CUTE_UNROLL
        for (int i = 0; i < size(acc); i++)
            tCgC(i) = acc(i);
    }
    return MACO_OK;
#else
    /* Not reached: the host launches this kernel only where its sm_90a image loads. */
    if (threadIdx.x == 0)
        maco__pk_record(v, MACO_ERR_UNSUPPORTED, (int)task, MACO_DEVICE_ERR_TASK_TYPE, t->type, 0);
    return MACO_ERR_UNSUPPORTED;
#endif
}

__global__ void __launch_bounds__(MACO__PK_GEMM_THREADS, 1)
    maco__pk_gemm_gmma_kernel(maco_pk_view_t view)
{
    maco_pk_run(&view, maco__pk_gemm_gmma_tile);
}

extern "C" cudaError_t maco__pk_gemm_gmma_launch(const maco_pk_view_t *view, int grid,
                                                 cudaStream_t stream)
{
    maco__pk_gemm_gmma_kernel<<<grid, MACO__PK_GEMM_THREADS, kSmemBytes, stream>>>(*view);
    return cudaGetLastError();
}

extern "C" cudaError_t maco__pk_gemm_gmma_ctas_per_sm(int *ctas_p)
{
    /* Fails (cudaErrorNoKernelImageForDevice or cudaErrorInvalidDeviceFunction) where the
     * device cannot run sm_90a code: the host then uses the cuBLASDx kernel. */
    cudaError_t e = cudaFuncSetAttribute(maco__pk_gemm_gmma_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (e != cudaSuccess)
        return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_p, maco__pk_gemm_gmma_kernel,
                                                         MACO__PK_GEMM_THREADS, kSmemBytes);
}
