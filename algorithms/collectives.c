/* collectives.c - argument checks, algorithm selection and launch of the collectives. */
#include "maco/collectives.h"

#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "algorithms.h"
#include "config.h"
#include "cuda_util.h"
#include "log.h"

/* Threads per CTA of both allreduce kernels (their __launch_bounds__). */
enum { MACO__ALLREDUCE_THREADS = 512 };

typedef enum maco__allreduce_algo {
    MACO__AR_ONESHOT_LL = 0,
    MACO__AR_RSAG = 1,
} maco__allreduce_algo_t;

static const char *maco__allreduce_algo_names[] = { "oneshot_ll", "rsag" };

size_t maco_datatype_size(maco_datatype_t datatype)
{
    static const size_t sizes[MACO_DATATYPE_COUNT] = { 1, 1, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1 };
    return (unsigned)datatype < MACO_DATATYPE_COUNT ? sizes[datatype] : 0;
}

const char *maco_datatype_name(maco_datatype_t datatype)
{
    static const char *names[MACO_DATATYPE_COUNT] = {
        "int8",    "uint8",    "int32",   "uint32",  "int64",    "uint64",
        "float16", "bfloat16", "float32", "float64", "fp8_e4m3", "fp8_e5m2"
    };
    return (unsigned)datatype < MACO_DATATYPE_COUNT ? names[datatype] : "unknown";
}

const char *maco_redop_name(maco_redop_t op)
{
    static const char *names[MACO_REDOP_COUNT] = { "sum", "prod", "min", "max", "avg" };
    return (unsigned)op < MACO_REDOP_COUNT ? names[op] : "unknown";
}

/* Picks the algorithm: MACO_ALGO_ALLREDUCE if set, else by size. */
static maco_status_t maco__allreduce_select(maco_comm_t comm, size_t bytes,
                                            maco__allreduce_algo_t *algo_p)
{
    const char *forced = maco__config_string(MACO_CFG_ALGO_ALLREDUCE);
    if (forced[0] != '\0') {
        for (int i = 0; i < 2; i++) {
            if (strcasecmp(forced, maco__allreduce_algo_names[i]) == 0) {
                if (i == MACO__AR_ONESHOT_LL && bytes > comm->layout.oneshot_max)
                    return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                       "MACO_ALGO_ALLREDUCE=oneshot_ll cannot take %zu bytes: "
                                       "its scratch holds MACO_ALLREDUCE_ONESHOT_MAX=%zu",
                                       bytes, comm->layout.oneshot_max);
                *algo_p = (maco__allreduce_algo_t)i;
                return MACO_OK;
            }
        }
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                           "MACO_ALGO_ALLREDUCE='%s' is not an allreduce algorithm: use "
                           "oneshot_ll or rsag",
                           forced);
    }
    *algo_p = bytes <= comm->layout.oneshot_max ? MACO__AR_ONESHOT_LL : MACO__AR_RSAG;
    return MACO_OK;
}

static maco_status_t maco__allreduce_check(const void *sendbuf, void *recvbuf, size_t count,
                                           maco_datatype_t datatype, maco_redop_t op,
                                           maco_comm_t comm)
{
    if (comm == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_allreduce: comm is NULL");
    if ((unsigned)datatype >= MACO_DATATYPE_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_allreduce: datatype %d is outside [0, %d)", (int)datatype,
                           MACO_DATATYPE_COUNT);
    if ((unsigned)op >= MACO_REDOP_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_allreduce: op %d is outside [0, %d)", (int)op, MACO_REDOP_COUNT);
    if (datatype != MACO_FLOAT32 && datatype != MACO_BFLOAT16)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                           "maco_allreduce: datatype %s is not implemented yet (float32 and "
                           "bfloat16 are)",
                           maco_datatype_name(datatype));
    if (op != MACO_SUM)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                           "maco_allreduce: op %s is not implemented yet (sum is)",
                           maco_redop_name(op));
    size_t esz = maco_datatype_size(datatype);
    if (count > SIZE_MAX / esz)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_allreduce: count %zu of %s overflows a byte size", count,
                           maco_datatype_name(datatype));
    if (count > 0 && (sendbuf == NULL || recvbuf == NULL))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_allreduce: sendbuf and recvbuf must not be NULL (count %zu)",
                           count);
    if (((uintptr_t)sendbuf % esz) != 0 || ((uintptr_t)recvbuf % esz) != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_allreduce: sendbuf %p and recvbuf %p must be aligned to the "
                           "%zu-byte %s element",
                           sendbuf, recvbuf, esz, maco_datatype_name(datatype));
    return MACO_OK;
}

