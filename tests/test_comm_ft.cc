/*
 * test_comm_ft.cc - communicators that survive failures, with real processes on the CPU (no
 * GPU needed: the communicators are bootstrap-only, and host-memory port channels carry data):
 * revoke ending waits here and on peers, shrink after kill -9 (one or two deaths, different
 * views of who died, a death inside the shrink itself, the coordinator's death), a slow rank
 * kept, excluded ranks, split, grow with a new process joining, and the argument checks.
 * Each case forks its ranks (fork_ranks.h); a child reports through its exit code.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fork_ranks.h"
#include "maco/maco.h"
#include "maco_test.h"

namespace
{

using Clock = std::chrono::steady_clock;
using maco_test::ForkRanks;

/* Child exit codes. */
enum {
    kOk = 0,
    kSetupFailed = 20,
    kWrongStatus = 21,
    kWrongMessage = 22,
    kWrongMembers = 23,
    kWrongData = 24,
    kShrinkFailed = 25,
    kTooSlow = 26,
    kUnexpectedOk = 27,
};

int EnvRank()
{
    return atoi(getenv("MACO_RANK"));
}

/* Allgathers every member's rank in the original job; MACO_OK or the allgather's status. */
maco_status_t OriginalRanks(maco_comm_t comm, std::vector<int> *out)
{
    int n = 0, r = 0;
    maco_comm_get_nranks(comm, &n);
    maco_comm_get_rank(comm, &r);
    maco_bootstrap_t bs;
    maco_comm_get_bootstrap(comm, &bs);
    std::vector<int32_t> all(static_cast<size_t>(n));
    all[static_cast<size_t>(r)] = EnvRank();
    maco_status_t st = maco_bootstrap_allgather(bs, all.data(), sizeof(int32_t));
    out->assign(all.begin(), all.end());
    return st;
}

/* The members' original ranks must be exactly `expect`, and this rank's new rank its index. */
int CheckMembers(maco_comm_t comm, const std::vector<int> &expect)
{
    std::vector<int> got;
    if (OriginalRanks(comm, &got) != MACO_OK)
        return kWrongData;
    int r = -1;
    maco_comm_get_rank(comm, &r);
    if (got != expect || got[static_cast<size_t>(r)] != EnvRank())
        return kWrongMembers;
    return kOk;
}

/* Shrinks with MACO_SHRINK_ABORT and checks the members; destroys both communicators. */
int ShrinkAndCheck(maco_comm_t comm, const std::vector<int> &exclude,
                   const std::vector<int> &expect)
{
    maco_comm_t next = nullptr;
    maco_status_t st = maco_comm_shrink(comm, exclude.data(), static_cast<int>(exclude.size()),
                                        MACO_SHRINK_ABORT, &next);
    maco_comm_destroy(comm);
    if (st != MACO_OK || next == nullptr)
        return kShrinkFailed;
    int code = CheckMembers(next, expect);
    maco_comm_destroy(next);
    return code;
}

/* Serializes `mine`, allgathers the handles over `comm` and imports every peer's into
 * (*peers)[q] (nullptr at this rank). MACO_OK or the first failure. */
maco_status_t ExchangeMem(maco_comm_t comm, maco_mem_t mine, std::vector<maco_mem_t> *peers)
{
    int n = 0, me = 0;
    maco_comm_get_nranks(comm, &n);
    maco_comm_get_rank(comm, &me);
    maco_bootstrap_t bs;
    maco_comm_get_bootstrap(comm, &bs);
    std::vector<uint8_t> h(static_cast<size_t>(n) * MACO_MEM_HANDLE_BYTES);
    maco_status_t st =
        maco_mem_serialize(mine, &h[static_cast<size_t>(me) * MACO_MEM_HANDLE_BYTES]);
    if (st == MACO_OK)
        st = maco_bootstrap_allgather(bs, h.data(), MACO_MEM_HANDLE_BYTES);
    peers->assign(static_cast<size_t>(n), nullptr);
    for (int q = 0; q < n && st == MACO_OK; q++)
        if (q != me)
            st = maco_mem_import(comm, &h[static_cast<size_t>(q) * MACO_MEM_HANDLE_BYTES],
                                 &(*peers)[static_cast<size_t>(q)]);
    return st;
}

