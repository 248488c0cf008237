/*
 * setup.c - the collectives' resources on a communicator: their buffer (layout in
 * state.h), mapped by every peer, the rsag CTAs' memory channels, the registry of
 * buffers usable in place, and their settings.
 *
 * The communicator knows nothing of collectives: this file defines the hook
 * maco__collectives_extension that comm_internal.h declares (weak), and the communicator calls
 * the extension it returns at creation and destruction and when memory is registered. So
 * src/host never calls into algorithms/, and a program linked with libmaco.a that uses no
 * collective carries none of this.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/collectives/collectives.h"
#include "algorithms/common/registry.h"
#include "algorithms/common/select.h"
#include "algorithms/p2p/p2p.h"
#include "algorithms/plan/plan_internal.h"
#include "algorithms/tuning.h"
#include "src/host/base/align.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"

/* Reads and checks the sizes that shape the buffer; `nranks`: the job's world size (equal on
 * every rank, so every rank takes the same default). */
static maco_status_t maco__coll_read_sizes(maco__coll_sizes_t *z, int nranks)
{
    int64_t oneshot, scratch, ctas, lanes, chunk, hier;
    maco_status_t st = maco__config_int64(MACO_CFG_ALLREDUCE_ONESHOT_MAX, &oneshot);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_HIER_CTAS, &hier);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_SCRATCH_SIZE, &scratch);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_ALLREDUCE_RSAG_CTAS, &ctas);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_P2P_LANES, &lanes);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_P2P_CHUNK_SIZE, &chunk);
    if (st != MACO_OK)
        return st;
    /* MACO_ALLREDUCE_ONESHOT_MAX's default in a job of at most two ranks (algorithms/tuning.h,
     * LL_MAX_TWO_RANKS); the LL scratch is 8 x ranks x this many bytes (common/state.h). */
    if (!maco__config_is_set(MACO_CFG_ALLREDUCE_ONESHOT_MAX) && nranks <= 2)
        oneshot = (int64_t)MACO__TUNING_LL_MAX_TWO_RANKS;
    if (lanes < 1 || lanes > MACO__P2P_MAX_LANES)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "MACO_P2P_LANES=%lld is outside [1, %d]", (long long)lanes,
                           MACO__P2P_MAX_LANES);
    if (chunk != 0 && (chunk < ((int64_t)16 << 10) || chunk > ((int64_t)4 << 20)))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "MACO_P2P_CHUNK_SIZE=%lld is outside [16K, 4M] bytes (or 0: automatic)",
                           (long long)chunk);
    if (hier < 1 || hier > MACO__HIER_MAX_SLOTS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "MACO_HIER_CTAS=%lld is outside [1, %d]", (long long)hier,
                           MACO__HIER_MAX_SLOTS);
    if (ctas < 1 || ctas > MACO__RSAG_MAX_SLOTS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "MACO_ALLREDUCE_RSAG_CTAS=%lld is outside [1, %d]", (long long)ctas,
                           MACO__RSAG_MAX_SLOTS);
    if (oneshot < 16 || oneshot > ((int64_t)64 << 20))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "MACO_ALLREDUCE_ONESHOT_MAX=%lld is outside [16, 64M] bytes",
                           (long long)oneshot);
    if (scratch < ((int64_t)1 << 20) || scratch > ((int64_t)16 << 30))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "MACO_SCRATCH_SIZE=%lld is outside [1M, 16G] bytes", (long long)scratch);
    memset(z, 0, sizeof(*z));
    z->rsag_ctas = (int32_t)ctas;
    z->oneshot_max = maco__align_up((size_t)oneshot, 16);
    z->scratch_bytes = (uint64_t)scratch;
    z->p2p_lanes = (int32_t)lanes;
    z->hier_ctas = (int32_t)hier;
    z->p2p_chunk = maco__align_up((size_t)chunk, 16);
    return MACO_OK;
}

