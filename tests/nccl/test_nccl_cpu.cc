/*
 * test_nccl_cpu.cc - libmaco_nccl.so's CPU-side behaviour through nccl.h only (no GPU
 * needed): version, error strings, the pnccl aliases, ncclConfig_t checks, argument errors
 * naming the argument, PreMulSum op bookkeeping, groups, and (selected by TEST_NCCL_MODE, one
 * process each, since the library loads the real NCCL once per process) the fallback's
 * loader and the NCCL_* environment mapping.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "nccl/maco_nccl.h"

namespace
{

std::string LastError()
{
    return ncclGetLastError(nullptr);
}

/* A one-rank communicator (bootstrap only without a GPU). */
ncclComm_t OneRank(ncclConfig_t *config = nullptr)
{
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess) << LastError();
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, config), ncclSuccess) << LastError();
    return comm;
}

bool Mode(const char *mode)
{
    const char *m = getenv("TEST_NCCL_MODE");
    return m != nullptr && strcmp(m, mode) == 0;
}

TEST(NcclCpu, VersionIs23206AndTheLibraryIsMacos)
{
    int v = 0;
    ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
    EXPECT_EQ(v, 23206);
    EXPECT_EQ(v, NCCL_VERSION_CODE);
    EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
    EXPECT_NE(LastError().find("version"), std::string::npos) << LastError();
    EXPECT_NE(dlsym(RTLD_DEFAULT, "maco_nccl_call_count"), nullptr);
}

TEST(NcclCpu, ErrorStringsForEveryResult)
{
    for (int r = 0; r < ncclNumResults; r++) {
        const char *s = ncclGetErrorString(static_cast<ncclResult_t>(r));
        ASSERT_NE(s, nullptr);
        EXPECT_GT(strlen(s), 3u);
        EXPECT_STREQ(s, pncclGetErrorString(static_cast<ncclResult_t>(r)));
        for (int q = 0; q < r; q++)
            EXPECT_STRNE(s, ncclGetErrorString(static_cast<ncclResult_t>(q)));
    }
    EXPECT_STREQ(ncclGetErrorString(static_cast<ncclResult_t>(99)), "unknown ncclResult_t");
}

/* Every ncclX is the same code as pncclX (NCCL's profiling aliases). */
TEST(NcclCpu, PncclAliasesAreTheSameFunctions)
{
    const char *names[] = { "AllReduce",
                            "Broadcast",
                            "Bcast",
                            "Reduce",
                            "AllGather",
                            "ReduceScatter",
                            "AlltoAll",
                            "Gather",
                            "Scatter",
                            "Send",
                            "Recv",
                            "GroupStart",
                            "GroupEnd",
                            "GroupSimulateEnd",
                            "CommInitRank",
                            "CommInitRankConfig",
                            "CommInitAll",
                            "CommInitRankScalable",
                            "CommSplit",
                            "CommShrink",
                            "CommFinalize",
                            "CommDestroy",
                            "CommAbort",
                            "CommRevoke",
                            "CommGetAsyncError",
                            "CommCount",
                            "CommCuDevice",
                            "CommUserRank",
                            "GetErrorString",
                            "GetLastError",
                            "GetVersion",
                            "GetUniqueId",
                            "CommRegister",
                            "CommDeregister",
                            "CommWindowRegister",
                            "CommWindowDeregister",
                            "MemAlloc",
                            "MemFree",
                            "RedOpCreatePreMulSum",
                            "RedOpDestroy",
                            "ResetDebugInit" };
    for (const char *n : names) {
        std::string a = std::string("nccl") + n, p = std::string("pnccl") + n;
        void *fa = dlsym(RTLD_DEFAULT, a.c_str()), *fp = dlsym(RTLD_DEFAULT, p.c_str());
        EXPECT_NE(fa, nullptr) << a;
        EXPECT_EQ(fa, fp) << a << " and " << p << " differ";
    }
}

