/*
 * gpu_case.h - base fixture of the collective GPU tests: a random seed drawn by rank 0 and
 * shared by every rank (fresh per test), a non-blocking stream and two device counters
 * (wrong count, first wrong index) for the perf_kernels.h checkers.
 */
#ifndef MACO_GPU_CASE_H
#define MACO_GPU_CASE_H

#include <cuda_runtime.h>

#include <cstdint>
#include <random>

#include "maco_test.h"

namespace maco_test
{

/* Whether twoshot_ll takes `count` elements of `esz` bytes on n ranks (collectives.c:
 * blocks of whole 8-byte packets, none empty, each within MACO_ALLREDUCE_ONESHOT_MAX's
 * default of 256 KiB). */
inline bool TwoShotFits(size_t count, size_t esz, int n)
{
    size_t per = 8 / esz, nn = static_cast<size_t>(n);
    size_t b = ((count + nn - 1) / nn + per - 1) / per * per;
    return (nn - 1) * b < count && b * esz <= 256 * 1024;
}

class GpuCase : public Test
{
  protected:
    void SetUp() override
    {
        Test::SetUp();
        if (Rank() == 0)
            seed_ = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
        ASSERT_EQ(maco_bootstrap_broadcast(Bootstrap(), 0, &seed_, sizeof(seed_)), MACO_OK);
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&counters_, 2 * sizeof(unsigned long long)), cudaSuccess);
    }
    void TearDown() override
    {
        cudaFree(counters_);
        cudaStreamDestroy(stream_);
        Test::TearDown();
    }

    uint64_t seed_ = 0;
    cudaStream_t stream_ = nullptr;
    unsigned long long *counters_ = nullptr;
};

} // namespace maco_test

#endif /* MACO_GPU_CASE_H */
