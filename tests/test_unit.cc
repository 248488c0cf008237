/* test_unit.cc - one-process tests of the CPU core: status, config, log, bootstrap. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
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

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/base/config.h"
#include "src/host/base/sha256.h"
#include "src/host/os/fd_server.h"
#include "src/host/base/log.h"
#include "maco/bootstrap.h"
#include "maco/config.h"
#include "maco_test.h"
#include "signal_storm.h"
#include "src/host/os/socket.h"
#include "tools/perf_nccl_log.h"

namespace
{

class Unit : public maco_test::Test
{
  protected:
    void TearDown() override
    {
        for (const char *v :
             { "MACO_LOG_LEVEL", "MACO_LOG_SUBSYS", "MACO_LOG_FILE", "MACO_BOOTSTRAP_TIMEOUT",
               "MACO_SCRATCH_SIZE", "MACO_SCRATCH_SIZ", "MACO_HOST_ID", "MACO_DEVICE_TIMEOUT",
               "MACO_SHARED_GPU", "MACO_PROXY_FIFO_SIZE", "MACO_BOOTSTRAP_ADDR" })
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

/* Values beyond int64 (or, for durations, beyond what converts to nanoseconds) are
 * rejected, never wrapped: "9223372036854775807us" used to come out negative. */
TEST_F(Unit, ParsersRejectOverflowInsteadOfWrapping)
{
    int64_t v = 77;
    for (const char *bad : { "1e99", "99999999999999999999", "-99999999999999999999" }) {
        EXPECT_EQ(maco__parse_int(bad, &v), -1) << bad;
        EXPECT_EQ(maco__parse_size(bad, &v), -1) << bad;
        EXPECT_EQ(maco__parse_duration_ms(bad, &v), -1) << bad;
    }
    EXPECT_EQ(v, 77) << "a failed parse must not write the output";
    /* Representable but longer than the cap: saturated ("practically never"), not wrapped. */
    for (const char *huge :
         { "9223372036854775807us", "9223372036854775000us", "9223372036854775807",
           "9223372036854775ms", "9223372036855s", "153722867281m", "9223372036855" }) {
        v = 0;
        EXPECT_EQ(maco__parse_duration_ms(huge, &v), 0) << huge;
        EXPECT_EQ(v, MACO__DURATION_MAX_MS) << huge;
    }
    ASSERT_EQ(maco__parse_duration_ms("9223372036854", &v), 0);
    EXPECT_EQ(v, MACO__DURATION_MAX_MS);
    ASSERT_EQ(maco__parse_duration_ms("9223372036854000us", &v), 0);
    EXPECT_EQ(v, MACO__DURATION_MAX_MS);
    ASSERT_EQ(maco__parse_duration_ms("1001us", &v), 0);
    EXPECT_EQ(v, 2);
    ASSERT_EQ(maco__parse_int("9223372036854775807", &v), 0);
    EXPECT_EQ(v, INT64_MAX);
}