/* Returns once every rank has finished creating its communicator: this rank's barrier
 * completes only after all ranks entered it. Its status is not looked at: a peer that went on
 * may already have revoked the communicator (that is part of the cases). */
void AllCreated(maco_comm_t comm)
{
    maco_bootstrap_t bs;
    maco_comm_get_bootstrap(comm, &bs);
    (void)maco_bootstrap_barrier(bs);
}

/* Shrinks without revoking (the communicator may be revoked already) and checks the members;
 * destroys both communicators. */
int ShrinkAndCheckKeep(maco_comm_t comm, const std::vector<int> &expect)
{
    maco_comm_t next = nullptr;
    maco_status_t st = maco_comm_shrink(comm, nullptr, 0, 0, &next);
    maco_comm_destroy(comm);
    if (st != MACO_OK || next == nullptr)
        return kShrinkFailed;
    int code = CheckMembers(next, expect);
    maco_comm_destroy(next);
    return code;
}

/* Kills this process `ms` milliseconds from now, whatever it is doing then. */
void KillSoon(int ms)
{
    std::thread([ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        raise(SIGKILL);
    }).detach();
}

std::vector<std::pair<int, int>> World(int n)
{
    std::vector<std::pair<int, int>> ranks;
    for (int r = 0; r < n; r++)
        ranks.emplace_back(r, n);
    return ranks;
}

void ExpectCodes(const std::vector<int> &codes, const std::vector<int> &victims)
{
    for (size_t r = 0; r < codes.size(); r++) {
        bool victim = false;
        for (int v : victims)
            victim = victim || v == static_cast<int>(r);
        EXPECT_EQ(codes[r], victim ? 128 + SIGKILL : kOk) << "rank " << r;
    }
}

class CommFt : public maco_test::Test
{
};

TEST_F(CommFt, RevokeEndsPeersWaitsNamingTheRevoker)
{
    const int n = 3;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        if (rank == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            if (maco_comm_revoke(comm) != MACO_OK || maco_comm_revoke(comm) != MACO_OK)
                return static_cast<int>(kWrongStatus);
        } else {
            /* Waits for a message nobody sends: only the revoke can end it before the 20 s
             * bootstrap timeout. */
            int x = 0;
            auto t0 = Clock::now();
            maco_status_t st = maco_bootstrap_recv(bs, rank == 0 ? 2 : 0, 7, &x, sizeof(x));
            double s = std::chrono::duration<double>(Clock::now() - t0).count();
            if (st != MACO_ERR_REVOKED)
                return static_cast<int>(kWrongStatus);
            if (std::string(maco_log_last_error()).find("rank 1 revoked") == std::string::npos)
                return static_cast<int>(kWrongMessage);
            if (s > 10.0)
                return static_cast<int>(kTooSlow);
        }
        /* Later calls fail at once; the asynchronous status says so too. */
        maco_status_t async = MACO_OK;
        maco_comm_get_async_error(comm, &async);
        if (maco_bootstrap_barrier(bs) != MACO_ERR_REVOKED || async != MACO_ERR_REVOKED)
            return static_cast<int>(kWrongStatus);
        if (std::string(maco_comm_get_last_error(comm)).find("revoked") == std::string::npos)
            return static_cast<int>(kWrongMessage);
        /* The way on: a shrink of the revoked communicator keeps everyone. */
        return ShrinkAndCheck(comm, {}, { 0, 1, 2 });
    });
    ExpectCodes(codes, {});
}

