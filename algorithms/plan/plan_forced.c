/*
 * plan_forced.c - the plans that MACO_ALGO_<COLLECTIVE>=plan:FILE names: loaded into the
 * collectives' state when a communicator is created (algorithms/common/setup.c), destroyed with
 * it; collectives/launch.c runs them in place of the built-in kernels.
 */
#include <string.h>

#include "algorithms/common/state.h"
#include "algorithms/plan/plan_internal.h"
#include "maco/plan.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"

maco_status_t maco__plan_load_forced(maco_comm_t comm, maco__coll_t *c)
{
    static const maco__config_id_t vars[MACO_COLLECTIVE_COUNT] = {
        MACO_CFG_ALGO_ALLREDUCE, MACO_CFG_ALGO_ALLGATHER, MACO_CFG_ALGO_REDUCE_SCATTER,
        MACO_CFG_ALGO_BROADCAST, MACO_CFG_ALGO_REDUCE,    MACO_CFG_ALGO_ALLTOALL,
        MACO_CFG_ALGO_SENDRECV,
    };
    const size_t skip = strlen(MACO__PLAN_PREFIX);
    for (int k = 0; k < MACO_COLLECTIVE_COUNT; k++) {
        const char *v = maco__config_string(vars[k]);
        if (strncmp(v, MACO__PLAN_PREFIX, skip) != 0)
            continue;
        if (k != MACO_COLL_ALLREDUCE && k != MACO_COLL_ALLGATHER && k != MACO_COLL_REDUCE_SCATTER)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                               "%s=%s: plans exist for allreduce, allgather and reduce_scatter "
                               "only",
                               maco__config_name(vars[k]), v);
        maco_status_t st = maco_plan_load(comm, v + skip, &c->plans[k]);
        if (st != MACO_OK)
            return st;
        if (maco__plan_collective(c->plans[k]) != (maco_collective_t)k)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                               "%s=%s: the plan is a %s plan, not %s", maco__config_name(vars[k]),
                               v, maco_collective_name(maco__plan_collective(c->plans[k])),
                               maco_collective_name((maco_collective_t)k));
        MACO_INFO(MACO_SUBSYS_INIT, "rank %d: %s runs plan %s", comm->rank,
                  maco_collective_name((maco_collective_t)k), v + skip);
    }
    return MACO_OK;
}

void maco__plan_free_forced(maco__coll_t *c)
{
    for (int k = 0; k < MACO_COLLECTIVE_COUNT; k++) {
        maco_plan_destroy(c->plans[k]);
        c->plans[k] = NULL;
    }
}
