/* calls.c - the public bootstrap calls after setup: send, recv, allgather, barrier,
 * broadcast, queries, destroy; and the internal liveness and tag-free calls. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "src/host/base/wire.h"

/* ------------------------------------------------------------------ public calls */

static maco_status_t maco__bs_check(maco_bootstrap_t bs, const char *fn)
{
    if (bs == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP, "%s: bs is NULL", fn);
    return maco__bs_state(bs);
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
    pthread_mutex_lock(&bs->lock);
    maco__bs_queue(bs, peer, &op.tx, MACO__FRAME_DATA, tag, data, bytes);
    st = maco__bs_run(bs, &op, 1, "send");
    pthread_mutex_unlock(&bs->lock);
    return st;
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
    char what[64];
    snprintf(what, sizeof(what), "receive (tag 0x%x)", tag);
    pthread_mutex_lock(&bs->lock);
    maco__bs_post(bs, peer, &op.rx, tag, data, bytes);
    st = maco__bs_run(bs, &op, 1, what);
    pthread_mutex_unlock(&bs->lock);
    return st;
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
    return maco__bootstrap_allgather_tag(bs, MACO__TAG_ALLGATHER, buffer, bytes_per_rank);
}

maco_status_t maco__bootstrap_allgather_tag(maco_bootstrap_t bs, uint32_t tag, void *buffer,
                                            size_t bytes_per_rank)
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
    pthread_mutex_lock(&bs->lock);
    /* Receives first, so data can land in place as soon as it arrives. */
    for (int r = 0; r < bs->nranks; r++) {
        if (r == bs->rank)
            continue;
        ops[k].peer = r;
        maco__bs_post(bs, r, &ops[k].rx, tag, base ? base + (size_t)r * bytes_per_rank : NULL,
                      bytes_per_rank);
        k++;
    }
    /* Send to ranks after this one first, so the load spreads instead of all ranks
     * writing to rank 0 at once. */
    for (int i = 1; i < bs->nranks; i++) {
        int r = (bs->rank + i) % bs->nranks;
        ops[k].peer = r;
        ops[k].is_send = 1;
        maco__bs_queue(bs, r, &ops[k].tx, MACO__FRAME_DATA, tag, mine, bytes_per_rank);
        k++;
    }
    st = maco__bs_run(bs, ops, nops, "allgather");
    pthread_mutex_unlock(&bs->lock);
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
        pthread_mutex_lock(&bs->lock);
        maco__bs_post(bs, root, &op.rx, MACO__TAG_BROADCAST, buffer, bytes);
        st = maco__bs_run(bs, &op, 1, "broadcast");
        pthread_mutex_unlock(&bs->lock);
        return st;
    }
    int nops = bs->nranks - 1;
    maco__op_t *ops = (maco__op_t *)calloc((size_t)nops, sizeof(*ops));
    if (ops == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "broadcast: no memory");
    int k = 0;
    pthread_mutex_lock(&bs->lock);
    for (int r = 0; r < bs->nranks; r++) {
        if (r == root)
            continue;
        ops[k].peer = r;
        ops[k].is_send = 1;
        maco__bs_queue(bs, r, &ops[k].tx, MACO__FRAME_DATA, MACO__TAG_BROADCAST, buffer, bytes);
        k++;
    }
    st = maco__bs_run(bs, ops, nops, "broadcast");
    pthread_mutex_unlock(&bs->lock);
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

/* 0: the peer's link is up; 1: it said goodbye (destroyed its bootstrap); 2: the link ended
 * without goodbye (the peer exited or crashed). Records no error. */
static int maco__peer_link_state(maco_bootstrap_t bs, int peer)
{
    int state = __atomic_load_n(&bs->peers[peer].state, __ATOMIC_ACQUIRE);
    int fd = __atomic_load_n(&bs->peers[peer].fd, __ATOMIC_ACQUIRE);
    if (state == MACO__PEER_BYE || state == MACO__PEER_CLOSED)
        return 1;
    int lost = state == MACO__PEER_LOST || fd < 0;
    if (!lost) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        lost = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return lost ? 2 : 0;
}

