/*
 * test_persistent_mp.cc - the fused operators' graph builders without a GPU, under maco-run:
 * every rank builds GEMM + allreduce and allgather + GEMM over fake (aligned) device pointers
 * and channel handles whose buffer sizes are the scratch's; validation then checks every put
 * against the channel's buffers, and the task counts follow the documented structure. On a
 * machine without a GPU, creating the kernel is refused with MACO_ERR_UNSUPPORTED.
 */
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
    /* Fake channels to every peer over a scratch of `bytes` on both sides. */
    void Channels(uint64_t bytes)
    {
        index_.assign(static_cast<size_t>(NRanks()), -1);
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            maco_memory_channel_device_t h;
            memset(&h, 0, sizeof(h));
            h.local_bytes = bytes;
            h.remote_bytes = bytes;
            ASSERT_EQ(maco_task_graph_add_channel(g_, &h, &index_[static_cast<size_t>(q)]),
                      MACO_OK);
        }
    }
    maco_fused_gemm_t Op(uint32_t m, uint32_t n, uint32_t k)
    {
        maco_fused_gemm_t op;
        memset(&op, 0, sizeof(op));
        op.comm = Comm();
        op.channels = index_.data();
        op.a = reinterpret_cast<void *>(0x10000000);
        op.b = reinterpret_cast<void *>(0x20000000);
        op.out = reinterpret_cast<void *>(0x30000000);
        op.scratch = reinterpret_cast<void *>(0x40000000);
        op.m = m;
        op.n = n;
        op.k = k;
        op.name = "op";
        return op;
    }
    int NTasks()
    {
        int n = 0;
        EXPECT_EQ(maco_task_graph_get_ntasks(g_, &n), MACO_OK);
        return n;
    }
    /* The tasks of maco_task_graph_add_gemm_allreduce's tiles on this rank (see the test). */
    int FusedAllreduceTasks(int tiles) const
    {
        const int n = NRanks(), p = n - 1;
        int sum = 0;
        for (int t = 0; t < tiles; t++)
            sum += 2 + (n == 1 ? 0 : t % n == Rank() ? 4 * p : 3);
        return sum;
    }
    maco_task_graph_t g_ = nullptr;
    std::vector<int> index_;
};

TEST_F(FusedBuilders, GemmAllreduceValidatesWithTheDocumentedStructure)
{
    const uint32_t m = 256, n = 384, k = 64;
    const int tiles = (256 / 128) * (384 / 128), p = NRanks() - 1;
    ASSERT_NO_FATAL_FAILURE(Channels(static_cast<uint64_t>(NRanks()) * m * n * 4));
    maco_fused_gemm_t op = Op(m, n, k);
    int last = -1;
    ASSERT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, &last), MACO_OK) << maco_log_last_error();
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    /* ready: a signal and a wait per peer; done; per tile: the GEMM and the copy to out, then
     * on its owner (rank t mod nranks) a wait per peer, p adds and a put and signal per peer;
     * elsewhere a put, signal and wait (nothing more with one rank). */
    EXPECT_EQ(NTasks(), 2 * p + 1 + FusedAllreduceTasks(tiles));
    EXPECT_GE(last, 0);
}

TEST_F(FusedBuilders, GemmAllreduceScratchTooSmallIsFoundByValidation)
{
    if (NRanks() < 2)
        GTEST_SKIP() << "no puts with one rank";
    ASSERT_NO_FATAL_FAILURE(Channels(256u * 384 * 2)); /* half a slot, not nranks of them */
    maco_fused_gemm_t op = Op(256, 384, 64);
    ASSERT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_OK);
    maco_test::AllowLog("leaves channel");
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_ERR_INVALID_ARGUMENT);
    std::string msg = maco_log_last_error();
    EXPECT_NE(msg.find("op put"), std::string::npos) << msg;
    EXPECT_NE(msg.find("leaves channel"), std::string::npos) << msg;
}

/* MACO_GEMM_TILE_WIDTH for the scope of one test. */
struct TileWidth {
    explicit TileWidth(const char *w)
    {
        setenv("MACO_GEMM_TILE_WIDTH", w, 1);
    }
    ~TileWidth()
    {
        unsetenv("MACO_GEMM_TILE_WIDTH");
    }
};

/* The wide tiles (MACO_GEMM_TILE_WIDTH=256): half as many tiles, and every put of a tile
 * (128 x 256 fp32) still inside the scratch. */
TEST_F(FusedBuilders, GemmAllreduceWideTilesValidate)
{
    TileWidth wide("256");
    const uint32_t m = 256, n = 512, k = 64;
    const int tiles = (256 / 128) * (512 / 256), p = NRanks() - 1;
    ASSERT_NO_FATAL_FAILURE(Channels(static_cast<uint64_t>(NRanks()) * m * n * 4));
    maco_fused_gemm_t op = Op(m, n, k);
    ASSERT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_OK)
        << maco_log_last_error();
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    EXPECT_EQ(NTasks(), 2 * p + 1 + FusedAllreduceTasks(tiles));
}

TEST_F(FusedBuilders, AllgatherGemmValidatesWithTheDocumentedStructure)
{
    for (int width : { 128, 256 }) {
        TileWidth w(width == 128 ? "128" : "256");
        maco_task_graph_destroy(g_);
        ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
        const uint32_t m = 256, n = 256, k = 128;
        const int blocks = 256 / 128, tn = 256 / width, p = NRanks() - 1;
        ASSERT_NO_FATAL_FAILURE(Channels(static_cast<uint64_t>(NRanks()) * m * k * 2));
        maco_fused_gemm_t op = Op(m, n, k);
        ASSERT_EQ(maco_task_graph_add_allgather_gemm(g_, &op, nullptr), MACO_OK)
            << maco_log_last_error();
        EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
        /* ready (2 per peer), done, per own block a copy and a put and signal per peer, a wait
         * per peer block, a GEMM tile per row block of every rank and column. */
        EXPECT_EQ(NTasks(), 2 * p + 1 + blocks * (1 + 2 * p) + p * blocks + NRanks() * blocks * tn)
            << "tile width " << width;
    }
}

TEST_F(FusedBuilders, BadShapesAndChannelsAreRefused)
{
    ASSERT_NO_FATAL_FAILURE(Channels(1u << 24));
    maco_test::AllowLog("maco_task_graph_add_");
    maco_fused_gemm_t op = Op(200, 256, 64);
    EXPECT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("200 x 256 x 64"), std::string::npos);
    op = Op(256, 256, 48);
    EXPECT_EQ(maco_task_graph_add_allgather_gemm(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
    op = Op(256, 256, 64);
    op.scratch = nullptr;
    EXPECT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
    if (NRanks() > 1) {
        std::vector<int> none(static_cast<size_t>(NRanks()), -1);
        op = Op(256, 256, 64);
        op.channels = none.data();
        EXPECT_EQ(maco_task_graph_add_gemm_allreduce(g_, &op, nullptr), MACO_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(maco_log_last_error()).find("is not a channel of the graph"),
                  std::string::npos);
    }
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
