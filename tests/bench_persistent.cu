/*
 * bench_persistent.cu - numbers of the persistent-kernel runtime on one GPU (a benchmark, not a
 * test: docs/performance.md records what it printed and the command).
 *
 *   launch overhead   N tiny tasks (alpha * x over 1024 floats each, independent) in ONE
 *                     persistent launch against N launches of a one-CTA kernel doing the same
 *                     work, back to back on one stream, and against those N launches replayed
 *                     from a CUDA graph; also a chain (each task after the one before).
 *   scheduling        tasks of 1 MiB each (y = alpha * x, fp32: 1 MiB read + 1 MiB written)
 *                     through W = 1, 2, 4, ... workers: GB/s moved and the scaling over W = 1.
 *   runtime costs     from the per-task profile (%globaltimer, profile = 1) of one launch: the
 *                     scheduling cost of a task, from the end of the task it depends on to its
 *                     start (a chain; a fan-out of 8 tasks per worker after one root); the gap
 *                     a worker leaves between two ready tasks (independent tasks); and the
 *                     fraction of the launch the worker CTAs spend not running a task (1 -
 *                     busy time / (span x CTAs)).
 *
 *   maco-run -n 2 bench_persistent --fifo [--puts K] [--iters I]
 *
 * instead times a device trigger's trip through the FIFO and the proxy inside a persistent
 * kernel: rank 0's PORT_PUT task j puts 64 bytes (a copy-engine copy, not inline) with a signal
 * to rank 1, whose NOP gated on that signal (wait_need j) releases a PORT_PUT back, which
 * releases rank 0's gated NOP j, which releases put j + 1 (K round trips per launch). From the
 * two ranks' profiles: the round trip on rank 0 (start of put j to start of the NOP that saw
 * the answer), rank 1's turnaround (its gate opening to its put back starting), and their
 * difference halved: a trigger's trip to the peer's gate (push, proxy, copy engine, signal,
 * gate poll), an upper bound on trigger to copy start; also the PORT_PUT task's own time (the
 * FIFO push) and the workers' waiting fraction.
 *
 *   usage: bench_persistent [--tasks N] [--iters I] | --fifo [--puts K] [--iters I]
 * Prints one table per part. Exit status 1 if a result is wrong (each part checks its output).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "maco/maco.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
#define MK(call)                                                                                   \
    do {                                                                                           \
        maco_status_t s_ = (call);                                                                 \
        if (s_ != MACO_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                      \
                    maco_status_string(s_), maco_log_last_error());                                \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void scale_kernel(float *out, const float *in, float alpha, int n)
{
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
        float4 x = reinterpret_cast<const float4 *>(in)[i];
        reinterpret_cast<float4 *>(out)[i] =
            make_float4(alpha * x.x, alpha * x.y, alpha * x.z, alpha * x.w);
    }
}

static maco_comm_t g_comm;
static cudaStream_t g_stream;
static int g_wrong;

static float ElapsedMs(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* Checks out[i] == alpha_task * in[i] for `tasks` slices of `len` floats. */
static void Check(const char *what, const float *dout, const float *din, int tasks, int len,
                  float (*alpha)(int))
{
    size_t n = static_cast<size_t>(tasks) * static_cast<size_t>(len);
    std::vector<float> o(n), x(n);
    CK(cudaMemcpy(o.data(), dout, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(x.data(), din, n * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += o[i] != alpha(static_cast<int>(i / static_cast<size_t>(len))) * x[i];
    if (bad != 0) {
        printf("WRONG: %s: %zu of %zu values\n", what, bad, n);
        g_wrong++;
    }
}

static float AlphaOf(int t)
{
    return static_cast<float>(1 + t % 5);
}

/* A persistent kernel of `tasks` scale tasks over slices of `len` floats. */
static maco_persistent_kernel_t MakeScaleGraph(float *out, const float *in, int tasks, int len,
                                               bool chain, const maco_persistent_config_t *cfg)
{
    maco_task_graph_t g;
    MK(maco_task_graph_create(&g));
    for (int t = 0; t < tasks; t++) {
        maco_task_t k;
        memset(&k, 0, sizeof(k));
        k.type = MACO_TASK_SCALE;
        k.datatype = MACO_FLOAT32;
        k.count = static_cast<uint64_t>(len);
        k.alpha = AlphaOf(t);
        k.a = in + static_cast<size_t>(t) * len;
        k.out = out + static_cast<size_t>(t) * len;
        MK(maco_task_graph_add_task(g, &k, nullptr));
        if (chain && t > 0)
            MK(maco_task_graph_add_dependency(g, t, t - 1));
    }
    maco_persistent_kernel_t pk;
    MK(maco_persistent_kernel_create(g_comm, g, cfg, &pk));
    MK(maco_task_graph_destroy(g));
    return pk;
}

static float TimePersistent(maco_persistent_kernel_t pk, int iters)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 2; i++)
        MK(maco_persistent_kernel_launch(pk, g_stream));
    CK(cudaEventRecord(a, g_stream));
    for (int i = 0; i < iters; i++)
        MK(maco_persistent_kernel_launch(pk, g_stream));
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    maco_status_t as;
    MK(maco_comm_get_async_error(g_comm, &as));
    if (as != MACO_OK) {
        printf("async error: %s\n", maco_comm_get_last_error(g_comm));
        exit(2);
    }
    float ms = ElapsedMs(a, b) / static_cast<float>(iters);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms;
}

static void LaunchOverhead(int tasks, int iters)
{
    const int len = 1024;
    size_t n = static_cast<size_t>(tasks) * len;
    float *in, *out;
    CK(cudaMalloc(&in, n * 4));
    CK(cudaMalloc(&out, n * 4));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++)
        h[i] = static_cast<float>(i % 1000) * 0.5f;
    CK(cudaMemcpy(in, h.data(), n * 4, cudaMemcpyHostToDevice));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));

    /* N launches of a one-CTA kernel. */
    for (int t = 0; t < tasks; t++)
        scale_kernel<<<1, 256, 0, g_stream>>>(out + static_cast<size_t>(t) * len,
                                              in + static_cast<size_t>(t) * len, AlphaOf(t), len);
    CK(cudaEventRecord(a, g_stream));
    for (int i = 0; i < iters; i++)
        for (int t = 0; t < tasks; t++)
            scale_kernel<<<1, 256, 0, g_stream>>>(out + static_cast<size_t>(t) * len,
                                                  in + static_cast<size_t>(t) * len, AlphaOf(t),
                                                  len);
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms_launch = ElapsedMs(a, b) / static_cast<float>(iters);
    Check("N launches", out, in, tasks, len, AlphaOf);

    /* The same N launches captured once in a CUDA graph. */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    for (int t = 0; t < tasks; t++)
        scale_kernel<<<1, 256, 0, g_stream>>>(out + static_cast<size_t>(t) * len,
                                              in + static_cast<size_t>(t) * len, AlphaOf(t), len);
    CK(cudaStreamEndCapture(g_stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaEventRecord(a, g_stream));
    for (int i = 0; i < iters; i++)
        CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float ms_graph = ElapsedMs(a, b) / static_cast<float>(iters);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    /* One persistent launch: default split, independent tasks; then a chain. */
    CK(cudaMemset(out, 0, n * 4));
    maco_persistent_kernel_t pk = MakeScaleGraph(out, in, tasks, len, false, nullptr);
    maco_persistent_config_t cfg;
    MK(maco_persistent_kernel_get_config(pk, &cfg));
    float ms_pk = TimePersistent(pk, iters);
    Check("persistent", out, in, tasks, len, AlphaOf);
    MK(maco_persistent_kernel_destroy(pk));
    CK(cudaMemset(out, 0, n * 4));
    pk = MakeScaleGraph(out, in, tasks, len, true, nullptr);
    float ms_chain = TimePersistent(pk, iters > 5 ? 5 : iters);
    Check("persistent chain", out, in, tasks, len, AlphaOf);
    MK(maco_persistent_kernel_destroy(pk));

    printf("%7d %12.2f %12.2f %12.2f %9.1fx %9.1fx %14.2f\n", tasks,
           1e3 * ms_launch / static_cast<float>(tasks), 1e3 * ms_graph / static_cast<float>(tasks),
           1e3 * ms_pk / static_cast<float>(tasks), ms_launch / ms_pk, ms_graph / ms_pk,
           1e3 * ms_chain / static_cast<float>(tasks));
    printf("        (persistent: %d workers, %d schedulers, %d threads; one launch %.3f ms)\n",
           cfg.workers, cfg.schedulers, cfg.threads, ms_pk);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(in);
    cudaFree(out);
}

