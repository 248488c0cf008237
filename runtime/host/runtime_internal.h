/*
 * runtime_internal.h - the persistent-kernel runtime's host side, shared by its files:
 * the task graph as the host builds it (graph.c) and the form it is uploaded in (the device
 * descriptors of maco/device/persistent.h: graph_lower.c), which launch.c sends to the GPU and
 * the CPU tests drive with host threads.
 */
#ifndef MACO_RUNTIME_INTERNAL_H
#define MACO_RUNTIME_INTERNAL_H

#include <stdint.h>

#include "maco/device/persistent.h"
#include "maco/persistent.h"
#include "proxy/port_info.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco__task_edge {
    int task, depends_on;
} maco__task_edge_t;

struct maco_task_graph {
    maco_task_t *tasks; /* names owned (strdup) */
    int ntasks, task_cap;
    maco__task_edge_t *edges;
    int nedges, edge_cap;
    maco_memory_channel_device_t *channels;
    int nchannels, channel_cap;
    maco__port_info_t *ports; /* port channels (maco_task_graph_add_port_channel) */
    int nports, port_cap;
    int comm_workers_hint; /* communication workers the fused operators ask for (0: none) */
    int requeue_gates;     /* its COMM tasks must stay at most MACO__PK_REQUEUE_MAX (a
                              copy-engine fused operator's gates rely on it) */
};

/* A validated graph in the device's form (host memory). */
typedef struct maco__pk_lowered {
    maco_pk_task_t *tasks; /* [ntasks] */
    uint32_t ntasks;
    uint32_t *succ; /* [nsucc]: successor lists, tasks[t].succ_begin.. */
    uint32_t nsucc;
    uint32_t *roots; /* [nroots] */
    uint32_t nroots;
    uint32_t ncomm_tasks;   /* tasks of the COMM role */
    uint32_t ngemm_tasks;   /* GEMM tiles */
    uint32_t npartial_gemm; /* GEMM tiles of a GEMM whose m is not a multiple of 128 */
    uint32_t nstrided_gemm; /* GEMM tiles whose A rows are longer than k (ld_in: split-K) */
    maco_pk_sync_t *sync;   /* [ntasks] gates and signals (all zero for tasks without) */
    maco_port_channel_device_t *ports; /* [nports] the graph's port channels' handles */
    uint32_t nports;
    uint32_t nsync;        /* tasks with a gate or a signal */
    int comm_workers_hint; /* the graph's (maco_task_graph) */
} maco__pk_lowered_t;

/** Grows *arr (of *cap elements of `size` bytes) to hold n + 1: 0, or -1 out of memory. */
int maco__graph_grow(void **arr, int *cap, int n, size_t size);

/** Checks every task's arguments and every dependency of `graph` (graph.c; errors as
 * maco_task_graph_validate, prefixed with `fn`); cycles are found by maco__task_graph_lower. */
maco_status_t maco__task_graph_check(maco_task_graph_t graph, const char *fn);

/** Validates `graph` (errors as maco_task_graph_validate, prefixed with `fn`) and lowers it
 * (graph_lower.c). */
maco_status_t maco__task_graph_lower(maco_task_graph_t graph, const char *fn,
                                     maco__pk_lowered_t *out);

void maco__pk_lowered_free(maco__pk_lowered_t *l);

/** A GEMM tile's width in columns: tile_n, where 0 means MACO_GEMM_TILE_N. */
static inline uint32_t maco__gemm_tile_n(const maco_task_t *t)
{
    return t->tile_n == 0 ? MACO_GEMM_TILE_N : t->tile_n;
}

/** The type an element-wise task stores: out_datatype where set (a SUM's), else datatype. */
static inline maco_datatype_t maco__task_out_type(const maco_task_t *t)
{
    return t->out_datatype != 0 ? t->out_datatype : t->datatype;
}

/** A GEMM tile's A row stride in elements: ld_in, where 0 means k. */
static inline uint32_t maco__gemm_lda(const maco_task_t *t)
{
    return t->ld_in == 0 ? t->k : t->ld_in;
}

/** What the profile calls task `t`: its name, else its type's ("add", "copy", ...). */
const char *maco__task_label(const maco_task_t *t);

/* A worker's queue holds at most this many tasks (the scheduler waits, bounded, when full);
 * with at most MACO__PK_REQUEUE_MAX tasks of a role, a worker of the role always puts a task
 * whose gate is closed back into its queue (maco__pk_layout sizes the queues for it). */
