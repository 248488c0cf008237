/*
 * maco/device/persistent.h - the device side of the persistent-kernel runtime: the task
 * descriptors the host uploads, the task queues, and the loops that worker, scheduler and
 * communication CTAs run (host API: maco/persistent.h).
 *
 * One launch runs a whole task graph. Its CTAs have roles by block index:
 *   [0, W)            compute workers: pop task ids from their own queue, run the task with
 *                     the whole CTA, then release the task's successors;
 *   [W, W + C)        communication workers: the same loop, for tasks of the comm role
 *                     (by default the waits: on a peer's signal, on a counter), so that a
 *                     wait never holds a compute worker;
 *   [W + C, W + C + S) schedulers: all their threads push the roots (tasks without
 *                     predecessors) to workers' queues at the start, in parallel (each queue
 *                     by one thread, its roots in the graph's order: the host assigned the
 *                     roots of each role to the role's workers in turn); then, once
 *                     every scheduler has pushed its roots (a counter they all add to and
 *                     wait on, bounded), one thread each hands the tasks that become ready to
 *                     workers. So in every worker's queue the roots come before any task
 *                     that became ready later: a worker reaches a non-root task only after it
 *                     has run every root it was given (the fused operators' freedom from
 *                     deadlock rests on this: maco/persistent.h).
 * All CTAs must be resident at once (workers wait for work that other CTAs produce); the
 * host sizes the grid so they are (maco_persistent_kernel_create).
 *
 * Queues. Every worker has one queue and every scheduler one inbox, all of the same kind:
 * a power-of-two ring of 64-bit slots with any number of producers and one consumer.
 *   push: pos = relaxed fetch-add on `reserve` (the position is the producer's alone); wait,
 *         bounded, while pos - head >= capacity (acquire load of `head`: the consumer has
 *         read the slot's previous value); then ONE release store of
 *         slot[pos % capacity] = (low 32 bits of pos + 1) << 32 | task.
 *   pop:  the consumer alone reads `head` h; an acquire load of slot[h % capacity] whose top
 *         half equals the low 32 bits of h + 1 is the next task (anything else: empty); then
 *         a release store of head = h + 1 hands the slot back to producers.
 * The release store of the slot pairs with the consumer's acquire load: everything the
 * producer saw before pushing (the finished predecessor's output) is visible to the consumer.
 * The sequence number in the slot's top half means slots never need clearing, and positions
 * run on across launches (a launch pops exactly what it pushes).
 *
 * Dependencies. Each task counts its predecessors (`ndeps`). `arrive[t]` is a 64-bit counter
 * that never goes back: a worker that finishes task p does an acquire-release fetch-add of 1
 * on arrive[s] for each successor s; the one that brings it to ndeps[s] * (run + 1), where
 * `run` is the number of earlier launches of this graph, pushes s: straight to a worker of
 * its role (the queue hashed from s) once every scheduler has queued its roots and s's gate
 * (below) is open, else to the inbox of scheduler s % S, which hands it on. Dispatch then
 * happens on every worker that completes a task, in parallel; the schedulers (one thread
 * each, about ten dependent memory operations per task) would be the bottleneck otherwise. The
 * acquire-release add makes every predecessor's release part of what the pusher saw (the adds form
 * one release sequence), so the task's inputs are visible to whoever pops it. Tasks without
 * predecessors (roots) are pushed by the schedulers at the start. The state is advanced only on the
 * device (the last CTA to exit counts the launch), so a graph can be launched again, and captured
 * in a CUDA graph, with no host work in between.
 *
 * Gates and signals. A task may also carry a gate and a signal (maco_pk_sync_t, in the view's
 * `sync` array beside the descriptors). A task's gate is open once its counter reaches
 * wait_count * run + wait_need (acquire, system scope; wait_need 0 means wait_count: the
 * launch's wait_count signals have all come). A worker runs a task only once its gate is
 * open; one that it pops with the gate closed goes back to the end of its queue
 * (maco_pk_next_ready), so a closed gate never blocks a worker and the tasks behind it.
 * After the task's writes (a CTA barrier), thread 0 adds 1 to the signal's counter (a
 * system-scope fence, then a release add), which may be a peer's counter seen through a memory
 * channel's mapping, or to that counter's twin in each of a range of channels' remote buffers
 * (`signal mirrors`). A SUM or COPY task may likewise write its output also through a range
 * of channels (`out mirrors`): the same bytes at the same offset of each peer's buffer, in the
 * same pass. The counter a gate reads is local: the cheapest way for one rank's tile to wait
 * for another rank's.
 *
 * Bounds. A task's own waits (a counter, a peer's semaphore, a gate) are bounded by the
 * communicator's MACO_DEVICE_TIMEOUT and report through its error word
 * (maco/device/error.h); a task that fails sets the graph's abort word and every CTA leaves.
 * A CTA with nothing to do waits at most twice that bound without any task finishing
 * anywhere in the graph, then reports MACO_DEVICE_WAIT_TASK (so a task's own timeout,
 * which names it, is reported first). Nothing waits forever, whatever the graph.
 *
 * The queue and dependency functions below are host-device: the CPU tests run the same
 * protocol with host threads in the roles of the CTAs (GCC atomics there, PTX here).
 */
