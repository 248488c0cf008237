/*
 * bench_memory_channel - memory-channel performance between two GPUs. A benchmark, not a test.
 *
 *   maco-run -n 2 build/tests/bench_memory_channel
 *
 * Rank 0 prints three tables:
 *  1. put bandwidth, rank 0 -> rank 1, 1 KiB .. 1 GiB, for 1, 4, 16, 32, 64 and 128 CTAs of
 *     512 threads (each CTA puts a contiguous share), next to cudaMemcpyAsync from the same
 *     local buffer into the same mapped peer buffer (the copy engines; what cudaMemcpyPeer
 *     does). Median of 5 timings, each of enough back-to-back launches to last >= 2 ms.
 *     GB/s = 1e9 bytes/s of payload.
 *  2. signal/wait round trip (rank 0 signals, rank 1 waits and signals back, in one launch,
 *     100000 times), with maco_memory_channel_wait (bounded) and with a bare acquire spin
 *     (no bound), so the cost of the bound shows. One-way latency = round trip / 2.
 *  3. LL16 packet round trip inside one launch (one 16-byte packet each way, 100000 times).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "maco/maco.h"
#include "maco/device/memory_channel.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define MK(call)                                                                                   \
    do {                                                                                           \
        maco_status_t s_ = (call);                                                                 \
        if (s_ != MACO_OK) {                                                                       \
            fprintf(stderr, "%s failed: %s\n", #call, maco_status_string(s_));                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void put_kernel(maco_memory_channel_device_t ch, uint64_t bytes)
{
    uint64_t share = (bytes / gridDim.x + 15) / 16 * 16;
    uint64_t start = share * blockIdx.x;
    if (start >= bytes)
        return;
    uint64_t len = min(share, bytes - start);
    maco_memory_channel_put(&ch, start, start, len, threadIdx.x, blockDim.x);
}

__global__ void ping_pong_kernel(maco_memory_channel_device_t ch, int iters, int initiator,
                                 int bounded, int *status)
{
    int st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++) {
        if (initiator)
            maco_memory_channel_signal(&ch);
        if (bounded) {
            st = maco_memory_channel_wait(&ch);
        } else {
            /* The bare protocol: acquire spin with no timer and no error check. */
            uint64_t want = *ch.semaphore.expected + 1;
            *ch.semaphore.expected = want;
            while (maco_load_acquire_sys_u64(ch.semaphore.inbound) < want) {
            }
        }
        if (!initiator)
            maco_memory_channel_signal(&ch);
    }
    *status = st;
}

__global__ void ll16_ping_pong_kernel(maco_memory_channel_device_t ch, int iters, int initiator,
                                      uint32_t flag0, int *status)
{
    /* Packet slots: [0] rank 0 -> rank 1, [1] rank 1 -> rank 0 (offsets in each buffer). */
    maco_ll16_packet_t *out = (maco_ll16_packet_t *)ch.remote + (initiator ? 0 : 1);
    const maco_ll16_packet_t *in = (const maco_ll16_packet_t *)ch.local + (initiator ? 1 : 0);
    int st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++) {
        uint32_t flag = flag0 + (uint32_t)i;
        uint2 d = make_uint2((uint32_t)i, ~(uint32_t)i);
        if (initiator)
            maco_ll16_store(out, d, flag);
        st = maco_ll16_load(in, flag, &d, &ch.semaphore.bound, ch.semaphore.peer, 0);
        if (st == MACO_OK && (d.x != (uint32_t)i || d.y != ~(uint32_t)i))
            st = MACO_ERR_INTERNAL;
        if (!initiator)
            maco_ll16_store(out, d, flag);
    }
    *status = st;
}

