/*
 * maco-perf - collective benchmark with nccl-tests' flags and columns.
 *
 *   maco-run -n N maco-perf allreduce -b MIN -e MAX -f FACTOR [-d bfloat16|float32]
 *       [-n iters] [-w warmup] [-c checks] [--nccl] [--json FILE]
 *
 * For each size (bytes per rank, MIN..MAX multiplying by FACTOR) it checks and times
 * MACO's allreduce out of place and in place and, with --nccl, the same through the
 * system's NCCL (dlopen'ed; NVLink multicast off) in the same process.
 *
 * Checking: `-c` rounds per size and placement, each with fresh random inputs (a new seed),
 * a poisoned output (0xFF bytes) with a 256-byte poisoned guard after it, one allreduce,
 * then every element compared bitwise on the GPU with the rank-ordered float32 sum of all
 * ranks' inputs recomputed from the generator (perf_kernels.h), and the guard checked
 * untouched (#wrong counts both). Timing: `-w` warm-up calls, then `-n` calls between two
 * CUDA events; time = elapsed / n, the largest over ranks.
 * algbw = size / time; busbw = algbw * 2 (n-1) / n (nccl-tests' definition for allreduce,
 * see its doc/PERFORMANCE.md). GB/s are 1e9 bytes per second.
 * Exit status: 0 when no value was wrong, 1 when some were (or an error), 2 for bad usage
 * or no GPU.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cuda_runtime_api.h>

#include "maco/maco.h"
#include "perf_kernels.h"

/* ------------------------------------------------------------------ NCCL, by dlopen */

/* The few NCCL declarations used, from NCCL's stable C ABI (nccl.h): ncclUniqueId is 128
 * bytes, results and enums are ints. Declared here so the tool builds without nccl.h. */
typedef struct {
    char internal[128];
} perf_nccl_id_t;
typedef struct perf_nccl_comm *perf_nccl_comm_t;
enum { PERF_NCCL_FLOAT32 = 7, PERF_NCCL_BFLOAT16 = 9, PERF_NCCL_SUM = 0 };

typedef struct perf_nccl {
    void *lib;
    int (*get_unique_id)(perf_nccl_id_t *);
    int (*comm_init_rank)(perf_nccl_comm_t *, int, perf_nccl_id_t, int);
    int (*all_reduce)(const void *, void *, size_t, int, int, perf_nccl_comm_t, cudaStream_t);
    int (*comm_destroy)(perf_nccl_comm_t);
    const char *(*get_error_string)(int);
    int (*get_version)(int *);
    perf_nccl_comm_t comm;
    int version;
} perf_nccl_t;

typedef struct perf_opts {
    const char *collective;
    size_t min_bytes, max_bytes;
    double factor;
    maco_datatype_t dtype;
    int iters, warmup, checks;
    int nccl;
    const char *json_path;
} perf_opts_t;

static int g_rank;

