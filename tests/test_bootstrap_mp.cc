/*
 * test_bootstrap_mp.cc - the bootstrap and a GPU-less communicator among real processes.
 * Run under maco-run with 1, 2, 4 and 8 ranks (and 4 ranks as 2 simulated nodes).
 */
#include <dlfcn.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "maco_test.h"

namespace
{

using maco_test::Bootstrap;
using maco_test::NRanks;
using maco_test::Rank;

class BootstrapMp : public maco_test::Test
{
};

/* A byte of rank r's contribution at offset i for a given round. */
uint8_t Pattern(int r, size_t i, int round)
{
    return static_cast<uint8_t>((r * 131 + i * 7 + static_cast<size_t>(round) * 29 + (i >> 9)) &
                                0xff);
}

TEST_F(BootstrapMp, AllgatherOfManySizes)
{
    const size_t sizes[] = { 0, 1, 3, 4, 1000, 65537, (size_t)1 << 20, (size_t)4 << 20 };
    int round = 0;
    for (size_t bytes : sizes) {
        /* Beyond 8 ranks, stop at 64 KiB: 64 ranks x 4 MiB x 63 peers is 16 GiB of
         * loopback traffic, too much for CI's 2 cores. */
        if (NRanks() > 8 && bytes > 65537)
            break;
        std::vector<uint8_t> buf(bytes * static_cast<size_t>(NRanks()) + 1, 0xEE);
        for (size_t i = 0; i < bytes; i++)
            buf[static_cast<size_t>(Rank()) * bytes + i] = Pattern(Rank(), i, round);
        ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), buf.data(), bytes), MACO_OK) << bytes;
        /* Count first, assert once: per-byte assertions dominate the run time at 64 ranks. */
        size_t wrong = 0, first = SIZE_MAX;
        for (int r = 0; r < NRanks(); r++)
            for (size_t i = 0; i < bytes; i++)
                if (buf[static_cast<size_t>(r) * bytes + i] != Pattern(r, i, round)) {
                    wrong++;
                    first = std::min(first, static_cast<size_t>(r) * bytes + i);
                }
        ASSERT_EQ(wrong, 0u) << bytes << " bytes per rank; first wrong byte at " << first;
        EXPECT_EQ(buf.back(), 0xEE) << "allgather wrote past the buffer";
        round++;
    }
}

TEST_F(BootstrapMp, LargeAllgatherUpTo8Ranks)
{
    if (NRanks() > 8)
        GTEST_SKIP() << "64 MiB per rank is exercised with up to 8 ranks (beyond, the "
                        "loopback traffic grows as ranks squared: 64 ranks would move 258 GB)";
    const size_t bytes = (size_t)64 << 20;
    std::vector<uint8_t> buf(bytes * static_cast<size_t>(NRanks()));
    for (size_t i = 0; i < bytes; i++)
        buf[static_cast<size_t>(Rank()) * bytes + i] = Pattern(Rank(), i, 99);
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), buf.data(), bytes), MACO_OK);
    for (int r = 0; r < NRanks(); r++)
        for (size_t i = 0; i < bytes; i += 4093)
            ASSERT_EQ(buf[static_cast<size_t>(r) * bytes + i], Pattern(r, i, 99));
}

TEST_F(BootstrapMp, BroadcastFromEveryRoot)
{
    for (int root = 0; root < NRanks(); root++) {
        std::vector<uint32_t> v(1000, 0);
        if (Rank() == root)
            for (size_t i = 0; i < v.size(); i++)
                v[i] = static_cast<uint32_t>(root * 1000003u + i);
        ASSERT_EQ(maco_bootstrap_broadcast(Bootstrap(), root, v.data(), v.size() * 4), MACO_OK);
        size_t wrong = 0;
        for (size_t i = 0; i < v.size(); i++)
            wrong += v[i] != static_cast<uint32_t>(root * 1000003u + i);
        ASSERT_EQ(wrong, 0u) << "root " << root;
    }
}

