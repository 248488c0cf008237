/* test_unit.cc - one-process tests of the CPU core: status, config, log, bootstrap. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap_internal.h"
#include "config.h"
#include "fd_server.h"
#include "log.h"
#include "maco/bootstrap.h"
#include "maco/config.h"
#include "maco_test.h"
#include "socket.h"

namespace
{

class Unit : public maco_test::Test
{
  protected:
    void TearDown() override
    {
        for (const char *v :
             { "MACO_LOG_LEVEL", "MACO_LOG_SUBSYS", "MACO_LOG_FILE", "MACO_BOOTSTRAP_TIMEOUT",
               "MACO_SCRATCH_SIZE", "MACO_SCRATCH_SIZ", "MACO_HOST_ID" })
            unsetenv(v);
        maco__log_reset();
        maco_test::Test::TearDown();
    }
};

TEST_F(Unit, StatusStringsAreDistinctAndNeverNull)
{
    std::vector<std::string> seen;
    for (int s = 0; s >= -9; s--) {
        const char *text = maco_status_string(static_cast<maco_status_t>(s));
        ASSERT_NE(text, nullptr);
        EXPECT_STRNE(text, "unknown status") << s;
        for (const std::string &t : seen)
            EXPECT_NE(t, text) << "status " << s << " repeats a text";
        seen.emplace_back(text);
    }
    EXPECT_STREQ(maco_status_string(static_cast<maco_status_t>(-1000)), "unknown status");
    EXPECT_STREQ(maco_status_string(MACO_ERR_TIMEOUT), "timeout");
}

TEST_F(Unit, ParsesSizes)
{
    int64_t v;
    ASSERT_EQ(maco__parse_size("4096", &v), 0);
    EXPECT_EQ(v, 4096);
    ASSERT_EQ(maco__parse_size("64M", &v), 0);
    EXPECT_EQ(v, 64ll << 20);
    ASSERT_EQ(maco__parse_size(" 2g ", &v), 0);
    EXPECT_EQ(v, 2ll << 30);
    ASSERT_EQ(maco__parse_size("1KiB", &v), 0);
    EXPECT_EQ(v, 1024);
    ASSERT_EQ(maco__parse_size("3T", &v), 0);
    EXPECT_EQ(v, 3ll << 40);
    v = 77;
    for (const char *bad : { "", "M", "-1", "12Q", "1.5G", "9999999999999999999", "99999999T" })
        EXPECT_EQ(maco__parse_size(bad, &v), -1) << bad;
    EXPECT_EQ(v, 77) << "a failed parse must not write the output";
}

TEST_F(Unit, ParsesDurations)
{
    int64_t ms;
    ASSERT_EQ(maco__parse_duration_ms("30s", &ms), 0);
    EXPECT_EQ(ms, 30000);
    ASSERT_EQ(maco__parse_duration_ms("500ms", &ms), 0);
    EXPECT_EQ(ms, 500);
    ASSERT_EQ(maco__parse_duration_ms("250", &ms), 0);
    EXPECT_EQ(ms, 250);
    ASSERT_EQ(maco__parse_duration_ms("2m", &ms), 0);
    EXPECT_EQ(ms, 120000);
    ASSERT_EQ(maco__parse_duration_ms("1us", &ms), 0);
    EXPECT_EQ(ms, 1) << "a non-zero duration rounds up, never to 0";
    for (const char *bad : { "", "s", "-5s", "3h", "1.5s", "10 sec" })
        EXPECT_EQ(maco__parse_duration_ms(bad, &ms), -1) << bad;
}

TEST_F(Unit, ParsesBooleansAndInts)
{
    int b = -1;
    for (const char *yes : { "1", "true", "YES", "On" }) {
        ASSERT_EQ(maco__parse_bool(yes, &b), 0) << yes;
        EXPECT_EQ(b, 1);
    }
    for (const char *no : { "0", "false", "no", "OFF" }) {
        ASSERT_EQ(maco__parse_bool(no, &b), 0) << no;
        EXPECT_EQ(b, 0);
    }
    EXPECT_EQ(maco__parse_bool("maybe", &b), -1);
    int64_t i;
    ASSERT_EQ(maco__parse_int("-42", &i), 0);
    EXPECT_EQ(i, -42);
    EXPECT_EQ(maco__parse_int("4x", &i), -1);
}

TEST_F(Unit, ConfigBadValueNamesTheVariableAndWhatItAccepts)
{
    setenv("MACO_BOOTSTRAP_TIMEOUT", "soon", 1);
    maco_test::AllowLog("MACO_BOOTSTRAP_TIMEOUT='soon' is invalid");
    int64_t v = 5;
    EXPECT_EQ(maco__config_int64(MACO_CFG_BOOTSTRAP_TIMEOUT, &v), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(v, 5);
    std::string msg = maco__last_error();
    EXPECT_NE(msg.find("MACO_BOOTSTRAP_TIMEOUT='soon'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("duration"), std::string::npos) << msg;
    setenv("MACO_BOOTSTRAP_TIMEOUT", "45s", 1);
    ASSERT_EQ(maco__config_int64(MACO_CFG_BOOTSTRAP_TIMEOUT, &v), MACO_OK);
    EXPECT_EQ(v, 45000);
    unsetenv("MACO_BOOTSTRAP_TIMEOUT");
    ASSERT_EQ(maco__config_int64(MACO_CFG_BOOTSTRAP_TIMEOUT, &v), MACO_OK);
    EXPECT_EQ(v, 120000) << "default is 120 s";
}

TEST_F(Unit, UnknownVariableWarnsWithTheClosestName)
{
    setenv("MACO_SCRATCH_SIZ", "1M", 1);
    maco_test::AllowLog("unknown variable MACO_SCRATCH_SIZ");
    EXPECT_GE(maco__config_check_environment(), 1);
    int warned = 0;
    for (const std::string &line : maco_test::LoggedProblems()) {
        if (line.find("unknown variable MACO_SCRATCH_SIZ ") != std::string::npos) {
            warned++;
            EXPECT_NE(line.find("did you mean MACO_SCRATCH_SIZE?"), std::string::npos) << line;
        }
    }
    EXPECT_EQ(warned, 1);
    /* Once per process: a second check finds it again but does not warn again. */
    EXPECT_GE(maco__config_check_environment(), 1);
    warned = 0;
    for (const std::string &line : maco_test::LoggedProblems())
        warned += line.find("unknown variable MACO_SCRATCH_SIZ ") != std::string::npos;
    EXPECT_EQ(warned, 1);
}

