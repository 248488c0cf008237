/* comm.c - the public communicator calls of nccl.h: unique ids, creation, split, shrink,
 * finalize, destroy, abort, revoke, queries, errors, registration, ncclMemAlloc (shim.h). */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define MACO_NCCL_CONFIG_MAGIC 0xcafebeefu

static pthread_once_t maco_nccl__env_once = PTHREAD_ONCE_INIT;

void maco_nccl__env_first_use(void)
{
    pthread_once(&maco_nccl__env_once, maco_nccl__env_apply);
}

/* The calling thread's CUDA device, NCCL's choice at creation; -1 without one. */
static int maco_nccl__current_device(void)
{
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clears it */
        return -1;
    }
    return dev;
}

/* Whether config cfg, as large as its size field says, holds field (an older nccl.h made it
 * smaller). */
#define MACO_NCCL_HAS(cfg, field)                                                                  \
    ((cfg)->size >= offsetof(ncclConfig_t, field) + sizeof((cfg)->field))

ncclResult_t maco_nccl__config(const ncclConfig_t *cfg, const char *what, int *blocking_p,
                               const char **name_p)
{
    *blocking_p = maco_nccl__env_blocking_default();
    *name_p = NULL;
    if (cfg == NULL)
        return ncclSuccess;
    if (cfg->magic != MACO_NCCL_CONFIG_MAGIC)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: config->magic is %#x, not %#x: initialise the config with "
                               "NCCL_CONFIG_INITIALIZER",
                               what, cfg->magic, MACO_NCCL_CONFIG_MAGIC);
    if (!MACO_NCCL_HAS(cfg, blocking) || cfg->size > (1u << 20))
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: config->size is %zu, outside [%zu, 1 MiB]: initialise the "
                               "config with NCCL_CONFIG_INITIALIZER",
                               what, cfg->size,
                               offsetof(ncclConfig_t, blocking) + sizeof(cfg->blocking));
    if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) {
        if (cfg->blocking != 0 && cfg->blocking != 1)
            return maco_nccl__fail(ncclInvalidArgument, "%s: config->blocking is %d, not 0 or 1",
                                   what, cfg->blocking);
        *blocking_p = cfg->blocking;
    }
    if (MACO_NCCL_HAS(cfg, maxCTAs) && cfg->minCTAs != NCCL_CONFIG_UNDEF_INT &&
        cfg->maxCTAs != NCCL_CONFIG_UNDEF_INT && (cfg->minCTAs < 1 || cfg->maxCTAs < cfg->minCTAs))
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: config->minCTAs %d and maxCTAs %d: need 1 <= minCTAs <= "
                               "maxCTAs",
                               what, cfg->minCTAs, cfg->maxCTAs);
    if (MACO_NCCL_HAS(cfg, splitShare) && cfg->splitShare != NCCL_CONFIG_UNDEF_INT &&
        cfg->splitShare != 0 && cfg->splitShare != 1)
        return maco_nccl__fail(ncclInvalidArgument, "%s: config->splitShare is %d, not 0 or 1",
                               what, cfg->splitShare);
    if (MACO_NCCL_HAS(cfg, commName) && cfg->commName != NULL)
        *name_p = cfg->commName;
    return ncclSuccess;
}

/* ------------------------------------------------------------------ unique id, creation */

ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId)
{
    maco_nccl__env_first_use();
    if (uniqueId == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    const char *addr = getenv("NCCL_COMM_ID");
    if (addr != NULL && addr[0] != '\0') {
        if (maco_nccl__id_from_address(uniqueId, addr) != 0)
            return maco_nccl__fail(ncclInvalidArgument,
                                   "ncclGetUniqueId: NCCL_COMM_ID='%s' is too long for an id",
                                   addr);
        return ncclSuccess;
    }
    maco_unique_id_t id;
    maco_status_t st = maco_unique_id_create(&id);
    if (st != MACO_OK)
        return maco_nccl__fail_maco(st, "ncclGetUniqueId");
    memcpy(uniqueId->internal, id.bytes, sizeof(id.bytes));
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclGetUniqueId)

ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t *config)
{
    static const char what[] = "ncclCommInitRank";
    maco_nccl__env_first_use();
    if (comm == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: comm (the output) is NULL", what);
    if (nranks < 1)
        return maco_nccl__fail(ncclInvalidArgument, "%s: nranks is %d, must be >= 1", what, nranks);
    if (rank < 0 || rank >= nranks)
        return maco_nccl__fail(ncclInvalidArgument, "%s: rank %d is outside [0, nranks %d)", what,
                               rank, nranks);
    int blocking;
    const char *name;
    ncclResult_t res = maco_nccl__config(config, what, &blocking, &name);
    if (res != ncclSuccess)
        return res;
    struct ncclComm *c =
        maco_nccl__comm_alloc(nranks, rank, maco_nccl__current_device(), blocking, name);
    if (c == NULL)
        return maco_nccl__fail(ncclSystemError, "%s: out of host memory", what);
    if (maco_nccl__group_defer_init(c, &commId)) {
        *comm = c;
        return ncclSuccess;
    }
    if (!blocking) {
        res = maco_nccl__comm_join_async(c, &commId);
        if (res == ncclInProgress)
            *comm = c;
        else
            maco_nccl__comm_free(c, 1);
        return res;
    }
    res = maco_nccl__comm_join(c, &commId);
    if (res != ncclSuccess) {
        maco_nccl__comm_free(c, 1);
        return res;
    }
    *comm = c;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommInitRankConfig)

ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return pncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}
MACO_NCCL_ALIAS(ncclCommInitRank)

