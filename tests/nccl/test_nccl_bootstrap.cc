/*
 * test_nccl_bootstrap.cc - maco_comm_create_from_nccl and maco_nccl_library_symbol
 * (maco/nccl_bootstrap.h), against libmaco only: the real NCCL is reached through
 * maco_nccl_library_symbol, so the test and MACO use one copy of it.
 *
 * TEST_NCCL_BOOT selects what runs (one process per case: MACO loads NCCL once per process):
 *   unset     argument errors (no library loaded);
 *   missing   MACO_NCCL_LIBRARY names no file: MACO_ERR_UNSUPPORTED naming the path;
 *   self      MACO_NCCL_LIBRARY is libmaco_nccl.so: MACO_ERR_INVALID_USAGE;
 *   long      MACO_NCCL_LIBRARY longer than 255 characters: MACO_ERR_INVALID_ARGUMENT with
 *             its length, and no library opened under a cut path;
 *   gpu       a real NCCL communicator (one rank: ncclCommInitAll on device 0; under maco-run
 *             with several ranks: ncclCommInitRank with rank 0's id sent over a MACO
 *             bootstrap), a MACO communicator made from it, and a checked maco_allreduce,
 *             also on memory of maco_mem_alloc_device, and again after the NCCL
 *             communicator is destroyed. Skips (exit 77, reason printed)
 *             without a GPU or a real NCCL, and where NCCL refuses ranks sharing one GPU.
 */
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "maco/maco.h"
#include "tests/maco_test.h"

