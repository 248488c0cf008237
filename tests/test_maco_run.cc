/*
 * test_maco_run.cc - maco-run on the CPU: the processes a job leaves behind, the descriptor
 * limit, and its MPS handling (--mps auto|on|off) with a fake nvidia-cuda-mps-control first on
 * PATH.
 *
 * Stray processes: kStrayRank is a rank that starts two processes which call setsid (leaving
 * the rank's process group, so killing the group misses them) and prints their pids: one keeps
 * the rank's stdout and stderr open, the other ignores SIGTERM. Whichever way the job ends,
 * both must be gone (ended and reaped) when maco-run returns, promptly.
 *
 * The fake MPS control logs every call (arguments, CUDA_MPS_PIPE_DIRECTORY,
 * CUDA_MPS_LOG_DIRECTORY and whether both folders exist) and each command it reads on standard
 * input. `-d` starts a "daemon": a background sleep whose pid goes to the pipe folder (a plain
 * sleep: /bin/sh may be dash, whose exec has no -a to rename it, and the daemon then died at
 * once); `get_server_list` succeeds while it lives; `quit` ends it and logs "stopped".
 * FAKE_MPS_FAIL=1 makes `-d` fail. The tests check what maco-run promises: the daemon starts
 * only when asked (auto: fewer GPUs than ranks), the ranks get its environment, and it is
 * stopped and its folder removed on every way the job can end.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "maco_test.h"

namespace
{

using maco_test::RunShell;

/* A rank that leaves two processes outside its process group (setsid), prints
 * "strays PID PID", waits until every rank has done so, then ends as $1 says: ok (exit 0),
 * fail (rank 1 exits 7, the others sleep), hang (print "ready" and sleep). The first stray
 * keeps the rank's stdout and stderr open; the second ignores SIGTERM. */
const char kStrayRank[] = R"SH(#!/bin/sh
dir=$(dirname "$0")
r=$MACO_RANK
setsid sh -c 'echo $$ > "$1"; exec sleep 60' sh "$dir/open.$r" &
setsid sh -c 'trap "" TERM; echo $$ > "$1"; exec sleep 60' sh "$dir/deaf.$r" \
  </dev/null >/dev/null 2>&1 &
for f in open deaf; do
  i=0
  while [ ! -s "$dir/$f.$r" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
done
echo "strays $(cat "$dir/open.$r") $(cat "$dir/deaf.$r")"
touch "$dir/done.$r"
i=0
while [ "$(ls "$dir" | grep -c '^done\.')" -lt "$MACO_WORLD_SIZE" ] && [ $i -lt 200 ]; do
  sleep 0.05; i=$((i + 1))
done
case "$1" in
fail) [ "$r" = 1 ] && exit 7; sleep 60 ;;
hang) echo ready; sleep 60 ;;
esac
exit 0
)SH";

/* Writes kStrayRank to `dir`/rank.sh; returns its path. */
std::string WriteStrayRank(const std::string &dir)
{
    std::string path = dir + "/rank.sh";
    std::ofstream(path) << kStrayRank;
    EXPECT_EQ(chmod(path.c_str(), 0700), 0);
    return path;
}

/* The stray pids the ranks printed ("[r] strays PID PID"). */
std::vector<int> StrayPids(const std::string &out)
{
    std::vector<int> pids;
    for (size_t at = out.find("] strays "); at != std::string::npos;
         at = out.find("] strays ", at + 1)) {
        std::istringstream line(out.substr(at + 9, out.find('\n', at) - at - 9));
        int pid;
        while (line >> pid)
            pids.push_back(pid);
    }
    return pids;
}

/* The state letter of `pid` from /proc (Z: a zombie), or "" when there is no such process. */
std::string ProcessState(int pid)
{
    std::string state;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    if (stat) {
        std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        size_t close = all.rfind(')');
        if (close != std::string::npos && close + 2 < all.size())
            state = all.substr(close + 2, 1);
    }
    return state;
}

/* Fails unless each of `pids` is gone: ended and reaped (not even a zombie). */
void ExpectGone(const std::vector<int> &pids)
{
    for (int pid : pids)
        EXPECT_EQ(ProcessState(pid), "") << "stray process " << pid << " is still there";
}

