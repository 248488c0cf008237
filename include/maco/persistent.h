/*
 * maco/persistent.h - the persistent-kernel runtime: a graph of tasks (element-wise compute,
 * copies, signals and waits, channel puts, GEMM tiles through cuBLASDx; user types in a kernel
 * of the user's own) built on the host, checked and uploaded once, and run by ONE kernel launch
 * whose CTAs are compute workers, communication workers and schedulers (device side and
 * protocols: maco/device/persistent.h). Fused GEMM + allreduce, GEMM + reduce-scatter and
 * allgather + GEMM are graph builders made of these tasks (maco_task_graph_add_gemm_allreduce,
 * _gemm_reduce_scatter and _allgather_gemm). The
 * profile (per-task start, end and SM) becomes a Chrome trace and a summary table.
 *
 *   maco_task_graph_t graph;             build: add tasks and dependencies (no GPU needed)
 *   maco_task_graph_validate(graph);     optional: create() validates too
 *   maco_persistent_kernel_create(comm, graph, &config, &pk);   checks, uploads (blocking)
 *   maco_persistent_kernel_launch(pk, stream);                  runs the whole graph
 *   maco_persistent_kernel_launch(pk, stream);                  again: same graph, new inputs
 *
 * A launch runs every task once, a task only after all the tasks it depends on have finished
 * (their writes visible to it), and returns when all have finished. Launches of one kernel
 * object must not overlap (issue them on one stream, or order the streams); a launch can be
 * captured in a CUDA graph and replayed. Every wait inside a launch is bounded by the
 * communicator's MACO_DEVICE_TIMEOUT; a failure (a wait that timed out, a task that failed)
 * ends the launch early and is reported by maco_comm_get_async_error() with a message naming
 * the task; after that the kernel object (like the communicator) must be destroyed.
 *
 * Thread-safety: a graph or kernel object is used by one thread at a time.
 */
#ifndef MACO_PERSISTENT_H
#define MACO_PERSISTENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "maco/collectives.h"
#include "maco/comm.h"
#include "maco/device/memory_channel.h"
#include "maco/port_channel.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco_task_graph *maco_task_graph_t;
typedef struct maco_persistent_kernel *maco_persistent_kernel_t;

/** What a task does. Element-wise types compute in fp32 and round once to `datatype`. */
typedef enum maco_task_type {
    MACO_TASK_NOP = 0,            /**< nothing (a join point of dependencies) */
    MACO_TASK_COPY = 1,           /**< out[0..count) = a[0..count): `count` BYTES, any alignment */
    MACO_TASK_ADD = 2,            /**< out[i] = a[i] + b[i], i < count (elements) */
    MACO_TASK_SCALE = 3,          /**< out[i] = alpha * a[i] */
    MACO_TASK_RESIDUAL_ADD = 4,   /**< out[i] = a[i] + alpha * b[i] (fmaf(alpha, b[i], a[i])) */
    MACO_TASK_SIGNAL = 5,         /**< adds 1 to the uint64_t counter at `out` (release) */
    MACO_TASK_WAIT = 6,           /**< waits until the uint64_t counter at `a` >= count * run
                                       (count: 1 to 2^32 - 1) */
    MACO_TASK_CHANNEL_PUT = 7,    /**< channel `channel`: remote[dst_offset..+count bytes) =
                                       local[src_offset..) */
    MACO_TASK_CHANNEL_SIGNAL = 8, /**< signals the channel's peer */
    MACO_TASK_CHANNEL_WAIT = 9,   /**< waits for the channel's peer's next signal */
    MACO_TASK_GEMM_TILE = 10,     /**< one MACO_GEMM_TILE_M x tile_n tile of C = A x B (see
                                       maco_task_t) */
    MACO_TASK_SUM = 11,           /**< out[i] = in_0[i] + ... + in_{ninputs-1}[i] in that order,
                                       in_j = a + j * input_stride (bytes) */
    MACO_TASK_PORT_PUT = 12,      /**< port channel `channel`: queue a put of `count` bytes (0:
                                       none) and a signal to the proxy (see maco_task_t) */
    MACO_TASK_PORT_FLUSH = 13,    /**< waits until the proxy of port channel `channel` carried
                                       out every trigger this GPU queued before it */
    MACO_TASK_TYPE_COUNT = 14,
    /** First user type: run by the `user` function of a kernel the user compiles around
     * maco_pk_run() (maco/device/persistent.h; maco_persistent_kernel_get_launch). */
    MACO_TASK_USER = 256,
} maco_task_type_t;

/**
 * Which CTAs run a task. A task that waits (WAIT, CHANNEL_WAIT) holds its CTA until its
 * signal comes, and the tasks queued behind it on that CTA wait too; so AUTO gives waits the
 * COMM role (communication workers) and every other task, puts and signals included, the
 * COMPUTE role (compute workers never block, so whatever a wait waits for on this rank is
 * never stuck behind it). Give the kernel at least as many communication workers as waits that
 * can be ready at once (chain the waits of one channel anyway: see maco_task_t).
 */
typedef enum maco_task_role {
    MACO_TASK_ROLE_AUTO = 0,
    MACO_TASK_ROLE_COMPUTE = 1, /**< compute workers */
    MACO_TASK_ROLE_COMM = 2,    /**< communication workers (compute workers when none) */
} maco_task_role_t;

