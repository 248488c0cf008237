/*
 * bootstrap.c - TCP bootstrap: setup through rank 0, then a full mesh of connections.
 *
 * Setup protocol (all integers little-endian, every message starts with magic + version):
 *   1. Every rank r > 0 opens a listening socket, connects to rank 0 and sends HELLO
 *      {magic, version, kind=HELLO, nonce, rank, nranks, listen address, host id}.
 *   2. Rank 0 checks each HELLO: a wrong magic, version or nonce is a stray client, refused
 *      with a warning; a rank out of range, a duplicate rank or another world size fails the
 *      job, and rank 0 tells every joined rank why (INIT_ERROR frame). When all nranks-1
 *      ranks have joined, rank 0 sends everyone the TABLE of listen addresses and host ids.
 *      These connections stay as the mesh links between rank 0 and each rank.
 *   3. Rank r connects to every rank q in [1, r) and sends PEER_HELLO {magic, version,
 *      kind, nonce, rank, nranks}; it accepts one connection from every rank in (r, nranks).
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
#include "maco/bootstrap.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap_internal.h"
#include "config.h"
#include "log.h"
#include "socket.h"
#include "wire.h"

#define MACO__ID_MAGIC 0x4F43414Du /* "MACO" read as little-endian u32 */
#define MACO__ID_VERSION 1u
#define MACO__HOST_ID_BYTES 128

enum {
    MACO__KIND_HELLO = 1,
    MACO__KIND_PEER_HELLO = 2,
};

/* Frame kinds on established links. */
enum {
    MACO__FRAME_DATA = 0,
    MACO__FRAME_BYE = 1,
    MACO__FRAME_TABLE = 2,
    MACO__FRAME_INIT_ERROR = 3,
    MACO__FRAME_ABORT = 4, /* payload: u32 culprit rank (or ~0), i32 status, text */
};

enum {
    MACO__FRAME_HDR_BYTES = 16,
    /* HELLO: magic(4) version(2) kind(2) nonce(8) rank(4) nranks(4) addr(24) host id(128). */
    MACO__HELLO_BYTES = 24 + MACO__WIRE_ADDR_BYTES + MACO__HOST_ID_BYTES,
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
};

/* ------------------------------------------------------------------ host identity */

static pthread_once_t maco__host_once = PTHREAD_ONCE_INIT;
static char maco__host_text[MACO__HOST_ID_BYTES];

static void maco__host_id_init(void)
{
    if (maco__config_is_set(MACO_CFG_HOST_ID)) {
        snprintf(maco__host_text, sizeof(maco__host_text), "%s",
                 maco__config_string(MACO_CFG_HOST_ID));
        return;
    }
    char host[64] = "unknown";
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    snprintf(maco__host_text, sizeof(maco__host_text), "%s/%s", host, boot);
}

const char *maco__host_id(void)
{
    pthread_once(&maco__host_once, maco__host_id_init);
    return maco__host_text;
}

void maco__topology_compute(const char *const *ids, int nranks, int rank, maco__topology_t *t)
{
    const char *mine = ids[rank];
    t->local_rank = 0;
    t->local_nranks = 0;
    t->nnodes = 0;
    t->node = -1;
    for (int r = 0; r < nranks; r++) {
        int first = 1; /* the lowest rank of its node */
        for (int q = 0; q < r && first; q++)
            first = strcmp(ids[r], ids[q]) != 0;
        if (first) {
            if (strcmp(ids[r], mine) == 0)
                t->node = t->nnodes;
            t->nnodes++;
        }
        if (strcmp(ids[r], mine) == 0) {
            if (r < rank)
                t->local_rank++;
            t->local_nranks++;
        }
    }
}

/* ------------------------------------------------------------------ unique id */

static pthread_mutex_t maco__root_lock = PTHREAD_MUTEX_INITIALIZER;
/* Listening sockets of unique ids this process created, until their rank 0 takes them. Any
 * nonce is valid (0 too), so a slot says whether it is used with its own flag. */
static struct {
    int used;
    uint64_t nonce;
    int fd;
} maco__root_sockets[16];

void maco__unique_id_encode(maco_unique_id_t *id, uint64_t nonce, const maco__sockaddr_t *root)
{
    memset(id, 0, sizeof(*id));
    maco__put_u32(id->bytes, MACO__ID_MAGIC);
    maco__put_u16(id->bytes + 4, MACO__ID_VERSION);
    maco__put_u64(id->bytes + 8, nonce);
    maco__sockaddr_to_wire(root, id->bytes + 16);
}

maco_status_t maco__unique_id_decode(const maco_unique_id_t *id, uint64_t *nonce,
                                     maco__sockaddr_t *root)
{
    if (maco__get_u32(id->bytes) != MACO__ID_MAGIC)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "the unique id does not start with MACO's magic: it was not made by "
                           "maco_unique_id_create or it was damaged in transit");
    if (maco__get_u16(id->bytes + 4) != MACO__ID_VERSION)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "the unique id has version %u; this MACO reads version %u",
                           maco__get_u16(id->bytes + 4), MACO__ID_VERSION);
    maco__sockaddr_t addr;
    if (maco__sockaddr_from_wire(id->bytes + 16, &addr) != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "the unique id holds no valid root address");
    *nonce = maco__get_u64(id->bytes + 8);
    *root = addr;
    return MACO_OK;
}

maco_status_t maco_unique_id_create(maco_unique_id_t *id_p)
{
    if (id_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_unique_id_create: id_p is NULL");
    maco__sockaddr_t addr;
    maco_status_t st = maco__socket_default_address(&addr);
    if (st != MACO_OK)
        return st;
    int fd;
    st = maco__socket_listen(&addr, &fd);
    if (st != MACO_OK)
        return st;
    uint64_t nonce = maco__random_u64();
    pthread_mutex_lock(&maco__root_lock);
    int slot = -1;
    for (int i = 0; i < 16 && slot < 0; i++)
        if (!maco__root_sockets[i].used)
            slot = i;
    if (slot >= 0) {
        maco__root_sockets[slot].used = 1;
        maco__root_sockets[slot].nonce = nonce;
        maco__root_sockets[slot].fd = fd;
    }
    pthread_mutex_unlock(&maco__root_lock);
    if (slot < 0) {
        close(fd);
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_BOOTSTRAP,
                           "maco_unique_id_create: 16 unique ids of this process are waiting "
                           "for their rank 0 to call maco_bootstrap_create; use some first");
    }
    maco__unique_id_encode(id_p, nonce, &addr);
    return MACO_OK;
}

/* Takes the listening socket a unique id of this process opened, if any. */
static int maco__take_root_socket(uint64_t nonce)
{
    int fd = -1;
    pthread_mutex_lock(&maco__root_lock);
    for (int i = 0; i < 16; i++) {
        if (maco__root_sockets[i].used && maco__root_sockets[i].nonce == nonce) {
            fd = maco__root_sockets[i].fd;
            maco__root_sockets[i].used = 0;
            maco__root_sockets[i].fd = -1;
            break;
        }
    }
    pthread_mutex_unlock(&maco__root_lock);
    return fd;
}

/* ------------------------------------------------------------------ failure handling */

static maco_status_t maco__bs_vfail(maco_bootstrap_t bs, maco_status_t status, int culprit,
                                    const char *fmt, va_list ap)
{
    if (bs->failed == MACO_OK) {
        vsnprintf(bs->failed_text, sizeof(bs->failed_text), fmt, ap);
        bs->failed = status;
        bs->failed_culprit = culprit;
        maco__error(status, MACO_SUBSYS_BOOTSTRAP, "rank %d: %s", bs->rank, bs->failed_text);
    }
    return bs->failed;
}

