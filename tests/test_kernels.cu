/* test_kernels.cu - see test_kernels.h. */
#include "test_kernels.h"

#include <cuda_runtime.h>

__global__ void test_fill_pattern_kernel(char *dst, size_t bytes, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (seed ^ (i * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
        dst[i] = (char)(uint8_t)((x >> 29) ^ (x >> 47));
    }
}

extern "C" cudaError_t test_fill_pattern(char *dst, size_t bytes, uint64_t seed,
                                         cudaStream_t stream)
{
    if (bytes == 0)
        return cudaSuccess;
    unsigned blocks = bytes / 256 + 1 > 1024 ? 1024u : (unsigned)(bytes / 256 + 1);
    test_fill_pattern_kernel<<<blocks, 256, 0, stream>>>(dst, bytes, seed);
    return cudaGetLastError();
}

__global__ void test_put_all_kernel(const maco_memory_channel_device_t *handles, int rank,
                                    uint64_t src_off, uint64_t dst_off, uint64_t bytes, int *status)
{
    int q = blockIdx.x;
    if (q == rank)
        return;
    __shared__ maco_memory_channel_device_t ch;
    if (threadIdx.x == 0)
        ch = handles[q];
    __syncthreads();
    maco_memory_channel_put(&ch, dst_off, src_off, bytes, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0) {
        maco_memory_channel_signal(&ch);
        status[q] = (int)maco_memory_channel_wait(&ch);
    }
}

extern "C" cudaError_t test_put_all(const maco_memory_channel_device_t *handles, int nranks,
                                    int rank, uint64_t src_off, uint64_t dst_off, uint64_t bytes,
                                    int *status, cudaStream_t stream)
{
    test_put_all_kernel<<<nranks, 512, 0, stream>>>(handles, rank, src_off, dst_off, bytes, status);
    return cudaGetLastError();
}

__global__ void test_ping_pong_kernel(const maco_memory_channel_device_t *handle, int iters,
                                      int initiator, int *status)
{
    maco_memory_channel_device_t ch = *handle;
    int st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++) {
        if (initiator) {
            maco_memory_channel_signal(&ch);
            st = (int)maco_memory_channel_wait(&ch);
        } else {
            st = (int)maco_memory_channel_wait(&ch);
            maco_memory_channel_signal(&ch);
        }
    }
    *status = st;
}

extern "C" cudaError_t test_ping_pong(const maco_memory_channel_device_t *handle, int iters,
                                      int initiator, int *status, cudaStream_t stream)
{
    test_ping_pong_kernel<<<1, 1, 0, stream>>>(handle, iters, initiator, status);
    return cudaGetLastError();
}

__global__ void test_wait_once_kernel(const maco_memory_channel_device_t *handle, int *status)
{
    maco_memory_channel_device_t ch = *handle;
    *status = (int)maco_memory_channel_wait(&ch);
}

extern "C" cudaError_t test_wait_once(const maco_memory_channel_device_t *handle, int *status,
                                      cudaStream_t stream)
{
    test_wait_once_kernel<<<1, 1, 0, stream>>>(handle, status);
    return cudaGetLastError();
}
