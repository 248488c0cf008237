/*
 * test_allreduce_gpu.cc - maco_allreduce on real GPUs: every algorithm, both types, in and
 * out of place, aligned and misaligned buffers, sizes from 1 element to 100 MB, CUDA graph
 * replays. Every output element is compared bitwise with the rank-ordered float32 sum of
 * freshly drawn inputs (perf_kernels.h); outputs and guards are poisoned first.
 */
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_case.h"
#include "maco_test.h"
#include "tools/perf_kernels.h"

namespace
{

using namespace maco_test;

class Allreduce : public maco_test::BufferCase
{
  protected:
    void TearDown() override
    {
        maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE, nullptr);
        maco_test::BufferCase::TearDown();
    }

    /* One checked allreduce; returns wrong elements + damaged guard bytes on this rank. */
    void RunOne(maco_datatype_t dt, size_t count, bool inplace, size_t skew_elems,
                unsigned long long *wrong)
    {
        size_t esz = maco_datatype_size(dt);
        size_t bytes = count * esz;
        ASSERT_NO_FATAL_FAILURE(Reserve(bytes + 64));
        int code = dt == MACO_BFLOAT16 ? MACO_PERF_BF16 : MACO_PERF_F32;
        uint64_t seed =
            seed_ ^ (count * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(round_++) << 48);
        char *out = out_ + kGuard + skew_elems * esz;
        char *in = inplace ? out : in_ + kGuard + skew_elems * esz;
        CUDA_OK(cudaMemsetAsync(out_, 0xFF, cap_ + 2 * kGuard, stream_));
        CUDA_OK(maco_perf_fill(in, count, code, seed, Rank(), stream_));
        unsigned long long init[2] = { 0, ~0ull };
        CUDA_OK(cudaMemcpyAsync(counters_, init, sizeof(init), cudaMemcpyHostToDevice, stream_));
        maco_status_t st =
            maco_allreduce(in, out, count, dt, MACO_SUM, Comm(), (maco_stream_t)stream_);
        ASSERT_EQ(st, MACO_OK) << maco_comm_get_last_error(Comm());
        CUDA_OK(maco_perf_check_sum(out, count, code, seed, NRanks(), &counters_[0], &counters_[1],
                                    stream_));
        /* Guards before and after the output must still hold the poison. */
        CUDA_OK(
            maco_perf_check_bytes(out_, kGuard + skew_elems * esz, 0xFF, &counters_[0], stream_));
        CUDA_OK(maco_perf_check_bytes(out + bytes, kGuard, 0xFF, &counters_[0], stream_));
        unsigned long long res[2];
        ASSERT_NO_FATAL_FAILURE(ReadCounters(res));
        *wrong = res[0];
        if (res[0] != 0 && res[1] != ~0ull) {
            uint32_t want = maco_perf_expected_bits_host(res[1], code, seed, NRanks());
            uint32_t got = 0;
            cudaMemcpy(&got, out + res[1] * esz, esz, cudaMemcpyDeviceToHost);
            ADD_FAILURE() << "first wrong element " << res[1] << ": got 0x" << std::hex << got
                          << ", want 0x" << want;
        }
    }

    int round_ = 0;
};

struct Case {
    const char *algo; /* "" = automatic */
    maco_datatype_t dt;
};

