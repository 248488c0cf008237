/*
 * scale.cu - the pre-multiply of ncclRedOpCreatePreMulSum ops (shim.h).
 *
 * NCCL's PreMulSum multiplies every rank's input by that rank's scalar (the scalars may
 * differ from rank to rank: nccl-tests' "mulsum" gives even ranks 1 and odd ranks 2), then
 * sums. MACO has no such op, so the library scales the input into a stream-ordered temporary
 * here and sums that with MACO_SUM (ops.c).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "shim.h"

namespace
{

template <typename T> struct Mul {
    __device__ static T apply(T x, T s)
    {
        return x * s;
    }
};
template <> struct Mul<__half> {
    __device__ static __half apply(__half x, __half s)
    {
        return __float2half_rn(__half2float(x) * __half2float(s));
    }
};
template <> struct Mul<__nv_bfloat16> {
    __device__ static __nv_bfloat16 apply(__nv_bfloat16 x, __nv_bfloat16 s)
    {
        return __float2bfloat16_rn(__bfloat162float(x) * __bfloat162float(s));
    }
};
template <> struct Mul<__nv_fp8_e4m3> {
    __device__ static __nv_fp8_e4m3 apply(__nv_fp8_e4m3 x, __nv_fp8_e4m3 s)
    {
        return __nv_fp8_e4m3(float(x) * float(s));
    }
};
template <> struct Mul<__nv_fp8_e5m2> {
    __device__ static __nv_fp8_e5m2 apply(__nv_fp8_e5m2 x, __nv_fp8_e5m2 s)
    {
        return __nv_fp8_e5m2(float(x) * float(s));
    }
};

template <typename T>
__global__ void maco_nccl_scale_kernel(T *dst, const T *src, size_t count, const T *device_scalar,
                                       T host_scalar)
{
    T s = device_scalar != nullptr ? *device_scalar : host_scalar;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        dst[i] = Mul<T>::apply(src[i], s);
}

template <typename T>
cudaError_t launch(void *dst, const void *src, size_t count, const void *device_scalar,
                   const void *host_scalar, cudaStream_t stream)
{
    T hs;
    memset(&hs, 0, sizeof(hs));
    if (host_scalar != nullptr)
        memcpy(&hs, host_scalar, sizeof(T));
    size_t blocks = (count + 255) / 256;
    if (blocks > 1024)
        blocks = 1024;
    maco_nccl_scale_kernel<T>
        <<<(unsigned)blocks, 256, 0, stream>>>(static_cast<T *>(dst), static_cast<const T *>(src),
                                               count, static_cast<const T *>(device_scalar), hs);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t maco_nccl__scale(void *dst, const void *src, size_t count,
                                        ncclDataType_t type, const void *device_scalar,
                                        const void *host_scalar, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    switch (type) {
    case ncclInt8:
        return launch<int8_t>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclUint8:
        return launch<uint8_t>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclInt32:
        return launch<int32_t>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclUint32:
        return launch<uint32_t>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclInt64:
        return launch<int64_t>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclUint64:
        return launch<uint64_t>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclFloat16:
        return launch<__half>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclFloat32:
        return launch<float>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclFloat64:
        return launch<double>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclBfloat16:
        return launch<__nv_bfloat16>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclFloat8e4m3:
        return launch<__nv_fp8_e4m3>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclFloat8e5m2:
        return launch<__nv_fp8_e5m2>(dst, src, count, device_scalar, host_scalar, stream);
    case ncclNumTypes:
        break;
    }
    return cudaErrorInvalidValue;
}
