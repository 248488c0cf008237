/*
 * test_fused_cpu.cc - the fused operators (GEMM + allreduce, GEMM + reduce-scatter, allgather +
 * GEMM) in the SM mode run end to end without a GPU, in the runtime's CPU simulation
 * (fused_sim.h: 1 to 4 simulated ranks in one process, memory channels as host pointers, every
 * element checked bit for bit over three launches), and their argument checks. The copy-engine
 * mode over real proxies: test_fused_ce_cpu.cc.
 */
#include <cstring>
#include <string>
#include <vector>

#include "fused_sim.h"

namespace
{

using fused_sim::Buf;
using fused_sim::FusedCpu;

TEST_F(FusedCpu, GemmAllreduce)
{
    for (int n = 1; n <= 4; n++) {
        SCOPED_TRACE("ranks " + std::to_string(n));
        Run({ MACO_FUSED_GEMM_ALLREDUCE, n, 200, 512, 64, MACO_FLOAT32, 3, 2, 1 });
        Run({ MACO_FUSED_GEMM_ALLREDUCE, n, 128, 384, 32, MACO_BFLOAT16, 2, 1, 2 });
    }
}

TEST_F(FusedCpu, GemmReduceScatter)
{
    for (int n = 1; n <= 4; n++) {
        SCOPED_TRACE("ranks " + std::to_string(n));
        /* 100 rows per rank (one partial row of tiles), and 32 (the M = 128 case at 4 ranks). */
        Run({ MACO_FUSED_GEMM_REDUCE_SCATTER, n, 100u * (uint32_t)n, 512, 64, MACO_BFLOAT16, 3, 2,
              1 });
        Run({ MACO_FUSED_GEMM_REDUCE_SCATTER, n, 32u * (uint32_t)n, 256, 32, MACO_FLOAT32, 1, 1,
              1 });
    }
}

TEST_F(FusedCpu, AllgatherGemm)
{
    for (int n = 1; n <= 4; n++) {
        SCOPED_TRACE("ranks " + std::to_string(n));
        Run({ MACO_FUSED_ALLGATHER_GEMM, n, 160, 256, 64, MACO_BFLOAT16, 2, 2, 1 });
        Run({ MACO_FUSED_ALLGATHER_GEMM, n, 32, 384, 32, MACO_FLOAT32, 1, 1, 1 });
        /* K = 1536: 384 KiB row blocks, each put in two chunks (256 KiB and 128 KiB). */
        Run({ MACO_FUSED_ALLGATHER_GEMM, n, 200, 128, 1536, MACO_BFLOAT16, 2, 2, 1 });
    }
}

/* Bad input: each error names what is wrong, and nothing is added. */
/* Scratch sizes whose products pass 2^64 are refused naming the arguments (regression:
 * (ALLGATHER, 64 ranks, m 2^28, n 128, k 2^29) returned 1,073,742,336 bytes: 64 x m x k x 2
 * wrapped to 0). */
TEST_F(FusedCpu, ScratchBytesThatPassSizeTAreRefused)
{
    maco_test::AllowLog("maco_fused_gemm_scratch_bytes");
    size_t bytes = 12345;
    EXPECT_EQ(maco_fused_gemm_scratch_bytes(MACO_FUSED_ALLGATHER_GEMM, 64, 1u << 28, 128, 1u << 29,
                                            MACO_FLOAT32, &bytes),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(bytes, 12345u);
    std::string msg = maco_log_last_error();
    EXPECT_NE(msg.find("nranks 64 x m 268435456 x k 536870912"), std::string::npos) << msg;
    EXPECT_EQ(maco_fused_gemm_scratch_bytes(MACO_FUSED_GEMM_ALLREDUCE, 64, UINT32_MAX, 1u << 31, 64,
                                            MACO_FLOAT32, &bytes),
              MACO_ERR_INVALID_ARGUMENT);
    msg = maco_log_last_error();
    EXPECT_NE(msg.find("nranks 64 x m"), std::string::npos) << msg;
    /* The largest that fits is still answered. */
    EXPECT_EQ(maco_fused_gemm_scratch_bytes(MACO_FUSED_ALLGATHER_GEMM, 64, 1u << 20, 128, 1u << 20,
                                            MACO_FLOAT32, &bytes),
              MACO_OK);
    EXPECT_GT(bytes, 64ull << 41);
}

TEST_F(FusedCpu, BadInputIsRefusedWithTheReason)
{
    maco_task_graph_t g = nullptr;
    ASSERT_EQ(maco_task_graph_create(&g), MACO_OK);
    Buf s, a, b, o;
    s.Alloc(1 << 20);
    a.Alloc(1 << 16);
    b.Alloc(1 << 16);
    o.Alloc(1 << 16);
    std::vector<int> ch(2, -1);
    maco_memory_channel_device_t h;
    memset(&h, 0, sizeof(h));
    h.local = s.p;
    h.remote = s.p;
    h.local_bytes = h.remote_bytes = 64; /* far too small */
    ASSERT_EQ(maco_task_graph_add_channel(g, &h, &ch[1]), MACO_OK);
    maco_fused_gemm_t op;
    memset(&op, 0, sizeof(op));
    op.channels = ch.data();
    op.a = a.p;
    op.b = b.p;
    op.out = o.p;
    op.scratch = s.p;
    op.m = 128;
    op.n = 128;
    op.k = 32;
    op.out_type = MACO_FLOAT32;
    maco_test::AllowLog("scratch");
    EXPECT_EQ(maco__fused_build(g, &op, MACO_FUSED_ALLGATHER_GEMM, 0, 2, 4, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("maco_fused_gemm_scratch_bytes"),
              std::string::npos)
        << maco_log_last_error();
    maco_test::AllowLog("out_type");
    op.out_type = MACO_FLOAT16;
    EXPECT_EQ(maco__fused_build(g, &op, MACO_FUSED_ALLGATHER_GEMM, 0, 2, 4, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("out_type"), std::string::npos);
    maco_test::AllowLog("multiple of the");
    op.out_type = MACO_FLOAT32;
    op.m = 129;
    EXPECT_EQ(maco__fused_build(g, &op, MACO_FUSED_GEMM_REDUCE_SCATTER, 0, 2, 4, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("multiple of the 2 ranks"), std::string::npos)
        << maco_log_last_error();
    maco_test::AllowLog("out_channels");
    op.m = 128;
    h.local_bytes = h.remote_bytes = 1 << 20;
    ASSERT_EQ(maco_task_graph_add_channel(g, &h, &ch[1]), MACO_OK);
    EXPECT_EQ(maco__fused_build(g, &op, MACO_FUSED_GEMM_ALLREDUCE, 0, 2, 4, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("out_channels"), std::string::npos);
    int ntasks = -1;
    EXPECT_EQ(maco_task_graph_get_ntasks(g, &ntasks), MACO_OK);
    EXPECT_EQ(ntasks, 0);
    maco_task_graph_destroy(g);
}

} // namespace
