/*
 * ep_layout.c - the arithmetic of expert-parallel dispatch and combine (ep_layout.h has the
 * layouts). Plain C with no CUDA: the library sizes its buffers with it and the tests use it
 * as the reference of the kernels' routing.
 */
#include "algorithms/ep/ep_layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The control words peers write must not overlap and must fit before the count rows. */
_Static_assert(MACO__EP_CTRL_DATA_DONE + 8 * MACO_EP_MAX_RANKS <= MACO__EP_CTRL_READY,
               "DATA_DONE [src] overlaps READY");
_Static_assert(MACO__EP_CTRL_READY + 8 * MACO_EP_MAX_RANKS <= MACO__EP_CTRL_CNT_FLAG,
               "READY [src] overlaps CNT_FLAG");
_Static_assert(MACO__EP_CTRL_CNT_FLAG + 2 * 8 * MACO_EP_MAX_RANKS <= MACO__EP_CTRL_READY_INFO,
               "CNT_FLAG [2][src] overlaps READY_INFO");
_Static_assert(MACO__EP_CTRL_READY_INFO + 8 * MACO_EP_MAX_RANKS <= MACO__EP_CTRL_GROUP,
               "READY_INFO [src] overlaps GROUP");
_Static_assert(MACO__EP_CTRL_GROUP + 8 * MACO__EP_MAX_GROUPS * MACO_EP_MAX_RANKS <=
                   MACO__EP_CTRL_BYTES,
               "GROUP [group][src] does not fit the control words");
_Static_assert(MACO__EP_CTRL_DISP_WORK + 4 <= MACO__EP_CTRL_DATA_DONE,
               "DISP_WORK overlaps DATA_DONE");