/**
 * A task. Zero-initialise it and set what its type uses:
 * - element-wise (ADD, SCALE, RESIDUAL_ADD): datatype (MACO_FLOAT32, MACO_FLOAT16 or
 *   MACO_BFLOAT16), count (elements, >= 1), out, a, b (not SCALE), alpha (SCALE and
 *   RESIDUAL_ADD); device pointers aligned to the element size. out may equal a or b.
 *   A 2D block: rows (2..65535; 0 or 1: one row of count elements), ld_in (row stride of a and
 *   b) and ld_out (of out), in elements, each at least count and below 2^24.
 * - COPY: out, a, count (bytes); the ranges must not overlap. A 2D block: rows (2..65535) of
 *   count bytes, ld_in and ld_out the row strides in BYTES (each at least count, below 2^24).
 * - SUM: an element-wise task (datatype, count, rows, ld_in, ld_out, out as for ADD) over
 *   ninputs (1..64) inputs, a, a + input_stride, a + 2 * input_stride, ... (input_stride in
 *   bytes, a multiple of the element size), each with row stride ld_in: out = the inputs summed
 *   in that order in fp32 and rounded once. A reduction in rank order is a SUM over per-rank
 *   slots. out_datatype: the output's type where it differs from the inputs' (MACO_BFLOAT16
 *   from MACO_FLOAT32 inputs: the fp32 partial products of a split-K GEMM rounded once; 0, i.e.
 *   MACO_INT8, which is no element-wise type: the same as datatype); ld_out and out's alignment
 *   then count in the output's elements.
 * - Any task may have a gate and a signal (maco/device/persistent.h, "Gates and signals"):
 *   wait_on (an 8-byte aligned uint64_t counter on this rank's GPU or host-mapped, never
 *   reset) with wait_count >= 1: the task starts only once the counter reaches wait_count *
 *   (r + 1) in launch r of the kernel, after its dependencies; with wait_need (1 ..
 *   wait_count; 0: wait_count), once it reaches wait_count * r + wait_need: the wait_need-th of
 *   the launch's signals, where they come in a known order (a port channel's semaphore, which
 *   counts the peer's signals of every kind); `signal_to` (such a counter, or a
 *   peer's through a memory channel's mapping): 1 is added to it (release, system scope) after
 *   the task's writes. wait_peer names the rank expected to signal wait_on (-1: several) in a
 *   timeout's message. A worker that pops a task whose gate is still closed puts it back at the
 *   end of its queue and runs the next one, so a closed gate holds no worker (with more than
 *   4095 tasks of a role a worker may instead wait at the gate: then give gated tasks that
 *   wait for peers a role whose workers cannot be what those peers wait for).
 * - Mirrors (a task's writes repeated on peers, in the same pass): a SUM or COPY task with
 *   out_mirror_count = c (1..8) also writes its output through graph channels
 *   out_mirror_channel .. + c - 1, at the same offset of each channel's remote buffer as out
 *   has in its local buffer (every byte written must lie inside both). With
 *   signal_mirror_count = c, the signal goes not to signal_to but to its twin in each of the
 *   channels signal_mirror_channel .. + c - 1 (signal_to inside their local buffers). One task
 *   then sends a tile to every peer and tells each of them.
 * - SIGNAL: out, a device or host-mapped uint64_t counter (8-byte aligned) that is never reset.
 * - WAIT: a, such a counter; count (1 to 2^32 - 1): the signals it gets per launch. The wait of the
 *   launch numbered r (0, 1, ...) of this kernel object ends once the counter is at least
 *   count * (r + 1).
 * - PORT_PUT: channel (from maco_task_graph_add_port_channel); count (bytes, below 2^32; 0:
 *   a signal alone), src_offset (in the channel's source buffer) and dst_offset (in its
 *   destination), both ranges inside their buffers. The task queues the put and a signal into
 *   the proxy's FIFO (maco/device/port_channel.h: put_with_signal, or signal) and ends: the
 *   copy engines (CUDA copy transport) or the proxy (other transports) move the data after it,
 *   and the peer's semaphore of the channel (its handle's semaphore.inbound, which counts
 *   every signal of the channel, never reset) goes up by one once the data is there. What
 *   the task depends on is what the put carries (the FIFO's push orders it before the
 *   trigger). Pushes of one GPU are carried out in the order they were queued: order puts to
 *   one peer by dependencies where their signals must come in a known order (a gate with
 *   wait_need then waits for the n-th). AUTO gives it the COMPUTE role, as a put waits only
 *   for room in the FIFO (bounded).
 * - PORT_FLUSH: channel: waits (bounded) until the channel's proxy carried out every trigger
 *   this GPU pushed into its FIFO before the flush and their data landed (sources may then be
 *   reused). AUTO gives it the COMM role.
 * - CHANNEL_*: channel (from maco_task_graph_add_channel); PUT also count (bytes),
 *   src_offset (in the channel's local buffer) and dst_offset (in its remote one), both
 *   ranges inside their buffers. Waits on one channel must be ordered by dependencies (each
 *   channel keeps one expected count).
 * - GEMM_TILE: a = A, b = B, the problem's m, n, k, the tile's width tile_n (0 or
 *   MACO_GEMM_TILE_N: 128 columns; MACO_GEMM_TILE_N_WIDE: 256) and its position tile_row,
 *   tile_col (in tiles of this width); the tile A[tile_row * MACO_GEMM_TILE_M .. +
 *   MACO_GEMM_TILE_M, 0..k) x B[0..k, tile_col * tile_n .. + tile_n), accumulated in fp32, is
 *   stored at `out` (its element (0, 0)) with row stride ldc (elements of `datatype`:
 *   MACO_FLOAT32 or MACO_BFLOAT16): for a row-major C, out = C + tile_row * 128 * ldc +
 *   tile_col * tile_n; for tiles stored one after another, out = T + tile * 128 * tile_n and
 *   ldc = tile_n. A is m x k and B k x n, both bfloat16 and row-major with no padding (lda = k,
 *   ldb = n). n is a multiple of tile_n, k of MACO_GEMM_TILE_K; m need not be a multiple of
 *   MACO_GEMM_TILE_M: A's rows past m read as zeros and the last row of tiles stores all its
 *   128 rows, those past m zero, so C must have room for ceil(m / 128) x 128 rows (the GMMA
 *   tiles only: the cuBLASDx kernel refuses such a graph); the three pointers 16-byte aligned,
 *   ldc a multiple of 8 and at least tile_n. ld_in: A's row stride in elements where A is a
 *   slice of K of a larger matrix (split-K: a = A + k0, b = B + k0 x n, k the slice's length,
 *   ld_in the whole K; 0: k): at least k and a multiple of 8; GMMA tiles only, as a partial
 *   row. Tiles of both
 *   widths may be mixed, in one GEMM too. A wide tile does the work of two narrow ones with
 *   fewer bytes read per FLOP (narrow tiles were measured bound by that traffic:
 *   docs/performance.md, "Tuning", "GEMM tiles"); narrow ones give more tasks to spread over the
 * SMs when C is small. Needs a library built with cuBLASDx (MACO_MATHDX_DIR at configure time; else
 *   maco_persistent_kernel_create returns MACO_ERR_UNSUPPORTED), and a kernel of
 *   MACO_GEMM_TILE_THREADS threads per CTA (the default there; with the GMMA tiles, the
 *   default on Hopper, the kernel launches 128 more, a warpgroup that issues the TMA copies,
 *   and maco_persistent_kernel_get_config reports the threads launched).
 * - user types (>= MACO_TASK_USER): any of the fields, passed through unchecked.
 * `name` (may be NULL) is copied: error messages and the profile show it.
 */