/* Every rank sends several tagged messages to every other rank, interleaving tags; the
 * receiver takes them tag by tag in an order different from the send order. */
TEST_F(BootstrapMp, TaggedMessagesArriveInOrderPerPeerAndTag)
{
    const int kTags = 3, kPerTag = 5;
    for (int peer = 0; peer < NRanks(); peer++) {
        if (peer == Rank())
            continue;
        for (int k = 0; k < kPerTag; k++)
            for (int t = 0; t < kTags; t++) {
                uint64_t msg[2] = { static_cast<uint64_t>(Rank()),
                                    static_cast<uint64_t>(t * 100 + k) };
                ASSERT_EQ(maco_bootstrap_send(Bootstrap(), peer, static_cast<uint32_t>(t + 7), msg,
                                              sizeof(msg)),
                          MACO_OK);
            }
    }
    for (int peer = NRanks() - 1; peer >= 0; peer--) {
        if (peer == Rank())
            continue;
        for (int t = kTags - 1; t >= 0; t--)
            for (int k = 0; k < kPerTag; k++) {
                uint64_t msg[2] = { 0, 0 };
                ASSERT_EQ(maco_bootstrap_recv(Bootstrap(), peer, static_cast<uint32_t>(t + 7), msg,
                                              sizeof(msg)),
                          MACO_OK);
                EXPECT_EQ(msg[0], static_cast<uint64_t>(peer));
                EXPECT_EQ(msg[1], static_cast<uint64_t>(t * 100 + k)) << "out of order";
            }
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

TEST_F(BootstrapMp, WrongSizeAndReservedTagAreClearErrors)
{
    maco_test::AllowLog("is reserved");
    uint32_t x = 0;
    EXPECT_EQ(maco_bootstrap_send(Bootstrap(), (Rank() + 1) % NRanks(), 0xFFFF0001u, &x, 4),
              MACO_ERR_INVALID_ARGUMENT);
    maco_test::AllowLog("is not another rank");
    EXPECT_EQ(maco_bootstrap_send(Bootstrap(), Rank(), 1, &x, 4), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_bootstrap_send(Bootstrap(), NRanks(), 1, &x, 4), MACO_ERR_INVALID_ARGUMENT);
    if (NRanks() < 2)
        return;
    /* Rank 1 sends 8 bytes; rank 0 asks for 4: an error naming both sizes, consumed. */
    if (Rank() == 1) {
        uint64_t v = 5;
        ASSERT_EQ(maco_bootstrap_send(Bootstrap(), 0, 42, &v, sizeof(v)), MACO_OK);
    } else if (Rank() == 0) {
        maco_test::AllowLog("sent 8 bytes with tag 0x2a but this rank expected 4 bytes");
        EXPECT_EQ(maco_bootstrap_recv(Bootstrap(), 1, 42, &x, 4), MACO_ERR_INVALID_USAGE);
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

TEST_F(BootstrapMp, ManyBarriers)
{
    const int n = NRanks() > 8 ? 50 : 200;
    for (int i = 0; i < n; i++)
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK) << i;
}

/* A communicator exists without a GPU; its topology follows the host ids. */
TEST_F(BootstrapMp, CommunicatorTopology)
{
    maco_comm_t comm;
    ASSERT_EQ(maco_comm_create(Bootstrap(), -1, &comm), MACO_OK);
    int rank, nranks, local, nlocal, node, nnodes;
    ASSERT_EQ(maco_comm_get_rank(comm, &rank), MACO_OK);
    ASSERT_EQ(maco_comm_get_nranks(comm, &nranks), MACO_OK);
    ASSERT_EQ(maco_comm_get_local_rank(comm, &local), MACO_OK);
    ASSERT_EQ(maco_comm_get_local_nranks(comm, &nlocal), MACO_OK);
    ASSERT_EQ(maco_comm_get_node(comm, &node), MACO_OK);
    ASSERT_EQ(maco_comm_get_nnodes(comm, &nnodes), MACO_OK);
    EXPECT_EQ(rank, Rank());
    EXPECT_EQ(nranks, NRanks());
    const char *sim = getenv("MACO_HOST_ID");
    if (sim != nullptr && strstr(sim, "simulated-node-") != nullptr) {
        /* maco-run --simulate-nodes K splits the ranks into K contiguous blocks. */
        int per_node = (NRanks() + 1) / 2;
        EXPECT_EQ(nnodes, 2);
        EXPECT_EQ(node, Rank() / per_node);
        EXPECT_EQ(local, Rank() % per_node);
    } else {
        EXPECT_EQ(nnodes, 1);
        EXPECT_EQ(node, 0);
        EXPECT_EQ(local, Rank());
        EXPECT_EQ(nlocal, NRanks());
    }
    /* The launcher's local rank (maco-run's MACO_LOCAL_RANK, mpirun's, srun's) agrees with
     * the host ids, except where MACO_HOST_ID simulates nodes the launcher does not know. */
    maco_launch_info_t job;
    ASSERT_EQ(maco_launch_info_from_env(&job), MACO_OK);
    if (getenv("MACO_LOCAL_RANK") != nullptr || (sim == nullptr && job.local_rank >= 0)) {
        EXPECT_EQ(job.local_rank, local) << "launcher " << job.launcher;
    }
    char why[400];
    if (maco_cuda_device_count(why, sizeof(why)) == 0) {
        /* Without a GPU, GPU operations say why, and what they say is true: no driver is
         * "no NVIDIA driver", never the runtime's "driver version is insufficient". */
        int dev = 0;
        ASSERT_EQ(maco_comm_get_cuda_device(comm, &dev), MACO_OK);
        EXPECT_EQ(dev, -1);
        maco_test::AllowLog("has no usable CUDA device");
        float x = 0;
        EXPECT_EQ(maco_allreduce(&x, &x, 1, MACO_FLOAT32, MACO_SUM, comm, nullptr),
                  MACO_ERR_UNSUPPORTED);
        std::string msg = maco_comm_get_last_error(comm);
        EXPECT_NE(msg.find(why), std::string::npos) << msg;
        EXPECT_EQ(msg.find("insufficient"), std::string::npos) << msg;
        /* Mapping peers' registrations needs a GPU too (nothing to map for one rank). */
        EXPECT_EQ(maco_collective_map_registrations(comm),
                  NRanks() == 1 ? MACO_OK : MACO_ERR_UNSUPPORTED);
        maco_test::AllowLog("comm is NULL");
        EXPECT_EQ(maco_collective_map_registrations(nullptr), MACO_ERR_INVALID_ARGUMENT);
        void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (driver == nullptr)
            EXPECT_NE(msg.find("no NVIDIA driver: libcuda.so.1"), std::string::npos) << msg;
        else
            dlclose(driver);
    }
    ASSERT_EQ(maco_comm_destroy(comm), MACO_OK);
}

} // namespace

/* Collective arguments are checked before anything needs a GPU, so CI covers them: each
 * bad argument gives MACO_ERR_INVALID_ARGUMENT naming it, and the buffers stay untouched. */
TEST_F(BootstrapMp, CollectiveArgumentsAreCheckedFirst)
{
    maco_comm_t comm;
    ASSERT_EQ(maco_comm_create(Bootstrap(), -1, &comm), MACO_OK);
    const size_t n = 64;
    std::vector<float> in(n * NRanks(), 1.5f), out(n * NRanks(), 2.5f);
    float *i = in.data(), *o = out.data();
    maco_test::AllowLog("maco_");
    struct Bad {
        maco_status_t st;
        const char *name;
    };
    const maco_datatype_t bad_type = static_cast<maco_datatype_t>(MACO_DATATYPE_COUNT);
    const maco_redop_t bad_op = static_cast<maco_redop_t>(-1);
    const Bad bads[] = {
        { maco_allreduce(nullptr, o, n, MACO_FLOAT32, MACO_SUM, comm, nullptr), "sendbuf" },
        { maco_allreduce(i, nullptr, n, MACO_FLOAT32, MACO_SUM, comm, nullptr), "recvbuf" },
        { maco_allreduce(i, o, n, bad_type, MACO_SUM, comm, nullptr), "datatype" },
        { maco_reduce_scatter(i, o, n, MACO_FLOAT32, bad_op, comm, nullptr), "op" },
        { maco_broadcast(i, o, n, MACO_FLOAT32, NRanks(), comm, nullptr), "root" },
        { maco_reduce(i, o, n, MACO_FLOAT32, MACO_MAX, -1, comm, nullptr), "root" },
        { maco_allreduce(o + 1, o, n, MACO_FLOAT32, MACO_SUM, comm, nullptr), "overlap" },
        { maco_allgather(o + 1, o, n, MACO_FLOAT32, comm, nullptr), "overlap" },
        { maco_reduce_scatter(o, o + 1, n, MACO_FLOAT32, MACO_SUM, comm, nullptr), "overlap" },
        { maco_broadcast(o, o + 3, n, MACO_INT8, Rank(), comm, nullptr), "overlap" },
        { maco_allreduce(i, o, SIZE_MAX / 4, MACO_FLOAT64, MACO_SUM, comm, nullptr), "overflows" },
        { maco_allgather(i, o, SIZE_MAX / 4 + 1, MACO_FLOAT32, comm, nullptr), "overflows" },
        { maco_allgather(i, o, n, MACO_FLOAT32, nullptr, nullptr), "comm" },
    };
    for (const Bad &b : bads) {
        EXPECT_EQ(b.st, MACO_ERR_INVALID_ARGUMENT) << b.name;
        std::vector<std::string> logged = maco_test::LoggedProblems();
        ASSERT_FALSE(logged.empty());
    }
    /* Every message names its argument (in call order in the log). */
    std::vector<std::string> logged = maco_test::LoggedProblems();
    ASSERT_GE(logged.size(), sizeof(bads) / sizeof(bads[0]));
    size_t first = logged.size() - sizeof(bads) / sizeof(bads[0]);
    for (size_t k = 0; k < sizeof(bads) / sizeof(bads[0]); k++)
        EXPECT_NE(logged[first + k].find(bads[k].name), std::string::npos) << logged[first + k];
    /* Exactly in place is fine (then the missing GPU is what stops the call). */
    {
        int dev = 0;
        ASSERT_EQ(maco_comm_get_cuda_device(comm, &dev), MACO_OK);
        if (dev < 0) {
            EXPECT_EQ(maco_allgather(o + n * Rank(), o, n, MACO_FLOAT32, comm, nullptr),
                      MACO_ERR_UNSUPPORTED);
            EXPECT_EQ(
                maco_reduce_scatter(o, o + n * Rank(), n, MACO_FLOAT32, MACO_SUM, comm, nullptr),
                MACO_ERR_UNSUPPORTED);
            /* A reduce's non-root and a broadcast's non-root may pass NULL. */
            EXPECT_EQ(maco_reduce(i, NRanks() > 1 && Rank() != 0 ? nullptr : o, n, MACO_FLOAT32,
                                  MACO_SUM, 0, comm, nullptr),
                      MACO_ERR_UNSUPPORTED);
        }
    }
    for (float v : in)
        ASSERT_EQ(v, 1.5f);
    for (float v : out)
        ASSERT_EQ(v, 2.5f);
    EXPECT_STREQ(maco_collective_name(MACO_COLL_REDUCE_SCATTER), "reduce_scatter");
    EXPECT_STREQ(maco_collective_name(MACO_COLLECTIVE_COUNT), "unknown");
    ASSERT_EQ(maco_comm_destroy(comm), MACO_OK);
}

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, false, false);
}
