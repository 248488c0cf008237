/*
 * maco/ep.h - expert parallelism: mixture-of-experts dispatch and combine.
 *
 * An EP buffer is made once for a communicator and a shape (tokens per rank, hidden size,
 * experts, top-k, mode). Each call then moves tokens between the ranks of one node over
 * peer-mapped GPU memory (the memory channels' mappings):
 *
 *   dispatch  every rank sends each token row x[t] to the rank that holds each of its top-k
 *             experts topk_idx[t][k]; on the receiving rank the rows arrive packed per local
 *             expert in the buffer's receive region (recv_x), in a fixed order: by local
 *             expert, then by source rank, then by the source's token order;
 *   combine   every rank sends each expert output row back to the token's rank, which sums
 *             them: y[t] = sum over k = 0, 1, ..., topk-1 of topk_weights[t][k] * out(t, k),
 *             where out(t, k) is the row its expert topk_idx[t][k] produced for token t.
 *
 * Terms. E experts over n ranks: rank r holds the L = E / n local experts
 * [r * L, (r + 1) * L); expert e lives on rank e / L as local expert e % L. A "row" is one
 * token's `hidden` elements (hidden * 2 bytes in bfloat16). An "entry" is one (t, k) of
 * topk_idx; entries with topk_idx[t][k] == -1 send nothing. Counts are in rows, sizes in
 * bytes, shapes row-major.
 *
 * Modes (chosen at creation; same calls):
 *   MACO_EP_LOW_LATENCY  decode-sized batches. The receive region has a fixed capacity per
 *                        local expert (expert_capacity = n * max_tokens_per_rank rows, the
 *                        most one expert can receive): recv_x is [L][expert_capacity][hidden]
 *                        and local expert e's rows start at row e * expert_capacity. No call
 *                        synchronises the host: dispatch and combine are single kernel
 *                        launches that can be captured in a CUDA graph and replayed (every
 *                        per-launch state lives on the device).
 *   MACO_EP_NORMAL       prefill-sized batches. recv_x is packed: [num_recv][hidden], local
 *                        expert e's rows start at recv_offsets[e] (the counts of experts
 *                        before it). The receive region holds max_recv_tokens rows, fewer
 *                        than the worst case; dispatch can return num_recv to the host (it
 *                        then waits for the count exchange, see maco_ep_dispatch).
 *
 * How it moves (docs/ep.md): a call first exchanges a small header with every rank (a
 * dispatch exchanges every rank's per-expert counts; a combine a ready flag), so that all
 * ranks know where every row goes and every rank decides alike to go on or to stop; then
 * every row is written once, straight into its place in the peer's buffer (16-byte stores
 * over NVLink), and each rank waits for its peers' done counters. Rows are not merged per
 * destination rank: a token with two experts on one rank is sent twice.
 *
 * Determinism. The receive order is fixed (above) and combine sums in k order in float32,
 * each term fused as acc = fmaf(topk_weights[t][k], float(row), acc) from acc = 0, rounded
 * once to bfloat16 (round to nearest even): the same inputs give the same bits on every run.
 *
 * Scope of this version: ranks of one node (one rank per GPU, or ranks sharing GPUs under
 * MPS), at most 8 ranks; bfloat16 rows, sent as they are or quantized to fp8 e4m3 on the way
 * (maco_ep_dispatch_fp8). Communicators that span nodes and receive hooks are not there yet
 * (MACO_ERR_UNSUPPORTED says so).
 *
 * Streams and order: a call enqueues its work on `stream` and returns (normal-mode dispatch
 * with num_recv_p waits, see there). Every rank must make the same EP calls on a buffer in
 * the same order, and a buffer's calls must execute in call order (one stream, or streams
 * ordered with events). Calls on one buffer come from one host thread at a time. EP kernels
 * wait on peers, like the collectives: do not run them beside other kernels that wait on
 * peers unless all their CTAs fit (maco_comm_get_coresident_ctas).
 *
 * Memory: x, topk_idx, topk_weights, expert_out, y, the counts and the handle are device
 * memory of the communicator's GPU (cudaMalloc, PyTorch's allocator, ...), registered or
 * not, 16-byte aligned (x, expert_out, y, handle) or aligned to their element (the others).
 * The receive region belongs to the buffer.
 *
 * Errors common to the calls (nothing enqueued, nothing written): MACO_ERR_INVALID_ARGUMENT
 * for a NULL buffer or required pointer, a size or type that differs from the buffer's, more
 * tokens than max_tokens_per_rank, a misaligned pointer, a stream of another device (the
 * message names the argument and the limit); MACO_ERR_INVALID_USAGE after an asynchronous
 * error of the communicator; MACO_ERR_CUDA when the launch fails. A device wait that passes
 * MACO_DEVICE_TIMEOUT (a dead or stuck peer) stops the kernel and is reported by
 * maco_comm_get_async_error, naming the peer: nothing hangs.
 *
 * Input errors found on the device (topk_idx holds an expert outside [-1, E) or one expert
 * twice in a row; normal mode: a rank would receive more than max_recv_tokens rows; combine:
 * a handle of another buffer or of a failed dispatch, or num_tokens other than the
 * dispatch's): the call's header exchange carries them, so every rank stops the same launch
 * before any row moves; recv_x, the counts, recv_topk_weights and y are not written (the
 * handle records the failure, so a combine on it stops too). Normal-mode dispatch with
 * num_recv_p returns the error itself (MACO_ERR_INVALID_ARGUMENT naming the rank, the entry,
 * its value and the limit); otherwise it is kept in the buffer and returned by
 * maco_ep_buffer_check. The buffer and the communicator stay usable.
 */