TEST_F(CommFt, RevokeFromAWatchdogThreadEndsTheCallOnThisRank)
{
    /* Rank 0's watchdog thread revokes while its main thread waits in a call; the main thread
     * then shrinks at once (holding the bootstrap while it waits for rank 1): the peers must be
     * told before that, or rank 1 would wait in its own call until the 20 s timeout. */
    std::vector<int> codes = ForkRanks(World(2), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        std::thread watchdog;
        if (rank == 0)
            watchdog = std::thread([comm] {
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
                maco_comm_revoke(comm);
            });
        int x = 0;
        auto t0 = Clock::now();
        maco_status_t st = maco_bootstrap_recv(bs, 1 - rank, 7, &x, sizeof(x));
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (st != MACO_ERR_REVOKED)
            return static_cast<int>(kWrongStatus);
        if (s > 10.0)
            return static_cast<int>(kTooSlow);
        maco_comm_t next = nullptr;
        st = maco_comm_shrink(comm, nullptr, 0, 0, &next);
        if (watchdog.joinable())
            watchdog.join(); /* before the destroy: maco_comm_revoke may still be running */
        maco_comm_destroy(comm);
        if (st != MACO_OK || next == nullptr)
            return static_cast<int>(kShrinkFailed);
        int code = CheckMembers(next, { 0, 1 });
        maco_comm_destroy(next);
        return code;
    });
    ExpectCodes(codes, {});
}

TEST_F(CommFt, ASendCutMidFrameStillEndsInFrame)
{
    /* Rank 0's send of 64 MiB is cut by a revoke while rank 1 reads nothing (the socket
     * buffers fill): the rest of the frame must still go out, in frame, so that the shrink's
     * messages behind it are read as messages (not as a broken link). */
    const size_t big = size_t(64) << 20;
    std::vector<int> codes = ForkRanks(World(2), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        if (rank == 0) {
            std::vector<char> buf(big, 1);
            std::thread watchdog([comm] {
                std::this_thread::sleep_for(std::chrono::milliseconds(150));
                maco_comm_revoke(comm);
            });
            maco_status_t st = maco_bootstrap_send(bs, 1, 5, buf.data(), big);
            watchdog.join();
            if (st != MACO_ERR_REVOKED)
                return static_cast<int>(kWrongStatus);
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(400)); /* reads nothing */
        }
        return ShrinkAndCheckKeep(comm, { 0, 1 });
    });
    ExpectCodes(codes, {});
}

TEST_F(CommFt, AReceiveCutMidFrameDropsTheRest)
{
    /* Rank 1 receives 256 MiB from rank 0, which stops (SIGSTOP) halfway; rank 1's watchdog
     * revokes; its receive returns, and the rest of the frame, which arrives when rank 0
     * continues (a process of its own sends SIGCONT), must be dropped, not written into the buffer
     * the call no longer owns (valgrind's comm_ft_valgrind runs this), and the shrink's messages
     * behind it must be read in frame. */
    /* Under valgrind (comm_ft_valgrind) every byte is slow: 32 MiB is still cut halfway. */
    const size_t big = size_t(getenv("FT_UNDER_VALGRIND") != nullptr ? 32 : 256) << 20;
    std::vector<int> codes = ForkRanks(World(2), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        maco_status_t st;
        if (rank == 0) {
            std::vector<char> buf(big, 1);
            /* A process of its own wakes this one 1.5 s later, whatever happens elsewhere. */
            pid_t waker = fork();
            if (waker == 0) {
                usleep(1500 * 1000);
                kill(getppid(), SIGCONT);
                _exit(0);
            }
            std::thread([] {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                raise(SIGSTOP);
            }).detach();
            st = maco_bootstrap_send(bs, 1, 5, buf.data(), big);
            waitpid(waker, nullptr, 0);
            /* OK when the frame was written before rank 1's revoke arrived, else REVOKED */
            if (st != MACO_OK && st != MACO_ERR_REVOKED)
                return static_cast<int>(kWrongStatus);
        } else {
            std::thread watchdog([comm] {
                std::this_thread::sleep_for(std::chrono::milliseconds(600));
                maco_comm_revoke(comm);
            });
            {
                std::vector<char> buf(big, 0);
                st = maco_bootstrap_recv(bs, 0, 5, buf.data(), big);
            } /* freed: the rest of the frame must not land here */
            watchdog.join();
            if (st != MACO_ERR_REVOKED)
                return static_cast<int>(kWrongStatus);
        }
        return ShrinkAndCheckKeep(comm, { 0, 1 });
    });
    ExpectCodes(codes, {});
}

