/*
 * test_port_channel_gpu.cc - port channels over the CUDA copy transport between real GPUs (or,
 * with TEST_MACO_PORT_TRANSPORT=auto across simulated nodes, over TCP with GPU memory):
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

#include "gpu_case.h"
#include "maco_test.h"
#include "tools/perf_kernels.h"
#include "test_kernels.h"

namespace
{

using namespace maco_test;

struct PortMesh {
    char *alloc = nullptr; /* cudaMalloc'd; the registered buffer starts `skew` bytes in */
    char *buf = nullptr;
    size_t bytes = 0;
    maco_mem_t mine = nullptr;
    std::vector<maco_mem_t> peers;
    maco_test::PortChannels port;
    maco_port_channel_device_t *dev = nullptr; /* [nranks] */

    void Setup(size_t size, size_t skew = 0)
    {
        bytes = size;
        CUDA_OK(cudaMalloc(&alloc, bytes + skew));
        buf = alloc + skew;
        ASSERT_EQ(maco_mem_register(Comm(), buf, bytes, &mine), MACO_OK);
        ASSERT_NO_FATAL_FAILURE(maco_test::ExchangeMem(Comm(), mine, &peers));
        /* TEST_MACO_PORT_TRANSPORT=auto (tests/CMakeLists.txt, gpu_tcp_*): across simulated
         * nodes the channels take TCP, with these device buffers staged through host memory. */
        const char *t = getenv("TEST_MACO_PORT_TRANSPORT");
        maco_transport_t transport = t != nullptr && std::string(t) == "auto"
                                         ? MACO_TRANSPORT_AUTO
                                         : MACO_TRANSPORT_CUDA_COPY;
        ASSERT_NO_FATAL_FAILURE(port.Create(Comm(), transport, mine, peers));
        std::vector<maco_port_channel_device_t> hd(static_cast<size_t>(NRanks()));
        memset(hd.data(), 0, hd.size() * sizeof(hd[0]));
        for (int q = 0; q < NRanks(); q++) {
            if (q != Rank()) {
                ASSERT_EQ(maco_port_channel_get_device_handle(port.chans[static_cast<size_t>(q)],
                                                              &hd[static_cast<size_t>(q)]),
                          MACO_OK);
            }
        }
        CUDA_OK(cudaMalloc(&dev, hd.size() * sizeof(hd[0])));
        CUDA_OK(cudaMemcpy(dev, hd.data(), hd.size() * sizeof(hd[0]), cudaMemcpyHostToDevice));
    }

    ~PortMesh()
    {
        cudaDeviceSynchronize();
        port.Destroy();
        for (auto p : peers)
            maco_mem_deregister(p);
        maco_mem_deregister(mine);
        maco_bootstrap_barrier(Bootstrap());
        cudaFree(dev);
        cudaFree(alloc);
    }
};

class PortChannelGpu : public maco_test::ChannelCase
{
  protected:
    void SetUp() override
    {
        ChannelCase::SetUp();
        CUDA_OK(cudaMalloc(&aux_, sizeof(int) * 8));
    }
    void TearDown() override
    {
        cudaFree(aux_);
        ChannelCase::TearDown();
    }

