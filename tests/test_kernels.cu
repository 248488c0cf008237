/* test_kernels.cu - see test_kernels.h. */
#include "test_kernels.h"

#include <cuda_runtime.h>

#include "maco/collectives.h"
#include "maco/device/sync.h"
#include "tools/perf_kernels.h"
#include "src/device/reduce.cuh" /* the kernels' arithmetic, for the reference reduction */

__global__ void test_fill_pattern_kernel(char *dst, size_t bytes, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes;
         i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = (char)test_pattern_byte(seed, i);
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

__global__ void test_mismatch_kernel(const char *p, size_t bytes, uint64_t seed, uint64_t off,
                                     unsigned long long *mismatches)
{
    unsigned long long bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes;
         i += (size_t)gridDim.x * blockDim.x) {
        bad += (uint8_t)p[i] != test_pattern_byte(seed, i + off);
    }
    for (int o = 16; o > 0; o >>= 1)
        bad += __shfl_down_sync(0xffffffffu, bad, o);
    if ((threadIdx.x & 31) == 0 && bad)
        atomicAdd(mismatches, bad);
}

extern "C" cudaError_t test_count_pattern_mismatch(const char *p, size_t bytes, uint64_t seed,
                                                   uint64_t pattern_offset,
                                                   unsigned long long *mismatches,
                                                   cudaStream_t stream)
{
    if (bytes == 0)
        return cudaSuccess;
    unsigned blocks = bytes / 256 + 1 > 2048 ? 2048u : (unsigned)(bytes / 256 + 1);
    test_mismatch_kernel<<<blocks, 256, 0, stream>>>(p, bytes, seed, pattern_offset, mismatches);
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

__global__ void test_get_all_kernel(const maco_memory_channel_device_t *handles, int rank,
                                    uint64_t src_off, uint64_t dst_off, uint64_t slot,
                                    uint64_t bytes)
{
    int q = blockIdx.x;
    if (q == rank)
        return;
    __shared__ maco_memory_channel_device_t ch;
    if (threadIdx.x == 0)
        ch = handles[q];
    __syncthreads();
    maco_memory_channel_get(&ch, dst_off + (uint64_t)q * slot, src_off + (uint64_t)q * slot, bytes,
                            threadIdx.x, blockDim.x);
}

extern "C" cudaError_t test_get_all(const maco_memory_channel_device_t *handles, int nranks,
                                    int rank, uint64_t src_off, uint64_t dst_off, uint64_t slot,
                                    uint64_t bytes, cudaStream_t stream)
{
    test_get_all_kernel<<<nranks, 512, 0, stream>>>(handles, rank, src_off, dst_off, slot, bytes);
    return cudaGetLastError();
}

__global__ void test_packets_kernel(const maco_memory_channel_device_t *handles, int nranks,
                                    int rank, uint64_t src_off, uint64_t pkt_off, uint64_t pkt_slot,
                                    uint64_t out_off, uint64_t out_slot, uint64_t bytes,
                                    uint32_t flag, int ll8, int *status)
{
    int q = blockIdx.x;
    if (q == rank)
        return;
    __shared__ maco_memory_channel_device_t ch;
    if (threadIdx.x == 0)
        ch = handles[q];
    __syncthreads();
    uint64_t parity = flag & 1u;
    uint64_t to_peer = pkt_off + (parity * (uint64_t)nranks + (uint64_t)rank) * pkt_slot;
    uint64_t from_peer = pkt_off + (parity * (uint64_t)nranks + (uint64_t)q) * pkt_slot;
    maco_status_t st;
    if (ll8) {
        maco_memory_channel_put_packets_ll8(&ch, to_peer, src_off, bytes, threadIdx.x, blockDim.x,
                                            flag);
        st = maco_memory_channel_unpack_packets_ll8(
            &ch, out_off + (uint64_t)q * out_slot, from_peer, bytes, threadIdx.x, blockDim.x, flag);
    } else {
        maco_memory_channel_put_packets_ll16(&ch, to_peer, src_off, bytes, threadIdx.x, blockDim.x,
                                             flag);
        st = maco_memory_channel_unpack_packets_ll16(
            &ch, out_off + (uint64_t)q * out_slot, from_peer, bytes, threadIdx.x, blockDim.x, flag);
    }
    int bad = __syncthreads_or(st != MACO_OK);
    if (threadIdx.x == 0)
        status[q] = bad ? (int)MACO_ERR_TIMEOUT : (int)MACO_OK;
}

extern "C" cudaError_t test_packets_round_trip(const maco_memory_channel_device_t *handles,
                                               int nranks, int rank, uint64_t src_off,
                                               uint64_t pkt_off, uint64_t pkt_slot,
                                               uint64_t out_off, uint64_t out_slot, uint64_t bytes,
                                               uint32_t flag, int ll8, int *status,
                                               cudaStream_t stream)
{
    test_packets_kernel<<<nranks, 256, 0, stream>>>(handles, nranks, rank, src_off, pkt_off,
                                                    pkt_slot, out_off, out_slot, bytes, flag, ll8,
                                                    status);
    return cudaGetLastError();
}

__global__ void test_grid_barrier_kernel(maco_grid_barrier_t *b, uint32_t *slots, int iters,
                                         maco_device_wait_bound_t bound, unsigned long long *errors,
                                         int *status)
{
    for (int it = 0; it < iters; it++) {
        if (threadIdx.x == 0)
            *(volatile uint32_t *)&slots[blockIdx.x] = ((uint32_t)it << 16) | blockIdx.x;
        maco_status_t st = maco_grid_barrier(b, gridDim.x, &bound);
        if (st != MACO_OK) {
            if (threadIdx.x == 0)
                atomicCAS(status, 0, (int)st);
            return;
        }
        for (unsigned k = threadIdx.x; k < gridDim.x; k += blockDim.x)
            if (*(volatile uint32_t *)&slots[k] != (((uint32_t)it << 16) | k))
                atomicAdd(errors, 1ull);
        st = maco_grid_barrier(b, gridDim.x, &bound);
        if (st != MACO_OK) {
            if (threadIdx.x == 0)
                atomicCAS(status, 0, (int)st);
            return;
        }
    }
}

extern "C" cudaError_t test_grid_barrier(void *barrier, uint32_t *slots, int nblocks, int iters,
                                         const maco_device_wait_bound_t *bound,
                                         unsigned long long *errors, int *status,
                                         cudaStream_t stream)
{
    test_grid_barrier_kernel<<<nblocks, 128, 0, stream>>>((maco_grid_barrier_t *)barrier, slots,
                                                          iters, *bound, errors, status);
    return cudaGetLastError();
}

__global__ void test_device_semaphore_kernel(maco_device_semaphore_t *s,
                                             unsigned long long *counter, int iters,
                                             maco_device_wait_bound_t bound, int *status)
{
    if (threadIdx.x != 0)
        return;
    for (int i = 0; i < iters; i++) {
        maco_status_t st = maco_device_semaphore_acquire(s, &bound);
        if (st != MACO_OK) {
            atomicCAS(status, 0, (int)st);
            return;
        }
        unsigned long long v = *(volatile unsigned long long *)counter;
        *(volatile unsigned long long *)counter = v + 1;
        maco_device_semaphore_release(s);
    }
}

extern "C" cudaError_t test_device_semaphore(void *sem, unsigned long long *counter, int nblocks,
                                             int iters, const maco_device_wait_bound_t *bound,
                                             int *status, cudaStream_t stream)
{
    test_device_semaphore_kernel<<<nblocks, 32, 0, stream>>>((maco_device_semaphore_t *)sem,
                                                             counter, iters, *bound, status);
    return cudaGetLastError();
}

__global__ void test_port_put_all_kernel(const maco_port_channel_device_t *handles, int rank,
                                         uint64_t src_off, uint64_t dst_off, uint64_t bytes,
                                         int flush_only, int *status)
{
    int q = blockIdx.x;
    if (q == rank || threadIdx.x != 0)
        return;
    maco_port_channel_device_t ch = handles[q];
    maco_status_t st;
    if (flush_only) {
        st = maco_port_channel_put(&ch, dst_off, src_off, bytes);
        if (st == MACO_OK)
            st = maco_port_channel_flush(&ch);
    } else {
        st = maco_port_channel_put_with_signal(&ch, dst_off, src_off, bytes);
        if (st == MACO_OK)
            st = maco_port_channel_wait(&ch);
    }
    status[q] = (int)st;
}

extern "C" cudaError_t test_port_put_all(const maco_port_channel_device_t *handles, int nranks,
                                         int rank, uint64_t src_off, uint64_t dst_off,
                                         uint64_t bytes, int flush_only, int *status,
                                         cudaStream_t stream)
{
    test_port_put_all_kernel<<<nranks, 32, 0, stream>>>(handles, rank, src_off, dst_off, bytes,
                                                        flush_only, status);
    return cudaGetLastError();
}

__global__ void test_port_many_ctas_kernel(const maco_port_channel_device_t *handles, int nranks,
                                           int rank, uint64_t base, uint64_t bytes, unsigned *done,
                                           int *status)
{
    uint64_t share = (bytes / gridDim.x + 15) / 16 * 16;
    uint64_t start = share * blockIdx.x;
    uint64_t len = start < bytes ? min(share, bytes - start) : 0;
    /* Thread q pushes this CTA's share to peer q: many pushers at once. */
    int q = (int)threadIdx.x;
    if (q < nranks && q != rank && len > 0) {
        maco_port_channel_device_t ch = handles[q];
        maco_status_t st = maco_port_channel_put(&ch, base + start, base + start, len);
        if (st != MACO_OK)
            atomicCAS(&status[q], 0, (int)st);
    }
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    /* Every CTA's pushes happened before its count; the last CTA's signal comes after all. */
    if (last && q < nranks && q != rank) {
        maco_port_channel_device_t ch = handles[q];
        maco_status_t st = maco_port_channel_signal(&ch);
        if (st != MACO_OK)
            atomicCAS(&status[q], 0, (int)st);
    }
    if (blockIdx.x == 0 && q < nranks && q != rank) {
        maco_port_channel_device_t ch = handles[q];
        maco_status_t st = maco_port_channel_wait(&ch);
        if (st != MACO_OK)
            atomicCAS(&status[q], 0, (int)st);
    }
}

extern "C" cudaError_t test_port_many_ctas(const maco_port_channel_device_t *handles, int nranks,
                                           int rank, uint64_t base, uint64_t bytes, int nblocks,
                                           unsigned *done, int *status, cudaStream_t stream)
{
    test_port_many_ctas_kernel<<<nblocks, 32, 0, stream>>>(handles, nranks, rank, base, bytes, done,
                                                           status);
    return cudaGetLastError();
}

__global__ void test_port_flush_loop_kernel(const maco_port_channel_device_t *handle, int iters,
                                            uint64_t bytes, int *status, int *rounds)
{
    maco_port_channel_device_t ch = *handle;
    maco_status_t st = MACO_OK;
    int i = 0;
    for (; i < iters && st == MACO_OK; i++) {
        st = maco_port_channel_put(&ch, 0, 0, bytes);
        if (st == MACO_OK)
            st = maco_port_channel_flush(&ch);
    }
    *status = (int)st;
    *rounds = st == MACO_OK ? i : i - 1;
}

extern "C" cudaError_t test_port_flush_loop(const maco_port_channel_device_t *handle, int iters,
                                            uint64_t bytes, int *status, int *rounds,
                                            cudaStream_t stream)
{
    test_port_flush_loop_kernel<<<1, 1, 0, stream>>>(handle, iters, bytes, status, rounds);
    return cudaGetLastError();
}

__global__ void test_port_push_only_kernel(const maco_port_channel_device_t *handle, int pushes,
                                           int *status)
{
    maco_port_channel_device_t ch = *handle;
    maco_status_t st = MACO_OK;
    for (int i = 0; i < pushes && st == MACO_OK; i++)
        st = maco_port_channel_put(&ch, 0, 0, 64);
    *status = (int)st;
}

extern "C" cudaError_t test_port_push_only(const maco_port_channel_device_t *handle, int pushes,
                                           int *status, cudaStream_t stream)
{
    test_port_push_only_kernel<<<1, 1, 0, stream>>>(handle, pushes, status);
    return cudaGetLastError();
}

extern "C" unsigned long long test_count_wrong_slot(const char *slot, size_t slot_bytes,
                                                    size_t skew, size_t size, uint64_t seed,
                                                    uint64_t offset, unsigned long long *counter)
{
    unsigned long long zero = 0, wrong = ~0ull;
    if (cudaMemcpy(counter, &zero, sizeof(zero), cudaMemcpyHostToDevice) != cudaSuccess ||
        maco_perf_check_bytes(slot, skew, 0xAB, counter, nullptr) != cudaSuccess ||
        test_count_pattern_mismatch(slot + skew, size, seed, offset, counter, nullptr) !=
            cudaSuccess ||
        maco_perf_check_bytes(slot + skew + size, slot_bytes - skew - size, 0xAB, counter,
                              nullptr) != cudaSuccess ||
        cudaMemcpy(&wrong, counter, sizeof(wrong), cudaMemcpyDeviceToHost) != cudaSuccess)
        return ~0ull;
    return wrong;
}

/* Polls `done()` up to `limit` times; 1 when it became true. */
#define TEST_POLL(cond, limit, ok)                                                                 \
    do {                                                                                           \
        ok = 0;                                                                                    \
        for (long long n_ = 0; n_ < (limit); n_++)                                                 \
            if (cond) {                                                                            \
                ok = 1;                                                                            \
                break;                                                                             \
            }                                                                                      \
    } while (0)

__global__ void test_channel_element_ops_kernel(const maco_memory_channel_device_t *handles,
                                                int rank, int *status)
{
    int q = blockIdx.x;
    if (q == rank || threadIdx.x != 0)
        return;
    maco_memory_channel_device_t ch = handles[q];
    uint64_t w64 = 0x1000000000000000ull | ((uint64_t)rank << 8) | (uint64_t)q;
    uint32_t w32 = 0x5000u + (uint32_t)rank * 16u + (uint32_t)q;
    maco_memory_channel_write_u64(&ch, (uint64_t)rank * 16, w64);
    maco_memory_channel_write_u32(&ch, (uint64_t)rank * 16 + 8, w32);
    if (maco_memory_channel_read_u64(&ch, (uint64_t)rank * 16) != w64 ||
        maco_memory_channel_read_u32(&ch, (uint64_t)rank * 16 + 8) != w32) {
        status[q] = MACO_ERR_INTERNAL;
        return;
    }
    maco_memory_channel_signal(&ch);
    int ok;
    TEST_POLL(maco_memory_channel_poll(&ch), 1ll << 32, ok);
    if (!ok) {
        status[q] = MACO_ERR_TIMEOUT;
        return;
    }
    uint64_t want64 = 0x1000000000000000ull | ((uint64_t)q << 8) | (uint64_t)rank;
    uint32_t want32 = 0x5000u + (uint32_t)q * 16u + (uint32_t)rank;
    if (*(volatile uint64_t *)(ch.local + (uint64_t)q * 16) != want64 ||
        *(volatile uint32_t *)(ch.local + (uint64_t)q * 16 + 8) != want32) {
        status[q] = MACO_ERR_INTERNAL;
        return;
    }
    maco_memory_channel_relaxed_signal(&ch);
    status[q] = (int)maco_memory_channel_relaxed_wait(&ch);
}

extern "C" cudaError_t test_channel_element_ops(const maco_memory_channel_device_t *handles,
                                                int nranks, int rank, int *status,
                                                cudaStream_t stream)
{
    test_channel_element_ops_kernel<<<nranks, 32, 0, stream>>>(handles, rank, status);
    return cudaGetLastError();
}

__global__ void test_port_flush_and_poll_kernel(const maco_port_channel_device_t *handles, int rank,
                                                uint64_t src_off, uint64_t dst_off, uint64_t bytes,
                                                int *status)
{
    int q = blockIdx.x;
    if (q == rank || threadIdx.x != 0)
        return;
    maco_port_channel_device_t ch = handles[q];
    maco_status_t st = maco_port_channel_put_with_signal_and_flush(&ch, dst_off, src_off, bytes);
    if (st == MACO_OK) {
        int ok;
        TEST_POLL(maco_port_channel_poll(&ch), 1ll << 32, ok);
        st = ok ? MACO_OK : MACO_ERR_TIMEOUT;
    }
    status[q] = (int)st;
}

extern "C" cudaError_t test_port_flush_and_poll(const maco_port_channel_device_t *handles,
                                                int nranks, int rank, uint64_t src_off,
                                                uint64_t dst_off, uint64_t bytes, int *status,
                                                cudaStream_t stream)
{
    test_port_flush_and_poll_kernel<<<nranks, 32, 0, stream>>>(handles, rank, src_off, dst_off,
                                                               bytes, status);
    return cudaGetLastError();
}

__global__ void test_port_write_put_rounds_kernel(const maco_port_channel_device_t *handles,
                                                  int nranks, int rank, char *buf, uint64_t slot,
                                                  uint64_t bytes, int rounds, uint64_t seed,
                                                  unsigned long long *wrong, int *status)
{
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    maco_port_channel_device_t to_next = handles[next], to_prev = handles[prev];
    char *mine = buf + (uint64_t)rank * slot;
    const char *from_prev = buf + (uint64_t)prev * slot;
    uint64_t off = (uint64_t)rank * slot;
    __shared__ int st_sh;
    if (threadIdx.x == 0)
        st_sh = MACO_OK;
    unsigned long long bad = 0;
    for (int r = 0; r < rounds; r++) {
        uint64_t s_me = seed + (uint64_t)r * 64 + (uint64_t)rank;
        uint64_t s_prev = seed + (uint64_t)r * 64 + (uint64_t)prev;
        for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x)
            mine[i] = (char)test_pattern_byte(s_me, i);
        __syncthreads(); /* every thread's bytes before thread 0's push */
        if (threadIdx.x == 0) {
            maco_status_t st = MACO_OK;
            if (r % 3 == 0) {
                st = maco_port_channel_put_with_signal(&to_next, off, off, bytes);
            } else if (r % 3 == 1) {
                st = maco_port_channel_put(&to_next, off, off, bytes);
                if (st == MACO_OK)
                    st = maco_port_channel_signal(&to_next);
            } else {
                uint64_t q = bytes / 4 / 16 * 16;
                for (int k = 0; k < 4 && st == MACO_OK; k++) {
                    uint64_t o = (uint64_t)k * q, n = k == 3 ? bytes - o : q;
                    st = maco_port_channel_put(&to_next, off + o, off + o, n);
                }
                if (st == MACO_OK)
                    st = maco_port_channel_signal(&to_next);
            }
            if (st == MACO_OK)
                st = maco_port_channel_wait(&to_prev); /* prev's data has landed */
            st_sh = (int)st;
        }
        __syncthreads();
        if (st_sh != MACO_OK)
            break;
        for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x)
            bad += (uint8_t)from_prev[i] != test_pattern_byte(s_prev, i);
        __syncthreads(); /* every thread checked before the acknowledgement */
        if (threadIdx.x == 0) {
            maco_status_t st = maco_port_channel_signal(&to_prev);
            if (st == MACO_OK)
                st = maco_port_channel_wait(&to_next); /* next checked mine: reuse the source */
            st_sh = (int)st;
        }
        __syncthreads();
        if (st_sh != MACO_OK)
            break;
    }
    if (bad)
        atomicAdd(wrong, bad);
    if (threadIdx.x == 0)
        *status = st_sh;
}

