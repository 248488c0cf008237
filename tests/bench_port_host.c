/*
 * bench_port_host.c - port channels between two ranks on host memory, through the public API
 * only: put bandwidth, put+signal ping-pong latency and put+flush latency, over the transport
 * MACO_TRANSPORT names (host, tcp, ib; auto by default). A benchmark, not a test: it prints
 * numbers (docs/performance.md records them), after checking the bytes of the last put.
 *
 *   maco-run -n 2 bench_port_host [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-l LAT_ITERS]
 *
 * Bandwidth: rank 0 puts SIZE bytes ITERS times (each put the same range) and then signals;
 * rank 1 waits for the signal and signals back; the time is rank 0's, from the first put to
 * the signal back, so it covers the whole transfer: MB/s = SIZE * ITERS / time (1 MB = 1e6 B).
 * Ping-pong: 8 bytes put_with_signal, the peer waits and answers the same; half the round
 * trip, median of LAT_ITERS. Flush: put of 8 bytes then maco_port_channel_flush, median.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <maco/maco.h>

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
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k')
        v *= 1024;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024;
    else if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024 * 1024;
    return (uint64_t)v;
}

int main(int argc, char **argv)
{
    uint64_t min = 1 << 20, max = 64 << 20;
    int factor = 2, iters = 20, lat_iters = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-b") == 0)
            min = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "-e") == 0)
            max = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "-f") == 0)
            factor = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-n") == 0)
            iters = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-l") == 0)
            lat_iters = atoi(argv[i + 1]);
        else {
            fprintf(stderr,
                    "usage: maco-run -n 2 %s [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] "
                    "[-l LAT_ITERS]\n",
                    argv[0]);
            return 2;
        }
    }
    if (min < 8 || max < min || factor < 2 || iters < 1 || lat_iters < 1) {
        fprintf(stderr, "bench_port_host: need 8 <= -b <= -e, -f >= 2, -n >= 1, -l >= 1\n");
        return 2;
    }
    maco_comm_t comm;
    CHECK(maco_comm_init_from_env(&comm));
    int rank, nranks;
    maco_comm_get_rank(comm, &rank);
    maco_comm_get_nranks(comm, &nranks);
    maco_bootstrap_t bs;
    CHECK(maco_comm_get_bootstrap(comm, &bs));
    if (nranks != 2) {
        if (rank == 0)
            fprintf(stderr, "bench_port_host: run it with 2 ranks (maco-run -n 2)\n");
        maco_comm_destroy(comm);
        return 2;
    }
    int peer = 1 - rank;
    void *buf = NULL;
    CHECK(maco_mem_alloc_host(comm, (size_t)max, &buf));
    memset(buf, 0, (size_t)max);
    maco_mem_t mine, theirs;
    CHECK(maco_mem_register(comm, buf, (size_t)max, &mine));
    uint8_t handles[2][MACO_MEM_HANDLE_BYTES];
    CHECK(maco_mem_serialize(mine, handles[rank]));
    CHECK(maco_bootstrap_allgather(bs, handles, MACO_MEM_HANDLE_BYTES));
    CHECK(maco_mem_import(comm, handles[peer], &theirs));
    maco_proxy_t proxy;
    maco_port_channel_t ch;
    CHECK(maco_proxy_create(comm, &proxy));
    CHECK(maco_proxy_start(proxy));
    CHECK(maco_port_channel_create(proxy, peer, MACO_TRANSPORT_AUTO, mine, theirs, &ch));
    maco_transport_t t;
    CHECK(maco_port_channel_get_transport(ch, &t));
    static const char *names[] = { "auto", "cuda", "host", "ib", "tcp" };
    if (rank == 0)
        printf("# bench_port_host: transport %s, %d iterations per size, time on rank 0\n"
               "# %12s %12s %10s\n",
               names[t], iters, "bytes", "us/put", "MB/s");
    CHECK(maco_bootstrap_barrier(bs));
    /* Bandwidth. */
    for (uint64_t size = min; size <= max; size *= (uint64_t)factor) {
        if (rank == 0) {
            for (uint64_t i = 0; i < size; i++)
                ((uint8_t *)buf)[i] = (uint8_t)(i * 131 + size);
        }
        CHECK(maco_bootstrap_barrier(bs));
        if (rank == 0) {
            /* one warm-up round */
            CHECK(maco_port_channel_put_with_signal(ch, 0, 0, size));
            CHECK(maco_port_channel_wait(ch, -1));
            double t0 = now_us();
            for (int i = 0; i < iters; i++)
                CHECK(maco_port_channel_put(ch, 0, 0, size));
            CHECK(maco_port_channel_signal(ch));
            CHECK(maco_port_channel_wait(ch, -1));
            double us = now_us() - t0;
            printf("  %12llu %12.1f %10.1f\n", (unsigned long long)size, us / iters,
                   (double)size * iters / us);
            fflush(stdout);
        } else {
            CHECK(maco_port_channel_wait(ch, -1));
            CHECK(maco_port_channel_signal(ch));
            CHECK(maco_port_channel_wait(ch, -1));
            uint64_t wrong = 0;
            for (uint64_t i = 0; i < size; i++)
                wrong += ((uint8_t *)buf)[i] != (uint8_t)(i * 131 + size);
            if (wrong != 0) {
                fprintf(stderr, "bench_port_host: %llu wrong bytes after %llu-byte puts\n",
                        (unsigned long long)wrong, (unsigned long long)size);
                exit(3);
            }
            CHECK(maco_port_channel_signal(ch));
        }
    }
    /* Ping-pong and flush latency. */
    double *lat = (double *)calloc((size_t)lat_iters, sizeof(double));
    double *fl = (double *)calloc((size_t)lat_iters, sizeof(double));
    CHECK(maco_bootstrap_barrier(bs));
    for (int i = 0; i < lat_iters + 10; i++) {
        if (rank == 0) {
            double t0 = now_us();
            CHECK(maco_port_channel_put_with_signal(ch, 0, 0, 8));
            CHECK(maco_port_channel_wait(ch, -1));
            if (i >= 10)
                lat[i - 10] = (now_us() - t0) / 2;
        } else {
            CHECK(maco_port_channel_wait(ch, -1));
            CHECK(maco_port_channel_put_with_signal(ch, 0, 0, 8));
        }
    }
    CHECK(maco_bootstrap_barrier(bs));
    if (rank == 0) {
        for (int i = 0; i < lat_iters + 10; i++) {
            double t0 = now_us();
            CHECK(maco_port_channel_put(ch, 0, 0, 8));
            CHECK(maco_port_channel_flush(ch));
            if (i >= 10)
                fl[i - 10] = now_us() - t0;
        }
        qsort(lat, (size_t)lat_iters, sizeof(double), cmp_double);
        qsort(fl, (size_t)lat_iters, sizeof(double), cmp_double);
        printf("# 8-byte put_with_signal ping-pong (half round trip): median %.2f us, p10 %.2f, "
               "p90 %.2f\n",
               lat[lat_iters / 2], lat[lat_iters / 10], lat[lat_iters * 9 / 10]);
        printf("# 8-byte put + flush: median %.2f us, p10 %.2f, p90 %.2f\n", fl[lat_iters / 2],
               fl[lat_iters / 10], fl[lat_iters * 9 / 10]);
    }
    free(lat);
    free(fl);
    CHECK(maco_bootstrap_barrier(bs));
    CHECK(maco_proxy_stop(proxy));
    maco_port_channel_destroy(ch);
    maco_proxy_destroy(proxy);
    maco_mem_deregister(theirs);
    maco_mem_deregister(mine);
    CHECK(maco_bootstrap_barrier(bs));
    maco_mem_free(comm, buf);
    maco_comm_destroy(comm);
    return 0;
}
