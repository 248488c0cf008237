/* import.c - mapping a peer's registered memory from its serialized handle, checked field
 * by field and against what is really mapped (mem_handle.h). */
#include "maco/memory.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/comm/comm_internal.h"
#include "src/host/cuda/cuda_driver.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/os/fd_server.h"
#include "src/host/base/log.h"
#include "src/host/memory/memory_private.h"
#include "src/host/base/wire.h"

/* ------------------------------------------------------------------ import */

/* Same process, other device: the owner's pointer works once peer access is on. Runs with
 * the communicator's device current (maco_mem_import): cudaDeviceEnablePeerAccess enables
 * access from the current device. */
static maco_status_t maco__import_same_process(maco_comm_t comm, int kind, int owner_device,
                                               char *owner_base, size_t alloc_bytes)
{
    maco_status_t st = MACO_OK;
    int dev = comm->cuda_device;
    if (owner_device < 0 || owner_device == dev)
        return MACO_OK;
    int can = 0;
    MACO_CUDA_RETURN(cudaDeviceCanAccessPeer(&can, dev, owner_device));
    if (!can)
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                           "maco_mem_import: device %d cannot access device %d (no peer access "
                           "between the two GPUs)",
                           dev, owner_device);
    cudaError_t cerr = cudaDeviceEnablePeerAccess(owner_device, 0);
    if (cerr != cudaSuccess && cerr != cudaErrorPeerAccessAlreadyEnabled)
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                           "maco_mem_import: cudaDeviceEnablePeerAccess(%d) from device %d: %s",
                           owner_device, dev, cudaGetErrorString(cerr));
    cudaGetLastError();
    if (kind == MACO__KIND_POSIX_FD) {
        /* cuMem mappings grant access per device: add this one. */
        CUmemAccessDesc access = maco__rw_access(dev);
        MACO_CU_GOTO(st, out, "maco_mem_import", cuMemSetAccess, (CUdeviceptr)(uintptr_t)owner_base,
                     alloc_bytes, &access, 1);
    }
out:
    return st;
}

/* Maps a peer process's allocation (called with the lock held). */
static maco_status_t maco__import_map(maco_comm_t comm, int owner, int kind, const uint8_t *p,
                                      size_t alloc_bytes, maco__import_t *imp)
{
    maco_status_t st = MACO_OK;
    if (kind == MACO__KIND_CUDA_IPC) {
        cudaIpcMemHandle_t ipc;
        memcpy(&ipc, p + 64, sizeof(ipc));
        void *base = NULL;
        cudaError_t cerr = cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess);
        if (cerr != cudaSuccess) {
            cudaGetLastError();
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                               "maco_mem_import: cudaIpcOpenMemHandle for rank %d's memory "
                               "failed: %s (%s); do device %d and rank %d's device have peer "
                               "access?",
                               owner, cudaGetErrorName(cerr), cudaGetErrorString(cerr),
                               comm->cuda_device, owner);
        }
        /* The handle's sizes were checked against each other; now against the allocation
         * the driver really mapped. */
        CUdeviceptr range_base = 0;
        size_t range = 0;
        if (maco__cu()->cuMemGetAddressRange(&range_base, &range, (CUdeviceptr)(uintptr_t)base) !=
                CUDA_SUCCESS ||
            range < alloc_bytes) {
            cudaIpcCloseMemHandle(base);
            cudaGetLastError();
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                               "maco_mem_import: rank %d's handle claims a %zu-byte allocation but "
                               "the one it names has %zu bytes; the handle was damaged or forged",
                               owner, alloc_bytes, range);
        }
        imp->base = (char *)base;
        return MACO_OK;
    }
    maco__fd_ref_t ref = { maco__get_u32(p + 64), maco__get_u64(p + 72), maco__get_u64(p + 80) };
    int fd = -1;
    st = maco__fd_fetch(&ref, owner, maco__bootstrap_timeout_ms(comm->bs), &fd);
    if (st != MACO_OK)
        return st;
    if (kind == MACO__KIND_HOST_FD) {
        /* Mapping past the memfd's end would raise SIGBUS on access: check its real size. */
        struct stat sb;
        if (fstat(fd, &sb) != 0 || sb.st_size < 0 || (uint64_t)sb.st_size < alloc_bytes) {
            close(fd);
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                               "maco_mem_import: rank %d's handle claims %zu bytes of host memory "
                               "but the memory it names has %lld; the handle was damaged or "
                               "forged",
                               owner, alloc_bytes, (long long)sb.st_size);
        }
        void *m = mmap(NULL, alloc_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM,
                               "maco_mem_import: mmap of rank %d's host memory (%zu bytes): %s",
                               owner, alloc_bytes, strerror(errno));
        imp->base = (char *)m;
        /* Pinned, so GPUs and copy engines reach it too; unpinned still works for the CPU. */
        if (comm->cuda_device >= 0 &&
            cudaHostRegister(m, alloc_bytes, cudaHostRegisterPortable | cudaHostRegisterMapped) ==
                cudaSuccess)
            imp->host_pinned = 1;
        else
            cudaGetLastError();
        return MACO_OK;
    }
    /* cuMem: import the handle, reserve address space, map, grant this device access. */
    const char *what = "maco_mem_import";
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    int imported = 0, reserved = 0, mapped = 0;
    MACO_CU_GOTO(st, fail, what, cuMemImportFromShareableHandle, &h, (void *)(uintptr_t)fd,
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    imported = 1;
    MACO_CU_GOTO(st, fail, what, cuMemAddressReserve, &va, alloc_bytes, 0, 0, 0);
    reserved = 1;
    CUresult mres = maco__cu()->cuMemMap(va, alloc_bytes, 0, h, 0);
    if (mres != CUDA_SUCCESS) {
        /* Most likely the handle claims more than the allocation holds. */
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                         "maco_mem_import: mapping rank %d's allocation as %zu bytes failed "
                         "(CUDA error %d): the handle does not match the memory it names "
                         "(damaged or forged?)",
                         owner, alloc_bytes, (int)mres);
        goto fail;
    }
    mapped = 1;
    CUmemAccessDesc access = maco__rw_access(comm->cuda_device);
    MACO_CU_GOTO(st, fail, what, cuMemSetAccess, va, alloc_bytes, &access, 1);
    close(fd);
    imp->base = (char *)(uintptr_t)va;
    imp->handle = h;
    return MACO_OK;
