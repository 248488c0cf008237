/* cuda_util.h - turning CUDA errors into MACO statuses (internal). */
#ifndef MACO_CUDA_UTIL_H
#define MACO_CUDA_UTIL_H

#include <cuda_runtime_api.h>

#include "src/host/base/log.h"

/*
 * Evaluates a CUDA runtime call; on failure records MACO_ERR_CUDA naming the call and
 * CUDA's error, stores it in `st` and jumps to `label`.
 */
#define MACO_CUDA_GOTO(call, st, label)                                                            \
    do {                                                                                           \
        cudaError_t maco__cerr = (call);                                                           \
        if (maco__cerr != cudaSuccess) {                                                           \
            (st) = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_INIT, "%s failed: %s (%s)", #call,       \
                               cudaGetErrorName(maco__cerr), cudaGetErrorString(maco__cerr));      \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* As MACO_CUDA_GOTO but returns the status. */
#define MACO_CUDA_RETURN(call)                                                                     \
    do {                                                                                           \
        cudaError_t maco__cerr = (call);                                                           \
        if (maco__cerr != cudaSuccess)                                                             \
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_INIT, "%s failed: %s (%s)", #call,       \
                               cudaGetErrorName(maco__cerr), cudaGetErrorString(maco__cerr));      \
    } while (0)

/*
 * Device scopes. One thread may drive communicators of several GPUs (one process driving
 * every GPU of a node: ncclCommInitAll, CuPy's NcclCommunicator.initAll, nccl-tests -g N),
 * so a call on a communicator cannot rely on the calling thread's current device. Every
 * host path whose CUDA calls depend on it (kernel launches, stream 0, cudaStreamLegacy and
 * cudaStreamPerThread, which name a stream of the current device; allocations; peer access;
 * IPC mappings; synchronisation) runs inside a scope on the communicator's device, and the
 * caller's device is current again when the scope ends, as NCCL does:
 *
 *     int saved;
 *     cudaError_t e = maco__device_enter(comm->cuda_device, &saved);
 *     ...
 *     maco__device_leave(saved);
 *
 * maco__device_enter makes `device` current when it is not (cudaSetDevice: no
 * synchronisation, and allowed while a stream captures a graph). *saved_p gets the device
 * to put back, or -1 when there is nothing to put back (device < 0, or already current).
 * Returns cudaSuccess, or cudaSetDevice's error (nothing changed, *saved_p = -1; the error
 * is cleared from the thread's last error). maco__device_leave(saved) makes `saved` current
 * again when it is >= 0. Scopes nest. Thread-safe (the current device is per thread).
 */
static inline cudaError_t maco__device_enter(int device, int *saved_p)
{
    *saved_p = -1;
    if (device < 0)
        return cudaSuccess;
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) {
        (void)cudaGetLastError();
        cur = -1;
    }
    if (cur == device)
        return cudaSuccess;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return e;
    }
    *saved_p = cur;
    return cudaSuccess;
}

static inline void maco__device_leave(int saved)
{
    if (saved >= 0 && cudaSetDevice(saved) != cudaSuccess)
        (void)cudaGetLastError();
}

/*
 * The device scope as a MACO status: MACO_OK, or MACO_ERR_CUDA naming `fn` and the device
 * (logged once here). For the paths that return a maco_status_t.
 */
static inline maco_status_t maco__device_enter_status(int device, int *saved_p, const char *fn)
{
    cudaError_t e = maco__device_enter(device, saved_p);
    if (e == cudaSuccess)
        return MACO_OK;
    return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_INIT, "%s: cudaSetDevice(%d) failed: %s (%s)", fn,
                       device, cudaGetErrorName(e), cudaGetErrorString(e));
}

#endif /* MACO_CUDA_UTIL_H */
