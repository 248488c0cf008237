/*
 * sysmem.cuh - device code shared by the kernels that exchange data with a proxy through
 * pinned host memory mapped for the GPU (hier.cuh's rail buffer, internode_kernel.cu's slots):
 * reading what the proxy's CPU wrote while the kernel ran, and agreeing on a failure.
 */
#ifndef MACO_DEVICE_SYSMEM_CUH
#define MACO_DEVICE_SYSMEM_CUH

#include <stdint.h>

/*
 * Copies `bytes` from host memory that a proxy wrote while the kernel ran, with loads that
 * fetch it again: a GPU may keep lines of system memory in its L2, and PTX's ld.cv on system
 * memory discards such a line and reads the memory (PTX ISA, cache operators). Called by nthr
 * threads like maco_copy (maco/device/copy.h); src is 16-byte aligned.
 */
static __device__ __forceinline__ void
maco__copy_from_sysmem(char *dst, const char *src, uint64_t bytes, uint32_t tid, uint32_t nthr)
{
    const uint64_t nvec = ((uintptr_t)dst & 15u) == 0 ? bytes / 16 : 0;
    for (uint64_t i = tid; i < nvec; i += nthr)
        ((uint4 *)dst)[i] = __ldcv((const uint4 *)src + i);
    for (uint64_t i = nvec * 16 + tid; i < bytes; i += nthr)
        dst[i] = (char)__ldcv((const signed char *)src + i);
}

/* The CTA agrees on thread 0's `fail`: true in every thread when it failed. */
static __device__ __forceinline__ bool maco__cta_failed(bool fail)
{
    return __syncthreads_or(fail ? 1 : 0) != 0;
}

#endif /* MACO_DEVICE_SYSMEM_CUH */
