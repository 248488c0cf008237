/* alloc.c - memory MACO allocates: device memory through cuMem, exportable as a POSIX file
 * descriptor (maco_mem_alloc), and host memory in a memfd that peers map (maco_mem_alloc_host). */
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

/* cuMem memory of `bytes` (rounded up to the granularity) on `dev`, exportable by POSIX file
 * descriptor, recorded in maco__allocs (maco_mem_free finds it there). `what` names the
 * public call in messages. */
static maco_status_t maco__mem_alloc_vmm(const char *what, int dev, size_t bytes,
                                         maco__alloc_t **a_p)
{
    maco_status_t st = MACO_OK;
    CUmemAllocationProp prop = maco__vmm_prop(dev);
    size_t gran = 0, size = 0;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    int created = 0, reserved = 0, mapped = 0;
    maco__alloc_t *a = NULL;
    MACO_CU_GOTO(st, fail, what, cuMemGetAllocationGranularity, &gran, &prop,
                 CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    size = (bytes + gran - 1) / gran * gran;
    MACO_CU_GOTO(st, fail, what, cuMemCreate, &h, size, &prop, 0);
    created = 1;
    MACO_CU_GOTO(st, fail, what, cuMemAddressReserve, &va, size, gran, 0, 0);
    reserved = 1;
    MACO_CU_GOTO(st, fail, what, cuMemMap, va, size, 0, h, 0);
    mapped = 1;
    CUmemAccessDesc access = maco__rw_access(dev);
    MACO_CU_GOTO(st, fail, what, cuMemSetAccess, va, size, &access, 1);
    /* Every GPU of the process with peer access to `dev` may read and write it too, as with
     * ncclMemAlloc: a process driving several GPUs may copy between them with another device
     * current (nccl-tests' hypercube_perf does); cuMem grants access per device. */
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
        (void)cudaGetLastError();
        ndev = 0;
    }
    for (int peer = 0; peer < ndev; peer++) {
        int can = 0;
        if (peer == dev || cudaDeviceCanAccessPeer(&can, peer, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        if (!can)
            continue;
        CUmemAccessDesc pa = maco__rw_access(peer);
        CUresult r = maco__cu()->cuMemSetAccess(va, size, &pa, 1); /* present: used above */
        if (r != CUDA_SUCCESS) {
            char txt[160];
            st = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                             "%s: granting device %d access to %zu bytes of device %d "
                             "(cuMemSetAccess) failed: %s",
                             what, peer, size, dev, maco__cu_error_text(r, txt, sizeof(txt)));
            goto fail;
        }
    }
    a = (maco__alloc_t *)calloc(1, sizeof(*a));
    if (a == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM, "%s: no host memory", what);
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
    MACO_DEBUG(MACO_SUBSYS_MEM, "%s: %zu bytes (%zu asked) at %p on device %d", what, size, bytes,
               a->base, dev);
    *a_p = a;
    return MACO_OK;
fail:
    if (mapped)
        maco__cu()->cuMemUnmap(va, size);
    if (reserved)
        maco__cu()->cuMemAddressFree(va, size);
    if (created)
        maco__cu()->cuMemRelease(h);
    return st;
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
    maco__alloc_t *a = NULL;
    st = maco__mem_alloc_vmm("maco_mem_alloc", comm->cuda_device, bytes, &a);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    /* Registered at once, so collectives use it in place (algorithms/common/registry.c), when the
     * communicator has them (its extension took note of registrations: comm_internal.h). */
    if (comm->coll != NULL) {
        st = maco_mem_register(comm, a->base, a->bytes, &a->reg);
        if (st != MACO_OK) {
            maco_mem_free(comm, a->base);
            return st;
        }
    }
    *ptr_p = a->base;
    return MACO_OK;
}

maco_status_t maco_mem_alloc_device(int cuda_device, size_t bytes, void **ptr_p)
{
    if (ptr_p == NULL || bytes == 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_alloc_device: ptr_p must not be NULL and bytes (%zu) must "
                           "not be 0",
                           bytes);
    char why[512];
    int n = maco_cuda_device_count(why, sizeof(why));
    if (n == 0)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM, "maco_mem_alloc_device: %s", why);
    int dev = cuda_device;
    if (dev == -1) {
        cudaError_t e = cudaGetDevice(&dev);
        if (e != cudaSuccess)
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_MEM,
                               "maco_mem_alloc_device: cudaGetDevice: %s (%s)", cudaGetErrorName(e),
                               cudaGetErrorString(e));
    } else if (dev < 0 || dev >= n) {
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_alloc_device: cuda_device %d is outside [-1, %d)", dev, n);
    }
    maco__alloc_t *a = NULL;
    maco_status_t st = maco__mem_alloc_vmm("maco_mem_alloc_device", dev, bytes, &a);
    if (st != MACO_OK)
        return st;
    *ptr_p = a->base;
    return MACO_OK;
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
                                                   "maco_mem_alloc, maco_mem_alloc_device or "
                                                   "maco_mem_alloc_host",
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
