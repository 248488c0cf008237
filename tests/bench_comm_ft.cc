/*
 * bench_comm_ft.cc - what a rank's death and a revoke cost (a benchmark, not a test: it prints
 * times and asserts nothing about them).
 *
 *   usage: bench_comm_ft [--ranks N[,N...]] [--rounds R]     (default: 8,64 ranks, 5 rounds)
 *
 * death: N processes on this machine (bootstrap-only communicators, no GPU needed) loop on a
 *   host barrier; rank N/2 notes the time (CLOCK_MONOTONIC, in memory shared with its peers)
 *   and kills itself (SIGKILL). Each survivor's barrier fails; it calls maco_comm_shrink
 *   (MACO_SHRINK_ABORT, nobody named) and runs a barrier on the new communicator; the time
 *   from the death to that barrier's return is the survivor's. A round's figure is the slowest
 *   survivor's; the table gives the median and the range over the rounds.
 * revoke: 2 processes; rank 0 waits in a bootstrap receive nobody answers; rank 1 notes the
 *   time and calls maco_comm_revoke; rank 0's figure is from that moment to its receive's
 *   return. Then the same with the revoke from a second thread of rank 0 (the watchdog).
 */
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fork_ranks.h"
#include "maco/maco.h"

namespace
{

int64_t NowNs()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

/* Memory the forked ranks share: the event's time and each rank's figure. */
struct Shared {
    std::atomic<int64_t> event_ns;
    int64_t figure_ns[256];
};

Shared *MapShared()
{
    void *p =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return new (p) Shared();
}

std::vector<std::pair<int, int>> World(int n)
{
    std::vector<std::pair<int, int>> w;
    for (int r = 0; r < n; r++)
        w.emplace_back(r, n);
    return w;
}

double Median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One death round of n ranks: the slowest survivor's time in ms, or -1 when a rank failed. */
double DeathRound(int n, Shared *sh)
{
    const int victim = n / 2;
    sh->event_ns = 0;
    for (int r = 0; r < n; r++)
        sh->figure_ns[r] = -1;
    std::vector<int> codes = maco_test::ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return 10;
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        (void)maco_bootstrap_barrier(bs); /* everyone has its communicator */
        if (rank == victim) {
            usleep(50000);
            sh->event_ns = NowNs();
            raise(SIGKILL);
        }
        while (maco_bootstrap_barrier(bs) == MACO_OK) {
        }
        maco_comm_t next = nullptr;
        if (maco_comm_shrink(comm, nullptr, 0, MACO_SHRINK_ABORT, &next) != MACO_OK)
            return 11;
        maco_bootstrap_t nbs;
        maco_comm_get_bootstrap(next, &nbs);
        if (maco_bootstrap_barrier(nbs) != MACO_OK)
            return 12;
        sh->figure_ns[rank] = NowNs() - sh->event_ns;
        maco_comm_destroy(next);
        maco_comm_destroy(comm);
        return 0;
    });
    int64_t worst = 0;
    for (int r = 0; r < n; r++) {
        if (r == victim)
            continue;
        if (codes[static_cast<size_t>(r)] != 0 || sh->figure_ns[r] < 0) {
            fprintf(stderr, "death round of %d ranks: rank %d ended with %d\n", n, r,
                    codes[static_cast<size_t>(r)]);
            return -1;
        }
        worst = std::max(worst, sh->figure_ns[r]);
    }
    return static_cast<double>(worst) / 1e6;
}

/* One revoke round: rank 0's wait from the revoke to its return, in ms (-1 on failure). */
double RevokeRound(bool from_peer, Shared *sh)
{
    sh->event_ns = 0;
    sh->figure_ns[0] = -1;
    std::vector<int> codes = maco_test::ForkRanks(World(2), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return 10;
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        (void)maco_bootstrap_barrier(bs);
        std::thread watchdog;
        bool revoker = from_peer ? rank == 1 : rank == 0;
        auto revoke = [&] {
            usleep(100000);
            sh->event_ns = NowNs();
            maco_comm_revoke(comm);
        };
        if (revoker && from_peer)
            revoke();
        else if (revoker)
            watchdog = std::thread(revoke);
        int x = 0;
        if (rank == 0 || !from_peer) {
            maco_status_t st = maco_bootstrap_recv(bs, 1 - rank, 7, &x, sizeof(x));
            if (rank == 0)
                sh->figure_ns[0] = st == MACO_ERR_REVOKED ? NowNs() - sh->event_ns : -1;
        }
        if (watchdog.joinable())
            watchdog.join();
        maco_comm_destroy(comm);
        return 0;
    });
    if (codes[0] != 0 || codes[1] != 0 || sh->figure_ns[0] < 0)
        return -1;
    return static_cast<double>(sh->figure_ns[0]) / 1e6;
}

void Report(const char *what, const std::vector<double> &ms)
{
    if (ms.empty())
        return;
    printf("%-44s %9.1f %9.1f %9.1f  %zu\n", what, Median(ms),
           *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()),
           ms.size());
    fflush(stdout);
}

} // namespace

int main(int argc, char **argv)
{
    std::vector<int> sizes = { 8, 64 };
    int rounds = 5;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--ranks" && i + 1 < argc) {
            sizes.clear();
            for (char *tok = strtok(argv[++i], ","); tok != nullptr; tok = strtok(nullptr, ","))
                sizes.push_back(atoi(tok));
        } else if (a == "--rounds" && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--ranks N[,N...]] [--rounds R]\n", argv[0]);
            return 2;
        }
    }
    for (int n : sizes)
        if (n < 3 || n > 256) {
            fprintf(stderr, "--ranks: %d is outside [3, 256]\n", n);
            return 2;
        }
    Shared *sh = MapShared();
    printf("%-44s %9s %9s %9s  %s\n", "what (ms)", "median", "min", "max", "rounds");
    for (int n : sizes) {
        std::vector<double> ms;
        for (int r = 0; r < rounds; r++) {
            double t = DeathRound(n, sh);
            if (t >= 0)
                ms.push_back(t);
        }
        std::string what = "death -> shrunk communicator, " + std::to_string(n) + " ranks";
        Report(what.c_str(), ms);
    }
    for (bool from_peer : { true, false }) {
        std::vector<double> ms;
        for (int r = 0; r < rounds * 4; r++) {
            double t = RevokeRound(from_peer, sh);
            if (t >= 0)
                ms.push_back(t);
        }
        Report(from_peer ? "revoke -> a peer's blocked call returns"
                         : "revoke (watchdog thread) -> call returns",
               ms);
    }
    return 0;
}
