/*
 * test_ep_gpu.cc - expert-parallel dispatch and combine on real GPUs (maco/ep.h), under
 * maco-run with one rank per GPU or several ranks sharing one.
 *
 * Every rank draws every rank's inputs from the shared seed on the host (token rows, top-k
 * experts, weights), so each rank computes its own expected results without any exchange:
 * the routing and the receive layout from algorithms/ep/ep_layout.c (compiled in: the
 * reference the kernels follow), the rows it must receive, and each token's combined output
 * with the same float32 fused multiply-adds in k order and one bfloat16 rounding as the
 * kernel. The "experts" are an elementwise function of each received row computed on the
 * host. Outputs (the receive region, counts, offsets, weights, y) are poisoned before each
 * call; every byte is compared, and the first wrong one is reported with where it came from.
 * Each case runs twice and the two runs must agree bit for bit. Routing: uniform, one hot
 * expert, a rank that receives nothing, all of a token's experts on one rank, tokens with -1
 * entries (some with no expert), ranks with no tokens. Bad input: refused arguments (nothing
 * written), and device-found problems (an expert out of range or repeated, a full receive
 * region, a combine with another token count) that stop every rank alike.
 */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "algorithms/ep/ep_layout.h"
#include "gpu_case.h"
#include "maco_test.h"

namespace
{

using maco_test::AllowLog;
using maco_test::Bootstrap;
using maco_test::Comm;
using maco_test::NRanks;
using maco_test::Rank;

/* ------------------------------------------------------------------ host arithmetic */

float Bf16ToFloat(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as __float2bfloat16_rn for finite values. */
uint16_t FloatToBf16(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The "expert": an elementwise function of the row, exact in float, rounded once. */
uint16_t ExpertFn(uint16_t x, int expert)
{
    const float scale = 0.5f + (float)(expert % 7) * 0.125f;
    const float shift = (float)(expert % 5) * 0.25f - 0.5f;
    return FloatToBf16(Bf16ToFloat(x) * scale + shift);
}

/* A row as maco_ep_dispatch_fp8 leaves it in recv_x (maco/ep.h): per 128 elements the
 * block's amax (at least MACO_EP_FP8_MIN_AMAX), e4m3 values of x * (448 / amax) with
 * saturation, then the float32 scales amax / 448; the rest of the 2 x hidden bytes keep
 * `poison`. The same float32 operations as the kernel, so the bytes match exactly. */
std::vector<uint8_t> QuantRow(const uint16_t *x, int hidden, uint8_t poison)
{
    std::vector<uint8_t> row((size_t)hidden * 2, poison);
    for (int b = 0; b < hidden / MACO_EP_FP8_BLOCK; b++) {
        float amax = 0.0f;
        for (int j = 0; j < MACO_EP_FP8_BLOCK; j++)
            amax = std::fmax(amax, std::fabs(Bf16ToFloat(x[b * MACO_EP_FP8_BLOCK + j])));
        amax = std::fmax(amax, MACO_EP_FP8_MIN_AMAX);
        const float inv = MACO_EP_FP8_MAX / amax, scale = amax / MACO_EP_FP8_MAX;
        for (int j = 0; j < MACO_EP_FP8_BLOCK; j++)
            row[(size_t)b * MACO_EP_FP8_BLOCK + j] = (uint8_t)__nv_cvt_float_to_fp8(
                Bf16ToFloat(x[b * MACO_EP_FP8_BLOCK + j]) * inv, __NV_SATFINITE, __NV_E4M3);
        std::memcpy(&row[(size_t)hidden + 4 * (size_t)b], &scale, 4);
    }
    return row;
}

constexpr uint16_t kPoison16 = 0xffff; /* a NaN pattern no kernel result has */
constexpr uint32_t kPoison32 = 0xffffffffu;

/* ------------------------------------------------------------------ inputs */

enum Pattern { kUniform, kHotExpert, kEmptyRank, kSameRank, kSparse, kNoTokens };

const char *PatternName(Pattern p)
{
    static const char *names[] = { "uniform",
                                   "hot expert",
                                   "a rank receives nothing",
                                   "every expert of a token on one rank",
                                   "-1 entries",
                                   "ranks without tokens" };
    return names[p];
}

struct Shape {
    maco_ep_mode_t mode;
    int max_tokens, hidden, experts, topk;
    int64_t max_recv;
    int ctas = 0; /* config.num_ctas (0: the default) */
};

struct RankInput {
    int T = 0;
    std::vector<uint16_t> x;  /* [T][hidden] */
    std::vector<int64_t> idx; /* [T][topk] */
    std::vector<float> w;     /* [T][topk] */
};

/* Rank r's inputs for a case, the same on every rank that draws them. */
RankInput MakeInput(const Shape &s, int n, int r, Pattern p, uint64_t seed)
{
    std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(r + 1)) ^ ((uint64_t)p << 56));
    const int E = s.experts, K = s.topk, L = E / n;
    RankInput in;
    in.T = p == kNoTokens && r % 2 == 1 ? 0 : s.max_tokens - (r % 3);
    if (in.T < 0)
        in.T = 0;
    in.x.resize((size_t)in.T * s.hidden);
    std::uniform_real_distribution<float> xs(-2.0f, 2.0f), ws(0.0f, 1.0f);
    for (auto &v : in.x)
        v = FloatToBf16(xs(rng));
    in.idx.assign((size_t)in.T * K, -1);
    in.w.resize((size_t)in.T * K);
    for (auto &v : in.w)
        v = ws(rng);
    std::vector<int> pool;
    for (int t = 0; t < in.T; t++) {
        pool.clear();
        if (p == kEmptyRank && n > 1) {
            for (int e = 0; e < E - L; e++) /* rank n-1's experts are never named */
                pool.push_back(e);
        } else if (p == kSameRank) {
            int owner = (int)(rng() % (uint64_t)n);
            for (int l = 0; l < L; l++)
                pool.push_back(owner * L + l);
        } else {
            for (int e = 0; e < E; e++)
                pool.push_back(e);
        }
        std::shuffle(pool.begin(), pool.end(), rng);
        int64_t *row = &in.idx[(size_t)t * K];
        for (int k = 0; k < K && k < (int)pool.size(); k++)
            row[k] = pool[k];
        if (p == kHotExpert) {
            const int hot = n > 1 ? L : 0; /* rank 1's first expert (rank 0's on one rank) */
            bool has = false;
            for (int k = 0; k < K; k++)
                has = has || row[k] == hot;
            if (!has)
                row[rng() % (uint64_t)K] = hot; /* distinct: hot was not in the row */
        }
        if (p == kSparse) {
            for (int k = 0; k < K; k++)
                if (t % 5 == 0 || rng() % 3 == 0)
                    row[k] = -1;
        }
    }
    return in;
}

/* ------------------------------------------------------------------ the fixture */

#define CUDA_CHECK(call) ASSERT_EQ((call), cudaSuccess) << #call

class EpGpu : public maco_test::GpuCase
{
  protected:
    void TearDown() override
    {
        Release();
        maco_test::GpuCase::TearDown();
    }