TEST_F(CommFt, RankKilledMidAllgatherIsShrunkAway)
{
    const int n = 4, victim = 2;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(comm, &bs);
        if (rank == victim)
            KillSoon(100);
        std::vector<char> buf(static_cast<size_t>(n) << 20);
        maco_status_t st = MACO_OK;
        for (int i = 0; i < 1000 && st == MACO_OK; i++)
            st = maco_bootstrap_allgather(bs, buf.data(), 1 << 20);
        /* The death itself, or a survivor that saw it first and revoked the communicator. */
        if (st != MACO_ERR_REMOTE && st != MACO_ERR_REVOKED)
            return static_cast<int>(kWrongStatus);
        return ShrinkAndCheck(comm, {}, { 0, 1, 3 });
    });
    ExpectCodes(codes, { victim });
}

TEST_F(CommFt, TwoDeathsSeenDifferentlyConvergeOnOneMembership)
{
    const int n = 6;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        if (rank == 1 || rank == 4)
            raise(SIGKILL);
        /* Each survivor names what it wants to: rank 0 only rank 1, rank 5 only rank 4, the
         * others nobody. */
        std::vector<int> exclude;
        if (rank == 0)
            exclude = { 1 };
        if (rank == 5)
            exclude = { 4 };
        return ShrinkAndCheck(comm, exclude, { 0, 2, 3, 5 });
    });
    ExpectCodes(codes, { 1, 4 });
}

TEST_F(CommFt, DeathsInsideTheShrinkCostARound)
{
    /* Rank 5 dies first; then rank 3 dies a few milliseconds into the shrink, and rank 0, the
     * coordinator of the first round, a little later. Whether those two die before or after
     * the others agree is a race: after, the new communicator still holds a dead rank, its
     * first collective fails (on some members; others may complete it and see a dead rank
     * among the members), and the members shrink again, as an application does. */
    const int n = 6;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        if (rank == 5)
            raise(SIGKILL);
        if (rank == 3)
            KillSoon(3);
        if (rank == 0)
            KillSoon(8);
        /* The kills come at some point (a thread's sleep, on a busy machine maybe late):
         * until then the members shrink again and again, each time finding the victims still
         * there; every shrink is quick, so 200 of them are far more than ever needed. */
        const std::vector<int> expect = { 1, 2, 4 };
        for (int attempt = 0; attempt < 200; attempt++) {
            maco_comm_t next = nullptr;
            maco_status_t st = maco_comm_shrink(comm, nullptr, 0, MACO_SHRINK_ABORT, &next);
            maco_comm_destroy(comm);
            if (st != MACO_OK || next == nullptr)
                return static_cast<int>(kShrinkFailed);
            comm = next;
            std::vector<int> got;
            if (OriginalRanks(comm, &got) == MACO_OK && got == expect)
                break;
        }
        if (rank == 0 || rank == 3) /* the kill comes; never report as a survivor */
            std::this_thread::sleep_for(std::chrono::seconds(30));
        int code = CheckMembers(comm, expect);
        maco_comm_destroy(comm);
        return code;
    });
    ExpectCodes(codes, { 0, 3, 5 });
}