/* Kills those of `pids` still sleeping, so a failed test leaves nothing behind. */
void KillLeftovers(const std::vector<int> &pids)
{
    for (int pid : pids) {
        std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
        std::string name;
        if (comm >> name && name == "sleep" && ProcessState(pid) != "Z")
            kill(pid, SIGKILL);
    }
}

const char kFakeControl[] = R"(#!/bin/sh
log="$FAKE_MPS_LOG"
p="$CUDA_MPS_PIPE_DIRECTORY"
l="$CUDA_MPS_LOG_DIRECTORY"
dirs=no
[ -n "$p" ] && [ -d "$p" ] && [ -n "$l" ] && [ -d "$l" ] && dirs=yes
echo "call [$*] pipe=$p log=$l dirs=$dirs" >> "$log"
if [ "$1" = "-d" ]; then
  if [ -n "$FAKE_MPS_FAIL" ]; then echo "fake: cannot start" >&2; exit 1; fi
  sleep 300 </dev/null >/dev/null 2>&1 &
  echo $! > "$p/fake.pid"
  echo "started $!" >> "$log"
  exit 0
fi
read -r cmd
echo "cmd $cmd" >> "$log"
pid=$(cat "$p/fake.pid" 2>/dev/null) || exit 1
kill -0 "$pid" 2>/dev/null || exit 1
if [ "$cmd" = "quit" ]; then kill "$pid"; echo "stopped $pid" >> "$log"; fi
exit 0
)";

class MacoRunMps : public maco_test::Test
{
  protected:
    void SetUp() override
    {
        maco_test::Test::SetUp();
        char tmpl[] = "/tmp/maco-run-mps-test-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        bin_ = dir_ + "/bin";
        ASSERT_EQ(mkdir(bin_.c_str(), 0700), 0);
        std::string fake = bin_ + "/nvidia-cuda-mps-control";
        std::ofstream(fake) << kFakeControl;
        ASSERT_EQ(chmod(fake.c_str(), 0700), 0);
        log_ = dir_ + "/calls.txt";
        tmp_ = dir_ + "/tmp"; /* maco-run's TMPDIR: its MPS folder goes here */
        ASSERT_EQ(mkdir(tmp_.c_str(), 0700), 0);
    }
    void TearDown() override
    {
        std::string cmd = "rm -rf '" + dir_ + "'";
        EXPECT_EQ(system(cmd.c_str()), 0);
        maco_test::Test::TearDown();
    }

    /* The environment prefix that puts the fake first on PATH (`with_fake`) or leaves it
     * out, and points its log and maco-run's TMPDIR into this test's folder. */
    std::string Env(bool with_fake = true) const
    {
        return "FAKE_MPS_LOG='" + log_ + "' TMPDIR='" + tmp_ + "' PATH='" +
               (with_fake ? bin_ + ":" : std::string()) + "/usr/bin:/bin' ";
    }
    std::string Calls() const
    {
        std::ifstream in(log_);
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
    }
    /* True when maco-run left nothing behind: no folder in its TMPDIR, and the fake
     * daemon's process (its pid from the log) gone, ended by `quit` (not killed earlier). */
    void ExpectCleanedUp()
    {
        std::string calls = Calls();
        size_t at = calls.find("started ");
        ASSERT_NE(at, std::string::npos) << calls;
        int pid = atoi(calls.c_str() + at + 8);
        ASSERT_GT(pid, 0);
        /* The daemon is maco-run's grandchild, reparented to maco-run (a child subreaper),
         * which reaps it; a zombie counts as gone. */
        std::string state = ProcessState(pid);
        EXPECT_TRUE(state.empty() || state == "Z") << "the MPS daemon (pid " << pid << ") runs on";
        EXPECT_NE(calls.find("cmd quit"), std::string::npos) << calls;
        EXPECT_NE(calls.find("stopped " + std::to_string(pid)), std::string::npos)
            << "quit did not find the daemon alive\n"
            << calls;
        std::string left;
        RunShell("ls -A '" + tmp_ + "'", &left);
        EXPECT_EQ(left, "") << "maco-run left its MPS folder behind";
    }

