/*
 * test_memory_channel_gpu.cc - memory, memory channels and device synchronisation on real
 * GPUs: buffers from cudaMalloc, maco_mem_alloc and a cuMem allocation made here, registered,
 * imported by every peer; put and get of 1 B .. 256 MiB at random offsets between all pairs;
 * LL8/LL16 round trips over many launches; signal/wait ping-pong; a lost signal; the grid
 * barrier and the device semaphore; shared host memory; registration errors.
 * Every destination is poisoned first and every byte is checked (on the GPU).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_case.h"
#include "maco/device/sync.h"
#include "maco_test.h"
#include "tools/perf_kernels.h"
#include "test_kernels.h"

namespace
{

using namespace maco_test;

enum class Source { kCudaMalloc, kMacoAlloc, kCuMem };

const char *SourceName(Source s)
{
    return s == Source::kCudaMalloc  ? "cudaMalloc"
           : s == Source::kMacoAlloc ? "maco_mem_alloc"
                                     : "cuMem";
}

/* A cuMem allocation made by the test itself, as an application (e.g. PyTorch) would. */
struct CuMemBuffer {
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr va = 0;
    size_t size = 0;
};

template <class F> F DriverFn(const char *name)
{
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
    return reinterpret_cast<F>(fn);
}

bool CuMemAllocate(int dev, size_t bytes, CuMemBuffer *b)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    auto granularity =
        DriverFn<PFN_cuMemGetAllocationGranularity_v10020>("cuMemGetAllocationGranularity");
    auto create = DriverFn<PFN_cuMemCreate_v10020>("cuMemCreate");
    auto reserve = DriverFn<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve");
    auto map = DriverFn<PFN_cuMemMap_v10020>("cuMemMap");
    auto access = DriverFn<PFN_cuMemSetAccess_v10020>("cuMemSetAccess");
    if (!granularity || !create || !reserve || !map || !access)
        return false;
    if (granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
        return false;
    b->size = (bytes + gran - 1) / gran * gran;
    CUmemAccessDesc d;
    memset(&d, 0, sizeof(d));
    d.location = prop.location;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return create(&b->handle, b->size, &prop, 0) == CUDA_SUCCESS &&
           reserve(&b->va, b->size, gran, 0, 0) == CUDA_SUCCESS &&
           map(b->va, b->size, 0, b->handle, 0) == CUDA_SUCCESS &&
           access(b->va, b->size, &d, 1) == CUDA_SUCCESS;
}

void CuMemFree(CuMemBuffer *b)
{
    DriverFn<PFN_cuMemUnmap_v10020>("cuMemUnmap")(b->va, b->size);
    DriverFn<PFN_cuMemAddressFree_v10020>("cuMemAddressFree")(b->va, b->size);
    DriverFn<PFN_cuMemRelease_v10020>("cuMemRelease")(b->handle);
}

/* A registered buffer on every rank, imported everywhere, and a channel to every peer. */
struct Mesh {
    maco_comm_t comm = nullptr;
    Source source = Source::kCudaMalloc;
    char *buf = nullptr;
    size_t bytes = 0;
    CuMemBuffer cumem;
    maco_mem_t mine = nullptr;
    std::vector<maco_mem_t> peers;
    std::vector<maco_memory_channel_t> chans;
    maco_memory_channel_device_t *dev_handles = nullptr; /* [nranks] */