/*
 * NCCL spreads the bootstrap over nId roots to scale setup; MACO's bootstrap has one root,
 * rank 0, which made commIds[0] (NCCL's rule: id i comes from rank floor(i * nranks / nId)),
 * so the job is joined through commIds[0] and the others are only checked for presence.
 */
ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId *commIds, ncclConfig_t *config)
{
    if (nId < 1 || commIds == NULL)
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclCommInitRankScalable: nId is %d and commIds %p: need at "
                               "least one id",
                               nId, (void *)commIds);
    return pncclCommInitRankConfig(newcomm, nranks, commIds[0], myrank, config);
}
MACO_NCCL_ALIAS(ncclCommInitRankScalable)

ncclResult_t pncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    static const char what[] = "ncclCommInitAll";
    maco_nccl__env_first_use();
    if (comms == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: comms is NULL", what);
    if (ndev < 1)
        return maco_nccl__fail(ncclInvalidArgument, "%s: ndev is %d, must be >= 1", what, ndev);
    int ndevices = 0;
    if (cudaGetDeviceCount(&ndevices) != cudaSuccess) {
        cudaGetLastError();
        ndevices = 0;
    }
    for (int i = 0; i < ndev; i++) {
        int d = devlist != NULL ? devlist[i] : i;
        if (d < 0 || d >= ndevices)
            return maco_nccl__fail(ncclInvalidArgument,
                                   "%s: device %d (devlist[%d]) is outside the %d visible CUDA "
                                   "devices",
                                   what, d, i, ndevices);
    }
    ncclUniqueId id;
    ncclResult_t res = pncclGetUniqueId(&id);
    if (res != ncclSuccess)
        return res;
    struct ncclComm **cs = calloc((size_t)ndev, sizeof(*cs));
    ncclUniqueId *ids = malloc(sizeof(*ids) * (size_t)ndev);
    res = cs != NULL && ids != NULL ? ncclSuccess
                                    : maco_nccl__fail(ncclSystemError, "%s: out of memory", what);
    for (int i = 0; i < ndev && res == ncclSuccess; i++) {
        cs[i] = maco_nccl__comm_alloc(ndev, i, devlist != NULL ? devlist[i] : i, 1, NULL);
        ids[i] = id;
        if (cs[i] == NULL)
            res = maco_nccl__fail(ncclSystemError, "%s: out of host memory", what);
    }
    if (res == ncclSuccess)
        res = maco_nccl__comm_join_all(cs, ids, ndev);
    for (int i = 0; cs != NULL && i < ndev; i++) {
        if (res == ncclSuccess)
            comms[i] = cs[i];
        else if (cs[i] != NULL)
            maco_nccl__comm_free(cs[i], 1);
    }
    free(cs);
    free(ids);
    return res;
}
MACO_NCCL_ALIAS(ncclCommInitAll)

/* ------------------------------------------------------------------ split, shrink */

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                            ncclConfig_t *config)
{
    static const char what[] = "ncclCommSplit";
    if (newcomm == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: newcomm (the output) is NULL", what);
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: color %d is negative (only NCCL_SPLIT_NOCOLOR, -1, may be)",
                               what, color);
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    int blocking = comm->blocking;
    const char *name = NULL;
    if (config != NULL && (res = maco_nccl__config(config, what, &blocking, &name)) != ncclSuccess)
        return res;
    struct ncclComm *child = NULL;
    res = maco_nccl__comm_split(comm, color, key, &child, blocking, name);
    if (res != ncclSuccess && res != ncclInProgress) {
        if (child != NULL)
            maco_nccl__comm_free(child, 1);
        *newcomm = NULL;
        return res;
    }
    *newcomm = child;
    return res;
}
MACO_NCCL_ALIAS(ncclCommSplit)

