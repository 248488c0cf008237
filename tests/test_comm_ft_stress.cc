/*
 * test_comm_ft_stress.cc - randomized rounds of a job that loses ranks and goes on: each round
 * starts 4 or 8 processes (64 in some rounds), kills one or two of them with SIGKILL at a random
 * moment (in the middle of a step, or inside the shrink that follows the first death), and the
 * survivors do what a fault-tolerant application does: on an error they shrink the communicator
 * (MACO_SHRINK_ABORT), agree on the step to resume from, rebuild their port channels and go on.
 * Every step checks real data: an allgather of (original rank, step) over the bootstrap, and a
 * ring of port-channel puts (host memory, or TCP in some rounds) whose payload encodes sender and
 * step. At the end the members must be exactly the survivors, in order.
 *
 * FT_STRESS_ROUNDS (default 20) sets the rounds, FT_STRESS_SEED the first round's seed (default:
 * random) and FT_STRESS_FIRST_ROUND the first round's number (the number picks the size); every
 * round prints both, so a failure replays with FT_STRESS_ROUNDS=1 and the two it printed.
 */
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fork_ranks.h"
#include "maco/maco.h"
#include "maco_test.h"

namespace
{

using maco_test::ForkRanks;

enum { kOk = 0, kSetupFailed = 30, kWrongData = 31, kWrongMembers = 32, kGaveUp = 33 };
enum { kSteps = 12, kRingBytes = 4096 };

/* One round's plan, the same in every process (derived from the seed). */
struct Plan {
    int n = 4;
    int victims[2] = { -1, -1 };
    int kill_step[2] = { 0, 0 }; /* the step at which the kill is armed, or -1: in a shrink */
    int delay_us[2] = { 0, 0 };  /* from arming to the kill */
    bool tcp = false;
};

Plan MakePlan(uint64_t seed, int round)
{
    std::mt19937_64 rng(seed);
    Plan p;
    p.n = round % 50 == 49 ? 64 : (round % 2 == 0 ? 4 : 8);
    int nvictims = p.n > 4 && rng() % 3 == 0 ? 2 : 1;
    for (int v = 0; v < nvictims; v++) {
        int r;
        do
            r = static_cast<int>(rng() % static_cast<uint64_t>(p.n));
        while (v == 1 && r == p.victims[0]);
        p.victims[v] = r;
        /* The first victim dies during the steps; the second during the steps too, or inside
         * the shrink that the first death starts. */
        p.kill_step[v] = v == 1 && rng() % 2 == 0 ? -1 : static_cast<int>(rng() % (kSteps - 2));
        p.delay_us[v] = static_cast<int>(rng() % 20000);
    }
    p.tcp = rng() % 4 == 0;
    return p;
}

int EnvRank()
{
    return atoi(getenv("MACO_RANK"));
}

void KillAfter(int us)
{
    std::thread([us] {
        std::this_thread::sleep_for(std::chrono::microseconds(us));
        raise(SIGKILL);
    }).detach();
}

/* A ring of port channels over the communicator: this rank puts to its right neighbour. */
struct Ring {
    maco_comm_t comm = nullptr;
    void *buf = nullptr;
    maco_mem_t mine = nullptr;
    std::vector<maco_mem_t> peers;
    maco_proxy_t proxy = nullptr;
    maco_port_channel_t to_right = nullptr, to_left = nullptr;

