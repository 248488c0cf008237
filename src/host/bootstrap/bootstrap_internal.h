/* bootstrap_internal.h - bootstrap calls for MACO's own use (reserved tags). */
#ifndef MACO_BOOTSTRAP_INTERNAL_H
#define MACO_BOOTSTRAP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "maco/bootstrap.h"
#include "src/host/os/socket.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tags MACO itself uses, all >= MACO_BOOTSTRAP_MAX_USER_TAG. */
enum {
    MACO__TAG_ALLGATHER = 0xFFFF0001u,
    MACO__TAG_BROADCAST = 0xFFFF0002u,
    MACO__TAG_CHANNEL = 0xFFFF0010u,
    MACO__TAG_MEMORY = 0xFFFF0011u,
    MACO__TAG_PORT = 0xFFFF0012u,
    MACO__TAG_PORT_TRANSPORT = 0xFFFF0013u, /* a transport's own connect exchange */
    MACO__TAG_P2P_INTERNODE = 0xFFFF0014u,  /* send/recv across nodes: the pair's buffers */
    MACO__TAG_SPLIT = 0xFFFF0020u,          /* maco_comm_split: colors and keys, then the id */
    MACO__TAG_GROW = 0xFFFF0021u,           /* maco_comm_grow: the new bootstrap's id */
    /* maco__bootstrap_shrink's agreement (agree.c): instance k uses these + (k % 256). */
    MACO__TAG_AGREE_PROPOSE = 0xFFFF1000u,
    MACO__TAG_AGREE_DECIDE = 0xFFFF1100u,
    MACO__TAG_AGREE_ID = 0xFFFF1200u,
    MACO__TAG_AGREE_ABANDON = 0xFFFF1300u,
};

/** As maco_bootstrap_allgather, with `tag` (any tag; MACO's own calls use reserved ones). */
maco_status_t maco__bootstrap_allgather_tag(maco_bootstrap_t bs, uint32_t tag, void *buffer,
                                            size_t bytes_per_rank);

/** Tells a bootstrap's setup whether to stop waiting for rank `rank` of the bootstrap being made
 * (nonzero: its process ended, or the attempt was given up), so setup fails at once instead of
 * waiting for it until the deadline. */
typedef struct maco__watch {
    int (*gone)(void *ctx, int rank);
    void *ctx;
} maco__watch_t;

/**
 * maco_bootstrap_create with a timeout in ms (negative: MACO_BOOTSTRAP_TIMEOUT) and an
 * optional watch (NULL: none) asked while setup waits for a rank (each poll, at most every
 * 200 ms). Errors as maco_bootstrap_create, plus MACO_ERR_REMOTE naming a rank the watch says
 * is gone.
 */
maco_status_t maco__bootstrap_create_watched(const maco_unique_id_t *id, int rank, int nranks,
                                             int64_t timeout_ms, const maco__watch_t *watch,
                                             maco_bootstrap_t *bs_p);

/**
 * Revokes the bootstrap: from now on its calls (maco_bootstrap_* and the internal ones) return
 * MACO_ERR_REVOKED, a call blocked on another thread returns within one poll wake-up, and every
 * peer whose link is open gets a REVOKE frame (written within 1 s, or dropped), so its calls end
 * the same way, naming this rank, and its on_revoke callback runs. Idempotent: a bootstrap
 * already revoked (here or by a peer) is left as it is. Any thread; blocks until the call
 * running on the bootstrap (if any) has returned. MACO_OK, or MACO_ERR_INVALID_ARGUMENT for
 * NULL.
 */
maco_status_t maco__bootstrap_revoke(maco_bootstrap_t bs);

/** The rank that revoked the bootstrap (this rank or a peer), or -1. Any thread. */
int maco__bootstrap_revoked_by(maco_bootstrap_t bs);

/** Sets the function called (once, on the thread reading the links) when a peer's REVOKE frame
 * arrives. NULL clears it. */
