/*
 * test_persistent_cpu.cc - the persistent-kernel runtime without a GPU: graph validation (every
 * error names the task) and the task-queue and scheduling protocol of maco/device/persistent.h
 * driven by host threads in the roles of worker and scheduler CTAs (the same functions the
 * kernel runs, compiled for the host), over the memory layout the kernel object uploads.
 */
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "maco_test.h"
#include "runtime/host/runtime_internal.h"

namespace
{

class TaskGraph : public maco_test::Test
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
    int Add(maco_task_t t)
    {
        int id = -1;
        EXPECT_EQ(maco_task_graph_add_task(g_, &t, &id), MACO_OK);
        return id;
    }
    /* A valid float32 add over fake (aligned) device pointers. */
    maco_task_t AddTask(const char *name)
    {
        maco_task_t t;
        memset(&t, 0, sizeof(t));
        t.type = MACO_TASK_ADD;
        t.datatype = MACO_FLOAT32;
        t.count = 16;
        t.out = reinterpret_cast<void *>(0x10000);
        t.a = reinterpret_cast<void *>(0x20000);
        t.b = reinterpret_cast<void *>(0x30000);
        t.name = name;
        return t;
    }
    /* Expects validation to fail with a message containing every one of `parts`. */
    void ExpectInvalid(const std::vector<std::string> &parts)
    {
        maco_test::AllowLog("maco_task_graph_validate");
        EXPECT_EQ(maco_task_graph_validate(g_), MACO_ERR_INVALID_ARGUMENT);
        std::string msg = maco_log_last_error();
        for (const auto &p : parts)
            EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
    maco_task_graph_t g_ = nullptr;
};

TEST_F(TaskGraph, EmptyGraphIsRejected)
{
    ExpectInvalid({ "no task" });
}

TEST_F(TaskGraph, ValidGraphPassesAndDuplicateEdgesCountOnce)
{
    int a = Add(AddTask("a")), b = Add(AddTask("b")), c = Add(AddTask("c"));
    ASSERT_EQ(maco_task_graph_add_dependency(g_, c, a), MACO_OK);
    ASSERT_EQ(maco_task_graph_add_dependency(g_, c, b), MACO_OK);
    ASSERT_EQ(maco_task_graph_add_dependency(g_, c, a), MACO_OK); /* again */
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    maco__pk_lowered_t l;
    ASSERT_EQ(maco__task_graph_lower(g_, "test", &l), MACO_OK);
    EXPECT_EQ(l.ntasks, 3u);
    EXPECT_EQ(l.nroots, 2u);
    EXPECT_EQ(l.tasks[c].ndeps, 2u);
    EXPECT_EQ(l.tasks[a].succ_count, 1u);
    EXPECT_EQ(l.succ[l.tasks[a].succ_begin], static_cast<uint32_t>(c));
    EXPECT_EQ(l.tasks[a].role, MACO_PK_ROLE_COMPUTE);
    maco__pk_lowered_free(&l);
    int n = 0;
    EXPECT_EQ(maco_task_graph_get_ntasks(g_, &n), MACO_OK);
    EXPECT_EQ(n, 3);
}

TEST_F(TaskGraph, UnknownDependencyNamesTheTask)
{
    Add(AddTask("first"));
    int b = Add(AddTask("second"));
    ASSERT_EQ(maco_task_graph_add_dependency(g_, b, 7), MACO_OK);
    ExpectInvalid({ "task 1", "\"second\"", "task 7", "does not exist" });
}

TEST_F(TaskGraph, DependencyOfAnUnknownTask)
{
    Add(AddTask("x"));
    ASSERT_EQ(maco_task_graph_add_dependency(g_, -3, 0), MACO_OK);
    ExpectInvalid({ "task -3", "does not exist" });
}

TEST_F(TaskGraph, SelfDependency)
{
    int a = Add(AddTask("loop"));
    ASSERT_EQ(maco_task_graph_add_dependency(g_, a, a), MACO_OK);
    ExpectInvalid({ "task 0", "\"loop\"", "itself" });
}

TEST_F(TaskGraph, CycleIsNamedTaskByTask)
{
    int root = Add(AddTask("root"));
    int x = Add(AddTask("x")), y = Add(AddTask("y")), z = Add(AddTask("z"));
    maco_task_graph_add_dependency(g_, x, root);
    maco_task_graph_add_dependency(g_, y, x);
    maco_task_graph_add_dependency(g_, z, y);
    maco_task_graph_add_dependency(g_, x, z); /* x -> y -> z -> x */
    ExpectInvalid({ "cycle", "3 of 4 tasks", "\"x\"", "\"y\"", "\"z\"" });
}

TEST_F(TaskGraph, ArgumentsOutOfRange)
{
    maco_task_t t = AddTask("bad type");
    t.type = static_cast<maco_task_type_t>(42);
    Add(t);
    ExpectInvalid({ "task 0", "\"bad type\"", "type 42" });
}

TEST_F(TaskGraph, ElementwiseChecks)
{
    maco_task_t t = AddTask("dtype");
    t.datatype = MACO_INT32;
    Add(t);
    ExpectInvalid({ "\"dtype\"", "datatype" });
}

TEST_F(TaskGraph, MisalignedPointer)
{
    maco_task_t t = AddTask("mis");
    t.b = reinterpret_cast<void *>(0x30002);
    Add(t);
    ExpectInvalid({ "\"mis\"", "b (", "aligned" });
}

TEST_F(TaskGraph, NullPointerAndZeroCount)
{
    maco_task_t t = AddTask("nul");
    t.type = MACO_TASK_SCALE;
    t.a = nullptr;
    Add(t);
    ExpectInvalid({ "\"nul\"", "a is NULL" });
}

TEST_F(TaskGraph, WaitNeedsACountAndAnAlignedCounter)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_WAIT;
    t.a = reinterpret_cast<void *>(0x1004);
    t.count = 1;
    t.name = "w";
    Add(t);
    ExpectInvalid({ "\"w\"", "8-byte aligned" });
}

