/*
 * p2p_kernels.cu - the send/recv kernel: one launch moves every message of one group on one
 * communicator (its sends, its receives and its local copies); an all-to-all is such a group.
 * docs/design.md ("Send/recv and all-to-all") tells the same story for readers of the docs.
 *
 * Lanes and slots. Each ordered pair of ranks (s -> d) has `lanes` lanes; each lane has
 * MACO__P2P_SLOTS slots in d's collectives buffer (layout in common/state.h; d holds slots for
 * its n - 1 sources only): a 16-byte chunk header (an LL16 packet), an LL payload region
 * (MACO__P2P_LL_SLOT bytes of packets) and a copy payload region (the chunk size + 16). s counts
 * the chunks it has sent on the lane (sent[d][lane], in s's buffer) and d the chunks it has
 * consumed (recvd[s][lane], in d's buffer); both counters live on the device and only grow, so a
 * CUDA graph replays with fresh values. Chunk number c of a lane goes to slot c % MACO__P2P_SLOTS
 * with flag c + 1 (32 bits; it differs from whatever the slot held, the flag of chunk c - SLOTS,
 * and from the zeroed memory the first SLOTS chunks find).
 *
 * A message of B bytes uses L = maco__p2p_msg_lanes(B, lanes) lanes (p2p_plan.h: one per 8
 * KiB, at most all) and is cut into max(L, ceil(B / cap)) chunks, chunk j on lane j % L, so
 * each of its L lanes carries at least one chunk of it; lanes from L on skip the message
 * (a receiver decides by its own count). Each chunk's header carries B and the message's
 * index in the pair: a lane's receiver learns from its own first chunk how many chunks of
 * the message it will get, even when its own count differs (then it drains them without
 * writing, so the sender never waits for a receiver that gave up). When the counts differ
 * the two sides may also give the message different lanes; a receiver that then meets a
 * chunk of another message (the index) stops without writing, with the count mismatch as
 * the error, and a sender whose chunks nobody drains ends at MACO_DEVICE_TIMEOUT.
 *
 * A chunk travels in one of two modes, chosen by the sender per message (maco__p2p_ll):
 *   LL    the payload as LL16 packets (8 bytes and the flag twice per 16-byte store) in the LL
 *         region, and the header; no fence: every packet carries the flag, the receiver spins
 *         on each. cap = MACO__P2P_LL_SLOT / 2 bytes per chunk.
 *   copy  the payload copied into the copy region at `skew` = the source's address mod 16
 *         (both sides' copies then move 16-byte words when the buffers are equally aligned);
 *         then __syncthreads(), a system-scope fence and the header store by thread 0. The
 *         receiver's thread 0 sees the header's flag, fences (acquire; only for copy-mode
 *         headers) and releases the CTA with __syncthreads(): fence-to-fence
 *         synchronisation, the header being the flag (a volatile 16-byte store and load:
 *         relaxed, system scope). cap = maco__p2p_copy_cap(B, chunk size, lanes): the
 *         message spread over every lane (one CTA per lane copies about 20 GB/s over
 *         NVLink), at most the slot.
 * Flow control: a sender may write chunk c only when the slot's previous chunk c - SLOTS has
 * been consumed. The receiver, after copying a chunk out (all threads done: __syncthreads()),
 * signals the lane's credit semaphore (a release add on the sender's counter); the sender,
 * before chunk c >= SLOTS, consumes one credit with an acquire poll
 * (maco_semaphore_poll). Each chunk earns exactly one credit and each chunk from the
 * SLOTS-th on takes one, so the semaphore's expected count (on the device) stays
 * max(0, sent - SLOTS) across launches.
 *
 * Work items: one per (pair, lane) for the lanes some message of the launch uses (host:
 * lanes_used): item i is pair i % npairs, lane i / npairs; CTA b owns
 * items b, b + G, ... A CTA never blocks on one item: it polls each of its items in turn
 * (a send item: is there credit?; a receive item: has the next header arrived?) and moves
 * one chunk of every item that can move, so any grid size is deadlock-free and the grid
 * stays at maco_comm_get_coresident_ctas() (every CTA a peer waits for is resident, also
 * when ranks share a GPU). The only blocking wait is a receiver's wait for the LL packets of
 * a chunk whose header it has seen: their sender is writing them and waits for nothing.
 * A CTA that moved nothing in a whole round counts towards MACO_DEVICE_TIMEOUT; on expiry it
 * records which wait (the first pending item: peer, semaphore or header slot) and stops.
 * A receiver whose count differs from the sender's records MACO_ERR_INVALID_ARGUMENT
 * (MACO_DEVICE_ERR_COUNT_MISMATCH: both byte counts) and writes nothing of that message.
 * Shared state: each item's state (message, chunk, sender's count) and each step's decision
 * live in shared memory. Every thread reads them, then a barrier, and only then may thread 0
 * write them; its writes are followed by a barrier before anyone reads again. All branches
 * depend only on shared values read that way, so the whole CTA takes the same ones and meets
 * the same barriers.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "algorithms/hier/hier.h"
#include "algorithms/p2p/p2p.h"
#include "maco/device/copy.h"
#include "maco/device/memory_channel.h"
#include "maco/device/packet.h"

enum {
    MACO__P2P_THREADS = 512,
    MACO__P2P_LL_CAP = MACO__P2P_LL_SLOT / 2, /* payload bytes of an LL chunk */
};

