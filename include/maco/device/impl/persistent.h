/*
 * maco/device/impl/persistent.h - the bodies of what maco/device/persistent.h declares and
 * documents. Included by that header only: read the header for the contract.
 */
#ifndef MACO_DEVICE_IMPL_PERSISTENT_H
#define MACO_DEVICE_IMPL_PERSISTENT_H

#include <time.h>
#include <sched.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

/* maco_datatype_t values of the element-wise types (maco/collectives.h). */
enum { MACO__PK_F16 = 6, MACO__PK_BF16 = 7, MACO__PK_F32 = 8 };

/* -------- memory operations: PTX at GPU scope on the device, GCC atomics on the host */

MACO_HOST_DEVICE static inline uint64_t maco__pk_ld_acquire(const uint64_t *p)
{
#if defined(__CUDA_ARCH__)
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

MACO_HOST_DEVICE static inline uint64_t maco__pk_ld_relaxed(const uint64_t *p)
{
#if defined(__CUDA_ARCH__)
    uint64_t v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
#else
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

MACO_HOST_DEVICE static inline int32_t maco__pk_ld_relaxed_i32(const int32_t *p)
{
#if defined(__CUDA_ARCH__)
    return *(const volatile int32_t *)p;
#else
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

/* The counter of a gate: written by other GPUs (through a memory channel's mapping) or the
 * host, so the acquire is at system scope. */
MACO_HOST_DEVICE static inline uint64_t maco__pk_ld_acquire_sys(const uint64_t *p)
{
#if defined(__CUDA_ARCH__)
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

MACO_HOST_DEVICE static inline void maco__pk_st_release(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__)
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

MACO_HOST_DEVICE static inline uint64_t maco__pk_fetch_add_relaxed(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__)
    uint64_t old;
    asm volatile("atom.relaxed.gpu.global.add.u64 %0, [%1], %2;"
                 : "=l"(old)
                 : "l"(p), "l"(v)
                 : "memory");
    return old;
#else
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

MACO_HOST_DEVICE static inline uint64_t maco__pk_fetch_add_acq_rel(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__)
    uint64_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;"
                 : "=l"(old)
                 : "l"(p), "l"(v)
                 : "memory");
    return old;
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

/* -------- bounded waits and failure */

typedef struct maco__pk_spin {
    uint64_t start_ns;
    uint32_t iterations;
} maco__pk_spin_t;

/* One iteration of a wait: MACO_OK to go on; MACO_ERR_REMOTE once the launch was aborted or
 * the communicator's error word was claimed; MACO_ERR_TIMEOUT after `factor` bounds. The
 * abort word and the clock are read every 256 iterations. */
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
    if (v->bound.claim != 0 && maco__pk_ld_relaxed_i32(v->bound.claim) != 0)
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
    __atomic_thread_fence(__ATOMIC_RELEASE);
    v->bound.report->status = (int32_t)status;
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

MACO_HOST_DEVICE static inline maco_status_t maco_pk_gate(const maco_pk_view_t *v, uint32_t task,
                                                          uint64_t run)
{
    if (v->sync == 0 || v->sync[task].wait == 0)
        return MACO_OK;
    const maco_pk_sync_t *g = &v->sync[task];
    const uint64_t want = g->wait_count * (run + 1);
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
     * this call) before the adds, for a reader on another GPU that acquires the counter. */
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
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

/* -------- queues */

MACO_HOST_DEVICE static inline maco_status_t
maco_pk_queue_push(const maco_pk_view_t *v, const maco_pk_queue_t *q, uint32_t task)
{
    uint64_t pos = maco__pk_fetch_add_relaxed(q->reserve, 1);
    maco__pk_spin_t spin = { 0, 0 };
    uint64_t head;
    /* Acquire: the consumer read this slot's previous value before it moved `head` past it. */
    while (pos - (head = maco__pk_ld_acquire(q->head)) >= q->capacity) {
        maco_status_t st = maco__pk_spin(v, &spin, 1);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco__pk_record(v, st, (int)(q - v->queues), MACO_DEVICE_WAIT_TASK_QUEUE, pos,
                                head);
            maco_pk_abort(v);
            return st;
        }
    }
    /* Release: pairs with the consumer's acquire load of the slot (maco_pk_queue_pop). */
    maco__pk_st_release(&q->slots[pos & (q->capacity - 1)],
                        (uint64_t)(uint32_t)(pos + 1) << 32 | task);
    return MACO_OK;
}

MACO_HOST_DEVICE static inline int maco_pk_queue_pop(const maco_pk_queue_t *q, uint32_t *task_p)
{
    uint64_t h = maco__pk_ld_relaxed(q->head); /* written by this consumer only */
    uint64_t slot = maco__pk_ld_acquire(&q->slots[h & (q->capacity - 1)]);
    if ((uint32_t)(slot >> 32) != (uint32_t)(h + 1))
        return 0;
    *task_p = (uint32_t)slot;
    /* Release: the slot was read; a producer that acquires the new head may overwrite it. */
    maco__pk_st_release(q->head, h + 1);
    return 1;
}

/* Whether `task`'s gate (if any) is open in launch `run`: one load, no wait. */
MACO_HOST_DEVICE static inline int maco__pk_gate_open(const maco_pk_view_t *v, uint32_t task,
                                                      uint64_t run)
{
    if (v->sync == 0 || v->sync[task].wait == 0)
        return 1;
    return maco__pk_ld_acquire_sys(v->sync[task].wait) >= v->sync[task].wait_count * (run + 1);
}

MACO_HOST_DEVICE static inline int maco_pk_next(const maco_pk_view_t *v, uint32_t queue,
                                                uint64_t run, uint32_t *task_p,
                                                maco_status_t *status_p)
{
    const maco_pk_queue_t *q = &v->queues[queue];
    uint64_t target = (uint64_t)v->ntasks * (run + 1);
    uint64_t last = ~0ull;
    maco__pk_spin_t spin = { 0, 0 };
    for (;;) {
        if (maco_pk_queue_pop(q, task_p))
            return 1;
        uint64_t done = maco__pk_ld_acquire(&v->ctr[MACO_PK_CTR_DONE]);
        if (done >= target)
            return 0;
        if (done != last) { /* progress somewhere: the bound starts again */
            last = done;
            spin.start_ns = 0;
            spin.iterations = 0;
        }
        /* Twice the bound: a task's own wait (which names the task) times out first. */
        maco_status_t st = maco__pk_spin(v, &spin, 2);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco__pk_record(v, st, (int)queue, MACO_DEVICE_WAIT_TASK, target, done);
            maco_pk_abort(v);
            *status_p = st;
            return -1;
        }
    }
}

MACO_HOST_DEVICE static inline int maco_pk_next_ready(const maco_pk_view_t *v, uint32_t queue,
                                                      uint64_t run, uint32_t *task_p,
                                                      maco_status_t *status_p)
{
    const maco_pk_queue_t *q = &v->queues[queue];
    uint64_t deferring_since = 0;
    for (;;) {
        uint32_t task = 0;
        int got = maco_pk_next(v, queue, run, &task, status_p);
        if (got != 1 || maco__pk_gate_open(v, task, run)) {
            *task_p = task;
            return got;
        }
        /* Closed: to the back of this queue, unless the queue could be full (a push would
         * then wait for this very consumer): then wait at the gate, bounded. */
        uint64_t load = maco__pk_ld_relaxed(q->reserve) - maco__pk_ld_relaxed(q->head);
        if (load + 2 >= q->capacity) {
            maco_status_t st = maco_pk_gate(v, task, run);
            if (st != MACO_OK) {
                *status_p = st;
                return -1;
            }
            *task_p = task;
            return 1;
        }
        uint64_t now = maco__pk_now_ns();
        if (deferring_since == 0)
            deferring_since = now;
        else if (v->bound.timeout_ns != 0 && now - deferring_since > v->bound.timeout_ns) {
            const maco_pk_sync_t *g = &v->sync[task];
            maco__pk_record_peer(v, MACO_ERR_TIMEOUT, g->peer, (int)task,
                                 MACO_DEVICE_WAIT_TASK_GATE, g->wait_count * (run + 1),
                                 maco__pk_ld_acquire_sys(g->wait));
            maco_pk_abort(v);
            *status_p = MACO_ERR_TIMEOUT;
            return -1;
        }
        maco_status_t st = maco_pk_queue_push(v, q, task);
        if (st != MACO_OK) {
            *status_p = st;
            return -1;
        }
    }
}

/* Without waiting: the next task of queue `queue` whose gate is open, looking at no more than
 * `max` tasks (closed ones go to the back, as in maco_pk_next_ready). Returns 1 (*task_p),
 * 0 when none is ready now, or 2 when it popped a closed task that it may not put back (the
 * queue could be full): the caller must wait at its gate (maco_pk_gate) and run it. */
MACO_HOST_DEVICE static inline int maco__pk_try_next_ready(const maco_pk_view_t *v, uint32_t queue,
                                                           uint64_t run, uint32_t max,
                                                           uint32_t *task_p,
                                                           maco_status_t *status_p)
{
    const maco_pk_queue_t *q = &v->queues[queue];
    for (uint32_t i = 0; i < max; i++) {
        uint32_t task = 0;
        if (!maco_pk_queue_pop(q, &task))
            return 0;
        *task_p = task;
        if (maco__pk_gate_open(v, task, run))
            return 1;
        uint64_t load = maco__pk_ld_relaxed(q->reserve) - maco__pk_ld_relaxed(q->head);
        if (load + 2 >= q->capacity)
            return 2;
        maco_status_t st = maco_pk_queue_push(v, q, task);
        if (st != MACO_OK) {
            *status_p = st;
            return -1;
        }
    }
    return 0;
}

MACO_HOST_DEVICE static inline maco_status_t maco_pk_complete(const maco_pk_view_t *v,
                                                              uint32_t task, uint64_t run,
                                                              uint32_t lane, uint32_t nlanes)
{
    const maco_pk_task_t *t = &v->tasks[task];
    const maco_pk_queue_t *inboxes = &v->queues[v->nworkers + v->ncomm];
    maco_status_t status = MACO_OK;
    for (uint32_t i = lane; i < t->succ_count; i += nlanes) {
        uint32_t s = v->succ[t->succ_begin + i];
        uint64_t want = (uint64_t)v->tasks[s].ndeps * (run + 1);
        /* Acquire-release: the last arrival has seen every predecessor's writes. */
        if (maco__pk_fetch_add_acq_rel(&v->arrive[s], 1) + 1 == want) {
            /* Straight to a worker of its role once every root is queued: the queue hashed from
             * the task's id, so completions on every worker dispatch at once. Before that,
             * through its scheduler, which keeps the roots first in every queue. */
            const maco_pk_queue_t *q = &inboxes[s % v->nschedulers];
            if (maco__pk_ld_acquire(&v->ctr[MACO_PK_CTR_ROOTS]) >=
                (uint64_t)v->nschedulers * (run + 1)) {
                uint32_t comm = v->tasks[s].role == MACO_PK_ROLE_COMM && v->ncomm > 0;
                uint32_t base = comm ? v->nworkers : 0u, cnt = comm ? v->ncomm : v->nworkers;
                const maco_pk_queue_t *w =
                    &v->queues[base + (uint32_t)(((uint64_t)s * 2654435761u) >> 7) % cnt];
                /* Not into a queue that could be full: the pusher may be its own consumer. The
                 * scheduler's inbox has room for every task. */
                if (maco__pk_ld_relaxed(w->reserve) - maco__pk_ld_relaxed(w->head) + 2 <
                    w->capacity)
                    q = w;
            }
            maco_status_t st = maco_pk_queue_push(v, q, s);
            if (st != MACO_OK)
                status = st;
        }
    }
    if (lane == 0)
        maco__pk_fetch_add_acq_rel(&v->ctr[MACO_PK_CTR_DONE], 1);
    return status;
}

/* Scheduler s's own workers of `task`'s role: queues[*base_p + j * *stride_p] for j in
 * [0, *cnt_p). Returns the role's index in a scheduler's round-robin state (1: comm). */
MACO_HOST_DEVICE static inline uint32_t maco__pk_own_workers(const maco_pk_view_t *v, uint32_t s,
                                                             uint32_t task, uint32_t *base_p,
                                                             uint32_t *stride_p, uint32_t *cnt_p)
{
    uint32_t comm = v->tasks[task].role == MACO_PK_ROLE_COMM && v->ncomm > 0 ? 1u : 0u;
    uint32_t base = comm ? v->nworkers : 0u, n = comm ? v->ncomm : v->nworkers;
    uint32_t first = 0, stride = 1, cnt = n;
    if (n >= v->nschedulers) { /* its own workers: s, s + S, s + 2S, ... */
        first = s;
        stride = v->nschedulers;
        cnt = (n - s + stride - 1) / stride;
    }
    *base_p = base + first;
    *stride_p = stride;
    *cnt_p = cnt;
    return comm;
}

/* Scheduler s hands `task` to one of its workers of the task's role: the first of up to four
 * (round robin from rr[role]) whose queue is empty, else the least loaded of them. */
MACO_HOST_DEVICE static inline maco_status_t maco__pk_dispatch(const maco_pk_view_t *v, uint32_t s,
                                                               uint32_t task, uint32_t rr[2])
{
    uint32_t first = 0, stride = 1, cnt = 1;
    uint32_t comm = maco__pk_own_workers(v, s, task, &first, &stride, &cnt);
    uint32_t tries = cnt < 4 ? cnt : 4, best = rr[comm] % cnt;
    uint64_t best_load = ~0ull;
    for (uint32_t k = 0; k < tries; k++) {
        uint32_t j = (rr[comm] + k) % cnt;
        const maco_pk_queue_t *q = &v->queues[first + j * stride];
        uint64_t load = maco__pk_ld_relaxed(q->reserve) - maco__pk_ld_relaxed(q->head);
        if (load < best_load) {
            best_load = load;
            best = j;
            if (load == 0)
                break;
        }
    }
    rr[comm] = best + 1;
    return maco_pk_queue_push(v, &v->queues[first + best * stride], task);
}

MACO_HOST_DEVICE static inline maco_status_t
maco_pk_schedule_roots(const maco_pk_view_t *v, uint32_t s, uint32_t lane, uint32_t nlanes)
{
    /* Every lane of every scheduler takes whole queues (queue q: lane s * nlanes + lane, q
     * modulo all lanes) and pushes that queue's roots in their order: each worker gets its
     * roots in the order of the graph (maco__pk_layout assigned them), however the lanes run. */
    const uint64_t g = (uint64_t)s * nlanes + lane, G = (uint64_t)v->nschedulers * nlanes;
    for (uint64_t q = g; q < (uint64_t)v->nworkers + v->ncomm; q += G) {
        for (uint32_t i = v->root_start[q]; i < v->root_start[q + 1]; i++) {
            maco_status_t st = maco_pk_queue_push(v, &v->queues[q], v->roots[i]);
            if (st != MACO_OK)
                return st;
        }
    }
    return MACO_OK;
}

MACO_HOST_DEVICE static inline maco_status_t maco_pk_schedule(const maco_pk_view_t *v, uint32_t s,
                                                              uint64_t run)
{
    maco_status_t st = maco_pk_schedule_roots(v, s, 0, 1);
    if (st == MACO_OK)
        st = maco_pk_roots_pushed(v, s, run);
    if (st != MACO_OK)
        return st;
    return maco_pk_schedule_inbox(v, s, run);
}

MACO_HOST_DEVICE static inline maco_status_t maco_pk_schedule_inbox(const maco_pk_view_t *v,
                                                                    uint32_t s, uint64_t run)
{
    uint32_t rr[2] = { 0, 0 };
    uint32_t inbox = v->nworkers + v->ncomm + s;
    for (;;) {
        uint32_t task = 0;
        maco_status_t st = MACO_OK;
        int got = maco_pk_next(v, inbox, run, &task, &st);
        if (got == 0)
            return MACO_OK;
        if (got < 0)
            return st;
        st = maco__pk_dispatch(v, s, task, rr);
        if (st != MACO_OK)
            return st;
    }
}

/* -------- the kernel body */
#if defined(__CUDACC__)

static __device__ __forceinline__ float maco__pk_load(const void *p, uint64_t i, uint32_t dtype)
{
    if (dtype == MACO__PK_F16)
        return __half2float(((const __half *)p)[i]);
    if (dtype == MACO__PK_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

static __device__ __forceinline__ void maco__pk_store(void *p, uint64_t i, uint32_t dtype, float x)
{
    if (dtype == MACO__PK_F16)
        ((__half *)p)[i] = __float2half_rn(x);
    else if (dtype == MACO__PK_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
    else
        ((float *)p)[i] = x;
}

/* out = a + b (ADD), alpha * a (SCALE), a + alpha * b (RESIDUAL_ADD, one fused multiply-add:
 * fmaf(alpha, b, a)); fp32 arithmetic, each element rounded once to the output type. `rows`
 * rows of `count` elements (ptr[3]: rows in bits 0-15, 0 meaning 1; the row stride of a and b
 * in bits 16-39, of out in bits 40-63, in elements). float32 with 16-byte aligned rows moves
 * four elements per access. */
static __device__ __forceinline__ void maco__pk_elementwise(const maco_pk_task_t *t, uint32_t tid,
                                                            uint32_t nthreads)
{
    char *out = (char *)t->ptr[0];
    const char *a = (const char *)t->ptr[1];
    const char *b = (const char *)t->ptr[2];
    float alpha = t->alpha;
    uint32_t type = t->type, dtype = t->dtype;
    uint64_t n = t->count;
    uint64_t rows = t->ptr[3] & 0xffffu, ldi = (t->ptr[3] >> 16) & 0xffffffu, ldo = t->ptr[3] >> 40;
    if (rows == 0) {
        rows = 1;
        ldi = ldo = n;
    }
    uint64_t esz = dtype == MACO__PK_F32 ? 4 : 2;
    uintptr_t align = (uintptr_t)out | (uintptr_t)a | (type == MACO_PK_SCALE ? 0u : (uintptr_t)b);
    if (rows > 1)
        align |= (uintptr_t)(ldi * esz) | (uintptr_t)(ldo * esz) | (uintptr_t)(n * esz);
    uint64_t done = 0; /* elements of each row done by the vector loop */
    if (dtype == MACO__PK_F32 && (align & 15u) == 0) {
        uint64_t nv = n / 4, total = rows * nv;
        float c = type == MACO_PK_ADD ? 1.0f : alpha;
        for (uint64_t v = tid; v < total; v += nthreads) {
            uint64_t r = v / nv, i = v - r * nv;
            float4 x = ((const float4 *)(a + r * ldi * 4))[i], y;
            if (type == MACO_PK_SCALE) {
                y = make_float4(alpha * x.x, alpha * x.y, alpha * x.z, alpha * x.w);
            } else {
                float4 z = ((const float4 *)(b + r * ldi * 4))[i];
                y = make_float4(__fmaf_rn(c, z.x, x.x), __fmaf_rn(c, z.y, x.y),
                                __fmaf_rn(c, z.z, x.z), __fmaf_rn(c, z.w, x.w));
            }
            ((float4 *)(out + r * ldo * 4))[i] = y;
        }
        done = nv * 4;
    }
    uint64_t rest = n - done, total = rows * rest;
    for (uint64_t e = tid; e < total; e += nthreads) {
        uint64_t r = e / rest, i = done + (e - r * rest);
        float x = maco__pk_load(a + r * ldi * esz, i, dtype), y;
        if (type == MACO_PK_SCALE)
            y = alpha * x;
        else
            y = __fmaf_rn(type == MACO_PK_ADD ? 1.0f : alpha,
                          maco__pk_load(b + r * ldi * esz, i, dtype), x);
        maco__pk_store(out + r * ldo * esz, i, dtype, y);
    }
}

/* The rows and strides of a 2D element-wise or copy task (ptr[3]: rows in bits 0-15, 0
 * meaning one row of `count`; the input stride in bits 16-39, the output's in bits 40-63). */
static __device__ __forceinline__ uint64_t maco__pk_rows(const maco_pk_task_t *t, uint64_t *ldi,
                                                         uint64_t *ldo)
{
    uint64_t rows = t->ptr[3] & 0xffffu;
    *ldi = (t->ptr[3] >> 16) & 0xffffffu;
    *ldo = t->ptr[3] >> 40;
    if (rows == 0) {
        rows = 1;
        *ldi = *ldo = t->count;
    }
    return rows;
}

/* The byte offsets from a task's output to its twins in its out-mirror channels' remote
 * buffers (maco_pk_sync_t; at most MACO__PK_MIRRORS); returns how many. */
static __device__ __forceinline__ uint32_t maco__pk_out_mirrors(const maco_pk_view_t *v,
                                                                uint32_t task, uint64_t *delta)
{
    if (v->sync == 0)
        return 0;
    const maco_pk_sync_t *g = &v->sync[task];
    uint32_t n = g->out_count < MACO__PK_MIRRORS ? g->out_count : MACO__PK_MIRRORS;
    for (uint32_t j = 0; j < n; j++) {
        const maco_memory_channel_device_t *c = &v->channels[g->out_first + j];
        delta[j] = (uint64_t)(uintptr_t)c->remote - (uint64_t)(uintptr_t)c->local;
    }
    return n;
}

/* COPY: `count` bytes, or `rows` rows of `count` bytes with strides in bytes, to out and to
 * its mirrors. Eight 16-byte vectors in flight per thread where every address and stride is
 * 16-byte aligned (tiles and row blocks, what the fused operators send to peers), all loaded
 * before any is stored. */
static __device__ __forceinline__ void maco__pk_copy(const maco_pk_view_t *v,
                                                     const maco_pk_task_t *t, uint32_t task,
                                                     uint32_t tid, uint32_t nthreads)
{
    char *out = (char *)t->ptr[0];
    const char *a = (const char *)t->ptr[1];
    uint64_t ldi, ldo, n = t->count, delta[MACO__PK_MIRRORS];
    uint64_t rows = maco__pk_rows(t, &ldi, &ldo);
    uint32_t nm = maco__pk_out_mirrors(v, task, delta);
    if ((((uintptr_t)out | (uintptr_t)a | n | ldi | ldo) & 15u) != 0) {
        for (uint32_t m = 0; m <= nm; m++)
            for (uint64_t r = 0; r < rows; r++)
                maco_copy(out + (m == 0 ? 0 : delta[m - 1]) + r * ldo, a + r * ldi, n, tid,
                          nthreads);
        return;
    }
    enum { U = 8 };
    const uint64_t nv = n / 16, total = rows * nv, stride = nthreads;
    for (uint64_t v0 = tid; v0 < total; v0 += U * stride) {
        uint4 x[U];
        uint64_t off[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint64_t w = v0 + u * stride, r = w / nv;
            off[u] = r * ldo + (w - r * nv) * 16;
            if (w < total)
                x[u] = *(const uint4 *)(a + r * ldi + (w - r * nv) * 16);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (v0 + u * stride >= total)
                continue;
            *(uint4 *)(out + off[u]) = x[u];
            for (uint32_t m = 0; m < nm; m++)
                *(uint4 *)(out + delta[m] + off[u]) = x[u];
        }
    }
}

/* Eight bf16 of a 16-byte vector, added to acc (or assigned, first). */
static __device__ __forceinline__ void maco__pk_acc_bf16x8(float *acc, uint4 x, int first)
{
    uint32_t w[4] = { x.x, x.y, x.z, x.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float lo = __uint_as_float(w[i] << 16), hi = __uint_as_float(w[i] & 0xffff0000u);
        acc[2 * i] = first ? lo : acc[2 * i] + lo;
        acc[2 * i + 1] = first ? hi : acc[2 * i + 1] + hi;
    }
}

/* Four fp32 of a 16-byte vector, added to acc (or assigned, first). */
static __device__ __forceinline__ void maco__pk_acc_f32x4(float *acc, uint4 x, int first)
{
    float f[4] = { __uint_as_float(x.x), __uint_as_float(x.y), __uint_as_float(x.z),
                   __uint_as_float(x.w) };
#pragma unroll
    for (int i = 0; i < 4; i++)
        acc[i] = first ? f[i] : acc[i] + f[i];
}

/* SUM: out = in_0 + in_1 + ... in that order (fp32), in_j = ptr[1] + j * ptr[2] bytes; rows and
 * strides (elements) as for ADD; the result also to out's mirrors. 16-byte vectors (4 fp32 or
 * 8 bf16) where aligned, four per thread in flight for each input. */
static __device__ __forceinline__ void maco__pk_sum(const maco_pk_view_t *v,
                                                    const maco_pk_task_t *t, uint32_t task,
                                                    uint32_t tid, uint32_t nthreads)
{
    char *out = (char *)t->ptr[0];
    const char *in = (const char *)t->ptr[1];
    const uint64_t in_stride = t->ptr[2];
    const uint32_t nin = t->aux, dtype = t->dtype;
    const uint64_t esz = dtype == MACO__PK_F32 ? 4 : 2, n = t->count;
    uint64_t ldi, ldo, delta[MACO__PK_MIRRORS];
    uint64_t rows = maco__pk_rows(t, &ldi, &ldo);
    uint32_t nm = maco__pk_out_mirrors(v, task, delta);
    uintptr_t align =
        (uintptr_t)out | (uintptr_t)in | in_stride | (n * esz) | (ldi * esz) | (ldo * esz);
    if ((align & 15u) == 0 && dtype != MACO__PK_F16) {
        enum { U = 4 };
        const uint64_t per = 16 / esz, nv = n / per, total = rows * nv, stride = nthreads;
        for (uint64_t v0 = tid; v0 < total; v0 += U * stride) {
            float acc[U][8];
            uint64_t src[U], dst[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                uint64_t w = v0 + u * stride, r = w / nv, i = w - r * nv;
                src[u] = r * ldi * esz + i * 16;
                dst[u] = r * ldo * esz + i * 16;
            }
            for (uint32_t j = 0; j < nin; j++) {
                uint4 x[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    x[u] = v0 + u * stride < total ? *(const uint4 *)(in + j * in_stride + src[u])
                                                   : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (dtype == MACO__PK_F32)
                        maco__pk_acc_f32x4(acc[u], x[u], j == 0);
                    else
                        maco__pk_acc_bf16x8(acc[u], x[u], j == 0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (v0 + u * stride >= total)
                    continue;
                uint4 y;
                if (dtype == MACO__PK_F32) {
                    y = make_uint4(__float_as_uint(acc[u][0]), __float_as_uint(acc[u][1]),
                                   __float_as_uint(acc[u][2]), __float_as_uint(acc[u][3]));
                } else {
                    uint32_t w[4];
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        __nv_bfloat162 h = __floats2bfloat162_rn(acc[u][2 * q], acc[u][2 * q + 1]);
                        w[q] = *(uint32_t *)&h;
                    }
                    y = make_uint4(w[0], w[1], w[2], w[3]);
                }
                *(uint4 *)(out + dst[u]) = y;
                for (uint32_t m = 0; m < nm; m++)
                    *(uint4 *)(out + delta[m] + dst[u]) = y;
            }
        }
        return;
    }
    const uint64_t total = rows * n;
    for (uint64_t e = tid; e < total; e += nthreads) {
        uint64_t r = e / n, i = e - r * n;
        float acc = 0.0f;
        for (uint32_t j = 0; j < nin; j++) {
            float x = maco__pk_load(in + j * in_stride + (r * ldi) * esz, i, dtype);
            acc = j == 0 ? x : acc + x;
        }
        for (uint32_t m = 0; m <= nm; m++)
            maco__pk_store(out + (m == 0 ? 0 : delta[m - 1]) + (r * ldo) * esz, i, dtype, acc);
    }
}

/* MACO_PK_WAIT: one thread waits until the counter has the run's count of signals. */
static __device__ __forceinline__ maco_status_t maco__pk_wait_counter(const maco_pk_view_t *v,
                                                                      const maco_pk_task_t *t,
                                                                      uint32_t task, uint64_t run)
{
    const uint64_t *ctr = (const uint64_t *)t->ptr[1];
    uint64_t want = t->count * (run + 1), seen = 0;
    maco__pk_spin_t spin = { 0, 0 };
    while ((seen = maco_load_acquire_sys_u64(ctr)) < want) {
        maco_status_t st = maco__pk_spin(v, &spin, 1);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco__pk_record(v, st, (int)task, MACO_DEVICE_WAIT_TASK_COUNTER, want, seen);
            return st;
        }
    }
    return MACO_OK;
}

/* Runs task `task` (descriptor t) with threads tid = 0 .. nthreads - 1 of the CTA (the whole
 * CTA in maco_pk_run; the GMMA kernel's 256 consumer threads there). Single-thread parts (waits,
 * signals) run on tid 0. */
static __device__ __forceinline__ maco_status_t maco__pk_execute(const maco_pk_view_t *v,
                                                                 const maco_pk_task_t *t,
                                                                 uint32_t task, uint64_t run,
                                                                 maco_pk_user_fn_t user,
                                                                 uint32_t tid, uint32_t nthreads)
{
    switch (t->type) {
    case MACO_PK_NOP:
        return MACO_OK;
    case MACO_PK_COPY:
        maco__pk_copy(v, t, task, tid, nthreads);
        return MACO_OK;
    case MACO_PK_SUM:
        maco__pk_sum(v, t, task, tid, nthreads);
        return MACO_OK;
    case MACO_PK_ADD:
    case MACO_PK_SCALE:
    case MACO_PK_RESIDUAL_ADD:
        maco__pk_elementwise(t, tid, nthreads);
        return MACO_OK;
    case MACO_PK_SIGNAL:
        /* Release at system scope: this task's predecessors' writes (seen through the
         * dependency chain) are visible to whoever acquires the new count. */
        if (tid == 0)
            maco_red_add_release_sys_u64((uint64_t *)t->ptr[0], 1);
        return MACO_OK;
    case MACO_PK_WAIT:
        return tid == 0 ? maco__pk_wait_counter(v, t, task, run) : MACO_OK;
    case MACO_PK_CHANNEL_PUT:
        maco_memory_channel_put(&v->channels[t->aux], t->ptr[0], t->ptr[1], t->count, tid,
                                nthreads);
        return MACO_OK;
    case MACO_PK_CHANNEL_SIGNAL:
        if (tid == 0)
            maco_memory_channel_signal(&v->channels[t->aux]);
        return MACO_OK;
    case MACO_PK_CHANNEL_WAIT:
        return tid == 0 ? maco_memory_channel_wait(&v->channels[t->aux]) : MACO_OK;
    default:
        if ((t->type >= MACO_PK_USER || t->type == MACO_PK_GEMM_TILE) && user != 0)
            return user(v, t, task);
        if (tid == 0)
            maco__pk_record(v, MACO_ERR_INVALID_ARGUMENT, (int)task, MACO_DEVICE_ERR_TASK_TYPE,
                            t->type, 0);
        return MACO_ERR_INVALID_ARGUMENT;
    }
}

/* The `run` (earlier launches) of this launch, read by thread 0 and given to every thread. */
static __device__ __forceinline__ uint64_t maco__pk_cta_run(const maco_pk_view_t *v)
{
    __shared__ uint64_t run_s;
    if (threadIdx.x == 0)
        run_s = maco__pk_ld_relaxed(&v->ctr[MACO_PK_CTR_LAUNCHES]);
    __syncthreads();
    return run_s;
}

/* A scheduler CTA (block index >= W + C): all threads push the roots; a push's error has aborted
 * the launch, so the barrier and the inbox loop after them leave at their first check. */
static __device__ __noinline__ void maco__pk_scheduler_cta(const maco_pk_view_t *v, uint64_t run)
{
    uint32_t s = blockIdx.x - (v->nworkers + v->ncomm);
    (void)maco_pk_schedule_roots(v, s, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0 && maco_pk_roots_pushed(v, s, run) == MACO_OK)
        maco_pk_schedule_inbox(v, s, run); /* an error aborts the launch */
}

/* The end of every CTA (all threads): the last CTA out counts the launch, the next one's `run`. */
static __device__ __forceinline__ void maco__pk_cta_exit(const maco_pk_view_t *v, uint64_t run)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t total = (uint64_t)gridDim.x * (run + 1);
        if (maco__pk_fetch_add_acq_rel(&v->ctr[MACO_PK_CTR_EXITED], 1) + 1 == total)
            maco__pk_st_release(&v->ctr[MACO_PK_CTR_LAUNCHES], run + 1);
    }
}

/* A worker CTA's loop (all its threads): the next task whose gate is open, run by the whole
 * CTA, its profile record, its signal, its successors released; until the launch ends or a
 * task fails. */
static __device__ __forceinline__ void maco__pk_worker_loop(const maco_pk_view_t *v, uint64_t run,
                                                            maco_pk_user_fn_t user)
{
    __shared__ uint32_t task_s;
    __shared__ int32_t got_s, status_s;
    uint32_t tid = threadIdx.x;
    for (;;) {
        uint64_t start = 0;
        if (tid == 0) {
            uint32_t t = 0;
            maco_status_t st = MACO_OK;
            /* A task whose gate is closed goes to the back of the queue. */
            got_s = maco_pk_next_ready(v, blockIdx.x, run, &t, &st);
            task_s = t;
            status_s = MACO_OK;
            if (v->profile != 0)
                start = maco_globaltimer_ns();
        }
        __syncthreads();
        if (got_s != 1)
            break;
        uint32_t t = task_s;
        maco_status_t st = maco__pk_execute(v, &v->tasks[t], t, run, user, tid, blockDim.x);
        if (st != MACO_OK)
            atomicCAS((int *)&status_s, 0, (int)st);
        __syncthreads();
        if (status_s != MACO_OK) {
            if (tid == 0) {
                /* The first report wins: a task's own (a wait's) is kept; else this one says
                 * which task failed, so no abort goes unreported. */
                maco__pk_record(v, (maco_status_t)status_s, (int)t, MACO_DEVICE_ERR_TASK_FAILED,
                                v->tasks[t].type, 0);
                maco_pk_abort(v);
            }
            break;
        }
        if (tid == 0 && v->profile != 0) {
            uint32_t sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            maco_pk_profile_record_t *r = &v->profile[t];
            r->start_ns = start;
            r->end_ns = maco_globaltimer_ns();
            r->sm = sm;
            r->cta = blockIdx.x;
        }
        if (tid == 0)
            maco_pk_post_signal(v, t); /* after the barrier: every thread's writes */
        __syncwarp();
        if (tid < 32)
            maco_pk_complete(v, t, run, tid, 32); /* an error aborts: next() sees it */
    }
}

static __device__ __forceinline__ void maco_pk_run(const maco_pk_view_t *v, maco_pk_user_fn_t user)
{
    uint64_t run = maco__pk_cta_run(v);
    if (blockIdx.x < v->nworkers + v->ncomm)
        maco__pk_worker_loop(v, run, user);
    else
        maco__pk_scheduler_cta(v, run);
    maco__pk_cta_exit(v, run);
}

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_IMPL_PERSISTENT_H */
