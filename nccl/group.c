/*
 * group.c - ncclGroupStart/End/SimulateEnd (shim.h).
 *
 * Each thread has its own group depth and queue. Inside a group, calls are checked and
 * recorded (by value: pointers, counts, the PreMulSum scalar), and communicator creations are
 * recorded too. The outermost ncclGroupEnd first creates the recorded communicators, all at
 * once (one thread each: they may be ranks of one job, as in NCCL's documented loop over
 * devices), then issues the recorded calls in one MACO group (maco_group_start/end: MACO
 * checks them all before issuing any, and runs each communicator's sends and receives as one
 * launch), then the PreMulSum scaling. A call outside a group is the same with a queue of one.
 *
 * Forwarding: when MACO answers MACO_ERR_UNSUPPORTED for a rank that has a GPU (for example a
 * collective across nodes), the same calls go to the real NCCL, in one real group
 * (fallback.c); the communicator remembers the kind of call, so later ones of that kind go to
 * NCCL at once (MACO's refusal is logged once, not at every call). A group with any call
 * that must go to NCCL goes there whole: its sends and receives must all meet in one library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

typedef struct maco_nccl__pending_init {
    struct ncclComm *comm;
    ncclUniqueId id;
} maco_nccl__pending_init_t;

static _Thread_local int maco_nccl__depth;
static _Thread_local maco_nccl__op_t *maco_nccl__queue;
static _Thread_local int maco_nccl__nqueued, maco_nccl__queue_cap;
static _Thread_local maco_nccl__pending_init_t *maco_nccl__inits;
static _Thread_local int maco_nccl__ninits, maco_nccl__inits_cap;
static _Thread_local ncclResult_t maco_nccl__group_error;

/* Grows a thread's array to hold one more element; 0, or -1 when out of memory. */
static int maco_nccl__grow(void **array, int *cap, int used, size_t elem)
{
    if (used < *cap)
        return 0;
    int ncap = *cap > 0 ? 2 * *cap : 16;
    void *p = realloc(*array, (size_t)ncap * elem);
    if (p == NULL)
        return -1;
    *array = p;
    *cap = ncap;
    return 0;
}

/* Bit of a kind of call in a communicator's forward_kinds mask. */
static unsigned maco_nccl__kind_bit(maco_nccl__kind_t kind)
{
    return 1u << (unsigned)kind;
}

static ncclResult_t maco_nccl__run_ops(const maco_nccl__op_t *ops, int n);

/* Issues ops[0..n): on MACO, or all of them forwarded; PreMulSum ops from their scaled input
 * (a temporary each, freed on its stream once everything is issued). */
static ncclResult_t maco_nccl__run_held(const maco_nccl__op_t *ops, int n);

/* Holds every op's communicator while the ops are issued (another thread may destroy one);
 * refuses the whole batch, before anything reads through a communicator, when one was
 * destroyed since its call was made, also when a new one was made at the same address (its
 * serial differs). */
static ncclResult_t maco_nccl__run(const maco_nccl__op_t *ops, int n)
{
    int held = 0;
    ncclResult_t res = ncclSuccess;
    for (; held < n; held++) {
        if (maco_nccl__comm_hold(ops[held].comm, ops[held].serial) == NULL) {
            res = maco_nccl__fail(ncclInvalidArgument,
                                  "%s: its communicator %p was destroyed while the call waited "
                                  "in a group; nothing of the group was issued",
                                  maco_nccl__call_name(ops[held].call), (void *)ops[held].comm);
            break;
        }
    }
    if (res == ncclSuccess)
        res = maco_nccl__run_held(ops, n);
    for (int i = 0; i < held; i++)
        maco_nccl__comm_unhold(ops[i].comm);
    return res;
}

/* maco_nccl__run's work, every communicator held. */
static ncclResult_t maco_nccl__run_held(const maco_nccl__op_t *ops, int n)
{
    int premul = 0;
    for (int i = 0; i < n; i++)
        premul += ops[i].premul;
    if (premul == 0)
        return maco_nccl__run_ops(ops, n);
    maco_nccl__op_t *mine = malloc((size_t)n * sizeof(*mine));
    void **tmp = calloc((size_t)n, sizeof(*tmp));
    if (mine == NULL || tmp == NULL) {
        free(mine);
        free(tmp);
        return maco_nccl__fail(ncclSystemError, "%s: out of host memory for a group of %d calls",
                               maco_nccl__call_name(ops[0].call), n);
    }
    memcpy(mine, ops, (size_t)n * sizeof(*mine));
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < n && res == ncclSuccess; i++)
        res = maco_nccl__op_prepare(&mine[i], &tmp[i]);
    if (res == ncclSuccess)
        res = maco_nccl__run_ops(mine, n);
    for (int i = 0; i < n; i++)
        maco_nccl__op_release(&mine[i], tmp[i]);
    free(mine);
    free(tmp);
    return res;
}

