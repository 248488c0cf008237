/*
 * ep.c - expert-parallel dispatch and combine, the host side (maco/ep.h): the buffer's
 * creation (an agreed configuration, one registered allocation mapped by every peer, a
 * pinned report), the calls' argument checks and launches, and the reports of input errors
 * the kernels found (ep_kernels.cu has the protocol, ep_layout.h the layouts).
 */
#include "maco/ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/host/comm/comm_internal.h"
#include "src/host/cuda/cuda_util.h"
#include "algorithms/ep/ep_kernels.h"
#include "algorithms/ep/ep_layout.h"
#include "src/host/base/log.h"

struct maco_ep_buffer {
    maco_comm_t comm;
    maco__ep_geom_t g;
    maco__ep_offsets_t o;
    int ctas;
    size_t dispatch_smem, combine_smem;
    char *buf;                     /* this rank's EP buffer (device) */
    maco_mem_t mem;                /* its registration */
    char **peer;                   /* [nranks] mapped buffers (own: buf) */
    maco_mem_t *peer_mem;          /* [nranks] imports (own: NULL) */
    maco__ep_report_t *report;     /* pinned host memory */
    maco__ep_report_t *report_dev; /* its device address */
    cudaEvent_t event;             /* normal-mode dispatch with num_recv_p waits on it */
    uint64_t buffer_id;            /* random; handles carry it */
    uint64_t ticket;               /* launches so far */
    uint32_t seen_failures;        /* report->failures already returned (atomic) */
};

/* What every rank passes to maco_ep_buffer_create, compared field by field. */
typedef struct maco__ep_wire {
    int64_t v[8];
} maco__ep_wire_t;

static const char *const maco__ep_fields[8] = {
    "mode",  "max_tokens_per_rank", "hidden",   "num_experts", "topk",
    "dtype", "max_recv_tokens",     "num_ctas",
};

static void maco__ep_to_wire(const maco_ep_config_t *c, maco__ep_wire_t *w)
{
    w->v[0] = (int64_t)c->mode;
    w->v[1] = c->max_tokens_per_rank;
    w->v[2] = c->hidden;
    w->v[3] = c->num_experts;
    w->v[4] = c->topk;
    w->v[5] = (int64_t)c->dtype;
    w->v[6] = c->max_recv_tokens;
    w->v[7] = c->num_ctas;
}

maco_status_t maco_ep_buffer_size(const maco_ep_config_t *config, int nranks,
                                  size_t *buffer_bytes_p, size_t *handle_bytes_p)
{
    if (buffer_bytes_p == NULL || handle_bytes_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_ep_buffer_size: %s is NULL",
                           buffer_bytes_p == NULL ? "buffer_bytes_p" : "handle_bytes_p");
    if (nranks < 1 || nranks > MACO_EP_MAX_RANKS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_ep_buffer_size: nranks %d is outside [1, %d]", nranks,
                           MACO_EP_MAX_RANKS);
    char why[400];
    maco__ep_offsets_t o;
    maco_status_t st = maco__ep_plan(config, nranks, NULL, &o, why, sizeof(why));
    if (st != MACO_OK)
        return maco__error(st, MACO_SUBSYS_COLL, "maco_ep_buffer_size: %s", why);
    *buffer_bytes_p = (size_t)o.total_bytes;
    *handle_bytes_p = (size_t)o.handle_bytes;
    return MACO_OK;
}

/* maco_ep_buffer_destroy's work, with the buffer's device current. */
static maco_status_t maco__ep_free(maco_ep_buffer_t b)
{
    maco_status_t st = MACO_OK;
    if (b->buf != NULL && cudaDeviceSynchronize() != cudaSuccess)
        st = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                         "maco_ep_buffer_destroy: cudaDeviceSynchronize failed: %s",
                         cudaGetErrorString(cudaGetLastError()));
    if (b->peer_mem != NULL)
        for (int r = 0; r < b->comm->nranks; r++)
            if (b->peer_mem[r] != NULL)
                maco_mem_deregister(b->peer_mem[r]);
    if (b->mem != NULL)
        maco_mem_deregister(b->mem);
    if (b->buf != NULL)
        cudaFree(b->buf);
    if (b->report != NULL)
        cudaFreeHost(b->report);
    if (b->event != NULL)
        cudaEventDestroy(b->event);
    cudaGetLastError();
    free(b->peer);
    free(b->peer_mem);
    free(b);
    return st;
}

