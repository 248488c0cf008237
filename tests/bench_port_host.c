/*
 * bench_port_host - port-channel bandwidth and latency between two ranks with host memory,
 * over whichever transport the channel gets (MACO_TRANSPORT: host, tcp, ib; auto picks by
 * topology). Only the public API. A benchmark, not a test: rank 0 prints the numbers.
 *
 *   maco-run -n 2 build/tests/bench_port_host [MIN_BYTES [MAX_BYTES [LAT_ITERS]]]
 *
 * Bandwidth, for each size from MIN_BYTES (default 1 MiB) to MAX_BYTES (default 64 MiB),
 * doubling: rank 0 puts the size ITERS times back to back to the same destination (as
 * ib_write_bw does) with a signal on the last; rank 1 waits for it and signals back. The
 * time runs on rank 0 from the first put to that answer (one round trip of overhead), after
 * one warm-up round; ITERS gives each size about 64 MiB (at least 2). MB/s is 10^6 bytes per
 * second, MiB/s 2^20 (perftest's "MB/sec").
 *
 * Latency: LAT_ITERS (default 1000) round trips of an 8-byte put with a signal, rank 0 to
 * rank 1 and back; one-way latency is half a round trip, as ib_write_lat reports it. Then
 * LAT_ITERS 8-byte puts each followed by a flush on rank 0 alone (the flush returns once the
 * data is in the peer's memory: for IB, the write's completion).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "maco/maco.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        maco_status_t st_ = (call);                                                                \
        if (st_ != MACO_OK) {                                                                      \
            fprintf(stderr, "bench_port_host: %s failed: %s\n", #call, maco_status_string(st_));   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *transport_name(maco_transport_t t)
{
    switch (t) {
    case MACO_TRANSPORT_CUDA_COPY:
        return "cuda";
    case MACO_TRANSPORT_HOST_MEMORY:
        return "host";
    case MACO_TRANSPORT_IB:
        return "ib";
    case MACO_TRANSPORT_TCP:
        return "tcp";
    default:
        return "?";
    }
}

int main(int argc, char **argv)
{
    size_t min = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : (size_t)1 << 20;
    size_t max = argc > 2 ? (size_t)strtoull(argv[2], NULL, 0) : (size_t)64 << 20;
    int lat_iters = argc > 3 ? atoi(argv[3]) : 1000;
    if (min < 8 || max < min || lat_iters < 1) {
        fprintf(stderr, "usage: bench_port_host [MIN_BYTES >= 8 [MAX_BYTES [LAT_ITERS]]]\n");
        return 2;
    }
    maco_bootstrap_t bs;
    CHECK(maco_bootstrap_create_from_env(&bs));
    int rank, n;
    maco_bootstrap_get_rank(bs, &rank);
    maco_bootstrap_get_nranks(bs, &n);
    if (n != 2) {
        fprintf(stderr, "bench_port_host: run it with 2 ranks (maco-run -n 2), not %d\n", n);
        return 2;
    }
    int peer = 1 - rank;
    maco_comm_t comm;
    CHECK(maco_comm_create(bs, -1, &comm));
    void *buf = NULL;
    CHECK(maco_mem_alloc_host(comm, max, &buf));
    memset(buf, rank + 1, max);
    maco_mem_t mine, theirs;
    CHECK(maco_mem_register(comm, buf, max, &mine));
    uint8_t *h = (uint8_t *)calloc(2, MACO_MEM_HANDLE_BYTES);
    CHECK(maco_mem_serialize(mine, h + (size_t)rank * MACO_MEM_HANDLE_BYTES));
    CHECK(maco_bootstrap_allgather(bs, h, MACO_MEM_HANDLE_BYTES));
    CHECK(maco_mem_import(comm, h + (size_t)peer * MACO_MEM_HANDLE_BYTES, &theirs));
    maco_proxy_t proxy;
    maco_port_channel_t ch;
    CHECK(maco_proxy_create(comm, &proxy));
    CHECK(maco_proxy_start(proxy));
    CHECK(maco_port_channel_create(proxy, peer, MACO_TRANSPORT_AUTO, mine, theirs, &ch));
    maco_transport_t t = MACO_TRANSPORT_AUTO;
    CHECK(maco_port_channel_get_transport(ch, &t));
    CHECK(maco_bootstrap_barrier(bs));
    const int64_t wait_ms = 120000;

    if (rank == 0)
        printf("# bench_port_host: 2 ranks, host memory, transport %s\n"
               "# %12s %6s %12s %10s %10s\n",
               transport_name(t), "bytes", "iters", "time_us", "MB/s", "MiB/s");
    for (size_t size = min; size <= max; size *= 2) {
        int iters = (int)(((size_t)64 << 20) / size);
        if (iters < 2)
            iters = 2;
        double best = 0;
        for (int round = 0; round < 2; round++) { /* round 0 warms up */
            CHECK(maco_bootstrap_barrier(bs));
            if (rank == 0) {
                double t0 = now_us();
                for (int i = 0; i + 1 < iters; i++)
                    CHECK(maco_port_channel_put(ch, 0, 0, size));
                CHECK(maco_port_channel_put_with_signal(ch, 0, 0, size));
                CHECK(maco_port_channel_wait(ch, wait_ms));
                best = now_us() - t0;
            } else {
                CHECK(maco_port_channel_wait(ch, wait_ms));
                CHECK(maco_port_channel_signal(ch));
            }
        }
        if (rank == 0) {
            double bytes = (double)size * iters;
            printf("  %12zu %6d %12.0f %10.1f %10.1f\n", size, iters, best, bytes / best,
                   bytes / best * 1e6 / 1048576.0);
            fflush(stdout);
        }
        if (size > max / 2)
            break;
    }

    double *rtt = (double *)calloc((size_t)lat_iters, sizeof(double));
    CHECK(maco_bootstrap_barrier(bs));
    for (int i = -10; i < lat_iters; i++) { /* 10 warm-up round trips */
        if (rank == 0) {
            double t0 = now_us();
            CHECK(maco_port_channel_put_with_signal(ch, 0, 0, 8));
            CHECK(maco_port_channel_wait(ch, wait_ms));
            if (i >= 0)
                rtt[i] = now_us() - t0;
        } else {
            CHECK(maco_port_channel_wait(ch, wait_ms));
            CHECK(maco_port_channel_put_with_signal(ch, 0, 0, 8));
        }
    }
    if (rank == 0) {
        double sum = 0;
        for (int i = 0; i < lat_iters; i++)
            sum += rtt[i];
        qsort(rtt, (size_t)lat_iters, sizeof(double), cmp_double);
        printf("# 8-byte put+signal round trip, %d iterations (one-way = half):\n"
               "#   rtt_us   min %.2f  median %.2f  avg %.2f  p99 %.2f\n"
               "#   one-way  min %.2f  median %.2f  avg %.2f  p99 %.2f\n",
               lat_iters, rtt[0], rtt[lat_iters / 2], sum / lat_iters, rtt[(lat_iters * 99) / 100],
               rtt[0] / 2, rtt[lat_iters / 2] / 2, sum / lat_iters / 2,
               rtt[(lat_iters * 99) / 100] / 2);
    }
    /* One-sided: rank 0's 8-byte put and flush, which completes when the peer's memory has the
     * data (for IB: the write's completion, one network round trip); rank 1 only waits at the
     * barrier, so no waiting thread of its own is in the way. */
    CHECK(maco_bootstrap_barrier(bs));
    if (rank == 0) {
        for (int i = -10; i < lat_iters; i++) {
            double t0 = now_us();
            CHECK(maco_port_channel_put(ch, 0, 0, 8));
            CHECK(maco_port_channel_flush(ch));
            if (i >= 0)
                rtt[i] = now_us() - t0;
        }
        double sum = 0;
        for (int i = 0; i < lat_iters; i++)
            sum += rtt[i];
        qsort(rtt, (size_t)lat_iters, sizeof(double), cmp_double);
        printf("# 8-byte put+flush at rank 0 (data in the peer's memory), %d iterations:\n"
               "#   us       min %.2f  median %.2f  avg %.2f  p99 %.2f\n",
               lat_iters, rtt[0], rtt[lat_iters / 2], sum / lat_iters, rtt[(lat_iters * 99) / 100]);
    }
    CHECK(maco_port_channel_flush(ch));
    CHECK(maco_bootstrap_barrier(bs));
    maco_port_channel_destroy(ch);
    maco_proxy_destroy(proxy);
    maco_mem_deregister(theirs);
    maco_mem_deregister(mine);
    CHECK(maco_bootstrap_barrier(bs));
    maco_mem_free(comm, buf);
    maco_comm_destroy(comm);
    maco_bootstrap_destroy(bs);
    free(rtt);
    free(h);
    return 0;
}