static void maco__coll_destroy(maco_comm_t comm)
{
    maco__coll_t *c = maco__coll_of(comm);
    if (c == NULL)
        return;
    if (c->proxy != NULL)
        maco_proxy_stop(c->proxy);
    if (c->rail != NULL) {
        size_t nch = (size_t)c->layout.hier_slots * (size_t)c->nnodes * 2;
        for (size_t i = 0; i < nch; i++)
            maco_port_channel_destroy(c->rail[i]);
    }
    maco__p2p_internode_free(comm, c);
    maco_proxy_destroy(c->proxy);
    if (c->peer_rail_mem != NULL)
        for (int k = 0; k < c->nnodes; k++)
            maco_mem_deregister(c->peer_rail_mem[k]);
    maco_mem_deregister(c->rail_mem);
    if (c->rail_buf)
        cudaFreeHost(c->rail_buf);
    maco__plan_free_forced(c);
    maco__registry_free(comm);
    if (c->peer_buf_mem != NULL)
        for (int r = 0; r < comm->nranks; r++)
            maco_mem_deregister(c->peer_buf_mem[r]);
    maco_mem_deregister(c->buf_mem);
    if (c->rsag_channels)
        cudaFree(c->rsag_channels);
    if (c->p2p_channels)
        cudaFree(c->p2p_channels);
    if (c->rail_dev)
        cudaFree(c->rail_dev);
    if (c->rank_at_dev)
        cudaFree(c->rank_at_dev);
    if (c->buf)
        cudaFree(c->buf);
    cudaGetLastError();
    free(c->rail);
    free(c->peer_rail_mem);
    free(c->rank_at);
    free(c->peer_buf);
    free(c->peer_buf_mem);
    free(c);
    comm->coll = NULL;
}

/*
 * Where every rank sits: rank_at[k * local_nranks + i] is local index i of node k. Returns 0 and
 * writes why (every rank decides alike) when the collectives cannot work on this topology:
 * more ranks on a node than MACO__MAX_LOCAL_RANKS, or nodes with different numbers of ranks
 * (the rails pair local index i of every node).
 */
static int maco__coll_topology(maco_comm_t comm, int **rank_at_p, char *why, size_t why_bytes,
                               maco_status_t *st_p)
{
    const int n = comm->nranks, nn = comm->nnodes, local_nranks = comm->local_nranks;
    int32_t *where = (int32_t *)calloc((size_t)n * 2, sizeof(int32_t));
    int *rank_at = (int *)malloc((size_t)n * sizeof(int));
    int *count = (int *)calloc((size_t)nn, sizeof(int));
    *st_p = MACO_OK;
    if (where == NULL || rank_at == NULL || count == NULL) {
        *st_p = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "collectives setup: no memory");
        goto fail;
    }
    where[2 * comm->rank] = comm->node;
    where[2 * comm->rank + 1] = comm->local_rank;
    *st_p = maco_bootstrap_allgather(comm->bs, where, 2 * sizeof(int32_t));
    if (*st_p != MACO_OK)
        goto fail;
    for (int r = 0; r < n; r++)
        if (where[2 * r] >= 0 && where[2 * r] < nn)
            count[where[2 * r]]++;
    for (int k = 0; k < nn; k++) {
        if (count[k] > MACO__MAX_LOCAL_RANKS) {
            snprintf(why, why_bytes, "%d ranks on node %d; collectives support at most %d",
                     count[k], k, MACO__MAX_LOCAL_RANKS);
            goto fail;
        }
        if (count[k] != local_nranks) {
            snprintf(why, why_bytes,
                     "node %d has %d ranks and node %d has %d; collectives across nodes need "
                     "the same number of ranks on every node (local rank i of each node forms "
                     "rail i)",
                     comm->node, local_nranks, k, count[k]);
            goto fail;
        }
    }
    for (int r = 0; r < n; r++)
        rank_at[where[2 * r] * local_nranks + where[2 * r + 1]] = r;
    free(where);
    free(count);
    *rank_at_p = rank_at;
    return 1;
fail:
    free(where);
    free(rank_at);
    free(count);
    return 0;
}

/*
 * Across nodes: the rail buffer, the collectives' proxy and, per hier slot and other node,
 * two port channels to the rail peer there (data, acknowledgements), from this rank's rail
 * buffer to the peer's. Created node by node, slot by slot, in the same order on every rank,
 * so the pairwise creations never wait in a cycle.
 *
 * The rail buffer is pinned host memory that the kernels read and write through its mapping
 * (PCIe), not GPU memory, so that a transfer between nodes never needs the CUDA API or a copy
 * engine: the kernel writes what it sends into host memory and the proxy hands it to the
 * transport as it is; the receiving proxy stores it there and raises a host semaphore the
 * kernel polls. With GPU memory the proxy of a TCP rail copies to and from the GPU with
 * cudaMemcpyAsync on its own stream, and that copy can wait behind work the application
 * queued after the collective (a cudaMemcpy of the result on the collective's stream): the
 * collective then waits for its own successor: every such call hung until
 * MACO_DEVICE_TIMEOUT, while the same calls with nothing queued behind them passed
 * (docs/performance.md, "Tuning", "Rail buffers in host memory"). The cost is PCIe bandwidth,
 * which is far above a network rail's.
 */
