/*
 * shim.h - internals of libmaco_nccl.so, the NCCL-compatible library (not public API).
 *
 * The library implements every function of NCCL 2.32.6's nccl.h (and the host functions of
 * its nccl_device.h) on MACO's public C API (include/maco), keeping the ABI of 2.28.9's for
 * programs built against that; docs/nccl.md lists each function as run on MACO, forwarded to a
 * real NCCL or refused, and why. Its files call each other one way only, lowest first:
 *   errors.c    status mapping, per-thread last error, call counters, the fallback setting
 *   env.c       NCCL_* environment variables mapped onto MACO_* ones
 *   fallback.c  the real NCCL (dlopen'ed from MACO_NCCL_LIBRARY) and its communicators
 *   scale.cu    the post-multiply kernel of ncclRedOpCreatePreMulSum ops
 *   comm_core.c creating (blocking, non-blocking, split) and freeing communicators
 *   ops.c       one queued operation issued on MACO, or forwarded
 *   group.c     ncclGroupStart/End: the per-thread queue of operations and inits
 *   comm.c      the public communicator calls
 *   comm_229.c  the communicator calls of 2.29: ncclCommGetUniqueId, ncclCommGrow, suspend,
 *               resume, memory statistics, ncclWinGetUserPtr
 *   coll.c      the public collectives, send/recv and reduction-op calls
 *   coll_config.c the per-call-config collectives (2.31) and the one-sided calls (2.29)
 *   params.c    NCCL's parameter registry (2.30) and socket encryption (2.32)
 *   device_api.c the host functions of NCCL's device API (nccl_device.h) of 2.28
 *   device_query.c those it gained in 2.29 to 2.31
 * Every public function is defined as pncclX with ncclX a weak alias, as NCCL does, so a
 * profiler can interpose ncclX and call pncclX.
 */
#ifndef MACO_NCCL_SHIM_H
#define MACO_NCCL_SHIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <nccl.h>

#include "maco/maco.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Defines ncclX as a weak alias of pncclX (both exported). */
#define MACO_NCCL_ALIAS(name) __typeof__(p##name) name __attribute__((weak, alias("p" #name)));

/* ------------------------------------------------------------------ errors.c */

/* Every counted entry point: native calls and calls forwarded to the real NCCL. */
#define MACO_NCCL_CALLS(X)                                                                         \
    X(ncclAllReduce)                                                                               \
    X(ncclBroadcast)                                                                               \
    X(ncclReduce)                                                                                  \
    X(ncclAllGather)                                                                               \
    X(ncclReduceScatter)                                                                           \
    X(ncclAlltoAll)                                                                                \
    X(ncclGather)                                                                                  \
    X(ncclScatter)                                                                                 \
    X(ncclSend)                                                                                    \
    X(ncclRecv)                                                                                    \
    X(ncclCommInitRank)                                                                            \
    X(ncclCommSplit)                                                                               \
    X(ncclCommShrink)                                                                              \
    X(ncclCommGrow)                                                                                \
    X(ncclCommRegister)                                                                            \
    X(ncclMemAlloc)

typedef enum maco_nccl__call {
#define MACO_NCCL__CALL_ENUM(name) MACO_NCCL_CALL_##name,
    MACO_NCCL_CALLS(MACO_NCCL__CALL_ENUM)
#undef MACO_NCCL__CALL_ENUM
        MACO_NCCL_CALL_COUNT
} maco_nccl__call_t;

const char *maco_nccl__call_name(maco_nccl__call_t call);

/* Counts a call that ran on MACO; the first one of each kind is logged at info level. */
void maco_nccl__count_native(maco_nccl__call_t call);
/* Counts a call forwarded to the real NCCL; the first of each kind is logged at info level
 * with `why` (what MACO said). */
void maco_nccl__count_forwarded(maco_nccl__call_t call, const char *why);

/* ncclResult_t of a MACO status. */
ncclResult_t maco_nccl__result(maco_status_t st);

/*
 * Records an error the library detected: the formatted text becomes this thread's last
 * error (ncclGetLastError) and is logged once at error level. Returns `res`.
 */
ncclResult_t maco_nccl__fail(ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * Records a failed MACO call: `what` (the NCCL call) and MACO's own message (the thread's
 * last MACO error) become this thread's last error; MACO already logged it. Returns the
 * mapped result.
 */
ncclResult_t maco_nccl__fail_maco(maco_status_t st, const char *what);

/* This thread's last error text ("" when none). */
const char *maco_nccl__last_error(void);

/* MACO_NCCL_FALLBACK: 1 for auto, 0 for never; -1 and a logged error for another value. */
int maco_nccl__fallback_mode(void);

/* Element size of an NCCL data type; 0 for an unknown one. */
size_t maco_nccl__type_size(ncclDataType_t type);
/* The MACO type of an NCCL one; -1 for an unknown one. */
int maco_nccl__maco_type(ncclDataType_t type);

