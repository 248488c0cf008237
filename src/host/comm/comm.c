/* comm.c - communicator creation, topology, GPU resources, errors. */
#include "maco/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/comm/comm_internal.h"
#include "src/host/base/align.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"
#include "src/host/os/socket.h"
#include "src/host/base/wire.h"

/* What every rank tells the others at creation (fixed layout, sent by allgather). */
typedef struct maco__rank_info {
    int32_t has_gpu;
    int32_t cuda_device;
    int32_t sm_count; /* as this rank's CUDA context reports it (MPS may lower it) */
    int32_t reserved0;
    uint64_t reserved[2];
    uint8_t uuid[16];
    int32_t mps;           /* the context is an MPS client (cudaDevAttrMpsEnabled) */
    int32_t shared_forced; /* MACO_SHARED_GPU=1 */
    uint64_t mps_pipe;     /* FNV-1a of the MPS pipe directory: which MPS server */
} maco__rank_info_t;
_Static_assert(sizeof(maco__rank_info_t) == 64, "rank info is 64 bytes on every rank");

/* The MPS pipe directory a client of this process connects to (nvidia-cuda-mps-control's
 * default when CUDA_MPS_PIPE_DIRECTORY is unset). Equal directories mean one MPS server. */
static const char *maco__mps_pipe_directory(void)
{
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    return dir != NULL && dir[0] != '\0' ? dir : "/tmp/nvidia-mps";
}

static maco_status_t maco__comm_topology(maco_comm_t comm)
{
    const char **ids = (const char **)calloc((size_t)comm->nranks, sizeof(char *));
    if (ids == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "maco_comm_create: no memory");
    for (int r = 0; r < comm->nranks; r++)
        maco_bootstrap_get_host_id(comm->bs, r, &ids[r]);
    maco__topology_t t;
    maco__topology_compute(ids, comm->nranks, comm->rank, &t);
    free(ids);
    comm->local_rank = t.local_rank;
    comm->local_nranks = t.local_nranks;
    comm->node = t.node;
    comm->nnodes = t.nnodes;
    /* MACO_LOCAL_RANK describes the job's world: a communicator over other ranks (a split,
     * a second job) has its own local ranks. */
    const char *env_local = getenv("MACO_LOCAL_RANK"), *env_rank = getenv("MACO_RANK");
    const char *env_size = getenv("MACO_WORLD_SIZE");
    int is_world = env_rank != NULL && env_size != NULL && atoi(env_rank) == comm->rank &&
                   atoi(env_size) == comm->nranks;
    if (is_world && env_local != NULL && env_local[0] != '\0' &&
        atoi(env_local) != comm->local_rank)
        MACO_WARN(MACO_SUBSYS_INIT,
                  "MACO_LOCAL_RANK=%s but rank %d is local rank %d of its node by host id; "
                  "using %d",
                  env_local, comm->rank, comm->local_rank, comm->local_rank);
    return MACO_OK;
}

/* Chooses the device and reads what the other ranks must know about it. */
static maco_status_t maco__comm_probe_gpu(maco_comm_t comm, int cuda_device,
                                          maco__rank_info_t *info)
{
    memset(info, 0, sizeof(*info));
    char why[512];
    int ndev = maco_cuda_device_count(why, sizeof(why));
    if (ndev == 0) {
        snprintf(comm->gpu_unavailable, sizeof(comm->gpu_unavailable),
                 "rank %d has no usable CUDA device: %s", comm->rank, why);
        if (cuda_device >= 0)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                               "maco_comm_create: cuda_device %d was asked for but %s", cuda_device,
                               comm->gpu_unavailable);
        MACO_INFO(MACO_SUBSYS_INIT, "%s; GPU operations are unsupported", comm->gpu_unavailable);
        return MACO_OK;
    }
    if (cuda_device >= ndev)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_create: cuda_device %d is outside [0, %d)", cuda_device,
                           ndev);
    int dev = cuda_device >= 0 ? cuda_device : comm->local_rank % ndev;
    MACO_CUDA_RETURN(cudaSetDevice(dev));
    /* Create the context first: under MPS, the SM count and the MPS attribute are the
     * context's (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE lowers the former). */
    MACO_CUDA_RETURN(cudaFree(NULL));
    struct cudaDeviceProp prop;
    MACO_CUDA_RETURN(cudaGetDeviceProperties(&prop, dev));
    int sms = 0, mps = 0;
    MACO_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, dev) != cudaSuccess) {
        cudaGetLastError(); /* a driver without the attribute: no MPS detection */
        mps = 0;
    }
    int64_t forced = 0;
    maco_status_t st = maco__config_int64(MACO_CFG_SHARED_GPU, &forced);
    if (st != MACO_OK)
        return st;
    comm->cuda_device = dev;
    info->has_gpu = 1;
    info->cuda_device = dev;
    info->sm_count = sms;
    info->mps = mps != 0;
    info->shared_forced = forced != 0;
    info->mps_pipe = maco__fnv1a(maco__mps_pipe_directory());
    memcpy(info->uuid, &prop.uuid, sizeof(info->uuid));
    return MACO_OK;
}

