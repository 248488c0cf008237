/*
 * test_collectives_gpu.cc - every collective x type x op x placement on real GPUs.
 *
 * Inputs come from perf_kernels.h's exact generator (fresh seed per call); outputs and a
 * guard after them are poisoned first; every output element is compared bitwise with the
 * result recomputed in float64 / 64-bit integers from the generator, on the GPU, and a
 * sample of elements is checked again on the host. Sizes sit on both sides of the LL/mesh
 * threshold and include odd counts; pointers are misaligned; buffers come from cudaMalloc
 * and from maco_mem_alloc (registered); graphs are captured once and replayed with changing
 * inputs.
 */
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "gpu_case.h"
#include "maco_test.h"
#include "tools/perf_kernels.h"

namespace
{

using namespace maco_test;

constexpr size_t kGuard = 256;
/* The ranks span several nodes (simulated with MACO_HOST_ID): every collective runs hier. */
bool g_across = false;

const char *LLName(maco_collective_t coll)
{
    return g_across ? "hier" : coll == MACO_COLL_ALLREDUCE ? "oneshot_ll" : "ll";
}

const char *MeshName(maco_collective_t coll)
{
    return g_across ? "hier" : coll == MACO_COLL_ALLREDUCE ? "rsag" : "mesh";
}

bool HasOp(maco_collective_t coll)
{
    return coll != MACO_COLL_ALLGATHER && coll != MACO_COLL_BROADCAST;
}

/* One call's shape: unit = the collective's count argument. */
struct Shape {
    maco_collective_t coll;
    maco_datatype_t dt;
    maco_redop_t op;
    size_t unit;
    bool inplace;
    size_t skew; /* bytes added to the receive pointer (and the send pointer) */
    int root;
};

class Collectives : public maco_test::GpuCase
{
  protected:
    void SetUp() override
    {
        maco_test::GpuCase::SetUp();
        int nodes = 1;
        ASSERT_EQ(maco_comm_get_nnodes(Comm(), &nodes), MACO_OK);
        g_across = nodes > 1;
    }
    void TearDown() override
    {
        for (int c = 0; c < MACO_COLLECTIVE_COUNT; c++)
            maco_collective_set_algorithm(Comm(), static_cast<maco_collective_t>(c), nullptr);
        Release();
        maco_test::GpuCase::TearDown();
    }
    void Release()
    {
        if (registered_) {
            maco_mem_free(Comm(), in_);
            maco_mem_free(Comm(), out_);
        } else {
            cudaFree(in_);
            cudaFree(out_);
        }
        in_ = out_ = nullptr;
        cap_ = 0;
    }
    /* Buffers of at least `bytes` + guards, from maco_mem_alloc when `registered`. */
    void Reserve(size_t bytes, bool registered = false)
    {
        if (bytes <= cap_ && registered == registered_)
            return;
        Release();
        registered_ = registered;
        cap_ = bytes;
        size_t want = cap_ + 2 * kGuard;
        if (registered) {
            ASSERT_EQ(maco_mem_alloc(Comm(), want, reinterpret_cast<void **>(&in_)), MACO_OK)
                << maco_comm_get_last_error(Comm());
            ASSERT_EQ(maco_mem_alloc(Comm(), want, reinterpret_cast<void **>(&out_)), MACO_OK)
                << maco_comm_get_last_error(Comm());
        } else {
            CUDA_OK(cudaMalloc(&in_, want));
            CUDA_OK(cudaMalloc(&out_, want));
        }
    }

    /* Reserve, wait until every rank has, then map every peer's registrations, so every
     * rank's next call can use them in place. */
    void ReserveRegistered(size_t bytes, bool registered)
    {
        ASSERT_NO_FATAL_FAILURE(Reserve(bytes, registered));
        ASSERT_NO_FATAL_FAILURE(MapPeers());
    }

    /* The documented sequence: a barrier after every rank registered, then the map. */
    void MapPeers()
    {
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        ASSERT_EQ(maco_collective_map_registrations(Comm()), MACO_OK) << maco_log_last_error();
    }

    maco_collective_stats_t Stats()
    {
        maco_collective_stats_t st = {};
        EXPECT_EQ(maco_collective_get_stats(Comm(), &st), MACO_OK)
            << maco_comm_get_last_error(Comm());
        return st;
    }

    maco_status_t Call(const Shape &s, const void *send, void *recv)
    {
        maco_stream_t st = reinterpret_cast<maco_stream_t>(stream_);
        switch (s.coll) {
        case MACO_COLL_ALLREDUCE:
            return maco_allreduce(send, recv, s.unit, s.dt, s.op, Comm(), st);
        case MACO_COLL_ALLGATHER:
            return maco_allgather(send, recv, s.unit, s.dt, Comm(), st);
        case MACO_COLL_REDUCE_SCATTER:
            return maco_reduce_scatter(send, recv, s.unit, s.dt, s.op, Comm(), st);
        case MACO_COLL_BROADCAST:
            return maco_broadcast(send, recv, s.unit, s.dt, s.root, Comm(), st);
        default:
            return maco_reduce(send, recv, s.unit, s.dt, s.op, s.root, Comm(), st);
        }
    }

