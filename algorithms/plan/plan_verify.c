/*
 * plan_verify.c - proves an execution plan correct before it runs (docs/plan-format.md,
 * "Verification").
 *
 * Method. The plan is executed symbolically over chunks on every rank at once:
 *  1. Structure and bounds: every channel, buffer and chunk an operation names exists, each
 *     channel has a partner on its peer (the k-th channel of rank r to rank p pairs with the
 *     k-th channel of p to r) of the same type, memory channels stay inside a node, each
 *     channel is used by one thread block, operations fit their channel's type, sizes match,
 *     inputs are never written. Element offsets then stay inside their buffers for every count
 *     (docs/plan-format.md derives them from chunk indices).
 *  2. Execution. Each thread block runs its operations in order. An operation is blocked
 *     while it waits for something not yet done: a wait for the k-th signal of its partner
 *     channel, a packet read for the put that writes those packets. The k-th wait on a channel
 *     returns after the partner's k-th signal, and since one thread block owns each channel,
 *     signals and packet writes are counted in program order: whatever interleaving the GPU
 *     picks, an operation becomes enabled exactly when the operations it depends on have run,
 *     and nothing it does disables another. So every interleaving runs the same set of
 *     operations, and running enabled operations until none is left decides the question for
 *     all of them: a thread block that cannot finish is a deadlock in every interleaving.
 *  3. Happens-before. Each operation gets a vector clock (one entry per thread block of the
 *     plan): its predecessor in program order, joined with the matched signal of a wait and
 *     the packet writes a packet read consumed. Two accesses of the same chunk by different
 *     operations, one of them a write, race unless one is complete before the other starts.
 *     A port channel's put is asynchronous: its read of the source completes at the next
 *     flush of the channel, its write at the peer at the next signal on the channel.
 *  4. Values. Each chunk holds a multiset of input chunks (rank, index): inputs start as
 *     themselves, copies and puts carry values, a reduce adds them. At the end every output
 *     chunk must hold what the collective requires: for a reduction, each input chunk
 *     exactly once; for allgather, the one input chunk.
 * Every message names the rank, thread block, operation (index in its list) and chunk.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/plan/plan_internal.h"

enum { MACO__VERIFY_MAX_LINES = 40 };

/* The most steps a verification may take (0.05 s on one core, optimised; 12 times what a
 * 32-rank allreduce of 900 KB takes; plan_verify's cost is in
 * docs/plan-format.md, "Verification"): a plan that needs more is refused, not checked for
 * minutes while the other ranks reach their bootstrap deadline. */
#define MACO__VERIFY_MAX_STEPS (1ull << 28)

typedef struct maco__access {
    int g;     /* global thread block */
    int start; /* op index where it begins */
    int end;   /* op index where it is complete (-1: never inside the plan) */
    uint8_t write, packets;
} maco__access_t;

typedef struct maco__access_list {
    maco__access_t *a;
    int n, cap;
} maco__access_list_t;

typedef struct maco__verifier {
    const maco__plan_desc_t *d;
    char *out;
    size_t cap, used;
    int problems, lines;
    int n, K, T;     /* ranks, parts, thread blocks in all */
    int *tb_base;    /* [n+1]: global id of rank r's tb 0 */
    int *g_rank;     /* [T] */
    int *ev_base;    /* [T+1]: event id of each tb's op 0 */
    uint32_t *vc;    /* [events][T] */
    int **owner;     /* [n][nchannels]: the tb that uses the channel, -1 none */
    int **partner;   /* [n][nchannels]: the partner's channel index on the peer */
    int **nsig;      /* [n][nchannels]: signals sent so far */
    int **nwait;     /* [n][nchannels]: waits returned so far */
    int **sig_total; /* [n][nchannels]: signals in the whole plan */
    int ***sig_ev;   /* [n][nchannels][sig_total]: event of each signal, in order */
    uint32_t chunks[MACO__PBUF_COUNT], loc_per_rank, nlocs, nids;
    int *pkt_writer;               /* [nlocs]: event that wrote packets there, -1 none */
    int *pkt_writes;               /* [nlocs]: packet writes seen (static) */
    uint16_t *val;                 /* [nlocs][nids] */
    int *part;                     /* [nlocs]: part of the value, -1 undefined */
    int *last;                     /* [nlocs]: event of the last write, -1 none */
    maco__access_list_t *access;   /* [nlocs] */
    uint16_t *tmp;                 /* [nids] */
    int *next_flush, *next_signal; /* [events]: maco__port_end's answers */
    int *pkt_ready;                /* [T]: packet chunks of the blocked op known written */
    uint64_t work, budget;         /* steps taken and allowed (MACO__VERIFY_MAX_STEPS) */
} maco__verifier_t;

