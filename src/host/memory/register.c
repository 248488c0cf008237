/* register.c - registering memory (one export per allocation), serializing its handle,
 * deregistering, and the queries on registrations. */
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

/* ------------------------------------------------------------------ registration */

/* The MACO host allocation containing [p, p+bytes), if any (called with the lock held). */
static maco__alloc_t *maco__find_host_alloc(const char *p)
{
    for (maco__alloc_t *a = maco__allocs; a != NULL; a = a->next)
        if (a->is_host && p >= a->base && p < a->base + a->bytes)
            return a;
    return NULL;
}

/*
 * Creates the export of a device allocation: legacy IPC for cudaMalloc memory, the POSIX fd
 * for cuMem memory. The kind is asked of the driver first (no call is made to fail on
 * purpose, so compute-sanitizer's API-error report stays empty).
 */
static maco_status_t maco__export_device(maco__export_t *e, const char *what)
{
    maco_status_t st = MACO_OK;
    CUdeviceptr dptr = (CUdeviceptr)(uintptr_t)e->base;
    int legacy = 0;
    MACO_CU_GOTO(st, out, what, cuPointerGetAttribute, &legacy,
                 CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, dptr);
    if (legacy) {
        cudaError_t cerr = cudaIpcGetMemHandle(&e->ipc, e->base);
        if (cerr != cudaSuccess) {
            cudaGetLastError();
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                               "%s: cudaIpcGetMemHandle(%p) failed: %s", what, e->base,
                               cudaGetErrorString(cerr));
        }
        e->kind = MACO__KIND_CUDA_IPC;
        return MACO_OK;
    }
    /* cuMem memory: it can travel only as a handle type it was created with. */
    unsigned long long types = 0;
    MACO_CU_GOTO(st, out, what, cuPointerGetAttribute, &types,
                 CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, dptr);
    if (!(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM,
                           "%s: the cuMem allocation at %p was created without "
                           "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, so no other process can "
                           "map it (maco_mem_alloc creates shareable memory)",
                           what, e->base);
    CUmemGenericAllocationHandle h;
    MACO_CU_GOTO(st, out, what, cuMemRetainAllocationHandle, &h, e->base);
    int fd = -1;
    MACO_CU_GOTO(st, release, what, cuMemExportToShareableHandle, &fd, h,
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    st = maco__fd_publish(fd, &e->fdref);
    close(fd);
    e->kind = MACO__KIND_POSIX_FD;
release:
    maco__cu()->cuMemRelease(h); /* the retain above took a reference */
out:
    return st;
}

/* maco_mem_register's work, on the communicator's device (the caller's scope). */
static maco_status_t maco__mem_register_on_its_device(maco_comm_t comm, void *ptr, size_t bytes,
                                                      maco_mem_t *mem_p)
{
    static const char *what = "maco_mem_register";
    char *p = (char *)ptr;
    /* MACO's shared host memory needs no GPU; everything else is asked of CUDA. */
    pthread_mutex_lock(&maco__mem_lock);
    int ours = maco__find_host_alloc(p) != NULL;
    pthread_mutex_unlock(&maco__mem_lock);
    maco_status_t st = ours ? MACO_OK : maco__comm_require_gpu(comm, what);
    if (st != MACO_OK)
        return st;
    struct cudaPointerAttributes attr;
    memset(&attr, 0, sizeof(attr));
    attr.type = cudaMemoryTypeHost;
    if (!ours) {
        cudaError_t cerr = cudaPointerGetAttributes(&attr, ptr);
        if (cerr != cudaSuccess) {
            cudaGetLastError();
            attr.type = cudaMemoryTypeUnregistered;
        }
    }
    char *base = NULL;
    size_t alloc_bytes = 0;
    uint64_t buffer_id = 0;
    int kind_hint = 0;
    if (attr.type == cudaMemoryTypeDevice) {
        if (attr.device != comm->cuda_device)
            return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                       "maco_mem_register: %p is memory of device "
                                                       "%d, but the communicator uses device %d",
                                                       ptr, attr.device, comm->cuda_device));
        CUdeviceptr b = 0;
        MACO_CU_GOTO(st, fail, what, cuMemGetAddressRange, &b, &alloc_bytes,
                     (CUdeviceptr)(uintptr_t)ptr);
        base = (char *)(uintptr_t)b;
        unsigned long long id = 0;
        MACO_CU_GOTO(st, fail, what, cuPointerGetAttribute, &id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                     (CUdeviceptr)(uintptr_t)ptr);
        buffer_id = id;
    } else if (attr.type == cudaMemoryTypeHost) {
        pthread_mutex_lock(&maco__mem_lock);
        maco__alloc_t *a = maco__find_host_alloc(p);
        if (a != NULL) {
            base = a->base;
            alloc_bytes = a->bytes;
            kind_hint = MACO__KIND_HOST_FD;
        }
        pthread_mutex_unlock(&maco__mem_lock);
        if (a == NULL) {
            /* Pinned memory MACO did not allocate: the registration covers just the range. */
            base = p;
            alloc_bytes = bytes;
            kind_hint = MACO__KIND_LOCAL;
        }
    } else {
        return maco__comm_record(
            comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                              "maco_mem_register: %p is neither device memory nor pinned host "
                              "memory (CUDA memory type %d): pageable and managed memory cannot "
                              "be registered",
                              ptr, (int)attr.type));
    }
    size_t offset = (size_t)(p - base);
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
    /* One export per allocation: reuse it when the same allocation (same base and buffer
     * id; a freed and reused address has a new id) is registered again. */
    pthread_mutex_lock(&maco__mem_lock);
    maco__export_t *e = NULL;
    for (maco__export_t *it = maco__exports; it != NULL && kind_hint != MACO__KIND_LOCAL;
         it = it->next)
        if (it->base == base && it->buffer_id == buffer_id && it->bytes == alloc_bytes)
            e = it;
    if (e != NULL) {
        e->refs++;
    } else {
        e = (maco__export_t *)calloc(1, sizeof(*e));
        if (e == NULL) {
            st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM, "maco_mem_register: no memory");
        } else {
            e->base = base;
            e->bytes = alloc_bytes;
            e->buffer_id = buffer_id;
            e->device = attr.type == cudaMemoryTypeDevice ? comm->cuda_device : -1;
            e->refs = 1;
            if (kind_hint == MACO__KIND_HOST_FD) {
                maco__alloc_t *a = maco__find_host_alloc(p);
                e->kind = MACO__KIND_HOST_FD;
                st = maco__fd_publish(a->fd, &e->fdref);
            } else if (kind_hint == MACO__KIND_LOCAL) {
                e->kind = MACO__KIND_LOCAL;
            } else {
                st = maco__export_device(e, what);
            }
            if (st == MACO_OK) {
                e->next = maco__exports;
                maco__exports = e;
            } else {
                free(e);
                e = NULL;
            }
        }
    }
    pthread_mutex_unlock(&maco__mem_lock);
    if (st != MACO_OK) {
        free(mem);
        return maco__comm_record(comm, st);
    }
    mem->comm = comm;
    mem->owner = comm->rank;
    mem->kind = e->kind;
    mem->ptr = p;
    mem->bytes = bytes;
    mem->offset = offset;
    mem->alloc_bytes = alloc_bytes;
    mem->exp = e;
    if (e->kind == MACO__KIND_CUDA_IPC || e->kind == MACO__KIND_POSIX_FD) {
        /* The layers above (the collectives' registry) take note through the communicator's
         * extension; memory itself calls nothing above it. */
        const maco__comm_ext_t *ext = maco__comm_extension();
        if (ext != NULL && ext->on_register != NULL)
            mem->published = ext->on_register(comm, mem, p, bytes);
    }
    MACO_DEBUG(MACO_SUBSYS_MEM, "registered %zu bytes at %p (offset %zu in %zu, kind %d)", bytes,
               ptr, offset, alloc_bytes, e->kind);
    *mem_p = mem;
    return MACO_OK;
