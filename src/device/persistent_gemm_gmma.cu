/*
 * persistent_gemm_gmma.cu - the library's persistent kernel with GEMM tiles made of Hopper's
 * warpgroup MMA (wgmma, HGMMA in SASS) fed by the tensor memory accelerator (TMA, the bulk
 * tensor copy engine), through CUTLASS's own SM90 mainloop from the CUTLASS that NVIDIA MathDx
 * ships (the same package as cuBLASDx). cuBLASDx 0.4 emits only mma.sync on sm_90
 * (docs/performance.md); this tile is the alternative issue 20 names. We write no GEMM of our
 * own: CUTLASS's collective mainloop cutlass::gemm::collective::CollectiveMma<
 * MainloopSm90TmaGmma> (MainloopSm90TmaGmmaWarpSpecialized,
 * sm90_mma_tma_gmma_ss_warpspecialized.hpp) runs the K loop (its load() on the producer, its
 * mma() on the consumers),
 * its PipelineTmaAsync mbarriers order the stages, CuTe picks the instruction
 * (SM90_64x128x16_F32BF16BF16_SS), the swizzled shared-memory layouts and the TMA boxes; this
 * file builds the tensor maps, calls the mainloop once per tile and stores the tile.
 *
 * Built for sm_90a only (wgmma needs the arch-specific target; CMake compiles this file in its
 * own object library with CUDA_ARCHITECTURES 90a when 90 is among the architectures). The
 * host picks this kernel or the cuBLASDx one (MACO_GEMM_TILE, src/host/persistent/kernel.c).
 *
 * A tile task computes the 128 x 128 tile A[m0 .. m0 + 128, 0..K) x B[0..K, n0 .. n0 + 128)
 * with bf16 inputs and fp32 accumulation, and stores it as fp32 or bf16 (the task's dtype) at
 * ptr[0] with row stride ldc; A is M x K row-major (lda = K: K-major for GMMA), B is K x N
 * row-major (ldb = N: N-major, "MN-major" for GMMA). A and B are read through TMA tensor maps
 * that the host encodes when it creates the kernel (maco__pk_gemm_gmma_map_encode, one per
 * distinct A, B, M, N, K), stored in device memory at view.gemm_maps; the task's `gemm_map`
 * names its entry. The CTA's 384 threads are warp-specialized as in CUTLASS's
 * KernelTmaWarpSpecializedCooperative: warpgroup 0 is the producer (one elected thread of its
 * warp 0 issues the TMA copies, its other warps idle), warpgroups 1 and 2 are the consumers,
 * each 64 rows x 128 columns of the tile, and store the tile from their registers. K advances
 * in steps of 64 through kStages shared-memory stages of 32 KiB, each guarded by a full and an
 * empty mbarrier (cutlass::PipelineTmaAsync): the producer runs up to kStages steps ahead of
 * the tensor cores. TMA fills the rows past K with zeros (K is a multiple of 32). The pipeline
 * is initialized afresh for every tile, so a tile leaves no state behind for the next task.
 *
 * The mainloop's mbarrier waits are CUTLASS's and unbounded: each waits for a copy that this
 * CTA issued from memory the host validated (graph.c), or for this CTA's own warpgroups, so
 * none depends on another CTA or a peer.
 */
#include <cute/tensor.hpp> /* first: the headers below need its declarations */

#include <cutlass/gemm/collective/collective_mma_decl.hpp>
#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>

#include "maco/device/persistent.h"
#include "persistent_launch.h"

namespace
{

using namespace cute;
using T = cutlass::bfloat16_t;

using TileM = Int<MACO__PK_GEMM_TM>;
using TileN = Int<MACO__PK_GEMM_TN>;
using TileK = Int<64>;
using TileShape = Shape<TileM, TileN, TileK>;

/* Two warpgroups stacked along M: 128 x 128 per CTA, 64 x 128 x 16 per wgmma. */
using TiledMma = decltype(make_tiled_mma(
    SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_2, _1, _1>>{}));
static_assert(size(TiledMma{}) == MACO__PK_GEMM_THREADS, "two warpgroups per CTA");

/* A: (M, K, 1) with strides (K, 1, M K): K-major. B as (N, K, 1) with strides (1, N, K N):
 * N-major (row-major K x N). */
using StrideA = Stride<int64_t, _1, int64_t>;
using StrideB = Stride<_1, int64_t, int64_t>;

using Mainloop = cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<MACO__PK_GEMM_GMMA_STAGES>, TileShape, T,
    StrideA, T, StrideB, TiledMma, SM90_TMA_LOAD, GMMA::Layout_K_SW128_Atom<T>, void,
    cute::identity, SM90_TMA_LOAD, GMMA::Layout_MN_SW128_Atom<T>, void, cute::identity>;
using Pipeline = Mainloop::MainloopPipeline;
constexpr int kConsumerThreads = (int)size(TiledMma{});
static_assert(kConsumerThreads + 128 == MACO__PK_GEMM_GMMA_THREADS, "a producer warpgroup more");

/* One GEMM's tensor maps (two CUtensorMaps, 64-byte aligned, inside the mainloop's Params) and
 * its M, which sizes A's coordinate tensor. */
struct GemmMap {
    Mainloop::Params params;
    int32_t m;
};

/* + 1024: the swizzled layouts need a 1024-byte aligned base; dynamic shared memory starts after
 * the runtime's static shared variables, so the base is aligned at run time. */
constexpr int kSmemBytes = (int)sizeof(Mainloop::SharedStorage) + 1024;
static_assert(kSmemBytes <= MACO__PK_GEMM_GMMA_SMEM, "persistent_launch.h states the size");

} // namespace