static maco_status_t maco__bs_fail(maco_bootstrap_t bs, maco_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static maco_status_t maco__bs_fail_peer(maco_bootstrap_t bs, maco_status_t status, int culprit,
                                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Marks the bootstrap failed (first failure wins), logging it once. */
static maco_status_t maco__bs_fail(maco_bootstrap_t bs, maco_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    maco__bs_vfail(bs, status, -1, fmt, ap);
    va_end(ap);
    return bs->failed;
}

/* As maco__bs_fail, blaming rank `culprit` (reported to peers in the ABORT frame). */
static maco_status_t maco__bs_fail_peer(maco_bootstrap_t bs, maco_status_t status, int culprit,
                                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    maco__bs_vfail(bs, status, culprit, fmt, ap);
    va_end(ap);
    return bs->failed;
}

/* The sticky failure, as this call's status (not logged again). */
static maco_status_t maco__bs_sticky(maco_bootstrap_t bs)
{
    return maco__error_quiet(bs->failed, "rank %d: %s", bs->rank, bs->failed_text);
}

/* ------------------------------------------------------------------ link I/O */

static void maco__peer_close_fd(maco__peer_t *p)
{
    if (p->fd >= 0) {
        close(p->fd);
        p->fd = -1;
    }
}

/* A connection ended or broke without BYE. The failure is reported after a grace period
 * (maco__bs_progress), unless an ABORT frame explains it first. */
static void maco__bs_peer_lost(maco_bootstrap_t bs, int src)
{
    maco__peer_t *p = &bs->peers[src];
    p->state = MACO__PEER_LOST;
    maco__peer_close_fd(p);
    if (bs->lost_at_ms == 0) {
        bs->lost_at_ms = maco__now_ms();
        bs->first_lost = src;
    }
    MACO_DEBUG(MACO_SUBSYS_BOOTSTRAP, "connection to rank %d ended without goodbye", src);
}

/* An ABORT frame: the peer failed and says whom it blames. */
static maco_status_t maco__bs_on_abort(maco_bootstrap_t bs, int src, const uint8_t *data,
                                       size_t len)
{
    char text[MACO__ABORT_TEXT_BYTES] = "";
    int culprit = src;
    if (len >= 8) {
        uint32_t c = maco__get_u32(data);
        if (c < (uint32_t)bs->nranks)
            culprit = (int)c;
        size_t tlen = len - 8 < sizeof(text) - 1 ? len - 8 : sizeof(text) - 1;
        memcpy(text, data + 8, tlen);
        text[tlen] = '\0';
    }
    if (culprit != src)
        return maco__bs_fail_peer(bs, MACO_ERR_REMOTE, culprit,
                                  "rank %d failed (reported by rank %d, which stopped): %s",
                                  culprit, src, text);
    return maco__bs_fail_peer(bs, MACO_ERR_REMOTE, culprit, "rank %d failed and stopped: %s", src,
                              text);
}

/* A frame header has arrived: decide where its payload goes. */
static maco_status_t maco__rx_frame_start(maco_bootstrap_t bs, int src, maco__peer_t *p)
{
    p->kind = maco__get_u16(p->hdr);
    p->tag = maco__get_u32(p->hdr + 4);
    uint64_t len = maco__get_u64(p->hdr + 8);
    p->payload_len = (size_t)len;
    p->payload_got = 0;
    p->rx_target = NULL;
    p->rx_msg = NULL;
    p->payload_dst = NULL;
    if (p->kind == MACO__FRAME_BYE) {
        p->state = MACO__PEER_BYE;
        MACO_DEBUG(MACO_SUBSYS_BOOTSTRAP, "rank %d said goodbye", src);
        return MACO_OK;
    }
    if (p->kind == MACO__FRAME_ABORT && len <= MACO__ABORT_TEXT_BYTES + 8) {
        maco__msg_t *m = (maco__msg_t *)calloc(1, sizeof(*m));
        uint8_t *data = (uint8_t *)malloc(len ? len : 1);
        if (m == NULL || data == NULL) {
            free(m);
            free(data);
            return maco__bs_fail(bs, MACO_ERR_NO_MEMORY, "no host memory for an abort frame");
        }
        m->len = p->payload_len;
        m->data = data;
        p->rx_msg = m;
        p->payload_dst = data;
        p->payload_cap = p->payload_len;
        return MACO_OK;
    }
    if (p->kind != MACO__FRAME_DATA || len > ((uint64_t)1 << 40))
        return maco__bs_fail(bs, MACO_ERR_REMOTE,
                             "rank %d sent an invalid frame (kind %u, length %llu): protocol "
                             "error or a different MACO version",
                             src, (unsigned)p->kind, (unsigned long long)len);
    /* The oldest posted receive for this tag takes it, unless an older message with the
     * same tag is already waiting (posting checks the unexpected list first, so that
     * cannot happen while a matching post exists). */
    for (maco__rx_post_t *post = p->posts_head; post != NULL; post = post->next) {
        if (!post->done && post->tag == p->tag && post->buf != NULL) {
            if (post->len == p->payload_len) {
                p->rx_target = post;
                p->payload_dst = (uint8_t *)post->buf;
                p->payload_cap = p->payload_len;
                post->buf = NULL; /* claimed */
                if (p->payload_len == 0) {
                    post->done = 1;
                    p->rx_target = NULL;
                }
                return MACO_OK;
            }
            /* Size mismatch: consume the message into a scratch buffer and fail the post. */
            break;
        }
    }
    maco__msg_t *m = (maco__msg_t *)calloc(1, sizeof(*m));
    size_t first = p->payload_len < MACO__RX_FIRST_CHUNK ? p->payload_len : MACO__RX_FIRST_CHUNK;
    uint8_t *data = first ? (uint8_t *)malloc(first) : NULL;
    if (m == NULL || (first && data == NULL)) {
        free(m);
        free(data);
        return maco__bs_fail(bs, MACO_ERR_NO_MEMORY,
                             "no host memory for a %zu-byte message from rank %d", p->payload_len,
                             src);
    }
    m->tag = p->tag;
    m->len = p->payload_len;
    m->data = data;
    p->rx_msg = m;
    p->payload_dst = data;
    p->payload_cap = first;
    if (p->payload_len == 0)
        p->in_payload = 0;
    return MACO_OK;
}

/* Completes a received message that had no posted receive (or a mismatching one). */
static void maco__rx_message_done(maco__peer_t *p, int src)
{
    maco__msg_t *m = p->rx_msg;
    p->rx_msg = NULL;
    /* A receive may have been posted while the payload was arriving (or one of another
     * size was waiting when the header came): deliver to it, or fail it naming both sizes.
     * No older message with this tag can be queued, since posting consumes those first. */
    for (maco__rx_post_t *post = p->posts_head; post != NULL; post = post->next) {
        if (!post->done && post->tag == m->tag && post->buf != NULL) {
            post->done = 1;
            if (post->len == m->len) {
                if (m->len)
                    memcpy(post->buf, m->data, m->len);
            } else {
                post->status = maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_BOOTSTRAP,
                                           "rank %d sent %zu bytes with tag 0x%x but this rank "
                                           "expected %zu bytes",
                                           src, m->len, m->tag, post->len);
            }
            post->buf = NULL;
            free(m->data);
            free(m);
            return;
        }
    }
    if (p->unexpected_tail)
        p->unexpected_tail->next = m;
    else
        p->unexpected_head = m;
    p->unexpected_tail = m;
}

/* Reads everything available on one link. */
static maco_status_t maco__peer_read(maco_bootstrap_t bs, int src)
{
    maco__peer_t *p = &bs->peers[src];
    for (;;) {
        ssize_t n;
        if (!p->in_payload) {
            n = recv(p->fd, p->hdr + p->hdr_got, MACO__FRAME_HDR_BYTES - p->hdr_got, 0);
        } else {
            if (p->payload_got == p->payload_cap && p->rx_msg != NULL) {
                /* The buffered message's piece is full: grow it for the bytes to come. */
                size_t cap = p->payload_cap * 2;
                if (cap > p->payload_len || cap < p->payload_cap)
                    cap = p->payload_len;
                uint8_t *grown = (uint8_t *)realloc(p->rx_msg->data, cap);
                if (grown == NULL)
                    return maco__bs_fail(bs, MACO_ERR_NO_MEMORY,
                                         "no host memory to buffer %zu of the %zu bytes rank %d "
                                         "is sending",
                                         cap, p->payload_len, src);
                p->rx_msg->data = grown;
                p->payload_dst = grown;
                p->payload_cap = cap;
            }
            size_t want = p->payload_cap - p->payload_got;
            n = recv(p->fd, p->payload_dst + p->payload_got, want, 0);
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return MACO_OK;
            if (errno == EINTR)
                continue;
            if (p->state == MACO__PEER_BYE) {
                p->state = MACO__PEER_CLOSED;
                maco__peer_close_fd(p);
                return MACO_OK;
            }
            maco__bs_peer_lost(bs, src);
            return MACO_OK;
        }
        if (n == 0) {
            if (p->state == MACO__PEER_BYE) {
                p->state = MACO__PEER_CLOSED;
                maco__peer_close_fd(p);
                return MACO_OK;
            }
            maco__bs_peer_lost(bs, src);
            return MACO_OK;
        }
        if (!p->in_payload) {
            p->hdr_got += (size_t)n;
            if (p->hdr_got < MACO__FRAME_HDR_BYTES)
                continue;
            p->hdr_got = 0;
            p->in_payload = 1;
            maco_status_t st = maco__rx_frame_start(bs, src, p);
            if (st != MACO_OK)
                return st;
            if (p->kind == MACO__FRAME_BYE || p->payload_len == 0) {
                p->in_payload = 0;
                if (p->kind == MACO__FRAME_ABORT) {
                    maco_status_t ast = maco__bs_on_abort(bs, src, NULL, 0);
                    free(p->rx_msg->data);
                    free(p->rx_msg);
                    p->rx_msg = NULL;
                    return ast;
                }
                if (p->kind == MACO__FRAME_DATA && p->rx_msg != NULL)
                    maco__rx_message_done(p, src);
                continue;
            }
        } else {
            p->payload_got += (size_t)n;
            if (p->payload_got < p->payload_len)
                continue;
            p->in_payload = 0;
            if (p->kind == MACO__FRAME_ABORT) {
                maco_status_t ast = maco__bs_on_abort(bs, src, p->rx_msg->data, p->rx_msg->len);
                free(p->rx_msg->data);
                free(p->rx_msg);
                p->rx_msg = NULL;
                return ast;
            }
            if (p->rx_target != NULL) {
                p->rx_target->done = 1;
                p->rx_target = NULL;
            } else if (p->rx_msg != NULL) {
                maco__rx_message_done(p, src);
            }
        }
    }
}

/* Writes as much of the link's send queue as the socket takes. */
static maco_status_t maco__peer_write(maco_bootstrap_t bs, int dst)
{
    maco__peer_t *p = &bs->peers[dst];
    while (p->tx_head != NULL) {
        maco__tx_t *t = p->tx_head;
        const uint8_t *buf;
        size_t left;
        if (t->hdr_sent < MACO__FRAME_HDR_BYTES) {
            buf = t->hdr + t->hdr_sent;
            left = MACO__FRAME_HDR_BYTES - t->hdr_sent;
        } else {
            buf = t->data + t->sent;
            left = t->len - t->sent;
        }
        if (left > 0) {
            ssize_t n = send(p->fd, buf, left, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    return MACO_OK;
                if (errno == EINTR)
                    continue;
                maco__bs_peer_lost(bs, dst);
                return MACO_OK;
            }
            if (t->hdr_sent < MACO__FRAME_HDR_BYTES)
                t->hdr_sent += (size_t)n;
            else
                t->sent += (size_t)n;
            continue;
        }
        p->tx_head = t->next;
        if (p->tx_head == NULL)
            p->tx_tail = NULL;
        t->next = NULL;
        t->hdr_sent = (size_t)-1; /* marks completion for the caller */
    }
    return MACO_OK;
}

/*
 * One round of progress: waits up to the deadline (at most 1 s per poll) for any link to
 * become readable or, where sends are queued, writable, then services every ready link.
 */
static maco_status_t maco__bs_progress(maco_bootstrap_t bs, int64_t deadline_ms)
{
    if (bs->failed != MACO_OK)
        return maco__bs_sticky(bs);
    int n = 0;
    for (int r = 0; r < bs->nranks; r++) {
        maco__peer_t *p = &bs->peers[r];
        if (r == bs->rank || p->fd < 0)
            continue;
        bs->pfds[n].fd = p->fd;
        bs->pfds[n].events = (short)(POLLIN | (p->tx_head ? POLLOUT : 0));
        bs->pfds[n].revents = 0;
        bs->pfd_rank[n] = r;
        n++;
    }
    int64_t left = deadline_ms - maco__now_ms();
    if (left < 0)
        left = 0;
    if (bs->lost_at_ms != 0 && left > 20)
        left = 20; /* in the grace period: come back soon to report */
    int rc = poll(bs->pfds, (nfds_t)n, (int)(left > 1000 ? 1000 : left));
    if (rc < 0) {
        if (errno == EINTR)
            return MACO_OK;
        return maco__bs_fail(bs, MACO_ERR_SYSTEM, "poll failed: %s", strerror(errno));
    }
    for (int i = 0; i < n && rc > 0; i++) {
        if (bs->pfds[i].revents == 0)
            continue;
        int r = bs->pfd_rank[i];
        maco_status_t st = MACO_OK;
        if (bs->pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
            st = maco__peer_read(bs, r);
        if (st == MACO_OK && (bs->pfds[i].revents & POLLOUT) && bs->peers[r].fd >= 0)
            st = maco__peer_write(bs, r);
        if (st != MACO_OK)
            return st;
    }
    if (bs->lost_at_ms != 0 && maco__now_ms() - bs->lost_at_ms >= MACO__LOST_GRACE_MS) {
        char others[128] = "";
        size_t used = 0;
        for (int r = 0; r < bs->nranks && used + 12 < sizeof(others); r++)
            if (r != bs->first_lost && bs->peers[r].state == MACO__PEER_LOST)
                used += (size_t)snprintf(others + used, sizeof(others) - used, "%s%d",
                                         used ? ", " : "; the connections to ranks ", r);
        return maco__bs_fail_peer(bs, MACO_ERR_REMOTE, bs->first_lost,
                                  "rank %d closed its connection without maco_bootstrap_destroy "
                                  "(did it crash or exit early?)%s%s",
                                  bs->first_lost, others, used ? " ended too" : "");
    }
    return MACO_OK;
}

/* Queues a frame (data is not copied; it must live until the frame is sent). */
static void maco__bs_queue(maco_bootstrap_t bs, int dst, maco__tx_t *t, uint16_t kind, uint32_t tag,
                           const void *data, size_t len)
{
    memset(t, 0, sizeof(*t));
    maco__put_u16(t->hdr, kind);
    maco__put_u32(t->hdr + 4, tag);
    maco__put_u64(t->hdr + 8, (uint64_t)len);
    t->data = (const uint8_t *)data;
    t->len = len;
    maco__peer_t *p = &bs->peers[dst];
    if (p->tx_tail)
        p->tx_tail->next = t;
    else
        p->tx_head = t;
    p->tx_tail = t;
}

static int maco__tx_done(const maco__tx_t *t)
{
    return t->hdr_sent == (size_t)-1;
}

/* Posts a receive, or completes it at once from an unexpected message. */
static void maco__bs_post(maco_bootstrap_t bs, int src, maco__rx_post_t *post, uint32_t tag,
                          void *buf, size_t len)
{
    memset(post, 0, sizeof(*post));
    post->tag = tag;
    post->len = len;
    post->status = MACO_OK;
    maco__peer_t *p = &bs->peers[src];
    maco__msg_t *prev = NULL;
    for (maco__msg_t *m = p->unexpected_head; m != NULL; prev = m, m = m->next) {
        if (m->tag != tag)
            continue;
        if (prev)
            prev->next = m->next;
        else
            p->unexpected_head = m->next;
        if (p->unexpected_tail == m)
            p->unexpected_tail = prev;
        if (m->len == len) {
            if (len)
                memcpy(buf, m->data, len);
        } else {
            post->status = maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_BOOTSTRAP,
                                       "rank %d sent %zu bytes with tag 0x%x but this rank "
                                       "expected %zu bytes",
                                       src, m->len, tag, len);
        }
        free(m->data);
        free(m);
        post->done = 1;
        return;
    }
    post->buf = len ? buf : (void *)post; /* a non-NULL marker for 0-byte receives */
    if (p->posts_tail)
        p->posts_tail->next = post;
    else
        p->posts_head = post;
    p->posts_tail = post;
}

/* Removes completed posts from the head of each peer's list. */
static void maco__bs_unpost(maco_bootstrap_t bs, int src, maco__rx_post_t *post)
{
    maco__peer_t *p = &bs->peers[src];
    maco__rx_post_t *prev = NULL;
    for (maco__rx_post_t *it = p->posts_head; it != NULL; prev = it, it = it->next) {
        if (it != post)
            continue;
        if (prev)
            prev->next = it->next;
        else
            p->posts_head = it->next;
        if (p->posts_tail == it)
            p->posts_tail = prev;
        it->next = NULL;
        return;
    }
}

/* Removes unsent frames of an aborted call from the send queues. */
static void maco__bs_unqueue(maco_bootstrap_t bs, int dst, maco__tx_t *t)
{
    maco__peer_t *p = &bs->peers[dst];
    maco__tx_t *prev = NULL;
    for (maco__tx_t *it = p->tx_head; it != NULL; prev = it, it = it->next) {
        if (it != t)
            continue;
        if (it->hdr_sent != 0 && !maco__tx_done(it)) {
            /* Partly written: the stream is now out of frame; nothing more may follow. */
            p->tx_broken = 1;
            maco__bs_fail(bs, MACO_ERR_INTERNAL,
                          "a call was abandoned in the middle of a send to rank %d", dst);
        }
        if (prev)
            prev->next = it->next;
        else
            p->tx_head = it->next;
        if (p->tx_tail == it)
            p->tx_tail = prev;
        return;
    }
}

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

static maco_status_t maco__bs_run(maco_bootstrap_t bs, maco__op_t *ops, int nops, const char *what)
{
    int64_t deadline = maco__deadline_ms(bs->timeout_ms);
    maco_status_t st = MACO_OK;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < nops; i++) {
            maco__op_t *op = &ops[i];
            if (op->is_send) {
                if (maco__tx_done(&op->tx))
                    continue;
                if (bs->peers[op->peer].state == MACO__PEER_BYE ||
                    bs->peers[op->peer].state == MACO__PEER_CLOSED) {
                    st = maco__bs_fail(bs, MACO_ERR_REMOTE,
                                       "%s: rank %d left the job (maco_bootstrap_destroy) "
                                       "before this rank could send to it",
                                       what, op->peer);
                    goto out;
                }
                pending++;
            } else if (!op->rx.done) {
                maco__peer_t *p = &bs->peers[op->peer];
                if ((p->state == MACO__PEER_BYE || p->state == MACO__PEER_CLOSED) &&
                    !p->in_payload) {
                    st = maco__bs_fail(bs, MACO_ERR_REMOTE,
                                       "%s: rank %d left the job (maco_bootstrap_destroy) "
                                       "while this rank waited for its data",
                                       what, op->peer);
                    goto out;
                }
                pending++;
            } else if (op->rx.status != MACO_OK) {
                st = op->rx.status;
                goto out;
            }
        }
        if (pending == 0)
            break;
        if (maco__now_ms() >= deadline) {
            char missing[256] = "";
            size_t used = 0;
            int listed = 0;
            for (int i = 0; i < nops && used + 16 < sizeof(missing); i++) {
                int waiting = ops[i].is_send ? !maco__tx_done(&ops[i].tx) : !ops[i].rx.done;
                if (!waiting)
                    continue;
                if (listed == 8) {
                    used += (size_t)snprintf(missing + used, sizeof(missing) - used, " ...");
                    break;
                }
                used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%s %d",
                                         listed ? "," : "", ops[i].is_send ? " to" : " from",
                                         ops[i].peer);
                listed++;
            }
            st = maco__bs_fail(bs, MACO_ERR_TIMEOUT,
                               "%s timed out after %lld ms; still waiting on rank(s):%s "
                               "(MACO_BOOTSTRAP_TIMEOUT sets the deadline)",
                               what, (long long)bs->timeout_ms, missing);
            goto out;
        }
        st = maco__bs_progress(bs, deadline);
        if (st != MACO_OK)
            goto out;
    }
