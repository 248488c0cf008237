/*
 * nccl_compat_check.c - a client compiled against the nccl.h of NCCL 2.28.9 (the #error below
 * makes sure), linked with -z now (to NVIDIA's libnccl.so.2 where the build found one, as a
 * program built for NCCL is), and run under maco-run on MACO's library built from 2.32.6's
 * (ctest nccl_compat_3; it checks that the library it got is MACO's): what a program built for
 * 2.28.9 does still works.
 * Every function 2.28.9's nccl.h declares is referenced (bound at load time: a missing one
 * stops the program before main), and the CPU-side calls run with their results checked:
 * version, error strings, a communicator from NCCL_COMM_ID with a 2.28.9 ncclConfig_t (80
 * bytes), the queries, a non-blocking split with the old config, a shrink by the staying ranks,
 * argument errors naming the argument, a config with a bad magic, PreMulSum bookkeeping, a
 * simulated group with 2.28.9's ncclSimInfo_t, revoke and abort; with a GPU an allreduce
 * whose result is checked, without one its refusal. Exit 0 on success, 1 on a failed check
 * (the message says which).
 */
#include <dlfcn.h>
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if NCCL_VERSION_CODE != 22809
#error "this client must be compiled against the nccl.h of NCCL 2.28.9"
#endif
_Static_assert(sizeof(ncclConfig_t) == 80, "2.28.9's ncclConfig_t is 80 bytes");

static int g_rank;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: check failed at line %d: ", g_rank, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Every function of 2.28.9's nccl.h, by address: with -z now the loader binds each before main. */
typedef void (*any_fn)(void);
#define FN(f) (any_fn) f, (any_fn)p##f
static any_fn volatile g_every[] = {
    FN(ncclMemAlloc),
    FN(ncclMemFree),
    FN(ncclGetVersion),
    FN(ncclGetUniqueId),
    FN(ncclCommInitRankConfig),
    FN(ncclCommInitRank),
    FN(ncclCommInitAll),
    FN(ncclCommFinalize),
    FN(ncclCommDestroy),
    FN(ncclCommAbort),
    FN(ncclCommRevoke),
    FN(ncclCommSplit),
    FN(ncclCommShrink),
    FN(ncclCommInitRankScalable),
    FN(ncclGetErrorString),
    FN(ncclGetLastError),
    FN(ncclCommGetAsyncError),
    FN(ncclCommCount),
    FN(ncclCommCuDevice),
    FN(ncclCommUserRank),
    FN(ncclCommRegister),
    FN(ncclCommDeregister),
    FN(ncclCommWindowRegister),
    FN(ncclCommWindowDeregister),
    FN(ncclRedOpCreatePreMulSum),
    FN(ncclRedOpDestroy),
    FN(ncclReduce),
    FN(ncclBcast),
    FN(ncclBroadcast),
    FN(ncclAllReduce),
    FN(ncclReduceScatter),
    FN(ncclAllGather),
    FN(ncclAlltoAll),
    FN(ncclGather),
    FN(ncclScatter),
    FN(ncclSend),
    FN(ncclRecv),
    FN(ncclGroupStart),
    FN(ncclGroupEnd),
    FN(ncclGroupSimulateEnd),
};
#undef FN

/* Waits until a non-blocking creation is done; its final status. */
static ncclResult_t wait_ready(ncclComm_t c)
{
    ncclResult_t async = ncclInProgress;
    for (int i = 0; i < 60000 && async == ncclInProgress; i++) {
        if (ncclCommGetAsyncError(c, &async) != ncclSuccess)
            return ncclInternalError;
        if (async == ncclInProgress)
            usleep(1000);
    }
    return async;
}

static int has(const char *text, const char *part)
{
    return text != NULL && strstr(text, part) != NULL;
}

/* With a GPU: an allreduce of rank + 1 on every element, checked. Without: its refusal. */
static int allreduce_check(ncclComm_t comm, int nranks, int dev)
{
    float h[1024];
    char buf[64] = { 0 };
    if (dev < 0) {
        ncclResult_t res = ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comm, NULL);
        CHECK(res == ncclInvalidUsage && has(ncclGetLastError(comm), "CUDA device"),
              "ncclAllReduce without a GPU returned %d: %s", (int)res, ncclGetLastError(comm));
        void *p = NULL;
        CHECK(ncclMemAlloc(&p, 64) != ncclSuccess && p == NULL, "ncclMemAlloc without a GPU");
        return 0;
    }
    float *d = NULL;
    CHECK(cudaMalloc((void **)&d, sizeof(h)) == cudaSuccess, "cudaMalloc");
    for (int i = 0; i < 1024; i++)
        h[i] = (float)(g_rank + 1);
    CHECK(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice) == cudaSuccess, "copy in");
    CHECK(ncclAllReduce(d, d, 1024, ncclFloat, ncclSum, comm, NULL) == ncclSuccess,
          "ncclAllReduce: %s", ncclGetLastError(comm));
    CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost) == cudaSuccess, "copy out");
    for (int i = 0; i < 1024; i++)
        CHECK(h[i] == (float)(nranks * (nranks + 1) / 2), "element %d is %g", i, h[i]);
    cudaFree(d);
    return 0;
}

