/*
 * p2p_plan.c - a group's sends and receives on one communicator as one launch's plan
 * (p2p_plan.h): pairing of local sends and receives, the checks a rank can make alone, and
 * the pair tables the kernel walks. Pure: no CUDA, no logging, so the CPU tests call it.
 */
#include "algorithms/p2p/p2p_plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static maco_status_t maco__p2p_fail(char *why, size_t why_bytes, int *call_p, int call,
                                    const char *fmt, ...)
{
    if (why != NULL && why_bytes > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_bytes, fmt, ap);
        va_end(ap);
    }
    if (call_p != NULL)
        *call_p = call;
    return MACO_ERR_INVALID_ARGUMENT;
}

/* The bytes a message touches on this rank: a send reads `send`, a receive writes `recv`. */
static void maco__p2p_span(const maco__p2p_msg_t *m, uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t p = m->dir == MACO__P2P_SEND ? (uintptr_t)m->send : (uintptr_t)m->recv;
    *lo = p;
    *hi = p + (uintptr_t)m->bytes;
}

/* True when send message `s` shares a byte with a receive buffer of the messages: its op
 * must read a copy taken before the launch (MACO__P2P_FLAG_STAGE). */
static int maco__p2p_send_in_place(const maco__p2p_msg_t *msgs, int nmsgs, const maco__p2p_msg_t *s)
{
    if (s->bytes == 0)
        return 0;
    uintptr_t lo, hi;
    maco__p2p_span(s, &lo, &hi);
    for (int k = 0; k < nmsgs; k++) {
        if (msgs[k].dir != MACO__P2P_RECV || msgs[k].bytes == 0)
            continue;
        uintptr_t lo2, hi2;
        maco__p2p_span(&msgs[k], &lo2, &hi2);
        if (lo < hi2 && lo2 < hi)
            return 1;
    }
    return 0;
}

/* Every message names a peer of the communicator and a direction, and fits a message. */
static maco_status_t maco__p2p_check_msgs(const maco__p2p_msg_t *msgs, int nmsgs, int nranks,
                                          int *call_p, char *why, size_t why_bytes)
{
    for (int i = 0; i < nmsgs; i++) {
        const maco__p2p_msg_t *m = &msgs[i];
        if (m->peer < 0 || m->peer >= nranks ||
            (m->dir != MACO__P2P_SEND && m->dir != MACO__P2P_RECV))
            return maco__p2p_fail(why, why_bytes, call_p, m->call,
                                  "call %d (%s): peer %d is outside [0, %d)", m->call, m->fn,
                                  (int)m->peer, nranks);
        if (m->bytes > MACO__P2P_MAX_BYTES)
            return maco__p2p_fail(why, why_bytes, call_p, m->call,
                                  "call %d (%s): %llu bytes is more than one message can carry "
                                  "(2^48 - 1)",
                                  m->call, m->fn, (unsigned long long)m->bytes);
    }
    return MACO_OK;
}

static maco_status_t maco__p2p_check_recv_overlap(const maco__p2p_msg_t *msgs, int nmsgs,
                                                  int *call_p, char *why, size_t why_bytes)
{
    /* A receive buffer must not share a byte with another receive buffer of the group: the
     * messages run at the same time, in no order, so which write lands last is undefined.
     * A send that shares bytes with a receive buffer is in place: its op is staged (below). */
    for (int i = 0; i < nmsgs; i++) {
        if (msgs[i].dir != MACO__P2P_RECV || msgs[i].bytes == 0)
            continue;
        uintptr_t lo, hi;
        maco__p2p_span(&msgs[i], &lo, &hi);
        for (int k = 0; k < nmsgs; k++) {
            if (k == i || msgs[k].dir != MACO__P2P_RECV || msgs[k].bytes == 0)
                continue;
            uintptr_t lo2, hi2;
            maco__p2p_span(&msgs[k], &lo2, &hi2);
            if (lo < hi2 && lo2 < hi) {
                const maco__p2p_msg_t *a = &msgs[i], *b = &msgs[k];
                char whose[96];
                if (b->call == a->call)
                    snprintf(whose, sizeof(whose), "of the same call");
                else
                    snprintf(whose, sizeof(whose), "of call %d (%s)", b->call, b->fn);
                return maco__p2p_fail(
                    why, why_bytes, call_p, a->call,
                    "call %d (%s): its receive buffer %p (%llu bytes, from rank %d) overlaps "
                    "the receive buffer %p (%llu bytes, from rank %d) %s; the sends and "
                    "receives of a group run at the same time, so a receive buffer must not "
                    "overlap another receive buffer of the group (send buffers may overlap "
                    "receive buffers: in place)",
                    a->call, a->fn, a->recv, (unsigned long long)a->bytes, (int)a->peer, b->recv,
                    (unsigned long long)b->bytes, (int)b->peer, whose);
            }
        }
    }
    return MACO_OK;
}

