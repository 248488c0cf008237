/* progress.c - the progress engine over the bootstrap's peer links: frames in and out,
 * posted receives and unexpected messages, failures (a lost link, an ABORT frame) and the
 * grace period that names the rank that really died. Also the fuzzing entry point. */
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
maco_status_t maco__bs_sticky(maco_bootstrap_t bs)
{
    return maco__error_quiet(bs->failed, "rank %d: %s", bs->rank, bs->failed_text);
}

maco_status_t maco__bs_state(maco_bootstrap_t bs)
{
    int by = __atomic_load_n(&bs->revoked_by, __ATOMIC_ACQUIRE);
    /* A failure seen before is the likely cause of the revoke: say it too. */
    const char *before = bs->failed != MACO_OK ? "; it had failed before: " : "";
    const char *cause = bs->failed != MACO_OK ? bs->failed_text : "";
    if (by == bs->rank)
        return maco__error_quiet(MACO_ERR_REVOKED,
                                 "rank %d: the communicator was revoked on this rank "
                                 "(maco_comm_revoke); destroy it or shrink it%s%s",
                                 bs->rank, before, cause);
    if (by >= 0)
        return maco__error_quiet(MACO_ERR_REVOKED,
                                 "rank %d: rank %d revoked the communicator (maco_comm_revoke); "
                                 "destroy it or shrink it%s%s",
                                 bs->rank, by, before, cause);
    if (bs->failed != MACO_OK)
        return maco__bs_sticky(bs);
    return MACO_OK;
}

int maco__bs_peer_is_gone(maco_bootstrap_t bs, int peer)
{
    const maco__peer_t *p = &bs->peers[peer];
    return p->state != MACO__PEER_OPEN || p->fd < 0 || p->tx_broken;
}

