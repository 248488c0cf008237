/*
 * bench_gemm_tile.cu - the persistent kernel's GEMM (one task per tile of C) against cuBLAS on
 * one GPU, with each of its tile implementations (MACO_GEMM_TILE=cublasdx, then gmma: Hopper
 * wgmma through CuTe, where the library has it and the GPU runs it), bf16 in, fp32
 * accumulation, bf16 out, row-major: 4096^3 and two tensor-parallel MLP shapes (hidden 8192, FFN
 * 28672 over 8 ranks, 4096 tokens: the column-parallel up projection 4096 x 3584 x 8192 and the
 * row-parallel down projection 4096 x 8192 x 3584). A benchmark, not a test (docs/performance.md).
 * Each row compares the tiles with cuBLAS on the whole GPU and with cuBLASLt held to the SMs the
 * tiles' workers get (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = the workers).
 *
 *   usage: bench_gemm_tile [--iters I] [--tiles cublasdx,gmma] [--schedulers S] [--profile]
 *                          [--tile-n 128,256,plan] [--order G,...] [--shapes MxNxK,...]
 *                          [--sets tp,llama70b] [--world W] [--sizes M,...] [--out bf16,fp32]
 * --sets: instead of the three shapes above, the per-rank GEMMs of tests/python/bench_fused.py's
 * shape sets over W ranks (--world, default 4) for each M of --sizes (default 128,1024,4096,8192):
 * tp (hidden 8192: M x 8192 x 8192/W for GEMM + allreduce and + reduce-scatter, M x 8192/W x
 * 8192 for allgather + GEMM) and llama70b (Llama-3-70B, hidden 8192, MLP 28672: allgather + GEMM
 * M x 28672/W x 8192, GEMM + reduce-scatter M x 8192 x 28672/W). Repeated shapes run once.
 * --out: the output types, each a row of its own (bf16 default; fp32: fp32 out, as the fused
 * operators' out_type MACO_FLOAT32).
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
#include <cublasLt.h>
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

/* cuBLASLt for row-major C = A B (as column-major C^T = B^T A^T), bf16 in, fp32 accumulate,
 * out_type out, with the SM-count target `sms` (0: the whole GPU). The algorithm is the
 * heuristic's first for that target. */
struct LtGemm {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool ok = false;
};

static bool lt_setup(cublasLtHandle_t lt, LtGemm *g, int M, int N, int K, cudaDataType_t out_type,
                     int sms, size_t workspace)
{
    if (cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        return false;
    int32_t target = sms;
    if (sms > 0 && cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                  &target, sizeof(target)) != CUBLAS_STATUS_SUCCESS)
        return false;
    /* column-major: B^T is N x K (ld N), A^T is K x M (ld K), C^T is N x M (ld N) */
    if (cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, N, K, N) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, K, M, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&g->lc, out_type, N, M, N) != CUBLAS_STATUS_SUCCESS)
        return false;
    cublasLtMatmulPreference_t pref;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS)
        return false;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof(workspace));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, g->desc, g->la, g->lb, g->lc, g->lc,
                                                       pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1)
        return false;
    g->algo = res.algo;
    g->ok = true;
    return true;
}

static void lt_destroy(LtGemm *g)
{
    if (g->desc)
        cublasLtMatmulDescDestroy(g->desc);
    if (g->la)
        cublasLtMatrixLayoutDestroy(g->la);
    if (g->lb)
        cublasLtMatrixLayoutDestroy(g->lb);
    if (g->lc)
        cublasLtMatrixLayoutDestroy(g->lc);
    *g = LtGemm();
}

