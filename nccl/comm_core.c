/*
 * comm_core.c - creating and freeing communicators (shim.h).
 *
 * An NCCL communicator here is a MACO communicator over a MACO bootstrap that it owns. The
 * 128-byte ncclUniqueId holds a MACO unique id (maco_unique_id_create: magic, version, nonce,
 * rank 0's address), or, when NCCL_COMM_ID gives rank 0's address, a marker and that
 * address: then every rank can make the same id itself, as with NCCL, and the job is joined
 * through MACO's environment initialisation with that address.
 *
 * Splits run on the parent's bootstrap: every rank sends (color, key) to all (an allgather),
 * each new communicator's first rank makes a MACO unique id and sends it to the others of
 * its color (tagged bootstrap messages), and they all join it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

/* An ncclUniqueId made from NCCL_COMM_ID: this marker, then rank 0's "host:port". */
static const char maco_nccl__addr_marker[16] = "MACO NCCL_COMM:";

/* The communicators alive in this process: a pointer is looked up here before anything
 * reads through it, so a destroyed or made-up ncclComm_t is refused, not dereferenced. */
static pthread_mutex_t maco_nccl__live_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t maco_nccl__live_cond = PTHREAD_COND_INITIALIZER; /* a hold ended */
static struct ncclComm **maco_nccl__live;
static size_t maco_nccl__nlive, maco_nccl__live_cap;
static uint64_t maco_nccl__serials; /* the last serial given (under the lock) */

static int maco_nccl__live_add(struct ncclComm *c)
{
    int ok = 1;
    pthread_mutex_lock(&maco_nccl__live_lock);
    if (maco_nccl__nlive == maco_nccl__live_cap) {
        size_t cap = maco_nccl__live_cap == 0 ? 16 : maco_nccl__live_cap * 2;
        struct ncclComm **p = realloc(maco_nccl__live, cap * sizeof(*p));
        if (p == NULL) {
            ok = 0;
        } else {
            maco_nccl__live = p;
            maco_nccl__live_cap = cap;
        }
    }
    if (ok) {
        c->serial = ++maco_nccl__serials;
        maco_nccl__live[maco_nccl__nlive++] = c;
    }
    pthread_mutex_unlock(&maco_nccl__live_lock);
    return ok;
}

/* Where `c` is in the registry, or -1 (called with the lock held; reads nothing through c). */
static long maco_nccl__live_find(const struct ncclComm *c)
{
    for (size_t i = 0; c != NULL && i < maco_nccl__nlive; i++)
        if (maco_nccl__live[i] == c)
            return (long)i;
    return -1;
}

int maco_nccl__comm_unlink(const struct ncclComm *comm)
{
    pthread_mutex_lock(&maco_nccl__live_lock);
    long i = maco_nccl__live_find(comm);
    if (i >= 0)
        maco_nccl__live[i] = maco_nccl__live[--maco_nccl__nlive];
    pthread_mutex_unlock(&maco_nccl__live_lock);
    return i >= 0;
}

int maco_nccl__comm_valid(const struct ncclComm *comm)
{
    pthread_mutex_lock(&maco_nccl__live_lock);
    long i = maco_nccl__live_find(comm);
    pthread_mutex_unlock(&maco_nccl__live_lock);
    return i >= 0;
}

struct ncclComm *maco_nccl__comm_hold(const struct ncclComm *comm, uint64_t serial)
{
    struct ncclComm *c = NULL;
    pthread_mutex_lock(&maco_nccl__live_lock);
    long i = maco_nccl__live_find(comm);
    if (i >= 0 && (serial == 0 || maco_nccl__live[i]->serial == serial)) {
        c = maco_nccl__live[i];
        c->holds++;
    }
    pthread_mutex_unlock(&maco_nccl__live_lock);
    return c;
}

void maco_nccl__comm_unhold(struct ncclComm *c)
{
    pthread_mutex_lock(&maco_nccl__live_lock);
    if (--c->holds == 0)
        pthread_cond_broadcast(&maco_nccl__live_cond);
    pthread_mutex_unlock(&maco_nccl__live_lock);
}

