/*
 * nccl_1proc_check.c - one process driving every visible GPU through nccl.h, as CuPy's
 * NcclCommunicator.initAll and nccl-tests -g N do: ncclCommInitAll over all visible GPUs
 * (at least 2), then groups with one call per communicator, all issued from this one thread,
 * with GPU 0 current at ncclGroupEnd (CuPy's `with cupy.cuda.Device(i):` blocks end before
 * groupEnd). Checks, bit for bit, random integers against sums and copies made on the host,
 * every received buffer poisoned first and the bytes past it still poison afterwards:
 *   1. CuPy's sequence: ncclGroupStart, one ncclAllReduce per device, ncclGroupEnd, on each
 *      kind of stream: 0 (the legacy default stream), cudaStreamLegacy, cudaStreamPerThread,
 *      a non-blocking stream and a blocking stream of each device; a small and a large count;
 *   2. ncclSend and ncclRecv in place over a ring (nccl-tests' sendrecv_perf, in-place pass:
 *      send X to rank r + 1, receive into X from rank r - 1);
 *   3. buffers from ncclMemAlloc registered with ncclCommRegister and ncclCommWindowRegister
 *      while another GPU is current (nccl-tests -R 1 and -R 2), then allreduces in place on
 *      them;
 *   4. that no call changed the calling thread's current device (NCCL's calls leave it as
 *      they found it), after every call above and after ncclCommDestroy.
 * A watchdog (alarm(2), TEST_TIMEOUT seconds, default 240) turns a hang into a failure that
 * names the step it stopped in.
 *
 *   nccl_1proc_check            (TEST_TIMEOUT=S to change the watchdog)
 * Linked to libnccl.so.2: MACO's (found first through the run path, LD_LIBRARY_PATH or
 * LD_PRELOAD) or NVIDIA's, which passes it too (so the checks themselves are checked).
 * Exit 0 when every check passed, 1 on a wrong value, an error or a hang, 77 with fewer than
 * 2 GPUs (the reason printed).
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_DEV = 16, GUARD = 64 /* poisoned elements past every received buffer */ };

static int g_ndev;
static ncclComm_t g_comms[MAX_DEV];
static volatile const char *g_step = "start";
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static void on_alarm(int sig)
{
    (void)sig;
    static const char head[] = "FAIL: nccl_1proc_check: hang: no progress within TEST_TIMEOUT in ";
    const char *step = (const char *)g_step;
    if (write(2, head, sizeof(head) - 1) < 0 || write(2, step, strlen(step)) < 0 ||
        write(2, "\n", 1) < 0)
        _exit(1);
    _exit(1);
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL: nccl_1proc_check: %s: ", (const char *)g_step);                     \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)
#define CHECK_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            FAIL("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));              \
    } while (0)
#define CHECK_NCCL(call)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            FAIL("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call, ncclGetErrorString(r_),          \
                 ncclGetLastError(NULL));                                                          \
    } while (0)

/* xorshift64*: reproducible random integers in [-1000, 1000] (a sum over 16 ranks fits). */
static int32_t next_value(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (int32_t)(((g_rng * 0x2545F4914F6CDD1Dull) >> 33) % 2001) - 1000;
}

/* The current device must still be `want` after `what`. */
static void expect_device(int want, const char *what)
{
    int cur = -1;
    CHECK_CUDA(cudaGetDevice(&cur));
    if (cur != want)
        FAIL("after %s the calling thread's current device is %d, not %d as before the call", what,
             cur, want);
}

/* Every communicator's asynchronous error must be ncclSuccess. */
static void expect_no_async_error(void)
{
    for (int i = 0; i < g_ndev; i++) {
        ncclResult_t a = ncclSuccess;
        CHECK_NCCL(ncclCommGetAsyncError(g_comms[i], &a));
        if (a != ncclSuccess)
            FAIL("communicator %d has an asynchronous error: %s (%s)", i, ncclGetErrorString(a),
                 ncclGetLastError(g_comms[i]));
    }
}

