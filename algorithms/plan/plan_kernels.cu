/*
 * plan_kernels.cu - the generic plan executor: one CTA per thread block of the plan, each
 * interpreting its operation list (docs/plan-format.md, "Execution").
 *
 * One launch:
 *   1. all CTAs copy sendbuf into this rank's plan input buffer; grid barrier;
 *   2. CTA 0 runs a barrier with every peer (signal, then wait, on one channel per peer),
 *      so no peer touches this rank's buffers before they hold this launch's input and
 *      before this rank's previous launch has copied its output out; grid barrier;
 *   3. each CTA runs its operations in order, with __syncthreads() between them;
 *   4. grid barrier; CTA 0 runs a second barrier with every peer (so no peer is still reading
 *      or writing this rank's buffers), grid barrier; all CTAs copy the output buffer into
 *      recvbuf; CTA 0 advances the LL flag (device memory) for the next launch.
 * Everything per launch lives on the device, so a launch can be captured in a CUDA graph and
 * replayed. Every wait is bounded (MACO_DEVICE_TIMEOUT); on a failure a CTA stops and the
 * others stop at their next wait (maco_spin_check sees the claimed error).
 *
 * Plans with port channels (a.cinfo != NULL): every chunk that a port put writes lives on its
 * rank in the host buffer (pinned host memory mapped for the GPU, plan_exec.c's file comment
 * says why), at the same offset as in the plan buffer; every other chunk in the plan buffer.
 * Whoever reads or writes a chunk, through a memory channel or locally, uses the address where
 * it lives (a.res says), and reads host-resident chunks with loads that fetch again
 * (sysmem.cuh: a proxy or a peer wrote them while the kernel ran). A port put of a chunk
 * that lives in the plan buffer first copies it to the same offset of the host buffer (its
 * mirror), and the proxy sends it from there: no proxy ever touches GPU memory, so no CUDA
 * copy of the proxy can wait behind the application's later work. The barrier with a peer
 * runs on a port channel when the peer is on another node or the plan has port channels to
 * it: its signal follows the puts of the peer's proxy, so after the last barrier every put
 * has landed.
 *
 * The grid barrier needs every CTA resident at once: plans have at most 64 thread blocks of
 * MACO__PLAN_THREADS threads, well under one GPU's capacity even with ranks sharing it.
 */
#include <stdint.h>

#include "maco/device/copy.h"
#include "maco/device/error.h"
#include "maco/device/memory_channel.h"
#include "maco/device/packet.h"
#include "algorithms/plan/plan_exec.h"
#include "maco/device/port_channel.h"
#include "src/device/reduce.cuh"
#include "src/device/sysmem.cuh"

/* Arrives at the grid barrier of this launch and waits (bounded) for every CTA. Port: the
 * plan has port channels (a.cinfo != NULL); the kernel of plans without them is compiled
 * without that code, so their path stays as fast as before port channels. */
template <int Port>
static __device__ maco_status_t maco__plan_grid_barrier(const maco__pexec_args_t &a)
{
    __shared__ int st_shared;
    if (Port)
        __threadfence_system(); /* this thread's writes to host memory, for peers and proxies */
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long *ctr = (unsigned long long *)(a.buf + MACO__PLAN_CTR_GRID);
        __threadfence_system();
        unsigned long long nb = gridDim.x;
        unsigned long long old = atomicAdd(ctr, 1ull);
        unsigned long long target = (old / nb + 1) * nb;
        maco_spin_state_t spin = { 0, 0 };
        maco_status_t st = MACO_OK;
        while (*(volatile unsigned long long *)ctr < target) {
            st = maco_spin_check(&a.bound, &spin);
            if (st != MACO_OK) {
                if (st == MACO_ERR_TIMEOUT)
                    maco_device_error_record(&a.bound, st, -1, (int)blockIdx.x, 0, target,
                                             *(volatile unsigned long long *)ctr);
                break;
            }
        }
        __threadfence();
        st_shared = (int)st;
    }
    __syncthreads();
    return (maco_status_t)st_shared;
}