TEST(NcclCpu, UniqueIdsDifferAndInitChecksItsArguments)
{
    ncclUniqueId a, b;
    ASSERT_EQ(ncclGetUniqueId(&a), ncclSuccess);
    ASSERT_EQ(ncclGetUniqueId(&b), ncclSuccess);
    EXPECT_NE(memcmp(&a, &b, sizeof(a)), 0);
    EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
    ncclComm_t c = nullptr;
    EXPECT_EQ(ncclCommInitRank(nullptr, 1, a, 0), ncclInvalidArgument);
    EXPECT_NE(LastError().find("comm"), std::string::npos) << LastError();
    EXPECT_EQ(ncclCommInitRank(&c, 0, a, 0), ncclInvalidArgument);
    EXPECT_NE(LastError().find("nranks"), std::string::npos) << LastError();
    EXPECT_EQ(ncclCommInitRank(&c, 2, a, 2), ncclInvalidArgument);
    EXPECT_NE(LastError().find("rank 2"), std::string::npos) << LastError();
    EXPECT_EQ(ncclCommInitRank(&c, 2, a, -1), ncclInvalidArgument);
    EXPECT_EQ(c, nullptr);
    EXPECT_EQ(ncclCommInitRankScalable(&c, 1, 0, 0, &a, nullptr), ncclInvalidArgument);
    EXPECT_NE(LastError().find("nId"), std::string::npos) << LastError();
    EXPECT_EQ(ncclCommInitAll(&c, 0, nullptr), ncclInvalidArgument);
    EXPECT_NE(LastError().find("ndev"), std::string::npos) << LastError();
}

