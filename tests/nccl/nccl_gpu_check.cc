/*
 * nccl_gpu_check.cc - an application written only against nccl.h (and the CUDA runtime) that
 * calls NCCL's functions with fresh random data and checks every result element against
 * values computed on the host. Linked to libnccl.so; run it with MACO's libnccl.so.2 first in
 * the search path (LD_LIBRARY_PATH=build/nccl, or LD_PRELOAD) or with the real NCCL.
 *
 *   maco-run -n N nccl_gpu_check [--expect-forwarded NAME,NAME...]
 * Ranks from MACO_RANK/MACO_WORLD_SIZE (maco-run) or RANK/WORLD_SIZE (torchrun); the job's
 * id from NCCL_COMM_ID, else from MACO_BOOTSTRAP_ADDR or MASTER_ADDR:MASTER_PORT+1 (set as
 * NCCL_COMM_ID, which both NCCL and MACO's library understand). With MACO's library it also
 * reads its call counters (dlsym, so the program still runs on the real NCCL) and fails when a
 * call went to NCCL, unless named by --expect-forwarded (those must have been forwarded:
 * MACO_NCCL_FORWARD sends them there).
 * Exit 0 when every check passed, 1 on a wrong value or error, 77 when there is no GPU.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace
{

int g_rank, g_nranks, g_failures;
bool g_avg_fp8 = true; /* the library runs ncclAvg on fp8 (MACO's does, NCCL 2.28's does not) */
std::map<std::string, long> g_wrong; /* wrong values by check */
std::mt19937_64 g_rng;