/* CTA 0: a signal to and a wait from every peer on the barrier channels (release/acquire). */
template <int Port>
static __device__ maco_status_t maco__plan_peer_barrier(const maco__pexec_args_t &a)
{
    __shared__ int st_shared;
    if (threadIdx.x == 0) {
        maco_status_t st = MACO_OK;
        const maco_memory_channel_device_t *bar = a.chans + a.nchannels;
        if (!Port) {
            for (int k = 0; k < a.npeers; k++)
                maco_memory_channel_signal(&bar[k]);
            for (int k = 0; k < a.npeers && st == MACO_OK; k++)
                st = maco_memory_channel_wait(&bar[k]);
        } else {
            /* Every CTA's writes to host memory were fenced before the grid barrier. */
            __threadfence_system();
            const int c0 = a.nchannels;
            for (int k = 0; k < a.npeers && st == MACO_OK; k++)
                if (a.cinfo[c0 + k].port)
                    st = maco_port_channel_signal(&a.ports[c0 + k]);
                else
                    maco_memory_channel_signal(&bar[k]);
            for (int k = 0; k < a.npeers && st == MACO_OK; k++)
                st = a.cinfo[c0 + k].port ? maco_port_channel_wait(&a.ports[c0 + k])
                                          : maco_memory_channel_wait(&bar[k]);
        }
        st_shared = (int)st;
    }
    __syncthreads();
    return (maco_status_t)st_shared;
}

/* Elements of part p of the unit. */
static __device__ __forceinline__ uint64_t maco__part_elems(const maco__pexec_args_t &a, int p)
{
    uint64_t k = (uint64_t)a.parts;
    return ((uint64_t)p + 1) * a.count / k - (uint64_t)p * a.count / k;
}

/* Byte offset in a plan buffer of chunk `index` of `buffer`. */
static __device__ __forceinline__ uint64_t maco__chunk_off(const maco__pexec_args_t &a, int buffer,
                                                           uint32_t index)
{
    if (buffer == MACO__PBUF_SCRATCH)
        return a.scr_off + (uint64_t)index * a.slot_bytes;
    uint64_t k = (uint64_t)a.parts, s = index / k, p = index % k;
    uint64_t base = buffer == MACO__PBUF_INPUT ? a.in_off : a.out_off;
    return base + (s * a.count + p * a.count / k) * a.esz;
}

/* Where chunk `index` of `buffer` of rank `rank` lives (plans with port channels): 1 in the
 * host buffer, 0 in the plan buffer. */
static __device__ __forceinline__ int maco__chunk_in_host(const maco__pexec_args_t &a, int rank,
                                                          int buffer, uint32_t index)
{
    uint32_t base = buffer == MACO__PBUF_INPUT    ? 0u
                    : buffer == MACO__PBUF_OUTPUT ? a.res_out
                                                  : a.res_scr;
    return a.res[(uint64_t)rank * a.res_stride + base + index];
}

/* The address of chunk (buffer, index) at byte offset `off` of this rank (channel < 0) or of
 * the channel's peer (a memory channel); *sys_p = 1 when it is in host memory. */
static __device__ __forceinline__ char *maco__chunk_ptr(const maco__pexec_args_t &a, int channel,
                                                        int buffer, uint32_t index, uint64_t off,
                                                        int *sys_p)
{
    int rank = channel < 0 ? a.rank : a.cinfo[channel].peer;
    *sys_p = a.res != NULL && maco__chunk_in_host(a, rank, buffer, index);
    if (channel < 0)
        return (*sys_p ? a.host : a.buf) + off;
    return (*sys_p ? a.cinfo[channel].peer_host : a.chans[channel].remote) + off;
}

/* dst := src (bytes), the CTA's threads; src in host memory (sys) is read with loads that
 * fetch again, 16, 4 or 1 bytes at a time as the two addresses allow. */
static __device__ void maco__plan_copy(char *dst, const char *src, uint64_t bytes, int sys)
{
    if (!sys) {
        maco_copy(dst, src, bytes, threadIdx.x, blockDim.x);
        return;
    }
    uintptr_t al = (uintptr_t)dst | (uintptr_t)src;
    if ((al & 15u) == 0) {
        maco__copy_from_sysmem(dst, src, bytes, threadIdx.x, blockDim.x);
        return;
    }
    uint64_t n4 = (al & 3u) == 0 ? bytes / 4 : 0;
    for (uint64_t i = threadIdx.x; i < n4; i += blockDim.x)
        ((uint32_t *)dst)[i] = __ldcv((const unsigned int *)src + i);
    for (uint64_t i = n4 * 4 + threadIdx.x; i < bytes; i += blockDim.x)
        dst[i] = (char)__ldcv((const signed char *)src + i);
}