fail:
    return maco__comm_record(comm, st);
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
    /* The export (cudaIpcGetMemHandle) is made in the communicator's device's context,
     * whichever device the calling thread has current. */
    int saved = -1;
    maco_status_t st = maco__device_enter_status(comm->cuda_device, &saved, "maco_mem_register");
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    st = maco__mem_register_on_its_device(comm, ptr, bytes, mem_p);
    maco__device_leave(saved);
    return st;
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
    const maco__export_t *e = mem->exp;
    uint8_t *p = (uint8_t *)out;
    memset(p, 0, MACO_MEM_HANDLE_BYTES);
    maco__put_u32(p, MACO__MEM_MAGIC);
    maco__put_u16(p + 4, MACO__MEM_VERSION);
    maco__put_u16(p + 6, (uint16_t)mem->kind);
    maco__put_u32(p + 8, (uint32_t)mem->owner);
    maco__put_u32(p + 12, (uint32_t)e->device);
    maco__put_u64(p + 16, mem->bytes);
    maco__put_u64(p + 24, mem->offset);
    maco__put_u64(p + 32, mem->alloc_bytes);
    maco__put_u64(p + 40, maco__fnv1a(maco__host_id()));
    maco__put_u64(p + 48, maco__process_token());
    maco__put_u64(p + 56, (uint64_t)(uintptr_t)mem->ptr);
    if (mem->kind == MACO__KIND_CUDA_IPC) {
        memcpy(p + 64, &e->ipc, sizeof(e->ipc));
    } else if (mem->kind == MACO__KIND_POSIX_FD || mem->kind == MACO__KIND_HOST_FD) {
        maco__put_u32(p + 64, e->fdref.pid);
        maco__put_u64(p + 72, e->fdref.server_nonce);
        maco__put_u64(p + 80, e->fdref.token);
    }
    return MACO_OK;
}