TEST(NcclCpu, ConfigMagicSizeAndFieldsAreChecked)
{
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t c = nullptr;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    EXPECT_EQ(cfg.size, sizeof(ncclConfig_t));
    EXPECT_EQ(cfg.magic, 0xcafebeefu);
    EXPECT_EQ(cfg.version, 23206u);

    ncclConfig_t bad = cfg;
    bad.magic = 0x12345678;
    EXPECT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &bad), ncclInvalidArgument);
    EXPECT_NE(LastError().find("magic"), std::string::npos) << LastError();
    bad = cfg;
    bad.size = 8;
    EXPECT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &bad), ncclInvalidArgument);
    EXPECT_NE(LastError().find("size"), std::string::npos) << LastError();
    bad = cfg;
    bad.blocking = 2;
    EXPECT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &bad), ncclInvalidArgument);
    EXPECT_NE(LastError().find("blocking"), std::string::npos) << LastError();
    bad = cfg;
    bad.minCTAs = 8;
    bad.maxCTAs = 4;
    EXPECT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &bad), ncclInvalidArgument);
    EXPECT_NE(LastError().find("minCTAs"), std::string::npos) << LastError();
    EXPECT_EQ(c, nullptr);

    /* A config from an older nccl.h: only the fields up to its size are read (the garbage
     * after them would be invalid). */
    ncclConfig_t old = cfg;
    old.size = offsetof(ncclConfig_t, netName);
    old.splitShare = 7;
    old.blocking = 1;
    c = OneRank(&old);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);

    /* Every tuning field NCCL has is accepted. */
    ncclConfig_t tuned = cfg;
    tuned.cgaClusterSize = 2;
    tuned.minCTAs = 4;
    tuned.maxCTAs = 16;
    tuned.netName = "Socket";
    tuned.splitShare = 1;
    tuned.commName = "tuned";
    tuned.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
    c = OneRank(&tuned);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclCpu, OneRankCommunicatorQueries)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    int n = -1, r = -1, d = -2;
    EXPECT_EQ(ncclCommCount(c, &n), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(c, &r), ncclSuccess);
    EXPECT_EQ(ncclCommCuDevice(c, &d), ncclSuccess);
    EXPECT_EQ(n, 1);
    EXPECT_EQ(r, 0);
    EXPECT_GE(d, -1);
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_EQ(ncclCommCount(c, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommCount(nullptr, &n), ncclInvalidArgument);
    EXPECT_EQ(ncclCommGetAsyncError(nullptr, &async), ncclInvalidArgument);
    EXPECT_EQ(ncclCommRevoke(c, 1), ncclInvalidArgument);
    EXPECT_NE(LastError().find("revokeFlags"), std::string::npos) << LastError();
    EXPECT_EQ(ncclCommFinalize(c), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
    EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
}

TEST(NcclCpu, NonBlockingCreationReportsInProgressThenSuccess)
{
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    ncclResult_t res = ncclCommInitRankConfig(&c, 1, id, 0, &cfg);
    ASSERT_TRUE(res == ncclInProgress || res == ncclSuccess) << ncclGetErrorString(res);
    ASSERT_NE(c, nullptr);
    ncclResult_t async = ncclInProgress;
    for (int i = 0; i < 20000 && async == ncclInProgress; i++) {
        ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
        if (async == ncclInProgress)
            usleep(1000);
    }
    EXPECT_EQ(async, ncclSuccess);
    int n = 0;
    EXPECT_EQ(ncclCommCount(c, &n), ncclSuccess);
    EXPECT_EQ(n, 1);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

/* ncclCommDestroy and ncclCommAbort of a communicator whose non-blocking creation waits for
 * ranks that never come return at once, as NCCL's do, not at MACO_BOOTSTRAP_TIMEOUT (60 s
 * here): rank 0 of 2 waits for rank 1, rank 1 of 2 for a rank 0 that does not listen. */
TEST(NcclCpu, DestroyOrAbortOfAPendingNonBlockingCreationReturnsAtOnce)
{
    setenv("MACO_BOOTSTRAP_TIMEOUT", "60s", 1);
    for (int abort = 0; abort < 2; abort++)
        for (int rank = 0; rank < 2; rank++) {
            ncclUniqueId id;
            ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
            ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
            cfg.blocking = 0;
            ncclComm_t c = nullptr;
            ASSERT_EQ(ncclCommInitRankConfig(&c, 2, id, rank, &cfg), ncclInProgress);
            ncclResult_t async = ncclSuccess;
            ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
            EXPECT_EQ(async, ncclInProgress);
            auto t0 = std::chrono::steady_clock::now();
            EXPECT_EQ(abort ? ncclCommAbort(c) : ncclCommDestroy(c), ncclSuccess);
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            /* Far below the 60 s timeout, whatever the load: the call no longer waits for it. */
            EXPECT_LT(s, 30.0) << (abort ? "ncclCommAbort" : "ncclCommDestroy") << " rank " << rank;
            /* The handle is gone for the caller. */
            int n = 0;
            EXPECT_EQ(ncclCommCount(c, &n), ncclInvalidArgument);
        }
    unsetenv("MACO_BOOTSTRAP_TIMEOUT");
}

/* Argument errors name the argument and enqueue nothing; they need no GPU. */
TEST(NcclCpu, CollectiveArgumentErrorsNameTheArgument)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    char buf[64];
    EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, nullptr, nullptr),
              ncclInvalidArgument);
    EXPECT_NE(LastError().find("not a communicator"), std::string::npos) << LastError();
    EXPECT_EQ(ncclAllReduce(buf, buf, 4, static_cast<ncclDataType_t>(12), ncclSum, c, nullptr),
              ncclInvalidArgument);
    EXPECT_NE(LastError().find("datatype 12"), std::string::npos) << LastError();
    EXPECT_EQ(ncclReduce(buf, buf, 4, ncclFloat32, static_cast<ncclRedOp_t>(40), 0, c, nullptr),
              ncclInvalidArgument);
    EXPECT_NE(LastError().find("op 40"), std::string::npos) << LastError();
    EXPECT_EQ(ncclBroadcast(buf, buf, 4, ncclInt8, 1, c, nullptr), ncclInvalidArgument);
    EXPECT_NE(LastError().find("root 1"), std::string::npos) << LastError();
    EXPECT_EQ(ncclSend(buf, 4, ncclInt8, -1, c, nullptr), ncclInvalidArgument);
    EXPECT_NE(LastError().find("peer -1"), std::string::npos) << LastError();
    EXPECT_EQ(ncclGather(buf, buf, 4, ncclInt8, 3, c, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommRegister(c, nullptr, 16, nullptr), ncclInvalidArgument);
    EXPECT_NE(LastError().find("buff"), std::string::npos) << LastError();
    ncclWindow_t w = nullptr;
    EXPECT_EQ(ncclCommWindowRegister(c, buf, sizeof(buf), &w, 0x80), ncclInvalidArgument);
    EXPECT_NE(LastError().find("winFlags"), std::string::npos) << LastError();
    EXPECT_EQ(ncclCommWindowDeregister(c, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclMemAlloc(nullptr, 16), ncclInvalidArgument);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclCpu, PreMulSumOpsAreCreatedCheckedAndDestroyed)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    std::mt19937 rng(std::random_device{}());
    float scalar = static_cast<float>(rng() % 1000) / 7.0f;
    ncclRedOp_t op = ncclSum, op2 = ncclSum;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, c),
              ncclSuccess);
    EXPECT_GE(static_cast<int>(op), static_cast<int>(ncclNumOps));
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op2, &scalar, ncclFloat32, ncclScalarDevice, c),
              ncclSuccess);
    EXPECT_NE(op, op2);
    /* Another type than the op's. */
    char buf[16];
    EXPECT_EQ(ncclAllReduce(buf, buf, 2, ncclFloat64, op, c, nullptr), ncclInvalidArgument);
    EXPECT_NE(LastError().find("created for datatype"), std::string::npos) << LastError();
    EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat32, ncclScalarDevice, c),
              ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32,
                                       static_cast<ncclScalarResidence_t>(5), c),
              ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(ncclSum, c), ncclInvalidArgument);
    EXPECT_NE(LastError().find("built-in"), std::string::npos) << LastError();
    EXPECT_EQ(ncclRedOpDestroy(op, c), ncclSuccess);
    EXPECT_EQ(ncclRedOpDestroy(op, c), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(op2, c), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclCpu, GroupBookkeeping)
{
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_NE(LastError().find("ncclGroupStart"), std::string::npos) << LastError();
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    char buf[64];
    /* A bad call inside a group fails at once, and the group's end returns its error with
     * nothing issued. */
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllGather(buf, buf, 2, static_cast<ncclDataType_t>(-3), c, nullptr),
              ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess); /* inner */
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    EXPECT_NE(LastError().find("nothing of the group"), std::string::npos) << LastError();
    /* The group's error does not leak into the next one. */
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    /* Simulation: the estimate grows with the calls; nothing is issued. */
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, c, nullptr), ncclSuccess);
    EXPECT_EQ(ncclSend(buf, 16, ncclFloat32, 0, c, nullptr), ncclSuccess);
    EXPECT_EQ(ncclRecv(buf, 16, ncclFloat32, 0, c, nullptr), ncclSuccess);
    EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess);
    EXPECT_GT(sim.estimatedTime, 20.0f);
    ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
    bad.magic = 1;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclGroupSimulateEnd(&bad), ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess); /* the failed simulation left the group open */
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

