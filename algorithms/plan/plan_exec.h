/*
 * plan_exec.h - the plan executor's kernel arguments (plan_exec.c fills them, plan_kernels.cu
 * runs them). Internal.
 */
#ifndef MACO_PLAN_EXEC_H
#define MACO_PLAN_EXEC_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "maco/device/macros.h"
#include "maco/device/memory_channel.h"
#include "maco/device/port_channel.h"
#include "algorithms/plan/plan_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One operation as the kernel reads it: the plan's op with its sources in a flat array and
 * part0, the part (of the unit) its first chunk's data has (the verifier works it out);
 * chunk j of a range holds part (part0 + j) % parts. */
typedef struct maco__pexec_op {
    uint8_t code;
    uint8_t port; /* 1: op.channel is a port channel (a.ports), 0: a memory channel or none */
    int16_t channel;
    uint16_t nsrcs;
    uint16_t pad2;
    int32_t part0;
    uint32_t src_first; /* index of srcs[0] in the refs array */
    maco__plan_ref_t dst;
} maco__pexec_op_t;
MACO_STATIC_ASSERT(sizeof(maco__plan_ref_t) == 12, "maco__plan_ref_t is 12 bytes");
MACO_STATIC_ASSERT(sizeof(maco__pexec_op_t) == 28, "maco__pexec_op_t is 28 bytes");

/* Byte offsets of the counters at the start of each rank's plan buffer. */
enum {
    MACO__PLAN_CTR_EPOCH = 0, /* u32: this launch's LL flag (starts at 1, +1 per launch) */
    MACO__PLAN_CTR_GRID = 8,  /* u64: grid barrier arrivals, never reset */
    MACO__PLAN_CTR_BYTES = 256,
};

/* A channel of a plan with port channels (channels of the plan, then one per peer for the
 * barriers): which kind, whose, and for a memory channel the peer's host buffer mapped here
 * (chunks a port channel writes live there: plan_exec.c's file comment). 16 bytes. */
typedef struct maco__pexec_chan {
    char *peer_host; /* memory channels: the peer's host buffer (device address), else NULL */
    int32_t peer;    /* the peer's rank */
    int32_t port;    /* 1: a port channel (ports[c]), 0: a memory channel (chans[c]) */
} maco__pexec_chan_t;
MACO_STATIC_ASSERT(sizeof(maco__pexec_chan_t) == 16, "maco__pexec_chan_t is 16 bytes");

typedef struct maco__pexec_args {
    const void *send;
    void *recv;
    char *buf; /* this rank's plan buffer */
    const maco__pexec_op_t *ops;
    const maco__plan_ref_t *refs;
    const int32_t *tb_first;                   /* [ntbs + 1]: each thread block's first op */
    const maco_memory_channel_device_t *chans; /* plan channels, then one per peer (barrier) */
    /* Plans with port channels only (else NULL): the same indices as chans. */
    const maco_port_channel_device_t *ports; /* port channels' handles */
    const maco__pexec_chan_t *cinfo;         /* every channel's kind and peer */
    const uint8_t *res; /* [nranks][res_stride]: 1 when that chunk of that rank (input chunks,
                           then output, then scratch) lives in the rank's host buffer */
    char *host;         /* this rank's host buffer (device address), plan buffer's layout */
    uint64_t count, esz;
    uint64_t in_off, out_off, scr_off, slot_bytes; /* byte offsets in buf */
    uint64_t send_bytes, recv_bytes;
    maco_device_wait_bound_t bound;
    int32_t nchannels, npeers, parts, nranks, op, avg;
    int32_t rank;                          /* this rank (its row of res) */
    uint32_t res_stride, res_out, res_scr; /* chunks per rank; first output, scratch chunk */
} maco__pexec_args_t;

/** Launches the executor for element type `datatype` (maco_datatype_t): one CTA per thread
 * block of the rank. Returns the launch's CUDA error. */
cudaError_t maco__launch_plan(const maco__pexec_args_t *args, int datatype, int blocks, int threads,
                              cudaStream_t stream);
/** Loads every type's executor kernel into the current device's context (collectives/collectives.h,
 * kernel preloading, says why); maco_plan_load calls it. Returns CUDA's error. */
cudaError_t maco__preload_plan(void);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PLAN_EXEC_H */
