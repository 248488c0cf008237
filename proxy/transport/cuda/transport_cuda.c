/*
 * transport_cuda.c - the CUDA copy transport: GPUs of one node, through the copy engines.
 *
 * Every channel of a proxy uses the proxy's one stream, so work completes in trigger order.
 * put: cudaMemcpyAsync from this rank's buffer into the peer's buffer mapped over CUDA IPC.
 * signal: writes the channel's next signal count into the peer's semaphore (device memory,
 * mapped) with cuStreamWriteValue64 on the same stream; its default flags put a memory
 * barrier before the write, so the peer cannot see the count before the data of earlier puts
 * (CUDA driver API, cuStreamWriteValue64). Where stream memory operations are unavailable, the
 * count is staged in pinned host memory and copied on the stream (a ring of staging slots,
 * each reused only after the event recorded after its copy has passed).
 * put_value (an inline put of 4 or 8 bytes, maco/device/fifo.h): the value and the signal
 * written by stream memory operations in one cuStreamBatchMemOp, no copy.
 * Flush markers are events recorded on the stream. The stream and the staging slots are the
 * proxy's instance of the transport (maco__cuda_state_t), made at its first CUDA-copy channel.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/base/config.h"
#include "src/host/cuda/cuda_driver.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"
#include "proxy/proxy_internal.h"
#include "src/host/os/socket.h"

enum { MACO__STAGING_SLOTS = 1024 };

/* The proxy's instance: one stream for all its CUDA-copy channels. */
typedef struct maco__cuda_state {
    cudaStream_t stream;
    uint64_t *staging; /* fallback signal values when stream writes are unavailable */
    uint32_t staging_next;
    cudaEvent_t *staging_events;
    int stream_writes; /* cuStreamWriteValue64: 0 untried, 1 works, -1 staged copies instead */
    int batch_ops;     /* cuStreamBatchMemOp: the same */
} maco__cuda_state_t;

static maco_status_t maco__cuda_proxy_setup(struct maco_proxy *p, void **state_p)
{
    maco_status_t st = MACO_OK;
    int64_t memops = 1;
    st = maco__config_int64(MACO_CFG_PROXY_STREAM_MEMOPS, &memops);
    if (st != MACO_OK)
        return st;
    maco__cuda_state_t *s = (maco__cuda_state_t *)calloc(1, sizeof(*s));
    if (s == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "CUDA copy transport: no memory");
    s->stream_writes = s->batch_ops = memops ? 0 : -1;
    MACO_CUDA_GOTO(cudaSetDevice(p->comm->cuda_device), st, fail);
    MACO_CUDA_GOTO(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), st, fail);
    *state_p = s;
    return MACO_OK;
fail:
    free(s);
    return st;
}

static void maco__cuda_proxy_teardown(struct maco_proxy *p, void *state)
{
    maco__cuda_state_t *s = (maco__cuda_state_t *)state;
    if (s == NULL)
        return;
    if (s->stream) {
        cudaStreamSynchronize(s->stream);
        cudaStreamDestroy(s->stream);
    }
    if (s->staging_events) {
        for (int i = 0; i < MACO__STAGING_SLOTS; i++)
            if (s->staging_events[i])
                cudaEventDestroy(s->staging_events[i]);
        free(s->staging_events);
    }
    if (s->staging)
        cudaFreeHost(s->staging);
    cudaGetLastError();
    free(s);
}

static maco_status_t maco__cuda_put(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                                    uint64_t src_offset, uint64_t bytes)
{
    maco__cuda_state_t *s = (maco__cuda_state_t *)state;
    /* The driver's device-to-device copy: the least work per call (no pointer lookup, no
     * runtime layer), which matters for the latency of small puts. */
    if (maco__cu()->cuMemcpyDtoDAsync != NULL) {
        CUresult res = maco__cu()->cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)(ch->dst + dst_offset),
                                                     (CUdeviceptr)(uintptr_t)(ch->src + src_offset),
                                                     bytes, (CUstream)s->stream);
        if (res == CUDA_SUCCESS)
            return MACO_OK;
        char text[160];
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                           "port channel %u to rank %d: cuMemcpyDtoDAsync of %llu bytes failed: %s",
                           ch->id, ch->peer, (unsigned long long)bytes,
                           maco__cu_error_text(res, text, sizeof(text)));
    }
    cudaError_t err = cudaMemcpyAsync(ch->dst + dst_offset, ch->src + src_offset, bytes,
                                      cudaMemcpyDeviceToDevice, s->stream);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                           "port channel %u to rank %d: cudaMemcpyAsync of %llu bytes failed: %s",
                           ch->id, ch->peer, (unsigned long long)bytes, cudaGetErrorString(err));
    }
    return MACO_OK;
}

