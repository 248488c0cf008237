/*
 * pmix.c - the unique id through the launcher's PMIx server (launcher.h).
 *
 * Open MPI's mpirun and Slurm's srun --mpi=pmix run a PMIx server beside the ranks, a
 * key-value store the job already trusts: rank 0 puts the unique id (its random nonce and its
 * address) there, every rank waits at a fence, and the others get it. Nothing about the id is
 * derived from what another process could know.
 *
 * libpmix is loaded at run time (MACO_PMIX_LIBRARY, default libpmix.so.2), as libibverbs is:
 * MACO neither builds nor links against it. The few types and calls used are declared below
 * from the PMIx Standard (v4.1, chapters 3 "Data Structures and Types", 4 "Initialization and
 * Finalization", 6 "Key/Value Management", 7 "Process Management"); the ABI of these is the same
 * in PMIx v3, v4 and v5. Only single values cross: no pmix_info_t arrays are passed, so the size
 * of the value union beyond what is read here does not matter.
 *
 * Waits are bounded (MACO_BOOTSTRAP_TIMEOUT): the non-blocking forms (PMIx_Fence_nb,
 * PMIx_Get_nb) are used and their callbacks awaited with a deadline. A wait that times out
 * leaves its record to the callback, which frees it if it ever comes.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/host/bootstrap/launcher.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "src/host/os/socket.h"

/* ------------------------------------------------------------------ PMIx's ABI (Standard v4) */

typedef int maco__pmix_status_t;
enum {
    MACO__PMIX_SUCCESS = 0,
    MACO__PMIX_OPERATION_SUCCEEDED = -157, /* done at once; the callback will not be called */
    MACO__PMIX_GLOBAL = 3,                 /* pmix_scope_t: share with every process */
    MACO__PMIX_NSLEN = 255,
};
#define MACO__PMIX_RANK_WILDCARD (UINT32_MAX - 1)

/* pmix_data_type_t values MACO reads or writes. */
enum {
    MACO__PMIX_SIZE = 4,
    MACO__PMIX_STRING = 3,
    MACO__PMIX_INT = 6,
    MACO__PMIX_INT16 = 8,
    MACO__PMIX_INT32 = 9,
    MACO__PMIX_INT64 = 10,
    MACO__PMIX_UINT = 11,
    MACO__PMIX_UINT8 = 12,
    MACO__PMIX_UINT16 = 13,
    MACO__PMIX_UINT32 = 14,
    MACO__PMIX_UINT64 = 15,
};

typedef struct maco__pmix_proc { /* pmix_proc_t */
    char nspace[MACO__PMIX_NSLEN + 1];
    uint32_t rank;
} maco__pmix_proc_t;

typedef struct maco__pmix_value { /* pmix_value_t: a type, then a union of 8-byte alignment */
    uint16_t type;
    union {
        char *string;
        size_t size;
        int integer;
        unsigned int uint;
        int16_t int16;
        int32_t int32;
        int64_t int64;
        uint8_t uint8;
        uint16_t uint16;
        uint32_t uint32;
        uint64_t uint64;
    } data;
} maco__pmix_value_t;

typedef void (*maco__pmix_op_cb_t)(maco__pmix_status_t status, void *cbdata);
typedef void (*maco__pmix_value_cb_t)(maco__pmix_status_t status, maco__pmix_value_t *kv,
                                      void *cbdata);

#define MACO__PMIX_SYMBOLS(X)                                                                      \
    X(Init, maco__pmix_status_t, (maco__pmix_proc_t * proc, void *info, size_t ninfo))             \
    X(Finalize, maco__pmix_status_t, (const void *info, size_t ninfo))                             \
    X(Put, maco__pmix_status_t, (uint8_t scope, const char *key, maco__pmix_value_t *val))         \
    X(Commit, maco__pmix_status_t, (void))                                                         \
    X(Fence_nb, maco__pmix_status_t,                                                               \
      (const maco__pmix_proc_t *procs, size_t nprocs, const void *info, size_t ninfo,              \
       maco__pmix_op_cb_t cb, void *cbdata))                                                       \
    X(Get_nb, maco__pmix_status_t,                                                                 \
      (const maco__pmix_proc_t *proc, const char *key, const void *info, size_t ninfo,             \
       maco__pmix_value_cb_t cb, void *cbdata))                                                    \
    X(Error_string, const char *, (maco__pmix_status_t status))

