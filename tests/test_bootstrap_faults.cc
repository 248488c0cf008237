/*
 * test_bootstrap_faults.cc - the bootstrap under failures, with real processes: a rank
 * killed while the others wait in an allgather, a duplicated rank, a world-size mismatch.
 * Each case forks its ranks; a child reports through its exit code.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "log.h"
#include "maco/bootstrap.h"
#include "fork_ranks.h"
#include "maco_test.h"

namespace
{

using Clock = std::chrono::steady_clock;

using maco_test::ForkRanks;

/* Child exit codes. */
enum { kOk = 0, kWrongStatus = 10, kWrongMessage = 11, kTooSlow = 12, kSetupFailed = 13 };

class BootstrapFaults : public maco_test::Test
{
};

TEST_F(BootstrapFaults, RankKilledMidAllgatherIsNamedWithinSeconds)
{
    const int n = 4, victim = 2;
    std::vector<std::pair<int, int>> ranks;
    for (int r = 0; r < n; r++)
        ranks.emplace_back(r, n);
    std::vector<int> codes = ForkRanks(ranks, [&](int rank) {
        maco_bootstrap_t bs;
        if (maco_bootstrap_create_from_env(&bs) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        if (maco_bootstrap_barrier(bs) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        if (rank == victim) {
            usleep(300000); /* let the others block in the allgather first */
            raise(SIGKILL);
        }
        std::vector<char> buf(static_cast<size_t>(n) << 20);
        auto t0 = Clock::now();
        maco_status_t st = maco_bootstrap_allgather(bs, buf.data(), 1 << 20);
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        std::string msg = maco__last_error();
        maco_bootstrap_destroy(bs);
        if (st != MACO_ERR_REMOTE)
            return static_cast<int>(kWrongStatus);
        if (msg.find("rank " + std::to_string(victim)) == std::string::npos)
            return static_cast<int>(kWrongMessage);
        return s < 10.0 ? static_cast<int>(kOk) : static_cast<int>(kTooSlow);
    });
    for (int r = 0; r < n; r++) {
        if (r == victim)
            EXPECT_EQ(codes[static_cast<size_t>(r)], 128 + SIGKILL);
        else
            EXPECT_EQ(codes[static_cast<size_t>(r)], kOk) << "rank " << r;
    }
}

/* Both remaining ranks get a clear error quickly; none waits for the 20 s deadline. */
void ExpectSetupRejected(const std::vector<std::pair<int, int>> &ranks)
{
    auto t0 = Clock::now();
    std::vector<int> codes = ForkRanks(ranks, [](int) {
        maco_bootstrap_t bs;
        maco_status_t st = maco_bootstrap_create_from_env(&bs);
        if (st == MACO_OK) {
            maco_bootstrap_destroy(bs);
            return static_cast<int>(kWrongStatus);
        }
        return st == MACO_ERR_INVALID_ARGUMENT || st == MACO_ERR_REMOTE
                   ? static_cast<int>(kOk)
                   : static_cast<int>(kWrongStatus);
    });
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t i = 0; i < codes.size(); i++)
        EXPECT_EQ(codes[i], kOk) << "process " << i << " (rank " << ranks[i].first << ")";
    EXPECT_LT(s, 15.0);
}

TEST_F(BootstrapFaults, DuplicateRankFailsTheJobClearly)
{
    ExpectSetupRejected({ { 0, 3 }, { 1, 3 }, { 1, 3 } });
}

TEST_F(BootstrapFaults, WorldSizeMismatchFailsTheJobClearly)
{
    ExpectSetupRejected({ { 0, 2 }, { 1, 3 } });
}

} // namespace