void maco__mem_unpublish(maco_mem_t mem)
{
    mem->published = 0;
}

int maco__mem_is_host(maco_mem_t mem)
{
    return mem->kind == MACO__KIND_HOST_FD || mem->kind == MACO__KIND_LOCAL;
}

int maco__mem_is_remote(maco_mem_t mem)
{
    return mem->remote;
}

uint64_t maco__mem_owner_addr(maco_mem_t mem)
{
    return mem->imported ? mem->owner_addr : (uint64_t)(uintptr_t)mem->ptr;
}

maco_status_t maco__mem_lookup(uint64_t addr, uint64_t bytes, maco__mem_region_t *r)
{
    maco_status_t st = MACO_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&maco__mem_lock);
    for (maco__export_t *e = maco__exports; e != NULL; e = e->next) {
        uint64_t base = (uint64_t)(uintptr_t)e->base;
        if (addr >= base && addr - base <= e->bytes && bytes <= e->bytes - (addr - base)) {
            r->base = e->base;
            r->bytes = e->bytes;
            r->is_host = e->device < 0;
            r->device = e->device;
            st = MACO_OK;
            break;
        }
    }
    pthread_mutex_unlock(&maco__mem_lock);
    if (st != MACO_OK)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "no registration of this process holds [0x%llx, +%llu bytes): a peer "
                           "named memory this rank never registered (deregistered already, or "
                           "a damaged handle)",
                           (unsigned long long)addr, (unsigned long long)bytes);
    return MACO_OK;
}

maco_status_t maco_mem_get_pointer(maco_mem_t mem, void **ptr_p)
{
    if (mem == NULL || ptr_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_get_pointer: NULL argument");
    if (mem->remote)
        return maco__comm_record(mem->comm,
                                 maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM,
                                             "maco_mem_get_pointer: rank %d's buffer is on "
                                             "another node and not mapped in this process (a "
                                             "port channel over IB or TCP writes it)",
                                             mem->owner));
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
    /* An IPC mapping is closed in the context that opened it: the communicator's device. */
    int saved = -1;
    if (mem->comm != NULL)
        (void)maco__device_enter(mem->comm->cuda_device, &saved);
    if (mem->published) {
        const maco__comm_ext_t *ext = maco__comm_extension();
        if (ext != NULL && ext->on_deregister != NULL)
            ext->on_deregister(mem->comm, mem);
    }
    pthread_mutex_lock(&maco__mem_lock);
    if (mem->imp != NULL && --mem->imp->refs == 0) {
        for (maco__import_t **pp = &maco__imports; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == mem->imp) {
                *pp = mem->imp->next;
                break;
            }
        }
        maco__import_unmap(mem->imp);
        free(mem->imp);
    }
    if (mem->exp != NULL && --mem->exp->refs == 0) {
        for (maco__export_t **pp = &maco__exports; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == mem->exp) {
                *pp = mem->exp->next;
                break;
            }
        }
        if (mem->exp->kind == MACO__KIND_POSIX_FD || mem->exp->kind == MACO__KIND_HOST_FD)
            maco__fd_withdraw(&mem->exp->fdref);
        free(mem->exp);
    }
    pthread_mutex_unlock(&maco__mem_lock);
    free(mem);
    maco__device_leave(saved);
    return MACO_OK;
}

maco_status_t maco__mem_exchange(maco_comm_t comm, maco_mem_t mine, char **peer_ptr,
                                 maco_mem_t *peer_mem)
{
    const int n = comm->nranks;
    uint8_t *handles = (uint8_t *)calloc((size_t)n, MACO_MEM_HANDLE_BYTES);
    if (handles == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM, "maco__mem_exchange: no memory");
    maco_status_t st =
        maco_mem_serialize(mine, handles + (size_t)comm->rank * MACO_MEM_HANDLE_BYTES);
    if (st == MACO_OK)
        st = maco_bootstrap_allgather(comm->bs, handles, MACO_MEM_HANDLE_BYTES);
    for (int r = 0; r < n && st == MACO_OK; r++) {
        void *p = NULL;
        if (r == comm->rank) {
            maco_mem_get_pointer(mine, &p);
        } else {
            st = maco_mem_import(comm, handles + (size_t)r * MACO_MEM_HANDLE_BYTES, &peer_mem[r]);
            if (st == MACO_OK && !peer_mem[r]->remote)
                maco_mem_get_pointer(peer_mem[r], &p); /* another node: NULL */
        }
        peer_ptr[r] = (char *)p;
    }
    free(handles);
    return st;
}
