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

/* The last CTA to finish advances the packet flag for the next launch (the kernel's end
 * orders the store before the next launch). A single CTA needs no counter. */
static __device__ __forceinline__ void maco__flag_advance(uint32_t *ll_flag, uint32_t *ll_done,
                                                          uint32_t flag)
{
    __syncthreads();
    if (threadIdx.x == 0 && gridDim.x == 1) {
        *(volatile uint32_t *)ll_flag = flag + 1u;
    } else if (threadIdx.x == 0) {
        __threadfence();
        unsigned prev = atomicAdd(ll_done, 1u);
        if (prev == gridDim.x - 1) {
            *(volatile uint32_t *)ll_done = 0u;
            *(volatile uint32_t *)ll_flag = flag + 1u;
            __threadfence();
        }
    }
}

/* Word i (8 bytes, `valid` of them real) of every rank's message, reduced in rank order:
 * mine from `mine`, each peer q's from packet i of its slot in my scratch half (LL kernel,
 * and region A of the two-shot kernel). Returns false (*res unset) when a wait failed. */
template <class T, int Op>
static __device__ __forceinline__ bool
maco__ll_reduce_word(const maco__coll_args_t &a, uint64_t half, uint32_t flag,
                     const maco_device_wait_bound_t &bound, const char *mine, uint64_t i,
                     uint32_t valid, maco__vec<8, typename T::bits> *res)
{
    typedef maco__vec<8, typename T::bits> V;
    const int n = a.nranks, r = a.rank;
    V v[MACO__MAXR];
#pragma unroll
    for (int q = 0; q < MACO__MAXR; q++) {
        v[q].w[0] = v[q].w[1] = 0u;
        if (q >= n)
            continue;
        if (q == r) {
            v[q] = maco__load_part<8, V>(mine + 8 * i, valid);
            continue;
        }
        const maco_ll16_packet_t *pk =
            (const maco_ll16_packet_t *)(a.buf + half + (uint64_t)q * a.ll_slot_bytes) + i;
        uint2 d;
        if (maco_ll16_load(pk, flag, &d, &bound, q, (int)(i & 0x7fffffff)) != MACO_OK)
            return false;
        v[q].w[0] = d.x;
        v[q].w[1] = d.y;
    }
    maco__reduce_vec<T, Op, 8>(res, v, n, a.avg != 0, a.op);
    return true;
}

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
        for (uint64_t i = tid; i < npkt; i += nthr) {
            uint64_t left = bytes - 8 * i;
            uint32_t valid = left < 8 ? (uint32_t)left : 8u;
            V res;
            if (!maco__ll_reduce_word<T, Op>(a, half, flag, bound, mine, i, valid, &res)) {
                failed = true;
                break;
            }
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

    /* 3. */
    maco__flag_advance(a.ll_flag, a.ll_done, flag);
}

/*
 * Two-shot LL allreduce (one launch, medium messages). The buffer is cut into n blocks of
 * B elements (B * esz a multiple of 8 bytes; every block non-empty, checked by the host),
 * block q owned by rank q. Each LL slot of the scratch half holds two regions:
 *   1. every rank writes its block q, as LL16 packets, into region A of its slot at rank q;
 *   2. owner r reduces its block from its own input and region A of every peer's slot, in
 *      rank order, stores it to its output, and writes it as packets into region B of its
 *      slot at every peer;
 *   3. every rank copies block q from region B of q's slot to its output.
 * Packets carry the launch's flag, so no phase waits for more than the packets it reads;
 * every rank writes to and reads from every peer, which keeps the LL kernel's half-reuse
 * argument (top of this file).
 */
