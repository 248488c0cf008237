/* coll.c - the public collectives, send/recv and reduction-op calls of nccl.h (shim.h).
 *
 * Each call is checked here (communicator, data type, op, root or peer; MACO checks the
 * buffers, counts and overlaps, naming them, when the call is issued) and recorded by value,
 * then run at once or at the end of this thread's group (group.c). Data types and ops map one
 * to one onto MACO's (maco_nccl__maco_type); NCCL's in-place layouts are MACO's. */
#include <string.h>

#include "shim.h"

/* What a call checks besides the communicator and the type. */
enum { MACO_NCCL_NO_ROOT, MACO_NCCL_ROOT, MACO_NCCL_PEER };

static ncclResult_t maco_nccl__call(maco_nccl__kind_t kind, maco_nccl__call_t call,
                                    const char *what, const void *sendbuff, void *recvbuff,
                                    size_t count, ncclDataType_t type, int uses_op, ncclRedOp_t op,
                                    int root_kind, int root, ncclComm_t comm, cudaStream_t stream)
{
    maco_nccl__op_t o;
    memset(&o, 0, sizeof(o));
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        goto fail;
    if (maco_nccl__type_size(type) == 0) {
        res =
            maco_nccl__fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t (0..%d)",
                            what, (int)type, (int)ncclNumTypes - 1);
        goto fail;
    }
    if (root_kind != MACO_NCCL_NO_ROOT && (root < 0 || root >= comm->nranks)) {
        res = maco_nccl__fail(ncclInvalidArgument, "%s: %s %d is outside [0, nranks %d)", what,
                              root_kind == MACO_NCCL_ROOT ? "root" : "peer", root, comm->nranks);
        goto fail;
    }
    o.op = ncclSum;
    if (uses_op && (int)op >= 0 && (int)op < (int)ncclNumOps) {
        o.op = op;
    } else if (uses_op) {
        int idx = (int)op - (int)ncclNumOps;
        pthread_mutex_lock(&comm->lock);
        const maco_nccl__user_op_t *u =
            idx >= 0 && idx < MACO_NCCL_MAX_USER_OPS && comm->ops[idx].used ? &comm->ops[idx]
                                                                            : NULL;
        if (u != NULL && u->type == type) {
            o.premul = 1;
            o.device_scalar = u->on_device ? u->device_scalar : NULL;
            memcpy(o.host_scalar, u->value, sizeof(o.host_scalar));
        }
        ncclDataType_t op_type = u != NULL ? u->type : ncclNumTypes;
        pthread_mutex_unlock(&comm->lock);
        if (u == NULL) {
            res = maco_nccl__fail(ncclInvalidArgument,
                                  "%s: op %d is neither a built-in op (0..%d) nor one created "
                                  "on this communicator by ncclRedOpCreatePreMulSum",
                                  what, (int)op, (int)ncclNumOps - 1);
            goto fail;
        }
        if (op_type != type) {
            res = maco_nccl__fail(ncclInvalidArgument,
                                  "%s: op %d was created for datatype %d, the call uses %d", what,
                                  (int)op, (int)op_type, (int)type);
            goto fail;
        }
    }
    o.kind = kind;
    o.call = call;
    o.comm = comm;
    o.serial = comm->serial;
    o.sendbuff = sendbuff;
    o.recvbuff = recvbuff;
    o.count = count;
    o.type = type;
    o.root = root;
    o.stream = stream;
    return maco_nccl__group_submit(&o);
fail:
    maco_nccl__group_note_error(res);
    return res;
}

ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_ALLREDUCE, MACO_NCCL_CALL_ncclAllReduce, "ncclAllReduce",
                           sendbuff, recvbuff, count, datatype, 1, op, MACO_NCCL_NO_ROOT, 0, comm,
                           stream);
}
MACO_NCCL_ALIAS(ncclAllReduce)

ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_BROADCAST, MACO_NCCL_CALL_ncclBroadcast, "ncclBroadcast",
                           sendbuff, recvbuff, count, datatype, 0, ncclSum, MACO_NCCL_ROOT, root,
                           comm, stream);
}
MACO_NCCL_ALIAS(ncclBroadcast)

