/*
 * comm_229.c - the communicator calls of NCCL 2.29: ncclCommGetUniqueId and ncclCommGrow
 * (maco_comm_get_grow_id, maco_comm_grow, maco_comm_join: maco/comm.h), ncclCommSuspend,
 * ncclCommResume, ncclCommMemStats and ncclWinGetUserPtr (shim.h; docs/nccl.md says what each
 * does here).
 *
 * NCCL's grow root may be any rank of the communicator: it makes the id, which carries its own
 * bootstrap root. MACO's bootstrap is rooted at rank 0 of the grown communicator, which is
 * rank 0 of the existing one, and the id carries rank 0's listening address, so only rank 0 can
 * make it: ncclCommGetUniqueId on another rank is refused (ncclInvalidUsage, saying so).
 *
 * MACO keeps no memory that it could release and rebuild, so this library answers as NCCL does
 * with its memory manager disabled: ncclCommSuspend(NCCL_SUSPEND_MEM) is refused, a suspend
 * without flags has nothing to do, and the memory statistics say that nothing can be released.
 */
#include <stdio.h>
#include <string.h>

#include "shim.h"

ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId)
{
    static const char what[] = "ncclCommGetUniqueId";
    if (uniqueId == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: uniqueId (the output) is NULL", what);
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    if (comm->maco == NULL)
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: the communicator is made at the end of this thread's open "
                               "group; end the group first",
                               what);
    if (comm->rank != 0)
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: rank %d called it; with MACO only rank 0 makes the grow id "
                               "(MACO's bootstrap is rooted at rank 0, which stays rank 0 of the "
                               "grown communicator): call it on rank 0 and pass the id there",
                               what, comm->rank);
    pthread_mutex_lock(&comm->lock);
    if (comm->grow_id_out) {
        pthread_mutex_unlock(&comm->lock);
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: the id made by the previous call has not been used by "
                               "ncclCommGrow yet (one id at a time, as in NCCL)",
                               what);
    }
    maco_unique_id_t id;
    maco_status_t st = maco_comm_get_grow_id(comm->maco, &id);
    if (st == MACO_OK)
        comm->grow_id_out = 1;
    pthread_mutex_unlock(&comm->lock);
    if (st != MACO_OK)
        return maco_nccl__fail_maco(st, what);
    _Static_assert(sizeof(uniqueId->internal) == sizeof(id.bytes), "the ids are the same size");
    memcpy(uniqueId->internal, id.bytes, sizeof(id.bytes));
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommGetUniqueId)

/* The NCCL communicator of `mc`, made by a grow or a join (which owns its bootstrap, as a
 * shrink's does: maco_nccl__comm_shrink). Destroys `mc` when out of memory. */
static ncclResult_t maco_nccl__grown(maco_comm_t mc, int blocking, const char *name,
                                     ncclComm_t *newcomm)
{
    int rank = 0, nranks = 0, dev = -1;
    maco_comm_get_rank(mc, &rank);
    maco_comm_get_nranks(mc, &nranks);
    maco_comm_get_cuda_device(mc, &dev);
    struct ncclComm *c = maco_nccl__comm_alloc(nranks, rank, dev, blocking, name);
    if (c == NULL) {
        maco_comm_destroy(mc);
        return maco_nccl__fail(ncclSystemError, "ncclCommGrow: out of host memory");
    }
    maco_comm_get_bootstrap(mc, &c->bs);
    c->bs_of_maco = 1;
    c->maco = mc;
    c->init_result = ncclSuccess;
    c->forward_kinds = maco_nccl__forward_setting();
    __atomic_store_n(&c->state, MACO_NCCL_COMM_READY, __ATOMIC_RELEASE);
    maco_nccl__count_native(MACO_NCCL_CALL_ncclCommGrow);
    *newcomm = c;
    return ncclSuccess;
}

/* A new rank's side: comm NULL, the id from the root, its rank in the grown communicator. */
static ncclResult_t maco_nccl__grow_join(int nranks, const ncclUniqueId *id, int rank,
                                         ncclComm_t *newcomm, ncclConfig_t *config)
{
    static const char what[] = "ncclCommGrow";
    maco_nccl__env_first_use();
    if (id == NULL)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: comm is NULL (a new rank) and uniqueId is NULL: a new rank "
                               "passes the id of ncclCommGetUniqueId",
                               what);
    if (rank < 0 || rank >= nranks)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: a new rank's rank %d is outside [0, nRanks %d)", what, rank,
                               nranks);
    int blocking;
    const char *name;
    ncclResult_t res = maco_nccl__config(config, what, &blocking, &name);
    if (res != ncclSuccess)
        return res;
    /* NCCL's choice: the calling thread's device (none without a GPU). */
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        dev = -1;
    }
    maco_comm_t mc = NULL;
    maco_status_t st =
        maco_comm_join((const maco_unique_id_t *)(const void *)id, rank, nranks, dev, &mc);
    if (st != MACO_OK)
        return maco_nccl__fail_maco(st, what);
    return maco_nccl__grown(mc, blocking, name, newcomm);
}

