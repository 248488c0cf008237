/*
 * comm_base.c - what every layer above the bootstrap may call on a communicator: its errors
 * (the first error's message, asynchronous errors of proxies and device-side waits), the "no
 * usable GPU" answer, and the collectives' extension (comm_internal.h). It calls
 * only the logger, the bootstrap (its link check, and reading its links for a watchdog) and,
 * to end device waits after a peer failed or the communicator was revoked, the CUDA runtime
 * (docs/design.md, layers).
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/comm/comm_internal.h"
#include "src/host/base/log.h"
#include "maco/device/persistent.h"

/* A remote failure or a timeout is often the effect of a peer that died elsewhere in the job
 * (a wait on rank 2, which waited on the dead rank 3): the first error's text gets the ranks
 * whose bootstrap link has ended, so every survivor's error names the root cause. */
static void maco__comm_name_gone_peers(maco_comm_t comm)
{
    char list[160];
    size_t len = 0;
    int gone = 0;
    list[0] = '\0';
    for (int r = 0; r < comm->nranks && comm->bs != NULL; r++) {
        if (r == comm->rank || !maco__bootstrap_peer_gone(comm->bs, r))
            continue;
        if (++gone > 16)
            continue;
        int n = snprintf(list + len, sizeof(list) - len, "%s%d", gone > 1 ? ", " : "", r);
        if (n > 0 && (size_t)n < sizeof(list) - len)
            len += (size_t)n;
    }
    if (gone == 0)
        return;
    size_t used = strlen(comm->first_error);
    snprintf(comm->first_error + used, sizeof(comm->first_error) - used,
             " [rank%s %s%s left the job: %s bootstrap connection ended]", gone > 1 ? "s" : "",
             list, gone > 16 ? ", ..." : "", gone > 1 ? "their" : "its");
}

maco_status_t maco__comm_record(maco_comm_t comm, maco_status_t status)
{
    if (comm == NULL || status == MACO_OK)
        return status;
    pthread_mutex_lock(&comm->error_lock);
    /* A rejected call leaves the communicator usable: a later failure of its work replaces
     * it, so the message says what broke the communicator (maco/comm.h). */
    int rejected = comm->first_status == MACO_ERR_INVALID_ARGUMENT ||
                   comm->first_status == MACO_ERR_UNSUPPORTED;
    int failure = status != MACO_ERR_INVALID_ARGUMENT && status != MACO_ERR_UNSUPPORTED &&
                  status != MACO_ERR_INVALID_USAGE;
    if (comm->first_status == MACO_OK || (rejected && failure)) {
        comm->first_status = status;
        snprintf(comm->first_error, sizeof(comm->first_error), "%s", maco__last_error());
        if (status == MACO_ERR_REMOTE || status == MACO_ERR_TIMEOUT || status == MACO_ERR_CUDA)
            maco__comm_name_gone_peers(comm);
    }
    pthread_mutex_unlock(&comm->error_lock);
    return status;
}

maco_status_t maco__comm_end_device_waits(maco_comm_t comm)
{
    /* 0: not yet, 2: a thread is writing the word, 1: written. A failed write goes back to 0,
     * so a later call (maco_comm_abort after a proxy's failure) tries again. */
    int32_t expect = 0;
    if (comm->cuda_device < 0 || comm->bound.claim == NULL ||
        !__atomic_compare_exchange_n(&comm->device_waits_ended, &expect, 2, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return MACO_OK;
    /* The claim word is device memory (maco/device/error.h says why); a kernel reads it with
     * volatile loads, which go to L2, where the copy lands. A device thread that claimed it
     * first has written or is writing its report, which stays the one reported. Relaxed
     * capture mode: this thread's calls must not invalidate a graph being captured on
     * another thread (a proxy's thread calls this while the application may capture). */
    static const int32_t one = 1;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    int cur = -1;
    cudaGetDevice(&cur);
    cudaStream_t stream = NULL;
    cudaError_t cerr = cudaSetDevice(comm->cuda_device);
    if (cerr == cudaSuccess)
        cerr = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (cerr == cudaSuccess)
        cerr =
            cudaMemcpyAsync(comm->bound.claim, &one, sizeof(one), cudaMemcpyHostToDevice, stream);
    /* Bounded like every other wait (MACO_DEVICE_TIMEOUT): a copy engine that never runs the
     * 4-byte copy must not hang a proxy thread or maco_comm_abort. */
    uint64_t waited_ns = 0;
    while (cerr == cudaSuccess && (cerr = cudaStreamQuery(stream)) == cudaErrorNotReady &&
           waited_ns < comm->timeout_ns) {
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
        waited_ns += 100000;
    }
    if (stream != NULL && cerr != cudaErrorNotReady)
        cudaStreamDestroy(stream); /* a copy still pending keeps its stream */
    if (cur >= 0)
        cudaSetDevice(cur);
    cudaThreadExchangeStreamCaptureMode(&mode);
    __atomic_store_n(&comm->device_waits_ended, cerr == cudaSuccess ? 1 : 0, __ATOMIC_RELEASE);
    if (cerr == cudaErrorNotReady)
        return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_INIT,
                           "rank %d: the 4-byte copy that sets the device error word did not run "
                           "within MACO_DEVICE_TIMEOUT (%llu ms)",
                           comm->rank, (unsigned long long)(comm->timeout_ns / 1000000ull));
    if (cerr != cudaSuccess)
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_INIT,
                           "rank %d: setting the device error word failed: %s (%s)", comm->rank,
                           cudaGetErrorName(cerr), cudaGetErrorString(cerr));
    MACO_INFO(MACO_SUBSYS_INIT, "rank %d: device waits of the communicator end now", comm->rank);
    return MACO_OK;
}