    /* Where the call reads and writes, and how much of out_ it may touch. */
    void Place(const Shape &s, char **send, char **recv, size_t *send_elems, size_t *recv_elems,
               size_t *touched)
    {
        size_t esz = maco_datatype_size(s.dt), n = static_cast<size_t>(NRanks());
        size_t ub = s.unit * esz;
        *send_elems = s.coll == MACO_COLL_REDUCE_SCATTER ? s.unit * n : s.unit;
        *recv_elems = s.coll == MACO_COLL_ALLGATHER ? s.unit * n : s.unit;
        char *base = out_ + kGuard + s.skew;
        *recv = base;
        *send = in_ + kGuard + s.skew;
        *touched = *recv_elems * esz;
        if (s.inplace) {
            if (s.coll == MACO_COLL_ALLGATHER) {
                *send = base + static_cast<size_t>(Rank()) * ub;
            } else if (s.coll == MACO_COLL_REDUCE_SCATTER) {
                *send = base;
                *recv = base + static_cast<size_t>(Rank()) * ub;
                *touched = *send_elems * esz;
            } else {
                *send = base;
            }
        }
    }

    /* One checked call; *wrong = wrong elements + damaged guard bytes on this rank. */
    void RunOne(const Shape &s, unsigned long long *wrong)
    {
        size_t esz = maco_datatype_size(s.dt), n = static_cast<size_t>(NRanks());
        ASSERT_NO_FATAL_FAILURE(Reserve(s.unit * esz * n + 64, registered_));
        uint64_t seed =
            seed_ ^ (s.unit * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(round_++) << 40);
        char *send, *recv;
        size_t send_elems, recv_elems, touched;
        Place(s, &send, &recv, &send_elems, &recv_elems, &touched);
        CUDA_OK(cudaMemsetAsync(out_, 0xFF, cap_ + 2 * kGuard, stream_));
        CUDA_OK(maco_perf_fill_coll(send, send_elems, s.dt, s.op, seed, Rank(), stream_));
        unsigned long long init[2] = { 0, ~0ull };
        CUDA_OK(cudaMemcpyAsync(counters_, init, sizeof(init), cudaMemcpyHostToDevice, stream_));
        maco_status_t st = Call(s, send, recv);
        ASSERT_EQ(st, MACO_OK) << maco_comm_get_last_error(Comm());
        bool written = s.coll != MACO_COLL_REDUCE || Rank() == s.root;
        if (written) {
            CUDA_OK(maco_perf_check_coll(recv, recv_elems, s.coll, s.dt, s.op, s.root, s.unit, seed,
                                         Rank(), NRanks(), &counters_[0], &counters_[1], stream_));
        } else if (!s.inplace) {
            CUDA_OK(maco_perf_check_bytes(recv, recv_elems * esz, 0xFF, &counters_[0], stream_));
        }
        char *region = out_ + kGuard + s.skew;
        CUDA_OK(maco_perf_check_bytes(out_, kGuard + s.skew, 0xFF, &counters_[0], stream_));
        CUDA_OK(maco_perf_check_bytes(region + touched, kGuard, 0xFF, &counters_[0], stream_));
        unsigned long long res[2];
        ASSERT_NO_FATAL_FAILURE(ReadCounters(res));
        *wrong = res[0];
        if (res[0] != 0 && res[1] != ~0ull) {
            uint64_t want = maco_perf_expected_coll_host(res[1], s.coll, s.dt, s.op, s.root, s.unit,
                                                         seed, Rank(), NRanks());
            uint64_t got = 0;
            cudaMemcpy(&got, recv + res[1] * esz, esz, cudaMemcpyDeviceToHost);
            ADD_FAILURE() << "first wrong element " << res[1] << ": got 0x" << std::hex << got
                          << ", want 0x" << want;
            return;
        }
        /* The host recomputes a sample of elements independently of the GPU checker. */
        if (written && recv_elems > 0) {
            for (size_t j : { static_cast<size_t>(0), recv_elems / 2, recv_elems - 1 }) {
                uint64_t got = 0;
                CUDA_OK(cudaMemcpy(&got, recv + j * esz, esz, cudaMemcpyDeviceToHost));
                uint64_t want = maco_perf_expected_coll_host(j, s.coll, s.dt, s.op, s.root, s.unit,
                                                             seed, Rank(), NRanks());
                if (got != want) {
                    ADD_FAILURE() << "host check of element " << j << ": got 0x" << std::hex << got
                                  << ", want 0x" << want;
                    *wrong += 1;
                }
            }
        }
    }

    std::string Describe(const Shape &s, const char *algo)
    {
        return std::string(maco_collective_name(s.coll)) + " " + maco_datatype_name(s.dt) + " " +
               maco_redop_name(s.op) + " unit " + std::to_string(s.unit) +
               (s.inplace ? " in place" : " out of place") + " skew " + std::to_string(s.skew) +
               " root " + std::to_string(s.root) + " algorithm '" + algo + "'";
    }

    void Expect(const Shape &s, const char *algo)
    {
        if (g_across && algo[0] != '\0' && strcmp(algo, "hier") != 0)
            return; /* single-node algorithms (twoshot_ll) */
        if (algo[0] != '\0')
            ASSERT_EQ(maco_collective_set_algorithm(Comm(), s.coll, algo), MACO_OK);
        else
            ASSERT_EQ(maco_collective_set_algorithm(Comm(), s.coll, nullptr), MACO_OK);
        unsigned long long wrong = 1;
        ASSERT_NO_FATAL_FAILURE(RunOne(s, &wrong));
        ASSERT_EQ(wrong, 0u) << Describe(s, algo);
    }