static maco_status_t maco__coll_rails(maco_comm_t comm, maco__coll_t *c)
{
    const int nn = c->nnodes, slots = c->layout.hier_slots;
    const size_t nch = (size_t)slots * (size_t)nn * 2;
    const size_t rail_bytes = (size_t)slots * c->layout.rail_slot_bytes;
    c->rail = (maco_port_channel_t *)calloc(nch, sizeof(maco_port_channel_t));
    c->peer_rail_mem = (maco_mem_t *)calloc((size_t)nn, sizeof(maco_mem_t));
    maco_port_channel_device_t *h =
        (maco_port_channel_device_t *)calloc(nch, sizeof(maco_port_channel_device_t));
    uint8_t *handles = (uint8_t *)calloc((size_t)comm->nranks, MACO_MEM_HANDLE_BYTES);
    maco_status_t st = MACO_OK;
    if (c->rail == NULL || c->peer_rail_mem == NULL || h == NULL || handles == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "collectives setup: no memory");
        goto out;
    }
    MACO_CUDA_GOTO(cudaHostAlloc((void **)&c->rail_buf, rail_bytes, cudaHostAllocMapped), st, out);
    memset(c->rail_buf, 0, rail_bytes);
    MACO_CUDA_GOTO(cudaHostGetDevicePointer((void **)&c->rail_buf_dev, c->rail_buf, 0), st, out);
    st = maco_mem_register(comm, c->rail_buf, rail_bytes, &c->rail_mem);
    if (st == MACO_OK)
        st = maco_mem_serialize(c->rail_mem, handles + (size_t)comm->rank * MACO_MEM_HANDLE_BYTES);
    if (st == MACO_OK)
        st = maco_bootstrap_allgather(comm->bs, handles, MACO_MEM_HANDLE_BYTES);
    for (int k = 0; k < nn && st == MACO_OK; k++)
        if (k != c->node)
            st =
                maco_mem_import(comm,
                                handles + (size_t)c->rank_at[k * c->local_nranks + c->local_index] *
                                              MACO_MEM_HANDLE_BYTES,
                                &c->peer_rail_mem[k]);
    if (st == MACO_OK)
        st = maco_proxy_create(comm, &c->proxy);
    if (st == MACO_OK)
        st = maco_proxy_start(c->proxy);
    for (int k = 0; k < nn && st == MACO_OK; k++) {
        if (k == c->node)
            continue;
        int peer = c->rank_at[k * c->local_nranks + c->local_index];
        for (int b = 0; b < slots && st == MACO_OK; b++)
            for (int w = 0; w < 2 && st == MACO_OK; w++) {
                size_t i = ((size_t)b * (size_t)nn + (size_t)k) * 2 + (size_t)w;
                st = maco_port_channel_create(c->proxy, peer, MACO_TRANSPORT_AUTO, c->rail_mem,
                                              c->peer_rail_mem[k], &c->rail[i]);
                if (st == MACO_OK)
                    st = maco_port_channel_get_device_handle(c->rail[i], &h[i]);
            }
    }
    if (st != MACO_OK)
        goto out;
    MACO_CUDA_GOTO(cudaMalloc((void **)&c->rail_dev, nch * sizeof(*h)), st, out);
    MACO_CUDA_GOTO(cudaMemcpy(c->rail_dev, h, nch * sizeof(*h), cudaMemcpyHostToDevice), st, out);
    MACO_CUDA_GOTO(cudaMalloc((void **)&c->rank_at_dev, (size_t)comm->nranks * sizeof(int)), st,
                   out);
    MACO_CUDA_GOTO(cudaMemcpy(c->rank_at_dev, c->rank_at, (size_t)comm->nranks * sizeof(int),
                              cudaMemcpyHostToDevice),
                   st, out);
out:
    free(h);
    free(handles);
    return st;
}

/* Every kernel the collectives may launch, loaded now (collectives/collectives.h, "Kernel
 * preloading"). */
