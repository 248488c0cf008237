/*
 * hier.cuh - the collectives across nodes ("hier"): inside a node over the memory channels'
 * mapped scratch, between nodes over port channels on rails (local index i of every node
 * talks to local index i of the others), as docs/design.md ("Collectives across nodes")
 * tells for readers of the docs.
 *
 * Each CTA b owns scratch slot b of every rank (layout in common/state.h: regions of region_bytes
 * bytes IN [node][local] and OUT [local][node] in the collectives buffer, CARRY [node], FINAL
 * [node] and ACC [node] in the rail buffer, pinned host memory: common/setup.c says why), its own
 * memory-channel semaphores with the node's ranks (the mesh barrier) and its own two port
 * channels to each rail peer: "data" (a put, then a signal: the data landed) and "ack" (the
 * receiver has consumed what a data signal announced). It works on segments b, b + G, ...
 *
 * Reductions run as a chain over the nodes in node order, so every element is combined in
 * one fixed order: node 0's ranks in rank order, then node 1's, and so on, the running value
 * kept in the type's accumulator (float for the 16- and 8-bit floats) and converted once at
 * the end, exactly as the single-node kernels do (reduce.cuh). With ranks numbered node by
 * node (maco-run, torchrun) that order is rank order, and the result is bitwise the one a
 * single node computes from the same inputs.
 *
 * Two rules keep calls apart (the next collective, of any kind, may start on one node while
 * another still finishes the last): region FINAL[k] of a rail buffer is written only by node
 * k's rail peer, and no put outlives its sender's kernel unconsumed (the sender waits for an
 * acknowledgement or for an answer that the receiver can only give after it read the data).
 *
 * allreduce, reduce (segment = local_nranks pieces; local index j owns piece j):
 *   X   each rank copies its input's piece j to owner j's IN[0][me];  mesh barrier
 *   Y1  owner: node k > 0 waits for CARRY from node k-1 (data); folds CARRY (or nothing on
 *       node 0) and IN[0][0..local_nranks) in order; node k < N-1 puts the accumulator (ACC) to
 * node k+1's CARRY with a signal; node N-1 converts it (avg: divides by the rank count), stores it
 * in its ACC and the local OUT[me] regions (reduce: only the root's, on the root's node) and puts
 * ACC to every other node's FINAL[N-1] with a signal Y2  node k < N-1 waits for FINAL and copies it
 * to the local OUT[me] regions (reduce: the root's only, on the root's node), in the CTA's last
 * segment acknowledges it (the last node's kernel waits for these before it ends);  mesh barrier Z
 * every rank (reduce: the root) copies the OUT pieces to its output. Reduce moves the result to
 * every node like allreduce: each node waiting for FINAL is what keeps a node from starting segment
 * s + G while its segment-s put is in flight. reduce_scatter (segment = P elements of every rank's
 * block; rail i reduces the blocks of the ranks of local index i): X copies block (node m, local q)
 * of the input to q's IN[m][me]; Y1 folds per destination node m (CARRY[m], IN[m][0..local_nranks))
 * and passes the N accumulators on in one go (one signal); node N-1 puts the result for node m to
 * m's FINAL[N-1]; Y2: FINAL (node N-1: its own ACC[N-1]) to the output, acknowledged as above. Flow
 * control of the chains: node k-1 writes node k's CARRY for segment s + G only after it received
 * FINAL of segment s, which exists only after the chain of s passed node k; the same holds for
 * FINAL and for the ACC regions being read by a put. allgather (segment = P elements of each
 * block): every rank copies its piece to its ACC and the local OUT[me][k] regions, puts ACC to
 * every other node's FINAL[k], waits for the FINAL[m] of every other node, copies them to the local
 * OUT[me][m], acknowledges them; barrier; Z copies OUT[q][m] to the block of rank (m, q). broadcast
 * (segment = local_nranks pieces): on the root's node the root copies piece j to owner j's IN;
 * owner j copies it to its ACC and the local OUT[j] and puts ACC to every other node's FINAL[root's
 * node]; elsewhere owner j waits for FINAL, copies it to the local OUT[j] and acknowledges; Z as
 * allreduce. Here nothing else paces the sender, so before it overwrites ACC for the next segment
 * (and before the kernel ends) it waits for every acknowledgement of the last. Every wait is
 * bounded (MACO_DEVICE_TIMEOUT); a failed one records the device error and the CTA stops (its local
 * peers then time out on the barrier, naming it).
 */