    int round_ = 0;
    char *in_ = nullptr, *out_ = nullptr;
    size_t cap_ = 0;
    bool registered_ = false;
};

const maco_collective_t kColls[] = { MACO_COLL_ALLREDUCE, MACO_COLL_ALLGATHER,
                                     MACO_COLL_REDUCE_SCATTER, MACO_COLL_BROADCAST,
                                     MACO_COLL_REDUCE };

/* Every type x op x placement, both kernels, odd counts and a large one. */
TEST_F(Collectives, EveryTypeOpPlacementAndKernel)
{
    for (maco_collective_t coll : kColls) {
        for (int t = 0; t < MACO_DATATYPE_COUNT; t++) {
            maco_datatype_t dt = static_cast<maco_datatype_t>(t);
            size_t esz = maco_datatype_size(dt);
            int nops = HasOp(coll) ? MACO_REDOP_COUNT : 1;
            for (int op = 0; op < nops; op++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    Shape s = { coll, dt,          static_cast<maco_redop_t>(op), 1, inplace != 0,
                                0,    NRanks() - 1 };
                    for (size_t unit : { static_cast<size_t>(1), static_cast<size_t>(3),
                                         static_cast<size_t>(1023) }) {
                        s.unit = unit;
                        ASSERT_NO_FATAL_FAILURE(Expect(s, LLName(coll)));
                        ASSERT_NO_FATAL_FAILURE(Expect(s, MeshName(coll)));
                        if (coll == MACO_COLL_ALLREDUCE &&
                            maco_test::TwoShotFits(unit, esz, NRanks())) {
                            ASSERT_NO_FATAL_FAILURE(Expect(s, "twoshot_ll"));
                        }
                    }
                    /* Two-shot LL with odd blocks. */
                    s.unit = 100003;
                    if (coll == MACO_COLL_ALLREDUCE &&
                        maco_test::TwoShotFits(s.unit, esz, NRanks())) {
                        ASSERT_NO_FATAL_FAILURE(Expect(s, "twoshot_ll"));
                    }
                    s.unit = (static_cast<size_t>(1) << 20) + 7;
                    if (esz <= 2 || op == MACO_SUM) {
                        ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
                    }
                }
            }
        }
    }
}

/* The automatic choice on both sides of the threshold, every pointer alignment. */
TEST_F(Collectives, ThresholdsAndMisalignedPointers)
{
    for (maco_collective_t coll : kColls) {
        for (maco_datatype_t dt : { MACO_BFLOAT16, MACO_FLOAT32, MACO_INT8, MACO_FLOAT64 }) {
            size_t esz = maco_datatype_size(dt);
            const size_t ll_max = maco_test::LLMax(NRanks());
            std::vector<size_t> units = { ll_max / esz - 1, ll_max / esz, ll_max / esz + 1 };
            if (coll == MACO_COLL_ALLREDUCE) {
                /* one-shot / two-shot at 128 KiB (MACO__TUNING_ALLREDUCE_ONESHOT_CUTOFF), two-shot
                 * / rsag at nranks * LLMax. */
                size_t twoshot_max = ll_max * static_cast<size_t>(NRanks()) / esz;
                for (size_t u : { 131072 / esz - 1, 131072 / esz, 131072 / esz + 1, twoshot_max - 1,
                                  twoshot_max, twoshot_max + 1 })
                    units.push_back(u);
            }
            for (size_t unit : units) {
                for (size_t skew : { static_cast<size_t>(0), static_cast<size_t>(1),
                                     static_cast<size_t>(6), static_cast<size_t>(16) }) {
                    Shape s = { coll, dt, MACO_SUM, unit, skew == 6, skew, 0 };
                    ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
                }
            }
        }
    }
}

/* Registered buffers (maco_mem_alloc) as user buffers, and broadcast / reduce from every
 * root. */
TEST_F(Collectives, RegisteredBuffersAndEveryRoot)
{
    ASSERT_NO_FATAL_FAILURE(Reserve((static_cast<size_t>(4) << 20) * NRanks(), true));
    for (maco_collective_t coll : kColls) {
        for (size_t unit : { static_cast<size_t>(5000), static_cast<size_t>(3) << 20 }) {
            Shape s = { coll, MACO_FLOAT32, MACO_MAX, unit, false, 0, 0 };
            ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
        }
    }
    for (int root = 0; root < NRanks(); root++) {
        for (maco_collective_t coll : { MACO_COLL_BROADCAST, MACO_COLL_REDUCE }) {
            for (size_t unit : { static_cast<size_t>(777), static_cast<size_t>(1) << 20 }) {
                Shape s = { coll, MACO_BFLOAT16, MACO_SUM, unit, root % 2 == 1, 0, root };
                ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
            }
        }
    }
}

/* Registered buffers on every rank (maco_mem_alloc) are used in place by the mesh-family
 * kernels: every collective, type and op, both placements, odd counts just above the LL
 * sizes and large ones, every root; maco_collective_get_stats proves the path taken. */
