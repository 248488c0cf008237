/*
 * gemm_gmma.cu - the library's persistent kernel with GEMM tiles made of Hopper's
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
 * when it creates the kernel (maco__pk_gemm_gmma_map_encode, one per distinct A, B, M, N, K, A's
 * row stride and width), stored in device memory at view.gemm_maps; the task's `gemm.map` names its
 * entry.
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
 * docs/performance.md, "Tuning", "GEMM tiles", has the measurements): the pop ahead and the
 * completion warp keep the workers busier; letting the producer run ahead into the next tile's
 * stages, rather than waiting for the last stage of the previous tile to be consumed (its loads
 * then overlap only the store), made no difference beyond the noise, so the kernel keeps the
 * simpler rule: the producer runs ahead. The stages of the two widths
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
#include <string.h>

#include "maco/device/persistent.h"
#include "runtime/device/gemm_gmma_tile.cuh"
#include "runtime/device/launch.h"

namespace
{

using namespace cute;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

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
 * the kernel spill registers inside the tiles' mainloop (ptxas said so). */
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
 * (post and release) and 2-3 us (pop) per task, as long as a tile's sum itself (a runtime trace
 * of GEMM + allreduce: docs/performance.md, "Tuning", "GEMM tiles"). The control warp never holds a
 * finished task while it waits for work: with nothing ready it releases the last task first, then
 * waits (bounded) as maco_pk_next_ready does. Out of line, away from the tiles' registers.
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

/* A: m x k with row stride lda (lda > k: a slice of K of a wider A, split-K); B: k x n, row
 * stride n. */
template <class Cfg>
static void encode_params(void *dst, const void *a, const void *b, uint32_t m, uint32_t n,
                          uint32_t k, uint32_t lda)
{
    typename Cfg::Mainloop::Arguments args{ (const T *)a,
                                            StrideA{ (int64_t)lda, _1{}, (int64_t)m * lda },
                                            (const T *)b,
                                            StrideB{ _1{}, (int64_t)n, (int64_t)k * n } };
    typename Cfg::Params p = Cfg::Mainloop::to_underlying_arguments(
        make_shape((int)m, (int)n, (int)k, 1), args, nullptr);
    static_assert(sizeof(p) <= kParamsBytes, "GemmMap holds either width's maps");
    memcpy(dst, &p, sizeof(p));
}

extern "C" int maco__pk_gemm_gmma_map_encode(void *map_p, const void *a, const void *b, uint32_t m,
                                             uint32_t n, uint32_t k, uint32_t lda, uint32_t tile_n)
{
    /* TMA needs 16-byte aligned bases and row strides (K and N are multiples of 32 and 128,
     * lda of 8: graph.c checks them). TMA reads zeros past the K the map declares, so a slice
     * of K never reads its neighbour's columns. */
    if ((uintptr_t)a % 16 != 0 || (uintptr_t)b % 16 != 0 || k % 8 != 0 || n % 8 != 0 || lda < k ||
        lda % 8 != 0 || (tile_n != (uint32_t)Narrow::kN && tile_n != (uint32_t)Wide::kN))
        return -1;
    GemmMap map;
    memset(&map, 0, sizeof(map));
    if (tile_n == (uint32_t)Wide::kN)
        encode_params<Wide>(map.params, a, b, m, n, k, lda);
    else
        encode_params<Narrow>(map.params, a, b, m, n, k, lda);
    map.m = (int32_t)m;
    map.tile_n = (int32_t)tile_n;
    memcpy(map_p, &map, sizeof(map));
    return 0;
}