typedef struct maco__pmix_table {
#define MACO__PMIX_FIELD(name, ret, params) ret(*name) params;
    MACO__PMIX_SYMBOLS(MACO__PMIX_FIELD)
#undef MACO__PMIX_FIELD
} maco__pmix_table_t;

static const struct {
    const char *name;
    size_t offset;
} maco__pmix_symbols[] = {
#define MACO__PMIX_ENTRY(name, ret, params) { "PMIx_" #name, offsetof(maco__pmix_table_t, name) },
    MACO__PMIX_SYMBOLS(MACO__PMIX_ENTRY)
#undef MACO__PMIX_ENTRY
};

/* ------------------------------------------------------------------ loading, once */

static maco__pmix_table_t maco__pmix;
static int maco__pmix_ready;            /* loaded and initialised */
static maco__pmix_proc_t maco__pmix_me; /* this process as PMIx_Init names it */
static char maco__pmix_why[768];
static pthread_once_t maco__pmix_once = PTHREAD_ONCE_INIT;

static const char *maco__pmix_text(maco__pmix_status_t rc)
{
    const char *t = maco__pmix.Error_string != NULL ? maco__pmix.Error_string(rc) : NULL;
    return t != NULL ? t : "unknown PMIx status";
}

static pid_t maco__pmix_pid; /* the process that initialised PMIx */

static void maco__pmix_at_exit(void)
{
    /* Open MPI counts a client that connected and never finalised as a failed process. A
     * child forked after PMIx_Init that calls exit() is not that client (and has no PMIx
     * progress thread to finalise with). */
    if (getpid() == maco__pmix_pid)
        maco__pmix.Finalize(NULL, 0);
}

static void maco__pmix_load(void)
{
    const char *path = maco__config_string(MACO_CFG_PMIX_LIBRARY);
    const char *ns = getenv("PMIX_NAMESPACE");
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *dl = dlerror();
        snprintf(maco__pmix_why, sizeof(maco__pmix_why),
                 "the launcher offers PMIx (PMIX_NAMESPACE='%s') to pass the unique id, but "
                 "MACO_PMIX_LIBRARY=%s could not be loaded: %s; install the PMIx runtime "
                 "(Debian/Ubuntu: libpmix2; RHEL: pmix) or set MACO_PMIX_LIBRARY to its path, "
                 "or give every rank MACO_BOOTSTRAP_ADDR and MACO_BOOTSTRAP_NONCE",
                 ns != NULL ? ns : "", path, dl != NULL ? dl : "dlopen failed");
        return;
    }
    for (size_t i = 0; i < sizeof(maco__pmix_symbols) / sizeof(maco__pmix_symbols[0]); i++) {
        void *fn = dlsym(lib, maco__pmix_symbols[i].name);
        if (fn == NULL) {
            snprintf(maco__pmix_why, sizeof(maco__pmix_why),
                     "%s lacks %s: not a PMIx library of version 3 or later (MACO_PMIX_LIBRARY)",
                     path, maco__pmix_symbols[i].name);
            dlclose(lib);
            memset(&maco__pmix, 0, sizeof(maco__pmix));
            return;
        }
        memcpy((char *)&maco__pmix + maco__pmix_symbols[i].offset, &fn, sizeof(fn));
    }
    maco__pmix_status_t rc = maco__pmix.Init(&maco__pmix_me, NULL, 0);
    if (rc != MACO__PMIX_SUCCESS) {
        snprintf(maco__pmix_why, sizeof(maco__pmix_why),
                 "PMIx_Init (%s) failed: %s (%d): the launcher's PMIx server "
                 "(PMIX_NAMESPACE='%s') cannot be reached from this process",
                 path, maco__pmix_text(rc), rc, ns != NULL ? ns : "");
        return; /* the library stays loaded: its threads may still run */
    }
    maco__pmix_pid = getpid();
    atexit(maco__pmix_at_exit);
    maco__pmix_ready = 1;
    MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "PMIx loaded from %s: namespace '%s', rank %u", path,
              maco__pmix_me.nspace, maco__pmix_me.rank);
}