maco_status_t maco_ep_buffer_destroy(maco_ep_buffer_t buf)
{
    if (buf == NULL)
        return MACO_OK;
    int saved = -1;
    (void)maco__device_enter(buf->comm->cuda_device, &saved);
    maco_status_t st = maco__ep_free(buf);
    maco__device_leave(saved);
    return st;
}

/* Every rank passed the same configuration (collective): MACO_OK, else the first field and
 * rank that differ from rank 0's, on every rank alike. */
static maco_status_t maco__ep_agree(maco_comm_t comm, const maco_ep_config_t *cfg)
{
    const int n = comm->nranks;
    maco__ep_wire_t *all = (maco__ep_wire_t *)calloc((size_t)n, sizeof(*all));
    if (all == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL,
                           "maco_ep_buffer_create: no memory");
    maco__ep_to_wire(cfg, &all[comm->rank]);
    maco_status_t st = maco_bootstrap_allgather(comm->bs, all, sizeof(*all));
    for (int r = 1; st == MACO_OK && r < n; r++)
        for (int f = 0; f < 8; f++)
            if (all[r].v[f] != all[0].v[f]) {
                st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                 "maco_ep_buffer_create: config.%s is %lld on rank %d but %lld on "
                                 "rank 0; every rank must pass the same configuration",
                                 maco__ep_fields[f], (long long)all[r].v[f], r,
                                 (long long)all[0].v[f]);
                break;
            }
    free(all);
    return st;
}

/* CTAs of every EP kernel: the configured or default number, capped at the co-resident bound
 * of kernels that wait on peers (halved when any GPU of the job is shared, as the
 * collectives do: common/state.h, maco__coll_ctas). The same on every rank (the inputs are). */
static int maco__ep_ctas(maco_comm_t comm, const maco__ep_geom_t *g)
{
    int want = g->num_ctas > 0                  ? g->num_ctas
               : g->mode == MACO_EP_LOW_LATENCY ? MACO_EP_DEFAULT_CTAS_LL
                                                : MACO_EP_DEFAULT_CTAS_NORMAL;
    int bound = comm->coresident_ctas;
    if (comm->any_gpu_shared && bound > 1)
        bound /= 2;
    if (bound < 1)
        bound = 1;
    return want < bound ? want : bound;
}

/* maco_ep_buffer_create's work after the checks, with the communicator's device current. */
static maco_status_t maco__ep_setup(maco_ep_buffer_t b)
{
    maco_comm_t comm = b->comm;
    const int n = comm->nranks;
    maco_status_t st = MACO_OK;
    b->peer = (char **)calloc((size_t)n, sizeof(char *));
    b->peer_mem = (maco_mem_t *)calloc((size_t)n, sizeof(maco_mem_t));
    if (b->peer == NULL || b->peer_mem == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL,
                           "maco_ep_buffer_create: no memory");
    /* Zeroed (the control words and flags start at 0) before any peer can map it. */
    MACO_CUDA_RETURN(cudaMalloc((void **)&b->buf, (size_t)b->o.total_bytes));
    MACO_CUDA_RETURN(cudaMemset(b->buf, 0, (size_t)b->o.total_bytes));
    MACO_CUDA_RETURN(cudaDeviceSynchronize());
    MACO_CUDA_RETURN(
        cudaHostAlloc((void **)&b->report, sizeof(maco__ep_report_t), cudaHostAllocMapped));
    memset((void *)b->report, 0, sizeof(maco__ep_report_t));
    MACO_CUDA_RETURN(cudaHostGetDevicePointer((void **)&b->report_dev, (void *)b->report, 0));
    MACO_CUDA_RETURN(cudaEventCreateWithFlags(&b->event, cudaEventDisableTiming));
    b->dispatch_smem = maco__ep_dispatch_smem(&b->g);
    b->combine_smem = maco__ep_combine_smem(&b->g);
    cudaError_t e = maco__ep_prepare_kernels(b->dispatch_smem, b->combine_smem);
    if (e != cudaSuccess)
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                           "maco_ep_buffer_create: rank %d: loading the EP kernels on device %d "
                           "(%zu bytes of shared memory for %d experts) failed: %s (%s)",
                           comm->rank, comm->cuda_device, b->dispatch_smem, b->g.num_experts,
                           cudaGetErrorName(e), cudaGetErrorString(e));
    st = maco_mem_register(comm, b->buf, (size_t)b->o.total_bytes, &b->mem);
    if (st == MACO_OK) /* collective: every rank's buffer, mapped here */
        st = maco__mem_exchange(comm, b->mem, b->peer, b->peer_mem);
    if (st != MACO_OK)
        return st;
    for (int r = 0; r < n; r++)
        if (b->peer[r] == NULL)
            return maco__error(MACO_ERR_INTERNAL, MACO_SUBSYS_COLL,
                               "maco_ep_buffer_create: rank %d's buffer is not mapped here", r);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    b->buffer_id = ((uint64_t)(uintptr_t)b->buf * 0x9E3779B97F4A7C15ull) ^
                   ((uint64_t)getpid() << 32) ^ ((uint64_t)ts.tv_sec * 1000000000ull) ^
                   (uint64_t)ts.tv_nsec ^ (uint64_t)comm->rank;
    if (b->buffer_id == 0)
        b->buffer_id = 1;
    return MACO_OK;
}

