/*
 * p2p.c - maco_send and maco_recv: argument checks, then the call's message goes to group.c
 * (queued inside a group, else issued at once as a group of one), and the checks the
 * all-to-all calls (alltoall/alltoall.c) share with them. The protocol is in p2p_kernels.cu.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/common/group.h"
#include "algorithms/p2p/p2p.h"
#include "src/host/base/log.h"

/* log2 of an element size (1, 2, 4 or 8 bytes). */
uint8_t maco__esz_log2(size_t esz)
{
    return (uint8_t)(esz == 8 ? 3 : esz == 4 ? 2 : esz == 2 ? 1 : 0);
}

/* A call's argument error: recorded in the communicator and, inside a group, in the group. */
maco_status_t maco__p2p_fail(maco_comm_t comm, const char *fn, maco_status_t st)
{
    maco__comm_record(comm, st);
    return maco__group_depth() > 0 ? maco__group_fail(fn, st) : st;
}

/* What every call checks: the communicator and the type. */
maco_status_t maco__p2p_check_common(const char *fn, maco_comm_t comm, maco_datatype_t datatype)
{
    if (comm == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: comm is NULL", fn);
    if ((unsigned)datatype >= MACO_DATATYPE_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: datatype %d is outside [0, %d)", fn, (int)datatype,
                           MACO_DATATYPE_COUNT);
    return MACO_OK;
}

/* `count` elements of `esz` bytes, `mult` times, fit a message (and size_t). */
maco_status_t maco__p2p_check_bytes(const char *fn, const char *what, size_t count, size_t esz,
                                    size_t mult)
{
    if (count > MACO__P2P_MAX_BYTES / esz / mult)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: %s %zu elements of %zu bytes%s overflows a message's byte size "
                           "(2^48 - 1)",
                           fn, what, count, esz, mult > 1 ? " times nranks" : "");
    return MACO_OK;
}

static maco_status_t maco__p2p_one(const char *fn, int dir, const void *sbuf, void *rbuf,
                                   size_t count, maco_datatype_t datatype, int peer,
                                   maco_comm_t comm, maco_stream_t stream)
{
    maco_status_t st = maco__p2p_check_common(fn, comm, datatype);
    if (st != MACO_OK)
        return maco__p2p_fail(comm, fn, st);
    size_t esz = maco_datatype_size(datatype);
    if (peer < 0 || peer >= comm->nranks)
        return maco__p2p_fail(comm, fn,
                              maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                          "%s: peer %d is outside [0, %d) (the number of ranks)",
                                          fn, peer, comm->nranks));
    if (count > 0 && (dir == MACO__P2P_SEND ? sbuf == NULL : rbuf == NULL))
        return maco__p2p_fail(comm, fn,
                              maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                          "%s: buf is NULL with count %zu", fn, count));
    st = maco__p2p_check_bytes(fn, "count", count, esz, 1);
    if (st != MACO_OK)
        return maco__p2p_fail(comm, fn, st);
    maco__p2p_msg_t m;
    memset(&m, 0, sizeof(m));
    m.dir = dir;
    m.peer = peer;
    m.send = sbuf;
    m.recv = rbuf;
    m.bytes = (uint64_t)count * esz;
    m.flags = MACO__P2P_FLAGS(MACO__P2P_KIND_SENDRECV, maco__esz_log2(esz), 0);
    /* count 0 is no message: nothing to match (the group still numbers the call). */
    return maco__group_add_p2p(fn, &m, count > 0 ? 1 : 0, comm, stream);
}

maco_status_t maco_send(const void *buf, size_t count, maco_datatype_t datatype, int peer,
                        maco_comm_t comm, maco_stream_t stream)
{
    return maco__p2p_one("maco_send", MACO__P2P_SEND, buf, NULL, count, datatype, peer, comm,
                         stream);
}

maco_status_t maco_recv(void *buf, size_t count, maco_datatype_t datatype, int peer,
                        maco_comm_t comm, maco_stream_t stream)
{
    return maco__p2p_one("maco_recv", MACO__P2P_RECV, NULL, buf, count, datatype, peer, comm,
                         stream);
}
