/*
 * bench_gemm_tile.cu - the persistent kernel's GEMM (one task per tile of C) against cuBLAS on
 * one GPU, with each of its tile implementations (MACO_GEMM_TILE=cublasdx, then gmma: Hopper
 * wgmma through CuTe, where the library has it and the GPU runs it), bf16 in, fp32
 * accumulation, bf16 out, row-major: 4096^3 and two tensor-parallel MLP shapes (hidden 8192, FFN
 * 28672 over 8 ranks, 4096 tokens: the column-parallel up projection 4096 x 3584 x 8192 and the
 * row-parallel down projection 4096 x 8192 x 3584). A benchmark, not a test (docs/performance.md).
 *
 *   usage: bench_gemm_tile [--iters I] [--tiles cublasdx,gmma] [--schedulers S] [--profile]
 *                          [--tile-n 128,256,plan] [--order G,...] [--shapes MxNxK,...]
 * --schedulers S: S scheduler CTAs (the rest of the SMs are workers) instead of the default split.
 * --profile: after the timed calls, one more call with per-task timing, and a line of where the
 * time goes: the median tile (task) time, the span of the launch, how busy the workers were.
 * --tile-n: the tiles to run, each a row of its own: 128 (every tile 128 x 128), 256 (128 x 256),
 * plan (maco_gemm_plan_tiles for the default split's workers: its widths and order; the row says
 * how many narrow tiles it has, "plan128"). Default: all three.
 * --shapes MxNxK,...: the problems instead of the three above (multiples of 128 x 256 x 64).
 * --order G,...: the order of the 128 and 256 tiles, each a row of its own: groups of G tile
 * rows one after the other, inside a group column by column (G = 1: row-major, the default).
 * A "SKIP" row (exit status 0) for each kind of tile the library lacks (built without MathDx);
 * "SKIP:" and exit status 77 without a GPU.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
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

__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = __float2bfloat16_rn(((float)(x & 0xffff) / 65536.0f - 0.5f));
    }
}

/* The tiles in the order the workers take them: "128" or "256" in groups of `group` tile rows,
 * one group after the other, inside a group column by column (`group` 1: row-major); "plan":
 * maco_gemm_plan_tiles for the default split's workers (or all SMs but `schedulers`). */
