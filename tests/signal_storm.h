/*
 * signal_storm.h - a signal storm for tests: a thread that sends a signal with a handler
 * installed to every thread of this process, over and over, as a profiler's SIGPROF, Python's
 * handlers or a timer do. Every blocking call MACO makes meanwhile must retry on EINTR (and
 * keep its deadline); a call that fails with "Interrupted system call" is a bug.
 */
#ifndef MACO_TEST_SIGNAL_STORM_H
#define MACO_TEST_SIGNAL_STORM_H

#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace maco_test
{

class SignalStorm
{
  public:
    /* Installs a counting handler for `sig` (with SA_RESTART when `restart`) and starts
     * sending it to every thread of the process every `period_us` microseconds. */
    SignalStorm(int sig, bool restart, int period_us = 20) : sig_(sig), period_us_(period_us)
    {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = OnSignal;
        sa.sa_flags = restart ? SA_RESTART : 0;
        sigemptyset(&sa.sa_mask);
        sigaction(sig_, &sa, nullptr);
        thread_ = std::thread([this] { Run(); });
    }
    ~SignalStorm()
    {
        Stop();
    }
    /* Stops the storm; the handler stays installed (a signal still pending is harmless). */
    void Stop()
    {
        if (!thread_.joinable())
            return;
        stop_.store(true);
        thread_.join();
    }
    /* Signals the handler has run so far, in every storm of this process. */
    static long Delivered()
    {
        return delivered_.load();
    }
    /* Starts a storm when the environment asks for one (MACO_TEST_SIGNAL_STORM=SIG or
     * SIG,norestart with SIG one of USR1, USR2, PROF, ALRM); NULL otherwise. The caller owns it. */
    static SignalStorm *FromEnvironment()
    {
        const char *v = getenv("MACO_TEST_SIGNAL_STORM");
        if (v == nullptr || v[0] == '\0')
            return nullptr;
        int sig = strncmp(v, "USR2", 4) == 0   ? SIGUSR2
                  : strncmp(v, "PROF", 4) == 0 ? SIGPROF
                  : strncmp(v, "ALRM", 4) == 0 ? SIGALRM
                                               : SIGUSR1;
        return new SignalStorm(sig, strstr(v, "norestart") == nullptr, 200);
    }

  private:
    static void OnSignal(int)
    {
        delivered_.fetch_add(1, std::memory_order_relaxed);
    }
    void Run()
    {
        const pid_t pid = getpid();
        const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
        std::vector<pid_t> tids;
        for (long round = 0; !stop_.load(); round++) {
            if (round % 256 == 0) { /* threads come and go: look again now and then */
                tids.clear();
                if (DIR *d = opendir("/proc/self/task")) {
                    while (struct dirent *e = readdir(d)) {
                        pid_t t = static_cast<pid_t>(atoi(e->d_name));
                        if (t > 0 && t != self)
                            tids.push_back(t);
                    }
                    closedir(d);
                }
            }
            for (pid_t t : tids)
                syscall(SYS_tgkill, pid, t, sig_);
            struct timespec ts = { 0, static_cast<long>(period_us_) * 1000 };
            nanosleep(&ts, nullptr);
        }
    }
    static inline std::atomic<long> delivered_{ 0 };
    int sig_, period_us_;
    std::atomic<bool> stop_{ false };
    std::thread thread_;
};

} // namespace maco_test

#endif /* MACO_TEST_SIGNAL_STORM_H */
