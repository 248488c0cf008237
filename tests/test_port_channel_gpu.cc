/*
 * test_port_channel_gpu.cc - port channels over the CUDA copy transport between real GPUs:
 * device put_with_signal of random sizes at random offsets to every peer, many CTAs pushing at
 * once, flush, and a proxy stopped while a kernel pushes and flushes (the kernel gets an error
 * and exits). Destinations are poisoned first; every byte is checked on the GPU.
 */
#include <cuda_runtime.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "maco_test.h"
#include "perf_kernels.h"
#include "test_kernels.h"

namespace
{

using maco_test::Bootstrap;
using maco_test::Comm;
using maco_test::NRanks;
using maco_test::Rank;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

struct PortMesh {
    char *buf = nullptr;
    size_t bytes = 0;
    maco_mem_t mine = nullptr;
    std::vector<maco_mem_t> peers;
    maco_proxy_t proxy = nullptr;
    std::vector<maco_port_channel_t> chans;
    maco_port_channel_device_t *dev = nullptr; /* [nranks] */

    void Setup(size_t size)
    {
        bytes = size;
        CUDA_OK(cudaMalloc(&buf, bytes));
        ASSERT_EQ(maco_mem_register(Comm(), buf, bytes, &mine), MACO_OK);
        std::vector<uint8_t> h(static_cast<size_t>(NRanks()) * MACO_MEM_HANDLE_BYTES);
        ASSERT_EQ(maco_mem_serialize(mine, &h[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]),
                  MACO_OK);
        ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), h.data(), MACO_MEM_HANDLE_BYTES), MACO_OK);
        peers.assign(static_cast<size_t>(NRanks()), nullptr);
        chans.assign(static_cast<size_t>(NRanks()), nullptr);
        for (int q = 0; q < NRanks(); q++) {
            if (q != Rank()) {
                ASSERT_EQ(maco_mem_import(Comm(),
                                          &h[static_cast<size_t>(q) * MACO_MEM_HANDLE_BYTES],
                                          &peers[static_cast<size_t>(q)]),
                          MACO_OK);
            }
        }
        ASSERT_EQ(maco_proxy_create(Comm(), &proxy), MACO_OK) << maco_comm_get_last_error(Comm());
        ASSERT_EQ(maco_proxy_start(proxy), MACO_OK);
        std::vector<maco_port_channel_device_t> hd(static_cast<size_t>(NRanks()));
        memset(hd.data(), 0, hd.size() * sizeof(hd[0]));
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            ASSERT_EQ(maco_port_channel_create(proxy, q, MACO_TRANSPORT_CUDA_COPY, mine,
                                               peers[static_cast<size_t>(q)],
                                               &chans[static_cast<size_t>(q)]),
                      MACO_OK)
                << maco_comm_get_last_error(Comm());
            ASSERT_EQ(maco_port_channel_get_device_handle(chans[static_cast<size_t>(q)],
                                                          &hd[static_cast<size_t>(q)]),
                      MACO_OK);
        }
        CUDA_OK(cudaMalloc(&dev, hd.size() * sizeof(hd[0])));
        CUDA_OK(cudaMemcpy(dev, hd.data(), hd.size() * sizeof(hd[0]), cudaMemcpyHostToDevice));
    }

    ~PortMesh()
    {
        cudaDeviceSynchronize();
        maco_proxy_stop(proxy);
        for (auto c : chans)
            maco_port_channel_destroy(c);
        maco_proxy_destroy(proxy);
        for (auto p : peers)
            maco_mem_deregister(p);
        maco_mem_deregister(mine);
        maco_bootstrap_barrier(Bootstrap());
        cudaFree(dev);
        cudaFree(buf);
    }
};

class PortChannelGpu : public maco_test::Test
{
  protected:
    void SetUp() override
    {
        maco_test::Test::SetUp();
        if (Rank() == 0)
            seed_ = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
        ASSERT_EQ(maco_bootstrap_broadcast(Bootstrap(), 0, &seed_, sizeof(seed_)), MACO_OK);
        CUDA_OK(cudaMalloc(&counter_, sizeof(unsigned long long)));
        CUDA_OK(cudaMalloc(&status_, sizeof(int) * 8));
        CUDA_OK(cudaMalloc(&aux_, sizeof(int) * 8));
    }
    void TearDown() override
    {
        cudaFree(counter_);
        cudaFree(status_);
        cudaFree(aux_);
        maco_test::Test::TearDown();
    }

