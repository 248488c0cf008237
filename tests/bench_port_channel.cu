/*
 * bench_port_channel - port channels (CUDA copy transport) between two GPUs. A benchmark,
 * not a test.
 *
 *   maco-run -n 2 build/tests/bench_port_channel
 *
 * Rank 0 prints:
 *  1. FIFO round trip: one GPU thread pushes a flush trigger and waits until the proxy has
 *     taken it and published the flush as done (no copy outstanding), 20000 times in one
 *     launch; time per round trip.
 *  2. put_with_signal ping-pong: rank 0 puts 8 bytes with a signal and waits for rank 1's
 *     put_with_signal back, 10000 round trips in one launch.
 *  3. bandwidth rank 0 -> rank 1, 1 KiB .. 1 GiB: one GPU thread pushes put + flush per
 *     iteration (the proxy's copy through the copy engines), against cudaMemcpyAsync of the
 *     same bytes into the same mapped peer buffer (what cudaMemcpyPeer does). Median of 5.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "maco/maco.h"

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

__global__ void fifo_round_trip(maco_port_channel_device_t ch, int iters, int *status)
{
    maco_status_t st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++)
        st = maco_port_channel_flush(&ch);
    *status = st;
}

__global__ void ping_pong(maco_port_channel_device_t ch, int iters, int initiator, int *status)
{
    maco_status_t st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++) {
        if (initiator)
            st = maco_port_channel_put_with_signal(&ch, 0, 0, 8);
        if (st == MACO_OK)
            st = maco_port_channel_wait(&ch);
        if (!initiator && st == MACO_OK)
            st = maco_port_channel_put_with_signal(&ch, 0, 0, 8);
    }
    *status = st;
}

__global__ void put_flush(maco_port_channel_device_t ch, uint64_t bytes, int reps, int *status)
{
    maco_status_t st = MACO_OK;
    for (int i = 0; i < reps && st == MACO_OK; i++) {
        st = maco_port_channel_put(&ch, 0, 0, bytes);
        if (st == MACO_OK)
            st = maco_port_channel_flush(&ch);
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
        fprintf(stderr, "bench_port_channel: run with 2 ranks (maco-run -n 2)\n");
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
    void *peer_ptr = nullptr;
    MK(maco_mem_get_pointer(theirs, &peer_ptr));
    maco_proxy_t proxy;
    MK(maco_proxy_create(comm, &proxy));
    MK(maco_proxy_start(proxy));
    maco_port_channel_t chan;
    MK(maco_port_channel_create(proxy, 1 - rank, MACO_TRANSPORT_CUDA_COPY, mine, theirs, &chan));
    maco_port_channel_device_t ch;
    MK(maco_port_channel_get_device_handle(chan, &ch));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int *status;
    CK(cudaMalloc(&status, sizeof(int)));
    int st = -1;
    float ms = 0;

    if (rank == 0) {
        const int iters = 20000;
        CK(cudaEventRecord(e0, s));
        fifo_round_trip<<<1, 1, 0, s>>>(ch, iters, status);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
        printf("# FIFO round trip (push a flush, proxy takes it, GPU sees it done): %d in %.3f ms: "
               "%.3f us each (status %d)\n",
               iters, ms, ms * 1e3 / iters, st);
    }
    MK(maco_bootstrap_barrier(bs));
    {
        const int iters = 10000;
        CK(cudaEventRecord(e0, s));
        ping_pong<<<1, 1, 0, s>>>(ch, iters, rank == 0, status);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
        if (rank == 0)
            printf(
                "# put_with_signal ping-pong (8 bytes each way): %d round trips in %.3f ms: %.3f "
                "us per round trip (status %d)\n",
                iters, ms, ms * 1e3 / iters, st);
    }
    MK(maco_bootstrap_barrier(bs));
    if (rank == 0) {
        printf("# bandwidth rank 0 -> rank 1, GB/s (median of 5): port = put + flush per "
               "iteration; copy = cudaMemcpyAsync into the mapped peer buffer\n");
        printf("%12s %10s %10s %8s\n", "size(B)", "port", "copy", "port/copy");
        for (size_t bytes = 1024; bytes <= kMax; bytes *= 4) {
            int reps =
                (int)std::max<size_t>(1, std::min<size_t>(2000, (size_t)4000000000ull / bytes + 1));
            double res[2];
            for (int k = 0; k < 2; k++) {
                std::vector<double> gbps;
                for (int t = 0; t < 5; t++) {
                    CK(cudaEventRecord(e0, s));
                    if (k == 0) {
                        put_flush<<<1, 1, 0, s>>>(ch, bytes, reps, status);
                    } else {
                        for (int i = 0; i < reps; i++)
                            CK(cudaMemcpyAsync(peer_ptr, buf, bytes, cudaMemcpyDefault, s));
                    }
                    CK(cudaEventRecord(e1, s));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    gbps.push_back((double)bytes * reps / (ms * 1e-3) / 1e9);
                }
                std::sort(gbps.begin(), gbps.end());
                res[k] = gbps[2];
            }
            CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
            printf("%12zu %10.2f %10.2f %8.2f%s\n", bytes, res[0], res[1], res[0] / res[1],
                   st == MACO_OK ? "" : "  (a put_flush failed)");
            fflush(stdout);
        }
    }
    MK(maco_bootstrap_barrier(bs));
    MK(maco_proxy_stop(proxy));
    maco_port_channel_destroy(chan);
    maco_proxy_destroy(proxy);
    maco_mem_deregister(theirs);
    maco_mem_deregister(mine);
    MK(maco_bootstrap_barrier(bs));
    cudaFree(buf);
    maco_comm_destroy(comm);
    return 0;
}