static maco_status_t maco__p2p_check_local(const maco__p2p_msg_t *msgs, int nmsgs, int rank,
                                           int *call_p, char *why, size_t why_bytes)
{
    /* Local messages: the k-th send to this rank matches the k-th receive from it. */
    int nsend_self = 0, nrecv_self = 0;
    for (int i = 0; i < nmsgs; i++) {
        if (msgs[i].peer != rank)
            continue;
        if (msgs[i].dir == MACO__P2P_SEND)
            nsend_self++;
        else
            nrecv_self++;
    }
    if (nsend_self != nrecv_self) {
        /* Name the first unmatched one. */
        int seen_s = 0, seen_r = 0, want_send = nsend_self > nrecv_self;
        int limit = want_send ? nrecv_self : nsend_self;
        for (int i = 0; i < nmsgs; i++) {
            const maco__p2p_msg_t *m = &msgs[i];
            if (m->peer != rank)
                continue;
            int *seen = m->dir == MACO__P2P_SEND ? &seen_s : &seen_r;
            if ((m->dir == MACO__P2P_SEND) == want_send && *seen == limit)
                return maco__p2p_fail(why, why_bytes, call_p, m->call,
                                      "call %d (%s): a %s this rank (%d) has no matching %s "
                                      "in the same group (%d sends to this rank, %d receives "
                                      "from it); it would wait forever",
                                      m->call, m->fn, want_send ? "send to" : "receive from", rank,
                                      want_send ? "receive from this rank" : "send to it",
                                      nsend_self, nrecv_self);
            (*seen)++;
        }
    }
    for (int k = 0; k < nsend_self; k++) {
        const maco__p2p_msg_t *s = NULL, *r = NULL;
        int cs = 0, cr = 0;
        for (int i = 0; i < nmsgs && (s == NULL || r == NULL); i++) {
            const maco__p2p_msg_t *m = &msgs[i];
            if (m->peer != rank)
                continue;
            if (m->dir == MACO__P2P_SEND && cs++ == k)
                s = m;
            else if (m->dir == MACO__P2P_RECV && cr++ == k)
                r = m;
        }
        if (s == NULL || r == NULL) /* the counts were checked equal above: never */
            return maco__p2p_fail(why, why_bytes, call_p, 0,
                                  "internal: the %d-th local send or receive is missing", k);
        if (s->bytes != r->bytes)
            return maco__p2p_fail(why, why_bytes, call_p, r->call,
                                  "call %d (%s) receives %llu bytes from this rank (%d) but the "
                                  "matching send, call %d (%s), sends %llu bytes",
                                  r->call, r->fn, (unsigned long long)r->bytes, rank, s->call,
                                  s->fn, (unsigned long long)s->bytes);
    }
    return MACO_OK;
}

