/*
 * maco/device/impl/persistent_kernel.h - the persistent kernel's body: the built-in task types
 * and the worker, communication and scheduler CTAs' loops (maco_pk_run; maco/device/
 * persistent.h declares and documents it). Included by that header only; device code.
 */
#ifndef MACO_DEVICE_IMPL_PERSISTENT_KERNEL_H
#define MACO_DEVICE_IMPL_PERSISTENT_KERNEL_H

/* maco_datatype_t values of the element-wise types (maco/collectives.h). */
enum { MACO__PK_F16 = 6, MACO__PK_BF16 = 7, MACO__PK_F32 = 8 };

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

static __device__ __forceinline__ float maco__pk_load(const void *p, uint64_t i, uint32_t dtype)
{
    if (dtype == MACO__PK_F16)
        return __half2float(((const __half *)p)[i]);
    if (dtype == MACO__PK_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

static __device__ __forceinline__ void maco__pk_store(void *p, uint64_t i, uint32_t dtype, float x)
{
    if (dtype == MACO__PK_F16)
        ((__half *)p)[i] = __float2half_rn(x);
    else if (dtype == MACO__PK_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
    else
        ((float *)p)[i] = x;
}

/* out = a + b (ADD), alpha * a (SCALE), a + alpha * b (RESIDUAL_ADD, one fused multiply-add:
 * fmaf(alpha, b, a)); fp32 arithmetic, each element rounded once to the output type. `rows`
 * rows of `count` elements (ptr[3]: rows in bits 0-15, 0 meaning 1; the row stride of a and b
 * in bits 16-39, of out in bits 40-63, in elements). float32 with 16-byte aligned rows moves
 * four elements per access. */
static __device__ __forceinline__ void maco__pk_elementwise(const maco_pk_task_t *t, uint32_t tid,
                                                            uint32_t nthreads)
{
    char *out = (char *)t->ptr[0];
    const char *a = (const char *)t->ptr[1];
    const char *b = (const char *)t->ptr[2];
    float alpha = t->alpha;
    uint32_t type = t->type, dtype = t->dtype;
    uint64_t n = t->count;
    uint64_t rows = t->ptr[3] & 0xffffu, ldi = (t->ptr[3] >> 16) & 0xffffffu, ldo = t->ptr[3] >> 40;
    if (rows == 0) {
        rows = 1;
        ldi = ldo = n;
    }
    uint64_t esz = dtype == MACO__PK_F32 ? 4 : 2;
    uintptr_t align = (uintptr_t)out | (uintptr_t)a | (type == MACO_PK_SCALE ? 0u : (uintptr_t)b);
    if (rows > 1)
        align |= (uintptr_t)(ldi * esz) | (uintptr_t)(ldo * esz) | (uintptr_t)(n * esz);
    uint64_t done = 0; /* elements of each row done by the vector loop */
    if (dtype == MACO__PK_F32 && (align & 15u) == 0) {
        uint64_t nv = n / 4, total = rows * nv;
        float c = type == MACO_PK_ADD ? 1.0f : alpha;
        for (uint64_t v = tid; v < total; v += nthreads) {
            uint64_t r = v / nv, i = v - r * nv;
            float4 x = ((const float4 *)(a + r * ldi * 4))[i], y;
            if (type == MACO_PK_SCALE) {
                y = make_float4(alpha * x.x, alpha * x.y, alpha * x.z, alpha * x.w);
            } else {
                float4 z = ((const float4 *)(b + r * ldi * 4))[i];
                y = make_float4(__fmaf_rn(c, z.x, x.x), __fmaf_rn(c, z.y, x.y),
                                __fmaf_rn(c, z.z, x.z), __fmaf_rn(c, z.w, x.w));
            }
            ((float4 *)(out + r * ldo * 4))[i] = y;
        }
        done = nv * 4;
    }
    uint64_t rest = n - done, total = rows * rest;
    for (uint64_t e = tid; e < total; e += nthreads) {
        uint64_t r = e / rest, i = done + (e - r * rest);
        float x = maco__pk_load(a + r * ldi * esz, i, dtype), y;
        if (type == MACO_PK_SCALE)
            y = alpha * x;
        else
            y = __fmaf_rn(type == MACO_PK_ADD ? 1.0f : alpha,
                          maco__pk_load(b + r * ldi * esz, i, dtype), x);
        maco__pk_store(out + r * ldo * esz, i, dtype, y);
    }
}

/* The rows and strides of a 2D element-wise or copy task (ptr[3]: rows in bits 0-15, 0
 * meaning one row of `count`; the input stride in bits 16-39, the output's in bits 40-63). */
static __device__ __forceinline__ uint64_t maco__pk_rows(const maco_pk_task_t *t, uint64_t *ldi,
                                                         uint64_t *ldo)
{
    uint64_t rows = t->ptr[3] & 0xffffu;
    *ldi = (t->ptr[3] >> 16) & 0xffffffu;
    *ldo = t->ptr[3] >> 40;
    if (rows == 0) {
        rows = 1;
        *ldi = *ldo = t->count;
    }
    return rows;
}

/* The byte offsets from a task's output to its twins in its out-mirror channels' remote
 * buffers (maco_pk_sync_t; at most MACO__PK_MIRRORS); returns how many. */
static __device__ __forceinline__ uint32_t maco__pk_out_mirrors(const maco_pk_view_t *v,
                                                                uint32_t task, uint64_t *delta)
{
    if (v->sync == 0)
        return 0;
    const maco_pk_sync_t *g = &v->sync[task];
    uint32_t n = g->out_count < MACO__PK_MIRRORS ? g->out_count : MACO__PK_MIRRORS;
    for (uint32_t j = 0; j < n; j++) {
        const maco_memory_channel_device_t *c = &v->channels[g->out_first + j];
        delta[j] = (uint64_t)(uintptr_t)c->remote - (uint64_t)(uintptr_t)c->local;
    }
    return n;
}

/* COPY: `count` bytes, or `rows` rows of `count` bytes with strides in bytes, to out and to
 * its mirrors. Eight 16-byte vectors in flight per thread where every address and stride is
 * 16-byte aligned (tiles and row blocks, what the fused operators send to peers), all loaded
 * before any is stored. */
static __device__ __forceinline__ void maco__pk_copy(const maco_pk_view_t *v,
                                                     const maco_pk_task_t *t, uint32_t task,
                                                     uint32_t tid, uint32_t nthreads)
{
    char *out = (char *)t->ptr[0];
    const char *a = (const char *)t->ptr[1];
    uint64_t ldi, ldo, n = t->count, delta[MACO__PK_MIRRORS];
    uint64_t rows = maco__pk_rows(t, &ldi, &ldo);
    uint32_t nm = maco__pk_out_mirrors(v, task, delta);
    if ((((uintptr_t)out | (uintptr_t)a | n | ldi | ldo) & 15u) != 0) {
        for (uint32_t m = 0; m <= nm; m++)
            for (uint64_t r = 0; r < rows; r++)
                maco_copy(out + (m == 0 ? 0 : delta[m - 1]) + r * ldo, a + r * ldi, n, tid,
                          nthreads);
        return;
    }
    enum { U = 8 };
    const uint64_t nv = n / 16, total = rows * nv, stride = nthreads;
    for (uint64_t v0 = tid; v0 < total; v0 += U * stride) {
        uint4 x[U];
        uint64_t off[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint64_t w = v0 + u * stride, r = w / nv;
            off[u] = r * ldo + (w - r * nv) * 16;
            if (w < total)
                x[u] = *(const uint4 *)(a + r * ldi + (w - r * nv) * 16);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (v0 + u * stride >= total)
                continue;
            *(uint4 *)(out + off[u]) = x[u];
            for (uint32_t m = 0; m < nm; m++)
                *(uint4 *)(out + delta[m] + off[u]) = x[u];
        }
    }
}

/* Eight bf16 of a 16-byte vector, added to acc (or assigned, first). */
static __device__ __forceinline__ void maco__pk_acc_bf16x8(float *acc, uint4 x, int first)
{
    uint32_t w[4] = { x.x, x.y, x.z, x.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float lo = __uint_as_float(w[i] << 16), hi = __uint_as_float(w[i] & 0xffff0000u);
        acc[2 * i] = first ? lo : acc[2 * i] + lo;
        acc[2 * i + 1] = first ? hi : acc[2 * i + 1] + hi;
    }
}

/* Four fp32 of a 16-byte vector, added to acc (or assigned, first). */
static __device__ __forceinline__ void maco__pk_acc_f32x4(float *acc, uint4 x, int first)
{
    float f[4] = { __uint_as_float(x.x), __uint_as_float(x.y), __uint_as_float(x.z),
                   __uint_as_float(x.w) };
#pragma unroll
    for (int i = 0; i < 4; i++)
        acc[i] = first ? f[i] : acc[i] + f[i];
}

/* SUM: out = in_0 + in_1 + ... in that order (fp32), in_j = ptr[1] + j * ptr[2] bytes; rows and
 * strides (elements) as for ADD; the result also to out's mirrors. 16-byte vectors (4 fp32 or
 * 8 bf16) where aligned and the output has the inputs' type, four per thread in flight for
 * each input; element by element otherwise (fp32 partial products into bf16: split-K). */
static __device__ __forceinline__ void maco__pk_sum(const maco_pk_view_t *v,
                                                    const maco_pk_task_t *t, uint32_t task,
                                                    uint32_t tid, uint32_t nthreads)
{
    char *out = (char *)t->ptr[0];
    const char *in = (const char *)t->ptr[1];
    const uint64_t in_stride = t->ptr[2];
    const uint32_t nin = t->aux, dtype = t->dtype;
    const uint32_t odtype = t->sum.out_dtype != 0 ? t->sum.out_dtype : dtype;
    const uint64_t esz = dtype == MACO__PK_F32 ? 4 : 2, n = t->count;
    const uint64_t oesz = odtype == MACO__PK_F32 ? 4 : 2;
    uint64_t ldi, ldo, delta[MACO__PK_MIRRORS];
    uint64_t rows = maco__pk_rows(t, &ldi, &ldo);
    uint32_t nm = maco__pk_out_mirrors(v, task, delta);
    uintptr_t align =
        (uintptr_t)out | (uintptr_t)in | in_stride | (n * esz) | (ldi * esz) | (ldo * esz);
    if ((align & 15u) == 0 && dtype != MACO__PK_F16 && odtype == dtype) {
        enum { U = 4 };
        const uint64_t per = 16 / esz, nv = n / per, total = rows * nv, stride = nthreads;
        for (uint64_t v0 = tid; v0 < total; v0 += U * stride) {
            float acc[U][8];
            uint64_t src[U], dst[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                uint64_t w = v0 + u * stride, r = w / nv, i = w - r * nv;
                src[u] = r * ldi * esz + i * 16;
                dst[u] = r * ldo * esz + i * 16;
            }
            for (uint32_t j = 0; j < nin; j++) {
                uint4 x[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    x[u] = v0 + u * stride < total ? *(const uint4 *)(in + j * in_stride + src[u])
                                                   : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (dtype == MACO__PK_F32)
                        maco__pk_acc_f32x4(acc[u], x[u], j == 0);
                    else
                        maco__pk_acc_bf16x8(acc[u], x[u], j == 0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (v0 + u * stride >= total)
                    continue;
                uint4 y;
                if (dtype == MACO__PK_F32) {
                    y = make_uint4(__float_as_uint(acc[u][0]), __float_as_uint(acc[u][1]),
                                   __float_as_uint(acc[u][2]), __float_as_uint(acc[u][3]));
                } else {
                    uint32_t w[4];
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        __nv_bfloat162 h = __floats2bfloat162_rn(acc[u][2 * q], acc[u][2 * q + 1]);
                        w[q] = *(uint32_t *)&h;
                    }
                    y = make_uint4(w[0], w[1], w[2], w[3]);
                }
                *(uint4 *)(out + dst[u]) = y;
                for (uint32_t m = 0; m < nm; m++)
                    *(uint4 *)(out + delta[m] + dst[u]) = y;
            }
        }
        return;
    }
    const uint64_t total = rows * n;
    for (uint64_t e = tid; e < total; e += nthreads) {
        uint64_t r = e / n, i = e - r * n;
        float acc = 0.0f;
        for (uint32_t j = 0; j < nin; j++) {
            float x = maco__pk_load(in + j * in_stride + (r * ldi) * esz, i, dtype);
            acc = j == 0 ? x : acc + x;
        }
        for (uint32_t m = 0; m <= nm; m++)
            maco__pk_store(out + (m == 0 ? 0 : delta[m - 1]) + (r * ldo) * oesz, i, odtype, acc);
    }
}

/* MACO_PK_WAIT: one thread waits until the counter has the run's count of signals. */
static __device__ __forceinline__ maco_status_t maco__pk_wait_counter(const maco_pk_view_t *v,
                                                                      const maco_pk_task_t *t,
                                                                      uint32_t task, uint64_t run)
{
    const uint64_t *ctr = (const uint64_t *)t->ptr[1];
    uint64_t want = t->count * (run + 1), seen = 0;
    maco__pk_spin_t spin = { 0, 0 };
    while ((seen = maco_load_acquire_sys_u64(ctr)) < want) {
        maco_status_t st = maco__pk_spin(v, &spin, 1);
        if (st != MACO_OK) {
            if (st == MACO_ERR_TIMEOUT)
                maco__pk_record(v, st, (int)task, MACO_DEVICE_WAIT_TASK_COUNTER, want, seen);
            return st;
        }
    }
    return MACO_OK;
}

/* MACO_PK_PORT_PUT: one thread queues the put (if any) and the signal into the port channel's
 * FIFO; the proxy carries them out after the task. What this thread observed (the task's
 * inputs, released to it through the dependency counters and the CTA's barrier) is ordered
 * before the trigger by the channel's push (maco/device/port_channel.h). MACO_PK_PORT_FLUSH:
 * one thread waits (bounded) for the proxy to carry out every earlier trigger of the FIFO. A
 * push that fails (the ring stayed full past the bound, or the proxy stopped) fails the task. */
static __device__ __forceinline__ maco_status_t maco__pk_port_task(const maco_pk_view_t *v,
                                                                   const maco_pk_task_t *t)
{
    const maco_port_channel_device_t *ch = &v->ports[t->aux];
    if (t->type == MACO_PK_PORT_FLUSH)
        return maco_port_channel_flush(ch);
    if (t->count == 0)
        return maco_port_channel_signal(ch);
    return maco_port_channel_put_with_signal(ch, t->ptr[0], t->ptr[1], t->count);
}

/* Runs task `task` (descriptor t) with threads tid = 0 .. nthreads - 1 of the CTA (the whole
 * CTA in maco_pk_run; the GMMA kernel's 256 consumer threads there). Single-thread parts (waits,
 * signals) run on tid 0. */
static __device__ __forceinline__ maco_status_t maco__pk_execute(const maco_pk_view_t *v,
                                                                 const maco_pk_task_t *t,
                                                                 uint32_t task, uint64_t run,
                                                                 maco_pk_user_fn_t user,
                                                                 uint32_t tid, uint32_t nthreads)
{
    switch (t->type) {
    case MACO_PK_NOP:
        return MACO_OK;
    case MACO_PK_COPY:
        maco__pk_copy(v, t, task, tid, nthreads);
        return MACO_OK;
    case MACO_PK_SUM:
        maco__pk_sum(v, t, task, tid, nthreads);
        return MACO_OK;
    case MACO_PK_ADD:
    case MACO_PK_SCALE:
    case MACO_PK_RESIDUAL_ADD:
        maco__pk_elementwise(t, tid, nthreads);
        return MACO_OK;
    case MACO_PK_SIGNAL:
        /* Release at system scope: this task's predecessors' writes (seen through the
         * dependency chain) are visible to whoever acquires the new count. */
        if (tid == 0)
            maco_red_add_release_sys_u64((uint64_t *)t->ptr[0], 1);
        return MACO_OK;
    case MACO_PK_WAIT:
        return tid == 0 ? maco__pk_wait_counter(v, t, task, run) : MACO_OK;
    case MACO_PK_CHANNEL_PUT:
        maco_memory_channel_put(&v->channels[t->aux], t->ptr[0], t->ptr[1], t->count, tid,
                                nthreads);
        return MACO_OK;
    case MACO_PK_CHANNEL_SIGNAL:
        if (tid == 0)
            maco_memory_channel_signal(&v->channels[t->aux]);
        return MACO_OK;
    case MACO_PK_CHANNEL_WAIT:
        return tid == 0 ? maco_memory_channel_wait(&v->channels[t->aux]) : MACO_OK;
    case MACO_PK_PORT_PUT:
    case MACO_PK_PORT_FLUSH:
        return tid == 0 ? maco__pk_port_task(v, t) : MACO_OK;
    default:
        if ((t->type >= MACO_PK_USER || t->type == MACO_PK_GEMM_TILE) && user != 0)
            return user(v, t, task);
        if (tid == 0)
            maco__pk_record(v, MACO_ERR_INVALID_ARGUMENT, (int)task, MACO_DEVICE_ERR_TASK_TYPE,
                            t->type, 0);
        return MACO_ERR_INVALID_ARGUMENT;
    }
}

/* The `run` (earlier launches) of this launch, read by thread 0 and given to every thread. */
static __device__ __forceinline__ uint64_t maco__pk_cta_run(const maco_pk_view_t *v)
{
    __shared__ uint64_t run_s;
    if (threadIdx.x == 0)
        run_s = maco__pk_ld_relaxed(&v->ctr[MACO_PK_CTR_LAUNCHES]);
    __syncthreads();
    return run_s;
}

/* A scheduler CTA (block index >= W + C): all threads push the roots; a push's error has aborted
 * the launch, so the barrier and the inbox loop after them leave at their first check. */
static __device__ __noinline__ void maco__pk_scheduler_cta(const maco_pk_view_t *v, uint64_t run)
{
    uint32_t s = blockIdx.x - (v->nworkers + v->ncomm);
    (void)maco_pk_schedule_roots(v, s, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0 && maco_pk_roots_pushed(v, s, run) == MACO_OK)
        maco_pk_schedule_inbox(v, s, run); /* an error aborts the launch */
}

/* The end of every CTA (all threads): the last CTA out counts the launch, the next one's `run`. */
static __device__ __forceinline__ void maco__pk_cta_exit(const maco_pk_view_t *v, uint64_t run)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t total = (uint64_t)gridDim.x * (run + 1);
        if (maco__pk_fetch_add_acq_rel(&v->ctr[MACO_PK_CTR_EXITED], 1) + 1 == total)
            maco__pk_st_release(&v->ctr[MACO_PK_CTR_LAUNCHES], run + 1);
    }
}

/* A worker CTA's loop (all its threads): the next task whose gate is open, run by the whole
 * CTA, its profile record, its signal, its successors released; until the launch ends or a
 * task fails. */
static __device__ __forceinline__ void maco__pk_worker_loop(const maco_pk_view_t *v, uint64_t run,
                                                            maco_pk_user_fn_t user)
{
    __shared__ uint32_t task_s;
    __shared__ int32_t got_s, status_s;
    uint32_t tid = threadIdx.x;
    for (;;) {
        uint64_t start = 0;
        if (tid == 0) {
            uint32_t t = 0;
            maco_status_t st = MACO_OK;
            /* A task whose gate is closed goes to the back of the queue. */
            got_s = maco_pk_next_ready(v, blockIdx.x, run, &t, &st);
            task_s = t;
            status_s = MACO_OK;
            if (v->profile != 0)
                start = maco_globaltimer_ns();
        }
        __syncthreads();
        if (got_s != 1)
            break;
        uint32_t t = task_s;
        maco_status_t st = maco__pk_execute(v, &v->tasks[t], t, run, user, tid, blockDim.x);
        if (st != MACO_OK)
            atomicCAS((int *)&status_s, 0, (int)st);
        __syncthreads();
        if (status_s != MACO_OK) {
            if (tid == 0) {
                /* The first report wins: a task's own (a wait's) is kept; else this one says
                 * which task failed, so no abort goes unreported. */
                maco__pk_record(v, (maco_status_t)status_s, (int)t, MACO_DEVICE_ERR_TASK_FAILED,
                                v->tasks[t].type, 0);
                maco_pk_abort(v);
            }
            break;
        }
        if (tid == 0 && v->profile != 0) {
            uint32_t sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            maco_pk_profile_record_t *r = &v->profile[t];
            r->start_ns = start;
            r->end_ns = maco_globaltimer_ns();
            r->sm = sm;
            r->cta = blockIdx.x;
        }
        if (tid == 0)
            maco_pk_post_signal(v, t); /* after the barrier: every thread's writes */
        __syncwarp();
        if (tid < 32)
            maco_pk_complete(v, t, run, tid, 32); /* an error aborts: next() sees it */
    }
}

static __device__ __forceinline__ void maco_pk_run(const maco_pk_view_t *v, maco_pk_user_fn_t user)
{
    uint64_t run = maco__pk_cta_run(v);
    if (blockIdx.x < v->nworkers + v->ncomm)
        maco__pk_worker_loop(v, run, user);
    else
        maco__pk_scheduler_cta(v, run);
    maco__pk_cta_exit(v, run);
}

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_IMPL_PERSISTENT_KERNEL_H */
