/*
 * test_persistent_gpu.cc - the persistent-kernel runtime on a GPU, under maco-run (1 rank, or
 * 2 ranks sharing the GPU): random DAGs of element-wise tasks against a host evaluation
 * (bitwise: the device computes in fp32 with one fused multiply-add, as the host does),
 * thousands of tiny tasks, signal/wait inside a graph, replays with new inputs, a CUDA graph
 * capture, tile exchange over memory channels between two ranks, GEMM tiles (cuBLASDx) against
 * cuBLAS, the three fused operators bit for bit against a host reference in both
 * communication modes (SM stores, and rows on the copy engines: also from a CUDA graph and
 * against the SM mode), the profile, and two waits that never get their signals, bounded,
 * reported and never hanging, each in its own ctest entry (the communicator stays failed): a
 * lonely WAIT task, and a peer that does not run a copy-engine operator (named by the others).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_case.h"
#include "maco/device/persistent.h"
#include "maco_test.h"
#include "persistent_user_kernel.h"

using maco_test::Comm;
using maco_test::NRanks;
using maco_test::Rank;

namespace
{

/* Uploads and fills through the legacy stream are not ordered before work on the tests'
 * non-blocking stream: a cudaMemcpy from pageable memory may return before its DMA has landed,
 * and cudaMemset is asynchronous. These wait for the device, so the next launch sees the data
 * (RandomDags failed once with 2 ranks and once with 4 before these: uploads unordered). */
cudaError_t UploadSync(void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

cudaError_t FillSync(void *dst, int value, size_t bytes)
{
    cudaError_t e = cudaMemset(dst, value, bytes);
    return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

class Persistent : public maco_test::GpuCase
{
  protected:
    void TearDown() override
    {
        maco_persistent_kernel_destroy(k_);
        maco_task_graph_destroy(g_);
        cudaFree(dev_);
        k_ = nullptr;
        g_ = nullptr;
        dev_ = nullptr;
        maco_test::GpuCase::TearDown();
    }

    static maco_task_t Task(maco_task_type_t type)
    {
        maco_task_t t;
        memset(&t, 0, sizeof(t));
        t.type = type;
        t.datatype = MACO_FLOAT32;
        return t;
    }
    int Add(const maco_task_t &t)
    {
        int id = -1;
        EXPECT_EQ(maco_task_graph_add_task(g_, &t, &id), MACO_OK);
        return id;
    }
    void Dep(int task, int on)
    {
        EXPECT_EQ(maco_task_graph_add_dependency(g_, task, on), MACO_OK);
    }
    void Create(const maco_persistent_config_t *cfg)
    {
        ASSERT_EQ(maco_persistent_kernel_create(Comm(), g_, cfg, &k_), MACO_OK)
            << maco_comm_get_last_error(Comm());
    }
    void LaunchAndWait()
    {
        ASSERT_EQ(maco_persistent_kernel_launch(k_, stream_), MACO_OK)
            << maco_comm_get_last_error(Comm());
        CUDA_OK(cudaStreamSynchronize(stream_));
        maco_status_t as;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &as), MACO_OK);
        ASSERT_EQ(as, MACO_OK) << maco_comm_get_last_error(Comm());
    }

    maco_task_graph_t g_ = nullptr;
    maco_persistent_kernel_t k_ = nullptr;
    void *dev_ = nullptr;
};

/* A random DAG over float32 buffers in SSA form: inputs 0..nin-1, task i writes buffer nin + i
 * from earlier buffers (so it depends on their producers), plus random extra edges. */
struct ElemDag {
    int nin = 0, nt = 0, L = 0;
    struct Op {
        maco_task_type_t type;
        int a, b, count;
        float alpha;
    };
    std::vector<Op> ops;
    std::vector<std::vector<int>> deps;

    void Make(std::mt19937_64 &rng, int nin_, int nt_, int L_)
    {
        nin = nin_;
        nt = nt_;
        L = L_;
        ops.clear();
        deps.assign(static_cast<size_t>(nt), {});
        static const maco_task_type_t types[4] = { MACO_TASK_ADD, MACO_TASK_SCALE,
                                                   MACO_TASK_RESIDUAL_ADD, MACO_TASK_COPY };
        for (int i = 0; i < nt; i++) {
            Op o;
            o.type = types[rng() % 4];
            o.a = static_cast<int>(rng() % static_cast<uint64_t>(nin + i));
            o.b = static_cast<int>(rng() % static_cast<uint64_t>(nin + i));
            o.count = 1 + static_cast<int>(rng() % static_cast<uint64_t>(L));
            o.alpha = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
            ops.push_back(o);
            auto &d = deps[static_cast<size_t>(i)];
            if (o.a >= nin)
                d.push_back(o.a - nin);
            if (o.type != MACO_TASK_SCALE && o.type != MACO_TASK_COPY && o.b >= nin)
                d.push_back(o.b - nin);
            if (i > 0 && rng() % 3 == 0)
                d.push_back(static_cast<int>(rng() % static_cast<uint64_t>(i)));
        }
    }
    /* Host evaluation of buffers (nin + nt) x L. */
    void Eval(std::vector<float> &buf) const
    {
        size_t Ls = static_cast<size_t>(L);
        for (int i = 0; i < nt; i++) {
            const Op &o = ops[static_cast<size_t>(i)];
            float *out = &buf[static_cast<size_t>(nin + i) * Ls];
            const float *a = &buf[static_cast<size_t>(o.a) * Ls];
            const float *b = &buf[static_cast<size_t>(o.b) * Ls];
            for (int j = 0; j < L; j++)
                out[j] = 0.0f;
            for (int j = 0; j < o.count; j++) {
                switch (o.type) {
                case MACO_TASK_ADD:
                    out[j] = a[j] + b[j];
                    break;
                case MACO_TASK_SCALE:
                    out[j] = o.alpha * a[j];
                    break;
                case MACO_TASK_RESIDUAL_ADD:
                    out[j] = std::fmaf(o.alpha, b[j], a[j]);
                    break;
                default:
                    out[j] = a[j];
                    break;
                }
            }
        }
    }
};

/* Adds the DAG's tasks to `g` over device buffers at `base`. */
static void AddDag(maco_task_graph_t g, const ElemDag &d, float *base)
{
    size_t Ls = static_cast<size_t>(d.L);
    for (int i = 0; i < d.nt; i++) {
        const auto &o = d.ops[static_cast<size_t>(i)];
        maco_task_t t;
        memset(&t, 0, sizeof(t));
        t.type = o.type;
        t.datatype = MACO_FLOAT32;
        t.count = o.type == MACO_TASK_COPY ? static_cast<uint64_t>(o.count) * 4 : o.count;
        t.alpha = o.alpha;
        t.out = base + static_cast<size_t>(d.nin + i) * Ls;
        t.a = base + static_cast<size_t>(o.a) * Ls;
        t.b = base + static_cast<size_t>(o.b) * Ls;
        ASSERT_EQ(maco_task_graph_add_task(g, &t, nullptr), MACO_OK);
        for (int p : d.deps[static_cast<size_t>(i)])
            ASSERT_EQ(maco_task_graph_add_dependency(g, i, p), MACO_OK);
    }
}

static void FillInputs(std::vector<float> &buf, const ElemDag &d, std::mt19937_64 &rng)
{
    std::fill(buf.begin(), buf.end(), 0.0f);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t j = 0; j < static_cast<size_t>(d.nin) * static_cast<size_t>(d.L); j++)
        buf[j] = u(rng);
}

static size_t CountMismatch(const std::vector<float> &want, const std::vector<float> &got)
{
    size_t bad = 0;
    for (size_t j = 0; j < want.size(); j++)
        bad += memcmp(&want[j], &got[j], sizeof(float)) != 0;
    return bad;
}