TEST_F(Collectives, RegisteredBuffersUsedInPlace)
{
    if (g_across)
        GTEST_SKIP() << "across nodes the collectives go through scratch (hier)";
    const size_t max_unit_bytes = (static_cast<size_t>(3) << 20) + 64;
    ASSERT_NO_FATAL_FAILURE(ReserveRegistered(max_unit_bytes * NRanks() + 64, true));
    maco_collective_stats_t before = Stats();
    uint64_t calls = 0, misaligned = 0;
    for (maco_collective_t coll : kColls) {
        for (int t = 0; t < MACO_DATATYPE_COUNT; t++) {
            maco_datatype_t dt = static_cast<maco_datatype_t>(t);
            size_t esz = maco_datatype_size(dt);
            int nops = HasOp(coll) ? MACO_REDOP_COUNT : 1;
            for (int op = 0; op < nops; op++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    int root = (t + op) % NRanks();
                    /* Above the LL kernels: allreduce's two-shot LL takes up to nranks
                     * times LLMax. */
                    const size_t ll_max = maco_test::LLMax(NRanks());
                    size_t base = (coll == MACO_COLL_ALLREDUCE ? ll_max * NRanks() : ll_max) / esz;
                    Shape s = { coll, dt,  static_cast<maco_redop_t>(op), base + 1, inplace != 0,
                                0,    root };
                    /* Rank r's block of an allgather or reduce-scatter starts r * unit
                     * bytes in: not 16-byte aligned for these odd units, so those calls go
                     * through scratch. */
                    bool blocks = coll == MACO_COLL_ALLGATHER || coll == MACO_COLL_REDUCE_SCATTER;
                    for (size_t unit : { base + 1, base + 16 / esz, max_unit_bytes / esz - 3 }) {
                        if (unit > base + 16 / esz && t != MACO_BFLOAT16 && t != MACO_FLOAT64 &&
                            t != MACO_INT8)
                            continue;
                        s.unit = unit;
                        ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
                        bool off = blocks && unit * esz % 16 != 0;
                        (off ? misaligned : calls)++;
                    }
                }
            }
        }
    }
    maco_collective_stats_t after = Stats();
    EXPECT_EQ(after.inplace_launches - before.inplace_launches, calls);
    EXPECT_EQ(after.scratch_launches - before.scratch_launches, misaligned);
}

/* In place needs every rank: buffers registered on rank 0 only, or misaligned, go through
 * scratch on every rank, with the same results. */
TEST_F(Collectives, PartlyRegisteredOrMisalignedGoesThroughScratch)
{
    if (g_across)
        GTEST_SKIP() << "across nodes the collectives go through scratch (hier)";
    /* float32, odd, above every LL kernel (allreduce's two-shot: nranks x LLMax bytes). */
    const size_t unit = std::max<size_t>(300001, maco_test::LLMax(NRanks()) * NRanks() / 4 + 1);
    ASSERT_NO_FATAL_FAILURE(ReserveRegistered(unit * 4 * NRanks() + 64, Rank() == 0));
    maco_collective_stats_t before = Stats();
    uint64_t calls = 0;
    for (maco_collective_t coll : kColls) {
        for (int inplace = 0; inplace < 2; inplace++) {
            Shape s = { coll, MACO_FLOAT32, MACO_SUM, unit, inplace != 0, 0, 1 % NRanks() };
            ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
            calls++;
        }
    }
    maco_collective_stats_t mid = Stats();
    EXPECT_EQ(mid.inplace_launches - before.inplace_launches, 0u);
    EXPECT_EQ(mid.scratch_launches - before.scratch_launches, calls);
    ASSERT_NO_FATAL_FAILURE(ReserveRegistered(unit * 4 * NRanks() + 64, true));
    calls = 0;
    for (maco_collective_t coll : kColls) {
        /* Rank 1's pointers 4 bytes off 16-byte alignment. */
        Shape s = { coll, MACO_FLOAT32, MACO_MAX, unit, false, Rank() == 1 ? 4u : 0u, 0 };
        ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
        calls++;
    }
    maco_collective_stats_t after = Stats();
    EXPECT_EQ(after.inplace_launches - mid.inplace_launches, 0u);
    EXPECT_EQ(after.scratch_launches - mid.scratch_launches, calls);
}

/* A collective call never imports a peer's memory: buffers registered on every rank go
 * through scratch until maco_collective_map_registrations has run on every rank, then in
 * place, and the results are the same either way. Fresh buffers each time, so the peers'
 * entries are new to the registry. */
TEST_F(Collectives, RegistrationsMapOnlyWhenAsked)
{
    if (g_across)
        GTEST_SKIP() << "across nodes the collectives go through scratch (hier)";
    maco_test::AllowLog("comm is NULL");
    EXPECT_EQ(maco_collective_map_registrations(nullptr), MACO_ERR_INVALID_ARGUMENT);
    /* bfloat16 elements: 3 MiB + 48 bytes, above the LL sizes at up to 8 ranks, under
     * MACO_ALLREDUCE_INPLACE_MAX, 16-byte multiples (every rank's block aligned). */
    const size_t unit = (static_cast<size_t>(3) << 19) + 24;
    ASSERT_NO_FATAL_FAILURE(Reserve(unit * 2 * NRanks() + 64, true));
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK); /* every rank registered */
    /* Every collective once (roots in turn); returns the stats after the calls. */
    uint64_t calls = 0;
    auto each = [&]() {
        for (maco_collective_t coll : kColls) {
            int root = static_cast<int>(calls++ % static_cast<uint64_t>(NRanks()));
            Shape s = { coll, MACO_BFLOAT16, MACO_SUM, unit, false, 0, root };
            EXPECT_NO_FATAL_FAILURE(Expect(s, ""));
        }
        return Stats();
    };
    maco_collective_stats_t before = Stats();
    maco_collective_stats_t mid = each();
    EXPECT_EQ(mid.inplace_launches - before.inplace_launches, 0u);
    EXPECT_EQ(mid.scratch_launches - before.scratch_launches, calls);
    ASSERT_NO_FATAL_FAILURE(MapPeers());
    ASSERT_NO_FATAL_FAILURE(MapPeers()); /* nothing new: a no-op */
    maco_collective_stats_t after = each();
    EXPECT_EQ(after.inplace_launches - mid.inplace_launches, calls / 2);
    EXPECT_EQ(after.scratch_launches - mid.scratch_launches, 0u);
}

