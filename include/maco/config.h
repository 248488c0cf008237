/*
 * maco/config.h - read-only view of MACO's configuration table.
 *
 * MACO is configured by MACO_* environment variables. These calls list them (maco-info
 * --env prints them), so tools and users need not keep their own copy of the table.
 */
#ifndef MACO_CONFIG_H
#define MACO_CONFIG_H

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

#ifdef __cplusplus
}
#endif

#endif /* MACO_CONFIG_H */