/* ------------------------------------------------------------------ env.c */

/* Maps NCCL_* variables onto unset MACO_* ones (once per process; also run at load time). */
void maco_nccl__env_apply(void);
/* NCCL_COMM_BLOCKING's value: 1 (unset or non-zero) or 0. */
int maco_nccl__env_blocking_default(void);

/* ------------------------------------------------------------------ the communicator */

#define MACO_NCCL_COMM_MAGIC 0x4d4e434cu /* "MNCL" */
#define MACO_NCCL_MAX_USER_OPS 64

typedef enum maco_nccl__comm_state {
    MACO_NCCL_COMM_PENDING = 0, /* non-blocking or grouped creation not finished */
    MACO_NCCL_COMM_READY = 1,
    MACO_NCCL_COMM_FAILED = 2,  /* creation failed: init_result says how */
    MACO_NCCL_COMM_REVOKED = 3, /* ncclCommRevoke: only destroy/abort/queries remain */
} maco_nccl__comm_state_t;

/* A PreMulSum op created on a communicator (ncclRedOpCreatePreMulSum). */
typedef struct maco_nccl__user_op {
    int used;
    ncclDataType_t type;
    int on_device; /* ncclScalarDevice: read `device_scalar` when the op runs */
    const void *device_scalar;
    unsigned char value[8]; /* ncclScalarHostImmediate: the scalar, copied at creation */
} maco_nccl__user_op_t;

struct ncclComm {
    uint32_t magic;
    uint64_t serial; /* unique in this process: tells a re-created communicator at the same
                      * address from the one a queued call named */
    int holds;       /* threads using the object now (maco_nccl__comm_hold; registry lock) */
    int rank, nranks, device;
    int blocking;
    char name[64];       /* config->commName, for log lines */
    maco_comm_t maco;    /* NULL until created */
    maco_bootstrap_t bs; /* destroyed after maco, unless bs_of_maco */
    int bs_of_maco;      /* 1: bs belongs to maco (made by a shrink) and goes with it */
    int state;           /* maco_nccl__comm_state_t, atomic */
    ncclResult_t init_result;
    pthread_t init_thread; /* non-blocking creation */
    int has_init_thread;   /* init_thread not joined yet */
    int async_init;        /* created on a thread of its own */
    int abandoned;         /* destroyed (1) or aborted (2) while its creation ran (under lock) */
    uint32_t split_seq;    /* splits made from this communicator, for bootstrap tags */
    pthread_mutex_t lock;  /* user ops and the real communicator */
    maco_nccl__user_op_t ops[MACO_NCCL_MAX_USER_OPS];
    void *real;               /* the real NCCL's communicator, created when first needed */
    ncclResult_t real_result; /* its creation's result once tried (ncclSuccess: not yet) */
    int real_tried;
    unsigned forward_kinds; /* bit per maco_nccl__kind_t: MACO refused it, it goes to NCCL */
    int peer_error;         /* ncclRemoteError once a call met a dead or late peer (atomic) */
    maco_mem_t *regs;       /* handles ncclCommRegister returned and not yet deregistered */
    size_t nregs, regs_cap; /* (under `lock`) */
    int grow_id_out;        /* ncclCommGetUniqueId made an id that no ncclCommGrow used yet */
    struct ncclWindow_vidmem **wins; /* windows registered and not yet deregistered */
    size_t nwins, wins_cap;          /* (under `lock`) */
};

#define MACO_NCCL_WINDOW_MAGIC 0x4d4e5749u /* "MNWI" */

struct ncclWindow_vidmem {
    uint32_t magic;
    struct ncclComm *comm;
    maco_mem_t mem;
    void *base;
    size_t size;
};

/* ------------------------------------------------------------------ fallback.c */

/*
 * Opens the real NCCL named by MACO_NCCL_LIBRARY once per process. Refuses this library
 * itself (by its marker symbol) and MACO_NCCL_FALLBACK=never. On failure returns
 * ncclInvalidUsage or ncclSystemError and writes the reason into `why` (cap bytes).
 */
ncclResult_t maco_nccl__fallback_open(char *why, size_t cap);

/*
 * The real NCCL communicator alongside `comm`, created at the first need: collective over
 * comm's ranks (rank 0's NCCL unique id travels over comm's bootstrap). Returns NULL and sets
 * the thread's last error when it cannot be had.
 */
void *maco_nccl__fallback_comm(struct ncclComm *comm);

/* Destroys or aborts the real communicator alongside `comm`, if any. */
void maco_nccl__fallback_free(struct ncclComm *comm, int abort);

