/*
 * alltoall.c - maco_alltoall and maco_alltoallv: argument checks (those they share with send
 * and recv are in p2p/p2p.c), then the call's messages, a send and a receive per rank, go to
 * group.c (queued inside a group, else issued at once as a group of one); across nodes and
 * outside a group, maco_alltoall may run as a collective of its own (hier/alltoall_kernel.cu).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/collectives/collectives.h"
#include "algorithms/common/group.h"
#include "algorithms/common/select.h"
#include "algorithms/p2p/p2p.h"
#include "src/host/base/log.h"

/* Block q of an all-to-allv side ("s"/"send" or "r"/"recv"): its end, displacement + count
 * elements of `esz` bytes, must be a byte offset that fits a message. */
static maco_status_t maco__p2p_check_block(const char *fn, const char *d, const char *side,
                                           size_t displ, size_t count, int q, size_t esz)
{
    if (displ > MACO__P2P_MAX_BYTES / esz || count > MACO__P2P_MAX_BYTES / esz - displ)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: %sdispls[%d] %zu + %scounts[%d] %zu elements of %zu bytes "
                           "overflows a byte offset",
                           fn, d, q, displ, side, q, count, esz);
    return MACO_OK;
}

/*
 * The messages of an all-to-all(v): to and from every rank, this one included (the local
 * block becomes a copy). Blocks of 0 elements still travel to other ranks, so every receiver
 * can check every sender's count.
 */
static maco_status_t maco__alltoall_issue(const char *fn, int kind, const char *sendbuf,
                                          const size_t *sendcounts, const size_t *sdispls,
                                          char *recvbuf, const size_t *recvcounts,
                                          const size_t *rdispls, size_t esz, maco_comm_t comm,
                                          maco_stream_t stream)
{
    int n = comm->nranks;
    maco__p2p_msg_t *msgs = (maco__p2p_msg_t *)calloc(2 * (size_t)n, sizeof(*msgs));
    if (msgs == NULL)
        return maco__p2p_fail(
            comm, fn, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "%s: no memory", fn));
    uint8_t flags = MACO__P2P_FLAGS(kind, maco__esz_log2(esz), 0);
    for (int q = 0; q < n; q++) {
        maco__p2p_msg_t *s = &msgs[2 * q], *r = &msgs[2 * q + 1];
        s->dir = MACO__P2P_SEND;
        s->peer = q;
        s->send = sendcounts[q] > 0 ? sendbuf + sdispls[q] * esz : sendbuf;
        s->bytes = (uint64_t)sendcounts[q] * esz;
        s->flags = flags;
        r->dir = MACO__P2P_RECV;
        r->peer = q;
        r->recv = recvcounts[q] > 0 ? recvbuf + rdispls[q] * esz : recvbuf;
        r->bytes = (uint64_t)recvcounts[q] * esz;
        r->flags = flags;
    }
    maco_status_t st = maco__group_add_p2p(fn, msgs, 2 * n, comm, stream);
    free(msgs);
    return st;
}

