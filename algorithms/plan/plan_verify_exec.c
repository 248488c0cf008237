/* plan_verify_exec.c - the plan verifier's steps 2-4: symbolic execution, happens-before and
 * values (the method is in plan_verify.c's file comment). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/plan/plan_verify.h"

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
int maco__enabled(maco__verifier_t *v, int g, int i)
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
int maco__exec(maco__verifier_t *v, int g, int i)
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
void maco__check_races(maco__verifier_t *v)
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

void maco__check_post(maco__verifier_t *v)
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

void maco__report_deadlocks(maco__verifier_t *v, const int *done)
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