    void Release()
    {
        if (buf_ != nullptr) {
            EXPECT_EQ(maco_ep_buffer_destroy(buf_), MACO_OK);
        }
        buf_ = nullptr;
        for (void *p : { (void *)d_x_, (void *)d_idx_, (void *)d_w_, (void *)d_counts_,
                         (void *)d_offsets_, (void *)d_rw_, d_handle_, d_out_, d_y_ })
            cudaFree(p);
        d_x_ = nullptr;
        d_idx_ = nullptr;
        d_w_ = nullptr;
        d_counts_ = d_offsets_ = nullptr;
        d_rw_ = nullptr;
        d_handle_ = d_out_ = d_y_ = nullptr;
    }

    /* A buffer of `s` on every rank and device memory for one call's inputs and outputs. */
    void Make(const Shape &s)
    {
        Release();
        shape_ = s;
        maco_ep_config_t c;
        std::memset(&c, 0, sizeof(c));
        c.mode = s.mode;
        c.max_tokens_per_rank = s.max_tokens;
        c.hidden = s.hidden;
        c.num_experts = s.experts;
        c.topk = s.topk;
        c.dtype = MACO_BFLOAT16;
        c.max_recv_tokens = s.max_recv;
        c.num_ctas = s.ctas;
        ASSERT_EQ(maco_ep_buffer_create(Comm(), &c, &buf_), MACO_OK) << maco_log_last_error();
        ASSERT_EQ(maco_ep_buffer_get_info(buf_, &info_), MACO_OK);
        ASSERT_EQ(maco__ep_plan(&c, NRanks(), &geom_, nullptr, nullptr, 0), MACO_OK);
        const size_t T = (size_t)s.max_tokens, K = (size_t)s.topk, H = (size_t)s.hidden;
        const size_t L = (size_t)info_.local_experts, R = (size_t)info_.recv_rows;
        CUDA_CHECK(cudaMalloc(&d_x_, T * H * 2 + 16));
        CUDA_CHECK(cudaMalloc(&d_idx_, T * K * 8 + 16));
        CUDA_CHECK(cudaMalloc(&d_w_, T * K * 4 + 16));
        CUDA_CHECK(cudaMalloc(&d_counts_, L * 4));
        CUDA_CHECK(cudaMalloc(&d_offsets_, (L + 1) * 4));
        CUDA_CHECK(cudaMalloc(&d_rw_, R * 4));
        CUDA_CHECK(cudaMalloc(&d_handle_, info_.handle_bytes));
        CUDA_CHECK(cudaMalloc(&d_out_, R * H * 2));
        CUDA_CHECK(cudaMalloc(&d_y_, (T + 1) * H * 2)); /* one guard row */
    }

    /* Every rank's inputs of a case. */
    std::vector<RankInput> Inputs(Pattern p, uint64_t seed)
    {
        std::vector<RankInput> all;
        for (int r = 0; r < NRanks(); r++)
            all.push_back(MakeInput(shape_, NRanks(), r, p, seed));
        return all;
    }

