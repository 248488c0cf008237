/*
 * bootstrap_private.h - the TCP bootstrap's insides, shared by the files of src/host/bootstrap:
 *   host_id.c (host identity, topology), unique_id.c (the 128-byte id, rank 0's socket),
 *   progress.c (frames, the progress engine, failures), calls.c (the public calls), handshake.c
 *   (the setup handshake, bounded reads and writes), setup.c (the setup protocol), env.c
 *   (starting from the environment).
 *
 * TCP bootstrap: setup through rank 0, then a full mesh of connections.
 *
 * Setup protocol (all integers little-endian, every message starts with magic + version):
 *   0. Every connection of the setup starts with the handshake (handshake.c), the same for
 *      every kind of hello. The connecting process sends HELLO {magic, version, kind, rank,
 *      nranks, a fresh random 16-byte challenge, listen address, host id}; the accepting
 *      process answers CHALLENGE {magic, version, kind=CHALLENGE, its own fresh 16-byte
 *      challenge, its proof}; the connecting process checks that proof and answers PROOF
 *      {magic, version, kind=PROOF, its proof}, or REFUSED and closes. A proof is
 *      HMAC-SHA256 keyed by the job nonce (8 bytes, little-endian) over a label naming the
 *      role ("MACO-hello-v2 server" or "MACO-hello-v2 client"), the whole HELLO and the
 *      accepting side's challenge: each side proves that it knows the nonce over a
 *      challenge the other side just drew, and the nonce itself never crosses the wire. The
 *      accepting side proves first, so a process that listens on a rank's address before
 *      the rank does (or any stranger) learns nothing from a rank that connects to it, and
 *      that rank fails at once naming the address; a stranger that connects gets one proof
 *      over a challenge of its choosing, which does not let it answer a challenge of ours
 *      (the labels differ and our challenge is fresh). The handshake authenticates; it
 *      neither encrypts nor protects later frames against a man in the middle.
 *   1. Every rank r > 0 opens a listening socket, connects to rank 0 and runs the handshake
 *      with kind HELLO.
 *   2. Rank 0 refuses a connection that does not present MACO's magic, that runs another
 *      setup wire version (one of version 1 is told so with an INIT_ERROR frame, which it
 *      reads), that asks for another kind, or whose proof is wrong, with a warning. Of the
 *      rest, a rank out of range, a duplicate rank or another world size fails the job, and
 *      rank 0 tells every joined rank why (INIT_ERROR frame). When all nranks-1 ranks have
 *      joined, rank 0 sends everyone the TABLE of listen addresses and host ids. These
 *      connections stay as the mesh links between rank 0 and each rank.
 *   3. Rank r connects to every rank q in [1, r) and runs the handshake with kind
 *      PEER_HELLO; it accepts one connection from every rank in (r, nranks).
 *
 * After setup, every link carries frames: {u16 kind, u16 reserved, u32 tag, u64 length}
 * and `length` payload bytes. DATA frames carry user and MACO messages; a BYE frame says the
 * sender is leaving on purpose, so the end of its stream is not a failure.
 *
 * One progress engine serves every call: it polls all links, reads what arrives into posted
 * receives (or keeps it as unexpected messages), writes queued sends, and notices links
 * that end without BYE. A call loops on it until its own work is done, the deadline passes
 * (MACO_ERR_TIMEOUT naming what is missing) or a peer fails (MACO_ERR_REMOTE naming it).
 */
#ifndef MACO_BOOTSTRAP_PRIVATE_H
#define MACO_BOOTSTRAP_PRIVATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "maco/bootstrap.h"
#include "src/host/os/socket.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MACO__ID_MAGIC 0x4F43414Du /* "MACO" read as little-endian u32 */
#define MACO__ID_VERSION 1u        /* the unique id's layout */
/* The setup handshake's wire version. 1: the hello carried the job nonce in clear (any process
 * listening on the address first learned it); 2: challenge and response (above). */
#define MACO__HELLO_VERSION 2u
#define MACO__HOST_ID_BYTES 128

/* Kinds of the setup handshake's messages. */
enum {
    MACO__KIND_HELLO = 1,      /* a rank joins through rank 0 */
    MACO__KIND_PEER_HELLO = 2, /* a rank connects to a lower rank for the mesh */
    MACO__KIND_CHALLENGE = 16, /* the accepting side's challenge and proof */
    MACO__KIND_PROOF = 17,     /* the connecting side's proof */
    MACO__KIND_REFUSED = 18,   /* the connecting side found the accepting side's proof wrong */
};

