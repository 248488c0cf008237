/*
 * test_p2p_gpu.cc - all-to-all, all-to-allv, send/recv and groups on real GPUs.
 *
 * Inputs come from perf_kernels.h's generator with a fresh seed per call (element i of rank
 * r's send buffer is a function of seed, r and i); every receive buffer and the bytes around
 * it are poisoned (0xFF) first, and after the call every received element is compared
 * bitwise, on the GPU, with the element the sender held (maco_perf_check_from /
 * maco_perf_check_coll), and every byte outside the received blocks must still be poison.
 * Both ways a message travels (LL packets, chunks through scratch) are forced in turn.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_case.h"
#include "maco_test.h"
#include "tools/perf_kernels.h"

namespace
{

using namespace maco_test;

const char *const kModes[] = { "", "ll", "copy" };

class P2P : public maco_test::BufferCase
{
  protected:
    void TearDown() override
    {
        maco_collective_set_algorithm(Comm(), MACO_COLL_ALLTOALL, nullptr);
        maco_collective_set_algorithm(Comm(), MACO_COLL_SENDRECV, nullptr);
        maco_test::BufferCase::TearDown();
    }

    maco_stream_t S()
    {
        return reinterpret_cast<maco_stream_t>(stream_);
    }

    uint64_t Seed(uint64_t salt)
    {
        return seed_ ^ (salt * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(round_++) << 40);
    }

    /* Poisons the whole receive side and zeroes the wrong counters (stream-ordered). */
    void Poison()
    {
        CUDA_OK(cudaMemsetAsync(out_, 0xFF, cap_ + 2 * kGuard, stream_));
        ResetCounters();
    }

    void ResetCounters()
    {
        unsigned long long init[2] = { 0, ~0ull };
        CUDA_OK(cudaMemcpyAsync(counters_, init, sizeof(init), cudaMemcpyHostToDevice, stream_));
    }

    void Fill(char *p, size_t count, maco_datatype_t dt, uint64_t seed)
    {
        CUDA_OK(maco_perf_fill_coll(p, count, dt, MACO_SUM, seed, Rank(), stream_));
    }

    /* count elements at p must be elements [off, off + count) of rank src's input. */
    void ExpectFrom(const char *p, size_t count, maco_datatype_t dt, uint64_t seed, int src,
                    size_t off)
    {
        CUDA_OK(maco_perf_check_from(p, count, dt, MACO_SUM, seed, src, off, &counters_[0],
                                     &counters_[1], stream_));
    }

    /* [p, p + bytes) must still be poison. */
    void ExpectPoison(const char *p, size_t bytes)
    {
        CUDA_OK(maco_perf_check_bytes(p, bytes, 0xFF, &counters_[0], stream_));
    }

    /* Every byte of out_ outside the given [offset, offset + bytes) ranges (relative to out_)
     * must still be poison. */
    void ExpectPoisonOutside(std::vector<std::pair<size_t, size_t>> ranges)
    {
        std::sort(ranges.begin(), ranges.end());
        size_t at = 0, end = cap_ + 2 * kGuard;
        for (const auto &r : ranges) {
            if (r.second == 0)
                continue;
            if (r.first > at)
                ExpectPoison(out_ + at, r.first - at);
            at = std::max(at, r.first + r.second);
        }
        if (end > at)
            ExpectPoison(out_ + at, end - at);
    }

    /* No asynchronous error on `comm` (the sender's side of a count mismatch). */
    void ExpectNoAsyncError(maco_comm_t comm)
    {
        maco_status_t async_st = MACO_OK;
        ASSERT_EQ(maco_comm_get_async_error(comm, &async_st), MACO_OK);
        EXPECT_EQ(async_st, MACO_OK) << maco_comm_get_last_error(comm);
    }

    /* The receiver's side of a count mismatch on `comm`: MACO_ERR_INVALID_ARGUMENT whose
     * message names the receive (`call` of `recv_count` elements), rank 0 as the sender and
     * the send's `send_bytes`, and no byte of [recv, recv + poisoned) written. */
    void ExpectMismatchReported(maco_comm_t comm, const char *call, size_t recv_count,
                                size_t send_bytes, const char *recv, size_t poisoned)
    {
        maco_status_t async_st = MACO_OK;
        ASSERT_EQ(maco_comm_get_async_error(comm, &async_st), MACO_OK);
        EXPECT_EQ(async_st, MACO_ERR_INVALID_ARGUMENT);
        std::string msg = maco_comm_get_last_error(comm);
        EXPECT_NE(msg.find(std::string(call) + " of " + std::to_string(recv_count) + " elements"),
                  std::string::npos)
            << msg;
        EXPECT_NE(msg.find("from rank 0"), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::to_string(send_bytes) + " bytes"), std::string::npos) << msg;
        ExpectPoison(recv, poisoned);
        unsigned long long res[2];
        CUDA_OK(cudaMemcpyAsync(res, counters_, sizeof(res), cudaMemcpyDeviceToHost, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
        EXPECT_EQ(res[0], 0u) << "bytes written by a mismatched receive";
    }

    /* Wrong elements and bytes counted since Poison(); fails on an asynchronous error. */
    void Wrong(unsigned long long *wrong, unsigned long long *first = nullptr)
    {
        unsigned long long res[2];
        ASSERT_NO_FATAL_FAILURE(ReadCounters(res));
        *wrong = res[0];
        if (first)
            *first = res[1];
    }

    /* One maco_alltoall of `unit` elements per block from in_ + kGuard + skew_send to out_ +
     * kGuard + skew_recv on fresh inputs and a poisoned output, checked bitwise (every byte
     * outside the received blocks still poison). */
    void CheckedAllToAll(size_t unit, maco_datatype_t dt, const char *mode, uint64_t seed,
                         size_t skew_send, size_t skew_recv)
    {
        const size_t n = static_cast<size_t>(NRanks());
        size_t bytes = unit * maco_datatype_size(dt) * n;
        ASSERT_NO_FATAL_FAILURE(Reserve(bytes + 16));
        char *send = in_ + kGuard + skew_send;
        char *recv = out_ + kGuard + skew_recv;
        Poison();
        Fill(send, unit * n, dt, seed);
        ASSERT_EQ(maco_alltoall(send, recv, unit, dt, Comm(), S()), MACO_OK)
            << maco_comm_get_last_error(Comm());
        CUDA_OK(maco_perf_check_coll(recv, unit * n, MACO_COLL_ALLTOALL, dt, MACO_SUM, 0, unit,
                                     seed, Rank(), NRanks(), &counters_[0], &counters_[1],
                                     stream_));
        ExpectPoisonOutside({ { kGuard + skew_recv, bytes } });
        unsigned long long wrong = 1, first = 0;
        ASSERT_NO_FATAL_FAILURE(Wrong(&wrong, &first));
        ASSERT_EQ(wrong, 0u) << "alltoall " << maco_datatype_name(dt) << " count " << unit
                             << " mode '" << mode << "' skews " << skew_send << "/" << skew_recv
                             << ", first wrong element " << first;
    }

    void Force(maco_collective_t coll, const char *mode)
    {
        ASSERT_EQ(maco_collective_set_algorithm(Comm(), coll, mode[0] ? mode : nullptr), MACO_OK);
    }

    int round_ = 0;
};