    std::string dir_, bin_, log_, tmp_;
};

/* auto with fewer GPUs than ranks: started before the ranks, with private pipe and log
 * folders that exist and that every rank sees; stopped after a successful job. */
TEST_F(MacoRunMps, AutoStartsAPrivateDaemonWhenRanksOutnumberGpus)
{
    std::string out;
    int rc = RunShell(Env() + MACO_RUN_PATH +
                          " -n 3 --gpus 1 sh -c 'echo \"pipe=$CUDA_MPS_PIPE_DIRECTORY "
                          "log=$CUDA_MPS_LOG_DIRECTORY\"' 2>&1",
                      &out);
    ASSERT_EQ(rc, 0) << out;
    std::string calls = Calls();
    size_t d = calls.find("call [-d] pipe=");
    ASSERT_NE(d, std::string::npos) << calls;
    std::string line = calls.substr(d, calls.find('\n', d) - d);
    EXPECT_NE(line.find("dirs=yes"), std::string::npos) << line;
    std::string pipe = line.substr(line.find("pipe=") + 5);
    pipe = pipe.substr(0, pipe.find(' '));
    EXPECT_EQ(pipe.rfind(tmp_ + "/maco-mps-", 0), 0u) << "not in a folder maco-run owns: " << pipe;
    std::string logdir = line.substr(line.find(" log=") + 5);
    logdir = logdir.substr(0, logdir.find(' '));
    EXPECT_NE(logdir, pipe);
    for (int r = 0; r < 3; r++)
        EXPECT_NE(out.find("[" + std::to_string(r) + "] pipe=" + pipe + " log=" + logdir),
                  std::string::npos)
            << out;
    /* The daemon answered before the ranks ran, and quit came after them. */
    EXPECT_LT(calls.find("cmd get_server_list"), calls.find("cmd quit")) << calls;
    ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());
}

TEST_F(MacoRunMps, StoppedWhenARankFails)
{
    std::string out;
    int rc =
        RunShell(Env() + MACO_RUN_PATH +
                     " -n 2 --gpus 1 sh -c 'if [ $MACO_RANK = 1 ]; then exit 7; fi; sleep 60' 2>&1",
                 &out);
    EXPECT_EQ(rc, 7) << out;
    ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());
}

TEST_F(MacoRunMps, StoppedOnTimeout)
{
    std::string out;
    int rc = RunShell(Env() + MACO_RUN_PATH + " -n 2 --gpus 1 --timeout 1 sleep 60 2>&1", &out);
    EXPECT_EQ(rc, 124) << out;
    ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());
}

/* SIGINT and SIGTERM to maco-run: forwarded to the ranks, then the daemon is stopped. */
TEST_F(MacoRunMps, StoppedOnSigintAndSigterm)
{
    for (const char *sig : { "INT", "TERM" }) {
        SCOPED_TRACE(sig);
        std::string out;
        RunShell("rm -f '" + log_ + "'", &out);
        std::string cmd = Env() + MACO_RUN_PATH +
                          " -n 2 --gpus 1 sh -c 'echo ready; while :; do sleep 0.05; done' 2>&1 & "
                          "pid=$!; for i in $(seq 100); do grep -q 'cmd get_server_list' '" +
                          log_ + "' 2>/dev/null && break; sleep 0.1; done; sleep 0.5; kill -" +
                          sig + " $pid; wait $pid; echo \"rc=$?\"";
        RunShell(cmd, &out);
        std::string want = std::string("rc=") + (sig[0] == 'I' ? "130" : "143");
        EXPECT_NE(out.find(want), std::string::npos) << out;
        ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());
    }
}

/* Fewer GPUs than simulated nodes: every node's ranks pick GPUs from 0, so the nodes share
 * them and need MPS (regression: 2 ranks as 2 nodes on one GPU both took GPU 0 without MPS
 * and were refused). */
TEST_F(MacoRunMps, AutoStartsADaemonWhenSimulatedNodesShareGpus)
{
    std::string out;
    ASSERT_EQ(RunShell(Env() + MACO_RUN_PATH +
                           " -n 2 --simulate-nodes 2 --gpus 1 sh -c 'echo "
                           "\"gpus=${CUDA_VISIBLE_DEVICES-unset}\"' 2>&1",
                       &out),
              0)
        << out;
    EXPECT_NE(Calls().find("call [-d]"), std::string::npos) << "no daemon started: " << Calls();
    EXPECT_NE(out.find("[1] gpus=unset"), std::string::npos) << out;
}