/* Hostile sizes are refused before anything multiplies or adds them. */
TEST_F(TaskGraph, HostileCountsAreRefusedWithoutWrapping)
{
    maco_task_t w;
    memset(&w, 0, sizeof(w));
    w.type = MACO_TASK_WAIT;
    w.a = reinterpret_cast<void *>(0x1000);
    w.count = UINT64_MAX; /* count * (launch + 1) would wrap */
    w.name = "w";
    Add(w);
    ExpectInvalid({ "\"w\"", "count is 18446744073709551615", "2^32 - 1" });
}

TEST_F(TaskGraph, CopyOfAllOfMemoryIsRefused)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_COPY;
    t.out = reinterpret_cast<void *>(0x10000);
    t.a = reinterpret_cast<void *>(0x20000);
    t.count = UINT64_MAX; /* out + count wraps: the overlap test must not be fooled */
    t.name = "huge";
    Add(t);
    ExpectInvalid({ "\"huge\"", "past the end of memory" });
}

/* An address 4 KiB below the end of the address space, aligned for every element size. */
static void *NearTheEnd()
{
    return reinterpret_cast<void *>(UINTPTR_MAX - 4095);
}

/* Element-wise and GEMM ranges that run past the end of the address space are refused naming
 * the pointer (regression: only COPY's were; ADD, SUM and GEMM tiles wrapped). */
TEST_F(TaskGraph, AddRangesThatWrapAreRefused)
{
    maco_task_t t = AddTask("add out");
    t.count = 2048; /* 8 KiB of float32 from 4 KiB before the end */
    t.out = NearTheEnd();
    Add(t);
    ExpectInvalid({ "\"add out\"", "out", "past the end of memory" });
}

TEST_F(TaskGraph, AddInputRangesThatWrapAreRefused)
{
    maco_task_t t = AddTask("add b");
    t.rows = 2;
    t.count = 16;
    t.ld_in = t.ld_out = 1024; /* the second row of b is 4 KiB on: past the end */
    t.b = NearTheEnd();
    Add(t);
    ExpectInvalid({ "\"add b\"", "b: ", "past the end of memory" });
}

TEST_F(TaskGraph, SumInputsThatWrapAreRefused)
{
    maco_task_t t = AddTask("sum");
    t.type = MACO_TASK_SUM;
    t.b = nullptr;
    t.ninputs = 64;
    t.input_stride = 1ull << 59; /* 63 strides are past 2^64 */
    Add(t);
    ExpectInvalid({ "\"sum\"", "input_stride", "past the end of memory" });
}

TEST_F(TaskGraph, SumOutputThatWrapsIsRefused)
{
    maco_task_t t = AddTask("sum out");
    t.type = MACO_TASK_SUM;
    t.b = nullptr;
    t.ninputs = 2;
    t.input_stride = 64;
    t.count = 4096;
    t.out = NearTheEnd();
    Add(t);
    ExpectInvalid({ "\"sum out\"", "out", "past the end of memory" });
}

TEST_F(TaskGraph, AddOfTwoToThe64ElementsIsRefused)
{
    maco_task_t t = AddTask("add");
    t.count = UINT64_MAX;
    Add(t);
    ExpectInvalid({ "\"add\"", "below 2^24" });
}

TEST_F(TaskGraph, WaitCountAtTheLimitIsAccepted)
{
    maco_task_t w;
    memset(&w, 0, sizeof(w));
    w.type = MACO_TASK_WAIT;
    w.a = reinterpret_cast<void *>(0x1000);
    w.count = UINT32_MAX;
    Add(w);
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
}

TEST_F(TaskGraph, ChannelIndexAndPutRange)
{
    maco_memory_channel_device_t h;
    memset(&h, 0, sizeof(h));
    h.local_bytes = 4096;
    h.remote_bytes = 1024;
    int idx = -1;
    ASSERT_EQ(maco_task_graph_add_channel(g_, &h, &idx), MACO_OK);
    EXPECT_EQ(idx, 0);
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_CHANNEL_PUT;
    t.channel = 0;
    t.count = 512;
    t.dst_offset = 768; /* 768 + 512 > 1024 */
    t.name = "put";
    Add(t);
    ExpectInvalid({ "\"put\"", "leaves channel 0" });
}

TEST_F(TaskGraph, UnknownChannel)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_CHANNEL_SIGNAL;
    t.channel = 3;
    Add(t);
    ExpectInvalid({ "task 0", "channel_signal", "channel 3 does not exist" });
}

/* A 256-row GEMM tile task over fake device pointers (validation only reads the fields). */
static maco_task_t GemmTileTask(uint32_t n, uint32_t ldc, uint32_t tile_n, const char *name)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_GEMM_TILE;
    t.datatype = MACO_FLOAT32;
    t.a = t.b = t.out = reinterpret_cast<void *>(0x100000);
    t.m = 256;
    t.n = n;
    t.k = 64;
    t.ldc = ldc;
    t.tile_n = tile_n;
    t.name = name;
    return t;
}

TEST_F(TaskGraph, GemmTileRangesThatWrapAreRefused)
{
    maco_task_t t = GemmTileTask(384, 384, 0, "gemm");
    t.b = NearTheEnd(); /* B holds 64 x 384 bf16: 48 KiB */
    Add(t);
    ExpectInvalid({ "\"gemm\"", "B", "past the end of memory" });
}

TEST_F(TaskGraph, GemmTileOutputThatWrapsIsRefused)
{
    maco_task_t t = GemmTileTask(384, 384, 0, "gemm c");
    t.out = reinterpret_cast<void *>(uintptr_t{ 0 } - 65536); /* 128 rows of ldc 384 need more */
    Add(t);
    ExpectInvalid({ "\"gemm c\"", "C", "past the end of memory" });
}

