/*
 * test_fused_ce_cpu.cc - the fused operators' copy-engine mode (maco_fused_comm_t) end to end
 * without a GPU: 1 to 4 ranks in one process, each a real communicator (threads over the TCP
 * bootstrap) with a started proxy and host-memory port channels to every peer over buffers from
 * maco_mem_alloc_host, and each rank's graph from maco__fused_build run by the runtime's CPU
 * simulation (fused_sim.h). Its PORT_PUT and PORT_FLUSH tasks push the same triggers the GPU
 * pushes (maco/device/port_channel.h) into the proxy's host FIFO, through the handle the graph
 * holds (maco__task_graph_add_port_channel_host), so the rows really move: the proxy copies them
 * and raises the peer's semaphore, which the gates count. Every element is checked bit for bit
 * against the sequential reference over three launches; a rank that does not start a launch is
 * named by its peers' gates within the bound. The copy engines themselves, and the device side
 * of the tasks, need a GPU (test_persistent_gpu: scripts/gpu-verify.sh fused-tests).
 */
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fused_sim.h"
#include "proxy/fifo.h"
#include "runtime/host/fused_internal.h"

namespace
{

using fused_sim::Case;
using fused_sim::FusedCpu;
using fused_sim::Rank;

/* The job: n communicators in this process, each with a proxy and host buffers. */
struct Job {
    int n = 0;
    maco_unique_id_t id{};
    std::vector<maco_bootstrap_t> bs;
    std::vector<maco_comm_t> comm;
    std::vector<maco_proxy_t> proxy;
    std::vector<std::vector<void *>> host;            /* [r] maco_mem_alloc_host buffers */
    std::vector<std::vector<maco_mem_t>> mems;        /* [r] registrations and imports */
    std::vector<std::vector<maco_port_channel_t>> ch; /* [r] port channels */
    std::vector<std::string> errors;                  /* [r] setup failures */

    /* Runs fn(r) for every rank at once (the setup calls are collective). */
    template <class F> void OnEveryRank(F fn)
    {
        std::vector<std::thread> th;
        for (int r = 0; r < n; r++)
            th.emplace_back([&fn, r] { fn(r); });
        for (auto &t : th)
            t.join();
    }

    bool Create(int nranks)
    {
        n = nranks;
        bs.assign((size_t)n, nullptr);
        comm.assign((size_t)n, nullptr);
        proxy.assign((size_t)n, nullptr);
        host.assign((size_t)n, {});
        mems.assign((size_t)n, {});
        ch.assign((size_t)n, {});
        errors.assign((size_t)n, "");
        if (maco_unique_id_create(&id) != MACO_OK)
            return false;
        OnEveryRank([this](int r) {
            if (maco_bootstrap_create(&id, r, n, 30000, &bs[(size_t)r]) != MACO_OK ||
                maco_comm_create(bs[(size_t)r], -1, &comm[(size_t)r]) != MACO_OK ||
                maco_proxy_create(comm[(size_t)r], &proxy[(size_t)r]) != MACO_OK ||
                maco_proxy_start(proxy[(size_t)r]) != MACO_OK)
                errors[(size_t)r] = maco_log_last_error();
        });
        for (const auto &e : errors)
            if (!e.empty()) {
                ADD_FAILURE() << "setup: " << e;
                return false;
            }
        return true;
    }

    /* Rank r's `bytes` of shared host memory (freed by Destroy). */
    char *Alloc(int r, size_t bytes)
    {
        void *p = nullptr;
        if (maco_mem_alloc_host(comm[(size_t)r], bytes, &p) != MACO_OK) {
            ADD_FAILURE() << "maco_mem_alloc_host: " << maco_log_last_error();
            return nullptr;
        }
        host[(size_t)r].push_back(p);
        return static_cast<char *>(p);
    }

