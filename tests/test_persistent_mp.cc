/*
 * test_persistent_mp.cc - the fused operators' public graph builders without a GPU, under
 * maco-run (rank and world size from a real communicator): every rank builds the three
 * operators over fake (aligned) device pointers and channel handles of the sizes
 * maco_fused_gemm_scratch_bytes gives; the graphs validate and their task counts follow the
 * documented structure (test_fused_cpu.cc runs the same graphs end to end on the CPU). On a
 * machine without a GPU, creating the kernel is refused with MACO_ERR_UNSUPPORTED.
 */
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "maco_test.h"

using maco_test::Comm;
using maco_test::NRanks;
using maco_test::Rank;

namespace
{

class FusedBuilders : public maco_test::Test
{
  protected:
    void SetUp() override
    {
        maco_test::Test::SetUp();
        ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    }
    void TearDown() override
    {
        maco_task_graph_destroy(g_);
        maco_test::Test::TearDown();
    }
    static void *Fake(uintptr_t a)
    {
        return reinterpret_cast<void *>(a);
    }
    /* Fake channels to every peer over the operator's scratch and over out (m x n). */
    void Channels(maco_fused_op_t kind, uint32_t m, uint32_t n, uint32_t k, maco_datatype_t t)
    {
        size_t bytes = 0;
        ASSERT_EQ(maco_fused_gemm_scratch_bytes(kind, NRanks(), m, n, k, t, &bytes), MACO_OK);
        index_.assign(static_cast<size_t>(NRanks()), -1);
        out_index_.assign(static_cast<size_t>(NRanks()), -1);
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            maco_memory_channel_device_t h;
            memset(&h, 0, sizeof(h));
            h.local = static_cast<char *>(Fake(0x40000000));
            h.remote = static_cast<char *>(Fake(0x50000000));
            h.local_bytes = h.remote_bytes = bytes;
            ASSERT_EQ(maco_task_graph_add_channel(g_, &h, &index_[static_cast<size_t>(q)]),
                      MACO_OK);
            h.local = static_cast<char *>(Fake(0x30000000));
            h.remote = static_cast<char *>(Fake(0x60000000));
            h.local_bytes = h.remote_bytes = static_cast<uint64_t>(m) * n * 4;
            ASSERT_EQ(maco_task_graph_add_channel(g_, &h, &out_index_[static_cast<size_t>(q)]),
                      MACO_OK);
        }
    }
    maco_fused_gemm_t Op(uint32_t m, uint32_t n, uint32_t k)
    {
        maco_fused_gemm_t op;
        memset(&op, 0, sizeof(op));
        op.comm = Comm();
        op.channels = index_.data();
        op.out_channels = out_index_.data();
        op.a = Fake(0x10000000);
        op.b = Fake(0x20000000);
        op.out = Fake(0x30000000);
        op.scratch = Fake(0x40000000);
        op.m = m;
        op.n = n;
        op.k = k;
        op.out_type = MACO_FLOAT32;
        op.name = "op";
        return op;
    }
    int NTasks()
    {
        int n = 0;
        EXPECT_EQ(maco_task_graph_get_ntasks(g_, &n), MACO_OK);
        return n;
    }
    /* The tiles the builders plan for an m x n GEMM on this rank's CTAs. */
    int Tiles(uint32_t m, uint32_t n)
    {
        int ctas = 0;
        if (maco_comm_get_coresident_ctas(Comm(), &ctas) != MACO_OK || ctas < 1)
            ctas = 1;
        size_t t = 0;
        EXPECT_EQ(maco_gemm_plan_tiles(m, n, ctas, nullptr, &t), MACO_OK);
        return static_cast<int>(t);
    }
    maco_task_graph_t g_ = nullptr;
    std::vector<int> index_, out_index_;
};

TEST_F(FusedBuilders, GemmAllreduceValidatesWithTheDocumentedStructure)
{
    const uint32_t m = 200, n = 384, k = 64; /* a partial last row of tiles */
    const int p = NRanks() - 1, tiles = Tiles(m, n);
    ASSERT_NO_FATAL_FAILURE(Channels(MACO_FUSED_GEMM_ALLREDUCE, m, n, k, MACO_FLOAT32));
    maco_fused_gemm_t op = Op(m, n, k);
    int last = -1;
    ASSERT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, &last), MACO_OK) << maco_log_last_error();
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    /* A GEMM per tile; on its owner (tile p of the plan: rank p mod nranks) a sum that also
     * writes every peer's out (mirrors, up to 9 ranks); one "done". */
    int owned = 0;
    for (int t = 0; t < tiles; t++)
        owned += t % NRanks() == Rank() ? 1 : 0;
    EXPECT_EQ(NTasks(), tiles + owned * (NRanks() <= 9 ? 1 : 1 + p) + 1);
    EXPECT_EQ(last, NTasks() - 1);
}