std::string Describe(const char *what, maco_datatype_t dt, size_t count, const char *mode,
                     size_t skew_send = 0, size_t skew_recv = 0)
{
    return std::string(what) + " " + maco_datatype_name(dt) + " count " + std::to_string(count) +
           " mode '" + mode + "' skews " + std::to_string(skew_send) + "/" +
           std::to_string(skew_recv);
}

/* All-to-all: every type, counts around the LL and chunk sizes, both modes and the choice by
 * size, aligned and misaligned (differently on the two sides) buffers. */
TEST_F(P2P, AllToAllEveryTypeModeAndAlignment)
{
    for (int t = 0; t < MACO_DATATYPE_COUNT; t++) {
        maco_datatype_t dt = static_cast<maco_datatype_t>(t);
        size_t esz = maco_datatype_size(dt);
        std::vector<size_t> units = { 1, 3, 1023, 8193 / esz };
        if (t == MACO_FLOAT32 || t == MACO_INT8 || t == MACO_BFLOAT16)
            units.push_back(300001); /* copy mode over several chunks and lanes */
        for (size_t unit : units) {
            for (const char *mode : kModes) {
                for (auto skews :
                     { std::make_pair<size_t, size_t>(0, 0), std::make_pair<size_t, size_t>(1, 1),
                       std::make_pair<size_t, size_t>(6, 0) }) {
                    if (unit > 10000 && skews.first != 0 && mode[0] != 'c')
                        continue;
                    ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, mode));
                    ASSERT_NO_FATAL_FAILURE(
                        CheckedAllToAll(unit, dt, mode, Seed(unit), skews.first, skews.second));
                }
            }
        }
    }
}

/* Nodes of the communicator (MACO_HOST_ID / maco-run --simulate-nodes make several). */
int Nodes(maco_comm_t comm)
{
    int nn = 1;
    EXPECT_EQ(maco_comm_get_nnodes(comm, &nn), MACO_OK);
    return nn;
}

/* All-to-all across nodes through the hierarchical path (MACO_ALGO_ALLTOALL=hier) and the
 * default choice: every type, counts on both sides of the segment boundaries (pieces of
 * 512 KiB / local_nranks at least, of region_bytes / local_nranks at most: p2p_plan.h,
 * maco__hier_a2a_shape; run with a small MACO_SCRATCH_SIZE for many segments per CTA), odd counts,
 * misaligned buffers, fresh inputs every call, poisoned outputs checked bitwise. */
TEST_F(P2P, AllToAllHierAcrossNodes)
{
    if (Nodes(Comm()) < 2)
        GTEST_SKIP() << "needs ranks on several nodes (maco-run --simulate-nodes)";
    for (int t = 0; t < MACO_DATATYPE_COUNT; t++) {
        maco_datatype_t dt = static_cast<maco_datatype_t>(t);
        size_t esz = maco_datatype_size(dt);
        /* Pieces of 256 KiB (2 nodes x 2, 32 MiB scratch), 32 KiB (4 MiB scratch) and 64 KiB
         * (4 nodes x 1, 4 MiB scratch): counts on both sides of each. */
        std::vector<size_t> units = { 1,
                                      3,
                                      1023,
                                      32768 / esz - 1,
                                      32768 / esz + 3,
                                      65536 / esz + 1,
                                      262144 / esz - 1,
                                      262144 / esz + 1 };
        if (t == MACO_FLOAT32 || t == MACO_INT8 || t == MACO_BFLOAT16 || t == MACO_FLOAT64)
            units.push_back((1u << 20) / esz + 5); /* several segments per CTA */
        if (t == MACO_INT8)
            units.push_back((3u << 20) + 7);
        for (size_t unit : units) {
            for (const char *mode : { "hier", "" }) {
                for (auto skews : { std::make_pair<size_t, size_t>(0, 0),
                                    std::make_pair<size_t, size_t>(1, 3) }) {
                    if (unit > 10000 && skews.first != 0 && mode[0] == '\0')
                        continue;
                    ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, mode));
                    if (mode[0] != '\0') {
                        const char *algo = nullptr;
                        ASSERT_EQ(maco_collective_get_algorithm(Comm(), MACO_COLL_ALLTOALL, unit,
                                                                dt, &algo),
                                  MACO_OK);
                        ASSERT_STREQ(algo, "hier");
                    }
                    ASSERT_NO_FATAL_FAILURE(
                        CheckedAllToAll(unit, dt, mode, Seed(unit * 16 + static_cast<uint64_t>(t)),
                                        skews.first, skews.second));
                }
            }
        }
    }
}

/* A CUDA graph holding a hierarchical all-to-all, a hier allreduce on other buffers and a
 * second, larger hierarchical all-to-all, replayed 40 times with new inputs: the port
 * channels' and barriers' counters advance on the device, and calls of different kinds do
 * not disturb each other's rail regions. */
TEST_F(P2P, AllToAllHierGraphReplayed)
{
    if (Nodes(Comm()) < 2)
        GTEST_SKIP() << "needs ranks on several nodes (maco-run --simulate-nodes)";
    const int n = NRanks(), me = Rank();
    ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, "hier"));
    const size_t ua = 3001;   /* bf16 per block */
    const size_t ub = 200003; /* int8 per block: several segments */
    const size_t abytes = ua * 2 * static_cast<size_t>(n), bbytes = ub * static_cast<size_t>(n);
    ASSERT_NO_FATAL_FAILURE(Reserve(abytes + 64 + bbytes));
    char *sa = in_ + kGuard, *ra = out_ + kGuard;
    char *sb = sa + abytes + 64, *rb = ra + abytes + 64;
    float *ar = nullptr;
    const size_t ar_count = 50000;
    CUDA_OK(cudaMalloc(&ar, 2 * ar_count * sizeof(float)));
    CUDA_OK(cudaMemset(ar, 0, 2 * ar_count * sizeof(float)));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    maco_status_t st1 = maco_alltoall(sa, ra, ua, MACO_BFLOAT16, Comm(), S());
    maco_status_t st2 =
        maco_allreduce(ar, ar + ar_count, ar_count, MACO_FLOAT32, MACO_SUM, Comm(), S());
    maco_status_t st3 = maco_alltoall(sb, rb, ub, MACO_INT8, Comm(), S());
    CUDA_OK(cudaStreamEndCapture(stream_, &graph));
    ASSERT_EQ(st1, MACO_OK) << maco_comm_get_last_error(Comm());
    ASSERT_EQ(st2, MACO_OK) << maco_comm_get_last_error(Comm());
    ASSERT_EQ(st3, MACO_OK) << maco_comm_get_last_error(Comm());
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 40; replay++) {
        uint64_t seed = Seed(static_cast<uint64_t>(replay));
        Poison();
        Fill(sa, ua * static_cast<size_t>(n), MACO_BFLOAT16, seed);
        Fill(sb, ub * static_cast<size_t>(n), MACO_INT8, seed ^ 7);
        /* The allreduce between them: fresh input, poisoned output, checked like the rest. */
        Fill(reinterpret_cast<char *>(ar), ar_count, MACO_FLOAT32, seed ^ 11);
        CUDA_OK(cudaMemsetAsync(ar + ar_count, 0x7f, ar_count * sizeof(float), stream_));
        CUDA_OK(cudaGraphLaunch(exec, stream_));
        CUDA_OK(maco_perf_check_coll(ar + ar_count, ar_count, MACO_COLL_ALLREDUCE, MACO_FLOAT32,
                                     MACO_SUM, 0, ar_count, seed ^ 11, me, n, &counters_[0],
                                     &counters_[1], stream_));
        CUDA_OK(maco_perf_check_coll(ra, ua * static_cast<size_t>(n), MACO_COLL_ALLTOALL,
                                     MACO_BFLOAT16, MACO_SUM, 0, ua, seed, me, n, &counters_[0],
                                     &counters_[1], stream_));
        CUDA_OK(maco_perf_check_coll(rb, ub * static_cast<size_t>(n), MACO_COLL_ALLTOALL, MACO_INT8,
                                     MACO_SUM, 0, ub, seed ^ 7, me, n, &counters_[0], &counters_[1],
                                     stream_));
        ExpectPoisonOutside({ { kGuard, abytes }, { kGuard + abytes + 64, bbytes } });
        unsigned long long wrong = 1;
        ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
        ASSERT_EQ(wrong, 0u) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(ar);
}