#define PERF_DIE(...)                                                                              \
    do {                                                                                           \
        fprintf(stderr, "maco-perf: rank %d: ", g_rank);                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define PERF_CUDA(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            PERF_DIE("%s failed: %s", #call, cudaGetErrorString(e_));                              \
    } while (0)

#define PERF_MACO(comm, call)                                                                      \
    do {                                                                                           \
        maco_status_t s_ = (call);                                                                 \
        if (s_ != MACO_OK)                                                                         \
            PERF_DIE("%s failed: %s: %s", #call, maco_status_string(s_),                           \
                     maco_comm_get_last_error(comm));                                              \
    } while (0)

static void usage(FILE *f)
{
    fprintf(f, "usage: maco-perf allreduce [-b MIN] [-e MAX] [-f FACTOR] [-d bfloat16|float32]\n"
               "                 [-n ITERS] [-w WARMUP] [-c CHECKS] [--nccl] [--json FILE]\n"
               "  Run under maco-run, one rank per GPU: maco-run -n 4 maco-perf allreduce ...\n"
               "  -b, -e   smallest and largest size in bytes per rank (K, M, G suffixes; "
               "default 8 and 128M)\n"
               "  -f       size multiplier between steps (default 2)\n"
               "  -d       data type (default bfloat16)\n"
               "  -n, -w   timed and warm-up calls per size (default 20 and 5)\n"
               "  -c       checked calls per size and placement (default 1)\n"
               "  --nccl   also run the system NCCL (MACO_NCCL_LIBRARY names it)\n"
               "  --json   write one JSON object per size and placement to FILE (rank 0)\n");
}

static int parse_bytes(const char *text, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || v < 0)
        return -1;
    double mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1024.0;
    else if (*end == 'M' || *end == 'm')
        mult = 1024.0 * 1024;
    else if (*end == 'G' || *end == 'g')
        mult = 1024.0 * 1024 * 1024;
    else if (*end != '\0')
        return -1;
    if (*end != '\0' && end[1] != '\0' && strcasecmp(end + 1, "B") != 0)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *text, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static void parse_args(int argc, char **argv, perf_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->min_bytes = 8;
    o->max_bytes = (size_t)128 << 20;
    o->factor = 2;
    o->dtype = MACO_BFLOAT16;
    o->iters = 20;
    o->warmup = 5;
    o->checks = 1;
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        exit(argc < 2 ? 2 : 0);
    }
    o->collective = argv[1];
    if (strcmp(o->collective, "allreduce") != 0) {
        fprintf(stderr, "maco-perf: collective '%s' is not implemented yet (allreduce is)\n",
                o->collective);
        exit(2);
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--nccl") == 0) {
            o->nccl = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "maco-perf: %s needs a value\n", a);
            usage(stderr);
            exit(2);
        }
        const char *v = argv[++i];
        int bad = 0;
        if (strcmp(a, "-b") == 0)
            bad = parse_bytes(v, &o->min_bytes);
        else if (strcmp(a, "-e") == 0)
            bad = parse_bytes(v, &o->max_bytes);
        else if (strcmp(a, "-f") == 0) {
            char *end;
            o->factor = strtod(v, &end);
            bad = *end != '\0' || !(o->factor > 1.0);
        } else if (strcmp(a, "-d") == 0) {
            if (strcmp(v, "bfloat16") == 0 || strcmp(v, "bf16") == 0)
                o->dtype = MACO_BFLOAT16;
            else if (strcmp(v, "float32") == 0 || strcmp(v, "float") == 0)
                o->dtype = MACO_FLOAT32;
            else
                bad = 1;
        } else if (strcmp(a, "-n") == 0)
            bad = parse_int(v, 1, 1000000, &o->iters);
        else if (strcmp(a, "-w") == 0)
            bad = parse_int(v, 0, 1000000, &o->warmup);
        else if (strcmp(a, "-c") == 0)
            bad = parse_int(v, 0, 1000, &o->checks);
        else if (strcmp(a, "--json") == 0)
            o->json_path = v;
        else {
            fprintf(stderr, "maco-perf: unknown option %s\n", a);
            usage(stderr);
            exit(2);
        }
        if (bad) {
            fprintf(stderr,
                    "maco-perf: %s '%s' is invalid (see -h: sizes take K/M/G, -f > 1, "
                    "-d bfloat16 or float32, counts are integers)\n",
                    a, v);
            exit(2);
        }
    }
    if (o->min_bytes == 0 || o->max_bytes < o->min_bytes) {
        fprintf(stderr, "maco-perf: need 0 < -b (%zu) <= -e (%zu)\n", o->min_bytes, o->max_bytes);
        exit(2);
    }
}

static void nccl_load(perf_nccl_t *nc)
{
    /* NVLink multicast stays off (it can disturb shared machines; DESIGN.md). */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    const char *path = getenv("MACO_NCCL_LIBRARY");
    if (path == NULL || path[0] == '\0')
        path = "libnccl.so.2";
    nc->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (nc->lib == NULL)
        PERF_DIE("--nccl: cannot load %s: %s (set MACO_NCCL_LIBRARY to NCCL's path)", path,
                 dlerror());
#define PERF_SYM(field, name)                                                                      \
    do {                                                                                           \
        *(void **)&nc->field = dlsym(nc->lib, name);                                               \
        if (nc->field == NULL)                                                                     \
            PERF_DIE("--nccl: %s has no symbol %s", path, name);                                   \
    } while (0)
    PERF_SYM(get_unique_id, "ncclGetUniqueId");
    PERF_SYM(comm_init_rank, "ncclCommInitRank");
    PERF_SYM(all_reduce, "ncclAllReduce");
    PERF_SYM(comm_destroy, "ncclCommDestroy");
    PERF_SYM(get_error_string, "ncclGetErrorString");
    PERF_SYM(get_version, "ncclGetVersion");
#undef PERF_SYM
    nc->get_version(&nc->version);
}