/* The in-place broadcast of old NCCL versions. */
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_BROADCAST, MACO_NCCL_CALL_ncclBroadcast, "ncclBcast", buff,
                           buff, count, datatype, 0, ncclSum, MACO_NCCL_ROOT, root, comm, stream);
}
MACO_NCCL_ALIAS(ncclBcast)

ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_REDUCE, MACO_NCCL_CALL_ncclReduce, "ncclReduce", sendbuff,
                           recvbuff, count, datatype, 1, op, MACO_NCCL_ROOT, root, comm, stream);
}
MACO_NCCL_ALIAS(ncclReduce)

ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_ALLGATHER, MACO_NCCL_CALL_ncclAllGather, "ncclAllGather",
                           sendbuff, recvbuff, sendcount, datatype, 0, ncclSum, MACO_NCCL_NO_ROOT,
                           0, comm, stream);
}
MACO_NCCL_ALIAS(ncclAllGather)

ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_REDUCESCATTER, MACO_NCCL_CALL_ncclReduceScatter,
                           "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, 1, op,
                           MACO_NCCL_NO_ROOT, 0, comm, stream);
}
MACO_NCCL_ALIAS(ncclReduceScatter)

ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_ALLTOALL, MACO_NCCL_CALL_ncclAlltoAll, "ncclAlltoAll",
                           sendbuff, recvbuff, count, datatype, 0, ncclSum, MACO_NCCL_NO_ROOT, 0,
                           comm, stream);
}
MACO_NCCL_ALIAS(ncclAlltoAll)

ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_GATHER, MACO_NCCL_CALL_ncclGather, "ncclGather", sendbuff,
                           recvbuff, count, datatype, 0, ncclSum, MACO_NCCL_ROOT, root, comm,
                           stream);
}
MACO_NCCL_ALIAS(ncclGather)

ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_SCATTER, MACO_NCCL_CALL_ncclScatter, "ncclScatter", sendbuff,
                           recvbuff, count, datatype, 0, ncclSum, MACO_NCCL_ROOT, root, comm,
                           stream);
}
MACO_NCCL_ALIAS(ncclScatter)

ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_SEND, MACO_NCCL_CALL_ncclSend, "ncclSend", sendbuff, NULL,
                           count, datatype, 0, ncclSum, MACO_NCCL_PEER, peer, comm, stream);
}
MACO_NCCL_ALIAS(ncclSend)

ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream)
{
    return maco_nccl__call(MACO_NCCL_RECV, MACO_NCCL_CALL_ncclRecv, "ncclRecv", NULL, recvbuff,
                           count, datatype, 0, ncclSum, MACO_NCCL_PEER, peer, comm, stream);
}
MACO_NCCL_ALIAS(ncclRecv)

/* ------------------------------------------------------------------ PreMulSum ops */

/*
 * A PreMulSum op of this communicator: the sum of every rank's input times `scalar`. MACO
 * sums and then multiplies the result (scale.cu). ncclScalarHostImmediate copies the scalar
 * now; ncclScalarDevice reads it from device memory each time an operation runs (so it must
 * stay valid until the op is destroyed and the operations using it are done).
 */
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm)
{
    static const char what[] = "ncclRedOpCreatePreMulSum";
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    size_t es = maco_nccl__type_size(datatype);
    if (op == NULL || scalar == NULL || es == 0 ||
        (residence != ncclScalarDevice && residence != ncclScalarHostImmediate))
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: op %p, scalar %p, datatype %d, residence %d: op and scalar "
                               "may not be NULL, datatype must be 0..%d and residence 0 or 1",
                               what, (void *)op, scalar, (int)datatype, (int)residence,
                               (int)ncclNumTypes - 1);
    pthread_mutex_lock(&comm->lock);
    int idx = -1;
    for (int i = 0; i < MACO_NCCL_MAX_USER_OPS && idx < 0; i++)
        if (!comm->ops[i].used)
            idx = i;
    if (idx >= 0) {
        maco_nccl__user_op_t *u = &comm->ops[idx];
        memset(u, 0, sizeof(*u));
        u->used = 1;
        u->type = datatype;
        u->on_device = residence == ncclScalarDevice;
        if (u->on_device)
            u->device_scalar = scalar;
        else
            memcpy(u->value, scalar, es);
    }
    pthread_mutex_unlock(&comm->lock);
    if (idx < 0)
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: %d PreMulSum ops exist on this communicator already (the "
                               "most); destroy some with ncclRedOpDestroy",
                               what, MACO_NCCL_MAX_USER_OPS);
    *op = (ncclRedOp_t)((int)ncclNumOps + idx);
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclRedOpCreatePreMulSum)

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    ncclResult_t res = maco_nccl__comm_ready(comm, "ncclRedOpDestroy");
    if (res != ncclSuccess)
        return res;
    int idx = (int)op - (int)ncclNumOps;
    pthread_mutex_lock(&comm->lock);
    int ok = idx >= 0 && idx < MACO_NCCL_MAX_USER_OPS && comm->ops[idx].used;
    if (ok)
        comm->ops[idx].used = 0;
    pthread_mutex_unlock(&comm->lock);
    if (!ok)
        return maco_nccl__fail(ncclInvalidArgument,
                               "ncclRedOpDestroy: op %d was not created on this communicator "
                               "(built-in ops, 0..%d, are never destroyed)",
                               (int)op, (int)ncclNumOps - 1);
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclRedOpDestroy)
