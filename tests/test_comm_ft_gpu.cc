/*
 * test_comm_ft_gpu.cc - revoke and shrink with GPU work (maco-run -n 3 or more; ranks may share
 * one GPU under MPS): the last rank leaves; an allreduce the others launch waits for it on the
 * device and ends when a watchdog thread revokes the communicator, long before
 * MACO_DEVICE_TIMEOUT; the survivors shrink and an allreduce on the new communicator is correct
 * (ctest gpu_comm_ft_3, gpu_comm_ft_4).
 */
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "maco/maco.h"
#include "maco_test.h"

namespace
{

using maco_test::Comm;
using maco_test::NRanks;
using maco_test::Rank;

class CommFtGpu : public maco_test::Test
{
};

/* Sum-allreduces `count` floats of value rank + 1 on `comm`; checks every element. */
void AllreduceAndCheck(maco_comm_t comm, size_t count, cudaStream_t stream)
{
    int n = 0, r = 0;
    maco_comm_get_nranks(comm, &n);
    maco_comm_get_rank(comm, &r);
    float *buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, count * sizeof(float)), cudaSuccess);
    std::vector<float> host(count, static_cast<float>(r + 1));
    ASSERT_EQ(cudaMemcpy(buf, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(maco_allreduce(buf, buf, count, MACO_FLOAT32, MACO_SUM, comm,
                             static_cast<maco_stream_t>(stream)),
              MACO_OK)
        << maco_comm_get_last_error(comm);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), buf, count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    const float want = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < count; i++)
        ASSERT_EQ(host[i], want) << "element " << i;
    cudaFree(buf);
}

TEST_F(CommFtGpu, RevokeEndsADeviceWaitOnADeadRankAndTheShrunkCommunicatorWorks)
{
    maco_test::AllowLog("");
    const int n = NRanks(), victim = n - 1;
    ASSERT_GE(n, 3) << "run with 3 or more ranks";
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    const size_t count = 1 << 16;
    ASSERT_NO_FATAL_FAILURE(AllreduceAndCheck(Comm(), count, stream));
    maco_bootstrap_t bs;
    maco_comm_get_bootstrap(Comm(), &bs);
    ASSERT_EQ(maco_bootstrap_barrier(bs), MACO_OK);
    if (Rank() == victim) {
        std::fflush(stdout);
        _exit(0); /* gone without a word; its kernels' peers wait for it */
    }
    float *buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, count * sizeof(float)), cudaSuccess);
    ASSERT_EQ(maco_allreduce(buf, buf, count, MACO_FLOAT32, MACO_SUM, Comm(),
                             static_cast<maco_stream_t>(stream)),
              MACO_OK);
    /* The watchdog: revokes after 500 ms, as an application's health check would. */
    auto t0 = std::chrono::steady_clock::now();
    std::thread watchdog([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        maco_comm_revoke(Comm());
    });
    cudaStreamSynchronize(stream);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    watchdog.join();
    maco_status_t async_st = MACO_OK;
    EXPECT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
    std::printf("rank %d: the waiting allreduce ended after %.2f s (%s): %s\n", Rank(), secs,
                maco_status_string(async_st), maco_comm_get_last_error(Comm()));
    EXPECT_NE(async_st, MACO_OK);
    /* MACO_DEVICE_TIMEOUT is 60 s here (ctest): ending within 30 s means the revoke did it. */
    EXPECT_LT(secs, 30.0);
    cudaFree(buf);
    maco_comm_t next = nullptr;
    ASSERT_EQ(maco_comm_shrink(Comm(), nullptr, 0, MACO_SHRINK_ABORT, &next), MACO_OK)
        << maco_log_last_error();
    int m = 0;
    maco_comm_get_nranks(next, &m);
    EXPECT_EQ(m, n - 1);
    ASSERT_NO_FATAL_FAILURE(AllreduceAndCheck(next, count, stream));
    maco_comm_destroy(next);
    cudaStreamDestroy(stream);
    std::fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0); /* the first communicator holds a dead rank */
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, true, true);
}
