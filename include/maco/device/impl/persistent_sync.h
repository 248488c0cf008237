/*
 * maco/device/impl/persistent_sync.h - the persistent kernel's memory operations, bounded
 * waits, failure reports, gates and signals (maco/device/persistent.h declares and documents
 * them). Included by that header only.
 *
 * Host and device alike: the CPU tests run the CTAs' roles as host threads. On the device
 * every operation is one of maco/device/atomics.h, at GPU scope for what only this GPU's CTAs
 * touch (queues, dependency counters, the launch's counters) and at system scope for a gate's
 * counter, which other GPUs or the host advance; on the host the GCC atomic of the same order.
 * Failures go to the communicator's report of maco/device/error.h.
 */
#ifndef MACO_DEVICE_IMPL_PERSISTENT_SYNC_H
#define MACO_DEVICE_IMPL_PERSISTENT_SYNC_H

#include <sched.h>
#include <time.h>

/* -------- memory operations */

MACO_HOST_DEVICE static inline uint64_t maco__pk_ld_acquire(const uint64_t *p)
{
#if defined(__CUDA_ARCH__)
    return maco_load_acquire_gpu_u64(p);
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

MACO_HOST_DEVICE static inline uint64_t maco__pk_ld_relaxed(const uint64_t *p)
{
#if defined(__CUDA_ARCH__)
    return maco_load_relaxed_gpu_u64(p);
#else
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

/* The counter of a gate: written by other GPUs (through a memory channel's mapping) or the
 * host, so the acquire is at system scope. */
MACO_HOST_DEVICE static inline uint64_t maco__pk_ld_acquire_sys(const uint64_t *p)
{
#if defined(__CUDA_ARCH__)
    return maco_load_acquire_sys_u64(p);
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

MACO_HOST_DEVICE static inline void maco__pk_st_release(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__)
    maco_store_release_gpu_u64(p, v);
#else
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

MACO_HOST_DEVICE static inline uint64_t maco__pk_fetch_add_relaxed(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__)
    return maco_fetch_add_relaxed_gpu_u64(p, v);
#else
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

MACO_HOST_DEVICE static inline uint64_t maco__pk_fetch_add_acq_rel(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__)
    return maco_fetch_add_acq_rel_gpu_u64(p, v);
#else
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
#endif
}

MACO_HOST_DEVICE static inline uint64_t maco__pk_now_ns(void)
{
#if defined(__CUDA_ARCH__)
    return maco_globaltimer_ns();
#else
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
#endif
}

/* Whether a wait of the communicator has failed (its claim word: maco/device/error.h). */
MACO_HOST_DEVICE static inline int maco__pk_claimed(const maco_pk_view_t *v)
{
#if defined(__CUDA_ARCH__)
    return maco_device_error_claimed(&v->bound);
#else
    return v->bound.claim != 0 && __atomic_load_n(v->bound.claim, __ATOMIC_RELAXED) != 0;
#endif
}

/* -------- bounded waits and failure */

typedef struct maco__pk_spin {
    uint64_t start_ns;
    uint32_t iterations;
} maco__pk_spin_t;

/* One iteration of a wait: MACO_OK to go on; MACO_ERR_REMOTE once the launch was aborted or
 * the communicator's error word was claimed; MACO_ERR_TIMEOUT after `factor` bounds. The
 * abort word and the clock are read every 256 iterations. maco_spin_check (maco/device/
 * error.h) with two more things the runtime needs: the launch's abort word (a failed task
 * stops every CTA of the launch, not only the waits of the communicator) and a bound scaled by
 * `factor` (an idle worker waits longer than the task waits it defers to); and it runs on host
 * threads too. */
MACO_HOST_DEVICE static inline maco_status_t maco__pk_spin(const maco_pk_view_t *v,
                                                           maco__pk_spin_t *s, uint32_t factor)
{
#if !defined(__CUDA_ARCH__)
    sched_yield(); /* host threads in the CTAs' roles (CPU tests) share few cores */
#endif
    if ((++s->iterations & 255u) != 0)
        return MACO_OK;
    if (maco__pk_ld_relaxed(&v->ctr[MACO_PK_CTR_ABORT]) != 0)
        return MACO_ERR_REMOTE;
    if (maco__pk_claimed(v))
        return MACO_ERR_REMOTE;
    uint64_t now = maco__pk_now_ns();
    if (s->start_ns == 0) {
        s->start_ns = now;
        return MACO_OK;
    }
    if (v->bound.timeout_ns != 0 && now - s->start_ns > (uint64_t)factor * v->bound.timeout_ns)
        return MACO_ERR_TIMEOUT;
    return MACO_OK;
}

/* Records a failure in the communicator's report (the first one wins; maco/device/error.h);
 * `peer` is the rank it concerns (-1: none or several). */
MACO_HOST_DEVICE static inline void maco__pk_record_peer(const maco_pk_view_t *v,
                                                         maco_status_t status, int peer, int object,
                                                         uint32_t what, uint64_t expected,
                                                         uint64_t observed)
{
#if defined(__CUDA_ARCH__)
    maco_device_error_record(&v->bound, status, peer, object, what, expected, observed);
#else
    int32_t zero = 0;
    if (v->bound.claim == 0 || !__atomic_compare_exchange_n(v->bound.claim, &zero, 1, 0,
                                                            __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    v->bound.report->peer = peer;
    v->bound.report->object = object;
    v->bound.report->what = what;
    v->bound.report->expected = expected;
    v->bound.report->observed = observed;
    /* Release: the fields above are seen by whoever acquires the status. */
    __atomic_store_n(&v->bound.report->status, (int32_t)status, __ATOMIC_RELEASE);
#endif
}

MACO_HOST_DEVICE static inline void maco__pk_record(const maco_pk_view_t *v, maco_status_t status,
                                                    int object, uint32_t what, uint64_t expected,
                                                    uint64_t observed)
{
    maco__pk_record_peer(v, status, -1, object, what, expected, observed);
}

MACO_HOST_DEVICE static inline void maco_pk_abort(const maco_pk_view_t *v)
{
    maco__pk_st_release(&v->ctr[MACO_PK_CTR_ABORT], 1);
}

/* The count a gate waits for in launch `run`: wait_count * run + wait_need (wait_need 0:
 * wait_count). */
MACO_HOST_DEVICE static inline uint64_t maco__pk_gate_want(const maco_pk_sync_t *g, uint64_t run)
{
    return g->wait_count * run + (g->wait_need != 0 ? g->wait_need : g->wait_count);
}

MACO_HOST_DEVICE static inline maco_status_t maco_pk_gate(const maco_pk_view_t *v, uint32_t task,
                                                          uint64_t run)
{
    if (v->sync == 0 || v->sync[task].wait == 0)
        return MACO_OK;
    const maco_pk_sync_t *g = &v->sync[task];
    const uint64_t want = maco__pk_gate_want(g, run);
    uint64_t seen = 0;
    maco__pk_spin_t spin = { 0, 0 };
    while ((seen = maco__pk_ld_acquire_sys(g->wait)) < want) {
        maco_status_t st = maco__pk_spin(v, &spin, 1);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco__pk_record_peer(v, st, g->peer, (int)task, MACO_DEVICE_WAIT_TASK_GATE, want,
                                     seen);
            maco_pk_abort(v);
            return st;
        }
    }
    return MACO_OK;
}

MACO_HOST_DEVICE static inline void maco__pk_signal_add(uint64_t *p)
{
#if defined(__CUDA_ARCH__)
    maco_red_add_release_sys_u64(p, 1);
#else
    __atomic_fetch_add(p, 1, __ATOMIC_RELEASE);
#endif
}

MACO_HOST_DEVICE static inline void maco_pk_post_signal(const maco_pk_view_t *v, uint32_t task)
{
    if (v->sync == 0 || v->sync[task].signal == 0)
        return;
    const maco_pk_sync_t *g = &v->sync[task];
    /* The fence orders every write the task made (its CTA's, seen through the barrier before
     * this call) before the adds, for a reader on another GPU that acquires the counter. On
     * the host a task is one thread's, and each add below is a release: it orders them. */
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#endif
    if (g->sig_count == 0) {
        maco__pk_signal_add(g->signal);
        return;
    }
    for (uint32_t j = 0; j < g->sig_count; j++) {
        const maco_memory_channel_device_t *c = &v->channels[g->sig_first + j];
        maco__pk_signal_add((uint64_t *)(c->remote + ((char *)g->signal - c->local)));
    }
}

MACO_HOST_DEVICE static inline maco_status_t maco_pk_roots_pushed(const maco_pk_view_t *v,
                                                                  uint32_t s, uint64_t run)
{
    const uint64_t want = (uint64_t)v->nschedulers * (run + 1);
    uint64_t seen = maco__pk_fetch_add_acq_rel(&v->ctr[MACO_PK_CTR_ROOTS], 1) + 1;
    maco__pk_spin_t spin = { 0, 0 };
    while (seen < want) {
        maco_status_t st = maco__pk_spin(v, &spin, 1);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco__pk_record(v, st, (int)(v->nworkers + v->ncomm + s), MACO_DEVICE_WAIT_TASK,
                                want, seen);
            maco_pk_abort(v);
            return st;
        }
        seen = maco__pk_ld_acquire(&v->ctr[MACO_PK_CTR_ROOTS]);
    }
    return MACO_OK;
}

#endif /* MACO_DEVICE_IMPL_PERSISTENT_SYNC_H */
