/*
 * maco/device/impl/fifo.h - the bodies of what maco/device/fifo.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_FIFO_H
#define MACO_DEVICE_IMPL_FIFO_H

/* The push; `order` is a MACO__PUSH_* (see maco_fifo_push and maco_fifo_push_relaxed). */
static __device__ __forceinline__ uint64_t maco__fifo_push(const maco_fifo_device_t *f,
                                                           maco_trigger_t t, int order,
                                                           maco_status_t *status_p)
{
    uint64_t pos = atomicAdd((unsigned long long *)f->head, 1ull);
    maco_spin_state_t spin = { 0, 0 };
    uint64_t tail = f->tail_cache ? *(volatile uint64_t *)f->tail_cache : *f->tail;
    while (pos >= tail + f->capacity) {
        tail = *f->tail;
        if (f->tail_cache)
            atomicMax((unsigned long long *)f->tail_cache, (unsigned long long)tail);
        if (pos < tail + f->capacity)
            break;
        maco_status_t st = MACO_OK;
        if (*f->proxy_state != MACO_PROXY_RUNNING)
            st = MACO_ERR_REMOTE;
        else
            st = maco_spin_check(&f->bound, &spin);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco_device_error_record(&f->bound, st, -1, -1, MACO_DEVICE_WAIT_FIFO,
                                         pos - f->capacity + 1, *f->tail);
            *status_p = st;
            return ~0ull;
        }
    }
    maco_trigger_t *slot = f->triggers + (pos & (f->capacity - 1));
    uint64_t dst_word = t.dst_word | maco_fifo_parity(pos, f->capacity);
    /* One 128-bit store at system scope: the proxy sees both words at once. Release: also
     * after everything this thread wrote (and observed) before, e.g. the data of a put. */
    if (order == MACO__PUSH_RELEASE_SYS) {
        asm volatile("st.release.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(t.src_word),
                     "l"(dst_word)
                     : "memory");
    } else {
        if (order == MACO__PUSH_FENCE_GPU)
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
        asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(t.src_word),
                     "l"(dst_word)
                     : "memory");
    }
    *status_p = MACO_OK;
    return pos;
}

static __device__ __forceinline__ uint64_t maco_fifo_push(const maco_fifo_device_t *f,
                                                          maco_trigger_t t, maco_status_t *status_p)
{
    return maco__fifo_push(f, t, MACO__PUSH_RELEASE_SYS, status_p);
}

static __device__ __forceinline__ uint64_t maco_fifo_push_relaxed(const maco_fifo_device_t *f,
                                                                  maco_trigger_t t,
                                                                  maco_status_t *status_p)
{
    return maco__fifo_push(f, t, MACO__PUSH_RELAXED, status_p);
}

static __device__ __forceinline__ maco_status_t maco_fifo_wait_flush(const maco_fifo_device_t *f,
                                                                     uint64_t pos)
{
    maco_spin_state_t spin = { 0, 0 };
    uint32_t polls = 0; /* its own count: maco_spin_check advances spin.iterations */
    /* Each read here crosses PCIe: poll flush_done alone, and look at the proxy's state only
     * every 64 polls. The polls are relaxed (an acquire read of host memory is slower); the
     * acquire load after them pairs with the proxy's release store of flush_done, which
     * follows the completion of the copies: this thread's later accesses (reusing the source
     * buffer, reading the peer's) come after them. No fence after it: a system-scope fence
     * costs time and orders nothing more (docs/performance.md, "Tuning", "FIFO flush polls"). */
    const uint64_t *done = (const uint64_t *)f->flush_done;
    while (maco_load_relaxed_sys_u64(done) <= pos) {
        maco_status_t st = MACO_OK;
        if ((++polls & 63u) == 0 && *f->proxy_state != MACO_PROXY_RUNNING &&
            maco_load_relaxed_sys_u64(done) <= pos)
            st = MACO_ERR_REMOTE;
        else
            st = maco_spin_check(&f->bound, &spin);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco_device_error_record(&f->bound, st, -1, -1, MACO_DEVICE_WAIT_FLUSH, pos + 1,
                                         *f->flush_done);
            return st;
        }
    }
    (void)maco_load_acquire_sys_u64(done);
    return MACO_OK;
}

#endif /* MACO_DEVICE_IMPL_FIFO_H */
