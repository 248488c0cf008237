/*
 * test_nccl_232.cc - the calls NCCL added from 2.29 to 2.32, through nccl.h (2.32.6) and
 * nccl_device.h only, on the CPU (docs/nccl.md lists each as run on MACO or refused):
 *   NcclApi232.*  one process, one-rank communicators (ctest nccl_api_232): the pnccl aliases,
 *                 ncclCommGetUniqueId and ncclCommGrow's argument rules and a grow by a second
 *                 thread, suspend, resume, memory statistics, ncclCommQueryProperties, the
 *                 per-call-config collectives' checks, the refused one-sided and device calls,
 *                 the parameter registry, ncclSetEncryption, ncclWinGetUserPtr;
 *   NcclGrow.*    under maco-run (ctest nccl_grow_4): the last rank of the job is left out of a
 *                 communicator and grown back into it, the id travelling through a file as it
 *                 would through a launcher's store.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <nccl_device.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "nccl/maco_nccl.h"

/* The layouts nccl/device_query.c and nccl/device_api.c write out for the calls whose header
 * they cannot include, checked here against the header itself. */
static_assert(offsetof(ncclCommProperties_t, ginType) == 36 &&
                  offsetof(ncclCommProperties_t, nLsaTeams) == 40 &&
                  offsetof(ncclCommProperties_t, commHash) == 56 &&
                  offsetof(ncclCommProperties_t, ginSupport) == 72 &&
                  offsetof(ncclCommProperties_t, devCommRuntimeVersionSize) == 136 &&
                  offsetof(ncclCommProperties_t, cftCountedSupport) == 146 &&
                  sizeof(ncclCommProperties_t) == 152,
              "ncclCommProperties_t as nccl/device_query.c lays it out");
static_assert(sizeof(ncclTeam_t) == 3 * sizeof(int) && offsetof(ncclTeam_t, stride) == 8,
              "ncclTeam_t is { nRanks, rank, stride }");
static_assert(sizeof(ncclMultimemHandle_t) == sizeof(void *), "ncclMultimemHandle_t is a pointer");
static_assert(sizeof(ncclGinType_t) == sizeof(int) &&
                  sizeof(ncclGinConnectionType_t) == sizeof(int),
              "the enums are ints");

namespace
{

std::string LastError()
{
    return ncclGetLastError(nullptr);
}

bool Has(const std::string &text, const char *part)
{
    return text.find(part) != std::string::npos;
}

/* A one-rank communicator (bootstrap only without a GPU). */
ncclComm_t OneRank()
{
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess) << LastError();
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess) << LastError();
    return comm;
}

int Device(ncclComm_t c)
{
    int dev = -2;
    EXPECT_EQ(ncclCommCuDevice(c, &dev), ncclSuccess);
    return dev;
}

TEST(NcclApi232, VersionAndTheNewAliases)
{
    int v = 0;
    ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
    EXPECT_EQ(v, 23206);
    EXPECT_STRNE(ncclGetErrorString(ncclTimeout), ncclGetErrorString(ncclRemoteError));
    const char *names[] = { "CommGetUniqueId",
                            "CommGrow",
                            "CommSuspend",
                            "CommResume",
                            "CommMemStats",
                            "WinGetUserPtr",
                            "PutSignal",
                            "Signal",
                            "WaitSignal",
                            "AllReduceConfig",
                            "BroadcastConfig",
                            "ReduceConfig",
                            "AllGatherConfig",
                            "ReduceScatterConfig",
                            "AlltoAllConfig",
                            "GatherConfig",
                            "ScatterConfig",
                            "SetEncryption",
                            "ParamBind",
                            "ParamGetI8",
                            "ParamGetU64",
                            "ParamGetStr",
                            "ParamGet",
                            "ParamGetParameter",
                            "ParamGetAllParameterKeys",
                            "ParamDumpAll",
                            "CommQueryProperties",
                            "GetLsaMultimemDevicePointer",
                            "GetPeerDevicePointer",
                            "GetCftDeviceLeInfo",
                            "TeamCft",
                            "TeamCftMultimem",
                            "CftBarrierCreateRequirement",
                            "GinOutboxCreateRequirement",
                            "GinInboxA2ACreateRequirement" };
    for (const char *n : names) {
        std::string a = std::string("nccl") + n, p = std::string("pnccl") + n;
        void *fa = dlsym(RTLD_DEFAULT, a.c_str()), *fp = dlsym(RTLD_DEFAULT, p.c_str());
        EXPECT_NE(fa, nullptr) << a;
        EXPECT_EQ(fa, fp) << a << " and " << p << " differ";
    }
    uint64_t native = 0;
    EXPECT_EQ(maco_nccl_call_count("ncclCommGrow", &native, nullptr), 0);
}

