/*
 * fused.c - fused GEMM + collective operators as task graphs (maco/persistent.h says what each
 * computes): GEMM + allreduce, GEMM + reduce-scatter and allgather + GEMM, tile by tile over
 * memory channels, with no task that waits on a peer holding a worker that a peer waits for.
 *
 * How a tile crosses to a peer. A GEMM tile that a peer needs is stored by the GEMM itself into
 * the peer's scratch through the channel's mapping (NVLink stores from the tile's epilogue), and
 * the tile's signal adds 1 to a counter in the peer's scratch (after a system-scope fence). The
 * task that consumes it carries a gate on that counter (maco/device/persistent.h, "Gates and
 * signals"): one counter per tile (or per row block of A), never reset, compared with
 * (signals per launch) x (launch + 1). No chained semaphores, no wait tasks: a tile waits only
 * for its own inputs, in any order.
 *
 * Why nothing deadlocks. A worker that pops a task whose gate is closed puts it back at the end
 * of its queue (maco_pk_next_ready), so gates hold no worker and every task whose inputs have
 * come gets to run. Where a queue could be full (more than 4095 tasks of a role), the worker
 * waits at the gate instead; the operators keep even that safe, each gated task waiting only
 * for work that cannot be stuck behind a gated task:
 *   - roots come first in every worker's queue (the schedulers push all roots before any task
 *     that became ready later: maco_pk_roots_pushed), in the graph's order;
 *   - compute workers run the GEMM tiles (roots; gated, if at all, on what peers' communication
 *     workers send or on a peer's start) and, in allgather + GEMM, tiles released right after
 *     the launch's first task;
 *   - communication workers run, as roots, the "ready" signals only (ungated), and after them
 *     the sums (gated on peers' GEMM tiles, which never wait for a communication worker of
 *     theirs beyond its roots) and the puts of A (gated on the peers' ready signals, roots of
 *     their communication workers).
 * Every gate therefore waits for tasks that are roots or that wait only for roots, and roots
 * never wait behind anything but roots: no cycle.
 *
 * Between launches. A rank that starts launch L + 1 may store into a peer's scratch while that
 * peer is still in launch L. Where the peer could still be reading that memory, the stores are
 * gated on the peer's "ready" signal, which the peer sends at the start of its own launch L + 1
 * (its launch L is then over). GEMM + allreduce needs none: a rank ends launch L only after every
 * owner sent it every sum, and an owner sends a tile's sum only after it read the rank's
 * product of it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/base/log.h"
#include "runtime/host/fused_internal.h"

maco_status_t maco__fused_add(maco__fused_t *f, maco_task_t *t, const char *what, int *id_p)
{
    char name[160];
    snprintf(name, sizeof(name), "%s%s", f->name, what);
    t->name = name;
    return maco_task_graph_add_task(f->g, t, id_p);
}

/* A partial last row of tiles (rows < 128 of C) computed into `stage`: one COPY task moves its
 * `rows` rows of tile_n elements into `dst` (row stride n elements) after the GEMM task *id_p;
 * *id_p becomes the copy, which later tasks depend on instead. */
maco_status_t maco__fused_copy_rows(maco__fused_t *f, const void *stage, void *dst, uint32_t rows,
                                    uint32_t tile_n, uint32_t n, int *id_p)
{
    maco_task_t x;
    memset(&x, 0, sizeof(x));
    x.type = MACO_TASK_COPY;
    x.role = MACO_TASK_ROLE_COMPUTE;
    x.count = (uint64_t)tile_n * f->esz;
    x.rows = rows;
    x.ld_in = x.ld_out = (uint32_t)(n * f->esz);
    x.a = stage;
    x.out = dst;
    int copy = -1;
    maco_status_t st = maco__fused_add(f, &x, "copy", &copy);
    if (st == MACO_OK)
        st = maco__fused_dep(f, copy, *id_p);
    if (st == MACO_OK)
        *id_p = copy;
    return st;
}

