/*
 * ep_kernels.h - the expert-parallel kernels' arguments, the report they leave the host, and
 * their launchers (ep_kernels.cu has the protocol; ep.c fills the arguments).
 */
#ifndef MACO_EP_KERNELS_H
#define MACO_EP_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/ep/ep_layout.h"
#include "maco/device/error.h"
#include "maco/device/macros.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * What the last launch of a buffer left the host, in pinned host memory mapped for the GPU.
 * Written only by thread 0 of CTA 0 of this rank's EP kernels (one launch at a time, in
 * stream order), read by the host: when a launch stops on an input error it writes the
 * problem's fields, a system fence, then failures + 1; every launch then writes num_recv, a
 * system fence, and its ticket last. The host reads ticket (or failures) first and the other
 * fields after an acquire fence. 64 bytes:
 *   0  u64 ticket    the launch's ticket (ep.c counts them; graph replays repeat theirs)
 *   8  i64 num_recv  dispatch: rows this rank received (-1: the launch stopped)
 *  16  u32 failures  launches stopped on an input error so far
 *  20  i32 op        0 dispatch, 1 combine: which call the problem fields are of
 *  24  i32 code, rank, token, k  (maco__ep_bad_t)
 *  40  i64 value, limit
 */
typedef struct maco__ep_report {
    volatile uint64_t ticket;
    volatile int64_t num_recv;
    volatile uint32_t failures;
    volatile int32_t op;
    volatile int32_t code, rank, token, k;
    volatile int64_t value, limit;
    volatile uint64_t pad;
} maco__ep_report_t;
MACO_STATIC_ASSERT(sizeof(maco__ep_report_t) == 64, "maco__ep_report_t is 64 bytes");

/* Everything both kernels need, passed by value (well under CUDA's 4 KiB). */
typedef struct maco__ep_args {
    maco__ep_geom_t g;
    maco__ep_offsets_t o;
    int32_t rank;                  /* this rank (every rank of the communicator is on this node) */
    int32_t num_tokens;            /* this call's */
    char *buf;                     /* this rank's EP buffer */
    char *peer[MACO_EP_MAX_RANKS]; /* every rank's EP buffer, mapped here; [rank] = buf */
    const void *x;                 /* dispatch: [num_tokens][hidden] */
    const int64_t *topk_idx;       /* dispatch: [num_tokens][topk] */
    const float *topk_weights;     /* dispatch (may be NULL) and combine: [num_tokens][topk] */
    int32_t *recv_counts;          /* dispatch: [L] */
    int32_t *recv_offsets;         /* dispatch: [L + 1] or NULL */
    float *recv_weights;           /* dispatch: [recv_rows] or NULL */
    void *handle;                  /* dispatch writes it, combine reads it */
    const void *expert_out;        /* combine: in recv_x's layout */
    void *y;                       /* combine: [num_tokens][hidden] */
    maco__ep_report_t *report;     /* device address of the buffer's report */
    uint64_t ticket;
    uint64_t buffer_id;
    int32_t want_report; /* 1: the host waits for num_recv and the ticket (else only a
                          * stopped launch writes the report) */
    int32_t fp8;         /* dispatch: 1 = rows quantized to e4m3 (maco_ep_dispatch_fp8) */
    maco_device_wait_bound_t bound;
} maco__ep_args_t;
MACO_STATIC_ASSERT(sizeof(maco__ep_args_t) <= 4096, "maco__ep_args_t fits the 4 KiB limit");

/* Dynamic shared memory of each kernel, in bytes. */
size_t maco__ep_dispatch_smem(const maco__ep_geom_t *g);
size_t maco__ep_combine_smem(const maco__ep_geom_t *g);

/*
 * Loads both kernels into the current device's context (collectives/collectives.h, "Kernel
 * preloading": a kernel loaded lazily while a peer's kernel waits can deadlock) and allows them the
 * dynamic shared memory they need. Returns cudaSuccess or CUDA's error.
 */
cudaError_t maco__ep_prepare_kernels(size_t dispatch_smem, size_t combine_smem);

/* Launch the kernels with `ctas` CTAs of MACO__EP_THREADS threads; return the launch's error. */
cudaError_t maco__ep_launch_dispatch(const maco__ep_args_t *a, int ctas, size_t smem,
                                     cudaStream_t stream);
cudaError_t maco__ep_launch_combine(const maco__ep_args_t *a, int ctas, size_t smem,
                                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MACO_EP_KERNELS_H */