TEST_F(Unit, ConfigTableIsListable)
{
    int n = maco_config_count();
    ASSERT_GT(n, 5);
    maco_config_info_t info;
    bool found = false;
    for (int i = 0; i < n; i++) {
        ASSERT_EQ(maco_config_describe(i, &info), MACO_OK);
        ASSERT_EQ(strncmp(info.name, "MACO_", 5), 0) << info.name;
        EXPECT_GT(strlen(info.doc), 10u) << info.name;
        found = found || strcmp(info.name, "MACO_DEVICE_TIMEOUT") == 0;
    }
    EXPECT_TRUE(found);
    maco_test::AllowLog("maco_config_describe: index");
    EXPECT_EQ(maco_config_describe(n, &info), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_config_describe(-1, &info), MACO_ERR_INVALID_ARGUMENT);
}

/* README's configuration table must list exactly the variables of the config table. */
TEST_F(Unit, ReadmeDocumentsEveryVariable)
{
    std::ifstream f(MACO_SOURCE_DIR "/README.md");
    ASSERT_TRUE(f.good()) << "cannot read README.md";
    std::stringstream ss;
    ss << f.rdbuf();
    std::string readme = ss.str();
    for (int i = 0; i < maco_config_count(); i++) {
        maco_config_info_t info;
        maco_config_describe(i, &info);
        EXPECT_NE(readme.find(std::string("`") + info.name + "`"), std::string::npos)
            << info.name << " is missing from README.md's configuration table";
    }
}