#ifndef MACO_EP_H
#define MACO_EP_H

#include <stddef.h>
#include <stdint.h>

#include "maco/collectives.h"
#include "maco/comm.h"
#include "maco/export.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** An EP buffer bound to one communicator (opaque). */
typedef struct maco_ep_buffer *maco_ep_buffer_t;

typedef enum maco_ep_mode {
    MACO_EP_LOW_LATENCY = 0, /**< fixed capacity per local expert; no host synchronisation */
    MACO_EP_NORMAL = 1,      /**< packed receive region; counts can reach the host */
    MACO_EP_MODE_COUNT
} maco_ep_mode_t;

/* Limits of the configuration (maco_ep_buffer_create checks them). */
#define MACO_EP_MAX_RANKS 8            /**< ranks of the communicator (one node) */
#define MACO_EP_MAX_EXPERTS 1024       /**< num_experts */
#define MACO_EP_MAX_TOPK 32            /**< topk */
#define MACO_EP_MAX_TOKENS 65536       /**< max_tokens_per_rank */
#define MACO_EP_MAX_HIDDEN 65536       /**< hidden, in elements */
#define MACO_EP_HIDDEN_ALIGN 8         /**< hidden is a multiple of this (16-byte rows) */
#define MACO_EP_DEFAULT_CTAS_LL 16     /**< num_ctas 0, low latency */
#define MACO_EP_DEFAULT_CTAS_NORMAL 24 /**< num_ctas 0, normal */
#define MACO_EP_FP8_BLOCK 128          /**< maco_ep_dispatch_fp8: elements per scale */
#define MACO_EP_FP8_MAX 448.0f         /**< the largest finite e4m3 value (OCP FP8) */
#define MACO_EP_FP8_MIN_AMAX 1e-4f     /**< a block's amax is at least this (no 0 scale) */

/**
 * The shape of an EP buffer. Zero-initialise it, then set the fields; every rank passes the
 * same values (maco_ep_buffer_create checks).
 */