static void nccl_init(perf_nccl_t *nc, maco_comm_t comm, int rank, int nranks)
{
    perf_nccl_id_t id;
    memset(&id, 0, sizeof(id));
    if (rank == 0) {
        int r = nc->get_unique_id(&id);
        if (r != 0)
            PERF_DIE("ncclGetUniqueId failed: %s", nc->get_error_string(r));
    }
    maco_bootstrap_t bs;
    PERF_MACO(comm, maco_comm_get_bootstrap(comm, &bs));
    PERF_MACO(comm, maco_bootstrap_broadcast(bs, 0, &id, sizeof(id)));
    int r = nc->comm_init_rank(&nc->comm, nranks, id, rank);
    if (r != 0)
        PERF_DIE("ncclCommInitRank failed: %s", nc->get_error_string(r));
}

typedef struct perf_result {
    double time_us;
    unsigned long long wrong;
} perf_result_t;

typedef struct perf_ctx {
    maco_comm_t comm;
    maco_bootstrap_t bs;
    int rank, nranks;
    cudaStream_t stream;
    cudaEvent_t start, stop;
    char *in, *out;
    unsigned long long *counters; /* device: [0] wrong, [1] first wrong index, [2] guard */
    unsigned long long oob;       /* guard bytes found changed on this rank, all sizes */
    perf_nccl_t *nccl;
    uint64_t seed_base;
} perf_ctx_t;

enum { PERF_GUARD = 256 };

static int perf_dtype_code(maco_datatype_t dt)
{
    return dt == MACO_BFLOAT16 ? MACO_PERF_BF16 : MACO_PERF_F32;
}

/* Largest value over ranks (times), through the bootstrap. */
static double perf_max_over_ranks(perf_ctx_t *c, double v)
{
    double *all = calloc((size_t)c->nranks, sizeof(double));
    if (all == NULL)
        PERF_DIE("out of memory");
    all[c->rank] = v;
    PERF_MACO(c->comm, maco_bootstrap_allgather(c->bs, all, sizeof(double)));
    double m = all[0];
    for (int r = 1; r < c->nranks; r++)
        m = all[r] > m ? all[r] : m;
    free(all);
    return m;
}

static unsigned long long perf_sum_over_ranks(perf_ctx_t *c, unsigned long long v)
{
    unsigned long long *all = calloc((size_t)c->nranks, sizeof(*all));
    if (all == NULL)
        PERF_DIE("out of memory");
    all[c->rank] = v;
    PERF_MACO(c->comm, maco_bootstrap_allgather(c->bs, all, sizeof(*all)));
    unsigned long long s = 0;
    for (int r = 0; r < c->nranks; r++)
        s += all[r];
    free(all);
    return s;
}

static void perf_launch(perf_ctx_t *c, int use_nccl, const void *src, void *dst, size_t count,
                        maco_datatype_t dt)
{
    if (use_nccl) {
        int r = c->nccl->all_reduce(src, dst, count,
                                    dt == MACO_BFLOAT16 ? PERF_NCCL_BFLOAT16 : PERF_NCCL_FLOAT32,
                                    PERF_NCCL_SUM, c->nccl->comm, c->stream);
        if (r != 0)
            PERF_DIE("ncclAllReduce of %zu elements failed: %s", count,
                     c->nccl->get_error_string(r));
    } else {
        PERF_MACO(c->comm,
                  maco_allreduce(src, dst, count, dt, MACO_SUM, c->comm, (maco_stream_t)c->stream));
    }
}

/* Stops with the device-side error if a MACO kernel reported one. */
static void perf_check_async(perf_ctx_t *c)
{
    maco_status_t async_st;
    PERF_MACO(c->comm, maco_comm_get_async_error(c->comm, &async_st));
    if (async_st != MACO_OK)
        PERF_DIE("asynchronous error: %s: %s", maco_status_string(async_st),
                 maco_comm_get_last_error(c->comm));
}

