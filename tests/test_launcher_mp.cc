/*
 * test_launcher_mp.cc - a job started by a real launcher (tests/launchers/run.sh: mpirun, srun
 * with and without PMIx, torchrun with two agents; maco-run too):
 *   - the rank MACO reads is the launcher's own (TEST_LAUNCHER_RANK_VAR names its variable),
 *     every rank is distinct, and the launcher and the id's way are the expected ones
 *     (TEST_LAUNCHER="launcher/id source", e.g. "slurm/pmix");
 *   - a stranger that has rank 0's address (the job's unique id with a guessed nonce) and
 *     claims rank 1 before the real rank 1 joins is refused by rank 0, and the job goes on.
 */
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "maco_test.h"

namespace
{

using maco_test::Bootstrap;
using maco_test::NRanks;
using maco_test::Rank;

class LauncherMp : public maco_test::Test
{
};

TEST_F(LauncherMp, RankIsTheLaunchersOwn)
{
    maco_launch_info_t job;
    ASSERT_EQ(maco_launch_info_from_env(&job), MACO_OK) << maco_log_last_error();
    EXPECT_EQ(job.rank, Rank());
    EXPECT_EQ(job.world_size, NRanks());
    const char *want = getenv("TEST_LAUNCHER");
    if (want != nullptr) {
        EXPECT_EQ(std::string(job.launcher) + "/" + job.id_source, want);
    }
    const char *var = getenv("TEST_LAUNCHER_RANK_VAR");
    if (var != nullptr) {
        ASSERT_NE(getenv(var), nullptr) << var;
        EXPECT_EQ(atoi(getenv(var)), Rank()) << var;
    }
    /* Every rank once: the launcher's ranks are 0 .. n-1, each in one process. */
    std::vector<int> ranks(static_cast<size_t>(NRanks()), -1);
    ranks[static_cast<size_t>(Rank())] = job.rank;
    ASSERT_EQ(maco_bootstrap_allgather(Bootstrap(), ranks.data(), sizeof(int)), MACO_OK);
    for (int r = 0; r < NRanks(); r++)
        EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
    if (Rank() == 0)
        printf("launcher %s, id by %s: ranks 0..%d each once\n", job.launcher, job.id_source,
               NRanks() - 1);
}

/* The nonce sits at bytes 8..15 of a unique id (maco/bootstrap.h's wire layout). */
void SetNonce(maco_unique_id_t *id, uint64_t nonce)
{
    for (int i = 0; i < 8; i++)
        id->bytes[8 + i] = static_cast<uint8_t>(nonce >> (8 * i));
}

uint64_t GetNonce(const maco_unique_id_t &id)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= static_cast<uint64_t>(id.bytes[8 + i]) << (8 * i);
    return v;
}

TEST_F(LauncherMp, StrangerWithAGuessedNonceIsRefused)
{
    if (NRanks() < 2)
        GTEST_SKIP() << "needs a rank 1";
    /* A second job from the environment, through the launcher's store (or the nonce). */
    maco_unique_id_t id;
    int rank = -1, n = 0;
    ASSERT_EQ(maco_unique_id_from_env(&id, &rank, &n), MACO_OK) << maco_log_last_error();
    ASSERT_EQ(rank, Rank());
    ASSERT_EQ(n, NRanks());
    int refused = 1;
    if (rank == 1) {
        /* The stranger knows everything but the nonce, and knocks before rank 1 joins. */
        maco_unique_id_t guess = id;
        uint64_t g = static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}();
        SetNonce(&guess, g != GetNonce(id) ? g : ~g);
        fflush(stdout);
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            alarm(60);
            maco_bootstrap_t bs = nullptr;
            maco_status_t st = maco_bootstrap_create(&guess, 1, n, 20000, &bs);
            _exit(st == MACO_OK ? 1 : 0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        refused = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    if (rank == 0)
        maco_test::AllowLog("refused");
    maco_bootstrap_t bs = nullptr;
    ASSERT_EQ(maco_bootstrap_create(&id, rank, n, -1, &bs), MACO_OK) << maco_log_last_error();
    if (rank == 0) {
        /* Rank 0 saw the stranger and said no (it did not merely fail to connect). */
        bool seen = false;
        for (const std::string &line : maco_test::LoggedProblems())
            seen |= line.find("refused") != std::string::npos;
        EXPECT_TRUE(seen) << "rank 0 logged no refused connection";
    }
    std::vector<int> verdicts(static_cast<size_t>(n), 1);
    verdicts[static_cast<size_t>(rank)] = refused;
    ASSERT_EQ(maco_bootstrap_allgather(bs, verdicts.data(), sizeof(int)), MACO_OK);
    EXPECT_EQ(verdicts[1], 1) << "the stranger joined as rank 1";
    EXPECT_EQ(maco_bootstrap_barrier(bs), MACO_OK);
    EXPECT_EQ(maco_bootstrap_destroy(bs), MACO_OK);
}

} // namespace

int main(int argc, char **argv)
{
    return maco_test::MultiProcessMain(argc, argv, false, false);
}
