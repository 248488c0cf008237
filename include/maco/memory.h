/*
 * maco/memory.h - registering device memory so that peers on the same node can map it.
 *
 * Registration exports a handle for the allocation that encloses the buffer (a legacy
 * CUDA IPC handle for cudaMalloc memory) plus the buffer's offset in it. The handle is
 * serialized into MACO_MEM_HANDLE_BYTES bytes (magic, version, fixed little-endian
 * fields), sent to peers by any means (e.g. maco_bootstrap_allgather), and imported there,
 * which maps the peer's buffer into the importing process.
 *
 * Supported now: cudaMalloc device memory. cuMem (VMM) allocations and host memory return
 * MACO_ERR_UNSUPPORTED.
 */
#ifndef MACO_MEMORY_H
#define MACO_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "maco/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MACO_MEM_HANDLE_BYTES 128

typedef struct maco_mem *maco_mem_t;

/**
 * Registers `bytes` bytes at device address `ptr` (memory of the communicator's device).
 * The memory stays owned by the caller and must outlive the registration. Not collective;
 * not blocking.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, bytes 0, the pointer is not device memory of
 * the communicator's device, the range runs past the end of its allocation: the message
 * gives both sizes), MACO_ERR_UNSUPPORTED (no GPU; VMM or host memory), MACO_ERR_CUDA.
 */
MACO_API maco_status_t maco_mem_register(maco_comm_t comm, void *ptr, size_t bytes,
                                         maco_mem_t *mem_p);

/**
 * Writes the handle of a registration made by this process into `out`
 * (MACO_MEM_HANDLE_BYTES bytes). Errors: MACO_ERR_INVALID_ARGUMENT (NULL, an imported
 * handle).
 */
MACO_API maco_status_t maco_mem_serialize(maco_mem_t mem, void *out);

/**
 * Maps a peer's registered buffer from its serialized handle. Not collective.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, not a MACO memory handle, a handle of this
 * rank), MACO_ERR_UNSUPPORTED (the owner is on another node; IPC cannot reach it),
 * MACO_ERR_CUDA (cudaIpcOpenMemHandle failed, e.g. no peer access between the GPUs).
 */
MACO_API maco_status_t maco_mem_import(maco_comm_t comm, const void *handle, maco_mem_t *mem_p);

/** Address of the buffer in this process (mapped for imported handles), and its size. */
MACO_API maco_status_t maco_mem_get_pointer(maco_mem_t mem, void **ptr_p);
MACO_API maco_status_t maco_mem_get_size(maco_mem_t mem, size_t *bytes_p);
/** Rank that owns the memory. */
MACO_API maco_status_t maco_mem_get_owner(maco_mem_t mem, int *rank_p);

/**
 * Ends a registration, or unmaps an imported buffer. Channels using it must be destroyed
 * first. NULL is accepted and ignored. Errors: MACO_ERR_CUDA (unmapping failed).
 */
MACO_API maco_status_t maco_mem_deregister(maco_mem_t mem);

#ifdef __cplusplus
}
#endif

#endif /* MACO_MEMORY_H */