/* What maco-info --env marks: each value checked with the parser the library uses. */
TEST_F(Unit, ConfigValidateMarksInvalidValuesWithWhatTheyAccept)
{
    struct Case {
        maco__config_id_t id;
        const char *value;
        const char *why; /* nullptr: valid */
    } cases[] = {
        { MACO_CFG_SCRATCH_SIZE, "64Q", "K, M, G or T suffix" },
        { MACO_CFG_SCRATCH_SIZE, "99999999999999999999", "K, M, G or T suffix" },
        { MACO_CFG_SCRATCH_SIZE, "64M", nullptr },
        { MACO_CFG_BOOTSTRAP_TIMEOUT, "1e99", "us, ms, s or m" },
        { MACO_CFG_DEVICE_TIMEOUT, "9223372036854775807us", nullptr }, /* saturates */
        { MACO_CFG_DEVICE_TIMEOUT, "0", nullptr },
        { MACO_CFG_SHARED_GPU, "maybe", "true/false" },
        { MACO_CFG_SHARED_GPU, "on", nullptr },
        { MACO_CFG_PROXY_FIFO_SIZE, "12x", "decimal integer" },
        { MACO_CFG_LOG_LEVEL, "loud", "error, warn, info, debug or trace" },
        { MACO_CFG_LOG_LEVEL, "DEBUG", nullptr },
        { MACO_CFG_LOG_SUBSYS, "bootstrp,mem", "unknown subsystem 'bootstrp'" },
        { MACO_CFG_LOG_SUBSYS, "^ proxy , coll", nullptr },
        { MACO_CFG_BOOTSTRAP_ADDR, "anything", "host:port or [ipv6]:port" },
        { MACO_CFG_BOOTSTRAP_ADDR, "127.0.0.1:29500", nullptr },
        { MACO_CFG_BOOTSTRAP_NONCE, "zz", "1 to 16 hex digits" },
    };
    for (const Case &c : cases) {
        const char *name = maco__config_name(c.id);
        setenv(name, c.value, 1);
        char why[512] = "untouched";
        maco_status_t st = maco__config_validate(c.id, why, sizeof(why));
        maco_status_t pub = maco_config_validate(static_cast<int>(c.id), nullptr, 0);
        EXPECT_EQ(pub, st) << name << "=" << c.value;
        if (c.why == nullptr) {
            EXPECT_EQ(st, MACO_OK) << name << "=" << c.value << ": " << why;
        } else {
            EXPECT_EQ(st, MACO_ERR_INVALID_ARGUMENT) << name << "=" << c.value;
            EXPECT_NE(std::string(why).find("accepts: "), std::string::npos) << why;
            EXPECT_NE(std::string(why).find(c.why), std::string::npos) << why;
        }
        unsetenv(name);
    }
    /* Unset variables take their defaults, and every default is valid. */
    for (int i = 0; i < MACO_CFG_COUNT; i++) {
        char why[256] = "";
        EXPECT_EQ(maco_config_validate(i, why, sizeof(why)), MACO_OK)
            << maco__config_name(static_cast<maco__config_id_t>(i)) << ": " << why;
        maco_config_info_t info;
        ASSERT_EQ(maco_config_describe(i, &info), MACO_OK);
        int64_t v;
        if (strcmp(info.type, "string") != 0 && info.default_value[0] != '\0') {
            EXPECT_EQ(maco__config_int64(static_cast<maco__config_id_t>(i), &v), MACO_OK)
                << info.name;
        }
    }
    maco_test::AllowLog("maco_config_validate: index");
    EXPECT_EQ(maco_config_validate(MACO_CFG_COUNT, nullptr, 0), MACO_ERR_INVALID_ARGUMENT);
    /* A misspelled name finds the closest one, as communicator init's warning does. */
    int closest = -1;
    EXPECT_EQ(maco_config_lookup("MACO_SCRATCH_SIZ", &closest), -1);
    EXPECT_EQ(closest, static_cast<int>(MACO_CFG_SCRATCH_SIZE));
    EXPECT_EQ(maco_config_lookup("MACO_DEVICE_TIMEOUT", &closest),
              static_cast<int>(MACO_CFG_DEVICE_TIMEOUT));
    EXPECT_EQ(maco_config_lookup(nullptr, nullptr), -1);
}

/* One rule per variable: what maco-info --env flags (maco__config_validate) is what the
 * library refuses when it reads the value (maco__config_int64 / maco__config_word), and both
 * say what is accepted. (Regression: out-of-range and unknown values passed the checker.) */