out:
    for (int i = 0; i < nops; i++) {
        if (ops[i].is_send)
            maco__bs_unqueue(bs, ops[i].peer, &ops[i].tx);
        else
            maco__bs_unpost(bs, ops[i].peer, &ops[i].rx);
    }
    /* A receive whose frame is still arriving must not write into the caller's buffer
     * after we return: hand the rest of that frame to a scratch message. */
    if (st != MACO_OK) {
        for (int i = 0; i < nops; i++) {
            maco__peer_t *p = &bs->peers[ops[i].peer];
            if (!ops[i].is_send && p->rx_target == &ops[i].rx) {
                p->rx_target = NULL;
                maco__bs_fail(bs, MACO_ERR_INTERNAL,
                              "a call was abandoned while receiving from rank %d", ops[i].peer);
            }
        }
    }
    return st;
}

/* ------------------------------------------------------------------ public calls */

static maco_status_t maco__bs_check(maco_bootstrap_t bs, const char *fn)
{
    if (bs == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP, "%s: bs is NULL", fn);
    if (bs->failed != MACO_OK)
        return maco__bs_sticky(bs);
    return MACO_OK;
}

static maco_status_t maco__check_peer(maco_bootstrap_t bs, const char *fn, int peer)
{
    if (peer < 0 || peer >= bs->nranks || peer == bs->rank)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s: peer %d is not another rank of this job (rank %d of %d)", fn, peer,
                           bs->rank, bs->nranks);
    return MACO_OK;
}

