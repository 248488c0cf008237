/*
 * maco/nccl_bootstrap.h - a MACO communicator made over the ranks of an existing NCCL
 * communicator, and the real NCCL library MACO loads.
 *
 * MACO never links NCCL: the NCCL library is opened with dlopen at the first call that needs
 * it, from MACO_NCCL_LIBRARY (default "libnccl.so.2", found by the loader's search), once per
 * process, and never MACO's own NCCL-compatible library (libmaco_nccl.so, whose SONAME is
 * also libnccl.so.2): that one is recognised by its marker symbol and refused. When the
 * application already has NCCL loaded, dlopen of the same name or file returns that copy,
 * which is the one whose communicators these calls can use.
 *
 * This header does not need nccl.h: `struct ncclComm *` is NCCL's `ncclComm_t`.
 */
#ifndef MACO_NCCL_BOOTSTRAP_H
#define MACO_NCCL_BOOTSTRAP_H

#include <stddef.h>

#include "maco/comm.h"
#include "maco/export.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ncclComm;

/**
 * Builds a MACO communicator over the ranks of the real NCCL communicator `nccl_comm`:
 * rank r of `nccl_comm` becomes rank r of the new communicator, on the CUDA device NCCL
 * reports for it (ncclCommCuDevice), which becomes the calling thread's current device.
 * NCCL is used only to exchange setup data: rank 0 makes a MACO unique id, which reaches the
 * other ranks by one ncclBroadcast of 132 bytes of device memory on a stream of this call's
 * own; then every rank joins MACO's bootstrap with it (maco_bootstrap_create) and creates the
 * communicator (maco_comm_create). Data never moves through NCCL afterwards, and the MACO
 * communicator does not depend on `nccl_comm` staying alive: destroying either leaves the
 * other usable.
 *
 * `nccl_comm` must have been made by the NCCL this call loads (MACO_NCCL_LIBRARY, else
 * libnccl.so.2: the copy the process already has loaded when it is the same file or
 * SONAME); a communicator of another copy, or of MACO's own NCCL-compatible library, is
 * undefined behaviour that MACO cannot detect. Its non-blocking creation must have finished.
 *
 * Collective over the ranks of `nccl_comm`: every rank calls it, and no other thread issues
 * work on `nccl_comm` meanwhile (the broadcast is an NCCL collective, ordered as NCCL
 * orders collectives on one communicator). The returned communicator owns its bootstrap
 * (maco_comm_destroy frees both); destroy it with maco_comm_destroy.
 *
 * Blocking. The broadcast is bounded by MACO_BOOTSTRAP_TIMEOUT (polled, with NCCL's
 * ncclCommGetAsyncError read while waiting); when it runs out or NCCL reports an error, the
 * device buffer and the stream stay allocated (NCCL's kernel may still use them) and the
 * NCCL communicator should be aborted by its owner. The bootstrap and communicator creation
 * are bounded as maco_bootstrap_create and maco_comm_create are. Thread-safe in the sense of
 * maco_comm_create: calls on different NCCL communicators may run on different threads.
 *
 * Errors:
 * - MACO_ERR_INVALID_ARGUMENT: `nccl_comm` or `comm_p` is NULL; NCCL's queries refused the
 *   communicator (ncclInvalidArgument).
 * - MACO_ERR_UNSUPPORTED: the NCCL library cannot be opened (the message names the path and
 *   dlerror's text) or lacks one of the entry points used here (ncclCommCount,
 *   ncclCommUserRank, ncclCommCuDevice, ncclBroadcast, ncclCommGetAsyncError,
 *   ncclGetErrorString).
 * - MACO_ERR_INVALID_USAGE: MACO_NCCL_LIBRARY is MACO's own NCCL-compatible library; or
 *   NCCL answered ncclInvalidUsage or ncclInProgress (a non-blocking creation not finished).
 * - MACO_ERR_CUDA: the device buffer, the stream or the copies failed, or NCCL answered
 *   ncclUnhandledCudaError.
 * - MACO_ERR_TIMEOUT: the broadcast did not finish within MACO_BOOTSTRAP_TIMEOUT (a rank did
 *   not call, or is gone).
 * - MACO_ERR_REMOTE: NCCL answered ncclRemoteError, or rank 0 could not make the unique id
 *   (its own call returns that cause; the others say rank 0 failed).
 * - MACO_ERR_SYSTEM, MACO_ERR_INTERNAL: NCCL's ncclSystemError, ncclInternalError.
 * - Everything maco_unique_id_create, maco_bootstrap_create and maco_comm_create return.
 * Every error is logged once with its cause (NCCL's error string where NCCL failed) and
 * *comm_p is left untouched.
 */
MACO_API maco_status_t maco_comm_create_from_nccl(struct ncclComm *nccl_comm, maco_comm_t *comm_p);

/**
 * Looks up the real NCCL's exported function or object `name` ("ncclAllReduce") in the
 * library described at the top of this header, loaded on the first call (dlopen with
 * RTLD_NOW | RTLD_LOCAL, plus RTLD_DEEPBIND except under AddressSanitizer, so that the
 * library's calls between its own functions stay inside it) and kept loaded for the life of
 * the process; the outcome of that first load is kept (a later change of MACO_NCCL_LIBRARY
 * is not seen). On success *sym_p is the symbol's address. A query: it logs one INFO line when
 * the library loads, nothing on failure, and the caller decides whether a missing NCCL is an
 * error; on failure `why` (when not NULL,
 * `why_bytes` bytes, 256 or more advised) gets a sentence naming MACO_NCCL_LIBRARY's value
 * and the cause. Not blocking beyond the first load. Thread-safe.
 * Errors: MACO_ERR_INVALID_ARGUMENT (`name` or `sym_p` NULL, or MACO_NCCL_LIBRARY longer
 * than 255 characters); MACO_ERR_UNSUPPORTED (the
 * library cannot be opened: dlerror's text; or it has no such symbol); MACO_ERR_INVALID_USAGE
 * (the library is MACO's own NCCL-compatible library).
 */
MACO_API maco_status_t maco_nccl_library_symbol(const char *name, void **sym_p, char *why,
                                                size_t why_bytes);

#ifdef __cplusplus
}
#endif

#endif /* MACO_NCCL_BOOTSTRAP_H */