/* Waits until no thread holds `c` (taken out of the registry already, so no new hold comes).
 * Holds are short (a query, a group's issue, bounded by the bootstrap's and devices'
 * timeouts). */
static void maco_nccl__comm_drain(struct ncclComm *c)
{
    pthread_mutex_lock(&maco_nccl__live_lock);
    while (c->holds > 0)
        pthread_cond_wait(&maco_nccl__live_cond, &maco_nccl__live_lock);
    pthread_mutex_unlock(&maco_nccl__live_lock);
}

struct ncclComm *maco_nccl__comm_alloc(int nranks, int rank, int device, int blocking,
                                       const char *name)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    if (!maco_nccl__live_add(c)) {
        free(c);
        return NULL;
    }
    c->magic = MACO_NCCL_COMM_MAGIC;
    c->nranks = nranks;
    c->rank = rank;
    c->device = device;
    c->blocking = blocking;
    snprintf(c->name, sizeof(c->name), "%s", name != NULL ? name : "");
    c->state = MACO_NCCL_COMM_PENDING;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

int maco_nccl__id_from_address(ncclUniqueId *id, const char *address)
{
    if (strlen(address) + sizeof(maco_nccl__addr_marker) >= sizeof(id->internal))
        return -1;
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, maco_nccl__addr_marker, sizeof(maco_nccl__addr_marker));
    memcpy(id->internal + sizeof(maco_nccl__addr_marker), address, strlen(address));
    return 0;
}

/* Joins through MACO's environment initialisation with the address of an NCCL_COMM_ID id.
 * The environment is the only way in, so its variables are set for the call and put
 * back after it, under a lock (creations from several threads take turns). */
static maco_status_t maco_nccl__join_address(const char *address, int rank, int nranks,
                                             maco_bootstrap_t *bs_p)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    /* MACO_LAUNCHER=maco: the communicator's ranks are the application's, which need not be
     * those of the launcher that started the process (srun, mpirun, torchrun). */
    static const char *const names[5] = { "MACO_BOOTSTRAP_ADDR", "MACO_RANK", "MACO_WORLD_SIZE",
                                          "MACO_LAUNCHER", "MACO_BOOTSTRAP_NONCE" };
    char values[5][128];
    snprintf(values[0], sizeof(values[0]), "%s", address);
    snprintf(values[1], sizeof(values[1]), "%d", rank);
    snprintf(values[2], sizeof(values[2]), "%d", nranks);
    snprintf(values[3], sizeof(values[3]), "maco");
    /* NCCL_COMM_ID is NCCL's way in and carries no secret, in NCCL as here: the job nonce is
     * the address's FNV-1a hash unless every rank was given MACO_BOOTSTRAP_NONCE, which then
     * keeps other local processes out (docs/nccl.md). */
    const char *given = getenv(names[4]);
    int n = given != NULL && given[0] != '\0' ? 4 : 5;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = address; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    snprintf(values[4], sizeof(values[4]), "%016llx", (unsigned long long)h);
    pthread_mutex_lock(&lock);
    char *saved[5];
    for (int i = 0; i < n; i++) {
        const char *old = getenv(names[i]);
        saved[i] = old != NULL ? strdup(old) : NULL;
        setenv(names[i], values[i], 1);
    }
    maco_status_t st = maco_bootstrap_create_from_env(bs_p);
    for (int i = 0; i < n; i++) {
        if (saved[i] != NULL)
            setenv(names[i], saved[i], 1);
        else
            unsetenv(names[i]);
        free(saved[i]);
    }
    pthread_mutex_unlock(&lock);
    return st;
}