    /* On the test's stream (a pageable cudaMemcpy may still be in flight on the legacy stream
     * when it returns, which the non-blocking stream does not wait for). `in` must live until
     * the stream is synchronised. */
    void Upload(const RankInput &in)
    {
        CUDA_CHECK(
            cudaMemcpyAsync(d_x_, in.x.data(), in.x.size() * 2, cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaMemcpyAsync(d_idx_, in.idx.data(), in.idx.size() * 8, cudaMemcpyHostToDevice,
                                   stream_));
        CUDA_CHECK(
            cudaMemcpyAsync(d_w_, in.w.data(), in.w.size() * 4, cudaMemcpyHostToDevice, stream_));
    }

    /* Poisons every output of dispatch (the receive region included) and of combine. */
    void Poison()
    {
        const size_t R = (size_t)info_.recv_rows, H = (size_t)shape_.hidden;
        CUDA_CHECK(cudaMemsetAsync(info_.recv_x, 0xff, R * H * 2, stream_));
        CUDA_CHECK(cudaMemsetAsync(d_counts_, 0xff, (size_t)info_.local_experts * 4, stream_));
        CUDA_CHECK(
            cudaMemsetAsync(d_offsets_, 0xff, ((size_t)info_.local_experts + 1) * 4, stream_));
        CUDA_CHECK(cudaMemsetAsync(d_rw_, 0xff, R * 4, stream_));
        CUDA_CHECK(cudaMemsetAsync(d_y_, 0xff, ((size_t)shape_.max_tokens + 1) * H * 2, stream_));
    }

    maco_status_t Dispatch(const RankInput &in, int64_t *num_recv_p, const int64_t *idx = nullptr)
    {
        return (fp8_ ? maco_ep_dispatch_fp8 : maco_ep_dispatch)(
            buf_, d_x_, MACO_BFLOAT16, in.T, shape_.hidden, idx != nullptr ? idx : d_idx_, d_w_,
            shape_.topk, d_counts_, d_offsets_, d_rw_, d_handle_, num_recv_p,
            reinterpret_cast<maco_stream_t>(stream_));
    }

    maco_status_t Combine(int num_tokens, const void *expert_out = nullptr)
    {
        return maco_ep_combine(buf_, expert_out != nullptr ? expert_out : d_out_, MACO_BFLOAT16,
                               shape_.hidden, d_handle_, d_w_, num_tokens, shape_.topk, d_y_,
                               reinterpret_cast<maco_stream_t>(stream_));
    }

    /* What this rank must receive: the count matrix, its layout, and per received row where
     * it came from (-1: no row there). */
    struct Expect {
        std::vector<int32_t> counts;             /* [n][E] */
        std::vector<std::vector<int32_t>> slots; /* per rank [T][K] */
        std::vector<int64_t> base, total;        /* [L] */
        int64_t num_recv = 0;
        std::vector<int> src, entry; /* [recv_rows] */
    };

    void Reference(const std::vector<RankInput> &all, Expect *x)
    {
        const int n = NRanks(), E = shape_.experts, K = shape_.topk, L = E / n, me = Rank();
        x->counts.assign((size_t)n * E, 0);
        x->slots.assign(n, {});
        for (int r = 0; r < n; r++) {
            x->slots[r].assign(all[r].idx.size(), -1);
            maco__ep_bad_t bad;
            ASSERT_EQ(maco__ep_route(all[r].idx.data(), all[r].T, K, E, x->slots[r].data(),
                                     &x->counts[(size_t)r * E], &bad),
                      0);
        }
        x->base.assign(L, 0);
        x->total.assign(L, 0);
        maco__ep_recv_layout(&geom_, x->counts.data(), me, x->base.data(), x->total.data(),
                             &x->num_recv);
        x->src.assign((size_t)info_.recv_rows, -1);
        x->entry.assign((size_t)info_.recv_rows, -1);
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < all[r].idx.size(); i++) {
                const int64_t e = all[r].idx[i];
                if (e < 0 || e / L != me || x->slots[r][i] < 0)
                    continue;
                const int64_t row =
                    maco__ep_recv_row(&geom_, x->counts.data(), r, (int)e, x->slots[r][i]);
                ASSERT_GE(row, 0);
                ASSERT_LT(row, info_.recv_rows);
                ASSERT_EQ(x->src[(size_t)row], -1) << "two entries for row " << row;
                x->src[(size_t)row] = r;
                x->entry[(size_t)row] = (int)i;
            }
    }

