/*
 * comm_internal.h - the communicator's insides, shared by src/host, proxy/ and algorithms/.
 *
 * Each rank with a GPU owns one "comm buffer" (one cudaMalloc, exported over CUDA IPC and
 * mapped by every peer of the node) holding what every channel needs. Its layout is identical
 * on every rank:
 *
 *   sem_offset      u64[MACO__NSEM]  semaphore counters peers signal (never reset)
 *   expected_offset u64[MACO__NSEM]  this rank's expected counts (peers never touch them)
 *   counters_offset                  256 bytes: i32 error_claim at MACO__CTR_ERROR_CLAIM
 *
 * Offsets are multiples of 256 bytes. The collectives keep their scratch (LL packets,
 * descriptors, mesh pieces) in a buffer of their own, set up through the extension below
 * (algorithms/common/setup.c); the communicator knows nothing of it.
 *
 * Layers (docs/design.md): comm_base.c (errors, the GPU check, the extension) is a leaf that
 * every file above the bootstrap may call; comm.c calls memory (its buffer) and never the
 * collectives, which reach it only through the extension they install.
 */
#ifndef MACO_COMM_INTERNAL_H
#define MACO_COMM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "maco/comm.h"
#include "maco/device/error.h"
#include "maco/device/memory_channel.h"
#include "maco/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MACO__NSEM = 4096,         /* semaphores per rank */
    MACO__MAX_LOCAL_RANKS = 8, /* collectives support up to this many ranks per node */
};

/* Byte offsets of the fixed counters inside the comm buffer's counters block. */
enum {
    MACO__CTR_ERROR_CLAIM = 8, /* i32: the first device-side error claims it */
};

typedef struct maco__comm_layout {
    size_t sem_offset, expected_offset, counters_offset;
    size_t total_bytes;
} maco__comm_layout_t;

/*
 * What a layer above the communicator adds to every communicator: the collectives'
 * (maco__collectives_extension, below). All calls are optional (NULL: nothing to do).
 *   setup:         collective over the communicator's ranks, at creation, once the
 *                  communicator's own GPU resources exist; may call maco__comm_set_unavailable
 *                  and return MACO_OK (the communicator then stays bootstrap-only).
 *   destroy:       at maco_comm_destroy (also after a failed setup), before the comm buffer
 *                  is freed; the device is idle.
 *   on_register:   a device-memory registration of this rank was made: returns 1 if the
 *                  extension took note of it (then on_deregister follows), else 0.
 *   on_deregister: that registration is going away.
 */
typedef struct maco__comm_ext {
    maco_status_t (*setup)(maco_comm_t comm);
    void (*destroy)(maco_comm_t comm);
    int (*on_register)(maco_comm_t comm, maco_mem_t mem, const void *ptr, size_t bytes);
    void (*on_deregister)(maco_comm_t comm, maco_mem_t mem);
} maco__comm_ext_t;

/*
 * How the collectives register with every communicator: algorithms/common/setup.c defines this
 * function, which returns their extension, and the communicator calls it through
 * maco__comm_extension (at creation, at destruction, when memory is registered). It is
 * declared weak, so that this layer names the hook without depending on the layer above it
 * (src/host never includes or calls algorithms/: docs/design.md, "Layers"): libmaco.so always
 * has the definition; a program linked with libmaco.a has it when it uses a collective (a weak
 * reference pulls no object out of an archive), so a program without collectives carries none
 * of their code, and then the function's address is NULL. A library constructor that installed
 * the extension did the same, but a reader of the communicator could not find who set it.
 */
const maco__comm_ext_t *maco__collectives_extension(void) __attribute__((weak));

/** The extension of every communicator: maco__collectives_extension()'s, or NULL where the
 * collectives are not linked in. */
const maco__comm_ext_t *maco__comm_extension(void);

struct maco_comm {
    maco_bootstrap_t bs;
    int owns_bootstrap;
    int rank, nranks;
    int local_rank, local_nranks, node, nnodes;
    int cuda_device;           /* -1: none */
    char gpu_unavailable[640]; /* why GPU operations are unsupported ("" when they work) */

    pthread_mutex_t error_lock;
    volatile int32_t host_async_status; /* first asynchronous error of a proxy, 0 = none */
    maco_status_t first_status;
    char first_error[1024];

    /* GPU resources (valid when gpu_unavailable is ""). */
    int gpu_ranks;              /* ranks on this rank's GPU, this one included (1: not shared) */
    int32_t device_waits_ended; /* maco__comm_end_device_waits: 0, 2 writing, 1 done (atomic) */
    /* A stream of its own, never given work, that maco_comm_get_async_error queries for the
     * context's sticky error (created at the first query; atomic). */
    void *probe_stream;
    int any_gpu_shared; /* 1 when some GPU of the job runs several ranks (equal on all ranks) */
    /* The most CTAs a kernel that waits on peers or on its own grid may launch: over all
     * ranks, min(SM count its context reports / ranks on its GPU), at least 1. One CTA per
     * SM always fits, so every CTA of every rank sharing a GPU is resident at once
     * (maco_comm_get_coresident_ctas in maco/comm.h). */
    int coresident_ctas;
    uint64_t timeout_ns;
    maco__comm_layout_t layout;
    char *buf;                           /* this rank's comm buffer */
    maco_mem_t buf_mem;                  /* its registration */
    char **peer_buf;                     /* [nranks] mapped comm buffers (own: buf) */
    maco_mem_t *peer_buf_mem;            /* [nranks] imports (own: NULL) */
    int sem_next;                        /* bump allocator over the semaphore counters */
    maco_device_error_t *err_report;     /* host address (mapped pinned) */
    maco_device_error_t *err_report_dev; /* its device address */
    maco_device_wait_bound_t bound;
    void *coll; /* the extension's state (algorithms/common/setup.c: maco__coll_t), or NULL */
    int64_t polled_at_ms;      /* when maco_comm_get_async_error last read the bootstrap's links */
    char ext_unavailable[256]; /* why the extension set nothing up ("" when it did or was not asked)
                                */
};

