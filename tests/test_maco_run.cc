/*
 * test_maco_run.cc - maco-run's MPS handling (--mps auto|on|off), on the CPU, with a fake
 * nvidia-cuda-mps-control first on PATH.
 *
 * The fake logs every call (arguments, CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY and
 * whether both folders exist) and each command it reads on standard input. `-d` starts a
 * "daemon": a background process named nvidia-cuda-mps-control that sleeps, whose pid goes to
 * the pipe folder; `get_server_list` succeeds while it lives; `quit` ends it. FAKE_MPS_FAIL=1
 * makes `-d` fail. The tests check what maco-run promises: the daemon starts only when asked
 * (auto: fewer GPUs than ranks), the ranks get its environment, and it is stopped and its
 * folder removed on every way the job can end.
 */
#include <signal.h>
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

#include "maco_test.h"

namespace
{

const char kFakeControl[] = R"(#!/bin/sh
log="$FAKE_MPS_LOG"
p="$CUDA_MPS_PIPE_DIRECTORY"
l="$CUDA_MPS_LOG_DIRECTORY"
dirs=no
[ -n "$p" ] && [ -d "$p" ] && [ -n "$l" ] && [ -d "$l" ] && dirs=yes
echo "call [$*] pipe=$p log=$l dirs=$dirs" >> "$log"
if [ "$1" = "-d" ]; then
  if [ -n "$FAKE_MPS_FAIL" ]; then echo "fake: cannot start" >&2; exit 1; fi
  sh -c 'exec -a nvidia-cuda-mps-control sleep 300' </dev/null >/dev/null 2>&1 &
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
     * daemon's process (its pid from the log) gone. */
    void ExpectCleanedUp()
    {
        std::string calls = Calls();
        size_t at = calls.find("started ");
        ASSERT_NE(at, std::string::npos) << calls;
        int pid = atoi(calls.c_str() + at + 8);
        ASSERT_GT(pid, 0);
        /* The daemon is maco-run's grandchild, reparented to init; a zombie counts as gone. */
        std::string state;
        std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
        if (stat) {
            std::string tok;
            stat >> tok >> tok >> state;
        }
        EXPECT_TRUE(state.empty() || state == "Z") << "the MPS daemon (pid " << pid << ") runs on";
        EXPECT_NE(calls.find("cmd quit"), std::string::npos) << calls;
        std::string left;
        Run("ls -A '" + tmp_ + "'", &left);
        EXPECT_EQ(left, "") << "maco-run left its MPS folder behind";
    }

    static int Run(const std::string &cmd, std::string *out)
    {
        FILE *p = popen(cmd.c_str(), "r");
        if (p == nullptr)
            return -1;
        char buf[4096];
        size_t n;
        out->clear();
        while ((n = fread(buf, 1, sizeof(buf), p)) > 0)
            out->append(buf, n);
        int status = pclose(p);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

    std::string dir_, bin_, log_, tmp_;
};

/* auto with fewer GPUs than ranks: started before the ranks, with private pipe and log
 * folders that exist and that every rank sees; stopped after a successful job. */
TEST_F(MacoRunMps, AutoStartsAPrivateDaemonWhenRanksOutnumberGpus)
{
    std::string out;
    int rc = Run(Env() + MACO_RUN_PATH +
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
    int rc = Run(Env() + MACO_RUN_PATH +
                     " -n 2 --gpus 1 sh -c 'if [ $MACO_RANK = 1 ]; then exit 7; fi; sleep 60' 2>&1",
                 &out);
    EXPECT_EQ(rc, 7) << out;
    ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());
}

TEST_F(MacoRunMps, StoppedOnTimeout)
{
    std::string out;
    int rc = Run(Env() + MACO_RUN_PATH + " -n 2 --gpus 1 --timeout 1 sleep 60 2>&1", &out);
    EXPECT_EQ(rc, 124) << out;
    ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());
}