__device__ maco_status_t maco__pk_gemm_gmma_tile(const maco_pk_view_t *v, const maco_pk_task_t *t,
                                                 uint32_t task)
{
    if (t->type != MACO_PK_GEMM_TILE || v->gemm_maps == NULL) {
        if (threadIdx.x == 0)
            maco__pk_record(v, MACO_ERR_INVALID_ARGUMENT, (int)task, MACO_DEVICE_ERR_TASK_TYPE,
                            t->type, 0);
        return MACO_ERR_INVALID_ARGUMENT;
    }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char maco__pk_gmma_smem[];
    uint32_t base = (uint32_t)__cvta_generic_to_shared(maco__pk_gmma_smem);
    auto &storage =
        *(Mainloop::SharedStorage *)(maco__pk_gmma_smem + ((1024u - (base & 1023u)) & 1023u));

    const GemmMap &map = ((const GemmMap *)v->gemm_maps)[t->gemm_map];
    const int K = (int)(uint32_t)t->count, N = (int)(uint32_t)(t->count >> 32);
    const int ldc = (int)t->aux;
    const int m0 = (int)(uint32_t)t->ptr[3], n0 = (int)(uint32_t)(t->ptr[3] >> 32);
    const int warp = (int)(threadIdx.x / 32);
    const bool producer = threadIdx.x < 128;

    /* Roles as in CUTLASS's cooperative kernel: warp 0 produces, warpgroups 1 and 2 consume. */
    Pipeline::Params pp;
    pp.role = producer ? (warp == 0 ? Pipeline::ThreadCategory::Producer
                                    : Pipeline::ThreadCategory::NonParticipant)
                       : Pipeline::ThreadCategory::Consumer;
    pp.is_leader = threadIdx.x == 0;
    pp.num_consumers = kConsumerThreads;
    pp.transaction_bytes = map.params.tma_transaction_bytes;

    __syncthreads(); /* the previous tile of this CTA is done with the stages and barriers */
    Pipeline pipeline(storage.pipeline, pp, Shape<_1, _1, _1>{}); /* warp 0 initializes */
    __syncthreads(); /* the barriers are initialized for every thread */

    Mainloop mainloop;
    const int k_tiles = (K + TileK{} - 1) / TileK{};
    if (producer) {
        if (warp == 0) {
            if (threadIdx.x == 0)
                Mainloop::prefetch_tma_descriptors(map.params);
            auto inputs = mainloop.load_init(make_shape(map.m, N, K, 1), map.params);
            auto k_tile_iter = make_coord_iterator(shape<3>(get<0>(inputs)));
            auto write = cutlass::make_producer_start_state<Pipeline>();
            mainloop.load(map.params, pipeline, write, inputs,
                          make_coord(m0 / TileM{}, n0 / TileN{}, _0{}, _0{}), k_tile_iter, k_tiles,
                          (int)threadIdx.x, 0u, storage.tensors);
            write.advance(k_tiles);
            mainloop.load_tail(pipeline, write); /* every stage consumed: nothing in flight */
        }
        return MACO_OK;
    }

    const int ct = (int)threadIdx.x - 128; /* consumer thread 0..255 */
    TiledMma mma;
    Tensor acc = partition_fragment_C(mma, Shape<TileM, TileN>{});
    cutlass::PipelineState<Mainloop::DispatchPolicy::Stages> read;
    mainloop.mma(pipeline, read, acc, k_tiles, ct, storage.tensors, map.params);
    mainloop.mma_tail(pipeline, read, k_tiles);

    auto thr_mma = mma.get_thread_slice(ct);
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

__global__ void __launch_bounds__(MACO__PK_GEMM_GMMA_THREADS, 1)
    maco__pk_gemm_gmma_kernel(maco_pk_view_t view)
{
    maco_pk_run(&view, maco__pk_gemm_gmma_tile);
}

extern "C" cudaError_t maco__pk_gemm_gmma_launch(const maco_pk_view_t *view, int grid,
                                                 cudaStream_t stream)
{
    maco__pk_gemm_gmma_kernel<<<grid, MACO__PK_GEMM_GMMA_THREADS, kSmemBytes, stream>>>(*view);
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
                                                         MACO__PK_GEMM_GMMA_THREADS, kSmemBytes);
}

extern "C" size_t maco__pk_gemm_gmma_map_bytes(void)
{
    return sizeof(GemmMap);
}

extern "C" int maco__pk_gemm_gmma_map_encode(void *map_p, const void *a, const void *b, uint32_t m,
                                             uint32_t n, uint32_t k)
{
    /* TMA needs 16-byte aligned bases and row strides (K and N are multiples of 32 and 128:
     * graph.c checks them). */
    if ((uintptr_t)a % 16 != 0 || (uintptr_t)b % 16 != 0 || k % 8 != 0 || n % 8 != 0)
        return -1;
    Mainloop::Arguments args{ (const T *)a, StrideA{ (int64_t)k, _1{}, (int64_t)m * k },
                              (const T *)b, StrideB{ _1{}, (int64_t)n, (int64_t)k * n } };
    GemmMap map{ Mainloop::to_underlying_arguments(make_shape((int)m, (int)n, (int)k, 1), args,
                                                   nullptr),
                 (int32_t)m };
    memcpy(map_p, &map, sizeof(map));
    return 0;
}
