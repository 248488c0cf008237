/*
 * test_bootstrap_env.cc - the ways a job can be described: torchrun's variables, an IPv6
 * rank-0 address, an interface chosen by MACO_SOCKET_IFNAME. Ranks are forked processes.
 */
#include <ifaddrs.h>
#include <net/if.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <initializer_list>
#include <tuple>
#include <utility>
#include <vector>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "fork_ranks.h"
#include "src/host/base/log.h"
#include "maco/bootstrap.h"
#include "maco/config.h"
#include "maco/log.h"
#include "maco_test.h"
#include "src/host/os/socket.h"

namespace
{

using maco_test::ForkRanksWithEnv;
using maco_test::FreePort;

/* Each rank allgathers its rank and checks everyone's; exit 0 when all is right. */
int AllgatherRanks(int rank)
{
    maco_bootstrap_t bs;
    if (maco_bootstrap_create_from_env(&bs) != MACO_OK)
        return 10;
    int me = -1, n = 0;
    maco_bootstrap_get_rank(bs, &me);
    maco_bootstrap_get_nranks(bs, &n);
    std::vector<int> all(static_cast<size_t>(n), -1);
    all[static_cast<size_t>(me)] = me * 10;
    int rc = maco_bootstrap_allgather(bs, all.data(), sizeof(int)) == MACO_OK ? 0 : 11;
    for (int r = 0; r < n && rc == 0; r++)
        if (all[static_cast<size_t>(r)] != r * 10)
            rc = 12;
    if (me != rank)
        rc = 13;
    maco_bootstrap_destroy(bs);
    return rc;
}

class BootstrapEnv : public maco_test::Test
{
};

/* torchrun's variables from a launcher without torchrun's agent store, which passes the job's
 * nonce (ForkRanksWithEnv sets a random MACO_BOOTSTRAP_NONCE, as maco-run does). */
TEST_F(BootstrapEnv, TorchrunVariables)
{
    int port = FreePort();
    std::vector<std::pair<int, int>> ranks = { { 0, 3 }, { 1, 3 }, { 2, 3 } };
    std::vector<int> codes = ForkRanksWithEnv(
        ranks,
        [port](int rank, int world) {
            for (const char *v : { "MACO_RANK", "MACO_WORLD_SIZE", "MACO_BOOTSTRAP_ADDR" })
                unsetenv(v);
            setenv("RANK", std::to_string(rank).c_str(), 1);
            setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
            setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
            setenv("MASTER_ADDR", "localhost", 1);
            setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        },
        AllgatherRanks);
    for (size_t i = 0; i < codes.size(); i++)
        EXPECT_EQ(codes[i], 0) << "rank " << i;
}

/* Sets torchrun's variables for one rank of a job whose agent store is at 127.0.0.1:port. */
void SetTorchrunAgentEnv(int rank, int world, int port)
{
    for (const char *v :
         { "MACO_RANK", "MACO_WORLD_SIZE", "MACO_BOOTSTRAP_ADDR", "MACO_BOOTSTRAP_NONCE" })
        unsetenv(v);
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    setenv("TORCHELASTIC_RUN_ID", "test-run", 1);
    setenv("MACO_BOOTSTRAP_TIMEOUT", "1s", 1);
}

/* Exit code 0 when the creation fails with `want` and a message holding `text`. */
int FailsWith(maco_status_t want, const std::string &text)
{
    maco_bootstrap_t bs = nullptr;
    maco_status_t st = maco_bootstrap_create_from_env(&bs);
    std::string msg = maco__last_error();
    if (st == MACO_OK)
        return 20;
    if (st != want)
        return 21;
    return msg.find(text) != std::string::npos ? 0 : 22;
}

TEST_F(BootstrapEnv, TorchrunAgentStoreUnreachableNamesTheStore)
{
    /* Under torchrun the id comes from the agent's store on MASTER_PORT; nobody listens. */
    int port = FreePort();
    std::string want = "could not connect to torchrun's store at 127.0.0.1:" + std::to_string(port);
    std::vector<int> codes = ForkRanksWithEnv(
        { { 1, 2 } }, [port](int rank, int world) { SetTorchrunAgentEnv(rank, world, port); },
        [&](int) { return FailsWith(MACO_ERR_TIMEOUT, want); });
    EXPECT_EQ(codes[0], 0);
}

TEST_F(BootstrapEnv, TorchrunAgentStoreWithoutTheKeyTimesOutNamingIt)
{
    /* A store that takes the connection and never answers: rank 0 never published the id. */
    maco__sockaddr_t a;
    ASSERT_EQ(maco__sockaddr_parse("127.0.0.1:1", "test", &a), MACO_OK);
    maco__sockaddr_set_port(&a, 0);
    int lfd = -1;
    ASSERT_EQ(maco__socket_listen(&a, &lfd), MACO_OK);
    int port = maco__sockaddr_port(&a);
    std::vector<int> codes = ForkRanksWithEnv(
        { { 1, 2 } }, [port](int rank, int world) { SetTorchrunAgentEnv(rank, world, port); },
        [](int) {
            return FailsWith(MACO_ERR_TIMEOUT, "rank 0 did not publish its unique id under key "
                                               "'/maco/c_unique_id/test-run/0/0'");
        });
    close(lfd);
    EXPECT_EQ(codes[0], 0);
}

/* Run by tests/python/test_multiprocess.py under a real torchrun (its agent's TCPStore): every
 * rank makes two bootstraps from the environment and allgathers through each. */
TEST_F(BootstrapEnv, UnderTorchrun)
{
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (agent == nullptr || getenv("RANK") == nullptr)
        GTEST_SKIP() << "not started by torchrun (tests/python/test_multiprocess.py does)";
    int rank = atoi(getenv("RANK"));
    EXPECT_EQ(AllgatherRanks(rank), 0) << "first bootstrap";
    EXPECT_EQ(AllgatherRanks(rank), 0) << "second bootstrap";
}

TEST_F(BootstrapEnv, Ipv6RootAddress)
{
    int port = FreePort(AF_INET6);
    if (port == 0)
        GTEST_SKIP() << "no IPv6 loopback (::1) on this machine";
    std::string addr = "[::1]:" + std::to_string(port);
    std::vector<int> codes = ForkRanksWithEnv(
        { { 0, 2 }, { 1, 2 } },
        [&](int rank, int world) {
            setenv("MACO_RANK", std::to_string(rank).c_str(), 1);
            setenv("MACO_WORLD_SIZE", std::to_string(world).c_str(), 1);
            setenv("MACO_BOOTSTRAP_ADDR", addr.c_str(), 1);
        },
        AllgatherRanks);
    for (size_t i = 0; i < codes.size(); i++)
        EXPECT_EQ(codes[i], 0) << "rank " << i;
}

TEST_F(BootstrapEnv, MalformedAddressesNameTheVariable)
{
    const char *bad[] = { "nohost", "host:", "host:99999", "[::1:5", "no-such-host.invalid:80" };
    maco_test::AllowLog("MACO_BOOTSTRAP_ADDR");
    for (const char *text : bad) {
        maco__sockaddr_t a;
        EXPECT_EQ(maco__sockaddr_parse(text, "MACO_BOOTSTRAP_ADDR", &a), MACO_ERR_INVALID_ARGUMENT)
            << text;
        EXPECT_NE(std::string(maco__last_error()).find("MACO_BOOTSTRAP_ADDR"), std::string::npos);
    }
    maco__sockaddr_t a;
    ASSERT_EQ(maco__sockaddr_parse("127.0.0.1:1234", "x", &a), MACO_OK);
    EXPECT_EQ(maco__sockaddr_port(&a), 1234);
}

/* Sets `vars` (name, value; value nullptr unsets) for the scope, restoring them after. */
class ScopedVars
{
  public:
    ScopedVars(std::initializer_list<std::pair<const char *, const char *>> vars)
    {
        for (const auto &v : vars) {
            const char *old = getenv(v.first);
            saved_.emplace_back(v.first, old != nullptr, old != nullptr ? old : "");
            if (v.second != nullptr)
                setenv(v.first, v.second, 1);
            else
                unsetenv(v.first);
        }
    }
    ~ScopedVars()
    {
        for (auto &s : saved_) {
            if (std::get<1>(s))
                setenv(std::get<0>(s).c_str(), std::get<2>(s).c_str(), 1);
            else
                unsetenv(std::get<0>(s).c_str());
        }
    }