TEST_F(CommFt, SlowRankIsKeptAndLiveExcludedRankNeedNotCall)
{
    const int n = 5;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        if (rank == 1) { /* excluded by everyone, alive, never calls */
            std::this_thread::sleep_for(std::chrono::seconds(4));
            maco_comm_destroy(comm);
            return static_cast<int>(kOk);
        }
        if (rank == 4) /* slow, alive: must be waited for */
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        return ShrinkAndCheck(comm, { 1 }, { 0, 2, 3, 4 });
    });
    ExpectCodes(codes, {});
}

/* The shrunk communicator's bootstrap waits as long as its parent's did (MACO_BOOTSTRAP_TIMEOUT),
 * not what was left of the shrink's deadline: here a slow survivor enters the shrink 2.5 s into a
 * 4 s timeout, and after the shrink rank 0 answers an allgather 2 s late, which the others must
 * wait for (with only the 1.5 s left they timed out). */
TEST_F(CommFt, ShrunkBootstrapKeepsTheWholeTimeout)
{
    const int n = 4, victim = 3;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_unique_id_t id;
        int r = -1, size = 0;
        maco_bootstrap_t bs0;
        maco_comm_t comm;
        if (maco_unique_id_from_env(&id, &r, &size) != MACO_OK ||
            maco_bootstrap_create(&id, r, size, 4000, &bs0) != MACO_OK ||
            maco_comm_create(bs0, -1, &comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        if (rank == victim)
            raise(SIGKILL);
        if (rank == 2)
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        maco_comm_t next = nullptr;
        if (maco_comm_shrink(comm, nullptr, 0, MACO_SHRINK_ABORT, &next) != MACO_OK)
            return static_cast<int>(kWrongStatus);
        maco_comm_destroy(comm);
        if (rank == 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(2000));
        int code = CheckMembers(next, { 0, 1, 2 });
        maco_comm_destroy(next);
        maco_bootstrap_destroy(bs0);
        return code;
    });
    ExpectCodes(codes, { victim });
}

TEST_F(CommFt, ExcludedRankThatCallsGetsNoCommunicator)
{
    const int n = 3;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        if (rank != 0)
            return ShrinkAndCheck(comm, { 0 }, { 1, 2 });
        maco_comm_t next = reinterpret_cast<maco_comm_t>(&comm);
        int exclude = 0;
        maco_status_t st = maco_comm_shrink(comm, &exclude, 1, 0, &next);
        maco_comm_destroy(comm);
        return st == MACO_OK && next == nullptr ? static_cast<int>(kOk)
                                                : static_cast<int>(kWrongStatus);
    });
    ExpectCodes(codes, {});
}