#ifndef MACO_ALGO_HIER_CUH
#define MACO_ALGO_HIER_CUH

#include "algorithms/collectives/mesh.cuh"
#include "algorithms/hier/hier.h"
#include "maco/device/port_channel.h"
#include "src/device/sysmem.cuh"

/* Folds `len` elements: the accumulator values at `carry_in` (when not NULL) then the element
 * values of local_nranks regions at src0, src0 + region_bytes, ... in that order. Not last: stores
 * the accumulators at acc_out. Last: converts (avg: divided by nranks) and stores the elements at
 * dst[0..ndst). Whole 16-byte words of scratch are read and written; words past `len` carry stale
 * bytes that no output receives. */
template <class T, int Op>
static __device__ __forceinline__ void
maco__hier_fold(const char *carry_in, const char *src0, uint64_t region_bytes, int local_nranks,
                bool last, bool avg, int nranks, int rop, char *const *dst, int ndst, char *acc_out,
                uint64_t len)
{
    typedef typename T::bits B;
    typedef typename T::acc A;
    typedef maco__vec<16, B> V;
    constexpr int E = 16 / (int)sizeof(B);
    const uint64_t nw = (len + E - 1) / E;
    for (uint64_t v = threadIdx.x; v < nw; v += blockDim.x) {
        A acc[E];
        int q0 = 0;
        if (carry_in != nullptr) {
            /* The carry is in the rail buffer: loads that fetch it again (sysmem.cuh
             * says why). E accumulators fill a whole number of 16-byte words. */
            const uint4 *cp = (const uint4 *)(carry_in + v * E * sizeof(A));
            union {
                uint4 w[E * sizeof(A) / 16];
                A x[E];
            } u;
#pragma unroll
            for (int w = 0; w < (int)(E * sizeof(A) / 16); w++)
                u.w[w] = __ldcv(cp + w);
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[e] = u.x[e];
        } else {
            const V x = *(const V *)(src0 + 16 * v);
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[e] = T::widen(x.e[e]);
            q0 = 1;
        }
        for (int q = q0; q < local_nranks; q++) {
            const V x = *(const V *)(src0 + (uint64_t)q * region_bytes + 16 * v);
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[e] = maco__combine<T, Op>(acc[e], T::widen(x.e[e]), rop);
        }
        if (last) {
            V r;
#pragma unroll
            for (int e = 0; e < E; e++) {
                A t = acc[e];
                if (Op == MACO__OP_SUM && avg)
                    t = T::div(t, nranks);
                r.e[e] = T::narrow(t);
            }
            for (int d = 0; d < ndst; d++)
                *(V *)(dst[d] + 16 * v) = r;
        } else {
            A *o = (A *)acc_out + v * E;
#pragma unroll
            for (int e = 0; e < E; e++)
                o[e] = acc[e];
        }
    }
}

/* Every thread's writes to the rail buffer (the source of the put that follows) made visible
 * to the proxy's CPU before thread 0 pushes the put: each writer's own system-scope fence,
 * then the CTA barrier. */
static __device__ __forceinline__ void maco__hier_publish()
{
    __threadfence_system();
    __syncthreads();
}

/* Chains: the mesh barrier after the node's inputs are in place, then (nodes after the first)
 * the carry of the node before. True when the CTA must stop. */
static __device__ __forceinline__ bool
maco__hier_take_carry(maco_memory_channel_device_t *channels, bool waiter,
                      const maco_port_channel_device_t *carry)
{
    if (maco__mesh_barrier(channels, waiter))
        return true;
    bool fail = carry != nullptr && threadIdx.x == 0 && maco_port_channel_wait(carry) != MACO_OK;
    return maco__cta_failed(fail);
}

/* Chains (allreduce, reduce, reduce_scatter): a node other than the last, once the CTA read
 * the FINAL of its last segment (`final_seg`), acknowledges it to the last node, whose kernel
 * waits for that before it ends. Earlier segments need no acknowledgement: the chain of the
 * next one passes this node only after it read them. True when the CTA must stop. */
