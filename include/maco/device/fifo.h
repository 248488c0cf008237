/*
 * maco/device/fifo.h - the trigger FIFO between device code (or host threads) and a proxy.
 *
 * Protocol (docs/design.md, "Trigger FIFO"): a power-of-two ring of 128-bit triggers in host memory
 * (host-mapped pinned memory when GPUs push). A pusher reserves position `pos` with an atomic
 * add on the head counter (device memory when GPUs push), waits (bounded) while the ring is
 * full (pos - tail >= capacity, `tail` being the proxy's published position), then publishes
 * the trigger at slot pos % capacity with ONE 128-bit store at system scope, with release
 * semantics (maco_fifo_push), or after a GPU-scope fence where the reader of the data is this
 * GPU's copy engine (port channels of the CUDA copy transport, maco/device/port_channel.h),
 * or relaxed where the trigger carries no data (a flush alone: maco_fifo_push_relaxed). The
 * trigger's top bit carries the lap parity ((pos / capacity) & 1) ^ 1, so a slot never needs
 * clearing: the proxy, expecting position `tail`, polls the slot's second word until its top bit
 * equals that lap's parity, reads the first word after it (acquire), handles the trigger, and
 * publishes tail + 1 with a release store. With a release push, the trigger's store pairs with
 * the proxy's acquire load: whatever the pusher wrote before pushing (the data of a put) is
 * visible to the proxy, and to the copy it starts, when it sees the trigger. A push after a
 * GPU-scope fence makes the pusher's writes visible in this GPU's memory system before the
 * trigger leaves the SM; that the copy engine then reads them is how the hardware behaves
 * (the engines read through the same L2), not something the PTX memory model states, which
 * has no copy engines and no CPU in GPU scope. The ring relies on the 16-byte store reaching
 * host memory whole (one PCIe write), as MSCCL++'s FIFO does; PTX itself only promises the
 * two 8-byte halves.
 *
 * Trigger layout (two little-endian 64-bit words: `src_word`, where the data comes from or
 * the data itself, then `dst_word`, where it goes, what to do and the lap parity):
 *   src_word bits  0..35  src_offset   bytes into the channel's source buffer   (36 bits: 64 GiB)
 *   src_word bits 36..63  size[0..27]  low 28 bits of the transfer size in bytes
 *   dst_word bits  0..35  dst_offset   bytes into the channel's destination buffer (64 GiB)
 *   dst_word bits 36..47  channel      port channel id within its proxy     (12 bits: 4096)
 *   dst_word bits 48..50  type         MACO_TRIGGER_DATA | _SIGNAL | _FLUSH (any combination)
 *   dst_word bits 51..54  size[28..31] high 4 bits of the size (size < 4 GiB per trigger;
 *                                      the device and host put calls split larger transfers)
 *   dst_word bit  55      inline       the data travels in the trigger: src_word is the value
 *                                      itself (little-endian, zero-extended), not an offset
 *                                      and size
 *   dst_word bit  56      inline32     with inline: the value is 4 bytes (else 8)
 *   dst_word bits 57..62  reserved, zero
 *   dst_word bit  63      lap parity (written by the push; callers pass it as zero)
 *
 * Inline triggers: a device put of 4 or 8 naturally aligned bytes on a CUDA copy channel
 * reads the value when it pushes and sends it in src_word; the proxy writes it (and a signal after
 * it) with stream memory operations in one cuStreamBatchMemOp call in place of a copy, or as
 * staged copies where those are unavailable (maco/device/port_channel.h).
 */
#ifndef MACO_DEVICE_FIFO_H
#define MACO_DEVICE_FIFO_H

#include <stdint.h>

#include "maco/device/atomics.h"
#include "maco/device/macros.h"
#include "maco/device/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MACO_TRIGGER_DATA 1u
#define MACO_TRIGGER_SIGNAL 2u
#define MACO_TRIGGER_FLUSH 4u

#define MACO_TRIGGER_OFFSET_BITS 36
#define MACO_TRIGGER_SIZE_BITS 32
#define MACO_TRIGGER_CHANNEL_BITS 12
#define MACO_TRIGGER_TYPE_BITS 3
#define MACO_TRIGGER_MAX_OFFSET ((1ull << MACO_TRIGGER_OFFSET_BITS) - 1)
#define MACO_TRIGGER_MAX_SIZE ((1ull << MACO_TRIGGER_SIZE_BITS) - 1)
#define MACO_TRIGGER_MAX_CHANNELS (1u << MACO_TRIGGER_CHANNEL_BITS)
#define MACO_TRIGGER_INLINE_BIT 55
#define MACO_TRIGGER_INLINE32_BIT 56

