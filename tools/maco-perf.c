/*
 * maco-perf - collective benchmark with nccl-tests' flags and columns.
 *
 *   maco-run -n N maco-perf <allreduce|allgather|reduce_scatter|broadcast|reduce|alltoall|
 *       sendrecv> -b MIN -e MAX -f FACTOR [-d type|all] [-o op|all] [-r root] [-n iters]
 *       [-w warmup] [-c checks] [-G graph-replays] [-R 0|1|2] [--placement both|out|in]
 *       [--nccl] [--json FILE] [--dry-run]
 *
 * The command line (perf_args.c) also takes nccl-tests' program names and flags, so that an
 * nccl-tests command line works as pasted after `maco-run -n N maco-perf`; perf_args.h says
 * which flags are honoured, noted or refused.
 *
 * Sizes follow nccl-tests: `size` is the largest buffer of the operation in bytes
 * (allgather: the receive buffer, nranks blocks; reduce_scatter: the send buffer; alltoall:
 * either buffer, nranks blocks of size / nranks bytes, one per peer; sendrecv: the buffer
 * each rank sends; the others: the one buffer) and `count` its elements. sendrecv is
 * nccl-tests' sendrecv_perf: rank r sends to r + 1 and receives from r - 1 (mod nranks), the
 * two in one group. For each type, op and size it checks and times MACO out of place and in
 * place, as nccl-tests does (--placement picks one; alltoall and sendrecv have no in-place
 * form) and, with --nccl, the same operation through the system's NCCL (dlopen'ed;
 * NVLink multicast off; alltoall through ncclAlltoAll where NCCL has it, 2.28 on, else
 * ncclSend/ncclRecv to every peer in a group; sendrecv through
 * ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd) in the same process.
 *
 * Checking: `-c` rounds per size and placement, each with fresh random inputs (a new seed),
 * a poisoned output (0xFF bytes) with a 256-byte poisoned guard after it, one call, then
 * every element compared bitwise on the GPU with a result recomputed from the generator
 * (perf_kernels.h: inputs whose results are exact in the type), and the guard checked
 * untouched (#wrong counts both; a reduce's non-root output must stay poisoned).
 * Timing: `-w` warm-up calls, then `-n` iterations of `-m` calls (default 1) between two CUDA
 * events, time = elapsed / (n m); with -G R those calls are captured once in a CUDA graph that
 * is replayed R times (time = elapsed / (n m R)). The time shown is the largest over ranks, or
 * what -a asks for (nccl-tests' values: 0 rank 0's, 1 the average, 2 the smallest, 3 the
 * largest). `-N` repeats the whole table; `-T S` sets MACO_DEVICE_TIMEOUT to S seconds.
 * algbw = size / time; busbw = algbw * factor, nccl-tests' definitions (its
 * doc/PERFORMANCE.md): 2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter and
 * alltoall, 1 for broadcast, reduce and sendrecv. GB/s are 1e9 bytes per second.
 * Buffers: cudaMalloc by default, so MACO goes through its scratch buffer, and NCCL gets the
 * same buffers, unregistered (NCCL's classic kernels). With -R 1 (or 2) each library gets its own
 * registered buffers: MACO's from maco_mem_alloc (registered with the communicator; the
 * mesh-family algorithms use them in place), NCCL's from ncclMemAlloc registered with
 * ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC) (NCCL >= 2.27: its symmetric-memory
 * kernels where it has one for the operation, size and type; nccl.h, "Symmetric memory").
 * NCCL's path: with --nccl, for each size rank 0 turns NCCL's TUNING log on around one extra,
 * untimed call (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=TUNING into a temporary NCCL_DEBUG_FILE,
 * re-read through ncclResetDebugInit, then the user's settings restored the same way), and
 * the "nccl path" column shows what that line said: "symmetric KERNEL" or "ALGO/PROTO"
 * (classic), "-" when NCCL logged none (send/recv, one rank). The timed calls run with the
 * log as the user set it.
 * Exit status: 0 when no value was wrong, 1 when some were (or an error), 2 for bad usage,
 * 77 when no GPU is usable (skipped: the reason printed; docs/tools.md, "Exit statuses").
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "maco/maco.h"
#include "perf_args.h"
#include "perf_kernels.h"
#include "perf_nccl_log.h"

/* Exit status when no GPU is usable: 77, "skipped", as ctest's SKIP_RETURN_CODE and automake
 * use it (docs/tools.md, "Exit statuses"); 2 stays bad usage. */
#define PERF_EXIT_SKIPPED 77

/* ------------------------------------------------------------------ NCCL, by dlopen */

/* The few NCCL declarations used, from NCCL's stable C ABI (nccl.h): ncclUniqueId is 128
 * bytes, results and enums are ints. Declared here so the tool builds without nccl.h. */
typedef struct {
    char internal[128];
} perf_nccl_id_t;
typedef struct perf_nccl_comm *perf_nccl_comm_t;

/* nccl.h's ncclDataType_t for each maco_datatype_t (fp8 needs NCCL >= 2.24), and its
 * ncclRedOp_t for each maco_redop_t (NCCL orders max before min). */
static const int perf_nccl_types[MACO_DATATYPE_COUNT] = { 0, 1, 2, 3, 4, 5, 6, 9, 7, 8, 10, 11 };
static const int perf_nccl_ops[MACO_REDOP_COUNT] = { 0, 1, 3, 2, 4 };

typedef struct perf_nccl {
    int (*get_unique_id)(perf_nccl_id_t *);
    int (*comm_init_rank)(perf_nccl_comm_t *, int, perf_nccl_id_t, int);
    int (*all_reduce)(const void *, void *, size_t, int, int, perf_nccl_comm_t, cudaStream_t);
    int (*all_gather)(const void *, void *, size_t, int, perf_nccl_comm_t, cudaStream_t);
    int (*reduce_scatter)(const void *, void *, size_t, int, int, perf_nccl_comm_t, cudaStream_t);
    int (*broadcast)(const void *, void *, size_t, int, int, perf_nccl_comm_t, cudaStream_t);
    int (*reduce)(const void *, void *, size_t, int, int, int, perf_nccl_comm_t, cudaStream_t);
    int (*alltoall)(const void *, void *, size_t, int, perf_nccl_comm_t,
                    cudaStream_t); /* NULL <2.28 */
    int (*send)(const void *, size_t, int, int, perf_nccl_comm_t, cudaStream_t);
    int (*recv)(void *, size_t, int, int, perf_nccl_comm_t, cudaStream_t);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*comm_destroy)(perf_nccl_comm_t);
    /* -R 1: buffers from ncclMemAlloc registered as symmetric windows (NULL before 2.27). */
    int (*mem_alloc)(void **, size_t);
    int (*mem_free)(void *);
    int (*win_register)(perf_nccl_comm_t, void *, size_t, void **, int);
    int (*win_deregister)(perf_nccl_comm_t, void *);
    void (*reset_debug)(void); /* ncclResetDebugInit: re-reads NCCL_DEBUG*; NULL if absent */
    char *in, *out;            /* NCCL's own buffers with -R 1 (else MACO's) */
    void *win_in, *win_out;
    char library[512]; /* the file NCCL was loaded from */
    const char *(*get_error_string)(int);
    int (*get_version)(int *);
    perf_nccl_comm_t comm;
    int version;
} perf_nccl_t;