TEST_F(Unit, LogLevelFiltersBySeverityAndSubsystem)
{
    setenv("MACO_LOG_LEVEL", "info", 1);
    setenv("MACO_LOG_SUBSYS", "bootstrap,mem", 1);
    maco__log_reset();
    EXPECT_TRUE(maco__log_enabled(MACO_LOG_INFO, MACO_SUBSYS_BOOTSTRAP));
    EXPECT_FALSE(maco__log_enabled(MACO_LOG_DEBUG, MACO_SUBSYS_BOOTSTRAP));
    EXPECT_FALSE(maco__log_enabled(MACO_LOG_INFO, MACO_SUBSYS_COLL));
    setenv("MACO_LOG_SUBSYS", "^bootstrap", 1);
    maco__log_reset();
    EXPECT_FALSE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_BOOTSTRAP));
    EXPECT_TRUE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_COLL));
    unsetenv("MACO_LOG_SUBSYS");
    unsetenv("MACO_LOG_LEVEL");
    maco__log_reset();
    EXPECT_TRUE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_INIT)) << "default is warn";
    EXPECT_FALSE(maco__log_enabled(MACO_LOG_INFO, MACO_SUBSYS_INIT));
}

TEST_F(Unit, LogFileExpandsPidAndKeepsErrno)
{
    char dir[] = "/tmp/maco-log-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string pattern = std::string(dir) + "/log.%p.%h";
    setenv("MACO_LOG_FILE", pattern.c_str(), 1);
    maco__log_reset();
    errno = 1234;
    maco__log(MACO_LOG_WARN, MACO_SUBSYS_TOOL, "hello %d", 42);
    EXPECT_EQ(errno, 1234);
    char host[64] = "";
    gethostname(host, sizeof(host));
    std::string path = std::string(dir) + "/log." + std::to_string(getpid()) + "." + host;
    std::ifstream f(path);
    ASSERT_TRUE(f.good()) << path;
    std::string line;
    std::getline(f, line);
    EXPECT_NE(line.find("WARN tool: hello 42"), std::string::npos) << line;
    EXPECT_EQ(line.rfind(std::string(host) + ":" + std::to_string(getpid()) + ":", 0), 0u) << line;
    maco_test::AllowLog("hello 42");
    unsetenv("MACO_LOG_FILE");
    maco__log_reset();
    unlink(path.c_str());
    rmdir(dir);
}

TEST_F(Unit, UniqueIdCarriesMagicVersionAndAddress)
{
    maco_unique_id_t a, b;
    ASSERT_EQ(maco_unique_id_create(&a), MACO_OK);
    ASSERT_EQ(maco_unique_id_create(&b), MACO_OK);
    EXPECT_EQ(memcmp(a.bytes, "MACO", 4), 0);
    EXPECT_EQ(a.bytes[4], 1);
    EXPECT_NE(memcmp(a.bytes + 8, b.bytes + 8, 8), 0) << "nonces must differ";
    maco__sockaddr_t addr;
    ASSERT_EQ(maco__sockaddr_from_wire(a.bytes + 16, &addr), 0);
    EXPECT_NE(maco__sockaddr_port(&addr), 0);
    /* Use both ids so their listening sockets are released. */
    for (maco_unique_id_t *id : { &a, &b }) {
        maco_bootstrap_t bs;
        ASSERT_EQ(maco_bootstrap_create(id, 0, 1, 5000, &bs), MACO_OK);
        maco_bootstrap_destroy(bs);
    }
}

