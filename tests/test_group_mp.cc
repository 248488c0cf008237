/*
 * test_group_mp.cc - groups (maco_group_start/end) and the argument checks of all-to-all and
 * send/recv, through the public API, under maco-run. Runs in CI without a GPU: a valid group
 * then ends in MACO_ERR_UNSUPPORTED (no GPU) and everything checked before that still is.
 * With a GPU the valid groups run (they only copy locally: a send to this rank matched with
 * a receive from it), and across simulated nodes messages to ranks of other nodes travel
 * too.
 */
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "maco_test.h"

namespace
{

using maco_test::Comm;
using maco_test::NRanks;
using maco_test::Rank;

class Group : public maco_test::Test
{
  protected:
    void SetUp() override
    {
        maco_test::Test::SetUp();
        /* Argument errors and, without a GPU, every valid group are logged. */
        maco_test::AllowLog("maco_");
        maco_comm_get_gpu_ranks(Comm(), &gpu_ranks_);
        maco_comm_get_nnodes(Comm(), &nnodes_);
        if (gpu_ranks_ > 0) {
            ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&a_), kBytes), cudaSuccess);
            ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&b_), kBytes), cudaSuccess);
        } else {
            /* Never touched: without a GPU nothing is issued. */
            a_ = host_;
            b_ = host_ + kBytes / 2;
        }
    }
    void TearDown() override
    {
        if (gpu_ranks_ > 0) {
            cudaDeviceSynchronize();
            cudaFree(a_);
            cudaFree(b_);
        }
        ASSERT_EQ(maco_group_end(), MACO_ERR_INVALID_USAGE) << "a test left a group open";
        maco_test::Test::TearDown();
    }

    /* What a valid group ends in here. */
    maco_status_t Valid() const
    {
        return gpu_ranks_ > 0 ? MACO_OK : MACO_ERR_UNSUPPORTED;
    }

    std::string LastProblem()
    {
        std::vector<std::string> p = maco_test::LoggedProblems();
        return p.empty() ? std::string() : p.back();
    }

    /* A local exchange: a send to this rank and its receive. */
    void LocalPair(size_t count, size_t offset = 0)
    {
        EXPECT_EQ(maco_send(a_ + offset, count, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
        EXPECT_EQ(maco_recv(b_ + offset, count, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    }

    static constexpr size_t kBytes = 1 << 20;
    int gpu_ranks_ = 0, nnodes_ = 1;
    char *a_ = nullptr, *b_ = nullptr;
    char host_[kBytes];
};

TEST_F(Group, EndWithoutStartIsInvalidUsage)
{
    EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_USAGE);
    EXPECT_NE(LastProblem().find("no group is open"), std::string::npos) << LastProblem();
}

/* Only the outermost end issues (and checks) the group. */
TEST_F(Group, NestedGroupsEndAtTheOutermost)
{
    ASSERT_EQ(maco_group_start(), MACO_OK);
    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_send(a_, 10, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), MACO_OK); /* inner: the send is not matched yet, no matter */
    EXPECT_EQ(maco_recv(b_, 10, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), Valid()) << LastProblem();

    ASSERT_EQ(maco_group_start(), MACO_OK);
    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_send(a_, 10, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), MACO_OK);
    EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("maco_group_end: call 1 (maco_send)"), std::string::npos)
        << LastProblem();
    EXPECT_NE(LastProblem().find("no matching receive"), std::string::npos) << LastProblem();
}

/* Each bad call returns MACO_ERR_INVALID_ARGUMENT at once, naming the argument; inside a group
 * it also fails the group, whose end names the call and issues nothing. */