static maco_status_t maco__coll_preload(maco_comm_t comm)
{
    static cudaError_t (*const preload[])(void) = {
        maco__preload_coll_int8,    maco__preload_coll_uint8,    maco__preload_coll_int32,
        maco__preload_coll_uint32,  maco__preload_coll_int64,    maco__preload_coll_uint64,
        maco__preload_coll_float16, maco__preload_coll_bfloat16, maco__preload_coll_float32,
        maco__preload_coll_float64, maco__preload_coll_fp8_e4m3, maco__preload_coll_fp8_e5m2,
        maco__preload_p2p,
    };
    for (size_t i = 0; i < sizeof(preload) / sizeof(preload[0]); i++) {
        cudaError_t e = preload[i]();
        if (e != cudaSuccess)
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_INIT,
                               "rank %d: loading the collectives' kernels on device %d "
                               "(cudaFuncGetAttributes) failed: %s (%s); was MACO built for this "
                               "GPU's architecture (CMAKE_CUDA_ARCHITECTURES)?",
                               comm->rank, comm->cuda_device, cudaGetErrorName(e),
                               cudaGetErrorString(e));
    }
    return MACO_OK;
}

/* The sizes that shape the buffer, this rank's in *mine, compared across ranks (collective):
 * *alike_p is 0 when a rank's differ (then GPU operations are unavailable on the communicator,
 * and say why), else 1. */
static maco_status_t maco__coll_sizes_agree(maco_comm_t comm, const maco__coll_sizes_t *mine,
                                            int *alike_p)
{
    const int n = comm->nranks;
    char why[500];
    maco_status_t st;
    maco__coll_sizes_t *all = (maco__coll_sizes_t *)calloc((size_t)n, sizeof(*all));
    if (all == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "collectives setup: no memory");
    all[comm->rank] = *mine;
    st = maco_bootstrap_allgather(comm->bs, all, sizeof(*all));
    for (int r = 0; st == MACO_OK && r < n; r++) {
        if (all[r].oneshot_max == all[0].oneshot_max &&
            all[r].scratch_bytes == all[0].scratch_bytes && all[r].rsag_ctas == all[0].rsag_ctas &&
            all[r].p2p_lanes == all[0].p2p_lanes && all[r].p2p_chunk == all[0].p2p_chunk &&
            all[r].hier_ctas == all[0].hier_ctas)
            continue;
        snprintf(why, sizeof(why),
                 "MACO_ALLREDUCE_ONESHOT_MAX, MACO_SCRATCH_SIZE, MACO_ALLREDUCE_RSAG_CTAS, "
                 "MACO_P2P_LANES, MACO_P2P_CHUNK_SIZE or MACO_HIER_CTAS differs between rank 0 "
                 "(%llu, %llu, %d, %d, %llu, %d) and rank %d (%llu, %llu, %d, %d, %llu, %d); set "
                 "them alike on all ranks",
                 (unsigned long long)all[0].oneshot_max, (unsigned long long)all[0].scratch_bytes,
                 (int)all[0].rsag_ctas, (int)all[0].p2p_lanes, (unsigned long long)all[0].p2p_chunk,
                 (int)all[0].hier_ctas, r, (unsigned long long)all[r].oneshot_max,
                 (unsigned long long)all[r].scratch_bytes, (int)all[r].rsag_ctas,
                 (int)all[r].p2p_lanes, (unsigned long long)all[r].p2p_chunk,
                 (int)all[r].hier_ctas);
        maco__comm_set_unavailable(comm, why);
        MACO_INFO(MACO_SUBSYS_INIT, "rank %d: GPU operations unavailable: %s", comm->rank, why);
        free(all);
        *alike_p = 0;
        return MACO_OK; /* every rank saw the same sizes and decided alike */
    }
    free(all);
    if (st == MACO_OK)
        *alike_p = 1;
    return st;
}

/* The peers' buffers (mapped from the ranks of this node, imported without a mapping from
 * the others) and the memory channels with every local peer: one per rsag slot, then one per
 * p2p lane, copied to the device. Collective over the node's ranks, in rank order. */
