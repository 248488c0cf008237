/*
 * persistent_gemm_gmma.cu - the library's persistent kernel with GEMM tiles made of Hopper's
 * warpgroup MMA (wgmma, HGMMA in SASS) fed by the tensor memory accelerator (TMA, the bulk
 * tensor copy engine), through CUTLASS's own SM90 mainloop from the CUTLASS that NVIDIA MathDx
 * ships (the same package as cuBLASDx). cuBLASDx 0.4 emits only mma.sync on sm_90
 * (docs/performance.md); this tile is the alternative issue 20 names. We write no GEMM of our
 * own: CUTLASS's collective mainloop cutlass::gemm::collective::CollectiveMma<
 * MainloopSm90TmaGmmaWarpSpecialized> (sm90_mma_tma_gmma_ss_warpspecialized.hpp) runs the K
 * loop (its load() on the producer, its mma() on the consumers), its PipelineTmaAsync
 * mbarriers order the stages, CuTe picks the instruction (SM90_64x128x16_F32BF16BF16_SS or
 * SM90_64x256x16_F32BF16BF16_SS), the swizzled shared-memory layouts and the TMA boxes; this
 * file builds the tensor maps, runs the worker loop around the mainloop and stores the tiles.
 *
 * Built for sm_90a only (wgmma needs the arch-specific target; CMake compiles this file in its
 * own object library with CUDA_ARCHITECTURES 90a when 90 is among the architectures). The
 * host picks this kernel or the cuBLASDx one (MACO_GEMM_TILE, runtime/host/launch.c).
 *
 * A tile task computes the 128 x W tile A[m0 .. m0 + 128, 0..K) x B[0..K, n0 .. n0 + W) (W =
 * the task's gemm.tile_n: 128, "narrow", or 256, "wide") with bf16 inputs and fp32
 * accumulation, and stores it as fp32 or bf16 (the task's dtype) at ptr[0] with row stride
 * ldc; A is M x K row-major (lda = K: K-major for GMMA), B is K x N row-major (ldb = N:
 * N-major, "MN-major" for GMMA). A and B are read through TMA tensor maps that the host encodes
 * when it creates the kernel (maco__pk_gemm_gmma_map_encode, one per distinct A, B, M, N, K and
 * width), stored in device memory at view.gemm_maps; the task's `gemm.map` names its entry.
 *
 * A worker CTA's 384 threads (layout of CUTLASS's KernelTmaWarpSpecializedCooperative, roles
 * kept for the whole launch rather than per tile):
 *   warp 0        the producer: pops the worker's next task whose gate is open
 *                 (maco_pk_next_ready), hands its id to
 *                 the consumers through a two-slot task ring in shared memory, and for a GEMM
 *                 tile issues the TMA copies of its K steps (one elected thread);
 *   warp 1        the completion warp: after the consumers hand a finished task over (a
 *                 second ring), writes its profile record, adds the task's signal (if any:
 *                 maco_pk_post_signal) and releases its successors (maco_pk_complete);
 *   warps 2, 3    idle (a warpgroup of its own keeps the consumers at warpgroups 1 and 2, as
 *                 wgmma wants);
 *   warpgroups 1, 2  the consumers (256 threads): GEMM tiles (each warpgroup 64 rows x W
 *                 columns through CUTLASS's mma(), then the store from registers), and every
 *                 other task type with the 256 of them (maco__pk_execute).
 * K advances in steps of 64 through MACO__PK_GEMM_GMMA_STAGES shared-memory stages (48 KiB each
 * for a wide tile, 32 KiB used of it for a narrow one), each guarded by a full and an empty
 * mbarrier (cutlass::PipelineTmaAsync). The pipeline is initialized once per launch and its
 * state carries on from one tile to the next: the producer starts loading tile i + 1 while the
 * consumers still multiply the last stages of tile i and store it, so neither the pipeline's
 * fill, the hand-off of the next task nor the release of the successors sits between two tiles
 * on the tensor cores (the per-tile pipeline that this replaced did all three in turn:
 * docs/results/2026-11-24/notes.md, "GEMM tiles"). Measured on an H100: the pop ahead and the
 * completion warp took the workers from 84.2-90.8% busy to 93.4-97.6%; letting the producer run
 * ahead into the next tile's stages, rather than waiting for the last stage of the previous tile to
 * be consumed (its loads then overlap only the store), made no difference beyond the noise (1-2%),
 * so the kernel keeps the simpler rule: the producer runs ahead. The stages of the two widths
 * lie at different offsets, so before a tile of another width than the previous one the
 * producer waits until every stage issued so far was consumed. TMA fills the rows past K with
 * zeros (K is a multiple of 32).
 *
 * Ordering. The producer pops a task with maco_pk_next's acquire (the task's inputs, written by
 * its predecessors, are visible to this thread) and then issues fence.proxy.async.global, so the
 * TMA copies (the async proxy) see them too. The consumers' stores of a task are released to the
 * completion warp by their arrivals on the done ring's mbarrier (release.cta; the completion
 * warp's wait acquires), and maco_pk_complete's acquire-release adds pass them on at GPU scope,
 * as the __syncthreads() before maco_pk_complete does in maco_pk_run.
 *
 * Waits. The mainloop's and the rings' mbarrier waits are unbounded, as CUTLASS's are: each
 * waits for a copy that this CTA issued from memory the host validated (graph.c), or for this
 * CTA's own warps, which all end when the producer sends the end of the launch; the producer's
 * own wait for work is maco_pk_next's, bounded. A failed task (its status, recorded by the
 * completion warp) makes the producer send the end at its next pop; the tasks already in the
 * ring still run (bounded) but release nothing.
 */
