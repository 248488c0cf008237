/*
 * fused.c - fused operators as task graphs: GEMM + allreduce and allgather + GEMM, tile by
 * tile over memory channels (maco/persistent.h says what each computes). Each is built from
 * the runtime's own task types: GEMM tiles (cuBLASDx), channel puts, signals and waits, and
 * element-wise adds in rank order (so every rank gets the same bits).
 *
 * Order on a channel: puts to a peer are followed by one signal each; the signals on a
 * channel are chained (signal i after signal i - 1) and so are the waits, so the peer's i-th
 * wait returns only after the i-th put has landed.
 */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "persistent_internal.h"

enum { MACO__FUSED_MAX_RANKS = 64 };

typedef struct maco__fused {
    maco_task_graph_t g;
    const maco_fused_gemm_t *op;
    int rank, nranks;
    uint32_t tile_n; /* the GEMM tiles' width (maco__gemm_pick_tile_n) */
    char name[96];
    int prev_sig[MACO__FUSED_MAX_RANKS], prev_wait[MACO__FUSED_MAX_RANKS];
    int last_wait; /* the operator's waits run one after another, in the order they are added */
} maco__fused_t;

/* The tile width for an m x n C on comm's SMs (maco__gemm_tile_width: wide where the wide
 * tiles still fill every SM at least once). */
static uint32_t maco__gemm_pick_tile_n(maco_comm_t comm, uint32_t m, uint32_t n)
{
    int ctas = 0;
    if (comm == NULL || maco_comm_get_coresident_ctas(comm, &ctas) != MACO_OK || ctas < 1)
        ctas = 1;
    return maco__gemm_tile_width(m, n, (uint64_t)ctas, NULL);
}

static maco_status_t maco__fused_add(maco__fused_t *f, maco_task_t *t, const char *what, int *id_p)
{
    char name[160];
    snprintf(name, sizeof(name), "%s%s", f->name, what);
    t->name = name;
    return maco_task_graph_add_task(f->g, t, id_p);
}

static maco_status_t maco__fused_dep(maco__fused_t *f, int task, int on)
{
    return on < 0 ? MACO_OK : maco_task_graph_add_dependency(f->g, task, on);
}

static maco_status_t maco__fused_check(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                       const char *fn, maco__fused_t *f)
{
    if (g == NULL || op == NULL || op->comm == NULL || op->channels == NULL || op->a == NULL ||
        op->b == NULL || op->out == NULL || op->scratch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: NULL argument (graph, op or one of its pointers)", fn);
    memset(f, 0, sizeof(*f));
    f->g = g;
    f->op = op;
    maco_comm_get_rank(op->comm, &f->rank);
    maco_comm_get_nranks(op->comm, &f->nranks);
    if (f->nranks > MACO__FUSED_MAX_RANKS)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PERSIST,
                           "%s: %d ranks; fused operators take at most %d", fn, f->nranks,
                           MACO__FUSED_MAX_RANKS);
    if (op->m == 0 || op->n == 0 || op->k == 0 || op->m % MACO_GEMM_TILE_M != 0 ||
        op->n % MACO_GEMM_TILE_N != 0 || op->k % MACO_GEMM_TILE_K != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: m x n x k = %u x %u x %u: m and n must be non-zero multiples of "
                           "%d and %d, k of %d",
                           fn, op->m, op->n, op->k, MACO_GEMM_TILE_M, MACO_GEMM_TILE_N,
                           MACO_GEMM_TILE_K);
    for (int q = 0; q < f->nranks; q++) {
        if (q != f->rank && (op->channels[q] < 0 || op->channels[q] >= g->nchannels))
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: channels[%d] = %d is not a channel of the graph (it has %d)",
                               fn, q, op->channels[q], g->nchannels);
        f->prev_sig[q] = f->prev_wait[q] = -1;
    }
    f->last_wait = -1;
    f->tile_n = maco__gemm_pick_tile_n(op->comm, op->m, op->n);
    snprintf(f->name, sizeof(f->name), "%s%s", op->name ? op->name : "",
             op->name && op->name[0] ? " " : "");
    return MACO_OK;
}

/* Put [off, off + bytes) of scratch to the same offset of peer q's scratch (after tasks
 * `after` and `ready`), then signal. */
