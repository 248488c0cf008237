/*
 * test_port_channel_mp.cc - port channels end to end with host memory, between real processes
 * (maco-run -n 2 and -n 4): host threads push into the proxy's FIFO, the proxy thread carries
 * out puts and signals on the channel's transport, peers wait and check every byte. Needs no
 * GPU, so CI runs it. The transport comes from TEST_MACO_PORT_TRANSPORT: host (the default:
 * host memory), auto (MACO_TRANSPORT_AUTO: host memory on the same node, TCP or IB across
 * simulated nodes, or what MACO_TRANSPORT forces), tcp or ib; tests/CMakeLists.txt runs the
 * suite with several (port_channel_host_*, port_channel_tcp_*), tests/ibvm over soft-RoCE.
 */
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "fork_ranks.h"
#include "maco_test.h"
#include "test_kernels.h"

namespace
{

using maco_test::Bootstrap;
using maco_test::NRanks;
using maco_test::Rank;

/* The transport the suite asks for (TEST_MACO_PORT_TRANSPORT). */
maco_transport_t TestTransport()
{
    const char *v = getenv("TEST_MACO_PORT_TRANSPORT");
    std::string t = v != nullptr ? v : "host";
    if (t == "auto")
        return MACO_TRANSPORT_AUTO;
    if (t == "tcp")
        return MACO_TRANSPORT_TCP;
    if (t == "ib")
        return MACO_TRANSPORT_IB;
    return MACO_TRANSPORT_HOST_MEMORY;
}

/* Every rank's node (maco_comm_get_node), gathered. */
std::vector<int> Nodes(maco_comm_t comm)
{
    std::vector<int> nodes(static_cast<size_t>(NRanks()), -1);
    int mine = -1;
    EXPECT_EQ(maco_comm_get_node(comm, &mine), MACO_OK);
    nodes[static_cast<size_t>(Rank())] = mine;
    EXPECT_EQ(maco_bootstrap_allgather(Bootstrap(), nodes.data(), sizeof(int)), MACO_OK);
    return nodes;
}

/* Shared host buffers on every rank, a started proxy and a host-memory channel to each peer. */
struct HostMesh {
    maco_comm_t comm = nullptr;
    char *buf = nullptr;
    size_t bytes = 0;
    maco_mem_t mine = nullptr;
    std::vector<maco_mem_t> peers;
    maco_test::PortChannels port;

    void Setup(size_t size)
    {
        ASSERT_EQ(maco_comm_create(Bootstrap(), -1, &comm), MACO_OK);
        bytes = size;
        void *p = nullptr;
        ASSERT_EQ(maco_mem_alloc_host(comm, bytes, &p), MACO_OK) << maco_comm_get_last_error(comm);
        buf = static_cast<char *>(p);
        memset(buf, 0xAB, bytes);
        ASSERT_EQ(maco_mem_register(comm, buf, bytes, &mine), MACO_OK)
            << maco_comm_get_last_error(comm);
        ASSERT_NO_FATAL_FAILURE(maco_test::ExchangeMem(comm, mine, &peers));
        ASSERT_NO_FATAL_FAILURE(port.Create(comm, TestTransport(), mine, peers));
    }

    /* Rank r's data lives in its slot r: fills this rank's slot of `slot` bytes with the
     * pattern of seed + rank. */
    void FillMySlot(size_t slot, uint64_t seed)
    {
        char *p = buf + static_cast<size_t>(Rank()) * slot;
        for (size_t i = 0; i < slot; i++)
            p[i] = static_cast<char>(test_pattern_byte(seed + static_cast<uint64_t>(Rank()), i));
    }

    /* Wrong bytes in slot q, which should hold rank q's pattern (seed + q, from pattern byte
     * `offset`) at [skew, skew + size) and the poison 0xAB elsewhere. */
    size_t CountWrongFrom(int q, size_t slot, size_t skew, size_t size, uint64_t seed,
                          uint64_t offset) const
    {
        const char *p = buf + static_cast<size_t>(q) * slot;
        uint64_t qseed = seed + static_cast<uint64_t>(q);
        size_t wrong = 0;
        for (size_t i = 0; i < slot; i++) {
            uint8_t want = 0xAB;
            if (i >= skew && i < skew + size)
                want = test_pattern_byte(qseed, i - skew + offset);
            wrong += static_cast<uint8_t>(p[i]) != want;
        }
        return wrong;
    }

