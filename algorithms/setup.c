/*
 * setup.c - the collectives' resources on a communicator: their buffer (layout in
 * algorithms.h), mapped by every peer, the rsag CTAs' memory channels, the registry of
 * buffers usable in place, and their settings.
 *
 * The communicator knows nothing of collectives: this file installs an extension
 * (comm_internal.h) when the library loads, and the communicator calls it at creation and
 * destruction and when memory is registered. So src/host never calls into algorithms/, and
 * a program linked with libmaco.a that uses no collective carries none of this.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "config.h"
#include "cuda_util.h"
#include "log.h"

/* The sizes that shape the buffer; every rank must have the same (fixed layout). */
typedef struct maco__coll_sizes {
    uint64_t oneshot_max;
    uint64_t scratch_bytes;
    int32_t rsag_ctas;
    int32_t p2p_lanes;
    uint64_t p2p_chunk;
} maco__coll_sizes_t;

static size_t maco__align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

static void maco__coll_layout(maco__coll_layout_t *l, int nranks, const maco__coll_sizes_t *z)
{
    size_t oneshot_max = z->oneshot_max, scratch_bytes = z->scratch_bytes;
    int rsag_slots = z->rsag_ctas;
    memset(l, 0, sizeof(*l));
    l->rsag_slots = rsag_slots;
    l->oneshot_max = oneshot_max;
    l->desc_offset = 256; /* after the counters */
    l->ll_offset = maco__align_up(l->desc_offset + 2 * (size_t)nranks * MACO__DESC_BYTES, 256);
    /* LL16 doubles the bytes; two-shot needs two regions of blocks up to oneshot_max. */
    l->ll_slot_bytes = 4 * oneshot_max;
    l->rsag_offset = maco__align_up(l->ll_offset + 2 * (size_t)nranks * l->ll_slot_bytes, 256);
    /* rsag: per slot, n IN and n OUT pieces. */
    size_t piece = scratch_bytes / ((size_t)rsag_slots * 2 * (size_t)nranks);
    piece = piece / 256 * 256;
    if (piece < 256)
        piece = 256;
    l->rsag_piece_max = piece;
    l->rsag_slot_bytes = 2 * (size_t)nranks * piece;
    /* send/recv and all-to-all (p2p_kernels.cu): per source rank, lane and slot. */
    size_t n = (size_t)nranks, lanes = (size_t)z->p2p_lanes, slots = MACO__P2P_SLOTS;
    l->p2p_lanes = z->p2p_lanes;
    l->p2p_chunk = z->p2p_chunk;
    l->p2p_cp_slot_bytes = maco__align_up(z->p2p_chunk + 16, 256);
    l->p2p_ctr_offset =
        maco__align_up(l->rsag_offset + (size_t)rsag_slots * l->rsag_slot_bytes, 256);
    l->p2p_hdr_offset = maco__align_up(l->p2p_ctr_offset + 2 * n * lanes * sizeof(uint64_t), 256);
    l->p2p_ll_offset = maco__align_up(l->p2p_hdr_offset + n * lanes * slots * 16, 256);
    l->p2p_cp_offset =
        maco__align_up(l->p2p_ll_offset + n * lanes * slots * MACO__P2P_LL_SLOT, 256);
    l->total_bytes = l->p2p_cp_offset + n * lanes * slots * l->p2p_cp_slot_bytes;
}

/* Reads and checks the sizes that shape the buffer. */
static maco_status_t maco__coll_read_sizes(maco__coll_sizes_t *z)
{
    int64_t oneshot, scratch, ctas, lanes, chunk;
    maco_status_t st = maco__config_int64(MACO_CFG_ALLREDUCE_ONESHOT_MAX, &oneshot);
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
    if (lanes < 1 || lanes > MACO__P2P_MAX_LANES)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "MACO_P2P_LANES=%lld is outside [1, %d]", (long long)lanes,
                           MACO__P2P_MAX_LANES);
    if (chunk < ((int64_t)16 << 10) || chunk > ((int64_t)4 << 20))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "MACO_P2P_CHUNK_SIZE=%lld is outside [16K, 4M] bytes", (long long)chunk);
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
    z->p2p_chunk = maco__align_up((size_t)chunk, 16);
    return MACO_OK;
}