/* At least one GPU per simulated node: node k gets GPUs k * G/K .. (k + 1) * G/K - 1
 * (CUDA_VISIBLE_DEVICES, entries of the list maco-run was given), as on real nodes; MPS only
 * where a node has more ranks than GPUs. */
TEST_F(MacoRunMps, SimulatedNodesGetGpusOfTheirOwn)
{
    const std::string echo = " sh -c 'echo \"r$MACO_RANK gpus=$CUDA_VISIBLE_DEVICES\"' 2>&1";
    std::string out;
    ASSERT_EQ(RunShell(Env() + MACO_RUN_PATH + " -n 4 --simulate-nodes 2 --gpus 4" + echo, &out), 0)
        << out;
    for (const char *want : { "r0 gpus=0,1", "r1 gpus=0,1", "r2 gpus=2,3", "r3 gpus=2,3" })
        EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
    EXPECT_EQ(Calls(), "") << "MPS started although every rank has a GPU";

    ASSERT_EQ(RunShell(Env() + "CUDA_VISIBLE_DEVICES=7,5,3,1 " + MACO_RUN_PATH +
                           " -n 4 --simulate-nodes 2 --gpus 4" + echo,
                       &out),
              0)
        << out;
    EXPECT_NE(out.find("r1 gpus=7,5"), std::string::npos) << out;
    EXPECT_NE(out.find("r3 gpus=3,1"), std::string::npos) << out;

    /* 2 GPUs for 2 nodes of 2 ranks: one GPU per node, shared by its ranks under MPS. */
    ASSERT_EQ(RunShell(Env() + MACO_RUN_PATH + " -n 4 --simulate-nodes 2 --gpus 2" + echo, &out), 0)
        << out;
    EXPECT_NE(out.find("r1 gpus=0"), std::string::npos) << out;
    EXPECT_NE(out.find("r2 gpus=1"), std::string::npos) << out;
    EXPECT_NE(Calls().find("call [-d]"), std::string::npos) << "no daemon started: " << Calls();
}

TEST_F(MacoRunMps, NotStartedWhenEveryRankHasAGpuOrWhenOff)
{
    std::string out;
    ASSERT_EQ(RunShell(Env() + MACO_RUN_PATH + " -n 2 --gpus 2 true 2>&1", &out), 0) << out;
    ASSERT_EQ(RunShell(Env() + MACO_RUN_PATH + " -n 2 --gpus 0 true 2>&1", &out), 0) << out;
    ASSERT_EQ(RunShell(Env() + MACO_RUN_PATH + " -n 4 --gpus 1 --mps off true 2>&1", &out), 0)
        << out;
    EXPECT_EQ(Calls(), "") << "nvidia-cuda-mps-control was called";
}

/* on: started whatever the GPU count; a daemon that cannot start fails the job before any
 * rank runs, with a message saying so and what the tool printed. */
TEST_F(MacoRunMps, OnStartsAlwaysAndFailsClearly)
{
    std::string out;
    ASSERT_EQ(RunShell(Env() + MACO_RUN_PATH + " -n 1 --gpus 4 --mps on true 2>&1", &out), 0)
        << out;
    ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());

    int rc = RunShell("FAKE_MPS_FAIL=1 " + Env() + MACO_RUN_PATH +
                          " -n 2 --mps on sh -c 'echo rank-ran' 2>&1",
                      &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_EQ(out.find("rank-ran"), std::string::npos) << out;
    EXPECT_NE(out.find("'nvidia-cuda-mps-control -d' failed"), std::string::npos) << out;
    EXPECT_NE(out.find("fake: cannot start"), std::string::npos) << out;
    std::string left;
    RunShell("ls -A '" + tmp_ + "'", &left);
    EXPECT_EQ(left, "") << "maco-run left its MPS folder behind";

    rc = RunShell(Env(false) + MACO_RUN_PATH + " -n 2 --mps on true 2>&1", &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("nvidia-cuda-mps-control is not on PATH"), std::string::npos) << out;
    /* auto without the tool: the ranks run, with a note saying what sharing needs. */
    rc = RunShell(Env(false) + MACO_RUN_PATH + " -n 2 --gpus 1 sh -c 'echo rank-ran' 2>&1", &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("rank-ran"), std::string::npos) << out;
    EXPECT_NE(out.find("MACO_SHARED_GPU=1"), std::string::npos) << out;
    rc = RunShell(Env() + MACO_RUN_PATH + " -n 2 --mps sometimes true 2>&1", &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("--mps 'sometimes' is invalid"), std::string::npos) << out;
}

