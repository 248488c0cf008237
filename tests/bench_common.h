/*
 * bench_common.h - what the benchmarks (bench_memory_channel, bench_port_channel, bench_ep, ...)
 * share: error checks that exit, timing helpers, and the setup of two
 * ranks that each register a buffer and import the peer's.
 *
 * Benchmarks, not tests: any failure prints the call and exits with status 1.
 */
#ifndef MACO_TESTS_BENCH_COMMON_H
#define MACO_TESTS_BENCH_COMMON_H

#include <cuda_runtime.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

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
            fprintf(stderr, "%s failed: %s: %s\n", #call, maco_status_string(s_),                  \
                    maco_log_last_error());                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/** Microseconds of CLOCK_MONOTONIC. */
static inline double bench_now_us()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/** Milliseconds between events recorded on `s` before and after `launch()` enqueues work. */
static inline float bench_time_ms(cudaStream_t s, const std::function<void()> &launch)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    launch();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms;
}

/** Two ranks, each with `bytes` of device memory registered and the peer's imported. */
struct bench_pair {
    maco_comm_t comm;
    maco_bootstrap_t bs;
    int rank;
    char *buf; /* this rank's buffer, `bytes` long, filled with 1s */
    size_t bytes;
    maco_mem_t mine, theirs;
    void *peer_ptr; /* the peer's buffer, mapped here */
    cudaStream_t s; /* non-blocking */
    int *status;    /* one int of device memory for kernels' statuses */
};

/** Sets up a bench_pair from the maco-run environment; exits unless there are 2 ranks. */
static inline void bench_pair_open(const char *name, size_t bytes, bench_pair *p)
{
    MK(maco_comm_init_from_env(&p->comm));
    int n, dev;
    maco_comm_get_rank(p->comm, &p->rank);
    maco_comm_get_nranks(p->comm, &n);
    maco_comm_get_cuda_device(p->comm, &dev);
    if (n != 2) {
        fprintf(stderr, "%s: run with 2 ranks (maco-run -n 2)\n", name);
        exit(2);
    }
    CK(cudaSetDevice(dev));
    maco_comm_get_bootstrap(p->comm, &p->bs);
    p->bytes = bytes;
    CK(cudaMalloc(&p->buf, bytes));
    CK(cudaMemset(p->buf, 1, bytes));
    MK(maco_mem_register(p->comm, p->buf, bytes, &p->mine));
    uint8_t h[2][MACO_MEM_HANDLE_BYTES];
    MK(maco_mem_serialize(p->mine, h[p->rank]));
    MK(maco_bootstrap_allgather(p->bs, h, MACO_MEM_HANDLE_BYTES));
    MK(maco_mem_import(p->comm, h[1 - p->rank], &p->theirs));
    MK(maco_mem_get_pointer(p->theirs, &p->peer_ptr));
    CK(cudaStreamCreateWithFlags(&p->s, cudaStreamNonBlocking));
    CK(cudaMalloc(&p->status, sizeof(int)));
}

/** The status a kernel left in p->status. */
static inline int bench_pair_status(const bench_pair *p)
{
    int st = -1;
    CK(cudaMemcpy(&st, p->status, sizeof(int), cudaMemcpyDeviceToHost));
    return st;
}

/** Tears down what bench_pair_open set up (the channels on it destroyed first). */
static inline void bench_pair_close(bench_pair *p)
{
    maco_mem_deregister(p->theirs);
    maco_mem_deregister(p->mine);
    MK(maco_bootstrap_barrier(p->bs));
    cudaStreamDestroy(p->s);
    cudaFree(p->status);
    cudaFree(p->buf);
    maco_comm_destroy(p->comm);
}

#endif /* MACO_TESTS_BENCH_COMMON_H */