static uint64_t maco__ep_round(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* Writes the sentence to why (when why_bytes > 0) and returns st. */
static maco_status_t maco__ep_plan_refuse(char *why, size_t why_bytes, maco_status_t st,
                                          const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static maco_status_t maco__ep_plan_refuse(char *why, size_t why_bytes, maco_status_t st,
                                          const char *fmt, ...)
{
    if (why_bytes > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_bytes, fmt, ap);
        va_end(ap);
    }
    return st;
}

maco_status_t maco__ep_plan(const maco_ep_config_t *cfg, int nranks, maco__ep_geom_t *g,
                            maco__ep_offsets_t *o, char *why, size_t why_bytes)
{
    if (cfg == NULL)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT, "config is NULL");
    if (nranks < 1 || nranks > MACO_EP_MAX_RANKS)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_UNSUPPORTED,
                                    "%d ranks: EP buffers take 1 to %d ranks (one node)", nranks,
                                    MACO_EP_MAX_RANKS);
    if ((unsigned)cfg->mode >= MACO_EP_MODE_COUNT)
        return maco__ep_plan_refuse(
            why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
            "config.mode %d is neither MACO_EP_LOW_LATENCY (0) nor MACO_EP_NORMAL (1)",
            (int)cfg->mode);
    if ((unsigned)cfg->dtype >= MACO_DATATYPE_COUNT)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "config.dtype %d is outside [0, %d)", (int)cfg->dtype,
                                    MACO_DATATYPE_COUNT);
    if (cfg->dtype != MACO_BFLOAT16)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_UNSUPPORTED,
                                    "config.dtype %s: this version moves bfloat16 rows only%s",
                                    maco_datatype_name(cfg->dtype),
                                    cfg->dtype == MACO_FP8_E4M3
                                        ? " (for fp8 rows keep bfloat16 here and dispatch "
                                          "with maco_ep_dispatch_fp8)"
                                        : "");
    if (cfg->max_tokens_per_rank < 1 || cfg->max_tokens_per_rank > MACO_EP_MAX_TOKENS)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "config.max_tokens_per_rank %d is outside [1, %d]",
                                    cfg->max_tokens_per_rank, MACO_EP_MAX_TOKENS);
    if (cfg->hidden < MACO_EP_HIDDEN_ALIGN || cfg->hidden > MACO_EP_MAX_HIDDEN ||
        cfg->hidden % MACO_EP_HIDDEN_ALIGN != 0)
        return maco__ep_plan_refuse(
            why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
            "config.hidden %d is not a multiple of %d in [%d, %d] (rows are whole "
            "16-byte words)",
            cfg->hidden, MACO_EP_HIDDEN_ALIGN, MACO_EP_HIDDEN_ALIGN, MACO_EP_MAX_HIDDEN);
    if (cfg->num_experts < 1 || cfg->num_experts > MACO_EP_MAX_EXPERTS ||
        cfg->num_experts % nranks != 0)
        return maco__ep_plan_refuse(
            why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
            "config.num_experts %d is not a multiple of the %d ranks in [1, %d]", cfg->num_experts,
            nranks, MACO_EP_MAX_EXPERTS);
    int kmax = cfg->num_experts < MACO_EP_MAX_TOPK ? cfg->num_experts : MACO_EP_MAX_TOPK;
    if (cfg->topk < 1 || cfg->topk > kmax)
        return maco__ep_plan_refuse(
            why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
            "config.topk %d is outside [1, %d] (at most %d and num_experts)", cfg->topk, kmax,
            MACO_EP_MAX_TOPK);
    if (cfg->num_ctas < 0 || cfg->num_ctas > 1024)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "config.num_ctas %d is outside [0, 1024]", cfg->num_ctas);
    const int64_t n = nranks, T = cfg->max_tokens_per_rank, K = cfg->topk;
    const int64_t L = cfg->num_experts / nranks;
    const int64_t worst = n * T * (K < L ? K : L);
    int64_t recv_rows, cap = 0;
    if (cfg->mode == MACO_EP_LOW_LATENCY) {
        if (cfg->max_recv_tokens != 0)
            return maco__ep_plan_refuse(
                why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                "config.max_recv_tokens %lld: must be 0 in low latency mode (each "
                "local expert holds %lld rows)",
                (long long)cfg->max_recv_tokens, (long long)(n * T));
        cap = n * T;
        recv_rows = L * cap;
    } else {
        if (cfg->max_recv_tokens < 0 || cfg->max_recv_tokens > worst)
            return maco__ep_plan_refuse(
                why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                "config.max_recv_tokens %lld is outside [0, %lld] (0: the worst "
                "case, ranks x max_tokens_per_rank x min(topk, local experts))",
                (long long)cfg->max_recv_tokens, (long long)worst);
        recv_rows = cfg->max_recv_tokens == 0 ? worst : cfg->max_recv_tokens;
    }
    if (g != NULL) {
        memset(g, 0, sizeof(*g));
        g->mode = (int32_t)cfg->mode;
        g->nranks = nranks;
        g->num_experts = cfg->num_experts;
        g->local_experts = (int32_t)L;
        g->topk = cfg->topk;
        g->hidden = cfg->hidden;
        g->max_tokens = cfg->max_tokens_per_rank;
        g->num_ctas = cfg->num_ctas;
        g->recv_rows = recv_rows;
        g->expert_cap = cap;
        g->row_bytes = (uint64_t)cfg->hidden * 2u;
    }
    if (o != NULL) {
        const uint64_t row = (uint64_t)cfg->hidden * 2u, E = (uint64_t)cfg->num_experts;
        memset(o, 0, sizeof(*o));
        o->cnt_off = MACO__EP_CTRL_BYTES;
        o->cnt_row_bytes = maco__ep_round((MACO__EP_ROW_HEADER + E) * 4u, 16);
        o->chunk_off = maco__ep_round(o->cnt_off + 2u * (uint64_t)n * o->cnt_row_bytes, 256);
        o->meta_off = maco__ep_round(o->chunk_off + (uint64_t)((T + 31) / 32) * E * 4u, 256);
        o->recv_off = maco__ep_round(o->meta_off + (uint64_t)recv_rows * 16u, 4096);
        o->comb_off = maco__ep_round(o->recv_off + (uint64_t)recv_rows * row, 4096);
        o->total_bytes = maco__ep_round(o->comb_off + (uint64_t)(T * K) * row, 4096);
        o->h_exp_off = sizeof(maco__ep_handle_header_t);
        o->h_slot_off = maco__ep_round(o->h_exp_off + 2u * (uint64_t)L * 4u, 16);
        o->h_meta_off = maco__ep_round(o->h_slot_off + (uint64_t)(T * K) * 4u, 16);
        o->handle_bytes = maco__ep_round(o->h_meta_off + (uint64_t)recv_rows * 8u, 256);
    }
    return MACO_OK;
}