typedef struct maco_task {
    maco_task_type_t type;
    maco_task_role_t role;
    maco_datatype_t datatype;
    uint32_t channel;
    uint64_t count;
    float alpha;
    void *out;
    const void *a;
    const void *b;
    uint64_t src_offset;
    uint64_t dst_offset;
    const char *name;
    uint32_t rows, ld_in, ld_out;   /**< element-wise: a 2D block (0: one row) */
    uint32_t m, n, k, ldc;          /**< GEMM_TILE: the problem (elements) */
    uint32_t tile_row, tile_col;    /**< GEMM_TILE: which tile of C (in tiles of tile_n) */
    uint32_t tile_n;                /**< GEMM_TILE: the tile's width, 0 (128), 128 or 256 */
    uint32_t ninputs;               /**< SUM: inputs (1..64) */
    uint64_t input_stride;          /**< SUM: bytes from one input to the next */
    const uint64_t *wait_on;        /**< gate: counter (NULL: no gate) */
    uint64_t wait_count;            /**< gate: signals per launch (>= 1 with a gate) */
    uint64_t *signal_to;            /**< counter to add 1 to after the task (NULL: none) */
    int wait_peer;                  /**< gate: the rank that signals wait_on (-1: several) */
    uint32_t out_mirror_channel;    /**< SUM, COPY: first channel of the output's mirrors */
    uint32_t out_mirror_count;      /**< SUM, COPY: mirrors (0..8; 0: none) */
    uint32_t signal_mirror_channel; /**< first channel of signal_to's mirrors */
    uint32_t signal_mirror_count;   /**< signal mirrors (0: signal_to itself) */
    maco_datatype_t out_datatype;   /**< SUM: the output's type (0: datatype) */
    uint64_t wait_need;             /**< gate: the launch's signals it needs (0: wait_count) */
} maco_task_t;

/** The tile of MACO_TASK_GEMM_TILE (elements: rows, the default width, the wide width, the
 * step of k) and its kernel's threads per CTA. */
#define MACO_GEMM_TILE_M 128
#define MACO_GEMM_TILE_N 128
#define MACO_GEMM_TILE_N_WIDE 256
#define MACO_GEMM_TILE_K 32
#define MACO_GEMM_TILE_THREADS 256

/** Where one GEMM tile goes: maco_task_t's tile_row, tile_col and tile_n. */
typedef struct maco_gemm_tile {
    uint32_t tile_row, tile_col, tile_n;
} maco_gemm_tile_t;

/**
 * Plans the GEMM tiles of an m x n C for a kernel of `workers` compute workers: their widths and
 * the order to add them in. The workers take root tasks in the order they were added, the k-th
 * root to worker k mod workers (maco/device/persistent.h: the schedulers' round-robin), so the
 * order decides which tiles run at the same time and on which CTAs. The plan
 * (docs/performance.md, "Tuning", "GEMM tiles", has the measurements behind it):
 * - widths: MACO_GEMM_TILE_N_WIDE where n is a multiple of 256 and there are at least `workers`
 *   wide tiles, else MACO_GEMM_TILE_N (MACO_GEMM_TILE_WIDTH=128 or 256 forces one, 256 only
 *   where n allows); when the last round of wide tiles would leave at least half of the workers
 *   idle, its tiles become twice as many narrow ones at the end, so that round takes about half
 *   as long;
 * - order: groups of G = ceil(workers / columns) tile rows, one group after the other, inside a
 *   group column by column: a round of the workers covers whole rows of C (every column of B
 *   once per round, each of A's rows for all of them), and the tiles that share a column of B
 *   go to consecutive workers.
 * m need not be a multiple of MACO_GEMM_TILE_M: a partial last row of tiles is planned as a
 * row (GEMM tiles store all 128 of its rows, zeros past m). `tiles` has room for ceil(m /
 * MACO_GEMM_TILE_M) * (n / MACO_GEMM_TILE_N) entries (the most there can be), or is NULL to
 * count only; *ntiles_p gets the number of tiles. Host only, no GPU needed; thread-safe.
 * Errors: MACO_ERR_INVALID_ARGUMENT (ntiles_p NULL, m = 0, n not a non-zero multiple of 128,
 * workers < 1).
 */