/* A load that fetches again (__ldcv has no overload for every unsigned width by name). */
static __device__ __forceinline__ uint8_t maco__ldcv_bits(const uint8_t *p)
{
    return (uint8_t)__ldcv((const unsigned char *)p);
}
static __device__ __forceinline__ uint16_t maco__ldcv_bits(const uint16_t *p)
{
    return (uint16_t)__ldcv((const unsigned short *)p);
}
static __device__ __forceinline__ uint32_t maco__ldcv_bits(const uint32_t *p)
{
    return (uint32_t)__ldcv((const unsigned int *)p);
}
static __device__ __forceinline__ uint64_t maco__ldcv_bits(const uint64_t *p)
{
    return (uint64_t)__ldcv((const unsigned long long *)p);
}

/* One element (esz bytes) of a source: plain memory (packets 0), LL16 packets (1, waiting),
 * or host memory a proxy or a peer wrote (2, loads that fetch again). */
template <class T, int Port>
static __device__ __forceinline__ maco_status_t maco__load_elem(const char *base, int packets,
                                                                uint64_t e, uint32_t flag,
                                                                const maco_device_wait_bound_t *b,
                                                                typename T::bits *out)
{
    typedef typename T::bits B;
    if (packets == 0) {
        *out = *(const B *)(base + e * sizeof(B));
        return MACO_OK;
    }
    if (Port && packets == 2) {
        *out = maco__ldcv_bits((const B *)(base + e * sizeof(B)));
        return MACO_OK;
    }
    uint64_t byte = e * sizeof(B);
    const maco_ll16_packet_t *p = (const maco_ll16_packet_t *)base + byte / 8;
    uint2 d;
    maco_status_t st = maco_ll16_load(p, flag, &d, b, -1, (int)((byte / 8) & 0x7fffffff));
    if (st != MACO_OK)
        return st;
    uint64_t w = ((uint64_t)d.y << 32) | d.x;
    *out = (B)(w >> (8 * (byte % 8)));
    return MACO_OK;
}

/* dst[0..elems) = op over sources; avg divides once (a reduce that writes an output chunk). */
template <class T, int Port>
static __device__ maco_status_t maco__plan_reduce(const maco__pexec_args_t &a, char *dst,
                                                  const char *const *src, const uint8_t *pk,
                                                  int nsrcs, uint64_t elems, uint32_t flag,
                                                  int divide)
{
    typedef typename T::bits B;
    maco_status_t st = MACO_OK;
    for (uint64_t e = threadIdx.x; e < elems && st == MACO_OK; e += blockDim.x) {
        B v;
        st = maco__load_elem<T, Port>(src[0], pk[0], e, flag, &a.bound, &v);
        typename T::acc acc = T::widen(v);
        for (int s = 1; s < nsrcs && st == MACO_OK; s++) {
            st = maco__load_elem<T, Port>(src[s], pk[s], e, flag, &a.bound, &v);
            acc = maco__combine<T, MACO__OP_RUNTIME>(acc, T::widen(v), a.op);
        }
        if (divide)
            acc = T::div(acc, a.nranks);
        if (st == MACO_OK)
            ((B *)dst)[e] = T::narrow(acc);
    }
    return st;
}

/* Reads LL16 packets (waiting) from `src` and stores them with the same flag at `dst`. */
static __device__ maco_status_t maco__plan_forward_packets(const maco__pexec_args_t &a,
                                                           maco_ll16_packet_t *dst,
                                                           const maco_ll16_packet_t *src,
                                                           uint64_t bytes, uint32_t flag)
{
    for (uint64_t i = threadIdx.x; i < (bytes + 7) / 8; i += blockDim.x) {
        uint2 d;
        maco_status_t st = maco_ll16_load(src + i, flag, &d, &a.bound, -1, (int)(i & 0x7fffffff));
        if (st != MACO_OK)
            return st;
        maco_ll16_store(dst + i, d, flag);
    }
    return MACO_OK;
}

/* An operation on a port channel (docs/plan-format.md): the CTA copies the sources that live
 * in the plan buffer to their mirrors in the host buffer and fences them; thread 0 pushes a put
 * per non-empty chunk, then the signal and the flush the op asks for, and waits for them. */
