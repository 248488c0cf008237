/*
 * maco/memory.h - memory that peers can map: allocation, registration, export, import.
 *
 * Registration records a buffer and exports a handle for the allocation that encloses it:
 *   - cudaMalloc memory: the legacy CUDA IPC handle of the allocation, plus the offset;
 *   - cuMem (VMM) memory created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (MACO's own
 *     maco_mem_alloc(), or an application's, e.g. PyTorch's expandable segments): the
 *     allocation's POSIX file descriptor, handed to local peers over an abstract Unix-domain
 *     socket with SCM_RIGHTS (nothing is left in the file system);
 *   - pinned host memory: from maco_mem_alloc_host() (shared memory, mappable by local
 *     peers), or any other pinned memory (usable only inside its own process).
 * Buffers inside one allocation share one export (a cache keyed by the allocation's base and
 * CUDA buffer id, so a freed and reused address is not mistaken for the old allocation), and
 * an importer maps each peer allocation once however many buffers of it it imports.
 * The handle is serialized into MACO_MEM_HANDLE_BYTES bytes (magic, version, fixed
 * little-endian fields), sent to peers by any means (e.g. maco_bootstrap_allgather) and
 * imported there. Ranks in the same process (one process driving several GPUs) import the
 * owner's pointer itself, with peer access enabled between the devices.
 */
#ifndef MACO_MEMORY_H
#define MACO_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "maco/collectives.h" /* maco_stream_t */
#include "maco/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MACO_MEM_HANDLE_BYTES 128

typedef struct maco_mem *maco_mem_t;

/**
 * Allocates `bytes` bytes (rounded up to the allocation granularity) of device memory on
 * the communicator's device with cuMem, exportable to local peers by POSIX file descriptor.
 * *ptr_p is the device address. Free with maco_mem_free(). Not collective. The memory is
 * registered with the communicator at once (as by maco_mem_register over all of it), so
 * collectives use it in place (maco/collectives.h); maco_mem_free ends that registration.
 * Every GPU of this process with peer access to the communicator's device may read and write
 * it as well (as ncclMemAlloc's memory): copies and kernels of another device reach it.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, bytes 0), MACO_ERR_UNSUPPORTED (no GPU),
 * MACO_ERR_CUDA (the driver refused: out of memory, no VMM support, access for a peer GPU;
 * the message says, naming the devices).
 */
MACO_API maco_status_t maco_mem_alloc(maco_comm_t comm, size_t bytes, void **ptr_p);

/**
 * Allocates `bytes` bytes of device memory as maco_mem_alloc() does (cuMem, rounded up to the
 * allocation granularity, exportable to local peers by POSIX file descriptor), without a
 * communicator: on CUDA device `cuda_device`, or the calling thread's current device when it
 * is -1. Nothing is registered: maco_mem_register() it with a communicator to share it or to
 * have collectives use it in place. Every GPU of this process with peer access to the device
 * may read and write it. *ptr_p is the device address. Free with maco_mem_free()
 * (its `comm` may be NULL). Not blocking beyond the driver's calls. Thread-safe.
 * Errors: MACO_ERR_INVALID_ARGUMENT (ptr_p NULL, bytes 0, cuda_device outside [-1, number of
 * devices)), MACO_ERR_UNSUPPORTED (no usable CUDA device: the message says why),
 * MACO_ERR_CUDA (the driver refused: out of memory, no VMM support; the message says),
 * MACO_ERR_NO_MEMORY.
 */
MACO_API maco_status_t maco_mem_alloc_device(int cuda_device, size_t bytes, void **ptr_p);

/**
 * Allocates `bytes` bytes (rounded up to the page size) of host memory that local peers
 * can map (a memfd shared mapping), pinned with cudaHostRegister when a GPU is visible.
 * Free with maco_mem_free(). Errors: MACO_ERR_INVALID_ARGUMENT, MACO_ERR_SYSTEM,
 * MACO_ERR_CUDA (pinning failed).
 */
MACO_API maco_status_t maco_mem_alloc_host(maco_comm_t comm, size_t bytes, void **ptr_p);

/**
 * Frees memory from maco_mem_alloc(), maco_mem_alloc_device() or maco_mem_alloc_host(); `ptr`
 * must be the address they returned. `comm` records an error as its first; it may be NULL for
 * memory of maco_mem_alloc_device(). Registrations of it must be deregistered first. NULL is
 * ignored.
 * Errors: MACO_ERR_INVALID_ARGUMENT (not an address MACO allocated), MACO_ERR_CUDA.
 */