enum {
    MACO__PK_WORKER_QUEUE_MAX = 4096,
    MACO__PK_REQUEUE_MAX = MACO__PK_WORKER_QUEUE_MAX - 2,
};

/** Whether task `t` runs on communication workers: the COMM role, or AUTO for the tasks that
 * wait (WAIT, CHANNEL_WAIT, PORT_FLUSH). */
static inline int maco__task_is_comm(const maco_task_t *t)
{
    return t->role == MACO_TASK_ROLE_COMM ||
           (t->role == MACO_TASK_ROLE_AUTO &&
            (t->type == MACO_TASK_WAIT || t->type == MACO_TASK_CHANNEL_WAIT ||
             t->type == MACO_TASK_PORT_FLUSH));
}

/*
 * The memory of a kernel object of W compute workers, C communication workers and S
 * schedulers, in two allocations (offsets multiples of 256 bytes):
 *   fixed: tasks[ntasks] | succ[nsucc] | roots[nroots] | queues[W + C + S] | channels[] |
 *          port channels[] | sync[ntasks] (only where a task has a gate or a signal)
 *   state: ctr[MACO_PK_CTR_WORDS] | arrive[ntasks] | 256 bytes per queue (reserve at 0, head
 *          at 128) | every queue's slots | profile records[ntasks] (profile != 0)
 * state must start zeroed; it is advanced only by the kernel. Queues: W compute workers, C
 * communication workers, S scheduler inboxes. An inbox holds every task (each is pushed at most
 * once per launch), so a worker's push never waits; a worker's queue holds min(tasks of its
 * role + 1, MACO__PK_WORKER_QUEUE_MAX), rounded up to a power of two.
 * Writes the two sizes; when `fixed` and `state` (device addresses) are not NULL, also writes
 * the fixed part's bytes into fixed_host (fixed_bytes of them) and the view (all but its
 * bound). The CPU tests pass host memory for all three.
 */
void maco__pk_layout(const maco__pk_lowered_t *l, const maco_memory_channel_device_t *channels,
                     int nchannels, uint32_t W, uint32_t C, uint32_t S, int profile, void *fixed,
                     void *state, void *fixed_host, maco_pk_view_t *view, size_t *fixed_bytes_p,
                     size_t *state_bytes_p);

/* Adds a port channel's information (graph_port.c, and the CPU tests' fakes) as port channel
 * *index_p of the graph; errors name `fn`. */
maco_status_t maco__task_graph_add_port_info(maco_task_graph_t graph, const maco__port_info_t *info,
                                             int *index_p, const char *fn);

/* maco_task_graph_add_port_channel with the handle of the channel's host FIFO (host
 * addresses: maco__port_channel_info's host_fifo), for the CPU simulation of the runtime. */
maco_status_t maco__task_graph_add_port_channel_host(maco_task_graph_t graph,
                                                     maco_port_channel_t channel, int *index_p);

/* The fused operators' builder (fused_build.c) with the rank, world size and CTA count given rather
 * than read from op->comm (which may be NULL): the public maco_task_graph_add_* call it with
 * the communicator's, the CPU tests with simulated ranks. */
maco_status_t maco__fused_build(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                maco_fused_op_t kind, int rank, int nranks, int units, int *last_p);

/* launch.c, for the profile's writers (profile.c). */
maco_status_t maco__pk_profile_read(maco_persistent_kernel_t k, const char *fn,
                                    maco_task_profile_t *records, size_t nrecords);
const char *maco__pk_label(maco_persistent_kernel_t k, uint32_t task);
int maco__pk_role(maco_persistent_kernel_t k, uint32_t task); /* MACO_PK_ROLE_* */
uint32_t maco__pk_ntasks(maco_persistent_kernel_t k);

#ifdef __cplusplus
}
#endif

/* The GEMM tile width for an m x n C spread over `units` workers or SMs: MACO_GEMM_TILE_WIDTH
 * when it forces one (256 only where n is a multiple of 256), else MACO_GEMM_TILE_N_WIDE when
 * n allows it and there are at least `units` wide tiles, else MACO_GEMM_TILE_N. *forced_p (may
 * be NULL) says whether the variable forced the width. Warns once per call on an unknown
 * value. Used by maco_gemm_plan_tiles and the fused operators. */
uint32_t maco__gemm_tile_width(uint32_t m, uint32_t n, uint64_t units, int *forced_p);

#endif /* MACO_RUNTIME_INTERNAL_H */