TEST_F(Allreduce, EveryAlgorithmTypeSizePlacementAndAlignment)
{
    const size_t counts[] = { 1,
                              2,
                              3,
                              5,
                              8,
                              17,
                              255,
                              1000,
                              4099,
                              32768,
                              65537,
                              262147,
                              (size_t)1 << 20,
                              ((size_t)3 << 20) + 5 };
    const Case cases[] = { { "", MACO_BFLOAT16 },           { "", MACO_FLOAT32 },
                           { "oneshot_ll", MACO_BFLOAT16 }, { "oneshot_ll", MACO_FLOAT32 },
                           { "rsag", MACO_BFLOAT16 },       { "rsag", MACO_FLOAT32 },
                           { "twoshot_ll", MACO_BFLOAT16 }, { "twoshot_ll", MACO_FLOAT32 } };
    for (const Case &c : cases) {
        if (c.algo[0])
            ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE, c.algo), MACO_OK);
        else
            ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE, nullptr), MACO_OK);
        for (size_t count : counts) {
            size_t bytes = count * maco_datatype_size(c.dt);
            if (strcmp(c.algo, "oneshot_ll") == 0 && bytes > maco_test::LLMax(NRanks()))
                continue; /* beyond MACO_ALLREDUCE_ONESHOT_MAX (its default) */
            if (strcmp(c.algo, "twoshot_ll") == 0 &&
                !maco_test::TwoShotFits(count, maco_datatype_size(c.dt), NRanks()))
                continue;
            for (int inplace = 0; inplace < 2; inplace++) {
                for (size_t skew : { (size_t)0, (size_t)1 }) {
                    unsigned long long wrong = 1;
                    ASSERT_NO_FATAL_FAILURE(RunOne(c.dt, count, inplace, skew, &wrong));
                    ASSERT_EQ(wrong, 0u)
                        << "algorithm '" << c.algo << "', " << maco_datatype_name(c.dt)
                        << ", count " << count << (inplace ? ", in place" : ", out of place")
                        << ", skew " << skew << " element(s)";
                }
            }
        }
    }
}

/* The checker itself: one corrupted element (and one guard byte) must be counted. */
TEST_F(Allreduce, CheckerCountsACorruptedElementAndGuardByte)
{
    const size_t count = 5000;
    unsigned long long wrong = 1;
    ASSERT_NO_FATAL_FAILURE(RunOne(MACO_FLOAT32, count, false, 0, &wrong));
    ASSERT_EQ(wrong, 0u);
    char *out = out_ + kGuard;
    uint64_t seed =
        seed_ ^ (count * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(round_ - 1) << 48);
    float bad = 12345.0f;
    CUDA_OK(cudaMemcpy(out + 777 * sizeof(float), &bad, sizeof(bad), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(out + count * sizeof(float) + 3, 0x00, 1));
    unsigned long long init[2] = { 0, ~0ull }, res[2];
    CUDA_OK(cudaMemcpy(counters_, init, sizeof(init), cudaMemcpyHostToDevice));
    CUDA_OK(maco_perf_check_sum(out, count, MACO_PERF_F32, seed, NRanks(), &counters_[0],
                                &counters_[1], nullptr));
    CUDA_OK(
        maco_perf_check_bytes(out + count * sizeof(float), kGuard, 0xFF, &counters_[0], nullptr));
    CUDA_OK(cudaMemcpy(res, counters_, sizeof(res), cudaMemcpyDeviceToHost));
    EXPECT_EQ(res[0], 2u);
    EXPECT_EQ(res[1], 777u);
}

TEST_F(Allreduce, LargeMessages)
{
    for (size_t count : { ((size_t)25 << 20) + 7, (size_t)64 << 20 }) {
        unsigned long long wrong = 1;
        ASSERT_NO_FATAL_FAILURE(RunOne(MACO_BFLOAT16, count, false, 0, &wrong));
        ASSERT_EQ(wrong, 0u) << "bfloat16 count " << count;
        ASSERT_NO_FATAL_FAILURE(RunOne(MACO_FLOAT32, count, true, 0, &wrong));
        ASSERT_EQ(wrong, 0u) << "float32 in place count " << count;
    }
}

/* Many back-to-back calls of alternating algorithms without host synchronisation: packet
 * flags and semaphore counts must stay in step. */
TEST_F(Allreduce, BackToBackCallsStayInStep)
{
    const size_t count = 40000; /* 80 KB bf16: oneshot_ll by default */
    ASSERT_NO_FATAL_FAILURE(Reserve(count * 4 + 64));
    for (int i = 0; i < 50; i++) {
        ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE,
                                                i % 3 == 2 ? "rsag"
                                                : i % 3    ? "twoshot_ll"
                                                           : "oneshot_ll"),
                  MACO_OK);
        ASSERT_EQ(maco_allreduce(in_, out_, count, MACO_BFLOAT16, MACO_SUM, Comm(),
                                 (maco_stream_t)stream_),
                  MACO_OK);
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE, nullptr), MACO_OK);
    for (int i = 0; i < 3; i++) {
        unsigned long long wrong = 1;
        ASSERT_NO_FATAL_FAILURE(RunOne(MACO_BFLOAT16, count, i == 1, 0, &wrong));
        ASSERT_EQ(wrong, 0u) << "after back-to-back calls, round " << i;
    }
}

