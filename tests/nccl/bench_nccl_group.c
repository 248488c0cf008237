/*
 * bench_nccl_group - how the time of one NCCL group grows with its calls: ncclGroupStart, N
 * ncclAllReduce calls on one communicator, ncclGroupEnd, for N = 10k, 20k, 40k, 80k, through
 * MACO's libnccl.so.2. A benchmark, not a test: one process, one rank, no GPU needed (without
 * one the group's end refuses the collectives after checking them).
 *
 *   build/tests/nccl/bench_nccl_group [MAX_CALLS]
 *
 * The bound: queueing and ending a group is linear in its calls, so the time per call stays
 * about flat as N doubles (quadratic work shows as a time per call that doubles with N).
 * Prints, per N, the group's time and the time per call, then whether the largest N's time
 * per call is within 3x the smallest's.
 */
#define _POSIX_C_SOURCE 200809L
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long max_calls = argc > 1 ? strtol(argv[1], NULL, 10) : 80000;
    ncclUniqueId id;
    ncclComm_t comm;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
        fprintf(stderr, "bench_nccl_group: cannot create a one-rank communicator\n");
        return 1;
    }
    float buf[4];
    double first = 0, last = 0;
    for (long n = 10000; n <= max_calls; n *= 2) {
        double t0 = now_s();
        ncclGroupStart();
        for (long i = 0; i < n; i++)
            ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, NULL);
        ncclResult_t res = ncclGroupEnd();
        double s = now_s() - t0;
        double per = s / (double)n * 1e9;
        if (first == 0)
            first = per;
        last = per;
        printf("bench_nccl_group: %6ld calls: %.3f s, %.0f ns per call (ncclGroupEnd: %s)\n", n, s,
               per, ncclGetErrorString(res));
    }
    printf("bench_nccl_group: linear bound (time per call at the largest group within 3x the "
           "smallest's): %s (%.1fx)\n",
           last <= 3 * first ? "holds" : "BROKEN", first > 0 ? last / first : 0.0);
    ncclCommDestroy(comm);
    return 0;
}