  private:
    std::vector<std::tuple<std::string, bool, std::string>> saved_;
};

/* Whether a one-rank job starts from the environment as it is: MACO_OK, or the status and
 * message of the refusal in *why. */
maco_status_t StartAlone(std::string *why)
{
    maco_bootstrap_t bs = nullptr;
    maco_status_t st = maco_bootstrap_create_from_env(&bs);
    *why = st == MACO_OK ? "" : maco__last_error();
    if (st == MACO_OK)
        maco_bootstrap_destroy(bs);
    return st;
}

/* The checker (maco-info --env, maco_config_validate) and the reader (initialisation from
 * the environment) give one verdict on every value of MACO_BOOTSTRAP_NONCE and
 * MACO_BOOTSTRAP_ADDR: the same validation. (Regression: "zz", "abc", "127.0.0.1:99999" and
 * 20 more passed the checker and were refused at init.) */
TEST_F(BootstrapEnv, CheckerAndReaderAgreeOnNonceAndAddress)
{
    maco_test::AllowLog("MACO_BOOTSTRAP");
    const std::string port = std::to_string(FreePort());
    struct Case {
        const char *var;
        std::string value;
        bool valid;
    };
    const std::vector<Case> cases = {
        { "MACO_BOOTSTRAP_NONCE", "0", true },
        { "MACO_BOOTSTRAP_NONCE", "ffffffffFFFFFFFF", true },
        { "MACO_BOOTSTRAP_NONCE", "zz", false },
        { "MACO_BOOTSTRAP_NONCE", "-1", false },
        { "MACO_BOOTSTRAP_NONCE", "0x12", false },
        { "MACO_BOOTSTRAP_NONCE", "12345678901234567", false },
        { "MACO_BOOTSTRAP_NONCE", " 12", false },
        { "MACO_BOOTSTRAP_NONCE", "12\nWARN forged", false },
        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:" + port, true },
        { "MACO_BOOTSTRAP_ADDR", "localhost:" + port, true },
        { "MACO_BOOTSTRAP_ADDR", "abc", false },
        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:99999", false },
        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:0", false },
        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:", false },
        { "MACO_BOOTSTRAP_ADDR", ":80", false },
        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:80x", false },
        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:-1", false },
        { "MACO_BOOTSTRAP_ADDR", "[::1", false },
        { "MACO_BOOTSTRAP_ADDR", "[::1]80", false },
        { "MACO_BOOTSTRAP_ADDR", "no-such-host.invalid:80", false },
        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:80\nWARN forged", false },
    };
    for (const Case &c : cases) {
        ScopedVars env{ { "MACO_RANK", "0" },
                        { "MACO_WORLD_SIZE", "1" },
                        { "MACO_BOOTSTRAP_NONCE", "1234" },
                        { "MACO_BOOTSTRAP_ADDR", ("127.0.0.1:" + port).c_str() },
                        { c.var, c.value.c_str() } };
        int index = maco_config_lookup(c.var, nullptr);
        ASSERT_GE(index, 0);
        char why[512] = "";
        maco_status_t checked = maco_config_validate(index, why, sizeof(why));
        std::string read_why;
        maco_status_t read = StartAlone(&read_why);
        EXPECT_EQ(checked == MACO_OK, c.valid) << c.var << "='" << c.value << "': " << why;
        EXPECT_EQ(read == MACO_OK, c.valid) << c.var << "='" << c.value << "': " << read_why;
        if (!c.valid) {
            EXPECT_EQ(read, MACO_ERR_INVALID_ARGUMENT) << read_why;
            EXPECT_NE(read_why.find(c.var), std::string::npos) << read_why;
        }
    }
}

/* A world size past MACO_MAX_RANKS is a range error naming the limit, from the environment and
 * from the API, not "no host memory" after trying to allocate for 2^30 ranks. */
TEST_F(BootstrapEnv, WorldSizePastTheLimitIsARangeError)
{
    maco_test::AllowLog("ranks");
    maco_test::AllowLog("MACO_WORLD_SIZE");
    const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
    ScopedVars env{ { "MACO_RANK", "0" },
                    { "MACO_WORLD_SIZE", "1073741824" },
                    { "MACO_BOOTSTRAP_NONCE", "1234" },
                    { "MACO_BOOTSTRAP_ADDR", addr.c_str() } };
    char why[512] = "";
    EXPECT_EQ(
        maco_config_validate(maco_config_lookup("MACO_WORLD_SIZE", nullptr), why, sizeof(why)),
        MACO_ERR_INVALID_ARGUMENT);
    std::string read_why;
    EXPECT_EQ(StartAlone(&read_why), MACO_ERR_INVALID_ARGUMENT) << read_why;
    EXPECT_NE(read_why.find("MACO_WORLD_SIZE"), std::string::npos) << read_why;
    EXPECT_NE(read_why.find("1048576"), std::string::npos) << read_why;
    maco_unique_id_t id;
    ASSERT_EQ(maco_unique_id_create(&id), MACO_OK);
    maco_bootstrap_t bs = nullptr;
    EXPECT_EQ(maco_bootstrap_create(&id, 0, 1 << 30, 1000, &bs), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(maco__last_error()).find("1048576"), std::string::npos)
        << maco__last_error();
    EXPECT_EQ(bs, nullptr);
}

/* A rank at or past the world size names both variables, as they were spelled, at once. */
TEST_F(BootstrapEnv, RankOutsideTheWorldNamesTheVariables)
{
    maco_test::AllowLog("world size");
    {
        ScopedVars env{ { "MACO_RANK", "2" },
                        { "MACO_WORLD_SIZE", "2" },
                        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:1" } };
        maco_bootstrap_t bs = nullptr;
        EXPECT_EQ(maco_bootstrap_create_from_env(&bs), MACO_ERR_INVALID_ARGUMENT);
        std::string msg = maco_log_last_error();
        EXPECT_NE(msg.find("MACO_RANK=2"), std::string::npos) << msg;
        EXPECT_NE(msg.find("MACO_WORLD_SIZE=2"), std::string::npos) << msg;
    }
    {
        ScopedVars env{ { "MACO_RANK", nullptr },
                        { "MACO_WORLD_SIZE", nullptr },
                        { "RANK", "5" },
                        { "WORLD_SIZE", "4" },
                        { "MACO_BOOTSTRAP_ADDR", "127.0.0.1:1" } };
        maco_bootstrap_t bs = nullptr;
        EXPECT_EQ(maco_bootstrap_create_from_env(&bs), MACO_ERR_INVALID_ARGUMENT);
        std::string msg = maco_log_last_error();
        EXPECT_NE(msg.find("RANK=5"), std::string::npos) << msg;
        EXPECT_NE(msg.find("WORLD_SIZE=4"), std::string::npos) << msg;
        EXPECT_EQ(msg.find("MACO_RANK"), std::string::npos) << msg;
    }
}

/* MACO_HOST_ID past 127 bytes is refused (cut, two hosts could become one node); 127 is fine. */
TEST_F(BootstrapEnv, OverlongHostIdIsRefused)
{
    maco_test::AllowLog("MACO_HOST_ID");
    maco_unique_id_t id;
    memset(&id, 0, sizeof(id)); /* the host id is checked first */
    std::string longest(127, 'h'), too_long(128, 'h');
    {
        ScopedVars env{ { "MACO_HOST_ID", too_long.c_str() } };
        maco_bootstrap_t bs = nullptr;
        EXPECT_EQ(maco_bootstrap_create(&id, 0, 1, 2000, &bs), MACO_ERR_INVALID_ARGUMENT);
        std::string msg = maco_log_last_error();
        EXPECT_NE(msg.find("MACO_HOST_ID is 128 bytes"), std::string::npos) << msg;
        EXPECT_NE(msg.find("at most 127"), std::string::npos) << msg;
    }
    {
        ScopedVars env{ { "MACO_HOST_ID", longest.c_str() } };
        EXPECT_EQ(maco__host_id_check(), MACO_OK) << maco_log_last_error();
    }
}

/* The name of an interface that is up with an IPv4 address, and that address. */
bool FindIpv4Interface(std::string *name, std::string *addr)
{
    ifaddrs *ifs = nullptr;
    if (getifaddrs(&ifs) != 0)
        return false;
    bool found = false;
    for (ifaddrs *it = ifs; it != nullptr && !found; it = it->ifa_next) {
        if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET ||
            !(it->ifa_flags & IFF_UP))
            continue;
        char text[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in *>(it->ifa_addr)->sin_addr, text,
                  sizeof(text));
        *name = it->ifa_name;
        *addr = text;
        found = true;
    }
    freeifaddrs(ifs);
    return found;
}

TEST_F(BootstrapEnv, SocketIfnameChoosesTheInterfaceByNameOrPrefix)
{
    std::string name, want;
    if (!FindIpv4Interface(&name, &want))
        GTEST_SKIP() << "no interface with an IPv4 address is up";
    for (std::string pattern : { name, name.substr(0, 2) }) {
        setenv("MACO_SOCKET_IFNAME", pattern.c_str(), 1);
        maco__sockaddr_t a;
        ASSERT_EQ(maco__socket_default_address(&a), MACO_OK) << pattern;
        char text[96];
        maco__sockaddr_format(&a, text, sizeof(text));
        /* A prefix may match an earlier interface; the full name must give this one. */
        if (pattern == name) {
            EXPECT_EQ(std::string(text).rfind(want + ":", 0), 0u) << text;
        }
    }
    setenv("MACO_SOCKET_IFNAME", "no-such-interface0", 1);
    maco_test::AllowLog("MACO_SOCKET_IFNAME='no-such-interface0' matches no interface");
    maco__sockaddr_t a;
    EXPECT_EQ(maco__socket_default_address(&a), MACO_ERR_INVALID_ARGUMENT);
    /* NCCL_SOCKET_IFNAME's syntax: a list, exact names, exclusions. */
    for (std::string pattern :
         { "no-such0," + name, "=" + name, "=no-such0," + name, std::string("^no-such0,lo") }) {
        setenv("MACO_SOCKET_IFNAME", pattern.c_str(), 1);
        ASSERT_EQ(maco__socket_default_address(&a), MACO_OK) << pattern;
        char text[96];
        maco__sockaddr_format(&a, text, sizeof(text));
        if (pattern != "^no-such0,lo") {
            EXPECT_EQ(std::string(text).rfind(want + ":", 0), 0u) << pattern << " " << text;
        }
    }
    setenv("MACO_SOCKET_IFNAME", ("=" + name.substr(0, name.size() - 1) + "X").c_str(), 1);
    maco_test::AllowLog("matches no interface");
    EXPECT_EQ(maco__socket_default_address(&a), MACO_ERR_INVALID_ARGUMENT);
    unsetenv("MACO_SOCKET_IFNAME");
}

TEST_F(BootstrapEnv, IfnameMatchSpeaksNcclSyntax)
{
    struct Case {
        const char *spec, *name;
        int want;
    } cases[] = {
        { "eth", "eth0", 1 },        { "eth", "ib0", 0 },       { "=eth", "eth0", 0 },
        { "=eth0", "eth0", 1 },      { "=eth0", "eth01", 0 },   { "ib,eth", "eth1", 1 },
        { "ib,eth", "lo", 0 },       { "^docker,lo", "lo", 0 }, { "^docker,lo", "docker0", 0 },
        { "^docker,lo", "eth0", 1 }, { "^=eth0", "eth01", 1 },  { "^=eth0", "eth0", 0 },
        { ",eth,", "eth2", 1 },      { "^", "eth0", 1 },
    };
    for (const Case &c : cases)
        EXPECT_EQ(maco__ifname_match(c.spec, c.name), c.want) << c.spec << " " << c.name;
}

} // namespace