MACO_API maco_status_t maco_mem_free(maco_comm_t comm, void *ptr);

/**
 * Registers `bytes` bytes at `ptr`: device memory of the communicator's device (cudaMalloc
 * or cuMem) or pinned host memory. The memory stays owned by the caller and must outlive
 * the registration. Not collective; not blocking. Thread-safe for different communicators.
 * Works on the communicator's device whichever device the calling thread has current, and
 * leaves the current device as it was (so do maco_mem_import and maco_mem_deregister).
 * Device memory is also published to the communicator's peers, so collectives on it run in
 * place once every rank has called maco_collective_map_registrations (maco/collectives.h);
 * peers keep their mapping of it until the communicator is destroyed.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, bytes 0, memory of another device, memory CUDA
 * does not know (pageable or managed), a range that runs past the end of its allocation: the
 * message gives the sizes), MACO_ERR_UNSUPPORTED (no GPU; a cuMem allocation made without
 * the POSIX file-descriptor handle type), MACO_ERR_CUDA, MACO_ERR_SYSTEM.
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
 * Maps a peer's registered buffer from its serialized handle into this process, for this
 * communicator's device. Not collective; may block briefly (bounded by
 * MACO_BOOTSTRAP_TIMEOUT) to fetch a file descriptor from the owner's process.
 * A buffer of a rank on another node is imported without a mapping: the handle then names
 * it (owner, address, size) for port channels over a network transport (IB, TCP), whose
 * owner-side proxy or NIC writes it, and maco_mem_get_pointer() on it returns
 * MACO_ERR_UNSUPPORTED.
 * Errors: MACO_ERR_INVALID_ARGUMENT (NULL, not a MACO memory handle, a handle of this
 * rank), MACO_ERR_UNSUPPORTED (pinned host memory that only its own process can use),
 * MACO_ERR_CUDA (the mapping failed, e.g. the two GPUs have no peer access: the message
 * names both devices), MACO_ERR_REMOTE (the owner no longer exports it), MACO_ERR_TIMEOUT.
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

/** One copy of maco_mem_copy_batch: `bytes` bytes from `src` to `dst`. */
typedef struct maco_mem_copy {
    void *dst;       /**< destination: device memory, a peer's mapped buffer or pinned host */
    const void *src; /**< source, as `dst` */
    size_t bytes;    /**< bytes to copy; 0 skips the entry (dst and src may then be NULL) */
} maco_mem_copy_t;

/** The most entries maco_mem_copy_batch takes in one call. */
#define MACO_MEM_COPY_BATCH_MAX 4096

/**
 * Enqueues `count` copies on `stream`, in order, each a cudaMemcpyAsync (cudaMemcpyDefault):
 * the GPU's copy engines move the bytes, no SM runs a kernel. The addresses may be any
 * this process can reach through unified addressing: memory of the current device, a peer's
 * buffer mapped by maco_mem_import (over NVLink or PCIe), pinned host memory. For
 * zero-SM data movement beside compute (the tensor-parallel operators of maco.tp): one call
 * costs one crossing of the library boundary instead of one per copy.
 *
 * `stream` is a cudaStream_t; 0, cudaStreamLegacy and cudaStreamPerThread name the current
 * device's. Not blocking (pinned host or device memory); stream-ordered, and capturable in a
 * CUDA graph. The caller orders the copies against other streams and the peers' use of their
 * buffers (e.g. a collective on the stream as a barrier). Thread-safe.
 *
 * `copies` (count entries, sizes in bytes) is read during the call only and stays the caller's;
 * so do the buffers, which must stay valid until the copies are done on `stream`.
 *
 * Errors (nothing is enqueued when the arguments are refused):
 *   MACO_ERR_INVALID_ARGUMENT: `copies` NULL with count > 0; count above
 *     MACO_MEM_COPY_BATCH_MAX; an entry with bytes > 0 and a NULL dst or src, a range that runs
 *     past the end of the address space, or source and destination ranges that overlap (the
 *     message names the entry's index).
 *   MACO_ERR_CUDA: cudaMemcpyAsync refused entry i (e.g. an address CUDA does not know, a
 *     destroyed stream): the message names i and CUDA's error; entries before i are enqueued.
 */
MACO_API maco_status_t maco_mem_copy_batch(const maco_mem_copy_t *copies, size_t count,
                                           maco_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MACO_MEMORY_H */