maco_status_t maco__bootstrap_peer_alive(maco_bootstrap_t bs, int peer)
{
    if (bs == NULL || peer < 0 || peer >= bs->nranks || peer == bs->rank)
        return MACO_OK;
    /* Read what arrived, if no call is reading the links now: a peer's revoke reaches a rank
     * whose only wait is this one (a port channel's host wait asks every 100 ms). */
    maco__bootstrap_poll(bs);
    int by = __atomic_load_n(&bs->revoked_by, __ATOMIC_ACQUIRE);
    if (by >= 0)
        return maco__error_quiet(MACO_ERR_REVOKED, "rank %d revoked the communicator", by);
    maco_status_t failed = (maco_status_t)__atomic_load_n((int *)&bs->failed, __ATOMIC_ACQUIRE);
    if (failed != MACO_OK)
        return maco__error_quiet(failed, "the job failed: %s", bs->failed_text);
    int state = maco__peer_link_state(bs, peer);
    if (state == 1)
        return maco__error_quiet(MACO_ERR_REMOTE,
                                 "rank %d left the job (it destroyed its bootstrap)", peer);
    if (state == 2)
        return maco__error_quiet(MACO_ERR_REMOTE,
                                 "rank %d's connection ended without goodbye (it exited or "
                                 "crashed)",
                                 peer);
    return MACO_OK;
}

int maco__bootstrap_peer_gone(maco_bootstrap_t bs, int peer)
{
    if (bs == NULL || peer < 0 || peer >= bs->nranks || peer == bs->rank)
        return 0;
    return maco__peer_link_state(bs, peer) != 0;
}

int maco__bootstrap_link_fd(maco_bootstrap_t bs, int peer)
{
    return bs == NULL || peer < 0 || peer >= bs->nranks ? -1 : bs->peers[peer].fd;
}

int64_t maco__bootstrap_timeout_ms(maco_bootstrap_t bs)
{
    return bs->timeout_ms;
}

maco_status_t maco_bootstrap_destroy(maco_bootstrap_t bs)
{
    if (bs == NULL)
        return MACO_OK;
    MACO__LOG_RANK_SCOPE(bs->rank);
    /* Goodbye frames: tiny, so they fit the socket buffers; bounded anyway. Unsent frames of
     * calls that ended were dequeued, except the rests of half-sent ones, which the bootstrap
     * owns: those go out first (within the same bound), so that the goodbye is read in frame
     * and the peer does not take this exit for a crash. */
    uint8_t bye[MACO__FRAME_HDR_BYTES];
    memset(bye, 0, sizeof(bye));
    maco__put_u16(bye, MACO__FRAME_BYE);
    int64_t deadline = maco__now_ms() + 1000;
    for (;;) {
        int pending = 0;
        for (int r = 0; r < bs->nranks; r++)
            pending += r != bs->rank && bs->peers[r].fd >= 0 && bs->peers[r].tx_head != NULL &&
                       !bs->peers[r].tx_broken;
        if (pending == 0 || maco__now_ms() >= deadline ||
            maco__bs_progress_links(bs, deadline) != MACO_OK)
            break;
    }
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

maco_status_t maco__bootstrap_exchange(maco_bootstrap_t bs, int peer, uint32_t tag,
                                       const void *mine, void *theirs, size_t bytes)
{
    maco_status_t st = maco__bootstrap_send(bs, peer, tag, mine, bytes);
    if (st == MACO_OK)
        st = maco__bootstrap_recv(bs, peer, tag, theirs, bytes);
    return st;
}

/* ------------------------------------------------------------------ revocation */

int maco__bootstrap_revoked_by(maco_bootstrap_t bs)
{
    return bs == NULL ? -1 : __atomic_load_n(&bs->revoked_by, __ATOMIC_ACQUIRE);
}

void maco__bootstrap_set_on_revoke(maco_bootstrap_t bs, void (*fn)(void *ctx, int by_rank),
                                   void *ctx)
{
    pthread_mutex_lock(&bs->lock);
    bs->on_revoke = fn;
    bs->on_revoke_ctx = ctx;
    pthread_mutex_unlock(&bs->lock);
}

maco_status_t maco__bootstrap_revoke(maco_bootstrap_t bs)
{
    if (bs == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_comm_revoke: the bootstrap is NULL");
    int none = -1;
    if (!__atomic_compare_exchange_n(&bs->revoked_by, &none, bs->rank, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return MACO_OK; /* revoked already, here or by a peer (which told the others) */
    if (bs->wake_fd >= 0)
        (void)eventfd_write(bs->wake_fd, 1); /* a call blocked in poll returns now */
    pthread_mutex_lock(&bs->lock); /* a call running here returns at once, and tells them */
    maco__bs_tell_revoke_once(bs);
    pthread_mutex_unlock(&bs->lock);
    MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "rank %d revoked the communicator; its peers were told",
              bs->rank);
    return MACO_OK;
}

void maco__bootstrap_poll(maco_bootstrap_t bs)
{
    if (bs == NULL || pthread_mutex_trylock(&bs->lock) != 0)
        return; /* a call is running on another thread: it reads the links */
    if (bs->failed == MACO_OK)
        (void)maco__bs_progress_links(bs, maco__now_ms());
    pthread_mutex_unlock(&bs->lock);
}
