/*
 * ep_layout.h - the arithmetic of expert-parallel dispatch and combine (maco/ep.h), in plain
 * C: checking a configuration, the buffer's and the handle's layouts, and the routing of one
 * rank's top-k entries. The kernels (ep_kernels.cu) compute the same things on the device;
 * these functions are the reference the tests check them against (tests/test_ep_cpu.cc,
 * tests/test_ep_gpu.cc), and the host side (ep.c) sizes everything with them.
 *
 * The EP buffer of every rank (one cudaMalloc, registered, mapped by every peer of the node),
 * identical on every rank; offsets are multiples of 256 bytes:
 *   0          control words (MACO__EP_CTRL_*), 4096 bytes
 *   cnt_off    count rows:  [parity 2][source rank n][cnt_row_bytes]: int32 header
 *              [MACO__EP_ROW_HEADER] (a routing error of the source, else zeros), then int32
 *              count[E] (the source's entries per expert)
 *   chunk_off  routing scratch of this rank only: int32 [ceil(max_tokens / 32)][E]
 *   meta_off   receive metadata: [recv_rows] x 16 bytes {int32 source rank, int32 entry
 *              t * topk + k, float32 weight, int32 0}
 *   recv_off   receive region (recv_x): [recv_rows][row_bytes]
 *   comb_off   combine region: [max_tokens][topk][row_bytes]: the expert output of this
 *              rank's entry (t, k), written by the rank of its expert
 * The handle (caller's memory), offsets multiples of 16 bytes:
 *   0          header (maco__ep_handle_header_t)
 *   h_exp_off  int32 base[L], then int32 count[L]: each local expert's first row and rows
 *   h_slot_off int32 slot[max_tokens][topk]: this rank's routing (-1: entry not sent)
 *   h_meta_off int32 [recv_rows][2]: per received row, {source rank, entry t * topk + k}
 */
#ifndef MACO_EP_LAYOUT_H
#define MACO_EP_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "algorithms/tuning.h"
#include "maco/ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Byte offsets of the control words at the start of the buffer. Written by peers: the u64
 * arrays (one word per source rank). Local only: the sequence numbers and CTA counters. */
enum {
    MACO__EP_CTRL_DISP_SEQ = 0,     /* u64: the last dispatch's sequence number (local) */
    MACO__EP_CTRL_COMB_SEQ = 8,     /* u64: the last combine's (local) */
    MACO__EP_CTRL_DISP_DONE = 16,   /* u32: dispatch CTAs finished this launch (local) */
    MACO__EP_CTRL_COMB_DONE = 20,   /* u32: combine CTAs finished this launch (local) */
    MACO__EP_CTRL_DISP_WORK = 24,   /* u32: dispatch entries taken by warps this launch (local) */
    MACO__EP_CTRL_DATA_DONE = 64,   /* u64 [src]: dispatch CTAs of src done writing here */
    MACO__EP_CTRL_READY = 192,      /* u64 [src]: combine seq << 8 | src's status */
    MACO__EP_CTRL_CNT_FLAG = 256,   /* u64 [parity 2][8 src]: seq of src's count row there */
    MACO__EP_CTRL_READY_INFO = 384, /* u64 [src]: value | limit << 32 of src's combine status */
    MACO__EP_CTRL_GROUP = 2048,     /* u64 [group 32][8 src]: combine CTAs of src that have
                                     * written this rank's rows of a token group */
    MACO__EP_CTRL_BYTES = 4096,
    MACO__EP_ROW_HEADER = 8,   /* int32 words before the counts of a count row */
    MACO__EP_MAX_GROUPS = 32,  /* token groups of a combine (maco__ep_group_tokens) */
    MACO__EP_SORT_ROWS = 2048, /* rows a combine CTA sorts by group (more: unsorted) */
    MACO__EP_THREADS = 512,    /* threads per CTA of both kernels */
};

/* What went wrong in a launch (the count row's header word 0, a ready flag's low byte, the
 * report's code). 0: nothing. */
