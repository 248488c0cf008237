/*
 * mesh.cuh - the MESH kernel: registered buffers used in place, else pipelined through
 * scratch with per-CTA semaphores; and its descriptor exchange (uses the LL flag of ll.cuh).
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
 *      other non-root's OUT[me] and its own output; reduce_scatter: reduce IN[0..n) -> output;
 * allgather: OUT[q]
 *      -> output;
 *   barrier;
 *   Z  allreduce everywhere, reduce on the root, broadcast off the root: every owner's
 *      OUT piece -> output (broadcast: every other owner's).
 *   Reduce on 2 ranks ("direct"; one piece, owned by the root): X every rank's segment
 *      -> the root's IN[me]; barrier; Y the root reduces IN[0..n) in rank order -> its
 *      output; barrier; no Z. Each byte crosses NVLink once, where the owner form sends
 *      the root's data out and the sum back in two phases that do not overlap
 *      (docs/performance.md, "Tuning", "Reduce on two ranks").
 *   Double buffering: each CTA's slot has two halves of [IN n | OUT n] pieces; its segments
 *   i = 0, 1, ... use half i % 2, and one barrier B_i per segment separates X(i) and Y(i-1)
 *   (before it) from Z(i-1), Y(i) and X(i+1) (after it), so the sends of one segment and the
 *   reduction of the next share the links. Reuse of a half: X(i+1) writes a peer's IN (for
 *   allgather OUT) of half (i+1) % 2 after B_i, which the peer signals after Y(i-1), the
 *   last read of that half; Y(i) writes a peer's OUT of half i % 2 after B_i, which the
 *   peer signals after Z(i-2), the last read of that half.
 */
#ifndef MACO_ALGO_MESH_CUH
#define MACO_ALGO_MESH_CUH

#include "algorithms/collectives/ll.cuh"
#include "maco/device/memory_channel.h"

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

/* What the scratch path's phases share: the launch's constants and this CTA's slot. */
struct maco__mesh_ctx {
    int n, r, root, coll, m;
    bool rooted, direct, avg;
    uint64_t esz, P, C, seg_elems, pmax, slot0, half_bytes;
    const char *in;
    char *out, *local;
    char *const *peer_buf;
    /* Rank `rank`'s IN and OUT piece q of half h of this CTA's slot. */
    __device__ __forceinline__ char *in_at(int rank, int h, int q) const
    {
        return peer_buf[rank] + slot0 + (uint64_t)h * half_bytes + (uint64_t)q * pmax;
    }
    __device__ __forceinline__ char *out_at(int rank, int h, int q) const
    {
        return peer_buf[rank] + slot0 + (uint64_t)h * half_bytes +
               ((uint64_t)n + (uint64_t)q) * pmax;
    }
    /* Piece index of owner rank q (allreduce: q; broadcast, reduce: position after the root). */
    __device__ __forceinline__ int piece_of(int q) const
    {
        return rooted ? (q - root - 1 + n) % n : q;
    }
    /* Elements of piece j of the segment that starts at element seg0. */
    __device__ __forceinline__ uint64_t plen_of(uint64_t seg0, int j) const
    {
        return seg0 + (uint64_t)j * P < C ? min(P, C - seg0 - (uint64_t)j * P) : (uint64_t)0;
    }
};

/* X of the segment at element seg0, into half h of the peers' slots. Rotating the first
 * peer per CTA spreads the traffic over every NVLink. */