    maco_status_t Create(maco_comm_t c, bool tcp)
    {
        comm = c;
        int me = 0, m = 0;
        maco_comm_get_rank(comm, &me);
        maco_comm_get_nranks(comm, &m);
        if (m < 2)
            return MACO_OK;
        maco_status_t st = maco_mem_alloc_host(comm, 2 * kRingBytes, &buf);
        if (st == MACO_OK)
            st = maco_mem_register(comm, buf, 2 * kRingBytes, &mine);
        if (st != MACO_OK)
            return st;
        std::vector<uint8_t> h(static_cast<size_t>(m) * MACO_MEM_HANDLE_BYTES);
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        st = maco_mem_serialize(mine, &h[static_cast<size_t>(me) * MACO_MEM_HANDLE_BYTES]);
        if (st == MACO_OK)
            st = maco_bootstrap_allgather(bs, h.data(), MACO_MEM_HANDLE_BYTES);
        peers.assign(static_cast<size_t>(m), nullptr);
        int right = (me + 1) % m, left = (me + m - 1) % m;
        for (int q : { right, left })
            if (st == MACO_OK && peers[static_cast<size_t>(q)] == nullptr)
                st = maco_mem_import(comm, &h[static_cast<size_t>(q) * MACO_MEM_HANDLE_BYTES],
                                     &peers[static_cast<size_t>(q)]);
        if (st == MACO_OK)
            st = maco_proxy_create(comm, &proxy);
        if (st == MACO_OK)
            st = maco_proxy_start(proxy);
        maco_transport_t t = tcp ? MACO_TRANSPORT_TCP : MACO_TRANSPORT_HOST_MEMORY;
        /* Even ranks connect right first, odd ranks left first: each pair meets in order. */
        for (int step = 0; step < 2 && st == MACO_OK; step++) {
            int peer = (me % 2 == 0) == (step == 0) ? right : left;
            if (m == 2 && step == 1)
                break;
            maco_port_channel_t *ch = peer == right ? &to_right : &to_left;
            st = maco_port_channel_create(proxy, peer, t, mine, peers[static_cast<size_t>(peer)],
                                          ch);
        }
        if (m == 2)
            to_left = to_right;
        return st;
    }

    /* Puts (orig rank, step) words into the right neighbour's buffer, waits for the left
     * neighbour's and checks them. kWrongData on a wrong word. */
    maco_status_t Step(int step, int left_orig, int *code)
    {
        if (to_right == nullptr)
            return MACO_OK;
        auto *words = static_cast<int32_t *>(buf);
        const int nw = kRingBytes / 4;
        for (int i = 0; i < nw; i++)
            words[nw + i] = (EnvRank() << 20) ^ (step << 12) ^ i; /* second half: the source */
        maco_status_t st = maco_port_channel_put_with_signal(to_right, 0, kRingBytes, kRingBytes);
        if (st == MACO_OK)
            st = maco_port_channel_flush(to_right);
        if (st == MACO_OK)
            st = maco_port_channel_wait(to_left, -1);
        for (int i = 0; st == MACO_OK && i < nw; i++)
            if (words[i] != ((left_orig << 20) ^ (step << 12) ^ i)) {
                *code = kWrongData;
                break;
            }
        return st;
    }