TEST_F(Group, ArgumentErrorsFailTheCallAndTheGroup)
{
    const int n = NRanks(), me = Rank();
    std::vector<size_t> c(static_cast<size_t>(n), 4), d(static_cast<size_t>(n));
    for (int q = 0; q < n; q++)
        d[static_cast<size_t>(q)] = static_cast<size_t>(q) * 4;
    std::vector<size_t> self_bad = c;
    self_bad[static_cast<size_t>(me)] = 3;
    /* Block n-1's end past a message's byte size, on the send side, then the receive side. */
    std::vector<size_t> far_displ = d;
    far_displ[static_cast<size_t>(n - 1)] = SIZE_MAX / 8;
    struct Bad {
        const char *fn;
        std::function<maco_status_t()> call;
        const char *says;
    };
    const std::vector<Bad> bads = {
        { "maco_send", [&] { return maco_send(a_, 4, MACO_FLOAT32, n, Comm(), nullptr); },
          "peer " },
        { "maco_recv", [&] { return maco_recv(b_, 4, MACO_FLOAT32, -1, Comm(), nullptr); },
          "peer -1" },
        { "maco_send", [&] { return maco_send(nullptr, 4, MACO_FLOAT32, 0, Comm(), nullptr); },
          "buf is NULL" },
        { "maco_recv",
          [&] { return maco_recv(b_, 4, static_cast<maco_datatype_t>(99), 0, Comm(), nullptr); },
          "datatype 99" },
        { "maco_send",
          [&] { return maco_send(a_, SIZE_MAX / 4, MACO_FLOAT64, 0, Comm(), nullptr); },
          "overflows" },
        { "maco_alltoall",
          [&] { return maco_alltoall(a_, a_ + 4, 4, MACO_FLOAT32, Comm(), nullptr); }, "overlap" },
        { "maco_alltoall",
          [&] { return maco_alltoall(a_, nullptr, 4, MACO_FLOAT32, Comm(), nullptr); },
          "recvbuf is NULL" },
        { "maco_alltoall",
          [&] { return maco_alltoall(a_, b_, SIZE_MAX / 2, MACO_INT8, Comm(), nullptr); },
          "overflows" },
        { "maco_alltoallv",
          [&] {
              return maco_alltoallv(a_, c.data(), d.data(), b_, nullptr, d.data(), MACO_FLOAT32,
                                    Comm(), nullptr);
          },
          "recvcounts is NULL" },
        { "maco_alltoallv",
          [&] {
              return maco_alltoallv(a_, c.data(), d.data(), b_, self_bad.data(), d.data(),
                                    MACO_FLOAT32, Comm(), nullptr);
          },
          "sends itself 4 elements" },
        { "maco_alltoallv",
          [&] {
              return maco_alltoallv(a_, c.data(), far_displ.data(), b_, c.data(), d.data(),
                                    MACO_FLOAT32, Comm(), nullptr);
          },
          "sdispls[" },
        { "maco_alltoallv",
          [&] {
              return maco_alltoallv(a_, c.data(), d.data(), b_, c.data(), far_displ.data(),
                                    MACO_FLOAT32, Comm(), nullptr);
          },
          "rdispls[" },
        { "maco_allreduce",
          [&] {
              return maco_allreduce(a_, b_, 4, MACO_FLOAT32, static_cast<maco_redop_t>(9), Comm(),
                                    nullptr);
          },
          "op 9" },
    };
    for (const Bad &b : bads) {
        EXPECT_EQ(b.call(), MACO_ERR_INVALID_ARGUMENT) << b.says;
        EXPECT_NE(LastProblem().find(std::string(b.fn) + ": "), std::string::npos) << LastProblem();
        EXPECT_NE(LastProblem().find(b.says), std::string::npos) << LastProblem();
        /* The same inside a group, as its second call. */
        ASSERT_EQ(maco_group_start(), MACO_OK);
        EXPECT_EQ(maco_send(a_, 4, MACO_FLOAT32, me, Comm(), nullptr), MACO_OK);
        EXPECT_EQ(b.call(), MACO_ERR_INVALID_ARGUMENT) << b.says;
        EXPECT_EQ(maco_recv(b_, 4, MACO_FLOAT32, me, Comm(), nullptr), MACO_OK);
        EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_ARGUMENT) << b.says;
        std::string msg = LastProblem();
        EXPECT_NE(msg.find(std::string("call 2 of the group (") + b.fn + ")"), std::string::npos)
            << msg;
        EXPECT_NE(msg.find(b.says), std::string::npos) << msg;
        EXPECT_NE(msg.find("nothing of the group was issued"), std::string::npos) << msg;
    }
    /* A NULL communicator. */
    EXPECT_EQ(maco_send(a_, 4, MACO_FLOAT32, 0, nullptr, nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("comm is NULL"), std::string::npos) << LastProblem();
}

