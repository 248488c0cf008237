/*
 * maco/device/impl/memory_channel.h - the bodies of what maco/device/memory_channel.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_MEMORY_CHANNEL_H
#define MACO_DEVICE_IMPL_MEMORY_CHANNEL_H

static __device__ __forceinline__ void
maco_memory_channel_put(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                        uint64_t src_offset, uint64_t bytes, uint32_t tid, uint32_t nthreads)
{
    maco_copy(ch->remote + dst_offset, ch->local + src_offset, bytes, tid, nthreads);
}

static __device__ __forceinline__ void
maco_memory_channel_get(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                        uint64_t src_offset, uint64_t bytes, uint32_t tid, uint32_t nthreads)
{
    maco_copy(ch->local + dst_offset, ch->remote + src_offset, bytes, tid, nthreads);
}

static __device__ __forceinline__ uint32_t
maco_memory_channel_read_u32(const maco_memory_channel_device_t *ch, uint64_t offset)
{
    return *(const volatile uint32_t *)(ch->remote + offset);
}

static __device__ __forceinline__ uint64_t
maco_memory_channel_read_u64(const maco_memory_channel_device_t *ch, uint64_t offset)
{
    return *(const volatile uint64_t *)(ch->remote + offset);
}

static __device__ __forceinline__ void
maco_memory_channel_write_u32(const maco_memory_channel_device_t *ch, uint64_t offset, uint32_t v)
{
    *(volatile uint32_t *)(ch->remote + offset) = v;
}

static __device__ __forceinline__ void
maco_memory_channel_write_u64(const maco_memory_channel_device_t *ch, uint64_t offset, uint64_t v)
{
    *(volatile uint64_t *)(ch->remote + offset) = v;
}

static __device__ __forceinline__ uint32_t maco__load_bytes_u32(const char *p, uint64_t valid)
{
    if (valid >= 4 && ((uintptr_t)p & 3u) == 0)
        return *(const uint32_t *)p;
    uint32_t w = 0;
    for (uint64_t k = 0; k < valid && k < 4; k++)
        w |= (uint32_t)(uint8_t)p[k] << (8 * k);
    return w;
}

static __device__ __forceinline__ void maco__store_bytes_u32(char *p, uint32_t w, uint64_t valid)
{
    if (valid >= 4 && ((uintptr_t)p & 3u) == 0) {
        *(uint32_t *)p = w;
        return;
    }
    for (uint64_t k = 0; k < valid && k < 4; k++)
        p[k] = (char)(w >> (8 * k));
}

static __device__ __forceinline__ void
maco_memory_channel_put_packets_ll16(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                                     uint64_t src_offset, uint64_t src_bytes, uint32_t tid,
                                     uint32_t nthreads, uint32_t flag)
{
    const char *src = ch->local + src_offset;
    maco_ll16_packet_t *dst = (maco_ll16_packet_t *)(ch->remote + dst_offset);
    uint64_t npkt = (src_bytes + 7) / 8;
    for (uint64_t i = tid; i < npkt; i += nthreads) {
        uint64_t left = src_bytes - 8 * i;
        uint2 d;
        d.x = maco__load_bytes_u32(src + 8 * i, left);
        d.y = left > 4 ? maco__load_bytes_u32(src + 8 * i + 4, left - 4) : 0u;
        maco_ll16_store(dst + i, d, flag);
    }
}

static __device__ __forceinline__ maco_status_t maco_memory_channel_unpack_packets_ll16(
    const maco_memory_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset,
    uint64_t dst_bytes, uint32_t tid, uint32_t nthreads, uint32_t flag)
{
    const maco_ll16_packet_t *src = (const maco_ll16_packet_t *)(ch->local + src_offset);
    char *dst = ch->local + dst_offset;
    uint64_t npkt = (dst_bytes + 7) / 8;
    for (uint64_t i = tid; i < npkt; i += nthreads) {
        uint2 d;
        maco_status_t st = maco_ll16_load(src + i, flag, &d, &ch->semaphore.bound,
                                          ch->semaphore.peer, (int)(i & 0x7fffffff));
        if (st != MACO_OK)
            return st;
        uint64_t left = dst_bytes - 8 * i;
        maco__store_bytes_u32(dst + 8 * i, d.x, left);
        if (left > 4)
            maco__store_bytes_u32(dst + 8 * i + 4, d.y, left - 4);
    }
    return MACO_OK;
}

static __device__ __forceinline__ void
maco_memory_channel_put_packets_ll8(const maco_memory_channel_device_t *ch, uint64_t dst_offset,
                                    uint64_t src_offset, uint64_t src_bytes, uint32_t tid,
                                    uint32_t nthreads, uint32_t flag)
{
    const char *src = ch->local + src_offset;
    maco_ll8_packet_t *dst = (maco_ll8_packet_t *)(ch->remote + dst_offset);
    uint64_t npkt = (src_bytes + 3) / 4;
    for (uint64_t i = tid; i < npkt; i += nthreads)
        maco_ll8_store(dst + i, maco__load_bytes_u32(src + 4 * i, src_bytes - 4 * i), flag);
}

static __device__ __forceinline__ maco_status_t maco_memory_channel_unpack_packets_ll8(
    const maco_memory_channel_device_t *ch, uint64_t dst_offset, uint64_t src_offset,
    uint64_t dst_bytes, uint32_t tid, uint32_t nthreads, uint32_t flag)
{
    const maco_ll8_packet_t *src = (const maco_ll8_packet_t *)(ch->local + src_offset);
    char *dst = ch->local + dst_offset;
    uint64_t npkt = (dst_bytes + 3) / 4;
    for (uint64_t i = tid; i < npkt; i += nthreads) {
        uint32_t d;
        maco_status_t st = maco_ll8_load(src + i, flag, &d, &ch->semaphore.bound,
                                         ch->semaphore.peer, (int)(i & 0x7fffffff));
        if (st != MACO_OK)
            return st;
        maco__store_bytes_u32(dst + 4 * i, d, dst_bytes - 4 * i);
    }
    return MACO_OK;
}

static __device__ __forceinline__ void
maco_memory_channel_signal(const maco_memory_channel_device_t *ch)
{
    maco_semaphore_signal(&ch->semaphore);
}

static __device__ __forceinline__ void
maco_memory_channel_relaxed_signal(const maco_memory_channel_device_t *ch)
{
    maco_semaphore_relaxed_signal(&ch->semaphore);
}

static __device__ __forceinline__ maco_status_t
maco_memory_channel_wait(const maco_memory_channel_device_t *ch)
{
    return maco_semaphore_wait(&ch->semaphore);
}

static __device__ __forceinline__ maco_status_t
maco_memory_channel_relaxed_wait(const maco_memory_channel_device_t *ch)
{
    return maco_semaphore_relaxed_wait(&ch->semaphore);
}

static __device__ __forceinline__ int
maco_memory_channel_poll(const maco_memory_channel_device_t *ch)
{
    return maco_semaphore_poll(&ch->semaphore);
}

#endif /* MACO_DEVICE_IMPL_MEMORY_CHANNEL_H */
