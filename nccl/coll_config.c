/*
 * coll_config.c - the collectives with a per-call config of NCCL 2.31 (ncclAllReduceConfig ...
 * ncclScatterConfig), and the one-sided calls of NCCL 2.29 (ncclPutSignal, ncclSignal,
 * ncclWaitSignal), which MACO's library refuses (shim.h; docs/nccl.md).
 *
 * A config call is its plain call (coll.c) once the config is checked: MACO picks its own
 * algorithms and CTA counts, so the tuning fields are accepted and ignored; an algorithm
 * selection that NCCL must honour (forceAlgSelection) is refused, since none of NCCL's
 * algorithms is MACO's. A launch-completion event is recorded on the stream just before the
 * collective, as NCCL does with CUDA older than 12.3.
 */
#include <string.h>

#include "shim.h"

/* Whether config c, as large as its size field says, holds field (2.31's lacks the event). */
#define MACO_NCCL_CC_HAS(c, field)                                                                 \
    ((c)->size >= offsetof(ncclCollConfig_t, field) + sizeof((c)->field))

/*
 * Checks an ncclCollConfig_t (NULL: none) for `what` on `comm` and records its launch-completion
 * event on `stream`. Only the fields inside config->size are read (2.31's config is smaller).
 */
static ncclResult_t maco_nccl__coll_config(const ncclCollConfig_t *cfg, const char *what,
                                           ncclComm_t comm, cudaStream_t stream)
{
    if (cfg == NULL)
        return ncclSuccess;
    if (cfg->magic != NCCL_API_MAGIC)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: config->magic is %#x, not %#x: initialise the config with "
                               "NCCL_COLLCONFIG_INITIALIZER",
                               what, cfg->magic, (unsigned)NCCL_API_MAGIC);
    if (!MACO_NCCL_CC_HAS(cfg, userProfilerTag) || cfg->size > (1u << 20))
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: config->size is %zu, outside [%zu, 1 MiB]: initialise the "
                               "config with NCCL_COLLCONFIG_INITIALIZER",
                               what, cfg->size,
                               offsetof(ncclCollConfig_t, userProfilerTag) +
                                   sizeof(cfg->userProfilerTag));
    if (cfg->minCTAs != NCCL_CONFIG_UNDEF_INT && cfg->maxCTAs != NCCL_CONFIG_UNDEF_INT &&
        (cfg->minCTAs < 1 || cfg->maxCTAs < cfg->minCTAs))
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: config->minCTAs %d and maxCTAs %d: need 1 <= minCTAs <= "
                               "maxCTAs",
                               what, cfg->minCTAs, cfg->maxCTAs);
    if (cfg->algSelection != NULL && cfg->algSelection[0] != '\0' && cfg->forceAlgSelection != 0)
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: config->algSelection '%s' with forceAlgSelection: MACO runs "
                               "its own algorithms, none of NCCL's; set forceAlgSelection = 0 "
                               "to let it choose",
                               what, cfg->algSelection);
    if (!MACO_NCCL_CC_HAS(cfg, launchCompletionEvent) || cfg->launchCompletionEvent == NULL)
        return ncclSuccess;
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    /* Recorded with the communicator's device current: stream 0 names that device's. */
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess)
        cudaGetLastError();
    if (comm->device >= 0 && comm->device != cur)
        cudaSetDevice(comm->device);
    cudaError_t e = cudaEventRecord(cfg->launchCompletionEvent, stream);
    if (comm->device >= 0 && cur >= 0 && comm->device != cur)
        cudaSetDevice(cur);
    if (e != cudaSuccess)
        return maco_nccl__fail(ncclUnhandledCudaError,
                               "%s: recording config->launchCompletionEvent: %s", what,
                               cudaGetErrorString(e));
    return ncclSuccess;
}

/* Checks the config, then runs the plain call; a failed check counts as an argument error of an
 * open group, as the plain call's own checks do. */
