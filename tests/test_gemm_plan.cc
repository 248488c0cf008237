/*
 * test_gemm_plan.cc - maco_gemm_plan, the per-shape plan of a GEMM's tiles (width, narrow last
 * round, split-K, order), checked as a pure function: every tile of C covered once, the round
 * counts and the last round's occupancy, split-K only where C has fewer tiles than workers and
 * only when the model says it is faster, the order's groups (whole rows per round, B's columns
 * visited once per group, the group raised to what L2 holds), on the shapes of the fused
 * operators' sets (tests/python/bench_fused.py: tp, hidden 8192, and llama70b, Llama-3-70B's
 * MLP, at tensor parallel 2, 4 and 8) and on random shapes.
 */
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "maco_test.h"

namespace
{

struct Shape {
    uint32_t m, n, k;
};

/* The GEMM each rank runs in the fused operators of bench_fused.py's sets at `ws` ranks, for M
 * = 128 .. 8192: (M, N, K) of the row-parallel operators and of allgather + GEMM (M rows of the
 * gathered A). */
std::vector<Shape> FusedSets(uint32_t ws)
{
    std::vector<Shape> s;
    const uint32_t hidden = 8192, mlp = 28672;
    for (uint32_t m : { 128u, 256u, 512u, 1024u, 2048u, 4096u, 8192u }) {
        s.push_back({ m, hidden, hidden / ws }); /* tp: gemm_allreduce, gemm_reduce_scatter */
        s.push_back({ m, hidden / ws, hidden }); /* tp: allgather_gemm */
        s.push_back({ m, hidden, mlp / ws });    /* llama70b: gemm_reduce_scatter */
        s.push_back({ m, mlp / ws, hidden });    /* llama70b: allgather_gemm */
    }
    return s;
}

struct Planned {
    maco_gemm_plan_t p;
    std::vector<maco_gemm_tile_t> tiles;
};

Planned Plan(const Shape &s, int workers, uint64_t l2, uint32_t max_split)
{
    Planned r;
    memset(&r.p, 0, sizeof(r.p));
    r.tiles.resize(static_cast<size_t>((s.m + 127) / 128) * (s.n / 128));
    size_t count = 0;
    EXPECT_EQ(maco_gemm_plan(s.m, s.n, s.k, workers, l2, max_split, &r.p, r.tiles.data(), &count),
              MACO_OK)
        << maco_log_last_error();
    EXPECT_EQ(count, r.p.tiles);
    r.tiles.resize(count);
    return r;
}

std::string Name(const Shape &s, int workers)
{
    return std::to_string(s.m) + " x " + std::to_string(s.n) + " x " + std::to_string(s.k) +
           " on " + std::to_string(workers) + " workers";
}

/* Every 128 x 128 block of C covered by exactly one tile, each tile inside C. */
void ExpectCovers(const Shape &s, const std::vector<maco_gemm_tile_t> &tiles)
{
    const uint32_t rows = (s.m + 127) / 128;
    std::vector<int> cover(static_cast<size_t>(rows) * (s.n / 128), 0);
    for (const maco_gemm_tile_t &t : tiles) {
        ASSERT_TRUE(t.tile_n == 128 || t.tile_n == 256) << t.tile_n;
        ASSERT_LT(t.tile_row, rows);
        ASSERT_LT(t.tile_col, s.n / t.tile_n);
        for (uint32_t h = 0; h < t.tile_n / 128; h++)
            cover[static_cast<size_t>(t.tile_row) * (s.n / 128) + t.tile_col * (t.tile_n / 128) +
                  h]++;
    }
    for (size_t i = 0; i < cover.size(); i++)
        ASSERT_EQ(cover[i], 1) << "128 x 128 block " << i;
}

/* The properties every plan has, whatever the shape (see maco_gemm_plan). */
void ExpectPlanProperties(const Shape &s, int W, uint64_t l2, const Planned &r)
{
    const maco_gemm_plan_t &p = r.p;
    const uint32_t rows = (s.m + 127) / 128, cols = s.n / p.tile_n;
    ASSERT_NO_FATAL_FAILURE(ExpectCovers(s, r.tiles));
    /* Rounds: ceil(tasks / workers); the last one holds 1 .. workers tasks. */
    EXPECT_EQ(p.tasks, p.tiles * p.split_k);
    EXPECT_EQ(p.waves, (p.tasks + W - 1) / W);
    EXPECT_GE(p.last_wave_tasks, 1u);
    EXPECT_LE(p.last_wave_tasks, static_cast<uint32_t>(W));
    EXPECT_EQ(static_cast<uint64_t>(p.waves - 1) * W + p.last_wave_tasks, p.tasks);
    /* Width: wide only where n allows it and there are at least as many wide tiles as
     * workers; the last round of wide tiles made narrow only when it was at most half full,
     * and then it is what stands at the end of the order. */
    if (p.tile_n == 256) {
        EXPECT_EQ(s.n % 256, 0u);
        EXPECT_GE(static_cast<uint64_t>(rows) * cols, static_cast<uint64_t>(W));
    }
    if (p.tail_narrow > 0) {
        EXPECT_EQ(p.tile_n, 256u);
        EXPECT_LE(2u * p.tail_narrow, static_cast<uint32_t>(W));
        EXPECT_EQ((static_cast<uint64_t>(rows) * cols) % W, p.tail_narrow);
        for (size_t i = 0; i < r.tiles.size(); i++)
            EXPECT_EQ(r.tiles[i].tile_n, i + 2 * p.tail_narrow >= r.tiles.size() ? 128u : 256u)
                << i;
    } else {
        for (const maco_gemm_tile_t &t : r.tiles)
            EXPECT_EQ(t.tile_n, p.tile_n);
    }
    /* Split-K: only where C has fewer tiles than workers; K cut in equal slices of whole
     * steps of 64, at least MACO_GEMM_PLAN_MIN_SLICE each. */
    if (p.split_k > 1) {
        EXPECT_LT(static_cast<uint64_t>(rows) * cols, static_cast<uint64_t>(W));
        EXPECT_EQ(p.k_slice * p.split_k, s.k);
        EXPECT_EQ(p.k_slice % 64, 0u);
        EXPECT_GE(p.k_slice, static_cast<uint32_t>(MACO_GEMM_PLAN_MIN_SLICE));
        EXPECT_EQ(p.tail_narrow, 0u);
    } else {
        EXPECT_EQ(p.k_slice, s.k);
    }
    /* Order: groups of G rows; G covers a round of the workers with whole rows (G x columns
     * >= workers, unless C has fewer rows); raised only while G rows of A fit half of L2. */
    const uint32_t gmin = std::min(rows, (W + cols - 1) / cols);
    EXPECT_GE(p.group, gmin);
    EXPECT_LE(p.group, rows);
    if (l2 == 0) {
        EXPECT_EQ(p.group, gmin);
    } else if (p.group > gmin) {
        EXPECT_LE(static_cast<uint64_t>(p.group) * 128 * s.k * 2, l2 / 2);
    }
    /* The main (wide or only) part of the order visits each column of B once per group: the
     * tiles of one column of a group come one after the other, each row once. */
    const size_t main = r.tiles.size() - 2 * p.tail_narrow;
    std::set<std::pair<uint32_t, uint32_t>> visits; /* (group, column) */
    for (size_t i = 0; i < main; i++) {
        const maco_gemm_tile_t &t = r.tiles[i];
        const std::pair<uint32_t, uint32_t> at{ t.tile_row / p.group, t.tile_col };
        const bool same_run = i > 0 && r.tiles[i - 1].tile_col == t.tile_col &&
                              r.tiles[i - 1].tile_row / p.group == at.first;
        if (!same_run) {
            EXPECT_TRUE(visits.insert(at).second)
                << "column " << at.second << " of group " << at.first << " visited twice";
        }
    }
    const uint64_t groups = (rows + p.group - 1) / p.group;
    EXPECT_EQ(p.b_bytes, groups * s.k * s.n * 2);
}

TEST(GemmShapePlan, FusedOperatorSetsAtTwoFourAndEightRanks)
{
    /* Workers of a fused operator's kernel on an H200 (132 SMs): the whole GPU less one
     * scheduler per 32 CTAs, less 2 to 16 communication workers; and a plain GEMM's 128. */
    for (uint32_t ws : { 2u, 4u, 8u })
        for (const Shape &s : FusedSets(ws))
            for (int W : { 113, 126, 128 })
                for (uint64_t l2 : { uint64_t{ 0 }, uint64_t{ 50 } << 20 }) {
                    SCOPED_TRACE(Name(s, W) + ", L2 " + std::to_string(l2 >> 20) + " MiB");
                    Planned r = Plan(s, W, l2, MACO_GEMM_PLAN_MAX_SPLIT);
                    ASSERT_NO_FATAL_FAILURE(ExpectPlanProperties(s, W, l2, r));
                }
}

TEST(GemmShapePlan, SplitKFillsTheWorkersWhereCHasFewTiles)
{
    /* tp at 4 ranks, M = 128: 64 narrow tiles of K = 2048 on 128 workers. Unsplit: half the
     * workers idle, one round of 32 steps + 2; in 2 slices: one round of 16 + 2 steps, and
     * the sums (3 steps): 21 < 34. In 4: two rounds (256 tasks) of 8 + 2, and 5: 25. */
    Planned r = Plan({ 128, 8192, 2048 }, 128, 0, MACO_GEMM_PLAN_MAX_SPLIT);
    EXPECT_EQ(r.p.tile_n, 128u);
    EXPECT_EQ(r.p.split_k, 2u);
    EXPECT_EQ(r.p.k_slice, 1024u);
    EXPECT_EQ(r.p.tasks, 128u);
    EXPECT_EQ(r.p.waves, 1u);
    EXPECT_EQ(r.p.last_wave_tasks, 128u);
    EXPECT_EQ(r.p.cost, 16u + 2u + 3u);
    Planned one = Plan({ 128, 8192, 2048 }, 128, 0, 1);
    EXPECT_EQ(one.p.split_k, 1u);
    EXPECT_EQ(one.p.cost, 32u + 2u);
    EXPECT_EQ(one.p.last_wave_tasks, 64u); /* half of the workers */
    /* The same tiles either way: a split changes the tasks per tile, not the order. */
    ASSERT_EQ(r.tiles.size(), one.tiles.size());
    for (size_t i = 0; i < r.tiles.size(); i++)
        EXPECT_EQ(memcmp(&r.tiles[i], &one.tiles[i], sizeof(maco_gemm_tile_t)), 0) << i;
    /* Whenever a split is chosen, the model says it is faster than none. */
    for (uint32_t ws : { 2u, 4u, 8u })
        for (const Shape &s : FusedSets(ws))
            for (int W : { 64, 113, 128 }) {
                Planned a = Plan(s, W, 0, MACO_GEMM_PLAN_MAX_SPLIT);
                Planned b = Plan(s, W, 0, 1);
                EXPECT_LE(a.p.cost, b.p.cost) << Name(s, W);
                if (a.p.split_k > 1) {
                    EXPECT_LT(a.p.cost, b.p.cost) << Name(s, W);
                }
            }
    /* K too short to cut into slices of 256: no split. */
    Planned s = Plan({ 128, 1024, 256 }, 128, 0, MACO_GEMM_PLAN_MAX_SPLIT);
    EXPECT_EQ(s.p.split_k, 1u);
    /* Enough tiles for every worker: no split, whatever is allowed. */
    s = Plan({ 2048, 8192, 2048 }, 128, 0, MACO_GEMM_PLAN_MAX_SPLIT);
    EXPECT_EQ(s.p.split_k, 1u);
}

TEST(GemmShapePlan, NarrowLastRoundOfWideTiles)
{
    /* 4096 x 3584 on 128 workers: 32 x 14 = 448 wide tiles, 3.5 rounds: the last 64 as 128
     * narrow ones, so the last round is full (3 x 128 wide, then 128 narrow). */
    Planned r = Plan({ 4096, 3584, 8192 }, 128, 0, MACO_GEMM_PLAN_MAX_SPLIT);
    EXPECT_EQ(r.p.tile_n, 256u);
    EXPECT_EQ(r.p.tail_narrow, 64u);
    EXPECT_EQ(r.p.tiles, 448u + 64u);
    EXPECT_EQ(r.p.waves, 4u);
    EXPECT_EQ(r.p.last_wave_tasks, 128u);
    /* 4096 x 7168: 32 x 28 = 896 wide tiles, 7 whole rounds; 4224 x 7168: 33 x 28 = 924, 28
     * over 7 rounds: those made 56 narrow ones. */
    r = Plan({ 4096, 7168, 8192 }, 128, 0, 1);
    EXPECT_EQ(r.p.tail_narrow, 0u);
    EXPECT_EQ(r.p.waves, 7u);
    EXPECT_EQ(r.p.last_wave_tasks, 128u);
    r = Plan({ 4224, 7168, 8192 }, 128, 0, 1);
    EXPECT_EQ(r.p.tail_narrow, 28u);
    EXPECT_EQ(r.p.last_wave_tasks, 56u);
    /* A last round more than half full stays wide. */
    r = Plan({ 4096, 7168 + 256 * 4, 8192 }, 128, 0, 1); /* 32 x 32 = 1024 = 8 rounds */
    EXPECT_EQ(r.p.tail_narrow, 0u);
    r = Plan({ 128 * 29, 256 * 40, 512 }, 128, 0, 1); /* 1160 = 9 x 128 + 8 */
    EXPECT_EQ(r.p.tail_narrow, 8u);
    r = Plan({ 128 * 29, 256 * 42, 512 }, 128, 0, 1); /* 1218 = 9 x 128 + 66: over half */
    EXPECT_EQ(r.p.tail_narrow, 0u);
    EXPECT_EQ(r.p.last_wave_tasks, 66u);
}

TEST(GemmShapePlan, OrderKeepsBInL2WhereARowsFit)
{
    /* llama70b reduce-scatter at 4 ranks, M = 8192: 64 x 32 wide tiles, K = 7168. Without L2:
     * groups of ceil(128 / 32) = 4 rows, B read 16 times. With 50 MiB of L2, half of it holds
     * 14 rows of A (14 x 128 x 7168 x 2 = 25.7e6 bytes <= 26.2e6): B read ceil(64 / 14) = 5
     * times. */
    const Shape s{ 8192, 8192, 7168 };
    Planned a = Plan(s, 128, 0, 1), b = Plan(s, 128, uint64_t{ 50 } << 20, 1);
    EXPECT_EQ(a.p.group, 4u);
    EXPECT_EQ(a.p.b_bytes, 16ull * 7168 * 8192 * 2);
    EXPECT_EQ(b.p.group, 14u);
    EXPECT_EQ(b.p.b_bytes, 5ull * 7168 * 8192 * 2);
    ASSERT_NO_FATAL_FAILURE(ExpectPlanProperties(s, 128, 0, a));
    ASSERT_NO_FATAL_FAILURE(ExpectPlanProperties(s, 128, uint64_t{ 50 } << 20, b));
    /* More L2 never reads B more often. */
    uint64_t last = ~0ull;
    for (uint64_t mib : { 0, 8, 16, 32, 50, 64, 128, 1024 }) {
        Planned p = Plan(s, 128, mib << 20, 1);
        EXPECT_LE(p.p.b_bytes, last) << mib << " MiB";
        last = p.p.b_bytes;
    }
    /* Without L2 (the fused operators), the first row of C is done within the first
     * ceil(G x columns / workers) rounds: G rows finish together. */
    size_t first_row_last = 0;
    for (size_t i = 0; i < a.tiles.size(); i++)
        if (a.tiles[i].tile_row == 0)
            first_row_last = i;
    EXPECT_LT(first_row_last, static_cast<size_t>(a.p.group) * (s.n / a.p.tile_n));
}

TEST(GemmShapePlan, RandomShapesKeepEveryProperty)
{
    std::mt19937 rng(11);
    for (int i = 0; i < 400; i++) {
        Shape s{ 1 + static_cast<uint32_t>(rng() % 6000),
                 128 * (1 + static_cast<uint32_t>(rng() % 64)),
                 32 * (1 + static_cast<uint32_t>(rng() % 300)) };
        int W = 1 + static_cast<int>(rng() % 200);
        uint64_t l2 = (rng() % 2) ? uint64_t{ 1 + rng() % 64 } << 20 : 0;
        SCOPED_TRACE(Name(s, W) + ", L2 " + std::to_string(l2));
        Planned r = Plan(s, W, l2, 1 + static_cast<uint32_t>(rng() % 16));
        ASSERT_NO_FATAL_FAILURE(ExpectPlanProperties(s, W, l2, r));
    }
}

TEST(GemmShapePlan, SameArgumentsSamePlan)
{
    for (const Shape &s : FusedSets(4)) {
        Planned a = Plan(s, 126, uint64_t{ 50 } << 20, 8),
                b = Plan(s, 126, uint64_t{ 50 } << 20, 8);
        EXPECT_EQ(memcmp(&a.p, &b.p, sizeof(a.p)), 0) << Name(s, 126);
        ASSERT_EQ(a.tiles.size(), b.tiles.size());
        EXPECT_EQ(memcmp(a.tiles.data(), b.tiles.data(), a.tiles.size() * sizeof(a.tiles[0])), 0);
    }
}

TEST(GemmShapePlan, AgreesWithPlanTiles)
{
    /* Without split and L2, maco_gemm_plan's order is maco_gemm_plan_tiles'. */
    std::mt19937 rng(5);
    for (int i = 0; i < 100; i++) {
        Shape s{ 1 + static_cast<uint32_t>(rng() % 5000),
                 128 * (1 + static_cast<uint32_t>(rng() % 60)), 64 };
        int W = 1 + static_cast<int>(rng() % 160);
        Planned r = Plan(s, W, 0, 1);
        std::vector<maco_gemm_tile_t> t(r.tiles.size() + 1);
        size_t n = 0;
        ASSERT_EQ(maco_gemm_plan_tiles(s.m, s.n, W, t.data(), &n), MACO_OK);
        ASSERT_EQ(n, r.tiles.size()) << Name(s, W);
        EXPECT_EQ(memcmp(t.data(), r.tiles.data(), n * sizeof(t[0])), 0) << Name(s, W);
    }
}

TEST(GemmShapePlan, BadArgumentsAreNamed)
{
    maco_gemm_plan_t p;
    maco_test::AllowLog("maco_gemm_plan");
    EXPECT_EQ(maco_gemm_plan(0, 128, 64, 8, 0, 1, &p, nullptr, nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_gemm_plan(128, 100, 64, 8, 0, 1, &p, nullptr, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_gemm_plan(128, 128, 48, 8, 0, 1, &p, nullptr, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("k of 32"), std::string::npos)
        << maco_log_last_error();
    EXPECT_EQ(maco_gemm_plan(128, 128, 64, 0, 0, 1, &p, nullptr, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_gemm_plan(128, 128, 64, 8, 0, 1, nullptr, nullptr, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    /* Huge shapes plan at once (the model schedules rounds, not tasks, past 2^22). */
    EXPECT_EQ(maco_gemm_plan(1u << 24, 1u << 24, 1u << 20, 132, 0, 16, &p, nullptr, nullptr),
              MACO_OK);
    EXPECT_EQ(p.tiles,
              (uint64_t{ 1 } << 17) * (uint64_t{ 1 } << 16) +
                  ((((uint64_t{ 1 } << 33) % 132) * 2 <= 132) ? (uint64_t{ 1 } << 33) % 132 : 0));
}

} // namespace