    /* Compares the dispatch's outputs with the reference; the first wrong value says where
     * it should have come from. Returns the receive region as read (for the run-to-run
     * comparison). */
    void CheckDispatch(const std::vector<RankInput> &all, const Expect &x, int64_t num_recv,
                       std::vector<uint16_t> *recv_out, std::vector<float> *rw_out)
    {
        const int L = info_.local_experts, H = shape_.hidden, K = shape_.topk, me = Rank();
        const size_t R = (size_t)info_.recv_rows;
        std::vector<int32_t> counts(L), offsets(L + 1);
        std::vector<uint16_t> recv(R * H);
        std::vector<float> rw(R);
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        maco_status_t async_st = MACO_OK;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
        ASSERT_EQ(async_st, MACO_OK) << maco_comm_get_last_error(Comm());
        CUDA_CHECK(cudaMemcpy(counts.data(), d_counts_, L * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(offsets.data(), d_offsets_, (L + 1) * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(recv.data(), info_.recv_x, R * H * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(rw.data(), d_rw_, R * 4, cudaMemcpyDeviceToHost));
        if (num_recv >= 0) {
            EXPECT_EQ(num_recv, x.num_recv) << "rank " << me << ": num_recv";
        }
        for (int l = 0; l < L; l++) {
            EXPECT_EQ(counts[l], x.total[l]) << "rank " << me << ": recv_counts[" << l << "]";
            EXPECT_EQ(offsets[l], x.base[l]) << "rank " << me << ": recv_offsets[" << l << "]";
        }
        const int64_t end =
            shape_.mode == MACO_EP_LOW_LATENCY ? (int64_t)L * info_.expert_capacity : x.num_recv;
        EXPECT_EQ(offsets[L], end) << "rank " << me << ": recv_offsets[L]";
        size_t wrong = 0;
        std::string first;
        for (size_t row = 0; row < R; row++) {
            const int s = x.src[row];
            const uint16_t *got = &recv[row * H];
            uint32_t wbits;
            std::memcpy(&wbits, &rw[row], 4);
            if (s < 0) { /* no row here: untouched */
                for (int h = 0; h < H; h++)
                    if (got[h] != kPoison16) {
                        if (wrong++ == 0)
                            first = "recv_x row " + std::to_string(row) + " should be untouched " +
                                    "(poison), element " + std::to_string(h) + " is " +
                                    std::to_string(got[h]);
                        break;
                    }
                if (wbits != kPoison32 && wrong++ == 0)
                    first = "recv_topk_weights[" + std::to_string(row) + "] should be untouched";
                continue;
            }
            const int i = x.entry[row], t = i / K, k = i % K;
            const uint16_t *want = &all[s].x[(size_t)t * H];
            if (fp8_) { /* the quantized row; the first wrong byte is reported */
                const std::vector<uint8_t> q = QuantRow(want, H, 0xff);
                const uint8_t *gb = reinterpret_cast<const uint8_t *>(got);
                for (size_t b = 0; b < q.size(); b++)
                    if (gb[b] != q[b]) {
                        if (wrong++ == 0) {
                            char text[300];
                            std::snprintf(text, sizeof(text),
                                          "recv_x row %zu (rank %d's token %d, k %d): fp8 byte "
                                          "%zu (%s): expected 0x%02x, got 0x%02x",
                                          row, s, t, k, b,
                                          b < (size_t)H             ? "value"
                                          : b < (size_t)H + H / 32u ? "scale"
                                                                    : "past the scales",
                                          q[b], gb[b]);
                            first = text;
                        }
                        break;
                    }
            }
            for (int h = 0; h < H && !fp8_; h++)
                if (got[h] != want[h]) {
                    if (wrong++ == 0) {
                        char text[300];
                        std::snprintf(text, sizeof(text),
                                      "recv_x row %zu (rank %d's token %d, k %d, expert %lld): "
                                      "element %d: expected 0x%04x, got 0x%04x",
                                      row, s, t, k, (long long)all[s].idx[(size_t)i], h, want[h],
                                      got[h]);
                        first = text;
                    }
                    break;
                }
            uint32_t want_w;
            std::memcpy(&want_w, &all[s].w[(size_t)i], 4);
            if (wbits != want_w && wrong++ == 0)
                first = "recv_topk_weights[" + std::to_string(row) + "] (rank " +
                        std::to_string(s) + "'s entry " + std::to_string(i) + ") differs";
        }
        EXPECT_EQ(wrong, 0u) << "rank " << me << ": " << wrong << " wrong rows; first: " << first;
        if (recv_out != nullptr)
            recv_out->swap(recv);
        if (rw_out != nullptr)
            rw_out->swap(rw);
    }

    /* The experts' outputs in the receive layout (poison where no row is), uploaded to
     * `dst` (d_out_ or the receive region itself). */
    void MakeExpertOut(const std::vector<RankInput> &all, const Expect &x, void *dst)
    {
        const int H = shape_.hidden;
        const size_t R = (size_t)info_.recv_rows;
        std::vector<uint16_t> out(R * H, kPoison16);
        for (size_t row = 0; row < R; row++) {
            const int s = x.src[row];
            if (s < 0)
                continue;
            const int i = x.entry[row], t = i / shape_.topk;
            const int e = (int)all[s].idx[(size_t)i];
            for (int h = 0; h < H; h++)
                out[row * H + h] = ExpertFn(all[s].x[(size_t)t * H + h], e);
        }
        CUDA_CHECK(cudaMemcpyAsync(dst, out.data(), R * H * 2, cudaMemcpyHostToDevice, stream_));
    }

    /* This rank's y against the host's sum; returns y as read. */
    void CheckCombine(const std::vector<RankInput> &all, const Expect &x,
                      std::vector<uint16_t> *y_out)
    {
        const int H = shape_.hidden, K = shape_.topk, me = Rank();
        const RankInput &in = all[me];
        std::vector<uint16_t> y(((size_t)shape_.max_tokens + 1) * H);
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        maco_status_t async_st = MACO_OK;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
        ASSERT_EQ(async_st, MACO_OK) << maco_comm_get_last_error(Comm());
        CUDA_CHECK(cudaMemcpy(y.data(), d_y_, y.size() * 2, cudaMemcpyDeviceToHost));
        size_t wrong = 0;
        std::string first;
        for (int t = 0; t < in.T; t++)
            for (int h = 0; h < H; h++) {
                float acc = 0.0f;
                std::string terms;
                for (int k = 0; k < K; k++) {
                    const size_t i = (size_t)t * K + k;
                    if (x.slots[me][i] < 0)
                        continue;
                    const int e = (int)in.idx[i];
                    acc =
                        std::fmaf(in.w[i], Bf16ToFloat(ExpertFn(in.x[(size_t)t * H + h], e)), acc);
                    terms += " k" + std::to_string(k) + ":e" + std::to_string(e);
                }
                const uint16_t want = FloatToBf16(acc), got = y[(size_t)t * H + h];
                if (got != want && wrong++ == 0) {
                    char text[400];
                    std::snprintf(text, sizeof(text),
                                  "y[%d][%d]: expected 0x%04x (%g), got 0x%04x (%g); entries%s", t,
                                  h, want, (double)Bf16ToFloat(want), got, (double)Bf16ToFloat(got),
                                  terms.empty() ? " none" : terms.c_str());
                    first = text;
                }
            }
        for (size_t j = (size_t)in.T * H; j < y.size(); j++)
            if (y[j] != kPoison16 && wrong++ == 0)
                first = "y element " + std::to_string(j) + " past num_tokens rows was written";
        EXPECT_EQ(wrong, 0u) << "rank " << me << ": " << wrong << " wrong values; first: " << first;
        if (y_out != nullptr)
            y_out->swap(y);
    }

    /* One case: dispatch, check, experts, combine, check; twice, and the runs agree. */
    void RunCase(Pattern p, bool wait_count, bool in_place = false)
    {
        SCOPED_TRACE(std::string("pattern: ") + PatternName(p) +
                     (wait_count ? ", num_recv_p" : "") +
                     (in_place ? ", expert outputs in recv_x" : ""));
        const uint64_t seed = seed_ ^ ((uint64_t)p * 0x51ED270B27A1ull);
        std::vector<RankInput> all = Inputs(p, seed);
        Expect x;
        ASSERT_NO_FATAL_FAILURE(Reference(all, &x));
        ASSERT_NO_FATAL_FAILURE(Upload(all[Rank()]));
        std::vector<uint16_t> recv[2], y[2];
        std::vector<float> rw[2];
        for (int run = 0; run < 2; run++) {
            ASSERT_NO_FATAL_FAILURE(Poison());
            int64_t num_recv = -1;
            ASSERT_EQ(Dispatch(all[Rank()], wait_count ? &num_recv : nullptr), MACO_OK)
                << maco_log_last_error();
            ASSERT_NO_FATAL_FAILURE(
                CheckDispatch(all, x, wait_count ? num_recv : -1, &recv[run], &rw[run]));
            void *out = in_place ? info_.recv_x : d_out_;
            ASSERT_NO_FATAL_FAILURE(MakeExpertOut(all, x, out));
            ASSERT_EQ(Combine(all[Rank()].T, out), MACO_OK) << maco_log_last_error();
            ASSERT_NO_FATAL_FAILURE(CheckCombine(all, x, &y[run]));
        }
        EXPECT_TRUE(recv[0] == recv[1]) << "rank " << Rank() << ": recv_x differs between runs";
        EXPECT_TRUE(std::memcmp(rw[0].data(), rw[1].data(), rw[0].size() * 4) == 0)
            << "rank " << Rank() << ": recv_topk_weights differ between runs";
        EXPECT_TRUE(y[0] == y[1]) << "rank " << Rank() << ": y differs between runs";
        EXPECT_EQ(maco_ep_buffer_check(buf_), MACO_OK);
    }

    Shape shape_{};
    bool fp8_ = false; /* Dispatch() calls maco_ep_dispatch_fp8 */
    maco_ep_buffer_t buf_ = nullptr;
    maco_ep_info_t info_{};
    maco__ep_geom_t geom_{};
    uint16_t *d_x_ = nullptr;
    int64_t *d_idx_ = nullptr;
    float *d_w_ = nullptr, *d_rw_ = nullptr;
    int32_t *d_counts_ = nullptr, *d_offsets_ = nullptr;
    void *d_handle_ = nullptr, *d_out_ = nullptr, *d_y_ = nullptr;
};

const Pattern kPatterns[] = { kUniform, kHotExpert, kEmptyRank, kSameRank, kSparse, kNoTokens };

/* ------------------------------------------------------------------ correct results */

TEST_F(EpGpu, LowLatencyRoutings)
{
    const int n = NRanks();
    /* Rows of 264 elements (33 16-byte words: the copy's tail) and of 7168 (the issue's). */
    for (int hidden : { 264, 7168 }) {
        ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 40, hidden, 8 * n, 8, 0 }));
        for (Pattern p : kPatterns)
            ASSERT_NO_FATAL_FAILURE(RunCase(p, false));
    }
    /* Top-1 and top-k with k > 32 / 2 over few experts. */
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 33, 64, 2 * n, 1, 0 }));
    ASSERT_NO_FATAL_FAILURE(RunCase(kUniform, false));
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 70, 64, 24 * n, std::min(20, 24 * n), 0 }));
    ASSERT_NO_FATAL_FAILURE(RunCase(kUniform, false));
    ASSERT_NO_FATAL_FAILURE(RunCase(kSparse, false));
}

