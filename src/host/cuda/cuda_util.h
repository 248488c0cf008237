/* cuda_util.h - turning CUDA errors into MACO statuses (internal). */
#ifndef MACO_CUDA_UTIL_H
#define MACO_CUDA_UTIL_H

#include <cuda_runtime_api.h>

#include "log.h"

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

#endif /* MACO_CUDA_UTIL_H */