/* Writes `bytes` (4 or 8) of `value` to device address `dst` in stream order through a
 * pinned staging slot and a copy (where stream memory operations are unavailable). */
static maco_status_t maco__cuda_write_staged(struct maco_port_channel *ch, maco__cuda_state_t *p,
                                             void *dst, uint64_t value, uint32_t bytes)
{
    if (p->staging == NULL) {
        uint64_t *staging = NULL;
        cudaEvent_t *events = (cudaEvent_t *)calloc(MACO__STAGING_SLOTS, sizeof(cudaEvent_t));
        if (events == NULL ||
            cudaHostAlloc((void **)&staging, MACO__STAGING_SLOTS * sizeof(uint64_t),
                          cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            free(events);
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                               "port channel %u: no pinned memory for staged writes", ch->id);
        }
        p->staging = staging;
        p->staging_events = events;
    }
    uint32_t slot = p->staging_next++ % MACO__STAGING_SLOTS;
    if (p->staging_events[slot] == NULL &&
        cudaEventCreateWithFlags(&p->staging_events[slot], cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        p->staging_events[slot] = NULL;
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                           "port channel %u to rank %d: staged write: cudaEventCreate failed",
                           ch->id, ch->peer);
    }
    /* The slot's previous copy has run: an event recorded after a copy of at most 8 bytes,
     * MACO__STAGING_SLOTS writes ago, on the proxy's stream, which holds only copies and
     * stream writes (nothing there waits on kernels), so it passes at once unless a copy
     * engine is stuck; the wait is bounded all the same. */
    int64_t deadline = maco__deadline_ms(maco__proxy_host_bound_ms(ch->proxy));
    cudaError_t err;
    while ((err = cudaEventQuery(p->staging_events[slot])) == cudaErrorNotReady) {
        if (maco__now_ms() > deadline) {
            cudaGetLastError();
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_PROXY,
                               "port channel %u to rank %d: staged write: the copy %u writes "
                               "earlier had not completed after %lld ms",
                               ch->id, ch->peer, (unsigned)MACO__STAGING_SLOTS,
                               (long long)maco__proxy_host_bound_ms(ch->proxy));
        }
        sched_yield();
    }
    if (err == cudaSuccess) {
        p->staging[slot] = value; /* little-endian: a 4-byte copy takes the low bytes */
        err = cudaMemcpyAsync(dst, &p->staging[slot], bytes, cudaMemcpyHostToDevice, p->stream);
    }
    if (err == cudaSuccess)
        err = cudaEventRecord(p->staging_events[slot], p->stream);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                           "port channel %u to rank %d: staged write of %u bytes failed: %s",
                           ch->id, ch->peer, bytes, cudaGetErrorString(err));
    }
    return MACO_OK;
}

/* Whether a stream memory operation API answered `res` for the first time: remembers it in
 * *state (1 works, -1 unavailable) and returns MACO_OK to go on with staged copies, or the
 * error when the API had worked before (a real failure). */
static maco_status_t maco__cuda_memop_result(struct maco_port_channel *ch, CUresult res, int *state,
                                             const char *what)
{
    if (res == CUDA_SUCCESS) {
        *state = 1;
        return MACO_OK;
    }
    char text[160];
    if (*state == 1)
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                           "port channel %u to rank %d: %s failed: %s", ch->id, ch->peer, what,
                           maco__cu_error_text(res, text, sizeof(text)));
    MACO_INFO(MACO_SUBSYS_PROXY, "%s unavailable (%s); staged copies instead", what,
              maco__cu_error_text(res, text, sizeof(text)));
    *state = -1;
    return MACO_OK;
}

static maco_status_t maco__cuda_signal(struct maco_port_channel *ch, void *state)
{
    maco__cuda_state_t *p = (maco__cuda_state_t *)state;
    uint64_t value = ch->signals_sent + 1;
    maco_status_t st = MACO_OK;
    if (p->stream_writes >= 0 && maco__cu()->cuStreamWriteValue64 != NULL) {
        CUresult res = maco__cu()->cuStreamWriteValue64((CUstream)p->stream,
                                                        (CUdeviceptr)(uintptr_t)ch->remote_inbound,
                                                        value, CU_STREAM_WRITE_VALUE_DEFAULT);
        st = maco__cuda_memop_result(ch, res, &p->stream_writes, "cuStreamWriteValue64");
        if (st == MACO_OK && res == CUDA_SUCCESS) {
            ch->signals_sent = value;
            return MACO_OK;
        }
        if (st != MACO_OK)
            return st;
    }
    st = maco__cuda_write_staged(ch, p, ch->remote_inbound, value, 8);
    if (st == MACO_OK)
        ch->signals_sent = value; /* counted once queued, so a failure never skips a count */
    return st;
}

