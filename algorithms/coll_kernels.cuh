/*
 * coll_kernels.cuh - the collectives' two kernel families, templated on element type and
 * op; coll_kernels_<type>.cu instantiate them, one type per file so builds run in parallel.
 *
 * LL (one launch, no semaphores; small messages). Every rank writes, for every peer q, its
 * message to q as LL16 packets into its own slot of q's scratch, then reads the packets
 * of every peer from its own scratch:
 *   allreduce       message = whole input; reduce all slots with my input -> output
 *   reduce_scatter  message to q = input block q; reduce slot q's with my block r
 *   allgather       message = input; slot q -> output block q, my input -> block r
 *   broadcast       root's message = input; others' -> output
 *   reduce          message to root = input; the root reduces like allreduce
 * A rank with no message for a peer (broadcast, reduce) sends one dummy packet, and a rank
 * reads a packet from every peer. That makes every launch all-to-all, which is what keeps
 * the two scratch halves safe: the packet flag comes from a device counter (ll_flag) the
 * last CTA advances, so graph replays get fresh flags, and the half used is the flag's
 * parity. A rank can only start launch k+2 (reusing launch k's half) after it read every
 * peer's launch-(k+1) packets, which each peer wrote after finishing launch k, i.e. after
 * reading this rank's launch-k packets: a half is never overwritten while it is read.
 *
 * MESH (pipelined through scratch with semaphores; large messages). CTA b works on
 * segments b, b+G, ... with its own scratch slot [IN n | OUT n pieces] and its own
 * semaphore per peer. A segment has one piece per "owner": allreduce n (rank j owns piece
 * j), broadcast and reduce n-1 (the ranks after the root; the root owns none, so its links
 * carry each byte once), allgather and reduce-scatter one piece of each rank's block.
 *   X  allreduce, reduce: piece j -> owner j's IN[me]; broadcast: the root sends piece j
 *      to owner j's IN[root]; reduce_scatter: my block p's piece -> rank p's IN[me];
 *      allgather: my piece -> every peer's OUT[me] (my own straight to my output);
 *   barrier (signal every peer, wait for every peer);
 *   Y  allreduce: owner reduces IN[0..n) in rank order -> every rank's OUT[me]; reduce:
 *      owner reduces -> the root's OUT[me]; broadcast: owner copies IN[root] -> every
 *      non-root's OUT[me]; reduce_scatter: reduce IN[0..n) -> output; allgather: OUT[q]
 *      -> output;
 *   barrier;
 *   Z  allreduce everywhere, reduce on the root, broadcast off the root: every owner's
 *      OUT piece -> output.
 *   Slot reuse without double buffering: X of segment k+1 writes a peer's IN (or, for
 *   allgather, OUT) only after barrier 2 of segment k, which the peer signals after its Y,
 *   the last read of those; Y of k+1 writes a peer's OUT only after barrier 1 of k+1,
 *   which the peer signals after its Z of k.
 */
#ifndef MACO_COLL_KERNELS_CUH
#define MACO_COLL_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "algorithms.h"
#include "maco/device/copy.h"
#include "maco/device/memory_channel.h"
#include "maco/device/packet.h"
#include "reduce.cuh"

#define MACO__MAXR MACO__MAX_LOCAL_RANKS

/* `valid` (1..W) bytes at p as a W-byte word (maco__vec); the rest read as zero. */
template <int W, class V>
static __device__ __forceinline__ V maco__load_part(const char *p, uint32_t valid)
{
    if (valid == (uint32_t)W && ((uintptr_t)p % W) == 0)
        return *(const V *)p;
    V v;
#pragma unroll
    for (int k = 0; k < W / 4; k++)
        v.w[k] = 0u;
    for (uint32_t k = 0; k < valid; k++)
        v.w[k / 4] |= (uint32_t)(uint8_t)p[k] << (8 * (k % 4));
    return v;
}

/* Stores the first `valid` (1..W) bytes of a W-byte word at p. */
template <int W, class V>
static __device__ __forceinline__ void maco__store_part(char *p, const V &v, uint32_t valid)
{
    if (valid == (uint32_t)W && ((uintptr_t)p % W) == 0) {
        *(V *)p = v;
        return;
    }
    for (uint32_t k = 0; k < valid; k++)
        p[k] = (char)(v.w[k / 4] >> (8 * (k % 4)));
}

