/*
 * ep_kernels.cu - expert-parallel dispatch and combine (maco/ep.h): one kernel each, the
 * same for both modes but for where the rows of a local expert start (ep_layout.h has the
 * buffer; ep_layout.c the same arithmetic on the host). This file: the protocol of both and
 * the dispatch kernel; ep_combine.cu: the combine kernel; ep_device.cuh: what they share.
 *
 * Dispatch, sequence number s (this buffer's dispatches so far + 1, kept on the device):
 *   1. CTA 0 routes this rank's entries: slot of entry (t, k) = its position among this
 *      rank's entries for the same expert, in token order (handle's slot array), and the
 *      count per expert; an invalid entry (expert outside [-1, E), or repeated in its row)
 *      is noted, the first in (t, k) order. It writes the counts and that problem into its
 *      count row at every rank (half s & 1 of the count rows), then release-stores s in
 *      each rank's CNT_FLAG[s & 1][me].
 *   2. Every CTA waits (acquire) for every rank's CNT_FLAG to reach s, then computes from
 *      the n count rows, identically on every rank: where each expert's rows start at its
 *      rank, where this rank's rows go among them (after those of lower ranks), and whether
 *      to stop: some rank's routing problem, or (normal mode) a rank that would receive more
 *      than the receive region holds. Stopping is thus decided alike everywhere.
 *   3. Unless stopping: entries are dealt to warps over the grid (low latency: round robin;
 *      normal: MACO__EP_GRAB at a time from a counter); a warp copies the token's
 *      row into the expert's rank's receive region at its row (16-byte stores through the
 *      peer mapping), or quantizes it to e4m3 and per-128 scales on the way
 *      (maco_ep_dispatch_fp8: maco__ep_quant_row), and writes the row's metadata {source,
 *      entry, weight}.
 *   4. Every CTA signals every rank (release add of 1 on DATA_DONE[me] there) and waits
 *      until DATA_DONE[r] here reaches s * ctas for every rank r: every row for this rank
 *      has landed. Then it writes the outputs for its local experts (counts, offsets,
 *      weights, the handle's per-row metadata), and the last CTA to finish advances s.
 * Reuse. A rank writes into rank R's receive region for dispatch s only after reading R's
 * count row of s, which R's dispatch s writes at its start: R's stream has finished what came
 * before, so work that read recv_x of dispatch s - 1 on R's stream is done. Count rows
 * alternate halves: a rank writes half s & 1 again at dispatch s + 2, which it starts after
 * finishing s + 1, which needed R's DATA_DONE of s + 1, which R signals after it read the
 * count rows of s.
 *
 * Combine, its own sequence number c:
 *   1. CTA 0 checks the handle (its buffer id, its dispatch's status, num_tokens) and
 *      release-stores c << 8 | status into READY[me] at every rank (the status's value and
 *      limit in READY_INFO first). READY also says "my combine region is free": the combine
 *      before this one on this rank's stream has finished reading it.
 *   2. Every CTA waits for every rank's READY to reach c; any status stops every rank.
 *   3. Unless stopping, the sender half of each CTA's warps (MACO__EP_SEND_WARPS): CTA b
 *      takes a contiguous share of the rows this rank received (the handle's metadata),
 *      sorts them by token group of their source entry (tokens [g * GT, (g + 1) * GT) of the
 *      source rank, GT = maco__ep_group_tokens(max_tokens)) in shared memory, and for g = 0,
 *      1, ... copies group g's rows to the combine regions of their sources at [t][k], then
 *      adds 1 to GROUP[g][me] at every rank (also when stopping, with no rows, so that the
 *      counts stay in step). A share larger than MACO__EP_SORT_ROWS is copied unsorted
 *      before the first signal.
 *   4-5. Meanwhile the summer half, for each group g of this rank's tokens: waits until
 *      GROUP[g][r] = c * ctas for every rank r, then y[t] = sum over k in order of
 *      w[t][k] * row[t][k] (float32, fused multiply-adds, one rounding to bfloat16) for its
 *      tokens t of the group and the entries the handle's slot array says were sent. So the
 *      sums of early groups overlap the copies of later ones. With one group (max_tokens
 *      <= 128: maco__ep_group_tokens) every warp copies, then every warp sums. The last CTA
 *      advances c.
 *
 * Ordering. Rows, metadata and count words are plain stores (local or through the peer
 * mapping); the CTA's threads finish them, __syncthreads(), and one thread then does a
 * system-scope release (st.release.sys or red.release.sys.add, which are cumulative over
 * what the barrier ordered before them); the waiter's system-scope acquire load, followed by
 * __syncthreads(), makes them visible to its CTA, which reads them with ld.global.cg (L2,
 * never a stale L1 line). Every wait is bounded by the communicator's MACO_DEVICE_TIMEOUT and
 * reports the peer (MACO_DEVICE_WAIT_EP); a CTA whose wait failed returns, and the others
 * leave their waits at the communicator's error.
 *
 * Co-residency: every CTA waits for CTAs of every rank, so the host launches at most the
 * co-resident bound (maco_comm_get_coresident_ctas, halved when ranks share a GPU), and the
 * same number on every rank (the done counters count CTAs).
 */