typedef struct maco_ep_config {
    maco_ep_mode_t mode;
    /** Tokens one rank dispatches at most per call, in [1, MACO_EP_MAX_TOKENS]. */
    int max_tokens_per_rank;
    /** Elements per token row, a multiple of MACO_EP_HIDDEN_ALIGN in [8, MACO_EP_MAX_HIDDEN]. */
    int hidden;
    /** Experts over all ranks, a multiple of the number of ranks, at most MACO_EP_MAX_EXPERTS. */
    int num_experts;
    /** Experts per token (topk_idx's second dimension), in [1, min(MACO_EP_MAX_TOPK, E)]. */
    int topk;
    /** Type of x, recv_x, expert_out and y: MACO_BFLOAT16 (the only one in this version). */
    maco_datatype_t dtype;
    /**
     * Normal mode: rows of the receive region, in [1, worst case]; 0 = the worst case
     * n * max_tokens_per_rank * min(topk, L) (every token of every rank to this rank, once
     * per local expert it names). A dispatch that would bring a rank more rows fails on every
     * rank (nothing written). Low latency: must be 0 (the capacity is L * expert_capacity).
     */
    int64_t max_recv_tokens;
    /**
     * CTAs (thread blocks, one SM each) of every dispatch and combine kernel; 0 = the default
     * (MACO_EP_DEFAULT_CTAS_LL or _NORMAL). Capped at the co-resident bound of waiting
     * kernels (maco_comm_get_coresident_ctas, halved when ranks share a GPU).
     */
    int num_ctas;
} maco_ep_config_t;

/** What a buffer is, from maco_ep_buffer_get_info. */
typedef struct maco_ep_info {
    int nranks, rank;
    int local_experts;       /**< L = num_experts / nranks */
    int num_ctas;            /**< CTAs each kernel launches (after the cap) */
    int64_t recv_rows;       /**< rows of the receive region */
    int64_t expert_capacity; /**< low latency: rows per local expert; normal: 0 */
    void *recv_x;            /**< the receive region: recv_rows x hidden elements (device) */
    size_t buffer_bytes;     /**< device memory of the buffer on this rank */
    size_t handle_bytes;     /**< bytes of device memory a dispatch handle needs */
} maco_ep_info_t;

/**
 * The device memory of a buffer of `config` over `nranks` ranks and of one dispatch handle,
 * in bytes, without creating anything: the same numbers maco_ep_buffer_get_info reports.
 * No GPU needed. Thread-safe.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL pointer, nranks outside [1, MACO_EP_MAX_RANKS], a
 * configuration maco_ep_buffer_create would refuse: the message names the field and limit),
 * MACO_ERR_UNSUPPORTED (a dtype other than bfloat16).
 */
MACO_API maco_status_t maco_ep_buffer_size(const maco_ep_config_t *config, int nranks,
                                           size_t *buffer_bytes_p, size_t *handle_bytes_p);

/**
 * Creates an EP buffer on `comm` (collective: every rank calls it with the same `config`):
 * allocates this rank's buffer (maco_ep_buffer_size's bytes of device memory on the
 * communicator's device: control words, the count exchange, the receive region with 16
 * bytes of metadata per row, and the combine region of max_tokens_per_rank x topk rows),
 * registers it and maps every peer's. Blocking, bounded by MACO_BOOTSTRAP_TIMEOUT. *buf_p is
 * written only on success; destroy the buffer before the communicator.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL argument, a field outside its limit, or ranks that
 * passed different configurations: the message names the first field and rank that differ);
 * MACO_ERR_UNSUPPORTED (no GPU, ranks on several nodes, more than MACO_EP_MAX_RANKS ranks, a
 * dtype other than bfloat16); MACO_ERR_CUDA (allocation, mapping); MACO_ERR_NO_MEMORY;
 * MACO_ERR_TIMEOUT / MACO_ERR_REMOTE (a peer failed during the exchange). Not thread-safe
 * with other calls on `comm`.
 */
MACO_API maco_status_t maco_ep_buffer_create(maco_comm_t comm, const maco_ep_config_t *config,
                                             maco_ep_buffer_t *buf_p);

/**
 * Frees the buffer after waiting for its device's work (cudaDeviceSynchronize). Not
 * collective: each rank destroys its own once its EP calls have completed. NULL is a no-op.
 * Returns MACO_OK, or the first error met while freeing (MACO_ERR_CUDA); freed either way.
 */
