/*
 * fifo.c - host side of the trigger FIFO (protocol: maco/device/fifo.h).
 *
 * Host pushers mirror the device push: an atomic add on the head, a bounded wait for space,
 * then the first word (relaxed) and the second word with its lap parity (release). The
 * consumer loads the second word with acquire; when its parity matches the lap, the first
 * word is complete too (a GPU writes both in one 128-bit store; a host pusher orders them by
 * the release). x86 and Arm both keep these orders with the C11 atomics used here.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"
#include "proxy/fifo.h"
#include "src/host/os/socket.h"

/* Host memory the proxy writes and GPUs read: tail, flush_done, state. */
typedef struct maco__fifo_host_block {
    uint64_t tail;
    uint64_t flush_done;
    uint32_t state;
    uint32_t pad[11];
} maco__fifo_host_block_t;

/*
 * Pinned host memory mapped for the GPU, zeroed, its pages preferably on NUMA node `node`:
 * mmap, mbind(MPOL_PREFERRED) when node >= 0, first touch, cudaHostRegister. (cudaHostAlloc
 * places pages wherever the calling thread runs, which may be the other socket.) *map_bytes_p
 * gets the mapped size, for maco__pinned_free.
 */
static maco_status_t maco__pinned_alloc(size_t bytes, int node, void **host_p, void **dev_p,
                                        size_t *map_bytes_p)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t map_bytes = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    /* cppcheck-suppress invalidFunctionArg ; MAP_ANONYMOUS takes fd -1 (mmap(2)) */
    void *mem = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "FIFO: mmap of %zu bytes: %s",
                           map_bytes, strerror(errno));
    if (node >= 0 && node < 64) {
        unsigned long mask = 1ul << node;
        /* MPOL_PREFERRED (1): this node if it has memory, else any. maxnode 65: the kernel
         * reads maxnode - 1 bits of the mask (mbind(2), NOTES). */
        if (syscall(SYS_mbind, mem, map_bytes, 1, &mask, 65, 0) != 0)
            MACO_DEBUG(MACO_SUBSYS_PROXY,
                       "FIFO: mbind to NUMA node %d: %s (placement left to "
                       "the kernel)",
                       node, strerror(errno));
    }
    memset(mem, 0, map_bytes);
    cudaError_t err = cudaHostRegister(mem, map_bytes, cudaHostRegisterMapped);
    if (err == cudaSuccess)
        err = cudaHostGetDevicePointer(dev_p, mem, 0);
    if (err != cudaSuccess) {
        cudaGetLastError();
        cudaHostUnregister(mem);
        cudaGetLastError();
        munmap(mem, map_bytes);
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                           "FIFO: pinning %zu bytes of host memory for the GPU: %s", map_bytes,
                           cudaGetErrorString(err));
    }
    *host_p = mem;
    *map_bytes_p = map_bytes;
    return MACO_OK;
}

static void maco__pinned_free(void *mem, size_t map_bytes)
{
    if (mem == NULL)
        return;
    cudaHostUnregister(mem);
    cudaGetLastError();
    munmap(mem, map_bytes);
}

maco_status_t maco__fifo_create(maco__fifo_t *f, uint64_t capacity, int on_device,
                                const maco_device_wait_bound_t *bound, int numa_node)
{
    memset(f, 0, sizeof(*f));
    f->on_device = on_device;
    size_t ring_bytes = capacity * sizeof(maco_trigger_t);
    maco_status_t st = MACO_OK;
    maco__fifo_host_block_t *hb = NULL, *hb_dev = NULL;
    maco_trigger_t *ring_dev = NULL;
    if (on_device) {
        /* Ring and published words in mapped pinned memory, head and tail cache on the GPU. */
        st = maco__pinned_alloc(ring_bytes, numa_node, (void **)&f->ring, (void **)&ring_dev,
                                &f->ring_map_bytes);
        if (st == MACO_OK)
            st = maco__pinned_alloc(sizeof(*hb), numa_node, (void **)&hb, (void **)&hb_dev,
                                    &f->block_map_bytes);
        if (st != MACO_OK)
            goto fail;
        MACO_CUDA_GOTO(cudaMalloc(&f->device_block, 2 * sizeof(uint64_t)), st, fail);
        MACO_CUDA_GOTO(cudaMemset(f->device_block, 0, 2 * sizeof(uint64_t)), st, fail);
        MACO_CUDA_GOTO(cudaDeviceSynchronize(), st, fail);
        f->view.head = (uint64_t *)f->device_block;
        f->view.tail_cache = (uint64_t *)f->device_block + 1;
    } else {
        /* aligned_alloc needs a size that is a multiple of the alignment (C11 7.22.3.1). */
        f->ring = (maco_trigger_t *)aligned_alloc(64, (ring_bytes + 63) / 64 * 64);
        hb = (maco__fifo_host_block_t *)aligned_alloc(64, sizeof(*hb));
        uint64_t *head = (uint64_t *)aligned_alloc(64, 64);
        if (f->ring == NULL || hb == NULL || head == NULL) {
            free(head);
            st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "FIFO: no host memory");
            goto fail;
        }
        *head = 0;
        f->view.head = head;
        f->view.tail_cache = NULL;
        ring_dev = f->ring;
        hb_dev = hb;
    }
    memset(f->ring, 0, ring_bytes);
    memset(hb, 0, sizeof(*hb));
    f->host_block = hb;
    f->tail_pub = &hb->tail;
    f->flush_done = &hb->flush_done;
    f->state = &hb->state;
    f->view.triggers = ring_dev;
    f->view.tail = &hb_dev->tail;
    f->view.flush_done = &hb_dev->flush_done;
    f->view.proxy_state = &hb_dev->state;
    f->view.capacity = capacity;
    f->view.bound = *bound;
    return MACO_OK;
