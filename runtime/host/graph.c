/*
 * graph.c - building a task graph on the host and checking it (each task's arguments, every
 * dependency: every error names the task). graph_lower.c turns a checked graph into the
 * descriptors the device runs (maco/device/persistent.h), finding cycles on the way. Needs no
 * GPU: the CPU tests link it directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "runtime/host/runtime_internal.h"

static const char *const maco__task_type_names[MACO_TASK_TYPE_COUNT] = {
    "nop",       "copy", "add",         "scale",          "residual_add",
    "signal",    "wait", "channel_put", "channel_signal", "channel_wait",
    "gemm_tile", "sum",  "port_put",    "port_flush",
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
                   MACO__SAME(MACO_TASK_PORT_PUT, MACO_PK_PORT_PUT) &&
                   MACO__SAME(MACO_TASK_PORT_FLUSH, MACO_PK_PORT_FLUSH) &&
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
    free(g->ports);
    free(g);
    return MACO_OK;
}

int maco__graph_grow(void **arr, int *cap, int n, size_t size)
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
    if (maco__graph_grow((void **)&g->tasks, &g->task_cap, g->ntasks, sizeof(maco_task_t)) != 0)
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
    if (maco__graph_grow((void **)&g->edges, &g->edge_cap, g->nedges, sizeof(maco__task_edge_t)) !=
        0)
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
    if (maco__graph_grow((void **)&g->channels, &g->channel_cap, g->nchannels,
                         sizeof(maco_memory_channel_device_t)) != 0)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                           "maco_task_graph_add_channel: out of host memory");
    g->channels[g->nchannels] = *handle;
    *index_p = g->nchannels++;
    return MACO_OK;
}

maco_status_t maco__task_graph_add_port_info(maco_task_graph_t g, const maco__port_info_t *info,
                                             int *index_p, const char *fn)
{
    if (g->nports >= (int)MACO_TRIGGER_MAX_CHANNELS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: the graph already has %d port channels, the most a task can name",
                           fn, g->nports);
    if (maco__graph_grow((void **)&g->ports, &g->port_cap, g->nports, sizeof(maco__port_info_t)) !=
        0)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST, "%s: out of host memory", fn);
    g->ports[g->nports] = *info;
    *index_p = g->nports++;
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
    if (t->wait_on != NULL && t->wait_need > t->wait_count) {
        snprintf(why, n, "gate: wait_need %llu is above wait_count %llu (the launch's signals)",
                 (unsigned long long)t->wait_need, (unsigned long long)t->wait_count);
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
    uint64_t esz = maco__task_out_type(t) == MACO_FLOAT32 ? 4 : 2;
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

/* 0 when [p, p + span) lies inside the address space; else -1 with `why` naming the pointer
 * `name` (span 0: nothing is touched, fine). */
static int maco__span_check(const void *p, uint64_t span, const char *name, char *why, size_t n)
{
    if (span > 0 && (uintptr_t)p > UINTPTR_MAX - span) {
        snprintf(why, n, "%s: %llu bytes from %p run past the end of memory", name,
                 (unsigned long long)span, p);
        return -1;
    }
    return 0;
}

/* The bytes from the first to the last element an element-wise task touches at one pointer:
 * rows (2D) of `count` elements `ld` elements apart. Below 2^57 (rows < 2^16, ld and count <
 * 2^24, elements of at most 4 bytes): no overflow. */
static uint64_t maco__rows_span(const maco_task_t *t, uint32_t ld, uint64_t esz)
{
    uint64_t rows = t->rows > 1 ? t->rows : 1;
    return ((rows - 1) * (t->rows > 1 ? ld : 0) + t->count) * esz;
}

/* The ranges an element-wise task reads and writes (counts and strides checked already): none
 * may run past the end of the address space. SUM's inputs span ninputs - 1 strides more. */
