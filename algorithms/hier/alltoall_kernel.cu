/*
 * alltoall_kernel.cu - the hierarchical all-to-all across nodes (MACO_ALGO_ALLTOALL=hier),
 * rail-aligned as NCCL's PXN: rank (k, i) (node k, local index i) hands its block for rank
 * (m, j) of another node to its local peer (k, j) over memory channels, and (k, j) sends one
 * message per other node m over rail j to (m, j), holding the blocks of all local_nranks ranks of
 * node k for (m, j). Blocks for the own node travel over memory channels only. Each rank talks to
 * nnodes - 1 rail peers instead of (nnodes - 1) local_nranks remote ranks, with local_nranks times
 * larger messages. docs/design.md ("Collectives across nodes") tells this for readers of the docs.
 *
 * Resources are the hier collectives' (hier.cuh; common/setup.c): CTA b uses slot b: the regions
 * IN[m][q] of region_bytes bytes in every rank's collectives buffer, ACC[m] and FINAL[m] in the
 * rail buffer (pinned host memory), its memory-channel semaphores with the node's ranks (the mesh
 * barrier), and its data and acknowledgement port channels to each rail peer. The shape
 * (pieces, segments, CTAs) is maco__hier_a2a_shape (hier.h, alltoall_shape.c); segment s is
 * elements [s P, s P + len) of every block, and CTA b carries segments b, b + G, ...
 *
 * Rank (k, me), per segment of the CTA:
 *   X  for every local q and node m: its block for rank (m, q), this segment's piece, into
 *      q's IN[m][me];  mesh barrier (every piece for this rank is in its IN regions)
 *   Y  from the CTA's second segment on: waits for the acknowledgements of the last
 *      segment's messages from every other node (then ACC[m] is free: TCP sends from it as it
 *      is; and the peer's FINAL[k] has been read);
 *      IN[k][q] to the output block of rank (k, q) (the own node's blocks, done);
 *      for every other node m: IN[m][0..local_nranks) into ACC[m] at a stride of P elements, then
 * (thread 0, after every writer's system fence) a put of ACC[m] to (m, me)'s FINAL[k] with a signal
 * on DATA(m) Z  waits for the signal on DATA(m) of every other node m; FINAL[m]'s local_nranks
 * pieces to the output blocks of ranks (m, 0..local_nranks); acknowledges on ACK(m); mesh barrier
 * (every IN region of the node read: the next segment's X may write them) At its end a CTA waits
 * for the acknowledgements of its last segment, so no put outlives the kernel: the next collective
 * of any kind may write ACC and the peers' FINAL regions at once.
 *
 * Keeping calls apart as hier.cuh: FINAL[k] of a rail buffer is written only by node k's rail
 * peer, every put is acknowledged before its source or destination is written again, and the
 * IN regions are written only after the node's mesh barrier that follows their last reads.
 * Every wait is bounded (MACO_DEVICE_TIMEOUT): a port channel's failed wait records the
 * device error the host reads (maco_comm_get_async_error) and the CTA stops; its local peers
 * then time out on the barrier, naming it. The kernel moves bytes only (esz gives the sizes).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "algorithms/hier/hier.h"
#include "algorithms/hier/hier.cuh"

enum { MACO__HIER_A2A_THREADS = 512 };

__global__ void __launch_bounds__(MACO__HIER_A2A_THREADS)
    maco__hier_a2a_kernel(maco__hier_args_t args)
{
    const maco__coll_args_t &a = args.c;
    __shared__ maco_memory_channel_device_t channels[MACO__MAXR];
    const int L = a.nranks, me = a.rank, N = args.nnodes, k = args.node;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const maco_port_channel_device_t *rail;
    const bool waiter = maco__hier_cta_begin(args, channels, &rail);
    const uint64_t region_bytes = args.region_bytes, esz = a.esz, P = a.piece_elems, C = a.count;
    const uint64_t slot = args.hier_offset + (uint64_t)blockIdx.x * args.hier_slot_bytes;
    const uint64_t rslot = (uint64_t)blockIdx.x * args.rail_slot_bytes;
    /* Byte offsets of the regions (hier.cuh's numbering): IN[m][q] in a collectives buffer,
     * FINAL[m] and ACC[m] in a rail buffer. */
    const uint64_t in_off = slot, final_off = rslot + (uint64_t)N * region_bytes,
                   acc_off = rslot + 2 * (uint64_t)N * region_bytes;
    /* Offset of region IN[m][q] from in_off. */
    const auto in_region = [&](int m, int q) {
        return ((uint64_t)m * (uint64_t)L + (uint64_t)q) * region_bytes;
    };
    const char *in = (const char *)a.input;
    char *out = (char *)a.output;
    const uint64_t pb = P * esz; /* stride of the pieces in a rail message */
    const uint64_t nseg = (C + P - 1) / P;
    bool did = false; /* acknowledgements of the CTA's last segment outstanding */

    for (uint64_t seg = blockIdx.x; seg < nseg; seg += gridDim.x) {
        const uint64_t seg0 = seg * P;
        const uint64_t bytes = min(P, C - seg0) * esz;
        bool fail = false;
        /* X: rotated so the CTAs and ranks of a node start on different peers. */
        for (int i = 0; i < L; i++) {
            const int q = (int)((blockIdx.x + (unsigned)me + (unsigned)i) % (unsigned)L);
            for (int m = 0; m < N; m++)
                maco_copy(a.peer_buf[q] + in_off + in_region(m, me),
                          in + ((uint64_t)args.rank_at[m * L + q] * C + seg0) * esz, bytes, tid,
                          nthr);
        }
        if (maco__mesh_barrier(channels, waiter))
            return;
        /* Y. */
        if (did && maco__hier_each_node(rail, N, k, 1, false))
            return;
        for (int q = 0; q < L; q++)
            maco_copy(out + ((uint64_t)args.rank_at[k * L + q] * C + seg0) * esz,
                      a.buf + in_off + in_region(k, q), bytes, tid, nthr);
        for (int m = 0; m < N; m++)
            if (m != k)
                for (int q = 0; q < L; q++)
                    maco_copy(args.rail_buf + acc_off + (uint64_t)m * region_bytes +
                                  (uint64_t)q * pb,
                              a.buf + in_off + in_region(m, q), bytes, tid, nthr);
        maco__hier_publish();
        if (tid == 0)
            for (int m = 0; m < N && !fail; m++)
                if (m != k)
                    fail = maco__hier_put(&rail[2 * m], final_off + (uint64_t)k * region_bytes,
                                          acc_off + (uint64_t)m * region_bytes,
                                          (uint64_t)(L - 1) * pb + bytes, true);
        did = true;
        if (maco__cta_failed(fail))
            return;
        /* Z. */
        if (maco__hier_each_node(rail, N, k, 0, false))
            return;
        for (int m = 0; m < N; m++)
            if (m != k)
                for (int q = 0; q < L; q++)
                    maco__copy_from_sysmem(
                        out + ((uint64_t)args.rank_at[m * L + q] * C + seg0) * esz,
                        args.rail_buf + final_off + (uint64_t)m * region_bytes + (uint64_t)q * pb,
                        bytes, tid, nthr);
        __syncthreads();
        if (maco__hier_each_node(rail, N, k, 1, true))
            return;
        if (maco__mesh_barrier(channels, waiter))
            return;
    }
    if (did)
        maco__hier_each_node(rail, N, k, 1, false);
}

extern "C" cudaError_t maco__launch_hier_a2a(const maco__hier_args_t *args, int blocks, int threads,
                                             cudaStream_t stream)
{
    maco__hier_a2a_kernel<<<blocks, threads, 0, stream>>>(*args);
    return cudaGetLastError();
}

extern "C" cudaError_t maco__preload_hier_a2a(void)
{
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, maco__hier_a2a_kernel);
}
