/*
 * test_nccl_mp.cc - libmaco_nccl.so's communicators across processes, through nccl.h only,
 * under maco-run (no GPU needed): creation from an NCCL_COMM_ID address (every rank makes the
 * same id), blocking and non-blocking; ncclCommSplit with colors, keys and NCCL_SPLIT_NOCOLOR;
 * ncclCommShrink called by the staying ranks only; last, a rank dies and the survivors' blocked
 * and later calls return ncclRemoteError naming it, and ncclCommGetAsyncError says so.
 * Each check is made on every rank, in the same order.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace
{

int g_rank, g_nranks, g_local_rank, g_ndev;
ncclComm_t g_world;

std::string LastError()
{
    return ncclGetLastError(nullptr);
}

void WaitReady(ncclComm_t c)
{
    ncclResult_t async = ncclInProgress;
    for (int i = 0; i < 60000 && async == ncclInProgress; i++) {
        ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
        if (async == ncclInProgress)
            usleep(1000);
    }
    ASSERT_EQ(async, ncclSuccess) << LastError();
}

TEST(NcclMp, WorldFromNcclCommId)
{
    int n = 0, r = -1;
    ASSERT_EQ(ncclCommCount(g_world, &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(g_world, &r), ncclSuccess);
    EXPECT_EQ(n, g_nranks);
    EXPECT_EQ(r, g_rank);
}

TEST(NcclMp, SplitByColorAndKey)
{
    /* Two colors by parity; keys reverse the order inside each. */
    ncclComm_t sub = nullptr;
    ASSERT_EQ(ncclCommSplit(g_world, g_rank % 2, -g_rank, &sub, nullptr), ncclSuccess)
        << LastError();
    ASSERT_NE(sub, nullptr);
    int n = 0, r = -1;
    ASSERT_EQ(ncclCommCount(sub, &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(sub, &r), ncclSuccess);
    int same = (g_nranks - (g_rank % 2) + 1) / 2; /* ranks with my parity */
    EXPECT_EQ(n, same);
    /* Ranks of my parity above me come first (smaller keys). */
    int above = 0;
    for (int q = g_rank + 2; q < g_nranks; q += 2)
        above++;
    EXPECT_EQ(r, above);
    /* A split of the split: everyone in one color, equal keys keep the parent order. */
    ncclComm_t subsub = nullptr;
    ASSERT_EQ(ncclCommSplit(sub, 0, 0, &subsub, nullptr), ncclSuccess) << LastError();
    int r2 = -1;
    ASSERT_EQ(ncclCommUserRank(subsub, &r2), ncclSuccess);
    EXPECT_EQ(r2, r);
    EXPECT_EQ(ncclCommDestroy(subsub), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(sub), ncclSuccess);
}

TEST(NcclMp, SplitNoColorGivesNullAndOthersGoOn)
{
    ncclComm_t sub = reinterpret_cast<ncclComm_t>(0x1);
    int color = g_rank == 0 ? NCCL_SPLIT_NOCOLOR : 5;
    ASSERT_EQ(ncclCommSplit(g_world, color, 0, &sub, nullptr), ncclSuccess) << LastError();
    if (g_rank == 0) {
        EXPECT_EQ(sub, nullptr);
        return;
    }
    ASSERT_NE(sub, nullptr);
    int n = 0, r = -1;
    ASSERT_EQ(ncclCommCount(sub, &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(sub, &r), ncclSuccess);
    EXPECT_EQ(n, g_nranks - 1);
    EXPECT_EQ(r, g_rank - 1);
    EXPECT_EQ(ncclCommDestroy(sub), ncclSuccess);
}

TEST(NcclMp, NonBlockingSplit)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "nonblocking-split";
    ncclComm_t sub = nullptr;
    ncclResult_t res = ncclCommSplit(g_world, 0, g_rank, &sub, &cfg);
    ASSERT_TRUE(res == ncclSuccess || res == ncclInProgress) << LastError();
    ASSERT_NE(sub, nullptr);
    WaitReady(sub);
    int n = 0;
    EXPECT_EQ(ncclCommCount(sub, &n), ncclSuccess);
    EXPECT_EQ(n, g_nranks);
    EXPECT_EQ(ncclCommDestroy(sub), ncclSuccess);
}