/* The first invalid entry of row t before column k ends (MACO__EP_OK when entry k is fine). */
static int maco__ep_check_entry(const int64_t *row, int k, int num_experts, int *first_k)
{
    int64_t v = row[k];
    if (v < -1 || v >= num_experts)
        return MACO__EP_BAD_EXPERT;
    if (v < 0)
        return MACO__EP_OK;
    for (int j = 0; j < k; j++)
        if (row[j] == v) {
            *first_k = j;
            return MACO__EP_REPEAT;
        }
    return MACO__EP_OK;
}

int maco__ep_route(const int64_t *topk_idx, int num_tokens, int topk, int num_experts,
                   int32_t *slot, int32_t *count, maco__ep_bad_t *bad)
{
    int found = 0;
    for (int e = 0; e < num_experts; e++)
        count[e] = 0;
    /* Token order: an expert's entries take its slots in the order of their tokens (a row
     * names an expert at most once, so the column order within a row does not matter). */
    for (int t = 0; t < num_tokens; t++) {
        const int64_t *row = topk_idx + (size_t)t * (size_t)topk;
        for (int k = 0; k < topk; k++) {
            size_t i = (size_t)t * (size_t)topk + (size_t)k;
            int first_k = -1;
            int code = maco__ep_check_entry(row, k, num_experts, &first_k);
            if (code != MACO__EP_OK) {
                slot[i] = -1;
                if (!found && bad != NULL) {
                    bad->code = code;
                    bad->rank = -1;
                    bad->token = t;
                    bad->k = k;
                    bad->value = row[k];
                    bad->limit = code == MACO__EP_BAD_EXPERT ? num_experts : first_k;
                }
                found = 1;
                continue;
            }
            if (row[k] < 0) {
                slot[i] = -1;
                continue;
            }
            slot[i] = count[row[k]]++;
        }
    }
    return found;
}

void maco__ep_recv_layout(const maco__ep_geom_t *g, const int32_t *counts, int dst, int64_t *base,
                          int64_t *total, int64_t *num_recv_p)
{
    const int L = g->local_experts, E = g->num_experts;
    int64_t next = 0, all = 0;
    for (int l = 0; l < L; l++) {
        int e = dst * L + l;
        int64_t sum = 0;
        for (int r = 0; r < g->nranks; r++)
            sum += counts[(size_t)r * (size_t)E + (size_t)e];
        total[l] = sum;
        if (g->mode == MACO_EP_LOW_LATENCY) {
            base[l] = (int64_t)l * g->expert_cap;
        } else {
            base[l] = next;
            next += sum;
        }
        all += sum;
    }
    *num_recv_p = all;
}

int64_t maco__ep_recv_row(const maco__ep_geom_t *g, const int32_t *counts, int src, int expert,
                          int32_t slot)
{
    const int L = g->local_experts, E = g->num_experts;
    const int dst = expert / L, l = expert % L;
    int64_t base = 0;
    if (g->mode == MACO_EP_LOW_LATENCY) {
        base = (int64_t)l * g->expert_cap;
    } else {
        for (int j = 0; j < l; j++)
            for (int r = 0; r < g->nranks; r++)
                base += counts[(size_t)r * (size_t)E + (size_t)(dst * L + j)];
    }
    for (int r = 0; r < src; r++)
        base += counts[(size_t)r * (size_t)E + (size_t)expert];
    return base + slot;
}