unsigned maco_nccl__forward_setting(void)
{
    static const struct {
        const char *name;
        maco_nccl__kind_t kind;
    } calls[] = {
        { "ncclAllReduce", MACO_NCCL_ALLREDUCE }, { "ncclBroadcast", MACO_NCCL_BROADCAST },
        { "ncclBcast", MACO_NCCL_BROADCAST },     { "ncclReduce", MACO_NCCL_REDUCE },
        { "ncclAllGather", MACO_NCCL_ALLGATHER }, { "ncclReduceScatter", MACO_NCCL_REDUCESCATTER },
        { "ncclAlltoAll", MACO_NCCL_ALLTOALL },   { "ncclGather", MACO_NCCL_GATHER },
        { "ncclScatter", MACO_NCCL_SCATTER },     { "ncclSend", MACO_NCCL_SEND },
        { "ncclRecv", MACO_NCCL_RECV },
    };
    const char *v = getenv("MACO_NCCL_FORWARD");
    unsigned mask = 0;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", v != NULL ? v : "");
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok != NULL; tok = strtok_r(NULL, ", ", &save)) {
        size_t i = 0;
        while (i < sizeof(calls) / sizeof(calls[0]) && strcmp(tok, calls[i].name) != 0)
            i++;
        if (i < sizeof(calls) / sizeof(calls[0]))
            mask |= 1u << (unsigned)calls[i].kind;
        else
            maco_log_write(MACO_LOG_WARN, "init",
                           "nccl: MACO_NCCL_FORWARD names '%s', which is no collective or "
                           "send/recv call of NCCL; ignored",
                           tok);
    }
    return mask;
}

ncclResult_t maco_nccl__comm_join(struct ncclComm *c, const ncclUniqueId *id)
{
    maco_bootstrap_t bs = NULL;
    maco_comm_t mc = NULL;
    maco_status_t st;
    if (memcmp(id->internal, maco_nccl__addr_marker, sizeof(maco_nccl__addr_marker)) == 0) {
        char address[sizeof(id->internal)];
        memcpy(address, id->internal + sizeof(maco_nccl__addr_marker),
               sizeof(id->internal) - sizeof(maco_nccl__addr_marker));
        address[sizeof(id->internal) - sizeof(maco_nccl__addr_marker)] = '\0';
        st = maco_nccl__join_address(address, c->rank, c->nranks, &bs);
    } else {
        st = maco_bootstrap_create((const maco_unique_id_t *)(const void *)id, c->rank, c->nranks,
                                   -1, &bs);
    }
    if (st == MACO_OK)
        st = maco_comm_create(bs, c->device, &mc);
    ncclResult_t res;
    if (st != MACO_OK) {
        res = maco_nccl__fail_maco(st, "creating the communicator");
        maco_bootstrap_destroy(bs);
        bs = NULL;
    } else {
        res = ncclSuccess;
        maco_comm_get_cuda_device(mc, &c->device);
        maco_nccl__count_native(MACO_NCCL_CALL_ncclCommInitRank);
    }
    c->bs = bs;
    c->maco = mc;
    c->init_result = res;
    /* A communicator over several nodes makes its NCCL communicator now, while every rank is
     * here: MACO runs no collective across nodes yet, and a send/recv group that leaves a rank
     * out could not make it later (fallback.c). */
    int nnodes = 1;
    if (res == ncclSuccess && maco_comm_get_nnodes(mc, &nnodes) == MACO_OK && nnodes > 1 &&
        c->device >= 0 && maco_nccl__fallback_mode() == 1 &&
        maco_nccl__fallback_open(NULL, 0) == ncclSuccess)
        maco_nccl__fallback_comm(c);
    c->forward_kinds = maco_nccl__forward_setting();
    __atomic_store_n(&c->state, res == ncclSuccess ? MACO_NCCL_COMM_READY : MACO_NCCL_COMM_FAILED,
                     __ATOMIC_RELEASE);
    return res;
}

typedef struct maco_nccl__join_job {
    struct ncclComm *comm;
    ncclUniqueId id;
} maco_nccl__join_job_t;

static void maco_nccl__comm_release(struct ncclComm *c, int abort, ncclResult_t *res_p);

