/*
 * graph.c - building a task graph on the host, checking it (arguments, dependencies,
 * cycles: every error names the task) and lowering it to the descriptors the device runs
 * (maco/device/persistent.h). Needs no GPU: the CPU tests link it directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "runtime/host/runtime_internal.h"

static const char *const maco__task_type_names[MACO_TASK_TYPE_COUNT] = {
    "nop",         "copy",           "add",          "scale",     "residual_add", "signal", "wait",
    "channel_put", "channel_signal", "channel_wait", "gemm_tile", "sum",
};

/* The device's type values are the public ones. */
#define MACO__SAME(x, y) ((int)(x) == (int)(y))
_Static_assert(MACO__SAME(MACO_TASK_COPY, MACO_PK_COPY) && MACO__SAME(MACO_TASK_ADD, MACO_PK_ADD) &&
                   MACO__SAME(MACO_TASK_SCALE, MACO_PK_SCALE) &&
                   MACO__SAME(MACO_TASK_RESIDUAL_ADD, MACO_PK_RESIDUAL_ADD) &&
                   MACO__SAME(MACO_TASK_SIGNAL, MACO_PK_SIGNAL) &&
                   MACO__SAME(MACO_TASK_WAIT, MACO_PK_WAIT) &&
                   MACO__SAME(MACO_TASK_CHANNEL_PUT, MACO_PK_CHANNEL_PUT) &&
                   MACO__SAME(MACO_TASK_CHANNEL_SIGNAL, MACO_PK_CHANNEL_SIGNAL) &&
                   MACO__SAME(MACO_TASK_CHANNEL_WAIT, MACO_PK_CHANNEL_WAIT) &&
                   MACO__SAME(MACO_TASK_GEMM_TILE, MACO_PK_GEMM_TILE) &&
                   MACO__SAME(MACO_TASK_SUM, MACO_PK_SUM) &&
                   MACO__SAME(MACO_TASK_TYPE_COUNT, MACO_PK_TYPE_COUNT) &&
                   MACO__SAME(MACO_TASK_USER, MACO_PK_USER),
               "task types match the device's");
_Static_assert(MACO__SAME(MACO_FLOAT16, MACO__PK_F16) && MACO__SAME(MACO_BFLOAT16, MACO__PK_BF16) &&
                   MACO__SAME(MACO_FLOAT32, MACO__PK_F32),
               "element types match the device's");

enum { MACO__TASK_MAX = 0x7fffffff };

const char *maco__task_label(const maco_task_t *t)
{
    if (t->name != NULL && t->name[0] != '\0')
        return t->name;
    if ((unsigned)t->type < MACO_TASK_TYPE_COUNT)
        return maco__task_type_names[t->type];
    return "user";
}