static maco_status_t maco__fused_send(maco__fused_t *f, int q, uint64_t off, uint64_t bytes,
                                      int after, int ready, int *put_p)
{
    maco_task_t t;
    int put, sig;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_CHANNEL_PUT;
    t.channel = (uint32_t)f->op->channels[q];
    t.count = bytes;
    t.src_offset = off;
    t.dst_offset = off;
    maco_status_t st = maco__fused_add(f, &t, "put", &put);
    if (st == MACO_OK)
        st = maco__fused_dep(f, put, after);
    if (st == MACO_OK)
        st = maco__fused_dep(f, put, ready);
    if (put_p != NULL)
        *put_p = put;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_CHANNEL_SIGNAL;
    t.channel = (uint32_t)f->op->channels[q];
    if (st == MACO_OK)
        st = maco__fused_add(f, &t, "signal", &sig);
    if (st == MACO_OK)
        st = maco__fused_dep(f, sig, put);
    if (st == MACO_OK)
        st = maco__fused_dep(f, sig, f->prev_sig[q]);
    f->prev_sig[q] = sig;
    return st;
}

/* The next wait on peer q's channel; its id in *id_p. Every wait of the operator also follows
 * the one added before it, whatever its channel: a wait holds a communication worker until its
 * signal comes, and in GEMM + allreduce a peer's signal can need this rank's earlier waits
 * (the owner of a tile sends the sum only after every product of it arrived, and a rank's
 * signals on a channel are chained). Waits taken in the order they were added (tile order)
 * only ever wait for signals that need earlier waits, so one communication worker cannot
 * deadlock; taken as they became ready, a wait of a later tile could hold the only worker
 * while an earlier tile's wait that its signal needs sat behind it (seen at 4 ranks). */
static maco_status_t maco__fused_wait(maco__fused_t *f, int q, int *id_p)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_CHANNEL_WAIT;
    t.channel = (uint32_t)f->op->channels[q];
    maco_status_t st = maco__fused_add(f, &t, "wait", id_p);
    if (st == MACO_OK)
        st = maco__fused_dep(f, *id_p, f->prev_wait[q]);
    if (st == MACO_OK)
        st = maco__fused_dep(f, *id_p, f->last_wait);
    f->prev_wait[q] = *id_p;
    f->last_wait = *id_p;
    return st;
}

static maco_status_t maco__fused_gemm_tile(maco__fused_t *f, const void *a, uint32_t m,
                                           uint32_t row, uint32_t col, void *out, uint32_t ldc,
                                           int *id_p)
{
    maco_task_t t;
    memset(&t, 0, sizeof(t));
    t.type = MACO_TASK_GEMM_TILE;
    t.datatype = MACO_FLOAT32;
    t.a = a;
    t.b = f->op->b;
    t.out = out;
    t.m = m;
    t.n = f->op->n;
    t.k = f->op->k;
    t.ldc = ldc;
    t.tile_row = row;
    t.tile_col = col;
    t.tile_n = f->tile_n;
    return maco__fused_add(f, &t, "gemm", id_p);
}

/* The start of a launch: a signal to every peer that this rank's scratch is free (its last
 * launch is over), and the wait for each peer's; every put to peer q waits for ready[q]. Without
 * it a peer a launch ahead could overwrite a slot this rank still reads. */
static maco_status_t maco__fused_ready(maco__fused_t *f, int *ready)
{
    maco_status_t st = MACO_OK;
    for (int q = 0; q < f->nranks && st == MACO_OK; q++) {
        ready[q] = -1;
        if (q == f->rank)
            continue;
        maco_task_t t;
        int sig;
        memset(&t, 0, sizeof(t));
        t.type = MACO_TASK_CHANNEL_SIGNAL;
        t.channel = (uint32_t)f->op->channels[q];
        st = maco__fused_add(f, &t, "ready", &sig);
        f->prev_sig[q] = sig;
        if (st == MACO_OK)
            st = maco__fused_wait(f, q, &ready[q]);
    }
    return st;
}

/* out = a + b over a tile (MACO_GEMM_TILE_M rows of f->tile_n), a and b with row stride
 * f->tile_n, out with ld_out; after every task of deps[0..ndeps). */
