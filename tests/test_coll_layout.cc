/*
 * test_coll_layout.cc - the collectives' buffer layout (algorithms/common/layout.c): regions back
 * to back without overlap, 256-byte aligned, sized as common/state.h says; the automatic send/recv
 * chunk size; the mesh's pieces from MACO_SCRATCH_SIZE. No GPU.
 */
#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "algorithms/common/state.h"
#include "algorithms/p2p/p2p_plan.h"
#include "algorithms/tuning.h"
#include "maco_test.h"

namespace
{

class CollLayout : public maco_test::Test
{
};

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

/* The defaults of src/host/base/config.h, as maco__coll_read_sizes turns them into sizes. */
maco__coll_sizes_t Defaults()
{
    maco__coll_sizes_t z = {};
    z.oneshot_max = 256 * KiB;
    z.scratch_bytes = 128 * MiB;
    z.rsag_ctas = 128;
    z.p2p_lanes = 32;
    z.hier_ctas = 8;
    z.p2p_chunk = 0; /* automatic */
    return z;
}

/* Every region starts 256-byte aligned, after the end of the one before it. */
void ExpectBackToBack(const maco__coll_layout_t &l, int n, int nnodes)
{
    const uint64_t srcs = n > 1 ? (uint64_t)n - 1 : 0, lanes = (uint64_t)l.p2p_lanes;
    struct Region {
        const char *name;
        uint64_t offset, bytes;
    };
    std::vector<Region> r = {
        { "desc", l.desc_offset, 2 * (uint64_t)n * MACO__DESC_BYTES },
        { "ll", l.ll_offset, 2 * (uint64_t)n * l.ll_slot_bytes },
        { "rsag", l.rsag_offset, (uint64_t)l.rsag_slots * l.rsag_slot_bytes },
        { "p2p counters", l.p2p_ctr_offset, 2 * (uint64_t)n * lanes * 8 },
        { "p2p headers", l.p2p_hdr_offset, srcs * lanes * MACO__P2P_SLOTS * 16 },
        { "p2p LL", l.p2p_ll_offset, srcs * lanes * MACO__P2P_SLOTS * MACO__P2P_LL_SLOT },
        { "p2p copy", l.p2p_cp_offset, srcs * lanes * MACO__P2P_SLOTS * l.p2p_cp_slot_bytes },
    };
    if (nnodes > 1)
        r.push_back({ "hier", l.hier_offset, (uint64_t)l.hier_slots * l.hier_slot_bytes });
    EXPECT_GE(r[0].offset, 256u) << "the counters come first";
    for (size_t i = 0; i < r.size(); i++) {
        SCOPED_TRACE(r[i].name);
        EXPECT_EQ(r[i].offset % 256, 0u);
        if (i > 0) {
            EXPECT_GE(r[i].offset, r[i - 1].offset + r[i - 1].bytes)
                << "overlaps " << r[i - 1].name;
        }
    }
    EXPECT_EQ(l.total_bytes, r.back().offset + r.back().bytes);
    EXPECT_EQ(l.p2p_cp_slot_bytes % 256, 0u);
    EXPECT_GE(l.p2p_cp_slot_bytes, l.p2p_chunk + 16) << "a chunk and its skew fit a slot";
}

TEST_F(CollLayout, RegionsBackToBackForEveryRankAndNodeCount)
{
    for (int nnodes : { 1, 2, 4 }) {
        for (int n = 1; n <= MACO__MAX_LOCAL_RANKS; n++) {
            SCOPED_TRACE(testing::Message() << n << " ranks per node, " << nnodes << " nodes");
            maco__coll_sizes_t z = Defaults();
            maco__coll_layout_t l;
            maco__coll_layout(&l, n, nnodes, &z);
            ExpectBackToBack(l, n, nnodes);
            EXPECT_EQ(nnodes > 1, l.hier_offset != 0);
        }
    }
}

/* The mesh's pieces: MACO_SCRATCH_SIZE over the CTAs' slots of two halves of 2 n pieces each
 * (128 KiB at 2 ranks with the defaults, 64 KiB at 4). */
TEST_F(CollLayout, MeshPiecesFromTheScratch)
{
    maco__coll_sizes_t z = Defaults();
    maco__coll_layout_t l;
    maco__coll_layout(&l, 2, 1, &z);
    EXPECT_EQ(l.rsag_piece_max, 128 * KiB);
    EXPECT_EQ(l.rsag_slot_bytes, 2 * 2 * 2 * l.rsag_piece_max);
    maco__coll_layout(&l, 4, 1, &z);
    EXPECT_EQ(l.rsag_piece_max, 64 * KiB);
    z.scratch_bytes = 32 * MiB;
    maco__coll_layout(&l, 2, 1, &z);
    EXPECT_EQ(l.rsag_piece_max, 32 * KiB);
    EXPECT_LE((uint64_t)l.rsag_slots * l.rsag_slot_bytes, z.scratch_bytes);
}

/* MACO_P2P_CHUNK_SIZE=0: 512 KiB, halved until the copy slots of all peers fit 64 MiB; a set
 * chunk size is kept as it is. */
TEST_F(CollLayout, AutomaticSendRecvChunk)
{
    const struct {
        int n;
        uint64_t chunk;
    } cases[] = { { 1, 512 * KiB }, { 2, 512 * KiB }, { 3, 512 * KiB }, { 4, 256 * KiB },
                  { 5, 256 * KiB }, { 6, 128 * KiB }, { 8, 128 * KiB } };
    for (const auto &c : cases) {
        SCOPED_TRACE(testing::Message() << c.n << " ranks");
        maco__coll_sizes_t z = Defaults();
        maco__coll_layout_t l;
        maco__coll_layout(&l, c.n, 1, &z);
        EXPECT_EQ(l.p2p_chunk, c.chunk);
        const uint64_t srcs = c.n > 1 ? (uint64_t)c.n - 1 : 0;
        EXPECT_LE(srcs * 32 * MACO__P2P_SLOTS * l.p2p_chunk,
                  (uint64_t)MACO__TUNING_P2P_AUTO_SLOT_BYTES);
        z.p2p_chunk = 128 * KiB;
        maco__coll_layout(&l, c.n, 1, &z);
        EXPECT_EQ(l.p2p_chunk, 128 * KiB) << "a chunk size that is set stays";
    }
    EXPECT_EQ(maco__p2p_auto_chunk(1, 8), 512 * KiB);
    EXPECT_EQ(maco__p2p_auto_chunk(7, 8), 512 * KiB);
    EXPECT_EQ(maco__p2p_auto_chunk(1000, 32), 16 * KiB) << "never below 16 KiB";
}

/* The device memory the defaults take per rank, as docs/collectives.md states it (MiB,
 * rounded down): 165 at 2 ranks per node, 187 at 4, 207 at 8. */
TEST_F(CollLayout, DefaultsTakeWhatTheDocsSay)
{
    const struct {
        int n;
        uint64_t mib;
    } cases[] = { { 2, 165 }, { 4, 187 }, { 8, 207 } };
    for (const auto &c : cases) {
        maco__coll_sizes_t z = Defaults();
        maco__coll_layout_t l;
        maco__coll_layout(&l, c.n, 1, &z);
        EXPECT_EQ(l.total_bytes / MiB, c.mib) << c.n << " ranks: " << l.total_bytes << " bytes";
    }
}

/* The tuning table (algorithms/tuning.h): every row names a subsection of docs/performance.md's
 * "Tuning" section that exists, says its unit and what it decides, and has a positive value. */
TEST(Tuning, EveryRowPointsAtItsSectionOfPerformanceMd)
{
    std::ifstream f(MACO_SOURCE_DIR "/docs/performance.md");
    ASSERT_TRUE(f.good()) << "cannot read docs/performance.md";
    std::set<std::string> sections;
    bool in_tuning = false;
    for (std::string line; std::getline(f, line);) {
        if (line.rfind("## ", 0) == 0)
            in_tuning = line == "## Tuning";
        else if (in_tuning && line.rfind("### ", 0) == 0)
            sections.insert(line.substr(4));
    }
    ASSERT_FALSE(sections.empty()) << "docs/performance.md has no \"## Tuning\" with subsections";
    int rows = 0;
#define MACO__TUNING_ROW(name, value, unit, what, section)                                         \
    rows++;                                                                                        \
    EXPECT_GT((long long)(value), 0) << #name;                                                     \
    EXPECT_GT(std::string(what).size(), 10u) << #name;                                             \
    EXPECT_TRUE(sections.count(section))                                                           \
        << #name << ": docs/performance.md has no \"### " << section << "\" under \"## Tuning\"";
    MACO__TUNING_TABLE(MACO__TUNING_ROW)
#undef MACO__TUNING_ROW
    EXPECT_GE(rows, 10);
}

} // namespace