TEST(NcclMp, ShrinkByTheStayingRanksOnly)
{
    if (g_nranks < 2)
        GTEST_SKIP() << "needs 2 ranks";
    int excluded = g_nranks - 1;
    ncclComm_t small = nullptr;
    if (g_rank != excluded) {
        ASSERT_EQ(ncclCommShrink(g_world, &excluded, 1, &small, nullptr, NCCL_SHRINK_DEFAULT),
                  ncclSuccess)
            << LastError();
        int n = 0, r = -1;
        ASSERT_EQ(ncclCommCount(small, &n), ncclSuccess);
        ASSERT_EQ(ncclCommUserRank(small, &r), ncclSuccess);
        EXPECT_EQ(n, g_nranks - 1);
        EXPECT_EQ(r, g_rank);
        EXPECT_EQ(ncclCommDestroy(small), ncclSuccess);
    } else {
        /* The excluded rank may not take part. */
        EXPECT_EQ(ncclCommShrink(g_world, &excluded, 1, &small, nullptr, NCCL_SHRINK_DEFAULT),
                  ncclInvalidArgument);
        EXPECT_NE(LastError().find("excludeRanksList"), std::string::npos) << LastError();
    }
    int bad = g_nranks;
    EXPECT_EQ(ncclCommShrink(g_world, &bad, 1, &small, nullptr, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommShrink(g_world, &bad, 1, &small, nullptr, 4), ncclInvalidArgument);
    EXPECT_NE(LastError().find("shrinkFlags"), std::string::npos) << LastError();
}

/* Each rank on the GPU of its local rank (main() sets it before ncclCommInitRank, as NCCL
 * programs do), so ranks share a GPU only where there are fewer GPUs than ranks (and maco-run
 * started MPS for them). */
TEST(NcclMp, EachRankUsesTheGpuOfItsLocalRank)
{
    int dev = -1;
    ASSERT_EQ(ncclCommCuDevice(g_world, &dev), ncclSuccess);
    if (g_ndev == 0) {
        EXPECT_EQ(dev, -1);
        GTEST_SKIP() << "no GPU";
    }
    EXPECT_EQ(dev, g_local_rank % g_ndev)
        << "rank " << g_rank << ", local rank " << g_local_rank << ", " << g_ndev << " GPUs";
}

/* A barrier over g_world for the GPU test: a split whose colors are all NOCOLOR exchanges
 * over the bootstrap only. */
void Barrier()
{
    ncclComm_t none = nullptr;
    ASSERT_EQ(ncclCommSplit(g_world, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr), ncclSuccess)
        << LastError();
}

/* ncclCommAbort with a kernel in flight that waits on peers which never come: it returns
 * promptly (maco_comm_abort stops the waits) instead of after MACO_DEVICE_TIMEOUT. */
TEST(NcclMp, AbortStopsAKernelBlockedOnPeers)
{
    int dev = -1;
    ASSERT_EQ(ncclCommCuDevice(g_world, &dev), ncclSuccess);
    if (dev < 0)
        GTEST_SKIP() << "no GPU";
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclCommSplit(g_world, 0, 0, &c, nullptr), ncclSuccess) << LastError();
    const size_t n = size_t(1) << 20;
    float *d = nullptr;
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(d, 0, n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    /* Every rank once, so that the communicator's setup for this buffer is done. */
    ASSERT_EQ(ncclAllReduce(d, d, n, ncclFloat, ncclSum, c, s), ncclSuccess) << LastError();
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(Barrier());
    if (g_rank == 0) {
        /* Alone: its kernel waits for the others. */
        ASSERT_EQ(ncclAllReduce(d, d, n, ncclFloat, ncclSum, c, s), ncclSuccess) << LastError();
        usleep(300 * 1000);
        EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the kernel did not wait";
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_EQ(ncclCommAbort(c), ncclSuccess) << LastError();
        EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("rank 0: ncclCommAbort with an allreduce in flight returned and the stream "
               "drained in %.3f s (MACO_DEVICE_TIMEOUT=%s)\n",
               took, getenv("MACO_DEVICE_TIMEOUT") ? getenv("MACO_DEVICE_TIMEOUT") : "default");
        EXPECT_LT(took, 5.0);
    }
    ASSERT_NO_FATAL_FAILURE(Barrier());
    if (g_rank != 0) {
        EXPECT_EQ(ncclCommAbort(c), ncclSuccess) << LastError();
    }
    cudaStreamDestroy(s);
    cudaFree(d);
}

/* ncclCommAbort on one rank ends the peers' kernels that wait for it through the revoke it
 * sends, not at MACO_DEVICE_TIMEOUT (100 s in ctest): the peers poll ncclCommGetAsyncError while
 * they wait, as PyTorch's watchdog and its non-blocking waits do. */
TEST(NcclMp, AbortOnOneRankEndsThePeersWaits)
{
    int dev = -1;
    ASSERT_EQ(ncclCommCuDevice(g_world, &dev), ncclSuccess);
    if (dev < 0)
        GTEST_SKIP() << "no GPU";
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclCommSplit(g_world, 0, 0, &c, nullptr), ncclSuccess) << LastError();
    const size_t n = size_t(1) << 20;
    float *d = nullptr;
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(ncclAllReduce(d, d, n, ncclFloat, ncclSum, c, s), ncclSuccess) << LastError();
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(Barrier());
    if (g_rank == 0) {
        usleep(300 * 1000); /* the others' kernels wait for this rank */
        EXPECT_EQ(ncclCommAbort(c), ncclSuccess) << LastError();
    } else {
        ASSERT_EQ(ncclAllReduce(d, d, n, ncclFloat, ncclSum, c, s), ncclSuccess) << LastError();
        auto t0 = std::chrono::steady_clock::now();
        ncclResult_t async = ncclSuccess;
        while (cudaStreamQuery(s) == cudaErrorNotReady &&
               std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
            ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
            usleep(1000);
        }
        double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
        printf("rank %d: the peer's abort ended this rank's waiting allreduce after %.3f s (%s)\n",
               g_rank, took, ncclGetErrorString(async));
        EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
        EXPECT_EQ(async, ncclRemoteError);
        EXPECT_LT(took, 10.0);
        EXPECT_EQ(ncclCommAbort(c), ncclSuccess) << LastError();
    }
    ASSERT_NO_FATAL_FAILURE(Barrier());
    cudaStreamDestroy(s);
    cudaFree(d);
}

