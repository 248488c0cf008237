/*
 * fused_ce.c - the fused operators' copy-engine mode (maco/persistent.h, maco_fused_comm_t):
 * whole rows of tiles (or 128-row blocks of A) cross to peers as port-channel puts that the
 * proxy carries out on the copy engines, so the GEMM keeps its SMs; only sums run on
 * communication workers.
 *
 * The protocol, per launch and per directed pair of ranks r -> q, on r's port channel to q:
 *   reduce-scatter, allgather + GEMM: 1 + R signals: first r's "ready" (r started the launch:
 *     its receive slots are free, its last launch read them), then one put with a signal per
 *     row r sends q (R rows), in row order;
 *   allreduce (scratch channels): one per row owned by q, in row order; (out channels) one per
 *     row owned by r that r summed, in row order. No ready: a rank ends launch L only once every
 *     owner sent it every summed row, and an owner sums a row only after it read every rank's
 *     product of it, so when a rank starts launch L + 1 nobody reads what it overwrites. The
 *     gates on the summed rows are queued once every peer's products of the own rows came: a
 *     rank then waits at a dead peer's own gate first and names it, not an owner waiting for it.
 * The puts to one peer are chained by dependencies (each waits for the previous put's task,
 * which ends once its trigger is in the FIFO), so they enter this GPU's FIFO in that order; the
 * proxy carries out a FIFO's triggers in order and a trigger's signal follows its data (stream
 * order on the CUDA copy transport; a release add after the memcpy on host memory). The peer's
 * semaphore of the channel counts every signal and is never reset, so in launch L the j-th
 * signal (from 1) means the channel's (S L + j)-th: a NOP gated at wait_count S, wait_need j
 * (maco_task_t) sees the j-th row landed, and releases the tasks that read it by dependencies.
 *
 * Why nothing deadlocks. Communication workers never wait at a closed gate: the builder keeps
 * the graph's communication tasks within what a worker's queue holds (MACO__PK_REQUEUE_MAX), so
 * a closed gate always goes back to the queue (maco_pk_next_ready). Compute workers run the GEMM
 * tiles (roots) and, in reduce-scatter, tiles gated on the owner's ready, which is a root of the
 * owner's communication workers, ungated. So every gate waits for a task that cannot be stuck
 * behind a gate: ready signals run at once; puts wait only for GEMM tiles (which wait only for
 * ready signals) and for earlier puts; arrival NOPs hold no worker while they wait.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/base/log.h"
#include "runtime/host/fused_internal.h"

/* The semaphore of this rank's port channel to q: what q's puts to this rank raise. */
static const uint64_t *maco__ce_sem(const maco__fused_t *f, const int *ports, int q)
{
    return f->g->ports[ports[q]].handle.semaphore.inbound;
}

/* A PORT_PUT on graph port channel `ch`: `bytes` (0: the signal alone) from src to dst (offsets
 * in the channel's buffers), on a communication worker, after task `after` (-1: none), gated on
 * the n-th of `count` signals of `sem` where sem is not NULL. */
static maco_status_t maco__ce_put(maco__fused_t *f, int ch, uint64_t src, uint64_t dst,
                                  uint64_t bytes, int after, const uint64_t *sem, uint64_t count,
                                  uint64_t need, int peer, const char *what, int *id_p)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_PORT_PUT;
    t.role = MACO_TASK_ROLE_COMM;
    t.channel = (uint32_t)ch;
    t.count = bytes;
    t.src_offset = src;
    t.dst_offset = dst;
    if (sem != NULL) {
        t.wait_on = sem;
        t.wait_count = count;
        t.wait_need = need;
        t.wait_peer = peer;
    }
    maco_status_t st = maco__fused_add(f, &t, what, id_p);
    if (st == MACO_OK)
        st = maco__fused_dep(f, *id_p, after);
    return st;
}

/* The arrival of peer q's need-th signal of `count` per launch on semaphore `sem`: a gated NOP
 * on a communication worker (a root: it waits without holding the worker). */
static maco_status_t maco__ce_arrival(maco__fused_t *f, const uint64_t *sem, uint64_t count,
                                      uint64_t need, int q, int *id_p)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_NOP;
    t.role = MACO_TASK_ROLE_COMM;
    t.wait_on = sem;
    t.wait_count = count;
    t.wait_need = need;
    t.wait_peer = q;
    return maco__fused_add(f, &t, "arrival", id_p);
}