TEST_F(Persistent, RandomDagsMatchTheHostAndReplayWithNewInputs)
{
    struct Case {
        int nin, nt, L;
        maco_persistent_config_t cfg;
    } cases[] = {
        { 4, 60, 1001, { 0, 0, 0, 0, 0 } },      /* defaults; L odd: scalar paths */
        { 8, 500, 4096, { 4, 1, 0, 128, 0 } },   /* 4 workers, 1 scheduler */
        { 16, 2000, 256, { 1, 1, 0, 64, 0 } },   /* one worker */
        { 16, 1500, 1024, { 0, 0, 0, 512, 1 } }, /* profiling on */
        { 3, 300, 77, { 32, 8, 2, 256, 0 } },    /* comm workers that get no task */
    };
    std::mt19937_64 rng(seed_);
    for (const auto &c : cases) {
        ElemDag d;
        d.Make(rng, c.nin, c.nt, c.L);
        size_t n = static_cast<size_t>(c.nin + c.nt) * static_cast<size_t>(c.L);
        CUDA_OK(cudaMalloc(&dev_, n * sizeof(float)));
        ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
        ASSERT_NO_FATAL_FAILURE(AddDag(g_, d, static_cast<float *>(dev_)));
        ASSERT_NO_FATAL_FAILURE(Create(&c.cfg));
        maco_persistent_config_t got;
        ASSERT_EQ(maco_persistent_kernel_get_config(k_, &got), MACO_OK);
        std::vector<float> host(n), res(n);
        for (int run = 0; run < 3; run++) {
            FillInputs(host, d, rng);
            CUDA_OK(UploadSync(dev_, host.data(), n * sizeof(float)));
            ASSERT_NO_FATAL_FAILURE(LaunchAndWait());
            CUDA_OK(cudaMemcpy(res.data(), dev_, n * sizeof(float), cudaMemcpyDeviceToHost));
            d.Eval(host);
            ASSERT_EQ(CountMismatch(host, res), 0u)
                << c.nt << " tasks, L " << c.L << ", run " << run << ": " << got.workers
                << " workers, " << got.schedulers << " schedulers, " << got.comm_workers
                << " comm workers";
        }
        if (c.cfg.profile) {
            std::vector<maco_task_profile_t> prof(static_cast<size_t>(c.nt));
            ASSERT_EQ(maco_persistent_kernel_get_profile(k_, prof.data(), prof.size()), MACO_OK);
            for (const auto &r : prof) {
                ASSERT_GT(r.end_ns, 0u);
                ASSERT_GE(r.end_ns, r.start_ns);
                ASSERT_LT(r.cta, got.workers + got.comm_workers);
            }
            std::string path = "persistent_trace_rank" + std::to_string(Rank()) + ".json";
            ASSERT_EQ(maco_persistent_kernel_write_trace(k_, path.c_str()), MACO_OK);
            FILE *f = fopen(path.c_str(), "r");
            ASSERT_NE(f, nullptr);
            char head[64] = { 0 };
            ASSERT_GT(fread(head, 1, sizeof(head) - 1, f), 0u);
            fclose(f);
            remove(path.c_str());
            EXPECT_NE(std::string(head).find("traceEvents"), std::string::npos);
            ASSERT_EQ(maco_persistent_kernel_print_summary(k_, stdout), MACO_OK);
        }
        maco_persistent_kernel_destroy(k_);
        maco_task_graph_destroy(g_);
        cudaFree(dev_);
        k_ = nullptr;
        g_ = nullptr;
        dev_ = nullptr;
    }
}

