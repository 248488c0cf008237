/*
 * maco/device/impl/copy.h - the bodies of what maco/device/copy.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_COPY_H
#define MACO_DEVICE_IMPL_COPY_H

static __device__ __forceinline__ void maco_copy(void *dst, const void *src, uint64_t bytes,
                                                 uint32_t tid, uint32_t nthreads)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    uintptr_t da = (uintptr_t)d, sa = (uintptr_t)s;
    if (((da ^ sa) & 15u) != 0) {
        for (uint64_t i = tid; i < bytes; i += nthreads)
            d[i] = s[i];
        return;
    }
    uint64_t head = (16u - (da & 15u)) & 15u;
    if (head > bytes)
        head = bytes;
    for (uint64_t i = tid; i < head; i += nthreads)
        d[i] = s[i];
    d += head;
    s += head;
    bytes -= head;
    uint64_t nvec = bytes / 16u;
    uint4 *dv = (uint4 *)d;
    const uint4 *sv = (const uint4 *)s;
    uint64_t i = tid;
    uint64_t stride = nthreads;
    for (; i + 3 * stride < nvec; i += 4 * stride) {
        uint4 v0 = sv[i];
        uint4 v1 = sv[i + stride];
        uint4 v2 = sv[i + 2 * stride];
        uint4 v3 = sv[i + 3 * stride];
        dv[i] = v0;
        dv[i + stride] = v1;
        dv[i + 2 * stride] = v2;
        dv[i + 3 * stride] = v3;
    }
    for (; i < nvec; i += stride)
        dv[i] = sv[i];
    for (uint64_t j = nvec * 16u + tid; j < bytes; j += nthreads)
        d[j] = s[j];
}

#endif /* MACO_DEVICE_IMPL_COPY_H */