#define MACO_NCCL_WITH_CONFIG(what, call)                                                          \
    do {                                                                                           \
        ncclResult_t res_ = maco_nccl__coll_config(config, what, comm, stream);                    \
        if (res_ != ncclSuccess) {                                                                 \
            maco_nccl__group_note_error(res_);                                                     \
            return res_;                                                                           \
        }                                                                                          \
        return call;                                                                               \
    } while (0)

ncclResult_t pncclAllReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream, const ncclCollConfig_t *config)
{
    MACO_NCCL_WITH_CONFIG("ncclAllReduceConfig",
                          pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream));
}
MACO_NCCL_ALIAS(ncclAllReduceConfig)

ncclResult_t pncclBroadcastConfig(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream, const ncclCollConfig_t *config)
{
    MACO_NCCL_WITH_CONFIG("ncclBroadcastConfig",
                          pncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream));
}
MACO_NCCL_ALIAS(ncclBroadcastConfig)

ncclResult_t pncclReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t *config)
{
    MACO_NCCL_WITH_CONFIG("ncclReduceConfig",
                          pncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream));
}
MACO_NCCL_ALIAS(ncclReduceConfig)

ncclResult_t pncclAllGatherConfig(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                  const ncclCollConfig_t *config)
{
    MACO_NCCL_WITH_CONFIG("ncclAllGatherConfig",
                          pncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream));
}
MACO_NCCL_ALIAS(ncclAllGatherConfig)

ncclResult_t pncclReduceScatterConfig(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream, const ncclCollConfig_t *config)
{
    MACO_NCCL_WITH_CONFIG(
        "ncclReduceScatterConfig",
        pncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
}
MACO_NCCL_ALIAS(ncclReduceScatterConfig)

ncclResult_t pncclAlltoAllConfig(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                 const ncclCollConfig_t *config)
{
    MACO_NCCL_WITH_CONFIG("ncclAlltoAllConfig",
                          pncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream));
}
MACO_NCCL_ALIAS(ncclAlltoAllConfig)

ncclResult_t pncclGatherConfig(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t *config)
{
    MACO_NCCL_WITH_CONFIG("ncclGatherConfig",
                          pncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream));
}
MACO_NCCL_ALIAS(ncclGatherConfig)

ncclResult_t pncclScatterConfig(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream, const ncclCollConfig_t *config)
{
    MACO_NCCL_WITH_CONFIG("ncclScatterConfig",
                          pncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream));
}
MACO_NCCL_ALIAS(ncclScatterConfig)

/* ------------------------------------------------------------------ one-sided calls */

/* NCCL's one-sided calls write into a peer's window through NCCL's RMA transports (GIN, the
 * copy engines); MACO's library has no such path (MACO's own one-sided puts are its port and
 * memory channels: maco/port_channel.h). Refused, after the communicator check. */
static ncclResult_t maco_nccl__no_rma(const char *what, ncclComm_t comm)
{
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res == ncclSuccess)
        res = maco_nccl__fail(ncclInvalidUsage,
                              "%s: one-sided calls (ncclPutSignal, ncclSignal, ncclWaitSignal) "
                              "are not provided by MACO's NCCL library; use ncclSend/ncclRecv, "
                              "or MACO's port channels (maco/port_channel.h)",
                              what);
    maco_nccl__group_note_error(res);
    return res;
}

ncclResult_t pncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                            unsigned int flags, ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__no_rma("ncclPutSignal", comm);
}
MACO_NCCL_ALIAS(ncclPutSignal)

ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                         cudaStream_t stream)
{
    return maco_nccl__no_rma("ncclSignal", comm);
}
MACO_NCCL_ALIAS(ncclSignal)

ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
                             cudaStream_t stream)
{
    return maco_nccl__no_rma("ncclWaitSignal", comm);
}
MACO_NCCL_ALIAS(ncclWaitSignal)