/* One PORT_FLUSH per distinct proxy FIFO among the channels ports0[q] and ports1[q] (may be
 * NULL), q != rank, each after every task of after[0..nafter); their ids appended to deps. */
static maco_status_t maco__ce_flush(maco__fused_t *f, const int *ports0, const int *ports1,
                                    const int *after, size_t nafter, int *deps, size_t *ndeps_p)
{
    maco_status_t st = MACO_OK;
    const int *sets[2] = { ports0, ports1 };
    const maco_trigger_t *done[2 * MACO__FUSED_MAX_RANKS];
    int ndone = 0;
    for (int s = 0; s < 2; s++)
        for (int q = 0; q < f->nranks && sets[s] != NULL && st == MACO_OK; q++) {
            if (q == f->rank)
                continue;
            const maco_trigger_t *fifo = f->g->ports[sets[s][q]].handle.fifo.triggers;
            int seen = 0;
            for (int i = 0; i < ndone && !seen; i++)
                seen = done[i] == fifo;
            if (seen)
                continue;
            done[ndone++] = fifo;
            maco_task_t t;
            int id;
            memset(&t, 0, sizeof(t));
            t.type = MACO_TASK_PORT_FLUSH;
            t.role = MACO_TASK_ROLE_COMM;
            t.channel = (uint32_t)sets[s][q];
            st = maco__fused_add(f, &t, "flush", &id);
            for (size_t i = 0; i < nafter && st == MACO_OK; i++)
                st = maco__fused_dep(f, id, after[i]);
            deps[(*ndeps_p)++] = id;
        }
    return st;
}

/* Appends the ids of the plan's tiles of tile row `row` (gemm[p] for plan entry p) as
 * dependencies of task `task`. */
static maco_status_t maco__ce_dep_row(maco__fused_t *f, int task, const maco_gemm_tile_t *plan,
                                      size_t ntiles, const int *gemm, uint32_t row)
{
    maco_status_t st = MACO_OK;
    for (size_t p = 0; p < ntiles && st == MACO_OK; p++)
        if (plan[p].tile_row == row)
            st = maco__fused_dep(f, task, gemm[p]);
    return st;
}

/* Bytes of tile row i of an m-row matrix with rows of `row_bytes`. */
static uint64_t maco__ce_row_bytes(uint32_t m, uint32_t i, uint64_t row_bytes)
{
    uint32_t left = m - i * MACO_GEMM_TILE_M;
    return (uint64_t)(left < MACO_GEMM_TILE_M ? left : MACO_GEMM_TILE_M) * row_bytes;
}

/* Scratch: counters | receive slots [nranks] (slot q: rank q's products of this rank's rows) |
 * send slots [nranks] (slot o: this rank's products of rank o's rows), each pad(ms) x n. */