/*
 * An inline put: the value (and, with_signal, the next signal count after it) written by
 * stream memory operations in one cuStreamBatchMemOp call, in stream order after earlier
 * copies. Each write's default flags put a memory barrier before it, so the peer sees the
 * count only after the value. One driver call instead of a copy and a write: about 2.5 us
 * less from the call until the peer sees the count (docs/performance.md, "Tuning").
 * Where stream memory operations are unavailable: a staged copy of the value, then the
 * signal. The signal is this function's whole job: on a failure it is not sent at all.
 */
static maco_status_t maco__cuda_put_value(struct maco_port_channel *ch, void *state,
                                          uint64_t dst_offset, uint64_t value, uint32_t bytes,
                                          int with_signal)
{
    maco__cuda_state_t *p = (maco__cuda_state_t *)state;
    if (p->batch_ops >= 0 && maco__cu()->cuStreamBatchMemOp != NULL) {
        CUstreamBatchMemOpParams ops[2];
        memset(ops, 0, sizeof(ops));
        ops[0].writeValue.operation =
            bytes == 4 ? CU_STREAM_MEM_OP_WRITE_VALUE_32 : CU_STREAM_MEM_OP_WRITE_VALUE_64;
        ops[0].writeValue.address = (CUdeviceptr)(uintptr_t)(ch->dst + dst_offset);
        if (bytes == 4)
            ops[0].writeValue.value = (cuuint32_t)value;
        else
            ops[0].writeValue.value64 = value;
        ops[0].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        if (with_signal) {
            ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
            ops[1].writeValue.address = (CUdeviceptr)(uintptr_t)ch->remote_inbound;
            ops[1].writeValue.value64 = ch->signals_sent + 1;
            ops[1].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        }
        CUresult res =
            maco__cu()->cuStreamBatchMemOp((CUstream)p->stream, with_signal ? 2u : 1u, ops, 0);
        maco_status_t st = maco__cuda_memop_result(ch, res, &p->batch_ops, "cuStreamBatchMemOp");
        if (st != MACO_OK)
            return st;
        if (res == CUDA_SUCCESS) {
            if (with_signal)
                ch->signals_sent++;
            return MACO_OK;
        }
    }
    maco_status_t st = maco__cuda_write_staged(ch, p, ch->dst + dst_offset, value, bytes);
    if (st == MACO_OK && with_signal)
        st = maco__cuda_signal(ch, state);
    return st;
}

static maco_status_t maco__cuda_mark(struct maco_proxy *p, void *state, uint64_t *marker_p)
{
    maco__cuda_state_t *s = (maco__cuda_state_t *)state;
    cudaEvent_t ev;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err == cudaSuccess) {
        err = cudaEventRecord(ev, s->stream);
        if (err != cudaSuccess)
            cudaEventDestroy(ev);
    }
    if (err != cudaSuccess) {
        cudaGetLastError();
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY, "flush: recording an event failed: %s",
                           cudaGetErrorString(err));
    }
    *marker_p = (uint64_t)(uintptr_t)ev;
    return MACO_OK;
}

static int maco__cuda_marker_done(struct maco_proxy *p, void *state, uint64_t marker)
{
    cudaError_t err = cudaEventQuery((cudaEvent_t)(uintptr_t)marker);
    if (err == cudaErrorNotReady)
        return 0;
    if (err != cudaSuccess) {
        cudaGetLastError();
        maco__proxy_fail(p, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                                        "flush: the proxy's copies failed: %s",
                                        cudaGetErrorString(err)));
    }
    return 1;
}

static void maco__cuda_marker_free(struct maco_proxy *p, void *state, uint64_t marker)
{
    cudaEventDestroy((cudaEvent_t)(uintptr_t)marker);
}

/* Copies still queued on the stream (maco_proxy_stop waits for them). */
static int maco__cuda_outstanding(struct maco_proxy *p, void *state)
{
    maco__cuda_state_t *s = (maco__cuda_state_t *)state;
    cudaError_t err = cudaStreamQuery(s->stream);
    if (err == cudaErrorNotReady)
        return 1;
    if (err != cudaSuccess)
        cudaGetLastError();
    return 0;
}

static int maco__cuda_available(maco_comm_t comm, int peer, char *why, size_t cap)
{
    return 1; /* the GPU and the node are checked with the buffers (port_channel.c) */
}

const maco__transport_ops_t maco__transport_cuda_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "CUDA copy",
    .available = maco__cuda_available,
    .proxy_setup = maco__cuda_proxy_setup,
    .proxy_teardown = maco__cuda_proxy_teardown,
    .put = maco__cuda_put,
    .put_value = maco__cuda_put_value,
    .signal = maco__cuda_signal,
    .mark = maco__cuda_mark,
    .marker_done = maco__cuda_marker_done,
    .marker_free = maco__cuda_marker_free,
    .outstanding = maco__cuda_outstanding,
};