static __device__ maco_status_t maco__plan_port_op(const maco__pexec_args_t &a,
                                                   const maco__pexec_op_t &op)
{
    __shared__ int st_shared;
    const maco_port_channel_device_t *ch = &a.ports[op.channel];
    const maco__plan_ref_t *srcs = a.refs + op.src_first;
    const int code = op.code;
    const bool put = code == MACO__POP_PUT || code == MACO__POP_PUT_WITH_SIGNAL ||
                     code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH;
    const bool signal = code == MACO__POP_SIGNAL || code == MACO__POP_PUT_WITH_SIGNAL ||
                        code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH;
    const bool flush = code == MACO__POP_FLUSH || code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH;
    if (code == MACO__POP_WAIT) {
        if (threadIdx.x == 0)
            st_shared = (int)maco_port_channel_wait(ch);
        __syncthreads();
        return (maco_status_t)st_shared;
    }
    if (put)
        for (uint32_t j = 0; j < op.dst.count; j++) {
            int part = (int)(((uint32_t)op.part0 + j) % (uint32_t)a.parts);
            uint64_t bytes = maco__part_elems(a, part) * a.esz;
            uint64_t soff = maco__chunk_off(a, srcs[0].buffer, srcs[0].index + j);
            if (!maco__chunk_in_host(a, a.rank, srcs[0].buffer, srcs[0].index + j))
                maco_copy(a.host + soff, a.buf + soff, bytes, threadIdx.x, blockDim.x);
        }
    /* Each thread's writes (the mirrors, and for a signal whatever the CTA wrote) are made
     * visible to the proxy's CPU and the peers before thread 0 pushes (as hier.cuh). */
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        maco_status_t st = MACO_OK;
        for (uint32_t j = 0; put && j < op.dst.count && st == MACO_OK; j++) {
            int part = (int)(((uint32_t)op.part0 + j) % (uint32_t)a.parts);
            uint64_t bytes = maco__part_elems(a, part) * a.esz;
            if (bytes > 0)
                st = maco_port_channel_put(ch, maco__chunk_off(a, op.dst.buffer, op.dst.index + j),
                                           maco__chunk_off(a, srcs[0].buffer, srcs[0].index + j),
                                           bytes);
        }
        if (signal && st == MACO_OK)
            st = maco_port_channel_signal(ch);
        if (flush && st == MACO_OK)
            st = maco_port_channel_flush(ch);
        st_shared = (int)st;
    }
    __syncthreads();
    return (maco_status_t)st_shared;
}

/* The address of chunk (buffer, index) at byte offset `off` of this rank (channel < 0) or of
 * the memory channel's peer. Plans with port channels (Port): where the chunk lives
 * (maco__chunk_ptr; *sys_p = 1 in host memory). Others: the plan buffers, *sys_p = 0. */
template <int Port>
static __device__ __forceinline__ char *maco__chunk_at(const maco__pexec_args_t &a, int channel,
                                                       int buffer, uint32_t index, uint64_t off,
                                                       int *sys_p)
{
    if (Port)
        return maco__chunk_ptr(a, channel, buffer, index, off, sys_p);
    *sys_p = 0;
    return (channel < 0 ? a.buf : a.chans[channel].remote) + off;
}