#include <cute/tensor.hpp> /* first: the headers below need its declarations */

#include <cutlass/gemm/collective/collective_mma_decl.hpp>
#include <cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cuda_bf16.h>
#include <string.h>
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
static_assert(kSmemBytes <= MACO__PK_GEMM_GMMA_SMEM, "persistent_launch.h states the size");

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
     * the MMA, 4-byte pairs, a warp wrote 16 bytes per row: remote tiles took 60-66 us against
     * 46 us for local ones, docs/results/2026-11-27b/notes.md). C and ldc keep the 16-byte
     * stores aligned (graph.c: C 16-byte aligned, ldc a multiple of 8 elements). */
    auto thr_mma = mma.get_thread_slice(ct);
    Tensor tCcC = thr_mma.partition_C(make_identity_tensor(make_shape(TileM{}, TileN{})));
    if (t->dtype == MACO__PK_BF16)
        store_bf16<Cfg::kN>(acc, tCcC, (T *)t->ptr[0], ldc);
    else
        store_f32<Cfg::kN>(acc, tCcC, (float *)t->ptr[0], ldc);
}

/* The next task whose gate is open, and a task's signal, out of line, like every task but a
 * tile (other_task): the kernel's registers go to the tiles' mainloop first. */
__device__ __noinline__ int next_ready(const maco_pk_view_t *v, uint64_t run, uint32_t *task_p,
                                       maco_status_t *status_p)
{
    return maco_pk_next_ready(v, blockIdx.x, run, task_p, status_p);
}

__device__ __noinline__ void post_signal(const maco_pk_view_t *v, uint32_t task)
{
    maco_pk_post_signal(v, task);
}

/* Every task but a GEMM tile, out of line: inlined, the element-wise, copy and sum loops made
 * the kernel spill registers inside the tiles' mainloop (ptxas, 2026-11-27). */
__device__ __noinline__ maco_status_t other_task(const maco_pk_view_t *v, const maco_pk_task_t *t,
                                                 uint32_t task, uint64_t run, uint32_t ct)
{
    return maco__pk_execute(v, t, task, run, reject_task, ct, (uint32_t)kConsumerThreads);
}

/* A communication worker's named barriers (0 is __syncthreads'): a task handed to the
 * executing warps, and their end of it. All 384 threads take part in both. */
constexpr uint32_t kBarStart = 1, kBarDone = 2;

__device__ __forceinline__ void comm_bar(uint32_t id)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"((uint32_t)MACO__PK_GEMM_GMMA_THREADS)
                 : "memory");
}

/* A finished task's signal and successors (the control warp, after the executors' barrier:
 * their writes are ordered before the signal's fence, which is cumulative). */
__device__ __forceinline__ void comm_finish(const maco_pk_view_t *v, uint32_t task, uint64_t run,
                                            uint32_t lane)
{
    if (lane == 0)
        maco_pk_post_signal(v, task);
    __syncwarp();
    maco_pk_complete(v, task, run, lane, 32); /* an error aborts: the next pop sees it */
}