    /* Poisons the buffer, fills this rank's slot, and waits until every rank did. */
    void Prepare(PortMesh &m, size_t slot, uint64_t pseed)
    {
        CUDA_OK(cudaMemset(m.buf, 0xAB, m.bytes));
        CUDA_OK(test_fill_pattern(m.buf + static_cast<size_t>(Rank()) * slot, slot,
                                  pseed + static_cast<uint64_t>(Rank()), nullptr));
        CUDA_OK(cudaMemset(status_, 0, sizeof(int) * StatusWords()));
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
    /* Every peer's status word says MACO_OK. */
    void ExpectStatusesOk(const std::string &what)
    {
        std::vector<int> st = Statuses();
        for (int q = 0; q < NRanks(); q++) {
            if (q != Rank()) {
                ASSERT_EQ(st[static_cast<size_t>(q)], MACO_OK) << what << ", peer " << q;
            }
        }
    }
    /* Slot q of the buffer holds rank q's pattern (seed pseed + q, from pattern byte
     * `offset`) at [skew, skew + size) and poison elsewhere, for every peer q. */
    void ExpectEveryPeersData(const PortMesh &m, size_t slot, size_t skew, size_t size,
                              uint64_t pseed, uint64_t offset, const std::string &what)
    {
        for (int q = 0; q < NRanks(); q++) {
            if (q != Rank()) {
                ASSERT_EQ(CountWrong(m.buf + static_cast<size_t>(q) * slot, slot, skew, size,
                                     pseed + static_cast<uint64_t>(q), offset),
                          0u)
                    << what << ", from rank " << q << ", " << size << " bytes";
            }
        }
    }
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
        std::string what = "round " + std::to_string(round);
        ASSERT_NO_FATAL_FAILURE(ExpectStatusesOk(what));
        ASSERT_NO_FATAL_FAILURE(ExpectEveryPeersData(m, kSlot, dskew, size, pseed, sskew, what));
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
    ASSERT_NO_FATAL_FAILURE(ExpectStatusesOk("put_with_signal_and_flush"));
    ASSERT_NO_FATAL_FAILURE(
        ExpectEveryPeersData(m, kSlot, 5, kSlot - 16, seed_ ^ 0x5151, 3, "flush then poll"));
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
        std::string what = "96 CTAs, round " + std::to_string(round);
        ASSERT_NO_FATAL_FAILURE(ExpectStatusesOk(what));
        ASSERT_NO_FATAL_FAILURE(ExpectEveryPeersData(m, kSlot, 0, kSlot, pseed, 0, what));
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
}

/* A device push that gives up (its proxy stopped while the ring was full) leaves its reserved
 * position unpublished; restarting the proxy over it is refused instead of serving the ring
 * up to the hole and then never again (a wedge: every later flush would time out). */
TEST_F(PortChannelGpu, RestartOverAbandonedDevicePushesIsRefused)
{
    setenv("MACO_PROXY_FIFO_SIZE", "2", 1);
    PortMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(4096));
    unsetenv("MACO_PROXY_FIFO_SIZE");
    int peer = (Rank() + 1) % NRanks();
    ASSERT_EQ(maco_proxy_stop(m.port.proxy), MACO_OK);
    CUDA_OK(cudaMemset(status_, 0, sizeof(int)));
    /* Two pushes fill the ring; the third finds it full and the proxy stopped. */
    CUDA_OK(test_port_push_only(m.dev + peer, 3, status_, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(Statuses()[0], MACO_ERR_REMOTE);
    maco_test::AllowLog("reserved by kernels that gave up");
    EXPECT_EQ(maco_proxy_start(m.port.proxy), MACO_ERR_INVALID_USAGE);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
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
    ASSERT_NO_FATAL_FAILURE(ExpectStatusesOk("put then flush"));
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK); /* every rank's flush returned */
    ASSERT_NO_FATAL_FAILURE(
        ExpectEveryPeersData(m, kSlot, 0, kSlot, seed_, 0, "after every peer's flush"));
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

/* Data written by the kernel's 512 threads just before thread 0 pushes it (a __syncthreads,
 * then the push with its GPU-scope fence), checked by every thread of the receiving kernel
 * right after its wait, round after round with the source rewritten each time and the three
 * push patterns. It shows the path works end to end; it cannot show that the fence is
 * needed (the trip through the CPU and the driver takes microseconds, far longer than the
 * writes take to land). */
TEST_F(PortChannelGpu, DataWrittenInTheKernelThenPut)
{
    const size_t kSlot = (64 << 10) + 64, kBytes = (64 << 10) + 13;
    const int kRounds = 300;
    PortMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    CUDA_OK(cudaMemset(m.buf, 0xAB, m.bytes));
    CUDA_OK(cudaMemset(status_, 0x7F, sizeof(int)));
    unsigned long long *wrong = nullptr;
    CUDA_OK(cudaMalloc(&wrong, sizeof(*wrong)));
    CUDA_OK(cudaMemset(wrong, 0, sizeof(*wrong)));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    CUDA_OK(test_port_write_put_rounds(m.dev, NRanks(), Rank(), m.buf, kSlot, kBytes, kRounds,
                                       seed_, wrong, status_, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long bad = ~0ull;
    CUDA_OK(cudaMemcpy(&bad, wrong, sizeof(bad), cudaMemcpyDeviceToHost));
    cudaFree(wrong);
    EXPECT_EQ(Statuses()[0], MACO_OK);
    EXPECT_EQ(bad, 0u) << "wrong bytes received over " << kRounds << " rounds";
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

/* Small puts (test_kernels.h, test_port_small_puts): 4- and 8-byte puts that may travel
 * inside their trigger, misaligned ones that are copied, inline values and copies to the same
 * bytes in both orders, and a final put_with_signal. Every byte of each region is checked,
 * poison included. Parameters: the skew of the registered buffers in their allocation and
 * whether stream memory operations are used (MACO_PROXY_STREAM_MEMOPS). */
struct SmallPutsCase {
    size_t skew;
    bool memops;
};

class PortChannelSmallPuts : public PortChannelGpu,
                             public ::testing::WithParamInterface<SmallPutsCase>
{
  protected:
    void TearDown() override
    {
        unsetenv("MACO_PROXY_STREAM_MEMOPS"); /* also when the test stopped before it did */
        PortChannelGpu::TearDown();
    }
};

TEST_P(PortChannelSmallPuts, ArriveWholeAndInOrder)
{
    /* Skew 0: buffers 8-byte aligned, small puts inline, their sources overwritten right
     * after each call (which only an inline put tolerates). Skew 4: buffers registered 4
     * bytes into their allocation, so no put may travel inline (an 8-byte load or stream
     * write there would fault): everything is copied and the sources are left alone.
     * Without stream memory operations, inline values and signals are staged copies. */
    const SmallPutsCase c = GetParam();
    const int clobber = c.skew == 0;
    if (!c.memops)
        setenv("MACO_PROXY_STREAM_MEMOPS", "0", 1);
    const size_t kSlot = static_cast<size_t>(TEST_SMALL_REGION) * 8;
    ASSERT_LE(NRanks(), 8);
    PortMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks()), c.skew));
    unsetenv("MACO_PROXY_STREAM_MEMOPS"); /* read when the proxy was created */
    for (int round = 0; round < 3; round++) {
        uint64_t seed = seed_ ^ (static_cast<uint64_t>(round) << 48);
        CUDA_OK(cudaMemset(m.buf, 0xAB, m.bytes));
        CUDA_OK(cudaMemset(status_, 0x7F, sizeof(int) * StatusWords()));
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        CUDA_OK(test_port_small_puts(m.dev, NRanks(), Rank(), m.buf, kSlot, seed, clobber, status_,
                                     nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_NO_FATAL_FAILURE(ExpectStatusesOk("small puts, round " + std::to_string(round)));
        std::vector<uint8_t> got(m.bytes);
        CUDA_OK(cudaMemcpy(got.data(), m.buf, m.bytes, cudaMemcpyDeviceToHost));
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            size_t region =
                static_cast<size_t>(q) * kSlot + static_cast<size_t>(Rank()) * TEST_SMALL_REGION;
            std::vector<uint8_t> want(TEST_SMALL_REGION, 0xAB);
            auto put = [&](size_t at, uint64_t v, size_t bytes) {
                for (size_t b = 0; b < bytes; b++)
                    want[at + b] = static_cast<uint8_t>(v >> (8 * b));
            };
            for (int k = 0; k < TEST_SMALL_CELLS; k++) {
                uint64_t v = test_small_value(seed, q, Rank(), k);
                size_t cell = 16 * static_cast<size_t>(k);
                int kind = k % 7;
                if (kind == 0 || kind == 4) /* kind 4: the pattern, then v over its start */
                    put(cell, v, 8);
                if (kind == 1)
                    put(cell + 4, v, 4);
                if (kind == 2)
                    put(cell + 1, v, 8);
                if (kind == 3)
                    put(cell + 8, v, 4);
                if (kind == 6)
                    put(cell + 4, v, 8);
                if (kind == 4 || kind == 5)
                    for (int b = kind == 4 ? 8 : 0; b < 16; b++)
                        want[cell + static_cast<size_t>(b)] =
                            test_small_pattern(seed, q, Rank(), k, b);
            }
            put(16 * TEST_SMALL_CELLS, test_small_value(seed, q, Rank(), TEST_SMALL_CELLS), 8);
            for (size_t i = 0; i < want.size(); i++) /* the scratch area stays poisoned */
                ASSERT_EQ(got[region + i], want[i])
                    << "skew " << c.skew << ", memops " << c.memops << ", round " << round
                    << ", from rank " << q << ", byte " << i << " (cell " << i / 16 << ", kind "
                    << (i / 16) % 7 << ")";
        }
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
}

INSTANTIATE_TEST_SUITE_P(PortChannelGpu, PortChannelSmallPuts,
                         ::testing::Values(SmallPutsCase{ 0, true }, SmallPutsCase{ 4, true },
                                           SmallPutsCase{ 0, false }));

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
    ASSERT_EQ(maco_proxy_stop(m.port.proxy), MACO_OK) << maco_comm_get_last_error(Comm());
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