/* A daemon the environment already reaches is used and left alone (never quit). */
TEST_F(MacoRunMps, AnExistingDaemonIsUsedAndLeftRunning)
{
    std::string pipe = dir_ + "/existing";
    ASSERT_EQ(mkdir(pipe.c_str(), 0700), 0);
    std::string out;
    std::string env =
        "CUDA_MPS_PIPE_DIRECTORY='" + pipe + "' CUDA_MPS_LOG_DIRECTORY='" + pipe + "' " + Env();
    ASSERT_EQ(RunShell(env + "nvidia-cuda-mps-control -d", &out), 0) << out;
    ASSERT_EQ(RunShell(env + MACO_RUN_PATH +
                           " -n 2 --gpus 1 sh -c 'echo pipe=$CUDA_MPS_PIPE_DIRECTORY' 2>&1",
                       &out),
              0)
        << out;
    EXPECT_NE(out.find("[1] pipe=" + pipe), std::string::npos) << out;
    EXPECT_NE(out.find("it is left running"), std::string::npos) << out;
    std::string calls = Calls();
    EXPECT_EQ(calls.find("cmd quit"), std::string::npos) << calls;
    EXPECT_EQ(calls.find("call [-d]", calls.find("started")), std::string::npos) << calls;
    RunShell("echo quit | " + env + "nvidia-cuda-mps-control", &out); /* this test's own daemon */
}

/* Processes the ranks left behind carry the private daemon's pipe folder in their
 * environment too: they are ended when the job ends, the daemon is not (quit stops it). */
TEST_F(MacoRunMps, StraysAreEndedButNotThePrivateDaemon)
{
    std::string rank = WriteStrayRank(dir_);
    std::string out;
    auto start = std::chrono::steady_clock::now();
    int rc = RunShell(Env() + MACO_RUN_PATH + " -n 2 --gpus 1 " + rank + " ok 2>&1", &out);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<int> strays = StrayPids(out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(strays.size(), 4u) << out;
    EXPECT_NE(out.find("maco-run: ended 4 process(es) the ranks left behind"), std::string::npos)
        << out;
    EXPECT_EQ(out.find("still running"), std::string::npos) << out;
    EXPECT_LT(secs, 15.0) << out;
    ExpectGone(strays);
    KillLeftovers(strays);
    ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());
}

/* Whichever way the job ends, every process the ranks started is ended and reaped before
 * maco-run returns, including those that called setsid and keep the ranks' output open. */
class MacoRunStrays : public maco_test::Test
{
  protected:
    void SetUp() override
    {
        maco_test::Test::SetUp();
        char tmpl[] = "/tmp/maco-run-stray-test-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        rank_ = WriteStrayRank(dir_);
    }
    void TearDown() override
    {
        KillLeftovers(strays_);
        std::string cmd = "rm -rf '" + dir_ + "'";
        EXPECT_EQ(system(cmd.c_str()), 0);
        maco_test::Test::TearDown();
    }