static void maco__coll_destroy(maco_comm_t comm)
{
    maco__coll_t *c = maco__coll_of(comm);
    if (c == NULL)
        return;
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
    if (c->buf)
        cudaFree(c->buf);
    cudaGetLastError();
    free(c->peer_buf);
    free(c->peer_buf_mem);
    free(c);
    comm->coll = NULL;
}

static maco_status_t maco__coll_setup(maco_comm_t comm)
{
    const int n = comm->nranks;
    /* Every rank decides alike from what all of them know (the topology). */
    if (comm->nnodes > 1 || n > MACO__MAX_LOCAL_RANKS) {
        if (comm->nnodes > 1)
            snprintf(comm->ext_unavailable, sizeof(comm->ext_unavailable),
                     "the ranks span %d nodes; collectives, all-to-all and send/recv across "
                     "nodes are not implemented yet (port channels over IB or TCP reach other "
                     "nodes)",
                     comm->nnodes);
        else
            snprintf(comm->ext_unavailable, sizeof(comm->ext_unavailable),
                     "%d ranks on one node; collectives support at most %d", n,
                     MACO__MAX_LOCAL_RANKS);
        MACO_INFO(MACO_SUBSYS_INIT, "rank %d: collectives unavailable: %s", comm->rank,
                  comm->ext_unavailable);
        return MACO_OK;
    }
    maco__coll_sizes_t mine;
    maco_status_t st = maco__coll_read_sizes(&mine);
    if (st != MACO_OK)
        return st;
    maco__coll_sizes_t *all = (maco__coll_sizes_t *)calloc((size_t)n, sizeof(*all));
    if (all == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "collectives setup: no memory");
    all[comm->rank] = mine;
    st = maco_bootstrap_allgather(comm->bs, all, sizeof(*all));
    for (int r = 0; st == MACO_OK && r < n; r++) {
        if (all[r].oneshot_max == all[0].oneshot_max &&
            all[r].scratch_bytes == all[0].scratch_bytes && all[r].rsag_ctas == all[0].rsag_ctas &&
            all[r].p2p_lanes == all[0].p2p_lanes && all[r].p2p_chunk == all[0].p2p_chunk)
            continue;
        char why[500];
        snprintf(why, sizeof(why),
                 "MACO_ALLREDUCE_ONESHOT_MAX, MACO_SCRATCH_SIZE, MACO_ALLREDUCE_RSAG_CTAS, "
                 "MACO_P2P_LANES or MACO_P2P_CHUNK_SIZE differs between rank 0 (%llu, %llu, %d, "
                 "%d, %llu) and rank %d (%llu, %llu, %d, %d, %llu); set them alike on all ranks",
                 (unsigned long long)all[0].oneshot_max, (unsigned long long)all[0].scratch_bytes,
                 (int)all[0].rsag_ctas, (int)all[0].p2p_lanes, (unsigned long long)all[0].p2p_chunk,
                 r, (unsigned long long)all[r].oneshot_max,
                 (unsigned long long)all[r].scratch_bytes, (int)all[r].rsag_ctas,
                 (int)all[r].p2p_lanes, (unsigned long long)all[r].p2p_chunk);
        maco__comm_set_unavailable(comm, why);
        MACO_INFO(MACO_SUBSYS_INIT, "rank %d: GPU operations unavailable: %s", comm->rank, why);
        free(all);
        return MACO_OK; /* every rank saw the same sizes and decided alike */
    }
    free(all);
    if (st != MACO_OK)
        return st;

    maco__coll_t *c = (maco__coll_t *)calloc(1, sizeof(*c));
    if (c == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "collectives setup: no memory");
    comm->coll = c; /* from here on, maco__coll_destroy frees what exists */
    st = maco__coll_read_settings(c);
    if (st != MACO_OK)
        return st;
    maco__coll_layout(&c->layout, n, &mine);
    const maco__coll_layout_t *l = &c->layout;
    const int slots = l->rsag_slots;
    const int lanes = l->p2p_lanes;
    MACO_CUDA_RETURN(cudaMalloc((void **)&c->buf, l->total_bytes));
    MACO_CUDA_RETURN(cudaMemset(c->buf, 0, l->total_bytes));
    uint32_t one = 1;
    MACO_CUDA_RETURN(
        cudaMemcpy(c->buf + MACO__CTR_LL_FLAG, &one, sizeof(one), cudaMemcpyHostToDevice));
    st = maco_mem_register(comm, c->buf, l->total_bytes, &c->buf_mem);
    if (st != MACO_OK)
        return st;
    c->peer_buf = (char **)calloc((size_t)n, sizeof(char *));
    c->peer_buf_mem = (maco_mem_t *)calloc((size_t)n, sizeof(maco_mem_t));
    maco_memory_channel_device_t *chans = (maco_memory_channel_device_t *)calloc(
        (size_t)slots * (size_t)n, sizeof(maco_memory_channel_device_t));
    /* Room for either a peer's rsag channels or its p2p lanes. */
    maco_memory_channel_device_t *peer_chans = (maco_memory_channel_device_t *)calloc(
        (size_t)(slots > lanes ? slots : lanes), sizeof(maco_memory_channel_device_t));
    maco_memory_channel_device_t *p2p_chans = (maco_memory_channel_device_t *)calloc(
        (size_t)n * (size_t)lanes, sizeof(maco_memory_channel_device_t));
    if (c->peer_buf == NULL || c->peer_buf_mem == NULL || chans == NULL || peer_chans == NULL ||
        p2p_chans == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "collectives setup: no memory");
        goto out;
    }
    st = maco__mem_exchange(comm, c->buf_mem, c->peer_buf, c->peer_buf_mem);
    if (st != MACO_OK)
        goto out;
    /* rsag channels: for every peer in rank order, one channel per slot; then its p2p
     * credit channels, one per lane. The pairwise exchanges happen in the same global order
     * on all ranks, so none waits in a cycle. */
    for (int p = 0; p < n; p++) {
        if (p == comm->rank)
            continue;
        st =
            maco__memory_channels_setup(comm, p, c->buf_mem, c->peer_buf_mem[p], slots, peer_chans);
        if (st != MACO_OK)
            goto out;
        for (int b = 0; b < slots; b++)
            chans[(size_t)b * (size_t)n + (size_t)p] = peer_chans[b];
        st =
            maco__memory_channels_setup(comm, p, c->buf_mem, c->peer_buf_mem[p], lanes, peer_chans);
        if (st != MACO_OK)
            goto out;
        for (int b = 0; b < lanes; b++)
            p2p_chans[(size_t)p * (size_t)lanes + (size_t)b] = peer_chans[b];
    }
    MACO_CUDA_GOTO(
        cudaMalloc((void **)&c->rsag_channels, (size_t)slots * (size_t)n * sizeof(*chans)), st,
        out);
    MACO_CUDA_GOTO(cudaMemcpy(c->rsag_channels, chans, (size_t)slots * (size_t)n * sizeof(*chans),
                              cudaMemcpyHostToDevice),
                   st, out);
    MACO_CUDA_GOTO(
        cudaMalloc((void **)&c->p2p_channels, (size_t)n * (size_t)lanes * sizeof(*p2p_chans)), st,
        out);
    MACO_CUDA_GOTO(cudaMemcpy(c->p2p_channels, p2p_chans,
                              (size_t)n * (size_t)lanes * sizeof(*p2p_chans),
                              cudaMemcpyHostToDevice),
                   st, out);
    st = maco__registry_setup(comm);
    if (st == MACO_OK)
        st = maco__plan_load_forced(comm, c);
out:
    free(chans);
    free(peer_chans);
    free(p2p_chans);
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

/* Installed when the library (or, from libmaco.a, this object) is loaded. */
__attribute__((constructor)) static void maco__coll_install(void)
{
    maco__comm_set_extension(&maco__coll_ext);
}
