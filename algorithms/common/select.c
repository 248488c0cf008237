/*
 * select.c - which algorithm a collective call runs: the names of each collective's
 * algorithms, the forced choice (MACO_ALGO_<COLLECTIVE>, read once when the communicator is
 * created, or maco_collective_set_algorithm), and the choice by size, whose thresholds are
 * rows of algorithms/tuning.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "algorithms/common/select.h"
#include "algorithms/hier/hier.h"
#include "algorithms/tuning.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"

/* Per collective: the algorithms' names, indexed by kernel (MACO__KERNEL_*; NULL where a
 * collective has no such kernel), and the variable that forces one. */
static const struct {
    const char *name;
    const char *algo[4];
    maco__config_id_t force;
} maco__colls[MACO_COLLECTIVE_COUNT] = {
    { "allreduce", { "oneshot_ll", "rsag", "twoshot_ll", "hier" }, MACO_CFG_ALGO_ALLREDUCE },
    { "allgather", { "ll", "mesh", NULL, "hier" }, MACO_CFG_ALGO_ALLGATHER },
    { "reduce_scatter", { "ll", "mesh", NULL, "hier" }, MACO_CFG_ALGO_REDUCE_SCATTER },
    { "broadcast", { "ll", "mesh", NULL, "hier" }, MACO_CFG_ALGO_BROADCAST },
    { "reduce", { "ll", "mesh", NULL, "hier" }, MACO_CFG_ALGO_REDUCE },
    /* How a sender moves each message (p2p_kernels.cu): LL packets or chunks through
     * scratch. Any size works either way, so forcing one never fails for size. Across
     * nodes maco_alltoall may also run hierarchical (hier/alltoall_kernel.cu). */
    { "alltoall", { "ll", "copy", NULL, "hier" }, MACO_CFG_ALGO_ALLTOALL },
    { "sendrecv", { "ll", "copy", NULL, NULL }, MACO_CFG_ALGO_SENDRECV },
};

/*
 * All-to-all across nodes: whether maco_alltoall runs hier rather than direct by default, for
 * `msg` bytes per block with `local_ranks` ranks per node (algorithms/tuning.h,
 * HIER_ALLTOALL_MIN_BLOCK and _MIN_LOCAL_RANKS). With one rank per node hier aggregates nothing:
 * as many rail peers as remote ranks.
 */
static int maco__hier_a2a_default(size_t msg, int local_ranks)
{
    return local_ranks >= MACO__TUNING_HIER_ALLTOALL_MIN_LOCAL_RANKS &&
           msg >= (size_t)MACO__TUNING_HIER_ALLTOALL_MIN_BLOCK;
}

/* Elements per two-shot block for `count` elements of `esz` bytes on n ranks (a whole
 * number of 8-byte packets), or 0 when two-shot cannot take the call: a block would be
 * empty, or larger than the LL scratch slot's region (cap bytes). */
size_t maco__coll_twoshot_block(size_t count, size_t esz, size_t n, size_t cap)
{
    size_t per = 8 / esz;
    size_t b = ((count + n - 1) / n + per - 1) / per * per;
    if ((n - 1) * b >= count || b * esz > cap)
        return 0;
    return b;
}

const char *maco__coll_name(maco_collective_t coll)
{
    return (unsigned)coll < MACO_COLLECTIVE_COUNT ? maco__colls[coll].name : "unknown";
}

const char *maco__coll_algorithm(maco_collective_t coll, int kernel)
{
    if ((unsigned)coll >= MACO_COLLECTIVE_COUNT || kernel < 0 || kernel > MACO__KERNEL_HIER ||
        maco__colls[coll].algo[kernel] == NULL)
        return "?";
    return maco__colls[coll].algo[kernel];
}