/*
 * Only the ranks that stay call ncclCommShrink; ranks not excluded keep their order. It is
 * maco_comm_shrink (maco/comm.h): after a rank died the survivors agree on who is gone, so a
 * dead rank need not even be in excludeRanksList, and a death during the shrink costs a round,
 * not a hang. Allowed on a revoked communicator (that is how NCCL_SHRINK_ABORT recovers).
 */
ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                             ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    static const char what[] = "ncclCommShrink";
    if (newcomm == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: newcomm (the output) is NULL", what);
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
        return maco_nccl__fail(ncclInvalidArgument, "%s: shrinkFlags %#x is not a known flag", what,
                               shrinkFlags);
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == NULL))
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: excludeRanksCount %d with excludeRanksList %p", what,
                               excludeRanksCount, (void *)excludeRanksList);
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess &&
        !(maco_nccl__comm_valid(comm) &&
          __atomic_load_n(&comm->state, __ATOMIC_ACQUIRE) == MACO_NCCL_COMM_REVOKED))
        return res;
    res = ncclSuccess;
    for (int i = 0; i < excludeRanksCount; i++) {
        if (excludeRanksList[i] < 0 || excludeRanksList[i] >= comm->nranks)
            return maco_nccl__fail(ncclInvalidArgument,
                                   "%s: excludeRanksList[%d] = %d is outside [0, %d)", what, i,
                                   excludeRanksList[i], comm->nranks);
        if (excludeRanksList[i] == comm->rank)
            return maco_nccl__fail(ncclInvalidArgument,
                                   "%s: this rank (%d) is in excludeRanksList: excluded ranks do "
                                   "not call ncclCommShrink",
                                   what, comm->rank);
    }
    int blocking = comm->blocking;
    const char *name = NULL;
    if (config != NULL && (res = maco_nccl__config(config, what, &blocking, &name)) != ncclSuccess)
        return res;
    struct ncclComm *child = NULL;
    res = maco_nccl__comm_shrink(comm, excludeRanksList, excludeRanksCount,
                                 shrinkFlags == NCCL_SHRINK_ABORT, &child, blocking, name);
    if (res != ncclSuccess && res != ncclInProgress) {
        if (child != NULL)
            maco_nccl__comm_free(child, 1);
        *newcomm = NULL;
        return res;
    }
    *newcomm = child;
    return res;
}
MACO_NCCL_ALIAS(ncclCommShrink)

/* ------------------------------------------------------------------ ending */

/* Waits for the communicator's work on its device (MACO keeps no list of the streams used, so
 * the device is synchronised: every stream of this process on it). */
ncclResult_t pncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t res = maco_nccl__comm_ready(comm, "ncclCommFinalize");
    if (res != ncclSuccess || comm->device < 0)
        return res;
    int cur = maco_nccl__current_device();
    cudaSetDevice(comm->device);
    cudaError_t e = cudaDeviceSynchronize();
    if (cur >= 0)
        cudaSetDevice(cur);
    if (e != cudaSuccess)
        return maco_nccl__fail(ncclUnhandledCudaError,
                               "ncclCommFinalize: cudaDeviceSynchronize: %s",
                               cudaGetErrorString(e));
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommFinalize)

ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    if (!maco_nccl__comm_unlink(comm))
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclCommDestroy: comm %p is not a communicator (destroyed twice?)",
                               (void *)comm);
    if (maco_nccl__group_forget(comm) > 0)
        maco_log_write(
            MACO_LOG_WARN, "coll",
            "ncclCommDestroy: the open group of this thread held calls on the communicator; "
            "they are dropped, and the group's end fails");
    return maco_nccl__comm_free(comm, 0);
}
MACO_NCCL_ALIAS(ncclCommDestroy)

ncclResult_t pncclCommAbort(ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    if (!maco_nccl__comm_unlink(comm))
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclCommAbort: comm %p is not a communicator (destroyed twice?)",
                               (void *)comm);
    if (maco_nccl__group_forget(comm) > 0)
        maco_log_write(
            MACO_LOG_WARN, "coll",
            "ncclCommAbort: the open group of this thread held calls on the communicator; "
            "they are dropped, and the group's end fails");
    return maco_nccl__comm_free(comm, 1);
}
MACO_NCCL_ALIAS(ncclCommAbort)