template <class T, int Port>
static __device__ maco_status_t maco__plan_op(const maco__pexec_args_t &a,
                                              const maco__pexec_op_t &op, uint32_t flag)
{
    __shared__ int st_shared;
    if (Port && op.port)
        return maco__plan_port_op(a, op);
    const maco_memory_channel_device_t *ch = op.channel >= 0 ? &a.chans[op.channel] : NULL;
    maco_status_t st = MACO_OK;
    switch (op.code) {
    case MACO__POP_SIGNAL:
        if (Port)
            __threadfence_system(); /* writes to host-resident chunks, for local peers */
        __syncthreads();
        if (threadIdx.x == 0)
            maco_memory_channel_signal(ch);
        return MACO_OK;
    case MACO__POP_WAIT:
        if (threadIdx.x == 0)
            st_shared = (int)maco_memory_channel_wait(ch);
        __syncthreads();
        return (maco_status_t)st_shared;
    default:
        break;
    }
    /* Data operations: every chunk at the address where it lives (maco__chunk_at); LL packets
     * always in the plan buffer (put_packets writes them there, on the peer, and their readers
     * read them there, also where a port put writes the same chunk at another time; a
     * put_packets source that a port put writes is refused at load: plan_exec.c). */
    const maco__plan_ref_t *srcs = a.refs + op.src_first;
    for (uint32_t j = 0; j < op.dst.count && st == MACO_OK; j++) {
        int part = (int)(((uint32_t)op.part0 + j) % (uint32_t)a.parts);
        uint64_t elems = maco__part_elems(a, part), bytes = elems * a.esz;
        uint32_t di = op.dst.index + j, si = srcs[0].index + j;
        uint64_t doff = maco__chunk_off(a, op.dst.buffer, di);
        uint64_t soff = maco__chunk_off(a, srcs[0].buffer, si);
        int dsys, ssys;
        switch (op.code) {
        case MACO__POP_PUT:
        case MACO__POP_GET: {
            int put = op.code == MACO__POP_PUT;
            char *d =
                maco__chunk_at<Port>(a, put ? op.channel : -1, op.dst.buffer, di, doff, &dsys);
            const char *src =
                maco__chunk_at<Port>(a, put ? -1 : op.channel, srcs[0].buffer, si, soff, &ssys);
            maco__plan_copy(d, src, bytes, ssys);
            break;
        }
        case MACO__POP_PUT_PACKETS:
            maco_memory_channel_put_packets_ll16(ch, doff, soff, bytes, threadIdx.x, blockDim.x,
                                                 flag);
            break;
        case MACO__POP_READ_PUT_PACKETS:
            st =
                maco__plan_forward_packets(a, (maco_ll16_packet_t *)(ch->remote + doff),
                                           (const maco_ll16_packet_t *)(a.buf + soff), bytes, flag);
            break;
        case MACO__POP_COPY:
            if (!srcs[0].packets) {
                char *d = maco__chunk_at<Port>(a, -1, op.dst.buffer, di, doff, &dsys);
                const char *src = maco__chunk_at<Port>(a, -1, srcs[0].buffer, si, soff, &ssys);
                maco__plan_copy(d, src, bytes, ssys);
                break;
            }
            /* fall through: unpacking packets is a reduce of one source */
        case MACO__POP_REDUCE: {
            const char *src[MACO__PLAN_MAX_SRCS];
            uint8_t pk[MACO__PLAN_MAX_SRCS];
            for (int k = 0; k < op.nsrcs; k++) {
                uint64_t off = maco__chunk_off(a, srcs[k].buffer, srcs[k].index + j);
                if (srcs[k].packets) { /* packets land in the plan buffer only */
                    src[k] = a.buf + off;
                    pk[k] = 1;
                    continue;
                }
                int sys;
                src[k] = maco__chunk_at<Port>(a, srcs[k].channel, srcs[k].buffer, srcs[k].index + j,
                                              off, &sys);
                pk[k] = sys ? 2 : 0;
            }
            int divide = a.avg && op.code == MACO__POP_REDUCE && op.dst.buffer == MACO__PBUF_OUTPUT;
            char *d = maco__chunk_at<Port>(a, -1, op.dst.buffer, di, doff, &dsys);
            st = maco__plan_reduce<T, Port>(a, d, src, pk, op.nsrcs, elems, flag, divide);
            break;
        }
        default:
            break;
        }
    }
    /* Combine the threads' statuses (packet waits may fail on some threads only). */
    int failed = __syncthreads_or(st != MACO_OK);
    if (failed && st == MACO_OK)
        st = MACO_ERR_REMOTE;
    return st;
}

