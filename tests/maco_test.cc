/* maco_test.cc - the log-checking base fixture. */
#include <sys/wait.h>

#include <cstdio>
#include "maco_test.h"

#include <mutex>

namespace maco_test
{
namespace
{

std::mutex g_lock;
std::vector<std::string> g_problems;
std::vector<std::string> g_allowed;

void OnLog(maco_log_level_t level, const char *line, void *)
{
    if (level > MACO_LOG_WARN)
        return;
    std::lock_guard<std::mutex> guard(g_lock);
    g_problems.emplace_back(line);
}

} // namespace

void Test::SetUp()
{
    std::lock_guard<std::mutex> guard(g_lock);
    g_problems.clear();
    g_allowed.clear();
    maco_log_set_handler(OnLog, nullptr);
}

void Test::TearDown()
{
    std::lock_guard<std::mutex> guard(g_lock);
    for (const std::string &line : g_problems) {
        bool allowed = false;
        for (const std::string &ok : g_allowed)
            allowed = allowed || line.find(ok) != std::string::npos;
        if (!allowed)
            ADD_FAILURE() << "unexpected log line: " << line;
    }
    g_problems.clear();
    g_allowed.clear();
}

void AllowLog(const std::string &substring)
{
    std::lock_guard<std::mutex> guard(g_lock);
    g_allowed.push_back(substring);
}

std::vector<std::string> LoggedProblems()
{
    std::lock_guard<std::mutex> guard(g_lock);
    return g_problems;
}

int RunShell(const std::string &cmd, std::string *out)
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

} // namespace maco_test
