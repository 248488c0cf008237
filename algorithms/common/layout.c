/*
 * layout.c - the collectives' buffer layout (state.h) from the sizes that shape it: pure
 * arithmetic, no CUDA, so the CPU tests check it (test_unit: CollLayout).
 */
#include <string.h>

#include "algorithms/common/state.h"
#include "algorithms/p2p/p2p_plan.h"
#include "algorithms/tuning.h"
#include "src/host/base/align.h"

size_t maco__p2p_auto_chunk(size_t srcs, size_t lanes)
{
    size_t chunk = MACO__TUNING_P2P_AUTO_CHUNK_MAX;
    while (chunk > (size_t)MACO__TUNING_P2P_AUTO_CHUNK_MIN &&
           srcs * lanes * MACO__P2P_SLOTS * chunk > (size_t)MACO__TUNING_P2P_AUTO_SLOT_BYTES)
        chunk /= 2;
    return chunk;
}

void maco__coll_layout(maco__coll_layout_t *l, int nranks, int nnodes, const maco__coll_sizes_t *z)
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
    /* rsag: per slot, two halves (double buffering; mesh.cuh takes half the slot) of n IN
     * and n OUT pieces. */
    size_t piece = scratch_bytes / ((size_t)rsag_slots * 4 * (size_t)nranks);
    piece = piece / 256 * 256;
    if (piece < 256)
        piece = 256;
    l->rsag_piece_max = piece;
    l->rsag_slot_bytes = 4 * (size_t)nranks * piece;
    /* send/recv and all-to-all (p2p_kernels.cu): per source rank (the n - 1 peers), lane and
     * slot. */
    size_t n = (size_t)nranks, lanes = (size_t)z->p2p_lanes, slots = MACO__P2P_SLOTS;
    size_t srcs = n > 1 ? n - 1 : 0;
    l->p2p_lanes = z->p2p_lanes;
    l->p2p_chunk = z->p2p_chunk != 0 ? z->p2p_chunk : maco__p2p_auto_chunk(srcs, lanes);
    l->p2p_cp_slot_bytes = maco__align_up(l->p2p_chunk + 16, 256);
    l->p2p_ctr_offset =
        maco__align_up(l->rsag_offset + (size_t)rsag_slots * l->rsag_slot_bytes, 256);
    l->p2p_hdr_offset = maco__align_up(l->p2p_ctr_offset + 2 * n * lanes * sizeof(uint64_t), 256);
    l->p2p_ll_offset = maco__align_up(l->p2p_hdr_offset + srcs * lanes * slots * 16, 256);
    l->p2p_cp_offset =
        maco__align_up(l->p2p_ll_offset + srcs * lanes * slots * MACO__P2P_LL_SLOT, 256);
    size_t end = l->p2p_cp_offset + srcs * lanes * slots * l->p2p_cp_slot_bytes;
    /* Across nodes (hier.cuh): per slot IN [nodes][local_nranks] and OUT [local_nranks][nodes],
     * from a scratch of its own size; CARRY, FINAL and ACC [nodes] each in the rail buffer (host
     * memory: 1.5 * MACO_SCRATCH_SIZE / local_nranks bytes). */
    l->hier_slots = z->hier_ctas;
    if (nnodes > 1) {
        size_t nn = (size_t)nnodes;
        l->hier_regions = (int)(2 * n * nn);
        l->hier_offset = maco__align_up(end, 256);
        l->hier_piece_max = scratch_bytes / ((size_t)z->hier_ctas * (size_t)l->hier_regions);
        l->hier_piece_max = l->hier_piece_max / 256 * 256;
        l->hier_slot_bytes = (size_t)l->hier_regions * l->hier_piece_max;
        l->rail_slot_bytes = 3 * nn * l->hier_piece_max;
        end = l->hier_offset + (size_t)z->hier_ctas * l->hier_slot_bytes;
    }
    l->total_bytes = end;
}
