/*
 * maco/device/impl/sync.h - the bodies of what maco/device/sync.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_SYNC_H
#define MACO_DEVICE_IMPL_SYNC_H

static __device__ __forceinline__ maco_status_t
maco_grid_barrier(maco_grid_barrier_t *b, uint32_t nblocks, const maco_device_wait_bound_t *bound)
{
    __shared__ int32_t status;
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        status = MACO_OK;
        uint32_t gen = maco_load_acquire_gpu_u32(&b->generation);
        if (maco_fetch_add_acq_rel_gpu_u32(&b->arrived, 1u) == nblocks - 1) {
            /* Last to arrive: reset the count for the next use, then open the barrier. The
             * release add on the generation orders the reset before it. */
            b->arrived = 0;
            maco_fetch_add_acq_rel_gpu_u32(&b->generation, 1u);
        } else {
            maco_spin_state_t spin = { 0, 0 };
            while (maco_load_acquire_gpu_u32(&b->generation) == gen) {
                maco_status_t st = maco_spin_check(bound, &spin);
                if (st != MACO_OK) {
                    if (st == MACO_ERR_TIMEOUT)
                        maco_device_error_record(bound, st, -1, (int)blockIdx.x, 0, gen + 1, gen);
                    status = st;
                    break;
                }
            }
        }
    }
    __syncthreads();
    return (maco_status_t)status;
}

static __device__ __forceinline__ void maco_device_semaphore_set(maco_device_semaphore_t *s,
                                                                 int32_t value)
{
    atomicExch((int *)&s->value, value);
    __threadfence();
}

static __device__ __forceinline__ void maco_device_semaphore_release(maco_device_semaphore_t *s)
{
    __threadfence();
    atomicAdd((int *)&s->value, 1);
}

static __device__ __forceinline__ maco_status_t
maco_device_semaphore_acquire(maco_device_semaphore_t *s, const maco_device_wait_bound_t *bound)
{
    maco_spin_state_t spin = { 0, 0 };
    for (;;) {
        int v = *(volatile int *)&s->value;
        if (v > 0 && atomicCAS((int *)&s->value, v, v - 1) == v) {
            __threadfence();
            return MACO_OK;
        }
        maco_status_t st = maco_spin_check(bound, &spin);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco_device_error_record(bound, st, -1, (int)blockIdx.x, 0, 1, (uint64_t)v);
            return st;
        }
    }
}

#endif /* MACO_DEVICE_IMPL_SYNC_H */