static void *maco_nccl__join_thread(void *arg)
{
    maco_nccl__join_job_t *job = arg;
    struct ncclComm *c = job->comm;
    if (c->device >= 0)
        cudaSetDevice(c->device);
    maco_nccl__comm_join(c, &job->id);
    free(job);
    /* Destroyed or aborted while it was being made (maco_nccl__comm_abandon): the communicator
     * is this thread's to free, now that the creation has ended. */
    pthread_mutex_lock(&c->lock);
    int abandoned = c->abandoned;
    pthread_mutex_unlock(&c->lock);
    if (abandoned) {
        maco_log_write(MACO_LOG_INFO, "init",
                       "nccl: rank %d: a communicator %s during its non-blocking creation is "
                       "freed now that the creation ended (%s)",
                       c->rank, abandoned == 2 ? "aborted" : "destroyed",
                       ncclGetErrorString(c->init_result));
        maco_nccl__comm_release(c, abandoned == 2, NULL);
    }
    return NULL;
}

ncclResult_t maco_nccl__comm_join_async(struct ncclComm *c, const ncclUniqueId *id)
{
    maco_nccl__join_job_t *job = malloc(sizeof(*job));
    if (job == NULL)
        return maco_nccl__fail(ncclSystemError, "creating a communicator: out of host memory");
    job->comm = c;
    job->id = *id;
    int rc = pthread_create(&c->init_thread, NULL, maco_nccl__join_thread, job);
    if (rc != 0) {
        free(job);
        return maco_nccl__fail(ncclSystemError, "creating a communicator: pthread_create: %s",
                               strerror(rc));
    }
    c->has_init_thread = 1;
    c->async_init = 1;
    return ncclInProgress;
}

ncclResult_t maco_nccl__comm_join_all(struct ncclComm **comms, const ncclUniqueId *ids, int n)
{
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < n; i++) {
        ncclResult_t r = maco_nccl__comm_join_async(comms[i], &ids[i]);
        if (r != ncclInProgress && res == ncclSuccess)
            res = r;
    }
    for (int i = 0; i < n; i++) {
        if (comms[i]->has_init_thread) {
            pthread_join(comms[i]->init_thread, NULL);
            comms[i]->has_init_thread = 0;
        }
        if (res == ncclSuccess && comms[i]->init_result != ncclSuccess)
            res = comms[i]->init_result;
    }
    return res;
}

/* Waits for a creation running on its own thread. One caller joins the thread (taken under
 * the lock, joined outside it: the creation itself takes the lock); others wait for the state
 * to leave PENDING. Both waits end: the creation is maco_comm_create, whose every exchange
 * is bounded by the bootstrap's timeout (MACO_BOOTSTRAP_TIMEOUT), after which the state is
 * FAILED. */
static void maco_nccl__comm_wait(struct ncclComm *c)
{
    pthread_mutex_lock(&c->lock);
    int join = c->has_init_thread;
    pthread_t t = c->init_thread;
    c->has_init_thread = 0;
    pthread_mutex_unlock(&c->lock);
    if (join) {
        pthread_join(t, NULL);
        return;
    }
    while (c->async_init && __atomic_load_n(&c->state, __ATOMIC_ACQUIRE) == MACO_NCCL_COMM_PENDING)
        usleep(1000);
}

ncclResult_t maco_nccl__comm_ready(struct ncclComm *comm, const char *what)
{
    struct ncclComm *c = maco_nccl__comm_hold(comm, 0);
    if (c == NULL)
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: comm %p is not a communicator (NULL, destroyed or foreign)",
                               what, (void *)comm);
    maco_nccl__comm_wait(c);
    ncclResult_t res = ncclSuccess;
    switch (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE)) {
    case MACO_NCCL_COMM_READY:
    case MACO_NCCL_COMM_PENDING: /* created at the end of this thread's open group */
        break;
    case MACO_NCCL_COMM_FAILED:
        res = maco_nccl__fail(ncclInvalidUsage, "%s: the communicator's creation failed (%s)", what,
                              pncclGetErrorString(c->init_result));
        break;
    default:
        res = maco_nccl__fail(ncclInvalidUsage, "%s: the communicator was revoked", what);
    }
    maco_nccl__comm_unhold(c);
    return res;
}

