/*
 * ll.cuh - the one-shot LL kernel, for every collective (two-shot LL, for allreduce alone, is
 * in allreduce/twoshot_ll.cuh).
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
 */
#ifndef MACO_ALGO_LL_CUH
#define MACO_ALGO_LL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "algorithms/collectives/collectives.h"
#include "maco/device/copy.h"
#include "maco/device/packet.h"
#include "src/device/reduce.cuh"
#include "src/device/words.cuh"

#define MACO__MAXR MACO__MAX_LOCAL_RANKS

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
    /* My LL slot in rank q's scratch. */
    const auto ll_dst = [&](int q) {
        return (maco_ll16_packet_t *)(a.peer_buf[q] + half + (uint64_t)r * a.ll_slot_bytes);
    };
    if (!to_all && tid == 0) {
        for (int q = 0; q < n; q++)
            if (q != r && !(to_root && q == root))
                maco_ll16_store(ll_dst(q), make_uint2(0u, 0u), flag);
    }
    if (to_root || to_all) {
        for (uint64_t i = tid; i < npkt; i += nthr) {
            uint64_t left = bytes - 8 * i;
            uint32_t valid = left < 8 ? (uint32_t)left : 8u;
            if (to_root) {
                V v = maco__load_part<8, V>(in + 8 * i, valid);
                maco_ll16_store(ll_dst(root) + i, make_uint2(v.w[0], v.w[1]), flag);
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
                maco_ll16_store(ll_dst(q) + i, make_uint2(v.w[0], v.w[1]), flag);
            }
        }
    }

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

#endif /* MACO_ALGO_LL_CUH */
