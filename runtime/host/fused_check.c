/*
 * fused_check.c - the fused operators' arguments (maco/persistent.h) checked before a graph is
 * built, and the scratch they need (maco_fused_gemm_scratch_bytes). Needs no GPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "src/host/base/log.h"
#include "runtime/host/fused_internal.h"

/* The shape checks of maco_fused_gemm_scratch_bytes, naming `fn`. */
static maco_status_t maco__fused_shape_check(const char *fn, maco_fused_op_t kind, int nranks,
                                             uint32_t m, uint32_t n, uint32_t k,
                                             maco_datatype_t out_type, const void *out_p)
{
    if (out_p == NULL || nranks < 1 || nranks > MACO__FUSED_MAX_RANKS || m == 0 || n == 0 ||
        k == 0 || n % MACO_GEMM_TILE_N != 0 ||
        (kind != MACO_FUSED_GEMM_ALLREDUCE && kind != MACO_FUSED_GEMM_REDUCE_SCATTER &&
         kind != MACO_FUSED_ALLGATHER_GEMM) ||
        (out_type != MACO_FLOAT32 && out_type != MACO_BFLOAT16) ||
        (kind == MACO_FUSED_GEMM_REDUCE_SCATTER && m % (uint32_t)nranks != 0))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: kind %d, nranks %d, m %u, n %u, k %u, out_type %d, output %p: a "
                           "maco_fused_op_t, 1 to %d ranks, m, n, k non-zero, n a multiple of "
                           "%d, m a multiple of nranks for the reduce-scatter, out_type "
                           "MACO_FLOAT32 or MACO_BFLOAT16",
                           fn, (int)kind, nranks, m, n, k, (int)out_type, out_p,
                           MACO__FUSED_MAX_RANKS, MACO_GEMM_TILE_N);
    return MACO_OK;
}

void maco__fused_ce_rows(maco_fused_op_t kind, int nranks, uint32_t m, uint32_t n, uint32_t k,
                         size_t esz, uint64_t *put_bytes_p, uint64_t *rows_p)
{
    const uint64_t R =
        maco__fused_tile_rows(kind == MACO_FUSED_GEMM_REDUCE_SCATTER ? m / (uint32_t)nranks : m);
    if (kind == MACO_FUSED_ALLGATHER_GEMM) { /* blocks of A, every one to every peer */
        *put_bytes_p = (uint64_t)(m < MACO_GEMM_TILE_M ? m : MACO_GEMM_TILE_M) * k * 2;
        *rows_p = R;
        return;
    }
    *put_bytes_p = (uint64_t)(m < MACO_GEMM_TILE_M ? m : MACO_GEMM_TILE_M) * n * esz;
    /* reduce-scatter: a block's rows to its owner; allreduce: owner i mod nranks of row i,
     * the fewest any owner gets. */
    *rows_p = kind == MACO_FUSED_GEMM_REDUCE_SCATTER ? R : R / (uint64_t)nranks;
}

uint64_t maco__fused_ce_comm_tasks(maco_fused_op_t kind, int nranks, uint32_t m, uint32_t n,
                                   uint32_t tile_n)
{
    /* Flushes: one per distinct FIFO of the channels, at most one per channel. */
    const uint64_t peers = (uint64_t)nranks - 1, cols = n / tile_n;
    if (kind == MACO_FUSED_ALLGATHER_GEMM) { /* ready, arrivals, puts; flushes, done */
        const uint64_t B = maco__fused_tile_rows(m);
        return peers + 2 * peers * B + peers + 1;
    }
    if (kind == MACO_FUSED_GEMM_REDUCE_SCATTER) { /* ready, arrivals, puts, sums; done */
        const uint64_t R = maco__fused_tile_rows(m / (uint32_t)nranks);
        return peers + 2 * peers * R + R * cols + 1;
    }
    /* allreduce, the most rows an owner has: arrivals, sums and out puts of its rows, puts of
     * the others' rows, the ends of the owners' rows, flushes, done. */
    const uint64_t R = maco__fused_tile_rows(m), own = (R + (uint64_t)nranks - 1) / nranks;
    return peers * own + own * cols + peers * own + (R - R / (uint64_t)nranks) + peers + 2 * peers +
           1;
}