fail:
    if (mapped)
        maco__cu()->cuMemUnmap(va, alloc_bytes);
    if (reserved)
        maco__cu()->cuMemAddressFree(va, alloc_bytes);
    if (imported)
        maco__cu()->cuMemRelease(h);
    close(fd);
    return st;
}

void maco__import_unmap(maco__import_t *imp)
{
    if (imp->kind == MACO__KIND_CUDA_IPC) {
        if (cudaIpcCloseMemHandle(imp->base) != cudaSuccess)
            cudaGetLastError();
    } else if (imp->kind == MACO__KIND_HOST_FD) {
        if (imp->host_pinned && cudaHostUnregister(imp->base) != cudaSuccess)
            cudaGetLastError();
        munmap(imp->base, imp->bytes);
    } else {
        CUdeviceptr va = (CUdeviceptr)(uintptr_t)imp->base;
        maco__cu()->cuMemUnmap(va, imp->bytes);
        maco__cu()->cuMemAddressFree(va, imp->bytes);
        maco__cu()->cuMemRelease(imp->handle);
    }
}

/* maco_mem_import's work, on the communicator's device (the caller's scope). */
static maco_status_t maco__mem_import_on_its_device(maco_comm_t comm, const void *handle,
                                                    maco_mem_t *mem_p)
{
    const uint8_t *p = (const uint8_t *)handle;
    maco__mem_handle_t h;
    maco_status_t st = maco__mem_handle_decode(handle, comm->nranks, comm->rank, &h);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    /* Shared host memory maps without a GPU, and memory of another node is not mapped at
     * all; everything else needs one. */
    int remote_node = maco__get_u64(p + 40) != maco__fnv1a(maco__host_id()) &&
                      h.owner_token != maco__process_token();
    if (h.kind != MACO__KIND_HOST_FD && !remote_node) {
        st = maco__comm_require_gpu(comm, "maco_mem_import");
        if (st != MACO_OK)
            return st;
    }
    int kind = h.kind;
    int owner = (int)h.owner;
    int owner_device = (int)h.owner_device;
    size_t bytes = (size_t)h.bytes;
    size_t offset = (size_t)h.offset;
    size_t alloc_bytes = (size_t)h.alloc_bytes;
    uint64_t owner_token = h.owner_token;
    char *owner_ptr = (char *)(uintptr_t)h.owner_ptr;
    maco_mem_t mem = (maco_mem_t)calloc(1, sizeof(*mem));
    if (mem == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: no host memory"));
    mem->comm = comm;
    mem->owner = owner;
    mem->imported = 1;
    mem->kind = kind;
    mem->bytes = bytes;
    mem->offset = offset;
    mem->alloc_bytes = alloc_bytes;
    mem->owner_addr = h.owner_ptr;
    if (owner_token == maco__process_token()) {
        /* Same process (one process driving several GPUs): use the pointer itself. */
        st = maco__import_same_process(comm, kind, owner_device, owner_ptr - offset, alloc_bytes);
        mem->ptr = owner_ptr;
    } else if (maco__get_u64(p + 40) != maco__fnv1a(maco__host_id())) {
        /* Another node: nothing can be mapped. The import names the buffer (owner, address,
         * size) for port channels over a network transport (IB, TCP), whose owner-side proxy
         * or NIC writes it. */
        mem->remote = 1;
        MACO_DEBUG(MACO_SUBSYS_MEM, "imported rank %d's %zu bytes at 0x%llx from another node",
                   owner, bytes, (unsigned long long)h.owner_ptr);
    } else if (kind == MACO__KIND_LOCAL) {
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM,
                         "maco_mem_import: rank %d registered pinned host memory that only its "
                         "own process can use (allocate it with maco_mem_alloc_host to share "
                         "it)",
                         owner);
    } else {
        uint64_t key = kind == MACO__KIND_CUDA_IPC ? 0 : maco__get_u64(p + 80);
        if (kind == MACO__KIND_CUDA_IPC) {
            for (int i = 0; i < 64; i++)
                key = (key ^ p[64 + i]) * 1099511628211ull;
        }
        pthread_mutex_lock(&maco__mem_lock);
        maco__import_t *imp = NULL;
        for (maco__import_t *it = maco__imports; it != NULL; it = it->next)
            if (it->owner_token == owner_token && it->key == key && it->kind == kind)
                imp = it;
        if (imp != NULL && alloc_bytes > imp->bytes) {
            /* Already mapped, smaller than this handle claims: using its claim would reach
             * past the mapping. */
            st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                             "maco_mem_import: rank %d's handle claims a %zu-byte allocation but "
                             "the memory it names has %zu bytes (mapped already); the handle "
                             "was damaged or forged",
                             owner, alloc_bytes, imp->bytes);
            imp = NULL;
        } else if (imp != NULL) {
            imp->refs++;
        } else {
            imp = (maco__import_t *)calloc(1, sizeof(*imp));
            if (imp == NULL) {
                st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM, "maco_mem_import: no memory");
            } else {
                imp->owner_token = owner_token;
                imp->key = key;
                imp->kind = kind;
                imp->refs = 1;
                imp->bytes = alloc_bytes;
                st = maco__import_map(comm, owner, kind, p, alloc_bytes, imp);
                if (st == MACO_OK) {
                    imp->next = maco__imports;
                    maco__imports = imp;
                } else {
                    free(imp);
                    imp = NULL;
                }
            }
        }
        pthread_mutex_unlock(&maco__mem_lock);
        if (imp != NULL) {
            mem->imp = imp;
            mem->ptr = imp->base + offset;
        }
    }
    if (st != MACO_OK) {
        free(mem);
        return maco__comm_record(comm, st);
    }
    *mem_p = mem;
    return MACO_OK;
}

maco_status_t maco_mem_import(maco_comm_t comm, const void *handle, maco_mem_t *mem_p)
{
    if (comm == NULL || handle == NULL || mem_p == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: NULL argument"));
    /* Peer access (cudaDeviceEnablePeerAccess is from the current device), IPC mappings and
     * cuMem access grants are made for the communicator's device, whichever device the
     * calling thread has current (one thread may drive several communicators). */
    int saved = -1;
    maco_status_t st = maco__device_enter_status(comm->cuda_device, &saved, "maco_mem_import");
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    st = maco__mem_import_on_its_device(comm, handle, mem_p);
    maco__device_leave(saved);
    return st;
}
