/*
 * maco/collectives.h - collective operations, stream-ordered and asynchronous like NCCL's.
 *
 * A call validates its arguments, picks an algorithm and enqueues kernels on `stream`; it
 * returns before the data has moved. The buffers must stay valid until the stream reaches
 * the operation. Every rank must make the same calls in the same order with the same
 * count, type and operation. Results are bitwise identical on every rank and from run to
 * run: each element is reduced in rank order 0, 1, ..., n-1, accumulating in float32 for
 * 16-bit types and rounding once (round to nearest even) at the end.
 *
 * Implemented now: allreduce of float32 and bfloat16 with sum, on ranks of one node.
 */
#ifndef MACO_COLLECTIVES_H
#define MACO_COLLECTIVES_H

#include <stddef.h>

#include "maco/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t without including the CUDA headers (the same type). */
typedef struct CUstream_st *maco_stream_t;

typedef enum maco_datatype {
    MACO_INT8 = 0,
    MACO_UINT8 = 1,
    MACO_INT32 = 2,
    MACO_UINT32 = 3,
    MACO_INT64 = 4,
    MACO_UINT64 = 5,
    MACO_FLOAT16 = 6,
    MACO_BFLOAT16 = 7,
    MACO_FLOAT32 = 8,
    MACO_FLOAT64 = 9,
    MACO_FP8_E4M3 = 10,
    MACO_FP8_E5M2 = 11,
    MACO_DATATYPE_COUNT
} maco_datatype_t;

typedef enum maco_redop {
    MACO_SUM = 0,
    MACO_PROD = 1,
    MACO_MIN = 2,
    MACO_MAX = 3,
    MACO_AVG = 4,
    MACO_REDOP_COUNT
} maco_redop_t;

/** Size of one element in bytes (0 for an unknown type). */
MACO_API size_t maco_datatype_size(maco_datatype_t datatype);
/** "bfloat16", "float32", ...; "unknown" for other values. */
MACO_API const char *maco_datatype_name(maco_datatype_t datatype);
/** "sum", "prod", "min", "max", "avg"; "unknown" for other values. */
MACO_API const char *maco_redop_name(maco_redop_t op);

/**
 * recvbuf[i] = op over ranks r of sendbuf_r[i], for i in [0, count), on every rank.
 * `count` is in elements. sendbuf == recvbuf is in place. Buffers are device memory of
 * the communicator's device, any alignment (16-byte aligned buffers take the fast path),
 * and need not be registered: the data goes through the communicator's scratch buffer.
 * Algorithms (MACO_ALGO_ALLREDUCE forces one):
 *   oneshot_ll  up to MACO_ALLREDUCE_ONESHOT_MAX bytes: every rank writes its whole input
 *               as LL16 packets into every peer's scratch and reduces all of them itself;
 *   rsag        larger: pieces are pushed to their owner rank, reduced there in rank order
 *               (reduce-scatter), and the reduced pieces pushed to every rank (allgather),
 *               pipelined through scratch with one semaphore per peer and CTA.
 * count 0 returns MACO_OK and does nothing. Safe to capture in a CUDA graph.
 * Errors (nothing is enqueued): MACO_ERR_INVALID_ARGUMENT (NULL comm or buffer, type or op
 * out of range, count * size overflows), MACO_ERR_UNSUPPORTED (no GPU on this rank; a type
 * or op not implemented yet: the message names it; ranks on several nodes; an unknown
 * MACO_ALGO_ALLREDUCE), MACO_ERR_INVALID_USAGE (an earlier asynchronous error on this
 * communicator), MACO_ERR_CUDA (the launch failed).
 */
MACO_API maco_status_t maco_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                      maco_datatype_t datatype, maco_redop_t op, maco_comm_t comm,
                                      maco_stream_t stream);

/**
 * The name of the algorithm maco_allreduce() would use for `count` elements of `datatype`
 * on this communicator ("oneshot_ll", "rsag"; "copy" for a single rank). The string is
 * static. Errors: MACO_ERR_INVALID_ARGUMENT, MACO_ERR_UNSUPPORTED (as maco_allreduce).
 */
MACO_API maco_status_t maco_allreduce_get_algorithm(maco_comm_t comm, size_t count,
                                                    maco_datatype_t datatype, const char **name_p);

#ifdef __cplusplus
}
#endif

#endif /* MACO_COLLECTIVES_H */
