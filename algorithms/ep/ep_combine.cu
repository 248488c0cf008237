/*
 * ep_combine.cu - the expert-parallel combine kernel (maco/ep.h; ep_kernels.cu's file comment
 * has the protocol, "Combine", whose step numbers the comments here use) and its host side.
 */
#include "algorithms/ep/ep_device.cuh"

/* ------------------------------------------------------------------ combine */

static __device__ __forceinline__ float maco__ep_bf16_lo(uint32_t w)
{
    return __uint_as_float(w << 16);
}

static __device__ __forceinline__ float maco__ep_bf16_hi(uint32_t w)
{
    return __uint_as_float(w & 0xffff0000u);
}

static __device__ __forceinline__ uint32_t maco__ep_bf16_pack(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

/* Thread 0 of CTA 0, combine step 1: checks the handle against this buffer and call
 * (another buffer's or a failed dispatch's handle, another token count) and stores the
 * outcome, then the released ready word (seq << 8 | code), at every rank. */
static __device__ void maco__ep_combine_status(const maco__ep_args_t &a, char *const *peer,
                                               uint64_t seq)
{
    const int n = a.g.nranks, me = a.rank;
    const maco__ep_handle_header_t *h = (const maco__ep_handle_header_t *)a.handle;
    int code = MACO__EP_OK;
    int32_t value = 0, limit = 0;
    if (h->magic != MACO__EP_HANDLE_MAGIC || h->buffer_id != a.buffer_id || h->nranks != n ||
        h->local_experts != a.g.local_experts || h->topk != a.g.topk) {
        code = MACO__EP_FOREIGN;
    } else if (h->status != MACO__EP_OK) {
        code = MACO__EP_FAILED;
        value = h->status;
    } else if (h->num_tokens != a.num_tokens) {
        code = MACO__EP_TOKENS;
        value = a.num_tokens;
        limit = h->num_tokens;
    }
    for (int r = 0; r < n; r++) {
        *(volatile uint64_t *)((uint64_t *)(peer[r] + MACO__EP_CTRL_READY_INFO) + me) =
            (uint64_t)(uint32_t)value | ((uint64_t)(uint32_t)limit << 32);
    }
    for (int r = 0; r < n; r++)
        maco__ep_store_release((uint64_t *)(peer[r] + MACO__EP_CTRL_READY) + me,
                               (seq << 8) | (uint64_t)code);
}

/* Combine step 5 for tokens [t0, t1): y[t] = sum over k of w[t][k] * row[t][k] in k order
 * (fp32, one rounding to bf16 at the end), 8 elements (16 bytes) per item, items dealt to
 * `nthr` threads (this one is `me`), P items per thread at a time. Eight entries' vectors of
 * each item are loaded before any is added, so that their memory latencies overlap, and
 * without waiting for their slots: an entry that was not sent has a row in the combine region
 * too ([T][K]), read and left out of the sum. */
static __device__ void maco__ep_combine_sum(const maco__ep_args_t &a, int t0, int t1, int64_t me,
                                            int64_t nthr)
{
    enum { P = 2 };
    const int K = a.g.topk;
    const uint64_t rowb = a.g.row_bytes;
    const int32_t *slot = (const int32_t *)((const char *)a.handle + a.o.h_slot_off);
    const int64_t vecs = a.g.hidden / 8;
    const int64_t work = (int64_t)(t1 - t0) * vecs;
    const int64_t stride = nthr;
    for (int64_t i0 = me; i0 < work; i0 += P * stride) {
        int t[P];
        int64_t v[P];
        float acc[P][8];
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int64_t i = i0 + p * stride < work ? i0 + p * stride : i0;
            t[p] = t0 + (int)(i / vecs);
            v[p] = i % vecs;
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[p][j] = 0.0f;
        }
        for (int k0 = 0; k0 < K; k0 += 8) {
            uint4 u[P][8];
            float w[P][8];
            unsigned used[P];
#pragma unroll
            for (int p = 0; p < P; p++) {
                used[p] = 0u;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int entry = t[p] * K + (k0 + j < K ? k0 + j : K - 1);
                    used[p] |= k0 + j < K && __ldg(slot + entry) >= 0 ? 1u << j : 0u;
                    w[p][j] = __ldg(a.topk_weights + entry);
                    u[p][j] = __ldcg(
                        (const uint4 *)(a.buf + a.o.comb_off + (uint64_t)entry * rowb) + v[p]);
                }
            }
#pragma unroll
            for (int p = 0; p < P; p++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if ((used[p] >> j & 1u) == 0u)
                        continue;
                    const uint32_t words[4] = { u[p][j].x, u[p][j].y, u[p][j].z, u[p][j].w };
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        acc[p][2 * q] =
                            __fmaf_rn(w[p][j], maco__ep_bf16_lo(words[q]), acc[p][2 * q]);
                        acc[p][2 * q + 1] =
                            __fmaf_rn(w[p][j], maco__ep_bf16_hi(words[q]), acc[p][2 * q + 1]);
                    }
                }
        }