#define CHECK_NCCL(call)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s:%d: %s failed: %s (%s)\n", g_rank, __FILE__, __LINE__,    \
                    #call, ncclGetErrorString(r_), ncclGetLastError(nullptr));                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CHECK_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s:%d: %s: %s\n", g_rank, __FILE__, __LINE__, #call,         \
                    cudaGetErrorString(e_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

const ncclDataType_t kTypes[] = { ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                  ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                  ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2 };
const char *kTypeNames[] = { "int8",    "uint8",   "int32",   "uint32",   "int64",   "uint64",
                             "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2" };
const char *kOpNames[] = { "sum", "prod", "max", "min", "avg" };

size_t Size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

bool IsFloat(ncclDataType_t t)
{
    return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
           t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}
bool IsUnsigned(ncclDataType_t t)
{
    return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}

void Put(ncclDataType_t t, double v, void *p)
{
    switch (t) {
    case ncclInt8:
        *static_cast<int8_t *>(p) = static_cast<int8_t>(v);
        break;
    case ncclUint8:
        *static_cast<uint8_t *>(p) = static_cast<uint8_t>(v);
        break;
    case ncclInt32:
        *static_cast<int32_t *>(p) = static_cast<int32_t>(v);
        break;
    case ncclUint32:
        *static_cast<uint32_t *>(p) = static_cast<uint32_t>(v);
        break;
    case ncclInt64:
        *static_cast<int64_t *>(p) = static_cast<int64_t>(v);
        break;
    case ncclUint64:
        *static_cast<uint64_t *>(p) = static_cast<uint64_t>(v);
        break;
    case ncclFloat16:
        *static_cast<__half *>(p) = __float2half(static_cast<float>(v));
        break;
    case ncclFloat32:
        *static_cast<float *>(p) = static_cast<float>(v);
        break;
    case ncclFloat64:
        *static_cast<double *>(p) = v;
        break;
    case ncclBfloat16:
        *static_cast<__nv_bfloat16 *>(p) = __float2bfloat16(static_cast<float>(v));
        break;
    case ncclFloat8e4m3:
        *static_cast<__nv_fp8_e4m3 *>(p) = __nv_fp8_e4m3(static_cast<float>(v));
        break;
    case ncclFloat8e5m2:
        *static_cast<__nv_fp8_e5m2 *>(p) = __nv_fp8_e5m2(static_cast<float>(v));
        break;
    default:
        break;
    }
}

double Get(ncclDataType_t t, const void *p)
{
    switch (t) {
    case ncclInt8:
        return *static_cast<const int8_t *>(p);
    case ncclUint8:
        return *static_cast<const uint8_t *>(p);
    case ncclInt32:
        return *static_cast<const int32_t *>(p);
    case ncclUint32:
        return *static_cast<const uint32_t *>(p);
    case ncclInt64:
        return static_cast<double>(*static_cast<const int64_t *>(p));
    case ncclUint64:
        return static_cast<double>(*static_cast<const uint64_t *>(p));
    case ncclFloat16:
        return __half2float(*static_cast<const __half *>(p));
    case ncclFloat32:
        return *static_cast<const float *>(p);
    case ncclFloat64:
        return *static_cast<const double *>(p);
    case ncclBfloat16:
        return __bfloat162float(*static_cast<const __nv_bfloat16 *>(p));
    case ncclFloat8e4m3:
        return static_cast<float>(*static_cast<const __nv_fp8_e4m3 *>(p));
    case ncclFloat8e5m2:
        return static_cast<float>(*static_cast<const __nv_fp8_e5m2 *>(p));
    default:
        return 0;
    }
}

/* Relative tolerance of a type: exact for integers; about two units in the last place of the
 * type for floats (NCCL and MACO round differently; MACO's rounding is checked bitwise by its
 * own tests). */
double Tolerance(ncclDataType_t t)
{
    switch (t) {
    case ncclFloat8e4m3:
        return 0.13;
    case ncclFloat8e5m2:
        return 0.26;
    case ncclBfloat16:
        return 1.0 / 64;
    case ncclFloat16:
        return 1.0 / 512;
    case ncclFloat32:
        return 1e-6;
    case ncclFloat64:
        return 1e-12;
    default:
        return 0;
    }
}

/* Element i of rank r's input in call number `call`: small integers, so every exact result
 * fits every type (sums of up to 8 ranks of [-8, 8]; products of {1, 2, -1, -2}). */
double Input(uint64_t seed, int call, int r, size_t i, ncclDataType_t t, ncclRedOp_t op)
{
    uint64_t h = seed ^ (static_cast<uint64_t>(call) * 0x9E3779B97F4A7C15ull) ^
                 (static_cast<uint64_t>(r) << 48) ^ (i * 0xBF58476D1CE4E5B9ull);
    h ^= h >> 31;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    if (op == ncclProd) {
        double v = (h & 1) ? 2 : 1;
        return (!IsUnsigned(t) && (h & 2)) ? -v : v;
    }
    int v = static_cast<int>(h % 9);
    return IsUnsigned(t) ? v : v - 4;
}

double Reduce(const std::vector<double> &vals, ncclRedOp_t op, ncclDataType_t t)
{
    double acc = vals[0];
    for (size_t k = 1; k < vals.size(); k++) {
        switch (op) {
        case ncclProd:
            acc *= vals[k];
            break;
        case ncclMax:
            acc = std::max(acc, vals[k]);
            break;
        case ncclMin:
            acc = std::min(acc, vals[k]);
            break;
        default:
            acc += vals[k];
            break;
        }
    }
    if (op == ncclAvg)
        acc = IsFloat(t) ? acc / static_cast<double>(vals.size())
                         : std::trunc(acc / static_cast<double>(vals.size()));
    return acc;
}

/* A device buffer of `count` elements with its host copy. */
struct Buf {
    ncclDataType_t t;
    size_t count;
    void *dev = nullptr;
    std::vector<uint8_t> host;
    Buf(ncclDataType_t type, size_t n)
        : t(type), count(n), host(std::max<size_t>(n, 1) * Size(type))
    {
        CHECK_CUDA(cudaMalloc(&dev, host.size()));
    }
    ~Buf()
    {
        cudaFree(dev);
    }
    /* cudaMemcpy from pageable memory may return before the data lands, and the collectives
     * run on a non-blocking stream: wait for the device. */
    void Upload()
    {
        CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    void Download()
    {
        CHECK_CUDA(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
    }
    void Set(size_t i, double v)
    {
        Put(t, v, &host[i * Size(t)]);
    }
    double At(size_t i) const
    {
        return Get(t, &host[i * Size(t)]);
    }
    void *Ptr(size_t elem) const
    {
        return static_cast<uint8_t *>(dev) + elem * Size(t);
    }
};

/* Compares got with the exact value rounded to the type; counts and prints the first few
 * misses. */
void Expect(const char *what, ncclDataType_t t, size_t i, double got, double exact)
{
    uint8_t tmp[8];
    Put(t, exact, tmp);
    double want = Get(t, tmp);
    double tol = Tolerance(t) * std::max(1.0, std::fabs(want));
    if (std::fabs(got - want) <= tol)
        return;
    g_wrong[what]++;
    if (g_failures++ < 10)
        fprintf(stderr, "rank %d: %s: element %zu is %g, expected %g\n", g_rank, what, i, got,
                want);
}

uint64_t SharedSeed(ncclComm_t comm, cudaStream_t s)
{
    uint64_t seed = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
    uint64_t *d;
    CHECK_CUDA(cudaMalloc(&d, sizeof(seed)));
    CHECK_CUDA(cudaMemcpy(d, &seed, sizeof(seed), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_NCCL(ncclBroadcast(d, d, 1, ncclUint64, 0, comm, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(&seed, d, sizeof(seed), cudaMemcpyDeviceToHost));
    cudaFree(d);
    return seed;
}

int g_call;

void TestAllReduce(ncclComm_t comm, cudaStream_t s, uint64_t seed, size_t count, bool in_place)
{
    for (int ti = 0; ti < 12; ti++) {
        ncclDataType_t t = kTypes[ti];
        for (int o = 0; o < 5; o++) {
            ncclRedOp_t op = static_cast<ncclRedOp_t>(o);
            /* NCCL 2.28 refuses ncclAvg on fp8 (MACO runs it). */
            if (!g_avg_fp8 && o == ncclAvg && (t == ncclFloat8e4m3 || t == ncclFloat8e5m2))
                continue;
            int call = g_call++;
            Buf in(t, count), out(t, count);
            for (size_t i = 0; i < count; i++)
                in.Set(i, Input(seed, call, g_rank, i, t, op));
            in.Upload();
            void *dst = in_place ? in.dev : out.dev;
            CHECK_NCCL(ncclAllReduce(in.dev, dst, count, t, op, comm, s));
            CHECK_CUDA(cudaStreamSynchronize(s));
            Buf &res = in_place ? in : out;
            res.Download();
            char what[96];
            snprintf(what, sizeof(what), "allreduce %s %s count %zu%s", kTypeNames[ti], kOpNames[o],
                     count, in_place ? " in place" : "");
            std::vector<double> v(static_cast<size_t>(g_nranks));
            for (size_t i = 0; i < count; i++) {
                for (int r = 0; r < g_nranks; r++) {
                    uint8_t tmp[8];
                    Put(t, Input(seed, call, r, i, t, op), tmp);
                    v[static_cast<size_t>(r)] = Get(t, tmp);
                }
                Expect(what, t, i, res.At(i), Reduce(v, op, t));
            }
        }
    }
}

/* Broadcast, reduce, allgather, reduce-scatter, all-to-all, gather, scatter for one type. */
void TestOthers(ncclComm_t comm, cudaStream_t s, uint64_t seed, ncclDataType_t t, size_t count)
{
    int n = g_nranks, me = g_rank;
    size_t nc = count * static_cast<size_t>(n);
    char what[96];
    int root = static_cast<int>(g_rng() % static_cast<uint64_t>(n));
    { /* broadcast, out of place and ncclBcast in place */
        int call = g_call++;
        Buf in(t, count), out(t, count);
        for (size_t i = 0; i < count; i++)
            in.Set(i, Input(seed, call, me, i, t, ncclSum));
        in.Upload();
        CHECK_NCCL(ncclBroadcast(in.dev, out.dev, count, t, root, comm, s));
        CHECK_NCCL(ncclBcast(in.dev, count, t, root, comm, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        out.Download();
        in.Download();
        snprintf(what, sizeof(what), "broadcast root %d", root);
        for (size_t i = 0; i < count; i++) {
            Expect(what, t, i, out.At(i), Input(seed, call, root, i, t, ncclSum));
            Expect("bcast", t, i, in.At(i), Input(seed, call, root, i, t, ncclSum));
        }
    }
    { /* reduce (max) to root */
        int call = g_call++;
        Buf in(t, count), out(t, count);
        for (size_t i = 0; i < count; i++)
            in.Set(i, Input(seed, call, me, i, t, ncclMax));
        in.Upload();
        CHECK_NCCL(ncclReduce(in.dev, out.dev, count, t, ncclMax, root, comm, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        out.Download();
        if (me == root) {
            std::vector<double> v(static_cast<size_t>(n));
            for (size_t i = 0; i < count; i++) {
                for (int r = 0; r < n; r++)
                    v[static_cast<size_t>(r)] = Input(seed, call, r, i, t, ncclMax);
                Expect("reduce max", t, i, out.At(i), Reduce(v, ncclMax, t));
            }
        }
    }
    { /* allgather, in place: my block already sits in recvbuff */
        int call = g_call++;
        Buf all(t, nc);
        for (size_t i = 0; i < count; i++)
            all.Set(static_cast<size_t>(me) * count + i, Input(seed, call, me, i, t, ncclSum));
        all.Upload();
        CHECK_NCCL(
            ncclAllGather(all.Ptr(static_cast<size_t>(me) * count), all.dev, count, t, comm, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        all.Download();
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                Expect("allgather in place", t, static_cast<size_t>(r) * count + i,
                       all.At(static_cast<size_t>(r) * count + i),
                       Input(seed, call, r, i, t, ncclSum));
    }
    { /* reduce-scatter (sum) */
        int call = g_call++;
        Buf in(t, nc), out(t, count);
        for (size_t i = 0; i < nc; i++)
            in.Set(i, Input(seed, call, me, i, t, ncclSum));
        in.Upload();
        CHECK_NCCL(ncclReduceScatter(in.dev, out.dev, count, t, ncclSum, comm, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        out.Download();
        std::vector<double> v(static_cast<size_t>(n));
        for (size_t i = 0; i < count; i++) {
            for (int r = 0; r < n; r++)
                v[static_cast<size_t>(r)] =
                    Input(seed, call, r, static_cast<size_t>(me) * count + i, t, ncclSum);
            Expect("reduce-scatter", t, i, out.At(i), Reduce(v, ncclSum, t));
        }
    }
    { /* all-to-all: block q of rank r goes to q's block r */
        int call = g_call++;
        Buf in(t, nc), out(t, nc);
        for (size_t i = 0; i < nc; i++)
            in.Set(i, Input(seed, call, me, i, t, ncclSum));
        in.Upload();
        CHECK_NCCL(ncclAlltoAll(in.dev, out.dev, count, t, comm, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        out.Download();
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                Expect("alltoall", t, static_cast<size_t>(r) * count + i,
                       out.At(static_cast<size_t>(r) * count + i),
                       Input(seed, call, r, static_cast<size_t>(me) * count + i, t, ncclSum));
    }
    { /* gather to root, then scatter from root */
        int call = g_call++;
        Buf in(t, count), all(t, nc), back(t, count);
        for (size_t i = 0; i < count; i++)
            in.Set(i, Input(seed, call, me, i, t, ncclSum));
        in.Upload();
        CHECK_NCCL(ncclGather(in.dev, all.dev, count, t, root, comm, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        if (me == root) {
            all.Download();
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++)
                    Expect("gather", t, i, all.At(static_cast<size_t>(r) * count + i),
                           Input(seed, call, r, i, t, ncclSum));
            /* The root scatters block r + 1 to rank r: the gathered blocks rotated. */
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++)
                    all.Set(static_cast<size_t>(r) * count + i,
                            Input(seed, call, (r + 1) % n, i, t, ncclSum));
            all.Upload();
        }
        CHECK_NCCL(ncclScatter(all.dev, back.dev, count, t, root, comm, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        back.Download();
        for (size_t i = 0; i < count; i++)
            Expect("scatter", t, i, back.At(i), Input(seed, call, (me + 1) % n, i, t, ncclSum));
    }
}

/* Send/recv: a ring (to rank + 1, from rank - 1) and every pair at once, each in one group. */
void TestSendRecv(ncclComm_t comm, cudaStream_t s, uint64_t seed, size_t count)
{
    int n = g_nranks, me = g_rank;
    ncclDataType_t t = ncclBfloat16;
    int call = g_call++;
    Buf in(t, count), out(t, count);
    for (size_t i = 0; i < count; i++)
        in.Set(i, Input(seed, call, me, i, t, ncclSum));
    in.Upload();
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(in.dev, count, t, (me + 1) % n, comm, s));
    CHECK_NCCL(ncclRecv(out.dev, count, t, (me + n - 1) % n, comm, s));
    CHECK_NCCL(ncclGroupEnd());
    CHECK_CUDA(cudaStreamSynchronize(s));
    out.Download();
    for (size_t i = 0; i < count; i++)
        Expect("sendrecv ring", t, i, out.At(i),
               Input(seed, call, (me + n - 1) % n, i, t, ncclSum));

    /* All pairs, uneven sizes: rank r sends (r + q) % 5 * count / 4 + 1 elements to q. */
    call = g_call++;
    std::vector<size_t> cnt(static_cast<size_t>(n) * static_cast<size_t>(n));
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            cnt[static_cast<size_t>(a * n + b)] = static_cast<size_t>((a + b) % 5) * count / 4 + 1;
    std::vector<Buf *> sends, recvs;
    CHECK_NCCL(ncclGroupStart());
    for (int q = 0; q < n; q++) {
        size_t cs = cnt[static_cast<size_t>(me * n + q)], cr = cnt[static_cast<size_t>(q * n + me)];
        Buf *sb = new Buf(t, cs), *rb = new Buf(t, cr);
        for (size_t i = 0; i < cs; i++)
            sb->Set(i, Input(seed, call, me * 64 + q, i, t, ncclSum));
        sb->Upload();
        CHECK_NCCL(ncclSend(sb->dev, cs, t, q, comm, s));
        CHECK_NCCL(ncclRecv(rb->dev, cr, t, q, comm, s));
        sends.push_back(sb);
        recvs.push_back(rb);
    }
    CHECK_NCCL(ncclGroupEnd());
    CHECK_CUDA(cudaStreamSynchronize(s));
    for (int q = 0; q < n; q++) {
        Buf *rb = recvs[static_cast<size_t>(q)];
        rb->Download();
        for (size_t i = 0; i < rb->count; i++)
            Expect("sendrecv all pairs", t, i, rb->At(i),
                   Input(seed, call, q * 64 + me, i, t, ncclSum));
        delete rb;
        delete sends[static_cast<size_t>(q)];
    }
}

/* A group with two collectives, a PreMulSum op (host and device scalar), registered buffers
 * from ncclMemAlloc, a window, and a CUDA graph replayed with new inputs. */
void TestMisc(ncclComm_t comm, cudaStream_t s, uint64_t seed, size_t count)
{
    int n = g_nranks, me = g_rank;
    ncclDataType_t t = ncclFloat32;
    { /* group: allreduce + allgather */
        int call = g_call++;
        Buf a(t, count), g(t, count * static_cast<size_t>(n));
        for (size_t i = 0; i < count; i++)
            a.Set(i, Input(seed, call, me, i, t, ncclSum));
        a.Upload();
        Buf mine(t, count);
        mine.host = a.host;
        mine.Upload();
        CHECK_NCCL(ncclGroupStart());
        CHECK_NCCL(ncclAllReduce(a.dev, a.dev, count, t, ncclSum, comm, s));
        CHECK_NCCL(ncclAllGather(mine.dev, g.dev, count, t, comm, s));
        CHECK_NCCL(ncclGroupEnd());
        CHECK_CUDA(cudaStreamSynchronize(s));
        a.Download();
        g.Download();
        std::vector<double> v(static_cast<size_t>(n));
        for (size_t i = 0; i < count; i++) {
            for (int r = 0; r < n; r++)
                v[static_cast<size_t>(r)] = Input(seed, call, r, i, t, ncclSum);
            Expect("group allreduce", t, i, a.At(i), Reduce(v, ncclSum, t));
            for (int r = 0; r < n; r++)
                Expect("group allgather", t, i, g.At(static_cast<size_t>(r) * count + i),
                       v[static_cast<size_t>(r)]);
        }
    }
    for (int residence = 0; residence < 2; residence++) { /* PreMulSum */
        int call = g_call++;
        /* Each rank its own scalar, as NCCL allows (nccl-tests' "mulsum": 1 and 2). */
        const float base = (g_rng() & 1) ? 0.5f : 3.0f;
        auto scalar_of = [base](int r) { return base * static_cast<float>(1 + r % 2); };
        float scalar = scalar_of(me);
        float *dscalar = nullptr;
        CHECK_CUDA(cudaMalloc(&dscalar, sizeof(float)));
        CHECK_CUDA(cudaMemcpy(dscalar, &scalar, sizeof(float), cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
        ncclRedOp_t op;
        CHECK_NCCL(
            ncclRedOpCreatePreMulSum(&op, residence ? static_cast<void *>(&scalar) : dscalar, t,
                                     residence ? ncclScalarHostImmediate : ncclScalarDevice, comm));
        Buf in(t, count), out(t, count);
        for (size_t i = 0; i < count; i++)
            in.Set(i, Input(seed, call, me, i, t, ncclSum));
        in.Upload();
        CHECK_NCCL(ncclAllReduce(in.dev, out.dev, count, t, op, comm, s));
        CHECK_NCCL(
            ncclReduceScatter(in.dev, out.dev, count / static_cast<size_t>(n), t, op, comm, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        out.Download();
        std::vector<double> v(static_cast<size_t>(n));
        size_t rc = count / static_cast<size_t>(n);
        for (size_t i = 0; i < count; i++) {
            size_t src = i < rc ? static_cast<size_t>(me) * rc + i : i; /* rs overwrote [0, rc) */
            for (int r = 0; r < n; r++)
                v[static_cast<size_t>(r)] = Input(seed, call, r, src, t, ncclSum) * scalar_of(r);
            Expect(residence ? "premulsum host" : "premulsum device", t, i, out.At(i),
                   Reduce(v, ncclSum, t));
        }
        CHECK_NCCL(ncclRedOpDestroy(op, comm));
        cudaFree(dscalar);
    }
    { /* ncclMemAlloc + registration + window, allreduce in place on them */
        int call = g_call++;
        void *p = nullptr, *handle = nullptr;
        size_t bytes = count * sizeof(float);
        CHECK_NCCL(ncclMemAlloc(&p, bytes));
        CHECK_NCCL(ncclCommRegister(comm, p, bytes, &handle));
        void *q = nullptr;
        CHECK_NCCL(ncclMemAlloc(&q, bytes));
        ncclWindow_t win = nullptr;
        CHECK_NCCL(ncclCommWindowRegister(comm, q, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
        std::vector<float> h(count);
        for (size_t i = 0; i < count; i++)
            h[i] = static_cast<float>(Input(seed, call, me, i, t, ncclSum));
        CHECK_CUDA(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaDeviceSynchronize());
        for (int k = 0; k < 3; k++) { /* the first call may still go through scratch */
            CHECK_NCCL(ncclAllReduce(p, q, count, t, ncclMax, comm, s));
        }
        CHECK_CUDA(cudaStreamSynchronize(s));
        CHECK_CUDA(cudaMemcpy(h.data(), q, bytes, cudaMemcpyDeviceToHost));
        std::vector<double> v(static_cast<size_t>(n));
        for (size_t i = 0; i < count; i++) {
            for (int r = 0; r < n; r++)
                v[static_cast<size_t>(r)] = Input(seed, call, r, i, t, ncclSum);
            Expect("registered allreduce", t, i, h[i], Reduce(v, ncclMax, t));
        }
        CHECK_NCCL(ncclCommWindowDeregister(comm, win));
        CHECK_NCCL(ncclCommDeregister(comm, handle));
        CHECK_NCCL(ncclMemFree(q));
        CHECK_NCCL(ncclMemFree(p));
    }
    { /* CUDA graph: capture one allreduce, replay it three times with new inputs */
        Buf in(t, count), out(t, count);
        cudaStream_t cs;
        CHECK_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        CHECK_NCCL(ncclAllReduce(in.dev, out.dev, count, t, ncclSum, comm, cs));
        CHECK_CUDA(cudaStreamEndCapture(cs, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (int k = 0; k < 3; k++) {
            int call = g_call++;
            for (size_t i = 0; i < count; i++)
                in.Set(i, Input(seed, call, me, i, t, ncclSum));
            in.Upload();
            CHECK_CUDA(cudaGraphLaunch(exec, cs));
            CHECK_CUDA(cudaStreamSynchronize(cs));
            out.Download();
            std::vector<double> v(static_cast<size_t>(n));
            for (size_t i = 0; i < count; i++) {
                for (int r = 0; r < n; r++)
                    v[static_cast<size_t>(r)] = Input(seed, call, r, i, t, ncclSum);
                Expect("graph replay", t, i, out.At(i), Reduce(v, ncclSum, t));
            }
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(cs);
    }
}

/* A split into halves, an allreduce on each half, then its finalize and destroy. */
void TestSplit(ncclComm_t comm, cudaStream_t s, uint64_t seed)
{
    int n = g_nranks, me = g_rank, color = me < (n + 1) / 2 ? 0 : 1;
    ncclComm_t half = nullptr;
    CHECK_NCCL(ncclCommSplit(comm, color, me, &half, nullptr));
    int hn = 0, hr = -1;
    CHECK_NCCL(ncclCommCount(half, &hn));
    CHECK_NCCL(ncclCommUserRank(half, &hr));
    int first = color == 0 ? 0 : (n + 1) / 2;
    if (hr != me - first || hn != (color == 0 ? (n + 1) / 2 : n - (n + 1) / 2))
        g_failures++, fprintf(stderr, "rank %d: split gave rank %d of %d\n", me, hr, hn);
    int call = g_call++;
    size_t count = 1000;
    Buf in(ncclInt32, count);
    for (size_t i = 0; i < count; i++)
        in.Set(i, Input(seed, call, me, i, ncclInt32, ncclSum));
    in.Upload();
    CHECK_NCCL(ncclAllReduce(in.dev, in.dev, count, ncclInt32, ncclSum, half, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    in.Download();
    std::vector<double> v(static_cast<size_t>(hn));
    for (size_t i = 0; i < count; i++) {
        for (int r = 0; r < hn; r++)
            v[static_cast<size_t>(r)] = Input(seed, call, first + r, i, ncclInt32, ncclSum);
        Expect("split allreduce", ncclInt32, i, in.At(i), Reduce(v, ncclSum, ncclInt32));
    }
    CHECK_NCCL(ncclCommFinalize(half));
    CHECK_NCCL(ncclCommDestroy(half));
}

/* The library's call counters, when the library is MACO's. */
int CheckCounters(const char *expect_forwarded)
{
    using count_fn = int (*)(const char *, uint64_t *, uint64_t *);
    count_fn fn = reinterpret_cast<count_fn>(dlsym(RTLD_DEFAULT, "maco_nccl_call_count"));
    if (fn == nullptr) {
        printf("rank %d: the libnccl.so.2 loaded is not MACO's (no maco_nccl_call_count)\n",
               g_rank);
        return 0;
    }
    const char *names[] = { "ncclAllReduce",    "ncclBroadcast",     "ncclReduce",
                            "ncclAllGather",    "ncclReduceScatter", "ncclAlltoAll",
                            "ncclGather",       "ncclScatter",       "ncclSend",
                            "ncclRecv",         "ncclCommInitRank",  "ncclCommSplit",
                            "ncclCommRegister", "ncclMemAlloc" };
    int bad = 0;
    for (const char *name : names) {
        uint64_t native = 0, forwarded = 0;
        fn(name, &native, &forwarded);
        bool expect_fwd =
            expect_forwarded != nullptr &&
            (std::string(",") + expect_forwarded + ",").find(std::string(",") + name + ",") !=
                std::string::npos;
        if (g_rank == 0)
            printf("rank 0: %-18s on MACO %6llu, forwarded to NCCL %llu\n", name,
                   static_cast<unsigned long long>(native),
                   static_cast<unsigned long long>(forwarded));
        if (expect_fwd ? forwarded == 0 : (forwarded != 0 || native == 0)) {
            fprintf(stderr, "rank %d: %s: %llu on MACO, %llu forwarded: not as expected\n", g_rank,
                    name, static_cast<unsigned long long>(native),
                    static_cast<unsigned long long>(forwarded));
            bad++;
        }
    }
    return bad;
}

int EnvInt(const char *a, const char *b, int dflt)
{
    const char *v = getenv(a);
    if (v == nullptr)
        v = getenv(b);
    return v != nullptr ? atoi(v) : dflt;
}

} // namespace

int main(int argc, char **argv)
{
    const char *expect_forwarded = nullptr;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--expect-forwarded") == 0)
            expect_forwarded = argv[i + 1];
    g_rank = EnvInt("MACO_RANK", "RANK", 0);
    g_nranks = EnvInt("MACO_WORLD_SIZE", "WORLD_SIZE", 1);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    int local = EnvInt("MACO_LOCAL_RANK", "LOCAL_RANK", g_rank);
    CHECK_CUDA(cudaSetDevice(local % ndev));
    if (getenv("NCCL_COMM_ID") == nullptr) {
        char addr[256];
        if (getenv("MACO_BOOTSTRAP_ADDR") != nullptr)
            snprintf(addr, sizeof(addr), "%s", getenv("MACO_BOOTSTRAP_ADDR"));
        else if (getenv("MASTER_ADDR") != nullptr && getenv("MASTER_PORT") != nullptr)
            snprintf(addr, sizeof(addr), "%s:%d", getenv("MASTER_ADDR"),
                     atoi(getenv("MASTER_PORT")) + 1);
        else
            snprintf(addr, sizeof(addr), "127.0.0.1:%d", 29000 + static_cast<int>(getpid() % 1000));
        setenv("NCCL_COMM_ID", addr, 1);
    }
    bool is_maco = dlsym(RTLD_DEFAULT, "maco_nccl_call_count") != nullptr;
    g_avg_fp8 = is_maco && (expect_forwarded == nullptr ||
                            strstr(expect_forwarded, "ncclAllReduce") == nullptr);
    ncclUniqueId id;
    CHECK_NCCL(ncclGetUniqueId(&id));
    ncclComm_t comm;
    CHECK_NCCL(ncclCommInitRank(&comm, g_nranks, id, g_rank));
    int v = 0;
    CHECK_NCCL(ncclGetVersion(&v));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint64_t seed = SharedSeed(comm, s);
    g_rng.seed(seed);
    if (g_rank == 0)
        printf("nccl_gpu_check: %d ranks, NCCL version %d, seed %llu\n", g_nranks, v,
               static_cast<unsigned long long>(seed));
    const size_t counts[] = { 1, 3, 1000, 65536 + 7, (1u << 20) + 5 };
    for (size_t c : counts)
        TestAllReduce(comm, s, seed, c, c == 1000);
    for (int ti = 0; ti < 12; ti++)
        for (size_t c : { static_cast<size_t>(5), static_cast<size_t>(40000) })
            TestOthers(comm, s, seed, kTypes[ti], c);
    TestSendRecv(comm, s, seed, 1000);
    TestSendRecv(comm, s, seed, 1u << 20);
    TestMisc(comm, s, seed, 4096);
    TestMisc(comm, s, seed, 1u << 21);
    TestSplit(comm, s, seed);
    ncclResult_t async = ncclInProgress;
    CHECK_NCCL(ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess)
        g_failures++,
            fprintf(stderr, "rank %d: async error %s\n", g_rank, ncclGetErrorString(async));
    for (const auto &w : g_wrong)
        fprintf(stderr, "rank %d: %ld wrong values in %s\n", g_rank, w.second, w.first.c_str());
    int bad_counts = CheckCounters(expect_forwarded);
    CHECK_NCCL(ncclCommFinalize(comm));
    CHECK_NCCL(ncclCommDestroy(comm));
    cudaStreamDestroy(s);
    printf("rank %d: %s (%d wrong values, %d counter mismatches, %d calls)\n", g_rank,
           g_failures == 0 && bad_counts == 0 ? "PASS" : "FAIL", g_failures, bad_counts, g_call);
    return g_failures == 0 && bad_counts == 0 ? 0 : 1;
}