/* A communication task on the executing warps, out of line like other_task. */
__device__ __noinline__ maco_status_t comm_task(const maco_pk_view_t *v, const maco_pk_task_t *t,
                                                uint32_t task, uint64_t run, uint32_t ct)
{
    return maco__pk_execute(v, t, task, run, reject_task, ct,
                            (uint32_t)MACO__PK_GEMM_GMMA_THREADS - 32);
}

__device__ __noinline__ void comm_executors(const maco_pk_view_t *v, uint64_t run,
                                            volatile uint32_t *task_s, int32_t *status_s)
{
    const uint32_t tid = threadIdx.x;
    for (;;) {
        comm_bar(kBarStart);
        const uint32_t t = *task_s;
        if (t == kEnd)
            return;
        maco_status_t st = comm_task(v, &v->tasks[t], t, run, tid - 32);
        if (st != MACO_OK)
            atomicCAS((int *)status_s, 0, (int)st);
        comm_bar(kBarDone);
    }
}

/*
 * A communication worker CTA: GEMM tiles are compute tasks and never reach it, so it runs only
 * the runtime's built-in task types (sums, copies, signals; none calls __syncthreads), split
 * like the tile workers: warp 0 controls, warps 1-11 (352 threads) execute. While the
 * executors run task i, the control warp posts task i - 1's signal, releases its successors and
 * pops task i + 1 if one is ready, so neither the system-scope fence of a signal nor the queue's
 * atomics sit between two tasks: run one after the other by the whole CTA they cost about 6 us
 * (post and release) and 2-3 us (pop) per task, as long as a tile's sum itself (runtime trace
 * of GEMM + allreduce on 2 H200s, 2026-11-27). The control warp never holds a finished task
 * while it waits for work: with nothing ready it releases the last task first, then waits
 * (bounded) as maco_pk_next_ready does. Out of line, away from the tiles' registers.
 */
__device__ __noinline__ void comm_worker(const maco_pk_view_t *v, uint64_t run)
{
    __shared__ uint32_t task_s;
    __shared__ int32_t status_s;
    const uint32_t tid = threadIdx.x, lane = tid % 32;
    if (tid >= 32) {
        comm_executors(v, run, &task_s, &status_s);
        return;
    }
    uint32_t t = 0, pending = kEnd;
    int have = 0;
    maco_status_t st = MACO_OK;
    if (lane == 0)
        have = maco_pk_next_ready(v, blockIdx.x, run, &t, &st);
    have = __shfl_sync(0xffffffffu, have, 0);
    t = __shfl_sync(0xffffffffu, t, 0);
    for (;;) {
        uint64_t start = 0;
        if (lane == 0) {
            task_s = have == 1 ? t : kEnd;
            status_s = MACO_OK;
            if (v->profile != 0)
                start = maco_globaltimer_ns();
        }
        comm_bar(kBarStart);
        if (have != 1)
            return;
        if (pending != kEnd) {
            comm_finish(v, pending, run, lane);
            pending = kEnd;
        }
        uint32_t t2 = 0;
        int have2 = 0;
        if (lane == 0)
            have2 = maco__pk_try_next_ready(v, blockIdx.x, run, 8, &t2, &st);
        have2 = __shfl_sync(0xffffffffu, have2, 0);
        t2 = __shfl_sync(0xffffffffu, t2, 0);
        comm_bar(kBarDone);
        const int32_t status = *(volatile int32_t *)&status_s;
        if (status != MACO_OK) {
            if (lane == 0) {
                /* The first report wins: a task's own (a wait's) is kept. */
                maco__pk_record(v, (maco_status_t)status, (int)t, MACO_DEVICE_ERR_TASK_FAILED,
                                v->tasks[t].type, 0);
                maco_pk_abort(v);
            }
            have = 0; /* the executors are told the end; a popped task is left (aborted) */
            continue;
        }
        if (lane == 0 && v->profile != 0) {
            uint32_t sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            maco_pk_profile_record_t *r = &v->profile[t];
            r->start_ns = start;
            r->end_ns = maco_globaltimer_ns();
            r->sm = sm;
            r->cta = blockIdx.x;
        }
        pending = t;
        if (have2 == 1) { /* runs next; task t is released while it runs */
            t = t2;
            continue;
        }
        comm_finish(v, pending, run, lane); /* before any wait: others may need it */
        pending = kEnd;
        if (have2 == 2) { /* a closed gate that could not go back to the queue: wait there */
            maco_status_t gs = MACO_OK;
            if (lane == 0)
                gs = maco_pk_gate(v, t2, run);
            gs = (maco_status_t)__shfl_sync(0xffffffffu, (int)gs, 0);
            have = gs == MACO_OK ? 1 : -1;
            t = t2;
            continue;
        }
        if (have2 < 0) { /* a push failed: it recorded why and aborted the launch */
            have = -1;
            continue;
        }
        if (lane == 0)
            have = maco_pk_next_ready(v, blockIdx.x, run, &t, &st);
        have = __shfl_sync(0xffffffffu, have, 0);
        t = __shfl_sync(0xffffffffu, t, 0);
    }
}