static maco_status_t maco__fused_add_tile(maco__fused_t *f, const float *a, const float *b,
                                          float *out, uint32_t ld_out, float alpha_b,
                                          const int *deps, int ndeps, int *id_p)
{
    maco_task_t x;
    memset(&x, 0, sizeof(x));
    x.type = alpha_b == 0.0f ? MACO_TASK_SCALE : MACO_TASK_ADD;
    x.datatype = MACO_FLOAT32;
    x.alpha = 1.0f;
    x.count = f->tile_n;
    x.rows = MACO_GEMM_TILE_M;
    x.a = a;
    x.b = b;
    x.ld_in = f->tile_n;
    x.out = out;
    x.ld_out = ld_out;
    maco_status_t st = maco__fused_add(f, &x, "reduce", id_p);
    for (int i = 0; i < ndeps && st == MACO_OK; i++)
        st = maco__fused_dep(f, *id_p, deps[i]);
    return st;
}

maco_status_t maco_task_graph_add_gemm_allreduce(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                                 int *last_p)
{
    maco__fused_t f;
    maco_status_t st = maco__fused_check(g, op, "maco_task_graph_add_gemm_allreduce", &f);
    if (st != MACO_OK)
        return st;
    const uint32_t tn = op->n / f.tile_n, ntiles = (op->m / MACO_GEMM_TILE_M) * tn;
    const uint64_t tile = (uint64_t)MACO_GEMM_TILE_M * f.tile_n;
    const uint64_t mn = (uint64_t)op->m * op->n;
    float *scratch = op->scratch, *out = op->out;
    int ready[MACO__FUSED_MAX_RANKS], done = -1;
    st = maco__fused_ready(&f, ready);
    /* One NOP that every tile's last reduce precedes (the operator's end). */
    maco_task_t nop;
    memset(&nop, 0, sizeof(nop));
    nop.type = MACO_TASK_NOP;
    if (st == MACO_OK)
        st = maco__fused_add(&f, &nop, "done", &done);
    /* Tile t is reduced by its owner, rank t mod nranks (a reduce-scatter followed by an
     * allgather, tile by tile): every other rank puts its product of t into the owner's slot
     * for it, the owner sums the nranks products in rank order into its slot 0 and puts that
     * sum into slot 0 of every peer, and each rank copies slot 0 to out. Every rank sends
     * 2 (nranks - 1) / nranks of the product's bytes, as a ring allreduce does, and does
     * 1 / nranks of the adds; the one-shot scheme before it (each rank sending its whole
     * product to every peer and reducing every tile itself) sent nranks / 2 times as much.
     * Slot 0 of tile t is free to overwrite: on the owner it held an input of the first add;
     * on rank 0 it held rank 0's product, whose put to the owner landed before the owner's
     * wait for it returned; elsewhere it is unused. */
    for (uint32_t t = 0; t < ntiles && st == MACO_OK; t++) {
        uint32_t row = t / tn, col = t % tn;
        const int owner = (int)(t % (uint32_t)f.nranks);
        uint64_t mine = (uint64_t)f.rank * mn + t * tile; /* my slot, tile t (elements) */
        float *dst = out + (uint64_t)row * MACO_GEMM_TILE_M * op->n + (uint64_t)col * f.tile_n;
        float *acc = scratch + t * tile; /* slot 0, tile t */
        int gemm, copy = -1;
        st = maco__fused_gemm_tile(&f, op->a, op->m, row, col, scratch + mine, f.tile_n, &gemm);
        if (st == MACO_OK && f.nranks == 1) { /* one rank: the product is the result */
            st = maco__fused_add_tile(&f, acc, NULL, dst, op->n, 0.0f, &gemm, 1, &copy);
        } else if (st == MACO_OK && owner != f.rank) {
            int sent, res;
            st = maco__fused_send(&f, owner, mine * 4, tile * 4, gemm, ready[owner], &sent);
            if (st == MACO_OK)
                st = maco__fused_dep(&f, done, sent);
            if (st == MACO_OK)
                st = maco__fused_wait(&f, owner, &res); /* the owner's sum in slot 0 */
            if (st == MACO_OK)
                st = maco__fused_add_tile(&f, acc, NULL, dst, op->n, 0.0f, &res, 1, &copy);
        } else if (st == MACO_OK) {
            int have[MACO__FUSED_MAX_RANKS], prev;
            for (int q = 0; q < f.nranks && st == MACO_OK; q++)
                have[q] = gemm;
            for (int q = 0; q < f.nranks && st == MACO_OK; q++)
                if (q != f.rank)
                    st = maco__fused_wait(&f, q, &have[q]);
            /* Sum in rank order, partial sums and the result in slot 0. */
            prev = have[0];
            for (int q = 1; q < f.nranks && st == MACO_OK; q++) {
                int deps[2] = { prev, have[q] }, add;
                st = maco__fused_add_tile(&f, acc, scratch + (uint64_t)q * mn + t * tile, acc,
                                          f.tile_n, 1.0f, deps, 2, &add);
                prev = add;
            }
            for (int q = 0; q < f.nranks && st == MACO_OK; q++) {
                int sent;
                if (q == f.rank)
                    continue;
                st = maco__fused_send(&f, q, t * tile * 4, tile * 4, prev, ready[q], &sent);
                if (st == MACO_OK)
                    st = maco__fused_dep(&f, done, sent);
            }
            if (st == MACO_OK)
                st = maco__fused_add_tile(&f, acc, NULL, dst, op->n, 0.0f, &prev, 1, &copy);
        }
        if (st == MACO_OK)
            st = maco__fused_dep(&f, done, copy);
    }
    if (st == MACO_OK && last_p != NULL)
        *last_p = done;
    return st;
}