maco_status_t maco_task_graph_create(maco_task_graph_t *graph_p)
{
    if (graph_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_create: graph_p is NULL");
    maco_task_graph_t g = calloc(1, sizeof(*g));
    if (g == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_create: out of host memory");
    *graph_p = g;
    return MACO_OK;
}

maco_status_t maco_task_graph_destroy(maco_task_graph_t g)
{
    if (g == NULL)
        return MACO_OK;
    for (int i = 0; i < g->ntasks; i++)
        free((char *)g->tasks[i].name);
    free(g->tasks);
    free(g->edges);
    free(g->channels);
    free(g);
    return MACO_OK;
}

/* Grows *arr (of *cap elements of `size` bytes) to hold n + 1. */
static int maco__grow(void **arr, int *cap, int n, size_t size)
{
    if (n < *cap)
        return 0;
    int ncap = *cap == 0 ? 64 : *cap * 2;
    if (ncap < *cap) /* overflow */
        return -1;
    void *p = realloc(*arr, (size_t)ncap * size);
    if (p == NULL)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

maco_status_t maco_task_graph_add_task(maco_task_graph_t g, const maco_task_t *task, int *task_id_p)
{
    if (g == NULL || task == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_task: %s is NULL", g == NULL ? "graph" : "task");
    if (g->ntasks == MACO__TASK_MAX)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_task: the graph already has %d tasks, the most "
                           "it can hold",
                           g->ntasks);
    if (maco__grow((void **)&g->tasks, &g->task_cap, g->ntasks, sizeof(maco_task_t)) != 0)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_task: out of host memory at task %d", g->ntasks);
    maco_task_t t = *task;
    if (task->name != NULL) {
        t.name = strdup(task->name);
        if (t.name == NULL)
            return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                               "maco_task_graph_add_task: out of host memory (name)");
    }
    g->tasks[g->ntasks] = t;
    if (task_id_p != NULL)
        *task_id_p = g->ntasks;
    g->ntasks++;
    return MACO_OK;
}

maco_status_t maco_task_graph_add_dependency(maco_task_graph_t g, int task, int depends_on)
{
    if (g == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_dependency: graph is NULL");
    if (maco__grow((void **)&g->edges, &g->edge_cap, g->nedges, sizeof(maco__task_edge_t)) != 0)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_dependency: out of host memory");
    g->edges[g->nedges].task = task;
    g->edges[g->nedges].depends_on = depends_on;
    g->nedges++;
    return MACO_OK;
}

maco_status_t maco_task_graph_add_channel(maco_task_graph_t g,
                                          const maco_memory_channel_device_t *handle, int *index_p)
{
    if (g == NULL || handle == NULL || index_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_channel: NULL argument");
    if (maco__grow((void **)&g->channels, &g->channel_cap, g->nchannels,
                   sizeof(maco_memory_channel_device_t)) != 0)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_channel: out of host memory");
    g->channels[g->nchannels] = *handle;
    *index_p = g->nchannels++;
    return MACO_OK;
}

maco_status_t maco_task_graph_get_ntasks(maco_task_graph_t g, int *ntasks_p)
{
    if (g == NULL || ntasks_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_get_ntasks: NULL argument");
    *ntasks_p = g->ntasks;
    return MACO_OK;
}

/* ---------------------------------------------------------------- checks */

/* Why the 2D block of task `t` (rows of `row` units, strides ld_in and ld_out in the same
 * units) is out of range, in `why`; 0 when it is fine or one row. */
static int maco__rows_check(const maco_task_t *t, uint64_t row, const char *unit, char *why,
                            size_t n)
{
    if (t->rows > 1 && (t->rows > 0xffff || t->ld_in < row || t->ld_out < row ||
                        t->ld_in >= (1u << 24) || t->ld_out >= (1u << 24))) {
        snprintf(why, n,
                 "rows = %u, ld_in = %u, ld_out = %u for rows of %llu %s: rows at most 65535, "
                 "strides at least the row and below 2^24",
                 t->rows, t->ld_in, t->ld_out, (unsigned long long)row, unit);
        return -1;
    }
    return 0;
}

/* Why the gate and signal of task `t` are out of range, in `why`; 0 when they are fine. */
static int maco__sync_check(const maco_task_t *t, char *why, size_t n)
{
    if (t->wait_on != NULL && ((uintptr_t)t->wait_on % 8 != 0 || t->wait_count == 0)) {
        snprintf(why, n,
                 "gate: wait_on (%p) must be 8-byte aligned and wait_count (%llu) at least 1",
                 (const void *)t->wait_on, (unsigned long long)t->wait_count);
        return -1;
    }
    if (t->wait_on != NULL && t->wait_count > (UINT64_MAX >> 32)) {
        snprintf(why, n, "gate: wait_count %llu is above 2^32 - 1 (it is multiplied by launches)",
                 (unsigned long long)t->wait_count);
        return -1;
    }
    if (t->signal_to != NULL && (uintptr_t)t->signal_to % 8 != 0) {
        snprintf(why, n, "signal_to (%p) must be 8-byte aligned", (void *)t->signal_to);
        return -1;
    }
    return 0;
}

/* The bytes a SUM or COPY task writes, from out: [0, *span_p). */
static uint64_t maco__out_span(const maco_task_t *t)
{
    uint64_t rows = t->rows > 1 ? t->rows : 1;
    if (t->type == MACO_TASK_COPY)
        return (rows - 1) * (t->rows > 1 ? t->ld_out : 0) + t->count;
    uint64_t esz = t->datatype == MACO_FLOAT32 ? 4 : 2;
    return ((rows - 1) * (t->rows > 1 ? t->ld_out : t->count) + t->count) * esz;
}

/* Why the mirrors of task `t` are out of range, in `why`; 0 when they are fine. */
static int maco__mirror_check(const maco_task_graph_t g, const maco_task_t *t, char *why, size_t n)
{
    if (t->out_mirror_count > 0) {
        if (t->type != MACO_TASK_SUM && t->type != MACO_TASK_COPY) {
            snprintf(why, n, "out mirrors on a task that is not a SUM or COPY");
            return -1;
        }
        if (t->out_mirror_count > MACO__PK_MIRRORS ||
            (uint64_t)t->out_mirror_channel + t->out_mirror_count > (uint64_t)g->nchannels) {
            snprintf(why, n, "out mirrors: channels %u .. %u: at most %d, all among the graph's %d",
                     t->out_mirror_channel, t->out_mirror_channel + t->out_mirror_count - 1,
                     MACO__PK_MIRRORS, g->nchannels);
            return -1;
        }
        uint64_t span = maco__out_span(t);
        for (uint32_t j = 0; j < t->out_mirror_count; j++) {
            const maco_memory_channel_device_t *c = &g->channels[t->out_mirror_channel + j];
            uintptr_t o = (uintptr_t)t->out, lo = (uintptr_t)c->local;
            if (o < lo || o - lo > c->local_bytes || span > c->local_bytes - (o - lo) ||
                span > c->remote_bytes || o - lo > c->remote_bytes - span) {
                snprintf(why, n,
                         "out mirror through channel %u: the %llu bytes written at %p must lie "
                         "inside its local buffer %p (%llu bytes) and its remote one (%llu)",
                         t->out_mirror_channel + j, (unsigned long long)span, t->out,
                         (void *)c->local, (unsigned long long)c->local_bytes,
                         (unsigned long long)c->remote_bytes);
                return -1;
            }
        }
    }
    if (t->signal_mirror_count > 0) {
        if (t->signal_to == NULL || t->signal_mirror_count > 0xffff ||
            (uint64_t)t->signal_mirror_channel + t->signal_mirror_count > (uint64_t)g->nchannels) {
            snprintf(why, n,
                     "signal mirrors: channels %u .. %u of the graph's %d, with signal_to set",
                     t->signal_mirror_channel,
                     t->signal_mirror_channel + t->signal_mirror_count - 1, g->nchannels);
            return -1;
        }
        for (uint32_t j = 0; j < t->signal_mirror_count; j++) {
            const maco_memory_channel_device_t *c = &g->channels[t->signal_mirror_channel + j];
            uintptr_t o = (uintptr_t)t->signal_to, lo = (uintptr_t)c->local;
            if (o < lo || o - lo + 8 > c->local_bytes || o - lo + 8 > c->remote_bytes) {
                snprintf(why, n,
                         "signal mirror through channel %u: signal_to %p must lie inside its "
                         "local buffer %p (%llu bytes) and its remote one (%llu)",
                         t->signal_mirror_channel + j, (void *)t->signal_to, (void *)c->local,
                         (unsigned long long)c->local_bytes, (unsigned long long)c->remote_bytes);
                return -1;
            }
        }
    }
    if (t->out_mirror_channel > 0xffff || t->signal_mirror_channel > 0xffff) {
        snprintf(why, n, "mirror channels above 65535");
        return -1;
    }
    return 0;
}

/* Why task `t` is out of range, in `why`; 0 when it is fine. */
/* A COPY task: pointers, rows, and spans that neither overlap nor wrap. */
static int maco__copy_check(const maco_task_t *t, char *why, size_t n)
{
    if (t->count > 0 && (t->out == NULL || t->a == NULL)) {
        snprintf(why, n, "copy of %llu bytes with a NULL %s", (unsigned long long)t->count,
                 t->out == NULL ? "out" : "a");
        return -1;
    }
    if (t->rows > 1 && t->count >= (1u << 24)) {
        snprintf(why, n, "copy of %u rows of %llu bytes: rows below 2^24 bytes", t->rows,
                 (unsigned long long)t->count);
        return -1;
    }
    if (maco__rows_check(t, t->count, "bytes", why, n) != 0)
        return -1;
    /* The spans from the first byte to the last (a 2D block's rows between them
     * included): no overlap, and no wrap past the end of the address space. */
    uint64_t rows = t->rows > 1 ? t->rows : 1;
    uint64_t span_a = (rows - 1) * (t->rows > 1 ? t->ld_in : 0) + t->count;
    uint64_t span_o = (rows - 1) * (t->rows > 1 ? t->ld_out : 0) + t->count;
    uintptr_t o = (uintptr_t)t->out, a = (uintptr_t)t->a;
    if (t->count > 0 && (a > UINTPTR_MAX - span_a || o > UINTPTR_MAX - span_o)) {
        snprintf(why, n, "copy of %llu bytes from %p to %p runs past the end of memory",
                 (unsigned long long)t->count, t->a, t->out);
        return -1;
    }
    if (t->count > 0 && o < a + span_a && a < o + span_o) {
        snprintf(why, n, "copy of %llu bytes between overlapping ranges (out %p, a %p)",
                 (unsigned long long)t->count, t->out, t->a);
        return -1;
    }
    return 0;
}

/* SUM, ADD, SCALE and RESIDUAL_ADD: datatype, counts, inputs and alignment. */
static int maco__elementwise_check(const maco_task_t *t, char *why, size_t n)
{
    size_t esz = t->datatype == MACO_FLOAT32                                     ? 4
                 : (t->datatype == MACO_FLOAT16 || t->datatype == MACO_BFLOAT16) ? 2
                                                                                 : 0;
    if (esz == 0) {
        snprintf(why, n,
                 "datatype %d: element-wise tasks take MACO_FLOAT32, MACO_FLOAT16 "
                 "or MACO_BFLOAT16",
                 (int)t->datatype);
        return -1;
    }
    if (t->count == 0 || t->count >= (1u << 24)) {
        snprintf(why, n, "count is %llu (elements per row, at least 1 and below 2^24)",
                 (unsigned long long)t->count);
        return -1;
    }
    if (maco__rows_check(t, t->count, "elements", why, n) != 0)
        return -1;
    if (t->type == MACO_TASK_SUM &&
        (t->ninputs < 1 || t->ninputs > 64 || t->input_stride % esz != 0)) {
        snprintf(why, n,
                 "sum of %u inputs %llu bytes apart: 1 to 64 inputs, a stride that is a "
                 "multiple of the %zu-byte element",
                 t->ninputs, (unsigned long long)t->input_stride, esz);
        return -1;
    }
    const void *ptrs[3] = { t->out, t->a, t->b };
    static const char *names[3] = { "out", "a", "b" };
    int nptr = t->type == MACO_TASK_SCALE || t->type == MACO_TASK_SUM ? 2 : 3;
    for (int i = 0; i < nptr; i++) {
        if (ptrs[i] == NULL) {
            snprintf(why, n, "%s is NULL", names[i]);
            return -1;
        }
        if ((uintptr_t)ptrs[i] % esz != 0) {
            snprintf(why, n, "%s (%p) is not aligned to its %zu-byte elements", names[i], ptrs[i],
                     esz);
            return -1;
        }
    }
    return 0;
}

/* SIGNAL and WAIT: the counter, and a WAIT's count per launch. */
static int maco__counter_check(const maco_task_t *t, char *why, size_t n)
{
    const void *p = t->type == MACO_TASK_SIGNAL ? t->out : t->a;
    const char *name = t->type == MACO_TASK_SIGNAL ? "out" : "a";
    if (p == NULL || (uintptr_t)p % 8 != 0) {
        snprintf(why, n, "the counter (%s = %p) must be a non-NULL, 8-byte aligned uint64_t", name,
                 p);
        return -1;
    }
    if (t->type == MACO_TASK_WAIT && (t->count == 0 || t->count > (UINT64_MAX >> 32))) {
        snprintf(why, n,
                 "count is %llu (the signals the counter gets per launch: 1 to 2^32 - 1, "
                 "as it is multiplied by launches)",
                 (unsigned long long)t->count);
        return -1;
    }
    return 0;
}

/* CHANNEL_PUT, _SIGNAL and _WAIT: the channel, and a put's ranges. */
static int maco__channel_task_check(const maco_task_graph_t g, const maco_task_t *t, char *why,
                                    size_t n)
{
    if (t->channel >= (uint32_t)g->nchannels) {
        snprintf(why, n, "channel %u does not exist (the graph has %d)", t->channel, g->nchannels);
        return -1;
    }
    if (t->type == MACO_TASK_CHANNEL_PUT) {
        const maco_memory_channel_device_t *c = &g->channels[t->channel];
        if (t->src_offset > c->local_bytes || t->count > c->local_bytes - t->src_offset ||
            t->dst_offset > c->remote_bytes || t->count > c->remote_bytes - t->dst_offset) {
            snprintf(why, n,
                     "put of %llu bytes from offset %llu to offset %llu leaves channel %u's "
                     "buffers (%llu bytes local, %llu remote)",
                     (unsigned long long)t->count, (unsigned long long)t->src_offset,
                     (unsigned long long)t->dst_offset, t->channel,
                     (unsigned long long)c->local_bytes, (unsigned long long)c->remote_bytes);
            return -1;
        }
    }
    return 0;
}

/* A GEMM tile: output type, width, shape, ldc, position and alignment. */
static int maco__gemm_check(const maco_task_t *t, char *why, size_t n)
{
    if (t->datatype != MACO_FLOAT32 && t->datatype != MACO_BFLOAT16) {
        snprintf(why, n, "datatype %d: a GEMM tile stores MACO_FLOAT32 or MACO_BFLOAT16",
                 (int)t->datatype);
        return -1;
    }
    uint32_t tn = maco__gemm_tile_n(t);
    if (tn != MACO_GEMM_TILE_N && tn != MACO_GEMM_TILE_N_WIDE) {
        snprintf(why, n, "tile_n = %u: 0, %d or %d", t->tile_n, MACO_GEMM_TILE_N,
                 MACO_GEMM_TILE_N_WIDE);
        return -1;
    }
    if (t->m == 0 || t->n == 0 || t->k == 0 || t->n % tn != 0 || t->k % MACO_GEMM_TILE_K != 0 ||
        t->m > INT32_MAX) {
        snprintf(why, n,
                 "m x n x k = %u x %u x %u: m from 1 to 2^31 - 1, n a non-zero multiple of "
                 "%u (tile_n), k of %d",
                 t->m, t->n, t->k, tn, MACO_GEMM_TILE_K);
        return -1;
    }
    if (t->ldc < tn || t->ldc % 8 != 0) {
        snprintf(why, n, "ldc = %u: at least %u (tile_n) and a multiple of 8", t->ldc, tn);
        return -1;
    }
    const uint32_t tile_rows =
        (uint32_t)(((uint64_t)t->m + MACO_GEMM_TILE_M - 1) / MACO_GEMM_TILE_M);
    if (t->tile_row >= tile_rows || t->tile_col >= t->n / tn) {
        snprintf(why, n, "tile (%u, %u) is outside the %u x %u tiles of C (tile_n %u)", t->tile_row,
                 t->tile_col, tile_rows, t->n / tn, tn);
        return -1;
    }
    if (t->out == NULL || t->a == NULL || t->b == NULL ||
        (((uintptr_t)t->out | (uintptr_t)t->a | (uintptr_t)t->b) & 15u) != 0) {
        snprintf(why, n, "C, A and B (%p, %p, %p) must be non-NULL and 16-byte aligned", t->out,
                 t->a, t->b);
        return -1;
    }
    return 0;
}

static int maco__task_check(const maco_task_graph_t g, const maco_task_t *t, char *why, size_t n)
{
    if (t->role < MACO_TASK_ROLE_AUTO || t->role > MACO_TASK_ROLE_COMM) {
        snprintf(why, n, "role %d is not a maco_task_role_t", (int)t->role);
        return -1;
    }
    if (maco__sync_check(t, why, n) != 0 || maco__mirror_check(g, t, why, n) != 0)
        return -1;
    if ((int)t->type >= MACO_TASK_USER) {
        if ((int)t->type > 0xffff) {
            snprintf(why, n, "user type %d is above 65535", (int)t->type);
            return -1;
        }
        return 0;
    }
    if ((int)t->type < 0 || (int)t->type >= MACO_TASK_TYPE_COUNT) {
        snprintf(why, n, "type %d is not a maco_task_type_t (user types start at %d)", (int)t->type,
                 MACO_TASK_USER);
        return -1;
    }
    switch (t->type) {
    case MACO_TASK_NOP:
        return 0;
    case MACO_TASK_COPY:
        return maco__copy_check(t, why, n);
    case MACO_TASK_SUM:
    case MACO_TASK_ADD:
    case MACO_TASK_SCALE:
    case MACO_TASK_RESIDUAL_ADD:
        return maco__elementwise_check(t, why, n);
    case MACO_TASK_SIGNAL:
    case MACO_TASK_WAIT:
        return maco__counter_check(t, why, n);
    case MACO_TASK_CHANNEL_PUT:
    case MACO_TASK_CHANNEL_SIGNAL:
    case MACO_TASK_CHANNEL_WAIT:
        return maco__channel_task_check(g, t, why, n);
    case MACO_TASK_GEMM_TILE:
        return maco__gemm_check(t, why, n);
    default:
        return 0;
    }
}

static int maco__edge_cmp(const void *x, const void *y)
{
    const maco__task_edge_t *a = x, *b = y;
    if (a->task != b->task)
        return a->task < b->task ? -1 : 1;
    return a->depends_on < b->depends_on ? -1 : a->depends_on > b->depends_on;
}

/* Describes one cycle among the tasks Kahn's algorithm could not order (indeg > 0) into
 * `out`: walking predecessors among them must come back to a task already seen. */
static void maco__describe_cycle(const maco_task_graph_t g, const maco__task_edge_t *e, int ne,
                                 const int *pred_begin, const uint32_t *indeg, char *out, size_t n)
{
    int nt = g->ntasks;
    int *seen = malloc((size_t)nt * sizeof(int));
    int *path = malloc((size_t)nt * sizeof(int));
    out[0] = '\0';
    if (seen == NULL || path == NULL) {
        snprintf(out, n, "(out of memory describing it)");
        free(seen);
        free(path);
        return;
    }
    for (int i = 0; i < nt; i++)
        seen[i] = -1;
    int x = 0;
    while (x < nt && indeg[x] == 0)
        x++;
    int len = 0;
    while (x < nt && seen[x] < 0) {
        seen[x] = len;
        path[len++] = x;
        int next = nt;
        for (int k = pred_begin[x]; k < pred_begin[x + 1]; k++)
            if (indeg[e[k].depends_on] != 0) {
                next = e[k].depends_on;
                break;
            }
        x = next;
    }
    (void)ne;
    size_t used = 0;
    if (x < nt) {
        for (int i = seen[x]; i < len && used < n; i++) {
            int t = path[i];
            used += (size_t)snprintf(out + used, n - used, "task %d (\"%s\") depends on ", t,
                                     maco__task_label(&g->tasks[t]));
        }
        if (used < n)
            snprintf(out + used, n - used, "task %d (\"%s\")", x, maco__task_label(&g->tasks[x]));
    }
    free(seen);
    free(path);
}

/* Every task's own check, and every dependency naming two existing, different tasks. */
static maco_status_t maco__graph_check(maco_task_graph_t g, const char *fn)
{
    int nt = g->ntasks;
    if (nt == 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: the graph has no task", fn);
    char why[512];
    for (int i = 0; i < nt; i++)
        if (maco__task_check(g, &g->tasks[i], why, sizeof(why)) != 0)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: task %d (\"%s\"): %s", fn, i, maco__task_label(&g->tasks[i]),
                               why);
    for (int k = 0; k < g->nedges; k++) {
        int t = g->edges[k].task, d = g->edges[k].depends_on;
        if (t < 0 || t >= nt)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: dependency %d names task %d, which does not exist (the graph "
                               "has %d tasks; it was to depend on task %d)",
                               fn, k, t, nt, d);
        if (d < 0 || d >= nt)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: task %d (\"%s\") depends on task %d, which does not exist "
                               "(the graph has %d tasks)",
                               fn, t, maco__task_label(&g->tasks[t]), d, nt);
        if (t == d)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                               "%s: task %d (\"%s\") depends on itself", fn, t,
                               maco__task_label(&g->tasks[t]));
    }
    return MACO_OK;
}

/* Task i's device descriptor (and its gate and signals, if any) from the user's task. */
static void maco__lower_task(maco_task_graph_t g, int i, const int *pred_begin,
                             const uint32_t *nsucc, maco__pk_lowered_t *out)
{
    const maco_task_t *t = &g->tasks[i];
    maco_pk_task_t *d = &out->tasks[i];
    d->type = (uint16_t)t->type;
    if (t->wait_on != NULL || t->signal_to != NULL || t->out_mirror_count > 0) {
        out->sync[i].wait = t->wait_on;
        out->sync[i].wait_count = t->wait_on != NULL ? t->wait_count : 0;
        out->sync[i].signal = t->signal_to;
        out->sync[i].peer = t->wait_on != NULL ? t->wait_peer : -1;
        out->sync[i].out_first = (uint16_t)t->out_mirror_channel;
        out->sync[i].out_count = (uint16_t)t->out_mirror_count;
        out->sync[i].sig_first = (uint16_t)t->signal_mirror_channel;
        out->sync[i].sig_count = (uint16_t)t->signal_mirror_count;
        out->nsync++;
    }
    int comm = t->role == MACO_TASK_ROLE_COMM ||
               (t->role == MACO_TASK_ROLE_AUTO &&
                (t->type == MACO_TASK_WAIT || t->type == MACO_TASK_CHANNEL_WAIT));
    d->role = comm ? MACO_PK_ROLE_COMM : MACO_PK_ROLE_COMPUTE;
    out->ncomm_tasks += comm ? 1u : 0u;
    d->dtype = (uint8_t)t->datatype;
    d->ndeps = (uint32_t)(pred_begin[i + 1] - pred_begin[i]);
    d->succ_count = nsucc[i];
    d->alpha = t->alpha;
    d->aux = t->channel;
    d->count = t->count;
    d->ptr[0] = (uint64_t)(uintptr_t)t->out;
    d->ptr[1] = (uint64_t)(uintptr_t)t->a;
    d->ptr[2] = (uint64_t)(uintptr_t)t->b;
    if (t->type == MACO_TASK_CHANNEL_PUT) {
        d->ptr[0] = t->dst_offset;
        d->ptr[1] = t->src_offset;
    } else if (t->rows > 1 && (t->type == MACO_TASK_ADD || t->type == MACO_TASK_SCALE ||
                               t->type == MACO_TASK_RESIDUAL_ADD || t->type == MACO_TASK_SUM ||
                               t->type == MACO_TASK_COPY)) {
        d->ptr[3] = (uint64_t)t->rows | (uint64_t)t->ld_in << 16 | (uint64_t)t->ld_out << 40;
    }
    if (t->type == MACO_TASK_SUM) {
        d->aux = t->ninputs;
        d->ptr[2] = t->input_stride;
    } else if (t->type == MACO_TASK_GEMM_TILE) {
        d->ptr[3] = (uint64_t)t->tile_row * MACO_GEMM_TILE_M |
                    (uint64_t)(t->tile_col * maco__gemm_tile_n(t)) << 32;
        d->gemm.map = 0; /* the GMMA kernel's maps: set by maco_persistent_kernel_create */
        d->gemm.tile_n = (uint16_t)maco__gemm_tile_n(t);
        d->count = (uint64_t)t->k | (uint64_t)t->n << 32;
        d->aux = t->ldc;
        out->ngemm_tasks++;
        out->npartial_gemm += t->m % MACO_GEMM_TILE_M != 0 ? 1u : 0u;
    } else if ((int)t->type >= MACO_TASK_USER) {
        d->ptr[3] = t->src_offset;
    }
}

maco_status_t maco__task_graph_lower(maco_task_graph_t g, const char *fn, maco__pk_lowered_t *out)
{
    if (g == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST, "%s: graph is NULL", fn);
    maco_status_t st = maco__graph_check(g, fn);
    if (st != MACO_OK)
        return st;
    int nt = g->ntasks;
    char why[512];
    /* Edges sorted by task (its predecessors together), duplicates dropped. */
    maco__task_edge_t *e = NULL;
    int ne = 0;
    int *pred_begin = calloc((size_t)nt + 1, sizeof(int));
    uint32_t *indeg = calloc((size_t)nt, sizeof(uint32_t));
    uint32_t *nsucc = calloc((size_t)nt + 1, sizeof(uint32_t));
    uint32_t *order = malloc((size_t)nt * sizeof(uint32_t));
    memset(out, 0, sizeof(*out));
    if (g->nedges > 0)
        e = malloc((size_t)g->nedges * sizeof(*e));
    out->tasks = calloc((size_t)nt, sizeof(maco_pk_task_t));
    out->succ = malloc(((size_t)g->nedges + 1) * sizeof(uint32_t));
    out->roots = malloc((size_t)nt * sizeof(uint32_t));
    out->sync = calloc((size_t)nt, sizeof(maco_pk_sync_t));
    if (pred_begin == NULL || indeg == NULL || nsucc == NULL || order == NULL ||
        (g->nedges > 0 && e == NULL) || out->tasks == NULL || out->succ == NULL ||
        out->roots == NULL || out->sync == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                         "%s: out of host memory for %d tasks", fn, nt);
        goto fail;
    }
    if (g->nedges > 0) {
        memcpy(e, g->edges, (size_t)g->nedges * sizeof(*e));
        qsort(e, (size_t)g->nedges, sizeof(*e), maco__edge_cmp);
    }
    for (int k = 0; k < g->nedges; k++)
        if (k == 0 || maco__edge_cmp(&e[k], &e[ne - 1]) != 0)
            e[ne++] = e[k];
    for (int k = 0; k < ne; k++) {
        pred_begin[e[k].task + 1]++;
        indeg[e[k].task]++;
        nsucc[e[k].depends_on]++;
    }
    for (int i = 0; i < nt; i++)
        pred_begin[i + 1] += pred_begin[i];
    /* Successor lists (CSR). */
    uint32_t off = 0;
    for (int i = 0; i < nt; i++) {
        out->tasks[i].succ_begin = off;
        off += nsucc[i];
        nsucc[i] = 0;
    }
    for (int k = 0; k < ne; k++) {
        int d = e[k].depends_on;
        out->succ[out->tasks[d].succ_begin + nsucc[d]++] = (uint32_t)e[k].task;
    }
    out->nsucc = (uint32_t)ne;
    /* Kahn's algorithm: every task reachable in dependency order, else a cycle. */
    uint32_t head = 0, tail = 0;
    for (int i = 0; i < nt; i++)
        if (indeg[i] == 0)
            order[tail++] = (uint32_t)i;
    out->nroots = tail;
    memcpy(out->roots, order, tail * sizeof(uint32_t));
    while (head < tail) {
        uint32_t x = order[head++];
        for (uint32_t k = 0; k < nsucc[x]; k++) {
            uint32_t s = out->succ[out->tasks[x].succ_begin + k];
            if (--indeg[s] == 0)
                order[tail++] = s;
        }
    }
    if (tail < (uint32_t)nt) {
        maco__describe_cycle(g, e, ne, pred_begin, indeg, why, sizeof(why));
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                         "%s: the dependencies form a cycle (%d of %d tasks can never run): %s", fn,
                         nt - (int)tail, nt, why);
        goto fail;
    }
    for (int i = 0; i < nt; i++)
        maco__lower_task(g, i, pred_begin, nsucc, out);
    out->ntasks = (uint32_t)nt;
    out->comm_workers_hint = g->comm_workers_hint;
    free(e);
    free(pred_begin);
    free(indeg);
    free(nsucc);
    free(order);
    return MACO_OK;
fail:
    free(e);
    free(pred_begin);
    free(indeg);
    free(nsucc);
    free(order);
    maco__pk_lowered_free(out);
    return st;
}

void maco__pk_lowered_free(maco__pk_lowered_t *l)
{
    free(l->tasks);
    free(l->succ);
    free(l->roots);
    free(l->sync);
    memset(l, 0, sizeof(*l));
}

/* Appends the tiles of width tn in groups of `group` tile rows, column by column inside a
 * group; returns the new count. */
static size_t maco__gemm_plan_grid(uint32_t rows, uint32_t cols, uint32_t tn, uint32_t group,
                                   maco_gemm_tile_t *tiles, size_t at)
{
    for (uint32_t g0 = 0; g0 < rows; g0 += group)
        for (uint32_t c = 0; c < cols; c++)
            for (uint32_t r = g0; r < rows && r < g0 + group; r++, at++)
                if (tiles != NULL)
                    tiles[at] = (maco_gemm_tile_t){ r, c, tn };
    return at;
}

uint32_t maco__gemm_tile_width(uint32_t m, uint32_t n, uint64_t units, int *forced_p)
{
    /* A wide tile reads a third fewer bytes per FLOP than two narrow ones and pays the per-task
     * costs once; but half as many tasks leave workers idle when C is small
     * (docs/results/2026-11-24/notes.md, "GEMM tiles"): wide only when there are at least as many
     * wide tiles as units. */
    const char *want = maco__config_string(MACO_CFG_GEMM_TILE_WIDTH);
    int forced = strcmp(want, "128") == 0 || strcmp(want, "256") == 0;
    if (!forced && strcasecmp(want, "auto") != 0)
        MACO_LOG(MACO_LOG_WARN, MACO_SUBSYS_PERSIST,
                 "MACO_GEMM_TILE_WIDTH=%s: auto, 128 or 256; auto is used", want);
    if (forced_p != NULL)
        *forced_p = forced;
    if (n % MACO_GEMM_TILE_N_WIDE != 0 || strcmp(want, "128") == 0)
        return MACO_GEMM_TILE_N;
    if (strcmp(want, "256") == 0)
        return MACO_GEMM_TILE_N_WIDE;
    uint64_t wide =
        (((uint64_t)m + MACO_GEMM_TILE_M - 1) / MACO_GEMM_TILE_M) * (n / MACO_GEMM_TILE_N_WIDE);
    return wide >= units ? MACO_GEMM_TILE_N_WIDE : MACO_GEMM_TILE_N;
}

maco_status_t maco_gemm_plan_tiles(uint32_t m, uint32_t n, int workers, maco_gemm_tile_t *tiles,
                                   size_t *ntiles_p)
{
    const char *fn = "maco_gemm_plan_tiles";
    if (ntiles_p == NULL || m == 0 || n == 0 || n % MACO_GEMM_TILE_N != 0 || workers < 1)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: m = %u, n = %u, workers = %d, ntiles_p %p: m >= 1, n a non-zero "
                           "multiple of %d, workers >= 1",
                           fn, m, n, workers, (void *)ntiles_p, MACO_GEMM_TILE_N);
    /* A partial last row of tiles counts as a row (the GEMM tiles store only its rows < m). */
    const uint32_t rows = (uint32_t)(((uint64_t)m + MACO_GEMM_TILE_M - 1) / MACO_GEMM_TILE_M);
    const uint32_t W = (uint32_t)workers;
    int forced = 0;
    const uint32_t tn = maco__gemm_tile_width(m, n, W, &forced);
    const uint32_t cols = n / tn;
    uint32_t group = (W + cols - 1) / cols;
    group = group < 1 ? 1 : group > rows ? rows : group;
    /* Counting only is closed form (rows x cols), whatever m and n: the grid is walked only to
     * fill `tiles`, which the caller sized for it. */
    size_t at =
        tiles == NULL ? (size_t)rows * cols : maco__gemm_plan_grid(rows, cols, tn, group, tiles, 0);
    if (tn == MACO_GEMM_TILE_N_WIDE && !forced) {
        /* The last round's wide tiles, each as two narrow ones at the end. */
        size_t tail = at % W;
        if (tail != 0 && 2 * tail <= W) {
            size_t first = at - tail;
            if (tiles != NULL) {
                for (size_t i = tail; i-- > 0;) { /* back to front: the halves land later */
                    maco_gemm_tile_t t = tiles[first + i];
                    tiles[first + 2 * i] =
                        (maco_gemm_tile_t){ t.tile_row, 2 * t.tile_col, MACO_GEMM_TILE_N };
                    tiles[first + 2 * i + 1] =
                        (maco_gemm_tile_t){ t.tile_row, 2 * t.tile_col + 1, MACO_GEMM_TILE_N };
                }
            }
            at += tail;
        }
    }
    *ntiles_p = at;
    return MACO_OK;
}

maco_status_t maco_task_graph_validate(maco_task_graph_t g)
{
    maco__pk_lowered_t l;
    maco_status_t st = maco__task_graph_lower(g, "maco_task_graph_validate", &l);
    if (st == MACO_OK)
        maco__pk_lowered_free(&l);
    return st;
}

/* ---------------------------------------------------------------- layout */

static size_t maco__round256(size_t x)
{
    return (x + 255) / 256 * 256;
}

static uint64_t maco__pow2_at_least(uint64_t x)
{
    uint64_t p = 2;
    while (p < x)
        p *= 2;
    return p;
}

void maco__pk_layout(const maco__pk_lowered_t *l, const maco_memory_channel_device_t *channels,
                     int nchannels, uint32_t W, uint32_t C, uint32_t S, int profile, void *fixed,
                     void *state, void *fixed_host, maco_pk_view_t *view, size_t *fixed_bytes_p,
                     size_t *state_bytes_p)
{
    uint32_t nq = W + C + S;
    uint64_t ncomp = l->ntasks - (C > 0 ? l->ncomm_tasks : 0);
    uint64_t cap_w = maco__pow2_at_least(
        ncomp < MACO__PK_WORKER_QUEUE_MAX ? ncomp + 1 : MACO__PK_WORKER_QUEUE_MAX);
    uint64_t cap_c =
        maco__pow2_at_least(l->ncomm_tasks < MACO__PK_WORKER_QUEUE_MAX ? l->ncomm_tasks + 1
                                                                       : MACO__PK_WORKER_QUEUE_MAX);
    uint64_t cap_s = maco__pow2_at_least((uint64_t)l->ntasks + 1);
    uint64_t nslots = W * cap_w + C * cap_c + S * cap_s;
    size_t o_tasks = 0;
    size_t o_succ = maco__round256(o_tasks + l->ntasks * sizeof(maco_pk_task_t));
    size_t o_roots = maco__round256(o_succ + (l->nsucc + 1) * sizeof(uint32_t));
    size_t o_rstart = maco__round256(o_roots + l->nroots * sizeof(uint32_t));
    size_t o_queues = maco__round256(o_rstart + ((size_t)W + C + 1) * sizeof(uint32_t));
    size_t o_chan = maco__round256(o_queues + nq * sizeof(maco_pk_queue_t));
    size_t o_sync =
        maco__round256(o_chan + (size_t)nchannels * sizeof(maco_memory_channel_device_t));
    *fixed_bytes_p =
        maco__round256(o_sync + (l->nsync > 0 ? l->ntasks * sizeof(maco_pk_sync_t) : 0));
    size_t o_ctr = 0;
    size_t o_arrive = maco__round256(MACO_PK_CTR_WORDS * sizeof(uint64_t));
    size_t o_qctl = maco__round256(o_arrive + l->ntasks * sizeof(uint64_t));
    size_t o_slots = o_qctl + (size_t)nq * 256;
    size_t o_prof = maco__round256(o_slots + nslots * sizeof(uint64_t));
    *state_bytes_p = o_prof + (profile ? l->ntasks * sizeof(maco_pk_profile_record_t) : 0);
    if (fixed == NULL || state == NULL)
        return;
    char *fx = fixed, *sx = state, *host = fixed_host;
    memcpy(host + o_tasks, l->tasks, l->ntasks * sizeof(maco_pk_task_t));
    memcpy(host + o_succ, l->succ, l->nsucc * sizeof(uint32_t));
    /* The roots by worker queue: those of each role to the role's workers in turn (comm
     * tasks to the compute workers where there are no communication workers), each queue's in
     * the graph's order (maco_pk_schedule_roots pushes them so). */
    uint32_t *rstart = (uint32_t *)(host + o_rstart), *rq = (uint32_t *)(host + o_roots);
    memset(rstart, 0, ((size_t)W + C + 1) * sizeof(uint32_t));
    for (int pass = 0; pass < 2; pass++) {
        uint32_t n_comp = 0, n_comm = 0;
        for (uint32_t i = 0; i < l->nroots; i++) {
            uint32_t r = l->roots[i];
            uint32_t q =
                l->tasks[r].role == MACO_PK_ROLE_COMM && C > 0 ? W + n_comm++ % C : n_comp++ % W;
            if (pass == 0)
                rstart[q + 1]++;
            else
                rq[rstart[q]++] = r;
        }
        if (pass == 0)
            for (uint32_t q = 0; q < W + C; q++)
                rstart[q + 1] += rstart[q];
    }
    for (uint32_t q = W + C; q > 0; q--) /* the fill moved each start to the next queue's */
        rstart[q] = rstart[q - 1];
    rstart[0] = 0;
    maco_pk_queue_t *q = (maco_pk_queue_t *)(host + o_queues);
    uint64_t slot = 0;
    for (uint32_t i = 0; i < nq; i++) {
        uint64_t cap = i < W ? cap_w : i < W + C ? cap_c : cap_s;
        q[i].slots = (uint64_t *)(sx + o_slots) + slot;
        q[i].reserve = (uint64_t *)(sx + o_qctl + (size_t)i * 256);
        q[i].head = (uint64_t *)(sx + o_qctl + (size_t)i * 256 + 128);
        q[i].capacity = cap;
        slot += cap;
    }
    if (nchannels > 0)
        memcpy(host + o_chan, channels, (size_t)nchannels * sizeof(maco_memory_channel_device_t));
    if (l->nsync > 0)
        memcpy(host + o_sync, l->sync, l->ntasks * sizeof(maco_pk_sync_t));
    memset(view, 0, sizeof(*view));
    view->tasks = (const maco_pk_task_t *)(fx + o_tasks);
    view->succ = (const uint32_t *)(fx + o_succ);
    view->roots = (const uint32_t *)(fx + o_roots);
    view->root_start = (const uint32_t *)(fx + o_rstart);
    view->arrive = (uint64_t *)(sx + o_arrive);
    view->ctr = (uint64_t *)(sx + o_ctr);
    view->queues = (const maco_pk_queue_t *)(fx + o_queues);
    view->channels = (const maco_memory_channel_device_t *)(fx + o_chan);
    view->sync = l->nsync > 0 ? (const maco_pk_sync_t *)(fx + o_sync) : NULL;
    view->profile = profile ? (maco_pk_profile_record_t *)(sx + o_prof) : NULL;
    view->ntasks = l->ntasks;
    view->nroots = l->nroots;
    view->nworkers = W;
    view->ncomm = C;
    view->nschedulers = S;
    view->nchannels = (uint32_t)nchannels;
}
