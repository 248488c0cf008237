/*
 * maco/log.h - observing MACO's log.
 *
 * MACO writes its log to standard error or MACO_LOG_FILE, filtered by MACO_LOG_LEVEL
 * (default warn) and MACO_LOG_SUBSYS. A handler additionally receives every line that is
 * written, e.g. to forward it to an application's logger or to fail a test on an
 * unexpected warning.
 */
#ifndef MACO_LOG_H_PUBLIC
#define MACO_LOG_H_PUBLIC

#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum maco_log_level {
    MACO_LOG_ERROR = 0,
    MACO_LOG_WARN = 1,
    MACO_LOG_INFO = 2,
    MACO_LOG_DEBUG = 3,
    MACO_LOG_TRACE = 4,
} maco_log_level_t;

/**
 * Called once per log line, from the thread that logs, after the line is written (or held
 * back: maco_log_set_error_capture).
 * `line` is the complete line ("host:pid:tid [rank] LEVEL subsys: message\n"), valid only
 * during the call. It must not call back into MACO.
 */
typedef void (*maco_log_handler_t)(maco_log_level_t level, const char *line, void *user);

/**
 * Installs `handler` (NULL removes it) with its `user` pointer. Not thread-safe with
 * respect to concurrent logging: install it before using MACO from other threads.
 * Returns MACO_OK.
 */
MACO_API maco_status_t maco_log_set_handler(maco_log_handler_t handler, void *user);

/**
 * For layers that report MACO's errors themselves, such as a language binding that raises an
 * exception carrying the message: while `on` is not 0, ERROR lines logged by the calling thread
 * are not written to the log (standard error or MACO_LOG_FILE); they still reach the handler,
 * and maco_log_last_error() still returns the message, so the caller must report each one (or
 * write it with maco_log_write when the call did not fail). Lines of other levels and lines
 * logged by other threads (the proxy's, for instance) are written as usual. Returns the
 * thread's previous setting (0 or 1), so that calls can nest. Thread-safe (one setting per
 * thread).
 */
MACO_API int maco_log_set_error_capture(int on);

/**
 * Writes one line to MACO's log exactly as MACO's own lines are written (the same prefix,
 * level and MACO_LOG_LEVEL / MACO_LOG_SUBSYS filters, the same handler), for layers built on
 * the public API: the NCCL-compatible library, language bindings. `subsys` is one of the
 * names MACO_LOG_SUBSYS accepts ("init", "bootstrap", "mem", "channel", "coll", "proxy",
 * "tool"); NULL or another name logs as "tool". `fmt` is a printf format. Thread-safe.
 */
MACO_API void maco_log_write(maco_log_level_t level, const char *subsys, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/** 1 when a line of this level and subsystem (as maco_log_write takes it) would be written,
 * else 0; lets callers skip formatting. Thread-safe. */
MACO_API int maco_log_enabled(maco_log_level_t level, const char *subsys);

/**
 * The message of the most recent error MACO detected during a call made by this thread
 * (which call, which peer, why), or "" when there was none: errors of calls that have no
 * communicator yet (bootstrap setup, maco_comm_create) included. The string is owned by the
 * thread and changes at its next failing MACO call. Thread-safe (one buffer per thread).
 */
MACO_API const char *maco_log_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MACO_LOG_H_PUBLIC */