void maco__comm_set_async_error(maco_comm_t comm, maco_status_t status)
{
    if (comm == NULL || status == MACO_OK)
        return;
    maco__comm_record(comm, status);
    __atomic_compare_exchange_n(&comm->host_async_status, &(int32_t){ 0 }, (int32_t)status, 0,
                                __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    /* A connection to a peer failed (a proxy's transport): the kernels that wait on that peer
     * would only end at MACO_DEVICE_TIMEOUT; they end now, with this error as the reason. */
    if (status == MACO_ERR_REMOTE)
        (void)maco__comm_end_device_waits(comm);
}

maco_status_t maco__comm_check_stream(maco_comm_t comm, void *stream, const char *fn)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return MACO_OK;
    /* Not while the stream captures a graph: cudaStreamGetDevice invalidated the capture
     * (P2P.GraphReplayedWithChangingInputs and nccl-tests -G showed it). The
     * launch itself then says what is wrong, if anything. */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return MACO_OK;
    }
    int dev = -1;
    if (cudaStreamGetDevice(s, &dev) != cudaSuccess) {
        cudaGetLastError(); /* no answer: the launch says what is wrong, if anything */
        return MACO_OK;
    }
    if (dev == comm->cuda_device)
        return MACO_OK;
    return maco__comm_record(
        comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                          "%s: stream %p belongs to CUDA device %d, but the communicator (rank %d) "
                          "uses device %d; pass a stream of device %d, or 0, cudaStreamLegacy or "
                          "cudaStreamPerThread (taken on the communicator's device)",
                          fn, (void *)s, dev, comm->rank, comm->cuda_device, comm->cuda_device));
}

maco_status_t maco__comm_require_gpu(maco_comm_t comm, const char *fn)
{
    if (comm->gpu_unavailable[0] == '\0')
        return MACO_OK;
    return maco__comm_record(comm, maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_INIT, "%s: %s", fn,
                                               comm->gpu_unavailable));
}

const char *maco_comm_get_last_error(maco_comm_t comm)
{
    return comm == NULL ? "" : comm->first_error;
}

/*
 * A kernel that faulted leaves no report in the claim word: the context's sticky error says
 * it. One cause is a peer that died while this rank's kernels read its memory (mapped into
 * this process by CUDA IPC: it vanishes with the peer's process, and the next load is an
 * illegal address), so the recorded error names the ranks whose bootstrap link has ended.
 * The question goes to a stream of the communicator's own that never gets work: idle, it
 * answers cudaSuccess unless the context failed, and it is tied to no stream the application
 * may be capturing (relaxed capture mode besides, as a watchdog thread may call this while
 * another thread captures). Returns MACO_ERR_CUDA after recording it as the asynchronous
 * error, else MACO_OK.
 */