template <class T, int Port>
__global__ void __launch_bounds__(256) maco__plan_kernel(maco__pexec_args_t a)
{
    const uint32_t flag = *(volatile uint32_t *)(a.buf + MACO__PLAN_CTR_EPOCH);
    const uint32_t gtid = blockIdx.x * blockDim.x + threadIdx.x, gn = gridDim.x * blockDim.x;
    maco_copy(a.buf + a.in_off, a.send, a.send_bytes, gtid, gn);
    if (maco__plan_grid_barrier<Port>(a) != MACO_OK)
        return;
    if (blockIdx.x == 0 && maco__plan_peer_barrier<Port>(a) != MACO_OK)
        return;
    if (maco__plan_grid_barrier<Port>(a) != MACO_OK)
        return;
    for (int i = a.tb_first[blockIdx.x]; i < a.tb_first[blockIdx.x + 1]; i++) {
        maco__pexec_op_t op = a.ops[i];
        if (maco__plan_op<T, Port>(a, op, flag) != MACO_OK)
            return;
        __syncthreads();
    }
    if (maco__plan_grid_barrier<Port>(a) != MACO_OK)
        return;
    if (blockIdx.x == 0 && maco__plan_peer_barrier<Port>(a) != MACO_OK)
        return;
    if (maco__plan_grid_barrier<Port>(a) != MACO_OK)
        return;
    if (!Port) {
        maco_copy(a.recv, a.buf + a.out_off, a.recv_bytes, gtid, gn);
    } else {
        /* Chunk by chunk, each from where it lives; CTA b takes chunks b, b + grid, ... */
        for (uint32_t i = blockIdx.x; i < a.res_scr - a.res_out; i += gridDim.x) {
            uint64_t off = maco__chunk_off(a, MACO__PBUF_OUTPUT, i);
            uint64_t bytes = maco__part_elems(a, (int)(i % (uint32_t)a.parts)) * a.esz;
            int sys;
            const char *src = maco__chunk_ptr(a, -1, MACO__PBUF_OUTPUT, i, off, &sys);
            maco__plan_copy((char *)a.recv + (off - a.out_off), src, bytes, sys);
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *(volatile uint32_t *)(a.buf + MACO__PLAN_CTR_EPOCH) = flag + 1 == 0 ? 1 : flag + 1;
}

/* One element type's launch: the kernel with or without the channels' info. */
template <class T>
static cudaError_t maco__plan_launch_t(const maco__pexec_args_t *args, int blocks, int threads,
                                       cudaStream_t stream)
{
    if (args->cinfo == NULL)
        maco__plan_kernel<T, 0><<<blocks, threads, 0, stream>>>(*args);
    else
        maco__plan_kernel<T, 1><<<blocks, threads, 0, stream>>>(*args);
    return cudaGetLastError();
}

/* One element type's kernels loaded (both variants). */
template <class T> static cudaError_t maco__plan_preload_t(cudaError_t e)
{
    cudaFuncAttributes fa;
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&fa, maco__plan_kernel<T, 0>);
    if (e == cudaSuccess)
        e = cudaFuncGetAttributes(&fa, maco__plan_kernel<T, 1>);
    return e;
}

extern "C" cudaError_t maco__launch_plan(const maco__pexec_args_t *args, int datatype, int blocks,
                                         int threads, cudaStream_t stream)
{
    switch (datatype) {
    case MACO_INT8:
        return maco__plan_launch_t<maco__t_i8>(args, blocks, threads, stream);
    case MACO_UINT8:
        return maco__plan_launch_t<maco__t_u8>(args, blocks, threads, stream);
    case MACO_INT32:
        return maco__plan_launch_t<maco__t_i32>(args, blocks, threads, stream);
    case MACO_UINT32:
        return maco__plan_launch_t<maco__t_u32>(args, blocks, threads, stream);
    case MACO_INT64:
        return maco__plan_launch_t<maco__t_i64>(args, blocks, threads, stream);
    case MACO_UINT64:
        return maco__plan_launch_t<maco__t_u64>(args, blocks, threads, stream);
    case MACO_FLOAT16:
        return maco__plan_launch_t<maco__t_f16>(args, blocks, threads, stream);
    case MACO_BFLOAT16:
        return maco__plan_launch_t<maco__t_bf16>(args, blocks, threads, stream);
    case MACO_FLOAT32:
        return maco__plan_launch_t<maco__t_f32>(args, blocks, threads, stream);
    case MACO_FLOAT64:
        return maco__plan_launch_t<maco__t_f64>(args, blocks, threads, stream);
    case MACO_FP8_E4M3:
        return maco__plan_launch_t<maco__t_e4m3>(args, blocks, threads, stream);
    case MACO_FP8_E5M2:
        return maco__plan_launch_t<maco__t_e5m2>(args, blocks, threads, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t maco__preload_plan(void)
{
    cudaError_t e = cudaSuccess;
    e = maco__plan_preload_t<maco__t_i8>(e);
    e = maco__plan_preload_t<maco__t_u8>(e);
    e = maco__plan_preload_t<maco__t_i32>(e);
    e = maco__plan_preload_t<maco__t_u32>(e);
    e = maco__plan_preload_t<maco__t_i64>(e);
    e = maco__plan_preload_t<maco__t_u64>(e);
    e = maco__plan_preload_t<maco__t_f16>(e);
    e = maco__plan_preload_t<maco__t_bf16>(e);
    e = maco__plan_preload_t<maco__t_f32>(e);
    e = maco__plan_preload_t<maco__t_f64>(e);
    e = maco__plan_preload_t<maco__t_e4m3>(e);
    e = maco__plan_preload_t<maco__t_e5m2>(e);
    return e;
}
