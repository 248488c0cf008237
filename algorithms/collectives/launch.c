/*
 * launch.c - launching a checked collective call: what the communicator must offer
 * (maco__coll_prepare), the kernel's arguments, its grid and the in-place descriptor
 * (maco__coll_launch); across nodes the hier kernel's own launch (hier/launch.c) takes over.
 * collectives.c checks the arguments and common/group.c queues calls; both come here to issue
 * them.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "algorithms/collectives/collectives.h"
#include "algorithms/common/registry.h"
#include "algorithms/common/select.h"
#include "algorithms/hier/hier.h"
#include "algorithms/tuning.h"
#include "maco/plan.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"

/* The kernels' op codes (reduce.cuh: SUM 0, PROD 1, MIN 2, MAX 3) are these public values. */
_Static_assert(MACO_SUM == 0 && MACO_PROD == 1 && MACO_MIN == 2 && MACO_MAX == 3,
               "maco_redop_t matches the kernels' op codes");

static const maco__coll_launcher_t maco__launchers[MACO_DATATYPE_COUNT] = {
    maco__launch_coll_int8,    maco__launch_coll_uint8,    maco__launch_coll_int32,
    maco__launch_coll_uint32,  maco__launch_coll_int64,    maco__launch_coll_uint64,
    maco__launch_coll_float16, maco__launch_coll_bfloat16, maco__launch_coll_float32,
    maco__launch_coll_float64, maco__launch_coll_fp8_e4m3, maco__launch_coll_fp8_e5m2,
};

/* A single rank: the result is the input (every op of one value is the value). */
static maco_status_t maco__single_rank(const maco__coll_call_t *c, maco_comm_t comm, cudaStream_t s)
{
    size_t bytes = c->count * maco_datatype_size(c->datatype);
    if (c->send == c->recv)
        return MACO_OK;
    cudaError_t cerr = cudaMemcpyAsync(c->recv, c->send, bytes, cudaMemcpyDeviceToDevice, s);
    if (cerr != cudaSuccess)
        return maco__comm_record(comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                                   "%s: cudaMemcpyAsync of %zu bytes failed: %s",
                                                   c->fn, bytes, cudaGetErrorString(cerr)));
    return MACO_OK;
}

/* A buffer's descriptor id (common/registry.h): `used` by the call on this rank, touched by
 * peers (`remote`) in place. */
static uint32_t maco__desc_id(maco_comm_t comm, const void *ptr, size_t bytes, int used, int remote,
                              uint64_t *offset_p)
{
    *offset_p = 0;
    if (!used)
        return MACO__DESC_LOCAL;
    if ((uintptr_t)ptr % 16 != 0)
        return MACO__DESC_NONE;
    if (!remote)
        return MACO__DESC_LOCAL;
    uint64_t off = 0;
    uint32_t id = maco__registry_find(comm, ptr, bytes, &off);
    if (id == 0)
        return MACO__DESC_NONE;
    *offset_p = off;
    return id;
}

/*
 * Fills the mesh kernel's descriptor: which of this rank's buffers peers may use in place
 * (mesh.cuh, maco__direct_body: allreduce reads every send and writes every receive
 * buffer remotely; reduce-scatter reads send buffers; allgather writes receive buffers;
 * broadcast reads the root's send buffer and writes the others' receive buffers; reduce
 * reads send buffers and writes the root's receive buffer), with the peer registrations
 * mapped so far (maco_collective_map_registrations maps new ones; a launch does no I/O).
 */
static void maco__describe(const maco__coll_call_t *c, maco_comm_t comm, const maco__coll_t *coll,
                           maco__coll_args_t *a)
{
    maco__coll_desc_t d;
    memset(&d, 0, sizeof(d));
    int me = coll->local_index, n = coll->local_nranks; /* one node: the rank and the rank count */
    int root = me == c->root;
    size_t unit = c->count * maco_datatype_size(c->datatype);
    size_t send_bytes = c->coll == MACO_COLL_REDUCE_SCATTER ? unit * (size_t)n : unit;
    size_t recv_bytes = c->coll == MACO_COLL_ALLGATHER ? unit * (size_t)n : unit;
    int send_used = c->coll != MACO_COLL_BROADCAST || root;
    int recv_used = c->coll != MACO_COLL_REDUCE || root;
    int send_remote = c->coll != MACO_COLL_ALLGATHER;
    int recv_remote =
        c->coll != MACO_COLL_REDUCE_SCATTER && !(c->coll == MACO_COLL_BROADCAST && root);
    maco__registry_seen(comm, d.seen);
    d.send_id = maco__desc_id(comm, c->send, send_bytes, send_used, send_remote, &d.send_off);
    d.recv_id = maco__desc_id(comm, c->recv, recv_bytes, recv_used, recv_remote, &d.recv_off);
    /* Large allreduces are faster through scratch (MACO_ALLREDUCE_INPLACE_MAX's doc). */
    if (c->coll == MACO_COLL_ALLREDUCE && unit > (size_t)coll->inplace_max)
        d.send_id = MACO__DESC_NONE;
    memcpy(a->desc, &d, sizeof(d));
    a->desc_offset = coll->layout.desc_offset;
    a->reg_table = maco__registry_table(comm);
    a->reg_cache = maco__registry_cache(comm);
}