    ~HostMesh()
    {
        port.Destroy();
        for (auto p : peers)
            maco_mem_deregister(p);
        maco_mem_deregister(mine);
        maco_bootstrap_barrier(Bootstrap()); /* peers unmapped this buffer */
        if (buf != nullptr)
            maco_mem_free(comm, buf);
        maco_comm_destroy(comm);
    }
};

class PortChannelHost : public maco_test::Test
{
  protected:
    void SetUp() override
    {
        maco_test::Test::SetUp();
        seed_ = maco_test::SharedSeed();
    }
    uint64_t seed_ = 0;
};

TEST_F(PortChannelHost, PutWithSignalOfRandomSizesReachesEveryPeer)
{
    const size_t kSlot = (1 << 20) + 7;
    HostMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    std::mt19937_64 rng(seed_);
    for (int round = 0; round < 20; round++) {
        size_t size = round == 0 ? 1 : 1 + rng() % (kSlot - 40);
        size_t src_skew = rng() % 17, dst_skew = rng() % 17;
        uint64_t pseed = seed_ ^ (static_cast<uint64_t>(round) << 40);
        memset(m.buf, 0xAB, m.bytes);
        m.FillMySlot(kSlot, pseed);
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK); /* all poisoned before any put */
        size_t base = static_cast<size_t>(Rank()) * kSlot;
        for (int q = 0; q < NRanks(); q++) {
            if (q != Rank()) {
                ASSERT_EQ(maco_port_channel_put_with_signal(m.port.chans[static_cast<size_t>(q)],
                                                            base + dst_skew, base + src_skew, size),
                          MACO_OK);
            }
        }
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            ASSERT_EQ(maco_port_channel_wait(m.port.chans[static_cast<size_t>(q)], 20000), MACO_OK)
                << maco_comm_get_last_error(m.comm);
            ASSERT_EQ(m.CountWrongFrom(q, kSlot, dst_skew, size, pseed, src_skew), 0u)
                << "round " << round << " from rank " << q << ", " << size << " bytes";
        }
        /* This rank's puts are done with its buffer (flush) before the next round rewrites it. */
        for (int q = 0; q < NRanks(); q++) {
            if (q == Rank())
                continue;
            ASSERT_EQ(maco_port_channel_flush(m.port.chans[static_cast<size_t>(q)]), MACO_OK);
        }
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    }
}