namespace
{

bool Mode(const char *mode)
{
    const char *m = getenv("TEST_NCCL_BOOT");
    return m != nullptr && strcmp(m, mode) == 0;
}

class NcclBootstrap : public maco_test::Test
{
};

TEST_F(NcclBootstrap, ArgumentErrors)
{
    if (getenv("TEST_NCCL_BOOT") != nullptr)
        GTEST_SKIP() << "argument errors run without TEST_NCCL_BOOT";
    maco_test::AllowLog("is NULL");
    maco_comm_t comm = reinterpret_cast<maco_comm_t>(0x1);
    EXPECT_EQ(maco_comm_create_from_nccl(nullptr, &comm), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("nccl_comm is NULL"), std::string::npos)
        << maco_log_last_error();
    EXPECT_EQ(comm, reinterpret_cast<maco_comm_t>(0x1)); /* untouched */
    EXPECT_EQ(maco_comm_create_from_nccl(reinterpret_cast<ncclComm_t>(0x1), nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco_log_last_error()).find("comm_p is NULL"), std::string::npos)
        << maco_log_last_error();
    void *sym = nullptr;
    char why[256] = "";
    EXPECT_EQ(maco_nccl_library_symbol(nullptr, &sym, why, sizeof(why)), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(strstr(why, "name is NULL"), nullptr) << why;
    EXPECT_EQ(maco_nccl_library_symbol("ncclAllReduce", nullptr, why, sizeof(why)),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(strstr(why, "sym_p is NULL"), nullptr) << why;
}

/* maco_mem_alloc_device (maco/memory.h), the communicator-free allocation behind ncclMemAlloc. */
TEST_F(NcclBootstrap, DeviceAllocationArgumentErrors)
{
    if (getenv("TEST_NCCL_BOOT") != nullptr)
        GTEST_SKIP() << "argument errors run without TEST_NCCL_BOOT";
    maco_test::AllowLog("maco_mem_alloc_device");
    void *p = reinterpret_cast<void *>(0x1);
    EXPECT_EQ(maco_mem_alloc_device(-1, 16, nullptr), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_mem_alloc_device(-1, 0, &p), MACO_ERR_INVALID_ARGUMENT);
    char why[256];
    int n = maco_cuda_device_count(why, sizeof(why));
    if (n == 0) {
        EXPECT_EQ(maco_mem_alloc_device(-1, 16, &p), MACO_ERR_UNSUPPORTED);
        EXPECT_NE(std::string(maco_log_last_error()).find(why), std::string::npos)
            << maco_log_last_error();
    } else {
        EXPECT_EQ(maco_mem_alloc_device(n, 16, &p), MACO_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(maco_mem_alloc_device(-2, 16, &p), MACO_ERR_INVALID_ARGUMENT);
    }
    EXPECT_EQ(p, reinterpret_cast<void *>(0x1)); /* untouched */
}

TEST_F(NcclBootstrap, NoLibrary)
{
    if (!Mode("missing"))
        GTEST_SKIP() << "TEST_NCCL_BOOT=missing runs it";
    const char *path = getenv("MACO_NCCL_LIBRARY");
    ASSERT_NE(path, nullptr);
    void *sym = reinterpret_cast<void *>(0x1);
    char why[512] = "";
    /* A query: nothing logged. */
    EXPECT_EQ(maco_nccl_library_symbol("ncclAllReduce", &sym, why, sizeof(why)),
              MACO_ERR_UNSUPPORTED);
    EXPECT_EQ(sym, reinterpret_cast<void *>(0x1));
    EXPECT_NE(strstr(why, "cannot load the real NCCL"), nullptr) << why;
    EXPECT_NE(strstr(why, path), nullptr) << why;
    EXPECT_TRUE(maco_test::LoggedProblems().empty());
    /* The library is not looked at again, and the comm is never touched. */
    maco_test::AllowLog("cannot load the real NCCL");
    maco_comm_t comm = nullptr;
    EXPECT_EQ(maco_comm_create_from_nccl(reinterpret_cast<ncclComm_t>(0x1), &comm),
              MACO_ERR_UNSUPPORTED);
    EXPECT_EQ(comm, nullptr);
    std::string last = maco_log_last_error();
    EXPECT_NE(last.find("maco_comm_create_from_nccl: cannot load the real NCCL from "
                        "MACO_NCCL_LIBRARY='" +
                        std::string(path) + "'"),
              std::string::npos)
        << last;
}

TEST_F(NcclBootstrap, RefusesTooLongPath)
{
    if (!Mode("long"))
        GTEST_SKIP() << "TEST_NCCL_BOOT=long runs it";
    const char *path = getenv("MACO_NCCL_LIBRARY");
    ASSERT_NE(path, nullptr);
    ASSERT_GT(strlen(path), 255u);
    void *sym = reinterpret_cast<void *>(0x1);
    char why[512] = "";
    EXPECT_EQ(maco_nccl_library_symbol("ncclAllReduce", &sym, why, sizeof(why)),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(sym, reinterpret_cast<void *>(0x1));
    std::string want = "MACO_NCCL_LIBRARY is " + std::to_string(strlen(path)) +
                       " characters long; at most 255 are taken";
    EXPECT_NE(std::string(why).find(want), std::string::npos) << why;
}

TEST_F(NcclBootstrap, RefusesMacosOwnLibrary)
{
    if (!Mode("self"))
        GTEST_SKIP() << "TEST_NCCL_BOOT=self runs it";
    maco_test::AllowLog("MACO's own NCCL library");
    maco_comm_t comm = nullptr;
    EXPECT_EQ(maco_comm_create_from_nccl(reinterpret_cast<ncclComm_t>(0x1), &comm),
              MACO_ERR_INVALID_USAGE);
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(std::string(maco_log_last_error()).find("set MACO_NCCL_LIBRARY to the real NCCL"),
              std::string::npos)
        << maco_log_last_error();
    void *sym = nullptr;
    EXPECT_EQ(maco_nccl_library_symbol("ncclAllReduce", &sym, nullptr, 0), MACO_ERR_INVALID_USAGE);
}

/* ------------------------------------------------------------------ GPU */

struct RealNccl {
    decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
    decltype(&ncclCommInitRank) CommInitRank = nullptr;
    decltype(&ncclCommInitAll) CommInitAll = nullptr;
    decltype(&ncclCommDestroy) CommDestroy = nullptr;
    decltype(&ncclCommCuDevice) CommCuDevice = nullptr;
    decltype(&ncclGetLastError) GetLastError = nullptr;
    decltype(&ncclGetErrorString) GetErrorString = nullptr;

    bool Load(std::string *why)
    {
        char text[512];
        struct {
            const char *name;
            void **slot;
        } syms[] = {
            { "ncclGetUniqueId", reinterpret_cast<void **>(&GetUniqueId) },
            { "ncclCommInitRank", reinterpret_cast<void **>(&CommInitRank) },
            { "ncclCommInitAll", reinterpret_cast<void **>(&CommInitAll) },
            { "ncclCommDestroy", reinterpret_cast<void **>(&CommDestroy) },
            { "ncclCommCuDevice", reinterpret_cast<void **>(&CommCuDevice) },
            { "ncclGetLastError", reinterpret_cast<void **>(&GetLastError) },
            { "ncclGetErrorString", reinterpret_cast<void **>(&GetErrorString) },
        };
        for (auto &s : syms)
            if (maco_nccl_library_symbol(s.name, s.slot, text, sizeof(text)) != MACO_OK) {
                *why = text;
                return false;
            }
        return true;
    }
};

RealNccl g_nccl;
ncclComm_t g_nccl_comm = nullptr; /* made in main() */
int g_rank = 0, g_nranks = 1;

/* In place on `count` floats: from cudaMalloc, or (vmm) from maco_mem_alloc_device and
 * registered with the communicator (the collectives then use it in place). */
void CheckAllreduce(maco_comm_t comm, size_t count, bool vmm = false)
{
    std::vector<float> host(count);
    for (size_t i = 0; i < count; i++)
        host[i] = static_cast<float>((g_rank + 1) * (i % 1000));
    float *d = nullptr;
    maco_mem_t reg = nullptr;
    if (vmm) {
        ASSERT_EQ(maco_mem_alloc_device(-1, count * sizeof(float), reinterpret_cast<void **>(&d)),
                  MACO_OK)
            << maco_log_last_error();
        ASSERT_EQ(maco_mem_register(comm, d, count * sizeof(float), &reg), MACO_OK)
            << maco_log_last_error();
    } else {
        ASSERT_EQ(cudaMalloc(&d, count * sizeof(float)), cudaSuccess);
    }
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(maco_allreduce(d, d, count, MACO_FLOAT32, MACO_SUM, comm, stream), MACO_OK)
        << maco_comm_get_last_error(comm);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    maco_status_t async = MACO_OK;
    ASSERT_EQ(maco_comm_get_async_error(comm, &async), MACO_OK);
    ASSERT_EQ(async, MACO_OK) << maco_comm_get_last_error(comm);
    ASSERT_EQ(cudaMemcpy(host.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    const float ranks_sum = static_cast<float>(g_nranks * (g_nranks + 1) / 2);
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++)
        if (host[i] != ranks_sum * static_cast<float>(i % 1000))
            wrong++;
    EXPECT_EQ(wrong, 0u) << "of " << count;
    cudaStreamDestroy(stream);
    if (vmm) {
        EXPECT_EQ(maco_mem_deregister(reg), MACO_OK);
        EXPECT_EQ(maco_mem_free(nullptr, d), MACO_OK);
    } else {
        cudaFree(d);
    }
}

TEST_F(NcclBootstrap, AllreduceOnACommunicatorMadeFromNccl)
{
    if (!Mode("gpu"))
        GTEST_SKIP() << "TEST_NCCL_BOOT=gpu runs it";
    ASSERT_NE(g_nccl_comm, nullptr);
    maco_comm_t comm = nullptr;
    ASSERT_EQ(maco_comm_create_from_nccl(g_nccl_comm, &comm), MACO_OK) << maco_log_last_error();
    int rank = -1, nranks = -1, device = -2, nccl_device = -1;
    EXPECT_EQ(maco_comm_get_rank(comm, &rank), MACO_OK);
    EXPECT_EQ(maco_comm_get_nranks(comm, &nranks), MACO_OK);
    EXPECT_EQ(maco_comm_get_cuda_device(comm, &device), MACO_OK);
    EXPECT_EQ(g_nccl.CommCuDevice(g_nccl_comm, &nccl_device), ncclSuccess);
    EXPECT_EQ(rank, g_rank);
    EXPECT_EQ(nranks, g_nranks);
    EXPECT_EQ(device, nccl_device);
    for (size_t count : { size_t(1), size_t(1000), size_t(1) << 20 })
        ASSERT_NO_FATAL_FAILURE(CheckAllreduce(comm, count)) << count << " floats";
    ASSERT_NO_FATAL_FAILURE(CheckAllreduce(comm, size_t(1) << 20, true)) << "maco_mem_alloc_device";
    /* The MACO communicator does not need the NCCL one. */
    EXPECT_EQ(g_nccl.CommDestroy(g_nccl_comm), ncclSuccess);
    g_nccl_comm = nullptr;
    ASSERT_NO_FATAL_FAILURE(CheckAllreduce(comm, size_t(1) << 16)) << "after ncclCommDestroy";
    EXPECT_EQ(maco_comm_destroy(comm), MACO_OK);
}

/* The real NCCL communicator of the "gpu" case, or a reason to skip. */
int MakeNcclComm()
{
    char why[512];
    if (maco_cuda_device_count(why, sizeof(why)) == 0) {
        printf("SKIP: no GPU: %s\n", why);
        return maco_test::kSkipExitCode;
    }
    std::string text;
    if (!g_nccl.Load(&text)) {
        printf("SKIP: no real NCCL: %s\n", text.c_str());
        return maco_test::kSkipExitCode;
    }
    if (getenv("MACO_RANK") == nullptr) {
        int dev = 0;
        ncclResult_t r = g_nccl.CommInitAll(&g_nccl_comm, 1, &dev);
        if (r != ncclSuccess) {
            printf("FAIL: ncclCommInitAll(1 device): %s: %s\n", g_nccl.GetErrorString(r),
                   g_nccl.GetLastError(nullptr));
            return 1;
        }
        return 0;
    }
    /* Several ranks (maco-run): NCCL's id over a MACO bootstrap. */
    maco_bootstrap_t bs;
    if (maco_bootstrap_create_from_env(&bs) != MACO_OK) {
        printf("FAIL: bootstrap: %s\n", maco_log_last_error());
        return 1;
    }
    maco_bootstrap_get_rank(bs, &g_rank);
    maco_bootstrap_get_nranks(bs, &g_nranks);
    int ndev = 0;
    cudaGetDeviceCount(&ndev);
    cudaSetDevice(g_rank % ndev);
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (g_rank == 0 && g_nccl.GetUniqueId(&id) != ncclSuccess) {
        printf("FAIL: ncclGetUniqueId: %s\n", g_nccl.GetLastError(nullptr));
        return 1;
    }
    maco_bootstrap_broadcast(bs, 0, &id, sizeof(id));
    ncclResult_t r = g_nccl.CommInitRank(&g_nccl_comm, g_nranks, id, g_rank);
    int ok = r == ncclSuccess, all_ok = 1;
    std::vector<int> oks(g_nranks);
    oks[g_rank] = ok;
    maco_bootstrap_allgather(bs, oks.data(), sizeof(int));
    for (int v : oks)
        all_ok &= v;
    maco_bootstrap_destroy(bs);
    if (!all_ok) {
        const char *msg = ok ? "another rank failed" : g_nccl.GetLastError(nullptr);
        printf("%s: the real NCCL's ncclCommInitRank (rank %d of %d, %d GPUs): %s\n",
               ndev < g_nranks ? "SKIP" : "FAIL", g_rank, g_nranks, ndev, msg);
        return ndev < g_nranks ? maco_test::kSkipExitCode : 1;
    }
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    ::testing::InitGoogleTest(&argc, argv);
    if (Mode("gpu")) {
        int rc = MakeNcclComm();
        if (rc != 0)
            return rc;
    }
    return RUN_ALL_TESTS();
}
