/*
 * device_query.c - the host functions that NCCL's device API (nccl_device.h) gained in 2.29 to
 * 2.31 (shim.h; docs/nccl.md): ncclCommQueryProperties, the window pointer and CFT queries,
 * the CFT teams and barriers, and the GIN outbox and inbox requirements its Linux library
 * exports though its header declares them for Windows only.
 *
 * MACO does not provide NCCL's device API (device_api.c), so the properties say so
 * (deviceApiSupport false, no multimem, no GIN, no CFT, no host RMA), the pointer queries and
 * requirements are refused, and the CFT teams hold this rank alone.
 *
 * nccl_device.h cannot be included here: it defines struct ncclWindow_vidmem, NCCL's window,
 * which this library defines as its own (shim.h; the type is opaque to host code), and in C it
 * declares inline functions it never defines. So the prototypes are written out with NCCL
 * 2.32.6's ABI: ncclTeam_t is three ints by value, ncclMultimemHandle_t one pointer by value,
 * the handles and requirements are pointers; ncclCommProperties_t is laid out below
 * (maco_nccl__props_t), its offsets checked here and, against the header itself, by
 * tests/nccl/test_nccl_232.cc.
 */
#include <stdbool.h>
#include <string.h>

#include "shim.h"

typedef struct maco_nccl__team {
    int nRanks, rank, stride;
} maco_nccl__team_t;

typedef struct maco_nccl__multimem {
    void *mcBasePtr;
} maco_nccl__multimem_t;

/* maco_nccl__props_t of 2.32.6 (append-only since 2.29.2, which ends at ginType). */
enum { MACO_NCCL_GIN_TYPE_NONE = 0, MACO_NCCL_GIN_CONNECTION_NONE = 0, MACO_NCCL_GIN_TYPES = 64 };
typedef struct maco_nccl__props {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int rank;
    int nRanks;
    int cudaDev;
    int nvmlDev;
    bool deviceApiSupport;
    bool multimemSupport;
    int ginType; /* ncclGinType_t */
    int nLsaTeams;
    bool hostRmaSupport;
    int railedGinType; /* ncclGinType_t */
    uint64_t commHash;
    int ginMinStride;
    int ginConnectionType; /* ncclGinConnectionType_t */
    bool ginSupport[MACO_NCCL_GIN_TYPES];
    size_t devCommRuntimeVersionSize;
    bool cftSupport;
    bool cftMulticastSupport;
    bool cftCountedSupport;
} maco_nccl__props_t;
_Static_assert(offsetof(maco_nccl__props_t, ginType) == 36 &&
                   offsetof(maco_nccl__props_t, nLsaTeams) == 40 &&
                   offsetof(maco_nccl__props_t, commHash) == 56 &&
                   offsetof(maco_nccl__props_t, ginSupport) == 72 &&
                   offsetof(maco_nccl__props_t, devCommRuntimeVersionSize) == 136 &&
                   offsetof(maco_nccl__props_t, cftCountedSupport) == 146 &&
                   sizeof(maco_nccl__props_t) == 152,
               "ncclCommProperties_t of NCCL 2.32.6 (test_nccl_232 checks the header's)");

/* Whether props, as large as its size field says, holds field (older headers made it smaller:
 * 2.29.2's ends at ginType). */
#define MACO_NCCL_PROPS_HAS(p, field)                                                              \
    ((p)->size >= offsetof(maco_nccl__props_t, field) + sizeof((p)->field))

