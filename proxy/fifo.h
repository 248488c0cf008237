/*
 * fifo.h - the host side of the trigger FIFO (maco/device/fifo.h has the protocol and the
 * trigger layout): creating the ring and the words the proxy publishes, host pushes, and the
 * consumer's peek and pop. Used by the proxy (proxy.c) and by host threads' pushes
 * (port_channel.c); it knows nothing of proxies or channels.
 */
#ifndef MACO_PROXY_FIFO_H
#define MACO_PROXY_FIFO_H

#include <stdint.h>

#include "maco/device/error.h"
#include "maco/device/fifo.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A pause hint for busy-wait loops (the CPU's spin-loop instruction). */
static inline void maco__cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* ------------------------------------------------------------------ FIFO (host side) */

typedef struct maco__fifo {
    maco_fifo_device_t view; /* what pushers use (device addresses for a device FIFO) */
    int on_device;           /* head in device memory, ring in mapped pinned memory */
    uint64_t tail;           /* the consumer's next position (proxy thread only) */
    /* Host addresses of what the proxy writes. */
    maco_trigger_t *ring;
    volatile uint64_t *tail_pub;
    volatile uint64_t *flush_done;
    volatile uint32_t *state;
    void *host_block;                       /* tail, flush_done, state (one allocation) */
    size_t ring_map_bytes, block_map_bytes; /* device FIFO: sizes of the two mappings */
    void *device_block;                     /* head and tail cache (device FIFO) */
} maco__fifo_t;

/**
 * Creates a FIFO of `capacity` triggers (a power of two) for GPU or host pushers. For GPU
 * pushers, the ring and the words the proxy publishes are pinned host memory placed on NUMA
 * node `numa_node` (preferred, not required; -1: wherever the kernel puts it).
 */
maco_status_t maco__fifo_create(maco__fifo_t *f, uint64_t capacity, int on_device,
                                const maco_device_wait_bound_t *bound, int numa_node);
void maco__fifo_destroy(maco__fifo_t *f);

/** Host-side push (any thread); bounded by `timeout_ms`. *pos_p gets the position. */
maco_status_t maco__fifo_host_push(const maco_fifo_device_t *f, maco_trigger_t t,
                                   int64_t timeout_ms, uint64_t *pos_p);

/** Host-side wait for a flush at `pos` (flush_done > pos), bounded. */
maco_status_t maco__fifo_host_wait_flush(const maco_fifo_device_t *f, uint64_t pos,
                                         int64_t timeout_ms);

/** Consumer: 1 and *t when the trigger at f->tail has been published, else 0. */
int maco__fifo_peek(maco__fifo_t *f, maco_trigger_t *t);

/** Consumer: done with the trigger at f->tail; publishes the new tail. */
void maco__fifo_pop(maco__fifo_t *f);

/**
 * Positions in [f->tail, head) whose slot was never published (pushers that reserved a
 * position and gave up). Call only while no consumer runs.
 */
uint64_t maco__fifo_unpublished(const maco__fifo_t *f, uint64_t head);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PROXY_FIFO_H */