static __device__ __forceinline__ void maco__mesh_x(const maco__mesh_ctx &c, uint64_t seg0, int h)
{
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const int n = c.n, r = c.r, coll = c.coll;
    const uint64_t esz = c.esz, plen = c.plen_of(seg0, 0);
    if (c.direct) { /* every rank's segment to the root's IN[me] */
        maco_copy(c.in_at(c.root, h, r), c.in + seg0 * esz, plen * esz, tid, nthr);
        return;
    }
    for (int k = 0; k < n; k++) {
        const int p = (int)((blockIdx.x + (unsigned)r + (unsigned)k) % (unsigned)n);
        const int j = c.piece_of(p);
        if (coll == MACO_COLL_ALLREDUCE || (coll == MACO_COLL_REDUCE && p != c.root) ||
            (coll == MACO_COLL_BROADCAST && r == c.root && p != c.root)) {
            maco_copy(c.in_at(p, h, r), c.in + (seg0 + (uint64_t)j * c.P) * esz,
                      c.plen_of(seg0, j) * esz, tid, nthr);
        } else if (coll == MACO_COLL_REDUCE_SCATTER) {
            maco_copy(c.in_at(p, h, r), c.in + ((uint64_t)p * c.C + seg0) * esz, plen * esz, tid,
                      nthr);
        } else if (coll == MACO_COLL_ALLGATHER) {
            /* My own piece goes straight to my output. */
            char *own = c.out + ((uint64_t)r * c.C + seg0) * esz;
            if (p != r)
                maco_copy(c.out_at(p, h, r), c.in + seg0 * esz, plen * esz, tid, nthr);
            else if (own != c.in + seg0 * esz)
                maco_copy(own, c.in + seg0 * esz, plen * esz, tid, nthr);
        } else if (coll == MACO_COLL_BROADCAST && r == c.root && p == c.root &&
                   c.out + seg0 * esz != c.in + seg0 * esz) {
            uint64_t len = seg0 < c.C ? min(c.seg_elems, c.C - seg0) : 0;
            maco_copy(c.out + seg0 * esz, c.in + seg0 * esz, len * esz, tid, nthr);
        }
    }
}

/* Y of the segment at element seg0, from half h of this rank's slot. */
template <class T, int Op>
static __device__ __forceinline__ void maco__mesh_y(const maco__mesh_ctx &c, int rop, uint64_t seg0,
                                                    int h)
{
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const int n = c.n, r = c.r, coll = c.coll;
    const uint64_t esz = c.esz, plen = c.plen_of(seg0, 0);
    const char *mine = c.local + c.slot0 + (uint64_t)h * c.half_bytes; /* my IN[0] */
    const int my_j = c.piece_of(r);
    const uint64_t my_len = c.plen_of(seg0, my_j);
    if (c.direct) {
        if (r == c.root) {
            char *dst[1] = { c.out + seg0 * esz };
            maco__mesh_reduce<T, Op>(mine, c.pmax, n, c.avg, rop, dst, 1, false, plen * esz);
        }
    } else if (coll == MACO_COLL_ALLREDUCE || (coll == MACO_COLL_REDUCE && r != c.root)) {
        char *dst[MACO__MAXR];
#pragma unroll
        for (int p = 0; p < MACO__MAXR; p++)
            dst[p] = p < n ? c.out_at(p, h, r) : nullptr;
        if (coll == MACO_COLL_REDUCE)
            dst[0] = c.out_at(c.root, h, r);
        maco__mesh_reduce<T, Op>(mine, c.pmax, n, c.avg, rop, dst, coll == MACO_COLL_REDUCE ? 1 : n,
                                 true, my_len * esz);
    } else if (coll == MACO_COLL_BROADCAST && r != c.root) {
        /* My own piece straight to my output (Z skips it). */
        for (int k = 0; k < n; k++) {
            const int q = (int)((blockIdx.x + (unsigned)r + (unsigned)k) % (unsigned)n);
            char *to = q == r ? c.out + (seg0 + (uint64_t)my_j * c.P) * esz : c.out_at(q, h, r);
            if (q != c.root)
                maco_copy(to, mine + (uint64_t)c.root * c.pmax, my_len * esz, tid, nthr);
        }
    } else if (coll == MACO_COLL_REDUCE_SCATTER) {
        char *dst[1] = { c.out + seg0 * esz };
        maco__mesh_reduce<T, Op>(mine, c.pmax, n, c.avg, rop, dst, 1, false, plen * esz);
    } else if (coll == MACO_COLL_ALLGATHER) {
        for (int q = 0; q < n; q++)
            if (q != r)
                maco_copy(c.out + ((uint64_t)q * c.C + seg0) * esz,
                          mine + ((uint64_t)n + (uint64_t)q) * c.pmax, plen * esz, tid, nthr);
    }
}