maco_status_t maco_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                             maco_datatype_t datatype, maco_redop_t op, maco_comm_t comm,
                             maco_stream_t stream)
{
    maco_status_t st = maco__allreduce_check(sendbuf, recvbuf, count, datatype, op, comm);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    st = maco__comm_require_gpu(comm, "maco_allreduce");
    if (st != MACO_OK)
        return st;
    maco_status_t async_st;
    maco_comm_get_async_error(comm, &async_st);
    if (async_st != MACO_OK)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_COLL,
                                                   "maco_allreduce: the communicator has failed "
                                                   "(%s): %s; destroy it",
                                                   maco_status_string(async_st),
                                                   maco_comm_get_last_error(comm)));
    if (count == 0)
        return MACO_OK;
    size_t bytes = count * maco_datatype_size(datatype);
    cudaStream_t s = (cudaStream_t)stream;
    if (comm->nranks == 1) {
        if (sendbuf != recvbuf) {
            cudaError_t cerr =
                cudaMemcpyAsync(recvbuf, sendbuf, bytes, cudaMemcpyDeviceToDevice, s);
            if (cerr != cudaSuccess)
                return maco__comm_record(comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                                           "maco_allreduce: cudaMemcpyAsync of "
                                                           "%zu bytes failed: %s",
                                                           bytes, cudaGetErrorString(cerr)));
        }
        return MACO_OK;
    }
    maco__allreduce_algo_t algo;
    st = maco__allreduce_select(comm, bytes, &algo);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);

    maco__allreduce_args_t a;
    memset(&a, 0, sizeof(a));
    a.input = sendbuf;
    a.output = recvbuf;
    a.count = count;
    a.datatype = (int32_t)datatype;
    a.rank = comm->rank;
    a.nranks = comm->nranks;
    a.buf = comm->buf;
    for (int r = 0; r < comm->nranks; r++)
        a.peer_buf[r] = comm->peer_buf[r];
    const maco__comm_layout_t *l = &comm->layout;
    a.ll_offset = l->ll_offset;
    a.ll_slot_bytes = l->ll_slot_bytes;
    a.rsag_offset = l->rsag_offset;
    a.rsag_slot_bytes = l->rsag_slot_bytes;
    a.rsag_piece_max = l->rsag_piece_max;
    a.ll_flag = (uint32_t *)(comm->buf + l->counters_offset + MACO__CTR_LL_FLAG);
    a.ll_done = (uint32_t *)(comm->buf + l->counters_offset + MACO__CTR_LL_DONE);
    a.channels = comm->rsag_channels;
    a.bound = comm->bound;

    int threads = MACO__ALLREDUCE_THREADS;
    int max_blocks = comm->sm_count;
    cudaError_t cerr;
    if (algo == MACO__AR_ONESHOT_LL) {
        size_t npkt = (bytes + 7) / 8;
        /* One packet per thread where the grid allows; CTAs stay co-resident (<= SMs). */
        size_t blocks = (npkt + (size_t)threads - 1) / (size_t)threads;
        if (blocks > (size_t)max_blocks)
            blocks = (size_t)max_blocks;
        if (blocks > 64)
            blocks = 64;
        cerr = maco__launch_allreduce_oneshot_ll(&a, (int)blocks, threads, s);
    } else {
        /* Pieces: enough segments for every slot, each piece 16-byte multiple, within the
         * scratch slot. All ranks compute the same numbers from the same inputs. */
        size_t esz = maco_datatype_size(datatype);
        size_t slots = (size_t)l->rsag_slots;
        if (slots > (size_t)max_blocks)
            slots = (size_t)max_blocks;
        size_t n = (size_t)comm->nranks;
        size_t piece = (bytes + n * slots - 1) / (n * slots);
        piece = (piece + 15) / 16 * 16;
        if (piece < 4096)
            piece = 4096;
        if (piece > l->rsag_piece_max)
            piece = l->rsag_piece_max;
        a.piece_elems = piece / esz;
        size_t seg_elems = a.piece_elems * n;
        size_t nseg = (count + seg_elems - 1) / seg_elems;
        size_t blocks = nseg < slots ? nseg : slots;
        cerr = maco__launch_allreduce_rsag(&a, (int)blocks, threads, s);
    }
    if (cerr != cudaSuccess)
        return maco__comm_record(comm,
                                 maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                             "maco_allreduce: launching %s for %zu bytes "
                                             "failed: %s (%s)",
                                             maco__allreduce_algo_names[algo], bytes,
                                             cudaGetErrorName(cerr), cudaGetErrorString(cerr)));
    MACO_TRACE(MACO_SUBSYS_COLL, "allreduce %zu bytes %s: %s", bytes, maco_datatype_name(datatype),
               maco__allreduce_algo_names[algo]);
    return MACO_OK;
}

maco_status_t maco_allreduce_get_algorithm(maco_comm_t comm, size_t count, maco_datatype_t datatype,
                                           const char **name_p)
{
    if (comm == NULL || name_p == NULL || (unsigned)datatype >= MACO_DATATYPE_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_allreduce_get_algorithm: NULL argument or bad datatype");
    if (comm->nranks == 1) {
        *name_p = "copy";
        return MACO_OK;
    }
    maco_status_t st = maco__comm_require_gpu(comm, "maco_allreduce_get_algorithm");
    if (st != MACO_OK)
        return st;
    maco__allreduce_algo_t algo;
    st = maco__allreduce_select(comm, count * maco_datatype_size(datatype), &algo);
    if (st != MACO_OK)
        return st;
    *name_p = maco__allreduce_algo_names[algo];
    return MACO_OK;
}
