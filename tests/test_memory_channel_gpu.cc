/*
 * test_memory_channel_gpu.cc - memory channels between real GPUs: registration, import,
 * put of random sizes at random offsets to every peer with signal/wait, ping-pong, and a
 * wait that times out.
 */
#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "maco_test.h"
#include "test_kernels.h"

namespace
{

using maco_test::Bootstrap;
using maco_test::Comm;
using maco_test::NRanks;
using maco_test::Rank;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

class MemoryChannel : public maco_test::Test
{
};

/* A registered buffer on every rank, imported everywhere, and a channel to every peer. */
struct Mesh {
    char *buf = nullptr;
    size_t bytes = 0;
    maco_mem_t mine = nullptr;
    std::vector<maco_mem_t> peers;
    std::vector<maco_memory_channel_t> chans;
    maco_memory_channel_device_t *dev_handles = nullptr; /* [nranks] */

    void Setup(maco_comm_t comm, size_t size)
    {
        bytes = size;
        CUDA_OK(cudaMalloc(&buf, bytes));
        ASSERT_EQ(maco_mem_register(comm, buf, bytes, &mine), MACO_OK);
        std::vector<uint8_t> handles(static_cast<size_t>(NRanks()) * MACO_MEM_HANDLE_BYTES);
        ASSERT_EQ(
            maco_mem_serialize(mine, &handles[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]),
            MACO_OK);
        ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), handles.data(), MACO_MEM_HANDLE_BYTES),
                  MACO_OK);
        peers.assign(static_cast<size_t>(NRanks()), nullptr);
        chans.assign(static_cast<size_t>(NRanks()), nullptr);
        std::vector<maco_memory_channel_device_t> h(static_cast<size_t>(NRanks()));
        memset(h.data(), 0, h.size() * sizeof(h[0]));
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            ASSERT_EQ(maco_mem_import(comm,
                                      &handles[static_cast<size_t>(q) * MACO_MEM_HANDLE_BYTES],
                                      &peers[static_cast<size_t>(q)]),
                      MACO_OK)
                << maco_comm_get_last_error(comm);
            int owner = -1;
            maco_mem_get_owner(peers[static_cast<size_t>(q)], &owner);
            EXPECT_EQ(owner, q);
        }
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            ASSERT_EQ(maco_memory_channel_create(comm, q, mine, peers[static_cast<size_t>(q)],
                                                 &chans[static_cast<size_t>(q)]),
                      MACO_OK);
            ASSERT_EQ(maco_memory_channel_get_device_handle(chans[static_cast<size_t>(q)],
                                                            &h[static_cast<size_t>(q)]),
                      MACO_OK);
        }
        CUDA_OK(cudaMalloc(&dev_handles, h.size() * sizeof(h[0])));
        CUDA_OK(cudaMemcpy(dev_handles, h.data(), h.size() * sizeof(h[0]), cudaMemcpyHostToDevice));
    }

    ~Mesh()
    {
        for (auto c : chans)
            maco_memory_channel_destroy(c);
        for (auto p : peers)
            maco_mem_deregister(p);
        maco_mem_deregister(mine);
        cudaFree(dev_handles);
        cudaFree(buf);
    }
};

