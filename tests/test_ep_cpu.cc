/*
 * test_ep_cpu.cc - expert-parallel dispatch and combine without a GPU (maco/ep.h): the
 * configuration checks, the buffer's and the handle's layouts, the routing and receive-layout
 * arithmetic the kernels follow (algorithms/ep/ep_layout.c, compiled into this test: it is the
 * GPU test's reference), the argument checks of the calls, and the public calls' errors.
 */
#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "algorithms/ep/ep_layout.h"
#include "maco_test.h"

namespace
{

using maco_test::AllowLog;

maco_ep_config_t Config(maco_ep_mode_t mode, int tokens, int hidden, int experts, int topk)
{
    maco_ep_config_t c;
    std::memset(&c, 0, sizeof(c));
    c.mode = mode;
    c.max_tokens_per_rank = tokens;
    c.hidden = hidden;
    c.num_experts = experts;
    c.topk = topk;
    c.dtype = MACO_BFLOAT16;
    return c;
}

/* maco__ep_plan's verdict and sentence. */
maco_status_t Plan(const maco_ep_config_t &c, int nranks, std::string *why,
                   maco__ep_geom_t *g = nullptr, maco__ep_offsets_t *o = nullptr)
{
    char text[400] = "";
    maco_status_t st = maco__ep_plan(&c, nranks, g, o, text, sizeof(text));
    *why = text;
    return st;
}

class EpCpu : public maco_test::Test
{
};

TEST_F(EpCpu, ConfigurationLimitsAreNamed)
{
    std::string why;
    maco_ep_config_t ok = Config(MACO_EP_LOW_LATENCY, 128, 7168, 256, 8);
    ASSERT_EQ(Plan(ok, 4, &why), MACO_OK) << why;
    struct Case {
        const char *field;
        void (*set)(maco_ep_config_t *);
        maco_status_t st;
        const char *text;
    };
    const Case cases[] = {
        { "mode", [](maco_ep_config_t *c) { c->mode = (maco_ep_mode_t)7; },
          MACO_ERR_INVALID_ARGUMENT, "config.mode 7" },
        { "tokens 0", [](maco_ep_config_t *c) { c->max_tokens_per_rank = 0; },
          MACO_ERR_INVALID_ARGUMENT, "config.max_tokens_per_rank 0 is outside [1, 65536]" },
        { "tokens big", [](maco_ep_config_t *c) { c->max_tokens_per_rank = 65537; },
          MACO_ERR_INVALID_ARGUMENT, "config.max_tokens_per_rank 65537" },
        { "hidden odd", [](maco_ep_config_t *c) { c->hidden = 7170; }, MACO_ERR_INVALID_ARGUMENT,
          "config.hidden 7170 is not a multiple of 8" },
        { "hidden 0", [](maco_ep_config_t *c) { c->hidden = 0; }, MACO_ERR_INVALID_ARGUMENT,
          "config.hidden 0" },
        { "experts", [](maco_ep_config_t *c) { c->num_experts = 258; }, MACO_ERR_INVALID_ARGUMENT,
          "config.num_experts 258 is not a multiple of the 4 ranks" },
        { "experts big", [](maco_ep_config_t *c) { c->num_experts = 2048; },
          MACO_ERR_INVALID_ARGUMENT, "in [1, 1024]" },
        { "topk 0", [](maco_ep_config_t *c) { c->topk = 0; }, MACO_ERR_INVALID_ARGUMENT,
          "config.topk 0 is outside [1, 32]" },
        { "topk big", [](maco_ep_config_t *c) { c->topk = 33; }, MACO_ERR_INVALID_ARGUMENT,
          "config.topk 33" },
        { "fp8", [](maco_ep_config_t *c) { c->dtype = MACO_FP8_E4M3; }, MACO_ERR_UNSUPPORTED,
          "dispatch with maco_ep_dispatch_fp8" },
        { "float", [](maco_ep_config_t *c) { c->dtype = MACO_FLOAT32; }, MACO_ERR_UNSUPPORTED,
          "config.dtype float32" },
        { "dtype range", [](maco_ep_config_t *c) { c->dtype = (maco_datatype_t)99; },
          MACO_ERR_INVALID_ARGUMENT, "config.dtype 99" },
        { "ll recv", [](maco_ep_config_t *c) { c->max_recv_tokens = 10; },
          MACO_ERR_INVALID_ARGUMENT, "must be 0 in low latency mode" },
        { "ctas", [](maco_ep_config_t *c) { c->num_ctas = -1; }, MACO_ERR_INVALID_ARGUMENT,
          "config.num_ctas -1" },
    };
    for (const Case &k : cases) {
        maco_ep_config_t c = ok;
        k.set(&c);
        EXPECT_EQ(Plan(c, 4, &why), k.st) << k.field;
        EXPECT_NE(why.find(k.text), std::string::npos) << k.field << ": " << why;
    }
    EXPECT_EQ(Plan(ok, 9, &why), MACO_ERR_UNSUPPORTED);
    EXPECT_NE(why.find("9 ranks"), std::string::npos) << why;
    /* Normal mode: max_recv_tokens up to the worst case n * T * min(K, L). */
    maco_ep_config_t nm = Config(MACO_EP_NORMAL, 100, 64, 8, 4);
    nm.max_recv_tokens = 2 * 100 * 4 + 1; /* L = 4 on 2 ranks: worst 800 */
    EXPECT_EQ(Plan(nm, 2, &why), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(why.find("outside [0, 800]"), std::string::npos) << why;
    nm.max_recv_tokens = 800;
    EXPECT_EQ(Plan(nm, 2, &why), MACO_OK) << why;
}

TEST_F(EpCpu, BufferAndHandleLayouts)
{
    std::string why;
    maco__ep_geom_t g;
    maco__ep_offsets_t o;
    /* The low-latency shape on 4 ranks. */
    ASSERT_EQ(Plan(Config(MACO_EP_LOW_LATENCY, 128, 7168, 256, 8), 4, &why, &g, &o), MACO_OK);
    EXPECT_EQ(g.local_experts, 64);
    EXPECT_EQ(g.expert_cap, 4 * 128);
    EXPECT_EQ(g.recv_rows, 64 * 4 * 128);
    EXPECT_EQ(g.row_bytes, 7168u * 2u);
    EXPECT_EQ(o.cnt_off, 4096u);
    EXPECT_EQ(o.cnt_row_bytes, 1056u); /* (8 + 256) int32, a multiple of 16 */
    EXPECT_EQ(o.chunk_off, 4096u + 2u * 4u * 1056u);
    EXPECT_EQ(o.meta_off, o.chunk_off + 4u * 256u * 4u); /* 4 chunks of 32 tokens */
    EXPECT_EQ(o.recv_off % 4096u, 0u);
    EXPECT_GE(o.recv_off, o.meta_off + 32768u * 16u);
    EXPECT_EQ(o.comb_off % 4096u, 0u);
    EXPECT_GE(o.comb_off, o.recv_off + 32768u * 14336u);
    EXPECT_GE(o.total_bytes, o.comb_off + 128u * 8u * 14336u);
    EXPECT_LT(o.total_bytes, o.comb_off + 128u * 8u * 14336u + 4096u);
    EXPECT_EQ(o.h_exp_off, 64u);
    EXPECT_EQ(o.h_slot_off, 64u + 2u * 64u * 4u);
    EXPECT_EQ(o.h_meta_off, o.h_slot_off + 128u * 8u * 4u);
    EXPECT_EQ(o.handle_bytes % 256u, 0u);
    EXPECT_GE(o.handle_bytes, o.h_meta_off + 32768u * 8u);
    size_t bytes = 0, hbytes = 0;
    maco_ep_config_t c = Config(MACO_EP_LOW_LATENCY, 128, 7168, 256, 8);
    ASSERT_EQ(maco_ep_buffer_size(&c, 4, &bytes, &hbytes), MACO_OK);
    EXPECT_EQ(bytes, o.total_bytes);
    EXPECT_EQ(hbytes, o.handle_bytes);
    /* Normal mode, default capacity: the worst case. */
    ASSERT_EQ(Plan(Config(MACO_EP_NORMAL, 4096, 7168, 256, 8), 4, &why, &g, &o), MACO_OK);
    EXPECT_EQ(g.expert_cap, 0);
    EXPECT_EQ(g.recv_rows, 4 * 4096 * 8);
    c = Config(MACO_EP_NORMAL, 4096, 7168, 256, 8);
    c.max_recv_tokens = 65536;
    ASSERT_EQ(Plan(c, 4, &why, &g, &o), MACO_OK);
    EXPECT_EQ(g.recv_rows, 65536);
    /* Every region is aligned and none overlaps the next, over many shapes. */
    std::mt19937 rng(7);
    for (int i = 0; i < 200; i++) {
        int n = 1 + (int)(rng() % 8);
        int experts = n * (1 + (int)(rng() % (1024 / n)));
        int topk = 1 + (int)(rng() % std::min(32, experts));
        maco_ep_config_t r =
            Config(rng() % 2 ? MACO_EP_NORMAL : MACO_EP_LOW_LATENCY, 1 + (int)(rng() % 5000),
                   8 * (1 + (int)(rng() % 1000)), experts, topk);
        ASSERT_EQ(Plan(r, n, &why, &g, &o), MACO_OK) << why;
        const uint64_t E = (uint64_t)experts, T = (uint64_t)r.max_tokens_per_rank;
        EXPECT_EQ(o.cnt_row_bytes % 16u, 0u);
        EXPECT_GE(o.cnt_row_bytes, (8u + E) * 4u);
        EXPECT_GE(o.chunk_off, o.cnt_off + 2u * (uint64_t)n * o.cnt_row_bytes);
        EXPECT_GE(o.meta_off, o.chunk_off + (T + 31u) / 32u * E * 4u);
        EXPECT_GE(o.recv_off, o.meta_off + (uint64_t)g.recv_rows * 16u);
        EXPECT_GE(o.comb_off, o.recv_off + (uint64_t)g.recv_rows * g.row_bytes);
        EXPECT_GE(o.total_bytes, o.comb_off + T * (uint64_t)topk * g.row_bytes);
        for (uint64_t off : { o.chunk_off, o.meta_off, o.recv_off, o.comb_off, o.total_bytes })
            EXPECT_EQ(off % 256u, 0u);
        EXPECT_EQ(o.h_slot_off % 16u, 0u);
        EXPECT_EQ(o.h_meta_off % 16u, 0u);
        EXPECT_GE(o.h_slot_off, o.h_exp_off + 2u * (uint64_t)g.local_experts * 4u);
        EXPECT_GE(o.h_meta_off, o.h_slot_off + T * (uint64_t)topk * 4u);
        EXPECT_GE(o.handle_bytes, o.h_meta_off + (uint64_t)g.recv_rows * 8u);
        if (r.mode == MACO_EP_LOW_LATENCY) {
            EXPECT_EQ(g.recv_rows, (int64_t)experts * (int64_t)T);
        }
    }
}

/* The combine's token groups (ep_kernels.cu, combine step 3): at least 128 tokens each, so
 * that up to 128 tokens take one group; never more than MACO__EP_MAX_GROUPS groups, whose
 * counters the control words hold. */
TEST_F(EpCpu, CombineTokenGroups)
{
    EXPECT_EQ(maco__ep_group_tokens(1), 128);
    EXPECT_EQ(maco__ep_group_tokens(128), 128);
    EXPECT_EQ(maco__ep_group_tokens(4096), 128);
    EXPECT_EQ(maco__ep_group_tokens(4097), 129);
    EXPECT_EQ(maco__ep_group_tokens(MACO_EP_MAX_TOKENS), MACO_EP_MAX_TOKENS / 32);
    for (int T = 1; T <= MACO_EP_MAX_TOKENS; T += T < 300 ? 1 : 97) {
        const int gt = maco__ep_group_tokens(T), groups = (T + gt - 1) / gt;
        ASSERT_GE(gt, 128) << T;
        ASSERT_LE(groups, (int)MACO__EP_MAX_GROUPS) << T;
        if (T <= 128) {
            ASSERT_EQ(groups, 1) << T;
        }
    }
}

TEST_F(EpCpu, RoutingGivesSlotsInTokenOrder)
{
    /* 4 tokens, top-2 of 4 experts (the hand-worked example of ep_layout.h's routing). */
    const int64_t idx[] = { 0, 1, 1, -1, 0, 2, 3, 0 };
    int32_t slot[8], count[4];
    maco__ep_bad_t bad;
    ASSERT_EQ(maco__ep_route(idx, 4, 2, 4, slot, count, &bad), 0);
    const int32_t want_slot[] = { 0, 0, 1, -1, 1, 0, 0, 2 };
    const int32_t want_count[] = { 3, 2, 1, 1 };
    for (int i = 0; i < 8; i++)
        EXPECT_EQ(slot[i], want_slot[i]) << "entry " << i;
    for (int e = 0; e < 4; e++)
        EXPECT_EQ(count[e], want_count[e]) << "expert " << e;
    /* No tokens: no entries, zero counts. */
    ASSERT_EQ(maco__ep_route(idx, 0, 2, 4, slot, count, &bad), 0);
    for (int e = 0; e < 4; e++)
        EXPECT_EQ(count[e], 0);
}

TEST_F(EpCpu, RoutingFindsTheFirstBadEntry)
{
    int32_t slot[8], count[4];
    maco__ep_bad_t bad;
    const int64_t out_of_range[] = { 0, 1, 2, 4, -2, 0, 1, 1 };
    ASSERT_EQ(maco__ep_route(out_of_range, 4, 2, 4, slot, count, &bad), 1);
    EXPECT_EQ(bad.code, MACO__EP_BAD_EXPERT);
    EXPECT_EQ(bad.token, 1);
    EXPECT_EQ(bad.k, 1);
    EXPECT_EQ(bad.value, 4);
    EXPECT_EQ(bad.limit, 4);
    EXPECT_EQ(slot[3], -1);
    EXPECT_EQ(slot[4], -1);
    EXPECT_EQ(slot[7], -1); /* the repeat of token 3 */
    EXPECT_EQ(slot[6], 1);  /* its first occurrence counts (expert 1: tokens 0 and 3) */
    const int64_t repeat[] = { 0, 1, 3, 3, 5000000000ll, 0, 1, 2 };
    ASSERT_EQ(maco__ep_route(repeat, 4, 2, 4, slot, count, &bad), 1);
    EXPECT_EQ(bad.code, MACO__EP_REPEAT);
    EXPECT_EQ(bad.token, 1);
    EXPECT_EQ(bad.k, 1);
    EXPECT_EQ(bad.value, 3);
    EXPECT_EQ(bad.limit, 0);
    char text[400];
    bad.rank = 2;
    maco__ep_bad_text(&bad, "maco_ep_dispatch", text, sizeof(text));
    EXPECT_NE(std::strstr(text, "rank 2: topk_idx[1][1] = 3 repeats topk_idx[1][0]"), nullptr)
        << text;
    ASSERT_EQ(maco__ep_route(repeat + 4, 2, 2, 4, slot, count, &bad), 1);
    EXPECT_EQ(bad.value, 5000000000ll);
    bad.rank = 0;
    maco__ep_bad_text(&bad, "maco_ep_dispatch", text, sizeof(text));
    EXPECT_NE(std::strstr(text, "topk_idx[0][0] = 5000000000 is outside [-1, 4)"), nullptr) << text;
}

/* Random routing for `n` ranks: every rank's slots and counts, checked against a direct
 * count, then every entry's receive row: the rows of each local expert of each rank are
 * exactly [base, base + total), by source rank then token order. */
void CheckRandomLayout(maco_ep_mode_t mode, int n, int experts, int topk, int tokens,
                       std::mt19937 *rng)
{
    maco_ep_config_t c = Config(mode, tokens, 8, experts, topk);
    maco__ep_geom_t g;
    std::string why;
    ASSERT_EQ(Plan(c, n, &why, &g), MACO_OK) << why;
    const int L = experts / n;
    std::vector<int32_t> counts((size_t)n * experts);
    std::vector<std::vector<int64_t>> idx(n);
    std::vector<std::vector<int32_t>> slot(n);
    for (int r = 0; r < n; r++) {
        int T = (int)((*rng)() % (tokens + 1));
        idx[r].assign((size_t)T * topk, -1);
        for (int t = 0; t < T; t++) {
            std::vector<int> perm(experts);
            for (int e = 0; e < experts; e++)
                perm[e] = e;
            std::shuffle(perm.begin(), perm.end(), *rng);
            for (int k = 0; k < topk; k++)
                idx[r][(size_t)t * topk + k] = (*rng)() % 5 == 0 ? -1 : perm[k];
        }
        slot[r].assign(idx[r].size(), 0);
        maco__ep_bad_t bad;
        ASSERT_EQ(maco__ep_route(idx[r].data(), T, topk, experts, slot[r].data(),
                                 &counts[(size_t)r * experts], &bad),
                  0);
        std::vector<int32_t> seen(experts, 0);
        for (size_t i = 0; i < idx[r].size(); i++) {
            if (idx[r][i] < 0) {
                EXPECT_EQ(slot[r][i], -1);
                continue;
            }
            EXPECT_EQ(slot[r][i], seen[idx[r][i]]++) << "rank " << r << " entry " << i;
        }
        for (int e = 0; e < experts; e++)
            EXPECT_EQ(counts[(size_t)r * experts + e], seen[e]);
    }
    for (int dst = 0; dst < n; dst++) {
        std::vector<int64_t> base(L), total(L);
        int64_t num_recv = -1;
        maco__ep_recv_layout(&g, counts.data(), dst, base.data(), total.data(), &num_recv);
        int64_t sum = 0;
        for (int l = 0; l < L; l++) {
            sum += total[l];
            if (mode == MACO_EP_LOW_LATENCY) {
                EXPECT_EQ(base[l], (int64_t)l * n * tokens);
                EXPECT_LE(total[l], (int64_t)n * tokens);
            } else {
                EXPECT_EQ(base[l], sum - total[l]);
            }
        }
        EXPECT_EQ(num_recv, sum);
        /* Every entry for dst's experts, in (expert, source, token) order, takes the next row. */
        for (int l = 0; l < L; l++) {
            int64_t next = base[l];
            const int e = dst * L + l;
            for (int src = 0; src < n; src++)
                for (size_t i = 0; i < idx[src].size(); i++)
                    if (idx[src][i] == e) {
                        EXPECT_EQ(maco__ep_recv_row(&g, counts.data(), src, e, slot[src][i]),
                                  next++)
                            << "dst " << dst << " expert " << e << " src " << src << " entry " << i;
                    }
            EXPECT_EQ(next, base[l] + total[l]);
        }
    }
}

TEST_F(EpCpu, ReceiveLayoutPacksBySourceThenToken)
{
    std::mt19937 rng(11);
    for (int n : { 1, 2, 3, 4, 8 })
        for (maco_ep_mode_t mode : { MACO_EP_LOW_LATENCY, MACO_EP_NORMAL })
            ASSERT_NO_FATAL_FAILURE(
                CheckRandomLayout(mode, n, 8 * n, std::min(8, 8 * n), 37, &rng));
}

TEST_F(EpCpu, OverflowIsFoundOnTheFirstRank)
{
    maco_ep_config_t c = Config(MACO_EP_NORMAL, 10, 8, 4, 2);
    c.max_recv_tokens = 5;
    maco__ep_geom_t g;
    std::string why;
    ASSERT_EQ(Plan(c, 2, &why, &g), MACO_OK) << why;
    /* counts[src][e]: rank 0 gets experts 0, 1; rank 1 experts 2, 3. */
    const int32_t fits[] = { 2, 0, 1, 1, 1, 2, 2, 1 }; /* rank 0: 5 rows, rank 1: 5 */
    maco__ep_bad_t bad;
    EXPECT_EQ(maco__ep_overflow(&g, fits, &bad), 0);
    const int32_t over[] = { 2, 0, 3, 1, 1, 2, 3, 1 }; /* rank 1: 3 + 1 + 3 + 1 = 8 > 5 */
    ASSERT_EQ(maco__ep_overflow(&g, over, &bad), 1);
    EXPECT_EQ(bad.code, MACO__EP_OVERFLOW);
    EXPECT_EQ(bad.rank, 1);
    EXPECT_EQ(bad.value, 8);
    EXPECT_EQ(bad.limit, 5);
    char text[400];
    maco__ep_bad_text(&bad, "maco_ep_dispatch", text, sizeof(text));
    EXPECT_NE(std::strstr(text, "rank 1 would receive 8 rows, more than the receive region's 5"),
              nullptr)
        << text;
    g.mode = MACO_EP_LOW_LATENCY; /* its capacity always holds */
    EXPECT_EQ(maco__ep_overflow(&g, over, &bad), 0);
}

TEST_F(EpCpu, CallArgumentsAreChecked)
{
    maco__ep_geom_t g;
    std::string why;
    ASSERT_EQ(Plan(Config(MACO_EP_NORMAL, 64, 256, 16, 4), 4, &why, &g), MACO_OK);
    alignas(16) static char mem[4096];
    const void *x = mem;
    const int64_t *idx = (const int64_t *)(mem + 512);
    const float *w = (const float *)(mem + 1024);
    int32_t *counts = (int32_t *)(mem + 1536);
    void *handle = mem + 2048;
    char text[400];
    auto dispatch = [&](const void *xx, maco_datatype_t dt, int tokens, int hidden,
                        const int64_t *ii, int topk, int32_t *cc, void *hh, int want) {
        text[0] = '\0';
        return maco__ep_check_dispatch(&g, 0, xx, dt, tokens, hidden, ii, w, topk, cc, nullptr,
                                       nullptr, hh, want, text, sizeof(text));
    };
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 64, 256, idx, 4, counts, handle, 1), MACO_OK) << text;
    EXPECT_EQ(dispatch(nullptr, MACO_BFLOAT16, 0, 256, nullptr, 4, counts, handle, 0), MACO_OK)
        << text;
    EXPECT_EQ(dispatch(x, MACO_FLOAT16, 64, 256, idx, 4, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "maco_ep_dispatch: x_dtype is float16; the buffer moves bfloat16"),
              nullptr)
        << text;
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 65, 256, idx, 4, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "num_tokens 65 is outside [0, 64]"), nullptr) << text;
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, -1, 256, idx, 4, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 8, 128, idx, 4, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "hidden 128 differs from the buffer's 256"), nullptr) << text;
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 8, 256, idx, 2, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "topk 2 differs from the buffer's 4"), nullptr) << text;
    EXPECT_EQ(dispatch(nullptr, MACO_BFLOAT16, 8, 256, idx, 4, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "x is NULL (num_tokens 8)"), nullptr) << text;
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 8, 256, nullptr, 4, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "topk_idx is NULL"), nullptr) << text;
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 8, 256, idx, 4, nullptr, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "recv_counts is NULL"), nullptr) << text;
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 8, 256, idx, 4, counts, nullptr, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "handle is NULL"), nullptr) << text;
    EXPECT_EQ(dispatch(mem + 8, MACO_BFLOAT16, 8, 256, idx, 4, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "x 0x"), nullptr) << text;
    EXPECT_NE(std::strstr(text, "is not 16-byte aligned"), nullptr) << text;
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 8, 256, (const int64_t *)(mem + 4), 4, counts, handle, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "topk_idx"), nullptr) << text;
    EXPECT_EQ(dispatch(x, MACO_BFLOAT16, 8, 256, idx, 4, counts, mem + 2056, 0),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "handle"), nullptr) << text;
    /* num_recv_p is for normal mode only. */
    maco__ep_geom_t ll;
    ASSERT_EQ(Plan(Config(MACO_EP_LOW_LATENCY, 64, 256, 16, 4), 4, &why, &ll), MACO_OK);
    EXPECT_EQ(maco__ep_check_dispatch(&ll, 0, x, MACO_BFLOAT16, 8, 256, idx, w, 4, counts, nullptr,
                                      nullptr, handle, 1, text, sizeof(text)),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "num_recv_p must be NULL in low latency mode"), nullptr) << text;
    /* maco_ep_dispatch_fp8: the same checks under its own name; hidden a multiple of 128. */
    EXPECT_EQ(maco__ep_check_dispatch(&ll, 1, x, MACO_BFLOAT16, 8, 256, idx, w, 4, counts, nullptr,
                                      nullptr, handle, 0, text, sizeof(text)),
              MACO_OK)
        << text;
    EXPECT_EQ(maco__ep_check_dispatch(&ll, 1, nullptr, MACO_BFLOAT16, 8, 256, idx, w, 4, counts,
                                      nullptr, nullptr, handle, 0, text, sizeof(text)),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "maco_ep_dispatch_fp8: x is NULL"), nullptr) << text;
    maco__ep_geom_t narrow;
    ASSERT_EQ(Plan(Config(MACO_EP_LOW_LATENCY, 64, 200, 16, 4), 4, &why, &narrow), MACO_OK);
    EXPECT_EQ(maco__ep_check_dispatch(&narrow, 0, x, MACO_BFLOAT16, 8, 200, idx, w, 4, counts,
                                      nullptr, nullptr, handle, 0, text, sizeof(text)),
              MACO_OK)
        << text;
    EXPECT_EQ(maco__ep_check_dispatch(&narrow, 1, x, MACO_BFLOAT16, 8, 200, idx, w, 4, counts,
                                      nullptr, nullptr, handle, 0, text, sizeof(text)),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "maco_ep_dispatch_fp8: hidden 200 is not a multiple of 128"),
              nullptr)
        << text;

    auto combine = [&](const void *out, maco_datatype_t dt, int hidden, const void *hh,
                       const float *ww, int tokens, int topk, const void *y) {
        text[0] = '\0';
        return maco__ep_check_combine(&g, out, dt, hidden, hh, ww, tokens, topk, y, text,
                                      sizeof(text));
    };
    void *y = mem + 3072;
    EXPECT_EQ(combine(x, MACO_BFLOAT16, 256, handle, w, 64, 4, y), MACO_OK) << text;
    EXPECT_EQ(combine(x, MACO_BFLOAT16, 256, handle, nullptr, 0, 4, nullptr), MACO_OK) << text;
    EXPECT_EQ(combine(nullptr, MACO_BFLOAT16, 256, handle, w, 64, 4, y), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "maco_ep_combine: expert_out is NULL"), nullptr) << text;
    EXPECT_EQ(combine(x, MACO_BFLOAT16, 256, nullptr, w, 64, 4, y), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "handle is NULL"), nullptr) << text;
    EXPECT_EQ(combine(x, MACO_BFLOAT16, 256, handle, nullptr, 64, 4, y), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "topk_weights is NULL"), nullptr) << text;
    EXPECT_EQ(combine(x, MACO_BFLOAT16, 256, handle, w, 64, 4, nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "y is NULL"), nullptr) << text;
    EXPECT_EQ(combine(x, MACO_INT8, 256, handle, w, 64, 4, y), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "dtype is int8"), nullptr) << text;
    EXPECT_EQ(combine(x, MACO_BFLOAT16, 264, handle, w, 64, 4, y), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "hidden 264 differs"), nullptr) << text;
    EXPECT_EQ(combine(x, MACO_BFLOAT16, 256, handle, w, 100, 4, y), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "num_tokens 100 is outside [0, 64]"), nullptr) << text;
    EXPECT_EQ(combine(x, MACO_BFLOAT16, 256, handle, w, 64, 4, mem + 3080),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(text, "y 0x"), nullptr) << text;
}