    void Destroy()
    {
        if (to_right != nullptr)
            maco_port_channel_destroy(to_right);
        if (to_left != nullptr && to_left != to_right)
            maco_port_channel_destroy(to_left);
        maco_proxy_destroy(proxy);
        for (maco_mem_t p : peers)
            maco_mem_deregister(p);
        maco_mem_deregister(mine);
        if (buf != nullptr)
            maco_mem_free(comm, buf);
        *this = Ring();
    }
};

/* Every member's original rank and step, gathered; checks that all are at `step`. */
maco_status_t Gather(maco_comm_t comm, int step, std::vector<int> *orig, int *code)
{
    int n = 0, me = 0;
    maco_comm_get_nranks(comm, &n);
    maco_comm_get_rank(comm, &me);
    maco_bootstrap_t bs;
    maco_comm_get_bootstrap(comm, &bs);
    std::vector<int32_t> all(2 * static_cast<size_t>(n));
    all[2 * static_cast<size_t>(me)] = EnvRank();
    all[2 * static_cast<size_t>(me) + 1] = step;
    maco_status_t st = maco_bootstrap_allgather(bs, all.data(), 2 * sizeof(int32_t));
    orig->resize(static_cast<size_t>(n));
    for (int r = 0; st == MACO_OK && r < n; r++) {
        (*orig)[static_cast<size_t>(r)] = all[2 * static_cast<size_t>(r)];
        if (all[2 * static_cast<size_t>(r) + 1] != step)
            *code = kWrongData;
    }
    return st;
}

bool IsVictim(const Plan &p, int rank)
{
    return rank == p.victims[0] || rank == p.victims[1];
}

/* One process of a round. */
int RunRank(const Plan &plan, int rank)
{
    maco_comm_t comm;
    if (maco_comm_init_from_env(&comm) != MACO_OK)
        return kSetupFailed;
    {
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        (void)maco_bootstrap_barrier(bs); /* every rank has its communicator */
    }
    int code = kOk, step = 0, shrinks = 0;
    bool ring_ok = false;
    Ring ring;
    std::vector<int> orig;
    auto arm = [&](int at_step) {
        for (int v = 0; v < 2; v++)
            if (plan.victims[v] == rank && plan.kill_step[v] == at_step)
                KillAfter(plan.delay_us[v]);
    };
    /* The failure path: shrink, resume from the furthest step any member reached. */
    auto recover = [&]() -> bool {
        ring.Destroy();
        ring_ok = false;
        arm(-1);
        for (int tries = 0; tries < 100; tries++) {
            maco_comm_t next = nullptr;
            maco_status_t st = maco_comm_shrink(comm, nullptr, 0, MACO_SHRINK_ABORT, &next);
            maco_comm_destroy(comm);
            comm = next;
            shrinks++;
            if (st != MACO_OK || next == nullptr)
                return false;
            int n = 0, me = 0;
            maco_comm_get_nranks(comm, &n);
            maco_comm_get_rank(comm, &me);
            maco_bootstrap_t bs;
            maco_comm_get_bootstrap(comm, &bs);
            std::vector<int32_t> steps(static_cast<size_t>(n));
            steps[static_cast<size_t>(me)] = step;
            if (maco_bootstrap_allgather(bs, steps.data(), sizeof(int32_t)) != MACO_OK)
                continue; /* another death: shrink again */
            step = *std::max_element(steps.begin(), steps.end());
            return true;
        }
        return false;
    };
    while (step < kSteps && code == kOk) {
        arm(step);
        maco_status_t st = MACO_OK;
        if (!ring_ok) {
            st = ring.Create(comm, plan.tcp);
            ring_ok = st == MACO_OK;
        }
        if (st == MACO_OK)
            st = Gather(comm, step, &orig, &code);
        if (st == MACO_OK && code == kOk) {
            int me = 0, n = 0;
            maco_comm_get_rank(comm, &me);
            maco_comm_get_nranks(comm, &n);
            st = ring.Step(step, orig[static_cast<size_t>((me + n - 1) % n)], &code);
        }
        if (code != kOk)
            break;
        if (st == MACO_OK)
            step++;
        else if (!recover())
            code = kGaveUp;
    }
    if (IsVictim(plan, rank))
        raise(SIGKILL); /* its kill never came: it must not count as a survivor */
    /* The end: members must be exactly the survivors; a victim that died late is still in,
     * so some members' gather fails or shows it: they all shrink again. */
    std::vector<int> expect;
    for (int r = 0; r < plan.n; r++)
        if (!IsVictim(plan, r))
            expect.push_back(r);
    for (int tries = 0; code == kOk && tries < 100; tries++) {
        if (Gather(comm, step, &orig, &code) == MACO_OK && orig == expect)
            break;
        if (!recover())
            code = kGaveUp;
    }
    if (code == kOk && orig != expect)
        code = kWrongMembers;
    ring.Destroy();
    maco_comm_destroy(comm);
    return code;
}

class CommFtStress : public maco_test::Test
{
};

TEST_F(CommFtStress, RandomKillsAndShrinks)
{
    const char *rounds_env = getenv("FT_STRESS_ROUNDS");
    const char *seed_env = getenv("FT_STRESS_SEED");
    const char *first_env = getenv("FT_STRESS_FIRST_ROUND");
    int rounds = rounds_env != nullptr ? atoi(rounds_env) : 20;
    int first = first_env != nullptr ? atoi(first_env) : 0;
    uint64_t seed = seed_env != nullptr ? strtoull(seed_env, nullptr, 0)
                                        : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                              std::random_device{}();
    for (int round = first; round < first + rounds && !HasFailure(); round++, seed++) {
        Plan plan = MakePlan(seed, round);
        printf("round %d: seed %#llx, %d ranks, victims %d (step %d, +%d us) and %d (step %d, "
               "+%d us), %s\n",
               round, static_cast<unsigned long long>(seed), plan.n, plan.victims[0],
               plan.kill_step[0], plan.delay_us[0], plan.victims[1], plan.kill_step[1],
               plan.delay_us[1], plan.tcp ? "tcp" : "host memory");
        fflush(stdout);
        std::vector<std::pair<int, int>> ranks;
        for (int r = 0; r < plan.n; r++)
            ranks.emplace_back(r, plan.n);
        std::vector<int> codes = ForkRanks(ranks, [&](int rank) { return RunRank(plan, rank); });
        for (int r = 0; r < plan.n; r++)
            EXPECT_EQ(codes[static_cast<size_t>(r)], IsVictim(plan, r) ? 128 + SIGKILL : kOk)
                << "round " << round << " (seed " << seed << "), rank " << r;
    }
}

} // namespace