/* Marks the communicator revoked: later calls on it fail with ncclInvalidUsage; destroy,
 * abort, ncclCommShrink and the queries remain. Kernels in flight that wait on a peer end at
 * their next check of the error word, here and on the peers, which maco_comm_revoke tells
 * through the bootstrap (a peer's ncclCommGetAsyncError then says ncclRemoteError); work that
 * does not wait runs to its end. */
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
        return maco_nccl__fail(ncclInvalidArgument, "ncclCommRevoke: revokeFlags is %#x, not 0",
                               revokeFlags);
    ncclResult_t res = maco_nccl__comm_ready(comm, "ncclCommRevoke");
    if (res != ncclSuccess)
        return res;
    __atomic_store_n(&comm->state, MACO_NCCL_COMM_REVOKED, __ATOMIC_RELEASE);
    maco_status_t st = comm->maco != NULL ? maco_comm_revoke(comm->maco) : MACO_OK;
    return st == MACO_OK ? ncclSuccess : maco_nccl__fail_maco(st, "ncclCommRevoke");
}
MACO_NCCL_ALIAS(ncclCommRevoke)

/* ------------------------------------------------------------------ queries and errors */

/* Holds `comm` for a query (the watchdog pattern: another thread may be destroying it); NULL
 * after naming the call when it is not a live communicator or `out` is NULL. */
static struct ncclComm *maco_nccl__query_hold(ncclComm_t comm, const void *out, const char *what,
                                              const char *out_name)
{
    struct ncclComm *c = out != NULL ? maco_nccl__comm_hold(comm, 0) : NULL;
    if (c == NULL)
        maco_nccl__fail(ncclInvalidArgument, "%s: comm %p or %s %p is not valid", what,
                        (void *)comm, out_name, out);
    return c;
}

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    struct ncclComm *c =
        maco_nccl__query_hold(comm, asyncError, "ncclCommGetAsyncError", "asyncError");
    if (c == NULL)
        return ncclInvalidArgument;
    int state = __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
    if (state == MACO_NCCL_COMM_PENDING) {
        *asyncError = ncclInProgress;
    } else if (state == MACO_NCCL_COMM_FAILED) {
        *asyncError = c->init_result;
    } else if (state == MACO_NCCL_COMM_REVOKED) {
        /* NCCL: ncclInProgress until quiescent, then ncclSuccess. The revoke's own abort is
         * not an error, and the kernels it stopped end at their next look at the word. */
        *asyncError = ncclSuccess;
    } else {
        maco_status_t async = MACO_OK;
        maco_comm_get_async_error(c->maco, &async);
        *asyncError = maco_nccl__result(async);
        if (*asyncError == ncclSuccess)
            *asyncError = (ncclResult_t)__atomic_load_n(&c->peer_error, __ATOMIC_ACQUIRE);
    }
    maco_nccl__comm_unhold(c);
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommGetAsyncError)

ncclResult_t pncclCommCount(const ncclComm_t comm, int *count)
{
    struct ncclComm *c = maco_nccl__query_hold(comm, count, "ncclCommCount", "count");
    if (c == NULL)
        return ncclInvalidArgument;
    *count = c->nranks;
    maco_nccl__comm_unhold(c);
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommCount)

ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device)
{
    struct ncclComm *c = maco_nccl__query_hold(comm, device, "ncclCommCuDevice", "device");
    if (c == NULL)
        return ncclInvalidArgument;
    *device = c->device;
    maco_nccl__comm_unhold(c);
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommCuDevice)

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank)
{
    struct ncclComm *c = maco_nccl__query_hold(comm, rank, "ncclCommUserRank", "rank");
    if (c == NULL)
        return ncclInvalidArgument;
    *rank = c->rank;
    maco_nccl__comm_unhold(c);
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommUserRank)

/* This thread's last error; else the communicator's first one (MACO's message, which names the
 * call, the peer and why); else "". */
const char *pncclGetLastError(ncclComm_t comm)
{
    const char *mine = maco_nccl__last_error();
    if (mine[0] != '\0')
        return mine;
    /* The text belongs to the communicator, as NCCL's does: valid until it is destroyed. */
    struct ncclComm *c = maco_nccl__comm_hold(comm, 0);
    const char *text = c != NULL && c->maco != NULL ? maco_comm_get_last_error(c->maco) : "";
    if (c != NULL)
        maco_nccl__comm_unhold(c);
    return text;
}
MACO_NCCL_ALIAS(ncclGetLastError)

