/*
 * comm_nccl.c - the real NCCL library, loaded at run time, and a communicator made over the
 * ranks of one of its communicators (maco/nccl_bootstrap.h).
 *
 * NCCL is never linked: its functions are called through pointers from dlsym, with the
 * prototypes of NCCL 2.x's nccl.h written out below (the enums' values are NCCL's ABI), so
 * the library builds without nccl.h. The NCCL-compatible library (nccl/fallback.c) finds
 * the real NCCL through maco_nccl_library_symbol too, so there is one loader and one
 * "never MACO's own libnccl.so.2" check.
 */
#include "maco/nccl_bootstrap.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "maco/bootstrap.h"
#include "src/host/comm/comm_internal.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"
#include "src/host/os/socket.h"

/* ------------------------------------------------------------------ the library */

#if defined(__SANITIZE_ADDRESS__)
#define MACO_NCCL_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MACO_NCCL_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL)
#endif
#endif
#ifndef MACO_NCCL_DLOPEN_FLAGS
/* RTLD_DEEPBIND: NCCL's calls between its own public functions (ncclBcast calling
 * ncclBroadcast) stay inside it, even when MACO's libnccl.so.2 is loaded too. */
#define MACO_NCCL_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)
#endif

static pthread_once_t maco__nccl_once = PTHREAD_ONCE_INIT;
static void *maco__nccl_handle;
static maco_status_t maco__nccl_load_status = MACO_OK;
static char maco__nccl_path[256];
static char maco__nccl_why[512];

static void maco__nccl_load(void)
{
    const char *want = maco__config_string(MACO_CFG_NCCL_LIBRARY);
    if (strlen(want) >= sizeof(maco__nccl_path)) { /* never open a cut path */
        maco__nccl_load_status = MACO_ERR_INVALID_ARGUMENT;
        snprintf(maco__nccl_why, sizeof(maco__nccl_why),
                 "MACO_NCCL_LIBRARY is %zu characters long; at most %zu are taken", strlen(want),
                 sizeof(maco__nccl_path) - 1);
        return;
    }
    snprintf(maco__nccl_path, sizeof(maco__nccl_path), "%s", want);
    void *h = dlopen(maco__nccl_path, MACO_NCCL_DLOPEN_FLAGS);
    if (h == NULL) {
        maco__nccl_load_status = MACO_ERR_UNSUPPORTED;
        snprintf(maco__nccl_why, sizeof(maco__nccl_why),
                 "cannot load the real NCCL from MACO_NCCL_LIBRARY='%s': %s", maco__nccl_path,
                 dlerror());
        return;
    }
    /* MACO's libnccl.so.2 (nccl/fallback.c) defines this symbol; NCCL does not. */
    if (dlsym(h, "maco_nccl_marker") != NULL) {
        dlclose(h);
        maco__nccl_load_status = MACO_ERR_INVALID_USAGE;
        snprintf(maco__nccl_why, sizeof(maco__nccl_why),
                 "MACO_NCCL_LIBRARY='%s' is MACO's own NCCL library, which never forwards to "
                 "itself: set MACO_NCCL_LIBRARY to the real NCCL's full path",
                 maco__nccl_path);
        return;
    }
    maco__nccl_handle = h;
    MACO_INFO(MACO_SUBSYS_INIT, "loaded the real NCCL from %s", maco__nccl_path);
}

maco_status_t maco_nccl_library_symbol(const char *name, void **sym_p, char *why, size_t why_bytes)
{
    char dummy[1];
    if (why == NULL || why_bytes == 0) {
        why = dummy;
        why_bytes = sizeof(dummy);
    }
    if (name == NULL || sym_p == NULL) {
        snprintf(why, why_bytes, "maco_nccl_library_symbol: %s is NULL",
                 name == NULL ? "name" : "sym_p");
        return MACO_ERR_INVALID_ARGUMENT;
    }
    pthread_once(&maco__nccl_once, maco__nccl_load);
    if (maco__nccl_handle == NULL) {
        snprintf(why, why_bytes, "%s", maco__nccl_why);
        return maco__nccl_load_status;
    }
    void *sym = dlsym(maco__nccl_handle, name);
    if (sym == NULL) {
        snprintf(why, why_bytes, "the NCCL at MACO_NCCL_LIBRARY='%s' has no %s (an older NCCL?)",
                 maco__nccl_path, name);
        return MACO_ERR_UNSUPPORTED;
    }
    *sym_p = sym;
    return MACO_OK;
}

/* ------------------------------------------------------------------ NCCL's ABI */

