/*
 * mem_handle.h - the serialized memory handle (MACO_MEM_HANDLE_BYTES = 128 bytes) that
 * maco_mem_serialize writes and maco_mem_import reads, and its decoder. Pure C with no CUDA:
 * the decoder is what a forged or damaged handle meets first, so it is fuzzed on its own
 * (tests/fuzz).
 *
 * Layout (little-endian):
 *    0 u32 magic 'MMEM'         4 u16 version (2)          6 u16 kind (below)
 *    8 i32 owner rank          12 i32 owner CUDA device (-1: host memory)
 *   16 u64 bytes               24 u64 offset of the buffer in its allocation
 *   32 u64 allocation size     40 u64 owner node hash (FNV-1a of the host id)
 *   48 u64 owner process token 56 u64 buffer address in the owner process
 *   64 kind-specific, 64 bytes:
 *        CUDA_IPC: cudaIpcMemHandle_t of the allocation
 *        POSIX_FD, HOST_FD: u32 server pid, u32 zero, u64 server nonce, u64 token
 *                           (where to fetch the descriptor: fd_server.h)
 *        LOCAL: nothing (usable only inside the owner's process)
 */
#ifndef MACO_MEM_HANDLE_H
#define MACO_MEM_HANDLE_H

#include <stdint.h>

#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MACO__MEM_MAGIC 0x4D454D4Du /* "MMEM" */
#define MACO__MEM_VERSION 2u

enum {
    MACO__KIND_CUDA_IPC = 1, /* legacy CUDA IPC of a cudaMalloc allocation */
    MACO__KIND_POSIX_FD = 2, /* cuMem allocation exported as a POSIX file descriptor */
    MACO__KIND_HOST_FD = 3,  /* MACO's shared host memory (a memfd) */
    MACO__KIND_LOCAL = 4,    /* pinned host memory only its own process can use */
    MACO__MEM_IPC_BYTES = 64,
};

/** A decoded handle: every field, checked against the others. */
typedef struct maco__mem_handle {
    int kind;
    int32_t owner, owner_device;
    uint64_t bytes, offset, alloc_bytes;
    uint64_t node_hash, owner_token, owner_ptr;
    uint8_t ipc[MACO__MEM_IPC_BYTES]; /* CUDA_IPC */
    uint32_t fd_pid;                  /* POSIX_FD, HOST_FD */
    uint64_t fd_nonce, fd_token;
} maco__mem_handle_t;

/**
 * Decodes the 128 bytes at `handle` for an importer that is `rank` of `nranks`, checking the
 * fields against each other: magic and version, a known kind, an owner that is another rank,
 * 0 < bytes, offset + bytes <= allocation size <= 4 PiB, host kinds on device -1 and device
 * kinds on a device. Writes *h only on success. Logs and returns MACO_ERR_INVALID_ARGUMENT
 * (naming what is wrong) or MACO_ERR_UNSUPPORTED (an unknown kind). What the handle names is
 * checked against what is really there when it is mapped (memory.c). Thread-safe.
 */
maco_status_t maco__mem_handle_decode(const void *handle, int nranks, int rank,
                                      maco__mem_handle_t *h);

#ifdef __cplusplus
}
#endif

#endif /* MACO_MEM_HANDLE_H */