fail:
    f->host_block = hb;
    maco__fifo_destroy(f);
    return st;
}

void maco__fifo_destroy(maco__fifo_t *f)
{
    if (f->on_device) {
        maco__pinned_free(f->ring, f->ring_map_bytes);
        maco__pinned_free(f->host_block, f->block_map_bytes);
        if (f->device_block)
            cudaFree(f->device_block);
        cudaGetLastError();
    } else {
        free(f->ring);
        free(f->host_block);
        free(f->view.head);
    }
    memset(f, 0, sizeof(*f));
}

static void maco__cpu_relax(uint32_t spins)
{
    if (spins < 256) {
        maco__cpu_pause();
    } else {
        sched_yield();
    }
}

maco_status_t maco__fifo_host_push(const maco_fifo_device_t *f, maco_trigger_t t,
                                   int64_t timeout_ms, uint64_t *pos_p)
{
    /*
     * A position is reserved (compare-and-swap on head) only while the proxy runs and the
     * ring has room for it, so every reserved slot is published: a push that fails leaves
     * nothing behind. (Reserving first with fetch_add and failing while waiting for room
     * left an unpublished slot the proxy stopped at forever.) Host pushers are CPU threads,
     * where a CAS loop costs nothing that matters; device pushers keep their atomicAdd
     * (maco/device/fifo.h says what a device push that gives up leaves behind).
     */
    uint64_t pos = __atomic_load_n(f->head, __ATOMIC_RELAXED);
    int64_t deadline = 0;
    uint32_t spins = 0;
    for (;;) {
        if (__atomic_load_n(f->proxy_state, __ATOMIC_ACQUIRE) != MACO_PROXY_RUNNING)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                               "the proxy is not running (never started, or stopped): the "
                               "trigger was not queued");
        uint64_t tail = __atomic_load_n(f->tail, __ATOMIC_ACQUIRE);
        if (pos < tail + f->capacity) {
            if (__atomic_compare_exchange_n(f->head, &pos, pos + 1, 1, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
                break;
            continue; /* another thread took it: pos now holds the current head */
        }
        if (deadline == 0)
            deadline = maco__deadline_ms(timeout_ms);
        else if (timeout_ms > 0 && maco__now_ms() > deadline)
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_PROXY,
                               "the proxy's FIFO stayed full for %lld ms (next position %llu, "
                               "proxy at %llu of %llu slots); nothing was queued",
                               (long long)timeout_ms, (unsigned long long)pos,
                               (unsigned long long)tail, (unsigned long long)f->capacity);
        maco__cpu_relax(spins++);
        pos = __atomic_load_n(f->head, __ATOMIC_RELAXED);
    }
    maco_trigger_t *slot = f->triggers + (pos & (f->capacity - 1));
    __atomic_store_n(&slot->src_word, t.src_word, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->dst_word, t.dst_word | maco_fifo_parity(pos, f->capacity),
                     __ATOMIC_RELEASE);
    *pos_p = pos;
    return MACO_OK;
}

maco_status_t maco__fifo_host_wait_flush(const maco_fifo_device_t *f, uint64_t pos,
                                         int64_t timeout_ms)
{
    int64_t deadline = maco__deadline_ms(timeout_ms);
    uint32_t spins = 0;
    while (__atomic_load_n(f->flush_done, __ATOMIC_ACQUIRE) <= pos) {
        if (__atomic_load_n(f->proxy_state, __ATOMIC_ACQUIRE) != MACO_PROXY_RUNNING &&
            __atomic_load_n(f->flush_done, __ATOMIC_ACQUIRE) <= pos)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                               "flush of position %llu: the proxy stopped before completing it",
                               (unsigned long long)pos);
        if (timeout_ms > 0 && maco__now_ms() > deadline)
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_PROXY,
                               "flush of position %llu did not complete in %lld ms (done up to "
                               "%llu)",
                               (unsigned long long)pos, (long long)timeout_ms,
                               (unsigned long long)*f->flush_done);
        maco__cpu_relax(spins++);
    }
    return MACO_OK;
}

int maco__fifo_peek(maco__fifo_t *f, maco_trigger_t *t)
{
    uint64_t cap = f->view.capacity;
    maco_trigger_t *slot = f->ring + (f->tail & (cap - 1));
    uint64_t dst_word = __atomic_load_n(&slot->dst_word, __ATOMIC_ACQUIRE);
    if ((dst_word & (1ull << 63)) != maco_fifo_parity(f->tail, cap))
        return 0;
    t->dst_word = dst_word & ~(1ull << 63);
    t->src_word = __atomic_load_n(&slot->src_word, __ATOMIC_RELAXED);
    return 1;
}

void maco__fifo_pop(maco__fifo_t *f)
{
    f->tail++;
    __atomic_store_n(f->tail_pub, f->tail, __ATOMIC_RELEASE);
}

uint64_t maco__fifo_unpublished(const maco__fifo_t *f, uint64_t head)
{
    uint64_t cap = f->view.capacity, missing = 0;
    for (uint64_t pos = f->tail; pos < head && pos < f->tail + cap; pos++) {
        const maco_trigger_t *slot = f->ring + (pos & (cap - 1));
        uint64_t dst_word = __atomic_load_n(&slot->dst_word, __ATOMIC_ACQUIRE);
        missing += (dst_word & (1ull << 63)) != maco_fifo_parity(pos, cap);
    }
    return missing + (head > f->tail + cap ? head - f->tail - cap : 0);
}