/* Checked calls; returns the number of wrong elements and guard bytes on this rank. */
static unsigned long long perf_check(perf_ctx_t *c, const perf_opts_t *o, size_t count, int inplace,
                                     int round)
{
    size_t bytes = count * maco_datatype_size(o->dtype);
    uint64_t seed = c->seed_base ^ ((uint64_t)count * 0x9E3779B97F4A7C15ull) ^
                    ((uint64_t)(round * 2 + inplace) << 56);
    int dt = perf_dtype_code(o->dtype);
    char *dst = c->out;
    const char *src = inplace ? c->out : c->in;
    /* Poison the whole output plus guard, then (in place) write the input over it. */
    PERF_CUDA(cudaMemsetAsync(c->out, 0xFF, bytes + PERF_GUARD, c->stream));
    PERF_CUDA(maco_perf_fill(inplace ? c->out : c->in, count, dt, seed, c->rank, c->stream));
    unsigned long long init[3] = { 0, ~0ull, 0 };
    PERF_CUDA(cudaMemcpyAsync(c->counters, init, sizeof(init), cudaMemcpyHostToDevice, c->stream));
    PERF_CUDA(cudaStreamSynchronize(c->stream));
    PERF_MACO(c->comm, maco_bootstrap_barrier(c->bs)); /* every rank's input is ready */
    perf_launch(c, 0, src, dst, count, o->dtype);
    PERF_CUDA(maco_perf_check_sum(dst, count, dt, seed, c->nranks, &c->counters[0], &c->counters[1],
                                  c->stream));
    PERF_CUDA(maco_perf_check_bytes(dst + bytes, PERF_GUARD, 0xFF, &c->counters[2], c->stream));
    unsigned long long res[3];
    PERF_CUDA(cudaMemcpyAsync(res, c->counters, sizeof(res), cudaMemcpyDeviceToHost, c->stream));
    PERF_CUDA(cudaStreamSynchronize(c->stream));
    perf_check_async(c);
    if (res[0] != 0) {
        fprintf(stderr,
                "maco-perf: rank %d: %llu wrong value(s) in %zu elements (%s, %s); first wrong "
                "element %llu\n",
                c->rank, res[0], count, maco_datatype_name(o->dtype),
                inplace ? "in place" : "out of place", res[1]);
    }
    if (res[2] != 0)
        fprintf(stderr,
                "maco-perf: rank %d: %llu byte(s) of the %d-byte guard after the output of %zu "
                "elements were overwritten (%s)\n",
                c->rank, res[2], PERF_GUARD, count, inplace ? "in place" : "out of place");
    c->oob += res[2];
    return res[0] + res[2];
}

static double perf_time(perf_ctx_t *c, const perf_opts_t *o, size_t count, int inplace,
                        int use_nccl)
{
    const void *src = inplace ? c->out : c->in;
    PERF_CUDA(
        maco_perf_fill(c->in, count, perf_dtype_code(o->dtype), c->seed_base, c->rank, c->stream));
    PERF_CUDA(
        maco_perf_fill(c->out, count, perf_dtype_code(o->dtype), c->seed_base, c->rank, c->stream));
    for (int i = 0; i < o->warmup; i++)
        perf_launch(c, use_nccl, src, c->out, count, o->dtype);
    PERF_CUDA(cudaStreamSynchronize(c->stream));
    PERF_MACO(c->comm, maco_bootstrap_barrier(c->bs));
    PERF_CUDA(cudaEventRecord(c->start, c->stream));
    for (int i = 0; i < o->iters; i++)
        perf_launch(c, use_nccl, src, c->out, count, o->dtype);
    PERF_CUDA(cudaEventRecord(c->stop, c->stream));
    PERF_CUDA(cudaEventSynchronize(c->stop));
    if (!use_nccl)
        perf_check_async(c);
    float ms = 0;
    PERF_CUDA(cudaEventElapsedTime(&ms, c->start, c->stop));
    return perf_max_over_ranks(c, (double)ms * 1000.0 / o->iters);
}