/* Bootstrap tag of a split's unique id: "NC" and the parent's split number (user tags are
 * below MACO_BOOTSTRAP_MAX_USER_TAG). */
#define MACO_NCCL_SPLIT_TAG(seq) (0x4e430000u | ((seq)&0xffffu))

/* Makes the communicator of parent ranks members[0..m) (this rank among them, new ranks in
 * that order): members[0] makes a MACO unique id and sends it to the others over the
 * parent's bootstrap under `tag`, then all join it. */
static ncclResult_t maco_nccl__comm_of(struct ncclComm *parent, const int *members, int m,
                                       uint32_t tag, struct ncclComm **child_p, int blocking,
                                       const char *name, maco_nccl__call_t call)
{
    int my_new = -1;
    for (int j = 0; j < m; j++)
        if (members[j] == parent->rank)
            my_new = j;
    if (my_new < 0)
        return maco_nccl__fail(ncclInternalError, "%s: this rank is not in its new communicator",
                               maco_nccl__call_name(call));
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    maco_status_t st = MACO_OK;
    if (my_new == 0) {
        st = maco_unique_id_create((maco_unique_id_t *)(void *)&id);
        for (int j = 1; j < m && st == MACO_OK; j++)
            st = maco_bootstrap_send(parent->bs, members[j], tag, &id, sizeof(id));
    } else {
        st = maco_bootstrap_recv(parent->bs, members[0], tag, &id, sizeof(id));
    }
    if (st != MACO_OK) {
        maco_nccl__comm_note(parent, st);
        return maco_nccl__fail_maco(st, "sending the new communicator's id");
    }
    struct ncclComm *child = maco_nccl__comm_alloc(m, my_new, parent->device, blocking, name);
    if (child == NULL)
        return maco_nccl__fail(ncclSystemError, "%s: out of host memory",
                               maco_nccl__call_name(call));
    maco_nccl__count_native(call);
    *child_p = child;
    return blocking ? maco_nccl__comm_join(child, &id) : maco_nccl__comm_join_async(child, &id);
}

ncclResult_t maco_nccl__comm_split(struct ncclComm *parent, int color, int key,
                                   struct ncclComm **child_p, int blocking, const char *name)
{
    int n = parent->nranks, me = parent->rank;
    *child_p = NULL;
    int *all = malloc(sizeof(int) * 2 * (size_t)n);
    int *members = malloc(sizeof(int) * (size_t)n);
    if (all == NULL || members == NULL) {
        free(all);
        free(members);
        return maco_nccl__fail(ncclSystemError, "ncclCommSplit: out of host memory");
    }
    all[2 * me] = color;
    all[2 * me + 1] = key;
    uint32_t tag = MACO_NCCL_SPLIT_TAG(parent->split_seq++);
    maco_status_t st = maco_bootstrap_allgather(parent->bs, all, 2 * sizeof(int));
    ncclResult_t res = ncclSuccess;
    if (st != MACO_OK) {
        maco_nccl__comm_note(parent, st);
        res = maco_nccl__fail_maco(st, "ncclCommSplit: exchanging colors and keys");
    } else if (color != NCCL_SPLIT_NOCOLOR) {
        /* Members of this color in (key, parent rank) order: an insertion sort, stable. */
        int m = 0;
        for (int r = 0; r < n; r++) {
            if (all[2 * r] != color)
                continue;
            int j = m++;
            while (j > 0 && all[2 * members[j - 1] + 1] > all[2 * r + 1]) {
                members[j] = members[j - 1];
                j--;
            }
            members[j] = r;
        }
        res = maco_nccl__comm_of(parent, members, m, tag, child_p, blocking, name,
                                 MACO_NCCL_CALL_ncclCommSplit);
    }
    free(all);
    free(members);
    return res;
}

