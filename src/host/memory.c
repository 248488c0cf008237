/*
 * memory.c - registration, serialization and import of device memory (CUDA IPC).
 *
 * Serialized handle (MACO_MEM_HANDLE_BYTES = 128 bytes, little-endian):
 *    0 u32 magic 'MMEM'      4 u16 version (1)     6 u16 kind (1 = legacy CUDA IPC)
 *    8 i32 owner rank       12 u32 reserved
 *   16 u64 bytes            24 u64 offset of the buffer in its allocation
 *   32 u64 allocation size  40 u64 owner node hash (FNV-1a of the host id)
 *   48 u8[64] cudaIpcMemHandle_t of the allocation
 *  112 reserved, zero
 */
#include "maco/memory.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "bootstrap_internal.h"
#include "comm_internal.h"
#include "cuda_util.h"
#include "log.h"
#include "wire.h"

#define MACO__MEM_MAGIC 0x4D454D4Du /* "MMEM" */
#define MACO__MEM_VERSION 1u
#define MACO__MEM_KIND_CUDA_IPC 1u

struct maco_mem {
    maco_comm_t comm;
    int owner;
    int imported;
    char *ptr;
    size_t bytes;
    size_t offset;
    size_t alloc_bytes;
    char *mapped_base; /* imported: what cudaIpcOpenMemHandle returned */
    cudaIpcMemHandle_t ipc;
};

_Static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t is 64 bytes");

/* ------------------------------------------------------------------ driver entry point */

typedef CUresult (*maco__cuMemGetAddressRange_t)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
static maco__cuMemGetAddressRange_t maco__cuMemGetAddressRange;
static pthread_once_t maco__driver_once = PTHREAD_ONCE_INIT;

/* The driver is reached through the runtime's entry-point query, so libmaco.so has no
 * link-time dependency on libcuda.so (DESIGN.md). */
static void maco__driver_init(void)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        maco__cuMemGetAddressRange = (maco__cuMemGetAddressRange_t)fn;
}

maco_status_t maco_mem_register(maco_comm_t comm, void *ptr, size_t bytes, maco_mem_t *mem_p)
{
    if (comm == NULL || ptr == NULL || mem_p == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: comm, ptr and mem_p "
                                                   "must not be NULL"));
    if (bytes == 0)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: bytes is 0"));
    maco_status_t st = maco__comm_require_gpu(comm, "maco_mem_register");
    if (st != MACO_OK)
        return st;
    struct cudaPointerAttributes attr;
    cudaError_t cerr = cudaPointerGetAttributes(&attr, ptr);
    if (cerr != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
        cudaGetLastError();
        return maco__comm_record(
            comm, maco__error(cerr == cudaSuccess && attr.type == cudaMemoryTypeHost
                                  ? MACO_ERR_UNSUPPORTED
                                  : MACO_ERR_INVALID_ARGUMENT,
                              MACO_SUBSYS_MEM,
                              "maco_mem_register: ptr %p is not device memory (CUDA memory "
                              "type %d%s); only device memory can be registered now",
                              ptr, cerr == cudaSuccess ? (int)attr.type : -1,
                              cerr == cudaSuccess ? "" : ", unknown to CUDA"));
    }
    if (attr.device != comm->cuda_device)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: ptr %p is memory of "
                                                   "device %d, but the communicator uses "
                                                   "device %d",
                                                   ptr, attr.device, comm->cuda_device));
    pthread_once(&maco__driver_once, maco__driver_init);
    if (maco__cuMemGetAddressRange == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: the CUDA driver does "
                                                   "not provide cuMemGetAddressRange"));
    CUdeviceptr base = 0;
    size_t alloc_bytes = 0;
    CUresult cres = maco__cuMemGetAddressRange(&base, &alloc_bytes, (CUdeviceptr)(uintptr_t)ptr);
    if (cres != CUDA_SUCCESS)
        return maco__comm_record(comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: cuMemGetAddressRange(%p) "
                                                   "failed with CUresult %d",
                                                   ptr, (int)cres));
    size_t offset = (size_t)((uintptr_t)ptr - (uintptr_t)base);
    if (bytes > alloc_bytes - offset)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: [%p, +%zu bytes) runs "
                                                   "past the end of its allocation (%zu bytes "
                                                   "at offset %zu leave %zu)",
                                                   ptr, bytes, alloc_bytes, offset,
                                                   alloc_bytes - offset));
    maco_mem_t mem = (maco_mem_t)calloc(1, sizeof(*mem));
    if (mem == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: no host memory"));
    cerr = cudaIpcGetMemHandle(&mem->ipc, (void *)(uintptr_t)base);
    if (cerr != cudaSuccess) {
        cudaGetLastError();
        free(mem);
        return maco__comm_record(
            comm,
            maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM,
                        "maco_mem_register: cudaIpcGetMemHandle(%p) failed: %s (%s); "
                        "cuMem (VMM) allocations are not supported yet",
                        (void *)(uintptr_t)base, cudaGetErrorName(cerr), cudaGetErrorString(cerr)));
    }
    mem->comm = comm;
    mem->owner = comm->rank;
    mem->ptr = (char *)ptr;
    mem->bytes = bytes;
    mem->offset = offset;
    mem->alloc_bytes = alloc_bytes;
    MACO_DEBUG(MACO_SUBSYS_MEM, "registered %zu bytes at %p (offset %zu in %zu)", bytes, ptr,
               offset, alloc_bytes);
    *mem_p = mem;
    return MACO_OK;
}