int main(void)
{
    maco_comm_t comm;
    MK(maco_comm_init_from_env(&comm));
    int rank, n, dev;
    maco_comm_get_rank(comm, &rank);
    maco_comm_get_nranks(comm, &n);
    maco_comm_get_cuda_device(comm, &dev);
    if (n != 2) {
        fprintf(stderr, "bench_memory_channel: run with 2 ranks (maco-run -n 2)\n");
        return 2;
    }
    CK(cudaSetDevice(dev));
    maco_bootstrap_t bs;
    maco_comm_get_bootstrap(comm, &bs);
    const size_t kMax = (size_t)1 << 30;
    char *buf;
    CK(cudaMalloc(&buf, kMax));
    CK(cudaMemset(buf, 1, kMax));
    maco_mem_t mine, theirs;
    MK(maco_mem_register(comm, buf, kMax, &mine));
    uint8_t h[2][MACO_MEM_HANDLE_BYTES];
    MK(maco_mem_serialize(mine, h[rank]));
    MK(maco_bootstrap_allgather(bs, h, MACO_MEM_HANDLE_BYTES));
    MK(maco_mem_import(comm, h[1 - rank], &theirs));
    maco_memory_channel_t chan;
    MK(maco_memory_channel_create(comm, 1 - rank, mine, theirs, &chan));
    maco_memory_channel_device_t ch;
    MK(maco_memory_channel_get_device_handle(chan, &ch));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int *status;
    CK(cudaMalloc(&status, sizeof(int)));

    /* 1. Put bandwidth, rank 0 only (rank 1's buffer is the target). */
    const int ctas[] = { 1, 4, 16, 32, 64, 128 };
    const int nctas = sizeof(ctas) / sizeof(ctas[0]);
    if (rank == 0) {
        printf("# put bandwidth rank 0 -> rank 1, GB/s (median of 5); copy = cudaMemcpyAsync into "
               "the mapped peer buffer\n");
        printf("%12s", "size(B)");
        for (int c = 0; c < nctas; c++)
            printf("  %6d CTA", ctas[c]);
        printf("  %10s  %s\n", "copy", "best/copy");
        for (size_t bytes = 1024; bytes <= kMax; bytes *= 4) {
            printf("%12zu", bytes);
            double best = 0;
            for (int c = 0; c <= nctas; c++) {
                int reps = (int)std::max<size_t>(
                    1, std::min<size_t>(10000, (size_t)(4e9 / 1e3) / bytes + 1));
                std::vector<double> gbps;
                for (int t = 0; t < 5; t++) {
                    CK(cudaEventRecord(e0, s));
                    for (int i = 0; i < reps; i++) {
                        if (c < nctas)
                            put_kernel<<<ctas[c], 512, 0, s>>>(ch, bytes);
                        else
                            CK(cudaMemcpyAsync(ch.remote, buf, bytes, cudaMemcpyDeviceToDevice, s));
                    }
                    CK(cudaEventRecord(e1, s));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaGetLastError());
                    float ms = 0;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    gbps.push_back((double)bytes * reps / (ms * 1e-3) / 1e9);
                }
                std::sort(gbps.begin(), gbps.end());
                double med = gbps[2];
                if (c < nctas) {
                    best = std::max(best, med);
                    printf("  %10.2f", med);
                } else {
                    printf("  %10.2f  %9.2f\n", med, best / med);
                }
            }
            fflush(stdout);
        }
    }
    MK(maco_bootstrap_barrier(bs));

    /* 2. Signal/wait round trips, bounded and bare. */
    const int iters = 100000;
    for (int bounded = 1; bounded >= 0; bounded--) {
        MK(maco_bootstrap_barrier(bs));
        CK(cudaEventRecord(e0, s));
        ping_pong_kernel<<<1, 1, 0, s>>>(ch, iters, rank == 0, bounded, status);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        int st = -1;
        CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
        if (rank == 0)
            printf("# signal/wait %s: %d round trips in %.3f ms: %.3f us per round trip, %.3f us "
                   "one way (status %d)\n",
                   bounded ? "maco_memory_channel_wait (bounded)" : "bare acquire spin (no bound)",
                   iters, ms, ms * 1e3 / iters, ms * 1e3 / iters / 2, st);
    }

    /* 3. LL16 round trips in one launch; packets in the first 32 bytes of each buffer. */
    CK(cudaMemset(buf, 0, 64));
    CK(cudaDeviceSynchronize());
    MK(maco_bootstrap_barrier(bs));
    CK(cudaEventRecord(e0, s));
    ll16_ping_pong_kernel<<<1, 1, 0, s>>>(ch, iters, rank == 0, 1u, status);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    int st = -1;
    CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
    if (rank == 0)
        printf("# LL16 packet ping-pong: %d round trips in %.3f ms: %.3f us per round trip "
               "(status %d)\n",
               iters, ms, ms * 1e3 / iters, st);
    MK(maco_bootstrap_barrier(bs));
    maco_memory_channel_destroy(chan);
    maco_mem_deregister(theirs);
    maco_mem_deregister(mine);
    MK(maco_bootstrap_barrier(bs));
    cudaFree(buf);
    maco_comm_destroy(comm);
    return 0;
}
