/*
 * maco/device/impl/semaphore.h - the bodies of what maco/device/semaphore.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_SEMAPHORE_H
#define MACO_DEVICE_IMPL_SEMAPHORE_H

static __device__ __forceinline__ void maco_semaphore_signal(const maco_semaphore_device_t *s)
{
    maco_red_add_release_sys_u64(s->remote_inbound, 1);
}

static __device__ __forceinline__ void
maco_semaphore_relaxed_signal(const maco_semaphore_device_t *s)
{
    maco_red_add_relaxed_sys_u64(s->remote_inbound, 1);
}

static __device__ __forceinline__ int maco_semaphore_poll(const maco_semaphore_device_t *s)
{
    uint64_t want = *s->expected + 1;
    if (maco_load_acquire_sys_u64(s->inbound) < want)
        return 0;
    *s->expected = want;
    return 1;
}

static __device__ __forceinline__ maco_status_t
maco__semaphore_wait(const maco_semaphore_device_t *s, int acquire)
{
    uint64_t want = *s->expected + 1;
    *s->expected = want;
    maco_spin_state_t spin = { 0, 0 };
    for (;;) {
        uint64_t seen =
            acquire ? maco_load_acquire_sys_u64(s->inbound) : maco_load_relaxed_sys_u64(s->inbound);
        if (seen >= want)
            return MACO_OK;
        maco_status_t st = maco_spin_check(&s->bound, &spin);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco_device_error_record(&s->bound, st, s->peer, s->id, MACO_DEVICE_WAIT_SEMAPHORE,
                                         want, seen);
            return st;
        }
    }
}

static __device__ __forceinline__ maco_status_t
maco_semaphore_wait(const maco_semaphore_device_t *s)
{
    return maco__semaphore_wait(s, 1);
}

static __device__ __forceinline__ maco_status_t
maco_semaphore_relaxed_wait(const maco_semaphore_device_t *s)
{
    return maco__semaphore_wait(s, 0);
}

#endif /* MACO_DEVICE_IMPL_SEMAPHORE_H */
