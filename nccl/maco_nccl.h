/*
 * maco_nccl.h - what libmaco_nccl.so (MACO's NCCL-compatible library, SONAME libnccl.so.2)
 * exports beyond nccl.h: ways to see where calls ran. Find them with
 * dlsym(RTLD_DEFAULT, "maco_nccl_call_count"), which also tells an application that the
 * libnccl.so.2 it loaded is MACO's.
 */
#ifndef MACO_NCCL_H
#define MACO_NCCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Counts of calls of the NCCL function `name` ("ncclAllReduce", "ncclSend", ...) since the
 * library loaded: *native_p those MACO ran, *forwarded_p those forwarded to the real NCCL
 * (MACO_NCCL_LIBRARY). Either pointer may be NULL. Counted per call (a group's calls each
 * count). Returns 0, or -1 when `name` is not a counted function (the outputs untouched).
 * Counted: ncclAllReduce, ncclBroadcast (ncclBcast too), ncclReduce, ncclAllGather,
 * ncclReduceScatter, ncclAlltoAll, ncclGather, ncclScatter (each with its ...Config variant
 * of NCCL 2.31), ncclSend, ncclRecv, ncclCommInitRank (every creation, split ones included),
 * ncclCommSplit, ncclCommShrink, ncclCommGrow (the existing and the new ranks' calls),
 * ncclCommRegister (window registrations too) and ncclMemAlloc. Thread-safe.
 */
int maco_nccl_call_count(const char *name, uint64_t *native_p, uint64_t *forwarded_p);

/**
 * Loads the real NCCL as the fallback would (MACO_NCCL_LIBRARY, MACO_NCCL_FALLBACK), once per
 * process, and resolves its entry points. Returns 0 when it is usable; else -1 with the
 * reason in `why` (cap bytes): MACO_NCCL_FALLBACK=never, the library is this one (MACO's own
 * libnccl.so.2, which it never loads), it cannot be opened, or an entry point is missing.
 * Thread-safe.
 */
int maco_nccl_fallback_check(char *why, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* MACO_NCCL_H */