/* Z of the segment at element seg0, from half h of this rank's slot: every owner's piece to
 * my output (allreduce everywhere, reduce on the root, broadcast off the root). */
static __device__ __forceinline__ void maco__mesh_z(const maco__mesh_ctx &c, uint64_t seg0, int h)
{
    const int n = c.n, r = c.r, coll = c.coll;
    if (!(coll == MACO_COLL_ALLREDUCE || (coll == MACO_COLL_REDUCE && r == c.root && !c.direct) ||
          (coll == MACO_COLL_BROADCAST && r != c.root)))
        return;
    for (int q = 0; q < n; q++) {
        if ((c.rooted && q == c.root) || (coll == MACO_COLL_BROADCAST && q == r))
            continue;
        const int j = c.piece_of(q);
        maco_copy(c.out + (seg0 + (uint64_t)j * c.P) * c.esz,
                  c.local + c.slot0 + (uint64_t)h * c.half_bytes +
                      ((uint64_t)n + (uint64_t)q) * c.pmax,
                  c.plen_of(seg0, j) * c.esz, threadIdx.x, blockDim.x);
    }
}

/* The scratch path of the mesh kernel (the file comment's phases, double-buffered): this
 * CTA's segments i = 0, 1, ... use half i % 2 of its slot, and one barrier B_i separates
 * X(i) and Y(i - 1) before it from Z(i - 1), Y(i) and X(i + 1) after it. */