maco_status_t maco__fused_ce_gemm_reduce_scatter(maco__fused_t *f, int *last_p)
{
    const maco_fused_gemm_t *op = f->op;
    const int n = f->nranks, r = f->rank;
    const uint32_t ms = op->m / (uint32_t)n;
    const uint32_t R = (uint32_t)maco__fused_tile_rows(ms);
    const uint64_t S = (uint64_t)R + 1, row = (uint64_t)op->n * f->esz;
    const uint64_t slot = maco__fused_pad(ms) * row;
    maco_gemm_tile_t *plan = NULL;
    size_t ntiles = 0, ndeps = 0;
    int *deps = NULL;
    maco_status_t st = maco__fused_begin(f, ms, (size_t)n * R, &plan, &ntiles, &deps);
    if (st != MACO_OK)
        return st;
    int *ready = calloc((size_t)n, sizeof(int)), *gemm = calloc(ntiles + 1, sizeof(int));
    int *arrive = calloc((size_t)n * R + 1, sizeof(int)); /* [q][i] */
    if (ready == NULL || gemm == NULL || arrive == NULL)
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST, "%s: out of host memory", f->fn);
    char *data = maco__fused_data(f), *out = op->out;
    const uint64_t recv = f->ctr_bytes, send = f->ctr_bytes + (uint64_t)n * slot; /* offsets */
    /* Roots of the communication workers, the ready signals first. */
    for (int q = 0; q < n && st == MACO_OK; q++)
        if (q != r)
            st = maco__ce_put(f, op->port_channels[q], 0, 0, 0, -1, NULL, 0, 0, -1, "ready",
                              &ready[q]);
    for (int q = 0; q < n && st == MACO_OK; q++)
        for (uint32_t i = 0; i < R && q != r && st == MACO_OK; i++)
            st = maco__ce_arrival(f, maco__ce_sem(f, op->port_channels, q), S, i + 2, q,
                                  &arrive[(size_t)q * R + i]);
    for (int step = 1; step <= n && st == MACO_OK; step++) {
        const int o = (r + step) % n; /* the own block last */
        const char *a = (const char *)op->a + (uint64_t)o * ms * op->k * 2;
        for (size_t p = 0; p < ntiles && st == MACO_OK; p++) {
            const uint64_t off = maco__fused_tile_off(f, &plan[p]) * f->esz;
            if (o != r) /* into the send slot, once o is ready (its first signal) */
                st = maco__fused_gemm(f, a, ms, &plan[p], data + ((uint64_t)n + o) * slot + off,
                                      op->n, maco__ce_sem(f, op->port_channels, o), S, 1, o, NULL,
                                      &gemm[p]);
            else
                st = maco__fused_gemm(f, a, ms, &plan[p], data + (uint64_t)r * slot + off, op->n,
                                      NULL, 0, 0, -1, NULL, &gemm[p]);
        }
        if (o != r) {
            /* Each row to o's receive slot for this rank, once its tiles are done, in order. */
            int prev = ready[o];
            for (uint32_t i = 0; i < R && st == MACO_OK; i++) {
                const uint64_t at = (uint64_t)i * MACO_GEMM_TILE_M * row;
                int put;
                st = maco__ce_put(f, op->port_channels[o], send + o * slot + at,
                                  recv + (uint64_t)r * slot + at, maco__ce_row_bytes(ms, i, row),
                                  prev, NULL, 0, 0, -1, "put", &put);
                if (st == MACO_OK)
                    st = maco__ce_dep_row(f, put, plan, ntiles, gemm, i);
                deps[ndeps++] = prev = put;
            }
            continue;
        }
        /* The own block: each tile's products in rank order, once every peer's row came. */
        for (size_t p = 0; p < ntiles && st == MACO_OK; p++) {
            const uint64_t off = maco__fused_tile_off(f, &plan[p]) * f->esz;
            int sum;
            st = maco__fused_sum(f, &plan[p], ms, data + off, slot, out + off, NULL, NULL, gemm[p],
                                 &sum);
            for (int q = 0; q < n && st == MACO_OK; q++)
                if (q != r)
                    st = maco__fused_dep(f, sum, arrive[(size_t)q * R + plan[p].tile_row]);
            deps[ndeps++] = sum;
        }
    }
    free(ready);
    free(gemm);
    free(arrive);
    return maco__fused_end(f, st, NULL, 0, deps, ndeps, plan, last_p);
}

/* Scratch: counters | slots [nranks] of pad(m) x n (slot q: rank q's product, of the rows this
 * rank owns; slot `rank` the whole own product). Tile row i is owned by rank i mod nranks. */