ncclResult_t pncclCommQueryProperties(ncclComm_t comm, maco_nccl__props_t *props);
ncclResult_t pncclCommQueryProperties(ncclComm_t comm, maco_nccl__props_t *props)
{
    static const char what[] = "ncclCommQueryProperties";
    ncclResult_t res = maco_nccl__comm_ready(comm, what);
    if (res != ncclSuccess)
        return res;
    if (props == NULL)
        return maco_nccl__fail(ncclInvalidArgument, "%s: props is NULL", what);
    if (props->magic != NCCL_API_MAGIC)
        return maco_nccl__fail(ncclInvalidUsage,
                               "%s: props->magic is %#x, not %#x: initialise it with "
                               "NCCL_COMM_PROPERTIES_INITIALIZER",
                               what, props->magic, (unsigned)NCCL_API_MAGIC);
    if (!MACO_NCCL_PROPS_HAS(props, ginType) || props->size > (1u << 20))
        return maco_nccl__fail(ncclInvalidArgument,
                               "%s: props->size is %zu, outside [%zu, 1 MiB]: initialise it with "
                               "NCCL_COMM_PROPERTIES_INITIALIZER",
                               what, props->size,
                               offsetof(maco_nccl__props_t, ginType) + sizeof(props->ginType));
    int nnodes = 1;
    if (comm->maco != NULL)
        maco_comm_get_nnodes(comm->maco, &nnodes);
    props->rank = comm->rank;
    props->nRanks = comm->nranks;
    props->cudaDev = comm->device;
    props->nvmlDev = -1; /* MACO does not use NVML */
    props->deviceApiSupport = false;
    props->multimemSupport = false;
    props->ginType = MACO_NCCL_GIN_TYPE_NONE;
    if (MACO_NCCL_PROPS_HAS(props, nLsaTeams))
        props->nLsaTeams = nnodes; /* ncclTeamLsa: the ranks of a node */
    if (MACO_NCCL_PROPS_HAS(props, hostRmaSupport))
        props->hostRmaSupport = false;
    if (MACO_NCCL_PROPS_HAS(props, railedGinType))
        props->railedGinType = MACO_NCCL_GIN_TYPE_NONE;
    if (MACO_NCCL_PROPS_HAS(props, commHash))
        props->commHash = 0; /* MACO keeps no communicator hash */
    if (MACO_NCCL_PROPS_HAS(props, ginMinStride))
        props->ginMinStride = 0;
    if (MACO_NCCL_PROPS_HAS(props, ginConnectionType))
        props->ginConnectionType = MACO_NCCL_GIN_CONNECTION_NONE;
    if (MACO_NCCL_PROPS_HAS(props, ginSupport))
        memset(props->ginSupport, 0, sizeof(props->ginSupport));
    if (MACO_NCCL_PROPS_HAS(props, devCommRuntimeVersionSize))
        props->devCommRuntimeVersionSize = 0;
    if (MACO_NCCL_PROPS_HAS(props, cftSupport))
        props->cftSupport = false;
    if (MACO_NCCL_PROPS_HAS(props, cftMulticastSupport))
        props->cftMulticastSupport = false;
    if (MACO_NCCL_PROPS_HAS(props, cftCountedSupport))
        props->cftCountedSupport = false;
    return ncclSuccess;
}
MACO_NCCL_ALIAS(ncclCommQueryProperties)

/* ------------------------------------------------------------------ refused */

static ncclResult_t maco_nccl__no_device_query(const char *what)
{
    return maco_nccl__fail(ncclInvalidUsage,
                           "%s: NCCL's device API (nccl_device.h: device communicators, "
                           "symmetric window pointers, multimem, GIN, CFT) is not provided by "
                           "MACO's NCCL library (ncclCommQueryProperties says "
                           "deviceApiSupport = false); use MACO's channels (maco/device.h) for "
                           "custom kernels",
                           what);
}

ncclResult_t pncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr);
ncclResult_t pncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr)
{
    return maco_nccl__no_device_query("ncclGetLsaMultimemDevicePointer");
}
MACO_NCCL_ALIAS(ncclGetLsaMultimemDevicePointer)

ncclResult_t pncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                           maco_nccl__multimem_t multimem, void **outPtr);
ncclResult_t pncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                           maco_nccl__multimem_t multimem, void **outPtr)
{
    return maco_nccl__no_device_query("ncclGetMultimemDevicePointer");
}
MACO_NCCL_ALIAS(ncclGetMultimemDevicePointer)

ncclResult_t pncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
                                      void **outPtr);