static void maco__vsay(maco__verifier_t *v, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void maco__vsay(maco__verifier_t *v, const char *fmt, ...)
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
static const char *maco__vwhere(const maco__verifier_t *v, int g, int i, char *buf, size_t cap)
{
    int r = v->g_rank[g], t = g - v->tb_base[r];
    const maco__plan_op_t *op = &v->d->ranks[r].tbs[t].ops[i];
    snprintf(buf, cap, "rank %d tb %d op %d (%s)", r, t, i, maco__plan_op_name(op->code));
    return buf;
}

static const char *maco__vwhere_ev(const maco__verifier_t *v, int ev, char *buf, size_t cap)
{
    int g = 0;
    while (g + 1 < v->T && v->ev_base[g + 1] <= ev)
        g++;
    return maco__vwhere(v, g, ev - v->ev_base[g], buf, cap);
}

static const char *maco__vchunk(int buffer, uint32_t index, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s[%u]", maco__plan_buffer_name(buffer), index);
    return buf;
}

static const char *maco__vrange(const maco__plan_ref_t *ref, char *buf, size_t cap)
{
    if (ref->count == 1)
        snprintf(buf, cap, "%s[%u]", maco__plan_buffer_name(ref->buffer), ref->index);
    else
        snprintf(buf, cap, "%s[%u:%u]", maco__plan_buffer_name(ref->buffer), ref->index,
                 ref->index + ref->count);
    return buf;
}

static int maco__is_signal(int code)
{
    return code == MACO__POP_SIGNAL || code == MACO__POP_PUT_WITH_SIGNAL ||
           code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH;
}

static int maco__is_flush(int code)
{
    return code == MACO__POP_FLUSH || code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH;
}

static int maco__is_put(int code)
{
    return code == MACO__POP_PUT || code == MACO__POP_PUT_WITH_SIGNAL ||
           code == MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH || code == MACO__POP_PUT_PACKETS ||
           code == MACO__POP_READ_PUT_PACKETS;
}

/* The rank whose buffer `ref` of op (rank r) names. */
static int maco__ref_rank(const maco__plan_desc_t *d, int r, const maco__plan_op_t *op,
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

static uint32_t maco__loc(const maco__verifier_t *v, int rank, int buffer, uint32_t index)
{
    uint32_t base = 0;
    for (int b = 0; b < buffer; b++)
        base += v->chunks[b];
    return (uint32_t)rank * v->loc_per_rank + base + index;
}

/* ------------------------------------------------------------------ 1. structure */

static int maco__check_ref(maco__verifier_t *v, int r, int t, int i, const char *what,
                           const maco__plan_ref_t *ref, const maco__plan_ref_t *dst)
{
    const maco__plan_desc_t *d = v->d;
    const maco__plan_op_t *op = &d->ranks[r].tbs[t].ops[i];
    uint32_t have = maco__plan_chunks(d, ref->buffer);
    char rb[64];
    int bad = 0;
    if ((uint64_t)ref->index + ref->count > have) {
        maco__vsay(v,
                   "bounds: rank %d tb %d op %d (%s): %s %s is out of bounds: the %s buffer has "
                   "%u chunks",
                   r, t, i, maco__plan_op_name(op->code), what, maco__vrange(ref, rb, sizeof(rb)),
                   maco__plan_buffer_name(ref->buffer), have);
        bad = 1;
    }
    if (dst != NULL && ref != dst && ref->count != dst->count) {
        maco__vsay(v, "rank %d tb %d op %d (%s): %s has %u chunks but dst has %u", r, t, i,
                   maco__plan_op_name(op->code), what, ref->count, dst->count);
        bad = 1;
    }
    if (ref->packets && ref->buffer != MACO__PBUF_SCRATCH) {
        maco__vsay(v, "rank %d tb %d op %d (%s): %s %s: LL packets live in scratch only", r, t, i,
                   maco__plan_op_name(op->code), what, maco__vrange(ref, rb, sizeof(rb)));
        bad = 1;
    }
    return bad;
}

static int maco__check_channel_use(maco__verifier_t *v, int r, int t, int i, int c)
{
    const maco__plan_rank_t *R = &v->d->ranks[r];
    const maco__plan_op_t *op = &R->tbs[t].ops[i];
    if (c < 0 || c >= R->nchannels) {
        maco__vsay(v,
                   "bounds: rank %d tb %d op %d (%s): channel %d does not exist (rank %d has %d)",
                   r, t, i, maco__plan_op_name(op->code), c, r, R->nchannels);
        return 1;
    }
    if (v->owner[r][c] == -1)
        v->owner[r][c] = t;
    else if (v->owner[r][c] != t) {
        maco__vsay(v,
                   "rank %d tb %d op %d (%s): channel %d (to rank %d) is also used by tb %d; each "
                   "channel belongs to one thread block",
                   r, t, i, maco__plan_op_name(op->code), c, R->channels[c].peer, v->owner[r][c]);
        v->owner[r][c] = -2; /* reported */
        return 1;
    }
    return 0;
}

static int maco__check_structure(maco__verifier_t *v)
{
    const maco__plan_desc_t *d = v->d;
    int bad = 0;
    /* Channels: peers, nodes, partners. */
    for (int r = 0; r < d->world_size; r++) {
        const maco__plan_rank_t *R = &d->ranks[r];
        for (int c = 0; c < R->nchannels; c++) {
            int p = R->channels[c].peer;
            v->partner[r][c] = -1;
            if (p == r) {
                maco__vsay(v, "rank %d channel %d: its peer is the rank itself", r, c);
                bad = 1;
                continue;
            }
            if (R->channels[c].type == MACO__PCHAN_MEMORY &&
                p / d->ranks_per_node != r / d->ranks_per_node) {
                maco__vsay(v,
                           "rank %d channel %d: a memory channel to rank %d on another node "
                           "(ranks_per_node = %d); use a port channel",
                           r, c, p, d->ranks_per_node);
                bad = 1;
            }
            int k = 0; /* this is the k-th channel of r to p */
            for (int c2 = 0; c2 < c; c2++)
                k += R->channels[c2].peer == p;
            const maco__plan_rank_t *P = &d->ranks[p];
            int seen = 0;
            for (int c2 = 0; c2 < P->nchannels; c2++)
                if (P->channels[c2].peer == r && seen++ == k) {
                    v->partner[r][c] = c2;
                    break;
                }
            if (v->partner[r][c] < 0) {
                maco__vsay(v,
                           "rank %d channel %d (its channel %d to rank %d) has no partner: rank %d "
                           "has %d channels to rank %d",
                           r, c, k, p, p, seen, r);
                bad = 1;
            } else if (P->channels[v->partner[r][c]].type != R->channels[c].type) {
                maco__vsay(v,
                           "rank %d channel %d (to rank %d) is a %s channel but its partner, rank "
                           "%d channel %d, is a %s channel",
                           r, c, p, R->channels[c].type == MACO__PCHAN_MEMORY ? "memory" : "port",
                           p, v->partner[r][c],
                           R->channels[c].type == MACO__PCHAN_MEMORY ? "port" : "memory");
                bad = 1;
            }
        }
    }
    /* Operations. */
    for (int r = 0; r < d->world_size; r++) {
        const maco__plan_rank_t *R = &d->ranks[r];
        for (int t = 0; t < R->ntbs; t++)
            for (int i = 0; i < R->tbs[t].nops; i++) {
                const maco__plan_op_t *op = &R->tbs[t].ops[i];
                const char *name = maco__plan_op_name(op->code);
                char rb[64];
                if (op->channel >= 0) {
                    if (maco__check_channel_use(v, r, t, i, op->channel)) {
                        bad = 1;
                        continue;
                    }
                    int port = R->channels[op->channel].type == MACO__PCHAN_PORT;
                    int ok =
                        port ? (op->code != MACO__POP_GET && op->code != MACO__POP_PUT_PACKETS &&
                                op->code != MACO__POP_READ_PUT_PACKETS)
                             : (op->code != MACO__POP_FLUSH &&
                                op->code != MACO__POP_PUT_WITH_SIGNAL &&
                                op->code != MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH);
                    if (!ok) {
                        maco__vsay(v, "rank %d tb %d op %d (%s): channel %d is a %s channel; %s", r,
                                   t, i, name, op->channel, port ? "port" : "memory",
                                   port ? "get and packets need a memory channel"
                                        : "flush and put_with_signal need a port channel");
                        bad = 1;
                    }
                }
                if (op->code <= MACO__POP_FLUSH)
                    continue;
                bad |= maco__check_ref(v, r, t, i, "dst", &op->dst, NULL);
                for (int s = 0; s < op->nsrcs; s++) {
                    const maco__plan_ref_t *src = &op->srcs[s];
                    bad |= maco__check_ref(v, r, t, i, "src", src, &op->dst);
                    if (src->channel >= 0) {
                        if (op->code == MACO__POP_COPY || src->packets) {
                            maco__vsay(v,
                                       "rank %d tb %d op %d (%s): src %s: only a reduce reads a "
                                       "peer's chunk through a channel, and not as packets",
                                       r, t, i, name, maco__vrange(src, rb, sizeof(rb)));
                            bad = 1;
                        } else if (maco__check_channel_use(v, r, t, i, src->channel)) {
                            bad = 1;
                        } else if (R->channels[src->channel].type != MACO__PCHAN_MEMORY) {
                            maco__vsay(v,
                                       "rank %d tb %d op %d (%s): src %s: channel %d is a port "
                                       "channel; a reduce reads peers through memory channels",
                                       r, t, i, name, maco__vrange(src, rb, sizeof(rb)),
                                       src->channel);
                            bad = 1;
                        }
                    }
                }
                if (op->code == MACO__POP_PUT_PACKETS || op->code == MACO__POP_READ_PUT_PACKETS) {
                    if (op->dst.buffer != MACO__PBUF_SCRATCH ||
                        (op->code == MACO__POP_READ_PUT_PACKETS &&
                         op->srcs[0].buffer != MACO__PBUF_SCRATCH)) {
                        maco__vsay(v, "rank %d tb %d op %d (%s): LL packets live in scratch only",
                                   r, t, i, name);
                        bad = 1;
                    }
                }
                if (op->dst.buffer == MACO__PBUF_INPUT) {
                    maco__vsay(v,
                               "rank %d tb %d op %d (%s): writes input[%u] of rank %d: the input "
                               "buffer is read-only",
                               r, t, i, name, op->dst.index,
                               op->channel >= 0 && maco__is_put(op->code)
                                   ? R->channels[op->channel].peer
                                   : r);
                    bad = 1;
                }
            }
    }
    return bad;
}

/* ------------------------------------------------------------------ 2.-4. execution */

static uint32_t *maco__vc(const maco__verifier_t *v, int ev)
{
    return v->vc + (size_t)ev * (size_t)v->T;
}

static void maco__vjoin(maco__verifier_t *v, uint32_t *dst, int ev)
{
    const uint32_t *src = maco__vc(v, ev);
    for (int g = 0; g < v->T; g++)
        if (src[g] > dst[g])
            dst[g] = src[g];
}

static int maco__add_access(maco__verifier_t *v, uint32_t loc, int g, int start, int end, int write,
                            int packets)
{
    maco__access_list_t *l = &v->access[loc];
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        maco__access_t *a = (maco__access_t *)realloc(l->a, (size_t)cap * sizeof(*a));
        if (a == NULL)
            return -1;
        l->a = a;
        l->cap = cap;
    }
    maco__access_t *x = &l->a[l->n++];
    x->g = g;
    x->start = start;
    x->end = end;
    x->write = (uint8_t)write;
    x->packets = (uint8_t)packets;
    return 0;
}

/* Op index in tb g after `i` where the port put at i is complete: its source read (next
 * flush) or its write at the peer (next signal). -1: never. From the tables verifier_alloc
 * fills in one backward pass per thread block. */
static int maco__port_end(const maco__verifier_t *v, int g, int i, int want_signal)
{
    int ev = v->ev_base[g] + i;
    return want_signal ? v->next_signal[ev] : v->next_flush[ev];
}

/* Whether op i of tb g may run now (its waits and packets are there). Packet chunks stay
 * written once written, so v->pkt_ready[g] remembers how many of op i's were seen (the sweep
 * resets it when tb g moves on): each chunk is looked at once while its op is blocked. */
static int maco__enabled(maco__verifier_t *v, int g, int i)
{
    int r = v->g_rank[g], t = g - v->tb_base[r];
    const maco__plan_op_t *op = &v->d->ranks[r].tbs[t].ops[i];
    v->work++;
    if (op->code == MACO__POP_WAIT) {
        int p = v->d->ranks[r].channels[op->channel].peer, c2 = v->partner[r][op->channel];
        return v->nsig[p][c2] > v->nwait[r][op->channel];
    }
    uint32_t skip = (uint32_t)v->pkt_ready[g], seen = 0;
    for (int s = 0; s < op->nsrcs; s++) {
        const maco__plan_ref_t *src = &op->srcs[s];
        if (!(src->packets || op->code == MACO__POP_READ_PUT_PACKETS))
            continue;
        uint32_t j = skip >= src->count ? src->count : skip;
        skip -= j;
        seen += j;
        for (; j < src->count; j++, seen++) {
            v->work++;
            if (v->pkt_writer[maco__loc(v, r, MACO__PBUF_SCRATCH, src->index + j)] < 0) {
                v->pkt_ready[g] = (int)seen;
                return 0;
            }
        }
    }
    return 1;
}

static void maco__vvalue_name(const maco__verifier_t *v, uint32_t id, char *buf, size_t cap)
{
    uint32_t cin = v->chunks[MACO__PBUF_INPUT];
    snprintf(buf, cap, "input[%u] of rank %u", id % cin, id / cin);
}

/* Runs op i of tb g (enabled): clocks, accesses, values. Returns -1 on no memory, -2 when the
 * verifier's step budget is spent. */
static int maco__exec(maco__verifier_t *v, int g, int i)
{
    const maco__plan_desc_t *d = v->d;
    int r = v->g_rank[g], t = g - v->tb_base[r];
    const maco__plan_op_t *op = &d->ranks[r].tbs[t].ops[i];
    int ev = v->ev_base[g] + i;
    uint32_t *vc = maco__vc(v, ev);
    /* Its cost up front: clocks (T per join), values (nids per source and chunk). */
    uint64_t joins = 2;
    for (int s = 0; s < op->nsrcs; s++)
        if (op->srcs[s].packets || op->code == MACO__POP_READ_PUT_PACKETS)
            joins += op->srcs[s].count;
    v->work += joins * (uint64_t)v->T +
               (uint64_t)op->dst.count * ((uint64_t)op->nsrcs + 1) * (v->nids + 4);
    if (v->work > v->budget)
        return -2;
    char w[96], cb[64];
    if (i > 0)
        memcpy(vc, maco__vc(v, ev - 1), sizeof(uint32_t) * (size_t)v->T);
    vc[g] = (uint32_t)i + 1;
    if (op->code == MACO__POP_WAIT) {
        int c = op->channel, p = d->ranks[r].channels[c].peer, c2 = v->partner[r][c];
        maco__vjoin(v, vc, v->sig_ev[p][c2][v->nwait[r][c]]);
        v->nwait[r][c]++;
    }
    if (maco__is_signal(op->code))
        v->sig_ev[r][op->channel][v->nsig[r][op->channel]++] = ev;
    if (op->code <= MACO__POP_FLUSH)
        return 0;
    int port = op->channel >= 0 && d->ranks[r].channels[op->channel].type == MACO__PCHAN_PORT;
    int dst_rank = maco__ref_rank(d, r, op, &op->dst, 1);
    int dst_packets = op->code == MACO__POP_PUT_PACKETS || op->code == MACO__POP_READ_PUT_PACKETS;
    /* Packet reads join their writers' clocks first. */
    for (int s = 0; s < op->nsrcs; s++) {
        const maco__plan_ref_t *src = &op->srcs[s];
        if (src->packets || op->code == MACO__POP_READ_PUT_PACKETS)
            for (uint32_t j = 0; j < src->count; j++)
                maco__vjoin(v, vc,
                            v->pkt_writer[maco__loc(v, r, MACO__PBUF_SCRATCH, src->index + j)]);
    }
    for (uint32_t j = 0; j < op->dst.count; j++) {
        uint32_t dloc = maco__loc(v, dst_rank, op->dst.buffer, op->dst.index + j);
        int dpart = op->dst.buffer == MACO__PBUF_SCRATCH ? -1 : (int)((op->dst.index + j) % v->K);
        int part = -2, undefined = 0;
        memset(v->tmp, 0, sizeof(uint16_t) * v->nids);
        for (int s = 0; s < op->nsrcs; s++) {
            const maco__plan_ref_t *src = &op->srcs[s];
            int srank = maco__ref_rank(d, r, op, src, 0);
            int pk = src->packets || op->code == MACO__POP_READ_PUT_PACKETS;
            uint32_t sloc = maco__loc(v, srank, src->buffer, src->index + j);
            int end = port ? maco__port_end(v, g, i, 0) : i;
            if (maco__add_access(v, sloc, g, i, end, 0, pk) < 0)
                return -1;
            if (v->part[sloc] < 0) {
                if (!undefined)
                    maco__vsay(v, "%s reads %s of rank %d before any operation wrote it",
                               maco__vwhere(v, g, i, w, sizeof(w)),
                               maco__vchunk(src->buffer, src->index + j, cb, sizeof(cb)), srank);
                undefined = 1;
                continue;
            }
            if (part == -2)
                part = v->part[sloc];
            else if (part != v->part[sloc]) {
                maco__vsay(v,
                           "%s: its sources hold different parts (%d and %d: different sizes), "
                           "at %s of rank %d",
                           maco__vwhere(v, g, i, w, sizeof(w)), part, v->part[sloc],
                           maco__vchunk(src->buffer, src->index + j, cb, sizeof(cb)), srank);
            }
            const uint16_t *sv = v->val + (size_t)sloc * v->nids;
            for (uint32_t k = 0; k < v->nids; k++)
                v->tmp[k] = (uint16_t)(v->tmp[k] + sv[k] > 65535 ? 65535 : v->tmp[k] + sv[k]);
        }
        int end = port ? maco__port_end(v, g, i, 1) : i;
        if (maco__add_access(v, dloc, g, i, end, 1, dst_packets) < 0)
            return -1;
        if (dst_packets) {
            v->pkt_writes[dloc]++;
            v->pkt_writer[dloc] = ev;
        }
        if (undefined)
            continue;
        if (j == 0)
            ((maco__plan_op_t *)op)->part0 = part;
        else if (part != (op->part0 + (int)j) % v->K)
            maco__vsay(v,
                       "%s: chunk %u of its range holds part %d, not part %d: a range must hold "
                       "consecutive parts",
                       maco__vwhere(v, g, i, w, sizeof(w)), j, part, (op->part0 + (int)j) % v->K);
        if (dpart >= 0 && part >= 0 && part != dpart)
            maco__vsay(v,
                       "%s writes part %d of the unit into %s of rank %d, which holds part %d: "
                       "their sizes differ (a swapped chunk?)",
                       maco__vwhere(v, g, i, w, sizeof(w)), part,
                       maco__vchunk(op->dst.buffer, op->dst.index + j, cb, sizeof(cb)), dst_rank,
                       dpart);
        memcpy(v->val + (size_t)dloc * v->nids, v->tmp, sizeof(uint16_t) * v->nids);
        v->part[dloc] = part;
        v->last[dloc] = ev;
    }
    return 0;
}

/* A before B: A is complete before B starts. */
static int maco__before(const maco__verifier_t *v, const maco__access_t *a, const maco__access_t *b)
{
    if (a->end < 0)
        return 0;
    if (a->g == b->g)
        return a->end < b->start;
    return maco__vc(v, v->ev_base[b->g] + b->start)[a->g] >= (uint32_t)a->end + 1;
}

/* Reports a race between accesses a (earlier in the run) and b of one chunk, unless ordered. */
static void maco__race_pair(maco__verifier_t *v, int rank, const char *cb, const maco__access_t *a,
                            const maco__access_t *b)
{
    char w1[96], w2[96];
    if (a->g == b->g && a->start == b->start)
        return; /* one op (a reduce whose dst is a source) */
    if (maco__before(v, a, b) || maco__before(v, b, a))
        return;
    maco__vsay(v, "race on rank %d %s: %s %s it and %s %s it with no signal/wait ordering them",
               rank, cb, maco__vwhere(v, a->g, a->start, w1, sizeof(w1)),
               a->write ? "writes" : "reads", maco__vwhere(v, b->g, b->start, w2, sizeof(w2)),
               b->write ? "writes" : "reads");
}

/*
 * Races, in time linear in the accesses (FastTrack's epoch argument, Flanagan and Freund, PLDI
 * 2009): the accesses of a chunk are taken in the order the symbolic run made them; each is
 * checked against the last write before it and, when it is a write, against the reads since
 * that write. Happens-before is transitive, so when these checks pass every pair with a write
 * is ordered; when a pair is not, one of these checks fails for that chunk (at least one race
 * is reported per racy chunk, not every pair). Packet slots: packet accesses wait for their
 * write (never a race); a chunk used both ways is reported as such instead.
 */
static void maco__check_races(maco__verifier_t *v)
{
    char w1[96], w2[96], cb[64];
    for (uint32_t loc = 0; loc < v->nlocs; loc++) {
        maco__access_list_t *l = &v->access[loc];
        int rank = (int)(loc / v->loc_per_rank);
        uint32_t off = loc % v->loc_per_rank;
        int buffer = 0;
        while (buffer + 1 < MACO__PBUF_COUNT && off >= v->chunks[buffer]) {
            off -= v->chunks[buffer];
            buffer++;
        }
        maco__vchunk(buffer, off, cb, sizeof(cb));
        if (v->pkt_writes[loc] > 1)
            maco__vsay(v,
                       "rank %d %s is written as LL packets %d times in one launch: its readers "
                       "cannot tell the writes apart (last: %s)",
                       rank, cb, v->pkt_writes[loc],
                       maco__vwhere_ev(v, v->pkt_writer[loc], w1, sizeof(w1)));
        int pk = -1, dt = -1; /* first packet access and first data access */
        for (int x = 0; x < l->n && (pk < 0 || dt < 0); x++) {
            if (l->a[x].packets && pk < 0)
                pk = x;
            if (!l->a[x].packets && dt < 0)
                dt = x;
        }
        if (pk >= 0 && dt >= 0) {
            maco__vsay(v, "rank %d %s is used both as LL packets (%s) and as data (%s)", rank, cb,
                       maco__vwhere(v, l->a[pk].g, l->a[pk].start, w1, sizeof(w1)),
                       maco__vwhere(v, l->a[dt].g, l->a[dt].start, w2, sizeof(w2)));
            continue;
        }
        if (pk >= 0)
            continue;                        /* packets only */
        int last_write = -1, reads_from = 0; /* reads since last_write: [reads_from, x) */
        int racy = 0;
        for (int x = 0; x < l->n && !racy; x++) {
            const maco__access_t *b = &l->a[x];
            int before = v->problems;
            if (last_write >= 0)
                maco__race_pair(v, rank, cb, &l->a[last_write], b);
            if (b->write) {
                for (int y = reads_from; y < x && v->problems == before; y++)
                    if (!l->a[y].write)
                        maco__race_pair(v, rank, cb, &l->a[y], b);
                last_write = x;
                reads_from = x + 1;
            }
            racy = v->problems != before; /* one race per chunk: the rest adds nothing */
        }
    }
}

static void maco__check_post(maco__verifier_t *v)
{
    const maco__plan_desc_t *d = v->d;
    uint32_t K = (uint32_t)v->K, cin = v->chunks[MACO__PBUF_INPUT];
    char w[96], name[64], by[128];
    for (int r = 0; r < d->world_size; r++)
        for (uint32_t j = 0; j < v->chunks[MACO__PBUF_OUTPUT]; j++) {
            uint32_t loc = maco__loc(v, r, MACO__PBUF_OUTPUT, j);
            memset(v->tmp, 0, sizeof(uint16_t) * v->nids);
            for (int s = 0; s < d->world_size; s++) {
                if (d->coll == MACO_COLL_ALLREDUCE)
                    v->tmp[(uint32_t)s * cin + j] = 1;
                else if (d->coll == MACO_COLL_REDUCE_SCATTER)
                    v->tmp[(uint32_t)s * cin + (uint32_t)r * K + j] = 1;
                else if ((uint32_t)s == j / K)
                    v->tmp[(uint32_t)s * cin + j % K] = 1;
            }
            if (v->last[loc] < 0) {
                maco__vsay(v, "postcondition: rank %d output[%u]: no operation writes it", r, j);
                continue;
            }
            snprintf(by, sizeof(by), " (last written by %s)",
                     maco__vwhere_ev(v, v->last[loc], w, sizeof(w)));
            const uint16_t *have = v->val + (size_t)loc * v->nids;
            int said = 0;
            for (uint32_t k = 0; k < v->nids && said < 2; k++) {
                if (have[k] == v->tmp[k])
                    continue;
                maco__vvalue_name(v, k, name, sizeof(name));
                said++;
                if (v->tmp[k] == 0)
                    maco__vsay(v,
                               "postcondition: rank %d output[%u] holds %s, which does not "
                               "belong there%s",
                               r, j, name, by);
                else if (have[k] == 0)
                    maco__vsay(v, "postcondition: rank %d output[%u] lacks %s%s", r, j, name, by);
                else
                    maco__vsay(v,
                               "postcondition: rank %d output[%u] holds %s %u times (reduced "
                               "more than once); it must be there once%s",
                               r, j, name, have[k], by);
            }
        }
}

static void maco__report_deadlocks(maco__verifier_t *v, const int *done)
{
    const maco__plan_desc_t *d = v->d;
    char w[96], w2[96], cb[64];
    for (int g = 0; g < v->T; g++) {
        int r = v->g_rank[g], t = g - v->tb_base[r], i = done[g];
        const maco__plan_tb_t *tb = &d->ranks[r].tbs[t];
        if (i >= tb->nops)
            continue;
        const maco__plan_op_t *op = &tb->ops[i];
        maco__vwhere(v, g, i, w, sizeof(w));
        if (op->code == MACO__POP_WAIT) {
            int c = op->channel, p = d->ranks[r].channels[c].peer, c2 = v->partner[r][c];
            int k = v->nwait[r][c]; /* waits for signal k (0-based) */
            if (v->sig_total[p][c2] <= k) {
                maco__vsay(v,
                           "deadlock: %s on channel %d (to rank %d) waits for signal %d, but rank "
                           "%d signals its channel %d only %d times: no interleaving satisfies it",
                           w, c, p, k + 1, p, c2, v->sig_total[p][c2]);
            } else {
                /* The k-th signal's op exists but never runs: find it. */
                int owner = v->owner[p][c2], seen = 0, at = -1;
                const maco__plan_tb_t *ptb = &d->ranks[p].tbs[owner];
                for (int j = 0; j < ptb->nops && at < 0; j++)
                    if (ptb->ops[j].channel == c2 && maco__is_signal(ptb->ops[j].code) &&
                        seen++ == k)
                        at = j;
                maco__vsay(v,
                           "deadlock: %s on channel %d (to rank %d) waits for signal %d, sent by "
                           "%s, which never runs (its thread block is blocked too)",
                           w, c, p, k + 1,
                           maco__vwhere(v, v->tb_base[p] + owner, at, w2, sizeof(w2)));
            }
            continue;
        }
        for (int s = 0; s < op->nsrcs; s++) {
            const maco__plan_ref_t *src = &op->srcs[s];
            if (!src->packets && op->code != MACO__POP_READ_PUT_PACKETS)
                continue;
            for (uint32_t j = 0; j < src->count; j++) {
                uint32_t loc = maco__loc(v, r, MACO__PBUF_SCRATCH, src->index + j);
                if (v->pkt_writer[loc] >= 0)
                    continue;
                maco__vchunk(MACO__PBUF_SCRATCH, src->index + j, cb, sizeof(cb));
                if (v->pkt_writes[loc] == 0)
                    maco__vsay(v,
                               "deadlock: %s waits for LL packets in %s of rank %d that no "
                               "operation writes",
                               w, cb, r);
                else
                    maco__vsay(v,
                               "deadlock: %s waits for LL packets in %s of rank %d whose writer "
                               "never runs (its thread block is blocked too)",
                               w, cb, r);
                s = op->nsrcs;
                break;
            }
        }
    }
}

static void maco__verifier_free(maco__verifier_t *v)
{
    const maco__plan_desc_t *d = v->d;
    for (int r = 0; r < d->world_size; r++) {
        if (v->sig_ev != NULL && v->sig_ev[r] != NULL) {
            for (int c = 0; c < d->ranks[r].nchannels; c++)
                free(v->sig_ev[r][c]);
            free(v->sig_ev[r]);
        }
        if (v->owner)
            free(v->owner[r]);
        if (v->partner)
            free(v->partner[r]);
        if (v->nsig)
            free(v->nsig[r]);
        if (v->nwait)
            free(v->nwait[r]);
        if (v->sig_total)
            free(v->sig_total[r]);
    }
    free(v->sig_ev);
    free(v->owner);
    free(v->partner);
    free(v->nsig);
    free(v->nwait);
    free(v->sig_total);
    if (v->access != NULL)
        for (uint32_t l = 0; l < v->nlocs; l++)
            free(v->access[l].a);
    free(v->access);
    free(v->tb_base);
    free(v->g_rank);
    free(v->ev_base);
    free(v->vc);
    free(v->pkt_writer);
    free(v->pkt_writes);
    free(v->val);
    free(v->part);
    free(v->last);
    free(v->tmp);
    free(v->next_flush);
    free(v->next_signal);
    free(v->pkt_ready);
}

static int maco__verifier_alloc(maco__verifier_t *v)
{
    const maco__plan_desc_t *d = v->d;
    int n = d->world_size;
    v->n = n;
    v->K = d->parts;
    for (int b = 0; b < MACO__PBUF_COUNT; b++)
        v->chunks[b] = maco__plan_chunks(d, b);
    v->loc_per_rank = v->chunks[0] + v->chunks[1] + v->chunks[2];
    v->nlocs = v->loc_per_rank * (uint32_t)n;
    v->nids = v->chunks[MACO__PBUF_INPUT] * (uint32_t)n;
    v->tb_base = (int *)calloc((size_t)n + 1, sizeof(int));
    if (v->tb_base == NULL)
        return -1;
    for (int r = 0; r < n; r++)
        v->tb_base[r + 1] = v->tb_base[r] + d->ranks[r].ntbs;
    v->T = v->tb_base[n];
    v->g_rank = (int *)calloc((size_t)v->T, sizeof(int));
    v->ev_base = (int *)calloc((size_t)v->T + 1, sizeof(int));
    if (v->g_rank == NULL || v->ev_base == NULL)
        return -1;
    for (int r = 0; r < n; r++)
        for (int t = 0; t < d->ranks[r].ntbs; t++) {
            int g = v->tb_base[r] + t;
            v->g_rank[g] = r;
            v->ev_base[g + 1] = v->ev_base[g] + d->ranks[r].tbs[t].nops;
        }
    size_t nev = (size_t)v->ev_base[v->T];
    v->next_flush = (int *)malloc((nev + 1) * sizeof(int));
    v->next_signal = (int *)malloc((nev + 1) * sizeof(int));
    v->pkt_ready = (int *)calloc((size_t)v->T + 1, sizeof(int));
    if (v->next_flush == NULL || v->next_signal == NULL || v->pkt_ready == NULL)
        return -1;
    for (int r = 0; r < n; r++) {
        int nc = d->ranks[r].nchannels;
        int *nf = (int *)malloc(((size_t)nc + 1) * 2 * sizeof(int)), *ns = nf + nc + 1;
        if (nf == NULL)
            return -1;
        for (int t = 0; t < d->ranks[r].ntbs; t++) {
            const maco__plan_tb_t *tb = &d->ranks[r].tbs[t];
            int base = v->ev_base[v->tb_base[r] + t];
            for (int c = 0; c <= nc; c++)
                nf[c] = ns[c] = -1;
            for (int i = tb->nops - 1; i >= 0; i--) {
                int c = tb->ops[i].channel;
                if (c >= 0 && c < nc) {
                    if (maco__is_flush(tb->ops[i].code))
                        nf[c] = i;
                    if (maco__is_signal(tb->ops[i].code))
                        ns[c] = i;
                }
                v->next_flush[base + i] = c >= 0 && c < nc ? nf[c] : -1;
                v->next_signal[base + i] = c >= 0 && c < nc ? ns[c] : -1;
            }
        }
        free(nf);
    }
    /* The clocks and values are the big parts: refuse plans that need more than 1 GiB. */
    double bytes = (double)nev * v->T * 4 + (double)v->nlocs * v->nids * 2;
    if (bytes > (double)(1 << 30))
        return -2;
    v->vc = (uint32_t *)calloc(nev ? nev * (size_t)v->T : 1, sizeof(uint32_t));
    v->val = (uint16_t *)calloc((size_t)v->nlocs * v->nids + 1, sizeof(uint16_t));
    v->tmp = (uint16_t *)calloc((size_t)v->nids + 1, sizeof(uint16_t));
    v->part = (int *)malloc(((size_t)v->nlocs + 1) * sizeof(int));
    v->last = (int *)malloc(((size_t)v->nlocs + 1) * sizeof(int));
    v->pkt_writer = (int *)malloc(((size_t)v->nlocs + 1) * sizeof(int));
    v->pkt_writes = (int *)calloc((size_t)v->nlocs + 1, sizeof(int));
    v->access = (maco__access_list_t *)calloc((size_t)v->nlocs + 1, sizeof(maco__access_list_t));
    v->owner = (int **)calloc((size_t)n, sizeof(int *));
    v->partner = (int **)calloc((size_t)n, sizeof(int *));
    v->nsig = (int **)calloc((size_t)n, sizeof(int *));
    v->nwait = (int **)calloc((size_t)n, sizeof(int *));
    v->sig_total = (int **)calloc((size_t)n, sizeof(int *));
    v->sig_ev = (int ***)calloc((size_t)n, sizeof(int **));
    if (v->vc == NULL || v->val == NULL || v->tmp == NULL || v->part == NULL || v->last == NULL ||
        v->pkt_writer == NULL || v->pkt_writes == NULL || v->access == NULL || v->owner == NULL ||
        v->partner == NULL || v->nsig == NULL || v->nwait == NULL || v->sig_total == NULL ||
        v->sig_ev == NULL)
        return -1;
    for (int r = 0; r < n; r++) {
        size_t nc = (size_t)d->ranks[r].nchannels + 1;
        v->owner[r] = (int *)malloc(nc * sizeof(int));
        v->partner[r] = (int *)malloc(nc * sizeof(int));
        v->nsig[r] = (int *)calloc(nc, sizeof(int));
        v->nwait[r] = (int *)calloc(nc, sizeof(int));
        v->sig_total[r] = (int *)calloc(nc, sizeof(int));
        v->sig_ev[r] = (int **)calloc(nc, sizeof(int *));
        if (v->owner[r] == NULL || v->partner[r] == NULL || v->nsig[r] == NULL ||
            v->nwait[r] == NULL || v->sig_total[r] == NULL || v->sig_ev[r] == NULL)
            return -1;
        for (size_t c = 0; c < nc; c++)
            v->owner[r][c] = v->partner[r][c] = -1;
    }
    for (uint32_t l = 0; l < v->nlocs; l++) {
        v->part[l] = -1;
        v->last[l] = -1;
        v->pkt_writer[l] = -1;
    }
    /* Inputs hold themselves. */
    for (int r = 0; r < n; r++)
        for (uint32_t j = 0; j < v->chunks[MACO__PBUF_INPUT]; j++) {
            uint32_t loc = maco__loc(v, r, MACO__PBUF_INPUT, j);
            v->val[(size_t)loc * v->nids + (uint32_t)r * v->chunks[MACO__PBUF_INPUT] + j] = 1;
            v->part[loc] = (int)(j % (uint32_t)v->K);
        }
    return 0;
}

int maco__plan_verify(maco__plan_desc_t *d, char *report, size_t cap)
{
    maco__verifier_t v;
    memset(&v, 0, sizeof(v));
    v.d = d;
    v.out = report;
    v.cap = cap;
    if (cap > 0)
        report[0] = '\0';
    int rc = maco__verifier_alloc(&v);
    if (rc < 0) {
        if (cap > 0)
            snprintf(report, cap, "%s\n",
                     rc == -2 ? "the plan is too large to verify (its clocks and chunk values "
                                "would need more than 1 GiB)"
                              : "out of memory while verifying the plan");
        maco__verifier_free(&v);
        return rc == -2 ? -2 : -1;
    }
    if (maco__check_structure(&v)) {
        int problems = v.problems;
        maco__verifier_free(&v);
        return problems;
    }
    /* Signals per channel in the whole plan, and the static packet writers (for messages). */
    for (int r = 0; r < v.n; r++)
        for (int t = 0; t < d->ranks[r].ntbs; t++)
            for (int i = 0; i < d->ranks[r].tbs[t].nops; i++) {
                const maco__plan_op_t *op = &d->ranks[r].tbs[t].ops[i];
                if (maco__is_signal(op->code))
                    v.sig_total[r][op->channel]++;
                if (op->code == MACO__POP_PUT_PACKETS || op->code == MACO__POP_READ_PUT_PACKETS) {
                    int p = d->ranks[r].channels[op->channel].peer;
                    for (uint32_t j = 0; j < op->dst.count; j++)
                        v.pkt_writes[maco__loc(&v, p, MACO__PBUF_SCRATCH, op->dst.index + j)]++;
                }
            }
    for (int r = 0; r < v.n; r++)
        for (int c = 0; c < d->ranks[r].nchannels; c++) {
            v.sig_ev[r][c] = (int *)calloc((size_t)v.sig_total[r][c] + 1, sizeof(int));
            if (v.sig_ev[r][c] == NULL) {
                snprintf(report, cap, "out of memory while verifying the plan\n");
                maco__verifier_free(&v);
                return -1;
            }
        }
    int *done = (int *)calloc((size_t)v.T + 1, sizeof(int));
    if (done == NULL) {
        maco__verifier_free(&v);
        return -1;
    }
    /* Static counts above were for messages; execution counts packet writes again. */
    int *static_writes = v.pkt_writes;
    v.pkt_writes = (int *)calloc((size_t)v.nlocs + 1, sizeof(int));
    int oom = v.pkt_writes == NULL, over = 0;
    v.budget = MACO__VERIFY_MAX_STEPS;
    for (int progress = 1; progress && !oom && !over;) {
        progress = 0;
        for (int g = 0; g < v.T && !oom && !over; g++) {
            int r = v.g_rank[g], t = g - v.tb_base[r];
            while (done[g] < d->ranks[r].tbs[t].nops && maco__enabled(&v, g, done[g])) {
                int x = maco__exec(&v, g, done[g]);
                if (x < 0) {
                    oom = x == -1;
                    over = x == -2;
                    break;
                }
                done[g]++;
                v.pkt_ready[g] = 0;
                progress = 1;
            }
            over |= v.work > v.budget;
        }
    }
    if (over) {
        if (cap > 0)
            snprintf(report, cap,
                     "the plan is too large to verify: checking it takes more than %llu steps "
                     "(%d thread blocks, %d operations; docs/plan-format.md, \"Verification\", "
                     "gives the cost)\n",
                     (unsigned long long)MACO__VERIFY_MAX_STEPS, v.T, v.ev_base[v.T]);
        free(static_writes); /* v.pkt_writes goes with the verifier */
        free(done);
        maco__verifier_free(&v);
        return -2;
    }
    int stuck = 0;
    for (int g = 0; g < v.T; g++)
        stuck |= done[g] < d->ranks[v.g_rank[g]].tbs[g - v.tb_base[v.g_rank[g]]].nops;
    if (!oom) {
        if (stuck) {
            /* Messages about packets no one writes need the static counts. */
            int *dyn = v.pkt_writes;
            v.pkt_writes = static_writes;
            maco__report_deadlocks(&v, done);
            v.pkt_writes = dyn;
        } else {
            /* Every signal must be waited for: the semaphores carry over to the next launch. */
            for (int r = 0; r < v.n; r++)
                for (int c = 0; c < d->ranks[r].nchannels; c++) {
                    int p = d->ranks[r].channels[c].peer, c2 = v.partner[r][c];
                    if (v.nsig[r][c] > v.nwait[p][c2])
                        maco__vsay(&v,
                                   "rank %d tb %d: channel %d (to rank %d) signals %d times but "
                                   "rank %d waits %d times on its channel %d: a signal is never "
                                   "waited for, so the next launch's waits would return early",
                                   r, v.owner[r][c], c, p, v.nsig[r][c], p, v.nwait[p][c2], c2);
                }
            maco__check_races(&v);
            maco__check_post(&v);
        }
    }
    free(static_writes);
    free(done);
    int problems = oom ? -1 : v.problems;
    if (oom && cap > 0)
        snprintf(report, cap, "out of memory while verifying the plan\n");
    maco__verifier_free(&v);
    return problems;
}