static int maco__elementwise_spans(const maco_task_t *t, uint64_t esz, char *why, size_t n)
{
    uint64_t in = maco__rows_span(t, t->ld_in, esz);
    if (maco__span_check(t->out, maco__rows_span(t, t->ld_out, esz), "out", why, n) != 0)
        return -1;
    if (t->type == MACO_TASK_SUM) {
        uint64_t steps = t->ninputs - 1; /* 0..63 */
        if (steps > 0 && (t->input_stride > (UINT64_MAX - in) / steps ||
                          (uintptr_t)t->a > UINTPTR_MAX - (steps * t->input_stride + in))) {
            snprintf(why, n,
                     "a: %u inputs input_stride = %llu bytes apart from %p run past the end of "
                     "memory",
                     t->ninputs, (unsigned long long)t->input_stride, t->a);
            return -1;
        }
        return maco__span_check(t->a, in, "a", why, n);
    }
    if (maco__span_check(t->a, in, "a", why, n) != 0)
        return -1;
    if (t->type == MACO_TASK_SCALE)
        return 0;
    return maco__span_check(t->b, in, "b", why, n);
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
    if (t->out_datatype != 0 && t->out_datatype != t->datatype &&
        (t->type != MACO_TASK_SUM || t->datatype != MACO_FLOAT32 ||
         t->out_datatype != MACO_BFLOAT16)) {
        snprintf(why, n,
                 "out_datatype %d with datatype %d: only a SUM's output may differ from its "
                 "inputs, MACO_BFLOAT16 from MACO_FLOAT32",
                 (int)t->out_datatype, (int)t->datatype);
        return -1;
    }
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
        size_t align = i == 0 && maco__task_out_type(t) == MACO_BFLOAT16 ? 2 : esz;
        if ((uintptr_t)ptrs[i] % align != 0) {
            snprintf(why, n, "%s (%p) is not aligned to its %zu-byte elements", names[i], ptrs[i],
                     align);
            return -1;
        }
    }
    return maco__elementwise_spans(t, esz, why, n);
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

/* PORT_PUT and PORT_FLUSH: the port channel, and a put's ranges (a trigger's fields). */
static int maco__port_task_check(const maco_task_graph_t g, const maco_task_t *t, char *why,
                                 size_t n)
{
    if (t->channel >= (uint32_t)g->nports) {
        snprintf(why, n, "port channel %u does not exist (the graph has %d)", t->channel,
                 g->nports);
        return -1;
    }
    if (t->type != MACO_TASK_PORT_PUT)
        return 0;
    const maco__port_info_t *c = &g->ports[t->channel];
    if (t->count > MACO_TRIGGER_MAX_SIZE || t->src_offset > c->src_bytes ||
        t->count > c->src_bytes - t->src_offset || t->dst_offset > c->dst_bytes ||
        t->count > c->dst_bytes - t->dst_offset || t->src_offset > MACO_TRIGGER_MAX_OFFSET ||
        t->dst_offset > MACO_TRIGGER_MAX_OFFSET) {
        snprintf(why, n,
                 "port put of %llu bytes from offset %llu to offset %llu leaves port channel "
                 "%u's buffers (%llu bytes source, %llu destination), or passes a trigger's "
                 "limits (below 4 GiB, offsets below 64 GiB)",
                 (unsigned long long)t->count, (unsigned long long)t->src_offset,
                 (unsigned long long)t->dst_offset, t->channel, (unsigned long long)c->src_bytes,
                 (unsigned long long)c->dst_bytes);
        return -1;
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
    if (t->ld_in != 0 && (t->ld_in < t->k || t->ld_in % 8 != 0 || t->ld_in > INT32_MAX)) {
        snprintf(why, n,
                 "ld_in = %u (A's row stride): 0, or at least k = %u, a multiple of 8 and below "
                 "2^31",
                 t->ld_in, t->k);
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
    /* What the tile reads and writes: A (m x k bf16), B (k x n bf16), and the tile's 128 rows
     * of C, ldc apart (m < 2^31, the others below 2^32: no product overflows). */
    uint64_t esz = t->datatype == MACO_FLOAT32 ? 4 : 2;
    if (maco__span_check(t->a, (uint64_t)t->m * t->k * 2, "A (a)", why, n) != 0 ||
        maco__span_check(t->b, (uint64_t)t->k * t->n * 2, "B (b)", why, n) != 0 ||
        maco__span_check(t->out, ((uint64_t)(MACO_GEMM_TILE_M - 1) * t->ldc + tn) * esz, "C (out)",
                         why, n) != 0)
        return -1;
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
    case MACO_TASK_PORT_PUT:
    case MACO_TASK_PORT_FLUSH:
        return maco__port_task_check(g, t, why, n);
    default:
        return 0;
    }
}

/* Every task's own check, and every dependency naming two existing, different tasks. */
maco_status_t maco__task_graph_check(maco_task_graph_t g, const char *fn)
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