maco_status_t maco__fused_ce_gemm_allreduce(maco__fused_t *f, int *last_p)
{
    const maco_fused_gemm_t *op = f->op;
    const int n = f->nranks, r = f->rank;
    const uint32_t R = (uint32_t)maco__fused_tile_rows(op->m);
    const uint64_t row = (uint64_t)op->n * f->esz, slot = maco__fused_pad(op->m) * row;
    const uint64_t own = (R + (uint64_t)n - 1 - (uint64_t)r) / (uint64_t)n; /* rows r owns */
    maco_gemm_tile_t *plan = NULL;
    size_t ntiles = 0, ndeps = 0;
    int *deps = NULL;
    maco_status_t st =
        maco__fused_begin(f, op->m, (size_t)R * (size_t)n + 3 * (size_t)n, &plan, &ntiles, &deps);
    if (st != MACO_OK)
        return st;
    int *gemm = calloc(ntiles + 1, sizeof(int));
    int *arrive = calloc((size_t)n * R + 1, sizeof(int)); /* [q][i] */
    int *prev = calloc((size_t)n, sizeof(int)), *prev_out = calloc((size_t)n, sizeof(int));
    int *puts = calloc((size_t)n * R + 1, sizeof(int));
    size_t nputs = 0;
    if (gemm == NULL || arrive == NULL || prev == NULL || prev_out == NULL || puts == NULL)
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST, "%s: out of host memory", f->fn);
    char *data = maco__fused_data(f), *out = op->out;
    for (int q = 0; q < n; q++)
        if (prev != NULL && prev_out != NULL)
            prev[q] = prev_out[q] = -1;
    /* The communication workers' roots, each peer's products of the own rows, then the end:
     * every owner's summed rows. */
    for (int q = 0; q < n && st == MACO_OK; q++)
        for (uint32_t i = (uint32_t)r; i < R && q != r && st == MACO_OK; i += (uint32_t)n)
            st = maco__ce_arrival(f, maco__ce_sem(f, op->port_channels, q), own, i / n + 1, q,
                                  &arrive[(size_t)q * R + i]);
    for (int o = 0; o < n && st == MACO_OK; o++) {
        const uint64_t theirs = (R + (uint64_t)n - 1 - (uint64_t)o) / (uint64_t)n;
        if (o != r && theirs > 0) {
            int end;
            st = maco__ce_arrival(f, maco__ce_sem(f, op->out_port_channels, o), theirs, 0, o, &end);
            /* Queued once every peer's products of the own rows came: a rank then waits for a
             * dead peer's own signals before the owners that wait for it, and names it. */
            for (int q = 0; q < n && st == MACO_OK; q++)
                for (uint32_t i = (uint32_t)r; i < R && q != r && st == MACO_OK; i += (uint32_t)n)
                    st = maco__fused_dep(f, end, arrive[(size_t)q * R + i]);
            deps[ndeps++] = end;
        }
    }
    /* The GEMM into the own slot (compute roots). */
    for (size_t p = 0; p < ntiles && st == MACO_OK; p++)
        st =
            maco__fused_gemm(f, op->a, op->m, &plan[p],
                             data + (uint64_t)r * slot + maco__fused_tile_off(f, &plan[p]) * f->esz,
                             op->n, NULL, 0, 0, -1, NULL, &gemm[p]);
    for (uint32_t i = 0; i < R && st == MACO_OK; i++) {
        const int o = (int)(i % (uint32_t)n);
        const uint64_t at = (uint64_t)i * MACO_GEMM_TILE_M * row,
                       bytes = maco__ce_row_bytes(op->m, i, row);
        if (o != r) { /* to the owner's slot for this rank, in row order */
            int put;
            st = maco__ce_put(f, op->port_channels[o], f->ctr_bytes + (uint64_t)r * slot + at,
                              f->ctr_bytes + (uint64_t)r * slot + at, bytes, prev[o], NULL, 0, 0,
                              -1, "put", &put);
            if (st == MACO_OK)
                st = maco__ce_dep_row(f, put, plan, ntiles, gemm, i);
            puts[nputs++] = prev[o] = put;
            continue;
        }
        /* An own row: its tiles summed in rank order once every peer's product came, then the
         * summed row into every peer's out, in row order. */
        size_t first = ndeps;
        for (size_t p = 0; p < ntiles && st == MACO_OK; p++) {
            if (plan[p].tile_row != i)
                continue;
            const uint64_t off = maco__fused_tile_off(f, &plan[p]) * f->esz;
            int sum;
            st = maco__fused_sum(f, &plan[p], op->m, data + off, slot, out + off, NULL, NULL,
                                 gemm[p], &sum);
            for (int q = 0; q < n && st == MACO_OK; q++)
                if (q != r)
                    st = maco__fused_dep(f, sum, arrive[(size_t)q * R + i]);
            deps[ndeps++] = sum;
        }
        for (int q = 0; q < n && st == MACO_OK; q++) {
            if (q == r)
                continue;
            int put;
            st = maco__ce_put(f, op->out_port_channels[q], at, at, bytes, prev_out[q], NULL, 0, 0,
                              -1, "out put", &put);
            for (size_t d = first; d < ndeps && st == MACO_OK; d++) /* the row's sums */
                st = maco__fused_dep(f, put, deps[d]);
            puts[nputs++] = prev_out[q] = put;
        }
    }
    /* The puts read this rank's out and scratch: the launch ends once they have landed. */
    if (st == MACO_OK && n > 1)
        st = maco__ce_flush(f, op->port_channels, op->out_port_channels, puts, nputs, deps, &ndeps);
    for (size_t i = 0; i < nputs; i++)
        deps[ndeps++] = puts[i];
    free(gemm);
    free(arrive);
    free(prev);
    free(prev_out);
    free(puts);
    return maco__fused_end(f, st, NULL, 0, deps, ndeps, plan, last_p);
}

/* Scratch: counters | slots [nranks] of m x k bf16 (slot q: rank q's A) | the shards' partial last
 * rows of tiles, as in the SM mode. Port channel q: from this rank's `a` into q's scratch. */