static void Scheduling(int iters)
{
    const int len = 256 * 1024; /* floats: 1 MiB per task */
    const int tasks = 1024;
    size_t n = static_cast<size_t>(tasks) * len;
    float *in, *out;
    CK(cudaMalloc(&in, n * 4));
    CK(cudaMalloc(&out, n * 4));
    CK(cudaMemset(in, 0, n * 4));
    std::vector<float> h(static_cast<size_t>(len));
    for (int t = 0; t < tasks; t += 97) { /* a few slices carry data to check */
        for (int i = 0; i < len; i++)
            h[static_cast<size_t>(i)] = static_cast<float>((i + t) % 777);
        CK(cudaMemcpy(in + static_cast<size_t>(t) * len, h.data(), static_cast<size_t>(len) * 4,
                      cudaMemcpyHostToDevice));
    }
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("%8s %11s %9s %12s %9s\n", "workers", "schedulers", "time(ms)", "GB/s", "scaling");
    double base = 0;
    for (int w = 1; w <= sms; w *= 2) {
        int W = w;
        maco_persistent_config_t cfg = { W, W / 8 > 1 ? W / 8 : 1, MACO_PERSISTENT_NONE, 512, 0 };
        CK(cudaMemset(out, 0, n * 4));
        maco_persistent_kernel_t pk = MakeScaleGraph(out, in, tasks, len, false, &cfg);
        float ms = TimePersistent(pk, iters);
        Check("scheduling", out, in, tasks, len, AlphaOf);
        MK(maco_persistent_kernel_destroy(pk));
        double gbs = 2.0 * static_cast<double>(n) * 4 / (static_cast<double>(ms) * 1e-3) / 1e9;
        if (W == 1)
            base = gbs;
        printf("%8d %11d %9.3f %12.1f %8.1fx\n", W, cfg.schedulers, ms, gbs, gbs / base);
        if (w * 2 > sms && w != sms)
            w = sms / 2; /* end at the SM count */
    }
    cudaFree(in);
    cudaFree(out);
}

