/*
 * bench_port_channel - port channels (CUDA copy transport) between two GPUs. A benchmark,
 * not a test.
 *
 *   maco-run -n 2 build/tests/bench_port_channel
 *
 * Rank 0 prints:
 *  1. FIFO round trip: one GPU thread pushes a flush trigger and waits until the proxy has
 *     taken it and published the flush as done (no copy outstanding), 20000 times in one
 *     launch; time per round trip. Then the FIFO's pipelined cost: 200000 pushes back to back
 *     (waiting only when the ring is full) and one flush, as puts of 0 bytes and as pushes
 *     with a system-scope release (what a signal costs).
 *  2. put_with_signal ping-pong: rank 0 puts 8 bytes with a signal and waits for rank 1's
 *     put_with_signal back, 10000 round trips in one launch, median of 3 launches; 8 bytes
 *     travel inline (a stream memory operation), so the same with 64 bytes (a copy-engine
 *     copy) follows.
 *  3. bandwidth rank 0 -> rank 1, 1 KiB .. 1 GiB: one GPU thread pushes put + flush per
 *     iteration (the proxy's copy through the copy engines), against cudaMemcpyAsync of the
 *     same bytes into the same mapped peer buffer (what cudaMemcpyPeer does). Median of 5.
 *
 *   maco-run -n 2 build/tests/bench_port_channel --pieces
 *
 * times the parts instead: GPU reads of and stores to host memory, fences, FIFO round-trip
 * variants (how the push publishes, how the wait polls), the proxy's driver calls (CPU time
 * per call; issue until a CPU sees the copy engine's or the stream's write) and ping-pong
 * with and without data.
 */
#include <cuda.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_common.h"

__global__ void fifo_round_trip(maco_port_channel_device_t ch, int iters, int *status)
{
    maco_status_t st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++)
        st = maco_port_channel_flush(&ch);
    *status = st;
}

/* Pushes `iters` triggers, waiting only when the ring is full, then one flush: the FIFO's
 * pipelined cost per trigger. put_path: puts of 0 bytes (the proxy skips them), pushed as a
 * put is; else triggers that ask for nothing pushed with a system-scope release (as a signal
 * is). */
__global__ void fifo_throughput(maco_port_channel_device_t ch, int iters, int put_path, int *status)
{
    maco_status_t st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++) {
        if (put_path)
            st = maco_port_channel_put(&ch, 0, 0, 0);
        else
            maco_fifo_push(&ch.fifo, maco_trigger_make(0, ch.channel, 0, 0, 0), &st);
    }
    if (st == MACO_OK)
        st = maco_port_channel_flush(&ch);
    *status = st;
}

__global__ void ping_pong(maco_port_channel_device_t ch, int iters, uint64_t bytes, int initiator,
                          int *status)
{
    maco_status_t st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++) {
        if (initiator)
            st = maco_port_channel_put_with_signal(&ch, 0, 0, bytes);
        if (st == MACO_OK)
            st = maco_port_channel_wait(&ch);
        if (!initiator && st == MACO_OK)
            st = maco_port_channel_put_with_signal(&ch, 0, 0, bytes);
    }
    *status = st;
}

__global__ void put_flush(maco_port_channel_device_t ch, uint64_t bytes, int reps, int *status)
{
    maco_status_t st = MACO_OK;
    for (int i = 0; i < reps && st == MACO_OK; i++) {
        st = maco_port_channel_put(&ch, 0, 0, bytes);
        if (st == MACO_OK)
            st = maco_port_channel_flush(&ch);
    }
    *status = st;
}

/* ------------------------------------------------------------------ --pieces: where the time goes
 * Each kernel is one thread timing `iters` operations in one launch (cudaEvent time / iters).
 * `zero` is 0 at run time; the loads use it to make each address depend on the last value,
 * so the loads run one after another. */

enum { kLdRelaxed = 0, kLdAcquire = 1, kLdVolatile = 2 };

__global__ void piece_host_read(const uint64_t *word, uint64_t zero, int kind, int iters,
                                uint64_t *sink)
{
    uint64_t v = 0, acc = 0;
    for (int i = 0; i < iters; i++) {
        const uint64_t *p = word + (v & zero);
        if (kind == kLdRelaxed)
            asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        else if (kind == kLdAcquire)
            asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        else
            asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        acc += v;
    }
    *sink = acc;
}

enum {
    kStRelease = 0,
    kStRelaxed = 1,
    kFenceSc = 2,
    kFenceAcqRel = 3,
    kStReleaseAfterLoad = 4,
    kFenceGpuStRelaxed = 5,
    kFenceGpu = 6
};