maco_status_t maco__fused_ce_allgather_gemm(maco__fused_t *f, int *last_p)
{
    const maco_fused_gemm_t *op = f->op;
    const int n = f->nranks, r = f->rank;
    const uint32_t B = (uint32_t)maco__fused_tile_rows(op->m);
    const uint64_t arow = (uint64_t)op->k * 2, slot = (uint64_t)op->m * arow;
    const uint64_t S = (uint64_t)B + 1;
    maco_gemm_tile_t *plan = NULL;
    size_t ntiles = 0, ndeps = 0;
    int *deps = NULL;
    maco_status_t st =
        maco__fused_begin(f, op->m, (size_t)n * B + 2 * (size_t)n, &plan, &ntiles, &deps);
    if (st != MACO_OK)
        return st;
    int *ready = calloc((size_t)n, sizeof(int));
    int *arrive = calloc((size_t)n * B + 1, sizeof(int)); /* [q][b] */
    int *puts = calloc((size_t)n * B + 1, sizeof(int));
    size_t nputs = 0;
    if (ready == NULL || arrive == NULL || puts == NULL)
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST, "%s: out of host memory", f->fn);
    char *data = maco__fused_data(f), *out = op->out;
    for (int q = 0; q < n && st == MACO_OK; q++)
        if (q != r)
            st = maco__ce_put(f, op->port_channels[q], 0, 0, 0, -1, NULL, 0, 0, -1, "ready",
                              &ready[q]);
    for (int q = 0; q < n && st == MACO_OK; q++)
        for (uint32_t b = 0; b < B && q != r && st == MACO_OK; b++)
            st = maco__ce_arrival(f, maco__ce_sem(f, op->port_channels, q), S, b + 2, q,
                                  &arrive[(size_t)q * B + b]);
    /* This rank's A, block by block from `a`, into every peer's slot for it once the peer is
     * ready (its first signal), peers in the order rank + 1, rank + 2, ... */
    for (int step = 1; step < n && st == MACO_OK; step++) {
        const int q = (r + step) % n;
        int prev = ready[q];
        for (uint32_t b = 0; b < B && st == MACO_OK; b++) {
            const uint64_t at = (uint64_t)b * MACO_GEMM_TILE_M * arow;
            int put;
            st = maco__ce_put(f, op->port_channels[q], at, f->ctr_bytes + (uint64_t)r * slot + at,
                              maco__ce_row_bytes(op->m, b, arow), prev,
                              maco__ce_sem(f, op->port_channels, q), S, 1, q, "put", &put);
            puts[nputs++] = prev = put;
        }
    }
    /* The tiles: the own shard's first (roots, reading `a`), then rank - 1's, rank - 2's, ...,
     * each released by the arrival of its block. */
    for (int step = 0; step < n && st == MACO_OK; step++) {
        const int q = (r - step + n) % n;
        const char *a = q == r ? (const char *)op->a : data + (uint64_t)q * slot;
        for (size_t p = 0; p < ntiles && st == MACO_OK; p++) {
            const maco_gemm_tile_t *t = &plan[p];
            const uint64_t row0 = (uint64_t)q * op->m;
            char *dst = out + (row0 * op->n + maco__fused_tile_off(f, t)) * f->esz;
            const uint32_t rows = maco__fused_rows(op->m, t);
            char *stage =
                data + (uint64_t)n * slot +
                ((uint64_t)q * MACO_GEMM_TILE_M * op->n + (uint64_t)t->tile_col * t->tile_n) *
                    f->esz;
            int gemm;
            st = maco__fused_gemm(f, a, op->m, t, rows < MACO_GEMM_TILE_M ? stage : dst, op->n,
                                  NULL, 0, 0, -1, NULL, &gemm);
            if (st == MACO_OK && q != r)
                st = maco__fused_dep(f, gemm, arrive[(size_t)q * B + t->tile_row]);
            if (st == MACO_OK && rows < MACO_GEMM_TILE_M)
                st = maco__fused_copy_rows(f, stage, dst, rows, t->tile_n, op->n, &gemm);
            deps[ndeps++] = gemm;
        }
    }
    /* The puts read `a`: the launch ends once they have landed. */
    if (st == MACO_OK && n > 1)
        st = maco__ce_flush(f, op->port_channels, NULL, puts, nputs, deps, &ndeps);
    free(ready);
    free(arrive);
    free(puts);
    return maco__fused_end(f, st, NULL, 0, deps, ndeps, plan, last_p);
}