MACO_API maco_status_t maco_gemm_plan_tiles(uint32_t m, uint32_t n, int workers,
                                            maco_gemm_tile_t *tiles, size_t *ntiles_p);

/** What maco_gemm_plan chose for one GEMM, and what its model says of it. */
typedef struct maco_gemm_plan {
    uint32_t tile_n;          /**< width of the tiles (the last round's may be narrow) */
    uint32_t split_k;         /**< K is cut into this many slices (1: not split) */
    uint32_t k_slice;         /**< elements of K per slice (k when split_k is 1) */
    uint32_t group;           /**< tile rows per group of the order */
    uint32_t tail_narrow;     /**< wide tiles of the last round made two narrow ones each */
    uint32_t waves;           /**< rounds of `workers` GEMM tasks: ceil(tasks / workers) */
    uint32_t last_wave_tasks; /**< GEMM tasks in the last round: 1 .. workers */
    uint32_t reserved;        /**< zero */
    uint64_t tiles;           /**< tiles of C: the entries of the order */
    uint64_t tasks;           /**< GEMM tile tasks: tiles x split_k */
    uint64_t cost;            /**< the model's time, in steps (below) */
    uint64_t b_bytes;         /**< bytes of B the order reads from memory, in the model */
} maco_gemm_plan_t;

/** maco_gemm_plan's model (docs/persistent.md, "Planning a GEMM"): a 128 x 128 tile's step of
 * 64 along K costs 1, a 128 x 256 tile's 2; every task costs MACO_GEMM_PLAN_TASK_STEPS more
 * (hand-off and store); the SUM of a split tile costs (split_k + 1) x tile_n / 128. Assumed,
 * not measured: bench_gemm_tile prints the plan beside the measured time. */
#define MACO_GEMM_PLAN_TASK_STEPS 2
/** The most slices of K maco_gemm_plan considers, and the fewest elements of K per slice. */
#define MACO_GEMM_PLAN_MAX_SPLIT 16
#define MACO_GEMM_PLAN_MIN_SLICE 256

/**
 * Plans the GEMM tiles of C (m x n) = A (m x k) B (k x n) for a kernel of `workers` compute
 * workers, per shape (docs/persistent.md, "Planning a GEMM"):
 * - width and the last round: as maco_gemm_plan_tiles;
 * - split-K (only with max_split_k >= 2, and only when C has fewer tiles than there are
 *   workers): K in s slices of k / s elements (a multiple of 64, at least
 *   MACO_GEMM_PLAN_MIN_SLICE), s from 1 to min(max_split_k, MACO_GEMM_PLAN_MAX_SPLIT), the s
 *   with the least model cost (the smallest on a tie). A split tile is s GEMM tasks, slice j
 *   reading A's columns and B's rows [j k_slice, (j + 1) k_slice) and storing fp32 partial
 *   products, and one SUM task adding them in slice order (fp32, rounded once);
 * - order: groups of G tile rows, inside a group column by column; G is ceil(workers /
 *   columns) (a round of the workers covers whole rows, tiles sharing a column of B on
 *   consecutive workers), raised while G rows of A (G x 128 x k x 2 bytes) fit half of
 *   `l2_bytes`, so that a group's rows of A stay in L2 while it sweeps B and B is read once per
 *   group (l2_bytes 0: no raise, the rows of C finish soonest: what the fused operators use).
 * *plan_p gets the plan; `tiles` (NULL: plan only) gets the order, one entry per tile of C
 * (with split_k s, add each entry's s slices one after the other, slice 0 first), and
 * *ntiles_p (may be NULL) their number. `tiles` needs room for ceil(m / 128) x (n / 128)
 * entries. Deterministic; host only, no GPU; reads MACO_GEMM_TILE_WIDTH as
 * maco_gemm_plan_tiles does, else pure. Errors: MACO_ERR_INVALID_ARGUMENT (plan_p NULL, m =
 * 0, n not a non-zero multiple of 128, k not a non-zero multiple of MACO_GEMM_TILE_K, workers
 * < 1).
 */
MACO_API maco_status_t maco_gemm_plan(uint32_t m, uint32_t n, uint32_t k, int workers,
                                      uint64_t l2_bytes, uint32_t max_split_k,
                                      maco_gemm_plan_t *plan_p, maco_gemm_tile_t *tiles,
                                      size_t *ntiles_p);

/** Creates an empty graph. Host memory only (no GPU needed). Errors: MACO_ERR_INVALID_ARGUMENT
 * (NULL), MACO_ERR_NO_MEMORY. */
MACO_API maco_status_t maco_task_graph_create(maco_task_graph_t *graph_p);

/** Frees the graph. NULL is accepted and ignored. Kernels created from it stay valid. */
MACO_API maco_status_t maco_task_graph_destroy(maco_task_graph_t graph);