TEST_F(Unit, ConfigCheckerAndReadersAgree)
{
    struct Case {
        maco__config_id_t id;
        std::string value;
        const char *accepts; /* nullptr: valid */
    } cases[] = {
        { MACO_CFG_P2P_LANES, "-1", "from 1 to 32" },
        { MACO_CFG_P2P_LANES, "0", "from 1 to 32" },
        { MACO_CFG_P2P_LANES, "32", nullptr },
        { MACO_CFG_P2P_LANES, "33", "from 1 to 32" },
        { MACO_CFG_TCP_NSOCKS, "0", "from 1 to 8" },
        { MACO_CFG_TCP_NSOCKS, "8", nullptr },
        { MACO_CFG_PROXY_FIFO_SIZE, "1000", "a power of two from 2 to 65536" },
        { MACO_CFG_PROXY_FIFO_SIZE, "131072", "a power of two from 2 to 65536" },
        { MACO_CFG_PROXY_FIFO_SIZE, "1024", nullptr },
        { MACO_CFG_P2P_CHUNK_SIZE, "8K", "from 16K to 4M, or 0 (automatic)" },
        { MACO_CFG_P2P_CHUNK_SIZE, "0", nullptr },
        { MACO_CFG_P2P_CHUNK_SIZE, "4M", nullptr },
        { MACO_CFG_P2P_CHUNK_SIZE, "5M", "from 16K to 4M, or 0 (automatic)" },
        { MACO_CFG_SCRATCH_SIZE, "17G", "from 1M to 16G" },
        { MACO_CFG_IB_TIMEOUT, "32", "from 1 to 31" },
        { MACO_CFG_IB_RETRY_CNT, "8", "from 0 to 7" },
        { MACO_CFG_IB_GID_INDEX, "-2", "from -1 to" },
        { MACO_CFG_HIER_CTAS, "65", "from 1 to 64" },
        { MACO_CFG_COLL_MAX_CTAS, "-1", "from 0 to" },
        { MACO_CFG_RANK, "-1", "from 0 to" },
        { MACO_CFG_ALGO_ALLREDUCE, "abc", "oneshot_ll, twoshot_ll, rsag, hier or plan:FILE" },
        { MACO_CFG_ALGO_ALLREDUCE, "RSAG", nullptr },
        { MACO_CFG_ALGO_ALLREDUCE, "plan:/tmp/x.json", nullptr },
        { MACO_CFG_ALGO_ALLREDUCE, "plan:", "plan:FILE" },
        { MACO_CFG_ALGO_BROADCAST, "plan:/tmp/x.json", "ll, mesh or hier" },
        { MACO_CFG_ALGO_SENDRECV, "mesh", "ll or copy" },
        { MACO_CFG_GEMM_TILE, "abc", "auto, gmma or cublasdx" },
        { MACO_CFG_GEMM_TILE, "GMMA", nullptr },
        { MACO_CFG_TRANSPORT, "rdma", "auto, cuda, host, ib or tcp" },
        { MACO_CFG_NCCL_FALLBACK, "abc", "auto or never" },
        { MACO_CFG_HOST_ID, std::string(128, 'h'), "at most 127 bytes" },
        { MACO_CFG_HOST_ID, std::string(127, 'h'), nullptr },
    };
    maco_test::AllowLog("is invalid: it accepts");
    for (const Case &c : cases) {
        const char *name = maco__config_name(c.id);
        std::string what = std::string(name) + "=" + c.value.substr(0, 20);
        setenv(name, c.value.c_str(), 1);
        char why[512] = "";
        maco_status_t checked = maco__config_validate(c.id, why, sizeof(why));
        maco_config_info_t info;
        ASSERT_EQ(maco_config_describe(static_cast<int>(c.id), &info), MACO_OK);
        maco_status_t read;
        if (strcmp(info.type, "string") == 0) {
            const char *v = nullptr;
            read = maco__config_word(c.id, &v);
        } else {
            int64_t v = 0;
            read = maco__config_int64(c.id, &v);
        }
        std::string msg = maco__last_error();
        EXPECT_EQ(read, checked) << what << ": checker says " << why << "; reader " << msg;
        if (c.accepts == nullptr) {
            EXPECT_EQ(checked, MACO_OK) << what << ": " << why;
        } else {
            EXPECT_EQ(checked, MACO_ERR_INVALID_ARGUMENT) << what;
            EXPECT_NE(std::string(why).find(c.accepts), std::string::npos) << what << ": " << why;
            EXPECT_NE(msg.find(name), std::string::npos) << msg;
            EXPECT_NE(msg.find(c.accepts), std::string::npos) << msg;
        }
        unsetenv(name);
    }
}

/* Every string variable unset or set empty reads as its default, as the checker takes it.
 * (Regression: an empty or unset MACO_ALGO_ALLREDUCE failed every communicator's creation, its
 * default "" not being among the words a user may set; found by the GPU suite, 2026-11-27.) */
