/*
 * bench_nvlink_copy.cu - how fast a given number of SMs push bytes from this GPU's memory into
 * a peer GPU's over NVLink (one process, peer access), by four methods: 16-byte stores from
 * registers (8 in flight per thread), the same with 512 threads, the bulk copy engine of each
 * SM (TMA: cp.async.bulk global -> shared, then shared -> the peer's global, two 16 KiB stages
 * in flight), and the copy engines (cudaMemcpyPeerAsync, no SM). It sizes the communication
 * workers of the fused operators: how many SMs a link's bandwidth costs. A benchmark, not a
 * test: it prints GB/s (bytes moved / time, median of 10 runs after 3 warm-up runs).
 *   usage: bench_nvlink_copy [MiB per run, default 256]
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "maco/device/persistent.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void copy_regs(uint4 *dst, const uint4 *src, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 8 * stride) {
        uint4 x[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (i + u * stride < n)
                x[u] = src[i + u * stride];
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (i + u * stride < n)
                dst[i + u * stride] = x[u];
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint64_t *bar, uint32_t bytes)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes));
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t phase)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra W;\n}\n" ::"r"(a),
                 "r"(phase));
}
#endif

/* One thread per CTA drives the SM's bulk copy engine: chunks of 16 KiB, two stages. */
__global__ void copy_bulk(char *dst, const char *src, size_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr uint32_t kChunk = 16384;
    __shared__ __align__(128) char buf[2][kChunk];
    __shared__ __align__(8) uint64_t bar[2];
    if (threadIdx.x != 0)
        return;
    mbar_init(&bar[0], 1);
    mbar_init(&bar[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const size_t nchunks = bytes / kChunk;
    uint32_t phase[2] = { 0, 0 };
    int k = 0;
    for (size_t c = blockIdx.x; c < nchunks; c += gridDim.x, k ^= 1) {
        /* The stage's last store has read its shared memory: at most one group pending. */
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        uint32_t s = (uint32_t)__cvta_generic_to_shared(buf[k]);
        uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar[k]);
        mbar_expect(&bar[k], kChunk);
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
            "%2, [%3];" ::"r"(s),
            "l"(src + c * kChunk), "r"(kChunk), "r"(b)
            : "memory");
        mbar_wait(&bar[k], phase[k]);
        phase[k] ^= 1;
        asm volatile(
            "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + c * kChunk),
            "r"(s), "r"(kChunk)
            : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

/* The persistent runtime's SUM and COPY task loops as the fused operators use them, one CTA of
 * 256 threads (a communication worker's consumers): `tiles` tasks one after another, task i on
 * tile i (128 rows of `cols` elements, row stride ld) of its inputs and output. */
__global__ void task_loop(maco_pk_view_t v, maco_pk_task_t t, int tiles, uint64_t tile_bytes)
{
    for (int i = 0; i < tiles; i++) {
        maco_pk_task_t u = t;
        u.ptr[0] += i * tile_bytes;
        u.ptr[1] += i * tile_bytes;
        (void)maco__pk_execute(&v, &u, 0, 0, 0, threadIdx.x, blockDim.x);
        __syncthreads();
    }
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 256;
    size_t bytes = mib << 20;
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < 2) {
        printf("SKIP: bench_nvlink_copy needs two GPUs (%d visible)\n", ndev);
        return 77; /* skipped: docs/tools.md, "Exit statuses" */
    }
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, 0, 1));
    printf("GPU 0 -> GPU 1, %zu MiB per run, peer access %s\n", mib, can ? "yes" : "NO");
    CK(cudaSetDevice(1));
    char *dst;
    CK(cudaMalloc(&dst, bytes));
    CK(cudaSetDevice(0));
    cudaDeviceEnablePeerAccess(1, 0);
    cudaGetLastError();
    char *src, *local;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&local, bytes));
    CK(cudaMemset(src, 1, bytes));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    auto timeit = [&](auto fn) {
        for (int i = 0; i < 3; i++)
            fn();
        std::vector<float> ms;
        for (int i = 0; i < 10; i++) {
            CK(cudaEventRecord(a, st));
            fn();
            CK(cudaEventRecord(b, st));
            CK(cudaEventSynchronize(b));
            float t;
            CK(cudaEventElapsedTime(&t, a, b));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        return bytes / (ms[5] * 1e-3) / 1e9;
    };
    printf("%-28s", "method \\ SMs");
    const int ctas[] = { 1, 4, 8, 16, 24, 32, 48, 64, 132 };
    for (int c : ctas)
        printf("%8d", c);
    printf("\n");
    for (int threads : { 256, 512 }) {
        printf("stores, %4d threads, remote", threads);
        for (int c : ctas)
            printf("%8.1f", timeit([&] {
                       copy_regs<<<c, threads, 0, st>>>((uint4 *)dst, (const uint4 *)src,
                                                        bytes / 16);
                   }));
        printf("\n");
    }
    printf("%-28s", "stores, 256 threads, local");
    for (int c : ctas)
        printf("%8.1f", timeit([&] {
                   copy_regs<<<c, 256, 0, st>>>((uint4 *)local, (const uint4 *)src, bytes / 16);
               }));
    printf("\n%-28s", "bulk copy (TMA), remote");
    for (int c : ctas)
        printf("%8.1f", timeit([&] { copy_bulk<<<c, 32, 0, st>>>(dst, src, bytes); }));
    CK(cudaGetLastError());
    printf("\n%-28s%8.1f  (no SM)\n", "copy engine (memcpyPeer)",
           timeit([&] { CK(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, st)); }));
    /* Task loops: 64 tiles of 128 x 128 bf16 in a row-major matrix of 8192 columns. */
    {
        const uint64_t ld = 8192, cols = 128, tile = cols * 2, rows = 128, tiles = 64;
        const uint64_t slot = rows * ld * 2; /* one input: 128 rows of the matrix */
        maco_memory_channel_device_t ch[3];
        memset(ch, 0, sizeof(ch));
        for (auto &c : ch) {
            c.local = local; /* the output, this GPU */
            c.remote = dst;  /* its twin on the peer */
            c.local_bytes = c.remote_bytes = bytes;
        }
        maco_pk_sync_t sync;
        memset(&sync, 0, sizeof(sync));
        sync.out_first = 0;
        sync.out_count = 3;
        void *dch, *dsync;
        CK(cudaMalloc(&dch, sizeof(ch)));
        CK(cudaMalloc(&dsync, sizeof(sync)));
        CK(cudaMemcpy(dch, ch, sizeof(ch), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dsync, &sync, sizeof(sync), cudaMemcpyHostToDevice));
        maco_pk_view_t v;
        memset(&v, 0, sizeof(v));
        v.channels = (const maco_memory_channel_device_t *)dch;
        maco_pk_task_t t;
        memset(&t, 0, sizeof(t));
        t.dtype = 7; /* bf16 */
        t.count = cols;
        t.ptr[3] = rows | ld << 16 | ld << 40;
        size_t moved_in = 0, moved_out = 0;
        auto run = [&](const char *what, int type, int nin, bool mirrors) {
            t.type = (uint16_t)type;
            t.ptr[0] = (uint64_t)(uintptr_t)local;
            t.ptr[1] = (uint64_t)(uintptr_t)src;
            if (type == MACO_PK_SUM) {
                t.aux = (uint32_t)nin;
                t.ptr[2] = slot * 2; /* inputs 2 slots apart */
            } else {
                t.count = tile; /* COPY: bytes per row; strides in bytes */
                t.ptr[3] = rows | (ld * 2) << 16 | (ld * 2) << 40;
            }
            v.sync = mirrors ? (const maco_pk_sync_t *)dsync : nullptr;
            moved_in = (type == MACO_PK_SUM ? nin : 1) * rows * tile * tiles;
            moved_out = (mirrors ? 4 : 1) * rows * tile * tiles;
            for (int i = 0; i < 3; i++)
                task_loop<<<1, 256, 0, st>>>(v, t, (int)tiles, tile);
            CK(cudaStreamSynchronize(st));
            CK(cudaEventRecord(a, st));
            task_loop<<<1, 256, 0, st>>>(v, t, (int)tiles, tile);
            CK(cudaEventRecord(b, st));
            CK(cudaEventSynchronize(b));
            CK(cudaGetLastError());
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            printf("%-44s %7.2f us per tile, %6.1f GB/s in, %6.1f GB/s out\n", what,
                   ms * 1e3 / tiles, moved_in / (ms * 1e-3) / 1e9, moved_out / (ms * 1e-3) / 1e9);
        };
        printf("task loops, one CTA of 256 threads, 128 x 128 bf16 tiles (ld 8192):\n");
        run("SUM of 4, local out", MACO_PK_SUM, 4, false);
        run("SUM of 4, local out + 3 peer mirrors", MACO_PK_SUM, 4, true);
        run("COPY 2D tile, local", MACO_PK_COPY, 1, false);
        run("COPY 2D tile, local + 3 peer mirrors", MACO_PK_COPY, 1, true);
    }
    CK(cudaStreamSynchronize(st));
    printf("PASS bench_nvlink_copy\n");
    return 0;
}