/* ------------------------------------------------------------------ LL */

template <class T, int Op>
__global__ void __launch_bounds__(512) maco__ll_kernel(maco__coll_args_t a)
{
    typedef maco__vec<8, typename T::bits> V;
    const uint32_t flag = *(volatile uint32_t *)a.ll_flag;
    const uint64_t parity = flag & 1u;
    const int n = a.nranks, r = a.rank, root = a.root, coll = a.coll;
    const uint64_t bytes = a.count * (uint64_t)a.esz; /* one message */
    const uint64_t npkt = (bytes + 7) / 8;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t nthr = (uint64_t)gridDim.x * blockDim.x;
    const char *in = (const char *)a.input;
    char *out = (char *)a.output;
    const uint64_t half = a.ll_offset + parity * (uint64_t)n * a.ll_slot_bytes;
    /* A local copy: taking a kernel parameter's address would copy all of `a` to local
     * memory in every thread. */
    const maco_device_wait_bound_t bound = a.bound;
    const bool reducing = coll == MACO_COLL_ALLREDUCE || coll == MACO_COLL_REDUCE_SCATTER ||
                          (coll == MACO_COLL_REDUCE && r == root);

    /* 1. My message to every peer, or one dummy packet. */
    const bool rs = coll == MACO_COLL_REDUCE_SCATTER;
    const bool to_all = coll == MACO_COLL_ALLREDUCE || rs || coll == MACO_COLL_ALLGATHER ||
                        (coll == MACO_COLL_BROADCAST && r == root);
    const bool to_root = coll == MACO_COLL_REDUCE && r != root;
#define MACO__LL_DST(q)                                                                            \
    ((maco_ll16_packet_t *)(a.peer_buf[q] + half + (uint64_t)r * a.ll_slot_bytes))
    if (!to_all && tid == 0) {
        for (int q = 0; q < n; q++)
            if (q != r && !(to_root && q == root))
                maco_ll16_store(MACO__LL_DST(q), make_uint2(0u, 0u), flag);
    }
    if (to_root || to_all) {
        for (uint64_t i = tid; i < npkt; i += nthr) {
            uint64_t left = bytes - 8 * i;
            uint32_t valid = left < 8 ? (uint32_t)left : 8u;
            if (to_root) {
                V v = maco__load_part<8, V>(in + 8 * i, valid);
                maco_ll16_store(MACO__LL_DST(root) + i, make_uint2(v.w[0], v.w[1]), flag);
                continue;
            }
            V v;
            if (!rs)
                v = maco__load_part<8, V>(in + 8 * i, valid);
#pragma unroll 1
            for (int k = 1; k < n; k++) {
                const int q = (r + k) % n;
                if (rs)
                    v = maco__load_part<8, V>(in + (uint64_t)q * bytes + 8 * i, valid);
                maco_ll16_store(MACO__LL_DST(q) + i, make_uint2(v.w[0], v.w[1]), flag);
            }
        }
    }
#undef MACO__LL_DST

    /* 2. Every peer's packets from my scratch. */
    bool failed = false;
    if (reducing) {
        const char *mine = in + (coll == MACO_COLL_REDUCE_SCATTER ? (uint64_t)r * bytes : 0);
        for (uint64_t i = tid; i < npkt && !failed; i += nthr) {
            uint64_t left = bytes - 8 * i;
            uint32_t valid = left < 8 ? (uint32_t)left : 8u;
            V v[MACO__MAXR];
#pragma unroll
            for (int q = 0; q < MACO__MAXR; q++) {
                v[q].w[0] = v[q].w[1] = 0u;
                if (q >= n)
                    continue;
                if (q == r) {
                    v[q] = maco__load_part<8, V>(mine + 8 * i, valid);
                } else if (!failed) {
                    const maco_ll16_packet_t *pk =
                        (const maco_ll16_packet_t *)(a.buf + half + (uint64_t)q * a.ll_slot_bytes) +
                        i;
                    uint2 d;
                    if (maco_ll16_load(pk, flag, &d, &bound, q, (int)(i & 0x7fffffff)) != MACO_OK)
                        failed = true;
                    v[q].w[0] = d.x;
                    v[q].w[1] = d.y;
                }
            }
            if (failed)
                break;
            V res;
            maco__reduce_vec<T, Op, 8>(&res, v, n, a.avg != 0);
            maco__store_part<8, V>(out + 8 * i, res, valid);
        }
    } else {
        /* Copying: allgather from every peer, broadcast from the root; the others send one
         * dummy packet each, read by thread 0. */
        for (int q = 0; q < n && !failed; q++) {
            if (q == r)
                continue;
            bool data = coll == MACO_COLL_ALLGATHER || (coll == MACO_COLL_BROADCAST && q == root);
            const maco_ll16_packet_t *src =
                (const maco_ll16_packet_t *)(a.buf + half + (uint64_t)q * a.ll_slot_bytes);
            uint64_t np = data ? npkt : (tid == 0 ? 1 : 0);
            char *dst = out + (coll == MACO_COLL_ALLGATHER ? (uint64_t)q * bytes : 0);
            for (uint64_t i = tid; i < np; i += nthr) {
                uint2 d;
                if (maco_ll16_load(src + i, flag, &d, &bound, q, (int)(i & 0x7fffffff)) !=
                    MACO_OK) {
                    failed = true;
                    break;
                }
                if (!data)
                    continue;
                uint64_t left = bytes - 8 * i;
                V v;
                v.w[0] = d.x;
                v.w[1] = d.y;
                maco__store_part<8, V>(dst + 8 * i, v, left < 8 ? (uint32_t)left : 8u);
            }
        }
        /* My own block (allgather) or the root's data (broadcast), unless in place. */
        char *own = out + (coll == MACO_COLL_ALLGATHER ? (uint64_t)r * bytes : 0);
        bool copy_own = coll == MACO_COLL_ALLGATHER || (coll == MACO_COLL_BROADCAST && r == root);
        if (copy_own && !failed && own != in)
            maco_copy(own, in, bytes, (uint32_t)tid, (uint32_t)nthr);
    }

    /* 3. The last CTA to finish advances the flag for the next launch (the kernel's end
     * orders the store before the next launch). A single CTA needs no counter. */
    __syncthreads();
    if (threadIdx.x == 0 && gridDim.x == 1) {
        *(volatile uint32_t *)a.ll_flag = flag + 1u;
    } else if (threadIdx.x == 0) {
        __threadfence();
        unsigned prev = atomicAdd(a.ll_done, 1u);
        if (prev == gridDim.x - 1) {
            *(volatile uint32_t *)a.ll_done = 0u;
            *(volatile uint32_t *)a.ll_flag = flag + 1u;
            __threadfence();
        }
    }
}