maco_status_t maco__coll_prepare(const maco__coll_call_t *c, maco_comm_t comm,
                                 maco__coll_t **coll_p, int *kernel_p)
{
    maco__coll_t *coll_state = NULL;
    maco_status_t st = maco__coll_require(comm, c->fn, &coll_state);
    if (st != MACO_OK)
        return st;
    maco_status_t async_st = maco__comm_async_status(comm); /* no context query: hot path */
    if (async_st != MACO_OK)
        return maco__comm_refuse(comm, c->fn, async_st, MACO_SUBSYS_COLL);
    int kernel = -1;
    if (c->count > 0 && comm->nranks > 1) {
        st = maco__coll_select(comm, coll_state, c->coll, c->count, maco_datatype_size(c->datatype),
                               &kernel);
        if (st != MACO_OK)
            return maco__comm_record(comm, st);
    }
    *coll_p = coll_state;
    *kernel_p = kernel;
    return MACO_OK;
}

/* maco__coll_launch's work, with the communicator's device current. */
static maco_status_t maco__coll_launch_on_its_device(const maco__coll_call_t *c, maco_comm_t comm,
                                                     maco__coll_t *coll_state, int kernel,
                                                     maco_stream_t stream);

maco_status_t maco__coll_launch(const maco__coll_call_t *c, maco_comm_t comm,
                                maco__coll_t *coll_state, int kernel, maco_stream_t stream)
{
    if (c->count == 0)
        return MACO_OK;
    /* The kernel goes to the communicator's device whichever device the calling thread has
     * current: stream 0 is then that device's legacy stream (one thread may drive several
     * communicators, as CuPy's and nccl-tests' one-process runs do). */
    int saved = -1;
    maco_status_t st = maco__device_enter_status(comm->cuda_device, &saved, c->fn);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    st = maco__coll_launch_on_its_device(c, comm, coll_state, kernel, stream);
    maco__device_leave(saved);
    return st;
}

