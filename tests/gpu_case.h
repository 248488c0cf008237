/*
 * gpu_case.h - base fixtures of the multi-process GPU tests. Both draw a random seed on rank 0
 * and share it with every rank (fresh per test).
 *   GpuCase (collectives): a non-blocking stream and two device counters (wrong count, first
 *     wrong index) for the perf_kernels.h checkers.
 *   ChannelCase (memory and port channels): a device wrong-byte counter for
 *     test_count_wrong_slot and one device status word per peer (at least 8) for the test
 *     kernels to report in.
 */
#ifndef MACO_GPU_CASE_H
#define MACO_GPU_CASE_H

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <random>

#include <vector>

#include "maco_test.h"
#include "test_kernels.h"

#ifndef CUDA_OK
#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
#endif

namespace maco_test
{

/* The LL kernels' largest message in bytes per rank, as the library takes it
 * (algorithms/common/setup.c): MACO_ALLREDUCE_ONESHOT_MAX when set (a plain number of bytes or one
 * with a K or M suffix, as the tests' scripts set it), else 1 MiB in a job of at most 2 ranks
 * and 256 KiB with more. */
inline size_t LLMax(int nranks)
{
    const char *v = getenv("MACO_ALLREDUCE_ONESHOT_MAX");
    if (v != nullptr && v[0] != '\0') {
        char *end = nullptr;
        size_t b = static_cast<size_t>(strtoull(v, &end, 10));
        if (end != nullptr && (*end == 'K' || *end == 'k'))
            b <<= 10;
        else if (end != nullptr && (*end == 'M' || *end == 'm'))
            b <<= 20;
        return (b + 15) / 16 * 16;
    }
    return nranks <= 2 ? static_cast<size_t>(1) << 20 : static_cast<size_t>(256) << 10;
}

/* Whether twoshot_ll takes `count` elements of `esz` bytes on n ranks (collectives.c:
 * blocks of whole 8-byte packets, none empty, each within LLMax(n)). */
inline bool TwoShotFits(size_t count, size_t esz, int n)
{
    size_t per = 8 / esz, nn = static_cast<size_t>(n);
    size_t b = ((count + nn - 1) / nn + per - 1) / per * per;
    return (nn - 1) * b < count && b * esz <= LLMax(n);
}

class GpuCase : public Test
{
  protected:
    void SetUp() override
    {
        Test::SetUp();
        seed_ = maco_test::SharedSeed();
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&counters_, 2 * sizeof(unsigned long long)), cudaSuccess);
    }
    void TearDown() override
    {
        cudaFree(counters_);
        cudaStreamDestroy(stream_);
        Test::TearDown();
    }

    /* The two counters (wrong count, first wrong index) once the stream's work is done;
     * asserts the communicator has no asynchronous error. Fatal failures: call it
     * inside ASSERT_NO_FATAL_FAILURE. */
    void ReadCounters(unsigned long long res[2])
    {
        CUDA_OK(
            cudaMemcpyAsync(res, counters_, 2 * sizeof(res[0]), cudaMemcpyDeviceToHost, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
        maco_status_t async_st;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
        ASSERT_EQ(async_st, MACO_OK) << maco_comm_get_last_error(Comm());
    }

    uint64_t seed_ = 0;
    cudaStream_t stream_ = nullptr;
    unsigned long long *counters_ = nullptr;
};

/* GpuCase with a send and a receive buffer (cudaMalloc) that grow on demand, each with kGuard
 * bytes before and after the part a call may touch. */
class BufferCase : public GpuCase
{
  protected:
    static constexpr size_t kGuard = 256;

    void TearDown() override
    {
        cudaFree(in_);
        cudaFree(out_);
        in_ = out_ = nullptr;
        cap_ = 0;
        GpuCase::TearDown();
    }

    /* Buffers of at least `bytes` each, plus the guards. */
    void Reserve(size_t bytes)
    {
        if (bytes <= cap_)
            return;
        cudaFree(in_);
        cudaFree(out_);
        in_ = out_ = nullptr;
        cap_ = bytes;
        CUDA_OK(cudaMalloc(&in_, cap_ + 2 * kGuard));
        CUDA_OK(cudaMalloc(&out_, cap_ + 2 * kGuard));
    }

    char *in_ = nullptr, *out_ = nullptr;
    size_t cap_ = 0;
};

class ChannelCase : public Test
{
  protected:
    void SetUp() override
    {
        Test::SetUp();
        seed_ = maco_test::SharedSeed();
        CUDA_OK(cudaMalloc(&counter_, sizeof(unsigned long long)));
        CUDA_OK(cudaMalloc(&status_, sizeof(int) * StatusWords()));
    }
    void TearDown() override
    {
        cudaFree(counter_);
        cudaFree(status_);
        Test::TearDown();
    }

    static size_t StatusWords()
    {
        return static_cast<size_t>(NRanks() < 8 ? 8 : NRanks());
    }

    /* Wrong bytes in a received slot (test_kernels.h, test_count_wrong_slot). */
    unsigned long long CountWrong(const char *slot, size_t slot_bytes, size_t skew, size_t size,
                                  uint64_t seed, uint64_t offset)
    {
        return test_count_wrong_slot(slot, slot_bytes, skew, size, seed, offset, counter_);
    }

    /* The status words the test kernels wrote, one per peer. */
    std::vector<int> Statuses()
    {
        std::vector<int> st(StatusWords(), -1);
        cudaMemcpy(st.data(), status_, st.size() * sizeof(int), cudaMemcpyDeviceToHost);
        return st;
    }

    uint64_t seed_ = 0;
    unsigned long long *counter_ = nullptr;
    int *status_ = nullptr;
};

} // namespace maco_test

#endif /* MACO_GPU_CASE_H */
