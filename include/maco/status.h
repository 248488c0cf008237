/*
 * maco/status.h - the status type every MACO function returns.
 *
 * MACO_OK is zero; errors are negative and grouped by cause, so callers can branch on the
 * cause without parsing text. The full message of the first error a communicator saw
 * (which call, which peer, why) is kept by the communicator: maco_comm_get_last_error().
 *
 * This header compiles as C11, C++ and CUDA, and on the device.
 */
#ifndef MACO_STATUS_H
#define MACO_STATUS_H

#include "maco/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum maco_status {
    MACO_OK = 0,
    /** An argument is out of its documented range (null pointer, size, rank, type...). */
    MACO_ERR_INVALID_ARGUMENT = -1,
    /** A CUDA runtime or driver call failed; the message names the call and CUDA's error. */
    MACO_ERR_CUDA = -2,
    /** An operating-system call failed (socket, fork, mmap...); the message has errno's text. */
    MACO_ERR_SYSTEM = -3,
    /** A bounded wait passed its deadline; the message names what was waited for. */
    MACO_ERR_TIMEOUT = -4,
    /** A peer failed, closed its connection or sent something invalid; the message names its rank.
     */
    MACO_ERR_REMOTE = -5,
    /** The operation is not available here (no CUDA device, several nodes, data type...). */
    MACO_ERR_UNSUPPORTED = -6,
    /** An internal invariant broke: a bug in MACO. Please report it with the message. */
    MACO_ERR_INTERNAL = -7,
    /** Memory allocation (host) failed. */
    MACO_ERR_NO_MEMORY = -8,
    /** The call is valid but its object is not in a state that allows it (e.g. in error). */
    MACO_ERR_INVALID_USAGE = -9,
    /** The communicator was revoked (maco_comm_revoke on this rank or on a peer): its pending and
     * later operations end with this status; destroy it, or shrink it into a new one. */
    MACO_ERR_REVOKED = -10,
} maco_status_t;

/**
 * The constant English text of a status, e.g. "timeout" for MACO_ERR_TIMEOUT.
 * Never returns NULL: unknown values give "unknown status". Thread-safe.
 */
MACO_API const char *maco_status_string(maco_status_t status);

/** The library's version as "MAJOR.MINOR.PATCH". Never NULL. */
MACO_API const char *maco_version_string(void);

#ifdef __cplusplus
}
#endif

#endif /* MACO_STATUS_H */