extern "C" cudaError_t test_port_write_put_rounds(const maco_port_channel_device_t *handles,
                                                  int nranks, int rank, char *buf, uint64_t slot,
                                                  uint64_t bytes, int rounds, uint64_t seed,
                                                  unsigned long long *wrong, int *status,
                                                  cudaStream_t stream)
{
    test_port_write_put_rounds_kernel<<<1, 512, 0, stream>>>(handles, nranks, rank, buf, slot,
                                                             bytes, rounds, seed, wrong, status);
    return cudaGetLastError();
}

__device__ void test_store_bytes(char *p, uint64_t v, int bytes)
{
    for (int b = 0; b < bytes; b++) /* byte stores: the address may be misaligned */
        p[b] = (char)(v >> (8 * b));
}

__global__ void test_port_small_puts_kernel(const maco_port_channel_device_t *handles, int rank,
                                            char *buf, uint64_t slot, uint64_t seed, int clobber,
                                            int *status)
{
    int q = blockIdx.x;
    if (q == rank || threadIdx.x != 0)
        return;
    maco_port_channel_device_t ch = handles[q];
    uint64_t region = (uint64_t)rank * slot + (uint64_t)q * TEST_SMALL_REGION;
    maco_status_t st = MACO_OK;
    for (int k = 0; k < TEST_SMALL_CELLS && st == MACO_OK; k++) {
        uint64_t v = test_small_value(seed, rank, q, k);
        uint64_t cell = region + 16ull * (uint64_t)k;
        uint64_t scratch = region + TEST_SMALL_SCRATCH + 8ull * (uint64_t)k;
        int kind = k % 7;
        if (kind <= 3) {
            uint64_t at = cell + (kind == 0 ? 0 : kind == 1 ? 4 : kind == 2 ? 1 : 8);
            int bytes = (kind == 1 || kind == 3) ? 4 : 8;
            test_store_bytes(buf + at, v, bytes);
            st = maco_port_channel_put(&ch, at, at, (uint64_t)bytes);
            if (clobber && kind != 2)
                test_store_bytes(buf + at, ~v, bytes);
        } else if (kind == 6) {
            test_store_bytes(buf + cell + 8, v, 8);
            st = maco_port_channel_put(&ch, cell + 4, cell + 8, 8);
        } else {
            for (int b = 0; b < 16; b++)
                buf[cell + b] = (char)test_small_pattern(seed, rank, q, k, b);
            test_store_bytes(buf + scratch, v, 8);
            if (kind == 4) {
                st = maco_port_channel_put(&ch, cell, cell, 16);
                if (st == MACO_OK)
                    st = maco_port_channel_put(&ch, cell, scratch, 8);
            } else {
                st = maco_port_channel_put(&ch, cell, scratch, 8);
                if (st == MACO_OK)
                    st = maco_port_channel_put(&ch, cell, cell, 16);
            }
            if (clobber)
                test_store_bytes(buf + scratch, ~v, 8);
        }
    }
    if (st == MACO_OK) {
        uint64_t at = region + 16ull * TEST_SMALL_CELLS;
        uint64_t v = test_small_value(seed, rank, q, TEST_SMALL_CELLS);
        test_store_bytes(buf + at, v, 8);
        st = maco_port_channel_put_with_signal(&ch, at, at, 8);
        if (clobber)
            test_store_bytes(buf + at, 0, 8);
    }
    if (st == MACO_OK)
        st = maco_port_channel_wait(&ch);
    status[q] = (int)st;
}