static maco_status_t maco__pmix_open(void)
{
    pthread_once(&maco__pmix_once, maco__pmix_load);
    if (!maco__pmix_ready)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_BOOTSTRAP, "%s", maco__pmix_why);
    return MACO_OK;
}

/* ------------------------------------------------------------------ bounded waits */

/* One non-blocking call's completion, shared with its callback. */
typedef struct maco__pmix_wait {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done, abandoned;
    maco__pmix_status_t status;
    char *text;     /* a string value, copied */
    int64_t number; /* a number value */
    int value_type; /* the value's PMIx type, 0 when none */
} maco__pmix_wait_t;

static maco__pmix_wait_t *maco__pmix_wait_new(void)
{
    maco__pmix_wait_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&w->lock, NULL);
    return w;
}

static void maco__pmix_wait_free(maco__pmix_wait_t *w)
{
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w->text);
    free(w);
}

/* The callback's end: wakes the waiter, or frees the record the waiter gave up. Called with
 * w->lock held. */
static void maco__pmix_wait_finish(maco__pmix_wait_t *w)
{
    w->done = 1;
    if (w->abandoned) {
        pthread_mutex_unlock(&w->lock);
        maco__pmix_wait_free(w);
        return;
    }
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static void maco__pmix_op_done(maco__pmix_status_t status, void *cbdata)
{
    maco__pmix_wait_t *w = cbdata;
    pthread_mutex_lock(&w->lock);
    w->status = status;
    maco__pmix_wait_finish(w);
}

static void maco__pmix_value_done(maco__pmix_status_t status, maco__pmix_value_t *kv, void *cbdata)
{
    maco__pmix_wait_t *w = cbdata;
    pthread_mutex_lock(&w->lock);
    w->status = status;
    if (status == MACO__PMIX_SUCCESS && kv != NULL) { /* kv is PMIx's: copy what is needed */
        w->value_type = kv->type;
        switch (kv->type) {
        case MACO__PMIX_STRING:
            w->text = kv->data.string != NULL ? strdup(kv->data.string) : NULL;
            break;
        case MACO__PMIX_SIZE:
            w->number = (int64_t)kv->data.size;
            break;
        case MACO__PMIX_INT:
            w->number = kv->data.integer;
            break;
        case MACO__PMIX_INT16:
            w->number = kv->data.int16;
            break;
        case MACO__PMIX_INT32:
            w->number = kv->data.int32;
            break;
        case MACO__PMIX_INT64:
            w->number = kv->data.int64;
            break;
        case MACO__PMIX_UINT:
            w->number = kv->data.uint;
            break;
        case MACO__PMIX_UINT8:
            w->number = kv->data.uint8;
            break;
        case MACO__PMIX_UINT16:
            w->number = kv->data.uint16;
            break;
        case MACO__PMIX_UINT32:
            w->number = kv->data.uint32;
            break;
        case MACO__PMIX_UINT64:
            w->number = (int64_t)kv->data.uint64;
            break;
        default:
            w->value_type = -kv->type;
            break; /* a type MACO does not read */
        }
    }
    maco__pmix_wait_finish(w);
}

/* Waits for w's callback until deadline_ms (maco__now_ms clock). 0 when it came (w is the
 * caller's to free); -1 on timeout (w is then the callback's). */
static int maco__pmix_wait(maco__pmix_wait_t *w, int64_t deadline_ms)
{
    pthread_mutex_lock(&w->lock);
    while (!w->done) {
        int64_t left = deadline_ms - maco__now_ms();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = (int64_t)ts.tv_nsec + (left % 1000) * 1000000;
        ts.tv_sec += (time_t)(left / 1000 + ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
    }
    if (!w->done) {
        w->abandoned = 1;
        pthread_mutex_unlock(&w->lock);
        return -1;
    }
    pthread_mutex_unlock(&w->lock);
    return 0;
}

/* PMIx_Get_nb of `key` of process (my namespace, rank), bounded. On success *w_p holds the
 * value (the caller frees it with maco__pmix_wait_free). `what` names the value for messages. */
static maco_status_t maco__pmix_get(uint32_t rank, const char *key, int64_t deadline_ms,
                                    const char *what, maco__pmix_wait_t **w_p)
{
    maco__pmix_wait_t *w = maco__pmix_wait_new();
    if (w == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "PMIx: no memory");
    maco__pmix_proc_t proc = maco__pmix_me;
    proc.rank = rank;
    maco__pmix_status_t rc = maco__pmix.Get_nb(&proc, key, NULL, 0, maco__pmix_value_done, w);
    if (rc != MACO__PMIX_SUCCESS) {
        maco__pmix_wait_free(w);
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                           "PMIx_Get of %s ('%s') failed: %s (%d)", what, key, maco__pmix_text(rc),
                           rc);
    }
    if (maco__pmix_wait(w, deadline_ms) != 0)
        return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                           "PMIx did not deliver %s ('%s' of rank %u of namespace '%s') before "
                           "the deadline (MACO_BOOTSTRAP_TIMEOUT)",
                           what, key, rank, maco__pmix_me.nspace);
    if (w->status != MACO__PMIX_SUCCESS) {
        maco_status_t st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                                       "PMIx_Get of %s ('%s' of rank %u) failed: %s (%d)", what,
                                       key, rank, maco__pmix_text(w->status), w->status);
        maco__pmix_wait_free(w);
        return st;
    }
    *w_p = w;
    return MACO_OK;
}