TEST_F(EpGpu, NormalRoutings)
{
    const int n = NRanks();
    for (int hidden : { 264, 2048 }) {
        ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_NORMAL, 300, hidden, 8 * n, 6, 0 }));
        for (Pattern p : kPatterns)
            ASSERT_NO_FATAL_FAILURE(RunCase(p, true));
        ASSERT_NO_FATAL_FAILURE(RunCase(kUniform, false)); /* no host wait */
    }
}

/* The combine in more than one token group of 128 (its sender and summer warps pipelined):
 * low latency with 200 tokens (2 groups), and one CTA in normal mode whose share of the rows
 * received (about 700 x 8 per rank) is more than it sorts by group (MACO__EP_SORT_ROWS), so it
 * copies them unsorted before signalling the 6 groups. */
TEST_F(EpGpu, CombineByTokenGroups)
{
    const int n = NRanks();
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 200, 64, 4 * n, 4, 0 }));
    for (Pattern p : { kUniform, kHotExpert, kNoTokens })
        ASSERT_NO_FATAL_FAILURE(RunCase(p, false));
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_NORMAL, 700, 64, 8 * n, 8, 0, 1 }));
    ASSERT_EQ(info_.num_ctas, 1);
    for (Pattern p : { kUniform, kNoTokens })
        ASSERT_NO_FATAL_FAILURE(RunCase(p, true));
}

/* maco_ep_dispatch_fp8 in both modes: every received row's e4m3 values and scales equal the
 * host's quantization byte for byte, the rest of the row untouched; combine as before
 * (expert outputs in bfloat16, also written over the fp8 rows in place). */
TEST_F(EpGpu, Fp8DispatchRoutings)
{
    const int n = NRanks();
    fp8_ = true;
    for (int hidden : { 128, 7168 }) {
        ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 40, hidden, 8 * n, 8, 0 }));
        for (Pattern p : kPatterns)
            ASSERT_NO_FATAL_FAILURE(RunCase(p, false));
    }
    ASSERT_NO_FATAL_FAILURE(RunCase(kUniform, false, true));
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_NORMAL, 300, 384, 8 * n, 6, 0 }));
    for (Pattern p : { kUniform, kHotExpert, kSparse, kNoTokens })
        ASSERT_NO_FATAL_FAILURE(RunCase(p, true));
    ASSERT_NO_FATAL_FAILURE(RunCase(kSameRank, false, true));
    /* A hidden that is not a multiple of 128 is refused by the host check, before anything
     * is enqueued, with the argument and the limit named. */
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 8, 200, 2 * n, 2, 0 }));
    const std::vector<RankInput> all = Inputs(kUniform, seed_);
    ASSERT_NO_FATAL_FAILURE(Upload(all[Rank()]));
    AllowLog("hidden 200 is not a multiple of 128");
    EXPECT_EQ(Dispatch(all[Rank()], nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("maco_ep_dispatch_fp8: hidden 200"),
              std::string::npos)
        << maco_log_last_error();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

TEST_F(EpGpu, ExpertOutputsWrittenIntoRecvX)
{
    const int n = NRanks();
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 32, 512, 4 * n, 4, 0 }));
    ASSERT_NO_FATAL_FAILURE(RunCase(kUniform, false, true));
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_NORMAL, 64, 512, 4 * n, 4, 0 }));
    ASSERT_NO_FATAL_FAILURE(RunCase(kHotExpert, true, true));
}

/* Dispatch and combine captured in one graph, replayed with new inputs each time: the
 * sequence numbers live on the device. */