TEST_F(PortChannelHost, FlushMeansTheDataHasLanded)
{
    const size_t kSlot = 65536;
    HostMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    m.FillMySlot(kSlot, seed_);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    size_t base = static_cast<size_t>(Rank()) * kSlot;
    for (int q = 0; q < NRanks(); q++) {
        if (q != Rank()) {
            ASSERT_EQ(
                maco_port_channel_put(m.port.chans[static_cast<size_t>(q)], base, base, kSlot),
                MACO_OK);
        }
    }
    /* No signal: the flush alone says the data is in the peers' memory. */
    int any = (Rank() + 1) % NRanks();
    ASSERT_EQ(maco_port_channel_flush(m.port.chans[static_cast<size_t>(any)]), MACO_OK);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    for (int q = 0; q < NRanks(); q++) {
        if (q != Rank()) {
            EXPECT_EQ(m.CountWrongFrom(q, kSlot, 0, kSlot, seed_, 0), 0u) << "from rank " << q;
        }
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

/* Four host threads push puts of their quarter at once; then one signal per peer. */
TEST_F(PortChannelHost, ManyThreadsPushAtOnce)
{
    const size_t kSlot = 4 << 20;
    HostMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    m.FillMySlot(kSlot, seed_);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    std::atomic<int> failures{ 0 };
    std::vector<std::thread> threads;
    const size_t piece = 4096;
    for (int t = 0; t < 4; t++) {
        threads.emplace_back([&, t] {
            size_t base = static_cast<size_t>(Rank()) * kSlot;
            for (size_t off = static_cast<size_t>(t) * piece; off < kSlot; off += 4 * piece)
                for (int q = 0; q < NRanks(); q++) {
                    if (q != Rank() &&
                        maco_port_channel_put(m.port.chans[static_cast<size_t>(q)], base + off,
                                              base + off, piece) != MACO_OK)
                        failures++;
                }
        });
    }
    for (auto &t : threads)
        t.join();
    ASSERT_EQ(failures.load(), 0);
    for (int q = 0; q < NRanks(); q++) {
        if (q != Rank()) {
            ASSERT_EQ(maco_port_channel_signal(m.port.chans[static_cast<size_t>(q)]), MACO_OK);
        }
    }
    for (int q = 0; q < NRanks(); q++) {
        if (q == Rank())
            continue;
        ASSERT_EQ(maco_port_channel_wait(m.port.chans[static_cast<size_t>(q)], 30000), MACO_OK);
        EXPECT_EQ(m.CountWrongFrom(q, kSlot, 0, kSlot, seed_, 0), 0u) << "from rank " << q;
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

/* Many puts to overlapping ranges, one after the other, then a signal: the bytes end up as
 * if the puts had landed in order (later bytes win), whatever the transport does with them
 * (TCP cuts them into pieces spread over several sockets). */
TEST_F(PortChannelHost, OverlappingPutsLandInOrder)
{
    const size_t kSlot = 256 << 10;
    HostMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    struct Put {
        size_t src, dst, len;
    };
    /* Rank q's sequence of puts, the same on every rank (from the shared seed). */
    auto puts_of = [&](int q) {
        std::mt19937_64 rng(seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(q + 1)));
        std::vector<Put> v;
        for (int i = 0; i < 60; i++) {
            size_t len = 1 + rng() % (i % 3 == 0 ? kSlot / 2 : 4096);
            v.push_back({ rng() % (kSlot - len + 1), rng() % (kSlot - len + 1), len });
        }
        return v;
    };
    memset(m.buf, 0xAB, m.bytes);
    m.FillMySlot(kSlot, seed_);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    size_t base = static_cast<size_t>(Rank()) * kSlot;
    for (const Put &p : puts_of(Rank()))
        for (int q = 0; q < NRanks(); q++)
            if (q != Rank()) {
                ASSERT_EQ(maco_port_channel_put(m.port.chans[static_cast<size_t>(q)], base + p.dst,
                                                base + p.src, p.len),
                          MACO_OK);
            }
    for (int q = 0; q < NRanks(); q++)
        if (q != Rank()) {
            ASSERT_EQ(maco_port_channel_signal(m.port.chans[static_cast<size_t>(q)]), MACO_OK);
        }
    for (int q = 0; q < NRanks(); q++) {
        if (q == Rank())
            continue;
        ASSERT_EQ(maco_port_channel_wait(m.port.chans[static_cast<size_t>(q)], 30000), MACO_OK)
            << maco_comm_get_last_error(m.comm);
        /* What rank q's puts make of the poisoned slot, applied in order. */
        std::vector<uint8_t> want(kSlot, 0xAB);
        for (const Put &p : puts_of(q))
            for (size_t i = 0; i < p.len; i++)
                want[p.dst + i] = test_pattern_byte(seed_ + static_cast<uint64_t>(q), p.src + i);
        const uint8_t *got =
            reinterpret_cast<const uint8_t *>(m.buf) + static_cast<size_t>(q) * kSlot;
        size_t wrong = 0, first = kSlot;
        for (size_t i = 0; i < kSlot; i++)
            if (got[i] != want[i]) {
                wrong++;
                first = std::min(first, i);
            }
        EXPECT_EQ(wrong, 0u) << "from rank " << q << ", first wrong byte " << first;
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

TEST_F(PortChannelHost, BadCallsAreClearErrorsAndNothingHangs)
{
    const size_t kSlot = 4096;
    HostMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    int peer = (Rank() + 1) % NRanks();
    maco_port_channel_t ch = m.port.chans[static_cast<size_t>(peer)];
    maco_test::AllowLog("does not fit");
    EXPECT_EQ(maco_port_channel_put(ch, m.bytes - 10, 0, 11), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_port_channel_put(ch, 0, m.bytes, 1), MACO_ERR_INVALID_ARGUMENT);
    /* Nobody signals: the wait ends at its bound, naming the peer. */
    maco_test::AllowLog("no signal from rank");
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(maco_port_channel_wait(ch, 0), MACO_ERR_TIMEOUT) << "0 looks once";
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.2);
    t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(maco_port_channel_wait(ch, 300), MACO_ERR_TIMEOUT);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 5.0);
    std::string msg = maco_comm_get_last_error(m.comm);
    EXPECT_NE(msg.find("rank " + std::to_string(peer)), std::string::npos) << msg;
    /* A stopped proxy fails a flush at once instead of leaving the caller waiting, and a put
     * after the stop is an error, not silently dropped (regression: it returned MACO_OK). */
    ASSERT_EQ(maco_proxy_stop(m.port.proxy), MACO_OK);
    maco_test::AllowLog("the proxy is not running");
    t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(maco_port_channel_flush(ch), MACO_ERR_REMOTE);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    EXPECT_EQ(maco_port_channel_put(ch, 0, 0, 8), MACO_ERR_REMOTE);
    EXPECT_EQ(maco_port_channel_signal(ch), MACO_ERR_REMOTE);
    /* The proxy outlives its channels (regression: destroy returned MACO_OK and freed it, and
     * a later maco_port_channel_destroy wrote freed memory). */
    maco_test::AllowLog("live port channel");
    EXPECT_EQ(maco_proxy_destroy(m.port.proxy), MACO_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(maco_test::LoggedProblems().back()).find("ids 0"), std::string::npos)
        << maco_test::LoggedProblems().back();
    int ndev = 0;
    if (maco_comm_get_cuda_device(m.comm, &ndev) == MACO_OK && ndev < 0) {
        maco_test::AllowLog("needs GPUs");
        maco_port_channel_t cuda_ch = nullptr;
        EXPECT_EQ(maco_port_channel_create(m.port.proxy, peer, MACO_TRANSPORT_CUDA_COPY, m.mine,
                                           m.peers[static_cast<size_t>(peer)], &cuda_ch),
                  MACO_ERR_UNSUPPORTED);
        EXPECT_EQ(cuda_ch, nullptr);
    }
    /* A size whose page round-up would wrap (regression: it failed as "mmap(0)"). */
    maco_test::AllowLog("larger than the 4 PiB");
    void *huge = nullptr;
    EXPECT_EQ(maco_mem_alloc_host(m.comm, SIZE_MAX, &huge), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(huge, nullptr);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

/* Patches the little-endian u64 at `off` of a serialized handle. */
void PutU64(uint8_t *h, size_t off, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        h[off + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}

/*
 * A damaged or forged memory handle is refused with MACO_ERR_INVALID_ARGUMENT before
 * anything is mapped or touched; the genuine one still imports. (Regression: a handle
 * claiming 1 GiB over a 4 KiB buffer imported, and reading its end raised SIGSEGV; an
 * allocation size beyond the memfd's raised SIGBUS; a put inside the claimed range killed
 * the proxy.)
 */
TEST_F(PortChannelHost, ForgedHandlesAreRefused)
{
    const size_t kSlot = 4096;
    HostMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(kSlot * static_cast<size_t>(NRanks())));
    std::vector<uint8_t> all(static_cast<size_t>(NRanks()) * MACO_MEM_HANDLE_BYTES);
    ASSERT_EQ(maco_mem_serialize(m.mine, &all[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]),
              MACO_OK);
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), all.data(), MACO_MEM_HANDLE_BYTES), MACO_OK);
    int peer = (Rank() + 1) % NRanks();
    std::vector<int> nodes = Nodes(m.comm);
    bool any_remote = false; /* every rank decides alike */
    for (int r = 0; r < NRanks(); r++)
        any_remote |=
            nodes[static_cast<size_t>((r + 1) % NRanks())] != nodes[static_cast<size_t>(r)];
    if (any_remote) {
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        GTEST_SKIP() << "some rank's next rank is on another node: memory of another node is not "
                     << "mapped, and a network transport checks what a peer names against the "
                     << "owner's registrations instead (maco__mem_lookup)";
    }
    const uint8_t *genuine = &all[static_cast<size_t>(peer) * MACO_MEM_HANDLE_BYTES];
    const uint64_t gib = 1ull << 30;
    struct Forgery {
        const char *what;
        size_t off;
        uint64_t value, value2; /* value2 goes to offset 32 (allocation size) when non-zero */
        const char *says;
    } forgeries[] = {
        { "1 GiB over the buffer", 16, gib, 0, "inconsistent" },
        { "allocation larger than the memfd", 16, gib, gib, "but the memory it names has" },
        { "offset past the allocation", 24, m.bytes + 1, 0, "inconsistent" },
        { "offset + bytes wrapping", 24, ~0ull - 8, 0, "inconsistent" },
        { "zero bytes", 16, 0, 0, "inconsistent" },
    };
    maco_test::AllowLog("maco_mem_import");
    for (const Forgery &f : forgeries) {
        uint8_t h[MACO_MEM_HANDLE_BYTES];
        memcpy(h, genuine, sizeof(h));
        PutU64(h, f.off, f.value);
        if (f.value2 != 0)
            PutU64(h, 32, f.value2);
        maco_mem_t imported = nullptr;
        EXPECT_EQ(maco_mem_import(m.comm, h, &imported), MACO_ERR_INVALID_ARGUMENT) << f.what;
        EXPECT_EQ(imported, nullptr) << f.what;
        std::vector<std::string> logged = maco_test::LoggedProblems();
        ASSERT_FALSE(logged.empty());
        EXPECT_NE(logged.back().find(f.says), std::string::npos) << f.what << ": " << logged.back();
    }
    /* Memory not mapped here yet: its size is checked against the memfd's (fstat). */
    void *extra = nullptr;
    maco_mem_t extra_mem = nullptr;
    ASSERT_EQ(maco_mem_alloc_host(m.comm, 4096, &extra), MACO_OK);
    ASSERT_EQ(maco_mem_register(m.comm, extra, 4096, &extra_mem), MACO_OK);
    std::vector<uint8_t> extras(all.size());
    ASSERT_EQ(
        maco_mem_serialize(extra_mem, &extras[static_cast<size_t>(Rank()) * MACO_MEM_HANDLE_BYTES]),
        MACO_OK);
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), extras.data(), MACO_MEM_HANDLE_BYTES), MACO_OK);
    {
        uint8_t h[MACO_MEM_HANDLE_BYTES];
        memcpy(h, &extras[static_cast<size_t>(peer) * MACO_MEM_HANDLE_BYTES], sizeof(h));
        PutU64(h, 16, gib);
        PutU64(h, 32, gib);
        maco_mem_t imported = nullptr;
        EXPECT_EQ(maco_mem_import(m.comm, h, &imported), MACO_ERR_INVALID_ARGUMENT);
        EXPECT_NE(maco_test::LoggedProblems().back().find("bytes of host memory but the memory"),
                  std::string::npos)
            << maco_test::LoggedProblems().back();
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    maco_mem_deregister(extra_mem);
    ASSERT_EQ(maco_mem_free(m.comm, extra), MACO_OK);
    uint8_t h[MACO_MEM_HANDLE_BYTES];
    memcpy(h, genuine, sizeof(h));
    h[8] = static_cast<uint8_t>(NRanks()); /* owner: not a rank */
    maco_mem_t imported = nullptr;
    EXPECT_EQ(maco_mem_import(m.comm, h, &imported), MACO_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(maco_mem_import(m.comm, genuine, &imported), MACO_OK) << "the genuine handle";
    maco_mem_deregister(imported);
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

/* A forked rank's own 2-rank job (maco_test::ForkRanks): a communicator, `bytes` of shared
 * host memory, a started proxy and one channel to the other rank over `transport`. Returns
 * 0, or the exit code the rank should return: 10 (bootstrap or communicator), 11 (memory),
 * 12 (proxy or channel). */
struct ForkedChannel {
    maco_bootstrap_t bs = nullptr;
    maco_comm_t comm = nullptr;
    void *buf = nullptr;
    maco_port_channel_t ch = nullptr;
    maco_proxy_t proxy = nullptr;
    maco_mem_t mine = nullptr, peer = nullptr;

    /* What this rank holds, released locally (the peer may be dead: nothing collective), so
     * that a leak check of the surviving rank (valgrind) sees none; the communicator stays. */
    ~ForkedChannel()
    {
        maco_port_channel_destroy(ch);
        if (proxy != nullptr)
            maco_proxy_stop(proxy);
        maco_proxy_destroy(proxy);
        maco_mem_deregister(peer);
        maco_mem_deregister(mine);
        if (buf != nullptr)
            maco_mem_free(comm, buf);
    }

    int Setup(int rank, size_t bytes, maco_transport_t transport)
    {
        if (maco_bootstrap_create_from_env(&bs) != MACO_OK ||
            maco_comm_create(bs, -1, &comm) != MACO_OK)
            return 10;
        uint8_t h[2][MACO_MEM_HANDLE_BYTES];
        if (maco_mem_alloc_host(comm, bytes, &buf) != MACO_OK ||
            maco_mem_register(comm, buf, bytes, &mine) != MACO_OK ||
            maco_mem_serialize(mine, h[rank]) != MACO_OK ||
            maco_bootstrap_allgather(bs, h, MACO_MEM_HANDLE_BYTES) != MACO_OK ||
            maco_mem_import(comm, h[1 - rank], &peer) != MACO_OK)
            return 11;
        if (maco_proxy_create(comm, &proxy) != MACO_OK || maco_proxy_start(proxy) != MACO_OK ||
            maco_port_channel_create(proxy, 1 - rank, transport, mine, peer, &ch) != MACO_OK ||
            maco_bootstrap_barrier(bs) != MACO_OK)
            return 12;
        return 0;
    }
};

/* Each channel got the transport the topology and the settings call for. */
TEST_F(PortChannelHost, TransportFollowsTopology)
{
    HostMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(4096 * static_cast<size_t>(NRanks())));
    std::vector<int> nodes = Nodes(m.comm);
    const char *forced = getenv("MACO_TRANSPORT");
    std::string env = forced != nullptr && forced[0] != '\0' ? forced : "auto";
    for (int q = 0; q < NRanks(); q++) {
        if (q == Rank())
            continue;
        maco_transport_t got = MACO_TRANSPORT_AUTO;
        ASSERT_EQ(maco_port_channel_get_transport(m.port.chans[static_cast<size_t>(q)], &got),
                  MACO_OK);
        maco_transport_t want = TestTransport();
        if (want == MACO_TRANSPORT_AUTO) {
            bool same = nodes[static_cast<size_t>(q)] == nodes[static_cast<size_t>(Rank())];
            if (env == "tcp")
                want = MACO_TRANSPORT_TCP;
            else if (env == "ib")
                want = MACO_TRANSPORT_IB;
            else if (same)
                want = MACO_TRANSPORT_HOST_MEMORY;
            else
                want = getenv("TEST_MACO_EXPECT_REMOTE") != nullptr &&
                               std::string(getenv("TEST_MACO_EXPECT_REMOTE")) == "ib"
                           ? MACO_TRANSPORT_IB
                           : MACO_TRANSPORT_TCP;
        }
        EXPECT_EQ(got, want) << "channel to rank " << q << " (node "
                             << nodes[static_cast<size_t>(q)] << ", this rank's "
                             << nodes[static_cast<size_t>(Rank())] << ")";
    }
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
}

/*
 * A network transport whose peer is killed in the middle of a transfer: the survivor's flush
 * fails with MACO_ERR_REMOTE naming the peer within seconds (never a hang, never MACO_OK), and
 * the communicator's async error says what failed. Its own 2-rank job.
 */
TEST_F(PortChannelHost, PeerKilledMidTransferFailsNamingIt)
{
    maco_transport_t t = TestTransport();
    if (t == MACO_TRANSPORT_HOST_MEMORY)
        GTEST_SKIP() << "for network transports (TEST_MACO_PORT_TRANSPORT=tcp, ib or auto)";
    if (Rank() != 0)
        GTEST_SKIP() << "rank 0 runs this test's own job";
    /* The transport by name (the host id is cached before the fork, so simulated nodes would
     * not differ here): the one asked for, or with auto the one MACO_TRANSPORT forces, else TCP. */
    const char *forced = getenv("MACO_TRANSPORT");
    std::string word = t == MACO_TRANSPORT_IB                             ? "ib"
                       : t == MACO_TRANSPORT_TCP                          ? "tcp"
                       : forced != nullptr && std::string(forced) == "ib" ? "ib"
                                                                          : "tcp";
    std::vector<int> codes = maco_test::ForkRanks({ { 0, 2 }, { 1, 2 } }, [word](int rank) {
        setenv("MACO_TRANSPORT", word.c_str(), 1);
        setenv("MACO_LOG_LEVEL", "error", 1);
        setenv("MACO_DEVICE_TIMEOUT", "30s", 1);
        static std::atomic<int> error_lines{ 0 };
        maco_log_set_handler(
            [](maco_log_level_t level, const char *, void *) {
                if (level == MACO_LOG_ERROR)
                    error_lines++;
            },
            nullptr);
        const size_t bytes = 8 << 20;
        ForkedChannel f;
        int rc = f.Setup(rank, bytes, MACO_TRANSPORT_AUTO);
        if (rc != 0)
            return rc;
        maco_comm_t comm = f.comm;
        maco_port_channel_t ch = f.ch;
        if (rank == 1) {
            usleep(200000); /* rank 0 is sending by now */
            _exit(0);       /* dies in the middle, without a word */
        }
        /* A rejected call first: the failure below must replace it as the communicator's
         * error (maco_comm_get_last_error says what broke the communicator). */
        if (maco_allreduce(nullptr, nullptr, 1, MACO_FLOAT32, MACO_SUM, comm, nullptr) == MACO_OK)
            return 16;
        auto t0 = std::chrono::steady_clock::now();
        maco_status_t st = MACO_OK;
        /* Puts and flushes until one fails; a dead peer must fail one within seconds. */
        for (int i = 0; i < 100000 && st == MACO_OK; i++) {
            st = maco_port_channel_put(ch, 0, 0, bytes);
            if (st == MACO_OK)
                st = maco_port_channel_flush(ch);
            if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20))
                break;
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::string msg = maco_comm_get_last_error(comm);
        if (st != MACO_ERR_REMOTE) {
            fprintf(stderr, "the transfer to a dead peer returned %s after %.1f s: %s\n",
                    maco_status_string(st), s, msg.c_str());
            return 13;
        }
        if (msg.find("rank 1") == std::string::npos) {
            fprintf(stderr, "the peer is not named: %s\n", msg.c_str());
            return 14;
        }
        maco_status_t async = MACO_OK;
        if (maco_comm_get_async_error(comm, &async) != MACO_OK || async == MACO_OK) {
            fprintf(stderr, "no async error after the connection failed\n");
            return 15;
        }
        /* Every later push fails too (none succeeds into a dead connection), and says so
         * without a log line each: the failure was logged once. */
        usleep(100000);
        int lines_before = error_lines.load();
        for (int i = 0; i < 1000; i++) {
            maco_status_t a = maco_port_channel_put(ch, 0, 0, 4096);
            maco_status_t b = maco_port_channel_put_with_signal(ch, 0, 0, 64);
            maco_status_t c = maco_port_channel_signal(ch);
            if (a != MACO_ERR_REMOTE || b != MACO_ERR_REMOTE || c != MACO_ERR_REMOTE) {
                fprintf(stderr, "push %d after the failure: %s, %s, %s\n", i, maco_status_string(a),
                        maco_status_string(b), maco_status_string(c));
                return 17;
            }
        }
        msg = maco_log_last_error(); /* this thread's; the communicator keeps its first */
        if (msg.find("rank 1") == std::string::npos ||
            msg.find("failed earlier") == std::string::npos) {
            fprintf(stderr, "a push after the failure does not say why: %s\n", msg.c_str());
            return 18;
        }
        if (error_lines.load() - lines_before > 2) {
            fprintf(stderr, "3000 pushes after the failure logged %d error lines\n",
                    error_lines.load() - lines_before);
            return 19;
        }
        return 0;
    });
    EXPECT_EQ(codes[0], 0) << "the surviving rank";
    EXPECT_EQ(codes[1], 0) << "the rank that dies";
}

