/* alloc.c - the bootstrap object: allocation and freeing, the lowest of the bootstrap's
 * files (bootstrap_private.h). */
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <string.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"

void maco__peer_close_fd(maco__peer_t *p)
{
    if (p->fd >= 0) {
        close(p->fd);
        p->fd = -1;
    }
}

maco_bootstrap_t maco__bs_alloc(int rank, int nranks, uint64_t nonce, int64_t timeout_ms)
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
    pthread_mutex_init(&bs->lock, NULL);
    bs->revoked_by = -1;
    /* Without it a revoke from another thread is noticed within one poll period instead. */
    bs->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return bs;
}

void maco__bs_free(maco_bootstrap_t bs)
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
        /* Frames the bootstrap owns (the rest of half-sent ones); the callers' own frames
         * were removed when their calls ended. */
        for (maco__tx_t *t = p->tx_head, *next; t != NULL; t = next) {
            next = t->next;
            if (t->owned)
                free(t);
        }
    }
    if (bs->listen_fd >= 0)
        close(bs->listen_fd);
    if (bs->wake_fd >= 0)
        close(bs->wake_fd);
    pthread_mutex_destroy(&bs->lock);
    free(bs->peers);
    free(bs->host_ids);
    free(bs->pfds);
    free(bs->pfd_rank);
    free(bs);
}
