/*
 * test_plan_gpu.cc - the shipped plans (algorithms/plans, the <algo>_<n>r.json files) run by the
 * executor (maco_plan_execute) on real GPUs, against the native collective on the same inputs:
 * every plan at odd and large counts, int32 and float32 (values that sum exactly, so any
 * reduction order gives the same bits), sum, max and avg; a CUDA graph captured once and
 * replayed with new inputs; and the executor's argument errors. Run under maco-run with 2,
 * 4 and 8 ranks (on one GPU, through MPS). With PLAN_TEST_SHAPE=2x2 (a test variable) it runs
 * the <algo>_2x2.json plans instead (memory channels inside a node, port channels between
 * nodes), with 4 ranks as 2 simulated nodes (maco-run --simulate-nodes 2), where the native
 * collectives are the hier ones.
 */
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "maco_test.h"

#ifndef PLAN_DIR
#error "PLAN_DIR must name algorithms/plans"
#endif

namespace
{

using namespace maco_test;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

/* The plan of `algo` for n ranks on one node, or for the shape PLAN_TEST_SHAPE names. */
std::string PlanPath(const std::string &algo, int n, bool shaped = true)
{
    const char *shape = shaped ? std::getenv("PLAN_TEST_SHAPE") : nullptr;
    if (shape != nullptr && shape[0] != '\0')
        return std::string(PLAN_DIR) + "/" + algo + "_" + shape + ".json";
    return std::string(PLAN_DIR) + "/" + algo + "_" + std::to_string(n) + "r.json";
}

class Plans : public Test
{
  protected:
    void SetUp() override
    {
        Test::SetUp();
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    }
    void TearDown() override
    {
        EXPECT_EQ(maco_plan_destroy(plan_), MACO_OK);
        cudaFree(send_);
        cudaFree(recv_);
        cudaFree(ref_);
        cudaStreamDestroy(stream_);
        Test::TearDown();
    }

    void Load(const std::string &algo)
    {
        ASSERT_EQ(maco_plan_load(Comm(), PlanPath(algo, NRanks()).c_str(), &plan_), MACO_OK)
            << maco_comm_get_last_error(Comm());
    }

