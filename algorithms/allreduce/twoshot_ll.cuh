/*
 * twoshot_ll.cuh - the two-shot LL allreduce kernel (MACO__KERNEL_LL2, "twoshot_ll"); it reads
 * packets with ll.cuh's maco__ll_reduce_word and advances ll.cuh's packet flag, whose
 * half-reuse argument (top of ll.cuh) covers it.
 */
#ifndef MACO_ALGO_TWOSHOT_LL_CUH
#define MACO_ALGO_TWOSHOT_LL_CUH

#include "algorithms/collectives/ll.cuh"

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
 * argument (top of ll.cuh).
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
    /* Bytes of block q; source src's LL slot in rank `rank`'s scratch. */
    const auto block_bytes = [&](int q) {
        return (min(C, (uint64_t)(q + 1) * B) - (uint64_t)q * B) * esz;
    };
    const auto slot_of = [&](int rank, int src) {
        return a.peer_buf[rank] + half + (uint64_t)src * a.ll_slot_bytes;
    };

    /* 1. My block q to rank q's region A. */
    for (int k = 1; k < n; k++) {
        const int q = (r + k) % n;
        const uint64_t bytes = block_bytes(q), npkt = (bytes + 7) / 8;
        const char *src = in + (uint64_t)q * B * esz;
        maco_ll16_packet_t *dst = (maco_ll16_packet_t *)slot_of(q, r);
        for (uint64_t i = tid; i < npkt; i += nthr) {
            uint64_t left = bytes - 8 * i;
            V v = maco__load_part<8, V>(src + 8 * i, left < 8 ? (uint32_t)left : 8u);
            maco_ll16_store(dst + i, make_uint2(v.w[0], v.w[1]), flag);
        }
    }

    /* 2. Reduce my block, keep it, and send it to every peer's region B. */
    bool failed = false;
    {
        const uint64_t bytes = block_bytes(r), npkt = (bytes + 7) / 8;
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
                maco_ll16_store((maco_ll16_packet_t *)(slot_of(q, r) + region_b) + i,
                                make_uint2(res.w[0], res.w[1]), flag);
            }
        }
    }

    /* 3. Every peer's reduced block from my region B. */
    for (int k = 1; k < n && !failed; k++) {
        const int q = (r + k) % n;
        const uint64_t bytes = block_bytes(q), npkt = (bytes + 7) / 8;
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
    maco__flag_advance(a.ll_flag, a.ll_done, flag);
}

#endif /* MACO_ALGO_TWOSHOT_LL_CUH */