#ifndef MACO_DEVICE_PERSISTENT_H
#define MACO_DEVICE_PERSISTENT_H

#include <stdint.h>

#include "maco/device/macros.h"

#include "maco/device/error.h"
#include "maco/device/memory_channel.h"
#include "maco/device/port_channel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Task types (maco_task_type_t in maco/persistent.h has the same values). */
enum {
    MACO_PK_NOP = 0,
    MACO_PK_COPY = 1,           /* out[0..count) = a[0..count), bytes; ptr[3] as for ADD
                                   with the two strides in bytes: a 2D block of rows */
    MACO_PK_ADD = 2,            /* out[i] = a[i] + b[i], count elements */
    MACO_PK_SCALE = 3,          /* out[i] = alpha * a[i] */
    MACO_PK_RESIDUAL_ADD = 4,   /* out[i] = a[i] + alpha * b[i] */
    MACO_PK_SIGNAL = 5,         /* *(u64 *)out += 1 (system-scope release) */
    MACO_PK_WAIT = 6,           /* wait until *(u64 *)a >= count * (run + 1) (acquire) */
    MACO_PK_CHANNEL_PUT = 7,    /* channel aux: remote[dst..+count) = local[src..+count) */
    MACO_PK_CHANNEL_SIGNAL = 8, /* channel aux: signal the peer */
    MACO_PK_CHANNEL_WAIT = 9,   /* channel aux: wait for the peer's next signal */
    MACO_PK_GEMM_TILE = 10,     /* one 128 x gemm.tile_n tile of A x B (bf16 in, fp32
                                   accumulate; tile_n 128 or 256): ptr[0] the tile's (0, 0)
                                   in C, ptr[1] A, ptr[2] B, ptr[3] m0 | n0 << 32,
                                   count K | N << 32, aux ldc, dtype C's type, gemm.map
                                   the GEMM's tensor maps (GMMA kernel; they hold M: rows
                                   of the last row of tiles past M are not stored). Run by
                                   the library's GEMM kernels */
    MACO_PK_SUM = 11,           /* out[i] = in_0[i] + in_1[i] + ... + in_{aux-1}[i], summed
                                   in that order in fp32, rounded once: in_j = ptr[1] +
                                   j * ptr[2] (bytes); count elements per row, ptr[3] rows
                                   and strides as for ADD; sum.out_dtype the output's type
                                   (0: dtype) */
    MACO_PK_PORT_PUT = 12,      /* port channel aux (view.ports): count bytes from source
                                   offset ptr[1] to destination offset ptr[0], then a signal;
                                   count 0: the signal alone */
    MACO_PK_PORT_FLUSH = 13,    /* port channel aux: wait until its proxy carried out every
                                   earlier trigger of this GPU's FIFO */
    MACO_PK_TYPE_COUNT = 14,
    /* Types from here on are the user's (maco_pk_run's `user` function runs them). */
    MACO_PK_USER = 256,
};