void maco__bootstrap_set_on_revoke(maco_bootstrap_t bs, void (*fn)(void *ctx, int by_rank),
                                   void *ctx);

/**
 * Reads what has arrived on the links without blocking, if no call is running on the bootstrap
 * (else returns at once: that call reads them): a peer's REVOKE frame then takes effect, and a
 * link that ended is noticed. For watchdog threads (maco_comm_get_async_error). Any thread.
 */
void maco__bootstrap_poll(maco_bootstrap_t bs);

/**
 * What a shrink builds on the new bootstrap (the communicator over it): `build` makes it
 * (collective over the new bootstrap's ranks; it takes the bootstrap over, also on failure) and
 * writes the result to *out_p; `discard` frees a result the agreement did not keep. Errors of
 * `build` are logged by it.
 */
typedef struct maco__shrink_build {
    maco_status_t (*build)(void *ctx, maco_bootstrap_t child, void **out_p);
    void (*discard)(void *ctx, void *out);
    void *ctx;
} maco__shrink_build_t;

/**
 * The survivors of `bs` agree on who stays and build a new bootstrap over those ranks (and what
 * `how` builds on it), also when ranks died at any point before or during the call, or die while
 * it runs. Collective over the live ranks of `bs` that are not excluded; see maco_comm_shrink
 * (maco/comm.h) for the contract, which this implements (the protocol: agree.c). `exclude[0..
 * n_exclude)` are ranks of `bs` this rank wants out. On success *out_p is what `how` built, or
 * NULL when this rank is not a member (excluded); *new_rank_p its rank there (-1 if excluded).
 * Errors: MACO_ERR_TIMEOUT (the deadline, MACO_BOOTSTRAP_TIMEOUT from the call, passed: the
 * message names the ranks still awaited), MACO_ERR_INVALID_USAGE (this rank excluded itself and
 * called anyway is not an error: it gets NULL; a member that failed to build its part three
 * times: its error), MACO_ERR_NO_MEMORY, MACO_ERR_SYSTEM.
 */
maco_status_t maco__bootstrap_shrink(maco_bootstrap_t bs, const int *exclude, int n_exclude,
                                     const maco__shrink_build_t *how, void **out_p,
                                     int *new_rank_p);

/** As maco_bootstrap_send/recv, but any tag is allowed. */
maco_status_t maco__bootstrap_send(maco_bootstrap_t bs, int peer, uint32_t tag, const void *data,
                                   size_t bytes);
maco_status_t maco__bootstrap_recv(maco_bootstrap_t bs, int peer, uint32_t tag, void *data,
                                   size_t bytes);

/**
 * Sends `bytes` of `mine` to `peer` and receives as many from it into `theirs`, both with
 * `tag` (the peer makes the same call). Bounded by the bootstrap's timeout.
 */
maco_status_t maco__bootstrap_exchange(maco_bootstrap_t bs, int peer, uint32_t tag,
                                       const void *mine, void *theirs, size_t bytes);

/**
 * Whether rank `peer` is still in the job, as far as its link shows without blocking:
 * MACO_OK; MACO_ERR_REVOKED (naming who) when the bootstrap was revoked, here or by a peer;
 * MACO_ERR_REMOTE (message naming the peer) when its connection ended, it left the job, or the
 * bootstrap already failed. First reads what arrived on the links when no call is running
 * (maco__bootstrap_poll: a peer's REVOKE frame takes effect), else looks only at the link's
 * descriptor (recv with MSG_PEEK | MSG_DONTWAIT), so any thread may call it while another uses
 * the bootstrap; a peer that died right after sending data not yet read shows as alive until
 * it is read.
 * Host waits that depend on a peer (port channels) call it to fail fast instead of waiting
 * for their bound.
 */
maco_status_t maco__bootstrap_peer_alive(maco_bootstrap_t bs, int peer);