/* The per-rank GEMMs (M, N, K) of bench_fused.py's shape sets over `world` ranks. */
static void set_shapes(const std::vector<std::string> &sets, int world, const std::vector<int> &ms,
                       std::vector<std::vector<int>> *shapes)
{
    const int hidden = 8192, mlp = 28672;
    for (int m : ms)
        for (const std::string &set : sets) {
            std::vector<std::vector<int>> add;
            if (set == "tp")
                add = { { m, hidden, hidden / world }, { m, hidden / world, hidden } };
            else if (set == "llama70b")
                add = { { m, mlp / world, hidden }, { m, hidden, mlp / world } };
            else
                fprintf(stderr, "--sets: unknown set %s (tp, llama70b)\n", set.c_str());
            for (const auto &sh : add)
                if (std::find(shapes->begin(), shapes->end(), sh) == shapes->end())
                    shapes->push_back(sh);
        }
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
    std::vector<std::string> sets, outs = { "bf16" };
    std::vector<int> sizes = { 128, 1024, 4096, 8192 };
    int world = 4;
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
        } else if (!strcmp(argv[i], "--sets") && i + 1 < argc) {
            for (char *s = strtok(argv[++i], ","); s != nullptr; s = strtok(nullptr, ","))
                sets.push_back(s);
        } else if (!strcmp(argv[i], "--world") && i + 1 < argc) {
            world = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            sizes.clear();
            for (char *s = strtok(argv[++i], ","); s != nullptr; s = strtok(nullptr, ","))
                sizes.push_back(atoi(s));
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            outs.clear();
            for (char *s = strtok(argv[++i], ","); s != nullptr; s = strtok(nullptr, ","))
                outs.push_back(s);
        } else if (!strcmp(argv[i], "--tile-n") && i + 1 < argc) {
            widths.clear();
            for (char *s = strtok(argv[++i], ","); s != nullptr; s = strtok(nullptr, ","))
                widths.push_back(s);
        }
    }
    if (world < 1 || 8192 % world != 0 || 28672 % world != 0) {
        fprintf(stderr, "--world %d: must divide 8192 and 28672 (1, 2, 4, 8, ...)\n", world);
        return 2;
    }
    if (!sets.empty()) {
        shapes.clear();
        set_shapes(sets, world, sizes, &shapes);
    }
    for (const std::string &o : outs)
        if (o != "bf16" && o != "fp32") {
            fprintf(stderr, "--out %s: bf16 or fp32\n", o.c_str());
            return 2;
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
    cublasLtHandle_t lt;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS)
        return 2;
    cublasSetStream(h, stream);
    const size_t lt_workspace = 32u << 20;
    void *lt_ws;
    CK(cudaMalloc(&lt_ws, lt_workspace));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# bench_gemm_tile on %s (%d SMs), bf16 in, fp32 accumulate, %d iterations; TF/s of "
           "cuBLAS on the whole GPU, of cuBLASLt held to the workers' SMs (SM target), of the "
           "tiles; ratios: cuBLAS time / tiles' time\n",
           prop.name, prop.multiProcessorCount, iters);
    printf("%6s %6s %6s %4s %8s %-9s %-11s %9s %9s %9s %7s %7s %8s %s\n", "M", "N", "K", "out",
           "tiles", "tile-impl", "width/order", "cuBLAS", "cuBLAS-SM", "tiles", "vsAll", "vsSM",
           "maxrel", "split (workers/schedulers)");

    int wrong = 0;
    for (const auto &sh : shapes)
        for (const std::string &otype : outs) {
            const int M = sh[0], N = sh[1], K = sh[2];
            const bool f32 = otype == "fp32";
            const size_t esz = f32 ? 4 : 2;
            const cudaDataType_t cuda_out = f32 ? CUDA_R_32F : CUDA_R_16BF;
            if (M % MACO_GEMM_TILE_M != 0 || N % MACO_GEMM_TILE_N != 0 || K % 64 != 0) {
                printf("%6d %6d %6d: not a multiple of 128 x 128 x 64, skipped\n", M, N, K);
                continue;
            }
            __nv_bfloat16 *A, *B;
            char *C1, *C2;
            CK(cudaMalloc(&A, (size_t)M * K * 2));
            CK(cudaMalloc(&B, (size_t)K * N * 2));
            CK(cudaMalloc(&C1, (size_t)M * N * esz));
            CK(cudaMalloc(&C2, (size_t)M * N * esz));
            fill_bf16<<<1024, 256, 0, stream>>>(A, (size_t)M * K, 17u);
            fill_bf16<<<1024, 256, 0, stream>>>(B, (size_t)K * N, 91u);
            CK(cudaStreamSynchronize(stream));
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            /* The mean time of `iters` calls after two untimed ones (ms). */
            auto time_ms = [&](const auto &call) {
                call();
                call();
                CK(cudaEventRecord(e0, stream));
                for (int i = 0; i < iters; i++)
                    call();
                CK(cudaEventRecord(e1, stream));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                return ms / (float)iters;
            };
            /* cuBLAS, row-major C = A B as column-major C^T = B^T A^T. */
            float one = 1.0f, zero = 0.0f;
            const float ms_cublas = time_ms([&]() {
                cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, N, A,
                             CUDA_R_16BF, K, &zero, C1, cuda_out, N, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT);
            });
            const double flops = 2.0 * M * N * (double)K;
            /* cuBLASLt at each SM target met, by the workers' count */
            std::vector<std::pair<int, float>> sm_limited;

            for (const std::string &kind : kinds)
                for (const std::string &width : widths)
                    for (int group : groups) {
                        /* read by maco_persistent_kernel_create */
                        setenv("MACO_GEMM_TILE", kind.c_str(), 1);
                        if ((width == "256" && N % MACO_GEMM_TILE_N_WIDE != 0) ||
                            (width == "plan" && group != groups[0]))
                            continue; /* the plan has its own order */
                        /* Poisoned: every element must be written (0xffff.. is a NaN). */
                        CK(cudaMemset(C2, 0xff, (size_t)M * N * esz));
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
                            t.datatype = f32 ? MACO_FLOAT32 : MACO_BFLOAT16;
                            t.a = A;
                            t.b = B;
                            t.out = C2 + ((size_t)p.tile_row * MACO_GEMM_TILE_M * N +
                                          (size_t)p.tile_col * p.tile_n) *
                                             esz;
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
                        const float ms_pk =
                            time_ms([&]() { maco_persistent_kernel_launch(pk, stream); });
                        maco_status_t as;
                        maco_comm_get_async_error(comm, &as);
                        if (as != MACO_OK) {
                            printf("async error: %s\n", maco_comm_get_last_error(comm));
                            return 2;
                        }
                        /* cuBLASLt held to the workers' SMs (once per worker count). */
                        float ms_sm = -1;
                        for (const auto &e : sm_limited)
                            if (e.first == cfg.workers)
                                ms_sm = e.second;
                        if (ms_sm < 0) {
                            LtGemm lg;
                            if (lt_setup(lt, &lg, M, N, K, cuda_out, cfg.workers, lt_workspace))
                                ms_sm = time_ms([&]() {
                                    cublasLtMatmul(lt, lg.desc, &one, B, lg.la, A, lg.lb, &zero, C1,
                                                   lg.lc, C1, lg.lc, &lg.algo, lt_ws, lt_workspace,
                                                   stream);
                                });
                            else
                                ms_sm = 0; /* no algorithm for that target */
                            lt_destroy(&lg);
                            sm_limited.push_back({ cfg.workers, ms_sm });
                        }
                        /* C1 again from cublasGemmEx: the reference for this row. */
                        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, N,
                                     A, CUDA_R_16BF, K, &zero, C1, cuda_out, N, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
                        /* Both results: relative difference against the largest |value| (fp32
                         * sums in different orders, each rounded once to the output type). */
                        const size_t count = (size_t)M * N;
                        std::vector<char> h1(count * esz), h2(count * esz);
                        CK(cudaMemcpy(h1.data(), C1, h1.size(), cudaMemcpyDeviceToHost));
                        CK(cudaMemcpy(h2.data(), C2, h2.size(), cudaMemcpyDeviceToHost));
                        auto at = [&](const std::vector<char> &v, size_t i) -> double {
                            if (f32)
                                return ((const float *)v.data())[i];
                            return __bfloat162float(((const __nv_bfloat16 *)v.data())[i]);
                        };
                        double maxabs = 0, maxdiff = 0;
                        size_t bad = 0; /* NaN: not written (the poison) or not a number */
                        for (size_t i = 0; i < count; i++) {
                            double a = at(h1, i), b = at(h2, i);
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
                        char wlabel[32];
                        if (width == "plan")
                            snprintf(wlabel, sizeof(wlabel), "plan%d", narrow);
                        else
                            snprintf(wlabel, sizeof(wlabel), "%s/g%d", width.c_str(), group);
                        auto tfs = [&](float ms) {
                            return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0;
                        };
                        printf("%6d %6d %6d %4s %8d %-9s %-11s %9.1f %9.1f %9.1f %6.1f%% %6.1f%% "
                               "%8.1e %d/%d\n",
                               M, N, K, otype.c_str(), ntasks, kind.c_str(), wlabel, tfs(ms_cublas),
                               tfs(ms_sm), tfs(ms_pk), 100.0 * ms_cublas / ms_pk,
                               ms_sm > 0 ? 100.0 * ms_sm / ms_pk : 0.0, rel, cfg.workers,
                               cfg.schedulers);
                        if (profile) {
                            /* One more call, then its per-task records: tile times, launch span,
                             * and the workers' busy fraction (sum of tile times over workers x
                             * span). */
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
                                /* When each worker started its last tile, relative to the first
                                 * start.
                                 */
                                std::vector<uint64_t> last_start((size_t)cfg.workers, 0);
                                for (const auto &r : rec)
                                    if (r.cta >= 0 && r.cta < cfg.workers &&
                                        r.start_ns > last_start[r.cta])
                                        last_start[r.cta] = r.start_ns;
                                /* The gap on a worker between the end of a tile and the start of
                                 * its next one (hand-off, pipeline fill), and the medians of each
                                 * width. */
                                std::vector<std::vector<std::pair<uint64_t, uint64_t>>> per(
                                    (size_t)cfg.workers);
                                std::vector<double> wide_us, narrow_us, gaps;
                                for (size_t i = 0; i < rec.size(); i++) {
                                    (order[i].tile_n == MACO_GEMM_TILE_N ? narrow_us : wide_us)
                                        .push_back(dur[i]);
                                    if (rec[i].cta >= 0 && rec[i].cta < cfg.workers)
                                        per[rec[i].cta].push_back(
                                            { rec[i].start_ns, rec[i].end_ns });
                                }
                                for (auto &w : per) {
                                    std::sort(w.begin(), w.end());
                                    for (size_t j = 1; j < w.size(); j++)
                                        gaps.push_back((double)(w[j].first - w[j - 1].second) *
                                                       1e-3);
                                }
                                auto median = [](std::vector<double> x) {
                                    if (x.empty())
                                        return 0.0;
                                    std::sort(x.begin(), x.end());
                                    return x[x.size() / 2];
                                };
                                printf(
                                    "  profile %s %s: tile us min %.1f median %.1f max %.1f "
                                    "(median "
                                    "128-wide %.1f, 256-wide %.1f); gap between a worker's tiles "
                                    "median "
                                    "%.2f us; span %.1f us; workers busy %.1f%%; first tile ends "
                                    "at "
                                    "%.1f "
                                    "us; last tile starts at %.1f us\n",
                                    kind.c_str(), wlabel, sorted.front(), sorted[sorted.size() / 2],
                                    sorted.back(), median(narrow_us), median(wide_us), median(gaps),
                                    span, 100.0 * busy / (span * cfg.workers),
                                    (double)(first_end - t0) * 1e-3,
                                    (double)(*std::max_element(last_start.begin(),
                                                               last_start.end()) -
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
    cudaFree(lt_ws);
    cublasLtDestroy(lt);
    cublasDestroy(h);
    maco_comm_destroy(comm);
    maco_bootstrap_destroy(bs);
    printf("%s\n", wrong ? "WRONG RESULTS (persistent GEMM differs from cuBLAS)"
                         : "persistent GEMM matches cuBLAS (max relative difference < 2e-2)");
    return wrong ? 1 : 0;
}