template <class T, int Op>
__global__ void __launch_bounds__(512) maco__ll2_kernel(maco__coll_args_t a)
{
    typedef maco__vec<8, typename T::bits> V;
    const uint32_t flag = *(volatile uint32_t *)a.ll_flag;
    const uint64_t parity = flag & 1u;
    const int n = a.nranks, r = a.rank;
    const uint64_t esz = a.esz, C = a.count;
    const uint64_t B = a.piece_elems; /* elements per block */
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t nthr = (uint64_t)gridDim.x * blockDim.x;
    const char *in = (const char *)a.input;
    char *out = (char *)a.output;
    const uint64_t half = a.ll_offset + parity * (uint64_t)n * a.ll_slot_bytes;
    const uint64_t region_b = (B * esz / 8) * sizeof(maco_ll16_packet_t); /* region A's size */
    const maco_device_wait_bound_t bound = a.bound;
#define MACO__BLOCK_BYTES(q) ((min(C, (uint64_t)((q) + 1) * B) - (uint64_t)(q)*B) * esz)
#define MACO__SLOT(rank, src) (a.peer_buf[rank] + half + (uint64_t)(src)*a.ll_slot_bytes)

    /* 1. My block q to rank q's region A. */
    for (int k = 1; k < n; k++) {
        const int q = (r + k) % n;
        const uint64_t bytes = MACO__BLOCK_BYTES(q), npkt = (bytes + 7) / 8;
        const char *src = in + (uint64_t)q * B * esz;
        maco_ll16_packet_t *dst = (maco_ll16_packet_t *)MACO__SLOT(q, r);
        for (uint64_t i = tid; i < npkt; i += nthr) {
            uint64_t left = bytes - 8 * i;
            V v = maco__load_part<8, V>(src + 8 * i, left < 8 ? (uint32_t)left : 8u);
            maco_ll16_store(dst + i, make_uint2(v.w[0], v.w[1]), flag);
        }
    }

    /* 2. Reduce my block, keep it, and send it to every peer's region B. */
    bool failed = false;
    {
        const uint64_t bytes = MACO__BLOCK_BYTES(r), npkt = (bytes + 7) / 8;
        const uint64_t off = (uint64_t)r * B * esz;
        for (uint64_t i = tid; i < npkt; i += nthr) {
            uint64_t left = bytes - 8 * i;
            uint32_t valid = left < 8 ? (uint32_t)left : 8u;
            V res;
            if (!maco__ll_reduce_word<T, Op>(a, half, flag, bound, in + off, i, valid, &res)) {
                failed = true;
                break;
            }
            maco__store_part<8, V>(out + off + 8 * i, res, valid);
            for (int k = 1; k < n; k++) {
                const int q = (r + k) % n;
                maco_ll16_store((maco_ll16_packet_t *)(MACO__SLOT(q, r) + region_b) + i,
                                make_uint2(res.w[0], res.w[1]), flag);
            }
        }
    }

    /* 3. Every peer's reduced block from my region B. */
    for (int k = 1; k < n && !failed; k++) {
        const int q = (r + k) % n;
        const uint64_t bytes = MACO__BLOCK_BYTES(q), npkt = (bytes + 7) / 8;
        const maco_ll16_packet_t *src =
            (const maco_ll16_packet_t *)(a.buf + half + (uint64_t)q * a.ll_slot_bytes + region_b);
        char *dst = out + (uint64_t)q * B * esz;
        for (uint64_t i = tid; i < npkt; i += nthr) {
            uint2 d;
            if (maco_ll16_load(src + i, flag, &d, &bound, q, (int)(i & 0x7fffffff)) != MACO_OK) {
                failed = true;
                break;
            }
            uint64_t left = bytes - 8 * i;
            V v;
            v.w[0] = d.x;
            v.w[1] = d.y;
            maco__store_part<8, V>(dst + 8 * i, v, left < 8 ? (uint32_t)left : 8u);
        }
    }
#undef MACO__BLOCK_BYTES
#undef MACO__SLOT
    maco__flag_advance(a.ll_flag, a.ll_done, flag);
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
                                                         bool avg, int rop, char *const *dst,
                                                         int ndst, bool dst_scratch, uint64_t len)
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
        maco__reduce_vec<T, Op, 16>(&res, x, n, avg, rop);
        uint64_t left = len - 16 * v;
        uint32_t valid = dst_scratch || left >= 16 ? 16u : (uint32_t)left;
#pragma unroll
        for (int p = 0; p < MACO__MAXR; p++)
            if (p < ndst)
                maco__store_part<16, V>(dst[p] + 16 * v, res, valid);
    }
}

