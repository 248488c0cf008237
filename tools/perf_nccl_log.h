/*
 * perf_nccl_log.h - maco-perf's reading of NCCL's TUNING log (a header so that test_unit checks
 * it on the CPU; maco-perf.c says how the log is produced).
 */
#ifndef MACO_PERF_NCCL_LOG_H
#define MACO_PERF_NCCL_LOG_H

#include <stdio.h>
#include <string.h>

/* Reduces one NCCL TUNING line to "symmetric KERNEL" or "ALGO/PROTO" in `out` (`cap` bytes,
 * always terminated), "?" for any other line. The formats are NCCL's INFO(NCCL_TUNING, ...)
 * lines (src/scheduler/symmetric_sched.cc and src/enqueue.cc, NCCL 2.27 to 2.31), after the
 * log's own "host:pid:tid [dev] NCCL INFO " prefix:
 *   "AllReduce [Symmetric]: 1024 Bytes -> Kernel AllReduce_AGxLL_R nchannels 8 ..."
 *   "AllReduce: 1024 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..7}" */
static inline void maco_perf_nccl_path_of(const char *line, char *out, size_t cap)
{
    const char *kernel = strstr(line, "-> Kernel ");
    const char *algo = strstr(line, "-> Algo ");
    char a[64] = "", b[64] = "", full[160];
    if (strstr(line, "[Symmetric]") != NULL && kernel != NULL &&
        sscanf(kernel, "-> Kernel %63s", a) == 1)
        snprintf(full, sizeof(full), "symmetric %s", a);
    else if (algo != NULL && sscanf(algo, "-> Algo %63s proto %63s", a, b) == 2)
        snprintf(full, sizeof(full), "%s/%s", a, b);
    else
        snprintf(full, sizeof(full), "?");
    /* Cut to `cap` by hand: snprintf into `out` would draw -Wformat-truncation where the
     * compiler sees a small `cap`. */
    size_t n = strlen(full);
    if (cap == 0)
        return;
    if (n >= cap)
        n = cap - 1;
    memcpy(out, full, n);
    out[n] = '\0';
}

#endif