TEST_F(TaskGraph, GemmTileChecksAndLowering)
{
    maco_task_t t = GemmTileTask(384, 384, 0, "g");
    t.datatype = MACO_BFLOAT16;
    t.tile_row = 1;
    t.tile_col = 2;
    Add(t);
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    maco__pk_lowered_t l;
    ASSERT_EQ(maco__task_graph_lower(g_, "test", &l), MACO_OK);
    EXPECT_EQ(l.ngemm_tasks, 1u);
    EXPECT_EQ(l.tasks[0].count, 64u | (384ull << 32));                       /* K | N << 32 */
    EXPECT_EQ(l.tasks[0].ptr[3], 128u | (static_cast<uint64_t>(256) << 32)); /* m0 | n0 */
    EXPECT_EQ(l.tasks[0].aux, 384u);
    EXPECT_EQ(l.tasks[0].gemm.tile_n, 128u); /* tile_n 0: the narrow width */
    maco__pk_lowered_free(&l);
}

TEST_F(TaskGraph, WideGemmTileChecksAndLowering)
{
    maco_task_t t = GemmTileTask(512, 256, MACO_GEMM_TILE_N_WIDE, "wide"); /* tiles stored one
                                                                               after another */
    t.tile_row = 1;
    t.tile_col = 1;
    Add(t);
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    maco__pk_lowered_t l;
    ASSERT_EQ(maco__task_graph_lower(g_, "test", &l), MACO_OK);
    EXPECT_EQ(l.tasks[0].ptr[3], 128u | (static_cast<uint64_t>(256) << 32)); /* m0 | n0 */
    EXPECT_EQ(l.tasks[0].gemm.tile_n, 256u);
    maco__pk_lowered_free(&l);
}

TEST_F(TaskGraph, WideGemmTileNeedsItsWidth)
{
    Add(GemmTileTask(384, 384, MACO_GEMM_TILE_N_WIDE, "w384")); /* n not a multiple of 256 */
    ExpectInvalid({ "\"w384\"", "n a non-zero multiple of 256 (tile_n)" });
}

TEST_F(TaskGraph, GemmTileWidthIs128Or256)
{
    Add(GemmTileTask(512, 512, 64, "w64"));
    ExpectInvalid({ "\"w64\"", "tile_n = 64: 0, 128 or 256" });
}

TEST_F(TaskGraph, WideGemmTileLdcAtLeastItsWidth)
{
    Add(GemmTileTask(512, 128, MACO_GEMM_TILE_N_WIDE, "ld"));
    ExpectInvalid({ "\"ld\"", "ldc = 128: at least 256 (tile_n)" });
}

/* Every element of C covered by exactly one planned tile, each tile inside C. */
static void ExpectPlanCoversC(uint32_t m, uint32_t n, const std::vector<maco_gemm_tile_t> &tiles)
{
    std::vector<int> cover(static_cast<size_t>(m / 128) * (n / 128), 0); /* per 128 x 128 */
    for (const maco_gemm_tile_t &t : tiles) {
        ASSERT_TRUE(t.tile_n == 128 || t.tile_n == 256) << t.tile_n;
        ASSERT_LT(t.tile_row, m / 128);
        ASSERT_LT(t.tile_col, n / t.tile_n);
        for (uint32_t h = 0; h < t.tile_n / 128; h++)
            cover[static_cast<size_t>(t.tile_row) * (n / 128) + t.tile_col * (t.tile_n / 128) +
                  h]++;
    }
    for (size_t i = 0; i < cover.size(); i++)
        ASSERT_EQ(cover[i], 1) << "128 x 128 block " << i << " of " << m << " x " << n;
}

static std::vector<maco_gemm_tile_t> Plan(uint32_t m, uint32_t n, int workers)
{
    size_t count = 0;
    EXPECT_EQ(maco_gemm_plan_tiles(m, n, workers, nullptr, &count), MACO_OK);
    std::vector<maco_gemm_tile_t> tiles(static_cast<size_t>(m / 128) * (n / 128));
    size_t got = 0;
    EXPECT_EQ(maco_gemm_plan_tiles(m, n, workers, tiles.data(), &got), MACO_OK);
    EXPECT_EQ(got, count);
    tiles.resize(got);
    return tiles;
}

TEST(GemmPlan, WideTilesInGroupsOfRowsAndANarrowLastRound)
{
    /* 4096 x 3584 on 128 workers: 32 x 14 wide tiles = 3.5 rounds; the last half round as 128
     * narrow tiles. Groups of ceil(128 / 14) = 10 rows, column by column. */
    std::vector<maco_gemm_tile_t> t = Plan(4096, 3584, 128);
    ASSERT_EQ(t.size(), 384u + 128u);
    ExpectPlanCoversC(4096, 3584, t);
    for (size_t i = 0; i < 384; i++)
        EXPECT_EQ(t[i].tile_n, 256u) << i;
    for (size_t i = 384; i < t.size(); i++)
        EXPECT_EQ(t[i].tile_n, 128u) << i;
    EXPECT_EQ(t[1].tile_row, 1u);
    EXPECT_EQ(t[1].tile_col, 0u);
    EXPECT_EQ(t[10].tile_row, 0u); /* the group's next column */
    EXPECT_EQ(t[10].tile_col, 1u);
    EXPECT_EQ(t[140].tile_row, 10u); /* the second group */
    EXPECT_EQ(t[140].tile_col, 0u);
    EXPECT_EQ(t[385].tile_col, t[384].tile_col + 1); /* a wide tile's two halves, in turn */
    /* 4096^3: 512 wide tiles, 4 whole rounds, groups of 8 rows. */
    t = Plan(4096, 4096, 128);
    ASSERT_EQ(t.size(), 512u);
    ExpectPlanCoversC(4096, 4096, t);
    EXPECT_EQ(t[8].tile_row, 0u);
    EXPECT_EQ(t[8].tile_col, 1u);
}