maco_status_t maco_ep_buffer_create(maco_comm_t comm, const maco_ep_config_t *config,
                                    maco_ep_buffer_t *buf_p)
{
    const char *fn = "maco_ep_buffer_create";
    if (comm == NULL || config == NULL || buf_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: %s is NULL", fn,
                           comm == NULL     ? "comm"
                           : config == NULL ? "config"
                                            : "buf_p");
    maco_status_t st = maco__comm_require_gpu(comm, fn);
    if (st != MACO_OK)
        return st;
    if (comm->nnodes > 1)
        return maco__comm_record(
            comm, maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                              "%s: the communicator spans %d nodes; EP buffers move tokens inside "
                              "one node only in this version (docs/ep.md)",
                              fn, comm->nnodes));
    st = maco__ep_agree(comm, config);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    maco_ep_buffer_t b = (maco_ep_buffer_t)calloc(1, sizeof(*b));
    if (b == NULL)
        return maco__comm_record(
            comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "%s: no memory", fn));
    b->comm = comm;
    char why[400];
    st = maco__ep_plan(config, comm->nranks, &b->g, &b->o, why, sizeof(why));
    if (st != MACO_OK) {
        free(b);
        return maco__comm_record(comm, maco__error(st, MACO_SUBSYS_COLL, "%s: %s", fn, why));
    }
    b->ctas = maco__ep_ctas(comm, &b->g);
    b->g.num_ctas = b->ctas;
    int saved = -1;
    st = maco__device_enter_status(comm->cuda_device, &saved, fn);
    if (st == MACO_OK) {
        st = maco__ep_setup(b);
        if (st != MACO_OK)
            (void)maco__ep_free(b);
        maco__device_leave(saved);
    } else {
        free(b);
    }
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    MACO_INFO(MACO_SUBSYS_COLL,
              "rank %d: EP buffer (%s): %d tokens per rank, hidden %d, %d experts, top-%d; %lld "
              "receive rows, %zu bytes, %d CTAs per kernel",
              comm->rank, b->g.mode == MACO_EP_LOW_LATENCY ? "low latency" : "normal",
              b->g.max_tokens, b->g.hidden, b->g.num_experts, b->g.topk, (long long)b->g.recv_rows,
              (size_t)b->o.total_bytes, b->ctas);
    *buf_p = b;
    return MACO_OK;
}

maco_status_t maco_ep_buffer_get_info(maco_ep_buffer_t buf, maco_ep_info_t *info_p)
{
    if (buf == NULL || info_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_ep_buffer_get_info: %s is NULL", buf == NULL ? "buf" : "info_p");
    memset(info_p, 0, sizeof(*info_p));
    info_p->nranks = buf->g.nranks;
    info_p->rank = buf->comm->rank;
    info_p->local_experts = buf->g.local_experts;
    info_p->num_ctas = buf->ctas;
    info_p->recv_rows = buf->g.recv_rows;
    info_p->expert_capacity = buf->g.expert_cap;
    info_p->recv_x = buf->buf + buf->o.recv_off;
    info_p->buffer_bytes = (size_t)buf->o.total_bytes;
    info_p->handle_bytes = (size_t)buf->o.handle_bytes;
    return MACO_OK;
}

/* The communicator can take the launch: no earlier asynchronous error, a stream of its
 * device. Records errors. */
static maco_status_t maco__ep_ready(maco_ep_buffer_t b, const char *fn, maco_stream_t stream)
{
    maco_comm_t comm = b->comm;
    maco_status_t async_st = maco__comm_async_status(comm);
    if (async_st != MACO_OK)
        return maco__comm_refuse(comm, fn, async_st, MACO_SUBSYS_COLL);
    return maco__comm_check_stream(comm, stream, fn);
}

static void maco__ep_args_base(maco_ep_buffer_t b, int num_tokens, maco__ep_args_t *a)
{
    memset(a, 0, sizeof(*a));
    a->g = b->g;
    a->o = b->o;
    a->rank = b->comm->rank;
    a->num_tokens = num_tokens;
    a->buf = b->buf;
    for (int r = 0; r < b->g.nranks; r++)
        a->peer[r] = b->peer[r];
    a->report = b->report_dev;
    a->ticket = ++b->ticket;
    a->buffer_id = b->buffer_id;
    a->bound = b->comm->bound;
}

/* The report's problem as an error (logged), and marks it returned. The caller read the
 * report's ticket or failures with acquire ordering, so its fields are read after them. */
static maco_status_t maco__ep_report_error(maco_ep_buffer_t b, uint32_t failures)
{
    const maco__ep_report_t *r = b->report;
    maco__ep_bad_t bad;
    bad.code = r->code;
    bad.rank = r->rank;
    bad.token = r->token;
    bad.k = r->k;
    bad.value = r->value;
    bad.limit = r->limit;
    const char *fn = r->op == 0 ? "maco_ep_dispatch" : "maco_ep_combine";
    uint32_t seen = __atomic_exchange_n(&b->seen_failures, failures, __ATOMIC_ACQ_REL);
    char text[600];
    maco__ep_bad_text(&bad, fn, text, sizeof(text));
    if (failures - seen > 1)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s (the last of %u launches that stopped since the last report)", text,
                           failures - seen);
    return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s", text);
}