template <class T, int Op>
static __device__ __forceinline__ void maco__mesh_body(const maco__coll_args_t &a,
                                                       maco_memory_channel_device_t *ch)
{
    maco__mesh_ctx c;
    c.n = a.nranks;
    c.r = a.rank;
    c.root = a.root;
    c.coll = a.coll;
    c.rooted = c.coll == MACO_COLL_BROADCAST || c.coll == MACO_COLL_REDUCE;
    /* Reduce on 2 ranks: the root reduces (the file comment's "direct" form), so each byte
     * crosses NVLink once instead of out and back in two phases. */
    c.direct = c.coll == MACO_COLL_REDUCE && c.n == 2;
    c.avg = a.avg != 0;
    /* Pieces per segment: allreduce n (owner j = rank j), broadcast and reduce n-1 (owner
     * j = rank root+1+j), allgather and reduce-scatter one per rank block. */
    c.m = c.coll == MACO_COLL_ALLREDUCE ? c.n : (c.rooted ? c.n - 1 : 1);
    c.esz = a.esz;
    c.P = a.piece_elems;
    c.C = a.count;
    c.seg_elems = c.P * (uint64_t)c.m;
    c.pmax = a.rsag_piece_max;
    c.half_bytes = a.rsag_slot_bytes / 2; /* the slot's two halves (layout.c) */
    c.slot0 = a.rsag_offset + (uint64_t)blockIdx.x * a.rsag_slot_bytes;
    c.in = (const char *)a.input;
    c.out = (char *)a.output;
    c.local = a.buf;
    c.peer_buf = a.peer_buf;
    const bool waiter = threadIdx.x < (uint32_t)c.n && threadIdx.x != (uint32_t)c.r;

    const uint64_t nseg = (c.C + c.seg_elems - 1) / c.seg_elems;
    if (blockIdx.x >= nseg)
        return;
    const uint64_t iters = (nseg - 1 - blockIdx.x) / gridDim.x + 1;
    const auto seg0_of = [&](uint64_t i) { return (blockIdx.x + i * gridDim.x) * c.seg_elems; };
    maco__mesh_x(c, seg0_of(0), 0);
    for (uint64_t i = 0; i <= iters; i++) {
        if (maco__mesh_barrier(ch, waiter)) /* B_i */
            return;
        if (i > 0)
            maco__mesh_z(c, seg0_of(i - 1), (int)((i - 1) & 1));
        if (i < iters)
            maco__mesh_y<T, Op>(c, a.op, seg0_of(i), (int)(i & 1));
        if (i + 1 < iters)
            maco__mesh_x(c, seg0_of(i + 1), (int)((i + 1) & 1));
    }
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

/* Packet k of rank `from`'s descriptor in the comm buffer `base` (a.buf: this rank's,
 * a.peer_buf[q]: rank q's), in the half of the descriptor scratch that `flag` selects. */
static __device__ __forceinline__ maco_ll16_packet_t *
maco__desc_packet(const maco__coll_args_t &a, char *base, int from, uint32_t flag, int k)
{
    const uint64_t half =
        a.desc_offset + (uint64_t)(flag & 1u) * (uint64_t)a.nranks * MACO__DESC_BYTES;
    return (maco_ll16_packet_t *)(base + half + (uint64_t)from * MACO__DESC_BYTES) + k;
}

/*
 * MESH gate (a.gated, MACO_MESH_GATE_MIN): one CTA, launched just before the MESH kernel on
 * the same stream, sends this rank's descriptor packets to every peer (what the MESH kernel's
 * CTA 0 does otherwise, with the same flag: the kernel before both on the stream advanced it)
 * and waits until every peer's have arrived here. The MESH kernel's CTAs then find every
 * descriptor at once: a rank that reaches the collective before the others waits on one CTA,
 * and its other SMs stay free for the work beside it (a DDP backward pass), where otherwise
 * every CTA of the MESH kernel would spin on the slowest peer's descriptor. A failed wait is
 * recorded (the communicator's error names the peer); the MESH kernel's wait on the same
 * packet then sees that error and stops.
 */
#define MACO__GATE_THREADS (((MACO__MAX_LOCAL_RANKS * MACO__DESC_PKTS) + 31) / 32 * 32)
static __global__ void __launch_bounds__(MACO__GATE_THREADS)
    maco__mesh_gate_kernel(maco__coll_args_t a)
{
    const int r = a.rank;
    const int q = (int)(threadIdx.x / MACO__DESC_PKTS), k = (int)(threadIdx.x % MACO__DESC_PKTS);
    if (q >= a.nranks || q == r)
        return;
    const uint32_t flag = *(volatile uint32_t *)a.ll_flag;
    const maco_device_wait_bound_t bound = a.bound;
    uint2 d = make_uint2(a.desc[2 * k], a.desc[2 * k + 1]);
    maco_ll16_store(maco__desc_packet(a, a.peer_buf[q], r, flag, k), d, flag);
    (void)maco_ll16_load(maco__desc_packet(a, a.buf, q, flag, k), flag, &d, &bound, q, k);
}

/*
 * MESH kernel: first every rank sends its descriptor (common/registry.h) to every peer as LL16
 * packets (CTA 0) and every CTA reads all of them; all ranks then take the same path: in
 * place when every buffer a peer touches is registered, mapped by that peer and 16-byte
 * aligned, else through scratch. The descriptors use the LL kernel's packet flag and its
 * two halves by parity, and every rank sends to and reads from every peer, so the LL
 * kernel's argument (kernels.cuh, top) keeps a half from being overwritten while it is
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
    const maco_device_wait_bound_t bound = a.bound;
    __syncthreads();

    const int q = (int)(tid / MACO__DESC_PKTS), k = (int)(tid % MACO__DESC_PKTS);
    if (q < n) {
        uint2 d = make_uint2(a.desc[2 * k], a.desc[2 * k + 1]);
        if (q != r && blockIdx.x == 0 && !a.gated)
            maco_ll16_store(maco__desc_packet(a, a.peer_buf[q], r, flag, k), d, flag);
        if (q != r && maco_ll16_load(maco__desc_packet(a, a.buf, q, flag, k), flag, &d, &bound, q,
                                     k) != MACO_OK)
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

#endif /* MACO_ALGO_MESH_CUH */