TEST_F(Unit, BootstrapRejectsBadArguments)
{
    maco_unique_id_t id;
    memset(&id, 0, sizeof(id));
    maco_bootstrap_t bs = nullptr;
    maco_test::AllowLog("maco_bootstrap_create");
    maco_test::AllowLog("magic");
    EXPECT_EQ(maco_bootstrap_create(&id, 0, 1, 1000, &bs), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_bootstrap_create(&id, 2, 2, 1000, &bs), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_bootstrap_create(&id, 0, 0, 1000, &bs), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(bs, nullptr);
}

/* Runs `fn(rank)` on `n` threads, each with its own bootstrap over one unique id. */
template <class F> void RunThreads(int n, F fn)
{
    maco_unique_id_t id;
    ASSERT_EQ(maco_unique_id_create(&id), MACO_OK);
    std::vector<std::thread> threads;
    std::vector<maco_status_t> results(static_cast<size_t>(n), MACO_ERR_INTERNAL);
    for (int r = 0; r < n; r++) {
        threads.emplace_back([&, r] {
            maco_bootstrap_t bs;
            maco_status_t st = maco_bootstrap_create(&id, r, n, 20000, &bs);
            if (st == MACO_OK) {
                st = fn(bs, r);
                maco_bootstrap_destroy(bs);
            }
            results[static_cast<size_t>(r)] = st;
        });
    }
    for (auto &t : threads)
        t.join();
    for (int r = 0; r < n; r++)
        EXPECT_EQ(results[static_cast<size_t>(r)], MACO_OK) << "rank " << r;
}

TEST_F(Unit, ThreadsShareAJobThroughAUniqueId)
{
    const int n = 5;
    RunThreads(n, [n](maco_bootstrap_t bs, int r) -> maco_status_t {
        std::vector<uint32_t> all(static_cast<size_t>(n) * 3);
        for (int k = 0; k < 3; k++)
            all[static_cast<size_t>(r) * 3 + static_cast<size_t>(k)] =
                static_cast<uint32_t>(r * 100 + k);
        maco_status_t st = maco_bootstrap_allgather(bs, all.data(), 3 * sizeof(uint32_t));
        if (st != MACO_OK)
            return st;
        for (int q = 0; q < n; q++)
            for (int k = 0; k < 3; k++)
                if (all[static_cast<size_t>(q) * 3 + static_cast<size_t>(k)] !=
                    static_cast<uint32_t>(q * 100 + k))
                    return MACO_ERR_INTERNAL;
        return maco_bootstrap_barrier(bs);
    });
}

TEST_F(Unit, StrayClientIsRefusedAndTheJobGoesOn)
{
    maco_unique_id_t id;
    ASSERT_EQ(maco_unique_id_create(&id), MACO_OK);
    maco__sockaddr_t root;
    ASSERT_EQ(maco__sockaddr_from_wire(id.bytes + 16, &root), 0);
    maco_test::AllowLog("refused a connection");
    std::atomic<int> done{ 0 };
    std::vector<maco_status_t> results(2, MACO_ERR_INTERNAL);
    std::thread rank0([&] {
        maco_bootstrap_t bs;
        maco_status_t st = maco_bootstrap_create(&id, 0, 2, 20000, &bs);
        if (st == MACO_OK) {
            int v = 41;
            st = maco_bootstrap_broadcast(bs, 0, &v, sizeof(v));
            maco_bootstrap_destroy(bs);
        }
        results[0] = st;
        done++;
    });
    /* A stray client sends garbage to rank 0 before the real rank 1 joins. */
    int fd = socket(root.ss.ss_family, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    int connected = -1;
    for (int i = 0; i < 200 && connected != 0; i++) {
        connected = connect(fd, reinterpret_cast<sockaddr *>(&root.ss), root.len);
        if (connected != 0)
            usleep(10000);
    }
    ASSERT_EQ(connected, 0);
    const char junk[] = "GET / HTTP/1.0\r\n\r\n-------------------------------------------";
    ASSERT_GT(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), 0);
    std::thread rank1([&] {
        maco_bootstrap_t bs;
        maco_status_t st = maco_bootstrap_create(&id, 1, 2, 20000, &bs);
        if (st == MACO_OK) {
            int v = 0;
            st = maco_bootstrap_broadcast(bs, 0, &v, sizeof(v));
            if (st == MACO_OK && v != 41)
                st = MACO_ERR_INTERNAL;
            maco_bootstrap_destroy(bs);
        }
        results[1] = st;
        done++;
    });
    rank0.join();
    rank1.join();
    close(fd);
    EXPECT_EQ(results[0], MACO_OK);
    EXPECT_EQ(results[1], MACO_OK);
    bool refused = false;
    for (const std::string &l : maco_test::LoggedProblems())
        refused = refused || l.find("refused a connection") != std::string::npos;
    EXPECT_TRUE(refused) << "the stray connection should be logged";
}

TEST_F(Unit, UnreachableRootTimesOutWithTheConfiguredDeadline)
{
    /* A port nobody listens on: bind one, then close it. */
    maco__sockaddr_t addr;
    memset(&addr, 0, sizeof(addr));
    sockaddr_in *in = reinterpret_cast<sockaddr_in *>(&addr.ss);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.len = sizeof(*in);
    int fd;
    ASSERT_EQ(maco__socket_listen(&addr, &fd), MACO_OK);
    close(fd);
    maco_unique_id_t id;
    ASSERT_EQ(maco_unique_id_create(&id), MACO_OK);
    maco__sockaddr_to_wire(&addr, id.bytes + 16);
    maco_test::AllowLog("could not connect to rank 0");
    maco_bootstrap_t bs = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(maco_bootstrap_create(&id, 1, 2, 1500, &bs), MACO_ERR_TIMEOUT);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(s, 1.4);
    EXPECT_LT(s, 5.0);
    EXPECT_EQ(bs, nullptr);
    EXPECT_NE(std::string(maco__last_error()).find("MACO_BOOTSTRAP_TIMEOUT"), std::string::npos);
}

/* Ranks of one node need not be contiguous: ranks 0, 2, 5 on host A, 1, 3 on B, 4 on C. */
TEST_F(Unit, TopologyOfInterleavedNodes)
{
    const char *ids[] = { "A", "B", "A", "B", "C", "A" };
    const int want_local[] = { 0, 0, 1, 1, 0, 2 };
    const int want_nlocal[] = { 3, 2, 3, 2, 1, 3 };
    const int want_node[] = { 0, 1, 0, 1, 2, 0 };
    for (int r = 0; r < 6; r++) {
        maco__topology_t t;
        maco__topology_compute(ids, 6, r, &t);
        EXPECT_EQ(t.local_rank, want_local[r]) << "rank " << r;
        EXPECT_EQ(t.local_nranks, want_nlocal[r]) << "rank " << r;
        EXPECT_EQ(t.node, want_node[r]) << "rank " << r;
        EXPECT_EQ(t.nnodes, 3) << "rank " << r;
    }
}

/* A descriptor published here is fetched by another process (over the abstract Unix socket
 * with SCM_RIGHTS) and reads the same memory; after withdrawal it cannot be fetched. */
TEST_F(Unit, FdServerHandsDescriptorsToOtherProcesses)
{
    int fd = memfd_create("maco-test", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    const char text[] = "hello through SCM_RIGHTS";
    ASSERT_EQ(write(fd, text, sizeof(text)), static_cast<ssize_t>(sizeof(text)));
    maco__fd_ref_t ref;
    ASSERT_EQ(maco__fd_publish(fd, &ref), MACO_OK);
    close(fd); /* the server keeps its own duplicate */
    pid_t pid = fork();
    if (pid == 0) {
        int got = -1;
        if (maco__fd_fetch(&ref, 0, 5000, &got) != MACO_OK)
            _exit(10);
        char buf[sizeof(text)] = "";
        if (pread(got, buf, sizeof(buf), 0) != static_cast<ssize_t>(sizeof(buf)))
            _exit(11);
        _exit(memcmp(buf, text, sizeof(text)) == 0 ? 0 : 12);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    /* A wrong token is refused; a withdrawn descriptor is gone. */
    maco_test::AllowLog("no longer exports");
    maco_test::AllowLog("memory-handle server");
    maco__fd_ref_t bad = ref;
    bad.token ^= 1;
    int got = -1;
    EXPECT_EQ(maco__fd_fetch(&bad, 3, 5000, &got), MACO_ERR_REMOTE);
    maco__fd_withdraw(&ref);
    EXPECT_EQ(maco__fd_fetch(&ref, 3, 5000, &got), MACO_ERR_REMOTE);
    EXPECT_EQ(got, -1);
}

/* maco-run: prefixes, first failure wins, others killed, timeout 124. */
static int RunShell(const std::string &cmd, std::string *out)
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

TEST_F(Unit, MacoRunPrefixesOutputAndSetsTheEnvironment)
{
    std::string out;
    int rc = RunShell(std::string(MACO_RUN_PATH) +
                          " -n 3 -- sh -c 'echo $MACO_RANK/$MACO_WORLD_SIZE/$MACO_LOCAL_RANK "
                          "$MACO_BOOTSTRAP_ADDR' 2>&1",
                      &out);
    EXPECT_EQ(rc, 0) << out;
    for (int r = 0; r < 3; r++) {
        std::string want = "[" + std::to_string(r) + "] " + std::to_string(r) + "/3/" +
                           std::to_string(r) + " 127.0.0.1:";
        EXPECT_NE(out.find(want), std::string::npos) << out;
    }
}

TEST_F(Unit, MacoRunExitsWithTheFirstFailureAndStopsTheRest)
{
    std::string out;
    auto t0 = std::chrono::steady_clock::now();
    int rc = RunShell(std::string(MACO_RUN_PATH) +
                          " -n 4 sh -c 'if [ $MACO_RANK = 2 ]; then exit 9; fi; sleep 60' 2>&1",
                      &out);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, 9) << out;
    EXPECT_LT(s, 20.0) << "the sleeping ranks must be killed";
    EXPECT_NE(out.find("rank 2 exited with status 9"), std::string::npos) << out;
}

TEST_F(Unit, MacoRunTimeoutKillsEveryRank)
{
    std::string out;
    int rc = RunShell(std::string(MACO_RUN_PATH) + " -n 2 --timeout 1 sleep 60 2>&1", &out);
    EXPECT_EQ(rc, 124) << out;
    rc = RunShell(std::string(MACO_RUN_PATH) + " -n 0 true 2>&1", &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("-n '0' is invalid"), std::string::npos) << out;
}

/* SIGTERM to maco-run reaches every rank (each traps it and says so), and maco-run exits
 * 128 + 15. */
TEST_F(Unit, MacoRunForwardsSigterm)
{
    std::string cmd = std::string(MACO_RUN_PATH) +
                      " -n 2 sh -c 'trap \"echo got-term; exit 3\" TERM; echo ready; "
                      "while :; do sleep 0.05; done' 2>&1 & pid=$!; "
                      "sleep 1; kill -TERM $pid; wait $pid; echo \"rc=$?\"";
    std::string out;
    RunShell(cmd, &out);
    EXPECT_NE(out.find("[0] got-term"), std::string::npos) << out;
    EXPECT_NE(out.find("[1] got-term"), std::string::npos) << out;
    EXPECT_NE(out.find("rc=143"), std::string::npos) << out;
}

TEST_F(Unit, MacoRunSimulatedNodesGetDistinctHostIds)
{
    std::string out;
    int rc = RunShell(std::string(MACO_RUN_PATH) +
                          " -n 4 --simulate-nodes 2 sh -c 'echo \"$MACO_HOST_ID "
                          "$MACO_LOCAL_RANK\"' 2>&1",
                      &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("simulated-node-0 0"), std::string::npos) << out;
    EXPECT_NE(out.find("simulated-node-0 1"), std::string::npos) << out;
    EXPECT_NE(out.find("simulated-node-1 0"), std::string::npos) << out;
    EXPECT_NE(out.find("simulated-node-1 1"), std::string::npos) << out;
}

} // namespace

/* Threads of one process racing for the first process token all get the same one (ranks
 * driving several GPUs from one process rely on it to recognise each other); a forked
 * child starts without a token, so the race is real each time. */
TEST(ProcessToken, ThreadsOfOneProcessAgreeAndAForkedChildDiffers)
{
    uint64_t parent = maco__process_token();
    for (int round = 0; round < 20; round++) {
        int fds[2];
        ASSERT_EQ(pipe(fds), 0);
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            std::atomic<int> go{ 0 };
            uint64_t got[8];
            std::vector<std::thread> threads;
            for (int t = 0; t < 8; t++)
                threads.emplace_back([&, t] {
                    while (go.load() == 0) {
                    }
                    got[t] = maco__process_token();
                });
            go.store(1);
            for (auto &th : threads)
                th.join();
            int ok = 1;
            for (int t = 1; t < 8; t++)
                ok &= got[t] == got[0];
            ok &= got[0] != parent;
            ssize_t w = write(fds[1], &ok, sizeof(ok));
            _exit(w == (ssize_t)sizeof(ok) ? 0 : 1);
        }
        close(fds[1]);
        int ok = 0;
        ASSERT_EQ(read(fds[0], &ok, sizeof(ok)), (ssize_t)sizeof(ok));
        close(fds[0]);
        int status = 0;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT_EQ(ok, 1) << "round " << round << ": threads saw different tokens";
    }
}
