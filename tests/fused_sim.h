/*
 * fused_sim.h - the persistent-kernel runtime simulated on the CPU for the fused operators: 1 to
 * 4 ranks in one process, each with the graph that maco__fused_build makes for it, laid out as
 * the kernel object lays it out and run by host threads in the roles of worker, communication
 * and scheduler CTAs through the runtime's own protocol functions (maco_pk_next_ready,
 * maco_pk_post_signal, maco_pk_complete, maco_pk_schedule), with the tasks' work done on the CPU
 * (GEMM tiles from bf16 with fp32 accumulation, over a slice of K too; sums in rank order, 2D
 * copies). Memory channels are host pointers into the other ranks' buffers, as a memory
 * channel's mapping is on the GPU. Port tasks (PORT_PUT, PORT_FLUSH) go to a hook: the
 * copy-engine test pushes their triggers into real proxies' FIFOs (test_fused_ce_cpu.cc); the
 * SM test has none. Each case runs three launches on fresh random inputs, outputs poisoned
 * before each, and checks every element bit for bit against a reference computed the same way
 * (small integers: exact products). A deadlock shows as the runtime's own timeout. This checks
 * the graphs (data flow, counters, gates, deadlock freedom under random timing), not the GPU
 * kernels. Used by test_fused_cpu.cc and test_fused_ce_cpu.cc.
 */
#ifndef MACO_TESTS_FUSED_SIM_H
#define MACO_TESTS_FUSED_SIM_H

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "maco_test.h"
#include "runtime/host/runtime_internal.h"

namespace fused_sim
{

inline uint16_t ToBf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (no NaN here) */
    return static_cast<uint16_t>(u >> 16);
}

