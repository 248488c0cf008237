/*
 * device_api.c - the host functions of NCCL 2.28's device API (nccl_device/ headers), which the
 * real libnccl.so.2 exports too and which applications built against it (PyTorch among them)
 * need at load time (shim.h); those added in 2.29 to 2.31 are in device_query.c.
 *
 * MACO does not provide NCCL's device API (device communicators, LSA/GIN barriers, LL
 * all-to-all handles: kernels written against nccl_device.h): creating one fails with
 * ncclInvalidUsage saying so. The team queries are answered from the communicator's layout:
 * the world team is every rank; the LSA team (ranks that can load and store each other's
 * memory) is the ranks of this node; the rail team is one rank per node, the ones with this
 * rank's local rank. Both assume that a node's ranks are consecutive (as launchers number
 * them). The prototypes are written out with 2.28's ABI, which 2.32 keeps for these calls
 * (2.28's nccl_device.h was C++ only): ncclTeam_t is three ints returned by value
 * (test_nccl_232 checks that against the header).
 */
#include "shim.h"

typedef struct maco_nccl__team {
    int nRanks, rank, stride;
} maco_nccl__team_t;

/* Declarations of what nccl_device/ headers declares (C linkage, default visibility). */
ncclResult_t pncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm);
ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const void *devComm);
maco_nccl__team_t pncclTeamWorld(ncclComm_t comm);
maco_nccl__team_t pncclTeamLsa(ncclComm_t comm);
maco_nccl__team_t pncclTeamRail(ncclComm_t comm);
int pncclTeamRankToWorld(ncclComm_t comm, maco_nccl__team_t team, int rank);
int pncclTeamRankToLsa(ncclComm_t comm, maco_nccl__team_t team, int rank);
ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, maco_nccl__team_t team,
                                              int nBarriers, void *outHandle, void *outReq);
ncclResult_t pncclLsaBarrierCreateRequirement(maco_nccl__team_t team, int nBarriers,
                                              void *outHandle, void *outReq);
int pncclLLA2ACalcSlots(int maxElts, int maxEltSize);
ncclResult_t pncclLLA2ACreateRequirement(int nBlocks, int nSlots, void *outHandle, void *outReq);

static ncclResult_t maco_nccl__no_device_api(const char *what)
{
    return maco_nccl__fail(ncclInvalidUsage,
                           "%s: NCCL's device API (nccl_device.h) is not provided by MACO's "
                           "NCCL library; use MACO's channels (maco/device.h) for custom kernels",
                           what);
}

ncclResult_t pncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm)
{
    return maco_nccl__no_device_api("ncclDevCommCreate");
}
MACO_NCCL_ALIAS(ncclDevCommCreate)

ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const void *devComm)
{
    return maco_nccl__no_device_api("ncclDevCommDestroy");
}
MACO_NCCL_ALIAS(ncclDevCommDestroy)

ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, maco_nccl__team_t team,
                                              int nBarriers, void *outHandle, void *outReq)
{
    return maco_nccl__no_device_api("ncclGinBarrierCreateRequirement");
}
MACO_NCCL_ALIAS(ncclGinBarrierCreateRequirement)

ncclResult_t pncclLsaBarrierCreateRequirement(maco_nccl__team_t team, int nBarriers,
                                              void *outHandle, void *outReq)
{
    return maco_nccl__no_device_api("ncclLsaBarrierCreateRequirement");
}
MACO_NCCL_ALIAS(ncclLsaBarrierCreateRequirement)

ncclResult_t pncclLLA2ACreateRequirement(int nBlocks, int nSlots, void *outHandle, void *outReq)
{
    return maco_nccl__no_device_api("ncclLLA2ACreateRequirement");
}
MACO_NCCL_ALIAS(ncclLLA2ACreateRequirement)

/* No LL all-to-all resources exist here: 0 slots. */
int pncclLLA2ACalcSlots(int maxElts, int maxEltSize)
{
    return 0;
}
MACO_NCCL_ALIAS(ncclLLA2ACalcSlots)

/* This rank's node layout: local rank and ranks on the node, node and nodes; a communicator
 * not (yet) created counts as one node of its ranks. */
static void maco_nccl__layout(ncclComm_t comm, int *local, int *nlocal, int *node, int *nnodes)
{
    struct ncclComm *c = maco_nccl__comm_hold(comm, 0);
    *local = c != NULL ? c->rank : 0;
    *nlocal = c != NULL ? c->nranks : 1;
    *node = 0;
    *nnodes = 1;
    if (c != NULL && c->maco != NULL) {
        maco_comm_get_local_rank(c->maco, local);
        maco_comm_get_local_nranks(c->maco, nlocal);
        maco_comm_get_node(c->maco, node);
        maco_comm_get_nnodes(c->maco, nnodes);
    }
    if (c != NULL)
        maco_nccl__comm_unhold(c);
}

maco_nccl__team_t pncclTeamWorld(ncclComm_t comm)
{
    maco_nccl__team_t t = { 1, 0, 1 };
    struct ncclComm *c = maco_nccl__comm_hold(comm, 0);
    if (c != NULL) {
        t.nRanks = c->nranks;
        t.rank = c->rank;
        maco_nccl__comm_unhold(c);
    }
    return t;
}
MACO_NCCL_ALIAS(ncclTeamWorld)

maco_nccl__team_t pncclTeamLsa(ncclComm_t comm)
{
    int local, nlocal, node, nnodes;
    maco_nccl__layout(comm, &local, &nlocal, &node, &nnodes);
    maco_nccl__team_t t = { nlocal, local, 1 };
    return t;
}
MACO_NCCL_ALIAS(ncclTeamLsa)

maco_nccl__team_t pncclTeamRail(ncclComm_t comm)
{
    int local, nlocal, node, nnodes;
    maco_nccl__layout(comm, &local, &nlocal, &node, &nnodes);
    maco_nccl__team_t t = { nnodes, node, nlocal };
    return t;
}
MACO_NCCL_ALIAS(ncclTeamRail)

/* Team members are this rank plus multiples of the stride. */
int pncclTeamRankToWorld(ncclComm_t comm, maco_nccl__team_t team, int rank)
{
    struct ncclComm *c = maco_nccl__comm_hold(comm, 0);
    int me = c != NULL ? c->rank : 0;
    if (c != NULL)
        maco_nccl__comm_unhold(c);
    return me + (rank - team.rank) * team.stride;
}
MACO_NCCL_ALIAS(ncclTeamRankToWorld)

int pncclTeamRankToLsa(ncclComm_t comm, maco_nccl__team_t team, int rank)
{
    int local, nlocal, node, nnodes;
    maco_nccl__layout(comm, &local, &nlocal, &node, &nnodes);
    return local + (rank - team.rank) * team.stride;
}
MACO_NCCL_ALIAS(ncclTeamRankToLsa)
