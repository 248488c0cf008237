/*
 * fuzz_common.h - what every MACO fuzz harness shares: a quiet log and an invariant check.
 *
 * Every rejected input logs one error line, and a run tries millions of inputs, so the
 * harnesses set MACO_LOG_LEVEL=error and, unless MACO_FUZZ_LOG is set (to reproduce one
 * input with its messages), send the log to /dev/null. Sanitizer and libFuzzer reports still
 * go to standard error.
 */
#ifndef MACO_FUZZ_COMMON_H
#define MACO_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include "src/host/base/log.h"

static inline void maco_fuzz_quiet_log(void)
{
    setenv("MACO_LOG_LEVEL", "error", 1);
    if (getenv("MACO_FUZZ_LOG") == NULL)
        setenv("MACO_LOG_FILE", "/dev/null", 1);
    maco__log_reset();
}

/* libFuzzer's initializer of a harness that needs nothing but the quiet log. */
#define MACO_FUZZ_QUIET_INITIALIZE()                                                               \
    int LLVMFuzzerInitialize(int *argc, char ***argv)                                              \
    {                                                                                              \
        (void)argc;                                                                                \
        (void)argv;                                                                                \
        maco_fuzz_quiet_log();                                                                     \
        return 0;                                                                                  \
    }

/* Stops the run (libFuzzer saves the input as a crash) when an invariant does not hold. */
#define MACO_FUZZ_CHECK(cond)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif /* MACO_FUZZ_COMMON_H */