    /* Runs `shell`, a command line in which RANK stands for the stray rank's path; records
     * the strays the ranks printed, checks they are gone and that maco-run said it ended
     * `want` of them, all within `max_secs`. Returns the command's exit status. */
    int RunJob(std::string shell, size_t want, double max_secs, std::string *out)
    {
        shell.replace(shell.find("RANK"), 4, rank_);
        auto start = std::chrono::steady_clock::now();
        int rc = RunShell(shell, out);
        double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::vector<int> strays = StrayPids(*out);
        strays_.insert(strays_.end(), strays.begin(), strays.end());
        EXPECT_EQ(strays.size(), want) << *out;
        ExpectGone(strays);
        EXPECT_NE(out->find("maco-run: ended " + std::to_string(want) +
                            " process(es) the ranks left behind"),
                  std::string::npos)
            << *out;
        EXPECT_LT(secs, max_secs) << *out;
        std::string ignored;
        RunShell("rm -f '" + dir_ + "'/open.* '" + dir_ + "'/deaf.* '" + dir_ + "'/done.*",
                 &ignored);
        return rc;
    }

    std::string dir_, rank_;
    std::vector<int> strays_;
};

TEST_F(MacoRunStrays, EndedWhenTheJobSucceeds)
{
    std::string out;
    /* 3 s reading the strays' output after the ranks exited, 2 s of grace for SIGTERM. */
    EXPECT_EQ(RunJob(std::string(MACO_RUN_PATH) + " -n 2 --mps off RANK ok 2>&1", 4, 15, &out), 0)
        << out;
}

TEST_F(MacoRunStrays, EndedWhenARankFailsOrOnTimeout)
{
    std::string out;
    EXPECT_EQ(RunJob(std::string(MACO_RUN_PATH) + " -n 2 --mps off RANK fail 2>&1", 4, 15, &out), 7)
        << out;
    EXPECT_EQ(RunJob(std::string(MACO_RUN_PATH) + " -n 1 --mps off --timeout 3 RANK hang 2>&1", 2,
                     20, &out),
              124)
        << out;
}

TEST_F(MacoRunStrays, EndedOnSigterm)
{
    std::string out;
    std::string log = dir_ + "/job.txt";
    std::string cmd = std::string(MACO_RUN_PATH) + " -n 2 --mps off RANK hang >'" + log +
                      "' 2>&1 & pid=$!; for i in $(seq 200); do [ \"$(grep -c ready '" + log +
                      "')\" = 2 ] && break; sleep 0.05; done; kill -TERM $pid; wait $pid; "
                      "echo \"rc=$?\"; cat '" +
                      log + "'";
    RunJob(cmd, 4, 25, &out);
    EXPECT_NE(out.find("rc=143"), std::string::npos) << out;
}

/* maco-run sent SIGHUP (a terminal closed, an ssh session dropped), SIGQUIT, or SIGKILL (a
 * batch system's kill -9): no rank and no process in a rank's process group outlives it. HUP
 * and QUIT are forwarded like TERM; after KILL the watchdog ends the groups. Each rank starts
 * a child in its own process group and prints "pids RANK CHILD". */
