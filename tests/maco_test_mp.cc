/* maco_test_mp.cc - main() for test binaries that run under maco-run (or another launcher
 * MACO recognises: mpirun, srun, torchrun; docs/multi-node.md). */
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>

#include "maco_test.h"
#include "signal_storm.h"

namespace maco_test
{
namespace
{
maco_bootstrap_t g_bs;
maco_comm_t g_comm;
int g_rank, g_nranks;
} // namespace

maco_bootstrap_t Bootstrap()
{
    return g_bs;
}
maco_comm_t Comm()
{
    return g_comm;
}
int Rank()
{
    return g_rank;
}
int NRanks()
{
    return g_nranks;
}

uint64_t SharedSeed()
{
    uint64_t seed = 0;
    if (Rank() == 0)
        seed = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
    EXPECT_EQ(maco_bootstrap_broadcast(Bootstrap(), 0, &seed, sizeof(seed)), MACO_OK);
    return seed;
}

void ExchangeMem(maco_comm_t comm, maco_mem_t mine, std::vector<maco_mem_t> *peers)
{
    std::vector<uint8_t> h(static_cast<size_t>(NRanks()) * MACO_MEM_HANDLE_BYTES);
    ASSERT_EQ(maco_mem_serialize(mine, &h[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]),
              MACO_OK);
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), h.data(), MACO_MEM_HANDLE_BYTES), MACO_OK);
    peers->assign(static_cast<size_t>(NRanks()), nullptr);
    for (int q = 0; q < NRanks(); q++) {
        if (q == Rank())
            continue;
        maco_mem_t *peer = &(*peers)[static_cast<size_t>(q)];
        ASSERT_EQ(maco_mem_import(comm, &h[static_cast<size_t>(q) * MACO_MEM_HANDLE_BYTES], peer),
                  MACO_OK)
            << maco_comm_get_last_error(comm);
        int owner = -1;
        maco_mem_get_owner(*peer, &owner);
        ASSERT_EQ(owner, q);
    }
}

void PortChannels::Create(maco_comm_t comm, maco_transport_t transport, maco_mem_t mine,
                          const std::vector<maco_mem_t> &peers)
{
    ASSERT_EQ(maco_proxy_create(comm, &proxy), MACO_OK) << maco_comm_get_last_error(comm);
    ASSERT_EQ(maco_proxy_start(proxy), MACO_OK);
    chans.assign(static_cast<size_t>(NRanks()), nullptr);
    for (int q = 0; q < NRanks(); q++) {
        if (q != Rank()) {
            ASSERT_EQ(maco_port_channel_create(proxy, q, transport, mine,
                                               peers[static_cast<size_t>(q)],
                                               &chans[static_cast<size_t>(q)]),
                      MACO_OK)
                << maco_comm_get_last_error(comm);
        }
    }
}

void PortChannels::Destroy()
{
    if (proxy != nullptr)
        maco_proxy_stop(proxy);
    for (auto c : chans)
        maco_port_channel_destroy(c);
    chans.clear();
    maco_proxy_destroy(proxy);
    proxy = nullptr;
}

int MultiProcessMain(int argc, char **argv, bool with_comm, bool needs_gpu)
{
    ::testing::InitGoogleTest(&argc, argv);
    /* Any launcher MACO recognises starts these tests: maco-run, mpirun, srun, torchrun. */
    maco_launch_info_t job;
    if (maco_launch_info_from_env(&job) != MACO_OK) {
        fprintf(stderr,
                "%s\nrun this test under maco-run (maco-run -n 2 %s), mpirun, srun or "
                "torchrun\n",
                maco_log_last_error(), argv[0]);
        return 2;
    }
    if (needs_gpu) {
        char why[400];
        if (maco_cuda_device_count(why, sizeof(why)) < 1) {
            if (job.rank == 0)
                printf("SKIP: this test needs a GPU: %s\n", why);
            return kSkipExitCode;
        }
    }
    /* MACO_TEST_SIGNAL_STORM: the whole run (bootstrap, imports, channels, teardown) under
     * a signal storm (signal_storm.h). */
    std::unique_ptr<SignalStorm> storm(SignalStorm::FromEnvironment());
    maco_status_t st = maco_bootstrap_create_from_env(&g_bs);
    if (st != MACO_OK) {
        fprintf(stderr, "maco_bootstrap_create_from_env: %s\n", maco_status_string(st));
        return 1;
    }
    maco_bootstrap_get_rank(g_bs, &g_rank);
    maco_bootstrap_get_nranks(g_bs, &g_nranks);
    if (with_comm) {
        st = maco_comm_create(g_bs, -1, &g_comm);
        if (st != MACO_OK) {
            fprintf(stderr, "maco_comm_create: %s\n", maco_status_string(st));
            return 1;
        }
        int dev = -1;
        maco_comm_get_cuda_device(g_comm, &dev);
        if (dev >= 0)
            cudaSetDevice(dev); /* this binary's CUDA runtime, not only libmaco's */
        /* Fewer GPUs than ranks: the communicator says whether the ranks may share them
         * (MPS, MACO_SHARED_GPU) and, if not, why; every rank reaches the same verdict. */
        int gpu_ranks = 0;
        maco_comm_get_gpu_ranks(g_comm, &gpu_ranks);
        if (needs_gpu && gpu_ranks == 0) {
            maco_collective_stats_t stats;
            maco_status_t why = maco_collective_get_stats(g_comm, &stats);
            if (g_rank == 0)
                printf("SKIP: the ranks cannot run GPU work together (%s): %s\n",
                       maco_status_string(why), maco_comm_get_last_error(g_comm));
            maco_comm_destroy(g_comm);
            maco_bootstrap_destroy(g_bs);
            return kSkipExitCode;
        }
        if (g_rank == 0 && gpu_ranks > 1)
            printf("note: %d ranks share each GPU (MPS or MACO_SHARED_GPU=1)\n", gpu_ranks);
    }
    int rc = RUN_ALL_TESTS();
    /* Ranks agree on the outcome before leaving, so one rank's failure is not mistaken by
     * the others for a crash (they would report it as a remote failure). */
    int all_ok = rc == 0;
    int *oks = static_cast<int *>(calloc(static_cast<size_t>(g_nranks), sizeof(int)));
    oks[g_rank] = all_ok;
    if (maco_bootstrap_allgather(g_bs, oks, sizeof(int)) == MACO_OK) {
        for (int r = 0; r < g_nranks; r++)
            if (!oks[r] && g_rank == 0)
                fprintf(stderr, "rank %d had failures\n", r);
    }
    free(oks);
    maco_comm_destroy(g_comm);
    maco_bootstrap_destroy(g_bs);
    if (storm != nullptr) {
        storm->Stop();
        if (g_rank == 0)
            printf("signal storm: %ld signals delivered to this rank\n", SignalStorm::Delivered());
    }
    return rc;
}

} // namespace maco_test
