/*
 * maco/device/impl/persistent_queue.h - the persistent kernel's queues and schedulers (maco/
 * device/persistent.h declares and documents them, with the queues' protocol). Included by
 * that header only; host and device alike (the CPU tests run the roles as host threads).
 */
#ifndef MACO_DEVICE_IMPL_PERSISTENT_QUEUE_H
#define MACO_DEVICE_IMPL_PERSISTENT_QUEUE_H

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
    return maco__pk_ld_acquire_sys(v->sync[task].wait) >= maco__pk_gate_want(&v->sync[task], run);
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
                                 MACO_DEVICE_WAIT_TASK_GATE, maco__pk_gate_want(g, run),
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

#endif /* MACO_DEVICE_IMPL_PERSISTENT_QUEUE_H */