/* A CTA's items (at most MACO__P2P_MAX_ITEMS when the grid is one CTA). */
struct maco__p2p_state {
    uint64_t chunk[MACO__P2P_MAX_ITEMS]; /* the lane's next chunk of the current message */
    uint64_t bytes[MACO__P2P_MAX_ITEMS]; /* receive: the sender's byte count of it */
    uint16_t msg[MACO__P2P_MAX_ITEMS];   /* the current message: the pair's op index */
    uint8_t bad[MACO__P2P_MAX_ITEMS];    /* receive: counts differ; drain it */
    /* One step's decision, from thread 0 to the CTA. */
    uint64_t seq;
    uint32_t hdr_lo, hdr_hi;
    int go;
};

/* 8 bytes (the first `valid` of them real) at any alignment, as two words. */
static __device__ __forceinline__ uint2 maco__p2p_load8(const char *p, uint32_t valid)
{
    if (valid == 8u && ((uintptr_t)p & 7u) == 0)
        return *(const uint2 *)p;
    uint32_t lo = 0, hi = 0;
    for (uint32_t k = 0; k < valid; k++) {
        uint32_t b = (uint32_t)(uint8_t)p[k];
        if (k < 4)
            lo |= b << (8 * k);
        else
            hi |= b << (8 * (k - 4));
    }
    return make_uint2(lo, hi);
}

static __device__ __forceinline__ void maco__p2p_store8(char *p, uint2 v, uint32_t valid)
{
    if (valid == 8u && ((uintptr_t)p & 7u) == 0) {
        *(uint2 *)p = v;
        return;
    }
    for (uint32_t k = 0; k < valid; k++)
        p[k] = (char)(k < 4 ? v.x >> (8 * k) : v.y >> (8 * (k - 4)));
}

/* Slot index [source][lane][slot] of rank dst's p2p regions (n - 1 sources: p2p_plan.h). */
static __device__ __forceinline__ uint64_t maco__p2p_slot(int src, int dst, int lane, int lanes,
                                                          uint64_t seq)
{
    return ((uint64_t)maco__p2p_src_index(src, dst) * (uint64_t)lanes + (uint64_t)lane) *
               MACO__P2P_SLOTS +
           seq % MACO__P2P_SLOTS;
}

/* Thread 0: moves item k to its next chunk (or message) once chunk `c` of a message whose
 * lane carries `nl` chunks is done. */
static __device__ __forceinline__ void maco__p2p_advance(maco__p2p_state &st, int k, uint64_t c,
                                                         uint64_t nl)
{
    if (c + 1 >= nl) {
        st.chunk[k] = 0;
        st.msg[k] = (uint16_t)(st.msg[k] + 1);
    } else {
        st.chunk[k] = c + 1;
    }
}