/* The plan's pairs and their ops (written to *plan when plan is not NULL). */
static maco_status_t maco__p2p_plan_pairs(const maco__p2p_msg_t *msgs, int nmsgs, int rank,
                                          int nranks, maco__p2p_plan_t *plan, int *call_p,
                                          char *why, size_t why_bytes)
{
    /* Pairs: send to q, receive from q for q = 0..n-1 (not this rank), then the local one. */
    maco__p2p_plan_t p;
    memset(&p, 0, sizeof(p));
    for (int q = 0; q <= nranks; q++) {
        for (int dir = MACO__P2P_SEND; dir <= MACO__P2P_RECV; dir++) {
            int local = q == nranks;
            if (q == rank || (local && dir == MACO__P2P_RECV))
                continue;
            int first = p.nops, count = 0;
            int ks = 0, kr = 0;
            for (int i = 0; i < nmsgs; i++) {
                const maco__p2p_msg_t *m = &msgs[i];
                if (local) {
                    /* The k-th local send with the k-th local receive, in send order. */
                    if (m->peer != rank || m->dir != MACO__P2P_SEND)
                        continue;
                    const maco__p2p_msg_t *r = NULL;
                    int k = ks++;
                    kr = 0;
                    for (int t = 0; t < nmsgs && r == NULL; t++)
                        if (msgs[t].peer == rank && msgs[t].dir == MACO__P2P_RECV && kr++ == k)
                            r = &msgs[t];
                    if (m->bytes == 0)
                        continue;
                    if (p.nops >= MACO__P2P_MAX_OPS)
                        goto too_many;
                    p.ops[p.nops].src = m->send;
                    p.ops[p.nops].dst = r->recv;
                    p.ops[p.nops].bytes = m->bytes;
                    p.op_flags[p.nops] = (uint8_t)(m->flags & ~MACO__P2P_FLAG_STAGE);
                    if (maco__p2p_send_in_place(msgs, nmsgs, m))
                        p.op_flags[p.nops] |= MACO__P2P_FLAG_STAGE;
                    p.nops++;
                    count++;
                    continue;
                }
                if (m->peer != q || m->dir != dir)
                    continue;
                if (p.nops >= MACO__P2P_MAX_OPS)
                    goto too_many;
                p.ops[p.nops].src = dir == MACO__P2P_SEND ? m->send : NULL;
                p.ops[p.nops].dst = dir == MACO__P2P_RECV ? m->recv : NULL;
                p.ops[p.nops].bytes = m->bytes;
                p.op_flags[p.nops] = (uint8_t)(m->flags & ~MACO__P2P_FLAG_STAGE);
                if (dir == MACO__P2P_SEND && maco__p2p_send_in_place(msgs, nmsgs, m))
                    p.op_flags[p.nops] |= MACO__P2P_FLAG_STAGE;
                p.nops++;
                count++;
            }
            if (count == 0)
                continue;
            if (p.npairs >= MACO__P2P_MAX_PAIRS)
                return maco__p2p_fail(why, why_bytes, call_p, msgs[0].call,
                                      "the group's messages need more than %d pairs",
                                      MACO__P2P_MAX_PAIRS);
            p.pair_peer[p.npairs] = local ? rank : q;
            p.pair_dir[p.npairs] = (uint8_t)(local ? MACO__P2P_SELF : dir);
            p.pair_first[p.npairs] = (uint16_t)first;
            p.pair_nops[p.npairs] = (uint16_t)count;
            p.npairs++;
        }
    }
    if (plan != NULL)
        *plan = p;
    return MACO_OK;
too_many:
    return maco__p2p_fail(why, why_bytes, call_p, msgs[nmsgs - 1].call,
                          "call %d (%s): the group has more than %d sends and receives on one "
                          "communicator (an all-to-all counts 2 per peer); issue fewer per group",
                          msgs[nmsgs - 1].call, msgs[nmsgs - 1].fn, MACO__P2P_MAX_OPS);
}

maco_status_t maco__p2p_plan_build(const maco__p2p_msg_t *msgs, int nmsgs, int rank, int nranks,
                                   maco__p2p_plan_t *plan, int *call_p, char *why, size_t why_bytes)
{
    if (why != NULL && why_bytes > 0)
        why[0] = '\0';
    maco_status_t st = maco__p2p_check_msgs(msgs, nmsgs, nranks, call_p, why, why_bytes);
    if (st == MACO_OK)
        st = maco__p2p_check_recv_overlap(msgs, nmsgs, call_p, why, why_bytes);
    if (st == MACO_OK)
        st = maco__p2p_check_local(msgs, nmsgs, rank, call_p, why, why_bytes);
    if (st == MACO_OK)
        st = maco__p2p_plan_pairs(msgs, nmsgs, rank, nranks, plan, call_p, why, why_bytes);
    return st;
}