TEST_F(EpGpu, LowLatencyGraphReplays)
{
    const int n = NRanks();
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 48, 1024, 8 * n, 8, 0 }));
    /* The graph holds each rank's num_tokens: these patterns give every rank the same T
     * whatever the seed (MakeInput), so each replay's new inputs fit it. */
    const Pattern patterns[] = { kUniform, kHotExpert, kSparse, kSameRank };
    auto inputs = [&](int i, uint64_t seed) { return Inputs(patterns[i % 4], seed); };
    std::vector<RankInput> first = inputs(0, seed_);
    Expect x;
    ASSERT_NO_FATAL_FAILURE(Reference(first, &x));
    ASSERT_NO_FATAL_FAILURE(Upload(first[Rank()]));
    ASSERT_NO_FATAL_FAILURE(MakeExpertOut(first, x, d_out_)); /* any values: graph capture */
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    maco_status_t st1 = Dispatch(first[Rank()], nullptr);
    maco_status_t st2 = Combine(first[Rank()].T);
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    ASSERT_EQ(st1, MACO_OK) << maco_log_last_error();
    ASSERT_EQ(st2, MACO_OK) << maco_log_last_error();
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; replay++) {
        SCOPED_TRACE("replay " + std::to_string(replay));
        std::vector<RankInput> all = inputs(replay + 1, seed_ + 1000u * (uint64_t)(replay + 1));
        Expect xr;
        ASSERT_NO_FATAL_FAILURE(Reference(all, &xr));
        ASSERT_NO_FATAL_FAILURE(Upload(all[Rank()]));
        ASSERT_NO_FATAL_FAILURE(Poison());
        /* The expert outputs must be there before the combine: replay the dispatch half by
         * running the whole graph once, then check the combine on a second replay with the
         * experts' outputs of these inputs uploaded in between. */
        CUDA_CHECK(cudaGraphLaunch(exec, stream_));
        ASSERT_NO_FATAL_FAILURE(CheckDispatch(all, xr, -1, nullptr, nullptr));
        ASSERT_NO_FATAL_FAILURE(MakeExpertOut(all, xr, d_out_));
        CUDA_CHECK(cudaMemsetAsync(d_y_, 0xff, ((size_t)shape_.max_tokens + 1) * shape_.hidden * 2,
                                   stream_));
        CUDA_CHECK(cudaGraphLaunch(exec, stream_));
        ASSERT_NO_FATAL_FAILURE(CheckCombine(all, xr, nullptr));
    }
    EXPECT_EQ(maco_ep_buffer_check(buf_), MACO_OK);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

/* ------------------------------------------------------------------ bad input */

/* Host-side refusals: every rank makes the same bad call, nothing is enqueued or written. */
TEST_F(EpGpu, BadArgumentsWriteNothing)
{
    AllowLog("maco_ep_dispatch:");
    AllowLog("maco_ep_combine:");
    const int n = NRanks();
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 16, 256, 4 * n, 2, 0 }));
    std::vector<RankInput> all = Inputs(kUniform, seed_);
    ASSERT_NO_FATAL_FAILURE(Upload(all[Rank()]));
    ASSERT_NO_FATAL_FAILURE(Poison());
    CUDA_CHECK(cudaMemsetAsync(d_handle_, 0xab, info_.handle_bytes, stream_));
    maco_stream_t s = reinterpret_cast<maco_stream_t>(stream_);
    const int T = all[Rank()].T;
    auto expect_refused = [&](maco_status_t st, const char *what) {
        EXPECT_EQ(st, MACO_ERR_INVALID_ARGUMENT) << what;
        EXPECT_NE(std::string(maco_log_last_error()).find(what), std::string::npos)
            << maco_log_last_error();
    };
    expect_refused(maco_ep_dispatch(buf_, d_x_, MACO_FLOAT16, T, 256, d_idx_, d_w_, 2, d_counts_,
                                    nullptr, nullptr, d_handle_, nullptr, s),
                   "x_dtype is float16");
    expect_refused(maco_ep_dispatch(buf_, d_x_, MACO_BFLOAT16, T, 128, d_idx_, d_w_, 2, d_counts_,
                                    nullptr, nullptr, d_handle_, nullptr, s),
                   "hidden 128 differs from the buffer's 256");
    expect_refused(maco_ep_dispatch(buf_, d_x_, MACO_BFLOAT16, 17, 256, d_idx_, d_w_, 2, d_counts_,
                                    nullptr, nullptr, d_handle_, nullptr, s),
                   "num_tokens 17 is outside [0, 16]");
    expect_refused(maco_ep_dispatch(buf_, d_x_, MACO_BFLOAT16, T, 256, d_idx_, d_w_, 3, d_counts_,
                                    nullptr, nullptr, d_handle_, nullptr, s),
                   "topk 3 differs");
    expect_refused(maco_ep_dispatch(buf_, nullptr, MACO_BFLOAT16, T, 256, d_idx_, d_w_, 2,
                                    d_counts_, nullptr, nullptr, d_handle_, nullptr, s),
                   "x is NULL");
    expect_refused(maco_ep_dispatch(buf_, d_x_, MACO_BFLOAT16, T, 256, d_idx_, d_w_, 2, nullptr,
                                    nullptr, nullptr, d_handle_, nullptr, s),
                   "recv_counts is NULL");
    expect_refused(maco_ep_dispatch(buf_, (char *)d_x_ + 2, MACO_BFLOAT16, T, 256, d_idx_, d_w_, 2,
                                    d_counts_, nullptr, nullptr, d_handle_, nullptr, s),
                   "is not 16-byte aligned");
    int64_t num_recv = 12345;
    expect_refused(maco_ep_dispatch(buf_, d_x_, MACO_BFLOAT16, T, 256, d_idx_, d_w_, 2, d_counts_,
                                    nullptr, nullptr, d_handle_, &num_recv, s),
                   "num_recv_p must be NULL in low latency mode");
    EXPECT_EQ(num_recv, 12345);
    expect_refused(
        maco_ep_combine(buf_, d_out_, MACO_BFLOAT16, 256, d_handle_, d_w_, T, 2, nullptr, s),
        "y is NULL");
    expect_refused(maco_ep_combine(buf_, d_out_, MACO_FLOAT32, 256, d_handle_, d_w_, T, 2, d_y_, s),
                   "dtype is float32");
    /* Nothing ran: every output still holds its poison. */
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<uint8_t> handle(info_.handle_bytes), recv((size_t)info_.recv_rows * 512);
    std::vector<uint8_t> y(((size_t)shape_.max_tokens + 1) * 512);
    CUDA_CHECK(cudaMemcpy(handle.data(), d_handle_, handle.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(recv.data(), info_.recv_x, recv.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(y.data(), d_y_, y.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(handle.begin(), handle.end(), [](uint8_t b) { return b == 0xab; }));
    EXPECT_TRUE(std::all_of(recv.begin(), recv.end(), [](uint8_t b) { return b == 0xff; }));
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](uint8_t b) { return b == 0xff; }));
    /* The buffer still works. */
    ASSERT_NO_FATAL_FAILURE(RunCase(kUniform, false));
}