/* One chunk of a send item, if the lane has credit. 1: moved, 0: not now. */
static __device__ __forceinline__ int
maco__p2p_send_step(const maco__p2p_args_t &a, maco__p2p_state &st, int k, int p, int lane)
{
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const int q = a.plan.pair_peer[p], lanes = a.lanes;
    const uint32_t mi = st.msg[k];
    const int opi = a.plan.pair_first[p] + (int)mi;
    const uint64_t c = st.chunk[k];
    uint64_t *sent = (uint64_t *)(a.buf + a.ctr_offset) + (uint64_t)q * lanes + lane;
    if (tid == 0) {
        const uint64_t s = *sent;
        st.go = s < MACO__P2P_SLOTS ||
                maco_semaphore_poll(&a.chans[(uint64_t)q * lanes + lane].semaphore);
        st.seq = s;
    }
    __syncthreads();
    const int go = st.go;
    const uint64_t s = st.seq;
    __syncthreads();
    if (!go)
        return 0;
    const maco__p2p_op_t &op = a.plan.ops[opi];
    const uint64_t B = op.bytes;
    const uint32_t L = maco__p2p_msg_lanes(B, (uint32_t)lanes); /* > lane: the loop checked */
    const bool ll = (a.plan.op_flags[opi] & MACO__P2P_FLAG_LL) != 0;
    const uint64_t cap = ll ? (uint64_t)MACO__P2P_LL_CAP : maco__p2p_copy_cap(B, a.chunk, L);
    const uint64_t j = (uint64_t)lane + (uint64_t)L * c;
    const uint64_t cb = maco__p2p_chunk_bytes(B, cap, j);
    const uint32_t flag = (uint32_t)(s + 1);
    const uint64_t slot = maco__p2p_slot(a.rank, q, lane, lanes, s);
    char *rb = a.peer_buf[q];
    maco_ll16_packet_t *hdr = (maco_ll16_packet_t *)(rb + a.hdr_offset) + slot;
    const char *src = (const char *)op.src + (cb > 0 ? j * cap : 0);
    if (ll) {
        maco_ll16_packet_t *pk =
            (maco_ll16_packet_t *)(rb + a.ll_offset + slot * MACO__P2P_LL_SLOT);
        const uint64_t npkt = (cb + 7) / 8;
        for (uint64_t i = tid; i < npkt; i += nthr) {
            const uint64_t left = cb - 8 * i;
            maco_ll16_store(pk + i, maco__p2p_load8(src + 8 * i, left < 8 ? (uint32_t)left : 8u),
                            flag);
        }
        if (tid == 0)
            maco_ll16_store(hdr, make_uint2((uint32_t)B, maco__p2p_hdr_hi(B, mi, 0, 1)), flag);
    } else {
        const uint32_t skew = (uint32_t)((uintptr_t)op.src & 15u); /* j * cap keeps it */
        maco_copy(rb + a.cp_offset + slot * a.cp_slot_bytes + skew, src, cb, tid, nthr);
        __syncthreads();
        if (tid == 0) {
            /* Release: the CTA's payload stores (ordered before by the barrier) are visible
             * to whoever sees this header's flag and fences. */
            __threadfence_system();
            maco_ll16_store(hdr, make_uint2((uint32_t)B, maco__p2p_hdr_hi(B, mi, skew, 0)), flag);
        }
    }
    if (tid == 0) {
        *sent = s + 1;
        maco__p2p_advance(st, k, c, maco__p2p_lane_chunks(B, cap, L, (uint32_t)lane));
    }
    __syncthreads();
    return 1;
}

/* One chunk of a receive item, if its header has arrived. 1: moved, 0: not now, -1: a wait
 * failed (recorded). */