maco_status_t maco__fused_dep(maco__fused_t *f, int task, int on)
{
    return on < 0 ? MACO_OK : maco_task_graph_add_dependency(f->g, task, on);
}

/* Peer q's address of `local` (a byte inside this rank's scratch, or inside its `out` for
 * out_channels), through channel index `ch`. */
static void *maco__fused_remote(const maco__fused_t *f, int ch, const void *local)
{
    const maco_memory_channel_device_t *c = &f->g->channels[ch];
    return c->remote + ((const char *)local - c->local);
}

/* The counters (uint64_t, at the start of scratch) and the data after them. */
uint64_t *maco__fused_ctr(const maco__fused_t *f, uint64_t i)
{
    return (uint64_t *)f->op->scratch + i;
}

char *maco__fused_data(const maco__fused_t *f)
{
    return (char *)f->op->scratch + f->ctr_bytes;
}

/* The plan of an m x n GEMM's tiles (maco_gemm_plan_tiles for f->units workers) into a new
 * array (free it), *count_p tiles. */
static maco_status_t maco__fused_plan(maco__fused_t *f, uint32_t m, maco_gemm_tile_t **tiles_p,
                                      size_t *count_p)
{
    size_t cap = 0;
    maco_status_t st = maco_gemm_plan_tiles(m, f->op->n, f->units, NULL, &cap);
    if (st != MACO_OK)
        return st;
    maco_gemm_tile_t *tiles = malloc(cap * sizeof(*tiles));
    if (tiles == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                           "%s: out of host memory for the plan of %zu tiles", f->fn, cap);
    st = maco_gemm_plan_tiles(m, f->op->n, f->units, tiles, count_p);
    if (st != MACO_OK) {
        free(tiles);
        return st;
    }
    *tiles_p = tiles;
    return MACO_OK;
}

/* The element offset of a tile in a row-major matrix of f->op->n columns. */
uint64_t maco__fused_tile_off(const maco__fused_t *f, const maco_gemm_tile_t *t)
{
    return (uint64_t)t->tile_row * MACO_GEMM_TILE_M * f->op->n + (uint64_t)t->tile_col * t->tile_n;
}

/* Rows of a tile of an m-row matrix (the last row of tiles may be partial). */
uint32_t maco__fused_rows(uint32_t m, const maco_gemm_tile_t *t)
{
    uint32_t left = m - t->tile_row * MACO_GEMM_TILE_M;
    return left < MACO_GEMM_TILE_M ? left : MACO_GEMM_TILE_M;
}

/* A GEMM tile of A (m x k) x B into `out` (row stride ldc, out_type), gated on `wait` (may be
 * NULL; wait_count signals per launch) and signalling `signal` (may be NULL). */
maco_status_t maco__fused_gemm(maco__fused_t *f, const void *a, uint32_t m,
                               const maco_gemm_tile_t *tile, void *out, uint32_t ldc,
                               const uint64_t *wait, uint64_t wait_count, uint64_t wait_need,
                               int wait_peer, uint64_t *signal, int *id_p)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_GEMM_TILE;
    t.role = MACO_TASK_ROLE_COMPUTE;
    t.datatype = f->op->out_type;
    t.a = a;
    t.b = f->op->b;
    t.out = out;
    t.m = m;
    t.n = f->op->n;
    t.k = f->op->k;
    t.ldc = ldc;
    t.tile_row = tile->tile_row;
    t.tile_col = tile->tile_col;
    t.tile_n = tile->tile_n;
    t.wait_on = wait;
    t.wait_count = wait_count;
    t.wait_need = wait_need;
    t.wait_peer = wait_peer;
    t.signal_to = signal;
    return maco__fused_add(f, &t, "gemm", id_p);
}

/* The start of a launch: a signal to every peer that this rank's scratch is free (its last
 * launch is over): counter `first + rank` of each peer's scratch, or `first` itself when
 * `shared` (each rank's counter then counts all its peers' signals). Roots of the communication
 * workers, which nothing holds up. */