class MacoRunKilled : public maco_test::Test
{
  protected:
    void SetUp() override
    {
        maco_test::Test::SetUp();
        char tmpl[] = "/tmp/maco-run-killed-test-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        rank_ = dir_ + "/rank.sh";
        std::ofstream(rank_) << "#!/bin/sh\nsleep 60 &\necho \"pids $$ $!\"\necho ready\nwait\n";
        ASSERT_EQ(chmod(rank_.c_str(), 0700), 0);
    }
    void TearDown() override
    {
        for (int pid : pids_)
            if (ProcessState(pid) != "" && ProcessState(pid) != "Z")
                kill(pid, SIGKILL);
        std::string ignored;
        RunShell("rm -rf '" + dir_ + "'", &ignored);
        maco_test::Test::TearDown();
    }
    /* Starts 2 ranks, sends `sig` to maco-run once both are ready, and returns its exit status
     * as the shell saw it; *out gets maco-run's output and then "rc=N". */
    void Run(const char *sig, std::string *out)
    {
        std::string log = dir_ + "/job-" + sig + ".txt";
        std::string cmd = "ulimit -c 0; " + std::string(MACO_RUN_PATH) + " -n 2 --mps off '" +
                          rank_ + "' >'" + log +
                          "' 2>&1 & pid=$!; for i in $(seq 200); do [ \"$(grep -c ready '" + log +
                          "')\" = 2 ] && break; sleep 0.05; done; kill -" + sig +
                          " $pid; wait $pid; rc=$?; cat '" + log + "'; echo \"rc=$rc\"";
        RunShell(cmd, out);
        CollectPids(*out);
    }
    /* Starts maco-run with 2 ranks as the leader of a process group of its own (as a shell with
     * job control starts a job), and once both ranks are ready sends SIGKILL to that whole
     * group (a shell's `kill -9 %1`). *out gets maco-run's output and then "rc=N". */
    void RunAndKillGroup(std::string *out, bool kill_watchdog_first = false)
    {
        std::string log = dir_ + "/job-group.txt";
        pid_t pid = fork();
        if (pid == 0) {
            setpgid(0, 0);
            int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0)
                _exit(126);
            dup2(fd, 1);
            dup2(fd, 2);
            execl(MACO_RUN_PATH, MACO_RUN_PATH, "-n", "2", "--mps", "off", rank_.c_str(),
                  static_cast<char *>(nullptr));
            _exit(127);
        }
        ASSERT_GT(pid, 0);
        setpgid(pid, pid);
        std::string text;
        for (int i = 0; i < 400; i++) {
            RunShell("cat '" + log + "'", &text);
            size_t n = 0;
            for (size_t at = text.find("] ready"); at != std::string::npos;
                 at = text.find("] ready", at + 1))
                n++;
            if (n == 2)
                break;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (kill_watchdog_first) {
            /* The watchdog: maco-run's child that runs maco-run's program (ranks run rank.sh). */
            std::string found;
            RunShell("for d in /proc/[0-9]*; do set -- $(sed 's/^.*) //' $d/stat 2>/dev/null); "
                     "[ \"$2\" = " +
                         std::to_string(pid) +
                         " ] && grep -q maco-run $d/comm 2>/dev/null && echo ${d#/proc/}; done",
                     &found);
            int watchdog = atoi(found.c_str());
            ASSERT_GT(watchdog, 0) << "no watchdog among maco-run's children";
            kill(watchdog, SIGKILL);
            for (int i = 0; i < 400 && text.find("starting another") == std::string::npos; i++) {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                RunShell("cat '" + log + "'", &text);
            }
            EXPECT_NE(text.find("starting another"), std::string::npos) << text;
        }
        kill(-pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        RunShell("cat '" + log + "'", out);
        *out += "rc=" +
                std::to_string(WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status)) +
                "\n";
        CollectPids(*out);
    }
    /* Records the pids of "[r] pids RANK CHILD" lines. */
    void CollectPids(const std::string &out)
    {
        for (size_t at = out.find("] pids "); at != std::string::npos;
             at = out.find("] pids ", at + 1)) {
            std::istringstream line(out.substr(at + 7, out.find('\n', at) - at - 7));
            int pid;
            while (line >> pid)
                pids_.push_back(pid);
        }
    }
    /* Fails unless every rank and child has ended within `secs` (a zombie has ended: after
     * SIGKILL its new parent reaps it). */
    void ExpectAllEnded(double secs, const std::string &out)
    {
        ASSERT_EQ(pids_.size(), 4u) << out;
        auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(secs);
        for (int pid : pids_) {
            while ((ProcessState(pid) != "" && ProcessState(pid) != "Z") &&
                   std::chrono::steady_clock::now() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            std::string st = ProcessState(pid);
            EXPECT_TRUE(st == "" || st == "Z") << "process " << pid << " still runs\n" << out;
        }
    }
    std::string dir_, rank_;
    std::vector<int> pids_;
};

TEST_F(MacoRunKilled, SighupIsForwardedAndEndsTheJob)
{
    std::string out;
    Run("HUP", &out);
    EXPECT_NE(out.find("rc=129"), std::string::npos) << out;
    EXPECT_NE(out.find("forwarding signal 1"), std::string::npos) << out;
    ExpectAllEnded(5, out);
}

TEST_F(MacoRunKilled, SigquitIsForwardedAndEndsTheJob)
{
    std::string out;
    Run("QUIT", &out);
    EXPECT_NE(out.find("rc=131"), std::string::npos) << out;
    EXPECT_NE(out.find("forwarding signal 3"), std::string::npos) << out;
    ExpectAllEnded(5, out);
}

TEST_F(MacoRunKilled, SigkillLeavesNoRankBehind)
{
    std::string out;
    Run("KILL", &out);
    EXPECT_NE(out.find("rc=137"), std::string::npos) << out;
    ExpectAllEnded(5, out);
    /* The watchdog said so (in the same log, maybe after the shell printed it). */
    std::string log;
    RunShell("cat '" + dir_ + "/job-KILL.txt'", &log);
    EXPECT_NE(log.find("died without ending its job"), std::string::npos) << log;
}

/* `kill -9 -- -PGID` of maco-run's process group (a shell's `kill -9 %1`, a process manager
 * ending a job) kills maco-run and everything in its group at once: the watchdog lives in a
 * group of its own and ends the ranks' groups, and every rank also dies with maco-run
 * (PR_SET_PDEATHSIG). Before, the watchdog shared maco-run's group, died with it, and every
 * rank and its child ran on. */
TEST_F(MacoRunKilled, KillingItsProcessGroupLeavesNoRankBehind)
{
    std::string out;
    RunAndKillGroup(&out);
    EXPECT_NE(out.find("rc=137"), std::string::npos) << out;
    /* The watchdog escalates to SIGKILL after 2 s; a busy machine may take longer. */
    ExpectAllEnded(30, out);
    std::string log;
    RunShell("cat '" + dir_ + "/job-group.txt'", &log);
    EXPECT_NE(log.find("died without ending its job"), std::string::npos) << log;
}

/* A watchdog killed while the job runs is noticed and replaced: after it, killing maco-run's
 * group still ends every rank's group (the ranks' children included, which PR_SET_PDEATHSIG
 * alone does not reach). */
TEST_F(MacoRunKilled, AKilledWatchdogIsReplaced)
{
    std::string out;
    RunAndKillGroup(&out, true);
    EXPECT_NE(out.find("rc=137"), std::string::npos) << out;
    ExpectAllEnded(30, out);
}

/* maco-run holds two pipes per rank: it raises its soft descriptor limit to the hard one
 * (the ranks still start with the soft limit they were given) ... */
TEST(MacoRunLimits, RaisesTheSoftDescriptorLimitForManyRanks)
{
    struct rlimit lim;
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < 1024)
        GTEST_SKIP() << "the hard descriptor limit is " << lim.rlim_max
                     << "; 300 ranks need about 610";
    std::string out;
    int rc = RunShell(std::string("ulimit -Sn 256 && exec ") + MACO_RUN_PATH +
                          " -n 300 --mps off sh -c 'ulimit -n' 2>&1",
                      &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("[0] 256\n"), std::string::npos) << out;
    EXPECT_NE(out.find("[299] 256\n"), std::string::npos) << out;
}