/* Arguments of a point-to-point call: a usable bootstrap, another rank, data for bytes. */
static maco_status_t maco__check_p2p(maco_bootstrap_t bs, const char *fn, int peer,
                                     const void *data, size_t bytes)
{
    maco_status_t st = maco__bs_check(bs, fn);
    if (st == MACO_OK)
        st = maco__check_peer(bs, fn, peer);
    if (st == MACO_OK && data == NULL && bytes > 0)
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                         "%s: data is NULL but bytes is %zu", fn, bytes);
    return st;
}

maco_status_t maco__bootstrap_send(maco_bootstrap_t bs, int peer, uint32_t tag, const void *data,
                                   size_t bytes)
{
    MACO__LOG_RANK_SCOPE(bs != NULL ? bs->rank : -1);
    maco_status_t st = maco__check_p2p(bs, "maco_bootstrap_send", peer, data, bytes);
    if (st != MACO_OK)
        return st;
    maco__op_t op;
    memset(&op, 0, sizeof(op));
    op.peer = peer;
    op.is_send = 1;
    maco__bs_queue(bs, peer, &op.tx, MACO__FRAME_DATA, tag, data, bytes);
    return maco__bs_run(bs, &op, 1, "send");
}

maco_status_t maco__bootstrap_recv(maco_bootstrap_t bs, int peer, uint32_t tag, void *data,
                                   size_t bytes)
{
    MACO__LOG_RANK_SCOPE(bs != NULL ? bs->rank : -1);
    maco_status_t st = maco__check_p2p(bs, "maco_bootstrap_recv", peer, data, bytes);
    if (st != MACO_OK)
        return st;
    maco__op_t op;
    memset(&op, 0, sizeof(op));
    op.peer = peer;
    maco__bs_post(bs, peer, &op.rx, tag, data, bytes);
    char what[64];
    snprintf(what, sizeof(what), "receive (tag 0x%x)", tag);
    return maco__bs_run(bs, &op, 1, what);
}

maco_status_t maco_bootstrap_send(maco_bootstrap_t bs, int peer, uint32_t tag, const void *data,
                                  size_t bytes)
{
    MACO__LOG_RANK_SCOPE(bs != NULL ? bs->rank : -1);
    if (tag >= MACO_BOOTSTRAP_MAX_USER_TAG)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_send: tag 0x%x is reserved (user tags are below 0x%x)",
                           tag, MACO_BOOTSTRAP_MAX_USER_TAG);
    return maco__bootstrap_send(bs, peer, tag, data, bytes);
}

maco_status_t maco_bootstrap_recv(maco_bootstrap_t bs, int peer, uint32_t tag, void *data,
                                  size_t bytes)
{
    MACO__LOG_RANK_SCOPE(bs != NULL ? bs->rank : -1);
    if (tag >= MACO_BOOTSTRAP_MAX_USER_TAG)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_recv: tag 0x%x is reserved (user tags are below 0x%x)",
                           tag, MACO_BOOTSTRAP_MAX_USER_TAG);
    return maco__bootstrap_recv(bs, peer, tag, data, bytes);
}

maco_status_t maco_bootstrap_allgather(maco_bootstrap_t bs, void *buffer, size_t bytes_per_rank)
{
    MACO__LOG_RANK_SCOPE(bs != NULL ? bs->rank : -1);
    maco_status_t st = maco__bs_check(bs, "maco_bootstrap_allgather");
    if (st != MACO_OK)
        return st;
    if (buffer == NULL && bytes_per_rank > 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_allgather: buffer is NULL but bytes_per_rank is %zu",
                           bytes_per_rank);
    if (bs->nranks == 1)
        return MACO_OK;
    int nops = 2 * (bs->nranks - 1);
    maco__op_t *ops = (maco__op_t *)calloc((size_t)nops, sizeof(*ops));
    if (ops == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "allgather: no memory");
    uint8_t *base = (uint8_t *)buffer;
    const uint8_t *mine = base ? base + (size_t)bs->rank * bytes_per_rank : NULL;
    int k = 0;
    /* Receives first, so data can land in place as soon as it arrives. */
    for (int r = 0; r < bs->nranks; r++) {
        if (r == bs->rank)
            continue;
        ops[k].peer = r;
        maco__bs_post(bs, r, &ops[k].rx, MACO__TAG_ALLGATHER,
                      base ? base + (size_t)r * bytes_per_rank : NULL, bytes_per_rank);
        k++;
    }
    /* Send to ranks after this one first, so the load spreads instead of all ranks
     * writing to rank 0 at once. */
    for (int i = 1; i < bs->nranks; i++) {
        int r = (bs->rank + i) % bs->nranks;
        ops[k].peer = r;
        ops[k].is_send = 1;
        maco__bs_queue(bs, r, &ops[k].tx, MACO__FRAME_DATA, MACO__TAG_ALLGATHER, mine,
                       bytes_per_rank);
        k++;
    }
    st = maco__bs_run(bs, ops, nops, "allgather");
    free(ops);
    return st;
}

maco_status_t maco_bootstrap_barrier(maco_bootstrap_t bs)
{
    return maco_bootstrap_allgather(bs, NULL, 0);
}

maco_status_t maco_bootstrap_broadcast(maco_bootstrap_t bs, int root, void *buffer, size_t bytes)
{
    MACO__LOG_RANK_SCOPE(bs != NULL ? bs->rank : -1);
    maco_status_t st = maco__bs_check(bs, "maco_bootstrap_broadcast");
    if (st != MACO_OK)
        return st;
    if (root < 0 || root >= bs->nranks)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_broadcast: root %d is outside [0, %d)", root,
                           bs->nranks);
    if (buffer == NULL && bytes > 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_broadcast: buffer is NULL but bytes is %zu", bytes);
    if (bs->nranks == 1)
        return MACO_OK;
    if (bs->rank != root) {
        maco__op_t op;
        memset(&op, 0, sizeof(op));
        op.peer = root;
        maco__bs_post(bs, root, &op.rx, MACO__TAG_BROADCAST, buffer, bytes);
        return maco__bs_run(bs, &op, 1, "broadcast");
    }
    int nops = bs->nranks - 1;
    maco__op_t *ops = (maco__op_t *)calloc((size_t)nops, sizeof(*ops));
    if (ops == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "broadcast: no memory");
    int k = 0;
    for (int r = 0; r < bs->nranks; r++) {
        if (r == root)
            continue;
        ops[k].peer = r;
        ops[k].is_send = 1;
        maco__bs_queue(bs, r, &ops[k].tx, MACO__FRAME_DATA, MACO__TAG_BROADCAST, buffer, bytes);
        k++;
    }
    st = maco__bs_run(bs, ops, nops, "broadcast");
    free(ops);
    return st;
}