maco_status_t maco__coll_read_settings(maco__coll_t *c)
{
    for (int k = 0; k < MACO_COLLECTIVE_COUNT; k++) {
        const char *v = NULL;
        maco_status_t wst = maco__config_word(maco__colls[k].force, &v); /* a known word */
        if (wst != MACO_OK)
            return wst;
        if (strncmp(v, MACO__PLAN_PREFIX, strlen(MACO__PLAN_PREFIX)) == 0) {
            c->forced[k][0] = '\0'; /* a plan: loaded by maco__plan_load_forced */
            continue;
        }
        if (strlen(v) >= sizeof(c->forced[k]))
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                               "%s='%s' is too long to be an algorithm name",
                               maco__config_name(maco__colls[k].force), v);
        snprintf(c->forced[k], sizeof(c->forced[k]), "%s", v);
    }
    maco_status_t st = maco__config_int64(MACO_CFG_ALLREDUCE_INPLACE_MAX, &c->inplace_max);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_P2P_LL_MAX, &c->p2p_ll_max);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_MESH_GATE_MIN, &c->mesh_gate_min);
    return st;
}

/*
 * Picks the kernel: the forced algorithm if any (MACO_ALGO_<COLLECTIVE> at creation, or
 * maco_collective_set_algorithm), else LL up to the LL scratch's capacity
 * (MACO_ALLREDUCE_ONESHOT_MAX bytes per message) and mesh above. `unit_bytes` is the
 * collective's unit (collectives/collectives.h). All-to-all and send/recv: LL packets up to
 * MACO_P2P_LL_MAX bytes per message, "copy" above (a sender's choice; the receiver follows
 * each chunk's header).
 */
