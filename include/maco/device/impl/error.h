/*
 * maco/device/impl/error.h - the bodies of what maco/device/error.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_ERROR_H
#define MACO_DEVICE_IMPL_ERROR_H

static __device__ __forceinline__ void
maco_device_error_record(const maco_device_wait_bound_t *b, maco_status_t status, int peer,
                         int object, uint32_t what, uint64_t expected, uint64_t observed)
{
    if (b->claim == 0 || atomicCAS((int *)b->claim, 0, 1) != 0)
        return;
    b->report->peer = peer;
    b->report->object = object;
    b->report->what = what;
    b->report->expected = expected;
    b->report->observed = observed;
    __threadfence_system();
    b->report->status = (int32_t)status;
    __threadfence_system();
}

static __device__ __forceinline__ int maco_device_error_claimed(const maco_device_wait_bound_t *b)
{
    return b->claim != 0 && *(volatile int32_t *)b->claim != 0;
}

static __device__ __forceinline__ maco_status_t maco_spin_check(const maco_device_wait_bound_t *b,
                                                                maco_spin_state_t *s)
{
    if ((++s->iterations & 1023u) != 0)
        return MACO_OK;
    if (maco_device_error_claimed(b))
        return MACO_ERR_REMOTE;
    uint64_t now = maco_globaltimer_ns();
    if (s->start_ns == 0) {
        s->start_ns = now;
        return MACO_OK;
    }
    if (b->timeout_ns != 0 && now - s->start_ns > b->timeout_ns)
        return MACO_ERR_TIMEOUT;
    return MACO_OK;
}

#endif /* MACO_DEVICE_IMPL_ERROR_H */