/*
 * A network link cut in the middle of a transfer (tests/netns/run.sh takes the veth between
 * the ranks' namespaces down while this runs): rank 0's puts and flushes fail within the
 * bound with an error naming rank 1, never a hang. Runs only where that script asks for it
 * (TEST_MACO_NETNS_CUT=1); the script checks rank 0's exit status and time.
 */
TEST_F(PortChannelHost, LinkCutMidTransferFailsNamingThePeer)
{
    const char *cut = getenv("TEST_MACO_NETNS_CUT");
    if (cut == nullptr || std::string(cut) != "1")
        GTEST_SKIP() << "run by tests/netns/run.sh, which cuts the link";
    HostMesh m;
    ASSERT_NO_FATAL_FAILURE(m.Setup(4 << 20));
    if (Rank() != 0) {
        /* The peer goes quiet once its link is gone; it leaves when the script says so. */
        std::this_thread::sleep_for(std::chrono::seconds(25));
        _exit(0);
    }
    maco_test::AllowLog("rank 1");
    auto t0 = std::chrono::steady_clock::now();
    maco_status_t st = MACO_OK;
    while (st == MACO_OK && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
        st = maco_port_channel_put(m.port.chans[1], 0, 0, 4 << 20);
        if (st == MACO_OK)
            st = maco_port_channel_flush(m.port.chans[1]);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string msg = maco_comm_get_last_error(m.comm);
    EXPECT_TRUE(st == MACO_ERR_REMOTE || st == MACO_ERR_TIMEOUT) << maco_status_string(st);
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    printf("link cut: the transfer failed after %.1f s: %s\n", s, msg.c_str());
    fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0); /* the bootstrap to rank 1 is gone too */
}