maco_status_t maco_mem_serialize(maco_mem_t mem, void *out)
{
    if (mem == NULL || out == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_serialize: mem and out must not be NULL");
    if (mem->imported)
        return maco__comm_record(mem->comm,
                                 maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                             "maco_mem_serialize: this handle was imported "
                                             "from rank %d; only the owner serializes",
                                             mem->owner));
    uint8_t *p = (uint8_t *)out;
    memset(p, 0, MACO_MEM_HANDLE_BYTES);
    maco__put_u32(p, MACO__MEM_MAGIC);
    maco__put_u16(p + 4, MACO__MEM_VERSION);
    maco__put_u16(p + 6, MACO__MEM_KIND_CUDA_IPC);
    maco__put_u32(p + 8, (uint32_t)mem->owner);
    maco__put_u64(p + 16, mem->bytes);
    maco__put_u64(p + 24, mem->offset);
    maco__put_u64(p + 32, mem->alloc_bytes);
    maco__put_u64(p + 40, maco__fnv1a(maco__host_id()));
    memcpy(p + 48, &mem->ipc, sizeof(mem->ipc));
    return MACO_OK;
}

maco_status_t maco_mem_import(maco_comm_t comm, const void *handle, maco_mem_t *mem_p)
{
    if (comm == NULL || handle == NULL || mem_p == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: NULL argument"));
    maco_status_t st = maco__comm_require_gpu(comm, "maco_mem_import");
    if (st != MACO_OK)
        return st;
    const uint8_t *p = (const uint8_t *)handle;
    if (maco__get_u32(p) != MACO__MEM_MAGIC || maco__get_u16(p + 4) != MACO__MEM_VERSION)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: not a MACO memory handle "
                                                   "of version %u (magic 0x%08x, version %u)",
                                                   MACO__MEM_VERSION, maco__get_u32(p),
                                                   maco__get_u16(p + 4)));
    if (maco__get_u16(p + 6) != MACO__MEM_KIND_CUDA_IPC)
        return maco__comm_record(comm, maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: handle kind %u is not "
                                                   "supported",
                                                   maco__get_u16(p + 6)));
    int owner = (int)maco__get_u32(p + 8);
    if (owner < 0 || owner >= comm->nranks || owner == comm->rank)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: the handle's owner is "
                                                   "rank %d; expected another rank of [0, %d)",
                                                   owner, comm->nranks));
    if (maco__get_u64(p + 40) != maco__fnv1a(maco__host_id()))
        return maco__comm_record(comm, maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: rank %d's memory is on "
                                                   "another node; CUDA IPC reaches only GPUs "
                                                   "of this node",
                                                   owner));
    maco_mem_t mem = (maco_mem_t)calloc(1, sizeof(*mem));
    if (mem == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: no host memory"));
    memcpy(&mem->ipc, p + 48, sizeof(mem->ipc));
    void *base = NULL;
    cudaError_t cerr = cudaIpcOpenMemHandle(&base, mem->ipc, cudaIpcMemLazyEnablePeerAccess);
    if (cerr != cudaSuccess) {
        cudaGetLastError();
        free(mem);
        return maco__comm_record(
            comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                              "maco_mem_import: cudaIpcOpenMemHandle for rank %d's memory "
                              "failed: %s (%s); do the GPUs have peer access?",
                              owner, cudaGetErrorName(cerr), cudaGetErrorString(cerr)));
    }
    mem->comm = comm;
    mem->owner = owner;
    mem->imported = 1;
    mem->bytes = (size_t)maco__get_u64(p + 16);
    mem->offset = (size_t)maco__get_u64(p + 24);
    mem->alloc_bytes = (size_t)maco__get_u64(p + 32);
    mem->mapped_base = (char *)base;
    mem->ptr = (char *)base + mem->offset;
    *mem_p = mem;
    return MACO_OK;
}

maco_status_t maco_mem_get_pointer(maco_mem_t mem, void **ptr_p)
{
    if (mem == NULL || ptr_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_get_pointer: NULL argument");
    *ptr_p = mem->ptr;
    return MACO_OK;
}

maco_status_t maco_mem_get_size(maco_mem_t mem, size_t *bytes_p)
{
    if (mem == NULL || bytes_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_get_size: NULL argument");
    *bytes_p = mem->bytes;
    return MACO_OK;
}

maco_status_t maco_mem_get_owner(maco_mem_t mem, int *rank_p)
{
    if (mem == NULL || rank_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_get_owner: NULL argument");
    *rank_p = mem->owner;
    return MACO_OK;
}

maco_status_t maco_mem_deregister(maco_mem_t mem)
{
    if (mem == NULL)
        return MACO_OK;
    maco_status_t st = MACO_OK;
    if (mem->imported) {
        cudaError_t cerr = cudaIpcCloseMemHandle(mem->mapped_base);
        if (cerr != cudaSuccess) {
            cudaGetLastError();
            st = maco__comm_record(mem->comm,
                                   maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                                               "cudaIpcCloseMemHandle for rank %d's memory "
                                               "failed: %s",
                                               mem->owner, cudaGetErrorString(cerr)));
        }
    }
    free(mem);
    return st;
}