static __device__ __forceinline__ int maco__p2p_recv_step(const maco__p2p_args_t &a,
                                                          maco__p2p_state &st, int k, int p,
                                                          int lane,
                                                          const maco_device_wait_bound_t &bound)
{
    const uint32_t tid = threadIdx.x, nthr = blockDim.x;
    const int q = a.plan.pair_peer[p], lanes = a.lanes;
    const uint32_t mi = st.msg[k];
    const int opi = a.plan.pair_first[p] + (int)mi;
    const uint64_t c = st.chunk[k];
    const uint64_t first_bytes = st.bytes[k];
    const bool was_bad = st.bad[k] != 0;
    uint64_t *recvd = (uint64_t *)(a.buf + a.ctr_offset) + (uint64_t)a.nranks * (uint64_t)lanes +
                      (uint64_t)q * lanes + lane;
    if (tid == 0) {
        const uint64_t r = *recvd;
        const maco_ll16_packet_t *hdr = (const maco_ll16_packet_t *)(a.buf + a.hdr_offset) +
                                        maco__p2p_slot(q, a.rank, lane, lanes, r);
        uint2 d = make_uint2(0u, 0u);
        const int got = maco_ll16_try_load(hdr, (uint32_t)(r + 1), &d);
        /* Acquire: a copy-mode payload was written before the header. LL payload packets
         * carry their own flag and need no fence. */
        if (got && (d.y & MACO__P2P_HDR_LL) == 0)
            __threadfence_system();
        st.go = got;
        st.seq = r;
        st.hdr_lo = d.x;
        st.hdr_hi = d.y;
    }
    __syncthreads();
    const int go = st.go;
    const uint64_t r = st.seq;
    const uint32_t lo = st.hdr_lo, hi = st.hdr_hi;
    __syncthreads();
    if (!go)
        return 0;
    const maco__p2p_op_t &op = a.plan.ops[opi];
    const uint64_t R = op.bytes;
    const uint64_t B = maco__p2p_hdr_bytes(lo, hi);
    const bool ll = (hi & MACO__P2P_HDR_LL) != 0;
    const uint32_t skew = (hi >> 24) & 15u;
    const uint32_t flag = (uint32_t)(r + 1);
    const uint64_t slot = maco__p2p_slot(q, a.rank, lane, lanes, r);
    const uint32_t hm = maco__p2p_hdr_msg(hi);
    if (hm != (mi & 0x7fu)) {
        /* A chunk of another message of the pair: that message's counts differed and the two
         * sides gave it different lanes (maco__p2p_msg_lanes). Write nothing; report that
         * message's receive against its send (B is the header's), as its own lane does. */
        const int other = hm < (uint32_t)a.plan.pair_nops[p] ? a.plan.pair_first[p] + (int)hm : opi;
        if (tid == 0)
            maco_device_error_record(&bound, MACO_ERR_INVALID_ARGUMENT, q,
                                     (int)a.plan.op_flags[other], MACO_DEVICE_ERR_COUNT_MISMATCH,
                                     a.plan.ops[other].bytes, B);
        return -1;
    }
    if (c != 0 && B != first_bytes) {
        /* Chunks of one message disagree: the lanes are out of step (a bug, or memory
         * overwritten): stop rather than misplace data. */
        if (tid == 0)
            maco_device_error_record(&bound, MACO_ERR_INTERNAL, q, (int)slot,
                                     MACO_DEVICE_ERR_COUNT_MISMATCH, first_bytes, B);
        return -1;
    }
    const bool bad = c == 0 ? B != R : was_bad;
    if (c == 0 && bad && tid == 0)
        maco_device_error_record(&bound, MACO_ERR_INVALID_ARGUMENT, q, (int)a.plan.op_flags[opi],
                                 MACO_DEVICE_ERR_COUNT_MISMATCH, R, B);
    /* The sender's lanes for its count (this lane is one of them: its chunk came). */
    const uint32_t L = maco__p2p_msg_lanes(B, (uint32_t)lanes);
    const uint64_t cap = ll ? (uint64_t)MACO__P2P_LL_CAP : maco__p2p_copy_cap(B, a.chunk, L);
    const uint64_t j = (uint64_t)lane + (uint64_t)L * c;
    const uint64_t cb = maco__p2p_chunk_bytes(B, cap, j);
    int fail = 0;
    if (!bad && cb > 0) {
        char *dst = (char *)op.dst + j * cap;
        if (ll) {
            const maco_ll16_packet_t *pk =
                (const maco_ll16_packet_t *)(a.buf + a.ll_offset + slot * MACO__P2P_LL_SLOT);
            const uint64_t npkt = (cb + 7) / 8;
            for (uint64_t i = tid; i < npkt; i += nthr) {
                uint2 v;
                if (maco_ll16_load(pk + i, flag, &v, &bound, q, (int)slot) != MACO_OK) {
                    fail = 1;
                    break;
                }
                const uint64_t left = cb - 8 * i;
                maco__p2p_store8(dst + 8 * i, v, left < 8 ? (uint32_t)left : 8u);
            }
        } else {
            maco_copy(dst, a.buf + a.cp_offset + slot * a.cp_slot_bytes + skew, cb, tid, nthr);
        }
    }
    /* Every thread is done with the slot before the sender may reuse it. */
    if (__syncthreads_or(fail))
        return -1;
    if (tid == 0) {
        maco_semaphore_signal(&a.chans[(uint64_t)q * lanes + lane].semaphore);
        *recvd = r + 1;
        if (c == 0) {
            st.bytes[k] = B;
            st.bad[k] = bad ? 1 : 0;
        }
        maco__p2p_advance(st, k, c, maco__p2p_lane_chunks(B, cap, L, (uint32_t)lane));
    }
    __syncthreads();
    return 1;
}