/**
 * Adds a copy of *task; *task_id_p (may be NULL) gets its id: 0, 1, 2, ... in the order of
 * addition. The task's arguments are checked by maco_task_graph_validate(), not here.
 * Errors: MACO_ERR_INVALID_ARGUMENT (graph or task NULL, more than 2^31 - 1 tasks),
 * MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_task_graph_add_task(maco_task_graph_t graph, const maco_task_t *task,
                                                int *task_id_p);

/**
 * Task `task` runs only after task `depends_on` has finished. Ids are checked by
 * maco_task_graph_validate() (so an unknown id is reported with the task that named it); the
 * same edge given twice counts once. Errors: MACO_ERR_INVALID_ARGUMENT (graph NULL),
 * MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_task_graph_add_dependency(maco_task_graph_t graph, int task,
                                                      int depends_on);

/**
 * Adds a memory channel's device handle (maco_memory_channel_get_device_handle) for channel
 * tasks; *index_p gets its index (0, 1, ...). The handle is copied; the channel must outlive
 * every kernel created from the graph. Errors: MACO_ERR_INVALID_ARGUMENT (NULL),
 * MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_task_graph_add_channel(maco_task_graph_t graph,
                                                   const maco_memory_channel_device_t *handle,
                                                   int *index_p);

/**
 * Adds port channel `channel` (maco/port_channel.h) for PORT_PUT and PORT_FLUSH tasks; *index_p
 * gets its index (0, 1, ...; port channels are numbered apart from memory channels). The graph
 * keeps the channel's device handle, its buffers' sizes and its peer; the channel (and its
 * proxy, started) must outlive every kernel created from the graph, and carry nothing else
 * while they run: gates count its signals from zero. Errors: MACO_ERR_INVALID_ARGUMENT (NULL),
 * MACO_ERR_UNSUPPORTED (no GPU, or a semaphore the GPU cannot wait on:
 * maco_port_channel_get_device_handle), MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_task_graph_add_port_channel(maco_task_graph_t graph,
                                                        maco_port_channel_t channel, int *index_p);

/** Number of tasks added so far. Errors: MACO_ERR_INVALID_ARGUMENT (NULL). */
MACO_API maco_status_t maco_task_graph_get_ntasks(maco_task_graph_t graph, int *ntasks_p);

/**
 * Checks the graph: at least one task; every task's type, role and arguments in range (as
 * maco_task_t says), and every range a task reads or writes (a COPY's, an element-wise task's
 * out, a, b and SUM's inputs, a GEMM tile's A, B and C) inside the address space, not past
 * its end; every dependency names two existing, distinct tasks; no cycle. Returns
 * MACO_OK, or MACO_ERR_INVALID_ARGUMENT with a message (logged, and given by
 * maco_log_last_error) naming the first bad task by id and name and saying why, or the
 * tasks of one cycle in order. Does not block; host only.
 */
MACO_API maco_status_t maco_task_graph_validate(maco_task_graph_t graph);

/* ---------------------------------------------------------------- fused operators */

/**
 * A GEMM fused with a collective, tile by tile, over memory channels (maco/memory_channel.h).
 * Every rank adds the same operator, with its own inputs and the same m, n, k, to its own
 * graph, on ranks with the same number of CTAs (maco_comm_get_coresident_ctas: the tile plan,
 * and so which counter each tile signals, follows it).
 *
 * How the tiles move (every operator): a GEMM tile that a peer needs is stored by the GEMM
 * itself into the peer's scratch through the channel's mapping (NVLink stores), and then adds 1
 * to a counter in the peer's scratch; the peer's task that reads it has a gate on that counter
 * (maco_task_t: gates and signals). Sums and copies to peers run on the communication workers,
 * GEMM tiles on the compute workers; no gated task waits for a worker that could be held by a
 * gated task, so no launch deadlocks (runtime/host/fused.c gives the argument). With
 * comm_workers left to the runtime (maco_persistent_config_t), the kernel gets the number the
 * operator asks for: one communication worker per 8 CTAs (per 16 for the reduce-scatter), at
 * least 2.
 *
 * Memory:
 * - `channels[q]` is the graph's index (maco_task_graph_add_channel) of a channel to rank q
 *   whose local buffer is this rank's registration of `scratch` (from its start) and whose
 *   remote buffer is rank q's; entry `rank` is ignored. Both at least
 *   maco_fused_gemm_scratch_bytes() bytes.
 * - scratch starts with the operator's counters: they must be zero before the first launch
 *   of the first kernel built from the graph (allocate it zeroed), and one kernel object at a
 *   time uses them (the counters count that kernel's launches; another kernel over the same
 *   scratch needs it zeroed again on every rank).
 * - GEMM + allreduce also needs `out_channels[q]`: a channel to rank q whose local buffer is
 *   this rank's registration of `out` (from its start, m x n elements) and whose remote buffer
 *   is rank q's: the owner of a tile writes its sum straight into every rank's out.
 * The channels carry nothing else while the graph runs.
 *
 * Shapes: a and b bf16 row-major (lda = k, ldb = n), 16-byte aligned; n a multiple of
 * MACO_GEMM_TILE_N, k of MACO_GEMM_TILE_K; m from 1 to 2^24 (a partial last row of 128-row
 * tiles is computed with zero rows, stored whole into scratch and only its rows below m into
 * out: GMMA tiles, i.e. Hopper); at most
 * 2^20 tiles of 128 x 128. out row-major with ldc = n, of `out_type` (MACO_FLOAT32 or
 * MACO_BFLOAT16): the GEMM's fp32 accumulators are rounded to it once, and the reductions send
 * products of that type and sum them in fp32 in rank order, rounding once (bf16 products are
 * what a bf16 layer's GEMM hands to its allreduce). Results are equal on every rank bit for
 * bit and do not depend on timing.
 */