TEST_F(FusedBuilders, GemmReduceScatterValidatesWithTheDocumentedStructure)
{
    const uint32_t k = 64, n = 512, m = 96u * static_cast<uint32_t>(NRanks());
    const int p = NRanks() - 1, tiles = Tiles(m / NRanks(), n);
    ASSERT_NO_FATAL_FAILURE(Channels(MACO_FUSED_GEMM_REDUCE_SCATTER, m, n, k, MACO_BFLOAT16));
    maco_fused_gemm_t op = Op(m, n, k);
    op.out_type = MACO_BFLOAT16;
    ASSERT_EQ(maco_task_graph_add_gemm_reduce_scatter(g_, &op, nullptr), MACO_OK)
        << maco_log_last_error();
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    /* A ready signal per peer, a GEMM per tile of every rank's row block, a sum per tile of
     * this rank's block, done. */
    EXPECT_EQ(NTasks(), p + NRanks() * tiles + tiles + 1);
}

TEST_F(FusedBuilders, AllgatherGemmValidatesWithTheDocumentedStructure)
{
    const uint32_t m = 160, n = 256, k = 128; /* two row blocks, the second partial */
    const int blocks = 2, p = NRanks() - 1, tiles = Tiles(m, n);
    ASSERT_NO_FATAL_FAILURE(Channels(MACO_FUSED_ALLGATHER_GEMM, m, n, k, MACO_FLOAT32));
    maco_fused_gemm_t op = Op(m, n, k);
    ASSERT_EQ(maco_task_graph_add_allgather_gemm(g_, &op, nullptr), MACO_OK)
        << maco_log_last_error();
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    /* A ready signal per peer; per row block of A (160 x 128 bf16: 32 KiB, then 8 KiB) one put
     * to every peer at once (mirrors, up to 9 ranks; 256 KiB chunks); a GEMM per tile of every
     * rank's shard, and a copy out of scratch per tile of its partial last row; done. */
    const int partial = tiles / blocks;
    EXPECT_EQ(NTasks(), p + (p > 0 ? (NRanks() <= 9 ? 1 : p) * blocks : 0) +
                            NRanks() * (tiles + partial) + 1);
}

TEST_F(FusedBuilders, BadShapesAndChannelsAreRefused)
{
    ASSERT_NO_FATAL_FAILURE(Channels(MACO_FUSED_GEMM_ALLREDUCE, 256, 256, 64, MACO_FLOAT32));
    maco_test::AllowLog("maco_task_graph_add_");
    maco_fused_gemm_t op = Op(256, 200, 64);
    EXPECT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("256 x 200 x 64"), std::string::npos);
    op = Op(256, 256, 48);
    EXPECT_EQ(maco_task_graph_add_allgather_gemm(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
    op = Op(256, 256, 64);
    op.scratch = nullptr;
    EXPECT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
    if (NRanks() > 1) {
        op = Op(255, 256, 64);
        EXPECT_EQ(maco_task_graph_add_gemm_reduce_scatter(g_, &op, nullptr),
                  MACO_ERR_INVALID_ARGUMENT);
        std::vector<int> none(static_cast<size_t>(NRanks()), -1);
        op = Op(256, 256, 64);
        op.channels = none.data();
        EXPECT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(maco_log_last_error()).find("is not a channel of the graph"),
                  std::string::npos);
        /* A scratch smaller than maco_fused_gemm_scratch_bytes says so. */
        op = Op(512, 256, 64);
        EXPECT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(maco_log_last_error()).find("maco_fused_gemm_scratch_bytes"),
                  std::string::npos);
    }
    /* m = n = 2^20 would be 64M tiles: refused before any task is built, in no time (it
     * built 16M tasks before running out of host memory). */
    auto t0 = std::chrono::steady_clock::now();
    for (auto add : { maco_task_graph_add_gemm_allreduce, maco_task_graph_add_gemm_reduce_scatter,
                      maco_task_graph_add_allgather_gemm }) {
        op = Op(1u << 20, 1u << 20, 64);
        EXPECT_EQ(add(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(maco_log_last_error()).find("split the GEMM"), std::string::npos)
            << maco_log_last_error();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
    int ntasks = -1;
    EXPECT_EQ(maco_task_graph_get_ntasks(g_, &ntasks), MACO_OK);
    EXPECT_EQ(ntasks, 0);
}

TEST_F(FusedBuilders, KernelCreationWithoutAGpuIsUnsupported)
{
    int dev = -1;
    ASSERT_EQ(maco_comm_get_cuda_device(Comm(), &dev), MACO_OK);
    if (dev >= 0)
        GTEST_SKIP() << "this machine has a GPU";
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    ASSERT_EQ(maco_task_graph_add_task(g_, &t, nullptr), MACO_OK);
    maco_persistent_kernel_t k = nullptr;
    maco_test::AllowLog("maco_persistent_kernel_create");
    EXPECT_EQ(maco_persistent_kernel_create(Comm(), g_, nullptr, &k), MACO_ERR_UNSUPPORTED);
    EXPECT_EQ(k, nullptr);
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, true, false);
}