TEST(NcclApi232, GrowIdsComeFromRankZeroOneAtATime)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    ncclUniqueId id, id2;
    EXPECT_EQ(ncclCommGetUniqueId(c, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommGetUniqueId(nullptr, &id), ncclInvalidArgument);
    ASSERT_EQ(ncclCommGetUniqueId(c, &id), ncclSuccess) << LastError();
    /* The id is not an ordinary one: creating a communicator from it is not a grow. */
    EXPECT_EQ(ncclCommGetUniqueId(c, &id2), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "not been used by ncclCommGrow")) << LastError();
    ncclComm_t g = reinterpret_cast<ncclComm_t>(0x1);
    EXPECT_EQ(ncclCommGrow(c, 2, &id, -1, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommGrow(c, 2, &id, 0, &g, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "existing ranks pass -1")) << LastError();
    EXPECT_EQ(g, nullptr);
    EXPECT_EQ(ncclCommGrow(c, 1, &id, -1, &g, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "not above")) << LastError();
    EXPECT_EQ(ncclCommGrow(c, 2, nullptr, -1, &g, nullptr), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "rank 0 is the grow root")) << LastError();
    EXPECT_EQ(ncclCommGrow(nullptr, 2, nullptr, 1, &g, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "a new rank passes the id")) << LastError();
    EXPECT_EQ(ncclCommGrow(nullptr, 2, &id, 2, &g, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "outside [0, nRanks 2)")) << LastError();
    EXPECT_EQ(ncclCommGrow(nullptr, 2, &id, 0, &g, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "rank 0 is outside")) << LastError(); /* MACO's own check */

    /* The grow itself: this thread is the existing rank 0, another the new rank 1. */
    ncclComm_t mine = nullptr, theirs = nullptr;
    ncclResult_t their_res = ncclInternalError;
    std::thread t([&] { their_res = ncclCommGrow(nullptr, 2, &id, 1, &theirs, nullptr); });
    ncclResult_t res = ncclCommGrow(c, 2, &id, -1, &mine, nullptr);
    t.join();
    ASSERT_EQ(res, ncclSuccess) << LastError();
    ASSERT_EQ(their_res, ncclSuccess);
    int n = 0, r = -1;
    EXPECT_EQ(ncclCommCount(mine, &n), ncclSuccess);
    EXPECT_EQ(n, 2);
    EXPECT_EQ(ncclCommUserRank(mine, &r), ncclSuccess);
    EXPECT_EQ(r, 0);
    EXPECT_EQ(ncclCommUserRank(theirs, &r), ncclSuccess);
    EXPECT_EQ(r, 1);
    EXPECT_EQ(Device(theirs), Device(c));
    /* Used: the next grow needs a new id, which may now be made. */
    EXPECT_EQ(ncclCommGrow(c, 2, &id, -1, &g, nullptr), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "no id of ncclCommGetUniqueId")) << LastError();
    uint64_t native = 0;
    ASSERT_EQ(maco_nccl_call_count("ncclCommGrow", &native, nullptr), 0);
    EXPECT_GE(native, 2u);
    EXPECT_EQ(ncclCommDestroy(mine), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(theirs), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

/* A grow that no new rank joins ends at the bootstrap's deadline (ctest nccl_grow_alone sets
 * MACO_BOOTSTRAP_TIMEOUT=2s), saying what it waited for; the communicator stays usable and a
 * new id can be made. */
TEST(NcclApi232, AGrowThatNobodyJoinsEndsAtTheDeadline)
{
    if (getenv("TEST_NCCL_GROW_ALONE") == nullptr)
        GTEST_SKIP() << "ctest nccl_grow_alone runs it (with a short MACO_BOOTSTRAP_TIMEOUT)";
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    ncclUniqueId id;
    ASSERT_EQ(ncclCommGetUniqueId(c, &id), ncclSuccess) << LastError();
    ncclComm_t g = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    ncclResult_t res = ncclCommGrow(c, 2, &id, -1, &g, nullptr);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(res, ncclRemoteError) << LastError();
    EXPECT_TRUE(Has(LastError(), "ncclCommGrow")) << LastError();
    EXPECT_TRUE(Has(LastError(), "MACO_BOOTSTRAP_TIMEOUT")) << LastError();
    EXPECT_EQ(g, nullptr);
    printf("the grow that nobody joined ended after %.1f s: %s\n", took, LastError().c_str());
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_EQ(ncclCommGetUniqueId(c, &id), ncclSuccess) << LastError();
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclApi232, SuspendReleasesNothingAndSaysSo)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(ncclCommSuspend(c, 0), ncclSuccess) << LastError();
    EXPECT_EQ(ncclCommSuspend(c, NCCL_SUSPEND_MEM), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "NCCL_SUSPEND_MEM")) << LastError();
    EXPECT_EQ(ncclCommSuspend(c, 0x10), ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "flags 0x10")) << LastError();
    EXPECT_EQ(ncclCommResume(c), ncclSuccess) << LastError();
    EXPECT_EQ(ncclCommSuspend(nullptr, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommResume(nullptr), ncclInvalidArgument);
    uint64_t v = 7;
    EXPECT_EQ(ncclCommMemStats(c, ncclStatGpuMemSuspend, &v), ncclSuccess);
    EXPECT_EQ(v, 0u);
    v = 7;
    EXPECT_EQ(ncclCommMemStats(c, ncclStatGpuMemSuspended, &v), ncclSuccess);
    EXPECT_EQ(v, 0u);
    EXPECT_EQ(ncclCommMemStats(c, ncclStatGpuMemTotal, &v), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "does not count")) << LastError();
    EXPECT_EQ(ncclCommMemStats(c, ncclStatGpuMemPersist, &v), ncclInvalidUsage);
    EXPECT_EQ(ncclCommMemStats(c, static_cast<ncclCommMemStat_t>(9), &v), ncclInvalidArgument);
    EXPECT_EQ(ncclCommMemStats(c, ncclStatGpuMemSuspend, nullptr), ncclInvalidArgument);
    int n = 0;
    EXPECT_EQ(ncclCommCount(c, &n), ncclSuccess); /* still usable */
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclApi232, QueryPropertiesSaysNoDeviceApi)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    ncclCommProperties_t p = NCCL_COMM_PROPERTIES_INITIALIZER;
    p.cftSupport = true;
    p.ginSupport[3] = true;
    ASSERT_EQ(ncclCommQueryProperties(c, &p), ncclSuccess) << LastError();
    EXPECT_EQ(p.rank, 0);
    EXPECT_EQ(p.nRanks, 1);
    EXPECT_EQ(p.cudaDev, Device(c));
    EXPECT_FALSE(p.deviceApiSupport);
    EXPECT_FALSE(p.multimemSupport);
    EXPECT_EQ(p.ginType, NCCL_GIN_TYPE_NONE);
    EXPECT_EQ(p.nLsaTeams, 1);
    EXPECT_FALSE(p.hostRmaSupport);
    EXPECT_FALSE(p.ginSupport[3]);
    EXPECT_FALSE(p.cftSupport);
    /* A smaller struct (2.29.2's ends at ginType): nothing past its size is written. */
    ncclCommProperties_t old = NCCL_COMM_PROPERTIES_INITIALIZER;
    old.size = offsetof(ncclCommProperties_t, ginType) + sizeof(old.ginType);
    old.nLsaTeams = 42;
    ASSERT_EQ(ncclCommQueryProperties(c, &old), ncclSuccess) << LastError();
    EXPECT_EQ(old.nRanks, 1);
    EXPECT_EQ(old.nLsaTeams, 42);
    ncclCommProperties_t bad = NCCL_COMM_PROPERTIES_INITIALIZER;
    bad.magic = 0;
    EXPECT_EQ(ncclCommQueryProperties(c, &bad), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "NCCL_COMM_PROPERTIES_INITIALIZER")) << LastError();
    EXPECT_EQ(ncclCommQueryProperties(c, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommQueryProperties(nullptr, &p), ncclInvalidArgument);
    /* The device API's other calls are refused; the CFT teams hold this rank alone. */
    void *ptr = nullptr;
    EXPECT_EQ(ncclGetPeerDevicePointer(nullptr, 0, 0, &ptr), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "device API")) << LastError();
    EXPECT_EQ(ncclGetLsaMultimemDevicePointer(nullptr, 0, &ptr), ncclInvalidUsage);
    ncclTeam_t cft = ncclTeamCft(c, NCCL_CFT_TEAM_FLAT);
    EXPECT_EQ(cft.nRanks, 1);
    EXPECT_EQ(cft.rank, 0);
    ncclDevResourceRequirements_t req;
    memset(&req, 0, sizeof(req));
    EXPECT_EQ(ncclCftBarrierCreateRequirement(cft, 1, nullptr, &req), ncclInvalidUsage);
    ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
    ncclDevComm_t *dc = nullptr;
    EXPECT_EQ(ncclDevCommCreate(c, &reqs, dc), ncclInvalidUsage);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclApi232, ConfigCollectivesCheckTheirConfig)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    const bool gpu = Device(c) >= 0;
    char buf[64] = { 0 };
    ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
    EXPECT_EQ(cfg.size, sizeof(ncclCollConfig_t));
    ncclCollConfig_t bad = cfg;
    bad.magic = 7;
    EXPECT_EQ(ncclAllReduceConfig(buf, buf, 4, ncclFloat, ncclSum, c, nullptr, &bad),
              ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "NCCL_COLLCONFIG_INITIALIZER")) << LastError();
    bad = cfg;
    bad.size = 16;
    EXPECT_EQ(ncclBroadcastConfig(buf, buf, 4, ncclFloat, 0, c, nullptr, &bad),
              ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "config->size is 16")) << LastError();
    bad = cfg;
    bad.minCTAs = 8;
    bad.maxCTAs = 2;
    EXPECT_EQ(ncclReduceConfig(buf, buf, 4, ncclFloat, ncclSum, 0, c, nullptr, &bad),
              ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "minCTAs 8")) << LastError();
    bad = cfg;
    bad.algSelection = "ring";
    EXPECT_EQ(ncclAllGatherConfig(buf, buf, 4, ncclFloat, c, nullptr, &bad), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "forceAlgSelection")) << LastError();
    /* In a group the config's error is the group's. */
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAlltoAllConfig(buf, buf, 1, ncclFloat, c, nullptr, &bad), ncclInvalidUsage);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    /* Past the config checks, a config call is its plain call: without a GPU the same
     * refusal; a 2.31 config (no launchCompletionEvent) is read only as far as its size. */
    if (!gpu) {
        ncclCollConfig_t ok = cfg;
        ok.algSelection = "ring";
        ok.forceAlgSelection = 0;
        ok.cgaClusterSize = 2;
        ok.userProfilerTag = 99;
        EXPECT_EQ(ncclReduceScatterConfig(buf, buf, 1, ncclFloat, ncclSum, c, nullptr, &ok),
                  ncclInvalidUsage);
        EXPECT_TRUE(Has(LastError(), "CUDA device")) << LastError();
        ncclCollConfig_t v231 = cfg;
        v231.size = offsetof(ncclCollConfig_t, launchCompletionEvent);
        v231.launchCompletionEvent = reinterpret_cast<cudaEvent_t>(0x1);
        EXPECT_EQ(ncclBroadcastConfig(buf, buf, 1, ncclFloat, 0, c, nullptr, &v231),
                  ncclInvalidUsage);
        EXPECT_TRUE(Has(LastError(), "ncclBroadcast")) << LastError();
        EXPECT_EQ(ncclAllReduceConfig(buf, buf, 1, ncclFloat, ncclSum, c, nullptr, nullptr),
                  ncclInvalidUsage);
        EXPECT_TRUE(Has(LastError(), "CUDA device")) << LastError();
    }
    EXPECT_EQ(ncclAllReduceConfig(buf, buf, 4, static_cast<ncclDataType_t>(40), ncclSum, c, nullptr,
                                  &cfg),
              ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "datatype 40")) << LastError();
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclApi232, OneSidedCallsAreRefused)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    char buf[16] = { 0 };
    EXPECT_EQ(ncclPutSignal(buf, 4, ncclInt8, 0, nullptr, 0, 0, 0, 0, c, nullptr),
              ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "one-sided")) << LastError();
    EXPECT_EQ(ncclSignal(0, 0, 0, 0, c, nullptr), ncclInvalidUsage);
    ncclWaitSignalDesc_t desc = { 1, 0, 0, 0 };
    EXPECT_EQ(ncclWaitSignal(1, &desc, c, nullptr), ncclInvalidUsage);
    EXPECT_EQ(ncclSignal(0, 0, 0, 0, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(NcclApi232, TheParameterRegistryIsEmpty)
{
    ncclParamHandle_t h = nullptr;
    EXPECT_EQ(ncclParamBind(&h, "NCCL_DEBUG"), ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "'NCCL_DEBUG' is not a parameter")) << LastError();
    EXPECT_EQ(h, nullptr);
    EXPECT_EQ(ncclParamBind(nullptr, "NCCL_DEBUG"), ncclInvalidArgument);
    int32_t i32 = 0;
    EXPECT_EQ(ncclParamGetI32(reinterpret_cast<ncclParamHandle_t>(0x10), &i32),
              ncclInvalidArgument);
    EXPECT_TRUE(Has(LastError(), "not made by ncclParamBind")) << LastError();
    const char *s = "x";
    EXPECT_EQ(ncclParamGetStr(nullptr, &s), ncclInvalidArgument);
    int len = 5;
    EXPECT_EQ(ncclParamGetParameter("NCCL_PROTO", &s, &len), ncclInvalidArgument);
    EXPECT_EQ(s, nullptr);
    EXPECT_EQ(len, 0);
    const char **keys = nullptr;
    len = 5;
    EXPECT_EQ(ncclParamGetAllParameterKeys(&keys, &len), ncclSuccess);
    EXPECT_EQ(len, 0);
    EXPECT_NE(keys, nullptr);
    EXPECT_EQ(ncclParamGetAllParameterKeys(nullptr, &len), ncclInvalidArgument);
    ncclParamDumpAll();
}

TEST(NcclApi232, EncryptionNoneIsWhatMacoHas)
{
    ncclEncryptionConfig_t cfg = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    EXPECT_EQ(ncclSetEncryption(&cfg), ncclSuccess) << LastError();
    cfg.mode = NCCL_ENCRYPTION_MODE_PSK;
    cfg.psk = "secret";
    EXPECT_EQ(ncclSetEncryption(&cfg), ncclInvalidUsage);
    EXPECT_TRUE(Has(LastError(), "not encrypted")) << LastError();
    cfg.mode = 5;
    EXPECT_EQ(ncclSetEncryption(&cfg), ncclInvalidArgument);
    cfg = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    cfg.magic = 0;
    EXPECT_EQ(ncclSetEncryption(&cfg), ncclInvalidArgument);
    EXPECT_EQ(ncclSetEncryption(nullptr), ncclInvalidArgument);
}

TEST(NcclApi232, WindowUserPointerAndTheNewFlags)
{
    ncclComm_t c = OneRank();
    ASSERT_NE(c, nullptr);
    void *p = nullptr;
    EXPECT_EQ(ncclWinGetUserPtr(c, nullptr, &p), ncclInvalidArgument);
    static char buf[1 << 16];
    ncclWindow_t w = nullptr;
    ncclResult_t res =
        ncclCommWindowRegister(c, buf, sizeof(buf), &w,
                               NCCL_WIN_STRICT_ORDERING | NCCL_WIN_GIN_ONLY | NCCL_WIN_CFT_COUNTED);
    if (res != ncclSuccess) {
        /* Host memory may not register without a GPU; the flags were not what failed. */
        EXPECT_FALSE(Has(LastError(), "winFlags")) << LastError();
        ncclCommDestroy(c);
        GTEST_SKIP() << "ncclCommWindowRegister here: " << LastError();
    }
    EXPECT_EQ(ncclWinGetUserPtr(c, w, &p), ncclSuccess) << LastError();
    EXPECT_EQ(p, static_cast<void *>(buf));
    EXPECT_EQ(ncclWinGetUserPtr(c, w, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommWindowDeregister(c, w), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

/* ------------------------------------------------------------------ across processes */

int g_rank = -1, g_nranks = 0;

/* Where rank 0 leaves the grow id for the new rank: one file per job (its bootstrap address),
 * in the temp folder. */
std::string IdPath()
{
    std::string addr = getenv("MACO_BOOTSTRAP_ADDR");
    for (char &ch : addr)
        if (ch == ':' || ch == '/' || ch == '[' || ch == ']')
            ch = '_';
    const char *tmp = getenv("TMPDIR");
    return std::string(tmp != nullptr ? tmp : "/tmp") + "/maco-nccl-grow-" + addr;
}

TEST(NcclGrow, TheLastRankIsGrownBackIn)
{
    ASSERT_GE(g_nranks, 3) << "run under maco-run with 3 or more ranks";
    setenv("NCCL_COMM_ID", getenv("MACO_BOOTSTRAP_ADDR"), 1);
    ncclUniqueId wid;
    ASSERT_EQ(ncclGetUniqueId(&wid), ncclSuccess);
    ncclComm_t world = nullptr;
    ASSERT_EQ(ncclCommInitRank(&world, g_nranks, wid, g_rank), ncclSuccess) << LastError();
    const int newcomer = g_nranks - 1;
    ncclComm_t old = nullptr;
    ASSERT_EQ(
        ncclCommSplit(world, g_rank == newcomer ? NCCL_SPLIT_NOCOLOR : 0, g_rank, &old, nullptr),
        ncclSuccess)
        << LastError();
    const std::string path = IdPath();
    ncclComm_t grown = nullptr;
    if (g_rank == newcomer) {
        ASSERT_EQ(old, nullptr);
        /* The id arrives through the file (a launcher's store would do the same). */
        ncclUniqueId id;
        bool have = false;
        for (auto t0 = std::chrono::steady_clock::now();
             !have && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60);) {
            std::ifstream in(path, std::ios::binary);
            have = in.read(reinterpret_cast<char *>(&id), sizeof(id)).gcount() == sizeof(id);
            if (!have)
                usleep(10 * 1000);
        }
        ASSERT_TRUE(have) << "no grow id in " << path << " after 60 s";
        ASSERT_EQ(ncclCommGrow(nullptr, g_nranks, &id, newcomer, &grown, nullptr), ncclSuccess)
            << LastError();
    } else {
        ASSERT_NE(old, nullptr);
        ncclUniqueId id;
        if (g_rank == 1) {
            EXPECT_EQ(ncclCommGetUniqueId(old, &id), ncclInvalidUsage);
            EXPECT_TRUE(Has(LastError(), "only rank 0 makes the grow id")) << LastError();
        }
        if (g_rank == 0) {
            ASSERT_EQ(ncclCommGetUniqueId(old, &id), ncclSuccess) << LastError();
            std::string tmp = path + ".part";
            {
                std::ofstream out(tmp, std::ios::binary);
                out.write(reinterpret_cast<const char *>(&id), sizeof(id));
            }
            ASSERT_EQ(rename(tmp.c_str(), path.c_str()), 0) << path;
        }
        ASSERT_EQ(ncclCommGrow(old, g_nranks, g_rank == 0 ? &id : nullptr, -1, &grown, nullptr),
                  ncclSuccess)
            << LastError();
    }
    if (g_rank == 0)
        unlink(path.c_str());
    int n = 0, r = -1;
    ASSERT_EQ(ncclCommCount(grown, &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(grown, &r), ncclSuccess);
    EXPECT_EQ(n, g_nranks);
    EXPECT_EQ(r, g_rank); /* the existing ranks keep theirs, the new one takes the last */
    /* Every member works on it: a split with keys reversing the order. */
    ncclComm_t rev = nullptr;
    ASSERT_EQ(ncclCommSplit(grown, 0, -g_rank, &rev, nullptr), ncclSuccess) << LastError();
    ASSERT_EQ(ncclCommUserRank(rev, &r), ncclSuccess);
    EXPECT_EQ(r, g_nranks - 1 - g_rank);
    EXPECT_EQ(ncclCommDestroy(rev), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(grown), ncclSuccess);
    if (old != nullptr) {
        EXPECT_EQ(ncclCommDestroy(old), ncclSuccess);
    }
    EXPECT_EQ(ncclCommDestroy(world), ncclSuccess);
}

} // namespace

int main(int argc, char **argv)
{
    ::testing::InitGoogleTest(&argc, argv);
    const char *rank = getenv("MACO_RANK"), *size = getenv("MACO_WORLD_SIZE");
    if (rank != nullptr && size != nullptr && getenv("MACO_BOOTSTRAP_ADDR") != nullptr) {
        g_rank = atoi(rank);
        g_nranks = atoi(size);
    } else if (::testing::GTEST_FLAG(filter) == "*") {
        ::testing::GTEST_FLAG(filter) = "NcclApi232.*"; /* NcclGrow needs maco-run */
    }
    return RUN_ALL_TESTS();
}