/* SIGINT and SIGTERM to maco-run: forwarded to the ranks, then the daemon is stopped. */
TEST_F(MacoRunMps, StoppedOnSigintAndSigterm)
{
    for (const char *sig : { "INT", "TERM" }) {
        SCOPED_TRACE(sig);
        std::string out;
        Run("rm -f '" + log_ + "'", &out);
        std::string cmd = Env() + MACO_RUN_PATH +
                          " -n 2 --gpus 1 sh -c 'echo ready; while :; do sleep 0.05; done' 2>&1 & "
                          "pid=$!; for i in $(seq 100); do grep -q 'cmd get_server_list' '" +
                          log_ + "' 2>/dev/null && break; sleep 0.1; done; sleep 0.5; kill -" +
                          sig + " $pid; wait $pid; echo \"rc=$?\"";
        Run(cmd, &out);
        std::string want = std::string("rc=") + (sig[0] == 'I' ? "130" : "143");
        EXPECT_NE(out.find(want), std::string::npos) << out;
        ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());
    }
}

TEST_F(MacoRunMps, NotStartedWhenEveryRankHasAGpuOrWhenOff)
{
    std::string out;
    ASSERT_EQ(Run(Env() + MACO_RUN_PATH + " -n 2 --gpus 2 true 2>&1", &out), 0) << out;
    ASSERT_EQ(Run(Env() + MACO_RUN_PATH + " -n 2 --gpus 0 true 2>&1", &out), 0) << out;
    ASSERT_EQ(Run(Env() + MACO_RUN_PATH + " -n 4 --gpus 1 --mps off true 2>&1", &out), 0) << out;
    EXPECT_EQ(Calls(), "") << "nvidia-cuda-mps-control was called";
}

/* on: started whatever the GPU count; a daemon that cannot start fails the job before any
 * rank runs, with a message saying so and what the tool printed. */
TEST_F(MacoRunMps, OnStartsAlwaysAndFailsClearly)
{
    std::string out;
    ASSERT_EQ(Run(Env() + MACO_RUN_PATH + " -n 1 --gpus 4 --mps on true 2>&1", &out), 0) << out;
    ASSERT_NO_FATAL_FAILURE(ExpectCleanedUp());

    int rc = Run("FAKE_MPS_FAIL=1 " + Env() + MACO_RUN_PATH +
                     " -n 2 --mps on sh -c 'echo rank-ran' 2>&1",
                 &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_EQ(out.find("rank-ran"), std::string::npos) << out;
    EXPECT_NE(out.find("'nvidia-cuda-mps-control -d' failed"), std::string::npos) << out;
    EXPECT_NE(out.find("fake: cannot start"), std::string::npos) << out;
    std::string left;
    Run("ls -A '" + tmp_ + "'", &left);
    EXPECT_EQ(left, "") << "maco-run left its MPS folder behind";

    rc = Run(Env(false) + MACO_RUN_PATH + " -n 2 --mps on true 2>&1", &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("nvidia-cuda-mps-control is not on PATH"), std::string::npos) << out;
    /* auto without the tool: the ranks run, with a note saying what sharing needs. */
    rc = Run(Env(false) + MACO_RUN_PATH + " -n 2 --gpus 1 sh -c 'echo rank-ran' 2>&1", &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("rank-ran"), std::string::npos) << out;
    EXPECT_NE(out.find("MACO_SHARED_GPU=1"), std::string::npos) << out;
    rc = Run(Env() + MACO_RUN_PATH + " -n 2 --mps sometimes true 2>&1", &out);
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
    ASSERT_EQ(Run(env + "nvidia-cuda-mps-control -d", &out), 0) << out;
    ASSERT_EQ(
        Run(env + MACO_RUN_PATH + " -n 2 --gpus 1 sh -c 'echo pipe=$CUDA_MPS_PIPE_DIRECTORY' 2>&1",
            &out),
        0)
        << out;
    EXPECT_NE(out.find("[1] pipe=" + pipe), std::string::npos) << out;
    EXPECT_NE(out.find("it is left running"), std::string::npos) << out;
    std::string calls = Calls();
    EXPECT_EQ(calls.find("cmd quit"), std::string::npos) << calls;
    EXPECT_EQ(calls.find("call [-d]", calls.find("started")), std::string::npos) << calls;
    Run("echo quit | " + env + "nvidia-cuda-mps-control", &out); /* this test's own daemon */
}

} // namespace
