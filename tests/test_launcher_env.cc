/*
 * test_launcher_env.cc - which launcher's variables describe the job (src/host/bootstrap/
 * launcher.c) and how the unique id travels (env.c), from environments that each launcher
 * sets, in forked processes (each child starts from ClearLauncherEnv()). The real launchers
 * start MACO in tests/launchers/run.sh; these cases pin the rules and the messages.
 */
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/bootstrap/launcher.h"
#include "fork_ranks.h"
#include "src/host/base/log.h"
#include "maco/bootstrap.h"
#include "maco_test.h"
#include "src/host/os/socket.h"

namespace
{

using Vars = std::vector<std::pair<const char *, std::string>>;

/* Runs body in a child whose launcher variables are `vars` alone (an empty value unsets; the
 * child has a random MACO_BOOTSTRAP_NONCE unless unset); returns its exit code. A child
 * reports a mismatch on stderr. */
int InChild(const Vars &vars, const std::function<int()> &body)
{
    std::vector<int> codes = maco_test::ForkRanksWithEnv(
        { { 0, 1 } },
        [&](int, int) {
            for (const char *v :
                 { "MACO_RANK", "MACO_WORLD_SIZE", "MACO_LOCAL_RANK", "MACO_BOOTSTRAP_ADDR", "RANK",
                   "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                   "TORCHELASTIC_USE_AGENT_STORE" })
                unsetenv(v);
            setenv("MACO_BOOTSTRAP_TIMEOUT", "2s", 1);
            for (const auto &v : vars) {
                if (v.second.empty())
                    unsetenv(v.first);
                else
                    setenv(v.first, v.second.c_str(), 1);
            }
        },
        [&](int) { return body(); });
    return codes[0];
}

/* Child body: the launcher description must match. */
int Expect(const char *launcher, const char *source, int rank, int size, int local_rank, int node,
           int nnodes)
{
    maco_launch_info_t info;
    if (maco_launch_info_from_env(&info) != MACO_OK) {
        fprintf(stderr, "maco_launch_info_from_env failed: %s\n", maco__last_error());
        return 10;
    }
    if (strcmp(info.launcher, launcher) != 0 || strcmp(info.id_source, source) != 0 ||
        info.rank != rank || info.world_size != size || info.local_rank != local_rank ||
        info.node != node || info.num_nodes != nnodes) {
        fprintf(stderr, "got launcher %s source %s rank %d of %d local %d node %d of %d\n",
                info.launcher, info.id_source, info.rank, info.world_size, info.local_rank,
                info.node, info.num_nodes);
        return 11;
    }
    return 0;
}

/* Child body: the environment must be refused with `want` and a message holding each of
 * `texts`. */
int Refused(maco_status_t want, const std::vector<std::string> &texts)
{
    maco_launch_info_t info;
    maco_status_t st = maco_launch_info_from_env(&info);
    std::string msg = maco__last_error();
    if (st != want) {
        fprintf(stderr, "status %d, not %d: %s\n", st, want, msg.c_str());
        return 20;
    }
    for (const std::string &t : texts)
        if (msg.find(t) == std::string::npos) {
            fprintf(stderr, "'%s' is not in: %s\n", t.c_str(), msg.c_str());
            return 21;
        }
    return 0;
}

/* What srun sets in the task of step 0 of job 77: rank `rank` of `n`, 2 tasks per node. */
Vars SlurmTask(int rank, int n)
{
    return { { "SLURM_JOB_ID", "77" },
             { "SLURM_STEP_ID", "0" },
             { "SLURM_PROCID", std::to_string(rank) },
             { "SLURM_NTASKS", std::to_string(n) },
             { "SLURM_STEP_NUM_TASKS", std::to_string(n) },
             { "SLURM_LOCALID", std::to_string(rank % 2) },
             { "SLURM_NODEID", std::to_string(rank / 2) },
             { "SLURM_STEP_NUM_NODES", std::to_string((n + 1) / 2) },
             { "SLURM_STEP_TASKS_PER_NODE", n % 2 == 0 ? "2(x" + std::to_string(n / 2) + ")"
                                                       : "2(x" + std::to_string(n / 2) + "),1" },
             { "SLURM_STEP_NODELIST", "localhost,other[1-9]" } };
}

Vars Plus(Vars a, const Vars &b)
{
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

class LauncherEnv : public maco_test::Test
{
};

TEST_F(LauncherEnv, EachLaunchersVariables)
{
    EXPECT_EQ(InChild({ { "MACO_RANK", "1" },
                        { "MACO_WORLD_SIZE", "3" },
                        { "MACO_LOCAL_RANK", "1" },
                        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:5" } },
                      [] { return Expect("maco", "address", 1, 3, 1, -1, -1); }),
              0);
    EXPECT_EQ(InChild({ { "RANK", "5" },
                        { "WORLD_SIZE", "8" },
                        { "LOCAL_RANK", "1" },
                        { "GROUP_RANK", "2" },
                        { "MASTER_ADDR", "127.0.0.1" },
                        { "MASTER_PORT", "5" },
                        { "TORCHELASTIC_RUN_ID", "r" },
                        { "TORCHELASTIC_USE_AGENT_STORE", "True" } },
                      [] { return Expect("torchrun", "torchrun-store", 5, 8, 1, 2, -1); }),
              0);
    EXPECT_EQ(InChild({ { "OMPI_COMM_WORLD_RANK", "3" },
                        { "OMPI_COMM_WORLD_SIZE", "4" },
                        { "OMPI_COMM_WORLD_LOCAL_RANK", "1" },
                        { "OMPI_MCA_orte_num_nodes", "2" },
                        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:5" } },
                      [] { return Expect("ompi", "address", 3, 4, 1, -1, 2); }),
              0);
    EXPECT_EQ(InChild({ { "PMI_RANK", "2" },
                        { "PMI_SIZE", "4" },
                        { "MPI_LOCALRANKID", "0" },
                        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:5" } },
                      [] { return Expect("mpich", "address", 2, 4, 0, -1, -1); }),
              0);
    EXPECT_EQ(InChild(Plus(SlurmTask(5, 8), { { "MACO_BOOTSTRAP_NONCE", "abc" } }),
                      [] { return Expect("slurm", "slurm-nodelist", 5, 8, 1, 2, 4); }),
              0);
}

/* The innermost launcher wins: torchrun or mpirun started inside a Slurm step; maco-run inside
 * an interactive srun step; MACO_LAUNCHER names the launcher outright. */
TEST_F(LauncherEnv, InnerLauncherWinsOverTheEnclosingOne)
{
    Vars torch = { { "RANK", "6" },
                   { "WORLD_SIZE", "8" },
                   { "MASTER_ADDR", "h" },
                   { "MASTER_PORT", "5" },
                   { "TORCHELASTIC_RUN_ID", "r" },
                   { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:5" } };
    EXPECT_EQ(InChild(Plus(SlurmTask(1, 4), torch),
                      [] { return Expect("torchrun", "address", 6, 8, -1, -1, -1); }),
              0);
    Vars ompi = { { "OMPI_COMM_WORLD_RANK", "7" },
                  { "OMPI_COMM_WORLD_SIZE", "16" },
                  { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:5" } };
    EXPECT_EQ(InChild(Plus(SlurmTask(1, 2), ompi),
                      [] { return Expect("ompi", "address", 7, 16, -1, -1, -1); }),
              0);
    /* maco-run's job (a loopback address) inside an interactive srun step. */
    Vars maco_run = { { "MACO_RANK", "3" },
                      { "MACO_WORLD_SIZE", "4" },
                      { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:5" } };
    EXPECT_EQ(InChild(Plus(SlurmTask(0, 1), maco_run),
                      [] { return Expect("maco", "address", 3, 4, -1, -1, -1); }),
              0);
    /* MACO_LAUNCHER=maco: MACO's variables alone, whatever their address. */
    Vars forced = { { "MACO_RANK", "3" },
                    { "MACO_WORLD_SIZE", "4" },
                    { "MACO_BOOTSTRAP_ADDR", "10.0.0.1:5" },
                    { "MACO_LAUNCHER", "maco" } };
    EXPECT_EQ(InChild(Plus(SlurmTask(0, 1), forced),
                      [] { return Expect("maco", "address", 3, 4, -1, -1, -1); }),
              0);
}

/* Variables set by hand that agree with the launcher are fine (and take its node facts);
 * a rank or size that disagrees is an error naming both sides. */
TEST_F(LauncherEnv, ContradictionsNameBothVariables)
{
    Vars mapped = { { "MACO_RANK", "5" },
                    { "MACO_WORLD_SIZE", "8" },
                    { "MACO_BOOTSTRAP_ADDR", "10.0.0.1:5" } };
    EXPECT_EQ(InChild(Plus(SlurmTask(5, 8), mapped),
                      [] { return Expect("maco", "address", 5, 8, 1, 2, 4); }),
              0);
    /* The batch script evaluated $SLURM_PROCID once: every task says rank 0. */
    Vars stale = { { "MACO_RANK", "0" },
                   { "MACO_WORLD_SIZE", "8" },
                   { "MACO_BOOTSTRAP_ADDR", "10.0.0.1:5" } };
    EXPECT_EQ(InChild(Plus(SlurmTask(5, 8), stale),
                      [] {
                          return Refused(MACO_ERR_INVALID_ARGUMENT,
                                         { "MACO_RANK=0", "SLURM_PROCID=5", "MACO_LAUNCHER=maco" });
                      }),
              0);
    Vars torch_by_hand = {
        { "RANK", "1" }, { "WORLD_SIZE", "4" }, { "MASTER_ADDR", "h" }, { "MASTER_PORT", "5" }
    };
    EXPECT_EQ(InChild(Plus({ { "OMPI_COMM_WORLD_RANK", "1" }, { "OMPI_COMM_WORLD_SIZE", "2" } },
                           torch_by_hand),
                      [] {
                          return Refused(MACO_ERR_INVALID_ARGUMENT,
                                         { "WORLD_SIZE=4", "OMPI_COMM_WORLD_SIZE=2" });
                      }),
              0);
    /* PMIx's rank is the launcher's own: another value is an error. */
    EXPECT_EQ(
        InChild(
            Plus(SlurmTask(1, 4),
                 { { "PMIX_RANK", "2" }, { "PMIX_NAMESPACE", "slurm.pmix.77.0" } }),
            [] {
                return Refused(MACO_ERR_INVALID_ARGUMENT, { "PMIX_RANK='2'", "SLURM_PROCID=1" });
            }),
        0);
    /* Within one launcher: a rank outside the world names both variables. */
    EXPECT_EQ(InChild({ { "OMPI_COMM_WORLD_RANK", "4" }, { "OMPI_COMM_WORLD_SIZE", "4" } },
                      [] {
                          return Refused(MACO_ERR_INVALID_ARGUMENT,
                                         { "OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4" });
                      }),
              0);
}

TEST_F(LauncherEnv, MissingOrMalformedVariablesAreNamed)
{
    EXPECT_EQ(InChild({},
                      [] {
                          return Refused(MACO_ERR_INVALID_ARGUMENT,
                                         { "no launcher's variables", "SLURM_PROCID", "PMI_RANK" });
                      }),
              0);
    EXPECT_EQ(InChild({ { "MACO_RANK", "1" } },
                      [] {
                          return Refused(MACO_ERR_INVALID_ARGUMENT,
                                         { "MACO_RANK is set but MACO_WORLD_SIZE is not" });
                      }),
              0);
    EXPECT_EQ(InChild({ { "PMI_RANK", "x1" }, { "PMI_SIZE", "2" } },
                      [] { return Refused(MACO_ERR_INVALID_ARGUMENT, { "PMI_RANK='x1'" }); }),
              0);
    EXPECT_EQ(
        InChild({ { "MACO_LAUNCHER", "slurm" }, { "MACO_RANK", "0" }, { "MACO_WORLD_SIZE", "1" } },
                [] {
                    return Refused(MACO_ERR_INVALID_ARGUMENT,
                                   { "MACO_LAUNCHER=slurm but SLURM_PROCID is not set" });
                }),
        0);
    /* Slurm's batch script (no step): start the ranks with srun. */
    EXPECT_EQ(
        InChild({ { "SLURM_JOB_ID", "77" }, { "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "4" } },
                [] {
                    return Refused(MACO_ERR_INVALID_ARGUMENT, { "SLURM_STEP_ID is not", "srun" });
                }),
        0);
}

/* Launchers without a store and no nonce: the error says what to add. */
TEST_F(LauncherEnv, NoStoreSaysWhatToAdd)
{
    EXPECT_EQ(InChild(Plus(SlurmTask(1, 4), { { "MACO_BOOTSTRAP_NONCE", "" } }),
                      [] {
                          return Refused(MACO_ERR_INVALID_ARGUMENT,
                                         { "MACO_BOOTSTRAP_NONCE is not set", "--mpi=pmix",
                                           "openssl rand -hex 8" });
                      }),
              0);
    EXPECT_EQ(InChild({ { "PMI_RANK", "1" }, { "PMI_SIZE", "2" }, { "MACO_BOOTSTRAP_NONCE", "" } },
                      [] {
                          return Refused(MACO_ERR_INVALID_ARGUMENT,
                                         { "launcher mpich offers no PMIx", "MACO_BOOTSTRAP_ADDR",
                                           "MACO_BOOTSTRAP_NONCE" });
                      }),
              0);
}

/* PMIx offered but its library missing: MACO_ERR_UNSUPPORTED saying what to install. */
TEST_F(LauncherEnv, MissingPmixLibrarySaysWhatToInstall)
{
    Vars ompi = { { "OMPI_COMM_WORLD_RANK", "0" },
                  { "OMPI_COMM_WORLD_SIZE", "2" },
                  { "PMIX_RANK", "0" },
                  { "PMIX_NAMESPACE", "job.7" },
                  { "MACO_PMIX_LIBRARY", "/nonexistent/libpmix.so.2" } };
    EXPECT_EQ(InChild(ompi,
                      [] {
                          return Refused(MACO_ERR_UNSUPPORTED,
                                         { "PMIX_NAMESPACE='job.7'", "/nonexistent/libpmix.so.2",
                                           "libpmix2" });
                      }),
              0);
}

/* Under srun without PMIx, rank 0 is found on the step's first node at the derived port (or
 * MACO_BOOTSTRAP_PORT); it must run there, and a loopback name cannot serve several nodes. */
TEST_F(LauncherEnv, SlurmNodeListGivesRankZerosAddress)
{
    auto root_is = [](const char *want) {
        maco_unique_id_t id;
        int rank = -1, n = 0;
        if (maco_unique_id_from_env(&id, &rank, &n) != MACO_OK) {
            fprintf(stderr, "%s\n", maco__last_error());
            return 30;
        }
        uint64_t nonce = 0;
        maco__sockaddr_t root;
        if (maco__unique_id_decode(&id, &nonce, &root) != MACO_OK || nonce != 0xabc)
            return 31;
        char text[96];
        maco__sockaddr_format(&root, text, sizeof(text));
        if (std::string(text) != want) {
            fprintf(stderr, "root %s, not %s\n", text, want);
            return 32;
        }
        return 0;
    };
    Vars one_node = SlurmTask(1, 2);
    one_node.push_back({ "MACO_BOOTSTRAP_NONCE", "abc" });
    /* 20000 + (77 * 16 + 0) % 10000 */
    EXPECT_EQ(InChild(one_node, [&] { return root_is("127.0.0.1:21232"); }), 0);
    EXPECT_EQ(InChild(Plus(one_node, { { "MACO_BOOTSTRAP_PORT", "4242" } }),
                      [&] { return root_is("127.0.0.1:4242"); }),
              0);
    Vars two_nodes = SlurmTask(2, 4);
    two_nodes.push_back({ "MACO_BOOTSTRAP_NONCE", "abc" });
    EXPECT_EQ(InChild(two_nodes,
                      [] {
                          maco_unique_id_t id;
                          int rank = -1, n = 0;
                          maco_status_t st = maco_unique_id_from_env(&id, &rank, &n);
                          std::string msg = maco__last_error();
                          return st == MACO_ERR_INVALID_ARGUMENT &&
                                         msg.find("loopback") != std::string::npos
                                     ? 0
                                     : 40;
                      }),
              0);
    Vars misplaced = SlurmTask(0, 4);
    for (auto &v : misplaced)
        if (std::string(v.first) == "SLURM_NODEID")
            v.second = "1";
    misplaced.push_back({ "MACO_BOOTSTRAP_NONCE", "abc" });
    EXPECT_EQ(
        InChild(
            misplaced,
            [] {
                return Refused(MACO_ERR_INVALID_ARGUMENT, { "rank 0 runs on node 1", "localhost" });
            }),
        0);
}

/* A job of three forked "srun tasks" that meet through the node list, then allgather. */
TEST_F(LauncherEnv, SlurmNodeListJobRuns)
{
    int port = maco_test::FreePort();
    std::vector<int> codes = maco_test::ForkRanksWithEnv(
        { { 0, 3 }, { 1, 3 }, { 2, 3 } },
        [port](int rank, int world) {
            for (const auto &v : SlurmTask(rank, world))
                setenv(v.first, v.second.c_str(), 1);
            setenv("SLURM_STEP_NUM_NODES", "1", 1);
            setenv("SLURM_NODEID", "0", 1);
            setenv("MACO_BOOTSTRAP_PORT", std::to_string(port).c_str(), 1);
        },
        [](int rank) {
            maco_bootstrap_t bs;
            if (maco_bootstrap_create_from_env(&bs) != MACO_OK)
                return 50;
            int all[3] = { -1, -1, -1 };
            all[rank] = rank;
            int rc = maco_bootstrap_allgather(bs, all, sizeof(int)) == MACO_OK ? 0 : 51;
            for (int r = 0; r < 3 && rc == 0; r++)
                rc = all[r] == r ? 0 : 52;
            maco_bootstrap_destroy(bs);
            return rc;
        });
    for (size_t i = 0; i < codes.size(); i++)
        EXPECT_EQ(codes[i], 0) << "rank " << i;
}

TEST_F(LauncherEnv, SlurmFirstHost)
{
    struct Case {
        const char *list, *want;
    } ok[] = {
        { "vm", "vm" },
        { "node[01-04,07],gpu5", "node01" },
        { "node[7,1-3]", "node7" },
        { "r[1-2]-n[3-4]", "r1-n3" },
        { "a,b[1-2]", "a" },
        { "gpu-[009-010]", "gpu-009" },
    };
    for (const Case &c : ok) {
        char out[64];
        ASSERT_EQ(maco__slurm_first_host(c.list, out, sizeof(out)), 0) << c.list;
        EXPECT_STREQ(out, c.want) << c.list;
    }
    for (const char *bad : { "", "node[1-2", "node]1[", "n[[1]]", ",a" }) {
        char out[64];
        EXPECT_NE(maco__slurm_first_host(bad, out, sizeof(out)), 0) << bad;
    }
    char small[4];
    EXPECT_NE(maco__slurm_first_host("node1", small, sizeof(small)), 0);
}

TEST_F(LauncherEnv, SlurmTasksPerNode)
{
    EXPECT_EQ(maco__slurm_tasks_on_node("4", 0), 4);
    EXPECT_EQ(maco__slurm_tasks_on_node("4", 1), -1);
    EXPECT_EQ(maco__slurm_tasks_on_node("2(x3),1", 0), 2);
    EXPECT_EQ(maco__slurm_tasks_on_node("2(x3),1", 2), 2);
    EXPECT_EQ(maco__slurm_tasks_on_node("2(x3),1", 3), 1);
    EXPECT_EQ(maco__slurm_tasks_on_node("2(x3),1", 4), -1);
    EXPECT_EQ(maco__slurm_tasks_on_node("1,3(x2)", 2), 3);
    for (const char *bad : { "", "x", "2(x", "2(x0)", "2;1", "-1" })
        EXPECT_EQ(maco__slurm_tasks_on_node(bad, 0), -1) << bad;
}

} // namespace