#pragma unroll
        for (int p = 0; p < P; p++)
            if (i0 + p * stride < work)
                ((uint4 *)((char *)a.y + (uint64_t)t[p] * rowb))[v[p]] =
                    make_uint4(maco__ep_bf16_pack(acc[p][0], acc[p][1]),
                               maco__ep_bf16_pack(acc[p][2], acc[p][3]),
                               maco__ep_bf16_pack(acc[p][4], acc[p][5]),
                               maco__ep_bf16_pack(acc[p][6], acc[p][7]));
    }
}

/* A named barrier of `threads` threads (the combine's senders: 1, its summers: 2). */
static __device__ __forceinline__ void maco__ep_bar(int id, int threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/* The same, returning whether x was true in any of the threads. */
static __device__ __forceinline__ bool maco__ep_bar_or(int id, int threads, bool x)
{
    int r;
    asm volatile("{\n\t.reg .pred p, q;\n\tsetp.ne.s32 q, %1, 0;\n\t"
                 "bar.red.or.pred p, %2, %3, q;\n\tselp.s32 %0, 1, 0, p;\n\t}"
                 : "=r"(r)
                 : "r"((int)x), "r"(id), "r"(threads)
                 : "memory");
    return r != 0;
}

/* Combine step 3 (the sender warps, SW of them: ST threads, barrier 1): this CTA's share of
 * the received rows back to their sources' combine regions, group by group, each group
 * signalled at every rank (file comment). s_pre [L + 1], s_base [L]: filled with the local
 * experts' first rows in the received order and in recv_x; s_list, s_gofs, s_grp: the sort's
 * shared memory. */
static __device__ void maco__ep_combine_send(const maco__ep_args_t &a, char *const *peer,
                                             int32_t *s_pre, int32_t *s_base, int32_t *s_list,
                                             int32_t *s_gofs, uint8_t *s_grp, bool abort, bool pipe,
                                             int SW, int GT, int G)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, ST = SW * 32;
    const int n = a.g.nranks, me = a.rank, L = a.g.local_experts, K = a.g.topk;
    const uint64_t rowb = a.g.row_bytes;
    const char *const handle = (const char *)a.handle;
    if (!abort && warp == 0) { /* where each local expert's rows start, received and in recv_x */
        const int32_t *hexp = (const int32_t *)(handle + a.o.h_exp_off);
        int run = 0;
        for (int l0 = 0; l0 < L; l0 += 32) {
            const int l = l0 + lane;
            const int v = l < L ? hexp[L + l] : 0;
            int incl = v;
            for (int d = 1; d < 32; d <<= 1) {
                const int u = __shfl_up_sync(MACO__EP_FULL, incl, d);
                if (lane >= d)
                    incl += u;
            }
            if (l < L) {
                s_pre[l] = run + incl - v;
                s_base[l] = hexp[l];
            }
            run += __shfl_sync(MACO__EP_FULL, incl, 31);
        }
        if (lane == 0)
            s_pre[L] = run;
    }
    maco__ep_bar(1, ST);
    const int total = abort ? 0 : s_pre[L];
    const int2 *hmeta = (const int2 *)(handle + a.o.h_meta_off);
    const int per = (total + (int)gridDim.x - 1) / (int)gridDim.x;
    const int c0 = min(total, (int)blockIdx.x * per), c1 = min(total, c0 + per);
    const bool sorted = pipe && c1 - c0 <= MACO__EP_SORT_ROWS;
    /* The row of recv_x of the v-th received row (by local expert, then in order). */
    auto row_of = [&](int v) {
        int lo = 0, hi = L - 1; /* the last local expert whose rows start at or before v */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (s_pre[mid] <= v)
                lo = mid;
            else
                hi = mid - 1;
        }
        return (int64_t)s_base[lo] + (v - s_pre[lo]);
    };
    auto send = [&](int64_t row) {
        const int2 m = hmeta[row];
        maco__ep_copy_row(peer[m.x] + a.o.comb_off + (uint64_t)m.y * rowb,
                          (const char *)a.expert_out + (uint64_t)row * rowb, rowb, lane);
    };
    if (sorted) {
        for (int g = tid; g <= G; g += ST)
            s_gofs[g] = 0;
        maco__ep_bar(1, ST);
        for (int v = c0 + tid; v < c1; v += ST) {
            const int g = hmeta[row_of(v)].y / K / GT;
            s_grp[v - c0] = (uint8_t)g;
            atomicAdd(&s_gofs[g + 1], 1);
        }
        maco__ep_bar(1, ST);
        if (warp == 0) { /* exclusive starts: s_gofs[g] = rows of groups before g */
            int run = 0;
            for (int g0 = 0; g0 <= G; g0 += 32) {
                const int g = g0 + lane;
                int incl = g <= G ? s_gofs[g] : 0;
                for (int d = 1; d < 32; d <<= 1) {
                    const int u = __shfl_up_sync(MACO__EP_FULL, incl, d);
                    if (lane >= d)
                        incl += u;
                }
                __syncwarp();
                if (g <= G)
                    s_gofs[g] = run + incl;
                run += __shfl_sync(MACO__EP_FULL, incl, 31);
                __syncwarp();
            }
        }
        maco__ep_bar(1, ST);
        for (int v = c0 + tid; v < c1; v += ST) { /* s_gofs[g] ends as group g + 1's start */
            const int pos = atomicAdd(&s_gofs[s_grp[v - c0]], 1);
            s_list[pos] = (int32_t)row_of(v);
        }
        maco__ep_bar(1, ST);
    } else {
        for (int v = c0 + warp; v < c1; v += SW)
            send(row_of(v));
    }
    for (int g = 0; g < G; g++) {
        if (sorted) { /* group g: s_list[s_gofs[g - 1] (0 for g = 0), s_gofs[g]) */
            const int lo = g == 0 ? 0 : s_gofs[g - 1], hi = s_gofs[g];
            for (int i = lo + warp; i < hi; i += SW)
                send(s_list[i]);
        }
        maco__ep_bar(1, ST);
        if (tid < n)
            maco_red_add_release_sys_u64((uint64_t *)(peer[tid] + MACO__EP_CTRL_GROUP) +
                                             (size_t)g * MACO_EP_MAX_RANKS + (size_t)me,
                                         1u);
    }
}