ncclResult_t maco_nccl__comm_shrink(struct ncclComm *parent, const int *exclude, int nexclude,
                                    int abort, struct ncclComm **child_p, int blocking,
                                    const char *name)
{
    *child_p = NULL;
    maco_comm_t mc = NULL;
    maco_status_t st =
        maco_comm_shrink(parent->maco, exclude, nexclude, abort ? MACO_SHRINK_ABORT : 0u, &mc);
    if (st != MACO_OK) {
        maco_nccl__comm_note(parent, st);
        return maco_nccl__fail_maco(st, "ncclCommShrink");
    }
    if (mc == NULL) /* this rank was excluded (by another caller's list) */
        return ncclSuccess;
    int rank = 0, nranks = 0;
    maco_comm_get_rank(mc, &rank);
    maco_comm_get_nranks(mc, &nranks);
    struct ncclComm *child = maco_nccl__comm_alloc(nranks, rank, parent->device, blocking, name);
    if (child == NULL) {
        maco_comm_destroy(mc);
        return maco_nccl__fail(ncclSystemError, "ncclCommShrink: out of host memory");
    }
    maco_comm_get_bootstrap(mc, &child->bs);
    child->bs_of_maco = 1;
    child->maco = mc;
    child->init_result = ncclSuccess;
    child->forward_kinds = maco_nccl__forward_setting();
    __atomic_store_n(&child->state, MACO_NCCL_COMM_READY, __ATOMIC_RELEASE);
    maco_nccl__count_native(MACO_NCCL_CALL_ncclCommShrink);
    *child_p = child;
    return ncclSuccess;
}

/* ncclCommDestroy or ncclCommAbort of a communicator whose non-blocking creation still runs
 * (its bootstrap may wait up to MACO_BOOTSTRAP_TIMEOUT for ranks that never come): the call
 * returns at once, as NCCL's does, and hands the communicator to the creation's thread, which
 * frees it (revoking it after an abort) when the creation ends. 1 when handed over. */
static int maco_nccl__comm_abandon(struct ncclComm *c, int abort)
{
    int handed = 0;
    pthread_mutex_lock(&c->lock);
    if (c->has_init_thread &&
        __atomic_load_n(&c->state, __ATOMIC_ACQUIRE) == MACO_NCCL_COMM_PENDING) {
        c->abandoned = abort ? 2 : 1;
        c->has_init_thread = 0;
        pthread_detach(c->init_thread);
        handed = 1;
    }
    pthread_mutex_unlock(&c->lock);
    return handed;
}

ncclResult_t maco_nccl__comm_free(struct ncclComm *c, int abort)
{
    (void)maco_nccl__comm_unlink(c); /* no new call finds it (done already by destroy) */
    if (maco_nccl__comm_abandon(c, abort))
        return ncclSuccess;
    maco_nccl__comm_wait(c);
    ncclResult_t res = ncclSuccess;
    maco_nccl__comm_release(c, abort, &res);
    return res;
}

/* The rest of maco_nccl__comm_free once no creation runs; *res_p (may be NULL) gets its
 * result. */
static void maco_nccl__comm_release(struct ncclComm *c, int abort, ncclResult_t *res_p)
{
    /* Kernels blocked on a peer end now instead of at MACO_DEVICE_TIMEOUT, here and on the
     * peers, which the revoke reaches through the bootstrap (maco/comm.h). */
    if (abort && c->maco != NULL)
        maco_comm_revoke(c->maco);
    /* Calls of other threads that hold it (a watchdog's query, a group's issue) end first. */
    maco_nccl__comm_drain(c);
    maco_nccl__fallback_free(c, abort);
    maco_status_t st = maco_comm_destroy(c->maco);
    maco_status_t st2 = c->bs_of_maco ? MACO_OK : maco_bootstrap_destroy(c->bs);
    c->magic = 0;
    for (size_t i = 0; i < c->nwins; i++)
        free(c->wins[i]); /* their registrations ended with the MACO communicator */
    free(c->wins);
    free(c->regs);
    pthread_mutex_destroy(&c->lock);
    free(c);
    if (st == MACO_OK)
        st = st2;
    ncclResult_t res =
        st == MACO_OK ? ncclSuccess : maco_nccl__fail_maco(st, "destroying the communicator");
    if (res_p != NULL)
        *res_p = res;
}