typedef struct maco_fused_gemm {
    maco_comm_t comm;             /**< gives the rank, world size and CTA count */
    const int *channels;          /**< [nranks] channels over scratch */
    const void *a;                /**< bf16, row-major, see each operator */
    const void *b;                /**< bf16, k x n, row-major */
    void *out;                    /**< see each operator */
    void *scratch;                /**< the channels' local buffer (maco_fused_gemm_scratch_bytes) */
    uint32_t m, n, k;             /**< see each operator */
    const char *name;             /**< prefix of the tasks' names (profile), may be NULL */
    const int *out_channels;      /**< [nranks] GEMM + allreduce: channels over out (else unused) */
    maco_datatype_t out_type;     /**< MACO_FLOAT32 or MACO_BFLOAT16 */
    int comm_mode;                /**< a maco_fused_comm_t: how tiles move (0: SM stores) */
    const int *port_channels;     /**< [nranks] copy-engine mode: port channels (below) */
    const int *out_port_channels; /**< [nranks] copy-engine GEMM + allreduce: over out */
} maco_fused_gemm_t;

/** The three fused operators. */
typedef enum maco_fused_op {
    MACO_FUSED_GEMM_ALLREDUCE = 0,      /**< maco_task_graph_add_gemm_allreduce */
    MACO_FUSED_GEMM_REDUCE_SCATTER = 1, /**< maco_task_graph_add_gemm_reduce_scatter */
    MACO_FUSED_ALLGATHER_GEMM = 2,      /**< maco_task_graph_add_allgather_gemm */
} maco_fused_op_t;

/**
 * How a fused operator moves tiles between ranks (maco_fused_gemm_t.comm_mode).
 *
 * MACO_FUSED_COMM_SM: what each operator's text below says: GEMM tiles store into peers'
 * scratch through memory channels, sums and copies run on communication workers (SMs).
 *
 * MACO_FUSED_COMM_COPY_ENGINE: whole rows of tiles (128 rows of the product, or 128-row blocks
 * of A) move by port channels (maco/port_channel.h; on one node the CUDA copy transport: the
 * copy engines, no SM), so the GEMM keeps its SMs; only sums run on communication workers. A
 * row's put is a PORT_PUT task released by the row's last GEMM tile; its signal raises the
 * peer's semaphore of the channel, and the peer's task that needs the row is released by a
 * gated NOP waiting for the n-th signal of the launch (wait_need): puts to one peer are
 * chained in a fixed order, so the n-th signal is that row's. Per operator:
 * - GEMM + reduce-scatter: each rank computes the row blocks of rank + 1, rank + 2, ..., its
 *   own last, into a send slot of its scratch (once the block's owner has signalled that it
 *   started the launch: its first signal of the launch on the channel); each row goes to the
 *   owner's slot for this rank; the owner sums each tile's products in rank order into out.
 * - GEMM + allreduce: tile row i is owned by rank i mod nranks; every rank's GEMM stores into
 *   its own slot, each row not its own goes to the owner's slot for this rank; the owner sums
 *   the row's tiles and puts the summed row into every peer's out (out_port_channels). A rank's
 *   launch ends once every owner's rows came, and after a flush (its puts read its out).
 * - allgather + GEMM: each rank sends its A in blocks of 128 rows straight from `a` into every
 *   peer's scratch (once the peer has signalled its start); a peer's block releases the tiles
 *   that read it; the launch ends after a flush (the puts read `a`).
 * port_channels[q] (entry `rank` ignored) is the graph's index (maco_task_graph_add_port_
 * channel) of a port channel to rank q whose source is this rank's scratch (allgather + GEMM:
 * this rank's `a`, m x k bf16, from its start) and whose destination is rank q's scratch, each
 * at least maco_fused_gemm_scratch_bytes_mode() bytes; out_port_channels[q] (GEMM + allreduce)
 * one from this rank's out to rank q's (m x n elements). Neither carries anything else while
 * the graph's kernels exist, nor did before: every gate counts the channel's signals from zero.
 * Memory channels are not used (channels, out_channels may be NULL). Results are bitwise those
 * of the SM mode. The communication workers the operator asks for: one per 32 CTAs, at least
 * 2 (sums), or 1 (allgather + GEMM: puts only). Its communication tasks (one per row and peer,
 * one per summed tile) must stay below 4094 in the graph: a communication worker then never
 * waits at a closed gate (maco_task_t, gates); the builder refuses the mode above that.
 *
 * MACO_FUSED_COMM_AUTO: maco_fused_gemm_choose_comm's rule; the chosen mode's channels must be
 * given (Python's maco.PersistentKernel makes both).
 */
typedef enum maco_fused_comm {
    MACO_FUSED_COMM_SM = 0,
    MACO_FUSED_COMM_COPY_ENGINE = 1,
    MACO_FUSED_COMM_AUTO = 2,
} maco_fused_comm_t;

/** The smallest put (one row of tiles or of A) for which maco_fused_gemm_choose_comm takes the
 * copy engines (bytes), and the rows each peer must get at least. */
#define MACO_FUSED_CE_MIN_PUT (1u << 20)
#define MACO_FUSED_CE_MIN_ROWS 2

/**
 * The communication mode MACO_FUSED_COMM_AUTO takes for an operator (*mode_p): the copy
 * engines when there are peers, each put carries at least MACO_FUSED_CE_MIN_PUT bytes (128 x n
 * elements of out_type for the GEMM + collective, 128 x k bf16 for allgather + GEMM), every
 * peer gets at least MACO_FUSED_CE_MIN_ROWS of them (so that rows move while later ones
 * compute) and the mode's communication tasks fit (see maco_fused_comm_t); else the SMs. Why
 * (docs/persistent.md, "Copy-engine mode"): a trigger's trip through the FIFO and the proxy
 * costs about as long as a copy engine needs for 1 MiB over NVLink (docs/performance.md), so
 * smaller rows would wait on the proxy longer than they move. The thresholds are not yet
 * measured on the fused operators. Host only, pure, thread-safe. Errors: as
 * maco_fused_gemm_scratch_bytes (mode_p NULL, or a shape it refuses).
 */