#include "algorithms/ep/ep_device.cuh"

/* A warp quantizes one bfloat16 row of `hidden` elements (a multiple of 128) from src to
 * dst as maco_ep_dispatch_fp8 documents: the e4m3 values at dst[0, hidden), the float32
 * scale of block b at dst + hidden + 4 b. A half-warp takes a block (8 elements per lane,
 * one 16-byte load), its amax reduced over the 16 lanes; four steps of two blocks each are
 * loaded before any is used, so that 64 bytes per lane are in flight as in the plain copy
 * (one load at a time left the warp waiting on each: 2.5x slower than the copy). Each half
 * is wholly inside the row or wholly past it (blocks are 128-aligned). */
static __device__ __forceinline__ void maco__ep_quant_row(char *dst, const char *src, int hidden,
                                                          int lane)
{
    enum { U = 4, STEP = 2 * MACO_EP_FP8_BLOCK }; /* elements per warp step: two blocks */
    const uint4 *s = (const uint4 *)src;
    float *scales = (float *)(dst + hidden);
    for (int base = 0; base < hidden; base += U * STEP) {
        uint4 w[U];
        for (int u = 0; u < U; u++) {
            const int at = base + u * STEP + lane * 8;
            w[u] = at < hidden ? __ldg(s + at / 8) : make_uint4(0u, 0u, 0u, 0u);
        }
        for (int u = 0; u < U; u++) {
            const int at = base + u * STEP + lane * 8;
            const uint32_t p[4] = { w[u].x, w[u].y, w[u].z, w[u].w };
            float v[8];
            float amax = 0.0f;
            for (int j = 0; j < 4; j++) {
                v[2 * j] = __uint_as_float(p[j] << 16);
                v[2 * j + 1] = __uint_as_float(p[j] & 0xffff0000u);
                amax = fmaxf(amax, fmaxf(fabsf(v[2 * j]), fabsf(v[2 * j + 1])));
            }
            for (int d = 8; d > 0; d >>= 1) /* within the half-warp */
                amax = fmaxf(amax, __shfl_xor_sync(MACO__EP_FULL, amax, d));
            if (at >= hidden)
                continue;
            amax = fmaxf(amax, MACO_EP_FP8_MIN_AMAX);
            const float inv = MACO_EP_FP8_MAX / amax;
            uint32_t q[2] = { 0u, 0u }; /* pairs: .x in the low byte, as one by one */
            for (int j = 0; j < 4; j++)
                q[j / 2] |=
                    (uint32_t)__nv_cvt_float2_to_fp8x2(
                        make_float2(v[2 * j] * inv, v[2 * j + 1] * inv), __NV_SATFINITE, __NV_E4M3)
                    << (16 * (j % 2));
            *(uint2 *)(dst + at) = make_uint2(q[0], q[1]);
            if ((lane & 15) == 0)
                scales[at / MACO_EP_FP8_BLOCK] = amax / MACO_EP_FP8_MAX;
        }
    }
}

/* The problem of entry k of a row (ep_layout.c, maco__ep_route: the same rules). */
static __device__ __forceinline__ int maco__ep_check(const int64_t *row, int k, int64_t v, int E,
                                                     int *first_k)
{
    if (v < -1 || v >= E)
        return MACO__EP_BAD_EXPERT;
    if (v < 0)
        return MACO__EP_OK;
    for (int j = 0; j < k; j++)
        if (__ldg(row + j) == v) {
            *first_k = j;
            return MACO__EP_REPEAT;
        }
    return MACO__EP_OK;
}