static int g_rank;

#define PERF_DIE(...)                                                                              \
    do {                                                                                           \
        fprintf(stderr, "maco-perf: rank %d: ", g_rank);                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define PERF_CUDA(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            PERF_DIE("%s failed: %s", #call, cudaGetErrorString(e_));                              \
    } while (0)

#define PERF_MACO(comm, call)                                                                      \
    do {                                                                                           \
        maco_status_t s_ = (call);                                                                 \
        if (s_ != MACO_OK)                                                                         \
            PERF_DIE("%s failed: %s: %s", #call, maco_status_string(s_),                           \
                     maco_comm_get_last_error(comm));                                              \
    } while (0)

/* Fills *slot with NCCL's entry point `name`; exits saying why where it is missing. */
static void perf_nccl_need(const char *name, void **slot)
{
    char why[512];
    if (maco_nccl_library_symbol(name, slot, why, sizeof(why)) != MACO_OK)
        PERF_DIE("--nccl: %s", why);
}

/* Fills *slot with NCCL's entry point `name`, or NULL where this NCCL has none. */
static void perf_nccl_want(const char *name, void **slot)
{
    if (maco_nccl_library_symbol(name, slot, NULL, 0) != MACO_OK)
        *slot = NULL;
}

static void nccl_load(perf_nccl_t *nc)
{
    /* NVLink multicast stays off (it can disturb shared machines; docs/design.md, rules). */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    /* MACO's loader (maco/nccl_bootstrap.h): MACO_NCCL_LIBRARY, never MACO's own libnccl.so.2. */
    perf_nccl_need("ncclGetUniqueId", (void **)&nc->get_unique_id);
    perf_nccl_need("ncclCommInitRank", (void **)&nc->comm_init_rank);
    perf_nccl_need("ncclAllReduce", (void **)&nc->all_reduce);
    perf_nccl_need("ncclAllGather", (void **)&nc->all_gather);
    perf_nccl_need("ncclReduceScatter", (void **)&nc->reduce_scatter);
    perf_nccl_need("ncclBroadcast", (void **)&nc->broadcast);
    perf_nccl_need("ncclReduce", (void **)&nc->reduce);
    perf_nccl_need("ncclSend", (void **)&nc->send);
    perf_nccl_need("ncclRecv", (void **)&nc->recv);
    perf_nccl_need("ncclGroupStart", (void **)&nc->group_start);
    perf_nccl_need("ncclGroupEnd", (void **)&nc->group_end);
    /* NCCL 2.28 spells it ncclAlltoAll; older releases have none (send/recv in a group). */
    perf_nccl_want("ncclAlltoAll", (void **)&nc->alltoall);
    perf_nccl_need("ncclCommDestroy", (void **)&nc->comm_destroy);
    perf_nccl_need("ncclGetErrorString", (void **)&nc->get_error_string);
    perf_nccl_need("ncclGetVersion", (void **)&nc->get_version);
    /* Optional: symmetric windows (2.27 on) and the debug-log reset (for NCCL's path). */
    perf_nccl_want("ncclMemAlloc", (void **)&nc->mem_alloc);
    perf_nccl_want("ncclMemFree", (void **)&nc->mem_free);
    perf_nccl_want("ncclCommWindowRegister", (void **)&nc->win_register);
    perf_nccl_want("ncclCommWindowDeregister", (void **)&nc->win_deregister);
    perf_nccl_want("ncclResetDebugInit", (void **)&nc->reset_debug);
    nc->get_version(&nc->version);
    Dl_info info;
    snprintf(nc->library, sizeof(nc->library), "%s",
             dladdr((void *)nc->get_version, &info) != 0 && info.dli_fname != NULL ? info.dli_fname
                                                                                   : "?");
}

static void nccl_init(perf_nccl_t *nc, maco_comm_t comm, int rank, int nranks)
{
    perf_nccl_id_t id;
    memset(&id, 0, sizeof(id));
    if (rank == 0) {
        int r = nc->get_unique_id(&id);
        if (r != 0)
            PERF_DIE("ncclGetUniqueId failed: %s", nc->get_error_string(r));
    }
    maco_bootstrap_t bs;
    PERF_MACO(comm, maco_comm_get_bootstrap(comm, &bs));
    PERF_MACO(comm, maco_bootstrap_broadcast(bs, 0, &id, sizeof(id)));
    int r = nc->comm_init_rank(&nc->comm, nranks, id, rank);
    if (r != 0)
        PERF_DIE("ncclCommInitRank failed: %s", nc->get_error_string(r));
}

/* -R 1: NCCL's own buffers, `bytes` each, from ncclMemAlloc, registered as symmetric windows
 * (collective: every rank registers the same sizes in the same order). */
static void nccl_alloc_symmetric(perf_nccl_t *nc, size_t bytes)
{
    if (nc->mem_alloc == NULL || nc->mem_free == NULL || nc->win_register == NULL ||
        nc->win_deregister == NULL)
        PERF_DIE("-R 1 --nccl: NCCL %d.%d.%d (%s) has no ncclMemAlloc/ncclCommWindowRegister "
                 "(symmetric windows need NCCL >= 2.27); run -R 0 against it",
                 nc->version / 10000, (nc->version / 100) % 100, nc->version % 100, nc->library);
    char **bufs[2] = { &nc->in, &nc->out };
    void **wins[2] = { &nc->win_in, &nc->win_out };
    for (int i = 0; i < 2; i++) {
        int r = nc->mem_alloc((void **)bufs[i], bytes);
        if (r != 0)
            PERF_DIE("ncclMemAlloc of %zu bytes failed: %s", bytes, nc->get_error_string(r));
        r = nc->win_register(nc->comm, *bufs[i], bytes, wins[i],
                             0x01 /* NCCL_WIN_COLL_SYMMETRIC */);
        if (r != 0)
            PERF_DIE("ncclCommWindowRegister(%zu bytes, NCCL_WIN_COLL_SYMMETRIC) failed: %s", bytes,
                     nc->get_error_string(r));
    }
}

/* Deregisters and frees what nccl_alloc_symmetric made, then destroys the communicator. */
static void nccl_finalize(perf_nccl_t *nc)
{
    if (nc->win_in != NULL)
        nc->win_deregister(nc->comm, nc->win_in);
    if (nc->win_out != NULL)
        nc->win_deregister(nc->comm, nc->win_out);
    nc->comm_destroy(nc->comm);
    if (nc->win_in != NULL)
        nc->mem_free(nc->in);
    if (nc->win_out != NULL)
        nc->mem_free(nc->out);
}

typedef struct perf_ctx {
    maco_comm_t comm;
    maco_bootstrap_t bs;
    int rank, nranks;
    int gpu_ranks; /* ranks on each GPU (maco_comm_get_gpu_ranks); > 1 when they share */
    cudaStream_t stream;
    cudaEvent_t start, stop;
    char *in, *out;
    unsigned long long *counters; /* device: [0] wrong, [1] first wrong index, [2] guard */
    unsigned long long oob;       /* guard bytes found changed on this rank, all sizes */
    perf_nccl_t *nccl;
    uint64_t seed_base;
} perf_ctx_t;

/* One operation: the collective's arguments for a size, type, op and placement. */
typedef struct perf_case {
    maco_collective_t coll;
    maco_datatype_t dt;
    maco_redop_t op;
    int root, inplace;
    size_t unit; /* the collective's count argument */
    size_t send_bytes, recv_bytes;
    const char *send;
    char *recv;
    size_t touched; /* bytes from c->out the call may write (guard after) */
} perf_case_t;

enum { PERF_GUARD = 256 };

static int perf_has_op(maco_collective_t coll)
{
    return coll != MACO_COLL_ALLGATHER && coll != MACO_COLL_BROADCAST &&
           coll != MACO_COLL_ALLTOALL && coll != MACO_COLL_SENDRECV;
}

/* The placements to run, as indices ip0 <= ip < ip1 (0 out of place, 1 in place). */
static int perf_ip_first(const maco_perf_opts_t *o)
{
    return (o->placements & MACO_PERF_OUT_OF_PLACE) ? 0 : 1;
}

static int perf_ip_end(const maco_perf_opts_t *o)
{
    return (o->placements & MACO_PERF_IN_PLACE) ? 2 : 1;
}

/* nccl-tests' bus bandwidth factor (doc/PERFORMANCE.md). */
static double perf_busbw_factor(maco_collective_t coll, int n)
{
    switch (coll) {
    case MACO_COLL_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case MACO_COLL_ALLGATHER:
    case MACO_COLL_REDUCE_SCATTER:
    case MACO_COLL_ALLTOALL:
        return (double)(n - 1) / n;
    default: /* broadcast, reduce, sendrecv */
        return 1.0;
    }
}

/* Fills in the buffers of a case over the buffers `in` and `out` (MACO's or NCCL's); `count` is
 * nccl-tests' count (elements of the largest buffer), already a multiple of nranks for
 * allgather and reduce_scatter. */
static void perf_case_init(perf_case_t *k, perf_ctx_t *c, char *in, char *out,
                           maco_collective_t coll, maco_datatype_t dt, maco_redop_t op, int root,
                           int inplace, size_t count)
{
    size_t esz = maco_datatype_size(dt), n = (size_t)c->nranks;
    memset(k, 0, sizeof(*k));
    k->coll = coll;
    k->dt = dt;
    k->op = op;
    k->root = root;
    k->inplace = inplace;
    int blocks = coll == MACO_COLL_ALLGATHER || coll == MACO_COLL_REDUCE_SCATTER ||
                 coll == MACO_COLL_ALLTOALL;
    k->unit = blocks ? count / n : count;
    size_t ub = k->unit * esz;
    k->send_bytes = coll == MACO_COLL_REDUCE_SCATTER || coll == MACO_COLL_ALLTOALL ? ub * n : ub;
    k->recv_bytes = coll == MACO_COLL_ALLGATHER || coll == MACO_COLL_ALLTOALL ? ub * n : ub;
    k->recv = out;
    k->send = in;
    k->touched = k->recv_bytes;
    if (inplace) {
        if (coll == MACO_COLL_ALLGATHER) {
            k->send = out + (size_t)c->rank * ub;
        } else if (coll == MACO_COLL_REDUCE_SCATTER) {
            k->send = out;
            k->recv = out + (size_t)c->rank * ub;
            k->touched = k->send_bytes;
        } else {
            k->send = out;
        }
    }
}

/* One time from the ranks' times (-a: rank 0's, the average, the smallest or the largest),
 * through the bootstrap. */
static double perf_time_over_ranks(perf_ctx_t *c, maco_perf_average_t how, double v)
{
    double *all = calloc((size_t)c->nranks, sizeof(double));
    if (all == NULL)
        PERF_DIE("out of memory");
    all[c->rank] = v;
    PERF_MACO(c->comm, maco_bootstrap_allgather(c->bs, all, sizeof(double)));
    double m = all[0], sum = 0;
    for (int r = 0; r < c->nranks; r++) {
        sum += all[r];
        if (how == MACO_PERF_TIME_MAX)
            m = all[r] > m ? all[r] : m;
        else if (how == MACO_PERF_TIME_MIN)
            m = all[r] < m ? all[r] : m;
    }
    if (how == MACO_PERF_TIME_AVG)
        m = sum / c->nranks;
    free(all);
    return m;
}

static unsigned long long perf_sum_over_ranks(perf_ctx_t *c, unsigned long long v)
{
    unsigned long long *all = calloc((size_t)c->nranks, sizeof(*all));
    if (all == NULL)
        PERF_DIE("out of memory");
    all[c->rank] = v;
    PERF_MACO(c->comm, maco_bootstrap_allgather(c->bs, all, sizeof(*all)));
    unsigned long long s = 0;
    for (int r = 0; r < c->nranks; r++)
        s += all[r];
    free(all);
    return s;
}

/* One call. NCCL: returns NCCL's result (0 = success), MACO: dies on an error. */
static int perf_launch(perf_ctx_t *c, int use_nccl, const perf_case_t *k)
{
    if (use_nccl) {
        perf_nccl_t *nc = c->nccl;
        int t = perf_nccl_types[k->dt], op = perf_nccl_ops[k->op];
        switch (k->coll) {
        case MACO_COLL_ALLREDUCE:
            return nc->all_reduce(k->send, k->recv, k->unit, t, op, nc->comm, c->stream);
        case MACO_COLL_ALLGATHER:
            return nc->all_gather(k->send, k->recv, k->unit, t, nc->comm, c->stream);
        case MACO_COLL_REDUCE_SCATTER:
            return nc->reduce_scatter(k->send, k->recv, k->unit, t, op, nc->comm, c->stream);
        case MACO_COLL_BROADCAST:
            return nc->broadcast(k->send, k->recv, k->unit, t, k->root, nc->comm, c->stream);
        case MACO_COLL_ALLTOALL: {
            if (nc->alltoall != NULL)
                return nc->alltoall(k->send, k->recv, k->unit, t, nc->comm, c->stream);
            size_t ub = k->unit * maco_datatype_size(k->dt);
            int r = nc->group_start();
            for (int q = 0; q < c->nranks && r == 0; q++) {
                r = nc->send(k->send + (size_t)q * ub, k->unit, t, q, nc->comm, c->stream);
                if (r == 0)
                    r = nc->recv(k->recv + (size_t)q * ub, k->unit, t, q, nc->comm, c->stream);
            }
            int e = nc->group_end();
            return r != 0 ? r : e;
        }
        case MACO_COLL_SENDRECV: {
            int r = nc->group_start();
            if (r == 0)
                r = nc->send(k->send, k->unit, t, (c->rank + 1) % c->nranks, nc->comm, c->stream);
            if (r == 0)
                r = nc->recv(k->recv, k->unit, t, (c->rank + c->nranks - 1) % c->nranks, nc->comm,
                             c->stream);
            int e = nc->group_end();
            return r != 0 ? r : e;
        }
        default:
            return nc->reduce(k->send, k->recv, k->unit, t, op, k->root, nc->comm, c->stream);
        }
    }
    maco_stream_t s = (maco_stream_t)c->stream;
    maco_status_t st;
    switch (k->coll) {
    case MACO_COLL_ALLREDUCE:
        st = maco_allreduce(k->send, k->recv, k->unit, k->dt, k->op, c->comm, s);
        break;
    case MACO_COLL_ALLGATHER:
        st = maco_allgather(k->send, k->recv, k->unit, k->dt, c->comm, s);
        break;
    case MACO_COLL_REDUCE_SCATTER:
        st = maco_reduce_scatter(k->send, k->recv, k->unit, k->dt, k->op, c->comm, s);
        break;
    case MACO_COLL_BROADCAST:
        st = maco_broadcast(k->send, k->recv, k->unit, k->dt, k->root, c->comm, s);
        break;
    case MACO_COLL_ALLTOALL:
        st = maco_alltoall(k->send, k->recv, k->unit, k->dt, c->comm, s);
        break;
    case MACO_COLL_SENDRECV:
        st = maco_group_start();
        if (st == MACO_OK)
            st = maco_send(k->send, k->unit, k->dt, (c->rank + 1) % c->nranks, c->comm, s);
        if (st == MACO_OK)
            st = maco_recv(k->recv, k->unit, k->dt, (c->rank + c->nranks - 1) % c->nranks, c->comm,
                           s);
        {
            maco_status_t e = maco_group_end();
            st = st != MACO_OK ? st : e;
        }
        break;
    default:
        st = maco_reduce(k->send, k->recv, k->unit, k->dt, k->op, k->root, c->comm, s);
    }
    if (st != MACO_OK)
        PERF_DIE("%s of %zu elements failed: %s: %s", maco_collective_name(k->coll), k->unit,
                 maco_status_string(st), maco_comm_get_last_error(c->comm));
    return 0;
}

/* Stops with the device-side error if a MACO kernel reported one. */
static void perf_check_async(perf_ctx_t *c)
{
    maco_status_t async_st;
    PERF_MACO(c->comm, maco_comm_get_async_error(c->comm, &async_st));
    if (async_st != MACO_OK)
        PERF_DIE("asynchronous error: %s: %s", maco_status_string(async_st),
                 maco_comm_get_last_error(c->comm));
}

/* One checked call; returns the number of wrong elements and guard bytes on this rank. */
static unsigned long long perf_check(perf_ctx_t *c, const perf_case_t *k, int round)
{
    uint64_t seed = c->seed_base ^ ((uint64_t)k->unit * 0x9E3779B97F4A7C15ull) ^
                    ((uint64_t)(round * 2 + k->inplace) << 56) ^ ((uint64_t)k->op << 48);
    size_t n_recv = k->recv_bytes / maco_datatype_size(k->dt);
    size_t n_send = k->send_bytes / maco_datatype_size(k->dt);
    /* Poison the whole output region plus guard, then write the input (over it in place). */
    PERF_CUDA(cudaMemsetAsync(c->out, 0xFF, k->touched + PERF_GUARD, c->stream));
    PERF_CUDA(maco_perf_fill_coll((void *)k->send, n_send, k->dt, k->op, seed, c->rank, c->stream));
    unsigned long long init[3] = { 0, ~0ull, 0 };
    PERF_CUDA(cudaMemcpyAsync(c->counters, init, sizeof(init), cudaMemcpyHostToDevice, c->stream));
    PERF_CUDA(cudaStreamSynchronize(c->stream));
    PERF_MACO(c->comm, maco_bootstrap_barrier(c->bs)); /* every rank's input is ready */
    perf_launch(c, 0, k);
    if (k->coll == MACO_COLL_REDUCE && c->rank != k->root) {
        /* A non-root's receive buffer is not written: out of place it stays poisoned. */
        if (!k->inplace)
            PERF_CUDA(
                maco_perf_check_bytes(k->recv, k->recv_bytes, 0xFF, &c->counters[0], c->stream));
    } else if (k->coll == MACO_COLL_SENDRECV) {
        /* What rank - 1 sent. */
        PERF_CUDA(maco_perf_check_from(k->recv, n_recv, k->dt, k->op, seed,
                                       (c->rank + c->nranks - 1) % c->nranks, 0, &c->counters[0],
                                       &c->counters[1], c->stream));
    } else {
        PERF_CUDA(maco_perf_check_coll(k->recv, n_recv, k->coll, k->dt, k->op, k->root, k->unit,
                                       seed, c->rank, c->nranks, &c->counters[0], &c->counters[1],
                                       c->stream));
    }
    PERF_CUDA(
        maco_perf_check_bytes(c->out + k->touched, PERF_GUARD, 0xFF, &c->counters[2], c->stream));
    unsigned long long res[3];
    PERF_CUDA(cudaMemcpyAsync(res, c->counters, sizeof(res), cudaMemcpyDeviceToHost, c->stream));
    PERF_CUDA(cudaStreamSynchronize(c->stream));
    perf_check_async(c);
    if (res[0] != 0)
        fprintf(stderr,
                "maco-perf: rank %d: %s %s %s: %llu wrong value(s) in %zu elements (%s); first "
                "wrong element %llu\n",
                c->rank, maco_collective_name(k->coll), maco_datatype_name(k->dt),
                maco_redop_name(k->op), res[0], n_recv, k->inplace ? "in place" : "out of place",
                res[1]);
    if (res[2] != 0)
        fprintf(stderr,
                "maco-perf: rank %d: %llu byte(s) of the %d-byte guard after the output (%zu "
                "bytes) were overwritten (%s)\n",
                c->rank, res[2], PERF_GUARD, k->touched, k->inplace ? "in place" : "out of place");
    c->oob += res[2];
    return res[0] + res[2];
}

/* Time per call in us, made one over ranks as -a says (default: the largest); < 0 when NCCL
 * refused the operation. */
static double perf_time(perf_ctx_t *c, const maco_perf_opts_t *o, const perf_case_t *k,
                        int use_nccl)
{
    size_t esz = maco_datatype_size(k->dt);
    int calls = o->iters * o->agg; /* -n iterations of -m calls each */
    PERF_CUDA(maco_perf_fill_coll((void *)k->send, k->send_bytes / esz, k->dt, k->op, c->seed_base,
                                  c->rank, c->stream));
    int bad = 0;
    for (int i = 0; i < o->warmup && !bad; i++)
        bad = perf_launch(c, use_nccl, k) != 0;
    cudaGraphExec_t exec = NULL;
    if (o->graph > 0 && !bad) {
        cudaGraph_t graph;
        PERF_CUDA(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < calls && !bad; i++)
            bad = perf_launch(c, use_nccl, k) != 0;
        PERF_CUDA(cudaStreamEndCapture(c->stream, &graph));
        if (!bad) {
            PERF_CUDA(cudaGraphInstantiate(&exec, graph, 0));
            PERF_CUDA(cudaGraphLaunch(exec, c->stream)); /* one warm-up replay */
        }
        PERF_CUDA(cudaGraphDestroy(graph));
    }
    PERF_CUDA(cudaStreamSynchronize(c->stream));
    /* Every rank learns whether any rank's NCCL refused, so that all skip together. */
    if (perf_sum_over_ranks(c, (unsigned long long)bad) != 0) {
        if (exec != NULL)
            cudaGraphExecDestroy(exec);
        return -1.0;
    }
    PERF_CUDA(cudaEventRecord(c->start, c->stream));
    if (exec != NULL) {
        for (int i = 0; i < o->graph; i++)
            PERF_CUDA(cudaGraphLaunch(exec, c->stream));
    } else {
        for (int i = 0; i < calls; i++)
            perf_launch(c, use_nccl, k);
    }
    PERF_CUDA(cudaEventRecord(c->stop, c->stream));
    PERF_CUDA(cudaEventSynchronize(c->stop));
    if (!use_nccl)
        perf_check_async(c);
    float ms = 0;
    PERF_CUDA(cudaEventElapsedTime(&ms, c->start, c->stop));
    if (exec != NULL)
        PERF_CUDA(cudaGraphExecDestroy(exec));
    double per = (double)calls * (exec != NULL ? o->graph : 1);
    return perf_time_over_ranks(c, o->average, (double)ms * 1000.0 / per);
}

/* setenv, or unsetenv when `v` is NULL. */
static void perf_setenv(const char *name, const char *v)
{
    if (v != NULL)
        setenv(name, v, 1);
    else
        unsetenv(name);
}

static char *perf_strdup_env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL ? strdup(v) : NULL;
}

/* NCCL's path for the case `k` (see the top of this file): every rank makes one untimed NCCL
 * call; around it rank 0 points NCCL's TUNING log at a temporary file and reads back the last
 * line. `out` gets "-" when NCCL logged nothing for the call and "unknown" without
 * ncclResetDebugInit (NCCL reads its log settings once otherwise). */
static void perf_nccl_path(perf_ctx_t *c, const perf_case_t *k, char *out, size_t cap)
{
    perf_nccl_t *nc = c->nccl;
    snprintf(out, cap, nc->reset_debug != NULL ? "-" : "unknown");
    if (nc->reset_debug == NULL)
        return;
    static const char *const vars[3] = { "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE" };
    char *saved[3] = { NULL, NULL, NULL };
    char path[64];
    snprintf(path, sizeof(path), "/tmp/maco-perf-nccl-%d.log", (int)getpid());
    if (c->rank == 0) {
        for (int i = 0; i < 3; i++)
            saved[i] = perf_strdup_env(vars[i]);
        setenv("NCCL_DEBUG", "INFO", 1);
        setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
        setenv("NCCL_DEBUG_FILE", path, 1);
        nc->reset_debug();
    }
    int r = perf_launch(c, 1, k);
    PERF_CUDA(cudaStreamSynchronize(c->stream));
    if (c->rank != 0)
        return;
    for (int i = 0; i < 3; i++) {
        perf_setenv(vars[i], saved[i]);
        free(saved[i]);
    }
    nc->reset_debug(); /* NCCL closes the file when it next logs */
    FILE *f = fopen(path, "r");
    char line[1024];
    while (r == 0 && f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strstr(line, " Bytes -> ") != NULL)
            maco_perf_nccl_path_of(line, out, cap);
    if (f != NULL)
        fclose(f);
    unlink(path);
}

static void perf_header(const maco_perf_opts_t *o, const perf_ctx_t *c, const char *gpu,
                        const perf_nccl_t *nccl)
{
    printf("# maco-perf %s: %d rank(s), %s, iters %d, warmup %d, checks %d, %s%s\n",
           maco_collective_name(o->coll), c->nranks, gpu, o->iters, o->warmup, o->checks,
           o->graph ? "graph-replayed" : "eager", o->nccl ? "" : ", no NCCL");
    if (c->gpu_ranks > 1)
        printf("# %d ranks share each GPU (MPS, or MACO_SHARED_GPU=1): these times measure "
               "ranks sharing one GPU, not NVLink\n",
               c->gpu_ranks);
    printf("# buffers: %s\n", o->reg ? "maco_mem_alloc (-R 1: registered, used in place)"
                                     : "cudaMalloc (-R 0: unregistered, through scratch)");
    if (o->nccl)
        printf("# NCCL's buffers: %s\n",
               o->reg ? "ncclMemAlloc, registered with ncclCommWindowRegister("
                        "NCCL_WIN_COLL_SYMMETRIC) (-R 1: its symmetric kernels where it has one)"
                      : "the same cudaMalloc buffers, unregistered (-R 0: its classic kernels)");
    if (o->graph)
        printf("# -G %d: the %d timed calls are one CUDA graph, replayed %d times\n", o->graph,
               o->iters, o->graph);
    if (o->nccl)
        printf("# NCCL %d.%d.%d from %s (NCCL_NVLS_ENABLE=0); ratio = MACO busbw / NCCL busbw; "
               "nccl path = its TUNING log for one extra call%s\n",
               nccl->version / 10000, (nccl->version / 100) % 100, nccl->version % 100,
               nccl->library,
               nccl->reset_debug != NULL ? "" : " (not known: no ncclResetDebugInit)");
    if (o->nccl && o->coll == MACO_COLL_ALLTOALL)
        printf("# NCCL's alltoall: %s\n", nccl->alltoall != NULL
                                              ? "ncclAlltoAll"
                                              : "ncclSend/ncclRecv to every peer in a group");
    static const char *const over[] = { "rank 0's", "average over ranks", "smallest over ranks",
                                        "largest over ranks" };
    printf("# time in us (%s, -a %d), algbw and busbw in GB/s (1e9 B/s), busbw = algbw * %.4g "
           "(nccl-tests)\n",
           over[o->average], (int)o->average, perf_busbw_factor(o->coll, c->nranks));
    if (o->agg > 1)
        printf("# -m %d: %d timed iterations of %d calls each; time per call\n", o->agg, o->iters,
               o->agg);
    int ip0 = perf_ip_first(o), ip1 = perf_ip_end(o);
    printf("#%11s %12s %9s %6s %5s", "", "", "", "", "");
    for (int ip = ip0; ip < ip1; ip++)
        printf("  %-31s", ip ? "in-place" : "out-of-place");
    if (o->nccl)
        for (int ip = ip0; ip < ip1; ip++)
            printf("  %-23s", ip ? "nccl in-place" : "nccl out-of-place");
    printf("\n#%11s %12s %9s %6s %5s", "size(B)", "count", "type", "redop", "root");
    for (int ip = ip0; ip < ip1; ip++)
        printf(" %9s %7s %7s %6s", "time", "algbw", "busbw", "#wrong");
    if (o->nccl)
        for (int ip = ip0; ip < ip1; ip++)
            printf(" %9s %7s %5s", "time", "busbw", "ratio");
    printf("  algorithm%s\n", o->nccl ? "  | nccl path" : "");
    fflush(stdout);
}

/* --dry-run's last line: the job as the launcher describes it (maco_launch_info_from_env),
 * without joining it. */
static void perf_job_print(FILE *f)
{
    static const char *const rank_vars[] = { "MACO_RANK", "RANK",      "OMPI_COMM_WORLD_RANK",
                                             "PMI_RANK",  "PMIX_RANK", "SLURM_PROCID" };
    int any = 0;
    for (size_t i = 0; i < sizeof(rank_vars) / sizeof(rank_vars[0]); i++)
        any |= getenv(rank_vars[i]) != NULL;
    if (!any) {
        fprintf(f, "job: no launcher's variables (maco-run, mpirun, srun or torchrun set them)\n");
        return;
    }
    maco_launch_info_t job;
    if (maco_launch_info_from_env(&job) != MACO_OK) {
        fprintf(f, "job: cannot be started: %s\n", maco_log_last_error());
        return;
    }
    fprintf(f, "job: launcher %s, rank %d of %d", job.launcher, job.rank, job.world_size);
    if (job.local_rank >= 0)
        fprintf(f, ", local rank %d", job.local_rank);
    if (job.node >= 0 && job.num_nodes > 0)
        fprintf(f, ", node %d of %d", job.node, job.num_nodes);
    fprintf(f, ", unique id by %s\n", job.id_source);
}

/* Before measuring: -T as the device timeout, a GPU, the communicator (from the environment,
 * as maco-run starts the ranks), -r checked, the device, --nccl dropped where ranks share a
 * GPU, the stream and events; the GPU's properties into *prop. Returns -1 to go on, else the
 * exit status (the error printed). */
static int perf_start(maco_perf_opts_t *o, perf_ctx_t *c, struct cudaDeviceProp *prop)
{
    if (o->timeout_s > 0) {
        /* nccl-tests' -T: here the deadline of every wait on the GPU (set before the library
         * reads its configuration). */
        char t[32];
        snprintf(t, sizeof(t), "%ds", o->timeout_s);
        setenv("MACO_DEVICE_TIMEOUT", t, 1);
    }
    char why[512];
    int ndev = maco_cuda_device_count(why, sizeof(why));
    if (ndev == 0) {
        /* Every rank says it: the first rank to exit makes maco-run stop the others, which
         * may then not get to print anything. `why` names the cause and what to do. */
        fprintf(stderr,
                "maco-perf: no usable CUDA device: %s; nothing to measure (maco-info shows what "
                "MACO sees; maco-perf --dry-run checks the arguments without a GPU)\n",
                why);
        return PERF_EXIT_SKIPPED;
    }
    maco_status_t st = maco_comm_init_from_env(&c->comm);
    if (st != MACO_OK) {
        fprintf(stderr,
                "maco-perf: cannot create the communicator: %s (run under maco-run, "
                "e.g. maco-run -n %d maco-perf allreduce, or mpirun, srun or torchrun)\n",
                maco_status_string(st), ndev);
        return 1;
    }
    maco_comm_get_rank(c->comm, &c->rank);
    maco_comm_get_nranks(c->comm, &c->nranks);
    maco_comm_get_bootstrap(c->comm, &c->bs);
    g_rank = c->rank;
    if (o->root >= c->nranks) {
        if (c->rank == 0)
            fprintf(stderr, "maco-perf: -r %d is not a rank (0..%d)\n", o->root, c->nranks - 1);
        maco_comm_destroy(c->comm);
        return 2;
    }
    int dev;
    maco_comm_get_cuda_device(c->comm, &dev);
    PERF_CUDA(cudaSetDevice(dev));
    maco_comm_get_gpu_ranks(c->comm, &c->gpu_ranks);
    if (o->nccl && c->gpu_ranks > 1 && getenv("NCCL_HOSTID") == NULL) {
        /* NCCL refuses two ranks on one GPU of one host ("Duplicate GPU detected"); ranks that
         * set different NCCL_HOSTID values look like hosts of their own to it (its network
         * transport between them: a rehearsal of the NCCL side, not a measurement). */
        if (c->rank == 0)
            printf("# --nccl skipped: NCCL does not run ranks that share a GPU (unless each sets "
                   "its own NCCL_HOSTID)\n");
        o->nccl = 0;
    }
    PERF_CUDA(cudaGetDeviceProperties(prop, dev));
    PERF_CUDA(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    PERF_CUDA(cudaEventCreate(&c->start));
    PERF_CUDA(cudaEventCreate(&c->stop));
    return -1;
}

/* The buffers (registered with -R, else cudaMalloc), the check counters, and NCCL's side
 * (--nccl) in *nccl. */
static void perf_alloc(const maco_perf_opts_t *o, perf_ctx_t *c, perf_nccl_t *nccl)
{
    if (o->reg) {
        PERF_MACO(c->comm, maco_mem_alloc(c->comm, o->max_bytes + PERF_GUARD, (void **)&c->in));
        PERF_MACO(c->comm, maco_mem_alloc(c->comm, o->max_bytes + PERF_GUARD, (void **)&c->out));
        /* Once every rank has registered, map the peers' buffers (collectives only read
         * the mappings: without this step every call would go through scratch). */
        PERF_MACO(c->comm, maco_bootstrap_barrier(c->bs));
        PERF_MACO(c->comm, maco_collective_map_registrations(c->comm));
    } else {
        PERF_CUDA(cudaMalloc((void **)&c->in, o->max_bytes + PERF_GUARD));
        PERF_CUDA(cudaMalloc((void **)&c->out, o->max_bytes + PERF_GUARD));
    }
    PERF_CUDA(cudaMalloc((void **)&c->counters, 3 * sizeof(unsigned long long)));
    c->seed_base = 0x4D41434F00000000ull ^ (uint64_t)o->min_bytes ^ ((uint64_t)o->max_bytes << 8);
    if (o->nccl) {
        nccl_load(nccl);
        nccl_init(nccl, c->comm, c->rank, c->nranks);
        c->nccl = nccl;
        if (o->reg) {
            nccl_alloc_symmetric(nccl, o->max_bytes + PERF_GUARD);
        } else {
            nccl->in = c->in;
            nccl->out = c->out;
        }
    }
}

/* One size's results, out of place [0] and in place [1]. */
typedef struct perf_row {
    maco_datatype_t dt;
    const char *op_name;
    size_t bytes, count;
    double t[2], nt[2]; /* MACO's and NCCL's time per call (us); NCCL's 0 when not run */
    unsigned long long wrong[2];
    char npath[2][96]; /* NCCL's algorithm and protocol */
    const char *algo;  /* MACO's algorithm */
    int ctas[2];       /* CTAs of MACO's last timed launch (-1: unknown) */
    double algbw[2], busbw[2], nbusbw[2];
} perf_row_t;

/* Checks (-c) and times `count` elements of `dt` under `op` in each placement, with NCCL's
 * timing beside (--nccl), into *res; adds the wrong values to *total_wrong. */
static void perf_measure(perf_ctx_t *c, const maco_perf_opts_t *o, perf_nccl_t *nccl,
                         maco_datatype_t dt, maco_redop_t op, size_t count, perf_row_t *res,
                         unsigned long long *total_wrong)
{
    int ip0 = perf_ip_first(o), ip1 = perf_ip_end(o);
    memset(res, 0, sizeof(*res));
    res->dt = dt;
    res->op_name = perf_has_op(o->coll) ? maco_redop_name(op) : "none";
    res->count = count;
    res->bytes = count * maco_datatype_size(dt);
    perf_case_t k[2], kn[2];
    for (int ip = ip0; ip < ip1; ip++) {
        perf_case_init(&k[ip], c, c->in, c->out, o->coll, dt, op, o->root, ip, count);
        unsigned long long w = 0;
        for (int r = 0; r < o->checks; r++)
            w += perf_check(c, &k[ip], r);
        res->wrong[ip] = perf_sum_over_ranks(c, w);
        res->t[ip] = perf_time(c, o, &k[ip], 0);
        maco_collective_stats_t stats;
        res->ctas[ip] =
            maco_collective_get_stats(c->comm, &stats) == MACO_OK ? stats.last_launch_ctas : -1;
        if (o->nccl) {
            perf_case_init(&kn[ip], c, nccl->in, nccl->out, o->coll, dt, op, o->root, ip, count);
            res->nt[ip] = perf_time(c, o, &kn[ip], 1);
            if (res->nt[ip] > 0)
                perf_nccl_path(c, &kn[ip], res->npath[ip], sizeof(res->npath[ip]));
        }
        *total_wrong += res->wrong[ip];
    }
    res->algo = "?";
    maco_collective_get_algorithm(c->comm, o->coll, k[ip0].unit, dt, &res->algo);
}

/* Rank 0: prints a size's line (nccl-tests' columns, then NCCL's and the algorithms) and adds
 * its bus bandwidths to the average. */
static void perf_print_row(const maco_perf_opts_t *o, perf_row_t *r, double factor, int rooted,
                           double *busbw_sum, int *busbw_n)
{
    int ip0 = perf_ip_first(o), ip1 = perf_ip_end(o);
    printf(" %11zu %12zu %9s %6s %5d", r->bytes, r->count, maco_datatype_name(r->dt), r->op_name,
           rooted ? o->root : -1);
    for (int ip = ip0; ip < ip1; ip++) {
        r->algbw[ip] = (double)r->bytes / (r->t[ip] * 1e-6) / 1e9;
        r->busbw[ip] = r->algbw[ip] * factor;
        r->nbusbw[ip] = r->nt[ip] > 0 ? (double)r->bytes / (r->nt[ip] * 1e-6) / 1e9 * factor : 0;
        *busbw_sum += r->busbw[ip];
        (*busbw_n)++;
        printf(" %9.2f %7.2f %7.2f %6llu", r->t[ip], r->algbw[ip], r->busbw[ip], r->wrong[ip]);
    }
    if (o->nccl) {
        for (int ip = ip0; ip < ip1; ip++) {
            if (r->nt[ip] > 0 && r->nbusbw[ip] > 0)
                printf(" %9.2f %7.2f %5.2f", r->nt[ip], r->nbusbw[ip],
                       r->busbw[ip] / r->nbusbw[ip]);
            else if (r->nt[ip] > 0) /* one rank: busbw is 0 (nccl-tests' factor) */
                printf(" %9.2f %7.2f %5s", r->nt[ip], r->nbusbw[ip], "n/a");
            else
                printf(" %9s %7s %5s", "n/a", "n/a", "n/a");
        }
    }
    if (o->nccl && ip1 - ip0 == 2 && strcmp(r->npath[0], r->npath[1]) != 0)
        printf("  %s  | %s ; in place %s\n", r->algo, r->npath[0], r->npath[1]);
    else if (o->nccl)
        printf("  %s  | %s\n", r->algo, r->npath[ip0]);
    else
        printf("  %s\n", r->algo);
    fflush(stdout);
}

/* Rank 0 with --json: a size's objects, one per placement. */
static void perf_json_row(FILE *json, const maco_perf_opts_t *o, const perf_ctx_t *c,
                          const perf_row_t *r, int rooted, int nccl_version, int *first_json)
{
    int ip0 = perf_ip_first(o), ip1 = perf_ip_end(o);
    for (int ip = ip0; ip < ip1 && json != NULL; ip++) {
        fprintf(json,
                "%s  {\"collective\": \"%s\", \"size_bytes\": %zu, \"count\": %zu, "
                "\"dtype\": \"%s\", \"op\": \"%s\", \"root\": %d, \"inplace\": %s, "
                "\"graph\": %s, \"registered\": %s, \"algorithm\": \"%s\", \"ctas\": %d, "
                "\"nranks\": %d, "
                "\"time_us\": %.3f, \"algbw_gbps\": %.3f, \"busbw_gbps\": %.3f, "
                "\"wrong\": "
                "%llu",
                *first_json ? "" : ",\n", maco_collective_name(o->coll), r->bytes, r->count,
                maco_datatype_name(r->dt), r->op_name, rooted ? o->root : -1, ip ? "true" : "false",
                o->graph ? "true" : "false", o->reg ? "true" : "false", r->algo, r->ctas[ip],
                c->nranks, r->t[ip], r->algbw[ip], r->busbw[ip], r->wrong[ip]);
        if (o->nccl && r->nt[ip] > 0)
            fprintf(json,
                    ", \"nccl_time_us\": %.3f, \"nccl_busbw_gbps\": %.3f, "
                    "\"nccl_path\": \"%s\", \"nccl_version\": %d, "
                    "\"nccl_symmetric\": %s",
                    r->nt[ip], r->nbusbw[ip], r->npath[ip], nccl_version,
                    o->reg ? "true" : "false");
        fprintf(json, "}");
        *first_json = 0;
    }
}

/* After the last size: the summary lines (rank 0), the JSON closed, everything freed.
 * Returns the exit status: 1 when a value was wrong. */
static int perf_finish(const maco_perf_opts_t *o, perf_ctx_t *c, perf_nccl_t *nccl, FILE *json,
                       unsigned long long total_wrong, double busbw_sum, int busbw_n)
{
    unsigned long long oob = perf_sum_over_ranks(c, c->oob);
    /* -R: how many of MACO's mesh-family launches used the registered buffers in place
     * (maco_collective_get_stats, this rank's; LL-sized calls and NCCL's are not counted). */
    maco_collective_stats_t cs;
    memset(&cs, 0, sizeof(cs));
    int stats = o->reg && c->nranks > 1 && maco_collective_get_stats(c->comm, &cs) == MACO_OK;
    if (c->rank == 0) {
        if (stats)
            printf("# Mesh launches        : %llu in place, %llu through scratch (rank 0)\n",
                   (unsigned long long)cs.inplace_launches,
                   (unsigned long long)cs.scratch_launches);
        printf("# Out of bounds values : %llu %s\n", oob, oob ? "FAILED" : "OK");
        printf("# Wrong values         : %llu %s (guard bytes included)\n", total_wrong,
               total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.3f GB/s\n", busbw_n ? busbw_sum / busbw_n : 0.0);
        fflush(stdout);
    }
    if (json != NULL) {
        fprintf(json, "\n]\n");
        fclose(json);
    }
    if (o->nccl)
        nccl_finalize(nccl);
    if (o->reg) {
        maco_mem_free(c->comm, c->in);
        maco_mem_free(c->comm, c->out);
    } else {
        cudaFree(c->in);
        cudaFree(c->out);
    }
    cudaFree(c->counters);
    cudaStreamDestroy(c->stream);
    maco_comm_destroy(c->comm);
    return total_wrong ? 1 : 0;
}

int main(int argc, char **argv)
{
    maco_perf_opts_t o;
    maco_perf_parse_t parsed = maco_perf_args_parse(argc, argv, &o, stdout, stderr);
    if (parsed != MACO_PERF_PARSE_RUN)
        return parsed == MACO_PERF_PARSE_HELP ? 0 : 2;
    if (o.dry_run) {
        maco_perf_plan_print(&o, stdout);
        perf_job_print(stdout);
        return 0;
    }
    perf_ctx_t c;
    memset(&c, 0, sizeof(c));
    struct cudaDeviceProp prop;
    int st = perf_start(&o, &c, &prop);
    if (st >= 0)
        return st;
    perf_nccl_t nccl;
    memset(&nccl, 0, sizeof(nccl));
    perf_alloc(&o, &c, &nccl);
    FILE *json = NULL;
    if (o.json_path != NULL && c.rank == 0) {
        json = fopen(o.json_path, "w");
        if (json == NULL)
            PERF_DIE("cannot write --json %s: %s", o.json_path, strerror(errno));
        fprintf(json, "[\n");
    }
    double factor = perf_busbw_factor(o.coll, c.nranks);
    int rooted = o.coll == MACO_COLL_BROADCAST || o.coll == MACO_COLL_REDUCE;
    if (c.rank == 0)
        perf_header(&o, &c, prop.name, &nccl);
    unsigned long long total_wrong = 0;
    double busbw_sum = 0;
    int busbw_n = 0;
    int first_json = 1;
    size_t blocks = o.coll == MACO_COLL_ALLGATHER || o.coll == MACO_COLL_REDUCE_SCATTER ||
                            o.coll == MACO_COLL_ALLTOALL
                        ? (size_t)c.nranks
                        : 1;
    for (int cycle = 0; o.cycles == 0 || cycle < o.cycles; cycle++) {
        if (o.cycles != 1 && c.rank == 0)
            printf("# cycle %d%s\n", cycle + 1, o.cycles == 0 ? " (-N 0: until stopped)" : "");
        for (int ti = 0; ti < o.ndtypes; ti++) {
            maco_datatype_t dt = o.dtypes[ti];
            size_t esz = maco_datatype_size(dt);
            for (int oi = 0; oi < o.nops; oi++) {
                maco_redop_t op = o.ops[oi];
                for (double sz = (double)o.min_bytes; !maco_perf_size_done(&o, sz);
                     sz = maco_perf_size_next(&o, sz)) {
                    size_t count = (size_t)sz / esz / blocks * blocks;
                    if (count == 0)
                        continue;
                    perf_row_t row;
                    perf_measure(&c, &o, &nccl, dt, op, count, &row, &total_wrong);
                    if (c.rank != 0)
                        continue;
                    perf_print_row(&o, &row, factor, rooted, &busbw_sum, &busbw_n);
                    if (json != NULL)
                        perf_json_row(json, &o, &c, &row, rooted, nccl.version, &first_json);
                }
            }
        }
    }
    return perf_finish(&o, &c, &nccl, json, total_wrong, busbw_sum, busbw_n);
}