maco_status_t maco_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                            maco_datatype_t datatype, maco_comm_t comm, maco_stream_t stream)
{
    const char *fn = "maco_alltoall";
    maco_status_t st = maco__p2p_check_common(fn, comm, datatype);
    if (st != MACO_OK)
        return maco__p2p_fail(comm, fn, st);
    size_t esz = maco_datatype_size(datatype), n = (size_t)comm->nranks;
    st = maco__p2p_check_bytes(fn, "count", count, esz, n);
    if (st != MACO_OK)
        return maco__p2p_fail(comm, fn, st);
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return maco__p2p_fail(comm, fn,
                              maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                          "%s: %s is NULL with count %zu", fn,
                                          sendbuf == NULL ? "sendbuf" : "recvbuf", count));
    size_t bytes = count * esz * n;
    uintptr_t s = (uintptr_t)sendbuf, r = (uintptr_t)recvbuf;
    if (bytes > 0 && s < r + bytes && r < s + bytes)
        return maco__p2p_fail(comm, fn,
                              maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                          "%s: sendbuf %p and recvbuf %p (%zu bytes each) overlap; "
                                          "all-to-all has no in-place form",
                                          fn, sendbuf, recvbuf, bytes));
    if (count == 0)
        return maco__group_add_p2p(fn, NULL, 0, comm, stream);
    /* Across nodes, outside a group: hierarchical where maco__coll_select picks it (forced
     * or by size), as a collective of its own (hier/alltoall_kernel.cu). Inside a group, and
     * maco_alltoallv, always direct. */
    maco__coll_t *c = maco__coll_of(comm);
    if (maco__group_depth() == 0 && c != NULL && c->nnodes > 1) {
        maco__coll_call_t call = { MACO_COLL_ALLTOALL, fn,       sendbuf, recvbuf, count,
                                   datatype,           MACO_SUM, 0 };
        maco__coll_t *coll_state = NULL;
        int kernel = -1;
        st = maco__coll_prepare(&call, comm, &coll_state, &kernel); /* selects, once */
        if (st != MACO_OK)
            return maco__p2p_fail(comm, fn, st);
        if (kernel == MACO__KERNEL_HIER) {
            st = maco__comm_check_stream(comm, stream, fn);
            if (st != MACO_OK)
                return st;
            return maco__coll_launch(&call, comm, coll_state, kernel, stream);
        }
    }
    size_t *v = (size_t *)malloc(2 * n * sizeof(size_t));
    if (v == NULL)
        return maco__p2p_fail(
            comm, fn, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "%s: no memory", fn));
    for (size_t q = 0; q < n; q++) {
        v[q] = count;         /* counts */
        v[n + q] = q * count; /* displacements */
    }
    st = maco__alltoall_issue(fn, MACO__P2P_KIND_ALLTOALL, (const char *)sendbuf, v, v + n,
                              (char *)recvbuf, v, v + n, esz, comm, stream);
    free(v);
    return st;
}

maco_status_t maco_alltoallv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                             void *recvbuf, const size_t *recvcounts, const size_t *rdispls,
                             maco_datatype_t datatype, maco_comm_t comm, maco_stream_t stream)
{
    const char *fn = "maco_alltoallv";
    maco_status_t st = maco__p2p_check_common(fn, comm, datatype);
    if (st != MACO_OK)
        return maco__p2p_fail(comm, fn, st);
    if (sendcounts == NULL || sdispls == NULL || recvcounts == NULL || rdispls == NULL)
        return maco__p2p_fail(comm, fn,
                              maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                          "%s: %s is NULL", fn,
                                          sendcounts == NULL   ? "sendcounts"
                                          : sdispls == NULL    ? "sdispls"
                                          : recvcounts == NULL ? "recvcounts"
                                                               : "rdispls"));
    size_t esz = maco_datatype_size(datatype);
    int n = comm->nranks, me = comm->rank;
    size_t any_send = 0, any_recv = 0;
    for (int q = 0; q < n; q++) {
        st = maco__p2p_check_block(fn, "s", "send", sdispls[q], sendcounts[q], q, esz);
        if (st == MACO_OK)
            st = maco__p2p_check_block(fn, "r", "recv", rdispls[q], recvcounts[q], q, esz);
        if (st != MACO_OK)
            return maco__p2p_fail(comm, fn, st);
        any_send |= sendcounts[q];
        any_recv |= recvcounts[q];
    }
    if ((any_send && sendbuf == NULL) || (any_recv && recvbuf == NULL))
        return maco__p2p_fail(comm, fn,
                              maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                          "%s: %s is NULL with a count > 0", fn,
                                          any_send && sendbuf == NULL ? "sendbuf" : "recvbuf"));
    if (sendcounts[me] != recvcounts[me])
        return maco__p2p_fail(comm, fn,
                              maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                          "%s: this rank (%d) sends itself %zu elements "
                                          "(sendcounts[%d]) but receives %zu (recvcounts[%d])",
                                          fn, me, sendcounts[me], me, recvcounts[me], me));
    return maco__alltoall_issue(fn, MACO__P2P_KIND_ALLTOALLV, (const char *)sendbuf, sendcounts,
                                sdispls, (char *)recvbuf, recvcounts, rdispls, esz, comm, stream);
}