enum {
    MACO__EP_OK = 0,
    MACO__EP_BAD_EXPERT = 1, /* topk_idx[t][k] = value outside [-1, limit) */
    MACO__EP_REPEAT = 2,     /* topk_idx[t][k] = value, already at column limit of row t */
    MACO__EP_OVERFLOW = 3,   /* rank would receive value rows; the region holds limit */
    MACO__EP_FOREIGN = 4,    /* combine: the handle was not written by this buffer */
    MACO__EP_FAILED = 5,     /* combine: the handle's dispatch failed (code in value) */
    MACO__EP_TOKENS = 6,     /* combine: num_tokens value, the handle's dispatch had limit */
};

/** The first problem of a launch: code (above), rank, entry (token, k), value and limit. */
typedef struct maco__ep_bad {
    int32_t code, rank, token, k;
    int64_t value, limit;
} maco__ep_bad_t;

/* A buffer's shape, as the host checked it and the kernels use it. */
typedef struct maco__ep_geom {
    int32_t mode;          /* maco_ep_mode_t */
    int32_t nranks;        /* n */
    int32_t num_experts;   /* E */
    int32_t local_experts; /* L = E / n */
    int32_t topk;          /* K */
    int32_t hidden;        /* elements per row */
    int32_t max_tokens;    /* max_tokens_per_rank */
    int32_t num_ctas;      /* requested (0: default); the buffer's after the cap */
    int64_t recv_rows;     /* rows of the receive region */
    int64_t expert_cap;    /* low latency: n * max_tokens rows per local expert; normal: 0 */
    uint64_t row_bytes;    /* hidden * 2 */
} maco__ep_geom_t;

/* Where things are in the buffer and in a handle (file comment), in bytes. */
typedef struct maco__ep_offsets {
    uint64_t cnt_off, cnt_row_bytes, chunk_off, meta_off, recv_off, comb_off, total_bytes;
    uint64_t h_exp_off, h_slot_off, h_meta_off, handle_bytes;
} maco__ep_offsets_t;

/* The handle's first 64 bytes. magic is written last by the dispatch (kernel end). */
typedef struct maco__ep_handle_header {
    uint32_t magic;     /* MACO__EP_HANDLE_MAGIC */
    int32_t status;     /* 0, or the MACO__EP_* code that stopped the dispatch */
    uint64_t buffer_id; /* the buffer's random id: a handle of another buffer is refused */
    int32_t num_tokens; /* the dispatch's */
    int32_t nranks, local_experts, topk;
    int64_t num_recv; /* rows this rank received */
    uint64_t seq;     /* the dispatch's sequence number (diagnostics) */
    uint8_t pad[16];
} maco__ep_handle_header_t;
#define MACO__EP_HANDLE_MAGIC 0x4850454du /* "MEPH" little-endian */

#if defined(__CUDACC__)
#define MACO__EP_HD __host__ __device__
#else
#define MACO__EP_HD
#endif

/* Tokens per group (GT) of the combine's pipeline (ep_kernels.cu, combine step 3): the rows
 * of a source rank's tokens [g * GT, (g + 1) * GT) travel, are signalled and are summed together;
 * at least MACO__TUNING_EP_COMBINE_GROUP_TOKENS_MIN tokens (a group's signal and wait cost about
 * as much as moving many rows: algorithms/tuning.h), at most MACO__EP_MAX_GROUPS groups of
 * max_tokens. The same on every rank. */
static inline MACO__EP_HD int maco__ep_group_tokens(int max_tokens)
{
    int g = (max_tokens + MACO__EP_MAX_GROUPS - 1) / MACO__EP_MAX_GROUPS;
    return g < MACO__TUNING_EP_COMBINE_GROUP_TOKENS_MIN ? MACO__TUNING_EP_COMBINE_GROUP_TOKENS_MIN
                                                        : g;
}