/* ------------------------------------------------------------------ dispatch */

/* CTA 0, step 1 of dispatch (file comment): routes this rank's T entries (topk_idx) into the
 * handle's slot array, using `chunk` (this rank's routing scratch) and `mask_all`
 * (MACO__EP_WARPS x E words of shared memory), and writes the counts into this rank's count
 * row (at row_off) at every rank; the first invalid entry goes to *bad_entry. */
static_assert(MACO_EP_MAX_TOPK <= 32, "maco__ep_route keeps one bit per entry of a row");

static __device__ void maco__ep_route(const int64_t *topk_idx, int T, int K, int E, int n,
                                      int32_t *chunk, int32_t *slot, char *const *peer,
                                      uint64_t row_off, uint32_t *mask_all, int *bad_entry)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nchunks = (T + 31) / 32;
    uint32_t *mask = mask_all + (size_t)warp * (size_t)E;

    /* Pass 1: per chunk of 32 tokens (one warp), which lanes name each expert; the chunk's
     * count per expert; the first invalid entry. A lane finds a repeated expert in its row by
     * its own bit being already set in the mask (atomicOr's old value): no loop over the
     * entries before it. */
    for (int c = warp; c < nchunks; c += MACO__EP_WARPS) {
        for (int e = lane; e < E; e += 32)
            mask[e] = 0u;
        __syncwarp();
        const int t = c * 32 + lane;
        if (t < T) {
            const int64_t *row = topk_idx + (int64_t)t * K;
            for (int k = 0; k < K; k++) {
                const int64_t v = __ldg(row + k);
                if (v < -1 || v >= E)
                    atomicMin(bad_entry, t * K + k);
                else if (v >= 0 && (atomicOr(&mask[v], 1u << lane) >> lane & 1u) != 0u)
                    atomicMin(bad_entry, t * K + k);
            }
        }
        __syncwarp();
        for (int e = lane; e < E; e += 32)
            chunk[(size_t)c * (size_t)E + (size_t)e] = __popc(mask[e]);
        __syncwarp();
    }
    __syncthreads();

    /* Pass 2: per expert, the exclusive prefix over chunks (in place) and the count, which
     * goes straight into this rank's count row at every rank. Loads in batches of 8 so
     * they are in flight together. */
    for (int e = tid; e < E; e += blockDim.x) {
        int run = 0;
        for (int c0 = 0; c0 < nchunks; c0 += 8) {
            int v[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = c0 + j < nchunks ? chunk[(size_t)(c0 + j) * (size_t)E + (size_t)e] : 0;
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (c0 + j < nchunks) {
                    chunk[(size_t)(c0 + j) * (size_t)E + (size_t)e] = run;
                    run += v[j];
                }
        }
        for (int r = 0; r < n; r++)
            ((int32_t *)(peer[r] + row_off))[MACO__EP_ROW_HEADER + e] = run;
    }
    __syncthreads();

    /* Pass 3: each entry's slot = its chunk's base for the expert + the lanes before it in
     * the chunk that name the expert; a repeated entry (its lane's bit already set: `rep`,
     * one bit per k) gets none. The bases of eight entries are loaded before any slot is
     * stored, so that their latencies overlap. */
    for (int c = warp; c < nchunks; c += MACO__EP_WARPS) {
        for (int e = lane; e < E; e += 32)
            mask[e] = 0u;
        __syncwarp();
        const int t = c * 32 + lane;
        const int64_t *row = topk_idx + (int64_t)t * K;
        uint32_t rep = 0u;
        if (t < T) {
            for (int k = 0; k < K; k++) {
                const int64_t v = __ldg(row + k);
                if (v >= 0 && v < E && (atomicOr(&mask[v], 1u << lane) >> lane & 1u) != 0u)
                    rep |= 1u << k;
            }
        }
        __syncwarp();
        if (t < T) {
            for (int k0 = 0; k0 < K; k0 += 8) {
                int32_t s[8];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int64_t v = k0 + j < K ? __ldg(row + k0 + j) : -1;
                    s[j] = -1;
                    if (v >= 0 && v < E && (rep >> (k0 + j) & 1u) == 0u)
                        s[j] = chunk[(size_t)c * (size_t)E + (size_t)v] +
                               __popc(mask[v] & ((1u << lane) - 1u));
                }
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (k0 + j < K)
                        slot[t * K + k0 + j] = s[j];
            }
        }
        __syncwarp();
    }
}

