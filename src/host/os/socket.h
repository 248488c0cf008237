/*
 * socket.h - TCP helpers for the bootstrap (internal): addresses, listen, bounded connect.
 * IPv4 and IPv6; every socket is non-blocking, close-on-exec, TCP_NODELAY.
 */
#ifndef MACO_SOCKET_H
#define MACO_SOCKET_H

#include <stdint.h>
#include <sys/socket.h>

#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A socket address in a fixed, versioned-wire-friendly form. */
typedef struct maco__sockaddr {
    struct sockaddr_storage ss;
    socklen_t len;
} maco__sockaddr_t;

/** Fixed-width little-endian wire form of an address: 24 bytes. */
enum { MACO__WIRE_ADDR_BYTES = 24 };
void maco__sockaddr_to_wire(const maco__sockaddr_t *addr, uint8_t out[MACO__WIRE_ADDR_BYTES]);
int maco__sockaddr_from_wire(const uint8_t in[MACO__WIRE_ADDR_BYTES], maco__sockaddr_t *addr);

/** "1.2.3.4:5678" or "[::1]:5678". */
void maco__sockaddr_format(const maco__sockaddr_t *addr, char *out, size_t cap);

/**
 * Parses "host:port", "[v6addr]:port" or "v4addr:port"; host names are resolved.
 * MACO_ERR_INVALID_ARGUMENT names `what` (e.g. "MACO_BOOTSTRAP_ADDR") and the text.
 */
maco_status_t maco__sockaddr_parse(const char *text, const char *what, maco__sockaddr_t *addr);

uint16_t maco__sockaddr_port(const maco__sockaddr_t *addr);
void maco__sockaddr_set_port(maco__sockaddr_t *addr, uint16_t port);

/**
 * Whether interface `name` is chosen by `spec`, in NCCL_SOCKET_IFNAME's syntax: a comma list
 * of name prefixes ("eth,ib"), of exact names after "=" ("=eth0"), and either form after "^"
 * to exclude instead ("^docker,lo"). Returns 1 or 0.
 */
int maco__ifname_match(const char *spec, const char *name);

/**
 * The address to listen on for the bootstrap root when nothing else says: the first
 * address of an interface MACO_SOCKET_IFNAME chooses (maco__ifname_match; with an exclusion
 * list, the first up non-loopback IPv4 interface it does not exclude); else the first up,
 * non-loopback IPv4 interface; else 127.0.0.1.
 */
maco_status_t maco__socket_default_address(maco__sockaddr_t *addr);

/**
 * Creates a listening socket bound to `addr` (port 0 picks one); *addr gets the bound
 * port. SO_REUSEADDR is set. Returns the fd in *fd_p.
 */
maco_status_t maco__socket_listen(maco__sockaddr_t *addr, int *fd_p);

/**
 * Connects to `addr`, retrying refused or unreachable attempts with backoff until
 * `deadline_ms` (maco__now_ms() clock). `what` names the target in messages ("rank 0").
 * MACO_ERR_TIMEOUT when the deadline passes.
 */
maco_status_t maco__socket_connect(const maco__sockaddr_t *addr, int64_t deadline_ms,
                                   const char *what, int *fd_p);

/**
 * As maco__socket_connect, and between attempts (at least every 200 ms) asks `stop`: a status
 * other than MACO_OK (which `stop` logs) ends the attempts and is returned. For connections to
 * a process that may be gone for good (a rank that died), which another channel can tell.
 */
maco_status_t maco__socket_connect_watched(const maco__sockaddr_t *addr, int64_t deadline_ms,
                                           const char *what, maco_status_t (*stop)(void *ctx),
                                           void *stop_ctx, int *fd_p);

/** Accepts one pending connection (non-blocking); 0 with *fd_p=-1 when none is pending. */
maco_status_t maco__socket_accept(int listen_fd, int *fd_p, maco__sockaddr_t *peer);

/** Local address of a connected socket. */
maco_status_t maco__socket_local_address(int fd, maco__sockaddr_t *addr);

/** Monotonic clock in milliseconds. */
int64_t maco__now_ms(void);

/**
 * maco__now_ms() + timeout_ms, saturated at INT64_MAX (a huge timeout means "practically
 * never", not an overflow into the past); a negative timeout counts as 0.
 */
int64_t maco__deadline_ms(int64_t timeout_ms);

/** timeout_ms in nanoseconds for device waits, saturated at UINT64_MAX (never). */
uint64_t maco__timeout_ns(int64_t timeout_ms);

/**
 * A random non-zero 64-bit value (getrandom; clock and pid mixed when no entropy source is
 * available): job nonces, descriptor tokens, process tokens.
 */
uint64_t maco__random_u64(void);

#ifdef __cplusplus
}
#endif

#endif /* MACO_SOCKET_H */
