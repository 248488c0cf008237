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
 *
 *   usage: bench_persistent [--tasks N] [--iters I]
 * Prints one table per part. Exit status 1 if a result is wrong (each part checks its output).
 */
#include <cuda_runtime.h>

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

int main(int argc, char **argv)
{
    int ntasks[3] = { 1000, 10000, 0 };
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tasks") && i + 1 < argc) {
            ntasks[0] = atoi(argv[++i]);
            ntasks[1] = 0;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--tasks N] [--iters I]\n", argv[0]);
            return 2;
        }
    }
    char why[400];
    if (maco_cuda_device_count(why, sizeof(why)) < 1) {
        printf("SKIP: no GPU: %s\n", why);
        return 77; /* skipped: docs/tools.md, "Exit statuses" */
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
    MK(maco_comm_destroy(g_comm));
    MK(maco_bootstrap_destroy(bs));
    cudaStreamDestroy(g_stream);
    printf("\n%s\n", g_wrong ? "WRONG RESULTS" : "all results checked: 0 wrong");
    return g_wrong ? 1 : 0;
}
