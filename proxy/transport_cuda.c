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
 * Flush markers are events recorded on the stream.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "log.h"
#include "proxy_internal.h"

static maco_status_t maco__cuda_put(struct maco_port_channel *ch, uint64_t dst_offset,
                                    uint64_t src_offset, uint64_t bytes)
{
    /* The driver's device-to-device copy: the least work per call (no pointer lookup, no
     * runtime layer), which matters for the latency of small puts. */
    if (maco__cu()->cuMemcpyDtoDAsync != NULL) {
        CUresult res = maco__cu()->cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)(ch->dst + dst_offset),
                                                     (CUdeviceptr)(uintptr_t)(ch->src + src_offset),
                                                     bytes, (CUstream)ch->proxy->stream);
        if (res == CUDA_SUCCESS)
            return MACO_OK;
        char text[160];
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                           "port channel %u to rank %d: cuMemcpyDtoDAsync of %llu bytes failed: %s",
                           ch->id, ch->peer, (unsigned long long)bytes,
                           maco__cu_error_text(res, text, sizeof(text)));
    }
    cudaError_t err = cudaMemcpyAsync(ch->dst + dst_offset, ch->src + src_offset, bytes,
                                      cudaMemcpyDeviceToDevice, ch->proxy->stream);
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
static maco_status_t maco__cuda_write_staged(struct maco_port_channel *ch, void *dst,
                                             uint64_t value, uint32_t bytes)
{
    struct maco_proxy *p = ch->proxy;
    if (p->staging == NULL) {
        if (cudaHostAlloc((void **)&p->staging, MACO__STAGING_SLOTS * sizeof(uint64_t),
                          cudaHostAllocDefault) != cudaSuccess ||
            (p->staging_events = (cudaEvent_t *)calloc(MACO__STAGING_SLOTS, sizeof(cudaEvent_t))) ==
                NULL) {
            cudaGetLastError();
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                               "port channel %u: no pinned memory for signal staging", ch->id);
        }
    }
    uint32_t slot = p->staging_next++ % MACO__STAGING_SLOTS;
    if (p->staging_events[slot] == NULL &&
        cudaEventCreateWithFlags(&p->staging_events[slot], cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                           "signal staging: cudaEventCreate failed");
    }
    cudaEventSynchronize(p->staging_events[slot]); /* its previous copy has run */
    p->staging[slot] = value;
    cudaError_t err =
        cudaMemcpyAsync(dst, &p->staging[slot], bytes, cudaMemcpyHostToDevice, p->stream);
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

static maco_status_t maco__cuda_signal(struct maco_port_channel *ch)
{
    struct maco_proxy *p = ch->proxy;
    uint64_t value = ++ch->signals_sent;
    if (p->stream_writes >= 0 && maco__cu()->cuStreamWriteValue64 != NULL) {
        CUresult res = maco__cu()->cuStreamWriteValue64((CUstream)p->stream,
                                                        (CUdeviceptr)(uintptr_t)ch->remote_inbound,
                                                        value, CU_STREAM_WRITE_VALUE_DEFAULT);
        if (res == CUDA_SUCCESS) {
            p->stream_writes = 1;
            return MACO_OK;
        }
        if (p->stream_writes == 1) {
            char text[160];
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                               "port channel %u to rank %d: cuStreamWriteValue64 failed: %s",
                               ch->id, ch->peer, maco__cu_error_text(res, text, sizeof(text)));
        }
        MACO_INFO(MACO_SUBSYS_PROXY, "stream memory operations unavailable; signals are staged "
                                     "copies");
        p->stream_writes = -1;
    }
    return maco__cuda_write_staged(ch, ch->remote_inbound, value, 8);
}

/*
 * An inline put: the value (and, with_signal, the next signal count after it) written by
 * stream memory operations in one cuStreamBatchMemOp call, in stream order after earlier
 * copies. Each write's default flags put a memory barrier before it, so the peer sees the
 * count only after the value. One driver call instead of a copy and a write: about 3 us less
 * per put on H200 (bench_port_channel --pieces).
 */
static maco_status_t maco__cuda_put_value(struct maco_port_channel *ch, uint64_t dst_offset,
                                          uint64_t value, uint32_t bytes, int with_signal)
{
    struct maco_proxy *p = ch->proxy;
    if (p->stream_writes >= 0 && maco__cu()->cuStreamBatchMemOp != NULL) {
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
        if (res == CUDA_SUCCESS) {
            p->stream_writes = 1;
            if (with_signal)
                ch->signals_sent++;
            return MACO_OK;
        }
        if (p->stream_writes == 1) {
            char text[160];
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                               "port channel %u to rank %d: cuStreamBatchMemOp (a put of %u "
                               "bytes%s) failed: %s",
                               ch->id, ch->peer, bytes, with_signal ? " and a signal" : "",
                               maco__cu_error_text(res, text, sizeof(text)));
        }
        MACO_INFO(MACO_SUBSYS_PROXY, "stream memory operations unavailable; small puts and "
                                     "signals are staged copies");
        p->stream_writes = -1;
    }
    maco_status_t st = maco__cuda_write_staged(ch, ch->dst + dst_offset, value, bytes);
    if (st == MACO_OK && with_signal)
        st = maco__cuda_signal(ch);
    return st;
}

static maco_status_t maco__cuda_mark(struct maco_proxy *p, void **marker_p)
{
    cudaEvent_t ev;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err == cudaSuccess)
        err = cudaEventRecord(ev, p->stream);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY, "flush: recording an event failed: %s",
                           cudaGetErrorString(err));
    }
    *marker_p = (void *)ev;
    return MACO_OK;
}

static int maco__cuda_marker_done(struct maco_proxy *p, void *marker)
{
    (void)p;
    cudaError_t err = cudaEventQuery((cudaEvent_t)marker);
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

static void maco__cuda_marker_free(struct maco_proxy *p, void *marker)
{
    (void)p;
    cudaEventDestroy((cudaEvent_t)marker);
}

const maco__transport_ops_t maco__transport_cuda_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "CUDA copy",
    .put = maco__cuda_put,
    .signal = maco__cuda_signal,
    .mark = maco__cuda_mark,
    .marker_done = maco__cuda_marker_done,
    .marker_free = maco__cuda_marker_free,
    .put_value = maco__cuda_put_value,
};