typedef struct maco_trigger {
    uint64_t src_word;
    uint64_t dst_word;
} maco_trigger_t;

MACO_STATIC_ASSERT(sizeof(maco_trigger_t) == 16, "a trigger is 128 bits");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_trigger_t) == 8, "a trigger is 8-byte aligned (ring: 16)");
MACO_STATIC_ASSERT(MACO_TRIGGER_OFFSET_BITS + 28 == 64, "src_word is full");
MACO_STATIC_ASSERT(MACO_TRIGGER_OFFSET_BITS + MACO_TRIGGER_CHANNEL_BITS + MACO_TRIGGER_TYPE_BITS +
                           4 + 2 + 6 + 1 ==
                       64,
                   "dst_word is full");
MACO_STATIC_ASSERT(MACO_TRIGGER_INLINE_BIT == MACO_TRIGGER_OFFSET_BITS + MACO_TRIGGER_CHANNEL_BITS +
                                                  MACO_TRIGGER_TYPE_BITS + 4,
                   "the inline bit follows the size's high bits");
MACO_STATIC_ASSERT((1ull << MACO_TRIGGER_OFFSET_BITS) >= (64ull << 30), "offsets reach 64 GiB");
MACO_STATIC_ASSERT(MACO_TRIGGER_MAX_CHANNELS >= 4096, "at least 4096 channels per proxy");

/** Builds a trigger (lap parity zero). Arguments beyond their widths are masked. */
static inline MACO_HOST_DEVICE maco_trigger_t maco_trigger_make(uint32_t type, uint32_t channel,
                                                                uint64_t dst_offset,
                                                                uint64_t src_offset, uint64_t size)
{
    maco_trigger_t t;
    t.src_word = (src_offset & MACO_TRIGGER_MAX_OFFSET) | ((size & 0xFFFFFFFull) << 36);
    t.dst_word = (dst_offset & MACO_TRIGGER_MAX_OFFSET) |
                 ((uint64_t)(channel & (MACO_TRIGGER_MAX_CHANNELS - 1)) << 36) |
                 ((uint64_t)(type & 7u) << 48) | (((size >> 28) & 0xFull) << 51);
    return t;
}

/* Field readers (parity ignored; src_offset and size mean nothing in an inline trigger). */
static inline MACO_HOST_DEVICE uint64_t maco_trigger_src_offset(maco_trigger_t t)
{
    return t.src_word & MACO_TRIGGER_MAX_OFFSET;
}
static inline MACO_HOST_DEVICE uint64_t maco_trigger_dst_offset(maco_trigger_t t)
{
    return t.dst_word & MACO_TRIGGER_MAX_OFFSET;
}
static inline MACO_HOST_DEVICE uint64_t maco_trigger_size(maco_trigger_t t)
{
    return (t.src_word >> 36) | (((t.dst_word >> 51) & 0xFull) << 28);
}
static inline MACO_HOST_DEVICE uint32_t maco_trigger_channel(maco_trigger_t t)
{
    return (uint32_t)((t.dst_word >> 36) & (MACO_TRIGGER_MAX_CHANNELS - 1));
}
static inline MACO_HOST_DEVICE uint32_t maco_trigger_type(maco_trigger_t t)
{
    return (uint32_t)((t.dst_word >> 48) & 7u);
}
/** 0, or the size (4 or 8 bytes) of the value an inline trigger carries in src_word. */
static inline MACO_HOST_DEVICE uint32_t maco_trigger_inline_bytes(maco_trigger_t t)
{
    if (((t.dst_word >> MACO_TRIGGER_INLINE_BIT) & 1u) == 0)
        return 0;
    return ((t.dst_word >> MACO_TRIGGER_INLINE32_BIT) & 1u) ? 4u : 8u;
}
/** Builds an inline trigger: `value` (4 or 8 bytes per `bytes`) goes to dst_offset. */
static inline MACO_HOST_DEVICE maco_trigger_t maco_trigger_make_inline(
    uint32_t type, uint32_t channel, uint64_t dst_offset, uint64_t value, uint32_t bytes)
{
    maco_trigger_t t;
    t.src_word = bytes == 4 ? (value & 0xFFFFFFFFull) : value;
    t.dst_word = (dst_offset & MACO_TRIGGER_MAX_OFFSET) |
                 ((uint64_t)(channel & (MACO_TRIGGER_MAX_CHANNELS - 1)) << 36) |
                 ((uint64_t)(type & 7u) << 48) | (1ull << MACO_TRIGGER_INLINE_BIT) |
                 ((uint64_t)(bytes == 4) << MACO_TRIGGER_INLINE32_BIT);
    return t;
}
/** The lap parity a trigger at `pos` carries in a ring of `capacity` (a power of two). */
static inline MACO_HOST_DEVICE uint64_t maco_fifo_parity(uint64_t pos, uint64_t capacity)
{
    return (((pos / capacity) & 1u) ^ 1u) << 63;
}