/*
 * An unusable GID index (MACO_IB_GID_INDEX past the port's GID table) is a clear error at
 * channel creation: MACO_ERR_INVALID_ARGUMENT naming the variable on the rank that set it, and
 * MACO_ERR_REMOTE naming that rank on its peer, both within seconds (the peer is told over the
 * bootstrap instead of waiting for its timeout). IB only; its own 2-rank job.
 */
TEST_F(PortChannelHost, IbUnusableGidIndexIsAClearError)
{
    const char *forced = getenv("MACO_TRANSPORT");
    if (TestTransport() != MACO_TRANSPORT_IB && !(TestTransport() == MACO_TRANSPORT_AUTO &&
                                                  forced != nullptr && std::string(forced) == "ib"))
        GTEST_SKIP() << "for the IB transport (TEST_MACO_PORT_TRANSPORT=ib)";
    if (Rank() != 0)
        GTEST_SKIP() << "rank 0 runs this test's own job";
    std::vector<int> codes = maco_test::ForkRanks({ { 0, 2 }, { 1, 2 } }, [](int rank) {
        setenv("MACO_TRANSPORT", "ib", 1);
        setenv("MACO_LOG_LEVEL", "error", 1);
        if (rank == 0)
            setenv("MACO_IB_GID_INDEX", "99", 1);
        maco_bootstrap_t bs;
        maco_comm_t comm;
        if (maco_bootstrap_create_from_env(&bs) != MACO_OK ||
            maco_comm_create(bs, -1, &comm) != MACO_OK)
            return 10;
        void *buf = nullptr;
        maco_mem_t mine = nullptr, peer = nullptr;
        uint8_t h[2][MACO_MEM_HANDLE_BYTES];
        if (maco_mem_alloc_host(comm, 4096, &buf) != MACO_OK ||
            maco_mem_register(comm, buf, 4096, &mine) != MACO_OK ||
            maco_mem_serialize(mine, h[rank]) != MACO_OK ||
            maco_bootstrap_allgather(bs, h, MACO_MEM_HANDLE_BYTES) != MACO_OK ||
            maco_mem_import(comm, h[1 - rank], &peer) != MACO_OK)
            return 11;
        maco_proxy_t proxy;
        maco_port_channel_t ch = nullptr;
        if (maco_proxy_create(comm, &proxy) != MACO_OK || maco_proxy_start(proxy) != MACO_OK)
            return 12;
        auto t0 = std::chrono::steady_clock::now();
        maco_status_t st =
            maco_port_channel_create(proxy, 1 - rank, MACO_TRANSPORT_AUTO, mine, peer, &ch);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::string msg = maco_comm_get_last_error(comm);
        maco_status_t want = rank == 0 ? MACO_ERR_INVALID_ARGUMENT : MACO_ERR_REMOTE;
        const char *names = rank == 0 ? "MACO_IB_GID_INDEX=99" : "rank 0";
        if (st != want || ch != nullptr) {
            fprintf(stderr, "rank %d: channel creation returned %s (want %s): %s\n", rank,
                    maco_status_string(st), maco_status_string(want), msg.c_str());
            return 13;
        }
        if (msg.find(names) == std::string::npos) {
            fprintf(stderr, "rank %d: the error does not name %s: %s\n", rank, names, msg.c_str());
            return 14;
        }
        if (s > 5.0) {
            fprintf(stderr, "rank %d: the failure took %.1f s\n", rank, s);
            return 15;
        }
        maco_proxy_destroy(proxy);
        maco_mem_deregister(peer);
        maco_mem_deregister(mine);
        maco_bootstrap_barrier(bs);
        maco_mem_free(comm, buf);
        maco_comm_destroy(comm);
        maco_bootstrap_destroy(bs);
        return 0;
    });
    EXPECT_EQ(codes[0], 0) << "the rank with MACO_IB_GID_INDEX=99";
    EXPECT_EQ(codes[1], 0) << "its peer";
}