MACO_API maco_status_t maco_fused_gemm_choose_comm(maco_fused_op_t kind, int nranks, uint32_t m,
                                                   uint32_t n, uint32_t k, maco_datatype_t out_type,
                                                   maco_fused_comm_t *mode_p);

/**
 * The bytes of scratch an operator needs on every rank (*bytes_p): its counters (8 bytes per
 * 128 x 128 tile of the result, or per 128-row block of the gathered A, and 8 per rank,
 * rounded up to 256) and then its data: GEMM + allreduce nranks x m x n elements of out_type
 * (every rank's product), GEMM + reduce-scatter m x n (nranks slots of the m / nranks rows each
 * rank keeps), allgather + GEMM nranks x m x k bf16 (the gathered A). Host only; thread-safe.
 * Errors: MACO_ERR_INVALID_ARGUMENT (bytes_p NULL, kind, nranks outside 1..64, m, n or k zero,
 * n not a multiple of 128, m not a multiple of nranks for the reduce-scatter, out_type, a size
 * past size_t).
 */
MACO_API maco_status_t maco_fused_gemm_scratch_bytes(maco_fused_op_t kind, int nranks, uint32_t m,
                                                     uint32_t n, uint32_t k,
                                                     maco_datatype_t out_type, size_t *bytes_p);

/** maco_fused_gemm_scratch_bytes for a communication mode (MACO_FUSED_COMM_AUTO: the mode
 * maco_fused_gemm_choose_comm gives): the same but for GEMM + reduce-scatter on the copy
 * engines, which keeps the products of the other ranks' blocks in send slots of its own: twice
 * the data. Errors: as maco_fused_gemm_scratch_bytes, and a mode that is no maco_fused_comm_t. */
MACO_API maco_status_t maco_fused_gemm_scratch_bytes_mode(maco_fused_op_t kind, int mode,
                                                          int nranks, uint32_t m, uint32_t n,
                                                          uint32_t k, maco_datatype_t out_type,
                                                          size_t *bytes_p);

/**
 * Row-parallel linear (GEMM + allreduce): out (m x n, out_type) = the sum over ranks r, in rank
 * order, of A_r (m x k, `a`) x B_r (k x n, `b`). The tiles follow maco_gemm_plan_tiles; tile p
 * (in plan order) is owned by rank p mod nranks. Every rank's GEMM stores its product of tile
 * p into the owner's scratch slot for it and signals the owner's counter of p; the owner sums
 * the nranks products in rank order into its out once they have all come, and copies the sum
 * into every peer's out (out_channels), signalling the peer; a rank's launch ends once the sums
 * of every tile it does not own have come. Each rank sends 2 (nranks - 1) / nranks of the
 * result's bytes (a reduce-scatter then an allgather, tile by tile, while later tiles compute).
 * *last_p (may be NULL) gets the id of a task that finishes after all of the operator's tasks;
 * tasks added before it do not wait for it, nor it for them (add dependencies to order it).
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, shapes, out_type, a channel that is missing or does
 * not link scratch / out as above, more than 2^20 tiles), MACO_ERR_UNSUPPORTED (more than 64
 * ranks), MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_task_graph_add_gemm_allreduce(maco_task_graph_t graph,
                                                          const maco_fused_gemm_t *op, int *last_p);

/**
 * Row-parallel linear with a sequence-parallel output (GEMM + reduce-scatter): out ((m /
 * nranks) x n, out_type) = rows [rank * m / nranks, (rank + 1) * m / nranks) of the sum over
 * ranks r, in rank order, of A_r (m x k) x B_r (k x n); m a multiple of nranks (any, not only
 * of 128: a block of fewer rows is one partial row of tiles). Each rank computes the row block
 * of rank + 1 first, then rank + 2, ..., its own last; the tiles of rank o's block are stored
 * into o's scratch and signal o's counter of the tile (once o has started the launch: o's
 * "ready" signal); o sums each tile's nranks products in rank order into out. out_channels is
 * not used. *last_p and errors as for maco_task_graph_add_gemm_allreduce.
 */
MACO_API maco_status_t maco_task_graph_add_gemm_reduce_scatter(maco_task_graph_t graph,
                                                               const maco_fused_gemm_t *op,
                                                               int *last_p);

/**
 * Column-parallel linear with a sequence-parallel input (allgather + GEMM): out (nranks * m x
 * n, out_type, row-major) = [A_0; A_1; ...; A_{nranks-1}] x B_r, where A_q (m x k, any m) is
 * rank q's `a`. Each rank copies its A in blocks of 128 rows into every peer's scratch (peers
 * in the order rank + 1, rank + 2, ..., each once it has started the launch), each block
 * signalling the peer's counter of it; the tiles of the own shard run first, reading `a`, then
 * those of rank - 1's shard, rank - 2's, ..., each tile gated on its block's counter.
 * out_channels is not used. *last_p and errors as for maco_task_graph_add_gemm_allreduce.
 */
MACO_API maco_status_t maco_task_graph_add_allgather_gemm(maco_task_graph_t graph,
                                                          const maco_fused_gemm_t *op, int *last_p);

/** How a kernel's CTAs are split; zero fields pick defaults (see maco_persistent_kernel_create). */
typedef struct maco_persistent_config {
    int workers;      /**< compute worker CTAs (>= 1) */
    int schedulers;   /**< scheduler CTAs (>= 1, at most `workers`) */
    int comm_workers; /**< communication CTAs; MACO_PERSISTENT_NONE for none */
    int threads;      /**< threads per CTA: a multiple of 32 in [64, 1024]; default 256 */
    int profile;      /**< non-zero: record each task's start, end and SM (a little slower) */
} maco_persistent_config_t;

