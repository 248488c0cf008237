/*
 * bench_bootstrap - how long N ranks take to set up the bootstrap and allgather.
 * A benchmark, not a test: run it under maco-run and read rank 0's line.
 *
 *   maco-run -n 256 build/tests/bench_bootstrap [BYTES_PER_RANK]
 *
 * Prints the setup time (maco_bootstrap_create_from_env, slowest rank), then the time of one
 * allgather of BYTES_PER_RANK (default 1024) bytes per rank after a barrier, slowest rank.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "maco/bootstrap.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The largest of every rank's value. */
static double slowest(maco_bootstrap_t bs, int rank, int n, double v)
{
    double *all = calloc((size_t)n, sizeof(double));
    all[rank] = v;
    maco_bootstrap_allgather(bs, all, sizeof(double));
    double m = 0;
    for (int r = 0; r < n; r++)
        m = all[r] > m ? all[r] : m;
    free(all);
    return m;
}

int main(int argc, char **argv)
{
    size_t bytes = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 1024;
    double t0 = now_s();
    maco_bootstrap_t bs;
    maco_status_t st = maco_bootstrap_create_from_env(&bs);
    if (st != MACO_OK) {
        fprintf(stderr, "bench_bootstrap: setup failed: %s\n", maco_status_string(st));
        return 1;
    }
    double setup = now_s() - t0;
    int rank, n;
    maco_bootstrap_get_rank(bs, &rank);
    maco_bootstrap_get_nranks(bs, &n);
    char *buf = malloc(bytes * (size_t)n + 1);
    memset(buf + bytes * (size_t)rank, rank & 0xff, bytes);
    maco_bootstrap_barrier(bs);
    double t1 = now_s();
    st = maco_bootstrap_allgather(bs, buf, bytes);
    double ag = now_s() - t1;
    if (st != MACO_OK) {
        fprintf(stderr, "bench_bootstrap: allgather failed: %s\n", maco_status_string(st));
        return 1;
    }
    double setup_max = slowest(bs, rank, n, setup);
    double ag_max = slowest(bs, rank, n, ag);
    if (rank == 0)
        printf("bench_bootstrap: %d ranks: setup %.3f s, allgather of %zu bytes per rank %.3f s "
               "(slowest rank)\n",
               n, setup_max, bytes, ag_max);
    free(buf);
    maco_bootstrap_destroy(bs);
    return 0;
}