static maco_status_t maco__fused_ready(maco__fused_t *f, uint64_t first, int shared)
{
    maco_status_t st = MACO_OK;
    for (int q = 0; q < f->nranks && st == MACO_OK; q++) {
        if (q == f->rank)
            continue;
        maco_task_t t;
        int id;
        memset(&t, 0, sizeof(t));
        t.type = MACO_TASK_NOP;
        t.role = MACO_TASK_ROLE_COMM;
        t.signal_to = maco__fused_remote(
            f, f->op->channels[q], maco__fused_ctr(f, first + (shared ? 0 : (uint64_t)f->rank)));
        st = maco__fused_add(f, &t, "ready", &id);
        if (f->ready_sig < 0)
            f->ready_sig = id;
    }
    return st;
}

/* The operator's end: a NOP after every task in deps[0..ndeps), gated on `wait` (count per
 * launch) where wait is not NULL. */
static maco_status_t maco__fused_done(maco__fused_t *f, const uint64_t *wait, uint64_t count,
                                      const int *deps, size_t ndeps, int *id_p)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_NOP;
    t.role = MACO_TASK_ROLE_COMM;
    if (wait != NULL && count > 0) {
        t.wait_on = wait;
        t.wait_count = count;
        t.wait_peer = -1;
    }
    maco_status_t st = maco__fused_add(f, &t, "done", id_p);
    for (size_t i = 0; i < ndeps && st == MACO_OK; i++)
        st = maco__fused_dep(f, *id_p, deps[i]);
    return st;
}

/* Adds a copy of the channel to each peer (channels[q], q = rank + 1, rank + 2, ...) to the
 * graph, one after the other, for a task's mirrors; *first_p gets the first's index. */
static maco_status_t maco__fused_peer_channels(maco__fused_t *f, const int *channels,
                                               uint32_t *first_p)
{
    maco_status_t st = MACO_OK;
    for (int step = 1; step < f->nranks && st == MACO_OK; step++) {
        int q = (f->rank + step) % f->nranks, id = -1;
        maco_memory_channel_device_t h = f->g->channels[channels[q]];
        st = maco_task_graph_add_channel(f->g, &h, &id);
        if (step == 1)
            *first_p = (uint32_t)id;
    }
    return st;
}

/* The sum of the nranks slots' tile `t` (slots `slot_bytes` apart from `first`, row stride n)
 * into `out` (row stride n) and its mirrors, in rank order; gated on `wait` (nranks - 1
 * signals per launch), after task `after`. */
maco_status_t maco__fused_sum(maco__fused_t *f, const maco_gemm_tile_t *t, uint32_t m,
                              const char *first, uint64_t slot_bytes, void *out,
                              const uint64_t *wait, const maco__fused_mirrors_t *mir, int after,
                              int *id_p)
{
    maco_task_t x;
    memset(&x, 0, sizeof(x));
    x.type = MACO_TASK_SUM;
    x.role = MACO_TASK_ROLE_COMM;
    x.datatype = f->op->out_type;
    x.count = t->tile_n;
    x.rows = maco__fused_rows(m, t);
    x.ld_in = f->op->n;
    x.ld_out = f->op->n;
    x.a = first;
    x.out = out;
    x.ninputs = (uint32_t)f->nranks;
    x.input_stride = slot_bytes;
    x.wait_on = f->nranks > 1 ? wait : NULL;
    x.wait_count = (uint64_t)f->nranks - 1;
    x.wait_peer = -1;
    if (mir != NULL && mir->count > 0) {
        x.out_mirror_channel = mir->out_first;
        x.out_mirror_count = mir->count;
        x.signal_to = mir->signal;
        x.signal_mirror_channel = mir->sig_first;
        x.signal_mirror_count = mir->count;
    }
    maco_status_t st = maco__fused_add(f, &x, "sum", id_p);
    if (st == MACO_OK)
        st = maco__fused_dep(f, *id_p, after);
    return st;
}

