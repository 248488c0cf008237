/*
 * maco/device/impl/packet.h - the bodies of what maco/device/packet.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_PACKET_H
#define MACO_DEVICE_IMPL_PACKET_H

static __device__ __forceinline__ void maco_ll16_store(maco_ll16_packet_t *p, uint2 data,
                                                       uint32_t flag)
{
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(data.x),
                 "r"(flag), "r"(data.y), "r"(flag)
                 : "memory");
}

static __device__ __forceinline__ void maco_ll8_store(maco_ll8_packet_t *p, uint32_t data,
                                                      uint32_t flag)
{
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(data), "r"(flag)
                 : "memory");
}

static __device__ __forceinline__ int maco_ll16_try_load(const maco_ll16_packet_t *p, uint32_t flag,
                                                         uint2 *data)
{
    uint32_t d0, f0, d1, f1;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(p)
                 : "memory");
    data->x = d0;
    data->y = d1;
    return f0 == flag && f1 == flag;
}

static __device__ __forceinline__ int maco_ll8_try_load(const maco_ll8_packet_t *p, uint32_t flag,
                                                        uint32_t *data)
{
    uint32_t d, f;
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];"
                 : "=r"(d), "=r"(f)
                 : "l"(p)
                 : "memory");
    *data = d;
    return f == flag;
}

static __device__ __forceinline__ maco_status_t maco_ll16_load(const maco_ll16_packet_t *p,
                                                               uint32_t flag, uint2 *data,
                                                               const maco_device_wait_bound_t *b,
                                                               int peer, int slot)
{
    maco_spin_state_t spin = { 0, 0 };
    while (!maco_ll16_try_load(p, flag, data)) {
        maco_status_t st = maco_spin_check(b, &spin);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco_device_error_record(b, st, peer, slot, MACO_DEVICE_WAIT_PACKET, flag,
                                         ((const volatile uint32_t *)p)[1]);
            return st;
        }
    }
    return MACO_OK;
}

static __device__ __forceinline__ maco_status_t maco_ll8_load(const maco_ll8_packet_t *p,
                                                              uint32_t flag, uint32_t *data,
                                                              const maco_device_wait_bound_t *b,
                                                              int peer, int slot)
{
    maco_spin_state_t spin = { 0, 0 };
    while (!maco_ll8_try_load(p, flag, data)) {
        maco_status_t st = maco_spin_check(b, &spin);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco_device_error_record(b, st, peer, slot, MACO_DEVICE_WAIT_PACKET, flag,
                                         ((const volatile uint32_t *)p)[1]);
            return st;
        }
    }
    return MACO_OK;
}

#endif /* MACO_DEVICE_IMPL_PACKET_H */