/*
 * NCCL's ncclCommRegister is local and NCCL exchanges the buffers' handles at the collectives
 * that use them; MACO's collectives never import peers' memory themselves, so before the
 * reductions and gathers run, each one's communicator maps what its local peers registered
 * since the last time (maco_collective_map_registrations: one load per peer when nothing is
 * new, so a communicator named by several ops of the batch costs no more). A registration that does
 * not map only leaves its calls in scratch, as NCCL falls back to its buffers: the status is
 * dropped (logged once by MACO).
 */
static int maco_nccl__may_run_in_place(const maco_nccl__op_t *o)
{
    int mesh = o->kind == MACO_NCCL_ALLREDUCE || o->kind == MACO_NCCL_BROADCAST ||
               o->kind == MACO_NCCL_REDUCE || o->kind == MACO_NCCL_ALLGATHER ||
               o->kind == MACO_NCCL_REDUCESCATTER;
    return mesh && o->comm->device >= 0 && o->comm->nranks > 1;
}

static void maco_nccl__map_registrations(const maco_nccl__op_t *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (maco_nccl__may_run_in_place(&ops[i]))
            (void)maco_collective_map_registrations(ops[i].comm->maco);
}

/* maco_nccl__run's work once the inputs are ready. */
static ncclResult_t maco_nccl__run_ops(const maco_nccl__op_t *ops, int n)
{
    int forward = 0;
    for (int i = 0; i < n; i++) {
        struct ncclComm *c = ops[i].comm;
        if (c->maco == NULL)
            return maco_nccl__fail(ncclInvalidUsage,
                                   "%s: the communicator was not created (its creation failed)",
                                   maco_nccl__call_name(ops[i].call));
        if (c->forward_kinds & maco_nccl__kind_bit(ops[i].kind))
            forward = 1;
    }
    if (forward)
        return maco_nccl__op_forward(ops, n,
                                     "MACO_NCCL_FORWARD names it, or MACO refused this kind of "
                                     "call on this communicator before");
    maco_nccl__map_registrations(ops, n);
    maco_status_t st;
    if (n == 1) {
        st = maco_nccl__op_issue(&ops[0]);
    } else {
        st = maco_group_start();
        for (int i = 0; i < n && st == MACO_OK; i++)
            maco_nccl__op_issue(&ops[i]); /* an error is kept by the group and returned below */
        maco_status_t end = maco_group_end();
        if (st == MACO_OK)
            st = end;
    }
    if (st == MACO_ERR_UNSUPPORTED) {
        int gpus = 1;
        for (int i = 0; i < n; i++)
            gpus = gpus && ops[i].comm->device >= 0;
        if (gpus && maco_nccl__fallback_mode() == 1) {
            char why[512];
            snprintf(why, sizeof(why), "%s", maco_log_last_error());
            for (int i = 0; i < n; i++)
                ops[i].comm->forward_kinds |= maco_nccl__kind_bit(ops[i].kind);
            return maco_nccl__op_forward(ops, n, why);
        }
        if (gpus && maco_nccl__fallback_mode() == 0)
            return maco_nccl__fail(ncclInvalidUsage,
                                   "%s: MACO cannot run it (%s) and MACO_NCCL_FALLBACK=never "
                                   "keeps it from NCCL",
                                   maco_nccl__call_name(ops[0].call), maco_log_last_error());
    }
    if (st != MACO_OK) {
        for (int i = 0; i < n; i++)
            maco_nccl__comm_note(ops[i].comm, st);
        return maco_nccl__fail_maco(st, maco_nccl__call_name(ops[0].call));
    }
    for (int i = 0; i < n; i++)
        maco_nccl__count_native(ops[i].call);
    return ncclSuccess;
}

ncclResult_t maco_nccl__group_submit(const maco_nccl__op_t *op)
{
    if (maco_nccl__depth == 0)
        return maco_nccl__run(op, 1);
    if (maco_nccl__grow((void **)&maco_nccl__queue, &maco_nccl__queue_cap, maco_nccl__nqueued,
                        sizeof(*op)) != 0) {
        maco_nccl__group_note_error(ncclSystemError);
        return maco_nccl__fail(ncclSystemError, "%s in a group: out of host memory",
                               maco_nccl__call_name(op->call));
    }
    maco_nccl__queue[maco_nccl__nqueued++] = *op;
    return ncclSuccess;
}

int maco_nccl__group_forget(const struct ncclComm *comm)
{
    int dropped = 0, k = 0;
    for (int i = 0; i < maco_nccl__nqueued; i++) {
        if (maco_nccl__queue[i].comm == comm)
            dropped++;
        else
            maco_nccl__queue[k++] = maco_nccl__queue[i];
    }
    maco_nccl__nqueued = k;
    k = 0;
    for (int i = 0; i < maco_nccl__ninits; i++) {
        if (maco_nccl__inits[i].comm == comm)
            dropped++;
        else
            maco_nccl__inits[k++] = maco_nccl__inits[i];
    }
    maco_nccl__ninits = k;
    if (dropped > 0)
        maco_nccl__group_note_error(ncclInvalidUsage);
    return dropped;
}