maco_status_t maco_fused_gemm_choose_comm(maco_fused_op_t kind, int nranks, uint32_t m, uint32_t n,
                                          uint32_t k, maco_datatype_t out_type,
                                          maco_fused_comm_t *mode_p)
{
    maco_status_t st = maco__fused_shape_check("maco_fused_gemm_choose_comm", kind, nranks, m, n, k,
                                               out_type, mode_p);
    if (st != MACO_OK)
        return st;
    uint64_t put = 0, rows = 0;
    maco__fused_ce_rows(kind, nranks, m, n, k, maco__fused_esz(out_type), &put, &rows);
    /* Narrow tiles: the most tasks the builder could make. */
    const uint64_t tasks = maco__fused_ce_comm_tasks(kind, nranks, m, n, MACO_GEMM_TILE_N);
    *mode_p = nranks > 1 && put >= MACO_FUSED_CE_MIN_PUT && rows >= MACO_FUSED_CE_MIN_ROWS &&
                      tasks <= MACO__FUSED_CE_MAX_COMM_TASKS
                  ? MACO_FUSED_COMM_COPY_ENGINE
                  : MACO_FUSED_COMM_SM;
    return MACO_OK;
}

maco_status_t maco_fused_gemm_scratch_bytes_mode(maco_fused_op_t kind, int mode, int nranks,
                                                 uint32_t m, uint32_t n, uint32_t k,
                                                 maco_datatype_t out_type, size_t *bytes_p)
{
    const char *fn = "maco_fused_gemm_scratch_bytes_mode";
    maco_status_t st = maco__fused_shape_check(fn, kind, nranks, m, n, k, out_type, bytes_p);
    if (st != MACO_OK)
        return st;
    if (mode != MACO_FUSED_COMM_SM && mode != MACO_FUSED_COMM_COPY_ENGINE &&
        mode != MACO_FUSED_COMM_AUTO)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: mode %d is no maco_fused_comm_t (SM 0, COPY_ENGINE 1, AUTO 2)", fn,
                           mode);
    maco_fused_comm_t m2 = (maco_fused_comm_t)mode;
    if (mode == MACO_FUSED_COMM_AUTO)
        (void)maco_fused_gemm_choose_comm(kind, nranks, m, n, k, out_type, &m2);
    size_t bytes = 0;
    st = maco_fused_gemm_scratch_bytes(kind, nranks, m, n, k, out_type, &bytes);
    if (st != MACO_OK || m2 != MACO_FUSED_COMM_COPY_ENGINE ||
        kind != MACO_FUSED_GEMM_REDUCE_SCATTER) {
        if (st == MACO_OK)
            *bytes_p = bytes;
        return st;
    }
    /* The send slots: another nranks x pad(m / nranks) x n elements. */
    uint64_t more =
        (uint64_t)nranks * maco__fused_pad(m / (uint32_t)nranks) * n * maco__fused_esz(out_type);
    if (more > SIZE_MAX - bytes)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: %zu + %llu bytes do not fit a size_t", fn, bytes,
                           (unsigned long long)more);
    *bytes_p = bytes + (size_t)more;
    return MACO_OK;
}