/* Combine steps 4-5 (the summer threads, UT of them from thread `first`, barrier 2): for
 * each group of this rank's tokens, wait until every rank's CTAs signalled it, then sum its
 * tokens. Returns true, in every summer thread, when a wait failed. */
static __device__ bool maco__ep_combine_sums(const maco__ep_args_t &a, uint64_t seq, int first,
                                             int UT, int GT)
{
    const int tid = threadIdx.x, n = a.g.nranks;
    const maco_device_wait_bound_t bound = a.bound;
    const uint64_t *const group_ctr = (const uint64_t *)(a.buf + MACO__EP_CTRL_GROUP);
    bool failed = false;
    const int st = tid - first;
    const int Gmine = (a.num_tokens + GT - 1) / GT;
    for (int g = 0; g < Gmine; g++) {
        bool bad = false;
        if (st < n)
            bad = maco__ep_wait(group_ctr + (size_t)g * MACO_EP_MAX_RANKS + (size_t)st,
                                seq * (uint64_t)gridDim.x, 0, &bound, st, MACO__EP_W_BACK);
        if (maco__ep_bar_or(2, UT, bad)) {
            failed = true;
            break;
        }
        maco__ep_combine_sum(a, g * GT, min(a.num_tokens, (g + 1) * GT),
                             (int64_t)blockIdx.x * UT + st, (int64_t)gridDim.x * UT);
    }
    return failed;
}