TEST_F(CommFt, PortChannelsWorkOnTheShrunkCommunicator)
{
    const int n = 4, victim = 0;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        if (rank == victim)
            raise(SIGKILL);
        maco_comm_t next = nullptr;
        if (maco_comm_shrink(comm, nullptr, 0, MACO_SHRINK_ABORT, &next) != MACO_OK)
            return static_cast<int>(kShrinkFailed);
        maco_comm_destroy(comm);
        /* A ring of host-memory port channels over the three survivors. */
        int me = 0, m = 0;
        maco_comm_get_rank(next, &me);
        maco_comm_get_nranks(next, &m);
        const size_t bytes = 1 << 16;
        void *buf = nullptr;
        maco_mem_t mine = nullptr;
        maco_proxy_t proxy = nullptr;
        if (m != 3 || maco_mem_alloc_host(next, bytes, &buf) != MACO_OK ||
            maco_mem_register(next, buf, bytes, &mine) != MACO_OK ||
            maco_proxy_create(next, &proxy) != MACO_OK || maco_proxy_start(proxy) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        std::vector<maco_mem_t> peers;
        if (ExchangeMem(next, mine, &peers) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        int right = (me + 1) % m, left = (me + m - 1) % m;
        /* Channels to both neighbours, created in rank order so each pair matches up. */
        maco_port_channel_t to_right = nullptr, to_left = nullptr;
        for (int step = 0; step < 2; step++) {
            int peer = (me % 2 == 0) == (step == 0) ? right : left;
            maco_port_channel_t *ch = peer == right ? &to_right : &to_left;
            if (right == left && step == 1)
                break;
            if (maco_port_channel_create(proxy, peer, MACO_TRANSPORT_HOST_MEMORY, mine,
                                         peers[static_cast<size_t>(peer)], ch) != MACO_OK)
                return static_cast<int>(kSetupFailed);
        }
        /* Each rank writes its original rank into the first half of its right neighbour's
         * buffer and signals; then waits for its left neighbour's. */
        auto *words = static_cast<int32_t *>(buf);
        for (size_t i = 0; i < bytes / 8; i++)
            words[bytes / 8 + i] = EnvRank() * 1000 + static_cast<int32_t>(i);
        if (maco_port_channel_put_with_signal(to_right, 0, bytes / 2, bytes / 2) != MACO_OK ||
            maco_port_channel_flush(to_right) != MACO_OK)
            return static_cast<int>(kWrongStatus);
        if (maco_port_channel_wait(to_left, -1) != MACO_OK)
            return static_cast<int>(kWrongStatus);
        std::vector<int> orig;
        if (OriginalRanks(next, &orig) != MACO_OK)
            return static_cast<int>(kWrongData);
        int from = orig[static_cast<size_t>(left)];
        for (size_t i = 0; i < bytes / 8; i++)
            if (words[i] != from * 1000 + static_cast<int32_t>(i))
                return static_cast<int>(kWrongData);
        maco_bootstrap_t bs;
        maco_comm_get_bootstrap(next, &bs);
        maco_bootstrap_barrier(bs); /* nobody frees memory a peer still reads */
        maco_port_channel_destroy(to_right);
        maco_port_channel_destroy(to_left);
        maco_proxy_destroy(proxy);
        for (maco_mem_t p : peers)
            maco_mem_deregister(p);
        maco_mem_deregister(mine);
        maco_mem_free(next, buf);
        maco_comm_destroy(next);
        return static_cast<int>(kOk);
    });
    ExpectCodes(codes, { victim });
}

TEST_F(CommFt, SplitMakesOneCommunicatorPerColor)
{
    const int n = 5;
    std::vector<int> codes = ForkRanks(World(n), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        /* Colors: even ranks 0, odd ranks 1, rank 4 none; keys reverse the order. */
        int color = rank == 4 ? MACO_SPLIT_NOCOLOR : rank % 2;
        maco_comm_t part = reinterpret_cast<maco_comm_t>(&comm);
        if (maco_comm_split(comm, color, n - rank, &part) != MACO_OK)
            return static_cast<int>(kShrinkFailed);
        maco_comm_destroy(comm);
        if (rank == 4)
            return part == nullptr ? static_cast<int>(kOk) : static_cast<int>(kWrongMembers);
        std::vector<int> expect = color == 0 ? std::vector<int>{ 2, 0 } : std::vector<int>{ 3, 1 };
        int code = CheckMembers(part, expect);
        maco_comm_destroy(part);
        return code;
    });
    ExpectCodes(codes, {});
}