static bool tile_order(maco_comm_t comm, const std::string &width, int group, int schedulers, int M,
                       int N, std::vector<maco_gemm_tile_t> *order)
{
    const uint32_t rows = (uint32_t)M / MACO_GEMM_TILE_M;
    if (width != "plan") {
        const uint32_t tn = width == "256" ? MACO_GEMM_TILE_N_WIDE : MACO_GEMM_TILE_N;
        const uint32_t cols = (uint32_t)N / tn;
        for (uint32_t g0 = 0; g0 < rows; g0 += (uint32_t)group)
            for (uint32_t c = 0; c < cols; c++)
                for (uint32_t r = g0; r < rows && r < g0 + (uint32_t)group; r++)
                    order->push_back({ r, c, tn });
        return true;
    }
    int ctas = 0;
    maco_comm_get_coresident_ctas(comm, &ctas);
    int workers = ctas - (schedulers != 0 ? schedulers : (ctas / 32 > 1 ? ctas / 32 : 1));
    order->resize((size_t)rows * ((uint32_t)N / MACO_GEMM_TILE_N));
    size_t count = 0;
    if (maco_gemm_plan_tiles((uint32_t)M, (uint32_t)N, workers, order->data(), &count) != MACO_OK) {
        printf("plan: %s\n", maco_log_last_error());
        return false;
    }
    order->resize(count);
    return true;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, nullptr, _IOLBF, 0); /* each row as it is measured, even into a pipe */
    int iters = 20;
    std::vector<std::string> kinds = { "cublasdx", "gmma" };
    std::vector<std::string> widths = { "128", "256", "plan" };
    std::vector<int> groups = { 1 };
    std::vector<std::vector<int>> shapes = { { 4096, 4096, 4096 },
                                             { 4096, 3584, 8192 },
                                             { 4096, 8192, 3584 } };
    int schedulers = 0, profile = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--schedulers") && i + 1 < argc)
            schedulers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--profile"))
            profile = 1;
        else if (!strcmp(argv[i], "--tiles") && i + 1 < argc) {
            kinds.clear();
            for (char *s = strtok(argv[++i], ","); s != nullptr; s = strtok(nullptr, ","))
                kinds.push_back(s);
        } else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) {
            shapes.clear();
            for (char *s = strtok(argv[++i], ","); s != nullptr; s = strtok(nullptr, ",")) {
                int m = 0, n = 0, k = 0;
                if (sscanf(s, "%dx%dx%d", &m, &n, &k) == 3)
                    shapes.push_back({ m, n, k });
            }
        } else if (!strcmp(argv[i], "--order") && i + 1 < argc) {
            groups.clear();
            for (char *s = strtok(argv[++i], ","); s != nullptr; s = strtok(nullptr, ","))
                groups.push_back(atoi(s) > 0 ? atoi(s) : 1);
        } else if (!strcmp(argv[i], "--tile-n") && i + 1 < argc) {
            widths.clear();
            for (char *s = strtok(argv[++i], ","); s != nullptr; s = strtok(nullptr, ","))
                widths.push_back(s);
        }
    }
    char why[400];
    if (maco_cuda_device_count(why, sizeof(why)) < 1) {
        printf("SKIP: no GPU: %s\n", why);
        return 77; /* skipped: docs/tools.md, "Exit statuses" */
    }
    maco_unique_id_t id;
    maco_bootstrap_t bs;
    maco_comm_t comm;
    if (maco_unique_id_create(&id) != MACO_OK ||
        maco_bootstrap_create(&id, 0, 1, -1, &bs) != MACO_OK ||
        maco_comm_create(bs, 0, &comm) != MACO_OK) {
        printf("communicator: %s\n", maco_log_last_error());
        return 2;
    }
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        return 2;
    cublasSetStream(h, stream);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# bench_gemm_tile on %s (%d SMs), bf16 in, fp32 accumulate, bf16 out, %d iterations\n",
           prop.name, prop.multiProcessorCount, iters);
    printf("%6s %6s %6s %8s %-9s %-11s %12s %12s %9s %8s %s\n", "M", "N", "K", "tiles", "tile-impl",
           "width/order", "cuBLAS(TF/s)", "persist(TF/s)", "ratio", "maxrel",
           "split (workers/schedulers)");

    int wrong = 0;
    for (const auto &sh : shapes) {
        int M = sh[0], N = sh[1], K = sh[2];
        __nv_bfloat16 *A, *B, *C1, *C2;
        CK(cudaMalloc(&A, (size_t)M * K * 2));
        CK(cudaMalloc(&B, (size_t)K * N * 2));
        CK(cudaMalloc(&C1, (size_t)M * N * 2));
        CK(cudaMalloc(&C2, (size_t)M * N * 2));
        fill_bf16<<<1024, 256, 0, stream>>>(A, (size_t)M * K, 17u);
        fill_bf16<<<1024, 256, 0, stream>>>(B, (size_t)K * N, 91u);
        CK(cudaStreamSynchronize(stream));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        /* cuBLAS, row-major C = A B as column-major C^T = B^T A^T. */
        float one = 1.0f, zero = 0.0f;
        auto run_cublas = [&]() {
            cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, N, A,
                         CUDA_R_16BF, K, &zero, C1, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
        };
        run_cublas();
        run_cublas();
        CK(cudaEventRecord(e0, stream));
        for (int i = 0; i < iters; i++)
            run_cublas();
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms_cublas = 0;
        CK(cudaEventElapsedTime(&ms_cublas, e0, e1));
        ms_cublas /= (float)iters;

        for (const std::string &kind : kinds)
            for (const std::string &width : widths)
                for (int group : groups) {
                    /* read by maco_persistent_kernel_create */
                    setenv("MACO_GEMM_TILE", kind.c_str(), 1);
                    if ((width == "256" && N % MACO_GEMM_TILE_N_WIDE != 0) ||
                        (width == "plan" && group != groups[0]))
                        continue; /* the plan has its own order */
                    /* Poisoned: every element must be written (0xffff is a bf16 NaN). */
                    CK(cudaMemset(C2, 0xff, (size_t)M * N * 2));
                    maco_task_graph_t g;
                    maco_task_graph_create(&g);
                    std::vector<maco_gemm_tile_t> order;
                    if (!tile_order(comm, width, group, schedulers, M, N, &order))
                        return 2;
                    int narrow = 0;
                    for (const maco_gemm_tile_t &p : order) {
                        maco_task_t t;
                        memset(&t, 0, sizeof(t));
                        t.type = MACO_TASK_GEMM_TILE;
                        t.datatype = MACO_BFLOAT16;
                        t.a = A;
                        t.b = B;
                        t.out = C2 + (size_t)p.tile_row * MACO_GEMM_TILE_M * N +
                                (size_t)p.tile_col * p.tile_n;
                        t.m = (uint32_t)M;
                        t.n = (uint32_t)N;
                        t.k = (uint32_t)K;
                        t.ldc = (uint32_t)N;
                        t.tile_row = p.tile_row;
                        t.tile_col = p.tile_col;
                        t.tile_n = p.tile_n;
                        narrow += p.tile_n == MACO_GEMM_TILE_N;
                        maco_task_graph_add_task(g, &t, nullptr);
                    }
                    const int ntasks = (int)order.size();
                    maco_persistent_config_t want;
                    memset(&want, 0, sizeof(want));
                    want.schedulers = schedulers;
                    want.profile = profile;
                    maco_persistent_kernel_t pk;
                    maco_status_t st = maco_persistent_kernel_create(
                        comm, g, schedulers != 0 || profile ? &want : nullptr, &pk);
                    maco_task_graph_destroy(g);
                    if (st == MACO_ERR_UNSUPPORTED) {
                        printf("SKIP %s: %s\n", kind.c_str(), maco_log_last_error());
                        continue;
                    }
                    if (st != MACO_OK) {
                        printf("create: %s\n", maco_log_last_error());
                        return 2;
                    }
                    maco_persistent_config_t cfg;
                    maco_persistent_kernel_get_config(pk, &cfg);
                    maco_persistent_kernel_launch(pk, stream);
                    maco_persistent_kernel_launch(pk, stream);
                    CK(cudaEventRecord(e0, stream));
                    for (int i = 0; i < iters; i++)
                        maco_persistent_kernel_launch(pk, stream);
                    CK(cudaEventRecord(e1, stream));
                    CK(cudaEventSynchronize(e1));
                    float ms_pk = 0;
                    CK(cudaEventElapsedTime(&ms_pk, e0, e1));
                    ms_pk /= (float)iters;
                    maco_status_t as;
                    maco_comm_get_async_error(comm, &as);
                    if (as != MACO_OK) {
                        printf("async error: %s\n", maco_comm_get_last_error(comm));
                        return 2;
                    }
                    /* Both results: relative difference against the largest |value| (fp32 sums in
                     * different orders, each rounded once to bf16). */
                    std::vector<__nv_bfloat16> h1((size_t)M * N), h2((size_t)M * N);
                    CK(cudaMemcpy(h1.data(), C1, h1.size() * 2, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(h2.data(), C2, h2.size() * 2, cudaMemcpyDeviceToHost));
                    double maxabs = 0, maxdiff = 0;
                    size_t bad = 0; /* NaN: not written (the poison) or not a number */
                    for (size_t i = 0; i < h1.size(); i++) {
                        double a = __bfloat162float(h1[i]), b = __bfloat162float(h2[i]);
                        if (std::isnan(b) || std::isnan(a)) {
                            bad++;
                            continue;
                        }
                        maxabs = fmax(maxabs, fabs(a));
                        maxdiff = fmax(maxdiff, fabs(a - b));
                    }
                    double rel = maxabs > 0 ? maxdiff / maxabs : 0;
                    if (bad != 0) {
                        printf("%zu elements NaN (unwritten?)\n", bad);
                        rel = NAN;
                    }
                    if (!(rel < 2e-2))
                        wrong++;
                    double flops = 2.0 * M * N * (double)K;
                    char wlabel[32];
                    if (width == "plan")
                        snprintf(wlabel, sizeof(wlabel), "plan%d", narrow);
                    else
                        snprintf(wlabel, sizeof(wlabel), "%s/g%d", width.c_str(), group);
                    printf("%6d %6d %6d %8d %-9s %-11s %12.1f %12.1f %8.1f%% %8.1e %d/%d\n", M, N,
                           K, ntasks, kind.c_str(), wlabel, flops / (ms_cublas * 1e-3) / 1e12,
                           flops / (ms_pk * 1e-3) / 1e12, 100.0 * ms_cublas / ms_pk, rel,
                           cfg.workers, cfg.schedulers);
                    if (profile) {
                        /* One more call, then its per-task records: tile times, launch span, and
                         * the workers' busy fraction (sum of tile times over workers x span). */
                        maco_persistent_kernel_launch(pk, stream);
                        CK(cudaStreamSynchronize(stream));
                        std::vector<maco_task_profile_t> rec((size_t)ntasks);
                        if (maco_persistent_kernel_get_profile(pk, rec.data(), rec.size()) ==
                            MACO_OK) {
                            std::vector<double> dur;
                            uint64_t t0 = ~0ull, t1 = 0, first_end = ~0ull;
                            double busy = 0;
                            for (const auto &r : rec) {
                                dur.push_back((double)(r.end_ns - r.start_ns) * 1e-3);
                                busy += dur.back();
                                t0 = r.start_ns < t0 ? r.start_ns : t0;
                                t1 = r.end_ns > t1 ? r.end_ns : t1;
                                first_end = r.end_ns < first_end ? r.end_ns : first_end;
                            }
                            std::vector<double> sorted = dur;
                            std::sort(sorted.begin(), sorted.end());
                            double span = (double)(t1 - t0) * 1e-3;
                            /* When each worker started its last tile, relative to the first start.
                             */
                            std::vector<uint64_t> last_start((size_t)cfg.workers, 0);
                            for (const auto &r : rec)
                                if (r.cta >= 0 && r.cta < cfg.workers &&
                                    r.start_ns > last_start[r.cta])
                                    last_start[r.cta] = r.start_ns;
                            /* The gap on a worker between the end of a tile and the start of its
                             * next one (hand-off, pipeline fill), and the medians of each width. */
                            std::vector<std::vector<std::pair<uint64_t, uint64_t>>> per(
                                (size_t)cfg.workers);
                            std::vector<double> wide_us, narrow_us, gaps;
                            for (size_t i = 0; i < rec.size(); i++) {
                                (order[i].tile_n == MACO_GEMM_TILE_N ? narrow_us : wide_us)
                                    .push_back(dur[i]);
                                if (rec[i].cta >= 0 && rec[i].cta < cfg.workers)
                                    per[rec[i].cta].push_back({ rec[i].start_ns, rec[i].end_ns });
                            }
                            for (auto &w : per) {
                                std::sort(w.begin(), w.end());
                                for (size_t j = 1; j < w.size(); j++)
                                    gaps.push_back((double)(w[j].first - w[j - 1].second) * 1e-3);
                            }
                            auto median = [](std::vector<double> x) {
                                if (x.empty())
                                    return 0.0;
                                std::sort(x.begin(), x.end());
                                return x[x.size() / 2];
                            };
                            printf(
                                "  profile %s %s: tile us min %.1f median %.1f max %.1f (median "
                                "128-wide %.1f, 256-wide %.1f); gap between a worker's tiles "
                                "median "
                                "%.2f us; span %.1f us; workers busy %.1f%%; first tile ends at "
                                "%.1f "
                                "us; last tile starts at %.1f us\n",
                                kind.c_str(), wlabel, sorted.front(), sorted[sorted.size() / 2],
                                sorted.back(), median(narrow_us), median(wide_us), median(gaps),
                                span, 100.0 * busy / (span * cfg.workers),
                                (double)(first_end - t0) * 1e-3,
                                (double)(*std::max_element(last_start.begin(), last_start.end()) -
                                         t0) *
                                    1e-3);
                        }
                    }
                    maco_persistent_kernel_destroy(pk);
                }
        cudaFree(A);
        cudaFree(B);
        cudaFree(C1);
        cudaFree(C2);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cublasDestroy(h);
    maco_comm_destroy(comm);
    maco_bootstrap_destroy(bs);
    printf("%s\n", wrong ? "WRONG RESULTS (persistent GEMM differs from cuBLAS)"
                         : "persistent GEMM matches cuBLAS (max relative difference < 2e-2)");
    return wrong ? 1 : 0;
}