/* The real NCCL's entry points (valid after a successful maco_nccl__fallback_open). */
typedef struct maco_nccl__real {
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(void **, int, ncclUniqueId, int);
    ncclResult_t (*CommDestroy)(void *);
    ncclResult_t (*CommAbort)(void *);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, void *,
                              cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, void *,
                              cudaStream_t);
    ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, void *,
                           cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, void *, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, void *,
                                  cudaStream_t);
    ncclResult_t (*AlltoAll)(const void *, void *, size_t, ncclDataType_t, void *, cudaStream_t);
    ncclResult_t (*Gather)(const void *, void *, size_t, ncclDataType_t, int, void *, cudaStream_t);
    ncclResult_t (*Scatter)(const void *, void *, size_t, ncclDataType_t, int, void *,
                            cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, void *, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, void *, cudaStream_t);
    const char *(*GetLastError)(void *);
} maco_nccl__real_t;

const maco_nccl__real_t *maco_nccl__real(void);

/* ------------------------------------------------------------------ scale.cu */

/*
 * dst[i] = src[i] * scalar for i in [0, count) (count elements of `type`; dst may be src), on
 * `stream`, with the current device's kernel: the scalar is *device_scalar (read when the
 * kernel runs) when device_scalar is not NULL, else the element at host_scalar. 16-bit and
 * fp8 types multiply in float32, then round to nearest even. Returns cudaSuccess or the
 * launch's error.
 */
cudaError_t maco_nccl__scale(void *dst, const void *src, size_t count, ncclDataType_t type,
                             const void *device_scalar, const void *host_scalar,
                             cudaStream_t stream);

/* ------------------------------------------------------------------ comm_core.c */

/* A new communicator object in state PENDING (not yet joined). NULL when out of memory. */
struct ncclComm *maco_nccl__comm_alloc(int nranks, int rank, int device, int blocking,
                                       const char *name);

/* Fills `id` with a marker and rank 0's "host:port" (NCCL_COMM_ID). -1 when too long. */
int maco_nccl__id_from_address(ncclUniqueId *id, const char *address);

/* MACO_NCCL_FORWARD as a mask of maco_nccl__kind_t bits (unknown names are warned about). */
unsigned maco_nccl__forward_setting(void);

/* Joins the job named by `id` and creates the MACO communicator: blocking, collective. Sets
 * comm->state and init_result; returns init_result. */
ncclResult_t maco_nccl__comm_join(struct ncclComm *comm, const ncclUniqueId *id);

/* Runs maco_nccl__comm_join on a thread of its own (non-blocking creation). */
ncclResult_t maco_nccl__comm_join_async(struct ncclComm *comm, const ncclUniqueId *id);

/* Joins several communicators at once, one thread each (they may be ranks of one job). */
ncclResult_t maco_nccl__comm_join_all(struct ncclComm **comms, const ncclUniqueId *ids, int n);

/* Checks that `comm` is a communicator of this library; waits for a pending creation; then
 * returns ncclSuccess when it is usable, else the error (named after `what`). */
ncclResult_t maco_nccl__comm_ready(struct ncclComm *comm, const char *what);

/* Checks that `comm` is a communicator object of this library (any state), by its address
 * alone: nothing is read through it. */
int maco_nccl__comm_valid(const struct ncclComm *comm);

/*
 * Holds `comm` for reading: returns it when it is a live communicator of this library (and,
 * when `serial` is not 0, still the one with that serial: not a new one made at the same
 * address since), else NULL. A destroy or abort in another thread waits for every hold to be
 * released (maco_nccl__comm_unhold) before it frees the object. Thread-safe; never blocks for
 * long (the registry lock).
 */
struct ncclComm *maco_nccl__comm_hold(const struct ncclComm *comm, uint64_t serial);
void maco_nccl__comm_unhold(struct ncclComm *c);

/* Takes `comm` out of the registry, so that no new call finds it: 1, or 0 when it was not
 * there (destroyed already, or never a communicator). Of two threads destroying one
 * communicator, one gets 1. */
int maco_nccl__comm_unlink(const struct ncclComm *comm);

/*
 * Splits `parent`: the ranks with the same color form a new communicator, ordered by key
 * then parent rank; color NCCL_SPLIT_NOCOLOR gets NULL. Collective over the parent's ranks.
 * `child` is an allocated communicator (PENDING) or NULL for NOCOLOR.
 */
ncclResult_t maco_nccl__comm_split(struct ncclComm *parent, int color, int key,
                                   struct ncclComm **child_p, int blocking, const char *name);

/* ncclCommShrink: the communicator of the parent's live ranks not in exclude[0..nexclude), in
 * parent rank order, through maco_comm_shrink (maco/comm.h: ranks that died need not be listed;
 * the survivors agree). `abort`: NCCL_SHRINK_ABORT (the parent is revoked first). Blocking
 * whatever the config says (the result is ready when it returns). */