TEST_F(EpCpu, PublicCallsRefuseBadArguments)
{
    AllowLog("maco_ep_");
    maco_ep_config_t c = Config(MACO_EP_LOW_LATENCY, 128, 7168, 256, 8);
    size_t bytes = 0, hbytes = 0;
    EXPECT_EQ(maco_ep_buffer_size(nullptr, 4, &bytes, &hbytes), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_ep_buffer_size(&c, 4, nullptr, &hbytes), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_ep_buffer_size(&c, 0, &bytes, &hbytes), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_ep_buffer_size(&c, 16, &bytes, &hbytes), MACO_ERR_INVALID_ARGUMENT);
    c.topk = 0;
    EXPECT_EQ(maco_ep_buffer_size(&c, 4, &bytes, &hbytes), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(bytes, 0u); /* outputs untouched on failure */
    maco_ep_buffer_t buf = nullptr;
    EXPECT_EQ(maco_ep_buffer_create(nullptr, &c, &buf), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(buf, nullptr);
    EXPECT_EQ(maco_ep_buffer_destroy(nullptr), MACO_OK);
    EXPECT_EQ(maco_ep_buffer_check(nullptr), MACO_ERR_INVALID_ARGUMENT);
    maco_ep_info_t info;
    EXPECT_EQ(maco_ep_buffer_get_info(nullptr, &info), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_ep_dispatch(nullptr, nullptr, MACO_BFLOAT16, 0, 7168, nullptr, nullptr, 8,
                               nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_ep_combine(nullptr, nullptr, MACO_BFLOAT16, 7168, nullptr, nullptr, 0, 8,
                              nullptr, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
}

/* A one-rank communicator: without a GPU the buffer is refused with the reason; with one it
 * is made (one rank, its own peer) and sized as maco_ep_buffer_size says. */
TEST_F(EpCpu, CreateOnOneRank)
{
    AllowLog("maco_ep_buffer_create");
    maco_unique_id_t uid;
    ASSERT_EQ(maco_unique_id_create(&uid), MACO_OK);
    maco_bootstrap_t bs = nullptr;
    ASSERT_EQ(maco_bootstrap_create(&uid, 0, 1, 10000, &bs), MACO_OK);
    maco_comm_t comm = nullptr;
    ASSERT_EQ(maco_comm_create(bs, -1, &comm), MACO_OK);
    maco_ep_config_t c = Config(MACO_EP_LOW_LATENCY, 16, 64, 4, 2);
    maco_ep_buffer_t buf = nullptr;
    char why[512];
    maco_status_t st = maco_ep_buffer_create(comm, &c, &buf);
    if (maco_cuda_device_count(why, sizeof(why)) == 0) {
        EXPECT_EQ(st, MACO_ERR_UNSUPPORTED);
        EXPECT_EQ(buf, nullptr);
        EXPECT_NE(std::string(maco_comm_get_last_error(comm)).find("maco_ep_buffer_create"),
                  std::string::npos)
            << maco_comm_get_last_error(comm);
    } else {
        ASSERT_EQ(st, MACO_OK) << maco_comm_get_last_error(comm);
        maco_ep_info_t info;
        ASSERT_EQ(maco_ep_buffer_get_info(buf, &info), MACO_OK);
        size_t bytes = 0, hbytes = 0;
        ASSERT_EQ(maco_ep_buffer_size(&c, 1, &bytes, &hbytes), MACO_OK);
        EXPECT_EQ(info.buffer_bytes, bytes);
        EXPECT_EQ(info.handle_bytes, hbytes);
        EXPECT_EQ(info.recv_rows, 4 * 16);
        EXPECT_EQ(maco_ep_buffer_check(buf), MACO_OK);
        EXPECT_EQ(maco_ep_buffer_destroy(buf), MACO_OK);
    }
    c.topk = 5; /* more than num_experts: refused (after the GPU check without a GPU) */
    buf = nullptr;
    st = maco_ep_buffer_create(comm, &c, &buf);
    EXPECT_NE(st, MACO_OK);
    EXPECT_EQ(buf, nullptr);
    maco_comm_destroy(comm);
    maco_bootstrap_destroy(bs);
}

} // namespace