/**
 * Device view of a FIFO (plain data). `proxy_state` is MACO_PROXY_RUNNING while the proxy
 * serves the FIFO; once it stops, waits for ring space or for a flush fail instead of waiting
 * for their bound.
 */
typedef struct maco_fifo_device {
    maco_trigger_t *triggers;       /**< ring, host memory (mapped for GPUs) */
    uint64_t *head;                 /**< next position to reserve (device memory for GPU pushers) */
    volatile uint64_t *tail;        /**< proxy's published position (host memory) */
    uint64_t *tail_cache;           /**< last tail a GPU pusher read (device memory; NULL for host
                                         FIFOs), so a push reads host memory only when the ring
                                         looks full */
    volatile uint64_t *flush_done;  /**< 1 + position of the last completed flush (host) */
    volatile uint32_t *proxy_state; /**< MACO_PROXY_* (host memory) */
    uint64_t capacity;              /**< power of two */
    maco_device_wait_bound_t bound;
} maco_fifo_device_t;

/* Filled by the host (proxy.c), read by pushing GPU threads: 6 pointers (48), the capacity
 * (8), the wait bound (24): 80 bytes, 8-byte aligned. */
MACO_STATIC_ASSERT(sizeof(maco_fifo_device_t) == 80, "maco_fifo_device_t is 80 bytes");
MACO_STATIC_ASSERT(MACO_ALIGNOF(maco_fifo_device_t) == 8, "maco_fifo_device_t alignment");

enum { MACO_PROXY_STOPPED = 0, MACO_PROXY_RUNNING = 1 };

/* How a push orders the pushing thread's earlier writes before the trigger. */
enum {
    MACO__PUSH_RELEASE_SYS = 0, /* st.release.sys: visible to the CPU and every GPU (zero, so
                                   a zeroed handle gets the strongest order) */
    MACO__PUSH_FENCE_GPU = 1,   /* fence.acq_rel.gpu, then a relaxed store: visible in this
                                   GPU's memory system (its copy engines read there) */
    MACO__PUSH_RELAXED = 2      /* not at all (the trigger carries no data of this thread) */
};

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)

/**
 * Reserves a position and publishes `t` there with a release store at system scope: the
 * proxy, and the copies it starts, see everything this thread wrote before the push. Returns
 * the position, or ~0 when the ring stayed full past the bound or the proxy stopped (then
 * *status_p says which: MACO_ERR_TIMEOUT or MACO_ERR_REMOTE). Any thread of any CTA may call
 * it.
 */
static __device__ __forceinline__ uint64_t maco_fifo_push(const maco_fifo_device_t *f,
                                                          maco_trigger_t t,
                                                          maco_status_t *status_p);

/**
 * As maco_fifo_push, but the trigger is published with a relaxed store: it orders none of
 * this thread's earlier writes before it. For triggers that carry no data of this thread
 * (a flush alone): the release's fence is a sizeable part of a FIFO round trip
 * (bench_port_channel --pieces; docs/performance.md, "Transports").
 */
static __device__ __forceinline__ uint64_t maco_fifo_push_relaxed(const maco_fifo_device_t *f,
                                                                  maco_trigger_t t,
                                                                  maco_status_t *status_p);

/** Waits (bounded) until the proxy completed every trigger up to and including `pos`. */
static __device__ __forceinline__ maco_status_t maco_fifo_wait_flush(const maco_fifo_device_t *f,
                                                                     uint64_t pos);

#include "maco/device/impl/fifo.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_FIFO_H */