/* Frame kinds on established links. */
enum {
    MACO__FRAME_DATA = 0,
    MACO__FRAME_BYE = 1,
    MACO__FRAME_TABLE = 2,
    MACO__FRAME_INIT_ERROR = 3,
    MACO__FRAME_ABORT = 4,  /* payload: u32 culprit rank (or ~0), i32 status, text */
    MACO__FRAME_REVOKE = 5, /* no payload: the sender revoked the bootstrap (maco_comm_revoke) */
};

enum {
    MACO__FRAME_HDR_BYTES = 16,
    MACO__HS_CHALLENGE = 16, /* bytes of a challenge */
    MACO__HS_PROOF = 32,     /* bytes of a proof (HMAC-SHA256) */
    /* HELLO: magic(4) version(2) kind(2) rank(4) nranks(4) challenge(16), then a table entry:
     * listen address(24) host id(128). */
    MACO__HELLO_ENTRY = 32,
    MACO__HELLO_BYTES = MACO__HELLO_ENTRY + MACO__WIRE_ADDR_BYTES + MACO__HOST_ID_BYTES,
    /* CHALLENGE: magic(4) version(2) kind(2) challenge(16) proof(32). */
    MACO__HS_CHALLENGE_BYTES = 8 + MACO__HS_CHALLENGE + MACO__HS_PROOF,
    /* PROOF and REFUSED: magic(4) version(2) kind(2) proof(32) (zeros in REFUSED). */
    MACO__HS_PROOF_BYTES = 8 + MACO__HS_PROOF,
    /* Version 1's hello: magic(4) version(2) kind(2) nonce(8) rank(4) nranks(4) addr host id. */
    MACO__HELLO_V1_BYTES = 24 + MACO__WIRE_ADDR_BYTES + MACO__HOST_ID_BYTES,
    MACO__TABLE_ENTRY_BYTES = MACO__WIRE_ADDR_BYTES + MACO__HOST_ID_BYTES,
    /* How long an accepted connection may take to send its hello before it is dropped. A
     * rank writes its hello right after connecting, but 256 ranks on 2 cores can leave one
     * unscheduled for seconds (2 s dropped real ranks there); strangers cost only a pending
     * slot meanwhile. */
    MACO__HELLO_WAIT_MS = 10000,
    /* Connections whose hello is still arriving, at most; when more arrive, the oldest is
     * dropped (it had the longest time to speak), so strangers cannot crowd out ranks. */
    MACO__PENDING_MAX = 1024,
    /* After a job error during setup (world size mismatch, duplicate or out-of-range rank),
     * how long rank 0 keeps answering newcomers with the error before it gives up. */
    MACO__ERROR_LINGER_MS = 3000,
    /* After a connection ends unexpectedly, how long to keep reading the others before
     * failing: a peer that failed because of a third rank's death says so (ABORT) before
     * closing, so the error can name the rank that actually died. */
    MACO__LOST_GRACE_MS = 250,
    MACO__ABORT_TEXT_BYTES = 512,
    /* A message nobody posted a receive for is buffered in pieces that grow as its bytes
     * arrive (from 1 MiB, doubling): a frame header announcing a huge length costs memory
     * only for what the peer really sends. */
    MACO__RX_FIRST_CHUNK = 1 << 20,
};

/* ------------------------------------------------------------------ data structures */

typedef struct maco__msg {
    struct maco__msg *next;
    uint32_t tag;
    size_t len;
    uint8_t *data;
} maco__msg_t;

typedef struct maco__rx_post {
    struct maco__rx_post *next;
    uint32_t tag;
    void *buf;
    size_t len;
    int done;
    maco_status_t status;
} maco__rx_post_t;

typedef struct maco__tx {
    struct maco__tx *next;
    /* 1 when the bootstrap owns this frame and its data (one allocation, freed once sent): what
     * is left of a frame whose call ended while it was half sent, so the stream stays in frame
     * and the link stays usable for later calls. */
    int owned;
    uint8_t hdr[MACO__FRAME_HDR_BYTES];
    size_t hdr_sent;
    const uint8_t *data;
    size_t len;
    size_t sent;
} maco__tx_t;

enum { MACO__PEER_OPEN = 0, MACO__PEER_BYE = 1, MACO__PEER_CLOSED = 2, MACO__PEER_LOST = 3 };