/* Memory safety (each failed under valgrind or ASan before its fix): a destroyed or made-up
 * communicator is refused without being read, a handle ncclCommRegister never returned is
 * refused, and a communicator destroyed while its call waits in this thread's group drops the
 * call (the group's end fails) instead of reading freed memory. */
TEST(NcclCpu, DestroyedOrForeignCommunicatorsAreNotRead)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(ncclCommDeregister(c, reinterpret_cast<void *>(0x1234)), ncclInvalidArgument);
    EXPECT_NE(LastError().find("not returned by ncclCommRegister"), std::string::npos)
        << LastError();
    ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
    std::string after = ncclGetLastError(c); /* destroyed: not read */
    (void)after;
    ncclComm_t bogus = reinterpret_cast<ncclComm_t>(0x1000);
    std::string foreign = ncclGetLastError(bogus); /* never a communicator: not read */
    (void)foreign;
    EXPECT_EQ(ncclCommDestroy(c), ncclInvalidArgument);
    EXPECT_NE(LastError().find("not a communicator"), std::string::npos) << LastError();
    int n = 0;
    EXPECT_EQ(ncclCommCount(bogus, &n), ncclInvalidArgument);
}

TEST(NcclCpu, DestroyingACommunicatorInsideAGroupDropsItsQueuedCalls)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    char buf[64];
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, nullptr), ncclSuccess);
    ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_NE(LastError().find("nothing of the group"), std::string::npos) << LastError();
    /* The next group is clean. */
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
}

/* The watchdog pattern (how PyTorch's NCCL process group uses the library): one thread polls a
 * communicator's state while another destroys it. The poller only ever gets answers about a
 * live communicator or "not a communicator"; nothing reads the communicator while or after it
 * is freed (run under valgrind by ctest nccl_races_valgrind, under TSan in CI; before the fix
 * valgrind reported invalid reads of comm->magic in maco_nccl__comm_valid). */