TEST_F(Unit, ConfigWordUnsetOrEmptyIsTheDefault)
{
    int words = 0;
    for (int id = 0; id < static_cast<int>(MACO_CFG_COUNT); id++) {
        maco_config_info_t info;
        ASSERT_EQ(maco_config_describe(id, &info), MACO_OK);
        if (strcmp(info.type, "string") != 0)
            continue;
        const char *name = maco__config_name(static_cast<maco__config_id_t>(id));
        const char *saved = getenv(name);
        std::string keep = saved != nullptr ? saved : "";
        for (int empty = 0; empty < 2; empty++) {
            if (empty)
                setenv(name, "", 1);
            else
                unsetenv(name);
            const char *v = nullptr;
            EXPECT_EQ(maco__config_word(static_cast<maco__config_id_t>(id), &v), MACO_OK)
                << name << (empty ? " set empty: " : " unset: ") << maco__last_error();
            ASSERT_NE(v, nullptr) << name;
            EXPECT_STREQ(v, info.default_value) << name;
        }
        if (saved != nullptr)
            setenv(name, keep.c_str(), 1);
        else
            unsetenv(name);
        words++;
    }
    EXPECT_GE(words, 8); /* the ALGO_* words, GEMM_TILE, TRANSPORT, ... */
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

/* docs/configuration.md's table must list every variable of the config table, each in a row of
 * its own (a table row that starts with the name). */
TEST_F(Unit, ConfigurationGuideDocumentsEveryVariable)
{
    std::ifstream f(MACO_SOURCE_DIR "/docs/configuration.md");
    ASSERT_TRUE(f.good()) << "cannot read docs/configuration.md";
    std::stringstream ss;
    ss << f.rdbuf();
    std::string doc = ss.str();
    for (int i = 0; i < maco_config_count(); i++) {
        maco_config_info_t info;
        maco_config_describe(i, &info);
        EXPECT_NE(doc.find(std::string("| `") + info.name + "` |"), std::string::npos)
            << info.name << " is missing from docs/configuration.md's table";
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

/* Lines logged at warn or error that contain `needle`. */
static std::vector<std::string> ProblemsWith(const std::string &needle)
{
    std::vector<std::string> out;
    for (const std::string &line : maco_test::LoggedProblems())
        if (line.find(needle) != std::string::npos)
            out.push_back(line);
    return out;
}

/* "bootstrp" used to select no subsystem at all, so nothing was logged, errors included. */
TEST_F(Unit, LogSubsysUnknownNameWarnsAndTheOthersStillApply)
{
    maco_test::AllowLog("MACO_LOG_SUBSYS=");
    setenv("MACO_LOG_SUBSYS", "bootstrp, mem", 1);
    maco__log_reset();
    std::vector<std::string> warned = ProblemsWith("MACO_LOG_SUBSYS=");
    ASSERT_EQ(warned.size(), 1u);
    EXPECT_NE(warned[0].find(" WARN "), std::string::npos) << warned[0];
    EXPECT_NE(warned[0].find("unknown subsystem 'bootstrp'"), std::string::npos) << warned[0];
    EXPECT_NE(warned[0].find("init, bootstrap, mem, channel, coll, proxy, tool, persist or all"),
              std::string::npos)
        << warned[0];
    EXPECT_NE(warned[0].find("^"), std::string::npos) << warned[0];
    EXPECT_TRUE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_MEM)) << "mem still applies";
    EXPECT_FALSE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_BOOTSTRAP));

    /* Nothing known is left: every subsystem shows, as when the variable is unset. */
    setenv("MACO_LOG_SUBSYS", "bootstrp", 1);
    maco__log_reset();
    EXPECT_EQ(ProblemsWith("MACO_LOG_SUBSYS='bootstrp'").size(), 1u);
    EXPECT_TRUE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_BOOTSTRAP));
    EXPECT_TRUE(maco__log_enabled(MACO_LOG_ERROR, MACO_SUBSYS_BOOTSTRAP));
    setenv("MACO_LOG_SUBSYS", "^bootstrp,proxy", 1);
    maco__log_reset();
    EXPECT_EQ(ProblemsWith("MACO_LOG_SUBSYS='^bootstrp,proxy'").size(), 1u);
    EXPECT_FALSE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_PROXY));
    EXPECT_TRUE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_COLL));
}

TEST_F(Unit, ErrorsPassTheSubsystemFilter)
{
    maco_test::AllowLog("boom in bootstrap");
    for (const char *filter : { "mem", "^bootstrap" }) {
        setenv("MACO_LOG_SUBSYS", filter, 1);
        maco__log_reset();
        EXPECT_FALSE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_BOOTSTRAP)) << filter;
        EXPECT_TRUE(maco__log_enabled(MACO_LOG_ERROR, MACO_SUBSYS_BOOTSTRAP)) << filter;
        maco__error(MACO_ERR_INTERNAL, MACO_SUBSYS_BOOTSTRAP, "boom in bootstrap (%s)", filter);
        EXPECT_EQ(ProblemsWith(std::string("boom in bootstrap (") + filter).size(), 1u) << filter;
    }
}

