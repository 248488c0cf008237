/*
 * fused_internal.h - the fused operators' builder state and the arithmetic of their scratch
 * (tiles, counters), shared by fused.c, fused_ce.c (the graphs), fused_build.c and fused_check.c
 * (arguments and sizes).
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
    /* Communication tasks of a graph with copy-engine operators at most: below it a
     * communication worker's queue never fills, so a closed gate always goes back to it
     * (maco_pk_next_ready; the queues hold tasks + 2: graph_lower.c). */
    MACO__FUSED_CE_MAX_COMM_TASKS = MACO__PK_REQUEUE_MAX,
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
    int mode;      /* MACO_FUSED_COMM_SM or _COPY_ENGINE (AUTO resolved) */
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

/* The bytes of one put of the copy-engine mode (a row of tiles of the product, or a 128-row
 * block of A) and the fewest such rows a peer gets (fused_check.c: the AUTO rule). */
void maco__fused_ce_rows(maco_fused_op_t kind, int nranks, uint32_t m, uint32_t n, uint32_t k,
                         size_t esz, uint64_t *put_bytes_p, uint64_t *rows_p);

/* The communication tasks of an operator in the copy-engine mode (its builder makes exactly
 * these), for the AUTO rule and the builder's check. */
uint64_t maco__fused_ce_comm_tasks(maco_fused_op_t kind, int nranks, uint32_t m, uint32_t n,
                                   uint32_t tile_n);

/** Checks the operator `op` of `kind` for rank `rank` of `nranks` (errors name `fn`) and fills
 * f, with the tiles planned for `units` compute workers (fused_check.c). */
maco_status_t maco__fused_check(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                maco_fused_op_t kind, const char *fn, int rank, int nranks,
                                int units, maco__fused_t *f);

/* Where a task's output and signal also go (maco_task_t's mirrors); count 0: nowhere. */
typedef struct maco__fused_mirrors {
    uint32_t out_first, sig_first, count;
    uint64_t *signal; /* this rank's counter whose twins the peers' are */
} maco__fused_mirrors_t;

/* fused.c's pieces, which the copy-engine builders (fused_ce.c) share. */
maco_status_t maco__fused_add(maco__fused_t *f, maco_task_t *t, const char *what, int *id_p);
/* A partial last row of tiles staged in `stage`: a COPY of `rows` rows of tile_n elements into
 * dst (row stride n elements) after task *id_p, which then names the copy. */
maco_status_t maco__fused_copy_rows(maco__fused_t *f, const void *stage, void *dst, uint32_t rows,
                                    uint32_t tile_n, uint32_t n, int *id_p);
maco_status_t maco__fused_dep(maco__fused_t *f, int task, int on);
uint64_t *maco__fused_ctr(const maco__fused_t *f, uint64_t i);
char *maco__fused_data(const maco__fused_t *f);
uint64_t maco__fused_tile_off(const maco__fused_t *f, const maco_gemm_tile_t *t);
uint32_t maco__fused_rows(uint32_t m, const maco_gemm_tile_t *t);
maco_status_t maco__fused_gemm(maco__fused_t *f, const void *a, uint32_t m,
                               const maco_gemm_tile_t *tile, void *out, uint32_t ldc,
                               const uint64_t *wait, uint64_t wait_count, uint64_t wait_need,
                               int wait_peer, uint64_t *signal, int *id_p);
maco_status_t maco__fused_sum(maco__fused_t *f, const maco_gemm_tile_t *t, uint32_t m,
                              const char *first, uint64_t slot_bytes, void *out,
                              const uint64_t *wait, const maco__fused_mirrors_t *mir, int after,
                              int *id_p);
maco_status_t maco__fused_begin(maco__fused_t *f, uint32_t m, size_t extra,
                                maco_gemm_tile_t **plan_p, size_t *ntiles_p, int **deps_p);
maco_status_t maco__fused_end(maco__fused_t *f, maco_status_t st, const uint64_t *wait,
                              uint64_t count, int *deps, size_t ndeps, maco_gemm_tile_t *plan,
                              int *last_p);

/* The SM mode's builders (fused.c) and the copy-engine ones (fused_ce.c; maco/persistent.h,
 * maco_fused_comm_t): the operator's tasks into f->g, its last task's id in *last_p. */
maco_status_t maco__fused_sm_gemm_allreduce(maco__fused_t *f, int *last_p);
maco_status_t maco__fused_sm_gemm_reduce_scatter(maco__fused_t *f, int *last_p);
maco_status_t maco__fused_sm_allgather_gemm(maco__fused_t *f, int *last_p);
maco_status_t maco__fused_ce_gemm_allreduce(maco__fused_t *f, int *last_p);
maco_status_t maco__fused_ce_gemm_reduce_scatter(maco__fused_t *f, int *last_p);
maco_status_t maco__fused_ce_allgather_gemm(maco__fused_t *f, int *last_p);

#ifdef __cplusplus
}
#endif

#endif /* MACO_RUNTIME_FUSED_INTERNAL_H */