int main(void)
{
    const char *rank_s = getenv("MACO_RANK"), *size_s = getenv("MACO_WORLD_SIZE");
    const char *addr = getenv("MACO_BOOTSTRAP_ADDR");
    if (rank_s == NULL || size_s == NULL || addr == NULL) {
        fprintf(stderr, "run under maco-run with 3 or more ranks\n");
        return 2;
    }
    g_rank = atoi(rank_s);
    int nranks = atoi(size_s);
    CHECK(nranks >= 3, "needs 3 or more ranks, has %d", nranks);
    for (size_t i = 0; i < sizeof(g_every) / sizeof(g_every[0]); i++)
        CHECK(g_every[i] != NULL, "function %zu of 2.28.9's nccl.h is not bound", i);
    CHECK(dlsym(RTLD_DEFAULT, "maco_nccl_call_count") != NULL,
          "the libnccl.so.2 loaded is not MACO's (its run path or LD_LIBRARY_PATH)");

    /* The library is newer than the header; ncclGetVersion says so. */
    int version = 0;
    CHECK(ncclGetVersion(&version) == ncclSuccess && version >= NCCL_VERSION_CODE,
          "ncclGetVersion: %d, older than the header's %d", version, NCCL_VERSION_CODE);
    for (int r = 0; r < (int)ncclNumResults; r++) {
        const char *s = ncclGetErrorString((ncclResult_t)r);
        CHECK(s != NULL && strlen(s) > 3, "ncclGetErrorString(%d)", r);
        for (int q = 0; q < r; q++)
            CHECK(strcmp(s, ncclGetErrorString((ncclResult_t)q)) != 0, "results %d and %d", q, r);
    }

    /* The world, from NCCL_COMM_ID, with 2.28.9's config. */
    setenv("NCCL_COMM_ID", addr, 1);
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId: %s", ncclGetLastError(NULL));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    CHECK(cfg.size == 80 && cfg.version == 22809, "the old initializer: size %zu, version %u",
          cfg.size, cfg.version);
    cfg.commName = "compat-world";
    cfg.blocking = 1;
    ncclComm_t world = NULL;
    ncclConfig_t bad = cfg;
    bad.magic = 0x1234;
    CHECK(ncclCommInitRankConfig(&world, nranks, id, g_rank, &bad) == ncclInvalidArgument &&
              has(ncclGetLastError(NULL), "magic") && world == NULL,
          "a bad magic: %s", ncclGetLastError(NULL));
    CHECK(ncclCommInitRankConfig(&world, nranks, id, g_rank, &cfg) == ncclSuccess,
          "ncclCommInitRankConfig: %s", ncclGetLastError(NULL));
    int n = 0, r = -1, dev = -2;
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommCount(world, &n) == ncclSuccess && n == nranks, "count %d", n);
    CHECK(ncclCommUserRank(world, &r) == ncclSuccess && r == g_rank, "rank %d", r);
    CHECK(ncclCommCuDevice(world, &dev) == ncclSuccess && dev >= -1, "device %d", dev);
    CHECK(ncclCommGetAsyncError(world, &async) == ncclSuccess && async == ncclSuccess,
          "async error %d", (int)async);

    /* A non-blocking split by parity, keys reversing the order, with the old config. */
    ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
    nb.blocking = 0;
    ncclComm_t half = NULL;
    ncclResult_t res = ncclCommSplit(world, g_rank % 2, -g_rank, &half, &nb);
    CHECK((res == ncclSuccess || res == ncclInProgress) && half != NULL, "split: %s",
          ncclGetLastError(world));
    CHECK(wait_ready(half) == ncclSuccess, "the split's creation: %s", ncclGetLastError(half));
    int above = 0;
    for (int q = g_rank + 2; q < nranks; q += 2)
        above++;
    CHECK(ncclCommCount(half, &n) == ncclSuccess && n == (nranks - g_rank % 2 + 1) / 2,
          "split size %d", n);
    CHECK(ncclCommUserRank(half, &r) == ncclSuccess && r == above, "split rank %d, not %d", r,
          above);
    CHECK(ncclCommDestroy(half) == ncclSuccess, "destroy the split");
    CHECK(ncclCommSplit(world, -5, 0, &half, NULL) == ncclInvalidArgument &&
              has(ncclGetLastError(NULL), "color -5"),
          "a negative color: %s", ncclGetLastError(NULL));

    /* Shrink: the staying ranks only. */
    int excluded = nranks - 1;
    if (g_rank != excluded) {
        ncclComm_t small = NULL;
        CHECK(ncclCommShrink(world, &excluded, 1, &small, NULL, NCCL_SHRINK_DEFAULT) ==
                      ncclSuccess &&
                  small != NULL,
              "shrink: %s", ncclGetLastError(world));
        CHECK(ncclCommCount(small, &n) == ncclSuccess && n == nranks - 1, "shrunk size %d", n);
        CHECK(ncclCommUserRank(small, &r) == ncclSuccess && r == g_rank, "shrunk rank %d", r);
        CHECK(ncclCommDestroy(small) == ncclSuccess, "destroy the shrunk communicator");
    }

    /* Argument errors name the argument; the data types and ops are 2.28.9's. */
    char buf[64] = { 0 };
    CHECK(ncclAllReduce(buf, buf, 4, ncclNumTypes, ncclSum, world, NULL) == ncclInvalidArgument &&
              has(ncclGetLastError(NULL), "datatype 12"),
          "datatype: %s", ncclGetLastError(NULL));
    CHECK(ncclReduce(buf, buf, 4, ncclFloat, ncclNumOps, 0, world, NULL) == ncclInvalidArgument,
          "op: %s", ncclGetLastError(NULL));
    CHECK(ncclBroadcast(buf, buf, 4, ncclInt8, nranks, world, NULL) == ncclInvalidArgument &&
              has(ncclGetLastError(NULL), "root"),
          "root: %s", ncclGetLastError(NULL));
    CHECK(ncclCommRevoke(world, 3) == ncclInvalidArgument &&
              has(ncclGetLastError(NULL), "revokeFlags"),
          "revokeFlags: %s", ncclGetLastError(NULL));

    /* PreMulSum bookkeeping and a simulated group with 2.28.9's ncclSimInfo_t. */
    float scalar = 0.5f;
    ncclRedOp_t op = ncclSum;
    CHECK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, world) ==
                  ncclSuccess &&
              (int)op >= (int)ncclNumOps,
          "ncclRedOpCreatePreMulSum: %s", ncclGetLastError(world));
    CHECK(ncclRedOpDestroy(op, world) == ncclSuccess, "ncclRedOpDestroy");
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    CHECK(ncclGroupStart() == ncclSuccess, "group start");
    CHECK(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, world, NULL) == ncclSuccess,
          "queued allreduce: %s", ncclGetLastError(world));
    CHECK(ncclGroupSimulateEnd(&sim) == ncclSuccess && sim.estimatedTime > 0.0f,
          "ncclGroupSimulateEnd: %s", ncclGetLastError(NULL));
    CHECK(ncclGroupStart() == ncclSuccess && ncclGroupEnd() == ncclSuccess, "empty group");

    CHECK(allreduce_check(world, nranks, dev) == 0, "allreduce");

    /* Revoke and abort on a communicator of every rank. */
    ncclComm_t all = NULL, none = NULL;
    CHECK(ncclCommSplit(world, 0, g_rank, &all, NULL) == ncclSuccess, "split for revoke: %s",
          ncclGetLastError(world));
    /* A barrier (a split in which no rank takes part), so that no rank revokes the new
     * communicator while another is still making it. */
    CHECK(ncclCommSplit(world, NCCL_SPLIT_NOCOLOR, 0, &none, NULL) == ncclSuccess && none == NULL,
          "barrier: %s", ncclGetLastError(world));
    CHECK(ncclCommRevoke(all, NCCL_REVOKE_DEFAULT) == ncclSuccess, "ncclCommRevoke: %s",
          ncclGetLastError(all));
    CHECK(ncclCommSplit(all, 0, 0, &half, NULL) != ncclSuccess, "a split of a revoked one");
    CHECK(ncclCommAbort(all) == ncclSuccess, "ncclCommAbort");

    CHECK(ncclCommFinalize(world) == ncclSuccess, "ncclCommFinalize: %s", ncclGetLastError(world));
    CHECK(ncclCommDestroy(world) == ncclSuccess, "ncclCommDestroy");
    printf("rank %d: a client of nccl.h %d.%d.%d ran on the library of version %d\n", g_rank,
           NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, version);
    return 0;
}