/* An invalid level used to be reported past the handler, without the line's tid field. */
TEST_F(Unit, LogLevelInvalidWarnsNamingTheAcceptedLevels)
{
    maco_test::AllowLog("MACO_LOG_LEVEL='loud'");
    setenv("MACO_LOG_LEVEL", "loud", 1);
    maco__log_reset();
    std::vector<std::string> warned = ProblemsWith("MACO_LOG_LEVEL='loud' is invalid");
    ASSERT_EQ(warned.size(), 1u);
    EXPECT_NE(warned[0].find("error, warn, info, debug or trace"), std::string::npos) << warned[0];
    EXPECT_NE(warned[0].find(":" + std::to_string(getpid()) + ":"), std::string::npos)
        << "the usual host:pid:tid prefix: " << warned[0];
    EXPECT_TRUE(maco__log_enabled(MACO_LOG_WARN, MACO_SUBSYS_INIT)) << "falls back to warn";
    EXPECT_FALSE(maco__log_enabled(MACO_LOG_INFO, MACO_SUBSYS_INIT));
}

/* A log file that cannot be opened used to send the log to stderr without a word. */
TEST_F(Unit, LogFileThatCannotBeOpenedWarnsOnStderr)
{
    char captured[] = "/tmp/maco-stderr-XXXXXX";
    int cap_fd = mkstemp(captured);
    ASSERT_GE(cap_fd, 0);
    maco_test::AllowLog("MACO_LOG_FILE=");
    maco_test::AllowLog("after the bad file");
    setenv("MACO_LOG_FILE", "/nonexistent-maco-dir/log.%p", 1);
    fflush(stderr);
    int saved = dup(2);
    ASSERT_GE(saved, 0);
    dup2(cap_fd, 2);
    maco__log_reset();
    maco__log(MACO_LOG_WARN, MACO_SUBSYS_TOOL, "after the bad file");
    dup2(saved, 2);
    close(saved);
    std::string path = "/nonexistent-maco-dir/log." + std::to_string(getpid());
    std::vector<std::string> warned = ProblemsWith("MACO_LOG_FILE=");
    ASSERT_EQ(warned.size(), 1u);
    EXPECT_NE(warned[0].find("'/nonexistent-maco-dir/log.%p'"), std::string::npos) << warned[0];
    EXPECT_NE(warned[0].find("cannot open " + path + ": " + strerror(ENOENT)), std::string::npos)
        << warned[0];
    std::string err;
    char buf[4096];
    ssize_t n;
    while ((n = pread(cap_fd, buf, sizeof(buf), static_cast<off_t>(err.size()))) > 0)
        err.append(buf, static_cast<size_t>(n));
    close(cap_fd);
    unlink(captured);
    EXPECT_NE(err.find("cannot open " + path), std::string::npos) << "stderr: " << err;
    EXPECT_NE(err.find("WARN tool: after the bad file"), std::string::npos) << "stderr: " << err;
}

/* Outside any call a thread's lines show the process's rank; a scope overrides it until it
 * ends. */
TEST_F(Unit, LogRankScopeOverridesTheProcessRankUntilItEnds)
{
    maco_test::AllowLog("scope-test");
    maco__log_set_rank(7);
    std::thread t([] {
        maco__log(MACO_LOG_WARN, MACO_SUBSYS_TOOL, "scope-test before");
        {
            MACO__LOG_RANK_SCOPE(3);
            maco__log(MACO_LOG_WARN, MACO_SUBSYS_TOOL, "scope-test inside");
        }
        maco__log(MACO_LOG_WARN, MACO_SUBSYS_TOOL, "scope-test after");
    });
    t.join();
    maco__log_set_rank(-1);
    maco__log_swap_thread_rank(MACO__LOG_RANK_UNSET); /* this thread follows the process again */
    for (const char *what : { "before", "inside", "after" }) {
        std::vector<std::string> lines = ProblemsWith(std::string("scope-test ") + what);
        ASSERT_EQ(lines.size(), 1u) << what;
        const char *want = strcmp(what, "inside") == 0 ? " [3] " : " [7] ";
        EXPECT_NE(lines[0].find(want), std::string::npos) << lines[0];
    }
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

/* Issue 38: a binding that raises its own exception for an error holds MACO's ERROR line back
 * from the log (maco_log_set_error_capture), still sees it through the handler and
 * maco_log_last_error, and only its own thread is affected. */
TEST_F(Unit, ErrorCaptureHoldsErrorLinesOfThisThreadOnly)
{
    char dir[] = "/tmp/maco-log-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string path = std::string(dir) + "/log";
    setenv("MACO_LOG_FILE", path.c_str(), 1);
    maco__log_reset();
    EXPECT_EQ(maco_log_set_error_capture(1), 0);
    maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_TOOL, "held back %d", 1);
    EXPECT_STREQ(maco_log_last_error(), "held back 1");
    maco__log(MACO_LOG_WARN, MACO_SUBSYS_TOOL, "warning while capturing");
    std::thread other(
        [] { maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_TOOL, "another thread's"); });
    other.join();
    EXPECT_EQ(maco_log_set_error_capture(0), 1);
    maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_TOOL, "written again");
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_EQ(text.str().find("held back 1"), std::string::npos) << text.str();
    EXPECT_NE(text.str().find("WARN tool: warning while capturing"), std::string::npos)
        << text.str();
    EXPECT_NE(text.str().find("ERROR tool: another thread's"), std::string::npos) << text.str();
    EXPECT_NE(text.str().find("ERROR tool: written again"), std::string::npos) << text.str();
    /* The test fixture's handler saw every line, the held one included. */
    EXPECT_EQ(ProblemsWith("held back 1").size(), 1u);
    for (const char *seen :
         { "held back 1", "warning while capturing", "another thread's", "written again" })
        maco_test::AllowLog(seen);
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