/* ------------------------------------------------------------------ MESH */

/* Signals every peer and waits for every peer (threads 0..n-1 of the CTA, one per peer).
 * Returns true, in every thread, when a wait failed. */
static __device__ __forceinline__ bool maco__mesh_barrier(maco_memory_channel_device_t *ch,
                                                          bool waiter)
{
    __syncthreads();
    if (waiter)
        maco_memory_channel_signal(&ch[threadIdx.x]);
    int bad = waiter ? maco_memory_channel_wait(&ch[threadIdx.x]) != MACO_OK : 0;
    return __syncthreads_or(bad) != 0;
}

/* Reduces `len` bytes of IN[0..n) (16-byte aligned scratch) in rank order and stores the
 * result at dst[0..ndst) (dst[k] + len bytes each; any alignment). Whole 16-byte words
 * are reduced (the scratch beyond len holds stale bytes whose results are not stored
 * unless the destination is scratch too, `dst_scratch`). */
template <class T, int Op>
static __device__ __forceinline__ void maco__mesh_reduce(const char *in_base, uint64_t pmax, int n,
                                                         bool avg, char *const *dst, int ndst,
                                                         bool dst_scratch, uint64_t len)
{
    typedef maco__vec<16, typename T::bits> V;
    const uint64_t nvec = (len + 15) / 16;
    for (uint64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        V x[MACO__MAXR];
#pragma unroll
        for (int q = 0; q < MACO__MAXR; q++) {
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if (q < n)
                u = ((const uint4 *)(in_base + (uint64_t)q * pmax))[v];
            x[q].w[0] = u.x;
            x[q].w[1] = u.y;
            x[q].w[2] = u.z;
            x[q].w[3] = u.w;
        }
        V res;
        maco__reduce_vec<T, Op, 16>(&res, x, n, avg);
        uint64_t left = len - 16 * v;
        uint32_t valid = dst_scratch || left >= 16 ? 16u : (uint32_t)left;
#pragma unroll
        for (int p = 0; p < MACO__MAXR; p++)
            if (p < ndst)
                maco__store_part<16, V>(dst[p] + 16 * v, res, valid);
    }
}