/* ------------------------------------------------------------------ runtime costs */

/* Prints count, median, p90, p99 and max of `us` (microseconds). */
static void PrintStats(const char *what, std::vector<double> us)
{
    if (us.empty()) {
        printf("%-46s %7s\n", what, "(none)");
        return;
    }
    std::sort(us.begin(), us.end());
    auto q = [&us](double p) {
        return us[static_cast<size_t>(p * static_cast<double>(us.size() - 1))];
    };
    printf("%-46s %7zu %9.3f %9.3f %9.3f %9.3f\n", what, us.size(), q(0.5), q(0.9), q(0.99),
           us.back());
}

/* The last launch's profile of `pk` (its stream synchronised). */
static std::vector<maco_task_profile_t> ProfileOf(maco_persistent_kernel_t pk, int ntasks)
{
    std::vector<maco_task_profile_t> p(static_cast<size_t>(ntasks));
    MK(maco_persistent_kernel_get_profile(pk, p.data(), p.size()));
    return p;
}

/* 1 - busy / (span x ctas): the share of the launch (first task start to last task end) the
 * `ctas` CTAs spent not running a task; *span_us gets the span. */
static double WaitingFraction(const std::vector<maco_task_profile_t> &p, int ctas, double *span_us)
{
    uint64_t first = ~0ull, last = 0;
    double busy = 0;
    for (const auto &r : p) {
        first = std::min(first, r.start_ns);
        last = std::max(last, r.end_ns);
        busy += static_cast<double>(r.end_ns - r.start_ns);
    }
    const double span = last > first ? static_cast<double>(last - first) : 0.0;
    *span_us = span * 1e-3;
    return span > 0 && ctas > 0 ? 1.0 - busy / (span * ctas) : 0.0;
}

