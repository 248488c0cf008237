/*
 * fused_internal.h - the fused operators' builder state and the arithmetic of their scratch
 * (tiles, counters), shared by fused.c (the graphs) and fused_check.c (arguments and sizes).
 */
#ifndef MACO_RUNTIME_FUSED_INTERNAL_H
#define MACO_RUNTIME_FUSED_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/host/runtime_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MACO__FUSED_MAX_RANKS = 64,
    MACO__FUSED_CHUNK = 256 << 10,   /* bytes of A per put of allgather + GEMM */
    MACO__FUSED_MAX_TILES = 1 << 20, /* tiles of one operator (each several tasks) */
};

typedef struct maco__fused {
    maco_task_graph_t g;
    const maco_fused_gemm_t *op;
    maco_fused_op_t kind;
    const char *fn;
    int rank, nranks, units;
    size_t esz;         /* bytes of an element of out (and of the GEMM + reduce products) */
    uint64_t ctr_bytes; /* the counters at the start of scratch */
    char name[96];
    int ready_sig; /* a task of this rank that runs first in every launch (-1: none) */
} maco__fused_t;

static inline uint64_t maco__fused_round256(uint64_t x)
{
    return (x + 255) / 256 * 256;
}

static inline uint64_t maco__fused_tile_rows(uint64_t m)
{
    return (m + MACO_GEMM_TILE_M - 1) / MACO_GEMM_TILE_M;
}

/* Rows rounded up to whole tiles. */
static inline uint64_t maco__fused_pad(uint64_t m)
{
    return maco__fused_tile_rows(m) * MACO_GEMM_TILE_M;
}

/* The counters of an operator: one per tile (at most ceil(m / 128) x n / 128 of them, or row
 * blocks of A for allgather + GEMM), then one per rank. */
static inline uint64_t maco__fused_nctr(maco_fused_op_t kind, int nranks, uint32_t m, uint32_t n)
{
    switch (kind) {
    case MACO_FUSED_GEMM_ALLREDUCE:
        return maco__fused_tile_rows(m) * (n / MACO_GEMM_TILE_N) + (uint64_t)nranks;
    case MACO_FUSED_GEMM_REDUCE_SCATTER:
        return maco__fused_tile_rows(m / (uint32_t)nranks) * (n / MACO_GEMM_TILE_N) +
               (uint64_t)nranks;
    default:
        return (uint64_t)nranks * maco__fused_tile_rows(m) + (uint64_t)nranks;
    }
}

static inline size_t maco__fused_esz(maco_datatype_t t)
{
    return t == MACO_FLOAT32 ? 4 : 2;
}

/** Checks the operator `op` of `kind` for rank `rank` of `nranks` (errors name `fn`) and fills
 * f, with the tiles planned for `units` compute workers (fused_check.c). */
maco_status_t maco__fused_check(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                maco_fused_op_t kind, const char *fn, int rank, int nranks,
                                int units, maco__fused_t *f);

#ifdef __cplusplus
}
#endif

#endif /* MACO_RUNTIME_FUSED_INTERNAL_H */