__global__ void __launch_bounds__(MACO__EP_THREADS)
    maco__ep_combine_kernel(const __grid_constant__ maco__ep_args_t a)
{
    extern __shared__ __align__(16) unsigned char maco__ep_smem[];
    __shared__ char *peer[MACO_EP_MAX_RANKS];
    __shared__ uint64_t s_seq;
    __shared__ int s_abort;
    __shared__ maco__ep_bad_t s_bad;

    const int tid = threadIdx.x, warp = tid >> 5;
    const int n = a.g.nranks, L = a.g.local_experts;
    const maco_device_wait_bound_t bound = a.bound;
    char *const buf = a.buf;
    int32_t *s_pre = (int32_t *)maco__ep_smem; /* [L + 1]: rows of local experts before l */
    int32_t *s_base = s_pre + L + 1;           /* [L]: local expert l's first row */

    if (tid < MACO_EP_MAX_RANKS)
        peer[tid] = a.peer[tid];
    if (tid == 0) {
        s_seq = *(volatile uint64_t *)(buf + MACO__EP_CTRL_COMB_SEQ) + 1u;
        s_abort = 0;
    }
    __syncthreads();
    const uint64_t seq = s_seq;

    /* 1. This rank's status to every rank (CTA 0). */
    if (blockIdx.x == 0 && tid == 0)
        maco__ep_combine_status(a, peer, seq);

    /* 2. Every rank's status. */
    bool failed = false;
    if (tid < n)
        failed = maco__ep_wait((const uint64_t *)(buf + MACO__EP_CTRL_READY) + tid, seq, 8, &bound,
                               tid, MACO__EP_W_READY);
    if (__syncthreads_or(failed))
        return;
    if (tid == 0) {
        maco__ep_bad_t bad = { 0, 0, 0, 0, 0, 0 };
        for (int r = 0; r < n && bad.code == MACO__EP_OK; r++) {
            const uint64_t v = __ldcg((const unsigned long long *)(buf + MACO__EP_CTRL_READY) + r);
            if ((v & 0xffu) != 0u) {
                const uint64_t info =
                    __ldcg((const unsigned long long *)(buf + MACO__EP_CTRL_READY_INFO) + r);
                bad.code = (int32_t)(v & 0xffu);
                bad.rank = r;
                bad.token = -1;
                bad.k = -1;
                bad.value = (int32_t)(uint32_t)(info & 0xffffffffu);
                bad.limit = (int32_t)(uint32_t)(info >> 32);
            }
        }
        s_bad = bad;
        s_abort = bad.code != MACO__EP_OK;
    }
    __syncthreads();
    const bool abort = s_abort != 0;

    /* 3-5. Sender warps copy the rows back by token group, summer warps sum each group once
     * every rank's CTAs have signalled it (the file comment). */
    const int GT = maco__ep_group_tokens(a.g.max_tokens);
    const int G = (a.g.max_tokens + GT - 1) / GT;
    /* One group (low latency at its usual sizes): every warp copies, then every warp sums. */
    const bool pipe = G > 1;
    const int SW = pipe ? MACO__EP_SEND_WARPS : MACO__EP_WARPS;                   /* sender warps */
    const int ST = SW * 32, UT = pipe ? MACO__EP_THREADS - ST : MACO__EP_THREADS; /* summers */
    int32_t *s_list = s_base + L;                  /* [MACO__EP_SORT_ROWS] rows */
    int32_t *s_gofs = s_list + MACO__EP_SORT_ROWS; /* [G + 1] group starts in s_list */
    uint8_t *s_grp = (uint8_t *)(s_gofs + MACO__EP_MAX_GROUPS + 1); /* [MACO__EP_SORT_ROWS] */
    __syncthreads();
    failed = false;
    if (warp < SW)
        maco__ep_combine_send(a, peer, s_pre, s_base, s_list, s_gofs, s_grp, abort, pipe, SW, GT,
                              G);
    if ((!pipe || warp >= SW) && !abort)
        failed = maco__ep_combine_sums(a, seq, pipe ? ST : 0, UT, GT);
    if (__syncthreads_or(failed))
        return;
    if (blockIdx.x == 0 && tid == 0)
        maco__ep_report(a.report, a.ticket, a.want_report, 1, s_bad, -1);
    maco__ep_advance(buf, MACO__EP_CTRL_COMB_SEQ, MACO__EP_CTRL_COMB_DONE, -1, seq);
}

/* ------------------------------------------------------------------ host side */

extern "C" size_t maco__ep_combine_smem(const maco__ep_geom_t *g)
{
    /* s_pre [L + 1], s_base [L], the sorted rows [MACO__EP_SORT_ROWS], the group starts
     * [MACO__EP_MAX_GROUPS + 1] (int32), each row's group [MACO__EP_SORT_ROWS] (uint8). */
    return (2u * (size_t)g->local_experts + 1u + MACO__EP_SORT_ROWS + MACO__EP_MAX_GROUPS + 1u) *
               4u +
           MACO__EP_SORT_ROWS;
}

extern "C" cudaError_t maco__ep_combine_load(void)
{
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, maco__ep_combine_kernel);
}

extern "C" cudaError_t maco__ep_combine_set_smem(int bytes)
{
    return cudaFuncSetAttribute(maco__ep_combine_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

extern "C" cudaError_t maco__ep_launch_combine(const maco__ep_args_t *a, int ctas, size_t smem,
                                               cudaStream_t stream)
{
    maco__ep_combine_kernel<<<ctas, MACO__EP_THREADS, smem, stream>>>(*a);
    return cudaGetLastError();
}
