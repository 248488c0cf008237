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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/plan/plan_verify.h"

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
        int *nf = (int *)malloc(((size_t)nc + 1) * 2 * sizeof(int));
        if (nf == NULL)
            return -1;
        int *ns = nf + nc + 1;
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
