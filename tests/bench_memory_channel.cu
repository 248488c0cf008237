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
#include <algorithm>
#include <vector>

#include "bench_common.h"
#include "maco/device/memory_channel.h"

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
    bench_pair pr;
    const size_t kMax = (size_t)1 << 30;
    bench_pair_open("bench_memory_channel", kMax, &pr);
    const int rank = pr.rank;
    maco_bootstrap_t bs = pr.bs;
    cudaStream_t s = pr.s;
    maco_memory_channel_t chan;
    MK(maco_memory_channel_create(pr.comm, 1 - rank, pr.mine, pr.theirs, &chan));
    maco_memory_channel_device_t ch;
    MK(maco_memory_channel_get_device_handle(chan, &ch));

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
                    float ms = bench_time_ms(s, [&] {
                        for (int i = 0; i < reps; i++) {
                            if (c < nctas)
                                put_kernel<<<ctas[c], 512, 0, s>>>(ch, bytes);
                            else
                                CK(cudaMemcpyAsync(ch.remote, pr.buf, bytes,
                                                   cudaMemcpyDeviceToDevice, s));
                        }
                    });
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
        float ms = bench_time_ms(
            s, [&] { ping_pong_kernel<<<1, 1, 0, s>>>(ch, iters, rank == 0, bounded, pr.status); });
        int st = bench_pair_status(&pr);
        if (rank == 0)
            printf("# signal/wait %s: %d round trips in %.3f ms: %.3f us per round trip, %.3f us "
                   "one way (status %d)\n",
                   bounded ? "maco_memory_channel_wait (bounded)" : "bare acquire spin (no bound)",
                   iters, ms, ms * 1e3 / iters, ms * 1e3 / iters / 2, st);
    }

    /* 3. LL16 round trips in one launch; packets in the first 32 bytes of each buffer. */
    CK(cudaMemset(pr.buf, 0, 64));
    CK(cudaDeviceSynchronize());
    MK(maco_bootstrap_barrier(bs));
    float ms = bench_time_ms(
        s, [&] { ll16_ping_pong_kernel<<<1, 1, 0, s>>>(ch, iters, rank == 0, 1u, pr.status); });
    int st = bench_pair_status(&pr);
    if (rank == 0)
        printf("# LL16 packet ping-pong: %d round trips in %.3f ms: %.3f us per round trip "
               "(status %d)\n",
               iters, ms, ms * 1e3 / iters, st);
    MK(maco_bootstrap_barrier(bs));
    maco_memory_channel_destroy(chan);
    bench_pair_close(&pr);
    return 0;
}