static __device__ __forceinline__ bool maco__hier_ack_last(const maco_port_channel_device_t *ack,
                                                           bool final_seg)
{
    if (!final_seg)
        return false;
    __syncthreads();
    bool fail = threadIdx.x == 0 && maco_port_channel_signal(ack) != MACO_OK;
    return __syncthreads_or(fail ? 1 : 0) != 0;
}

/* Thread 0: a put of `bytes` (none when 0) and, if `signal`, a signal after it. 0 on
 * success. */
static __device__ __forceinline__ int maco__hier_put(const maco_port_channel_device_t *ch,
                                                     uint64_t dst_off, uint64_t src_off,
                                                     uint64_t bytes, bool signal)
{
    maco_status_t st = MACO_OK;
    if (bytes > 0 && signal)
        st = maco_port_channel_put_with_signal(ch, dst_off, src_off, bytes);
    else if (bytes > 0)
        st = maco_port_channel_put(ch, dst_off, src_off, bytes);
    else if (signal)
        st = maco_port_channel_signal(ch);
    return st != MACO_OK;
}

/* Thread 0 waits for (`raise`: raises) one signal on port channel `which` (0: data,
 * 1: acknowledgements) of the rail peer on every node but `skip_node`, in node order; `rail` is the
 * CTA's [nnodes][2]. The CTA agrees on a failure: true in every thread when it must stop. */
static __device__ __forceinline__ bool maco__hier_each_node(const maco_port_channel_device_t *rail,
                                                            int nnodes, int skip_node, int which,
                                                            bool raise)
{
    bool fail = false;
    if (threadIdx.x == 0)
        for (int m = 0; m < nnodes && !fail; m++)
            if (m != skip_node)
                fail = (raise ? maco_port_channel_signal(&rail[2 * m + which])
                              : maco_port_channel_wait(&rail[2 * m + which])) != MACO_OK;
    return maco__cta_failed(fail);
}

/* A CTA's start in the hier kernels (this one, alltoall_kernel.cu): its slot's memory
 * channels with the node's ranks into `channels` (shared memory; the mesh barrier's); returns
 * whether this thread waits on one of them in the barrier, and sets *rail_p to the slot's
 * port channels [nnodes][2] (data, acknowledgements). */
static __device__ __forceinline__ bool
maco__hier_cta_begin(const maco__hier_args_t &args, maco_memory_channel_device_t *channels,
                     const maco_port_channel_device_t **rail_p)
{
    const uint32_t L = (uint32_t)args.c.nranks, me = (uint32_t)args.c.rank, tid = threadIdx.x;
    if (tid < L && tid != me)
        channels[tid] = args.c.channels[(uint64_t)blockIdx.x * L + tid];
    __syncthreads();
    *rail_p = args.rail + (uint64_t)blockIdx.x * (uint64_t)args.nnodes * 2;
    return tid < L && tid != me;
}

/*
 * One CTA of the hier kernel: its arguments, the mesh barrier's memory channels (shared
 * memory) and whether this thread waits on one of them, its rail (port channels [nnodes][2]),
 * its slot in the collectives buffer and in the rail buffer, and the number of segments. The
 * member functions name the slot's regions: region numbers, their byte offsets and addresses.
 * IN [node m][local q] and OUT [local q][node m] are in the collectives buffer (at this rank:
 * loc, at local rank q: peer); CARRY [m], FINAL [m] and ACC [m] in the rail buffer (rail_at),
 * what the port channels move (their offsets: roff). data(m) and ack(m) are the port channels
 * to the rail peer on node m.
 */
struct maco__hier_cta {
    const maco__hier_args_t &args;
    maco_memory_channel_device_t *channels;
    const maco_port_channel_device_t *rail;
    uint64_t slot, rslot, nseg;
    bool waiter;