static maco_status_t maco__coll_channels(maco_comm_t comm, maco__coll_t *c, const int *local)
{
    const int n = comm->nranks, local_nranks = c->local_nranks;
    const maco__coll_layout_t *l = &c->layout;
    const int slots = l->rsag_slots;
    const int lanes = l->p2p_lanes;
    maco_status_t st = MACO_OK;
    c->peer_buf = (char **)calloc((size_t)local_nranks, sizeof(char *));
    c->peer_buf_mem = (maco_mem_t *)calloc((size_t)n, sizeof(maco_mem_t));
    char **ptr = (char **)calloc((size_t)n, sizeof(char *));
    maco_memory_channel_device_t *chans = (maco_memory_channel_device_t *)calloc(
        (size_t)slots * (size_t)local_nranks, sizeof(maco_memory_channel_device_t));
    /* Room for either a peer's rsag channels or its p2p lanes. */
    maco_memory_channel_device_t *peer_chans = (maco_memory_channel_device_t *)calloc(
        (size_t)(slots > lanes ? slots : lanes), sizeof(maco_memory_channel_device_t));
    maco_memory_channel_device_t *p2p_chans = (maco_memory_channel_device_t *)calloc(
        (size_t)local_nranks * (size_t)lanes, sizeof(maco_memory_channel_device_t));
    if (c->peer_buf == NULL || c->peer_buf_mem == NULL || ptr == NULL || chans == NULL ||
        peer_chans == NULL || p2p_chans == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "collectives setup: no memory");
        goto out;
    }
    /* Every rank's buffer: mapped from the ranks of this node, imported without a mapping
     * from the others (the rails' port channels put into them). */
    st = maco__mem_exchange(comm, c->buf_mem, ptr, c->peer_buf_mem);
    if (st != MACO_OK)
        goto out;
    for (int i = 0; i < local_nranks; i++)
        c->peer_buf[i] = ptr[local[i]];
    /* rsag channels: for every local peer in rank order, one channel per slot; then its p2p
     * credit channels, one per lane. The pairwise exchanges happen in the same global order
     * on all ranks, so none waits in a cycle. */
    for (int i = 0; i < local_nranks; i++) {
        const int p = local[i];
        if (p == comm->rank)
            continue;
        st =
            maco__memory_channels_setup(comm, p, c->buf_mem, c->peer_buf_mem[p], slots, peer_chans);
        if (st != MACO_OK)
            goto out;
        for (int b = 0; b < slots; b++)
            chans[(size_t)b * (size_t)local_nranks + (size_t)i] = peer_chans[b];
        st =
            maco__memory_channels_setup(comm, p, c->buf_mem, c->peer_buf_mem[p], lanes, peer_chans);
        if (st != MACO_OK)
            goto out;
        for (int b = 0; b < lanes; b++)
            p2p_chans[(size_t)i * (size_t)lanes + (size_t)b] = peer_chans[b];
    }
    MACO_CUDA_GOTO(cudaMalloc((void **)&c->rsag_channels,
                              (size_t)slots * (size_t)local_nranks * sizeof(*chans)),
                   st, out);
    MACO_CUDA_GOTO(cudaMemcpy(c->rsag_channels, chans,
                              (size_t)slots * (size_t)local_nranks * sizeof(*chans),
                              cudaMemcpyHostToDevice),
                   st, out);
    MACO_CUDA_GOTO(cudaMalloc((void **)&c->p2p_channels,
                              (size_t)local_nranks * (size_t)lanes * sizeof(*p2p_chans)),
                   st, out);
    MACO_CUDA_GOTO(cudaMemcpy(c->p2p_channels, p2p_chans,
                              (size_t)local_nranks * (size_t)lanes * sizeof(*p2p_chans),
                              cudaMemcpyHostToDevice),
                   st, out);
out:
    free(ptr);
    free(chans);
    free(peer_chans);
    free(p2p_chans);
    return st;
}

/* What needs the buffer and the channels: the registry, the kernels loaded, the rails across
 * nodes, a forced plan, the CTA cap agreed by every rank. */
static maco_status_t maco__coll_setup_rest(maco_comm_t comm, maco__coll_t *c)
{
    maco_status_t st = maco__registry_setup(comm);
    if (st == MACO_OK)
        st = maco__coll_preload(comm);
    if (st == MACO_OK && c->nnodes > 1)
        st = maco__coll_rails(comm, c);
    if (st == MACO_OK)
        st = maco__plan_load_forced(comm, c);
    if (st == MACO_OK) { /* every rank, so the exchange pairs up even where the value is 0 */
        int64_t cap = 0;
        st = maco__config_int64(MACO_CFG_COLL_MAX_CTAS, &cap);
        if (st == MACO_OK && (cap < 0 || cap > INT32_MAX))
            st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                             "MACO_COLL_MAX_CTAS=%lld: must be in [0, %d]", (long long)cap,
                             INT32_MAX);
        if (st == MACO_OK)
            st = maco__coll_agree_max_ctas(comm, c, (int)cap, "MACO_COLL_MAX_CTAS");
    }
    return st;
}