/* Thread 0, dispatch step 1: the header of this rank's count row: zeros, or the first
 * invalid entry (`bad_entry`: its index; INT_MAX: none) with its problem, token, k, value
 * and limit. */
static __device__ void maco__ep_row_header(const maco__ep_args_t &a, int bad_entry, int32_t *hdr)
{
    const int K = a.g.topk, E = a.g.num_experts;
    int32_t h[MACO__EP_ROW_HEADER] = { 0, 0, 0, 0, 0, 0, 0, 0 };
    if (bad_entry != INT_MAX) {
        const int i = bad_entry, t = i / K, k = i % K;
        const int64_t *row = a.topk_idx + (int64_t)t * K;
        const int64_t v = __ldg(row + k);
        int first_k = -1;
        h[0] = maco__ep_check(row, k, v, E, &first_k);
        h[1] = t;
        h[2] = k;
        h[3] = (int32_t)(uint32_t)((uint64_t)v & 0xffffffffu);
        h[4] = (int32_t)(uint32_t)((uint64_t)v >> 32);
        h[5] = h[0] == MACO__EP_BAD_EXPERT ? E : first_k;
    }
    for (int j = 0; j < MACO__EP_ROW_HEADER; j++)
        hdr[j] = h[j];
}

/* Thread 0, dispatch step 2: the first problem any rank reported in its count row's header
 * (`cnt_half`: this dispatch's count rows), else (normal mode) the first rank whose rows
 * (`rows`) exceed the receive buffer; code MACO__EP_OK when there is none. */
static __device__ maco__ep_bad_t maco__ep_dispatch_check(const maco__ep_args_t &a,
                                                         const char *cnt_half, const int64_t *rows,
                                                         bool ll)
{
    const int n = a.g.nranks;
    maco__ep_bad_t bad = { 0, 0, 0, 0, 0, 0 };
    for (int r = 0; r < n && bad.code == MACO__EP_OK; r++) {
        const int32_t *h = (const int32_t *)(cnt_half + (uint64_t)r * a.o.cnt_row_bytes);
        const int code = __ldcg(h);
        if (code != MACO__EP_OK) {
            bad.code = code;
            bad.rank = r;
            bad.token = __ldcg(h + 1);
            bad.k = __ldcg(h + 2);
            bad.value = (int64_t)(((uint64_t)(uint32_t)__ldcg(h + 4) << 32) |
                                  (uint64_t)(uint32_t)__ldcg(h + 3));
            bad.limit = __ldcg(h + 5);
        }
    }
    for (int R = 0; R < n && bad.code == MACO__EP_OK && !ll; R++)
        if (rows[R] > a.g.recv_rows) {
            bad.code = MACO__EP_OVERFLOW;
            bad.rank = R;
            bad.token = -1;
            bad.k = -1;
            bad.value = rows[R];
            bad.limit = a.g.recv_rows;
        }
    return bad;
}

/* Dispatch's end (every thread of the CTA): the handle's per-expert table and the receive
 * metadata of the local experts this CTA owns, the caller's counts, offsets and weights;
 * CTA 0's thread 0 then writes the handle's header and the report. `tot` and `base`: rows
 * and first row of every expert; `rows`: rows per rank. */
