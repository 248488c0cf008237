/*
 * nccl_ft_check.c - a C program written against nccl.h only that survives a peer's death, as a
 * fault-tolerant training loop does with NCCL 2.28+: the last rank dies (kill -9 of itself); the
 * survivors' next call fails with ncclRemoteError; they call ncclCommRevoke, then
 * ncclCommShrink(NCCL_SHRINK_ABORT) without naming the dead rank (each finds it), and go on with
 * the new communicator: its size and ranks are checked, and a call on it must work (with GPUs an
 * allreduce whose result is checked; without, ncclCommSplit, which needs every member). Run under
 * maco-run with 3 or more ranks (ctest nccl_ft_4, gpu_nccl_ft_3). Exit 0 on success, 1 on a
 * failed check (the message says which), 77 when TEST_NCCL_NEEDS_GPU is set and there is no GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int g_rank;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: check failed at line %d: ", g_rank, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An allreduce of `count` floats of value rank + 1 on `comm`, checked. 0 on success. */
static int allreduce_check(ncclComm_t comm, int rank, int nranks)
{
    const size_t count = 1 << 16;
    float *d = NULL, *h = (float *)malloc(count * sizeof(float));
    cudaStream_t s = NULL;
    CHECK(h != NULL && cudaMalloc((void **)&d, count * sizeof(float)) == cudaSuccess &&
              cudaStreamCreate(&s) == cudaSuccess,
          "buffers");
    for (size_t i = 0; i < count; i++)
        h[i] = (float)(rank + 1);
    CHECK(cudaMemcpy(d, h, count * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess, "copy");
    ncclResult_t res = ncclAllReduce(d, d, count, ncclFloat, ncclSum, comm, s);
    CHECK(res == ncclSuccess, "ncclAllReduce: %s", ncclGetLastError(comm));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    CHECK(cudaMemcpy(h, d, count * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    const float want = (float)(nranks * (nranks + 1) / 2);
    for (size_t i = 0; i < count; i++)
        CHECK(h[i] == want, "element %zu is %g, not %g", i, h[i], want);
    cudaStreamDestroy(s);
    cudaFree(d);
    free(h);
    return 0;
}

int main(void)
{
    const char *rank_s = getenv("MACO_RANK"), *size_s = getenv("MACO_WORLD_SIZE");
    const char *addr = getenv("MACO_BOOTSTRAP_ADDR");
    if (rank_s == NULL || size_s == NULL || addr == NULL) {
        fprintf(stderr, "run under maco-run with 3 or more ranks\n");
        return 2;
    }
    g_rank = atoi(rank_s);
    int nranks = atoi(size_s), ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess)
        ndev = 0;
    if (ndev == 0 && getenv("TEST_NCCL_NEEDS_GPU") != NULL) {
        if (g_rank == 0)
            printf("SKIP: no GPU (TEST_NCCL_NEEDS_GPU is set)\n");
        return 77;
    }
    if (ndev > 0)
        cudaSetDevice(g_rank % ndev);
    CHECK(nranks >= 3, "needs 3 or more ranks, has %d", nranks);
    setenv("NCCL_COMM_ID", addr, 1); /* every rank makes the same id */
    ncclUniqueId id;
    ncclComm_t world = NULL;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    CHECK(ncclCommInitRank(&world, nranks, id, g_rank) == ncclSuccess, "ncclCommInitRank: %s",
          ncclGetLastError(NULL));
    int dev = -1;
    ncclCommCuDevice(world, &dev);
    if (dev >= 0)
        CHECK(allreduce_check(world, g_rank, nranks) == 0, "allreduce on the world");
    /* Every rank has its communicator before the victim goes (a split needs all). */
    ncclComm_t all = NULL;
    CHECK(ncclCommSplit(world, 0, g_rank, &all, NULL) == ncclSuccess, "first split: %s",
          ncclGetLastError(world));
    ncclCommDestroy(all);
    const int victim = nranks - 1;
    if (g_rank == victim) {
        fflush(stdout);
        _exit(0); /* gone without a word; exit status 0 so that maco-run lets the others go on */
    }
    double t0 = now_s();
    /* The next call meets the death. */
    ncclComm_t sub = NULL;
    ncclResult_t res = ncclCommSplit(world, 0, g_rank, &sub, NULL);
    CHECK(res == ncclRemoteError, "split after the death returned %s, not ncclRemoteError",
          ncclGetErrorString(res));
    /* Recover: revoke, then shrink without naming anyone. */
    CHECK(ncclCommRevoke(world, NCCL_REVOKE_DEFAULT) == ncclSuccess, "ncclCommRevoke: %s",
          ncclGetLastError(world));
    ncclComm_t next = NULL;
    res = ncclCommShrink(world, NULL, 0, &next, NULL, NCCL_SHRINK_ABORT);
    CHECK(res == ncclSuccess && next != NULL, "ncclCommShrink: %s (%s)", ncclGetErrorString(res),
          ncclGetLastError(world));
    double took = now_s() - t0;
    int n = 0, r = -1;
    CHECK(ncclCommCount(next, &n) == ncclSuccess && n == nranks - 1, "size %d, not %d", n,
          nranks - 1);
    CHECK(ncclCommUserRank(next, &r) == ncclSuccess && r == g_rank, "rank %d, not %d", r, g_rank);
    if (dev >= 0) {
        CHECK(allreduce_check(next, r, n) == 0, "allreduce on the shrunk communicator");
    } else {
        CHECK(ncclCommSplit(next, 0, r, &sub, NULL) == ncclSuccess && sub != NULL,
              "split of the shrunk communicator: %s", ncclGetLastError(next));
        ncclCommDestroy(sub);
    }
    printf("rank %d: the death was met, revoked and shrunk in %.3f s; %d ranks go on\n", g_rank,
           took, n);
    CHECK(ncclCommDestroy(next) == ncclSuccess, "destroy the shrunk communicator");
    CHECK(ncclCommAbort(world) == ncclSuccess, "abort the old communicator");
    return 0;
}
