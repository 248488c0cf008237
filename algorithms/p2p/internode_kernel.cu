/*
 * internode_kernel.cu - send/recv and all-to-all between ranks of different nodes: one CTA per
 * pair of the plan (send to q, or receive from q), over the pair's buffers and port channels
 * (p2p.h, maco__internode_peer_dev_t; made by internode.c).
 *
 * A message of B bytes travels as max(1, ceil(B / chunk)) chunks in the slots of the pair,
 * chunk number n of the pair (counted over all messages and calls: `sent`, `recvd`) in slot
 * n % K (K = MACO__P2P_INTERNODE_SLOTS). Sender, per chunk: when n >= K it waits for one
 * acknowledgement (the receiver read slot n % K when it had chunk n - K); writes the header {B,
 * chunk bytes} and the payload into its send slot (host memory, then every writer's system fence
 * and the CTA barrier); puts header and payload into the peer's receive slot with a signal.
 * Receiver, per chunk: waits for the signal; reads the header (loads that fetch system memory
 * again, sysmem.cuh says why); the first chunk's B against its own count: when they differ it
 * writes nothing, takes every chunk the sender sends and then reports the mismatch
 * (maco_comm_get_async_error names both ranks and counts; reported earlier, its own later waits
 * would give up and leave the sender waiting); copies the payload to its buffer; acknowledges the
 * slot. Acknowledgements not yet waited for at a kernel's end are waited for by the next chunk of a
 * later call (the counters persist), so a call returns without a round trip and a send slot is
 * never written while its put may still read it. Every wait is bounded (MACO_DEVICE_TIMEOUT) and
 * names the peer.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "algorithms/p2p/p2p.h"
#include "algorithms/tuning.h"
#include "maco/device/copy.h"
#include "maco/device/port_channel.h"
#include "src/device/sysmem.cuh"

enum { MACO__P2P_INTERNODE_THREADS = 512 };

__global__ void __launch_bounds__(MACO__P2P_INTERNODE_THREADS)
    maco__p2p_internode_kernel(maco__p2p_internode_args_t a)
{
    const int k = blockIdx.x;
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const int q = a.plan.pair_peer[k];
    maco__internode_peer_dev_t *x = &a.peers[q];
    const uint64_t S = x->slot_bytes, cap = a.chunk;
    const bool send = a.plan.pair_dir[k] == MACO__P2P_SEND;
    __shared__ uint64_t sh_bytes;
    uint64_t n = send ? x->sent : x->recvd;
    for (int o = a.plan.pair_first[k]; o < a.plan.pair_first[k] + a.plan.pair_nops[k]; o++) {
        const maco__p2p_op_t &op = a.plan.ops[o];
        if (send) {
            const uint64_t B = op.bytes;
            const uint64_t nch = B == 0 ? 1 : (B + cap - 1) / cap;
            for (uint64_t c = 0; c < nch; c++, n++) {
                bool fail = false;
                if (tid == 0 && n >= MACO__P2P_INTERNODE_SLOTS)
                    fail = maco_port_channel_wait(&x->ack) != MACO_OK;
                if (maco__cta_failed(fail))
                    return;
                const uint64_t off = c * cap, cb = B - off < cap ? B - off : cap;
                char *slot = x->buf + (n % MACO__P2P_INTERNODE_SLOTS) * S;
                if (tid == 0) {
                    ((uint64_t *)slot)[0] = B;
                    ((uint64_t *)slot)[1] = cb;
                }
                maco_copy(slot + 16, (const char *)op.src + off, cb, tid, nthr);
                __threadfence_system();
                __syncthreads();
                if (tid == 0)
                    fail = maco_port_channel_put_with_signal(
                               &x->data,
                               (MACO__P2P_INTERNODE_SLOTS + n % MACO__P2P_INTERNODE_SLOTS) * S,
                               (n % MACO__P2P_INTERNODE_SLOTS) * S, 16 + cb) != MACO_OK;
                if (maco__cta_failed(fail))
                    return;
            }
        } else {
            const uint64_t R = op.bytes;
            uint64_t B = 0, nch = 1;
            bool bad = false;
            for (uint64_t c = 0; c < nch; c++, n++) {
                bool fail = false;
                const char *slot =
                    x->buf + (MACO__P2P_INTERNODE_SLOTS + n % MACO__P2P_INTERNODE_SLOTS) * S;
                if (tid == 0) {
                    fail = maco_port_channel_wait(&x->data) != MACO_OK;
                    if (!fail && c == 0)
                        sh_bytes = __ldcv((const unsigned long long *)slot);
                }
                if (maco__cta_failed(fail))
                    return;
                if (c == 0) {
                    B = sh_bytes;
                    bad = B != R;
                    nch = B == 0 ? 1 : (B + cap - 1) / cap;
                }
                const uint64_t off = c * cap, cb = B - off < cap ? B - off : cap;
                if (!bad)
                    maco__copy_from_sysmem((char *)op.dst + off, slot + 16, cb, tid, nthr);
                __syncthreads();
                if (tid == 0)
                    fail = maco_port_channel_signal(&x->ack) != MACO_OK;
                if (maco__cta_failed(fail))
                    return;
            }
            /* Reported once every chunk is taken: a recorded error makes this
             * communicator's later waits give up, and the sender must not be left waiting
             * for acknowledgements. */
            if (bad && tid == 0)
                maco_device_error_record(&a.bound, MACO_ERR_INVALID_ARGUMENT, q,
                                         (int)a.plan.op_flags[o], MACO_DEVICE_ERR_COUNT_MISMATCH, R,
                                         B);
        }
    }
    if (tid == 0) {
        if (send)
            x->sent = n;
        else
            x->recvd = n;
    }
}

extern "C" cudaError_t maco__launch_p2p_internode(const maco__p2p_internode_args_t *args,
                                                  int blocks, int threads, cudaStream_t stream)
{
    maco__p2p_internode_kernel<<<blocks, threads, 0, stream>>>(*args);
    return cudaGetLastError();
}

extern "C" cudaError_t maco__preload_p2p_internode(void)
{
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, maco__p2p_internode_kernel);
}