/*
 * Every existing rank calls it with rank -1, rank 0 with the id it made (the others NULL), and
 * the new ranks with comm NULL, the id and their rank (from the old size up). The grown
 * communicator is a new one; `comm` stays usable. Blocking whatever the config says (the
 * result is ready when it returns), bounded by MACO_BOOTSTRAP_TIMEOUT (a new rank that never
 * joins is waited for until then).
 */
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                           ncclComm_t *newcomm, ncclConfig_t *config)
{
    static const char what[] = "ncclCommGrow";
    if (newcomm == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: newcomm (the output) is NULL", what);
    *newcomm = NULL;
    if (nRanks < 1)
        return maco_nccl__fail(ncclInvalidArgument, "%s: nRanks is %d, must be >= 1", what, nRanks);
    if (comm == NULL)
        return maco_nccl__grow_join(nRanks, uniqueId, rank, newcomm, config);
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    if (comm->maco == NULL)
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: the communicator is made at the end of this thread's open "
                               "group; end the group first",
                               what);
    if (rank != -1)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: rank is %d; existing ranks pass -1 (they keep their rank)",
                               what, rank);
    if (nRanks <= comm->nranks)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: nRanks %d is not above the communicator's %d ranks", what,
                               nRanks, comm->nranks);
    if ((comm->rank == 0) != (uniqueId != NULL))
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: rank %d passed %s uniqueId; with MACO rank 0 is the grow "
                               "root: it passes the id of ncclCommGetUniqueId, the other "
                               "existing ranks NULL",
                               what, comm->rank, uniqueId != NULL ? "a" : "no");
    int blocking = comm->blocking;
    const char *name = NULL;
    if (config != NULL && (res = maco_nccl__config(config, what, &blocking, &name)) != ncclSuccess)
        return res;
    if (comm->rank == 0) {
        /* The id serves one grow: used now, whatever comes of it. */
        pthread_mutex_lock(&comm->lock);
        int out = comm->grow_id_out;
        comm->grow_id_out = 0;
        pthread_mutex_unlock(&comm->lock);
        if (!out)
            return maco_nccl__fail(ncclInvalidUsage,
                                   "%s: no id of ncclCommGetUniqueId on this communicator is "
                                   "waiting for a grow (each id serves one grow)",
                                   what);
    }
    maco_comm_t mc = NULL;
    maco_status_t st =
        maco_comm_grow(comm->maco, nRanks, (const maco_unique_id_t *)(const void *)uniqueId, &mc);
    /* Not noted as the communicator's peer failure: a new rank that never joined is no fault
     * of `comm`, which stays usable (a dead existing rank shows at its next call). */
    if (st != MACO_OK)
        return maco_nccl__fail_maco(st, what);
    return maco_nccl__grown(mc, blocking, name, newcomm);
}
MACO_NCCL_ALIAS(ncclCommGrow)

/* ------------------------------------------------------------------ suspend, resume, memory */

ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags)
{
    static const char what[] = "ncclCommSuspend";
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    if ((flags & ~NCCL_SUSPEND_MEM) != 0)
        return maco_nccl__fail(ncclInvalidArgument, "%s: flags %#x has unknown bits", what, flags);
    if (flags & NCCL_SUSPEND_MEM)
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: NCCL_SUSPEND_MEM: MACO cannot release a communicator's "
                               "device memory and rebuild it (as NCCL with its memory manager "
                               "disabled); the memory stays, and the communicator stays usable",
                               what);
    return ncclSuccess; /* nothing else is suspended, as in NCCL */
}
MACO_NCCL_ALIAS(ncclCommSuspend)

/* Nothing can have been suspended (above), so there is nothing to resume. */
ncclResult_t pncclCommResume(ncclComm_t comm)
{
    return maco_nccl__comm_ready(comm, "ncclCommResume");
}
MACO_NCCL_ALIAS(ncclCommResume)

ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value)
{
    static const char what[] = "ncclCommMemStats";
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    if (value == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: value (the output) is NULL", what);
    switch (stat) {
    case ncclStatGpuMemSuspend: /* bytes a suspend would release: none */
    case ncclStatGpuMemSuspended:
        *value = 0;
        return ncclSuccess;
    case ncclStatGpuMemPersist:
    case ncclStatGpuMemTotal:
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: stat %d: MACO does not count the device memory a "
                               "communicator holds (ncclStatGpuMemSuspend and "
                               "ncclStatGpuMemSuspended are answered: 0)",
                               what, (int)stat);
    }
    return maco_nccl__fail(ncclInvalidArgument, "%s: stat %d is not an ncclCommMemStat_t (0..3)",
                           what, (int)stat);
}
MACO_NCCL_ALIAS(ncclCommMemStats)

/* ------------------------------------------------------------------ windows */

/* The buffer the window was registered with. */
ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr)
{
    ncclResult_t res = maco_nccl__comm_ready(comm, "ncclWinGetUserPtr");
    if (res != ncclSuccess)
        return res;
    if (outUserPtr == NULL || win == NULL || win->magic != MACO_NCCL_WINDOW_MAGIC ||
        win->comm != comm)
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclWinGetUserPtr: win %p is not a window of this communicator, "
                               "or outUserPtr %p is NULL",
                               (void *)win, (void *)outUserPtr);
    *outUserPtr = win->base;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclWinGetUserPtr)