    __device__ __forceinline__ const maco_port_channel_device_t *data(int m) const
    {
        return &rail[2 * m];
    }
    __device__ __forceinline__ const maco_port_channel_device_t *ack(int m) const
    {
        return &rail[2 * m + 1];
    }
    /* In the collectives buffer: */
    __device__ __forceinline__ uint64_t r_in(int m, int q) const
    {
        return (uint64_t)m * (uint64_t)args.c.nranks + (uint64_t)q;
    }
    __device__ __forceinline__ uint64_t r_out(int q, int m) const
    {
        return (uint64_t)args.nnodes * (uint64_t)args.c.nranks +
               (uint64_t)q * (uint64_t)args.nnodes + (uint64_t)m;
    }
    __device__ __forceinline__ uint64_t off(uint64_t r) const
    {
        return slot + r * args.region_bytes;
    }
    __device__ __forceinline__ char *loc(uint64_t r) const
    {
        return args.c.buf + off(r);
    }
    __device__ __forceinline__ char *peer(int q, uint64_t r) const
    {
        return args.c.peer_buf[q] + off(r);
    }
    /* In the rail buffer (what the port channels move): */
    __device__ __forceinline__ uint64_t r_carry(int m) const
    {
        return (uint64_t)m;
    }
    __device__ __forceinline__ uint64_t r_final(int m) const
    {
        return (uint64_t)args.nnodes + (uint64_t)m;
    }
    __device__ __forceinline__ uint64_t r_acc(int m) const
    {
        return 2 * (uint64_t)args.nnodes + (uint64_t)m;
    }
    __device__ __forceinline__ uint64_t roff(uint64_t r) const
    {
        return rslot + r * args.region_bytes;
    }
    __device__ __forceinline__ char *rail_at(uint64_t r) const
    {
        return args.rail_buf + roff(r);
    }
    /* Elements of piece j of the segment at seg0 (split collectives), or of every block's
     * piece. */
    __device__ __forceinline__ uint64_t plen(uint64_t seg0, int j) const
    {
        const uint64_t P = args.c.piece_elems, C = args.c.count;
        return seg0 + (uint64_t)j * P < C ? min(P, C - seg0 - (uint64_t)j * P) : (uint64_t)0;
    }
};

/* One segment of allreduce and reduce: a chain over the nodes in node order, the last node
 * puts the result to every other. True when the CTA must stop. */
template <class T, int Op>
static __device__ __forceinline__ bool
maco__hier_seg_reduce(const maco__hier_cta &cta, uint64_t seg, uint64_t seg0, uint64_t len)
{
    const maco__coll_args_t &a = cta.args.c;
    const int L = a.nranks, me = a.rank, N = cta.args.nnodes, k = cta.args.node, coll = a.coll;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const uint64_t esz = a.esz, P = a.piece_elems;
    const char *in = (const char *)a.input;
    char *out = (char *)a.output;
    const bool avg = a.avg != 0, first = k == 0, last = k == N - 1;
    const int kr = cta.args.root_node, lr = cta.args.root_local;
    bool fail = false;
    for (int i = 0; i < L; i++) {
        const int q = (int)((blockIdx.x + (unsigned)me + (unsigned)i) % (unsigned)L);
        maco_copy(cta.peer(q, cta.r_in(0, me)), in + (seg0 + (uint64_t)q * P) * esz,
                  cta.plen(seg0, q) * esz, tid, nthr);
    }
    if (maco__hier_take_carry(cta.channels, cta.waiter, first ? nullptr : cta.data(k - 1)))
        return true;
    /* Where the result goes on the last node: ACC (the source of its puts) and the
     * OUT[me] regions of the ranks that output it. */
    const bool outputs = coll == MACO_COLL_ALLREDUCE || k == kr;
    char *dst[MACO__MAXR + 1];
    int ndst = 0;
    dst[ndst++] = cta.rail_at(cta.r_acc(0));
    for (int q = 0; q < MACO__MAXR; q++)
        if (q < L && outputs && (coll == MACO_COLL_ALLREDUCE || q == lr))
            dst[ndst++] = cta.peer(q, cta.r_out(me, 0));
    maco__hier_fold<T, Op>(first ? nullptr : cta.rail_at(cta.r_carry(0)), cta.loc(cta.r_in(0, 0)),
                           cta.args.region_bytes, L, last, avg, cta.args.nranks, a.op, dst, ndst,
                           cta.rail_at(cta.r_acc(0)), len);
    maco__hier_publish();
    if (tid == 0) {
        if (!last)
            fail = maco__hier_put(cta.data(k + 1), cta.roff(cta.r_carry(0)), cta.roff(cta.r_acc(0)),
                                  len * cta.args.accsz, true);
        else
            for (int m = 0; m < N - 1 && !fail; m++)
                fail = maco__hier_put(cta.data(m), cta.roff(cta.r_final(N - 1)),
                                      cta.roff(cta.r_acc(0)), len * esz, true);
        if (!last && !fail)
            fail = maco_port_channel_wait(cta.data(N - 1)) != MACO_OK;
    }
    if (maco__cta_failed(fail))
        return true;
    if (!last && outputs)
        for (int q = 0; q < L; q++)
            if (coll == MACO_COLL_ALLREDUCE || q == lr)
                maco__copy_from_sysmem(cta.peer(q, cta.r_out(me, 0)),
                                       cta.rail_at(cta.r_final(N - 1)), len * esz, tid, nthr);
    if (!last && maco__hier_ack_last(cta.ack(N - 1), seg + gridDim.x >= cta.nseg))
        return true;
    if (maco__mesh_barrier(cta.channels, cta.waiter))
        return true;
    if (outputs && (coll == MACO_COLL_ALLREDUCE || me == lr)) {
        for (int q = 0; q < L; q++)
            maco_copy(out + (seg0 + (uint64_t)q * P) * esz, cta.loc(cta.r_out(q, 0)),
                      cta.plen(seg0, q) * esz, tid, nthr);
        __syncthreads();
    }
    return false;
}