/*
 * A host-side wait whose peer dies fails with MACO_ERR_REMOTE naming it, even with no bound
 * (MACO_DEVICE_TIMEOUT=0: only noticing the death can end it; ForkRanks' alarm fails a wait that
 * never ends), and the waiting thread sleeps instead of spinning a core. Runs its own
 * 2-process job (forked, separate bootstrap). (Regression: the wait spun until
 * MACO_DEVICE_TIMEOUT, or forever with 0.)
 *
 * "Does not spin" is measured as CPU time per sleep, which load cannot inflate: the waiter's
 * own CPU time (getrusage, RUSAGE_THREAD) against the times it gave up the CPU of its own
 * accord (ru_nvcsw, each sleep of the wait's backoff). A sleeping wait spends a few
 * microseconds per sleep, however busy the machine; a spinning one spends its whole share of
 * the CPU with hardly a sleep. (Before, the test compared CPU and wall time and bounded the
 * wall time, which a loaded machine broke: "the wait took ... s of CPU". How soon a death is
 * noticed depends on the load, so it is not asserted: docs/reliability.md records it.)
 */
TEST_F(PortChannelHost, WaitForADeadPeerFailsFastWithoutSpinning)
{
    if (Rank() != 0)
        GTEST_SKIP() << "rank 0 runs this test's own job";
    std::vector<int> codes = maco_test::ForkRanks({ { 0, 2 }, { 1, 2 } }, [](int rank) {
        setenv("MACO_DEVICE_TIMEOUT", "0", 1);
        setenv("MACO_LOG_LEVEL", "error", 1);
        ForkedChannel f;
        int rc = f.Setup(rank, 4096, MACO_TRANSPORT_HOST_MEMORY);
        if (rc != 0)
            return rc;
        maco_comm_t comm = f.comm;
        maco_port_channel_t ch = f.ch;
        if (rank == 1) {
            usleep(300000); /* rank 0 is waiting by now */
            _exit(0);       /* dies without signalling or saying goodbye */
        }
        struct rusage r0, r1;
        getrusage(RUSAGE_THREAD, &r0);
        auto t0 = std::chrono::steady_clock::now();
        maco_status_t st = maco_port_channel_wait(ch, -1);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        getrusage(RUSAGE_THREAD, &r1);
        double cpu = static_cast<double>(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec +
                                         r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
                     static_cast<double>(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec +
                                         r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) *
                         1e-6;
        long sleeps = r1.ru_nvcsw - r0.ru_nvcsw;
        std::string msg = maco_comm_get_last_error(comm);
        if (st != MACO_ERR_REMOTE) {
            fprintf(stderr, "wait returned %s: %s\n", maco_status_string(st), msg.c_str());
            return 13;
        }
        if (msg.find("rank 1") == std::string::npos) {
            fprintf(stderr, "the peer is not named: %s\n", msg.c_str());
            return 14;
        }
        /* At most 100 us of CPU per sleep, plus 5 ms for the first spins and yields and the
         * death's handling: a sleeping wait uses a few us per sleep; a spinning one far more. */
        if (cpu > 0.005 + 100e-6 * static_cast<double>(sleeps)) {
            fprintf(stderr,
                    "the wait spun: %.4f s of CPU for %ld sleeps (%.0f us per sleep) over %.2f "
                    "s\n",
                    cpu, sleeps, sleeps > 0 ? cpu / static_cast<double>(sleeps) * 1e6 : 0.0, s);
            return 15;
        }
        return 0;
    });
    EXPECT_EQ(codes[0], 0) << "the surviving rank";
    EXPECT_EQ(codes[1], 0) << "the rank that dies";
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, false, false);
}
