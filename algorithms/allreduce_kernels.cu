/*
 * allreduce_kernels.cu - the allreduce algorithms' kernels.
 *
 * oneshot_ll: every rank writes its whole input as LL16 packets into its own slot of every
 *   peer's scratch, then reads all peers' packets from its own scratch and reduces them
 *   with its input in rank order. One launch, no semaphores. The packet flag comes from a
 *   device counter (ll_flag) that the last CTA to finish advances, so graph replays get
 *   fresh flags; the scratch half used is the flag's parity. A rank can only start launch
 *   k+2 (reusing launch k's half) after it read every peer's launch-(k+1) packets, which
 *   each peer wrote after finishing launch k, i.e. after reading this rank's launch-k
 *   packets: a half is never overwritten while it is being read.
 *
 * rsag: reduce-scatter + allgather through scratch, CTA b working on segments b, b+G, ...
 *   with its own scratch slot and its own semaphore per peer. Per segment of n pieces:
 *     1. push piece p of my input into rank p's IN[me]; signal every peer;
 *     2. wait for every peer; reduce IN[0..n) in rank order into my piece; push it into
 *        every rank's OUT[me]; signal every peer;
 *     3. wait for every peer; copy OUT[0..n) to my output.
 *   Slot reuse is safe without double buffering: I write peer p's IN[me] for segment k+1
 *   only after p's phase-2 signal for segment k (so p has finished reading IN), and p's
 *   OUT[me] only after p's phase-1 signal for k+1 (sent after p copied OUT out for k).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "algorithms.h"
#include "maco/device/memory_channel.h"
#include "maco/device/packet.h"
#include "reduce.cuh"

#define MAXR MACO__MAX_LOCAL_RANKS

/* 8 bytes from p, of which `valid` (1..8) are real; the rest read as zero. */
static __device__ __forceinline__ uint2 maco__load8(const char *p, uint32_t valid, bool aligned)
{
    if (valid == 8 && aligned)
        return *(const uint2 *)p;
    uint32_t w[2] = { 0u, 0u };
    for (uint32_t k = 0; k < valid; k++)
        w[k / 4] |= (uint32_t)(uint8_t)p[k] << (8 * (k % 4));
    return make_uint2(w[0], w[1]);
}

static __device__ __forceinline__ void maco__store8(char *p, uint2 v, uint32_t valid, bool aligned)
{
    if (valid == 8 && aligned) {
        *(uint2 *)p = v;
        return;
    }
    uint32_t w[2] = { v.x, v.y };
    for (uint32_t k = 0; k < valid; k++)
        p[k] = (char)(w[k / 4] >> (8 * (k % 4)));
}

