/*
 * select.h - which algorithm a call runs (select.c): the kernels' numbers, the names of each
 * collective's algorithms, the forced choice (MACO_ALGO_<COLLECTIVE>) and the choice by size,
 * whose thresholds are rows of algorithms/tuning.h.
 */
#ifndef MACO_ALGORITHMS_COMMON_SELECT_H
#define MACO_ALGORITHMS_COMMON_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "algorithms/common/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kernels (collectives/kernels.cuh): LL (one-shot), MESH, and LL2 (two-shot LL allreduce).
 * For all-to-all and send/recv (MACO_COLL_ALLTOALL, MACO_COLL_SENDRECV) the same numbers name
 * how a sender moves a message: LL = as LL packets ("ll"), MESH = copied through scratch
 * ("copy"); both run in the one p2p kernel (p2p_kernels.cu). */
enum { MACO__KERNEL_LL = 0, MACO__KERNEL_MESH = 1, MACO__KERNEL_LL2 = 2, MACO__KERNEL_HIER = 3 };

/**
 * Sets c->max_ctas to `max_ctas` after checking over the bootstrap that every rank passed the
 * same value (collective, blocking). MACO_ERR_INVALID_ARGUMENT naming the first rank that
 * differs (`what` starts the message), else the bootstrap's errors.
 */
maco_status_t maco__coll_agree_max_ctas(maco_comm_t comm, maco__coll_t *c, int max_ctas,
                                        const char *what);

/** Reads MACO_ALGO_<COLLECTIVE> and MACO_ALLREDUCE_INPLACE_MAX into c (at creation). */
maco_status_t maco__coll_read_settings(maco__coll_t *c);
/** The collective's name ("allreduce") and the name of its kernel `kernel` (MACO__KERNEL_*). */
const char *maco__coll_name(maco_collective_t coll);
const char *maco__coll_algorithm(maco_collective_t coll, int kernel);
/**
 * Picks the kernel (MACO__KERNEL_*) for `count` elements of `esz` bytes (the collective's
 * unit): the forced algorithm, else by size. MACO_ERR_INVALID_ARGUMENT when the forced one
 * cannot take the call, MACO_ERR_UNSUPPORTED when it is not an algorithm of `coll`.
 */
maco_status_t maco__coll_select(maco_comm_t comm, const maco__coll_t *c, maco_collective_t coll,
                                size_t count, size_t esz, int *kernel_p);
/** Whether a sender sends a message of `bytes` bytes of `coll` (MACO_COLL_ALLTOALL or
 * MACO_COLL_SENDRECV) as LL packets: the forced choice ("ll", "copy"), else up to
 * MACO_P2P_LL_MAX bytes. Call maco__coll_select first to reject unknown forced names. */
int maco__p2p_ll(const maco__coll_t *c, maco_collective_t coll, uint64_t bytes);
/** Elements per two-shot block, or 0 when two-shot cannot take the call (select.c). */
size_t maco__coll_twoshot_block(size_t count, size_t esz, size_t n, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_COMMON_SELECT_H */