TEST(GemmPlan, NarrowTilesWhenWideOnesCannotFillTheWorkers)
{
    /* 128 x 8192 on 132 workers: 32 wide tiles would leave 100 idle; 64 narrow ones. */
    std::vector<maco_gemm_tile_t> t = Plan(128, 8192, 132);
    ASSERT_EQ(t.size(), 64u);
    ExpectPlanCoversC(128, 8192, t);
    /* n not a multiple of 256. */
    t = Plan(4096, 384, 8);
    ASSERT_EQ(t.size(), 32u * 3);
    ExpectPlanCoversC(4096, 384, t);
    for (const maco_gemm_tile_t &x : t)
        EXPECT_EQ(x.tile_n, 128u);
}

TEST(GemmPlan, TileWidthSetting)
{
    setenv("MACO_GEMM_TILE_WIDTH", "128", 1);
    std::vector<maco_gemm_tile_t> t = Plan(4096, 4096, 128);
    EXPECT_EQ(t.size(), 1024u);
    setenv("MACO_GEMM_TILE_WIDTH", "256", 1);
    t = Plan(128, 8192, 132); /* wide although they leave workers idle, and no narrow tail */
    EXPECT_EQ(t.size(), 32u);
    ExpectPlanCoversC(128, 8192, t);
    unsetenv("MACO_GEMM_TILE_WIDTH");
}

TEST(GemmPlan, EveryShapeCovered)
{
    std::mt19937 rng(7);
    for (int i = 0; i < 300; i++) {
        uint32_t m = 128 * (1 + rng() % 40), n = 128 * (1 + rng() % 40);
        int workers = 1 + static_cast<int>(rng() % 200);
        ASSERT_NO_FATAL_FAILURE(ExpectPlanCoversC(m, n, Plan(m, n, workers)))
            << m << " x " << n << ", " << workers << " workers";
    }
}

TEST(GemmPlan, BadArguments)
{
    maco_test::AllowLog("maco_gemm_plan_tiles");
    size_t count = 0;
    EXPECT_EQ(maco_gemm_plan_tiles(0, 256, 8, nullptr, &count), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_gemm_plan_tiles(256, 200, 8, nullptr, &count), MACO_ERR_INVALID_ARGUMENT);
    /* A partial last row of tiles is a row: 200 x 256 on 8 workers is 2 x 2 narrow tiles. */
    EXPECT_EQ(maco_gemm_plan_tiles(200, 256, 8, nullptr, &count), MACO_OK);
    EXPECT_EQ(count, 4u);
    EXPECT_EQ(maco_gemm_plan_tiles(256, 256, 0, nullptr, &count), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_gemm_plan_tiles(256, 256, 8, nullptr, nullptr), MACO_ERR_INVALID_ARGUMENT);
}

/* Counting the tiles of the largest C the arguments allow is closed form: instant, and the
 * count is rows x columns of 128 x 128 (n is not a multiple of 256: narrow tiles). */
TEST(GemmPlan, CountingHugeShapesTakesNoTime)
{
    const uint32_t m = 0xFFFFFF80u, n = 0xFFFFFF80u; /* 2^32 - 128 */
    auto t0 = std::chrono::steady_clock::now();
    size_t count = 0;
    ASSERT_EQ(maco_gemm_plan_tiles(m, n, 132, nullptr, &count), MACO_OK);
    ASSERT_EQ(maco_gemm_plan_tiles(1u << 24, 1u << 24, 132, nullptr, &count), MACO_OK);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 0.5);
    /* 2^24 x 2^24: 2^17 rows of 2^16 wide tiles, plus one more tile per wide tile of a last
     * round that would leave at least half of the workers idle (split in two narrow ones). */
    size_t wide = (size_t{ 1 } << 17) * (size_t{ 1 } << 16);
    size_t tail = wide % 132;
    EXPECT_EQ(count, tail != 0 && 2 * tail <= 132 ? wide + tail : wide);
    ASSERT_EQ(maco_gemm_plan_tiles(m, n, 132, nullptr, &count), MACO_OK);
    EXPECT_EQ(count, size_t{ 33554431 } * 33554431);
}

TEST_F(TaskGraph, GemmTileOutOfRange)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_GEMM_TILE;
    t.datatype = MACO_FLOAT32;
    t.a = reinterpret_cast<void *>(0x100000);
    t.b = reinterpret_cast<void *>(0x200000);
    t.out = reinterpret_cast<void *>(0x300000);
    t.m = 256;
    t.n = 256;
    t.k = 64;
    t.ldc = 256;
    t.tile_row = 2; /* only 2 tile rows: 0 and 1 */
    t.name = "far";
    Add(t);
    ExpectInvalid({ "\"far\"", "tile (2, 0) is outside the 2 x 2 tiles" });
}

TEST_F(TaskGraph, GemmTileShape)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_GEMM_TILE;
    t.datatype = MACO_FLOAT32;
    t.a = t.b = t.out = reinterpret_cast<void *>(0x100000);
    t.m = 256;
    t.n = 200;
    t.k = 64;
    t.ldc = 256;
    Add(t);
    ExpectInvalid({ "gemm_tile", "256 x 200 x 64", "n a non-zero multiple of 128" });
}

/* m need not be a multiple of 128: the last row of tiles is partial, and rows past it do not
 * exist. */