static maco_status_t maco__pmix_deadline(int64_t *deadline_p)
{
    int64_t timeout = 0;
    maco_status_t st = maco__config_int64(MACO_CFG_BOOTSTRAP_TIMEOUT, &timeout);
    if (st == MACO_OK)
        *deadline_p = maco__deadline_ms(timeout);
    return st;
}

/* ------------------------------------------------------------------ the calls */

/* A number the server holds about `rank` (or the job: MACO__PMIX_RANK_WILDCARD), or -1. */
static int maco__pmix_number(uint32_t rank, const char *key, int64_t deadline_ms)
{
    /* A key the server lacks is no error here: the caller says "unknown". */
    maco__pmix_proc_t proc = maco__pmix_me;
    proc.rank = rank;
    maco__pmix_wait_t *w = maco__pmix_wait_new();
    if (w == NULL)
        return -1;
    if (maco__pmix.Get_nb(&proc, key, NULL, 0, maco__pmix_value_done, w) != MACO__PMIX_SUCCESS) {
        maco__pmix_wait_free(w);
        return -1;
    }
    if (maco__pmix_wait(w, deadline_ms) != 0)
        return -1;
    int v = -1;
    if (w->status == MACO__PMIX_SUCCESS && w->value_type > 0 &&
        w->value_type != MACO__PMIX_STRING && w->number >= 0 && w->number <= INT32_MAX)
        v = (int)w->number;
    maco__pmix_wait_free(w);
    return v;
}

maco_status_t maco__pmix_job_info(int *size, int *local_rank, int *local_size, int *node,
                                  int *nnodes)
{
    maco_status_t st = maco__pmix_open();
    int64_t deadline = 0;
    if (st == MACO_OK)
        st = maco__pmix_deadline(&deadline);
    if (st != MACO_OK)
        return st;
    /* These keys are answered by the local server from what it was given at launch; a server
     * that lacks one may hold the request instead of saying so, so each gets 5 s at most. */
    int64_t soon = maco__deadline_ms(5000);
    if (soon < deadline)
        deadline = soon;
    *size = maco__pmix_number(MACO__PMIX_RANK_WILDCARD, "pmix.job.size", deadline);
    *local_size = maco__pmix_number(MACO__PMIX_RANK_WILDCARD, "pmix.local.size", deadline);
    *nnodes = maco__pmix_number(MACO__PMIX_RANK_WILDCARD, "pmix.num.nodes", deadline);
    *local_rank = maco__pmix_number(maco__pmix_me.rank, "pmix.lrank", deadline);
    *node = maco__pmix_number(maco__pmix_me.rank, "pmix.nodeid", deadline);
    return MACO_OK;
}