typedef struct maco__peer {
    int fd;
    int state;
    /* Receive side: the frame being read. */
    uint8_t hdr[MACO__FRAME_HDR_BYTES];
    size_t hdr_got;
    int in_payload;
    uint16_t kind;
    uint32_t tag;
    size_t payload_len, payload_got;
    size_t payload_cap;         /* bytes payload_dst can hold now (grows for rx_msg) */
    uint8_t *payload_dst;       /* where the payload goes */
    maco__rx_post_t *rx_target; /* posted receive being filled, or NULL */
    maco__msg_t *rx_msg;        /* unexpected message being filled, or NULL */
    /* Completed unexpected messages and posted receives, in order. */
    maco__msg_t *unexpected_head, *unexpected_tail;
    maco__rx_post_t *posts_head, *posts_tail;
    /* Queued sends, in order. */
    maco__tx_t *tx_head, *tx_tail;
    int tx_broken; /* a frame was abandoned half-sent: nothing more may be sent */
    /* 1 while the rest of the frame being read is thrown away (its call ended while it was
     * arriving): the bytes are read and dropped, so the stream stays in frame. */
    int rx_discard;
} maco__peer_t;

struct maco_bootstrap {
    int rank;
    int nranks;
    uint64_t nonce;
    int64_t timeout_ms;
    int listen_fd;
    maco__peer_t *peers; /* [nranks]; peers[rank] unused */
    char (*host_ids)[MACO__HOST_ID_BYTES];
    struct pollfd *pfds;  /* scratch for poll, [nranks] */
    int *pfd_rank;        /* [nranks] */
    uint8_t *setup_table; /* during setup: [nranks] x (listen address, host id) */
    int setup_error_told; /* rank 0: every rank it could reach was sent the setup error */
    maco_status_t failed; /* sticky: once a peer failed, every call returns this */
    int failed_culprit;   /* rank the failure is blamed on, or -1 */
    char failed_text[MACO__ABORT_TEXT_BYTES];
    /* Connections that ended without BYE, awaiting the grace period. */
    int64_t lost_at_ms; /* when the first ended; 0 when none */
    int first_lost;
    /* One thread at a time runs the calls (calls.c); maco__bootstrap_poll tries it without
     * waiting from any thread. */
    pthread_mutex_t lock;
    /* Revocation (maco__bootstrap_revoke): the rank that revoked (this one, or a peer whose
     * REVOKE frame arrived), or -1. Written once under `lock`, read by any thread (atomic). */
    int revoked_by;
    int revoke_told; /* this rank's REVOKE frames were sent (under `lock`) */
    /* An eventfd in every poll of the progress engine: a revoke from another thread writes it
     * so that a call blocked in poll returns at once. -1 when none could be made (the call
     * then notices within one poll period, at most 1 s). */
    int wake_fd;
    /* While 1 (maco__bootstrap_shrink's agreement), a link that ends or aborts marks only its
     * peer gone: the bootstrap does not fail, and calls ignore the sticky failure and the
     * revocation. */
    int tolerant;
    /* Called once, on the thread that reads it, when a peer's REVOKE frame arrives (the
     * communicator ends its device waits); NULL when none. */
    void (*on_revoke)(void *ctx, int by_rank);
    void *on_revoke_ctx;
    /* During setup of a bootstrap made by maco__bootstrap_shrink: says whether a rank of the
     * new bootstrap is already gone (its link in the parent ended), so setup fails at once
     * instead of waiting for it until the deadline. NULL otherwise. */
    int (*watch_gone)(void *ctx, int rank);
    void *watch_ctx;
    /* The next instance of the shrink agreement (agree.c): instances are numbered per
     * bootstrap, so messages of an earlier shrink are never taken for this one's. */
    uint32_t agree_seq;
};

/*
 * Runs a set of sends and receives to completion. `what` names the operation for messages.
 * Every queued frame and post is removed again before returning, also on failure.
 */
typedef struct maco__op {
    int peer;
    int is_send;
    maco__tx_t tx;
    maco__rx_post_t rx;
} maco__op_t;

/* ---- functions the bootstrap's files share: alloc.c defines maco__bs_alloc, maco__bs_free
 * and maco__peer_close_fd (the object), unique_id.c maco__take_root_socket, handshake.c
 * maco__write_all and maco__read_all, progress.c the rest (posting, queueing and running sends
 * and receives; the sticky failure). The files call each other one way: alloc < progress <
 * handshake < setup < calls.
 */
maco_bootstrap_t maco__bs_alloc(int rank, int nranks, uint64_t nonce, int64_t timeout_ms);
void maco__bs_free(maco_bootstrap_t bs);
void maco__peer_close_fd(maco__peer_t *p);
void maco__bs_post(maco_bootstrap_t bs, int src, maco__rx_post_t *post, uint32_t tag, void *buf,
                   size_t len);