maco_status_t maco_ep_buffer_check(maco_ep_buffer_t buf)
{
    if (buf == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_ep_buffer_check: buf is NULL");
    uint32_t failures = __atomic_load_n(&buf->report->failures, __ATOMIC_ACQUIRE);
    if (failures == __atomic_load_n(&buf->seen_failures, __ATOMIC_ACQUIRE))
        return MACO_OK;
    return maco__ep_report_error(buf, failures);
}

/* Normal-mode dispatch with num_recv_p: waits for the launch (its event) and reads what it
 * reported. */
static maco_status_t maco__ep_wait_count(maco_ep_buffer_t b, uint64_t ticket, cudaStream_t s,
                                         int64_t *num_recv_p)
{
    const char *fn = "maco_ep_dispatch";
    cudaError_t e = cudaEventRecord(b->event, s);
    if (e == cudaSuccess)
        e = cudaEventSynchronize(b->event);
    if (e != cudaSuccess)
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                           "%s: waiting for the count exchange (cudaEventSynchronize) failed: %s "
                           "(%s)",
                           fn, cudaGetErrorName(e), cudaGetErrorString(e));
    /* A device wait that failed ended the kernel early: the communicator says why. */
    maco_status_t async_st = maco__comm_async_status(b->comm);
    if (async_st != MACO_OK)
        return async_st;
    /* Acquire: the report's fields, written before its ticket, are read after it. */
    if (__atomic_load_n(&b->report->ticket, __ATOMIC_ACQUIRE) != ticket)
        return maco__error(MACO_ERR_INTERNAL, MACO_SUBSYS_COLL,
                           "%s: the dispatch kernel ended without its report (ticket %llu, "
                           "found %llu)",
                           fn, (unsigned long long)ticket, (unsigned long long)b->report->ticket);
    int64_t rows = b->report->num_recv;
    if (rows < 0)
        return maco__ep_report_error(b, b->report->failures);
    *num_recv_p = rows;
    return MACO_OK;
}