    void Setup(maco_comm_t c, size_t size, Source src = Source::kCudaMalloc)
    {
        comm = c;
        source = src;
        bytes = size;
        int dev = -1;
        maco_comm_get_cuda_device(comm, &dev);
        if (src == Source::kCudaMalloc) {
            CUDA_OK(cudaMalloc(&buf, bytes));
        } else if (src == Source::kMacoAlloc) {
            void *p = nullptr;
            ASSERT_EQ(maco_mem_alloc(comm, bytes, &p), MACO_OK) << maco_comm_get_last_error(comm);
            buf = static_cast<char *>(p);
        } else {
            ASSERT_TRUE(CuMemAllocate(dev, bytes, &cumem)) << "cuMem allocation of " << bytes;
            buf = reinterpret_cast<char *>(cumem.va);
        }
        ASSERT_EQ(maco_mem_register(comm, buf, bytes, &mine), MACO_OK)
            << maco_comm_get_last_error(comm);
        ASSERT_NO_FATAL_FAILURE(maco_test::ExchangeMem(comm, mine, &peers));
        chans.assign(static_cast<size_t>(NRanks()), nullptr);
        std::vector<maco_memory_channel_device_t> h(static_cast<size_t>(NRanks()));
        memset(h.data(), 0, h.size() * sizeof(h[0]));
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
        cudaDeviceSynchronize();
        for (auto c : chans)
            maco_memory_channel_destroy(c);
        for (auto p : peers)
            maco_mem_deregister(p);
        maco_mem_deregister(mine);
        /* Peers must have unmapped this buffer before it is freed. */
        maco_bootstrap_barrier(Bootstrap());
        cudaFree(dev_handles);
        if (source == Source::kCudaMalloc)
            cudaFree(buf);
        else if (source == Source::kMacoAlloc)
            maco_mem_free(comm, buf);
        else if (buf != nullptr)
            CuMemFree(&cumem);
    }
};

class MemoryChannel : public maco_test::ChannelCase
{
  protected:
    /* Puts (or gets) of random sizes at random offsets, all pairs, for one buffer source. */
    void PutsAndGets(Source src, size_t slot, int rounds, bool get)
    {
        Mesh m;
        ASSERT_NO_FATAL_FAILURE(m.Setup(Comm(), slot * static_cast<size_t>(NRanks()), src));
        std::mt19937_64 rng(seed_ ^ static_cast<uint64_t>(src) ^ (get ? 77 : 0));
        for (int round = 0; round < rounds; round++) {
            /* The same parameters on every rank: sizes log-uniform from 1 B to the slot,
             * offsets of any alignment (a third of the rounds share the alignment). */
            size_t size =
                round == 0 ? 1
                : round == 1
                    ? slot - 64
                    : std::max<size_t>(
                          1, static_cast<size_t>(std::exp2(std::uniform_real_distribution<double>(
                                 0, std::log2(static_cast<double>(slot - 64)))(rng))));
            size_t src_skew = rng() % 32, dst_skew = rng() % 32;
            if (round % 3 == 0)
                dst_skew = src_skew;
            size = std::min(size, slot - std::max(src_skew, dst_skew));
            uint64_t pattern_seed = seed_ ^ (static_cast<uint64_t>(round) << 40);
            char *my_slot = m.buf + static_cast<size_t>(Rank()) * slot;
            CUDA_OK(cudaMemset(m.buf, 0xAB, m.bytes));
            CUDA_OK(test_fill_pattern(my_slot, slot, pattern_seed + static_cast<uint64_t>(Rank()),
                                      nullptr));
            CUDA_OK(cudaMemset(status_, 0x7F, sizeof(int) * static_cast<size_t>(NRanks())));
            CUDA_OK(cudaDeviceSynchronize());
            ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
            if (get) {
                /* Pull each peer's own slot (from its src_skew) into my slot for it. */
                CUDA_OK(test_get_all(m.dev_handles, NRanks(), Rank(), 0, 0, slot, slot, nullptr));
                CUDA_OK(cudaDeviceSynchronize());
            } else {
                size_t src_off = static_cast<size_t>(Rank()) * slot + src_skew;
                size_t dst_off = static_cast<size_t>(Rank()) * slot + dst_skew;
                CUDA_OK(test_put_all(m.dev_handles, NRanks(), Rank(), src_off, dst_off, size,
                                     status_, nullptr));
                CUDA_OK(cudaDeviceSynchronize());
                std::vector<int> st = Statuses();
                for (int q = 0; q < NRanks(); q++) {
                    if (q != Rank()) {
                        ASSERT_EQ(st[static_cast<size_t>(q)], MACO_OK) << "wait on peer " << q;
                    }
                }
            }
            ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
            for (int q = 0; q < NRanks(); q++) {
                if (q == Rank())
                    continue;
                const char *s = m.buf + static_cast<size_t>(q) * slot;
                unsigned long long wrong =
                    get ? CountWrong(s, slot, 0, slot, pattern_seed + static_cast<uint64_t>(q), 0)
                        : CountWrong(s, slot, dst_skew, size,
                                     pattern_seed + static_cast<uint64_t>(q), src_skew);
                ASSERT_EQ(wrong, 0u) << SourceName(src) << (get ? " get" : " put") << " round "
                                     << round << ": from rank " << q << ", size " << size
                                     << ", src skew " << src_skew << ", dst skew " << dst_skew;
            }
            ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        }
    }
};

