/*
 * fallback.c - the real NCCL, for what MACO cannot run (shim.h; docs/nccl.md).
 *
 * The library named by MACO_NCCL_LIBRARY is loaded by MACO's one loader,
 * maco_nccl_library_symbol (maco/nccl_bootstrap.h, src/host/comm/comm_nccl.c), once per
 * process, never this library itself: when MACO's libnccl.so.2 is first in the search path
 * (LD_LIBRARY_PATH, LD_PRELOAD), dlopen("libnccl.so.2") returns this very library, which
 * would forward to itself forever; the loader recognises it by the marker symbol below and
 * refuses it with a message asking for the real NCCL's path. It opens the library with
 * RTLD_LOCAL so its symbols never replace this library's, and with RTLD_DEEPBIND so that its
 * own calls between its public functions (ncclBcast calling ncclBroadcast) stay inside it
 * instead of coming back here (not under AddressSanitizer, which refuses RTLD_DEEPBIND).
 *
 * A real communicator is created next to a MACO one when a call first needs it (or at
 * creation, for communicators that span nodes: comm_core.c): rank 0 gets a real unique id and
 * sends it over the MACO communicator's bootstrap, then every rank calls the real
 * ncclCommInitRank. So the first forwarded call must be made by every rank of the
 * communicator, which holds for collectives; send/recv groups that leave a rank out meet
 * their real communicator already made at creation (the multi-node case).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "maco_nccl.h"
#include "shim.h"

/* Present only in this library: how the loader recognises itself in another handle. */
__attribute__((visibility("default"))) const char maco_nccl_marker[] = "MACO libnccl.so.2";

static pthread_once_t maco_nccl__real_once = PTHREAD_ONCE_INIT;
static ncclResult_t maco_nccl__real_result = ncclSuccess;
static char maco_nccl__real_why[512];
static maco_nccl__real_t maco_nccl__real_fns;

/* The real NCCL's entry points: each exported name and the slot it fills. */
static const struct {
    const char *name;
    void **slot;
} maco_nccl__real_syms[] = {
#define MACO_NCCL__SYM(field)                                                                      \
    {                                                                                              \
        "nccl" #field, (void **)&maco_nccl__real_fns.field                                         \
    }
    MACO_NCCL__SYM(GetUniqueId), MACO_NCCL__SYM(CommInitRank),  MACO_NCCL__SYM(CommDestroy),
    MACO_NCCL__SYM(CommAbort),   MACO_NCCL__SYM(GroupStart),    MACO_NCCL__SYM(GroupEnd),
    MACO_NCCL__SYM(AllReduce),   MACO_NCCL__SYM(Broadcast),     MACO_NCCL__SYM(Reduce),
    MACO_NCCL__SYM(AllGather),   MACO_NCCL__SYM(ReduceScatter), MACO_NCCL__SYM(AlltoAll),
    MACO_NCCL__SYM(Gather),      MACO_NCCL__SYM(Scatter),       MACO_NCCL__SYM(Send),
    MACO_NCCL__SYM(Recv),        MACO_NCCL__SYM(GetLastError),
#undef MACO_NCCL__SYM
};

static void maco_nccl__real_load(void)
{
    int mode = maco_nccl__fallback_mode();
    if (mode != 1) {
        maco_nccl__real_result = ncclInvalidUsage;
        snprintf(maco_nccl__real_why, sizeof(maco_nccl__real_why),
                 mode == 0 ? "MACO_NCCL_FALLBACK=never: calls MACO cannot run are not forwarded "
                             "to NCCL"
                           : "MACO_NCCL_FALLBACK is invalid (accepts auto or never)");
        return;
    }
    for (size_t i = 0; i < sizeof(maco_nccl__real_syms) / sizeof(maco_nccl__real_syms[0]); i++) {
        maco_status_t st =
            maco_nccl_library_symbol(maco_nccl__real_syms[i].name, maco_nccl__real_syms[i].slot,
                                     maco_nccl__real_why, sizeof(maco_nccl__real_why));
        if (st != MACO_OK) {
            /* MACO's own library is a usage error; a missing one a system error, as NCCL's
             * own loaders say. */
            maco_nccl__real_result =
                st == MACO_ERR_INVALID_USAGE ? ncclInvalidUsage : ncclSystemError;
            return;
        }
    }
    maco_log_write(MACO_LOG_INFO, "init",
                   "nccl: the real NCCL's entry points resolved for fallback");
}