void maco__bs_queue(maco_bootstrap_t bs, int dst, maco__tx_t *t, uint16_t kind, uint32_t tag,
                    const void *data, size_t len);
maco_status_t maco__bs_run(maco_bootstrap_t bs, maco__op_t *ops, int nops, const char *what);
/* Removes a frame of a call that ends from its peer's send queue; one partly written stays as
 * a copy the bootstrap owns (so the stream stays in frame). Caller holds the lock. */
void maco__bs_unqueue(maco_bootstrap_t bs, int dst, maco__tx_t *t);
/* When this rank revoked the bootstrap and its peers were not told yet: sends a REVOKE frame to
 * every peer whose link is open (written within 1 s, or dropped). Whoever holds the lock first
 * after the revoke does it (the revoking thread, or the call it ended), so no other call can
 * take the lock in between and wait for peers that wait for the frame. Caller holds the lock. */
void maco__bs_tell_revoke_once(maco_bootstrap_t bs);
maco_status_t maco__bs_sticky(maco_bootstrap_t bs);
/* The status a normal call gets now: MACO_ERR_REVOKED (naming who revoked), the sticky
 * failure, or MACO_OK. Not logged again. */
maco_status_t maco__bs_state(maco_bootstrap_t bs);
/* One round of the progress engine that only moves bytes: waits up to `deadline_ms` (at most
 * 1 s, and no longer once the wake fd fires) for any open link, reads and writes what is
 * ready. Peers whose link ended, aborted or broke the protocol are marked (their state); the
 * bootstrap is not failed here. MACO_OK, or MACO_ERR_SYSTEM / MACO_ERR_NO_MEMORY for a local
 * failure (logged). */
maco_status_t maco__bs_progress_links(maco_bootstrap_t bs, int64_t deadline_ms);
/* 1 when `peer`'s link can carry nothing more (it said goodbye, aborted, ended or broke the
 * protocol), else 0. Caller holds the lock. */
int maco__bs_peer_is_gone(maco_bootstrap_t bs, int peer);
/* Takes the oldest unexpected message with `tag` that has arrived from any peer in
 * [0, nranks) for which want[peer] is nonzero (NULL: any): moves it into *msg_p (the caller
 * frees msg->data and msg) and its sender into *from_p. 0 when one was taken, -1 when none. */
int maco__bs_take_any(maco_bootstrap_t bs, uint32_t tag, const char *want, maco__msg_t **msg_p,
                      int *from_p);
int maco__take_root_socket(uint64_t nonce);
maco_status_t maco__write_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                              const char *what);
/* Reads exactly `len` bytes from a non-blocking socket before the deadline; a closed
 * connection is MACO_ERR_REMOTE, the deadline MACO_ERR_TIMEOUT, both naming `what`. */
maco_status_t maco__read_all(int fd, void *buf, size_t len, int64_t deadline_ms, const char *what);

/* ---- handshake.c: the setup handshake (step 0 above), one for every kind of hello. */

/* A hello's fields. */
typedef struct maco__hello {
    uint16_t kind;
    uint32_t rank, nranks;
    uint8_t challenge[MACO__HS_CHALLENGE];
} maco__hello_t;

/* Writes a hello with a fresh random challenge (returned in h->challenge) into
 * out[MACO__HELLO_BYTES]; `listen_addr` and `host_id` may be NULL (zeros). */
void maco__hello_make(uint8_t *out, maco__hello_t *h, const maco__sockaddr_t *listen_addr,
                      const char *host_id);
/* Reads in[MACO__HELLO_BYTES] into *h: 0, or -1 when magic or version is not this build's. */
int maco__hello_read(const uint8_t *in, maco__hello_t *h);
/* The proof of the accepting side (`server` 1) or of the connecting side (0) for a handshake
 * over `hello` and the accepting side's `challenge`, under the job nonce. */
void maco__hello_proof(uint64_t nonce, int server, const uint8_t *hello,
                       const uint8_t challenge[MACO__HS_CHALLENGE], uint8_t out[MACO__HS_PROOF]);

/* The accepting side of one connection's handshake, advanced by maco__handshake_serve. */
typedef struct maco__hs_server {
    int stage;  /* 0: reading the hello; 1: reading the proof */
    size_t got; /* bytes of the message being read */
    uint8_t hello[MACO__HELLO_BYTES];
    uint8_t challenge[MACO__HS_CHALLENGE];
    uint8_t proof[MACO__HS_PROOF_BYTES];
} maco__hs_server_t;