maco_status_t maco_fused_gemm_scratch_bytes(maco_fused_op_t kind, int nranks, uint32_t m,
                                            uint32_t n, uint32_t k, maco_datatype_t out_type,
                                            size_t *bytes_p)
{
    if (bytes_p == NULL || nranks < 1 || nranks > MACO__FUSED_MAX_RANKS || m == 0 || n == 0 ||
        k == 0 || n % MACO_GEMM_TILE_N != 0 ||
        (kind != MACO_FUSED_GEMM_ALLREDUCE && kind != MACO_FUSED_GEMM_REDUCE_SCATTER &&
         kind != MACO_FUSED_ALLGATHER_GEMM) ||
        (out_type != MACO_FLOAT32 && out_type != MACO_BFLOAT16) ||
        (kind == MACO_FUSED_GEMM_REDUCE_SCATTER && m % (uint32_t)nranks != 0))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_fused_gemm_scratch_bytes: kind %d, nranks %d, m %u, n %u, k %u, "
                           "out_type %d, bytes_p %p: a maco_fused_op_t, 1 to %d ranks, m, n, k "
                           "non-zero, n a multiple of %d, m a multiple of nranks for the "
                           "reduce-scatter, out_type MACO_FLOAT32 or MACO_BFLOAT16",
                           (int)kind, nranks, m, n, k, (int)out_type, (void *)bytes_p,
                           MACO__FUSED_MAX_RANKS, MACO_GEMM_TILE_N);
    /* Counters: below 2^33 (m, n < 2^32, 64 ranks), no overflow. */
    uint64_t ctr = maco__fused_round256(maco__fused_nctr(kind, nranks, m, n) * 8);
    uint64_t esz = maco__fused_esz(out_type), data = 0, extra = 0;
    int wrapped;
    /* Products are stored as whole tiles of 128 rows: slots of rows rounded up to 128. Every
     * product is checked: (64, 2^28, 128, 2^29) made nranks x m x k x 2 wrap to 0. */
    if (kind == MACO_FUSED_GEMM_ALLREDUCE) /* slot r: rank r's product */
        wrapped =
            __builtin_mul_overflow((uint64_t)nranks * maco__fused_pad(m), (uint64_t)n, &data) ||
            __builtin_mul_overflow(data, esz, &data);
    else if (kind == MACO_FUSED_GEMM_REDUCE_SCATTER)
        wrapped = __builtin_mul_overflow((uint64_t)nranks * maco__fused_pad(m / (uint32_t)nranks),
                                         (uint64_t)n, &data) ||
                  __builtin_mul_overflow(data, esz, &data);
    else /* every rank's A shard (bf16), and each shard's partial last row of tiles */
        wrapped = __builtin_mul_overflow((uint64_t)nranks * m, (uint64_t)k * 2, &data) ||
                  (m % MACO_GEMM_TILE_M != 0 &&
                   __builtin_mul_overflow((uint64_t)nranks * MACO_GEMM_TILE_M * esz, (uint64_t)n,
                                          &extra)) ||
                  __builtin_add_overflow(data, extra, &data);
    if (wrapped || data > SIZE_MAX - ctr)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_fused_gemm_scratch_bytes: the scratch for nranks %d x m %u x %s "
                           "%u (x %llu bytes per element) does not fit a size_t (2^64 bytes)",
                           nranks, m, kind == MACO_FUSED_ALLGATHER_GEMM ? "k" : "n",
                           kind == MACO_FUSED_ALLGATHER_GEMM ? k : n,
                           (unsigned long long)(kind == MACO_FUSED_ALLGATHER_GEMM ? 2 : esz));
    *bytes_p = (size_t)(ctr + data);
    return MACO_OK;
}

/* Whether graph port channel `idx` leads to rank `peer` from `src` (at least src_bytes) into a
 * buffer of at least dst_bytes; the error names the argument `what`[q]. */
static maco_status_t maco__fused_port_check(maco_task_graph_t g, const char *fn, const char *what,
                                            const int *ports, int q, const void *src,
                                            uint64_t src_bytes, const char *src_name,
                                            uint64_t dst_bytes)
{
    if (ports == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: %s is NULL: the copy-engine mode moves rows over port channels "
                           "(maco_task_graph_add_port_channel)",
                           fn, what);
    const int ch = ports[q];
    const maco__port_info_t *c = ch >= 0 && ch < g->nports ? &g->ports[ch] : NULL;
    if (c == NULL || c->peer != q || c->src != (const char *)src || c->src_bytes < src_bytes ||
        c->dst_bytes < dst_bytes)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: %s[%d] = %d must be a port channel of the graph (it has %d) to "
                           "rank %d from this rank's %s %p (at least %llu bytes) into rank %d's "
                           "(at least %llu bytes)%s",
                           fn, what, q, ch, g->nports, q, src_name, src,
                           (unsigned long long)src_bytes, q, (unsigned long long)dst_bytes,
                           c == NULL ? "" : "; it is not");
    return MACO_OK;
}

