/*
 * memory.c - allocation, registration, export and import of memory peers can map. The
 * serialized handle's layout and its decoder are in mem_handle.h.
 */
#include "maco/memory.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bootstrap_internal.h"
#include "comm_internal.h"
#include "cuda_driver.h"
#include "cuda_util.h"
#include "fd_server.h"
#include "log.h"
#include "mem_handle.h"
#include "wire.h"

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
};

static pthread_mutex_t maco__mem_lock = PTHREAD_MUTEX_INITIALIZER;
static maco__alloc_t *maco__allocs;
static maco__export_t *maco__exports;
static maco__import_t *maco__imports;

/* ------------------------------------------------------------------ allocation */

static CUmemAllocationProp maco__vmm_prop(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

static CUmemAccessDesc maco__rw_access(int device)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof(d));
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = device;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
}

maco_status_t maco_mem_alloc(maco_comm_t comm, size_t bytes, void **ptr_p)
{
    if (comm == NULL || ptr_p == NULL || bytes == 0)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_alloc: comm and ptr_p must not be "
                                                   "NULL and bytes (%zu) must not be 0",
                                                   bytes));
    maco_status_t st = maco__comm_require_gpu(comm, "maco_mem_alloc");
    if (st != MACO_OK)
        return st;
    int dev = comm->cuda_device;
    CUmemAllocationProp prop = maco__vmm_prop(dev);
    size_t gran = 0;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    int created = 0, reserved = 0, mapped = 0;
    maco__alloc_t *a = NULL;
    MACO_CU_GOTO(st, fail, "maco_mem_alloc", cuMemGetAllocationGranularity, &gran, &prop,
                 CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    size_t size = (bytes + gran - 1) / gran * gran;
    MACO_CU_GOTO(st, fail, "maco_mem_alloc", cuMemCreate, &h, size, &prop, 0);
    created = 1;
    MACO_CU_GOTO(st, fail, "maco_mem_alloc", cuMemAddressReserve, &va, size, gran, 0, 0);
    reserved = 1;
    MACO_CU_GOTO(st, fail, "maco_mem_alloc", cuMemMap, va, size, 0, h, 0);
    mapped = 1;
    CUmemAccessDesc access = maco__rw_access(dev);
    MACO_CU_GOTO(st, fail, "maco_mem_alloc", cuMemSetAccess, va, size, &access, 1);
    a = (maco__alloc_t *)calloc(1, sizeof(*a));
    if (a == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM, "maco_mem_alloc: no host memory");
        goto fail;
    }
    a->base = (char *)(uintptr_t)va;
    a->bytes = size;
    a->handle = h;
    a->fd = -1;
    pthread_mutex_lock(&maco__mem_lock);
    a->next = maco__allocs;
    maco__allocs = a;
    pthread_mutex_unlock(&maco__mem_lock);
    MACO_DEBUG(MACO_SUBSYS_MEM, "maco_mem_alloc: %zu bytes (%zu asked) at %p on device %d", size,
               bytes, a->base, dev);
    /* Registered at once, so collectives use it in place (registry.c). */
    if (comm->reg != NULL) {
        st = maco_mem_register(comm, a->base, size, &a->reg);
        if (st != MACO_OK) {
            maco_mem_free(comm, a->base);
            return st;
        }
    }
    *ptr_p = a->base;
    return MACO_OK;
fail:
    if (mapped)
        maco__cu()->cuMemUnmap(va, (bytes + gran - 1) / gran * gran);
    if (reserved)
        maco__cu()->cuMemAddressFree(va, (bytes + gran - 1) / gran * gran);
    if (created)
        maco__cu()->cuMemRelease(h);
    return maco__comm_record(comm, st);
}

maco_status_t maco_mem_alloc_host(maco_comm_t comm, size_t bytes, void **ptr_p)
{
    if (comm == NULL || ptr_p == NULL || bytes == 0)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_alloc_host: comm and ptr_p must "
                                                   "not be NULL and bytes (%zu) must not be 0",
                                                   bytes));
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > ((size_t)1 << 52))
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_alloc_host: bytes (%zu) is larger "
                                                   "than the 4 PiB MACO handles",
                                                   bytes));
    size_t size = (bytes + page - 1) / page * page;
    int fd = memfd_create("maco-host", MFD_CLOEXEC);
    if (fd < 0)
        return maco__comm_record(comm, maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM,
                                                   "maco_mem_alloc_host: memfd_create: %s",
                                                   strerror(errno)));
    if (ftruncate(fd, (off_t)size) != 0) {
        int err = errno;
        close(fd);
        return maco__comm_record(comm, maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM,
                                                   "maco_mem_alloc_host: ftruncate(%zu): %s", size,
                                                   strerror(err)));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        close(fd);
        return maco__comm_record(comm, maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM,
                                                   "maco_mem_alloc_host: mmap(%zu): %s", size,
                                                   strerror(err)));
    }
    if (comm->cuda_device >= 0) {
        cudaError_t cerr =
            cudaHostRegister(p, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
        if (cerr != cudaSuccess) {
            cudaGetLastError();
            munmap(p, size);
            close(fd);
            return maco__comm_record(
                comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                                  "maco_mem_alloc_host: cudaHostRegister(%zu bytes): %s", size,
                                  cudaGetErrorString(cerr)));
        }
    }
    maco__alloc_t *a = (maco__alloc_t *)calloc(1, sizeof(*a));
    if (a == NULL) {
        if (comm->cuda_device >= 0)
            cudaHostUnregister(p);
        munmap(p, size);
        close(fd);
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM,
                                                   "maco_mem_alloc_host: no host memory"));
    }
    a->base = (char *)p;
    a->bytes = size;
    a->is_host = 1;
    a->fd = fd;
    pthread_mutex_lock(&maco__mem_lock);
    a->next = maco__allocs;
    maco__allocs = a;
    pthread_mutex_unlock(&maco__mem_lock);
    *ptr_p = p;
    return MACO_OK;
}