/* cudaMalloc'ed buffers registered with maco_mem_register (exported over CUDA IPC) are
 * used in place; after maco_mem_deregister they go through scratch again, and a new
 * registration of the same memory is used in place again. */
TEST_F(Collectives, MemRegisterAndDeregister)
{
    if (g_across)
        GTEST_SKIP() << "across nodes the collectives go through scratch (hier)";
    /* float32, above two-shot LL for allreduce (nranks x LLMax bytes). */
    const size_t unit = std::max<size_t>(400000, maco_test::LLMax(NRanks()) * NRanks() / 4 + 1000);
    ASSERT_NO_FATAL_FAILURE(Reserve(unit * 4 * NRanks() + 64));
    Shape s = { MACO_COLL_ALLREDUCE, MACO_FLOAT32, MACO_SUM, unit, false, 0, 0 };
    for (int round = 0; round < 2; round++) {
        maco_mem_t rin = nullptr, rout = nullptr;
        ASSERT_EQ(maco_mem_register(Comm(), in_, cap_ + 2 * kGuard, &rin), MACO_OK)
            << maco_comm_get_last_error(Comm());
        ASSERT_EQ(maco_mem_register(Comm(), out_, cap_ + 2 * kGuard, &rout), MACO_OK)
            << maco_comm_get_last_error(Comm());
        ASSERT_NO_FATAL_FAILURE(MapPeers());
        maco_collective_stats_t before = Stats();
        for (maco_collective_t coll : kColls) {
            s.coll = coll;
            ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
        }
        maco_collective_stats_t mid = Stats();
        EXPECT_EQ(mid.inplace_launches - before.inplace_launches, 5u) << "round " << round;
        /* Every rank has finished with the buffers before any deregisters. */
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        ASSERT_EQ(maco_mem_deregister(rin), MACO_OK);
        ASSERT_EQ(maco_mem_deregister(rout), MACO_OK);
        ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
        for (maco_collective_t coll : kColls) {
            s.coll = coll;
            ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
        }
        maco_collective_stats_t after = Stats();
        EXPECT_EQ(after.inplace_launches - mid.inplace_launches, 0u) << "round " << round;
        EXPECT_EQ(after.scratch_launches - mid.scratch_launches, 5u) << "round " << round;
    }
}

/* Captured once, replayed 100 times with inputs that change between replays; unregistered
 * and registered buffers. */
TEST_F(Collectives, GraphReplayedWithChangingInputs)
{
    for (int reg = 0; reg < 2; reg++)
        for (maco_collective_t coll : kColls) {
            for (size_t unit : { static_cast<size_t>(3000), static_cast<size_t>(600000) }) {
                Shape s = { coll, MACO_BFLOAT16, MACO_SUM, unit, false, 0, NRanks() - 1 };
                size_t esz = maco_datatype_size(s.dt);
                ASSERT_NO_FATAL_FAILURE(ReserveRegistered(600000 * esz * NRanks() + 64, reg != 0));
                ASSERT_EQ(maco_collective_set_algorithm(Comm(), coll, nullptr), MACO_OK);
                char *send, *recv;
                size_t send_elems, recv_elems, touched;
                Place(s, &send, &recv, &send_elems, &recv_elems, &touched);
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
                maco_status_t st = Call(s, send, recv);
                CUDA_OK(cudaStreamEndCapture(stream_, &graph));
                ASSERT_EQ(st, MACO_OK) << maco_comm_get_last_error(Comm());
                CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
                for (int replay = 0; replay < 100; replay++) {
                    uint64_t seed = seed_ ^ (static_cast<uint64_t>(replay) << 32) ^ unit;
                    CUDA_OK(cudaMemsetAsync(recv, 0xFF, recv_elems * esz, stream_));
                    CUDA_OK(
                        maco_perf_fill_coll(send, send_elems, s.dt, s.op, seed, Rank(), stream_));
                    /* Every rank's input must be in place before any rank's replay reads it. */
                    CUDA_OK(cudaStreamSynchronize(stream_));
                    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
                    CUDA_OK(cudaGraphLaunch(exec, stream_));
                    unsigned long long init[2] = { 0, ~0ull }, res[2];
                    CUDA_OK(cudaMemcpyAsync(counters_, init, sizeof(init), cudaMemcpyHostToDevice,
                                            stream_));
                    if (coll != MACO_COLL_REDUCE || Rank() == s.root) {
                        CUDA_OK(maco_perf_check_coll(recv, recv_elems, s.coll, s.dt, s.op, s.root,
                                                     s.unit, seed, Rank(), NRanks(), &counters_[0],
                                                     &counters_[1], stream_));
                    }
                    ASSERT_NO_FATAL_FAILURE(ReadCounters(res));
                    ASSERT_EQ(res[0], 0u)
                        << Describe(s, "") << " replay " << replay << ", first wrong " << res[1];
                    /* The next fill overwrites inputs peers may still read: wait for all. */
                    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
                }
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
            }
        }
}

