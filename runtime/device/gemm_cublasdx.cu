/*
 * gemm_cublasdx.cu - the library's persistent kernel with GEMM tiles: maco_pk_run with a
 * tile function made of cuBLASDx (NVIDIA MathDx, header-only over CUTLASS/CuTe), built only
 * when CMake finds MathDx (MACO_MATHDX_DIR). We do not write a GEMM of our own: cuBLASDx
 * chooses the MMA instructions and the shared-memory layouts; this file only moves tiles.
 *
 * A tile task computes the 128 x W tile A[m0 .. m0 + 128, 0..K) x B[0..K, n0 .. n0 + W) (W =
 * the task's gemm.tile_n, 128 or 256) with bf16 inputs and fp32 accumulation, and stores it as
 * fp32 or bf16 (the task's dtype) at ptr[0] with row stride ldc; A is M x K row-major (lda = K),
 * B is K x N row-major (ldb = N). A wide tile is computed as its two 128-column halves, one
 * after the other (these tiles are the fallback where the GMMA ones cannot run; the wide width
 * exists for those). K advances in steps of 32 through two shared-memory stages: the copy of
 * step s + 1 (cp.async through cublasdx::copy) is in flight while step s multiplies.
 */
#include <cublasdx.hpp>

#include "maco/device/persistent.h"
#include "runtime/device/launch.h"

namespace
{

using Blas =
    decltype(cublasdx::Size<MACO__PK_GEMM_TM, MACO__PK_GEMM_TN, MACO__PK_GEMM_TK>() +
             cublasdx::Precision<__nv_bfloat16, __nv_bfloat16, float>() +
             cublasdx::Type<cublasdx::type::real>() + cublasdx::Function<cublasdx::function::MM>() +
             cublasdx::Arrangement<cublasdx::row_major, cublasdx::row_major,
                                   cublasdx::row_major>() +
             cublasdx::Block() + cublasdx::BlockDim<MACO__PK_GEMM_THREADS>() +
             cublasdx::MaxAlignment() + cublasdx::SM<900>());

constexpr int kStageA = MACO__PK_GEMM_TM * MACO__PK_GEMM_TK;
constexpr int kStageB = MACO__PK_GEMM_TK * MACO__PK_GEMM_TN;

} // namespace

/* The 128 x 128 tile at column n0 (of B and of the problem) whose (0, 0) in C is C0. */
static __device__ __forceinline__ void maco__pk_gemm_half(const maco_pk_task_t *t, uint32_t n0,
                                                          char *C0);

__device__ maco_status_t maco__pk_gemm_tile(const maco_pk_view_t *v, const maco_pk_task_t *t,
                                            uint32_t task)
{
    if (t->type != MACO_PK_GEMM_TILE ||
        (t->gemm.tile_n != MACO__PK_GEMM_TN && t->gemm.tile_n != 2 * MACO__PK_GEMM_TN)) {
        if (threadIdx.x == 0)
            maco__pk_record(v, MACO_ERR_INVALID_ARGUMENT, (int)task, MACO_DEVICE_ERR_TASK_TYPE,
                            t->type, 0);
        return MACO_ERR_INVALID_ARGUMENT;
    }
    const uint32_t n0 = (uint32_t)(t->ptr[3] >> 32);
    const uint32_t esz = t->dtype == MACO__PK_BF16 ? 2u : 4u;
    for (uint32_t h = 0; h < t->gemm.tile_n; h += MACO__PK_GEMM_TN)
        maco__pk_gemm_half(t, n0 + h, (char *)t->ptr[0] + (size_t)h * esz);
    return MACO_OK;
}