/*
 * Ranks that use the same GPU (equal UUIDs). They may share it when all of them are clients
 * of one MPS server (kernels of different ranks then run at the same time), or when each
 * sets MACO_SHARED_GPU=1 (kernels time-slice: correct, but every hand-off between the ranks
 * waits for a time slice). Writes comm->gpu_ranks (ranks on this rank's GPU) and
 * comm->coresident_ctas (comm_internal.h), or the reason sharing is refused to `why`.
 */
static void maco__comm_check_sharing(maco_comm_t comm, const maco__rank_info_t *all, char *why,
                                     size_t cap)
{
    const int n = comm->nranks, me = comm->rank;
    int ctas = 1 << 30, forced_pair = -1;
    for (int r = 0; r < n; r++) {
        int sharers = 0;
        for (int q = 0; q < n; q++) {
            if (memcmp(all[r].uuid, all[q].uuid, 16) != 0)
                continue;
            sharers++;
            if (q >= r)
                continue;
            int same_server = all[r].mps && all[q].mps && all[r].mps_pipe == all[q].mps_pipe;
            if (same_server)
                continue;
            if (all[r].shared_forced && all[q].shared_forced) {
                if (r == me || q == me)
                    forced_pair = r == me ? q : r;
                continue;
            }
            if (all[r].mps && all[q].mps)
                snprintf(why, cap,
                         "ranks %d and %d use the same GPU through different MPS servers "
                         "(CUDA_MPS_PIPE_DIRECTORY differs); run them under one MPS control "
                         "daemon, or set MACO_SHARED_GPU=1 on every rank to share the GPU by "
                         "time slices (slow)",
                         q, r);
            else if (all[q].mps || all[r].mps)
                snprintf(why, cap,
                         "ranks %d and %d use the same GPU but rank %d is not an MPS client; "
                         "start every rank under the same MPS control daemon, or set "
                         "MACO_SHARED_GPU=1 on every rank to share the GPU by time slices (slow)",
                         q, r, all[q].mps ? r : q);
            else
                snprintf(why, cap,
                         "ranks %d and %d use the same GPU and neither is an MPS client; run the "
                         "ranks under MPS (maco-run starts a private MPS daemon when a node has "
                         "fewer GPUs than ranks: --mps auto, the default), set MACO_SHARED_GPU=1 "
                         "on every rank to share the GPU by time slices (slow), or give each "
                         "rank its own GPU (CUDA_VISIBLE_DEVICES, maco_comm_create's "
                         "cuda_device)",
                         q, r);
            return;
        }
        if (r == me)
            comm->gpu_ranks = sharers;
        if (sharers > 1)
            comm->any_gpu_shared = 1;
        if (all[r].sm_count / sharers < ctas)
            ctas = all[r].sm_count / sharers;
    }
    comm->coresident_ctas = ctas < 1 ? 1 : ctas;
    if (comm->gpu_ranks > 1) {
        MACO_INFO(MACO_SUBSYS_INIT,
                  "rank %d shares GPU %d with %d other rank(s) %s; kernels that wait on peers "
                  "launch at most %d CTAs (SM count / ranks per GPU, minimum over ranks)",
                  me, comm->cuda_device, comm->gpu_ranks - 1,
                  all[me].mps ? "as clients of one MPS server (cudaDevAttrMpsEnabled = 1, same "
                                "CUDA_MPS_PIPE_DIRECTORY)"
                              : "by time slices (MACO_SHARED_GPU=1)",
                  comm->coresident_ctas);
    }
    static int warned;
    if (forced_pair >= 0 && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        MACO_WARN(MACO_SUBSYS_INIT,
                  "rank %d shares its GPU with rank %d without MPS (MACO_SHARED_GPU=1): their "
                  "kernels time-slice, so every hand-off between them waits for a time slice "
                  "(a round trip takes milliseconds, against microseconds under MPS); "
                  "run the ranks under MPS for speed (maco-run --mps auto)",
                  me, forced_pair);
}

/* Checks that all ranks can run collectives together; fills comm->gpu_unavailable if not. */
static void maco__comm_check_peers(maco_comm_t comm, const maco__rank_info_t *all)
{
    char *why = comm->gpu_unavailable;
    size_t cap = sizeof(comm->gpu_unavailable);
    for (int r = 0; r < comm->nranks; r++) {
        if (!all[r].has_gpu) {
            if (why[0] == '\0')
                snprintf(why, cap, "rank %d has no CUDA device", r);
            return;
        }
    }
    /* Ranks on several nodes keep their GPU resources (the comm buffer is mapped by the
     * peers of each node; port channels reach the others); what the collectives support is
     * theirs to say (comm->ext_unavailable). */
    maco__comm_check_sharing(comm, all, why, cap);
    if (why[0] != '\0')
        return;
}

static void maco__comm_layout(maco__comm_layout_t *l)
{
    memset(l, 0, sizeof(*l));
    l->sem_offset = 0;
    l->expected_offset = maco__align_up(l->sem_offset + MACO__NSEM * sizeof(uint64_t), 256);
    l->counters_offset = maco__align_up(l->expected_offset + MACO__NSEM * sizeof(uint64_t), 256);
    l->total_bytes = l->counters_offset + 256;
}

/* The comm buffer (comm_internal.h): allocated, registered, and mapped by every peer. */
static maco_status_t maco__comm_gpu_setup(maco_comm_t comm)
{
    maco_status_t st = MACO_OK;
    int n = comm->nranks;
    int64_t timeout_ms;
    st = maco__config_int64(MACO_CFG_DEVICE_TIMEOUT, &timeout_ms);
    if (st != MACO_OK)
        return st;
    comm->timeout_ns = maco__timeout_ns(timeout_ms);
    maco__comm_layout(&comm->layout);
    const maco__comm_layout_t *l = &comm->layout;

    MACO_CUDA_RETURN(cudaMalloc((void **)&comm->buf, l->total_bytes));
    MACO_CUDA_RETURN(cudaMemset(comm->buf, 0, l->total_bytes));
    MACO_CUDA_RETURN(cudaHostAlloc((void **)&comm->err_report, sizeof(maco_device_error_t),
                                   cudaHostAllocMapped));
    memset((void *)comm->err_report, 0, sizeof(maco_device_error_t));
    MACO_CUDA_RETURN(cudaHostGetDevicePointer((void **)&comm->err_report_dev, comm->err_report, 0));
    comm->bound.report = comm->err_report_dev;
    comm->bound.claim = (int32_t *)(comm->buf + l->counters_offset + MACO__CTR_ERROR_CLAIM);
    comm->bound.timeout_ns = comm->timeout_ns;

    st = maco_mem_register(comm, comm->buf, l->total_bytes, &comm->buf_mem);
    if (st != MACO_OK)
        return st;
    comm->peer_buf = (char **)calloc((size_t)n, sizeof(char *));
    comm->peer_buf_mem = (maco_mem_t *)calloc((size_t)n, sizeof(maco_mem_t));
    if (comm->peer_buf == NULL || comm->peer_buf_mem == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "comm setup: no host memory");
    st = maco__mem_exchange(comm, comm->buf_mem, comm->peer_buf, comm->peer_buf_mem);
    if (st != MACO_OK)
        return st;
    /* What the layers above add (the collectives' buffers and channels), then: nobody starts
     * GPU traffic before every rank has mapped every peer. */
    const maco__comm_ext_t *ext = maco__comm_extension();
    if (ext != NULL && ext->setup != NULL) {
        st = ext->setup(comm);
        if (st != MACO_OK)
            return st;
    }
    MACO_CUDA_RETURN(cudaDeviceSynchronize());
    return maco_bootstrap_barrier(comm->bs);
}

static void maco__comm_free(maco_comm_t comm)
{
    if (comm == NULL)
        return;
    /* Everything below (synchronisation, frees, unmapping) is of the communicator's device;
     * the caller's current device is current again at the end (one thread may drive several
     * communicators, as NCCL's ncclCommDestroy allows). */
    int saved = -1;
    if (comm->cuda_device >= 0 && maco__device_enter(comm->cuda_device, &saved) == cudaSuccess &&
        comm->buf != NULL)
        cudaDeviceSynchronize();
    const maco__comm_ext_t *ext = maco__comm_extension();
    if (ext != NULL && ext->destroy != NULL)
        ext->destroy(comm);
    if (comm->peer_buf_mem != NULL)
        for (int r = 0; r < comm->nranks; r++)
            maco_mem_deregister(comm->peer_buf_mem[r]);
    maco_mem_deregister(comm->buf_mem);
    if (comm->buf)
        cudaFree(comm->buf);
    if (comm->err_report)
        cudaFreeHost((void *)comm->err_report);
    if (comm->probe_stream != NULL)
        cudaStreamDestroy((cudaStream_t)comm->probe_stream);
    cudaGetLastError();
    free(comm->peer_buf);
    free(comm->peer_buf_mem);
    if (comm->bs != NULL)
        maco__bootstrap_set_on_revoke(comm->bs, NULL, NULL);
    if (comm->owns_bootstrap)
        maco_bootstrap_destroy(comm->bs);
    pthread_mutex_destroy(&comm->error_lock);
    free(comm);
    maco__device_leave(saved);
}

maco_status_t maco_comm_create(maco_bootstrap_t bs, int cuda_device, maco_comm_t *comm_p)
{
    if (bs == NULL || comm_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_create: bs and comm_p must not be NULL");
    if (cuda_device < -1)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_create: cuda_device is %d; use -1 or a device index",
                           cuda_device);
    maco_comm_t comm = (maco_comm_t)calloc(1, sizeof(*comm));
    if (comm == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "maco_comm_create: no memory");
    pthread_mutex_init(&comm->error_lock, NULL);
    comm->bs = bs;
    comm->cuda_device = -1;
    maco_bootstrap_get_rank(bs, &comm->rank);
    maco_bootstrap_get_nranks(bs, &comm->nranks);
    MACO__LOG_RANK_SCOPE(comm->rank);
    maco__rank_info_t *all = NULL;
    maco_status_t st = maco__comm_topology(comm);
    if (st != MACO_OK)
        goto fail;
    maco__rank_info_t info;
    st = maco__comm_probe_gpu(comm, cuda_device, &info);
    if (st != MACO_OK)
        goto fail;
    all = (maco__rank_info_t *)calloc((size_t)comm->nranks, sizeof(*all));
    if (all == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "maco_comm_create: no memory");
        goto fail;
    }
    all[comm->rank] = info;
    st = maco_bootstrap_allgather(bs, all, sizeof(*all));
    if (st != MACO_OK)
        goto fail;
    maco__comm_check_peers(comm, all);
    if (comm->gpu_unavailable[0] == '\0') {
        st = maco__comm_gpu_setup(comm);
        if (st != MACO_OK)
            goto fail;
    } else if (info.has_gpu) {
        MACO_INFO(MACO_SUBSYS_INIT, "rank %d: collectives unavailable: %s", comm->rank,
                  comm->gpu_unavailable);
    }
    free(all);
    if (comm->gpu_unavailable[0] != '\0') {
        comm->gpu_ranks = 0; /* the getters' documented value without a usable GPU */
        comm->coresident_ctas = 0;
    }
    /* A peer's maco_comm_revoke reaches this communicator through its bootstrap. */
    maco__bootstrap_set_on_revoke(bs, maco__comm_on_revoke, comm);
    MACO_INFO(MACO_SUBSYS_INIT,
              "communicator: rank %d of %d, local rank %d of %d, node %d of %d, device %d",
              comm->rank, comm->nranks, comm->local_rank, comm->local_nranks, comm->node,
              comm->nnodes, comm->cuda_device);
    *comm_p = comm;
    return MACO_OK;
fail:
    free(all);
    maco__comm_free(comm);
    return st;
}