maco_status_t maco_bootstrap_get_rank(maco_bootstrap_t bs, int *rank_p)
{
    if (bs == NULL || rank_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_get_rank: NULL argument");
    *rank_p = bs->rank;
    return MACO_OK;
}

maco_status_t maco_bootstrap_get_nranks(maco_bootstrap_t bs, int *nranks_p)
{
    if (bs == NULL || nranks_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_get_nranks: NULL argument");
    *nranks_p = bs->nranks;
    return MACO_OK;
}

maco_status_t maco_bootstrap_get_host_id(maco_bootstrap_t bs, int rank, const char **host_id_p)
{
    if (bs == NULL || host_id_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_get_host_id: NULL argument");
    if (rank < 0 || rank >= bs->nranks)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_get_host_id: rank %d is outside [0, %d)", rank,
                           bs->nranks);
    *host_id_p = bs->host_ids[rank];
    return MACO_OK;
}

maco_status_t maco__bootstrap_peer_alive(maco_bootstrap_t bs, int peer)
{
    if (bs == NULL || peer < 0 || peer >= bs->nranks || peer == bs->rank)
        return MACO_OK;
    maco_status_t failed = (maco_status_t)__atomic_load_n((int *)&bs->failed, __ATOMIC_ACQUIRE);
    if (failed != MACO_OK)
        return maco__error_quiet(failed, "the job failed: %s", bs->failed_text);
    int state = __atomic_load_n(&bs->peers[peer].state, __ATOMIC_ACQUIRE);
    int fd = __atomic_load_n(&bs->peers[peer].fd, __ATOMIC_ACQUIRE);
    if (state == MACO__PEER_BYE || state == MACO__PEER_CLOSED)
        return maco__error_quiet(MACO_ERR_REMOTE,
                                 "rank %d left the job (it destroyed its bootstrap)", peer);
    int lost = state == MACO__PEER_LOST || fd < 0;
    if (!lost) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        lost = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    if (lost)
        return maco__error_quiet(MACO_ERR_REMOTE,
                                 "rank %d's connection ended without goodbye (it exited or "
                                 "crashed)",
                                 peer);
    return MACO_OK;
}

int maco__bootstrap_link_fd(maco_bootstrap_t bs, int peer)
{
    return bs == NULL || peer < 0 || peer >= bs->nranks ? -1 : bs->peers[peer].fd;
}

int64_t maco__bootstrap_timeout_ms(maco_bootstrap_t bs)
{
    return bs->timeout_ms;
}

/* ------------------------------------------------------------------ setup */

static maco_bootstrap_t maco__bs_alloc(int rank, int nranks, uint64_t nonce, int64_t timeout_ms)
{
    maco_bootstrap_t bs = (maco_bootstrap_t)calloc(1, sizeof(*bs));
    if (bs == NULL)
        return NULL;
    bs->rank = rank;
    bs->nranks = nranks;
    bs->nonce = nonce;
    bs->timeout_ms = timeout_ms;
    bs->listen_fd = -1;
    bs->peers = (maco__peer_t *)calloc((size_t)nranks, sizeof(*bs->peers));
    bs->host_ids = calloc((size_t)nranks, MACO__HOST_ID_BYTES);
    bs->pfds = (struct pollfd *)calloc((size_t)nranks + 1, sizeof(*bs->pfds));
    bs->pfd_rank = (int *)calloc((size_t)nranks + 1, sizeof(int));
    if (bs->peers == NULL || bs->host_ids == NULL || bs->pfds == NULL || bs->pfd_rank == NULL) {
        free(bs->peers);
        free(bs->host_ids);
        free(bs->pfds);
        free(bs->pfd_rank);
        free(bs);
        return NULL;
    }
    for (int r = 0; r < nranks; r++)
        bs->peers[r].fd = -1;
    return bs;
}

static void maco__bs_free(maco_bootstrap_t bs)
{
    if (bs == NULL)
        return;
    for (int r = 0; r < bs->nranks; r++) {
        maco__peer_t *p = &bs->peers[r];
        maco__peer_close_fd(p);
        while (p->unexpected_head) {
            maco__msg_t *m = p->unexpected_head;
            p->unexpected_head = m->next;
            free(m->data);
            free(m);
        }
        if (p->rx_msg) {
            free(p->rx_msg->data);
            free(p->rx_msg);
        }
    }
    if (bs->listen_fd >= 0)
        close(bs->listen_fd);
    free(bs->peers);
    free(bs->host_ids);
    free(bs->pfds);
    free(bs->pfd_rank);
    free(bs);
}

/* Writes all of `len` bytes to a non-blocking socket before the deadline. */
static maco_status_t maco__write_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                                     const char *what)
{
    const uint8_t *p = (const uint8_t *)buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP, "sending to %s: %s", what,
                               strerror(errno));
        int64_t left = deadline_ms - maco__now_ms();
        if (left <= 0)
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP, "sending to %s timed out",
                               what);
        struct pollfd pfd = { .fd = fd, .events = POLLOUT, .revents = 0 };
        poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
    }
    return MACO_OK;
}

/* Reads exactly `len` bytes from a non-blocking socket before the deadline. */
static maco_status_t maco__read_all(int fd, void *buf, size_t len, int64_t deadline_ms,
                                    const char *what)
{
    uint8_t *p = (uint8_t *)buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                               "%s closed the connection during setup", what);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP, "receiving from %s: %s",
                               what, strerror(errno));
        int64_t left = deadline_ms - maco__now_ms();
        if (left <= 0)
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                               "waiting for %s timed out (MACO_BOOTSTRAP_TIMEOUT sets the "
                               "deadline)",
                               what);
        struct pollfd pfd = { .fd = fd, .events = POLLIN, .revents = 0 };
        poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
    }
    return MACO_OK;
}

static void maco__hello_encode(uint8_t *out, uint16_t kind, uint64_t nonce, int rank, int nranks,
                               const maco__sockaddr_t *listen_addr, const char *host_id)
{
    memset(out, 0, MACO__HELLO_BYTES);
    maco__put_u32(out, MACO__ID_MAGIC);
    maco__put_u16(out + 4, MACO__ID_VERSION);
    maco__put_u16(out + 6, kind);
    maco__put_u64(out + 8, nonce);
    maco__put_u32(out + 16, (uint32_t)rank);
    maco__put_u32(out + 20, (uint32_t)nranks);
    if (listen_addr)
        maco__sockaddr_to_wire(listen_addr, out + 24);
    if (host_id)
        snprintf((char *)out + 24 + MACO__WIRE_ADDR_BYTES, MACO__HOST_ID_BYTES, "%s", host_id);
}

/* A connection accepted during setup whose hello is still arriving. */
typedef struct maco__pending {
    int fd;
    size_t got;
    int64_t since_ms;
    maco__sockaddr_t from;
    uint8_t hello[MACO__HELLO_BYTES];
} maco__pending_t;

static maco_status_t maco__send_setup_frame(int fd, uint16_t kind, const void *payload, size_t len,
                                            int64_t deadline, const char *what);

/* Rank 0: sends the setup error `text` to a connection that presented a hello as `rank`
 * (bounded: a rank that does not read it gets its connection closed). */
static void maco__tell_setup_error(int fd, const char *text, int rank)
{
    char what[32];
    snprintf(what, sizeof(what), "rank %d", rank);
    maco__send_setup_frame(fd, MACO__FRAME_INIT_ERROR, text, strlen(text), maco__deadline_ms(500),
                           what);
}

/* Checks a received hello's identity fields: 0 when it belongs to this job. */
static int maco__hello_is_ours(const uint8_t *h, uint16_t kind, uint64_t nonce)
{
    return maco__get_u32(h) == MACO__ID_MAGIC && maco__get_u16(h + 4) == MACO__ID_VERSION &&
           maco__get_u16(h + 6) == kind && maco__get_u64(h + 8) == nonce;
}

/*
 * Accepts connections on bs->listen_fd until every rank in `expect` (a bitmap over ranks,
 * cleared as they arrive) has presented a valid hello of `kind`. For each, `on_hello` is
 * called; a non-OK return fails setup. Strays are refused with a warning.
 */
typedef maco_status_t (*maco__on_hello_t)(maco_bootstrap_t bs, int rank, int fd,
                                          const uint8_t *hello, const maco__sockaddr_t *from);