ncclResult_t pncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
                                      void **outPtr)
{
    return maco_nccl__no_device_query("ncclGetLsaDevicePointer");
}
MACO_NCCL_ALIAS(ncclGetLsaDevicePointer)

ncclResult_t pncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void **outPtr);
ncclResult_t pncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void **outPtr)
{
    return maco_nccl__no_device_query("ncclGetPeerDevicePointer");
}
MACO_NCCL_ALIAS(ncclGetPeerDevicePointer)

ncclResult_t pncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, uint32_t *leId,
                                          size_t *leOffset);
ncclResult_t pncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, uint32_t *leId,
                                          size_t *leOffset)
{
    return maco_nccl__no_device_query("ncclGetMultimemDeviceLeInfo");
}
MACO_NCCL_ALIAS(ncclGetMultimemDeviceLeInfo)

ncclResult_t pncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft,
                                     maco_nccl__team_t cftTeam, uint32_t *leId, size_t *leOffset);
ncclResult_t pncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft,
                                     maco_nccl__team_t cftTeam, uint32_t *leId, size_t *leOffset)
{
    return maco_nccl__no_device_query("ncclGetCftDeviceLeInfo");
}
MACO_NCCL_ALIAS(ncclGetCftDeviceLeInfo)

ncclResult_t pncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld,
                                      uint32_t *leId, size_t *leOffset);
ncclResult_t pncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld,
                                      uint32_t *leId, size_t *leOffset)
{
    return maco_nccl__no_device_query("ncclGetPeerDeviceLeInfo");
}
MACO_NCCL_ALIAS(ncclGetPeerDeviceLeInfo)

ncclResult_t pncclCftBarrierCreateRequirement(maco_nccl__team_t team, int nBarriers,
                                              void *outHandle, void *outReq);
ncclResult_t pncclCftBarrierCreateRequirement(maco_nccl__team_t team, int nBarriers,
                                              void *outHandle, void *outReq)
{
    return maco_nccl__no_device_query("ncclCftBarrierCreateRequirement");
}
MACO_NCCL_ALIAS(ncclCftBarrierCreateRequirement)

/* Declared by nccl_device/host.h for Windows only, exported by NCCL's Linux library (2.30+):
 * exported here too, with the same arguments (the handles and requirements as pointers). */
ncclResult_t pncclGinOutboxCreateRequirement(int nBlocks, int size_log2, void *outHandle,
                                             void *outReq);
ncclResult_t pncclGinOutboxCreateRequirement(int nBlocks, int size_log2, void *outHandle,
                                             void *outReq)
{
    return maco_nccl__no_device_query("ncclGinOutboxCreateRequirement");
}
MACO_NCCL_ALIAS(ncclGinOutboxCreateRequirement)

ncclResult_t pncclGinInboxA2ACreateRequirement(maco_nccl__team_t peers, int nBlocks, int size_log2,
                                               void *outHandle, void *outReq);
ncclResult_t pncclGinInboxA2ACreateRequirement(maco_nccl__team_t peers, int nBlocks, int size_log2,
                                               void *outHandle, void *outReq)
{
    return maco_nccl__no_device_query("ncclGinInboxA2ACreateRequirement");
}
MACO_NCCL_ALIAS(ncclGinInboxA2ACreateRequirement)

/* ------------------------------------------------------------------ CFT teams */

/* Without the CFT fabric a rank reaches no other rank through it: the team of this rank alone
 * (a team cannot carry an error). */
maco_nccl__team_t pncclTeamCft(ncclComm_t comm, int mode);
maco_nccl__team_t pncclTeamCft(ncclComm_t comm, int mode)
{
    maco_nccl__team_t t = { 1, 0, 1 };
    return t;
}
MACO_NCCL_ALIAS(ncclTeamCft)

maco_nccl__team_t pncclTeamCftMultimem(ncclComm_t comm);
maco_nccl__team_t pncclTeamCftMultimem(ncclComm_t comm)
{
    maco_nccl__team_t t = { 1, 0, 1 };
    return t;
}
MACO_NCCL_ALIAS(ncclTeamCftMultimem)
