/*
 * test_gpu_1proc.cc - one process driving two GPUs: two threads, each a rank with its own
 * communicator and device, over a bootstrap from a unique id. Memory registered by one is
 * imported by the other as the owner's own pointer (peer access, no IPC), channels carry
 * puts both ways, and allreduce runs between the two in-process ranks.
 * Skips (exit 77, reason printed) with fewer than 2 GPUs.
 */
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "maco_test.h"
#include "tools/perf_kernels.h"
#include "test_kernels.h"

namespace
{

struct RankResult {
    std::string error; /* empty when everything passed */
};

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            char buf_[512];                                                                        \
            snprintf(buf_, sizeof(buf_), __VA_ARGS__);                                             \
            res->error = buf_;                                                                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

void RunRank(const maco_unique_id_t *id, int rank, uint64_t seed, RankResult *res)
{
    const int n = 2;
    CHECK(cudaSetDevice(rank) == cudaSuccess, "cudaSetDevice(%d)", rank);
    maco_bootstrap_t bs;
    CHECK(maco_bootstrap_create(id, rank, n, 30000, &bs) == MACO_OK, "rank %d: bootstrap", rank);
    maco_comm_t comm;
    CHECK(maco_comm_create(bs, rank, &comm) == MACO_OK, "rank %d: comm: %s", rank,
          maco_comm_get_last_error(nullptr));
    int dev = -1;
    maco_comm_get_cuda_device(comm, &dev);
    CHECK(dev == rank, "rank %d got device %d", rank, dev);
    cudaSetDevice(dev);
    /* One buffer from cudaMalloc, one from maco_mem_alloc; each 2 slots of kSlot bytes. */
    const size_t kSlot = (4 << 20) + 13;
    char *bufs[2] = { nullptr, nullptr };
    CHECK(cudaMalloc(&bufs[0], 2 * kSlot) == cudaSuccess, "cudaMalloc");
    void *p = nullptr;
    CHECK(maco_mem_alloc(comm, 2 * kSlot, &p) == MACO_OK, "maco_mem_alloc: %s",
          maco_comm_get_last_error(comm));
    bufs[1] = static_cast<char *>(p);
    int *status;
    unsigned long long *wrong;
    cudaMalloc(&status, 2 * sizeof(int));
    cudaMalloc(&wrong, sizeof(unsigned long long));
    for (int b = 0; b < 2; b++) {
        maco_mem_t mine, theirs;
        CHECK(maco_mem_register(comm, bufs[b], 2 * kSlot, &mine) == MACO_OK, "register: %s",
              maco_comm_get_last_error(comm));
        uint8_t handles[2][MACO_MEM_HANDLE_BYTES];
        maco_mem_serialize(mine, handles[rank]);
        CHECK(maco_bootstrap_allgather(bs, handles, MACO_MEM_HANDLE_BYTES) == MACO_OK, "allgather");
        CHECK(maco_mem_import(comm, handles[1 - rank], &theirs) == MACO_OK, "rank %d: import: %s",
              rank, maco_comm_get_last_error(comm));
        void *tp;
        maco_mem_get_pointer(theirs, &tp);
        void *peer_buf_ptr = nullptr;
        std::memcpy(&peer_buf_ptr, &handles[1 - rank][56], sizeof(void *));
        CHECK(tp == peer_buf_ptr, "same-process import must give the owner's pointer");
        maco_memory_channel_t ch;
        CHECK(maco_memory_channel_create(comm, 1 - rank, mine, theirs, &ch) == MACO_OK, "channel");
        maco_memory_channel_device_t h[2];
        memset(h, 0, sizeof(h));
        maco_memory_channel_get_device_handle(ch, &h[1 - rank]);
        maco_memory_channel_device_t *dh;
        cudaMalloc(&dh, sizeof(h));
        cudaMemcpy(dh, h, sizeof(h), cudaMemcpyHostToDevice);
        uint64_t pseed = seed + static_cast<uint64_t>(b * 2 + rank);
        cudaMemset(bufs[b], 0xAB, 2 * kSlot);
        test_fill_pattern(bufs[b] + static_cast<size_t>(rank) * kSlot, kSlot, pseed, nullptr);
        cudaDeviceSynchronize();
        CHECK(maco_bootstrap_barrier(bs) == MACO_OK, "barrier");
        size_t off = static_cast<size_t>(rank) * kSlot;
        CHECK(test_put_all(dh, n, rank, off, off, kSlot, status, nullptr) == cudaSuccess, "launch");
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
        int st[2];
        cudaMemcpy(st, status, sizeof(st), cudaMemcpyDeviceToHost);
        CHECK(st[1 - rank] == MACO_OK, "rank %d: wait status %d", rank, st[1 - rank]);
        unsigned long long zero = 0, bad = 1;
        cudaMemcpy(wrong, &zero, sizeof(zero), cudaMemcpyHostToDevice);
        test_count_pattern_mismatch(bufs[b] + static_cast<size_t>(1 - rank) * kSlot, kSlot,
                                    seed + static_cast<uint64_t>(b * 2 + 1 - rank), 0, wrong,
                                    nullptr);
        cudaMemcpy(&bad, wrong, sizeof(bad), cudaMemcpyDeviceToHost);
        CHECK(bad == 0, "rank %d, buffer %d: %llu wrong bytes from the other GPU", rank, b, bad);
        CHECK(maco_bootstrap_barrier(bs) == MACO_OK, "barrier");
        maco_memory_channel_destroy(ch);
        maco_mem_deregister(theirs);
        maco_mem_deregister(mine);
        cudaFree(dh);
        CHECK(maco_bootstrap_barrier(bs) == MACO_OK, "barrier");
    }
    /* Allreduce between the two in-process ranks, both algorithms. */
    for (size_t count : { (size_t)1000, (size_t)3 << 20 }) {
        float *in, *out;
        cudaMalloc(&in, count * 4);
        cudaMalloc(&out, count * 4 + 256);
        maco_perf_fill(in, count, MACO_PERF_F32, seed ^ count, rank, nullptr);
        cudaMemset(out, 0xFF, count * 4 + 256);
        unsigned long long init[2] = { 0, ~0ull }, r[2];
        unsigned long long *ctr;
        cudaMalloc(&ctr, sizeof(init));
        cudaMemcpy(ctr, init, sizeof(init), cudaMemcpyHostToDevice);
        CHECK(maco_allreduce(in, out, count, MACO_FLOAT32, MACO_SUM, comm, nullptr) == MACO_OK,
              "allreduce: %s", maco_comm_get_last_error(comm));
        maco_perf_check_sum(out, count, MACO_PERF_F32, seed ^ count, n, &ctr[0], &ctr[1], nullptr);
        cudaMemcpy(r, ctr, sizeof(r), cudaMemcpyDeviceToHost);
        CHECK(r[0] == 0, "rank %d: allreduce of %zu floats: %llu wrong, first %llu", rank, count,
              r[0], r[1]);
        cudaFree(in);
        cudaFree(out);
        cudaFree(ctr);
    }
    cudaFree(status);
    cudaFree(wrong);
    cudaFree(bufs[0]);
    CHECK(maco_bootstrap_barrier(bs) == MACO_OK, "barrier");
    maco_mem_free(comm, bufs[1]);
    maco_comm_destroy(comm);
    maco_bootstrap_destroy(bs);
}

class OneProcessTwoGpus : public maco_test::Test
{
};

TEST_F(OneProcessTwoGpus, ChannelsAndAllreduceBetweenThreads)
{
    maco_unique_id_t id;
    ASSERT_EQ(maco_unique_id_create(&id), MACO_OK);
    uint64_t seed = std::random_device{}();
    RankResult results[2];
    std::thread t1(RunRank, &id, 1, seed, &results[1]);
    RunRank(&id, 0, seed, &results[0]); /* rank 0 in the thread that created the id */
    t1.join();
    EXPECT_EQ(results[0].error, "");
    EXPECT_EQ(results[1].error, "");
}

} // namespace

int main(int argc, char **argv)
{
    ::testing::InitGoogleTest(&argc, argv);
    char why[400];
    int ndev = maco_cuda_device_count(why, sizeof(why));
    if (ndev < 2) {
        printf("SKIP: this test needs 2 GPUs in one process and %d %s visible%s%s\n", ndev,
               ndev == 1 ? "is" : "are", ndev == 0 ? ": " : "", why);
        return maco_test::kSkipExitCode;
    }
    return RUN_ALL_TESTS();
}