/**
 * Checks `cfg` for `nranks` ranks and fills *g and *o (when not NULL). MACO_OK, or
 * MACO_ERR_INVALID_ARGUMENT / MACO_ERR_UNSUPPORTED with one sentence naming the field, its
 * value and the limit in `why` (why_bytes > 0). num_ctas stays as configured (0: default).
 */
maco_status_t maco__ep_plan(const maco_ep_config_t *cfg, int nranks, maco__ep_geom_t *g,
                            maco__ep_offsets_t *o, char *why, size_t why_bytes);

/**
 * One rank's routing, as its dispatch kernel computes it: for entry i = t * topk + k of the
 * first num_tokens rows, slot[i] is its position among this rank's entries for the same
 * expert in token order (the row it takes among this source's rows for that expert), or -1
 * when it is -1 or invalid; count[e] (E entries) the entries per expert. Returns 0, or 1
 * with *bad (rank -1) the first invalid entry in (t, k) order: an expert outside
 * [-1, num_experts) (MACO__EP_BAD_EXPERT, limit num_experts) or one that an earlier column
 * of the same row names (MACO__EP_REPEAT, limit that column). slot has num_tokens * topk
 * entries; bad may be NULL.
 */
int maco__ep_route(const int64_t *topk_idx, int num_tokens, int topk, int num_experts,
                   int32_t *slot, int32_t *count, maco__ep_bad_t *bad);

/**
 * The receive layout of rank `dst` from every rank's counts (`counts`: [nranks][E], rank
 * r's row = its count[]): base[l] and total[l] for each local expert l of dst (first row in
 * recv_x and rows received), and *num_recv_p the rows received in all. Low latency:
 * base[l] = l * expert_cap; normal: the exclusive prefix sum of total.
 */
void maco__ep_recv_layout(const maco__ep_geom_t *g, const int32_t *counts, int dst, int64_t *base,
                          int64_t *total, int64_t *num_recv_p);

/**
 * The row of recv_x at rank `expert / L` where the entry of source rank `src` for `expert`
 * with routing slot `slot` lands: base of the expert + the counts of lower source ranks for
 * it + slot. `counts` as above.
 */
int64_t maco__ep_recv_row(const maco__ep_geom_t *g, const int32_t *counts, int src, int expert,
                          int32_t slot);

/**
 * The first rank (in rank order) that would receive more rows than the receive region holds
 * (normal mode), with its rows and the capacity in *bad (code MACO__EP_OVERFLOW); 0 when
 * none (always in low latency mode, whose capacity holds every case).
 */
int maco__ep_overflow(const maco__ep_geom_t *g, const int32_t *counts, maco__ep_bad_t *bad);

/**
 * The argument checks of maco_ep_dispatch and maco_ep_combine that need only the buffer's
 * shape (maco/ep.h lists them): MACO_OK, or MACO_ERR_INVALID_ARGUMENT with one sentence in
 * `why` that starts with the call's name and names the argument and the limit. Pointers are
 * only compared with NULL and checked for alignment. want_num_recv: num_recv_p is not NULL.
 * fp8: the call is maco_ep_dispatch_fp8 (its name in messages; hidden a multiple of 128).
 */
maco_status_t maco__ep_check_dispatch(const maco__ep_geom_t *g, int fp8, const void *x,
                                      maco_datatype_t x_dtype, int num_tokens, int hidden,
                                      const int64_t *topk_idx, const float *topk_weights, int topk,
                                      const int32_t *recv_counts, const int32_t *recv_offsets,
                                      const float *recv_topk_weights, const void *handle,
                                      int want_num_recv, char *why, size_t why_bytes);
maco_status_t maco__ep_check_combine(const maco__ep_geom_t *g, const void *expert_out,
                                     maco_datatype_t dtype, int hidden, const void *handle,
                                     const float *topk_weights, int num_tokens, int topk,
                                     const void *y, char *why, size_t why_bytes);

/** One sentence for a problem found on the device, for call `fn` ("maco_ep_dispatch"). */
void maco__ep_bad_text(const maco__ep_bad_t *bad, const char *fn, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif

#endif /* MACO_EP_LAYOUT_H */