static maco_status_t maco__comm_check_context(maco_comm_t comm)
{
    if (comm->cuda_device < 0 || comm->gpu_unavailable[0] != '\0')
        return MACO_OK;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    int cur = -1;
    cudaGetDevice(&cur);
    cudaError_t e = cur == comm->cuda_device ? cudaSuccess : cudaSetDevice(comm->cuda_device);
    void *probe = __atomic_load_n(&comm->probe_stream, __ATOMIC_ACQUIRE);
    if (e == cudaSuccess && probe == NULL) {
        cudaStream_t made = NULL;
        e = cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking);
        void *none = NULL;
        if (e == cudaSuccess &&
            !__atomic_compare_exchange_n(&comm->probe_stream, &none, (void *)made, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            cudaStreamDestroy(made); /* another thread's came first */
        probe = __atomic_load_n(&comm->probe_stream, __ATOMIC_ACQUIRE);
    }
    if (e == cudaSuccess)
        e = cudaStreamQuery((cudaStream_t)probe);
    if (cur >= 0 && cur != comm->cuda_device)
        cudaSetDevice(cur);
    cudaThreadExchangeStreamCaptureMode(&mode);
    /* Only the errors that leave the context unusable (cuda_runtime_api.h: "sticky"): any
     * other answer (busy, out of resources for the stream) says nothing about the
     * communicator's work. */
    if (e != cudaErrorIllegalAddress && e != cudaErrorLaunchFailure &&
        e != cudaErrorHardwareStackError && e != cudaErrorIllegalInstruction &&
        e != cudaErrorMisalignedAddress && e != cudaErrorInvalidAddressSpace &&
        e != cudaErrorInvalidPc && e != cudaErrorAssert && e != cudaErrorLaunchTimeout &&
        e != cudaErrorECCUncorrectable)
        return MACO_OK;
    maco__error_quiet(MACO_ERR_CUDA,
                      "rank %d: the CUDA context of device %d failed: %s (%s); every later CUDA "
                      "call there fails (a kernel faulted: a peer process that died while this "
                      "rank's kernels read its memory is one cause)",
                      comm->rank, comm->cuda_device, cudaGetErrorName(e), cudaGetErrorString(e));
    maco__comm_record(comm, MACO_ERR_CUDA);
    __atomic_compare_exchange_n(&comm->host_async_status, &(int32_t){ 0 }, (int32_t)MACO_ERR_CUDA,
                                0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    return MACO_ERR_CUDA;
}

maco_status_t maco_comm_get_async_error(maco_comm_t comm, maco_status_t *async_status_p)
{
    if (comm == NULL || async_status_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_get_async_error: NULL argument");
    /* The watchdog pattern (a thread polling this while the application waits on the GPU):
     * read what arrived on the bootstrap's links, at most every 10 ms, so that a peer's revoke
     * takes effect here (it ends this rank's device waits) although no call reads them. */
    int64_t now = maco__now_ms(), last = __atomic_load_n(&comm->polled_at_ms, __ATOMIC_RELAXED);
    if (now - last >= 10 && __atomic_compare_exchange_n(&comm->polled_at_ms, &last, now, 0,
                                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        maco__bootstrap_poll(comm->bs);
    *async_status_p = maco__comm_async_status(comm);
    if (*async_status_p == MACO_OK)
        *async_status_p = maco__comm_check_context(comm);
    return MACO_OK;
}

maco_status_t maco__comm_async_status(maco_comm_t comm)
{
    int32_t host_status = __atomic_load_n(&comm->host_async_status, __ATOMIC_ACQUIRE);
    if (host_status != 0) {
        /* A proxy's error: its text is the communicator's first error. */
        return (maco_status_t)host_status;
    }
    /* Acquire: the report's other fields, written before its status, are read after it. */
    int32_t status =
        comm->err_report == NULL ? 0 : __atomic_load_n(&comm->err_report->status, __ATOMIC_ACQUIRE);
    if (status == 0)
        return MACO_OK;
    const maco_device_error_t *e = comm->err_report;
    if (e->what == MACO_DEVICE_ERR_REGISTRATION) {
        maco__error_quiet((maco_status_t)status,
                          "rank %d: rank %d's collective named its registration %d, which "
                          "this rank has not mapped (deregistered while in use?)",
                          comm->rank, (int)e->peer, (int)e->object);
        maco__comm_record(comm, (maco_status_t)status);
        return (maco_status_t)status;
    }
    if (e->what == MACO_DEVICE_ERR_COUNT_MISMATCH) {
        /* object: bits 0-1 the receive's kind (send/recv, all-to-all, all-to-allv), bits
         * 2-3 log2 of its element size (algorithms' p2p_plan.h). */
        static const char *kinds[4] = { "maco_recv", "maco_alltoall", "maco_alltoallv", "?" };
        unsigned esz = 1u << (((unsigned)e->object >> 2) & 3u);
        if (status == MACO_ERR_INTERNAL)
            maco__error_quiet((maco_status_t)status,
                              "rank %d: chunks of one message from rank %d disagree on its size "
                              "(%llu and %llu bytes): the send/recv lanes are out of step",
                              comm->rank, (int)e->peer, (unsigned long long)e->expected,
                              (unsigned long long)e->observed);
        else
            maco__error_quiet(
                (maco_status_t)status,
                "rank %d: a %s of %llu elements (%llu bytes) from rank %d met a "
                "send of %llu bytes (%llu elements of %u bytes): the counts must "
                "match; nothing of that message was written",
                comm->rank, kinds[e->object & 3], (unsigned long long)(e->expected / esz),
                (unsigned long long)e->expected, (int)e->peer, (unsigned long long)e->observed,
                (unsigned long long)(e->observed / esz), esz);
        maco__comm_record(comm, (maco_status_t)status);
        return (maco_status_t)status;
    }
    if (e->what >= MACO_DEVICE_WAIT_TASK && e->what <= MACO_DEVICE_WAIT_TASK_GATE) {
        unsigned long long x = (unsigned long long)e->expected, y = (unsigned long long)e->observed;
        if (e->what == MACO_DEVICE_WAIT_TASK)
            maco__error_quiet((maco_status_t)status,
                              "rank %d: persistent kernel: the CTA of queue %d found no task to "
                              "run while no task finished for 2 x %llu ms (%llu of the %llu "
                              "finished tasks that end the launch)",
                              comm->rank, (int)e->object,
                              (unsigned long long)(comm->timeout_ns / 1000000ull), y, x);
        else if (e->what == MACO_DEVICE_WAIT_TASK_COUNTER)
            maco__error_quiet((maco_status_t)status,
                              "rank %d: persistent kernel: task %d (wait) timed out after %llu "
                              "ms: its counter was to reach %llu, last read %llu",
                              comm->rank, (int)e->object,
                              (unsigned long long)(comm->timeout_ns / 1000000ull), x, y);
        else if (e->what == MACO_DEVICE_WAIT_TASK_QUEUE)
            maco__error_quiet((maco_status_t)status,
                              "rank %d: persistent kernel: task queue %d stayed full for %llu ms "
                              "(position %llu to write, its consumer at %llu)",
                              comm->rank, (int)e->object,
                              (unsigned long long)(comm->timeout_ns / 1000000ull), x, y);
        else if (e->what == MACO_DEVICE_WAIT_TASK_GATE && e->peer >= 0)
            maco__error_quiet((maco_status_t)status,
                              "rank %d: persistent kernel: task %d waited %llu ms for rank %d "
                              "at its gate (its counter was to reach %llu, last read %llu): is "
                              "rank %d alive and running the same graph?",
                              comm->rank, (int)e->object,
                              (unsigned long long)(comm->timeout_ns / 1000000ull), (int)e->peer, x,
                              y, (int)e->peer);
        else if (e->what == MACO_DEVICE_WAIT_TASK_GATE)
            maco__error_quiet((maco_status_t)status,
                              "rank %d: persistent kernel: task %d waited %llu ms at its gate "
                              "for signals of several ranks (its counter was to reach %llu, "
                              "last read %llu)",
                              comm->rank, (int)e->object,
                              (unsigned long long)(comm->timeout_ns / 1000000ull), x, y);
        else if (e->what == MACO_DEVICE_ERR_TASK_TYPE)
            maco__error_quiet((maco_status_t)status,
                              "rank %d: persistent kernel: task %d has type %llu, which this "
                              "kernel cannot run (a user type needs a kernel with its function)",
                              comm->rank, (int)e->object, x);
        else
            maco__error_quiet(
                (maco_status_t)status, "rank %d: persistent kernel: task %d (type %llu) failed: %s",
                comm->rank, (int)e->object, x, maco_status_string((maco_status_t)status));
        maco__comm_record(comm, (maco_status_t)status);
        return (maco_status_t)status;
    }
    if (e->what == MACO_DEVICE_WAIT_EP) {
        static const char *flags[5] = { "?", "dispatch counts", "dispatch rows",
                                        "combine ready flag", "combine rows" };
        maco__error_quiet((maco_status_t)status,
                          "rank %d: an EP %s wait %s after %llu ms: waited for rank %d's %s "
                          "(value %llu, last saw %llu): is rank %d alive and making the same "
                          "EP calls?",
                          comm->rank, e->object >= 1 && e->object <= 2 ? "dispatch" : "combine",
                          status == MACO_ERR_TIMEOUT ? "timed out" : "failed",
                          (unsigned long long)(comm->timeout_ns / 1000000ull), (int)e->peer,
                          flags[e->object >= 1 && e->object <= 4 ? e->object : 0],
                          (unsigned long long)e->expected, (unsigned long long)e->observed,
                          (int)e->peer);
        maco__comm_record(comm, (maco_status_t)status);
        return (maco_status_t)status;
    }
    maco__error_quiet((maco_status_t)status,
                      "rank %d: a device-side wait %s after %llu ms: waited for rank %d on %s "
                      "%d for value %llu, last saw %llu",
                      comm->rank, status == MACO_ERR_TIMEOUT ? "timed out" : "failed",
                      (unsigned long long)(comm->timeout_ns / 1000000ull), (int)e->peer,
                      e->what == MACO_DEVICE_WAIT_PACKET  ? "LL packet slot"
                      : e->what == MACO_DEVICE_WAIT_FIFO  ? "proxy FIFO space at position"
                      : e->what == MACO_DEVICE_WAIT_FLUSH ? "proxy flush of position"
                                                          : "semaphore",
                      (int)e->object, (unsigned long long)e->expected,
                      (unsigned long long)e->observed);
    maco__comm_record(comm, (maco_status_t)status);
    return (maco_status_t)status;
}

void maco__comm_set_unavailable(maco_comm_t comm, const char *why)
{
    if (comm->gpu_unavailable[0] == '\0')
        snprintf(comm->gpu_unavailable, sizeof(comm->gpu_unavailable), "%s", why);
}

const maco__comm_ext_t *maco__comm_extension(void)
{
    /* The collectives' registration hook (comm_internal.h says why it is weak). */
    return maco__collectives_extension != NULL ? maco__collectives_extension() : NULL;
}

/* The communicator's record of a revocation: the first error, the asynchronous status (every
 * launch and every maco_comm_get_async_error sees it) and the device waits ended. */
void maco__comm_on_revoke(void *ctx, int by_rank)
{
    maco_comm_t comm = (maco_comm_t)ctx;
    pthread_mutex_lock(&comm->error_lock);
    if (comm->first_status == MACO_OK || comm->first_status == MACO_ERR_INVALID_ARGUMENT ||
        comm->first_status == MACO_ERR_UNSUPPORTED) {
        comm->first_status = MACO_ERR_REVOKED;
        if (by_rank == comm->rank)
            snprintf(comm->first_error, sizeof(comm->first_error),
                     "rank %d: the communicator was revoked (maco_comm_revoke): its work ends; "
                     "destroy it or shrink it",
                     comm->rank);
        else
            snprintf(comm->first_error, sizeof(comm->first_error),
                     "rank %d: rank %d revoked the communicator (maco_comm_revoke): its work "
                     "ends; destroy it or shrink it",
                     comm->rank, by_rank);
    }
    pthread_mutex_unlock(&comm->error_lock);
    __atomic_compare_exchange_n(&comm->host_async_status, &(int32_t){ 0 },
                                (int32_t)MACO_ERR_REVOKED, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    if (comm->buf != NULL)
        (void)maco__comm_end_device_waits(comm); /* logs its own failure */
}

maco_status_t maco__comm_refuse(maco_comm_t comm, const char *who, maco_status_t async_st,
                                unsigned subsys)
{
    if (async_st == MACO_ERR_REVOKED)
        return maco__comm_record(comm, maco__error(MACO_ERR_REVOKED, subsys,
                                                   "%s: the communicator was revoked: %s; "
                                                   "destroy it or shrink it",
                                                   who, maco_comm_get_last_error(comm)));
    return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_USAGE, subsys,
                                               "%s: the communicator has failed (%s): %s; "
                                               "destroy it",
                                               who, maco_status_string(async_st),
                                               maco_comm_get_last_error(comm)));
}