ncclResult_t maco_nccl__comm_shrink(struct ncclComm *parent, const int *exclude, int nexclude,
                                    int abort, struct ncclComm **child_p, int blocking,
                                    const char *name);

/* Keeps a peer's failure that a call on `c` met (MACO_ERR_REMOTE or MACO_ERR_TIMEOUT: a peer
 * gone or late) for ncclCommGetAsyncError, which then says ncclRemoteError, as NCCL's does
 * once its proxy or bootstrap lost a peer. Other statuses are ignored. */
void maco_nccl__comm_note(struct ncclComm *c, maco_status_t st);

/* Frees everything of `comm`; `abort` skips waiting for the device. */
ncclResult_t maco_nccl__comm_free(struct ncclComm *comm, int abort);

/* ------------------------------------------------------------------ ops.c */

typedef enum maco_nccl__kind {
    MACO_NCCL_ALLREDUCE,
    MACO_NCCL_BROADCAST,
    MACO_NCCL_REDUCE,
    MACO_NCCL_ALLGATHER,
    MACO_NCCL_REDUCESCATTER,
    MACO_NCCL_ALLTOALL,
    MACO_NCCL_GATHER,
    MACO_NCCL_SCATTER,
    MACO_NCCL_SEND,
    MACO_NCCL_RECV,
} maco_nccl__kind_t;

/* One collective or point-to-point call, as recorded (by value) for issue. */
typedef struct maco_nccl__op {
    maco_nccl__kind_t kind;
    maco_nccl__call_t call;
    struct ncclComm *comm;
    uint64_t serial; /* comm's serial when the call was made (maco_nccl__comm_hold) */
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op; /* a built-in op; a PreMulSum op is recorded as ncclSum + the scalar */
    int root;       /* root, or peer for send/recv */
    cudaStream_t stream;
    int premul; /* 1: multiply each rank's input by its scalar below, then sum */
    const void *device_scalar;
    unsigned char host_scalar[8];
} maco_nccl__op_t;

/* Issues `op` on MACO (inside an open MACO group when the caller has one). */
maco_status_t maco_nccl__op_issue(const maco_nccl__op_t *op);
/* A PreMulSum op: scales its input by this rank's scalar into a stream-ordered temporary
 * (cudaMallocAsync on the op's stream, the communicator's device; capturable) and points
 * op->sendbuff at it; *tmp_p gets the temporary (NULL: nothing to do). The caller frees it
 * with maco_nccl__op_release after the operation is issued. */
ncclResult_t maco_nccl__op_prepare(maco_nccl__op_t *op, void **tmp_p);
/* Frees a temporary of maco_nccl__op_prepare on the op's stream (after what uses it). */
void maco_nccl__op_release(const maco_nccl__op_t *op, void *tmp);
/* Forwards ops[0..n) to the real NCCL in one real group. `why` says why MACO could not. */
ncclResult_t maco_nccl__op_forward(const maco_nccl__op_t *ops, int n, const char *why);

/* ------------------------------------------------------------------ group.c */

/* Drops this thread's queued calls and pending creations of `comm` (about to be destroyed);
 * returns how many there were. A group that held any fails at its end, saying so. */
int maco_nccl__group_forget(const struct ncclComm *comm);

/* Runs `op` now, or queues it when this thread has a group open. */
ncclResult_t maco_nccl__group_submit(const maco_nccl__op_t *op);
/* Queues a communicator's creation (ncclCommInitRank inside a group); run at the group's
 * end. Returns 0 when no group is open (the caller creates it now). */
int maco_nccl__group_defer_init(struct ncclComm *comm, const ncclUniqueId *id);
/* Records an argument error of a call made inside a group (the group's end returns it). */
void maco_nccl__group_note_error(ncclResult_t res);

/* ------------------------------------------------------------------ comm.c */

/* The NCCL_* mapping again at the first creation (variables set after the library loaded). */
void maco_nccl__env_first_use(void);

/*
 * Reads an ncclConfig_t (NULL: the defaults): magic and size are checked, and only the fields
 * that lie inside config->size are read, so a config from an older nccl.h (smaller: 2.28.9's
 * is 80 bytes) works. *blocking_p gets blocking (0 or 1; NCCL_COMM_BLOCKING when unset) and
 * *name_p commName (NULL when unset); the other fields tune NCCL's own machinery (CTA counts,
 * CGA clusters, the network plugin, traffic class, CollNet, NVLS, and the graph, RMA, P2P and
 * CFT settings of 2.29 to 2.32) and are accepted and ignored, after the checks NCCL makes on
 * them. Errors (ncclInvalidArgument, named after `what`): a bad magic, size or field value.
 */
ncclResult_t maco_nccl__config(const ncclConfig_t *cfg, const char *what, int *blocking_p,
                               const char **name_p);

#ifdef __cplusplus
}
#endif

#endif /* MACO_NCCL_SHIM_H */