    /* Collective: every rank registers its src (bytes) and dst (bytes) buffers, imports its
     * peers' dst and makes a host-memory port channel to each from src into the peer's dst,
     * added to its graph; *idx gets the graph's index per peer. */
    void Channels(std::vector<Rank> &ranks, const std::vector<char *> &src, size_t src_bytes,
                  const std::vector<char *> &dst, size_t dst_bytes,
                  std::vector<std::vector<int>> *idx)
    {
        idx->assign((size_t)n, std::vector<int>((size_t)n, -1));
        OnEveryRank([&](int r) {
            maco_comm_t c = comm[(size_t)r];
            maco_mem_t s = nullptr, d = nullptr;
            std::vector<uint8_t> h((size_t)n * MACO_MEM_HANDLE_BYTES);
            std::string &err = errors[(size_t)r];
            const bool same = src[(size_t)r] == dst[(size_t)r];
            if (maco_mem_register(c, src[(size_t)r], src_bytes, &s) != MACO_OK ||
                (!same && maco_mem_register(c, dst[(size_t)r], dst_bytes, &d) != MACO_OK) ||
                (d = same ? s : d) == nullptr ||
                maco_mem_serialize(d, &h[(size_t)r * MACO_MEM_HANDLE_BYTES]) != MACO_OK ||
                maco_bootstrap_allgather(bs[(size_t)r], h.data(), MACO_MEM_HANDLE_BYTES) !=
                    MACO_OK) {
                err = maco_log_last_error();
                return;
            }
            mems[(size_t)r].push_back(s);
            if (!same)
                mems[(size_t)r].push_back(d);
            for (int q = 0; q < n && err.empty(); q++) {
                if (q == r)
                    continue;
                maco_mem_t peer = nullptr;
                maco_port_channel_t pc = nullptr;
                if (maco_mem_import(c, &h[(size_t)q * MACO_MEM_HANDLE_BYTES], &peer) != MACO_OK ||
                    maco_port_channel_create(proxy[(size_t)r], q, MACO_TRANSPORT_HOST_MEMORY, s,
                                             peer, &pc) != MACO_OK ||
                    maco__task_graph_add_port_channel_host(
                        ranks[(size_t)r].g, pc, &(*idx)[(size_t)r][(size_t)q]) != MACO_OK) {
                    err = maco_log_last_error();
                    break;
                }
                mems[(size_t)r].push_back(peer);
                ch[(size_t)r].push_back(pc);
            }
        });
        for (const auto &e : errors)
            if (!e.empty())
                ADD_FAILURE() << "port channels: " << e;
    }

    void Destroy()
    {
        for (int r = 0; r < n; r++) {
            if (proxy[(size_t)r] != nullptr)
                maco_proxy_stop(proxy[(size_t)r]);
            for (auto c : ch[(size_t)r])
                maco_port_channel_destroy(c);
            maco_proxy_destroy(proxy[(size_t)r]);
            for (size_t i = mems[(size_t)r].size(); i-- > 0;)
                maco_mem_deregister(mems[(size_t)r][i]);
            for (void *p : host[(size_t)r])
                maco_mem_free(comm[(size_t)r], p);
        }
        /* Collective teardown of the communicators, then their bootstraps. */
        OnEveryRank([this](int r) { maco_comm_destroy(comm[(size_t)r]); });
        for (auto b : bs)
            maco_bootstrap_destroy(b);
        n = 0;
    }
};

/* What a PORT_PUT or PORT_FLUSH task pushes, into the FIFO of the task's channel handle: the
 * triggers of maco_port_channel_put_with_signal / _signal / _flush (maco/device/impl/
 * port_channel.h), from a host thread. */
maco_status_t PushPortTask(Rank &rk, const maco_pk_task_t *d)
{
    const maco_port_channel_device_t *h = &rk.v.ports[d->aux];
    uint64_t pos = 0;
    if (d->type == MACO_PK_PORT_FLUSH) {
        maco_status_t st = maco__fifo_host_push(
            &h->fifo, maco_trigger_make(MACO_TRIGGER_FLUSH, h->channel, 0, 0, 0), 30000, &pos);
        return st == MACO_OK ? maco__fifo_host_wait_flush(&h->fifo, pos, 30000) : st;
    }
    const uint32_t type =
        d->count == 0 ? MACO_TRIGGER_SIGNAL : MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL;
    return maco__fifo_host_push(
        &h->fifo, maco_trigger_make(type, h->channel, d->ptr[0], d->ptr[1], d->count), 30000, &pos);
}

class FusedCe : public FusedCpu
{
  protected:
    Job job_;
    std::vector<char *> buf_[4]; /* [kBuf*][rank], shared host memory */
    size_t bytes_[4] = { 0, 0, 0, 0 };

    void SetUp() override
    {
        FusedCpu::SetUp();
        fused_sim::Hooks &h = fused_sim::TheHooks();
        h.port_task = PushPortTask;
        h.alloc = [this](int r, int which, size_t bytes) -> char * {
            if (which == fused_sim::kBufB)
                return nullptr; /* read locally only */
            if (buf_[which].size() != (size_t)job_.n)
                buf_[which].assign((size_t)job_.n, nullptr);
            bytes_[which] = bytes;
            return buf_[which][(size_t)r] = job_.Alloc(r, bytes);
        };
    }
    void TearDown() override
    {
        fused_sim::TheHooks() = fused_sim::Hooks();
        if (job_.n > 0)
            job_.Destroy();
        FusedCpu::TearDown();
    }