static __device__ void maco__ep_dispatch_finish(const maco__ep_args_t &a, const int32_t *tot,
                                                const int32_t *base, const int64_t *rows,
                                                const maco__ep_bad_t &bad, bool abort, bool ll,
                                                uint64_t seq)
{
    const int tid = threadIdx.x, me = a.rank, L = a.g.local_experts;
    char *const handle = (char *)a.handle;
    if (!abort) {
        int32_t *hexp = (int32_t *)(handle + a.o.h_exp_off);
        int2 *hmeta = (int2 *)(handle + a.o.h_meta_off);
        const uint4 *meta = (const uint4 *)(a.buf + a.o.meta_off);
        /* One warp per local expert, so that a CTA's experts proceed together. */
        const int lane = tid & 31;
        for (int l = (int)blockIdx.x * MACO__EP_WARPS + (tid >> 5); l < L;
             l += (int)gridDim.x * MACO__EP_WARPS) {
            const int e = me * L + l, cnt = tot[e], b = base[e];
            for (int j = lane; j < cnt; j += 32) {
                const uint4 m = __ldcg(meta + b + j);
                hmeta[b + j] = make_int2((int)m.x, (int)m.y);
                if (a.recv_weights != nullptr)
                    a.recv_weights[b + j] = __uint_as_float(m.z);
            }
            if (lane == 0) {
                a.recv_counts[l] = cnt;
                hexp[l] = b;
                hexp[L + l] = cnt;
                if (a.recv_offsets != nullptr)
                    a.recv_offsets[l] = b;
            }
        }
    }
    if (blockIdx.x == 0 && tid == 0) {
        const int64_t nrows = ll ? (int64_t)L * a.g.expert_cap : rows[me];
        if (!abort && a.recv_offsets != nullptr)
            a.recv_offsets[L] = (int32_t)nrows;
        maco__ep_handle_header_t *h = (maco__ep_handle_header_t *)handle;
        h->status = abort ? bad.code : MACO__EP_OK;
        h->buffer_id = a.buffer_id;
        h->num_tokens = a.num_tokens;
        h->nranks = a.g.nranks;
        h->local_experts = L;
        h->topk = a.g.topk;
        h->num_recv = abort ? 0 : rows[me];
        h->seq = seq;
        h->magic = MACO__EP_HANDLE_MAGIC;
        maco__ep_report(a.report, a.ticket, a.want_report, 0, bad, abort ? -1 : rows[me]);
    }
}

/* Dispatch step 3: every entry of this rank to its expert's rank, one warp per entry. In normal
 * mode warps take MACO__EP_GRAB entries at a time from a counter (DISP_WORK, back to 0 at the
 * kernel's end): dealt round robin, some CTAs finished their copies long before others, and
 * every CTA waits for the last (algorithms/tuning.h, EP_DISPATCH_GRAB). Low latency keeps the round
 * robin (its 1024 entries are even enough; the counter's round trips cost 2 us there). */
static __device__ void maco__ep_dispatch_rows(const maco__ep_args_t &a, char *const *peer,
                                              const int32_t *s_base, const int32_t *s_off, bool ll)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int me = a.rank, L = a.g.local_experts, K = a.g.topk, T = a.num_tokens;
    const uint64_t rowb = a.g.row_bytes;
    char *const buf = a.buf;
    const char *const handle = (const char *)a.handle;
    const int32_t *slot = (const int32_t *)(handle + a.o.h_slot_off);
    const int entries = T * K, W = (int)gridDim.x * MACO__EP_WARPS;
    const int step = ll ? 1 : MACO__EP_GRAB;
    unsigned *work = (unsigned *)(buf + MACO__EP_CTRL_DISP_WORK);
    auto next = [&](int i0) {
        if (ll)
            return i0 < 0 ? (int)blockIdx.x * MACO__EP_WARPS + warp : i0 + W;
        int got = 0;
        if (lane == 0)
            got = (int)atomicAdd(work, (unsigned)MACO__EP_GRAB);
        return __shfl_sync(MACO__EP_FULL, got, 0);
    };
    for (int i0 = next(-1); i0 < entries; i0 = next(i0)) {
        for (int i = i0; i < min(entries, i0 + step); i++) {
            const int s = __ldcg(slot + i);
            if (s < 0)
                continue;
            const int t = i / K;
            const int e = (int)__ldg(a.topk_idx + i);
            const int R = e / L;
            const int64_t row = (int64_t)s_base[e] + s_off[e] + s;
            char *dst = peer[R] + a.o.recv_off + (uint64_t)row * rowb;
            const char *src = (const char *)a.x + (uint64_t)t * rowb;
            if (a.fp8)
                maco__ep_quant_row(dst, src, a.g.hidden, lane);
            else
                maco__ep_copy_row(dst, src, rowb, lane);
            if (lane == 0) {
                const float w = a.topk_weights != nullptr ? __ldg(a.topk_weights + i) : 0.0f;
                *(uint4 *)(peer[R] + a.o.meta_off + (uint64_t)row * 16u) =
                    make_uint4((uint32_t)me, (uint32_t)i, __float_as_uint(w), 0u);
            }
        }
    }
}