/* The kinds of stream a client may pass. */
enum { S_NULL, S_LEGACY, S_PER_THREAD, S_NONBLOCKING, S_BLOCKING, S_KINDS };
static const char *const kind_names[S_KINDS] = { "stream 0", "cudaStreamLegacy",
                                                 "cudaStreamPerThread", "a non-blocking stream",
                                                 "a blocking stream" };
static cudaStream_t g_made[2][MAX_DEV]; /* the created ones: [non-blocking, blocking][device] */

static cudaStream_t stream_of(int kind, int dev)
{
    switch (kind) {
    case S_NULL:
        return (cudaStream_t)0;
    case S_LEGACY:
        return cudaStreamLegacy;
    case S_PER_THREAD:
        return cudaStreamPerThread;
    case S_NONBLOCKING:
        return g_made[0][dev];
    default:
        return g_made[1][dev];
    }
}

/* Waits for device `dev`'s stream of `kind`, with that device current. */
static void sync_stream(int kind, int dev)
{
    CHECK_CUDA(cudaSetDevice(dev));
    CHECK_CUDA(cudaStreamSynchronize(stream_of(kind, dev)));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(0));
}

/* A device buffer of count + GUARD int32 on each device: the first `count` from host[i] (or
 * poison when host is NULL), the guard poison. */
