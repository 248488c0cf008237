/*
 * fd_server.h - hands file descriptors (cuMem POSIX handles, host-memory memfds) to other
 * processes of the node (internal).
 *
 * A process that exports memory publishes the descriptor here and puts (pid, server nonce,
 * token) into the serialized handle. A thread of this process listens on the abstract
 * Unix-domain socket "maco-fd-<pid>-<server nonce>" (abstract: nothing is left in the file
 * system) and answers each request {magic, version, token} with a status and, on success, a
 * duplicate of the descriptor as SCM_RIGHTS ancillary data. Tokens are random 64-bit values,
 * so only a process that was given the serialized handle can ask. The thread starts with the
 * first publication and stops when the last descriptor is withdrawn.
 */
#ifndef MACO_FD_SERVER_H
#define MACO_FD_SERVER_H

#include <stdint.h>

#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Where to ask for a descriptor: the server's pid and nonce, and the descriptor's token. */
typedef struct maco__fd_ref {
    uint32_t pid;
    uint64_t server_nonce;
    uint64_t token;
} maco__fd_ref_t;

/**
 * Publishes `fd` (the server keeps its own duplicate until withdrawn) and returns where to
 * fetch it. Starts the server thread if needed. Thread-safe.
 */
maco_status_t maco__fd_publish(int fd, maco__fd_ref_t *ref_p);

/** Withdraws a published descriptor (closes the server's duplicate). Thread-safe. */
void maco__fd_withdraw(const maco__fd_ref_t *ref);

/**
 * Fetches a duplicate of a descriptor another process (or this one) published; the caller
 * owns and closes *fd_p. Bounded by `timeout_ms` (one deadline for the whole exchange); a
 * signal arriving meanwhile (EINTR, with or without SA_RESTART) is retried within it.
 * `owner_rank` only names the peer in errors. Errors: MACO_ERR_REMOTE (no such server or token: the
 * owner exited or withdrew it), MACO_ERR_TIMEOUT, MACO_ERR_SYSTEM.
 */
maco_status_t maco__fd_fetch(const maco__fd_ref_t *ref, int owner_rank, int64_t timeout_ms,
                             int *fd_p);

/** A random 64-bit value fixed for the life of this process (tells processes apart). */
uint64_t maco__process_token(void);

#ifdef __cplusplus
}
#endif

#endif /* MACO_FD_SERVER_H */