/* Last: its dead rank ends the job for everything after it. */
TEST(NcclMp, ZDeadPeerFailsBlockedAndLaterCallsWithRemoteError)
{
    if (g_nranks < 3)
        GTEST_SKIP() << "needs 3 ranks (two survivors)";
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclCommSplit(g_world, 0, 0, &c, nullptr), ncclSuccess) << LastError();
    const int victim = g_nranks - 1;
    if (g_rank == victim) {
        fflush(stdout);
        _exit(0); /* dies without a word; exit status 0 so that maco-run lets the others go on */
    }
    /* A call that blocks on the dead rank: the split's exchange of colors. */
    ncclComm_t sub = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ncclCommSplit(c, 0, 0, &sub, nullptr), ncclRemoteError);
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 30.0) << "the dead peer was noticed only at a deadline";
    std::string why = ncclGetLastError(c);
    EXPECT_NE(why.find("rank " + std::to_string(victim)), std::string::npos) << why;
    ncclResult_t async = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_EQ(async, ncclRemoteError);
    /* Later calls fail at once, with the same cause. */
    t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ncclCommSplit(c, 1, 0, &sub, nullptr), ncclRemoteError);
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 1.0);
    why = ncclGetLastError(c);
    EXPECT_NE(why.find("rank " + std::to_string(victim)), std::string::npos) << why;
    /* Abort returns at once. */
    t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess) << LastError();
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 2.0);
}

} // namespace

int main(int argc, char **argv)
{
    ::testing::InitGoogleTest(&argc, argv);
    const char *rank = getenv("MACO_RANK"), *size = getenv("MACO_WORLD_SIZE");
    const char *addr = getenv("MACO_BOOTSTRAP_ADDR");
    if (rank == nullptr || size == nullptr || addr == nullptr) {
        fprintf(stderr, "run under maco-run (needs MACO_RANK, MACO_WORLD_SIZE, "
                        "MACO_BOOTSTRAP_ADDR)\n");
        return 2;
    }
    g_rank = atoi(rank);
    g_nranks = atoi(size);
    /* As an NCCL program does: ncclCommInitRank takes the calling thread's current device, so
     * pick this rank's GPU by local rank first. Without it every rank used GPU 0, which works
     * only where maco-run starts MPS (fewer GPUs than ranks): 3 ranks on 4 GPUs got no MPS and
     * their collectives were refused ("ranks 0 and 1 use the same GPU and neither is an MPS
     * client"). */
    g_ndev = 0;
    if (cudaGetDeviceCount(&g_ndev) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: a CPU-only run */
        g_ndev = 0;
    }
    const char *local = getenv("MACO_LOCAL_RANK");
    g_local_rank = local != nullptr ? atoi(local) : g_rank;
    if (g_ndev > 0 && cudaSetDevice(g_local_rank % g_ndev) != cudaSuccess) {
        fprintf(stderr, "rank %d: cudaSetDevice(%d) failed\n", g_rank, g_local_rank % g_ndev);
        return 1;
    }
    /* Rank 0's address from maco-run as NCCL_COMM_ID: no id needs to travel. */
    setenv("NCCL_COMM_ID", addr, 1);
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess ||
        ncclCommInitRank(&g_world, g_nranks, id, g_rank) != ncclSuccess) {
        fprintf(stderr, "rank %d: creating the world failed: %s\n", g_rank, LastError().c_str());
        return 1;
    }
    int dev = -1;
    ncclCommCuDevice(g_world, &dev);
    if (dev < 0 && getenv("TEST_NCCL_NEEDS_GPU") != nullptr) {
        printf("SKIP: no GPU (TEST_NCCL_NEEDS_GPU is set)\n");
        ncclCommDestroy(g_world);
        return 77;
    }
    int rc = RUN_ALL_TESTS();
    ncclCommDestroy(g_world);
    return rc;
}
