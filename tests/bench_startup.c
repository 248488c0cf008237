/*
 * bench_startup - how long a job takes from its launch to a ready communicator on every rank.
 * A benchmark, not a test: tests/launchers/bench_startup.sh runs it under maco-run, mpirun and
 * srun and prints the table that docs/performance.md quotes.
 *
 *   BENCH_LAUNCH_NS=$(date +%s%N) <launcher> build/tests/bench_startup
 *
 * Each rank takes the wall-clock time (CLOCK_REALTIME, ns) when main() starts and when
 * maco_comm_init_from_env returns (without a GPU the communicator is host-only). Rank 0 prints
 * one line, the slowest rank's times:
 *   startup: launcher L, id by S, N ranks: launch to ready X s, main to ready Y s
 * "launch" is BENCH_LAUNCH_NS (the launcher command's start, set by the caller; omitted
 * without it); "main to ready" is MACO's share (the launcher's variables, the id through its
 * store, the bootstrap's mesh, the communicator).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "maco/maco.h"

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int main(void)
{
    int64_t t_main = now_ns();
    maco_comm_t comm;
    maco_status_t st = maco_comm_init_from_env(&comm);
    int64_t t_ready = now_ns();
    if (st != MACO_OK) {
        fprintf(stderr, "bench_startup: maco_comm_init_from_env failed: %s: %s\n",
                maco_status_string(st), maco_log_last_error());
        return 1;
    }
    const char *launch_text = getenv("BENCH_LAUNCH_NS");
    int64_t launch = launch_text != NULL ? strtoll(launch_text, NULL, 10) : 0;
    int rank = 0, n = 0;
    maco_bootstrap_t bs;
    maco_comm_get_rank(comm, &rank);
    maco_comm_get_nranks(comm, &n);
    maco_comm_get_bootstrap(comm, &bs);
    int64_t *all = calloc((size_t)n * 2, sizeof(int64_t));
    if (all == NULL)
        return 1;
    all[2 * rank] = launch > 0 ? t_ready - launch : 0;
    all[2 * rank + 1] = t_ready - t_main;
    st = maco_bootstrap_allgather(bs, all, 2 * sizeof(int64_t));
    if (st != MACO_OK) {
        fprintf(stderr, "bench_startup: allgather failed: %s\n", maco_status_string(st));
        return 1;
    }
    int64_t worst_launch = 0, worst_main = 0;
    for (int r = 0; r < n; r++) {
        worst_launch = all[2 * r] > worst_launch ? all[2 * r] : worst_launch;
        worst_main = all[2 * r + 1] > worst_main ? all[2 * r + 1] : worst_main;
    }
    maco_launch_info_t job;
    if (rank == 0 && maco_launch_info_from_env(&job) == MACO_OK) {
        printf("startup: launcher %s, id by %s, %d ranks: ", job.launcher, job.id_source, n);
        if (launch > 0)
            printf("launch to ready %.3f s, ", (double)worst_launch * 1e-9);
        printf("main to ready %.3f s\n", (double)worst_main * 1e-9);
    }
    free(all);
    maco_bootstrap_barrier(bs);
    maco_comm_destroy(comm);
    return 0;
}