TEST_F(Unit, UniqueIdDecodeWritesNothingOnFailure)
{
    maco__sockaddr_t root;
    memset(&root, 0, sizeof(root));
    struct sockaddr_in *in = reinterpret_cast<struct sockaddr_in *>(&root.ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(29500);
    ASSERT_EQ(inet_pton(AF_INET, "127.0.0.1", &in->sin_addr), 1);
    root.len = sizeof(*in);
    maco_unique_id_t id;
    maco__unique_id_encode(&id, 0x1122334455667788ull, &root);
    uint64_t nonce = 0;
    maco__sockaddr_t got;
    ASSERT_EQ(maco__unique_id_decode(&id, &nonce, &got), MACO_OK);
    EXPECT_EQ(nonce, 0x1122334455667788ull);
    EXPECT_EQ(maco__sockaddr_port(&got), 29500);
    /* A valid magic and version but no address family: the decoder used to write the nonce
     * (and clear the address) before it found the address invalid (tests/fuzz). */
    id.bytes[16] = 5;
    maco__sockaddr_t canary;
    memset(&canary, 0xA5, sizeof(canary));
    got = canary;
    nonce = 7;
    maco_test::AllowLog("no valid root address");
    EXPECT_EQ(maco__unique_id_decode(&id, &nonce, &got), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(nonce, 7u);
    EXPECT_EQ(memcmp(&got, &canary, sizeof(got)), 0);
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

/* Two bootstraps in one process, one per thread: every line of a call carries that call's
 * rank. With one process-wide rank, both threads' lines carried the last bootstrap's. */
TEST_F(Unit, LogLinesCarryTheRankOfTheCallThatLogs)
{
    maco_test::AllowLog("maco_bootstrap_broadcast: root");
    RunThreads(2, [](maco_bootstrap_t bs, int r) -> maco_status_t {
        maco_status_t st = maco_bootstrap_barrier(bs); /* both setups are done */
        if (st != MACO_OK)
            return st;
        int v = 0;
        if (maco_bootstrap_broadcast(bs, 100 + r, &v, sizeof(v)) != MACO_ERR_INVALID_ARGUMENT)
            return MACO_ERR_INTERNAL;
        return maco_bootstrap_barrier(bs);
    });
    for (int r = 0; r < 2; r++) {
        std::vector<std::string> lines = ProblemsWith("root " + std::to_string(100 + r) + " is");
        ASSERT_EQ(lines.size(), 1u) << "rank " << r;
        EXPECT_NE(lines[0].find(" [" + std::to_string(r) + "] ERROR "), std::string::npos)
            << lines[0];
    }
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

/* A signal storm (a handler installed, with and without SA_RESTART, signals arriving at every
 * thread many times a second as from a profiler or a timer) costs the descriptor hand-over
 * nothing: every fetch succeeds. Interrupted receives used to fail the fetch ("no valid answer
 * ... Interrupted system call"), and with SO_RCVTIMEO even under SA_RESTART. Runs in a child
 * so the handlers stay out of this process. */
TEST_F(Unit, FdServerFetchesSurviveASignalStorm)
{
    int fd = memfd_create("maco-test-storm", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 4096), 0);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(120);
        maco__fd_ref_t ref;
        if (maco__fd_publish(fd, &ref) != MACO_OK)
            _exit(100);
        int failed = 0;
        for (int restart = 0; restart < 2; restart++) {
            maco_test::SignalStorm storm(restart ? SIGUSR2 : SIGUSR1, restart != 0);
            for (int i = 0; i < 1500; i++) {
                int got = -1;
                if (maco__fd_fetch(&ref, 1, 30000, &got) != MACO_OK) {
                    if (failed++ == 0)
                        fprintf(stderr, "fetch %d (SA_RESTART %d): %s\n", i, restart,
                                maco__last_error());
                } else {
                    close(got);
                }
            }
        }
        fprintf(stderr, "%ld signals delivered, %d fetches failed\n",
                maco_test::SignalStorm::Delivered(), failed);
        maco__fd_withdraw(&ref);
        _exit(failed > 0 ? 1 : maco_test::SignalStorm::Delivered() > 0 ? 0 : 2);
    }
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

/* Lower-case hex of bytes. */
std::string Hex(const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (size_t i = 0; i < n; i++) {
        out += digits[p[i] >> 4];
        out += digits[p[i] & 15];
    }
    return out;
}

std::string Sha256Hex(const std::string &m)
{
    uint8_t d[MACO__SHA256_BYTES];
    maco__sha256(m.data(), m.size(), d);
    return Hex(d, sizeof(d));
}

std::string HmacHex(const std::string &key, const std::string &m)
{
    uint8_t d[MACO__SHA256_BYTES];
    maco__bytes_t part = { m.data(), m.size() };
    maco__hmac_sha256(key.data(), key.size(), &part, 1, d);
    return Hex(d, sizeof(d));
}

/* SHA-256 against the examples of FIPS 180-4 (NIST's "SHA-256" example file): one block,
 * two blocks, the empty message, 896 bits, and a million 'a' fed in uneven pieces. */
TEST_F(Unit, Sha256MatchesTheFips180Examples)
{
    EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(Sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnop"
                        "jklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
              "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    maco__sha256_t s;
    maco__sha256_init(&s);
    std::string a(1000000, 'a');
    for (size_t at = 0, step = 1; at < a.size(); at += step, step = step % 97 + 1)
        maco__sha256_update(&s, a.data() + at, std::min(step, a.size() - at));
    uint8_t d[MACO__SHA256_BYTES];
    maco__sha256_final(&s, d);
    EXPECT_EQ(Hex(d, sizeof(d)),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* HMAC-SHA256 against RFC 4231's test cases 1-7 (case 5 compares its 128-bit truncation;
 * cases 6 and 7 have a key longer than a block, which is hashed first). */
TEST_F(Unit, HmacSha256MatchesRfc4231)
{
    EXPECT_EQ(HmacHex(std::string(20, '\x0b'), "Hi There"),
              "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    EXPECT_EQ(HmacHex("Jefe", "what do ya want for nothing?"),
              "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    EXPECT_EQ(HmacHex(std::string(20, '\xaa'), std::string(50, '\xdd')),
              "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    std::string key4;
    for (int i = 1; i <= 25; i++)
        key4 += static_cast<char>(i);
    EXPECT_EQ(HmacHex(key4, std::string(50, '\xcd')),
              "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    EXPECT_EQ(HmacHex(std::string(20, '\x0c'), "Test With Truncation").substr(0, 32),
              "a3b6167473100ee06e0c796c2955552b");
    EXPECT_EQ(
        HmacHex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    EXPECT_EQ(HmacHex(std::string(131, '\xaa'),
                      "This is a test using a larger than block-size key and a larger than "
                      "block-size data. The key needs to be hashed before being used by the HMAC "
                      "algorithm."),
              "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
    /* A message given in pieces is the pieces one after another. */
    uint8_t whole[MACO__SHA256_BYTES], pieces[MACO__SHA256_BYTES];
    maco__bytes_t one = { "what do ya want for nothing?", 28 };
    maco__hmac_sha256("Jefe", 4, &one, 1, whole);
    maco__bytes_t three[3] = { { "what do", 7 }, { nullptr, 0 }, { " ya want for nothing?", 21 } };
    maco__hmac_sha256("Jefe", 4, three, 3, pieces);
    EXPECT_EQ(Hex(whole, 32), Hex(pieces, 32));
    uint8_t x[4] = { 1, 2, 3, 4 }, y[4] = { 1, 2, 3, 5 };
    EXPECT_TRUE(maco__bytes_equal(x, x, 4));
    EXPECT_FALSE(maco__bytes_equal(x, y, 4));
}

/* HMAC-SHA256 agrees with OpenSSL's libcrypto (when installed) on 3000 random keys of 0-200
 * bytes and messages of 0-1100 bytes, across every block-boundary case. */
TEST_F(Unit, HmacSha256AgreesWithLibcrypto)
{
    void *lib = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
        lib = dlopen("libcrypto.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
        GTEST_SKIP() << "OpenSSL's libcrypto is not installed: " << dlerror();
    using evp_md_fn = const void *(*)();
    using hmac_fn = unsigned char *(*)(const void *, const void *, int, const unsigned char *,
                                       size_t, unsigned char *, unsigned int *);
    auto evp_sha256 = reinterpret_cast<evp_md_fn>(dlsym(lib, "EVP_sha256"));
    auto hmac = reinterpret_cast<hmac_fn>(dlsym(lib, "HMAC"));
    ASSERT_TRUE(evp_sha256 != nullptr && hmac != nullptr);
    std::mt19937_64 gen(12345);
    for (int i = 0; i < 3000; i++) {
        std::string key(gen() % 201, '\0'), msg(gen() % 1101, '\0');
        for (auto &c : key)
            c = static_cast<char>(gen());
        for (auto &c : msg)
            c = static_cast<char>(gen());
        uint8_t want[64];
        unsigned int len = 0;
        hmac(evp_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char *>(msg.data()), msg.size(), want, &len);
        ASSERT_EQ(len, 32u);
        ASSERT_EQ(HmacHex(key, msg), Hex(want, 32))
            << "key " << key.size() << " bytes, message " << msg.size() << " bytes";
    }
    dlclose(lib);
}

/* What the log echoes is escaped once, in the logger: a value holding a newline (or another
 * control character) cannot forge a log line. (Regression: MACO_BOOTSTRAP_NONCE='1\n<a forged
 * line>' was written raw into the log by the error naming it.) */
TEST_F(Unit, LogEscapesControlCharactersSoNoLineCanBeForged)
{
    static std::string captured;
    captured.clear();
    maco_log_set_handler([](maco_log_level_t, const char *line, void *) { captured += line; },
                         nullptr);
    maco_log_write(MACO_LOG_WARN, "tool", "value '%s'",
                   "1\nhost:1:1 [0] ERROR init: forged\x1b[2J");
    maco_log_set_handler(nullptr, nullptr);
    EXPECT_EQ(std::count(captured.begin(), captured.end(), '\n'), 1) << captured;
    EXPECT_EQ(captured.back(), '\n');
    EXPECT_NE(captured.find("value '1\\nhost:1:1 [0] ERROR init: forged\\x1b[2J'"),
              std::string::npos)
        << captured;
}

/* maco-run: prefixes, first failure wins, others killed, timeout 124. */
using maco_test::RunShell;

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

/* maco-perf's reading of NCCL's TUNING lines (tools/perf_nccl_log.h), on lines in the formats
 * NCCL 2.28-2.31 print, with their prefix; anything else is "?", and a short buffer is cut,
 * not overrun. */
TEST(PerfNcclLog, SymmetricAndClassicLines)
{
    char out[96];
    maco_perf_nccl_path_of("vm:812:812 [0] NCCL INFO AllReduce [Symmetric]: 4096 Bytes -> Kernel "
                           "AllReduce_AGxLL_R nchannels 16 nthreads 512 nWorks 1\n",
                           out, sizeof(out));
    EXPECT_STREQ(out, "symmetric AllReduce_AGxLL_R");
    maco_perf_nccl_path_of("vm:812:812 [0] NCCL INFO ReduceScatter: 262144 Bytes -> Algo RING "
                           "proto SIMPLE channel{Lo..Hi}={0..3}\n",
                           out, sizeof(out));
    EXPECT_STREQ(out, "RING/SIMPLE");
    maco_perf_nccl_path_of("vm:812:812 [0] NCCL INFO Channel 00/24 : 0 1\n", out, sizeof(out));
    EXPECT_STREQ(out, "?");
    /* "[Symmetric]" without a kernel name is not taken as one. */
    maco_perf_nccl_path_of("AllReduce [Symmetric]: 8 Bytes -> Algo NVLS proto SIMPLE", out,
                           sizeof(out));
    EXPECT_STREQ(out, "NVLS/SIMPLE");
    char small[8];
    memset(small, 'x', sizeof(small));
    maco_perf_nccl_path_of("AllGather [Symmetric]: 8 Bytes -> Kernel AllGather_LL", small,
                           sizeof(small));
    EXPECT_STREQ(small, "symmetr"); /* 7 characters and the terminator */
}