/* Calls of every collective and kernel back to back, no host synchronisation between:
 * packet flags and semaphore counts stay in step. */
TEST_F(Collectives, MixedCallsBackToBack)
{
    const size_t unit = 20000;
    ASSERT_NO_FATAL_FAILURE(Reserve(unit * 4 * NRanks() + 64));
    for (int i = 0; i < 60; i++) {
        maco_collective_t coll = kColls[i % 5];
        ASSERT_EQ(maco_collective_set_algorithm(Comm(), coll,
                                                (i / 5) % 2 ? MeshName(coll) : LLName(coll)),
                  MACO_OK);
        Shape s = { coll, MACO_FLOAT32, MACO_MIN, unit, false, 0, i % NRanks() };
        ASSERT_EQ(Call(s, in_, out_), MACO_OK) << maco_comm_get_last_error(Comm());
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    for (maco_collective_t coll : kColls) {
        Shape s = { coll, MACO_FLOAT32, MACO_MIN, unit, false, 0, 1 % NRanks() };
        ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
    }
}

/*
 * Every reduction is the rank-order fold of reduce.cuh (widen, combine in rank order 0..n-1,
 * convert once), bitwise, whatever the algorithm and the number of nodes: random values (not
 * the exact generator), checked against test_reference_fold on the host for every element.
 * The same test on one node and on simulated nodes proves that both give the same bits.
 */
TEST_F(Collectives, RankOrderFoldBitwise)
{
    const int n = NRanks();
    const size_t max_unit = (static_cast<size_t>(1) << 20) + 3;
    ASSERT_NO_FATAL_FAILURE(Reserve(max_unit * 8 * static_cast<size_t>(n) + 64));
    for (maco_collective_t coll :
         { MACO_COLL_ALLREDUCE, MACO_COLL_REDUCE, MACO_COLL_REDUCE_SCATTER }) {
        for (maco_datatype_t dt : { MACO_FLOAT32, MACO_BFLOAT16, MACO_FLOAT16, MACO_FP8_E4M3,
                                    MACO_FLOAT64, MACO_INT32 }) {
            for (maco_redop_t op : { MACO_SUM, MACO_AVG, MACO_PROD, MACO_MAX }) {
                for (size_t unit : { static_cast<size_t>(1), static_cast<size_t>(1001),
                                     static_cast<size_t>(70001), max_unit }) {
                    if (unit == max_unit && op != MACO_SUM)
                        continue;
                    size_t esz = maco_datatype_size(dt);
                    size_t in_elems = coll == MACO_COLL_REDUCE_SCATTER ? unit * n : unit;
                    /* Every rank draws every rank's input from the shared seed. */
                    std::vector<std::vector<char>> inputs(static_cast<size_t>(n));
                    std::vector<const void *> ptrs;
                    for (int r = 0; r < n; r++) {
                        std::mt19937_64 gen(seed_ ^ (static_cast<uint64_t>(round_) << 20) ^
                                            static_cast<uint64_t>(r));
                        std::uniform_real_distribution<double> val(-2.0, 2.0);
                        inputs[r].resize(in_elems * esz);
                        for (size_t e = 0; e < in_elems; e++) {
                            double v = val(gen);
                            char *p = inputs[r].data() + e * esz;
                            test_store_value(dt, v, p);
                        }
                        ptrs.push_back(inputs[r].data());
                    }
                    round_++;
                    /* The expected output of this rank. */
                    size_t off = coll == MACO_COLL_REDUCE_SCATTER ? unit * Rank() * esz : 0;
                    std::vector<const void *> mine;
                    for (int r = 0; r < n; r++)
                        mine.push_back(static_cast<const char *>(ptrs[r]) + off);
                    std::vector<char> want(unit * esz), got(unit * esz);
                    ASSERT_EQ(test_reference_fold(dt, op, mine.data(), n, unit, want.data()), 0);
                    /* On the collective's stream: stream_ does not wait for the legacy
                     * default stream, and a pageable cudaMemcpy may return before its DMA
                     * ends. */
                    CUDA_OK(cudaMemcpyAsync(in_, inputs[Rank()].data(), in_elems * esz,
                                            cudaMemcpyHostToDevice, stream_));
                    CUDA_OK(cudaMemsetAsync(out_, 0xFF, unit * esz, stream_));
                    Shape s = { coll, dt, op, unit, false, 0, n - 1 };
                    ASSERT_EQ(Call(s, in_, out_), MACO_OK) << maco_comm_get_last_error(Comm());
                    CUDA_OK(cudaStreamSynchronize(stream_));
                    if (coll == MACO_COLL_REDUCE && Rank() != n - 1)
                        continue;
                    CUDA_OK(cudaMemcpy(got.data(), out_, unit * esz, cudaMemcpyDeviceToHost));
                    size_t bad = 0, first = 0;
                    for (size_t e = 0; e < unit; e++)
                        if (memcmp(&got[e * esz], &want[e * esz], esz) != 0 && bad++ == 0)
                            first = e;
                    ASSERT_EQ(bad, 0u) << Describe(s, "") << ": first differing element " << first;
                }
            }
        }
    }
}

/* maco_collective_set_max_ctas: no kernel launches more CTAs than the cap, the results stay
 * right, the cap limits a call that would take more, and ranks that pass different caps all
 * get an error naming the first one that differs (and keep the old cap). */
TEST_F(Collectives, MaxCtasCapsEveryKernelAndMustAgree)
{
    int coresident = 0, cap = -1;
    ASSERT_EQ(maco_comm_get_coresident_ctas(Comm(), &coresident), MACO_OK);
    maco_test::AllowLog("maco_collective_set_max_ctas");
    EXPECT_EQ(maco_collective_set_max_ctas(Comm(), -1), MACO_ERR_INVALID_ARGUMENT);
    maco_test::AllowLog("maco_collective_get_last_ctas");
    EXPECT_EQ(maco_collective_get_last_ctas(Comm(), nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_collective_get_last_ctas(nullptr, &cap), MACO_ERR_INVALID_ARGUMENT);
    if (NRanks() > 1) {
        const int last = NRanks() - 1;
        EXPECT_EQ(maco_collective_set_max_ctas(Comm(), Rank() == last ? 4 : 3),
                  MACO_ERR_INVALID_ARGUMENT);
        std::string msg = maco_log_last_error();
        EXPECT_NE(
            msg.find("rank " + std::to_string(last) + " passed max_ctas=4 but rank 0 passed 3"),
            std::string::npos)
            << msg;
        ASSERT_EQ(maco_collective_get_max_ctas(Comm(), &cap), MACO_OK);
        EXPECT_EQ(cap, 0);
    }
    const size_t big = (static_cast<size_t>(4) << 20) + 5; /* floats: mesh/rsag or hier */
    for (int want : { 1, 3 }) {
        ASSERT_EQ(maco_collective_set_max_ctas(Comm(), want), MACO_OK)
            << maco_comm_get_last_error(Comm());
        ASSERT_EQ(maco_collective_get_max_ctas(Comm(), &cap), MACO_OK);
        EXPECT_EQ(cap, want);
        for (maco_collective_t coll : kColls) {
            for (size_t unit : { static_cast<size_t>(3), static_cast<size_t>(50000), big }) {
                Shape s = { coll, MACO_FLOAT32, MACO_SUM, unit, false, 0, NRanks() - 1 };
                ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
                const int ctas = Stats().last_launch_ctas;
                int last = -1; /* the same number, read without waiting for the device */
                ASSERT_EQ(maco_collective_get_last_ctas(Comm(), &last), MACO_OK);
                EXPECT_EQ(last, ctas);
                EXPECT_GE(ctas, 1);
                EXPECT_LE(ctas, want) << maco_collective_name(coll) << " unit " << unit;
            }
        }
    }
    /* Without the cap the large allreduce takes more CTAs than 3 (where the GPU has them). */
    ASSERT_EQ(maco_collective_set_max_ctas(Comm(), 0), MACO_OK);
    Shape s = { MACO_COLL_ALLREDUCE, MACO_FLOAT32, MACO_SUM, big, false, 0, 0 };
    ASSERT_NO_FATAL_FAILURE(Expect(s, ""));
    if (coresident > 3) {
        EXPECT_GT(Stats().last_launch_ctas, 3);
    }
}

/* Bad input: MACO_ERR_INVALID_ARGUMENT naming the argument, and nothing written. */
TEST_F(Collectives, BadInputWritesNothing)
{
    const size_t unit = 1000;
    ASSERT_NO_FATAL_FAILURE(Reserve(unit * 8 * NRanks() + 64));
    CUDA_OK(cudaMemset(out_, 0x5A, cap_ + 2 * kGuard));
    CUDA_OK(cudaMemset(in_, 0x5A, cap_ + 2 * kGuard));
    maco_test::AllowLog("maco_");
    struct Bad {
        Shape s;
        const void *send;
        void *recv;
        const char *names;
    };
    char *o = out_ + kGuard;
    char *i = in_ + kGuard;
    const Bad bads[] = {
        { { MACO_COLL_ALLREDUCE, MACO_FLOAT32, MACO_SUM, unit, false, 0, 0 },
          nullptr,
          o,
          "sendbuf" },
        { { MACO_COLL_ALLGATHER, MACO_FLOAT32, MACO_SUM, unit, false, 0, 0 },
          i,
          nullptr,
          "recvbuf" },
        { { MACO_COLL_ALLREDUCE, static_cast<maco_datatype_t>(12), MACO_SUM, unit, false, 0, 0 },
          i,
          o,
          "datatype" },
        { { MACO_COLL_REDUCE, MACO_FLOAT32, static_cast<maco_redop_t>(5), unit, false, 0, 0 },
          i,
          o,
          "op" },
        { { MACO_COLL_BROADCAST, MACO_FLOAT32, MACO_SUM, unit, false, 0, NRanks() }, i, o, "root" },
        { { MACO_COLL_ALLREDUCE, MACO_FLOAT32, MACO_SUM, unit, false, 0, 0 }, o + 4, o, "overlap" },
        { { MACO_COLL_ALLGATHER, MACO_FLOAT32, MACO_SUM, unit, false, 0, 0 }, o + 8, o, "overlap" },
        { { MACO_COLL_REDUCE_SCATTER, MACO_FLOAT32, MACO_SUM, unit, false, 0, 0 },
          o,
          o + 8,
          "overlap" },
        { { MACO_COLL_ALLREDUCE, MACO_FLOAT64, MACO_SUM, SIZE_MAX / 4, false, 0, 0 },
          i,
          o,
          "overflows" },
        { { MACO_COLL_ALLGATHER, MACO_INT8, MACO_SUM, SIZE_MAX / 2 + 1, false, 0, 0 },
          i,
          o,
          "overflows" },
    };
    for (const Bad &b : bads) {
        EXPECT_EQ(Call(b.s, b.send, b.recv), MACO_ERR_INVALID_ARGUMENT) << b.names;
        std::vector<std::string> logged = maco_test::LoggedProblems();
        ASSERT_FALSE(logged.empty()) << b.names;
        EXPECT_NE(logged.back().find(b.names), std::string::npos) << logged.back();
    }
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long init = 0, res = 1;
    CUDA_OK(cudaMemcpy(counters_, &init, sizeof(init), cudaMemcpyHostToDevice));
    CUDA_OK(maco_perf_check_bytes(out_, cap_ + 2 * kGuard, 0x5A, &counters_[0], nullptr));
    CUDA_OK(maco_perf_check_bytes(in_, cap_ + 2 * kGuard, 0x5A, &counters_[0], nullptr));
    CUDA_OK(cudaMemcpy(&res, counters_, sizeof(res), cudaMemcpyDeviceToHost));
    EXPECT_EQ(res, 0u) << "bytes changed by rejected calls";
}

} // namespace

/*
 * A rank killed in the middle of a collective (run alone: ctest gpu_hier_killed_rank sets
 * TEST_KILL_RANK; across simulated nodes, hier over TCP). The last rank starts a large
 * allreduce with everyone and dies without a word 20 ms later; the others' calls must end (no
 * hang: the kernel stops at the communicator's error or at MACO_DEVICE_TIMEOUT) and their
 * asynchronous error must name the dead rank. The survivors leave with _exit afterwards, as
 * their communicator is failed for good.
 */
TEST_F(Collectives, RankKilledMidCallIsNamed)
{
    if (std::getenv("TEST_KILL_RANK") == nullptr)
        GTEST_SKIP() << "runs alone (ctest gpu_hier_killed_rank sets TEST_KILL_RANK)";
    const int victim = NRanks() - 1;
    const size_t count = size_t(1) << 24; /* 64 MiB of float32: long enough over TCP */
    maco_test::AllowLog("");              /* survivors log the failure in several ways */
    float *buf = nullptr;
    CUDA_OK(cudaMalloc(&buf, count * sizeof(float)));
    CUDA_OK(cudaMemsetAsync(buf, 0, count * sizeof(float), stream_));
    /* One complete call first: channels, rails and scratch are set up. */
    ASSERT_EQ(maco_allreduce(buf, buf, 1 << 16, MACO_FLOAT32, MACO_SUM, Comm(), stream_), MACO_OK);
    CUDA_OK(cudaStreamSynchronize(stream_));
    ASSERT_EQ(maco_bootstrap_barrier(Bootstrap()), MACO_OK);
    if (Rank() == victim) {
        maco_allreduce(buf, buf, count, MACO_FLOAT32, MACO_SUM, Comm(), stream_);
        usleep(20000);
        _exit(0); /* dies mid-call, without goodbye */
    }
    auto t0 = std::chrono::steady_clock::now();
    maco_status_t st = MACO_OK;
    for (int i = 0; i < 3 && st == MACO_OK; i++) /* later calls fail at once */
        st = maco_allreduce(buf, buf, count, MACO_FLOAT32, MACO_SUM, Comm(), stream_);
    cudaError_t ce = cudaStreamSynchronize(stream_);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    maco_status_t async_st = MACO_OK;
    EXPECT_EQ(maco_comm_get_async_error(Comm(), &async_st), MACO_OK);
    std::string why = maco_comm_get_last_error(Comm());
    std::printf("rank %d: calls returned %s, stream %s, async error %s after %.1f s: %s\n", Rank(),
                maco_status_string(st), cudaGetErrorString(ce), maco_status_string(async_st), secs,
                why.c_str());
    EXPECT_NE(async_st, MACO_OK);
    /* "rank 3 ..." or a list of ranks gone ("[ranks 1, 3 left the job ...]"). */
    const std::regex names_victim("\\branks? ([0-9]+, )*" + std::to_string(victim) + "\\b");
    EXPECT_TRUE(std::regex_search(why, names_victim)) << why;
    EXPECT_LT(secs, 60.0);
    /* The victim's rail peers hold TCP connections to it: their proxies see them end and
     * stop their kernels at once (maco__comm_end_device_waits), long before the device
     * timeout (10 s in the ctest entry). */
    int local_nranks = 1;
    ASSERT_EQ(maco_comm_get_local_nranks(Comm(), &local_nranks), MACO_OK);
    if (local_nranks > 0 && Rank() % local_nranks == victim % local_nranks) {
        EXPECT_LT(secs, 5.0) << "a rail peer of the dead rank waited for the device timeout";
    }
    std::fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
}