/* The copy-engine mode's channels (maco_fused_comm_t), and the bound on communication tasks
 * (the graph's, once the operator is added: see maco__fused_build). */
static maco_status_t maco__fused_check_ports(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                             maco_fused_op_t kind, const char *fn, int rank,
                                             int nranks, size_t need, maco__fused_t *f)
{
    const uint64_t out_bytes = (uint64_t)op->m * op->n * f->esz;
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        maco_status_t st;
        if (kind == MACO_FUSED_ALLGATHER_GEMM)
            st = maco__fused_port_check(g, fn, "port_channels", op->port_channels, q, op->a,
                                        (uint64_t)op->m * op->k * 2, "a", need);
        else
            st = maco__fused_port_check(g, fn, "port_channels", op->port_channels, q, op->scratch,
                                        need, "scratch", need);
        if (st == MACO_OK && kind == MACO_FUSED_GEMM_ALLREDUCE)
            st = maco__fused_port_check(g, fn, "out_port_channels", op->out_port_channels, q,
                                        op->out, out_bytes, "out", out_bytes);
        if (st != MACO_OK)
            return st;
    }
    return MACO_OK;
}

/* Checks the operator and fills f. */
maco_status_t maco__fused_check(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                maco_fused_op_t kind, const char *fn, int rank, int nranks,
                                int units, maco__fused_t *f)
{
    if (g == NULL || op == NULL || op->a == NULL || op->b == NULL || op->out == NULL ||
        op->scratch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: NULL argument (graph, op or one of its pointers)", fn);
    if (op->comm_mode != MACO_FUSED_COMM_SM && op->comm_mode != MACO_FUSED_COMM_COPY_ENGINE &&
        op->comm_mode != MACO_FUSED_COMM_AUTO)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: comm_mode %d is no maco_fused_comm_t (MACO_FUSED_COMM_SM 0, "
                           "_COPY_ENGINE 1, _AUTO 2)",
                           fn, op->comm_mode);
    memset(f, 0, sizeof(*f));
    f->g = g;
    f->op = op;
    f->kind = kind;
    f->fn = fn;
    f->rank = rank;
    f->nranks = nranks;
    f->units = units < 1 ? 1 : units;
    f->ready_sig = -1;
    if (nranks < 1 || nranks > MACO__FUSED_MAX_RANKS)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PERSIST,
                           "%s: %d ranks; fused operators take 1 to %d", fn, nranks,
                           MACO__FUSED_MAX_RANKS);
    if (op->out_type != MACO_FLOAT32 && op->out_type != MACO_BFLOAT16)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: out_type %d: MACO_FLOAT32 or MACO_BFLOAT16", fn, (int)op->out_type);
    f->esz = maco__fused_esz(op->out_type);
    if (op->m == 0 || op->n == 0 || op->k == 0 || op->n % MACO_GEMM_TILE_N != 0 ||
        op->k % MACO_GEMM_TILE_K != 0 || op->m > (1u << 24))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: m x n x k = %u x %u x %u: m from 1 to 2^24, n a non-zero "
                           "multiple of %d, k of %d",
                           fn, op->m, op->n, op->k, MACO_GEMM_TILE_N, MACO_GEMM_TILE_K);
    if (kind == MACO_FUSED_GEMM_REDUCE_SCATTER && op->m % (uint32_t)nranks != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: m = %u rows are not a multiple of the %d ranks (each gets m / "
                           "nranks rows of the sum)",
                           fn, op->m, nranks);
    uint64_t rows_all =
        kind == MACO_FUSED_ALLGATHER_GEMM ? (uint64_t)op->m * (uint64_t)nranks : (uint64_t)op->m;
    if (maco__fused_tile_rows(rows_all) * (op->n / MACO_GEMM_TILE_N) > MACO__FUSED_MAX_TILES)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: m x n = %llu x %u makes more than %d tiles of 128 x 128; split "
                           "the GEMM",
                           fn, (unsigned long long)rows_all, op->n, MACO__FUSED_MAX_TILES);
    maco_fused_comm_t mode = (maco_fused_comm_t)op->comm_mode;
    if (mode == MACO_FUSED_COMM_AUTO)
        (void)maco_fused_gemm_choose_comm(kind, nranks, op->m, op->n, op->k, op->out_type, &mode);
    f->mode = mode;
    size_t need = 0;
    maco_status_t st = maco_fused_gemm_scratch_bytes_mode(kind, mode, nranks, op->m, op->n, op->k,
                                                          op->out_type, &need);
    if (st != MACO_OK)
        return st;
    f->ctr_bytes = maco__fused_round256(maco__fused_nctr(kind, nranks, op->m, op->n) * 8);
    snprintf(f->name, sizeof(f->name), "%s%s", op->name ? op->name : "",
             op->name && op->name[0] ? " " : "");
    if (mode == MACO_FUSED_COMM_COPY_ENGINE) {
        /* Its gated tasks need every communication task of the graph to fit a queue: the
         * graph's so far and the most this operator adds (narrow tiles). */
        uint64_t have = 0;
        for (int i = 0; i < g->ntasks; i++)
            have += maco__task_is_comm(&g->tasks[i]) ? 1u : 0u;
        const uint64_t add =
            maco__fused_ce_comm_tasks(kind, nranks, op->m, op->n, MACO_GEMM_TILE_N);
        if (have + add > MACO__FUSED_CE_MAX_COMM_TASKS)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: the copy-engine mode would make up to %llu communication "
                               "tasks (the graph has %llu already); a graph with it holds at "
                               "most %d: use the SM mode or split the GEMM",
                               fn, (unsigned long long)add, (unsigned long long)have,
                               MACO__FUSED_CE_MAX_COMM_TASKS);
        return maco__fused_check_ports(g, op, kind, fn, rank, nranks, need, f);
    }
    if (op->channels == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: channels is NULL: the SM mode (comm_mode %d) moves tiles over "
                           "memory channels",
                           fn, op->comm_mode);
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        int ch = op->channels[q];
        if (ch < 0 || ch >= g->nchannels)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: channels[%d] = %d is not a channel of the graph (it has %d)",
                               fn, q, ch, g->nchannels);
        const maco_memory_channel_device_t *c = &g->channels[ch];
        if (c->local != (char *)op->scratch || c->local_bytes < need || c->remote_bytes < need)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: channels[%d] (graph channel %d) must link this rank's "
                               "scratch %p with rank %d's, each of at least %zu bytes "
                               "(maco_fused_gemm_scratch_bytes); it links %p (%llu bytes) with "
                               "%llu bytes",
                               fn, q, ch, op->scratch, q, need, (void *)c->local,
                               (unsigned long long)c->local_bytes,
                               (unsigned long long)c->remote_bytes);
        if (kind != MACO_FUSED_GEMM_ALLREDUCE)
            continue;
        if (op->out_channels == NULL)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: out_channels is NULL: each rank's sums go straight into its "
                               "peers' out, so out must be registered and linked to every "
                               "peer's",
                               fn);
        int oc = op->out_channels[q];
        uint64_t out_bytes = (uint64_t)op->m * op->n * f->esz;
        const maco_memory_channel_device_t *o =
            oc >= 0 && oc < g->nchannels ? &g->channels[oc] : NULL;
        if (o == NULL || o->local != (char *)op->out || o->local_bytes < out_bytes ||
            o->remote_bytes < out_bytes)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: out_channels[%d] = %d must be a channel of the graph (it has "
                               "%d) linking this rank's out %p with rank %d's, each registered "
                               "from its start with at least m x n elements (%llu bytes)",
                               fn, q, oc, g->nchannels, op->out, q, (unsigned long long)out_bytes);
    }
    return MACO_OK;
}
