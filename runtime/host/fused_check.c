/*
 * fused_check.c - the fused operators' arguments (maco/persistent.h) checked before a graph is
 * built, and the scratch they need (maco_fused_gemm_scratch_bytes). Needs no GPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "src/host/base/log.h"
#include "runtime/host/fused_internal.h"

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

/* Checks the operator and fills f. */
maco_status_t maco__fused_check(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                maco_fused_op_t kind, const char *fn, int rank, int nranks,
                                int units, maco__fused_t *f)
{
    if (g == NULL || op == NULL || op->channels == NULL || op->a == NULL || op->b == NULL ||
        op->out == NULL || op->scratch == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: NULL argument (graph, op or one of its pointers)", fn);
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
    size_t need = 0;
    maco_status_t st =
        maco_fused_gemm_scratch_bytes(kind, nranks, op->m, op->n, op->k, op->out_type, &need);
    if (st != MACO_OK)
        return st;
    f->ctr_bytes = maco__fused_round256(maco__fused_nctr(kind, nranks, op->m, op->n) * 8);
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
    snprintf(f->name, sizeof(f->name), "%s%s", op->name ? op->name : "",
             op->name && op->name[0] ? " " : "");
    return MACO_OK;
}