static maco_status_t maco__accept_ranks(maco_bootstrap_t bs, uint16_t kind, char *expect,
                                        int nexpect, int64_t deadline, maco__on_hello_t on_hello)
{
    /* Every connection is accepted at once and read without blocking, each with its own
     * short hello deadline: silent or slow strangers cost a slot, never a rank's time. */
    maco__pending_t *pend = (maco__pending_t *)calloc(MACO__PENDING_MAX, sizeof(maco__pending_t));
    int npend = 0;
    maco_status_t st = MACO_OK;
    size_t npfd = (size_t)(1 + MACO__PENDING_MAX + bs->nranks);
    struct pollfd *pfds = (struct pollfd *)calloc(npfd, sizeof(*pfds));
    int *pfd_rank = (int *)calloc(npfd, sizeof(int));
    if (pend == NULL || pfds == NULL || pfd_rank == NULL) {
        free(pend);
        free(pfds);
        free(pfd_rank);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "setup: no memory");
    }
    /* Rank 0 only: which ranks were told a job error (told[r]), and until when it lingers. */
    char job_error[MACO__ABORT_TEXT_BYTES] = "";
    maco_status_t job_status = MACO_OK;
    char *told = kind == MACO__KIND_HELLO ? (char *)calloc((size_t)bs->nranks, 1) : NULL;
    int ntold = 0;
    int64_t linger_until = 0;
    while (job_error[0] != '\0' ? ntold < bs->nranks - 1 && maco__now_ms() < linger_until
                                : nexpect > 0) {
        int64_t now = maco__now_ms();
        if (job_error[0] == '\0' && now >= deadline) {
            char missing[256] = "";
            size_t used = 0;
            int listed = 0;
            for (int r = 0; r < bs->nranks && used + 16 < sizeof(missing); r++) {
                if (!expect[r])
                    continue;
                if (listed++ == 16) {
                    used += (size_t)snprintf(missing + used, sizeof(missing) - used, " ...");
                    break;
                }
                used += (size_t)snprintf(missing + used, sizeof(missing) - used, " %d", r);
            }
            st = maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                             "rank %d: setup timed out after %lld ms: no valid hello yet from %d "
                             "rank(s):%s (MACO_BOOTSTRAP_TIMEOUT sets the deadline)",
                             bs->rank, (long long)bs->timeout_ms, nexpect, missing);
            break;
        }
        int n = 0;
        pfds[n].fd = bs->listen_fd;
        pfds[n].events = POLLIN;
        pfd_rank[n++] = -1;
        for (int i = 0; i < npend; i++) {
            pfds[n].fd = pend[i].fd;
            pfds[n].events = POLLIN;
            pfd_rank[n++] = -2 - i;
        }
        /* Watch established links too: a peer dying during setup fails it at once. */
        for (int r = 0; r < bs->nranks; r++) {
            if (r != bs->rank && bs->peers[r].fd >= 0) {
                pfds[n].fd = bs->peers[r].fd;
                pfds[n].events = POLLIN;
                pfd_rank[n++] = r;
            }
        }
        int64_t left = deadline - now;
        int rc = poll(pfds, (nfds_t)n, (int)(left > 200 ? 200 : left));
        if (rc < 0 && errno != EINTR) {
            st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "poll: %s", strerror(errno));
            break;
        }
        /* Established links: any readable event now is a closed connection or an error
         * report from rank 0 (after a job error they close as told: not a new failure). */
        for (int i = 0; i < n && st == MACO_OK && job_error[0] == '\0'; i++) {
            if (pfd_rank[i] < 0 || pfds[i].revents == 0)
                continue;
            int r = pfd_rank[i];
            char c;
            ssize_t got = recv(bs->peers[r].fd, &c, 1, MSG_PEEK);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
                st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                                 "rank %d: rank %d closed its connection during setup (did it "
                                 "fail or crash?)",
                                 bs->rank, r);
        }
        if (st != MACO_OK)
            break;
        /* Pending connections (pfds[1 .. npend] in pend's order): read hellos where data
         * arrived; drop slow or stray ones. */
        int polled = npend;
        for (int i = 0; i < npend && st == MACO_OK; i++) {
            maco__pending_t *pc = &pend[i];
            ssize_t got = -1;
            errno = EAGAIN;
            if (i < polled && pfds[1 + i].revents != 0)
                got = recv(pc->fd, pc->hello + pc->got, MACO__HELLO_BYTES - pc->got, 0);
            if (got > 0)
                pc->got += (size_t)got;
            int drop = 0;
            char from[96];
            maco__sockaddr_format(&pc->from, from, sizeof(from));
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                          "rank %d: a connection from %s closed before sending a complete "
                          "hello; ignored",
                          bs->rank, from);
                drop = 1;
            } else if (pc->got >= 4 && maco__get_u32(pc->hello) != MACO__ID_MAGIC) {
                MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                          "rank %d: refused a connection from %s: it did not present MACO's "
                          "magic (a port scanner or another program?)",
                          bs->rank, from);
                drop = 1;
            } else if (pc->got == MACO__HELLO_BYTES) {
                if (!maco__hello_is_ours(pc->hello, kind, bs->nonce)) {
                    MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                              "rank %d: refused a connection from %s: wrong version, kind or "
                              "job nonce (a stale job on the same port?)",
                              bs->rank, from);
                    drop = 1;
                } else {
                    int rank = (int)maco__get_u32(pc->hello + 16);
                    int nranks = (int)maco__get_u32(pc->hello + 20);
                    if (job_error[0] != '\0') {
                        /* Setup already failed: tell this newcomer why. */
                        maco__tell_setup_error(pc->fd, job_error, rank);
                        if (rank > 0 && rank < bs->nranks && !told[rank]) {
                            told[rank] = 1;
                            ntold++;
                        }
                    } else if (nranks != bs->nranks) {
                        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                                         "world size mismatch: rank %d was started with %d "
                                         "ranks but rank %d (from %s) with %d",
                                         bs->rank, bs->nranks, rank, from, nranks);
                    } else if (rank < 0 || rank >= bs->nranks) {
                        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                                         "a process at %s joined as rank %d, outside [0, %d)", from,
                                         rank, bs->nranks);
                    } else if (!expect[rank]) {
                        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                                         "rank %d joined twice (again from %s): two processes "
                                         "were given the same rank",
                                         rank, from);
                    } else {
                        st = on_hello(bs, rank, pc->fd, pc->hello, &pc->from);
                        if (st == MACO_OK) {
                            expect[rank] = 0;
                            nexpect--;
                            pc->fd = -1; /* now owned by the peer table */
                        }
                    }
                    if (st != MACO_OK && told != NULL && job_error[0] == '\0' &&
                        st == MACO_ERR_INVALID_ARGUMENT) {
                        /* A job error: the offender, every rank that joined, and every rank
                         * that still arrives (for a while) is told, so none is left waiting
                         * for its deadline or reading a reset connection. */
                        snprintf(job_error, sizeof(job_error), "%s", maco__last_error());
                        job_status = st;
                        st = MACO_OK;
                        maco__tell_setup_error(pc->fd, job_error, rank);
                        if (rank > 0 && rank < bs->nranks && !told[rank]) {
                            told[rank] = 1;
                            ntold++;
                        }
                        for (int r = 1; r < bs->nranks; r++) {
                            if (bs->peers[r].fd >= 0) {
                                maco__tell_setup_error(bs->peers[r].fd, job_error, r);
                                if (!told[r]) {
                                    told[r] = 1;
                                    ntold++;
                                }
                            }
                        }
                        linger_until = maco__deadline_ms(MACO__ERROR_LINGER_MS);
                        if (linger_until > deadline)
                            linger_until = deadline;
                    }
                    drop = 1;
                }
            } else if (maco__now_ms() - pc->since_ms > MACO__HELLO_WAIT_MS) {
                MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                          "rank %d: dropped a connection from %s that sent no hello within "
                          "%d ms",
                          bs->rank, from, MACO__HELLO_WAIT_MS);
                drop = 1;
            }
            if (drop) {
                if (pc->fd >= 0)
                    close(pc->fd);
                /* Keep pend and its poll results in step: move the last of both here. */
                pend[i] = pend[--npend];
                if (npend < polled) {
                    pfds[1 + i] = pfds[1 + npend];
                    polled--;
                }
                i--;
            }
        }
        if (st != MACO_OK)
            break;
        /* New connections: all of them; when the table is full, the oldest pending one
         * makes room. */
        for (;;) {
            int fd;
            maco__sockaddr_t from;
            st = maco__socket_accept(bs->listen_fd, &fd, &from);
            if (st != MACO_OK || fd < 0)
                break;
            if (npend == MACO__PENDING_MAX) {
                int oldest = 0;
                for (int i = 1; i < npend; i++)
                    if (pend[i].since_ms < pend[oldest].since_ms)
                        oldest = i;
                char old_from[96];
                maco__sockaddr_format(&pend[oldest].from, old_from, sizeof(old_from));
                MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                          "rank %d: %d connections are waiting to say hello; dropped the oldest "
                          "(from %s)",
                          bs->rank, MACO__PENDING_MAX, old_from);
                close(pend[oldest].fd);
                pend[oldest] = pend[--npend];
            }
            pend[npend].fd = fd;
            pend[npend].got = 0;
            pend[npend].since_ms = maco__now_ms();
            pend[npend].from = from;
            npend++;
        }
        if (st != MACO_OK)
            break;
    }
    for (int i = 0; i < npend; i++)
        close(pend[i].fd);
    free(pend);
    free(pfds);
    free(pfd_rank);
    free(told);
    if (job_error[0] != '\0') {
        bs->setup_error_told = 1;
        /* The job error is this call's error (its text is still the thread's last error
         * unless something failed since; then that is reported instead). */
        return st != MACO_OK ? st : maco__error_quiet(job_status, "%s", job_error);
    }
    return st;
}

static maco_status_t maco__root_on_hello(maco_bootstrap_t bs, int rank, int fd,
                                         const uint8_t *hello, const maco__sockaddr_t *from)
{
    (void)from;
    bs->peers[rank].fd = fd;
    /* The hello carries (listen address, host id) in exactly a table entry's layout. */
    memcpy(bs->setup_table + (size_t)rank * MACO__TABLE_ENTRY_BYTES, hello + 24,
           MACO__TABLE_ENTRY_BYTES);
    return MACO_OK;
}

static maco_status_t maco__peer_on_hello(maco_bootstrap_t bs, int rank, int fd,
                                         const uint8_t *hello, const maco__sockaddr_t *from)
{
    (void)hello;
    (void)from;
    bs->peers[rank].fd = fd;
    return MACO_OK;
}

/* Sends a setup frame (TABLE or INIT_ERROR) on a link, bounded. */
static maco_status_t maco__send_setup_frame(int fd, uint16_t kind, const void *payload, size_t len,
                                            int64_t deadline, const char *what)
{
    uint8_t hdr[MACO__FRAME_HDR_BYTES];
    memset(hdr, 0, sizeof(hdr));
    maco__put_u16(hdr, kind);
    maco__put_u64(hdr + 8, (uint64_t)len);
    maco_status_t st = maco__write_all(fd, hdr, sizeof(hdr), deadline, what);
    if (st == MACO_OK && len > 0)
        st = maco__write_all(fd, payload, len, deadline, what);
    return st;
}

/* Rank 0: tells every joined rank why setup failed, so none waits for its deadline. */
static void maco__root_broadcast_error(maco_bootstrap_t bs, const char *text)
{
    int64_t deadline = maco__now_ms() + 1000;
    for (int r = 1; r < bs->nranks; r++) {
        if (bs->peers[r].fd >= 0) {
            char what[32];
            snprintf(what, sizeof(what), "rank %d", r);
            maco__send_setup_frame(bs->peers[r].fd, MACO__FRAME_INIT_ERROR, text, strlen(text),
                                   deadline, what);
        }
    }
}