/* One chunk of a local copy (a send to this rank matched with a receive from it). */
static __device__ __forceinline__ int
maco__p2p_self_step(const maco__p2p_args_t &a, maco__p2p_state &st, int k, int p, int lane)
{
    const int opi = a.plan.pair_first[p] + st.msg[k];
    const maco__p2p_op_t &op = a.plan.ops[opi];
    const uint64_t c = st.chunk[k];
    /* Every thread has read the item's state (here and in the kernel's loop) before thread 0
     * advances it below. Without this barrier a late warp read the advanced state, copied
     * the wrong chunk and left the CTA's barriers out of step: compute-sanitizer racecheck
     * found it, which the functional runs had not. */
    __syncthreads();
    const uint32_t L = maco__p2p_msg_lanes(op.bytes, (uint32_t)a.lanes);
    const uint64_t cap = maco__p2p_copy_cap(op.bytes, a.chunk, L);
    const uint64_t j = (uint64_t)lane + (uint64_t)L * c;
    const uint64_t cb = maco__p2p_chunk_bytes(op.bytes, cap, j);
    if (cb > 0)
        maco_copy((char *)op.dst + j * cap, (const char *)op.src + j * cap, cb, threadIdx.x,
                  blockDim.x);
    /* No barrier needed before the next chunk: each thread's later copies touch other bytes,
     * and the kernel's end orders the data before later stream work. */
    if (threadIdx.x == 0)
        maco__p2p_advance(st, k, c, maco__p2p_lane_chunks(op.bytes, cap, L, (uint32_t)lane));
    __syncthreads();
    return 1;
}

/* Thread 0, when the CTA has waited too long: records what item k waits for. */
static __device__ void maco__p2p_record_timeout(const maco__p2p_args_t &a,
                                                const maco__p2p_state &st, int k, int p, int lane,
                                                const maco_device_wait_bound_t &bound)
{
    const int q = a.plan.pair_peer[p], lanes = a.lanes;
    if (a.plan.pair_dir[p] == MACO__P2P_SEND) {
        const maco_semaphore_device_t *s = &a.chans[(uint64_t)q * lanes + lane].semaphore;
        maco_device_error_record(&bound, MACO_ERR_TIMEOUT, q, s->id, MACO_DEVICE_WAIT_SEMAPHORE,
                                 *s->expected + 1, maco_load_relaxed_sys_u64(s->inbound));
    } else {
        const uint64_t r = *((const uint64_t *)(a.buf + a.ctr_offset) +
                             (uint64_t)a.nranks * (uint64_t)lanes + (uint64_t)q * lanes + lane);
        const uint64_t slot = maco__p2p_slot(q, a.rank, lane, lanes, r);
        const volatile uint32_t *hdr =
            (const volatile uint32_t *)((const maco_ll16_packet_t *)(a.buf + a.hdr_offset) + slot);
        maco_device_error_record(&bound, MACO_ERR_TIMEOUT, q, (int)slot, MACO_DEVICE_WAIT_PACKET,
                                 (uint32_t)(r + 1), hdr[1]);
    }
    (void)st;
    (void)k;
}