/* An operator's plan of an m-row GEMM (*plan_p, *ntiles_p) and room for the ids of its last
 * tasks (*deps_p: every tile of every rank, `extra` more, and one). */
maco_status_t maco__fused_begin(maco__fused_t *f, uint32_t m, size_t extra,
                                maco_gemm_tile_t **plan_p, size_t *ntiles_p, int **deps_p)
{
    maco_status_t st = maco__fused_plan(f, m, plan_p, ntiles_p);
    if (st != MACO_OK)
        return st;
    *deps_p = malloc((*ntiles_p * (size_t)f->nranks + extra + 1) * sizeof(int));
    if (*deps_p == NULL) {
        free(*plan_p);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                           "%s: out of host memory for %zu tiles", f->fn, *ntiles_p);
    }
    return MACO_OK;
}

/* The operator's end (maco__fused_done after deps[0..ndeps), gated on `wait` where not NULL)
 * when st is MACO_OK, its id in *last_p (may be NULL); frees the plan and the list. */
maco_status_t maco__fused_end(maco__fused_t *f, maco_status_t st, const uint64_t *wait,
                              uint64_t count, int *deps, size_t ndeps, maco_gemm_tile_t *plan,
                              int *last_p)
{
    int done = -1;
    if (st == MACO_OK)
        st = maco__fused_done(f, wait, count, deps, ndeps, &done);
    if (st == MACO_OK && last_p != NULL)
        *last_p = done;
    free(deps);
    free(plan);
    return st;
}

/* Row-parallel linear. Tile p (in plan order) is owned by rank p mod nranks: every rank's GEMM
 * stores its product of p into the owner's slot for it (scratch data: nranks slots of m x n,
 * slot r rank r's) and signals the owner's counter p; the owner sums the nranks slots in rank
 * order into its out and copies the sum into every peer's out (out_channels), signalling the
 * peer's counter `done`; a rank's launch ends once the sums of all tiles it does not own came. */