static void maco__hex_encode(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int maco__hex_decode(const char *in, uint8_t *out, size_t n)
{
    if (strlen(in) != 2 * n)
        return -1;
    for (size_t i = 0; i < 2 * n; i++) {
        char c = in[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        out[i / 2] = (uint8_t)(i % 2 == 0 ? d << 4 : out[i / 2] | d);
    }
    return 0;
}

maco_status_t maco__pmix_exchange_id(int rank, maco_unique_id_t *id)
{
    static int counter; /* exchanges so far in this process */
    maco_status_t st = maco__pmix_open();
    int64_t deadline = 0;
    if (st == MACO_OK)
        st = maco__pmix_deadline(&deadline);
    if (st != MACO_OK)
        return st;
    char key[64];
    snprintf(key, sizeof(key), "maco.unique_id.%d",
             __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    if (rank == 0) {
        char text[2 * MACO_UNIQUE_ID_BYTES + 1];
        maco__hex_encode(id->bytes, MACO_UNIQUE_ID_BYTES, text);
        maco__pmix_value_t v;
        memset(&v, 0, sizeof(v));
        v.type = MACO__PMIX_STRING;
        v.data.string = text;
        maco__pmix_status_t rc = maco__pmix.Put(MACO__PMIX_GLOBAL, key, &v);
        if (rc == MACO__PMIX_SUCCESS)
            rc = maco__pmix.Commit();
        if (rc != MACO__PMIX_SUCCESS)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                               "PMIx_Put/PMIx_Commit of the unique id ('%s') failed: %s (%d)", key,
                               maco__pmix_text(rc), rc);
    }
    /* Every rank: once the fence is passed, rank 0's committed id can be read. */
    maco__pmix_wait_t *w = maco__pmix_wait_new();
    if (w == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "PMIx: no memory");
    maco__pmix_status_t rc = maco__pmix.Fence_nb(NULL, 0, NULL, 0, maco__pmix_op_done, w);
    if (rc == MACO__PMIX_OPERATION_SUCCEEDED) {
        maco__pmix_wait_free(w);
    } else if (rc != MACO__PMIX_SUCCESS) {
        maco__pmix_wait_free(w);
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                           "PMIx_Fence for the unique id ('%s') failed: %s (%d)", key,
                           maco__pmix_text(rc), rc);
    } else if (maco__pmix_wait(w, deadline) != 0) {
        return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                           "the PMIx fence for the unique id ('%s') did not complete before the "
                           "deadline (MACO_BOOTSTRAP_TIMEOUT): not every process of namespace "
                           "'%s' reached it; did every rank start?",
                           key, maco__pmix_me.nspace);
    } else {
        rc = w->status;
        maco__pmix_wait_free(w);
        if (rc != MACO__PMIX_SUCCESS)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                               "the PMIx fence for the unique id ('%s') failed: %s (%d): a "
                               "process of namespace '%s' ended?",
                               key, maco__pmix_text(rc), rc, maco__pmix_me.nspace);
    }
    if (rank == 0)
        return MACO_OK;
    w = NULL;
    st = maco__pmix_get(0, key, deadline, "rank 0's unique id", &w);
    if (st != MACO_OK)
        return st;
    maco_unique_id_t got;
    memset(&got, 0, sizeof(got)); /* filled by the decode below, or not used */
    if (w->value_type != MACO__PMIX_STRING || w->text == NULL ||
        maco__hex_decode(w->text, got.bytes, MACO_UNIQUE_ID_BYTES) != 0) {
        int type = w->value_type;
        maco__pmix_wait_free(w);
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                           "PMIx key '%s' of rank 0 holds no unique id (type %d, not %d "
                           "hex digits)",
                           key, type, 2 * MACO_UNIQUE_ID_BYTES);
    }
    maco__pmix_wait_free(w);
    *id = got;
    return MACO_OK;
}