static maco_status_t maco__coll_launch_on_its_device(const maco__coll_call_t *c, maco_comm_t comm,
                                                     maco__coll_t *coll_state, int kernel,
                                                     maco_stream_t stream)
{
    if (coll_state->plans[c->coll] != NULL) /* MACO_ALGO_<COLLECTIVE>=plan:FILE */
        return maco_plan_execute(coll_state->plans[c->coll], c->send, c->recv, c->count,
                                 c->datatype, c->op, comm, stream);
    cudaStream_t s = (cudaStream_t)stream;
    if (comm->nranks == 1)
        return maco__single_rank(c, comm, s);
    size_t esz = maco_datatype_size(c->datatype);
    size_t unit = c->count * esz;
    int reducing = c->coll == MACO_COLL_ALLREDUCE || c->coll == MACO_COLL_REDUCE_SCATTER ||
                   c->coll == MACO_COLL_REDUCE;
    maco__coll_args_t a;
    memset(&a, 0, sizeof(a));
    a.input = c->send;
    a.output = c->recv;
    a.count = c->count;
    a.esz = (uint32_t)esz;
    a.coll = (int32_t)c->coll;
    a.avg = reducing && c->op == MACO_AVG;
    /* maco_redop_t's sum, prod, min and max are reduce.cuh's MACO__OP_* values. */
    a.op = reducing && c->op != MACO_AVG ? (int32_t)c->op : 0;
    a.root = c->root;
    a.rank = coll_state->local_index; /* the node's view (common/state.h, maco__coll_t) */
    a.nranks = coll_state->local_nranks;
    a.buf = coll_state->buf;
    for (int r = 0; r < coll_state->local_nranks; r++)
        a.peer_buf[r] = coll_state->peer_buf[r];
    const maco__coll_layout_t *l = &coll_state->layout;
    a.ll_offset = l->ll_offset;
    a.ll_slot_bytes = l->ll_slot_bytes;
    a.rsag_offset = l->rsag_offset;
    a.rsag_slot_bytes = l->rsag_slot_bytes;
    a.rsag_piece_max = l->rsag_piece_max;
    a.ll_flag = (uint32_t *)(coll_state->buf + MACO__CTR_LL_FLAG);
    a.ll_done = (uint32_t *)(coll_state->buf + MACO__CTR_LL_DONE);
    a.paths = (unsigned long long *)(coll_state->buf + MACO__CTR_INPLACE);
    a.channels = coll_state->rsag_channels;
    a.bound = comm->bound;

    if (kernel == MACO__KERNEL_HIER)
        return maco__hier_launch(c, comm, coll_state, &a, s);
    size_t n = (size_t)coll_state->local_nranks;
    size_t threads = MACO__COLL_THREADS;
    /* Every kernel here waits on peers: its CTAs must be co-resident with theirs, also
     * when ranks share a GPU (comm_internal.h, coresident_ctas), and at most what
     * maco_collective_set_max_ctas allows. */
    size_t max_blocks = (size_t)maco__coll_ctas(comm, coll_state);
    size_t blocks;
    if (kernel == MACO__KERNEL_MESH) {
        maco__describe(c, comm, coll_state, &a);
        /* MACO_MESH_GATE_MIN: wait for every rank on one CTA first (mesh.cuh, the gate). */
        a.gated = coll_state->mesh_gate_min > 0 && unit >= (size_t)coll_state->mesh_gate_min;
    }
    if (kernel == MACO__KERNEL_LL2) {
        /* About one packet per thread, as LL. */
        a.piece_elems = maco__coll_twoshot_block(c->count, esz, n, l->oneshot_max);
        blocks = ((unit + 7) / 8 + threads - 1) / threads;
        if (blocks > MACO__TUNING_LL_MAX_CTAS)
            blocks = MACO__TUNING_LL_MAX_CTAS;
    } else if (kernel == MACO__KERNEL_LL) {
        /* About one packet per thread (allgather reads n messages); CTAs stay co-resident
         * (<= SMs) and at most MACO__TUNING_LL_MAX_CTAS. */
        size_t npkt = (unit + 7) / 8 * (c->coll == MACO_COLL_ALLGATHER ? n : 1);
        blocks = (npkt + threads - 1) / threads;
        if (blocks > MACO__TUNING_LL_MAX_CTAS)
            blocks = MACO__TUNING_LL_MAX_CTAS;
    } else {
        /* Pieces: enough segments for every slot, a multiple of 16 bytes, within the slot's
         * piece. All ranks compute the same numbers from the same inputs. */
        size_t slots = (size_t)l->rsag_slots;
        if (slots > max_blocks)
            slots = max_blocks;
        /* Pieces per segment, as the mesh kernel splits them (mesh.cuh). */
        size_t per_seg = c->coll == MACO_COLL_ALLREDUCE                                    ? n
                         : (c->coll == MACO_COLL_BROADCAST || c->coll == MACO_COLL_REDUCE) ? n - 1
                                                                                           : 1;
        size_t piece = (unit + per_seg * slots - 1) / (per_seg * slots);
        piece = (piece + 15) / 16 * 16;
        if (piece < MACO__TUNING_MESH_PIECE_MIN)
            piece = MACO__TUNING_MESH_PIECE_MIN;
        if (piece > l->rsag_piece_max)
            piece = l->rsag_piece_max;
        a.piece_elems = piece / esz;
        size_t seg_elems = a.piece_elems * per_seg;
        size_t nseg = (c->count + seg_elems - 1) / seg_elems;
        blocks = nseg < slots ? nseg : slots;
    }
    if (blocks > max_blocks)
        blocks = max_blocks;
    /* Collectives that only move bytes run the uint8 kernels. */
    maco_datatype_t kt = reducing ? c->datatype : MACO_UINT8;
    cudaError_t cerr = maco__launchers[kt](&a, kernel, reducing ? (int)c->op : (int)MACO_SUM,
                                           (int)blocks, (int)threads, s);
    if (cerr != cudaSuccess)
        return maco__comm_record(comm,
                                 maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                             "%s: launching %s for %zu bytes failed: %s (%s)",
                                             c->fn, maco__coll_algorithm(c->coll, kernel), unit,
                                             cudaGetErrorName(cerr), cudaGetErrorString(cerr)));
    coll_state->last_ctas = (int)blocks;
    MACO_TRACE(MACO_SUBSYS_COLL, "%s %zu bytes %s %s: %s on %zu CTAs", maco__coll_name(c->coll),
               unit, maco_datatype_name(c->datatype), maco_redop_name(c->op),
               maco__coll_algorithm(c->coll, kernel), blocks);
    return MACO_OK;
}
