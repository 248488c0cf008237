/*
 * graph_lower.c - a checked task graph (graph.c) in the form the device runs: the descriptors,
 * successor lists and roots of maco/device/persistent.h, in topological order (a cycle is an
 * error that names it), and their memory layout (maco__pk_layout). Needs no GPU: the CPU tests
 * link it directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/base/log.h"
#include "runtime/host/runtime_internal.h"

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
        out->sync[i].wait_need = t->wait_on != NULL ? t->wait_need : 0;
        out->nsync++;
    }
    int comm = maco__task_is_comm(t);
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
    if (t->type == MACO_TASK_CHANNEL_PUT || t->type == MACO_TASK_PORT_PUT) {
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
        d->sum.out_dtype = (uint16_t)maco__task_out_type(t);
        d->sum.reserved = 0;
    } else if (t->type == MACO_TASK_GEMM_TILE) {
        d->ptr[3] = (uint64_t)t->tile_row * MACO_GEMM_TILE_M |
                    (uint64_t)(t->tile_col * maco__gemm_tile_n(t)) << 32;
        d->gemm.map = 0; /* the GMMA kernel's maps: set by maco_persistent_kernel_create */
        d->gemm.tile_n = (uint16_t)maco__gemm_tile_n(t);
        d->count = (uint64_t)t->k | (uint64_t)t->n << 32;
        d->aux = t->ldc;
        out->ngemm_tasks++;
        out->npartial_gemm += t->m % MACO_GEMM_TILE_M != 0 ? 1u : 0u;
        out->nstrided_gemm += maco__gemm_lda(t) != t->k ? 1u : 0u;
    } else if ((int)t->type >= MACO_TASK_USER) {
        d->ptr[3] = t->src_offset;
    }
}

maco_status_t maco__task_graph_lower(maco_task_graph_t g, const char *fn, maco__pk_lowered_t *out)
{
    if (g == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST, "%s: graph is NULL", fn);
    maco_status_t st = maco__task_graph_check(g, fn);
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
    out->ports = calloc((size_t)g->nports + 1, sizeof(maco_port_channel_device_t));
    if (out->ports == NULL || pred_begin == NULL || indeg == NULL || nsucc == NULL ||
        order == NULL || (g->nedges > 0 && e == NULL) || out->tasks == NULL || out->succ == NULL ||
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
    if (g->requeue_gates && out->ncomm_tasks > MACO__PK_REQUEUE_MAX) {
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                         "%s: %u communication tasks; a graph with copy-engine fused operators "
                         "holds at most %d (their gated tasks must always go back to their "
                         "queue): split the graph or use the SM mode",
                         fn, out->ncomm_tasks, MACO__PK_REQUEUE_MAX);
        goto fail;
    }
    out->ntasks = (uint32_t)nt;
    out->comm_workers_hint = g->comm_workers_hint;
    for (int i = 0; i < g->nports; i++)
        out->ports[i] = g->ports[i].handle;
    out->nports = (uint32_t)g->nports;
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
    free(l->ports);
    memset(l, 0, sizeof(*l));
}

/* Every check of maco__task_graph_lower, cycles included; nothing is kept. */
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
    /* Room for every task of the role and 2 more, up to the most: a worker that pops a task
     * whose gate is closed then always has room to put it back (it waits at the gate only
     * where load + 2 reaches the capacity: maco_pk_next_ready), below 4095 tasks of a role. */
    uint64_t cap_w = maco__pow2_at_least(
        ncomp + 2 < MACO__PK_WORKER_QUEUE_MAX ? ncomp + 2 : MACO__PK_WORKER_QUEUE_MAX);
    uint64_t cap_c = maco__pow2_at_least(l->ncomm_tasks + 2 < MACO__PK_WORKER_QUEUE_MAX
                                             ? l->ncomm_tasks + 2
                                             : MACO__PK_WORKER_QUEUE_MAX);
    uint64_t cap_s = maco__pow2_at_least((uint64_t)l->ntasks + 1);
    uint64_t nslots = W * cap_w + C * cap_c + S * cap_s;
    size_t o_tasks = 0;
    size_t o_succ = maco__round256(o_tasks + l->ntasks * sizeof(maco_pk_task_t));
    size_t o_roots = maco__round256(o_succ + (l->nsucc + 1) * sizeof(uint32_t));
    size_t o_rstart = maco__round256(o_roots + l->nroots * sizeof(uint32_t));
    size_t o_queues = maco__round256(o_rstart + ((size_t)W + C + 1) * sizeof(uint32_t));
    size_t o_chan = maco__round256(o_queues + nq * sizeof(maco_pk_queue_t));
    size_t o_ports =
        maco__round256(o_chan + (size_t)nchannels * sizeof(maco_memory_channel_device_t));
    size_t o_sync =
        maco__round256(o_ports + (size_t)l->nports * sizeof(maco_port_channel_device_t));
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
    if (l->nports > 0)
        memcpy(host + o_ports, l->ports, (size_t)l->nports * sizeof(maco_port_channel_device_t));
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
    view->ports = (const maco_port_channel_device_t *)(fx + o_ports);
    view->nports = l->nports;
}