/* Warp 0: pops tasks, hands them to the consumers, loads the GEMM tiles. */
__device__ void producer_warp(const maco_pk_view_t *v, Smem &s, uint64_t run)
{
    const uint32_t lane = threadIdx.x % 32;
    TaskRing::Params rp;
    rp.role = TaskRing::ThreadCategory::Producer;
    rp.producer_arv_count = 1;
    rp.consumer_arv_count = kConsumerThreads;
    TaskRing ring(s.task_ring, rp, cute::false_type{});
    auto slot = cutlass::make_producer_start_state<TaskRing>();
    PipeState write = cutlass::make_producer_start_state<Pipeline>();
    /* For the waits below (made by the whole warp: the constructor elects a thread). */
    Pipeline drain = make_pipeline(s, Pipeline::ThreadCategory::Producer, 0, false);
    int last_n = 0; /* the width of the last tile loaded (0: none yet) */
    for (;;) {
        ring.producer_acquire(slot); /* a free slot: the consumers hold at most one task */
        uint32_t task = kEnd;
        if (lane == 0 && *(volatile int32_t *)&s.failed == 0) {
            maco_status_t st = MACO_OK;
            uint32_t t = 0;
            /* Only a task whose gate is open goes to the consumers and has its TMA loads
             * issued (a gated tile's A may be what a peer is writing); a closed one goes to
             * the back of the queue (maco_pk_next_ready). A gate that timed out has recorded
             * why and aborted the launch: this CTA ends (its consumers finish what they hold). */
            if (next_ready(v, run, &t, &st) == 1)
                task = t;
        }
        task = __shfl_sync(0xffffffffu, task, 0);
        if (lane == 0) {
            s.task[slot.index()] = task;
            ring.producer_commit(slot);
        }
        ++slot;
        if (task == kEnd)
            break;
        const maco_pk_task_t *t = &v->tasks[task];
        if (!gemm_task(v, t))
            continue;
        const GemmMap &map = ((const GemmMap *)v->gemm_maps)[t->gemm.map];
        const int n = t->gemm.tile_n;
        if (last_n != 0 && n != last_n) {
            /* The stages of the other width overlap these at other offsets: wait until every
             * stage issued so far was consumed (waits only; the state stays). */
            if (lane == 0)
                drain.producer_tail(write);
            __syncwarp();
        }
        last_n = n;
        if (lane == 0) /* the acquired inputs, for the TMA copies (async proxy) too */
            asm volatile("fence.proxy.async.global;" ::: "memory");
        if (n == Wide::kN)
            load_tile<Wide>(s, map, t, write);
        else
            load_tile<Narrow>(s, map, t, write);
    }
    /* Every stage issued was consumed (the consumers ran every tile to its end). */
    if (lane == 0)
        drain.producer_tail(write);
    __syncwarp();
}