/* Per CTA, the gaps between the end of one task and the start of its next (us). */
static std::vector<double> WorkerGaps(const std::vector<maco_task_profile_t> &p)
{
    std::vector<std::pair<int, std::pair<uint64_t, uint64_t>>> byc;
    for (const auto &r : p)
        byc.push_back({ r.cta, { r.start_ns, r.end_ns } });
    std::sort(byc.begin(), byc.end());
    std::vector<double> gaps;
    for (size_t i = 1; i < byc.size(); i++)
        if (byc[i].first == byc[i - 1].first && byc[i].second.first >= byc[i - 1].second.second)
            gaps.push_back(static_cast<double>(byc[i].second.first - byc[i - 1].second.second) *
                           1e-3);
    return gaps;
}

static void PrintWaiting(const char *what, const std::vector<maco_task_profile_t> &p,
                         const maco_persistent_config_t &cfg)
{
    const int ctas = cfg.workers + (cfg.comm_workers > 0 ? cfg.comm_workers : 0);
    double span = 0;
    const double f = WaitingFraction(p, ctas, &span);
    printf("%-46s %6.1f%% of %d CTAs x %.1f us\n", what, 100.0 * f, ctas, span);
}

static void RuntimeCosts(int iters)
{
    const int len = 1024, chain = 2000, indep = 10000;
    const int n = indep; /* the largest graph's floats / len */
    float *in, *out;
    CK(cudaMalloc(&in, static_cast<size_t>(n) * len * 4));
    CK(cudaMalloc(&out, static_cast<size_t>(n) * len * 4));
    CK(cudaMemset(in, 0, static_cast<size_t>(n) * len * 4));
    maco_persistent_config_t prof;
    memset(&prof, 0, sizeof(prof)); /* the default split */
    prof.profile = 1;
    printf("%-46s %7s %9s %9s %9s %9s\n", "(us)", "count", "median", "p90", "p99", "max");

    /* A chain: task t is ready when task t - 1 ends. */
    maco_persistent_kernel_t pk = MakeScaleGraph(out, in, chain, len, true, &prof);
    maco_persistent_config_t cfg;
    MK(maco_persistent_kernel_get_config(pk, &cfg));
    (void)TimePersistent(pk, iters > 3 ? 3 : iters);
    std::vector<maco_task_profile_t> p = ProfileOf(pk, chain);
    std::vector<double> ready, run;
    for (int t = 1; t < chain; t++)
        ready.push_back(static_cast<double>(p[t].start_ns - p[t - 1].end_ns) * 1e-3);
    for (const auto &r : p)
        run.push_back(static_cast<double>(r.end_ns - r.start_ns) * 1e-3);
    PrintStats("chain: dependency's end to task start", ready);
    PrintStats("chain: task run time (1024 floats)", run);
    PrintWaiting("chain: workers waiting", p, cfg);
    MK(maco_persistent_kernel_destroy(pk));

    /* A fan-out: one root, then 8 tasks per worker that all depend on it. */
    const int fan = 8 * cfg.workers < indep - 1 ? 8 * cfg.workers : indep - 1;
    maco_task_graph_t g;
    MK(maco_task_graph_create(&g));
    for (int t = 0; t <= fan; t++) {
        maco_task_t k;
        memset(&k, 0, sizeof(k));
        k.type = MACO_TASK_SCALE;
        k.datatype = MACO_FLOAT32;
        k.count = static_cast<uint64_t>(len);
        k.alpha = AlphaOf(t);
        k.a = in + static_cast<size_t>(t) * len;
        k.out = out + static_cast<size_t>(t) * len;
        MK(maco_task_graph_add_task(g, &k, nullptr));
        if (t > 0)
            MK(maco_task_graph_add_dependency(g, t, 0));
    }
    MK(maco_persistent_kernel_create(g_comm, g, &prof, &pk));
    MK(maco_task_graph_destroy(g));
    (void)TimePersistent(pk, iters > 3 ? 3 : iters);
    p = ProfileOf(pk, fan + 1);
    ready.clear();
    for (int t = 1; t <= fan; t++)
        ready.push_back(static_cast<double>(p[t].start_ns - p[0].end_ns) * 1e-3);
    std::sort(ready.begin(), ready.end());
    std::vector<double> first(ready.begin(),
                              ready.begin() +
                                  std::min<size_t>(ready.size(), static_cast<size_t>(cfg.workers)));
    PrintStats("fan-out: root's end to start, first W tasks", first);
    PrintStats("fan-out: root's end to start, all tasks", ready);
    PrintWaiting("fan-out: workers waiting", p, cfg);
    MK(maco_persistent_kernel_destroy(pk));

    /* Independent tasks: every one ready at the start. */
    pk = MakeScaleGraph(out, in, indep, len, false, &prof);
    (void)TimePersistent(pk, iters > 3 ? 3 : iters);
    p = ProfileOf(pk, indep);
    PrintStats("independent: a worker's gap between tasks", WorkerGaps(p));
    PrintWaiting("independent: workers waiting", p, cfg);
    Check("runtime costs", out, in, indep, len, AlphaOf);
    MK(maco_persistent_kernel_destroy(pk));
    cudaFree(in);
    cudaFree(out);
}