/** maco_persistent_config_t.comm_workers: no communication CTAs. */
#define MACO_PERSISTENT_NONE (-1)

/**
 * Validates `graph` (maco_task_graph_validate), chooses the CTA split, uploads the graph to
 * comm's device and creates the launchable kernel object. `config` may be NULL (all
 * defaults). Defaults: of T = maco_comm_get_coresident_ctas() CTAs (one per SM of this rank's
 * share), comm_workers = max(1, T / 16) when the graph has COMM tasks, else none; then, when
 * two CTAs of the kernel fit on an SM, workers = T - comm_workers (one per SM) and schedulers
 * = max(1, workers / 8) beside them; else (GEMM tiles: one CTA per SM) schedulers =
 * max(1, (T - comm_workers) / 32) and workers the rest. Given workers only: schedulers =
 * max(1, workers / 8). Every CTA must be resident at once: the total
 * may not exceed T times the CTAs of this kernel that fit on one SM. The graph may be
 * destroyed afterwards (the kernel holds its own copy). Blocking (device allocation and copy).
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, a bad graph, a split out of range, threads other
 * than MACO_GEMM_TILE_THREADS with GEMM tiles: the message says which), MACO_ERR_UNSUPPORTED
 * (no usable GPU; GEMM tiles in a library built without cuBLASDx), MACO_ERR_CUDA,
 * MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_persistent_kernel_create(maco_comm_t comm, maco_task_graph_t graph,
                                                     const maco_persistent_config_t *config,
                                                     maco_persistent_kernel_t *kernel_p);

/**
 * Launches the kernel on `stream` (NULL: the legacy default stream): one launch runs the
 * whole graph. Asynchronous; may be captured in a CUDA graph (the launch's state lives on the
 * device and is advanced by the kernel). Errors: MACO_ERR_INVALID_ARGUMENT (NULL),
 * MACO_ERR_INVALID_USAGE (the communicator has failed: maco_comm_get_async_error),
 * MACO_ERR_CUDA (the launch).
 */
MACO_API maco_status_t maco_persistent_kernel_launch(maco_persistent_kernel_t kernel,
                                                     maco_stream_t stream);

/** The split in use (defaults resolved). Errors: MACO_ERR_INVALID_ARGUMENT (NULL). */
MACO_API maco_status_t maco_persistent_kernel_get_config(maco_persistent_kernel_t kernel,
                                                         maco_persistent_config_t *config_p);

/**
 * What a kernel of the user's own needs to run this graph (user task types): `view_p` gets the
 * device view to pass by value to maco_pk_run (it must point to a maco_pk_view_t of
 * maco/device/persistent.h; `view_bytes` its size, checked), *grid_p and *block_p the launch's
 * CTAs and threads. The user's kernel needs at most 48 KiB of static shared memory and no
 * dynamic shared memory beyond what it asks for itself. Errors: MACO_ERR_INVALID_ARGUMENT.
 */
MACO_API maco_status_t maco_persistent_kernel_get_launch(maco_persistent_kernel_t kernel,
                                                         void *view_p, size_t view_bytes,
                                                         int *grid_p, int *block_p);

/**
 * Frees the kernel's device memory. The kernel must not be running (synchronise its
 * stream first); blocking. NULL is accepted and ignored.
 */
MACO_API maco_status_t maco_persistent_kernel_destroy(maco_persistent_kernel_t kernel);

/* ---------------------------------------------------------------- profiling */

/** One task's timing in the last launch that had profiling on. */
typedef struct maco_task_profile {
    uint64_t start_ns; /**< GPU global timer (%globaltimer) when its CTA started it */
    uint64_t end_ns;   /**< when the CTA finished it */
    int sm;            /**< SM that ran it */
    int cta;           /**< block index of the CTA (worker index; comm workers follow) */
} maco_task_profile_t;

/**
 * Copies the last launch's per-task timings into records[0..ntasks) (the graph's task
 * order). Blocking: waits for the device (synchronise the launch's stream first). Errors:
 * MACO_ERR_INVALID_ARGUMENT (NULL, fewer than ntasks records), MACO_ERR_INVALID_USAGE
 * (profiling off), MACO_ERR_CUDA.
 */
MACO_API maco_status_t maco_persistent_kernel_get_profile(maco_persistent_kernel_t kernel,
                                                          maco_task_profile_t *records,
                                                          size_t nrecords);

/**
 * Writes the last launch's profile as a Chrome trace (JSON trace-event format, read by
 * chrome://tracing and Perfetto): one lane per CTA, one complete event per task named by the
 * task's name (else its type), times in microseconds from the first task's start. Blocking.
 * Errors: as get_profile, MACO_ERR_SYSTEM (the file).
 */
MACO_API maco_status_t maco_persistent_kernel_write_trace(maco_persistent_kernel_t kernel,
                                                          const char *path);

/**
 * Prints a summary of the last launch's profile to `out`: one row per operation (tasks of the
 * same name, else of the same type): tasks, time (first start to last end, ms), busy time,
 * overlap % (the share of its busy time during which tasks of the other role ran) and SMs
 * used; then the launch's span and overall compute/communication overlap. Blocking. Errors:
 * as get_profile.
 */
MACO_API maco_status_t maco_persistent_kernel_print_summary(maco_persistent_kernel_t kernel,
                                                            FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PERSISTENT_H */