/* Warpgroups 1 and 2: run each task of the ring, then hand it to the completion warp. */
__device__ void consumer_warpgroups(const maco_pk_view_t *v, Smem &s, uint64_t run)
{
    const int ct = (int)threadIdx.x - 128; /* consumer thread 0..255 */
    TaskRing::Params rp;
    rp.role = TaskRing::ThreadCategory::Consumer;
    rp.producer_arv_count = 1;
    rp.consumer_arv_count = kConsumerThreads;
    TaskRing ring(s.task_ring, rp, cute::false_type{});
    DoneRing::Params dp;
    dp.role = DoneRing::ThreadCategory::Producer;
    dp.producer_arv_count = kConsumerThreads;
    dp.consumer_arv_count = 1;
    DoneRing done(s.done_ring, dp, cute::false_type{});
    Pipeline pipeline = make_pipeline(s, Pipeline::ThreadCategory::Consumer, 0, false);
    TaskRing::PipelineState slot;
    auto out = cutlass::make_producer_start_state<DoneRing>();
    PipeState read;
    for (;;) {
        ring.consumer_wait(slot);
        const uint32_t task = s.task[slot.index()];
        uint64_t start = 0;
        maco_status_t st = MACO_OK;
        if (task != kEnd) {
            if (ct == 0 && v->profile != 0)
                start = maco_globaltimer_ns();
            const maco_pk_task_t *t = &v->tasks[task];
            if (gemm_task(v, t)) {
                const GemmMap &map = ((const GemmMap *)v->gemm_maps)[t->gemm.map];
                if (t->gemm.tile_n == Wide::kN)
                    mma_tile<Wide>(s, pipeline, read, map, t, ct);
                else
                    mma_tile<Narrow>(s, pipeline, read, map, t, ct);
            } else {
                st = other_task(v, t, task, run, (uint32_t)ct);
            }
        }
        done.producer_acquire(out); /* the completion warp has read this slot's last task */
        if (st != MACO_OK)
            atomicCAS((int *)&s.done_status[out.index()], 0, (int)st);
        if (ct == 0) {
            s.done_task[out.index()] = task;
            s.done_start[out.index()] = start;
            s.done_end[out.index()] = v->profile != 0 ? maco_globaltimer_ns() : 0;
        }
        done.producer_commit(out); /* release: this thread's stores of the task */
        ++out;
        ring.consumer_release(slot); /* the producer may pop the next task */
        ++slot;
        if (task == kEnd)
            break;
    }
}

/* Warp 1: profile records and maco_pk_complete for each finished task. */
__device__ void completion_warp(const maco_pk_view_t *v, Smem &s, uint64_t run)
{
    const uint32_t lane = threadIdx.x % 32;
    DoneRing::Params dp;
    dp.role = DoneRing::ThreadCategory::Consumer;
    dp.producer_arv_count = kConsumerThreads;
    dp.consumer_arv_count = 1;
    DoneRing done(s.done_ring, dp, cute::false_type{});
    DoneRing::PipelineState slot;
    for (;;) {
        done.consumer_wait(slot); /* acquire: the consumers' stores of the task */
        const int i = (int)slot.index();
        const uint32_t task = s.done_task[i];
        const int32_t status = s.done_status[i];
        if (task != kEnd && s.failed == 0) {
            if (status != MACO_OK) {
                if (lane == 0) {
                    /* The first report wins: a task's own (a wait's) is kept; else this one
                     * says which task failed, so no abort goes unreported. */
                    maco__pk_record(v, (maco_status_t)status, (int)task,
                                    MACO_DEVICE_ERR_TASK_FAILED, v->tasks[task].type, 0);
                    maco_pk_abort(v);
                    *(volatile int32_t *)&s.failed = 1; /* the producer pops nothing more */
                }
            } else {
                if (lane == 0 && v->profile != 0) {
                    uint32_t sm;
                    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
                    maco_pk_profile_record_t *r = &v->profile[task];
                    r->start_ns = s.done_start[i];
                    r->end_ns = s.done_end[i];
                    r->sm = sm;
                    r->cta = blockIdx.x;
                }
                if (lane == 0)
                    post_signal(v, task); /* after the consumers' stores (acquired) */
                __syncwarp();
                maco_pk_complete(v, task, run, lane, 32); /* an error aborts: next() sees it */
            }
        }
        __syncwarp();
        if (lane == 0) {
            s.done_status[i] = MACO_OK;
            done.consumer_release(slot);
        }
        ++slot;
        if (task == kEnd)
            break;
    }
}

#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

} // namespace