/* The scratch path of the mesh kernel (the file comment's X / barrier / Y / barrier / Z). */
template <class T, int Op>
static __device__ __forceinline__ void maco__mesh_body(const maco__coll_args_t &a,
                                                       maco_memory_channel_device_t *ch)
{
    const int n = a.nranks, r = a.rank, root = a.root, coll = a.coll;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;

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
            maco__mesh_reduce<T, Op>(local + slot, pmax, n, avg, a.op, dst,
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
            maco__mesh_reduce<T, Op>(local + slot, pmax, n, avg, a.op, dst, 1, false, plen * esz);
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

/*
 * The in-place path of the mesh kernel: every rank's buffers are registered and mapped
 * here (ins[q], outs[q]: rank q's send and receive buffers, 16-byte aligned; NULL where
 * unused). The data is split into pieces as in the scratch path, and each owner computes its
 * piece straight from the peers' buffers into the peers' buffers, every CTA and thread of the
 * grid taking 16-byte words in turn:
 *   allreduce       owner j: reduce piece j of every input (rank order) -> every output
 *   reduce          owner j (non-root): reduce piece j of every input -> the root's output
 *   broadcast       owner j (non-root): piece j of the root's input -> every non-root output
 *   reduce_scatter  rank r: reduce block r of every input -> its output
 *   allgather       rank r: its input -> block r of every output
 * No rank writes a byte another rank reads, so in place needs no care. A peer's buffers are
 * ready and free once its descriptor arrived (its kernel started, so its earlier stream work
 * is done); the closing barrier (every CTA signals and waits for the same CTA of every peer)
 * keeps each rank in the kernel until no peer reads its input or writes its output.
 */
template <class T, int Op>
static __device__ __forceinline__ void maco__direct_body(const maco__coll_args_t &a,
                                                         char *const *ins, char *const *outs,
                                                         maco_memory_channel_device_t *ch)
{
    typedef maco__vec<16, typename T::bits> V;
    const int n = a.nranks, r = a.rank, root = a.root, coll = a.coll;
    const uint64_t esz = a.esz, C = a.count;
    const bool rooted = coll == MACO_COLL_BROADCAST || coll == MACO_COLL_REDUCE;
    const int m = coll == MACO_COLL_ALLREDUCE ? n : (rooted ? n - 1 : 1);
    /* Elements per piece: a whole number of 16-byte words. */
    const uint64_t per_word = 16 / esz;
    const uint64_t P = ((C + m - 1) / m + per_word - 1) / per_word * per_word;
    const int j = coll == MACO_COLL_ALLREDUCE ? r
                  : rooted                    ? (r == root ? -1 : (r - root - 1 + n) % n)
                                              : 0;
    const uint64_t lo = j < 0 ? C : min(C, (uint64_t)j * P);
    const uint64_t len = (rooted || coll == MACO_COLL_ALLREDUCE) ? min(P, C - lo) * esz : C * esz;
    /* Sources in rank order (reducing) or one source; NULL destinations are skipped.
     * Indexed by compile-time q only, so the pointers stay in registers. */
    const bool one_src = coll == MACO_COLL_BROADCAST || coll == MACO_COLL_ALLGATHER;
    const int nsrc = one_src ? 1 : n;
    const uint64_t blk = (uint64_t)r * C * esz; /* my block (reduce_scatter, allgather) */
    const char *src[MACO__MAXR];
    char *dst[MACO__MAXR];
#pragma unroll
    for (int q = 0; q < MACO__MAXR; q++) {
        src[q] = nullptr;
        dst[q] = nullptr;
        if (q >= n)
            continue;
        switch (coll) {
        case MACO_COLL_ALLREDUCE:
            src[q] = ins[q] + lo * esz;
            dst[q] = outs[q] + lo * esz;
            break;
        case MACO_COLL_REDUCE:
            src[q] = ins[q] + lo * esz;
            if (q == 0)
                dst[0] = outs[root] + lo * esz;
            break;
        case MACO_COLL_BROADCAST:
            if (q == 0)
                src[0] = ins[root] + lo * esz;
            if (q != root)
                dst[q] = outs[q] + lo * esz;
            break;
        case MACO_COLL_REDUCE_SCATTER:
            src[q] = ins[q] + blk;
            if (q == 0)
                dst[0] = outs[r];
            break;
        default: /* allgather */
            if (q == 0)
                src[0] = ins[r];
            if (q != r || outs[q] + blk != ins[q])
                dst[q] = outs[q] + blk;
            break;
        }
    }
    const uint64_t gtid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t gthr = (uint64_t)gridDim.x * blockDim.x;
    /* The root of an out-of-place broadcast copies its own data. */
    if (coll == MACO_COLL_BROADCAST && r == root && outs[r] != ins[r])
        maco_copy(outs[r], ins[r], C * esz, (uint32_t)gtid, (uint32_t)gthr);
    const bool avg = a.avg != 0;
    const uint64_t nvec = j < 0 ? 0 : (len + 15) / 16;
    const uint64_t nfull = j < 0 ? 0 : len / 16;
    uint64_t v = gtid;
    /* Two whole words per thread per step: twice the remote loads in flight. */
    for (; v + gthr < nfull; v += 2 * gthr) {
        V x0[MACO__MAXR], x1[MACO__MAXR];
#pragma unroll
        for (int q = 0; q < MACO__MAXR; q++) {
            uint4 u0 = make_uint4(0u, 0u, 0u, 0u), u1 = u0;
            if (q < nsrc) {
                u0 = ((const uint4 *)src[q])[v];
                u1 = ((const uint4 *)src[q])[v + gthr];
            }
            x0[q].w[0] = u0.x;
            x0[q].w[1] = u0.y;
            x0[q].w[2] = u0.z;
            x0[q].w[3] = u0.w;
            x1[q].w[0] = u1.x;
            x1[q].w[1] = u1.y;
            x1[q].w[2] = u1.z;
            x1[q].w[3] = u1.w;
        }
        V r0, r1;
        if (nsrc == 1) {
            r0 = x0[0];
            r1 = x1[0];
        } else {
            maco__reduce_vec<T, Op, 16>(&r0, x0, nsrc, avg, a.op);
            maco__reduce_vec<T, Op, 16>(&r1, x1, nsrc, avg, a.op);
        }
#pragma unroll
        for (int d = 0; d < MACO__MAXR; d++)
            if (dst[d] != nullptr) {
                ((uint4 *)dst[d])[v] = make_uint4(r0.w[0], r0.w[1], r0.w[2], r0.w[3]);
                ((uint4 *)dst[d])[v + gthr] = make_uint4(r1.w[0], r1.w[1], r1.w[2], r1.w[3]);
            }
    }
    for (; v < nvec; v += gthr) {
        const uint64_t left = len - 16 * v;
        const uint32_t valid = left >= 16 ? 16u : (uint32_t)left;
        V x[MACO__MAXR];
#pragma unroll
        for (int q = 0; q < MACO__MAXR; q++) {
            if (q < nsrc)
                x[q] = maco__load_part<16, V>(src[q] + 16 * v, valid);
            else
                x[q].w[0] = x[q].w[1] = x[q].w[2] = x[q].w[3] = 0u;
        }
        V res;
        if (nsrc == 1)
            res = x[0];
        else
            maco__reduce_vec<T, Op, 16>(&res, x, nsrc, avg, a.op);
#pragma unroll
        for (int d = 0; d < MACO__MAXR; d++)
            if (dst[d] != nullptr)
                maco__store_part<16, V>(dst[d] + 16 * v, res, valid);
    }
    maco__mesh_barrier(ch, threadIdx.x < (uint32_t)n && threadIdx.x != (uint32_t)r);
}

/*
 * MESH kernel: first every rank sends its descriptor (algorithms.h) to every peer as LL16
 * packets (CTA 0) and every CTA reads all of them; all ranks then take the same path: in
 * place when every buffer a peer touches is registered, mapped by that peer and 16-byte
 * aligned, else through scratch. The descriptors use the LL kernel's packet flag and its
 * two halves by parity, and every rank sends to and reads from every peer, so the LL
 * kernel's argument (coll_kernels.cuh, top) keeps a half from being overwritten while it is
 * read, across LL and mesh launches alike.
 */
template <class T, int Op>
__global__ void __launch_bounds__(512) maco__mesh_kernel(maco__coll_args_t a)
{
    __shared__ maco_memory_channel_device_t ch[MACO__MAXR];
    __shared__ uint32_t desc[MACO__MAXR][MACO__DESC_WORDS];
    __shared__ char *ins[MACO__MAXR], *outs[MACO__MAXR];
    __shared__ int direct, bad;
    const int n = a.nranks, r = a.rank;
    const uint32_t tid = threadIdx.x;
    if (tid < (uint32_t)n && tid != (uint32_t)r)
        ch[tid] = a.channels[(uint64_t)blockIdx.x * (uint64_t)n + tid];
    if (tid == 0)
        bad = 0;
    const uint32_t flag = *(volatile uint32_t *)a.ll_flag;
    const uint64_t half = a.desc_offset + (uint64_t)(flag & 1u) * (uint64_t)n * MACO__DESC_BYTES;
    const maco_device_wait_bound_t bound = a.bound;
    __syncthreads();

    const int q = (int)(tid / MACO__DESC_PKTS), k = (int)(tid % MACO__DESC_PKTS);
    if (q < n) {
        uint2 d = make_uint2(a.desc[2 * k], a.desc[2 * k + 1]);
        if (q != r && blockIdx.x == 0)
            maco_ll16_store(
                (maco_ll16_packet_t *)(a.peer_buf[q] + half + (uint64_t)r * MACO__DESC_BYTES) + k,
                d, flag);
        if (q != r &&
            maco_ll16_load(
                (const maco_ll16_packet_t *)(a.buf + half + (uint64_t)q * MACO__DESC_BYTES) + k,
                flag, &d, &bound, q, k) != MACO_OK)
            bad = 1;
        desc[q][2 * k] = d.x;
        desc[q][2 * k + 1] = d.y;
    }
    __syncthreads();
    if (bad)
        return;
    if (tid == 0) {
        /* Every rank's block of an allgather or reduce-scatter must be 16-byte aligned too. */
        bool ok = !((a.coll == MACO_COLL_ALLGATHER || a.coll == MACO_COLL_REDUCE_SCATTER) &&
                    (a.count * a.esz) % 16 != 0);
        for (int p = 0; p < n; p++)
            for (int w = 0; w < 2; w++) {
                const uint32_t id = desc[p][w];
                if (id == MACO__DESC_NONE)
                    ok = false;
                else if (id != MACO__DESC_LOCAL)
                    for (int o = 0; o < n; o++)
                        if (o != p && desc[o][6 + p] < id)
                            ok = false;
            }
        direct = ok;
        if (blockIdx.x == 0)
            atomicAdd(&a.paths[ok ? 0 : 1], 1ull);
    }
    __syncthreads();
    if (direct) {
        /* Thread 2p + w finds rank p's send (w 0) or receive (w 1) buffer. */
        if (tid < 2u * (uint32_t)n) {
            const int p = (int)(tid >> 1), w = (int)(tid & 1u);
            const uint32_t id = desc[p][w];
            char *ptr = nullptr;
            if (p == r) {
                ptr = w ? (char *)a.output : (char *)a.input;
            } else if (id != MACO__DESC_LOCAL) {
                const uint64_t i = (uint64_t)p * MACO__REG_MAX + id - 1;
                uint64_t v = a.reg_cache[i];
                if (v == 0) {
                    v = *(const volatile uint64_t *)&a.reg_table[i];
                    a.reg_cache[i] = v;
                }
                if (v == 0) {
                    maco_device_error_record(&bound, MACO_ERR_INVALID_USAGE, p, (int)id,
                                             MACO_DEVICE_ERR_REGISTRATION, 0, 0);
                    bad = 1;
                }
                const uint64_t off = ((uint64_t)desc[p][3 + 2 * w] << 32) | desc[p][2 + 2 * w];
                ptr = (char *)v + off;
            }
            (w ? outs : ins)[p] = ptr;
        }
        __syncthreads();
        if (bad)
            return;
        maco__direct_body<T, Op>(a, ins, outs, ch);
    } else {
        maco__mesh_body<T, Op>(a, ch);
    }
    maco__flag_advance(a.ll_flag, a.ll_done, flag);
}

/* ------------------------------------------------------------------ instantiation */

template <class T, int Op>
static cudaError_t maco__launch_one(const maco__coll_args_t *args, int kernel, int blocks,
                                    int threads, cudaStream_t stream)
{
    if (kernel == MACO__KERNEL_LL)
        maco__ll_kernel<T, Op><<<blocks, threads, 0, stream>>>(*args);
    else if (kernel == MACO__KERNEL_LL2)
        maco__ll2_kernel<T, Op><<<blocks, threads, 0, stream>>>(*args);
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
        /* prod, min, max: one kernel reading args->op (reduce.cuh, ops). */                       \
        if (op == MACO_PROD || op == MACO_MIN || op == MACO_MAX)                                   \
            return maco__launch_one<T, MACO__OP_RUNTIME>(args, kernel, blocks, threads, stream);   \
        return maco__launch_one<T, MACO__OP_SUM>(args, kernel, blocks, threads, stream);           \
    }

#endif /* MACO_COLL_KERNELS_CUH */
