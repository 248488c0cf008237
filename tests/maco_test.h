/*
 * maco_test.h - helpers shared by MACO's test binaries.
 *
 * maco_test::Test is the base fixture of every test: it fails a test in which MACO logged a
 * warning or an error that the test did not announce with AllowLog() (every test fails on an
 * unannounced problem). MultiProcessMain() is main() for binaries started by maco-run: it joins the
 * job from the environment, optionally creates a communicator, and skips (exit 77, reason printed)
 * when the machine has no GPU or its ranks cannot share the GPUs it has.
 */
#ifndef MACO_TEST_H
#define MACO_TEST_H

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "maco/maco.h"

namespace maco_test
{

class Test : public ::testing::Test
{
  protected:
    void SetUp() override;
    void TearDown() override;
};

/** Lines containing `substring` may be logged (at any level) during the current test. */
void AllowLog(const std::string &substring);

/** Runs `cmd` with /bin/sh, its stdout into *out; returns its exit status (128 + signal). */
int RunShell(const std::string &cmd, std::string *out);

/** Lines logged at warn or error level during the current test. */
std::vector<std::string> LoggedProblems();

/** The job of a multi-process binary (valid inside tests started by MultiProcessMain). */
maco_bootstrap_t Bootstrap();
maco_comm_t Comm();
int Rank();
int NRanks();

/** A fresh random seed drawn on rank 0 and broadcast, so every rank checks the same data. */
uint64_t SharedSeed();

/**
 * Serializes `mine`, allgathers the handles and imports every peer's into (*peers)[q]
 * (nullptr at this rank's index), checking each owner. Fatal gtest failures on error: call
 * it inside ASSERT_NO_FATAL_FAILURE.
 */
void ExchangeMem(maco_comm_t comm, maco_mem_t mine, std::vector<maco_mem_t> *peers);

/** A started proxy with a port channel of `transport` from `mine` to every peer's buffer. */
struct PortChannels {
    maco_proxy_t proxy = nullptr;
    std::vector<maco_port_channel_t> chans; /* [nranks], nullptr at this rank */

    /* Fatal gtest failures on error: call it inside ASSERT_NO_FATAL_FAILURE. */
    void Create(maco_comm_t comm, maco_transport_t transport, maco_mem_t mine,
                const std::vector<maco_mem_t> &peers);
    /* Stops the proxy, destroys the channels and the proxy (also done on destruction). */
    void Destroy();
    ~PortChannels()
    {
        Destroy();
    }
};

/** Exit code ctest reports as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
constexpr int kSkipExitCode = 77;

/* needs_gpu: skip (exit 77, reason printed) without a GPU, or when the ranks cannot share
 * the GPUs there are (no MPS and MACO_SHARED_GPU unset; with_comm must be true). */
int MultiProcessMain(int argc, char **argv, bool with_comm, bool needs_gpu);

} // namespace maco_test

#endif /* MACO_TEST_H */