/* On one node, forcing hier is a clear error naming the variable, and nothing runs. */
TEST_F(P2P, AllToAllHierOnOneNodeIsRefused)
{
    if (Nodes(Comm()) > 1)
        GTEST_SKIP() << "runs on one node";
    maco_test::AllowLog("MACO_ALGO_ALLTOALL=hier needs ranks on several nodes");
    ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, "hier"));
    ASSERT_NO_FATAL_FAILURE(Reserve(64 * static_cast<size_t>(NRanks())));
    EXPECT_EQ(maco_alltoall(in_ + kGuard, out_ + kGuard, 16, MACO_FLOAT32, Comm(), S()),
              MACO_ERR_INVALID_ARGUMENT);
    /* This thread's last error: the communicator's keeps its first failure, and earlier tests
     * of the suite made calls it rejected. */
    std::string msg = maco_log_last_error();
    EXPECT_NE(msg.find("MACO_ALGO_ALLTOALL=hier needs ranks on several nodes"), std::string::npos)
        << msg;
}

/* The count matrix and layouts of an all-to-allv, the same on every rank (shared seed). */
struct A2AV {
    int n = 0;
    std::vector<std::vector<size_t>> counts; /* [sender][receiver] */
    std::vector<std::vector<size_t>> sdispl; /* [sender][receiver] */
    std::vector<std::vector<size_t>> rdispl; /* [receiver][sender] */
    std::vector<size_t> send_total, recv_total;

    void Make(std::mt19937_64 &rng, int nranks, size_t big)
    {
        n = nranks;
        counts.assign(n, std::vector<size_t>(n, 0));
        for (int s = 0; s < n; s++)
            for (int d = 0; d < n; d++) {
                unsigned kind = static_cast<unsigned>(rng() % 8);
                counts[s][d] = kind < 3   ? 0
                               : kind < 5 ? 1 + rng() % 300
                               : kind < 7 ? 1 + rng() % 20000
                                          : 1 + rng() % big;
            }
        sdispl = Layout(
            rng, [&](int s, int d) { return counts[s][d]; }, &send_total);
        rdispl = Layout(
            rng, [&](int d, int s) { return counts[s][d]; }, &recv_total);
    }

    /* For each rank a, its blocks b in a shuffled order with small gaps between them. */
    template <class F>
    std::vector<std::vector<size_t>> Layout(std::mt19937_64 &rng, F count,
                                            std::vector<size_t> *total)
    {
        std::vector<std::vector<size_t>> d(n, std::vector<size_t>(n, 0));
        total->assign(n, 0);
        for (int a = 0; a < n; a++) {
            std::vector<int> order(n);
            std::iota(order.begin(), order.end(), 0);
            std::shuffle(order.begin(), order.end(), rng);
            size_t at = rng() % 4;
            for (int b : order) {
                d[a][b] = at;
                at += count(a, b) + rng() % 8;
            }
            (*total)[a] = at;
        }
        return d;
    }
};

/* All-to-allv with random counts (a third of them 0, some rows and columns all 0), shuffled
 * layouts with gaps, every mode; bytes between the blocks stay poison. */
TEST_F(P2P, AllToAllvRandomAndZeroCounts)
{
    const maco_datatype_t types[] = { MACO_FLOAT32, MACO_BFLOAT16, MACO_INT8,  MACO_FLOAT64,
                                      MACO_UINT64,  MACO_FP8_E4M3, MACO_INT32, MACO_FLOAT16 };
    std::mt19937_64 rng(seed_);
    const int me = Rank(), n = NRanks();
    for (int round = 0; round < 12; round++) {
        maco_datatype_t dt = types[round % 8];
        size_t esz = maco_datatype_size(dt);
        const char *mode = kModes[round % 3];
        ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, mode));
        A2AV v;
        v.Make(rng, n, round >= 9 ? 400000 : 3000);
        if (round == 1) /* everything 0 */
            for (auto &row : v.counts)
                std::fill(row.begin(), row.end(), 0);
        if (round == 2) { /* rank 0 sends nothing, and receives nothing from the last rank */
            std::fill(v.counts[0].begin(), v.counts[0].end(), 0);
            v.counts[n - 1][0] = 0;
        }
        if (round <= 2) {
            v.sdispl = v.Layout(
                rng, [&](int s, int d) { return v.counts[s][d]; }, &v.send_total);
            v.rdispl = v.Layout(
                rng, [&](int d, int s) { return v.counts[s][d]; }, &v.recv_total);
        }
        std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
        for (int q = 0; q < n; q++) {
            sc[q] = v.counts[me][q];
            sd[q] = v.sdispl[me][q];
            rc[q] = v.counts[q][me];
            rd[q] = v.rdispl[me][q];
        }
        size_t max_total = 0;
        for (int q = 0; q < n; q++)
            max_total = std::max({ max_total, v.send_total[q], v.recv_total[q] });
        ASSERT_NO_FATAL_FAILURE(Reserve(max_total * esz + 16));
        char *send = in_ + kGuard, *recv = out_ + kGuard;
        uint64_t seed = Seed(static_cast<uint64_t>(round));
        Poison();
        Fill(send, v.send_total[me], dt, seed);
        ASSERT_EQ(
            maco_alltoallv(send, sc.data(), sd.data(), recv, rc.data(), rd.data(), dt, Comm(), S()),
            MACO_OK)
            << maco_comm_get_last_error(Comm());
        std::vector<std::pair<size_t, size_t>> blocks;
        for (int q = 0; q < n; q++) {
            ExpectFrom(recv + rd[q] * esz, rc[q], dt, seed, q, v.sdispl[q][me]);
            blocks.emplace_back(kGuard + rd[q] * esz, rc[q] * esz);
        }
        ExpectPoisonOutside(blocks);
        unsigned long long wrong = 1, first = 0;
        ASSERT_NO_FATAL_FAILURE(Wrong(&wrong, &first));
        ASSERT_EQ(wrong, 0u) << "alltoallv round " << round << " " << maco_datatype_name(dt)
                             << " mode '" << mode << "', first wrong " << first;
    }
}

/* nccl-tests' sendrecv ring (rank r sends to r + 1, receives from r - 1) in one group, sizes
 * on both sides of MACO_P2P_LL_MAX (256 KiB by default) and of the copy chunk's steps (one
 * chunk per lane, several, slots reused), odd byte counts, every mode. */
