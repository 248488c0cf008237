/* plan_verify_util.c - what the plan verifier's steps share: the report (maco__vsay), names of
 * places and chunks for its messages, the kinds of operations and chunk locations (the method is
 * in plan_verify.c's file comment). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/plan/plan_verify.h"

void maco__vsay(maco__verifier_t *v, const char *fmt, ...)
{
    v->problems++;
    if (v->cap == 0)
        return;
    if (v->lines >= MACO__VERIFY_MAX_LINES) {
        if (v->lines == MACO__VERIFY_MAX_LINES && v->used + 5 < v->cap) {
            v->used += (size_t)snprintf(v->out + v->used, v->cap - v->used, "...\n");
            v->lines++;
        }
        return;
    }
    v->lines++;
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (v->used + len + 2 > v->cap) {
        if (v->used + 5 <= v->cap)
            v->used += (size_t)snprintf(v->out + v->used, v->cap - v->used, "...\n");
        v->lines = MACO__VERIFY_MAX_LINES + 1;
        return;
    }
    memcpy(v->out + v->used, line, len);
    v->out[v->used + len] = '\n';
    v->used += len + 1;
    v->out[v->used] = '\0';
}

/* "rank 1 tb 0 op 3 (put)" for op i of global tb g. */
const char *maco__vwhere(const maco__verifier_t *v, int g, int i, char *buf, size_t cap)
{
    int r = v->g_rank[g], t = g - v->tb_base[r];
    const maco__plan_op_t *op = &v->d->ranks[r].tbs[t].ops[i];
    snprintf(buf, cap, "rank %d tb %d op %d (%s)", r, t, i, maco__plan_op_name(op->code));
    return buf;
}

const char *maco__vwhere_ev(const maco__verifier_t *v, int ev, char *buf, size_t cap)
{
    int g = 0;
    while (g + 1 < v->T && v->ev_base[g + 1] <= ev)
        g++;
    return maco__vwhere(v, g, ev - v->ev_base[g], buf, cap);
}

const char *maco__vchunk(int buffer, uint32_t index, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s[%u]", maco__plan_buffer_name(buffer), index);
    return buf;
}

const char *maco__vrange(const maco__plan_ref_t *ref, char *buf, size_t cap)
{
    if (ref->count == 1)
        snprintf(buf, cap, "%s[%u]", maco__plan_buffer_name(ref->buffer), ref->index);
    else
        snprintf(buf, cap, "%s[%u:%u]", maco__plan_buffer_name(ref->buffer), ref->index,
                 ref->index + ref->count);
    return buf;
}

int maco__is_signal(int code)
{
    return code == MACO__POP_SIGNAL || code == MACO__POP_PUT_WITH_SIGNAL ||
           code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH;
}

int maco__is_flush(int code)
{
    return code == MACO__POP_FLUSH || code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH;
}

int maco__is_put(int code)
{
    return code == MACO__POP_PUT || code == MACO__POP_PUT_WITH_SIGNAL ||
           code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH || code == MACO__POP_PUT_PACKETS ||
           code == MACO__POP_READ_PUT_PACKETS;
}

/* The rank whose buffer `ref` of op (rank r) names. */
int maco__ref_rank(const maco__plan_desc_t *d, int r, const maco__plan_op_t *op,
                   const maco__plan_ref_t *ref, int is_dst)
{
    int remote;
    if (op->code == MACO__POP_REDUCE || op->code == MACO__POP_COPY)
        remote = !is_dst && ref->channel >= 0;
    else if (op->code == MACO__POP_GET)
        remote = !is_dst;
    else
        remote = is_dst; /* puts */
    if (!remote)
        return r;
    int c = op->code == MACO__POP_REDUCE || op->code == MACO__POP_COPY ? ref->channel : op->channel;
    return d->ranks[r].channels[c].peer;
}

uint32_t maco__loc(const maco__verifier_t *v, int rank, int buffer, uint32_t index)
{
    uint32_t base = 0;
    for (int b = 0; b < buffer; b++)
        base += v->chunks[b];
    return (uint32_t)rank * v->loc_per_rank + base + index;
}