TEST(NcclRaces, PollingWhileAnotherThreadDestroys)
{
    for (int round = 0; round < 20; round++) {
        ncclComm_t c = OneRank();
        ASSERT_NE(c, nullptr);
        std::atomic<bool> go{ false }, done{ false };
        std::atomic<int> live{ 0 }, gone{ 0 };
        std::thread poller([&] {
            while (!go.load())
                std::this_thread::yield();
            while (!done.load()) {
                ncclResult_t async = ncclSuccess;
                int n = 0, dev = 0, rank = 0;
                ncclResult_t a = ncclCommGetAsyncError(c, &async);
                ncclResult_t b = ncclCommCount(c, &n);
                ncclResult_t d = ncclCommCuDevice(c, &dev);
                ncclResult_t e = ncclCommUserRank(c, &rank);
                if (a == ncclSuccess && b == ncclSuccess && n == 1 && rank == 0)
                    live++;
                else if (a == ncclInvalidArgument || b == ncclInvalidArgument ||
                         d == ncclInvalidArgument || e == ncclInvalidArgument)
                    gone++;
                if (gone.load() > 0)
                    break; /* told: it stops, as a watchdog would */
            }
        });
        go = true;
        std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 5)));
        EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
        /* Until the poller has been told at least once (bounded: a stuck poller fails). */
        for (int i = 0; i < 20000 && gone.load() == 0; i++)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        done = true;
        poller.join();
        EXPECT_GT(gone.load(), 0) << "after the destroy the poller is told, never reads it";
    }
}

/* A call queued in thread A's group on a communicator that thread B then destroys and
 * re-creates at the same address (malloc gives B the block back) must not run on the new
 * communicator: A's group end refuses it, naming the destroyed communicator. (Regression: it
 * ran on B's new communicator.) */
TEST(NcclRaces, ACallQueuedInAGroupNeverRunsOnAReCreatedCommunicator)
{
    int same_address = 0;
    for (int attempt = 0; attempt < 20 && same_address == 0; attempt++) {
        ncclComm_t c = OneRank();
        ASSERT_NE(c, nullptr);
        std::atomic<int> step{ 0 };
        ncclResult_t end = ncclSuccess;
        std::string why;
        std::thread a([&] {
            char buf[64];
            ncclGroupStart();
            ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, nullptr);
            step = 1;
            while (step.load() != 2)
                std::this_thread::yield();
            end = ncclGroupEnd();
            why = LastError();
        });
        while (step.load() != 1)
            std::this_thread::yield();
        ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
        ncclComm_t again = OneRank();
        ASSERT_NE(again, nullptr);
        same_address = again == c;
        step = 2;
        a.join();
        if (same_address) {
            EXPECT_EQ(end, ncclInvalidArgument) << why;
            EXPECT_NE(why.find("destroyed while the call waited in a group"), std::string::npos)
                << why;
        }
        EXPECT_EQ(ncclCommDestroy(again), ncclSuccess);
    }
    if (!same_address)
        GTEST_SKIP() << "malloc never gave the new communicator the old one's address";
}

/* ncclCommWindowDeregister looks a window up before reading it: something that only looks
 * like a window (its first bytes copied from what the library writes), a window of no
 * communicator and NULL are refused, naming the window. (Regression: it read win->magic and
 * win->comm first, so a freed window, a double deregister or a forged one was read, and a
 * forged one freed.) */
