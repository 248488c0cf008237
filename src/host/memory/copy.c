/* copy.c - maco_mem_copy_batch: copies on the copy engines, many per call. */
#include <stdint.h>

#include "maco/memory.h"
#include "src/host/base/log.h"
#include "src/host/cuda/cuda_util.h"

/* The range [p, p + bytes) runs past the end of the address space. */
static int range_wraps(const void *p, size_t bytes)
{
    return (uintptr_t)p > UINTPTR_MAX - bytes;
}

/* Called only for ranges that do not wrap. */
static int ranges_overlap(const maco_mem_copy_t *c)
{
    uintptr_t d = (uintptr_t)c->dst, s = (uintptr_t)c->src;
    return d < s + c->bytes && s < d + c->bytes;
}

maco_status_t maco_mem_copy_batch(const maco_mem_copy_t *copies, size_t count, maco_stream_t stream)
{
    if (count == 0)
        return MACO_OK;
    if (copies == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_copy_batch: copies is NULL but count is %zu", count);
    if (count > MACO_MEM_COPY_BATCH_MAX)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_copy_batch: count %zu is above MACO_MEM_COPY_BATCH_MAX (%d)",
                           count, MACO_MEM_COPY_BATCH_MAX);
    for (size_t i = 0; i < count; i++) {
        const maco_mem_copy_t *c = &copies[i];
        if (c->bytes == 0)
            continue;
        if (c->dst == NULL || c->src == NULL)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                               "maco_mem_copy_batch: copies[%zu] has a NULL %s and %zu bytes", i,
                               c->dst == NULL ? "dst" : "src", c->bytes);
        if (range_wraps(c->dst, c->bytes) || range_wraps(c->src, c->bytes))
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                               "maco_mem_copy_batch: copies[%zu]: %zu bytes at %s %p run past the "
                               "end of the address space",
                               i, c->bytes, range_wraps(c->dst, c->bytes) ? "dst" : "src",
                               range_wraps(c->dst, c->bytes) ? c->dst : c->src);
        if (ranges_overlap(c))
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                               "maco_mem_copy_batch: copies[%zu]: its %zu bytes at src %p and "
                               "dst %p overlap",
                               i, c->bytes, c->src, c->dst);
    }
    for (size_t i = 0; i < count; i++) {
        const maco_mem_copy_t *c = &copies[i];
        if (c->bytes == 0)
            continue;
        cudaError_t e =
            cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDefault, (cudaStream_t)stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                               "maco_mem_copy_batch: cudaMemcpyAsync of copies[%zu] (%zu bytes, "
                               "%p to %p) failed: %s (%s); the %zu before it are enqueued",
                               i, c->bytes, c->src, c->dst, cudaGetErrorName(e),
                               cudaGetErrorString(e), i);
        }
    }
    return MACO_OK;
}