TEST_F(MemoryChannel, PutsFromCudaMallocUpTo256MiB)
{
    PutsAndGets(Source::kCudaMalloc, ((size_t)256 << 20) + 64, 10, false);
}

TEST_F(MemoryChannel, PutsFromMacoMemAlloc)
{
    PutsAndGets(Source::kMacoAlloc, (size_t)8 << 20, 8, false);
}

TEST_F(MemoryChannel, PutsFromAnApplicationsCuMemAllocation)
{
    PutsAndGets(Source::kCuMem, (size_t)8 << 20, 8, false);
}

TEST_F(MemoryChannel, GetsFromEveryPeer)
{
    PutsAndGets(Source::kMacoAlloc, (size_t)32 << 20, 3, true);
}

/* LL16 and LL8 round trips, 300 launches with a new flag each, scratch by flag parity. */
TEST_F(MemoryChannel, PacketRoundTripsOverManyLaunches)
{
    const size_t kMax = 64 << 10, kPkt = 2 * kMax + 64;
    const size_t n = static_cast<size_t>(NRanks());
    /* Layout: [source kMax][packets 2 x n x kPkt][out n x kMax]. */
    const size_t pkt_off = kMax, out_off = kMax + 2 * n * kPkt;
    Mesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(Comm(), out_off + n * kMax));
    CUDA_OK(cudaMemset(m.buf, 0, m.bytes));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    std::mt19937_64 rng(seed_ ^ 0x11);
    for (uint32_t launch = 1; launch <= 300; launch++) {
        size_t size = 1 + rng() % kMax;
        int ll8 = launch % 2;
        uint64_t pattern_seed = seed_ ^ (static_cast<uint64_t>(launch) << 32);
        CUDA_OK(
            test_fill_pattern(m.buf, size, pattern_seed + static_cast<uint64_t>(Rank()), nullptr));
        CUDA_OK(cudaMemset(m.buf + out_off, 0xAB, n * kMax));
        CUDA_OK(test_packets_round_trip(m.dev_handles, NRanks(), Rank(), 0, pkt_off, kPkt, out_off,
                                        kMax, size, launch, ll8, status_, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<int> st = Statuses();
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            ASSERT_EQ(st[static_cast<size_t>(q)], MACO_OK) << "launch " << launch << " peer " << q;
            unsigned long long wrong =
                CountWrong(m.buf + out_off + static_cast<size_t>(q) * kMax, kMax, 0, size,
                           pattern_seed + static_cast<uint64_t>(q), 0);
            ASSERT_EQ(wrong, 0u) << (ll8 ? "LL8" : "LL16") << " launch " << launch << " from rank "
                                 << q << ", " << size << " bytes";
        }
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

TEST_F(MemoryChannel, ElementReadWriteRelaxedSignalAndPoll)
{
    Mesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(Comm(), 16 * static_cast<size_t>(NRanks())));
    CUDA_OK(cudaMemset(m.buf, 0, m.bytes));
    CUDA_OK(cudaMemset(status_, 0x7F, sizeof(int) * static_cast<size_t>(NRanks())));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    CUDA_OK(test_channel_element_ops(m.dev_handles, NRanks(), Rank(), status_, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int> st = Statuses();
    for (int q = 0; q < NRanks(); q++) {
        if (q != Rank()) {
            EXPECT_EQ(st[static_cast<size_t>(q)], MACO_OK) << "peer " << q;
        }
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

TEST_F(MemoryChannel, SignalWaitPingPong)
{
    Mesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(Comm(), 4096));
    CUDA_OK(cudaMemset(status_, 0x7F, sizeof(int)));
    const int iters = 100000;
    auto t0 = std::chrono::steady_clock::now();
    if (Rank() < 2 && NRanks() >= 2) {
        int peer = 1 - Rank();
        CUDA_OK(test_ping_pong(m.dev_handles + peer, iters, Rank() == 0, status_, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(Statuses()[0], MACO_OK);
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count();
        if (Rank() == 0)
            printf("ping-pong: %d round trips in %.0f us (%.2f us each, kernel launch included)\n",
                   iters, us, us / iters);
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
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
        CUDA_OK(cudaMemset(status_, 0x7F, sizeof(int)));
        if (Rank() == 0) {
            auto t0 = std::chrono::steady_clock::now();
            CUDA_OK(test_wait_once(m.dev_handles + 1, status_, nullptr));
            CUDA_OK(cudaDeviceSynchronize());
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            EXPECT_EQ(Statuses()[0], MACO_ERR_TIMEOUT);
            EXPECT_GE(s, 0.9);
            EXPECT_LT(s, 10.0);
            maco_status_t async_st = MACO_OK;
            ASSERT_EQ(maco_comm_get_async_error(comm, &async_st), MACO_OK);
            EXPECT_EQ(async_st, MACO_ERR_TIMEOUT);
            std::string msg = maco_comm_get_last_error(comm);
            EXPECT_NE(msg.find("waited for rank 1"), std::string::npos) << msg;
            EXPECT_NE(msg.find("semaphore"), std::string::npos) << msg;
            int one = 1;
            CUDA_OK(cudaMemcpy(status_, &one, sizeof(int), cudaMemcpyHostToDevice));
            CUDA_OK(cudaDeviceSynchronize());
        }
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
    ASSERT_EQ(maco_comm_destroy(comm), MACO_OK);
}

/* A bound for tests of device-local synchronisation: its own claim word and report. */
struct LocalBound {
    maco_device_wait_bound_t bound{};
    maco_device_error_t *report = nullptr;
    int32_t *claim = nullptr;
    LocalBound()
    {
        cudaHostAlloc(&report, sizeof(*report), cudaHostAllocMapped);
        memset(report, 0, sizeof(*report));
        cudaMalloc(&claim, sizeof(int32_t));
        cudaMemset(claim, 0, sizeof(int32_t));
        cudaHostGetDevicePointer(reinterpret_cast<void **>(&bound.report), report, 0);
        bound.claim = claim;
        bound.timeout_ns = 10ull * 1000000000ull;
    }
    ~LocalBound()
    {
        cudaFreeHost(report);
        cudaFree(claim);
    }
};

TEST_F(MemoryChannel, GridBarrierOrdersEveryCta)
{
    LocalBound lb;
    /* Every CTA waits for every other: they must be co-resident, also next to the kernels of
     * the ranks that share this GPU (maco_comm_get_coresident_ctas). */
    int ctas = 0;
    ASSERT_EQ(maco_comm_get_coresident_ctas(Comm(), &ctas), MACO_OK);
    ASSERT_GE(ctas, 1);
    int nblocks = std::min(ctas, 64);
    void *barrier;
    uint32_t *slots;
    CUDA_OK(cudaMalloc(&barrier, sizeof(maco_grid_barrier_t)));
    CUDA_OK(cudaMemset(barrier, 0, sizeof(maco_grid_barrier_t)));
    CUDA_OK(cudaMalloc(&slots, sizeof(uint32_t) * static_cast<size_t>(nblocks)));
    CUDA_OK(cudaMemset(counter_, 0, sizeof(unsigned long long)));
    CUDA_OK(cudaMemset(status_, 0, sizeof(int)));
    for (int launch = 0; launch < 3; launch++)
        CUDA_OK(
            test_grid_barrier(barrier, slots, nblocks, 500, &lb.bound, counter_, status_, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long errors = 1;
    CUDA_OK(cudaMemcpy(&errors, counter_, sizeof(errors), cudaMemcpyDeviceToHost));
    EXPECT_EQ(Statuses()[0], MACO_OK);
    EXPECT_EQ(errors, 0u) << "CTAs saw slots of another round";
    cudaFree(barrier);
    cudaFree(slots);
}

/* The communicator counts the ranks on this rank's GPU (equal UUIDs, read here from CUDA) and
 * gives kernels that wait on peers min over ranks of SMs / ranks per GPU CTAs (comm.h). */
TEST_F(MemoryChannel, ReportsGpuSharingAndCoresidentCtas)
{
    struct Info {
        unsigned char uuid[16];
        int32_t sms;
        int32_t pad;
    };
    std::vector<Info> all(static_cast<size_t>(NRanks()));
    int dev = -1;
    ASSERT_EQ(maco_comm_get_cuda_device(Comm(), &dev), MACO_OK);
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, dev));
    Info &mine = all[static_cast<size_t>(Rank())];
    memcpy(mine.uuid, &prop.uuid, 16);
    CUDA_OK(cudaDeviceGetAttribute(&mine.sms, cudaDevAttrMultiProcessorCount, dev));
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), all.data(), sizeof(Info)), MACO_OK);
    int expect_ranks = 0, expect_ctas = 1 << 30;
    for (const Info &r : all) {
        int sharers = 0;
        for (const Info &q : all)
            sharers += memcmp(r.uuid, q.uuid, 16) == 0;
        if (memcmp(r.uuid, mine.uuid, 16) == 0)
            expect_ranks++;
        expect_ctas = std::min(expect_ctas, std::max(1, r.sms / sharers));
    }
    int gpu_ranks = -1, ctas = -1;
    ASSERT_EQ(maco_comm_get_gpu_ranks(Comm(), &gpu_ranks), MACO_OK);
    ASSERT_EQ(maco_comm_get_coresident_ctas(Comm(), &ctas), MACO_OK);
    EXPECT_EQ(gpu_ranks, expect_ranks);
    EXPECT_EQ(ctas, expect_ctas);
    maco_test::AllowLog("maco_comm_get_gpu_ranks: NULL argument");
    EXPECT_EQ(maco_comm_get_gpu_ranks(Comm(), nullptr), MACO_ERR_INVALID_ARGUMENT);
}

TEST_F(MemoryChannel, DeviceSemaphoreGivesMutualExclusion)
{
    LocalBound lb;
    void *sem;
    CUDA_OK(cudaMalloc(&sem, sizeof(maco_device_semaphore_t)));
    int32_t one = 1;
    CUDA_OK(cudaMemcpy(sem, &one, sizeof(one), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(counter_, 0, sizeof(unsigned long long)));
    CUDA_OK(cudaMemset(status_, 0, sizeof(int)));
    const int nblocks = 32, iters = 200;
    CUDA_OK(test_device_semaphore(sem, counter_, nblocks, iters, &lb.bound, status_, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long count = 0;
    CUDA_OK(cudaMemcpy(&count, counter_, sizeof(count), cudaMemcpyDeviceToHost));
    EXPECT_EQ(Statuses()[0], MACO_OK);
    EXPECT_EQ(count, static_cast<unsigned long long>(nblocks) * iters);
    cudaFree(sem);
}

/* maco_mem_alloc_host memory is mapped by the other processes of the node. */
TEST_F(MemoryChannel, SharedHostMemoryReachesEveryPeer)
{
    const size_t bytes = (1 << 20) + 3;
    void *host = nullptr;
    ASSERT_EQ(maco_mem_alloc_host(Comm(), bytes, &host), MACO_OK);
    char *h = static_cast<char *>(host);
    for (size_t i = 0; i < bytes; i++)
        h[i] = static_cast<char>(test_pattern_byte(seed_ + static_cast<uint64_t>(Rank()), i));
    maco_mem_t mine;
    ASSERT_EQ(maco_mem_register(Comm(), host, bytes, &mine), MACO_OK);
    std::vector<uint8_t> handles(static_cast<size_t>(NRanks()) * MACO_MEM_HANDLE_BYTES);
    ASSERT_EQ(
        maco_mem_serialize(mine, &handles[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]),
        MACO_OK);
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), handles.data(), MACO_MEM_HANDLE_BYTES),
              MACO_OK);
    for (int q = 0; q < NRanks(); q++) {
        if (q == Rank())
            continue;
        maco_mem_t theirs;
        ASSERT_EQ(maco_mem_import(Comm(), &handles[static_cast<size_t>(q) * MACO_MEM_HANDLE_BYTES],
                                  &theirs),
                  MACO_OK)
            << maco_comm_get_last_error(Comm());
        void *p;
        maco_mem_get_pointer(theirs, &p);
        size_t wrong = 0;
        for (size_t i = 0; i < bytes; i++)
            wrong += static_cast<uint8_t>(static_cast<char *>(p)[i]) !=
                     test_pattern_byte(seed_ + static_cast<uint64_t>(q), i);
        EXPECT_EQ(wrong, 0u) << "host memory of rank " << q;
        maco_mem_deregister(theirs);
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    maco_mem_deregister(mine);
    ASSERT_EQ(maco_mem_free(Comm(), host), MACO_OK);
}

TEST_F(MemoryChannel, RegistrationErrorsAreClear)
{
    maco_test::AllowLog("maco_mem_");
    maco_mem_t mem = nullptr;
    std::vector<char> pageable(4096);
    EXPECT_EQ(maco_mem_register(Comm(), pageable.data(), pageable.size(), &mem),
              MACO_ERR_INVALID_ARGUMENT);
    /* The communicator keeps its first error (an earlier test's); the log has this one. */
    std::vector<std::string> logged = maco_test::LoggedProblems();
    ASSERT_FALSE(logged.empty());
    EXPECT_NE(logged.back().find("pageable"), std::string::npos) << logged.back();
    char *d;
    CUDA_OK(cudaMalloc(&d, 1 << 20));
    EXPECT_EQ(maco_mem_register(Comm(), d + 4096, 1 << 20, &mem), MACO_ERR_INVALID_ARGUMENT)
        << "a range past the end of the allocation";
    EXPECT_EQ(maco_mem_register(Comm(), d, 0, &mem), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(mem, nullptr);
    EXPECT_EQ(maco_mem_free(Comm(), d), MACO_ERR_INVALID_ARGUMENT) << "not MACO's allocation";
    /* Two ranges of one allocation share one export; both import consistently. */
    maco_mem_t a, b;
    ASSERT_EQ(maco_mem_register(Comm(), d, 4096, &a), MACO_OK);
    ASSERT_EQ(maco_mem_register(Comm(), d + 65536, 4096, &b), MACO_OK);
    std::vector<uint8_t> ha(static_cast<size_t>(NRanks()) * MACO_MEM_HANDLE_BYTES);
    std::vector<uint8_t> hb(ha.size());
    maco_mem_serialize(a, &ha[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]);
    maco_mem_serialize(b, &hb[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]);
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), ha.data(), MACO_MEM_HANDLE_BYTES), MACO_OK);
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), hb.data(), MACO_MEM_HANDLE_BYTES), MACO_OK);
    int peer = (Rank() + 1) % NRanks();
    maco_mem_t ia, ib;
    ASSERT_EQ(maco_mem_import(Comm(), &ha[static_cast<size_t>(peer) * MACO_MEM_HANDLE_BYTES], &ia),
              MACO_OK);
    ASSERT_EQ(maco_mem_import(Comm(), &hb[static_cast<size_t>(peer) * MACO_MEM_HANDLE_BYTES], &ib),
              MACO_OK)
        << "a second buffer of an allocation already mapped";
    void *pa, *pb;
    maco_mem_get_pointer(ia, &pa);
    maco_mem_get_pointer(ib, &pb);
    EXPECT_EQ(static_cast<char *>(pb) - static_cast<char *>(pa), 65536);
    /* Pinned host memory MACO did not allocate is usable only inside its process. */
    void *pinned;
    CUDA_OK(cudaHostAlloc(&pinned, 4096, cudaHostAllocDefault));
    maco_mem_t hp;
    ASSERT_EQ(maco_mem_register(Comm(), pinned, 4096, &hp), MACO_OK);
    std::vector<uint8_t> hh(ha.size());
    maco_mem_serialize(hp, &hh[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]);
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), hh.data(), MACO_MEM_HANDLE_BYTES), MACO_OK);
    maco_mem_t ih = nullptr;
    EXPECT_EQ(maco_mem_import(Comm(), &hh[static_cast<size_t>(peer) * MACO_MEM_HANDLE_BYTES], &ih),
              MACO_ERR_UNSUPPORTED);
    EXPECT_EQ(ih, nullptr);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    for (maco_mem_t m : { ia, ib, a, b, hp })
        maco_mem_deregister(m);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    cudaFreeHost(pinned);
    cudaFree(d);
}

} // namespace