template <class D>
__global__ void __launch_bounds__(512) maco__oneshot_ll_kernel(maco__allreduce_args_t a)
{
    const uint32_t flag = *(volatile uint32_t *)a.ll_flag;
    const uint64_t parity = flag & 1u;
    const int n = a.nranks, r = a.rank;
    const uint64_t bytes = a.count * (uint64_t)D::elem_bytes;
    const uint64_t npkt = (bytes + 7) / 8;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t nthr = (uint64_t)gridDim.x * blockDim.x;
    const char *in = (const char *)a.input;
    char *out = (char *)a.output;
    const bool in_aligned = ((uintptr_t)in & 7u) == 0;
    const bool out_aligned = ((uintptr_t)out & 7u) == 0;
    const uint64_t my_slot = a.ll_offset + (parity * (uint64_t)n + (uint64_t)r) * a.ll_slot_bytes;
    /* A local copy: taking a kernel parameter's address would copy all of `a` to local
     * memory in every thread. */
    const maco_device_wait_bound_t bound = a.bound;

    /* 1. My packets into my slot at every peer. */
    for (uint64_t i = tid; i < npkt; i += nthr) {
        uint64_t left = bytes - 8 * i;
        uint2 d = maco__load8(in + 8 * i, left < 8 ? (uint32_t)left : 8u, in_aligned);
#pragma unroll
        for (int q = 0; q < MAXR; q++) {
            if (q < n && q != r)
                maco_ll16_store((maco_ll16_packet_t *)(a.peer_buf[q] + my_slot) + i, d, flag);
        }
    }

    /* 2. Everyone's packets from my scratch, reduced in rank order. */
    bool failed = false;
    for (uint64_t i = tid; i < npkt && !failed; i += nthr) {
        uint64_t left = bytes - 8 * i;
        uint32_t valid = left < 8 ? (uint32_t)left : 8u;
        uint32_t wx[MAXR], wy[MAXR];
#pragma unroll
        for (int q = 0; q < MAXR; q++) {
            uint2 v = make_uint2(0u, 0u);
            if (q < n) {
                if (q == r) {
                    v = maco__load8(in + 8 * i, valid, in_aligned);
                } else if (!failed) {
                    const maco_ll16_packet_t *pk =
                        (const maco_ll16_packet_t *)(a.buf + a.ll_offset +
                                                     (parity * (uint64_t)n + (uint64_t)q) *
                                                         a.ll_slot_bytes) +
                        i;
                    if (maco_ll16_load(pk, flag, &v, &bound, q, (int)(i & 0x7fffffff)) != MACO_OK)
                        failed = true;
                }
            }
            wx[q] = v.x;
            wy[q] = v.y;
        }
        if (failed)
            break;
        uint2 res = make_uint2(maco__sum_word<D>(wx, n), maco__sum_word<D>(wy, n));
        maco__store8(out + 8 * i, res, valid, out_aligned);
    }

    /* 3. The last CTA to finish advances the flag for the next launch. */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned prev = atomicAdd(a.ll_done, 1u);
        if (prev == gridDim.x - 1) {
            *(volatile uint32_t *)a.ll_done = 0u;
            *(volatile uint32_t *)a.ll_flag = flag + 1u;
            __threadfence();
        }
    }
}