TEST_F(CommFt, GrowAdmitsAReplacementForADeadRank)
{
    /* Ranks 0-3 form a job; rank 3 dies; 0-2 shrink, then grow back to 4 with a new process
     * (joiner, forked as "rank 4" here) that reads the grow id from a file rank 0 writes. */
    char dir[] = "/tmp/maco-grow-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string idfile = std::string(dir) + "/id";
    std::vector<std::pair<int, int>> ranks = World(4);
    ranks.emplace_back(4, 4);
    std::vector<int> codes = ForkRanks(ranks, [&](int rank) {
        if (rank == 4) { /* the replacement: waits for the id, joins as rank 3 of 4 */
            maco_unique_id_t id;
            for (int i = 0; i < 400; i++) {
                int fd = open(idfile.c_str(), O_RDONLY);
                if (fd >= 0) {
                    ssize_t got = read(fd, id.bytes, sizeof(id.bytes));
                    close(fd);
                    if (got == static_cast<ssize_t>(sizeof(id.bytes)))
                        break;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(25));
            }
            maco_comm_t grown;
            if (maco_comm_join(&id, 3, 4, -1, &grown) != MACO_OK)
                return static_cast<int>(kSetupFailed);
            int code = CheckMembers(grown, { 0, 1, 2, 4 });
            maco_comm_destroy(grown);
            return code;
        }
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        if (rank == 3)
            raise(SIGKILL);
        maco_comm_t shrunk = nullptr;
        if (maco_comm_shrink(comm, nullptr, 0, MACO_SHRINK_ABORT, &shrunk) != MACO_OK)
            return static_cast<int>(kShrinkFailed);
        maco_comm_destroy(comm);
        maco_unique_id_t id;
        maco_unique_id_t *idp = nullptr;
        if (rank == 0) {
            if (maco_comm_get_grow_id(shrunk, &id) != MACO_OK)
                return static_cast<int>(kWrongStatus);
            std::string tmp = idfile + ".tmp";
            int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0 || write(fd, id.bytes, sizeof(id.bytes)) != sizeof(id.bytes))
                return static_cast<int>(kSetupFailed);
            close(fd);
            rename(tmp.c_str(), idfile.c_str());
            idp = &id;
        }
        maco_comm_t grown = nullptr;
        if (maco_comm_grow(shrunk, 4, idp, &grown) != MACO_OK)
            return static_cast<int>(kShrinkFailed);
        maco_comm_destroy(shrunk);
        int code = CheckMembers(grown, { 0, 1, 2, 4 });
        maco_comm_destroy(grown);
        return code;
    });
    unlink(idfile.c_str());
    rmdir(dir);
    ExpectCodes(codes, { 3 });
}

TEST_F(CommFt, BadArgumentsAreRefusedNamingThem)
{
    std::vector<int> codes = ForkRanks(World(2), [&](int rank) {
        maco_comm_t comm;
        if (maco_comm_init_from_env(&comm) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        AllCreated(comm);
        maco_comm_t next = nullptr;
        int bad = 2, code = kOk;
        /* Each call must fail, with a message holding `text`, and write no communicator. */
        auto expect = [&](maco_status_t st, const char *text) {
            if (code == kOk && st == MACO_OK)
                code = kUnexpectedOk;
            else if (code == kOk && strstr(maco_log_last_error(), text) == nullptr)
                code = kWrongMessage;
        };
        expect(maco_comm_shrink(nullptr, nullptr, 0, 0, &next), "must not be NULL");
        expect(maco_comm_shrink(comm, nullptr, 0, 4, &next), "flags is 0x4");
        expect(maco_comm_shrink(comm, &bad, 1, 0, &next), "exclude[0] is 2, outside [0, 2)");
        expect(maco_comm_shrink(comm, nullptr, 1, 0, &next), "n_exclude is 1");
        expect(maco_comm_shrink(comm, &bad, 3, 0, &next), "n_exclude is 3");
        expect(maco_comm_grow(comm, 2, nullptr, &next), "nranks is 2");
        expect(maco_comm_split(comm, 0, 0, nullptr), "must not be NULL");
        expect(maco_comm_revoke(nullptr), "comm is NULL");
        maco_unique_id_t plain, id;
        if (maco_unique_id_create(&plain) != MACO_OK)
            return static_cast<int>(kSetupFailed);
        expect(maco_comm_join(&plain, 2, 3, -1, &next), "not a grow id");
        if (rank == 1)
            expect(maco_comm_get_grow_id(comm, &id), "only rank 0 makes the id");
        else
            expect(maco_comm_grow(comm, 3, nullptr, &next), "rank 0 passes the id");
        maco_comm_destroy(comm);
        return next == nullptr ? code : static_cast<int>(kWrongStatus);
    });
    ExpectCodes(codes, {});
}

} // namespace