static maco_status_t maco__setup_root(maco_bootstrap_t bs, int64_t deadline)
{
    char *expect = (char *)calloc((size_t)bs->nranks, 1);
    if (expect == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "setup: no memory");
    for (int r = 1; r < bs->nranks; r++)
        expect[r] = 1;
    maco_status_t st = maco__accept_ranks(bs, MACO__KIND_HELLO, expect, bs->nranks - 1, deadline,
                                          maco__root_on_hello);
    free(expect);
    if (st != MACO_OK) {
        if (!bs->setup_error_told)
            maco__root_broadcast_error(bs, maco__last_error());
        return st;
    }
    return MACO_OK;
}

static void maco__apply_table(maco_bootstrap_t bs, const uint8_t *table)
{
    for (int r = 0; r < bs->nranks; r++) {
        memcpy(bs->host_ids[r], table + (size_t)r * MACO__TABLE_ENTRY_BYTES + MACO__WIRE_ADDR_BYTES,
               MACO__HOST_ID_BYTES);
        bs->host_ids[r][MACO__HOST_ID_BYTES - 1] = '\0';
    }
}

/*
 * Common setup. `listen_fd` is rank 0's already-open root socket, or -1 (rank 0 then
 * binds `root` itself; other ranks always open their own listener).
 */
static maco_status_t maco__bootstrap_setup(const maco__sockaddr_t *root, uint64_t nonce, int rank,
                                           int nranks, int64_t timeout_ms, int listen_fd,
                                           maco_bootstrap_t *bs_p)
{
    maco_bootstrap_t bs = maco__bs_alloc(rank, nranks, nonce, timeout_ms);
    if (bs == NULL) {
        if (listen_fd >= 0)
            close(listen_fd);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP,
                           "no host memory for a bootstrap of %d ranks", nranks);
    }
    maco__log_set_rank(rank);
    int64_t deadline = maco__deadline_ms(timeout_ms);
    maco_status_t st = MACO_OK;
    char root_text[96];
    maco__sockaddr_format(root, root_text, sizeof(root_text));
    size_t table_bytes = (size_t)nranks * MACO__TABLE_ENTRY_BYTES;
    uint8_t *table = (uint8_t *)calloc(1, table_bytes);
    if (table == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "setup: no memory");
        goto fail;
    }
    bs->setup_table = table;

    if (rank == 0) {
        if (listen_fd >= 0) {
            bs->listen_fd = listen_fd;
            listen_fd = -1;
        } else {
            maco__sockaddr_t addr = *root;
            st = maco__socket_listen(&addr, &bs->listen_fd);
            if (st != MACO_OK)
                goto fail;
        }
        MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "rank 0 listening on %s for %d ranks", root_text, nranks);
        /* Rank 0's own entry; the others arrive with their hellos. */
        maco__sockaddr_to_wire(root, table);
        snprintf((char *)table + MACO__WIRE_ADDR_BYTES, MACO__HOST_ID_BYTES, "%s", maco__host_id());
        if (nranks > 1) {
            st = maco__setup_root(bs, deadline);
            if (st != MACO_OK)
                goto fail;
        }
        maco__apply_table(bs, table);
        for (int r = 1; r < nranks && st == MACO_OK; r++) {
            char what[32];
            snprintf(what, sizeof(what), "rank %d", r);
            st = maco__send_setup_frame(bs->peers[r].fd, MACO__FRAME_TABLE, table, table_bytes,
                                        deadline, what);
        }
        if (st != MACO_OK)
            goto fail;
    } else {
        int fd;
        st = maco__socket_connect(root, deadline, "rank 0", &fd);
        if (st != MACO_OK)
            goto fail;
        bs->peers[0].fd = fd;
        maco__sockaddr_t mine;
        st = maco__socket_local_address(fd, &mine);
        if (st != MACO_OK)
            goto fail;
        if (maco__config_is_set(MACO_CFG_SOCKET_IFNAME)) {
            st = maco__socket_default_address(&mine);
            if (st != MACO_OK)
                goto fail;
        }
        maco__sockaddr_set_port(&mine, 0);
        st = maco__socket_listen(&mine, &bs->listen_fd);
        if (st != MACO_OK)
            goto fail;
        uint8_t hello[MACO__HELLO_BYTES];
        maco__hello_encode(hello, MACO__KIND_HELLO, nonce, rank, nranks, &mine, maco__host_id());
        st = maco__write_all(fd, hello, sizeof(hello), deadline, "rank 0");
        if (st != MACO_OK)
            goto fail;
        uint8_t hdr[MACO__FRAME_HDR_BYTES];
        st = maco__read_all(fd, hdr, sizeof(hdr), deadline, "rank 0 (setup table)");
        if (st != MACO_OK)
            goto fail;
        uint16_t kind = maco__get_u16(hdr);
        uint64_t len = maco__get_u64(hdr + 8);
        if (kind == MACO__FRAME_INIT_ERROR && len < 4096) {
            char text[4096];
            st = maco__read_all(fd, text, (size_t)len, deadline, "rank 0 (setup error)");
            text[st == MACO_OK ? len : 0] = '\0';
            st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                             "rank 0 failed the job's setup: %s", text);
            goto fail;
        }
        if (kind != MACO__FRAME_TABLE || len != table_bytes) {
            st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                             "rank 0 sent an unexpected setup frame (kind %u, %llu bytes, "
                             "expected %zu): a different MACO version?",
                             (unsigned)kind, (unsigned long long)len, table_bytes);
            goto fail;
        }
        st = maco__read_all(fd, table, table_bytes, deadline, "rank 0 (setup table)");
        if (st != MACO_OK)
            goto fail;
        maco__apply_table(bs, table);
        /* Mesh: connect to lower ranks (except 0), then accept the higher ones. */
        for (int q = 1; q < rank; q++) {
            maco__sockaddr_t addr;
            if (maco__sockaddr_from_wire(table + (size_t)q * MACO__TABLE_ENTRY_BYTES, &addr) != 0) {
                st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                                 "rank 0's table has no address for rank %d", q);
                goto fail;
            }
            char what[32];
            snprintf(what, sizeof(what), "rank %d", q);
            st = maco__socket_connect(&addr, deadline, what, &fd);
            if (st != MACO_OK)
                goto fail;
            bs->peers[q].fd = fd;
            maco__hello_encode(hello, MACO__KIND_PEER_HELLO, nonce, rank, nranks, NULL, NULL);
            st = maco__write_all(fd, hello, sizeof(hello), deadline, what);
            if (st != MACO_OK)
                goto fail;
        }
        if (rank + 1 < nranks) {
            char *expect = (char *)calloc((size_t)nranks, 1);
            if (expect == NULL) {
                st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "setup: no memory");
                goto fail;
            }
            for (int q = rank + 1; q < nranks; q++)
                expect[q] = 1;
            st = maco__accept_ranks(bs, MACO__KIND_PEER_HELLO, expect, nranks - 1 - rank, deadline,
                                    maco__peer_on_hello);
            free(expect);
            if (st != MACO_OK)
                goto fail;
        }
    }
    /* The listening socket has done its work. */
    close(bs->listen_fd);
    bs->listen_fd = -1;
    bs->setup_table = NULL;
    free(table);
    MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "rank %d of %d connected (root %s)", rank, nranks, root_text);
    *bs_p = bs;
    return MACO_OK;
fail:
    bs->setup_table = NULL;
    free(table);
    if (listen_fd >= 0)
        close(listen_fd);
    maco__bs_free(bs);
    return st;
}

maco_status_t maco_bootstrap_create(const maco_unique_id_t *id, int rank, int nranks,
                                    int timeout_ms, maco_bootstrap_t *bs_p)
{
    if (id == NULL || bs_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create: id and bs_p must not be NULL");
    if (nranks < 1)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create: nranks is %d; it must be at least 1", nranks);
    if (rank < 0 || rank >= nranks)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create: rank %d is outside [0, %d)", rank, nranks);
    MACO__LOG_RANK_SCOPE(rank);
    uint64_t nonce = 0;
    maco__sockaddr_t root;
    maco_status_t st = maco__unique_id_decode(id, &nonce, &root);
    if (st != MACO_OK)
        return st;
    int64_t timeout = timeout_ms;
    if (timeout_ms < 0) {
        st = maco__config_int64(MACO_CFG_BOOTSTRAP_TIMEOUT, &timeout);
        if (st != MACO_OK)
            return st;
    }
    maco__config_check_environment();
    int listen_fd = rank == 0 ? maco__take_root_socket(nonce) : -1;
    return maco__bootstrap_setup(&root, nonce, rank, nranks, timeout, listen_fd, bs_p);
}

int maco__parse_nonce(const char *text, uint64_t *nonce_p)
{
    uint64_t v = 0;
    size_t n = 0;
    for (; text[n] != '\0'; n++) {
        char c = text[n];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0 || n == 16)
            return -1;
        v = v << 4 | (uint64_t)d;
    }
    if (n == 0)
        return -1;
    *nonce_p = v;
    return 0;
}

uint64_t maco__derive_nonce(const char *addr_text, const char *run_id)
{
    /* The world size stays out: ranks that disagree on it must meet and be told so. */
    char text[768];
    int secret = run_id != NULL && run_id[0] != '\0' && strcmp(run_id, "none") != 0;
    snprintf(text, sizeof(text), "%s\n%s", addr_text, secret ? run_id : "");
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "job nonce derived from the rank-0 address%s; %s",
                  secret ? " and TORCHELASTIC_RUN_ID" : "",
                  secret ? "processes that cannot read this job's environment cannot join it"
                         : "any local process can compute it: set MACO_BOOTSTRAP_NONCE to a "
                           "random value shared by the ranks (README, bootstrap security)");
    return maco__fnv1a(text);
}