static maco_status_t maco__coll_setup(maco_comm_t comm)
{
    /* Every rank decides alike from what all of them know (the topology). */
    int *rank_at = NULL;
    maco_status_t st = MACO_OK;
    if (!maco__coll_topology(comm, &rank_at, comm->ext_unavailable, sizeof(comm->ext_unavailable),
                             &st)) {
        if (st != MACO_OK)
            return st;
        MACO_INFO(MACO_SUBSYS_INIT, "rank %d: collectives unavailable: %s", comm->rank,
                  comm->ext_unavailable);
        return MACO_OK;
    }
    maco__coll_sizes_t mine;
    st = maco__coll_read_sizes(&mine, comm->nranks);
    if (st != MACO_OK) {
        free(rank_at);
        return st;
    }
    int alike = 0;
    st = maco__coll_sizes_agree(comm, &mine, &alike);
    if (st != MACO_OK || !alike) {
        free(rank_at);
        return st;
    }

    maco__coll_t *c = (maco__coll_t *)calloc(1, sizeof(*c));
    if (c == NULL) {
        free(rank_at);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "collectives setup: no memory");
    }
    comm->coll = c; /* from here on, maco__coll_destroy frees what exists */
    c->rank_at = rank_at;
    c->local_nranks = comm->local_nranks;
    c->local_index = comm->local_rank;
    c->nnodes = comm->nnodes;
    c->node = comm->node;
    const int local_nranks = c->local_nranks;
    const int *local = rank_at + (size_t)c->node * (size_t)local_nranks; /* local index -> rank */
    st = maco__coll_read_settings(c);
    if (st != MACO_OK)
        return st;
    maco__coll_layout(&c->layout, local_nranks, c->nnodes, &mine);
    const maco__coll_layout_t *l = &c->layout;
    if (c->nnodes > 1 && l->hier_piece_max < 4096) {
        snprintf(comm->ext_unavailable, sizeof(comm->ext_unavailable),
                 "collectives across %d nodes need pieces of at least 4 KiB: raise "
                 "MACO_SCRATCH_SIZE (%llu bytes) or lower MACO_HIER_CTAS (%d)",
                 c->nnodes, (unsigned long long)mine.scratch_bytes, (int)mine.hier_ctas);
        MACO_INFO(MACO_SUBSYS_INIT, "rank %d: collectives unavailable: %s", comm->rank,
                  comm->ext_unavailable);
        maco__coll_destroy(comm);
        return MACO_OK; /* every rank computed the same layout */
    }
    MACO_CUDA_RETURN(cudaMalloc((void **)&c->buf, l->total_bytes));
    MACO_CUDA_RETURN(cudaMemset(c->buf, 0, l->total_bytes));
    uint32_t one = 1;
    MACO_CUDA_RETURN(
        cudaMemcpy(c->buf + MACO__CTR_LL_FLAG, &one, sizeof(one), cudaMemcpyHostToDevice));
    st = maco_mem_register(comm, c->buf, l->total_bytes, &c->buf_mem);
    if (st != MACO_OK)
        return st;
    st = maco__coll_channels(comm, c, local);
    if (st == MACO_OK)
        st = maco__coll_setup_rest(comm, c);
    return st;
}

maco_status_t maco__coll_require(maco_comm_t comm, const char *fn, maco__coll_t **c_p)
{
    maco_status_t st = maco__comm_require_gpu(comm, fn);
    if (st != MACO_OK)
        return st;
    maco__coll_t *c = maco__coll_of(comm);
    if (c == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                                                   "%s: the collectives were not set up on this "
                                                   "communicator%s%s",
                                                   fn, comm->ext_unavailable[0] ? ": " : "",
                                                   comm->ext_unavailable));
    *c_p = c;
    return MACO_OK;
}

static int maco__coll_on_register(maco_comm_t comm, maco_mem_t mem, const void *ptr, size_t bytes)
{
    return maco__coll_of(comm) != NULL ? maco__registry_publish(comm, mem, ptr, bytes) : 0;
}

static void maco__coll_on_deregister(maco_comm_t comm, maco_mem_t mem)
{
    if (maco__coll_of(comm) != NULL)
        maco__registry_withdraw(comm, mem);
}

static const maco__comm_ext_t maco__coll_ext = {
    maco__coll_setup,
    maco__coll_destroy,
    maco__coll_on_register,
    maco__coll_on_deregister,
};

/* The collectives' registration with every communicator: the hook comm_internal.h declares
 * (weak, so that src/host names it without depending on algorithms/), which the communicator
 * calls through maco__comm_extension at creation, destruction and memory registration. */
const maco__comm_ext_t *maco__collectives_extension(void)
{
    return &maco__coll_ext;
}
