/*
 * test_hier_a2a.cc - the pure parts of the hierarchical all-to-all across nodes
 * (MACO_ALGO_ALLTOALL=hier): its shape as a function of the topology and the call
 * (maco__hier_a2a_shape, p2p_plan.h) and the choice of algorithm (select.c: forcing hier on
 * one node is refused naming the variable; ll and copy still work across nodes). No GPU.
 */
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "algorithms/common/select.h"
#include "algorithms/hier/hier.h"
#include "maco_test.h"
#include "algorithms/p2p/p2p_plan.h"

namespace
{

class HierA2A : public maco_test::Test
{
};

/* Every element of every block is in exactly one segment, pieces are whole 16-byte words,
 * a full segment's rail message fits one region, every CTA gets a segment, and the shape
 * depends only on its inputs. */
TEST_F(HierA2A, ShapeCoversEveryElementOnceAndFitsARegion)
{
    const uint64_t hpieces[] = { 16 * 8, 4096, 65536, 524288, (uint64_t)32 << 20 };
    const uint64_t counts[] = { 1, 3, 15, 16, 17, 1023, 4095, 4096, 4097, 65535, 65537, 300001 };
    for (uint64_t hp : hpieces)
        for (int local_nranks : { 1, 2, 3, 4, 8 })
            for (int slots : { 1, 2, 8, 64 })
                for (uint64_t esz : { 1, 2, 4, 8 })
                    for (uint64_t count : counts) {
                        maco__hier_a2a_shape_t s, again;
                        const std::string at =
                            "region_bytes " + std::to_string(hp) + " local_nranks " +
                            std::to_string(local_nranks) + " slots " + std::to_string(slots) +
                            " esz " + std::to_string(esz) + " count " + std::to_string(count);
                        if (hp < 16 * (uint64_t)local_nranks) {
                            EXPECT_EQ(maco__hier_a2a_shape(count, esz, local_nranks, hp, slots, &s),
                                      0)
                                << at;
                            continue;
                        }
                        ASSERT_EQ(maco__hier_a2a_shape(count, esz, local_nranks, hp, slots, &s), 1)
                            << at;
                        ASSERT_EQ(maco__hier_a2a_shape(count, esz, local_nranks, hp, slots, &again),
                                  1);
                        EXPECT_EQ(std::memcmp(&s, &again, sizeof(s)), 0) << at;
                        EXPECT_GT(s.piece, 0u) << at;
                        EXPECT_EQ(s.piece * esz % 16, 0u) << at;
                        EXPECT_LE(s.msg_bytes, hp) << at;
                        EXPECT_EQ(s.msg_bytes, (uint64_t)local_nranks * s.piece * esz) << at;
                        EXPECT_EQ(s.nseg, (count + s.piece - 1) / s.piece) << at;
                        /* Segments tile [0, count) exactly: the last one is non-empty. */
                        EXPECT_LT((s.nseg - 1) * s.piece, count) << at;
                        EXPECT_GE(s.nseg * s.piece, count) << at;
                        EXPECT_EQ((uint64_t)s.blocks, std::min<uint64_t>(s.nseg, slots)) << at;
                        /* Blocks up to MACO__TUNING_HIER_ALLTOALL_RAIL_MESSAGE_MIN / local_nranks
                         * bytes travel whole in one segment where a region holds them; else no
                         * segment is smaller than that but the last, or the region caps it. */
                        const uint64_t min_piece =
                            (uint64_t)MACO__TUNING_HIER_ALLTOALL_RAIL_MESSAGE_MIN /
                            (uint64_t)local_nranks;
                        if (count * esz <= min_piece &&
                            hp / (uint64_t)local_nranks >= min_piece + 16) {
                            EXPECT_EQ(s.nseg, 1u) << at;
                        }
                        if (s.nseg > 1) {
                            EXPECT_TRUE(s.piece * esz + 16 > min_piece ||
                                        s.msg_bytes + 16 * (uint64_t)local_nranks > hp)
                                << at;
                        }
                    }
}

/* A 32 MiB scratch, 8 CTAs, 2 nodes x 2: pieces as the hier layout gives them
 * (common/state.h: region_bytes = scratch / (CTAs x 2 local_nranks nodes)), and the rail traffic it
 * saves: one message per other node and segment instead of one per remote rank. */
TEST_F(HierA2A, ShapeOfTwoNodesOfTwo)
{
    const uint64_t scratch = (uint64_t)32 << 20;
    const int ctas = 8, local_nranks = 2, nnodes = 2;
    const uint64_t hp = scratch / ((uint64_t)ctas * 2 * local_nranks * nnodes) / 256 * 256;
    ASSERT_EQ(hp, (uint64_t)512 << 10);
    maco__hier_a2a_shape_t s;
    /* 1 MiB of float32 per block: not 8 segments of 128 KiB but 4 of 256 KiB (rail
     * messages of MACO__TUNING_HIER_ALLTOALL_RAIL_MESSAGE_MIN = 512 KiB). */
    ASSERT_EQ(maco__hier_a2a_shape(262144, 4, local_nranks, hp, ctas, &s), 1);
    EXPECT_EQ(s.piece, 65536u);
    EXPECT_EQ(s.nseg, 4u);
    EXPECT_EQ(s.blocks, 4);
    EXPECT_EQ(s.msg_bytes, (uint64_t)512 << 10);
    /* 4 MiB per block: 8 segments of 512 KiB would not fit a region (512 KiB for both
     * blocks): 16 of 256 KiB. */
    ASSERT_EQ(maco__hier_a2a_shape((uint64_t)4 << 20, 1, local_nranks, hp, ctas, &s), 1);
    EXPECT_EQ(s.piece, (uint64_t)256 << 10);
    EXPECT_EQ(s.nseg, 16u);
    EXPECT_EQ(s.blocks, 8);
    /* 64 KiB per block: one segment, one CTA. */
    ASSERT_EQ(maco__hier_a2a_shape(65536, 1, local_nranks, hp, ctas, &s), 1);
    EXPECT_EQ(s.nseg, 1u);
    EXPECT_EQ(s.blocks, 1);
    /* 64 MiB per block: pieces capped at region_bytes / local_nranks = 256 KiB, 256 segments. */
    ASSERT_EQ(maco__hier_a2a_shape((uint64_t)64 << 20, 1, local_nranks, hp, ctas, &s), 1);
    EXPECT_EQ(s.piece, (uint64_t)256 << 10);
    EXPECT_EQ(s.nseg, 256u);
    EXPECT_EQ(s.msg_bytes, hp);
    /* An odd count of 2-byte elements: whole words, the last segment short. */
    ASSERT_EQ(maco__hier_a2a_shape(100001, 2, local_nranks, hp, ctas, &s), 1);
    EXPECT_EQ(s.piece % 8, 0u);
    EXPECT_EQ(s.nseg, (100001 + s.piece - 1) / s.piece);
    EXPECT_EQ(maco__hier_a2a_shape(0, 4, local_nranks, hp, ctas, &s), 0);
    EXPECT_EQ(maco__hier_a2a_shape(10, 3, local_nranks, hp, ctas, &s), 0);
    (void)nnodes;
}

/* A collectives state with nothing but what select.c reads. */
maco__coll_t *State(int nnodes, int local_nranks, const char *alltoall)
{
    static maco__coll_t c;
    std::memset(&c, 0, sizeof(c));
    c.nnodes = nnodes;
    c.local_nranks = local_nranks;
    c.layout.oneshot_max = 256 << 10;
    c.layout.hier_piece_max = nnodes > 1 ? 512 << 10 : 0;
    c.p2p_ll_max = 64 << 10;
    std::snprintf(c.forced[MACO_COLL_ALLTOALL], sizeof(c.forced[0]), "%s", alltoall);
    return &c;
}

TEST_F(HierA2A, ForcingHierOnOneNodeNamesTheVariable)
{
    maco_test::AllowLog("MACO_ALGO_ALLTOALL=hier");
    int kernel = -1;
    maco_status_t st =
        maco__coll_select(nullptr, State(1, 4, "hier"), MACO_COLL_ALLTOALL, 1000, 4, &kernel);
    EXPECT_EQ(st, MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(kernel, -1);
    std::string msg = maco_log_last_error();
    EXPECT_NE(msg.find("MACO_ALGO_ALLTOALL=hier needs ranks on several nodes"), std::string::npos)
        << msg;
    /* The same name across nodes is taken, in any case. */
    ASSERT_EQ(maco__coll_select(nullptr, State(2, 2, "HIER"), MACO_COLL_ALLTOALL, 1000, 4, &kernel),
              MACO_OK);
    EXPECT_EQ(kernel, MACO__KERNEL_HIER);
    /* ll and copy stay the direct path's, on one node and across nodes. */
    for (int nn : { 1, 2 }) {
        ASSERT_EQ(
            maco__coll_select(nullptr, State(nn, 2, "copy"), MACO_COLL_ALLTOALL, 1000, 4, &kernel),
            MACO_OK);
        EXPECT_EQ(kernel, MACO__KERNEL_MESH);
        ASSERT_EQ(
            maco__coll_select(nullptr, State(nn, 2, "ll"), MACO_COLL_ALLTOALL, 1000, 4, &kernel),
            MACO_OK);
        EXPECT_EQ(kernel, MACO__KERNEL_LL);
    }
    /* Send/recv has no hier. */
    maco_test::AllowLog("is not a sendrecv algorithm");
    maco__coll_t *c = State(2, 2, "");
    std::snprintf(c->forced[MACO_COLL_SENDRECV], sizeof(c->forced[0]), "hier");
    EXPECT_EQ(maco__coll_select(nullptr, c, MACO_COLL_SENDRECV, 1000, 4, &kernel),
              MACO_ERR_UNSUPPORTED);
}

/* The default across nodes (provisional, from one measurement on simulated nodes): hier for
 * blocks of 512 KiB and more with 2+ ranks per node; the direct path (ll up to
 * MACO_P2P_LL_MAX, copy above) for smaller blocks, one rank per node, and on one node. */
TEST_F(HierA2A, DefaultChoiceBySizeAndRanksPerNode)
{
    struct {
        int nnodes, local_nranks;
        size_t count, esz;
        int kernel;
    } cases[] = {
        { 2, 2, 1, 4, MACO__KERNEL_LL },
        { 2, 2, 16384, 4, MACO__KERNEL_LL },    /* 64 KiB: MACO_P2P_LL_MAX */
        { 2, 2, 16385, 4, MACO__KERNEL_MESH },  /* copy */
        { 2, 2, 131071, 4, MACO__KERNEL_MESH }, /* 512 KiB - 4 */
        { 2, 2, 131072, 4, MACO__KERNEL_HIER }, /* 512 KiB */
        { 2, 2, 524288, 1, MACO__KERNEL_HIER }, /* 512 KiB of int8 */
        { 4, 8, (size_t)64 << 20, 2, MACO__KERNEL_HIER },
        { 4, 1, (size_t)4 << 20, 4, MACO__KERNEL_MESH }, /* one rank per node: direct */
        { 1, 4, (size_t)4 << 20, 4, MACO__KERNEL_MESH }, /* one node */
    };
    for (const auto &t : cases) {
        int kernel = -1;
        ASSERT_EQ(maco__coll_select(nullptr, State(t.nnodes, t.local_nranks, ""),
                                    MACO_COLL_ALLTOALL, t.count, t.esz, &kernel),
                  MACO_OK);
        EXPECT_EQ(kernel, t.kernel) << t.nnodes << " nodes x " << t.local_nranks << ", " << t.count
                                    << " elements of " << t.esz << " bytes";
    }
}

/* Forced hier where a region cannot hold a word per local rank is refused, naming why. */
TEST_F(HierA2A, ForcingHierWithoutRoomIsRefused)
{
    maco_test::AllowLog("MACO_ALGO_ALLTOALL=hier cannot take");
    maco__coll_t *c = State(2, 8, "hier");
    c->layout.hier_piece_max = 64;
    int kernel = -1;
    EXPECT_EQ(maco__coll_select(nullptr, c, MACO_COLL_ALLTOALL, 1000, 4, &kernel),
              MACO_ERR_INVALID_ARGUMENT);
    std::string msg = maco_log_last_error();
    EXPECT_NE(msg.find("MACO_SCRATCH_SIZE"), std::string::npos) << msg;
}

/* The other collectives keep their rule: hier only across nodes, only hier across nodes. */
TEST_F(HierA2A, OtherCollectivesKeepTheirRule)
{
    maco_test::AllowLog("MACO_ALGO_ALLGATHER=");
    maco__coll_t *c = State(1, 4, "");
    std::snprintf(c->forced[MACO_COLL_ALLGATHER], sizeof(c->forced[0]), "hier");
    int kernel = -1;
    EXPECT_EQ(maco__coll_select(nullptr, c, MACO_COLL_ALLGATHER, 1000, 4, &kernel),
              MACO_ERR_INVALID_ARGUMENT);
    c = State(2, 2, "");
    ASSERT_EQ(maco__coll_select(nullptr, c, MACO_COLL_ALLGATHER, 1000, 4, &kernel), MACO_OK);
    EXPECT_EQ(kernel, MACO__KERNEL_HIER);
}

} // namespace