static __device__ __forceinline__ void maco__pk_gemm_half(const maco_pk_task_t *t, uint32_t n0,
                                                          char *C0)
{
    __shared__ __align__(128) __nv_bfloat16 smem[2 * (kStageA + kStageB)];
    const __nv_bfloat16 *A = (const __nv_bfloat16 *)t->ptr[1];
    const __nv_bfloat16 *B = (const __nv_bfloat16 *)t->ptr[2];
    const uint32_t K = (uint32_t)t->count, N = (uint32_t)(t->count >> 32), ldc = t->aux;
    const uint32_t m0 = (uint32_t)t->ptr[3];

    auto a_gmem = Blas::get_layout_gmem_a(K);
    auto b_gmem = Blas::get_layout_gmem_b(N);
    auto a_smem_layout = Blas::suggest_layout_smem_a();
    auto b_smem_layout = Blas::suggest_layout_smem_b();
    static_assert(cublasdx::cosize(Blas::suggest_layout_smem_a()) <= kStageA &&
                      cublasdx::cosize(Blas::suggest_layout_smem_b()) <= kStageB,
                  "the stages hold cuBLASDx's suggested shared-memory tiles");
    auto partitioner = Blas::suggest_partitioner();
    auto acc = partitioner.make_accumulator_fragment();
    cublasdx::clear(acc);

    const uint32_t steps = K / MACO__PK_GEMM_TK;
    auto load = [&](uint32_t step, int stage) {
        auto ga =
            cublasdx::make_tensor(A + (size_t)m0 * K + (size_t)step * MACO__PK_GEMM_TK, a_gmem);
        auto gb = cublasdx::make_tensor(B + (size_t)step * MACO__PK_GEMM_TK * N + n0, b_gmem);
        auto sa = cublasdx::make_tensor(smem + stage * (kStageA + kStageB), a_smem_layout);
        auto sb =
            cublasdx::make_tensor(smem + stage * (kStageA + kStageB) + kStageA, b_smem_layout);
        cublasdx::copy<Blas, 16>(ga, sa);
        cublasdx::copy<Blas, 16>(gb, sb);
    };
    __syncthreads(); /* the previous tile of this CTA is done with the stages */
    load(0, 0);
    for (uint32_t s = 0; s < steps; s++) {
        int stage = (int)(s & 1u);
        cublasdx::copy_wait(); /* step s is in shared memory (and a barrier) */
        if (s + 1 < steps)
            load(s + 1, stage ^ 1);
        auto sa = cublasdx::make_tensor(smem + stage * (kStageA + kStageB), a_smem_layout);
        auto sb =
            cublasdx::make_tensor(smem + stage * (kStageA + kStageB) + kStageA, b_smem_layout);
        Blas().execute(sa, sb, acc);
        __syncthreads(); /* every warp is done with this stage before it is refilled */
    }
    auto c_gmem = Blas::get_layout_gmem_c(ldc);
    if (t->dtype == MACO__PK_BF16) {
        __nv_bfloat16 *C = (__nv_bfloat16 *)C0;
        auto out = cublasdx::make_fragment_like<__nv_bfloat16>(acc);
        cublasdx::transform(acc, out, [](float x) { return __float2bfloat16_rn(x); });
        auto gc = cublasdx::make_tensor(C, c_gmem);
        cublasdx::copy_fragment<16>(out, gc, partitioner);
    } else {
        float *C = (float *)C0;
        auto gc = cublasdx::make_tensor(C, c_gmem);
        cublasdx::copy_fragment<16>(acc, gc, partitioner);
    }
}

__global__ void __launch_bounds__(MACO__PK_GEMM_THREADS, 1)
    maco__pk_gemm_kernel(maco_pk_view_t view)
{
    maco_pk_run(&view, maco__pk_gemm_tile);
}

extern "C" cudaError_t maco__pk_gemm_launch(const maco_pk_view_t *view, int grid,
                                            cudaStream_t stream)
{
    maco__pk_gemm_kernel<<<grid, MACO__PK_GEMM_THREADS, 0, stream>>>(*view);
    return cudaGetLastError();
}

extern "C" cudaError_t maco__pk_gemm_ctas_per_sm(int *ctas_p)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_p, maco__pk_gemm_kernel,
                                                         MACO__PK_GEMM_THREADS, 0);
}
