/*
 * maco_test.h - helpers shared by MACO's test binaries.
 *
 * maco_test::Test is the base fixture of every test: it fails a test in which MACO logged a
 * warning or an error that the test did not announce with AllowLog() (STYLE.md, rule 8).
 * MultiProcessMain() is main() for binaries started by maco-run: it joins the job from the
 * environment, optionally creates a communicator, and skips (exit 77, reason printed) when
 * the machine lacks the GPUs the binary needs.
 */
#ifndef MACO_TEST_H
#define MACO_TEST_H

#include <gtest/gtest.h>

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

/** Lines logged at warn or error level during the current test. */
std::vector<std::string> LoggedProblems();

/** The job of a multi-process binary (valid inside tests started by MultiProcessMain). */
maco_bootstrap_t Bootstrap();
maco_comm_t Comm();
int Rank();
int NRanks();

/** Exit code ctest reports as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
constexpr int kSkipExitCode = 77;

int MultiProcessMain(int argc, char **argv, bool with_comm, bool needs_one_gpu_per_rank);

} // namespace maco_test

#endif /* MACO_TEST_H */