    unsigned long long CountWrong(const char *slot, size_t slot_bytes, size_t skew, size_t size,
                                  uint64_t seed, uint64_t offset)
    {
        return test_count_wrong_slot(slot, slot_bytes, skew, size, seed, offset, counter_);
    }
    std::vector<int> Statuses()
    {
        std::vector<int> st(8, -1);
        cudaMemcpy(st.data(), status_, st.size() * sizeof(int), cudaMemcpyDeviceToHost);
        return st;
    }
    /* Poisons the buffer, fills this rank's slot, and waits until every rank did. */
    void Prepare(PortMesh &m, size_t slot, uint64_t pseed)
    {
        CUDA_OK(cudaMemset(m.buf, 0xAB, m.bytes));
        CUDA_OK(test_fill_pattern(m.buf + static_cast<size_t>(Rank()) * slot, slot,
                                  pseed + static_cast<uint64_t>(Rank()), nullptr));
        CUDA_OK(cudaMemset(status_, 0, sizeof(int) * 8));
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
    uint64_t seed_ = 0;
    unsigned long long *counter_ = nullptr;
    int *status_ = nullptr;
    int *aux_ = nullptr;
};

TEST_F(PortChannelGpu, PutWithSignalOfRandomSizesReachesEveryPeer)
{
    const size_t kSlot = (64 << 20) + 64;
    PortMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    std::mt19937_64 rng(seed_);
    for (int round = 0; round < 12; round++) {
        size_t size = round == 0   ? 1
                      : round == 1 ? kSlot - 64
                                   : 1 + rng() % (kSlot >> (rng() % 16));
        size_t sskew = rng() % 32, dskew = rng() % 32;
        size = std::min(size, kSlot - std::max(sskew, dskew));
        uint64_t pseed = seed_ ^ (static_cast<uint64_t>(round) << 40);
        ASSERT_NO_FATAL_FAILURE(Prepare(m, kSlot, pseed));
        size_t base = static_cast<size_t>(Rank()) * kSlot;
        CUDA_OK(test_port_put_all(m.dev, NRanks(), Rank(), base + sskew, base + dskew, size, 0,
                                  status_, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<int> st = Statuses();
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            ASSERT_EQ(st[static_cast<size_t>(q)], MACO_OK) << "round " << round << " peer " << q;
            ASSERT_EQ(CountWrong(m.buf + static_cast<size_t>(q) * kSlot, kSlot, dskew, size,
                                 pseed + static_cast<uint64_t>(q), sskew),
                      0u)
                << "round " << round << " from rank " << q << ", " << size << " bytes";
        }
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
}

TEST_F(PortChannelGpu, PutWithSignalAndFlushThenPoll)
{
    const size_t kSlot = (4 << 20) + 16;
    PortMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    ASSERT_NO_FATAL_FAILURE(Prepare(m, kSlot, seed_ ^ 0x5151));
    size_t base = static_cast<size_t>(Rank()) * kSlot;
    CUDA_OK(test_port_flush_and_poll(m.dev, NRanks(), Rank(), base + 3, base + 5, kSlot - 16,
                                     status_, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int> st = Statuses();
    for (int q = 0; q < NRanks(); q++) {
        if (q == Rank())
            continue;
        ASSERT_EQ(st[static_cast<size_t>(q)], MACO_OK) << "peer " << q;
        EXPECT_EQ(CountWrong(m.buf + static_cast<size_t>(q) * kSlot, kSlot, 5, kSlot - 16,
                             (seed_ ^ 0x5151) + static_cast<uint64_t>(q), 3),
                  0u)
            << "from rank " << q;
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

TEST_F(PortChannelGpu, ManyCtasPushAtOnce)
{
    const size_t kSlot = 32 << 20;
    PortMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    for (int round = 0; round < 3; round++) {
        uint64_t pseed = seed_ ^ (static_cast<uint64_t>(round) << 44);
        ASSERT_NO_FATAL_FAILURE(Prepare(m, kSlot, pseed));
        CUDA_OK(cudaMemset(aux_, 0, sizeof(unsigned)));
        CUDA_OK(test_port_many_ctas(m.dev, NRanks(), Rank(), static_cast<size_t>(Rank()) * kSlot,
                                    kSlot, 96, reinterpret_cast<unsigned *>(aux_), status_,
                                    nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<int> st = Statuses();
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            ASSERT_EQ(st[static_cast<size_t>(q)], MACO_OK) << "peer " << q;
            ASSERT_EQ(CountWrong(m.buf + static_cast<size_t>(q) * kSlot, kSlot, 0, kSlot,
                                 pseed + static_cast<uint64_t>(q), 0),
                      0u)
                << "from rank " << q;
        }
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
}

TEST_F(PortChannelGpu, DeviceFlushMeansTheDataHasLanded)
{
    const size_t kSlot = 8 << 20;
    PortMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    ASSERT_NO_FATAL_FAILURE(Prepare(m, kSlot, seed_));
    size_t base = static_cast<size_t>(Rank()) * kSlot;
    CUDA_OK(test_port_put_all(m.dev, NRanks(), Rank(), base, base, kSlot, 1, status_, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int> st = Statuses();
    for (int q = 0; q < NRanks(); q++) {
        if (q != Rank()) {
            ASSERT_EQ(st[static_cast<size_t>(q)], MACO_OK) << "flush towards " << q;
        }
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK); /* every rank's flush returned */
    for (int q = 0; q < NRanks(); q++) {
        if (q != Rank()) {
            EXPECT_EQ(CountWrong(m.buf + static_cast<size_t>(q) * kSlot, kSlot, 0, kSlot,
                                 seed_ + static_cast<uint64_t>(q), 0),
                      0u)
                << "from rank " << q;
        }
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

/* The proxy is stopped while a kernel pushes and flushes in a loop: the kernel's next wait
 * fails and the kernel exits; nothing hangs. */
TEST_F(PortChannelGpu, ProxyStoppedWhileAKernelWaits)
{
    const size_t kSlot = 1 << 20;
    PortMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    int peer = (Rank() + 1) % NRanks();
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaMemset(status_, 0x7F, sizeof(int)));
    CUDA_OK(test_port_flush_loop(m.dev + peer, 1 << 30, 4096, status_, aux_, s));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(maco_proxy_stop(m.proxy), MACO_OK) << maco_comm_get_last_error(Comm());
    CUDA_OK(cudaStreamSynchronize(s));
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int st = 0, rounds = 0;
    CUDA_OK(cudaMemcpy(&st, status_, sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&rounds, aux_, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(st, MACO_ERR_REMOTE) << "the kernel's flush fails once the proxy stopped";
    EXPECT_GT(rounds, 10) << "rounds completed while the proxy ran";
    EXPECT_LT(secs, 5.0);
    cudaStreamDestroy(s);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

} // namespace