int maco__ep_overflow(const maco__ep_geom_t *g, const int32_t *counts, maco__ep_bad_t *bad)
{
    if (g->mode == MACO_EP_LOW_LATENCY)
        return 0;
    const int L = g->local_experts, E = g->num_experts;
    for (int dst = 0; dst < g->nranks; dst++) {
        int64_t rows = 0;
        for (int l = 0; l < L; l++)
            for (int r = 0; r < g->nranks; r++)
                rows += counts[(size_t)r * (size_t)E + (size_t)(dst * L + l)];
        if (rows > g->recv_rows) {
            if (bad != NULL) {
                memset(bad, 0, sizeof(*bad));
                bad->code = MACO__EP_OVERFLOW;
                bad->rank = dst;
                bad->token = -1;
                bad->k = -1;
                bad->value = rows;
                bad->limit = g->recv_rows;
            }
            return 1;
        }
    }
    return 0;
}

void maco__ep_bad_text(const maco__ep_bad_t *bad, const char *fn, char *out, size_t out_bytes)
{
    switch (bad->code) {
    case MACO__EP_BAD_EXPERT:
        snprintf(out, out_bytes,
                 "%s: rank %d: topk_idx[%d][%d] = %lld is outside [-1, %lld) (num_experts); the "
                 "dispatch stopped on every rank before moving a row",
                 fn, bad->rank, bad->token, bad->k, (long long)bad->value, (long long)bad->limit);
        break;
    case MACO__EP_REPEAT:
        snprintf(out, out_bytes,
                 "%s: rank %d: topk_idx[%d][%d] = %lld repeats topk_idx[%d][%lld] (a token names "
                 "each expert at most once); the dispatch stopped on every rank before moving a "
                 "row",
                 fn, bad->rank, bad->token, bad->k, (long long)bad->value, bad->token,
                 (long long)bad->limit);
        break;
    case MACO__EP_OVERFLOW:
        snprintf(out, out_bytes,
                 "%s: rank %d would receive %lld rows, more than the receive region's %lld "
                 "(config.max_recv_tokens); the dispatch stopped on every rank before moving a "
                 "row",
                 fn, bad->rank, (long long)bad->value, (long long)bad->limit);
        break;
    case MACO__EP_FOREIGN:
        snprintf(out, out_bytes,
                 "%s: rank %d: the handle was not written by a dispatch on this buffer; the "
                 "combine stopped on every rank before moving a row",
                 fn, bad->rank);
        break;
    case MACO__EP_FAILED:
        snprintf(out, out_bytes,
                 "%s: rank %d: the handle is of a dispatch that failed (code %lld); the combine "
                 "stopped on every rank before moving a row",
                 fn, bad->rank, (long long)bad->value);
        break;
    case MACO__EP_TOKENS:
        snprintf(out, out_bytes,
                 "%s: rank %d: num_tokens %lld differs from the handle's dispatch (%lld tokens); "
                 "the combine stopped on every rank before moving a row",
                 fn, bad->rank, (long long)bad->value, (long long)bad->limit);
        break;
    default:
        snprintf(out, out_bytes, "%s: rank %d: unknown problem code %d", fn, bad->rank,
                 (int)bad->code);
        break;
    }
}

/* dtype, hidden, topk and num_tokens against the buffer's shape. */
static maco_status_t maco__ep_check_shape(const maco__ep_geom_t *g, const char *fn,
                                          const char *dname, maco_datatype_t dtype, int num_tokens,
                                          int hidden, int topk, char *why, size_t why_bytes)
{
    if (dtype != MACO_BFLOAT16)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "%s: %s is %s; the buffer moves bfloat16 rows", fn, dname,
                                    (unsigned)dtype < MACO_DATATYPE_COUNT
                                        ? maco_datatype_name(dtype)
                                        : "not a MACO datatype");
    if (hidden != g->hidden)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "%s: hidden %d differs from the buffer's %d", fn, hidden,
                                    g->hidden);
    if (topk != g->topk)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "%s: topk %d differs from the buffer's %d", fn, topk, g->topk);
    if (num_tokens < 0 || num_tokens > g->max_tokens)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "%s: num_tokens %d is outside [0, %d] (the buffer's "
                                    "max_tokens_per_rank)",
                                    fn, num_tokens, g->max_tokens);
    return MACO_OK;
}

/* A pointer's alignment (NULL passes: the NULL checks come first). */
static int maco__ep_misaligned(const void *p, size_t align)
{
    return ((uintptr_t)p % align) != 0;
}