/* A rank that skips (exit 77, after printing why) ends the job with 77, said as a skip, so a
 * script tells "skipped" from "worked" and "failed". */
TEST(MacoRunExit, ASkippingRankGivesStatus77)
{
    std::string out;
    int rc = RunShell(std::string(MACO_RUN_PATH) +
                          " -n 2 --mps off sh -c 'echo \"SKIP: no GPU\"; exit 77' 2>&1",
                      &out);
    EXPECT_EQ(rc, 77) << out;
    EXPECT_NE(out.find("SKIP: no GPU"), std::string::npos) << out;
    EXPECT_NE(out.find(" skipped (exit status 77: it printed why)"), std::string::npos) << out;
    EXPECT_EQ(out.find("exited with status 77"), std::string::npos) << out;
}

/* ... and when even the hard limit is too low, it fails before starting any rank. */
TEST(MacoRunLimits, FailsBeforeStartingRanksWhenTheHardLimitIsTooLow)
{
    std::string out;
    int rc = RunShell(std::string("ulimit -Sn 64 && ulimit -Hn 64 && exec ") + MACO_RUN_PATH +
                          " -n 100 --mps off sh -c 'echo rank-ran' 2>&1",
                      &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("maco-run: -n 100 needs about "), std::string::npos) << out;
    EXPECT_NE(out.find(" file descriptors but the limit is 64 (ulimit -n)"), std::string::npos)
        << out;
    EXPECT_EQ(out.find("rank-ran"), std::string::npos) << out;
}

} // namespace