/* ------------------------------------------------------------------ registration */

ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    static const char what[] = "ncclCommRegister";
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    if (buff == NULL || size == 0 || handle == NULL)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: buff %p, size %zu, handle %p: none may be "
                               "NULL or 0",
                               what, buff, size, (void *)handle);
    pthread_mutex_lock(&comm->lock);
    if (comm->nregs == comm->regs_cap) {
        size_t cap = comm->regs_cap == 0 ? 16 : comm->regs_cap * 2;
        maco_mem_t *p = realloc(comm->regs, cap * sizeof(*p));
        if (p == NULL) {
            pthread_mutex_unlock(&comm->lock);
            return maco_nccl__fail(ncclSystemError, "%s: out of host memory", what);
        }
        comm->regs = p;
        comm->regs_cap = cap;
    }
    maco_mem_t mem;
    maco_status_t st = maco_mem_register(comm->maco, buff, size, &mem);
    if (st == MACO_OK)
        comm->regs[comm->nregs++] = mem;
    pthread_mutex_unlock(&comm->lock);
    if (st != MACO_OK)
        return maco_nccl__fail_maco(st, what);
    maco_nccl__count_native(MACO_NCCL_CALL_ncclCommRegister);
    *handle = mem;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommRegister)

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle)
{
    ncclResult_t res = maco_nccl__comm_ready(comm, "ncclCommDeregister");
    if (res != ncclSuccess)
        return res;
    if (handle == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "ncclCommDeregister: handle is NULL");
    /* Only a handle ncclCommRegister returned on this communicator and not deregistered yet. */
    int found = 0;
    pthread_mutex_lock(&comm->lock);
    for (size_t i = 0; i < comm->nregs && !found; i++)
        if (comm->regs[i] == (maco_mem_t)handle) {
            comm->regs[i] = comm->regs[--comm->nregs];
            found = 1;
        }
    pthread_mutex_unlock(&comm->lock);
    if (!found)
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclCommDeregister: handle %p was not returned by "
                               "ncclCommRegister on this communicator, or was deregistered "
                               "already",
                               handle);
    maco_status_t st = maco_mem_deregister((maco_mem_t)handle);
    return st == MACO_OK ? ncclSuccess : maco_nccl__fail_maco(st, "ncclCommDeregister");
}
MACO_NCCL_ALIAS(ncclCommDeregister)

/* A window is a MACO registration (peers map it before their next reduction or gather:
 * group.c's maco_nccl__map_registrations, as any other); MACO needs no symmetric layout, so
 * NCCL_WIN_COLL_SYMMETRIC is accepted and changes nothing, nor do the flags of NCCL's one-sided
 * and GIN/CFT paths, which MACO's library does not have (NCCL_WIN_STRICT_ORDERING,
 * NCCL_WIN_GIN_ONLY, NCCL_WIN_CFT_COUNTED). */
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                     int winFlags)
{
    static const char what[] = "ncclCommWindowRegister";
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    if (buff == NULL || size == 0 || win == NULL)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: buff %p, size %zu, win %p: none may be NULL or 0", what, buff,
                               size, (void *)win);
    if ((winFlags & ~(NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING | NCCL_WIN_GIN_ONLY |
                      NCCL_WIN_CFT_COUNTED)) != 0)
        return maco_nccl__fail(ncclInvalidArgument, "%s: winFlags %#x has unknown bits", what,
                               winFlags);
    struct ncclWindow_vidmem *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return maco_nccl__fail(ncclSystemError, "%s: out of host memory", what);
    maco_status_t st = maco_mem_register(comm->maco, buff, size, &w->mem);
    if (st != MACO_OK) {
        free(w);
        return maco_nccl__fail_maco(st, what);
    }
    w->magic = MACO_NCCL_WINDOW_MAGIC;
    w->comm = comm;
    w->base = buff;
    w->size = size;
    /* Known to the communicator, so that a deregister looks a window up before reading it. */
    pthread_mutex_lock(&comm->lock);
    int listed = 0;
    if (comm->nwins == comm->wins_cap) {
        size_t cap = comm->wins_cap == 0 ? 16 : comm->wins_cap * 2;
        struct ncclWindow_vidmem **p = realloc(comm->wins, cap * sizeof(*p));
        if (p != NULL) {
            comm->wins = p;
            comm->wins_cap = cap;
        }
    }
    if (comm->nwins < comm->wins_cap) {
        comm->wins[comm->nwins++] = w;
        listed = 1;
    }
    pthread_mutex_unlock(&comm->lock);
    if (!listed) {
        maco_mem_deregister(w->mem);
        free(w);
        return maco_nccl__fail(ncclSystemError, "%s: out of host memory", what);
    }
    maco_nccl__count_native(MACO_NCCL_CALL_ncclCommRegister);
    *win = w;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommWindowRegister)

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    ncclResult_t res = maco_nccl__comm_ready(comm, "ncclCommWindowDeregister");
    if (res != ncclSuccess)
        return res;
    /* Looked up among the communicator's windows before anything reads it: a freed, foreign
     * or made-up window, or one deregistered already, is refused unread. */
    int found = 0;
    pthread_mutex_lock(&comm->lock);
    for (size_t i = 0; i < comm->nwins && !found; i++)
        if (comm->wins[i] == win) {
            comm->wins[i] = comm->wins[--comm->nwins];
            found = 1;
        }
    pthread_mutex_unlock(&comm->lock);
    if (!found)
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclCommWindowDeregister: win %p is not a window of this "
                               "communicator (deregistered already, or never registered here)",
                               (void *)win);
    maco_status_t st = maco_mem_deregister(win->mem);
    win->magic = 0;
    free(win);
    return st == MACO_OK ? ncclSuccess : maco_nccl__fail_maco(st, "ncclCommWindowDeregister");
}
MACO_NCCL_ALIAS(ncclCommWindowDeregister)

