/*
 * log.h - the internal leveled logger (not public API).
 *
 * Configuration, read once at first use:
 *   MACO_LOG_LEVEL   error | warn (default) | info | debug | trace
 *   MACO_LOG_SUBSYS  comma list of subsystems to show (init,bootstrap,mem,channel,coll,proxy,
 *                    tool,persist, or all); a leading ^ inverts the list ("^bootstrap").
 *                    Errors are shown whatever the list says.
 *   MACO_LOG_FILE    path of the log; %h expands to the host name, %p to the pid.
 *                    Default: standard error.
 * A bad value is never taken silently: an unknown level, an unknown subsystem name (the
 * others still apply) or a log file that cannot be opened (the log goes to standard error)
 * is reported by a warning naming the variable and what it accepts, written whatever the
 * filters say.
 * Every line reads "host:pid:tid [rank] LEVEL subsys: message". The rank is this thread's
 * (MACO__LOG_RANK_SCOPE, maco__log_set_rank) when it has one, else the process's.
 * errno is preserved across a logging call, so `maco__log(...)` may sit between a failing
 * call and strerror(errno). Thread-safe: each line is written with one write() call.
 */
#ifndef MACO_LOG_H
#define MACO_LOG_H

#include <stdarg.h>
#include <stddef.h>

#include "maco/log.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef maco_log_level_t maco__log_level_t;

typedef enum maco__subsys {
    MACO_SUBSYS_INIT = 1u << 0,
    MACO_SUBSYS_BOOTSTRAP = 1u << 1,
    MACO_SUBSYS_MEM = 1u << 2,
    MACO_SUBSYS_CHANNEL = 1u << 3,
    MACO_SUBSYS_COLL = 1u << 4,
    MACO_SUBSYS_PROXY = 1u << 5,
    MACO_SUBSYS_TOOL = 1u << 6,
    MACO_SUBSYS_PERSIST = 1u << 7,
} maco__subsys_t;

/** True when a message of this level and subsystem would be written. */
int maco__log_enabled(maco__log_level_t level, maco__subsys_t subsys);

void maco__log(maco__log_level_t level, maco__subsys_t subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void maco__vlog(maco__log_level_t level, maco__subsys_t subsys, const char *fmt, va_list ap);

/**
 * Sets the rank shown in log lines of this process (-1: none), and of this thread until an
 * enclosing MACO__LOG_RANK_SCOPE ends (a thread that never opens one, like a proxy thread,
 * keeps it).
 */
void maco__log_set_rank(int rank);

/** A thread's rank when it has none of its own: its lines show the process's rank. */
#define MACO__LOG_RANK_UNSET (-2)

/** Sets this thread's log rank (-1: none; MACO__LOG_RANK_UNSET: the process's); returns the
 * previous one. */
int maco__log_swap_thread_rank(int rank);

/** Cleanup of MACO__LOG_RANK_SCOPE: puts back the thread rank that `saved` holds. */
void maco__log_restore_thread_rank(const int *saved);

/*
 * Shows `rank` in this thread's log lines until the enclosing block ends, then the previous
 * thread rank again (whatever path leaves the block: it is a cleanup variable). Each public
 * call of a bootstrap or communicator opens one at its start, so that a process with several
 * of them logs every line of a call with that call's rank; lines logged outside any call
 * keep the process's rank. Costs two thread-local stores per call. One per block.
 */
#define MACO__LOG_RANK_SCOPE(rank)                                                                 \
    int maco__log_rank_saved __attribute__((cleanup(maco__log_restore_thread_rank), unused)) =     \
        maco__log_swap_thread_rank(rank)

/** The level MACO_LOG_LEVEL's text names (case-insensitive; "warning" is warn), or -1. */
int maco__log_parse_level(const char *text);

/**
 * Parses a MACO_LOG_SUBSYS list into *mask_p, the subsystems to show. Names are
 * case-insensitive and may have blanks around them; empty names are skipped. Unknown names
 * are skipped and listed in `bad` (cap bytes, quoted and comma-separated, "" when none).
 * A list with no known name shows every subsystem, as an unset variable does.
 * Returns the number of unknown names.
 */
int maco__log_parse_subsys(const char *text, unsigned *mask_p, char *bad, size_t cap);

/** What MACO_LOG_LEVEL and MACO_LOG_SUBSYS accept, for messages. */
#define MACO__LOG_LEVEL_ACCEPTS "error, warn, info, debug or trace"
#define MACO__LOG_SUBSYS_ACCEPTS                                                                   \
    "a comma list of init, bootstrap, mem, channel, coll, proxy, tool, persist or all; "           \
    "a leading ^ inverts it"

/** Re-reads MACO_LOG_* (tests change them between cases). */
void maco__log_reset(void);

/**
 * Records an error: logs it at error level (once, where it is detected) and keeps the text
 * as this thread's last error message, which the public API boundary copies into the
 * communicator. Returns `status` so callers can write `return maco__error(...)`.
 */
maco_status_t maco__error(maco_status_t status, maco__subsys_t subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** Sets this thread's last error text without logging (for repeats of a sticky error). */
maco_status_t maco__error_quiet(maco_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** This thread's last error text (empty string when none). */
const char *maco__last_error(void);
void maco__clear_last_error(void);

#define MACO_LOG(level, subsys, ...)                                                               \
    do {                                                                                           \
        if (maco__log_enabled((level), (subsys)))                                                  \
            maco__log((level), (subsys), __VA_ARGS__);                                             \
    } while (0)
#define MACO_WARN(subsys, ...) MACO_LOG(MACO_LOG_WARN, subsys, __VA_ARGS__)
#define MACO_INFO(subsys, ...) MACO_LOG(MACO_LOG_INFO, subsys, __VA_ARGS__)
#define MACO_DEBUG(subsys, ...) MACO_LOG(MACO_LOG_DEBUG, subsys, __VA_ARGS__)
#define MACO_TRACE(subsys, ...) MACO_LOG(MACO_LOG_TRACE, subsys, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif /* MACO_LOG_H */