/* Stores 16 bytes per iteration into successive slots of a host ring of 4096 (nobody reads
 * them), or fences alone. kStReleaseAfterLoad: each release store follows a host read, as in
 * the flush loop (push after the previous wait's last read). */
__global__ void piece_host_store(uint64_t *ring, const uint64_t *word, int kind, int iters)
{
    for (int i = 0; i < iters; i++) {
        uint64_t *slot = ring + 2 * (i & 4095);
        uint64_t a = (uint64_t)i, b = (uint64_t)i | (1ull << 63);
        if (kind == kStRelease) {
            asm volatile("st.release.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(a), "l"(b)
                         : "memory");
        } else if (kind == kStRelaxed) {
            asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(a), "l"(b)
                         : "memory");
        } else if (kind == kFenceSc) {
            asm volatile("fence.sc.sys;" ::: "memory");
        } else if (kind == kFenceAcqRel) {
            asm volatile("fence.acq_rel.sys;" ::: "memory");
        } else if (kind == kFenceGpuStRelaxed) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(a), "l"(b)
                         : "memory");
        } else if (kind == kFenceGpu) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
        } else {
            uint64_t v;
            asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
            a += v;
            asm volatile("st.release.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(a), "l"(b)
                         : "memory");
        }
    }
}

/* FIFO round-trip variants (push a flush trigger, wait for flush_done > pos):
 *   0 the library's maco_port_channel_flush
 *   1 release push, acquire polling, no trailing fence
 *   2 relaxed push, acquire polling
 *   3 release push, relaxed polling, then one acquire load */
__global__ void piece_round_trip(maco_port_channel_device_t ch, int variant, int iters, int *status)
{
    const maco_fifo_device_t *f = &ch.fifo;
    maco_status_t st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++) {
        if (variant == 0) {
            st = maco_port_channel_flush(&ch);
            continue;
        }
        uint64_t pos = maco__fifo_push(
            f, maco_trigger_make(MACO_TRIGGER_FLUSH, ch.channel, 0, 0, 0), variant != 2, &st);
        const uint64_t *done = (const uint64_t *)f->flush_done;
        uint64_t spins = 0;
        if (variant == 3) {
            while (maco_load_relaxed_sys_u64(done) <= pos && ++spins < (1ull << 26)) {
            }
            (void)maco_load_acquire_sys_u64(done);
        } else {
            while (maco_load_acquire_sys_u64(done) <= pos && ++spins < (1ull << 26)) {
            }
        }
        if (spins >= (1ull << 26))
            st = MACO_ERR_TIMEOUT;
    }
    *status = st;
}

/* Dependent atomicAdd chain on device memory (the push's head reservation). */
__global__ void piece_atomic(unsigned long long *word, unsigned long long zero, int iters,
                             unsigned long long *sink)
{
    unsigned long long v = 0;
    for (int i = 0; i < iters; i++)
        v = atomicAdd(word + (v & zero), 1ull);
    *sink = v;
}

static __device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t *p)
{
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Polls *p until it exceeds `pos` with two relaxed loads in flight, issued `gap` cycles
 * apart, then one acquire load. Returns 0 after 2^26 polls. */
static __device__ uint64_t poll_staggered(const uint64_t *p, uint64_t pos, long long gap)
{
    uint64_t a = ld_relaxed_sys(p);
    long long t = clock64();
    while (clock64() - t < gap) {
    }
    uint64_t b = ld_relaxed_sys(p);
    for (long spins = 0; spins < (1l << 26); spins++) {
        if (a > pos)
            return maco_load_acquire_sys_u64(p);
        a = ld_relaxed_sys(p);
        if (b > pos)
            return maco_load_acquire_sys_u64(p);
        b = ld_relaxed_sys(p);
    }
    return 0;
}

/* The floor under any host FIFO: the GPU writes i to a host word, a CPU thread spinning on it
 * writes i to another host word, the GPU polls that. gap 0: one load in flight (relaxed
 * polling, then an acquire load); else poll_staggered. */
__global__ void piece_bare_round_trip(uint64_t *slot, const uint64_t *ack, int iters, long long gap,
                                      int *status)
{
    int st = 0;
    for (int i = 1; i <= iters && st == 0; i++) {
        asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(slot), "l"((uint64_t)i)
                     : "memory");
        if (gap > 0) {
            if (poll_staggered(ack, (uint64_t)i - 1, gap) == 0)
                st = 1;
        } else {
            long spins = 0;
            while (ld_relaxed_sys(ack) < (uint64_t)i && ++spins < (1l << 26)) {
            }
            (void)maco_load_acquire_sys_u64(ack);
            if (spins >= (1l << 26))
                st = 1;
        }
    }
    *status = st;
}