/* ncclResult_t and ncclDataType_t values of nccl.h (NCCL 2.x). */
enum {
    MACO_NCCL_SUCCESS = 0,
    MACO_NCCL_UNHANDLED_CUDA_ERROR = 1,
    MACO_NCCL_SYSTEM_ERROR = 2,
    MACO_NCCL_INTERNAL_ERROR = 3,
    MACO_NCCL_INVALID_ARGUMENT = 4,
    MACO_NCCL_INVALID_USAGE = 5,
    MACO_NCCL_REMOTE_ERROR = 6,
    MACO_NCCL_IN_PROGRESS = 7,
    MACO_NCCL_UINT8 = 1,
};

typedef struct maco__nccl_fns {
    int (*CommCount)(struct ncclComm *, int *);
    int (*CommUserRank)(struct ncclComm *, int *);
    int (*CommCuDevice)(struct ncclComm *, int *);
    int (*CommGetAsyncError)(struct ncclComm *, int *);
    int (*Broadcast)(const void *, void *, size_t, int, int, struct ncclComm *, cudaStream_t);
    const char *(*GetErrorString)(int);
} maco__nccl_fns_t;

static maco_status_t maco__nccl_fns_get(maco__nccl_fns_t *f)
{
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        { "ncclCommCount", (void **)&f->CommCount },
        { "ncclCommUserRank", (void **)&f->CommUserRank },
        { "ncclCommCuDevice", (void **)&f->CommCuDevice },
        { "ncclCommGetAsyncError", (void **)&f->CommGetAsyncError },
        { "ncclBroadcast", (void **)&f->Broadcast },
        { "ncclGetErrorString", (void **)&f->GetErrorString },
    };
    char why[512];
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        maco_status_t st = maco_nccl_library_symbol(syms[i].name, syms[i].slot, why, sizeof(why));
        if (st != MACO_OK)
            return maco__error(st, MACO_SUBSYS_INIT, "maco_comm_create_from_nccl: %s", why);
    }
    return MACO_OK;
}

/* An NCCL result as a MACO status, logged with what failed and NCCL's text. */
static maco_status_t maco__nccl_fail(const maco__nccl_fns_t *f, int res, const char *what)
{
    maco_status_t st;
    switch (res) {
    case MACO_NCCL_UNHANDLED_CUDA_ERROR:
        st = MACO_ERR_CUDA;
        break;
    case MACO_NCCL_SYSTEM_ERROR:
        st = MACO_ERR_SYSTEM;
        break;
    case MACO_NCCL_INVALID_ARGUMENT:
        st = MACO_ERR_INVALID_ARGUMENT;
        break;
    case MACO_NCCL_INVALID_USAGE:
    case MACO_NCCL_IN_PROGRESS:
        st = MACO_ERR_INVALID_USAGE;
        break;
    case MACO_NCCL_REMOTE_ERROR:
        st = MACO_ERR_REMOTE;
        break;
    default:
        st = MACO_ERR_INTERNAL;
        break;
    }
    return maco__error(st, MACO_SUBSYS_INIT, "maco_comm_create_from_nccl: %s failed: %s (%d)%s",
                       what, f->GetErrorString(res), res,
                       res == MACO_NCCL_IN_PROGRESS
                           ? ": the NCCL communicator's non-blocking creation has not finished"
                           : "");
}

/* ------------------------------------------------------------------ the communicator */

/* What rank 0 broadcasts: whether it made an id, then the id (132 bytes in all). */
typedef struct maco__nccl_setup {
    uint32_t ok;
    maco_unique_id_t id;
} maco__nccl_setup_t;

/* Waits for the broadcast on `stream`, bounded by MACO_BOOTSTRAP_TIMEOUT; NCCL's own errors
 * end the wait early. */
static maco_status_t maco__nccl_wait(const maco__nccl_fns_t *f, struct ncclComm *nc,
                                     cudaStream_t stream, int rank)
{
    int64_t timeout_ms = 0;
    maco_status_t st = maco__config_int64(MACO_CFG_BOOTSTRAP_TIMEOUT, &timeout_ms);
    if (st != MACO_OK)
        return st;
    int64_t deadline = maco__deadline_ms(timeout_ms);
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess)
            return MACO_OK;
        if (e != cudaErrorNotReady)
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_INIT,
                               "maco_comm_create_from_nccl: rank %d: the NCCL broadcast of the "
                               "unique id failed: %s (%s)",
                               rank, cudaGetErrorName(e), cudaGetErrorString(e));
        int async = MACO_NCCL_SUCCESS;
        int res = f->CommGetAsyncError(nc, &async);
        if (res != MACO_NCCL_SUCCESS)
            return maco__nccl_fail(f, res, "ncclCommGetAsyncError");
        if (async != MACO_NCCL_SUCCESS && async != MACO_NCCL_IN_PROGRESS)
            return maco__nccl_fail(f, async, "the NCCL broadcast of the unique id");
        if (maco__now_ms() >= deadline)
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_INIT,
                               "maco_comm_create_from_nccl: rank %d: the NCCL broadcast of the "
                               "unique id did not finish in %lld ms (MACO_BOOTSTRAP_TIMEOUT): "
                               "a rank did not call, or is gone",
                               rank, (long long)timeout_ms);
        struct timespec ts = { 0, 100 * 1000 };
        nanosleep(&ts, NULL);
    }
}