/* ------------------------------------------------------------------ FIFO and proxy (2 ranks) */

/* The ping-pong graph of one rank (see the file's text): K rounds over port channel `ch` (the
 * graph's index `idx`) to the peer. Rank 0: put[j] (tasks 2j), back[j] (2j + 1); rank 1:
 * got[j] (2j), reply[j] (2j + 1). */
static void FifoGraph(maco_task_graph_t g, int rank, int peer, int idx,
                      const maco_port_channel_device_t &h, int K)
{
    for (int j = 0; j < K; j++) {
        maco_task_t put, gate;
        memset(&put, 0, sizeof(put));
        put.type = MACO_TASK_PORT_PUT;
        put.role = MACO_TASK_ROLE_COMM;
        put.channel = static_cast<uint32_t>(idx);
        put.count = 64; /* a copy-engine copy (8 bytes would travel inline) */
        put.src_offset = 0;
        put.dst_offset = 64u * (1u + static_cast<uint32_t>(j % 64));
        put.name = rank == 0 ? "put" : "reply";
        memset(&gate, 0, sizeof(gate));
        gate.type = MACO_TASK_NOP;
        gate.role = MACO_TASK_ROLE_COMM;
        gate.wait_on = h.semaphore.inbound;
        gate.wait_count = static_cast<uint64_t>(K);
        gate.wait_need = static_cast<uint64_t>(j) + 1;
        gate.wait_peer = peer;
        gate.name = rank == 0 ? "back" : "got";
        int a = -1, b = -1;
        if (rank == 0) {
            MK(maco_task_graph_add_task(g, &put, &a));
            MK(maco_task_graph_add_task(g, &gate, &b));
            MK(maco_task_graph_add_dependency(g, b, a));
            if (j > 0)
                MK(maco_task_graph_add_dependency(g, a, a - 1)); /* after back[j - 1] */
        } else {
            MK(maco_task_graph_add_task(g, &gate, &a));
            MK(maco_task_graph_add_task(g, &put, &b));
            MK(maco_task_graph_add_dependency(g, b, a));
            if (j > 0)
                MK(maco_task_graph_add_dependency(g, a, a - 1)); /* after reply[j - 1] */
        }
    }
}