extern "C" cudaError_t test_port_small_puts(const maco_port_channel_device_t *handles, int nranks,
                                            int rank, char *buf, uint64_t slot, uint64_t seed,
                                            int clobber, int *status, cudaStream_t stream)
{
    test_port_small_puts_kernel<<<nranks, 32, 0, stream>>>(handles, rank, buf, slot, seed, clobber,
                                                           status);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ reference reduction */

template <class T>
static void test_fold_typed(int op, const void *const *in, int n, size_t count, void *out)
{
    typedef typename T::bits B;
    const bool avg = op == MACO_AVG;
    const int rop = avg ? MACO__OP_SUM : op;
    for (size_t i = 0; i < count; i++) {
        typename T::acc acc = T::widen(((const B *)in[0])[i]);
        for (int q = 1; q < n; q++)
            acc = maco__combine<T, MACO__OP_RUNTIME>(acc, T::widen(((const B *)in[q])[i]), rop);
        if (avg)
            acc = T::div(acc, n);
        ((B *)out)[i] = T::narrow(acc);
    }
}

extern "C" int test_reference_fold(int datatype, int op, const void *const *in, int n, size_t count,
                                   void *out)
{
    switch (datatype) {
    case MACO_INT8:
        test_fold_typed<maco__t_i8>(op, in, n, count, out);
        return 0;
    case MACO_UINT8:
        test_fold_typed<maco__t_u8>(op, in, n, count, out);
        return 0;
    case MACO_INT32:
        test_fold_typed<maco__t_i32>(op, in, n, count, out);
        return 0;
    case MACO_UINT32:
        test_fold_typed<maco__t_u32>(op, in, n, count, out);
        return 0;
    case MACO_INT64:
        test_fold_typed<maco__t_i64>(op, in, n, count, out);
        return 0;
    case MACO_UINT64:
        test_fold_typed<maco__t_u64>(op, in, n, count, out);
        return 0;
    case MACO_FLOAT16:
        test_fold_typed<maco__t_f16>(op, in, n, count, out);
        return 0;
    case MACO_BFLOAT16:
        test_fold_typed<maco__t_bf16>(op, in, n, count, out);
        return 0;
    case MACO_FLOAT32:
        test_fold_typed<maco__t_f32>(op, in, n, count, out);
        return 0;
    case MACO_FLOAT64:
        test_fold_typed<maco__t_f64>(op, in, n, count, out);
        return 0;
    case MACO_FP8_E4M3:
        test_fold_typed<maco__t_e4m3>(op, in, n, count, out);
        return 0;
    case MACO_FP8_E5M2:
        test_fold_typed<maco__t_e5m2>(op, in, n, count, out);
        return 0;
    default:
        return -1;
    }
}

extern "C" void test_store_value(int datatype, double v, void *p)
{
    int64_t iv = (int64_t)(v * 50.0);
    switch (datatype) {
    case MACO_INT8:
        *(int8_t *)p = (int8_t)iv;
        break;
    case MACO_UINT8:
        *(uint8_t *)p = (uint8_t)iv;
        break;
    case MACO_INT32:
        *(int32_t *)p = (int32_t)iv;
        break;
    case MACO_UINT32:
        *(uint32_t *)p = (uint32_t)iv;
        break;
    case MACO_INT64:
        *(int64_t *)p = iv;
        break;
    case MACO_UINT64:
        *(uint64_t *)p = (uint64_t)iv;
        break;
    case MACO_FLOAT16:
        *(uint16_t *)p = maco__t_f16::narrow((float)v);
        break;
    case MACO_BFLOAT16:
        *(uint16_t *)p = maco__t_bf16::narrow((float)v);
        break;
    case MACO_FLOAT32:
        *(uint32_t *)p = maco__t_f32::narrow((float)v);
        break;
    case MACO_FLOAT64:
        *(uint64_t *)p = maco__t_f64::narrow(v);
        break;
    case MACO_FP8_E4M3:
        *(uint8_t *)p = maco__t_e4m3::narrow((float)v);
        break;
    default:
        *(uint8_t *)p = maco__t_e5m2::narrow((float)v);
        break;
    }
}