MACO_API maco_status_t maco_ep_buffer_destroy(maco_ep_buffer_t buf);

/** Fills *info_p. Errors: MACO_ERR_INVALID_ARGUMENT (NULL). Non-blocking, thread-safe. */
MACO_API maco_status_t maco_ep_buffer_get_info(maco_ep_buffer_t buf, maco_ep_info_t *info_p);

/**
 * Dispatch: sends this rank's tokens to their experts' ranks (collective over the
 * communicator, stream-ordered).
 *
 * Inputs (device memory, read by the kernel):
 *   x             [num_tokens][hidden] of x_dtype (bfloat16), 16-byte aligned;
 *   topk_idx      [num_tokens][topk] int64: an expert in [0, E), or -1 for none; a row must
 *                 not name one expert twice (checked on the device, see the file comment);
 *   topk_weights  [num_tokens][topk] float32, or NULL: copied to recv_topk_weights.
 * num_tokens in [0, max_tokens_per_rank] (0: this rank sends nothing but takes part);
 * hidden, topk and x_dtype must be the buffer's.
 *
 * Outputs (written by the kernel, stream-ordered):
 *   recv_x (the buffer's receive region, maco_ep_info_t.recv_x) rows of the tokens received:
 *                 low latency: local expert e's j-th row at row e * expert_capacity + j;
 *                 normal: at row recv_offsets[e] + j; rows from source rank s come before
 *                 those of rank s + 1, each source's in its token order. Valid until the
 *                 next dispatch on this buffer starts on the device (the next dispatch on
 *                 every rank waits for this rank's stream to reach it before writing there,
 *                 so work queued on the same stream in between may read recv_x, or write
 *                 expert outputs into it);
 *   recv_counts   [L] int32 (required): rows received per local expert;
 *   recv_offsets  [L + 1] int32 or NULL: first row of each local expert, then the end
 *                 (low latency: e * expert_capacity; normal: the exclusive prefix sum);
 *   recv_topk_weights  [recv_rows] float32 or NULL: the weight of each received row (0 when
 *                 the sender passed no weights); rows past each expert's count untouched;
 *   handle        handle_bytes (maco_ep_info_t) of device memory, 16-byte aligned
 *                 (required): what combine needs (where every received row goes back, which
 *                 of this rank's entries were sent). Opaque; valid for any number of
 *                 combines until the caller rewrites it; do not reuse it for a dispatch
 *                 while a combine reading it may still run.
 *
 * num_recv_p (host, may be NULL): normal mode only: when not NULL the call waits for its
 * count exchange (an event on `stream`: the host blocks until the stream reaches and ends
 * the dispatch kernel, so it cannot be captured in a graph) and writes the rows this rank
 * received, and input errors found on the device are returned by this call. NULL, and
 * always in low latency mode: nothing waits; a low-latency call with num_recv_p not NULL
 * is refused (MACO_ERR_INVALID_ARGUMENT).
 *
 * Errors: the common ones; MACO_ERR_INVALID_ARGUMENT also for a device-found input error
 * (normal mode with num_recv_p); MACO_ERR_INVALID_USAGE for num_recv_p while `stream`
 * captures a graph; MACO_ERR_TIMEOUT / MACO_ERR_REMOTE / MACO_ERR_CUDA when the waited-for
 * kernel failed (the communicator's asynchronous error).
 */
MACO_API maco_status_t maco_ep_dispatch(maco_ep_buffer_t buf, const void *x,
                                        maco_datatype_t x_dtype, int num_tokens, int hidden,
                                        const int64_t *topk_idx, const float *topk_weights,
                                        int topk, int32_t *recv_counts, int32_t *recv_offsets,
                                        float *recv_topk_weights, void *handle, int64_t *num_recv_p,
                                        maco_stream_t stream);