    /* The port channels each operator's copy-engine mode takes (maco_fused_comm_t). */
    void Ports(const Case &c, std::vector<Rank> &ranks)
    {
        std::vector<std::vector<int>> idx, out_idx;
        using fused_sim::kBufA;
        using fused_sim::kBufOut;
        using fused_sim::kBufScratch;
        if (c.kind == MACO_FUSED_ALLGATHER_GEMM)
            job_.Channels(ranks, buf_[kBufA], bytes_[kBufA], buf_[kBufScratch], bytes_[kBufScratch],
                          &idx);
        else
            job_.Channels(ranks, buf_[kBufScratch], bytes_[kBufScratch], buf_[kBufScratch],
                          bytes_[kBufScratch], &idx);
        if (c.kind == MACO_FUSED_GEMM_ALLREDUCE)
            job_.Channels(ranks, buf_[kBufOut], bytes_[kBufOut], buf_[kBufOut], bytes_[kBufOut],
                          &out_idx);
        for (int r = 0; r < c.nranks; r++) {
            ranks[(size_t)r].ports = idx[(size_t)r];
            if (c.kind == MACO_FUSED_GEMM_ALLREDUCE)
                ranks[(size_t)r].out_ports = out_idx[(size_t)r];
        }
    }

    /* Case c in the copy-engine mode, or in AUTO where c.mode says so (the channels of both
     * modes given); the gates' counts checked where the copy engines were taken. */
    void RunCe(Case c, uint64_t seed = 0,
               const std::function<void(std::vector<Rank> &)> &after = {})
    {
        if (c.mode != MACO_FUSED_COMM_AUTO)
            c.mode = MACO_FUSED_COMM_COPY_ENGINE;
        maco_fused_comm_t took = MACO_FUSED_COMM_COPY_ENGINE;
        if (c.mode == MACO_FUSED_COMM_AUTO) {
            ASSERT_EQ(
                maco_fused_gemm_choose_comm(c.kind, c.nranks, c.m, c.n, c.k, c.out_type, &took),
                MACO_OK);
        }
        ASSERT_TRUE(job_.Create(c.nranks));
        fused_sim::TheHooks().ports = [this, c](std::vector<Rank> &ranks) { Ports(c, ranks); };
        Run(c, seed, [&](std::vector<Rank> &ranks) {
            if (took == MACO_FUSED_COMM_COPY_ENGINE)
                CheckGates(c, ranks, 3);
            if (after)
                after(ranks);
        });
        job_.Destroy();
        for (auto &b : buf_)
            b.clear();
    }

    /* The tasks of rank rk gated on semaphore `sem`: each gate's wait_count is `count`, the
     * distinct wait_need values are exactly `needs`, and after `launches` launches the
     * semaphore counted count x launches signals (none lost, none extra). */
    static void CheckSemaphore(const Rank &rk, const uint64_t *sem, uint64_t count,
                               std::vector<uint64_t> needs, uint64_t launches, const char *what,
                               int r, int q)
    {
        SCOPED_TRACE(std::string(what) + ": rank " + std::to_string(r) + " from rank " +
                     std::to_string(q));
        std::vector<uint64_t> got;
        for (int i = 0; i < rk.g->ntasks; i++) {
            const maco_task_t &t = rk.g->tasks[i];
            if (t.wait_on != sem)
                continue;
            EXPECT_EQ(t.wait_count, count) << "task " << i;
            EXPECT_EQ(t.wait_peer, q) << "task " << i;
            got.push_back(t.wait_need);
        }
        std::sort(got.begin(), got.end());
        got.erase(std::unique(got.begin(), got.end()), got.end());
        EXPECT_EQ(got, needs);
        EXPECT_EQ(__atomic_load_n(sem, __ATOMIC_ACQUIRE), count * launches);
    }

    /* The protocol's counts (maco_fused_comm_t) on every rank's channels after `launches`. */
    static void CheckGates(const Case &c, std::vector<Rank> &ranks, uint64_t launches)
    {
        const int n = c.nranks;
        for (int r = 0; r < n; r++) {
            const Rank &rk = ranks[(size_t)r];
            for (int q = 0; q < n; q++) {
                if (q == r)
                    continue;
                const uint64_t *sem = rk.g->ports[rk.ports[(size_t)q]].handle.semaphore.inbound;
                if (c.kind != MACO_FUSED_GEMM_ALLREDUCE) {
                    /* ready, then one signal per row: tiles or puts gated on the first, the
                     * row arrivals on the second to the last. */
                    const uint64_t R = maco__fused_tile_rows(
                        c.kind == MACO_FUSED_GEMM_REDUCE_SCATTER ? c.m / (uint32_t)n : c.m);
                    std::vector<uint64_t> needs;
                    for (uint64_t j = 1; j <= R + 1; j++)
                        needs.push_back(j);
                    CheckSemaphore(rk, sem, R + 1, needs, launches, "rows", r, q);
                    continue;
                }
                /* allreduce: q's products of the rows r owns (i mod n == r), one by one; on
                 * the out channel the rows q owns, summed, all of them awaited at once. */
                const uint64_t R = maco__fused_tile_rows(c.m);
                const uint64_t mine = (R + (uint64_t)n - 1 - (uint64_t)r) / (uint64_t)n;
                const uint64_t theirs = (R + (uint64_t)n - 1 - (uint64_t)q) / (uint64_t)n;
                std::vector<uint64_t> needs;
                for (uint64_t j = 1; j <= mine; j++)
                    needs.push_back(j);
                CheckSemaphore(rk, sem, mine, needs, launches, "products", r, q);
                const uint64_t *osem =
                    rk.g->ports[rk.out_ports[(size_t)q]].handle.semaphore.inbound;
                CheckSemaphore(rk, osem, theirs,
                               theirs > 0 ? std::vector<uint64_t>{ 0 } : std::vector<uint64_t>{},
                               launches, "sums", r, q);
            }
            /* The builder keeps within the bound it promises (choose_comm, the refusal). */
            uint64_t comm = 0;
            for (int i = 0; i < rk.g->ntasks; i++)
                comm += maco__task_is_comm(&rk.g->tasks[i]) ? 1u : 0u;
            EXPECT_LE(comm, maco__fused_ce_comm_tasks(c.kind, n, c.m, c.n, MACO_GEMM_TILE_N))
                << "rank " << r;
        }
    }