int maco__bs_take_any(maco_bootstrap_t bs, uint32_t tag, const char *want, maco__msg_t **msg_p,
                      int *from_p)
{
    for (int r = 0; r < bs->nranks; r++) {
        if (r == bs->rank || (want != NULL && !want[r]))
            continue;
        maco__peer_t *p = &bs->peers[r];
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
            m->next = NULL;
            *msg_p = m;
            *from_p = r;
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ link I/O */

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

/* An ABORT frame: the peer failed and says whom it blames. It is leaving: its link carries
 * nothing more. During an agreement (bs->tolerant) that is all it means. */
static maco_status_t maco__bs_on_abort(maco_bootstrap_t bs, int src, const uint8_t *data,
                                       size_t len)
{
    bs->peers[src].state = MACO__PEER_BYE;
    if (bs->tolerant) {
        MACO_DEBUG(MACO_SUBSYS_BOOTSTRAP, "rank %d stopped with an error (abort frame)", src);
        return MACO_OK;
    }
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
    if (p->kind == MACO__FRAME_REVOKE && len == 0) {
        int none = -1;
        if (__atomic_compare_exchange_n(&bs->revoked_by, &none, src, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "rank %d revoked the communicator", src);
            if (bs->on_revoke != NULL)
                bs->on_revoke(bs->on_revoke_ctx, src);
        }
        return MACO_OK;
    }
    if (p->kind != MACO__FRAME_DATA || len > ((uint64_t)1 << 40)) {
        if (bs->tolerant) {
            /* Out of frame: nothing more can be read from this link; its peer is gone. */
            MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                      "rank %d sent an invalid frame (kind %u, length %llu); its link is closed",
                      src, (unsigned)p->kind, (unsigned long long)len);
            p->in_payload = 0;
            p->state = MACO__PEER_LOST;
            maco__peer_close_fd(p);
            return MACO_OK;
        }
        return maco__bs_fail(bs, MACO_ERR_REMOTE,
                             "rank %d sent an invalid frame (kind %u, length %llu): protocol "
                             "error or a different MACO version",
                             src, (unsigned)p->kind, (unsigned long long)len);
    }
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
        uint8_t scratch[4096];
        if (p->fd < 0)
            return MACO_OK; /* closed while reading (a broken frame during an agreement) */
        if (!p->in_payload) {
            n = recv(p->fd, p->hdr + p->hdr_got, MACO__FRAME_HDR_BYTES - p->hdr_got, 0);
        } else if (p->rx_discard) {
            size_t left = p->payload_len - p->payload_got;
            n = recv(p->fd, scratch, left < sizeof(scratch) ? left : sizeof(scratch), 0);
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
            if (p->rx_discard) {
                p->rx_discard = 0;
                continue;
            }
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
        if (t->owned)
            free(t);
    }
    return MACO_OK;
}

maco_status_t maco__bs_progress_links(maco_bootstrap_t bs, int64_t deadline_ms)
{
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
    int nlinks = n;
    if (bs->wake_fd >= 0) { /* pfds has room for one more than the peers */
        bs->pfds[n].fd = bs->wake_fd;
        bs->pfds[n].events = POLLIN;
        bs->pfds[n].revents = 0;
        bs->pfd_rank[n] = -1;
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
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "rank %d: poll failed: %s",
                           bs->rank, strerror(errno));
    }
    if (n > nlinks && bs->pfds[nlinks].revents != 0) {
        eventfd_t drained;
        (void)eventfd_read(bs->wake_fd, &drained); /* the caller looks at revoked_by */
    }
    for (int i = 0; i < nlinks && rc > 0; i++) {
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
    return MACO_OK;
}

/*
 * One round of progress for a normal call: the links (maco__bs_progress_links), then the
 * failures they showed become the bootstrap's sticky failure: an ABORT frame at once, a link
 * that ended without goodbye after the grace period.
 */
static maco_status_t maco__bs_progress(maco_bootstrap_t bs, int64_t deadline_ms)
{
    if (bs->failed != MACO_OK)
        return maco__bs_sticky(bs);
    maco_status_t st = maco__bs_progress_links(bs, deadline_ms);
    if (st != MACO_OK && bs->failed == MACO_OK) { /* a local failure, logged where it happened */
        snprintf(bs->failed_text, sizeof(bs->failed_text), "%s", maco__last_error());
        bs->failed = st;
        bs->failed_culprit = -1;
    }
    if (bs->failed != MACO_OK)
        return maco__bs_sticky(bs);
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
void maco__bs_queue(maco_bootstrap_t bs, int dst, maco__tx_t *t, uint16_t kind, uint32_t tag,
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
void maco__bs_post(maco_bootstrap_t bs, int src, maco__rx_post_t *post, uint32_t tag, void *buf,
                   size_t len)
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

/* Removes unsent frames of an ended call from the send queues. A frame already partly
 * written stays, as a copy the bootstrap owns, so the stream stays in frame (the peer gets a
 * whole message nobody waits for, and the link keeps working); only when no memory is left
 * for the copy does the link stop carrying frames. */
void maco__bs_unqueue(maco_bootstrap_t bs, int dst, maco__tx_t *t)
{
    maco__peer_t *p = &bs->peers[dst];
    maco__tx_t *prev = NULL;
    for (maco__tx_t *it = p->tx_head; it != NULL; prev = it, it = it->next) {
        if (it != t)
            continue;
        maco__tx_t *keep = NULL;
        if (it->hdr_sent != 0 && !maco__tx_done(it)) {
            /* Only what is still to go: the payload's rest once the header is out. */
            size_t from = it->hdr_sent == MACO__FRAME_HDR_BYTES ? it->sent : 0;
            keep = (maco__tx_t *)malloc(sizeof(*keep) + (it->len - from));
            if (keep != NULL) {
                *keep = *it;
                keep->owned = 1;
                keep->data = (const uint8_t *)(keep + 1);
                keep->len = it->len - from;
                keep->sent = 0;
                if (keep->len > 0)
                    memcpy(keep + 1, it->data + from, keep->len);
            } else {
                p->tx_broken = 1;
                maco__bs_fail(bs, MACO_ERR_NO_MEMORY,
                              "no host memory to finish a %zu-byte frame to rank %d whose call "
                              "ended; the link stops",
                              it->len, dst);
            }
        }
        maco__tx_t *next = it->next;
        if (keep != NULL) {
            keep->next = next;
            next = keep;
        }
        if (prev)
            prev->next = next;
        else
            p->tx_head = next;
        if (p->tx_tail == it)
            p->tx_tail = keep != NULL ? keep : prev;
        return;
    }
}

void maco__bs_tell_revoke_once(maco_bootstrap_t bs)
{
    if (__atomic_load_n(&bs->revoked_by, __ATOMIC_ACQUIRE) != bs->rank || bs->revoke_told)
        return;
    bs->revoke_told = 1;
    const int64_t ms = 1000;
    maco__tx_t *tx = (maco__tx_t *)calloc((size_t)bs->nranks, sizeof(*tx));
    if (tx == NULL)
        return; /* peers learn it from their own waits instead */
    for (int r = 0; r < bs->nranks; r++)
        if (r != bs->rank && !maco__bs_peer_is_gone(bs, r))
            maco__bs_queue(bs, r, &tx[r], MACO__FRAME_REVOKE, 0, NULL, 0);
    int64_t deadline = maco__deadline_ms(ms);
    for (;;) {
        int pending = 0;
        for (int r = 0; r < bs->nranks; r++)
            pending += tx[r].hdr_sent != (size_t)-1 && r != bs->rank &&
                       !maco__bs_peer_is_gone(bs, r) && bs->peers[r].tx_head != NULL;
        if (pending == 0 || maco__now_ms() >= deadline ||
            maco__bs_progress_links(bs, deadline) != MACO_OK)
            break;
    }
    /* Not written yet (a peer that stopped reading): dropped, or kept whole if half of it is
     * out, as for every call that ends. */
    for (int r = 0; r < bs->nranks; r++)
        if (r != bs->rank && tx[r].hdr_sent != (size_t)-1)
            maco__bs_unqueue(bs, r, &tx[r]);
    free(tx);
}

maco_status_t maco__bs_run(maco_bootstrap_t bs, maco__op_t *ops, int nops, const char *what)
{
    int64_t deadline = maco__deadline_ms(bs->timeout_ms);
    maco_status_t st = MACO_OK;
    for (;;) {
        if (__atomic_load_n(&bs->revoked_by, __ATOMIC_ACQUIRE) >= 0) {
            st = maco__bs_state(bs);
            maco__bs_tell_revoke_once(bs); /* a revoke of this rank's: its thread waits for us */
            goto out;
        }
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
     * after we return: the rest of that frame is read and dropped, keeping the link in frame. */
    if (st != MACO_OK) {
        for (int i = 0; i < nops; i++) {
            maco__peer_t *p = &bs->peers[ops[i].peer];
            if (!ops[i].is_send && p->rx_target == &ops[i].rx) {
                p->rx_target = NULL;
                p->payload_dst = NULL;
                p->rx_discard = 1;
            }
        }
    }
    return st;
}

/* Writes all of `len` bytes to a non-blocking socket before the deadline. */
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