maco_status_t maco__fused_sm_gemm_allreduce(maco__fused_t *f, int *last_p)
{
    const maco_fused_gemm_t *op = f->op;
    maco_gemm_tile_t *plan = NULL;
    size_t ntiles = 0, ndeps = 0;
    int *deps = NULL;
    maco_status_t st = maco__fused_begin(f, op->m, 0, &plan, &ntiles, &deps);
    if (st != MACO_OK)
        return st;
    const uint64_t slot = maco__fused_pad(op->m) * op->n * f->esz;
    const uint64_t done_ctr = maco__fused_tile_rows(op->m) * (op->n / MACO_GEMM_TILE_N);
    char *data = maco__fused_data(f), *out = op->out;
    uint64_t not_owned = 0;
    /* Up to MACO__PK_MIRRORS peers, the owner's sum is written to every rank's out by the SUM
     * itself (mirrors through copies of the out channels) and each peer's counter `done_ctr`
     * is signalled the same way; past that, a copy task per peer. */
    maco__fused_mirrors_t mir = { 0, 0, 0, maco__fused_ctr(f, done_ctr) };
    if (f->nranks > 1 && f->nranks - 1 <= MACO__PK_MIRRORS) {
        st = maco__fused_peer_channels(f, op->out_channels, &mir.out_first);
        if (st == MACO_OK)
            st = maco__fused_peer_channels(f, op->channels, &mir.sig_first);
        mir.count = (uint32_t)f->nranks - 1;
    }
    for (size_t p = 0; p < ntiles && st == MACO_OK; p++) {
        const maco_gemm_tile_t *t = &plan[p];
        const int owner = (int)(p % (size_t)f->nranks);
        const uint64_t off = maco__fused_tile_off(f, t) * f->esz; /* bytes in a slot and in out */
        int gemm, sum;
        char *mine = data + (uint64_t)f->rank * slot + off;
        if (owner != f->rank) {
            st = maco__fused_gemm(
                f, op->a, op->m, t, maco__fused_remote(f, op->channels[owner], mine), op->n, NULL,
                0, 0, -1, maco__fused_remote(f, op->channels[owner], maco__fused_ctr(f, p)), &gemm);
            deps[ndeps++] = gemm;
            not_owned++;
            continue;
        }
        st = maco__fused_gemm(f, op->a, op->m, t, mine, op->n, NULL, 0, 0, -1, NULL, &gemm);
        if (st == MACO_OK)
            st = maco__fused_sum(f, t, op->m, data + off, slot, out + off, maco__fused_ctr(f, p),
                                 &mir, gemm, &sum);
        if (mir.count > 0) { /* the sum went to every peer's out, and told each */
            deps[ndeps++] = sum;
            continue;
        }
        for (int q = 0; q < f->nranks && st == MACO_OK; q++) {
            if (q == f->rank)
                continue;
            maco_task_t x;
            int put;
            memset(&x, 0, sizeof(x));
            x.type = MACO_TASK_COPY;
            x.role = MACO_TASK_ROLE_COMM;
            x.count = (uint64_t)t->tile_n * f->esz;
            x.rows = maco__fused_rows(op->m, t);
            x.ld_in = x.ld_out = (uint32_t)(op->n * f->esz);
            x.a = out + off;
            x.out = maco__fused_remote(f, op->out_channels[q], out + off);
            x.signal_to = maco__fused_remote(f, op->channels[q], maco__fused_ctr(f, done_ctr));
            st = maco__fused_add(f, &x, "put", &put);
            if (st == MACO_OK)
                st = maco__fused_dep(f, put, sum);
            deps[ndeps++] = put;
        }
    }
    return maco__fused_end(f, st, maco__fused_ctr(f, done_ctr), not_owned, deps, ndeps, plan,
                           last_p);
}

/* Row-parallel linear with a sequence-parallel output. The m rows of A (and of the sum) are
 * nranks blocks of ms = m / nranks rows; rank o keeps block o of the sum. For block o, every
 * rank's GEMM of A's rows [o ms, (o + 1) ms) stores its product into rank o's slot for it
 * (scratch data: nranks slots of ms x n) and signals o's counter of the tile; rank o sums the
 * slots in rank order into out. Each rank computes the blocks in the order rank + 1, rank + 2,
 * ..., its own last (at any moment every rank sends to another rank: the links are evenly
 * loaded, and the sends of the earlier blocks overlap the own block's GEMM). */
maco_status_t maco__fused_sm_gemm_reduce_scatter(maco__fused_t *f, int *last_p)
{
    const maco_fused_gemm_t *op = f->op;
    const uint32_t ms = op->m / (uint32_t)f->nranks;
    maco_gemm_tile_t *plan = NULL;
    size_t ntiles = 0, ndeps = 0;
    int *deps = NULL;
    maco_status_t st = maco__fused_begin(f, ms, 0, &plan, &ntiles, &deps);
    if (st != MACO_OK)
        return st;
    const uint64_t slot = maco__fused_pad(ms) * op->n * f->esz;
    const uint64_t ready = maco__fused_tile_rows(ms) * (op->n / MACO_GEMM_TILE_N);
    char *data = maco__fused_data(f), *out = op->out;
    if (f->nranks > 1)
        st = maco__fused_ready(f, ready, 0);
    for (int step = 1; step <= f->nranks && st == MACO_OK; step++) {
        const int o = (f->rank + step) % f->nranks; /* the own block last */
        const char *a = (const char *)op->a + (uint64_t)o * ms * op->k * 2;
        for (size_t p = 0; p < ntiles && st == MACO_OK; p++) {
            const maco_gemm_tile_t *t = &plan[p];
            const uint64_t off = maco__fused_tile_off(f, t) * f->esz;
            char *mine = data + (uint64_t)f->rank * slot + off;
            int gemm = -1, sum = -1; /* -1 (no task) when a step fails: the deps are not used */
            if (o != f->rank) {
                /* Into o's slot, once o is ready (its last launch read the slot). */
                st = maco__fused_gemm(f, a, ms, t, maco__fused_remote(f, op->channels[o], mine),
                                      op->n, maco__fused_ctr(f, ready + (uint64_t)o), 1, 0, o,
                                      maco__fused_remote(f, op->channels[o], maco__fused_ctr(f, p)),
                                      &gemm);
                deps[ndeps++] = gemm;
            } else {
                st = maco__fused_gemm(f, a, ms, t, mine, op->n, NULL, 0, 0, -1, NULL, &gemm);
                if (st == MACO_OK)
                    st = maco__fused_sum(f, t, ms, data + off, slot, out + off,
                                         maco__fused_ctr(f, p), NULL, gemm, &sum);
                deps[ndeps++] = sum;
            }
        }
    }
    return maco__fused_end(f, st, NULL, 0, deps, ndeps, plan, last_p);
}