/* Out mirrors of a task at most (maco_pk_sync_t). */
enum { MACO__PK_MIRRORS = 8 };

/* CTA roles of a task. */
enum { MACO_PK_ROLE_COMPUTE = 0, MACO_PK_ROLE_COMM = 1 };

/* maco/device/error.h's `what` values of the runtime (`object` and the two values):
 *   WAIT_TASK          a CTA found no task to run while no task finished anywhere for twice
 *                      the bound: its queue, the finished-task count that ends the launch,
 *                      the count it saw
 *   WAIT_TASK_COUNTER  a MACO_PK_WAIT task's counter: the task, the value waited for, the last
 *                      value read
 *   WAIT_TASK_QUEUE    a full queue: the queue, the position to write, the consumer's position
 *   ERR_TASK_TYPE      not a wait: a task of a type this kernel cannot run: the task, its type
 *   ERR_TASK_FAILED    not a wait: a task returned an error and recorded nothing more specific
 *                      (a user task type): the task, its type
 *   WAIT_TASK_GATE     a task's gate (maco_pk_sync_t): the task, the value waited for, the last
 *                      value read; the report's peer is the sync entry's `peer` */
enum {
    MACO_DEVICE_WAIT_TASK = 16,
    MACO_DEVICE_WAIT_TASK_COUNTER = 17,
    MACO_DEVICE_WAIT_TASK_QUEUE = 18,
    MACO_DEVICE_ERR_TASK_TYPE = 19,
    MACO_DEVICE_ERR_TASK_FAILED = 20,
    MACO_DEVICE_WAIT_TASK_GATE = 21,
};

/*
 * One task as the device reads it (64 bytes, 8-byte aligned, written by the host once):
 *   0 u16 type   4 u32 ndeps   8 u32 succ_begin   12 u32 succ_count
 *   2 u8 role    3 u8 dtype (maco_datatype_t of element-wise tasks)
 *  16 f32 alpha; for GEMM tiles u16 gemm.map (the index of the GEMM's TMA tensor maps in
 *                 view.gemm_maps; the host sets it only for the GMMA kernel) and at 18 u16
 *                 gemm.tile_n (the tile's width: 128 or 256); for SUM u16 sum.out_dtype (the
 *                 output's maco_datatype_t, 0: dtype) and u16 zero
 *  20 u32 aux (channel index; user types: anything)
 *  24 u64 count (elements; bytes for copies and puts; signals per run for waits)
 *  32 u64 ptr[4]: out, a, b, and a fourth argument (puts: ptr[1] = source offset,
 *                 ptr[0] = destination offset)
 */
typedef struct maco_pk_task {
    uint16_t type;
    uint8_t role;
    uint8_t dtype;
    uint32_t ndeps;
    uint32_t succ_begin;
    uint32_t succ_count;
    union {
        float alpha;
        struct {
            uint16_t map;
            uint16_t tile_n;
        } gemm;
        struct {
            uint16_t out_dtype;
            uint16_t reserved;
        } sum;
    };
    uint32_t aux;
    uint64_t count;
    uint64_t ptr[4];
} maco_pk_task_t;

