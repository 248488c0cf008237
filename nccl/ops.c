/*
 * ops.c - one recorded collective or point-to-point call, issued on MACO or forwarded to the
 * real NCCL (shim.h).
 *
 * ncclGather and ncclScatter have no MACO call: they are a MACO group of sends to (receives
 * at) the root, which MACO runs as one launch, the root's own block a local copy (none in
 * place). PreMulSum ops sum, with MACO_SUM, each rank's input already multiplied by its own
 * scalar (maco_nccl__op_prepare; scale.cu).
 */
#include <stdio.h>
#include <string.h>

#include "shim.h"

static maco_redop_t maco_nccl__maco_op(ncclRedOp_t op)
{
    switch (op) {
    case ncclSum:
        return MACO_SUM;
    case ncclProd:
        return MACO_PROD;
    case ncclMax:
        return MACO_MAX;
    case ncclMin:
        return MACO_MIN;
    case ncclAvg:
        return MACO_AVG;
    default:
        break;
    }
    return MACO_REDOP_COUNT; /* MACO rejects it, naming the op */
}

/* ncclGather/ncclScatter as one MACO group (nested in the caller's group, if any). */
static maco_status_t maco_nccl__gather_scatter(const maco_nccl__op_t *o, maco_datatype_t t)
{
    maco_comm_t mc = o->comm->maco;
    maco_stream_t s = (maco_stream_t)o->stream;
    size_t block = o->count * maco_nccl__type_size(o->type);
    int me = o->comm->rank, root = o->root, n = o->comm->nranks;
    maco_status_t first = maco_group_start();
    if (first != MACO_OK)
        return first;
    maco_status_t st = MACO_OK;
    if (o->kind == MACO_NCCL_GATHER) {
        char *rb = (char *)o->recvbuff;
        int in_place = me == root && rb != NULL && o->sendbuff == rb + (size_t)root * block;
        if (!in_place)
            st = maco_send(o->sendbuff, o->count, t, root, mc, s);
        for (int r = 0; me == root && r < n && st == MACO_OK; r++)
            if (!(in_place && r == root))
                st = maco_recv(rb + (size_t)r * block, o->count, t, r, mc, s);
    } else {
        const char *sb = (const char *)o->sendbuff;
        int in_place = me == root && sb != NULL && o->recvbuff == sb + (size_t)root * block;
        for (int r = 0; me == root && r < n && st == MACO_OK; r++)
            if (!(in_place && r == root))
                st = maco_send(sb + (size_t)r * block, o->count, t, r, mc, s);
        if (!in_place && st == MACO_OK)
            st = maco_recv(o->recvbuff, o->count, t, root, mc, s);
    }
    /* The group is closed whatever happened: after an error inside it, its end issues nothing
     * and returns that first error. */
    maco_status_t end = maco_group_end();
    return st != MACO_OK ? st : end;
}

maco_status_t maco_nccl__op_issue(const maco_nccl__op_t *o)
{
    maco_comm_t mc = o->comm->maco;
    maco_datatype_t t = (maco_datatype_t)maco_nccl__maco_type(o->type);
    maco_redop_t op = o->premul ? MACO_SUM : maco_nccl__maco_op(o->op);
    maco_stream_t s = (maco_stream_t)o->stream;
    switch (o->kind) {
    case MACO_NCCL_ALLREDUCE:
        return maco_allreduce(o->sendbuff, o->recvbuff, o->count, t, op, mc, s);
    case MACO_NCCL_BROADCAST:
        return maco_broadcast(o->sendbuff, o->recvbuff, o->count, t, o->root, mc, s);
    case MACO_NCCL_REDUCE:
        return maco_reduce(o->sendbuff, o->recvbuff, o->count, t, op, o->root, mc, s);
    case MACO_NCCL_ALLGATHER:
        return maco_allgather(o->sendbuff, o->recvbuff, o->count, t, mc, s);
    case MACO_NCCL_REDUCESCATTER:
        return maco_reduce_scatter(o->sendbuff, o->recvbuff, o->count, t, op, mc, s);
    case MACO_NCCL_ALLTOALL:
        return maco_alltoall(o->sendbuff, o->recvbuff, o->count, t, mc, s);
    case MACO_NCCL_SEND:
        return maco_send(o->sendbuff, o->count, t, o->root, mc, s);
    case MACO_NCCL_RECV:
        return maco_recv(o->recvbuff, o->count, t, o->root, mc, s);
    case MACO_NCCL_GATHER:
    case MACO_NCCL_SCATTER:
        return maco_nccl__gather_scatter(o, t);
    }
    return MACO_ERR_INTERNAL;
}

