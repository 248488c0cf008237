/*
 * maco/config.h - read-only view of MACO's configuration table.
 *
 * MACO is configured by MACO_* environment variables. These calls list them (maco-info
 * --env prints them), so tools and users need not keep their own copy of the table.
 */
#ifndef MACO_CONFIG_H
#define MACO_CONFIG_H

#include <stddef.h>

#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct maco_config_info {
    const char *name;          /**< full variable name, e.g. "MACO_BOOTSTRAP_TIMEOUT" */
    const char *type;          /**< "string", "int", "size", "duration" or "bool" */
    const char *default_value; /**< default as text; "" when there is none */
    const char *unit;          /**< unit of the parsed value ("bytes", "ms") or "" */
    const char *doc;           /**< one-line description */
    const char *current;       /**< the environment's value, or NULL when unset */
} maco_config_info_t;

/** Number of configuration variables. Thread-safe. */
MACO_API int maco_config_count(void);

/**
 * Describes variable `index` (0 <= index < maco_config_count()) in *info_p. The strings are
 * owned by MACO (the environment's for `current`) and stay valid until the environment
 * changes. Returns MACO_ERR_INVALID_ARGUMENT when index is out of range or info_p is NULL.
 */
MACO_API maco_status_t maco_config_describe(int index, maco_config_info_t *info_p);

/**
 * Checks the environment's value of variable `index` with the parser MACO reads it with
 * (int, size, duration, bool; MACO_LOG_LEVEL and MACO_LOG_SUBSYS by their word lists).
 * Returns MACO_OK when the variable is unset, empty or valid. When the value is invalid,
 * returns MACO_ERR_INVALID_ARGUMENT and writes into `why` (cap bytes, NUL-terminated,
 * truncated to fit) what is wrong and what the variable accepts ("accepts: ..."); nothing
 * is logged then. Returns MACO_ERR_INVALID_ARGUMENT, logged, when index is out of range or
 * why is NULL with cap > 0. Thread-safe as long as the environment does not change.
 */
MACO_API maco_status_t maco_config_validate(int index, char *why, size_t cap);

/**
 * Looks `name` (e.g. "MACO_SCRATCH_SIZE") up in the table: returns its index, or -1 when it
 * is no MACO variable (or name is NULL); then, when closest_p is not NULL and name is not
 * NULL, *closest_p is the index of the known name nearest to it (edit distance), for a
 * "did you mean" hint. Thread-safe.
 */
MACO_API int maco_config_lookup(const char *name, int *closest_p);

#ifdef __cplusplus
}
#endif

#endif /* MACO_CONFIG_H */