    /* Buffers for `count` (the unit) of 4-byte elements of `coll`; fills the input with
     * small integers (as int32 or float32) that depend on rank, index and `salt`. */
    void Prepare(maco_collective_t coll, size_t count, maco_datatype_t dt, int salt)
    {
        size_t n = static_cast<size_t>(NRanks());
        send_n_ = coll == MACO_COLL_REDUCE_SCATTER ? n * count : count;
        recv_n_ = coll == MACO_COLL_ALLGATHER ? n * count : count;
        cudaFree(send_);
        cudaFree(recv_);
        cudaFree(ref_);
        send_ = recv_ = ref_ = nullptr;
        CUDA_OK(cudaMalloc(&send_, send_n_ * 4));
        CUDA_OK(cudaMalloc(&recv_, recv_n_ * 4 + 64));
        CUDA_OK(cudaMalloc(&ref_, recv_n_ * 4));
        /* On stream_: the executor runs there, and a non-blocking stream is not ordered after
         * cudaMemset or a pageable cudaMemcpy's DMA (the first GPU run showed stale inputs). */
        CUDA_OK(cudaMemsetAsync(recv_, 0xab, recv_n_ * 4 + 64, stream_));
        Fill(dt, salt);
    }
    void Fill(maco_datatype_t dt, int salt)
    {
        std::vector<uint32_t> h(send_n_);
        for (size_t i = 0; i < send_n_; i++) {
            int v = static_cast<int>(
                        (i * 7 + static_cast<size_t>(Rank()) * 13 + static_cast<size_t>(salt) * 5) %
                        17) -
                    8;
            if (dt == MACO_FLOAT32) {
                float f = static_cast<float>(v);
                std::memcpy(&h[i], &f, 4);
            } else {
                h[i] = static_cast<uint32_t>(v);
            }
        }
        CUDA_OK(cudaMemcpyAsync(send_, h.data(), send_n_ * 4, cudaMemcpyHostToDevice, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
    }

    /* The native collective into ref_. */
    void Native(maco_collective_t coll, size_t count, maco_datatype_t dt, maco_redop_t op)
    {
        maco_status_t st = MACO_OK;
        if (coll == MACO_COLL_ALLREDUCE)
            st = maco_allreduce(send_, ref_, count, dt, op, Comm(), stream_);
        else if (coll == MACO_COLL_ALLGATHER)
            st = maco_allgather(send_, ref_, count, dt, Comm(), stream_);
        else
            st = maco_reduce_scatter(send_, ref_, count, dt, op, Comm(), stream_);
        ASSERT_EQ(st, MACO_OK) << maco_comm_get_last_error(Comm());
    }

    /* recv_ == ref_ bitwise, and the guard after recv_ untouched. */
    void Compare(const std::string &what)
    {
        CUDA_OK(cudaStreamSynchronize(stream_));
        maco_status_t async_st;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
        ASSERT_EQ(async_st, MACO_OK) << maco_comm_get_last_error(Comm());
        std::vector<uint32_t> got(recv_n_ + 16), want(recv_n_);
        CUDA_OK(cudaMemcpy(got.data(), recv_, recv_n_ * 4 + 64, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(want.data(), ref_, recv_n_ * 4, cudaMemcpyDeviceToHost));
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < recv_n_; i++)
            if (got[i] != want[i] && wrong++ == 0)
                first = i;
        EXPECT_EQ(wrong, 0u) << what << ": first wrong element " << first << ": got 0x" << std::hex
                             << got[first] << ", native 0x" << want[first];
        for (size_t i = recv_n_; i < recv_n_ + 16; i++)
            ASSERT_EQ(got[i], 0xababababu) << what << ": wrote past recvbuf";
    }

    void Check(const std::string &algo, maco_collective_t coll)
    {
        ASSERT_NO_FATAL_FAILURE(Load(algo));
        const size_t counts[] = { 1, 3, 1001, 65537, (size_t)2 << 20 | 5 };
        struct {
            maco_datatype_t dt;
            maco_redop_t op;
        } kinds[] = { { MACO_INT32, MACO_SUM },
                      { MACO_FLOAT32, MACO_SUM },
                      { MACO_INT32, MACO_MAX },
                      { MACO_FLOAT32, MACO_AVG } };
        int salt = 0;
        for (size_t count : counts)
            for (auto k : kinds) {
                if (coll == MACO_COLL_ALLGATHER && k.op != MACO_SUM)
                    continue;
                std::string what = algo + " count " + std::to_string(count) + " " +
                                   maco_datatype_name(k.dt) + " " + maco_redop_name(k.op);
                ASSERT_NO_FATAL_FAILURE(Prepare(coll, count, k.dt, ++salt));
                ASSERT_EQ(
                    maco_plan_execute(plan_, send_, recv_, count, k.dt, k.op, Comm(), stream_),
                    MACO_OK)
                    << maco_comm_get_last_error(Comm());
                ASSERT_NO_FATAL_FAILURE(Native(coll, count, k.dt, k.op));
                ASSERT_NO_FATAL_FAILURE(Compare(what));
            }
    }

    maco_plan_t plan_ = nullptr;
    cudaStream_t stream_ = nullptr;
    void *send_ = nullptr, *recv_ = nullptr, *ref_ = nullptr;
    size_t send_n_ = 0, recv_n_ = 0;
};

TEST_F(Plans, AllreduceOneShotLL)
{
    Check("allreduce_oneshot_ll", MACO_COLL_ALLREDUCE);
}

TEST_F(Plans, AllreduceRsag)
{
    Check("allreduce_rsag", MACO_COLL_ALLREDUCE);
}

TEST_F(Plans, Allgather)
{
    Check("allgather", MACO_COLL_ALLGATHER);
}

TEST_F(Plans, ReduceScatter)
{
    Check("reduce_scatter", MACO_COLL_REDUCE_SCATTER);
}

/* Captured once, replayed with new inputs: per-launch state (LL flags, barrier counts) lives
 * on the device. */
TEST_F(Plans, GraphReplay)
{
    for (const char *algo : { "allreduce_oneshot_ll", "allreduce_rsag" }) {
        maco_plan_destroy(plan_);
        plan_ = nullptr;
        ASSERT_NO_FATAL_FAILURE(Load(algo));
        const size_t count = 12345;
        ASSERT_NO_FATAL_FAILURE(Prepare(MACO_COLL_ALLREDUCE, count, MACO_INT32, 1));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        ASSERT_EQ(
            maco_plan_execute(plan_, send_, recv_, count, MACO_INT32, MACO_SUM, Comm(), stream_),
            MACO_OK);
        CUDA_OK(cudaStreamEndCapture(stream_, &graph));
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 4; rep++) {
            ASSERT_NO_FATAL_FAILURE(Fill(MACO_INT32, 100 + rep));
            CUDA_OK(cudaGraphLaunch(exec, stream_));
            ASSERT_NO_FATAL_FAILURE(Native(MACO_COLL_ALLREDUCE, count, MACO_INT32, MACO_SUM));
            ASSERT_NO_FATAL_FAILURE(
                Compare(std::string(algo) + " graph replay " + std::to_string(rep)));
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
}

TEST_F(Plans, Errors)
{
    AllowLog("maco_plan_load");
    AllowLog("maco_plan_execute");
    maco_plan_t p = nullptr;
    /* A plan for another world size. */
    int other = NRanks() == 8 ? 2 : 8;
    EXPECT_EQ(maco_plan_load(Comm(), PlanPath("allgather", other, false).c_str(), &p),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_comm_get_last_error(Comm()))
                  .find("plan for " + std::to_string(other) + " ranks"),
              std::string::npos);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(maco_plan_load(Comm(), "/nonexistent.json", &p), MACO_ERR_INVALID_ARGUMENT);
    ASSERT_NO_FATAL_FAILURE(Load("allgather"));
    ASSERT_NO_FATAL_FAILURE(Prepare(MACO_COLL_ALLGATHER, 8, MACO_INT32, 0));
    /* Larger than MACO_PLAN_MAX_BYTES (32M by default). */
    EXPECT_EQ(maco_plan_execute(plan_, send_, recv_, (size_t)64 << 20, MACO_INT32, MACO_SUM, Comm(),
                                stream_),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_plan_execute(plan_, nullptr, recv_, 8, MACO_INT32, MACO_SUM, Comm(), stream_),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(
        maco_plan_execute(plan_, send_, recv_, 8, (maco_datatype_t)99, MACO_SUM, Comm(), stream_),
        MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_plan_execute(nullptr, send_, recv_, 8, MACO_INT32, MACO_SUM, Comm(), stream_),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_plan_execute(plan_, send_, recv_, 0, MACO_INT32, MACO_SUM, Comm(), stream_),
              MACO_OK);
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, true, true);
}