template <class D>
__global__ void __launch_bounds__(512) maco__rsag_kernel(maco__allreduce_args_t a)
{
    __shared__ maco_memory_channel_device_t ch[MAXR];
    const int n = a.nranks, r = a.rank;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    if (tid < (uint32_t)n && tid != (uint32_t)r)
        ch[tid] = a.channels[(uint64_t)blockIdx.x * (uint64_t)n + tid];
    __syncthreads();

    const uint64_t esz = (uint64_t)D::elem_bytes;
    const uint64_t P = a.piece_elems;
    const uint64_t seg_elems = P * (uint64_t)n;
    const uint64_t nseg = (a.count + seg_elems - 1) / seg_elems;
    const uint64_t pmax = a.rsag_piece_max;
    const uint64_t slot = a.rsag_offset + (uint64_t)blockIdx.x * a.rsag_slot_bytes;
    const char *in = (const char *)a.input;
    char *out = (char *)a.output;
    char *local = a.buf;
    const bool waiter = tid < (uint32_t)n && tid != (uint32_t)r;

    for (uint64_t seg = blockIdx.x; seg < nseg; seg += gridDim.x) {
        const uint64_t seg0 = seg * seg_elems;

        /* 1. Piece p of my input into rank p's IN[r]. CTAs start at different peers so
         * that at any moment the traffic spreads over all NVLinks, not one peer's. */
        for (int k = 0; k < n; k++) {
            const int p = (int)((blockIdx.x + (unsigned)r + (unsigned)k) % (unsigned)n);
            uint64_t start = seg0 + (uint64_t)p * P;
            uint64_t len = start < a.count ? min(P, a.count - start) : 0;
            char *dst = a.peer_buf[p] + slot + (uint64_t)r * pmax;
            maco_copy(dst, in + start * esz, len * esz, tid, nthr);
        }
        __syncthreads();
        if (waiter)
            maco_memory_channel_signal(&ch[tid]);
        int bad = waiter ? maco_memory_channel_wait(&ch[tid]) != MACO_OK : 0;
        if (__syncthreads_or(bad))
            return;

        /* 2. Reduce my piece from IN[0..n) into every rank's OUT[r]. */
        {
            uint64_t start = seg0 + (uint64_t)r * P;
            uint64_t len = start < a.count ? min(P, a.count - start) : 0;
            uint64_t nvec = len * esz / 16;
            const char *src_base = local + slot;
            for (uint64_t v = tid; v < nvec; v += nthr) {
                uint32_t w[4][MAXR];
#pragma unroll
                for (int q = 0; q < MAXR; q++) {
                    uint4 x = make_uint4(0u, 0u, 0u, 0u);
                    if (q < n)
                        x = ((const uint4 *)(src_base + (uint64_t)q * pmax))[v];
                    w[0][q] = x.x;
                    w[1][q] = x.y;
                    w[2][q] = x.z;
                    w[3][q] = x.w;
                }
                uint4 res = make_uint4(maco__sum_word<D>(w[0], n), maco__sum_word<D>(w[1], n),
                                       maco__sum_word<D>(w[2], n), maco__sum_word<D>(w[3], n));
#pragma unroll
                for (int p = 0; p < MAXR; p++) {
                    if (p < n)
                        ((uint4 *)(a.peer_buf[p] + slot + ((uint64_t)n + (uint64_t)r) * pmax))[v] =
                            res;
                }
            }
            for (uint64_t e = nvec * 16 / esz + tid; e < len; e += nthr) {
                const char *srcs[MAXR];
#pragma unroll
                for (int q = 0; q < MAXR; q++)
                    srcs[q] = src_base + (uint64_t)(q < n ? q : 0) * pmax + e * esz;
                uint32_t bits = maco__sum_element<D>(srcs, n);
                for (int p = 0; p < n; p++) {
                    char *dst = a.peer_buf[p] + slot + ((uint64_t)n + (uint64_t)r) * pmax + e * esz;
                    if (D::elem_bytes == 4)
                        *(uint32_t *)dst = bits;
                    else
                        *(uint16_t *)dst = (uint16_t)bits;
                }
            }
        }
        __syncthreads();
        if (waiter)
            maco_memory_channel_signal(&ch[tid]);
        bad = waiter ? maco_memory_channel_wait(&ch[tid]) != MACO_OK : 0;
        if (__syncthreads_or(bad))
            return;

        /* 3. Everyone's reduced pieces to my output. */
        for (int q = 0; q < n; q++) {
            uint64_t start = seg0 + (uint64_t)q * P;
            uint64_t len = start < a.count ? min(P, a.count - start) : 0;
            maco_copy(out + start * esz, local + slot + ((uint64_t)n + (uint64_t)q) * pmax,
                      len * esz, tid, nthr);
        }
        __syncthreads();
    }
}

extern "C" cudaError_t maco__launch_allreduce_oneshot_ll(const maco__allreduce_args_t *args,
                                                         int blocks, int threads,
                                                         cudaStream_t stream)
{
    if (args->datatype == MACO_BFLOAT16)
        maco__oneshot_ll_kernel<maco__bf16><<<blocks, threads, 0, stream>>>(*args);
    else
        maco__oneshot_ll_kernel<maco__f32><<<blocks, threads, 0, stream>>>(*args);
    return cudaGetLastError();
}

extern "C" cudaError_t maco__launch_allreduce_rsag(const maco__allreduce_args_t *args, int blocks,
                                                   int threads, cudaStream_t stream)
{
    if (args->datatype == MACO_BFLOAT16)
        maco__rsag_kernel<maco__bf16><<<blocks, threads, 0, stream>>>(*args);
    else
        maco__rsag_kernel<maco__f32><<<blocks, threads, 0, stream>>>(*args);
    return cudaGetLastError();
}