/* The bare round trip again, but the CPU writes its ack to K words `stride` words apart and
 * the GPU keeps K relaxed loads in flight, one per word, issued `gap` cycles apart: reads of
 * one address are served in order, reads of different lines need not be, so K words can
 * sample the ack K times per PCIe read latency. */
template <int K>
__global__ void piece_bare_mirrored(uint64_t *slot, const uint64_t *ack, int stride, int iters,
                                    long long gap, int *status)
{
    int st = 0;
    for (int i = 1; i <= iters && st == 0; i++) {
        asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(slot), "l"((uint64_t)i)
                     : "memory");
        uint64_t v[K];
#pragma unroll
        for (int j = 0; j < K; j++) {
            v[j] = ld_relaxed_sys(ack + j * stride);
            long long t = clock64();
            while (j + 1 < K && clock64() - t < gap) {
            }
        }
        int seen = -1;
        for (long spins = 0; seen < 0 && spins < (1l << 24); spins++) {
#pragma unroll
            for (int j = 0; j < K; j++) {
                if (seen < 0 && v[j] >= (uint64_t)i)
                    seen = j;
                if (seen < 0)
                    v[j] = ld_relaxed_sys(ack + j * stride);
            }
        }
        if (seen < 0)
            st = 1;
        else
            (void)maco_load_acquire_sys_u64(ack + seen * stride);
    }
    *status = st;
}

/* The library's flush, piece by piece, in SM cycles summed over the iterations: [0] the head
 * reservation (atomicAdd + tail cache read), [1] the relaxed store, [2] the
 * wait for flush_done; [3] the whole loop. gap > 0: the wait polls with poll_staggered. */
__global__ void piece_flush_breakdown(maco_port_channel_device_t ch, int iters, long long gap,
                                      unsigned long long *cyc, int *status)
{
    const maco_fifo_device_t *f = &ch.fifo;
    unsigned long long c[3] = { 0, 0, 0 };
    long long start = clock64();
    int st = 0;
    for (int i = 0; i < iters && st == 0; i++) {
        long long t0 = clock64();
        uint64_t pos = atomicAdd((unsigned long long *)f->head, 1ull);
        uint64_t tail = *(volatile uint64_t *)f->tail_cache;
        if (pos >= tail + f->capacity) { /* the cache is stale: refresh it, as the push does */
            tail = *f->tail;
            atomicMax((unsigned long long *)f->tail_cache, (unsigned long long)tail);
        }
        long long t1 = clock64();
        maco_trigger_t t = maco_trigger_make(MACO_TRIGGER_FLUSH, ch.channel, 0, 0, 0);
        maco_trigger_t *slot = f->triggers + (pos & (f->capacity - 1));
        uint64_t dst_word = t.dst_word | maco_fifo_parity(pos, f->capacity);
        asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(t.src_word),
                     "l"(dst_word)
                     : "memory");
        long long t2 = clock64();
        const uint64_t *done = (const uint64_t *)f->flush_done;
        if (gap > 0) {
            if (poll_staggered(done, pos, gap) == 0)
                st = 1;
        } else {
            long spins = 0;
            while (maco_load_acquire_sys_u64(done) <= pos && ++spins < (1l << 26)) {
            }
            if (spins >= (1l << 26))
                st = 1;
        }
        long long t3 = clock64();
        c[0] += (unsigned long long)(t1 - t0);
        c[1] += (unsigned long long)(t2 - t1);
        c[2] += (unsigned long long)(t3 - t2);
    }
    cyc[0] = c[0];
    cyc[1] = c[1];
    cyc[2] = c[2];
    cyc[3] = (unsigned long long)(clock64() - start);
    *status = st;
}

/* Ping-pong variants: 0 put_with_signal of 8 bytes (inline), 1 signal only, 2 put_with_signal
 * of 8 bytes as a copy, pushed after a GPU-scope fence instead of with a system-scope
 * release, 3 put_with_signal of 64 bytes (a copy), 4 as 0 but pushed after a GPU-scope fence. */