/* Column-parallel linear with a sequence-parallel input. Rank r's A shard (m x k) is put, in
 * row blocks of 128, into every peer's slot r of the gathered A (scratch data: nranks slots of
 * m x k bf16), each block signalling the peer's counter of (r, block); the tiles of rank q's
 * rows read slot q (the own shard straight from a) and are gated on the counter of their row
 * block. Puts go to peers in the order rank + 1, rank + 2, ..., so a rank's shards arrive in
 * the order rank - 1, rank - 2, ...: its tiles run in that order, after its own shard's. */
maco_status_t maco__fused_sm_allgather_gemm(maco__fused_t *f, int *last_p)
{
    const maco_fused_gemm_t *op = f->op;
    const uint32_t blocks = (uint32_t)maco__fused_tile_rows(op->m);
    const uint64_t slot = (uint64_t)op->m * op->k * 2,
                   block = (uint64_t)MACO_GEMM_TILE_M * op->k * 2;
    const uint64_t ready = (uint64_t)f->nranks * blocks;
    maco_gemm_tile_t *plan = NULL;
    size_t ntiles = 0, ndeps = 0;
    /* Room for every tile and every put (one per chunk of A and peer, or per chunk). */
    const size_t chunks = (size_t)blocks * ((block + MACO__FUSED_CHUNK - 1) / MACO__FUSED_CHUNK);
    int *deps = NULL;
    maco_status_t st =
        maco__fused_begin(f, op->m, (size_t)f->nranks * chunks, &plan, &ntiles, &deps);
    if (st != MACO_OK)
        return st;
    char *data = maco__fused_data(f), *out = op->out;
    /* Up to MACO__PK_MIRRORS peers, one COPY per row block writes it into this rank's slot
     * of every peer's gathered A (mirrors through copies of the channels) once all of them are
     * ready, and signals each; past that, a COPY per peer and block. */
    const int mirrored = f->nranks > 1 && f->nranks - 1 <= MACO__PK_MIRRORS;
    uint32_t first = 0;
    if (f->nranks > 1)
        st = maco__fused_ready(f, ready, mirrored);
    if (st == MACO_OK && mirrored)
        st = maco__fused_peer_channels(f, op->channels, &first);
    for (int step = 1; step < (mirrored ? 2 : f->nranks) && st == MACO_OK; step++) {
        const int q = (f->rank + step) % f->nranks;
        for (uint32_t b = 0; b < blocks && st == MACO_OK; b++) {
            const uint64_t at = (uint64_t)b * block;
            const uint64_t bytes = b + 1 < blocks ? block : slot - at;
            uint64_t *arrived = maco__fused_ctr(f, (uint64_t)f->rank * blocks + b);
            /* In chunks, so that the communication workers finish one block after the other
             * (the peers' tiles of a block can start) rather than all blocks at the end. */
            for (uint64_t c = 0; c < bytes && st == MACO_OK; c += MACO__FUSED_CHUNK) {
                char *mine = data + (uint64_t)f->rank * slot + at + c;
                maco_task_t x;
                int put;
                memset(&x, 0, sizeof(x));
                x.type = MACO_TASK_COPY;
                x.role = MACO_TASK_ROLE_COMM;
                x.count = bytes - c < MACO__FUSED_CHUNK ? bytes - c : MACO__FUSED_CHUNK;
                x.a = (const char *)op->a + at + c;
                if (mirrored) {
                    x.out = mine; /* and the same place of every peer's scratch */
                    x.out_mirror_channel = first;
                    x.out_mirror_count = (uint32_t)f->nranks - 1;
                    x.wait_on = maco__fused_ctr(f, ready);
                    x.wait_count = (uint64_t)f->nranks - 1;
                    x.wait_peer = -1;
                    x.signal_to = arrived;
                    x.signal_mirror_channel = first;
                    x.signal_mirror_count = (uint32_t)f->nranks - 1;
                } else {
                    x.out = maco__fused_remote(f, op->channels[q], mine);
                    x.wait_on = maco__fused_ctr(f, ready + (uint64_t)q);
                    x.wait_count = 1;
                    x.wait_peer = q;
                    x.signal_to = maco__fused_remote(f, op->channels[q], arrived);
                }
                st = maco__fused_add(f, &x, "put", &put);
                if (st == MACO_OK) /* not a root: behind the ready signals in every queue */
                    st = maco__fused_dep(f, put, f->ready_sig);
                deps[ndeps++] = put;
            }
        }
    }
    /* The tiles: the own shard's first (roots), then rank - 1's, rank - 2's, ... (released with
     * the launch's first task, so that they come after every root in the workers' queues). */
    for (int step = 0; step < f->nranks && st == MACO_OK; step++) {
        const int q = (f->rank - step + f->nranks) % f->nranks;
        const char *a = q == f->rank ? (const char *)op->a : data + (uint64_t)q * slot;
        for (size_t p = 0; p < ntiles && st == MACO_OK; p++) {
            const maco_gemm_tile_t *t = &plan[p];
            const uint64_t row0 = (uint64_t)q * op->m; /* the shard's first row of out */
            char *dst = out + (row0 * op->n + maco__fused_tile_off(f, t)) * f->esz;
            /* A partial last row of tiles is stored whole into scratch (its 128 rows would run
             * into the next shard's), then its rows below m copied to out. */
            const uint32_t rows = maco__fused_rows(op->m, t);
            char *stage =
                data + (uint64_t)f->nranks * slot +
                ((uint64_t)q * MACO_GEMM_TILE_M * op->n + (uint64_t)t->tile_col * t->tile_n) *
                    f->esz;
            int gemm;
            const uint64_t bbytes =
                t->tile_row + 1 < blocks ? block : slot - (uint64_t)t->tile_row * block;
            st = maco__fused_gemm(
                f, a, op->m, t, rows < MACO_GEMM_TILE_M ? stage : dst, op->n,
                q == f->rank ? NULL : maco__fused_ctr(f, (uint64_t)q * blocks + t->tile_row),
                (bbytes + MACO__FUSED_CHUNK - 1) / MACO__FUSED_CHUNK, 0, q, NULL, &gemm);
            if (st == MACO_OK && q != f->rank)
                st = maco__fused_dep(f, gemm, f->ready_sig);
            if (st == MACO_OK && rows < MACO_GEMM_TILE_M)
                st = maco__fused_copy_rows(f, stage, dst, rows, t->tile_n, op->n, &gemm);
            deps[ndeps++] = gemm;
        }
    }
    return maco__fused_end(f, st, NULL, 0, deps, ndeps, plan, last_p);
}