/* Random sizes (1 B .. 4 MiB) at random offsets, every rank putting into every peer. */
TEST_F(MemoryChannel, PutsOfRandomSizesAndOffsetsReachEveryPeer)
{
    const size_t kSlot = (size_t)4 << 20;
    Mesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(Comm(), kSlot * static_cast<size_t>(NRanks())));
    uint64_t seed = 0;
    if (Rank() == 0)
        seed = std::random_device{}();
    ASSERT_EQ(maco_bootstrap_broadcast(Bootstrap(), 0, &seed, sizeof(seed)), MACO_OK);
    std::mt19937_64 rng(seed);
    int *status;
    CUDA_OK(cudaMalloc(&status, sizeof(int) * static_cast<size_t>(NRanks())));
    std::vector<char> host(m.bytes);
    for (int round = 0; round < 12; round++) {
        /* Same parameters on every rank: sizes span bytes to MiB, offsets any alignment. */
        size_t size =
            round == 0 ? 1 : (round == 1 ? kSlot - 64 : 1 + rng() % (kSlot / (1 + rng() % 64)));
        size_t src_skew = rng() % 32, dst_skew = rng() % 32;
        if (round % 3 == 0)
            dst_skew = src_skew; /* same alignment: the vector path */
        size = std::min(size, kSlot - std::max(src_skew, dst_skew));
        uint64_t pattern_seed = seed ^ (static_cast<uint64_t>(round) << 40);
        /* My slot holds my data; the other slots are poisoned before anyone writes. */
        CUDA_OK(cudaMemset(m.buf, 0xAB, m.bytes));
        char *my_slot = m.buf + static_cast<size_t>(Rank()) * kSlot;
        CUDA_OK(test_fill_pattern(my_slot, kSlot, pattern_seed + static_cast<uint64_t>(Rank()),
                                  nullptr));
        CUDA_OK(cudaMemset(status, 0x7F, sizeof(int) * static_cast<size_t>(NRanks())));
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        size_t src_off = static_cast<size_t>(Rank()) * kSlot + src_skew;
        size_t dst_off = static_cast<size_t>(Rank()) * kSlot + dst_skew;
        CUDA_OK(
            test_put_all(m.dev_handles, NRanks(), Rank(), src_off, dst_off, size, status, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<int> st(static_cast<size_t>(NRanks()));
        CUDA_OK(cudaMemcpy(st.data(), status, st.size() * sizeof(int), cudaMemcpyDeviceToHost));
        for (int q = 0; q < NRanks(); q++) {
            if (q != Rank()) {
                ASSERT_EQ(st[static_cast<size_t>(q)], MACO_OK) << "wait on peer " << q;
            }
        }
        /* The peers' puts happened before their signals, which our waits acquired. */
        CUDA_OK(cudaMemcpy(host.data(), m.buf, m.bytes, cudaMemcpyDeviceToHost));
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            const char *slot = host.data() + static_cast<size_t>(q) * kSlot;
            size_t wrong = 0, first = SIZE_MAX;
            for (size_t i = 0; i < kSlot; i++) {
                uint8_t want = 0xAB;
                if (i >= dst_skew && i < dst_skew + size)
                    want = test_pattern_byte(pattern_seed + static_cast<uint64_t>(q),
                                             i - dst_skew + src_skew);
                if (static_cast<uint8_t>(slot[i]) != want) {
                    wrong++;
                    first = std::min(first, i);
                }
            }
            ASSERT_EQ(wrong, 0u) << "round " << round << ": from rank " << q << ", size " << size
                                 << ", src skew " << src_skew << ", dst skew " << dst_skew
                                 << ", first wrong byte " << first;
        }
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
    cudaFree(status);
}

TEST_F(MemoryChannel, SignalWaitPingPong)
{
    Mesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(Comm(), 4096));
    int *status;
    CUDA_OK(cudaMalloc(&status, sizeof(int)));
    CUDA_OK(cudaMemset(status, 0x7F, sizeof(int)));
    const int iters = 20000;
    auto t0 = std::chrono::steady_clock::now();
    if (Rank() < 2 && NRanks() >= 2) {
        int peer = 1 - Rank();
        CUDA_OK(test_ping_pong(m.dev_handles + peer, iters, Rank() == 0, status, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        int st = -1;
        CUDA_OK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
        EXPECT_EQ(st, MACO_OK);
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count();
        if (Rank() == 0)
            printf("ping-pong: %d round trips in %.0f us (%.2f us each, kernel launch included)\n",
                   iters, us, us / iters);
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    cudaFree(status);
}

/* A wait for a signal that never comes ends with MACO_ERR_TIMEOUT naming the peer, and the
 * process stays usable. Uses its own communicator with a 1 s device timeout. */
TEST_F(MemoryChannel, LostSignalTimesOutNamingThePeer)
{
    setenv("MACO_DEVICE_TIMEOUT", "1s", 1);
    maco_comm_t comm;
    ASSERT_EQ(maco_comm_create(Bootstrap(), -1, &comm), MACO_OK);
    unsetenv("MACO_DEVICE_TIMEOUT");
    {
        Mesh m;
        ASSERT_NO_FATAL_FAILURE(m.Setup(comm, 4096));
        int *status;
        CUDA_OK(cudaMalloc(&status, sizeof(int)));
        CUDA_OK(cudaMemset(status, 0x7F, sizeof(int)));
        if (Rank() == 0) {
            auto t0 = std::chrono::steady_clock::now();
            CUDA_OK(test_wait_once(m.dev_handles + 1, status, nullptr));
            CUDA_OK(cudaDeviceSynchronize());
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            int st = 0;
            CUDA_OK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
            EXPECT_EQ(st, MACO_ERR_TIMEOUT);
            EXPECT_GE(s, 0.9);
            EXPECT_LT(s, 10.0);
            maco_status_t async_st = MACO_OK;
            ASSERT_EQ(maco_comm_get_async_error(comm, &async_st), MACO_OK);
            EXPECT_EQ(async_st, MACO_ERR_TIMEOUT);
            std::string msg = maco_comm_get_last_error(comm);
            EXPECT_NE(msg.find("waited for rank 1"), std::string::npos) << msg;
            EXPECT_NE(msg.find("semaphore"), std::string::npos) << msg;
            /* Still usable: device work and a copy run normally. */
            int one = 1;
            CUDA_OK(cudaMemcpy(status, &one, sizeof(int), cudaMemcpyHostToDevice));
            CUDA_OK(cudaDeviceSynchronize());
        }
        cudaFree(status);
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
    ASSERT_EQ(maco_comm_destroy(comm), MACO_OK);
}

} // namespace
