/*
 * bench_ep - expert-parallel dispatch and combine (maco/ep.h) against MACO's own all-to-allv
 * pipeline, in one run. A benchmark, not a test.
 *
 *   maco-run -n 4 build/tests/bench_ep                 # both of the issue's shapes
 *   maco-run -n 2 build/tests/bench_ep --mode ll --tokens 128 --hidden 7168 --experts 256
 *
 * Shapes (issue 40): low latency, 128 tokens per rank; normal, 4096 tokens per rank; both
 * hidden 7168, 256 experts, top-8, bfloat16, uniform random routing (each token's top-k
 * distinct experts drawn from a seed). Each op is timed over --iters back-to-back calls on one
 * stream after --warmup calls and a barrier (CUDA events); maco_ep_dispatch_fp8 is timed too
 * where hidden is a multiple of 128. The time printed is the slowest rank's mean per call.
 * GB/s = this rank's entries x row bytes / time (the bytes each rank sends, its own rows
 * included; the most loaded rank's; fp8: hidden + hidden / 32 bytes per row). SMs: the CTAs
 * each kernel launches.
 *
 * Baseline (the way most code does it today, on MACO's collectives): dispatch = a gather
 * kernel packing every entry's row by destination rank (the order is computed on the host
 * beforehand, not timed), maco_alltoall of the per-rank counts, a copy of them to the host
 * (the host waits), then maco_alltoallv of the rows; combine = maco_alltoallv back, then a
 * kernel summing each token's rows with its weights. The baseline does not unpack rows per
 * expert (a real pipeline would): it is a lower bound on that pipeline's time.
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "bench_common.h" /* CK, MK */
#include "maco/maco.h"

namespace
{

struct Options {
    std::string mode = "both";
    int tokens = 0; /* 0: 128 low latency, 4096 normal */
    int hidden = 7168, experts = 256, topk = 8, iters = 20, warmup = 5, ctas = 0;
};

/* Gathers entry rows into the baseline's send buffer: out[i] = x[src_token[i]]. */
__global__ void gather_rows(const uint4 *x, const int32_t *src_token, uint4 *out, int rows,
                            int vecs)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)rows * vecs;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / vecs, v = i % vecs;
        out[i] = x[(int64_t)src_token[r] * vecs + v];
    }
}

/* The baseline's combine: y[t] = sum over its entries (in k order) of w * row. back_pos[t * K
 * + k] is the entry's row in the returned buffer, or -1. */
__global__ void weighted_sum(const uint16_t *back, const int32_t *back_pos, const float *w,
                             uint16_t *y, int T, int K, int hidden)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)T * hidden;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(i / hidden), h = (int)(i % hidden);
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            const int p = back_pos[t * K + k];
            if (p >= 0)
                acc =
                    __fmaf_rn(w[t * K + k],
                              __uint_as_float((uint32_t)back[(int64_t)p * hidden + h] << 16), acc);
        }
        uint32_t u = __float_as_uint(acc);
        u += 0x7fffu + ((u >> 16) & 1u);
        y[i] = (uint16_t)(u >> 16);
    }
}

void Usage()
{
    printf("usage: maco-run -n N bench_ep [--mode ll|normal|both] [--tokens T] [--hidden H]\n"
           "         [--experts E] [--topk K] [--iters N] [--warmup N] [--ctas C]\n");
}

bool Parse(int argc, char **argv, Options *o)
{
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h")
            return false;
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_ep: %s needs a value\n", a.c_str());
            return false;
        }
        const char *v = argv[++i];
        if (a == "--mode")
            o->mode = v;
        else if (a == "--tokens")
            o->tokens = atoi(v);
        else if (a == "--hidden")
            o->hidden = atoi(v);
        else if (a == "--experts")
            o->experts = atoi(v);
        else if (a == "--topk")
            o->topk = atoi(v);
        else if (a == "--iters")
            o->iters = atoi(v);
        else if (a == "--warmup")
            o->warmup = atoi(v);
        else if (a == "--ctas")
            o->ctas = atoi(v);
        else {
            fprintf(stderr, "bench_ep: unknown option %s\n", a.c_str());
            return false;
        }
    }
    return o->mode == "ll" || o->mode == "normal" || o->mode == "both";
}

struct Job {
    maco_bootstrap_t bs;
    maco_comm_t comm;
    int rank, n;
    cudaStream_t s;
};

