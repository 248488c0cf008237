/*
 * comm_internal.h - the communicator's insides, shared by src/host and algorithms/.
 *
 * Each rank with a GPU owns one "comm buffer" (one cudaMalloc, exported over CUDA IPC and
 * mapped by every peer of the node). Its layout is identical on every rank:
 *
 *   sem_offset      u64[MACO__NSEM]  semaphore counters peers signal (never reset)
 *   expected_offset u64[MACO__NSEM]  this rank's expected counts (peers never touch them)
 *   counters_offset                  u32 ll_flag, u32 ll_done, i32 error_claim
 *   desc_offset     descriptors:     [parity 2][source rank n][MACO__DESC_BYTES] (LL16)
 *   ll_offset       LL16 scratch:    [parity 2][source rank n][ll_slot_bytes]
 *   rsag_offset     rsag scratch:    [slot rsag_slots][IN n | OUT n][piece_max bytes]
 *
 * Offsets are multiples of 256 bytes. The sizes come from MACO_ALLREDUCE_ONESHOT_MAX,
 * MACO_SCRATCH_SIZE and MACO_ALLREDUCE_RSAG_CTAS, which must agree on all ranks (checked at
 * creation).
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
    MACO__NSEM = 4096,          /* semaphores per rank */
    MACO__MAX_LOCAL_RANKS = 8,  /* collectives support up to this many ranks per node */
    MACO__RSAG_MAX_SLOTS = 128, /* most rsag CTAs (each: own scratch slot, semaphores) */
    MACO__REG_MAX = 1024,       /* registrations per rank collectives can use in place */
    MACO__DESC_BYTES = 128,     /* one rank's in-place descriptor as LL16 packets */
};

/* Registrations published to peers for in-place collectives (registry.c). */
typedef struct maco__registry maco__registry_t;

/* Byte offsets of the fixed counters inside the counters block. */
enum {
    MACO__CTR_LL_FLAG = 0,
    MACO__CTR_LL_DONE = 4,
    MACO__CTR_ERROR_CLAIM = 8,
    MACO__CTR_INPLACE = 16, /* u64: mesh launches in place (maco_collective_get_stats) */
    MACO__CTR_SCRATCH = 24, /* u64: mesh launches through scratch */
};

typedef struct maco__comm_layout {
    size_t sem_offset, expected_offset, counters_offset;
    size_t desc_offset;              /* in-place descriptors (algorithms.h) */
    size_t ll_offset, ll_slot_bytes; /* 4 * oneshot_max: two-shot's two LL16 regions */
    size_t rsag_offset, rsag_piece_max, rsag_slot_bytes;
    int rsag_slots; /* MACO_ALLREDUCE_RSAG_CTAS */
    size_t total_bytes;
    size_t oneshot_max; /* bytes per rank */
} maco__comm_layout_t;

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
    int gpu_ranks; /* ranks on this rank's GPU, this one included (1: not shared) */
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
    maco_memory_channel_device_t *rsag_channels; /* device array [rsag_slots][nranks] */
    maco__registry_t *reg;                       /* NULL without a GPU */
};

/** Copies this thread's last error into the communicator if it has none yet. */
maco_status_t maco__comm_record(maco_comm_t comm, maco_status_t status);

/**
 * Records an asynchronous error found off the caller's thread (a proxy): the first one is
 * kept, with this thread's last error text, and reported by maco_comm_get_async_error().
 */
void maco__comm_set_async_error(maco_comm_t comm, maco_status_t status);

/** True when `mem` is host memory (MACO's shared host memory or other pinned memory). */
int maco__mem_is_host(maco_mem_t mem);

/** MACO_OK when the communicator can run GPU work; else MACO_ERR_UNSUPPORTED with why. */
maco_status_t maco__comm_require_gpu(maco_comm_t comm, const char *fn);

/**
 * Creates `count` channel device handles to `peer` over `local` and `remote`, taking
 * `count` semaphores from the pool and exchanging their ids with the peer (pairwise,
 * blocking). Writes handles[0..count).
 */
maco_status_t maco__memory_channels_setup(maco_comm_t comm, int peer, maco_mem_t local,
                                          maco_mem_t remote, int count,
                                          maco_memory_channel_device_t *handles);

/* ---- registry.c (its file comment has the protocol) ---- */

/** Creates this rank's directory and maps every peer's (collective; at creation). */
maco_status_t maco__registry_setup(maco_comm_t comm);
/** Unmaps everything the registry mapped; live registrations stay registered. */
void maco__registry_free(maco_comm_t comm);
/** Publishes a device-memory registration of this rank; returns 1 if published. */
int maco__registry_publish(maco_comm_t comm, maco_mem_t mem, const void *ptr, size_t bytes);
/** Marks a published registration dead (at deregistration). */
void maco__registry_withdraw(maco_comm_t comm, maco_mem_t mem);
/** Id (1-based) of a live published registration holding [ptr, ptr+bytes), 0 if none;
 * *offset_p: ptr's offset inside it. */
uint32_t maco__registry_find(maco_comm_t comm, const void *ptr, size_t bytes, uint64_t *offset_p);
/** Maps peers' new entries and writes seen[0..nranks) (entries looked at, per peer). */
void maco__registry_refresh(maco_comm_t comm, uint32_t *seen_p);
/** Device addresses of the mapped-address table and the kernels' cache of it
 * ([nranks][MACO__REG_MAX] u64 each), NULL without a registry. */
const uint64_t *maco__registry_table(maco_comm_t comm);
uint64_t *maco__registry_cache(maco_comm_t comm);
/** memory.c: forget that `mem` is published (its communicator is going away). */
void maco__mem_unpublish(maco_mem_t mem);

#ifdef __cplusplus
}
#endif

#endif /* MACO_COMM_INTERNAL_H */
