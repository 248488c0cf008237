/*
 * ep_device.cuh - what the expert-parallel dispatch kernel (ep_kernels.cu) and combine kernel
 * (ep_combine.cu) share: their warps, the report codes of their waits, the flag stores and
 * bounded waits, the row copy, the advance of a sequence number and the report to the host.
 * ep_kernels.cu's file comment has the protocol of both.
 */
#ifndef MACO_ALGORITHMS_EP_DEVICE_CUH
#define MACO_ALGORITHMS_EP_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "algorithms/ep/ep_kernels.h"
#include "algorithms/tuning.h"
#include "maco/device/atomics.h"
#include "maco/device/error.h"

#define MACO__EP_WARPS (MACO__EP_THREADS / 32)
#define MACO__EP_SEND_WARPS (MACO__EP_WARPS / 2)    /* the combine's sender warps; the rest sum */
#define MACO__EP_GRAB MACO__TUNING_EP_DISPATCH_GRAB /* dispatch entries a warp takes at a time */
#define MACO__EP_FULL 0xffffffffu

/* Object codes of MACO_DEVICE_WAIT_EP reports (maco/device/error.h). */
enum { MACO__EP_W_COUNTS = 1, MACO__EP_W_ROWS = 2, MACO__EP_W_READY = 3, MACO__EP_W_BACK = 4 };

static __device__ __forceinline__ void maco__ep_store_release(uint64_t *p, uint64_t v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* One thread: waits until (*p >> shift) >= want (system-scope acquire), bounded. Returns
 * true when the wait failed (a timeout is recorded naming `peer`). */
static __device__ __forceinline__ bool maco__ep_wait(const uint64_t *p, uint64_t want, int shift,
                                                     const maco_device_wait_bound_t *b, int peer,
                                                     int object)
{
    maco_spin_state_t spin = { 0, 0 };
    for (;;) {
        uint64_t v = maco_load_acquire_sys_u64(p);
        if ((v >> shift) >= want)
            return false;
        maco_status_t st = maco_spin_check(b, &spin);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco_device_error_record(b, st, peer, object, MACO_DEVICE_WAIT_EP, want,
                                         v >> shift);
            return true;
        }
    }
}

/* A warp copies one row of `bytes` (a multiple of 16) from src (read-only during the
 * kernel) to dst, eight 16-byte words per lane loaded before any is stored. */
static __device__ __forceinline__ void maco__ep_copy_row(char *dst, const char *src, uint64_t bytes,
                                                         int lane)
{
    enum { U = 8 };
    const uint64_t n = bytes / 16;
    const uint4 *s = (const uint4 *)src;
    uint4 *d = (uint4 *)dst;
    uint64_t i = (uint64_t)lane;
    for (; i + 32 * (U - 1) < n; i += 32 * U) {
        uint4 w[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            w[u] = __ldg(s + i + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++)
            d[i + 32 * u] = w[u];
    }
    uint4 w[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (i + 32 * u < n)
            w[u] = __ldg(s + i + 32 * u);
#pragma unroll
    for (int u = 0; u < U; u++)
        if (i + 32 * u < n)
            d[i + 32 * u] = w[u];
}

/* The last CTA to finish stores `seq` as the buffer's last sequence number (at `seq_off`),
 * with the CTA counter at `done_off` and the work counter at `work_off` (-1: none) back to 0
 * (the kernel's end orders it before the next launch). */
static __device__ __forceinline__ void maco__ep_advance(char *buf, int seq_off, int done_off,
                                                        int work_off, uint64_t seq)
{
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    __threadfence();
    unsigned prev = atomicAdd((unsigned *)(buf + done_off), 1u);
    if (prev == gridDim.x - 1) {
        *(volatile unsigned *)(buf + done_off) = 0u;
        if (work_off >= 0)
            *(volatile unsigned *)(buf + work_off) = 0u;
        *(volatile uint64_t *)(buf + seq_off) = seq;
        __threadfence();
    }
}

/* Thread 0 of CTA 0: the report for the host (ep_kernels.h has the order). Written when the
 * launch stopped, or when the host waits for it (`want`). */
static __device__ void maco__ep_report(maco__ep_report_t *r, uint64_t ticket, int want, int op,
                                       const maco__ep_bad_t &bad, int64_t num_recv)
{
    if (bad.code != MACO__EP_OK) {
        r->op = op;
        r->code = bad.code;
        r->rank = bad.rank;
        r->token = bad.token;
        r->k = bad.k;
        r->value = bad.value;
        r->limit = bad.limit;
        __threadfence_system();
        r->failures = r->failures + 1u;
    } else if (!want) {
        return;
    }
    r->num_recv = num_recv;
    __threadfence_system();
    r->ticket = ticket;
    __threadfence_system();
}

/* The combine kernel's host side for maco__ep_prepare_kernels (ep_kernels.cu): loads it into
 * the current device's context (cudaFuncGetAttributes), and sets its dynamic shared memory
 * limit (cudaFuncSetAttribute). */
extern "C" cudaError_t maco__ep_combine_load(void);
extern "C" cudaError_t maco__ep_combine_set_smem(int bytes);

#endif /* MACO_ALGORITHMS_EP_DEVICE_CUH */