maco_status_t maco_task_graph_add_allgather_gemm(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                                 int *last_p)
{
    maco__fused_t f;
    maco_status_t st = maco__fused_check(g, op, "maco_task_graph_add_allgather_gemm", &f);
    if (st != MACO_OK)
        return st;
    const uint32_t tn = op->n / f.tile_n, blocks = op->m / MACO_GEMM_TILE_M;
    const uint32_t mt = op->m * (uint32_t)f.nranks;            /* rows of the gathered A */
    const uint64_t block = (uint64_t)MACO_GEMM_TILE_M * op->k; /* elements of a row block */
    char *gathered = op->scratch;
    float *out = op->out;
    int ready[MACO__FUSED_MAX_RANKS], done = -1;
    st = maco__fused_ready(&f, ready);
    maco_task_t nop;
    memset(&nop, 0, sizeof(nop));
    nop.type = MACO_TASK_NOP;
    if (st == MACO_OK)
        st = maco__fused_add(&f, &nop, "done", &done);
    /* This rank's blocks: into its own slot of the gathered A, then to every peer. */
    int have[MACO__FUSED_MAX_RANKS][256];
    if (blocks > 256)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_allgather_gemm: m = %u: at most %d rows per rank",
                           op->m, 256 * MACO_GEMM_TILE_M);
    for (uint32_t c = 0; c < blocks && st == MACO_OK; c++) {
        uint64_t off = ((uint64_t)f.rank * blocks + c) * block * 2; /* bytes */
        maco_task_t x;
        int copy;
        memset(&x, 0, sizeof(x));
        x.type = MACO_TASK_COPY;
        x.count = block * 2;
        x.a = (const char *)op->a + (uint64_t)c * block * 2;
        x.out = gathered + off;
        st = maco__fused_add(&f, &x, "copy", &copy);
        have[f.rank][c] = copy;
        for (int q = 0; q < f.nranks && st == MACO_OK; q++) {
            if (q == f.rank)
                continue;
            st = maco__fused_send(&f, q, off, block * 2, copy, ready[q], NULL);
        }
    }
    /* Peers' blocks, in the order they send them. */
    for (int q = 0; q < f.nranks && st == MACO_OK; q++)
        for (uint32_t c = 0; c < blocks && st == MACO_OK && q != f.rank; c++)
            st = maco__fused_wait(&f, q, &have[q][c]);
    /* Tiles: block c of rank q is row block q * blocks + c of the gathered A. */
    for (int q = 0; q < f.nranks && st == MACO_OK; q++)
        for (uint32_t c = 0; c < blocks && st == MACO_OK; c++)
            for (uint32_t col = 0; col < tn && st == MACO_OK; col++) {
                uint32_t row = (uint32_t)q * blocks + c;
                int gemm;
                st = maco__fused_gemm_tile(&f, gathered, mt, row, col,
                                           out + (uint64_t)row * MACO_GEMM_TILE_M * op->n +
                                               (uint64_t)col * f.tile_n,
                                           op->n, &gemm);
                if (st == MACO_OK)
                    st = maco__fused_dep(&f, gemm, have[q][c]);
                if (st == MACO_OK)
                    st = maco__fused_dep(&f, done, gemm);
            }
    if (st == MACO_OK && last_p != NULL)
        *last_p = done;
    return st;
}