/* The slowest rank's mean per call of `iters` calls of fn, after warmup and a barrier. */
template <class F> double TimeUs(const Job &j, int warmup, int iters, F fn)
{
    for (int i = 0; i < warmup; i++)
        fn();
    CK(cudaStreamSynchronize(j.s));
    MK(maco_bootstrap_barrier(j.bs));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, j.s));
    for (int i = 0; i < iters; i++)
        fn();
    CK(cudaEventRecord(e1, j.s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::vector<double> all((size_t)j.n);
    all[(size_t)j.rank] = 1000.0 * ms / iters;
    MK(maco_bootstrap_allgather(j.bs, all.data(), sizeof(double)));
    return *std::max_element(all.begin(), all.end());
}

uint16_t Bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

void RunMode(const Job &j, const Options &opt, maco_ep_mode_t mode)
{
    const bool ll = mode == MACO_EP_LOW_LATENCY;
    const int T = opt.tokens > 0 ? opt.tokens : (ll ? 128 : 4096);
    const int H = opt.hidden, E = opt.experts, K = opt.topk, n = j.n, L = E / n;
    const size_t rowb = (size_t)H * 2;
    maco_stream_t ms = reinterpret_cast<maco_stream_t>(j.s);

    /* Inputs: rows from a seed, each token's top-k distinct experts uniform at random. */
    std::mt19937_64 rng(1234 + 7919 * (uint64_t)j.rank);
    std::vector<uint16_t> x((size_t)T * H);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto &v : x)
        v = Bf16(u(rng));
    std::vector<int64_t> idx((size_t)T * K);
    std::vector<float> w((size_t)T * K);
    std::vector<int> pool(E);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++)
            pool[e] = e;
        std::shuffle(pool.begin(), pool.end(), rng);
        for (int k = 0; k < K; k++) {
            idx[(size_t)t * K + k] = pool[k];
            w[(size_t)t * K + k] = 1.0f / (float)K;
        }
    }

    maco_ep_config_t c;
    memset(&c, 0, sizeof(c));
    c.mode = mode;
    c.max_tokens_per_rank = T;
    c.hidden = H;
    c.num_experts = E;
    c.topk = K;
    c.dtype = MACO_BFLOAT16;
    c.num_ctas = opt.ctas;
    if (!ll) /* twice the mean (T x K rows per rank) rather than the worst case */
        c.max_recv_tokens = std::min<int64_t>(2LL * T * K, (int64_t)n * T * std::min(K, L));
    maco_ep_buffer_t buf = nullptr;
    MK(maco_ep_buffer_create(j.comm, &c, &buf));
    maco_ep_info_t info;
    MK(maco_ep_buffer_get_info(buf, &info));

    void *d_x, *d_handle, *d_out, *d_y;
    int64_t *d_idx;
    float *d_w, *d_rw;
    int32_t *d_counts, *d_offsets;
    CK(cudaMalloc(&d_x, x.size() * 2));
    CK(cudaMalloc(&d_idx, idx.size() * 8));
    CK(cudaMalloc(&d_w, w.size() * 4));
    CK(cudaMalloc(&d_rw, (size_t)info.recv_rows * 4));
    CK(cudaMalloc(&d_counts, (size_t)L * 4));
    CK(cudaMalloc(&d_offsets, (size_t)(L + 1) * 4));
    CK(cudaMalloc(&d_handle, info.handle_bytes));
    CK(cudaMalloc(&d_out, (size_t)info.recv_rows * rowb));
    CK(cudaMalloc(&d_y, (size_t)T * rowb));
    CK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_idx, idx.data(), idx.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(d_out, 0, (size_t)info.recv_rows * rowb));
    CK(cudaDeviceSynchronize()); /* the copies above ran on the legacy stream, not on j.s */

    auto dispatch = [&]() {
        MK(maco_ep_dispatch(buf, d_x, MACO_BFLOAT16, T, H, d_idx, d_w, K, d_counts, d_offsets, d_rw,
                            d_handle, nullptr, ms));
    };
    auto combine = [&]() {
        MK(maco_ep_combine(buf, d_out, MACO_BFLOAT16, H, d_handle, d_w, T, K, d_y, ms));
    };
    dispatch(); /* the handle for combine */
    CK(cudaStreamSynchronize(j.s));
    double t_disp = TimeUs(j, opt.warmup, opt.iters, dispatch);
    double t_comb = TimeUs(j, opt.warmup, opt.iters, combine);
    double t_pair = TimeUs(j, opt.warmup, opt.iters, [&]() {
        dispatch();
        combine();
    });
    double t_fp8 = -1.0; /* maco_ep_dispatch_fp8 (hidden a multiple of 128) */
    if (H % MACO_EP_FP8_BLOCK == 0) {
        t_fp8 = TimeUs(j, opt.warmup, opt.iters, [&]() {
            MK(maco_ep_dispatch_fp8(buf, d_x, MACO_BFLOAT16, T, H, d_idx, d_w, K, d_counts,
                                    d_offsets, d_rw, d_handle, nullptr, ms));
        });
        dispatch(); /* combine's handle again from a bfloat16 dispatch */
    }
    int64_t num_recv = -1;
    if (!ll) { /* the host-waiting form, as a prefill step would call it */
        CK(cudaStreamSynchronize(j.s));
        double t_sync = TimeUs(j, opt.warmup, opt.iters, [&]() {
            MK(maco_ep_dispatch(buf, d_x, MACO_BFLOAT16, T, H, d_idx, d_w, K, d_counts, d_offsets,
                                d_rw, d_handle, &num_recv, ms));
        });
        if (j.rank == 0)
            printf("  dispatch with num_recv_p (host waits)  %9.1f us\n", t_sync);
    }
    MK(maco_ep_buffer_check(buf));
    const int64_t entries = (int64_t)T * K; /* every entry names an expert here */
    const double bytes = (double)entries * (double)rowb;
    if (j.rank == 0) {
        printf("  %-38s %9.1f us %8.1f GB/s  %d SMs\n", "maco_ep_dispatch", t_disp,
               bytes / t_disp / 1e3, info.num_ctas);
        printf("  %-38s %9.1f us %8.1f GB/s  %d SMs\n", "maco_ep_combine", t_comb,
               bytes / t_comb / 1e3, info.num_ctas);
        printf("  %-38s %9.1f us\n", "dispatch + combine", t_pair);
        if (t_fp8 >= 0) /* bytes moved: hidden + hidden / 32 per entry */
            printf("  %-38s %9.1f us %8.1f GB/s  %d SMs\n", "maco_ep_dispatch_fp8", t_fp8,
                   (double)entries * (double)(H + H / 32) / t_fp8 / 1e3, info.num_ctas);
    }

    /* Baseline: pack by destination rank, count exchange (host waits), all-to-allv. */
    std::vector<int32_t> order;                       /* send row -> token */
    std::vector<int32_t> back_pos((size_t)T * K, -1); /* entry -> row of the returned buffer */
    std::vector<size_t> scount(n, 0), sdispl(n, 0);
    for (int r = 0; r < n; r++) {
        sdispl[r] = order.size();
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (idx[(size_t)t * K + k] / L == r) {
                    back_pos[(size_t)t * K + k] = (int32_t)order.size();
                    order.push_back(t);
                }
        scount[r] = order.size() - sdispl[r];
    }
    const size_t send_rows = order.size();
    /* Rows this rank receives: the other ranks' counts for it. */
    std::vector<int64_t> matrix((size_t)n * (size_t)n);
    for (int r = 0; r < n; r++)
        matrix[(size_t)j.rank * n + r] = (int64_t)scount[r];
    MK(maco_bootstrap_allgather(j.bs, matrix.data(), (size_t)n * sizeof(int64_t)));
    int64_t recv_rows = 0;
    for (int r = 0; r < n; r++)
        recv_rows += matrix[(size_t)r * n + j.rank];
    int32_t *d_order, *d_back_pos, *d_scount, *d_rcount;
    void *d_send, *d_recv;
    CK(cudaMalloc(&d_order, std::max<size_t>(1, send_rows) * 4));
    CK(cudaMalloc(&d_back_pos, back_pos.size() * 4));
    CK(cudaMalloc(&d_scount, (size_t)n * 4));
    CK(cudaMalloc(&d_rcount, (size_t)n * 4));
    CK(cudaMalloc(&d_send, std::max<size_t>(1, send_rows) * rowb));
    CK(cudaMalloc(&d_recv, (size_t)std::max<int64_t>(1, recv_rows) * rowb));
    CK(cudaMemcpy(d_order, order.data(), send_rows * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_back_pos, back_pos.data(), back_pos.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> sc32(n);
    for (int r = 0; r < n; r++)
        sc32[r] = (int32_t)scount[r];
    CK(cudaMemcpy(d_scount, sc32.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    std::vector<int32_t> rc32(n);
    std::vector<size_t> rcount(n), rdispl(n), sc_el(n), sd_el(n), rc_el(n), rd_el(n);
    const int vecs = H / 8;
    auto base_dispatch = [&]() {
        gather_rows<<<132, 512, 0, j.s>>>((const uint4 *)d_x, d_order, (uint4 *)d_send,
                                          (int)send_rows, vecs);
        MK(maco_alltoall(d_scount, d_rcount, 1, MACO_INT32, j.comm, ms));
        CK(cudaMemcpyAsync(rc32.data(), d_rcount, (size_t)n * 4, cudaMemcpyDeviceToHost, j.s));
        CK(cudaStreamSynchronize(j.s));
        size_t at = 0;
        for (int r = 0; r < n; r++) {
            rcount[r] = (size_t)rc32[r];
            rdispl[r] = at;
            at += rcount[r];
            sc_el[r] = scount[r] * (size_t)H;
            sd_el[r] = sdispl[r] * (size_t)H;
            rc_el[r] = rcount[r] * (size_t)H;
            rd_el[r] = rdispl[r] * (size_t)H;
        }
        MK(maco_alltoallv(d_send, sc_el.data(), sd_el.data(), d_recv, rc_el.data(), rd_el.data(),
                          MACO_BFLOAT16, j.comm, ms));
    };
    base_dispatch(); /* the receive counts for the combine */
    CK(cudaStreamSynchronize(j.s));
    double b_disp = TimeUs(j, opt.warmup, opt.iters, base_dispatch);
    maco_collective_stats_t st;
    MK(maco_collective_get_stats(j.comm, &st));
    auto base_combine = [&]() {
        MK(maco_alltoallv(d_recv, rc_el.data(), rd_el.data(), d_send, sc_el.data(), sd_el.data(),
                          MACO_BFLOAT16, j.comm, ms));
        weighted_sum<<<132, 512, 0, j.s>>>((const uint16_t *)d_send, d_back_pos, d_w,
                                           (uint16_t *)d_y, T, K, H);
    };
    double b_comb = TimeUs(j, opt.warmup, opt.iters, base_combine);
    if (j.rank == 0) {
        printf("  %-38s %9.1f us %8.1f GB/s  %d SMs (+ gather)  %.2fx\n",
               "baseline: counts, host, alltoallv", b_disp, bytes / b_disp / 1e3,
               st.last_launch_ctas, b_disp / t_disp);
        printf("  %-38s %9.1f us %8.1f GB/s  %d SMs (+ sum)     %.2fx\n",
               "baseline: alltoallv back, weighted sum", b_comb, bytes / b_comb / 1e3,
               st.last_launch_ctas, b_comb / t_comb);
    }
    CK(cudaStreamSynchronize(j.s));
    for (void *p : { (void *)d_x, (void *)d_idx, (void *)d_w, (void *)d_rw, (void *)d_counts,
                     (void *)d_offsets, d_handle, d_out, d_y, (void *)d_order, (void *)d_back_pos,
                     (void *)d_scount, (void *)d_rcount, d_send, d_recv })
        cudaFree(p);
    MK(maco_ep_buffer_destroy(buf));
}

} // namespace

int main(int argc, char **argv)
{
    Options opt;
    if (!Parse(argc, argv, &opt)) {
        Usage();
        return 2;
    }
    char why[512];
    if (maco_cuda_device_count(why, sizeof(why)) < 1) {
        printf("SKIP: bench_ep needs a GPU: %s\n", why);
        return 77; /* skipped: docs/tools.md, "Exit statuses" */
    }
    Job j;
    MK(maco_bootstrap_create_from_env(&j.bs));
    MK(maco_comm_create(j.bs, -1, &j.comm));
    MK(maco_comm_get_rank(j.comm, &j.rank));
    MK(maco_comm_get_nranks(j.comm, &j.n));
    int dev = -1, gpu_ranks = 1;
    MK(maco_comm_get_cuda_device(j.comm, &dev));
    MK(maco_comm_get_gpu_ranks(j.comm, &gpu_ranks));
    CK(cudaSetDevice(dev));
    CK(cudaStreamCreateWithFlags(&j.s, cudaStreamNonBlocking));
    if (j.rank == 0) {
        cudaDeviceProp p;
        CK(cudaGetDeviceProperties(&p, dev));
        printf("# bench_ep: %d ranks on %s (%d SMs)%s; hidden %d, %d experts, top-%d, bfloat16, "
               "uniform routing; %d iterations after %d\n",
               j.n, p.name, p.multiProcessorCount,
               gpu_ranks > 1 ? " -- ranks SHARE a GPU: times are not NVLink's" : "", opt.hidden,
               opt.experts, opt.topk, opt.iters, opt.warmup);
    }
    for (maco_ep_mode_t mode : { MACO_EP_LOW_LATENCY, MACO_EP_NORMAL }) {
        bool ll = mode == MACO_EP_LOW_LATENCY;
        if (opt.mode != "both" && opt.mode != (ll ? "ll" : "normal"))
            continue;
        if (j.rank == 0)
            printf("# %s mode, %d tokens per rank\n", ll ? "low latency" : "normal",
                   opt.tokens > 0 ? opt.tokens : (ll ? 128 : 4096));
        RunMode(j, opt, mode);
    }
    cudaStreamDestroy(j.s);
    maco_comm_destroy(j.comm);
    maco_bootstrap_destroy(j.bs);
    return 0;
}