inline float FromBf16(uint16_t h)
{
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

inline float Load(const char *p, uint64_t i, maco_datatype_t t)
{
    if (t == MACO_FLOAT32) {
        float f;
        memcpy(&f, p + i * 4, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + i * 2, 2);
    return FromBf16(h);
}

inline void Store(char *p, uint64_t i, maco_datatype_t t, float f)
{
    if (t == MACO_FLOAT32) {
        memcpy(p + i * 4, &f, 4);
    } else {
        uint16_t h = ToBf16(f);
        memcpy(p + i * 2, &h, 2);
    }
}

/* A buffer with a 256-byte aligned start: the simulation's own, or memory a test hook gave
 * (Adopt: owned by the hook's caller). */
struct Buf {
    std::vector<uint64_t> raw;
    char *p = nullptr;
    size_t bytes = 0;
    void Alloc(size_t n)
    {
        raw.assign(n / 8 + 33, 0); /* 256 for the alignment, 8 to round up */
        uintptr_t a = reinterpret_cast<uintptr_t>(raw.data());
        p = reinterpret_cast<char *>((a + 255) / 256 * 256);
        bytes = n;
    }
    void Adopt(char *q, size_t n)
    {
        memset(q, 0, n);
        p = q;
        bytes = n;
    }
};

struct Rank {
    maco_task_graph_t g = nullptr;
    maco__pk_lowered_t l{};
    std::vector<uint64_t> fixed, state;
    maco_pk_view_t v{};
    maco_device_error_t report{};
    int32_t claim = 0;
    Buf a, b, out, scratch;
    std::vector<int> channels, out_channels;
    std::vector<int> ports, out_ports; /* graph port channels per peer (copy-engine mode) */
    ~Rank()
    {
        maco__pk_lowered_free(&l);
        maco_task_graph_destroy(g);
    }
};

struct Case {
    maco_fused_op_t kind;
    int nranks;
    uint32_t m, n, k;
    maco_datatype_t out_type;
    uint32_t W, C, S;              /* workers, communication workers, schedulers per rank */
    int mode = MACO_FUSED_COMM_SM; /* maco_fused_comm_t */
};

/* The buffers of a rank (Hooks::alloc). */
enum { kBufA = 0, kBufB = 1, kBufOut = 2, kBufScratch = 3 };

/* What a test plugs into the simulation (all may be empty: the SM mode's needs). */
struct Hooks {
    /* A buffer of rank r (kBuf*) of `bytes`: its memory, or nullptr for the simulation's own. */
    std::function<char *(int r, int which, size_t bytes)> alloc;
    /* Adds every rank's port channels to its graph (collective: the ranks' graphs and buffers
     * exist) and fills ranks[r].ports (and out_ports). */
    std::function<void(std::vector<Rank> &ranks)> ports;
    /* Runs port task d (PORT_PUT or PORT_FLUSH) of rank rk: MACO_OK or why not. */
    std::function<maco_status_t(Rank &rk, const maco_pk_task_t *d)> port_task;
    /* The bound of every wait (MACO_DEVICE_TIMEOUT of the simulated ranks). */
    uint64_t timeout_ns = 60ull * 1000000000ull;
};

inline Hooks &TheHooks()
{
    static Hooks h;
    return h;
}

class FusedCpu : public maco_test::Test
{
  protected:
    /* Runs task `t` of rank r on the CPU (one thread). */
    static void Exec(Rank &rk, uint32_t t)
    {
        const maco_pk_task_t *d = &rk.v.tasks[t];
        const maco_task_t *src = &rk.g->tasks[t];
        uint64_t rows = d->ptr[3] & 0xffffu, ldi = (d->ptr[3] >> 16) & 0xffffffu,
                 ldo = d->ptr[3] >> 40;
        if (rows == 0) {
            rows = 1;
            ldi = ldo = d->count;
        }
        /* The output's mirrors: the same offset in each mirror channel's remote buffer. */
        std::vector<int64_t> outs{ 0 };
        if (rk.v.sync != nullptr)
            for (uint32_t j = 0; j < rk.v.sync[t].out_count; j++) {
                const maco_memory_channel_device_t *ch = &rk.v.channels[rk.v.sync[t].out_first + j];
                outs.push_back(ch->remote - ch->local);
            }
        switch (d->type) {
        case MACO_PK_NOP:
            break;
        case MACO_PK_COPY:
            for (int64_t o : outs)
                for (uint64_t r = 0; r < rows; r++)
                    memcpy(reinterpret_cast<char *>(d->ptr[0]) + o + r * ldo,
                           reinterpret_cast<const char *>(d->ptr[1]) + r * ldi, d->count);
            break;
        case MACO_PK_PORT_PUT:
        case MACO_PK_PORT_FLUSH: {
            maco_status_t st =
                TheHooks().port_task ? TheHooks().port_task(rk, d) : MACO_ERR_UNSUPPORTED;
            if (st != MACO_OK)
                ADD_FAILURE() << "port task " << t << ": " << maco_status_string(st) << ": "
                              << maco_log_last_error();
            break;
        }
        case MACO_PK_SUM: {
            maco_datatype_t dt = static_cast<maco_datatype_t>(d->dtype);
            maco_datatype_t odt =
                d->sum.out_dtype != 0 ? static_cast<maco_datatype_t>(d->sum.out_dtype) : dt;
            uint64_t esz = dt == MACO_FLOAT32 ? 4 : 2, oesz = odt == MACO_FLOAT32 ? 4 : 2;
            for (uint64_t r = 0; r < rows; r++)
                for (uint64_t i = 0; i < d->count; i++) {
                    float acc = 0;
                    for (uint32_t j = 0; j < d->aux; j++) {
                        const char *in = reinterpret_cast<const char *>(d->ptr[1]) + j * d->ptr[2] +
                                         r * ldi * esz;
                        float x = Load(in, i, dt);
                        acc = j == 0 ? x : acc + x;
                    }
                    for (int64_t o : outs)
                        Store(reinterpret_cast<char *>(d->ptr[0]) + o + r * ldo * oesz, i, odt,
                              acc);
                }
            break;
        }
        case MACO_PK_GEMM_TILE: {
            const uint16_t *A = reinterpret_cast<const uint16_t *>(d->ptr[1]);
            const uint16_t *B = reinterpret_cast<const uint16_t *>(d->ptr[2]);
            uint32_t K = static_cast<uint32_t>(d->count), N = static_cast<uint32_t>(d->count >> 32);
            uint32_t m0 = static_cast<uint32_t>(d->ptr[3]),
                     n0 = static_cast<uint32_t>(d->ptr[3] >> 32);
            uint32_t valid = src->m - m0 < 128 ? src->m - m0 : 128; /* rows past m: zeros */
            const uint64_t lda = src->ld_in != 0 ? src->ld_in : K;  /* a slice of K: split-K */
            maco_datatype_t dt = static_cast<maco_datatype_t>(d->dtype);
            uint64_t esz = dt == MACO_FLOAT32 ? 4 : 2;
            char *C = reinterpret_cast<char *>(d->ptr[0]);
            for (uint32_t i = 0; i < 128; i++) /* the whole tile, as the GMMA tiles store it */
                for (uint32_t j = 0; j < d->gemm.tile_n; j++) {
                    float acc = 0;
                    for (uint32_t kk = 0; kk < (i < valid ? K : 0); kk++)
                        acc += FromBf16(A[(uint64_t)(m0 + i) * lda + kk]) *
                               FromBf16(B[(uint64_t)kk * N + n0 + j]);
                    Store(C + (uint64_t)i * d->aux * esz, j, dt, acc);
                }
            break;
        }
        default:
            ADD_FAILURE() << "task " << t << " of type " << d->type << " in a fused graph";
        }
    }

    /* Whether task t's gate is open, as the pops promise; a failure if not. */
    static bool GateOpen(Rank &rk, uint32_t t, uint64_t run, std::atomic<int> &failed)
    {
        if (maco__pk_gate_open(&rk.v, t, run))
            return true;
        ADD_FAILURE() << "task " << t << " handed out with its gate closed";
        failed++;
        return false;
    }

    /* A communication worker as the GMMA kernel runs it (runtime/device/gemm_gmma.cu,
     * comm_worker): the next task is popped without waiting (maco__pk_try_next_ready) before
     * the last one is released, and released before any wait. Which of the two runs first
     * (the release of task i, or task i + 1, which the GPU overlaps) is drawn at random. */
    static void CommWorker(Rank &rk, std::atomic<int> &failed, uint32_t w, uint64_t run,
                           std::mt19937_64 &rng)
    {
        uint32_t t = 0;
        maco_status_t st = MACO_OK;
        int got = maco_pk_next_ready(&rk.v, w, run, &t, &st);
        bool executed = false;
        while (got == 1) {
            if (!executed) {
                if (!GateOpen(rk, t, run, failed))
                    return;
                if (rng() % 4 == 0)
                    std::this_thread::yield();
                Exec(rk, t);
            }
            executed = false;
            uint32_t t2 = 0;
            int got2 = maco__pk_try_next_ready(&rk.v, w, run, 8, &t2, &st);
            if (got2 == 1) {
                if (!GateOpen(rk, t2, run, failed))
                    return;
                if (rng() % 2 == 0) { /* task i + 1 before task i's release */
                    Exec(rk, t2);
                    executed = true;
                }
                maco_pk_post_signal(&rk.v, t);
                maco_pk_complete(&rk.v, t, run, 0, 1);
                t = t2;
                continue;
            }
            maco_pk_post_signal(&rk.v, t);
            maco_pk_complete(&rk.v, t, run, 0, 1);
            if (got2 == 2) { /* a closed gate it could not put back: wait there */
                t = t2;
                got = maco_pk_gate(&rk.v, t, run) == MACO_OK ? 1 : -1;
            } else if (got2 < 0) {
                got = -1;
            } else {
                got = maco_pk_next_ready(&rk.v, w, run, &t, &st);
            }
        }
        if (got < 0)
            failed++;
    }

    /* One launch of every rank at once (but `absent`, which does not start it: a dead peer).
     * Returns false when a rank failed, with a test failure unless `quiet`. */
    static bool Launch(std::vector<Rank> &ranks, uint64_t run, uint64_t seed, int absent = -1,
                       bool quiet = false)
    {
        std::vector<std::thread> th;
        std::atomic<int> failed{ 0 };
        for (size_t r = 0; r < ranks.size(); r++) {
            if ((int)r == absent)
                continue;
            Rank &rk = ranks[r];
            uint32_t nw = rk.v.nworkers + rk.v.ncomm;
            for (uint32_t w = 0; w < nw; w++)
                th.emplace_back([&rk, &failed, w, run, seed, r] {
                    std::mt19937_64 rng(seed * 1000003u + r * 131u + w);
                    if (w >= rk.v.nworkers) {
                        CommWorker(rk, failed, w, run, rng);
                        return;
                    }
                    for (;;) {
                        uint32_t t = 0;
                        maco_status_t st = MACO_OK;
                        int got = maco_pk_next_ready(&rk.v, w, run, &t, &st);
                        if (got < 0)
                            failed++;
                        if (got <= 0)
                            return;
                        if (!maco__pk_gate_open(&rk.v, t, run)) { /* next_ready's promise */
                            ADD_FAILURE() << "task " << t << " handed out with its gate closed";
                            failed++;
                            return;
                        }
                        if (rng() % 4 == 0) /* shake the interleavings */
                            std::this_thread::yield();
                        Exec(rk, t);
                        maco_pk_post_signal(&rk.v, t);
                        maco_pk_complete(&rk.v, t, run, 0, 1);
                    }
                });
            for (uint32_t s = 0; s < rk.v.nschedulers; s++)
                th.emplace_back([&rk, &failed, s, run] {
                    if (maco_pk_schedule(&rk.v, s, run) != MACO_OK)
                        failed++;
                });
        }
        for (auto &t : th)
            t.join();
        /* The last "CTA" out counts the launch, as maco__pk_cta_exit does. */
        for (size_t r = 0; r < ranks.size(); r++)
            if ((int)r != absent)
                ranks[r].v.ctr[MACO_PK_CTR_LAUNCHES] = run + 1;
        if (failed.load() != 0 && quiet)
            return false;
        if (failed.load() != 0) {
            for (size_t r = 0; r < ranks.size(); r++)
                if (ranks[r].report.status != 0)
                    ADD_FAILURE() << "rank " << r << ": what " << ranks[r].report.what
                                  << ", object " << ranks[r].report.object << ", peer "
                                  << ranks[r].report.peer << ", expected "
                                  << ranks[r].report.expected << ", observed "
                                  << ranks[r].report.observed;
            ADD_FAILURE() << failed.load() << " CTA(s) failed in launch " << run;
            return false;
        }
        return true;
    }

    static void Build(const Case &c, std::vector<Rank> &ranks)
    {
        const int n = c.nranks;
        const uint64_t esz = c.out_type == MACO_FLOAT32 ? 4 : 2;
        size_t scratch = 0;
        ASSERT_EQ(maco_fused_gemm_scratch_bytes_mode(c.kind, c.mode, n, c.m, c.n, c.k, c.out_type,
                                                     &scratch),
                  MACO_OK);
        const Hooks &hk = TheHooks();
        auto get = [&](Buf &b, int r, int which, size_t bytes) {
            char *p = hk.alloc ? hk.alloc(r, which, bytes) : nullptr;
            if (p != nullptr)
                b.Adopt(p, bytes);
            else
                b.Alloc(bytes);
        };
        uint64_t out_rows = c.kind == MACO_FUSED_ALLGATHER_GEMM        ? (uint64_t)c.m * n
                            : c.kind == MACO_FUSED_GEMM_REDUCE_SCATTER ? c.m / n
                                                                       : c.m;
        for (int r = 0; r < n; r++) {
            Rank &rk = ranks[(size_t)r];
            get(rk.a, r, kBufA, (size_t)c.m * c.k * 2);
            get(rk.b, r, kBufB, (size_t)c.k * c.n * 2);
            get(rk.out, r, kBufOut, out_rows * c.n * esz);
            get(rk.scratch, r, kBufScratch, scratch);
            ASSERT_EQ(maco_task_graph_create(&rk.g), MACO_OK);
        }
        if (c.mode != MACO_FUSED_COMM_SM && hk.ports) {
            ASSERT_NO_FATAL_FAILURE(hk.ports(ranks));
        }
        for (int r = 0; r < n; r++) {
            Rank &rk = ranks[(size_t)r];
            rk.channels.assign((size_t)n, -1);
            rk.out_channels.assign((size_t)n, -1);
            for (int q = 0; q < n; q++) {
                if (q == r)
                    continue;
                maco_memory_channel_device_t h;
                memset(&h, 0, sizeof(h));
                h.local = rk.scratch.p;
                h.remote = ranks[(size_t)q].scratch.p;
                h.local_bytes = h.remote_bytes = scratch;
                ASSERT_EQ(maco_task_graph_add_channel(rk.g, &h, &rk.channels[(size_t)q]), MACO_OK);
                h.local = rk.out.p;
                h.remote = ranks[(size_t)q].out.p;
                h.local_bytes = h.remote_bytes = rk.out.bytes;
                ASSERT_EQ(maco_task_graph_add_channel(rk.g, &h, &rk.out_channels[(size_t)q]),
                          MACO_OK);
            }
            maco_fused_gemm_t op;
            memset(&op, 0, sizeof(op));
            op.channels = rk.channels.data();
            op.out_channels = rk.out_channels.data();
            op.a = rk.a.p;
            op.b = rk.b.p;
            op.out = rk.out.p;
            op.scratch = rk.scratch.p;
            op.m = c.m;
            op.n = c.n;
            op.k = c.k;
            op.out_type = c.out_type;
            op.name = "op";
            op.comm_mode = c.mode;
            if (c.mode != MACO_FUSED_COMM_SM && hk.ports) {
                op.port_channels = rk.ports.data();
                op.out_port_channels = rk.out_ports.empty() ? nullptr : rk.out_ports.data();
            }
            int last = -1;
            ASSERT_EQ(maco__fused_build(rk.g, &op, c.kind, r, n, (int)c.W, &last), MACO_OK)
                << maco_log_last_error();
            ASSERT_GE(last, 0);
            ASSERT_EQ(maco__task_graph_lower(rk.g, "test", &rk.l), MACO_OK)
                << maco_log_last_error();
            size_t fb = 0, sb = 0;
            maco__pk_layout(&rk.l, rk.g->channels, rk.g->nchannels, c.W, c.C, c.S, 0, nullptr,
                            nullptr, nullptr, &rk.v, &fb, &sb);
            rk.fixed.assign(fb / 8 + 1, 0);
            rk.state.assign(sb / 8 + 1, 0);
            maco__pk_layout(&rk.l, rk.g->channels, rk.g->nchannels, c.W, c.C, c.S, 0,
                            rk.fixed.data(), rk.state.data(), rk.fixed.data(), &rk.v, &fb, &sb);
            rk.v.bound.report = &rk.report;
            rk.v.bound.claim = &rk.claim;
            rk.v.bound.timeout_ns = hk.timeout_ns;
        }
    }

    /* Fresh inputs: integers in [-2, 2] (products and sums exact). Outputs poisoned. */
    static void Fill(const Case &c, std::vector<Rank> &ranks, std::mt19937_64 &rng)
    {
        for (auto &rk : ranks) {
            uint16_t *a = reinterpret_cast<uint16_t *>(rk.a.p);
            uint16_t *b = reinterpret_cast<uint16_t *>(rk.b.p);
            for (uint64_t i = 0; i < (uint64_t)c.m * c.k; i++)
                a[i] = ToBf16(static_cast<float>(static_cast<int>(rng() % 5) - 2));
            for (uint64_t i = 0; i < (uint64_t)c.k * c.n; i++)
                b[i] = ToBf16(static_cast<float>(static_cast<int>(rng() % 5) - 2));
            memset(rk.out.p, 0xff, rk.out.bytes); /* NaN in fp32 and bf16 */
        }
    }

    /* Rank q's product (m x n rows of A_q x B_q), rounded to the output type. Each element
     * sums its k products in order from 0 (the order the simulation uses); a row's n sums run
     * side by side over B converted once, so that the reference stays quick under the
     * sanitizers (element by element it took 158 s of the unit test's 300 under ASan). */
    static std::vector<float> Product(const Case &c, const Rank &rk, const Rank &bk)
    {
        std::vector<float> p((size_t)c.m * c.n), fb((size_t)c.k * c.n), acc(c.n);
        const uint16_t *a = reinterpret_cast<const uint16_t *>(rk.a.p);
        const uint16_t *b = reinterpret_cast<const uint16_t *>(bk.b.p);
        for (size_t i = 0; i < fb.size(); i++)
            fb[i] = FromBf16(b[i]);
        for (uint32_t i = 0; i < c.m; i++) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (uint32_t kk = 0; kk < c.k; kk++) {
                const float x = FromBf16(a[(uint64_t)i * c.k + kk]);
                const float *row = &fb[(size_t)kk * c.n];
                for (uint32_t j = 0; j < c.n; j++)
                    acc[j] += x * row[j];
            }
            for (uint32_t j = 0; j < c.n; j++)
                p[(size_t)i * c.n + j] =
                    c.out_type == MACO_FLOAT32 ? acc[j] : FromBf16(ToBf16(acc[j]));
        }
        return p;
    }

    static void Check(const Case &c, std::vector<Rank> &ranks, uint64_t run)
    {
        const int n = c.nranks;
        for (int r = 0; r < n; r++) {
            const Rank &rk = ranks[(size_t)r];
            std::vector<float> want;
            if (c.kind == MACO_FUSED_ALLGATHER_GEMM) {
                for (int q = 0; q < n; q++) {
                    std::vector<float> p = Product(c, ranks[(size_t)q], rk);
                    want.insert(want.end(), p.begin(), p.end());
                }
            } else {
                std::vector<float> sum;
                for (int q = 0; q < n; q++) {
                    std::vector<float> p = Product(c, ranks[(size_t)q], ranks[(size_t)q]);
                    if (q == 0)
                        sum = p;
                    else
                        for (size_t i = 0; i < sum.size(); i++)
                            sum[i] += p[i];
                }
                for (auto &x : sum)
                    x = c.out_type == MACO_FLOAT32 ? x : FromBf16(ToBf16(x));
                if (c.kind == MACO_FUSED_GEMM_REDUCE_SCATTER) {
                    const size_t rows = c.m / n;
                    want.assign(sum.begin() + (ptrdiff_t)(r * rows * c.n),
                                sum.begin() + (ptrdiff_t)((r + 1) * rows * c.n));
                } else {
                    want = sum;
                }
            }
            int wrong = 0;
            for (size_t i = 0; i < want.size(); i++) {
                float got = Load(rk.out.p, i, c.out_type);
                if (!(got == want[i]) && wrong++ < 3)
                    ADD_FAILURE() << "launch " << run << " rank " << r << " element " << i
                                  << " (row " << i / c.n << ", column " << i % c.n << "): " << got
                                  << ", expected " << want[i];
            }
            EXPECT_EQ(wrong, 0) << "launch " << run << " rank " << r << ": " << wrong << " of "
                                << want.size() << " wrong";
        }
    }

    /* Three launches of case c on fresh inputs, each checked; then after(ranks) if given.
     * seed 0: a random one (the interleavings and inputs differ from run to run). */
    void Run(const Case &c, uint64_t seed = 0,
             const std::function<void(std::vector<Rank> &)> &after = {})
    {
        std::vector<Rank> ranks((size_t)c.nranks);
        ASSERT_NO_FATAL_FAILURE(Build(c, ranks));
        std::mt19937_64 rng(seed != 0 ? seed : std::random_device{}());
        for (uint64_t run = 0; run < 3; run++) {
            Fill(c, ranks, rng);
            ASSERT_TRUE(Launch(ranks, run, rng()));
            Check(c, ranks, run);
        }
        if (after)
            after(ranks);
    }
};

} // namespace fused_sim

#endif /* MACO_TESTS_FUSED_SIM_H */