/* Problems only the device can see: the last rank's inputs carry them; every rank's launch
 * stops before moving a row, outputs keep their poison, the error names the rank, the entry,
 * the value and the limit, and the buffer works afterwards. */
TEST_F(EpGpu, DeviceFoundInputErrorsStopEveryRank)
{
    AllowLog("maco_ep_dispatch: rank");
    AllowLog("maco_ep_combine: rank");
    const int n = NRanks(), bad_rank = n - 1;
    struct Bad {
        maco_ep_mode_t mode;
        int token, k;
        int64_t value; /* -2: repeat column 0 */
        const char *text;
    };
    const Bad cases[] = {
        { MACO_EP_LOW_LATENCY, 5, 1, 8 * n, "is outside [-1, " },
        { MACO_EP_LOW_LATENCY, 0, 0, -2, "is outside [-1, " },
        { MACO_EP_LOW_LATENCY, 3, 2, -3 /* repeat */, "repeats topk_idx[3][0]" },
        { MACO_EP_NORMAL, 7, 3, 1LL << 40, "is outside [-1, " },
        { MACO_EP_NORMAL, 9, 1, -3 /* repeat */, "repeats topk_idx[9][0]" },
    };
    for (const Bad &b : cases) {
        SCOPED_TRACE(std::string(b.mode == MACO_EP_NORMAL ? "normal: " : "low latency: ") + b.text);
        ASSERT_NO_FATAL_FAILURE(Make({ b.mode, 16, 128, 8 * n, 4, 0 }));
        std::vector<RankInput> all = Inputs(kUniform, seed_ ^ (uint64_t)b.token);
        RankInput mine = all[Rank()];
        int64_t *row = &mine.idx[(size_t)b.token * 4];
        /* The repeated value is the bad rank's column 0 (each rank's inputs differ). */
        const int64_t value = b.value == -3 ? all[bad_rank].idx[(size_t)b.token * 4] : b.value;
        if (Rank() == bad_rank)
            row[b.k] = value;
        ASSERT_NO_FATAL_FAILURE(Upload(mine));
        ASSERT_NO_FATAL_FAILURE(Poison());
        CUDA_CHECK(cudaMemsetAsync(d_out_, 0, (size_t)info_.recv_rows * 256, stream_));
        int64_t num_recv = 777;
        maco_status_t st = Dispatch(mine, b.mode == MACO_EP_NORMAL ? &num_recv : nullptr);
        char want[200];
        std::snprintf(want, sizeof(want), "rank %d: topk_idx[%d][%d] = %lld ", bad_rank, b.token,
                      b.k, (long long)value);
        if (b.mode == MACO_EP_NORMAL) {
            EXPECT_EQ(st, MACO_ERR_INVALID_ARGUMENT);
            EXPECT_EQ(num_recv, 777);
        } else {
            EXPECT_EQ(st, MACO_OK);
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            EXPECT_EQ(maco_ep_buffer_check(buf_), MACO_ERR_INVALID_ARGUMENT);
        }
        std::string why = maco_log_last_error();
        EXPECT_NE(why.find(want), std::string::npos) << why;
        EXPECT_NE(why.find(b.text), std::string::npos) << why;
        EXPECT_EQ(maco_ep_buffer_check(buf_), MACO_OK) << "reported once";
        /* A combine on the failed dispatch's handle stops too; y keeps its poison. */
        EXPECT_EQ(Combine(mine.T), MACO_OK);
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        EXPECT_EQ(maco_ep_buffer_check(buf_), MACO_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(maco_log_last_error()).find("handle is of a dispatch that failed"),
                  std::string::npos)
            << maco_log_last_error();
        maco_status_t async_st = MACO_OK;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
        ASSERT_EQ(async_st, MACO_OK) << maco_comm_get_last_error(Comm());
        const size_t R = (size_t)info_.recv_rows;
        std::vector<uint8_t> recv(R * 256), y(17 * 256);
        std::vector<int32_t> counts(info_.local_experts);
        CUDA_CHECK(cudaMemcpy(recv.data(), info_.recv_x, recv.size(), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(y.data(), d_y_, y.size(), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(counts.data(), d_counts_, counts.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_TRUE(std::all_of(recv.begin(), recv.end(), [](uint8_t v) { return v == 0xff; }))
            << "recv_x was written";
        EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](uint8_t v) { return v == 0xff; }))
            << "y was written";
        EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int32_t v) { return v == -1; }))
            << "recv_counts was written";
        /* The buffer works afterwards. */
        ASSERT_NO_FATAL_FAILURE(RunCase(kUniform, b.mode == MACO_EP_NORMAL));
    }
}