template <class T, int Op>
__global__ void __launch_bounds__(512) maco__mesh_kernel(maco__coll_args_t a)
{
    __shared__ maco_memory_channel_device_t ch[MACO__MAXR];
    const int n = a.nranks, r = a.rank, root = a.root, coll = a.coll;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    if (tid < (uint32_t)n && tid != (uint32_t)r)
        ch[tid] = a.channels[(uint64_t)blockIdx.x * (uint64_t)n + tid];
    __syncthreads();

    const uint64_t esz = a.esz;
    const uint64_t P = a.piece_elems;
    const uint64_t C = a.count;
    const bool rooted = coll == MACO_COLL_BROADCAST || coll == MACO_COLL_REDUCE;
    /* Pieces per segment: allreduce n (owner j = rank j), broadcast and reduce n-1 (owner
     * j = rank root+1+j), allgather and reduce-scatter one per rank block. */
    const int m = coll == MACO_COLL_ALLREDUCE ? n : (rooted ? n - 1 : 1);
    const uint64_t seg_elems = P * (uint64_t)m;
    const uint64_t nseg = (C + seg_elems - 1) / seg_elems;
    const uint64_t pmax = a.rsag_piece_max;
    const uint64_t slot = a.rsag_offset + (uint64_t)blockIdx.x * a.rsag_slot_bytes;
    const char *in = (const char *)a.input;
    char *out = (char *)a.output;
    char *local = a.buf;
    const bool waiter = tid < (uint32_t)n && tid != (uint32_t)r;
    const bool avg = a.avg != 0;
#define MACO__IN(rank, q) (a.peer_buf[rank] + slot + (uint64_t)(q)*pmax)
#define MACO__OUT(rank, q) (a.peer_buf[rank] + slot + ((uint64_t)n + (uint64_t)(q)) * pmax)
/* Piece index of owner rank q (allreduce: q; broadcast, reduce: position after the root). */
#define MACO__PIECE(q) (rooted ? ((q)-root - 1 + n) % n : (q))

    for (uint64_t seg = blockIdx.x; seg < nseg; seg += gridDim.x) {
        const uint64_t seg0 = seg * seg_elems;
        /* Elements of piece j of this segment. */
#define MACO__PLEN(j)                                                                              \
    (seg0 + (uint64_t)(j)*P < C ? min(P, C - seg0 - (uint64_t)(j)*P) : (uint64_t)0)
        const uint64_t plen = MACO__PLEN(0); /* allgather, reduce_scatter */

        /* X. Rotating the first peer per CTA spreads the traffic over every NVLink. */
        for (int k = 0; k < n; k++) {
            const int p = (int)((blockIdx.x + (unsigned)r + (unsigned)k) % (unsigned)n);
            const int j = MACO__PIECE(p);
            if (coll == MACO_COLL_ALLREDUCE || (coll == MACO_COLL_REDUCE && p != root) ||
                (coll == MACO_COLL_BROADCAST && r == root && p != root)) {
                maco_copy(MACO__IN(p, r), in + (seg0 + (uint64_t)j * P) * esz, MACO__PLEN(j) * esz,
                          tid, nthr);
            } else if (coll == MACO_COLL_REDUCE_SCATTER) {
                maco_copy(MACO__IN(p, r), in + ((uint64_t)p * C + seg0) * esz, plen * esz, tid,
                          nthr);
            } else if (coll == MACO_COLL_ALLGATHER) {
                /* My own piece goes straight to my output. */
                char *own = out + ((uint64_t)r * C + seg0) * esz;
                if (p != r)
                    maco_copy(MACO__OUT(p, r), in + seg0 * esz, plen * esz, tid, nthr);
                else if (own != in + seg0 * esz)
                    maco_copy(own, in + seg0 * esz, plen * esz, tid, nthr);
            } else if (coll == MACO_COLL_BROADCAST && r == root && p == root &&
                       out + seg0 * esz != in + seg0 * esz) {
                uint64_t len = seg0 < C ? min(seg_elems, C - seg0) : 0;
                maco_copy(out + seg0 * esz, in + seg0 * esz, len * esz, tid, nthr);
            }
        }
        if (maco__mesh_barrier(ch, waiter))
            return;

        /* Y. */
        const int my_j = MACO__PIECE(r);
        const uint64_t my_len = MACO__PLEN(my_j);
        if (coll == MACO_COLL_ALLREDUCE || (coll == MACO_COLL_REDUCE && r != root)) {
            char *dst[MACO__MAXR];
#pragma unroll
            for (int p = 0; p < MACO__MAXR; p++)
                dst[p] = p < n ? MACO__OUT(p, r) : nullptr;
            if (coll == MACO_COLL_REDUCE)
                dst[0] = MACO__OUT(root, r);
            maco__mesh_reduce<T, Op>(local + slot, pmax, n, avg, dst,
                                     coll == MACO_COLL_REDUCE ? 1 : n, true, my_len * esz);
        } else if (coll == MACO_COLL_BROADCAST && r != root) {
            for (int k = 0; k < n; k++) {
                const int q = (int)((blockIdx.x + (unsigned)r + (unsigned)k) % (unsigned)n);
                if (q != root)
                    maco_copy(MACO__OUT(q, r), local + slot + (uint64_t)root * pmax, my_len * esz,
                              tid, nthr);
            }
        } else if (coll == MACO_COLL_REDUCE_SCATTER) {
            char *dst[1] = { out + seg0 * esz };
            maco__mesh_reduce<T, Op>(local + slot, pmax, n, avg, dst, 1, false, plen * esz);
        } else if (coll == MACO_COLL_ALLGATHER) {
            for (int q = 0; q < n; q++)
                if (q != r)
                    maco_copy(out + ((uint64_t)q * C + seg0) * esz, local + slot + (n + q) * pmax,
                              plen * esz, tid, nthr);
        }
        if (maco__mesh_barrier(ch, waiter))
            return;

        /* Z. Every owner's piece to my output: allreduce everywhere, reduce on the root,
         * broadcast off the root. */
        if (coll == MACO_COLL_ALLREDUCE || (coll == MACO_COLL_REDUCE && r == root) ||
            (coll == MACO_COLL_BROADCAST && r != root)) {
            for (int q = 0; q < n; q++) {
                if (rooted && q == root)
                    continue;
                const int j = MACO__PIECE(q);
                maco_copy(out + (seg0 + (uint64_t)j * P) * esz,
                          local + slot + ((uint64_t)n + (uint64_t)q) * pmax, MACO__PLEN(j) * esz,
                          tid, nthr);
            }
            __syncthreads();
        }
#undef MACO__PLEN
    }
#undef MACO__IN
#undef MACO__OUT
#undef MACO__PIECE
}