ncclResult_t maco_nccl__op_prepare(maco_nccl__op_t *o, void **tmp_p)
{
    *tmp_p = NULL;
    if (!o->premul || o->count == 0 ||
        (o->kind != MACO_NCCL_ALLREDUCE && o->kind != MACO_NCCL_REDUCE &&
         o->kind != MACO_NCCL_REDUCESCATTER))
        return ncclSuccess;
    size_t n = o->count * (o->kind == MACO_NCCL_REDUCESCATTER ? (size_t)o->comm->nranks : 1);
    size_t bytes = n * maco_nccl__type_size(o->type);
    int cur = -1;
    cudaGetDevice(&cur);
    if (o->comm->device >= 0 && cur != o->comm->device)
        cudaSetDevice(o->comm->device);
    void *tmp = NULL;
    cudaError_t e = cudaMallocAsync(&tmp, bytes, o->stream);
    if (e == cudaSuccess)
        e = maco_nccl__scale(tmp, o->sendbuff, n, o->type, o->device_scalar, o->host_scalar,
                             o->stream);
    if (e != cudaSuccess && tmp != NULL)
        cudaFreeAsync(tmp, o->stream);
    if (o->comm->device >= 0 && cur >= 0 && cur != o->comm->device)
        cudaSetDevice(cur);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return maco_nccl__fail(ncclUnhandledCudaError,
                               "%s with a PreMulSum op: scaling the %zu-byte input into a "
                               "temporary failed: %s",
                               maco_nccl__call_name(o->call), bytes, cudaGetErrorString(e));
    }
    o->sendbuff = tmp;
    *tmp_p = tmp;
    return ncclSuccess;
}

void maco_nccl__op_release(const maco_nccl__op_t *o, void *tmp)
{
    if (tmp == NULL)
        return;
    int cur = -1;
    cudaGetDevice(&cur);
    if (o->comm->device >= 0 && cur != o->comm->device)
        cudaSetDevice(o->comm->device);
    if (cudaFreeAsync(tmp, o->stream) != cudaSuccess)
        cudaGetLastError();
    if (o->comm->device >= 0 && cur >= 0 && cur != o->comm->device)
        cudaSetDevice(cur);
}

/* One op through the real NCCL (inside the real group opened by the caller). */
static ncclResult_t maco_nccl__forward_one(const maco_nccl__real_t *r, const maco_nccl__op_t *o,
                                           void *rc)
{
    ncclRedOp_t op = o->premul ? ncclSum : o->op;
    switch (o->kind) {
    case MACO_NCCL_ALLREDUCE:
        return r->AllReduce(o->sendbuff, o->recvbuff, o->count, o->type, op, rc, o->stream);
    case MACO_NCCL_BROADCAST:
        return r->Broadcast(o->sendbuff, o->recvbuff, o->count, o->type, o->root, rc, o->stream);
    case MACO_NCCL_REDUCE:
        return r->Reduce(o->sendbuff, o->recvbuff, o->count, o->type, op, o->root, rc, o->stream);
    case MACO_NCCL_ALLGATHER:
        return r->AllGather(o->sendbuff, o->recvbuff, o->count, o->type, rc, o->stream);
    case MACO_NCCL_REDUCESCATTER:
        return r->ReduceScatter(o->sendbuff, o->recvbuff, o->count, o->type, op, rc, o->stream);
    case MACO_NCCL_ALLTOALL:
        return r->AlltoAll(o->sendbuff, o->recvbuff, o->count, o->type, rc, o->stream);
    case MACO_NCCL_GATHER:
        return r->Gather(o->sendbuff, o->recvbuff, o->count, o->type, o->root, rc, o->stream);
    case MACO_NCCL_SCATTER:
        return r->Scatter(o->sendbuff, o->recvbuff, o->count, o->type, o->root, rc, o->stream);
    case MACO_NCCL_SEND:
        return r->Send(o->sendbuff, o->count, o->type, o->root, rc, o->stream);
    case MACO_NCCL_RECV:
        return r->Recv(o->recvbuff, o->count, o->type, o->root, rc, o->stream);
    }
    return ncclInternalError;
}

ncclResult_t maco_nccl__op_forward(const maco_nccl__op_t *ops, int n, const char *why)
{
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", why != NULL ? why : "");
    char open_why[512];
    ncclResult_t res = maco_nccl__fallback_open(open_why, sizeof(open_why));
    if (res != ncclSuccess)
        return maco_nccl__fail(res, "%s: MACO cannot run it (%s), and it cannot go to NCCL: %s",
                               maco_nccl__call_name(ops[0].call), reason, open_why);
    /* The real communicators first: their creation is collective and may not sit inside the
     * real group. */
    for (int i = 0; i < n; i++)
        if (maco_nccl__fallback_comm(ops[i].comm) == NULL)
            return ops[i].comm->real_result != ncclSuccess ? ops[i].comm->real_result
                                                           : ncclInvalidUsage;
    const maco_nccl__real_t *r = maco_nccl__real();
    res = r->GroupStart();
    for (int i = 0; i < n && res == ncclSuccess; i++) {
        res = maco_nccl__forward_one(r, &ops[i], ops[i].comm->real);
        if (res == ncclSuccess)
            maco_nccl__count_forwarded(ops[i].call, reason);
    }
    ncclResult_t end = r->GroupEnd();
    if (res == ncclSuccess)
        res = end;
    if (res != ncclSuccess && res != ncclInProgress)
        return maco_nccl__fail(res, "%s forwarded to NCCL: %s", maco_nccl__call_name(ops[0].call),
                               r->GetLastError(NULL));
    return res;
}
