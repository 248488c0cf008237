/*
 * launch.h - the library's persistent kernel (kernel.cu) behind two C
 * calls, for the runtime's host side (runtime/host/launch.c).
 */
#ifndef MACO_RUNTIME_LAUNCH_H
#define MACO_RUNTIME_LAUNCH_H

#include <cuda_runtime_api.h>

#include "maco/device/persistent.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most threads per CTA the kernel is compiled for (its __launch_bounds__). */
enum { MACO__PK_MAX_THREADS = 1024 };

/* GEMM tiles (gemm_cublasdx.cu, built with cuBLASDx where MathDx was found). A kernel with
 * GEMM tiles runs with MACO__PK_GEMM_THREADS threads per CTA. */
enum {
    MACO__PK_GEMM_TM = 128,
    MACO__PK_GEMM_TN = 128,
    MACO__PK_GEMM_TK = 32,
    MACO__PK_GEMM_THREADS = 256,
};

/* The Hopper GEMM tiles (gemm_gmma.cu: CUTLASS's SM90 TMA + GMMA warp-specialized
 * mainloop, built for sm_90a): a producer warpgroup and two consumer warpgroups per CTA,
 * MACO__PK_GEMM_GMMA_STAGES shared-memory stages of 48 KiB (a wide tile's 64-deep step of A and
 * B; a narrow tile uses 32 KiB of each), and at most this dynamic shared memory (the stages,
 * the mbarriers, the task ring and 1 KiB of alignment). At most MACO__PK_GEMM_MAPS_MAX distinct
 * GEMMs (A, B, M, N, K, tile width) per graph (the descriptor's u16 gemm.map). */
enum {
    MACO__PK_GEMM_GMMA_THREADS = 384,
    MACO__PK_GEMM_GMMA_STAGES = 4,
    MACO__PK_GEMM_GMMA_SMEM = MACO__PK_GEMM_GMMA_STAGES * 49152 + 2048,
    MACO__PK_GEMM_MAPS_MAX = 65535,
};

/** 1 when the library was built with cuBLASDx (the GEMM kernel exists), else 0. */
int maco__pk_gemm_available(void);

/** As maco__pk_launch and maco__pk_ctas_per_sm, for the kernel with GEMM tiles. */
cudaError_t maco__pk_gemm_launch(const maco_pk_view_t *view, int grid, cudaStream_t stream);
cudaError_t maco__pk_gemm_ctas_per_sm(int *ctas_p);

/** 1 when the library has the GMMA kernel (built for sm_90a), else 0. */
int maco__pk_gemm_gmma_built(void);

/** As maco__pk_gemm_launch and maco__pk_gemm_ctas_per_sm, for the GMMA kernel (of
 * MACO__PK_GEMM_GMMA_THREADS threads per CTA). The latter also sets the kernel's dynamic shared
 * memory limit, and fails where the current device cannot run sm_90a code. */
cudaError_t maco__pk_gemm_gmma_launch(const maco_pk_view_t *view, int grid, cudaStream_t stream);
cudaError_t maco__pk_gemm_gmma_ctas_per_sm(int *ctas_p);

/** Bytes of one GEMM's entry of view.gemm_maps for the GMMA kernel (a multiple of 64). */
size_t maco__pk_gemm_gmma_map_bytes(void);

/** Encodes the TMA tensor maps of C = A B (A M x K with row stride lda >= K, B K x N with row
 * stride N, bf16 in device memory) for tiles of tile_n (128 or 256) columns into `map`
 * (maco__pk_gemm_gmma_map_bytes() bytes, 64-byte aligned host memory; the entry is copied to
 * device memory as is). lda > K: A is a slice of K of a wider matrix (split-K). 0, or -1 when A
 * or B is not 16-byte aligned, a row is not a multiple of 16 bytes, lda < K or tile_n is neither
 * width. Host only; needs no device work. */
int maco__pk_gemm_gmma_map_encode(void *map, const void *a, const void *b, uint32_t m, uint32_t n,
                                  uint32_t k, uint32_t lda, uint32_t tile_n);

/** Launches the kernel: `grid` CTAs of `threads` threads run the graph of `view`. */
cudaError_t maco__pk_launch(const maco_pk_view_t *view, int grid, int threads, cudaStream_t stream);

/** How many CTAs of `threads` threads of the kernel fit on one SM at once. */
cudaError_t maco__pk_ctas_per_sm(int threads, int *ctas_p);

#ifdef __cplusplus
}
#endif

#endif /* MACO_RUNTIME_LAUNCH_H */
