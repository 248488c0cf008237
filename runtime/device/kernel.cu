/*
 * kernel.cu - the library's persistent kernel: maco_pk_run with the built-in task
 * types only (maco/device/persistent.h says what each CTA does).
 */
#include "maco/device/persistent.h"
#include "runtime/device/launch.h"

__global__ void __launch_bounds__(MACO__PK_MAX_THREADS, 1) maco__pk_kernel(maco_pk_view_t view)
{
    maco_pk_run(&view, 0);
}

extern "C" cudaError_t maco__pk_launch(const maco_pk_view_t *view, int grid, int threads,
                                       cudaStream_t stream)
{
    maco__pk_kernel<<<grid, threads, 0, stream>>>(*view);
    return cudaGetLastError();
}

extern "C" cudaError_t maco__pk_ctas_per_sm(int threads, int *ctas_p)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_p, maco__pk_kernel, threads, 0);
}

#if !defined(MACO_HAVE_CUBLASDX)
extern "C" int maco__pk_gemm_available(void)
{
    return 0;
}

extern "C" cudaError_t maco__pk_gemm_launch(const maco_pk_view_t *view, int grid,
                                            cudaStream_t stream)
{
    return cudaErrorNotSupported;
}

extern "C" cudaError_t maco__pk_gemm_ctas_per_sm(int *ctas_p)
{
    return cudaErrorNotSupported;
}
#else
extern "C" int maco__pk_gemm_available(void)
{
    return 1;
}
#endif

#if !defined(MACO_HAVE_GEMM_GMMA)
extern "C" int maco__pk_gemm_gmma_built(void)
{
    return 0;
}

extern "C" cudaError_t maco__pk_gemm_gmma_launch(const maco_pk_view_t *view, int grid,
                                                 cudaStream_t stream)
{
    return cudaErrorNotSupported;
}

extern "C" cudaError_t maco__pk_gemm_gmma_ctas_per_sm(int *ctas_p)
{
    return cudaErrorNotSupported;
}

extern "C" size_t maco__pk_gemm_gmma_map_bytes(void)
{
    return 64;
}

extern "C" int maco__pk_gemm_gmma_map_encode(void *map, const void *a, const void *b, uint32_t m,
                                             uint32_t n, uint32_t k, uint32_t lda, uint32_t tile_n)
{
    return -1;
}
#else
extern "C" int maco__pk_gemm_gmma_built(void)
{
    return 1;
}
#endif
