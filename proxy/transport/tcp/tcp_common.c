/*
 * tcp_common.c - the TCP transport: a group's failure, and the pinned staging buffers
 * and CUDA events both directions use (transport_tcp.c has the design).
 */
#include "proxy/transport/tcp/tcp_internal.h"

/* ------------------------------------------------------------------ failures */

void maco__tcp_fail(struct maco_proxy *p, maco__tcp_group_t *g, int s, const char *what, int err)
{
    if (g->failed)
        return;
    if (g->peer_left) {
        /* The peer destroyed its proxy after saying BYE: its sockets end, no error. */
        MACO_DEBUG(MACO_SUBSYS_PROXY, "TCP transport: rank %d's proxy left (%s)", g->peer, what);
        __atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE);
        return;
    }
    /* The async error first, then `failed`: a host flush that sees the group failed
     * (maco__tcp_alive) then also finds the communicator's async error set. */
    maco__proxy_fail(p, maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                                    "TCP transport: the connection to rank %d (socket %d of %d) "
                                    "failed: %s%s%s; its channels are dead",
                                    g->peer, s, g->nsocks, what, err ? ": " : "",
                                    err ? strerror(err) : ""));
    __atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE); /* read by maco__tcp_alive */
}

/* ------------------------------------------------------------------ staging buffers */

maco__tcp_buf_t *maco__tcp_buf_get(maco__tcp_state_t *t, int send)
{
    maco__tcp_buf_t **free_list = send ? &t->send_free : &t->recv_free;
    int *made = send ? &t->send_made : &t->recv_made;
    if (*free_list != NULL) {
        maco__tcp_buf_t *b = *free_list;
        *free_list = b->next;
        return b;
    }
    if (*made >= MACO__TCP_POOL)
        return NULL;
    maco__tcp_buf_t *b = (maco__tcp_buf_t *)calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    if (cudaHostAlloc((void **)&b->mem, (size_t)t->chunk, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        free(b);
        return NULL;
    }
    (*made)++;
    return b;
}

void maco__tcp_buf_put(maco__tcp_state_t *t, maco__tcp_buf_t *b, int send)
{
    maco__tcp_buf_t **free_list = send ? &t->send_free : &t->recv_free;
    b->next = *free_list;
    *free_list = b;
}

cudaEvent_t maco__tcp_event(void)
{
    cudaEvent_t ev = NULL;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return ev;
}

/* 1 once the event passed (or is NULL); 0 while not; -1 on a CUDA error. */
int maco__tcp_event_done(cudaEvent_t ev)
{
    if (ev == NULL)
        return 1;
    cudaError_t err = cudaEventQuery(ev);
    if (err == cudaSuccess)
        return 1;
    if (err == cudaErrorNotReady)
        return 0;
    cudaGetLastError();
    return -1;
}