    /* Every rank's output after three launches of case c in `mode` from `seed`. */
    std::vector<std::string> Outputs(Case c, int mode, uint64_t seed)
    {
        std::vector<std::string> outs;
        auto grab = [&outs](std::vector<Rank> &ranks) {
            for (const Rank &rk : ranks)
                outs.emplace_back(rk.out.p, rk.out.bytes);
        };
        if (mode == MACO_FUSED_COMM_COPY_ENGINE) {
            RunCe(c, seed, grab);
            return outs;
        }
        fused_sim::Hooks saved = fused_sim::TheHooks();
        fused_sim::TheHooks() = fused_sim::Hooks(); /* the simulation's own buffers */
        c.mode = mode;
        Run(c, seed, grab);
        fused_sim::TheHooks() = saved;
        return outs;
    }
};

TEST_F(FusedCe, GemmAllreduceRowsOnTheProxy)
{
    for (int n = 1; n <= 4; n++) {
        SCOPED_TRACE("ranks " + std::to_string(n));
        /* 3 rows of tiles, the last partial: at 4 ranks rank 3 owns none. */
        RunCe({ MACO_FUSED_GEMM_ALLREDUCE, n, 300, 512, 64, MACO_FLOAT32, 3, 2, 1 });
        RunCe({ MACO_FUSED_GEMM_ALLREDUCE, n, 640, 256, 32, MACO_BFLOAT16, 2, 1, 2 });
    }
}

TEST_F(FusedCe, GemmReduceScatterRowsOnTheProxy)
{
    for (int n = 1; n <= 4; n++) {
        SCOPED_TRACE("ranks " + std::to_string(n));
        /* 100 rows per rank (one partial row of tiles), and 2 rows and a part. */
        RunCe({ MACO_FUSED_GEMM_REDUCE_SCATTER, n, 100u * (uint32_t)n, 512, 64, MACO_BFLOAT16, 3, 2,
                1 });
        RunCe({ MACO_FUSED_GEMM_REDUCE_SCATTER, n, 300u * (uint32_t)n, 256, 32, MACO_FLOAT32, 2, 1,
                1 });
    }
}

TEST_F(FusedCe, AllgatherGemmBlocksOnTheProxy)
{
    for (int n = 1; n <= 4; n++) {
        SCOPED_TRACE("ranks " + std::to_string(n));
        RunCe({ MACO_FUSED_ALLGATHER_GEMM, n, 160, 256, 64, MACO_BFLOAT16, 2, 1, 1 });
        RunCe({ MACO_FUSED_ALLGATHER_GEMM, n, 32, 384, 32, MACO_FLOAT32, 1, 1, 1 });
        /* K = 1536: a 384 KiB block per put. */
        RunCe({ MACO_FUSED_ALLGATHER_GEMM, n, 300, 128, 1536, MACO_BFLOAT16, 2, 2, 1 });
    }
}

/* A rank that does not start a launch: its peers' gates wait for its rows (or its ready
 * signal) and report it by rank within the bound; nothing hangs. */
TEST_F(FusedCe, DeadPeerIsNamedWithinTheBound)
{
    fused_sim::TheHooks().timeout_ns = 2ull * 1000000000ull;
    for (maco_fused_op_t kind :
         { MACO_FUSED_GEMM_ALLREDUCE, MACO_FUSED_GEMM_REDUCE_SCATTER, MACO_FUSED_ALLGATHER_GEMM }) {
        SCOPED_TRACE("operator " + std::to_string((int)kind));
        Case c{ kind, 3, 768, 256, 64, MACO_FLOAT32, 2, 1, 1 };
        c.mode = MACO_FUSED_COMM_COPY_ENGINE;
        ASSERT_TRUE(job_.Create(c.nranks));
        fused_sim::TheHooks().ports = [this, c](std::vector<Rank> &ranks) { Ports(c, ranks); };
        std::vector<Rank> ranks((size_t)c.nranks);
        ASSERT_NO_FATAL_FAILURE(Build(c, ranks));
        std::mt19937_64 rng(7);
        Fill(c, ranks, rng);
        ASSERT_TRUE(Launch(ranks, 0, rng())); /* a good launch first */
        Check(c, ranks, 0);
        maco_test::AllowLog("");
        const int dead = 2;
        EXPECT_FALSE(Launch(ranks, 1, rng(), dead, /*quiet=*/true));
        for (int r = 0; r < c.nranks; r++) {
            if (r == dead)
                continue;
            const maco_device_error_t &e = ranks[(size_t)r].report;
            EXPECT_EQ(e.status, MACO_ERR_TIMEOUT) << "rank " << r;
            EXPECT_EQ(e.what, (uint32_t)MACO_DEVICE_WAIT_TASK_GATE) << "rank " << r;
            EXPECT_EQ(e.peer, dead) << "rank " << r << " blamed " << e.peer;
        }
        ranks.clear();
        job_.Destroy();
        for (auto &b : buf_)
            b.clear();
    }
}

/* The same inputs and the same interleaving seed give the same bits in both modes. */
TEST_F(FusedCe, SameBitsAsTheSmMode)
{
    const Case cases[] = {
        { MACO_FUSED_GEMM_ALLREDUCE, 0, 300, 256, 64, MACO_BFLOAT16, 2, 1, 1 },
        { MACO_FUSED_GEMM_REDUCE_SCATTER, 0, 0, 256, 32, MACO_FLOAT32, 2, 1, 1 },
        { MACO_FUSED_ALLGATHER_GEMM, 0, 200, 128, 64, MACO_BFLOAT16, 2, 1, 1 },
    };
    for (Case c : cases)
        for (int n = 1; n <= 4; n++) {
            SCOPED_TRACE("operator " + std::to_string((int)c.kind) + ", ranks " +
                         std::to_string(n));
            c.nranks = n;
            if (c.kind == MACO_FUSED_GEMM_REDUCE_SCATTER)
                c.m = 200u * (uint32_t)n;
            const uint64_t seed = 1000u + (uint64_t)n;
            std::vector<std::string> sm = Outputs(c, MACO_FUSED_COMM_SM, seed);
            std::vector<std::string> ce = Outputs(c, MACO_FUSED_COMM_COPY_ENGINE, seed);
            ASSERT_EQ(sm.size(), (size_t)n);
            ASSERT_EQ(ce.size(), (size_t)n);
            for (int r = 0; r < n; r++)
                EXPECT_TRUE(sm[(size_t)r] == ce[(size_t)r]) << "rank " << r << " differs";
        }
}

/* Whether rank graphs hold port puts (the copy engines were taken). */
bool HasPortPuts(const std::vector<Rank> &ranks)
{
    bool any = false;
    for (const Rank &rk : ranks)
        for (int i = 0; i < rk.g->ntasks; i++)
            any = any || rk.g->tasks[i].type == MACO_TASK_PORT_PUT;
    return any;
}

/* MACO_FUSED_COMM_AUTO builds what maco_fused_gemm_choose_comm says, given the channels of
 * both modes, and gives the same bits. */
TEST_F(FusedCe, AutoBuildsTheChosenMode)
{
    /* 16 KiB rows: the SMs. */
    Case sm{ MACO_FUSED_ALLGATHER_GEMM, 2, 160, 256, 64, MACO_BFLOAT16, 2, 1, 1 };
    sm.mode = MACO_FUSED_COMM_AUTO;
    bool puts = true;
    RunCe(sm, 0, [&puts](std::vector<Rank> &ranks) { puts = HasPortPuts(ranks); });
    EXPECT_FALSE(puts) << "AUTO took the copy engines for 16 KiB rows";
    /* 128 x 4096 bf16 = 1 MiB blocks of A, two per peer: the copy engines. */
    Case ce{ MACO_FUSED_ALLGATHER_GEMM, 2, 256, 128, 4096, MACO_FLOAT32, 2, 1, 1 };
    ce.mode = MACO_FUSED_COMM_AUTO;
    puts = false;
    RunCe(ce, 0, [&puts](std::vector<Rank> &ranks) { puts = HasPortPuts(ranks); });
    EXPECT_TRUE(puts) << "AUTO took the SMs for 1 MiB rows";
}

/* The rule of MACO_FUSED_COMM_AUTO (maco_fused_gemm_choose_comm), case by case. */
TEST_F(FusedCe, ChooseCommFollowsTheDocumentedRule)
{
    struct Want {
        maco_fused_op_t kind;
        int nranks;
        uint32_t m, n, k;
        maco_datatype_t t;
        maco_fused_comm_t mode;
        const char *why;
    };
    const Want wants[] = {
        { MACO_FUSED_ALLGATHER_GEMM, 1, 8192, 8192, 8192, MACO_BFLOAT16, MACO_FUSED_COMM_SM,
          "no peer" },
        { MACO_FUSED_ALLGATHER_GEMM, 2, 256, 1024, 4096, MACO_BFLOAT16, MACO_FUSED_COMM_COPY_ENGINE,
          "128 x 4096 bf16 = 1 MiB puts, 2 per peer" },
        { MACO_FUSED_ALLGATHER_GEMM, 2, 256, 1024, 2048, MACO_BFLOAT16, MACO_FUSED_COMM_SM,
          "512 KiB puts" },
        { MACO_FUSED_ALLGATHER_GEMM, 2, 128, 1024, 4096, MACO_BFLOAT16, MACO_FUSED_COMM_SM,
          "one put per peer" },
        { MACO_FUSED_GEMM_ALLREDUCE, 4, 1024, 4096, 1024, MACO_FLOAT32, MACO_FUSED_COMM_COPY_ENGINE,
          "2 MiB rows, 2 per owner" },
        { MACO_FUSED_GEMM_ALLREDUCE, 4, 1024, 4096, 1024, MACO_BFLOAT16,
          MACO_FUSED_COMM_COPY_ENGINE, "1 MiB rows, 2 per owner" },
        { MACO_FUSED_GEMM_ALLREDUCE, 4, 512, 4096, 1024, MACO_FLOAT32, MACO_FUSED_COMM_SM,
          "one row per owner" },
        { MACO_FUSED_GEMM_ALLREDUCE, 4, 1024, 2048, 1024, MACO_BFLOAT16, MACO_FUSED_COMM_SM,
          "512 KiB rows" },
        { MACO_FUSED_GEMM_REDUCE_SCATTER, 2, 512, 4096, 1024, MACO_BFLOAT16,
          MACO_FUSED_COMM_COPY_ENGINE, "1 MiB rows, 2 per block" },
        { MACO_FUSED_GEMM_REDUCE_SCATTER, 2, 256, 4096, 1024, MACO_BFLOAT16, MACO_FUSED_COMM_SM,
          "one row per block" },
        /* 64 rows per block x 64 columns of tiles: 4226 communication tasks, over the bound. */
        { MACO_FUSED_GEMM_REDUCE_SCATTER, 2, 16384, 8192, 1024, MACO_FLOAT32, MACO_FUSED_COMM_SM,
          "too many tasks" },
    };
    for (const Want &w : wants) {
        maco_fused_comm_t got = MACO_FUSED_COMM_AUTO;
        ASSERT_EQ(maco_fused_gemm_choose_comm(w.kind, w.nranks, w.m, w.n, w.k, w.t, &got), MACO_OK)
            << w.why;
        EXPECT_EQ(got, w.mode) << w.why;
    }
    EXPECT_GT(
        maco__fused_ce_comm_tasks(MACO_FUSED_GEMM_REDUCE_SCATTER, 2, 16384, 8192, MACO_GEMM_TILE_N),
        (uint64_t)MACO__FUSED_CE_MAX_COMM_TASKS);
    /* Bad input, named. */
    maco_fused_comm_t got = MACO_FUSED_COMM_AUTO;
    maco_test::AllowLog("maco_fused_gemm_choose_comm");
    EXPECT_EQ(
        maco_fused_gemm_choose_comm(MACO_FUSED_GEMM_ALLREDUCE, 2, 128, 100, 64, MACO_FLOAT32, &got),
        MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("n 100"), std::string::npos)
        << maco_log_last_error();
    EXPECT_EQ(maco_fused_gemm_choose_comm(MACO_FUSED_GEMM_REDUCE_SCATTER, 3, 128, 128, 64,
                                          MACO_FLOAT32, &got),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("m a multiple of nranks"), std::string::npos)
        << maco_log_last_error();
    EXPECT_EQ(maco_fused_gemm_choose_comm(MACO_FUSED_GEMM_ALLREDUCE, 2, 128, 128, 64, MACO_FLOAT32,
                                          nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(got, MACO_FUSED_COMM_AUTO); /* untouched */
}

TEST_F(FusedCe, ScratchBytesPerMode)
{
    const maco_fused_op_t kinds[] = { MACO_FUSED_GEMM_ALLREDUCE, MACO_FUSED_GEMM_REDUCE_SCATTER,
                                      MACO_FUSED_ALLGATHER_GEMM };
    for (maco_fused_op_t kind : kinds)
        for (int n : { 1, 2, 3, 4 })
            for (maco_datatype_t t : { MACO_FLOAT32, MACO_BFLOAT16 }) {
                SCOPED_TRACE("operator " + std::to_string((int)kind) + ", ranks " +
                             std::to_string(n));
                const uint32_t m = 300u * (uint32_t)n, N = 4096, K = 4096;
                size_t base = 0, sm = 0, ce = 0, autob = 0;
                ASSERT_EQ(maco_fused_gemm_scratch_bytes(kind, n, m, N, K, t, &base), MACO_OK);
                ASSERT_EQ(maco_fused_gemm_scratch_bytes_mode(kind, MACO_FUSED_COMM_SM, n, m, N, K,
                                                             t, &sm),
                          MACO_OK);
                ASSERT_EQ(maco_fused_gemm_scratch_bytes_mode(kind, MACO_FUSED_COMM_COPY_ENGINE, n,
                                                             m, N, K, t, &ce),
                          MACO_OK);
                ASSERT_EQ(maco_fused_gemm_scratch_bytes_mode(kind, MACO_FUSED_COMM_AUTO, n, m, N, K,
                                                             t, &autob),
                          MACO_OK);
                EXPECT_EQ(sm, base);
                /* reduce-scatter's send slots: nranks blocks of pad(m / nranks) rows. */
                const size_t esz = t == MACO_FLOAT32 ? 4 : 2;
                EXPECT_EQ(ce, kind == MACO_FUSED_GEMM_REDUCE_SCATTER
                                  ? base + (size_t)n * maco__fused_pad(m / (uint32_t)n) * N * esz
                                  : base);
                maco_fused_comm_t chosen = MACO_FUSED_COMM_AUTO;
                ASSERT_EQ(maco_fused_gemm_choose_comm(kind, n, m, N, K, t, &chosen), MACO_OK);
                EXPECT_EQ(autob, chosen == MACO_FUSED_COMM_COPY_ENGINE ? ce : sm);
            }
    size_t b = 1;
    maco_test::AllowLog("mode 7");
    EXPECT_EQ(maco_fused_gemm_scratch_bytes_mode(MACO_FUSED_GEMM_ALLREDUCE, 7, 2, 128, 128, 64,
                                                 MACO_FLOAT32, &b),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("mode 7"), std::string::npos)
        << maco_log_last_error();
    EXPECT_EQ(b, 1u);
}

/* An operator whose communication tasks could fill a worker's queue is refused (its gates
 * rely on going back to the queue), whatever channels it names; the graph is unchanged. */
TEST_F(FusedCe, RefusedAboveTheTaskLimit)
{
    maco_task_graph_t g = nullptr;
    ASSERT_EQ(maco_task_graph_create(&g), MACO_OK);
    fused_sim::Buf s, a, b, o;
    s.Alloc(4096);
    a.Alloc(4096);
    b.Alloc(4096);
    o.Alloc(4096);
    std::vector<int> ports(2, -1);
    maco_fused_gemm_t op;
    memset(&op, 0, sizeof(op));
    op.a = a.p;
    op.b = b.p;
    op.out = o.p;
    op.scratch = s.p;
    op.port_channels = ports.data();
    op.comm_mode = MACO_FUSED_COMM_COPY_ENGINE;
    op.out_type = MACO_FLOAT32;
    op.m = 16384;
    op.n = 8192;
    op.k = 1024;
    maco_test::AllowLog("communication tasks");
    EXPECT_EQ(maco__fused_build(g, &op, MACO_FUSED_GEMM_REDUCE_SCATTER, 0, 2, 132, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("up to 4226 communication tasks"),
              std::string::npos)
        << maco_log_last_error();
    /* A small operator, on a graph that holds 4092 communication tasks already. */
    maco_task_t nop;
    memset(&nop, 0, sizeof(nop));
    nop.type = MACO_TASK_NOP;
    nop.role = MACO_TASK_ROLE_COMM;
    for (int i = 0; i < 4092; i++) {
        int id = -1;
        ASSERT_EQ(maco_task_graph_add_task(g, &nop, &id), MACO_OK);
    }
    op.m = 128;
    op.n = 128;
    op.k = 32;
    EXPECT_EQ(maco__fused_build(g, &op, MACO_FUSED_ALLGATHER_GEMM, 0, 2, 132, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("the graph has 4092 already"),
              std::string::npos)
        << maco_log_last_error();
    int ntasks = -1;
    EXPECT_EQ(maco_task_graph_get_ntasks(g, &ntasks), MACO_OK);
    EXPECT_EQ(ntasks, 4092);
    maco_task_graph_destroy(g);
}

/* Communication tasks added after a copy-engine operator: the graph is refused when lowered. */
TEST_F(FusedCe, LoweringRefusesTooManyCommunicationTasksAfterIt)
{
    Case c{ MACO_FUSED_ALLGATHER_GEMM, 2, 128, 128, 32, MACO_FLOAT32, 2, 1, 1 };
    c.mode = MACO_FUSED_COMM_COPY_ENGINE;
    ASSERT_TRUE(job_.Create(c.nranks));
    fused_sim::TheHooks().ports = [this, c](std::vector<Rank> &ranks) { Ports(c, ranks); };
    std::vector<Rank> ranks((size_t)c.nranks);
    ASSERT_NO_FATAL_FAILURE(Build(c, ranks));
    maco_task_t nop;
    memset(&nop, 0, sizeof(nop));
    nop.type = MACO_TASK_NOP;
    nop.role = MACO_TASK_ROLE_COMM;
    for (int i = 0; i < MACO__FUSED_CE_MAX_COMM_TASKS; i++) {
        int id = -1;
        ASSERT_EQ(maco_task_graph_add_task(ranks[0].g, &nop, &id), MACO_OK);
    }
    maco__pk_lowered_t l{};
    maco_test::AllowLog("communication tasks");
    EXPECT_EQ(maco__task_graph_lower(ranks[0].g, "test", &l), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("copy-engine"), std::string::npos)
        << maco_log_last_error();
    ranks.clear();
    job_.Destroy();
    for (auto &b : buf_)
        b.clear();
}

/* Bad input names the argument; nothing is added. */
TEST_F(FusedCe, BadInputNamesTheArgument)
{
    Case c{ MACO_FUSED_GEMM_ALLREDUCE, 2, 128, 128, 32, MACO_FLOAT32, 2, 1, 1 };
    ASSERT_TRUE(job_.Create(2));
    std::vector<Rank> ranks(2);
    size_t need = 0;
    ASSERT_EQ(maco_fused_gemm_scratch_bytes_mode(c.kind, MACO_FUSED_COMM_COPY_ENGINE, 2, c.m, c.n,
                                                 c.k, c.out_type, &need),
              MACO_OK);
    std::vector<char *> scratch(2), out(2);
    for (int r = 0; r < 2; r++) {
        ASSERT_EQ(maco_task_graph_create(&ranks[(size_t)r].g), MACO_OK);
        scratch[(size_t)r] = job_.Alloc(r, need);
        out[(size_t)r] = job_.Alloc(r, (size_t)c.m * c.n * 4);
        ranks[(size_t)r].a.Alloc((size_t)c.m * c.k * 2);
        ranks[(size_t)r].b.Alloc((size_t)c.k * c.n * 2);
    }
    std::vector<std::vector<int>> idx;
    job_.Channels(ranks, scratch, need, scratch, need, &idx);
    maco_task_graph_t g = ranks[0].g;
    maco_fused_gemm_t op;
    memset(&op, 0, sizeof(op));
    op.a = ranks[0].a.p;
    op.b = ranks[0].b.p;
    op.out = out[0];
    op.scratch = scratch[0];
    op.m = c.m;
    op.n = c.n;
    op.k = c.k;
    op.out_type = c.out_type;
    op.comm_mode = 5;
    auto refused = [&](maco_fused_op_t kind, const char *says) {
        maco_test::AllowLog(says);
        EXPECT_EQ(maco__fused_build(g, &op, kind, 0, 2, 8, nullptr), MACO_ERR_INVALID_ARGUMENT)
            << says;
        EXPECT_NE(std::string(maco_log_last_error()).find(says), std::string::npos)
            << maco_log_last_error();
    };
    refused(MACO_FUSED_GEMM_ALLREDUCE, "comm_mode 5 is no maco_fused_comm_t");
    op.comm_mode = MACO_FUSED_COMM_COPY_ENGINE;
    refused(MACO_FUSED_GEMM_ALLREDUCE, "port_channels is NULL");
    std::vector<int> bad{ -1, 9 };
    op.port_channels = bad.data();
    refused(MACO_FUSED_GEMM_ALLREDUCE, "port_channels[1] = 9 must be a port channel");
    op.port_channels = idx[0].data();
    refused(MACO_FUSED_GEMM_ALLREDUCE, "out_port_channels is NULL");
    /* The scratch channel as the out one: from scratch, not out. */
    op.out_port_channels = idx[0].data();
    refused(MACO_FUSED_GEMM_ALLREDUCE, "out_port_channels[1]");
    /* allgather + GEMM: the channel must read `a`. */
    refused(MACO_FUSED_ALLGATHER_GEMM, "this rank's a ");
    op.comm_mode = MACO_FUSED_COMM_SM;
    refused(MACO_FUSED_GEMM_ALLREDUCE, "channels is NULL");
    int ntasks = -1;
    EXPECT_EQ(maco_task_graph_get_ntasks(g, &ntasks), MACO_OK);
    EXPECT_EQ(ntasks, 0);
    ranks.clear();
    job_.Destroy();
}

} // namespace