int maco_nccl__group_defer_init(struct ncclComm *comm, const ncclUniqueId *id)
{
    if (maco_nccl__depth == 0)
        return 0;
    if (maco_nccl__grow((void **)&maco_nccl__inits, &maco_nccl__inits_cap, maco_nccl__ninits,
                        sizeof(*maco_nccl__inits)) != 0)
        return 0; /* created now instead */
    maco_nccl__inits[maco_nccl__ninits].comm = comm;
    maco_nccl__inits[maco_nccl__ninits].id = *id;
    maco_nccl__ninits++;
    return 1;
}

void maco_nccl__group_note_error(ncclResult_t res)
{
    if (maco_nccl__depth > 0 && maco_nccl__group_error == ncclSuccess)
        maco_nccl__group_error = res;
}

/* Creates the communicators recorded in this thread's group, all at once. */
static ncclResult_t maco_nccl__run_inits(void)
{
    int n = maco_nccl__ninits;
    maco_nccl__ninits = 0;
    if (n == 0)
        return ncclSuccess;
    struct ncclComm **comms = malloc(sizeof(*comms) * (size_t)n);
    ncclUniqueId *ids = malloc(sizeof(*ids) * (size_t)n);
    ncclResult_t res;
    if (comms == NULL || ids == NULL) {
        res = maco_nccl__fail(ncclSystemError, "ncclGroupEnd: out of host memory");
    } else {
        for (int i = 0; i < n; i++) {
            comms[i] = maco_nccl__inits[i].comm;
            ids[i] = maco_nccl__inits[i].id;
        }
        res = maco_nccl__comm_join_all(comms, ids, n);
    }
    free(comms);
    free(ids);
    return res;
}

/* Frees this thread's group arrays (after the outermost group end: a thread that ends keeps
 * nothing allocated). */
static void maco_nccl__group_release(void)
{
    free(maco_nccl__queue);
    maco_nccl__queue = NULL;
    maco_nccl__queue_cap = 0;
    free(maco_nccl__inits);
    maco_nccl__inits = NULL;
    maco_nccl__inits_cap = 0;
}

/* Closes one level; at the outermost, creates the recorded communicators and (when `issue`)
 * runs the recorded calls. */
static ncclResult_t maco_nccl__group_close(int issue)
{
    if (maco_nccl__depth == 0)
        return maco_nccl__fail(ncclInvalidUsage,
                               "ncclGroupEnd: no group is open on this thread (ncclGroupStart "
                               "first)");
    if (--maco_nccl__depth > 0)
        return ncclSuccess;
    ncclResult_t res = maco_nccl__run_inits();
    ncclResult_t err = maco_nccl__group_error;
    maco_nccl__group_error = ncclSuccess;
    int n = maco_nccl__nqueued;
    maco_nccl__nqueued = 0;
    if (err != ncclSuccess) {
        maco_nccl__group_release();
        /* The failing call was named when it was made; nothing of the group is issued. */
        return maco_nccl__fail(err, "ncclGroupEnd: a call of the group failed its checks (see the "
                                    "error above); nothing of the group was issued");
    }
    if (res == ncclSuccess && issue && n > 0)
        res = maco_nccl__run(maco_nccl__queue, n);
    maco_nccl__group_release();
    return res;
}

ncclResult_t pncclGroupStart(void)
{
    if (maco_nccl__depth == (1 << 20))
        return maco_nccl__fail(ncclInvalidUsage, "ncclGroupStart: groups nested 2^20 deep");
    maco_nccl__depth++;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclGroupStart)

ncclResult_t pncclGroupEnd(void)
{
    return maco_nccl__group_close(1);
}
MACO_NCCL_ALIAS(ncclGroupEnd)

/*
 * Estimates the group's time without running it, then ends the group with nothing issued
 * (communicators recorded in it are still created). The estimate, in microseconds, is a
 * rough model, not a measurement: per call 10 us plus its bytes moved at 100 GB/s.
 */
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    if (simInfo != NULL && (simInfo->magic != 0x74685283u || simInfo->size < sizeof(float) + 16))
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclGroupSimulateEnd: simInfo was not set up with "
                               "NCCL_SIM_INFO_INITIALIZER (magic %#x, size %zu)",
                               simInfo->magic, simInfo->size);
    float us = 0.0f;
    if (maco_nccl__depth == 1) {
        for (int i = 0; i < maco_nccl__nqueued; i++) {
            const maco_nccl__op_t *o = &maco_nccl__queue[i];
            double bytes = (double)o->count * (double)maco_nccl__type_size(o->type);
            us += (float)(10.0 + bytes / 100e3);
        }
    }
    ncclResult_t res = maco_nccl__group_close(0);
    if (res == ncclSuccess && simInfo != NULL)
        simInfo->estimatedTime = us;
    return res;
}
MACO_NCCL_ALIAS(ncclGroupSimulateEnd)