/* 1 when `peer`'s bootstrap link has ended (goodbye, or closed without one: it exited or
 * crashed), else 0. Records no error (safe inside error reporting). Thread-safe. */
int maco__bootstrap_peer_gone(maco_bootstrap_t bs, int peer);

/** For tests: the socket of the link to `peer` (-1 if none). */
int maco__bootstrap_link_fd(maco_bootstrap_t bs, int peer);

/** The bootstrap's timeout in milliseconds. */
int64_t maco__bootstrap_timeout_ms(maco_bootstrap_t bs);

/**
 * Writes the unique id of a job whose rank 0 listens at `root`, with job nonce `nonce`
 * (layout: u32 magic "MACO", u16 version, u16 zero, u64 nonce, the 24-byte wire address of
 * socket.h, zeros up to MACO_UNIQUE_ID_BYTES; little-endian).
 */
void maco__unique_id_encode(maco_unique_id_t *id, uint64_t nonce, const maco__sockaddr_t *root);

/**
 * Decodes a unique id that came from another process: checks its magic, its version and its
 * address family. On success writes the job nonce and rank 0's address; on failure logs why
 * and returns MACO_ERR_INVALID_ARGUMENT, writing nothing. Reads exactly MACO_UNIQUE_ID_BYTES.
 * Thread-safe. Fuzzed by tests/fuzz/fuzz_unique_id.c.
 */
maco_status_t maco__unique_id_decode(const maco_unique_id_t *id, uint64_t *nonce,
                                     maco__sockaddr_t *root);

/**
 * Test support for tests/fuzz/fuzz_link_frames.c, not used by the library: runs the link-frame
 * receive path (maco__peer_read) of an in-memory 2-rank bootstrap (this side rank 0) over a
 * socketpair standing for peer 1's link. Input: u8 flags (bits 0-1: receives posted before any
 * data, 0 to 2, 3 counts as 2; bit 2: one more receive posted after the stream's first part
 * was read), 3 x {u8 tag, u16 bytes} (the receives, in posting order), u16 split (the first
 * part's length), then the byte stream peer 1 sends. It writes what the socket takes of each
 * part without blocking (keep inputs under 64 KiB), closes peer 1's end after the second and
 * reads until the link ends, then frees everything. Touches no network and no global state
 * but the log. Returns MACO_OK when the receive path accepted the stream (a link that ends
 * without goodbye is reported later, by the progress engine, so it is MACO_OK here), the
 * bootstrap's failure status (MACO_ERR_REMOTE) when it rejected the stream, MACO_ERR_INTERNAL
 * (logged) when one of the receive path's invariants does not hold afterwards, MACO_ERR_SYSTEM
 * or MACO_ERR_NO_MEMORY when the test setup failed. Inputs shorter than the 12-byte prefix are
 * ignored (MACO_OK).
 */
maco_status_t maco__bootstrap_fuzz_link(const uint8_t *data, size_t len);

/** This rank's own host id string (never NULL). */
const char *maco__host_id(void);

/** MACO_ERR_INVALID_ARGUMENT, naming MACO_HOST_ID and the limit, when MACO_HOST_ID is longer than a
 * host id can be (127 bytes): cut, two different hosts could become one node. */
maco_status_t maco__host_id_check(void);

/** Where a rank sits: its node and its place among the node's ranks. */
typedef struct maco__topology {
    int local_rank;   /* among the ranks with the same host id, in rank order */
    int local_nranks; /* ranks with the same host id */
    int node;         /* nodes numbered in the order of their lowest rank */
    int nnodes;
} maco__topology_t;

/**
 * Computes `rank`'s topology from every rank's host id (ids[0..nranks)). Ranks with equal
 * ids share a node; they need not be contiguous.
 */
void maco__topology_compute(const char *const *ids, int nranks, int rank, maco__topology_t *t);

#ifdef __cplusplus
}
#endif

#endif /* MACO_BOOTSTRAP_INTERNAL_H */