__global__ void __launch_bounds__(MACO__EP_THREADS)
    maco__ep_dispatch_kernel(const __grid_constant__ maco__ep_args_t a)
{
    extern __shared__ __align__(16) unsigned char maco__ep_smem[];
    __shared__ char *peer[MACO_EP_MAX_RANKS];
    __shared__ uint64_t s_seq;
    __shared__ int s_bad_entry, s_abort;
    __shared__ int32_t s_hdr[MACO__EP_ROW_HEADER];
    __shared__ int64_t s_rows[MACO_EP_MAX_RANKS];
    __shared__ maco__ep_bad_t s_bad;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = a.g.nranks, me = a.rank, E = a.g.num_experts, L = a.g.local_experts;
    const int K = a.g.topk, T = a.num_tokens;
    const bool ll = a.g.mode == MACO_EP_LOW_LATENCY;
    const maco_device_wait_bound_t bound = a.bound;
    char *const buf = a.buf;
    char *const handle = (char *)a.handle;

    if (tid < MACO_EP_MAX_RANKS)
        peer[tid] = a.peer[tid];
    if (tid == 0) {
        s_seq = *(volatile uint64_t *)(buf + MACO__EP_CTRL_DISP_SEQ) + 1u;
        s_bad_entry = INT_MAX;
        s_abort = 0;
    }
    __syncthreads();
    const uint64_t seq = s_seq;
    const int parity = (int)(seq & 1u);
    const char *cnt_half = buf + a.o.cnt_off + (uint64_t)parity * (uint64_t)n * a.o.cnt_row_bytes;

    /* 1. Routing and this rank's count row (CTA 0). */
    const uint64_t row_off =
        a.o.cnt_off + ((uint64_t)parity * (uint64_t)n + (uint64_t)me) * a.o.cnt_row_bytes;
    if (blockIdx.x == 0) {
        maco__ep_route(a.topk_idx, T, K, E, n, (int32_t *)(buf + a.o.chunk_off),
                       (int32_t *)(handle + a.o.h_slot_off), peer, row_off,
                       (uint32_t *)maco__ep_smem, &s_bad_entry);
        __syncthreads();
        if (tid == 0)
            maco__ep_row_header(a, s_bad_entry, s_hdr);
        __syncthreads();
        if (tid < MACO__EP_ROW_HEADER * n)
            ((int32_t *)(peer[tid / MACO__EP_ROW_HEADER] + row_off))[tid % MACO__EP_ROW_HEADER] =
                s_hdr[tid % MACO__EP_ROW_HEADER];
        /* The slots, the counts and the headers are stored: publish the row everywhere. */
        __syncthreads();
        if (tid < n)
            maco__ep_store_release((uint64_t *)(peer[tid] + MACO__EP_CTRL_CNT_FLAG) +
                                       (size_t)parity * MACO_EP_MAX_RANKS + (size_t)me,
                                   seq);
    }

    /* 2. Every rank's count row of this dispatch. */
    bool failed = false;
    if (tid < n)
        failed = maco__ep_wait((const uint64_t *)(buf + MACO__EP_CTRL_CNT_FLAG) +
                                   (size_t)parity * MACO_EP_MAX_RANKS + (size_t)tid,
                               seq, 0, &bound, tid, MACO__EP_W_COUNTS);
    if (__syncthreads_or(failed))
        return;
    int32_t *s_off = (int32_t *)maco__ep_smem; /* [E]: rows of lower ranks for expert e */
    int32_t *s_tot = s_off + E;                /* [E]: rows of every rank for expert e */
    int32_t *s_base = s_tot + E;               /* [E]: expert e's first row at its rank */
    for (int e = tid; e < E; e += blockDim.x) {
        int off = 0, tot = 0;
        for (int r = 0; r < n; r++) {
            const int c = __ldcg((const int *)(cnt_half + (uint64_t)r * a.o.cnt_row_bytes) +
                                 MACO__EP_ROW_HEADER + e);
            off += r < me ? c : 0;
            tot += c;
        }
        s_off[e] = off;
        s_tot[e] = tot;
    }
    __syncthreads();
    /* Warp R lays out rank R's local experts: fixed capacity each (low latency), or packed
     * (normal: an exclusive scan of their totals, 32 at a time). */
    if (warp < n) {
        const int R = warp;
        int64_t run = 0;
        for (int l0 = 0; l0 < L; l0 += 32) {
            const int l = l0 + lane;
            const int v = l < L ? s_tot[R * L + l] : 0;
            int incl = v;
            for (int d = 1; d < 32; d <<= 1) {
                const int u = __shfl_up_sync(MACO__EP_FULL, incl, d);
                if (lane >= d)
                    incl += u;
            }
            if (l < L)
                s_base[R * L + l] =
                    ll ? (int32_t)((int64_t)l * a.g.expert_cap) : (int32_t)(run + incl - v);
            run += __shfl_sync(MACO__EP_FULL, incl, 31);
        }
        if (lane == 0)
            s_rows[R] = run;
    }
    __syncthreads();
    if (tid == 0) {
        s_bad = maco__ep_dispatch_check(a, cnt_half, s_rows, ll);
        s_abort = s_bad.code != MACO__EP_OK;
    }
    __syncthreads();
    const bool abort = s_abort != 0;

    /* 3. Every entry of this rank to its expert's rank. */
    if (!abort)
        maco__ep_dispatch_rows(a, peer, s_base, s_off, ll);

    /* 4. This CTA is done writing to every rank; wait until every rank's CTAs are. */
    __syncthreads();
    if (tid < n)
        maco_red_add_release_sys_u64((uint64_t *)(peer[tid] + MACO__EP_CTRL_DATA_DONE) + me, 1u);
    failed = false;
    if (tid < n)
        failed = maco__ep_wait((const uint64_t *)(buf + MACO__EP_CTRL_DATA_DONE) + tid,
                               seq * (uint64_t)gridDim.x, 0, &bound, tid, MACO__EP_W_ROWS);
    if (__syncthreads_or(failed))
        return;

    maco__ep_dispatch_finish(a, s_tot, s_base, s_rows, s_bad, abort, ll, seq);
    maco__ep_advance(buf, MACO__EP_CTRL_DISP_SEQ, MACO__EP_CTRL_DISP_DONE, MACO__EP_CTRL_DISP_WORK,
                     seq);
}