maco_status_t maco_comm_abort(maco_comm_t comm)
{
    if (comm == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_abort: comm is NULL");
    /* The error first, so that anyone woken by the word finds it; the device's own report,
     * when a wait failed before, stays the one maco_comm_get_async_error gives. */
    pthread_mutex_lock(&comm->error_lock);
    if (comm->first_status == MACO_OK || comm->first_status == MACO_ERR_INVALID_ARGUMENT ||
        comm->first_status == MACO_ERR_UNSUPPORTED) { /* as maco__comm_record */
        comm->first_status = MACO_ERR_REMOTE;
        snprintf(comm->first_error, sizeof(comm->first_error),
                 "rank %d: the communicator was aborted (maco_comm_abort): its device waits "
                 "return at once",
                 comm->rank);
    }
    pthread_mutex_unlock(&comm->error_lock);
    if (comm->err_report == NULL || comm->err_report->status == 0)
        __atomic_compare_exchange_n(&comm->host_async_status, &(int32_t){ 0 },
                                    (int32_t)MACO_ERR_REMOTE, 0, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);
    if (comm->buf == NULL)
        return MACO_OK;
    return maco__comm_end_device_waits(comm);
}

maco_status_t maco_comm_init_from_env(maco_comm_t *comm_p)
{
    if (comm_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_init_from_env: comm_p is NULL");
    maco_bootstrap_t bs;
    maco_status_t st = maco_bootstrap_create_from_env(&bs);
    if (st != MACO_OK)
        return st;
    maco_comm_t comm;
    st = maco_comm_create(bs, -1, &comm);
    if (st != MACO_OK) {
        maco_bootstrap_destroy(bs);
        return st;
    }
    comm->owns_bootstrap = 1;
    *comm_p = comm;
    return MACO_OK;
}

maco_status_t maco_comm_destroy(maco_comm_t comm)
{
    MACO__LOG_RANK_SCOPE(comm != NULL ? comm->rank : -1);
    maco__comm_free(comm);
    return MACO_OK;
}

#define MACO__COMM_GETTER(name, field)                                                             \
    maco_status_t maco_comm_get_##name(maco_comm_t comm, int *value_p)                             \
    {                                                                                              \
        if (comm == NULL || value_p == NULL)                                                       \
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,                        \
                               "maco_comm_get_" #name ": NULL argument");                          \
        *value_p = comm->field;                                                                    \
        return MACO_OK;                                                                            \
    }

MACO__COMM_GETTER(rank, rank)
MACO__COMM_GETTER(nranks, nranks)
MACO__COMM_GETTER(local_rank, local_rank)
MACO__COMM_GETTER(local_nranks, local_nranks)
MACO__COMM_GETTER(node, node)
MACO__COMM_GETTER(nnodes, nnodes)
MACO__COMM_GETTER(cuda_device, cuda_device)
MACO__COMM_GETTER(gpu_ranks, gpu_ranks)
MACO__COMM_GETTER(coresident_ctas, coresident_ctas)

maco_status_t maco_comm_get_bootstrap(maco_comm_t comm, maco_bootstrap_t *bs_p)
{
    if (comm == NULL || bs_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_get_bootstrap: NULL argument");
    *bs_p = comm->bs;
    return MACO_OK;
}