static __device__ maco_status_t piece_send(const maco_port_channel_device_t *ch, int variant)
{
    if (variant == 1)
        return maco_port_channel_signal(ch);
    if (variant == 0)
        return maco_port_channel_put_with_signal(ch, 0, 0, 8);
    if (variant == 3)
        return maco_port_channel_put_with_signal(ch, 0, 0, 64);
    maco_status_t st;
    if (variant == 4) { /* inline, as the library does, but after a GPU-scope fence */
        uint64_t v = *(const volatile uint64_t *)ch->src;
        maco__fifo_push(
            &ch->fifo,
            maco_trigger_make_inline(MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL, ch->channel, 0, v, 8),
            MACO__PUSH_FENCE_GPU, &st);
        return st;
    }
    maco__fifo_push(
        &ch->fifo, maco_trigger_make(MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL, ch->channel, 0, 0, 8),
        MACO__PUSH_FENCE_GPU, &st);
    return st;
}

__global__ void piece_ping_pong(maco_port_channel_device_t ch, int variant, int iters,
                                int initiator, int *status)
{
    maco_status_t st = MACO_OK;
    for (int i = 0; i < iters && st == MACO_OK; i++) {
        if (initiator)
            st = piece_send(&ch, variant);
        if (st == MACO_OK)
            st = maco_port_channel_wait(&ch);
        if (!initiator && st == MACO_OK)
            st = piece_send(&ch, variant);
    }
    *status = st;
}

/* Times `launch` (n GPU->CPU->GPU round trips) against a CPU thread that waits for each
 * value the GPU stores at bare[0] and answers it at the k words bare[16 + j * stride]
 * (5 pages of host-mapped memory, zeroed here). Returns milliseconds. */
template <typename Launch>
static float time_bare_round_trip(cudaStream_t s, uint64_t *bare, int n, int k, int stride,
                                  Launch launch)
{
    memset(bare, 0, 5 * 4096);
    volatile uint64_t *slot = bare;
    std::thread cpu([&] {
        for (int i = 1; i <= n; i++) {
            double t0 = bench_now_us();
            while (*slot < (uint64_t)i)
                if (bench_now_us() - t0 > 1e6)
                    return;
            for (int j = 0; j < k; j++)
                __atomic_store_n(bare + 16 + j * stride, (uint64_t)i, __ATOMIC_RELEASE);
        }
    });
    float ms = bench_time_ms(s, launch);
    cpu.join();
    return ms;
}

#define DK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Waits (CPU) until *word == want; gives up after 1 s. Returns 0 on time-out. */
static int spin_until(volatile uint64_t *word, uint64_t want)
{
    double t0 = bench_now_us();
    while (*word != want)
        if (bench_now_us() - t0 > 1e6)
            return 0;
    return 1;
}