/* ------------------------------------------------------------------ host side */

extern "C" size_t maco__ep_dispatch_smem(const maco__ep_geom_t *g)
{
    /* Routing masks (MACO__EP_WARPS words per expert), reused for 3 words per expert. */
    size_t e = (size_t)g->num_experts;
    size_t route = (size_t)MACO__EP_WARPS * e * 4u, layout = 3u * e * 4u;
    return route > layout ? route : layout;
}

extern "C" cudaError_t maco__ep_prepare_kernels(size_t dispatch_smem, size_t combine_smem)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, maco__ep_dispatch_kernel);
    if (e == cudaSuccess)
        e = maco__ep_combine_load();
    /* The most any buffer may need (MACO_EP_MAX_EXPERTS), never less: the attribute is the
     * kernel's, shared by every buffer of this device. */
    maco__ep_geom_t most;
    memset(&most, 0, sizeof(most));
    most.num_experts = MACO_EP_MAX_EXPERTS;
    most.local_experts = MACO_EP_MAX_EXPERTS;
    const size_t dmax = maco__ep_dispatch_smem(&most), cmax = maco__ep_combine_smem(&most);
    if (e == cudaSuccess && dispatch_smem <= dmax && dmax > 48u * 1024u)
        e = cudaFuncSetAttribute(maco__ep_dispatch_kernel,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dmax);
    if (e == cudaSuccess && combine_smem <= cmax && cmax > 48u * 1024u)
        e = maco__ep_combine_set_smem((int)cmax);
    if (e == cudaSuccess && (dispatch_smem > dmax || combine_smem > cmax))
        e = cudaErrorInvalidValue;
    return e;
}

extern "C" cudaError_t maco__ep_launch_dispatch(const maco__ep_args_t *a, int ctas, size_t smem,
                                                cudaStream_t stream)
{
    maco__ep_dispatch_kernel<<<ctas, MACO__EP_THREADS, smem, stream>>>(*a);
    return cudaGetLastError();
}