static void upload(int32_t **dev_bufs, int32_t *const *host, size_t count)
{
    for (int i = 0; i < g_ndev; i++) {
        CHECK_CUDA(cudaSetDevice(i));
        CHECK_CUDA(cudaMemset(dev_bufs[i], 0xFF, (count + GUARD) * sizeof(int32_t)));
        if (host != NULL)
            CHECK_CUDA(
                cudaMemcpy(dev_bufs[i], host[i], count * sizeof(int32_t), cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    CHECK_CUDA(cudaSetDevice(0));
}

/* Device i's buffer must hold want(i) in its first `count` elements and poison after them. */
static void expect_buffers(int32_t **dev_bufs, size_t count, int32_t *(*want)(int, void *),
                           void *ctx, const char *what)
{
    int32_t *got = malloc((count + GUARD) * sizeof(int32_t));
    if (got == NULL)
        FAIL("out of host memory");
    for (int i = 0; i < g_ndev; i++) {
        CHECK_CUDA(cudaSetDevice(i));
        CHECK_CUDA(cudaMemcpy(got, dev_bufs[i], (count + GUARD) * sizeof(int32_t),
                              cudaMemcpyDeviceToHost));
        const int32_t *w = want(i, ctx);
        size_t wrong = 0, first = 0;
        for (size_t j = 0; j < count; j++)
            if (got[j] != w[j] && wrong++ == 0)
                first = j;
        if (wrong > 0)
            FAIL("%s, %zu elements: rank %d has %zu wrong values (first at %zu: %d, expected %d)",
                 what, count, i, wrong, first, got[first], w[first]);
        for (size_t j = count; j < count + GUARD; j++)
            if (got[j] != -1)
                FAIL("%s, %zu elements: rank %d wrote past its buffer (element %zu is %d)", what,
                     count, i, j, got[j]);
    }
    free(got);
    CHECK_CUDA(cudaSetDevice(0));
}

static int32_t *g_in[MAX_DEV], *g_sum;

static int32_t *want_sum(int rank, void *ctx)
{
    (void)rank;
    (void)ctx;
    return g_sum;
}

static int32_t *want_prev(int rank, void *ctx)
{
    (void)ctx;
    return g_in[(rank + g_ndev - 1) % g_ndev];
}

/* Fresh random inputs in g_in[0..ndev) and their sum in g_sum. */
static void make_inputs(size_t count)
{
    for (int i = 0; i < g_ndev; i++)
        for (size_t j = 0; j < count; j++)
            g_in[i][j] = next_value();
    for (size_t j = 0; j < count; j++) {
        int32_t s = 0;
        for (int i = 0; i < g_ndev; i++)
            s += g_in[i][j];
        g_sum[j] = s;
    }
}

/* 1. CuPy's sequence on streams of `kind`: out of place, then in place. */
static void allreduce_case(int kind, size_t count, int32_t **send, int32_t **recv)
{
    char what[160];
    snprintf(what, sizeof(what), "allreduce on %s", kind_names[kind]);
    g_step = what;
    for (int in_place = 0; in_place < 2; in_place++) {
        make_inputs(count);
        upload(send, g_in, count);
        if (!in_place)
            upload(recv, NULL, count);
        int32_t **out = in_place ? send : recv;
        CHECK_NCCL(ncclGroupStart());
        for (int i = 0; i < g_ndev; i++) {
            CHECK_CUDA(cudaSetDevice(i));
            CHECK_NCCL(ncclAllReduce(send[i], out[i], count, ncclInt32, ncclSum, g_comms[i],
                                     stream_of(kind, i)));
            expect_device(i, "ncclAllReduce inside a group");
            CHECK_CUDA(cudaSetDevice(0));
        }
        CHECK_NCCL(ncclGroupEnd());
        expect_device(0, "ncclGroupEnd");
        for (int i = 0; i < g_ndev; i++)
            sync_stream(kind, i);
        expect_buffers(out, count, want_sum, NULL, in_place ? "allreduce in place" : what);
    }
    expect_no_async_error();
}

/* 2. The ring in place: send X to r + 1, receive into X from r - 1. */
static void sendrecv_in_place(size_t count, int32_t **x)
{
    g_step = "sendrecv in place (ring)";
    make_inputs(count);
    upload(x, g_in, count);
    CHECK_NCCL(ncclGroupStart());
    for (int i = 0; i < g_ndev; i++) {
        CHECK_CUDA(cudaSetDevice(i));
        CHECK_NCCL(ncclSend(x[i], count, ncclInt32, (i + 1) % g_ndev, g_comms[i],
                            stream_of(S_NONBLOCKING, i)));
        CHECK_NCCL(ncclRecv(x[i], count, ncclInt32, (i + g_ndev - 1) % g_ndev, g_comms[i],
                            stream_of(S_NONBLOCKING, i)));
        CHECK_CUDA(cudaSetDevice(0));
    }
    CHECK_NCCL(ncclGroupEnd());
    expect_device(0, "ncclGroupEnd");
    for (int i = 0; i < g_ndev; i++)
        sync_stream(S_NONBLOCKING, i);
    expect_buffers(x, count, want_prev, NULL, "sendrecv in place");
    expect_no_async_error();
}

/* 3. ncclMemAlloc buffers registered while another GPU is current, then allreduce in place
 * on them (on stream 0, as CuPy would). */
static void registered_case(size_t count)
{
    size_t bytes = (count + GUARD) * sizeof(int32_t);
    int32_t *reg[MAX_DEV], *win[MAX_DEV];
    void *handles[MAX_DEV];
    ncclWindow_t wins[MAX_DEV];
    g_step = "ncclMemAlloc";
    for (int i = 0; i < g_ndev; i++) {
        CHECK_CUDA(cudaSetDevice(i));
        CHECK_NCCL(ncclMemAlloc((void **)&reg[i], bytes));
        CHECK_NCCL(ncclMemAlloc((void **)&win[i], bytes));
        expect_device(i, "ncclMemAlloc");
        struct cudaPointerAttributes a;
        CHECK_CUDA(cudaPointerGetAttributes(&a, reg[i]));
        if (a.device != i)
            FAIL("ncclMemAlloc with device %d current gave memory of device %d", i, a.device);
    }
    /* A copy between one GPU's ncclMemAlloc buffers issued with another GPU current, on the
     * owner's stream (nccl-tests' hypercube_perf does this; NCCL's memory allows it). */
    g_step = "cudaMemcpyAsync between ncclMemAlloc buffers with another GPU current";
    for (int i = 0; i < g_ndev; i++) {
        int other = (i + 1) % g_ndev;
        unsigned char got[64];
        CHECK_CUDA(cudaSetDevice(i));
        CHECK_CUDA(cudaMemset(win[i], 0x5A + i, bytes));
        CHECK_CUDA(cudaMemset(reg[i], 0, bytes));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaSetDevice(other));
        CHECK_CUDA(cudaMemcpyAsync(reg[i], win[i], bytes, cudaMemcpyDeviceToDevice, g_made[0][i]));
        CHECK_CUDA(cudaStreamSynchronize(g_made[0][i]));
        CHECK_CUDA(cudaMemcpy(got, (char *)reg[i] + bytes - sizeof(got), sizeof(got),
                              cudaMemcpyDeviceToHost));
        for (size_t b = 0; b < sizeof(got); b++)
            if (got[b] != (unsigned char)(0x5A + i))
                FAIL("device %d's copy with device %d current: byte %zu is 0x%02x, not 0x%02x", i,
                     other, bytes - sizeof(got) + b, got[b], 0x5A + i);
    }
    g_step = "ncclCommRegister with another GPU current";
    for (int i = 0; i < g_ndev; i++) {
        int other = (i + 1) % g_ndev;
        CHECK_CUDA(cudaSetDevice(other));
        CHECK_NCCL(ncclCommRegister(g_comms[i], reg[i], bytes, &handles[i]));
        expect_device(other, "ncclCommRegister");
    }
    g_step = "ncclCommWindowRegister with another GPU current";
    CHECK_NCCL(ncclGroupStart()); /* collective in NCCL: one call per rank in one group */
    for (int i = 0; i < g_ndev; i++) {
        int other = (i + 1) % g_ndev;
        CHECK_CUDA(cudaSetDevice(other));
        CHECK_NCCL(
            ncclCommWindowRegister(g_comms[i], win[i], bytes, &wins[i], NCCL_WIN_COLL_SYMMETRIC));
        expect_device(other, "ncclCommWindowRegister");
    }
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_NCCL(ncclGroupEnd());
    expect_device(0, "ncclGroupEnd after ncclCommWindowRegister");
    int32_t **bufs[2] = { reg, win };
    static const char *const names[2] = { "allreduce in place on ncclCommRegister buffers",
                                          "allreduce in place on ncclCommWindowRegister windows" };
    for (int b = 0; b < 2; b++) {
        for (int round = 0; round < 2; round++) { /* the second finds the peers mapped */
            g_step = names[b];
            make_inputs(count);
            upload(bufs[b], g_in, count);
            CHECK_NCCL(ncclGroupStart());
            for (int i = 0; i < g_ndev; i++) {
                CHECK_CUDA(cudaSetDevice(i));
                CHECK_NCCL(ncclAllReduce(bufs[b][i], bufs[b][i], count, ncclInt32, ncclSum,
                                         g_comms[i], (cudaStream_t)0));
                CHECK_CUDA(cudaSetDevice(0));
            }
            CHECK_NCCL(ncclGroupEnd());
            expect_device(0, "ncclGroupEnd");
            for (int i = 0; i < g_ndev; i++)
                sync_stream(S_NULL, i);
            expect_buffers(bufs[b], count, want_sum, NULL, names[b]);
        }
    }
    expect_no_async_error();
    g_step = "ncclCommDeregister, ncclCommWindowDeregister, ncclMemFree";
    for (int i = 0; i < g_ndev; i++) {
        CHECK_NCCL(ncclCommDeregister(g_comms[i], handles[i]));
        expect_device(0, "ncclCommDeregister");
    }
    CHECK_NCCL(ncclGroupStart());
    for (int i = 0; i < g_ndev; i++)
        CHECK_NCCL(ncclCommWindowDeregister(g_comms[i], wins[i]));
    CHECK_NCCL(ncclGroupEnd());
    expect_device(0, "ncclCommWindowDeregister");
    for (int i = 0; i < g_ndev; i++) {
        CHECK_NCCL(ncclMemFree(reg[i]));
        CHECK_NCCL(ncclMemFree(win[i]));
    }
    expect_device(0, "ncclMemFree");
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
        printf("SKIP: nccl_1proc_check drives 2 or more GPUs from one process; this machine has "
               "%d usable CUDA device(s)\n",
               ndev < 0 ? 0 : ndev);
        return 77;
    }
    g_ndev = ndev > MAX_DEV ? MAX_DEV : ndev;
    const char *t = getenv("TEST_TIMEOUT");
    unsigned timeout = t != NULL && atoi(t) > 0 ? (unsigned)atoi(t) : 240u;
    signal(SIGALRM, on_alarm);
    alarm(timeout);
    int version = 0;
    CHECK_NCCL(ncclGetVersion(&version));
    printf("nccl_1proc_check: %d GPUs in one process, NCCL version %d, watchdog %u s\n", g_ndev,
           version, timeout);

    g_step = "ncclCommInitAll";
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_NCCL(ncclCommInitAll(g_comms, g_ndev, NULL));
    expect_device(0, "ncclCommInitAll");
    for (int i = 0; i < g_ndev; i++) {
        int d = -1;
        CHECK_NCCL(ncclCommCuDevice(g_comms[i], &d));
        if (d != i)
            FAIL("ncclCommInitAll: communicator %d is on device %d", i, d);
    }

    g_step = "setup";
    const size_t counts[2] = { 1003, (size_t)(4 << 20) + 5 };
    const size_t max_count = counts[1];
    int32_t *send[MAX_DEV], *recv[MAX_DEV];
    for (int i = 0; i < g_ndev; i++) {
        CHECK_CUDA(cudaSetDevice(i));
        CHECK_CUDA(cudaMalloc((void **)&send[i], (max_count + GUARD) * sizeof(int32_t)));
        CHECK_CUDA(cudaMalloc((void **)&recv[i], (max_count + GUARD) * sizeof(int32_t)));
        CHECK_CUDA(cudaStreamCreateWithFlags(&g_made[0][i], cudaStreamNonBlocking));
        CHECK_CUDA(cudaStreamCreate(&g_made[1][i]));
        g_in[i] = malloc(max_count * sizeof(int32_t));
        if (g_in[i] == NULL)
            FAIL("out of host memory");
    }
    g_sum = malloc(max_count * sizeof(int32_t));
    if (g_sum == NULL)
        FAIL("out of host memory");
    CHECK_CUDA(cudaSetDevice(0));

    for (int kind = 0; kind < S_KINDS; kind++)
        for (int c = 0; c < 2; c++)
            allreduce_case(kind, counts[c], send, recv);
    printf("PASS: allreduce (CuPy's sequence) on stream 0, cudaStreamLegacy, cudaStreamPerThread, "
           "non-blocking and blocking streams\n");
    for (int c = 0; c < 2; c++)
        sendrecv_in_place(counts[c], send);
    printf("PASS: sendrecv in place over the ring\n");
    for (int c = 0; c < 2; c++)
        registered_case(counts[c]);
    printf("PASS: ncclMemAlloc buffers copied and registered (ncclCommRegister, "
           "ncclCommWindowRegister) with another GPU current, allreduce in place on them\n");

    g_step = "ncclCommDestroy";
    for (int i = 0; i < g_ndev; i++) {
        CHECK_CUDA(cudaSetDevice(i));
        CHECK_CUDA(cudaStreamDestroy(g_made[0][i]));
        CHECK_CUDA(cudaStreamDestroy(g_made[1][i]));
        CHECK_CUDA(cudaFree(send[i]));
        CHECK_CUDA(cudaFree(recv[i]));
        free(g_in[i]);
    }
    free(g_sum);
    CHECK_CUDA(cudaSetDevice(0));
    for (int i = 0; i < g_ndev; i++) {
        CHECK_NCCL(ncclCommDestroy(g_comms[i]));
        expect_device(0, "ncclCommDestroy");
    }
    alarm(0);
    printf("PASS: nccl_1proc_check: every check passed on %d GPUs\n", g_ndev);
    return 0;
}