/**
 * The communicator's asynchronous status as maco_comm_get_async_error gives it, without asking
 * the CUDA context (a proxy's error, a device-side report): cheap, for every launch path.
 */
maco_status_t maco__comm_async_status(maco_comm_t comm);

/** Records that the communicator was revoked by `by_rank` (this rank: maco_comm_revoke; a
 * peer: the bootstrap's callback when its REVOKE frame arrives): MACO_ERR_REVOKED as the first
 * error and the asynchronous status, and the device waits ended. `ctx` is the communicator. */
void maco__comm_on_revoke(void *ctx, int by_rank);

/**
 * The refusal of work on a communicator whose asynchronous status is `async_st` (not MACO_OK):
 * MACO_ERR_REVOKED when it was revoked (destroy it or shrink it), else MACO_ERR_INVALID_USAGE
 * (it failed: destroy it); logged once with `who` (the call) and the first error, and recorded.
 */
maco_status_t maco__comm_refuse(maco_comm_t comm, const char *who, maco_status_t async_st,
                                unsigned subsys);

/** Copies this thread's last error into the communicator if it has none yet. */
maco_status_t maco__comm_record(maco_comm_t comm, maco_status_t status);

/**
 * Records an asynchronous error found off the caller's thread (a proxy): the first one is
 * kept, with this thread's last error text, and reported by maco_comm_get_async_error().
 */
void maco__comm_set_async_error(maco_comm_t comm, maco_status_t status);
/* Sets the device claim word so every device wait of `comm` returns at once (once per
 * communicator; later calls do nothing). Any thread; blocks for one 4-byte copy. MACO_OK, or
 * MACO_ERR_CUDA. Used by maco_comm_abort and, for MACO_ERR_REMOTE, by the line above. */
maco_status_t maco__comm_end_device_waits(maco_comm_t comm);

/**
 * Collective: serializes `mine`, allgathers every rank's handle over the bootstrap and imports
 * each peer's: peer_mem[r] (NULL at this rank) and peer_ptr[r] (this rank: mine's pointer).
 * On failure the imports made so far stay in peer_mem for the caller to deregister.
 */
maco_status_t maco__mem_exchange(maco_comm_t comm, maco_mem_t mine, char **peer_ptr,
                                 maco_mem_t *peer_mem);

/** True when `mem` is host memory (MACO's shared host memory or other pinned memory). */
int maco__mem_is_host(maco_mem_t mem);

/** True when `mem` was imported from another node: nothing of it is mapped here. */
int maco__mem_is_remote(maco_mem_t mem);

/** The buffer's address in its owner's process (a registration: its own pointer). */
uint64_t maco__mem_owner_addr(maco_mem_t mem);

/** An allocation of this process that holds registered memory. */
typedef struct maco__mem_region {
    char *base;   /* the allocation's start (host or device address) */
    size_t bytes; /* its size */
    int is_host;  /* host memory (else device memory of `device`) */
    int device;
} maco__mem_region_t;

/**
 * Finds the registration of this process whose allocation holds [addr, addr + bytes) and
 * writes that allocation to *r. How a network transport checks what a peer says it will write
 * here: only registered memory can be named. MACO_ERR_INVALID_ARGUMENT (logged, with the
 * range) when no registration holds it. Thread-safe.
 */
maco_status_t maco__mem_lookup(uint64_t addr, uint64_t bytes, maco__mem_region_t *r);

/** MACO_OK when the communicator can run GPU work; else MACO_ERR_UNSUPPORTED with why. */
maco_status_t maco__comm_require_gpu(maco_comm_t comm, const char *fn);

/*
 * Checks that `stream` can carry work of the communicator: a stream created on another
 * device than the communicator's is refused (MACO_ERR_INVALID_ARGUMENT naming both devices,
 * recorded; `fn` starts the message). 0 (NULL), cudaStreamLegacy and cudaStreamPerThread
 * name a stream of the current device, so they always pass: every launch runs with the
 * communicator's device current (cuda_util.h, device scopes), where they are that device's
 * legacy default stream or the thread's per-thread stream. A driver too old to say which
 * device a stream has (cudaStreamGetDevice fails) passes too: the launch then fails with
 * CUDA's error if the stream is of another device. Not blocking.
 */
maco_status_t maco__comm_check_stream(maco_comm_t comm, void *stream, const char *fn);

/** Makes GPU operations unsupported from now on, saying `why` (the first reason is kept). */
void maco__comm_set_unavailable(maco_comm_t comm, const char *why);

/**
 * Creates `count` channel device handles to `peer` over `local` and `remote`, taking
 * `count` semaphores from the pool and exchanging their ids with the peer (pairwise,
 * blocking). Writes handles[0..count).
 */
maco_status_t maco__memory_channels_setup(maco_comm_t comm, int peer, maco_mem_t local,
                                          maco_mem_t remote, int count,
                                          maco_memory_channel_device_t *handles);

/** memory (register.c): forget that `mem` is published (its communicator is going away). */
void maco__mem_unpublish(maco_mem_t mem);

#ifdef __cplusplus
}
#endif

#endif /* MACO_COMM_INTERNAL_H */