/* maco_ep_dispatch (fp8 0) and maco_ep_dispatch_fp8 (1). */
static maco_status_t maco__ep_dispatch(maco_ep_buffer_t buf, int fp8, const void *x,
                                       maco_datatype_t x_dtype, int num_tokens, int hidden,
                                       const int64_t *topk_idx, const float *topk_weights, int topk,
                                       int32_t *recv_counts, int32_t *recv_offsets,
                                       float *recv_topk_weights, void *handle, int64_t *num_recv_p,
                                       maco_stream_t stream)
{
    const char *fn = fp8 ? "maco_ep_dispatch_fp8" : "maco_ep_dispatch";
    if (buf == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: buf is NULL", fn);
    maco_comm_t comm = buf->comm;
    char why[400];
    maco_status_t st = maco__ep_check_dispatch(
        &buf->g, fp8, x, x_dtype, num_tokens, hidden, topk_idx, topk_weights, topk, recv_counts,
        recv_offsets, recv_topk_weights, handle, num_recv_p != NULL, why, sizeof(why));
    if (st != MACO_OK)
        return maco__comm_record(comm, maco__error(st, MACO_SUBSYS_COLL, "%s", why));
    st = maco__ep_ready(buf, fn, stream);
    if (st != MACO_OK)
        return st;
    cudaStream_t s = (cudaStream_t)stream;
    if (num_recv_p != NULL) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(s, &cs) != cudaSuccess)
            cudaGetLastError();
        if (cs != cudaStreamCaptureStatusNone)
            return maco__comm_record(
                comm, maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_COLL,
                                  "%s: num_recv_p makes the call wait for the stream, which "
                                  "captures a graph; pass num_recv_p = NULL there",
                                  fn));
    }
    int saved = -1;
    st = maco__device_enter_status(comm->cuda_device, &saved, fn);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    maco__ep_args_t a;
    maco__ep_args_base(buf, num_tokens, &a);
    a.x = x;
    a.topk_idx = topk_idx;
    a.topk_weights = topk_weights;
    a.recv_counts = recv_counts;
    a.recv_offsets = recv_offsets;
    a.recv_weights = recv_topk_weights;
    a.handle = handle;
    a.want_report = num_recv_p != NULL;
    a.fp8 = fp8;
    cudaError_t e = maco__ep_launch_dispatch(&a, buf->ctas, buf->dispatch_smem, s);
    if (e != cudaSuccess)
        st = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                         "%s: launching the dispatch kernel (%d CTAs, %zu bytes of shared "
                         "memory) failed: %s (%s)",
                         fn, buf->ctas, buf->dispatch_smem, cudaGetErrorName(e),
                         cudaGetErrorString(e));
    else if (num_recv_p != NULL)
        st = maco__ep_wait_count(buf, a.ticket, s, num_recv_p);
    maco__device_leave(saved);
    return st == MACO_OK ? MACO_OK : maco__comm_record(comm, st);
}

maco_status_t maco_ep_dispatch(maco_ep_buffer_t buf, const void *x, maco_datatype_t x_dtype,
                               int num_tokens, int hidden, const int64_t *topk_idx,
                               const float *topk_weights, int topk, int32_t *recv_counts,
                               int32_t *recv_offsets, float *recv_topk_weights, void *handle,
                               int64_t *num_recv_p, maco_stream_t stream)
{
    return maco__ep_dispatch(buf, 0, x, x_dtype, num_tokens, hidden, topk_idx, topk_weights, topk,
                             recv_counts, recv_offsets, recv_topk_weights, handle, num_recv_p,
                             stream);
}

maco_status_t maco_ep_dispatch_fp8(maco_ep_buffer_t buf, const void *x, maco_datatype_t x_dtype,
                                   int num_tokens, int hidden, const int64_t *topk_idx,
                                   const float *topk_weights, int topk, int32_t *recv_counts,
                                   int32_t *recv_offsets, float *recv_topk_weights, void *handle,
                                   int64_t *num_recv_p, maco_stream_t stream)
{
    return maco__ep_dispatch(buf, 1, x, x_dtype, num_tokens, hidden, topk_idx, topk_weights, topk,
                             recv_counts, recv_offsets, recv_topk_weights, handle, num_recv_p,
                             stream);
}

maco_status_t maco_ep_combine(maco_ep_buffer_t buf, const void *expert_out, maco_datatype_t dtype,
                              int hidden, const void *handle, const float *topk_weights,
                              int num_tokens, int topk, void *y, maco_stream_t stream)
{
    const char *fn = "maco_ep_combine";
    if (buf == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: buf is NULL", fn);
    maco_comm_t comm = buf->comm;
    char why[400];
    maco_status_t st = maco__ep_check_combine(&buf->g, expert_out, dtype, hidden, handle,
                                              topk_weights, num_tokens, topk, y, why, sizeof(why));
    if (st != MACO_OK)
        return maco__comm_record(comm, maco__error(st, MACO_SUBSYS_COLL, "%s", why));
    st = maco__ep_ready(buf, fn, stream);
    if (st != MACO_OK)
        return st;
    int saved = -1;
    st = maco__device_enter_status(comm->cuda_device, &saved, fn);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    maco__ep_args_t a;
    maco__ep_args_base(buf, num_tokens, &a);
    a.topk_weights = topk_weights;
    a.handle = (void *)handle;
    a.expert_out = expert_out;
    a.y = y;
    cudaError_t e = maco__ep_launch_combine(&a, buf->ctas, buf->combine_smem, (cudaStream_t)stream);
    if (e != cudaSuccess)
        st = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                         "%s: launching the combine kernel (%d CTAs) failed: %s (%s)", fn,
                         buf->ctas, cudaGetErrorName(e), cudaGetErrorString(e));
    maco__device_leave(saved);
    return st == MACO_OK ? MACO_OK : maco__comm_record(comm, st);
}