/* Reads an integer variable, MACO's name first, then torchrun's. */
static maco_status_t maco__env_int(const char *maco_name, const char *torch_name, int *value_p,
                                   int required)
{
    const char *name = maco_name;
    const char *v = getenv(maco_name);
    if (v == NULL || v[0] == '\0') {
        name = torch_name;
        v = getenv(torch_name);
    }
    if (v == NULL || v[0] == '\0') {
        if (!required)
            return MACO_OK;
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "neither %s nor %s is set: initialisation from the environment "
                           "needs both the rank and the world size (maco-run sets them)",
                           maco_name, torch_name);
    }
    int64_t x;
    if (maco__parse_int(v, &x) != 0 || x < 0 || x > 0x7fffffff)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s='%s' is not a non-negative integer", name, v);
    *value_p = (int)x;
    return MACO_OK;
}

maco_status_t maco_bootstrap_create_from_env(maco_bootstrap_t *bs_p)
{
    if (bs_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create_from_env: bs_p is NULL");
    int rank = -1, nranks = -1;
    maco_status_t st = maco__env_int("MACO_RANK", "RANK", &rank, 1);
    if (st == MACO_OK)
        st = maco__env_int("MACO_WORLD_SIZE", "WORLD_SIZE", &nranks, 1);
    if (st != MACO_OK)
        return st;
    char addr_text[512];
    const char *what = "MACO_BOOTSTRAP_ADDR";
    if (maco__config_is_set(MACO_CFG_BOOTSTRAP_ADDR)) {
        snprintf(addr_text, sizeof(addr_text), "%s", maco__config_string(MACO_CFG_BOOTSTRAP_ADDR));
    } else {
        const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
        if (host == NULL || port == NULL || !host[0] || !port[0])
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "MACO_BOOTSTRAP_ADDR is not set, nor are MASTER_ADDR and "
                               "MASTER_PORT: rank 0's address is unknown");
        if (strchr(host, ':') != NULL && host[0] != '[')
            snprintf(addr_text, sizeof(addr_text), "[%s]:%s", host, port);
        else
            snprintf(addr_text, sizeof(addr_text), "%s:%s", host, port);
        what = "MASTER_ADDR:MASTER_PORT";
    }
    maco__sockaddr_t root;
    st = maco__sockaddr_parse(addr_text, what, &root);
    if (st != MACO_OK)
        return st;
    uint64_t nonce;
    if (maco__config_is_set(MACO_CFG_BOOTSTRAP_NONCE)) {
        const char *text = maco__config_string(MACO_CFG_BOOTSTRAP_NONCE);
        if (maco__parse_nonce(text, &nonce) != 0)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "MACO_BOOTSTRAP_NONCE='%s' is invalid: it accepts 1 to 16 hex "
                               "digits (no sign, no 0x)",
                               text);
    } else {
        nonce = maco__derive_nonce(addr_text, getenv("TORCHELASTIC_RUN_ID"));
    }
    maco_unique_id_t id;
    maco__unique_id_encode(&id, nonce, &root);
    return maco_bootstrap_create(&id, rank, nranks, -1, bs_p);
}

maco_status_t maco_bootstrap_destroy(maco_bootstrap_t bs)
{
    if (bs == NULL)
        return MACO_OK;
    MACO__LOG_RANK_SCOPE(bs->rank);
    /* Goodbye frames: tiny, so they fit the socket buffers; bounded anyway. Unsent data
     * of abandoned calls was already dequeued. */
    uint8_t bye[MACO__FRAME_HDR_BYTES];
    memset(bye, 0, sizeof(bye));
    maco__put_u16(bye, MACO__FRAME_BYE);
    int64_t deadline = maco__now_ms() + 1000;
    for (int r = 0; r < bs->nranks; r++) {
        maco__peer_t *p = &bs->peers[r];
        if (r == bs->rank || p->fd < 0)
            continue;
        char what[32];
        snprintf(what, sizeof(what), "rank %d", r);
        if (p->tx_broken || p->tx_head != NULL || p->state != MACO__PEER_OPEN) {
            /* Out of frame or gone: say nothing. */
        } else if (bs->failed == MACO_OK) {
            (void)maco__write_all(p->fd, bye, sizeof(bye), deadline, what);
        } else {
            /* Tell the peer why this rank stops, naming the rank it blames. */
            size_t tlen = strlen(bs->failed_text);
            uint8_t frame[MACO__FRAME_HDR_BYTES + 8 + MACO__ABORT_TEXT_BYTES];
            memset(frame, 0, MACO__FRAME_HDR_BYTES);
            maco__put_u16(frame, MACO__FRAME_ABORT);
            maco__put_u64(frame + 8, 8 + tlen);
            maco__put_u32(frame + MACO__FRAME_HDR_BYTES,
                          bs->failed_culprit >= 0 ? (uint32_t)bs->failed_culprit : 0xFFFFFFFFu);
            maco__put_u32(frame + MACO__FRAME_HDR_BYTES + 4, (uint32_t)bs->failed);
            memcpy(frame + MACO__FRAME_HDR_BYTES + 8, bs->failed_text, tlen);
            (void)maco__write_all(p->fd, frame, MACO__FRAME_HDR_BYTES + 8 + tlen, deadline, what);
        }
        shutdown(p->fd, SHUT_WR);
    }
    maco__bs_free(bs);
    return MACO_OK;
}

/* ------------------------------------------------------------------ test support */

/* Writes what the socket takes of data[0, len) without blocking. */
static void maco__fuzz_feed(int fd, const uint8_t *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n <= 0)
            return;
        data += n;
        len -= (size_t)n;
    }
}

/* Runs the receive path on peer 1's link until it would block, ends, or the bootstrap fails. */
static void maco__fuzz_read(maco_bootstrap_t bs)
{
    if (bs->failed == MACO_OK && bs->peers[1].fd >= 0)
        (void)maco__peer_read(bs, 1);
}

/* Posts receive `i` of the fuzz input (tag and size from its prefix) on peer 1's link. */
static maco_status_t maco__fuzz_post(maco_bootstrap_t bs, const uint8_t *data,
                                     maco__rx_post_t *posts, void **bufs, int i)
{
    size_t bytes = maco__get_u16(data + 2 + 3 * i);
    bufs[i] = bytes ? malloc(bytes) : NULL; /* exactly `bytes`: ASan sees any overrun */
    if (bytes && bufs[i] == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "fuzz: no memory");
    maco__bs_post(bs, 1, &posts[i], data[1 + 3 * i], bufs[i], bytes);
    return MACO_OK;
}

/* The receive path's invariants once the link has ended: NULL when they hold. */
static const char *maco__fuzz_broken(maco_bootstrap_t bs, const maco__rx_post_t *posts, int n)
{
    const maco__peer_t *p = &bs->peers[1];
    if (bs->failed == MACO_OK && p->fd >= 0)
        return "the link is still open after its peer closed";
    if (p->in_payload && p->payload_got > p->payload_len)
        return "more payload was read than the frame holds";
    const maco__msg_t *last = NULL;
    for (const maco__msg_t *m = p->unexpected_head; m != NULL; m = m->next)
        last = m;
    if (last != p->unexpected_tail)
        return "the unexpected-message list's tail is not its last message";
    for (int i = 0; i < n; i++) {
        const maco__rx_post_t *r = &posts[i];
        if (r->done ? r->buf != NULL : r->buf == NULL && p->rx_target != r)
            return "a receive is done but still claimable, or unclaimed and not waiting";
    }
    return NULL;
}

maco_status_t maco__bootstrap_fuzz_link(const uint8_t *data, size_t len)
{
    enum { PREFIX = 12 };
    if (len < PREFIX)
        return MACO_OK;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "fuzz: socketpair: %s",
                           strerror(errno));
    maco_bootstrap_t bs = maco__bs_alloc(0, 2, 0, 0);
    if (bs == NULL) {
        close(sv[0]);
        close(sv[1]);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "fuzz: no memory");
    }
    bs->peers[1].fd = sv[0];
    maco__rx_post_t posts[3];
    void *bufs[3] = { NULL, NULL, NULL };
    int early = (data[0] & 3) == 3 ? 2 : data[0] & 3, nposts = 0;
    const uint8_t *stream = data + PREFIX;
    size_t stream_len = len - PREFIX, split = maco__get_u16(data + 10);
    split = split < stream_len ? split : stream_len;
    maco_status_t st = MACO_OK;
    while (st == MACO_OK && nposts < early)
        st = maco__fuzz_post(bs, data, posts, bufs, nposts++);
    maco__fuzz_feed(sv[1], stream, split);
    maco__fuzz_read(bs);
    if (st == MACO_OK && (data[0] & 4))
        st = maco__fuzz_post(bs, data, posts, bufs, nposts++);
    maco__fuzz_feed(sv[1], stream + split, stream_len - split);
    close(sv[1]);
    maco__fuzz_read(bs);
    const char *broken = st == MACO_OK ? maco__fuzz_broken(bs, posts, nposts) : NULL;
    if (broken != NULL)
        st = maco__error(MACO_ERR_INTERNAL, MACO_SUBSYS_BOOTSTRAP, "fuzz: %s", broken);
    else if (st == MACO_OK)
        st = bs->failed;
    for (int i = 0; i < nposts; i++)
        maco__bs_unpost(bs, 1, &posts[i]);
    maco__bs_free(bs);
    for (int i = 0; i < nposts; i++)
        free(bufs[i]);
    return st;
}