/* ------------------------------------------------------------------ instantiation */

template <class T, int Op>
static cudaError_t maco__launch_one(const maco__coll_args_t *args, int kernel, int blocks,
                                    int threads, cudaStream_t stream)
{
    if (kernel == MACO__KERNEL_LL)
        maco__ll_kernel<T, Op><<<blocks, threads, 0, stream>>>(*args);
    else
        maco__mesh_kernel<T, Op><<<blocks, threads, 0, stream>>>(*args);
    return cudaGetLastError();
}

/* Defines maco__launch_coll_<name> for type trait T (algorithms.h). */
#define MACO__DEFINE_LAUNCHER(name, T)                                                             \
    extern "C" cudaError_t maco__launch_coll_##name(const maco__coll_args_t *args, int kernel,     \
                                                    int op, int blocks, int threads,               \
                                                    cudaStream_t stream)                           \
    {                                                                                              \
        switch (op) {                                                                              \
        case MACO_PROD:                                                                            \
            return maco__launch_one<T, MACO__OP_PROD>(args, kernel, blocks, threads, stream);      \
        case MACO_MIN:                                                                             \
            return maco__launch_one<T, MACO__OP_MIN>(args, kernel, blocks, threads, stream);       \
        case MACO_MAX:                                                                             \
            return maco__launch_one<T, MACO__OP_MAX>(args, kernel, blocks, threads, stream);       \
        default: /* sum, avg */                                                                    \
            return maco__launch_one<T, MACO__OP_SUM>(args, kernel, blocks, threads, stream);       \
        }                                                                                          \
    }

#endif /* MACO_COLL_KERNELS_CUH */