/* A send to this rank needs its receive in the same group, with the same count. */
TEST_F(Group, LocalSendNeedsItsReceiveInTheSameGroup)
{
    const int me = Rank();
    EXPECT_EQ(maco_send(a_, 10, MACO_FLOAT32, me, Comm(), nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("no matching receive"), std::string::npos) << LastProblem();
    EXPECT_EQ(maco_recv(b_, 10, MACO_FLOAT32, me, Comm(), nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("no matching send"), std::string::npos) << LastProblem();

    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_send(a_, 10, MACO_FLOAT32, me, Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_recv(b_, 11, MACO_FLOAT32, me, Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("call 2 (maco_recv) receives 44 bytes"), std::string::npos)
        << LastProblem();

    ASSERT_EQ(maco_group_start(), MACO_OK);
    LocalPair(10);
    LocalPair(1000, 4096);
    EXPECT_EQ(maco_group_end(), Valid()) << LastProblem();
}

/* A receive buffer may not overlap another receive buffer of its group; a send buffer may
 * overlap a receive buffer (in place: the send is staged). */
TEST_F(Group, ReceiveBuffersMustNotOverlap)
{
    const int peer = (Rank() + 1) % NRanks();
    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_recv(b_, 100, MACO_FLOAT32, peer, Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_send(b_ + 200, 100, MACO_FLOAT32, peer, Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_recv(b_ + 396, 1, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_send(a_, 1, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("call 1 (maco_recv): its receive buffer"), std::string::npos)
        << LastProblem();
    EXPECT_NE(LastProblem().find("overlaps the receive buffer"), std::string::npos)
        << LastProblem();
    EXPECT_NE(LastProblem().find("of call 3 (maco_recv)"), std::string::npos) << LastProblem();

    /* In place, locally: send a_ to this rank and receive into a_ from it. */
    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_send(a_, 100, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_recv(a_ + 200, 100, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), Valid()) << LastProblem();

    /* All-to-allv receive blocks that overlap each other. */
    const int n = NRanks();
    std::vector<size_t> c(static_cast<size_t>(n), 4), d(static_cast<size_t>(n), 0);
    for (int q = 0; q < n; q++)
        d[static_cast<size_t>(q)] = static_cast<size_t>(q) * 4;
    std::vector<size_t> rd(static_cast<size_t>(n), 0); /* every block at 0 */
    EXPECT_EQ(maco_alltoallv(a_, c.data(), d.data(), b_, c.data(), rd.data(), MACO_FLOAT32, Comm(),
                             nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("overlaps the receive buffer"), std::string::npos)
        << LastProblem();
}

TEST_F(Group, AtMost128SendsAndReceivesPerCommunicator)
{
    const int peer = (Rank() + 1) % NRanks();
    ASSERT_EQ(maco_group_start(), MACO_OK);
    for (int i = 0; i < 129; i++)
        EXPECT_EQ(maco_send(a_, 1, MACO_FLOAT32, peer, Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("more than 128 sends and receives"), std::string::npos)
        << LastProblem();
}

TEST_F(Group, OneStreamPerCommunicatorInAGroup)
{
    maco_stream_t s1 = reinterpret_cast<maco_stream_t>(uintptr_t{ 0x10 });
    maco_stream_t s2 = reinterpret_cast<maco_stream_t>(uintptr_t{ 0x20 });
    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_send(a_, 4, MACO_FLOAT32, Rank(), Comm(), s1), MACO_OK);
    EXPECT_EQ(maco_recv(b_, 4, MACO_FLOAT32, Rank(), Comm(), s2), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("must use one stream"), std::string::npos) << LastProblem();
    EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("call 2 of the group (maco_recv)"), std::string::npos)
        << LastProblem();
}

/* The one-stream rule with several communicators in one group (each found by its handle in the
 * group's table): calls alternating over five communicators, each with a stream of its own,
 * are accepted; a later call on the fourth with another stream is refused naming that
 * communicator's first call. */
TEST_F(Group, OneStreamPerCommunicatorWithManyCommunicators)
{
    std::vector<maco_comm_t> comms(5, nullptr);
    for (auto &c : comms)
        ASSERT_EQ(maco_comm_split(Comm(), 0, Rank(), &c), MACO_OK);
    ASSERT_EQ(maco_group_start(), MACO_OK);
    for (int round = 0; round < 3; round++)
        for (size_t k = 0; k < comms.size(); k++)
            EXPECT_EQ(maco_allreduce(a_, b_, 4, MACO_FLOAT32, MACO_SUM, comms[k],
                                     reinterpret_cast<maco_stream_t>(uintptr_t{ 0x10 * (k + 1) })),
                      MACO_OK);
    EXPECT_EQ(maco_allreduce(a_, b_, 4, MACO_FLOAT32, MACO_SUM, comms[3],
                             reinterpret_cast<maco_stream_t>(uintptr_t{ 0x10 })),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("of call 4 (maco_allreduce)"), std::string::npos) << LastProblem();
    EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastProblem().find("call 16 of the group (maco_allreduce)"), std::string::npos)
        << LastProblem();
    for (auto c : comms)
        EXPECT_EQ(maco_comm_destroy(c), MACO_OK);
}

/* Another thread's calls are not part of this thread's group. */
TEST_F(Group, GroupsArePerThread)
{
    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_send(a_, 8, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    maco_status_t end_there = MACO_OK, bad_there = MACO_OK, group_there = MACO_ERR_INTERNAL;
    std::thread t([&] {
        end_there = maco_group_end(); /* no group on this thread */
        bad_there = maco_send(a_, 8, MACO_FLOAT32, -5, Comm(), nullptr);
        maco_group_start();
        maco_send(a_ + 4096, 16, MACO_FLOAT32, Rank(), Comm(), nullptr);
        maco_recv(b_ + 4096, 16, MACO_FLOAT32, Rank(), Comm(), nullptr);
        group_there = maco_group_end();
    });
    t.join();
    EXPECT_EQ(end_there, MACO_ERR_INVALID_USAGE);
    EXPECT_EQ(bad_there, MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(group_there, Valid());
    /* This thread's group did not see the other's calls: its bad call did not fail it, and
     * its send still waits for this receive. */
    EXPECT_EQ(maco_recv(b_, 8, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), Valid()) << LastProblem();
}

/* Count 0 does nothing and needs no match; all-to-all of 0 elements too. */
TEST_F(Group, CountZeroDoesNothing)
{
    EXPECT_EQ(maco_send(a_, 0, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_recv(nullptr, 0, MACO_FLOAT32, (Rank() + 1) % NRanks(), Comm(), nullptr),
              MACO_OK);
    EXPECT_EQ(maco_alltoall(nullptr, nullptr, 0, MACO_FLOAT32, Comm(), nullptr), MACO_OK);
    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_send(a_, 0, MACO_FLOAT32, Rank(), Comm(), nullptr), MACO_OK);
    EXPECT_EQ(maco_group_end(), MACO_OK);
}

/* Collectives join groups too: checked at the call, issued (and prepared) at the end. */
TEST_F(Group, CollectivesInAGroup)
{
    ASSERT_EQ(maco_group_start(), MACO_OK);
    EXPECT_EQ(maco_allreduce(a_, b_, 1000, MACO_FLOAT32, MACO_SUM, Comm(), nullptr), MACO_OK);
    LocalPair(100);
    EXPECT_EQ(maco_group_end(), Valid()) << LastProblem();
}

/* Across (simulated) nodes: a message to a rank of another node travels (internode.c), in a
 * group with a local pair and alone, with fresh values every round; an all-to-all too. */
TEST_F(Group, AcrossNodesMessagesTravel)
{
    if (nnodes_ < 2)
        GTEST_SKIP() << "one node";
    /* maco-run --simulate-nodes puts the ranks on the nodes in blocks. */
    const int n = NRanks(), far = (Rank() + n / 2) % n;
    const int from = (Rank() - n / 2 + n) % n; /* the rank whose `far` is this rank */
    const size_t count = 70001;                /* several chunks of MACO_P2P_CHUNK_SIZE */
    for (int round = 0; round < 3; round++) {
        std::vector<float> mine(count), got(count, -1.0f);
        for (size_t e = 0; e < count; e++)
            mine[e] = static_cast<float>(Rank() * 1000003 + round * 7919) + static_cast<float>(e);
        if (gpu_ranks_ > 0) {
            ASSERT_EQ(cudaMemcpy(a_, mine.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
            ASSERT_EQ(cudaMemset(b_, 0xFF, count * 4), cudaSuccess);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
        ASSERT_EQ(maco_group_start(), MACO_OK);
        EXPECT_EQ(maco_send(a_, count, MACO_FLOAT32, far, Comm(), nullptr), MACO_OK);
        EXPECT_EQ(maco_recv(b_, count, MACO_FLOAT32, from, Comm(), nullptr), MACO_OK);
        LocalPair(10, kBytes / 2 - 64); /* apart from the far receive, also on the host */
        ASSERT_EQ(maco_group_end(), Valid()) << LastProblem();
        if (gpu_ranks_ == 0)
            return;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got.data(), b_, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        size_t bad = 0;
        for (size_t e = 0; e < count; e++)
            bad +=
                got[e] != static_cast<float>(from * 1000003 + round * 7919) + static_cast<float>(e);
        ASSERT_EQ(bad, 0u) << "round " << round << " from rank " << from;
    }
    /* An all-to-all over both nodes ends without error (its values: the p2p suite, maco-perf). */
    ASSERT_EQ(maco_alltoall(a_, b_, 1000, MACO_FLOAT32, Comm(), nullptr), MACO_OK) << LastProblem();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    maco_status_t async = MACO_OK;
    maco_comm_get_async_error(Comm(), &async);
    EXPECT_EQ(async, MACO_OK);
}

/* The algorithm names of all-to-all and send/recv (a GPU is needed to ask). */
TEST_F(Group, AlgorithmNames)
{
    EXPECT_STREQ(maco_collective_name(MACO_COLL_ALLTOALL), "alltoall");
    EXPECT_STREQ(maco_collective_name(MACO_COLL_SENDRECV), "sendrecv");
    if (Valid() != MACO_OK)
        GTEST_SKIP() << "no GPU, or several nodes";
    const char *name = nullptr;
    ASSERT_EQ(maco_collective_get_algorithm(Comm(), MACO_COLL_SENDRECV, 1000, MACO_FLOAT32, &name),
              MACO_OK);
    EXPECT_STREQ(name, "ll");
    ASSERT_EQ(
        maco_collective_get_algorithm(Comm(), MACO_COLL_ALLTOALL, 1 << 20, MACO_FLOAT32, &name),
        MACO_OK);
    /* 1 MiB blocks: the hierarchical all-to-all across nodes with 2+ ranks each (README,
     * "Algorithms"), else the copy kernel. */
    int nnodes = 1;
    ASSERT_EQ(maco_comm_get_nnodes(Comm(), &nnodes), MACO_OK);
    EXPECT_STREQ(name, nnodes > 1 && NRanks() / nnodes >= 2 ? "hier" : "copy");
    ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLTOALL, "LL"), MACO_OK);
    ASSERT_EQ(
        maco_collective_get_algorithm(Comm(), MACO_COLL_ALLTOALL, 1 << 20, MACO_FLOAT32, &name),
        MACO_OK);
    EXPECT_STREQ(name, "ll");
    EXPECT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_SENDRECV, "mesh"),
              MACO_ERR_UNSUPPORTED);
    EXPECT_NE(LastProblem().find("use ll, copy"), std::string::npos) << LastProblem();
    ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLTOALL, nullptr), MACO_OK);
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, true, false);
}
