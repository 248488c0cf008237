/*
 * gemm_gmma_tile.cuh - one GEMM tile of the GMMA kernel (gemm_gmma.cu, which includes this file
 * alone): CUTLASS's SM90 TMA + GMMA warp-specialized mainloop for tiles of 128 x 128 and
 * 128 x 256, the shared-memory stages, the loads by TMA and the epilogue's stores. The kernel's
 * roles (producer, consumers, completion and communication warps) are in gemm_gmma.cu.
 */
#ifndef MACO_RUNTIME_GEMM_GMMA_TILE_CUH
#define MACO_RUNTIME_GEMM_GMMA_TILE_CUH

#include <cute/tensor.hpp> /* first: the headers below need its declarations */

#include <cutlass/gemm/collective/collective_mma_decl.hpp>
#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cuda_bf16.h>
#include <type_traits>

#include "maco/device/persistent.h"
#include "runtime/device/launch.h"

namespace
{

using namespace cute;
using T = cutlass::bfloat16_t;

constexpr int kStages = MACO__PK_GEMM_GMMA_STAGES;
using TileM = Int<MACO__PK_GEMM_TM>;
using TileK = Int<64>;

/* A: (M, K, 1) with strides (K, 1, M K): K-major. B as (N, K, 1) with strides (1, N, K N):
 * N-major (row-major K x N). */
using StrideA = Stride<int64_t, _1, int64_t>;
using StrideB = Stride<_1, int64_t, int64_t>;

/* One tile width: two warpgroups stacked along M, each 64 x W per wgmma (64 x W x 16). */
template <int kTileN> struct TileCfg {
    static constexpr int kN = kTileN;
    using TileN = Int<kTileN>;
    using TileShape = Shape<TileM, TileN, TileK>;
    using Atom = std::conditional_t<kTileN == 256,
                                    SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>,
                                    SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>>;
    using TiledMma = decltype(make_tiled_mma(Atom{}, Layout<Shape<_2, _1, _1>>{}));
    using Mainloop = cutlass::gemm::collective::CollectiveMma<
        cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<kStages>, TileShape, T, StrideA, T,
        StrideB, TiledMma, SM90_TMA_LOAD, GMMA::Layout_K_SW128_Atom<T>, void, cute::identity,
        SM90_TMA_LOAD, GMMA::Layout_MN_SW128_Atom<T>, void, cute::identity>;
    using Params = typename Mainloop::Params;
    using TensorStorage = typename Mainloop::TensorStorage;
};
using Narrow = TileCfg<128>;
using Wide = TileCfg<256>;

using Pipeline = Narrow::Mainloop::MainloopPipeline;
using PipeState = cutlass::PipelineState<kStages>;
static_assert(std::is_same_v<Pipeline, Wide::Mainloop::MainloopPipeline>,
              "both widths share one pipeline");
constexpr int kConsumerThreads = (int)size(Narrow::TiledMma{});
static_assert(kConsumerThreads == (int)size(Wide::TiledMma{}), "two warpgroups for both widths");
static_assert(kConsumerThreads == MACO__PK_GEMM_THREADS, "two consumer warpgroups per CTA");
static_assert(kConsumerThreads + 128 == MACO__PK_GEMM_GMMA_THREADS, "a producer warpgroup more");

/* The rings between the warps: task ids from the producer to the consumers, finished tasks from
 * the consumers to the completion warp. Two slots each: the producer pops the next task only
 * when a slot is free, so it holds at most one task beyond the one the consumers run (a worker
 * that looks idle to a scheduler's dispatch is idle but for that one). */
constexpr int kRing = 2;
using TaskRing = cutlass::PipelineAsync<kRing>;
using DoneRing = cutlass::PipelineAsync<kRing>;
constexpr uint32_t kEnd = 0xffffffffu; /* a ring's task id: the launch is over for this CTA */

constexpr size_t kTensorBytes = sizeof(Wide::TensorStorage) > sizeof(Narrow::TensorStorage)
                                    ? sizeof(Wide::TensorStorage)
                                    : sizeof(Narrow::TensorStorage);

/* A worker CTA's dynamic shared memory (1024-byte aligned: the swizzled stages need it). */
struct Smem {
    alignas(1024) unsigned char tensors[kTensorBytes]; /* Narrow's or Wide's TensorStorage */
    Pipeline::SharedStorage pipeline;
    TaskRing::SharedStorage task_ring;
    DoneRing::SharedStorage done_ring;
    uint32_t task[kRing];       /* task ring: the task id (kEnd: over) */
    uint32_t done_task[kRing];  /* done ring: the task id (kEnd: over) */
    int32_t done_status[kRing]; /* its status (the first error of its threads) */
    uint64_t done_start[kRing]; /* its profile times (profile on) */
    uint64_t done_end[kRing];
    int32_t failed; /* set by the completion warp: a task failed */
};

/* + 1024: dynamic shared memory starts after the runtime's static shared variables, so the base
 * is aligned at run time. */
constexpr int kSmemBytes = (int)sizeof(Smem) + 1024;
static_assert(kSmemBytes <= MACO__PK_GEMM_GMMA_SMEM, "launch.h states the size");

/* One GEMM's tensor maps for one width (Narrow's or Wide's Params: two CUtensorMaps, 64-byte
 * aligned), its M (which sizes A's coordinate tensor) and the width. */
constexpr size_t kParamsBytes = sizeof(Wide::Params) > sizeof(Narrow::Params)
                                    ? sizeof(Wide::Params)
                                    : sizeof(Narrow::Params);
struct GemmMap {
    alignas(64) unsigned char params[kParamsBytes];
    int32_t m;
    int32_t tile_n;
};

/* Whether this kernel runs task t as a GEMM tile: the producer and the consumers decide alike. */
__device__ __forceinline__ bool gemm_task(const maco_pk_view_t *v, const maco_pk_task_t *t)
{
    return t->type == MACO_PK_GEMM_TILE && v->gemm_maps != NULL &&
           (t->gemm.tile_n == Narrow::kN || t->gemm.tile_n == Wide::kN);
}

/* Every other task of a GEMM type (no maps, a width this kernel lacks) or a user type fails. */
__device__ maco_status_t reject_task(const maco_pk_view_t *v, const maco_pk_task_t *t,
                                     uint32_t task)
{
    if (threadIdx.x == 128) /* consumer thread 0 */
        maco__pk_record(v, MACO_ERR_INVALID_ARGUMENT, (int)task, MACO_DEVICE_ERR_TASK_TYPE, t->type,
                        0);
    return MACO_ERR_INVALID_ARGUMENT;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ Pipeline make_pipeline(Smem &s, Pipeline::ThreadCategory role,
                                                  uint32_t tx_bytes, bool init)
{
    Pipeline::Params pp;
    pp.role = role;
    pp.is_leader = threadIdx.x == 0;
    pp.num_consumers = kConsumerThreads;
    pp.transaction_bytes = tx_bytes;
    if (init)
        return Pipeline(s.pipeline, pp, Shape<_1, _1, _1>{}, cute::true_type{});
    return Pipeline(s.pipeline, pp, Shape<_1, _1, _1>{}, cute::false_type{});
}

/* The producer warp's TMA copies of one tile (the elected thread issues them). */
template <class Cfg>
__device__ __forceinline__ void load_tile(Smem &s, const GemmMap &map, const maco_pk_task_t *t,
                                          PipeState &write)
{
    const auto &params = *reinterpret_cast<const typename Cfg::Params *>(map.params);
    const int K = (int)(uint32_t)t->count, N = (int)(uint32_t)(t->count >> 32);
    const int m0 = (int)(uint32_t)t->ptr[3], n0 = (int)(uint32_t)(t->ptr[3] >> 32);
    const int k_tiles = (K + TileK{} - 1) / TileK{};
    /* A pipeline object per tile: the full barrier expects this width's bytes per stage. */
    Pipeline pipeline =
        make_pipeline(s, Pipeline::ThreadCategory::Producer, params.tma_transaction_bytes, false);
    typename Cfg::Mainloop mainloop;
    if (cute::elect_one_sync())
        Cfg::Mainloop::prefetch_tma_descriptors(params);
    auto inputs = mainloop.load_init(make_shape(map.m, N, K, 1), params);
    auto k_tile_iter = make_coord_iterator(shape<3>(get<0>(inputs)));
    mainloop.load(params, pipeline, write, inputs,
                  make_coord(m0 / TileM{}, n0 / typename Cfg::TileN{}, _0{}, _0{}), k_tile_iter,
                  k_tiles, (int)threadIdx.x, 0u,
                  *reinterpret_cast<typename Cfg::TensorStorage *>(s.tensors));
    write.advance(k_tiles);
}

/*
 * The tile stores. The accumulators of SM90's 64 x W x 16 wgmma (CuTe's CLayout_64xN), per
 * thread of a warpgroup: value i = v0 + 2 v1 + 4 c lies at row 16 warp + lane / 4 + 8 v1 (+ 64
 * for the second warpgroup), column 8 c + 2 (lane % 4) + v0; so the four lanes of a quad hold
 * one row, each lane two adjacent columns of every 8-column chunk c. The row comes from
 * CuTe's partition of an identity tensor (tCcC); the columns from the layout above.
 */

/* Word i & 3 of w, with i known only at run time, without indexing registers. */
__device__ __forceinline__ uint32_t pick4(const uint32_t (&w)[4], uint32_t i)
{
    i &= 3;
    return i == 0 ? w[0] : i == 1 ? w[1] : i == 2 ? w[2] : w[3];
}

/* bf16: per row half h and group of 4 chunks, lane q of a quad holds word c (columns
 * 8 c + 2q, + 1) of chunks 4j .. 4j + 3; a 4 x 4 transpose within the quad (3 shuffles, the
 * rotation form) gives lane q all 8 columns of chunk 4j + q: one 16-byte store. */
template <int kN, class Acc, class Coord>
__device__ __forceinline__ void store_bf16(const Acc &acc, const Coord &tCcC, T *C, int ldc)
{
    static_assert(kN % 32 == 0, "whole groups of 4 chunks");
    const uint32_t lane = threadIdx.x % 32, q = lane % 4, quad = lane & ~3u;
    CUTE_UNROLL
    for (int h = 0; h < 2; h++) {
        T *row = C + (size_t)get<0>(tCcC(2 * h)) * (size_t)ldc;
        CUTE_UNROLL
        for (int j = 0; j < kN / 32; j++) {
            uint32_t w[4], o[4];
            CUTE_UNROLL
            for (int c = 0; c < 4; c++) {
                const int i = 4 * (4 * j + c) + 2 * h;
                __nv_bfloat162 p = __floats2bfloat162_rn(acc(i), acc(i + 1));
                w[c] = *reinterpret_cast<uint32_t *>(&p);
            }
            CUTE_UNROLL
            for (int s = 0; s < 4; s++)
                o[s] = w[s]; /* o[q] = w[q] stays; the three others come from the shuffles */
            CUTE_UNROLL
            for (uint32_t r = 1; r < 4; r++) {
                /* Lane q sends its word of the chunk that lane q + r wants, and takes from
                 * lane q - r that lane's word of chunk q. */
                const uint32_t got =
                    __shfl_sync(0xffffffffu, pick4(w, q + r), (int)(quad | ((q - r) & 3)));
                CUTE_UNROLL
                for (uint32_t s = 0; s < 4; s++)
                    if (s == ((q - r) & 3))
                        o[s] = got;
            }
            *reinterpret_cast<uint4 *>(row + 8 * (4 * j + (int)q)) =
                make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
}

/* fp32: per row half h and pair of chunks 2j, 2j + 1, lane q holds two columns of each; lanes
 * q and q ^ 1 swap one pair, so an even lane has columns 16 j + 2q .. + 3 and an odd one
 * 16 j + 8 + 2 (q - 1) .. + 3: one 16-byte store each. */
template <int kN, class Acc, class Coord>
__device__ __forceinline__ void store_f32(const Acc &acc, const Coord &tCcC, float *C, int ldc)
{
    static_assert(kN % 16 == 0, "whole pairs of chunks");
    const uint32_t q = threadIdx.x % 4;
    const bool odd = (q & 1) != 0;
    CUTE_UNROLL
    for (int h = 0; h < 2; h++) {
        float *row = C + (size_t)get<0>(tCcC(2 * h)) * (size_t)ldc;
        CUTE_UNROLL
        for (int j = 0; j < kN / 16; j++) {
            const int a = 4 * (2 * j) + 2 * h, b = 4 * (2 * j + 1) + 2 * h;
            const float a0 = acc(a), a1 = acc(a + 1), b0 = acc(b), b1 = acc(b + 1);
            const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
            const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
            if (odd)
                *reinterpret_cast<float4 *>(row + 16 * j + 8 + 2 * (q - 1)) =
                    make_float4(r0, r1, b0, b1);
            else
                *reinterpret_cast<float4 *>(row + 16 * j + 2 * q) = make_float4(a0, a1, r0, r1);
        }
    }
}

/* The consumers' part of one tile: CUTLASS's mma() over its K steps, then the store. */
template <class Cfg>
__device__ __forceinline__ void mma_tile(Smem &s, Pipeline &pipeline, PipeState &read,
                                         const GemmMap &map, const maco_pk_task_t *t, int ct)
{
    const auto &params = *reinterpret_cast<const typename Cfg::Params *>(map.params);
    const int K = (int)(uint32_t)t->count;
    const int ldc = (int)t->aux;
    const int k_tiles = (K + TileK{} - 1) / TileK{};
    using TileN = typename Cfg::TileN;
    typename Cfg::TiledMma mma;
    Tensor acc = partition_fragment_C(mma, Shape<TileM, TileN>{});
    typename Cfg::Mainloop mainloop;
    mainloop.mma(pipeline, read, acc, k_tiles, ct,
                 *reinterpret_cast<typename Cfg::TensorStorage *>(s.tensors), params);
    mainloop.mma_tail(pipeline, read, k_tiles);
    read.advance(k_tiles);

    /* Straight from the registers (no predicate: a row test here made the kernel spill
     * registers in the mainloop). All 128 rows, also in the last row of tiles of a GEMM whose
     * M is not a multiple of 128 (TMA read zeros past M: those rows are zeros; C has room for
     * them, maco/persistent.h). C may be a peer's memory mapped through a memory channel (the
     * fused operators' reduce-scatter), where every store is an NVLink write: the values are
     * exchanged within each quad of lanes first so that every thread stores 16 bytes and a
     * warp's store covers 64 contiguous bytes of each of its 8 rows (stored as they come out of
     * the MMA, 4-byte pairs, a warp wrote 16 bytes per row: remote tiles took much longer than
     * local ones, docs/performance.md, "Tuning", "GEMM tiles"). C and ldc keep the 16-byte
     * stores aligned (graph.c: C 16-byte aligned, ldc a multiple of 8 elements). */
    auto thr_mma = mma.get_thread_slice(ct);
    Tensor tCcC = thr_mma.partition_C(make_identity_tensor(make_shape(TileM{}, TileN{})));
    if (t->dtype == MACO__PK_BF16)
        store_bf16<Cfg::kN>(acc, tCcC, (T *)t->ptr[0], ldc);
    else
        store_f32<Cfg::kN>(acc, tCcC, (float *)t->ptr[0], ldc);
}

#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

} // namespace

#endif /* MACO_RUNTIME_GEMM_GMMA_TILE_CUH */
