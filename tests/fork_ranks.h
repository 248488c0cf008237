/*
 * fork_ranks.h - runs a job's ranks as forked processes of the test itself, each with its own
 * environment, and collects their exit codes. For bootstrap tests that need per-rank
 * environments maco-run does not give (other variables, faults, wrong ranks).
 */
#ifndef MACO_FORK_RANKS_H
#define MACO_FORK_RANKS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace maco_test
{

/** A TCP port that was free a moment ago on the loopback of `family` (0 when none). */
inline int FreePort(int family = AF_INET)
{
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    socklen_t len;
    if (family == AF_INET6) {
        auto *a = reinterpret_cast<sockaddr_in6 *>(&ss);
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        len = sizeof(*a);
    } else {
        auto *a = reinterpret_cast<sockaddr_in *>(&ss);
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof(*a);
    }
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr *>(&ss), len) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) == 0)
        port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port
                                        : reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
    close(fd);
    return port;
}

/** Unsets the variables of launchers other than MACO's (Slurm, Open MPI, PMIx, MPICH) and
 * MACO_LAUNCHER, so that a test's ranks describe their job alone even when the test itself
 * runs inside a launcher's job. */
inline void ClearLauncherEnv()
{
    static const char *const prefixes[] = { "SLURM_", "OMPI_", "PMIX_", "PMI_" };
    std::vector<std::string> names;
    for (char **e = environ; *e != nullptr; e++) {
        std::string entry(*e);
        std::string name = entry.substr(0, entry.find('='));
        for (const char *p : prefixes)
            if (name.rfind(p, 0) == 0)
                names.push_back(name);
    }
    names.push_back("MACO_LAUNCHER");
    for (const std::string &n : names)
        unsetenv(n.c_str());
}

/**
 * Forks one process per entry of `ranks` (rank, world size). In each child `env(rank, world)`
 * sets its environment after ClearLauncherEnv() (the default sets MACO_RANK, MACO_WORLD_SIZE and
 * MACO_BOOTSTRAP_ADDR to `addr`), MACO_BOOTSTRAP_NONCE is a random nonce of this call's job (as
 * maco-run's), MACO_BOOTSTRAP_TIMEOUT is 20 s and a 60 s alarm guards against hangs; then the child
 * exits with body(rank). Returns the exit codes (128 + signal when killed).
 */
template <class Env, class Body>
std::vector<int> ForkRanksWithEnv(const std::vector<std::pair<int, int>> &ranks, Env env, Body body)
{
    std::vector<pid_t> pids;
    /* A fresh random job nonce, as maco-run gives its ranks (an env() may unset it). */
    char nonce[17];
    snprintf(nonce, sizeof(nonce), "%016llx",
             static_cast<unsigned long long>(std::random_device{}()) << 32 |
                 std::random_device{}());
    for (const auto &rw : ranks) {
        pid_t pid = fork();
        if (pid == 0) {
            ClearLauncherEnv();
            setenv("MACO_BOOTSTRAP_TIMEOUT", "20s", 1);
            setenv("MACO_BOOTSTRAP_NONCE", nonce, 1);
            env(rw.first, rw.second);
            alarm(60);
            _exit(body(rw.first));
        }
        pids.push_back(pid);
    }
    std::vector<int> codes;
    for (pid_t pid : pids) {
        int status = 0;
        waitpid(pid, &status, 0);
        codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    return codes;
}

template <class Body>
std::vector<int> ForkRanks(const std::vector<std::pair<int, int>> &ranks, Body body)
{
    std::string addr = "127.0.0.1:" + std::to_string(FreePort());
    return ForkRanksWithEnv(
        ranks,
        [&](int rank, int world) {
            setenv("MACO_RANK", std::to_string(rank).c_str(), 1);
            setenv("MACO_WORLD_SIZE", std::to_string(world).c_str(), 1);
            setenv("MACO_BOOTSTRAP_ADDR", addr.c_str(), 1);
        },
        body);
}

} // namespace maco_test

#endif /* MACO_FORK_RANKS_H */