maco_status_t maco_comm_create_from_nccl(struct ncclComm *nccl_comm, maco_comm_t *comm_p)
{
    if (nccl_comm == NULL || comm_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_create_from_nccl: %s is NULL",
                           nccl_comm == NULL ? "nccl_comm" : "comm_p");
    maco__nccl_fns_t f;
    maco_status_t st = maco__nccl_fns_get(&f);
    if (st != MACO_OK)
        return st;
    int nranks = 0, rank = -1, device = -1;
    int res = f.CommCount(nccl_comm, &nranks);
    if (res == MACO_NCCL_SUCCESS)
        res = f.CommUserRank(nccl_comm, &rank);
    if (res == MACO_NCCL_SUCCESS)
        res = f.CommCuDevice(nccl_comm, &device);
    if (res != MACO_NCCL_SUCCESS)
        return maco__nccl_fail(&f, res, "querying the NCCL communicator (count, rank, device)");

    /* The id travels in device memory (NCCL moves nothing else), on a stream of our own. */
    maco__nccl_setup_t setup;
    memset(&setup, 0, sizeof(setup));
    maco_status_t made = MACO_OK;
    if (rank == 0) {
        made = maco_unique_id_create(&setup.id);
        setup.ok = made == MACO_OK;
    }
    void *dbuf = NULL;
    cudaStream_t stream = NULL;
    MACO_CUDA_GOTO(cudaSetDevice(device), st, fail);
    MACO_CUDA_GOTO(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), st, fail);
    /* Stream-ordered allocation, copies and free on the call's own stream: none of them waits
     * for other work on the device (a plain cudaMemcpy or cudaFree could wait behind an
     * application kernel that never ends); the one wait for NCCL is maco__nccl_wait's. */
    MACO_CUDA_GOTO(cudaMallocAsync(&dbuf, sizeof(setup), stream), st, fail);
    MACO_CUDA_GOTO(cudaMemcpyAsync(dbuf, &setup, sizeof(setup), cudaMemcpyHostToDevice, stream), st,
                   fail);
    res = f.Broadcast(dbuf, dbuf, sizeof(setup), MACO_NCCL_UINT8, 0, nccl_comm, stream);
    if (res != MACO_NCCL_SUCCESS) {
        st = maco__nccl_fail(&f, res, "ncclBroadcast of the unique id");
        goto fail;
    }
    st = maco__nccl_wait(&f, nccl_comm, stream, rank);
    if (st != MACO_OK) {
        /* NCCL's kernel may still read or write the buffer: both stay allocated. */
        return st;
    }
    /* The broadcast is done (maco__nccl_wait): this copy waits for nothing else. */
    MACO_CUDA_GOTO(cudaMemcpyAsync(&setup, dbuf, sizeof(setup), cudaMemcpyDeviceToHost, stream), st,
                   fail);
    MACO_CUDA_GOTO(cudaStreamSynchronize(stream), st, fail);
    cudaFreeAsync(dbuf, stream);
    cudaStreamDestroy(stream);
    dbuf = NULL;
    stream = NULL;
    if (made != MACO_OK)
        return made;
    if (!setup.ok)
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_INIT,
                           "maco_comm_create_from_nccl: rank %d: rank 0 could not make a unique "
                           "id (its log says why)",
                           rank);

    maco_bootstrap_t bs;
    st = maco_bootstrap_create(&setup.id, rank, nranks, -1, &bs);
    if (st != MACO_OK)
        return st;
    maco_comm_t comm;
    st = maco_comm_create(bs, device, &comm);
    if (st != MACO_OK) {
        maco_bootstrap_destroy(bs);
        return st;
    }
    comm->owns_bootstrap = 1;
    MACO_INFO(MACO_SUBSYS_INIT, "rank %d of %d: communicator made over an NCCL communicator", rank,
              nranks);
    *comm_p = comm;
    return MACO_OK;
fail:
    if (dbuf != NULL)
        cudaFreeAsync(dbuf, stream);
    if (stream != NULL)
        cudaStreamDestroy(stream);
    return st;
}