/* What maco__handshake_serve found. */
enum {
    MACO__HS_MORE = 0,         /* nothing more to do until more bytes arrive */
    MACO__HS_DONE = 1,         /* the peer proved the nonce: hs->hello holds its hello */
    MACO__HS_CLOSED = 2,       /* the connection ended or failed before the end */
    MACO__HS_NOT_MACO = 3,     /* the first bytes are not MACO's magic */
    MACO__HS_OLD_VERSION = 4,  /* a hello of setup wire version 1 (the peer reads frames) */
    MACO__HS_BAD_HELLO = 5,    /* another version, or a kind this side does not accept */
    MACO__HS_BAD_PROOF = 6,    /* the peer's proof is wrong (it does not know the nonce) */
    MACO__HS_PEER_REFUSED = 7, /* the peer found our proof wrong (its nonce differs) */
};

/* Reads what `fd` (non-blocking) has for this handshake and advances it: after a whole
 * hello of kind `kind` it sends the challenge and proof, after the whole proof it checks
 * it. Returns one of MACO__HS_*; once it returned anything but MORE, the connection is done
 * with (DONE: it carries the peer's frames from now on). Never blocks. */
int maco__handshake_serve(maco__hs_server_t *hs, int fd, uint16_t kind, uint64_t nonce);

/* The connecting side of one connection's handshake. */
typedef struct maco__hs_client {
    int done;   /* 1 once both proofs are through: the connection carries frames */
    size_t got; /* bytes of the answer so far */
    uint64_t nonce;
    char who[160]; /* the peer and its address, for errors */
    uint8_t hello[MACO__HELLO_BYTES];
    uint8_t answer[MACO__HS_CHALLENGE_BYTES];
} maco__hs_client_t;

/* Starts the connecting side on `fd` (non-blocking): sends a hello of `kind` with this rank's
 * `rank`, `nranks`, `listen_addr` and `host_id` (either may be NULL) before `deadline_ms`.
 * `who` names the peer and its address in errors ("rank 0 at 10.0.0.1:29500"). */
maco_status_t maco__handshake_begin(maco__hs_client_t *hc, int fd, uint16_t kind, uint64_t nonce,
                                    int rank, int nranks, const maco__sockaddr_t *listen_addr,
                                    const char *host_id, int64_t deadline_ms, const char *who);
/* Reads what `fd` has of the accepting side's answer and, once it is whole, checks its proof
 * and sends this side's (hc->done then). Never waits for bytes that have not arrived. Errors:
 * MACO_ERR_REMOTE (the peer did not prove the nonce, answered outside the protocol, closed
 * the connection or refused this process, saying why), MACO_ERR_TIMEOUT (sending). */
maco_status_t maco__handshake_advance(maco__hs_client_t *hc, int fd, int64_t deadline_ms);
/* The MACO_ERR_TIMEOUT of a handshake whose answer did not come, naming the peer. */
maco_status_t maco__handshake_timed_out(const maco__hs_client_t *hc);

/*
 * The connecting side from start to end (maco__handshake_begin, then advance until done):
 * sends the hello, checks the accepting side's proof and sends this side's, before
 * `deadline_ms`. A signal interrupting a wait shortens it; the deadline holds. `stop` (may be
 * NULL) is asked every 200 ms while the answer has not come; its error ends the wait. Errors:
 * those of maco__handshake_advance and of `stop`; MACO_ERR_TIMEOUT naming the peer when its
 * answer does not come.
 */
maco_status_t maco__handshake_connect(int fd, uint16_t kind, uint64_t nonce, int rank, int nranks,
                                      const maco__sockaddr_t *listen_addr, const char *host_id,
                                      int64_t deadline_ms, const char *who,
                                      maco_status_t (*stop)(void *ctx), void *stop_ctx);

/* ---- torch_store.c: the unique id through torchrun's agent store (env.c uses it). */
/* Whether to use it: torchrun says its workers share the agent's store
 * (TORCHELASTIC_USE_AGENT_STORE=True) and MACO_BOOTSTRAP_ADDR does not name an address. */
int maco__torch_store_wanted(void);
/* Rank 0 creates a unique id and stores it; every rank waits (until MACO_BOOTSTRAP_TIMEOUT)
 * for the key of this creation and reads it into *id. Blocking. Errors: MACO_ERR_TIMEOUT
 * (store unreachable, or rank 0 published nothing in time), MACO_ERR_REMOTE (the store closed
 * the connection or answered outside the protocol), those of maco_unique_id_create. */
maco_status_t maco__torch_store_unique_id(const maco__sockaddr_t *store, const char *store_text,
                                          int rank, maco_unique_id_t *id);

#ifdef __cplusplus
}
#endif

#endif /* MACO_BOOTSTRAP_PRIVATE_H */