MACO_STATIC_ASSERT(sizeof(maco_pk_task_t) == 64, "maco_pk_task_t is 64 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_pk_task_t) == 8, "maco_pk_task_t alignment");

/* A queue (see the protocol above): 4 words, 32 bytes. `reserve` and `head` sit on their own
 * 128-byte lines of device memory. */
typedef struct maco_pk_queue {
    uint64_t *slots;   /* [capacity] */
    uint64_t *reserve; /* producers' next position */
    uint64_t *head;    /* the consumer's next position */
    uint64_t capacity; /* power of two */
} maco_pk_queue_t;

MACO_STATIC_ASSERT(sizeof(maco_pk_queue_t) == 32, "maco_pk_queue_t is 32 bytes");

/*
 * A task's gate, signal and mirrors (48 bytes, 8-byte aligned; see "Gates and signals"):
 *   0 u64 *wait          the gate's counter (this GPU's memory, or host-mapped); NULL: no gate
 *   8 u64 wait_count     signals the gate needs per launch (>= 1 with a gate)
 *  16 u64 *signal        the counter to add 1 to after the task (may be a peer's, mapped);
 *                        NULL: none. With signal mirrors: a counter in the local buffer of the
 *                        mirror channels, whose twins (remote + (signal - local)) get the adds
 *  24 i32 peer           the rank expected to signal `wait` (-1: several), for the timeout report
 *  28 u16 out_first      SUM and COPY: the first of out_count channels (view.channels) through
 *  30 u16 out_count      which the output is written too (out inside their local buffers)
 *  32 u16 sig_first      the first of sig_count channels whose remote buffers get the signal
 *  34 u16 sig_count      (0: `signal` itself)
 *  36 u32               reserved, zero
 *  40 u64 wait_need      the gate opens at wait_count * run + wait_need (1 .. wait_count: the
 *                        launch's signals come in a known order and the task needs the first
 *                        wait_need of them; 0: wait_count, all of them)
 */
typedef struct maco_pk_sync {
    const uint64_t *wait;
    uint64_t wait_count;
    uint64_t *signal;
    int32_t peer;
    uint16_t out_first, out_count;
    uint16_t sig_first, sig_count;
    uint32_t reserved0;
    uint64_t wait_need;
} maco_pk_sync_t;
MACO_STATIC_ASSERT(sizeof(maco_pk_sync_t) == 48, "maco_pk_sync_t is 48 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_pk_sync_t) == 8, "maco_pk_sync_t alignment");

/* Counters of one graph in device memory (each on its own 128-byte line), never reset. */
enum {
    MACO_PK_CTR_DONE = 0,      /* u64: tasks finished, all launches */
    MACO_PK_CTR_LAUNCHES = 16, /* u64: launches finished (the `run` of the next one) */
    MACO_PK_CTR_EXITED = 32,   /* u64: CTAs that left, all launches */
    MACO_PK_CTR_ABORT = 48,    /* u64: non-zero once a task failed (stays set) */
    MACO_PK_CTR_ROOTS = 64,    /* u64: schedulers that pushed their roots, all launches */
    MACO_PK_CTR_WORDS = 80,
};

/* Per-task timing of the last launch (profiling on): 24 bytes. */
typedef struct maco_pk_profile_record {
    uint64_t start_ns; /* %globaltimer when the CTA started the task */
    uint64_t end_ns;   /* when it finished it */
    uint32_t sm;       /* %smid */
    uint32_t cta;      /* block index */
} maco_pk_profile_record_t;

MACO_STATIC_ASSERT(sizeof(maco_pk_profile_record_t) == 24, "maco_pk_profile_record_t is 24 bytes");

/* Everything a launch reads: passed to the kernel by value (never changes after upload). */
typedef struct maco_pk_view {
    const maco_pk_task_t *tasks;   /* [ntasks] */
    const uint32_t *succ;          /* successor lists (tasks[t].succ_begin..) */
    const uint32_t *roots;         /* [nroots] tasks without predecessors, by worker queue */
    const uint32_t *root_start;    /* [W + C + 1]: queue q's roots are roots[root_start[q] ..
                                      root_start[q + 1]), in the graph's order */
    uint64_t *arrive;              /* [ntasks] */
    uint64_t *ctr;                 /* [MACO_PK_CTR_WORDS] */
    const maco_pk_queue_t *queues; /* [W + C + S]: workers, comm workers, scheduler inboxes */
    const maco_memory_channel_device_t *channels; /* [nchannels] (the channel tasks' aux) */
    const maco_port_channel_device_t *ports;      /* [nports] (the port tasks' aux) */
    const maco_pk_sync_t *sync;                   /* [ntasks] gates and signals, or NULL */
    maco_pk_profile_record_t *profile;            /* [ntasks] or NULL */
    /* The GMMA kernel's TMA tensor maps, one entry per distinct GEMM (tasks' gemm_map), in
     * device memory; NULL for the other kernels. */
    const void *gemm_maps;
    maco_device_wait_bound_t bound;
    uint32_t ntasks, nroots;
    uint32_t nworkers, ncomm, nschedulers, nchannels;
    uint32_t nports, reserved;
} maco_pk_view_t;

#ifdef __cplusplus
}
#endif

/* ---------------------------------------------------------------- host-device protocol */

/* Pushes `task` to queue `q` (any thread; bounded wait while full). MACO_OK, or the wait's
 * error (the graph's abort word is then set). */
MACO_HOST_DEVICE static inline maco_status_t
maco_pk_queue_push(const maco_pk_view_t *v, const maco_pk_queue_t *q, uint32_t task);

/* Pops the next task of `q` into *task_p: 1, or 0 when it is empty. Its consumer only. */
MACO_HOST_DEVICE static inline int maco_pk_queue_pop(const maco_pk_queue_t *q, uint32_t *task_p);

/*
 * The consumer of queue `queue` waits for its next task: 1 (task in *task_p); 0 when all
 * tasks of this launch have finished; -1 on an error (*status_p: MACO_ERR_TIMEOUT when no
 * task finished anywhere for twice the bound, MACO_ERR_REMOTE when a task failed). `run` is
 * the number of earlier launches. One thread.
 */
MACO_HOST_DEVICE static inline int maco_pk_next(const maco_pk_view_t *v, uint32_t queue,
                                                uint64_t run, uint32_t *task_p,
                                                maco_status_t *status_p);

/*
 * After task `task` finished: counts it and releases its successors, pushing those that
 * became ready to a worker or to their scheduler ("Dependencies" above). Cooperative over (lane,
 * nlanes) (one warp on the device; call it after a barrier that follows the task's writes). MACO_OK
 * or a push's error.
 */
MACO_HOST_DEVICE static inline maco_status_t maco_pk_complete(const maco_pk_view_t *v,
                                                              uint32_t task, uint64_t run,
                                                              uint32_t lane, uint32_t nlanes);

/* Scheduler `s` (0..S-1) of launch `run`: pushes its share of the roots, then hands every task
 * of its inbox to a worker of the task's role until the launch ends. One thread. MACO_OK or
 * the first error. The same as maco_pk_schedule_roots(v, s, 0, 1), then
 * maco_pk_schedule_inbox(v, s, run). */
MACO_HOST_DEVICE static inline maco_status_t maco_pk_schedule(const maco_pk_view_t *v, uint32_t s,
                                                              uint64_t run);

/* Scheduler `s`'s share of the roots: the roots of the worker queues q = s * nlanes + lane,
 * then + S * nlanes, ... (view.root_start), each queue's pushed in order by one lane, so every
 * worker gets its roots in the graph's order and all queues fill at once. Cooperative over
 * (lane, nlanes) (a CTA's threads; the CPU tests pass 0, 1). MACO_OK or a push's error. */
MACO_HOST_DEVICE static inline maco_status_t
maco_pk_schedule_roots(const maco_pk_view_t *v, uint32_t s, uint32_t lane, uint32_t nlanes);

/* Scheduler `s` of launch `run` after its roots: hands every task of its inbox to a worker of
 * the task's role (the least loaded of the next few of its own) until the launch ends. One
 * thread. MACO_OK or the first error. */
MACO_HOST_DEVICE static inline maco_status_t maco_pk_schedule_inbox(const maco_pk_view_t *v,
                                                                    uint32_t s, uint64_t run);

/* Scheduler `s`, after it pushed its roots: counts it and waits (bounded) until all S
 * schedulers of launch `run` have, so that no worker's queue gets a non-root task before its
 * roots. One thread. MACO_OK, or the wait's error (the launch is then aborted). */
MACO_HOST_DEVICE static inline maco_status_t maco_pk_roots_pushed(const maco_pk_view_t *v,
                                                                  uint32_t s, uint64_t run);

/* Worker side, before running `task` of launch `run`: waits (bounded) for its gate, if it has
 * one. One thread. MACO_OK, or MACO_ERR_TIMEOUT (reported as MACO_DEVICE_WAIT_TASK_GATE) /
 * MACO_ERR_REMOTE (the launch was aborted). */
MACO_HOST_DEVICE static inline maco_status_t maco_pk_gate(const maco_pk_view_t *v, uint32_t task,
                                                          uint64_t run);

/* Worker side, after `task`'s writes are done by every thread that made them (a barrier):
 * adds 1 to its signal's counter, or to each of its mirrors, if it has one (a system-scope
 * fence, then release adds). One thread. */
MACO_HOST_DEVICE static inline void maco_pk_post_signal(const maco_pk_view_t *v, uint32_t task);

/*
 * maco_pk_next for a worker, with gates: the next task of queue `queue` whose gate is open. A
 * task whose gate is closed goes back to the end of the queue (the worker takes the next one
 * meanwhile), so a closed gate never blocks a worker; only where the queue could be full does
 * the worker wait at the gate instead (maco_pk_gate). A gate that stays closed for the bound
 * while the worker has nothing else to run is reported (MACO_DEVICE_WAIT_TASK_GATE, naming the
 * task and the peer) and aborts the launch. Returns as maco_pk_next. One thread.
 */
MACO_HOST_DEVICE static inline int maco_pk_next_ready(const maco_pk_view_t *v, uint32_t queue,
                                                      uint64_t run, uint32_t *task_p,
                                                      maco_status_t *status_p);

/* Marks the launch failed: every CTA leaves at its next check. */
MACO_HOST_DEVICE static inline void maco_pk_abort(const maco_pk_view_t *v);

/* ---------------------------------------------------------------- device only */
#if defined(__CUDACC__)

/*
 * A user task type: called by every thread of the worker CTA for each task whose type is at
 * least MACO_PK_USER, with the task's descriptor; returns MACO_OK or an error (any thread;
 * the CTA's statuses are combined, and an error aborts the launch). It may use
 * __syncthreads() (all threads call it) and must bound its own waits.
 */
typedef maco_status_t (*maco_pk_user_fn_t)(const maco_pk_view_t *v, const maco_pk_task_t *task,
                                           uint32_t task_id);

/*
 * The body of a persistent kernel: every thread of every CTA calls it once with the view
 * (gridDim.x == W + C + S, blockDim.x a multiple of 32, at least 64). `user` runs user task
 * types (NULL: a user type fails the launch with MACO_ERR_INVALID_ARGUMENT). To add task types,
 * write a kernel of your own that calls maco_pk_run(&view, my_fn) and launch it with the
 * grid, block and view that maco_persistent_kernel_get_launch() gives.
 */
static __device__ __forceinline__ void maco_pk_run(const maco_pk_view_t *v, maco_pk_user_fn_t user);

#endif /* __CUDACC__ */

#include "maco/device/impl/persistent_sync.h"
#include "maco/device/impl/persistent_queue.h"
#include "maco/device/impl/persistent_kernel.h"

#endif /* MACO_DEVICE_PERSISTENT_H */