maco_status_t maco_mem_free(maco_comm_t comm, void *ptr)
{
    if (ptr == NULL)
        return MACO_OK;
    pthread_mutex_lock(&maco__mem_lock);
    maco__alloc_t **pp = &maco__allocs, *a = NULL;
    for (; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->base == (char *)ptr) {
            a = *pp;
            *pp = a->next;
            break;
        }
    }
    pthread_mutex_unlock(&maco__mem_lock);
    if (a == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_free: %p was not returned by "
                                                   "maco_mem_alloc or maco_mem_alloc_host",
                                                   ptr));
    maco_status_t st = maco_mem_deregister(a->reg);
    if (a->is_host) {
        if (comm != NULL && comm->cuda_device >= 0 && cudaHostUnregister(a->base) != cudaSuccess)
            cudaGetLastError();
        munmap(a->base, a->bytes);
        close(a->fd);
    } else {
        CUdeviceptr va = (CUdeviceptr)(uintptr_t)a->base;
        MACO_CU_GOTO(st, out, "maco_mem_free", cuMemUnmap, va, a->bytes);
        MACO_CU_GOTO(st, out, "maco_mem_free", cuMemAddressFree, va, a->bytes);
        MACO_CU_GOTO(st, out, "maco_mem_free", cuMemRelease, a->handle);
    }
out:
    free(a);
    return maco__comm_record(comm, st);
}

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

maco_status_t maco_mem_register(maco_comm_t comm, void *ptr, size_t bytes, maco_mem_t *mem_p)
{
    static const char *what = "maco_mem_register";
    if (comm == NULL || ptr == NULL || mem_p == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: comm, ptr and mem_p "
                                                   "must not be NULL"));
    if (bytes == 0)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_register: bytes is 0"));
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
    if (e->kind == MACO__KIND_CUDA_IPC || e->kind == MACO__KIND_POSIX_FD)
        mem->published = maco__registry_publish(comm, mem, p, bytes);
    MACO_DEBUG(MACO_SUBSYS_MEM, "registered %zu bytes at %p (offset %zu in %zu, kind %d)", bytes,
               ptr, offset, alloc_bytes, e->kind);
    *mem_p = mem;
    return MACO_OK;
fail:
    return maco__comm_record(comm, st);
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

/* ------------------------------------------------------------------ import */

/* Same process, other device: the owner's pointer works once peer access is on. */
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

static void maco__import_unmap(maco__import_t *imp)
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

maco_status_t maco_mem_import(maco_comm_t comm, const void *handle, maco_mem_t *mem_p)
{
    if (comm == NULL || handle == NULL || mem_p == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                                                   "maco_mem_import: NULL argument"));
    const uint8_t *p = (const uint8_t *)handle;
    maco__mem_handle_t h;
    maco_status_t st = maco__mem_handle_decode(handle, comm->nranks, comm->rank, &h);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    /* Shared host memory maps without a GPU; everything else needs one. */
    if (h.kind != MACO__KIND_HOST_FD) {
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
    if (owner_token == maco__process_token()) {
        /* Same process (one process driving several GPUs): use the pointer itself. */
        st = maco__import_same_process(comm, kind, owner_device, owner_ptr - offset, alloc_bytes);
        mem->ptr = owner_ptr;
    } else if (maco__get_u64(p + 40) != maco__fnv1a(maco__host_id())) {
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM,
                         "maco_mem_import: rank %d's memory is on another node; CUDA IPC and "
                         "shared memory reach only this node",
                         owner);
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

void maco__mem_unpublish(maco_mem_t mem)
{
    mem->published = 0;
}

int maco__mem_is_host(maco_mem_t mem)
{
    return mem->kind == MACO__KIND_HOST_FD || mem->kind == MACO__KIND_LOCAL;
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
    if (mem->published)
        maco__registry_withdraw(mem->comm, mem);
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
    return MACO_OK;
}