/* Normal mode: a receive region too small for what one rank gets stops every rank. */
TEST_F(EpGpu, NormalModeOverflowStopsEveryRank)
{
    AllowLog("maco_ep_dispatch: rank");
    const int n = NRanks();
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_NORMAL, 32, 64, 4 * n, 4, 40 }));
    /* Every token's experts on one rank: some rank gets far more than 40 rows. */
    std::vector<RankInput> all = Inputs(kHotExpert, seed_);
    int64_t most = 0, who = 0;
    {
        std::vector<int32_t> counts((size_t)n * shape_.experts);
        for (int r = 0; r < n; r++) {
            std::vector<int32_t> slot(all[r].idx.size());
            maco__ep_route(all[r].idx.data(), all[r].T, 4, shape_.experts, slot.data(),
                           &counts[(size_t)r * shape_.experts], nullptr);
        }
        for (int dst = 0; dst < n; dst++) {
            int64_t rows = 0;
            for (int l = 0; l < shape_.experts / n; l++)
                for (int r = 0; r < n; r++)
                    rows += counts[(size_t)r * shape_.experts + dst * (shape_.experts / n) + l];
            if (rows > 40 && most == 0) {
                most = rows;
                who = dst;
            }
        }
    }
    ASSERT_GT(most, 40) << "the inputs should overflow 40 rows somewhere";
    ASSERT_NO_FATAL_FAILURE(Upload(all[Rank()]));
    ASSERT_NO_FATAL_FAILURE(Poison());
    int64_t num_recv = -5;
    EXPECT_EQ(Dispatch(all[Rank()], &num_recv), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(num_recv, -5);
    std::string want = "rank " + std::to_string(who) + " would receive " + std::to_string(most) +
                       " rows, more than the receive region's 40";
    EXPECT_NE(std::string(maco_log_last_error()).find(want), std::string::npos)
        << maco_log_last_error();
    std::vector<uint8_t> recv(40 * 128);
    CUDA_CHECK(cudaMemcpy(recv.data(), info_.recv_x, recv.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(recv.begin(), recv.end(), [](uint8_t v) { return v == 0xff; }));
}

/* A combine with another token count than its dispatch stops every rank (the device checks
 * the handle). */
TEST_F(EpGpu, CombineWithOtherTokenCountStops)
{
    AllowLog("maco_ep_combine: rank");
    const int n = NRanks();
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 16, 64, 4 * n, 2, 0 }));
    std::vector<RankInput> all = Inputs(kUniform, seed_);
    ASSERT_NO_FATAL_FAILURE(Upload(all[Rank()]));
    ASSERT_NO_FATAL_FAILURE(Poison());
    ASSERT_EQ(Dispatch(all[Rank()], nullptr), MACO_OK);
    const int T = all[Rank()].T;
    const int other = Rank() == 0 ? (T > 0 ? T - 1 : 1) : T;
    ASSERT_EQ(Combine(other), MACO_OK);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(maco_ep_buffer_check(buf_), MACO_ERR_INVALID_ARGUMENT);
    /* Every rank's message names rank 0 and rank 0's counts (the ranks' inputs differ). */
    const int t0 = all[0].T, other0 = t0 > 0 ? t0 - 1 : 1;
    char want[120];
    std::snprintf(want, sizeof(want),
                  "rank 0: num_tokens %d differs from the handle's dispatch (%d", other0, t0);
    EXPECT_NE(std::string(maco_log_last_error()).find(want), std::string::npos)
        << maco_log_last_error();
    std::vector<uint8_t> y(17 * 128);
    CUDA_CHECK(cudaMemcpy(y.data(), d_y_, y.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](uint8_t v) { return v == 0xff; }));
}

/* Ranks on several nodes (maco-run --simulate-nodes; ctest gpu_ep_two_nodes): refused with
 * the reason, on every rank. */
TEST_F(EpGpu, RefusedAcrossNodes)
{
    int nodes = 1;
    ASSERT_EQ(maco_comm_get_nnodes(Comm(), &nodes), MACO_OK);
    if (nodes == 1)
        GTEST_SKIP() << "one node (ctest gpu_ep_two_nodes runs this on simulated nodes)";
    AllowLog("maco_ep_buffer_create");
    maco_ep_config_t c;
    std::memset(&c, 0, sizeof(c));
    c.mode = MACO_EP_LOW_LATENCY;
    c.max_tokens_per_rank = 8;
    c.hidden = 64;
    c.num_experts = 2 * NRanks();
    c.topk = 2;
    c.dtype = MACO_BFLOAT16;
    maco_ep_buffer_t b = nullptr;
    EXPECT_EQ(maco_ep_buffer_create(Comm(), &c, &b), MACO_ERR_UNSUPPORTED);
    EXPECT_EQ(b, nullptr);
    const std::string want = "spans " + std::to_string(nodes) + " nodes";
    EXPECT_NE(std::string(maco_log_last_error()).find(want), std::string::npos)
        << maco_log_last_error();
}

/* A rank that dies before a dispatch (TEST_EP_KILL_PHASE unset or "dispatch") or between a
 * dispatch and its combine ("combine"): the others' kernels stop at MACO_DEVICE_TIMEOUT and
 * their asynchronous error names it. Runs alone (ctest gpu_ep_dead_peer, gpu_ep_dead_peer_combine).
 */
TEST_F(EpGpu, DeadPeerIsNamed)
{
    if (std::getenv("TEST_EP_KILL_RANK") == nullptr)
        GTEST_SKIP() << "runs alone (ctest gpu_ep_dead_peer sets TEST_EP_KILL_RANK)";
    const char *phase_env = std::getenv("TEST_EP_KILL_PHASE");
    const std::string phase = phase_env != nullptr ? phase_env : "dispatch";
    ASSERT_TRUE(phase == "dispatch" || phase == "combine") << "TEST_EP_KILL_PHASE=" << phase;
    AllowLog("");
    const int n = NRanks(), victim = n - 1;
    ASSERT_NO_FATAL_FAILURE(Make({ MACO_EP_LOW_LATENCY, 16, 256, 4 * n, 2, 0 }));
    ASSERT_NO_FATAL_FAILURE(RunCase(kUniform, false)); /* one complete round first */
    std::vector<RankInput> all = Inputs(kUniform, seed_ + 1);
    ASSERT_NO_FATAL_FAILURE(Upload(all[Rank()]));
    if (phase == "combine") { /* every rank's dispatch completes, the victim then leaves */
        ASSERT_EQ(Dispatch(all[Rank()], nullptr), MACO_OK) << maco_log_last_error();
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    if (Rank() == victim) {
        std::fflush(stdout);
        _exit(0); /* gone without a word */
    }
    auto t0 = std::chrono::steady_clock::now();
    if (phase == "combine")
        EXPECT_EQ(Combine(all[Rank()].T), MACO_OK);
    else
        EXPECT_EQ(Dispatch(all[Rank()], nullptr), MACO_OK);
    cudaError_t ce = cudaStreamSynchronize(stream_);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    maco_status_t async_st = MACO_OK;
    EXPECT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
    std::string why = maco_comm_get_last_error(Comm());
    std::printf("rank %d: %s: stream %s, async error %s after %.1f s: %s\n", Rank(), phase.c_str(),
                cudaGetErrorString(ce), maco_status_string(async_st), secs, why.c_str());
    EXPECT_NE(async_st, MACO_OK);
    const std::regex names_victim("\\branks? ([0-9]+, )*" + std::to_string(victim) + "\\b");
    EXPECT_TRUE(std::regex_search(why, names_victim)) << why;
    EXPECT_LT(secs, 120.0);
    std::fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, true, true);
}
