/*
 * memory_private.h - the insides of memory registration, shared by src/host/memory:
 *   memory_base.c (the lock and lists below), import.c (mapping peers' memory), register.c
 *   (registration, export, serialization, deregistration, queries), alloc.c (maco_mem_alloc,
 *   maco_mem_alloc_host, maco_mem_free), each calling only the ones before it.
 * The serialized handle's layout and its decoder are in mem_handle.h.
 *
 * Every list below is guarded by maco__mem_lock: one export per allocation, one mapping per
 * peer allocation, however many buffers of it are registered or imported.
 */
#ifndef MACO_MEMORY_PRIVATE_H
#define MACO_MEMORY_PRIVATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "src/host/os/fd_server.h"
#include "maco/memory.h"
#include "src/host/memory/mem_handle.h"

#ifdef __cplusplus
extern "C" {
#endif
_Static_assert(sizeof(cudaIpcMemHandle_t) == MACO__MEM_IPC_BYTES, "cudaIpcMemHandle_t is 64 bytes");

/* MACO's own allocations (maco_mem_alloc, maco_mem_alloc_host). */
typedef struct maco__alloc {
    struct maco__alloc *next;
    char *base;
    size_t bytes;
    int is_host;
    CUmemGenericAllocationHandle handle; /* device */
    int fd;                              /* host: the memfd */
    maco_mem_t reg;                      /* device: its registration, for collectives */
} maco__alloc_t;

/* One exported allocation, shared by every registration inside it. */
typedef struct maco__export {
    struct maco__export *next;
    char *base;
    size_t bytes;
    uint64_t buffer_id; /* CUDA's id of the allocation; 0 for host memory */
    int kind;
    int device;
    int refs;
    cudaIpcMemHandle_t ipc;
    maco__fd_ref_t fdref;
} maco__export_t;

/* One mapped peer allocation, shared by every import of buffers inside it. */
typedef struct maco__import {
    struct maco__import *next;
    uint64_t owner_token; /* the owner's process token */
    uint64_t key;         /* IPC: hash of the handle; fd kinds: the fd token */
    int kind;
    int refs;
    char *base;
    size_t bytes;
    CUmemGenericAllocationHandle handle;
    int host_pinned;
} maco__import_t;

struct maco_mem {
    maco_comm_t comm;
    int owner;
    int imported;
    int kind;
    char *ptr;
    size_t bytes;
    size_t offset;
    size_t alloc_bytes;
    maco__export_t *exp; /* registrations */
    maco__import_t *imp; /* imports from another process */
    int published;       /* in the communicator's registry (registry.c) */
    int remote;          /* imported from another node: nothing mapped here (ptr NULL) */
    uint64_t owner_addr; /* imports: the buffer's address in the owner's process */
};

/* memory_base.c: the lock and the lists (definitions). */
extern pthread_mutex_t maco__mem_lock;
extern maco__alloc_t *maco__allocs;
extern maco__export_t *maco__exports;
extern maco__import_t *maco__imports;

void maco__import_unmap(maco__import_t *imp);
CUmemAccessDesc maco__rw_access(int device);

#ifdef __cplusplus
}
#endif

#endif /* MACO_MEMORY_PRIVATE_H */
