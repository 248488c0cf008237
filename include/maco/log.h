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
 * Called once per log line, from the thread that logs, after the line is written.
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

#ifdef __cplusplus
}
#endif

#endif /* MACO_LOG_H_PUBLIC */