__global__ void __launch_bounds__(MACO__P2P_THREADS)
    maco__p2p_kernel(const __grid_constant__ maco__p2p_args_t a)
{
    __shared__ maco__p2p_state st;
    __shared__ int abort_flag;
    const int npairs = a.plan.npairs;
    const int nitems = npairs * a.lanes_used;
    const int g = (int)gridDim.x, b = (int)blockIdx.x;
    const int nmine = b < nitems ? (nitems - 1 - b) / g + 1 : 0;
    for (int k = (int)threadIdx.x; k < nmine; k += (int)blockDim.x) {
        st.chunk[k] = 0;
        st.bytes[k] = 0;
        st.msg[k] = 0;
        st.bad[k] = 0;
    }
    if (threadIdx.x == 0)
        abort_flag = 0;
    const maco_device_wait_bound_t bound = a.bound;
    maco_spin_state_t spin = { 0, 0 }; /* thread 0's */
    __syncthreads();
    for (;;) {
        int pending = -1, progressed = 0, failed = 0;
        for (int k = 0; k < nmine && !failed; k++) {
            const int i = b + k * g;
            const int p = i % npairs, lane = i / npairs;
            if (st.msg[k] >= a.plan.pair_nops[p])
                continue;
            /* Pending before a skip: an item whose message this lane skips still has the
             * pair's later messages (the loop must not end on a pass of skips only). */
            if (pending < 0)
                pending = k;
            /* A lane past the message's own lanes skips it (maco__p2p_msg_lanes; a receiver
             * goes by its own count). Every thread read st.msg[k] before thread 0 moves it. */
            const uint64_t mb = a.plan.ops[a.plan.pair_first[p] + st.msg[k]].bytes;
            if ((uint32_t)lane >= maco__p2p_msg_lanes(mb, (uint32_t)a.lanes)) {
                __syncthreads();
                if (threadIdx.x == 0)
                    st.msg[k] = (uint16_t)(st.msg[k] + 1);
                __syncthreads();
                progressed = 1;
                continue;
            }
            const int dir = a.plan.pair_dir[p];
            const int res = dir == MACO__P2P_SEND   ? maco__p2p_send_step(a, st, k, p, lane)
                            : dir == MACO__P2P_RECV ? maco__p2p_recv_step(a, st, k, p, lane, bound)
                                                    : maco__p2p_self_step(a, st, k, p, lane);
            if (res < 0)
                failed = 1;
            else if (res > 0)
                progressed = 1;
        }
        /* Every thread took the same branches (all decisions come through shared memory). */
        if (failed || pending < 0)
            break;
        if (progressed) {
            spin.start_ns = 0;
            spin.iterations = 0;
            continue;
        }
        if (threadIdx.x == 0) {
            const maco_status_t w = maco_spin_check(&bound, &spin);
            if (w == MACO_ERR_TIMEOUT) {
                const int i = b + pending * g;
                maco__p2p_record_timeout(a, st, pending, i % npairs, i / npairs, bound);
            }
            abort_flag = w != MACO_OK;
        }
        __syncthreads();
        const int stop = abort_flag;
        __syncthreads();
        if (stop)
            break;
    }
}

extern "C" cudaError_t maco__launch_p2p(const maco__p2p_args_t *args, int blocks, int threads,
                                        cudaStream_t stream)
{
    maco__p2p_kernel<<<blocks, threads, 0, stream>>>(*args);
    return cudaGetLastError();
}

extern "C" cudaError_t maco__preload_p2p(void)
{
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, maco__p2p_kernel);
    if (e == cudaSuccess)
        e = maco__preload_p2p_internode();
    if (e == cudaSuccess)
        e = maco__preload_hier_a2a();
    return e;
}