/* One segment of reduce_scatter: the chain of allreduce for every node's blocks at once, the
 * last node puts each node's reduced block to it. True when the CTA must stop. */
template <class T, int Op>
static __device__ __forceinline__ bool
maco__hier_seg_reduce_scatter(const maco__hier_cta &cta, uint64_t seg, uint64_t seg0, uint64_t len)
{
    const maco__coll_args_t &a = cta.args.c;
    const int L = a.nranks, me = a.rank, N = cta.args.nnodes, k = cta.args.node;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const uint64_t esz = a.esz, C = a.count;
    const char *in = (const char *)a.input;
    char *out = (char *)a.output;
    const bool avg = a.avg != 0, first = k == 0, last = k == N - 1;
    bool fail = false;
    for (int i = 0; i < L; i++) {
        const int q = (int)((blockIdx.x + (unsigned)me + (unsigned)i) % (unsigned)L);
        for (int m = 0; m < N; m++) {
            const uint64_t blk = (uint64_t)cta.args.rank_at[m * L + q] * C;
            maco_copy(cta.peer(q, cta.r_in(m, me)), in + (blk + seg0) * esz, len * esz, tid, nthr);
        }
    }
    if (maco__hier_take_carry(cta.channels, cta.waiter, first ? nullptr : cta.data(k - 1)))
        return true;
    for (int m = 0; m < N; m++) {
        char *dst[1] = { cta.rail_at(cta.r_acc(m)) };
        maco__hier_fold<T, Op>(first ? nullptr : cta.rail_at(cta.r_carry(m)),
                               cta.loc(cta.r_in(m, 0)), cta.args.region_bytes, L, last, avg,
                               cta.args.nranks, a.op, dst, 1, cta.rail_at(cta.r_acc(m)), len);
    }
    maco__hier_publish();
    if (tid == 0) {
        for (int m = 0; m < N && !fail; m++) {
            if (!last)
                fail = maco__hier_put(cta.data(k + 1), cta.roff(cta.r_carry(m)),
                                      cta.roff(cta.r_acc(m)), len * cta.args.accsz, m == N - 1);
            else if (m != k)
                fail = maco__hier_put(cta.data(m), cta.roff(cta.r_final(N - 1)),
                                      cta.roff(cta.r_acc(m)), len * esz, true);
        }
        if (!last && !fail)
            fail = maco_port_channel_wait(cta.data(N - 1)) != MACO_OK;
    }
    if (maco__cta_failed(fail))
        return true;
    maco__copy_from_sysmem(out + seg0 * esz,
                           last ? cta.rail_at(cta.r_acc(k)) : cta.rail_at(cta.r_final(N - 1)),
                           len * esz, tid, nthr);
    if (!last && maco__hier_ack_last(cta.ack(N - 1), seg + gridDim.x >= cta.nseg))
        return true;
    if (maco__mesh_barrier(cta.channels, cta.waiter))
        return true;
    return false;
}

/* One segment of allgather: every rank's piece to its node's ranks and, from its rail slot, to
 * every other node; *did: acknowledgements outstanding. True when the CTA must stop. */