/* Captured once, replayed many times: per-launch state lives on the device. */
TEST_F(Allreduce, CudaGraphReplays)
{
    for (const char *algo : { "oneshot_ll", "rsag", "twoshot_ll" }) {
        ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE, algo), MACO_OK);
        const size_t count = 12345;
        ASSERT_NO_FATAL_FAILURE(Reserve(count * 4 + 64));
        uint64_t seed = seed_ ^ 0x6772617068ull;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        cudaMemsetAsync(out_, 0xFF, count * 4 + kGuard, stream_);
        maco_perf_fill(in_, count, MACO_PERF_F32, seed, Rank(), stream_);
        maco_status_t st = maco_allreduce(in_, out_, count, MACO_FLOAT32, MACO_SUM, Comm(),
                                          (maco_stream_t)stream_);
        CUDA_OK(cudaStreamEndCapture(stream_, &graph));
        ASSERT_EQ(st, MACO_OK);
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        for (int replay = 0; replay < 20; replay++) {
            unsigned long long init[2] = { 0, ~0ull }, res[2];
            CUDA_OK(cudaGraphLaunch(exec, stream_));
            CUDA_OK(
                cudaMemcpyAsync(counters_, init, sizeof(init), cudaMemcpyHostToDevice, stream_));
            CUDA_OK(maco_perf_check_sum(out_, count, MACO_PERF_F32, seed, NRanks(), &counters_[0],
                                        &counters_[1], stream_));
            ASSERT_NO_FATAL_FAILURE(ReadCounters(res));
            ASSERT_EQ(res[0], 0u) << algo << " replay " << replay << ", first wrong " << res[1];
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
}

TEST_F(Allreduce, BadArgumentsAreRejectedBeforeAnythingRuns)
{
    ASSERT_NO_FATAL_FAILURE(Reserve(1024));
    maco_test::AllowLog("maco_allreduce");
    maco_test::AllowLog("MACO_ALGO_ALLREDUCE");
    EXPECT_EQ(maco_allreduce(nullptr, out_, 4, MACO_FLOAT32, MACO_SUM, Comm(), nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_allreduce(in_, out_, SIZE_MAX / 2, MACO_FLOAT32, MACO_SUM, Comm(), nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(
        maco_allreduce(in_, out_, 4, static_cast<maco_datatype_t>(99), MACO_SUM, Comm(), nullptr),
        MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(
        maco_allreduce(in_, out_, 4, MACO_FLOAT32, static_cast<maco_redop_t>(-1), Comm(), nullptr),
        MACO_ERR_INVALID_ARGUMENT);
    maco_test::AllowLog("maco_collective_set_algorithm");
    EXPECT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE, "ring"),
              MACO_ERR_UNSUPPORTED);
    /* MACO_ALGO_* is read when the communicator is created, not on every call. */
    const char *name = nullptr;
    setenv("MACO_ALGO_ALLREDUCE", "rsag", 1);
    EXPECT_EQ(maco_collective_get_algorithm(Comm(), MACO_COLL_ALLREDUCE, 4, MACO_FLOAT32, &name),
              MACO_OK);
    EXPECT_STREQ(name, "oneshot_ll");
    unsetenv("MACO_ALGO_ALLREDUCE");
    ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE, "oneshot_ll"), MACO_OK);
    EXPECT_EQ(maco_allreduce(in_, out_, 1 << 20, MACO_FLOAT32, MACO_SUM, Comm(), nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(maco_collective_set_algorithm(Comm(), MACO_COLL_ALLREDUCE, nullptr), MACO_OK);
    EXPECT_EQ(maco_allreduce(in_, out_, 0, MACO_FLOAT32, MACO_SUM, Comm(), nullptr), MACO_OK);
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, true, true);
}