TEST_F(Persistent, ThousandsOfTinyTasks)
{
    const int n = 20000, len = 64;
    size_t total = static_cast<size_t>(n) * len;
    CUDA_OK(cudaMalloc(&dev_, 2 * total * sizeof(float)));
    float *in = static_cast<float *>(dev_), *out = in + total;
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    /* out_i = (1 + i % 7) * in_i; every 100th task waits for the one before it (chains of
     * 200 through the whole graph), the rest are independent. */
    for (int i = 0; i < n; i++) {
        maco_task_t t = Task(MACO_TASK_SCALE);
        t.count = len;
        t.alpha = static_cast<float>(1 + i % 7);
        t.a = in + static_cast<size_t>(i) * len;
        t.out = out + static_cast<size_t>(i) * len;
        int id = Add(t);
        if (i >= 100 && i % 100 == 0)
            Dep(id, id - 100);
    }
    ASSERT_NO_FATAL_FAILURE(Create(nullptr));
    std::vector<float> h(total), r(total);
    std::mt19937_64 rng(seed_);
    for (int run = 0; run < 2; run++) {
        for (auto &x : h)
            x = std::uniform_real_distribution<float>(-1, 1)(rng);
        CUDA_OK(UploadSync(in, h.data(), total * sizeof(float)));
        CUDA_OK(FillSync(out, 0, total * sizeof(float)));
        ASSERT_NO_FATAL_FAILURE(LaunchAndWait());
        CUDA_OK(cudaMemcpy(r.data(), out, total * sizeof(float), cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t j = 0; j < total; j++)
            bad += r[j] != static_cast<float>(1 + (j / len) % 7) * h[j];
        ASSERT_EQ(bad, 0u) << "run " << run;
    }
}

TEST_F(Persistent, HalfAndBfloat16)
{
    const int len = 1000;
    for (maco_datatype_t dt : { MACO_FLOAT16, MACO_BFLOAT16 }) {
        CUDA_OK(cudaMalloc(&dev_, 4 * len * 2));
        char *base = static_cast<char *>(dev_);
        ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
        /* c = a + b; d = c + 0.5 * a (residual); e = -1.5 * d */
        maco_task_t t = Task(MACO_TASK_ADD);
        t.datatype = dt;
        t.count = len;
        t.a = base;
        t.b = base + len * 2;
        t.out = base + 2 * len * 2;
        int c = Add(t);
        t.type = MACO_TASK_RESIDUAL_ADD;
        t.a = base + 2 * len * 2;
        t.b = base;
        t.alpha = 0.5f;
        t.out = base + 3 * len * 2;
        int dd = Add(t);
        Dep(dd, c);
        t.type = MACO_TASK_SCALE;
        t.a = base + 3 * len * 2;
        t.alpha = -1.5f;
        t.out = base; /* in place over a: after d read it */
        int e = Add(t);
        Dep(e, dd);
        ASSERT_NO_FATAL_FAILURE(Create(nullptr));
        std::vector<uint16_t> h(4 * len), r(4 * len);
        std::mt19937_64 rng(seed_);
        auto to = [dt](float x) -> uint16_t {
            if (dt == MACO_FLOAT16) {
                __half_raw r = __float2half_rn(x);
                return r.x;
            }
            __nv_bfloat16_raw r = __float2bfloat16_rn(x);
            return r.x;
        };
        auto from = [dt](uint16_t u) -> float {
            if (dt == MACO_FLOAT16) {
                __half_raw r;
                r.x = u;
                return __half2float(__half(r));
            }
            __nv_bfloat16_raw r;
            r.x = u;
            return __bfloat162float(__nv_bfloat16(r));
        };
        for (int i = 0; i < 2 * len; i++)
            h[static_cast<size_t>(i)] = to(std::uniform_real_distribution<float>(-4, 4)(rng));
        CUDA_OK(UploadSync(dev_, h.data(), h.size() * 2));
        ASSERT_NO_FATAL_FAILURE(LaunchAndWait());
        CUDA_OK(cudaMemcpy(r.data(), dev_, r.size() * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (int i = 0; i < len; i++) {
            float a = from(h[static_cast<size_t>(i)]), b = from(h[static_cast<size_t>(len + i)]);
            uint16_t cc = to(a + b);
            uint16_t d = to(std::fmaf(0.5f, a, from(cc)));
            uint16_t ee = to(-1.5f * from(d));
            bad += r[static_cast<size_t>(2 * len + i)] != cc;
            bad += r[static_cast<size_t>(3 * len + i)] != d;
            bad += r[static_cast<size_t>(i)] != ee;
        }
        EXPECT_EQ(bad, 0u) << (dt == MACO_FLOAT16 ? "float16" : "bfloat16");
        maco_persistent_kernel_destroy(k_);
        maco_task_graph_destroy(g_);
        cudaFree(dev_);
        k_ = nullptr;
        g_ = nullptr;
        dev_ = nullptr;
    }
}

TEST_F(Persistent, SignalAndWaitInsideAGraphAcrossReplays)
{
    /* p: x = 2 * in; s: signal (after p); w: wait for the signal (a root, on the comm worker
     * while p and s run on compute workers); c: y = x (after w). y == 2 * in proves the wait
     * ordered c after p's writes. The counter grows by one per launch. */
    const int len = 4096;
    CUDA_OK(cudaMalloc(&dev_, 3 * len * sizeof(float) + 64));
    float *in = static_cast<float *>(dev_), *x = in + len, *y = x + len;
    uint64_t *ctr = reinterpret_cast<uint64_t *>(y + len);
    CUDA_OK(FillSync(ctr, 0, 8));
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    maco_task_t t = Task(MACO_TASK_SCALE);
    t.count = len;
    t.alpha = 2.0f;
    t.a = in;
    t.out = x;
    t.name = "produce";
    int p = Add(t);
    t = Task(MACO_TASK_SIGNAL);
    t.out = ctr;
    t.name = "signal";
    int s = Add(t);
    Dep(s, p);
    t = Task(MACO_TASK_WAIT);
    t.a = ctr;
    t.count = 1;
    t.name = "wait";
    int w = Add(t);
    t = Task(MACO_TASK_COPY);
    t.count = len * sizeof(float);
    t.a = x;
    t.out = y;
    t.name = "consume";
    int c = Add(t);
    Dep(c, w);
    maco_persistent_config_t cfg = { 4, 1, 1, 256, 0 };
    ASSERT_NO_FATAL_FAILURE(Create(&cfg));
    std::vector<float> h(len), r(len);
    for (int run = 0; run < 4; run++) {
        for (int i = 0; i < len; i++)
            h[static_cast<size_t>(i)] = static_cast<float>(run * 10000 + i);
        CUDA_OK(UploadSync(in, h.data(), len * sizeof(float)));
        ASSERT_NO_FATAL_FAILURE(LaunchAndWait());
        CUDA_OK(cudaMemcpy(r.data(), y, len * sizeof(float), cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (int i = 0; i < len; i++)
            bad += r[static_cast<size_t>(i)] != 2.0f * h[static_cast<size_t>(i)];
        ASSERT_EQ(bad, 0u) << "run " << run;
        uint64_t count = 0;
        CUDA_OK(cudaMemcpy(&count, ctr, 8, cudaMemcpyDeviceToHost));
        ASSERT_EQ(count, static_cast<uint64_t>(run + 1));
    }
}

TEST_F(Persistent, CapturedInACudaGraphAndReplayed)
{
    std::mt19937_64 rng(seed_);
    ElemDag d;
    d.Make(rng, 6, 400, 512);
    size_t n = static_cast<size_t>(d.nin + d.nt) * static_cast<size_t>(d.L);
    CUDA_OK(cudaMalloc(&dev_, n * sizeof(float)));
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    ASSERT_NO_FATAL_FAILURE(AddDag(g_, d, static_cast<float *>(dev_)));
    ASSERT_NO_FATAL_FAILURE(Create(nullptr));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    ASSERT_EQ(maco_persistent_kernel_launch(k_, stream_), MACO_OK);
    ASSERT_EQ(maco_persistent_kernel_launch(k_, stream_), MACO_OK); /* twice per replay */
    CUDA_OK(cudaStreamEndCapture(stream_, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<float> host(n), res(n);
    for (int replay = 0; replay < 5; replay++) {
        FillInputs(host, d, rng);
        CUDA_OK(UploadSync(dev_, host.data(), n * sizeof(float)));
        CUDA_OK(cudaGraphLaunch(exec, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
        maco_status_t as;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &as), MACO_OK);
        ASSERT_EQ(as, MACO_OK) << maco_comm_get_last_error(Comm());
        CUDA_OK(cudaMemcpy(res.data(), dev_, n * sizeof(float), cudaMemcpyDeviceToHost));
        d.Eval(host);
        ASSERT_EQ(CountMismatch(host, res), 0u) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

/* A user task type in a kernel of the test's own (maco_pk_run + get_launch): x = 3 * in
 * (built-in scale), then y = x * x + 0.5 (the user type), twice. */
TEST_F(Persistent, UserTaskTypeInAKernelOfOurOwn)
{
    const int len = 3000;
    CUDA_OK(cudaMalloc(&dev_, 3 * len * sizeof(float)));
    float *in = static_cast<float *>(dev_), *x = in + len, *y = x + len;
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    maco_task_t t = Task(MACO_TASK_SCALE);
    t.count = len;
    t.alpha = 3.0f;
    t.a = in;
    t.out = x;
    int sc = Add(t);
    t = Task(static_cast<maco_task_type_t>(TEST_TASK_SQUARE));
    t.count = len;
    t.alpha = 0.5f;
    t.a = x;
    t.out = y;
    t.name = "square";
    int sq = Add(t);
    Dep(sq, sc);
    maco_persistent_config_t cfg = { 3, 1, 0, 128, 0 };
    ASSERT_NO_FATAL_FAILURE(Create(&cfg));
    maco_pk_view_t view;
    int grid = 0, block = 0;
    ASSERT_EQ(maco_persistent_kernel_get_launch(k_, &view, sizeof(view), &grid, &block), MACO_OK);
    EXPECT_EQ(grid, 4);
    EXPECT_EQ(block, 128);
    std::vector<float> h(len), r(len);
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < len; i++)
            h[static_cast<size_t>(i)] = static_cast<float>((i + run) % 97) * 0.125f;
        CUDA_OK(UploadSync(in, h.data(), len * sizeof(float)));
        CUDA_OK(test_launch_user_persistent(&view, grid, block, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
        maco_status_t as;
        ASSERT_EQ(maco_comm_get_async_error(Comm(), &as), MACO_OK);
        ASSERT_EQ(as, MACO_OK) << maco_comm_get_last_error(Comm());
        CUDA_OK(cudaMemcpy(r.data(), y, len * sizeof(float), cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (int i = 0; i < len; i++) {
            float xv = 3.0f * h[static_cast<size_t>(i)];
            bad += r[static_cast<size_t>(i)] != std::fmaf(xv, xv, 0.5f);
        }
        ASSERT_EQ(bad, 0u) << "run " << run;
    }
}

TEST_F(Persistent, SplitOutOfRangeIsRefused)
{
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    Add(Task(MACO_TASK_NOP));
    maco_test::AllowLog("maco_persistent_kernel_create");
    maco_persistent_config_t cfg = { 100000, 1, 0, 256, 0 };
    EXPECT_EQ(maco_persistent_kernel_create(Comm(), g_, &cfg, &k_), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("cannot all be resident"), std::string::npos)
        << maco_log_last_error();
    cfg = { 2, 3, 0, 256, 0 };
    EXPECT_EQ(maco_persistent_kernel_create(Comm(), g_, &cfg, &k_), MACO_ERR_INVALID_ARGUMENT);
    cfg = { 2, 1, 0, 100, 0 };
    EXPECT_EQ(maco_persistent_kernel_create(Comm(), g_, &cfg, &k_), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(k_, nullptr);
}

/* Two ranks: each scales its tile, puts it into the peer's receive area over a memory
 * channel tile by tile (put -> signal, signals and waits chained in tile order), waits for
 * the peer's tiles and adds them: out = in * 1 + in * 2 on both ranks, bitwise equal. */
TEST_F(Persistent, TilesOverAMemoryChannelBetweenTwoRanks)
{
    if (NRanks() != 2)
        GTEST_SKIP() << "needs exactly 2 ranks (has " << NRanks() << ")";
    const int tiles = 8, tile = 8192; /* floats */
    const size_t tile_bytes = tile * sizeof(float), n = static_cast<size_t>(tiles) * tile;
    float *buf = nullptr; /* [local | received] */
    CUDA_OK(cudaMalloc(&buf, 2 * n * sizeof(float)));
    CUDA_OK(cudaMalloc(&dev_, 2 * n * sizeof(float)));
    float *in = static_cast<float *>(dev_), *out = in + n;
    maco_mem_t mine = nullptr;
    ASSERT_EQ(maco_mem_register(Comm(), buf, 2 * n * sizeof(float), &mine), MACO_OK);
    std::vector<maco_mem_t> peers;
    ASSERT_NO_FATAL_FAILURE(maco_test::ExchangeMem(Comm(), mine, &peers));
    int peer = 1 - Rank();
    maco_memory_channel_t ch = nullptr;
    ASSERT_EQ(maco_memory_channel_create(Comm(), peer, mine, peers[static_cast<size_t>(peer)], &ch),
              MACO_OK)
        << maco_comm_get_last_error(Comm());
    maco_memory_channel_device_t h;
    ASSERT_EQ(maco_memory_channel_get_device_handle(ch, &h), MACO_OK);
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    int chan = -1;
    ASSERT_EQ(maco_task_graph_add_channel(g_, &h, &chan), MACO_OK);
    int prev_sig = -1, prev_wait = -1;
    for (int i = 0; i < tiles; i++) {
        size_t off = static_cast<size_t>(i) * tile;
        maco_task_t t = Task(MACO_TASK_SCALE);
        t.count = tile;
        t.alpha = static_cast<float>(Rank() + 1);
        t.a = in + off;
        t.out = buf + off;
        t.name = "scale";
        int sc = Add(t);
        t = Task(MACO_TASK_CHANNEL_PUT);
        t.channel = static_cast<uint32_t>(chan);
        t.count = tile_bytes;
        t.src_offset = off * sizeof(float);
        t.dst_offset = (n + off) * sizeof(float);
        t.name = "put";
        int put = Add(t);
        Dep(put, sc);
        t = Task(MACO_TASK_CHANNEL_SIGNAL);
        t.channel = static_cast<uint32_t>(chan);
        t.name = "signal";
        int sig = Add(t);
        Dep(sig, put);
        if (prev_sig >= 0)
            Dep(sig, prev_sig);
        prev_sig = sig;
        t = Task(MACO_TASK_CHANNEL_WAIT);
        t.channel = static_cast<uint32_t>(chan);
        t.name = "wait";
        int w = Add(t);
        if (prev_wait >= 0)
            Dep(w, prev_wait);
        prev_wait = w;
        t = Task(MACO_TASK_ADD);
        t.count = tile;
        t.a = buf + off;
        t.b = buf + n + off;
        t.out = out + off;
        t.name = "add";
        int ad = Add(t);
        Dep(ad, sc);
        Dep(ad, w);
    }
    maco_persistent_config_t cfg = { 0, 0, 0, 256, 1 }; /* defaults: waits on comm workers */
    ASSERT_NO_FATAL_FAILURE(Create(&cfg));
    maco_persistent_config_t got;
    ASSERT_EQ(maco_persistent_kernel_get_config(k_, &got), MACO_OK);
    ASSERT_GE(got.comm_workers, 1);
    std::vector<float> hin(n), r(n);
    for (int run = 0; run < 3; run++) {
        for (size_t i = 0; i < n; i++)
            hin[i] = static_cast<float>((i * 7 + static_cast<size_t>(run)) % 1000) * 0.25f;
        CUDA_OK(UploadSync(in, hin.data(), n * sizeof(float)));
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_EQ(maco_bootstrap_barrier(maco_test::Bootstrap()), MACO_OK);
        ASSERT_NO_FATAL_FAILURE(LaunchAndWait());
        ASSERT_EQ(maco_bootstrap_barrier(maco_test::Bootstrap()), MACO_OK);
        CUDA_OK(cudaMemcpy(r.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += r[i] != hin[i] * 1.0f + hin[i] * 2.0f;
        ASSERT_EQ(bad, 0u) << "run " << run;
    }
    if (Rank() == 0) {
        ASSERT_EQ(maco_persistent_kernel_print_summary(k_, stdout), MACO_OK);
    }
    maco_persistent_kernel_destroy(k_);
    k_ = nullptr;
    maco_memory_channel_destroy(ch);
    for (auto p : peers)
        if (p != nullptr)
            maco_mem_deregister(p);
    maco_mem_deregister(mine);
    cudaFree(buf);
}

/* Random bf16 in [-1, 1) as raw bits, and their float values. */
static void RandomBf16(std::mt19937_64 &rng, size_t n, std::vector<__nv_bfloat16> *bits,
                       std::vector<float> *vals)
{
    bits->resize(n);
    vals->resize(n);
    for (size_t i = 0; i < n; i++) {
        __nv_bfloat16 b = __float2bfloat16_rn(std::uniform_real_distribution<float>(-1, 1)(rng));
        (*bits)[i] = b;
        (*vals)[i] = __bfloat162float(b);
    }
}

/* cuBLAS row-major C (fp32) = A (m x k) B (k x n), bf16 in, fp32 compute. */
static cublasStatus_t CublasGemm(cublasHandle_t h, int m, int n, int k, const void *A,
                                 const void *B, float *C)
{
    float one = 1.0f, zero = 0.0f;
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, B, CUDA_R_16BF, n, A,
                        CUDA_R_16BF, k, &zero, C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
}

/* |got - want| within fp32 accumulation of k products: 2^-20 x sum |a||b| (row i, column j). */
static size_t CountOutsideFp32Bound(const std::vector<float> &got, const std::vector<float> &want,
                                    const std::vector<float> &a, const std::vector<float> &b, int m,
                                    int n, int k, double scale)
{
    size_t bad = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double mag = 0;
            for (int q = 0; q < k; q++)
                mag += std::fabs(a[static_cast<size_t>(i) * k + q] *
                                 b[static_cast<size_t>(q) * n + j]);
            size_t x = static_cast<size_t>(i) * n + j;
            if (std::fabs(static_cast<double>(got[x]) - want[x]) > scale * mag * 0x1p-20 + 1e-30)
                bad++;
        }
    return bad;
}

TEST_F(Persistent, GemmTilesMatchCublas)
{
    /* k = 544 = 17 x 32: whole steps of 64 (the GMMA tiles) and a half step zero-filled. Both
     * tile widths, mixed: a row of the fp32 C in wide tiles, the next in narrow ones (tile_n 0,
     * the default), and the bf16 C the other way round, so each worker meets both widths one
     * after the other (the GMMA kernel's pipeline changes its stage layout between them). */
    const int m = 384, n = 256, k = 544, tm = m / MACO_GEMM_TILE_M;
    std::mt19937_64 rng(seed_);
    std::vector<__nv_bfloat16> ha, hb;
    std::vector<float> fa, fb;
    RandomBf16(rng, static_cast<size_t>(m) * k, &ha, &fa);
    RandomBf16(rng, static_cast<size_t>(k) * n, &hb, &fb);
    size_t mn = static_cast<size_t>(m) * n;
    char *base;
    CUDA_OK(cudaMalloc(&dev_, (ha.size() + hb.size()) * 2 + 3 * mn * 4));
    base = static_cast<char *>(dev_);
    __nv_bfloat16 *A = reinterpret_cast<__nv_bfloat16 *>(base);
    __nv_bfloat16 *B = A + ha.size();
    float *C = reinterpret_cast<float *>(B + hb.size()), *Cref = C + mn;
    __nv_bfloat16 *C16 = reinterpret_cast<__nv_bfloat16 *>(Cref + mn);
    CUDA_OK(UploadSync(A, ha.data(), ha.size() * 2));
    CUDA_OK(UploadSync(B, hb.data(), hb.size() * 2));
    CUDA_OK(FillSync(C, 0xff, mn * 4)); /* NaN: every element must be written */
    CUDA_OK(FillSync(C16, 0xff, mn * 2));
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    for (int r = 0; r < tm; r++)
        for (int half = 0; half < 2; half++) { /* fp32 row-major, and bf16 row-major */
            const bool wide = (r + half) % 2 == 0;
            const int width = wide ? MACO_GEMM_TILE_N_WIDE : MACO_GEMM_TILE_N;
            for (int c = 0; c < n / width; c++) {
                maco_task_t t = Task(MACO_TASK_GEMM_TILE);
                t.datatype = half ? MACO_BFLOAT16 : MACO_FLOAT32;
                t.a = A;
                t.b = B;
                size_t off =
                    static_cast<size_t>(r) * MACO_GEMM_TILE_M * n + static_cast<size_t>(c) * width;
                t.out = half ? static_cast<void *>(C16 + off) : static_cast<void *>(C + off);
                t.m = m;
                t.n = n;
                t.k = k;
                t.ldc = n;
                t.tile_row = static_cast<uint32_t>(r);
                t.tile_col = static_cast<uint32_t>(c);
                t.tile_n = wide ? MACO_GEMM_TILE_N_WIDE : (r % 2 == 0 ? MACO_GEMM_TILE_N : 0);
                t.name = half ? "gemm bf16" : "gemm fp32";
                Add(t);
            }
        }
    maco_persistent_config_t cfg = { 4, 1, 0, 0, 0 };
    maco_status_t st = maco_persistent_kernel_create(Comm(), g_, &cfg, &k_);
    if (st == MACO_ERR_UNSUPPORTED)
        GTEST_SKIP() << maco_log_last_error();
    ASSERT_EQ(st, MACO_OK) << maco_log_last_error();
    ASSERT_NO_FATAL_FAILURE(LaunchAndWait());
    ASSERT_NO_FATAL_FAILURE(LaunchAndWait()); /* a replay gives the same */
    cublasHandle_t h;
    ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(CublasGemm(h, m, n, k, A, B, Cref), CUBLAS_STATUS_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    cublasDestroy(h);
    std::vector<float> got(mn), want(mn), got16(mn);
    std::vector<__nv_bfloat16> g16(mn);
    CUDA_OK(cudaMemcpy(got.data(), C, mn * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(want.data(), Cref, mn * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(g16.data(), C16, mn * 2, cudaMemcpyDeviceToHost));
    EXPECT_EQ(CountOutsideFp32Bound(got, want, fa, fb, m, n, k, 4.0), 0u);
    size_t bad16 = 0;
    for (size_t i = 0; i < mn; i++) /* bf16 output: the fp32 tile rounded once */
        bad16 += __bfloat162float(g16[i]) != __bfloat162float(__float2bfloat16_rn(got[i]));
    EXPECT_EQ(bad16, 0u);
}

/* A registered scratch buffer and a memory channel over it to every peer, made once per
 * process and kept until the tests end: the collectives' registry keeps its mappings of peers'
 * registrations for the communicator's life (algorithms/common/registry.c), so a scratch freed and
 * allocated again could meet a stale mapping of the old one (cudaErrorAlreadyMapped on the
 * 2-rank H100 run of 2026-11-24). */
struct FusedSetup {
    static constexpr size_t kBytes = 16u << 20;
    /* [0] the scratch, [1] the output (GEMM + allreduce writes peers' outputs). */
    void *buf[2] = { nullptr, nullptr };
    maco_mem_t mine[2] = { nullptr, nullptr };
    std::vector<maco_mem_t> peers[2];
    std::vector<maco_memory_channel_t> chans[2];
    std::vector<maco_memory_channel_device_t> handles[2];
    std::vector<int> index[2]; /* the graph's channel index per rank */

    /* Fatal failures: call inside ASSERT_NO_FATAL_FAILURE. */
    void Create()
    {
        for (int b = 0; b < 2; b++) {
            CUDA_OK(cudaMalloc(&buf[b], kBytes));
            CUDA_OK(FillSync(buf[b], 0, kBytes));
            ASSERT_EQ(maco_mem_register(Comm(), buf[b], kBytes, &mine[b]), MACO_OK);
            ASSERT_NO_FATAL_FAILURE(maco_test::ExchangeMem(Comm(), mine[b], &peers[b]));
            chans[b].assign(static_cast<size_t>(NRanks()), nullptr);
            handles[b].resize(static_cast<size_t>(NRanks()));
            for (int q = 0; q < NRanks(); q++) {
                if (q == Rank())
                    continue;
                size_t i = static_cast<size_t>(q);
                ASSERT_EQ(maco_memory_channel_create(Comm(), q, mine[b], peers[b][i], &chans[b][i]),
                          MACO_OK);
                ASSERT_EQ(maco_memory_channel_get_device_handle(chans[b][i], &handles[b][i]),
                          MACO_OK);
            }
        }
    }
    /* Zeroes the scratch (the operators' counters start at zero with each kernel object) on
     * every rank, then adds both channel sets to `g`; index[] gets their indices there. */
    void AddTo(maco_task_graph_t g, size_t bytes)
    {
        ASSERT_LE(bytes, kBytes);
        CUDA_OK(FillSync(buf[0], 0, kBytes));
        ASSERT_EQ(maco_bootstrap_barrier(maco_test::Bootstrap()), MACO_OK);
        for (int b = 0; b < 2; b++) {
            index[b].assign(static_cast<size_t>(NRanks()), -1);
            for (int q = 0; q < NRanks(); q++) {
                if (q != Rank()) {
                    ASSERT_EQ(maco_task_graph_add_channel(g, &handles[b][static_cast<size_t>(q)],
                                                          &index[b][static_cast<size_t>(q)]),
                              MACO_OK);
                }
            }
        }
    }
    ~FusedSetup()
    {
        for (int b = 0; b < 2; b++) {
            for (auto c : chans[b])
                maco_memory_channel_destroy(c);
            for (auto p : peers[b])
                if (p != nullptr)
                    maco_mem_deregister(p);
            maco_mem_deregister(mine[b]);
            cudaFree(buf[b]);
        }
    }
};

FusedSetup *g_fused = nullptr;

/* Frees the shared setup after the last test, before MultiProcessMain destroys the
 * communicator. */
class FusedEnvironment : public ::testing::Environment
{
  public:
    void TearDown() override
    {
        delete g_fused;
        g_fused = nullptr;
    }
};
::testing::Environment *const g_fused_env =
    ::testing::AddGlobalTestEnvironment(new FusedEnvironment);

/* The shared setup, made by the first test that asks (collective: every rank runs the same
 * tests in the same order). */
static void Fused(FusedSetup **fs_p)
{
    if (g_fused == nullptr) {
        g_fused = new FusedSetup;
        ASSERT_NO_FATAL_FAILURE(g_fused->Create());
    }
    *fs_p = g_fused;
}

/* The copy-engine mode's buffers (maco_fused_comm_t): [0] the scratch, [1] the output, [2] A of
 * allgather + GEMM (its port channels read it), registered and exchanged once per process as
 * FusedSetup's. Each kernel object gets port channels of its own (maco_test::PortChannels:
 * a proxy and fresh semaphores, which the gates count from zero). */
struct CeSetup {
    static constexpr size_t kBytes = 16u << 20;
    void *buf[3] = { nullptr, nullptr, nullptr };
    maco_mem_t mine[3] = { nullptr, nullptr, nullptr };
    std::vector<maco_mem_t> peers[3];

    void Create()
    {
        for (int b = 0; b < 3; b++) {
            CUDA_OK(cudaMalloc(&buf[b], kBytes));
            CUDA_OK(FillSync(buf[b], 0, kBytes));
            ASSERT_EQ(maco_mem_register(Comm(), buf[b], kBytes, &mine[b]), MACO_OK);
            ASSERT_NO_FATAL_FAILURE(maco_test::ExchangeMem(Comm(), mine[b], &peers[b]));
        }
    }
    ~CeSetup()
    {
        for (int b = 0; b < 3; b++) {
            for (auto p : peers[b])
                if (p != nullptr)
                    maco_mem_deregister(p);
            maco_mem_deregister(mine[b]);
            cudaFree(buf[b]);
        }
    }
};

CeSetup *g_ce = nullptr;

class CeEnvironment : public ::testing::Environment
{
  public:
    void TearDown() override
    {
        delete g_ce;
        g_ce = nullptr;
    }
};
::testing::Environment *const g_ce_env = ::testing::AddGlobalTestEnvironment(new CeEnvironment);

static void Ce(CeSetup **cs_p)
{
    if (g_ce == nullptr) {
        g_ce = new CeSetup;
        ASSERT_NO_FATAL_FAILURE(g_ce->Create());
    }
    *cs_p = g_ce;
}

/* Small integers in [-2, 2] as bf16, the same on every rank for (seed, rank, what). */
static std::vector<__nv_bfloat16> SmallInts(uint64_t seed, int rank, int what, size_t n)
{
    std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(rank) * 7919u +
                        static_cast<uint64_t>(what));
    std::vector<__nv_bfloat16> v(n);
    for (auto &x : v)
        x = __float2bfloat16_rn(static_cast<float>(static_cast<int>(rng() % 5) - 2));
    return v;
}

/* A (m x k) x B (k x n) on the host, exact for small integers. */
static std::vector<float> HostGemm(const std::vector<__nv_bfloat16> &a,
                                   const std::vector<__nv_bfloat16> &b, int m, int n, int k)
{
    std::vector<float> c(static_cast<size_t>(m) * n, 0.0f);
    for (int i = 0; i < m; i++)
        for (int q = 0; q < k; q++) {
            float x = __bfloat162float(a[static_cast<size_t>(i) * k + q]);
            if (x == 0.0f)
                continue;
            for (int j = 0; j < n; j++)
                c[static_cast<size_t>(i) * n + j] +=
                    x * __bfloat162float(b[static_cast<size_t>(q) * n + j]);
        }
    return c;
}

/*
 * The three fused operators against a host reference, bit for bit: inputs are small integers,
 * so products and sums are exact and the only rounding is the output type's (the reference
 * rounds each rank's product to it, then the sum, as the operators do). Outputs are poisoned
 * (NaN) before each of three launches back to back (the ready handshake and the launch count
 * of the counters between them); m = 200 or a shard of 96 rows makes a partial last row of
 * tiles; both output types. The copy-engine mode (maco_fused_comm_t) the same way, over port
 * channels of its own (CUDA copy between ranks on one node), also replayed from a CUDA graph,
 * and bitwise against the SM mode; a rank that does not run it is named by its peers.
 */
class FusedOperators : public Persistent
{
  protected:
    struct Opts {
        int mode = MACO_FUSED_COMM_SM;     /* maco_fused_comm_t */
        bool cuda_graph = false;           /* the launches as replays of one captured launch */
        std::vector<char> *last = nullptr; /* the last launch's output, where not NULL */
        int dead = -1; /* one launch, then this rank does not launch the second: the others
                          must report it (the communicator stays failed) */
    };

    void Check(maco_fused_op_t kind, int m, int n, int k, maco_datatype_t type)
    {
        Check(kind, m, n, k, type, Opts());
    }

    void Check(maco_fused_op_t kind, int m, int n, int k, maco_datatype_t type, const Opts &o)
    {
        SCOPED_TRACE("kind " + std::to_string(kind) + " m " + std::to_string(m) + " n " +
                     std::to_string(n) + " k " + std::to_string(k) + " type " +
                     std::to_string(type) + " mode " + std::to_string(o.mode) +
                     (o.cuda_graph ? " (CUDA graph)" : ""));
        const int nr = NRanks();
        const bool ce = o.mode == MACO_FUSED_COMM_COPY_ENGINE;
        uint64_t seed = seed_;
        ASSERT_EQ(maco_bootstrap_broadcast(maco_test::Bootstrap(), 0, &seed, 8), MACO_OK);
        const size_t esz = type == MACO_FLOAT32 ? 4 : 2;
        const int out_rows = kind == MACO_FUSED_ALLGATHER_GEMM        ? m * nr
                             : kind == MACO_FUSED_GEMM_REDUCE_SCATTER ? m / nr
                                                                      : m;
        const size_t out_n = static_cast<size_t>(out_rows) * n;
        std::vector<std::vector<__nv_bfloat16>> as, bs;
        for (int q = 0; q < nr; q++) {
            as.push_back(SmallInts(seed, q, 1, static_cast<size_t>(m) * k));
            bs.push_back(SmallInts(seed, q, 2, static_cast<size_t>(k) * n));
        }
        const auto &ha = as[static_cast<size_t>(Rank())], &hb = bs[static_cast<size_t>(Rank())];
        CUDA_OK(cudaMalloc(&dev_, (ha.size() + hb.size()) * 2));
        __nv_bfloat16 *A = static_cast<__nv_bfloat16 *>(dev_), *B = A + ha.size();
        CUDA_OK(UploadSync(A, ha.data(), ha.size() * 2));
        CUDA_OK(UploadSync(B, hb.data(), hb.size() * 2));
        size_t need = 0;
        ASSERT_EQ(maco_fused_gemm_scratch_bytes_mode(kind, o.mode, nr, static_cast<uint32_t>(m),
                                                     static_cast<uint32_t>(n),
                                                     static_cast<uint32_t>(k), type, &need),
                  MACO_OK);
        ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
        maco_fused_gemm_t op;
        memset(&op, 0, sizeof(op));
        op.comm = Comm();
        op.comm_mode = o.mode;
        /* The copy-engine mode: its buffers and port channels (scratch to the peers' scratch,
         * or A to it for allgather + GEMM; out to the peers' out for GEMM + allreduce). */
        maco_test::PortChannels ports, out_ports;
        std::vector<int> port_idx(static_cast<size_t>(nr), -1), out_idx(port_idx);
        if (ce) {
            CeSetup *cs = nullptr;
            ASSERT_NO_FATAL_FAILURE(Ce(&cs));
            ASSERT_LE(need, CeSetup::kBytes);
            ASSERT_LE(out_n * esz, CeSetup::kBytes);
            ASSERT_LE(ha.size() * 2, CeSetup::kBytes);
            CUDA_OK(FillSync(cs->buf[0], 0, CeSetup::kBytes));
            CUDA_OK(UploadSync(cs->buf[2], ha.data(), ha.size() * 2));
            ASSERT_EQ(maco_bootstrap_barrier(maco_test::Bootstrap()), MACO_OK);
            const int src = kind == MACO_FUSED_ALLGATHER_GEMM ? 2 : 0;
            ASSERT_NO_FATAL_FAILURE(
                ports.Create(Comm(), MACO_TRANSPORT_AUTO, cs->mine[src], cs->peers[0]));
            if (kind == MACO_FUSED_GEMM_ALLREDUCE) {
                ASSERT_NO_FATAL_FAILURE(
                    out_ports.Create(Comm(), MACO_TRANSPORT_AUTO, cs->mine[1], cs->peers[1]));
            }
            for (int q = 0; q < nr; q++) {
                const size_t i = static_cast<size_t>(q);
                if (q == Rank())
                    continue;
                ASSERT_EQ(maco_task_graph_add_port_channel(g_, ports.chans[i], &port_idx[i]),
                          MACO_OK)
                    << maco_log_last_error();
                if (kind == MACO_FUSED_GEMM_ALLREDUCE) {
                    ASSERT_EQ(maco_task_graph_add_port_channel(g_, out_ports.chans[i], &out_idx[i]),
                              MACO_OK)
                        << maco_log_last_error();
                }
            }
            op.port_channels = port_idx.data();
            op.out_port_channels = kind == MACO_FUSED_GEMM_ALLREDUCE ? out_idx.data() : nullptr;
            op.a = kind == MACO_FUSED_ALLGATHER_GEMM ? cs->buf[2] : A;
            op.out = cs->buf[1];
            op.scratch = cs->buf[0];
        } else {
            FusedSetup *fs = nullptr;
            ASSERT_NO_FATAL_FAILURE(Fused(&fs));
            ASSERT_LE(out_n * esz, FusedSetup::kBytes);
            ASSERT_NO_FATAL_FAILURE(fs->AddTo(g_, need));
            op.channels = fs->index[0].data();
            op.out_channels = fs->index[1].data();
            op.a = A;
            op.out = fs->buf[1];
            op.scratch = fs->buf[0];
        }
        op.b = B;
        op.m = static_cast<uint32_t>(m);
        op.n = static_cast<uint32_t>(n);
        op.k = static_cast<uint32_t>(k);
        op.out_type = type;
        op.name = "fused";
        int last = -1;
        maco_status_t st = kind == MACO_FUSED_GEMM_ALLREDUCE
                               ? maco_task_graph_add_gemm_allreduce(g_, &op, &last)
                           : kind == MACO_FUSED_GEMM_REDUCE_SCATTER
                               ? maco_task_graph_add_gemm_reduce_scatter(g_, &op, &last)
                               : maco_task_graph_add_allgather_gemm(g_, &op, &last);
        ASSERT_EQ(st, MACO_OK) << maco_log_last_error();
        maco_persistent_config_t cfg;
        memset(&cfg, 0, sizeof(cfg));
        cfg.profile = 1;
        st = maco_persistent_kernel_create(Comm(), g_, &cfg, &k_);
        if (st == MACO_ERR_UNSUPPORTED)
            GTEST_SKIP() << maco_log_last_error();
        ASSERT_EQ(st, MACO_OK) << maco_log_last_error();
        /* The reference. */
        std::vector<float> want;
        if (kind == MACO_FUSED_ALLGATHER_GEMM) {
            for (int q = 0; q < nr; q++) {
                std::vector<float> p = HostGemm(as[static_cast<size_t>(q)], hb, m, n, k);
                want.insert(want.end(), p.begin(), p.end());
            }
        } else {
            std::vector<float> sum(static_cast<size_t>(m) * n, 0.0f);
            for (int q = 0; q < nr; q++) {
                std::vector<float> p =
                    HostGemm(as[static_cast<size_t>(q)], bs[static_cast<size_t>(q)], m, n, k);
                for (size_t i = 0; i < sum.size(); i++)
                    sum[i] +=
                        type == MACO_FLOAT32 ? p[i] : __bfloat162float(__float2bfloat16_rn(p[i]));
            }
            size_t first =
                kind == MACO_FUSED_GEMM_REDUCE_SCATTER ? static_cast<size_t>(Rank()) * out_n : 0;
            want.assign(sum.begin() + static_cast<ptrdiff_t>(first),
                        sum.begin() + static_cast<ptrdiff_t>(first + out_n));
        }
        for (auto &x : want)
            x = type == MACO_FLOAT32 ? x : __bfloat162float(__float2bfloat16_rn(x));
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        if (o.cuda_graph) {
            CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
            ASSERT_EQ(maco_persistent_kernel_launch(k_, stream_), MACO_OK)
                << maco_comm_get_last_error(Comm());
            CUDA_OK(cudaStreamEndCapture(stream_, &graph));
            CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        }
        ASSERT_EQ(maco_bootstrap_barrier(maco_test::Bootstrap()), MACO_OK);
        std::vector<char> got(out_n * esz);
        const int runs = o.dead >= 0 ? 2 : 3;
        for (int run = 0; run < runs; run++) {
            CUDA_OK(FillSync(op.out, 0xff, out_n * esz)); /* NaN */
            /* No peer may write this rank's out before it is poisoned: a barrier. */
            ASSERT_EQ(maco_bootstrap_barrier(maco_test::Bootstrap()), MACO_OK);
            if (o.dead >= 0 && run == 1) {
                ASSERT_NO_FATAL_FAILURE(ExpectDeadPeerNamed(o.dead));
                break;
            }
            if (o.cuda_graph) {
                CUDA_OK(cudaGraphLaunch(exec, stream_));
                CUDA_OK(cudaStreamSynchronize(stream_));
                maco_status_t as;
                ASSERT_EQ(maco_comm_get_async_error(Comm(), &as), MACO_OK);
                ASSERT_EQ(as, MACO_OK) << maco_comm_get_last_error(Comm());
            } else {
                ASSERT_NO_FATAL_FAILURE(LaunchAndWait());
            }
            CUDA_OK(cudaMemcpy(got.data(), op.out, out_n * esz, cudaMemcpyDeviceToHost));
            size_t bad = 0, first_bad = 0;
            for (size_t i = 0; i < out_n; i++) {
                float x;
                if (type == MACO_FLOAT32) {
                    memcpy(&x, &got[i * 4], 4);
                } else {
                    __nv_bfloat16 h;
                    memcpy(&h, &got[i * 2], 2);
                    x = __bfloat162float(h);
                }
                if (!(x == want[i]) && bad++ == 0)
                    first_bad = i;
            }
            EXPECT_EQ(bad, 0u) << "launch " << run << ": first wrong element " << first_bad
                               << " of " << out_n;
            /* Every rank's launch ended: nothing is in flight to any rank (a rank's launch of
             * GEMM + reduce-scatter may end before its puts land; their owner's does not). */
            ASSERT_EQ(maco_bootstrap_barrier(maco_test::Bootstrap()), MACO_OK);
        }
        if (o.last != nullptr)
            *o.last = got;
        if (exec != nullptr)
            cudaGraphExecDestroy(exec);
        if (graph != nullptr)
            cudaGraphDestroy(graph);
        if (Rank() == 0 && o.dead < 0) {
            ASSERT_EQ(maco_persistent_kernel_print_summary(k_, stdout), MACO_OK);
            const char *dir = getenv("TEST_PERSIST_TRACE_DIR");
            if (dir != nullptr && dir[0] != '\0' && m == 200) {
                std::string path = std::string(dir) + "/trace_fused_" + std::to_string(kind) + "_" +
                                   std::to_string(nr) + "ranks" + (ce ? "_ce" : "") + ".json";
                ASSERT_EQ(maco_persistent_kernel_write_trace(k_, path.c_str()), MACO_OK);
            }
        }
        maco_persistent_kernel_destroy(k_);
        k_ = nullptr;
        maco_task_graph_destroy(g_);
        g_ = nullptr;
        cudaFree(dev_);
        dev_ = nullptr;
        /* The port channels (ports, out_ports) go last: the kernel object used them. */
    }

    /* Launch 1 on every rank but `dead`: each of the others must stop with MACO_ERR_TIMEOUT
     * naming rank `dead` at a gate, within its device timeout (and never hang). */
    void ExpectDeadPeerNamed(int dead)
    {
        if (Rank() == dead) {
            printf("rank %d: not launching (the dead peer)\n", Rank());
        } else {
            auto t0 = std::chrono::steady_clock::now();
            ASSERT_EQ(maco_persistent_kernel_launch(k_, stream_), MACO_OK);
            CUDA_OK(cudaStreamSynchronize(stream_)); /* returns: the kernel left */
            double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            maco_status_t as;
            ASSERT_EQ(maco_comm_get_async_error(Comm(), &as), MACO_OK);
            EXPECT_EQ(as, MACO_ERR_TIMEOUT);
            std::string msg = maco_comm_get_last_error(Comm());
            const std::string named = "for rank " + std::to_string(dead) + " at its gate";
            EXPECT_NE(msg.find(named), std::string::npos) << msg;
            printf("rank %d: reported after %.2f s: %s\n", Rank(), secs, msg.c_str());
            EXPECT_LT(secs, 60.0); /* a hang detector, not a timing: MACO_DEVICE_TIMEOUT=3s */
        }
        /* The others are done with it (their communicators stay failed). */
        (void)maco_bootstrap_barrier(maco_test::Bootstrap());
    }

    /* The copy-engine mode of `kind` bit for bit against the reference, in a CUDA graph too,
     * and against the SM mode's output. */
    void CheckCe(maco_fused_op_t kind, int m, int n, int k, maco_datatype_t type)
    {
        std::vector<char> sm, ce, ce_graph;
        Opts o;
        o.last = &sm;
        ASSERT_NO_FATAL_FAILURE(Check(kind, m, n, k, type, o));
        o.mode = MACO_FUSED_COMM_COPY_ENGINE;
        o.last = &ce;
        ASSERT_NO_FATAL_FAILURE(Check(kind, m, n, k, type, o));
        o.cuda_graph = true;
        o.last = &ce_graph;
        ASSERT_NO_FATAL_FAILURE(Check(kind, m, n, k, type, o));
        EXPECT_TRUE(ce == sm) << "the copy-engine mode's output differs from the SM mode's";
        EXPECT_TRUE(ce_graph == sm) << "replayed from a CUDA graph, the output differs";
    }

    /* The dead-peer case of `kind` (its own ctest entry, 2 ranks or more). */
    void DeadPeer(maco_fused_op_t kind)
    {
        if (NRanks() < 2)
            GTEST_SKIP() << "needs 2 ranks or more (has " << NRanks() << ")";
        Opts o;
        o.mode = MACO_FUSED_COMM_COPY_ENGINE;
        o.dead = NRanks() - 1;
        const int m = kind == MACO_FUSED_GEMM_REDUCE_SCATTER ? 256 * NRanks() : 768;
        ASSERT_NO_FATAL_FAILURE(Check(kind, m, 256, 64, MACO_FLOAT32, o));
    }
};

TEST_F(FusedOperators, GemmAllreduce)
{
    ASSERT_NO_FATAL_FAILURE(Check(MACO_FUSED_GEMM_ALLREDUCE, 200, 512, 1024, MACO_FLOAT32));
    ASSERT_NO_FATAL_FAILURE(Check(MACO_FUSED_GEMM_ALLREDUCE, 256, 384, 64, MACO_BFLOAT16));
}

TEST_F(FusedOperators, GemmReduceScatter)
{
    const int m = 96 * NRanks();
    ASSERT_NO_FATAL_FAILURE(Check(MACO_FUSED_GEMM_REDUCE_SCATTER, m, 512, 64, MACO_BFLOAT16));
    ASSERT_NO_FATAL_FAILURE(
        Check(MACO_FUSED_GEMM_REDUCE_SCATTER, 256 * NRanks(), 256, 512, MACO_FLOAT32));
}

TEST_F(FusedOperators, AllgatherGemm)
{
    ASSERT_NO_FATAL_FAILURE(Check(MACO_FUSED_ALLGATHER_GEMM, 96, 384, 512, MACO_FLOAT32));
    ASSERT_NO_FATAL_FAILURE(Check(MACO_FUSED_ALLGATHER_GEMM, 256, 256, 64, MACO_BFLOAT16));
}

/* The copy-engine mode (maco_fused_comm_t): rows of 128 with a partial last one, 2 rows per
 * owner at 3 ranks, and bf16 and fp32 outputs. */
TEST_F(FusedOperators, CopyEngineGemmAllreduce)
{
    ASSERT_NO_FATAL_FAILURE(CheckCe(MACO_FUSED_GEMM_ALLREDUCE, 300, 512, 256, MACO_FLOAT32));
    ASSERT_NO_FATAL_FAILURE(CheckCe(MACO_FUSED_GEMM_ALLREDUCE, 768, 256, 64, MACO_BFLOAT16));
}

TEST_F(FusedOperators, CopyEngineGemmReduceScatter)
{
    ASSERT_NO_FATAL_FAILURE(
        CheckCe(MACO_FUSED_GEMM_REDUCE_SCATTER, 96 * NRanks(), 512, 64, MACO_BFLOAT16));
    ASSERT_NO_FATAL_FAILURE(
        CheckCe(MACO_FUSED_GEMM_REDUCE_SCATTER, 300 * NRanks(), 256, 512, MACO_FLOAT32));
}

TEST_F(FusedOperators, CopyEngineAllgatherGemm)
{
    ASSERT_NO_FATAL_FAILURE(CheckCe(MACO_FUSED_ALLGATHER_GEMM, 300, 384, 512, MACO_FLOAT32));
    ASSERT_NO_FATAL_FAILURE(CheckCe(MACO_FUSED_ALLGATHER_GEMM, 256, 256, 64, MACO_BFLOAT16));
}

/* A rank that does not run the operator: each in its own ctest entry (MACO_DEVICE_TIMEOUT=3s,
 * 3 ranks): the communicators stay failed afterwards. */
TEST_F(FusedOperators, DeadPeerDuringCopyEngineGemmAllreduce)
{
    DeadPeer(MACO_FUSED_GEMM_ALLREDUCE);
}

TEST_F(FusedOperators, DeadPeerDuringCopyEngineGemmReduceScatter)
{
    DeadPeer(MACO_FUSED_GEMM_REDUCE_SCATTER);
}

TEST_F(FusedOperators, DeadPeerDuringCopyEngineAllgatherGemm)
{
    DeadPeer(MACO_FUSED_ALLGATHER_GEMM);
}

/* Last, and in its own ctest entry (with a short MACO_DEVICE_TIMEOUT): the communicator stays
 * failed afterwards. */
TEST_F(Persistent, WaitThatNeverGetsItsSignalIsBoundedAndReported)
{
    CUDA_OK(cudaMalloc(&dev_, 64));
    CUDA_OK(FillSync(dev_, 0, 64));
    ASSERT_EQ(maco_task_graph_create(&g_), MACO_OK);
    maco_task_t t = Task(MACO_TASK_NOP);
    t.name = "before";
    int a = Add(t);
    t = Task(MACO_TASK_WAIT);
    t.a = dev_; /* nobody signals it */
    t.count = 1;
    t.name = "lonely wait";
    int w = Add(t);
    Dep(w, a);
    t = Task(MACO_TASK_NOP);
    t.name = "after";
    int b = Add(t);
    Dep(b, w);
    ASSERT_NO_FATAL_FAILURE(Create(nullptr));
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(maco_persistent_kernel_launch(k_, stream_), MACO_OK);
    CUDA_OK(cudaStreamSynchronize(stream_)); /* returns: the kernel left */
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    maco_status_t as;
    ASSERT_EQ(maco_comm_get_async_error(Comm(), &as), MACO_OK);
    EXPECT_EQ(as, MACO_ERR_TIMEOUT);
    std::string msg = maco_comm_get_last_error(Comm());
    EXPECT_NE(msg.find("task 1 (wait)"), std::string::npos) << msg;
    printf("reported after %.2f s: %s\n", secs, msg.c_str());
    EXPECT_LT(secs, 30.0);
    maco_test::AllowLog("has failed");
    EXPECT_EQ(maco_persistent_kernel_launch(k_, stream_), MACO_ERR_INVALID_USAGE);
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, true, true);
}