/* ------------------------------------------------------------------ ncclMemAlloc */

/*
 * ncclMemAlloc has no communicator: maco_mem_alloc_device makes what maco_mem_alloc makes
 * (cuMem device memory on the current device, exportable as a POSIX file descriptor, which
 * maco_mem_register, behind ncclCommRegister, shares with local peers by that descriptor),
 * without one. On a device without VMM support it is cudaMalloc memory (which registers too,
 * by legacy CUDA IPC), as NCCL's own ncclMemAlloc does; ncclMemFree tells the two apart by
 * the device the pointer lives on.
 */
static int maco_nccl__device_has_vmm(int dev)
{
    /* The runtime has no such attribute: the driver's, through the runtime's entry points. */
    CUresult (*get)(int *, CUdevice_attribute, CUdevice) = NULL;
    enum cudaDriverEntryPointQueryResult q;
    int vmm = 0;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", (void **)&get, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || get == NULL ||
        get(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) != CUDA_SUCCESS) {
        cudaGetLastError();
        return 0;
    }
    return vmm;
}

ncclResult_t pncclMemAlloc(void **ptr, size_t size)
{
    if (ptr == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    if (size == 0) {
        *ptr = NULL;
        return ncclSuccess;
    }
    int dev = maco_nccl__current_device();
    if (dev < 0)
        return maco_nccl__fail(ncclUnhandledCudaError, "ncclMemAlloc: no usable CUDA device");
    void *p = NULL;
    if (maco_nccl__device_has_vmm(dev)) {
        maco_status_t st = maco_mem_alloc_device(dev, size, &p);
        if (st != MACO_OK)
            return maco_nccl__fail_maco(st, "ncclMemAlloc");
    } else {
        cudaError_t e = cudaMalloc(&p, size);
        if (e != cudaSuccess)
            return maco_nccl__fail(ncclUnhandledCudaError,
                                   "ncclMemAlloc: %zu bytes on device %d: %s", size, dev,
                                   cudaGetErrorString(e));
    }
    maco_nccl__count_native(MACO_NCCL_CALL_ncclMemAlloc);
    *ptr = p;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclMemAlloc)

ncclResult_t pncclMemFree(void *ptr)
{
    if (ptr == NULL)
        return ncclSuccess;
    struct cudaPointerAttributes attr;
    memset(&attr, 0, sizeof(attr));
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
        cudaGetLastError();
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclMemFree: %p is not device memory from ncclMemAlloc", ptr);
    }
    if (maco_nccl__device_has_vmm(attr.device)) {
        maco_status_t st = maco_mem_free(NULL, ptr);
        return st == MACO_OK ? ncclSuccess : maco_nccl__fail_maco(st, "ncclMemFree");
    }
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess)
        return maco_nccl__fail(ncclInvalidArgument, "ncclMemFree: %p: %s", ptr,
                               cudaGetErrorString(e));
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclMemFree)
