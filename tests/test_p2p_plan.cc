/*
 * test_p2p_plan.cc - the pure parts of send/recv and all-to-all (algorithms/p2p/p2p_plan.h): how
 * a message is cut into chunks on lanes, the chunk header, and the plan a group's messages
 * become (pairs, call order, local copies, the checks a rank makes alone). No GPU.
 */
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "maco_test.h"
#include "algorithms/p2p/p2p_plan.h"

namespace
{

class P2PPlan : public maco_test::Test
{
};

maco__p2p_msg_t Msg(int dir, int peer, uintptr_t addr, uint64_t bytes, int call,
                    const char *fn = nullptr)
{
    maco__p2p_msg_t m;
    memset(&m, 0, sizeof(m));
    m.dir = dir;
    m.peer = peer;
    if (dir == MACO__P2P_SEND)
        m.send = reinterpret_cast<const void *>(addr);
    else
        m.recv = reinterpret_cast<void *>(addr);
    m.bytes = bytes;
    m.flags = MACO__P2P_FLAGS(MACO__P2P_KIND_SENDRECV, 2, 0);
    m.call = call;
    m.fn = fn != nullptr ? fn : (dir == MACO__P2P_SEND ? "maco_send" : "maco_recv");
    return m;
}

/* Every byte of a message is in exactly one chunk, every lane carries at least one chunk, the
 * lanes' counts add up, and the counts depend only on the sender's byte count. */
TEST_F(P2PPlan, ChunksCoverEveryByteOnceAndEveryLaneCarriesOne)
{
    for (uint32_t lanes : { 1u, 2u, 3u, 8u, 16u }) {
        for (uint64_t cap : { static_cast<uint64_t>(16), static_cast<uint64_t>(8192),
                              static_cast<uint64_t>(131072) }) {
            for (uint64_t bytes :
                 { static_cast<uint64_t>(0), static_cast<uint64_t>(1), cap - 1, cap, cap + 1,
                   cap * lanes, cap * lanes + 7, cap * lanes * 5 + 3 }) {
                uint64_t n = maco__p2p_nchunks(bytes, cap, lanes), sum = 0, covered = 0;
                EXPECT_GE(n, lanes);
                for (uint32_t l = 0; l < lanes; l++) {
                    uint64_t nl = maco__p2p_lane_chunks(bytes, cap, lanes, l);
                    EXPECT_GE(nl, 1u) << "lane " << l << " of " << lanes << ", " << bytes;
                    sum += nl;
                    for (uint64_t k = 0; k < nl; k++) {
                        uint64_t j = l + static_cast<uint64_t>(lanes) * k;
                        ASSERT_LT(j, n);
                        covered += maco__p2p_chunk_bytes(bytes, cap, j);
                    }
                }
                EXPECT_EQ(sum, n);
                EXPECT_EQ(covered, bytes) << lanes << " lanes, cap " << cap;
                /* Chunks are contiguous and full but for the last non-empty one. */
                for (uint64_t j = 0; j + 1 < n; j++) {
                    if (maco__p2p_chunk_bytes(bytes, cap, j + 1) > 0) {
                        EXPECT_EQ(maco__p2p_chunk_bytes(bytes, cap, j), cap);
                    }
                }
            }
        }
    }
}

/* The copy-mode chunk size: a multiple of 16 within [min(16 KiB, slot), slot], growing with
 * the message; a message that fits the lanes at 256 KiB each takes one chunk per lane, a
 * larger one more (about two per lane from 512 KiB per lane), and the slot caps it. Fresh
 * random sizes each run, plus the edges. */
TEST_F(P2PPlan, CopyCapSpreadsAMessageOverEveryLane)
{
    std::random_device rd;
    const unsigned seed = rd();
    std::mt19937_64 rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    const uint64_t K = 1024;
    for (uint32_t lanes : { 1u, 2u, 7u, 8u, 16u, 32u }) {
        for (uint64_t chunk : { 16 * K, 128 * K, 256 * K, 512 * K, 4096 * K }) {
            std::vector<uint64_t> sizes = { 1,
                                            16,
                                            16 * K * lanes,
                                            256 * K * lanes,
                                            256 * K * lanes + 1,
                                            2 * chunk * lanes,
                                            2 * chunk * lanes + 1,
                                            uint64_t(1) << 30 };
            for (int i = 0; i < 200; i++)
                sizes.push_back(1 + rng() % (uint64_t(1) << (10 + rng() % 22)));
            std::sort(sizes.begin(), sizes.end());
            uint64_t last = 0;
            for (uint64_t b : sizes) {
                const uint64_t cap = maco__p2p_copy_cap(b, chunk, lanes);
                ASSERT_EQ(cap % 16, 0u) << b;
                ASSERT_LE(cap, chunk) << b;
                ASSERT_GE(cap, std::min(MACO__P2P_CAP_MIN, chunk)) << b;
                ASSERT_GE(cap, last) << "not monotone at " << b << " bytes";
                last = cap;
                const uint64_t n = maco__p2p_nchunks(b, cap, lanes);
                if (chunk >= MACO__P2P_CAP_ONE && b <= MACO__P2P_CAP_ONE * lanes) {
                    EXPECT_EQ(n, lanes) << b << " bytes: one chunk per lane";
                }
                if (b > MACO__P2P_CAP_ONE * lanes) { /* a lane with two chunks or more */
                    EXPECT_GT(n, lanes) << b << " bytes, cap " << cap;
                }
                if (b >= 2 * MACO__P2P_CAP_ONE * lanes) { /* about two per lane, or more */
                    EXPECT_GE(n, 2u * lanes - 1) << b << " bytes, cap " << cap;
                }
                if (b >= 2 * chunk * lanes) {
                    EXPECT_EQ(cap, chunk) << b;
                }
                if (b >= MACO__P2P_CAP_MIN * lanes) { /* no lane idle */
                    EXPECT_GT(maco__p2p_chunk_bytes(b, cap, lanes - 1), 0u)
                        << b << " bytes leave lane " << lanes - 1 << " empty";
                }
            }
        }
    }
}

/* A rank's slots hold its n - 1 peers: the sources other than itself map one to one onto
 * 0..n-2. */
TEST_F(P2PPlan, SourceIndexSkipsTheOwner)
{
    for (int n = 2; n <= 8; n++) {
        for (int dst = 0; dst < n; dst++) {
            std::vector<int> seen(static_cast<size_t>(n - 1), 0);
            for (int src = 0; src < n; src++) {
                if (src == dst)
                    continue;
                const int i = maco__p2p_src_index(src, dst);
                ASSERT_GE(i, 0);
                ASSERT_LT(i, n - 1);
                seen[static_cast<size_t>(i)]++;
            }
            for (int c : seen)
                EXPECT_EQ(c, 1) << n << " ranks, owner " << dst;
        }
    }
}

TEST_F(P2PPlan, HeaderCarriesBytesMessageSkewAndMode)
{
    for (uint64_t bytes : { static_cast<uint64_t>(0), static_cast<uint64_t>(123),
                            static_cast<uint64_t>(1) << 40, MACO__P2P_MAX_BYTES }) {
        for (uint32_t msg : { 0u, 1u, 77u, static_cast<uint32_t>(MACO__P2P_MAX_OPS - 1) }) {
            for (uint32_t skew : { 0u, 5u, 15u }) {
                for (int ll : { 0, 1 }) {
                    uint32_t hi = maco__p2p_hdr_hi(bytes, msg, skew, ll);
                    EXPECT_EQ(maco__p2p_hdr_bytes(static_cast<uint32_t>(bytes), hi), bytes);
                    EXPECT_EQ(maco__p2p_hdr_msg(hi), msg);
                    EXPECT_EQ((hi >> 24) & 15u, skew);
                    EXPECT_EQ((hi & MACO__P2P_HDR_LL) != 0, ll != 0);
                }
            }
        }
    }
}

/* A message's lanes (maco__p2p_msg_lanes): at least 1, at most the pair's, one per 8 KiB; and
 * with slots of at least MACO__P2P_CAP_MIN bytes every non-empty chunk is on the lane it
 * would take on all the pair's lanes, in both modes, so dropping the other lanes only drops
 * empty chunks; every chunk of the message is on one of its lanes, each of them carries one
 * at least, and the bytes add up. Fresh random sizes each run, plus the edges. */
TEST_F(P2PPlan, SmallMessagesUseFewerLanesWithTheSameChunks)
{
    std::random_device rd;
    const unsigned seed = rd();
    std::mt19937_64 rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    const uint64_t K = 1024, lb = MACO__P2P_LANE_BYTES;
    EXPECT_EQ(lb, 8 * K);
    for (uint32_t lanes : { 1u, 2u, 7u, 8u, 16u, 32u }) {
        EXPECT_EQ(maco__p2p_msg_lanes(0, lanes), 1u);
        EXPECT_EQ(maco__p2p_msg_lanes(1, lanes), 1u);
        EXPECT_EQ(maco__p2p_msg_lanes(lb, lanes), 1u);
        EXPECT_EQ(maco__p2p_msg_lanes(lb + 1, lanes), std::min(2u, lanes));
        EXPECT_EQ(maco__p2p_msg_lanes(lb * lanes, lanes), lanes);
        EXPECT_EQ(maco__p2p_msg_lanes(uint64_t(1) << 40, lanes), lanes);
        for (uint64_t chunk : { 16 * K, 256 * K, 512 * K }) {
            std::vector<uint64_t> sizes = { 0,
                                            1,
                                            15,
                                            16,
                                            lb - 1,
                                            lb,
                                            lb + 1,
                                            lb * lanes - 1,
                                            lb * lanes,
                                            lb * lanes + 1,
                                            2 * chunk * lanes + 5 };
            for (int i = 0; i < 300; i++)
                sizes.push_back(rng() % (uint64_t(1) << (4 + rng() % 24)));
            uint32_t last = 1;
            std::sort(sizes.begin(), sizes.end());
            for (uint64_t b : sizes) {
                const uint32_t L = maco__p2p_msg_lanes(b, lanes);
                ASSERT_GE(L, 1u);
                ASSERT_LE(L, lanes);
                ASSERT_GE(L, last) << "not monotone at " << b;
                last = L;
                ASSERT_GE(uint64_t(L) * lb, std::min(b, lb * lanes)) << b;
                for (int ll : { 1, 0 }) {
                    const uint64_t cap = ll ? lb : maco__p2p_copy_cap(b, chunk, L);
                    const uint64_t all = ll ? lb : maco__p2p_copy_cap(b, chunk, lanes);
                    ASSERT_EQ(cap, all) << b << " bytes, ll " << ll;
                    const uint64_t n = maco__p2p_nchunks(b, cap, L);
                    uint64_t covered = 0, sum = 0;
                    for (uint32_t l = 0; l < L; l++) {
                        const uint64_t nl = maco__p2p_lane_chunks(b, cap, L, l);
                        ASSERT_GE(nl, 1u) << b << " bytes: lane " << l << " of " << L;
                        sum += nl;
                    }
                    ASSERT_EQ(sum, n) << b;
                    for (uint64_t j = 0; j < n; j++) {
                        const uint64_t cb = maco__p2p_chunk_bytes(b, cap, j);
                        covered += cb;
                        if (cb > 0) {
                            ASSERT_EQ(j % L, j % lanes) << b << " bytes, chunk " << j;
                        }
                    }
                    ASSERT_EQ(covered, b) << b << " bytes, ll " << ll;
                }
            }
        }
    }
}

/* Pairs come in rank order (send to q, then receive from q), the local pair last; each pair's
 * ops keep call order; the k-th local send is copied into the k-th local receive. */
TEST_F(P2PPlan, PairsInRankOrderOpsInCallOrderLocalSendsMatched)
{
    const int rank = 1, n = 4;
    std::vector<maco__p2p_msg_t> m = {
        Msg(MACO__P2P_RECV, 3, 0x10000, 100, 1), Msg(MACO__P2P_SEND, 0, 0x20000, 200, 2),
        Msg(MACO__P2P_SEND, 1, 0x30000, 300, 3), Msg(MACO__P2P_SEND, 0, 0x40000, 400, 4),
        Msg(MACO__P2P_RECV, 1, 0x50000, 300, 5), Msg(MACO__P2P_RECV, 0, 0x60000, 0, 6),
        Msg(MACO__P2P_SEND, 1, 0x70000, 0, 7),   Msg(MACO__P2P_RECV, 1, 0x80000, 0, 8),
    };
    maco__p2p_plan_t plan;
    char why[512];
    int call = -1;
    ASSERT_EQ(maco__p2p_plan_build(m.data(), static_cast<int>(m.size()), rank, n, &plan, &call, why,
                                   sizeof(why)),
              MACO_OK)
        << why;
    ASSERT_EQ(plan.npairs, 4);
    /* send to 0 (ops 2, 4), receive from 0 (op 6: 0 bytes, kept), receive from 3, local. */
    EXPECT_EQ(plan.pair_peer[0], 0);
    EXPECT_EQ(plan.pair_dir[0], MACO__P2P_SEND);
    ASSERT_EQ(plan.pair_nops[0], 2);
    EXPECT_EQ(plan.ops[plan.pair_first[0]].bytes, 200u);
    EXPECT_EQ(plan.ops[plan.pair_first[0] + 1].bytes, 400u);
    EXPECT_EQ(plan.pair_peer[1], 0);
    EXPECT_EQ(plan.pair_dir[1], MACO__P2P_RECV);
    EXPECT_EQ(plan.ops[plan.pair_first[1]].bytes, 0u);
    EXPECT_EQ(plan.pair_peer[2], 3);
    EXPECT_EQ(plan.pair_dir[2], MACO__P2P_RECV);
    EXPECT_EQ(plan.ops[plan.pair_first[2]].dst, reinterpret_cast<void *>(0x10000));
    EXPECT_EQ(plan.pair_dir[3], MACO__P2P_SELF);
    ASSERT_EQ(plan.pair_nops[3], 1); /* the 0-byte local pair is dropped */
    EXPECT_EQ(plan.ops[plan.pair_first[3]].src, reinterpret_cast<const void *>(0x30000));
    EXPECT_EQ(plan.ops[plan.pair_first[3]].dst, reinterpret_cast<void *>(0x50000));
    EXPECT_EQ(plan.nops, 5);
}

/* The checks a rank makes alone, each naming the call at fault, and nothing written. */
TEST_F(P2PPlan, ChecksNameTheCall)
{
    const int rank = 0, n = 2;
    struct Case {
        std::vector<maco__p2p_msg_t> msgs;
        int call;
        const char *says;
    };
    std::vector<Case> cases = {
        { { Msg(MACO__P2P_SEND, 0, 0x1000, 8, 1) }, 1, "no matching receive" },
        { { Msg(MACO__P2P_RECV, 0, 0x1000, 8, 1) }, 1, "no matching send" },
        { { Msg(MACO__P2P_SEND, 0, 0x1000, 8, 1), Msg(MACO__P2P_SEND, 0, 0x2000, 8, 2),
            Msg(MACO__P2P_RECV, 0, 0x3000, 8, 3) },
          2,
          "no matching" },
        { { Msg(MACO__P2P_SEND, 0, 0x1000, 8, 1), Msg(MACO__P2P_RECV, 0, 0x3000, 12, 2) },
          2,
          "but the matching send, call 1" },
        { { Msg(MACO__P2P_RECV, 1, 0x1000, 100, 1), Msg(MACO__P2P_RECV, 1, 0x1063, 1, 2) },
          1,
          "overlaps the receive buffer" },
        /* Receives from different peers into overlapping buffers, a send between them: the
         * send is no excuse (it is staged), the receives still collide. */
        { { Msg(MACO__P2P_SEND, 1, 0x1000, 100, 1), Msg(MACO__P2P_RECV, 1, 0x1000, 100, 2),
            Msg(MACO__P2P_RECV, 0, 0x1060, 8, 3) },
          2,
          "overlaps the receive buffer" },
        { { Msg(MACO__P2P_SEND, 2, 0x1000, 100, 1) }, 1, "peer 2 is outside [0, 2)" },
        { { Msg(MACO__P2P_SEND, 1, 0x1000, MACO__P2P_MAX_BYTES + 1, 1) }, 1, "2^48" },
    };
    std::vector<maco__p2p_msg_t> many;
    for (int i = 0; i < MACO__P2P_MAX_OPS + 1; i++)
        many.push_back(Msg(MACO__P2P_SEND, 1, 0x1000, 8, i + 1));
    cases.push_back({ many, MACO__P2P_MAX_OPS + 1, "more than 128 sends and receives" });
    for (const Case &c : cases) {
        maco__p2p_plan_t plan;
        memset(&plan, 0x5A, sizeof(plan));
        char why[512];
        int call = -1;
        EXPECT_EQ(maco__p2p_plan_build(c.msgs.data(), static_cast<int>(c.msgs.size()), rank, n,
                                       &plan, &call, why, sizeof(why)),
                  MACO_ERR_INVALID_ARGUMENT)
            << c.says;
        EXPECT_EQ(call, c.call) << why;
        EXPECT_NE(std::string(why).find(c.says), std::string::npos) << why;
        EXPECT_NE(std::string(why).find("call " + std::to_string(c.call)), std::string::npos)
            << why;
        EXPECT_EQ(reinterpret_cast<const unsigned char *>(&plan)[0], 0x5A) << "plan written";
    }
    /* Overlapping sends are fine (the same data to several peers), and so are 0-byte
     * receives at any address. */
    std::vector<maco__p2p_msg_t> ok = { Msg(MACO__P2P_SEND, 1, 0x1000, 100, 1),
                                        Msg(MACO__P2P_SEND, 1, 0x1000, 100, 2),
                                        Msg(MACO__P2P_RECV, 1, 0x1010, 0, 3) };
    char why[512];
    EXPECT_EQ(maco__p2p_plan_build(ok.data(), 3, rank, n, nullptr, nullptr, why, sizeof(why)),
              MACO_OK)
        << why;
}

/* In place (nccl-tests' in-place sendrecv: send X to rank r + 1, receive into X from rank
 * r - 1): accepted, and exactly the sends whose bytes a receive of the group writes are marked
 * for staging (their source is copied aside before the launch: group.c), local copies
 * included; receives and sends that touch no receive buffer are not marked. */
TEST_F(P2PPlan, SendsOverlappingReceivesAreStagedNotRefused)
{
    const int rank = 1, n = 4;
    std::vector<maco__p2p_msg_t> m = {
        Msg(MACO__P2P_SEND, 2, 0x1000, 100, 1), /* X to the next rank */
        Msg(MACO__P2P_RECV, 0, 0x1000, 100, 2), /* into X from the previous one */
        Msg(MACO__P2P_SEND, 3, 0x9000, 64, 3),  /* touches no receive buffer */
        Msg(MACO__P2P_SEND, 0, 0x1063, 1, 4),   /* the last byte of X only */
        Msg(MACO__P2P_SEND, 3, 0x1064, 8, 5),   /* just past X */
        Msg(MACO__P2P_SEND, 1, 0x5000, 32, 6),  /* local copy onto itself */
        Msg(MACO__P2P_RECV, 1, 0x5000, 32, 7),  /* (send 6's receive) */
        Msg(MACO__P2P_SEND, 1, 0x7000, 16, 8),  /* local copy elsewhere */
        Msg(MACO__P2P_RECV, 1, 0x7100, 16, 9),  /* (send 8's receive) */
        Msg(MACO__P2P_SEND, 2, 0x70f8, 16, 10), /* overlaps receive 9 by 8 bytes */
        Msg(MACO__P2P_RECV, 2, 0x2000, 0, 11),  /* 0 bytes: overlaps nothing */
        Msg(MACO__P2P_SEND, 2, 0x2000, 4, 12),
    };
    maco__p2p_plan_t plan;
    char why[512];
    int call = -1;
    ASSERT_EQ(maco__p2p_plan_build(m.data(), static_cast<int>(m.size()), rank, n, &plan, &call, why,
                                   sizeof(why)),
              MACO_OK)
        << why;
    /* Staged sources, by the address each op reads. */
    std::vector<uintptr_t> staged, plain;
    for (int o = 0; o < plan.nops; o++) {
        uintptr_t src = reinterpret_cast<uintptr_t>(plan.ops[o].src);
        if (plan.ops[o].src == nullptr)
            continue; /* a receive */
        ((plan.op_flags[o] & MACO__P2P_FLAG_STAGE) ? staged : plain).push_back(src);
        /* The kind and element-size bits are the message's own. */
        EXPECT_EQ(plan.op_flags[o] & 0x0Fu, MACO__P2P_FLAGS(MACO__P2P_KIND_SENDRECV, 2, 0));
    }
    std::sort(staged.begin(), staged.end());
    std::sort(plain.begin(), plain.end());
    EXPECT_EQ(staged, (std::vector<uintptr_t>{ 0x1000, 0x1063, 0x5000, 0x70f8 }));
    EXPECT_EQ(plain, (std::vector<uintptr_t>{ 0x1064, 0x2000, 0x7000, 0x9000 }));
    for (int o = 0; o < plan.nops; o++) {
        if (plan.ops[o].src == nullptr) {
            EXPECT_EQ(plan.op_flags[o] & MACO__P2P_FLAG_STAGE, 0u) << "a receive marked";
        }
    }
    /* A caller's flags never carry the mark in: it is the planner's alone. */
    std::vector<maco__p2p_msg_t> one = { Msg(MACO__P2P_SEND, 0, 0x1000, 8, 1) };
    one[0].flags |= MACO__P2P_FLAG_STAGE;
    ASSERT_EQ(maco__p2p_plan_build(one.data(), 1, rank, n, &plan, nullptr, why, sizeof(why)),
              MACO_OK);
    EXPECT_EQ(plan.op_flags[0] & MACO__P2P_FLAG_STAGE, 0u);
}

} // namespace
