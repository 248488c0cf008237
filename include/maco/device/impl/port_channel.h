/*
 * maco/device/impl/port_channel.h - the bodies of what maco/device/port_channel.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_PORT_CHANNEL_H
#define MACO_DEVICE_IMPL_PORT_CHANNEL_H

/* Pushes `type` triggers covering [offsets, +bytes), split below 4 GiB; the last trigger
 * carries `last_extra` too. Triggers are pushed with the channel's push_order. A data trigger
 * of 4 or 8 naturally aligned bytes on a channel with `src` carries its value inline.
 * *pos_p gets the last position pushed (~0 on failure). */
static __device__ __forceinline__ maco_status_t
maco__port_push(const maco_port_channel_device_t *ch, uint32_t type, uint64_t dst_offset,
                uint64_t src_offset, uint64_t bytes, uint32_t last_extra, uint64_t *pos_p)
{
    maco_status_t st = MACO_OK;
    uint64_t pos = ~0ull;
    if (ch->src != NULL && (bytes == 8 || bytes == 4) &&
        ((dst_offset | src_offset) & (bytes - 1)) == 0 && ch->src_bytes >= bytes &&
        src_offset <= ch->src_bytes - bytes) {
        /* Inline: the value goes in the trigger, read now at GPU scope (what this GPU's
         * threads made visible to it; the source may be reused at once). */
        const char *p = ch->src + src_offset;
        uint64_t v;
        if (bytes == 8) {
            asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        } else {
            uint32_t w;
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(w) : "l"(p) : "memory");
            v = w;
        }
        uint32_t t = type | last_extra;
        int order = (int)ch->push_order; /* like any put: the peer may read what came before */
        pos = maco__fifo_push(
            &ch->fifo, maco_trigger_make_inline(t, ch->channel, dst_offset, v, (uint32_t)bytes),
            order, &st);
        *pos_p = pos;
        return st;
    }
    do {
        uint64_t n = bytes > MACO_TRIGGER_MAX_SIZE ? (MACO_TRIGGER_MAX_SIZE & ~15ull) : bytes;
        uint32_t t = type | (n == bytes ? last_extra : 0u);
        int order = (int)ch->push_order;
        pos = maco__fifo_push(
            &ch->fifo, maco_trigger_make(t, ch->channel, dst_offset, src_offset, n), order, &st);
        dst_offset += n;
        src_offset += n;
        bytes -= n;
    } while (bytes > 0 && st == MACO_OK);
    *pos_p = pos;
    return st;
}

static __device__ __forceinline__ maco_status_t maco_port_channel_put(
    const maco_port_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset, uint64_t bytes)
{
    uint64_t pos;
    return maco__port_push(ch, MACO_TRIGGER_DATA, dst_offset, src_offset, bytes, 0u, &pos);
}

static __device__ __forceinline__ maco_status_t
maco_port_channel_signal(const maco_port_channel_device_t *ch)
{
    maco_status_t st;
    maco__fifo_push(&ch->fifo, maco_trigger_make(MACO_TRIGGER_SIGNAL, ch->channel, 0, 0, 0),
                    (int)ch->push_order, &st);
    return st;
}

static __device__ __forceinline__ maco_status_t maco_port_channel_put_with_signal(
    const maco_port_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset, uint64_t bytes)
{
    uint64_t pos;
    return maco__port_push(ch, MACO_TRIGGER_DATA, dst_offset, src_offset, bytes,
                           MACO_TRIGGER_SIGNAL, &pos);
}

static __device__ __forceinline__ maco_status_t maco_port_channel_put_with_signal_and_flush(
    const maco_port_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset, uint64_t bytes)
{
    uint64_t pos;
    maco_status_t st = maco__port_push(ch, MACO_TRIGGER_DATA, dst_offset, src_offset, bytes,
                                       MACO_TRIGGER_SIGNAL | MACO_TRIGGER_FLUSH, &pos);
    return st == MACO_OK ? maco_fifo_wait_flush(&ch->fifo, pos) : st;
}

static __device__ __forceinline__ maco_status_t
maco_port_channel_flush(const maco_port_channel_device_t *ch)
{
    maco_status_t st;
    /* A flush carries no data of this thread: the relaxed push saves the release's fence. */
    uint64_t pos = maco_fifo_push_relaxed(
        &ch->fifo, maco_trigger_make(MACO_TRIGGER_FLUSH, ch->channel, 0, 0, 0), &st);
    return st == MACO_OK ? maco_fifo_wait_flush(&ch->fifo, pos) : st;
}

static __device__ __forceinline__ maco_status_t
maco_port_channel_wait(const maco_port_channel_device_t *ch)
{
    return maco_semaphore_wait(&ch->semaphore);
}

static __device__ __forceinline__ int maco_port_channel_poll(const maco_port_channel_device_t *ch)
{
    return maco_semaphore_poll(&ch->semaphore);
}

#endif /* MACO_DEVICE_IMPL_PORT_CHANNEL_H */