static __device__ __forceinline__ bool
maco__hier_seg_allgather(const maco__hier_cta &cta, uint64_t seg0, uint64_t len, bool *did)
{
    const int L = cta.args.c.nranks, me = cta.args.c.rank, N = cta.args.nnodes, k = cta.args.node;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const uint64_t esz = cta.args.c.esz, C = cta.args.c.count;
    const char *in = (const char *)cta.args.c.input;
    char *out = (char *)cta.args.c.output;
    bool fail = false;
    if (maco__mesh_barrier(cta.channels, cta.waiter))
        return true;
    if (*did && tid == 0)
        for (int m = 0; m < N && !fail; m++)
            if (m != k)
                fail = maco_port_channel_wait(cta.ack(m)) != MACO_OK;
    if (maco__cta_failed(fail))
        return true;
    const char *mine = in + seg0 * esz;
    maco_copy(cta.rail_at(cta.r_acc(0)), mine, len * esz, tid, nthr);
    for (int q = 0; q < L; q++)
        maco_copy(cta.peer(q, cta.r_out(me, k)), mine, len * esz, tid, nthr);
    maco__hier_publish();
    if (tid == 0) {
        for (int m = 0; m < N && !fail; m++)
            if (m != k)
                fail = maco__hier_put(cta.data(m), cta.roff(cta.r_final(k)), cta.roff(cta.r_acc(0)),
                                      len * esz, true);
        for (int m = 0; m < N && !fail; m++)
            if (m != k)
                fail = maco_port_channel_wait(cta.data(m)) != MACO_OK;
    }
    if (maco__cta_failed(fail))
        return true;
    for (int m = 0; m < N; m++)
        if (m != k)
            for (int q = 0; q < L; q++)
                maco__copy_from_sysmem(cta.peer(q, cta.r_out(me, m)), cta.rail_at(cta.r_final(m)),
                                       len * esz, tid, nthr);
    __syncthreads();
    if (tid == 0)
        for (int m = 0; m < N && !fail; m++)
            if (m != k)
                fail = maco_port_channel_signal(cta.ack(m)) != MACO_OK;
    *did = true;
    if (maco__cta_failed(fail))
        return true;
    if (maco__mesh_barrier(cta.channels, cta.waiter))
        return true;
    for (int m = 0; m < N; m++)
        for (int q = 0; q < L; q++)
            maco_copy(out + ((uint64_t)cta.args.rank_at[m * L + q] * C + seg0) * esz,
                      cta.loc(cta.r_out(q, m)), len * esz, tid, nthr);
    __syncthreads();
    return false;
}

/* One segment of broadcast: the root spreads its pieces over its node, its node's ranks put
 * them from their rail slots to every other node; *did: acknowledgements outstanding (the
 * root's node). True when the CTA must stop. */
static __device__ __forceinline__ bool
maco__hier_seg_broadcast(const maco__hier_cta &cta, uint64_t seg0, uint64_t len, bool *did)
{
    const int L = cta.args.c.nranks, me = cta.args.c.rank, N = cta.args.nnodes, k = cta.args.node;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const uint64_t esz = cta.args.c.esz, P = cta.args.c.piece_elems;
    const char *in = (const char *)cta.args.c.input;
    char *out = (char *)cta.args.c.output;
    const int kr = cta.args.root_node, lr = cta.args.root_local;
    bool fail = false;
    const bool root_node = k == kr;
    if (root_node && me == lr)
        for (int i = 0; i < L; i++) {
            const int q = (int)((blockIdx.x + (unsigned)me + (unsigned)i) % (unsigned)L);
            maco_copy(cta.peer(q, cta.r_in(0, 0)), in + (seg0 + (uint64_t)q * P) * esz,
                      cta.plen(seg0, q) * esz, tid, nthr);
        }
    if (maco__mesh_barrier(cta.channels, cta.waiter))
        return true;
    if (root_node) {
        if (*did && tid == 0)
            for (int m = 0; m < N && !fail; m++)
                if (m != k)
                    fail = maco_port_channel_wait(cta.ack(m)) != MACO_OK;
        if (maco__cta_failed(fail))
            return true;
        maco_copy(cta.rail_at(cta.r_acc(0)), cta.loc(cta.r_in(0, 0)), len * esz, tid, nthr);
        for (int q = 0; q < L; q++)
            maco_copy(cta.peer(q, cta.r_out(me, 0)), cta.loc(cta.r_in(0, 0)), len * esz, tid, nthr);
        maco__hier_publish();
        if (tid == 0)
            for (int m = 0; m < N && !fail; m++)
                if (m != k)
                    fail = maco__hier_put(cta.data(m), cta.roff(cta.r_final(kr)),
                                          cta.roff(cta.r_acc(0)), len * esz, true);
        *did = true;
    } else {
        if (tid == 0)
            fail = maco_port_channel_wait(cta.data(kr)) != MACO_OK;
        if (maco__cta_failed(fail))
            return true;
        for (int q = 0; q < L; q++)
            maco__copy_from_sysmem(cta.peer(q, cta.r_out(me, 0)), cta.rail_at(cta.r_final(kr)),
                                   len * esz, tid, nthr);
        __syncthreads();
        if (tid == 0)
            fail = maco_port_channel_signal(cta.ack(kr)) != MACO_OK;
    }
    if (maco__cta_failed(fail))
        return true;
    if (maco__mesh_barrier(cta.channels, cta.waiter))
        return true;
    if (!(root_node && me == lr && out == in)) {
        for (int q = 0; q < L; q++)
            maco_copy(out + (seg0 + (uint64_t)q * P) * esz, cta.loc(cta.r_out(q, 0)),
                      cta.plen(seg0, q) * esz, tid, nthr);
        __syncthreads();
    }
    return false;
}

