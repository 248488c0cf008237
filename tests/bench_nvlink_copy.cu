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
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
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
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                     "%2, [%3];" ::"r"(s),
                     "l"(src + c * kChunk), "r"(kChunk), "r"(b)
                     : "memory");
        mbar_wait(&bar[k], phase[k]);
        phase[k] ^= 1;
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                         dst + c * kChunk),
                     "r"(s), "r"(kChunk)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 256;
    size_t bytes = mib << 20;
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < 2) {
        printf("SKIP: bench_nvlink_copy needs two GPUs (%d visible)\n", ndev);
        return 0;
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
    CK(cudaStreamSynchronize(st));
    printf("PASS bench_nvlink_copy\n");
    return 0;
}