/**
 * Dispatch with the rows quantized to fp8 e4m3 on the way (half the bytes over NVLink): the
 * same call, arguments, outputs, errors and ordering as maco_ep_dispatch, and x still
 * bfloat16, but each row of recv_x that a token lands in holds, instead of hidden bfloat16
 * values (its first 2 x hidden bytes are the row, as always):
 *   bytes [0, hidden)                  hidden e4m3 values (1 byte each);
 *   bytes [hidden, hidden + hidden / 32)  hidden / MACO_EP_FP8_BLOCK float32 scales;
 *   the rest of the row                untouched.
 * hidden must be a multiple of MACO_EP_FP8_BLOCK (128). For block b of a row (elements
 * [128 b, 128 b + 128)): amax = max(MACO_EP_FP8_MIN_AMAX, max |x|), value i = e4m3(x_i *
 * (MACO_EP_FP8_MAX / amax)) rounded to nearest even with saturation to +-448 (CUDA's
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE), scale b = amax / MACO_EP_FP8_MAX (float32
 * divisions, IEEE rounding), so x_i ~ value_i * scale_b. The per-128-element e4m3 layout is
 * DeepSeek-V3's (its technical report, "FP8 training"), as DeepEP's low-latency dispatch
 * uses it; here the scales follow the values inside the row rather than in a tensor of
 * their own. A NaN element gives a NaN value and is ignored by its block's amax. Combine
 * takes bfloat16 expert outputs in recv_x's layout as before (they may overwrite the fp8
 * rows in place). Errors: maco_ep_dispatch's, named for this call, and
 * MACO_ERR_INVALID_ARGUMENT for a hidden that is not a multiple of 128.
 */
MACO_API maco_status_t maco_ep_dispatch_fp8(maco_ep_buffer_t buf, const void *x,
                                            maco_datatype_t x_dtype, int num_tokens, int hidden,
                                            const int64_t *topk_idx, const float *topk_weights,
                                            int topk, int32_t *recv_counts, int32_t *recv_offsets,
                                            float *recv_topk_weights, void *handle,
                                            int64_t *num_recv_p, maco_stream_t stream);

/**
 * Combine: sends every expert output row back to its token's rank and sums them there
 * (collective over the communicator, stream-ordered, never waits on the host; capturable).
 *
 *   expert_out    the expert outputs in recv_x's layout (the handle's dispatch): row
 *                 e * expert_capacity + j (low latency) or recv_offsets[e] + j (normal) is
 *                 the output for the received row at that place; [recv_rows or num_recv]
 *                 x hidden elements of dtype (bfloat16), 16-byte aligned. It may be recv_x
 *                 itself (outputs written in place).
 *   handle        written by a dispatch on this buffer.
 *   topk_weights  [num_tokens][topk] float32 of this rank's tokens (as given to dispatch or
 *                 any other weights).
 *   num_tokens    the handle's dispatch's num_tokens (checked on the device).
 *   y             [num_tokens][hidden] of dtype, 16-byte aligned: y[t] = the file comment's
 *                 sum (0 for a token whose entries are all -1). May not overlap expert_out.
 *
 * Errors: the common ones. A handle of another buffer or of a failed dispatch, or another
 * num_tokens, is found on the device (file comment): y is not written, maco_ep_buffer_check
 * reports it.
 */
MACO_API maco_status_t maco_ep_combine(maco_ep_buffer_t buf, const void *expert_out,
                                       maco_datatype_t dtype, int hidden, const void *handle,
                                       const float *topk_weights, int num_tokens, int topk, void *y,
                                       maco_stream_t stream);

/**
 * Reports input errors the device found in this buffer's launches that ended so far
 * (synchronise the stream first to include the last ones) and no call returned yet: each
 * is reported once. Returns MACO_OK when there is none, else MACO_ERR_INVALID_ARGUMENT with
 * the first new one's message (logged; which call, which rank, the entry, its value and the
 * limit). Non-blocking (reads pinned host memory). Thread-safe with the buffer's calls.
 */
MACO_API maco_status_t maco_ep_buffer_check(maco_ep_buffer_t buf);

#ifdef __cplusplus
}
#endif

#endif /* MACO_EP_H */
