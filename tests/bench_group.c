/*
 * bench_group - how the time of one group grows with its calls: maco_group_start, N
 * maco_allreduce calls on one communicator, maco_group_end, for N = 10k, 20k, 40k, 80k.
 * A benchmark, not a test: one process, one rank, no GPU needed (without one the group's end
 * refuses the collectives after checking them; with one it launches them).
 *
 *   build/tests/bench_group [MAX_CALLS]
 *
 * The bound: queueing and ending a group is linear in its calls (O(1) per call: the
 * communicator of each call is found in a hash table, and each communicator's calls are
 * chained), so the time per call stays about flat as N doubles; quadratic work shows as a
 * time per call that doubles with N. Prints, per N, the group's time and the time per call,
 * then whether the largest N's time per call is within 3x the smallest's.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "maco/maco.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long max_calls = argc > 1 ? strtol(argv[1], NULL, 10) : 80000;
    maco_unique_id_t id;
    maco_bootstrap_t bs;
    maco_comm_t comm;
    if (maco_unique_id_create(&id) != MACO_OK ||
        maco_bootstrap_create(&id, 0, 1, -1, &bs) != MACO_OK ||
        maco_comm_create(bs, -1, &comm) != MACO_OK) {
        fprintf(stderr, "bench_group: cannot create a one-rank communicator\n");
        return 1;
    }
    /* The group's refusal without a GPU is expected: errors are kept, not logged. */
    maco_log_set_error_capture(1);
    float buf[4];
    double first = 0, last = 0;
    for (long n = 10000; n <= max_calls; n *= 2) {
        double t0 = now_s();
        maco_group_start();
        for (long i = 0; i < n; i++)
            maco_allreduce(buf, buf, 4, MACO_FLOAT32, MACO_SUM, comm, 0);
        maco_status_t st = maco_group_end();
        double s = now_s() - t0;
        double per = s / (double)n * 1e9;
        if (first == 0)
            first = per;
        last = per;
        printf("bench_group: %6ld calls: %.3f s, %.0f ns per call (group end: %s)\n", n, s, per,
               maco_status_string(st));
    }
    printf("bench_group: linear bound (time per call at the largest group within 3x the "
           "smallest's): %s (%.1fx)\n",
           last <= 3 * first ? "holds" : "BROKEN", first > 0 ? last / first : 0.0);
    maco_comm_destroy(comm);
    maco_bootstrap_destroy(bs);
    return 0;
}
