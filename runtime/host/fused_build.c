/*
 * fused_build.c - maco__fused_build: a fused operator's checks, its communication mode
 * (maco_fused_comm_t) and CTA split, and its tasks from the mode's builder (fused.c: SM stores;
 * fused_ce.c: the copy engines).
 */
#include <stdint.h>

#include "src/host/base/log.h"
#include "runtime/host/fused_internal.h"

maco_status_t maco__fused_build(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                maco_fused_op_t kind, int rank, int nranks, int units, int *last_p)
{
    static const char *const fns[3] = { "maco_task_graph_add_gemm_allreduce",
                                        "maco_task_graph_add_gemm_reduce_scatter",
                                        "maco_task_graph_add_allgather_gemm" };
    const char *fn = (unsigned)kind < 3 ? fns[kind] : "maco__fused_build";
    /* The split the operator asks for when the caller leaves it to the runtime: enough
     * communication workers to move its bytes while the GEMM runs (one per 8 CTAs, at least
     * 2), fewer for the reduce-scatter, whose GEMMs store the products themselves; the tiles
     * are planned for the compute workers that leaves (maco_persistent_kernel_create's split:
     * one scheduler per 32 CTAs). */
    int want = kind == MACO_FUSED_GEMM_REDUCE_SCATTER ? units / 16 : units / 8;
    want = want < 2 ? 2 : want;
    /* The copy-engine mode's sums only (maco_fused_comm_t): one per 32 CTAs, at least 2; 1 for
     * allgather + GEMM, whose communication workers only queue puts. */
    int want_ce = kind == MACO_FUSED_ALLGATHER_GEMM ? 1 : (units / 32 > 2 ? units / 32 : 2);
    maco_fused_comm_t mode = op != NULL ? (maco_fused_comm_t)op->comm_mode : MACO_FUSED_COMM_SM;
    if (op != NULL && mode == MACO_FUSED_COMM_AUTO &&
        maco_fused_gemm_choose_comm(kind, nranks, op->m, op->n, op->k, op->out_type, &mode) !=
            MACO_OK)
        mode = MACO_FUSED_COMM_SM; /* the shapes are refused below, by maco__fused_check */
    if (mode == MACO_FUSED_COMM_COPY_ENGINE)
        want = want_ce;
    int workers = units - want - ((units - want) / 32 > 1 ? (units - want) / 32 : 1);
    maco__fused_t f;
    maco_status_t st =
        maco__fused_check(g, op, kind, fn, rank, nranks, workers > 1 ? workers : units, &f);
    if (st != MACO_OK)
        return st;
    int before = g->ntasks;
    if (f.mode == MACO_FUSED_COMM_COPY_ENGINE) {
        g->requeue_gates = 1;
        if (kind == MACO_FUSED_GEMM_ALLREDUCE)
            st = maco__fused_ce_gemm_allreduce(&f, last_p);
        else if (kind == MACO_FUSED_GEMM_REDUCE_SCATTER)
            st = maco__fused_ce_gemm_reduce_scatter(&f, last_p);
        else
            st = maco__fused_ce_allgather_gemm(&f, last_p);
    } else if (kind == MACO_FUSED_GEMM_ALLREDUCE) {
        st = maco__fused_sm_gemm_allreduce(&f, last_p);
    } else if (kind == MACO_FUSED_GEMM_REDUCE_SCATTER) {
        st = maco__fused_sm_gemm_reduce_scatter(&f, last_p);
    } else {
        st = maco__fused_sm_allgather_gemm(&f, last_p);
    }
    if (st != MACO_OK)
        return st;
    if (nranks > 1 && want > g->comm_workers_hint)
        g->comm_workers_hint = want;
    MACO_LOG(MACO_LOG_DEBUG, MACO_SUBSYS_PERSIST, "%s: rank %d of %d: %d tasks (%s), %s", fn, rank,
             nranks, g->ntasks - before, f.name,
             f.mode == MACO_FUSED_COMM_COPY_ENGINE ? "copy engines" : "SM stores");
    return MACO_OK;
}