__global__ void __launch_bounds__(MACO__PK_GEMM_GMMA_THREADS, 1)
    maco__pk_gemm_gmma_kernel(maco_pk_view_t view)
{
    const maco_pk_view_t *v = &view;
    uint64_t run = maco__pk_cta_run(v);
    if (blockIdx.x >= v->nworkers + v->ncomm) {
        maco__pk_scheduler_cta(v, run);
        maco__pk_cta_exit(v, run);
        return;
    }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (blockIdx.x >= v->nworkers) { /* a communication worker: no tile ever comes to it */
        comm_worker(v, run);
        maco__pk_cta_exit(v, run);
        return;
    }
    extern __shared__ __align__(1024) unsigned char maco__pk_gmma_smem[];
    uint32_t base = (uint32_t)__cvta_generic_to_shared(maco__pk_gmma_smem);
    Smem &s = *(Smem *)(maco__pk_gmma_smem + ((1024u - (base & 1023u)) & 1023u));
    const int warp = (int)(threadIdx.x / 32);

    /* Warp 0 initializes the barriers; everyone sees them after the barrier below. */
    {
        Pipeline p = make_pipeline(s, Pipeline::ThreadCategory::NonParticipant, 0, true);
        TaskRing::Params rp;
        rp.producer_arv_count = 1;
        rp.consumer_arv_count = kConsumerThreads;
        TaskRing r(s.task_ring, rp, cute::true_type{});
        DoneRing::Params dp;
        dp.producer_arv_count = kConsumerThreads;
        dp.consumer_arv_count = 1;
        DoneRing d(s.done_ring, dp, cute::true_type{});
        (void)p;
        (void)r;
        (void)d;
    }
    if (threadIdx.x < kRing)
        s.done_status[threadIdx.x] = MACO_OK;
    if (threadIdx.x == 0)
        s.failed = 0;
    __syncthreads();

    /* Registers from the producer warpgroup to the consumers, as CUTLASS's warp-specialized
     * kernels do (40 + 2 x 232 = 3 x 168 per thread): the consumers' code (the tiles' mainloop,
     * and the other task types beside it) then spills nothing. */
    if (warp < 4) {
        cutlass::arch::warpgroup_reg_dealloc<40>();
        if (warp == 0)
            producer_warp(v, s, run);
        else if (warp == 1)
            completion_warp(v, s, run);
    } else {
        cutlass::arch::warpgroup_reg_alloc<232>();
        consumer_warpgroups(v, s, run);
    }
#else
    /* Not reached: the host launches this kernel only where its sm_90a image loads. */
    if (threadIdx.x == 0)
        maco__pk_record(v, MACO_ERR_UNSUPPORTED, (int)blockIdx.x, MACO_DEVICE_ERR_TASK_TYPE,
                        MACO_PK_GEMM_TILE, 0);
#endif
    maco__pk_cta_exit(v, run);
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

template <class Cfg>
static void encode_params(void *dst, const void *a, const void *b, uint32_t m, uint32_t n,
                          uint32_t k)
{
    typename Cfg::Mainloop::Arguments args{ (const T *)a,
                                            StrideA{ (int64_t)k, _1{}, (int64_t)m * k },
                                            (const T *)b,
                                            StrideB{ _1{}, (int64_t)n, (int64_t)k * n } };
    typename Cfg::Params p = Cfg::Mainloop::to_underlying_arguments(
        make_shape((int)m, (int)n, (int)k, 1), args, nullptr);
    static_assert(sizeof(p) <= kParamsBytes, "GemmMap holds either width's maps");
    memcpy(dst, &p, sizeof(p));
}

extern "C" int maco__pk_gemm_gmma_map_encode(void *map_p, const void *a, const void *b, uint32_t m,
                                             uint32_t n, uint32_t k, uint32_t tile_n)
{
    /* TMA needs 16-byte aligned bases and row strides (K and N are multiples of 32 and 128:
     * graph.c checks them). */
    if ((uintptr_t)a % 16 != 0 || (uintptr_t)b % 16 != 0 || k % 8 != 0 || n % 8 != 0 ||
        (tile_n != (uint32_t)Narrow::kN && tile_n != (uint32_t)Wide::kN))
        return -1;
    GemmMap map;
    memset(&map, 0, sizeof(map));
    if (tile_n == (uint32_t)Wide::kN)
        encode_params<Wide>(map.params, a, b, m, n, k);
    else
        encode_params<Narrow>(map.params, a, b, m, n, k);
    map.m = (int32_t)m;
    map.tile_n = (int32_t)tile_n;
    memcpy(map_p, &map, sizeof(map));
    return 0;
}