#define MACO__EP_ALIGNED(fn, name, p, align)                                                       \
    do {                                                                                           \
        if (maco__ep_misaligned((p), (align)))                                                     \
            return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,                 \
                                        "%s: %s %p is not %d-byte aligned", fn, name,              \
                                        (const void *)(p), (int)(align));                          \
    } while (0)

maco_status_t maco__ep_check_dispatch(const maco__ep_geom_t *g, int fp8, const void *x,
                                      maco_datatype_t x_dtype, int num_tokens, int hidden,
                                      const int64_t *topk_idx, const float *topk_weights, int topk,
                                      const int32_t *recv_counts, const int32_t *recv_offsets,
                                      const float *recv_topk_weights, const void *handle,
                                      int want_num_recv, char *why, size_t why_bytes)
{
    const char *fn = fp8 ? "maco_ep_dispatch_fp8" : "maco_ep_dispatch";
    maco_status_t st =
        maco__ep_check_shape(g, fn, "x_dtype", x_dtype, num_tokens, hidden, topk, why, why_bytes);
    if (st != MACO_OK)
        return st;
    if (fp8 && hidden % MACO_EP_FP8_BLOCK != 0)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "%s: hidden %d is not a multiple of %d (one float32 scale "
                                    "per %d elements)",
                                    fn, hidden, MACO_EP_FP8_BLOCK, MACO_EP_FP8_BLOCK);
    const char *null_name = num_tokens > 0 && x == NULL          ? "x"
                            : num_tokens > 0 && topk_idx == NULL ? "topk_idx"
                            : recv_counts == NULL                ? "recv_counts"
                            : handle == NULL                     ? "handle"
                                                                 : NULL;
    if (null_name != NULL)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "%s: %s is NULL (num_tokens %d)", fn, null_name, num_tokens);
    MACO__EP_ALIGNED(fn, "x", x, 16);
    MACO__EP_ALIGNED(fn, "handle", handle, 16);
    MACO__EP_ALIGNED(fn, "topk_idx", topk_idx, 8);
    MACO__EP_ALIGNED(fn, "topk_weights", topk_weights, 4);
    MACO__EP_ALIGNED(fn, "recv_counts", recv_counts, 4);
    MACO__EP_ALIGNED(fn, "recv_offsets", recv_offsets, 4);
    MACO__EP_ALIGNED(fn, "recv_topk_weights", recv_topk_weights, 4);
    if (want_num_recv && g->mode == MACO_EP_LOW_LATENCY)
        return maco__ep_plan_refuse(
            why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
            "%s: num_recv_p must be NULL in low latency mode (recv_counts has "
            "the counts on the device; nothing waits on the host)",
            fn);
    return MACO_OK;
}

maco_status_t maco__ep_check_combine(const maco__ep_geom_t *g, const void *expert_out,
                                     maco_datatype_t dtype, int hidden, const void *handle,
                                     const float *topk_weights, int num_tokens, int topk,
                                     const void *y, char *why, size_t why_bytes)
{
    const char *fn = "maco_ep_combine";
    maco_status_t st =
        maco__ep_check_shape(g, fn, "dtype", dtype, num_tokens, hidden, topk, why, why_bytes);
    if (st != MACO_OK)
        return st;
    const char *null_name = expert_out == NULL                       ? "expert_out"
                            : handle == NULL                         ? "handle"
                            : num_tokens > 0 && topk_weights == NULL ? "topk_weights"
                            : num_tokens > 0 && y == NULL            ? "y"
                                                                     : NULL;
    if (null_name != NULL)
        return maco__ep_plan_refuse(why, why_bytes, MACO_ERR_INVALID_ARGUMENT,
                                    "%s: %s is NULL (num_tokens %d)", fn, null_name, num_tokens);
    MACO__EP_ALIGNED(fn, "expert_out", expert_out, 16);
    MACO__EP_ALIGNED(fn, "handle", handle, 16);
    MACO__EP_ALIGNED(fn, "y", y, 16);
    MACO__EP_ALIGNED(fn, "topk_weights", topk_weights, 4);
    return MACO_OK;
}