template <class T, int Op>
__global__ void __launch_bounds__(512) maco__hier_kernel(maco__hier_args_t args)
{
    const maco__coll_args_t &a = args.c;
    __shared__ maco_memory_channel_device_t channels[MACO__MAXR];
    const int L = a.nranks, me = a.rank, N = args.nnodes, k = args.node, coll = a.coll;
    const maco_port_channel_device_t *rail;
    const bool waiter = maco__hier_cta_begin(args, channels, &rail);
    const uint64_t P = a.piece_elems, C = a.count;
    const bool last = k == N - 1;
    const bool split = coll == MACO_COLL_ALLREDUCE || coll == MACO_COLL_REDUCE ||
                       coll == MACO_COLL_BROADCAST; /* a segment is L pieces */
    const uint64_t seg_elems = split ? P * (uint64_t)L : P;
    const maco__hier_cta cta = { args,
                                 channels,
                                 rail,
                                 args.hier_offset + (uint64_t)blockIdx.x * args.hier_slot_bytes,
                                 (uint64_t)blockIdx.x * args.rail_slot_bytes,
                                 (C + seg_elems - 1) / seg_elems,
                                 waiter };
    bool did = false; /* broadcast, allgather: acknowledgements outstanding */

    for (uint64_t seg = blockIdx.x; seg < cta.nseg; seg += gridDim.x) {
        const uint64_t seg0 = seg * seg_elems;
        const uint64_t len = split ? cta.plen(seg0, me) : cta.plen(seg0, 0);
        bool stop;
        if (coll == MACO_COLL_ALLREDUCE || coll == MACO_COLL_REDUCE)
            stop = maco__hier_seg_reduce<T, Op>(cta, seg, seg0, len);
        else if (coll == MACO_COLL_REDUCE_SCATTER)
            stop = maco__hier_seg_reduce_scatter<T, Op>(cta, seg, seg0, len);
        else if (coll == MACO_COLL_ALLGATHER)
            stop = maco__hier_seg_allgather(cta, seg0, len, &did);
        else
            stop = maco__hier_seg_broadcast(cta, seg0, len, &did);
        if (stop)
            return;
    }
    /* The chains' last node waits until every other node consumed the FINAL of this CTA's
     * last segment (maco__hier_ack_last), so no put of this kernel outlives it: the next
     * collective may write ACC (which TCP sends from as it is) and the FINAL regions at once. */
    if (last && threadIdx.x == 0 &&
        (coll == MACO_COLL_ALLREDUCE || coll == MACO_COLL_REDUCE ||
         coll == MACO_COLL_REDUCE_SCATTER))
        for (int m = 0; m < N - 1; m++)
            if (maco_port_channel_wait(cta.ack(m)) != MACO_OK)
                break;
    /* The acknowledgements of this CTA's last segment (broadcast: the root's node). */
    if (did && threadIdx.x == 0 && (coll == MACO_COLL_ALLGATHER || k == args.root_node))
        for (int m = 0; m < N; m++)
            if (m != k && maco_port_channel_wait(cta.ack(m)) != MACO_OK)
                break;
}

#endif /* MACO_ALGO_HIER_CUH */