TEST_F(P2P, RingSendRecvEverySizeAndMode)
{
    const int n = NRanks(), me = Rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    const maco_datatype_t types[] = { MACO_UINT8, MACO_FLOAT32, MACO_BFLOAT16, MACO_INT64 };
    const size_t sizes[] = { 1,      7,      8,      1000,   65535,   65536,       65537,
                             131072, 131073, 262144, 262145, 1000003, 16777216 + 5 };
    int k = 0;
    for (size_t bytes : sizes) {
        for (const char *mode : kModes) {
            maco_datatype_t dt = types[k++ % 4];
            size_t esz = maco_datatype_size(dt);
            size_t count = std::max<size_t>(bytes / esz, 1);
            ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_SENDRECV, mode));
            ASSERT_NO_FATAL_FAILURE(Reserve(count * esz));
            char *send = in_ + kGuard, *recv = out_ + kGuard;
            uint64_t seed = Seed(bytes);
            Poison();
            Fill(send, count, dt, seed);
            ASSERT_EQ(maco_group_start(), MACO_OK);
            ASSERT_EQ(maco_send(send, count, dt, next, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_recv(recv, count, dt, prev, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(Comm());
            ExpectFrom(recv, count, dt, seed, prev, 0);
            ExpectPoisonOutside({ { kGuard, count * esz } });
            unsigned long long wrong = 1, first = 0;
            ASSERT_NO_FATAL_FAILURE(Wrong(&wrong, &first));
            ASSERT_EQ(wrong, 0u) << Describe("ring", dt, count, mode) << ", first wrong " << first;
        }
    }
}

/* In place, as nccl-tests' in-place sendrecv: one buffer X per rank, send X to rank r + 1 and
 * receive into X from rank r - 1 in one group. The send must carry X as it was before the
 * group and X must end up holding rank r - 1's data, bit for bit, on random data, with the
 * bytes around X (poison) untouched; sizes on both sides of the LL limit and of the chunk size,
 * both modes (the kernel stages chunks through the receiver's buffer, so without the copy
 * aside of group.c a receive overwrites X before the send has read it). Then a receive that
 * covers only the upper half of the send's buffer (the lower half keeps this rank's data), a
 * local copy onto itself (X unchanged), and an all-to-allv in place. */
TEST_F(P2P, InPlaceRingSendRecvBitForBit)
{
    const int n = NRanks(), me = Rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    const maco_datatype_t types[] = { MACO_UINT8, MACO_FLOAT32, MACO_BFLOAT16, MACO_INT64 };
    const size_t sizes[] = { 1, 8, 1000, 65535, 65537, 131073, 1000003, 16777216 + 5 };
    int k = 0;
    for (size_t bytes : sizes) {
        for (const char *mode : kModes) {
            maco_datatype_t dt = types[k++ % 4];
            size_t esz = maco_datatype_size(dt);
            size_t count = std::max<size_t>(bytes / esz, 2) / 2 * 2;
            ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_SENDRECV, mode));
            ASSERT_NO_FATAL_FAILURE(Reserve(2 * count * esz));
            char *x = out_ + kGuard;
            const std::string what = Describe("in-place ring", dt, count, mode);
            /* 1. The whole of X. */
            uint64_t seed = Seed(bytes + 1);
            Poison();
            Fill(x, count, dt, seed);
            ASSERT_EQ(maco_group_start(), MACO_OK);
            ASSERT_EQ(maco_send(x, count, dt, next, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_recv(x, count, dt, prev, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(Comm());
            ExpectFrom(x, count, dt, seed, prev, 0);
            ExpectPoisonOutside({ { kGuard, count * esz } });
            unsigned long long wrong = 1, first = 0;
            ASSERT_NO_FATAL_FAILURE(Wrong(&wrong, &first));
            ASSERT_EQ(wrong, 0u) << what << ", first wrong " << first;
            /* 2. The receive covers the send's upper half and as much past it. */
            const size_t h = count / 2;
            seed = Seed(bytes + 2);
            Poison();
            Fill(x, count, dt, seed);
            ASSERT_EQ(maco_group_start(), MACO_OK);
            ASSERT_EQ(maco_recv(x + h * esz, count, dt, prev, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_send(x, count, dt, next, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(Comm());
            ExpectFrom(x, h, dt, seed, me, 0);
            ExpectFrom(x + h * esz, count, dt, seed, prev, 0);
            ExpectPoisonOutside({ { kGuard, (h + count) * esz } });
            ASSERT_NO_FATAL_FAILURE(Wrong(&wrong, &first));
            ASSERT_EQ(wrong, 0u) << what << ", half overlap, first wrong " << first;
            /* 3. A local copy of X onto X, with the ring in the same group. */
            seed = Seed(bytes + 3);
            Poison();
            Fill(x, count, dt, seed);
            char *y = x + count * esz;
            Fill(y, count, dt, seed ^ 5);
            ASSERT_EQ(maco_group_start(), MACO_OK);
            ASSERT_EQ(maco_send(x, count, dt, me, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_send(y, count, dt, next, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_recv(y, count, dt, prev, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_recv(x, count, dt, me, Comm(), S()), MACO_OK);
            ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(Comm());
            ExpectFrom(x, count, dt, seed, me, 0);
            ExpectFrom(y, count, dt, seed ^ 5, prev, 0);
            ExpectPoisonOutside({ { kGuard, 2 * count * esz } });
            ASSERT_NO_FATAL_FAILURE(Wrong(&wrong, &first));
            ASSERT_EQ(wrong, 0u) << what << ", local copy in place, first wrong " << first;
        }
    }
    /* 4. All-to-allv with the receive blocks where the send blocks are. */
    for (size_t unit : { static_cast<size_t>(3), static_cast<size_t>(70001) }) {
        const size_t nn = static_cast<size_t>(n);
        ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, ""));
        ASSERT_NO_FATAL_FAILURE(Reserve(unit * 4 * nn));
        char *x = out_ + kGuard;
        std::vector<size_t> c(nn, unit), d(nn);
        for (size_t q = 0; q < nn; q++)
            d[q] = q * unit;
        uint64_t seed = Seed(unit);
        Poison();
        Fill(x, unit * nn, MACO_FLOAT32, seed);
        ASSERT_EQ(
            maco_alltoallv(x, c.data(), d.data(), x, c.data(), d.data(), MACO_FLOAT32, Comm(), S()),
            MACO_OK)
            << maco_comm_get_last_error(Comm());
        CUDA_OK(maco_perf_check_coll(x, unit * nn, MACO_COLL_ALLTOALL, MACO_FLOAT32, MACO_SUM, 0,
                                     unit, seed, Rank(), NRanks(), &counters_[0], &counters_[1],
                                     stream_));
        ExpectPoisonOutside({ { kGuard, unit * 4 * nn } });
        unsigned long long wrong = 1, first = 0;
        ASSERT_NO_FATAL_FAILURE(Wrong(&wrong, &first));
        ASSERT_EQ(wrong, 0u) << "all-to-allv in place, " << unit << " per block, first wrong "
                             << first;
    }
}

/* The checks can fail: data from the wrong rank, or a poisoned buffer, is counted wrong (so
 * the zero counts of the other tests mean something). */
TEST_F(P2P, CheckersCountWrongData)
{
    const int n = NRanks(), me = Rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    const size_t count = 5000;
    ASSERT_NO_FATAL_FAILURE(Reserve(count * 4));
    char *send = in_ + kGuard, *recv = out_ + kGuard;
    uint64_t seed = Seed(11);
    Poison();
    Fill(send, count, MACO_FLOAT32, seed);
    ExpectFrom(out_ + kGuard, count, MACO_FLOAT32, seed, prev, 0); /* still poison */
    unsigned long long wrong = 0;
    ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
    EXPECT_EQ(wrong, count);
    Poison();
    ASSERT_EQ(maco_group_start(), MACO_OK);
    ASSERT_EQ(maco_send(send, count, MACO_FLOAT32, next, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_recv(recv, count, MACO_FLOAT32, prev, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(Comm());
    ExpectFrom(recv, count, MACO_FLOAT32, seed ^ 1, prev, 0); /* another seed */
    ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
    EXPECT_GT(wrong, count * 9 / 10);
    ResetCounters();
    ExpectFrom(recv, count, MACO_FLOAT32, seed, prev, 0); /* right data, right source */
    ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
    EXPECT_EQ(wrong, 0u);
}

/* Message sizes (elements) of the all-pairs test: message k from s to d. */
size_t PairCount(int s, int d, int k)
{
    static const size_t table[] = { 0, 1, 5000, 70000, 600001, 33 };
    return table[static_cast<size_t>(s * 7 + d * 3 + k * 11) % 6];
}

/* Every rank sends two messages to every rank (itself included, as a local copy) and receives
 * two from each, all in one group, sends and receives posted in different orders; sizes from
 * 0 to 600001 elements, so LL and copy messages share pairs. */
TEST_F(P2P, AllPairsTwoMessagesPerPairInOneGroup)
{
    const int n = NRanks(), me = Rank();
    for (maco_datatype_t dt : { MACO_FLOAT32, MACO_UINT8, MACO_FLOAT16 }) {
        size_t esz = maco_datatype_size(dt);
        /* Rank s's send layout: messages (d, k) in the order d = 0.., k = 0, 1. */
        auto send_off = [&](int s, int d, int k) {
            size_t at = 0;
            for (int dd = 0; dd < n; dd++)
                for (int kk = 0; kk < 2; kk++) {
                    if (dd == d && kk == k)
                        return at;
                    at += PairCount(s, dd, kk);
                }
            return at;
        };
        size_t send_total = send_off(me, n - 1, 1) + PairCount(me, n - 1, 1);
        std::vector<size_t> recv_off(static_cast<size_t>(2 * n));
        size_t recv_total = 0;
        for (int s = n - 1; s >= 0; s--) /* another order than the senders' */
            for (int k = 0; k < 2; k++) {
                recv_off[static_cast<size_t>(2 * s + k)] = recv_total;
                recv_total += PairCount(s, me, k) + 3;
            }
        ASSERT_NO_FATAL_FAILURE(Reserve(std::max(send_total, recv_total) * esz));
        char *send = in_ + kGuard, *recv = out_ + kGuard;
        uint64_t seed = Seed(static_cast<uint64_t>(dt));
        Poison();
        Fill(send, send_total, dt, seed);
        ASSERT_EQ(maco_group_start(), MACO_OK);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < n; i++) {
                int d = (me + i) % n;
                ASSERT_EQ(maco_send(send + send_off(me, d, k) * esz, PairCount(me, d, k), dt, d,
                                    Comm(), S()),
                          MACO_OK);
            }
        for (int s = n - 1; s >= 0; s--)
            for (int k = 0; k < 2; k++)
                ASSERT_EQ(maco_recv(recv + recv_off[static_cast<size_t>(2 * s + k)] * esz,
                                    PairCount(s, me, k), dt, s, Comm(), S()),
                          MACO_OK);
        ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(Comm());
        std::vector<std::pair<size_t, size_t>> blocks;
        for (int s = 0; s < n; s++)
            for (int k = 0; k < 2; k++) {
                size_t off = recv_off[static_cast<size_t>(2 * s + k)];
                ExpectFrom(recv + off * esz, PairCount(s, me, k), dt, seed, s, send_off(s, me, k));
                blocks.emplace_back(kGuard + off * esz, PairCount(s, me, k) * esz);
            }
        ExpectPoisonOutside(blocks);
        unsigned long long wrong = 1, first = 0;
        ASSERT_NO_FATAL_FAILURE(Wrong(&wrong, &first));
        ASSERT_EQ(wrong, 0u) << "all pairs " << maco_datatype_name(dt) << ", first wrong " << first;
    }
}

/* Sends and receives outside groups match in call order: rank pairs (2i, 2i + 1) exchange
 * three messages each way, the even rank sending first, the odd one receiving first. */
TEST_F(P2P, CallsOutsideGroupsMatchInOrder)
{
    const int me = Rank(), peer = me ^ 1;
    if (peer >= NRanks())
        GTEST_SKIP() << "odd number of ranks";
    const size_t counts[] = { 10, 200000, 3 };
    size_t total = 0;
    for (size_t c : counts)
        total += c;
    ASSERT_NO_FATAL_FAILURE(Reserve(total));
    char *send = in_ + kGuard, *recv = out_ + kGuard;
    uint64_t seed = Seed(77);
    Poison();
    Fill(send, total, MACO_UINT8, seed);
    auto sends = [&] {
        size_t at = 0;
        for (size_t c : counts) {
            ASSERT_EQ(maco_send(send + at, c, MACO_UINT8, peer, Comm(), S()), MACO_OK);
            at += c;
        }
    };
    auto recvs = [&] {
        size_t at = 0;
        for (size_t c : counts) {
            ASSERT_EQ(maco_recv(recv + at, c, MACO_UINT8, peer, Comm(), S()), MACO_OK);
            at += c;
        }
    };
    if (me % 2 == 0) {
        ASSERT_NO_FATAL_FAILURE(sends());
        ASSERT_NO_FATAL_FAILURE(recvs());
    } else {
        ASSERT_NO_FATAL_FAILURE(recvs());
        ASSERT_NO_FATAL_FAILURE(sends());
    }
    ExpectFrom(recv, total, MACO_UINT8, seed, peer, 0);
    ExpectPoisonOutside({ { kGuard, total } });
    unsigned long long wrong = 1;
    ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
    ASSERT_EQ(wrong, 0u);
}

/* One CUDA graph holding an all-to-all and a ring exchange (one group), replayed 60 times with
 * new inputs each time: the sequence counters advance on the device. */
TEST_F(P2P, GraphReplayedWithChangingInputs)
{
    const int n = NRanks(), me = Rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (const char *mode : { "ll", "copy", "" }) {
        ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, mode));
        ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_SENDRECV, mode));
        const size_t unit = 3001;   /* bf16, per peer */
        const size_t ring = 100003; /* float32 */
        size_t a2a_bytes = unit * 2 * static_cast<size_t>(n);
        ASSERT_NO_FATAL_FAILURE(Reserve(a2a_bytes + 64 + ring * 4));
        char *a2a_send = in_ + kGuard, *a2a_recv = out_ + kGuard;
        char *ring_send = a2a_send + a2a_bytes + 64, *ring_recv = a2a_recv + a2a_bytes + 64;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        maco_status_t st1 = maco_group_start();
        maco_status_t st2 = maco_alltoall(a2a_send, a2a_recv, unit, MACO_BFLOAT16, Comm(), S());
        maco_status_t st3 = maco_send(ring_send, ring, MACO_FLOAT32, next, Comm(), S());
        maco_status_t st4 = maco_recv(ring_recv, ring, MACO_FLOAT32, prev, Comm(), S());
        maco_status_t st5 = maco_group_end();
        CUDA_OK(cudaStreamEndCapture(stream_, &graph));
        ASSERT_EQ(st1, MACO_OK);
        ASSERT_EQ(st2, MACO_OK);
        ASSERT_EQ(st3, MACO_OK);
        ASSERT_EQ(st4, MACO_OK);
        ASSERT_EQ(st5, MACO_OK) << maco_comm_get_last_error(Comm());
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        for (int replay = 0; replay < 60; replay++) {
            uint64_t seed = Seed(static_cast<uint64_t>(replay));
            Poison();
            Fill(a2a_send, unit * static_cast<size_t>(n), MACO_BFLOAT16, seed);
            CUDA_OK(maco_perf_fill_coll(ring_send, ring, MACO_FLOAT32, MACO_SUM, seed ^ 1, me,
                                        stream_));
            CUDA_OK(cudaGraphLaunch(exec, stream_));
            CUDA_OK(maco_perf_check_coll(a2a_recv, unit * static_cast<size_t>(n),
                                         MACO_COLL_ALLTOALL, MACO_BFLOAT16, MACO_SUM, 0, unit, seed,
                                         me, n, &counters_[0], &counters_[1], stream_));
            ExpectFrom(ring_recv, ring, MACO_FLOAT32, seed ^ 1, prev, 0);
            ExpectPoisonOutside({ { kGuard, a2a_bytes }, { kGuard + a2a_bytes + 64, ring * 4 } });
            unsigned long long wrong = 1;
            ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
            ASSERT_EQ(wrong, 0u) << "mode '" << mode << "' replay " << replay;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
}

/* One group with a small message and then a large one to the same peer, in every mode: the
 * small one uses one lane (maco__p2p_msg_lanes) and every other lane skips it before carrying
 * its share of the large one. A kernel whose CTAs held only skipping items once ended after
 * the skip and left the large message on lane 0 alone (its other chunks never written). */
TEST_F(P2P, SmallThenLargeMessageOnOnePair)
{
    const int n = NRanks(), me = Rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    const size_t small = 37, large = 300001, at = 64; /* float32 elements; large from at */
    for (const char *mode : { "ll", "copy", "" }) {
        ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_SENDRECV, mode));
        ASSERT_NO_FATAL_FAILURE(Reserve((at + large) * 4));
        char *send = in_ + kGuard, *recv = out_ + kGuard;
        uint64_t seed = Seed(static_cast<uint64_t>(mode[0]));
        Poison();
        Fill(send, at + large, MACO_FLOAT32, seed);
        ASSERT_EQ(maco_group_start(), MACO_OK);
        ASSERT_EQ(maco_send(send, small, MACO_FLOAT32, next, Comm(), S()), MACO_OK);
        ASSERT_EQ(maco_send(send + at * 4, large, MACO_FLOAT32, next, Comm(), S()), MACO_OK);
        ASSERT_EQ(maco_recv(recv, small, MACO_FLOAT32, prev, Comm(), S()), MACO_OK);
        ASSERT_EQ(maco_recv(recv + at * 4, large, MACO_FLOAT32, prev, Comm(), S()), MACO_OK);
        ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(Comm());
        ExpectFrom(recv, small, MACO_FLOAT32, seed, prev, 0);
        ExpectFrom(recv + at * 4, large, MACO_FLOAT32, seed, prev, at);
        ExpectPoisonOutside({ { kGuard, small * 4 }, { kGuard + at * 4, large * 4 } });
        unsigned long long wrong = 1;
        ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
        ASSERT_EQ(wrong, 0u) << "mode '" << mode << "'";
        maco_status_t async_st = MACO_ERR_INTERNAL;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
        ASSERT_EQ(async_st, MACO_OK) << maco_comm_get_last_error(Comm());
    }
}

/* Many small calls back to back without host synchronisation: all-to-alls of changing size and
 * mode mixed with ring exchanges and allreduces; then one checked call of each. */
TEST_F(P2P, MixedCallsBackToBack)
{
    const int n = NRanks(), me = Rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    ASSERT_NO_FATAL_FAILURE(Reserve(static_cast<size_t>(n) * 80000 * 4 + 64));
    char *send = in_ + kGuard, *recv = out_ + kGuard;
    for (int i = 0; i < 90; i++) {
        size_t unit = (i % 3 == 0) ? 5 : (i % 3 == 1 ? 7000 : 80000);
        ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, kModes[i % 3]));
        ASSERT_EQ(maco_alltoall(send, recv, unit, MACO_FLOAT32, Comm(), S()), MACO_OK);
        ASSERT_EQ(maco_group_start(), MACO_OK);
        ASSERT_EQ(maco_send(send, unit, MACO_FLOAT32, next, Comm(), S()), MACO_OK);
        ASSERT_EQ(maco_recv(recv, unit, MACO_FLOAT32, prev, Comm(), S()), MACO_OK);
        ASSERT_EQ(maco_group_end(), MACO_OK);
        ASSERT_EQ(maco_allreduce(send, recv, unit, MACO_FLOAT32, MACO_SUM, Comm(), S()), MACO_OK);
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    ASSERT_NO_FATAL_FAILURE(Force(MACO_COLL_ALLTOALL, ""));
    uint64_t seed = Seed(5);
    Poison();
    Fill(send, 7000 * static_cast<size_t>(n), MACO_FLOAT32, seed);
    ASSERT_EQ(maco_alltoall(send, recv, 7000, MACO_FLOAT32, Comm(), S()), MACO_OK);
    CUDA_OK(maco_perf_check_coll(recv, 7000 * static_cast<size_t>(n), MACO_COLL_ALLTOALL,
                                 MACO_FLOAT32, MACO_SUM, 0, 7000, seed, me, n, &counters_[0],
                                 &counters_[1], stream_));
    unsigned long long wrong = 1;
    ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
    ASSERT_EQ(wrong, 0u);
}

/* Count 0 does nothing: an all-to-all of 0 elements and sends/receives of 0 elements next to
 * real ones leave the receive buffer as it was. */
TEST_F(P2P, ZeroCountsDoNothing)
{
    const int n = NRanks(), me = Rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    ASSERT_NO_FATAL_FAILURE(Reserve(4096));
    char *send = in_ + kGuard, *recv = out_ + kGuard;
    uint64_t seed = Seed(9);
    Poison();
    Fill(send, 100, MACO_FLOAT32, seed);
    ASSERT_EQ(maco_alltoall(send, recv, 0, MACO_FLOAT32, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_send(send, 0, MACO_FLOAT32, next, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_recv(recv, 0, MACO_FLOAT32, prev, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_group_start(), MACO_OK);
    ASSERT_EQ(maco_send(send, 0, MACO_FLOAT32, next, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_send(send, 100, MACO_FLOAT32, next, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_recv(recv + 1024, 0, MACO_FLOAT32, prev, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_recv(recv, 100, MACO_FLOAT32, prev, Comm(), S()), MACO_OK);
    ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(Comm());
    ExpectFrom(recv, 100, MACO_FLOAT32, seed, prev, 0);
    ExpectPoisonOutside({ { kGuard, 400 } });
    unsigned long long wrong = 1;
    ASSERT_NO_FATAL_FAILURE(Wrong(&wrong));
    ASSERT_EQ(wrong, 0u);
}

/* Bad input: MACO_ERR_INVALID_ARGUMENT naming the argument or the call, and nothing written
 * (no kernel runs: buffers keep their bytes). */
TEST_F(P2P, BadInputWritesNothing)
{
    const int n = NRanks(), me = Rank();
    ASSERT_NO_FATAL_FAILURE(Reserve(1 << 16));
    CUDA_OK(cudaMemset(out_, 0x5A, cap_ + 2 * kGuard));
    CUDA_OK(cudaMemset(in_, 0x5A, cap_ + 2 * kGuard));
    maco_test::AllowLog("maco_");
    char *o = out_ + kGuard, *i = in_ + kGuard;
    std::vector<size_t> c(static_cast<size_t>(n), 10), d(static_cast<size_t>(n));
    for (int q = 0; q < n; q++)
        d[static_cast<size_t>(q)] = static_cast<size_t>(q) * 10;
    std::vector<size_t> cbad = c;
    cbad[static_cast<size_t>(me)] = 9; /* receives less from itself than it sends */
    std::vector<size_t> dover = d;
    dover[0] = 5; /* receive blocks 0 and 1 overlap */
    struct Bad {
        std::function<maco_status_t()> call;
        const char *names;
    };
    const Bad bads[] = {
        { [&] { return maco_send(i, 10, MACO_FLOAT32, n, Comm(), S()); }, "peer" },
        { [&] { return maco_recv(o, 10, MACO_FLOAT32, -1, Comm(), S()); }, "peer" },
        { [&] { return maco_send(nullptr, 10, MACO_FLOAT32, 0, Comm(), S()); }, "NULL" },
        { [&] { return maco_recv(o, 10, static_cast<maco_datatype_t>(12), 0, Comm(), S()); },
          "datatype" },
        { [&] { return maco_send(i, SIZE_MAX / 2, MACO_FLOAT32, 0, Comm(), S()); }, "overflows" },
        { [&] { return maco_alltoall(i, i + 8, 10, MACO_FLOAT32, Comm(), S()); }, "overlap" },
        { [&] { return maco_alltoall(nullptr, o, 10, MACO_FLOAT32, Comm(), S()); }, "sendbuf" },
        { [&] {
             return maco_alltoallv(i, c.data(), nullptr, o, c.data(), d.data(), MACO_FLOAT32,
                                   Comm(), S());
         },
          "sdispls" },
        { [&] {
             return maco_alltoallv(i, c.data(), d.data(), o, cbad.data(), d.data(), MACO_FLOAT32,
                                   Comm(), S());
         },
          "receives" },
        { [&] {
             return maco_alltoallv(i, c.data(), d.data(), o, c.data(), dover.data(), MACO_FLOAT32,
                                   Comm(), S());
         },
          "overlaps" },
        /* A send to this rank with no matching receive (outside a group: a group of one). */
        { [&] { return maco_send(i, 10, MACO_FLOAT32, me, Comm(), S()); }, "no matching" },
        { [&] {
             maco_group_start();
             maco_send(i, 10, MACO_FLOAT32, me, Comm(), S());
             maco_recv(o, 11, MACO_FLOAT32, me, Comm(), S());
             return maco_group_end();
         },
          "matching send" },
        { [&] {
             maco_group_start();
             maco_recv(o, 10, MACO_FLOAT32, (me + 1) % n, Comm(), S());
             maco_recv(o + 20, 10, MACO_FLOAT32, (me + 1) % n, Comm(), S());
             return maco_group_end();
         },
          "overlaps" },
        { [&] {
             maco_group_start();
             maco_send(i, 10, MACO_FLOAT32, (me + 1) % n, Comm(), S());
             maco_send(i, 10, MACO_FLOAT32, (me + 1) % n, Comm(), S());
             maco_recv(o, 10, MACO_FLOAT32, 99, Comm(), S()); /* bad: fails the group */
             return maco_group_end();
         },
          "call 3 of the group (maco_recv)" },
    };
    for (const Bad &b : bads) {
        EXPECT_EQ(b.call(), MACO_ERR_INVALID_ARGUMENT) << b.names;
        std::vector<std::string> logged = maco_test::LoggedProblems();
        ASSERT_FALSE(logged.empty()) << b.names;
        EXPECT_NE(logged.back().find(b.names), std::string::npos) << logged.back();
    }
    EXPECT_EQ(maco_group_end(), MACO_ERR_INVALID_USAGE); /* no group left open */
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long init = 0, res = 1;
    CUDA_OK(cudaMemcpy(counters_, &init, sizeof(init), cudaMemcpyHostToDevice));
    CUDA_OK(maco_perf_check_bytes(out_, cap_ + 2 * kGuard, 0x5A, &counters_[0], nullptr));
    CUDA_OK(maco_perf_check_bytes(in_, cap_ + 2 * kGuard, 0x5A, &counters_[0], nullptr));
    CUDA_OK(cudaMemcpy(&res, counters_, sizeof(res), cudaMemcpyDeviceToHost));
    EXPECT_EQ(res, 0u) << "bytes changed by rejected calls";
    /* The communicator still works. */
    maco_status_t async_st;
    ASSERT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
    EXPECT_EQ(async_st, MACO_OK);
}

/* A receive whose count differs from its send's: the receiver reports both counts through
 * the asynchronous error and writes nothing of that message; the sender finishes. Each case
 * on its own communicator (the error fails it). */
TEST_F(P2P, MismatchedCountsReportedByTheReceiver)
{
    if (NRanks() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    const int me = Rank();
    /* LL (small) and copy (large) messages; receiver short by one element, or long. */
    const struct {
        size_t send, recv;
    } cases[] = { { 100, 99 }, { 1000000, 999999 }, { 5000, 5001 }, { 2049, 2048 } };
    /* The last: 8196 bytes take 2 lanes (maco__p2p_msg_lanes), 8192 one; the sender's second
     * lane is never read and the receiver's first reports the mismatch. */
    ASSERT_NO_FATAL_FAILURE(Reserve(1000001 * 4));
    for (const auto &k : cases) {
        maco_comm_t comm;
        ASSERT_EQ(maco_comm_create(Bootstrap(), -1, &comm), MACO_OK);
        maco_test::AllowLog("count");
        char *send = in_ + kGuard, *recv = out_ + kGuard;
        Poison();
        Fill(send, k.send, MACO_FLOAT32, Seed(k.send));
        if (me == 0) {
            ASSERT_EQ(maco_send(send, k.send, MACO_FLOAT32, 1, comm, S()), MACO_OK);
        }
        if (me == 1) {
            ASSERT_EQ(maco_recv(recv, k.recv, MACO_FLOAT32, 0, comm, S()), MACO_OK);
        }
        CUDA_OK(cudaStreamSynchronize(stream_));
        if (me == 1) {
            /* Nothing written, and the failed communicator refuses new work. */
            ASSERT_NO_FATAL_FAILURE(ExpectMismatchReported(comm, "maco_recv", k.recv, k.send * 4,
                                                           out_, cap_ + 2 * kGuard));
            maco_test::AllowLog("has failed");
            EXPECT_EQ(maco_recv(recv, 1, MACO_FLOAT32, 0, comm, S()), MACO_ERR_INVALID_USAGE);
        } else {
            ASSERT_NO_FATAL_FAILURE(ExpectNoAsyncError(comm));
        }
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        ASSERT_EQ(maco_comm_destroy(comm), MACO_OK);
    }
    /* All-to-allv: rank 1 expects one element more from rank 0 than rank 0 sends; the other
     * blocks arrive, that one stays poison. */
    {
        const int n = NRanks();
        maco_comm_t comm;
        ASSERT_EQ(maco_comm_create(Bootstrap(), -1, &comm), MACO_OK);
        std::vector<size_t> sc(static_cast<size_t>(n), 50), d(static_cast<size_t>(n));
        for (int q = 0; q < n; q++)
            d[static_cast<size_t>(q)] = static_cast<size_t>(q) * 64;
        std::vector<size_t> rc = sc;
        if (me == 1)
            rc[0] = 51;
        char *send = in_ + kGuard, *recv = out_ + kGuard;
        uint64_t seed = Seed(3);
        Poison();
        Fill(send, static_cast<size_t>(n) * 64, MACO_FLOAT32, seed);
        ASSERT_EQ(maco_alltoallv(send, sc.data(), d.data(), recv, rc.data(), d.data(), MACO_FLOAT32,
                                 comm, S()),
                  MACO_OK);
        std::vector<std::pair<size_t, size_t>> blocks;
        for (int q = 0; q < n; q++) {
            if (me == 1 && q == 0)
                continue;
            ExpectFrom(recv + d[static_cast<size_t>(q)] * 4, 50, MACO_FLOAT32, seed, q,
                       static_cast<size_t>(me) * 64);
            blocks.emplace_back(kGuard + d[static_cast<size_t>(q)] * 4, 200);
        }
        ExpectPoisonOutside(blocks);
        CUDA_OK(cudaStreamSynchronize(stream_));
        unsigned long long res[2];
        CUDA_OK(cudaMemcpy(res, counters_, sizeof(res), cudaMemcpyDeviceToHost));
        EXPECT_EQ(res[0], 0u);
        maco_status_t async_st = MACO_OK;
        ASSERT_EQ(maco_comm_get_async_error(comm, &async_st), MACO_OK);
        if (me == 1) {
            EXPECT_EQ(async_st, MACO_ERR_INVALID_ARGUMENT);
            std::string msg = maco_comm_get_last_error(comm);
            EXPECT_NE(msg.find("maco_alltoallv of 51 elements"), std::string::npos) << msg;
            EXPECT_NE(msg.find("from rank 0"), std::string::npos) << msg;
        } else {
            EXPECT_EQ(async_st, MACO_OK) << maco_comm_get_last_error(comm);
        }
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        ASSERT_EQ(maco_comm_destroy(comm), MACO_OK);
    }
}

/* Two messages to one peer in a group, the first with counts whose lanes differ (2049 floats
 * take 2 lanes, 2048 one): the receiver's second lane, which skips the first message, meets
 * a chunk of it and must not take it for the second; every lane that reports names the first
 * message's counts. The second message's lanes 2.. may still deliver its own chunks. */
TEST_F(P2P, MismatchThatChangesTheLanesNamesItsMessage)
{
    if (NRanks() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    const int me = Rank();
    const size_t small_send = 2049, small_recv = 2048, big = 5000; /* float32 elements */
    ASSERT_NO_FATAL_FAILURE(Reserve((small_send + big + 64) * 4));
    maco_comm_t comm;
    ASSERT_EQ(maco_comm_create(Bootstrap(), -1, &comm), MACO_OK);
    maco_test::AllowLog("count");
    char *send = in_ + kGuard, *recv = out_ + kGuard;
    Poison();
    Fill(send, small_send + big + 64, MACO_FLOAT32, Seed(7));
    ASSERT_EQ(maco_group_start(), MACO_OK);
    if (me == 0) {
        ASSERT_EQ(maco_send(send, small_send, MACO_FLOAT32, 1, comm, S()), MACO_OK);
        ASSERT_EQ(maco_send(send + (small_send + 64) * 4, big, MACO_FLOAT32, 1, comm, S()),
                  MACO_OK);
    }
    if (me == 1) {
        ASSERT_EQ(maco_recv(recv, small_recv, MACO_FLOAT32, 0, comm, S()), MACO_OK);
        ASSERT_EQ(maco_recv(recv + (small_send + 64) * 4, big, MACO_FLOAT32, 0, comm, S()),
                  MACO_OK);
    }
    ASSERT_EQ(maco_group_end(), MACO_OK) << maco_comm_get_last_error(comm);
    CUDA_OK(cudaStreamSynchronize(stream_));
    if (me == 1) {
        /* Nothing of the mismatched message was written. */
        ASSERT_NO_FATAL_FAILURE(ExpectMismatchReported(comm, "maco_recv", small_recv,
                                                       small_send * 4, recv, small_send * 4));
    } else {
        ASSERT_NO_FATAL_FAILURE(ExpectNoAsyncError(comm));
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    ASSERT_EQ(maco_comm_destroy(comm), MACO_OK);
}

/* A receive whose sender never sends ends after MACO_DEVICE_TIMEOUT with MACO_ERR_TIMEOUT
 * naming the peer; nothing hangs. Its own communicator with a 1 s bound. */
TEST_F(P2P, MissingSendTimesOutNamingThePeer)
{
    if (NRanks() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    setenv("MACO_DEVICE_TIMEOUT", "1s", 1);
    maco_comm_t comm;
    ASSERT_EQ(maco_comm_create(Bootstrap(), -1, &comm), MACO_OK);
    unsetenv("MACO_DEVICE_TIMEOUT");
    ASSERT_NO_FATAL_FAILURE(Reserve(4096));
    /* Across nodes the first message between two ranks connects them (blocking until the
     * peer's matching call, bounded by MACO_BOOTSTRAP_TIMEOUT): one message first, so the
     * missing send below is the kernel's wait. */
    if (Rank() == 0) {
        ASSERT_EQ(maco_send(in_, 1, MACO_FLOAT32, 1, comm, S()), MACO_OK);
    } else if (Rank() == 1) {
        ASSERT_EQ(maco_recv(out_ + kGuard, 1, MACO_FLOAT32, 0, comm, S()), MACO_OK);
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    if (Rank() == 1) {
        maco_test::AllowLog("timed out");
        auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(maco_recv(out_ + kGuard, 100, MACO_FLOAT32, 0, comm, S()), MACO_OK);
        CUDA_OK(cudaStreamSynchronize(stream_));
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_GE(s, 0.9);
        EXPECT_LT(s, 20.0);
        maco_status_t async_st = MACO_OK;
        ASSERT_EQ(maco_comm_get_async_error(comm, &async_st), MACO_OK);
        EXPECT_EQ(async_st, MACO_ERR_TIMEOUT);
        std::string msg = maco_comm_get_last_error(comm);
        EXPECT_NE(msg.find("waited for rank 0"), std::string::npos) << msg;
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    ASSERT_EQ(maco_comm_destroy(comm), MACO_OK);
}

} // namespace