TEST_F(TaskGraph, GemmTilePartialLastRow)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_GEMM_TILE;
    t.datatype = MACO_BFLOAT16;
    t.a = t.b = t.out = reinterpret_cast<void *>(0x100000);
    t.m = 200;
    t.n = 256;
    t.k = 64;
    t.ldc = 256;
    t.tile_row = 1; /* rows 128..199 */
    Add(t);
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
    t.tile_row = 2;
    Add(t);
    ExpectInvalid({ "gemm_tile", "tile (2, 0) is outside the 2 x 2 tiles" });
}

TEST_F(TaskGraph, RowsOfAnElementwiseTask)
{
    maco_task_t t = AddTask("rows");
    t.rows = 4;
    t.ld_in = 8; /* below count (16) */
    t.ld_out = 16;
    Add(t);
    ExpectInvalid({ "\"rows\"", "rows = 4, ld_in = 8" });
}

TEST_F(TaskGraph, GateAndSignalAreChecked)
{
    static uint64_t ctr[2];
    maco_task_t t = AddTask("gated");
    t.wait_on = reinterpret_cast<const uint64_t *>(reinterpret_cast<uintptr_t>(ctr) + 4);
    t.wait_count = 1;
    Add(t);
    ExpectInvalid({ "\"gated\"", "gate: wait_on", "8-byte aligned" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.wait_on = ctr;
    t.wait_count = 0;
    Add(t);
    ExpectInvalid({ "\"gated\"", "wait_count (0) at least 1" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.wait_count = 1;
    t.signal_to = reinterpret_cast<uint64_t *>(reinterpret_cast<uintptr_t>(ctr) + 2);
    Add(t);
    ExpectInvalid({ "\"gated\"", "signal_to" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.signal_to = &ctr[1];
    Add(t);
    EXPECT_EQ(maco_task_graph_validate(g_), MACO_OK) << maco_log_last_error();
}

TEST_F(TaskGraph, SumAndCopyBlocksAreChecked)
{
    maco_task_t t = AddTask("sum");
    t.type = MACO_TASK_SUM;
    t.ninputs = 0;
    Add(t);
    ExpectInvalid({ "\"sum\"", "sum of 0 inputs", "1 to 64 inputs" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.ninputs = 4;
    t.input_stride = 6; /* not a multiple of 4 bytes */
    Add(t);
    ExpectInvalid({ "\"sum\"", "multiple of the 4-byte element" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    maco_task_t c = AddTask("copy2d");
    c.type = MACO_TASK_COPY;
    c.count = 64;
    c.rows = 4;
    c.ld_in = c.ld_out = 0x4000;
    c.a = reinterpret_cast<void *>(0x10000);
    c.out = reinterpret_cast<void *>(0x10000 + 3 * 0x4000); /* the last row of a: overlap */
    Add(c);
    ExpectInvalid({ "\"copy2d\"", "overlapping" });
}

/* A slice of K of a wider A (split-K): ld_in is A's row stride, at least k, a multiple of 8. */
TEST_F(TaskGraph, GemmTileSliceOfK)
{
    maco_task_t t = GemmTileTask(256, 256, 0, "slice");
    t.ld_in = 32; /* below k = 64 */
    Add(t);
    ExpectInvalid({ "\"slice\"", "ld_in = 32 (A's row stride)", "at least k = 64" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.ld_in = 100; /* not a multiple of 8 (TMA rows of 16 bytes) */
    Add(t);
    ExpectInvalid({ "\"slice\"", "ld_in = 100", "a multiple of 8" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.ld_in = 4096;
    Add(t);
    t.ld_in = 0;
    Add(t);
    maco__pk_lowered_t l;
    ASSERT_EQ(maco__task_graph_lower(g_, "test", &l), MACO_OK) << maco_log_last_error();
    EXPECT_EQ(l.ngemm_tasks, 2u);
    EXPECT_EQ(l.nstrided_gemm, 1u); /* what the cuBLASDx kernel refuses */
    maco__pk_lowered_free(&l);
}

/* A SUM may round fp32 inputs to bf16 (split-K's partial products); nothing else changes type. */
TEST_F(TaskGraph, SumIntoAnotherTypeIsFp32ToBf16Only)
{
    maco_task_t t = AddTask("partials");
    t.type = MACO_TASK_SUM;
    t.ninputs = 2;
    t.input_stride = 4096;
    t.rows = 128;
    t.count = 128;
    t.ld_in = t.ld_out = 256;
    t.out = reinterpret_cast<void *>(0x10002); /* 2-byte aligned: enough for bf16 */
    t.out_datatype = MACO_BFLOAT16;
    Add(t);
    maco__pk_lowered_t l;
    ASSERT_EQ(maco__task_graph_lower(g_, "test", &l), MACO_OK) << maco_log_last_error();
    EXPECT_EQ(l.tasks[0].dtype, MACO_FLOAT32);
    EXPECT_EQ(l.tasks[0].sum.out_dtype, MACO_BFLOAT16);
    maco__pk_lowered_free(&l);
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.datatype = MACO_BFLOAT16;
    t.out_datatype = MACO_FLOAT32;
    t.out = reinterpret_cast<void *>(0x10000);
    Add(t);
    ExpectInvalid(
        { "\"partials\"", "out_datatype 8 with datatype 7", "MACO_BFLOAT16 from MACO_FLOAT32" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    maco_task_t a = AddTask("add");
    a.out_datatype = MACO_BFLOAT16;
    Add(a);
    ExpectInvalid({ "\"add\"", "only a SUM's output may differ" });
    /* Without out_datatype the SUM's output keeps the inputs' type and alignment. */
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.datatype = MACO_FLOAT32;
    t.out_datatype = MACO_INT8; /* 0: the same as datatype */
    t.out = reinterpret_cast<void *>(0x10002);
    Add(t);
    ExpectInvalid({ "\"partials\"", "out (0x10002) is not aligned to its 4-byte elements" });
}

/* wait_need: the gate of the wait_need-th of the launch's signals, at most wait_count. */
TEST_F(TaskGraph, GateOfTheNthSignal)
{
    static uint64_t ctr;
    maco_task_t t = AddTask("nth");
    t.wait_on = &ctr;
    t.wait_count = 5;
    t.wait_need = 6;
    Add(t);
    ExpectInvalid({ "\"nth\"", "wait_need 6 is above wait_count 5" });
    maco_task_graph_destroy(g_);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    t.wait_need = 2;
    Add(t);
    maco__pk_lowered_t l;
    ASSERT_EQ(maco__task_graph_lower(g_, "test", &l), MACO_OK) << maco_log_last_error();
    EXPECT_EQ(l.sync[0].wait_count, 5u);
    EXPECT_EQ(l.sync[0].wait_need, 2u);
    /* Launch r opens at 5 r + 2; without wait_need at 5 (r + 1). */
    EXPECT_EQ(maco__pk_gate_want(&l.sync[0], 0), 2u);
    EXPECT_EQ(maco__pk_gate_want(&l.sync[0], 3), 17u);
    l.sync[0].wait_need = 0;
    EXPECT_EQ(maco__pk_gate_want(&l.sync[0], 3), 20u);
    maco__pk_lowered_free(&l);
}

TEST_F(TaskGraph, NullArguments)
{
    maco_test::AllowLog("NULL");
    EXPECT_EQ(maco_task_graph_create(nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_task_graph_add_task(g_, nullptr, nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_task_graph_add_dependency(nullptr, 0, 1), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_task_graph_destroy(nullptr), MACO_OK);
}

/* ---------------------------------------------------------------- the protocol on the host */

/* One queue of `cap` slots in host memory, and a view holding just it (the spin helper reads
 * the view's counters and bound). */
struct HostQueue {
    explicit HostQueue(uint64_t cap) : slots(cap, 0), ctl(64, 0), ctr(MACO_PK_CTR_WORDS, 0)
    {
        q.slots = slots.data();
        q.reserve = &ctl[0];
        q.head = &ctl[16];
        q.capacity = cap;
        memset(&v, 0, sizeof(v));
        v.queues = &q;
        v.ctr = ctr.data();
        v.bound.timeout_ns = 10ull * 1000 * 1000 * 1000;
    }
    std::vector<uint64_t> slots, ctl, ctr;
    maco_pk_queue_t q;
    maco_pk_view_t v;
};

TEST(PersistentQueue, ManyProducersOneConsumerSmallRing)
{
    HostQueue hq(32);
    const int kProducers = 3, kEach = 3000;
    std::vector<std::thread> producers;
    std::atomic<int> push_errors{ 0 };
    for (int p = 0; p < kProducers; p++)
        producers.emplace_back([&, p] {
            for (int i = 0; i < kEach; i++)
                if (maco_pk_queue_push(&hq.v, &hq.q, static_cast<uint32_t>(p * kEach + i)) !=
                    MACO_OK)
                    push_errors++;
        });
    std::vector<int> last(kProducers, -1), seen(kProducers * kEach, 0);
    int got = 0, out_of_order = 0;
    while (got < kProducers * kEach) {
        uint32_t t;
        if (!maco_pk_queue_pop(&hq.q, &t)) {
            std::this_thread::yield(); /* two CPU cores in CI: let the producers run */
            continue;
        }
        ASSERT_LT(t, static_cast<uint32_t>(kProducers * kEach));
        seen[t]++;
        int p = static_cast<int>(t) / kEach, i = static_cast<int>(t) % kEach;
        if (i <= last[p])
            out_of_order++; /* one producer's pushes arrive in its order */
        last[p] = i;
        got++;
    }
    for (auto &th : producers)
        th.join();
    EXPECT_EQ(push_errors.load(), 0);
    EXPECT_EQ(out_of_order, 0);
    for (int i = 0; i < kProducers * kEach; i++)
        ASSERT_EQ(seen[i], 1) << "task " << i;
    uint32_t t;
    EXPECT_EQ(maco_pk_queue_pop(&hq.q, &t), 0);
}

/* A lowered graph laid out in host memory as the kernel object lays it out on the device. */
struct HostKernel {
    maco__pk_lowered_t l{};
    std::vector<uint64_t> fixed, state; /* 8-byte aligned backing */
    maco_pk_view_t v{};
    maco_device_error_t report{};
    int32_t claim = 0;

    maco_status_t Build(maco_task_graph_t g, uint32_t W, uint32_t C, uint32_t S,
                        uint64_t timeout_ns)
    {
        maco_status_t st = maco__task_graph_lower(g, "test", &l);
        if (st != MACO_OK)
            return st;
        size_t fb = 0, sb = 0;
        maco__pk_layout(&l, nullptr, 0, W, C, S, 0, nullptr, nullptr, nullptr, &v, &fb, &sb);
        fixed.assign(fb / 8 + 1, 0);
        state.assign(sb / 8 + 1, 0);
        maco__pk_layout(&l, nullptr, 0, W, C, S, 0, fixed.data(), state.data(), fixed.data(), &v,
                        &fb, &sb);
        v.bound.report = &report;
        v.bound.claim = &claim;
        v.bound.timeout_ns = timeout_ns;
        return MACO_OK;
    }
    ~HostKernel()
    {
        maco__pk_lowered_free(&l);
    }

    /* One launch with threads as CTAs: `exec` runs a task on a worker (returns false to
     * leave the task unfinished and the worker stuck). Returns the statuses seen. */
    template <typename Exec> std::vector<maco_status_t> Launch(uint64_t run, Exec exec)
    {
        uint32_t nw = v.nworkers + v.ncomm;
        std::vector<maco_status_t> status(nw + v.nschedulers, MACO_OK);
        std::vector<std::thread> threads;
        for (uint32_t w = 0; w < nw; w++)
            threads.emplace_back([&, w] {
                for (;;) {
                    uint32_t t = 0;
                    maco_status_t st = MACO_OK;
                    int got = maco_pk_next_ready(&v, w, run, &t, &st);
                    if (got <= 0) {
                        status[w] = got < 0 ? st : MACO_OK;
                        return;
                    }
                    if (!exec(w, t))
                        return;
                    maco_pk_post_signal(&v, t);
                    maco_pk_complete(&v, t, run, 0, 1);
                }
            });
        for (uint32_t s = 0; s < v.nschedulers; s++)
            threads.emplace_back([&, s] { status[nw + s] = maco_pk_schedule(&v, s, run); });
        for (auto &th : threads)
            th.join();
        return status;
    }
};

/* A random DAG of n tasks: each task depends on up to `maxdeg` earlier ones; some are comm. */
static void RandomDag(maco_task_graph_t g, int n, int maxdeg, uint64_t seed,
                      std::vector<std::vector<int>> *preds)
{
    std::mt19937_64 rng(seed);
    preds->assign(static_cast<size_t>(n), {});
    for (int i = 0; i < n; i++) {
        maco_task_t t;
        memset(&t, 0, sizeof(t));
        t.type = MACO_TASK_NOP;
        t.role = rng() % 5 == 0 ? MACO_TASK_ROLE_COMM : MACO_TASK_ROLE_COMPUTE;
        ASSERT_EQ(maco_task_graph_add_task(g, &t, nullptr), MACO_OK);
        int deg = i == 0 ? 0 : static_cast<int>(rng() % static_cast<uint64_t>(maxdeg + 1));
        for (int d = 0; d < deg; d++) {
            int p = static_cast<int>(rng() % static_cast<uint64_t>(i));
            ASSERT_EQ(maco_task_graph_add_dependency(g, i, p), MACO_OK);
            (*preds)[static_cast<size_t>(i)].push_back(p);
        }
    }
}

class PersistentProtocol : public maco_test::Test
{
};

TEST_F(PersistentProtocol, RandomDagsRunInDependencyOrderOnHostThreads)
{
    const uint32_t splits[][3] = { { 1, 0, 1 }, { 4, 1, 2 }, { 7, 2, 3 } };
    for (const auto &sp : splits) {
        maco_task_graph_t g;
        ASSERT_EQ(maco_task_graph_create(&g), MACO_OK);
        std::vector<std::vector<int>> preds;
        const int n = 3000;
        ASSERT_NO_FATAL_FAILURE(RandomDag(g, n, 4, 1234 + sp[0], &preds));
        HostKernel k;
        ASSERT_EQ(k.Build(g, sp[0], sp[1], sp[2], 20ull * 1000 * 1000 * 1000), MACO_OK);
        for (uint64_t run = 0; run < 3; run++) { /* replays: the counters run on */
            std::vector<std::atomic<int>> done(n);
            for (auto &d : done)
                d = 0;
            std::atomic<int> early{ 0 }, wrong_role{ 0 };
            auto st = k.Launch(run, [&](uint32_t w, uint32_t t) {
                for (int p : preds[t])
                    if (done[static_cast<size_t>(p)].load(std::memory_order_relaxed) == 0)
                        early++;
                bool comm_worker = w >= k.v.nworkers;
                if (k.v.ncomm > 0 && comm_worker != (k.l.tasks[t].role == MACO_PK_ROLE_COMM))
                    wrong_role++;
                done[t].fetch_add(1, std::memory_order_relaxed);
                return true;
            });
            for (auto s : st)
                EXPECT_EQ(s, MACO_OK);
            EXPECT_EQ(early.load(), 0) << "split " << sp[0] << "/" << sp[1] << "/" << sp[2];
            EXPECT_EQ(wrong_role.load(), 0);
            for (int i = 0; i < n; i++)
                ASSERT_EQ(done[static_cast<size_t>(i)].load(), 1) << "task " << i << " run " << run;
            EXPECT_EQ(k.v.ctr[MACO_PK_CTR_DONE], static_cast<uint64_t>(n) * (run + 1));
        }
        EXPECT_EQ(k.report.status, 0);
        maco_task_graph_destroy(g);
    }
}

TEST_F(PersistentProtocol, ThousandsOfIndependentTasksThroughFullQueues)
{
    /* 10000 roots, one worker: its queue (4096 slots) fills and the scheduler waits. */
    maco_task_graph_t g;
    ASSERT_EQ(maco_task_graph_create(&g), MACO_OK);
    const int n = 10000;
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    for (int i = 0; i < n; i++)
        ASSERT_EQ(maco_task_graph_add_task(g, &t, nullptr), MACO_OK);
    HostKernel k;
    ASSERT_EQ(k.Build(g, 1, 0, 1, 20ull * 1000 * 1000 * 1000), MACO_OK);
    EXPECT_EQ(k.v.queues[0].capacity, 4096u);
    std::vector<int> count(n, 0);
    auto st = k.Launch(0, [&](uint32_t, uint32_t id) {
        count[id]++;
        return true;
    });
    for (auto s : st)
        EXPECT_EQ(s, MACO_OK);
    for (int i = 0; i < n; i++)
        ASSERT_EQ(count[i], 1);
    maco_task_graph_destroy(g);
}

TEST_F(PersistentProtocol, StuckTaskIsBoundedAndReported)
{
    /* a -> b; the worker that gets `a` never finishes it: the others time out (2 x bound)
     * with MACO_DEVICE_WAIT_TASK, abort, and every thread leaves. */
    maco_task_graph_t g;
    ASSERT_EQ(maco_task_graph_create(&g), MACO_OK);
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    int a, b;
    ASSERT_EQ(maco_task_graph_add_task(g, &t, &a), MACO_OK);
    ASSERT_EQ(maco_task_graph_add_task(g, &t, &b), MACO_OK);
    ASSERT_EQ(maco_task_graph_add_dependency(g, b, a), MACO_OK);
    HostKernel k;
    ASSERT_EQ(k.Build(g, 2, 0, 1, 50ull * 1000 * 1000), MACO_OK);
    auto t0 = std::chrono::steady_clock::now();
    auto st = k.Launch(0, [&](uint32_t, uint32_t id) { return id != static_cast<uint32_t>(a); });
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 5.0);
    EXPECT_EQ(k.report.status, MACO_ERR_TIMEOUT);
    EXPECT_EQ(k.report.what, static_cast<uint32_t>(MACO_DEVICE_WAIT_TASK));
    EXPECT_EQ(k.report.expected, 2u); /* the launch ends at 2 finished tasks */
    EXPECT_EQ(k.report.observed, 0u);
    EXPECT_NE(k.v.ctr[MACO_PK_CTR_ABORT], 0u);
    int timeouts = 0;
    for (auto s : st)
        timeouts += s == MACO_ERR_TIMEOUT || s == MACO_ERR_REMOTE;
    EXPECT_GE(timeouts, 1);
    maco_task_graph_destroy(g);
}

/* Roots reach the workers in the graph's order, those of a role dealt to its workers in turn
 * (maco_gemm_plan_tiles' order relies on it), whichever scheduler lane pushes them. */
TEST_F(PersistentProtocol, RootsReachEachWorkerInTheGraphsOrder)
{
    maco_task_graph_t g;
    ASSERT_EQ(maco_task_graph_create(&g), MACO_OK);
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    for (int i = 0; i < 40; i++) {
        t.role = i % 5 == 4 ? MACO_TASK_ROLE_COMM : MACO_TASK_ROLE_COMPUTE;
        ASSERT_EQ(maco_task_graph_add_task(g, &t, nullptr), MACO_OK);
    }
    HostKernel k;
    ASSERT_EQ(k.Build(g, 3, 2, 2, 2000ull * 1000 * 1000), MACO_OK);
    std::vector<std::vector<int>> seen(5);
    std::mutex mu;
    auto st = k.Launch(0, [&](uint32_t w, uint32_t id) {
        std::lock_guard<std::mutex> lock(mu);
        seen[w].push_back(static_cast<int>(id));
        return true;
    });
    for (auto s2 : st)
        EXPECT_EQ(s2, MACO_OK);
    int ncomp = 0, ncomm = 0;
    std::vector<std::vector<int>> want(5);
    for (int i = 0; i < 40; i++)
        want[i % 5 == 4 ? 3 + ncomm++ % 2 : ncomp++ % 3].push_back(i);
    for (int w = 0; w < 5; w++)
        EXPECT_EQ(seen[w], want[w]) << "worker " << w;
    maco_task_graph_destroy(g);
}

/* Gates: a task whose gate is closed is put back and the worker runs the others; a counter
 * that a "peer" (another thread) signals opens it; one that never comes is reported as the
 * gate's timeout naming the peer, within the bound, and the launch ends. */
TEST_F(PersistentProtocol, ClosedGatesHoldNoWorkerAndTimeOutNamingThePeer)
{
    static uint64_t counter[2];
    counter[0] = counter[1] = 0;
    maco_task_graph_t g;
    ASSERT_EQ(maco_task_graph_create(&g), MACO_OK);
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.wait_on = &counter[0];
    t.wait_count = 1;
    t.wait_peer = 3;
    int gated;
    ASSERT_EQ(maco_task_graph_add_task(g, &t, &gated), MACO_OK);
    /* Ten ungated tasks behind it on the one worker, the last of which opens the gate. */
    memset(&t, 0, sizeof(t));
    std::vector<int> others(10);
    for (int &o : others)
        ASSERT_EQ(maco_task_graph_add_task(g, &t, &o), MACO_OK);
    HostKernel k;
    ASSERT_EQ(k.Build(g, 1, 0, 1, 2000ull * 1000 * 1000), MACO_OK);
    std::vector<int> order;
    auto st = k.Launch(0, [&](uint32_t, uint32_t id) {
        order.push_back(static_cast<int>(id));
        if (id == static_cast<uint32_t>(others.back()))
            __atomic_fetch_add(&counter[0], 1, __ATOMIC_RELEASE);
        return true;
    });
    for (auto s2 : st)
        EXPECT_EQ(s2, MACO_OK);
    ASSERT_EQ(order.size(), 11u);
    EXPECT_EQ(order.back(), gated); /* put back until the last of the others opened it */
    /* The next launch wants 2 signals; none comes: the gate's own timeout, naming rank 3. */
    maco_task_graph_destroy(g);
    ASSERT_EQ(maco_task_graph_create(&g), MACO_OK);
    memset(&t, 0, sizeof(t));
    t.wait_on = &counter[1];
    t.wait_count = 1;
    t.wait_peer = 3;
    ASSERT_EQ(maco_task_graph_add_task(g, &t, nullptr), MACO_OK);
    HostKernel k2;
    ASSERT_EQ(k2.Build(g, 1, 0, 1, 50ull * 1000 * 1000), MACO_OK);
    auto t0 = std::chrono::steady_clock::now();
    st = k2.Launch(0, [&](uint32_t, uint32_t) { return true; });
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 5.0);
    EXPECT_EQ(k2.report.status, MACO_ERR_TIMEOUT);
    EXPECT_EQ(k2.report.what, static_cast<uint32_t>(MACO_DEVICE_WAIT_TASK_GATE));
    EXPECT_EQ(k2.report.peer, 3);
    EXPECT_EQ(k2.report.expected, 1u);
    EXPECT_EQ(k2.report.observed, 0u);
    EXPECT_EQ(st[0], MACO_ERR_TIMEOUT);
    maco_task_graph_destroy(g);
}

} // namespace