ncclResult_t maco_nccl__fallback_open(char *why, size_t cap)
{
    pthread_once(&maco_nccl__real_once, maco_nccl__real_load);
    if (maco_nccl__real_result != ncclSuccess && why != NULL && cap > 0)
        snprintf(why, cap, "%s", maco_nccl__real_why);
    return maco_nccl__real_result;
}

const maco_nccl__real_t *maco_nccl__real(void)
{
    return &maco_nccl__real_fns;
}

int maco_nccl_fallback_check(char *why, size_t cap)
{
    return maco_nccl__fallback_open(why, cap) == ncclSuccess ? 0 : -1;
}

void *maco_nccl__fallback_comm(struct ncclComm *comm)
{
    char why[512];
    pthread_mutex_lock(&comm->lock);
    if (comm->real != NULL || comm->real_tried) {
        void *real = comm->real;
        pthread_mutex_unlock(&comm->lock);
        if (real == NULL)
            maco_nccl__fail(comm->real_result, "no NCCL communicator to forward to (see above)");
        return real;
    }
    comm->real_tried = 1;
    ncclResult_t res = maco_nccl__fallback_open(why, sizeof(why));
    if (res != ncclSuccess) {
        comm->real_result = res;
        pthread_mutex_unlock(&comm->lock);
        maco_nccl__fail(res, "%s", why);
        return NULL;
    }
    const maco_nccl__real_t *r = &maco_nccl__real_fns;
    /* NCCL_COMM_ID names the address MACO's own bootstrap listens on (comm_core.c); the real
     * NCCL would try to listen there too, so it does not see the variable while it makes its
     * id and joins (its own unique id carries its address instead). */
    static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&env_lock);
    char *comm_id = getenv("NCCL_COMM_ID") != NULL ? strdup(getenv("NCCL_COMM_ID")) : NULL;
    if (comm_id != NULL)
        unsetenv("NCCL_COMM_ID");
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    res = comm->rank == 0 ? r->GetUniqueId(&id) : ncclSuccess;
    /* Every rank takes part in the broadcast, so a failure on rank 0 reaches all of them. */
    int ok = res == ncclSuccess;
    maco_status_t st = maco_bootstrap_broadcast(comm->bs, 0, &ok, sizeof(ok));
    if (st == MACO_OK && ok)
        st = maco_bootstrap_broadcast(comm->bs, 0, &id, sizeof(id));
    void *real = NULL;
    if (st != MACO_OK) {
        maco_nccl__comm_note(comm, st);
        res = maco_nccl__fail_maco(st, "creating the NCCL communicator for fallback");
    } else if (!ok) {
        res = maco_nccl__fail(res == ncclSuccess ? ncclRemoteError : res,
                              "the real NCCL's ncclGetUniqueId failed on rank 0");
    } else {
        /* NCCL takes the communicator's device from the current one; the caller's device is
         * current again afterwards. */
        int cur = -1;
        if (cudaGetDevice(&cur) != cudaSuccess)
            cudaGetLastError();
        if (comm->device >= 0)
            cudaSetDevice(comm->device);
        res = r->CommInitRank(&real, comm->nranks, id, comm->rank);
        if (comm->device >= 0 && cur >= 0 && cur != comm->device)
            cudaSetDevice(cur);
        if (res != ncclSuccess) {
            real = NULL;
            maco_nccl__fail(res, "the real NCCL's ncclCommInitRank failed (rank %d of %d): %s",
                            comm->rank, comm->nranks, r->GetLastError(NULL));
        } else {
            maco_log_write(MACO_LOG_INFO, "init",
                           "nccl: rank %d of %d: NCCL communicator created for fallback",
                           comm->rank, comm->nranks);
        }
    }
    if (comm_id != NULL)
        setenv("NCCL_COMM_ID", comm_id, 1);
    free(comm_id);
    pthread_mutex_unlock(&env_lock);
    comm->real = real;
    comm->real_result = res;
    pthread_mutex_unlock(&comm->lock);
    return real;
}

void maco_nccl__fallback_free(struct ncclComm *comm, int abort)
{
    if (comm->real == NULL)
        return;
    if (abort)
        maco_nccl__real_fns.CommAbort(comm->real);
    else
        maco_nccl__real_fns.CommDestroy(comm->real);
    comm->real = NULL;
}