int main(int argc, char **argv)
{
    perf_opts_t o;
    parse_args(argc, argv, &o);
    const char *rank_env = getenv("MACO_RANK");
    int quiet_rank = rank_env != NULL && rank_env[0] != '\0' && strcmp(rank_env, "0") != 0;
    int ndev = 0;
    cudaError_t cerr = cudaGetDeviceCount(&ndev);
    if (cerr != cudaSuccess || ndev == 0) {
        if (!quiet_rank)
            fprintf(stderr, "maco-perf: no CUDA device is visible (%s); nothing to measure\n",
                    cerr != cudaSuccess ? cudaGetErrorString(cerr) : "0 devices");
        return 2;
    }
    perf_ctx_t c;
    memset(&c, 0, sizeof(c));
    maco_status_t st = maco_comm_init_from_env(&c.comm);
    if (st != MACO_OK) {
        fprintf(stderr,
                "maco-perf: cannot create the communicator: %s (run under maco-run, "
                "e.g. maco-run -n %d maco-perf allreduce)\n",
                maco_status_string(st), ndev);
        return 1;
    }
    maco_comm_get_rank(c.comm, &c.rank);
    maco_comm_get_nranks(c.comm, &c.nranks);
    maco_comm_get_bootstrap(c.comm, &c.bs);
    g_rank = c.rank;
    int dev;
    maco_comm_get_cuda_device(c.comm, &dev);
    PERF_CUDA(cudaSetDevice(dev));
    struct cudaDeviceProp prop;
    PERF_CUDA(cudaGetDeviceProperties(&prop, dev));
    PERF_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    PERF_CUDA(cudaEventCreate(&c.start));
    PERF_CUDA(cudaEventCreate(&c.stop));
    size_t esz = maco_datatype_size(o.dtype);
    PERF_CUDA(cudaMalloc((void **)&c.in, o.max_bytes + PERF_GUARD));
    PERF_CUDA(cudaMalloc((void **)&c.out, o.max_bytes + PERF_GUARD));
    PERF_CUDA(cudaMalloc((void **)&c.counters, 3 * sizeof(unsigned long long)));
    c.seed_base = 0x4D41434F00000000ull ^ (uint64_t)o.min_bytes ^ ((uint64_t)o.max_bytes << 8);
    perf_nccl_t nccl;
    memset(&nccl, 0, sizeof(nccl));
    if (o.nccl) {
        nccl_load(&nccl);
        nccl_init(&nccl, c.comm, c.rank, c.nranks);
        c.nccl = &nccl;
    }
    FILE *json = NULL;
    if (o.json_path != NULL && c.rank == 0) {
        json = fopen(o.json_path, "w");
        if (json == NULL)
            PERF_DIE("cannot write --json %s: %s", o.json_path, strerror(errno));
        fprintf(json, "[\n");
    }
    double busbw_factor = 2.0 * (c.nranks - 1) / c.nranks;
    if (c.rank == 0) {
        printf("# maco-perf %s: %d rank(s), %s, %s sum, iters %d, warmup %d, checks %d%s\n",
               o.collective, c.nranks, prop.name, maco_datatype_name(o.dtype), o.iters, o.warmup,
               o.checks, o.nccl ? "" : ", no NCCL");
        if (o.nccl)
            printf("# NCCL %d.%d.%d (NCCL_NVLS_ENABLE=0); ratio = MACO busbw / NCCL busbw\n",
                   nccl.version / 10000, (nccl.version / 100) % 100, nccl.version % 100);
        printf("# time in us (largest over ranks), algbw and busbw in GB/s (1e9 B/s), busbw = "
               "algbw * 2(n-1)/n\n");
        printf("#%11s %12s %9s %6s %5s  %-26s  %-26s", "", "", "", "", "", "out-of-place",
               "in-place");
        if (o.nccl)
            printf("  %-22s  %-22s", "nccl out-of-place", "nccl in-place");
        printf("\n#%11s %12s %9s %6s %5s %9s %7s %7s %6s %9s %7s %7s %6s", "size(B)", "count",
               "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
               "busbw", "#wrong");
        if (o.nccl)
            printf(" %9s %7s %5s %9s %7s %5s", "time", "busbw", "ratio", "time", "busbw", "ratio");
        printf("  algorithm\n");
        fflush(stdout);
    }
    unsigned long long total_wrong = 0;
    double busbw_sum = 0;
    int busbw_n = 0;
    int first_json = 1;
    for (double sz = (double)o.min_bytes; sz <= (double)o.max_bytes * 1.0000001; sz *= o.factor) {
        size_t count = (size_t)sz / esz;
        if (count == 0)
            continue;
        size_t bytes = count * esz;
        const char *algo = "?";
        maco_allreduce_get_algorithm(c.comm, count, o.dtype, &algo);
        double t[2], nt[2] = { 0, 0 };
        unsigned long long wrong[2];
        for (int ip = 0; ip < 2; ip++) {
            unsigned long long w = 0;
            for (int k = 0; k < o.checks; k++)
                w += perf_check(&c, &o, count, ip, k);
            wrong[ip] = perf_sum_over_ranks(&c, w);
            t[ip] = perf_time(&c, &o, count, ip, 0);
            if (o.nccl)
                nt[ip] = perf_time(&c, &o, count, ip, 1);
            total_wrong += wrong[ip];
        }
        if (c.rank != 0)
            continue;
        double algbw[2], busbw[2], nbusbw[2];
        for (int ip = 0; ip < 2; ip++) {
            algbw[ip] = (double)bytes / (t[ip] * 1e-6) / 1e9;
            busbw[ip] = algbw[ip] * busbw_factor;
            nbusbw[ip] = o.nccl ? (double)bytes / (nt[ip] * 1e-6) / 1e9 * busbw_factor : 0;
            busbw_sum += busbw[ip];
            busbw_n++;
        }
        printf(" %11zu %12zu %9s %6s %5d %9.2f %7.2f %7.2f %6llu %9.2f %7.2f %7.2f %6llu", bytes,
               count, maco_datatype_name(o.dtype), "sum", -1, t[0], algbw[0], busbw[0], wrong[0],
               t[1], algbw[1], busbw[1], wrong[1]);
        if (o.nccl)
            printf(" %9.2f %7.2f %5.2f %9.2f %7.2f %5.2f", nt[0], nbusbw[0], busbw[0] / nbusbw[0],
                   nt[1], nbusbw[1], busbw[1] / nbusbw[1]);
        printf("  %s\n", algo);
        fflush(stdout);
        if (json != NULL) {
            for (int ip = 0; ip < 2; ip++) {
                fprintf(json,
                        "%s  {\"collective\": \"%s\", \"size_bytes\": %zu, \"count\": %zu, "
                        "\"dtype\": \"%s\", \"op\": \"sum\", \"inplace\": %s, \"algorithm\": "
                        "\"%s\", \"nranks\": %d, \"time_us\": %.3f, \"algbw_gbps\": %.3f, "
                        "\"busbw_gbps\": %.3f, \"wrong\": %llu",
                        first_json ? "" : ",\n", o.collective, bytes, count,
                        maco_datatype_name(o.dtype), ip ? "true" : "false", algo, c.nranks, t[ip],
                        algbw[ip], busbw[ip], wrong[ip]);
                if (o.nccl)
                    fprintf(json, ", \"nccl_time_us\": %.3f, \"nccl_busbw_gbps\": %.3f", nt[ip],
                            nbusbw[ip]);
                fprintf(json, "}");
                first_json = 0;
            }
        }
    }
    unsigned long long oob = perf_sum_over_ranks(&c, c.oob);
    if (c.rank == 0) {
        printf("# Out of bounds values : %llu %s\n", oob, oob ? "FAILED" : "OK");
        printf("# Wrong values         : %llu %s (guard bytes included)\n", total_wrong,
               total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.3f GB/s\n", busbw_n ? busbw_sum / busbw_n : 0.0);
        fflush(stdout);
    }
    if (json != NULL) {
        fprintf(json, "\n]\n");
        fclose(json);
    }
    if (o.nccl)
        nccl.comm_destroy(nccl.comm);
    cudaFree(c.in);
    cudaFree(c.out);
    cudaFree(c.counters);
    cudaStreamDestroy(c.stream);
    maco_comm_destroy(c.comm);
    return total_wrong ? 1 : 0;
}