TEST(NcclRaces, WindowDeregisterLooksTheWindowUpFirst)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    struct Forged {
        uint32_t magic;
        ncclComm_t comm;
        void *mem, *base;
        size_t size;
    };
    Forged *f = new Forged{ 0x4d4e5749u /* the library's window magic */, c, nullptr, nullptr, 64 };
    EXPECT_EQ(ncclCommWindowDeregister(c, reinterpret_cast<ncclWindow_t>(f)), ncclInvalidArgument);
    EXPECT_NE(LastError().find("is not a window of this communicator"), std::string::npos)
        << LastError();
    EXPECT_EQ(f->magic, 0x4d4e5749u) << "the forged window was written to";
    delete f;
    EXPECT_EQ(ncclCommWindowDeregister(c, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

/* A communicator created inside a group is created at the group's end. */
TEST(NcclCpu, CreationInsideAGroupHappensAtItsEnd)
{
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
    ASSERT_NE(c, nullptr);
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_EQ(async, ncclInProgress);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << LastError();
    EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

/* Without a GPU a valid collective fails with ncclInvalidUsage saying why, and is not forwarded
 * (the real NCCL could not run it either). */
TEST(NcclCpu, WithoutAGpuCollectivesSayWhy)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    int dev = 0;
    ASSERT_EQ(ncclCommCuDevice(c, &dev), ncclSuccess);
    if (dev >= 0) {
        ncclCommDestroy(c);
        GTEST_SKIP() << "a GPU is visible";
    }
    char buf[64];
    EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclAvg, c, nullptr), ncclInvalidUsage);
    EXPECT_NE(LastError().find("ncclAllReduce"), std::string::npos) << LastError();
    EXPECT_NE(LastError().find("CUDA device"), std::string::npos) << LastError();
    uint64_t native = 1, forwarded = 1;
    ASSERT_EQ(maco_nccl_call_count("ncclAllReduce", &native, &forwarded), 0);
    EXPECT_EQ(forwarded, 0u);
    EXPECT_EQ(maco_nccl_call_count("ncclNoSuchCall", &native, &forwarded), -1);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

/* ------------------------------------------------------------------ one process per mode */

TEST(NcclFallback, RefusesToLoadItself)
{
    if (!Mode("self"))
        GTEST_SKIP() << "TEST_NCCL_MODE=self runs it";
    char why[512] = "";
    EXPECT_EQ(maco_nccl_fallback_check(why, sizeof(why)), -1);
    EXPECT_NE(strstr(why, "MACO's own NCCL library"), nullptr) << why;
    EXPECT_NE(strstr(why, "full path"), nullptr) << why;
}

TEST(NcclFallback, NeverMeansNever)
{
    if (!Mode("never"))
        GTEST_SKIP() << "TEST_NCCL_MODE=never runs it";
    char why[512] = "";
    EXPECT_EQ(maco_nccl_fallback_check(why, sizeof(why)), -1);
    EXPECT_NE(strstr(why, "MACO_NCCL_FALLBACK=never"), nullptr) << why;
}

TEST(NcclFallback, LoadsTheRealNccl)
{
    if (!Mode("real"))
        GTEST_SKIP() << "TEST_NCCL_MODE=real runs it";
    char why[512] = "";
    EXPECT_EQ(maco_nccl_fallback_check(why, sizeof(why)), 0) << why;
    /* The real library stays out of this process's global symbols. */
    int v = 0;
    EXPECT_EQ(ncclGetVersion(&v), ncclSuccess);
    EXPECT_NE(dlsym(RTLD_DEFAULT, "maco_nccl_marker"), nullptr);
}

TEST(NcclEnv, NcclVariablesMapOntoMacos)
{
    if (!Mode("env"))
        GTEST_SKIP() << "TEST_NCCL_MODE=env runs it (with NCCL_* set by ctest)";
    /* Mapped when the library loaded. */
    ASSERT_NE(getenv("MACO_LOG_LEVEL"), nullptr);
    EXPECT_STREQ(getenv("MACO_LOG_LEVEL"), "info");
    ASSERT_NE(getenv("MACO_LOG_SUBSYS"), nullptr);
    EXPECT_STREQ(getenv("MACO_LOG_SUBSYS"), "^bootstrap,proxy");
    ASSERT_NE(getenv("MACO_SOCKET_IFNAME"), nullptr);
    EXPECT_STREQ(getenv("MACO_SOCKET_IFNAME"), "=lo"); /* the same syntax in both */
    ASSERT_NE(getenv("MACO_IB_HCA"), nullptr);
    EXPECT_STREQ(getenv("MACO_IB_HCA"), "=mlx5_0:1");
    /* An explicit MACO_* value wins over NCCL's. */
    ASSERT_NE(getenv("MACO_IB_TIMEOUT"), nullptr);
    EXPECT_STREQ(getenv("MACO_IB_TIMEOUT"), "20");
    /* NCCL_COMM_ID: every rank can make the same id from the address (a free port). */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)), 0);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &len), 0);
    close(fd);
    setenv("NCCL_COMM_ID", ("127.0.0.1:" + std::to_string(ntohs(sa.sin_port))).c_str(), 1);
    ncclUniqueId a, b;
    ASSERT_EQ(ncclGetUniqueId(&a), ncclSuccess);
    ASSERT_EQ(ncclGetUniqueId(&b), ncclSuccess);
    EXPECT_EQ(memcmp(&a, &b, sizeof(a)), 0);
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclCommInitRank(&c, 1, a, 0), ncclSuccess) << LastError();
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

} // namespace
