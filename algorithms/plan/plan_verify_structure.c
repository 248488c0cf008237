/* plan_verify_structure.c - the plan verifier's step 1: structure and bounds (the method is in
 * plan_verify.c's file comment). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/plan/plan_verify.h"

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

int maco__check_structure(maco__verifier_t *v)
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