maco_status_t maco__coll_select(maco_comm_t comm, const maco__coll_t *c, maco_collective_t coll,
                                size_t count, size_t esz, int *kernel_p)
{
    size_t cap = c->layout.oneshot_max;
    size_t msg = count * esz; /* the unit: what one rank sends one peer */
    int p2p = coll == MACO_COLL_ALLTOALL || coll == MACO_COLL_SENDRECV;
    size_t n = (size_t)c->local_nranks;
    int across = c->nnodes > 1 && !p2p;
    /* All-to-all across nodes: hier where its shape exists (hier/hier.h), else direct. */
    maco__hier_a2a_shape_t a2a;
    int a2a_hier =
        coll == MACO_COLL_ALLTOALL && c->nnodes > 1 &&
        maco__hier_a2a_shape(count, esz, c->local_nranks, c->layout.hier_piece_max, 1, &a2a);
    int twoshot = coll == MACO_COLL_ALLREDUCE && maco__coll_twoshot_block(count, esz, n, cap) != 0;
    const char *forced = c->forced[coll];
    if (forced[0] != '\0') {
        for (int k = 0; k <= MACO__KERNEL_HIER; k++) {
            if (maco__colls[coll].algo[k] == NULL ||
                strcasecmp(forced, maco__colls[coll].algo[k]) != 0)
                continue;
            /* All-to-all: ll and copy everywhere (direct), hier only across nodes. */
            if (coll == MACO_COLL_ALLTOALL && k == MACO__KERNEL_HIER && c->nnodes < 2)
                return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                   "%s=%s needs ranks on several nodes; the ranks are on 1 "
                                   "node (use ll or copy, or leave it unset)",
                                   maco__config_name(maco__colls[coll].force), forced);
            if (coll == MACO_COLL_ALLTOALL && k == MACO__KERNEL_HIER && !a2a_hier)
                return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                   "%s=%s cannot take %zu elements of %zu bytes with %d ranks "
                                   "per node: a region of its scratch (%zu bytes, from "
                                   "MACO_SCRATCH_SIZE and MACO_HIER_CTAS) must hold 16 bytes "
                                   "per rank of a node",
                                   maco__config_name(maco__colls[coll].force), forced, count, esz,
                                   c->local_nranks, (size_t)c->layout.hier_piece_max);
            /* hier is the one algorithm of the other collectives across nodes, and works
             * only there. */
            if (!p2p && (k == MACO__KERNEL_HIER) != across)
                return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                   "%s=%s %s; the ranks are on %d node%s",
                                   maco__config_name(maco__colls[coll].force), forced,
                                   across ? "works on one node, use hier across nodes"
                                          : "needs ranks on several nodes",
                                   c->nnodes, c->nnodes > 1 ? "s" : "");
            if (k == MACO__KERNEL_LL && msg > cap && !p2p)
                return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                   "%s=%s cannot take %zu bytes per rank: its scratch "
                                   "holds MACO_ALLREDUCE_ONESHOT_MAX=%zu",
                                   maco__config_name(maco__colls[coll].force), forced, msg, cap);
            if (k == MACO__KERNEL_LL2 && !twoshot)
                return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                   "%s=%s cannot take %zu elements of %zu bytes on %zu ranks: "
                                   "it needs a non-empty block of whole 8-byte words per rank "
                                   "and at most nranks * MACO_ALLREDUCE_ONESHOT_MAX = %zu bytes",
                                   maco__config_name(maco__colls[coll].force), forced, count, esz,
                                   n, n * cap);
            *kernel_p = k;
            return MACO_OK;
        }
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                           "%s='%s' is not a %s algorithm: use %s, %s%s%s%s%s",
                           maco__config_name(maco__colls[coll].force), forced,
                           maco__colls[coll].name, maco__colls[coll].algo[0],
                           maco__colls[coll].algo[1], maco__colls[coll].algo[2] ? ", " : "",
                           maco__colls[coll].algo[2] ? maco__colls[coll].algo[2] : "",
                           maco__colls[coll].algo[3] ? " or " : "",
                           maco__colls[coll].algo[3] ? maco__colls[coll].algo[3] : "");
    }
    if (across || (a2a_hier && maco__hier_a2a_default(msg, c->local_nranks)))
        *kernel_p = MACO__KERNEL_HIER;
    else if (p2p)
        *kernel_p = msg <= (size_t)c->p2p_ll_max ? MACO__KERNEL_LL : MACO__KERNEL_MESH;
    else if (coll == MACO_COLL_ALLREDUCE && msg <= cap &&
             msg <= (size_t)MACO__TUNING_ALLREDUCE_ONESHOT_CUTOFF) /* two-shot LL above */
        *kernel_p = MACO__KERNEL_LL;
    else if (twoshot)
        *kernel_p = MACO__KERNEL_LL2;
    else
        *kernel_p = msg <= cap && coll != MACO_COLL_ALLREDUCE ? MACO__KERNEL_LL : MACO__KERNEL_MESH;
    return MACO_OK;
}

int maco__p2p_ll(const maco__coll_t *c, maco_collective_t coll, uint64_t bytes)
{
    const char *forced = c->forced[coll];
    if (strcasecmp(forced, "ll") == 0)
        return 1;
    if (strcasecmp(forced, "copy") == 0)
        return 0;
    return bytes <= (uint64_t)c->p2p_ll_max;
}

maco_status_t maco__coll_agree_max_ctas(maco_comm_t comm, maco__coll_t *c, int max_ctas,
                                        const char *what)
{
    int32_t *all = (int32_t *)calloc((size_t)comm->nranks, sizeof(int32_t));
    if (all == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL,
                           "%s: no memory for %d ranks' values (%zu bytes)", what, comm->nranks,
                           (size_t)comm->nranks * sizeof(int32_t));
    all[comm->rank] = (int32_t)max_ctas;
    maco_status_t st = maco_bootstrap_allgather(comm->bs, all, sizeof(int32_t));
    if (st == MACO_OK)
        for (int r = 1; r < comm->nranks; r++)
            if (all[r] != all[0]) {
                st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                 "%s: rank %d passed max_ctas=%d but rank 0 passed %d; every "
                                 "rank must pass the same value (the cap is unchanged)",
                                 what, r, (int)all[r], (int)all[0]);
                break;
            }
    free(all);
    if (st == MACO_OK)
        c->max_ctas = max_ctas;
    return st;
}