static int FifoThroughProxy(int K, int iters)
{
    maco_comm_t comm;
    MK(maco_comm_init_from_env(&comm));
    int rank = 0, n = 0, dev = 0;
    maco_comm_get_rank(comm, &rank);
    maco_comm_get_nranks(comm, &n);
    maco_comm_get_cuda_device(comm, &dev);
    if (n != 2) {
        fprintf(stderr, "bench_persistent --fifo: run with 2 ranks (maco-run -n 2)\n");
        return 2;
    }
    CK(cudaSetDevice(dev));
    maco_bootstrap_t bs;
    maco_comm_get_bootstrap(comm, &bs);
    const size_t bytes = 64 * 65;
    char *buf;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMemset(buf, 1, bytes));
    maco_mem_t mine, theirs;
    MK(maco_mem_register(comm, buf, bytes, &mine));
    uint8_t hs[2][MACO_MEM_HANDLE_BYTES];
    MK(maco_mem_serialize(mine, hs[rank]));
    MK(maco_bootstrap_allgather(bs, hs, MACO_MEM_HANDLE_BYTES));
    MK(maco_mem_import(comm, hs[1 - rank], &theirs));
    maco_proxy_t proxy;
    MK(maco_proxy_create(comm, &proxy));
    MK(maco_proxy_start(proxy));
    maco_port_channel_t ch;
    MK(maco_port_channel_create(proxy, 1 - rank, MACO_TRANSPORT_AUTO, mine, theirs, &ch));
    maco_port_channel_device_t h;
    MK(maco_port_channel_get_device_handle(ch, &h));
    maco_task_graph_t g;
    MK(maco_task_graph_create(&g));
    int idx = -1;
    MK(maco_task_graph_add_port_channel(g, ch, &idx));
    FifoGraph(g, rank, 1 - rank, idx, h, K);
    maco_persistent_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.comm_workers = 2;
    cfg.profile = 1;
    maco_persistent_kernel_t pk;
    MK(maco_persistent_kernel_create(comm, g, &cfg, &pk));
    MK(maco_persistent_kernel_get_config(pk, &cfg));
    MK(maco_task_graph_destroy(g));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float ms = 0;
    for (int i = 0; i < iters; i++) { /* both ranks launch each time; the last is profiled */
        MK(maco_bootstrap_barrier(bs));
        CK(cudaEventRecord(a, s));
        MK(maco_persistent_kernel_launch(pk, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        ms = ElapsedMs(a, b);
    }
    maco_status_t as;
    MK(maco_comm_get_async_error(comm, &as));
    if (as != MACO_OK) {
        printf("async error: %s\n", maco_comm_get_last_error(comm));
        return 2;
    }
    std::vector<maco_task_profile_t> p = ProfileOf(pk, 2 * K);
    /* Rank 1's turnarounds (gate seen to reply started), to rank 0. */
    std::vector<double> turn(static_cast<size_t>(2 * K), 0.0);
    for (int j = 0; j < K && rank == 1; j++)
        turn[static_cast<size_t>(K + j)] =
            static_cast<double>(p[2 * j + 1].start_ns - p[2 * j].start_ns) * 1e-3;
    MK(maco_bootstrap_allgather(bs, turn.data(), static_cast<size_t>(K) * sizeof(double)));
    if (rank == 0) {
        std::vector<double> rt, tr, oneway, push;
        for (int j = 1; j < K; j++) { /* round 0 also waits for rank 1's launch */
            const double r = static_cast<double>(p[2 * j + 1].start_ns - p[2 * j].start_ns) * 1e-3;
            const double t = turn[static_cast<size_t>(K + j)];
            rt.push_back(r);
            tr.push_back(t);
            oneway.push_back((r - t) / 2);
        }
        for (int j = 0; j < K; j++)
            push.push_back(static_cast<double>(p[2 * j].end_ns - p[2 * j].start_ns) * 1e-3);
        printf("%-46s %7s %9s %9s %9s %9s\n", "(us)", "count", "median", "p90", "p99", "max");
        PrintStats("round trip (put j to its answer's gate)", rt);
        PrintStats("peer's turnaround (gate to its put)", tr);
        PrintStats("trigger to the peer's gate, one way", oneway);
        PrintStats("PORT_PUT task (the FIFO push)", push);
        PrintWaiting("workers waiting (rank 0)", p, cfg);
        printf("        (%d rounds in %.3f ms; %d workers, %d communication workers)\n", K, ms,
               cfg.workers, cfg.comm_workers);
    }
    CK(cudaStreamSynchronize(s));
    MK(maco_persistent_kernel_destroy(pk));
    MK(maco_bootstrap_barrier(bs));
    maco_proxy_stop(proxy);
    maco_port_channel_destroy(ch);
    maco_proxy_destroy(proxy);
    maco_mem_deregister(theirs);
    maco_mem_deregister(mine);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    cudaFree(buf);
    maco_comm_destroy(comm);
    return 0;
}

int main(int argc, char **argv)
{
    int ntasks[3] = { 1000, 10000, 0 };
    int iters = 20, puts = 500;
    bool fifo = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tasks") && i + 1 < argc) {
            ntasks[0] = atoi(argv[++i]);
            ntasks[1] = 0;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--puts") && i + 1 < argc) {
            puts = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--fifo")) {
            fifo = true;
        } else {
            fprintf(stderr, "usage: %s [--tasks N] [--iters I] | --fifo [--puts K] [--iters I]\n",
                    argv[0]);
            return 2;
        }
    }
    /* K rounds: 2K communication tasks, within what a worker's queue holds. */
    if (ntasks[0] < 1 || iters < 1 || puts < 2 || puts > 2000) {
        fprintf(stderr, "%s: --tasks and --iters at least 1, --puts 2 to 2000\n", argv[0]);
        return 2;
    }
    char why[400];
    if (maco_cuda_device_count(why, sizeof(why)) < 1) {
        printf("SKIP: no GPU: %s\n", why);
        return 77; /* skipped: docs/tools.md, "Exit statuses" */
    }
    if (fifo) {
        printf("## a device trigger through the FIFO and the proxy: %d rounds of 64-byte puts\n",
               puts);
        return FifoThroughProxy(puts, iters > 5 ? 5 : iters);
    }
    maco_unique_id_t id;
    maco_bootstrap_t bs;
    MK(maco_unique_id_create(&id));
    MK(maco_bootstrap_create(&id, 0, 1, -1, &bs));
    MK(maco_comm_create(bs, 0, &g_comm));
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# bench_persistent on %s (%d SMs), %d iterations per point\n", prop.name,
           prop.multiProcessorCount, iters);
    printf("\n## launch overhead: N tasks of 1024 floats (y = alpha * x)\n");
    printf("%7s %12s %12s %12s %10s %10s %14s\n", "tasks", "launch(us/t)", "graph(us/t)",
           "persist(us/t)", "vs launch", "vs graph", "chain(us/t)");
    for (int i = 0; ntasks[i] != 0; i++)
        LaunchOverhead(ntasks[i], iters);
    printf("\n## scheduling throughput: 1024 tasks of 1 MiB (read) + 1 MiB (write), 512 "
           "threads per worker\n");
    Scheduling(iters > 10 ? 10 : iters);
    printf("\n## runtime costs from the per-task profile (one launch, the default split)\n");
    RuntimeCosts(iters);
    MK(maco_comm_destroy(g_comm));
    MK(maco_bootstrap_destroy(bs));
    cudaStreamDestroy(g_stream);
    printf("\n%s\n", g_wrong ? "WRONG RESULTS" : "all results checked: 0 wrong");
    return g_wrong ? 1 : 0;
}
