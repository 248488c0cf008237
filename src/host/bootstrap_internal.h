/* bootstrap_internal.h - bootstrap calls for MACO's own use (reserved tags). */
#ifndef MACO_BOOTSTRAP_INTERNAL_H
#define MACO_BOOTSTRAP_INTERNAL_H

#include "maco/bootstrap.h"

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
};

/** As maco_bootstrap_send/recv, but any tag is allowed. */
maco_status_t maco__bootstrap_send(maco_bootstrap_t bs, int peer, uint32_t tag, const void *data,
                                   size_t bytes);
maco_status_t maco__bootstrap_recv(maco_bootstrap_t bs, int peer, uint32_t tag, void *data,
                                   size_t bytes);

/**
 * Whether rank `peer` is still in the job, as far as its link shows without blocking:
 * MACO_OK, or MACO_ERR_REMOTE (message naming the peer) when its connection ended, it left
 * the job, or the bootstrap already failed. Reads only the link's descriptor (recv with
 * MSG_PEEK | MSG_DONTWAIT), so any thread may call it while another uses the bootstrap; a
 * peer that died right after sending data not yet read shows as alive until it is read.
 * Host waits that depend on a peer (port channels) call it to fail fast instead of waiting
 * for their bound.
 */
maco_status_t maco__bootstrap_peer_alive(maco_bootstrap_t bs, int peer);

/** For tests: the socket of the link to `peer` (-1 if none). */
int maco__bootstrap_link_fd(maco_bootstrap_t bs, int peer);

/** The bootstrap's timeout in milliseconds. */
int64_t maco__bootstrap_timeout_ms(maco_bootstrap_t bs);

/** Parses MACO_BOOTSTRAP_NONCE's text: 1 to 16 hex digits, nothing else. 0 on success. */
int maco__parse_nonce(const char *text, uint64_t *nonce_p);

/**
 * The job nonce when MACO_BOOTSTRAP_NONCE is not set (torchrun-style starts): a hash of the
 * rank-0 address text and `run_id` (torchrun's TORCHELASTIC_RUN_ID, a random UUID under
 * --standalone; ignored when NULL, empty or "none"). Only processes that can read the job's
 * environment know the run id; without one any local process can compute the nonce, which
 * the info log says once.
 */
uint64_t maco__derive_nonce(const char *addr_text, const char *run_id);

/** This rank's own host id string (never NULL). */
const char *maco__host_id(void);

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
