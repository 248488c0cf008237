/*
 * launch.c - launching a collective across nodes: the hier kernel's arguments (hier.h) from the
 * single-node ones the collectives' launch filled (collectives/launch.c), its pieces, segments
 * and CTAs, and the hierarchical all-to-all's shape (alltoall_shape.c).
 */
#include <stdint.h>
#include <string.h>

#include "algorithms/common/select.h"
#include "algorithms/hier/hier.h"
#include "algorithms/tuning.h"
#include "src/host/base/log.h"

static const maco__hier_launcher_t maco__hier_launchers[MACO_DATATYPE_COUNT] = {
    maco__launch_hier_int8,    maco__launch_hier_uint8,    maco__launch_hier_int32,
    maco__launch_hier_uint32,  maco__launch_hier_int64,    maco__launch_hier_uint64,
    maco__launch_hier_float16, maco__launch_hier_bfloat16, maco__launch_hier_float32,
    maco__launch_hier_float64, maco__launch_hier_fp8_e4m3, maco__launch_hier_fp8_e5m2,
};

/* Bytes of each type's accumulator (reduce.cuh: the 16- and 8-bit floats add in float). */
static const uint8_t maco__acc_bytes[MACO_DATATYPE_COUNT] = { 1, 1, 4, 4, 8, 8, 4, 4, 4, 8, 4, 4 };

/*
 * Across nodes (hier.cuh): pieces of a whole number of 16-byte words that hold the type's
 * accumulator in a slot's region, enough segments for every CTA, at least
 * MACO__TUNING_HIER_PIECE_MIN bytes where the data allows; one CTA per slot up to MACO_HIER_CTAS
 * (and the co-resident bound). Every rank computes the same numbers from the same inputs.
 */
maco_status_t maco__hier_launch(const maco__coll_call_t *c, maco_comm_t comm, maco__coll_t *coll,
                                maco__coll_args_t *a, cudaStream_t s)
{
    const maco__coll_layout_t *l = &coll->layout;
    size_t esz = maco_datatype_size(c->datatype);
    int reducing = c->coll == MACO_COLL_ALLREDUCE || c->coll == MACO_COLL_REDUCE_SCATTER ||
                   c->coll == MACO_COLL_REDUCE;
    size_t accsz = reducing ? maco__acc_bytes[c->datatype] : esz;
    size_t wide = accsz > esz ? accsz : esz;
    size_t slots = (size_t)l->hier_slots;
    if (slots > (size_t)l->rsag_slots) /* the barrier's semaphores are the rsag slots' */
        slots = (size_t)l->rsag_slots;
    if (slots > (size_t)maco__coll_ctas(comm, coll))
        slots = (size_t)maco__coll_ctas(comm, coll);
    size_t p, blocks;
    if (c->coll == MACO_COLL_ALLTOALL) {
        /* maco__coll_select took hier only where this shape exists. */
        maco__hier_a2a_shape_t shape;
        if (!maco__hier_a2a_shape(c->count, esz, coll->local_nranks, l->hier_piece_max, (int)slots,
                                  &shape))
            return maco__comm_record(comm, maco__error(MACO_ERR_INTERNAL, MACO_SUBSYS_COLL,
                                                       "%s: no hier all-to-all shape for %zu "
                                                       "elements of %zu bytes",
                                                       c->fn, c->count, esz));
        p = shape.piece;
        blocks = (size_t)shape.blocks;
    } else {
        int split = c->coll == MACO_COLL_ALLREDUCE || c->coll == MACO_COLL_REDUCE ||
                    c->coll == MACO_COLL_BROADCAST;
        size_t per_seg = split ? (size_t)coll->local_nranks : 1;
        size_t word = 16 / esz; /* elements per 16-byte word */
        size_t pmax = l->hier_piece_max / wide / word * word;
        p = (c->count + per_seg * slots - 1) / (per_seg * slots);
        if (p < MACO__TUNING_HIER_PIECE_MIN / esz)
            p = MACO__TUNING_HIER_PIECE_MIN / esz;
        p = (p + word - 1) / word * word;
        if (p > pmax)
            p = pmax;
        size_t seg = p * per_seg;
        size_t nseg = (c->count + seg - 1) / seg;
        blocks = nseg < slots ? nseg : slots;
    }
    a->piece_elems = p;
    maco__hier_args_t h;
    memset(&h, 0, sizeof(h));
    h.c = *a;
    h.rail = coll->rail_dev;
    h.rank_at = coll->rank_at_dev;
    h.hier_offset = l->hier_offset;
    h.hier_slot_bytes = l->hier_slot_bytes;
    h.rail_buf = coll->rail_buf_dev;
    h.rail_slot_bytes = l->rail_slot_bytes;
    h.region_bytes = l->hier_piece_max;
    h.node = coll->node;
    h.nnodes = coll->nnodes;
    h.nranks = comm->nranks;
    for (int k = 0; k < coll->nnodes; k++)
        for (int i = 0; i < coll->local_nranks; i++)
            if (coll->rank_at[k * coll->local_nranks + i] == c->root) {
                h.root_node = k;
                h.root_local = i;
            }
    h.accsz = (uint32_t)accsz;
    maco_datatype_t kt = reducing ? c->datatype : MACO_UINT8;
    cudaError_t cerr = c->coll == MACO_COLL_ALLTOALL
                           ? maco__launch_hier_a2a(&h, (int)blocks, MACO__COLL_THREADS, s)
                           : maco__hier_launchers[kt](&h, reducing ? (int)c->op : (int)MACO_SUM,
                                                      (int)blocks, MACO__COLL_THREADS, s);
    if (cerr != cudaSuccess)
        return maco__comm_record(comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                                   "%s: launching hier for %zu bytes failed: %s "
                                                   "(%s)",
                                                   c->fn, c->count * esz, cudaGetErrorName(cerr),
                                                   cudaGetErrorString(cerr)));
    coll->last_ctas = (int)blocks;
    MACO_TRACE(MACO_SUBSYS_COLL, "%s %zu bytes %s %s: hier, %zu CTAs, pieces of %zu elements",
               maco__coll_name(c->coll), c->count * esz, maco_datatype_name(c->datatype),
               maco_redop_name(c->op), blocks, p);
    return MACO_OK;
}