/* The --pieces mode: times the parts a FIFO round trip and a ping-pong are made of. */
static void run_pieces(int rank, maco_bootstrap_t bs, maco_port_channel_device_t ch, char *buf,
                       void *peer_ptr, cudaStream_t s, int *status)
{
    int st = -1;
    if (rank == 0) {
        uint64_t *host, *ring, *sink;
        CK(cudaHostAlloc((void **)&host, 4096, cudaHostAllocMapped));
        CK(cudaHostAlloc((void **)&ring, 4096 * 16, cudaHostAllocMapped));
        CK(cudaMalloc(&sink, 8));
        memset(host, 0, 4096);
        const int n = 20000;
        const char *ld_names[] = { "ld.relaxed.sys", "ld.acquire.sys", "ld.volatile" };
        for (int k = 0; k < 3; k++) {
            float ms =
                bench_time_ms(s, [&] { piece_host_read<<<1, 1, 0, s>>>(host, 0, k, n, sink); });
            printf("# piece: GPU read of host memory, %-15s %7.3f us each\n", ld_names[k],
                   ms * 1e3 / n);
        }
        const char *st_names[] = { "st.release.sys.v2",     "st.relaxed.sys.v2",
                                   "fence.sc.sys",          "fence.acq_rel.sys",
                                   "ld.acquire+st.release", "fence.gpu+st.relaxed.sys",
                                   "fence.acq_rel.gpu" };
        for (int k = 0; k < 7; k++) {
            float ms =
                bench_time_ms(s, [&] { piece_host_store<<<1, 1, 0, s>>>(ring, host, k, n); });
            printf("# piece: GPU %-22s to host memory %7.3f us each\n", st_names[k], ms * 1e3 / n);
        }
        const char *rt_names[] = { "library flush", "release push, acquire poll",
                                   "relaxed push, acquire poll",
                                   "release push, relaxed poll + acquire" };
        for (int k = 0; k < 4; k++) {
            for (int rep = 0; rep < 2; rep++) {
                float ms =
                    bench_time_ms(s, [&] { piece_round_trip<<<1, 1, 0, s>>>(ch, k, n, status); });
                CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
                printf("# piece: FIFO round trip, %-38s %7.3f us (status %d)\n", rt_names[k],
                       ms * 1e3 / n, st);
            }
        }

        /* Head reservation, the floor of a host round trip, and the flush piece by piece. */
        {
            unsigned long long *word;
            CK(cudaMalloc(&word, 64));
            CK(cudaMemset(word, 0, 64));
            float ms = bench_time_ms(
                s, [&] { piece_atomic<<<1, 1, 0, s>>>(word, 0, n, (unsigned long long *)sink); });
            printf("# piece: GPU atomicAdd on device memory (dependent chain) %7.3f us each\n",
                   ms * 1e3 / n);
            cudaFree(word);
            uint64_t *bare;
            CK(cudaHostAlloc((void **)&bare, 4 * 4096 + 4096, cudaHostAllocMapped));
            for (long long gap : { 0ll, 600ll, 1100ll, 1600ll }) {
                float bms = time_bare_round_trip(s, bare, n, 1, 0, [&] {
                    piece_bare_round_trip<<<1, 1, 0, s>>>(bare, bare + 16, n, gap, status);
                });
                CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
                printf("# piece: bare GPU->CPU->GPU round trip (CPU thread spins), gap %4lld "
                       "cycles: %7.3f us (status %d)\n",
                       gap, bms * 1e3 / n, st);
            }
            /* K ack words: K loads in flight on different lines (or pages). */
            for (int stride : { 16, 512 }) {
                for (int k : { 1, 2, 4 }) {
                    for (long long gap : { 0ll, 2000ll / k }) {
                        if (k == 1 && gap > 0)
                            continue;
                        float bms = time_bare_round_trip(s, bare, n, k, stride, [&] {
                            if (k == 1)
                                piece_bare_mirrored<1>
                                    <<<1, 1, 0, s>>>(bare, bare + 16, stride, n, gap, status);
                            else if (k == 2)
                                piece_bare_mirrored<2>
                                    <<<1, 1, 0, s>>>(bare, bare + 16, stride, n, gap, status);
                            else
                                piece_bare_mirrored<4>
                                    <<<1, 1, 0, s>>>(bare, bare + 16, stride, n, gap, status);
                        });
                        CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
                        printf("# piece: bare round trip, %d ack words %4d B apart, gap %4lld "
                               "cycles: %7.3f us (status %d)\n",
                               k, stride * 8, gap, bms * 1e3 / n, st);
                    }
                }
            }
            cudaFreeHost(bare);
            unsigned long long *cyc, hc[4];
            CK(cudaMalloc(&cyc, 4 * sizeof(unsigned long long)));
            for (long long gap : { 0ll, 600ll, 1100ll }) {
                float fms = bench_time_ms(
                    s, [&] { piece_flush_breakdown<<<1, 1, 0, s>>>(ch, n, gap, cyc, status); });
                CK(cudaMemcpy(hc, cyc, sizeof(hc), cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
                double us_per_cycle = fms * 1e3 / (double)hc[3];
                printf("# piece: flush by parts, gap %4lld: %.3f us each = reserve %.3f + store "
                       "%.3f + wait %.3f us (%.0f MHz; status %d)\n",
                       gap, fms * 1e3 / n, hc[0] * us_per_cycle / n, hc[1] * us_per_cycle / n,
                       hc[2] * us_per_cycle / n, 1.0 / us_per_cycle, st);
            }
            cudaFree(cyc);
        }
        /* The proxy's side of a put_with_signal: CPU time per driver call, and the latency
         * until a CPU sees the copy engine's write. */
        CUstream cs = (CUstream)s;
        CUdeviceptr dst = (CUdeviceptr)(uintptr_t)peer_ptr, src = (CUdeviceptr)(uintptr_t)buf;
        const int m = 2000;
        double t0 = bench_now_us();
        for (int i = 0; i < m; i++)
            DK(cuMemcpyDtoDAsync(dst, src, 8, cs));
        double t1 = bench_now_us();
        CK(cudaStreamSynchronize(s));
        double t2 = bench_now_us();
        printf("# piece: cuMemcpyDtoDAsync 8 B to the peer: %.3f us per call (CPU), %.3f us each "
               "back to back\n",
               (t1 - t0) / m, (t2 - t0) / m);
        t0 = bench_now_us();
        for (int i = 0; i < m; i++)
            DK(cuStreamWriteValue64(cs, dst + 64, (cuuint64_t)i, CU_STREAM_WRITE_VALUE_DEFAULT));
        t1 = bench_now_us();
        CK(cudaStreamSynchronize(s));
        t2 = bench_now_us();
        printf("# piece: cuStreamWriteValue64 to the peer: %.3f us per call (CPU), %.3f us each "
               "back to back\n",
               (t1 - t0) / m, (t2 - t0) / m);
        {
            CUcontext ctx;
            DK(cuCtxGetCurrent(&ctx));
            t0 = bench_now_us();
            for (int i = 0; i < m; i++)
                DK(cuMemcpyAsync(dst, src, 8, cs));
            t1 = bench_now_us();
            CK(cudaStreamSynchronize(s));
            printf("# piece: cuMemcpyAsync 8 B to the peer: %.3f us per call (CPU)\n",
                   (t1 - t0) / m);
            t0 = bench_now_us();
            for (int i = 0; i < m; i++)
                DK(cuMemcpyDtoDAsync(src + 128, src, 8, cs));
            t1 = bench_now_us();
            CK(cudaStreamSynchronize(s));
            printf("# piece: cuMemcpyDtoDAsync 8 B within this GPU: %.3f us per call (CPU)\n",
                   (t1 - t0) / m);
        }
        CUdeviceptr hword = (CUdeviceptr)(uintptr_t)(host + 8);
        /* Values 1..m in device memory, for copies into host memory. */
        std::vector<uint64_t> vals(m + 1);
        for (int i = 0; i <= m; i++)
            vals[i] = (uint64_t)i;
        CK(cudaMemcpy(buf + 4096, vals.data(), (m + 1) * 8, cudaMemcpyHostToDevice));
        cudaEvent_t ev;
        CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        struct {
            const char *name;
            int kind;
        } lat[] = { { "cuStreamWriteValue64 to host memory", 0 },
                    { "cuMemcpyDtoHAsync 8 B to host memory", 1 },
                    { "DtoD 8 B to the peer + WriteValue64 to host", 2 },
                    { "DtoD 8 B to the peer + DtoH 8 B to host", 3 },
                    { "DtoD 8 B to the peer, event polled", 4 },
                    { "one batch: WriteValue64 to the peer + to host", 5 } };
        int prio_lo = 0, prio_hi = 0;
        CK(cudaDeviceGetStreamPriorityRange(&prio_lo, &prio_hi));
        cudaStream_t hs;
        CK(cudaStreamCreateWithPriority(&hs, cudaStreamNonBlocking, prio_hi));
        for (int pass = 0; pass < 2; pass++)
            for (auto &l : lat) {
                if (pass == 1 && l.kind != 2)
                    continue;
                if (pass == 1)
                    cs = (CUstream)hs;
                volatile uint64_t *hw = (volatile uint64_t *)(host + 8);
                *hw = 0;
                int ok = 1;
                double sum = 0, best = 1e9;
                for (int i = 1; i <= m && ok; i++) {
                    double a = bench_now_us();
                    if (l.kind >= 2 && l.kind <= 4)
                        DK(cuMemcpyDtoDAsync(dst, src, 8, cs));
                    if (l.kind == 5) {
                        CUstreamBatchMemOpParams ops[2];
                        memset(ops, 0, sizeof(ops));
                        ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
                        ops[0].writeValue.address = dst + 128;
                        ops[0].writeValue.value64 = (cuuint64_t)i;
                        ops[1] = ops[0];
                        ops[1].writeValue.address = hword;
                        DK(cuStreamBatchMemOp(cs, 2, ops, 0));
                    }
                    if (l.kind == 1 || l.kind == 3)
                        DK(cuMemcpyDtoHAsync((void *)(host + 8), src + 4096 + 8 * (size_t)i, 8,
                                             cs));
                    if (l.kind == 0 || l.kind == 2)
                        DK(cuStreamWriteValue64(cs, hword, (cuuint64_t)i,
                                                CU_STREAM_WRITE_VALUE_DEFAULT));
                    if (l.kind == 4) {
                        CK(cudaEventRecord(ev, s));
                        while (cudaEventQuery(ev) == cudaErrorNotReady) {
                        }
                    } else {
                        ok = spin_until(hw, (uint64_t)i);
                    }
                    double d = bench_now_us() - a;
                    sum += d;
                    best = std::min(best, d);
                }
                printf("# piece: issue -> CPU sees it, %-48s mean %7.3f us, best %7.3f us%s%s\n",
                       l.name, sum / m, best, ok ? "" : " (TIMED OUT)",
                       pass == 1 ? " (high-priority stream)" : "");
            }
        CK(cudaStreamSynchronize(hs));
        cudaStreamDestroy(hs);
        cs = (CUstream)s;
        cudaEventDestroy(ev);
        /* NUMA: where the library's FIFO memory is, and what a GPU read costs from each node. */
        int gpu_node = -1, nodes = 1;
        {
            char bus[64], path[256];
            int dev;
            CK(cudaGetDevice(&dev));
            CK(cudaDeviceGetPCIBusId(bus, sizeof(bus), dev));
            for (char *c = bus; *c; c++)
                *c = (char)tolower((unsigned char)*c);
            snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
            FILE *f = fopen(path, "r");
            if (f) {
                if (fscanf(f, "%d", &gpu_node) != 1)
                    gpu_node = -1;
                fclose(f);
            }
            f = fopen("/sys/devices/system/node/online", "r");
            int a = 0, b = 0;
            if (f) {
                if (fscanf(f, "%d-%d", &a, &b) == 2)
                    nodes = b + 1;
                fclose(f);
            }
        }
        int where = -1;
        long r = syscall(SYS_get_mempolicy, &where, NULL, 0, (void *)ch.fifo.flush_done,
                         3 /* MPOL_F_NODE | MPOL_F_ADDR */);
        int where_ring = -1;
        long r2 = syscall(SYS_get_mempolicy, &where_ring, NULL, 0, (void *)ch.fifo.triggers, 3);
        printf("# piece: GPU on NUMA node %d of %d; the FIFO's flush_done page is on node %d, its "
               "ring on node %d (get_mempolicy %ld %ld); this thread runs on CPU %d\n",
               gpu_node, nodes, where, where_ring, r, r2, sched_getcpu());
        for (int node = 0; node < nodes && node < 64; node++) {
            void *mem =
                mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            unsigned long mask = 1ul << node;
            long br = syscall(SYS_mbind, mem, 4096, 2 /* MPOL_BIND */, &mask, 64, 0);
            memset(mem, 0, 4096);
            int got = -1;
            syscall(SYS_get_mempolicy, &got, NULL, 0, mem, 3);
            CK(cudaHostRegister(mem, 4096, cudaHostRegisterMapped));
            uint64_t *dptr;
            CK(cudaHostGetDevicePointer((void **)&dptr, mem, 0));
            float ms = bench_time_ms(
                s, [&] { piece_host_read<<<1, 1, 0, s>>>(dptr, 0, kLdRelaxed, n, sink); });
            printf("# piece: GPU read of host memory on node %d (mbind %ld, page on node %d): "
                   "%7.3f us each\n",
                   node, br, got, ms * 1e3 / n);
            cudaHostUnregister(mem);
            munmap(mem, 4096);
        }
        cudaFreeHost(host);
        cudaFreeHost(ring);
        cudaFree(sink);
    }
    MK(maco_bootstrap_barrier(bs));
    const char *pp_names[] = { "put_with_signal 8 B (inline)", "signal only",
                               "put_with_signal 8 B copied, gpu fence",
                               "put_with_signal 64 B (copied)",
                               "put_with_signal 8 B inline, gpu fence" };
    for (int k = 0; k < 5; k++) {
        const int iters = 10000;
        float ms = bench_time_ms(
            s, [&] { piece_ping_pong<<<1, 1, 0, s>>>(ch, k, iters, rank == 0, status); });
        CK(cudaMemcpy(&st, status, sizeof(int), cudaMemcpyDeviceToHost));
        if (rank == 0)
            printf("# piece: ping-pong, %-22s %7.3f us per round trip (status %d)\n", pp_names[k],
                   ms * 1e3 / iters, st);
        MK(maco_bootstrap_barrier(bs));
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    bench_pair pr;
    const size_t kMax = (size_t)1 << 30;
    bench_pair_open("bench_port_channel", kMax, &pr);
    const int rank = pr.rank;
    maco_bootstrap_t bs = pr.bs;
    cudaStream_t s = pr.s;
    int *status = pr.status;
    maco_proxy_t proxy;
    MK(maco_proxy_create(pr.comm, &proxy));
    MK(maco_proxy_start(proxy));
    maco_port_channel_t chan;
    MK(maco_port_channel_create(proxy, 1 - rank, MACO_TRANSPORT_CUDA_COPY, pr.mine, pr.theirs,
                                &chan));
    maco_port_channel_device_t ch;
    MK(maco_port_channel_get_device_handle(chan, &ch));
    const bool pieces = argc > 1 && strcmp(argv[1], "--pieces") == 0;

    if (pieces) {
        run_pieces(rank, bs, ch, pr.buf, pr.peer_ptr, s, status);
    } else if (rank == 0) {
        const int iters = 20000;
        float ms = bench_time_ms(s, [&] { fifo_round_trip<<<1, 1, 0, s>>>(ch, iters, status); });
        printf("# FIFO round trip (push a flush, proxy takes it, GPU sees it done): %d in %.3f ms: "
               "%.3f us each (status %d)\n",
               iters, ms, ms * 1e3 / iters, bench_pair_status(&pr));
        for (int put_path = 1; put_path >= 0; put_path--) {
            ms = bench_time_ms(
                s, [&] { fifo_throughput<<<1, 1, 0, s>>>(ch, 10 * iters, put_path, status); });
            printf("# FIFO push throughput, %s (one GPU thread pushes, waits only on a full ring): "
                   "%d in %.3f ms: %.3f us per trigger (status %d)\n",
                   put_path ? "puts (GPU-scope fence)" : "system-scope release pushes", 10 * iters,
                   ms, ms * 1e3 / (10 * iters), bench_pair_status(&pr));
        }
    }
    MK(maco_bootstrap_barrier(bs));
    for (uint64_t bytes : { 8ull, 64ull }) {
        if (pieces)
            break;
        /* Three launches of 10000 round trips; the median, and all three. */
        const int iters = 10000;
        std::vector<double> us;
        int st = MACO_OK;
        for (int rep = 0; rep < 3; rep++) {
            MK(maco_bootstrap_barrier(bs));
            float ms = bench_time_ms(
                s, [&] { ping_pong<<<1, 1, 0, s>>>(ch, iters, bytes, rank == 0, status); });
            us.push_back(ms * 1e3 / iters);
            if (st == MACO_OK)
                st = bench_pair_status(&pr);
        }
        std::vector<double> sorted = us;
        std::sort(sorted.begin(), sorted.end());
        if (rank == 0)
            printf("# put_with_signal ping-pong (%llu bytes each way, %s): %.3f us per round trip "
                   "(median of 3 launches of %d: %.3f %.3f %.3f; status %d)\n",
                   (unsigned long long)bytes,
                   bytes == 8 ? "inline: a stream memory operation" : "a copy-engine copy",
                   sorted[1], iters, us[0], us[1], us[2], st);
        MK(maco_bootstrap_barrier(bs));
    }
    MK(maco_bootstrap_barrier(bs));
    if (rank == 0 && !pieces) {
        printf("# bandwidth rank 0 -> rank 1, GB/s (median of 5): port = put + flush per "
               "iteration; copy = cudaMemcpyAsync into the mapped peer buffer\n");
        printf("%12s %10s %10s %8s\n", "size(B)", "port", "copy", "port/copy");
        for (size_t bytes = 1024; bytes <= kMax; bytes *= 4) {
            int reps =
                (int)std::max<size_t>(1, std::min<size_t>(2000, (size_t)4000000000ull / bytes + 1));
            double res[2];
            for (int k = 0; k < 2; k++) {
                std::vector<double> gbps;
                for (int t = 0; t < 5; t++) {
                    float ms = bench_time_ms(s, [&] {
                        if (k == 0) {
                            put_flush<<<1, 1, 0, s>>>(ch, bytes, reps, status);
                        } else {
                            for (int i = 0; i < reps; i++)
                                CK(cudaMemcpyAsync(pr.peer_ptr, pr.buf, bytes, cudaMemcpyDefault,
                                                   s));
                        }
                    });
                    gbps.push_back((double)bytes * reps / (ms * 1e-3) / 1e9);
                }
                std::sort(gbps.begin(), gbps.end());
                res[k] = gbps[2];
            }
            printf("%12zu %10.2f %10.2f %8.2f%s\n", bytes, res[0], res[1], res[0] / res[1],
                   bench_pair_status(&pr) == MACO_OK ? "" : "  (a put_flush failed)");
            fflush(stdout);
        }
    }
    MK(maco_bootstrap_barrier(bs));
    MK(maco_proxy_stop(proxy));
    maco_port_channel_destroy(chan);
    maco_proxy_destroy(proxy);
    bench_pair_close(&pr);
    return 0;
}
